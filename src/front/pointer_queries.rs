//! Pointer queries (`cuPointerGetAttribute`, `cuPointerGetAttributes`,
//! `cuMemGetAddressRange`, and the runtime's `cudaPointerGetAttributes`,
//! which reaches them) on memory the shim handed out answer as for the real
//! allocation.
//!
//! The driver answers for the pool allocation behind a block. Measured on an
//! H100 (c_tests/gpu/pointer_ops.cu), a pool allocation differs from a
//! `cudaMalloc` one in the attributes [`answer`] names: it has no context,
//! names its pool and the pool's handle types, and is not legacy-IPC capable
//! (the shim serves `cudaIpcGetMemHandle` on it). Every other attribute, and
//! every pointer that is not a live block of the shim's, keeps the driver's
//! answer. What cannot be answered exactly is listed in docs/CONTRACT.md.

use std::ffi::{c_int, c_uint, c_void};

use crate::core::ptrmap::Block;
use crate::cuda::gpu::Context;
use crate::cuda::driver;
use crate::cuda::real::SUCCESS;

use super::process::allocator_if_made;

/// `CUpointer_attribute` values (cuda.h).
const CONTEXT: c_int = 1;
const IS_LEGACY_CUDA_IPC_CAPABLE: c_int = 10;
const RANGE_START_ADDR: c_int = 11;
const RANGE_SIZE: c_int = 12;
const ALLOWED_HANDLE_TYPES: c_int = 14;
const MEMPOOL_HANDLE: c_int = 17;

/// What the real allocation answers where a pool allocation answers otherwise.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// A pointer or size (8 bytes).
    Word(u64),
    /// A boolean or a bit mask of handle types: the driver wrote it in the
    /// caller's width (an `int`, or a `bool`); its low byte holds every bit
    /// that can be set, so writing that byte alone fits any width.
    LowByte(u8),
}

/// The real allocation's answer to `attribute` for `block`, which starts at
/// `base` and belongs to `context`, where it differs from the pool's.
fn answer(attribute: c_int, base: u64, block: &Block, context: Option<Context>) -> Option<Answer> {
    match attribute {
        CONTEXT => context.map(|context| Answer::Word(context.0 as u64)),
        IS_LEGACY_CUDA_IPC_CAPABLE if !block.memory.is_host() => Some(Answer::LowByte(1)),
        RANGE_START_ADDR => Some(Answer::Word(base)),
        RANGE_SIZE => Some(Answer::Word(block.size)),
        ALLOWED_HANDLE_TYPES => Some(Answer::LowByte(0)),
        MEMPOOL_HANDLE => Some(Answer::Word(0)),
        _ => None,
    }
}

fn patched(attribute: c_int) -> bool {
    matches!(attribute, CONTEXT | IS_LEGACY_CUDA_IPC_CAPABLE | RANGE_START_ADDR | RANGE_SIZE | ALLOWED_HANDLE_TYPES | MEMPOOL_HANDLE)
}

/// The live block of the shim's holding `ptr`: its start and itself. The
/// driver finds the pool allocation (a block is one), the map says whose.
fn shim_block(ptr: u64) -> Option<(u64, Block, Option<Context>)> {
    let allocator = allocator_if_made()?;
    let base = driver::loaded()?.allocation_base(ptr).ok()?;
    let block = allocator.live_block(base)?;
    Some((base, block, allocator.context_of(base)))
}

/// SAFETY: `data` is what the caller passed for `attribute`, written by the
/// real call just now, so it is valid for the attribute's width.
unsafe fn write(data: *mut c_void, answer: Answer) {
    match answer {
        // SAFETY: pointer- and size-valued attributes are 8 bytes; the caller's
        // buffer need not be aligned.
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
    if let Some((base, block, context)) = shim_block(ptr) {
        if let Some(answer) = answer(attribute, base, &block, context) {
            // SAFETY: the real call succeeded on `data` for this attribute.
            unsafe { write(data, answer) };
        }
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
    if let Some((base, block, context)) = shim_block(ptr) {
        for (&attribute, &slot) in attributes.iter().zip(data) {
            if let (false, Some(answer)) = (slot.is_null(), answer(attribute, base, &block, context)) {
                // SAFETY: the real call succeeded, writing each non-null slot.
                unsafe { write(slot, answer) };
            }
        }
    }
    rc
}

/// `cuMemGetAddressRange`: the block's own start and size (the pool
/// allocation behind a block kept for reuse may be larger than the request
/// it now serves).
/// SAFETY: `base` and `size` are null or writable, as the C contract requires.
pub unsafe fn get_address_range(base: *mut u64, size: *mut usize, ptr: u64, real: impl FnOnce() -> u32) -> u32 {
    let rc = real();
    if rc != SUCCESS {
        return rc;
    }
    if let Some((start, block, _)) = shim_block(ptr) {
        // SAFETY: non-null out-pointers are writable by the C contract.
        unsafe {
            if !base.is_null() {
                *base = start;
            }
            if !size.is_null() {
                *size = block.size as usize;
            }
        }
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ptrmap::Memory;

    fn block(memory: Memory) -> Block {
        Block { device: 0, size: 200, caller: 0, memory }
    }

    #[test]
    fn a_device_block_answers_as_cuda_malloc_memory() {
        let device = block(Memory::Device);
        let context = Some(Context(0x1234 as *mut c_void));
        assert_eq!(answer(CONTEXT, 0x1000, &device, context), Some(Answer::Word(0x1234)));
        assert_eq!(answer(IS_LEGACY_CUDA_IPC_CAPABLE, 0x1000, &device, context), Some(Answer::LowByte(1)));
        assert_eq!(answer(RANGE_START_ADDR, 0x1000, &device, context), Some(Answer::Word(0x1000)));
        assert_eq!(answer(RANGE_SIZE, 0x1000, &device, context), Some(Answer::Word(200)));
        assert_eq!(answer(ALLOWED_HANDLE_TYPES, 0x1000, &device, context), Some(Answer::LowByte(0)));
        assert_eq!(answer(MEMPOOL_HANDLE, 0x1000, &device, context), Some(Answer::Word(0)));
    }

    #[test]
    fn attributes_a_pool_answers_alike_keep_the_drivers_answer() {
        let device = block(Memory::Device);
        for attribute in [2, 3, 4, 7, 8, 9, 13, 15, 16, 18, 19, 20, 21] {
            assert!(!patched(attribute), "attribute {attribute}");
            assert_eq!(answer(attribute, 0x1000, &device, None), None, "attribute {attribute}");
        }
    }

    #[test]
    fn pinned_host_blocks_keep_the_drivers_legacy_ipc_answer() {
        let host = block(Memory::Host { flags: 2 });
        assert_eq!(answer(IS_LEGACY_CUDA_IPC_CAPABLE, 0x1000, &host, None), None);
        assert_eq!(answer(RANGE_START_ADDR, 0x1000, &host, None), Some(Answer::Word(0x1000)));
    }

    #[test]
    fn an_unknown_context_is_left_as_the_driver_gave_it() {
        assert_eq!(answer(CONTEXT, 0x1000, &block(Memory::Device), None), None);
    }

    #[test]
    fn a_low_byte_answer_fits_an_int_and_a_bool() {
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
