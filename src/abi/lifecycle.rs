//! Communicator lifecycle exports: forwarded unchanged, then recorded in the side table.
//!
//! A communicator is recorded when the real call returns `ncclSuccess`, or `ncclInProgress`
//! with the handle set (nonblocking init); the handle is returned to the caller as NCCL made it.
//! It is marked finalized, revoked or destroyed once the forwarded call returns.

#![allow(non_snake_case)]

use std::os::raw::c_int;
use std::sync::atomic::AtomicBool;

use super::guard::{check_live, guard, reject_null};
use crate::forward;
use crate::logging::set_thread_device;
use crate::nccl::reentry::{calling_real, tracking};
use crate::nccl::types::*;
use crate::registry::comm_config::{effective_blocking, requested_blocking};
use crate::registry::identity::read_identity;
use crate::registry::names;
use crate::registry::{self, CommInfo, CommOrigin, CommState};

/// Whether a result means NCCL handed out a communicator.
fn made(rc: ResultCode) -> bool {
    rc == ResultCode::SUCCESS || rc == ResultCode::IN_PROGRESS
}

/// The blocking mode of a communicator made with `config` (NULL for none) as a child of
/// `parent` (NULL for none), as NCCL decides it.
fn blocking_of(config: *const ncclConfig_t, parent: ncclComm_t) -> bool {
    // SAFETY: NCCL has just accepted `config`, so it is NULL or readable within its `size`.
    let requested = unsafe { requested_blocking(config) };
    let inherited = registry::comms().get(parent).map(|info| info.blocking);
    let env = std::env::var("NCCL_COMM_BLOCKING").ok();
    effective_blocking(env.as_deref(), requested, config.is_null(), inherited)
}

/// Records a communicator the real NCCL handed out (as a child of `parent`, NULL for none).
/// Asks NCCL for what the call did not say, but only once the communicator is ready
/// (`ncclSuccess`): a nonblocking one in progress must not be queried.
fn record(
    comm: ncclComm_t,
    rc: ResultCode,
    origin: CommOrigin,
    nranks: Option<i32>,
    rank: Option<i32>,
    blocking: bool,
    parent: ncclComm_t,
) {
    if comm.is_null() {
        return;
    }
    let mut info = CommInfo {
        nranks,
        rank,
        cuda_device: None,
        blocking,
        origin,
        state: CommState::Live,
        single_process: origin == CommOrigin::InitAll
            || (matches!(origin, CommOrigin::Split | CommOrigin::Shrink)
                && registry::comms()
                    .get(parent)
                    .is_some_and(|p| p.single_process)),
    };
    if rc == ResultCode::SUCCESS {
        read_identity(comm, &mut info);
        if let Some(device) = info.cuda_device {
            set_thread_device(device);
        }
    }
    log::info!(
        "communicator {comm:p} from {origin:?}: rank {:?} of {:?} on device {:?}, {}",
        info.rank,
        info.nranks,
        info.cuda_device,
        if blocking { "blocking" } else { "nonblocking" }
    );
    // A new communicator (perhaps at a reused address) gets a new record: its counters, ops
    // and engine state start from nothing (an old engine at the address is ended first).
    crate::intercept::engine::forget(comm, false);
    registry::comms().insert(comm, info);
}

/// Moves a tracked communicator to `state` after a forwarded teardown call.
fn retire(comm: ncclComm_t, state: CommState) {
    if registry::comms().set_state(comm, state).is_some() {
        log::info!("communicator {comm:p} is now {state:?}");
    }
    if state == CommState::Destroyed {
        if let Some(stats) = registry::comms().retire(comm) {
            crate::intercept::report::log_at_destroy(comm, &stats);
        }
    }
}

/// Reads the handle NCCL wrote, if the call got that far.
fn written(out: *mut ncclComm_t) -> ncclComm_t {
    if out.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `out` is the caller's non-NULL output slot that the real NCCL just wrote.
    unsafe { *out }
}

/// Creates a communicator (forwarded) and records it.
#[no_mangle]
pub extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ResultCode {
    guard("ncclCommInitRank", || {
        if !tracking() {
            return forward!(ncclCommInitRank(comm, nranks, commId, rank); outputs comm);
        }
        let rc: ResultCode =
            calling_real(|| forward!(ncclCommInitRank(comm, nranks, commId, rank); outputs comm));
        if made(rc) {
            let blocking = blocking_of(std::ptr::null(), std::ptr::null_mut());
            record(
                written(comm),
                rc,
                CommOrigin::InitRank,
                Some(nranks),
                Some(rank),
                blocking,
                std::ptr::null_mut(),
            );
            names::name(written(comm), names::of_unique_id(&commId));
        }
        rc
    })
}

