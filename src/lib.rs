//! somashim: `LD_PRELOAD=libsomashim.so ./legacy_app` serves the program's
//! `cudaMalloc`/`cudaFree` from a stream-ordered memory pool, with the
//! observable behaviour of the real functions. See README.md and DESIGN.md.
//!
//! This file is the manifest: the modules, and the exported symbols, each a
//! thin wrapper that names the real function once and runs the hook (or,
//! re-entered or on a panic, the real function) through `exports::guarded`.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // each export has the C function's contract

mod allocator;
mod config;
mod device;
mod driver;
mod exports;
mod passthrough;
mod ptrmap;
mod runtime;
mod runtime_door;

pub use config::{Config, VARIABLES};

use std::ffi::{c_int, c_uint, c_void};

use exports::guarded;
use runtime as real;
use runtime_door as door;

type Handle = *mut c_void;

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(ptr: *mut Handle, size: usize) -> u32 {
    let real = || unsafe { real::cudaMalloc(ptr, size) };
    guarded(|| unsafe { door::malloc(ptr, size, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: Handle) -> u32 {
    let real = || unsafe { real::cudaFree(ptr) };
    guarded(|| door::free(ptr, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(ptr: Handle, stream: Handle) -> u32 {
    let real = || unsafe { real::cudaFreeAsync(ptr, stream) };
    guarded(|| door::free_async(ptr, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(ptr: Handle, stream: Handle) -> u32 {
    let real = || unsafe { real::cudaFreeAsync_ptsz(ptr, stream) };
    guarded(|| door::free_async(ptr, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(stream: *mut Handle, flags: c_uint) -> u32 {
    let real = || unsafe { real::cudaStreamCreateWithFlags(stream, flags) };
    guarded(|| unsafe { door::stream_create(stream, flags, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(stream: *mut Handle, flags: c_uint, priority: c_int) -> u32 {
    let real = || unsafe { real::cudaStreamCreateWithPriority(stream, flags, priority) };
    guarded(|| unsafe { door::stream_create(stream, flags, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamDestroy(stream: Handle) -> u32 {
    let real = || unsafe { real::cudaStreamDestroy(stream) };
    guarded(|| door::stream_destroy(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture(stream: Handle, mode: c_int) -> u32 {
    let real = || unsafe { real::cudaStreamBeginCapture(stream, mode) };
    guarded(|| door::begin_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture_ptsz(stream: Handle, mode: c_int) -> u32 {
    let real = || unsafe { real::cudaStreamBeginCapture_ptsz(stream, mode) };
    guarded(|| door::begin_capture(door::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCaptureToGraph(
    stream: Handle,
    graph: Handle,
    dependencies: *const c_void,
    dependency_data: *const c_void,
    count: usize,
    mode: c_int,
) -> u32 {
    let real =
        || unsafe { real::cudaStreamBeginCaptureToGraph(stream, graph, dependencies, dependency_data, count, mode) };
    guarded(|| door::begin_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCaptureToGraph_ptsz(
    stream: Handle,
    graph: Handle,
    dependencies: *const c_void,
    dependency_data: *const c_void,
    count: usize,
    mode: c_int,
) -> u32 {
    let real = || unsafe {
        real::cudaStreamBeginCaptureToGraph_ptsz(stream, graph, dependencies, dependency_data, count, mode)
    };
    guarded(|| door::begin_capture(door::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(stream: Handle, graph: *mut Handle) -> u32 {
    let real = || unsafe { real::cudaStreamEndCapture(stream, graph) };
    guarded(|| door::end_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture_ptsz(stream: Handle, graph: *mut Handle) -> u32 {
    let real = || unsafe { real::cudaStreamEndCapture_ptsz(stream, graph) };
    guarded(|| door::end_capture(door::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> u32 {
    let real = || unsafe { real::cudaDeviceReset() };
    guarded(|| door::device_reset(real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> u32 {
    let real = || unsafe { real::cudaDeviceEnablePeerAccess(peer, flags) };
    guarded(|| door::peer_access(peer, true, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceDisablePeerAccess(peer: c_int) -> u32 {
    let real = || unsafe { real::cudaDeviceDisablePeerAccess(peer) };
    guarded(|| door::peer_access(peer, false, real), real)
}
