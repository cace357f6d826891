//! Pool blocks shared with other processes through CUDA IPC. No FFI here.
//!
//! `cudaIpcGetMemHandle` on a pool block gives a handle of the shim's own
//! format ([`IpcHandle`]): it names the exporting process's IPC endpoint, the
//! block's address, and a secret drawn for the export. An importer that
//! presents it gets a *lease* on the block (its connection to the exporter);
//! a block the program frees while leased is held back from reuse until the
//! last lease ends, since the importers still map it.

use std::collections::HashMap;
use std::sync::Mutex;

use super::locks::lock;
use super::ptrmap::{Block, PointerMap};

/// The unguessable part of a handle.
pub type Secret = [u8; 32];

/// The first bytes of every handle of the shim's: not a valid handle of the
/// real driver's (measured: the real `cuIpcOpenMemHandle` refuses such bytes
/// with `CUDA_ERROR_INVALID_VALUE`).
const MAGIC: [u8; 8] = *b"SOMASHIM";
const VERSION: u32 = 1;

/// The 64 bytes of `cudaIpcMemHandle_t`, as the shim fills them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcHandle {
    /// The exporting process.
    pub pid: u32,
    /// The exporter's endpoint, drawn when its IPC server started.
    pub endpoint: u64,
    /// The exported allocation's base address, in the exporter.
    pub base: u64,
    pub secret: Secret,
}

impl IpcHandle {
    pub fn encode(&self) -> [u8; 64] {
        let mut bytes = [0u8; 64];
        bytes[0..8].copy_from_slice(&MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.pid.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.endpoint.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.base.to_le_bytes());
        bytes[32..64].copy_from_slice(&self.secret);
        bytes
    }

    /// The handle, if `bytes` are one of the shim's (any other bytes are
    /// the real driver's to judge).
    pub fn decode(bytes: &[u8; 64]) -> Option<IpcHandle> {
        if bytes[0..8] != MAGIC || u32::from_le_bytes(bytes[8..12].try_into().ok()?) != VERSION {
            return None;
        }
        Some(IpcHandle {
            pid: u32::from_le_bytes(bytes[12..16].try_into().ok()?),
            endpoint: u64::from_le_bytes(bytes[16..24].try_into().ok()?),
            base: u64::from_le_bytes(bytes[24..32].try_into().ok()?),
            secret: bytes[32..64].try_into().ok()?,
        })
    }
}

/// The blocks this process shares through CUDA IPC, by base address.
#[derive(Default)]
pub struct SharedBlocks {
    table: Mutex<HashMap<u64, SharedBlock>>,
}

struct SharedBlock {
    secret: Secret,
    /// The device whose pool holds the block: a reset of it ends the export.
    device: i32,
    /// The id of the device's context at the export: the server exports
    /// the block only from a pool of that context, never one made since.
    context_id: u64,
    leases: u32,
    /// Freed by the program while leased: freed for real after the last lease.
    held: Option<Block>,
}

impl SharedBlocks {
    /// Exports the live block at `base`: the secret of its handle (the same
    /// for every export of one allocation, as the real handle is), and the
    /// block; None if `base` is not a live block of the pool's.
    pub fn export(&self, map: &PointerMap, base: u64, context_id: u64, new_secret: impl FnOnce() -> Option<Secret>) -> Option<(Secret, Block)> {
        let mut table = lock(&self.table);
        let (block, shared_before) = map.share(base)?;
        let secret = match table.get(&base) {
            Some(export) if shared_before => export.secret,
            // A new allocation at this address: a handle of an earlier one must not open it.
            // (Without a secret it stays marked shared and unexported: a later export draws one.)
            _ => {
                let secret = new_secret()?;
                table.insert(base, SharedBlock { secret, device: block.device, context_id, leases: 0, held: None });
                secret
            }
        };
        Some((secret, block))
    }

    /// An importer presents `secret` for `base`: a lease on the block if it
    /// is the live allocation that export named, and the id of the context
    /// it was exported in.
    pub fn lease(&self, map: &PointerMap, base: u64, secret: &Secret) -> Option<(Block, u64)> {
        let mut table = lock(&self.table);
        let export = table.get_mut(&base).filter(|export| export.held.is_none() && same_secret(&export.secret, secret))?;
        // Checked under the table's lock: a free marks the block pending
        // before it takes the lock, so it either sees this lease or it is seen.
        let block = map.live_shared_block(base)?;
        export.leases += 1;
        Some((block, export.context_id))
    }

    /// The program freed the exported block at `base` (pending in the map):
    /// true if importers hold it, and it is kept out of the pool until the
    /// last lease ends; false if it may be freed now (the export is over).
    pub fn freed(&self, base: u64, block: Block) -> bool {
        let mut table = lock(&self.table);
        match table.get_mut(&base) {
            Some(export) if export.leases > 0 => {
                export.held = Some(block);
                true
            }
            _ => {
                table.remove(&base);
                false
            }
        }
    }

    /// A lease on `base` under `secret` ended: the block to free now, if
    /// the program freed it while leased and this was its last lease. A
    /// lease of an earlier export at the address (gone with a device reset)
    /// touches nothing: a new export there has another secret.
    pub fn lease_ended(&self, base: u64, secret: &Secret) -> Option<Block> {
        let mut table = lock(&self.table);
        let export = table.get_mut(&base).filter(|export| same_secret(&export.secret, secret))?;
        export.leases = export.leases.saturating_sub(1);
        if export.leases > 0 || export.held.is_none() {
            return None;
        }
        table.remove(&base).and_then(|export| export.held)
    }
}

