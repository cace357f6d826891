//! The `SOMA_*` configuration: one table, one parser. No FFI here.
//!
//! Every variable is a row of [`VARIABLES`]; the table of docs/CONFIG.md, and
//! the README's rows, are checked against it by a test, so they cannot drift
//! apart. A `SOMA_*` variable within a few edits of one in the table is an
//! error too (a misspelt one would otherwise be ignored without a word); any
//! other is another program's, and gets a warning. With `SOMA_DISABLE=1`
//! nothing is checked.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::sync::Once;

use super::edit_distance::edit_distance;
use super::output;

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

/// What a variable's text is parsed as.
#[derive(Clone, Copy)]
enum Kind {
    Flag,
    Size { allow_total: bool },
    /// A byte count below `max`: no request is that large, so a least size
    /// of `max` would pool nothing.
    MinSize,
    /// A byte count or a percentage of the device's memory.
    Share,
    /// A whole number of milliseconds; 0 means never.
    Millis,
    Pool,
    FreeOrder,
    LegacyCache,
    Stats,
    Path,
    /// An absolute directory path, short enough for a socket's name in it.
    Directory,
    MemInfo,
    List,
    LogFilter,
}

impl Kind {
    fn accepted_forms(self) -> &'static str {
        match self {
            Kind::Flag => "0 or 1 (also true/false, yes/no, on/off)",
            Kind::Size { allow_total: false } => {
                "a byte count such as 0, 4096, 512KiB, 512MiB, 4G, 1TiB, or max"
            }
            Kind::Size { allow_total: true } => {
                "a byte count such as 0, 4096, 512MiB, 4G, or max, or total (the device's memory)"
            }
            Kind::MinSize => "a byte count such as 0, 4096, 512KiB, 512MiB, 4G or 1TiB; not max, which would pool nothing",
            Kind::Share => {
                "a byte count above 0 such as 512MiB or 40G, a percentage of the device's memory such as 50% or \
                 12.5%, or max (no limit)"
            }
            Kind::Millis => "a number of milliseconds such as 500 or 2000, or 0 (off)",
            Kind::Pool => "own or default",
            Kind::FreeOrder => "barrier or join",
            Kind::LegacyCache => "auto, on or off",
            Kind::Stats => "0 or 1 (also true/false, yes/no, on/off; 1: to stderr), or a file path, which must contain a / (such as ./stats.txt)",
            Kind::Path => "a file path, which must contain a / (such as ./trace.csv), or empty for none",
            Kind::Directory => "an absolute directory path of at most 80 bytes (such as /tmp/somashim-jobs), or empty for the default",
            Kind::MemInfo => "real or pool",
            Kind::List => "comma-separated library names such as libnccl,libfoo (empty for none)",
            Kind::LogFilter => {
                "comma-separated directives, each a level (off, error, warn, info, debug, trace), a module of \
                 the shim (somashim, somashim::core::trace) or module=level, such as warn or somashim=debug"
            }
        }
    }
}

/// A parsed value, before it is stored in its field.
enum Value {
    Flag(bool),
    Size(Bytes),
    Millis(Option<std::time::Duration>),
    Pool(PoolChoice),
    FreeOrder(FreeOrder),
    LegacyCache(LegacyCache),
    Stats(StatsOutput),
    Path(Option<String>),
    MemInfo(MemInfo),
    List(Vec<String>),
    Text(String),
}

/// One row of the table: the variable, its type, its default, one line of doc,
/// and where the value goes.
pub struct Variable {
    pub name: &'static str,
    kind: Kind,
    pub default: &'static str,
    pub doc: &'static str,
    store: fn(&mut Config, Value),
}

impl Variable {
    /// `value` parsed, with its text; one that does not parse (or is not
    /// UTF-8) is an error naming the variable.
    fn read<'a>(&self, value: &'a OsStr) -> Result<(&'a str, Value), ConfigError> {
        let bad_value =
            || ConfigError::BadValue { variable: self.name, value: shown(value), accepted: self.kind.accepted_forms() };
        let text = value.to_str().ok_or_else(bad_value)?;
        Ok((text, parse(self.kind, text).ok_or_else(bad_value)?))
    }
}

macro_rules! store {
    ($field:ident, $variant:ident) => {
        |config: &mut Config, value: Value| {
            if let Value::$variant(v) = value {
                config.$field = v;
            }
        }
    };
}

macro_rules! store_bytes {
    ($field:ident) => {
        |config: &mut Config, value: Value| {
            if let Value::Size(Bytes::Exact(v)) = value {
                config.$field = v;
            }
        }
    };
}

