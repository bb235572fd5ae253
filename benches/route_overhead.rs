//! The host-side cost of one `ncclAllReduce` decision: validation, the eligibility checks
//! (registry lookups of the communicator and the op, the group depth, the configuration) and
//! the per-communicator counters. Run with `cargo bench --bench route_overhead`.

use std::hint::black_box;
use std::time::Instant;

use stragglar::intercept::{
    count_fallback, facts_of, limits, route_all_reduce, AllReduceCall, Route,
};
use stragglar::nccl::types::{ncclComm_t, DataTypeCode, RedOpCode};
use stragglar::registry::{self, CommInfo, CommOrigin, CommState};

fn main() {
    let comms: Vec<ncclComm_t> = (1..=64).map(|i| (i * 0x1000) as ncclComm_t).collect();
    for &comm in &comms {
        registry::comms().insert(
            comm,
            CommInfo {
                nranks: Some(8),
                rank: Some(1),
                cuda_device: Some(0),
                blocking: true,
                origin: CommOrigin::InitRank,
                state: CommState::Live,
                single_process: false,
            },
        );
    }
    let calls = 4_000_000;
    for round in 0..3 {
        let started = Instant::now();
        for i in 0..calls {
            let call = AllReduceCall {
                send: 0x1000,
                recv: 0x2000,
                count: 1 << 20,
                datatype: DataTypeCode(7),
                op: RedOpCode(0),
                comm: comms[i % comms.len()],
            };
            let call = black_box(&call);
            if let Route::Forward(cause) = route_all_reduce(call, &facts_of(call), &limits()) {
                count_fallback(call.comm, cause);
            }
        }
        let ns = started.elapsed().as_nanos() as f64 / calls as f64;
        println!("round {round}: {ns:.1} ns per ncclAllReduce decision (64 communicators)");
    }
}