impl SharedBlocks {
    /// Device `ordinal` is reset: its blocks, held ones included, went with
    /// its pool, and their addresses may be handed out again by a new one.
    pub fn forget_device(&self, ordinal: i32) {
        lock(&self.table).retain(|_, export| export.device != ordinal);
    }
}

/// Whether two secrets are equal, in a time that does not depend on where
/// they differ (an early exit would tell a guesser how many bytes it got).
fn same_secret(a: &Secret, b: &Secret) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Block = Block { device: 0, size: 4096, caller: 0, memory: crate::core::ptrmap::Memory::Device };

    #[test]
    fn a_handle_survives_its_bytes_and_other_bytes_are_not_one() {
        let handle = IpcHandle { pid: 42, endpoint: 0x0123_4567_89ab_cdef, base: 0x7f00_0000_0000, secret: [7; 32] };
        let bytes = handle.encode();
        assert_eq!(IpcHandle::decode(&bytes), Some(handle));
        assert_eq!(IpcHandle::decode(&[0; 64]), None);
        let mut other_version = bytes;
        other_version[8] = 2;
        assert_eq!(IpcHandle::decode(&other_version), None);
    }

    #[test]
    fn handles_of_one_allocation_share_a_secret_and_a_new_allocation_gets_another() {
        let (map, shared) = (PointerMap::default(), SharedBlocks::default());
        map.insert(0x1000, B);
        let (first, _) = shared.export(&map, 0x1000, 1, || Some([1; 32])).unwrap();
        let (again, _) = shared.export(&map, 0x1000, 1, || Some([2; 32])).unwrap();
        assert_eq!((first, again), ([1; 32], [1; 32]));
        assert!(!shared.freed(0x1000, B), "no lease: freed at once");
        map.returned(0x1000);
        map.insert(0x1000, B);
        assert_eq!(shared.lease(&map, 0x1000, &[1; 32]), None, "a stale handle opens nothing");
        let (new, _) = shared.export(&map, 0x1000, 1, || Some([3; 32])).unwrap();
        assert_eq!(new, [3; 32]);
        assert_eq!(shared.export(&map, 0x2000, 1, || Some([4; 32])), None, "not a pool block");
    }

    #[test]
    fn a_leased_block_is_held_until_its_last_lease_ends() {
        let (map, shared) = (PointerMap::default(), SharedBlocks::default());
        map.insert(0x1000, B);
        let (secret, _) = shared.export(&map, 0x1000, 1, || Some([9; 32])).unwrap();
        assert_eq!(shared.lease(&map, 0x1000, &[8; 32]), None, "a forged secret");
        let mut last_byte_wrong = [9; 32];
        last_byte_wrong[31] = 8;
        assert_eq!(shared.lease(&map, 0x1000, &last_byte_wrong), None, "one byte off");
        assert_eq!(shared.lease(&map, 0x1000, &secret), Some((B, 1)));
        assert_eq!(shared.lease(&map, 0x1000, &secret), Some((B, 1)));
        assert_eq!(shared.lease_ended(0x1000, &secret), None, "not freed: nothing to do");
        assert_eq!(map.claim_for_free(0x1000, crate::core::ptrmap::MemoryKind::Device), crate::core::ptrmap::Claim::Shared(B));
        assert!(shared.freed(0x1000, B), "leased: held");
        assert_eq!(shared.lease(&map, 0x1000, &secret), None, "freed: no new lease");
        assert_eq!(shared.lease_ended(0x1000, &secret), Some(B), "the last lease frees it");
        assert_eq!(shared.lease_ended(0x1000, &secret), None);
    }

    #[test]
    fn a_reset_ends_the_device_sharing_and_their_old_leases_touch_no_new_one() {
        let (map, shared) = (PointerMap::default(), SharedBlocks::default());
        map.insert(0x1000, B);
        let (old, _) = shared.export(&map, 0x1000, 1, || Some([1; 32])).unwrap();
        assert_eq!(shared.lease(&map, 0x1000, &old), Some((B, 1)));
        assert_eq!(map.claim_for_free(0x1000, crate::core::ptrmap::MemoryKind::Device), crate::core::ptrmap::Claim::Shared(B));
        assert!(shared.freed(0x1000, B), "leased: held");
        shared.forget_device(0);
        map.take_device(0);
        map.insert(0x1000, B); // the new pool hands the address out again
        assert_eq!(shared.lease_ended(0x1000, &old), None, "the held block went with the reset");
        let (new, _) = shared.export(&map, 0x1000, 2, || Some([2; 32])).unwrap();
        assert_eq!(shared.lease(&map, 0x1000, &new), Some((B, 2)), "the new context's export");
        assert_eq!(shared.lease_ended(0x1000, &old), None, "an old lease");
        assert_eq!(map.claim_for_free(0x1000, crate::core::ptrmap::MemoryKind::Device), crate::core::ptrmap::Claim::Shared(B));
        assert!(shared.freed(0x1000, B), "the new lease still holds it");
    }
}
