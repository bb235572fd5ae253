//! The single interception point of `ncclAllReduce`: checks the call and decides its route.
//!
//! Today every valid call goes to the real NCCL; the StragglAR engines plug in here.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::nccl::types::{ncclComm_t, DataTypeCode, RedOpCode, ResultCode};

/// Largest `ncclDataType_t` value of the API we mirror (2.32: `ncclFloat8e5m2`).
const LAST_DATA_TYPE: i32 = 11;

/// The arguments of one `ncclAllReduce`, as the caller passed them.
#[derive(Debug, Clone, Copy)]
pub struct AllReduceCall {
    pub send: usize,
    pub recv: usize,
    /// Elements, not bytes.
    pub count: usize,
    pub datatype: DataTypeCode,
    pub op: RedOpCode,
    pub comm: ncclComm_t,
}

/// Where a call goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To the real NCCL, unchanged.
    Forward,
    /// Nowhere: the arguments are invalid; return this code.
    Refuse(ResultCode),
}

/// Why a call is refused: one kind per cause, each logged once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Invalid {
    NullComm,
    DataType,
    Op,
    NullBuffer,
}

impl Invalid {
    const ALL: [Invalid; 4] = [
        Invalid::NullComm,
        Invalid::DataType,
        Invalid::Op,
        Invalid::NullBuffer,
    ];

    fn describe(self, call: &AllReduceCall) -> String {
        match self {
            Invalid::NullComm => "comm is NULL".into(),
            Invalid::DataType => format!("datatype {} is not an ncclDataType_t", call.datatype.0),
            Invalid::Op => format!("op {} is not an ncclRedOp_t", call.op.0),
            Invalid::NullBuffer => format!("a NULL buffer with count {}", call.count),
        }
    }
}

/// Which cause, if any, refuses the call.
fn invalid(call: &AllReduceCall) -> Option<Invalid> {
    if call.comm.is_null() {
        return Some(Invalid::NullComm);
    }
    if !(0..=LAST_DATA_TYPE).contains(&call.datatype.0) {
        return Some(Invalid::DataType);
    }
    if call.op.0 < 0 {
        return Some(Invalid::Op);
    }
    if call.count > 0 && (call.send == 0 || call.recv == 0) {
        return Some(Invalid::NullBuffer);
    }
    None
}

/// Whether the WARN for each cause was logged.
static WARNED: [AtomicBool; 4] = [const { AtomicBool::new(false) }; 4];

/// Decides the route of one AllReduce. Depends only on the arguments and on state that is
/// identical on every rank, so every rank takes the same route.
pub fn route_all_reduce(call: &AllReduceCall) -> Route {
    if let Some(cause) = invalid(call) {
        let index = Invalid::ALL.iter().position(|&c| c == cause).unwrap_or(0);
        if !WARNED[index].swap(true, Ordering::Relaxed) {
            log::warn!(
                "ncclAllReduce: {}; returning ncclInvalidArgument (logged once per cause)",
                cause.describe(call)
            );
        }
        return Route::Refuse(ResultCode::INVALID_ARGUMENT);
    }
    Route::Forward
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(datatype: i32, op: i32) -> AllReduceCall {
        AllReduceCall {
            send: 0x1000,
            recv: 0x2000,
            count: 16,
            datatype: DataTypeCode(datatype),
            op: RedOpCode(op),
            comm: 0x10 as ncclComm_t,
        }
    }

    #[test]
    fn valid_calls_forward() {
        assert_eq!(route_all_reduce(&call(7, 0)), Route::Forward);
        assert_eq!(route_all_reduce(&call(11, 4)), Route::Forward);
        assert_eq!(
            route_all_reduce(&call(9, 0x1234_5678)),
            Route::Forward,
            "dynamic op"
        );
        let empty = AllReduceCall {
            count: 0,
            send: 0,
            recv: 0,
            ..call(7, 0)
        };
        assert_eq!(route_all_reduce(&empty), Route::Forward);
    }

    #[test]
    fn invalid_calls_are_refused() {
        let refuse = Route::Refuse(ResultCode::INVALID_ARGUMENT);
        assert_eq!(route_all_reduce(&call(12, 0)), refuse);
        assert_eq!(route_all_reduce(&call(-1, 0)), refuse);
        assert_eq!(route_all_reduce(&call(7, -5)), refuse);
        let no_comm = AllReduceCall {
            comm: std::ptr::null_mut(),
            ..call(7, 0)
        };
        assert_eq!(route_all_reduce(&no_comm), refuse);
        let no_recv = AllReduceCall {
            recv: 0,
            ..call(7, 0)
        };
        assert_eq!(route_all_reduce(&no_recv), refuse);
    }
}
