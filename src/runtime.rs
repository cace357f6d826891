//! The real CUDA runtime functions the shim wraps.
//!
//! Each is found with `dlsym(RTLD_NEXT)`: the next definition after the shim,
//! i.e. the runtime the program loaded. A runtime loaded privately by a
//! library (`dlopen` with `RTLD_LOCAL`) is not in that search, so the loaded
//! objects named `libcudart` are searched next. Nothing is ever loaded anew.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use cudarc::runtime::sys::cudaError;

pub const SUCCESS: u32 = cudaError::cudaSuccess as u32;
/// Returned when the program's runtime lacks the function (an older version).
const NOT_SUPPORTED: u32 = cudaError::cudaErrorNotSupported as u32;

/// The address of `name` in the program's runtime, if any.
fn find(name: &CStr) -> Option<usize> {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    let next = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if !next.is_null() {
        return Some(next as usize);
    }
    loaded_runtimes().into_iter().find_map(|path| {
        // SAFETY: RTLD_NOLOAD only returns a library already in the process.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            return None;
        }
        // SAFETY: a live handle and a NUL-terminated name.
        let symbol = unsafe { libc::dlsym(handle, name.as_ptr()) };
        (!symbol.is_null()).then_some(symbol as usize)
    })
}

/// Paths of the loaded objects whose name contains `libcudart`.
fn loaded_runtimes() -> Vec<std::ffi::CString> {
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid entry; `data` is the Vec below.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Vec<std::ffi::CString>)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated path.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) };
            if name.to_bytes().windows(9).any(|w| w == b"libcudart") {
                found.push(name.to_owned());
            }
        }
        0
    }
    let mut found: Vec<std::ffi::CString> = Vec::new();
    // SAFETY: `visit` only reads each entry and appends to `found`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut found as *mut Vec<_>).cast()) };
    found
}

macro_rules! real_functions {
    ($( $symbol:ident ( $($arg:ident : $ty:ty),* ); )*) => {
        $(
            /// The program's own runtime function of this name.
            /// SAFETY: the caller passes what the C function expects.
            #[allow(non_snake_case)]
            pub unsafe fn $symbol($($arg: $ty),*) -> u32 {
                static ADDRESS: OnceLock<Option<usize>> = OnceLock::new();
                let name = concat!(stringify!($symbol), "\0");
                let address = *ADDRESS.get_or_init(|| {
                    find(CStr::from_bytes_with_nul(name.as_bytes()).expect("literal"))
                });
                match address {
                    Some(address) => {
                        // SAFETY: the symbol is the runtime's function with this signature.
                        let f: unsafe extern "C" fn($($ty),*) -> u32 = unsafe { std::mem::transmute(address) };
                        unsafe { f($($arg),*) }
                    }
                    None => NOT_SUPPORTED,
                }
            }
        )*
    };
}

real_functions! {
    cudaMalloc(ptr: *mut *mut c_void, size: usize);
    cudaFree(ptr: *mut c_void);
    cudaFreeAsync(ptr: *mut c_void, stream: *mut c_void);
    cudaGetDevice(device: *mut c_int);
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

/// Leaves the runtime's last error at `cudaErrorInvalidValue`, as a bad free
/// does, by making the real `cudaFree` refuse a host address.
pub fn reproduce_invalid_value() -> u32 {
    let host_byte: c_char = 0;
    // SAFETY: cudaFree only inspects the address and refuses a host pointer.
    unsafe { cudaFree(&host_byte as *const c_char as *mut c_void) }
}
