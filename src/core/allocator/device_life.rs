//! A device's life: its pools set up on first use, forgotten at a reset,
//! peer access granted to them, and a forked child's own reports.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::state::Allocator;
use crate::core::device::pool::Device;
use crate::core::locks::{lock, write};
use crate::core::passthrough::Passthrough;
use crate::core::pool_slots::PoolSlot;
use crate::core::ptrmap::{Block, MemoryKind};
use crate::cuda::gpu::{Context, Gpu};

/// What the shim had of a device it forgets (a reset): its pools, and the
/// blocks of each never returned to it.
struct Forgotten {
    device: Arc<Device>,
    host: Option<Arc<Device>>,
    device_blocks: Vec<u64>,
    host_blocks: Vec<u64>,
}

impl Forgotten {
    /// Each pool with its blocks.
    fn pools(&self) -> impl Iterator<Item = (&Arc<Device>, &[u64])> {
        let host = self.host.as_ref().map(|host| (host, self.host_blocks.as_slice()));
        std::iter::once((&self.device, self.device_blocks.as_slice())).chain(host)
    }
}

impl Allocator {
    /// The pool of the current context's device, set up on first use.
    pub(super) fn device(&self, driver: &impl Gpu, context: Context) -> Result<Arc<Device>, Passthrough> {
        // A pooled context is found without asking the driver for its device.
        let pooled = self.pooled_device_of(context);
        if let Some(device) = pooled.filter(|d| driver.context_id(context).ok() == Some(d.context_id)) {
            return Ok(device);
        }
        let ordinal = driver.current_device().map_err(|_| Passthrough::NoContext)?;
        let index = usize::try_from(ordinal).map_err(|_| Passthrough::NoContext)?;
        match self.devices.set_up_once(index, || self.set_up(driver, ordinal, context)) {
            PoolSlot::Pooled(device) if device.context == context => {
                if driver.context_id(context).ok() == Some(device.context_id) {
                    Ok(device)
                } else {
                    self.abandon_reset_device(driver, ordinal);
                    self.device(driver, context)
                }
            }
            // Set up is left for when the primary context is current.
            PoolSlot::Pooled(_) | PoolSlot::Unseen => Err(Passthrough::ForeignContext),
            PoolSlot::Unpooled(reason) => Err(reason),
        }
    }

    /// Whether the pool of `ordinal` still belongs to the device's current
    /// primary context. A reset by a path the shim does not wrap shows in the
    /// context's ID. `current`: the current context.
    pub(super) fn is_current_incarnation(&self, driver: &impl Gpu, ordinal: i32, current: Option<Context>) -> bool {
        let Some(device) = self.known_device(ordinal) else {
            return true;
        };
        let current = match current {
            Some(current) if current == device.context => current,
            // Another device's context: ask for this device's primary one.
            _ => match driver.active_primary_context(ordinal) {
                Ok(Some(primary)) => primary,
                Ok(None) | Err(_) => return false,
            },
        };
        current == device.context && driver.context_id(current).ok() == Some(device.context_id)
    }

    fn set_up(&self, driver: &impl Gpu, ordinal: i32, context: Context) -> PoolSlot {
        match driver.supports_pools(ordinal) {
            Ok(true) => {}
            Ok(false) => {
                log::info!("device {ordinal} has no memory pool support: its allocations pass through");
                return PoolSlot::Unpooled(Passthrough::NoPoolSupport);
            }
            Err(e) => {
                log::warn!("device {ordinal}: cannot query pool support ({e:?}): passing through");
                return PoolSlot::Unpooled(Passthrough::NoPoolSupport);
            }
        }
        if driver.active_primary_context(ordinal).ok().flatten() != Some(context) {
            // A context of the program's own: set up when the primary one is current.
            log::debug!("device {ordinal}: current context is not the primary one");
            return PoolSlot::Unseen;
        }
        let device = match Device::create(driver, ordinal, context, &self.config, false) {
            Ok(device) => device,
            Err(e) => {
                log::warn!("device {ordinal}: setting up the pool failed ({e:?}): passing through");
                return PoolSlot::Unpooled(Passthrough::NoPoolSupport);
            }
        };
        for &(owner, accessor) in lock(&self.peer_grants).iter() {
            if owner == ordinal {
                if let Err(e) = device.set_peer_access(driver, accessor, true) {
                    log::warn!("device {ordinal}: granting device {accessor} access failed: {e:?}");
                }
            }
        }
        log::debug!("device {ordinal}: pool ready");
        PoolSlot::Pooled(Arc::new(device))
    }

    /// The pinned host memory pool made for `device` (whose context is
    /// current), set up on first use.
    pub(super) fn host_pool(&self, driver: &impl Gpu, device: &Arc<Device>) -> Result<Arc<Device>, Passthrough> {
        let index = usize::try_from(device.ordinal).map_err(|_| Passthrough::NoContext)?;
        match self.hosts.set_up_once(index, || self.set_up_host(driver, device)) {
            PoolSlot::Pooled(host) => Ok(host),
            PoolSlot::Unpooled(reason) => Err(reason),
            PoolSlot::Unseen => Err(Passthrough::NoHostPoolSupport),
        }
    }

