//! What a communicator's entry in the library lends its setup while it runs: whether the
//! communicator was aborted or destroyed meanwhile, and the rank's control words once they exist.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::rank::Control;

/// What the communicator's entry lends its setup: whether the communicator was aborted or
/// destroyed meanwhile, and the lock that keeps NCCL from freeing it during a state query.
pub struct SetupWatch {
    /// Set by `forget`: a setup still running must not install its result.
    pub forgotten: AtomicBool,
    /// Held across a setup's check of `forgotten` and its query of NCCL's state, and taken by
    /// `forget` after setting `forgotten`: no query runs on a communicator NCCL is freeing.
    pub polling: Mutex<()>,
    /// The rank's abort and status words, once its staging exists.
    pub control: Mutex<Option<Control>>,
    /// Where the engine publishes its designation (the rank, or -1).
    pub designated: Arc<AtomicI64>,
}

impl Default for SetupWatch {
    fn default() -> SetupWatch {
        SetupWatch {
            forgotten: AtomicBool::new(false),
            polling: Mutex::new(()),
            control: Mutex::new(None),
            designated: Arc::new(AtomicI64::new(-1)),
        }
    }
}

impl SetupWatch {
    pub fn forgotten(&self) -> bool {
        self.forgotten.load(Ordering::Acquire)
    }
}
