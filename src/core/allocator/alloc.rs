//! Allocation: a block from the cache or the pool, or the reason the real
//! allocator answers instead.

use std::sync::atomic::Ordering;

use super::state::Allocator;
use crate::core::device::budget::{self, Holding, Source};
use crate::core::device::ordering::Wait;
use crate::core::device::pool::{AllocFailure, Device};
use crate::core::locks::read;
use crate::core::passthrough::Passthrough;
use crate::core::ptrmap::{Block, Memory};
use crate::core::trace::Op;
use crate::cuda::gpu::{Context, Gpu};

/// Where an allocation came from.
enum Served {
    /// A block freed earlier, from the cache (`Device::take_cached`): pending in the map.
    Cached(u64),
    /// New from the pool.
    Pool(u64),
}

/// Why the pool did not serve an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unserved {
    /// The real allocator answers instead.
    PassThrough(Passthrough),
    /// The pool would hold more than `SOMA_MEMORY_LIMIT` even after its
    /// frees were waited for and it was trimmed: the program is told it is
    /// out of memory, as the real allocator would tell it on a full device.
    OverMemoryLimit,
}

impl From<Passthrough> for Unserved {
    fn from(reason: Passthrough) -> Unserved {
        Unserved::PassThrough(reason)
    }
}

impl Allocator {
    /// Whether the configuration sends this request to the real allocator.
    pub fn size_passthrough(&self, size: u64) -> Option<Passthrough> {
        if self.config.disable {
            Some(Passthrough::Disabled)
        } else if size == 0 {
            Some(Passthrough::ZeroSize)
        } else if !self.config.pools_size(size) {
            Some(Passthrough::SizeOutOfRange)
        } else {
            None
        }
    }

