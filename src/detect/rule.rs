//! The designation rule: which rank is the persistent straggler.
//!
//! Rank R becomes the designated straggler when it arrived last in at least `on_fraction` of
//! the last `window` calls (compared as whole counts, `ceil(fraction * window)`, so that the
//! device twin in cuda/stragglar_choice.h computes exactly the same). It is released when its
//! share falls below `off_fraction`, or
//! replaced when another rank reaches `on_fraction`; either only after `min_dwell` calls, so the
//! designation never flaps. Defaults and why:
//! - `window = 32` calls: long enough that one noisy step does not decide, short enough to follow
//!   a straggler that moves within a few dozen calls (DDP issues one AllReduce per bucket, so a
//!   training step is several calls);
//! - `on_fraction = 0.75`: traces of real fine-tuning show the same rank last in 77-98% of steps
//!   (the StragglAR paper's motivation run: 49 of 50); random arrivals among 8 ranks put any rank
//!   last in ~12% of calls, so 75% is never reached by chance;
//! - `off_fraction = 0.5`: hysteresis, a straggler that is last most of the time stays;
//! - `min_dwell = 16` calls: half a window between changes.

use std::collections::VecDeque;

/// One call's arrivals, identical on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrivalRecord {
    /// The rank that arrived last (the highest rank on a tie).
    pub last_rank: usize,
    /// Its arrival minus the second-to-last arrival, in nanoseconds: the time that can hide the
    /// ReduceScatter. `None` where it was not measured (the GPU engine measures a sample of the
    /// calls NCCL runs, see `crate::gpu::arrival::measures`); who arrived last is always known.
    pub lead_ns: Option<u64>,
}

/// The longest window a detector keeps: the median of its leads is taken on the stack, with no
/// allocation on `ncclAllReduce`'s path.
pub const MAX_WINDOW: usize = 64;

/// The rule's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DetectorConfig {
    /// Calls remembered.
    pub window: usize,
    /// Share of the window a rank must arrive last in to be designated.
    pub on_fraction: f64,
    /// Share below which the designated rank is released.
    pub off_fraction: f64,
    /// Calls between two changes of the designation.
    pub min_dwell: u64,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            window: 32,
            on_fraction: 0.75,
            off_fraction: 0.5,
            min_dwell: 16,
        }
    }
}

impl DetectorConfig {
    /// Arrivals in the window a rank needs to be designated: `ceil(on_fraction * window)`
    /// (the rule compares whole counts, so its device twin needs no floating point).
    pub fn on_count(&self) -> usize {
        Self::count_of(self.on_fraction, self.window)
    }

    /// Arrivals in the window below which the designated rank is released:
    /// `ceil(off_fraction * window)`.
    pub fn off_count(&self) -> usize {
        Self::count_of(self.off_fraction, self.window)
    }

    fn count_of(fraction: f64, window: usize) -> usize {
        (fraction.clamp(0.0, 2.0) * window as f64).ceil() as usize
    }
}

/// Tracks one communicator's (and size class's) arrivals and its designated straggler.
#[derive(Debug, Clone)]
pub struct Detector {
    config: DetectorConfig,
    /// `config.on_count()` and `config.off_count()`, computed once.
    on_count: usize,
    off_count: usize,
    ranks: usize,
    history: VecDeque<ArrivalRecord>,
    designated: Option<usize>,
    /// Calls observed so far.
    calls: u64,
    /// The call count when the designation last changed.
    changed_at: u64,
}

impl Detector {
    /// A detector for `ranks` ranks with nothing designated (a window over [`MAX_WINDOW`] is
    /// shortened to it).
    pub fn new(ranks: usize, config: DetectorConfig) -> Self {
        let config = DetectorConfig {
            window: config.window.clamp(1, MAX_WINDOW),
            ..config
        };
        Detector {
            config,
            on_count: config.on_count(),
            off_count: config.off_count(),
            ranks,
            history: VecDeque::with_capacity(config.window),
            designated: None,
            calls: 0,
            changed_at: 0,
        }
    }

    /// The designated straggler, if any.
    pub fn designated(&self) -> Option<usize> {
        self.designated
    }

    /// The rule's parameters (the window clamped to [`MAX_WINDOW`]).
    pub fn config(&self) -> DetectorConfig {
        self.config
    }

    /// Calls observed so far.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// In how many of the remembered calls `rank` arrived last.
    pub fn last_count(&self, rank: usize) -> usize {
        self.history.iter().filter(|r| r.last_rank == rank).count()
    }

    /// Calls remembered (at most the window).
    pub fn remembered(&self) -> usize {
        self.history.len()
    }

    /// The median lead of `rank` over the remembered calls where it arrived last and its lead
    /// was measured (the lower median for an even count), in nanoseconds.
    pub fn median_lead_ns(&self, rank: usize) -> Option<u64> {
        let mut leads = [0u64; MAX_WINDOW];
        let mut n = 0;
        for lead in self
            .history
            .iter()
            .filter(|r| r.last_rank == rank)
            .filter_map(|r| r.lead_ns)
        {
            leads[n] = lead;
            n += 1;
        }
        if n == 0 {
            return None;
        }
        let leads = &mut leads[..n];
        leads.sort_unstable();
        Some(leads[(n - 1) / 2])
    }

    /// Adds one call's record and applies the rule. Returns the designation after it.
    pub fn observe(&mut self, record: ArrivalRecord) -> Option<usize> {
        if record.last_rank >= self.ranks {
            return self.designated;
        }
        if self.history.len() == self.config.window {
            self.history.pop_front();
        }
        self.history.push_back(record);
        self.calls += 1;
        self.apply_rule();
        self.designated
    }

