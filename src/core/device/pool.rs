//! One device's pool: its set-up, allocations from it, what it holds, and
//! its teardown at a reset. How frees are ordered before its blocks are
//! handed out again: `ordering`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use super::budget::{Holding, PeakWindow, Source};
use crate::core::config::settings::{Config, FreeOrder, LegacyCache, PoolChoice};
use crate::core::decay::Window;
use crate::core::locks::{lock, Padded};
use crate::core::pending::{Keep, PendingFrees};
use crate::core::ptrmap::PointerMap;
use crate::core::stats::PoolPeaks;
use crate::core::streams::Observer;
use crate::core::turns::Turns;
use crate::cuda::gpu::{Context, CuError, CuResult, Event, Gpu, Pool, PoolCounter, Stream};

pub struct Device {
    pub ordinal: i32,
    /// A pool of pinned host memory (for the device `ordinal`), not of device memory.
    pub host: bool,
    pub context: Context,
    /// The device's UUID, by which other processes name it.
    pub uuid: [u8; 16],
    /// `context`'s ID when the pool was set up: a different one means the
    /// device was reset, maybe by a path the shim does not see.
    pub context_id: u64,
    pub(super) pool: Pool,
    pub(super) owns_pool: bool,
    /// Blocks of at most `SOMA_SMALL_BLOCKS` bytes come from a pool of their
    /// own (the shim's): those the cache holds would otherwise keep `pool`
    /// from reusing the memory around them (measured, docs/BENCHMARKS.md).
    pub(super) small_pool: Option<Pool>,
    /// The pools were made shareable with other processes (CUDA IPC).
    pub(super) shareable: bool,
    /// Allocations, and returns of blocks whose work is done; nothing else.
    pub(super) pool_stream: Stream,
    /// Waits for the work before each batch of frees; its done events pass in order.
    pub(super) join_stream: Stream,
    /// No non-blocking stream at the last free, or barrier order:
    /// allocations and frees go on the legacy stream.
    pub(super) on_legacy_stream: AtomicBool,
    /// A batch was ordered behind a barrier since the host last waited for
    /// the legacy stream: its blocks may be handed out (from the cache, or
    /// from the pool on the legacy stream) while their old work runs, so
    /// allocations go on the legacy stream to reuse them in its order, and a
    /// non-blocking stream made now must wait for that stream's work first.
    pub(super) reusing_barrier_frees: AtomicBool,
    /// Recorded on the legacy stream where a non-blocking stream must wait
    /// for the work before frees made there (see `leave_legacy_stream`).
    pub(super) legacy_free_mark: Event,
    /// A stream made during a capture waited for the mark on the GPU only:
    /// the legacy-stream work it covers may still run, so every stream made
    /// later waits for it too, until the host has waited for it.
    pub(super) mark_waited_on_gpu_only: AtomicBool,
    /// Threads waiting on the host for the mark (`wait_for_new_stream`):
    /// until they are done, the blocks it covers may still be in use, so a
    /// stream made meanwhile waits for it too.
    pub(super) mark_waiters: AtomicUsize,
    /// The program freed one of the pool's blocks itself (`cudaFreeAsync`)
    /// while a capture was in progress: the ordering that free needs
    /// (`order_before_program_free`) is owed until the last capture ends.
    pub(super) program_free_order_owed: AtomicBool,
    /// The program freed one of the pool's blocks itself since the host last
    /// waited for the legacy stream's mark: the pool may hand it out on the
    /// legacy stream while the work before that free runs, so a non-blocking
    /// stream made now must wait for that work (`leave_legacy_stream`).
    pub(super) program_freed_since_mark: AtomicBool,
    pub(super) order: FreeOrder,
    pub(super) internal_deps: bool,
    pub(super) pending_free_limit: u64,
    /// `SOMA_LEGACY_CACHE`: when a free with only blocking streams keeps its block.
    pub(super) legacy_cache: LegacyCache,
    /// Which threads free, for `LegacyCache::Auto` (written while they take
    /// turns: a line of its own).
    pub(super) turns: Padded<Turns>,
    /// `SOMA_MEMORY_LIMIT`: the most the pool may reserve, if limited.
    pub(super) memory_limit: Option<u64>,
    /// Frees queued, joined or cached, and the blocks they become.
    pub(super) pending: PendingFrees,
    /// The large blocks (`SOMA_LARGE_BLOCKS`) of the real allocator the
    /// shim holds (in use, pending or cached), by address.
    pub(super) segments: Mutex<HashMap<u64, Segment>>,
    /// Large blocks out of the cache, waiting for the real free
    /// (`release_segments`), which a thread does holding no lock but the
    /// captures' (for reading) and `releasing`.
    pub(super) segments_to_release: Mutex<Vec<u64>>,
    /// Bytes of `segments`.
    pub(super) segment_bytes: AtomicU64,
    /// Held by the thread releasing large blocks (`release_segments`).
    pub(super) releasing: Mutex<()>,
    /// The decay's checks (`SOMA_DECAY_MS`, `SOMA_IDLE_MS`; None: never).
    pub(super) decay: Mutex<Option<Window>>,
    /// Held while the pools are trimmed (`release.rs`).
    pub(super) trimming: Mutex<()>,
    /// Each pool's used high-water mark before the decay last started it
    /// again: the peak the statistics report.
    pub(super) used_high_before: [AtomicU64; 2],
    /// The program's highest use of the device since the decay's last check.
    pub(super) in_use_high: AtomicU64,
    /// The program's peak use over the decay's last checks (`peaks`).
    pub(super) recent_peak: AtomicU64,
    pub(super) peaks: Mutex<PeakWindow>,
}

