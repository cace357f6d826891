//! Frees: issued at once, deferred while a capture is in progress (or held
//! for CUDA IPC importers), and the reclaimer's steps that return them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::state::Allocator;
use crate::core::decay;
use crate::core::device::ordering::{FreePath, Wait};
use crate::core::device::pool::Device;
use crate::core::locks::{lock, read};
use crate::core::ptrmap::{Block, Claim, MemoryKind};
use crate::core::reclaimer::Activity;
use crate::core::stats::raise_peak;
use crate::core::trace::Op;
use crate::cuda::gpu::{Context, Gpu};

/// What became of a `free` request.
#[derive(Debug, PartialEq, Eq)]
pub enum Freed {
    /// The pool's pointer, freed on `device`.
    Issued { device: i32 },
    /// The pool's pointer, queued until no capture is in progress, or held
    /// until the last process that imported it through CUDA IPC lets it go.
    Deferred,
    /// The pool's pointer, already freed and not yet back in the pool.
    DoubleFree,
    /// A block of the other pool: device memory given to a host free, or
    /// pinned host memory to a device free. The real free refuses it.
    OtherMemory,
    /// Not the pool's: the real free must handle it.
    NotOurs,
}

impl Allocator {
    /// Frees `ptr` if a pool of `kind` gave it out. During a capture the
    /// free is queued: recording events then could join or break the capture.
    pub fn free(&self, driver: &impl Gpu, ptr: u64, kind: MemoryKind) -> Freed {
        let captures = read(&self.captures);
        let current = driver.current_context().ok().flatten();
        if let Some(block) = self.map.live_block(ptr) {
            if !self.is_current_incarnation(driver, block.device, current) {
                // Its memory went with the reset: the real free answers.
                self.abandon_reset_device(driver, block.device);
                return Freed::NotOurs;
            }
        }
        let block = match self.map.claim_for_free(ptr, kind) {
            Claim::Live(block) => block,
            Claim::Shared(block) => {
                if self.shared_blocks.freed(ptr, block) {
                    self.freed(driver, Op::Free, ptr, block);
                    return Freed::Deferred;
                }
                block
            }
            Claim::Pending => return Freed::DoubleFree,
            Claim::Unknown => return Freed::NotOurs,
            Claim::OtherMemory => return Freed::OtherMemory,
        };
        let op = match kind {
            MemoryKind::Device => Op::Free,
            MemoryKind::Host => Op::HostFree,
        };
        self.freed(driver, op, ptr, block);
        if !captures.is_empty() {
            lock(&self.deferred).push((ptr, block));
            self.has_deferred.store(true, Ordering::Release);
            return Freed::Deferred;
        }
        self.free_block(driver, current, ptr, block);
        drop(captures);
        self.issue_deferred_frees(driver);
        Freed::Issued { device: block.device }
    }

