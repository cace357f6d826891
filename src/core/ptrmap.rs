//! Which device pointers the shim handed out, and from which device. No FFI here.
//!
//! A pointer enters the map when the pool gives it out. The program's free
//! marks it *pending*: the block is still allocated in the pool until the
//! work issued before the free has finished (and while the shim keeps it for
//! reuse), so a second free of it must be refused here (the real free would
//! release it). It is live again when the shim hands it out again, and leaves
//! the map when it goes back to the pool, when the program frees it with
//! `cudaFreeAsync`, or when its device is reset. Anything not in the map
//! belongs to the real allocator.

use std::collections::BTreeMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use super::locks::lock;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

/// One allocation served by a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub device: i32,
    pub size: u64,
    /// The return address of the allocation call (0 where unknown).
    pub caller: usize,
    pub memory: Memory,
}

/// Which pool a block came from: the device's, or the pinned host memory pool
/// kept beside it (freed only by `cudaFreeHost`/`cuMemFreeHost`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    Device,
    /// `flags`: what `cudaHostGetFlags` answers for the block, as it would
    /// for the real allocation.
    Host { flags: u32 },
}

impl Memory {
    pub fn is_host(self) -> bool {
        matches!(self, Memory::Host { .. })
    }

    pub fn kind(self) -> MemoryKind {
        match self {
            Memory::Device => MemoryKind::Device,
            Memory::Host { .. } => MemoryKind::Host,
        }
    }
}

/// Which free a block takes: `cudaFree` (device) or `cudaFreeHost` (host).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    Device,
    Host,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    block: Block,
    pending: bool,
    /// Exported through CUDA IPC: its free must ask the export table first.
    shared: bool,
}

/// What a free of a pointer finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// A live block of the pool's, now the caller's to free.
    Live(Block),
    /// A live block exported through CUDA IPC, now pending: the export
    /// table decides whether it is freed or held for its importers.
    Shared(Block),
    /// Already freed, not yet back in the pool: a double free.
    Pending,
    /// Not the pool's.
    Unknown,
    /// A block of the other pool (a device free of pinned host memory, or
    /// the reverse): the real free refuses such a pointer.
    OtherMemory,
}

#[derive(Default)]
pub struct PointerMap {
    slots: DashMap<u64, Slot, BuildHasherDefault<AddressHasher>>,
    /// Start -> size of the live pinned host blocks, for queries about an
    /// address inside one (`cudaHostGetDevicePointer(p + 100)`); host
    /// allocations are rare enough for one lock.
    host_ranges: Mutex<BTreeMap<u64, u64>>,
}

