//! A communicator the application uses after its Destroy or Abort returned is refused with
//! `ncclInvalidArgument` instead of being forwarded into a use after free. The handles here
//! are fake: forwarding any of these calls would crash inside the real NCCL, so passing means
//! nothing was forwarded.

use stragglar::abi::allreduce::ncclAllReduce;
use stragglar::abi::lifecycle::{ncclCommAbort, ncclCommDestroy, ncclCommFinalize};
use stragglar::abi::passthrough::{ncclBroadcast, ncclCommCount, ncclCommGetAsyncError};
use stragglar::nccl::types::{ncclComm_t, DataTypeCode, RedOpCode, ResultCode};
use stragglar::registry::{self, CommInfo, CommOrigin, CommState};

#[test]
fn calls_on_a_destroyed_communicator_are_refused() {
    let fake = 0xdead_0000usize as ncclComm_t;
    registry::comms().insert(
        fake,
        CommInfo {
            nranks: Some(4),
            rank: Some(0),
            cuda_device: Some(0),
            blocking: true,
            origin: CommOrigin::InitRank,
            state: CommState::Destroyed,
            single_process: false,
        },
    );
    let mut count = 0;
    let mut async_error = ResultCode::SUCCESS;
    let mut buf = [0f32; 4];
    let p = buf.as_mut_ptr() as *mut std::ffi::c_void;
    let refused = ResultCode::INVALID_ARGUMENT;
    assert_eq!(ncclCommCount(fake, &mut count), refused);
    assert_eq!(count, 0, "no output written on failure");
    assert_eq!(ncclCommGetAsyncError(fake, &mut async_error), refused);
    assert_eq!(
        ncclBroadcast(p, p, 4, DataTypeCode(7), 0, fake, std::ptr::null_mut()),
        refused
    );
    assert_eq!(
        ncclAllReduce(
            p,
            p,
            4,
            DataTypeCode(7),
            RedOpCode(0),
            fake,
            std::ptr::null_mut()
        ),
        refused
    );
    assert_eq!(ncclCommFinalize(fake), refused);
    assert_eq!(
        ncclCommDestroy(fake),
        refused,
        "a double destroy is refused"
    );
    assert_eq!(ncclCommAbort(fake), refused);
}
