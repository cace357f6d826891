//! What each hooked function does, for both front doors (the runtime's
//! `cuda*` exports and the driver's `cu*` ones).
//!
//! Each hook decides whether a call is the pool's; if not, `real` (the real
//! function with the caller's arguments) answers, so return codes and the
//! runtime's last error are the real ones. The pool itself is driven through
//! the driver, whose calls leave the runtime's last error alone.

use std::ffi::{c_uint, c_void};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::caller::CallerFilter;
use super::process::{allocator, allocator_if_made, arm_process_handlers};
use crate::core::allocator::alloc::Unserved;
use crate::core::allocator::free::Freed;
use crate::core::allocator::state::Allocator;
use crate::core::config::settings::StatsOutput;
use crate::core::passthrough::Passthrough;
use crate::core::ptrmap::{Memory, MemoryKind};
use crate::core::stats::Timing;
use crate::cuda::driver::{self, Driver};
use crate::cuda::gpu::{Context, Gpu, Stream};
use crate::cuda::real::{IpcMemHandle, SUCCESS};
use crate::peers::{export, import, neighbours, server, snapshot};
use super::driver_door::OUT_OF_MEMORY;

/// `cudaPitchedPtr` and `cudaExtent`, as `cudaMalloc3D` takes them.
pub use cudarc::runtime::sys::{cudaExtent as Extent, cudaPitchedPtr as PitchedPtr};

/// Callers named by `SOMA_PASSTHROUGH_CALLERS`, resolved once per call site.
fn callers() -> &'static CallerFilter {
    static CALLERS: OnceLock<CallerFilter> = OnceLock::new();
    CALLERS.get_or_init(CallerFilter::default)
}

/// `cudaStreamNonBlocking` and `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: c_uint = 1;

/// `cudaMalloc`/`cuMemAlloc`: `out` receives the device address.
/// `make_context_current` is the door's way to create the current context
/// where none is (false: there is none to make); `out_of_memory` returns
/// (and, for the runtime, leaves behind) the error of a failed allocation.
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn malloc(
    out: *mut u64,
    size: usize,
    caller: usize,
    make_context_current: impl FnOnce() -> bool,
    out_of_memory: impl FnOnce() -> u32,
    real: impl FnOnce() -> u32,
) -> u32 {
    let request = Request::Bytes(size as u64);
    // SAFETY: as this function's contract.
    match unsafe { allocate(out, request, caller, make_context_current, out_of_memory, real) } {
        Answer::Pooled { .. } => SUCCESS,
        Answer::Answered(rc) => rc,
    }
}

/// What an allocation asks the pool for.
#[derive(Clone, Copy, Debug)]
enum Request {
    Bytes(u64),
    /// `height` rows of `width` bytes, each starting at a multiple of the
    /// pitch the real `cuMemAllocPitch` gives (`Pitches`).
    Rows { width: u64, height: u64 },
}

/// Who answered an allocation.
enum Answer {
    /// The pool: the address is in the caller's out-pointer; `pitch` is the
    /// row pitch of a `Request::Rows`.
    Pooled { pitch: u64 },
    /// The real function, or the shim's out-of-memory error: this code.
    Answered(u32),
}

