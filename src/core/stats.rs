//! What the allocator did, counted per device, and the table printed at exit
//! with `SOMA_STATS`. No FFI here: the pool's own peak figures are handed in.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::locks::PerShard;
use super::passthrough::Passthrough;

/// Devices counted separately; a larger ordinal is counted with the last one.
pub const MAX_DEVICES: usize = 32;

/// Per device (or per host pool). The counts every allocation or free
/// makes are tallied per thread shard (`Tally`), so that threads counting at
/// once do not write one shared cache line; the figures decisions read
/// (`in_use`) and the rarer counts are single atomics.
#[derive(Default)]
pub struct DeviceCounters {
    tallies: PerShard<Tally>,
    pub in_use: AtomicU64,
    pub peak_in_use: AtomicU64,
    /// The most bytes freed and not yet handed out again (queued, ordered
    /// but not passed, or cached) after a free.
    pub peak_held: AtomicU64,
    /// Batches of queued frees ordered (joins, or barriers), each covering
    /// every free queued before it.
    pub batches: AtomicU64,
    /// Of those, batches freed behind a barrier because the frees held had
    /// passed `SOMA_PENDING_FREE_LIMIT` (join order).
    pub limit_barriers: AtomicU64,
    /// The most live non-blocking streams when a batch was ordered: an
    /// ordering makes driver calls on each, so its cost follows their number.
    pub batch_streams_high: AtomicU64,
    /// Host time spent ordering batches (asking the streams, covering the
    /// busy ones, a barrier's waits; not the returns to the pool), by
    /// whichever thread did it.
    pub batch_nanos: AtomicU64,
    /// Non-blocking streams the batches asked (a tracked stream seen idle
    /// with no work since is not asked again).
    pub streams_asked: AtomicU64,
    /// Times an allocation waited on the host for pending frees of pinned
    /// host memory (`SOMA_PENDING_FREE_LIMIT`).
    pub pending_waits: AtomicU64,
    /// Times the pool was out of memory and the shim waited for frees and trimmed.
    pub oom_retries: AtomicU64,
    /// Times the real allocator served a request the pool could not.
    pub oom_fallbacks: AtomicU64,
    /// Allocations refused as out of memory under `SOMA_MEMORY_LIMIT`.
    pub limit_refusals: AtomicU64,
    /// The pool's reserved high-water mark, read when in-use peaks, for when
    /// the pool cannot be asked at exit (a device reset destroyed it).
    pub reserved_high_seen: AtomicU64,
    /// Bytes the pools gave back to the driver unused: by the decay, or
    /// asked by another process or `somarun --trim`.
    pub given_back: AtomicU64,
    /// Times this process, out of memory, asked its neighbours (the other
    /// shim processes of the user) to give back what they cache.
    pub neighbours_asked: AtomicU64,
    /// Bytes the neighbours said they gave back then.
    pub neighbours_gave: AtomicU64,
}

/// One thread shard's share of a device's per-call counts.
#[derive(Default)]
pub struct Tally {
    pub pool_allocs: AtomicU64,
    pub pool_alloc_bytes: AtomicU64,
    pub pool_frees: AtomicU64,
    pub pool_free_bytes: AtomicU64,
    /// Frees ordered by the legacy stream alone (no non-blocking stream then).
    pub legacy_stream_frees: AtomicU64,
    /// Frees kept in the cache in the legacy stream's order (`SOMA_LEGACY_CACHE`).
    pub legacy_cached_frees: AtomicU64,
    /// Of those, the frees that recorded a mark there (work ran off the legacy stream).
    pub legacy_marked_frees: AtomicU64,
    /// Frees on the legacy stream with non-blocking streams ordered by waits.
    pub barrier_frees: AtomicU64,
    /// Frees queued for a batched join (non-blocking streams, join order).
    pub queued_frees: AtomicU64,
    /// Allocations served from the cache, with no driver call.
    pub cache_hits: AtomicU64,
    /// Allocations the real allocator made for the shim (`SOMA_LARGE_BLOCKS`).
    pub large_blocks: AtomicU64,
    /// Large requests that gave memory back first, to stay within the
    /// device's budget (`core/device/budget.rs`).
    pub budget_give_backs: AtomicU64,
}

impl DeviceCounters {
    /// This thread's shard of the per-call counts.
    pub fn tally(&self) -> &Tally {
        self.tallies.mine()
    }

