//! The exporter's handles of CUDA IPC on pool memory (`cuIpcGetMemHandle`,
//! `cudaIpcGetMemHandle`; import.rs has the whole exchange): for a pool
//! block the handle is the shim's (`core::shared_blocks::IpcHandle`), never
//! the pool's file descriptor. The first export starts this process's
//! server (server.rs), which the importers ask for leases.

use crate::core::allocator::state::Allocator;
use crate::core::shared_blocks::IpcHandle;
use crate::cuda::driver;
use crate::cuda::real::{IpcMemHandle, SUCCESS};

use super::server::{random_secret, server_endpoint};

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
    // The real allocator's block, or a pool other processes cannot import:
    // the real call answers.
    if allocator.export_segment(driver, block.device, base) {
        return None;
    }
    allocator.shareable_pool(block.device, block.size)?;
    let endpoint = server_endpoint(allocator)?;
    let (secret, _) = allocator.export(driver, base, random_secret)?;
    Some(IpcHandle { pid: std::process::id(), endpoint, base, secret })
}