/// An allocation from the pool, or from `real` where it is not the pool's
/// (see `malloc`). SAFETY: `out` is null or writable.
unsafe fn allocate(
    out: *mut u64,
    request: Request,
    caller: usize,
    make_context_current: impl FnOnce() -> bool,
    out_of_memory: impl FnOnce() -> u32,
    real: impl FnOnce() -> u32,
) -> Answer {
    let allocator = allocator();
    let _timer = CallTimer::start(allocator, &allocator.stats.alloc_time);
    let bytes = match request {
        Request::Bytes(size) => size,
        Request::Rows { width, height } => width.saturating_mul(height),
    };
    let answer = match pool_alloc(allocator, out.is_null(), request, caller, make_context_current) {
        Ok((ptr, pitch)) => {
            // SAFETY: `out` is non-null here (checked in pool_alloc) and writable.
            unsafe { *out = ptr };
            arm_process_handlers();
            return Answer::Pooled { pitch };
        }
        Err(Unserved::OverMemoryLimit) => {
            log::debug!("allocation {request:?} refused: SOMA_MEMORY_LIMIT");
            // SAFETY: as above; the real allocator leaves NULL on failure too.
            unsafe { *out = 0 };
            out_of_memory()
        }
        Err(Unserved::PassThrough(reason)) => {
            let rc = answered_by_real(allocator, reason, bytes, Some(caller), real);
            if reason == Passthrough::PoolOutOfMemory && rc == SUCCESS {
                let device = driver::loaded().and_then(|d| d.current_device().ok()).unwrap_or(0);
                allocator.stats.device(device).oom_fallbacks.fetch_add(1, Relaxed);
            }
            rc
        }
    };
    // The runtime's cudaErrorMemoryAllocation and the driver's
    // CUDA_ERROR_OUT_OF_MEMORY are both 2.
    if answer == OUT_OF_MEMORY {
        snapshot::out_of_memory(allocator, bytes);
    }
    Answer::Answered(answer)
}

/// An allocation of `bytes` the pool does not serve, for `reason`: the real
/// function answers, and is counted (device memory: under the library of
/// `caller`, the call's return address).
fn answered_by_real(allocator: &Allocator, reason: Passthrough, bytes: u64, caller: Option<usize>, real: impl FnOnce() -> u32) -> u32 {
    log::trace!("allocation of {bytes} bytes passed through: {reason:?}");
    allocator.stats.passed_through(reason, bytes);
    let rc = real();
    if rc == SUCCESS {
        arm_process_handlers();
        // SOMA_DISABLE=1: every call untouched, no caller looked up either.
        if let (Some(caller), false) = (caller, allocator.config.disable) {
            allocator.libraries.passed_through(caller, bytes);
        }
    }
    rc
}

/// An allocation by the program's own allocators (`cuMemAllocAsync`,
/// `cuMemAllocFromPoolAsync`, `cuMemCreate`), which the real function makes:
/// where it finds the device out of memory while the shim holds memory the
/// program freed (free again at once natively), the shim gives that back and
/// the function runs once more.
pub fn with_room(real: impl Fn() -> u32) -> u32 {
    let rc = real();
    if rc != OUT_OF_MEMORY {
        return rc;
    }
    let (Some(allocator), Some(driver)) = (allocator_if_made(), driver::loaded()) else {
        return rc;
    };
    // Disabled, every call is left as it is; during a capture nothing goes
    // back, and a second call would add to the graph.
    if allocator.config.disable || allocator.capture_in_progress() {
        return rc;
    }
    // Tried again even where this thread gave back nothing: the reclaimer
    // may have just released what the program freed.
    let given = allocator.make_room_for_own_allocators(driver);
    log::debug!("the program's own allocation was out of memory: {given} bytes given back for it");
    real()
}

/// `cudaMallocPitch`/`cuMemAllocPitch`: `height` rows of `width` bytes,
/// each row starting `*pitch` bytes after the previous one, the pitch being
/// the one the real function gives (`Pitches`). `element_size_valid`: false
/// for an element size the real `cuMemAllocPitch` refuses (it answers);
/// the rest as for `malloc`. SAFETY: `out` and `pitch` are null or writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn malloc_pitch(
    out: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size_valid: bool,
    caller: usize,
    make_context_current: impl FnOnce() -> bool,
    out_of_memory: impl FnOnce() -> u32,
    real: impl FnOnce() -> u32,
) -> u32 {
    if !element_size_valid || pitch.is_null() {
        let reason = if pitch.is_null() { Passthrough::NullOutPointer } else { Passthrough::InvalidElementSize };
        allocator().stats.passed_through(reason, 0);
        return real();
    }
    let request = Request::Rows { width: width as u64, height: height as u64 };
    // SAFETY: as this function's contract.
    match unsafe { allocate(out, request, caller, make_context_current, out_of_memory, real) } {
        Answer::Pooled { pitch: row_pitch } => {
            // SAFETY: checked non-null above; writable by the C contract.
            unsafe { *pitch = row_pitch as usize };
            SUCCESS
        }
        Answer::Answered(rc) => rc,
    }
}

