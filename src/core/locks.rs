//! Taking the core's locks whatever happened before. A lock is poisoned only
//! when a hook panicked while holding it, and the export caught the panic.
//! Every update under the core's locks leaves the data consistent (a single
//! insert, removal or counter change), or at worst a block not reused
//! (leaked), never reused unsafely: so a poisoned lock is used as it is.
//!
//! The tables every allocation and free reads (the pools, the captures in
//! progress, the streams) are in `ReadMostly` locks: a reader takes the lock
//! of its thread's shard only, so threads allocating at once do not bounce
//! one cache line between their cores (each read of a plain `RwLock` writes
//! its shared state); a writer (a device set up or reset, a stream made or
//! destroyed, a capture begun or ended) takes every shard.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The lock if no other thread holds it.
pub fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

pub fn read<T>(lock: &ReadMostly<T>) -> ReadGuard<'_, T> {
    lock.read()
}

pub fn write<T>(lock: &ReadMostly<T>) -> WriteGuard<'_, T> {
    lock.write()
}

/// Threads are spread over this many shards (more threads share them).
pub const SHARDS: usize = 16;

/// This thread's shard, in `0..SHARDS`: threads take them in turn.
pub fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Relaxed) % SHARDS;
    }
    // A thread past its thread-locals' teardown reads shard 0: still correct.
    SHARD.try_with(|s| *s).unwrap_or(0)
}

/// One cache line (two, for the adjacent-line prefetcher) to itself.
#[derive(Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

/// A reader-writer lock whose readers do not share a cache line: one
/// `RwLock` per shard, a reader takes its thread's, a writer all of them
/// (in order, so writers never deadlock each other).
pub struct ReadMostly<T> {
    shards: [Padded<RwLock<()>>; SHARDS],
    data: UnsafeCell<T>,
}

// SAFETY: `data` is reached only through the guards: shared (`&T`) while a
// shard is held for reading, so never while a writer holds every shard;
// exclusive (`&mut T`) while every shard is held for writing, so while no
// reader holds any. That is a `RwLock<T>`'s contract, hence its bounds.
unsafe impl<T: Send + Sync> Sync for ReadMostly<T> {}
unsafe impl<T: Send> Send for ReadMostly<T> {}

impl<T: Default> Default for ReadMostly<T> {
    fn default() -> Self {
        ReadMostly::new(T::default())
    }
}

pub struct ReadGuard<'a, T> {
    _shard: RwLockReadGuard<'a, ()>,
    data: &'a T,
}

pub struct WriteGuard<'a, T> {
    _shards: [RwLockWriteGuard<'a, ()>; SHARDS],
    data: &'a mut T,
}

impl<T> ReadMostly<T> {
    pub fn new(data: T) -> Self {
        ReadMostly {
            shards: std::array::from_fn(|_| Padded::default()),
            data: UnsafeCell::new(data),
        }
    }

    pub fn read(&self) -> ReadGuard<'_, T> {
        let shard = self.shards[shard()]
            .0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // SAFETY: a shard is held for reading: no writer holds every shard (see the Sync impl).
        ReadGuard {
            _shard: shard,
            data: unsafe { &*self.data.get() },
        }
    }

    pub fn write(&self) -> WriteGuard<'_, T> {
        let shards = std::array::from_fn(|i| {
            self.shards[i]
                .0
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        });
        // SAFETY: every shard is held for writing: no reader or other writer (see the Sync impl).
        WriteGuard {
            _shards: shards,
            data: unsafe { &mut *self.data.get() },
        }
    }

    /// The write lock if no thread holds any shard.
    pub fn try_write(&self) -> Option<WriteGuard<'_, T>> {
        let mut held = Vec::with_capacity(SHARDS);
        for shard in &self.shards {
            match shard.0.try_write() {
                Ok(guard) => held.push(guard),
                Err(TryLockError::Poisoned(poisoned)) => held.push(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => return None,
            }
        }
        let shards = held.try_into().ok()?;
        // SAFETY: every shard is held for writing, as in `write`.
        Some(WriteGuard {
            _shards: shards,
            data: unsafe { &mut *self.data.get() },
        })
    }
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.data
    }
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.data
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_writer_excludes_readers_on_every_shard() {
        let lock = Arc::new(ReadMostly::new(0u64));
        let threads: Vec<_> = (0..2 * SHARDS)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        *lock.write() += 1;
                        let seen = *lock.read();
                        assert!(seen >= 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.read(), 2 * SHARDS as u64 * 200);
    }

    #[test]
    fn try_write_fails_while_any_shard_is_read() {
        let lock = Arc::new(ReadMostly::new(()));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let reader = {
            let lock = Arc::clone(&lock);
            std::thread::spawn(move || {
                let _guard = lock.read();
                held_tx.send(()).unwrap();
                done_rx.recv().unwrap();
            })
        };
        held_rx.recv().unwrap();
        assert!(lock.try_write().is_none());
        done_tx.send(()).unwrap();
        reader.join().unwrap();
        assert!(lock.try_write().is_some());
    }
}
