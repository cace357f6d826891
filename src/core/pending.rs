//! One device's frees in join order, from the program's `cudaFree` to reuse.
//!
//! A free costs the program's thread no driver call: the block is *queued*.
//! A *join* (run by the reclaimer thread, or by an allocation that must wait)
//! covers every queued block at once: it makes the device's join stream wait
//! for the work issued so far on the legacy stream and on every live
//! non-blocking stream, and records one *done* event there. A join issued
//! later than a free covers more work than the free needs, never less, so a
//! batch is as safe as a join per free; it only delays reuse, and its cost
//! does not grow with the frees it covers.
//!
//! Once the GPU has passed a batch's done event, every stream has finished
//! the work issued before its frees: its blocks are usable at once from any
//! stream. They wait in a host-side *cache* by size, and an allocation of
//! that size takes one without a driver call (as PyTorch's and CuPy's pools
//! do). Blocks the cache keeps unused for long, and all of it when memory
//! runs short, go back to the pool.
//!
//! Under `SOMA_FREE_ORDER=barrier` a batch is freed on the legacy stream
//! behind waits on the GPU instead (`free_behind_barrier`): reused at once in
//! that stream's order, with every non-blocking stream made to wait for the
//! work before it, so nothing waits for the GPU to pass it.
//!
//! Locks: the queue and the cache are held for a push or a pop, never over a
//! driver call, so program threads never wait on a driver call of another's.
//! `reclaiming` is held over the joins and the returns, which only the
//! reclaimer and an allocation that must wait perform.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use super::locks::{lock, try_lock, write};
use super::ptrmap::PointerMap;
use crate::cuda::gpu::{CuResult, Event, Gpu, Stream};

/// How long the cache keeps a block nobody asked for before the pool gets it.
const CACHE_AGE: Duration = Duration::from_secs(1);

/// The streams a join must wait for, besides the legacy stream.
pub struct Predecessors<'a> {
    pub nonblocking: &'a [Stream],
    /// Last work of destroyed streams that may still run.
    pub tails: &'a [Event],
}

struct Block {
    ptr: u64,
    size: u64,
}

/// Blocks covered by one join: reusable once `done` has passed.
struct Batch {
    blocks: Vec<Block>,
    bytes: u64,
    done: Event,
}

struct Cached {
    ptr: u64,
    since: Instant,
}

#[derive(Default)]
pub struct PendingFrees {
    queued: Mutex<Vec<Block>>,
    /// In the order of their done events on the join stream.
    joined: Mutex<VecDeque<Batch>>,
    cache: Mutex<HashMap<u64, Vec<Cached>>>,
    /// Held over joins and returns (driver calls), by one thread at a time.
    reclaiming: Mutex<Reclaiming>,
    /// Queued and joined bytes: freed, not yet known to be passed.
    pending_bytes: AtomicU64,
    cached_bytes: AtomicU64,
}

/// What only the thread holding `reclaiming` touches.
#[derive(Default)]
pub struct Reclaiming {
    /// Events to record joins with; reusing one is safe, a wait binds to the
    /// record current at the call.
    spare_events: Vec<Event>,
    /// The device is gone (reset): nothing may touch its streams any more.
    closed: bool,
}

impl PendingFrees {
    /// The program freed `ptr`: no driver call.
    pub fn queue(&self, ptr: u64, size: u64) {
        // Counted before the reclaimer can see it: the count never falls below the queue.
        self.pending_bytes.fetch_add(size, Relaxed);
        lock(&self.queued).push(Block { ptr, size });
    }

    /// A block of exactly `size` bytes whose earlier work the GPU has passed.
    pub fn take_cached(&self, size: u64) -> Option<u64> {
        if self.cached_bytes.load(Relaxed) == 0 {
            return None;
        }
        let ptr = lock(&self.cache).get_mut(&size)?.pop()?.ptr;
        self.cached_bytes.fetch_sub(size, Relaxed);
        Some(ptr)
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes.load(Relaxed)
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes.load(Relaxed)
    }

    /// Whether anything waits to be joined or to pass.
    pub fn busy(&self) -> bool {
        self.pending_bytes() > 0
    }

