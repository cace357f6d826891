//! The allocator's state, its construction, and the lookups every room uses.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex};

use crate::core::config::settings::Config;
use crate::core::device::pool::Device;
use crate::core::events::Events;
use crate::core::libraries::Libraries;
use crate::core::locks::ReadMostly;
use crate::core::output;
use crate::core::pool_slots::PoolSlots;
use crate::core::ptrmap::{Block, Memory, PointerMap};
use crate::core::reclaimer::Reclaimer;
use crate::core::shared_blocks::SharedBlocks;
use crate::core::stats::Stats;
use crate::core::streams::{CaptureKey, SideWork, StreamRegistry};
use crate::core::trace::Trace;
use crate::cuda::gpu::Context;

pub struct Allocator {
    pub config: Config,
    pub stats: Stats,
    /// Device memory by the library that allocated it.
    pub libraries: Libraries,
    /// The last pool events, for the out-of-memory snapshot (`SOMA_SNAPSHOT`).
    pub events: Option<Events>,
    pub(super) trace: Option<Trace>,
    /// This process's pid if it is a forked child, else 0: a child writes its
    /// statistics and trace to files of its own.
    pub(super) forked_child: AtomicU32,
    pub(super) map: PointerMap,
    /// Indexed by device ordinal: not yet seen, cannot be pooled, or its pool.
    pub(super) devices: PoolSlots,
    /// Indexed by device ordinal: the pool of pinned host memory made for it.
    pub(super) hosts: PoolSlots,
    /// Read by frees (which may run at once), written when streams come and go.
    pub(super) streams: ReadMostly<StreamRegistry>,
    /// Captures in progress, keyed by stream and, for the per-thread default
    /// stream (one handle, many streams), by thread. Held for reading while a
    /// free records events, so no capture can begin in between.
    pub(super) captures: ReadMostly<HashMap<CaptureKey, usize>>,
    /// Frees that arrived during a capture (pending in the map), issued once
    /// no capture is in progress.
    pub(super) deferred: Mutex<Vec<(u64, Block)>>,
    /// Whether `deferred` may be non-empty (checked on every call, locked rarely).
    pub(super) has_deferred: AtomicBool,
    /// A thread is retiring passed tails of destroyed streams.
    pub(super) retiring_tails: AtomicBool,
    /// Some stream's work was tracked (`issue_work` has something to do).
    pub(super) work_tracked: AtomicBool,
    /// Work off the legacy stream, for the blocks kept in its order.
    pub(super) side_work: SideWork,
    /// (owner, accessor): `accessor` enabled peer access to `owner`'s memory.
    pub(super) peer_grants: Mutex<HashSet<(i32, i32)>>,
    /// Blocks exported through CUDA IPC, and their importers' leases.
    pub(super) shared_blocks: SharedBlocks,
    /// Joins queued frees and returns passed ones, off the program's threads.
    pub reclaimer: Reclaimer,
}

impl Allocator {
    /// An allocator with no device seen yet. `config.trace` names the trace
    /// file, if any (a file that cannot be written is warned of and skipped);
    /// `object_of` names the loaded object holding a code address.
    pub fn new(config: Config, object_of: fn(usize) -> Option<String>) -> Allocator {
        let trace = config.trace.as_deref().and_then(|path| {
            let warn = |e| output::warn(format_args!("cannot write the trace to {path}: {e}; no trace is written"));
            Trace::create(path).map_err(warn).ok()
        });
        let events = config.snapshot.is_some().then(Events::default);
        let libraries = Libraries::new(config.by_library, object_of);
        Allocator {
            config,
            stats: Stats::default(),
            libraries,
            events,
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

    /// Every live block of device memory the pools handed out, by address.
    pub fn live_device_blocks(&self) -> Vec<(u64, Block)> {
        let mut live = self.map.live_blocks();
        live.retain(|(_, block)| !block.memory.is_host());
        live
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

    /// The context of the device whose pool holds the live block `ptr`.
    pub fn context_of(&self, ptr: u64) -> Option<Context> {
        self.device_context(self.live_block(ptr)?.device)
    }

    /// The UUID of device `ordinal`, once its pool is set up.
    pub fn device_uuid(&self, ordinal: i32) -> Option<[u8; 16]> {
        self.known_device(ordinal).map(|d| d.uuid)
    }

    /// The context of device `ordinal`'s pool, once the device is set up.
    pub fn device_context(&self, ordinal: i32) -> Option<Context> {
        self.known_device(ordinal).map(|d| d.context)
    }

    /// Every pool, the devices' first, then the pinned host memory pools.
    pub(super) fn every_pool(&self) -> impl Iterator<Item = Arc<Device>> {
        self.devices.pools().into_iter().chain(self.hosts.pools())
    }

    pub(super) fn known_device(&self, ordinal: i32) -> Option<Arc<Device>> {
        self.devices.pool(ordinal)
    }

    /// The pool that gave out `block`.
    pub(super) fn pool_of(&self, block: &Block) -> Option<Arc<Device>> {
        self.pool_numbered(block.device, block.memory.is_host())
    }

    /// Device `ordinal`'s pool, or (`host`) its pinned host memory pool.
    pub(super) fn pool_numbered(&self, ordinal: i32, host: bool) -> Option<Arc<Device>> {
        if host { self.hosts.pool(ordinal) } else { self.devices.pool(ordinal) }
    }

    /// The pooled device whose primary context is `context`, if any.
    pub(super) fn pooled_device_of(&self, context: Context) -> Option<Arc<Device>> {
        self.devices.find(|device| device.context == context)
    }
}
