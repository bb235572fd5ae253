//! Persistent-straggler tracking and the per-call policy, as pure functions of arrival records.
//! Pure: std only, no FFI, no global state.
//!
//! Every rank feeds its [`Detector`] the same records (each call's arrivals, read from the
//! engine's own shared clocks once the call is complete), applies the same deterministic rule
//! and therefore designates the same straggler and chooses the same algorithm for every call,
//! without exchanging anything extra.

#![forbid(unsafe_code)]

pub mod classes;
pub mod estimate;
pub mod finish;
pub mod pipeline;
pub mod policy;
pub mod rule;
pub mod tally;
pub mod tracker;

pub use classes::size_class;
pub use finish::{Finish, MulticastMode};
pub use policy::{Choice, Policy};
pub use rule::{ArrivalRecord, Detector, DetectorConfig};
pub use tally::ArrivalTally;
pub use tracker::{Observed, Tracker};
