//! somashim: `LD_PRELOAD=libsomashim.so ./legacy_app` serves the program's
//! `cudaMalloc`/`cudaFree` (and the driver's `cuMemAlloc`/`cuMemFree`) from a
//! stream-ordered memory pool, with the observable behaviour of the real
//! functions. See README.md and ../shared/DESIGN.md.
//!
//! This file is the manifest: the modules, and the exported symbols. Each
//! export names the real function once (`real`) and runs the hook through
//! `exports::guarded`, which runs `real` instead when re-entered or on a panic.
//! The exported `dlsym` is in `dlsym_hook`.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // each export has the C function's contract

mod allocator;
mod caller;
mod config;
mod device;
mod dlsym_hook;
mod driver;
mod driver_door;
mod exports;
mod hooks;
mod passthrough;
mod ptrmap;
mod real;
mod runtime_door;
mod stats;
mod trace;

pub use config::{Config, VARIABLES};

use std::ffi::{c_char, c_int, c_uint, c_void};

use driver_door::INVALID_VALUE;
use exports::guarded;
use real::{driver as cu, runtime as cuda};

type Handle = *mut c_void;

// ---- the runtime front door --------------------------------------------------

/// `cudaMalloc` and `cuMemAlloc_v2` pass their caller's return address to
/// the hook as a third argument: a two-instruction trampoline with no frame
/// of its own (x86-64 System V: the third argument goes in rdx).
macro_rules! with_caller {
    ($export:ident($($arg:ident: $ty:ty),*) => $hook:ident) => {
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $export($($arg: $ty),*) -> u32 {
            std::arch::naked_asm!("mov rdx, qword ptr [rsp]", "jmp {hook}", hook = sym $hook)
        }
    };
}

with_caller!(cudaMalloc(ptr: *mut Handle, size: usize) => cuda_malloc_from);

