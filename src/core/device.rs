//! One device's pool and the ordering that makes its reuse safe.
//!
//! `cudaFree` must not let a block be handed out again before every piece of
//! work issued before it, on every stream, has finished. How the shim keeps
//! that depends on the streams the program has on the device:
//!
//! *Only blocking streams* (the common legacy program): allocations and
//! frees go on the legacy stream itself. It waits for every blocking stream
//! and they wait for it, so a block freed there is reused at once, in order,
//! by the next allocation there, as `cudaMallocAsync` reuses on one stream.
//! The one stream that would not be ordered is a non-blocking stream made
//! later: before one is, the host waits for the legacy work issued before
//! the last free (the *legacy free mark*). That work was finished when the
//! real `cudaFree` returned, so this waits no longer than the program did.
//!
//! *Non-blocking streams too*, `SOMA_FREE_ORDER=barrier`: frees stay on the
//! legacy stream, and the non-blocking streams are ordered by waits on the
//! GPU (see `free_on_legacy_stream`). Three driver calls per stream and free.
//!
//! *Non-blocking streams too*, `SOMA_FREE_ORDER=join` (the default): a freed
//! block does not go to the pool at once. The shim records an event on the
//! legacy stream and on every live non-blocking stream, makes the shim's
//! *join stream* wait for them (and for
//! the last work of destroyed streams), records one *done* event there, and
//! keeps the block in a queue of *pending frees*. Once the host sees an
//! entry's done event passed, the block goes back to the pool with
//! `cuMemFreeAsync` on the shim's *pool stream*, which never carries anything
//! but allocations and such frees.
//!
//! The pool stream is idle, so the pool takes a block back at once and the
//! next allocation on it reuses it; and an allocation on it has nothing to
//! wait for, so it is usable at once from every stream. (Measured: a pool
//! almost never reuses a block freed behind a cross-stream event wait, so
//! freeing in GPU order would make the pool grow instead; see
//! docs/FACTS.md, "Reuse across streams".) One done event per free keeps each check to one
//! driver query (a query costs 0.7 to 2.9 us), and the join stream runs in
//! order, so a passed entry proves every earlier one passed.
//!
//! Pending bytes are bounded by `SOMA_PENDING_FREE_LIMIT`: past it, an
//! allocation waits on the host for the oldest frees, so the pool stays close
//! to what is in use.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use super::config::{Config, FreeOrder, PoolChoice};
use crate::cuda::gpu::{Context, CuError, CuResult, Event, Gpu, Pool, PoolCounter, Stream};
use super::ptrmap::PointerMap;
use super::stats::{DeviceCounters, PoolPeaks};

pub struct Device {
    pub ordinal: i32,
    pub context: Context,
    /// `context`'s ID when the pool was set up: a different one means the
    /// device was reset, maybe by a path the shim does not see.
    pub context_id: u64,
    pool: Pool,
    owns_pool: bool,
    /// Allocations, and frees whose work is done; nothing else.
    pool_stream: Stream,
    /// Waits for the work before each free; its done events pass in order.
    join_stream: Stream,
    /// No non-blocking stream at the last free: allocations and frees go on
    /// the legacy stream.
    on_legacy_stream: AtomicBool,
    /// Recorded on the legacy stream before each free made there.
    legacy_free_mark: Event,
    order: FreeOrder,
    internal_deps: bool,
    pending_free_limit: u64,
    /// Held, on the paths of cudaMalloc and cudaFree, over no driver call but
    /// the record of a free's done event: threads freeing at once would queue.
    frees: Mutex<PendingFrees>,
    /// Held by the one thread returning passed frees to the pool.
    returner: Mutex<Returner>,
    /// Bytes in `frees.queue`, changed under its lock and read without it:
    /// allocations skip the lock while nothing is queued (only blocking
    /// streams, or `barrier`), and take it without waiting while under the limit.
    pending_bytes: AtomicU64,
}

