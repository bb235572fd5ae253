//! The GPU engine: the plans of `crate::plan` executed by our kernel (`cuda/`) over staging
//! allocations the ranks share (CUDA IPC between processes, plain device pointers between
//! threads of one process).

pub mod arena;
pub mod args;
pub mod assemble;
pub mod attach;
pub mod branch;
pub mod budget;
pub mod call;
pub mod comm;
pub mod driver;
pub mod exchange;
pub mod failure;
pub mod gpus;
pub mod grid;
pub mod growth;
pub mod library;
pub mod multicast;
pub mod nvls;
pub mod observe;
pub mod peers;
pub mod rank;
pub mod setup;
pub mod sizing;
pub mod staging;
pub mod vmm;
pub mod watch;
