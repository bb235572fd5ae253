//! A list scheduler for the post-arrival phase at any `n`.
//!
//! Each round, after the exchange, free ranks that lack active pieces are served, those that
//! lack the most first (up to optional noise); pieces are taken newest (or oldest) first from
//! free holders, those holding the fewest active pieces first; then augmenting paths grow the
//! round to a maximum matching of senders to receivers. Optionally the rules of the
//! power-of-two construction steer it (the bootstrap of 3.1 and its window rule). Every variant
//! yields a valid schedule; how close it comes to the bound depends on the variant, chosen per
//! `n` in `tuned.rs`.

use std::cmp::Reverse;

use super::ExchangeOrder;
use crate::schedule::ceil_log2;
use crate::schedule::types::Round;

/// The tie-breaking of one run; every variant yields a valid schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Seed for tie-breaking among equally ranked senders and receivers; 0 breaks ties by rank.
    pub seed: u64,
    /// Hand out the newest active pieces first (otherwise the oldest).
    pub newest_first: bool,
    /// Random amount, `0..=noise`, added to each receiver's count of missing pieces before
    /// ranking receivers; 0 ranks them strictly by that count.
    pub noise: u8,
    /// Follow the construction of docs/ALGORITHM.md 3.1 where it applies: its bootstrap in rounds
    /// `1..L`, and its window rule (a rank that next meets the straggler in round `t` takes no
    /// piece newer than exchange `t - L`, and is served first for that one).
    pub window: bool,
}

/// A small deterministic generator (splitmix64); seed 0 always yields 0.
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

/// Which ranks hold which final pieces: one bitset per rank over exchange numbers.
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

    fn add(&mut self, rank: usize, v: usize) {
        self.bits[rank * self.words + v / 64] |= 1 << (v % 64);
    }

    /// Bits `base..base + 64 * width` of `rank`'s set, `width` words.
    fn window(&self, rank: usize, base: usize, width: usize, out: &mut [u64]) {
        let row = &self.bits[rank * self.words..(rank + 1) * self.words];
        let (word, shift) = (base / 64, base % 64);
        for (i, slot) in out.iter_mut().enumerate().take(width) {
            let lo = row.get(word + i).copied().unwrap_or(0) >> shift;
            let hi = match shift {
                0 => 0,
                _ => row.get(word + i + 1).copied().unwrap_or(0) << (64 - shift),
            };
            *slot = lo | hi;
        }
    }
}

/// The active pieces of one round, as bitsets relative to the oldest active exchange.
struct ActiveView {
    base: usize,
    width: usize,
    /// `held[rank * width ..]`: the active pieces `rank` holds.
    held: Vec<u64>,
    /// The active pieces.
    active: Vec<u64>,
}

impl ActiveView {
    fn new(holds: &Holdings, active: &[usize], ranks: usize) -> Self {
        let base = active.first().copied().unwrap_or(0);
        let span = active.last().map_or(0, |&v| v - base + 1);
        let width = span.div_ceil(64).max(1);
        let mut held = vec![0; ranks * width];
        let mut mask = vec![0; width];
        for &v in active {
            mask[(v - base) / 64] |= 1 << ((v - base) % 64);
        }
        for rank in 0..ranks {
            let row = &mut held[rank * width..(rank + 1) * width];
            holds.window(rank, base, width, row);
            for (slot, m) in row.iter_mut().zip(&mask) {
                *slot &= m;
            }
        }
        ActiveView {
            base,
            width,
            held,
            active: mask,
        }
    }

    fn row(&self, rank: usize) -> &[u64] {
        &self.held[rank * self.width..(rank + 1) * self.width]
    }

    fn holds(&self, rank: usize, v: usize) -> bool {
        let i = v - self.base;
        self.row(rank)[i / 64] >> (i % 64) & 1 == 1
    }

    fn held_count(&self, rank: usize) -> usize {
        self.row(rank).iter().map(|w| w.count_ones() as usize).sum()
    }

    fn missing_count(&self, rank: usize) -> usize {
        let active: usize = self.active.iter().map(|w| w.count_ones() as usize).sum();
        active - self.held_count(rank)
    }
}

/// One round's copies: who sends to whom, and which piece.
struct Matching {
    /// `source[dst] = (src, v)`.
    source: Vec<Option<(usize, usize)>>,
    /// `target[src] = dst`.
    target: Vec<Option<usize>>,
}

