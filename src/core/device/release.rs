//! What a device's pools give back to the driver, for other processes: at
//! the decay's checks (`core/decay.rs` decides how much), and all they hold
//! unused when asked (another process out of memory, `somarun --trim`).

use std::time::{Duration, Instant};

use super::pool::Device;
use crate::core::decay::Release;
use crate::core::locks::lock;
use crate::core::pending::Keep;
use crate::core::ptrmap::PointerMap;
use crate::cuda::gpu::{Gpu, PoolCounter, Stream};

/// How long a give-back waits, at most, for the frees of the blocks it
/// returned from the cache to pass: on the pool stream, which holds the
/// shim's own operations alone (microseconds), and on the legacy stream,
/// where the program's work may keep them (left to a later check then).
const POOL_STREAM_SETTLE: Duration = Duration::from_millis(5);
const LEGACY_SETTLE: Duration = Duration::from_millis(1);

impl Device {
    /// Whether the decay wants this device's context for a check, or for
    /// the idle rule's give-back. A look for idleness that finds it busy, or
    /// given back already, costs no driver call. `activity` counts the
    /// device's allocations and frees so far.
    pub fn decay_due(&self, activity: u64) -> bool {
        let now = Instant::now();
        lock(&self.decay).as_mut().is_some_and(|window| window.due(now) || (window.look_due(now) && window.look(now, activity)))
    }

    /// A check of the decay, if one is due, returns what the pools hold
    /// beyond what the program used within the delay, or, idle for a whole
    /// delay, all they hold unused; else, idle for `SOMA_IDLE_MS` with the
    /// device's work done (no free waiting for the GPU, the legacy stream
    /// idle: a program waiting for its GPU is not done), all they hold
    /// unused, until all went. The device's context must be current, no
    /// capture in progress. `in_use`: the program's bytes on the device now.
    /// Returns the bytes given back.
    pub fn decay(&self, driver: &impl Gpu, map: &PointerMap, activity: u64, in_use: u64) -> u64 {
        let now = Instant::now();
        let mut window = lock(&self.decay);
        let Some(window) = window.as_mut() else { return 0 };
        let mut given = 0;
        if window.due(now) {
            self.check_peak(in_use);
            match window.check(now, activity, self.used_highs_since_last_check(driver)) {
                Release::All => return self.give_back(driver, map),
                // A check that keeps the peak does not put the idle rule off.
                Release::Beyond(keep) => given = self.trim_beyond(driver, keep, false),
            }
        }
        if !window.idle_release_wanted(now, activity) || self.pending.busy() || !driver.is_idle(Stream::LEGACY) {
            return given;
        }
        given += self.give_back(driver, map);
        // What stays (returns the GPU had not passed in the give-back's short
        // wait) goes at a later look.
        if self.idle_bytes(driver) == 0 && !self.has_segments_to_release() {
            window.released_all();
        }
        given
    }

    /// Everything the pools hold that the program does not: the cache goes
    /// to the pool, the pool returns what it does not use (frees the GPU has
    /// not passed yet stay), and cached large blocks go with the real free.
    /// What the program used before counts no more for the budget: its next
    /// rise is growth (`budget`). The device's context must be current, no
    /// capture in progress. Returns the bytes given back.
    pub fn give_back(&self, driver: &impl Gpu, map: &PointerMap) -> u64 {
        self.forget_peak();
        // The streams cached blocks went back on: the pool's, the legacy one.
        let mut returned = [false; 2];
        // Another thread returning frees meanwhile (an allocation that
        // waits): the cache goes at the next check.
        if let Some(mut returning) = self.pending.try_reclaiming() {
            // Batches the GPU has passed join the cache first, and go with it.
            self.pending.collect_passed(&mut returning, driver);
            self.pending.release_cached(Keep::None, map, |ptr, in_legacy_order| {
                returned[in_legacy_order as usize] = true;
                self.return_to_pool(driver, ptr, in_legacy_order)
            });
        }
        // Their frees pass at once where the stream is idle: waited for a
        // little, so that this trim returns them too. (The caller holds the
        // captures lock throughout: a capture that begins meanwhile waits.)
        for (stream, used, settle) in [(self.pool_stream, returned[0], POOL_STREAM_SETTLE), (Stream::LEGACY, returned[1], LEGACY_SETTLE)] {
            let until = Instant::now() + settle;
            while used && !driver.is_idle(stream) && Instant::now() < until {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        self.trim_beyond(driver, [0, 0], returned != [false, false]) + self.release_segments(driver)
    }

    /// Each pool returns what it reserves beyond `keep` (its bytes, main pool
    /// first) and beyond what it uses (unless blocks just went back to it,
    /// `returned`, which it may count as used until their frees pass).
    /// Returns the bytes given back. One thread at a time (the reclaimer's
    /// decay, the server's give-back), so that each byte given back is
    /// counted once.
    fn trim_beyond(&self, driver: &impl Gpu, keep: [u64; 2], returned: bool) -> u64 {
        let _trimming = lock(&self.trimming);
        let bytes = |pool, counter| driver.pool_bytes(pool, counter).unwrap_or(0);
        let reserved = |pool| bytes(pool, PoolCounter::ReservedNow);
        // Nothing unused (an idle program that holds its memory): no call more.
        let over: Vec<_> = self
            .pools()
            .zip(keep)
            .filter_map(|(pool, keep)| {
                let before = reserved(pool);
                (before > keep && (returned || before > bytes(pool, PoolCounter::UsedNow))).then_some((pool, keep, before))
            })
            .collect();
        if over.is_empty() {
            return 0;
        }
        // The driver returns a block only once it has seen its free pass:
        // asking the streams blocks go back on lets it see that.
        driver.is_idle(self.pool_stream);
        driver.is_idle(Stream::LEGACY);
        let mut given_back = 0;
        for (pool, keep, before) in over {
            if let Err(e) = driver.trim(pool, keep) {
                log::debug!("device {}: trimming the pool failed: {e:?}", self.ordinal);
            }
            given_back += before.saturating_sub(reserved(pool));
        }
        if given_back > 0 {
            log::debug!("device {}: {given_back} bytes back to the driver", self.ordinal);
        }
        given_back
    }

    /// Each pool's used high-water mark since the last check, and started
    /// again. The device's default pool (`SOMA_POOL=default`) is the
    /// program's too, whose high-water mark is left alone: unknown.
    fn used_highs_since_last_check(&self, driver: &impl Gpu) -> [u64; 2] {
        let mut highs = [u64::MAX; 2];
        if !self.owns_pool {
            return highs;
        }
        for ((pool, high), before) in self.pools().zip(&mut highs).zip(&self.used_high_before) {
            let Ok(since) = driver.pool_bytes(pool, PoolCounter::UsedHigh) else { continue };
            // Kept for the statistics' peak, which the reset would lose (a
            // peak between the read and the reset is lost from it, though
            // the next check sees the use it left).
            before.fetch_max(since, std::sync::atomic::Ordering::Relaxed);
            if driver.reset_used_high(pool).is_ok() {
                *high = since;
            }
        }
        highs
    }
}