/// The row pitch of pitched allocations, per device: the width rounded up
/// to the alignment the real `cuMemAllocPitch` uses, learned from it once
/// per device (`Driver::pitch_alignment`) and only for a request the pool
/// will serve.
struct Pitches;

impl Pitches {
    /// The pitch and size of `height` rows of `width` bytes on the current device.
    fn of(driver: &Driver, width: u64, height: u64) -> Result<(u64, u64), Passthrough> {
        static ALIGNMENTS: Mutex<Vec<(i32, u64)>> = Mutex::new(Vec::new());
        let device = driver.current_device().map_err(|_| Passthrough::NoContext)?;
        let mut alignments = ALIGNMENTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let alignment = match alignments.iter().find(|(d, _)| *d == device) {
            Some(&(_, alignment)) => alignment,
            None => {
                let learned = driver.pitch_alignment().map_err(|e| {
                    log::warn!("device {device}: cannot learn the pitch of pitched allocations: {e:?}");
                    Passthrough::PoolError
                })?;
                log::debug!("device {device}: pitched allocations are aligned to {learned} bytes");
                alignments.push((device, learned));
                learned
            }
        };
        let pitch = width.checked_next_multiple_of(alignment).ok_or(Passthrough::SizeOutOfRange)?;
        Ok((pitch, pitch.checked_mul(height).ok_or(Passthrough::SizeOutOfRange)?))
    }
}

/// `cudaMalloc3D`: a pitched allocation of `extent.height * extent.depth`
/// rows of `extent.width` bytes, described in `*out`; the rest as for
/// `malloc_pitch`. SAFETY: `out` is null or writable.
pub unsafe fn malloc_3d(
    out: *mut PitchedPtr,
    extent: Extent,
    caller: usize,
    make_context_current: impl FnOnce() -> bool,
    out_of_memory: impl FnOnce() -> u32,
    real: impl FnOnce() -> u32,
) -> u32 {
    let Some(rows) = extent.height.checked_mul(extent.depth) else {
        allocator().stats.passed_through(Passthrough::SizeOutOfRange, 0);
        return real();
    };
    if out.is_null() {
        allocator().stats.passed_through(Passthrough::NullOutPointer, 0);
        return real();
    }
    let request = Request::Rows { width: extent.width as u64, height: rows as u64 };
    let mut ptr = 0u64;
    // SAFETY: a local as the out-pointer.
    match unsafe { allocate(&mut ptr, request, caller, make_context_current, out_of_memory, real) } {
        Answer::Pooled { pitch } => {
            let described = PitchedPtr { ptr: ptr as *mut c_void, pitch: pitch as usize, xsize: extent.width, ysize: extent.height };
            // SAFETY: checked non-null; writable by the C contract.
            unsafe { *out = described };
            SUCCESS
        }
        Answer::Answered(rc) => rc,
    }
}

/// Adds the host time of one hooked call to `SOMA_STATS`, when it is on.
struct CallTimer<'a> {
    started: Option<(Instant, &'a Timing)>,
}

impl<'a> CallTimer<'a> {
    fn start(allocator: &Allocator, timing: &'a Timing) -> CallTimer<'a> {
        let on = allocator.config.stats != StatsOutput::Off;
        CallTimer { started: on.then(|| (Instant::now(), timing)) }
    }
}

impl Drop for CallTimer<'_> {
    fn drop(&mut self) {
        if let Some((start, timing)) = self.started {
            timing.add(start.elapsed().as_nanos() as u64);
        }
    }
}