/// A large block of the real allocator.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub size: u64,
    /// Exported through the real CUDA IPC: another process may map it, so
    /// it is never handed out again; its free is the real one.
    pub exported: bool,
}

/// Why an allocation did not come from the pool.
#[derive(Debug, PartialEq, Eq)]
pub enum AllocFailure {
    OutOfMemory,
    /// The pool would reserve more than `SOMA_MEMORY_LIMIT`.
    OverLimit,
    Driver(CuError),
}

impl AllocFailure {
    /// What a failed driver allocation means.
    fn of(e: CuError) -> AllocFailure {
        if e.is_out_of_memory() {
            AllocFailure::OutOfMemory
        } else {
            AllocFailure::Driver(e)
        }
    }
}

impl Device {
    /// Sets up the pool of `ordinal` (`host`: its pool of pinned host
    /// memory), whose primary context is current. The shim's own device pool
    /// is created shareable, for CUDA IPC, where the driver allows it.
    pub fn create(driver: &impl Gpu, ordinal: i32, context: Context, config: &Config, host: bool) -> CuResult<Device> {
        let (pool, owns_pool, shareable) = match config.pool {
            _ if host => (driver.create_host_pool(ordinal)?, true, false),
            PoolChoice::Own => match driver.create_shareable_pool(ordinal) {
                Ok(pool) => (pool, true, true),
                Err(e) => {
                    log::info!("device {ordinal}: no shareable pool ({e:?}): CUDA IPC on its blocks passes through");
                    (driver.create_pool(ordinal)?, true, false)
                }
            },
            PoolChoice::Default => (driver.default_pool(ordinal)?, false, false),
        };
        let total = driver.total_memory(ordinal)?;
        let configure = |pool: Pool| -> CuResult<Pool> {
            driver.set_release_threshold(pool, config.release_threshold.resolve(total))?;
            driver.set_reuse_policies(pool, config.reuse_follow_event_deps, config.reuse_opportunistic, config.reuse_internal_deps)?;
            Ok(pool)
        };
        configure(pool)?;
        let small_pool = if owns_pool && !host && config.small_blocks > 0 {
            let made = if shareable { driver.create_shareable_pool(ordinal) } else { driver.create_pool(ordinal) };
            match made.and_then(|small| {
                configure(small).inspect_err(|_| {
                    let _ = driver.destroy_pool(small);
                })
            }) {
                Ok(small) => Some(small),
                Err(e) => {
                    log::info!("device {ordinal}: no pool for small blocks ({e:?}): one pool serves every size");
                    None
                }
            }
        } else {
            None
        };
        let memory_limit = Some(config.memory_limit.resolve(total)).filter(|&limit| !host && limit < total);
        Ok(Device {
            ordinal,
            host,
            context,
            uuid: driver.device_uuid(ordinal)?,
            context_id: driver.context_id(context)?,
            pool,
            owns_pool,
            small_pool,
            shareable,
            pool_stream: driver.create_nonblocking_stream()?,
            join_stream: driver.create_nonblocking_stream()?,
            // Until a free has seen the streams, allocations stay off the legacy stream.
            on_legacy_stream: AtomicBool::new(false),
            reusing_barrier_frees: AtomicBool::new(false),
            legacy_free_mark: driver.create_event()?,
            mark_waited_on_gpu_only: AtomicBool::new(false),
            mark_waiters: AtomicUsize::new(0),
            program_free_order_owed: AtomicBool::new(false),
            program_freed_since_mark: AtomicBool::new(false),
            // The CPU writes a host block at once: only the host's own
            // observation of a passed free makes it safe to hand out.
            order: if host { FreeOrder::Join } else { config.free_order },
            internal_deps: config.reuse_internal_deps,
            pending_free_limit: config.pending_free_limit.resolve(total),
            legacy_cache: config.legacy_cache,
            turns: Padded::default(),
            memory_limit,
            pending: PendingFrees::new(
                if small_pool.is_some() { config.small_blocks } else { 0 },
                // Not where a limit counts the pool's bytes, nor in the
                // program's own pool, whose attributes it may read.
                if owns_pool && !host && memory_limit.is_none() { config.large_blocks } else { 0 },
                config.decay,
                if host { Observer::Host } else { Observer::Device },
            ),
            segments: Mutex::new(HashMap::new()),
            segments_to_release: Mutex::new(Vec::new()),
            segment_bytes: AtomicU64::new(0),
            releasing: Mutex::new(()),
            // The program's own pool: its own stream-ordered calls, which the
            // shim does not count, may use it while the shim's are quiet.
            decay: Mutex::new(config.decay.map(|delay| Window::new(delay, config.idle.filter(|_| owns_pool), Instant::now()))),
            trimming: Mutex::new(()),
            used_high_before: Default::default(),
            in_use_high: AtomicU64::new(0),
            recent_peak: AtomicU64::new(0),
            peaks: Mutex::new(PeakWindow::default()),
        })
    }

