//! Pointer queries (`cuPointerGetAttribute`, `cuPointerGetAttributes`, and
//! the runtime's `cudaPointerGetAttributes`, which reaches them) on memory the
//! shim handed out answer as for the real allocation.
//!
//! The driver answers for the pool allocation behind a block. Measured on an
//! H100 (c_tests/gpu/pointer_ops.cu, docs/FACTS.md), a pool allocation differs
//! from a `cudaMalloc` one in the attributes [`answer`] names: it has no
//! context, names its pool and the pool's handle types, and is not legacy-IPC
//! capable (the shim serves `cudaIpcGetMemHandle` on it where its pool can be
//! shared); pinned memory of a host pool also has no range start. Every other
//! attribute (and `cuMemGetAddressRange`, measured alike), and every pointer
//! that is not a live block of the shim's, keeps the driver's answer. What
//! cannot be answered exactly is listed in docs/CONTRACT.md.

use std::ffi::{c_int, c_uint, c_void};

use crate::core::allocator::state::Allocator;
use crate::cuda::driver;
use crate::cuda::gpu::Context;
use crate::cuda::real::SUCCESS;

use super::process::allocator_if_made;

/// `CUpointer_attribute` values (cuda.h).
const CONTEXT: c_int = 1;
const IS_LEGACY_CUDA_IPC_CAPABLE: c_int = 10;
const RANGE_START_ADDR: c_int = 11;
const ALLOWED_HANDLE_TYPES: c_int = 14;
const MEMPOOL_HANDLE: c_int = 17;

/// What the real allocation answers where a pool allocation answers otherwise.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// A pointer (8 bytes).
    Word(u64),
    /// A boolean or a mask of handle types, which the driver writes as an
    /// `int` or wider: every bit that can be set is in its low byte (little
    /// endian), so writing that byte alone changes no byte the driver did not write.
    LowByte(u8),
}

/// A live block of the shim's, as a query needs it.
struct Found {
    base: u64,
    /// The primary context of the block's device (`None` if not known).
    context: Option<Context>,
    /// The shim serves `cudaIpcGetMemHandle` on it: its pool can be shared.
    ipc_capable: bool,
}

/// The real allocation's answer to `attribute` for `found`, where it differs
/// from the pool's.
fn answer(attribute: c_int, found: &Found) -> Option<Answer> {
    match attribute {
        CONTEXT => found.context.map(|context| Answer::Word(context.0 as u64)),
        IS_LEGACY_CUDA_IPC_CAPABLE if found.ipc_capable => Some(Answer::LowByte(1)),
        RANGE_START_ADDR => Some(Answer::Word(found.base)),
        ALLOWED_HANDLE_TYPES => Some(Answer::LowByte(0)),
        MEMPOOL_HANDLE => Some(Answer::Word(0)),
        _ => None,
    }
}

fn patched(attribute: c_int) -> bool {
    matches!(attribute, CONTEXT | IS_LEGACY_CUDA_IPC_CAPABLE | RANGE_START_ADDR | ALLOWED_HANDLE_TYPES | MEMPOOL_HANDLE)
}

/// The live block of the shim's holding `ptr`. The driver finds the pool
/// allocation (a block is one, for pinned memory too), the map says whose.
fn shim_block(allocator: &Allocator, ptr: u64) -> Option<Found> {
    let base = driver::loaded()?.allocation_base(ptr).ok()?;
    let block = allocator.live_block(base)?;
    let ipc_capable = !block.memory.is_host() && allocator.shareable_pool(block.device, block.size).is_some();
    Some(Found { base, context: allocator.device_context(block.device), ipc_capable })
}

/// SAFETY: `data` is what the caller passed for the answered attribute,
/// written by the real call just now, so it holds at least the answer's width.
unsafe fn write(data: *mut c_void, answer: Answer) {
    match answer {
        // SAFETY: pointer-valued attributes are 8 bytes; the caller's buffer
        // need not be aligned.
        Answer::Word(value) => unsafe { data.cast::<u64>().write_unaligned(value) },
        // SAFETY: every attribute is at least one byte wide.
        Answer::LowByte(value) => unsafe { data.cast::<u8>().write(value) },
    }
}

