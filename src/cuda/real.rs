//! The real CUDA functions behind the shim's hooks, found, never loaded.
//!
//! Runtime functions: `dlsym(RTLD_NEXT)`, the next definition after the shim,
//! i.e. the runtime the program loaded; a runtime a library loaded privately
//! (`RTLD_LOCAL`) is outside that search, so the loaded objects named
//! `libcudart` are searched next. Driver functions: the `libcuda.so.1`
//! already in the process (`RTLD_NOLOAD`). Lookups go to the real `dlsym`,
//! not the shim's, and each is made once.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

use libloading::os::unix::{Library, RTLD_NOW};

pub const SUCCESS: u32 = 0;
/// `cudaErrorNotSupported` and `CUDA_ERROR_NOT_SUPPORTED` (both 801): the
/// program's CUDA lacks the function (an older version).
pub(crate) const NOT_SUPPORTED: u32 = 801;

/// `CUipcMemHandle` and `cudaIpcMemHandle_t`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcMemHandle(pub [u8; 64]);

/// The real `dlsym`, resolved when the shim is loaded (the exported `dlsym`
/// jumps to it, PC-relative, for every name the shim does not serve).
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Resolves the real `dlsym`: glibc 2.34 moved it into libc proper under a
/// new version; older ones only have the 2.2.5 one.
pub extern "C" fn resolve_real_dlsym() {
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: dlvsym with NUL-terminated strings; RTLD_NEXT from the shim
        // finds libc's definition, not the shim's.
        let real = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !real.is_null() {
            REAL_DLSYM.store(real as usize, Ordering::Release);
            return;
        }
    }
}

#[used]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = resolve_real_dlsym;

/// The real `dlsym`, for the shim's own lookups.
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    if REAL_DLSYM.load(Ordering::Acquire) == 0 {
        resolve_real_dlsym();
    }
    let real = REAL_DLSYM.load(Ordering::Acquire);
    if real == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `real` is libc's dlsym.
    let real: unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void =
        unsafe { std::mem::transmute(real) };
    // SAFETY: a handle from the caller and a NUL-terminated name.
    unsafe { real(handle, name.as_ptr()) }
}

/// The handle of the loaded CUDA driver, if the process has loaded it.
pub fn libcuda() -> Option<*mut c_void> {
    static HANDLE: AtomicUsize = AtomicUsize::new(0);
    let known = HANDLE.load(Ordering::Acquire);
    if known != 0 {
        return Some(known as *mut c_void);
    }
    // SAFETY: RTLD_NOLOAD only finds a library already in the process.
    let lib = unsafe { Library::open(Some("libcuda.so.1"), RTLD_NOW | libc::RTLD_NOLOAD) }.ok()?;
    // The reference is kept for the life of the process: the functions must outlive every caller.
    let handle = lib.into_raw();
    HANDLE.store(handle as usize, Ordering::Release);
    Some(handle)
}

pub(crate) fn find_in_driver(name: &CStr) -> Option<usize> {
    let symbol = real_dlsym(libcuda()?, name);
    (!symbol.is_null()).then_some(symbol as usize)
}

fn find_in_runtime(name: &CStr) -> Option<usize> {
    let next = real_dlsym(libc::RTLD_NEXT, name);
    if !next.is_null() {
        return Some(next as usize);
    }
    loaded_runtimes().into_iter().find_map(|path| {
        // SAFETY: RTLD_NOLOAD only returns a library already in the process.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        let symbol = if handle.is_null() { std::ptr::null_mut() } else { real_dlsym(handle, name) };
        (!symbol.is_null()).then_some(symbol as usize)
    })
}

/// Paths of the loaded objects whose file name contains `libcudart`.
fn loaded_runtimes() -> Vec<CString> {
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid entry; `data` is the Vec below.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Vec<CString>)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated path.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) };
            if name.to_bytes().windows(9).any(|w| w == b"libcudart") {
                found.push(name.to_owned());
            }
        }
        0
    }
    let mut found: Vec<CString> = Vec::new();
    // SAFETY: `visit` only reads each entry and appends to `found`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut found as *mut Vec<CString>).cast()) };
    found
}

/// Defines, for each C function, a Rust function of the same name that calls
/// the real one (found by `$find` on first use), or returns `NOT_SUPPORTED`.
macro_rules! real_functions {
    (find = $find:path; $( $symbol:ident ( $($arg:ident : $ty:ty),* ); )*) => {
        $(
            /// SAFETY: the caller passes what the C function expects.
            #[allow(non_snake_case, clippy::too_many_arguments)] // the C function's own
            pub unsafe fn $symbol($($arg: $ty),*) -> u32 {
                static ADDRESS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
                let mut address = ADDRESS.load(std::sync::atomic::Ordering::Acquire);
                if address == 0 {
                    let name = concat!(stringify!($symbol), "\0");
                    let name = std::ffi::CStr::from_bytes_with_nul(name.as_bytes()).expect("literal");
                    address = $find(name).unwrap_or(0);
                    ADDRESS.store(address, std::sync::atomic::Ordering::Release);
                }
                if address == 0 {
                    return $crate::cuda::real::NOT_SUPPORTED;
                }
                // SAFETY: the symbol is the real function with this signature.
                let f: unsafe extern "C" fn($($ty),*) -> u32 = unsafe { std::mem::transmute(address) };
                unsafe { f($($arg),*) }
            }
        )*
    };
}