    /// The reclaiming lock, waiting for it.
    pub fn reclaiming(&self) -> MutexGuard<'_, Reclaiming> {
        lock(&self.reclaiming)
    }

    /// The reclaiming lock if no other thread holds it.
    pub fn try_reclaiming(&self) -> Option<MutexGuard<'_, Reclaiming>> {
        try_lock(&self.reclaiming)
    }

    /// Joins every queued block: `join_stream` waits for the work issued so
    /// far on the legacy stream, on `after`'s streams and for its tails, and
    /// records the batch's done event. The device's context must be current,
    /// no stream may be capturing, and `after` must stay the device's streams
    /// until this returns. False if nothing was queued (or the device is closed).
    pub fn join(&self, r: &mut Reclaiming, driver: &impl Gpu, join_stream: Stream, after: &Predecessors) -> CuResult<bool> {
        if r.closed {
            return Ok(false);
        }
        let blocks = std::mem::take(&mut *lock(&self.queued));
        if blocks.is_empty() {
            return Ok(false);
        }
        let bytes = blocks.iter().map(|b| b.size).sum();
        let joined = self.record_join(r, driver, join_stream, after);
        match joined {
            Ok(done) => {
                lock(&self.joined).push_back(Batch { blocks, bytes, done });
                Ok(true)
            }
            Err(e) => {
                // Not ordered: the blocks go back to the queue for the next join.
                lock(&self.queued).extend(blocks);
                Err(e)
            }
        }
    }

    fn record_join(&self, r: &mut Reclaiming, driver: &impl Gpu, join_stream: Stream, after: &Predecessors) -> CuResult<Event> {
        let scratch = take_event(r, driver)?;
        let done = match take_event(r, driver) {
            Ok(done) => done,
            Err(e) => {
                r.spare_events.push(scratch);
                return Err(e);
            }
        };
        let recorded = (|| {
            for stream in std::iter::once(&Stream::LEGACY).chain(after.nonblocking) {
                driver.record(scratch, *stream)?;
                driver.wait_event(join_stream, scratch)?;
            }
            for tail in after.tails {
                driver.wait_event(join_stream, *tail)?;
            }
            driver.record(done, join_stream)
        })();
        r.spare_events.push(scratch);
        match recorded {
            Ok(()) => Ok(done),
            Err(e) => {
                r.spare_events.push(done);
                Err(e)
            }
        }
    }

    /// Frees every queued block on the legacy stream behind a barrier on the
    /// GPU, as the real `cudaFree` orders them on the host: the legacy stream
    /// waits for the work issued so far on `after`'s streams and for its
    /// tails, `mark` is recorded there, every stream of `after` waits for it,
    /// and only then are the blocks freed there (leaving `map` first). So the
    /// pool hands a block out again on the legacy stream after all work
    /// before its free, and a non-blocking stream that uses it afterwards
    /// already waits for that work. The device's context must be current, no
    /// stream may be capturing, and `after` must stay the device's streams
    /// until this returns. False if nothing was queued (or the device is closed).
    pub fn free_behind_barrier(
        &self,
        r: &mut Reclaiming,
        driver: &impl Gpu,
        mark: Event,
        after: &Predecessors,
        map: &PointerMap,
        legacy_reuse: &RwLock<()>,
    ) -> CuResult<bool> {
        if r.closed {
            return Ok(false);
        }
        let blocks = std::mem::take(&mut *lock(&self.queued));
        if blocks.is_empty() {
            return Ok(false);
        }
        // Once the legacy stream waits for a non-blocking stream, the pool may
        // hand out there a block the program freed on it: no allocation on the
        // legacy stream until every non-blocking stream waits for the mark.
        let reuse_waits = write(legacy_reuse);
        let ordered = (|| {
            let scratch = take_event(r, driver)?;
            let waited = after.nonblocking.iter().try_for_each(|stream| {
                driver.record(scratch, *stream)?;
                driver.wait_event(Stream::LEGACY, scratch)
            });
            r.spare_events.push(scratch);
            waited?;
            for tail in after.tails {
                driver.wait_event(Stream::LEGACY, *tail)?;
            }
            driver.record(mark, Stream::LEGACY)?;
            after.nonblocking.iter().try_for_each(|stream| driver.wait_event(*stream, mark))
        })();
        drop(reuse_waits);
        if let Err(e) = ordered {
            // Not ordered: the blocks go back to the queue for the next batch.
            lock(&self.queued).extend(blocks);
            return Err(e);
        }
        for block in blocks {
            map.returned(block.ptr);
            if let Err(e) = driver.free_async(block.ptr, Stream::LEGACY) {
                log::warn!("freeing a block on the legacy stream failed, leaking {} bytes: {e:?}", block.size);
            }
            self.pending_bytes.fetch_sub(block.size, Relaxed);
        }
        Ok(true)
    }

    /// Moves every batch the GPU has passed into the cache. Its blocks stay
    /// pending in the pointer map (a second free of one is a double free)
    /// until handed out again or returned to the pool. True if any passed.
    pub fn collect_passed(&self, r: &mut Reclaiming, driver: &impl Gpu) -> bool {
        let mut any = false;
        while let Some(done) = self.oldest_done() {
            if !driver.has_passed(done) {
                break;
            }
            self.cache_oldest(r);
            any = true;
        }
        any
    }

    /// Waits on the host for the oldest batch, then caches it. False if none was joined.
    pub fn wait_oldest(&self, r: &mut Reclaiming, driver: &impl Gpu) -> CuResult<bool> {
        let Some(done) = self.oldest_done() else {
            return Ok(false);
        };
        driver.wait_for(done)?;
        self.cache_oldest(r);
        Ok(true)
    }

    fn oldest_done(&self) -> Option<Event> {
        lock(&self.joined).front().map(|batch| batch.done)
    }

    fn cache_oldest(&self, r: &mut Reclaiming) {
        let Some(batch) = lock(&self.joined).pop_front() else {
            return;
        };
        r.spare_events.push(batch.done);
        let now = Instant::now();
        {
            let mut cache = lock(&self.cache);
            // Counted before a block can be taken: the count never falls below the cache.
            self.cached_bytes.fetch_add(batch.bytes, Relaxed);
            for block in batch.blocks {
                cache.entry(block.size).or_default().push(Cached { ptr: block.ptr, since: now });
            }
        }
        self.pending_bytes.fetch_sub(batch.bytes, Relaxed);
    }

    /// Hands cached blocks to `to_pool`: all of them, or those unused for
    /// long. Each leaves `map` first: once in the pool, another thread may be
    /// handed the address.
    pub fn release_cached(&self, everything: bool, map: &PointerMap, mut to_pool: impl FnMut(u64)) {
        if self.cached_bytes() == 0 {
            return;
        }
        let now = Instant::now();
        let mut released = Vec::new();
        {
            let mut cache = lock(&self.cache);
            for (&size, blocks) in cache.iter_mut() {
                // Oldest first: blocks are pushed in time order and popped from the back.
                let keep_from = if everything {
                    blocks.len()
                } else {
                    blocks.iter().position(|b| now.duration_since(b.since) < CACHE_AGE).unwrap_or(blocks.len())
                };
                released.extend(blocks.drain(..keep_from).map(|b| (b.ptr, size)));
            }
            cache.retain(|_, blocks| !blocks.is_empty());
        }
        for (ptr, size) in released {
            self.cached_bytes.fetch_sub(size, Relaxed);
            map.returned(ptr);
            to_pool(ptr);
        }
    }

    /// The device is being reset: no join or return touches it again.
    /// Returns every block still held (queued, joined, cached) and the
    /// events, for the caller to release.
    pub fn close(&self) -> (Vec<u64>, Vec<Event>) {
        let mut r = self.reclaiming();
        r.closed = true;
        let mut ptrs: Vec<u64> = lock(&self.queued).drain(..).map(|b| b.ptr).collect();
        let mut events = std::mem::take(&mut r.spare_events);
        for batch in lock(&self.joined).drain(..) {
            ptrs.extend(batch.blocks.iter().map(|b| b.ptr));
            events.push(batch.done);
        }
        ptrs.extend(lock(&self.cache).drain().flat_map(|(_, blocks)| blocks.into_iter().map(|b| b.ptr)));
        self.pending_bytes.store(0, Relaxed);
        self.cached_bytes.store(0, Relaxed);
        (ptrs, events)
    }
}

fn take_event(r: &mut Reclaiming, driver: &impl Gpu) -> CuResult<Event> {
    match r.spare_events.pop() {
        Some(event) => Ok(event),
        None => driver.create_event(),
    }
}
