//! somashim: `LD_PRELOAD=libsomashim.so ./legacy_app` serves the program's
//! `cudaMalloc`/`cudaFree` (and the driver's `cuMemAlloc`/`cuMemFree`) from a
//! stream-ordered memory pool, with the observable behaviour of the real
//! functions. The promises it keeps: docs/CONTRACT.md; how: docs/DESIGN.md.
//!
//! This file is the manifest: the layers, and every exported symbol. Each
//! export names the real function once (`real`) and runs the hook through
//! `guarded`, which runs `real` instead when re-entered or on a panic (the
//! entry-point lookups through `guarded_lookup`, which answers re-entered too).
//! The driver's exports are declared inside `driver_entry_points!`, which
//! also makes of them the table that `dlsym` and `cuGetProcAddress` hand out.
//!
//! Layers, imports only downwards:
//! - `front`: the front doors (what each hooked call does, the `dlsym` and
//!   `cuGetProcAddress` that hand out the shim's driver entry points);
//! - `peers`: what talks to other processes (CUDA IPC, the process's server,
//!   the neighbours, the snapshot, the socket directory);
//! - `core`: configuration, pointer map, per-device pools and the ordering
//!   of frees, statistics, trace; no FFI, written against `cuda::gpu::Gpu`;
//! - `cuda`: the real CUDA libraries (the functions behind the hooks, and the
//!   driver behind `Gpu`).
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // each export has the C function's contract

mod core;
mod cuda;
mod front;
mod peers;

pub use crate::core::config::settings::Config;
pub use crate::core::config::variables::VARIABLES;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use cuda::real::{driver as cu, runtime as rt, IpcMemHandle};
use front::driver_door::{EntryPoint, ALLOC_HOST_FLAGS, INVALID_VALUE, OUT_OF_MEMORY};
use front::guard::{guarded, guarded_lookup};
use front::hooks::{Extent, PitchedPtr};
use front::work::stream;

type Handle = *mut c_void;

// ---- the runtime front door --------------------------------------------------

/// The allocating exports pass their caller's return address to the hook as
/// one more argument, in the register the x86-64 System V convention gives
/// the next integer argument: a two-instruction trampoline with no frame of
/// its own, so the stack (and any argument passed there) is the caller's.
macro_rules! with_caller {
    ($export:ident($($arg:ident: $ty:ty),*) => $hook:ident in $register:literal) => {
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $export($($arg: $ty),*) -> u32 {
            std::arch::naked_asm!(concat!("mov ", $register, ", qword ptr [rsp]"), "jmp {hook}", hook = sym $hook)
        }
    };
}

with_caller!(cudaMalloc(ptr: *mut Handle, size: usize) => cuda_malloc_from in "rdx");

unsafe extern "C" fn cuda_malloc_from(ptr: *mut Handle, size: usize, caller: usize) -> u32 {
    let real = || unsafe { rt::cudaMalloc(ptr, size) };
    let door = front::runtime_door::make_context_current;
    guarded(|| unsafe { front::hooks::malloc(ptr.cast(), size, caller, door, front::runtime_door::out_of_memory, real) }, real)
}

with_caller!(cudaMallocPitch(ptr: *mut Handle, pitch: *mut usize, width: usize, height: usize) => cuda_malloc_pitch_from in "r8");

unsafe extern "C" fn cuda_malloc_pitch_from(ptr: *mut Handle, pitch: *mut usize, width: usize, height: usize, caller: usize) -> u32 {
    let real = || unsafe { rt::cudaMallocPitch(ptr, pitch, width, height) };
    let (door, oom) = (front::runtime_door::make_context_current, front::runtime_door::out_of_memory);
    guarded(|| unsafe { front::hooks::malloc_pitch(ptr.cast(), pitch, width, height, true, caller, door, oom, real) }, real)
}

// The extent (three words) is passed on the stack, so the caller's address
// goes in the second integer register.
with_caller!(cudaMalloc3D(ptr: *mut PitchedPtr, extent: Extent) => cuda_malloc_3d_from in "rsi");