/// Creates a communicator with a configuration (forwarded) and records it.
#[no_mangle]
pub extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ResultCode {
    guard("ncclCommInitRankConfig", || {
        if !tracking() {
            return forward!(ncclCommInitRankConfig(comm, nranks, commId, rank, config); outputs comm);
        }
        let rc: ResultCode = calling_real(
            || forward!(ncclCommInitRankConfig(comm, nranks, commId, rank, config); outputs comm),
        );
        if made(rc) {
            let blocking = blocking_of(config, std::ptr::null_mut());
            record(
                written(comm),
                rc,
                CommOrigin::InitRankConfig,
                Some(nranks),
                Some(rank),
                blocking,
                std::ptr::null_mut(),
            );
            names::name(written(comm), names::of_unique_id(&commId));
        }
        rc
    })
}

/// Creates one communicator per device in this process (forwarded) and records each.
#[no_mangle]
pub extern "C" fn ncclCommInitAll(
    comm: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ResultCode {
    guard("ncclCommInitAll", || {
        if !tracking() {
            return forward!(ncclCommInitAll(comm, ndev, devlist); outputs comm);
        }
        let rc: ResultCode =
            calling_real(|| forward!(ncclCommInitAll(comm, ndev, devlist); outputs comm));
        if made(rc) && ndev > 0 {
            let blocking = blocking_of(std::ptr::null(), std::ptr::null_mut());
            for i in 0..ndev as usize {
                // SAFETY: NCCL just filled `ndev` handles into the caller's array.
                let handle = unsafe { *comm.add(i) };
                record(
                    handle,
                    rc,
                    CommOrigin::InitAll,
                    Some(ndev),
                    Some(i as i32),
                    blocking,
                    std::ptr::null_mut(),
                );
            }
        }
        rc
    })
}

/// Creates a communicator from several unique ids (forwarded) and records it.
#[no_mangle]
pub extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ResultCode {
    guard("ncclCommInitRankScalable", || {
        if !tracking() {
            return forward!(ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, config); outputs newcomm);
        }
        let rc: ResultCode = calling_real(
            || forward!(ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, config); outputs newcomm),
        );
        if made(rc) {
            let blocking = blocking_of(config, std::ptr::null_mut());
            record(
                written(newcomm),
                rc,
                CommOrigin::InitRankScalable,
                Some(nranks),
                Some(myrank),
                blocking,
                std::ptr::null_mut(),
            );
        }
        rc
    })
}

/// Splits a communicator (forwarded) and records the new one (none for `NCCL_SPLIT_NOCOLOR`).
#[no_mangle]
pub extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ResultCode {
    guard("ncclCommSplit", || {
        static LIVE_WARNED: AtomicBool = AtomicBool::new(false);
        if let Err(code) = check_live(comm, &LIVE_WARNED, "ncclCommSplit") {
            return code;
        }
        if comm.is_null() {
            // NCCL dereferences it (ncclCommSplit(NULL, ...) crashes in 2.32).
            static NULL_WARNED: AtomicBool = AtomicBool::new(false);
            return reject_null(&NULL_WARNED, "ncclCommSplit", "comm");
        }
        if !tracking() {
            return forward!(ncclCommSplit(comm, color, key, newcomm, config); outputs newcomm);
        }
        let rc: ResultCode = calling_real(
            || forward!(ncclCommSplit(comm, color, key, newcomm, config); outputs newcomm),
        );
        // Every member counts the split, whatever its color: its child's name numbers it.
        let child_name = names::next_split(comm, color);
        if made(rc) {
            let blocking = blocking_of(config, comm);
            record(
                written(newcomm),
                rc,
                CommOrigin::Split,
                None,
                None,
                blocking,
                comm,
            );
            if let Some(name) = child_name {
                names::name(written(newcomm), name);
            }
        }
        rc
    })
}

/// Shrinks a communicator (forwarded) and records the new one.
#[no_mangle]
pub extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ResultCode {
    guard("ncclCommShrink", || {
        static LIVE_WARNED: AtomicBool = AtomicBool::new(false);
        if let Err(code) = check_live(comm, &LIVE_WARNED, "ncclCommShrink") {
            return code;
        }
        if comm.is_null() {
            // NCCL dereferences it (ncclCommSplit(NULL, ...) crashes in 2.32).
            static NULL_WARNED: AtomicBool = AtomicBool::new(false);
            return reject_null(&NULL_WARNED, "ncclCommShrink", "comm");
        }
        if !tracking() {
            return forward!(ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags); outputs newcomm);
        }
        let rc: ResultCode = calling_real(
            || forward!(ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags); outputs newcomm),
        );
        if made(rc) {
            let blocking = blocking_of(config, comm);
            record(
                written(newcomm),
                rc,
                CommOrigin::Shrink,
                None,
                None,
                blocking,
                comm,
            );
        }
        rc
    })
}