    /// The pool that serves blocks of `size` bytes.
    fn pool_for(&self, size: u64) -> Pool {
        match self.small_pool {
            Some(small) if self.pending.is_small(size) => small,
            _ => self.pool,
        }
    }

    pub(super) fn pools(&self) -> impl Iterator<Item = Pool> + Clone {
        std::iter::once(self.pool).chain(self.small_pool)
    }

    /// The pool of a block of `size` bytes, if other processes may import it (CUDA IPC).
    pub fn shareable_pool(&self, size: u64) -> Option<Pool> {
        self.shareable.then(|| self.pool_for(size))
    }

    /// A block of `size` bytes from `source`, usable at once from every
    /// stream. The device's context must be current. `legacy_allowed`: no
    /// capture is in progress (one would make a legacy-stream operation
    /// fail), nor can one begin before this returns; the real allocator
    /// serves only then (a real allocation could break a capture on another
    /// thread). `trim`: give the pool's unused memory back to the driver
    /// first (out of memory).
    pub fn alloc(&self, driver: &impl Gpu, size: u64, source: Source, legacy_allowed: bool, trim: bool) -> Result<u64, AllocFailure> {
        let stream = if legacy_allowed && self.reuses_on_legacy_stream() {
            Stream::LEGACY
        } else {
            self.pool_stream
        };
        if trim {
            log::debug!("device {}: trimming the pool for {size} bytes", self.ordinal);
            self.trim(driver, legacy_allowed)?;
        }
        if legacy_allowed && source == Source::RealAllocator {
            return self.alloc_segment(driver, size);
        }
        let ptr = driver.alloc_from_pool(size, self.pool_for(size), stream).map_err(AllocFailure::of)?;
        if self.memory_limit.is_some_and(|limit| self.reserved(driver) > limit) {
            // Given back in the stream's order, where it came from: the pool
            // can hand it out again at once, or release it when trimmed.
            if let Err(e) = driver.free_async(ptr, stream) {
                log::warn!("device {}: giving back a block over the memory limit failed, leaking it: {e:?}", self.ordinal);
            }
            if trim {
                self.trim(driver, legacy_allowed)?; // the last attempt: the pool ends within the limit
            }
            return Err(AllocFailure::OverLimit);
        }
        if (self.internal_deps || self.host) && stream == self.pool_stream {
            // The driver may have made the pool stream wait for a block the
            // program freed with cudaFreeAsync; the program's streams do not
            // wait on the pool stream, so the host does. (Every stream that
            // may use a block allocated on the legacy stream waits for it.)
            // Host memory: the CPU may use it on return, so the allocation
            // must be complete by then.
            driver.synchronize_stream(self.pool_stream).map_err(AllocFailure::Driver)?;
        }
        Ok(ptr)
    }