pub static VARIABLES: &[Variable] = &[
    Variable {
        name: "SOMA_DISABLE",
        kind: Kind::Flag,
        default: "0",
        doc: "1: every call goes to the real runtime untouched.",
        store: store!(disable, Flag),
    },
    Variable {
        name: "SOMA_POOL",
        kind: Kind::Pool,
        default: "own",
        doc: "own: a pool the shim creates per device; default: the device's default pool.",
        store: store!(pool, Pool),
    },
    Variable {
        name: "SOMA_RELEASE_THRESHOLD",
        kind: Kind::Size { allow_total: true },
        default: "max",
        doc: "Memory the pool keeps at a synchronization instead of returning it to the driver.",
        store: store!(release_threshold, Size),
    },
    Variable {
        name: "SOMA_REUSE_FOLLOW_EVENT_DEPS",
        kind: Kind::Flag,
        default: "0",
        doc: "Pool policy cudaMemPoolReuseFollowEventDependencies; 1 lets a block the program frees with cudaFreeAsync reach a cudaMalloc on the legacy stream early (see docs/DESIGN.md).",
        store: store!(reuse_follow_event_deps, Flag),
    },
    Variable {
        name: "SOMA_REUSE_OPPORTUNISTIC",
        kind: Kind::Flag,
        default: "1",
        doc: "Pool policy cudaMemPoolReuseAllowOpportunistic: reuse blocks whose free the GPU has passed.",
        store: store!(reuse_opportunistic, Flag),
    },
    Variable {
        name: "SOMA_REUSE_INTERNAL_DEPS",
        kind: Kind::Flag,
        default: "0",
        doc: "Pool policy cudaMemPoolReuseAllowInternalDependencies; 1 makes cudaMalloc wait on the host for the reused block's free.",
        store: store!(reuse_internal_deps, Flag),
    },
    Variable {
        name: "SOMA_MIN_BYTES",
        kind: Kind::MinSize,
        default: "1",
        doc: "Smaller requests go to the real cudaMalloc.",
        store: store_bytes!(min_bytes),
    },
    Variable {
        name: "SOMA_MAX_BYTES",
        kind: Kind::Size { allow_total: false },
        default: "max",
        doc: "Larger requests go to the real cudaMalloc.",
        store: store_bytes!(max_bytes),
    },
    Variable {
        name: "SOMA_FREE_SYNC",
        kind: Kind::Flag,
        default: "0",
        doc: "1: cudaFree returns once the device is idle, as the real one does (still pooled).",
        store: store!(free_sync, Flag),
    },
    Variable {
        name: "SOMA_HOST_POOL",
        kind: Kind::Flag,
        default: "0",
        doc: "1: pinned host memory from a host memory pool; copies that name it as device memory then fail (docs/CONTRACT.md).",
        store: store!(host_pool, Flag),
    },
    Variable {
        name: "SOMA_FREE_ORDER",
        kind: Kind::FreeOrder,
        default: "join",
        doc: "With non-blocking streams, join: streams stay independent, blocks are reused once the GPU has passed their free; barrier: each batch of frees orders them and the legacy stream on the GPU as the real cudaFree does on the host (blocks reused at once).",
        store: store!(free_order, FreeOrder),
    },
    Variable {
        name: "SOMA_PENDING_FREE_LIMIT",
        kind: Kind::Size { allow_total: true },
        default: "64MiB",
        doc: "Bytes freed and not yet reused, per device, past which batches of frees are ordered behind barriers on the GPU and reused at once instead of once the GPU has passed them.",
        store: store!(pending_free_limit, Size),
    },
    Variable {
        name: "SOMA_LEGACY_CACHE",
        kind: Kind::LegacyCache,
        default: "auto",
        doc: "With only blocking streams, whether cudaFree keeps its block (within SOMA_PENDING_FREE_LIMIT) for the next cudaMalloc of its size, which then makes no driver call; auto: while several threads take turns freeing.",
        store: store!(legacy_cache, LegacyCache),
    },
    Variable {
        name: "SOMA_TRACK_WORK",
        kind: Kind::Flag,
        default: "1",
        doc: "Watch the driver calls that issue work on a stream, so that ordering a batch of frees asks only the non-blocking streams with work not seen finished, and a barrier's wait is issued on a stream just before its next work; 0: every live non-blocking stream at every batch. Off where the driver is newer than the CUDA whose entry points the shim knows.",
        store: store!(track_work, Flag),
    },
    Variable {
        name: "SOMA_SMALL_BLOCKS",
        kind: Kind::Size { allow_total: false },
        default: "4MiB",
        doc: "Requests of at most this size come from a second pool of the shim's own, and their freed blocks wait in the host cache for reuse within a budget of their own (SOMA_PENDING_FREE_LIMIT again); 0: one pool for every size.",
        store: store_bytes!(small_blocks),
    },
    Variable {
        name: "SOMA_LARGE_BLOCKS",
        kind: Kind::Size { allow_total: false },
        default: "64MiB",
        doc: "Requests of at least this size that take the program past its recent peak are allocated by the real cuMemAlloc, which maps memory faster than a pool grows, and their freed blocks wait in the shim's cache for a request of their size; within the peak they come from the pool; the device holds at most 1.2 times that peak, giving cached blocks back with the real cuMemFree first; 0: every size from the pool.",
        store: store_bytes!(large_blocks),
    },
    Variable {
        name: "SOMA_MEMORY_LIMIT",
        kind: Kind::Share,
        default: "max",
        doc: "Device memory the pool may hold per device (cached blocks included); past it cudaMalloc fails as out of memory.",
        store: store!(memory_limit, Size),
    },
    Variable {
        name: "SOMA_DECAY_MS",
        kind: Kind::Millis,
        default: "1000",
        doc: "Memory a pool holds beyond what the program used in the last this many milliseconds goes back to the driver, for other processes; device and pinned host pools; 0: kept until exit.",
        store: store!(decay, Millis),
    },
    Variable {
        name: "SOMA_IDLE_MS",
        kind: Kind::Millis,
        default: "20",
        doc: "After this many milliseconds with no allocation and no free on a device, once its work is done, all its pools hold unused goes back to the driver (what the program no longer holds reaches other processes about as soon as the program's own frees would); 0, or not below SOMA_DECAY_MS: after SOMA_DECAY_MS instead. Nothing goes with SOMA_DECAY_MS=0.",
        store: store!(idle, Millis),
    },
    Variable {
        name: "SOMA_NEIGHBOURS",
        kind: Kind::Flag,
        default: "1",
        doc: "1: out of memory, the shim asks this user's other shim processes on the device to give back what they cache (waiting 200 ms at most) before it fails, answers their requests, and is listed by somarun --ps.",
        store: store!(neighbours, Flag),
    },
    Variable {
        name: "SOMA_SOCKET_DIR",
        kind: Kind::Directory,
        default: "",
        doc: "The directory of the sockets through which shim processes share CUDA IPC handles, give memory back to each other and answer somarun --ps (made with mode 0700 if missing); empty: /tmp/somashim-<uid>. Processes naming different directories do not see each other.",
        store: store!(socket_dir, Path),
    },
    Variable {
        name: "SOMA_STATS",
        kind: Kind::Stats,
        default: "0",
        doc: "1 or a file: at exit, a table per device of what the pool and the real allocator served.",
        store: store!(stats, Stats),
    },
    Variable {
        name: "SOMA_TRACE",
        kind: Kind::Path,
        default: "",
        doc: "A file: a CSV timeline of allocation events (time, device, op, size, pointer, in use, reserved).",
        store: store!(trace, Path),
    },
    Variable {
        name: "SOMA_SNAPSHOT",
        kind: Kind::Path,
        default: "",
        doc: "A file: at the first out-of-memory the program is given, what held the device's memory (every live block and the library that allocated it, the pools, the device's free memory, the other shim processes on it, the last 4096 pool events), as JSON; scripts/snapshot_viz.py summarizes it and makes PyTorch's memory-viewer file of it.",
        store: store!(snapshot, Path),
    },
    Variable {
        name: "SOMA_BY_LIBRARY",
        kind: Kind::Flag,
        default: "1",
        doc: "1: each allocation is counted under the library that called it (SOMA_STATS, somarun --ps, SOMA_SNAPSHOT); 0: not counted, and those tables have no rows by library.",
        store: store!(by_library, Flag),
    },
    Variable {
        name: "SOMA_MEMINFO",
        kind: Kind::MemInfo,
        default: "real",
        doc: "pool: cudaMemGetInfo counts memory the pool holds but does not use as free.",
        store: store!(meminfo, MemInfo),
    },
    Variable {
        name: "SOMA_PASSTHROUGH_CALLERS",
        kind: Kind::List,
        default: "",
        doc: "Allocations called from these libraries go to the real allocator.",
        store: store!(passthrough_callers, List),
    },
    Variable {
        name: "SOMA_LOG",
        kind: Kind::LogFilter,
        default: "warn",
        doc: "Log filter (env_logger syntax), written to stderr.",
        store: store!(log, Text),
    },
];

