//! stragglar: a drop-in NCCL whose AllReduce uses the wait for a persistent straggler.
//!
//! Rooms, from pure to impure:
//! - `schedule`: StragglAR and baseline schedules, the replay verifier, the cost model (std only);
//! - `detect`: straggler tracking and the per-call policy, from arrival records (pure);
//! - `config`, `logging`, `clock`: `STRAGGLAR_*` settings, NCCL-shaped log lines, the shared
//!   monotonic clock;
//! - `gpu`: the CUDA driver and NVRTC (cudarc, loaded dynamically), the kernel sources;
//! - `engine`: executing plans (the host engine over shared memory, the GPU engine);
//! - `nccl`: finding and binding the real NCCL, and its C types;
//! - `plan`: schedules lowered to per-rank programs, and their `#[repr(C)]` encoding (pure);
//! - `reduce`: element-wise reduction of every NCCL data type and op (pure);
//! - `registry`: what we know about communicators, ops and groups;
//! - `intercept`: the route of each `ncclAllReduce`;
//! - `trace`: per-rank Chrome traces of AllReduce calls (`STRAGGLAR_TRACE_DIR`);
//! - `abi`: the exported C functions;
//! - `cli`: the `stragglar` tool.

pub mod abi;
pub mod cli;
pub mod clock;
pub mod config;
pub mod detect;
pub mod engine;
pub mod gpu;
pub mod intercept;
pub mod logging;
pub mod nccl;
pub mod plan;
pub mod reduce;
pub mod registry;
pub mod schedule;
pub mod trace;