/// Grows a communicator (forwarded) and records the new one.
#[no_mangle]
pub extern "C" fn ncclCommGrow(
    comm: ncclComm_t,
    nRanks: c_int,
    uniqueId: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ResultCode {
    guard("ncclCommGrow", || {
        static LIVE_WARNED: AtomicBool = AtomicBool::new(false);
        if let Err(code) = check_live(comm, &LIVE_WARNED, "ncclCommGrow") {
            return code;
        }
        if !tracking() {
            return forward!(ncclCommGrow(comm, nRanks, uniqueId, rank, newcomm, config); outputs newcomm);
        }
        let rc: ResultCode = calling_real(
            || forward!(ncclCommGrow(comm, nRanks, uniqueId, rank, newcomm, config); outputs newcomm),
        );
        if made(rc) {
            let blocking = blocking_of(config, comm);
            let rank = (rank >= 0).then_some(rank);
            record(
                written(newcomm),
                rc,
                CommOrigin::Grow,
                Some(nRanks),
                rank,
                blocking,
                std::ptr::null_mut(),
            );
        }
        rc
    })
}

/// How a teardown export ends a communicator.
#[derive(Clone, Copy)]
struct Ending {
    /// The export's name, for its log lines.
    name: &'static str,
    /// Whether the GPU engine's kernels are released at once (without waiting for peers).
    abort_engine: bool,
    /// The state the communicator is left in once NCCL made the call.
    state: CommState,
    /// Whether it is left so whatever NCCL answered (after an abort the handle is gone).
    always: bool,
    /// Whether a NULL communicator is refused here (NCCL would dereference it).
    refuse_null: bool,
}

/// The one preamble of the teardown exports (Finalize, Revoke, Destroy, Abort): refuses a
/// destroyed (and, where NCCL would crash, a NULL) communicator, ends the GPU engine's part of
/// it, forwards through `real` with NCCL's own calls passing straight through, and records the
/// new state. NCCL's own calls to these exports are forwarded untouched.
fn end_comm(
    comm: ncclComm_t,
    ending: Ending,
    warned: &[AtomicBool; 2],
    real: impl FnOnce() -> ResultCode,
) -> ResultCode {
    if let Err(code) = check_live(comm, &warned[0], ending.name) {
        return code;
    }
    if ending.refuse_null && comm.is_null() {
        return reject_null(&warned[1], ending.name, "comm");
    }
    if !tracking() {
        return real();
    }
    crate::intercept::engine::forget(comm, ending.abort_engine);
    let rc = calling_real(real);
    if ending.always || made(rc) {
        // Observe mode's record, once NCCL let the communicator go (a failed destroy leaves it
        // usable, and its calls keep their numbers).
        if ending.state == CommState::Destroyed {
            crate::intercept::engine::observation_ends(comm, ending.abort_engine);
        }
        retire(comm, ending.state);
    }
    rc
}

/// Finalizes a communicator (forwarded) and marks it finalized.
#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ResultCode {
    static WARNED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];
    let ending = Ending {
        name: "ncclCommFinalize",
        abort_engine: false,
        state: CommState::Finalized,
        always: false,
        refuse_null: true,
    };
    guard(ending.name, || {
        end_comm(comm, ending, &WARNED, || forward!(ncclCommFinalize(comm)))
    })
}

/// Revokes a communicator (forwarded) and marks it revoked.
#[no_mangle]
pub extern "C" fn ncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ResultCode {
    static WARNED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];
    let ending = Ending {
        name: "ncclCommRevoke",
        abort_engine: true,
        state: CommState::Revoked,
        always: false,
        refuse_null: true,
    };
    guard(ending.name, || {
        end_comm(comm, ending, &WARNED, || {
            forward!(ncclCommRevoke(comm, revokeFlags))
        })
    })
}

/// Destroys a communicator (forwarded) and marks it destroyed. NCCL's own calls during the
/// teardown pass straight through.
#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ResultCode {
    static WARNED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];
    let ending = Ending {
        name: "ncclCommDestroy",
        abort_engine: false,
        state: CommState::Destroyed,
        always: false,
        refuse_null: false,
    };
    guard(ending.name, || {
        end_comm(comm, ending, &WARNED, || forward!(ncclCommDestroy(comm)))
    })
}

/// Aborts a communicator (forwarded) and marks it destroyed: after an abort the handle is gone
/// whatever the result.
#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ResultCode {
    static WARNED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];
    let ending = Ending {
        name: "ncclCommAbort",
        abort_engine: true,
        state: CommState::Destroyed,
        always: true,
        refuse_null: false,
    };
    guard(ending.name, || {
        end_comm(comm, ending, &WARNED, || forward!(ncclCommAbort(comm)))
    })
}
