//! Bookkeeping for the fast path: one record per communicator (what we know about it, its
//! counters, the PreMulSum ops created on it, the GPU engine's slot), and each thread's group
//! depth.
//!
//! Filled by the exported lifecycle functions after the real call returns, never by NCCL's own
//! internal calls (see `nccl::reentry`). Thread-safe: PyTorch's watchdog calls
//! `ncclCommGetAsyncError` and `ncclCommAbort` from another thread while the main thread
//! enqueues.

pub mod comm_config;
pub mod comms;
pub mod fallback;
pub mod groups;
pub mod identity;
pub mod names;
pub mod redops;
pub mod stats;

pub use comms::{CommInfo, CommOrigin, CommRecord, CommState, CommTable, EngineSlot};
pub use redops::{PreMulSum, Scalar};

use once_cell::sync::Lazy;

/// The process's communicators, one record each.
pub fn comms() -> &'static CommTable {
    static TABLE: Lazy<CommTable> = Lazy::new(CommTable::default);
    &TABLE
}
