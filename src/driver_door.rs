//! What the driver's exports need beyond the shared hooks: handing the
//! shim's functions to whoever asks the driver for its entry points.
//!
//! A statically linked runtime (nvcc's default) gets every driver function
//! through `cuGetProcAddress`, itself found with `dlsym`. Wherever the real
//! answer is a function the shim wraps, the shim's function is handed back
//! instead. The match is on the address the real driver returned, so the
//! right variant for each requested version and per-thread flag is chosen
//! by the driver itself, and the shim serves exactly the variants it exports.

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use crate::driver::{self, Context};
use crate::real::{self, SUCCESS};

/// `CUDA_ERROR_INVALID_VALUE`: what a bad `cuMemFree` returns.
pub const INVALID_VALUE: u32 = 1;

/// Driver entry points the shim wraps, by exported name, with the shim's function.
fn wrapped() -> [(&'static CStr, usize); 20] {
    [
        (c"cuMemAlloc_v2", crate::cuMemAlloc_v2 as *const () as usize),
        (c"cuMemFree_v2", crate::cuMemFree_v2 as *const () as usize),
        (c"cuMemFreeAsync", crate::cuMemFreeAsync as *const () as usize),
        (c"cuMemFreeAsync_ptsz", crate::cuMemFreeAsync_ptsz as *const () as usize),
        (c"cuStreamCreate", crate::cuStreamCreate as *const () as usize),
        (c"cuStreamCreateWithPriority", crate::cuStreamCreateWithPriority as *const () as usize),
        (c"cuStreamDestroy_v2", crate::cuStreamDestroy_v2 as *const () as usize),
        (c"cuStreamBeginCapture_v2", crate::cuStreamBeginCapture_v2 as *const () as usize),
        (c"cuStreamBeginCapture_v2_ptsz", crate::cuStreamBeginCapture_v2_ptsz as *const () as usize),
        (c"cuStreamBeginCaptureToGraph", crate::cuStreamBeginCaptureToGraph as *const () as usize),
        (c"cuStreamBeginCaptureToGraph_ptsz", crate::cuStreamBeginCaptureToGraph_ptsz as *const () as usize),
        (c"cuStreamEndCapture", crate::cuStreamEndCapture as *const () as usize),
        (c"cuStreamEndCapture_ptsz", crate::cuStreamEndCapture_ptsz as *const () as usize),
        (c"cuCtxEnablePeerAccess", crate::cuCtxEnablePeerAccess as *const () as usize),
        (c"cuCtxDisablePeerAccess", crate::cuCtxDisablePeerAccess as *const () as usize),
        (c"cuDevicePrimaryCtxReset_v2", crate::cuDevicePrimaryCtxReset_v2 as *const () as usize),
        (c"cuMemGetInfo_v2", crate::cuMemGetInfo_v2 as *const () as usize),
        (c"cuIpcGetMemHandle", crate::cuIpcGetMemHandle as *const () as usize),
        (c"cuGetProcAddress", crate::cuGetProcAddress as *const () as usize),
        (c"cuGetProcAddress_v2", crate::cuGetProcAddress_v2 as *const () as usize),
    ]
}

/// (real address, shim's function) for each wrapped entry point the driver has.
fn substitutes() -> Option<&'static [(usize, usize)]> {
    static TABLE: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    if let Some(table) = TABLE.get() {
        return Some(table);
    }
    let libcuda = real::libcuda()?;
    let table = wrapped()
        .into_iter()
        .filter_map(|(name, hook)| {
            let real = crate::dlsym_hook::real_dlsym(libcuda, name);
            (!real.is_null()).then_some((real as usize, hook))
        })
        .collect();
    Some(TABLE.get_or_init(|| table))
}

/// The shim's function where `real` is a driver function the shim wraps.
pub fn substitute(real: *mut c_void) -> Option<*mut c_void> {
    if real.is_null() {
        return None;
    }
    let table = substitutes()?;
    table.iter().find(|(r, _)| *r == real as usize).map(|&(_, hook)| hook as *mut c_void)
}

/// `cuGetProcAddress` (both versions): the real answer, with the shim's
/// function in place of one it wraps.
/// SAFETY: `function` is writable when `real` succeeds, as its contract says.
pub unsafe fn get_proc_address(symbol: *const c_char, function: *mut *mut c_void, real: impl FnOnce() -> u32) -> u32 {
    let rc = real();
    if rc == SUCCESS && !function.is_null() {
        // SAFETY: success means the driver wrote an entry point to `function`.
        let found = unsafe { *function };
        if let Some(hook) = substitute(found) {
            // SAFETY: `symbol` is the caller's NUL-terminated name.
            log::debug!("cuGetProcAddress({:?}): serving the shim's function", unsafe { CStr::from_ptr(symbol) });
            // SAFETY: as above, `function` is writable.
            unsafe { *function = hook };
        }
    }
    rc
}

/// Whether the real `cuMemFree` would fail now (during a capture), and with
/// what: `cuMemFree(0)` fails exactly when a free is prohibited (measured:
/// 900, invalidating the capture as the real free does) and otherwise frees
/// nothing and succeeds.
pub fn free_would_fail() -> Option<u32> {
    // SAFETY: a free of the null address frees nothing.
    let rc = unsafe { real::driver::cuMemFree_v2(0) };
    (rc != SUCCESS).then_some(rc)
}

/// (owner, accessor) for `cuCtxEnablePeerAccess(peer)`: the current context
/// may now reach the memory of `peer`'s device.
pub fn peer_devices(peer: *mut c_void) -> Option<(i32, i32)> {
    let driver = driver::loaded()?;
    let accessor = driver.current_device().ok()?;
    let owner = driver.with_context(Context(peer), || driver.current_device()).ok()?.ok()?;
    Some((owner, accessor))
}