/// Asking whether frees have passed costs a driver call that also flushes
/// batched launches (measured: 0.7 to 2.9 us, scripts/probe/query_cost.cu).
/// While little is pending, it is asked at most this often.
const PROBE_INTERVAL: Duration = Duration::from_micros(20);

/// Frees waiting for the work issued before them, in the order of the frees.
struct PendingFrees {
    queue: VecDeque<PendingFree>,
    /// Done events of returned frees, and the events frees record on the
    /// streams they wait for. Reusing one is safe: a wait binds to the
    /// record current at the call.
    spare_events: Vec<Event>,
}

/// The thread returning passed frees: only it takes entries off the queue.
struct Returner {
    /// When it last asked the driver whether frees had passed.
    last_probe: Option<Instant>,
}

struct PendingFree {
    ptr: u64,
    size: u64,
    /// Passed: every stream has finished the work issued before the free.
    done: Event,
}

/// Why an allocation did not come from the pool.
#[derive(Debug, PartialEq, Eq)]
pub enum AllocFailure {
    OutOfMemory,
    Driver(CuError),
}

/// The streams a free must wait for, besides the legacy stream.
pub struct Predecessors<'a> {
    pub nonblocking: &'a [Stream],
    /// Last work of destroyed streams that may still run.
    pub tails: &'a [Event],
}

impl Device {
    /// Sets up the pool of `ordinal`, whose primary context is current.
    pub fn create(driver: &impl Gpu, ordinal: i32, context: Context, config: &Config) -> CuResult<Device> {
        let (pool, owns_pool) = match config.pool {
            PoolChoice::Own => (driver.create_pool(ordinal)?, true),
            PoolChoice::Default => (driver.default_pool(ordinal)?, false),
        };
        let threshold = config.release_threshold.resolve(driver.total_memory(ordinal)?);
        driver.set_release_threshold(pool, threshold)?;
        driver.set_reuse_policies(
            pool,
            config.reuse_follow_event_deps,
            config.reuse_opportunistic,
            config.reuse_internal_deps,
        )?;
        Ok(Device {
            ordinal,
            context,
            context_id: driver.context_id(context)?,
            pool,
            owns_pool,
            pool_stream: driver.create_nonblocking_stream()?,
            join_stream: driver.create_nonblocking_stream()?,
            // Until a free has seen the streams, allocations stay off the legacy stream.
            on_legacy_stream: AtomicBool::new(false),
            legacy_free_mark: driver.create_event()?,
            order: config.free_order,
            internal_deps: config.reuse_internal_deps,
            pending_free_limit: config.pending_free_limit,
            frees: Mutex::new(PendingFrees {
                queue: VecDeque::new(),
                spare_events: Vec::new(),
            }),
            returner: Mutex::new(Returner { last_probe: None }),
            pending_bytes: AtomicU64::new(0),
        })
    }