impl Matching {
    fn new(ranks: usize) -> Self {
        Matching {
            source: vec![None; ranks],
            target: vec![None; ranks],
        }
    }

    fn link(&mut self, src: usize, dst: usize, v: usize) {
        self.source[dst] = Some((src, v));
        self.target[src] = Some(dst);
    }

    /// Tries to serve `dst` along an augmenting path (Kuhn's algorithm through piece nodes:
    /// `dst` lacks piece `v`, a holder of `v` sends it, its old receiver is served anew).
    /// Pieces and senders marked in `seen` are not explored again; a failed search leaves the
    /// matching unchanged.
    fn augment(&mut self, dst: usize, offers: &Offers, view: &ActiveView, seen: &mut Seen) -> bool {
        let dst_row = view.row(dst);
        for step in 0..view.width {
            // Words and bits in hand-out order: descending exchange numbers when newest first.
            let w = if offers.newest_first {
                view.width - 1 - step
            } else {
                step
            };
            let mut lacking = view.active[w] & !dst_row[w];
            while lacking != 0 {
                let bit = if offers.newest_first {
                    63 - lacking.leading_zeros() as usize
                } else {
                    lacking.trailing_zeros() as usize
                };
                lacking &= !(1u64 << bit);
                let slot = offers.slot_of_bit[w * 64 + bit];
                let v = offers.pieces[slot];
                if v > offers.newest_allowed[dst] {
                    continue;
                }
                if std::mem::replace(&mut seen.pieces[slot], true) {
                    continue;
                }
                for &src in &offers.holders[slot] {
                    if std::mem::replace(&mut seen.senders[src], true) {
                        continue;
                    }
                    let free = match self.target[src] {
                        None => true,
                        Some(other) => {
                            let saved = self.source[other].take();
                            let moved = self.augment(other, offers, view, seen);
                            if !moved {
                                self.source[other] = saved;
                            }
                            moved
                        }
                    };
                    if free {
                        self.link(src, dst, v);
                        return true;
                    }
                }
            }
        }
        false
    }
}

/// The active pieces in the order they are handed out, each with its free holders in the
/// order they are asked.
struct Offers {
    pieces: Vec<usize>,
    holders: Vec<Vec<usize>>,
    /// `slot_of_bit[v - base]`: the index of active piece `v` in `pieces`.
    slot_of_bit: Vec<usize>,
    newest_first: bool,
    /// The newest exchange each rank may take (the window rule), `usize::MAX` for no limit.
    newest_allowed: Vec<usize>,
}

/// What an augmenting search has explored.
struct Seen {
    pieces: Vec<bool>,
    senders: Vec<bool>,
}

impl Seen {
    fn new(pieces: usize, ranks: usize) -> Self {
        Seen {
            pieces: vec![false; pieces],
            senders: vec![false; ranks],
        }
    }

    fn clear(&mut self) {
        self.pieces.fill(false);
        self.senders.fill(false);
    }
}

/// Round `round` of the 3.1 bootstrap (`1 <= round < L`): piece `round - 1` is seeded to the
/// rank that meets the straggler `L` rounds after its exchange, and every other free holder
/// copies its newest piece to a rank (above `2L - 2`) that holds none.
fn bootstrap(
    order: &ExchangeOrder,
    round: usize,
    active: &[usize],
    view: &ActiveView,
    free: &dyn Fn(usize) -> bool,
    matching: &mut Matching,
) {
    let n = order.ranks();
    let levels = ceil_log2(n);
    let seeded_piece = round - 1;
    if seeded_piece + levels < order.count() {
        let seeded = order.owner(seeded_piece + levels);
        if free(seeded) && !view.holds(seeded, seeded_piece) {
            matching.link(order.owner(seeded_piece), seeded, seeded_piece);
        }
    }
    let pool: Vec<usize> = (2 * levels - 1..n - 1)
        .filter(|&r| free(r) && view.held_count(r) == 0 && matching.source[r].is_none())
        .collect();
    let mut pool = pool.into_iter();
    for &v in active.iter().rev() {
        for src in 0..n - 1 {
            if free(src) && matching.target[src].is_none() && view.holds(src, v) {
                if let Some(dst) = pool.next() {
                    matching.link(src, dst, v);
                }
            }
        }
    }
}

