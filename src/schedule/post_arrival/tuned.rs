//! Tie-breaking variants of the list scheduler, chosen offline per `n`: first seeds `0..` with
//! both piece orders and no noise, then, where that stayed one round over the bound, seeds with
//! noise 1..=3; the first variant with the fewest rounds was kept (the search stopped at the
//! bound). Every entry is re-verified by the tests in
//! `tests/schedule_synthesis.rs`, which replay the schedule of every `n` in `2..=256`.

use super::greedy::Variant;

/// Variant codes for `n = 3..=256`: `seed << 3 | noise << 1 | newest_first`. Entries at powers of two are
/// unused (those `n` use the doubling construction).
const CODES: [u32; 254] = [
    1, 0, 1, 1, 9, 0, 1, 1, 9, 9, 17, 17, 567, 0, 1, 1, 9, 17, 9, 9, 25, 17, 475, 25, 22149, 1169,
    1, 1, 9, 0, 9, 9, 9, 9, 17, 9, 17, 25, 97, 17, 289, 25, 529, 281, 1, 849, 1, 9, 1, 9, 9, 9, 9,
    9, 9, 9, 9, 9, 9, 9, 9, 0, 9, 9, 9, 9, 9, 9, 17, 25, 17, 41, 49, 17, 41, 57, 145, 839, 9, 473,
    9, 9, 9, 9, 25, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 17, 9, 9, 9, 9, 17, 9, 9, 9, 9, 9, 33, 9, 9, 9,
    9, 9, 9, 17, 25, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 0, 9, 9, 9, 25, 9, 17, 9, 9, 17, 9, 9, 9, 33,
    41, 25, 33, 9, 17, 9, 9, 17, 89, 9, 17, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 17, 9, 9, 9, 9, 9,
    17, 9, 9, 9, 9, 17, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 25, 9, 9, 9, 9, 9, 17, 9,
    9, 9, 9, 9, 9, 9, 9, 9, 17, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9,
    9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 33, 9, 9, 0,
];

/// The variant used for `ranks` ranks; beyond the table, seed 1 with the newest pieces first.
pub fn variant(ranks: usize) -> Variant {
    match ranks.checked_sub(3).and_then(|i| CODES.get(i)) {
        Some(&code) => Variant {
            seed: u64::from(code >> 3),
            noise: (code >> 1 & 3) as u8,
            newest_first: code & 1 == 1,
        },
        None => Variant {
            seed: 1,
            noise: 0,
            newest_first: true,
        },
    }
}
