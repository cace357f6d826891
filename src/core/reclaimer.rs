//! The shim's one thread: joins queued frees and returns passed ones, off
//! the program's threads (see `pending`).
//!
//! It runs a step, then sleeps: briefly while frees wait for the GPU, long
//! while nothing does. A free wakes it only when it sleeps long, so the
//! program's hot path costs an atomic load. Each step holds `step`, so a
//! fork or a device reset can wait for the step to end (`before_fork`,
//! `pause`). At exit, `stop` ends the thread before the CUDA runtime tears
//! itself down, for good.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::locks::{lock, try_lock};

/// How long the thread sleeps, at least, while frees wait for the GPU.
const POLL: Duration = Duration::from_micros(50);
/// After ordering a batch for N us, it sleeps N * BUSY_SHARE us: a join
/// costs two driver calls per live non-blocking stream, which compete with
/// the program's own calls for the driver's locks.
const BUSY_SHARE: u32 = 9;
/// But no longer than this while frees wait: they hold memory.
const MAX_POLL: Duration = Duration::from_millis(1);
/// How long it sleeps, at most, when nothing waits (blocks in the cache
/// still age; `start` may ask for shorter naps).
const IDLE: Duration = Duration::from_millis(50);

/// What a step left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    /// Frees still wait to be ordered or to pass; the step spent this long
    /// ordering batches (driver calls that compete with the program's).
    Pending(Duration),
    /// The frees held pass `SOMA_PENDING_FREE_LIMIT`: the pool grows until
    /// the next step orders them, which comes after the shortest sleep.
    PastLimit,
    /// Nothing waits.
    Idle,
}

impl Activity {
    /// Both steps' activity, as one.
    pub fn and(self, other: Activity) -> Activity {
        match (self, other) {
            (Activity::PastLimit, _) | (_, Activity::PastLimit) => Activity::PastLimit,
            (Activity::Pending(a), Activity::Pending(b)) => Activity::Pending(a + b),
            (Activity::Idle, other) | (other, Activity::Idle) => other,
        }
    }
}

#[derive(Default)]
pub struct Reclaimer {
    thread: Mutex<Option<JoinHandle<()>>>,
    running: AtomicBool,
    stop: AtomicBool,
    /// Set by frees, cleared by the thread before each step.
    work: AtomicBool,
    /// The thread sleeps long: a free must wake it.
    sleeping: AtomicBool,
    step: Mutex<()>,
}

impl Reclaimer {
    pub fn running(&self) -> bool {
        self.running.load(SeqCst)
    }

    /// Frees were queued and no thread runs to join them.
    pub fn wanted(&self) -> bool {
        self.work.load(SeqCst) && !self.running()
    }

    /// Starts the thread, which runs `step` until `stop`, napping at most
    /// `idle_nap` when nothing waits (once; false if it could not be started,
    /// and then the caller reclaims on its own).
    pub fn start(&'static self, idle_nap: Duration, mut step: impl FnMut() -> Activity + Send + 'static) -> bool {
        let mut thread = lock(&self.thread);
        if self.running() {
            return true;
        }
        if self.stop.load(SeqCst) {
            return false; // after the exit handler: frees are reclaimed by allocations
        }
        let spawned = thread::Builder::new().name("somashim".into()).spawn(move || {
            while !self.stop.load(SeqCst) {
                self.work.store(false, SeqCst);
                let activity = {
                    let _step = lock(&self.step);
                    step()
                };
                match activity {
                    Activity::PastLimit => {
                        thread::sleep(POLL);
                        continue;
                    }
                    Activity::Pending(ordering) => {
                        // Its driver calls compete with the program's: ordering takes
                        // at most a tenth of the time.
                        thread::sleep(POLL.max(ordering * BUSY_SHARE).min(MAX_POLL));
                        continue;
                    }
                    Activity::Idle => {}
                }
                self.sleeping.store(true, SeqCst);
                if !self.work.load(SeqCst) && !self.stop.load(SeqCst) {
                    thread::park_timeout(idle_nap.min(IDLE));
                }
                self.sleeping.store(false, SeqCst);
            }
        });
        match spawned {
            Ok(handle) => {
                *thread = Some(handle);
                self.running.store(true, SeqCst);
                true
            }
            Err(e) => {
                log::warn!("cannot start the reclaimer thread ({e}): allocations reclaim frees themselves");
                false
            }
        }
    }

    /// A free was queued.
    pub fn wake(&self) {
        if !self.work.load(SeqCst) {
            self.work.store(true, SeqCst);
        }
        // Never waits: a fork holds `thread` while it waits for an IPC
        // exchange, and a wake missed costs at most the thread's nap.
        if self.sleeping.load(SeqCst) {
            if let Some(handle) = try_lock(&self.thread).as_ref().and_then(|thread| thread.as_ref()) {
                handle.thread().unpark();
            }
        }
    }

    /// Ends the thread and waits for it (at exit).
    pub fn stop(&self) {
        self.stop.store(true, SeqCst);
        let handle = lock(&self.thread).take();
        if let Some(handle) = handle {
            handle.thread().unpark();
            let _ = handle.join();
        }
        self.running.store(false, SeqCst);
    }

    /// Counts as running with no thread, so that allocations leave the frees
    /// to steps the model test runs itself, where it chooses.
    #[cfg(test)]
    pub fn pretend_running(&self) {
        self.running.store(true, SeqCst);
    }

    /// Waits for the step in progress and keeps the next from starting until
    /// the guard is dropped, so that no step touches a device's streams as a
    /// reset destroys them.
    pub fn pause(&self) -> MutexGuard<'_, ()> {
        lock(&self.step)
    }

    /// Before `fork`: no step under way and the thread's handle not in use,
    /// so that the child inherits no lock held by a thread it will not have.
    pub fn before_fork(&self) -> ForkPause<'_> {
        let step = lock(&self.step);
        ForkPause { _step: step, thread: lock(&self.thread) }
    }
}

/// The reclaimer's locks, held across a `fork` by the forking thread.
pub struct ForkPause<'a> {
    _step: MutexGuard<'a, ()>,
    thread: MutexGuard<'a, Option<JoinHandle<()>>>,
}

impl ForkPause<'_> {
    /// In the child: the thread did not come along.
    pub fn in_child(mut self, reclaimer: &Reclaimer) {
        if let Some(handle) = self.thread.take() {
            // Its thread is not in this process: nothing to join or detach.
            std::mem::forget(handle);
        }
        reclaimer.running.store(false, SeqCst);
        reclaimer.stop.store(false, SeqCst);
    }
}