pub(crate) use real_functions;

/// The program's runtime.
pub mod runtime {
    use super::*;
    real_functions! {
        find = find_in_runtime;
        cudaMalloc(ptr: *mut *mut c_void, size: usize);
        cudaMallocPitch(ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize);
        cudaMalloc3D(ptr: *mut c_void, extent: cudarc::runtime::sys::cudaExtent);
        cudaFree(ptr: *mut c_void);
        cudaFreeAsync(ptr: *mut c_void, stream: *mut c_void);
        cudaMallocHost(ptr: *mut *mut c_void, size: usize);
        cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint);
        cudaFreeHost(ptr: *mut c_void);
        cudaHostGetFlags(flags: *mut c_uint, ptr: *mut c_void);
        cudaHostGetDevicePointer(device: *mut *mut c_void, host: *mut c_void, flags: c_uint);
        cudaGetDevice(device: *mut c_int);
        cudaMemGetInfo(free: *mut usize, total: *mut usize);
        cudaIpcGetMemHandle(handle: *mut c_void, ptr: *mut c_void);
        cudaDeviceReset();
        cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint);
        cudaDeviceDisablePeerAccess(peer: c_int);
        cudaStreamCreateWithFlags(stream: *mut *mut c_void, flags: c_uint);
        cudaStreamCreateWithPriority(stream: *mut *mut c_void, flags: c_uint, priority: c_int);
        cudaStreamDestroy(stream: *mut c_void);
        cudaStreamBeginCapture(stream: *mut c_void, mode: c_int);
        cudaStreamBeginCaptureToGraph(
            stream: *mut c_void,
            graph: *mut c_void,
            dependencies: *const c_void,
            dependency_data: *const c_void,
            count: usize,
            mode: c_int
        );
        cudaStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void);
        // Per-thread-default-stream builds (`--default-stream per-thread`) call these.
        cudaFreeAsync_ptsz(ptr: *mut c_void, stream: *mut c_void);
        cudaStreamBeginCapture_ptsz(stream: *mut c_void, mode: c_int);
        cudaStreamBeginCaptureToGraph_ptsz(
            stream: *mut c_void,
            graph: *mut c_void,
            dependencies: *const c_void,
            dependency_data: *const c_void,
            count: usize,
            mode: c_int
        );
        cudaStreamEndCapture_ptsz(stream: *mut c_void, graph: *mut *mut c_void);
    }

    /// Leaves the runtime's last error at `cudaErrorInvalidValue`, as a bad
    /// free does, by making the real `cudaFree` refuse a host address.
    pub fn reproduce_invalid_value() -> u32 {
        let host_byte: c_char = 0;
        // SAFETY: cudaFree only inspects the address and refuses a host pointer.
        unsafe { cudaFree(&host_byte as *const c_char as *mut c_void) }
    }

    /// Leaves the runtime's last error at `cudaErrorMemoryAllocation`, as a
    /// failed allocation does, by asking the real `cudaMalloc` for more
    /// memory than any device has (a petabyte).
    pub fn reproduce_out_of_memory() -> u32 {
        let mut never: *mut c_void = std::ptr::null_mut();
        // SAFETY: one out-pointer to a local; the request fails.
        unsafe { cudaMalloc(&mut never, 1 << 50) }
    }
}

