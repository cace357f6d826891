//! Pool blocks shared with other processes through CUDA IPC: a block's
//! handle, and its importers' leases (held in `core::shared_blocks`).

use std::sync::atomic::Ordering;

use super::state::Allocator;
use crate::core::locks::{lock, read};
use crate::core::ptrmap::Block;
use crate::core::shared_blocks::Secret;
use crate::cuda::gpu::{Context, Gpu, Pool};

impl Allocator {
    /// Exports the live pool block at `base` through CUDA IPC: the secret of
    /// its handle (`new_secret` draws one for a new export) and the block.
    /// None where the shim cannot export it: the real call answers.
    pub fn export(&self, driver: &impl Gpu, base: u64, new_secret: impl FnOnce() -> Option<Secret>) -> Option<(Secret, Block)> {
        let block = self.map.live_block(base)?;
        let device = self.known_device(block.device)?;
        if self.map.live_shared_block(base).is_none() {
            // A new allocation: its earlier work must be done before an
            // importer may touch it (see `Device::wait_before_export`).
            // Held until the end: no capture may begin while the legacy
            // stream is marked or waited for; during one it may not be.
            let captures = read(&self.captures);
            if !captures.is_empty() {
                return None;
            }
            if let Err(e) = driver.with_context(device.context, || device.wait_before_export(driver)).and_then(|r| r) {
                log::warn!("device {}: waiting for the legacy stream before an export failed: {e:?}", block.device);
                return None;
            }
        }
        self.shared_blocks.export(&self.map, base, device.context_id, new_secret)
    }

    /// An importer presents `secret` for `base`: a lease on the live block
    /// that export named, if it still is one, and the id of the context it
    /// was exported in.
    pub fn lease(&self, base: u64, secret: &Secret) -> Option<(Block, u64)> {
        self.shared_blocks.lease(&self.map, base, secret)
    }

    /// A lease on `base` under `secret` ended: a block the program freed
    /// meanwhile is freed once its last lease ends (by the next pool call of
    /// a program thread, as frees deferred during a capture are; no driver
    /// call here).
    pub fn lease_ended(&self, base: u64, secret: &Secret) {
        if let Some(block) = self.shared_blocks.lease_ended(base, secret) {
            lock(&self.deferred).push((base, block));
            self.has_deferred.store(true, Ordering::Release);
        }
    }

    /// The real CUDA IPC serves the block at `ptr` of device `ordinal`: a
    /// large block of the real allocator, which from now on is freed by the
    /// real free (another process may map it). False for a pool block.
    pub fn export_segment(&self, driver: &impl Gpu, ordinal: i32, ptr: u64) -> bool {
        let Some(device) = self.known_device(ordinal) else { return false };
        let Some(segment) = device.segment(ptr) else { return false };
        // Held until the end: no capture may begin while the legacy stream is
        // marked or waited for; during one it may not be (the wait is skipped).
        let captures = read(&self.captures);
        if captures.is_empty() && !segment.exported {
            // As for a pool block (`Allocator::export`): one handed out again
            // in the legacy stream's order may still have its old owner's work running.
            if let Err(e) = driver.with_context(device.context, || device.wait_before_export(driver)).and_then(|r| r) {
                log::warn!("device {ordinal}: waiting for the legacy stream before exporting {ptr:#x} failed: {e:?}");
            }
        }
        device.export_segment(ptr);
        true
    }

    /// The pool of device `ordinal` that serves blocks of `size` bytes, its
    /// context and that context's unique id (a new one after a reset), if the
    /// pool can be shared with other processes.
    pub fn shareable_pool(&self, ordinal: i32, size: u64) -> Option<(Pool, Context, u64)> {
        let device = self.known_device(ordinal)?;
        device.shareable_pool(size).map(|pool| (pool, device.context, device.context_id))
    }
}
