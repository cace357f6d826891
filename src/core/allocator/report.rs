//! Reporting: the trace and peaks of each allocation and free, what
//! `cudaMemGetInfo` shows, and the `SOMA_STATS` table at exit.

use std::io::Write;
use std::sync::atomic::Ordering;

use super::state::Allocator;
use crate::core::config::settings::{MemInfo, StatsOutput};
use crate::core::device::pool::Device;
use crate::core::output;
use crate::core::ptrmap::Block;
use crate::core::stats::PoolPeaks;
use crate::core::trace::{Op, Trace};
use crate::cuda::gpu::Gpu;

impl Allocator {
    /// Counts a pool block leaving the program's hands.
    pub(super) fn freed(&self, driver: &impl Gpu, op: Op, ptr: u64, block: Block) {
        let in_use = self.stats.pooled_free(block.device, block.memory.is_host(), block.size);
        if !block.memory.is_host() {
            self.libraries.freed(block.caller, block.size);
            if let Some(events) = &self.events {
                events.record(op, block.device, block.size, ptr, block.caller);
            }
        }
        if let (Some(trace), Some(device)) = (&self.trace, self.pool_of(&block)) {
            trace.record(block.device, op, block.size, ptr, in_use, device.reserved(driver));
        }
    }

    /// After a pool allocation for `caller`: the last events, the trace, and
    /// the reserved peak behind a new in-use peak (kept for when the pool
    /// cannot be asked at exit).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn observe(&self, driver: &impl Gpu, device: &Device, op: Op, size: u64, ptr: u64, in_use: u64, caller: usize) {
        if let (Some(events), false) = (&self.events, device.host) {
            events.record(op, device.ordinal, size, ptr, caller);
        }
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

    /// Where the out-of-memory snapshot goes (`SOMA_SNAPSHOT`), if anywhere.
    pub fn snapshot_path(&self) -> Option<String> {
        self.config.snapshot.as_deref().map(|path| self.own_file(path))
    }

    /// An output file named `path`, as this process writes it: in a process
    /// forked after the allocator was made, `<path>.<pid>`, never the parent's.
    fn own_file(&self, path: &str) -> String {
        match self.forked_child.load(Ordering::Relaxed) {
            0 => path.to_string(),
            pid => output::in_child(path, pid),
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
        let table = || {
            let mut table = self.stats.report(std::process::id(), rows_lost, peaks);
            self.libraries.report(&mut table);
            table
        };
        match &self.config.stats {
            StatsOutput::Off => {}
            StatsOutput::Stderr => eprint!("{}", table()),
            StatsOutput::File(path) => {
                let path = self.own_file(path);
                let table = table();
                let written = output::create(&path).and_then(|mut opened| {
                    // A table cut short is worse than none: it goes, and stderr has it.
                    opened.file.write_all(table.as_bytes()).inspect_err(|_| {
                        let _ = opened.remove();
                    })
                });
                if let Err(e) = written {
                    output::warn(format_args!("cannot write statistics to {path}: {e}; they follow on stderr"));
                    eprint!("{table}");
                }
            }
        }
    }
}
