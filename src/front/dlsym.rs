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

use super::driver_door::{self, EntryPoint};
use crate::cuda::real::real_dlsym;

/// Defines the exported `dlsym` (invoked in lib.rs, with the function that
/// answers for the names the shim serves). A naked function, so that it has
/// no frame of its own: the jumps leave the caller's return address in place.
macro_rules! export_dlsym {
    ($served:path) => {
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
                served = sym $served,
                real = sym $crate::cuda::real::REAL_DLSYM,
                fallback = sym $crate::front::dlsym::lookup_before_init,
            )
        }
    };
}
pub(crate) use export_dlsym;

/// The shim's function for `name` in `handle`, or null when the real answer
/// is not one of the driver functions in `served` (or `SOMA_DISABLE=1`).
/// SAFETY: `name` is a NUL-terminated string (dlsym's contract).
pub unsafe fn served_lookup(handle: *mut c_void, name: *const c_char, served: &[&[EntryPoint]]) -> *mut c_void {
    // SAFETY: as the caller promises.
    let name = unsafe { CStr::from_ptr(name) };
    let real = real_dlsym(handle, name);
    match driver_door::substitute(real, served) {
        Some(hook) if hook != real && !super::process::disabled() => {
            log::debug!("dlsym({name:?}): serving the shim's function");
            hook
        }
        _ => std::ptr::null_mut(),
    }
}

/// `dlsym` before the load-time constructor ran: resolve, then answer (the
/// caller's `RTLD_NEXT` is relative to the shim here, an unavoidable edge).
pub extern "C" fn lookup_before_init(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    real_dlsym(handle, unsafe { CStr::from_ptr(name) })
}
