//! A name for each communicator that every rank of it derives alike, without exchanging
//! anything: a hash of the unique id its ranks were made from, or, for a communicator split
//! from another, of its parent's name, the split's number on the parent and the color. The
//! straggler report matches the ranks' records by it.

use super::comms;
use crate::nccl::types::{ncclComm_t, ncclUniqueId};

/// FNV-1a over `bytes`, continuing from `hash`.
fn fnv(hash: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(hash, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The name of a communicator made from `id` (every rank passes the same bytes).
pub fn of_unique_id(id: &ncclUniqueId) -> u64 {
    fnv(FNV_START, &id.internal.map(|c| c as u8))
}

/// The name of the `split`-th child of a communicator named `parent`, with `color`.
pub fn of_split(parent: u64, split: u64, color: i32) -> u64 {
    let bytes: Vec<u8> = [parent.to_le_bytes(), split.to_le_bytes()]
        .concat()
        .into_iter()
        .chain(color.to_le_bytes())
        .collect();
    fnv(FNV_START ^ 0x5350_4c49_5400, &bytes)
}

/// Names `comm` (once: a later name is ignored).
pub fn name(comm: ncclComm_t, name: u64) {
    if let Some(record) = comms().record(comm) {
        let _ = record.identity.set(name);
    }
}

/// Counts a split of `parent` (every member calls it, whatever color it asks for) and returns
/// the name of its child of `color`, if `parent` has a name.
pub fn next_split(parent: ncclComm_t, color: i32) -> Option<u64> {
    let record = comms().record(parent)?;
    let split = record
        .splits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    record
        .identity
        .get()
        .map(|&name| of_split(name, split, color))
}

/// `comm`'s name, if known.
pub fn of(comm: ncclComm_t) -> Option<u64> {
    comms().record(comm)?.identity.get().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_id_and_the_split() {
        let mut id = ncclUniqueId {
            internal: [0; crate::nccl::types::NCCL_UNIQUE_ID_BYTES],
        };
        let a = of_unique_id(&id);
        id.internal[7] = 1;
        assert_ne!(of_unique_id(&id), a);
        assert_ne!(of_split(a, 0, 1), of_split(a, 1, 1));
        assert_ne!(of_split(a, 0, 1), of_split(a, 0, 2));
        assert_eq!(of_split(a, 3, 1), of_split(a, 3, 1));
    }
}
