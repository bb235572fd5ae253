//! The one place where logical ranks become physical ranks.
//!
//! Logical rank `n-1` is the straggler; the others keep their order as logical `0..n-2`.
//! Every rank computes the same permutation from `(n, straggler)` alone.

use super::types::{Round, Schedule};

/// The permutation between logical and physical ranks for one straggler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Relabel {
    ranks: usize,
    straggler: usize,
}

impl Relabel {
    /// The relabelling for `ranks` GPUs whose physical straggler is `straggler`.
    /// Returns `None` unless `straggler < ranks`.
    pub fn new(ranks: usize, straggler: usize) -> Option<Self> {
        (straggler < ranks).then_some(Relabel { ranks, straggler })
    }

    /// The physical rank of logical rank `logical` (`< ranks`).
    pub fn physical(&self, logical: usize) -> usize {
        debug_assert!(logical < self.ranks);
        if logical == self.ranks - 1 {
            self.straggler
        } else if logical < self.straggler {
            logical
        } else {
            logical + 1
        }
    }

    /// The logical rank of physical rank `physical` (`< ranks`).
    pub fn logical(&self, physical: usize) -> usize {
        debug_assert!(physical < self.ranks);
        match physical.cmp(&self.straggler) {
            std::cmp::Ordering::Equal => self.ranks - 1,
            std::cmp::Ordering::Less => physical,
            std::cmp::Ordering::Greater => physical - 1,
        }
    }

    /// Rewrites the ranks of `rounds` from logical to physical.
    pub fn to_physical(&self, rounds: &mut [Round]) {
        for transfer in rounds.iter_mut().flatten() {
            transfer.src = self.physical(transfer.src);
            transfer.dst = self.physical(transfer.dst);
        }
    }
}

impl Schedule {
    /// The same schedule for another physical straggler: every rank is mapped through the
    /// logical labels of the old straggler to the physical labels of the new one. Synthesis
    /// depends only on `n`, so this is how one synthesized schedule serves any straggler.
    /// Returns `None` for schedules without a straggler or when `straggler >= ranks`.
    pub fn with_straggler(&self, straggler: usize) -> Option<Schedule> {
        let old = Relabel::new(self.ranks, self.straggler?)?;
        let new = Relabel::new(self.ranks, straggler)?;
        let mut schedule = self.clone();
        schedule.straggler = Some(straggler);
        for transfer in schedule
            .phases
            .iter_mut()
            .flat_map(|p| p.rounds.iter_mut())
            .flatten()
        {
            transfer.src = new.physical(old.logical(transfer.src));
            transfer.dst = new.physical(old.logical(transfer.dst));
        }
        Some(schedule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_permutation_with_the_straggler_last() {
        for n in 2..10 {
            for s in 0..n {
                let r = Relabel::new(n, s).unwrap();
                assert_eq!(r.physical(n - 1), s);
                let mut seen: Vec<usize> = (0..n).map(|l| r.physical(l)).collect();
                for l in 0..n {
                    assert_eq!(r.logical(r.physical(l)), l);
                }
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>());
            }
        }
        assert!(Relabel::new(4, 4).is_none());
    }
}
