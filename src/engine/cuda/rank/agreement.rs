//! Agreement among the ranks on the host, through the page beside each rank's failure word
//! (`super::super::failure`): a rank writes its answer of a round there, then waits for every
//! peer's. The arenas' growth and the captures of NCCL's work behind a conditional node use it.

use std::time::{Duration, Instant};

use super::{CallError, CudaRank};
use crate::engine::cuda::failure::FailureWord;
use crate::gpu::launch::{STATUS_ABORTED, STATUS_PEER_FAILED, STATUS_TIMEOUT};

impl CudaRank {
    /// `Err` when this rank was aborted or failed, or a peer failed (its failure word).
    pub fn nobody_failed(&self) -> Result<(), CallError> {
        if self.control().aborted() {
            return Err(CallError::Failed(STATUS_ABORTED));
        }
        for r in 0..self.ranks() {
            let word = match r == self.index() {
                true => Some(self.failure_word()),
                false => self.peer_failure(r),
            };
            match word.map(FailureWord::get) {
                None => {
                    return Err(CallError::Unfit(format!(
                        "rank {r}'s failure word is not mapped"
                    )))
                }
                Some(0) => {}
                Some(status) if r == self.index() => return Err(CallError::Failed(status)),
                Some(_) => return Err(CallError::Failed(STATUS_PEER_FAILED)),
            }
        }
        Ok(())
    }

    /// What `read` finds in every rank's page (this rank's own included), once each has
    /// written it: polls until then, and fails when a rank's failure word is set (every rank's
    /// is looked at on every pass), this rank's abort word is raised, or `deadline` passes.
    pub fn wait_for_every_rank<T>(
        &self,
        deadline: Option<Instant>,
        read: impl Fn(&FailureWord) -> Option<T>,
    ) -> Result<Vec<T>, CallError> {
        let me = self.index();
        let mut pause = Duration::from_micros(20);
        loop {
            self.nobody_failed()?;
            let found: Option<Vec<T>> = (0..self.ranks())
                .map(|r| match r == me {
                    true => read(self.failure_word()),
                    false => self.peer_failure(r).and_then(&read),
                })
                .collect();
            if let Some(found) = found {
                return Ok(found);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(CallError::Failed(STATUS_TIMEOUT));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}
