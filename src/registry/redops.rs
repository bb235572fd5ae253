//! PreMulSum reduction ops created through `ncclRedOpCreatePreMulSum`.
//!
//! NCCL's op values are opaque and mangled with the communicator, so an op is only meaningful
//! together with its communicator: each communicator's record keeps its own (`super::comms`).

use crate::nccl::types::DataTypeCode;

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
