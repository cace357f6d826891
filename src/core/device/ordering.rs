//! The ordering that makes the reuse of one device's pool (`pool`) safe.
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
//! later: before one is, the host waits for the legacy stream's work (the
//! real `cudaFree` had waited for the part of it issued before each free).
//! With `SOMA_LEGACY_CACHE` a free instead caches the block, and the next
//! allocation of its size takes it with no driver call: the new owner, on any
//! blocking stream, runs after the old owner's work on the legacy stream, and
//! after its work on other streams once a mark on the legacy stream follows
//! that work (`SideWork`: recorded at the free only if needed). By default it
//! does so when no mark is needed, or while several threads take turns
//! freeing (`turns`).
//!
//! *Non-blocking streams too*, `SOMA_FREE_ORDER=barrier`: a free only queues
//! the block; the reclaimer frees each batch on the legacy stream behind
//! waits on the GPU (`pending::free_behind_barrier`): the block is reused at
//! once in the legacy stream's order, but the non-blocking streams wait for
//! the legacy stream's work at every batch, as they wait for the host at
//! every real `cudaFree`.
//!
//! *Non-blocking streams too*, `SOMA_FREE_ORDER=join` (the default): a free
//! only queues the block (`pending`); the reclaimer joins queued blocks in
//! batches and caches them once the GPU has passed them. Allocations take a
//! cached block of their size, else allocate on the shim's *pool stream*,
//! which carries nothing but allocations and returns of passed blocks: a
//! block from it has nothing to wait for, so it is usable at once from every
//! stream. (Measured: a pool almost never reuses a block freed behind a
//! cross-stream event wait, so freeing in GPU order would make the pool grow
//! instead; see docs/FACTS.md, "Reuse across streams".) While the frees held
//! pass `SOMA_PENDING_FREE_LIMIT` (the program runs far ahead of the GPU),
//! batches are ordered behind barriers as in `barrier` order instead and
//! cached at once, and allocations move to the legacy stream where the
//! cache gives its surplus back to the pool: the pool
//! stays near what the program holds, and no thread waits on the host.
//!
//! *Pinned host memory* (`cudaMallocHost`): a second `Device` of the same
//! context, on a host memory pool, always frees as in `join` order whatever
//! the streams: the program's CPU writes to a block at once, so a block is
//! handed out again only after the host has seen every stream pass its free,
//! and an allocation waits for its pool stream before it returns.
//!
//! Freed blocks not yet handed out again (pending or cached) may exceed
//! `SOMA_PENDING_FREE_LIMIT` and what the program holds at most before the
//! pool grows: past that an allocation orders the queued frees itself (for
//! pinned host memory, waits on the host for the oldest), and when the pool
//! is out of memory it waits for every free and gives the cache back.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::pool::Device;
use crate::core::config::settings::{FreeOrder, LegacyCache};
use crate::core::locks::{lock, thread_number};
use crate::core::pending::{Keep, Reclaiming};
use crate::core::ptrmap::PointerMap;
use crate::core::reclaimer::Activity;
use crate::core::stats::{add_saturating, raise_peak, DeviceCounters};
use crate::core::streams::{Predecessors, SideWork};
use crate::cuda::gpu::{CuResult, Gpu, Stream, CONTEXT_IS_DESTROYED};

/// How long a reclaim may make its thread wait on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Never (the reclaimer): order the queued frees, collect what has
    /// passed, age the cache; nothing if another thread is at it.
    No,
    /// As `No`, but after another thread's ordering in progress, never for
    /// the GPU (device memory past the bound: a barrier makes the frees
    /// reusable at once).
    Ordered,
    /// Until held bytes are back under the bound, given the bytes in use
    /// (pinned host memory: its frees cannot be reused in a stream's order).
    UnderBound(u64),
    /// Until every free has passed, and give the cache back to the pool
    /// (out of memory).
    All,
}

/// What the host waits for before a new non-blocking stream is returned
/// (`Device::leave_legacy_stream`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostWait {
    Nothing,
    /// The mark just recorded on the legacy stream.
    Mark,
    /// The legacy stream itself: the mark could not be recorded.
    LegacyStream,
}

/// What a free did, for the statistics and the reclaimer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreePath {
    /// Freed on the legacy stream (only blocking streams).
    Legacy,
    /// Kept in the cache in the legacy stream's order (only blocking
    /// streams, `SOMA_LEGACY_CACHE`); `marked`: it took a mark there.
    LegacyCached { marked: bool },
    /// Queued for the reclaimer, to be freed behind a barrier.
    Barrier,
    /// Queued for the reclaimer, to be joined.
    Queued,
    /// A large block exported through the real CUDA IPC, for the real free
    /// (`Device::release_segments`).
    Released,
}