    /// A large block from the real allocator (`SOMA_LARGE_BLOCKS`): it maps
    /// memory faster than the pool grows (docs/FACTS.md, "Growth and trim").
    fn alloc_segment(&self, driver: &impl Gpu, size: u64) -> Result<u64, AllocFailure> {
        let ptr = driver.alloc_now(size).map_err(AllocFailure::of)?;
        lock(&self.segments).insert(ptr, Segment { size, exported: false });
        self.segment_bytes.fetch_add(size, Relaxed);
        Ok(ptr)
    }

    /// Whether a request of `size` bytes is large (`SOMA_LARGE_BLOCKS`).
    pub fn is_large(&self, size: u64) -> bool {
        self.pending.is_large(size)
    }

    /// The program holds `in_use` bytes of the device after an allocation.
    pub fn note_in_use(&self, in_use: u64) {
        if in_use > self.in_use_high.load(Relaxed) {
            self.in_use_high.fetch_max(in_use, Relaxed);
        }
    }

    /// What the device holds and its program uses (`in_use` bytes now), as
    /// a large request's budget needs it (`budget::plan`).
    pub fn holding(&self, driver: &impl Gpu, in_use: u64) -> Holding {
        let bytes = |counter| driver.pool_bytes(self.pool, counter).unwrap_or(0);
        Holding {
            in_use,
            peak: self.recent_peak.load(Relaxed).max(self.in_use_high.load(Relaxed)),
            // Large blocks on their way to the real free are gone already.
            held: self.reserved(driver).saturating_sub(self.bytes_to_release()),
            cached_large: self.cached_large_bytes(),
            pool_unused: bytes(PoolCounter::ReservedNow).saturating_sub(bytes(PoolCounter::UsedNow)),
        }
    }

    /// A decay check: the highest use since the last one (at least the
    /// program's use now, `in_use`) joins the window.
    pub(super) fn check_peak(&self, in_use: u64) {
        let high = self.in_use_high.swap(in_use, Relaxed).max(in_use);
        self.recent_peak.store(lock(&self.peaks).check(high), Relaxed);
    }

    /// All the device held unused went back: the program's next rise is growth.
    pub(super) fn forget_peak(&self) {
        lock(&self.peaks).forget();
        self.recent_peak.store(0, Relaxed);
        self.in_use_high.store(0, Relaxed);
    }

    /// Gives the cached large blocks back, the oldest first, `bytes` of them
    /// or just more: those of the real allocator wait for the real free
    /// (`release_segments`), those of the pool go back to it. Whether any
    /// went (none once the device is being reset). Like an allocation that
    /// waits for frees, it waits for a return another thread has begun. No
    /// capture may be in progress.
    pub fn give_back_cached_large(&self, driver: &impl Gpu, map: &PointerMap, bytes: u64) -> bool {
        let returning = self.pending.reclaiming();
        if returning.closed() {
            return false;
        }
        let before = self.cached_large_bytes();
        // On the stream allocations take blocks on, where the pool reuses
        // them at once for the request (a passed block may go on either).
        let allocations_on_legacy = self.reuses_on_legacy_stream();
        self.pending.release_cached(Keep::FewerLarge { by: bytes }, map, |ptr, in_legacy_order| {
            self.return_to_pool(driver, ptr, in_legacy_order || allocations_on_legacy)
        });
        drop(returning);
        self.cached_large_bytes() < before
    }

    /// Gives what the pool of large requests holds unused back to the
    /// driver, after the host waited for the frees in it to pass. No capture
    /// may be in progress. Returns the bytes given back.
    pub fn trim_unused(&self, driver: &impl Gpu) -> Result<u64, AllocFailure> {
        self.trim_after_returns(driver, std::iter::once(self.pool))
    }

    /// As `trim_unused`, for every pool of the device (small blocks' too).
    pub fn trim_every_pool(&self, driver: &impl Gpu) -> Result<u64, AllocFailure> {
        self.trim_after_returns(driver, self.pools())
    }

    fn trim_after_returns(&self, driver: &impl Gpu, pools: impl Iterator<Item = Pool> + Clone) -> Result<u64, AllocFailure> {
        let _trimming = lock(&self.trimming);
        self.wait_for_returns(driver, true)?;
        let reserved = || pools.clone().map(|pool| driver.pool_bytes(pool, PoolCounter::ReservedNow).unwrap_or(0)).sum::<u64>();
        let before = reserved();
        pools.clone().try_for_each(|pool| driver.trim(pool, 0)).map_err(AllocFailure::Driver)?;
        Ok(before.saturating_sub(reserved()))
    }

