//! How a rank reaches its peers' staging: through CUDA IPC between processes (a job's ranks,
//! the bench's worker processes), or as plain device pointers between threads of one process
//! (the bench's thread ranks); either way probed with a round trip before the engine runs,
//! then connected into the rank's peer table.

use std::sync::Arc;

use parking_lot::Mutex;

use super::driver::{Device, DeviceMemory, PeerMapping};
use super::failure::FailureWord;
use super::rank::CudaRank;
use super::setup::{PeerAccess, SetupRecord};
use super::staging::{StagingLayout, PROBE_WORDS};

/// The probe's token: a recognisable high half, the writer's rank in the low half.
const PROBE_TOKEN: u32 = 0x5347_0000;

/// How long the GPU's own peer probe may take (it queues behind nothing of the caller's, but
/// behind other work filling the GPU).
const GPU_PROBE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// A round trip through `mapping` by `rank`: its token, written into its own probe word of the
/// peer's staging, reads back.
fn probe(mapping: &PeerMapping, layout: &StagingLayout, rank: usize) -> bool {
    if rank as u64 >= PROBE_WORDS {
        return false;
    }
    let at = layout.probe_word(rank);
    let token = PROBE_TOKEN | rank as u32;
    mapping.write_u32(at, token).is_ok() && mapping.read_u32(at) == Ok(token)
}

/// Peers' staging through CUDA IPC (each peer another process).
pub struct IpcAccess<'a> {
    pub device: &'a Arc<Device>,
    pub layout: StagingLayout,
    /// This rank: its probe word in each peer's staging is the one it writes.
    pub rank: usize,
}

impl PeerAccess for IpcAccess<'_> {
    type Mapping = PeerMapping;

    fn open(&mut self, record: &SetupRecord) -> Result<PeerMapping, String> {
        PeerMapping::open(self.device, &record.staging_handle).map_err(|e| e.to_string())
    }

    fn probe(&mut self, mapping: &PeerMapping) -> bool {
        probe(mapping, &self.layout, self.rank)
    }

    const AGREES_IN_HOST_MEMORY: bool = true;
}

/// Every rank's staging address, for ranks that are threads of one process: each rank shares
/// its own before the setup's first all-gather, and opens its peers' after it.
pub type SharedStaging = Arc<Mutex<Vec<Option<u64>>>>;

/// Peers' staging as plain device pointers (ranks as threads of one process on one device).
pub struct SameProcessAccess<'a> {
    pub device: &'a Arc<Device>,
    pub layout: StagingLayout,
    pub rank: usize,
    pub staging: SharedStaging,
}

impl PeerAccess for SameProcessAccess<'_> {
    type Mapping = PeerMapping;

    fn share(&mut self, staging: &DeviceMemory) {
        if let Some(slot) = self.staging.lock().get_mut(self.rank) {
            *slot = Some(staging.ptr);
        }
    }

    fn open(&mut self, record: &SetupRecord) -> Result<PeerMapping, String> {
        let ptr = self
            .staging
            .lock()
            .get(record.rank as usize)
            .copied()
            .flatten();
        let ptr = ptr.ok_or_else(|| format!("rank {} shared no staging", record.rank))?;
        Ok(PeerMapping::same_process(self.device, ptr))
    }

    fn probe(&mut self, mapping: &PeerMapping) -> bool {
        probe(mapping, &self.layout, self.rank)
    }

    const AGREES_IN_HOST_MEMORY: bool = true;
}

/// Whether this GPU's system-scope atomics on rank 0's staging (the arrival tickets) are
/// native; says why not at WARN.
pub fn tickets_are_atomic(device: &Device, records: &[SetupRecord]) -> bool {
    let Some(board_owner) = records.first() else {
        return false;
    };
    match device.native_atomics_with(&board_owner.device_uuid) {
        Ok(Some(true)) => true,
        Ok(Some(false)) => {
            log::warn!("this GPU has no native atomics on rank 0's GPU (a PCIe path without them): StragglAR stays off");
            false
        }
        Ok(None) => {
            log::warn!("rank 0's GPU is not visible to this process: StragglAR stays off");
            false
        }
        Err(e) => {
            log::warn!("peer atomics unknown: {e}: StragglAR stays off");
            false
        }
    }
}

/// Connects `rank` to the peers whose staging `mappings` opened (its own where `None`) and
/// whose failure words the gathered `records` name; each peer's failure word must read 0
/// (fresh). Says why not at WARN.
pub fn connect(
    rank: &mut CudaRank,
    mappings: &[Option<PeerMapping>],
    records: &[SetupRecord],
) -> bool {
    let layout = rank.layout();
    let me = rank.index();
    let mut failures = Vec::with_capacity(records.len());
    for (peer, record) in records.iter().enumerate() {
        if peer == me {
            failures.push(None);
            continue;
        }
        match FailureWord::open(rank.device(), &record.failure_word_name()) {
            Ok(word) if word.get() == 0 => failures.push(Some(word)),
            Ok(word) => {
                log::warn!(
                    "rank {peer} has already failed ({}): StragglAR stays off",
                    word.get()
                );
                return false;
            }
            Err(e) => {
                log::warn!("rank {peer}'s failure word: {e}: StragglAR stays off");
                return false;
            }
        }
    }
    let peers: Vec<_> = mappings
        .iter()
        .zip(&failures)
        .map(|(m, failure)| match (m, failure) {
            (Some(m), Some(failure)) => layout.peer(m.ptr, failure.device_address()),
            _ => rank.own_peer(),
        })
        .collect();
    if rank.connect(&peers, failures).is_err() {
        return false;
    }
    // The copy engine's round trip reached every peer; the kernels use the multiprocessors.
    let deadline = std::time::Instant::now() + GPU_PROBE_DEADLINE;
    match rank.probe_peers_on_the_gpu(PROBE_TOKEN | me as u32, deadline) {
        Ok(None) => true,
        Ok(Some(peer)) if peer == me => {
            log::warn!("this GPU's probe of its peers' memory gave no verdict within {GPU_PROBE_DEADLINE:?}: StragglAR stays off");
            false
        }
        Ok(Some(peer)) => {
            log::warn!("this GPU's own loads and atomics on rank {peer}'s memory do not see what its copy engine wrote there: StragglAR stays off");
            false
        }
        Err(e) => {
            log::warn!("the GPU's probe of its peers' memory: {e}: StragglAR stays off");
            false
        }
    }
}
