//! The decay (`SOMA_DECAY_MS`, the idea of jemalloc's `dirty_decay_ms`):
//! memory a pool holds beyond what its program used lately goes back to the
//! driver, where other processes can have it. This is when; what a device
//! gives back, and how: `device/release.rs`.
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
        // On the schedule, not from this check (which the reclaimer's naps
        // may delay), unless it fell a whole period behind.
        let period = self.delay / CHECKS as u32;
        let next = self.next_check + period;
        self.next_check = if next > now { next } else { now + period };
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