    /// Allocates `size` bytes in the pool of the device of `context` (the
    /// current one), or in its pinned host memory pool (`memory`), for the
    /// code at `caller` (its return address).
    pub fn alloc(
        &self,
        driver: &impl Gpu,
        context: Context,
        size: u64,
        caller: usize,
        memory: Memory,
    ) -> Result<u64, Unserved> {
        let device = self.device(driver, context)?;
        let device = if memory.is_host() { self.host_pool(driver, &device)? } else { device };
        self.issue_deferred_frees(driver);
        let block = Block { device: device.ordinal, size, caller, memory };
        match self.serve(driver, &device, size) {
            Ok(served) => {
                // Counted before the map has the block: a reset on another
                // thread that takes it from the map uncounts it after.
                if !device.host {
                    self.libraries.allocated(caller, size);
                }
                let ptr = match served {
                    Served::Cached(ptr) => {
                        if !self.map.reissue(ptr, block) {
                            log::warn!("pointer map was stale at {ptr:#x}: a cached block was not pending");
                        }
                        self.stats.counters(device.ordinal, device.host).tally().cache_hits.fetch_add(1, Ordering::Relaxed);
                        ptr
                    }
                    Served::Pool(ptr) => {
                        if device.is_large(size) && device.segment(ptr).is_some() {
                            self.stats.counters(device.ordinal, device.host).tally().large_blocks.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(stale) = self.map.insert(ptr, block) {
                            log::warn!("pointer map was stale at {ptr:#x} ({stale:?})");
                        }
                        ptr
                    }
                };
                let in_use = self.stats.pooled_alloc(device.ordinal, device.host, size);
                device.note_in_use(in_use);
                let op = if device.host { Op::HostAlloc } else { Op::Alloc };
                self.observe(driver, &device, op, size, ptr, in_use, caller);
                Ok(ptr)
            }
            Err(AllocFailure::OutOfMemory) => Err(Passthrough::PoolOutOfMemory.into()),
            Err(AllocFailure::OverLimit) => {
                self.stats.device(device.ordinal).limit_refusals.fetch_add(1, Ordering::Relaxed);
                Err(Unserved::OverMemoryLimit)
            }
            Err(AllocFailure::Driver(e)) => {
                log::warn!("device {}: pool allocation of {size} bytes failed: {e:?}", device.ordinal);
                Err(Passthrough::PoolError.into())
            }
        }
    }

    /// A block of `size` bytes: one from the cache, else a
    /// new one from the pool. Past the pending-free bound this thread first
    /// orders the queued frees itself (device memory: behind a barrier, so
    /// they are reused at once; pinned host memory: waiting for the oldest),
    /// and when the pool is out of memory it waits for every free, then
    /// trims the pool, before it gives up.
    fn serve(&self, driver: &impl Gpu, device: &Device, size: u64) -> Result<Served, AllocFailure> {
        if let Some(ptr) = device.take_cached(size) {
            return Ok(Served::Cached(ptr));
        }
        // Held through the allocation: no capture may begin while it may use
        // the legacy stream or join streams.
        let captures = read(&self.captures);
        let quiet = captures.is_empty();
        let counters = self.stats.counters(device.ordinal, device.host);
        let in_use = counters.in_use.load(Ordering::Relaxed);
        let wait = if !quiet {
            None
        } else if device.over_pending_bound(in_use) {
            if device.host {
                counters.pending_waits.fetch_add(1, Ordering::Relaxed);
                Some(Wait::UnderBound(in_use))
            } else {
                Some(Wait::Ordered)
            }
        } else if !self.reclaimer.running() && device.holds_frees() {
            Some(Wait::No) // no thread does it (and, with none queued, nothing to do: no lock taken)
        } else {
            None
        };
        if let Some(wait) = wait {
            self.reclaim(driver, device, wait);
            if device.has_segments_to_release() {
                // Their real free waits for the device: the reclaimer's, not this allocation's.
                self.reclaimer.wake();
            }
            if let Some(ptr) = device.take_cached(size) {
                return Ok(Served::Cached(ptr));
            }
        }
        let source = if quiet && device.is_large(size) { self.make_room_for_large(driver, device, size, in_use)? } else { Source::Pool };
        let ptr = match device.alloc(driver, size, source, quiet, false) {
            Err(AllocFailure::OutOfMemory | AllocFailure::OverLimit) if quiet => {
                counters.oom_retries.fetch_add(1, Ordering::Relaxed);
                self.reclaim(driver, device, Wait::All);
                self.release_segments(driver, device);
                match device.alloc(driver, size, source, quiet, false) {
                    // The last try: the pool trimmed, a large block from the
                    // real allocator, which a fragmented pool may not match.
                    Err(AllocFailure::OutOfMemory | AllocFailure::OverLimit) => {
                        let last = if device.is_large(size) { Source::RealAllocator } else { source };
                        device.alloc(driver, size, last, quiet, true)
                    }
                    other => other,
                }
            }
            other => other,
        }?;
        if quiet && source == Source::Pool && device.is_large(size) {
            self.trim_past_budget(driver, device, size, in_use);
        }
        Ok(Served::Pool(ptr))
    }

    /// After a large request of `size` bytes came from the pool: where the
    /// pool grew more than planned (freed memory it could not reuse yet for
    /// this stream), its unused memory goes back to the driver once the host
    /// waited for its frees, so that the device stays within its budget.
    fn trim_past_budget(&self, driver: &impl Gpu, device: &Device, size: u64, in_use: u64) {
        let holding = device.holding(driver, in_use + size);
        if holding.held > budget::allowed(holding.peak.max(holding.in_use)) && holding.pool_unused > 0 {
            if let Err(e) = self.trim_for_budget(driver, device) {
                log::debug!("device {}: trimming past the budget failed: {e:?}", device.ordinal);
            }
            self.stats.counters(device.ordinal, device.host).tally().budget_give_backs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The pool of large requests gives back what it holds unused, counted as given back.
    fn trim_for_budget(&self, driver: &impl Gpu, device: &Device) -> Result<(), AllocFailure> {
        let given = device.trim_unused(driver)?;
        self.stats.counters(device.ordinal, device.host).given_back.fetch_add(given, Ordering::Relaxed);
        Ok(())
    }

    /// Where a large request of `size` bytes comes from (`budget::source`,
    /// decided once), after what the device holds was brought within its
    /// budget for it (`budget::plan`):
    /// cached large blocks of other sizes go back (the pool's to the pool,
    /// which may then serve the request; the real allocator's with the real
    /// free, once, after the device finished its work, as the program's own
    /// frees of them would have waited), then, where frees wait for the GPU,
    /// those once it passed them, and, if that is not enough, the pool's
    /// unused memory. No capture may be in progress. `in_use`: the program's
    /// bytes on the device.
    fn make_room_for_large(&self, driver: &impl Gpu, device: &Device, size: u64, in_use: u64) -> Result<Source, AllocFailure> {
        let holding = device.holding(driver, in_use);
        let source = budget::source(size, &holding);
        let plan_on = |holding: Holding| {
            let plan = budget::plan(size, &holding, source);
            log::trace!("device {}: {size} bytes asked, from {source:?}: {holding:?}: {plan:?}", device.ordinal);
            plan
        };
        let replan = || plan_on(device.holding(driver, in_use));
        let mut plan = plan_on(holding);
        let mut gave_back = false;
        let mut waited = false;
        loop {
            // Planned again on what is left, while a round gives back a cached block or more.
            while plan.give_back_large > 0 && device.give_back_cached_large(driver, &self.map, plan.give_back_large) {
                gave_back = true;
                plan = replan();
            }
            // Frees the GPU has not passed hold memory too: once, the host
            // waits for them (as the real free would have) and they are cached.
            if plan.still_over == 0 || waited || device.pending_bytes() == 0 {
                break;
            }
            waited = true;
            self.stats.counters(device.ordinal, device.host).pending_waits.fetch_add(1, Ordering::Relaxed);
            self.reclaim(driver, device, Wait::All);
            plan = replan();
        }
        if device.has_segments_to_release() {
            self.release_segments(driver, device);
        }
        if plan.trim_pool {
            gave_back = true;
            self.trim_for_budget(driver, device)?;
        }
        if gave_back {
            log::debug!("device {}: {size} bytes asked, {in_use} in use: gave back within the budget", device.ordinal);
            self.stats.counters(device.ordinal, device.host).tally().budget_give_backs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(source)
    }
}
