//! What the allocator core needs from a GPU: opaque handles and one trait.
//!
//! The core is written against [`Gpu`] alone, so that `cargo test` can run it
//! on a simulated GPU (`core::model`) and the shim runs it on the real driver
//! (`cuda::driver`). Every method is one driver operation with the driver's
//! semantics; a driver call never touches the runtime's last error.

use std::ffi::c_void;

/// A driver result code, kept as the integer C returns (an unknown code must
/// not become an invalid Rust enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuError(pub u32);

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const OUT_OF_MEMORY: CuError = CuError(2);

/// `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
pub const CONTEXT_IS_DESTROYED: CuError = CuError(709);

impl CuError {
    pub fn is_out_of_memory(self) -> bool {
        self == OUT_OF_MEMORY
    }
}

pub type CuResult<T> = Result<T, CuError>;

/// Opaque driver handles. They are plain tokens that the driver lets any
/// thread use, so sending them between threads is sound.
macro_rules! handle {
    ($name:ident) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct $name(pub *mut c_void);
        // SAFETY: a driver handle is an opaque token valid from any thread.
        unsafe impl Send for $name {}
        unsafe impl Sync for $name {}
    };
}
handle!(Context);
handle!(Stream);
handle!(Event);
handle!(Pool);

impl Stream {
    /// The legacy default stream of the current context (`CU_STREAM_LEGACY`):
    /// work recorded there waits for all blocking streams.
    #[allow(clippy::manual_dangling_ptr)] // 1 is the driver's CU_STREAM_LEGACY, not an address
    pub const LEGACY: Stream = Stream(1 as *mut c_void);
}

/// A byte count the pool keeps about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolCounter {
    ReservedNow,
    ReservedHigh,
    UsedNow,
    UsedHigh,
}

/// The driver operations the allocator core uses. Streams, events and pools
/// belong to the context current when they were made; the core makes the
/// right one current (`with_context`) before it uses them.
pub trait Gpu {
    fn current_context(&self) -> CuResult<Option<Context>>;
    /// The ordinal of the current context's device.
    fn current_device(&self) -> CuResult<i32>;
    /// The process-unique ID of a live context: a reset gives the device's
    /// primary context a new one.
    fn context_id(&self, ctx: Context) -> CuResult<u64>;
    /// The device's primary context, if it is active; never creates one.
    fn active_primary_context(&self, device: i32) -> CuResult<Option<Context>>;
    fn push_context(&self, ctx: Context) -> CuResult<()>;
    fn pop_context(&self) -> CuResult<()>;
    fn synchronize_context(&self) -> CuResult<()>;

    fn supports_pools(&self, device: i32) -> CuResult<bool>;
    /// Whether `device` can use pools of pinned host memory.
    fn supports_host_pools(&self, device: i32) -> CuResult<bool>;
    fn total_memory(&self, device: i32) -> CuResult<u64>;
    /// The device's UUID: how processes with different device numbers (a
    /// `CUDA_VISIBLE_DEVICES` of their own) name one device.
    fn device_uuid(&self, device: i32) -> CuResult<[u8; 16]>;
    fn device_count(&self) -> CuResult<i32>;

    fn create_nonblocking_stream(&self) -> CuResult<Stream>;
    fn destroy_stream(&self, stream: Stream) -> CuResult<()>;
    fn synchronize_stream(&self, stream: Stream) -> CuResult<()>;
    /// Whether all work issued so far to a non-blocking stream has finished
    /// (an error counts as not).
    fn is_idle(&self, stream: Stream) -> bool;
    /// Whether a capture is in progress on `stream`, or was invalidated
    /// there and not yet ended (an error counts as not capturing: a wait
    /// then issued fails as the program's own call would, where skipping it
    /// could let work run early).
    fn is_capturing(&self, stream: Stream) -> bool;
    fn stream_context(&self, stream: Stream) -> CuResult<Context>;
    /// `waiter` waits, on the GPU, for the event's most recent record.
    fn wait_event(&self, waiter: Stream, event: Event) -> CuResult<()>;

    fn create_event(&self) -> CuResult<Event>;
    fn destroy_event(&self, event: Event) -> CuResult<()>;
    fn record(&self, event: Event, stream: Stream) -> CuResult<()>;
    /// Whether the GPU has passed the event's most recent record (an error
    /// counts as not passed).
    fn has_passed(&self, event: Event) -> bool;
    /// Waits on the host until the GPU has passed the event's most recent record.
    fn wait_for(&self, event: Event) -> CuResult<()>;

    /// A pool of device memory on `device`, private to the shim.
    fn create_pool(&self, device: i32) -> CuResult<Pool>;
    /// `create_pool`, but other processes may import the pool (its blocks
    /// can be shared through CUDA IPC).
    fn create_shareable_pool(&self, device: i32) -> CuResult<Pool>;
    fn default_pool(&self, device: i32) -> CuResult<Pool>;
    /// A pool of pinned host memory, private to the shim, that kernels on
    /// `device` may read and write (a host pool grants no device access by
    /// itself: measured, a kernel touching it faults).
    fn create_host_pool(&self, device: i32) -> CuResult<Pool>;
    fn destroy_pool(&self, pool: Pool) -> CuResult<()>;
    fn set_release_threshold(&self, pool: Pool, bytes: u64) -> CuResult<()>;
    fn set_reuse_policies(&self, pool: Pool, follow_event_deps: bool, opportunistic: bool, internal_deps: bool)
        -> CuResult<()>;
    fn pool_bytes(&self, pool: Pool, counter: PoolCounter) -> CuResult<u64>;
    /// Lets `accessor` read and write every block of `pool`, past and future (or no longer).
    fn set_peer_access(&self, pool: Pool, accessor: i32, allowed: bool) -> CuResult<()>;
    /// Returns the pool's unused memory to the driver until it reserves
    /// less than `keep` bytes (memory in use is never returned).
    fn trim(&self, pool: Pool, keep: u64) -> CuResult<()>;
    /// Starts the pool's used high-water mark again from what it uses now.
    fn reset_used_high(&self, pool: Pool) -> CuResult<()>;
    fn alloc_from_pool(&self, size: u64, pool: Pool, stream: Stream) -> CuResult<u64>;
    /// Frees a pool block in `stream`'s order.
    fn free_async(&self, ptr: u64, stream: Stream) -> CuResult<()>;
    /// Frees a pool block, or a block of `alloc_now`, at once, in no
    /// stream's order.
    fn free_now(&self, ptr: u64) -> CuResult<()>;
    /// A block of `size` bytes from the real allocator (`cuMemAlloc`) in the
    /// current context, usable at once from every stream.
    fn alloc_now(&self, size: u64) -> CuResult<u64>;

    /// Runs `f` with `ctx` current on this thread, restoring the caller's context after.
    fn with_context<T>(&self, ctx: Context, f: impl FnOnce() -> T) -> CuResult<T> {
        self.with_context_from(self.current_context()?, ctx, f)
    }

    /// `with_context` for a caller that has just asked for the `current` context.
    fn with_context_from<T>(&self, current: Option<Context>, ctx: Context, f: impl FnOnce() -> T) -> CuResult<T> {
        if current == Some(ctx) {
            return Ok(f());
        }
        self.push_context(ctx)?;
        let result = f();
        self.pop_context()?;
        Ok(result)
    }
}
