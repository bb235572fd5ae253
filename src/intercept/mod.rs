//! The single interception point of `ncclAllReduce`: checks the call and decides its route.
//!
//! An invalid call is refused; a valid one is checked for StragglAR (`eligibility`), and the
//! cause that keeps it on NCCL is counted per communicator. An eligible call routes to the GPU
//! engine (`STRAGGLAR_GPU_ENGINE=1`; `no-gpu-engine` otherwise), which runs it on StragglAR or
//! NCCL, or declines it for a cause of its own (`gpu-unavailable`, `setup-refused`, ...).

pub mod eligibility;
pub mod engine;
pub mod report;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::engine::cuda::call::EngineCall;
use crate::engine::cuda::comm::Decline;
use crate::nccl::types::{ncclComm_t, DataTypeCode, RedOpCode, ResultCode};
use crate::registry::fallback::Fallback;
use eligibility::{CallFacts, Limits};

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
    /// To the GPU engine.
    Engine,
    /// To the real NCCL, unchanged, for this cause.
    Forward(Fallback),
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

/// What the route depends on besides the arguments: the communicator as our registry knows it,
/// the group depth and the configuration.
pub fn facts_of(call: &AllReduceCall) -> CallFacts {
    let mut info = crate::registry::comms().get(call.comm);
    let blocking = info.as_ref().is_none_or(|i| i.blocking);
    // Only a nonblocking communicator asks NCCL for its state; once it is ready, what its
    // init left unknown is read (alike on every rank: NCCL requires ncclSuccess before a call).
    let async_ready = !blocking
        && crate::nccl::nonblocking::async_state(call.comm)
            == crate::nccl::types::ResultCode::SUCCESS;
    if async_ready {
        info = crate::registry::identity::completed_info(call.comm);
    }
    // Only a dynamic op (a PreMulSum) needs the op table's lock.
    let premul = (call.op.0 > 4)
        .then(|| crate::registry::comms().redop(call.comm, call.op))
        .flatten();
    CallFacts {
        count: call.count,
        datatype: call.datatype.0,
        op: call.op.0,
        op_is_host_premulsum: premul
            .is_some_and(|p| matches!(p.scalar, crate::registry::Scalar::Host { .. })),
        nranks: info.as_ref().and_then(|i| i.nranks),
        blocking,
        async_ready,
        in_group: crate::registry::groups::depth() > 0,
        single_process: info.as_ref().is_some_and(|i| i.single_process),
    }
}

/// The configuration's part of the route.
pub fn limits() -> Limits {
    let config = crate::config::get();
    Limits {
        p2p_disabled: config.p2p_disabled,
        forced_nccl: config.algo == crate::detect::policy::AlgoMode::Baseline,
        straggler_off: config.straggler == crate::detect::policy::StragglerMode::Off,
        min_bytes: config.min_bytes,
        buffer_bytes: config.buffer_bytes,
        gpu_engine: config.gpu_engine,
    }
}

/// Decides the route of one AllReduce from `facts` (see [`facts_of`]). Depends only on the
/// arguments and on state that is identical on every rank, so every rank takes the same route.
pub fn route_all_reduce(call: &AllReduceCall, facts: &CallFacts, limits: &Limits) -> Route {
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
    match eligibility::check(facts, limits) {
        Err(cause) => Route::Forward(cause),
        Ok(()) => Route::Engine,
    }
}

/// Counts a call StragglAR ran on its communicator.
pub fn count_stragglar(comm: ncclComm_t) {
    crate::registry::comms()
        .record_or_new(comm)
        .stats
        .ran_stragglar();
}

/// The cause a call the GPU engine declined is counted as.
impl From<Decline> for Fallback {
    fn from(decline: Decline) -> Fallback {
        match decline {
            Decline::GpuUnavailable => Fallback::GpuUnavailable,
            Decline::SetupRefused => Fallback::SetupRefused,
            Decline::CapturingBeforeSetup => Fallback::CapturingBeforeSetup,
            Decline::AboveStaging => Fallback::AboveStaging,
            Decline::PolicyNccl => Fallback::PolicyNccl,
        }
    }
}

