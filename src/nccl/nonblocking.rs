//! Nonblocking communicators (`config.blocking = 0`): NCCL may return `ncclInProgress` from a
//! collective while its helper thread is still launching the work, and the application must
//! poll `ncclCommGetAsyncError` until the state is `ncclSuccess` before its next NCCL call or
//! any other work on the stream. An AllReduce may run on StragglAR only once that state is
//! `ncclSuccess` (every rank of a correct program is there at each call). Where this library
//! itself calls NCCL on such a communicator, it enqueues nothing after NCCL's work before the
//! state settles: the setup's all-gather waits for it (given up when the communicator is aborted
//! or destroyed), and a call the policy forwards is ordered before the next launch only then.

use super::types::ResultCode;

pub use super::real::async_state;

/// Waits while `poll` says `ncclInProgress` (NCCL's helper thread still launching an
/// operation), spinning briefly, then sleeping 50 us between polls; returns the state it
/// settled on, or `None` once `poll` does (the communicator is being aborted or destroyed, and
/// must not be queried any more: `poll` checks that and queries [`async_state`] as one step).
/// No deadline: NCCL's first operations connect to the peers, which may take long, and an
/// operation that NCCL may still be launching must not be abandoned.
pub fn settle(mut poll: impl FnMut() -> Option<ResultCode>) -> Option<ResultCode> {
    let mut polls = 0u32;
    loop {
        let state = poll()?;
        if state != ResultCode::IN_PROGRESS {
            return Some(state);
        }
        if polls < 1000 {
            polls += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}
