//! One device's pool and the ordering that makes its reuse safe.
//!
//! Two streams of the shim's own, both non-blocking:
//! - the *alloc stream* never carries any work but allocations, so a block it
//!   hands out has no pending dependency and is usable at once from every
//!   stream. The pool reuses a freed block there only once the GPU has passed
//!   its free (`AllowOpportunistic`), or, with `SOMA_REUSE_INTERNAL_DEPS=1`,
//!   after the host has waited for that free.
//! - the *free stream* carries the frees. Before each batch it waits for an
//!   event recorded on the legacy stream (which itself waits for every blocking
//!   stream) and on every live non-blocking stream, so a free is passed only
//!   once all work issued before it, on every stream, has finished.
//!
//! Frees still in flight are counted; past `SOMA_PENDING_FREE_LIMIT` bytes an
//! allocation waits for them, so the pool cannot grow without bound.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::config::{Config, PoolChoice};
use crate::driver::{Context, CuError, CuResult, Driver, Event, Pool, Stream};

pub struct Device {
    pub ordinal: i32,
    pub context: Context,
    pool: Pool,
    owns_pool: bool,
    alloc_stream: Stream,
    free_stream: Stream,
    internal_deps: bool,
    pending_free_limit: u64,
    frees: Mutex<FreeQueue>,
}

/// Frees issued on the free stream whose completion the GPU has not yet shown.
struct FreeQueue {
    /// Recorded on the legacy and other streams, waited on by the free stream.
    /// Reusing one event is safe: a wait binds to the record current at the call.
    scratch: Event,
    /// In issue order, so they complete in order: (recorded after the batch, its bytes).
    pending: VecDeque<(Event, u64)>,
    pending_bytes: u64,
    spare: Vec<Event>,
}

/// Why an allocation did not come from the pool.
#[derive(Debug, PartialEq, Eq)]
pub enum AllocFailure {
    OutOfMemory,
    Driver(CuError),
}

/// The streams a free must be ordered after, besides the legacy stream.
pub struct Predecessors<'a> {
    pub nonblocking: &'a [Stream],
    /// Last work of destroyed streams that may still run.
    pub tails: &'a [Event],
}

impl Device {
    /// Sets up the pool of `ordinal`, whose primary context is current.
    pub fn create(driver: &Driver, ordinal: i32, context: Context, config: &Config) -> CuResult<Device> {
        let (pool, owns_pool) = match config.pool {
            PoolChoice::Own => (driver.create_pool(ordinal)?, true),
            PoolChoice::Default => (driver.default_pool(ordinal)?, false),
        };
        let threshold = config.release_threshold.resolve(driver.total_memory(ordinal)?);
        driver.set_release_threshold(pool, threshold)?;
        driver.set_reuse_policies(
            pool,
            config.reuse_follow_event_deps,
            config.reuse_opportunistic,
            config.reuse_internal_deps,
        )?;
        Ok(Device {
            ordinal,
            context,
            pool,
            owns_pool,
            alloc_stream: driver.create_nonblocking_stream()?,
            free_stream: driver.create_nonblocking_stream()?,
            internal_deps: config.reuse_internal_deps,
            pending_free_limit: config.pending_free_limit,
            frees: Mutex::new(FreeQueue {
                scratch: driver.create_event()?,
                pending: VecDeque::new(),
                pending_bytes: 0,
                spare: Vec::new(),
            }),
        })
    }

    /// A block of `size` bytes, usable at once from every stream.
    /// The device's context must be current.
    pub fn alloc(&self, driver: &Driver, size: u64) -> Result<u64, AllocFailure> {
        {
            let mut frees = self.lock_frees();
            frees.retire_passed(driver);
            if frees.pending_bytes > self.pending_free_limit {
                log::debug!(
                    "device {}: {} bytes of frees in flight, over the limit: waiting",
                    self.ordinal,
                    frees.pending_bytes
                );
                self.wait_for_frees(driver, &mut frees);
            }
        }
        let ptr = match driver.alloc_from_pool(size, self.pool, self.alloc_stream) {
            Err(e) if e.is_out_of_memory() => self.alloc_after_reclaiming(driver, size)?,
            other => other.map_err(AllocFailure::Driver)?,
        };
        if self.internal_deps {
            // The driver may have made the alloc stream wait for the reused
            // block's free; the program's streams do not wait on ours.
            driver.synchronize_stream(self.alloc_stream).map_err(AllocFailure::Driver)?;
        }
        Ok(ptr)
    }