/// The GPU engine's view of an eligible call, or the cause that keeps it on NCCL.
pub fn engine_call(
    call: &AllReduceCall,
    stream: crate::nccl::types::cudaStream_t,
) -> Result<EngineCall, Fallback> {
    use crate::reduce::{DataType, ReduceOp, Scale};
    let info = crate::registry::comms()
        .get(call.comm)
        .ok_or(Fallback::UnknownComm)?;
    let (Some(ranks), Some(rank), Some(device)) = (info.nranks, info.rank, info.cuda_device) else {
        return Err(Fallback::UnknownComm);
    };
    let dtype = DataType::from_nccl(call.datatype.0).ok_or(Fallback::UnsupportedType)?;
    let (op, scalar) = match call.op.0 {
        0 => (ReduceOp::Sum, None),
        1 => (ReduceOp::Prod, None),
        2 => (ReduceOp::Max, None),
        3 => (ReduceOp::Min, None),
        4 => (ReduceOp::Avg, None),
        _ => match crate::registry::comms().redop(call.comm, call.op) {
            Some(crate::registry::PreMulSum {
                scalar: crate::registry::Scalar::Host { bytes, .. },
                ..
            }) => (ReduceOp::PreMulSum, Some(bytes)),
            _ => return Err(Fallback::UnsupportedOp),
        },
    };
    let scale: Scale =
        Scale::for_op(op, dtype, ranks as usize, scalar).ok_or(Fallback::UnsupportedOp)?;
    Ok(EngineCall {
        comm: call.comm,
        rank: rank as usize,
        ranks: ranks as usize,
        device,
        send: call.send as u64,
        recv: call.recv as u64,
        count: call.count,
        nccl_dtype: call.datatype,
        nccl_op: call.op,
        dtype,
        op,
        scale,
        stream,
    })
}

/// Counts a forwarded call on its communicator and logs the cause at INFO the first time it
/// keeps that communicator's calls on NCCL.
pub fn count_fallback(comm: ncclComm_t, cause: Fallback) {
    let interval = match log::log_enabled!(log::Level::Info) {
        true => crate::config::get()
            .report_interval_s
            .saturating_mul(1_000_000_000),
        false => 0,
    };
    // Counted under the table's lock; logged after it (the report reads the table again).
    let (first, due) = crate::registry::comms().with_record(comm, |record| {
        let stats = &record.stats;
        let first = stats.fell_back(cause);
        let due = (interval > 0 && stats.report_due(crate::clock::now_ns(), interval))
            .then(|| stats.snapshot());
        (first, due)
    });
    if first {
        log::info!(
            "ncclAllReduce on communicator {comm:p} goes to NCCL: {} (logged once per communicator and cause)",
            cause.describe()
        );
    }
    if let Some(snapshot) = due {
        log::info!("{}", report::summary(comm, &snapshot));
    }
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
    fn valid_calls_forward_with_their_cause() {
        let f = |c: &AllReduceCall| facts_of(c);
        let l = Limits {
            p2p_disabled: false,
            forced_nccl: false,
            straggler_off: false,
            min_bytes: 0,
            buffer_bytes: 1 << 30,
            gpu_engine: false,
        };
        let unknown = Route::Forward(Fallback::UnknownComm);
        assert_eq!(route_all_reduce(&call(7, 0), &f(&call(7, 0)), &l), unknown);
        assert_eq!(
            route_all_reduce(&call(11, 4), &f(&call(11, 4)), &l),
            unknown
        );
        let dynamic = call(9, 0x1234_5678);
        assert_eq!(route_all_reduce(&dynamic, &f(&dynamic), &l), unknown);
        let empty = AllReduceCall {
            count: 0,
            send: 0,
            recv: 0,
            ..call(7, 0)
        };
        assert_eq!(route_all_reduce(&empty, &f(&empty), &l), unknown);
        let known = CallFacts {
            nranks: Some(8),
            ..f(&call(7, 0))
        };
        assert_eq!(
            route_all_reduce(&call(7, 0), &known, &l),
            Route::Forward(Fallback::NoGpuEngine)
        );
        assert_eq!(
            route_all_reduce(
                &call(7, 0),
                &known,
                &Limits {
                    p2p_disabled: true,
                    ..l
                }
            ),
            Route::Forward(Fallback::P2pDisabled)
        );
    }

    #[test]
    fn a_communicator_with_every_rank_in_this_process_stays_on_nccl() {
        use crate::registry::{CommInfo, CommOrigin, CommState};
        let comm = 0x5100 as ncclComm_t;
        crate::registry::comms().insert(
            comm,
            CommInfo {
                nranks: Some(8),
                rank: Some(2),
                cuda_device: Some(2),
                blocking: true,
                origin: CommOrigin::InitAll,
                state: CommState::Live,
                single_process: true,
            },
        );
        let c = AllReduceCall {
            comm,
            count: 1 << 20,
            ..call(7, 0)
        };
        let l = Limits {
            min_bytes: 0,
            ..limits()
        };
        assert_eq!(
            route_all_reduce(&c, &facts_of(&c), &l),
            Route::Forward(Fallback::SingleProcess)
        );
    }

    #[test]
    fn invalid_calls_are_refused() {
        let refuse = Route::Refuse(ResultCode::INVALID_ARGUMENT);
        let route_all_reduce = |c: &AllReduceCall| route_all_reduce(c, &facts_of(c), &limits());
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
