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

use crate::cuda::driver;
use crate::cuda::gpu::{Context, Gpu};
use crate::cuda::real::{self, SUCCESS};

/// `CUDA_ERROR_INVALID_VALUE`: what a bad `cuMemFree` returns.
pub const INVALID_VALUE: u32 = 1;

/// `CUDA_ERROR_OUT_OF_MEMORY`: what a failed `cuMemAlloc` returns.
pub const OUT_OF_MEMORY: u32 = 2;

/// Whether `cuMemAllocPitch` accepts this element size (4, 8 or 16 bytes).
pub fn pitch_element_size_is_valid(element_bytes: u32) -> bool {
    matches!(element_bytes, 4 | 8 | 16)
}

/// A driver entry point the shim serves: its exported name and the shim's function.
pub struct EntryPoint(pub &'static CStr, pub *const ());

// SAFETY: the name is a static string and the function is code: both are
// immutable and valid from any thread.
unsafe impl Sync for EntryPoint {}

/// (real address, shim's function) for each served entry point the driver has.
fn substitutes(served: &[&[EntryPoint]]) -> Option<&'static [(usize, usize)]> {
    static TABLE: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    if let Some(table) = TABLE.get() {
        return Some(table);
    }
    let libcuda = real::libcuda()?;
    let table = served
        .iter()
        .flat_map(|entry_points| entry_points.iter())
        .filter_map(|EntryPoint(name, hook)| {
            let real = real::real_dlsym(libcuda, name);
            (!real.is_null()).then_some((real as usize, *hook as usize))
        })
        .collect();
    Some(TABLE.get_or_init(|| table))
}

/// The shim's function where `real` is a driver function the shim wraps.
pub fn substitute(real: *mut c_void, served: &[&[EntryPoint]]) -> Option<*mut c_void> {
    if real.is_null() {
        return None;
    }
    let table = substitutes(served)?;
    table.iter().find(|(r, _)| *r == real as usize).map(|&(_, hook)| hook as *mut c_void)
}

/// Whether `name` is the name of an entry point the shim serves.
fn serves(served: &[&[EntryPoint]], name: &CStr) -> bool {
    served.iter().flat_map(|points| points.iter()).any(|EntryPoint(served, _)| *served == name)
}

/// `cuGetProcAddress` (both versions): the real answer, with the shim's
/// function in place of one it wraps (unless `SOMA_DISABLE=1`); `passes_unseen` is given the name
/// when the answer is a variant of a wrapped name that the shim does not wrap.
/// SAFETY: `function` is writable when `real` succeeds, as its contract says.
pub unsafe fn get_proc_address(
    symbol: *const c_char,
    function: *mut *mut c_void,
    served: &[&[EntryPoint]],
    real: impl FnOnce() -> u32,
    passes_unseen: impl FnOnce(&CStr),
) -> u32 {
    let rc = real();
    if rc == SUCCESS && !function.is_null() {
        // SAFETY: success means the driver wrote an entry point to `function`.
        let found = unsafe { *function };
        // SAFETY: `symbol` is the caller's NUL-terminated name.
        let name = unsafe { CStr::from_ptr(symbol) };
        match substitute(found, served) {
            Some(hook) if !super::process::disabled() => {
                log::debug!("cuGetProcAddress({name:?}): serving the shim's function");
                // SAFETY: as above, `function` is writable.
                unsafe { *function = hook };
            }
            // A function the shim wraps, answered with one it does not know
            // (a variant it does not export): calls through it bypass the
            // shim, which the tests must hear of.
            None if !found.is_null() && serves(served, name) && !super::process::disabled() => {
                log::warn!("cuGetProcAddress({name:?}): a variant the shim does not wrap; its calls bypass the shim");
                passes_unseen(name);
            }
            _ => {}
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

/// As `free_would_fail`, for `cuMemFreeHost`: `cuMemFreeHost(NULL)`.
pub fn free_host_would_fail() -> Option<u32> {
    // SAFETY: a free of the null address frees nothing.
    let rc = unsafe { real::driver::cuMemFreeHost(std::ptr::null_mut()) };
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

/// The flags `cuMemAllocHost` allocates with (measured: it reports mapped only).
pub const ALLOC_HOST_FLAGS: u32 = 0;
