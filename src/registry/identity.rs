//! A communicator's size, rank and device, as NCCL says them: read when its init returns,
//! and completed at its first call once a nonblocking init has finished.

use super::{comms, CommInfo};
use crate::nccl::types::ncclComm_t;

/// Fills in what NCCL says of `comm`'s size, rank and device (what it cannot say stays as it
/// was). `comm` must be ready (`ncclSuccess`).
pub fn read_identity(comm: ncclComm_t, info: &mut CommInfo) {
    let said = crate::nccl::real::identity(comm);
    info.nranks = said.nranks.or(info.nranks);
    info.rank = said.rank.or(info.rank);
    info.cuda_device = said.cuda_device.or(info.cuda_device);
}

/// What is known of `comm`, completed from NCCL where its init returned `ncclInProgress`
/// (nonblocking) and left its size, rank or device unknown. The caller must know that its
/// state is `ncclSuccess` now (NCCL may not be queried before); every rank of a correct
/// program completes alike, at its first call after that.
pub fn completed_info(comm: ncclComm_t) -> Option<CommInfo> {
    let info = comms().get(comm)?;
    if info.nranks.is_some() && info.rank.is_some() && info.cuda_device.is_some() {
        return Some(info);
    }
    let mut known = info.clone();
    read_identity(comm, &mut known);
    if known == info {
        // NCCL could not say (asked again at the next call; nothing changes meanwhile).
        return Some(info);
    }
    log::info!(
        "communicator {comm:p} is ready: rank {:?} of {:?} on device {:?}",
        known.rank,
        known.nranks,
        known.cuda_device
    );
    comms().update(comm, |info| {
        info.nranks = known.nranks;
        info.rank = known.rank;
        info.cuda_device = known.cuda_device;
    })
}
