//! The allocator core: one per process, shared by every front door.
//!
//! It owns the pointer map, the per-device pools, the registry of
//! non-blocking streams (every free is ordered after them), the set of stream
//! captures in progress, and the peer-access grants. Front doors (the runtime
//! exports) decide *whether* a call is the pool's; the core does the pooling.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::{Config, MemInfo, StatsOutput};
use super::locks::{lock, read, write, ReadMostly};
use super::device::ordering::{FreePath, Wait};
use super::device::pool::{AllocFailure, Device};
use super::shared_blocks::{Secret, SharedBlocks};
use super::reclaimer::{Activity, Reclaimer};
use crate::cuda::gpu::{Context, Event, Gpu, Pool, Stream};
use super::output;
use super::passthrough::Passthrough;
use super::pool_slots::{PoolSlot, PoolSlots};
use super::ptrmap::{Block, Claim, Memory, MemoryKind, PointerMap};
use super::stats::{raise_peak, PoolPeaks, Stats};
use super::streams::{capture_key, CaptureKey, NullStream, SideWork, StreamRegistry, StreamWork};
use super::trace::{Op, Trace};

pub struct Allocator {
    pub config: Config,
    pub stats: Stats,
    trace: Option<Trace>,
    /// This process's pid if it is a forked child, else 0: a child writes its
    /// statistics and trace to files of its own.
    forked_child: AtomicU32,
    map: PointerMap,
    /// Indexed by device ordinal: not yet seen, cannot be pooled, or its pool.
    devices: PoolSlots,
    /// Indexed by device ordinal: the pool of pinned host memory made for it.
    hosts: PoolSlots,
    /// Read by frees (which may run at once), written when streams come and go.
    streams: ReadMostly<StreamRegistry>,
    /// Captures in progress, keyed by stream and, for the per-thread default
    /// stream (one handle, many streams), by thread. Held for reading while a
    /// free records events, so no capture can begin in between.
    captures: ReadMostly<HashMap<CaptureKey, usize>>,
    /// Frees that arrived during a capture (pending in the map), issued once
    /// no capture is in progress.
    deferred: Mutex<Vec<(u64, Block)>>,
    /// Whether `deferred` may be non-empty (checked on every call, locked rarely).
    has_deferred: AtomicBool,
    /// A thread is retiring passed tails of destroyed streams.
    retiring_tails: AtomicBool,
    /// Some stream's work was tracked (`issue_work` has something to do).
    work_tracked: AtomicBool,
    /// Work off the legacy stream, for the blocks kept in its order.
    side_work: SideWork,
    /// (owner, accessor): `accessor` enabled peer access to `owner`'s memory.
    peer_grants: Mutex<HashSet<(i32, i32)>>,
    /// Blocks exported through CUDA IPC, and their importers' leases.
    shared_blocks: SharedBlocks,
    /// Joins queued frees and returns passed ones, off the program's threads.
    pub reclaimer: Reclaimer,
}

/// What the shim had of a device it forgets (a reset): its pools, and the
/// blocks of each never returned to it.
struct Forgotten {
    device: Arc<Device>,
    host: Option<Arc<Device>>,
    device_blocks: Vec<u64>,
    host_blocks: Vec<u64>,
}

impl Forgotten {
    /// Each pool with its blocks.
    fn pools(&self) -> impl Iterator<Item = (&Arc<Device>, &[u64])> {
        let host = self.host.as_ref().map(|host| (host, self.host_blocks.as_slice()));
        std::iter::once((&self.device, self.device_blocks.as_slice())).chain(host)
    }
}