    /// The rank last most often in the window (the lowest on a tie).
    fn leader(&self) -> usize {
        (0..self.ranks)
            .max_by_key(|&r| (self.last_count(r), std::cmp::Reverse(r)))
            .unwrap_or(0)
    }

    fn apply_rule(&mut self) {
        let dwelt = self.calls - self.changed_at >= self.config.min_dwell;
        let leader = self.leader();
        let leader_qualifies = self.last_count(leader) >= self.on_count;
        let next = match self.designated {
            None if leader_qualifies => Some(leader),
            Some(current) if dwelt && leader != current && leader_qualifies => Some(leader),
            Some(current) if dwelt && self.last_count(current) < self.off_count => None,
            unchanged => unchanged,
        };
        if next != self.designated {
            self.designated = next;
            self.changed_at = self.calls;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_longer_than_the_stack_buffer_is_shortened() {
        let config = DetectorConfig {
            window: 1000,
            ..DetectorConfig::default()
        };
        let mut d = Detector::new(4, config);
        for i in 0..100u64 {
            d.observe(ArrivalRecord {
                last_rank: 2,
                lead_ns: Some(i),
            });
        }
        assert_eq!(d.remembered(), MAX_WINDOW);
        assert_eq!(
            d.median_lead_ns(2),
            Some(36 + 31),
            "median of leads 36..100"
        );
    }

    fn record(last_rank: usize) -> ArrivalRecord {
        ArrivalRecord {
            last_rank,
            lead_ns: Some(1_000_000 + last_rank as u64),
        }
    }

    /// A deterministic pseudo-random rank sequence.
    fn noise(seed: u64, ranks: usize) -> impl Iterator<Item = usize> {
        let mut x = seed | 1;
        std::iter::from_fn(move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Some((x % ranks as u64) as usize)
        })
    }

    #[test]
    fn a_persistent_straggler_is_found_within_a_window_and_kept() {
        let mut d = Detector::new(8, DetectorConfig::default());
        let mut found_at = None;
        let mut changes = 0;
        let mut previous = None;
        for (call, other) in (0..1000).zip(noise(7, 8)) {
            // Rank 5 last in 90% of calls.
            let last = if call % 10 == 9 { other } else { 5 };
            let now = d.observe(record(last));
            if now == Some(5) && found_at.is_none() {
                found_at = Some(call);
            }
            changes += (now != previous) as usize;
            previous = now;
        }
        assert!(found_at.unwrap() < 32, "{found_at:?}");
        assert_eq!(changes, 1, "never flaps");
        assert_eq!(d.median_lead_ns(5), Some(1_000_005));
    }

    #[test]
    fn a_moving_straggler_is_followed_at_bounded_cost() {
        let mut d = Detector::new(8, DetectorConfig::default());
        for phase in 0..6 {
            let rank = [1, 6, 3, 0, 7, 2][phase];
            let mut lag = None;
            for call in 0..300 {
                if d.observe(record(rank)) == Some(rank) && lag.is_none() {
                    lag = Some(call);
                }
            }
            assert!(
                lag.unwrap() <= 32,
                "phase {phase}: followed after {lag:?} calls"
            );
        }
    }

    #[test]
    fn no_straggler_means_no_designation() {
        let mut d = Detector::new(8, DetectorConfig::default());
        for rank in noise(11, 8).take(5000) {
            assert_eq!(d.observe(record(rank)), None);
        }
    }

    #[test]
    fn alternating_ranks_do_not_thrash() {
        let mut d = Detector::new(8, DetectorConfig::default());
        for call in 0..2000 {
            assert_eq!(
                d.observe(record([2, 4][call % 2])),
                None,
                "50/50 never reaches 75%"
            );
        }
        // Blocks of 20: the leader changes every 20 calls, but never reaches the threshold.
        let mut changes = 0;
        let mut previous = d.designated();
        for call in 0..2000 {
            let now = d.observe(record([2, 4][(call / 20) % 2]));
            changes += (now != previous) as usize;
            previous = now;
        }
        assert!(changes <= 2, "{changes} changes");
    }

    #[test]
    fn two_late_ranks_share_and_neither_is_designated_unless_one_dominates() {
        let mut d = Detector::new(8, DetectorConfig::default());
        for call in 0..1000 {
            d.observe(record(if call % 3 == 0 { 3 } else { 6 }));
        }
        assert_eq!(d.designated(), None, "6 is last in 2/3 of calls: below 75%");
        let mut d = Detector::new(8, DetectorConfig::default());
        for call in 0..1000 {
            d.observe(record(if call % 8 == 0 { 3 } else { 6 }));
        }
        assert_eq!(d.designated(), Some(6), "7/8 of calls");
    }

    #[test]
    fn release_needs_the_share_to_fall_below_half() {
        let mut d = Detector::new(4, DetectorConfig::default());
        for _ in 0..64 {
            d.observe(record(1));
        }
        assert_eq!(d.designated(), Some(1));
        for call in 0..64 {
            d.observe(record(if call % 5 < 3 { 1 } else { 2 }));
        }
        assert_eq!(d.designated(), Some(1), "60%: kept by hysteresis");
        for _ in 0..64 {
            d.observe(record(0));
        }
        assert_eq!(
            d.designated(),
            Some(0),
            "replaced once another rank qualifies"
        );
        let mut d2 = Detector::new(4, DetectorConfig::default());
        for _ in 0..64 {
            d2.observe(record(1));
        }
        for call in 0..64 {
            d2.observe(record(call % 4));
        }
        assert_eq!(d2.designated(), None, "released at 25%");
    }

    #[test]
    fn records_from_outside_the_communicator_are_ignored() {
        let mut d = Detector::new(4, DetectorConfig::default());
        assert_eq!(d.observe(record(9)), None);
        assert_eq!(d.calls(), 0);
    }
}
