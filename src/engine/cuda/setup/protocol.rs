//! The setup protocol: an all-gather of the records through the caller's exchange, then, after
//! every rank opened its peers' staging and tried a round trip through each mapping (and ran
//! the caller's own last checks), one word per rank saying whether that worked, agreed through
//! the peer access (host memory for the engine's accesses: `super::agreement`; the exchange
//! otherwise). Every rank takes both steps whatever happens locally, so no peer waits for one
//! that gave up.

use super::agreement::{agree_through_pages, AGREEMENT_DEADLINE};
use super::record::{
    peer_verdict, record_bytes, record_from, verdict, Devices, SetupRecord, Verdict,
    SETUP_RECORD_BYTES,
};
use crate::engine::cuda::driver::DeviceMemory;

/// The collective the setup runs through: the real communicator's AllGather in the library,
/// files in a directory between the bench's worker processes, a barrier between threads. Every rank calls it the same number of times.
pub trait Exchange {
    /// Gathers `mine` (the same length on every rank) from every rank, in rank order.
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, String>;
}

/// Reaching peers' staging (through CUDA IPC, or as plain pointers within one process), and
/// proving the mapping works.
pub trait PeerAccess {
    /// An open mapping (closed on drop).
    type Mapping;
    /// Makes this rank's `staging` reachable by its peers, before the first all-gather; what a
    /// peer needs beyond the record (nothing, for IPC: the record carries the handle).
    fn share(&mut self, _staging: &DeviceMemory) {}
    /// Opens `record`'s staging.
    fn open(&mut self, record: &SetupRecord) -> Result<Self::Mapping, String>;
    /// Writes through `mapping` and reads it back (a round trip to the peer's memory).
    fn probe(&mut self, mapping: &Self::Mapping) -> bool;
    /// Whether the second step goes through every rank's page in host memory (the pages its
    /// setup record names: `super::agreement`), as the engine's accesses take it; otherwise
    /// through an all-gather of the exchange.
    const AGREES_IN_HOST_MEMORY: bool = false;
}

/// The second step: every rank's flag (1: its local steps worked), the same on every rank,
/// this rank (`me`) saying `worked`.
fn agree<E: Exchange, P: PeerAccess>(
    exchange: &mut E,
    me: usize,
    worked: bool,
    records: &[SetupRecord],
) -> Result<Vec<u32>, String> {
    if P::AGREES_IN_HOST_MEMORY {
        let pages: Vec<String> = records.iter().map(SetupRecord::failure_word_name).collect();
        return Ok(agree_through_pages(me, worked, &pages, AGREEMENT_DEADLINE));
    }
    let flags = exchange.all_gather(&u32::from(worked).to_le_bytes())?;
    Ok(flags
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
        .collect())
}

/// Why a setup did not produce a working engine: the same verdict on every rank, or an
/// exchange that failed (NCCL's own error; the communicator is then unusable anyway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupError {
    Refused(Verdict),
    Exchange(String),
}

/// A communicator this rank joined: its peers' open mappings (`mappings[r]`, `None` for this
/// rank) and every rank's setup record.
#[derive(Debug)]
pub struct Joined<M> {
    pub mappings: Vec<Option<M>>,
    pub records: Vec<SetupRecord>,
}

/// Runs the setup protocol for this rank: all-gathers the records, computes the verdict,
/// opens every peer's staging and probes it, runs `finish` on the mappings and the gathered
/// records (the local steps that must succeed before the engine can run: connecting the peer
/// table, checking atomics on rank 0's GPU, ...), agrees with every rank on whether all that
/// worked ([`PeerAccess::AGREES_IN_HOST_MEMORY`]), and computes the final verdict. Every rank
/// takes the same steps whatever happens locally, so a local failure never leaves a peer
/// waiting.
pub fn run_setup<E: Exchange, P: PeerAccess>(
    exchange: &mut E,
    peers: &mut P,
    mine: &SetupRecord,
    devices: Devices,
    finish: impl FnOnce(&[Option<P::Mapping>], &[SetupRecord]) -> bool,
) -> Result<Joined<P::Mapping>, SetupError> {
    let size = SETUP_RECORD_BYTES;
    let gathered = exchange
        .all_gather(&record_bytes(mine))
        .map_err(SetupError::Exchange)?;
    if gathered.len() % size != 0 || gathered.is_empty() {
        return Err(SetupError::Exchange(format!(
            "the all-gather returned {} bytes",
            gathered.len()
        )));
    }
    let records: Vec<SetupRecord> = gathered.chunks(size).map(record_from).collect();
    let first = verdict(&records, devices);
    if first != Verdict::Eligible {
        return Err(SetupError::Refused(first));
    }
    let me = mine.rank as usize;
    // Whatever happens here, a panic included, this rank takes the second step too.
    let local = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut mappings: Vec<Option<P::Mapping>> = Vec::with_capacity(records.len());
        let mut ok = true;
        for (rank, record) in records.iter().enumerate() {
            if rank == me || !ok {
                mappings.push(None);
                continue;
            }
            match peers.open(record) {
                Ok(m) => {
                    ok = peers.probe(&m);
                    mappings.push(Some(m));
                }
                Err(_) => {
                    ok = false;
                    mappings.push(None);
                }
            }
        }
        let ok = ok && finish(&mappings, &records);
        (mappings, ok)
    }));
    let (mappings, ok) = local.unwrap_or_else(|_| {
        log::warn!("rank {me}: a panic while opening its peers' staging: it refuses the setup");
        ((0..records.len()).map(|_| None).collect(), false)
    });
    let flags = agree::<E, P>(exchange, me, ok, &records).map_err(SetupError::Exchange)?;
    match peer_verdict(&flags) {
        Verdict::Eligible => Ok(Joined { mappings, records }),
        refused => Err(SetupError::Refused(refused)),
    }
}

