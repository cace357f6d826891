//! The process's server: one thread on a Unix socket, serving the exporter's
//! side of CUDA IPC on pool memory (import.rs has the whole exchange, wire.rs
//! the messages), leases, many over each importer's one connection, and the
//! asks of the user's other shim processes (neighbours.rs, `somarun`). No
//! client can stall it: its sockets are non-blocking, a request has one
//! deadline (from the accept for a connection's first, from its first byte
//! for later ones), few connections without a lease may wait, no lock is
//! held across a wait on a client, and exit does not wait for one.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::snapshot;
use super::socket_dir::{socket_dir, socket_path};
use super::wire::{decode_request, encode_library, encode_usage, send_all, send_with_fd, Op, Reply, Request, REQUEST_LEN};
use crate::core::allocator::state::Allocator;
use crate::core::ptrmap::Block;
use crate::core::shared_blocks::{IpcHandle, Secret};
use crate::core::locks::{lock, try_lock};
use crate::cuda::driver::{self, PointerExport};
use crate::cuda::gpu::{Gpu, Pool};

/// How long the server waits for a whole request from its connection's
/// accept (an importer sends it at once after connecting).
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);
/// The most connections the server keeps waiting for their request. An
/// importer's comes with its connect and is answered at the accept: only a
/// client that stalls waits, and beyond this the oldest is dropped.
const MAX_PENDING: usize = 16;
/// How long the server stops accepting after a failed accept (out of
/// descriptors, say), which leaves the listener readable: not a busy loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long the server waits after poll failed for want of memory.
const POLL_BACKOFF: Duration = Duration::from_millis(10);
/// How long exit waits for the server thread to stop.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// 32 random bytes, or None where the kernel gives none (getrandom missing
/// or forbidden): the export then passes through rather than spin.
pub(super) fn random_secret() -> Option<Secret> {
    let mut secret = [0u8; 32];
    let mut filled = 0;
    while filled < secret.len() {
        // SAFETY: writes at most the rest of `secret`.
        let n = unsafe { libc::getrandom(secret[filled..].as_mut_ptr().cast(), secret.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return None;
        }
    }
    Some(secret)
}

struct Server {
    pid: u32,
    endpoint: u64,
    path: PathBuf,
    /// Written to stop the thread (a socket: a write once the thread has
    /// gone fails, where a pipe's would raise SIGPIPE).
    wake: UnixStream,
    thread: JoinHandle<()>,
}

/// This process's IPC server. A forked child finds its parent's here (with
/// the parent's pid) and starts its own on its first export.
static SERVER: Mutex<Option<Server>> = Mutex::new(None);

/// The pid and endpoint of the running server, for the open that must
/// refuse this process's own handles without waiting for an export that
/// holds `SERVER`. (A forked child sees its parent's pid here: not its own.)
pub(super) static SERVING_PID: AtomicU32 = AtomicU32::new(0);
pub(super) static SERVING_ENDPOINT: AtomicU64 = AtomicU64::new(0);

/// The pid of a process whose server could not start: its handle requests
/// pass through from then on, without a new attempt (and warning) each time.
static FAILED_PID: AtomicU32 = AtomicU32::new(0);

/// Set at exit: no server starts and no server step begins from then on
/// (the CUDA runtime tears itself down next).
static STOPPED: AtomicBool = AtomicBool::new(false);

/// The endpoint of this process's server, started on first use.
pub fn server_endpoint(allocator: &'static Allocator) -> Option<u64> {
    let mut server = lock(&SERVER);
    if STOPPED.load(Ordering::SeqCst) {
        return None;
    }
    let pid = std::process::id();
    if let Some(running) = server.as_ref().filter(|s| s.pid == pid) {
        return Some(running.endpoint);
    }
    if FAILED_PID.load(Ordering::Relaxed) == pid {
        return None;
    }
    match start_server(allocator, pid) {
        Ok(started) => {
            let endpoint = started.endpoint;
            // The endpoint first: a pid that matches always names its endpoint.
            SERVING_ENDPOINT.store(endpoint, Ordering::Release);
            SERVING_PID.store(pid, Ordering::Release);
            // A parent's server, inherited through fork: its thread is not here.
            if let Some(inherited) = server.replace(started) {
                std::mem::forget(inherited.thread);
            }
            Some(endpoint)
        }
        Err(e) => {
            log::warn!(
                "cannot start the shim's server ({e}): CUDA IPC handles of pool memory pass through, and other shim \
                 processes cannot ask this one for memory"
            );
            FAILED_PID.store(pid, Ordering::Relaxed);
            None
        }
    }
}

/// Binds the socket and starts the thread. Every descriptor of the server
/// is made close-on-exec as it is made (std's sockets, `accept4`), so that
/// no child the program starts meanwhile inherits one.
fn start_server(allocator: &'static Allocator, pid: u32) -> Result<Server, String> {
    let dir = socket_dir(&allocator.config)?;
    let random = random_secret().ok_or("no random bytes from the kernel")?;
    let endpoint = u64::from_le_bytes(random[..8].try_into().unwrap_or_default());
    let path = socket_path(&dir, pid, endpoint);
    // Bound and listening under a name no one looks for, then renamed into
    // place: a neighbour that connects between the bind and the listen would
    // be refused, take the socket for a dead process's and remove it.
    let binding = dir.join(format!(".{pid}-{endpoint:016x}"));
    let listener = UnixListener::bind(&binding).map_err(|e| format!("cannot listen on {}: {e}", binding.display()))?;
    if let Err(e) = std::fs::rename(&binding, &path) {
        let _ = std::fs::remove_file(&binding);
        return Err(format!("cannot name the socket {}: {e}", path.display()));
    }
    match spawn_server(allocator, listener, pid, endpoint) {
        Ok((wake, thread)) => {
            log::debug!("CUDA IPC: serving on {}", path.display());
            Ok(Server { pid, endpoint, path, wake, thread })
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e.to_string())
        }
    }
}