/// The pool's answer to `request`: the address and, for rows, their pitch.
/// Every reason to pass through that needs no driver call is checked before
/// the context is made current or a pitch learned.
fn pool_alloc(
    allocator: &Allocator,
    null_out: bool,
    request: Request,
    caller: usize,
    make_context_current: impl FnOnce() -> bool,
) -> Result<(u64, u64), Unserved> {
    let early = match request {
        Request::Bytes(size) => allocator.size_passthrough(size),
        Request::Rows { width, height } if width == 0 || height == 0 => allocator.size_passthrough(0),
        // The size range is checked once the pitch gives the size.
        Request::Rows { .. } => allocator.config.disable.then_some(Passthrough::Disabled),
    };
    if let Some(reason) = early {
        return Err(reason.into());
    }
    if null_out {
        return Err(Passthrough::NullOutPointer.into());
    }
    let listed = &allocator.config.passthrough_callers;
    if !listed.is_empty() && callers().is_listed(caller, listed) {
        return Err(Passthrough::Caller.into());
    }
    if allocator.capture_in_progress() {
        return Err(Passthrough::StreamCapture.into());
    }
    let (driver, context) = driver_and_context(make_context_current)?;
    let (size, pitch) = match request {
        Request::Bytes(size) => (size, 0),
        Request::Rows { width, height } => {
            let (pitch, size) = Pitches::of(driver, width, height)?;
            if let Some(reason) = allocator.size_passthrough(size) {
                return Err(reason.into());
            }
            (size, pitch)
        }
    };
    let ptr = match allocator.alloc(driver, context, size, caller, Memory::Device) {
        Err(Unserved::PassThrough(Passthrough::PoolOutOfMemory)) if neighbours_gave_back(allocator, driver, size) => {
            allocator.alloc(driver, context, size, caller, Memory::Device)
        }
        served => served,
    }?;
    Ok((ptr, pitch))
}

/// `size` bytes found the current device out of memory: whether the other
/// shim processes of this user, asked (`SOMA_NEIGHBOURS`), gave back any.
/// A request larger than the device (a program probing for its limit) asks no one.
fn neighbours_gave_back(allocator: &Allocator, driver: &Driver, size: u64) -> bool {
    if !allocator.config.neighbours {
        return false;
    }
    let Some((ordinal, uuid)) = driver.current_device().ok().and_then(|ordinal| Some((ordinal, allocator.device_uuid(ordinal)?))) else {
        return false;
    };
    if driver.total_memory(ordinal).is_ok_and(|total| size > total) {
        return false;
    }
    let answers = neighbours::ask_to_give_back(&allocator.config, uuid, size);
    log::debug!("device {ordinal}: out of memory for {size} bytes; neighbours: {answers:?}");
    if answers.asked > 0 {
        let counters = allocator.stats.device(ordinal);
        counters.neighbours_asked.fetch_add(1, Relaxed);
        counters.neighbours_gave.fetch_add(answers.given, Relaxed);
    }
    answers.given > 0
}

/// The driver and the current context, made current first where none is.
fn driver_and_context(make_context_current: impl FnOnce() -> bool) -> Result<(&'static Driver, Context), Passthrough> {
    let current = || {
        let driver = driver::loaded()?;
        driver.current_context().ok().flatten().map(|context| (driver, context))
    };
    if let Some(found) = current() {
        return Ok(found);
    }
    if !make_context_current() {
        return Err(Passthrough::NoContext);
    }
    current().ok_or(Passthrough::NoContext)
}

/// `cudaFree`/`cuMemFree`. During a capture the real free either fails (and
/// invalidates the capture) or succeeds whatever the pointer:
/// `real_free_would_fail` asks the real runtime or driver which, without
/// freeing anything, with the block's context current. `invalid_value` returns (and, for the runtime, leaves
/// behind) the error of a bad free.
pub fn free(
    ptr: u64,
    real_free_would_fail: impl FnOnce() -> Option<u32>,
    invalid_value: impl FnOnce() -> u32,
    real: impl FnOnce() -> u32,
) -> u32 {
    free_of(MemoryKind::Device, ptr, real_free_would_fail, invalid_value, real)
}

/// `cudaFreeHost`/`cuMemFreeHost`: as `free`, for pinned host memory
/// (`real_free_would_fail` asks the real host free).
pub fn free_host(
    ptr: u64,
    real_free_would_fail: impl FnOnce() -> Option<u32>,
    invalid_value: impl FnOnce() -> u32,
    real: impl FnOnce() -> u32,
) -> u32 {
    free_of(MemoryKind::Host, ptr, real_free_would_fail, invalid_value, real)
}

