//! Bookkeeping for the fast path: what we know about each communicator, the PreMulSum ops
//! created on it, and each thread's group depth.
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
pub mod redops;
pub mod stats;

pub use comms::{CommInfo, CommOrigin, CommState, CommTable};
pub use redops::{PreMulSum, RedOpTable, Scalar};

use once_cell::sync::Lazy;

/// The process's communicators.
pub fn comms() -> &'static CommTable {
    static TABLE: Lazy<CommTable> = Lazy::new(CommTable::default);
    &TABLE
}

/// The process's per-communicator AllReduce counters.
pub fn stats() -> &'static stats::StatsTable {
    static TABLE: Lazy<stats::StatsTable> = Lazy::new(stats::StatsTable::default);
    &TABLE
}

/// The process's PreMulSum ops.
pub fn redops() -> &'static RedOpTable {
    static TABLE: Lazy<RedOpTable> = Lazy::new(RedOpTable::default);
    &TABLE
}