/// Builds the rounds for `order` with tie-breaking `variant`.
pub fn build(order: &ExchangeOrder, variant: Variant) -> Vec<Round> {
    let n = order.ranks();
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
        let exchange = (round < exchanges).then(|| order.owner(round));
        if round < exchanges {
            transfers.extend(order.exchange(round));
        }
        let free = |r: usize| r != straggler && Some(r) != exchange;
        let view = ActiveView::new(&holds, &active, n);
        // Receivers: those missing the most first.
        let mut receivers: Vec<(Reverse<usize>, u64, usize)> = (0..n)
            .filter(|&r| free(r))
            .map(|r| {
                let missing = view.missing_count(r);
                let ranked = match (missing, variant.noise) {
                    (0, _) | (_, 0) => missing,
                    _ => missing + (mix.next() % (u64::from(variant.noise) + 1)) as usize,
                };
                (missing, Reverse(ranked), mix.next(), r)
            })
            .filter(|&(missing, ..)| missing > 0)
            .map(|(_, ranked, tie, r)| (ranked, tie, r))
            .collect();
        receivers.sort_unstable();
        let receivers: Vec<usize> = receivers.into_iter().map(|(.., r)| r).collect();
        // Senders: those holding the fewest active pieces first, keeping versatile ones free.
        // The straggler sends once its exchanges are done.
        let mut senders: Vec<(usize, u64, usize)> = (0..n)
            .filter(|&r| free(r) || (r == straggler && exchange.is_none()))
            .map(|r| (view.held_count(r), mix.next(), r))
            .filter(|&(held, ..)| held > 0)
            .collect();
        senders.sort_unstable();
        let senders: Vec<usize> = senders.into_iter().map(|(.., r)| r).collect();
        let pieces: Vec<usize> = if variant.newest_first {
            active.iter().rev().copied().collect()
        } else {
            active.clone()
        };
        let mut slot_of_bit = vec![usize::MAX; view.width * 64];
        for (slot, &v) in pieces.iter().enumerate() {
            slot_of_bit[v - view.base] = slot;
        }
        let levels = ceil_log2(n);
        let newest_allowed: Vec<usize> = (0..n)
            .map(|r| {
                let next = order.next_meeting(r, round + 1);
                match next {
                    Some(t) if variant.window && r != straggler && t >= levels => t - levels,
                    _ => usize::MAX,
                }
            })
            .collect();
        let offers = Offers {
            newest_allowed,
            slot_of_bit,
            newest_first: variant.newest_first,
            holders: pieces
                .iter()
                .map(|&v| {
                    senders
                        .iter()
                        .copied()
                        .filter(|&src| view.holds(src, v))
                        .collect()
                })
                .collect(),
            pieces,
        };
        let mut matching = Matching::new(n);
        if variant.window && (1..levels.min(exchanges)).contains(&round) {
            bootstrap(order, round, &active, &view, &free, &mut matching);
        }
        for (&v, holders) in offers.pieces.iter().zip(&offers.holders) {
            let mut lacking: Vec<usize> = receivers
                .iter()
                .copied()
                .filter(|&r| {
                    matching.source[r].is_none()
                        && !view.holds(r, v)
                        && v <= offers.newest_allowed[r]
                })
                .collect();
            if variant.window {
                // Serve first the rank that needs exactly this piece.
                lacking.sort_by_key(|&r| offers.newest_allowed[r] != v);
            }
            let idle: Vec<usize> = holders
                .iter()
                .copied()
                .filter(|&src| matching.target[src].is_none())
                .collect();
            for (src, dst) in idle.into_iter().zip(lacking) {
                matching.link(src, dst, v);
            }
        }
        // What a failed search explored stays dead until the matching changes; every
        // augmenting path ends at an idle sender, so stop when there is none.
        let mut seen = Seen::new(offers.pieces.len(), n);
        let mut idle = senders
            .iter()
            .filter(|&&src| matching.target[src].is_none())
            .count();
        for &dst in &receivers {
            if idle == 0 {
                break;
            }
            if matching.source[dst].is_none() && matching.augment(dst, &offers, &view, &mut seen) {
                seen.clear();
                idle -= 1;
            }
        }
        for (dst, link) in matching.source.iter().enumerate() {
            if let Some((src, v)) = *link {
                transfers.push(order.copy(src, dst, v));
                holds.add(dst, v);
                holder_count[v] += 1;
            }
        }
        if let Some(owner) = exchange {
            holds.add(owner, round);
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