fn free_of(
    kind: MemoryKind,
    ptr: u64,
    real_free_would_fail: impl FnOnce() -> Option<u32>,
    invalid_value: impl FnOnce() -> u32,
    real: impl FnOnce() -> u32,
) -> u32 {
    let allocator = allocator();
    let driver = match driver::loaded() {
        Some(driver) if ptr != 0 && !allocator.config.disable => driver,
        _ => return real(),
    };
    let timing = match kind {
        MemoryKind::Device => &allocator.stats.free_time,
        MemoryKind::Host => &allocator.stats.host_free_time,
    };
    let _timer = CallTimer::start(allocator, timing);
    if allocator.capture_in_progress() {
        // Asked in the block's context, as the real free acts there.
        if let Some(context) = allocator.context_of(ptr) {
            if let Ok(Some(error)) = driver.with_context(context, real_free_would_fail) {
                return error;
            }
        }
    }
    finish_free(allocator, driver, allocator.free(driver, ptr, kind), invalid_value, real)
}

/// What a free answers once the core has taken (or refused) the pointer.
fn finish_free(
    allocator: &'static Allocator,
    driver: &'static Driver,
    freed: Freed,
    invalid_value: impl FnOnce() -> u32,
    real: impl FnOnce() -> u32,
) -> u32 {
    match freed {
        Freed::Issued { device } => {
            if allocator.reclaimer.wanted() {
                allocator.start_reclaimer(driver);
            }
            if allocator.config.free_sync {
                allocator.synchronize_device(driver, device);
            }
            SUCCESS
        }
        Freed::Deferred => SUCCESS,
        // The real free refuses a freed pointer, and one of the other kind of memory.
        Freed::DoubleFree | Freed::OtherMemory => invalid_value(),
        Freed::NotOurs => {
            allocator.stats.passed_frees.fetch_add(1, Relaxed);
            real()
        }
    }
}

/// Host allocation flags, the runtime's and the driver's alike
/// (`cudaHostAllocPortable` = `CU_MEMHOSTALLOC_PORTABLE`, ...).
const HOST_PORTABLE: u32 = 1;
const HOST_MAPPED: u32 = 2;
const HOST_WRITE_COMBINED: u32 = 4;

/// `cudaMallocHost`/`cudaHostAlloc`/`cuMemAllocHost`/`cuMemHostAlloc`:
/// pinned host memory, `out` receives its address. `requested`: the flags
/// asked for (`cudaMallocHost`, `cuMemAllocHost`: none). `make_context_current`
/// as for `malloc`.
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn malloc_host(
    out: *mut *mut c_void,
    size: usize,
    requested: u32,
    make_context_current: impl FnOnce() -> bool,
    real: impl FnOnce() -> u32,
) -> u32 {
    let allocator = allocator();
    let _timer = CallTimer::start(allocator, &allocator.stats.host_alloc_time);
    // What `cudaHostGetFlags`/`cuMemHostGetFlags` answer for the real
    // allocation, measured (docs/FACTS.md): every one is mapped.
    let memory = Memory::Host { flags: requested | HOST_MAPPED };
    match pool_alloc_host(allocator, out.is_null(), size as u64, requested, memory, make_context_current) {
        Ok(ptr) => {
            // SAFETY: `out` is non-null here (checked in pool_alloc_host) and writable.
            unsafe { *out = ptr as *mut c_void };
            arm_process_handlers();
            SUCCESS
        }
        Err(reason) => answered_by_real(allocator, reason, size as u64, None, real),
    }
}

