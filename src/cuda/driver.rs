//! The real CUDA driver behind the core's [`Gpu`] interface: one safe method
//! per driver call.
//!
//! The allocator core speaks only to the driver: its calls never touch the
//! runtime's per-thread last error, and they work the same whether the program
//! links the runtime dynamically or statically.

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys::{
    CUdevice_attribute, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationHandleType,
    CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPoolProps, CUmemPool_attribute,
    CUresult,
};

use super::gpu::{Context, CuError, CuResult, Event, Gpu, Pool, PoolCounter, Stream};
use super::real::{self, driver as cu};

fn check(code: u32) -> CuResult<()> {
    if code == CUresult::CUDA_SUCCESS as u32 {
        Ok(())
    } else {
        Err(CuError(code))
    }
}

const CU_STREAM_NON_BLOCKING: c_uint = 1;
const CU_EVENT_DISABLE_TIMING: c_uint = 2;

/// Proof that the process has loaded the driver; its methods call it.
pub struct Driver;

/// The driver, if the process has loaded it. Not cached while absent: the
/// runtime loads it lazily, and a later call may find it.
pub fn loaded() -> Option<&'static Driver> {
    real::libcuda().map(|_| &Driver)
}

impl Driver {
    /// The driver's CUDA version (`cuDriverGetVersion`: 13000 for 13.0).
    pub fn version(&self) -> CuResult<i32> {
        let mut version: c_int = 0;
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuDriverGetVersion(&mut version) })?;
        Ok(version)
    }

    /// The row alignment of the real `cuMemAllocPitch` on the current
    /// context's device: the pitch it gives a one-byte row. The row stays
    /// allocated (it goes with the context): freeing it would synchronize the
    /// device, which the program did not ask for. For once per device.
    pub fn pitch_alignment(&self) -> CuResult<u64> {
        let (mut row, mut pitch) = (0u64, 0usize);
        // SAFETY: two out-pointers to locals; element size 4 is always valid.
        check(unsafe { cu::cuMemAllocPitch_v2(&mut row, &mut pitch, 1, 1, 4) })?;
        Ok(pitch as u64)
    }
}

/// Whether a pool policy or threshold attribute is set through an int or a u64.
enum AttributeValue {
    Int(c_int),
    U64(u64),
}

