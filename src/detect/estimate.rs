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

/// With a pipeline depth chosen by the model (`STRAGGLAR_PIPELINE=auto`), two StragglAR calls in
/// a row in every [`EXPLORE_EVERY`] of a class, at these class calls, run a neighbouring depth,
/// so that measurement refines the model's (the second is kept, as for exploration).
pub const PROBE_DEPTH_AT: [u64; 2] = [33, 34];

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
    /// StragglAR's samples at the class's current pipeline depth.
    pub stragglar: Samples,
    pub baseline: Samples,
    /// Calls of this class decided so far, tracked or not.
    pub decided: u64,
    /// Of them, those that ran StragglAR.
    pub on_stragglar: u64,
    /// What the last of them ran: StragglAR or not, and its depth (`None` before the first).
    last: Option<(bool, usize)>,
    /// The class's current pipeline depth (pieces per chunk; 0 until [`ClassTimes::set_depth`]).
    depth: usize,
    /// StragglAR's samples at the other depths probed, by depth.
    probes: Vec<(usize, Samples)>,
}

impl ClassTimes {
    /// Whether StragglAR is faster after arrival by at least one part in [`MARGIN_PARTS`],
    /// on the samples of the last [`MAX_AGE`] calls of the class; `None` while either
    /// algorithm has none.
    pub fn stragglar_wins(&self) -> Option<bool> {
        let from = self.decided.saturating_sub(MAX_AGE);
        let stragglar = self.stragglar.median_since(from)?;
        let baseline = self.baseline.median_since(from)?;
        Some(beats(stragglar, baseline))
    }

    /// Whether the next call of this class explores (runs the algorithm the estimates would
    /// not): two calls in [`EXPLORE_EVERY`], at [`EXPLORE_AT`] of each period.
    pub fn explores_next(&self) -> bool {
        EXPLORE_AT.contains(&(self.decided % EXPLORE_EVERY))
    }

    /// Counts one decided call of this class (StragglAR at the current depth, or not).
    pub fn count(&mut self, stragglar: bool) {
        let depth = self.depth;
        self.count_at(stragglar, depth);
    }

    /// Counts one decided call of this class that ran StragglAR at `depth`, or the baseline.
    pub fn count_at(&mut self, stragglar: bool, depth: usize) {
        self.decided += 1;
        self.on_stragglar += stragglar as u64;
        self.last = Some((stragglar, if stragglar { depth } else { 0 }));
    }

    /// Whether the class's last decided call ran StragglAR (`None` before the first).
    pub fn last_stragglar(&self) -> Option<bool> {
        self.last.map(|(stragglar, _)| stragglar)
    }

    /// Whether a call running StragglAR (`stragglar`) at `depth` ran something else than the
    /// class's call before it: its time is not kept (see the module's notes).
    pub fn switches(&self, stragglar: bool, depth: usize) -> bool {
        let this = (stragglar, if stragglar { depth } else { 0 });
        self.last.is_some_and(|last| last != this)
    }

    /// The class's current pipeline depth (0 before it was set).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Sets the class's depth before its first call (the model's).
    pub fn set_depth(&mut self, depth: usize) {
        if self.depth == 0 {
            self.depth = depth;
        }
    }

    /// The depth the next call runs if it runs StragglAR, when depths are refined: the
    /// current one, or at the class's probing calls ([`PROBE_DEPTH_AT`]) a neighbour within
    /// `1..=most`, twice and half as deep in turn (so a model that is off by a factor is
    /// corrected in a few probes).
    pub fn depth_for_next(&self, most: usize) -> usize {
        let current = self.depth.clamp(1, most.max(1));
        let at = self.decided % EXPLORE_EVERY;
        if !PROBE_DEPTH_AT.contains(&at) {
            return current;
        }
        let (up, down) = ((current * 2).min(most.max(1)), (current / 2).max(1));
        match (self.decided / EXPLORE_EVERY) % 2 == 0 {
            true if up != current => up,
            false if down != current => down,
            _ if up != current => up,
            _ => down,
        }
    }

    /// Feeds the post-arrival time of a call that ran StragglAR (`stragglar`) or the baseline,
    /// dated by the class's calls decided so far.
    pub fn add(&mut self, stragglar: bool, ns: u64) {
        let depth = self.depth;
        self.add_at(stragglar, depth, ns);
    }

    /// [`ClassTimes::add`] for a StragglAR call of `depth`: a probe's time goes to its depth's
    /// samples, and the probed depth becomes the class's when its recent median beats the
    /// current depth's by the margin (both measured within [`MAX_AGE`] calls).
    pub fn add_at(&mut self, stragglar: bool, depth: usize, ns: u64) {
        let at = self.decided;
        if !stragglar {
            self.baseline.add(at, ns);
            return;
        }
        if depth == self.depth || self.depth == 0 {
            self.stragglar.add(at, ns);
            return;
        }
        let probed = match self.probes.iter().position(|(d, _)| *d == depth) {
            Some(i) => i,
            None => {
                self.probes.push((depth, Samples::default()));
                self.probes.len() - 1
            }
        };
        self.probes[probed].1.add(at, ns);
        let from = self.decided.saturating_sub(MAX_AGE);
        let faster = match (
            self.probes[probed].1.median_since(from),
            self.stragglar.median_since(from),
        ) {
            (Some(probe), Some(current)) => beats(probe, current),
            _ => false,
        };
        if faster {
            let (new_depth, new_samples) = self.probes.swap_remove(probed);
            let old = std::mem::replace(&mut self.stragglar, new_samples);
            self.probes.push((self.depth, old));
            self.depth = new_depth;
        }
    }
}

/// Whether `a` is below `b` by at least one part in [`MARGIN_PARTS`], in integers.
fn beats(a: u64, b: u64) -> bool {
    u128::from(a) * u128::from(MARGIN_PARTS) < u128::from(b) * u128::from(MARGIN_PARTS - 1)
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

    /// Probing calls run a neighbouring depth, and a depth that measures faster by the margin
    /// becomes the class's; its old samples are kept for a later probe back.
    #[test]
    fn a_probed_depth_that_measures_faster_becomes_the_class_depth() {
        let mut t = ClassTimes::default();
        t.set_depth(10);
        t.set_depth(4);
        assert_eq!(t.depth(), 10, "set once, before the first call");
        let mut probed = Vec::new();
        for call in 0..3 * EXPLORE_EVERY {
            let depth = t.depth_for_next(16);
            if depth != t.depth() {
                probed.push((call, depth));
            }
            let time = if depth < 10 { 700 } else { 1000 };
            let kept = !t.switches(true, depth);
            t.count_at(true, depth);
            if kept {
                t.add_at(true, depth, time);
            }
        }
        // Up first (16, the most; slower: kept apart), then down (5, faster: adopted at its
        // second call), then up from 5 to 10 (slower than 5 now).
        assert_eq!(
            probed,
            [(33, 16), (34, 16), (97, 5), (98, 5), (161, 10), (162, 10)]
        );
        assert_eq!(t.depth(), 5);
        assert_eq!(t.stragglar.median(), Some(700));
        let mut one = ClassTimes::default();
        one.set_depth(1);
        one.decided = PROBE_DEPTH_AT[0] + EXPLORE_EVERY;
        assert_eq!(one.depth_for_next(8), 2, "from 1 the probe goes up");
        assert_eq!(one.depth_for_next(1), 1, "nothing to probe");
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
