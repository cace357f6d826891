//! somashim: `LD_PRELOAD=libsomashim.so ./legacy_app` serves the program's
//! `cudaMalloc`/`cudaFree` from a stream-ordered memory pool, with the
//! observable behaviour of the real functions. See README.md and DESIGN.md.
//!
//! This file is the manifest: the modules, and the exported symbols, each a
//! one-line wrapper that runs the hook (or, re-entered or on a panic, the real
//! function) through `exports::guarded`.
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
    guarded(|| unsafe { door::malloc(ptr, size) }, || unsafe { real::cudaMalloc(ptr, size) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: Handle) -> u32 {
    guarded(|| unsafe { door::free(ptr) }, || unsafe { real::cudaFree(ptr) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(ptr: Handle, stream: Handle) -> u32 {
    guarded(|| unsafe { door::free_async(ptr, stream) }, || unsafe { real::cudaFreeAsync(ptr, stream) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(stream: *mut Handle, flags: c_uint) -> u32 {
    guarded(
        || unsafe { door::stream_create_with_flags(stream, flags) },
        || unsafe { real::cudaStreamCreateWithFlags(stream, flags) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(stream: *mut Handle, flags: c_uint, priority: c_int) -> u32 {
    guarded(
        || unsafe { door::stream_create_with_priority(stream, flags, priority) },
        || unsafe { real::cudaStreamCreateWithPriority(stream, flags, priority) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamDestroy(stream: Handle) -> u32 {
    guarded(|| unsafe { door::stream_destroy(stream) }, || unsafe { real::cudaStreamDestroy(stream) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture(stream: Handle, mode: c_int) -> u32 {
    guarded(|| unsafe { door::begin_capture(stream, mode) }, || unsafe { real::cudaStreamBeginCapture(stream, mode) })
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
    guarded(
        || unsafe { door::begin_capture_to_graph(stream, graph, dependencies, dependency_data, count, mode) },
        || unsafe { real::cudaStreamBeginCaptureToGraph(stream, graph, dependencies, dependency_data, count, mode) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(stream: Handle, graph: *mut Handle) -> u32 {
    guarded(|| unsafe { door::end_capture(stream, graph) }, || unsafe { real::cudaStreamEndCapture(stream, graph) })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> u32 {
    guarded(|| unsafe { door::device_reset() }, || unsafe { real::cudaDeviceReset() })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> u32 {
    guarded(
        || unsafe { door::enable_peer_access(peer, flags) },
        || unsafe { real::cudaDeviceEnablePeerAccess(peer, flags) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceDisablePeerAccess(peer: c_int) -> u32 {
    guarded(|| unsafe { door::disable_peer_access(peer) }, || unsafe { real::cudaDeviceDisablePeerAccess(peer) })
}