/// A configuration that cannot be used. Each message names the variable, the
/// value as given (quoted, with bytes that are not UTF-8 as `\xNN`) and what
/// is accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A value that does not parse (or is not UTF-8).
    BadValue { variable: &'static str, value: String, accepted: &'static str },
    /// A `SOMA_*` variable that is not in the table but a misspelling of one.
    UnknownVariable { name: String, value: String, closest: &'static str },
    /// `SOMA_MIN_BYTES` above `SOMA_MAX_BYTES`: nothing would be pooled.
    EmptySizeRange { min: String, max: String },
    /// Two of the output files (`SOMA_STATS`, `SOMA_TRACE`, `SOMA_SNAPSHOT`)
    /// naming one file: one would replace the other. Each: the variable and its value.
    SameFile { first: (&'static str, String), second: (&'static str, String) },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::BadValue { variable, value, accepted } => {
                write!(f, "somashim: {variable}=\"{value}\" is not valid; accepted: {accepted}")
            }
            ConfigError::UnknownVariable { name, value, closest } => {
                let known: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
                write!(
                    f,
                    "somashim: {name}=\"{value}\" is not a somashim variable; did you mean {closest}? accepted: {}",
                    known.join(", ")
                )
            }
            ConfigError::EmptySizeRange { min, max } => write!(
                f,
                "somashim: SOMA_MIN_BYTES=\"{min}\" is more than SOMA_MAX_BYTES=\"{max}\", so nothing would be \
                 pooled; accepted: SOMA_MIN_BYTES at most SOMA_MAX_BYTES (SOMA_DISABLE=1 passes every call through)"
            ),
            ConfigError::SameFile { first: (a, a_value), second: (b, b_value) } => write!(
                f,
                "somashim: {a}=\"{a_value}\" and {b}=\"{b_value}\" name the same file, so one would replace \
                 the other; accepted: two different files"
            ),
        }
    }
}

