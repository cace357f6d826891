//! Which device pointers the shim handed out, and from which device. No FFI here.
//!
//! A pointer is in the map from the moment the pool gives it out until the
//! program frees it (by `cudaFree` or `cudaFreeAsync`) or the device is reset.
//! Anything not in the map belongs to the real allocator.

use std::hash::{BuildHasherDefault, Hasher};

use dashmap::DashMap;

/// One live allocation served by a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub device: i32,
    pub size: u64,
}

#[derive(Default)]
pub struct PointerMap {
    blocks: DashMap<u64, Block, BuildHasherDefault<AddressHasher>>,
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
        self.blocks.insert(ptr, block)
    }

    /// Takes a pointer out of the map: `Some` exactly when the shim owns it.
    pub fn remove(&self, ptr: u64) -> Option<Block> {
        self.blocks.remove(&ptr).map(|(_, block)| block)
    }

    pub fn contains(&self, ptr: u64) -> bool {
        self.blocks.contains_key(&ptr)
    }

    /// Forgets every pointer of `device` (its memory is gone); returns how many.
    pub fn forget_device(&self, device: i32) -> usize {
        let before = self.blocks.len();
        self.blocks.retain(|_, block| block.device != device);
        before - self.blocks.len()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    #[test]
    fn a_pointer_is_owned_from_insert_to_remove() {
        let map = PointerMap::default();
        assert_eq!(map.insert(0x1000, Block { device: 0, size: 256 }), None);
        assert!(map.contains(0x1000));
        assert_eq!(map.remove(0x1000), Some(Block { device: 0, size: 256 }));
        assert_eq!(map.remove(0x1000), None, "a second free is not the shim's");
        assert!(map.is_empty());
    }

    #[test]
    fn interior_pointers_are_unknown() {
        let map = PointerMap::default();
        map.insert(0x1000, Block { device: 0, size: 4096 });
        assert!(!map.contains(0x1100));
        assert_eq!(map.remove(0x1100), None);
        assert_eq!(map.len(), 1);
    }

    #[test]
    fn reinserting_a_live_pointer_reports_the_stale_block() {
        let map = PointerMap::default();
        map.insert(0x1000, Block { device: 0, size: 1 });
        assert_eq!(map.insert(0x1000, Block { device: 1, size: 2 }), Some(Block { device: 0, size: 1 }));
        assert_eq!(map.remove(0x1000), Some(Block { device: 1, size: 2 }));
    }

    #[test]
    fn reset_forgets_only_that_device() {
        let map = PointerMap::default();
        for i in 0..10u64 {
            map.insert(0x1000 * (i + 1), Block { device: (i % 2) as i32, size: 8 });
        }
        assert_eq!(map.forget_device(1), 5);
        assert_eq!(map.len(), 5);
        assert!(map.contains(0x1000));
        assert!(!map.contains(0x2000));
    }

    #[test]
    fn aligned_addresses_spread_over_the_hash_space() {
        use std::hash::BuildHasher;
        let hasher = BuildHasherDefault::<AddressHasher>::default();
        let shards: std::collections::HashSet<u64> =
            (0..64u64).map(|i| hasher.hash_one(0x7f00_0000_0000 + (i << 21)) >> 58).collect();
        assert!(shards.len() > 32, "2 MiB-aligned addresses land in {} of 64 top-bit buckets", shards.len());
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
                        assert_eq!(map.insert(ptr, Block { device: 0, size: i }), None);
                        if i % 2 == 0 {
                            assert_eq!(map.remove(ptr), Some(Block { device: 0, size: i }));
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
