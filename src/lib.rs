//! stragglar: a drop-in NCCL whose AllReduce uses the wait for a persistent straggler.
//!
//! Rooms, from pure to impure: `schedule` (schedules, verifier, cost model; std only),
//! `nccl` (the real library and its C types), `abi` (the exported C functions), `cli`.

pub mod cli;
pub mod schedule;
