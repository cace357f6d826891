//! CUDA IPC on pool memory, between two processes under the shim.
//!
//! Export (`cuIpcGetMemHandle`, `cudaIpcGetMemHandle`): for a pool block the
//! handle is the shim's (`core::shared_blocks::IpcHandle`): the exporter's pid and
//! endpoint, the block's base address and a secret; never the pool's file
//! descriptor. The first export starts this process's IPC server
//! (front/ipc_server.rs): one thread listening on a Unix socket in a
//! directory only this user can enter.
//!
//! Import (`cuIpcOpenMemHandle`): the importer connects to the exporter's
//! socket and presents the handle; the server checks the peer's user and the
//! secret, takes a lease on the block and answers with the pool's shareable
//! file descriptor (`SCM_RIGHTS`) and the block's export data; the importer
//! imports the pool and the pointer. The connection stays open as the lease:
//! the close (`cuIpcCloseMemHandle`), or the importer's exit, ends it.
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
use std::time::Duration;

use crate::core::allocator::state::Allocator;
use crate::core::shared_blocks::{IpcHandle, Secret};
use crate::core::locks::lock;
use crate::cuda::driver::{self, PointerExport};
use crate::cuda::gpu::{Gpu, Pool};
use crate::cuda::real::{IpcMemHandle, SUCCESS};

use super::ipc_server::{
    random_secret, receive_with_fd, send_all, server_endpoint, socket_dir, socket_path, Served, Server, REPLY_LEN, SERVED,
    SERVER, SERVING_ENDPOINT, SERVING_PID,
};

/// `CUDA_ERROR_INVALID_CONTEXT`: the real open of a handle in the process
/// that exported it (measured, docs/FACTS.md "CUDA IPC").
const INVALID_CONTEXT: u32 = 201;
/// `CUDA_ERROR_INVALID_HANDLE`: the real open of a handle whose exporter has exited.
const INVALID_HANDLE: u32 = 400;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the one flag the real open accepts.
const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
/// How long the importer waits for the exporter's answer (which includes
/// the exporter's driver calls).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

// ---- export -------------------------------------------------------------------

/// `cuIpcGetMemHandle`/`cudaIpcGetMemHandle`: the shim's handle for a pool
/// block (the allocation holding `ptr`, as the real handle names), else the
/// real call's answer.
/// SAFETY: `out` is null or 64 writable bytes, as the C contract requires.
pub unsafe fn get_mem_handle(allocator: &'static Allocator, out: *mut IpcMemHandle, ptr: u64, real: impl FnOnce() -> u32) -> u32 {
    if out.is_null() {
        return real();
    }
    match export(allocator, ptr) {
        Some(handle) => {
            // SAFETY: `out` is non-null and writable.
            unsafe { *out = IpcMemHandle(handle.encode()) };
            SUCCESS
        }
        None => real(),
    }
}

fn export(allocator: &'static Allocator, ptr: u64) -> Option<IpcHandle> {
    let driver = driver::loaded()?;
    let base = match allocator.live_block(ptr) {
        Some(_) => ptr,
        None => driver.allocation_base(ptr).ok()?,
    };
    // Pinned host memory from the host pool is not exportable (nor is the real allocator's).
    let block = allocator.live_block(base).filter(|block| !block.memory.is_host())?;
    // A pool other processes cannot import: the real call answers.
    allocator.shareable_pool(block.device, block.size)?;
    let endpoint = server_endpoint(allocator)?;
    let (secret, _) = allocator.export(driver, base, random_secret)?;
    Some(IpcHandle { pid: std::process::id(), endpoint, base, secret })
}




// ---- import -------------------------------------------------------------------

/// One block this process imported, opened `opens` times.
struct Imported {
    ptr: u64,
    opens: u32,
    /// The lease: closing it tells the exporter.
    _connection: UnixStream,
}

/// An imported block's (exporter endpoint, base address in the exporter,
/// secret): a handle opens an existing mapping only if it names the same
/// export, secret included, as the exporter would check.
type ImportKey = (u64, u64, Secret);

static IMPORTS: Mutex<Option<HashMap<ImportKey, Imported>>> = Mutex::new(None);

/// Whether this process ever imported a block (skips the lock for the real closes).
static IMPORTED_ANY: AtomicBool = AtomicBool::new(false);