unsafe extern "C" fn cuda_malloc_3d_from(ptr: *mut PitchedPtr, extent: Extent, caller: usize) -> u32 {
    let real = || unsafe { rt::cudaMalloc3D(ptr.cast(), extent) };
    let (door, oom) = (front::runtime_door::make_context_current, front::runtime_door::out_of_memory);
    guarded(|| unsafe { front::hooks::malloc_3d(ptr, extent, caller, door, oom, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: Handle) -> u32 {
    let real = || unsafe { rt::cudaFree(ptr) };
    guarded(|| front::hooks::free(ptr as u64, front::runtime_door::free_would_fail, front::runtime_door::invalid_value, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(ptr: Handle, stream: Handle) -> u32 {
    let real = || unsafe { rt::cudaFreeAsync(ptr, stream) };
    guarded(|| front::hooks::free_async(ptr as u64, front::runtime_door::invalid_value, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(ptr: Handle, stream: Handle) -> u32 {
    let real = || unsafe { rt::cudaFreeAsync_ptsz(ptr, stream) };
    guarded(|| front::hooks::free_async(ptr as u64, front::runtime_door::invalid_value, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut Handle, size: usize) -> u32 {
    let real = || unsafe { rt::cudaMallocHost(ptr, size) };
    guarded(|| unsafe { front::hooks::malloc_host(ptr, size, 0, front::runtime_door::make_context_current, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(ptr: *mut Handle, size: usize, flags: c_uint) -> u32 {
    let real = || unsafe { rt::cudaHostAlloc(ptr, size, flags) };
    guarded(|| unsafe { front::hooks::malloc_host(ptr, size, flags, front::runtime_door::make_context_current, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: Handle) -> u32 {
    let real = || unsafe { rt::cudaFreeHost(ptr) };
    let would_fail = front::runtime_door::free_host_would_fail;
    guarded(|| front::hooks::free_host(ptr as u64, would_fail, front::runtime_door::invalid_value, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostGetFlags(flags: *mut c_uint, ptr: Handle) -> u32 {
    let real = || unsafe { rt::cudaHostGetFlags(flags, ptr) };
    guarded(|| unsafe { front::hooks::host_get_flags(flags, ptr as u64, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostGetDevicePointer(device: *mut Handle, host: Handle, flags: c_uint) -> u32 {
    let real = || unsafe { rt::cudaHostGetDevicePointer(device, host, flags) };
    guarded(|| unsafe { front::hooks::host_get_device_pointer(device.cast(), host as u64, flags, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(stream: *mut Handle, flags: c_uint) -> u32 {
    let real = || unsafe { rt::cudaStreamCreateWithFlags(stream, flags) };
    guarded(|| unsafe { front::hooks::stream_create(stream, flags, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(stream: *mut Handle, flags: c_uint, priority: c_int) -> u32 {
    let real = || unsafe { rt::cudaStreamCreateWithPriority(stream, flags, priority) };
    guarded(|| unsafe { front::hooks::stream_create(stream, flags, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamDestroy(stream: Handle) -> u32 {
    let real = || unsafe { rt::cudaStreamDestroy(stream) };
    guarded(|| front::hooks::stream_destroy(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture(stream: Handle, mode: c_int) -> u32 {
    let real = || unsafe { rt::cudaStreamBeginCapture(stream, mode) };
    guarded(|| front::hooks::begin_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture_ptsz(stream: Handle, mode: c_int) -> u32 {
    let real = || unsafe { rt::cudaStreamBeginCapture_ptsz(stream, mode) };
    guarded(|| front::hooks::begin_capture(front::hooks::per_thread(stream), real), real)
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
        || unsafe { rt::cudaStreamBeginCaptureToGraph(stream, graph, dependencies, dependency_data, count, mode) };
    guarded(|| front::hooks::begin_capture(stream, real), real)
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
        rt::cudaStreamBeginCaptureToGraph_ptsz(stream, graph, dependencies, dependency_data, count, mode)
    };
    guarded(|| front::hooks::begin_capture(front::hooks::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(stream: Handle, graph: *mut Handle) -> u32 {
    let real = || unsafe { rt::cudaStreamEndCapture(stream, graph) };
    guarded(|| front::hooks::end_capture(stream, real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture_ptsz(stream: Handle, graph: *mut Handle) -> u32 {
    let real = || unsafe { rt::cudaStreamEndCapture_ptsz(stream, graph) };
    guarded(|| front::hooks::end_capture(front::hooks::per_thread(stream), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> u32 {
    let real = || unsafe { rt::cudaDeviceReset() };
    guarded(|| front::hooks::device_reset(front::runtime_door::current_device(), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> u32 {
    let real = || unsafe { rt::cudaDeviceEnablePeerAccess(peer, flags) };
    guarded(|| front::hooks::peer_access(true, || Some((peer, front::runtime_door::current_device()?)), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceDisablePeerAccess(peer: c_int) -> u32 {
    let real = || unsafe { rt::cudaDeviceDisablePeerAccess(peer) };
    guarded(|| front::hooks::peer_access(false, || Some((peer, front::runtime_door::current_device()?)), real), real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(handle: *mut IpcMemHandle, ptr: Handle) -> u32 {
    let real = || unsafe { rt::cudaIpcGetMemHandle(handle.cast(), ptr) };
    guarded(|| unsafe { front::hooks::ipc_get_mem_handle(handle, ptr as u64, real) }, real)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> u32 {
    let real = || unsafe { rt::cudaMemGetInfo(free, total) };
    guarded(|| unsafe { front::hooks::mem_get_info(free, total, real) }, real)
}

// ---- the driver front door ---------------------------------------------------

/// A row of the tables `dlsym` and `cuGetProcAddress` hand out: the
/// export's name and the shim's function.
macro_rules! entry_point {
    ($name:ident) => {
        EntryPoint(
            match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(name) => name,
                Err(_) => panic!("a symbol name has no NUL inside"),
            },
            $name as *const (),
        )
    };
}

/// Defines the driver exports inside it (adding `#[no_mangle]`) and, one row
/// each, in order, their table `DRIVER_ENTRY_POINTS`, so that no export is
/// missing from it. An export is a `pub unsafe extern "C" fn` or a
/// `with_caller!` trampoline; a trampoline's hook (a private
/// `unsafe extern "C" fn`) gets no row.
macro_rules! driver_entry_points {
    (@rows [$($done:ident)*]) => {
        /// What `dlsym` and `cuGetProcAddress` answer with the shim's function
        /// instead of the driver's (matched on the driver's own answer, so the
        /// driver picks the variant for each version and per-thread flag).
        static DRIVER_ENTRY_POINTS: &[EntryPoint] = &[$(entry_point!($done)),*];
    };
    (@rows [$($done:ident)*] with_caller!($export:ident $($trampoline:tt)*); $($rest:tt)*) => {
        with_caller!($export $($trampoline)*);
        driver_entry_points!(@rows [$($done)* $export] $($rest)*);
    };
    (@rows [$($done:ident)*] $(#[$attr:meta])* pub unsafe extern "C" fn $export:ident $params:tt -> u32 $body:block $($rest:tt)*) => {
        $(#[$attr])*
        #[no_mangle]
        pub unsafe extern "C" fn $export $params -> u32 $body
        driver_entry_points!(@rows [$($done)* $export] $($rest)*);
    };
    (@rows [$($done:ident)*] unsafe extern "C" fn $hook:ident $params:tt -> u32 $body:block $($rest:tt)*) => {
        unsafe extern "C" fn $hook $params -> u32 $body
        driver_entry_points!(@rows [$($done)*] $($rest)*);
    };
    ($($items:tt)*) => {
        driver_entry_points!(@rows [] $($items)*);
    };
}

driver_entry_points! {
    with_caller!(cuMemAlloc_v2(ptr: *mut u64, size: usize) => cu_mem_alloc_from in "rdx");

    unsafe extern "C" fn cu_mem_alloc_from(ptr: *mut u64, size: usize, caller: usize) -> u32 {
        let real = || unsafe { cu::cuMemAlloc_v2(ptr, size) };
        guarded(|| unsafe { front::hooks::malloc(ptr, size, caller, || false, || OUT_OF_MEMORY, real) }, real)
    }

    with_caller!(cuMemAllocPitch_v2(ptr: *mut u64, pitch: *mut usize, width: usize, height: usize, element_bytes: c_uint)
        => cu_mem_alloc_pitch_from in "r9");

    unsafe extern "C" fn cu_mem_alloc_pitch_from(
        ptr: *mut u64,
        pitch: *mut usize,
        width: usize,
        height: usize,
        element_bytes: c_uint,
        caller: usize,
    ) -> u32 {
        let real = || unsafe { cu::cuMemAllocPitch_v2(ptr, pitch, width, height, element_bytes) };
        let valid = front::driver_door::pitch_element_size_is_valid(element_bytes);
        let out_of_memory = || OUT_OF_MEMORY;
        guarded(|| unsafe { front::hooks::malloc_pitch(ptr, pitch, width, height, valid, caller, || false, out_of_memory, real) }, real)
    }

    pub unsafe extern "C" fn cuMemFree_v2(ptr: u64) -> u32 {
        let real = || unsafe { cu::cuMemFree_v2(ptr) };
        guarded(|| front::hooks::free(ptr, front::driver_door::free_would_fail, || INVALID_VALUE, real), real)
    }

    pub unsafe extern "C" fn cuMemAllocHost_v2(ptr: *mut Handle, size: usize) -> u32 {
        let real = || unsafe { cu::cuMemAllocHost_v2(ptr, size) };
        guarded(|| unsafe { front::hooks::malloc_host(ptr, size, ALLOC_HOST_FLAGS, || false, real) }, real)
    }

    pub unsafe extern "C" fn cuMemHostAlloc(ptr: *mut Handle, size: usize, flags: c_uint) -> u32 {
        let real = || unsafe { cu::cuMemHostAlloc(ptr, size, flags) };
        guarded(|| unsafe { front::hooks::malloc_host(ptr, size, flags, || false, real) }, real)
    }

    pub unsafe extern "C" fn cuMemFreeHost(ptr: Handle) -> u32 {
        let real = || unsafe { cu::cuMemFreeHost(ptr) };
        guarded(|| front::hooks::free_host(ptr as u64, front::driver_door::free_host_would_fail, || INVALID_VALUE, real), real)
    }

    pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, ptr: Handle) -> u32 {
        let real = || unsafe { cu::cuMemHostGetFlags(flags, ptr) };
        guarded(|| unsafe { front::hooks::host_get_flags(flags, ptr as u64, real) }, real)
    }

    pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(device: *mut u64, host: Handle, flags: c_uint) -> u32 {
        let real = || unsafe { cu::cuMemHostGetDevicePointer_v2(device, host, flags) };
        guarded(|| unsafe { front::hooks::host_get_device_pointer(device, host as u64, flags, real) }, real)
    }

    pub unsafe extern "C" fn cuMemFreeAsync(ptr: u64, stream: Handle) -> u32 {
        let real = || unsafe { cu::cuMemFreeAsync(ptr, stream) };
        guarded(|| front::hooks::free_async(ptr, || INVALID_VALUE, real), real)
    }

    pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: u64, stream: Handle) -> u32 {
        let real = || unsafe { cu::cuMemFreeAsync_ptsz(ptr, stream) };
        guarded(|| front::hooks::free_async(ptr, || INVALID_VALUE, real), real)
    }

    // The program's own allocators: the real functions, with room made
    // where the shim holds memory the program freed (`hooks::with_room`).

    pub unsafe extern "C" fn cuMemAllocAsync(ptr: *mut u64, size: usize, stream: Handle) -> u32 {
        let real = || unsafe { cu::cuMemAllocAsync(ptr, size, stream) };
        guarded(|| front::hooks::with_room(real), real)
    }

    pub unsafe extern "C" fn cuMemAllocAsync_ptsz(ptr: *mut u64, size: usize, stream: Handle) -> u32 {
        let real = || unsafe { cu::cuMemAllocAsync_ptsz(ptr, size, stream) };
        guarded(|| front::hooks::with_room(real), real)
    }

    pub unsafe extern "C" fn cuMemAllocFromPoolAsync(ptr: *mut u64, size: usize, pool: Handle, stream: Handle) -> u32 {
        let real = || unsafe { cu::cuMemAllocFromPoolAsync(ptr, size, pool, stream) };
        guarded(|| front::hooks::with_room(real), real)
    }

    pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(ptr: *mut u64, size: usize, pool: Handle, stream: Handle) -> u32 {
        let real = || unsafe { cu::cuMemAllocFromPoolAsync_ptsz(ptr, size, pool, stream) };
        guarded(|| front::hooks::with_room(real), real)
    }

    pub unsafe extern "C" fn cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> u32 {
        let real = || unsafe { cu::cuMemCreate(handle, size, prop, flags) };
        guarded(|| front::hooks::with_room(real), real)
    }

    pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, flags: c_uint) -> u32 {
        let real = || unsafe { cu::cuStreamCreate(stream, flags) };
        guarded(|| unsafe { front::hooks::stream_create(stream, flags, real) }, real)
    }

    pub unsafe extern "C" fn cuStreamCreateWithPriority(stream: *mut Handle, flags: c_uint, priority: c_int) -> u32 {
        let real = || unsafe { cu::cuStreamCreateWithPriority(stream, flags, priority) };
        guarded(|| unsafe { front::hooks::stream_create(stream, flags, real) }, real)
    }

    pub unsafe extern "C" fn cuStreamDestroy_v2(stream: Handle) -> u32 {
        let real = || unsafe { cu::cuStreamDestroy_v2(stream) };
        guarded(|| front::hooks::stream_destroy(stream, real), real)
    }

    pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: Handle, mode: c_int) -> u32 {
        let real = || unsafe { cu::cuStreamBeginCapture_v2(stream, mode) };
        guarded(|| front::hooks::begin_capture(stream, real), real)
    }

    pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(stream: Handle, mode: c_int) -> u32 {
        let real = || unsafe { cu::cuStreamBeginCapture_v2_ptsz(stream, mode) };
        guarded(|| front::hooks::begin_capture(front::hooks::per_thread(stream), real), real)
    }

    pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
        stream: Handle,
        graph: Handle,
        dependencies: *const c_void,
        dependency_data: *const c_void,
        count: usize,
        mode: c_int,
    ) -> u32 {
        let real = || unsafe { cu::cuStreamBeginCaptureToGraph(stream, graph, dependencies, dependency_data, count, mode) };
        guarded(|| front::hooks::begin_capture(stream, real), real)
    }

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
        guarded(|| front::hooks::begin_capture(front::hooks::per_thread(stream), real), real)
    }

    pub unsafe extern "C" fn cuStreamEndCapture(stream: Handle, graph: *mut Handle) -> u32 {
        let real = || unsafe { cu::cuStreamEndCapture(stream, graph) };
        guarded(|| front::hooks::end_capture(stream, real), real)
    }

    pub unsafe extern "C" fn cuStreamEndCapture_ptsz(stream: Handle, graph: *mut Handle) -> u32 {
        let real = || unsafe { cu::cuStreamEndCapture_ptsz(stream, graph) };
        guarded(|| front::hooks::end_capture(front::hooks::per_thread(stream), real), real)
    }

    pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: Handle, flags: c_uint) -> u32 {
        let real = || unsafe { cu::cuCtxEnablePeerAccess(peer, flags) };
        guarded(|| front::hooks::peer_access(true, || front::driver_door::peer_devices(peer), real), real)
    }

    pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: Handle) -> u32 {
        let real = || unsafe { cu::cuCtxDisablePeerAccess(peer) };
        guarded(|| front::hooks::peer_access(false, || front::driver_door::peer_devices(peer), real), real)
    }

    /// The CUDA 10 entry point, which a runtime asking `cuGetProcAddress` with an
    /// older version is handed.
    pub unsafe extern "C" fn cuDevicePrimaryCtxReset(device: c_int) -> u32 {
        let real = || unsafe { cu::cuDevicePrimaryCtxReset(device) };
        guarded(|| front::hooks::device_reset(Some(device), real), real)
    }

    pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(device: c_int) -> u32 {
        let real = || unsafe { cu::cuDevicePrimaryCtxReset_v2(device) };
        guarded(|| front::hooks::device_reset(Some(device), real), real)
    }

    pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut IpcMemHandle, ptr: u64) -> u32 {
        let real = || unsafe { cu::cuIpcGetMemHandle(handle.cast(), ptr) };
        guarded(|| unsafe { front::hooks::ipc_get_mem_handle(handle, ptr, real) }, real)
    }

    // The runtime's cudaIpcOpenMemHandle and cudaIpcCloseMemHandle reach these
    // (through the entry points handed out below), which keeps its error codes
    // and last error the real ones: see peers/import.rs.

    pub unsafe extern "C" fn cuIpcOpenMemHandle(ptr: *mut u64, handle: IpcMemHandle, flags: c_uint) -> u32 {
        let real = || unsafe { cu::cuIpcOpenMemHandle(ptr, handle, flags) };
        guarded(|| unsafe { front::hooks::ipc_open_mem_handle(ptr, &handle, flags, real) }, real)
    }

    pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(ptr: *mut u64, handle: IpcMemHandle, flags: c_uint) -> u32 {
        let real = || unsafe { cu::cuIpcOpenMemHandle_v2(ptr, handle, flags) };
        guarded(|| unsafe { front::hooks::ipc_open_mem_handle(ptr, &handle, flags, real) }, real)
    }

    pub unsafe extern "C" fn cuIpcCloseMemHandle(ptr: u64) -> u32 {
        let real = || unsafe { cu::cuIpcCloseMemHandle(ptr) };
        guarded(|| front::hooks::ipc_close_mem_handle(ptr, real), real)
    }

    pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> u32 {
        let real = || unsafe { cu::cuMemGetInfo_v2(free, total) };
        guarded(|| unsafe { front::hooks::mem_get_info(free, total, real) }, real)
    }

    pub unsafe extern "C" fn cuPointerGetAttribute(data: Handle, attribute: c_int, ptr: u64) -> u32 {
        let real = || unsafe { cu::cuPointerGetAttribute(data, attribute, ptr) };
        guarded(|| unsafe { front::pointer_queries::get_attribute(data, attribute, ptr, real) }, real)
    }

    pub unsafe extern "C" fn cuPointerGetAttributes(count: c_uint, attributes: *const c_int, data: *mut Handle, ptr: u64) -> u32 {
        let real = || unsafe { cu::cuPointerGetAttributes(count, attributes, data, ptr) };
        guarded(|| unsafe { front::pointer_queries::get_attributes(count, attributes, data, ptr, real) }, real)
    }

    pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, function: *mut Handle, version: c_int, flags: u64) -> u32 {
        let real = || unsafe { cu::cuGetProcAddress(symbol, function, version, flags) };
        let lookup = || unsafe { front::driver_door::get_proc_address(symbol, function, &SERVED, real, passes_unseen) };
        guarded_lookup(lookup, real)
    }

    pub unsafe extern "C" fn cuGetProcAddress_v2(
        symbol: *const c_char,
        function: *mut Handle,
        version: c_int,
        flags: u64,
        status: *mut c_int,
    ) -> u32 {
        let real = || unsafe { cu::cuGetProcAddress_v2(symbol, function, version, flags, status) };
        let lookup = || unsafe { front::driver_door::get_proc_address(symbol, function, &SERVED, real, passes_unseen) };
        guarded_lookup(lookup, real)
    }
}

/// `cuGetProcAddress` handed out a variant of `name` that the shim does not
/// wrap: if `name` issues work, its calls pass the hooks unseen from now on.
fn passes_unseen(name: &CStr) {
    if WORK_ENTRY_POINTS.iter().any(|EntryPoint(work, _)| *work == name) {
        front::process::allocator().work_passes_unseen();
    }
}

// ---- the driver calls that issue work on a stream ---------------------------

/// Defines each export: the real function (found by name once) runs inside
/// `front::work::issue` for the streams after `=>`. Every argument is passed
/// through as the 64-bit integer the C calling convention moves it in (none
/// is a floating-point value or a struct over 8 bytes).
macro_rules! work_entry_points {
    ($($name:ident($($arg:ident),*) => $streams:expr;)*) => {
        mod real_work {
            crate::cuda::real::real_functions! { find = crate::cuda::real::find_in_driver; $( $name($($arg: usize),*); )* }
        }
        $(
            #[no_mangle]
            #[allow(unused_unsafe)] // only some lines read the streams through a pointer
            pub unsafe extern "C" fn $name($($arg: usize),*) -> u32 {
                let real = || unsafe { real_work::$name($($arg),*) };
                // SAFETY (both): the streams are read from the caller's arguments, valid by the call's contract.
                const NULL: front::work::NullStream = front::work::null_stream(stringify!($name));
                let hooked = || front::work::issue(front::process::allocator(), NULL, &unsafe { $streams }, real);
                let made = front::process::allocator_if_made;
                let past_hooks = || front::work::issue_past_hooks(made(), NULL, &unsafe { $streams }, real);
                guarded(hooked, past_hooks)
            }
        )*
        /// The exports above, as `dlsym` and `cuGetProcAddress` hand them out.
        static WORK_ENTRY_POINTS: &[EntryPoint] = &[$(entry_point!($name)),*];
    };
}

// One line per driver export: CUDA 13.0's `cuda.h` and `cudaGL.h` (including
// each `_v2`, `_ptsz` and older variant a driver still exports), checked by
// scripts/check_work_entry_points.py. Names and positions follow the headers.
work_entry_points! {
    cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra) => [stream(s)];
    cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, s, params, extra) => [stream(s)];
    cuLaunchKernelEx(config, f, params, extra) => front::work::launch_config_stream(config);
    cuLaunchKernelEx_ptsz(config, f, params, extra) => front::work::launch_config_stream(config);
    cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, s, params) => [stream(s)];
    cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, s, params) => [stream(s)];
    cuLaunchCooperativeKernelMultiDevice(list, count, flags) => front::work::launch_list_streams(list, count);
    cuLaunchGridAsync(f, width, height, s) => [stream(s)];
    cuLaunchHostFunc(s, function, data) => [stream(s)];
    cuLaunchHostFunc_ptsz(s, function, data) => [stream(s)];
    cuStreamAddCallback(s, callback, data, flags) => [stream(s)];
    cuStreamAddCallback_ptsz(s, callback, data, flags) => [stream(s)];
    cuGraphLaunch(graph, s) => [stream(s)];
    cuGraphLaunch_ptsz(graph, s) => [stream(s)];
    cuGraphUpload(graph, s) => [stream(s)];
    cuGraphUpload_ptsz(graph, s) => [stream(s)];
    cuMemcpyAsync(dst, src, bytes, s) => [stream(s)];
    cuMemcpyAsync_ptsz(dst, src, bytes, s) => [stream(s)];
    cuMemcpyHtoDAsync(dst, src, bytes, s) => [stream(s)];
    cuMemcpyHtoDAsync_v2(dst, src, bytes, s) => [stream(s)];
    cuMemcpyHtoDAsync_v2_ptsz(dst, src, bytes, s) => [stream(s)];
    cuMemcpyDtoHAsync(dst, src, bytes, s) => [stream(s)];
    cuMemcpyDtoHAsync_v2(dst, src, bytes, s) => [stream(s)];
    cuMemcpyDtoHAsync_v2_ptsz(dst, src, bytes, s) => [stream(s)];
    cuMemcpyDtoDAsync(dst, src, bytes, s) => [stream(s)];
    cuMemcpyDtoDAsync_v2(dst, src, bytes, s) => [stream(s)];
    cuMemcpyDtoDAsync_v2_ptsz(dst, src, bytes, s) => [stream(s)];
    cuMemcpyHtoAAsync(dst, offset, src, bytes, s) => [stream(s)];
    cuMemcpyHtoAAsync_v2(dst, offset, src, bytes, s) => [stream(s)];
    cuMemcpyHtoAAsync_v2_ptsz(dst, offset, src, bytes, s) => [stream(s)];
    cuMemcpyAtoHAsync(dst, src, offset, bytes, s) => [stream(s)];
    cuMemcpyAtoHAsync_v2(dst, src, offset, bytes, s) => [stream(s)];
    cuMemcpyAtoHAsync_v2_ptsz(dst, src, offset, bytes, s) => [stream(s)];
    cuMemcpy2DAsync(copy, s) => [stream(s)];
    cuMemcpy2DAsync_v2(copy, s) => [stream(s)];
    cuMemcpy2DAsync_v2_ptsz(copy, s) => [stream(s)];
    cuMemcpy3DAsync(copy, s) => [stream(s)];
    cuMemcpy3DAsync_v2(copy, s) => [stream(s)];
    cuMemcpy3DAsync_v2_ptsz(copy, s) => [stream(s)];
    cuMemcpy3DPeerAsync(copy, s) => [stream(s)];
    cuMemcpy3DPeerAsync_ptsz(copy, s) => [stream(s)];
    cuMemcpyPeerAsync(dst, dst_context, src, src_context, bytes, s) => [stream(s)];
    cuMemcpyPeerAsync_ptsz(dst, dst_context, src, src_context, bytes, s) => [stream(s)];
    cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attr_indices, attr_count, fail_index, s) => [stream(s)];
    cuMemcpyBatchAsync_ptsz(dsts, srcs, sizes, count, attrs, attr_indices, attr_count, fail_index, s) => [stream(s)];
    cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, attrs, attr_indices, attr_count, s) => [stream(s)];
    cuMemcpyBatchAsync_v2_ptsz(dsts, srcs, sizes, count, attrs, attr_indices, attr_count, s) => [stream(s)];
    cuMemcpy3DBatchAsync(count, ops, fail_index, flags, s) => [stream(s)];
    cuMemcpy3DBatchAsync_ptsz(count, ops, fail_index, flags, s) => [stream(s)];
    cuMemcpy3DBatchAsync_v2(count, ops, flags, s) => [stream(s)];
    cuMemcpy3DBatchAsync_v2_ptsz(count, ops, flags, s) => [stream(s)];
    cuMemsetD8Async(dst, value, count, s) => [stream(s)];
    cuMemsetD8Async_ptsz(dst, value, count, s) => [stream(s)];
    cuMemsetD16Async(dst, value, count, s) => [stream(s)];
    cuMemsetD16Async_ptsz(dst, value, count, s) => [stream(s)];
    cuMemsetD32Async(dst, value, count, s) => [stream(s)];
    cuMemsetD32Async_ptsz(dst, value, count, s) => [stream(s)];
    cuMemsetD2D8Async(dst, pitch, value, width, height, s) => [stream(s)];
    cuMemsetD2D8Async_ptsz(dst, pitch, value, width, height, s) => [stream(s)];
    cuMemsetD2D16Async(dst, pitch, value, width, height, s) => [stream(s)];
    cuMemsetD2D16Async_ptsz(dst, pitch, value, width, height, s) => [stream(s)];
    cuMemsetD2D32Async(dst, pitch, value, width, height, s) => [stream(s)];
    cuMemsetD2D32Async_ptsz(dst, pitch, value, width, height, s) => [stream(s)];
    cuStreamWriteValue32(s, address, value, flags) => [stream(s)];
    cuStreamWriteValue32_ptsz(s, address, value, flags) => [stream(s)];
    cuStreamWriteValue32_v2(s, address, value, flags) => [stream(s)];
    cuStreamWriteValue32_v2_ptsz(s, address, value, flags) => [stream(s)];
    cuStreamWriteValue64(s, address, value, flags) => [stream(s)];
    cuStreamWriteValue64_ptsz(s, address, value, flags) => [stream(s)];
    cuStreamWriteValue64_v2(s, address, value, flags) => [stream(s)];
    cuStreamWriteValue64_v2_ptsz(s, address, value, flags) => [stream(s)];
    cuStreamWaitValue32(s, address, value, flags) => [stream(s)];
    cuStreamWaitValue32_ptsz(s, address, value, flags) => [stream(s)];
    cuStreamWaitValue32_v2(s, address, value, flags) => [stream(s)];
    cuStreamWaitValue32_v2_ptsz(s, address, value, flags) => [stream(s)];
    cuStreamWaitValue64(s, address, value, flags) => [stream(s)];
    cuStreamWaitValue64_ptsz(s, address, value, flags) => [stream(s)];
    cuStreamWaitValue64_v2(s, address, value, flags) => [stream(s)];
    cuStreamWaitValue64_v2_ptsz(s, address, value, flags) => [stream(s)];
    cuStreamBatchMemOp(s, count, ops, flags) => [stream(s)];
    cuStreamBatchMemOp_ptsz(s, count, ops, flags) => [stream(s)];
    cuStreamBatchMemOp_v2(s, count, ops, flags) => [stream(s)];
    cuStreamBatchMemOp_v2_ptsz(s, count, ops, flags) => [stream(s)];
    cuMemPrefetchAsync(ptr, bytes, device, s) => [stream(s)];
    cuMemPrefetchAsync_ptsz(ptr, bytes, device, s) => [stream(s)];
    cuMemPrefetchAsync_v2(ptr, bytes, location, flags, s) => [stream(s)];
    cuMemPrefetchAsync_v2_ptsz(ptr, bytes, location, flags, s) => [stream(s)];
    cuMemPrefetchBatchAsync(ptrs, sizes, count, locations, location_indices, location_count, flags, s) => [stream(s)];
    cuMemPrefetchBatchAsync_ptsz(ptrs, sizes, count, locations, location_indices, location_count, flags, s) => [stream(s)];
    cuMemDiscardBatchAsync(ptrs, sizes, count, flags, s) => [stream(s)];
    cuMemDiscardBatchAsync_ptsz(ptrs, sizes, count, flags, s) => [stream(s)];
    cuMemDiscardAndPrefetchBatchAsync(ptrs, sizes, count, locations, location_indices, location_count, flags, s) => [stream(s)];
    cuMemDiscardAndPrefetchBatchAsync_ptsz(ptrs, sizes, count, locations, location_indices, location_count, flags, s) => [stream(s)];
    cuMemBatchDecompressAsync(params, count, flags, error_index, s) => [stream(s)];
    cuMemBatchDecompressAsync_ptsz(params, count, flags, error_index, s) => [stream(s)];
    cuMemMapArrayAsync(infos, count, s) => [stream(s)];
    cuMemMapArrayAsync_ptsz(infos, count, s) => [stream(s)];
    cuSignalExternalSemaphoresAsync(semaphores, params, count, s) => [stream(s)];
    cuSignalExternalSemaphoresAsync_ptsz(semaphores, params, count, s) => [stream(s)];
    cuWaitExternalSemaphoresAsync(semaphores, params, count, s) => [stream(s)];
    cuWaitExternalSemaphoresAsync_ptsz(semaphores, params, count, s) => [stream(s)];
    cuStreamAttachMemAsync(s, ptr, bytes, flags) => [stream(s)];
    cuStreamAttachMemAsync_ptsz(s, ptr, bytes, flags) => [stream(s)];
    cuGraphicsMapResources(count, resources, s) => [stream(s)];
    cuGraphicsMapResources_ptsz(count, resources, s) => [stream(s)];
    cuGraphicsUnmapResources(count, resources, s) => [stream(s)];
    cuGraphicsUnmapResources_ptsz(count, resources, s) => [stream(s)];
    cuGLMapBufferObjectAsync(ptr, size, buffer, s) => [stream(s)];
    cuGLMapBufferObjectAsync_v2(ptr, size, buffer, s) => [stream(s)];
    cuGLMapBufferObjectAsync_v2_ptsz(ptr, size, buffer, s) => [stream(s)];
    cuGLUnmapBufferObjectAsync(buffer, s) => [stream(s)];
    // The synchronous calls' per-thread variants: work on the calling thread's
    // per-thread default stream, which the legacy stream does not order.
    cuMemcpy_ptds(dst, src, bytes) => front::work::per_thread_stream();
    cuMemcpyPeer_ptds(dst, dst_context, src, src_context, bytes) => front::work::per_thread_stream();
    cuMemcpyHtoD_v2_ptds(dst, src, bytes) => front::work::per_thread_stream();
    cuMemcpyDtoH_v2_ptds(dst, src, bytes) => front::work::per_thread_stream();
    cuMemcpyDtoD_v2_ptds(dst, src, bytes) => front::work::per_thread_stream();
    cuMemcpyDtoA_v2_ptds(dst, offset, src, bytes) => front::work::per_thread_stream();
    cuMemcpyAtoD_v2_ptds(dst, src, offset, bytes) => front::work::per_thread_stream();
    cuMemcpyHtoA_v2_ptds(dst, offset, src, bytes) => front::work::per_thread_stream();
    cuMemcpyAtoH_v2_ptds(dst, src, offset, bytes) => front::work::per_thread_stream();
    cuMemcpyAtoA_v2_ptds(dst, dst_offset, src, src_offset, bytes) => front::work::per_thread_stream();
    cuMemcpy2D_v2_ptds(copy) => front::work::per_thread_stream();
    cuMemcpy2DUnaligned_v2_ptds(copy) => front::work::per_thread_stream();
    cuMemcpy3D_v2_ptds(copy) => front::work::per_thread_stream();
    cuMemcpy3DPeer_ptds(copy) => front::work::per_thread_stream();
    cuMemsetD8_v2_ptds(dst, value, count) => front::work::per_thread_stream();
    cuMemsetD16_v2_ptds(dst, value, count) => front::work::per_thread_stream();
    cuMemsetD32_v2_ptds(dst, value, count) => front::work::per_thread_stream();
    cuMemsetD2D8_v2_ptds(dst, pitch, value, width, height) => front::work::per_thread_stream();
    cuMemsetD2D16_v2_ptds(dst, pitch, value, width, height) => front::work::per_thread_stream();
    cuMemsetD2D32_v2_ptds(dst, pitch, value, width, height) => front::work::per_thread_stream();
    cuGLMapBufferObject_v2_ptds(ptr, size, buffer) => front::work::per_thread_stream();
}

/// Every driver entry point the shim hands out.
static SERVED: [&[EntryPoint]; 2] = [DRIVER_ENTRY_POINTS, WORK_ENTRY_POINTS];

front::dlsym::export_dlsym!(served_by_dlsym);

/// The shim's function for a `dlsym` lookup the shim serves, else null (the
/// real `dlsym` answers then, also after a panic, which must not cross into C).
unsafe extern "C" fn served_by_dlsym(handle: Handle, name: *const c_char) -> Handle {
    // SAFETY: dlsym's caller passes a NUL-terminated name.
    std::panic::catch_unwind(|| unsafe { front::dlsym::served_lookup(handle, name, &SERVED) }).unwrap_or(std::ptr::null_mut())
}
