//! The `SOMA_*` variables: one table, [`VARIABLES`], a row a variable with
//! its name, what its value may be, its default, one line of doc and the
//! field of `Config` it sets. The table of docs/CONFIG.md, and the README's
//! rows, are checked against it by a test, so they cannot drift apart.

use super::settings::{Bytes, Config, FreeOrder, LegacyCache, MemInfo, PoolChoice, StatsOutput};

/// What a variable's text is parsed as.
#[derive(Clone, Copy)]
pub(super) enum Kind {
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
    pub(super) fn accepted_forms(self) -> &'static str {
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
pub(super) enum Value {
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
    pub(super) kind: Kind,
    pub default: &'static str,
    pub doc: &'static str,
    pub(super) store: fn(&mut Config, Value),
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
        doc: "1: every call goes to the real runtime untouched, and dlsym and cuGetProcAddress hand out the driver's own entry points (no work is tracked).",
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
        doc: "Requests of at least this size that take the program past its recent peak, while the device holds unused less than half of them, are allocated by the real cuMemAlloc, which maps memory faster than a pool grows, and their freed blocks wait in the shim's cache for a request of their size; the others come from the pool; before taking new memory the device gives back cached large blocks, then unused pool memory, to hold at most 1.2 times that peak; 0: every size from the pool.",
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let doc = include_str!("../../../docs/CONFIG.md");
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
        let readme = include_str!("../../../README.md");
        let doc = include_str!("../../../docs/CONFIG.md");
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
