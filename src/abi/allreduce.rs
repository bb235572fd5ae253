//! `ncclAllReduce`: the one intercepted collective.

use std::os::raw::c_void;
use std::sync::atomic::AtomicBool;

use super::guard::{check_live, guard};
use crate::forward;
use crate::intercept::engine::{self, Served};
use crate::intercept::{
    count_fallback, count_stragglar, facts_of, limits, route_all_reduce, AllReduceCall, Route,
};
use crate::nccl::types::*;
use crate::registry::fallback::Fallback;

/// AllReduce: routed by [`route_all_reduce`], counted on its communicator, then run by the GPU
/// engine or the real NCCL (or refused).
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
        // Disabled, or NCCL's own call to its exported name: straight through.
        if !crate::config::get().enabled || crate::nccl::reentry::inside_real_nccl() {
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
        if route == Route::Engine {
            match engine::all_reduce(&call, stream) {
                Ok(Served::Stragglar(code)) => {
                    // A call that failed on the engine ran nowhere: it is not counted.
                    if code == ResultCode::SUCCESS {
                        count_stragglar(comm);
                    }
                    return code;
                }
                Ok(Served::Nccl {
                    code,
                    above_staging,
                }) => {
                    let cause = match above_staging {
                        true => Fallback::AboveStaging,
                        false => Fallback::PolicyNccl,
                    };
                    count_fallback(comm, cause);
                    return code;
                }
                Err(cause) => route = Route::Forward(cause),
            }
        }
        match route {
            Route::Forward(cause) => {
                count_fallback(comm, cause);
                let collective = engine::Collective::AllReduce;
                let code = engine::observed(collective, comm, stream, count, datatype, || {
                    forward!(ncclAllReduce(
                        sendbuff, recvbuff, count, datatype, op, comm, stream
                    ))
                });
                if cause == Fallback::NonblockingComm && crate::config::get().gpu_engine {
                    let state = crate::nccl::nonblocking::async_state(comm);
                    engine::nccl_state_seen(comm, state);
                }
                code
            }
            Route::Engine => unreachable!("the engine's route was taken above"),
            Route::Refuse(code) => code,
        }
    })
}
