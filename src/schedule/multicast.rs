//! Multicast StragglAR, in logical ranks (the straggler is `n-1`): after the early ranks' ring
//! ReduceScatter, rank `c` holds chunk `c` reduced over every early rank (`P`'s chunk `c`).
//! Before the straggler arrives each owner reduces its chunk into the straggler's memory; when
//! it arrives, the straggler holds every chunk complete (its input `X` combined with `P`,
//! once, by one rank) and multicasts each to every early rank, who copy it. Every rank's
//! output is the same bits by construction; after arrival the straggler sends `M` bytes once
//! and every early rank receives `M`.

use super::types::{Round, Transfer};

/// The gather: owner `c` reduces chunk `c` into the straggler, one chunk per round (the
/// straggler receives one per round).
pub fn gather(ranks: usize) -> Vec<Round> {
    let straggler = ranks - 1;
    (0..straggler)
        .map(|chunk| vec![Transfer::reduce(chunk, straggler, chunk)])
        .collect()
}

/// After arrival: the straggler multicasts each complete chunk to every early rank, one chunk
/// per round.
pub fn broadcast(ranks: usize) -> Vec<Round> {
    let straggler = ranks - 1;
    (0..straggler)
        .map(|chunk| {
            (0..straggler)
                .map(|rank| Transfer::copy(straggler, rank, chunk))
                .collect()
        })
        .collect()
}