impl Config {
    /// Reads the configuration from the process's environment (`vars`: every
    /// name and value; those not starting with `SOMA_` are not looked at).
    /// `SOMA_*` variables of other programs are warned of, once a process.
    pub fn from_environment(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Result<Config, ConfigError> {
        let (config, others) = Config::read(vars)?;
        if !others.is_empty() {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                output::warn(format_args!("ignoring SOMA_* variables that are not somashim's: {}", others.join(", ")))
            });
        }
        Ok(config)
    }

    /// The configuration, and the `SOMA_*` variables it leaves to other
    /// programs (as the messages show them).
    fn read(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Result<(Config, Vec<String>), ConfigError> {
        let mut given: Vec<Option<OsString>> = vec![None; VARIABLES.len()];
        let mut unknown = Vec::new();
        for (name, value) in vars {
            if !name.as_bytes().starts_with(b"SOMA_") {
                continue;
            }
            match VARIABLES.iter().position(|v| v.name.as_bytes() == name.as_bytes()) {
                // The first of duplicate entries wins, as with getenv.
                Some(index) => {
                    given[index].get_or_insert(value);
                }
                None => unknown.push((name, value)),
            }
        }
        let mut config = Config::placeholder();
        for (variable, given) in VARIABLES.iter().zip(&given) {
            let default = OsStr::new(variable.default);
            let (text, value) = match variable.read(given.as_deref().unwrap_or(default)) {
                // SOMA_DISABLE=1 must let the program run as it would without
                // the shim, so nothing else is checked: a value that is not
                // valid is left at its default. SOMA_DISABLE is the table's
                // first row, so it is read before the others.
                Err(_) if config.disable => variable.read(default)?,
                read => read?,
            };
            (variable.store)(&mut config, value);
            config.effective.push((variable.name, text.to_string()));
        }
        if config.disable {
            return Ok((config, Vec::new()));
        }
        let mut others = Vec::new();
        for (name, value) in unknown {
            match misspelt(&name) {
                Some(closest) => {
                    return Err(ConfigError::UnknownVariable { name: shown(&name), value: shown(&value), closest })
                }
                None => others.push(shown(&name)),
            }
        }
        if config.min_bytes > config.max_bytes {
            let text = |name| config.effective.iter().find(|(n, _)| *n == name).map(|(_, t)| t.clone());
            return Err(ConfigError::EmptySizeRange {
                min: text("SOMA_MIN_BYTES").unwrap_or_default(),
                max: text("SOMA_MAX_BYTES").unwrap_or_default(),
            });
        }
        let stats = match &config.stats {
            StatsOutput::File(path) => Some(path),
            _ => None,
        };
        let outputs = [("SOMA_STATS", stats), ("SOMA_TRACE", config.trace.as_ref()), ("SOMA_SNAPSHOT", config.snapshot.as_ref())];
        let named: Vec<(&'static str, &String)> = outputs.into_iter().filter_map(|(name, path)| Some((name, path?))).collect();
        for (i, &(a, a_path)) in named.iter().enumerate() {
            if let Some(&(b, b_path)) = named[i + 1..].iter().find(|(_, b_path)| output::same_file(a_path, b_path)) {
                let value = |path: &String| shown(OsStr::new(path));
                return Err(ConfigError::SameFile { first: (a, value(a_path)), second: (b, value(b_path)) });
            }
        }
        Ok((config, others))
    }

    /// Every field before the table fills it in; never seen by callers.
    fn placeholder() -> Config {
        Config {
            disable: false,
            pool: PoolChoice::Own,
            release_threshold: Bytes::Exact(0),
            reuse_follow_event_deps: false,
            reuse_opportunistic: false,
            reuse_internal_deps: false,
            min_bytes: 0,
            max_bytes: 0,
            free_sync: false,
            host_pool: false,
            free_order: FreeOrder::Join,
            pending_free_limit: Bytes::Exact(0),
            legacy_cache: LegacyCache::Auto,
            track_work: true,
            small_blocks: 0,
            large_blocks: 0,
            memory_limit: Bytes::Exact(0),
            decay: None,
            idle: None,
            neighbours: false,
            socket_dir: None,
            stats: StatsOutput::Off,
            trace: None,
            snapshot: None,
            by_library: false,
            meminfo: MemInfo::Real,
            passthrough_callers: Vec::new(),
            log: String::new(),
            effective: Vec::new(),
        }
    }

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

/// A value as the messages show it: escaped as Rust writes a string, with
/// each byte that is not UTF-8 as `\xNN`.
fn shown(value: &OsStr) -> String {
    let mut out = String::new();
    for chunk in value.as_bytes().utf8_chunks() {
        out.extend(chunk.valid().chars().flat_map(char::escape_debug));
        out.extend(chunk.invalid().iter().map(|b| format!("\\x{b:02x}")));
    }
    out
}

/// The most edits (case aside) that make a `SOMA_*` name a misspelling of a
/// variable of the table (`SOMA_DISABEL`, `SOMA_STAT`) rather than another
/// program's (`SOMA_HOME`).
const MISSPELLING_EDITS: usize = 2;

/// The known variable that `name` is a misspelling of, if any: the nearest
/// by edit distance, case aside.
fn misspelt(name: &OsStr) -> Option<&'static str> {
    let name = name.as_bytes().to_ascii_uppercase();
    let (edits, closest) =
        VARIABLES.iter().map(|v| (edit_distance(&name, v.name.as_bytes()), v.name)).min_by_key(|&(edits, _)| edits)?;
    (edits <= MISSPELLING_EDITS).then_some(closest)
}

/// Only ASCII whitespace is trimmed: a Unicode space (a no-break space pasted
/// from a web page, say) is part of the value, and so makes it invalid.
fn parse(kind: Kind, text: &str) -> Option<Value> {
    let text = text.trim_ascii();
    match kind {
        Kind::Flag => parse_flag(text).map(Value::Flag),
        Kind::Size { allow_total } => match text.to_ascii_lowercase().as_str() {
            "total" if allow_total => Some(Value::Size(Bytes::DeviceTotal)),
            _ => parse_size(text).map(|n| Value::Size(Bytes::Exact(n))),
        },
        Kind::MinSize => parse_size(text).filter(|&n| n < u64::MAX).map(|n| Value::Size(Bytes::Exact(n))),
        // A limit of nothing would refuse every allocation: not a setting anyone means.
        Kind::Share => match text.strip_suffix('%') {
            Some(percent) => parse_percent(percent).map(|share| Value::Size(Bytes::DeviceShare(share))),
            None => parse_size(text).filter(|&n| n > 0).map(|n| Value::Size(Bytes::Exact(n))),
        },
        Kind::Millis => match text.parse::<u64>().ok()? {
            0 => Some(Value::Millis(None)),
            ms => Some(Value::Millis(Some(std::time::Duration::from_millis(ms)))),
        },
        Kind::Pool => match text.to_ascii_lowercase().as_str() {
            "own" => Some(Value::Pool(PoolChoice::Own)),
            "default" => Some(Value::Pool(PoolChoice::Default)),
            _ => None,
        },
        Kind::FreeOrder => match text.to_ascii_lowercase().as_str() {
            "barrier" => Some(Value::FreeOrder(FreeOrder::Barrier)),
            "join" => Some(Value::FreeOrder(FreeOrder::Join)),
            _ => None,
        },
        Kind::LegacyCache => match text.to_ascii_lowercase().as_str() {
            "auto" => Some(Value::LegacyCache(LegacyCache::Auto)),
            "on" => Some(Value::LegacyCache(LegacyCache::On)),
            "off" => Some(Value::LegacyCache(LegacyCache::Off)),
            _ => None,
        },
        Kind::Stats if text.is_empty() => Some(Value::Stats(StatsOutput::Off)),
        Kind::Stats => match file_path(text) {
            Some(path) => Some(Value::Stats(StatsOutput::File(path))),
            None => parse_flag(text).map(|on| Value::Stats(if on { StatsOutput::Stderr } else { StatsOutput::Off })),
        },
        Kind::Path if text.is_empty() => Some(Value::Path(None)),
        Kind::Path => file_path(text).map(|path| Value::Path(Some(path))),
        Kind::Directory if text.is_empty() => Some(Value::Path(None)),
        Kind::Directory => (text.starts_with('/') && text.len() <= MAX_SOCKET_DIR).then(|| Value::Path(Some(text.to_string()))),
        Kind::MemInfo => match text.to_ascii_lowercase().as_str() {
            "real" => Some(Value::MemInfo(MemInfo::Real)),
            "pool" => Some(Value::MemInfo(MemInfo::Pool)),
            _ => None,
        },
        Kind::List => Some(Value::List(
            text.split(',').map(str::trim_ascii).filter(|s| !s.is_empty()).map(String::from).collect(),
        )),
        Kind::LogFilter => text.split(',').all(is_log_directive).then(|| Value::Text(text.to_string())),
    }
}

/// A file to write: a path is told from a flag by its `/`, so that a flag
/// (`0`, `off`) or a mistyped one (`ture`) cannot become a file in the
/// current directory.
/// A socket's path (108 bytes at most) is the directory, `/`, and up to 27
/// bytes of name (`<pid>-<endpoint>`).
const MAX_SOCKET_DIR: usize = 80;

fn file_path(text: &str) -> Option<String> {
    text.contains('/').then(|| text.to_string())
}

/// One directive of `SOMA_LOG`: `level`, `module` or `module=level`, where a
/// module is the shim's (`somashim`, `somashim::core::trace`): nothing else in
/// the library logs. Empty ones (as in `warn,`) are allowed. env_logger takes
/// any word as a module name, so a typo (`verbose`) would silently turn the
/// log off: each directive is checked here.
fn is_log_directive(directive: &str) -> bool {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let is_level = |text: &str| LEVELS.iter().any(|level| level.eq_ignore_ascii_case(text));
    let is_module = |text: &str| {
        (text == "somashim" || text.starts_with("somashim::"))
            && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let directive = directive.trim_ascii();
    match directive.split_once('=') {
        Some((module, level)) => is_module(module) && is_level(level),
        None => directive.is_empty() || is_level(directive) || is_module(directive),
    }
}

/// A percentage above 0 and at most 100, with at most two decimals, in
/// hundredths of a percent (`12.5` is 1250).
fn parse_percent(text: &str) -> Option<u32> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || whole.len() > 3 || fraction.len() > 2 || !digits(whole) || !digits(fraction) {
        return None;
    }
    let fraction: u32 = format!("{fraction:0<2}").parse().ok()?;
    let share = whole.parse::<u32>().ok()? * 100 + fraction;
    (1..=10_000).contains(&share).then_some(share)
}

fn parse_flag(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `4096`, `512MiB`, `4G`, `max`. Every unit is a power of 1024: K, KB and KiB
/// all mean 1024 bytes, as in most GPU tooling.
pub fn parse_size(text: &str) -> Option<u64> {
    let lower = text.trim_ascii().to_ascii_lowercase();
    if lower == "max" {
        return Some(u64::MAX);
    }
    let split = lower.find(|c: char| !c.is_ascii_digit()).unwrap_or(lower.len());
    let (digits, unit) = lower.split_at(split);
    let number: u64 = digits.parse().ok()?;
    let shift = match unit.trim_ascii() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn vars<'a>(pairs: &'a [(&str, &str)]) -> impl Iterator<Item = (OsString, OsString)> + 'a {
        pairs.iter().map(|(k, v)| (OsString::from(k), OsString::from(v)))
    }

    fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_environment(vars(pairs))
    }

    /// The variable a bad value was blamed on.
    fn blamed(error: ConfigError) -> &'static str {
        match error {
            ConfigError::BadValue { variable, .. } => variable,
            other => panic!("not a bad value: {other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = config(&[]).unwrap();
        assert!(!c.disable);
        assert_eq!(c.pool, PoolChoice::Own);
        assert_eq!(c.release_threshold, Bytes::Exact(u64::MAX));
        assert!(!c.reuse_follow_event_deps && c.reuse_opportunistic && !c.reuse_internal_deps);
        assert_eq!((c.min_bytes, c.max_bytes), (1, u64::MAX));
        assert!(!c.free_sync);
        assert_eq!(c.free_order, FreeOrder::Join);
        assert_eq!(c.pending_free_limit, Bytes::Exact(64 << 20));
        assert_eq!(c.legacy_cache, LegacyCache::Auto);
        assert_eq!(c.memory_limit, Bytes::Exact(u64::MAX));
        assert_eq!(c.decay, Some(std::time::Duration::from_secs(1)));
        assert_eq!(c.idle, Some(std::time::Duration::from_millis(20)));
        assert!(c.neighbours);
        assert_eq!(c.stats, StatsOutput::Off);
        assert_eq!(c.trace, None);
        assert_eq!(c.meminfo, MemInfo::Real);
        assert!(c.passthrough_callers.is_empty());
        assert_eq!(c.log, "warn");
    }

    #[test]
    fn stats_go_to_stderr_or_a_file() {
        assert_eq!(config(&[("SOMA_STATS", "1")]).unwrap().stats, StatsOutput::Stderr);
        assert_eq!(config(&[("SOMA_STATS", "/tmp/s.txt")]).unwrap().stats, StatsOutput::File("/tmp/s.txt".into()));
        assert_eq!(config(&[("SOMA_STATS", "0")]).unwrap().stats, StatsOutput::Off);
        assert_eq!(config(&[("SOMA_STATS", "./s")]).unwrap().stats, StatsOutput::File("./s".into()));
        assert_eq!(config(&[("SOMA_STATS", "")]).unwrap().stats, StatsOutput::Off);
    }

    #[test]
    fn the_socket_directory_is_absolute_and_leaves_room_for_a_socket_name() {
        assert_eq!(config(&[]).unwrap().socket_dir, None);
        assert_eq!(config(&[("SOMA_SOCKET_DIR", "/tmp/jobs-a")]).unwrap().socket_dir.as_deref(), Some("/tmp/jobs-a"));
        assert_eq!(blamed(config(&[("SOMA_SOCKET_DIR", "jobs")]).unwrap_err()), "SOMA_SOCKET_DIR");
        let long = format!("/{}", "d".repeat(80));
        assert_eq!(blamed(config(&[("SOMA_SOCKET_DIR", long.as_str())]).unwrap_err()), "SOMA_SOCKET_DIR");
    }

    #[test]
    fn a_stats_path_needs_a_slash_so_a_mistyped_flag_is_an_error() {
        let e = config(&[("SOMA_STATS", "ture")]).unwrap_err();
        let message = e.to_string();
        assert!(message.contains("SOMA_STATS=\"ture\"") && message.contains("./stats.txt"), "{message}");
        assert_eq!(blamed(config(&[("SOMA_STATS", "stats.txt")]).unwrap_err()), "SOMA_STATS");
    }

    #[test]
    fn a_trace_path_needs_a_slash_so_a_flag_is_an_error() {
        for flag in ["0", "1", "off", "trace.csv"] {
            let message = config(&[("SOMA_TRACE", flag)]).unwrap_err().to_string();
            assert!(message.contains(&format!("SOMA_TRACE=\"{flag}\"")) && message.contains("./trace.csv"), "{message}");
        }
        assert_eq!(config(&[("SOMA_TRACE", "./t.csv")]).unwrap().trace.as_deref(), Some("./t.csv"));
        assert_eq!(config(&[("SOMA_TRACE", "")]).unwrap().trace, None);
    }

    #[test]
    fn a_value_that_is_not_utf8_is_an_error_not_unset() {
        let value = OsString::from_vec(b"1\xff".to_vec());
        let e = Config::from_environment([(OsString::from("SOMA_DISABLE"), value)]).unwrap_err();
        assert_eq!(e.to_string().lines().count(), 1);
        assert!(e.to_string().starts_with("somashim: SOMA_DISABLE=\"1\\xff\" is not valid; accepted: 0 or 1"), "{e}");
    }

    #[test]
    fn a_misspelt_variable_names_the_closest_known_one() {
        let e = config(&[("SOMA_DISABEL", "1")]).unwrap_err();
        assert!(matches!(&e, ConfigError::UnknownVariable { closest: "SOMA_DISABLE", .. }), "{e:?}");
        let message = e.to_string();
        assert!(message.contains("SOMA_DISABEL=\"1\"") && message.contains("did you mean SOMA_DISABLE?"), "{message}");
        let e = config(&[("SOMA_FOO", "1")]).unwrap_err();
        assert!(matches!(e, ConfigError::UnknownVariable { closest: "SOMA_POOL", .. }), "{e:?}");
        assert!(config(&[("SOMASHIM_LIB", "/x.so"), ("PATH", "/bin"), ("SOMA", "1")]).is_ok(), "only SOMA_* is checked");
        assert_eq!(edit_distance(b"kitten", b"sitting"), 3);
        assert_eq!(edit_distance(b"", b"abc"), 3);
    }

    #[test]
    fn another_programs_variable_is_left_to_it() {
        let pairs = [("SOMA_HOME", "/opt"), ("SOMA_POOL", "default"), ("SOMA_CACHE_DIR", "/tmp")];
        let (c, others) = Config::read(vars(&pairs)).unwrap();
        assert_eq!(c.pool, PoolChoice::Default);
        assert_eq!(others, ["SOMA_HOME", "SOMA_CACHE_DIR"]);
        assert!(Config::read(vars(&[("SOMA_POOL", "own")])).unwrap().1.is_empty());
        let typos = [("SOMA_STAT", "SOMA_STATS"), ("SOMA_pool", "SOMA_POOL"), ("SOMA_TRACEE", "SOMA_TRACE"), ("SOMA_LGO", "SOMA_LOG")];
        for (typo, meant) in typos {
            let e = config(&[("SOMA_HOME", "/opt"), (typo, "1")]).unwrap_err();
            assert!(matches!(&e, ConfigError::UnknownVariable { closest, .. } if *closest == meant), "{typo}: {e:?}");
        }
    }

    #[test]
    fn with_disable_nothing_else_is_checked() {
        let not_utf8 = OsString::from_vec(b"\xff".to_vec());
        for variable in VARIABLES.iter().filter(|v| v.name != "SOMA_DISABLE") {
            let given = [("SOMA_DISABLE".into(), "1".into()), (variable.name.into(), not_utf8.clone())];
            let c = Config::from_environment(given).unwrap_or_else(|e| panic!("{}: {e}", variable.name));
            assert!(c.disable);
            let effective = (variable.name, variable.default.to_string());
            assert!(c.effective.contains(&effective), "{} is left at its default", variable.name);
        }
        let (c, others) = Config::read(vars(&[
            ("SOMA_DISABLE", "yes"),
            ("SOMA_DISABEL", "1"),
            ("SOMA_HOME", "/opt"),
            ("SOMA_MIN_BYTES", "2MiB"),
            ("SOMA_MAX_BYTES", "1MiB"),
            ("SOMA_STATS", "/tmp/soma.out"),
            ("SOMA_TRACE", "/tmp/soma.out"),
        ]))
        .unwrap();
        assert!(c.disable && others.is_empty());
        assert_eq!(blamed(config(&[("SOMA_DISABLE", "maybe"), ("SOMA_POOL", "shared")]).unwrap_err()), "SOMA_DISABLE");
        assert_eq!(blamed(config(&[("SOMA_DISABLE", "0"), ("SOMA_POOL", "shared")]).unwrap_err()), "SOMA_POOL");
    }

    #[test]
    fn log_filters_are_checked() {
        for good in ["warn", "", "off", "somashim=debug", "somashim::core::trace=TRACE", "somashim", "info,somashim=trace,"] {
            assert_eq!(config(&[("SOMA_LOG", good)]).unwrap().log, good, "{good}");
        }
        for bad in ["verbose", "=", "somashim=", "=debug", "somashim=loud", "warn/regex", "other=debug", "some shim"] {
            assert_eq!(blamed(config(&[("SOMA_LOG", bad)]).unwrap_err()), "SOMA_LOG", "{bad}");
        }
    }

    #[test]
    fn min_bytes_above_max_bytes_is_an_error() {
        let e = config(&[("SOMA_MIN_BYTES", "2MiB"), ("SOMA_MAX_BYTES", "1MiB")]).unwrap_err();
        assert_eq!(e, ConfigError::EmptySizeRange { min: "2MiB".into(), max: "1MiB".into() });
        assert!(e.to_string().contains("SOMA_MIN_BYTES=\"2MiB\" is more than SOMA_MAX_BYTES=\"1MiB\""), "{e}");
        assert!(config(&[("SOMA_MIN_BYTES", "1MiB"), ("SOMA_MAX_BYTES", "1MiB")]).is_ok());
    }

    #[test]
    fn min_bytes_of_max_pools_nothing_so_it_is_an_error() {
        for max in ["max", " MAX", "18446744073709551615"] {
            let message = config(&[("SOMA_MIN_BYTES", max)]).unwrap_err().to_string();
            assert!(message.contains("SOMA_MIN_BYTES") && message.contains("not max"), "{max}: {message}");
        }
        assert_eq!(config(&[("SOMA_MIN_BYTES", "1TiB")]).unwrap().min_bytes, 1 << 40);
        assert_eq!(config(&[("SOMA_MIN_BYTES", "0")]).unwrap().min_bytes, 0);
        assert_eq!(config(&[("SOMA_MAX_BYTES", "max")]).unwrap().max_bytes, u64::MAX);
    }

    #[test]
    fn a_forked_child_writes_files_of_its_own() {
        let settings = [("SOMA_STATS", "/tmp/s.txt"), ("SOMA_TRACE", "/tmp/t.csv"), ("SOMA_SNAPSHOT", "/tmp/o.json")];
        let mut child = config(&settings).unwrap();
        child.for_forked_child(42);
        assert_eq!(child.stats, StatsOutput::File("/tmp/s.txt.42".into()));
        assert_eq!((child.trace.as_deref(), child.snapshot.as_deref()), (Some("/tmp/t.csv.42"), Some("/tmp/o.json.42")));
    }

    #[test]
    fn stats_and_trace_in_one_file_is_an_error() {
        let e = config(&[("SOMA_STATS", "/tmp/soma.out"), ("SOMA_TRACE", "/tmp//soma.out")]).unwrap_err();
        let first = ("SOMA_STATS", "/tmp/soma.out".into());
        assert_eq!(e, ConfigError::SameFile { first, second: ("SOMA_TRACE", "/tmp//soma.out".into()) });
        let message = e.to_string();
        assert!(message.contains("SOMA_STATS=\"/tmp/soma.out\" and SOMA_TRACE=\"/tmp//soma.out\""), "{message}");
        assert!(message.contains("accepted: two different files"), "{message}");
        assert!(config(&[("SOMA_STATS", "/tmp/soma.stats"), ("SOMA_TRACE", "/tmp/soma.csv")]).is_ok());
        assert!(config(&[("SOMA_STATS", "1"), ("SOMA_TRACE", "/tmp/soma.csv")]).is_ok());
        for other in ["SOMA_STATS", "SOMA_TRACE"] {
            let e = config(&[(other, "/tmp/x.out"), ("SOMA_SNAPSHOT", "/tmp/./x.out")]).unwrap_err();
            assert_eq!(e, ConfigError::SameFile { first: (other, "/tmp/x.out".into()), second: ("SOMA_SNAPSHOT", "/tmp/./x.out".into()) });
        }
    }

    #[test]
    fn only_ascii_whitespace_is_trimmed() {
        assert!(config(&[("SOMA_DISABLE", " 1\t")]).unwrap().disable);
        assert_eq!(config(&[("SOMA_PENDING_FREE_LIMIT", " 4 MiB ")]).unwrap().pending_free_limit, Bytes::Exact(4 << 20));
        for value in ["\u{a0}1", "1\u{2003}", "\u{3000}4MiB"] {
            let variable = if value.ends_with("MiB") { "SOMA_MAX_BYTES" } else { "SOMA_DISABLE" };
            assert_eq!(blamed(config(&[(variable, value)]).unwrap_err()), variable, "{value:?}");
        }
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("4 GB"), Some(4 << 30));
        assert_eq!(parse_size("1tib"), Some(1 << 40));
        assert_eq!(parse_size("MAX"), Some(u64::MAX));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("1.5G"), None);
        assert_eq!(parse_size("99999999999T"), None, "overflow is an error, not a wrap");
    }

    #[test]
    fn threshold_accepts_total_but_max_bytes_does_not() {
        let c = config(&[("SOMA_RELEASE_THRESHOLD", "total")]).unwrap();
        assert_eq!(c.release_threshold, Bytes::DeviceTotal);
        assert_eq!(c.release_threshold.resolve(80 << 30), 80 << 30);
        assert_eq!(blamed(config(&[("SOMA_MAX_BYTES", "total")]).unwrap_err()), "SOMA_MAX_BYTES");
    }

    #[test]
    fn the_decay_is_a_whole_number_of_milliseconds_and_0_is_never() {
        assert_eq!(config(&[("SOMA_DECAY_MS", "0")]).unwrap().decay, None);
        assert_eq!(config(&[("SOMA_DECAY_MS", " 250 ")]).unwrap().decay, Some(std::time::Duration::from_millis(250)));
        assert_eq!(config(&[("SOMA_IDLE_MS", "0")]).unwrap().idle, None);
        assert_eq!(config(&[("SOMA_IDLE_MS", "20")]).unwrap().idle, Some(std::time::Duration::from_millis(20)));
        for bad in ["1s", "-5", "1.5", "", "max"] {
            assert_eq!(blamed(config(&[("SOMA_DECAY_MS", bad)]).unwrap_err()), "SOMA_DECAY_MS", "{bad:?}");
        }
        assert!(!config(&[("SOMA_NEIGHBOURS", "0")]).unwrap().neighbours);
    }

    #[test]
    fn the_memory_limit_is_a_size_or_a_share_of_the_device() {
        let limit = |text| config(&[("SOMA_MEMORY_LIMIT", text)]).map(|c| c.memory_limit);
        assert_eq!(limit("40GiB"), Ok(Bytes::Exact(40 << 30)));
        assert_eq!(limit("max"), Ok(Bytes::Exact(u64::MAX)));
        assert_eq!(limit("50%").unwrap().resolve(80 << 30), 40 << 30);
        assert_eq!(limit("12.5%").unwrap().resolve(80 << 30), 10 << 30);
        assert_eq!(limit(" 100% ").unwrap().resolve(80 << 30), 80 << 30);
        assert_eq!(limit("0.01%").unwrap().resolve(10_000), 1);
        for bad in ["0", "0%", "101%", "%", "-5%", "1.234%", "5 %", "50%%", "total", "half"] {
            let message = config(&[("SOMA_MEMORY_LIMIT", bad)]).unwrap_err().to_string();
            assert!(message.contains("SOMA_MEMORY_LIMIT") && message.contains("50%"), "{bad}: {message}");
        }
    }

    #[test]
    fn every_variable_is_read() {
        let c = config(&[
            ("SOMA_DISABLE", "1"),
            ("SOMA_POOL", "default"),
            ("SOMA_RELEASE_THRESHOLD", "512MiB"),
            ("SOMA_REUSE_FOLLOW_EVENT_DEPS", "on"),
            ("SOMA_REUSE_OPPORTUNISTIC", "false"),
            ("SOMA_REUSE_INTERNAL_DEPS", "yes"),
            ("SOMA_MIN_BYTES", "1KiB"),
            ("SOMA_MAX_BYTES", "1G"),
            ("SOMA_FREE_SYNC", "true"),
            ("SOMA_FREE_ORDER", "barrier"),
            ("SOMA_PENDING_FREE_LIMIT", "1M"),
            ("SOMA_LEGACY_CACHE", "OFF"),
            ("SOMA_MEMORY_LIMIT", "25%"),
            ("SOMA_STATS", "1"),
            ("SOMA_TRACE", "/tmp/t.csv"),
            ("SOMA_MEMINFO", "pool"),
            ("SOMA_PASSTHROUGH_CALLERS", "libnccl, libfoo,"),
            ("SOMA_LOG", "somashim=debug"),
        ])
        .unwrap();
        assert!(c.disable);
        assert_eq!(c.pool, PoolChoice::Default);
        assert_eq!(c.release_threshold, Bytes::Exact(512 << 20));
        assert!(c.reuse_follow_event_deps && !c.reuse_opportunistic && c.reuse_internal_deps);
        assert_eq!((c.min_bytes, c.max_bytes), (1024, 1 << 30));
        assert!(c.free_sync);
        assert_eq!(c.free_order, FreeOrder::Barrier);
        assert_eq!(c.pending_free_limit, Bytes::Exact(1 << 20));
        assert_eq!(c.legacy_cache, LegacyCache::Off);
        assert_eq!(c.memory_limit, Bytes::DeviceShare(2500));
        assert_eq!(c.stats, StatsOutput::Stderr);
        assert_eq!(c.trace.as_deref(), Some("/tmp/t.csv"));
        assert_eq!(c.meminfo, MemInfo::Pool);
        assert_eq!(c.passthrough_callers, vec!["libnccl".to_string(), "libfoo".to_string()]);
        assert_eq!(c.log, "somashim=debug");
        assert_eq!(c.effective.len(), VARIABLES.len());
    }

    #[test]
    fn bad_values_name_the_variable_the_value_and_the_forms() {
        let e = config(&[("SOMA_RELEASE_THRESHOLD", "banana")]).unwrap_err();
        let message = e.to_string();
        assert!(message.contains("SOMA_RELEASE_THRESHOLD"), "{message}");
        assert!(message.contains("banana"), "{message}");
        assert!(message.contains("512MiB") && message.contains("total"), "{message}");
        assert!(config(&[("SOMA_POOL", "mine")]).unwrap_err().to_string().ends_with("accepted: own or default"));
        assert_eq!(blamed(config(&[("SOMA_FREE_SYNC", "2")]).unwrap_err()), "SOMA_FREE_SYNC");
        assert_eq!(blamed(config(&[("SOMA_MEMINFO", "free")]).unwrap_err()), "SOMA_MEMINFO");
    }

    #[test]
    fn size_range_decides_pooling() {
        let c = config(&[("SOMA_MIN_BYTES", "1K"), ("SOMA_MAX_BYTES", "1M")]).unwrap();
        assert!(!c.pools_size(1023));
        assert!(c.pools_size(1024));
        assert!(c.pools_size(1 << 20));
        assert!(!c.pools_size((1 << 20) + 1));
    }

    /// The cells of a Markdown table row that begins with "| `NAME`", from
    /// the name on; `None` if `text` has no such row.
    fn table_row<'a>(text: &'a str, name: &str) -> Option<Vec<&'a str>> {
        let start = format!("| `{name}`");
        let row = text.lines().find(|l| l.starts_with(&start))?;
        Some(row.split('|').skip(1).map(str::trim).collect())
    }

    /// The default as the tables write it: in backquotes, or "(unset)".
    fn written_default(v: &Variable) -> String {
        if v.default.is_empty() {
            "(unset)".to_string()
        } else {
            format!("`{}`", v.default)
        }
    }

    #[test]
    fn config_doc_has_every_variable_with_its_default() {
        let doc = include_str!("../../docs/CONFIG.md");
        for v in VARIABLES {
            let cells = table_row(doc, v.name).unwrap_or_else(|| panic!("docs/CONFIG.md has no table row for {}", v.name));
            assert_eq!(
                cells.get(1).copied(),
                Some(written_default(v).as_str()),
                "docs/CONFIG.md's row for {} does not give the default `{}`",
                v.name,
                v.default
            );
        }
    }

    #[test]
    fn readme_rows_agree_with_the_code_and_the_config_doc() {
        let readme = include_str!("../../README.md");
        let doc = include_str!("../../docs/CONFIG.md");
        let rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `SOMA_")).collect();
        assert!(!rows.is_empty(), "README.md has no table row of a SOMA_ variable");
        for row in rows {
            let name = row["| `".len()..].split('`').next().unwrap_or_default();
            let v = VARIABLES
                .iter()
                .find(|v| v.name == name)
                .unwrap_or_else(|| panic!("README.md has a row for {name}, which is not a variable"));
            let cells = table_row(readme, name).unwrap();
            assert_eq!(
                cells.get(1).copied(),
                Some(written_default(v).as_str()),
                "README.md's row for {name} does not give the default `{}`",
                v.default
            );
            let doc_cells = table_row(doc, name).unwrap_or_else(|| panic!("docs/CONFIG.md has no table row for {name}"));
            assert_eq!(cells.get(1), doc_cells.get(1), "README.md and docs/CONFIG.md give {name} different defaults");
        }
    }
}