fn pool_alloc_host(
    allocator: &Allocator,
    null_out: bool,
    size: u64,
    requested: u32,
    memory: Memory,
    make_context_current: impl FnOnce() -> bool,
) -> Result<u64, Passthrough> {
    if allocator.config.disable {
        return Err(Passthrough::Disabled);
    }
    if !allocator.config.host_pool {
        return Err(Passthrough::HostPoolOff);
    }
    if size == 0 {
        return Err(Passthrough::ZeroSize);
    }
    if null_out {
        return Err(Passthrough::NullOutPointer);
    }
    if requested & !(HOST_PORTABLE | HOST_MAPPED | HOST_WRITE_COMBINED) != 0 {
        return Err(Passthrough::UnknownHostFlags);
    }
    if requested & HOST_WRITE_COMBINED != 0 {
        return Err(Passthrough::WriteCombined);
    }
    if allocator.capture_in_progress() {
        return Err(Passthrough::StreamCapture);
    }
    let (driver, context) = driver_and_context(make_context_current)?;
    allocator.alloc(driver, context, size, 0, memory).map_err(|unserved| match unserved {
        Unserved::PassThrough(reason) => reason,
        // SOMA_MEMORY_LIMIT is of device memory: a host pool is never refused by it.
        Unserved::OverMemoryLimit => Passthrough::PoolError,
    })
}

/// `cudaHostGetFlags`/`cuMemHostGetFlags`: for the shim's pinned host
/// memory, the flags the real allocation would have.
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn host_get_flags(out: *mut c_uint, ptr: u64, real: impl FnOnce() -> u32) -> u32 {
    match allocator().host_block_flags(ptr) {
        Some(flags) if !out.is_null() => {
            // SAFETY: checked non-null; writable by the C contract.
            unsafe { *out = flags };
            SUCCESS
        }
        _ => real(),
    }
}

/// `cudaHostGetDevicePointer`/`cuMemHostGetDevicePointer`: for the shim's
/// pinned host memory, the address itself (measured: the real one answers
/// the host address, for interior addresses too).
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn host_get_device_pointer(out: *mut u64, ptr: u64, flags: c_uint, real: impl FnOnce() -> u32) -> u32 {
    if flags == 0 && !out.is_null() && allocator().host_block_flags(ptr).is_some() {
        // SAFETY: checked non-null; writable by the C contract.
        unsafe { *out = ptr };
        return SUCCESS;
    }
    real()
}

/// `cudaFreeAsync`/`cuMemFreeAsync`: the program frees a pointer itself, in
/// the order of its stream. The real function does it; the map forgets it.
pub fn free_async(ptr: u64, invalid_value: impl FnOnce() -> u32, real: impl FnOnce() -> u32) -> u32 {
    let allocator = allocator();
    if allocator.config.disable {
        return real();
    }
    let mut rc = SUCCESS;
    let freed = allocator.forget(driver::loaded(), ptr, || {
        rc = real();
        rc == SUCCESS
    });
    if matches!(freed, Freed::DoubleFree | Freed::OtherMemory) {
        return invalid_value();
    }
    rc
}

/// Stream creation: non-blocking streams are tracked, since the legacy stream
/// does not order them.
/// SAFETY: when `real` succeeds, `out` holds the new stream.
pub unsafe fn stream_create(out: *mut *mut c_void, flags: c_uint, real: impl FnOnce() -> u32) -> u32 {
    let rc = real();
    let allocator = allocator();
    if rc == SUCCESS && flags & STREAM_NON_BLOCKING != 0 && !allocator.config.disable {
        if let Some(driver) = driver::loaded() {
            // SAFETY: success means the new stream was written to `out`.
            allocator.stream_created(driver, Stream(unsafe { *out }), super::work::tracked(&allocator.config));
        }
    }
    rc
}

/// Stream destruction: the stream's last work stays ordered before later frees.
pub fn stream_destroy(stream: *mut c_void, real: impl FnOnce() -> u32) -> u32 {
    let allocator = allocator();
    if let Some(driver) = driver::loaded().filter(|_| !allocator.config.disable) {
        allocator.stream_destroying(driver, Stream(stream));
    }
    real()
}

/// The stream a `_ptsz` entry point means: NULL there is the per-thread default stream.
pub fn per_thread(stream: *mut c_void) -> *mut c_void {
    const PER_THREAD: usize = 2; // cudaStreamPerThread, CU_STREAM_PER_THREAD
    if stream.is_null() {
        PER_THREAD as *mut c_void
    } else {
        stream
    }
}