/// The thread, serving `listener`, and the socket that stops it.
fn spawn_server(allocator: &'static Allocator, listener: UnixListener, pid: u32, endpoint: u64) -> std::io::Result<(UnixStream, JoinHandle<()>)> {
    listener.set_nonblocking(true)?;
    let (wake, woken) = UnixStream::pair()?;
    *lock(&SERVED) = Some(Served::new(pid, endpoint, listener, woken));
    let spawned = std::thread::Builder::new().name("somashim-ipc".into()).spawn(move || serve(allocator, endpoint));
    if spawned.is_err() {
        *lock(&SERVED) = None;
    }
    Ok((wake, spawned?))
}

/// At exit: the socket goes (no importer reaches the server from then on),
/// the thread is told to stop, and no step begins after this returns, so
/// that no driver call of the server's runs while the runtime tears down:
/// a step under way is waited for (its driver calls; it waits on no
/// client). Exit waits for the thread itself a short while at most.
pub fn stop_server() {
    STOPPED.store(true, Ordering::SeqCst);
    // Held by an export starting a server: that server's first step finds `STOPPED`.
    let running = try_lock(&SERVER).and_then(|mut server| server.take_if(|s| s.pid == std::process::id()));
    if let Some(running) = &running {
        let _ = std::fs::remove_file(&running.path);
        let _ = send_all(&running.wake, &[1]);
    }
    *lock(&SERVED) = None;
    let Some(running) = running else { return };
    let deadline = Instant::now() + STOP_WAIT;
    while !running.thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    if running.thread.is_finished() {
        let _ = running.thread.join();
    }
}

/// An importer's connection: its leases, and the request under way.
struct Client {
    connection: UnixStream,
    bytes: [u8; REQUEST_LEN],
    received: usize,
    /// When the request under way must be whole: from the accept for a new
    /// connection's (it comes with the connect), from its first byte for a
    /// later one's; none between requests.
    deadline: Option<Instant>,
    /// (base, secret) of each block leased over this connection, and how
    /// many times: the connection's end ends them all.
    leases: HashMap<(u64, Secret), u32>,
    /// The pools (by id) whose descriptor this connection has had.
    pools_sent: HashSet<u64>,
}

impl Client {
    fn new(connection: UnixStream, deadline: Instant) -> Client {
        Client { connection, bytes: [0; REQUEST_LEN], received: 0, deadline: Some(deadline), leases: HashMap::new(), pools_sent: HashSet::new() }
    }

