//! Engines that execute plans: `host` (processes or threads over shared memory) and `cuda`
//! (our kernels over CUDA staging memory). Both run the same plans and the same protocol.

pub mod cuda;
pub mod host;
