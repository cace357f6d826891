//! The exported `dlsym`: how a statically linked CUDA runtime finds the driver.
//!
//! The static runtime looks up `cuGetProcAddress_v2` in libcuda with `dlsym`
//! and then asks that function for every driver entry point. The shim's
//! `dlsym` hands back the shim's function wherever the real answer is one of
//! the driver functions the shim serves (see `driver_door`).
//!
//! The entry point is a few instructions of assembly so that every lookup the
//! shim does not serve is a *tail jump* into the real `dlsym`: the real one
//! then sees the original caller's return address, so `RTLD_NEXT` keeps its
//! meaning (a Rust frame in between would make "next" relative to the shim),
//! and no Rust code runs for the thousands of lookups programs make. Only
//! names starting with "cu" reach Rust, and only for a real handle.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The real `dlsym`, resolved when the shim is loaded (not exported: the
/// assembly reaches it PC-relative).
static SOMASHIM_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// The exported `dlsym`. A naked function, so that it has no frame of its
/// own: the jumps below leave the caller's return address in place.
///
/// SAFETY: called with dlsym's C arguments (rdi = handle, rsi = name).
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        // RTLD_NEXT (-1), or a name not starting with "cu": straight to the real one.
        "cmp rdi, -1",
        "je 2f",
        "cmp byte ptr [rsi], 0x63",
        "jne 2f",
        "cmp byte ptr [rsi + 1], 0x75",
        "jne 2f",
        // Ask Rust whether the shim serves it; keep the arguments for the real call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {served}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        // Called before the constructor ran (another library's constructor).
        "3:",
        "jmp {fallback}",
        served = sym served_lookup,
        real = sym SOMASHIM_REAL_DLSYM,
        fallback = sym lookup_before_init,
    )
}

/// Resolves the real `dlsym` at load time: glibc 2.34 moved it into libc
/// proper under a new version; older ones only have the 2.2.5 one.
extern "C" fn resolve_real_dlsym() {
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: dlvsym with NUL-terminated strings; RTLD_NEXT from the shim
        // finds libc's definition, not this one.
        let real = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !real.is_null() {
            SOMASHIM_REAL_DLSYM.store(real as usize, Ordering::Release);
            return;
        }
    }
}

#[used]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = resolve_real_dlsym;

/// The real `dlsym`, for the shim's own lookups.
pub fn real_dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    if SOMASHIM_REAL_DLSYM.load(Ordering::Acquire) == 0 {
        resolve_real_dlsym();
    }
    let real = SOMASHIM_REAL_DLSYM.load(Ordering::Acquire);
    if real == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `real` is libc's dlsym.
    let real: unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void =
        unsafe { std::mem::transmute(real) };
    // SAFETY: a handle from the caller and a NUL-terminated name.
    unsafe { real(handle, name.as_ptr()) }
}

/// The shim's function for `name` in `handle`, or null when the real answer
/// is not a driver function the shim serves.
extern "C" fn served_lookup(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) };
    let real = real_dlsym(handle, name);
    match crate::driver_door::substitute(real) {
        Some(hook) if hook != real => {
            log::debug!("dlsym({name:?}): serving the shim's function");
            hook
        }
        _ => std::ptr::null_mut(),
    }
}

/// `dlsym` before the load-time constructor ran: resolve, then answer (the
/// caller's `RTLD_NEXT` is relative to the shim here, an unavoidable edge).
extern "C" fn lookup_before_init(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    real_dlsym(handle, unsafe { CStr::from_ptr(name) })
}
