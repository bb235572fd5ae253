//! The all-gathers the setup runs through: the real communicator's (a job's ranks), and a
//! barrier between threads of one process (the bench's thread ranks), and files in a directory
//! between processes (the bench's worker processes, the doctor's multicast check).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::driver::{self, Device, DeviceMemory};
use super::setup::Exchange;
use super::watch::SetupWatch;
use crate::nccl::types::{cudaStream_t, ncclComm_t, DataTypeCode, ResultCode};

/// The setup's AllGather through the real communicator, on the caller's stream.
pub struct NcclExchange<'a> {
    pub device: &'a Arc<Device>,
    pub watch: &'a SetupWatch,
    pub comm: ncclComm_t,
    pub stream: cudaStream_t,
    pub ranks: usize,
}

/// Device buffers of finished all-gathers, reused by later ones and never freed: freeing
/// device memory waits for every stream of the context (`cuMemFree`), and in a setup that could
/// wait for another thread's call whose peers are in setups of their own, each waiting for the
/// other. At most one buffer per setup running at once on a device.
static SCRATCH: Mutex<Vec<DeviceMemory>> = Mutex::new(Vec::new());

/// A scratch buffer of at least `bytes` on `device`, from [`SCRATCH`] or new.
fn take_scratch(device: &Arc<Device>, bytes: usize) -> Result<DeviceMemory, String> {
    let mut kept = SCRATCH.lock();
    match kept
        .iter()
        .position(|m| m.is_on(device) && m.bytes >= bytes)
    {
        Some(i) => Ok(kept.swap_remove(i)),
        None => DeviceMemory::for_upload(device, bytes).map_err(|e| e.to_string()),
    }
}

impl Exchange for NcclExchange<'_> {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        let len = mine.len();
        // This rank's bytes first, then the gathered ones.
        let scratch = take_scratch(self.device, len * (self.ranks + 1))?;
        let (own, gathered) = (scratch.ptr, scratch.ptr + len as u64);
        if let Err(e) = scratch.upload(mine) {
            SCRATCH.lock().push(scratch);
            return Err(e.to_string());
        }
        // SAFETY: `scratch` holds `len` bytes at `own` and `len * ranks` at `gathered` on the
        // communicator's device; the communicator is live (its teardown sets `forgotten` first
        // and waits for `polling`) and the stream is the caller's.
        let rc = unsafe {
            crate::nccl::real::all_gather(
                own as *const std::ffi::c_void,
                gathered as *mut std::ffi::c_void,
                len,
                DataTypeCode(1), // ncclUint8
                self.comm,
                self.stream,
            )
        };
        // A nonblocking communicator may still be launching it: nothing may follow on the
        // stream until NCCL's state settles.
        let launching = rc == ResultCode::IN_PROGRESS;
        let rc = match rc {
            ResultCode::IN_PROGRESS => {
                let watch = self.watch;
                let comm = self.comm;
                let poll = || {
                    let _polling = watch.polling.lock();
                    (!watch.forgotten()).then(|| crate::nccl::nonblocking::async_state(comm))
                };
                match crate::nccl::nonblocking::settle(poll) {
                    Some(state) => state,
                    None => {
                        // NCCL may still launch the all-gather into this buffer: it is
                        // abandoned, never reused or freed under it.
                        std::mem::forget(scratch);
                        return Err("the communicator was aborted or destroyed during setup".into());
                    }
                }
            }
            rc => rc,
        };
        if rc != ResultCode::SUCCESS {
            if launching {
                // NCCL may have queued the gather before it failed: the buffer is abandoned.
                std::mem::forget(scratch);
            } else {
                // NCCL refused the call: nothing was queued into the buffer.
                SCRATCH.lock().push(scratch);
            }
            return Err(format!("ncclAllGather returned {}", rc.0));
        }
        // SAFETY: the caller's live stream of this device's context.
        if let Err(e) = unsafe { driver::synchronize_raw(self.device, self.stream.cast()) } {
            // The gather may still be queued: the buffer is abandoned.
            std::mem::forget(scratch);
            return Err(e.to_string());
        }
        let mut all = vec![0u8; len * (self.ranks + 1)];
        let downloaded = scratch.download(&mut all).map_err(|e| e.to_string());
        SCRATCH.lock().push(scratch);
        downloaded?;
        Ok(all.split_off(len))
    }
}

/// An all-gather among threads of one process: each round, every rank deposits its bytes, waits
/// for the others, and takes the concatenation in rank order. A rank whose exchange is dropped
/// (its thread ended, by a panic too) fails the rounds that now cannot complete, so its peers
/// never wait for it.
pub struct ThreadExchange {
    rank: usize,
    shared: Arc<(Mutex<Rounds>, Condvar)>,
}