    /// One per-call count, over every shard.
    pub fn total(&self, count: impl Fn(&Tally) -> &AtomicU64) -> u64 {
        self.tallies.sum(count)
    }
}

/// Host time spent in one kind of hooked call, tallied per thread shard.
#[derive(Default)]
pub struct Timing(PerShard<TimingShard>);

#[derive(Default)]
pub struct TimingShard {
    calls: AtomicU64,
    nanos: AtomicU64,
}

impl Timing {
    pub fn add(&self, nanos: u64) {
        let shard = self.0.mine();
        shard.calls.fetch_add(1, Relaxed);
        add_saturating(&shard.nanos, nanos);
    }

    fn sum(&self, field: impl Fn(&TimingShard) -> &AtomicU64) -> u64 {
        self.0.sum(field)
    }

    fn mean_us(&self) -> Option<f64> {
        let calls = self.sum(|s| &s.calls);
        (calls > 0).then(|| self.sum(|s| &s.nanos) as f64 / calls as f64 / 1000.0)
    }
}

const REASONS: [Passthrough; 17] = [
    Passthrough::Disabled,
    Passthrough::ZeroSize,
    Passthrough::NullOutPointer,
    Passthrough::SizeOutOfRange,
    Passthrough::StreamCapture,
    Passthrough::NoContext,
    Passthrough::NoPoolSupport,
    Passthrough::ForeignContext,
    Passthrough::PoolOutOfMemory,
    Passthrough::PoolError,
    Passthrough::InvalidElementSize,
    Passthrough::Caller,
    Passthrough::HostPoolOff,
    Passthrough::NoHostPoolSupport,
    Passthrough::SeveralDevices,
    Passthrough::WriteCombined,
    Passthrough::UnknownHostFlags,
];

fn reason_index(reason: Passthrough) -> usize {
    REASONS.iter().position(|r| *r == reason).unwrap_or(0)
}

pub struct Stats {
    devices: [DeviceCounters; MAX_DEVICES],
    /// The pinned host memory pools, by the device they were made for.
    hosts: [DeviceCounters; MAX_DEVICES],
    passed_allocs: [AtomicU64; REASONS.len()],
    passed_bytes: [AtomicU64; REASONS.len()],
    /// Frees of pointers the pool did not give out.
    pub passed_frees: AtomicU64,
    /// Barrier waits issued on a stream just before its next work.
    pub waits_before_work: AtomicU64,
    /// Times the program's own allocators (its stream-ordered pools, virtual
    /// memory) were out of memory and the pools gave back for them.
    pub room_for_own_allocators: AtomicU64,
    pub alloc_time: Timing,
    pub free_time: Timing,
    pub host_alloc_time: Timing,
    pub host_free_time: Timing,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            devices: std::array::from_fn(|_| DeviceCounters::default()),
            hosts: std::array::from_fn(|_| DeviceCounters::default()),
            passed_allocs: std::array::from_fn(|_| AtomicU64::new(0)),
            passed_bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            passed_frees: AtomicU64::new(0),
            waits_before_work: AtomicU64::new(0),
            room_for_own_allocators: AtomicU64::new(0),
            alloc_time: Timing::default(),
            free_time: Timing::default(),
            host_alloc_time: Timing::default(),
            host_free_time: Timing::default(),
        }
    }
}

/// The pool's own peak figures for one device, read at exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolPeaks {
    pub used_high: u64,
    pub reserved_high: u64,
}

impl Stats {
    pub fn device(&self, ordinal: i32) -> &DeviceCounters {
        self.counters(ordinal, false)
    }

    /// The counters of device `ordinal`'s pool, or (`host`) of its host pool.
    pub fn counters(&self, ordinal: i32, host: bool) -> &DeviceCounters {
        let index = usize::try_from(ordinal).unwrap_or(0).min(MAX_DEVICES - 1);
        if host {
            &self.hosts[index]
        } else {
            &self.devices[index]
        }
    }

    pub fn pooled_alloc(&self, ordinal: i32, host: bool, size: u64) -> u64 {
        let d = self.counters(ordinal, host);
        let tally = d.tally();
        tally.pool_allocs.fetch_add(1, Relaxed);
        add_saturating(&tally.pool_alloc_bytes, size);
        let in_use = add_saturating(&d.in_use, size);
        raise_peak(&d.peak_in_use, in_use);
        in_use
    }