impl Device {
    /// A block of `size` bytes from the cache, without a driver call: one
    /// whose earlier work has passed, or one ordered on the legacy stream
    /// (allocations then go there, and a non-blocking stream made later
    /// waits for that stream's work first).
    pub fn take_cached(&self, size: u64) -> Option<u64> {
        self.pending.take_cached(size)
    }

    /// Whether the blocks freed and not yet handed out again (pending or
    /// cached) exceed the limit: then batches are freed behind barriers.
    fn over_pending_limit(&self) -> bool {
        self.pending.bounded_bytes() > self.pending_free_limit
    }

    /// Whether they exceed both the limit and what the program holds
    /// (`in_use`): then the pool grows no further before this thread
    /// reclaims them.
    pub fn over_pending_bound(&self, in_use: u64) -> bool {
        self.pending.bounded_bytes() > self.pending_free_limit.max(in_use)
    }

    /// Bytes freed and not yet handed out again (pending or cached).
    pub fn held_bytes(&self) -> u64 {
        self.pending.held_bytes()
    }

    /// Joins queued frees and returns those the GPU has passed, waiting on
    /// the host as `wait` allows. The device's context must be current, no
    /// stream may be capturing, and `after` must stay the device's streams
    /// until this returns. Whether frees are still pending after it, and the
    /// time spent ordering a batch.
    pub fn reclaim(&self, driver: &impl Gpu, after: &Predecessors, map: &PointerMap, wait: Wait, counters: &DeviceCounters) -> Activity {
        let reclaiming = match wait {
            Wait::No => self.pending.try_reclaiming(),
            Wait::Ordered | Wait::UnderBound(_) | Wait::All => Some(self.pending.reclaiming()),
        };
        let Some(mut r) = reclaiming else {
            // Another thread is at it.
            return if self.pending.busy() { Activity::Pending(Duration::ZERO) } else { Activity::Idle };
        };
        let started = Instant::now();
        let to_pool = |ptr, in_legacy_order| self.return_to_pool(driver, ptr, in_legacy_order);
        let queued = self.pending.take_queued(&r);
        // Decided once the batch is taken, so that its blocks are counted in
        // the bytes held. Host memory is never reused in a stream's order
        // (see the module doc).
        let limited = !self.host && self.order == FreeOrder::Join && self.over_pending_limit();
        let behind_barrier = self.order == FreeOrder::Barrier || limited;
        let batch = match queued {
            None => Ok(None),
            Some(queued) if behind_barrier => {
                self.pending.order_behind_barrier(&mut r, driver, self.join_stream, after, queued).map(Some)
            }
            Some(queued) => self.pending.join(&mut r, driver, self.join_stream, after, queued).map(Some),
        };
        let ordering = started.elapsed();
        match batch {
            Ok(Some(asked)) => {
                counters.batches.fetch_add(1, Relaxed);
                raise_peak(&counters.batch_streams_high, after.nonblocking.len() as u64);
                add_saturating(&counters.streams_asked, asked as u64);
                add_saturating(&counters.batch_nanos, u64::try_from(ordering.as_nanos()).unwrap_or(u64::MAX));
                if limited {
                    counters.limit_barriers.fetch_add(1, Relaxed);
                }
                if behind_barrier {
                    // Under the stream registry's lock, as the batch: no
                    // stream is made before this is seen.
                    self.reusing_barrier_frees.store(true, Relaxed);
                }
            }
            Ok(None) => {}
            // A reset by a path the shim does not wrap destroys the context,
            // or the streams and events in it, under the reclaimer: the
            // program's next call notices it.
            Err(e) if e == CONTEXT_IS_DESTROYED || self.was_reset(driver) => {
                log::debug!("device {}: context destroyed or reset ({e:?})", self.ordinal)
            }
            Err(e) => log::warn!("device {}: ordering frees after earlier work failed: {e:?}", self.ordinal),
        }
        self.pending.collect_passed(&mut r, driver);
        match wait {
            // Device memory: the newest frees stay cached within the limit,
            // the rest is of more use to the pool. (Pinned host memory: the
            // host waits for the rest instead, `UnderBound`.)
            Wait::No | Wait::Ordered => {
                let within = if self.host { u64::MAX } else { self.pending_free_limit };
                self.pending.release_cached(Keep::Young { within }, map, to_pool)
            }
            Wait::UnderBound(in_use) => {
                // Cached blocks of other sizes are of use to the pool, not to this request.
                self.pending.release_cached(Keep::None, map, to_pool);
                while self.over_pending_bound(in_use) && self.wait_oldest(&mut r, driver) {}
            }
            Wait::All => {
                while self.wait_oldest(&mut r, driver) {}
                self.pending.release_cached(Keep::None, map, to_pool);
            }
        }
        if limited {
            Activity::PastLimit
        } else if self.pending.busy() {
            Activity::Pending(ordering)
        } else {
            Activity::Idle
        }
    }

