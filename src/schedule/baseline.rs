//! Schedules without a straggler (Ring, recursive halving-doubling) and Direct, in the same
//! round model so that they are verified and printed like StragglAR.

use super::ceil_log2;
use super::reduce_scatter;
use super::types::{Round, Transfer};

/// Ring AllReduce over `n` chunks: `n-1` rounds of ReduceScatter (rank `c` ends with chunk
/// `c`), then `n-1` rounds of AllGather in which rank `i` forwards chunk `(i - t) mod n`.
pub fn ring(ranks: usize) -> Vec<Round> {
    let n = ranks;
    let mut rounds = reduce_scatter::ring(n, 1);
    rounds.extend((0..n - 1).map(|t| {
        (0..n)
            .map(|i| Transfer::copy(i, (i + 1) % n, (i + n - t) % n))
            .collect::<Round>()
    }));
    rounds
}

/// Recursive halving-doubling over `n` chunks for a power of two `n = 2^L`.
///
/// Halving step `j` (`0..L`): rank `i` keeps the half of its block that contains chunk `i`
/// and reduces the other half into partner `i ^ 2^(L-j-1)`. Doubling mirrors it with copies.
/// The round model lets a rank send one chunk per round, so a step that moves `h` chunks is
/// written as `h` rounds with the same partner (`2(n-1)` rounds in all); the cost model charges
/// each step one latency, `2 log2 n` in all.
pub fn halving_doubling(ranks: usize) -> Vec<Round> {
    assert!(
        ranks.is_power_of_two(),
        "halving-doubling needs a power of two"
    );
    let levels = ceil_log2(ranks);
    let step_rounds = |j: usize, op_copy: bool| {
        let bit = 1usize << (levels - j - 1);
        (0..bit).map(move |q| {
            (0..ranks)
                .map(|i| {
                    let block = i >> (levels - j) << (levels - j);
                    // Reduce: send the half that is not ours. Copy: send ours.
                    let half = if op_copy { i & bit } else { !i & bit };
                    let chunk = block | half | q;
                    let partner = i ^ bit;
                    if op_copy {
                        Transfer::copy(i, partner, chunk)
                    } else {
                        Transfer::reduce(i, partner, chunk)
                    }
                })
                .collect::<Round>()
        })
    };
    let mut rounds: Vec<Round> = (0..levels).flat_map(|j| step_rounds(j, false)).collect();
    rounds.extend((0..levels).rev().flat_map(|j| step_rounds(j, true)));
    rounds
}

/// Direct, over one chunk (the whole buffer), in logical ranks. Before arrival: a binomial
/// reduction of the `n-1` early ranks into logical rank 0. After: rank 0 and the straggler
/// exchange the buffer, then every holder copies it to a rank that lacks it
/// (`ceil(log2 n)` rounds after arrival).
pub fn direct(ranks: usize) -> (Vec<Round>, Vec<Round>) {
    let early = ranks - 1;
    let straggler = ranks - 1;
    let before = (0..ceil_log2(early))
        .map(|j| {
            let stride = 1usize << j;
            (0..early)
                .filter(|i| i % (2 * stride) == stride)
                .map(|i| Transfer::reduce(i, i - stride, 0))
                .collect::<Round>()
        })
        .collect();
    let mut after = vec![vec![
        Transfer::reduce(0, straggler, 0),
        Transfer::reduce(straggler, 0, 0),
    ]];
    let mut holders = vec![0, straggler];
    let mut lacking = (1..early).collect::<Vec<_>>();
    while !lacking.is_empty() {
        let take = holders.len().min(lacking.len());
        let new: Vec<usize> = lacking.drain(..take).collect();
        after.push(
            holders
                .iter()
                .zip(&new)
                .map(|(&src, &dst)| Transfer::copy(src, dst, 0))
                .collect(),
        );
        holders.extend(new);
    }
    (before, after)
}