    pub fn pooled_free(&self, ordinal: i32, host: bool, size: u64) -> u64 {
        let tally = self.counters(ordinal, host).tally();
        tally.pool_frees.fetch_add(1, Relaxed);
        add_saturating(&tally.pool_free_bytes, size);
        self.no_longer_in_use(ordinal, host, size)
    }

    /// Blocks the program held are gone without a free (a device reset).
    /// Returns the bytes still in use.
    pub fn no_longer_in_use(&self, ordinal: i32, host: bool, size: u64) -> u64 {
        let in_use = &self.counters(ordinal, host).in_use;
        let (Ok(previous) | Err(previous)) = in_use.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(size)));
        previous.saturating_sub(size)
    }

    pub fn passed_through(&self, reason: Passthrough, size: u64) {
        let i = reason_index(reason);
        self.passed_allocs[i].fetch_add(1, Relaxed);
        add_saturating(&self.passed_bytes[i], size);
    }

    /// The exit table of process `pid`: one section per device that
    /// allocated, then what passed through, the host time per call, and the
    /// trace's rows that could not be written, if any. `peaks` gives the
    /// pool's figures for a device (or its host pool), where they could be read.
    pub fn report(&self, pid: u32, trace_rows_lost: u64, peaks: impl Fn(i32, bool) -> Option<PoolPeaks>) -> String {
        let mut out = format!("somashim statistics (pid {pid})\n");
        let devices = self.devices.iter().enumerate().map(|(ordinal, d)| (ordinal, d, false));
        let hosts = self.hosts.iter().enumerate().map(|(ordinal, d)| (ordinal, d, true));
        for (ordinal, d, host) in devices.chain(hosts) {
            let allocs = d.total(|t| &t.pool_allocs);
            if allocs == 0 && d.oom_fallbacks.load(Relaxed) == 0 && d.limit_refusals.load(Relaxed) == 0 {
                continue;
            }
            if host {
                let _ = writeln!(out, "pinned host memory (device {ordinal})");
            } else {
                let _ = writeln!(out, "device {ordinal}");
            }
            row(&mut out, "pool allocations", allocs, d.total(|t| &t.pool_alloc_bytes));
            row(&mut out, "pool frees", d.total(|t| &t.pool_frees), d.total(|t| &t.pool_free_bytes));
            figure(&mut out, "in use now", d.in_use.load(Relaxed));
            figure(&mut out, "peak in use (shim)", d.peak_in_use.load(Relaxed));
            figure(&mut out, "peak freed, not yet reused", d.peak_held.load(Relaxed));
            match peaks(ordinal as i32, host) {
                Some(p) => {
                    figure(&mut out, "peak in use (pool)", p.used_high);
                    figure(&mut out, "peak reserved (pool)", p.reserved_high);
                }
                None => {
                    let _ = writeln!(out, "  {:<28}{:>12}", "peak reserved (pool)", "unavailable");
                }
            }
            count(&mut out, "frees on the legacy stream", d.total(|t| &t.legacy_stream_frees));
            count(&mut out, "frees kept in legacy order", d.total(|t| &t.legacy_cached_frees));
            count(&mut out, "frees kept after a mark", d.total(|t| &t.legacy_marked_frees));
            count(&mut out, "frees behind barriers", d.total(|t| &t.barrier_frees));
            count(&mut out, "frees joined in batches", d.total(|t| &t.queued_frees));
            let batches = d.batches.load(Relaxed);
            count(&mut out, "batches ordered", batches);
            count(&mut out, "batches past the limit", d.limit_barriers.load(Relaxed));
            if batches > 0 {
                count(&mut out, "non-blocking streams, most", d.batch_streams_high.load(Relaxed));
                let asked = d.streams_asked.load(Relaxed) as f64 / batches as f64;
                let _ = writeln!(out, "  {:<28}{asked:>12.1}", "streams asked per batch");
                let us = d.batch_nanos.load(Relaxed) as f64 / batches as f64 / 1000.0;
                let _ = writeln!(out, "  {:<28}{us:>9.2} us", "host time ordering a batch");
            }
            count(&mut out, "allocations from the cache", d.total(|t| &t.cache_hits));
            count(&mut out, "large blocks (real allocator)", d.total(|t| &t.large_blocks));
            count(&mut out, "give-backs within the budget", d.total(|t| &t.budget_give_backs));
            count(&mut out, "waits for pending frees", d.pending_waits.load(Relaxed));
            count(&mut out, "out-of-memory retries", d.oom_retries.load(Relaxed));
            count(&mut out, "out-of-memory fallbacks", d.oom_fallbacks.load(Relaxed));
            count(&mut out, "refused over memory limit", d.limit_refusals.load(Relaxed));
            figure(&mut out, "given back to the driver", d.given_back.load(Relaxed));
            count(&mut out, "neighbours asked", d.neighbours_asked.load(Relaxed));
            if d.neighbours_asked.load(Relaxed) > 0 {
                figure(&mut out, "given back by neighbours", d.neighbours_gave.load(Relaxed));
            }
        }
        out.push_str("passed through to the real allocator\n");
        let mut any = false;
        for (i, reason) in REASONS.iter().enumerate() {
            let calls = self.passed_allocs[i].load(Relaxed);
            if calls > 0 {
                row(&mut out, &format!("{reason:?}"), calls, self.passed_bytes[i].load(Relaxed));
                any = true;
            }
        }
        let frees = self.passed_frees.load(Relaxed);
        if frees > 0 {
            count(&mut out, "frees of other pointers", frees);
            any = true;
        }
        let room = self.room_for_own_allocators.load(Relaxed);
        if room > 0 {
            count(&mut out, "out of memory, room made", room);
            any = true;
        }
        if !any {
            out.push_str("  nothing\n");
        }
        let waits = self.waits_before_work.load(Relaxed);
        if waits > 0 {
            out.push_str("streams\n");
            count(&mut out, "barrier waits before work", waits);
        }
        out.push_str("host time per call\n");
        for (name, timing) in [
            ("cudaMalloc/cuMemAlloc", &self.alloc_time),
            ("cudaFree/cuMemFree", &self.free_time),
            ("cudaMallocHost/cuMemAllocHost", &self.host_alloc_time),
            ("cudaFreeHost/cuMemFreeHost", &self.host_free_time),
        ] {
            if let Some(us) = timing.mean_us() {
                let _ = writeln!(out, "  {name:<28}{us:>9.2} us  ({} calls)", timing.sum(|s| &s.calls));
            }
        }
        if trace_rows_lost > 0 {
            let _ = writeln!(out, "trace incomplete: {trace_rows_lost} rows lost (writing it failed)");
        }
        out
    }
}

