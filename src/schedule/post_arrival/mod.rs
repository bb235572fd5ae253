//! The post-arrival phase of StragglAR: the straggler exchanges one piece per round with its
//! owner, and copies spread every final piece to every rank.
//!
//! Everything here is in logical ranks: `0..n-1` are the early ranks, `n-1` is the straggler.
//! Two synthesizers share one exchange order ([`ExchangeOrder`]): the power-of-two
//! construction of docs/ALGORITHM.md 3.1 ([`doubling`]) and a list scheduler for every other `n`
//! ([`greedy`]).

pub mod doubling;
pub mod greedy;
mod tuned;

use super::types::{Round, Transfer};

/// The order in which the straggler meets the others. Exchange `v` (`0..count()`) happens in
/// round `v` with logical rank `v % (n-1)` and is about piece `v / (n-1)` of chunk `v % (n-1)`:
/// with `k` pieces per chunk the straggler sweeps the early ranks `k` times, and the schedule
/// keeps running in steady state across sweeps (docs/ALGORITHM.md section 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExchangeOrder {
    ranks: usize,
    pieces_per_chunk: usize,
}

impl ExchangeOrder {
    /// The order for `ranks >= 2` ranks and `pieces_per_chunk >= 1`.
    pub fn new(ranks: usize, pieces_per_chunk: usize) -> Self {
        assert!(ranks >= 2 && pieces_per_chunk >= 1);
        ExchangeOrder {
            ranks,
            pieces_per_chunk,
        }
    }

    /// Number of ranks, straggler included.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The straggler's logical rank, `n-1`.
    pub fn straggler(&self) -> usize {
        self.ranks - 1
    }

    /// Number of exchanges, `(n-1) * k`: one per piece.
    pub fn count(&self) -> usize {
        (self.ranks - 1) * self.pieces_per_chunk
    }

    /// The early rank met in exchange `v`.
    pub fn owner(&self, v: usize) -> usize {
        v % (self.ranks - 1)
    }

    /// The chunk index (`c * k + p`) of the piece exchanged in exchange `v`.
    pub fn piece(&self, v: usize) -> usize {
        let m = self.ranks - 1;
        (v % m) * self.pieces_per_chunk + v / m
    }

    /// The first round `>= from` in which the straggler meets early rank `rank`, if any.
    pub fn next_meeting(&self, rank: usize, from: usize) -> Option<usize> {
        let m = self.ranks - 1;
        let next = from + (rank + m - from % m) % m;
        (next < self.count()).then_some(next)
    }

    /// The two reductions of exchange `v`: owner to straggler and straggler to owner.
    pub fn exchange(&self, v: usize) -> [Transfer; 2] {
        let (owner, s, piece) = (self.owner(v), self.straggler(), self.piece(v));
        [
            Transfer::reduce(owner, s, piece),
            Transfer::reduce(s, owner, piece),
        ]
    }

    /// A copy of the piece of exchange `v`.
    pub fn copy(&self, src: usize, dst: usize, v: usize) -> Transfer {
        Transfer::copy(src, dst, self.piece(v))
    }
}

/// The post-arrival rounds for `ranks >= 2` and `pieces_per_chunk >= 1`, in logical ranks:
/// the construction of 3.1 for powers of two, the tuned list scheduler otherwise.
pub fn synthesize(ranks: usize, pieces_per_chunk: usize) -> Vec<Round> {
    let order = ExchangeOrder::new(ranks, pieces_per_chunk);
    if ranks.is_power_of_two() {
        doubling::build(&order)
    } else {
        greedy::build(&order, tuned::variant(ranks))
    }
}
