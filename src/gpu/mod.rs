//! The GPU room: everything that touches the CUDA driver or NVRTC (through cudarc, loaded
//! dynamically, so the library loads and forwards on machines without CUDA).

pub mod arrival;
pub mod choice;
pub mod cubin;
pub mod kernels;
pub mod launch;
pub mod nvrtc;
pub mod nvrtc_search;
pub mod probe;
