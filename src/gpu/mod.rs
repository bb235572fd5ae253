//! The GPU room: everything that touches the CUDA driver or NVRTC (through cudarc, loaded
//! dynamically, so the library loads and forwards on machines without CUDA).

pub mod probe;
