//! Tie-breaking variants of the list scheduler, chosen offline per `n` by running it with
//! seeds `0..` and both piece orders and keeping the first variant with the fewest rounds
//! (the search stopped at the bound). Every entry is re-verified by the tests in
//! `tests/schedule_synthesis.rs`, which replay the schedule of every `n` in `2..=256`.

use super::greedy::Variant;

/// Variant codes for `n = 3..=256`: `seed << 1 | newest_first`. Entries at powers of two are
/// unused (those `n` use the doubling construction).
const CODES: [u16; 254] = [
    1, 0, 1, 1, 3, 0, 1, 1, 3, 3, 5, 5, 1, 0, 1, 1, 3, 5, 3, 3, 7, 5, 1, 7, 1, 293, 1, 1, 3, 0, 3,
    3, 3, 3, 5, 3, 5, 7, 25, 5, 73, 7, 133, 71, 1, 213, 1, 3, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 0, 3, 3, 3, 3, 3, 3, 5, 7, 5, 11, 13, 5, 11, 15, 37, 1, 3, 119, 3, 3, 3, 3, 7, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 5, 3, 3, 3, 3, 5, 3, 3, 3, 3, 3, 9, 3, 3, 3, 3, 3, 3, 5, 7, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 0, 3, 3, 3, 7, 3, 5, 3, 3, 5, 3, 3, 3, 9, 11, 7, 9, 3, 5, 3, 3, 5, 23, 3, 5, 3, 3,
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 5, 3, 3, 3, 3, 3, 5, 3, 3, 3, 3, 5, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 7, 3, 3, 3, 3, 3, 5, 3, 3, 3, 3, 3, 3, 3, 3, 3, 5, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 9, 3, 3, 0,
];

/// The variant used for `ranks` ranks; beyond the table, seed 1 with the newest pieces first.
pub fn variant(ranks: usize) -> Variant {
    match ranks.checked_sub(3).and_then(|i| CODES.get(i)) {
        Some(&code) => Variant {
            seed: u64::from(code >> 1),
            newest_first: code & 1 == 1,
        },
        None => Variant {
            seed: 1,
            newest_first: true,
        },
    }
}