/// Beginning a capture: while any capture runs, frees are queued.
pub fn begin_capture(stream: *mut c_void, real: impl FnOnce() -> u32) -> u32 {
    let mut rc = SUCCESS;
    allocator().begin_capture(driver::loaded(), Stream(stream), || {
        rc = real();
        rc == SUCCESS
    });
    rc
}

/// Ending a capture: frees queued during captures are issued once none is left.
pub fn end_capture(stream: *mut c_void, real: impl FnOnce() -> u32) -> u32 {
    allocator().end_capture(driver::loaded(), Stream(stream), real)
}

/// A device reset destroys the device's memory and streams, so the shim
/// forgets its pool and pointers first and makes new ones on next use.
pub fn device_reset(device: Option<i32>, real: impl FnOnce() -> u32) -> u32 {
    let allocator = allocator();
    // No step of the shim's threads (the reclaimer's, then the IPC server's: the fork's
    // order) may touch the device until its pools are forgotten and its context is new.
    let _paused = allocator.reclaimer.pause();
    if let (Some(driver), Some(device)) = (driver::loaded(), device) {
        server::between_steps(|| allocator.device_resetting(driver, device));
    }
    real()
}

/// Peer access enabled (or disabled): once `accessor` may reach `owner`'s
/// memory, `owner`'s pool grants it every block, past and future.
/// `devices` names (owner, accessor) once `real` has succeeded.
pub fn peer_access(allowed: bool, devices: impl FnOnce() -> Option<(i32, i32)>, real: impl FnOnce() -> u32) -> u32 {
    let rc = real();
    let allocator = allocator();
    if rc == SUCCESS && !allocator.config.disable {
        if let (Some(driver), Some((owner, accessor))) = (driver::loaded(), devices()) {
            allocator.peer_access_changed(driver, owner, accessor, allowed);
        }
    }
    rc
}

/// `cudaMemGetInfo`/`cuMemGetInfo`: the driver's figures for the current
/// device, as `SOMA_MEMINFO` and `SOMA_MEMORY_LIMIT` adjust them
/// (`Allocator::memory_info`).
/// SAFETY: `free` and `total` are null or writable, as the C contract requires.
pub unsafe fn mem_get_info(free: *mut usize, total: *mut usize, real: impl FnOnce() -> u32) -> u32 {
    let rc = real();
    let allocator = allocator();
    if rc != SUCCESS || free.is_null() || total.is_null() || !allocator.config.adjusts_memory_info() {
        return rc;
    }
    if let Some(driver) = driver::loaded() {
        if let Ok(device) = driver.current_device() {
            // SAFETY: the real call succeeded and wrote both.
            let (real_free, real_total) = unsafe { (*free as u64, *total as u64) };
            let (shown_free, shown_total) = allocator.memory_info(driver, device, real_free, real_total);
            // SAFETY: as above, both are writable.
            unsafe { (*free, *total) = (shown_free as usize, shown_total as usize) };
        }
    }
    rc
}

/// `cudaIpcGetMemHandle`/`cuIpcGetMemHandle` (see `peers::export`).
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn ipc_get_mem_handle(out: *mut IpcMemHandle, ptr: u64, real: impl FnOnce() -> u32) -> u32 {
    // SAFETY: as this function's contract.
    unsafe { export::get_mem_handle(allocator(), out, ptr, real) }
}

/// `cuIpcOpenMemHandle` (see `peers::import`).
/// SAFETY: `out` is null or writable, as the C contract requires.
pub unsafe fn ipc_open_mem_handle(out: *mut u64, handle: &IpcMemHandle, flags: c_uint, real: impl FnOnce() -> u32) -> u32 {
    // SAFETY: as this function's contract.
    unsafe { import::open_mem_handle(allocator, out, handle, flags, real) }
}

/// `cuIpcCloseMemHandle` (see `peers::import`).
pub fn ipc_close_mem_handle(ptr: u64, real: impl FnOnce() -> u32) -> u32 {
    import::close_mem_handle(ptr, real)
}
