//! The one door from the exports to the GPU engine: what `abi` may ask of it. The exports never
//! name the engine themselves, so the path of a call is abi -> intercept -> engine.

use super::{engine_call, AllReduceCall};
use crate::engine::cuda::{library, observe};
use crate::nccl::types::{cudaStream_t, ncclComm_t, DataTypeCode, ResultCode};
use crate::registry::fallback::Fallback;

pub use crate::engine::cuda::library::{NoArrivals, Served};
pub use crate::engine::cuda::observe::Collective;

/// Runs `call` (routed to the engine) on the GPU engine, setting its communicator up at its
/// first call; `Err` names why it stays on NCCL, untouched.
pub fn all_reduce(call: &AllReduceCall, stream: cudaStream_t) -> Result<Served, Fallback> {
    engine_call(call, stream).and_then(|c| library::all_reduce(&c).map_err(Fallback::from))
}

/// NCCL's asynchronous state of `comm`, as the application just saw it (see
/// `library::nccl_state_seen`).
pub fn nccl_state_seen(comm: ncclComm_t, state: ResultCode) {
    library::nccl_state_seen(comm, state)
}

/// The asynchronous error the engine holds for `comm`, if a kernel of it gave up.
pub fn async_error(comm: ncclComm_t) -> Option<ResultCode> {
    library::async_error(comm)
}

/// The straggler the engine designates on `comm`, if it serves it and designates one.
pub fn designated(comm: ncclComm_t) -> Option<usize> {
    library::designated(comm)
}

/// `rank`'s arrivals on `comm` (a line of its straggler report).
pub fn arrivals(
    comm: ncclComm_t,
    rank: usize,
) -> Result<crate::detect::tally::RankArrivals, NoArrivals> {
    library::arrivals(comm, rank)
}

/// What the policy measured and chose for size class `class` of `comm`.
pub fn class_times(
    comm: ncclComm_t,
    class: u32,
) -> Result<Option<crate::detect::estimate::ClassTimes>, NoArrivals> {
    library::class_times(comm, class)
}

/// Ends `comm`'s engine (a new communicator at its address, destroy, or abort with `abort`).
pub fn forget(comm: ncclComm_t, abort: bool) {
    library::forget(comm, abort)
}

/// Runs `call`, NCCL's `collective` of `count` elements of `datatype` per rank on `comm` and
/// `stream`, timed in observe mode (`STRAGGLAR_OBSERVE=1`; see `engine::cuda::observe`).
/// NCCL's own calls of our exports pass straight through.
pub fn observed(
    collective: Collective,
    comm: ncclComm_t,
    stream: cudaStream_t,
    count: usize,
    datatype: DataTypeCode,
    call: impl FnOnce() -> ResultCode,
) -> ResultCode {
    if crate::nccl::reentry::inside_real_nccl() || !crate::config::get().enabled {
        return call();
    }
    // A type we do not know counts no bytes (NCCL refuses the call).
    let width = crate::reduce::DataType::from_nccl(datatype.0).map_or(0, |d| d.size());
    let bytes = count.saturating_mul(width);
    let in_group = crate::registry::groups::depth() > 0;
    observe::observed(collective, comm, stream, bytes, in_group, call)
}

/// Ends `comm`'s observations at its destroy (or abort, with `abort`), writing its record.
pub fn observation_ends(comm: ncclComm_t, abort: bool) {
    observe::finish(comm, abort)
}

/// The calling thread's outermost group ended with `code` (observe mode times each
/// communicator's collectives of the group as one call).
pub fn group_ended(code: ResultCode) {
    if crate::config::get().observe {
        observe::group_ended(code)
    }
}