/// The state every rank's exchange shares.
struct Rounds {
    /// Rounds completed.
    generation: u64,
    /// Ranks that deposited their bytes in the current round.
    arrived: usize,
    slots: Vec<Vec<u8>>,
    /// The last completed round's concatenation.
    gathered: Vec<u8>,
    /// A rank whose exchange was dropped.
    left: Option<usize>,
}

impl ThreadExchange {
    /// One exchange per rank of a group of `ranks` threads.
    pub fn group(ranks: usize) -> Vec<ThreadExchange> {
        let rounds = Rounds {
            generation: 0,
            arrived: 0,
            slots: vec![Vec::new(); ranks],
            gathered: Vec::new(),
            left: None,
        };
        let shared = Arc::new((Mutex::new(rounds), Condvar::new()));
        (0..ranks)
            .map(|rank| ThreadExchange {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }
}

impl Exchange for ThreadExchange {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        let (lock, ready) = &*self.shared;
        let mut rounds = lock.lock();
        let gone = |left: usize| Err(format!("rank {left} left the exchange"));
        if let Some(left) = rounds.left {
            return gone(left);
        }
        rounds.slots[self.rank] = mine.to_vec();
        rounds.arrived += 1;
        let generation = rounds.generation;
        if rounds.arrived == rounds.slots.len() {
            rounds.gathered = rounds.slots.concat();
            rounds.arrived = 0;
            rounds.generation += 1;
            ready.notify_all();
            return Ok(rounds.gathered.clone());
        }
        while rounds.generation == generation && rounds.left.is_none() {
            ready.wait(&mut rounds);
        }
        match (rounds.generation == generation, rounds.left) {
            (true, Some(left)) => gone(left),
            // No rank can start the next round's completion before this one read the last.
            _ => Ok(rounds.gathered.clone()),
        }
    }
}

impl Drop for ThreadExchange {
    fn drop(&mut self) {
        let (lock, ready) = &*self.shared;
        lock.lock().left.get_or_insert(self.rank);
        ready.notify_all();
    }
}

/// How long a rank of a [`DirExchange`] waits for its peers' files in one round.
pub const DIR_RENDEZVOUS: Duration = Duration::from_secs(120);

/// An all-gather through files in a directory shared by the ranks' processes (the bench's
/// workers, `stragglar doctor --multicast processes`).
pub struct DirExchange<'a> {
    dir: &'a Path,
    rank: usize,
    ranks: usize,
    round: usize,
}

impl<'a> DirExchange<'a> {
    /// Rank `rank` of `ranks`, from the first round.
    pub fn new(dir: &'a Path, rank: usize, ranks: usize) -> Self {
        DirExchange {
            dir,
            rank,
            ranks,
            round: 0,
        }
    }

    fn path(&self, rank: usize) -> PathBuf {
        self.dir.join(format!("round-{}-rank-{rank}", self.round))
    }
}

impl Exchange for DirExchange<'_> {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        let temporary = self
            .dir
            .join(format!(".round-{}-rank-{}", self.round, self.rank));
        std::fs::write(&temporary, mine)
            .and_then(|()| std::fs::rename(&temporary, self.path(self.rank)))
            .map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let deadline = Instant::now() + DIR_RENDEZVOUS;
        let mut all = Vec::with_capacity(mine.len() * self.ranks);
        for rank in 0..self.ranks {
            loop {
                if let Ok(bytes) = std::fs::read(self.path(rank)) {
                    all.extend_from_slice(&bytes);
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("rank {rank} never joined round {}", self.round));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        self.round += 1;
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_gather_in_rank_order_and_a_rank_that_leaves_fails_the_round() {
        let gathered: Vec<Result<Vec<u8>, String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ThreadExchange::group(3)
                .into_iter()
                .map(|mut x| {
                    scope.spawn(move || {
                        let first = x.all_gather(&[x.rank as u8; 2])?;
                        if x.rank == 1 {
                            return Ok(first);
                        }
                        // Rank 1 is gone: this round cannot complete.
                        x.all_gather(&[9]).map(|second| [first, second].concat())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(gathered[1], Ok(vec![0, 0, 1, 1, 2, 2]));
        for rank in [0, 2] {
            assert_eq!(gathered[rank], Err("rank 1 left the exchange".to_string()));
        }
    }

    #[test]
    fn the_directory_exchange_gathers_in_rank_order() {
        let dir = std::env::temp_dir().join(format!("stragglar-dirx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let results: Vec<Vec<u8>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let dir = &dir;
                    scope.spawn(move || {
                        let mut x = DirExchange::new(dir, rank, 3);
                        let first = x.all_gather(&[rank as u8; 2]).unwrap();
                        let second = x.all_gather(&[10 + rank as u8]).unwrap();
                        [first, second].concat()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let _ = std::fs::remove_dir_all(&dir);
        for r in results {
            assert_eq!(r, vec![0, 0, 1, 1, 2, 2, 10, 11, 12]);
        }
    }
}
