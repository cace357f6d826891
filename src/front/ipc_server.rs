//! The exporter's side of CUDA IPC on pool memory (front/ipc.rs has the
//! whole exchange): one thread per process serving leases on its Unix
//! socket, and the socket protocol both sides speak. No client can stall it:
//! its sockets are non-blocking, a request has one deadline from its accept,
//! few connections may wait for theirs, no lock is held across a wait on a
//! client, and exit does not wait for one.

use std::collections::{HashMap, VecDeque};
use std::io::{IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::allocator::state::Allocator;
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

/// The directory of this user's IPC sockets: made with mode 0700, and used
/// only if it is a real directory this user owns that no one else may enter.
pub(super) fn socket_dir() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let dir = PathBuf::from(format!("/tmp/somashim-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!("{} is not a directory of this user's that only it may enter", dir.display()));
    }
    Ok(dir)
}

pub(super) fn socket_path(dir: &std::path::Path, pid: u32, endpoint: u64) -> PathBuf {
    dir.join(format!("{pid}-{endpoint:016x}"))
}

pub(super) struct Server {
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
pub(super) static SERVER: Mutex<Option<Server>> = Mutex::new(None);

/// The pid and endpoint of the running server, for the open that must
/// refuse this process's own handles without waiting for an export that
/// holds `SERVER`. (A forked child sees its parent's pid here: not its own.)
pub(super) static SERVING_PID: AtomicU32 = AtomicU32::new(0);
pub(super) static SERVING_ENDPOINT: AtomicU64 = AtomicU64::new(0);

/// The pid of a process whose server could not start: its handle requests
/// pass through from then on, without a new attempt (and warning) each time.
static FAILED_PID: AtomicU32 = AtomicU32::new(0);

/// The endpoint of this process's server, started on first use.
pub(super) fn server_endpoint(allocator: &'static Allocator) -> Option<u64> {
    let mut server = lock(&SERVER);
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
            log::warn!("CUDA IPC: cannot start the shim's IPC server ({e}): handles of pool memory pass through");
            FAILED_PID.store(pid, Ordering::Relaxed);
            None
        }
    }
}

