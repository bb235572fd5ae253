//! PreMulSum reduction ops created through `ncclRedOpCreatePreMulSum`.
//!
//! NCCL's op values are opaque and mangled with the communicator, so an op is only meaningful
//! together with its communicator: the table is keyed by both.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::nccl::types::{ncclComm_t, DataTypeCode, RedOpCode};

/// The scalar of a PreMulSum op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// Copied from host memory at creation (`ncclScalarHostImmediate`): the element's bytes,
    /// little-endian, in the first `len` bytes.
    Host { bytes: [u8; 8], len: usize },
    /// In device memory, read when the collective runs (`ncclScalarDevice`): its address.
    Device { address: usize },
}

/// One PreMulSum op: `sum_r(scalar * x_r)` for its element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreMulSum {
    pub datatype: DataTypeCode,
    pub scalar: Scalar,
}

/// PreMulSum ops by (communicator, op value).
#[derive(Default)]
pub struct RedOpTable {
    ops: Mutex<HashMap<(usize, i32), PreMulSum>>,
}

impl RedOpTable {
    /// Records an op the real NCCL created.
    pub fn insert(&self, comm: ncclComm_t, op: RedOpCode, premul: PreMulSum) {
        self.ops.lock().insert((comm as usize, op.0), premul);
    }

    /// The op, if it was created on `comm` through us and not destroyed.
    pub fn get(&self, comm: ncclComm_t, op: RedOpCode) -> Option<PreMulSum> {
        self.ops.lock().get(&(comm as usize, op.0)).copied()
    }

    /// Forgets one op (after `ncclRedOpDestroy`).
    pub fn remove(&self, comm: ncclComm_t, op: RedOpCode) {
        self.ops.lock().remove(&(comm as usize, op.0));
    }

    /// Forgets every op of a communicator (after it is destroyed or aborted).
    pub fn remove_comm(&self, comm: ncclComm_t) {
        self.ops.lock().retain(|(c, _), _| *c != comm as usize);
    }

    /// Number of live ops on `comm`.
    pub fn count(&self, comm: ncclComm_t) -> usize {
        self.ops
            .lock()
            .keys()
            .filter(|(c, _)| *c == comm as usize)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_belong_to_their_communicator() {
        let table = RedOpTable::default();
        let (a, b) = (0x10 as ncclComm_t, 0x20 as ncclComm_t);
        let op = PreMulSum {
            datatype: DataTypeCode(7),
            scalar: Scalar::Host {
                bytes: [0, 0, 0, 0x3f, 0, 0, 0, 0],
                len: 4,
            },
        };
        table.insert(a, RedOpCode(5), op);
        table.insert(b, RedOpCode(5), op);
        assert_eq!(table.get(a, RedOpCode(5)), Some(op));
        table.remove(a, RedOpCode(5));
        assert_eq!(table.get(a, RedOpCode(5)), None);
        assert_eq!(table.get(b, RedOpCode(5)), Some(op));
        table.insert(b, RedOpCode(6), op);
        table.remove_comm(b);
        assert_eq!(table.count(b), 0);
    }
}