    /// A block of `size` bytes, usable at once from every stream.
    /// The device's context must be current. `legacy_allowed`: no capture is
    /// in progress (one would make a legacy-stream operation fail), nor can
    /// one begin before this returns.
    /// Blocks whose free has passed go back to the pool first (and leave `map`).
    pub fn alloc(
        &self,
        driver: &impl Gpu,
        size: u64,
        legacy_allowed: bool,
        counters: &DeviceCounters,
        map: &PointerMap,
    ) -> Result<u64, AllocFailure> {
        let pending = self.pending_bytes.load(Relaxed);
        // Under the limit, an allocation that finds the lock taken does not
        // wait for it: returning passed frees can wait for the next one, and
        // a thread that sleeps on a lock loses tens of microseconds.
        let returner = if pending > self.pending_free_limit {
            Some(locked(&self.returner))
        } else if pending > 0 {
            try_locked(&self.returner)
        } else {
            None
        };
        if let Some(mut returner) = returner {
            self.return_passed(driver, &mut returner, map);
            loop {
                let pending = self.pending_bytes.load(Relaxed);
                if pending <= self.pending_free_limit {
                    break;
                }
                log::debug!("device {}: {pending} bytes of frees pending, over the limit: waiting", self.ordinal);
                counters.pending_waits.fetch_add(1, Relaxed);
                if !self.return_oldest(driver, &mut returner, map) {
                    break;
                }
            }
        }
        let stream = if legacy_allowed && self.on_legacy_stream.load(Relaxed) {
            Stream::LEGACY
        } else {
            self.pool_stream
        };
        let ptr = match driver.alloc_from_pool(size, self.pool, stream) {
            Err(e) if e.is_out_of_memory() => {
                counters.oom_retries.fetch_add(1, Relaxed);
                self.alloc_after_reclaiming(driver, size, stream, map)?
            }
            other => other.map_err(AllocFailure::Driver)?,
        };
        if self.internal_deps && stream == self.pool_stream {
            // The driver may have made the pool stream wait for a block the
            // program freed with cudaFreeAsync; the program's streams do not
            // wait on the pool stream, so the host does. (Every stream that
            // may use a block allocated on the legacy stream waits for it.)
            driver.synchronize_stream(self.pool_stream).map_err(AllocFailure::Driver)?;
        }
        Ok(ptr)
    }

    /// Out of memory: wait for every pending free, then give cached memory
    /// back to the driver, retrying after each.
    fn alloc_after_reclaiming(
        &self,
        driver: &impl Gpu,
        size: u64,
        stream: Stream,
        map: &PointerMap,
    ) -> Result<u64, AllocFailure> {
        {
            let mut returner = locked(&self.returner);
            while self.return_oldest(driver, &mut returner, map) {}
        }
        let attempt = || driver.alloc_from_pool(size, self.pool, stream);
        let result = match attempt() {
            Err(e) if e.is_out_of_memory() => {
                log::debug!("device {}: trimming the pool for {size} bytes", self.ordinal);
                // The pool releases only blocks whose free the GPU has passed.
                driver.synchronize_stream(stream).map_err(AllocFailure::Driver)?;
                driver.trim(self.pool).map_err(AllocFailure::Driver)?;
                attempt()
            }
            other => other,
        };
        result.map_err(|e| if e.is_out_of_memory() { AllocFailure::OutOfMemory } else { AllocFailure::Driver(e) })
    }

    /// Returns the block at `ptr` to the pool once all work issued so far on
    /// every stream of this device has finished: at once on the legacy
    /// stream if `after` names no other stream or the order is a barrier,
    /// else through the queue of pending frees. The device's context must be
    /// current, and `after` must stay the device's streams until this returns.
    pub fn free(
        &self,
        driver: &impl Gpu,
        ptr: u64,
        size: u64,
        after: &Predecessors,
        counters: &DeviceCounters,
        map: &PointerMap,
    ) -> CuResult<()> {
        let only_blocking = after.nonblocking.is_empty() && after.tails.is_empty();
        if only_blocking || self.order == FreeOrder::Barrier {
            if self.switch_streams(true) {
                log::debug!("device {}: frees go on the legacy stream", self.ordinal);
            }
            self.free_on_legacy_stream(driver, ptr, after, map)?;
            let path = if only_blocking { &counters.legacy_stream_frees } else { &counters.barrier_frees };
            path.fetch_add(1, Relaxed);
            return Ok(());
        }
        if self.switch_streams(false) {
            log::debug!("device {}: non-blocking streams: frees join them", self.ordinal);
        }
        // Outside the lock: frees of several threads join their streams at once.
        let streams = std::iter::once(&Stream::LEGACY).chain(after.nonblocking);
        self.with_spare_event(driver, |scratch| self.join_streams(driver, scratch, streams, after.tails))?;
        // The done events pass in the order of the queue: recorded and queued
        // under one lock, held as briefly as that allows (allocations return
        // passed frees to the pool).
        let mut frees = locked(&self.frees);
        let done = frees.take_event(driver)?;
        if let Err(e) = driver.record(done, self.join_stream) {
            frees.spare_events.push(done);
            return Err(e);
        }
        frees.queue.push_back(PendingFree { ptr, size, done });
        self.pending_bytes.fetch_add(size, Relaxed);
        Ok(())
    }