/// `cuIpcOpenMemHandle`: a shim handle is opened here; anything else, and a
/// shim handle that opens nothing, the real call answers.
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn open_mem_handle(out: *mut u64, handle: &IpcMemHandle, flags: c_uint, real: impl FnOnce() -> u32) -> u32 {
    let Some(handle) = IpcHandle::decode(&handle.0) else { return real() };
    if out.is_null() || flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
        return real(); // refuses the arguments as it refuses them natively
    }
    let pid = std::process::id();
    if handle.pid == pid && SERVING_PID.load(Ordering::Acquire) == pid && SERVING_ENDPOINT.load(Ordering::Acquire) == handle.endpoint {
        return INVALID_CONTEXT;
    }
    match import(&handle) {
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

fn import(handle: &IpcHandle) -> Result<u64, Refused> {
    let driver = driver::loaded().ok_or(Refused::Invalid)?;
    let device = driver.current_device().map_err(|e| Refused::Driver(e.0))?;
    let mut imports = lock(&IMPORTS);
    let imports = imports.get_or_insert_with(HashMap::new);
    if let Some(open) = imports.get_mut(&(handle.endpoint, handle.base, handle.secret)) {
        open.opens += 1; // as the real call: the same address, counted
        return Ok(open.ptr);
    }
    let dir = socket_dir().map_err(|_| Refused::Invalid)?;
    let unanswered = || if exporter_gone(handle.pid) { Refused::ExporterGone } else { Refused::Invalid };
    let connection = UnixStream::connect(socket_path(&dir, handle.pid, handle.endpoint)).map_err(|_| unanswered())?;
    connection.set_read_timeout(Some(EXCHANGE_TIMEOUT)).map_err(|_| Refused::Invalid)?;
    connection.set_write_timeout(Some(EXCHANGE_TIMEOUT)).map_err(|_| Refused::Invalid)?;
    send_all(&connection, &handle.encode()).map_err(|_| unanswered())?;
    let mut reply = [0u8; REPLY_LEN];
    let (n, pool_fd) = receive_with_fd(&connection, &mut reply).map_err(|_| unanswered())?;
    if n == 0 {
        return Err(unanswered()); // closed without a word
    }
    let pool_fd = pool_fd.filter(|_| n == REPLY_LEN && reply[..4] == [0; 4]).ok_or(Refused::Invalid)?;
    let data: PointerExport = reply[4..].try_into().map_err(|_| Refused::Invalid)?;
    let ptr = import_block(driver, pool_fd, device, &data).map_err(|e| Refused::Driver(e.0))?;
    imports.insert((handle.endpoint, handle.base, handle.secret), Imported { ptr, opens: 1, _connection: connection });
    IMPORTED_ANY.store(true, Ordering::Release);
    Ok(ptr)
}

/// Whether process `pid` has exited: there is none, or it is a zombie its
/// parent has not reaped (its sockets are closed all the same).
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

/// Imports the pool (the driver gives the same pool for each import of
/// one), lets `device` reach it, and maps the block.
fn import_block(driver: &driver::Driver, pool_fd: OwnedFd, device: i32, data: &PointerExport) -> Result<u64, crate::cuda::gpu::CuError> {
    let pool: Pool = driver.import_pool(pool_fd.as_fd())?;
    driver.set_peer_access(pool, device, true)?;
    driver.import_pointer(pool, data)
}

/// `cuIpcCloseMemHandle`: an imported block's last close unmaps it here
/// (once this context's work is done, so the exporter may reuse it) and
/// ends the lease; anything else the real call answers.
pub fn close_mem_handle(ptr: u64, real: impl FnOnce() -> u32) -> u32 {
    if !IMPORTED_ANY.load(Ordering::Acquire) {
        return real();
    }
    // Held until the block is unmapped: an open of the same handle meanwhile
    // would map it again at the same address, and this unmapping undo it.
    // (IPC calls are not the allocation hot path.)
    let mut imports = lock(&IMPORTS);
    let Some(imports) = imports.as_mut() else { return real() };
    let Some((&key, open)) = imports.iter_mut().find(|(_, open)| open.ptr == ptr) else { return real() };
    open.opens -= 1;
    if open.opens > 0 {
        return SUCCESS;
    }
    let closed = imports.remove(&key);
    let Some(driver) = driver::loaded() else { return SUCCESS };
    if let Err(e) = driver.synchronize_context().and_then(|_| driver.free_now(ptr)) {
        log::warn!("CUDA IPC: unmapping the imported block at {ptr:#x} failed: {e:?}");
    }
    drop(closed); // the lease ends after the unmapping
    SUCCESS
}

/// The IPC locks, held by the forking thread across `fork`.
pub struct ForkPause {
    _server: MutexGuard<'static, Option<Server>>,
    served: MutexGuard<'static, Option<Served>>,
    imports: MutexGuard<'static, Option<HashMap<ImportKey, Imported>>>,
}

/// Before `fork`: no server starting, no server step under way and no
/// import or close in progress (one holds `IMPORTS` across its exchange),
/// so the child inherits no IPC lock held by a thread it will not have.
pub fn before_fork() -> ForkPause {
    ForkPause { _server: lock(&SERVER), served: lock(&SERVED), imports: lock(&IMPORTS) }
}

impl ForkPause {
    /// In a forked child: the parent's server is not the child's to run. Its
    /// sockets close (the child would hold the listener, which no one serves,
    /// past the exporter's death), its pool descriptors too, and so do the
    /// parent's leases as importer (a copy of a connection would keep the
    /// exporter's block held).
    pub fn in_child(mut self) {
        *self.served = None;
        *self.imports = None;
        IMPORTED_ANY.store(false, Ordering::Release);
    }
}