/// Binds the socket and starts the thread. Every descriptor of the server
/// is made close-on-exec as it is made (std's sockets, `accept4`), so that
/// no child the program starts meanwhile inherits one.
fn start_server(allocator: &'static Allocator, pid: u32) -> Result<Server, String> {
    let dir = socket_dir()?;
    let random = random_secret().ok_or("no random bytes from the kernel")?;
    let endpoint = u64::from_le_bytes(random[..8].try_into().unwrap_or_default());
    let path = socket_path(&dir, pid, endpoint);
    let listener = UnixListener::bind(&path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
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

/// At exit: the socket goes (no importer reaches the server from then on)
/// and the thread is told to stop. Exit waits for it a short while at most,
/// so that a step's driver calls do not run on while the runtime tears
/// down; never for a client, since the thread waits on none.
pub fn stop_server() {
    let Some(mut server) = try_lock(&SERVER) else { return };
    let Some(running) = server.take_if(|s| s.pid == std::process::id()) else { return };
    let _ = std::fs::remove_file(&running.path);
    let _ = send_all(&running.wake, &[1]);
    let deadline = Instant::now() + STOP_WAIT;
    while !running.thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    if running.thread.is_finished() {
        let _ = running.thread.join();
    }
}

/// One lease: the importer's connection, and the block it holds.
struct Lease {
    connection: UnixStream,
    base: u64,
    secret: Secret,
}

/// An accepted connection whose request has not all come.
struct Request {
    connection: UnixStream,
    bytes: [u8; 64],
    received: usize,
    /// One deadline for the whole request, however it trickles in.
    deadline: Instant,
}

/// What the server thread serves. Here rather than on the thread's stack so
/// that a forked child closes its copies: the listener above all, which
/// would let importers of a dead exporter's handles connect to a child that
/// never answers.
pub(super) struct Served {
    pid: u32,
    endpoint: u64,
    listener: UnixListener,
    /// Readable when the thread is to stop.
    woken: UnixStream,
    /// Oldest first, so the first deadline is the front's.
    requests: VecDeque<Request>,
    leases: Vec<Lease>,
    pool_fds: HashMap<Pool, ExportedPool>,
    /// After a failed accept (out of descriptors, say), which leaves the
    /// listener readable: when to accept again.
    accept_resumes: Option<Instant>,
}

/// Held by the server thread while it handles what poll reported, and by a
/// forking thread across `fork`: the child then inherits none of the locks
/// a step takes (shared blocks, pointer map, deferred frees). Every socket
/// of the server is non-blocking: a step waits on no client, so neither
/// does a fork (at most on a step's driver calls).
pub(super) static SERVED: Mutex<Option<Served>> = Mutex::new(None);

/// The server thread: answers requests and watches leases until woken. It
/// holds no lock across poll, and none of the allocator's across its driver
/// calls.
fn serve(allocator: &Allocator, endpoint: u64) {
    loop {
        let (mut polled, timeout) = match lock(&SERVED).as_ref().filter(|served| served.endpoint == endpoint) {
            Some(served) => served.to_poll(Instant::now()),
            None => return,
        };
        // SAFETY: `polled` is a valid array of its length.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, timeout) };
        let failed = (n < 0).then(std::io::Error::last_os_error);
        if failed.as_ref().is_some_and(|e| e.kind() == std::io::ErrorKind::Interrupted) {
            continue;
        }
        let mut served = lock(&SERVED);
        if failed.is_some() || polled[0].revents != 0 {
            if let Some(e) = failed {
                log::warn!("CUDA IPC: the server stops: poll: {e}");
            }
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

impl Served {
    fn new(pid: u32, endpoint: u64, listener: UnixListener, woken: UnixStream) -> Served {
        Served { pid, endpoint, listener, woken, requests: VecDeque::new(), leases: Vec::new(), pool_fds: HashMap::new(), accept_resumes: None }
    }

    /// What to poll (the wake, the listener, the requests, the leases, in
    /// that order) and for how long (ms): until the first deadline or the
    /// accepts' resumption, if any.
    fn to_poll(&self, now: Instant) -> (Vec<libc::pollfd>, libc::c_int) {
        // poll skips a negative descriptor: the listener, while accepts rest.
        let listener = if self.accept_resumes.is_some() { -1 } else { self.listener.as_raw_fd() };
        let polled = [self.woken.as_raw_fd(), listener]
            .into_iter()
            .chain(self.requests.iter().map(|request| request.connection.as_raw_fd()))
            .chain(self.leases.iter().map(|lease| lease.connection.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        let next = self.requests.front().map(|request| request.deadline).into_iter().chain(self.accept_resumes).min();
        // A millisecond more: woken before the deadline, the step would find nothing due.
        let timeout = next.map_or(-1, |at| at.saturating_duration_since(now).as_millis().saturating_add(1).min(i32::MAX as u128) as libc::c_int);
        (polled, timeout)
    }

    /// Handles what poll reported (`polled`, as `to_poll` gave it), drops
    /// the requests past their deadline, and accepts new connections.
    fn step(&mut self, allocator: &Allocator, polled: &[libc::pollfd]) {
        let now = Instant::now();
        let mut ready = polled.iter().skip(2).map(|polled| polled.revents != 0);
        let requests_ready: Vec<bool> = ready.by_ref().take(self.requests.len()).collect();
        let leases_ready: Vec<bool> = ready.collect();
        // Leases whose importer closed, exited or broke the protocol: end them, last first so indices hold.
        for index in (0..self.leases.len()).rev() {
            if leases_ready.get(index) == Some(&true) && lease_over(&mut self.leases[index].connection) {
                let lease = self.leases.swap_remove(index);
                allocator.lease_ended(lease.base, &lease.secret);
            }
        }
        for (mut request, ready) in std::mem::take(&mut self.requests).into_iter().zip(requests_ready) {
            match if ready { receive(&mut request) } else { Received::Partly } {
                Received::All => self.answer(allocator, request),
                Received::Partly if request.deadline > now => self.requests.push_back(request),
                _ => {} // closed, failed or late: dropped unanswered
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
    /// request, which it sends as it connects, is answered at once; one not
    /// all there yet waits, and beyond `MAX_PENDING` the oldest is dropped.
    fn admit(&mut self, allocator: &Allocator, connection: UnixStream, now: Instant) {
        // SAFETY: geteuid has no preconditions.
        if peer_uid(&connection) != Some(unsafe { libc::geteuid() }) || connection.set_nonblocking(true).is_err() {
            return;
        }
        let mut request = Request { connection, bytes: [0; 64], received: 0, deadline: now + REQUEST_TIMEOUT };
        match receive(&mut request) {
            Received::All => self.answer(allocator, request),
            Received::Partly => {
                if self.requests.len() >= MAX_PENDING {
                    self.requests.pop_front();
                }
                self.requests.push_back(request);
            }
            Received::Failed => {}
        }
    }

    /// Answers a whole request; a granted one becomes a lease. The sends do
    /// not wait: a few bytes on a connection that has sent none back fit, or
    /// the connection is dropped.
    fn answer(&mut self, allocator: &Allocator, request: Request) {
        let (pid, endpoint, pool_fds) = (self.pid, self.endpoint, &mut self.pool_fds);
        let granted = IpcHandle::decode(&request.bytes)
            .filter(|handle| handle.pid == pid && handle.endpoint == endpoint)
            .and_then(|handle| {
                let block = allocator.lease(handle.base, &handle.secret)?;
                match export_block(allocator, handle.base, block.device, block.size, pool_fds) {
                    Some(granted) => Some((handle.base, handle.secret, granted)),
                    None => {
                        allocator.lease_ended(handle.base, &handle.secret);
                        None
                    }
                }
            });
        let connection = request.connection;
        let Some((base, secret, (pool_fd, data))) = granted else {
            let _ = send_all(&connection, &1u32.to_le_bytes());
            return;
        };
        let mut reply = [0u8; REPLY_LEN];
        reply[4..].copy_from_slice(&data);
        if send_with_fd(&connection, &reply, pool_fd).is_err() {
            allocator.lease_ended(base, &secret);
            return;
        }
        self.leases.push(Lease { connection, base, secret });
    }
}

enum Received {
    All,
    Partly,
    /// Closed before the end, or broken.
    Failed,
}

/// Reads what has come of a request, without waiting.
fn receive(request: &mut Request) -> Received {
    loop {
        match request.connection.read(&mut request.bytes[request.received..]) {
            Ok(0) => return Received::Failed,
            Ok(n) => {
                request.received += n;
                if request.received == request.bytes.len() {
                    return Received::All;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Received::Partly,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Received::Failed,
        }
    }
}

/// Whether a lease is over: its importer closed it (or exited), or sent
/// something, which the protocol never has it do after its request. One
/// large read: a flood costs the server one step, not one per few bytes.
fn lease_over(connection: &mut UnixStream) -> bool {
    let mut bytes = [0u8; 4096];
    loop {
        match connection.read(&mut bytes) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
            Ok(_) => return true,
        }
    }
}

/// The reply: status (0: granted), then, if granted, the block's export
/// data; the pool's descriptor travels alongside.
pub(super) const REPLY_LEN: usize = 4 + 64;

/// A pool as the server exported it: the descriptor serves only while the
/// device's context is the one it was exported in (a reset destroys the
/// pool, and a new one may have the same handle value).
struct ExportedPool {
    device: i32,
    context_id: u64,
    fd: OwnedFd,
}

/// The pool's descriptor (exported once per pool, before any of its blocks)
/// and the block's export data.
fn export_block(
    allocator: &Allocator,
    base: u64,
    device: i32,
    size: u64,
    pool_fds: &mut HashMap<Pool, ExportedPool>,
) -> Option<(RawFd, PointerExport)> {
    let driver = driver::loaded()?;
    let (pool, context, context_id) = allocator.shareable_pool(device, size)?;
    let exported = driver.with_context(context, || -> Result<_, crate::cuda::gpu::CuError> {
        // The pool first: the driver exports blocks only of a pool already
        // shared (measured: the block's export refuses with invalid value before).
        let fd = match pool_fds.get(&pool).filter(|exported| exported.context_id == context_id) {
            Some(exported) => exported.fd.as_raw_fd(),
            None => {
                // The driver's descriptor comes without close-on-exec; `export_pool` sets it
                // at once (no call makes that atomic). A fork waits for this step, so no
                // fork-and-exec child inherits it; a posix_spawn in another thread may.
                let fd = driver.export_pool(pool)?;
                let raw = fd.as_raw_fd();
                // The device's pools of an earlier context are gone: their descriptors close.
                pool_fds.retain(|_, exported| exported.device != device || exported.context_id == context_id);
                pool_fds.insert(pool, ExportedPool { device, context_id, fd });
                raw
            }
        };
        Ok((fd, driver.export_pointer(base)?))
    });
    match exported {
        Ok(Ok(found)) => Some(found),
        Ok(Err(e)) | Err(e) => {
            log::warn!("CUDA IPC: exporting the block at {base:#x} failed: {e:?}");
            None
        }
    }
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

/// Writes all of `bytes` without the SIGPIPE a write to a closed socket
/// raises (which would end the program: the shim runs inside it).
pub(super) fn send_all(connection: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: sends from a live slice on a live socket.
        let n = unsafe { libc::send(connection.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

fn send_with_fd(connection: &UnixStream, bytes: &[u8], fd: RawFd) -> std::io::Result<()> {
    let iov = [IoSlice::new(bytes)];
    let mut control = [0u64; 4]; // CMSG_SPACE(sizeof(int)), aligned
    // SAFETY: msghdr is plain data; the control buffer holds one int's cmsg.
    unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = iov.as_ptr() as *mut libc::iovec;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
        if libc::sendmsg(connection.as_raw_fd(), &message, libc::MSG_NOSIGNAL) != bytes.len() as isize {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives the reply and the descriptor sent with it (if any).
pub(super) fn receive_with_fd(connection: &UnixStream, bytes: &mut [u8; REPLY_LEN]) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = [IoSliceMut::new(bytes)];
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; the kernel writes at most the buffers' lengths.
    unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = iov.as_mut_ptr().cast();
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = std::mem::size_of_val(&control);
        let n = libc::recvmsg(connection.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let header = libc::CMSG_FIRSTHDR(&message);
        let fd = (!header.is_null() && (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS)
            .then(|| OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<RawFd>())));
        Ok((n as usize, fd))
    }
}