    /// Frees `ptr` on the legacy stream, which orders every blocking stream.
    /// Non-blocking streams are ordered by waits on the GPU, as the real
    /// `cudaFree` orders them on the host: the legacy stream waits for their
    /// work before the free, and their later work waits for the legacy work
    /// before it (the block may be reused at once on the legacy stream).
    /// Neither can deadlock where the real `cudaFree` would not: every wait
    /// is for work issued before the free.
    fn free_on_legacy_stream(&self, driver: &impl Gpu, ptr: u64, after: &Predecessors, map: &PointerMap) -> CuResult<()> {
        if !after.nonblocking.is_empty() {
            self.with_spare_event(driver, |scratch| {
                for stream in after.nonblocking {
                    driver.record(scratch, *stream)?;
                    driver.wait_event(Stream::LEGACY, scratch)?;
                }
                Ok(())
            })?;
        }
        for tail in after.tails {
            driver.wait_event(Stream::LEGACY, *tail)?;
        }
        // The mark covers all the work before the free (the free is no work).
        // Frees of several threads may record it at once. A wait binds to the
        // latest record, which covers this free's work and perhaps that of a
        // concurrent free: still only work issued before a free.
        driver.record(self.legacy_free_mark, Stream::LEGACY)?;
        for stream in after.nonblocking {
            driver.wait_event(*stream, self.legacy_free_mark)?;
        }
        // Last: if anything above failed, the block stays allocated (never reused unsafely).
        map.returned(ptr);
        driver.free_async(ptr, Stream::LEGACY)
    }

    /// Sets whether allocations go on the legacy stream; true if that changed.
    /// Written only on a change: every free of every thread asks.
    fn switch_streams(&self, on_legacy: bool) -> bool {
        self.on_legacy_stream.load(Relaxed) != on_legacy && self.on_legacy_stream.swap(on_legacy, Relaxed) != on_legacy
    }

    /// The non-blocking stream `made` is new: from now on frees join it, and
    /// it must not use a block reused on the legacy stream before the work
    /// that block was freed after has finished. The host waits for that work
    /// (the real `cudaFree` did, when the program freed the block), so the
    /// new stream starts idle, as it would without the shim. While a capture
    /// forbids host waits on the legacy stream, the new stream waits on the
    /// GPU instead (legal in every capture mode: `made` is not capturing).
    pub fn leave_legacy_stream(&self, driver: &impl Gpu, made: Stream, host_may_wait: bool) -> CuResult<()> {
        self.on_legacy_stream.store(false, Relaxed);
        if host_may_wait {
            driver.wait_for(self.legacy_free_mark)
        } else {
            driver.wait_event(made, self.legacy_free_mark)
        }
    }

    /// The program freed one of the pool's blocks itself (`cudaFreeAsync`).
    /// On the legacy stream the pool may hand it out again in that stream's
    /// order, so a non-blocking stream made later must wait for the work
    /// before that free too: the legacy free mark moves past it.
    pub fn program_freed(&self, driver: &impl Gpu) {
        if !self.on_legacy_stream.load(Relaxed) {
            return; // the pool stream reuses it only once the GPU has passed the free
        }
        let marked = driver.with_context(self.context, || driver.record(self.legacy_free_mark, Stream::LEGACY));
        if let Err(e) = marked.and_then(|r| r) {
            log::warn!("device {}: marking the legacy stream after a cudaFreeAsync failed: {e:?}", self.ordinal);
        }
    }