    fn set_up_host(&self, driver: &impl Gpu, device: &Device) -> PoolSlot {
        let ordinal = device.ordinal;
        match driver.device_count() {
            Ok(1) => {}
            Ok(_) => {
                log::info!("several devices: pinned host allocations pass through");
                return PoolSlot::Unpooled(Passthrough::SeveralDevices);
            }
            Err(e) => {
                log::warn!("cannot count the devices ({e:?}): pinned host allocations pass through");
                return PoolSlot::Unpooled(Passthrough::NoHostPoolSupport);
            }
        }
        match driver.supports_host_pools(ordinal) {
            Ok(true) => {}
            Ok(false) | Err(_) => {
                log::info!("device {ordinal}: no host memory pools in this driver or device: pinned host allocations pass through");
                return PoolSlot::Unpooled(Passthrough::NoHostPoolSupport);
            }
        }
        match Device::create(driver, ordinal, device.context, &self.config, true) {
            Ok(host) => {
                log::debug!("device {ordinal}: pinned host memory pool ready");
                PoolSlot::Pooled(Arc::new(host))
            }
            Err(e) => {
                log::warn!("device {ordinal}: setting up the host memory pool failed ({e:?}): pinned host allocations pass through");
                PoolSlot::Unpooled(Passthrough::NoHostPoolSupport)
            }
        }
    }

    /// Forgets device `ordinal` before the real reset destroys its memory,
    /// and releases what the shim created there while it still can.
    pub fn device_resetting(&self, driver: &impl Gpu, ordinal: i32) {
        // The reset destroys the context's streams, pooled or not.
        if let Ok(Some(context)) = driver.active_primary_context(ordinal) {
            write(&self.streams).forget_context(context);
        }
        if let Some(forgotten) = self.forget_device(ordinal) {
            let count = forgotten.pools().map(|(_, blocks)| blocks.len()).sum::<usize>();
            let _ = driver.with_context(forgotten.device.context, || {
                for (pool, blocks) in forgotten.pools() {
                    pool.destroy(driver, blocks);
                }
            });
            log::debug!("device {ordinal} reset: released {count} block(s) and the pools");
        }
    }

    /// The device was reset behind the shim's back: its old blocks are
    /// released and the shim starts over with new pools on next use.
    pub(super) fn abandon_reset_device(&self, driver: &impl Gpu, ordinal: i32) {
        if let Some(forgotten) = self.forget_device(ordinal) {
            log::debug!("device {ordinal} was reset by a path the shim does not wrap");
            for (pool, blocks) in forgotten.pools() {
                pool.abandon(driver, blocks);
            }
        }
    }

    /// Forgets everything of device `ordinal` without calling the driver:
    /// its pools and the blocks of each never returned, if it had a pool.
    fn forget_device(&self, ordinal: i32) -> Option<Forgotten> {
        let removed = self.devices.take(ordinal);
        let host = self.hosts.take(ordinal);
        let live = self.map.take_device(ordinal);
        self.shared_blocks.forget_device(ordinal);
        let deferred: Vec<(u64, Block)> = {
            let mut deferred = lock(&self.deferred);
            let (of_device, others) = deferred.drain(..).partition(|(_, block)| block.device == ordinal);
            *deferred = others;
            of_device
        };
        for kind in [MemoryKind::Device, MemoryKind::Host] {
            let bytes = live.iter().filter(|(_, b)| b.memory.kind() == kind).map(|(_, b)| b.size).sum();
            self.stats.no_longer_in_use(ordinal, kind == MemoryKind::Host, bytes);
        }
        for (_, block) in live.iter().filter(|(_, b)| !b.memory.is_host()) {
            self.libraries.freed(block.caller, block.size);
        }
        lock(&self.peer_grants).retain(|&(_, accessor)| accessor != ordinal);
        let device = removed?;
        write(&self.streams).forget_context(device.context);
        log::debug!("device {ordinal}: forgot its pools and {} pointer(s)", live.len() + deferred.len());
        let (host_blocks, device_blocks): (Vec<_>, Vec<_>) =
            live.into_iter().chain(deferred).partition(|(_, block)| block.memory.is_host());
        let addresses = |blocks: Vec<(u64, Block)>| blocks.into_iter().map(|(ptr, _)| ptr).collect();
        Some(Forgotten { device, host, device_blocks: addresses(device_blocks), host_blocks: addresses(host_blocks) })
    }

    /// `accessor` gained (or lost) peer access to `owner`'s memory.
    pub fn peer_access_changed(&self, driver: &impl Gpu, owner: i32, accessor: i32, allowed: bool) {
        // Lock order: devices, then grants (as `set_up`, under the devices' write lock).
        let device = self.devices.pool_after(owner, || {
            let mut grants = lock(&self.peer_grants);
            if allowed {
                grants.insert((owner, accessor));
            } else {
                grants.remove(&(owner, accessor));
            }
        });
        if let Some(device) = device {
            if let Err(e) = device.set_peer_access(driver, accessor, allowed) {
                log::warn!("device {owner}: setting access for device {accessor} failed: {e:?}");
            }
        }
    }

    /// In a forked child, before it goes on: its reports go to files of its own.
    pub fn after_fork(&self) {
        // A thread that was retiring tails did not come along.
        self.retiring_tails.store(false, Ordering::Release);
        let pid = std::process::id();
        self.forked_child.store(pid, Ordering::Relaxed);
        if let Some(trace) = &self.trace {
            trace.forked(pid);
        }
    }
}
