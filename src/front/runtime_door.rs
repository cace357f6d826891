//! What the runtime's exports need beyond the shared hooks.

use std::ffi::{c_int, c_void};

use crate::cuda::real::{runtime as cuda, SUCCESS};

/// The runtime makes its context current lazily, at its first call on a
/// thread; `cudaFree(NULL)` is the documented way to make it do so now.
pub fn make_context_current() -> bool {
    // SAFETY: cudaFree(NULL) frees nothing; it initialises the runtime.
    unsafe { cuda::cudaFree(std::ptr::null_mut()) == SUCCESS }
}

/// Whether the real `cudaFree` would fail now (during a capture), and with
/// what: `cudaFree(NULL)` fails exactly when any free would, with the same
/// error, and leaves the same last error and capture state behind.
pub fn free_would_fail() -> Option<u32> {
    // SAFETY: cudaFree(NULL) frees nothing.
    let rc = unsafe { cuda::cudaFree(std::ptr::null_mut::<c_void>()) };
    (rc != SUCCESS).then_some(rc)
}

/// As `free_would_fail`, for `cudaFreeHost`: `cudaFreeHost(NULL)`.
pub fn free_host_would_fail() -> Option<u32> {
    // SAFETY: cudaFreeHost(NULL) frees nothing.
    let rc = unsafe { cuda::cudaFreeHost(std::ptr::null_mut::<c_void>()) };
    (rc != SUCCESS).then_some(rc)
}

/// The error of a bad free, left as the runtime's last error too.
pub fn invalid_value() -> u32 {
    cuda::reproduce_invalid_value()
}

/// The error of a failed allocation, left as the runtime's last error too.
pub fn out_of_memory() -> u32 {
    cuda::reproduce_out_of_memory()
}

/// The runtime's current device.
pub fn current_device() -> Option<i32> {
    let mut device: c_int = -1;
    // SAFETY: one out-pointer to a local.
    (unsafe { cuda::cudaGetDevice(&mut device) } == SUCCESS).then_some(device)
}