/// Clears its flag when dropped: a flag taken by one thread at a time.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

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
    /// An allocator with no device seen yet. `config.trace` names the trace
    /// file, if any (a file that cannot be written is logged and skipped).
    pub fn new(config: Config) -> Allocator {
        let trace = config.trace.as_deref().and_then(|path| {
            Trace::create(path).map_err(|e| log::warn!("cannot write the trace to {path}: {e}; no trace is written")).ok()
        });
        Allocator {
            config,
            stats: Stats::default(),
            trace,
            forked_child: AtomicU32::new(0),
            map: PointerMap::default(),
            devices: PoolSlots::default(),
            hosts: PoolSlots::default(),
            streams: ReadMostly::default(),
            captures: ReadMostly::default(),
            deferred: Mutex::new(Vec::new()),
            has_deferred: AtomicBool::new(false),
            retiring_tails: AtomicBool::new(false),
            work_tracked: AtomicBool::new(false),
            side_work: SideWork::default(),
            peer_grants: Mutex::new(HashSet::new()),
            shared_blocks: SharedBlocks::default(),
            reclaimer: Reclaimer::default(),
        }
    }

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

    pub fn capture_in_progress(&self) -> bool {
        !read(&self.captures).is_empty()
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
                let ptr = match served {
                    Served::Cached(ptr) => {
                        if !self.map.reissue(ptr, block) {
                            log::warn!("pointer map was stale at {ptr:#x}: a cached block was not pending");
                        }
                        self.stats.counters(device.ordinal, device.host).tally().cache_hits.fetch_add(1, Ordering::Relaxed);
                        ptr
                    }
                    Served::Pool(ptr) => {
                        if let Some(stale) = self.map.insert(ptr, block) {
                            log::warn!("pointer map was stale at {ptr:#x} ({stale:?})");
                        }
                        ptr
                    }
                };
                let in_use = self.stats.pooled_alloc(device.ordinal, device.host, size);
                let op = if device.host { Op::HostAlloc } else { Op::Alloc };
                self.observe(driver, &device, op, size, ptr, in_use);
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
            if let Some(ptr) = device.take_cached(size) {
                return Ok(Served::Cached(ptr));
            }
        }
        let ptr = match device.alloc(driver, size, quiet, false) {
            Err(AllocFailure::OutOfMemory | AllocFailure::OverLimit) if quiet => {
                counters.oom_retries.fetch_add(1, Ordering::Relaxed);
                self.reclaim(driver, device, Wait::All);
                match device.alloc(driver, size, quiet, false) {
                    Err(AllocFailure::OutOfMemory | AllocFailure::OverLimit) => device.alloc(driver, size, quiet, true),
                    other => other,
                }
            }
            other => other,
        }?;
        Ok(Served::Pool(ptr))
    }

    /// Joins and returns `device`'s frees, waiting as `wait` allows. The
    /// device's context must be current and no capture in progress (the
    /// captures lock held).
    fn reclaim(&self, driver: &impl Gpu, device: &Device, wait: Wait) -> Activity {
        let registry = read(&self.streams);
        let after = registry.predecessors(device.context);
        device.reclaim(driver, &after, &self.map, wait, self.stats.counters(device.ordinal, device.host))
    }

    /// One step of the reclaimer: every device's frees joined and the passed
    /// ones returned, with no host wait. Nothing while a capture is in
    /// progress (a join records on the legacy stream and on the program's).
    fn reclaim_all(&self, driver: &impl Gpu) -> Activity {
        let captures = read(&self.captures);
        let mut activity = Activity::Idle;
        for device in self.devices.pools().into_iter().chain(self.hosts.pools()) {
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
            match driver.with_context(device.context, || self.reclaim(driver, &device, Wait::No)) {
                Ok(this) => activity = activity.and(this),
                Err(e) => log::warn!("device {}: cannot make its context current: {e:?}", device.ordinal),
            }
        }
        activity
    }

    /// Forgets the last work of destroyed streams of `context` that the GPU
    /// has passed: frees wait for it no more, and once none is left they go
    /// on the legacy stream again. The events are asked without the stream
    /// registry's lock, and dropped under its write lock only if one passed
    /// and no other thread holds it (else a later free retries), so no
    /// thread waits on these driver calls. One thread at a time
    /// (`retiring_tails`), so no tail it saw is removed and destroyed by
    /// another meanwhile; only a reset can (the registry counts them). Called
    /// by a free that found tails in `context`.
    fn retire_passed_tails(&self, driver: &impl Gpu, context: Context) {
        if self.retiring_tails.swap(true, Ordering::Acquire) {
            return;
        }
        let _retiring = ClearOnDrop(&self.retiring_tails);
        let (forgotten, tails) = {
            let registry = read(&self.streams);
            let tails = registry.streams_of(context).map(|streams| streams.tails.clone()).unwrap_or_default();
            (registry.forgotten, tails)
        };
        let passed: HashSet<Event> = tails.into_iter().filter(|&tail| driver.has_passed(tail)).collect();
        if passed.is_empty() {
            return;
        }
        let Some(mut registry) = self.streams.try_write() else {
            return;
        };
        if registry.forgotten != forgotten {
            return; // a reset: these events are gone, their handles maybe reused
        }
        registry.retire_tails(context, &passed);
        drop(registry);
        for tail in passed {
            let _ = driver.destroy_event(tail);
        }
    }

    /// Starts the reclaimer thread unless it runs. True if it runs.
    pub fn start_reclaimer<G: Gpu + Sync>(&'static self, driver: &'static G) -> bool {
        self.reclaimer.running() || self.reclaimer.start(move || self.reclaim_all(driver))
    }

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

    /// The live pool block at `ptr`, if any.
    pub fn live_block(&self, ptr: u64) -> Option<Block> {
        self.map.live_block(ptr)
    }

    /// The `cudaHostGetFlags` flags of the live pinned host block holding
    /// `ptr` (at its start or inside it), if the shim gave it out.
    pub fn host_block_flags(&self, ptr: u64) -> Option<u32> {
        match self.map.host_block_holding(ptr)?.memory {
            Memory::Host { flags } => Some(flags),
            Memory::Device => None,
        }
    }

    /// Exports the live pool block at `base` through CUDA IPC: the secret of
    /// its handle (`new_secret` draws one for a new export) and the block.
    /// None where the shim cannot export it: the real call answers.
    pub fn export(&self, driver: &impl Gpu, base: u64, new_secret: impl FnOnce() -> Option<Secret>) -> Option<(Secret, Block)> {
        let block = self.map.live_block(base)?;
        if self.map.live_shared_block(base).is_none() {
            // A new allocation: its earlier work must be done before an
            // importer may touch it (see `Device::wait_before_export`).
            // Held until the end: no capture may begin while the legacy
            // stream is marked or waited for; during one it may not be.
            let captures = read(&self.captures);
            if !captures.is_empty() {
                return None;
            }
            let device = self.known_device(block.device)?;
            if let Err(e) = driver.with_context(device.context, || device.wait_before_export(driver)).and_then(|r| r) {
                log::warn!("device {}: waiting for the legacy stream before an export failed: {e:?}", block.device);
                return None;
            }
        }
        self.shared_blocks.export(&self.map, base, new_secret)
    }

    /// An importer presents `secret` for `base`: a lease on the live block
    /// that export named, if it still is one.
    pub fn lease(&self, base: u64, secret: &Secret) -> Option<Block> {
        self.shared_blocks.lease(&self.map, base, secret)
    }

    /// A lease on `base` under `secret` ended: a block the program freed
    /// meanwhile is freed once its last lease ends (by the next pool call of
    /// a program thread, as frees deferred during a capture are; no driver
    /// call here).
    pub fn lease_ended(&self, base: u64, secret: &Secret) {
        if let Some(block) = self.shared_blocks.lease_ended(base, secret) {
            lock(&self.deferred).push((base, block));
            self.has_deferred.store(true, Ordering::Release);
        }
    }

    /// The pool of device `ordinal` that serves blocks of `size` bytes, its
    /// context and that context's unique id (a new one after a reset), if the
    /// pool can be shared with other processes.
    pub fn shareable_pool(&self, ordinal: i32, size: u64) -> Option<(Pool, Context, u64)> {
        let device = self.known_device(ordinal)?;
        device.shareable_pool(size).map(|pool| (pool, device.context, device.context_id))
    }

    /// The context of the device whose pool holds the live block `ptr`.
    pub fn context_of(&self, ptr: u64) -> Option<Context> {
        let device = self.live_block(ptr)?.device;
        self.known_device(device).map(|d| d.context)
    }

    /// The program frees `ptr` itself (`cudaFreeAsync`, which `real_free`
    /// calls; true if it succeeded): the map forgets a live block; a pending
    /// one makes this a double free, which `real_free` never sees.
    pub fn forget(&self, driver: Option<&impl Gpu>, ptr: u64, real_free: impl FnOnce() -> bool) -> Freed {
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
    /// allocation can be handed it. (During a capture the free runs with the
    /// graph, after the capture.)
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
        }
        real_free();
    }

    /// Counts a pool block leaving the program's hands.
    fn freed(&self, driver: &impl Gpu, op: Op, ptr: u64, block: Block) {
        let in_use = self.stats.pooled_free(block.device, block.memory.is_host(), block.size);
        if let (Some(trace), Some(device)) = (&self.trace, self.pool_of(&block)) {
            trace.record(block.device, op, block.size, ptr, in_use, device.reserved(driver));
        }
    }

    /// After a pool allocation: the trace, and the reserved peak behind a new
    /// in-use peak (kept for when the pool cannot be asked at exit).
    fn observe(&self, driver: &impl Gpu, device: &Device, op: Op, size: u64, ptr: u64, in_use: u64) {
        if !self.reporting() {
            return;
        }
        let counters = self.stats.counters(device.ordinal, device.host);
        if in_use >= counters.peak_in_use.load(Ordering::Relaxed) {
            if let Some(peaks) = device.peaks(driver) {
                counters.reserved_high_seen.fetch_max(peaks.reserved_high, Ordering::Relaxed);
            }
        }
        if let Some(trace) = &self.trace {
            trace.record(device.ordinal, op, size, ptr, in_use, device.reserved(driver));
        }
    }

    /// Whether anything is reported at exit (`SOMA_STATS`, `SOMA_TRACE`).
    pub fn reporting(&self) -> bool {
        self.config.stats != StatsOutput::Off || self.trace.is_some()
    }

    /// What `cudaMemGetInfo` reports for `device`, given the driver's
    /// figures: with `SOMA_MEMINFO=pool`, memory the pool holds but the
    /// program does not counts as free; under `SOMA_MEMORY_LIMIT` the limit
    /// is the total, and free is the limit less what the pool holds (or the
    /// device's free memory, if other processes leave less).
    pub fn memory_info(&self, driver: &impl Gpu, device: i32, free: u64, total: u64) -> (u64, u64) {
        let pool = self.known_device(device);
        let idle = match self.config.meminfo {
            MemInfo::Pool => pool.as_ref().map_or(0, |d| d.idle_bytes(driver)),
            MemInfo::Real => 0,
        };
        let free = free.saturating_add(idle).min(total);
        let limit = self.config.memory_limit.resolve(total);
        if limit >= total {
            return (free, total);
        }
        let held = pool.as_ref().map_or(0, |d| d.reserved(driver)).saturating_sub(idle);
        (free.min(limit.saturating_sub(held)), limit)
    }

    /// In a forked child, before it goes on: its reports go to files of its own.
    pub fn after_fork(&self) {
        // A thread that was retiring tails did not come along.
        self.retiring_tails.store(false, Ordering::Release);
        let pid = std::process::id();
        self.forked_child.store(pid, Ordering::Relaxed);
        if let Some(trace) = &self.trace {
            trace.forked(pid);
        }
    }

    /// The `SOMA_STATS` table (and the trace's last events), at exit.
    pub fn report(&self, driver: Option<&impl Gpu>) {
        if let Some(trace) = &self.trace {
            trace.flush();
        }
        let peaks = |ordinal: i32, host: bool| -> Option<PoolPeaks> {
            let live = self.pool_numbered(ordinal, host).and_then(|d| driver.and_then(|drv| d.peaks(drv)));
            live.or_else(|| {
                let seen = self.stats.counters(ordinal, host).reserved_high_seen.load(Ordering::Relaxed);
                (seen > 0).then_some(PoolPeaks { used_high: 0, reserved_high: seen })
            })
        };
        let rows_lost = self.trace.as_ref().map_or(0, Trace::rows_lost);
        let table = || self.stats.report(std::process::id(), rows_lost, peaks);
        match &self.config.stats {
            StatsOutput::Off => {}
            StatsOutput::Stderr => eprint!("{}", table()),
            StatsOutput::File(path) => {
                let path = match self.forked_child.load(Ordering::Relaxed) {
                    0 => path.clone(),
                    pid => output::in_child(path, pid),
                };
                let table = table();
                let written = output::create(&path).and_then(|mut file| {
                    // A table cut short is worse than none: it goes, and stderr has it.
                    file.write_all(table.as_bytes()).inspect_err(|_| {
                        let _ = std::fs::remove_file(&path);
                    })
                });
                if let Err(e) = written {
                    eprintln!("somashim: cannot write statistics to {path}: {e}; they follow on stderr");
                    eprint!("{table}");
                }
            }
        }
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

    fn issue_deferred_frees(&self, driver: &impl Gpu) {
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

    fn known_device(&self, ordinal: i32) -> Option<Arc<Device>> {
        self.devices.pool(ordinal)
    }

    /// The pool that gave out `block`.
    fn pool_of(&self, block: &Block) -> Option<Arc<Device>> {
        self.pool_numbered(block.device, block.memory.is_host())
    }

    /// Device `ordinal`'s pool, or (`host`) its pinned host memory pool.
    fn pool_numbered(&self, ordinal: i32, host: bool) -> Option<Arc<Device>> {
        if host { self.hosts.pool(ordinal) } else { self.devices.pool(ordinal) }
    }

    /// The pinned host memory pool made for `device` (whose context is
    /// current), set up on first use.
    fn host_pool(&self, driver: &impl Gpu, device: &Arc<Device>) -> Result<Arc<Device>, Passthrough> {
        let index = usize::try_from(device.ordinal).map_err(|_| Passthrough::NoContext)?;
        match self.hosts.set_up_once(index, || self.set_up_host(driver, device)) {
            PoolSlot::Pooled(host) => Ok(host),
            PoolSlot::Unpooled(reason) => Err(reason),
            PoolSlot::Unseen => Err(Passthrough::NoHostPoolSupport),
        }
    }

    fn set_up_host(&self, driver: &impl Gpu, device: &Device) -> PoolSlot {
        let ordinal = device.ordinal;
        match driver.device_count() {
            Ok(1) => {}
            Ok(_) => {
                log::info!("several devices: pinned host allocations pass through");
                return PoolSlot::Unpooled(Passthrough::SeveralDevices);
            }
            Err(e) => {
                log::warn!("cannot count the devices ({e:?}): pinned host allocations pass through");
                return PoolSlot::Unpooled(Passthrough::NoHostPoolSupport);
            }
        }
        match driver.supports_host_pools(ordinal) {
            Ok(true) => {}
            Ok(false) | Err(_) => {
                log::info!("device {ordinal}: no host memory pools in this driver or device: pinned host allocations pass through");
                return PoolSlot::Unpooled(Passthrough::NoHostPoolSupport);
            }
        }
        match Device::create(driver, ordinal, device.context, &self.config, true) {
            Ok(host) => {
                log::debug!("device {ordinal}: pinned host memory pool ready");
                PoolSlot::Pooled(Arc::new(host))
            }
            Err(e) => {
                log::warn!("device {ordinal}: setting up the host memory pool failed ({e:?}): pinned host allocations pass through");
                PoolSlot::Unpooled(Passthrough::NoHostPoolSupport)
            }
        }
    }

    /// The pooled device whose primary context is `context`, if any.
    fn pooled_device_of(&self, context: Context) -> Option<Arc<Device>> {
        self.devices.find(|device| device.context == context)
    }

    /// The pool of the current context's device, set up on first use.
    fn device(&self, driver: &impl Gpu, context: Context) -> Result<Arc<Device>, Passthrough> {
        // A pooled context is found without asking the driver for its device.
        let pooled = self.pooled_device_of(context);
        if let Some(device) = pooled.filter(|d| driver.context_id(context).ok() == Some(d.context_id)) {
            return Ok(device);
        }
        let ordinal = driver.current_device().map_err(|_| Passthrough::NoContext)?;
        let index = usize::try_from(ordinal).map_err(|_| Passthrough::NoContext)?;
        match self.devices.set_up_once(index, || self.set_up(driver, ordinal, context)) {
            PoolSlot::Pooled(device) if device.context == context => {
                if driver.context_id(context).ok() == Some(device.context_id) {
                    Ok(device)
                } else {
                    self.abandon_reset_device(driver, ordinal);
                    self.device(driver, context)
                }
            }
            // Set up is left for when the primary context is current.
            PoolSlot::Pooled(_) | PoolSlot::Unseen => Err(Passthrough::ForeignContext),
            PoolSlot::Unpooled(reason) => Err(reason),
        }
    }

    /// Whether the pool of `ordinal` still belongs to the device's current
    /// primary context. A reset by a path the shim does not wrap shows in the
    /// context's ID. `current`: the current context.
    fn is_current_incarnation(&self, driver: &impl Gpu, ordinal: i32, current: Option<Context>) -> bool {
        let Some(device) = self.known_device(ordinal) else {
            return true;
        };
        let current = match current {
            Some(current) if current == device.context => current,
            // Another device's context: ask for this device's primary one.
            _ => match driver.active_primary_context(ordinal) {
                Ok(Some(primary)) => primary,
                Ok(None) | Err(_) => return false,
            },
        };
        current == device.context && driver.context_id(current).ok() == Some(device.context_id)
    }

    fn set_up(&self, driver: &impl Gpu, ordinal: i32, context: Context) -> PoolSlot {
        match driver.supports_pools(ordinal) {
            Ok(true) => {}
            Ok(false) => {
                log::info!("device {ordinal} has no memory pool support: its allocations pass through");
                return PoolSlot::Unpooled(Passthrough::NoPoolSupport);
            }
            Err(e) => {
                log::warn!("device {ordinal}: cannot query pool support ({e:?}): passing through");
                return PoolSlot::Unpooled(Passthrough::NoPoolSupport);
            }
        }
        if driver.active_primary_context(ordinal).ok().flatten() != Some(context) {
            // A context of the program's own: set up when the primary one is current.
            log::debug!("device {ordinal}: current context is not the primary one");
            return PoolSlot::Unseen;
        }
        let device = match Device::create(driver, ordinal, context, &self.config, false) {
            Ok(device) => device,
            Err(e) => {
                log::warn!("device {ordinal}: setting up the pool failed ({e:?}): passing through");
                return PoolSlot::Unpooled(Passthrough::NoPoolSupport);
            }
        };
        for &(owner, accessor) in lock(&self.peer_grants).iter() {
            if owner == ordinal {
                if let Err(e) = device.set_peer_access(driver, accessor, true) {
                    log::warn!("device {ordinal}: granting device {accessor} access failed: {e:?}");
                }
            }
        }
        log::debug!("device {ordinal}: pool ready");
        PoolSlot::Pooled(Arc::new(device))
    }

    /// Tracks a new non-blocking stream (made in the current context): every
    /// later free waits for its work, and blocks reused on the legacy stream
    /// before it existed are safe for it. `tracked`: the front door sees
    /// every call that issues work on it (`issue_work`).
    pub fn stream_created(&self, driver: &impl Gpu, stream: Stream, tracked: bool) {
        let context = match driver.stream_context(stream) {
            Ok(context) => context,
            Err(e) => return log::warn!("cannot find the context of a new stream: {e:?}"),
        };
        // Lock order: captures, then streams. Held until the end: no capture
        // may begin while the legacy stream is marked or waited for.
        let captures = read(&self.captures);
        let device = self.pooled_device_of(context);
        let host_waits = {
            let mut registry = write(&self.streams);
            let live = registry.add(context, stream, tracked);
            log::debug!("non-blocking stream {:?} made: {live} live in its context", stream.0);
            if tracked {
                self.work_tracked.store(true, Ordering::Relaxed);
            }
            // A host wait on the legacy stream would break a global capture.
            device.as_ref().map(|device| (device, device.leave_legacy_stream(driver, stream, !captures.is_empty())))
        };
        // The host waits without the registry: frees of other threads go on.
        if let Some((device, wait)) = host_waits {
            if let Err(e) = wait.and_then(|wait| device.wait_for_new_stream(driver, stream, wait)) {
                log::warn!("device {}: waiting for the legacy stream failed: {e:?}", device.ordinal);
            }
        }
    }

    /// Called before a stream is destroyed: its last work stays a
    /// predecessor of later frees until the GPU has passed it.
    pub fn stream_destroying(&self, driver: &impl Gpu, stream: Stream) {
        let captures = read(&self.captures);
        let mut registry = write(&self.streams);
        let Some((context, streams)) = registry.remove(stream) else {
            return;
        };
        if captures.keys().any(|(s, _)| *s == stream.0 as usize) {
            return; // nothing may be recorded into a capture
        }
        let tail = driver.with_context(context, || {
            let event = driver.create_event()?;
            driver.record(event, stream).map(|_| event)
        });
        match tail.and_then(|r| r) {
            Ok(event) => streams.tails.push(event),
            Err(e) => log::warn!("cannot record the last work of a destroyed stream: {e:?}"),
        }
    }

    /// Runs `issue`, a driver call that issues work on `streams` (`null`:
    /// what a null handle names there), as a tracked stream needs: first the
    /// wait for a barrier it owes (not into a capture: captured work runs
    /// when its graph is launched, and that call waits), then the note that
    /// the stream has work; work off the legacy stream is noted for the
    /// blocks kept in its order (`SideWork`). Called for every such call
    /// only where the front door sees them all (`front/work.rs`).
    pub fn issue_work<T>(
        &self,
        driver: &impl Gpu,
        streams: &[Stream],
        null: NullStream,
        issue: impl FnOnce() -> T,
    ) -> T {
        let issued = if self.work_tracked.load(Ordering::Relaxed) {
            // Nearly every call names one stream: no allocation for it.
            let (one, many): (Option<Arc<StreamWork>>, Vec<Arc<StreamWork>>);
            let tracked = if let [stream] = streams {
                one = self.before_work(driver, *stream);
                one.as_slice()
            } else {
                many = streams.iter().filter_map(|&stream| self.before_work(driver, stream)).collect();
                many.as_slice()
            };
            tracked.iter().for_each(|work| work.starting());
            let issued = issue();
            tracked.iter().for_each(|work| work.issued());
            issued
        } else {
            issue()
        };
        self.note_work(streams, null);
        issued
    }

    /// Work was issued on `streams`: noted for the blocks kept in the legacy
    /// stream's order (`SideWork`). Also for a call that passed the hooks'
    /// other steps (re-entered inside a hook, or after a hook failed).
    pub fn note_work(&self, streams: &[Stream], null: NullStream) {
        self.side_work.issued(streams, null);
    }

    /// Calls may issue work past the hooks from now on: every block kept in
    /// the legacy stream's order takes a mark.
    pub fn work_passes_unseen(&self) {
        self.side_work.passes_unseen();
    }

    /// The work record of `stream` if tracked, after its owed barrier wait.
    fn before_work(&self, driver: &impl Gpu, stream: Stream) -> Option<Arc<StreamWork>> {
        let work = read(&self.streams).work_of(stream)?;
        if let Some((count, event)) = work.owed_barrier() {
            if !driver.is_capturing(stream) {
                match driver.wait_event(stream, event) {
                    Ok(()) => {
                        work.waited(count);
                        self.stats.waits_before_work.fetch_add(1, Ordering::Relaxed);
                    }
                    // The host waits instead: the work must not run early.
                    Err(e) => match driver.wait_for(event) {
                        Ok(()) => work.waited(count),
                        Err(host) => log::warn!(
                            "stream {:?}: waiting for a barrier before its work failed: {e:?}, then on the host: {host:?}",
                            stream.0
                        ),
                    },
                }
            }
        }
        Some(work)
    }

    /// Runs the real `begin` with captures locked, recording it if it succeeded.
    pub fn begin_capture(&self, driver: Option<&impl Gpu>, stream: Stream, begin: impl FnOnce() -> bool) {
        let mut captures = write(&self.captures);
        if let (true, Some(driver)) = (captures.is_empty(), driver) {
            for device in self.devices.pools() {
                let marked = driver.with_context(device.context, || device.mark_before_capture(driver));
                if let Err(e) = marked.and_then(|r| r) {
                    log::warn!("device {}: marking the legacy stream before a capture failed: {e:?}", device.ordinal);
                }
            }
        }
        if begin() {
            *captures.entry(capture_key(stream)).or_insert(0) += 1;
        }
    }

    /// Runs the real `end`; the capture is over whatever it returns.
    pub fn end_capture<T>(&self, driver: Option<&impl Gpu>, stream: Stream, end: impl FnOnce() -> T) -> T {
        let result = {
            let mut captures = write(&self.captures);
            let result = end();
            let key = capture_key(stream);
            if let Some(count) = captures.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    captures.remove(&key);
                }
            }
            result
        };
        if let Some(driver) = driver {
            self.issue_deferred_frees(driver);
        }
        result
    }

    /// Forgets device `ordinal` before the real reset destroys its memory,
    /// and releases what the shim created there while it still can.
    pub fn device_resetting(&self, driver: &impl Gpu, ordinal: i32) {
        // The reset destroys the context's streams, pooled or not.
        if let Ok(Some(context)) = driver.active_primary_context(ordinal) {
            write(&self.streams).forget_context(context);
        }
        if let Some(forgotten) = self.forget_device(ordinal) {
            let count = forgotten.pools().map(|(_, blocks)| blocks.len()).sum::<usize>();
            let _ = driver.with_context(forgotten.device.context, || {
                for (pool, blocks) in forgotten.pools() {
                    pool.destroy(driver, blocks);
                }
            });
            log::debug!("device {ordinal} reset: released {count} block(s) and the pools");
        }
    }

    /// The device was reset behind the shim's back: its old blocks are
    /// released and the shim starts over with new pools on next use.
    fn abandon_reset_device(&self, driver: &impl Gpu, ordinal: i32) {
        if let Some(forgotten) = self.forget_device(ordinal) {
            log::debug!("device {ordinal} was reset by a path the shim does not wrap");
            for (pool, blocks) in forgotten.pools() {
                pool.abandon(driver, blocks);
            }
        }
    }

    /// Forgets everything of device `ordinal` without calling the driver:
    /// its pools and the blocks of each never returned, if it had a pool.
    fn forget_device(&self, ordinal: i32) -> Option<Forgotten> {
        let removed = self.devices.take(ordinal);
        let host = self.hosts.take(ordinal);
        let live = self.map.take_device(ordinal);
        self.shared_blocks.forget_device(ordinal);
        let deferred: Vec<(u64, Block)> = {
            let mut deferred = lock(&self.deferred);
            let (of_device, others) = deferred.drain(..).partition(|(_, block)| block.device == ordinal);
            *deferred = others;
            of_device
        };
        for kind in [MemoryKind::Device, MemoryKind::Host] {
            let bytes = live.iter().filter(|(_, b)| b.memory.kind() == kind).map(|(_, b)| b.size).sum();
            self.stats.no_longer_in_use(ordinal, kind == MemoryKind::Host, bytes);
        }
        lock(&self.peer_grants).retain(|&(_, accessor)| accessor != ordinal);
        let device = removed?;
        write(&self.streams).forget_context(device.context);
        log::debug!("device {ordinal}: forgot its pools and {} pointer(s)", live.len() + deferred.len());
        let (host_blocks, device_blocks): (Vec<_>, Vec<_>) =
            live.into_iter().chain(deferred).partition(|(_, block)| block.memory.is_host());
        let addresses = |blocks: Vec<(u64, Block)>| blocks.into_iter().map(|(ptr, _)| ptr).collect();
        Some(Forgotten { device, host, device_blocks: addresses(device_blocks), host_blocks: addresses(host_blocks) })
    }

    /// `accessor` gained (or lost) peer access to `owner`'s memory.
    pub fn peer_access_changed(&self, driver: &impl Gpu, owner: i32, accessor: i32, allowed: bool) {
        // Lock order: devices, then grants (as `set_up`, under the devices' write lock).
        let device = self.devices.pool_after(owner, || {
            let mut grants = lock(&self.peer_grants);
            if allowed {
                grants.insert((owner, accessor));
            } else {
                grants.remove(&(owner, accessor));
            }
        });
        if let Some(device) = device {
            if let Err(e) = device.set_peer_access(driver, accessor, allowed) {
                log::warn!("device {owner}: setting access for device {accessor} failed: {e:?}");
            }
        }
    }
}
