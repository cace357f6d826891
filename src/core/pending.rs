//! One device's frees, from the program's `cudaFree` to reuse: queued and
//! joined in batches, or cached at once in the legacy stream's order.
//!
//! A free costs the program's thread no driver call: the block is *queued*.
//! A *join* (run by the reclaimer thread, or by an allocation that must wait)
//! covers every queued block at once: it makes the device's join stream wait
//! for the work issued so far on the legacy stream and on every live
//! non-blocking stream, and records one *done* event there (or on the legacy
//! stream itself, when no non-blocking stream has work left). A join issued
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
//! Under `SOMA_FREE_ORDER=barrier`, and while the frees held pass
//! `SOMA_PENDING_FREE_LIMIT`, a batch is ordered behind a *barrier* on the
//! GPU instead (`order_behind_barrier`): every stream, the legacy one and
//! the non-blocking ones, waits for the work issued before it on all of
//! them. Work issued on any stream after that runs after the old work, so
//! its blocks go to the cache at once, before the GPU has passed anything.
//! Such a block goes back to the pool in the legacy stream's order (the old
//! work may still run), where only the legacy stream reuses it at once. So
//! does a block the program freed with only blocking streams, which the
//! cache may take at once, ordered by the legacy stream and a mark there
//! where needed (`cache_in_legacy_order`, `SOMA_LEGACY_CACHE`).
//!
//! Locks: the queue and the cache are held for a push or a pop, never over a
//! driver call, so program threads never wait on a driver call of another's.
//! `reclaiming` is held over the joins and the returns, which only the
//! reclaimer and an allocation that must wait (for its frees, or within a
//! large request's budget: `Device::give_back_cached_large`) perform.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::locks::{lock, try_lock};
use super::ptrmap::PointerMap;
use super::streams::{Observer, Predecessors};
use crate::cuda::gpu::{CuResult, Event, Gpu, Stream};

/// How long the cache keeps a block nobody asked for before the pool gets it.
const CACHE_AGE: Duration = Duration::from_secs(1);

struct Block {
    ptr: u64,
    size: u64,
}

/// How a join was recorded: on the legacy stream itself (no non-blocking
/// stream was busy and no tail remained) or on the join stream, and how
/// many non-blocking streams it asked.
struct Joined {
    on_legacy_stream: bool,
    asked: usize,
}

/// Queued blocks taken to be ordered as one batch (`take_queued`).
pub struct Queued(Vec<Block>);

/// Blocks covered by one join: reusable once `done` has passed.
struct Batch {
    blocks: Vec<Block>,
    bytes: u64,
    done: Event,
}

struct Cached {
    ptr: u64,
    since: Instant,
    /// Ordered on the legacy stream (behind a barrier, or freed there with
    /// only blocking streams): the work before its free may still run.
    in_legacy_order: bool,
}

/// Which cached blocks stay in the cache when the rest go back to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Those cached lately, the newest first, while the blocks held
    /// (pending and cached, small and large blocks in the cache aside) stay
    /// within `within` bytes, and the small blocks in the cache within as
    /// much again; large blocks until unused for their age.
    Young { within: u64 },
    /// All but the oldest large blocks, `by` bytes of them or just more.
    FewerLarge { by: u64 },
    None,
}

#[derive(Default)]
pub struct PendingFrees {
    /// Blocks of at most this many bytes are small: they come from a pool of
    /// their own, and in the cache they have a budget of their own (0: none).
    small_blocks: u64,
    /// Blocks of at least this many bytes are large: they come from the real
    /// allocator, and the cache keeps them, outside any budget, until they
    /// are unused for `large_age` (0: none).
    large_blocks: u64,
    /// `SOMA_DECAY_MS`; None: large blocks are kept until asked for.
    large_age: Option<Duration>,
    /// Which of the context's pools these frees are of, as streams tell
    /// each pool apart (`StreamWork`).
    observer: Observer,
    queued: Mutex<Vec<Block>>,
    /// In the order of their done events on the join stream.
    joined: Mutex<VecDeque<Batch>>,
    cache: Mutex<BTreeMap<u64, Vec<Cached>>>,
    /// Held over joins and returns (driver calls), by one thread at a time.
    reclaiming: Mutex<Reclaiming>,
    /// Queued and joined bytes: freed, not yet known to be passed.
    pending_bytes: AtomicU64,
    cached_bytes: AtomicU64,
    /// The small blocks' share of `cached_bytes`.
    small_cached_bytes: AtomicU64,
    /// The large blocks' share of `cached_bytes`.
    large_cached_bytes: AtomicU64,
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

impl Reclaiming {
    /// The device is gone (reset): nothing may touch its streams any more.
    pub fn closed(&self) -> bool {
        self.closed
    }
}

impl PendingFrees {
    /// Frees of a device whose blocks of at most `small_blocks` bytes are
    /// small, and of at least `large_blocks` (unless 0) large, these cached
    /// for `large_age` unused (None: until asked for).
    pub fn new(small_blocks: u64, large_blocks: u64, large_age: Option<Duration>, observer: Observer) -> PendingFrees {
        PendingFrees { small_blocks, large_blocks, large_age, observer, ..PendingFrees::default() }
    }

