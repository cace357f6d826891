//! Memory a pool holds beyond what its program used lately goes back to the
//! driver, where other processes can have it (`SOMA_DECAY_MS`, the idea of
//! jemalloc's `dirty_decay_ms`); and all it caches, when asked
//! (`give_back`: another process out of memory, `somarun --trim`).
//!
//! Only the shim's thread looks, a few times per delay: the allocation and
//! free paths do nothing for it. Each look (a *check*, every delay /
//! `CHECKS`) reads each pool's used high-water mark since the last check
//! and starts it again; a pool keeps what its program used at any moment of
//! the last `CHECKS` checks (the peak, exact, not a sample), and returns the
//! rest. A device with no allocation and no free for a whole delay is idle:
//! its cache goes back to the pool too, and the pool keeps only what is in
//! use. So a steady loop, whose peak recurs within the delay, never gives
//! back what it needs again.

use std::time::{Duration, Instant};

use super::pool::Device;
use crate::core::locks::lock;
use crate::core::pending::Keep;
use crate::core::ptrmap::PointerMap;
use crate::cuda::gpu::{Gpu, PoolCounter, Stream};

/// Checks per delay: a pool's memory goes back between `delay` and
/// `delay * (1 + 1 / CHECKS)` after its last use.
pub const CHECKS: usize = 4;

/// What the checks of one device remember.
pub struct Window {
    delay: Duration,
    next_check: Instant,
    /// The device's allocations and frees so far, at the last check.
    activity: u64,
    /// Since when no allocation or free was seen.
    idle_since: Option<Instant>,
    /// Per pool (the main one, the small-block one), its used high-water
    /// mark in each of the last `CHECKS` checks.
    highs: [[u64; CHECKS]; 2],
    slot: usize,
}

/// What a check decided for one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Each pool keeps this many bytes (what it used lately) and returns the rest.
    Beyond([u64; 2]),
    /// Idle for a whole delay: the cache goes to the pool, the pool keeps
    /// only what is in use.
    All,
}

impl Window {
    pub fn new(delay: Duration, now: Instant) -> Window {
        // Until the checks have seen a whole delay, nothing counts as unused.
        Window { delay, next_check: now + delay / CHECKS as u32, activity: 0, idle_since: None, highs: [[u64::MAX; CHECKS]; 2], slot: 0 }
    }

    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_check
    }

    /// One check at `now`: `activity` counts the device's allocations and
    /// frees so far, `highs` each pool's used high-water mark since the last
    /// check (u64::MAX where unknown: nothing of that pool goes while the
    /// program runs).
    pub fn check(&mut self, now: Instant, activity: u64, highs: [u64; 2]) -> Release {
        self.next_check = now + self.delay / CHECKS as u32;
        if activity != self.activity {
            self.activity = activity;
            self.idle_since = None;
        }
        let idle_since = *self.idle_since.get_or_insert(now);
        for (pool, high) in highs.into_iter().enumerate() {
            self.highs[pool][self.slot] = high;
        }
        self.slot = (self.slot + 1) % CHECKS;
        if now.duration_since(idle_since) >= self.delay {
            Release::All
        } else {
            Release::Beyond(self.highs.map(|highs| highs.into_iter().max().unwrap_or(u64::MAX)))
        }
    }
}

impl Device {
    /// Whether a check of the decay is due.
    pub fn decay_due(&self) -> bool {
        lock(&self.decay).as_ref().is_some_and(|window| window.due(Instant::now()))
    }

    /// A check of the decay, if one is due: returns what the pools hold
    /// beyond what the program used within the delay, or, idle, all they
    /// hold unused. The device's context must be current, no capture in
    /// progress. Returns the bytes given back.
    pub fn decay(&self, driver: &impl Gpu, map: &PointerMap, activity: u64) -> u64 {
        let now = Instant::now();
        let mut window = lock(&self.decay);
        let Some(window) = window.as_mut().filter(|window| window.due(now)) else {
            return 0;
        };
        let highs = self.used_highs_since_last_check(driver);
        match window.check(now, activity, highs) {
            Release::All => self.give_back(driver, map),
            Release::Beyond(keep) => self.trim_beyond(driver, keep),
        }
    }

    /// Everything the pools hold that the program does not: the cache goes
    /// to the pool, and the pool returns what it does not use (frees the
    /// GPU has not passed yet stay). The device's context must be current,
    /// no capture in progress. Returns the bytes given back.
    pub fn give_back(&self, driver: &impl Gpu, map: &PointerMap) -> u64 {
        // Another thread returning frees meanwhile (an allocation that
        // waits): the cache goes at the next check.
        if let Some(_returning) = self.pending.try_reclaiming() {
            self.pending.release_cached(Keep::None, map, |ptr, in_legacy_order| self.return_to_pool(driver, ptr, in_legacy_order));
        }
        self.trim_beyond(driver, [0, 0])
    }

