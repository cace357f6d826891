//! The decay (`SOMA_DECAY_MS`, the idea of jemalloc's `dirty_decay_ms`):
//! memory a pool holds beyond what its program used lately goes back to the
//! driver, where other processes can have it. This is when; what a device
//! gives back, and how: `device/release.rs`.
//!
//! Only the shim's thread looks, a few times per delay: the allocation and
//! free paths do nothing for it. Each *check*, every delay / `CHECKS`, reads
//! each pool's used high-water mark since the last check and starts it
//! again; a pool keeps what its program used at any moment of the last
//! `CHECKS` checks (the peak, exact, not a sample), and returns the rest. So
//! a steady loop, whose peak recurs within the delay, never gives back what
//! it needs again. A device with no allocation and no free for a whole
//! delay gives back all it holds unused.
//!
//! Idle sooner: between checks the thread *looks* (no driver call) whether a
//! device has seen no allocation and no free for `SOMA_IDLE_MS`, shorter
//! than the delay. Then, once its work is done too (the device decides, in
//! `device/release.rs`), all its pools hold unused goes back, again at each
//! look until all went. A program done with its memory so hands it to its
//! neighbours about as soon as its own frees would have, while the driver
//! clears it, before they ask (docs/FACTS.md, "Growth and trim").

use std::time::{Duration, Instant};

/// Checks per delay: what a pool holds beyond a peak goes back between
/// `delay` and `delay * (1 + 1 / CHECKS)` after that peak.
pub const CHECKS: usize = 4;

/// Looks for idleness per idle delay.
const LOOKS: u32 = 2;

/// How often the idle rule looks (`SOMA_IDLE_MS` / `LOOKS`), where it
/// applies: the shim's thread, idle, naps no longer, so that a device
/// gives back within an idle delay and a half of its last allocation or free.
pub fn look_period(delay: Option<Duration>, idle: Option<Duration>) -> Option<Duration> {
    let (delay, idle) = (delay?, idle?);
    (idle < delay).then(|| idle / LOOKS)
}

/// What the checks of one device remember.
pub struct Window {
    delay: Duration,
    /// No allocation and no free for this long: idle (at most `delay`).
    idle_after: Duration,
    next_check: Instant,
    /// The next look for idleness; None: only the checks look (no idle
    /// delay shorter than the decay's).
    next_look: Option<Instant>,
    /// The device's allocations and frees so far, when last looked at.
    activity: u64,
    /// Since when no allocation or free was seen.
    idle_since: Option<Instant>,
    /// All went back since the last allocation or free (`released_all`).
    released: bool,
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
    /// `idle`: the idle delay (None, or not shorter than `delay`: only the
    /// checks find a device idle, after a whole delay).
    pub fn new(delay: Duration, idle: Option<Duration>, now: Instant) -> Window {
        let idle_after = idle.map_or(delay, |idle| idle.min(delay));
        Window {
            delay,
            idle_after,
            // Until the checks have seen a whole delay, nothing counts as unused.
            next_check: now + delay / CHECKS as u32,
            next_look: look_period(Some(delay), idle).map(|period| now + period),
            activity: 0,
            idle_since: None,
            released: false,
            highs: [[u64::MAX; CHECKS]; 2],
            slot: 0,
        }
    }