    /// Whether a block of `size` bytes is small (see `small_blocks`).
    pub fn is_small(&self, size: u64) -> bool {
        size <= self.small_blocks
    }

    /// Whether any block is large (`large_blocks` is not 0).
    pub fn large_blocks_on(&self) -> bool {
        self.large_blocks > 0
    }

    /// Whether a block of `size` bytes is large (see `large_blocks`).
    pub fn is_large(&self, size: u64) -> bool {
        self.large_blocks > 0 && size >= self.large_blocks
    }

    /// The program freed `ptr`: no driver call.
    pub fn queue(&self, ptr: u64, size: u64) {
        // Counted before the reclaimer can see it: the count never falls below the queue.
        self.pending_bytes.fetch_add(size, Relaxed);
        lock(&self.queued).push(Block { ptr, size });
    }

    /// A cached block of exactly `size` bytes: its earlier work has passed,
    /// or it is reused in the legacy stream's order (`in_legacy_order`).
    pub fn take_cached(&self, size: u64) -> Option<u64> {
        if self.cached_bytes.load(Relaxed) == 0 {
            return None;
        }
        let ptr = lock(&self.cache).get_mut(&size)?.pop()?.ptr;
        self.uncount_cached(size);
        Some(ptr)
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes.load(Relaxed)
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes.load(Relaxed)
    }

    /// The large blocks' share of `cached_bytes`.
    pub fn cached_large_bytes(&self) -> u64 {
        self.large_cached_bytes.load(Relaxed)
    }

    /// Bytes freed and not yet handed out again (pending or cached).
    pub fn held_bytes(&self) -> u64 {
        self.pending_bytes() + self.cached_bytes()
    }

    /// Whether a block of `size` bytes may join the cache within `limit`:
    /// a small one within the small blocks' budget, another within the rest.
    pub fn has_room(&self, size: u64, limit: u64) -> bool {
        let held = if self.is_small(size) { self.small_cached_bytes.load(Relaxed) } else { self.bounded_bytes() };
        held + size <= limit
    }

