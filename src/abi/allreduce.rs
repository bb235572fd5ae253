//! `ncclAllReduce`: the one intercepted collective.

use std::os::raw::c_void;
use std::sync::atomic::AtomicBool;

use super::guard::{check_live, guard};
use crate::forward;
use crate::intercept::fallback::Fallback;
use crate::intercept::{
    count_fallback, count_stragglar, engine_call, facts_of, limits, route_all_reduce,
    AllReduceCall, Route,
};
use crate::nccl::types::*;

/// AllReduce: routed by [`route_all_reduce`], counted on its communicator, then run by the
/// real NCCL (or refused).
#[no_mangle]
pub extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataTypeCode,
    op: RedOpCode,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ResultCode {
    guard("ncclAllReduce", || {
        static LIVE_WARNED: AtomicBool = AtomicBool::new(false);
        if let Err(code) = check_live(comm, &LIVE_WARNED, "ncclAllReduce") {
            return code;
        }
        if !crate::config::get().enabled {
            return forward!(ncclAllReduce(
                sendbuff, recvbuff, count, datatype, op, comm, stream
            ));
        }
        let call = AllReduceCall {
            send: sendbuff as usize,
            recv: recvbuff as usize,
            count,
            datatype,
            op,
            comm,
        };
        let mut route = route_all_reduce(&call, &facts_of(&call), &limits());
        if route == Route::Forward(Fallback::NoGpuEngine) && crate::config::get().gpu_engine {
            // Eligible, and the (experimental) GPU engine is on.
            match engine_call(&call, stream)
                .and_then(|c| crate::engine::cuda::library::all_reduce(&c))
            {
                Ok(code) => {
                    // A call that failed on the engine ran nowhere: it is not counted.
                    if code == ResultCode::SUCCESS {
                        count_stragglar(comm);
                    }
                    return code;
                }
                Err(cause) => route = Route::Forward(cause),
            }
        }
        match route {
            Route::Forward(cause) => {
                count_fallback(comm, cause);
                let code = forward!(ncclAllReduce(
                    sendbuff, recvbuff, count, datatype, op, comm, stream
                ));
                if cause == Fallback::NonblockingComm && crate::config::get().gpu_engine {
                    let state = crate::intercept::nonblocking::async_state(comm);
                    crate::engine::cuda::library::nccl_state_seen(comm, state);
                }
                if cause == Fallback::PolicyNccl {
                    // The GPU engine's next launch on this communicator follows NCCL's kernel.
                    crate::engine::cuda::library::forwarded(comm, stream, code);
                }
                code
            }
            Route::Refuse(code) => code,
        }
    })
}