    /// Whether the context this pool was set up in is gone or was reset
    /// (its ID changed).
    fn was_reset(&self, driver: &impl Gpu) -> bool {
        driver.context_id(self.context).ok() != Some(self.context_id)
    }

    fn wait_oldest(&self, r: &mut Reclaiming, driver: &impl Gpu) -> bool {
        self.pending.wait_oldest(r, driver).unwrap_or_else(|e| {
            log::warn!("device {}: waiting for earlier work failed: {e:?}", self.ordinal);
            false
        })
    }

    /// Gives a cached block back to the pool: one whose work the GPU has
    /// passed on the idle pool stream, where the pool can hand it out again
    /// at once; one ordered on the legacy stream, whose work may still run,
    /// on that stream, where allocations reuse it in its order (and others
    /// only once the GPU has passed it).
    /// A large block of the real allocator waits for `release_segments` instead.
    pub(super) fn return_to_pool(&self, driver: &impl Gpu, ptr: u64, in_legacy_order: bool) {
        if self.segment(ptr).is_some() {
            lock(&self.segments_to_release).push(ptr);
            return;
        }
        let stream = if in_legacy_order { Stream::LEGACY } else { self.pool_stream };
        if let Err(e) = driver.free_async(ptr, stream) {
            log::warn!("device {}: returning a block to the pool failed: {e:?}", self.ordinal);
        }
    }

    /// Whether frees wait to be ordered or to pass, or blocks sit in the
    /// cache or wait for the real free.
    pub fn holds_frees(&self) -> bool {
        self.pending.busy() || self.pending.cached_bytes() > 0 || self.has_segments_to_release()
    }

    /// Returns the block at `ptr` to the pool once all work issued so far on
    /// every stream of this device has finished: with only blocking streams,
    /// on the legacy stream at once, or kept in the cache in that stream's
    /// order (`SOMA_LEGACY_CACHE`, `order_kept`); else through the queue of
    /// pending frees. The device's context must be current, and `after` must
    /// stay the device's streams until this returns.
    pub fn free(
        &self,
        driver: &impl Gpu,
        ptr: u64,
        size: u64,
        after: &Predecessors,
        map: &PointerMap,
        side_work: &SideWork,
    ) -> CuResult<FreePath> {
        let segment = if self.is_large(size) { self.segment(ptr) } else { None };
        if segment.is_some_and(|segment| segment.exported) {
            // Another process may map it: never handed out again.
            map.returned(ptr);
            lock(&self.segments_to_release).push(ptr);
            return Ok(FreePath::Released);
        }
        // Host memory is never reused in a stream's order (see the module doc).
        let only_blocking = !self.host && after.nonblocking.is_empty() && after.tails.is_empty();
        let on_legacy = only_blocking || self.order == FreeOrder::Barrier;
        if self.switch_streams(on_legacy) {
            log::debug!("device {}: allocations on the {} stream", self.ordinal, if on_legacy { "legacy" } else { "pool" });
        }
        let keep = only_blocking
            && ((match self.legacy_cache {
                LegacyCache::On => true,
                LegacyCache::Off => false,
                // Every free with only blocking streams is noted.
                LegacyCache::Auto => self.turns.0.note(thread_number()) || !side_work.unmarked(self.ordinal),
            }
                // Checked, then cached: threads freeing at once may pass it by a block each.
                && self.pending.has_room(size, self.pending_free_limit)
                // A large block of the pool goes back to it, which serves every size from it.
                && !self.is_large(size))
                // One of the real allocator has no pool to go back to.
                || segment.is_some());
        if keep {
            if let Some(marked) = self.order_kept(driver, side_work) {
                self.pending.cache_in_legacy_order(ptr, size);
                return Ok(FreePath::LegacyCached { marked });
            }
        }
        if only_blocking && segment.is_none() {
            // The legacy stream orders every blocking stream: freed in its
            // order, reused in its order. Last: if anything failed, the block
            // stays allocated (never reused unsafely).
            map.returned(ptr);
            // After the work off the legacy stream so far: a mark for it,
            // so that frees after this one may keep their blocks again. A
            // free there orders the blocking streams' later work after their
            // earlier work as a record does (measured: docs/DESIGN.md; an
            // allocation there does not, and is never taken for one).
            side_work.issue_as_mark(self.ordinal, || driver.free_async(ptr, Stream::LEGACY))?;
            return Ok(FreePath::Legacy);
        }
        self.pending.queue(ptr, size);
        Ok(if on_legacy { FreePath::Barrier } else { FreePath::Queued })
    }

