//! Engines that execute plans: `host` (processes or threads over shared memory), and later
//! `cuda` (CUDA IPC and our kernels). Both run the same plans and the same protocol.

pub mod host;