    /// Queues the block's return to its pool after all work issued so far.
    /// The captures lock must be held (for reading) with no capture in
    /// progress. `current`: the current context.
    fn free_block(&self, driver: &impl Gpu, current: Option<Context>, ptr: u64, block: Block) {
        let Some(device) = self.pool_of(&block) else {
            log::warn!("free of {ptr:#x} on device {}, which has no pool", block.device);
            return;
        };
        let result = driver.with_context_from(current, device.context, || {
            // Held through the free: no stream of the context is made or destroyed meanwhile.
            let mut registry = read(&self.streams);
            if registry.streams_of(device.context).is_some_and(|streams| !streams.tails.is_empty()) {
                drop(registry);
                self.retire_passed_tails(driver, device.context);
                registry = read(&self.streams);
            }
            device.free(driver, ptr, block.size, &registry.predecessors(device.context), &self.map, &self.side_work)
        });
        let counters = self.stats.counters(device.ordinal, device.host);
        match result.and_then(|r| r) {
            Ok(FreePath::Legacy) => counters.tally().legacy_stream_frees.fetch_add(1, Ordering::Relaxed),
            Ok(FreePath::LegacyCached { marked }) => {
                raise_peak(&counters.peak_held, device.held_bytes());
                if marked {
                    counters.tally().legacy_marked_frees.fetch_add(1, Ordering::Relaxed);
                }
                if !self.reclaimer.running() {
                    // Started for the cache's ageing; once running, its idle
                    // steps age it (a wake per free would keep it stepping).
                    self.reclaimer.wake();
                }
                counters.tally().legacy_cached_frees.fetch_add(1, Ordering::Relaxed)
            }
            // The real free, as the program asked (natively it waits for the device too).
            Ok(FreePath::Released) => driver.with_context_from(current, device.context, || self.release_segments(driver, &device)).unwrap_or(0),
            Ok(path @ (FreePath::Barrier | FreePath::Queued)) => {
                self.reclaimer.wake();
                raise_peak(&counters.peak_held, device.held_bytes());
                let tally = counters.tally();
                let frees = if path == FreePath::Barrier { &tally.barrier_frees } else { &tally.queued_frees };
                frees.fetch_add(1, Ordering::Relaxed)
            }
            // Without the ordering the block cannot be reused safely: it stays allocated.
            Err(e) => {
                log::warn!("device {}: free of {ptr:#x} failed, leaking {} bytes: {e:?}", block.device, block.size);
                0
            }
        };
    }

    pub(super) fn issue_deferred_frees(&self, driver: &impl Gpu) {
        if !self.has_deferred.load(Ordering::Acquire) {
            return;
        }
        let captures = read(&self.captures);
        if !captures.is_empty() {
            return;
        }
        let deferred = {
            let mut deferred = lock(&self.deferred);
            self.has_deferred.store(false, Ordering::Release);
            std::mem::take(&mut *deferred)
        };
        let current = driver.current_context().ok().flatten();
        for (ptr, block) in deferred {
            self.free_block(driver, current, ptr, block);
        }
    }

    /// The program frees `ptr` itself (`cudaFreeAsync`, which `real_free`
    /// calls; true if it succeeded): the map forgets a live block; a pending
    /// one makes this a double free, which `real_free` never sees.
    pub fn forget(&self, driver: Option<&impl Gpu>, ptr: u64, real_free: impl FnOnce() -> bool) -> Freed {
        if let Some(driver) = driver.filter(|_| !self.capture_in_progress() && self.is_segment(ptr)) {
            // The real allocator's block, which no pool takes back: freed as
            // by cudaFree, after all work so far (the stream's included).
            // (During a capture the real call answers, as for a pool block.)
            return self.free(driver, ptr, MemoryKind::Device);
        }
        let claim = match self.map.claim_for_free_async(ptr) {
            Claim::Shared(block) if self.shared_blocks.freed(ptr, block) => {
                // Held for its importers, then freed by the shim, not by `real_free`.
                if let Some(driver) = driver {
                    self.freed(driver, Op::FreeAsync, ptr, block);
                }
                return Freed::Deferred;
            }
            Claim::Shared(block) => {
                self.map.returned(ptr);
                Claim::Live(block)
            }
            claim => claim,
        };
        match claim {
            Claim::Live(block) => {
                if let Some(driver) = driver {
                    self.freed(driver, Op::FreeAsync, ptr, block);
                }
                match (driver, self.known_device(block.device)) {
                    (Some(driver), Some(device)) => self.program_frees(driver, &device, real_free),
                    _ => {
                        real_free();
                    }
                }
                Freed::Issued { device: block.device }
            }
            Claim::Pending | Claim::Shared(_) => Freed::DoubleFree,
            Claim::OtherMemory => Freed::OtherMemory,
            Claim::Unknown => {
                real_free();
                Freed::NotOurs
            }
        }
    }