    /// Orders a block kept in the legacy stream's order before its next
    /// owner's work; whether that took a mark, None if it failed (the block
    /// is then freed instead). Any operation on the legacy stream waits for
    /// the blocking streams' work before it, and their work after it waits
    /// for it: the next owner, on any blocking stream, runs after the old
    /// owner's work on the legacy stream, and after its work on other
    /// streams once a mark follows that (`SideWork`). A non-blocking stream
    /// made later waits for a newer mark (`leave_legacy_stream`).
    fn order_kept(&self, driver: &impl Gpu, side_work: &SideWork) -> Option<bool> {
        side_work.order_kept(self.ordinal, || driver.record(self.legacy_free_mark, Stream::LEGACY).is_ok())
    }

    /// Whether allocations go on the legacy stream, where blocks freed there
    /// are reused at once.
    pub(super) fn reuses_on_legacy_stream(&self) -> bool {
        self.on_legacy_stream.load(Relaxed) || self.reusing_barrier_frees.load(Relaxed)
    }

    /// Sets whether allocations go on the legacy stream; true if that changed.
    /// Written only on a change: every free of every thread asks.
    fn switch_streams(&self, on_legacy: bool) -> bool {
        self.on_legacy_stream.load(Relaxed) != on_legacy && self.on_legacy_stream.swap(on_legacy, Relaxed) != on_legacy
    }

    /// The non-blocking stream `made` is new: from now on frees are joined,
    /// and it must not use a block reused on the legacy stream before the
    /// work that block was freed after has finished. If blocks were reused
    /// there (or may be: the program freed one itself since the host last
    /// waited for a mark), the legacy stream's work so far is marked, and the host must
    /// wait for the mark (`wait_for_new_stream`; the real `cudaFree` had
    /// waited for the part of it before each free), so that the new stream
    /// starts idle, as it would without the shim. While a capture forbids
    /// touching the legacy stream, the new stream waits on the GPU for the
    /// mark recorded when the first capture began (legacy frees are deferred
    /// during captures, so it covers them all); so does every stream made
    /// after it until the host has waited for a mark. A stream made while
    /// another thread still waits for a mark waits too: the blocks that mark
    /// covers are not yet known to be free of old work. Where a mark cannot
    /// be recorded, the host waits for the legacy stream itself: a block kept
    /// with no mark (`order_kept`) has old work there that an older mark does
    /// not cover. Called with the stream registry locked for writing; the
    /// host waits after it is released.
    pub fn leave_legacy_stream(&self, driver: &impl Gpu, made: Stream, capturing: bool) -> CuResult<HostWait> {
        // All swapped: once the host has waited for the mark, every block
        // reused on the legacy stream so far, or that may be (freed by the
        // program itself), has passed its free.
        let was_on_legacy = self.on_legacy_stream.swap(false, Relaxed)
            | self.reusing_barrier_frees.swap(false, Relaxed)
            | self.program_freed_since_mark.swap(false, Relaxed);
        let mark_awaited = self.mark_waiters.load(Relaxed) > 0;
        if !was_on_legacy && !mark_awaited && !self.mark_waited_on_gpu_only.load(Relaxed) {
            return Ok(HostWait::Nothing); // frees were already joined: none was reused on the legacy stream
        }
        if capturing {
            self.mark_waited_on_gpu_only.store(true, Relaxed);
            return driver.wait_event(made, self.legacy_free_mark).map(|()| HostWait::Nothing);
        }
        if let Err(e) = driver.record(self.legacy_free_mark, Stream::LEGACY) {
            log::warn!("device {}: marking the legacy stream failed ({e:?}): the host waits for it", self.ordinal);
            return Ok(HostWait::LegacyStream);
        }
        self.mark_waiters.fetch_add(1, Relaxed);
        Ok(HostWait::Mark)
    }