    /// The connection is over (closed, broken, late, or it broke the
    /// protocol): its leases end.
    fn end(self, allocator: &Allocator) {
        for ((base, secret), count) in self.leases {
            for _ in 0..count {
                allocator.lease_ended(base, &secret);
            }
        }
    }
}

/// What the server thread serves. Here rather than on the thread's stack so
/// that a forked child closes its copies: the listener above all, which
/// would let importers of a dead exporter's handles connect to a child that
/// never answers.
struct Served {
    pid: u32,
    endpoint: u64,
    listener: UnixListener,
    /// Readable when the thread is to stop.
    woken: UnixStream,
    /// Connections that hold no lease yet, oldest first (so the first
    /// deadline is the front's).
    pending: VecDeque<Client>,
    /// Connections that hold leases.
    clients: Vec<Client>,
    pools: ExportedPools,
    /// After a failed accept (out of descriptors, say), which leaves the
    /// listener readable: when to accept again.
    accept_resumes: Option<Instant>,
}

/// Held by the server thread while it handles what poll reported, and by a
/// forking thread across `fork`: the child then inherits none of the locks
/// a step takes (shared blocks, pointer map, deferred frees). Every socket
/// of the server is non-blocking: a step waits on no client, so neither
/// does a fork (at most on a step's driver calls).
static SERVED: Mutex<Option<Served>> = Mutex::new(None);

/// The server's locks, held by a forking thread across `fork` (fork.rs):
/// no server starting and no step under way.
pub(super) struct Held {
    _server: MutexGuard<'static, Option<Server>>,
    served: MutexGuard<'static, Option<Served>>,
}

pub(super) fn hold() -> Held {
    Held { _server: lock(&SERVER), served: lock(&SERVED) }
}

impl Held {
    /// In a forked child: the parent's server is not the child's to run. Its
    /// sockets close (the child would hold the listener, which no one serves,
    /// past the exporter's death), and its pool descriptors too.
    pub(super) fn in_child(mut self) {
        *self.served = None;
    }
}

/// Runs `forget` (a device reset's forgetting of the device's pools) with
/// no server step under way, so that no step exports from a pool being
/// destroyed. A step waits on no client: this waits on its driver calls at
/// most. The caller has paused the reclaimer first (the fork's order).
pub fn between_steps<R>(forget: impl FnOnce() -> R) -> R {
    let _served = lock(&SERVED);
    forget()
}

/// The server thread: answers requests and watches connections until woken.
/// It holds no lock across poll, and none of the allocator's across its
/// driver calls.
fn serve(allocator: &Allocator, endpoint: u64) {
    loop {
        let (mut polled, timeout) = match lock(&SERVED).as_ref().filter(|served| served.endpoint == endpoint) {
            Some(served) => served.to_poll(Instant::now()),
            None => return,
        };
        // SAFETY: `polled` is a valid array of its length.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, timeout) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::ENOMEM) => std::thread::sleep(POLL_BACKOFF),
                _ => return fail(allocator, endpoint, &e),
            }
            continue;
        }
        let mut served = lock(&SERVED);
        if STOPPED.load(Ordering::SeqCst) {
            return;
        }
        if polled[0].revents != 0 {
            // Its sockets close with it.
            served.take_if(|served| served.endpoint == endpoint);
            return;
        }
        match served.as_mut().filter(|served| served.endpoint == endpoint) {
            Some(served) => served.step(allocator, &polled),
            None => return,
        }
    }
}

/// The server cannot go on (poll failed for good): its clients end (their
/// leases with them, so blocks freed while leased are freed), it is no
/// longer advertised, and this process's exports pass through from then on.
fn fail(allocator: &Allocator, endpoint: u64, e: &std::io::Error) {
    log::warn!("CUDA IPC: the server stops: poll: {e}: handles of pool memory pass through");
    let mut server = lock(&SERVER);
    let mut served = lock(&SERVED);
    let Some(failed) = served.take_if(|served| served.endpoint == endpoint) else { return };
    for client in failed.pending.into_iter().chain(failed.clients) {
        client.end(allocator);
    }
    if let Some(gone) = server.take_if(|s| s.endpoint == endpoint) {
        let _ = std::fs::remove_file(&gone.path);
    }
    SERVING_PID.store(0, Ordering::Release);
    SERVING_ENDPOINT.store(0, Ordering::Release);
    FAILED_PID.store(failed.pid, Ordering::Relaxed);
}

