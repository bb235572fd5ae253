//! The GPU engine: the plans of `crate::plan` executed by our kernel (`cuda/`) over staging
//! allocations the ranks share (CUDA IPC between processes, plain device pointers between
//! threads of one process).

pub mod args;
pub mod attach;
pub mod budget;
pub mod comm;
pub mod driver;
pub mod library;
pub mod nvls;
pub mod rank;
pub mod setup;
pub mod staging;
