//! The runtime front door: what each exported `cuda*` function does.
//!
//! Each function decides whether the call is the pool's; if not, the real
//! function answers, so return codes and the runtime's last error are the real
//! ones. The pool itself is driven through the driver, whose calls leave the
//! runtime's last error alone.

use std::ffi::{c_int, c_uint, c_void};

use crate::allocator::{self, Allocator, Freed};
use crate::driver::{self, Driver, Stream};
use crate::passthrough::Passthrough;
use crate::runtime::{self as real, SUCCESS};

const STREAM_NON_BLOCKING: c_uint = 1; // cudaStreamNonBlocking

/// `cudaMalloc`. `real` is the real function with the same arguments.
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn malloc(out: *mut *mut c_void, size: usize, real: impl FnOnce() -> u32) -> u32 {
    match pool_alloc(allocator::get(), out.is_null(), size as u64) {
        Ok(ptr) => {
            // SAFETY: `out` is non-null here (checked in pool_alloc) and writable.
            unsafe { *out = ptr as *mut c_void };
            SUCCESS
        }
        Err(reason) => {
            log::trace!("cudaMalloc({size}) passed through: {reason:?}");
            real()
        }
    }
}

fn pool_alloc(allocator: &Allocator, null_out: bool, size: u64) -> Result<u64, Passthrough> {
    if let Some(reason) = allocator.size_passthrough(size) {
        return Err(reason);
    }
    if null_out {
        return Err(Passthrough::NullOutPointer);
    }
    if allocator.capture_in_progress() {
        return Err(Passthrough::StreamCapture);
    }
    allocator.alloc(driver_with_context()?, size)
}

/// The driver, with the runtime's context current on this thread. The
/// runtime makes its context current lazily, at its first call on a thread;
/// `cudaFree(NULL)` is the documented way to make it do so now.
fn driver_with_context() -> Result<&'static Driver, Passthrough> {
    if let Some(driver) = driver::loaded() {
        if let Ok(Some(_)) = driver.current_context() {
            return Ok(driver);
        }
    }
    // SAFETY: cudaFree(NULL) frees nothing; it initialises the runtime.
    if unsafe { real::cudaFree(std::ptr::null_mut()) } != SUCCESS {
        return Err(Passthrough::NoContext);
    }
    let driver = driver::loaded().ok_or(Passthrough::NoContext)?;
    match driver.current_context() {
        Ok(Some(_)) => Ok(driver),
        _ => Err(Passthrough::NoContext),
    }
}

/// `cudaFree`.
pub fn free(ptr: *mut c_void, real: impl FnOnce() -> u32) -> u32 {
    let allocator = allocator::get();
    let driver = match driver::loaded() {
        Some(driver) if !ptr.is_null() && !allocator.config.disable => driver,
        _ => return real(),
    };
    if allocator.capture_in_progress() && allocator.owns(ptr as u64) {
        // During a capture the real cudaFree either fails (and invalidates the
        // capture) or succeeds, whatever the pointer: ask it with NULL.
        // SAFETY: cudaFree(NULL) frees nothing.
        let rc = unsafe { real::cudaFree(std::ptr::null_mut()) };
        if rc != SUCCESS {
            return rc;
        }
    }
    match allocator.free(driver, ptr as u64) {
        Freed::Issued { device } => {
            if allocator.config.free_sync {
                allocator.synchronize_device(driver, device);
            }
            SUCCESS
        }
        Freed::Deferred => SUCCESS,
        Freed::NotOurs if allocator.is_deferred(ptr as u64) => real::reproduce_invalid_value(),
        Freed::NotOurs => real(),
    }
}

/// `cudaFreeAsync`: the program frees a pointer itself, in the order of its
/// stream. The real function does it; the map forgets the pointer.
pub fn free_async(ptr: *mut c_void, real: impl FnOnce() -> u32) -> u32 {
    let allocator = allocator::get();
    if !allocator.config.disable {
        if allocator.is_deferred(ptr as u64) {
            return real::reproduce_invalid_value();
        }
        allocator.forget(ptr as u64);
    }
    real()
}

/// `cudaStreamCreateWithFlags`/`WithPriority`: non-blocking streams are
/// tracked, since the legacy stream does not order them.
/// SAFETY: when `real` succeeds, `out` holds the new stream.
pub unsafe fn stream_create(out: *mut *mut c_void, flags: c_uint, real: impl FnOnce() -> u32) -> u32 {
    let rc = real();
    let allocator = allocator::get();
    if rc == SUCCESS && flags & STREAM_NON_BLOCKING != 0 && !allocator.config.disable {
        if let Some(driver) = driver::loaded() {
            // SAFETY: success means the runtime wrote the new stream to `out`.
            allocator.stream_created(driver, Stream(unsafe { *out }.cast()));
        }
    }
    rc
}

/// `cudaStreamDestroy`: the stream's last work stays ordered before later frees.
pub fn stream_destroy(stream: *mut c_void, real: impl FnOnce() -> u32) -> u32 {
    let allocator = allocator::get();
    if let Some(driver) = driver::loaded().filter(|_| !allocator.config.disable) {
        allocator.stream_destroying(driver, Stream(stream.cast()));
    }
    real()
}

/// The stream a `_ptsz` entry point means: NULL there is the per-thread default stream.
pub fn per_thread(stream: *mut c_void) -> *mut c_void {
    const PER_THREAD: usize = 2; // cudaStreamPerThread
    if stream.is_null() { PER_THREAD as *mut c_void } else { stream }
}

/// `cudaStreamBeginCapture` (and `ToGraph`): while any capture runs, frees are queued.
pub fn begin_capture(stream: *mut c_void, real: impl FnOnce() -> u32) -> u32 {
    let mut rc = SUCCESS;
    allocator::get().begin_capture(Stream(stream.cast()), || {
        rc = real();
        rc == SUCCESS
    });
    rc
}

/// `cudaStreamEndCapture`: frees queued during captures are issued once none is left.
pub fn end_capture(stream: *mut c_void, real: impl FnOnce() -> u32) -> u32 {
    allocator::get().end_capture(driver::loaded(), Stream(stream.cast()), real)
}

/// `cudaDeviceReset`: the reset destroys the device's memory and streams, so
/// the shim forgets its pool and pointers first and makes new ones on next use.
pub fn device_reset(real: impl FnOnce() -> u32) -> u32 {
    let allocator = allocator::get();
    if let (Some(driver), Some(device)) = (driver::loaded(), current_device()) {
        allocator.device_resetting(driver, device);
    }
    real()
}

/// `cudaDeviceEnablePeerAccess`/`Disable`: once the current device may reach
/// `peer`'s memory, `peer`'s pool grants it every block, past and future
/// (and takes that back on disable).
pub fn peer_access(peer: c_int, allowed: bool, real: impl FnOnce() -> u32) -> u32 {
    let rc = real();
    let allocator = allocator::get();
    if rc == SUCCESS && !allocator.config.disable {
        if let (Some(driver), Some(accessor)) = (driver::loaded(), current_device()) {
            allocator.peer_access_changed(driver, peer, accessor, allowed);
        }
    }
    rc
}

/// The runtime's current device (no error left behind: it cannot fail once
/// the runtime has made a call succeed, as the callers' real calls did).
fn current_device() -> Option<i32> {
    let mut device: c_int = -1;
    // SAFETY: one out-pointer to a local.
    (unsafe { real::cudaGetDevice(&mut device) } == SUCCESS).then_some(device)
}