/// Device addresses are distinct, aligned integers: one multiplication
/// spreads them well, at a fraction of SipHash's cost on the hot path.
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl PointerMap {
    /// Records a pointer the pool just gave out. A pointer already present
    /// means the map went stale; the new block wins and the old one is returned.
    pub fn insert(&self, ptr: u64, block: Block) -> Option<Block> {
        self.note_host_range(ptr, block);
        self.slots.insert(ptr, Slot { block, pending: false, shared: false }).map(|old| old.block)
    }

    fn note_host_range(&self, ptr: u64, block: Block) {
        if block.memory.is_host() {
            lock(&self.host_ranges).insert(ptr, block.size);
        }
    }

    /// The live pinned host block holding `ptr` (at its start or inside it).
    pub fn host_block_holding(&self, ptr: u64) -> Option<Block> {
        let start = {
            let ranges = lock(&self.host_ranges);
            let (&start, &size) = ranges.range(..=ptr).next_back()?;
            (ptr - start < size).then_some(start)?
        };
        self.live_block(start).filter(|block| block.memory.is_host())
    }

    /// A pending block is handed out again (from the cache).
    /// False if `ptr` was not pending: the map was stale, and now has `block`.
    pub fn reissue(&self, ptr: u64, block: Block) -> bool {
        self.note_host_range(ptr, block);
        let old = self.slots.insert(ptr, Slot { block, pending: false, shared: false });
        old.is_some_and(|slot| slot.pending)
    }

    /// `cudaFree` (or, for `MemoryKind::Host`, `cudaFreeHost`): a live block
    /// becomes pending until it is back in the pool. (The host ranges' lock
    /// is taken under the block's shard: it is a leaf, never held while a
    /// shard is taken.)
    pub fn claim_for_free(&self, ptr: u64, kind: MemoryKind) -> Claim {
        match self.slots.get_mut(&ptr) {
            None => Claim::Unknown,
            Some(slot) if slot.block.memory.kind() != kind => Claim::OtherMemory,
            Some(slot) if slot.pending => Claim::Pending,
            Some(mut slot) => {
                slot.pending = true;
                if slot.block.memory.is_host() {
                    lock(&self.host_ranges).remove(&ptr);
                }
                if slot.shared {
                    Claim::Shared(slot.block)
                } else {
                    Claim::Live(slot.block)
                }
            }
        }
    }

    /// The pending block at `ptr` goes back to the pool. Called before the
    /// pool has it: from then on the pool may hand the address to another
    /// thread, whose allocation must find it gone.
    pub fn returned(&self, ptr: u64) {
        self.slots.remove_if(&ptr, |_, slot| slot.pending);
    }

    /// `cudaFreeAsync`: the program frees a live block itself; it leaves the map.
    pub fn claim_for_free_async(&self, ptr: u64) -> Claim {
        match self.slots.entry(ptr) {
            Entry::Vacant(_) => Claim::Unknown,
            Entry::Occupied(slot) if slot.get().block.memory.is_host() => Claim::OtherMemory,
            Entry::Occupied(slot) if slot.get().pending => Claim::Pending,
            Entry::Occupied(mut slot) if slot.get().shared => {
                // Stays, pending, until the export table has decided.
                slot.get_mut().pending = true;
                Claim::Shared(slot.get().block)
            }
            Entry::Occupied(slot) => Claim::Live(slot.remove().block),
        }
    }

    /// The block at `ptr`, if it is a live one of the pool's.
    pub fn live_block(&self, ptr: u64) -> Option<Block> {
        self.slots.get(&ptr).filter(|slot| !slot.pending).map(|slot| slot.block)
    }

    /// Marks the live block at `ptr` as exported through CUDA IPC. Returns
    /// the block and whether it was marked before (by an earlier export of
    /// this allocation), or None if `ptr` is not a live block.
    pub fn share(&self, ptr: u64) -> Option<(Block, bool)> {
        let mut slot = self.slots.get_mut(&ptr).filter(|slot| !slot.pending)?;
        let before = std::mem::replace(&mut slot.shared, true);
        Some((slot.block, before))
    }

    /// The live block at `ptr`, if it is one exported through CUDA IPC.
    pub fn live_shared_block(&self, ptr: u64) -> Option<Block> {
        self.slots.get(&ptr).filter(|slot| !slot.pending && slot.shared).map(|slot| slot.block)
    }

    #[cfg(test)]
    fn is_live(&self, ptr: u64) -> bool {
        self.live_block(ptr).is_some()
    }

    /// Every live block (handed out, not freed), by address.
    pub fn live_blocks(&self) -> Vec<(u64, Block)> {
        let mut live: Vec<(u64, Block)> =
            self.slots.iter().filter(|slot| !slot.pending).map(|slot| (*slot.key(), slot.block)).collect();
        live.sort_unstable_by_key(|&(ptr, _)| ptr);
        live
    }

    /// Removes every pointer of `device` (it is being reset); returns the
    /// live ones, which the program never freed.
    pub fn take_device(&self, device: i32) -> Vec<(u64, Block)> {
        let mut live = Vec::new();
        self.slots.retain(|&ptr, slot| {
            if slot.block.device != device {
                return true;
            }
            if !slot.pending {
                live.push((ptr, slot.block));
            }
            false
        });
        lock(&self.host_ranges).retain(|ptr, _| !live.iter().any(|(p, _)| p == ptr));
        live
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    const B: Block = Block { device: 0, size: 256, caller: 0, memory: Memory::Device };

    #[test]
    fn a_free_of_the_other_memory_claims_nothing() {
        let map = PointerMap::default();
        let host = Block { memory: Memory::Host { flags: 2 }, ..B };
        map.insert(0x1000, host);
        map.insert(0x2000, B);
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Device), Claim::OtherMemory);
        assert_eq!(map.claim_for_free_async(0x1000), Claim::OtherMemory);
        assert_eq!(map.claim_for_free(0x2000, MemoryKind::Host), Claim::OtherMemory);
        assert_eq!(map.live_block(0x1000), Some(host), "still the program's");
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Host), Claim::Live(host));
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Host), Claim::Pending);
    }

    #[test]
    fn a_host_block_is_found_from_inside_while_live() {
        let map = PointerMap::default();
        let host = Block { memory: Memory::Host { flags: 2 }, size: 4096, ..B };
        map.insert(0x10000, host);
        map.insert(0x20000, Block { size: 4096, ..B });
        assert_eq!(map.host_block_holding(0x10000), Some(host));
        assert_eq!(map.host_block_holding(0x10fff), Some(host));
        assert_eq!(map.host_block_holding(0x11000), None, "past its end");
        assert_eq!(map.host_block_holding(0xffff), None);
        assert_eq!(map.host_block_holding(0x20010), None, "device memory");
        map.claim_for_free(0x10000, MemoryKind::Host);
        assert_eq!(map.host_block_holding(0x10010), None, "freed");
        map.reissue(0x10000, host);
        assert_eq!(map.host_block_holding(0x10010), Some(host), "handed out again");
    }

    #[test]
    fn a_freed_block_is_pending_until_returned() {
        let map = PointerMap::default();
        assert_eq!(map.insert(0x1000, B), None);
        assert!(map.is_live(0x1000));
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Device), Claim::Live(B));
        assert!(!map.is_live(0x1000));
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Device), Claim::Pending, "a double free while pending");
        assert_eq!(map.claim_for_free_async(0x1000), Claim::Pending);
        map.returned(0x1000);
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Device), Claim::Unknown, "back in the pool: the real free decides");
        assert_eq!(map.len(), 0);
    }

    #[test]
    fn a_pending_block_can_be_handed_out_again_and_a_live_one_cannot() {
        let map = PointerMap::default();
        map.insert(0x1000, B);
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Device), Claim::Live(B));
        assert!(map.reissue(0x1000, B), "pending: handed out again");
        assert!(map.is_live(0x1000));
        assert!(!map.reissue(0x1000, B), "live: the map was stale");
        assert!(!map.reissue(0x2000, B), "unknown: the map was stale");
    }

    #[test]
    fn returning_a_live_block_is_ignored() {
        let map = PointerMap::default();
        map.insert(0x1000, B);
        map.returned(0x1000);
        assert!(map.is_live(0x1000), "only pending blocks leave on return");
    }

    #[test]
    fn free_async_removes_a_live_block() {
        let map = PointerMap::default();
        map.insert(0x1000, B);
        assert_eq!(map.claim_for_free_async(0x1000), Claim::Live(B));
        assert_eq!(map.claim_for_free_async(0x1000), Claim::Unknown);
        assert_eq!(map.len(), 0);
    }

    #[test]
    fn a_shared_block_is_claimed_as_shared_and_stays_pending() {
        let map = PointerMap::default();
        map.insert(0x1000, B);
        assert_eq!(map.live_shared_block(0x1000), None);
        assert_eq!(map.share(0x1000), Some((B, false)));
        assert_eq!(map.share(0x1000), Some((B, true)), "a second export finds it shared");
        assert_eq!(map.live_shared_block(0x1000), Some(B));
        assert_eq!(map.claim_for_free_async(0x1000), Claim::Shared(B));
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Device), Claim::Pending, "held: a double free");
        assert_eq!(map.share(0x1000), None, "a pending block cannot be exported");
        map.returned(0x1000);
        map.insert(0x1000, B);
        assert_eq!(map.live_shared_block(0x1000), None, "a new block at the address is not shared");
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Device), Claim::Live(B));
    }

    #[test]
    fn interior_pointers_are_unknown() {
        let map = PointerMap::default();
        map.insert(0x1000, Block { device: 0, size: 4096, caller: 0, memory: Memory::Device });
        assert!(!map.is_live(0x1100));
        assert_eq!(map.claim_for_free(0x1100, MemoryKind::Device), Claim::Unknown);
        assert_eq!(map.len(), 1);
    }

    #[test]
    fn reinserting_a_pointer_reports_the_stale_block() {
        let map = PointerMap::default();
        map.insert(0x1000, Block { device: 0, size: 1, caller: 0, memory: Memory::Device });
        assert_eq!(map.insert(0x1000, Block { device: 1, size: 2, caller: 0, memory: Memory::Device }), Some(Block { device: 0, size: 1, caller: 0, memory: Memory::Device }));
        assert_eq!(map.claim_for_free(0x1000, MemoryKind::Device), Claim::Live(Block { device: 1, size: 2, caller: 0, memory: Memory::Device }));
    }

    #[test]
    fn reset_takes_only_that_device_and_reports_live_blocks() {
        let map = PointerMap::default();
        for i in 0..10u64 {
            map.insert(0x1000 * (i + 1), Block { device: (i % 2) as i32, size: 8, caller: 0, memory: Memory::Device });
        }
        assert_eq!(map.claim_for_free(0x2000, MemoryKind::Device), Claim::Live(Block { device: 1, size: 8, caller: 0, memory: Memory::Device }));
        let live = map.take_device(1);
        assert_eq!(live.len(), 4, "the pending one is not reported live");
        assert!(live.iter().all(|(_, b)| b.device == 1));
        assert_eq!(map.len(), 5);
        assert!(map.is_live(0x1000));
        assert_eq!(map.claim_for_free(0x2000, MemoryKind::Device), Claim::Unknown);
    }

    #[test]
    fn aligned_addresses_spread_over_the_hash_space() {
        use std::hash::BuildHasher;
        let hasher = BuildHasherDefault::<AddressHasher>::default();
        let buckets: std::collections::HashSet<u64> =
            (0..64u64).map(|i| hasher.hash_one(0x7f00_0000_0000 + (i << 21)) >> 58).collect();
        assert!(buckets.len() > 32, "2 MiB-aligned addresses land in {} of 64 top-bit buckets", buckets.len());
    }

    #[test]
    fn concurrent_threads_lose_nothing() {
        let map = Arc::new(PointerMap::default());
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let map = Arc::clone(&map);
                thread::spawn(move || {
                    for i in 0..10_000u64 {
                        let ptr = (t << 40) | (i << 8);
                        let block = Block { device: 0, size: i, caller: 0, memory: Memory::Device };
                        assert_eq!(map.insert(ptr, block), None);
                        if i % 2 == 0 {
                            assert_eq!(map.claim_for_free(ptr, MemoryKind::Device), Claim::Live(block));
                            map.returned(ptr);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(map.len(), 8 * 5_000);
    }
}