    /// Bytes of the large blocks waiting for the real free.
    fn bytes_to_release(&self) -> u64 {
        let waiting = lock(&self.segments_to_release).clone();
        let segments = lock(&self.segments);
        waiting.iter().filter_map(|ptr| segments.get(ptr)).map(|segment| segment.size).sum()
    }

    /// Whether large blocks wait for the real free (`release_segments`).
    pub fn has_segments_to_release(&self) -> bool {
        self.pending.large_blocks_on() && !lock(&self.segments_to_release).is_empty()
    }

    /// The large block of the real allocator at `ptr`, if it is one.
    pub fn segment(&self, ptr: u64) -> Option<Segment> {
        if !self.pending.large_blocks_on() {
            return None;
        }
        lock(&self.segments).get(&ptr).copied()
    }

    /// The real CUDA IPC exports the large block at `ptr`: from now on its
    /// free is the real one (another process may map it).
    pub fn export_segment(&self, ptr: u64) {
        if let Some(segment) = lock(&self.segments).get_mut(&ptr) {
            segment.exported = true;
        }
    }

    /// Frees the large blocks out of the cache with the real free, once the
    /// device has finished all work issued so far (the work before their
    /// frees may still run). The device's context must be current, and no
    /// capture in progress. Returns the bytes given back.
    pub fn release_segments(&self, driver: &impl Gpu) -> u64 {
        // One thread at a time: an out-of-memory waits here for a release
        // another thread has begun. Only releasers take it.
        let _releasing = lock(&self.releasing);
        let ptrs = std::mem::take(&mut *lock(&self.segments_to_release));
        if ptrs.is_empty() {
            return 0;
        }
        if let Err(e) = driver.synchronize_context() {
            log::warn!("device {}: waiting for the device before freeing large blocks failed: {e:?}", self.ordinal);
            lock(&self.segments_to_release).extend(ptrs);
            return 0;
        }
        let mut given_back = 0;
        for ptr in ptrs {
            let Some(segment) = lock(&self.segments).remove(&ptr) else { continue };
            self.segment_bytes.fetch_sub(segment.size, Relaxed);
            match driver.free_now(ptr) {
                Ok(()) => given_back += segment.size,
                Err(e) => log::warn!("device {}: freeing the large block at {ptr:#x} failed: {e:?}", self.ordinal),
            }
        }
        given_back
    }

    /// Returns the pool's unused memory to the driver. It releases only
    /// blocks whose free the GPU has passed: the host waits for the streams
    /// blocks are freed on (the pool stream, and the legacy stream unless a
    /// capture forbids it: `legacy_allowed`).
    fn trim(&self, driver: &impl Gpu, legacy_allowed: bool) -> Result<(), AllocFailure> {
        self.wait_for_returns(driver, legacy_allowed)?;
        self.pools().try_for_each(|pool| driver.trim(pool, 0)).map_err(AllocFailure::Driver)
    }

    /// The host waits for the streams blocks go back to the pools on (the
    /// pool stream, and the legacy stream unless a capture forbids it), so
    /// that a trim releases them.
    fn wait_for_returns(&self, driver: &impl Gpu, legacy_allowed: bool) -> Result<(), AllocFailure> {
        if legacy_allowed {
            driver.synchronize_stream(Stream::LEGACY).map_err(AllocFailure::Driver)?;
        }
        driver.synchronize_stream(self.pool_stream).map_err(AllocFailure::Driver)
    }

    /// Bytes the pools and the large blocks hold now, used or not.
    pub fn reserved(&self, driver: &impl Gpu) -> u64 {
        let pools: u64 = self.pools().map(|pool| driver.pool_bytes(pool, PoolCounter::ReservedNow).unwrap_or(0)).sum();
        pools + self.segment_bytes.load(Relaxed)
    }