    /// The part of `held_bytes` that counts toward `SOMA_PENDING_FREE_LIMIT`:
    /// all but the small blocks in the cache, which have a budget of their
    /// own, and the large ones, which have none.
    pub fn bounded_bytes(&self) -> u64 {
        let apart = self.small_cached_bytes.load(Relaxed) + self.large_cached_bytes.load(Relaxed);
        self.held_bytes().saturating_sub(apart)
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

    /// Every queued block, to be ordered as one batch; None if none was
    /// queued (or the device is closed). Its blocks stay counted as pending
    /// (a free counts its block before queueing it).
    pub fn take_queued(&self, r: &Reclaiming) -> Option<Queued> {
        if r.closed {
            return None;
        }
        let blocks = std::mem::take(&mut *lock(&self.queued));
        (!blocks.is_empty()).then_some(Queued(blocks))
    }

    /// Joins the `queued` blocks: `join_stream` waits for the work issued so
    /// far on the legacy stream, on `after`'s streams and for its tails, and
    /// records the batch's done event. The device's context must be current,
    /// no stream may be capturing, and `after` must stay the device's streams
    /// until this returns. How many streams were asked.
    pub fn join(
        &self,
        r: &mut Reclaiming,
        driver: &impl Gpu,
        join_stream: Stream,
        after: &Predecessors,
        queued: Queued,
    ) -> CuResult<usize> {
        let Queued(blocks) = queued;
        let bytes = blocks.iter().map(|b| b.size).sum();
        let joined =
            take_event(r, driver).and_then(|done| match self.record_join(r, driver, join_stream, after, done) {
                Ok(joined) => Ok((done, joined)),
                Err(e) => {
                    r.spare_events.push(done);
                    Err(e)
                }
            });
        match joined {
            Ok((done, Joined { asked, .. })) => {
                lock(&self.joined).push_back(Batch { blocks, bytes, done });
                Ok(asked)
            }
            Err(e) => {
                // Not ordered: the blocks go back to the queue for the next join.
                lock(&self.queued).extend(blocks);
                Err(e)
            }
        }
    }

    /// Records `done` after the work issued so far on the legacy stream (its
    /// record also covers the blocking streams' work), on `after`'s busy
    /// streams and for its tails. A tracked stream is asked only if it may
    /// run work not seen finished: one seen idle with no work since has
    /// finished everything before the batch's frees.
    fn record_join(
        &self,
        r: &mut Reclaiming,
        driver: &impl Gpu,
        join_stream: Stream,
        after: &Predecessors,
        done: Event,
    ) -> CuResult<Joined> {
        let (mut asked, mut busy) = (0, Vec::new());
        for live in after.nonblocking {
            // A tracked stream seen idle with no work since needs no call.
            let issued = match &live.work {
                Some(work) => match work.unsettled(self.observer) {
                    Some(issued) => Some((work, issued)),
                    None => continue,
                },
                None => None,
            };
            asked += 1;
            // A non-blocking stream found idle has finished the work before
            // the batch's frees: nothing to wait for (one call instead of two).
            if !driver.is_idle(live.stream) {
                busy.push(live.stream);
            } else if let Some((work, issued)) = issued {
                work.found_idle(self.observer, issued);
            }
        }
        let on_legacy_stream = if busy.is_empty() && after.tails.is_empty() {
            // Only the legacy stream's work may still run: an event there
            // covers it, with no hop through the join stream on the GPU.
            driver.record(done, Stream::LEGACY)?;
            true
        } else {
            let scratch = take_event(r, driver)?;
            let recorded = (|| {
                for stream in std::iter::once(Stream::LEGACY).chain(busy) {
                    driver.record(scratch, stream)?;
                    driver.wait_event(join_stream, scratch)?;
                }
                for tail in after.tails {
                    driver.wait_event(join_stream, *tail)?;
                }
                driver.record(done, join_stream)
            })();
            r.spare_events.push(scratch);
            recorded?;
            false
        };
        Ok(Joined { on_legacy_stream, asked })
    }

    /// Orders the `queued` blocks behind a barrier on the GPU, as the real
    /// `cudaFree` orders them on the host, and caches them: `join_stream`
    /// waits for the work issued so far on the legacy stream, on `after`'s
    /// streams and for its tails, then every stream of `after` waits for it,
    /// then the legacy stream does. Any stream that uses a block afterwards
    /// runs after the work before its free: the legacy stream and the
    /// blocking streams behind it, the non-blocking streams of `after`, and
    /// streams made later (they wait for the legacy stream's work,
    /// `Device::leave_legacy_stream`). A tracked stream waits just before
    /// its next work instead (`StreamWork::owed_barrier`), so the barrier
    /// costs no call on a stream the program does not use meanwhile. The
    /// legacy stream is ordered after the untracked non-blocking streams
    /// last: from then on the pool may hand out there a block the program
    /// freed on one of them (event dependencies), and every such stream
    /// already waits for that free, so no allocation needs to be held off
    /// meanwhile (a tracked stream waits before any work that could use the
    /// block). With no busy non-blocking stream and no tail, the event is
    /// recorded on the legacy stream itself, and only `after`'s streams wait
    /// for it. The device's context must be current, no stream may be
    /// capturing, and `after` must stay the device's streams until this
    /// returns. How many streams were asked.
    pub fn order_behind_barrier(
        &self,
        r: &mut Reclaiming,
        driver: &impl Gpu,
        join_stream: Stream,
        after: &Predecessors,
        queued: Queued,
    ) -> CuResult<usize> {
        let Queued(blocks) = queued;
        let ordered = self.record_barrier(r, driver, join_stream, after);
        if ordered.is_err() {
            // Not ordered: the blocks go back to the queue for the next batch.
            lock(&self.queued).extend(blocks);
            return ordered;
        }
        let bytes = blocks.iter().map(|b| b.size).sum();
        self.cache_pending(blocks, bytes, true);
        ordered
    }

    fn record_barrier(
        &self,
        r: &mut Reclaiming,
        driver: &impl Gpu,
        join_stream: Stream,
        after: &Predecessors,
    ) -> CuResult<usize> {
        let tracked = after.barriers.filter(|_| after.nonblocking.iter().any(|live| live.work.is_some()));
        // Tracked streams wait for the context's barrier event, which keeps
        // its latest record; the others for an event of the batch's own.
        let done = match tracked {
            Some(barriers) => match barriers.event() {
                Some(event) => event,
                None => {
                    let event = take_event(r, driver)?;
                    barriers.set_event(event);
                    event
                }
            },
            None => take_event(r, driver)?,
        };
        let ordered =
            self.record_join(r, driver, join_stream, after, done).and_then(|Joined { on_legacy_stream, asked }| {
                // Before the legacy stream waits: from then on the pool may
                // hand out there a block freed with cudaFreeAsync on a busy
                // stream (event dependencies), and a tracked stream must see
                // a barrier it owes before it can use that block. (Raised
                // for a batch not ordered after all, it costs waits only.)
                if let Some(barriers) = tracked {
                    barriers.published();
                }
                // Recorded on the legacy stream, it is behind `done` already.
                let legacy = (!on_legacy_stream).then_some(Stream::LEGACY);
                let untracked = after.nonblocking.iter().filter(|live| live.work.is_none()).map(|live| live.stream);
                untracked.chain(legacy).try_for_each(|stream| driver.wait_event(stream, done))?;
                Ok(asked)
            });
        if tracked.is_none() {
            r.spare_events.push(done); // a wait binds to the record it saw
        }
        ordered
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
        self.cache_pending(batch.blocks, batch.bytes, false);
    }

    /// The program freed `ptr` with only blocking streams, ordered by the
    /// legacy stream (`Device::free`): cached at once, for reuse in that
    /// stream's order.
    pub fn cache_in_legacy_order(&self, ptr: u64, size: u64) {
        self.cache([Block { ptr, size }], size, true);
    }

    /// Moves pending blocks (`bytes` in all) into the cache.
    fn cache_pending(&self, blocks: Vec<Block>, bytes: u64, in_legacy_order: bool) {
        self.cache(blocks, bytes, in_legacy_order);
        self.pending_bytes.fetch_sub(bytes, Relaxed);
    }

    fn cache(&self, blocks: impl IntoIterator<Item = Block>, bytes: u64, in_legacy_order: bool) {
        let since = Instant::now();
        let mut cache = lock(&self.cache);
        // Counted before a block can be taken: the count never falls below the cache.
        self.cached_bytes.fetch_add(bytes, Relaxed);
        for block in blocks {
            if let Some(apart) = self.apart(block.size) {
                apart.fetch_add(block.size, Relaxed);
            }
            cache.entry(block.size).or_default().push(Cached { ptr: block.ptr, since, in_legacy_order });
        }
    }

    /// Hands the cached blocks `keep` does not keep to `to_pool`, with
    /// whether each was ordered on the legacy stream (then the work before
    /// its free may still run). Each leaves `map` first: once in the pool,
    /// another thread may be handed the address.
    pub fn release_cached(&self, keep: Keep, map: &PointerMap, mut to_pool: impl FnMut(u64, bool)) {
        if self.cached_bytes() == 0 {
            return;
        }
        let mut released = Vec::new();
        {
            let mut cache = lock(&self.cache);
            // Blocks cached before these go, by budget: (other blocks, small blocks).
            let aged = Instant::now().checked_sub(CACHE_AGE);
            let release_before = match keep {
                Keep::Young { within } => {
                    let small = self.small_cached_bytes.load(Relaxed);
                    let over = |bytes: u64, small_ones: bool| {
                        let counted = |size| !self.is_large(size) && self.is_small(size) == small_ones;
                        aged.max(oldest_to_release(&cache, bytes.saturating_sub(within), counted))
                    };
                    (over(self.bounded_bytes(), false), over(small, true))
                }
                Keep::FewerLarge { by } => (oldest_to_release(&cache, by, |size| self.is_large(size)), None),
                Keep::None => (Some(after_all_cached()), Some(after_all_cached())),
            };
            for (&size, blocks) in cache.iter_mut() {
                let cutoff = match keep {
                    Keep::Young { .. } if self.is_large(size) => self.large_age.and_then(|age| Instant::now().checked_sub(age)),
                    Keep::FewerLarge { .. } if !self.is_large(size) => None,
                    _ if self.is_small(size) => release_before.1,
                    _ => release_before.0,
                };
                let Some(cutoff) = cutoff else { continue };
                // Oldest first: blocks are pushed in time order and popped from the back.
                let keep_from = blocks.iter().position(|b| b.since >= cutoff).unwrap_or(blocks.len());
                released.extend(blocks.drain(..keep_from).map(|b| (b.ptr, size, b.in_legacy_order)));
            }
            cache.retain(|_, blocks| !blocks.is_empty());
            // Out of the cache, a small or large block is counted apart no
            // more: on its way back it counts toward the bound, as any other.
            for &(_, size, _) in &released {
                if let Some(apart) = self.apart(size) {
                    apart.fetch_sub(size, Relaxed);
                }
            }
        }
        for (ptr, size, in_legacy_order) in released {
            map.returned(ptr);
            to_pool(ptr, in_legacy_order);
            // Counted as held until the pool has it: an allocation that saw
            // less would grow the pool while the block is on its way back.
            self.cached_bytes.fetch_sub(size, Relaxed);
        }
    }

    fn uncount_cached(&self, size: u64) {
        if let Some(apart) = self.apart(size) {
            apart.fetch_sub(size, Relaxed);
        }
        self.cached_bytes.fetch_sub(size, Relaxed);
    }

    /// The count of the cached blocks of `size` bytes kept apart from the
    /// bound (small or large), if they are.
    fn apart(&self, size: u64) -> Option<&AtomicU64> {
        if self.is_small(size) {
            Some(&self.small_cached_bytes)
        } else if self.is_large(size) {
            Some(&self.large_cached_bytes)
        } else {
            None
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
        ptrs.extend(std::mem::take(&mut *lock(&self.cache)).into_iter().flat_map(|(_, blocks)| blocks.into_iter().map(|b| b.ptr)));
        self.pending_bytes.store(0, Relaxed);
        self.cached_bytes.store(0, Relaxed);
        self.small_cached_bytes.store(0, Relaxed);
        self.large_cached_bytes.store(0, Relaxed);
        (ptrs, events)
    }
}

/// The time before which the oldest cached blocks of the sizes `counted`
/// picks, `excess` bytes or just more, were cached; None if nothing need go.
fn oldest_to_release(cache: &BTreeMap<u64, Vec<Cached>>, excess: u64, counted: impl Fn(u64) -> bool) -> Option<Instant> {
    if excess == 0 {
        return None;
    }
    let mut ages: Vec<(Instant, u64)> = cache
        .iter()
        .filter(|(&size, _)| counted(size))
        .flat_map(|(&size, blocks)| blocks.iter().map(move |b| (b.since, size)))
        .collect();
    ages.sort_unstable();
    let mut released = 0;
    for (since, size) in ages {
        released += size;
        if released >= excess {
            return Some(since + Duration::from_nanos(1));
        }
    }
    Some(after_all_cached())
}

/// A cutoff later than every block cached so far.
fn after_all_cached() -> Instant {
    Instant::now() + Duration::from_nanos(1)
}

fn take_event(r: &mut Reclaiming, driver: &impl Gpu) -> CuResult<Event> {
    match r.spare_events.pop() {
        Some(event) => Ok(event),
        None => driver.create_event(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cached blocks of `sizes`, each cached a little after the one before.
    fn cached(sizes: &[u64]) -> PendingFrees {
        let pending = PendingFrees::default();
        for (ptr, &size) in (1..).zip(sizes) {
            pending.queue(ptr, size);
            let block = lock(&pending.queued).pop().expect("queued");
            pending.cache_pending(vec![block], size, ptr % 2 == 0);
            std::thread::sleep(Duration::from_millis(1));
        }
        pending
    }

    #[test]
    fn a_small_block_on_its_way_to_the_pool_counts_toward_the_bound() {
        let map = PointerMap::default();
        let pending = PendingFrees::new(4, 0, None, Observer::Device);
        pending.queue(1, 2);
        let block = lock(&pending.queued).pop().expect("queued");
        pending.cache_pending(vec![block], 2, false);
        assert_eq!((pending.held_bytes(), pending.bounded_bytes()), (2, 0), "cached, a small block has a budget of its own");
        let mut seen = Vec::new();
        pending.release_cached(Keep::None, &map, |_, _| seen.push(pending.bounded_bytes()));
        assert_eq!(seen, [2], "between the cache and the pool it counts toward the bound");
        assert_eq!((pending.held_bytes(), pending.bounded_bytes()), (0, 0));
    }

    #[test]
    fn large_blocks_stay_cached_outside_the_bound_until_they_age() {
        let map = PointerMap::default();
        let pending = PendingFrees::new(0, 100, Some(Duration::from_secs(60)), Observer::Device);
        for (ptr, size) in [(1, 100), (2, 300), (3, 8)] {
            pending.queue(ptr, size);
            let block = lock(&pending.queued).pop().expect("queued");
            pending.cache_pending(vec![block], size, false);
        }
        assert_eq!((pending.held_bytes(), pending.bounded_bytes()), (408, 8), "only the 8 bytes count toward the bound");
        let mut released = Vec::new();
        pending.release_cached(Keep::Young { within: 0 }, &map, |ptr, _| released.push(ptr));
        assert_eq!(released, [3], "past the bound, only the block that counts toward it goes");
        assert_eq!(pending.take_cached(300), Some(2));
        assert_eq!((pending.cached_bytes(), pending.bounded_bytes()), (100, 0));
        pending.release_cached(Keep::None, &map, |ptr, _| released.push(ptr));
        assert_eq!(released, [3, 1], "out of memory, or asked: every large block goes");
        assert_eq!((pending.held_bytes(), pending.bounded_bytes()), (0, 0));
    }

    #[test]
    fn fewer_large_blocks_gives_back_the_oldest_large_ones_only() {
        let map = PointerMap::default();
        let pending = PendingFrees::new(0, 100, None, Observer::Device);
        for (ptr, size) in [(1, 200), (2, 8), (3, 100), (4, 300)] {
            pending.queue(ptr, size);
            let block = lock(&pending.queued).pop().expect("queued");
            pending.cache_pending(vec![block], size, false);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pending.cached_large_bytes(), 600);
        let mut released = Vec::new();
        pending.release_cached(Keep::FewerLarge { by: 250 }, &map, |ptr, _| released.push(ptr));
        released.sort();
        assert_eq!(released, [1, 3], "250 bytes asked: the two oldest large blocks (300), not the small one");
        assert_eq!((pending.cached_bytes(), pending.cached_large_bytes()), (308, 300));
        pending.release_cached(Keep::FewerLarge { by: 0 }, &map, |ptr, _| released.push(ptr));
        assert_eq!(released, [1, 3], "nothing asked, nothing goes");
    }

    #[test]
    fn past_a_bound_the_oldest_cached_blocks_go_to_the_pool_first() {
        let map = PointerMap::default();
        let pending = cached(&[4, 4, 8, 2]);
        let mut released = Vec::new();
        pending.release_cached(Keep::Young { within: 12 }, &map, |ptr, in_legacy_order| released.push((ptr, in_legacy_order)));
        assert_eq!(released, [(1, false), (2, true)], "18 bytes held, 12 kept: the two oldest go");
        assert_eq!(pending.cached_bytes(), 10);
        assert_eq!(pending.take_cached(8), Some(3));

        let mut later = Vec::new();
        pending.release_cached(Keep::Young { within: 2 }, &map, |ptr, _| later.push(ptr));
        assert!(later.is_empty(), "cached just now and within the bound: nothing goes");
        pending.release_cached(Keep::None, &map, |ptr, _| later.push(ptr));
        assert_eq!(later, [4]);
        assert_eq!(pending.cached_bytes(), 0);
    }
}
