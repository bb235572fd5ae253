//! The multicast region of a job's communicator: the values a multicast plan pushes to several
//! readers (the straggler's complete chunks, `RawPlanHeader::multicast_slots_from` on), kept in
//! memory of every rank bound to one multicast object, so that one `multimem.st` reaches every
//! rank. Its size is fixed when the team forms (a multicast object cannot grow): one parity
//! holds the largest message's values, and a call whose values do not fit keeps them in the
//! arenas (the kernels decide so alike on every rank).

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::team::{form, Declined, Team, TeamRequest};
use crate::engine::cuda::args::MulticastRegion;
use crate::engine::cuda::driver::{Device, Kernel};
use crate::engine::cuda::setup::{Exchange, SetupRecord};
use crate::plan::slot_bytes;

/// How long the ranks wait for each other's connections while forming the team.
const FORM_DEADLINE: Duration = Duration::from_secs(30);

/// Alignment of the second parity within the team's memory.
const PARITY_ALIGN: usize = 256;

/// Bytes one parity of the region needs to hold every call of up to `max_bytes` on `ranks`
/// ranks: the `ranks - 1` complete chunks of multicast StragglAR, each in a slot of the largest
/// element count of any type (chunks are cut in 16-byte units, so the byte size decides).
pub fn parity_bytes(ranks: usize, max_bytes: usize) -> usize {
    let chunks = ranks.saturating_sub(1).max(1);
    (chunks * slot_bytes(max_bytes, 1, chunks)).next_multiple_of(PARITY_ALIGN)
}

/// A formed region, with the team that holds its memory (unmapped when dropped, after the
/// communicator's kernels: the engine drops it last), counted against `STRAGGLAR_STAGING_CAP`
/// while it lives (the team counts the memory the driver allocates, rounded up to its
/// granularity).
pub struct Region {
    pub team: Team,
    pub parity_bytes: usize,
}

/// Whether a communicator of `ranks` ranks has a use for a region: multicast StragglAR pushes
/// values to several readers only from three ranks on (at two, the one early rank is the only
/// reader of each chunk, and the plan pushes point to point).
pub fn useful(ranks: usize) -> bool {
    ranks >= 3
}

impl Region {
    /// Where this rank's launches find the region.
    pub fn launch_view(&self) -> MulticastRegion {
        let (multicast, own) = (self.team.multicast.ptr, self.team.unicast.ptr);
        let bytes = self.parity_bytes as u64;
        MulticastRegion {
            multicast: [multicast, multicast + bytes],
            own: [own, own + bytes],
            bytes,
        }
    }
}

/// The team's socket name: the same on every rank of the communicator, unique on the host (the
/// ranks' failure words are shared-memory names no other communicator has).
fn socket_name(records: &[SetupRecord]) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for record in records {
        (record.rank, record.failure_word).hash(&mut hasher);
    }
    format!("stragglar-team-{:016x}", hasher.finish())
}

/// Forms the communicator's region through the setup's exchange, after a setup every rank
/// passed (so every rank calls this, with the same `records` and `max_bytes`): the same outcome
/// on every rank, as the team's protocol makes it. A rank whose device's staging cap has no room
/// for the region's memory as the driver rounds it (`STRAGGLAR_STAGING_CAP`, beside the arenas)
/// says so and declines at the team's count step, before anything is made, so every rank
/// declines with it.
pub fn form_region<E: Exchange>(
    exchange: &mut E,
    device: &Arc<Device>,
    probe: &Kernel,
    records: &[SetupRecord],
    rank: usize,
    max_bytes: usize,
) -> Result<Region, Declined> {
    let ranks = records.len();
    let parity_bytes = parity_bytes(ranks, max_bytes);
    let socket = socket_name(records);
    let request = TeamRequest {
        rank,
        ranks,
        bytes: 2 * parity_bytes,
        socket: &socket,
        deadline: Instant::now() + FORM_DEADLINE,
        probe,
        counted: true,
    };
    let team = form(exchange, device, &request)?;
    Ok(Region { team, parity_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parity_holds_the_complete_chunks_of_the_largest_call_of_any_type() {
        for ranks in [2usize, 3, 8, 72] {
            for max_bytes in [4096usize, 1 << 20, (256 << 20) + 12] {
                let bytes = parity_bytes(ranks, max_bytes);
                assert_eq!(bytes % PARITY_ALIGN, 0);
                let chunks = (ranks - 1).max(1);
                for size in [1usize, 2, 4, 8] {
                    let count = max_bytes / size;
                    assert!(chunks * slot_bytes(count, size, chunks) <= bytes);
                }
                assert!(bytes <= max_bytes + chunks * 16 + PARITY_ALIGN);
            }
        }
    }
}
