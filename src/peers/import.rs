//! CUDA IPC on pool memory, between two processes under the shim: the
//! importer's side, and the whole exchange.
//!
//! Export (`cuIpcGetMemHandle`, `cudaIpcGetMemHandle`; export.rs): for a pool
//! block the handle is the shim's (`core::shared_blocks::IpcHandle`): the
//! exporter's pid and endpoint, the block's base address and a secret; never
//! the pool's file descriptor. The first export starts this process's server
//! (server.rs): one thread listening on a Unix socket in a directory only
//! this user can enter.
//!
//! Import (`cuIpcOpenMemHandle`): the importer holds one connection (a
//! link) per exporter and device of its own, whatever the number of handles
//! (wire.rs has the messages). Over it, it presents the handle;
//! the server (which checked the peer's user at the accept) checks the
//! secret, takes a lease on the block and answers with the block's export
//! data, and with the pool's shareable file descriptor (`SCM_RIGHTS`) the
//! first time the link needs it; the importer imports the pool (once per
//! link, its descriptor then closed) and the pointer. The last close
//! (`cuIpcCloseMemHandle`) ends the lease by a message; the link's end (its
//! last lease closed, or the importer's exit) ends all of its leases.
//!
//! The runtime's `cudaIpcOpenMemHandle` and `cudaIpcCloseMemHandle` reach
//! these through the driver entry points the shim hands out (shared and
//! static runtime alike), so the runtime turns the driver's codes into its
//! own and keeps its last error as it does natively. Any handle that is not
//! the shim's, and any shim handle the shim cannot open, goes to the real
//! call, which refuses the shim's bytes as an invalid value.

use std::collections::HashMap;
use std::ffi::c_uint;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::core::allocator::state::Allocator;
use crate::core::config::settings::Config;
use crate::core::locks::lock;
use crate::core::shared_blocks::{IpcHandle, Secret};
use crate::cuda::driver;
use crate::cuda::gpu::{Gpu, Pool};
use crate::cuda::real::{IpcMemHandle, SUCCESS};

use super::server::{SERVING_ENDPOINT, SERVING_PID};
use super::socket_dir::{remove_stale_socket, socket_dir, socket_path};
use super::wire::{connect, encode_request, receive_with_fd, send_all_by, Op, Reply, REPLY_LEN};

/// `CUDA_ERROR_INVALID_CONTEXT`: the real open of a handle in the process
/// that exported it (measured, docs/FACTS.md "CUDA IPC").
const INVALID_CONTEXT: u32 = 201;
/// `CUDA_ERROR_INVALID_HANDLE`: the real open of a handle whose exporter has exited.
const INVALID_HANDLE: u32 = 400;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the one flag the real open accepts.
const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
/// How long the importer waits for the exporter's answer (which includes
/// the exporter's driver calls), the connect included for a new link.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// One block this process imported, opened `opens` times.
struct Imported {
    ptr: u64,
    opens: u32,
    /// The link its lease is on.
    link: u64,
    handle: IpcHandle,
}

/// The one connection to an exporter for a device of this process: the
/// leases of every block imported over it, and the pools imported through
/// it (their descriptors closed once imported: the driver keeps none of ours).
struct Link {
    connection: UnixStream,
    /// The exporter's (pid, endpoint) and the device: what the link serves.
    key: LinkKey,
    pools: HashMap<u64, Pool>,
    leases: usize,
    /// An exchange on it failed (timed out, say), so a reply may still come:
    /// no request goes on it again, and it ends (with its leases in the
    /// exporter) with its last lease here.
    retired: bool,
}

type LinkKey = (u32, u64, i32);

/// An imported block's (exporter endpoint, base address in the exporter,
/// secret): a handle opens an existing mapping only if it names the same
/// export, secret included, as the exporter would check.
type ImportKey = (u64, u64, Secret);

#[derive(Default)]
struct Imports {
    blocks: HashMap<ImportKey, Imported>,
    by_ptr: HashMap<u64, ImportKey>,
    links: HashMap<u64, Link>,
    /// The link new opens of an exporter's handles on a device go over.
    current: HashMap<LinkKey, u64>,
    next_link: u64,
}

/// Held across each exchange with an exporter (one request, one reply, each
/// bounded by `EXCHANGE_TIMEOUT`), which serializes the requests on a
/// link, and by a forking thread across `fork`.
static IMPORTS: Mutex<Option<Imports>> = Mutex::new(None);

/// Whether this process ever imported a block (skips the lock for the real closes).
static IMPORTED_ANY: AtomicBool = AtomicBool::new(false);

