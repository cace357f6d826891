//! How much memory a device may hold for its program, and where a large
//! request's memory comes from.
//!
//! A pool serves any size from what it reserves unused (the driver maps its
//! free memory anew, at no cost) and maps only the rest fresh, slowly; the
//! real allocator maps fresh memory fast, but a block it made serves only its
//! own size again (docs/FACTS.md, "Growth and trim"). So a large request comes
//! from the real allocator only where it is growth, taking the program past
//! its recent peak in use, and the device holds unused less than half of it
//! (a fresh process's first blocks, a turn after the device gave back what it
//! held); every other one comes from the pool, and stays the pool's while
//! what the device held goes back for it. Before either takes fresh
//! memory, what the device holds (the pools' reservations and the large
//! blocks, used or not) is brought within 1.2 times the larger of that peak
//! and the use with the request: cached large blocks go back, oldest first
//! (the real allocator's with the real free, the pool's to the pool), and,
//! before a real allocation, the pool's unused memory; where that is not
//! enough and frees wait for the GPU, the host waits for them first, as the
//! real free would have.

use super::super::decay::CHECKS;

/// What a device may hold: this many fifths of the program's peak in use.
pub const HELD_OVER_PEAK_FIFTHS: u64 = 6;

/// The most a device may hold for a program whose peak in use is `peak`.
pub fn allowed(peak: u64) -> u64 {
    peak.saturating_mul(HELD_OVER_PEAK_FIFTHS) / 5
}

/// Where a new block's memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Pool,
    /// The real allocator (`cuMemAlloc`), as a large block the shim keeps.
    RealAllocator,
}

/// What a device holds and its program uses, as a large request finds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    /// Bytes the program holds from the shim on the device, all sizes.
    pub in_use: u64,
    /// The program's peak in use over the last decay delay (since its start
    /// without the decay, or since the device last gave back all it held).
    pub peak: u64,
    /// Bytes the pools reserve and the large blocks hold, used or not.
    pub held: u64,
    /// Bytes of large blocks in the cache: they can go back at once.
    pub cached_large: u64,
    /// Bytes the pool of large requests reserves and does not use.
    pub pool_unused: u64,
}

/// What a large request does before it takes memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Bytes of cached large blocks to give back first (oldest first; the
    /// last one given may take more).
    pub give_back_large: u64,
    /// Give the pool's unused memory back first too.
    pub trim_pool: bool,
    /// Bytes over the allowance that those give-backs do not cover.
    pub still_over: u64,
}

/// Where a large request of `size` bytes comes from. Decided once: what
/// goes back for it (`plan`) does not change it, so a request the memory
/// held unused made the pool's stays the pool's after that memory went.
pub fn source(size: u64, holding: &Holding) -> Source {
    let fresh = size.saturating_sub(holding.pool_unused);
    let growth = holding.in_use.saturating_add(size) > holding.peak;
    let unused = holding.pool_unused.saturating_add(holding.cached_large);
    if fresh > 0 && growth && unused < size / 2 {
        Source::RealAllocator
    } else {
        Source::Pool
    }
}

/// What goes back before a large request of `size` bytes takes its memory
/// from `source`.
pub fn plan(size: u64, holding: &Holding, source: Source) -> Plan {
    // What the request takes fresh: the pool maps only what it lacks.
    let taken = match source {
        Source::Pool => size.saturating_sub(holding.pool_unused),
        Source::RealAllocator => size,
    };
    if taken == 0 {
        return Plan { give_back_large: 0, trim_pool: false, still_over: 0 };
    }
    let allowed = allowed(holding.peak.max(holding.in_use.saturating_add(size)));
    let excess = holding.held.saturating_add(taken).saturating_sub(allowed);
    let give_back_large = excess.min(holding.cached_large);
    // The pool's unused memory would serve a pool request: it goes only
    // before a real allocation.
    let trim_pool = source == Source::RealAllocator && excess > give_back_large && holding.pool_unused > 0;
    let trimmed = if trim_pool { holding.pool_unused } else { 0 };
    Plan { give_back_large, trim_pool, still_over: excess.saturating_sub(give_back_large + trimmed) }
}

/// The program's peak in use over the decay's last `CHECKS` checks.
#[derive(Debug, Default)]
pub struct PeakWindow {
    highs: [u64; CHECKS],
    slot: usize,
}

impl PeakWindow {
    /// A check saw `high` as the highest use since the last: the peak of the
    /// last `CHECKS` checks.
    pub fn check(&mut self, high: u64) -> u64 {
        self.highs[self.slot] = high;
        self.slot = (self.slot + 1) % CHECKS;
        self.highs.iter().copied().max().unwrap_or(0)
    }

