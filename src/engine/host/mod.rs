//! The host engine: StragglAR AllReduce among processes (or threads) over shared memory.
//!
//! It is the CPU twin of the GPU engine and the reference its results are checked against.
//!
//! Protocol (see `plan` for the single-assignment model):
//! - every rank owns one shared segment: a header (pid, abort word, link-emulation clocks), two
//!   banks of flag words and two arenas, one of each per call parity;
//! - call `e` (epochs start at 1 and advance by one per call on every rank) uses bank and arena
//!   `e % 2`; a value's flag holds the low 32 bits of the epoch that wrote it; a reader waits
//!   until the flag equals its epoch, then reads (release/acquire);
//! - a rank starts call `e+1` only after finishing `e`, and can finish `e+1` only after every
//!   rank started it, so nothing of call `e` is overwritten while a peer may still read it;
//! - every wait spins briefly, then sleeps on a futex in slices, watching the abort words and
//!   the liveness of every peer that has not finished the call, and the deadline of
//!   `STRAGGLAR_TIMEOUT_MS`; a peer that finished the call may exit or abort freely.

pub mod comm;
pub mod fault;
pub mod futex;
pub mod link;
pub mod runner;
pub mod segment;
pub mod wait;

pub use comm::{Buffers, EngineError, HostComm, HostCommConfig};

#[cfg(test)]
mod tests;
