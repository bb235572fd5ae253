//! The all-gathers the setup runs through: the real communicator's (a job's ranks), and a
//! barrier between threads of one process (the bench's thread ranks). The bench's worker
//! processes gather through files (`cli::bench::cuda::ipc`).

use std::sync::Arc;

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

impl Exchange for NcclExchange<'_> {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        let len = mine.len();
        let buffer =
            DeviceMemory::zeroed(self.device, len * self.ranks).map_err(|e| e.to_string())?;
        let own = DeviceMemory::zeroed(self.device, len).map_err(|e| e.to_string())?;
        own.upload(mine).map_err(|e| e.to_string())?;
        // SAFETY: `own` holds `len` bytes and `buffer` `len * ranks` on the communicator's
        // device; the communicator is live (its teardown sets `forgotten` first and waits for
        // `polling`) and the stream is the caller's.
        let rc = unsafe {
            crate::nccl::real::all_gather(
                own.ptr as *const std::ffi::c_void,
                buffer.ptr as *mut std::ffi::c_void,
                len,
                DataTypeCode(1), // ncclUint8
                self.comm,
                self.stream,
            )
        };
        // A nonblocking communicator may still be launching it: nothing may follow on the
        // stream until NCCL's state settles.
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
                        // NCCL may still launch the all-gather into these buffers: they are
                        // abandoned, never freed under it.
                        std::mem::forget(buffer);
                        std::mem::forget(own);
                        return Err("the communicator was aborted or destroyed during setup".into());
                    }
                }
            }
            rc => rc,
        };
        if rc != ResultCode::SUCCESS {
            return Err(format!("ncclAllGather returned {}", rc.0));
        }
        // SAFETY: the caller's live stream of this device's context.
        unsafe { driver::synchronize_raw(self.device, self.stream.cast()) }
            .map_err(|e| e.to_string())?;
        let mut all = vec![0u8; len * self.ranks];
        buffer.download(&mut all).map_err(|e| e.to_string())?;
        Ok(all)
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
}