    /// Out of memory: wait for the frees in flight, then give cached memory back, retrying after each.
    fn alloc_after_reclaiming(&self, driver: &Driver, size: u64) -> Result<u64, AllocFailure> {
        self.wait_for_frees(driver, &mut self.lock_frees());
        let retry = || driver.alloc_from_pool(size, self.pool, self.alloc_stream);
        let first = retry();
        let result = match first {
            Err(e) if e.is_out_of_memory() => {
                log::debug!("device {}: trimming the pool for {size} bytes", self.ordinal);
                driver.trim(self.pool).map_err(AllocFailure::Driver)?;
                retry()
            }
            other => other,
        };
        result.map_err(|e| if e.is_out_of_memory() { AllocFailure::OutOfMemory } else { AllocFailure::Driver(e) })
    }

    /// Frees `blocks` (pointer, size) once all work issued so far on every
    /// stream of this device has finished. The device's context must be current.
    pub fn free(&self, driver: &Driver, blocks: &[(u64, u64)], after: &Predecessors) -> CuResult<()> {
        let mut frees = self.lock_frees();
        let scratch = frees.scratch;
        for stream in std::iter::once(&Stream::LEGACY).chain(after.nonblocking) {
            driver.record(scratch, *stream)?;
            driver.wait_event(self.free_stream, scratch)?;
        }
        for tail in after.tails {
            driver.wait_event(self.free_stream, *tail)?;
        }
        let mut bytes = 0;
        for &(ptr, size) in blocks {
            driver.free_async(ptr, self.free_stream)?;
            bytes += size;
        }
        let done = match frees.spare.pop() {
            Some(event) => event,
            None => driver.create_event()?,
        };
        driver.record(done, self.free_stream)?;
        frees.pending.push_back((done, bytes));
        frees.pending_bytes += bytes;
        Ok(())
    }

    /// Lets device `accessor` reach every block of this pool, or stops it.
    pub fn set_peer_access(&self, driver: &Driver, accessor: i32, allowed: bool) -> CuResult<()> {
        driver.set_peer_access(self.pool, accessor, allowed)
    }

    /// Releases what the shim created. The device's context must be current.
    /// Errors are ignored: this runs just before a reset destroys it all anyway.
    pub fn destroy(&self, driver: &Driver) {
        let frees = self.lock_frees();
        let events = frees.pending.iter().map(|(e, _)| *e).chain(frees.spare.iter().copied());
        for event in events.chain([frees.scratch]) {
            let _ = driver.destroy_event(event);
        }
        let _ = driver.destroy_stream(self.alloc_stream);
        let _ = driver.destroy_stream(self.free_stream);
        if self.owns_pool {
            let _ = driver.destroy_pool(self.pool);
        }
    }

    fn wait_for_frees(&self, driver: &Driver, frees: &mut FreeQueue) {
        if let Err(e) = driver.synchronize_stream(self.free_stream) {
            log::warn!("device {}: waiting for pending frees failed: {e:?}", self.ordinal);
            return;
        }
        frees.retire_passed(driver);
    }

    fn lock_frees(&self) -> std::sync::MutexGuard<'_, FreeQueue> {
        // A panic while holding the lock left the queue consistent (each
        // update is a single push or pop), so a poisoned lock is still usable.
        self.frees.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl FreeQueue {
    /// Drops the frees the GPU has passed from the count.
    fn retire_passed(&mut self, driver: &Driver) {
        while let Some(&(event, bytes)) = self.pending.front() {
            if !driver.has_passed(event) {
                break;
            }
            self.pending.pop_front();
            self.pending_bytes -= bytes;
            self.spare.push(event);
        }
    }
}