/// `cuIpcOpenMemHandle`: a shim handle is opened here; anything else, and a
/// shim handle that opens nothing, the real call answers. `allocator` gives
/// the process's, made on first use: only a new link needs it (the socket
/// directory), so an open that is not the shim's makes none.
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn open_mem_handle(
    allocator: fn() -> &'static Allocator,
    out: *mut u64,
    handle: &IpcMemHandle,
    flags: c_uint,
    real: impl FnOnce() -> u32,
) -> u32 {
    let Some(handle) = IpcHandle::decode(&handle.0) else { return real() };
    if out.is_null() || flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
        return real(); // refuses the arguments as it refuses them natively
    }
    let pid = std::process::id();
    if handle.pid == pid && SERVING_PID.load(Ordering::Acquire) == pid && SERVING_ENDPOINT.load(Ordering::Acquire) == handle.endpoint {
        return INVALID_CONTEXT;
    }
    match import(allocator, &handle) {
        Ok(ptr) => {
            // SAFETY: `out` is non-null and writable.
            unsafe { *out = ptr };
            SUCCESS
        }
        Err(Refused::ExporterGone) => INVALID_HANDLE,
        Err(Refused::Driver(code)) => code,
        Err(Refused::Invalid) => real(),
    }
}

enum Refused {
    /// The exporting process has exited.
    ExporterGone,
    /// Forged, stale, or not this user's: the real call's invalid value.
    Invalid,
    Driver(u32),
}

fn import(allocator: fn() -> &'static Allocator, handle: &IpcHandle) -> Result<u64, Refused> {
    let driver = driver::loaded().ok_or(Refused::Invalid)?;
    let device = driver.current_device().map_err(|e| Refused::Driver(e.0))?;
    let mut imports = lock(&IMPORTS);
    let imports = imports.get_or_insert_with(Imports::default);
    let key = (handle.endpoint, handle.base, handle.secret);
    if let Some(open) = imports.blocks.get_mut(&key) {
        open.opens += 1; // as the real call: the same address, counted
        return Ok(open.ptr);
    }
    let unanswered = || if exporter_gone(handle.pid) { Refused::ExporterGone } else { Refused::Invalid };
    let deadline = Instant::now() + EXCHANGE_TIMEOUT;
    let id = match imports.link((handle.pid, handle.endpoint, device), deadline, allocator) {
        Ok(id) => id,
        // A listener closes only with its exporter (a forked child closes its copy): the
        // file is a dead exporter's, whose pid may be another process's by now.
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            remove_exporters_socket(&allocator().config, handle);
            return Err(Refused::ExporterGone);
        }
        Err(_) => return Err(unanswered()),
    };
    let link = imports.links.get_mut(&id).ok_or(Refused::Invalid)?;
    let Ok((reply, pool_fd)) = link.exchange(Op::Open, handle, deadline) else {
        imports.retire(id);
        imports.drop_if_unused(id);
        let refused = unanswered();
        if matches!(refused, Refused::ExporterGone) {
            // Killed as it was asked: a zombie's last threads may still have
            // held the listener at the connect. The file is a dead exporter's.
            remove_exporters_socket(&allocator().config, handle);
        }
        return Err(refused);
    };
    if reply.status != 0 {
        imports.drop_if_unused(id);
        return Err(Refused::Invalid);
    }
    link.leases += 1;
    // The pool's descriptor comes with the link's first block of it, and closes once imported.
    let pool = match pool_fd {
        Some(fd) => driver.import_pool(fd.as_fd()).ok().inspect(|&pool| _ = link.pools.insert(reply.pool, pool)),
        None => link.pools.get(&reply.pool).copied(),
    };
    let Some(pool) = pool else {
        // The exporter takes this link to have the pool: a new one will get it.
        imports.retire(id);
        imports.release(id, handle);
        return Err(Refused::Invalid);
    };
    match driver.set_peer_access(pool, device, true).and_then(|_| driver.import_pointer(pool, &reply.data)) {
        Ok(ptr) => {
            imports.blocks.insert(key, Imported { ptr, opens: 1, link: id, handle: *handle });
            imports.by_ptr.insert(ptr, key);
            IMPORTED_ANY.store(true, Ordering::Release);
            Ok(ptr)
        }
        Err(e) => {
            imports.release(id, handle);
            Err(Refused::Driver(e.0))
        }
    }
}

impl Imports {
    /// The link to the exporter for the device, connected if there is none.
    fn link(&mut self, key: LinkKey, deadline: Instant, allocator: fn() -> &'static Allocator) -> std::io::Result<u64> {
        if let Some(&id) = self.current.get(&key) {
            return Ok(id);
        }
        let dir = socket_dir(&allocator().config).map_err(std::io::Error::other)?;
        let connection = connect(&socket_path(&dir, key.0, key.1), deadline)?;
        let id = self.next_link;
        self.next_link += 1;
        self.links.insert(id, Link { connection, key, pools: HashMap::new(), leases: 0, retired: false });
        self.current.insert(key, id);
        Ok(id)
    }