    /// The program's own `cudaFreeAsync` of a pool block (`real_free`): the
    /// streams that may use the block again are ordered after the work
    /// before that free before it is issued, so before any legacy-stream
    /// allocation can be handed it. During a capture that ordering is owed
    /// until the last capture ends (`end_capture`): the free itself may be
    /// issued on a stream that is not capturing, and so reach the pool now.
    fn program_frees(&self, driver: &impl Gpu, device: &Device, real_free: impl FnOnce() -> bool) {
        let captures = read(&self.captures);
        // Held through the free: no stream is made between the waits and it.
        let registry = read(&self.streams);
        if captures.is_empty() {
            let ordered = driver.with_context(device.context, || {
                device.order_before_program_free(driver, &registry.predecessors(device.context))
            });
            if let Err(e) = ordered.and_then(|r| r) {
                log::warn!("device {}: ordering streams before a cudaFreeAsync failed: {e:?}", device.ordinal);
            }
        } else {
            device.owe_program_free_order();
        }
        real_free();
    }

    /// Whether the live block at `ptr` is a large block of the real allocator.
    fn is_segment(&self, ptr: u64) -> bool {
        let Some(block) = self.map.live_block(ptr) else { return false };
        self.known_device(block.device).is_some_and(|device| device.is_large(block.size) && device.segment(ptr).is_some())
    }

    /// Waits until `device` is idle (`SOMA_FREE_SYNC=1`).
    pub fn synchronize_device(&self, driver: &impl Gpu, device: i32) {
        if let Some(device) = self.known_device(device) {
            let result = driver.with_context(device.context, || driver.synchronize_context());
            if let Err(e) = result.and_then(|r| r) {
                log::warn!("device {}: synchronizing after a free failed: {e:?}", device.ordinal);
            }
        }
    }

    /// Starts the reclaimer thread unless it runs. True if it runs. Idle, it
    /// wakes for each of the decay's idle looks.
    pub fn start_reclaimer<G: Gpu + Sync>(&'static self, driver: &'static G) -> bool {
        let idle_nap = decay::look_period(self.config.decay, self.config.idle).unwrap_or(Duration::MAX);
        self.reclaimer.running() || self.reclaimer.start(idle_nap, move || self.reclaim_all(driver))
    }

    /// One step of the reclaimer: every device's frees joined and the passed
    /// ones returned, with no host wait, then the decay's checks that are
    /// due. Nothing while a capture is in progress (a join records on the
    /// legacy stream and on the program's).
    pub(crate) fn reclaim_all(&self, driver: &impl Gpu) -> Activity {
        let activity = self.reclaim_frees(driver);
        self.decay_all(driver);
        activity
    }

    fn reclaim_frees(&self, driver: &impl Gpu) -> Activity {
        let captures = read(&self.captures);
        let mut activity = Activity::Idle;
        for device in self.every_pool() {
            if !device.holds_frees() {
                continue;
            }
            if !captures.is_empty() {
                activity = activity.and(Activity::Pending(Duration::ZERO)); // joined once the capture ends
                continue;
            }
            if !self.is_current_incarnation(driver, device.ordinal, None) {
                // Reset by a path the shim does not see: the program's next
                // call into the device forgets it; its streams are gone.
                continue;
            }
            let step = || {
                let activity = self.reclaim(driver, &device, Wait::No);
                // Out of every lock but the captures': it waits for the device.
                self.release_segments(driver, &device);
                activity
            };
            match driver.with_context(device.context, step) {
                Ok(this) => activity = activity.and(this),
                Err(e) => log::warn!("device {}: cannot make its context current: {e:?}", device.ordinal),
            }
        }
        activity
    }

    /// Joins and returns `device`'s frees, waiting as `wait` allows. The
    /// device's context must be current and no capture in progress (the
    /// captures lock held).
    pub(super) fn reclaim(&self, driver: &impl Gpu, device: &Device, wait: Wait) -> Activity {
        let registry = read(&self.streams);
        let after = registry.predecessors(device.context);
        device.reclaim(driver, &after, &self.map, wait, self.stats.counters(device.ordinal, device.host))
    }
}
