//! The all-gathers the setup runs through: the real communicator's (a job's ranks), and a
//! barrier between threads of one process (the bench's thread ranks). The bench's worker
//! processes gather through files (`cli::bench::cuda::ipc`).

use std::sync::{Arc, Barrier};

use parking_lot::Mutex;

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

/// An all-gather among threads of one process: each round, every rank deposits its bytes,
/// waits for the others, and takes the concatenation in rank order.
pub struct ThreadExchange {
    rank: usize,
    slots: Arc<Mutex<Vec<Vec<u8>>>>,
    barrier: Arc<Barrier>,
}

impl ThreadExchange {
    /// One exchange per rank of a group of `ranks` threads.
    pub fn group(ranks: usize) -> Vec<ThreadExchange> {
        let slots = Arc::new(Mutex::new(vec![Vec::new(); ranks]));
        let barrier = Arc::new(Barrier::new(ranks));
        (0..ranks)
            .map(|rank| ThreadExchange {
                rank,
                slots: slots.clone(),
                barrier: barrier.clone(),
            })
            .collect()
    }
}

impl Exchange for ThreadExchange {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        self.slots.lock()[self.rank] = mine.to_vec();
        self.barrier.wait();
        let all = self.slots.lock().concat();
        self.barrier.wait();
        Ok(all)
    }
}
