//! Memory the pools give back to the driver, for other processes: the decay
//! of what they hold unused (the reclaimer's steps), what another process
//! out of memory or `somarun --trim` asks for, and the figures
//! `somarun --ps` shows.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::state::Allocator;
use crate::core::device::ordering::Wait;
use crate::core::device::pool::Device;
use crate::core::locks::read;
use crate::cuda::gpu::Gpu;

/// What one pool holds, for `somarun --ps`.
pub struct PoolUsage {
    pub ordinal: i32,
    /// A pinned host memory pool (for device `ordinal`).
    pub host: bool,
    pub uuid: [u8; 16],
    /// In order: in use by the program, cached, freed and not yet reusable,
    /// reserved by the pool, the program's peak in use, given back so far
    /// (as `USAGE_FIELDS` names them).
    pub figures: [u64; 6],
}

impl Allocator {
    /// Runs `give` on each of `pools` in its device's context, counting what
    /// it gave back; nothing while a capture is in progress (returning
    /// cached blocks may use the legacy stream) or on a device reset by a
    /// path the shim does not see. Bytes given back.
    fn give_back_from(
        &self,
        driver: &impl Gpu,
        pools: impl Iterator<Item = Arc<Device>>,
        give: impl Fn(&Device) -> u64,
    ) -> u64 {
        let captures = read(&self.captures);
        if !captures.is_empty() {
            return 0;
        }
        let mut total = 0;
        for device in pools {
            if !self.is_current_incarnation(driver, device.ordinal, None) {
                continue;
            }
            match driver.with_context(device.context, || give(&device)) {
                Ok(given) => {
                    self.stats.counters(device.ordinal, device.host).given_back.fetch_add(given, Relaxed);
                    total += given;
                }
                Err(e) => log::warn!("device {}: cannot make its context current: {e:?}", device.ordinal),
            }
        }
        total
    }

    /// Frees `device`'s large blocks out of the cache with the real free
    /// (`Device::release_segments`), counted as given back. Its context must
    /// be current, and no capture in progress.
    pub(super) fn release_segments(&self, driver: &impl Gpu, device: &Device) -> u64 {
        let given = device.release_segments(driver);
        if given > 0 {
            self.stats.counters(device.ordinal, device.host).given_back.fetch_add(given, Relaxed);
        }
        given
    }

    /// The decay's checks and idle looks that are due (`SOMA_DECAY_MS`,
    /// `SOMA_IDLE_MS`), on every pool. By the reclaimer, between its steps.
    pub(super) fn decay_all(&self, driver: &impl Gpu) {
        let due: Vec<_> = self.every_pool().filter(|device| device.decay_due(self.activity(device))).collect();
        if due.is_empty() {
            return;
        }
        self.give_back_from(driver, due.into_iter(), |device| {
            let in_use = self.stats.counters(device.ordinal, device.host).in_use.load(Relaxed);
            device.decay(driver, &self.map, self.activity(device), in_use)
        });
    }

    /// The allocations and frees the pools of `device` served so far.
    fn activity(&self, device: &Device) -> u64 {
        let counters = self.stats.counters(device.ordinal, device.host);
        counters.total(|t| &t.pool_allocs) + counters.total(|t| &t.pool_frees)
    }

    /// Gives back all that the pools of the device `uuid` (None: every pool,
    /// pinned host pools too) hold and the program does not use. Bytes given back.
    pub fn give_back(&self, driver: &impl Gpu, uuid: Option<[u8; 16]>) -> u64 {
        let pools = self.every_pool().filter(|device| uuid.map_or(true, |uuid| !device.host && device.uuid == uuid));
        self.give_back_from(driver, pools, |device| device.give_back(driver, &self.map))
    }

    /// The program's own allocators (its stream-ordered pools, its virtual
    /// memory) found the devices out of memory: memory the program freed to
    /// the shim would be free for them natively, so every device pool waits
    /// for its frees, as the real frees would have, and gives back all it
    /// holds unused. Bytes given back.
    pub fn make_room_for_own_allocators(&self, driver: &impl Gpu) -> u64 {
        let pools = self.every_pool().filter(|device| !device.host);
        let given = self.give_back_from(driver, pools, |device| {
            self.reclaim(driver, device, Wait::All);
            // The cached large blocks first, waiting for a return another
            // thread began (`give_back` would leave the cache to it).
            device.give_back_cached_large(driver, &self.map, u64::MAX);
            let given = device.give_back(driver, &self.map);
            // Blocks just returned to the pools count as used there until
            // their frees pass: once they have, they go too.
            given + device.trim_every_pool(driver).unwrap_or(0)
        });
        if given > 0 {
            self.stats.room_for_own_allocators.fetch_add(1, Relaxed);
        }
        given
    }

    /// The figures of the pool at `index` (devices first, then pinned host pools).
    pub fn usage(&self, driver: &impl Gpu, index: usize) -> Option<PoolUsage> {
        let device = self.every_pool().nth(index)?;
        let counters = self.stats.counters(device.ordinal, device.host);
        // A pool of a device reset by a path the shim does not see is gone.
        let live = self.is_current_incarnation(driver, device.ordinal, None);
        let reserved = if live { driver.with_context(device.context, || device.reserved(driver)).unwrap_or(0) } else { 0 };
        let figures = [
            counters.in_use.load(Relaxed),
            device.cached_bytes(),
            device.pending_bytes(),
            reserved,
            counters.peak_in_use.load(Relaxed),
            counters.given_back.load(Relaxed),
        ];
        Some(PoolUsage { ordinal: device.ordinal, host: device.host, uuid: device.uuid, figures })
    }
}
