//! The pre-arrival phase: a ring ReduceScatter among the `n-1` early ranks.

use super::types::{Round, Transfer};

/// Ring ReduceScatter among logical ranks `0..early` over `early * k` chunks (`k` pieces per
/// chunk, piece `p` of chunk `c` is `c * k + p`): `(early - 1) * k` rounds after which rank `c`
/// holds every piece of chunk `c` reduced over all `early` ranks. In round `t * k + p`, rank
/// `i` reduces piece `p` of chunk `(i - t - 1) mod early` into rank `i + 1`.
pub fn ring(early: usize, pieces_per_chunk: usize) -> Vec<Round> {
    let k = pieces_per_chunk;
    (0..early.saturating_sub(1))
        .flat_map(|step| (0..k).map(move |piece| (step, piece)))
        .map(|(step, piece)| {
            (0..early)
                .map(|i| {
                    let chunk = (i + 2 * early - step - 1) % early;
                    Transfer::reduce(i, (i + 1) % early, chunk * k + piece)
                })
                .collect()
        })
        .collect()
}
