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

use super::finish::Finish;

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

/// Where StragglAR's finish is refined (a pipeline depth chosen by the model,
/// `STRAGGLAR_PIPELINE=auto`, or a communicator that can also finish by multicast), two StragglAR
/// calls in a row in every [`EXPLORE_EVERY`] of a class, at these class calls, run another
/// finish (a neighbouring depth, or the other kind), so that measurement refines the model's
/// (the second is kept, as for exploration).
pub const PROBE_FINISH_AT: [u64; 2] = [33, 34];

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
    /// StragglAR's samples with the class's current finish.
    pub stragglar: Samples,
    pub baseline: Samples,
    /// Calls of this class decided so far, tracked or not.
    pub decided: u64,
    /// Of them, those that ran StragglAR.
    pub on_stragglar: u64,
    /// What the last of them ran: StragglAR's finish, or `None` for the baseline (`None` before
    /// the first).
    last: Option<Option<Finish>>,
    /// The class's point-to-point pipeline depth (pieces per chunk; 0 until
    /// [`ClassTimes::start`]), kept while the class finishes by multicast.
    depth: usize,
    /// Whether the class's StragglAR calls finish by one multicast now.
    multicast: bool,
    /// StragglAR's samples with the other finishes probed.
    probes: Vec<(Finish, Samples)>,
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

    /// Counts one decided call of this class (StragglAR with the current finish, or not).
    pub fn count(&mut self, stragglar: bool) {
        let finish = self.finish();
        self.count_at(stragglar, finish);
    }

    /// Counts one decided call of this class that ran StragglAR finished by `finish`, or the
    /// baseline.
    pub fn count_at(&mut self, stragglar: bool, finish: Finish) {
        self.decided += 1;
        self.on_stragglar += stragglar as u64;
        self.last = Some(stragglar.then_some(finish));
    }

    /// Whether the class's last decided call ran StragglAR (`None` before the first).
    pub fn last_stragglar(&self) -> Option<bool> {
        self.last.map(|ran| ran.is_some())
    }

    /// Whether a call running StragglAR (`stragglar`) finished by `finish` ran something else
    /// than the class's call before it: its time is not kept (see the module's notes).
    pub fn switches(&self, stragglar: bool, finish: Finish) -> bool {
        let this = stragglar.then_some(finish);
        self.last.is_some_and(|last| last != this)
    }

    /// The class's point-to-point pipeline depth (0 before it was set), kept while it finishes
    /// by multicast.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The finish the class's StragglAR calls run now, probes aside.
    pub fn finish(&self) -> Finish {
        match self.multicast {
            true => Finish::Multicast,
            false => Finish::Pieces(self.depth),
        }
    }

    /// Sets the class's first finish before its first call (the model's): `first`, with the
    /// point-to-point `depth` kept for later probes when `first` is the multicast one.
    pub fn start(&mut self, depth: usize, first: Finish) {
        if self.depth == 0 {
            self.depth = match first {
                Finish::Pieces(k) => k.max(1),
                Finish::Multicast => depth.max(1),
            };
            self.multicast = first.is_multicast();
        }
    }

    /// The finish the next call runs if it runs StragglAR, when finishes are refined: the
    /// current one, or at the class's probing calls ([`PROBE_FINISH_AT`]) another.
    ///
    /// - `multicast`: the communicator can finish by multicast. A class finishing so probes
    ///   its point-to-point depth; a class finishing point to point probes the multicast finish
    ///   every other period (every period when depths are not refined).
    /// - `most`: depths are refined, up to `most` pieces: a point-to-point class probes a
    ///   neighbouring depth, twice and half as deep in turn (so a model that is off by a
    ///   factor is corrected in a few probes). `None`: the depth is fixed.
    pub fn finish_for_next(&self, most: Option<usize>, multicast: bool) -> Finish {
        let depth = self.depth.clamp(1, most.unwrap_or(usize::MAX).max(1));
        let current = match self.multicast {
            true => Finish::Multicast,
            false => Finish::Pieces(depth),
        };
        let at = self.decided % EXPLORE_EVERY;
        if !PROBE_FINISH_AT.contains(&at) {
            return current;
        }
        let period = self.decided / EXPLORE_EVERY;
        // Up and down in turn: by period, or by every other period where the other periods
        // probe the multicast finish.
        let turn = if multicast { period / 2 } else { period };
        let neighbour = most
            .map(|most| {
                let (up, down) = ((depth * 2).min(most.max(1)), (depth / 2).max(1));
                match turn % 2 == 0 {
                    true if up != depth => up,
                    false if down != depth => down,
                    _ if up != depth => up,
                    _ => down,
                }
            })
            .filter(|&k| k != depth);
        match current {
            Finish::Multicast => Finish::Pieces(depth),
            _ if multicast && (neighbour.is_none() || period % 2 == 0) => Finish::Multicast,
            _ => Finish::Pieces(neighbour.unwrap_or(depth)),
        }
    }

    /// Feeds the post-arrival time of a call that ran StragglAR (`stragglar`, with the
    /// class's current finish) or the baseline, dated by the class's calls decided so far.
    pub fn add(&mut self, stragglar: bool, ns: u64) {
        let finish = self.finish();
        self.add_at(stragglar, finish, ns);
    }

    /// [`ClassTimes::add`] for a StragglAR call finished by `finish`: a probe's time goes to
    /// its finish's samples, and the probed finish becomes the class's when its recent median
    /// beats the current finish's by the margin (both measured within [`MAX_AGE`] calls).
    pub fn add_at(&mut self, stragglar: bool, finish: Finish, ns: u64) {
        let at = self.decided;
        if !stragglar {
            self.baseline.add(at, ns);
            return;
        }
        if finish == self.finish() || self.depth == 0 {
            self.stragglar.add(at, ns);
            return;
        }
        let probed = match self.probes.iter().position(|(f, _)| *f == finish) {
            Some(i) => i,
            None => {
                self.probes.push((finish, Samples::default()));
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
            let (adopted, samples) = self.probes.swap_remove(probed);
            let old = std::mem::replace(&mut self.stragglar, samples);
            self.probes.push((self.finish(), old));
            match adopted {
                Finish::Multicast => self.multicast = true,
                Finish::Pieces(k) => (self.multicast, self.depth) = (false, k),
            }
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

    /// Runs `calls` StragglAR calls of class `t`, each finished as the class says
    /// (`finish_for_next(most, multicast)`), taking `time(finish)`; returns the probes, as
    /// (class call, finish).
    fn run_finishes(
        t: &mut ClassTimes,
        calls: u64,
        most: Option<usize>,
        multicast: bool,
        time: impl Fn(Finish) -> u64,
    ) -> Vec<(u64, Finish)> {
        let mut probed = Vec::new();
        for _ in 0..calls {
            let call = t.decided;
            let finish = t.finish_for_next(most, multicast);
            if finish != t.finish() {
                probed.push((call, finish));
            }
            let kept = !t.switches(true, finish);
            t.count_at(true, finish);
            if kept {
                t.add_at(true, finish, time(finish));
            }
        }
        probed
    }

    /// Probing calls run a neighbouring depth, and a depth that measures faster by the margin
    /// becomes the class's; its old samples are kept for a later probe back.
    #[test]
    fn a_probed_depth_that_measures_faster_becomes_the_class_depth() {
        let mut t = ClassTimes::default();
        t.start(10, Finish::Pieces(10));
        t.start(4, Finish::Pieces(4));
        assert_eq!(t.depth(), 10, "set once, before the first call");
        let time = |finish: Finish| if finish.pieces() < 10 { 700 } else { 1000 };
        let probed = run_finishes(&mut t, 3 * EXPLORE_EVERY, Some(16), false, time);
        // Up first (16, the most; slower: kept apart), then down (5, faster: adopted at its
        // second call), then up from 5 to 10 (slower than 5 now).
        assert_eq!(
            probed,
            [(33, 16), (34, 16), (97, 5), (98, 5), (161, 10), (162, 10)]
                .map(|(call, k)| (call, Finish::Pieces(k)))
        );
        assert_eq!(t.finish(), Finish::Pieces(5));
        assert_eq!(t.stragglar.median(), Some(700));
        let mut one = ClassTimes::default();
        one.start(1, Finish::Pieces(1));
        one.decided = PROBE_FINISH_AT[0] + EXPLORE_EVERY;
        let next = |most| one.finish_for_next(Some(most), false);
        assert_eq!(next(8), Finish::Pieces(2), "from 1 the probe goes up");
        assert_eq!(next(1), Finish::Pieces(1), "nothing to probe");
        assert_eq!(one.finish_for_next(None, false), Finish::Pieces(1));
    }

    /// Where the communicator can finish by multicast, a point-to-point class probes the
    /// multicast finish (every other period when depths are refined too, which the periods
    /// between probe), adopts it when it measures faster, then probes its point-to-point depth.
    #[test]
    fn a_class_probes_the_multicast_finish_and_adopts_it_when_faster() {
        let multicast_faster = |finish: Finish| match finish {
            Finish::Multicast => 600,
            Finish::Pieces(_) => 1000,
        };
        let mut fixed = ClassTimes::default();
        fixed.start(3, Finish::Pieces(3));
        let probed = run_finishes(&mut fixed, 3 * EXPLORE_EVERY, None, true, multicast_faster);
        assert_eq!(
            probed,
            [
                (33, Finish::Multicast),
                (34, Finish::Multicast),
                (97, Finish::Pieces(3)),
                (98, Finish::Pieces(3)),
                (161, Finish::Pieces(3)),
                (162, Finish::Pieces(3)),
            ]
        );
        assert_eq!(fixed.finish(), Finish::Multicast);
        assert_eq!(fixed.depth(), 3, "the point-to-point depth is kept");
        assert_eq!(fixed.stragglar.median(), Some(600));
        // Point to point faster at 2 pieces: the multicast probes (even periods) stay apart,
        // the depth probes (odd periods) find 2.
        let two_pieces_fastest = |finish: Finish| match finish {
            Finish::Multicast => 900,
            Finish::Pieces(k) => 500 + 100 * (k as u64).abs_diff(2),
        };
        let mut refined = ClassTimes::default();
        refined.start(4, Finish::Pieces(4));
        let probed = run_finishes(
            &mut refined,
            4 * EXPLORE_EVERY,
            Some(8),
            true,
            two_pieces_fastest,
        );
        assert_eq!(
            probed,
            [
                (33, Finish::Multicast),
                (34, Finish::Multicast),
                (97, Finish::Pieces(8)),
                (98, Finish::Pieces(8)),
                (161, Finish::Multicast),
                (162, Finish::Multicast),
                (225, Finish::Pieces(2)),
                (226, Finish::Pieces(2)),
            ]
        );
        assert_eq!(refined.finish(), Finish::Pieces(2));
        // Started on the multicast finish, by the model: its probes run the depth kept.
        let mut started = ClassTimes::default();
        started.start(6, Finish::Multicast);
        assert_eq!((started.finish(), started.depth()), (Finish::Multicast, 6));
        let point_to_point_faster = |finish: Finish| match finish {
            Finish::Multicast => 900,
            Finish::Pieces(_) => 700,
        };
        let probed = run_finishes(
            &mut started,
            EXPLORE_EVERY,
            Some(8),
            true,
            point_to_point_faster,
        );
        assert_eq!(probed, [(33, Finish::Pieces(6)), (34, Finish::Pieces(6))]);
        assert_eq!(started.finish(), Finish::Pieces(6));
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