impl Served {
    fn new(pid: u32, endpoint: u64, listener: UnixListener, woken: UnixStream) -> Served {
        let pools = ExportedPools { by_pool: HashMap::new(), next_id: 1 };
        Served { pid, endpoint, listener, woken, pending: VecDeque::new(), clients: Vec::new(), pools, accept_resumes: None }
    }

    /// What to poll (the wake, the listener, the pending connections, the
    /// clients, in that order) and for how long (ms): until the first
    /// deadline or the accepts' resumption, if any.
    fn to_poll(&self, now: Instant) -> (Vec<libc::pollfd>, libc::c_int) {
        // poll skips a negative descriptor: the listener, while accepts rest.
        let listener = if self.accept_resumes.is_some() { -1 } else { self.listener.as_raw_fd() };
        let polled = [self.woken.as_raw_fd(), listener]
            .into_iter()
            .chain(self.pending.iter().chain(&self.clients).map(|client| client.connection.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        let deadlines = self.pending.front().into_iter().chain(&self.clients).filter_map(|client| client.deadline);
        let next = deadlines.chain(self.accept_resumes).min();
        // A millisecond more: woken before the deadline, the step would find nothing due.
        let timeout = next.map_or(-1, |at| at.saturating_duration_since(now).as_millis().saturating_add(1).min(i32::MAX as u128) as libc::c_int);
        (polled, timeout)
    }

    /// Handles what poll reported (`polled`, as `to_poll` gave it): at most
    /// one request per connection, so that one busy connection keeps no
    /// other waiting; ends the connections past their deadline; accepts new ones.
    fn step(&mut self, allocator: &Allocator, polled: &[libc::pollfd]) {
        let now = Instant::now();
        let mut ready = polled.iter().skip(2).map(|polled| polled.revents != 0);
        let pending_ready: Vec<bool> = ready.by_ref().take(self.pending.len()).collect();
        let clients_ready: Vec<bool> = ready.collect();
        for (mut client, ready) in std::mem::take(&mut self.clients).into_iter().zip(clients_ready) {
            match if ready { receive(&mut client, now) } else { Received::Partly } {
                Received::All => self.answer(allocator, client),
                Received::Partly if client.deadline.is_none_or(|at| at > now) => self.clients.push(client),
                _ => client.end(allocator),
            }
        }
        for (mut client, ready) in std::mem::take(&mut self.pending).into_iter().zip(pending_ready) {
            match if ready { receive(&mut client, now) } else { Received::Partly } {
                Received::All => self.answer(allocator, client),
                Received::Partly if client.deadline.is_none_or(|at| at > now) => self.pending.push_back(client),
                _ => client.end(allocator),
            }
        }
        if self.accept_resumes.is_some_and(|at| at <= now) {
            self.accept_resumes = None;
        } else if polled[1].revents != 0 {
            self.accept(allocator, now);
        }
    }

    /// New connections: at most `MAX_PENDING` a step, so that a flood of
    /// connects does not keep the requests and leases waiting.
    fn accept(&mut self, allocator: &Allocator, now: Instant) {
        for _ in 0..MAX_PENDING {
            match self.listener.accept() {
                Ok((connection, _)) => self.admit(allocator, connection, now),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::debug!("CUDA IPC: accept: {e}");
                    self.accept_resumes = Some(now + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// A new connection: another user's is closed unanswered; an importer's
    /// first request, which it sends as it connects, is answered at once;
    /// one not all there yet waits, and beyond `MAX_PENDING` the oldest is dropped.
    fn admit(&mut self, allocator: &Allocator, connection: UnixStream, now: Instant) {
        // SAFETY: geteuid has no preconditions.
        if peer_uid(&connection) != Some(unsafe { libc::geteuid() }) || connection.set_nonblocking(true).is_err() {
            return;
        }
        let mut client = Client::new(connection, now + REQUEST_TIMEOUT);
        match receive(&mut client, now) {
            Received::All => self.answer(allocator, client),
            Received::Partly => {
                if self.pending.len() >= MAX_PENDING {
                    self.pending.pop_front();
                }
                self.pending.push_back(client);
            }
            Received::Failed => {}
        }
    }

    /// Answers a client's whole request. The connection stays while it holds
    /// leases; one that holds none after its answer, sends what is no request,
    /// or whose reply does not fit at once (it sends without reading) ends.
    fn answer(&mut self, allocator: &Allocator, mut client: Client) {
        let request = decode_request(&client.bytes);
        (client.received, client.deadline) = (0, None);
        let sent = match request {
            Some(Request::Lease(Op::Open, handle)) if handle.pid == self.pid && handle.endpoint == self.endpoint => {
                self.grant(allocator, &mut client, &handle)
            }
            Some(Request::Lease(Op::Open, _)) => send_all(&client.connection, &Reply::REFUSED.encode()).is_ok(),
            // A device's memory for a neighbour out of it, unless this process
            // takes no part (SOMA_NEIGHBOURS=0; it serves CUDA IPC) or the asker
            // has given up already (it hung up while this process was stopped,
            // say); every pool's for `somarun --trim`.
            Some(Request::GiveBack(uuid)) if (uuid.is_some() && !allocator.config.neighbours) || hung_up(&client.connection) => {
                send_all(&client.connection, &Reply::REFUSED.encode()).is_ok()
            }
            Some(Request::GiveBack(uuid)) => {
                let given = driver::loaded().map_or(0, |driver| allocator.give_back(driver, uuid));
                log::debug!("asked for memory: {given} bytes given back");
                send_all(&client.connection, &Reply { status: 0, pool: given, data: [0; 64] }.encode()).is_ok()
            }
            Some(Request::Usage(index)) => {
                let usage = driver::loaded().and_then(|driver| allocator.usage(driver, index as usize));
                let reply = usage.map_or(Reply::REFUSED, |usage| Reply {
                    status: 0,
                    pool: usage.ordinal as u32 as u64 | (usage.host as u64) << 32,
                    data: encode_usage(usage.uuid, usage.figures),
                });
                send_all(&client.connection, &reply.encode()).is_ok()
            }
            Some(Request::Snapshot) => {
                let status = if snapshot::on_request(allocator) { 0 } else { 1 };
                send_all(&client.connection, &Reply { status, pool: 0, data: [0; 64] }.encode()).is_ok()
            }
            Some(Request::Library(index)) => {
                let figures = allocator.libraries.figures();
                let reply = figures.get(index as usize).map_or(Reply::REFUSED, |f| Reply {
                    status: 0,
                    pool: f.in_use,
                    data: encode_library(f.peak, f.allocations, &f.name),
                });
                send_all(&client.connection, &reply.encode()).is_ok()
            }
            Some(Request::Lease(Op::Close, handle)) => {
                let key = (handle.base, handle.secret);
                let reply = match client.leases.get_mut(&key) {
                    Some(count) => {
                        *count -= 1;
                        if *count == 0 {
                            client.leases.remove(&key);
                        }
                        allocator.lease_ended(handle.base, &handle.secret);
                        Reply::DONE
                    }
                    None => Reply::REFUSED,
                };
                send_all(&client.connection, &reply.encode()).is_ok()
            }
            None => false,
        };
        if sent && !client.leases.is_empty() {
            self.clients.push(client);
        } else {
            client.end(allocator);
        }
    }

    /// A lease on the handle's block for `client` and its answer (the pool's
    /// descriptor with it if the connection has not had it): whether it was sent.
    fn grant(&mut self, allocator: &Allocator, client: &mut Client, handle: &IpcHandle) -> bool {
        let Some((block, context_id)) = allocator.lease(handle.base, &handle.secret) else {
            return send_all(&client.connection, &Reply::REFUSED.encode()).is_ok();
        };
        let Some((pool, fd, data)) = self.pools.export_block(allocator, handle.base, &block, context_id) else {
            allocator.lease_ended(handle.base, &handle.secret);
            return send_all(&client.connection, &Reply::REFUSED.encode()).is_ok();
        };
        let fd = (!client.pools_sent.contains(&pool)).then_some(fd);
        if send_with_fd(&client.connection, &Reply { status: 0, pool, data }.encode(), fd).is_err() {
            allocator.lease_ended(handle.base, &handle.secret);
            return false;
        }
        client.pools_sent.insert(pool);
        *client.leases.entry((handle.base, handle.secret)).or_insert(0) += 1;
        true
    }
}

enum Received {
    All,
    Partly,
    /// Closed, or broken.
    Failed,
}

/// Reads what has come of a request, without waiting, and never past its
/// end: a connection that sends more than one request at a time is read one
/// request a step, and its replies, unread, soon fail to fit.
fn receive(client: &mut Client, now: Instant) -> Received {
    loop {
        match client.connection.read(&mut client.bytes[client.received..]) {
            Ok(0) => return Received::Failed,
            Ok(n) => {
                client.deadline.get_or_insert(now + REQUEST_TIMEOUT);
                client.received += n;
                if client.received == REQUEST_LEN {
                    return Received::All;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Received::Partly,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Received::Failed,
        }
    }
}

/// The pools the server exported, by pool.
struct ExportedPools {
    by_pool: HashMap<Pool, ExportedPool>,
    /// The next pool's id: ids are never reused, so an importer's pool of an
    /// earlier context is never taken for a new one.
    next_id: u64,
}

/// A pool as the server exported it: the descriptor serves only while the
/// device's context is the one it was exported in (a reset destroys the
/// pool, and a new one may have the same handle value).
struct ExportedPool {
    id: u64,
    device: i32,
    context_id: u64,
    fd: OwnedFd,
}

impl ExportedPools {
    /// The block's pool (its id and descriptor, exported once per pool and
    /// context) and the block's export data; None unless the device's pool
    /// is of the context the block was exported in (`exported_in`): after a
    /// reset another allocation may hold its address.
    fn export_block(&mut self, allocator: &Allocator, base: u64, block: &Block, exported_in: u64) -> Option<(u64, RawFd, PointerExport)> {
        let driver = driver::loaded()?;
        let device = block.device;
        let (pool, context, context_id) = allocator.shareable_pool(device, block.size).filter(|&(_, _, id)| id == exported_in)?;
        let exported = driver.with_context(context, || -> Result<_, crate::cuda::gpu::CuError> {
            // The pool first: the driver exports blocks only of a pool already
            // shared (measured: the block's export refuses with invalid value before).
            let (id, fd) = match self.by_pool.get(&pool).filter(|exported| exported.context_id == context_id) {
                Some(exported) => (exported.id, exported.fd.as_raw_fd()),
                None => {
                    // The driver's descriptor comes without close-on-exec; `export_pool` sets it
                    // at once (no call makes that atomic). A fork waits for this step, so no
                    // fork-and-exec child inherits it; a posix_spawn in another thread may.
                    let fd = driver.export_pool(pool)?;
                    let (id, raw) = (self.next_id, fd.as_raw_fd());
                    self.next_id += 1;
                    // The device's pools of an earlier context are gone: their descriptors close.
                    self.by_pool.retain(|_, exported| exported.device != device || exported.context_id == context_id);
                    self.by_pool.insert(pool, ExportedPool { id, device, context_id, fd });
                    (id, raw)
                }
            };
            Ok((id, fd, driver.export_pointer(base)?))
        });
        match exported {
            Ok(Ok(found)) => Some(found),
            Ok(Err(e)) | Err(e) => {
                log::warn!("CUDA IPC: exporting the block at {base:#x} failed: {e:?}");
                None
            }
        }
    }
}

/// Whether the client closed its end (with its request sent before).
fn hung_up(connection: &UnixStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: peeks at most one byte into a local.
    let n = unsafe { libc::recv(connection.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n == 0
}

fn peer_uid(connection: &UnixStream) -> Option<u32> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a ucred of `len` bytes to a local.
    let rc = unsafe {
        libc::getsockopt(
            connection.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut credentials as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(credentials.uid)
}
