//! Measured post-arrival times of one size class, and the exploration schedule that keeps them
//! fresh.
//!
//! A call's time depends on the one before it: after a StragglAR call the straggler finishes
//! before the others, so at the next call its lead is shorter than after a Ring call, and a
//! StragglAR call that follows Ring calls looks better than StragglAR calls in a row do. So the
//! tracker keeps only samples of calls that ran the same algorithm as their size class's call
//! before them, and exploration runs two calls of the class in a row, the second measured.
//!
//! A call's post-arrival time is the time from the last rank's arrival to that rank's own
//! finish, in nanoseconds: the time the critical path spends in the call. It is what an
//! algorithm costs once nobody is late any more: for StragglAR it includes whatever of the ReduceScatter the lead did not hide, so the
//! two algorithms' times compare directly (a call ends at the last arrival plus this time,
//! whichever ran). Every rank feeds the same samples at the same call numbers, so every rank's
//! estimates, and therefore its choices, are identical.

/// Samples kept per algorithm: the estimate follows a change within half of them.
pub const SAMPLES_KEPT: usize = 8;

/// Two calls in this many of a class explore the algorithm the estimates do not choose, so
/// that its estimate never goes stale.
pub const EXPLORE_EVERY: u64 = 64;

/// The class calls (counted from 0) of each period that explore, two in a row: the second and
/// third, so that a class's first calls (a benchmark's warm-up, a job's first step) measure
/// both algorithms.
pub const EXPLORE_AT: [u64; 2] = [1, 2];

/// StragglAR is chosen on measurements when its estimate is below the baseline's by at least
/// one part in this many of the baseline's, 2% (a margin against noise; the measured policy
/// costs at most this much against always choosing the faster one). Compared in integers,
/// `50 s < 49 b`, as the device twin compares them.
pub const MARGIN_PARTS: u64 = 50;

/// A sample older than this many calls of its class no longer counts in the choice: the
/// machine's load may have changed since, and an estimate kept only by old samples would be
/// compared with a fresh one. The algorithm not chosen gets a new sample every
/// [`EXPLORE_EVERY`] calls, so it always has one or two this recent.
pub const MAX_AGE: u64 = 2 * EXPLORE_EVERY;

/// The most recent post-arrival times of one algorithm in one class, nanoseconds, each with
/// the class call it was taken at.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Up to [`SAMPLES_KEPT`] `(class call, ns)`, oldest overwritten first.
    kept: Vec<(u64, u64)>,
    /// Where the next sample goes once `kept` is full.
    next: usize,
    /// Samples ever taken.
    taken: u64,
}

impl Samples {
    /// Adds one post-arrival time, taken at class call `at`.
    pub fn add(&mut self, at: u64, ns: u64) {
        if self.kept.len() < SAMPLES_KEPT {
            self.kept.push((at, ns));
        } else {
            self.kept[self.next] = (at, ns);
            self.next = (self.next + 1) % SAMPLES_KEPT;
        }
        self.taken += 1;
    }

    /// The median of the kept samples taken at class call `from` or later (the upper one of
    /// an even count): one noisy call moves it by at most one rank. `None` when there is none.
    pub fn median_since(&self, from: u64) -> Option<u64> {
        let mut sorted = [0u64; SAMPLES_KEPT];
        let mut len = 0;
        for &(at, ns) in &self.kept {
            if at >= from {
                sorted[len] = ns;
                len += 1;
            }
        }
        let sorted = &mut sorted[..len];
        sorted.sort_unstable();
        sorted.get(len / 2).copied()
    }

    /// The median of every kept sample, however old (for reports).
    pub fn median(&self) -> Option<u64> {
        self.median_since(0)
    }

    /// Samples ever taken.
    pub fn taken(&self) -> u64 {
        self.taken
    }
}

/// One size class's measurements: both algorithms' samples, and how many calls of the class
/// were decided (the exploration schedule's clock).
#[derive(Debug, Clone, Default)]
pub struct ClassTimes {
    pub stragglar: Samples,
    pub baseline: Samples,
    /// Calls of this class decided so far, tracked or not.
    pub decided: u64,
    /// Of them, those that ran StragglAR.
    pub on_stragglar: u64,
    /// Whether the last of them ran StragglAR (`None` before the first).
    last: Option<bool>,
}

