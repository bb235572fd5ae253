//! PreMulSum ops: forwarded, and remembered per communicator until destroyed.

#![allow(non_snake_case)]

use std::os::raw::c_void;
use std::sync::atomic::AtomicBool;

use super::guard::{check_live, guard, reject_null};
use crate::forward;
use crate::nccl::reentry::{calling_real, tracking};
use crate::nccl::types::*;
use crate::registry::{self, PreMulSum, Scalar};

/// Bytes of one element of `datatype`, for the NCCL types we know.
pub fn element_size(datatype: DataTypeCode) -> Option<usize> {
    match datatype.0 {
        0 | 1 | 10 | 11 => Some(1),
        6 | 9 => Some(2),
        2 | 3 | 7 => Some(4),
        4 | 5 | 8 => Some(8),
        _ => None,
    }
}

/// The scalar as we keep it, or `None` for a residence or type we do not know.
///
/// # Safety
/// For `ncclScalarHostImmediate`, `scalar` points to one readable element of `datatype`.
unsafe fn capture_scalar(
    scalar: *mut c_void,
    datatype: DataTypeCode,
    residence: ScalarResidenceCode,
) -> Option<Scalar> {
    match residence.0 {
        0 => Some(Scalar::Device {
            address: scalar as usize,
        }),
        1 => {
            let len = element_size(datatype)?;
            let mut bytes = [0u8; 8];
            // SAFETY: the caller guarantees one readable element of `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(scalar as *const u8, bytes.as_mut_ptr(), len) };
            Some(Scalar::Host { bytes, len })
        }
        _ => None,
    }
}

/// Creates a PreMulSum op (forwarded) and remembers its scalar, type and residence.
#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut RedOpCode,
    scalar: *mut c_void,
    datatype: DataTypeCode,
    residence: ScalarResidenceCode,
    comm: ncclComm_t,
) -> ResultCode {
    guard("ncclRedOpCreatePreMulSum", || {
        static LIVE_WARNED: AtomicBool = AtomicBool::new(false);
        if let Err(code) = check_live(comm, &LIVE_WARNED, "ncclRedOpCreatePreMulSum") {
            return code;
        }
        if comm.is_null() {
            // NCCL dereferences it (ncclCommSplit(NULL, ...) crashes in 2.32).
            static NULL_WARNED: AtomicBool = AtomicBool::new(false);
            return reject_null(&NULL_WARNED, "ncclRedOpCreatePreMulSum", "comm");
        }
        if !tracking() {
            return forward!(ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm); outputs op);
        }
        let rc: ResultCode = calling_real(
            || forward!(ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm); outputs op),
        );
        if rc.is_success() && !scalar.is_null() {
            // SAFETY: NCCL accepted the op, so `scalar` held one element of `datatype`, and it
            // wrote the new op through the non-NULL `op`.
            let (captured, created) = unsafe { (capture_scalar(scalar, datatype, residence), *op) };
            if let Some(scalar) = captured {
                registry::comms().insert_redop(comm, created, PreMulSum { datatype, scalar });
            }
        }
        rc
    })
}

/// Destroys a PreMulSum op (forwarded) and forgets it.
#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: RedOpCode, comm: ncclComm_t) -> ResultCode {
    guard("ncclRedOpDestroy", || {
        static LIVE_WARNED: AtomicBool = AtomicBool::new(false);
        if let Err(code) = check_live(comm, &LIVE_WARNED, "ncclRedOpDestroy") {
            return code;
        }
        if comm.is_null() {
            // NCCL dereferences it (ncclCommSplit(NULL, ...) crashes in 2.32).
            static NULL_WARNED: AtomicBool = AtomicBool::new(false);
            return reject_null(&NULL_WARNED, "ncclRedOpDestroy", "comm");
        }
        if !tracking() {
            return forward!(ncclRedOpDestroy(op, comm));
        }
        let rc: ResultCode = calling_real(|| forward!(ncclRedOpDestroy(op, comm)));
        if rc.is_success() {
            registry::comms().remove_redop(comm, op);
        }
        rc
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_sizes() {
        assert_eq!(element_size(DataTypeCode(7)), Some(4));
        assert_eq!(element_size(DataTypeCode(9)), Some(2));
        assert_eq!(element_size(DataTypeCode(8)), Some(8));
        assert_eq!(element_size(DataTypeCode(12)), None);
        assert_eq!(element_size(DataTypeCode(-1)), None);
    }

    #[test]
    fn host_scalars_are_copied_and_device_ones_kept_by_address() {
        let mut half: f64 = 0.5;
        let p = (&mut half) as *mut f64 as *mut c_void;
        // SAFETY: `p` points to one f64.
        let host = unsafe { capture_scalar(p, DataTypeCode(8), ScalarResidenceCode(1)) };
        assert_eq!(
            host,
            Some(Scalar::Host {
                bytes: 0.5f64.to_le_bytes(),
                len: 8
            })
        );
        // SAFETY: device residence does not read through the pointer.
        let device = unsafe { capture_scalar(p, DataTypeCode(8), ScalarResidenceCode(0)) };
        assert_eq!(
            device,
            Some(Scalar::Device {
                address: p as usize
            })
        );
        // SAFETY: an unknown residence does not read through the pointer.
        let unknown = unsafe { capture_scalar(p, DataTypeCode(8), ScalarResidenceCode(9)) };
        assert_eq!(unknown, None);
    }
}