/// `cuPointerGetAttribute`.
/// SAFETY: the arguments are as the C function requires.
pub unsafe fn get_attribute(data: *mut c_void, attribute: c_int, ptr: u64, real: impl FnOnce() -> u32) -> u32 {
    let rc = real();
    if rc != SUCCESS || !patched(attribute) {
        return rc;
    }
    let answered = allocator_if_made().and_then(|allocator| answer(attribute, &shim_block(allocator, ptr)?));
    if let Some(answer) = answered {
        // SAFETY: the real call succeeded on `data` for this attribute.
        unsafe { write(data, answer) };
    }
    rc
}

/// `cuPointerGetAttributes`.
/// SAFETY: the arguments are as the C function requires: `count` entries in
/// `attributes` and in `data` (each null or valid for its attribute).
pub unsafe fn get_attributes(
    count: c_uint,
    attributes: *const c_int,
    data: *mut *mut c_void,
    ptr: u64,
    real: impl FnOnce() -> u32,
) -> u32 {
    let rc = real();
    if rc != SUCCESS || count == 0 || attributes.is_null() || data.is_null() {
        return rc;
    }
    // SAFETY: the real call accepted `count` entries in each array.
    let (attributes, data) =
        unsafe { (std::slice::from_raw_parts(attributes, count as usize), std::slice::from_raw_parts(data, count as usize)) };
    if !attributes.iter().copied().any(patched) {
        return rc;
    }
    if let Some(found) = allocator_if_made().and_then(|allocator| shim_block(allocator, ptr)) {
        for (&attribute, &slot) in attributes.iter().zip(data) {
            if let (false, Some(answer)) = (slot.is_null(), answer(attribute, &found)) {
                // SAFETY: the real call succeeded, writing each non-null slot.
                unsafe { write(slot, answer) };
            }
        }
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(ipc_capable: bool) -> Found {
        Found { base: 0x1000, context: Some(Context(0x1234 as *mut c_void)), ipc_capable }
    }

    #[test]
    fn a_device_block_answers_as_cuda_malloc_memory() {
        let device = found(true);
        assert_eq!(answer(CONTEXT, &device), Some(Answer::Word(0x1234)));
        assert_eq!(answer(IS_LEGACY_CUDA_IPC_CAPABLE, &device), Some(Answer::LowByte(1)));
        assert_eq!(answer(RANGE_START_ADDR, &device), Some(Answer::Word(0x1000)));
        assert_eq!(answer(ALLOWED_HANDLE_TYPES, &device), Some(Answer::LowByte(0)));
        assert_eq!(answer(MEMPOOL_HANDLE, &device), Some(Answer::Word(0)));
    }

    #[test]
    fn attributes_a_pool_answers_alike_keep_the_drivers_answer() {
        let device = found(true);
        for attribute in [2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 15, 16, 18, 19, 20, 21] {
            assert!(!patched(attribute), "attribute {attribute}");
            assert_eq!(answer(attribute, &device), None, "attribute {attribute}");
        }
    }

    #[test]
    fn a_block_the_shim_cannot_share_keeps_the_drivers_legacy_ipc_answer() {
        // A pool that cannot be shared (SOMA_POOL=default), or pinned memory:
        // cudaIpcGetMemHandle on it fails under the shim, so the driver's 0 stands.
        let unshared = found(false);
        assert_eq!(answer(IS_LEGACY_CUDA_IPC_CAPABLE, &unshared), None);
        assert_eq!(answer(RANGE_START_ADDR, &unshared), Some(Answer::Word(0x1000)));
    }

    #[test]
    fn an_unknown_context_is_left_as_the_driver_gave_it() {
        let mut device = found(true);
        device.context = None;
        assert_eq!(answer(CONTEXT, &device), None);
    }

    #[test]
    fn a_low_byte_answer_sets_an_int_and_clears_a_mask() {
        let mut int: i32 = 0;
        // SAFETY: a local i32.
        unsafe { write((&mut int as *mut i32).cast(), Answer::LowByte(1)) };
        assert_eq!(int, 1);
        let mut mask: u64 = 1;
        // SAFETY: a local u64.
        unsafe { write((&mut mask as *mut u64).cast(), Answer::LowByte(0)) };
        assert_eq!(mask, 0);
    }
}
