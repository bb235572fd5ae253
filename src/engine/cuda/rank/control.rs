//! A rank's host-mapped abort and status words: what the host raises to end its kernels, and
//! what a kernel that gave up leaves there.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::engine::cuda::driver::HostWords;

/// Index of the abort word among a rank's host words.
pub(super) const ABORT_WORD: usize = 0;
/// Index of the status word.
pub(super) const STATUS_WORD: usize = 1;

/// A rank's abort and status words (host-mapped), shareable across threads.
#[derive(Clone)]
pub struct Control(pub(super) Arc<HostWords>);

impl Control {
    /// Raises the abort word.
    pub fn abort(&self) {
        self.0.word(ABORT_WORD).store(1, Ordering::Release);
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