    /// Whether a check is due (it reads the pools' high-water marks).
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_check
    }

    /// Whether a look for idleness is due.
    pub fn look_due(&self, now: Instant) -> bool {
        self.next_look.is_some_and(|next| now >= next)
    }

    /// One look at `now` (`activity` as for `check`), which reads no driver
    /// figure: whether the device has been idle for the idle delay and has
    /// not given everything back since (`idle_release_wanted`).
    pub fn look(&mut self, now: Instant, activity: u64) -> bool {
        self.next_look = look_period(Some(self.delay), Some(self.idle_after)).map(|period| now + period);
        self.idle_release_wanted(now, activity)
    }

    /// Whether the idle rule wants all the device's pools hold unused given
    /// back now (the caller then says whether all went: `released_all`).
    pub fn idle_release_wanted(&mut self, now: Instant, activity: u64) -> bool {
        self.next_look.is_some() && self.idle_for(now, activity) >= self.idle_after && !self.released
    }

    /// Everything went back: nothing more to give until the next allocation or free.
    pub fn released_all(&mut self) {
        self.released = true;
    }

    /// How long the device has seen no allocation or free, as of `now`.
    fn idle_for(&mut self, now: Instant, activity: u64) -> Duration {
        if activity != self.activity {
            self.activity = activity;
            self.idle_since = None;
            self.released = false;
        }
        now.duration_since(*self.idle_since.get_or_insert(now))
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
        let idle_for = self.idle_for(now, activity);
        for (pool, high) in highs.into_iter().enumerate() {
            self.highs[pool][self.slot] = high;
        }
        self.slot = (self.slot + 1) % CHECKS;
        if idle_for >= self.delay {
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
        let mut window = Window::new(DELAY, None, start);
        // Busy, peaking at 8 GiB once per delay, 1 GiB otherwise.
        let release = run(&mut window, start, 0, 20, |i| (i as u64 + 1, [if i % CHECKS == 0 { 8 << 30 } else { 1 << 30 }, 0]));
        assert_eq!(release, Release::Beyond([8 << 30, 0]));
    }

    #[test]
    fn nothing_goes_before_a_whole_delay_was_seen() {
        let start = Instant::now();
        let mut window = Window::new(DELAY, None, start);
        for n in 1..CHECKS {
            let mut fresh = Window::new(DELAY, None, start);
            assert_eq!(run(&mut fresh, start, 0, n, |i| (i as u64 + 1, [0, 0])), Release::Beyond([u64::MAX; 2]), "{n}");
        }
        assert_eq!(run(&mut window, start, 0, CHECKS, |i| (i as u64 + 1, [5, 7])), Release::Beyond([5, 7]));
    }

    #[test]
    fn a_peak_passed_a_delay_ago_goes() {
        let start = Instant::now();
        let mut window = Window::new(DELAY, None, start);
        run(&mut window, start, 0, CHECKS, |i| (i as u64 + 1, [40 << 30, 1 << 20]));
        // Still busy, with less.
        assert_eq!(run(&mut window, start, CHECKS, CHECKS - 1, |i| (i as u64 + 1, [2 << 30, 1 << 20])), Release::Beyond([40 << 30, 1 << 20]));
        assert_eq!(run(&mut window, start, 2 * CHECKS - 1, 1, |i| (i as u64 + 1, [2 << 30, 1 << 20])), Release::Beyond([2 << 30, 1 << 20]));
    }

    #[test]
    fn a_whole_delay_without_allocation_or_free_gives_back_everything() {
        let start = Instant::now();
        let mut window = Window::new(DELAY, None, start);
        run(&mut window, start, 0, 3, |i| (i as u64 + 1, [4 << 30, 0]));
        // The last activity was seen at check 2 (index); idle from then on.
        let idle = |_| (3, [4 << 30, 0]);
        assert_eq!(run(&mut window, start, 3, CHECKS - 1, idle), Release::Beyond([4 << 30, 0]));
        assert_eq!(run(&mut window, start, 3 + CHECKS - 1, 1, idle), Release::All);
        // A free or an allocation: busy again.
        assert_eq!(run(&mut window, start, 3 + CHECKS, 1, |_| (4, [4 << 30, 0])), Release::Beyond([4 << 30, 0]));
    }

    #[test]
    fn the_idle_rule_looks_twice_per_idle_delay_where_it_applies() {
        let ms = Duration::from_millis;
        assert_eq!(look_period(Some(DELAY), Some(ms(50))), Some(ms(25)));
        assert_eq!(look_period(Some(DELAY), Some(DELAY)), None, "not shorter than the decay: only the checks");
        assert_eq!(look_period(Some(DELAY), None), None);
        assert_eq!(look_period(None, Some(ms(50))), None, "no decay: nothing goes");
    }

    #[test]
    fn an_idle_device_wants_everything_back_after_the_idle_delay_until_it_all_went() {
        const IDLE: Duration = Duration::from_millis(50);
        let start = Instant::now();
        let mut window = Window::new(DELAY, Some(IDLE), start);
        assert!(!window.due(start) && !window.look_due(start));
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert!(window.look_due(at(25)) && !window.due(at(25)));
        // Busy: an allocation or a free between every two looks.
        for (i, ms) in (25..200).step_by(25).enumerate() {
            assert!(!window.look(at(ms), i as u64 + 1), "{ms} ms");
            assert!(!window.look_due(at(ms)) && window.look_due(at(ms + 25)));
        }
        // Quiet from the look at 175 ms on: idle once 50 ms have passed.
        assert!(!window.look(at(200), 7));
        assert!(window.look(at(225), 7));
        // Not all went (a free the GPU had not passed): wanted again.
        assert!(window.look(at(250), 7));
        window.released_all();
        assert!(!window.look(at(275), 7) && !window.idle_release_wanted(at(280), 7));
        // A check meanwhile follows the decay's own rule: not idle for a whole delay yet.
        assert!(window.due(at(280)));
        assert_ne!(window.check(at(280), 7, [1, 1]), Release::All);
        // Busy again, then quiet: wanted again after the idle delay.
        assert!(!window.look(at(300), 8));
        assert!(!window.look(at(325), 8));
        assert!(window.look(at(350), 8));
    }

    #[test]
    fn without_a_shorter_idle_delay_only_the_checks_look() {
        let start = Instant::now();
        for idle in [None, Some(DELAY), Some(DELAY * 2)] {
            let mut window = Window::new(DELAY, idle, start);
            assert!(!window.look_due(start + DELAY * 10), "{idle:?}");
            assert!(!window.idle_release_wanted(start + DELAY * 10, 0), "{idle:?}");
        }
    }
}