    /// The pools' high-water marks, if they can still be asked; with two
    /// pools, the sum of each one's (at least the peak of both together).
    pub fn peaks(&self, driver: &impl Gpu) -> Option<PoolPeaks> {
        self.pools().zip(&self.used_high_before).try_fold(PoolPeaks { used_high: 0, reserved_high: 0 }, |sum, (pool, before)| {
            let used_high = driver.pool_bytes(pool, PoolCounter::UsedHigh).ok()?.max(before.load(Relaxed));
            Some(PoolPeaks {
                used_high: sum.used_high + used_high,
                reserved_high: sum.reserved_high + driver.pool_bytes(pool, PoolCounter::ReservedHigh).ok()?,
            })
        })
    }

    /// Bytes freed and kept in the cache, reusable at once.
    pub fn cached_bytes(&self) -> u64 {
        self.pending.cached_bytes()
    }

    /// Bytes of large blocks in the cache.
    pub fn cached_large_bytes(&self) -> u64 {
        self.pending.cached_large_bytes()
    }

    /// Bytes freed and not yet reusable (queued, or ordered and not passed).
    pub fn pending_bytes(&self) -> u64 {
        self.pending.pending_bytes()
    }

    /// Bytes the pools hold that the program does not: unused in a pool,
    /// freed by the program and not yet passed, or cached.
    pub fn idle_bytes(&self, driver: &impl Gpu) -> u64 {
        let unused: u64 = self
            .pools()
            .map(|pool| {
                let reserved = driver.pool_bytes(pool, PoolCounter::ReservedNow).unwrap_or(0);
                let used = driver.pool_bytes(pool, PoolCounter::UsedNow).unwrap_or(reserved);
                reserved.saturating_sub(used)
            })
            .sum();
        unused + self.pending.held_bytes()
    }

    /// Lets device `accessor` reach every block of the pools, or stops it.
    pub fn set_peer_access(&self, driver: &impl Gpu, accessor: i32, allowed: bool) -> CuResult<()> {
        self.pools().try_for_each(|pool| driver.set_peer_access(pool, accessor, allowed))
    }

    /// Before a reset: every block still allocated (`live`, never freed, and
    /// the pending and cached ones) goes back to the pool, so that the pool
    /// is really released and old pointers are invalid, as after a real
    /// reset; then everything the shim created is destroyed. The device's
    /// context must be current. Errors are ignored: the reset destroys it all anyway.
    pub fn destroy(&self, driver: &impl Gpu, live: &[u64]) {
        let (held, events) = self.pending.close();
        let (segments, released) = self.take_segments();
        if !segments.is_empty() {
            // Their real free, at once: after the work that may still use them.
            let _ = driver.synchronize_context();
        }
        for ptr in live.iter().chain(&held).chain(&released) {
            let _ = if segments.contains_key(ptr) { driver.free_now(*ptr) } else { driver.free_async(*ptr, self.pool_stream) };
        }
        let _ = driver.synchronize_stream(self.pool_stream);
        for event in events.into_iter().chain([self.legacy_free_mark]) {
            let _ = driver.destroy_event(event);
        }
        let _ = driver.destroy_stream(self.pool_stream);
        let _ = driver.destroy_stream(self.join_stream);
        self.destroy_own_pools(driver);
    }

    /// Every large block, and those waiting for the real free, forgotten
    /// (a reset): the caller frees them or not.
    fn take_segments(&self) -> (HashMap<u64, Segment>, Vec<u64>) {
        self.segment_bytes.store(0, Relaxed);
        (std::mem::take(&mut *lock(&self.segments)), std::mem::take(&mut *lock(&self.segments_to_release)))
    }

    /// Destroys the pools the shim made (not the device's default pool,
    /// which is reset with the device).
    fn destroy_own_pools(&self, driver: &impl Gpu) {
        if self.owns_pool {
            for pool in self.pools() {
                let _ = driver.destroy_pool(pool);
            }
        }
    }

    /// After a reset the shim did not see (its streams and events died with
    /// the context; the pool, a device object, did not): frees every block
    /// still allocated (`live`, and the held ones) without a stream and
    /// destroys the pool, so old pointers are invalid as after a real reset.
    pub fn abandon(&self, driver: &impl Gpu, live: &[u64]) {
        let (held, _dead_events) = self.pending.close();
        if !self.owns_pool {
            return; // the device's default pool is reset with the device
        }
        // Large blocks went with the context (their addresses may be another
        // allocation's by now): forgotten, not freed.
        let (segments, _) = self.take_segments();
        for ptr in live.iter().chain(&held).filter(|ptr| !segments.contains_key(ptr)) {
            let _ = driver.free_now(*ptr);
        }
        self.destroy_own_pools(driver);
    }
}