/// The driver: the functions the core uses, and those the driver door wraps.
pub mod driver {
    use super::*;
    real_functions! {
        find = find_in_driver;
        cuCtxGetCurrent(ctx: *mut *mut c_void);
        cuDriverGetVersion(version: *mut c_int);
        cuCtxGetDevice(device: *mut c_int);
        cuCtxGetId(ctx: *mut c_void, id: *mut u64);
        cuCtxPushCurrent_v2(ctx: *mut c_void);
        cuCtxPopCurrent_v2(ctx: *mut *mut c_void);
        cuCtxSynchronize();
        cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int);
        cuDeviceTotalMem_v2(bytes: *mut usize, device: c_int);
        cuDeviceGetUuid_v2(uuid: *mut c_void, device: c_int);
        cuDeviceGetCount(count: *mut c_int);
        cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int);
        cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, device: c_int);
        cuDevicePrimaryCtxRelease_v2(device: c_int);
        cuDevicePrimaryCtxGetState(device: c_int, flags: *mut c_uint, active: *mut c_int);
        cuStreamSynchronize(stream: *mut c_void);
        cuStreamQuery(stream: *mut c_void);
        cuStreamWaitEvent(stream: *mut c_void, event: *mut c_void, flags: c_uint);
        cuStreamIsCapturing(stream: *mut c_void, status: *mut c_int);
        cuStreamGetCtx(stream: *mut c_void, ctx: *mut *mut c_void);
        cuEventCreate(event: *mut *mut c_void, flags: c_uint);
        cuEventDestroy_v2(event: *mut c_void);
        cuEventRecord(event: *mut c_void, stream: *mut c_void);
        cuEventQuery(event: *mut c_void);
        cuEventSynchronize(event: *mut c_void);
        cuMemPoolCreate(pool: *mut *mut c_void, props: *const c_void);
        cuMemPoolDestroy(pool: *mut c_void);
        cuMemPoolSetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void);
        cuMemPoolGetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void);
        cuMemPoolSetAccess(pool: *mut c_void, descriptors: *const c_void, count: usize);
        cuMemPoolTrimTo(pool: *mut c_void, keep: usize);
        cuMemAllocFromPoolAsync(ptr: *mut u64, size: usize, pool: *mut c_void, stream: *mut c_void);
        cuMemPoolExportToShareableHandle(handle: *mut c_void, pool: *mut c_void, handle_type: c_int, flags: u64);
        cuMemPoolExportPointer(data: *mut c_void, ptr: u64);
        cuMemPoolImportFromShareableHandle(pool: *mut *mut c_void, handle: *mut c_void, handle_type: c_int, flags: u64);
        cuMemPoolImportPointer(ptr: *mut u64, pool: *mut c_void, data: *const c_void);
        cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, ptr: u64);
        // Wrapped by the driver door (and some used by the core too).
        cuMemAlloc_v2(ptr: *mut u64, size: usize);
        cuMemAllocPitch_v2(ptr: *mut u64, pitch: *mut usize, width: usize, height: usize, element_bytes: c_uint);
        cuMemFree_v2(ptr: u64);
        cuMemAllocAsync(ptr: *mut u64, size: usize, stream: *mut c_void);
        cuMemAllocAsync_ptsz(ptr: *mut u64, size: usize, stream: *mut c_void);
        cuMemAllocFromPoolAsync_ptsz(ptr: *mut u64, size: usize, pool: *mut c_void, stream: *mut c_void);
        cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64);
        cuMemAllocHost_v2(ptr: *mut *mut c_void, size: usize);
        cuMemHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint);
        cuMemFreeHost(ptr: *mut c_void);
        cuMemHostGetFlags(flags: *mut c_uint, ptr: *mut c_void);
        cuMemHostGetDevicePointer_v2(device: *mut u64, host: *mut c_void, flags: c_uint);
        cuMemFreeAsync(ptr: u64, stream: *mut c_void);
        cuMemFreeAsync_ptsz(ptr: u64, stream: *mut c_void);
        cuStreamCreate(stream: *mut *mut c_void, flags: c_uint);
        cuStreamCreateWithPriority(stream: *mut *mut c_void, flags: c_uint, priority: c_int);
        cuStreamDestroy_v2(stream: *mut c_void);
        cuStreamBeginCapture_v2(stream: *mut c_void, mode: c_int);
        cuStreamBeginCapture_v2_ptsz(stream: *mut c_void, mode: c_int);
        cuStreamBeginCaptureToGraph(
            stream: *mut c_void,
            graph: *mut c_void,
            dependencies: *const c_void,
            dependency_data: *const c_void,
            count: usize,
            mode: c_int
        );
        cuStreamBeginCaptureToGraph_ptsz(
            stream: *mut c_void,
            graph: *mut c_void,
            dependencies: *const c_void,
            dependency_data: *const c_void,
            count: usize,
            mode: c_int
        );
        cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void);
        cuStreamEndCapture_ptsz(stream: *mut c_void, graph: *mut *mut c_void);
        cuCtxEnablePeerAccess(peer: *mut c_void, flags: c_uint);
        cuCtxDisablePeerAccess(peer: *mut c_void);
        cuDevicePrimaryCtxReset(device: c_int);
        cuDevicePrimaryCtxReset_v2(device: c_int);
        cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
        cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: u64);
        cuPointerGetAttributes(count: c_uint, attributes: *const c_int, data: *mut *mut c_void, ptr: u64);
        cuIpcGetMemHandle(handle: *mut c_void, ptr: u64);
        cuIpcOpenMemHandle(ptr: *mut u64, handle: IpcMemHandle, flags: c_uint);
        cuIpcOpenMemHandle_v2(ptr: *mut u64, handle: IpcMemHandle, flags: c_uint);
        cuIpcCloseMemHandle(ptr: u64);
        cuGetProcAddress(symbol: *const c_char, function: *mut *mut c_void, version: c_int, flags: u64);
        cuGetProcAddress_v2(
            symbol: *const c_char,
            function: *mut *mut c_void,
            version: c_int,
            flags: u64,
            status: *mut c_int
        );
    }
}
