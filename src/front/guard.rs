//! The one wrapper every exported function goes through.
//!
//! It sends a call straight to the real function when the shim is already
//! inside one of its hooks on this thread (the shim's own calls into CUDA are
//! never pooled twice), and when the hook panics: no panic crosses into C, and
//! the program still gets the real behaviour. (Release builds keep unwinding
//! for this reason; `panic = "abort"` would turn a shim bug into a crash.)

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::core::passthrough::Passthrough;

thread_local! {
    static INSIDE_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `hook`, or `real` when re-entered or when `hook` panics.
pub fn guarded<R>(hook: impl FnOnce() -> R, real: impl FnOnce() -> R) -> R {
    // During thread teardown the flag may be gone: treat that as re-entry.
    let entered = INSIDE_HOOK.try_with(|inside| !inside.replace(true)).unwrap_or(false);
    if !entered {
        log::trace!("passing through: {:?}", Passthrough::Reentrant);
        return real();
    }
    let outcome = catch_unwind(AssertUnwindSafe(hook));
    let _ = INSIDE_HOOK.try_with(|inside| inside.set(false));
    match outcome {
        Ok(result) => result,
        Err(_) => {
            log::error!("internal error in a hook (panic caught); using the real function");
            real()
        }
    }
}

/// Runs `hook` even inside another hook, or `real` when it panics: for the
/// entry-point lookups (`cuGetProcAddress`), which call nothing the shim
/// hooks and must answer alike wherever they are asked. A runtime that
/// initialises inside one of the shim's hooks (its first call a hooked
/// `cudaFree(NULL)` or `cudaMalloc`) resolves every driver entry point then,
/// once; a re-entrant lookup answered by the real function would leave it
/// without the shim's driver functions for the life of the process.
pub fn guarded_lookup<R>(hook: impl FnOnce() -> R, real: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(hook)).unwrap_or_else(|_| {
        log::error!("internal error in an entry-point lookup (panic caught); using the real function");
        real()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hook_runs_once_and_nested_calls_go_to_the_real_function() {
        let outer = guarded(|| guarded(|| "hook", || "real (nested)"), || "real");
        assert_eq!(outer, "real (nested)");
        assert_eq!(guarded(|| "hook", || "real"), "hook", "the flag is cleared after a call");
    }

    #[test]
    fn a_lookup_answers_inside_a_hook_too() {
        assert_eq!(guarded(|| guarded_lookup(|| "lookup", || "real"), || "real"), "lookup");
        assert_eq!(guarded_lookup(|| -> u32 { panic!("bug") }, || 7), 7);
    }

    #[test]
    fn a_panicking_hook_falls_back_to_the_real_function() {
        let result = guarded(|| -> u32 { panic!("bug") }, || 7);
        assert_eq!(result, 7);
        assert_eq!(guarded(|| 1, || 2), 1, "the flag is cleared after a panic");
    }
}