unsafe extern "C" fn cuda_malloc_from(ptr: *mut Handle, size: usize, caller: usize) -> u32 {
    let real = || unsafe { cuda::cudaMalloc(ptr, size) };
    guarded(|| unsafe { hooks::malloc(ptr.cast(), size, caller, runtime_door::make_context_current, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: Handle) -> u32 {
    let real = || unsafe { cuda::cudaFree(ptr) };
    guarded(|| hooks::free(ptr as u64, runtime_door::free_would_fail, runtime_door::invalid_value, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(ptr: Handle, stream: Handle) -> u32 {
    let real = || unsafe { cuda::cudaFreeAsync(ptr, stream) };
    guarded(|| hooks::free_async(ptr as u64, runtime_door::invalid_value, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(ptr: Handle, stream: Handle) -> u32 {
    let real = || unsafe { cuda::cudaFreeAsync_ptsz(ptr, stream) };
    guarded(|| hooks::free_async(ptr as u64, runtime_door::invalid_value, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(stream: *mut Handle, flags: c_uint) -> u32 {
    let real = || unsafe { cuda::cudaStreamCreateWithFlags(stream, flags) };
    guarded(|| unsafe { hooks::stream_create(stream, flags, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(stream: *mut Handle, flags: c_uint, priority: c_int) -> u32 {
    let real = || unsafe { cuda::cudaStreamCreateWithPriority(stream, flags, priority) };
    guarded(|| unsafe { hooks::stream_create(stream, flags, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamDestroy(stream: Handle) -> u32 {
    let real = || unsafe { cuda::cudaStreamDestroy(stream) };
    guarded(|| hooks::stream_destroy(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture(stream: Handle, mode: c_int) -> u32 {
    let real = || unsafe { cuda::cudaStreamBeginCapture(stream, mode) };
    guarded(|| hooks::begin_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture_ptsz(stream: Handle, mode: c_int) -> u32 {
    let real = || unsafe { cuda::cudaStreamBeginCapture_ptsz(stream, mode) };
    guarded(|| hooks::begin_capture(hooks::per_thread(stream), real), real)
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
        || unsafe { cuda::cudaStreamBeginCaptureToGraph(stream, graph, dependencies, dependency_data, count, mode) };
    guarded(|| hooks::begin_capture(stream, real), real)
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
        cuda::cudaStreamBeginCaptureToGraph_ptsz(stream, graph, dependencies, dependency_data, count, mode)
    };
    guarded(|| hooks::begin_capture(hooks::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(stream: Handle, graph: *mut Handle) -> u32 {
    let real = || unsafe { cuda::cudaStreamEndCapture(stream, graph) };
    guarded(|| hooks::end_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture_ptsz(stream: Handle, graph: *mut Handle) -> u32 {
    let real = || unsafe { cuda::cudaStreamEndCapture_ptsz(stream, graph) };
    guarded(|| hooks::end_capture(hooks::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> u32 {
    let real = || unsafe { cuda::cudaDeviceReset() };
    guarded(|| hooks::device_reset(runtime_door::current_device(), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> u32 {
    let real = || unsafe { cuda::cudaDeviceEnablePeerAccess(peer, flags) };
    guarded(|| hooks::peer_access(true, || Some((peer, runtime_door::current_device()?)), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceDisablePeerAccess(peer: c_int) -> u32 {
    let real = || unsafe { cuda::cudaDeviceDisablePeerAccess(peer) };
    guarded(|| hooks::peer_access(false, || Some((peer, runtime_door::current_device()?)), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(handle: Handle, ptr: Handle) -> u32 {
    let real = || unsafe { cuda::cudaIpcGetMemHandle(handle, ptr) };
    guarded(|| hooks::ipc_get_mem_handle(ptr as u64, "cudaIpcGetMemHandle", real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> u32 {
    let real = || unsafe { cuda::cudaMemGetInfo(free, total) };
    guarded(|| unsafe { hooks::mem_get_info(free, real) }, real)
}

// ---- the driver front door ---------------------------------------------------

with_caller!(cuMemAlloc_v2(ptr: *mut u64, size: usize) => cu_mem_alloc_from);

unsafe extern "C" fn cu_mem_alloc_from(ptr: *mut u64, size: usize, caller: usize) -> u32 {
    let real = || unsafe { cu::cuMemAlloc_v2(ptr, size) };
    guarded(|| unsafe { hooks::malloc(ptr, size, caller, || false, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: u64) -> u32 {
    let real = || unsafe { cu::cuMemFree_v2(ptr) };
    guarded(|| hooks::free(ptr, driver_door::free_would_fail, || INVALID_VALUE, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: u64, stream: Handle) -> u32 {
    let real = || unsafe { cu::cuMemFreeAsync(ptr, stream) };
    guarded(|| hooks::free_async(ptr, || INVALID_VALUE, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: u64, stream: Handle) -> u32 {
    let real = || unsafe { cu::cuMemFreeAsync_ptsz(ptr, stream) };
    guarded(|| hooks::free_async(ptr, || INVALID_VALUE, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, flags: c_uint) -> u32 {
    let real = || unsafe { cu::cuStreamCreate(stream, flags) };
    guarded(|| unsafe { hooks::stream_create(stream, flags, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(stream: *mut Handle, flags: c_uint, priority: c_int) -> u32 {
    let real = || unsafe { cu::cuStreamCreateWithPriority(stream, flags, priority) };
    guarded(|| unsafe { hooks::stream_create(stream, flags, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: Handle) -> u32 {
    let real = || unsafe { cu::cuStreamDestroy_v2(stream) };
    guarded(|| hooks::stream_destroy(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: Handle, mode: c_int) -> u32 {
    let real = || unsafe { cu::cuStreamBeginCapture_v2(stream, mode) };
    guarded(|| hooks::begin_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(stream: Handle, mode: c_int) -> u32 {
    let real = || unsafe { cu::cuStreamBeginCapture_v2_ptsz(stream, mode) };
    guarded(|| hooks::begin_capture(hooks::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    stream: Handle,
    graph: Handle,
    dependencies: *const c_void,
    dependency_data: *const c_void,
    count: usize,
    mode: c_int,
) -> u32 {
    let real = || unsafe { cu::cuStreamBeginCaptureToGraph(stream, graph, dependencies, dependency_data, count, mode) };
    guarded(|| hooks::begin_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph_ptsz(
    stream: Handle,
    graph: Handle,
    dependencies: *const c_void,
    dependency_data: *const c_void,
    count: usize,
    mode: c_int,
) -> u32 {
    let real =
        || unsafe { cu::cuStreamBeginCaptureToGraph_ptsz(stream, graph, dependencies, dependency_data, count, mode) };
    guarded(|| hooks::begin_capture(hooks::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: Handle, graph: *mut Handle) -> u32 {
    let real = || unsafe { cu::cuStreamEndCapture(stream, graph) };
    guarded(|| hooks::end_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(stream: Handle, graph: *mut Handle) -> u32 {
    let real = || unsafe { cu::cuStreamEndCapture_ptsz(stream, graph) };
    guarded(|| hooks::end_capture(hooks::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: Handle, flags: c_uint) -> u32 {
    let real = || unsafe { cu::cuCtxEnablePeerAccess(peer, flags) };
    guarded(|| hooks::peer_access(true, || driver_door::peer_devices(peer), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: Handle) -> u32 {
    let real = || unsafe { cu::cuCtxDisablePeerAccess(peer) };
    guarded(|| hooks::peer_access(false, || driver_door::peer_devices(peer), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(device: c_int) -> u32 {
    let real = || unsafe { cu::cuDevicePrimaryCtxReset_v2(device) };
    guarded(|| hooks::device_reset(Some(device), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: Handle, ptr: u64) -> u32 {
    let real = || unsafe { cu::cuIpcGetMemHandle(handle, ptr) };
    guarded(|| hooks::ipc_get_mem_handle(ptr, "cuIpcGetMemHandle", real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> u32 {
    let real = || unsafe { cu::cuMemGetInfo_v2(free, total) };
    guarded(|| unsafe { hooks::mem_get_info(free, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, function: *mut Handle, version: c_int, flags: u64) -> u32 {
    let real = || unsafe { cu::cuGetProcAddress(symbol, function, version, flags) };
    guarded(|| unsafe { driver_door::get_proc_address(symbol, function, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    function: *mut Handle,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> u32 {
    let real = || unsafe { cu::cuGetProcAddress_v2(symbol, function, version, flags, status) };
    guarded(|| unsafe { driver_door::get_proc_address(symbol, function, real) }, real)
}
