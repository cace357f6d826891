//! Whether several host threads take turns freeing on a device.
//!
//! Kernel launches on the legacy stream from several threads at once are
//! bimodal, and every driver call a thread adds between them pushes more of
//! them into the slow mode (docs/BENCHMARKS.md, "Threads on the legacy
//! stream"). While threads take turns, a `cudaFree` with only blocking
//! streams keeps its block for the next `cudaMalloc` of its size, which then
//! makes no driver call (`Device::free`). One thread alone gains nothing from
//! that, and the pool loses the block to other sizes, so it happens only
//! while threads take turns.
//!
//! A free by another thread than the last raises a score by `SWITCH`, a
//! free by the same thread lowers it by one: a run of L frees by one thread
//! changes it by 9 - L, so threads count as taking turns when they free in
//! runs of 8 or fewer, and the score must then climb from 0 to `ON` (about
//! 32 such switches more than runs lose). A program that moves from one
//! thread to another for longer stretches (PyTorch's forward pass on the
//! main thread, the backward pass on its autograd thread, each dozens of
//! frees) stays low; once one thread frees alone, the score falls under
//! `OFF` within a few hundred frees. Racy by design: a lost update only
//! shifts the score a little.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};

/// What a free by another thread than the last adds to the score.
const SWITCH: u32 = 8;
/// The score from which threads take turns ...
const ON: u32 = 256;
/// ... until it falls under this.
const OFF: u32 = 128;
/// The score's ceiling: this many frees of one thread bring it from there under `OFF`.
const CEILING: u32 = 2 * ON;

#[derive(Default)]
pub struct Turns {
    /// `locks::thread_number` of the thread that freed last, plus one (0: none yet).
    last: AtomicUsize,
    score: AtomicU32,
    taking_turns: AtomicBool,
}

impl Turns {
    /// Notes a free by the thread numbered `thread`; true if threads take turns.
    /// Writes nothing while one thread frees alone.
    pub fn note(&self, thread: usize) -> bool {
        let score = self.score.load(Relaxed);
        let score = if self.last.load(Relaxed) != thread + 1 {
            self.last.store(thread + 1, Relaxed);
            let raised = (score + SWITCH).min(CEILING);
            self.score.store(raised, Relaxed);
            raised
        } else if score > 0 {
            self.score.store(score - 1, Relaxed);
            score - 1
        } else {
            0
        };
        let was = self.taking_turns.load(Relaxed);
        let now = if was { score >= OFF } else { score >= ON };
        if now != was {
            self.taking_turns.store(now, Relaxed);
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_thread_never_takes_turns() {
        let turns = Turns::default();
        assert!((0..10_000).all(|_| !turns.note(7)));
    }

    #[test]
    fn threads_freeing_in_turn_are_seen_within_a_hundred_frees_and_forgotten_once_one_is_left() {
        let turns = Turns::default();
        let seen = (0..200).position(|i| turns.note(i % 4)).expect("four threads in turn are seen");
        assert!(seen < 100, "seen only after {seen} frees");
        assert!((0..64).all(|i| turns.note(i % 3)), "still taking turns");
        let forgotten = (0..1_000).position(|_| !turns.note(0)).expect("one thread left is seen");
        assert!(forgotten <= (CEILING - OFF) as usize, "forgotten only after {forgotten} frees");
    }

    #[test]
    fn runs_of_up_to_eight_frees_a_thread_take_turns_longer_runs_never() {
        for run in 1..=8 {
            let turns = Turns::default();
            assert!((0..10_000).any(|i| turns.note(i / run % 2)), "runs of {run}");
        }
        let turns = Turns::default();
        assert!((0..100_000).all(|i| !turns.note(i / 9 % 2)), "runs of 9");
    }

    #[test]
    fn a_program_that_moves_to_another_thread_now_and_then_does_not_take_turns() {
        // Forward on one thread, backward on another: two switches a step of 500 frees.
        let turns = Turns::default();
        for step in 0..100 {
            for free in 0..500 {
                let thread = if free < 250 { 0 } else { 1 };
                assert!(!turns.note(thread), "step {step}, free {free}");
            }
        }
    }
}