impl Gpu for Driver {
    fn current_context(&self) -> CuResult<Option<Context>> {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuCtxGetCurrent(&mut ctx) })?;
        Ok((!ctx.is_null()).then_some(Context(ctx)))
    }

    /// The ordinal of the current context's device.
    fn current_device(&self) -> CuResult<i32> {
        let mut device: c_int = -1;
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuCtxGetDevice(&mut device) })?;
        Ok(device)
    }

    /// The process-unique ID of a live context: a reset gives the device's
    /// primary context a new one.
    fn context_id(&self, ctx: Context) -> CuResult<u64> {
        let mut id: u64 = 0;
        // SAFETY: `ctx` is live (callers pass the current or a just-retained
        // context); one out-pointer to a local.
        check(unsafe { cu::cuCtxGetId(ctx.0, &mut id) })?;
        Ok(id)
    }

    fn push_context(&self, ctx: Context) -> CuResult<()> {
        // SAFETY: `ctx` is a live context (callers hold it from the driver).
        check(unsafe { cu::cuCtxPushCurrent_v2(ctx.0) })
    }

    fn pop_context(&self) -> CuResult<()> {
        let mut popped: *mut c_void = std::ptr::null_mut();
        // SAFETY: pops the context the caller pushed; one out-pointer to a local.
        check(unsafe { cu::cuCtxPopCurrent_v2(&mut popped) })
    }

    fn synchronize_context(&self) -> CuResult<()> {
        // SAFETY: no arguments; acts on the current context.
        check(unsafe { cu::cuCtxSynchronize() })
    }

    fn supports_pools(&self, device: i32) -> CuResult<bool> {
        let mut value: c_int = 0;
        let attribute = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuDeviceGetAttribute(&mut value, attribute as c_int, device) })?;
        Ok(value != 0)
    }

    fn supports_host_pools(&self, device: i32) -> CuResult<bool> {
        let mut value: c_int = 0;
        let attribute = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED;
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuDeviceGetAttribute(&mut value, attribute as c_int, device) })?;
        Ok(value != 0)
    }

    fn device_count(&self) -> CuResult<i32> {
        let mut count: c_int = 0;
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuDeviceGetCount(&mut count) })?;
        Ok(count)
    }

    fn total_memory(&self, device: i32) -> CuResult<u64> {
        let mut bytes: usize = 0;
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuDeviceTotalMem_v2(&mut bytes, device) })?;
        Ok(bytes as u64)
    }

    fn device_uuid(&self, device: i32) -> CuResult<[u8; 16]> {
        let mut uuid = [0u8; 16];
        // SAFETY: CUuuid is 16 bytes; one out-pointer to a local.
        check(unsafe { cu::cuDeviceGetUuid_v2(uuid.as_mut_ptr().cast(), device) })?;
        Ok(uuid)
    }

    fn active_primary_context(&self, device: i32) -> CuResult<Option<Context>> {
        let (mut flags, mut active): (c_uint, c_int) = (0, 0);
        // SAFETY: two out-pointers to locals. Retaining an inactive primary
        // context would create it (hundreds of milliseconds) for a program
        // that uses contexts of its own.
        check(unsafe { cu::cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) })?;
        if active == 0 {
            return Ok(None);
        }
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context is active, so retain then release leaves it as it was.
        unsafe {
            check(cu::cuDevicePrimaryCtxRetain(&mut ctx, device))?;
            check(cu::cuDevicePrimaryCtxRelease_v2(device))?;
        }
        Ok(Some(Context(ctx)))
    }

    fn create_nonblocking_stream(&self) -> CuResult<Stream> {
        let mut stream: *mut c_void = std::ptr::null_mut();
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuStreamCreate(&mut stream, CU_STREAM_NON_BLOCKING) })?;
        Ok(Stream(stream))
    }

    fn destroy_stream(&self, stream: Stream) -> CuResult<()> {
        // SAFETY: the caller created `stream` and no longer uses it.
        check(unsafe { cu::cuStreamDestroy_v2(stream.0) })
    }

    fn synchronize_stream(&self, stream: Stream) -> CuResult<()> {
        // SAFETY: `stream` is live.
        check(unsafe { cu::cuStreamSynchronize(stream.0) })
    }

    fn is_idle(&self, stream: Stream) -> bool {
        // SAFETY: `stream` is live. Any code but success (not ready, or an
        // error) counts as busy.
        unsafe { cu::cuStreamQuery(stream.0) == CUresult::CUDA_SUCCESS as u32 }
    }

    fn is_capturing(&self, stream: Stream) -> bool {
        const NONE: c_int = 0; // CU_STREAM_CAPTURE_STATUS_NONE
        let mut status: c_int = NONE;
        // SAFETY: `stream` is live; one out-parameter to a local.
        let rc = unsafe { cu::cuStreamIsCapturing(stream.0, &mut status) };
        rc == CUresult::CUDA_SUCCESS as u32 && status != NONE
    }

    /// `waiter` waits, on the GPU, for the event's most recent record.
    fn wait_event(&self, waiter: Stream, event: Event) -> CuResult<()> {
        // SAFETY: both handles are live.
        check(unsafe { cu::cuStreamWaitEvent(waiter.0, event.0, 0) })
    }

    fn stream_context(&self, stream: Stream) -> CuResult<Context> {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: `stream` is live; one out-pointer to a local.
        check(unsafe { cu::cuStreamGetCtx(stream.0, &mut ctx) })?;
        Ok(Context(ctx))
    }

    fn create_event(&self) -> CuResult<Event> {
        let mut event: *mut c_void = std::ptr::null_mut();
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuEventCreate(&mut event, CU_EVENT_DISABLE_TIMING) })?;
        Ok(Event(event))
    }

    fn destroy_event(&self, event: Event) -> CuResult<()> {
        // SAFETY: the caller created `event` and no longer uses it.
        check(unsafe { cu::cuEventDestroy_v2(event.0) })
    }

    fn record(&self, event: Event, stream: Stream) -> CuResult<()> {
        // SAFETY: both handles are live and of the current context.
        check(unsafe { cu::cuEventRecord(event.0, stream.0) })
    }

    /// Whether the GPU has passed the event's most recent record.
    fn has_passed(&self, event: Event) -> bool {
        // SAFETY: `event` is live. Any code but success (not ready, or an
        // error) counts as not passed.
        unsafe { cu::cuEventQuery(event.0) == CUresult::CUDA_SUCCESS as u32 }
    }

    /// Waits on the host until the GPU has passed the event's most recent record.
    fn wait_for(&self, event: Event) -> CuResult<()> {
        // SAFETY: `event` is live.
        check(unsafe { cu::cuEventSynchronize(event.0) })
    }

    /// A pool of device memory on `device`, private to the shim.
    fn create_pool(&self, device: i32) -> CuResult<Pool> {
        create_pool_with(device, CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE)
    }

    /// Shareable through a POSIX file descriptor (measured to cost the same
    /// per allocation as a private pool: docs/FACTS.md, "CUDA IPC").
    fn create_shareable_pool(&self, device: i32) -> CuResult<Pool> {
        create_pool_with(device, POSIX_FILE_DESCRIPTOR)
    }

    fn default_pool(&self, device: i32) -> CuResult<Pool> {
        let mut pool: *mut c_void = std::ptr::null_mut();
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuDeviceGetDefaultMemPool(&mut pool, device) })?;
        Ok(Pool(pool))
    }

    fn create_host_pool(&self, device: i32) -> CuResult<Pool> {
        // SAFETY: as in create_pool.
        let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, id: 0 };
        let mut pool: *mut c_void = std::ptr::null_mut();
        // SAFETY: `props` is a complete description; one out-pointer to a local.
        check(unsafe { cu::cuMemPoolCreate(&mut pool, (&props as *const CUmemPoolProps).cast()) })?;
        let pool = Pool(pool);
        if let Err(e) = self.set_peer_access(pool, device, true) {
            let _ = self.destroy_pool(pool);
            return Err(e);
        }
        Ok(pool)
    }

    fn destroy_pool(&self, pool: Pool) -> CuResult<()> {
        // SAFETY: the caller created `pool`; the driver defers the release
        // until outstanding allocations are gone.
        check(unsafe { cu::cuMemPoolDestroy(pool.0) })
    }

    fn set_release_threshold(&self, pool: Pool, bytes: u64) -> CuResult<()> {
        let attribute = CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        set_pool_attribute(pool, attribute, AttributeValue::U64(bytes))
    }

    fn set_reuse_policies(
        &self,
        pool: Pool,
        follow_event_deps: bool,
        opportunistic: bool,
        internal_deps: bool,
    ) -> CuResult<()> {
        use CUmemPool_attribute::*;
        for (attribute, on) in [
            (CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, follow_event_deps),
            (CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, opportunistic),
            (CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, internal_deps),
        ] {
            set_pool_attribute(pool, attribute, AttributeValue::Int(on as c_int))?;
        }
        Ok(())
    }

    /// A byte-count attribute of the pool (reserved or used, current or high).
    fn pool_bytes(&self, pool: Pool, counter: PoolCounter) -> CuResult<u64> {
        use CUmemPool_attribute::*;
        let attribute = match counter {
            PoolCounter::ReservedNow => CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            PoolCounter::ReservedHigh => CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            PoolCounter::UsedNow => CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            PoolCounter::UsedHigh => CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        };
        let mut value: u64 = 0;
        // SAFETY: the byte-count attributes are u64s; one out-pointer to a local.
        check(unsafe { cu::cuMemPoolGetAttribute(pool.0, attribute as c_int, (&mut value as *mut u64).cast()) })?;
        Ok(value)
    }

    /// Lets `accessor` read and write every block of `pool`, past and future (or no longer).
    fn set_peer_access(&self, pool: Pool, accessor: i32, allowed: bool) -> CuResult<()> {
        let flags = if allowed {
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        } else {
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE
        };
        let desc = CUmemAccessDesc { location: device_location(accessor), flags };
        // SAFETY: one descriptor, passed with count 1.
        check(unsafe { cu::cuMemPoolSetAccess(pool.0, (&desc as *const CUmemAccessDesc).cast(), 1) })
    }

    fn trim(&self, pool: Pool, keep: u64) -> CuResult<()> {
        // SAFETY: `pool` is live.
        check(unsafe { cu::cuMemPoolTrimTo(pool.0, keep as usize) })
    }

    fn reset_used_high(&self, pool: Pool) -> CuResult<()> {
        let mut zero: u64 = 0;
        // SAFETY: the high-water attributes take a u64, which only 0 resets.
        check(unsafe {
            cu::cuMemPoolSetAttribute(pool.0, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH as c_int, (&mut zero as *mut u64).cast())
        })
    }

    fn alloc_from_pool(&self, size: u64, pool: Pool, stream: Stream) -> CuResult<u64> {
        let mut ptr: u64 = 0;
        // SAFETY: live handles; one out-pointer to a local.
        check(unsafe { cu::cuMemAllocFromPoolAsync(&mut ptr, size as usize, pool.0, stream.0) })?;
        Ok(ptr)
    }

    fn free_now(&self, ptr: u64) -> CuResult<()> {
        // SAFETY: `ptr` came from a pool of this driver or from `alloc_now`,
        // and is freed once.
        check(unsafe { cu::cuMemFree_v2(ptr) })
    }

    fn alloc_now(&self, size: u64) -> CuResult<u64> {
        let mut ptr: u64 = 0;
        // SAFETY: one out-pointer to a local.
        check(unsafe { cu::cuMemAlloc_v2(&mut ptr, size as usize) })?;
        Ok(ptr)
    }

    fn free_async(&self, ptr: u64, stream: Stream) -> CuResult<()> {
        // SAFETY: `ptr` came from a pool of this driver and is freed once
        // (the pointer map hands each pointer out for freeing once).
        check(unsafe { cu::cuMemFreeAsync(ptr, stream.0) })
    }
}

