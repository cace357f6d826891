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
//! destroyed, a capture begun or ended) takes every shard, in order. A
//! writer waiting for a shard holds the ones before it, so readers of those
//! wait for every reader ahead of the writer: no table is read-locked across
//! a wait for another thread that may need it (as with any `RwLock`).

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
    thread_number() % SHARDS
}

/// A number of this thread's own, in the order threads first ask: no two
/// threads of the process share one.
pub fn thread_number() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static NUMBER: usize = NEXT.fetch_add(1, Relaxed);
    }
    NUMBER.with(|n| *n)
}

/// One cache line (two, for the adjacent-line prefetcher) to itself.
#[derive(Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

/// One `T` per shard, each on lines of its own, on the heap (the
/// allocator is built on whichever program thread calls first, whatever its
/// stack).
pub struct PerShard<T>(Box<[Padded<T>]>);

impl<T: Default> Default for PerShard<T> {
    fn default() -> Self {
        PerShard((0..SHARDS).map(|_| Padded::default()).collect())
    }
}

impl<T> PerShard<T> {
    /// This thread's.
    pub fn mine(&self) -> &T {
        &self.0[shard()].0
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|padded| &padded.0)
    }

    /// One count, over every shard (saturating).
    pub fn sum(&self, count: impl Fn(&T) -> &AtomicU64) -> u64 {
        self.iter().fold(0, |sum, shard| sum.saturating_add(count(shard).load(Relaxed)))
    }
}

/// A reader-writer lock whose readers do not share a cache line: one
/// `RwLock` per shard, a reader takes its thread's, a writer all of them
/// (in order, so writers never deadlock each other).
pub struct ReadMostly<T> {
    shards: PerShard<RwLock<()>>,
    data: UnsafeCell<T>,
}

// SAFETY: `data` is reached only through the guards: shared while a shard
// is held for reading, so never while a writer holds every shard; exclusive
// while every shard is held for writing, so while no reader holds any.
// That is a `RwLock<T>`'s contract, hence its bounds.
unsafe impl<T: Send + Sync> Sync for ReadMostly<T> {}

impl<T: Default> Default for ReadMostly<T> {
    fn default() -> Self {
        ReadMostly::new(T::default())
    }
}

/// Holds a shard for reading. A pointer, not a reference, to the data: the
/// shard is released inside `drop`, after which a writer may change it.
pub struct ReadGuard<'a, T> {
    _shard: RwLockReadGuard<'a, ()>,
    data: NonNull<T>,
    _data: PhantomData<&'a T>,
}

/// Holds every shard for writing (a pointer to the data, as `ReadGuard`).
pub struct WriteGuard<'a, T> {
    _shards: [RwLockWriteGuard<'a, ()>; SHARDS],
    data: NonNull<T>,
    _data: PhantomData<&'a mut T>,
}

impl<T> ReadMostly<T> {
    pub fn new(data: T) -> Self {
        ReadMostly { shards: PerShard::default(), data: UnsafeCell::new(data) }
    }

    pub fn read(&self) -> ReadGuard<'_, T> {
        let shard = self.shards.mine().read().unwrap_or_else(|poisoned| poisoned.into_inner());
        ReadGuard { _shard: shard, data: self.data_pointer(), _data: PhantomData }
    }

    pub fn write(&self) -> WriteGuard<'_, T> {
        let mut shards = self.shards.iter().map(|s| s.write().unwrap_or_else(|poisoned| poisoned.into_inner()));
        let shards = std::array::from_fn(|_| shards.next().expect("one lock per shard"));
        WriteGuard { _shards: shards, data: self.data_pointer(), _data: PhantomData }
    }

    /// The write lock if no thread holds any shard (those taken before one
    /// that was held are released on the way out).
    pub fn try_write(&self) -> Option<WriteGuard<'_, T>> {
        let mut held = Vec::with_capacity(SHARDS);
        for shard in self.shards.iter() {
            match shard.try_write() {
                Ok(guard) => held.push(guard),
                Err(TryLockError::Poisoned(poisoned)) => held.push(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => return None,
            }
        }
        let shards = held.try_into().ok()?;
        Some(WriteGuard { _shards: shards, data: self.data_pointer(), _data: PhantomData })
    }

    fn data_pointer(&self) -> NonNull<T> {
        NonNull::new(self.data.get()).expect("an UnsafeCell's pointer is not null")
    }
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: a shard is held for reading while the guard lives: no writer holds every shard.
        unsafe { self.data.as_ref() }
    }
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: every shard is held for writing while the guard lives: no reader or other writer.
        unsafe { self.data.as_ref() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { self.data.as_mut() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A writer sets both fields in two steps; a reader on any shard must
    /// never see them differ (threads beyond the shards share them).
    #[test]
    fn readers_on_every_shard_never_see_a_write_half_done() {
        let lock = Arc::new(ReadMostly::new((0u64, 0u64)));
        let threads: Vec<_> = (0..2 * SHARDS)
            .map(|i| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..300 {
                        if i % 4 == 0 {
                            let mut pair = lock.write();
                            pair.0 += 1;
                            std::hint::black_box(&mut *pair);
                            pair.1 += 1;
                        } else {
                            let pair = lock.read();
                            assert_eq!(pair.0, pair.1, "a read between a write's two steps");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.read(), ((2 * SHARDS / 4 * 300) as u64, (2 * SHARDS / 4 * 300) as u64));
    }

    /// A reader on one shard after another (each a new thread, so on the
    /// next shard): `try_write` fails while it reads, releases the shards it
    /// took, and succeeds after.
    #[test]
    fn try_write_fails_while_any_shard_is_read_and_keeps_nothing() {
        let lock = Arc::new(ReadMostly::new(()));
        for _ in 0..SHARDS {
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
            assert!(lock.try_write().is_some(), "a failed try_write kept a shard");
        }
    }
}