#[cfg(test)]
mod protocol_tests {
    use super::super::record::{Identity, LocalFailure, SETTINGS};
    use super::*;
    use crate::engine::cuda::exchange::ThreadExchange;
    use crate::engine::cuda::staging::StagingLayout;

    /// Peer access that fails for the pairs listed (from rank, to rank).
    struct FakePeers {
        rank: usize,
        broken: Vec<(usize, usize)>,
    }

    impl PeerAccess for FakePeers {
        type Mapping = usize;
        fn open(&mut self, record: &SetupRecord) -> Result<usize, String> {
            let to = record.rank as usize;
            if self.broken.contains(&(self.rank, to)) {
                Err("cuIpcOpenMemHandle failed".into())
            } else {
                Ok(to)
            }
        }
        fn probe(&mut self, _: &usize) -> bool {
            true
        }
    }

    fn run(
        n: usize,
        broken: Vec<(usize, usize)>,
        tweak: impl Fn(usize, &mut SetupRecord) + Sync,
    ) -> Vec<Result<Joined<usize>, SetupError>> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = ThreadExchange::group(n)
                .into_iter()
                .enumerate()
                .map(|(rank, mut exchange)| {
                    let broken = broken.clone();
                    let tweak = &tweak;
                    scope.spawn(move || {
                        let identity = Identity {
                            host: "node".into(),
                            boot_id: "boot".into(),
                            device_uuid: [rank as u8 + 1; 16],
                        };
                        let layout = StagingLayout {
                            arena_bytes: 4096,
                            values: 8,
                            blocks: 4,
                            ranks: n as u64,
                        };
                        let mut mine = SetupRecord::ready(
                            rank,
                            n,
                            &identity,
                            [7; SETTINGS],
                            [rank as u8; 64],
                            layout,
                        );
                        tweak(rank, &mut mine);
                        let mut peers = FakePeers { rank, broken };
                        run_setup(
                            &mut exchange,
                            &mut peers,
                            &mine,
                            Devices::OnePerRank,
                            |_, _| true,
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_rank_maps_every_peer_when_all_is_well() {
        for (rank, result) in run(5, vec![], |_, _| {}).into_iter().enumerate() {
            let mappings = result.unwrap().mappings;
            assert_eq!(mappings.len(), 5);
            for (peer, m) in mappings.iter().enumerate() {
                assert_eq!(*m, (peer != rank).then_some(peer));
            }
        }
    }

    #[test]
    fn a_local_failure_refuses_the_communicator_on_every_rank_alike() {
        let results = run(4, vec![], |rank, r| {
            if rank == 2 {
                *r = SetupRecord::failed(2, 4, LocalFailure::NoKernels);
            }
        });
        for result in results {
            assert_eq!(
                result.unwrap_err(),
                SetupError::Refused(Verdict::RankFailed {
                    rank: 2,
                    failure: 2
                })
            );
        }
    }

    #[test]
    fn one_unreachable_peer_refuses_it_everywhere_without_a_hang() {
        let results = run(4, vec![(3, 1)], |_, _| {});
        for result in results {
            assert_eq!(
                result.unwrap_err(),
                SetupError::Refused(Verdict::PeerAccessFailed { rank: 3 })
            );
        }
    }

    #[test]
    fn records_survive_the_byte_round_trip() {
        let identity = Identity {
            host: "h".into(),
            boot_id: "b".into(),
            device_uuid: [9; 16],
        };
        let layout = StagingLayout {
            arena_bytes: 1,
            values: 2,
            blocks: 3,
            ranks: 2,
        };
        let r = SetupRecord::ready(
            1,
            2,
            &identity,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            [8; 64],
            layout,
        )
        .with_failure_word("/stragglar-fail-77-3");
        let bytes = record_bytes(&r);
        assert_eq!(bytes.len(), SETUP_RECORD_BYTES);
        assert!(std::mem::size_of::<SetupRecord>() <= SETUP_RECORD_BYTES);
        let back = record_from(&bytes);
        assert_eq!(back, r);
        assert_eq!(back.failure_word_name(), "/stragglar-fail-77-3");
    }
}

#[cfg(test)]
mod finish_tests {
    use super::super::record::{Identity, SETTINGS};
    use super::*;
    use crate::engine::cuda::staging::StagingLayout;

    struct Solo;

    impl Exchange for Solo {
        fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
            Ok(mine.to_vec())
        }
    }

    impl PeerAccess for Solo {
        type Mapping = ();
        fn open(&mut self, _: &SetupRecord) -> Result<(), String> {
            Ok(())
        }
        fn probe(&mut self, _: &()) -> bool {
            true
        }
    }

    #[test]
    fn a_failed_local_step_is_gathered_not_skipped() {
        let identity = Identity {
            host: "h".into(),
            boot_id: "b".into(),
            device_uuid: [1; 16],
        };
        let layout = StagingLayout {
            arena_bytes: 64,
            values: 1,
            blocks: 1,
            ranks: 1,
        };
        let mine = SetupRecord::ready(0, 1, &identity, [0; SETTINGS], [0; 64], layout);
        assert!(
            run_setup(&mut Solo, &mut Solo, &mine, Devices::OnePerRank, |_, _| {
                true
            })
            .is_ok()
        );
        assert_eq!(
            run_setup(&mut Solo, &mut Solo, &mine, Devices::OnePerRank, |_, _| {
                false
            })
            .unwrap_err(),
            SetupError::Refused(Verdict::PeerAccessFailed { rank: 0 })
        );
    }
}
