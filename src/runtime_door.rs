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

/// `cudaMalloc`.
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn malloc(out: *mut *mut c_void, size: usize) -> u32 {
    match pool_alloc(allocator::get(), out.is_null(), size as u64) {
        Ok(ptr) => {
            // SAFETY: `out` is non-null here (checked in pool_alloc) and writable.
            unsafe { *out = ptr as *mut c_void };
            SUCCESS
        }
        Err(reason) => {
            log::trace!("cudaMalloc({size}) passed through: {reason:?}");
            // SAFETY: the caller's arguments, unchanged.
            unsafe { real::cudaMalloc(out, size) }
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
/// SAFETY: plain C contract (any pointer value is allowed).
pub unsafe fn free(ptr: *mut c_void) -> u32 {
    let allocator = allocator::get();
    let driver = match driver::loaded() {
        Some(driver) if !ptr.is_null() && !allocator.config.disable => driver,
        // SAFETY: the caller's argument, unchanged.
        _ => return unsafe { real::cudaFree(ptr) },
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
        // SAFETY: the caller's argument, unchanged.
        Freed::NotOurs => unsafe { real::cudaFree(ptr) },
    }
}

/// `cudaFreeAsync`: the program frees a pointer itself, in the order of its
/// stream. The real function does it; the map forgets the pointer.
/// SAFETY: plain C contract.
pub unsafe fn free_async(ptr: *mut c_void, stream: *mut c_void) -> u32 {
    let allocator = allocator::get();
    if !allocator.config.disable {
        if allocator.is_deferred(ptr as u64) {
            return real::reproduce_invalid_value();
        }
        allocator.forget(ptr as u64);
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::cudaFreeAsync(ptr, stream) }
}

/// `cudaStreamCreateWithFlags`: non-blocking streams are tracked, since the
/// legacy stream does not order them.
/// SAFETY: plain C contract.
pub unsafe fn stream_create_with_flags(out: *mut *mut c_void, flags: c_uint) -> u32 {
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real::cudaStreamCreateWithFlags(out, flags) };
    // SAFETY: on success the runtime wrote the new stream to `out`.
    unsafe { track_new_stream(rc, out, flags) };
    rc
}

/// `cudaStreamCreateWithPriority`: as `cudaStreamCreateWithFlags`.
/// SAFETY: plain C contract.
pub unsafe fn stream_create_with_priority(out: *mut *mut c_void, flags: c_uint, priority: c_int) -> u32 {
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real::cudaStreamCreateWithPriority(out, flags, priority) };
    // SAFETY: on success the runtime wrote the new stream to `out`.
    unsafe { track_new_stream(rc, out, flags) };
    rc
}

/// SAFETY: `out` holds a new stream when `rc` is success.
unsafe fn track_new_stream(rc: u32, out: *mut *mut c_void, flags: c_uint) {
    let allocator = allocator::get();
    if rc != SUCCESS || flags & STREAM_NON_BLOCKING == 0 || allocator.config.disable {
        return;
    }
    if let Some(driver) = driver::loaded() {
        // SAFETY: success means `out` is valid and written.
        allocator.stream_created(driver, Stream(unsafe { *out }.cast()));
    }
}

/// `cudaStreamDestroy`: the stream's last work stays ordered before later frees.
/// SAFETY: plain C contract.
pub unsafe fn stream_destroy(stream: *mut c_void) -> u32 {
    let allocator = allocator::get();
    if let Some(driver) = driver::loaded().filter(|_| !allocator.config.disable) {
        allocator.stream_destroying(driver, Stream(stream.cast()));
    }
    // SAFETY: the caller's argument, unchanged.
    unsafe { real::cudaStreamDestroy(stream) }
}

/// `cudaStreamBeginCapture`: while any capture runs, frees are queued.
/// SAFETY: plain C contract.
pub unsafe fn begin_capture(stream: *mut c_void, mode: c_int) -> u32 {
    let mut rc = SUCCESS;
    allocator::get().begin_capture(Stream(stream.cast()), || {
        // SAFETY: the caller's arguments, unchanged.
        rc = unsafe { real::cudaStreamBeginCapture(stream, mode) };
        rc == SUCCESS
    });
    rc
}

/// `cudaStreamBeginCaptureToGraph`: as `cudaStreamBeginCapture`.
/// SAFETY: plain C contract.
pub unsafe fn begin_capture_to_graph(
    stream: *mut c_void,
    graph: *mut c_void,
    dependencies: *const c_void,
    dependency_data: *const c_void,
    count: usize,
    mode: c_int,
) -> u32 {
    let mut rc = SUCCESS;
    allocator::get().begin_capture(Stream(stream.cast()), || {
        // SAFETY: the caller's arguments, unchanged.
        rc = unsafe {
            real::cudaStreamBeginCaptureToGraph(stream, graph, dependencies, dependency_data, count, mode)
        };
        rc == SUCCESS
    });
    rc
}

/// `cudaStreamEndCapture`: frees queued during captures are issued once none is left.
/// SAFETY: plain C contract.
pub unsafe fn end_capture(stream: *mut c_void, graph: *mut *mut c_void) -> u32 {
    // SAFETY: the caller's arguments, unchanged.
    let end = || unsafe { real::cudaStreamEndCapture(stream, graph) };
    allocator::get().end_capture(driver::loaded(), Stream(stream.cast()), end)
}

/// `cudaDeviceReset`: the reset destroys the device's memory and streams, so
/// the shim forgets its pool and pointers first and makes new ones on next use.
/// SAFETY: plain C contract.
pub unsafe fn device_reset() -> u32 {
    let allocator = allocator::get();
    if let (Some(driver), Some(device)) = (driver::loaded(), current_device()) {
        allocator.device_resetting(driver, device);
    }
    // SAFETY: no arguments.
    unsafe { real::cudaDeviceReset() }
}

/// `cudaDeviceEnablePeerAccess`: the current device may now reach `peer`'s
/// memory, so `peer`'s pool grants it access to every block, past and future.
/// SAFETY: plain C contract.
pub unsafe fn enable_peer_access(peer: c_int, flags: c_uint) -> u32 {
    // SAFETY: the caller's arguments, unchanged.
    let rc = unsafe { real::cudaDeviceEnablePeerAccess(peer, flags) };
    peer_access_changed(rc, peer, true);
    rc
}

/// `cudaDeviceDisablePeerAccess`: the grant is taken back.
/// SAFETY: plain C contract.
pub unsafe fn disable_peer_access(peer: c_int) -> u32 {
    // SAFETY: the caller's argument, unchanged.
    let rc = unsafe { real::cudaDeviceDisablePeerAccess(peer) };
    peer_access_changed(rc, peer, false);
    rc
}

fn peer_access_changed(rc: u32, peer: c_int, allowed: bool) {
    let allocator = allocator::get();
    if rc != SUCCESS || allocator.config.disable {
        return;
    }
    if let (Some(driver), Some(accessor)) = (driver::loaded(), current_device()) {
        allocator.peer_access_changed(driver, peer, accessor, allowed);
    }
}

/// The runtime's current device (no error left behind: it cannot fail once
/// the runtime has made a call succeed, as the callers' real calls did).
fn current_device() -> Option<i32> {
    let mut device: c_int = -1;
    // SAFETY: one out-pointer to a local.
    (unsafe { real::cudaGetDevice(&mut device) } == SUCCESS).then_some(device)
}