    /// Makes the join stream wait for the work issued so far on `streams`
    /// and for `tails`, recording `scratch` on each stream in turn.
    fn join_streams<'a>(
        &self,
        driver: &impl Gpu,
        scratch: Event,
        streams: impl Iterator<Item = &'a Stream>,
        tails: &[Event],
    ) -> CuResult<()> {
        for stream in streams {
            driver.record(scratch, *stream)?;
            driver.wait_event(self.join_stream, scratch)?;
        }
        for tail in tails {
            driver.wait_event(self.join_stream, *tail)?;
        }
        Ok(())
    }

    /// Runs `f` with a spare event of its own. The lock is held only to take
    /// the event and give it back: a thread that sleeps on a taken lock loses
    /// tens of microseconds (measured: four threads whose frees held it over
    /// two driver calls took 42 us per iteration instead of 5,
    /// scripts/probe/thread_cost.cu).
    fn with_spare_event<T>(&self, driver: &impl Gpu, f: impl FnOnce(Event) -> CuResult<T>) -> CuResult<T> {
        let event = locked(&self.frees).take_event(driver)?;
        let result = f(event);
        locked(&self.frees).spare_events.push(event);
        result
    }

    /// Returns to the pool every pending free, from the oldest, whose work is done.
    ///
    /// The done events are recorded on the join stream in queue order (under
    /// the lock), and the stream runs in order: once the newest has passed, so
    /// has every earlier one. So the newest is asked first. The driver is
    /// asked without the queue's lock, so frees go on meanwhile.
    fn return_passed(&self, driver: &impl Gpu, returner: &mut Returner, map: &PointerMap) {
        let Some((newest, count)) = self.newest_pending() else {
            return;
        };
        let now = Instant::now();
        let little_pending = self.pending_bytes.load(Relaxed) < self.pending_free_limit / 4;
        if little_pending && returner.last_probe.is_some_and(|at| now.duration_since(at) < PROBE_INTERVAL) {
            return;
        }
        returner.last_probe = Some(now);
        if driver.has_passed(newest) {
            for _ in 0..count {
                self.give_back_oldest(driver, map);
            }
            return;
        }
        while let Some(oldest) = self.oldest_pending() {
            if !driver.has_passed(oldest) {
                break;
            }
            self.give_back_oldest(driver, map);
        }
    }

    /// Waits on the host for the oldest pending free's work, then returns it
    /// to the pool. False if nothing was pending.
    fn return_oldest(&self, driver: &impl Gpu, _returner: &mut Returner, map: &PointerMap) -> bool {
        let Some(oldest) = self.oldest_pending() else {
            return false;
        };
        if let Err(e) = driver.wait_for(oldest) {
            log::warn!("device {}: waiting for earlier work failed: {e:?}", self.ordinal);
        }
        self.give_back_oldest(driver, map);
        true
    }

    /// The newest pending free's done event, and how many frees are pending.
    fn newest_pending(&self) -> Option<(Event, usize)> {
        let frees = locked(&self.frees);
        frees.queue.back().map(|newest| (newest.done, frees.queue.len()))
    }

    fn oldest_pending(&self) -> Option<Event> {
        locked(&self.frees).queue.front().map(|oldest| oldest.done)
    }

    /// Frees the oldest pending entry's block on the idle pool stream: the
    /// pool can hand it out again at once. The caller holds the returner (only
    /// it takes entries off the queue) and has seen the entry pass.
    fn give_back_oldest(&self, driver: &impl Gpu, map: &PointerMap) {
        let Some(passed) = locked(&self.frees).queue.pop_front() else {
            return;
        };
        self.pending_bytes.fetch_sub(passed.size, Relaxed);
        map.returned(passed.ptr);
        if let Err(e) = driver.free_async(passed.ptr, self.pool_stream) {
            log::warn!("device {}: returning {} bytes to the pool failed: {e:?}", self.ordinal, passed.size);
        }
        locked(&self.frees).spare_events.push(passed.done);
    }

    /// Bytes the pool holds now, used or not.
    pub fn reserved(&self, driver: &impl Gpu) -> u64 {
        driver.pool_bytes(self.pool, PoolCounter::ReservedNow).unwrap_or(0)
    }

    /// The pool's high-water marks, if it can still be asked.
    pub fn peaks(&self, driver: &impl Gpu) -> Option<PoolPeaks> {
        Some(PoolPeaks {
            used_high: driver.pool_bytes(self.pool, PoolCounter::UsedHigh).ok()?,
            reserved_high: driver.pool_bytes(self.pool, PoolCounter::ReservedHigh).ok()?,
        })
    }

    /// Bytes the pool holds and could hand out now.
    fn idle_bytes_in_pool(&self, driver: &impl Gpu) -> u64 {
        let reserved = driver.pool_bytes(self.pool, PoolCounter::ReservedNow).unwrap_or(0);
        let used = driver.pool_bytes(self.pool, PoolCounter::UsedNow).unwrap_or(reserved);
        reserved.saturating_sub(used)
    }

    /// Bytes the pool holds that the program does not: cached in the pool,
    /// or freed by the program and waiting to go back to it.
    pub fn idle_bytes(&self, driver: &impl Gpu) -> u64 {
        self.idle_bytes_in_pool(driver) + self.pending_bytes.load(Relaxed)
    }

    /// Lets device `accessor` reach every block of this pool, or stops it.
    pub fn set_peer_access(&self, driver: &impl Gpu, accessor: i32, allowed: bool) -> CuResult<()> {
        driver.set_peer_access(self.pool, accessor, allowed)
    }

    /// Before a reset: every block still allocated (`live`, never freed, and
    /// the pending ones) goes back to the pool, so that the pool is really
    /// released and old pointers are invalid, as after a real reset; then
    /// everything the shim created is destroyed. The device's context must be
    /// current. Errors are ignored: the reset destroys it all anyway.
    pub fn destroy(&self, driver: &impl Gpu, live: &[u64]) {
        let frees = locked(&self.frees);
        let pending = frees.queue.iter().map(|f| f.ptr);
        for ptr in live.iter().copied().chain(pending) {
            let _ = driver.free_async(ptr, self.pool_stream);
        }
        let _ = driver.synchronize_stream(self.pool_stream);
        let queued = frees.queue.iter().map(|f| &f.done);
        for &event in queued.chain(frees.spare_events.iter()).chain([&self.legacy_free_mark]) {
            let _ = driver.destroy_event(event);
        }
        let _ = driver.destroy_stream(self.pool_stream);
        let _ = driver.destroy_stream(self.join_stream);
        if self.owns_pool {
            let _ = driver.destroy_pool(self.pool);
        }
    }

    /// After a reset the shim did not see (its streams and events died with
    /// the context; the pool, a device object, did not): frees every block
    /// still allocated (`live`, and the pending ones) without a stream and
    /// destroys the pool, so old pointers are invalid as after a real reset.
    pub fn abandon(&self, driver: &impl Gpu, live: &[u64]) {
        if !self.owns_pool {
            return; // the device's default pool is reset with the device
        }
        let frees = locked(&self.frees);
        let pending = frees.queue.iter().map(|f| f.ptr);
        for ptr in live.iter().copied().chain(pending) {
            let _ = driver.free_now(ptr);
        }
        let _ = driver.destroy_pool(self.pool);
    }

}

/// A panic while holding a lock of a device leaves at worst a block not
/// returned to the pool (leaked, never reused unsafely), so a poisoned lock
/// is usable.
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The lock if no other thread holds it (poisoned or not, as `locked`).
fn try_locked<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl PendingFrees {
    fn take_event(&mut self, driver: &impl Gpu) -> CuResult<Event> {
        match self.spare_events.pop() {
            Some(event) => Ok(event),
            None => driver.create_event(),
        }
    }
}