    /// Each pool returns what it reserves beyond `keep` (its bytes, main pool
    /// first). Returns the bytes given back.
    fn trim_beyond(&self, driver: &impl Gpu, keep: [u64; 2]) -> u64 {
        let reserved = |pool| driver.pool_bytes(pool, PoolCounter::ReservedNow).unwrap_or(0);
        let over: Vec<_> = self.pools().zip(keep).filter(|&(pool, keep)| reserved(pool) > keep).collect();
        if over.is_empty() {
            return 0;
        }
        // The driver returns a block only once it has seen its free pass:
        // asking the streams blocks go back on lets it see that.
        driver.is_idle(self.pool_stream);
        driver.is_idle(Stream::LEGACY);
        let mut given_back = 0;
        for (pool, keep) in over {
            let before = reserved(pool);
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
            // Kept for the statistics' peak, which the reset would lose.
            before.fetch_max(since, std::sync::atomic::Ordering::Relaxed);
            if driver.reset_used_high(pool).is_ok() {
                *high = since;
            }
        }
        highs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_millis(1000);

    /// Checks every delay / CHECKS from `start`, `n` of them, each with the
    /// activity and highs `at` gives for its index; the last decision.
    fn run(window: &mut Window, start: Instant, from: usize, n: usize, at: impl Fn(usize) -> (u64, [u64; 2])) -> Release {
        let mut last = Release::All;
        for i in from..from + n {
            let now = start + DELAY / CHECKS as u32 * (i as u32 + 1);
            assert!(window.due(now));
            let (activity, highs) = at(i);
            last = window.check(now, activity, highs);
        }
        last
    }

    #[test]
    fn a_steady_loop_keeps_its_peak() {
        let start = Instant::now();
        let mut window = Window::new(DELAY, start);
        // Busy, peaking at 8 GiB once per delay, 1 GiB otherwise.
        let release = run(&mut window, start, 0, 20, |i| (i as u64 + 1, [if i % CHECKS == 0 { 8 << 30 } else { 1 << 30 }, 0]));
        assert_eq!(release, Release::Beyond([8 << 30, 0]));
    }

    #[test]
    fn nothing_goes_before_a_whole_delay_was_seen() {
        let start = Instant::now();
        let mut window = Window::new(DELAY, start);
        for n in 1..CHECKS {
            let mut fresh = Window::new(DELAY, start);
            assert_eq!(run(&mut fresh, start, 0, n, |i| (i as u64 + 1, [0, 0])), Release::Beyond([u64::MAX; 2]), "{n}");
        }
        assert_eq!(run(&mut window, start, 0, CHECKS, |i| (i as u64 + 1, [5, 7])), Release::Beyond([5, 7]));
    }

    #[test]
    fn a_peak_passed_a_delay_ago_goes() {
        let start = Instant::now();
        let mut window = Window::new(DELAY, start);
        run(&mut window, start, 0, CHECKS, |i| (i as u64 + 1, [40 << 30, 1 << 20]));
        // Still busy, with less.
        assert_eq!(run(&mut window, start, CHECKS, CHECKS - 1, |i| (i as u64 + 1, [2 << 30, 1 << 20])), Release::Beyond([40 << 30, 1 << 20]));
        assert_eq!(run(&mut window, start, 2 * CHECKS - 1, 1, |i| (i as u64 + 1, [2 << 30, 1 << 20])), Release::Beyond([2 << 30, 1 << 20]));
    }

    #[test]
    fn a_whole_delay_without_allocation_or_free_gives_back_everything() {
        let start = Instant::now();
        let mut window = Window::new(DELAY, start);
        run(&mut window, start, 0, 3, |i| (i as u64 + 1, [4 << 30, 0]));
        // The last activity was seen at check 2 (index); idle from then on.
        let idle = |_| (3, [4 << 30, 0]);
        assert_eq!(run(&mut window, start, 3, CHECKS - 1, idle), Release::Beyond([4 << 30, 0]));
        assert_eq!(run(&mut window, start, 3 + CHECKS - 1, 1, idle), Release::All);
        // A free or an allocation: busy again.
        assert_eq!(run(&mut window, start, 3 + CHECKS, 1, |_| (4, [4 << 30, 0])), Release::Beyond([4 << 30, 0]));
    }
}