    /// Waits on the host as `leave_legacy_stream` asked, for the new stream
    /// `made`. For the mark, once after each time it asked (which covers any
    /// mark streams made during a capture waited for on the GPU, and any
    /// recorded before it). If the legacy stream cannot be waited for, the
    /// new stream waits on the GPU for the last mark instead, and so does
    /// every stream made until the host has waited for one.
    pub fn wait_for_new_stream(&self, driver: &impl Gpu, made: Stream, wait: HostWait) -> CuResult<()> {
        match wait {
            HostWait::Nothing => Ok(()),
            HostWait::Mark => {
                let waited = driver.wait_for(self.legacy_free_mark);
                if waited.is_ok() {
                    self.mark_waited_on_gpu_only.store(false, Relaxed);
                }
                self.mark_waiters.fetch_sub(1, Relaxed);
                waited
            }
            HostWait::LegacyStream => driver.synchronize_stream(Stream::LEGACY).or_else(|e| {
                self.mark_waited_on_gpu_only.store(true, Relaxed);
                driver.wait_event(made, self.legacy_free_mark)?;
                Err(e)
            }),
        }
    }

    /// A block is exported to other processes (CUDA IPC) for the first
    /// time: the host waits for the legacy stream's work so far. A block
    /// reused there may still have earlier work of this process running on
    /// it, which the importer's streams are not ordered after (the real
    /// `cudaFree` had waited for that work). The device's context must be
    /// current, and no capture may begin before this returns.
    pub fn wait_before_export(&self, driver: &impl Gpu) -> CuResult<()> {
        driver.record(self.legacy_free_mark, Stream::LEGACY)?;
        driver.wait_for(self.legacy_free_mark)
    }

    /// A first capture is about to begin: marks the legacy stream's work so
    /// far, for a non-blocking stream made during it (`leave_legacy_stream`).
    /// If the mark fails, the host waits for that work instead (a block kept
    /// with no mark has old work there the last mark does not cover); the
    /// caller holds the captures for writing, so allocations and frees stall
    /// meanwhile, on that failure only. The device's context must be current.
    pub fn mark_before_capture(&self, driver: &impl Gpu) -> CuResult<()> {
        // As `leave_legacy_stream` asks: blocks reused on the legacy stream,
        // or that may be (the program freed one itself since the last wait).
        if !self.reuses_on_legacy_stream() && !self.program_freed_since_mark.load(Relaxed) {
            return Ok(());
        }
        driver.record(self.legacy_free_mark, Stream::LEGACY).or_else(|_| driver.synchronize_stream(Stream::LEGACY))
    }

    /// The program is about to free one of the pool's blocks itself
    /// (`cudaFreeAsync`). If it frees it on the legacy stream, the pool may
    /// hand it out again there in that stream's order as soon as the free is
    /// issued, so the live non-blocking streams (`after`) wait first for the
    /// work issued before it, as they wait for the shim's own frees there.
    /// Whether allocations go on the legacy stream may change before the
    /// free is issued (a barrier, a `cudaFree` in barrier order), so they
    /// wait whatever it is now; so does a stream made later, before it is
    /// returned (`leave_legacy_stream`: allocations may move to the legacy
    /// stream in between, where the pool hands the block out). The device's
    /// context must be current, and no capture in progress.
    pub fn order_before_program_free(&self, driver: &impl Gpu, after: &Predecessors) -> CuResult<()> {
        self.program_freed_since_mark.store(true, Relaxed);
        if after.nonblocking.is_empty() {
            return Ok(());
        }
        driver.record(self.legacy_free_mark, Stream::LEGACY)?;
        after.nonblocking.iter().try_for_each(|live| driver.wait_event(live.stream, self.legacy_free_mark))
    }

    /// The program freed one of the pool's blocks itself during a capture,
    /// when the legacy stream must not be touched: the real free went to the
    /// pool, which may hand the block out on the legacy stream in that
    /// stream's order, so the ordering `order_before_program_free` gives is
    /// owed until the last capture ends. No allocation is handed the block
    /// before then: during a capture an allocation goes to the real allocator,
    /// or (one that began before the capture did) to the pool on the pool
    /// stream, where a block freed on another stream is reused only once its
    /// free has passed (or after a host wait, with internal dependencies).
    pub fn owe_program_free_order(&self) {
        self.program_free_order_owed.store(true, Relaxed);
        self.program_freed_since_mark.store(true, Relaxed);
    }

    /// Whether an ordering was owed (`owe_program_free_order`); it is paid by
    /// the caller, with `order_before_program_free`.
    pub fn take_owed_program_free_order(&self) -> bool {
        self.program_free_order_owed.load(Relaxed) && self.program_free_order_owed.swap(false, Relaxed)
    }
}