/// `CUDA_ERROR_OPERATING_SYSTEM`: a system call the shim made failed.
const OPERATING_SYSTEM: CuError = CuError(304);

/// The shareable-handle type of the shim's pools.
const POSIX_FILE_DESCRIPTOR: CUmemAllocationHandleType = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

fn create_pool_with(device: i32, handle_types: CUmemAllocationHandleType) -> CuResult<Pool> {
    // SAFETY: all-zero is a valid CUmemPoolProps (every enum has a 0 value,
    // the pointer is null); the fields that matter are set below.
    let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = handle_types;
    props.location = device_location(device);
    let mut pool: *mut c_void = std::ptr::null_mut();
    // SAFETY: `props` is a complete description; one out-pointer to a local.
    check(unsafe { cu::cuMemPoolCreate(&mut pool, (&props as *const CUmemPoolProps).cast()) })?;
    Ok(Pool(pool))
}

/// The 64 bytes of `CUmemPoolPtrExportData`.
pub type PointerExport = [u8; 64];

/// CUDA IPC on pool memory, for the IPC front door (not the core's: the
/// allocator never needs them).
impl Driver {
    /// A new file descriptor through which another process imports `pool`.
    pub fn export_pool(&self, pool: Pool) -> CuResult<OwnedFd> {
        let mut fd: c_int = -1;
        // SAFETY: for a POSIX file descriptor the handle is an int, written to a local.
        check(unsafe {
            cu::cuMemPoolExportToShareableHandle((&mut fd as *mut c_int).cast(), pool.0, POSIX_FILE_DESCRIPTOR.0 as c_int, 0)
        })?;
        // SAFETY: the driver made a new descriptor, now ours to close.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Kept for the process's life: a program's child (system, exec)
        // must not inherit a descriptor that opens the whole pool.
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(OPERATING_SYSTEM);
        }
        Ok(fd)
    }

    /// What an importer of the block's pool needs to map the block at `ptr`
    /// (its base address). The block's context must be current, and its pool
    /// exported already (`export_pool`).
    pub fn export_pointer(&self, ptr: u64) -> CuResult<PointerExport> {
        let mut data: PointerExport = [0; 64];
        // SAFETY: the export data is 64 bytes, written to a local.
        check(unsafe { cu::cuMemPoolExportPointer(data.as_mut_ptr().cast(), ptr) })?;
        Ok(data)
    }

    /// The pool another process exported as `fd` (the driver gives the same
    /// pool for every import of one pool). The descriptor stays the caller's.
    pub fn import_pool(&self, fd: BorrowedFd) -> CuResult<Pool> {
        let mut pool: *mut c_void = std::ptr::null_mut();
        // SAFETY: for a POSIX file descriptor the handle is the int itself.
        check(unsafe {
            cu::cuMemPoolImportFromShareableHandle(
                &mut pool,
                fd.as_raw_fd() as usize as *mut c_void,
                POSIX_FILE_DESCRIPTOR.0 as c_int,
                0,
            )
        })?;
        Ok(Pool(pool))
    }

    /// Maps the block that `data` names, from an imported pool. Freed with
    /// `free_now` (the exporter's block stays allocated).
    pub fn import_pointer(&self, pool: Pool, data: &PointerExport) -> CuResult<u64> {
        let mut ptr: u64 = 0;
        // SAFETY: `data` is 64 bytes of export data; one out-pointer to a local.
        check(unsafe { cu::cuMemPoolImportPointer(&mut ptr, pool.0, data.as_ptr().cast()) })?;
        Ok(ptr)
    }

    /// The base address of the allocation that holds `ptr`.
    pub fn allocation_base(&self, ptr: u64) -> CuResult<u64> {
        let (mut base, mut size): (u64, usize) = (0, 0);
        // SAFETY: two out-pointers to locals; any address may be asked about.
        check(unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) })?;
        Ok(base)
    }
}

fn device_location(device: i32) -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device }
}

fn set_pool_attribute(
    pool: Pool,
    attribute: CUmemPool_attribute,
    value: AttributeValue,
) -> CuResult<()> {
    // SAFETY: the driver reads an int for the reuse policies and a u64 for
    // the threshold, as the value's variant is chosen by the callers above.
    unsafe {
        match value {
            AttributeValue::Int(mut v) => {
                check(cu::cuMemPoolSetAttribute(pool.0, attribute as c_int, (&mut v as *mut c_int).cast()))
            }
            AttributeValue::U64(mut v) => {
                check(cu::cuMemPoolSetAttribute(pool.0, attribute as c_int, (&mut v as *mut u64).cast()))
            }
        }
    }
}
