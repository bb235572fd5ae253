//! StragglAR and baseline schedules, the replay verifier and the alpha-beta cost model.
//! Pure: std only, no FFI, no global state.
//!
//! A [`Schedule`] is plain data: `ranks` GPUs, an optional straggler (physical rank), a number
//! of chunks, and phases made of rounds of [`Transfer`]s between physical ranks. Schedules are
//! built in *logical* ranks (the straggler is logical rank `n-1`, the others keep their order)
//! and relabelled once, by [`Relabel`], when they are assembled. [`verify`] replays any
//! schedule and checks every rule of the round model; [`model`] prices them.
//!
//! Entry point: [`Algorithm::schedule`].

#![forbid(unsafe_code)]

mod algorithm;
mod baseline;
mod contributions;
mod json;
pub mod model;
mod multicast;
pub mod post_arrival;
mod reduce_scatter;
mod relabel;
mod replay;
mod types;

pub use algorithm::{
    max_pieces_per_chunk, Algorithm, PlanError, PlanRequest, MAX_RANKS, MAX_TRANSFERS,
};
pub use contributions::Contributions;
pub use json::to_json;
pub use relabel::Relabel;
pub use replay::{verify, Replay, VerifyError};
pub use types::{Op, Phase, PhaseKind, Round, Schedule, Transfer};

/// `ceil(log2 n)` for `n >= 1` (0 for `n = 1`).
pub fn ceil_log2(n: usize) -> usize {
    (usize::BITS - n.saturating_sub(1).leading_zeros()) as usize
}

/// The lower bound on post-arrival rounds for `n >= 2` ranks: `n - 2 + ceil(log2 n)`
/// (docs/ALGORITHM.md section 3). With `pieces_per_chunk = k` the straggler exchanges `(n-1)k`
/// pieces, so the bound becomes `(n-1)k - 1 + ceil(log2 n)`.
pub fn round_bound(ranks: usize, pieces_per_chunk: usize) -> usize {
    (ranks - 1) * pieces_per_chunk - 1 + ceil_log2(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_log2_and_bound() {
        assert_eq!(
            (1..=9).map(ceil_log2).collect::<Vec<_>>(),
            [0, 1, 2, 2, 3, 3, 3, 3, 4]
        );
        assert_eq!(round_bound(2, 1), 1);
        assert_eq!(round_bound(8, 1), 9);
        assert_eq!(round_bound(6, 1), 7);
        assert_eq!(round_bound(192, 1), 198);
        assert_eq!(round_bound(8, 4), 30);
    }
}
