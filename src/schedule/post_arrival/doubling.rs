//! The power-of-two construction of docs/ALGORITHM.md 3.1, which meets `n - 2 + log2 n` rounds
//! (and `(n-1)k - 1 + log2 n` with `k` pieces per chunk).
//!
//! Invariant: every early rank holds exactly one *active* piece (final somewhere but not
//! everywhere) besides the retired ones, and the holder groups of the `L = log2 n` active pieces
//! have sizes `n/2, n/4, ..., 1`. Each steady round the oldest group retires by swapping with
//! the holders of the newer pieces, so every newer group doubles. A rank that meets the
//! straggler in round `t` holds piece `t - L` by then, so the busy rank is the one spare holder
//! of the retiring piece.

use std::collections::VecDeque;

use super::ExchangeOrder;
use crate::schedule::ceil_log2;
use crate::schedule::types::Round;

/// One active piece: the exchange that made it final and its early holders.
struct Group {
    exchange: usize,
    holders: Vec<usize>,
}

/// Builds the rounds; `order.ranks()` must be a power of two.
pub fn build(order: &ExchangeOrder) -> Vec<Round> {
    let n = order.ranks();
    assert!(
        n.is_power_of_two(),
        "the doubling construction needs a power of two"
    );
    let levels = ceil_log2(n);
    let exchanges = order.count();
    let mut groups: VecDeque<Group> = VecDeque::new();
    let mut rounds = Vec::with_capacity(exchanges + levels - 1);
    // Early ranks that hold no piece yet, handed out during the bootstrap.
    let mut pool = (2 * levels - 1..n - 1).collect::<VecDeque<usize>>();
    for round in 0..exchanges + levels - 1 {
        let mut transfers = Vec::new();
        if round < exchanges {
            transfers.extend(order.exchange(round));
        }
        if round > 0 && round < levels {
            bootstrap(order, round, levels, &mut groups, &mut pool, &mut transfers);
        } else if round >= levels {
            retire_oldest(order, round, levels, &mut groups, &mut transfers);
        }
        if round < exchanges {
            groups.push_back(Group {
                exchange: round,
                holders: vec![order.owner(round)],
            });
        }
        rounds.push(transfers);
    }
    debug_assert!(groups.len() == 1 && groups[0].holders.len() == n - 1);
    rounds
}

/// Rounds `1..L`: seed piece `t-1` to the rank that meets the straggler in round `t-1+L`;
/// every other free holder copies its piece to a rank that holds none.
fn bootstrap(
    order: &ExchangeOrder,
    round: usize,
    levels: usize,
    groups: &mut VecDeque<Group>,
    pool: &mut VecDeque<usize>,
    transfers: &mut Round,
) {
    let seeder = order.owner(round - 1);
    let seeded = order.owner(round - 1 + levels);
    for group in groups.iter_mut() {
        let mut joined = Vec::new();
        for &holder in &group.holders {
            let dst = if holder == seeder {
                seeded
            } else {
                pool.pop_front().expect("bootstrap pool exhausted")
            };
            transfers.push(order.copy(holder, dst, group.exchange));
            joined.push(dst);
        }
        group.holders.extend(joined);
    }
}

/// Steady and tail rounds: the oldest active piece retires. Its holders other than the busy
/// rank pair one to one with the holders of the newer pieces (the straggler joins the newest
/// group once it has no exchanges left) and swap.
fn retire_oldest(
    order: &ExchangeOrder,
    round: usize,
    levels: usize,
    groups: &mut VecDeque<Group>,
    transfers: &mut Round,
) {
    let exchanges = order.count();
    let straggler = order.straggler();
    let busy = (round < exchanges).then(|| order.owner(round));
    let oldest = groups.pop_front().expect("no active piece to retire");
    debug_assert_eq!(oldest.exchange + levels, round);
    // Retirees that meet the straggler soonest go first: they take the oldest newer piece,
    // which is the one that retires when they are busy.
    let next_meeting = |rank: usize| {
        let m = order.ranks() - 1;
        let next = round + 1 + (rank + m - (round + 1) % m) % m;
        if next < exchanges {
            next
        } else {
            usize::MAX
        }
    };
    let mut retirees: Vec<usize> = oldest
        .holders
        .iter()
        .copied()
        .filter(|&r| Some(r) != busy)
        .collect();
    debug_assert!(busy.is_none_or(|b| oldest.holders.contains(&b)));
    retirees.sort_by_key(|&r| next_meeting(r));
    let mut partners: Vec<(usize, usize)> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, group)| group.holders.iter().map(move |&h| (g, h)))
        .collect();
    if busy.is_none() {
        partners.push((groups.len() - 1, straggler));
    }
    debug_assert_eq!(retirees.len(), partners.len());
    let mut joined: Vec<Vec<usize>> = vec![Vec::new(); groups.len()];
    for (&retiree, &(g, partner)) in retirees.iter().zip(&partners) {
        if partner != straggler {
            transfers.push(order.copy(retiree, partner, oldest.exchange));
        }
        transfers.push(order.copy(partner, retiree, groups[g].exchange));
        joined[g].push(retiree);
    }
    for (group, new) in groups.iter_mut().zip(joined) {
        group.holders.extend(new);
    }
}