    /// The device gave back all it held unused: what the program used before
    /// counts no more (its next rise is growth).
    pub fn forget(&mut self) {
        *self = PeakWindow::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// The source of a request, and its plan.
    fn planned(size: u64, holding: &Holding) -> (Source, Plan) {
        let source = source(size, holding);
        (source, plan(size, holding, source))
    }

    const NOTHING: Plan = Plan { give_back_large: 0, trim_pool: false, still_over: 0 };

    #[test]
    fn a_request_the_pools_unused_memory_covers_takes_nothing_new() {
        let holding = Holding { in_use: 0, peak: 2 * GIB, held: 2 * GIB, cached_large: 0, pool_unused: 2 * GIB };
        assert_eq!(planned(GIB, &holding), (Source::Pool, NOTHING));
    }

    #[test]
    fn growth_with_little_held_unused_comes_from_the_real_allocator() {
        // A fresh burst: each request raises the peak, nothing is cached.
        let holding = Holding { in_use: 3 * GIB, peak: 3 * GIB, held: 3 * GIB + 100 * MIB, cached_large: 0, pool_unused: 100 * MIB };
        assert_eq!(planned(GIB, &holding), (Source::RealAllocator, NOTHING));
    }

    #[test]
    fn growth_the_pools_unused_memory_half_covers_extends_the_pool() {
        // A buffer grown by a quarter: the old one is back in the pool.
        let holding = Holding { in_use: GIB, peak: 2 * GIB, held: 2 * GIB, cached_large: 0, pool_unused: GIB };
        assert_eq!(planned(1280 * MIB, &holding), (Source::Pool, NOTHING), "256 MiB fresh: within 1.2 x 2.25 GiB");
    }

    #[test]
    fn a_size_within_the_peak_comes_from_the_pool_once_cached_blocks_of_other_sizes_went() {
        // One block live at a time: 1 GiB was used and is cached; 800 MiB now.
        let holding = Holding { in_use: 0, peak: GIB, held: GIB, cached_large: GIB, pool_unused: 0 };
        let (source, plan) = planned(800 * MIB, &holding);
        assert_eq!(source, Source::Pool);
        // 1 GiB + 800 MiB held against 1.2 GiB allowed: the cached block goes.
        assert_eq!(plan.give_back_large, GIB + 800 * MIB - allowed(GIB));
        assert!(!plan.trim_pool, "the pool's unused memory would serve it");
    }

    #[test]
    fn before_a_real_allocation_past_the_budget_the_pools_unused_memory_goes() {
        // 300 MiB unused in the pool, 2 GiB asked past a peak of 1 GiB, 2 GiB held.
        let holding = Holding { in_use: GIB, peak: GIB, held: 2 * GIB, cached_large: 0, pool_unused: 300 * MIB };
        let still_over = 4 * GIB - allowed(3 * GIB) - 300 * MIB;
        assert_eq!(planned(2 * GIB, &holding), (Source::RealAllocator, Plan { give_back_large: 0, trim_pool: true, still_over }));
    }

    #[test]
    fn what_the_cache_cannot_cover_is_still_over() {
        // Frees not yet passed hold 1 GiB; 512 MiB cached; 1 GiB asked within a 1 GiB peak.
        let holding = Holding { in_use: 0, peak: GIB, held: GIB + 512 * MIB, cached_large: 512 * MIB, pool_unused: 0 };
        let (source, plan) = planned(GIB, &holding);
        assert_eq!((source, plan.give_back_large), (Source::Pool, 512 * MIB));
        assert_eq!(plan.still_over, GIB + 512 * MIB + GIB - allowed(GIB) - 512 * MIB);
    }

    #[test]
    fn within_the_allowance_nothing_goes_back() {
        let holding = Holding { in_use: GIB, peak: 4 * GIB, held: 2 * GIB, cached_large: GIB, pool_unused: 0 };
        assert_eq!(planned(GIB, &holding), (Source::Pool, NOTHING));
    }

    #[test]
    fn a_request_the_cache_made_the_pools_stays_so_once_the_cache_went() {
        // A buffer grown past the peak while the old one, of the real
        // allocator, is cached: the pool's, as the cache covers half of it.
        let before = Holding { in_use: GIB, peak: 2 * GIB, held: 2 * GIB, cached_large: GIB, pool_unused: 0 };
        let (source, first) = planned(GIB + 64 * MIB, &before);
        assert_eq!(source, Source::Pool);
        assert!(first.give_back_large > 0);
        // The cached block went with the real free: planned again, the
        // request keeps its source (a new real block would be cached next).
        let after = Holding { held: GIB, cached_large: 0, ..before };
        assert_eq!(super::source(GIB + 64 * MIB, &after), Source::RealAllocator, "decided afresh, it would flip");
        assert_eq!(plan(GIB + 64 * MIB, &after, source), NOTHING);
    }

    #[test]
    fn the_window_keeps_the_peak_of_the_last_checks_and_forgets_on_demand() {
        let mut window = PeakWindow::default();
        assert_eq!(window.check(5), 5);
        for _ in 1..CHECKS {
            assert_eq!(window.check(1), 5, "within the last {CHECKS} checks");
        }
        assert_eq!(window.check(2), 2, "the peak is older than the window");
        window.forget();
        assert_eq!(window.check(0), 0);
    }
}
