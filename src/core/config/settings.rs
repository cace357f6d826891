//! The configuration as the shim reads it: `Config`, the effective value of
//! every `SOMA_*` variable (variables.rs has the table, parse.rs reads the
//! environment into it), and the types of its fields.

use crate::core::output;

/// Which memory pool serves the shim's allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolChoice {
    /// A pool the shim creates for each device (the program never sees it).
    Own,
    /// The device's default pool, shared with the program's own `cudaMallocAsync`.
    Default,
}

/// How a free is ordered after the work of non-blocking streams, while the
/// device has any (with none, the legacy stream orders every free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeOrder {
    /// On the GPU, as the real `cudaFree` orders it on the host: the legacy
    /// stream waits for every non-blocking stream, the block is freed there,
    /// then every non-blocking stream waits for the legacy stream.
    Barrier,
    /// A shim stream waits for every stream; the block returns to the pool
    /// once the host sees it passed. Streams stay independent.
    Join,
}

/// When a `cudaFree` with only blocking streams keeps its block on the host
/// for the next `cudaMalloc` of its size (see `turns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyCache {
    /// While several threads take turns freeing.
    Auto,
    On,
    Off,
}

/// Where `SOMA_STATS` sends the table printed at exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatsOutput {
    Off,
    Stderr,
    File(String),
}

/// What `cudaMemGetInfo` reports as free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemInfo {
    /// The driver's figure: memory the pool caches counts as used.
    Real,
    /// Memory the pool holds but does not use counts as free.
    Pool,
}

/// A byte count as written in a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bytes {
    Exact(u64),
    /// The device's total memory (only where a row allows it).
    DeviceTotal,
    /// This many hundredths of a percent of the device's total memory (only
    /// where a row allows it).
    DeviceShare(u32),
}

impl Bytes {
    /// The value in bytes, given the device's total memory.
    pub fn resolve(self, device_total: u64) -> u64 {
        match self {
            Bytes::Exact(n) => n,
            Bytes::DeviceTotal => device_total,
            Bytes::DeviceShare(basis_points) => (device_total as u128 * basis_points as u128 / 10_000) as u64,
        }
    }
}

/// The effective configuration of this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub disable: bool,
    pub pool: PoolChoice,
    pub release_threshold: Bytes,
    pub reuse_follow_event_deps: bool,
    pub reuse_opportunistic: bool,
    pub reuse_internal_deps: bool,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub free_sync: bool,
    /// Pinned host memory is served from a host memory pool.
    pub host_pool: bool,
    pub free_order: FreeOrder,
    pub pending_free_limit: Bytes,
    pub legacy_cache: LegacyCache,
    /// The driver calls that issue work on a stream are watched, so that an
    /// ordering asks only the streams in use (`core/streams.rs`).
    pub track_work: bool,
    /// Requests of at most this many bytes come from the small-block pool (0: none).
    pub small_blocks: u64,
    /// Requests of at least this many bytes come from the real allocator
    /// and stay in the shim's cache when freed (0: none).
    pub large_blocks: u64,
    /// Device memory the pool may hold per device (`Exact(u64::MAX)`: no cap).
    pub memory_limit: Bytes,
    /// How long a pool's unused memory is kept before it goes back to the
    /// driver (`SOMA_DECAY_MS`); None: kept until the program exits.
    pub decay: Option<std::time::Duration>,
    /// How long a device may see no allocation and no free before all its
    /// pools hold unused goes back (`SOMA_IDLE_MS`); None: the decay's delay.
    pub idle: Option<std::time::Duration>,
    /// Other shim processes of this user are asked for what they cache at
    /// out-of-memory, and this one answers theirs (`SOMA_NEIGHBOURS`).
    pub neighbours: bool,
    /// `SOMA_SOCKET_DIR`; None: this user's directory in /tmp.
    pub socket_dir: Option<String>,
    pub stats: StatsOutput,
    pub trace: Option<String>,
    /// `SOMA_SNAPSHOT`: where the out-of-memory snapshot goes, if anywhere.
    pub snapshot: Option<String>,
    /// Allocations are counted under the library that called them (`SOMA_BY_LIBRARY`).
    pub by_library: bool,
    pub meminfo: MemInfo,
    pub passthrough_callers: Vec<String>,
    pub log: String,
    /// Each variable with the text in force (given or default), for the log.
    pub effective: Vec<(&'static str, String)>,
}

impl Config {
    /// In a process forked from the one that loaded the shim, before it
    /// reports anything: its trace, statistics and snapshot files are
    /// `<path>.<pid>`, never the parent's.
    pub fn for_forked_child(&mut self, pid: u32) {
        for path in [&mut self.trace, &mut self.snapshot].into_iter().flatten() {
            *path = output::in_child(path, pid);
        }
        if let StatsOutput::File(path) = &mut self.stats {
            *path = output::in_child(path, pid);
        }
    }

    /// Whether `cudaMemGetInfo` answers other than the driver does
    /// (`SOMA_MEMINFO=pool`, or a `SOMA_MEMORY_LIMIT`).
    pub fn adjusts_memory_info(&self) -> bool {
        !self.disable && (self.meminfo == MemInfo::Pool || self.memory_limit != Bytes::Exact(u64::MAX))
    }

    /// Whether a request of `size` bytes is in the range the pool serves.
    pub fn pools_size(&self, size: u64) -> bool {
        size >= self.min_bytes && size <= self.max_bytes
    }
}

