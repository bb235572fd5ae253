//! A rank's host-mapped abort and status words: what the host raises to end its kernels, and
//! what a kernel that gave up leaves there; and its failure word, which its peers' kernels read.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::engine::cuda::driver::HostWords;
use crate::engine::cuda::failure::FailureWord;
use crate::gpu::launch::STATUS_ABORTED;

/// Index of the abort word among a rank's host words.
pub(super) const ABORT_WORD: usize = 0;
/// Index of the status word.
pub(super) const STATUS_WORD: usize = 1;
/// Index of the word the setup's peer probe writes its verdict into.
pub(super) const PEER_PROBE_WORD: usize = 2;
/// Host words a rank keeps.
pub(super) const WORDS: usize = 3;

/// A rank's abort and status words (host-mapped) and its failure word, shareable across
/// threads.
#[derive(Clone)]
pub struct Control(pub(super) Arc<HostWords>, pub(super) Arc<FailureWord>);

impl Control {
    /// Raises the abort word.
    pub fn abort(&self) {
        self.0.word(ABORT_WORD).store(1, Ordering::Release);
    }

    /// Marks this rank failed where its peers' kernels look (a store into host memory: no
    /// driver call, so it works when the GPU context is lost).
    pub fn fail(&self) {
        self.1.set(STATUS_ABORTED);
    }

    /// The status a kernel of this rank left (0 while all is well).
    pub fn status(&self) -> u32 {
        self.0.word(STATUS_WORD).load(Ordering::Acquire)
    }

    /// Whether the abort word is raised.
    pub fn aborted(&self) -> bool {
        self.0.word(ABORT_WORD).load(Ordering::Acquire) != 0
    }
}
