//! The last pool events, kept in memory for the out-of-memory snapshot
//! (`SOMA_SNAPSHOT`): a ring of the newest `CAPACITY` allocations and frees
//! of device memory, with the call site of each. Kept only when a snapshot
//! is asked for: one short lock, the process's, per allocation and free then.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use super::locks::lock;
use super::trace::Op;

const CAPACITY: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Microseconds since the ring was made.
    pub time_us: u64,
    pub op: Op,
    pub device: i32,
    pub size: u64,
    pub ptr: u64,
    /// The allocation's return address (for a free: the freed block's).
    pub caller: usize,
}

pub struct Events {
    start: Instant,
    ring: Mutex<VecDeque<Event>>,
}

impl Default for Events {
    fn default() -> Events {
        Events { start: Instant::now(), ring: Mutex::new(VecDeque::with_capacity(CAPACITY)) }
    }
}

impl Events {
    pub fn record(&self, op: Op, device: i32, size: u64, ptr: u64, caller: usize) {
        let time_us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut ring = lock(&self.ring);
        if ring.len() == CAPACITY {
            ring.pop_front();
        }
        ring.push_back(Event { time_us, op, device, size, ptr, caller });
    }

    /// The events kept, oldest first.
    pub fn kept(&self) -> Vec<Event> {
        lock(&self.ring).iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_events_in_order() {
        let events = Events::default();
        for i in 0..CAPACITY as u64 + 10 {
            events.record(Op::Alloc, 0, i, 0x1000 + i, 7);
        }
        let kept = events.kept();
        assert_eq!(kept.len(), CAPACITY);
        assert_eq!((kept[0].size, kept[CAPACITY - 1].size), (10, CAPACITY as u64 + 9));
        assert!(kept.windows(2).all(|pair| pair[0].time_us <= pair[1].time_us));
    }
}
