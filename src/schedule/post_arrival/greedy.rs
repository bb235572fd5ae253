//! A list scheduler for the post-arrival phase at any `n`: each round, active pieces from the
//! oldest on are handed from free holders to free ranks that lack them, ranks that meet the
//! straggler soonest first (they must hold the oldest pieces before they are busy).
//!
//! Valid for every `n >= 2` and every exchange order by construction; how close it comes to
//! the bound depends on tie-breaking, which [`Variant`] fixes (see `tuned.rs`).

use super::ExchangeOrder;
use crate::schedule::types::Round;

/// The tie-breaking of one run; every variant yields a valid schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Seed for tie-breaking among equally ranked senders and receivers; 0 breaks ties by rank.
    pub seed: u64,
    /// Ranks that meet the straggler within this many rounds are served before the others.
    pub window: usize,
}

/// A small deterministic generator (splitmix64).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        if self.0 == 0 {
            return 0;
        }
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Which ranks hold which exchanged pieces, as one bitset per rank.
struct Holdings {
    words: usize,
    bits: Vec<u64>,
}

impl Holdings {
    fn new(ranks: usize, pieces: usize) -> Self {
        let words = pieces.div_ceil(64);
        Holdings {
            words,
            bits: vec![0; ranks * words],
        }
    }

    fn has(&self, rank: usize, v: usize) -> bool {
        self.bits[rank * self.words + v / 64] >> (v % 64) & 1 == 1
    }

    fn add(&mut self, rank: usize, v: usize) {
        self.bits[rank * self.words + v / 64] |= 1 << (v % 64);
    }
}

/// Builds the rounds for `order` with tie-breaking `variant`.
pub fn build(order: &ExchangeOrder, variant: Variant) -> Vec<Round> {
    let n = order.ranks();
    let m = n - 1;
    let straggler = order.straggler();
    let exchanges = order.count();
    let mut holds = Holdings::new(n, exchanges);
    let mut holder_count = vec![0usize; exchanges];
    let mut active: Vec<usize> = Vec::new();
    let mut mix = Mix(variant.seed);
    let mut rounds = Vec::new();
    let mut round = 0;
    while round < exchanges || !active.is_empty() {
        let mut transfers = Vec::new();
        let mut sending = vec![false; n];
        let mut receiving = vec![false; n];
        if round < exchanges {
            transfers.extend(order.exchange(round));
            for rank in [order.owner(round), straggler] {
                sending[rank] = true;
                receiving[rank] = true;
            }
        }
        // Receivers: soonest meeting first within the window, then those missing the most.
        let missing =
            |rank: usize, holds: &Holdings| active.iter().filter(|&&v| !holds.has(rank, v)).count();
        let mut receivers: Vec<(usize, usize, u64, usize)> = (0..m)
            .filter(|&r| !receiving[r])
            .map(|r| {
                let wait = (r + m - (round + 1) % m) % m + 1;
                let urgent = round + wait < exchanges && wait <= variant.window;
                let key = if urgent { wait } else { variant.window + 1 };
                (key, n - missing(r, &holds), mix.next(), r)
            })
            .collect();
        receivers.sort_unstable();
        // Senders: those holding the fewest active pieces first, keeping versatile ones free.
        let mut senders: Vec<(usize, u64, usize)> = (0..n)
            .filter(|&r| !sending[r])
            .map(|r| {
                let held = active.iter().filter(|&&v| holds.has(r, v)).count();
                (held, mix.next(), r)
            })
            .collect();
        senders.sort_unstable();
        let mut received = Vec::new();
        for &v in &active {
            let lacking: Vec<usize> = receivers
                .iter()
                .map(|&(.., r)| r)
                .filter(|&r| !receiving[r] && !holds.has(r, v))
                .collect();
            let mut dsts = lacking.into_iter();
            for &(.., src) in &senders {
                if sending[src] || !holds.has(src, v) {
                    continue;
                }
                let Some(dst) = dsts.next() else { break };
                sending[src] = true;
                receiving[dst] = true;
                transfers.push(order.copy(src, dst, v));
                received.push((dst, v));
            }
        }
        for (dst, v) in received {
            holds.add(dst, v);
            holder_count[v] += 1;
        }
        if round < exchanges {
            holds.add(order.owner(round), round);
            holds.add(straggler, round);
            holder_count[round] = 2;
            active.push(round);
        }
        active.retain(|&v| holder_count[v] < n);
        rounds.push(transfers);
        round += 1;
    }
    rounds
}
