//! Contribution sets: which ranks' inputs a value already includes.

/// A set of ranks in `0..ranks`, as a bitset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contributions {
    words: Vec<u64>,
}

impl Contributions {
    /// The empty set over `ranks` ranks.
    pub fn empty(ranks: usize) -> Self {
        Contributions {
            words: vec![0; ranks.div_ceil(64)],
        }
    }

    /// The set `{rank}` over `ranks` ranks.
    pub fn single(ranks: usize, rank: usize) -> Self {
        let mut set = Self::empty(ranks);
        set.words[rank / 64] |= 1 << (rank % 64);
        set
    }

    /// Number of ranks in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// Whether `self` and `other` share a rank.
    pub fn intersects(&self, other: &Self) -> bool {
        self.words.iter().zip(&other.words).any(|(a, b)| a & b != 0)
    }

    /// Adds every rank of `other` to `self`.
    pub fn union_with(&mut self, other: &Self) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let mut a = Contributions::single(100, 3);
        let b = Contributions::single(100, 70);
        assert!(!a.intersects(&b));
        a.union_with(&b);
        assert_eq!(a.len(), 2);
        assert!(a.intersects(&b));
        assert!(Contributions::empty(5).is_empty());
    }
}