/// Raises `peak` to `value` if higher. Read first: a read-modify-write on
/// every call would take the line from the other threads calling.
pub fn raise_peak(peak: &AtomicU64, value: u64) {
    if value > peak.load(Relaxed) {
        peak.fetch_max(value, Relaxed);
    }
}

/// Adds `n` to a counter and returns the sum. It stops at `u64::MAX` rather
/// than wrapping: requests of `SIZE_MAX` bytes are real (and fail), and two of
/// them must not read as a small figure.
pub fn add_saturating(counter: &AtomicU64, n: u64) -> u64 {
    let (Ok(previous) | Err(previous)) = counter.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_add(n)));
    previous.saturating_add(n)
}

fn row(out: &mut String, name: &str, calls: u64, bytes: u64) {
    let _ = writeln!(out, "  {name:<28}{calls:>12}  {:>12}", human_bytes(bytes));
}

fn count(out: &mut String, name: &str, calls: u64) {
    let _ = writeln!(out, "  {name:<28}{calls:>12}");
}

fn figure(out: &mut String, name: &str, bytes: u64) {
    let _ = writeln!(out, "  {name:<28}{:>12}  {:>12}", "", human_bytes(bytes));
}

/// `1.5 GiB`, `256 B`: powers of 1024, as the configuration reads them. A
/// counter that reached `u64::MAX` (it saturates) reads `>= 16.0 EiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes == u64::MAX {
        return ">= 16.0 EiB".to_string();
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_use_and_peak_follow_allocations_and_frees() {
        let stats = Stats::default();
        assert_eq!(stats.pooled_alloc(0, false, 100), 100);
        assert_eq!(stats.pooled_alloc(0, false, 50), 150);
        assert_eq!(stats.pooled_free(0, false, 100), 50);
        assert_eq!(stats.pooled_alloc(1, false, 10), 10, "devices are counted apart");
        let d = stats.device(0);
        assert_eq!(d.peak_in_use.load(Relaxed), 150);
        assert_eq!(d.in_use.load(Relaxed), 50);
    }

    #[test]
    fn report_lists_devices_reasons_and_peaks() {
        let stats = Stats::default();
        stats.pooled_alloc(1, false, 3 << 20);
        stats.pooled_free(1, false, 3 << 20);
        stats.pooled_alloc(0, true, 1 << 20);
        stats.passed_through(Passthrough::ZeroSize, 0);
        stats.passed_through(Passthrough::SizeOutOfRange, 5 << 30);
        stats.passed_frees.fetch_add(2, Relaxed);
        stats.alloc_time.add(1500);
        let d = stats.device(1);
        d.batches.fetch_add(2, Relaxed);
        raise_peak(&d.batch_streams_high, 131);
        add_saturating(&d.batch_nanos, 900_000);
        add_saturating(&d.streams_asked, 5);
        stats.waits_before_work.fetch_add(4, Relaxed);
        stats.room_for_own_allocators.fetch_add(3, Relaxed);
        let report = stats.report(7, 0, |d, host| {
            (d == 1 && !host).then_some(PoolPeaks { used_high: 3 << 20, reserved_high: 32 << 20 })
        });
        assert!(report.starts_with("somashim statistics (pid 7)\n"), "{report}");
        assert!(report.contains("device 1\n"), "{report}");
        assert!(!report.contains("\ndevice 0\n"), "idle devices are left out: {report}");
        assert!(report.contains("pinned host memory (device 0)\n"), "{report}");
        assert!(report.contains("pool allocations") && report.contains("3.0 MiB"), "{report}");
        assert!(report.contains("peak reserved (pool)") && report.contains("32.0 MiB"), "{report}");
        assert!(report.contains("ZeroSize") && report.contains("SizeOutOfRange") && report.contains("5.0 GiB"));
        assert!(report.contains("frees of other pointers"), "{report}");
        assert!(report.contains("  out of memory, room made               3\n"), "{report}");
        assert!(report.contains("1.50 us"), "{report}");
        assert!(report.contains("  non-blocking streams, most           131\n"), "{report}");
        assert!(report.contains("  host time ordering a batch     450.00 us\n"), "{report}");
        assert!(report.contains("  streams asked per batch              2.5\n"), "{report}");
        assert!(report.contains("streams\n  barrier waits before work              4\n"), "{report}");
        assert!(!report.contains("trace incomplete"), "{report}");
        assert!(stats.report(7, 12, |_, _| None).ends_with("trace incomplete: 12 rows lost (writing it failed)\n"));
    }

    #[test]
    fn unreadable_pool_figures_are_said_so() {
        let stats = Stats::default();
        stats.pooled_alloc(0, false, 1);
        assert!(stats.report(7, 0, |_, _| None).contains("unavailable"));
    }

    #[test]
    fn bytes_read_as_powers_of_1024() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
        assert_eq!(human_bytes(3 << 50), "3.0 PiB");
        assert_eq!(human_bytes(u64::MAX), ">= 16.0 EiB");
    }

    #[test]
    fn byte_counters_saturate_instead_of_wrapping() {
        let stats = Stats::default();
        stats.passed_through(Passthrough::PoolOutOfMemory, u64::MAX);
        stats.passed_through(Passthrough::PoolOutOfMemory, u64::MAX);
        assert_eq!(stats.passed_bytes[reason_index(Passthrough::PoolOutOfMemory)].load(Relaxed), u64::MAX);
        assert_eq!(stats.pooled_alloc(0, false, u64::MAX - 1), u64::MAX - 1);
        assert_eq!(stats.pooled_alloc(0, false, 2), u64::MAX, "in use stops at the top");
        assert_eq!(stats.device(0).total(|t| &t.pool_alloc_bytes), u64::MAX);
        assert_eq!(stats.pooled_free(1, false, 5), 0, "in use stops at zero");
        stats.alloc_time.add(u64::MAX);
        stats.alloc_time.add(u64::MAX);
        assert_eq!(stats.alloc_time.sum(|s| &s.nanos), u64::MAX);
        let report = stats.report(7, 0, |_, _| None);
        assert!(report.contains(">= 16.0 EiB"), "{report}");
        assert!(!report.contains("TiB"), "no wrapped figure: {report}");
    }
}