    fn retire(&mut self, id: u64) {
        let Some(link) = self.links.get_mut(&id) else { return };
        link.retired = true;
        if self.current.get(&link.key) == Some(&id) {
            self.current.remove(&link.key);
        }
    }

    /// A link that holds no lease closes (the exporter closes its end too).
    fn drop_if_unused(&mut self, id: u64) {
        if let Some(link) = self.links.get(&id).filter(|link| link.leases == 0) {
            if self.current.get(&link.key) == Some(&id) {
                self.current.remove(&link.key);
            }
            self.links.remove(&id);
        }
    }

    /// Ends the link's lease on the handle's block: the exporter is told,
    /// unless the link is retired, whose end tells it.
    fn release(&mut self, id: u64, handle: &IpcHandle) {
        let Some(link) = self.links.get_mut(&id) else { return };
        link.leases = link.leases.saturating_sub(1);
        if !link.retired && link.exchange(Op::Close, handle, Instant::now() + EXCHANGE_TIMEOUT).is_err() {
            self.retire(id);
        }
        self.drop_if_unused(id);
    }
}

impl Link {
    /// One request and its reply (with the descriptor sent alongside, if
    /// any). An error leaves the link out of step: the caller retires it.
    fn exchange(&self, op: Op, handle: &IpcHandle, deadline: Instant) -> Result<(Reply, Option<OwnedFd>), ()> {
        send_all_by(&self.connection, &encode_request(op, handle), Some(deadline)).map_err(|_| ())?;
        let mut reply = [0u8; REPLY_LEN];
        match receive_with_fd(&self.connection, &mut reply, deadline) {
            Ok((n, fd)) if n == REPLY_LEN => Ok((Reply::decode(&reply), fd)),
            _ => Err(()),
        }
    }
}

/// Removes the socket file of the handle's exporter, which is gone.
fn remove_exporters_socket(config: &Config, handle: &IpcHandle) {
    if let Ok(dir) = socket_dir(config) {
        remove_stale_socket(&socket_path(&dir, handle.pid, handle.endpoint));
    }
}

/// Whether process `pid` has exited (asked where its socket did not refuse
/// the connect: missing, or a connection closed unanswered): there is none,
/// or it is a zombie its parent has not reaped (its sockets are closed all the same).
fn exporter_gone(pid: u32) -> bool {
    // 0 and negative pids name process groups.
    let Some(pid) = libc::pid_t::try_from(pid).ok().filter(|&pid| pid > 0) else { return false };
    // SAFETY: kill with signal 0 only asks whether the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    // The state follows the command's name, which is in parentheses and may hold any byte.
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.iter().rposition(|&b| b == b')').and_then(|end| stat.get(end + 2));
    matches!(state, Some(b'Z' | b'X'))
}

/// `cuIpcCloseMemHandle`: an imported block's last close unmaps it here
/// (once this context's work is done, so the exporter may reuse it) and
/// ends its lease; anything else the real call answers.
pub fn close_mem_handle(ptr: u64, real: impl FnOnce() -> u32) -> u32 {
    if !IMPORTED_ANY.load(Ordering::Acquire) {
        return real();
    }
    // Held until the lease has ended: an open of the same handle meanwhile
    // would map it again at the same address, and this unmapping undo it.
    // (IPC calls are not the allocation hot path.)
    let mut imports = lock(&IMPORTS);
    let Some(imports) = imports.as_mut() else { return real() };
    let Some(&key) = imports.by_ptr.get(&ptr) else { return real() };
    let Some(open) = imports.blocks.get_mut(&key) else { return real() };
    open.opens -= 1;
    if open.opens > 0 {
        return SUCCESS;
    }
    imports.by_ptr.remove(&ptr);
    let Some(closed) = imports.blocks.remove(&key) else { return SUCCESS };
    if let Some(driver) = driver::loaded() {
        if let Err(e) = driver.synchronize_context().and_then(|_| driver.free_now(ptr)) {
            log::warn!("CUDA IPC: unmapping the imported block at {ptr:#x} failed: {e:?}");
        }
    }
    imports.release(closed.link, &closed.handle); // after the unmapping
    SUCCESS
}

/// The importer's lock, held by a forking thread across `fork` (fork.rs): no
/// exchange of an import or close in progress.
pub(super) struct Held(MutexGuard<'static, Option<Imports>>);

pub(super) fn hold() -> Held {
    Held(lock(&IMPORTS))
}

impl Held {
    /// In a forked child: the parent's links close (a copy of one would keep
    /// the exporter's blocks held).
    pub(super) fn in_child(mut self) {
        *self.0 = None;
        IMPORTED_ANY.store(false, Ordering::Release);
    }
}