impl ClassTimes {
    /// Whether StragglAR is faster after arrival by at least one part in [`MARGIN_PARTS`],
    /// on the samples of the last [`MAX_AGE`] calls of the class; `None` while either
    /// algorithm has none.
    pub fn stragglar_wins(&self) -> Option<bool> {
        let from = self.decided.saturating_sub(MAX_AGE);
        let stragglar = u128::from(self.stragglar.median_since(from)?);
        let baseline = u128::from(self.baseline.median_since(from)?);
        Some(stragglar * u128::from(MARGIN_PARTS) < baseline * u128::from(MARGIN_PARTS - 1))
    }

    /// Whether the next call of this class explores (runs the algorithm the estimates would
    /// not): two calls in [`EXPLORE_EVERY`], at [`EXPLORE_AT`] of each period.
    pub fn explores_next(&self) -> bool {
        EXPLORE_AT.contains(&(self.decided % EXPLORE_EVERY))
    }

    /// Counts one decided call of this class.
    pub fn count(&mut self, stragglar: bool) {
        self.decided += 1;
        self.on_stragglar += stragglar as u64;
        self.last = Some(stragglar);
    }

    /// Whether the class's last decided call ran StragglAR (`None` before the first).
    pub fn last_stragglar(&self) -> Option<bool> {
        self.last
    }

    /// Feeds the post-arrival time of a call that ran StragglAR (`stragglar`) or the baseline,
    /// dated by the class's calls decided so far.
    pub fn add(&mut self, stragglar: bool, ns: u64) {
        match stragglar {
            true => self.stragglar.add(self.decided, ns),
            false => self.baseline.add(self.decided, ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_follows_the_recent_samples_and_shrugs_off_one_outlier() {
        let mut s = Samples::default();
        assert_eq!(s.median(), None);
        for ns in [100, 110, 90, 105, 95, 5_000_000, 100, 102] {
            s.add(0, ns);
        }
        assert_eq!(s.median(), Some(102), "one outlier moves it one rank");
        for _ in 0..SAMPLES_KEPT / 2 + 1 {
            s.add(1, 300);
        }
        assert_eq!(
            s.median(),
            Some(300),
            "a change shows within half the window"
        );
        assert_eq!(s.taken(), 8 + 5);
    }

    /// Old samples stop counting: a baseline measured under a heavier load long ago does not
    /// make a fresh StragglAR estimate look better.
    #[test]
    fn samples_older_than_the_age_limit_do_not_count() {
        let mut t = ClassTimes::default();
        for _ in 0..4 {
            t.add(false, 9_000);
            t.count(false);
        }
        t.add(true, 5_000);
        assert_eq!(t.stragglar_wins(), Some(true));
        for _ in 0..MAX_AGE {
            t.add(true, 5_000);
            t.count(true);
        }
        assert_eq!(t.stragglar_wins(), None, "the baseline's samples aged out");
        t.add(false, 3_000);
        assert_eq!(t.stragglar_wins(), Some(false), "one fresh sample decides");
        assert_eq!(
            t.baseline.median(),
            Some(9_000),
            "the report keeps every sample"
        );
        assert_eq!(t.baseline.median_since(t.decided), Some(3_000));
    }

    #[test]
    fn stragglar_wins_only_by_the_margin_and_only_when_both_are_measured() {
        let mut t = ClassTimes::default();
        assert_eq!(t.stragglar_wins(), None);
        t.add(true, 1000);
        assert_eq!(t.stragglar_wins(), None, "the baseline is not measured yet");
        t.add(false, 1010);
        assert_eq!(
            t.stragglar_wins(),
            Some(false),
            "1% is within the noise margin"
        );
        t.add(false, 1100);
        t.add(false, 1100);
        assert_eq!(t.stragglar_wins(), Some(true));
    }

    #[test]
    fn two_calls_in_a_row_in_every_period_explore() {
        let mut t = ClassTimes::default();
        let mut explored = Vec::new();
        for call in 0..3 * EXPLORE_EVERY {
            if t.explores_next() {
                explored.push(call);
            }
            t.count(call % 2 == 0);
        }
        let expected: Vec<u64> = (0..3)
            .flat_map(|period| EXPLORE_AT.map(|at| at + period * EXPLORE_EVERY))
            .collect();
        assert_eq!(explored, expected);
        assert_eq!(t.on_stragglar, 3 * EXPLORE_EVERY / 2);
    }
}
