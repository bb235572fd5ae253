//! `ncclGroupStart` / `ncclGroupEnd`: forwarded, with the per-thread depth mirrored.

use super::guard::guard;
use crate::forward;
use crate::nccl::reentry::{calling_real, tracking};
use crate::nccl::types::ResultCode;
use crate::registry::groups;

/// Opens a group (forwarded); the thread's depth grows when NCCL accepts it.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ResultCode {
    guard("ncclGroupStart", || {
        if !tracking() {
            return forward!(ncclGroupStart());
        }
        let rc: ResultCode = calling_real(|| forward!(ncclGroupStart()));
        if rc.is_success() {
            groups::enter();
        }
        rc
    })
}

/// Closes a group (forwarded); the thread leaves it whatever the result, as in NCCL.
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ResultCode {
    guard("ncclGroupEnd", || {
        if !tracking() {
            return forward!(ncclGroupEnd());
        }
        let rc: ResultCode = calling_real(|| forward!(ncclGroupEnd()));
        if groups::leave() == 0 {
            // Observe mode times each communicator's collectives of the group as one call.
            crate::intercept::engine::group_ended(rc);
        }
        rc
    })
}
