//! The pools the allocator has set up, one slot per device ordinal: not yet
//! seen, not poolable (and why), or its pool. The devices' pools and the
//! pinned host memory pools each have a table.

use std::sync::Arc;

use super::device::pool::Device;
use super::locks::{read, write, ReadMostly};
use super::passthrough::Passthrough;

/// One pool per device ordinal (a device's, or its pinned host memory pool).
#[derive(Default)]
pub struct PoolSlots(ReadMostly<Vec<PoolSlot>>);

#[derive(Clone, Default)]
pub enum PoolSlot {
    /// Not set up yet.
    #[default]
    Unseen,
    /// Cannot be pooled: its allocations pass through for this reason.
    Unpooled(Passthrough),
    Pooled(Arc<Device>),
}

impl PoolSlot {
    pub fn pool(&self) -> Option<Arc<Device>> {
        match self {
            PoolSlot::Pooled(pool) => Some(Arc::clone(pool)),
            _ => None,
        }
    }
}

impl PoolSlots {
    /// The pool of `ordinal`, if it has one.
    pub fn pool(&self, ordinal: i32) -> Option<Arc<Device>> {
        read(&self.0).get(usize::try_from(ordinal).ok()?)?.pool()
    }

    /// The pool of `ordinal`, looked up after `first` has run with the table
    /// held for reading (no pool is set up meanwhile).
    pub fn pool_after(&self, ordinal: i32, first: impl FnOnce()) -> Option<Arc<Device>> {
        let slots = read(&self.0);
        first();
        slots.get(usize::try_from(ordinal).ok()?)?.pool()
    }

    /// Every pool set up.
    pub fn pools(&self) -> Vec<Arc<Device>> {
        read(&self.0).iter().filter_map(PoolSlot::pool).collect()
    }

    /// The first pool that is `wanted` (on the allocation path: no copy of the list).
    pub fn find(&self, wanted: impl Fn(&Device) -> bool) -> Option<Arc<Device>> {
        read(&self.0).iter().find_map(|slot| match slot {
            PoolSlot::Pooled(pool) if wanted(pool) => Some(Arc::clone(pool)),
            _ => None,
        })
    }

    /// The slot at `index`, set up by `set_up` (under the write lock, so once)
    /// if it is not yet.
    pub fn set_up_once(&self, index: usize, set_up: impl FnOnce() -> PoolSlot) -> PoolSlot {
        let known = read(&self.0).get(index).cloned().unwrap_or_default();
        if !matches!(known, PoolSlot::Unseen) {
            return known;
        }
        let mut slots = write(&self.0);
        if slots.len() <= index {
            slots.resize(index + 1, PoolSlot::Unseen);
        }
        if let PoolSlot::Unseen = slots[index] {
            slots[index] = set_up();
        }
        slots[index].clone()
    }

    /// Forgets the pool of `ordinal`, returning it.
    pub fn take(&self, ordinal: i32) -> Option<Arc<Device>> {
        let mut slots = write(&self.0);
        let slot = usize::try_from(ordinal).ok().and_then(|i| slots.get_mut(i))?;
        std::mem::take(slot).pool()
    }
}
