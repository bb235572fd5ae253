//! One communicator's straggler tracking: a detector per size class, the policy, the tally for
//! the report, and the lag between a call and the moment its arrival record can be read.
//!
//! The host engine reads a call's record when the call returns (lag 1); the GPU engine's
//! records reach the host ring only after later launches ran on the GPU, so its calls are
//! decided from the records of calls at least `lag` ticketed calls older. Every rank feeds the
//! same records in the same order at the same call numbers, so every rank makes the same
//! choice for every call, however far its host runs ahead of its GPU.

use std::collections::{HashMap, VecDeque};

use super::classes::size_class;
use super::estimate::ClassTimes;
use super::finish::Finish;
use super::pipeline::Pipeline;
use super::policy::{Choice, Policy};
use super::rule::{ArrivalRecord, Detector, DetectorConfig};
use super::tally::ArrivalTally;

/// A decided call whose record is not fed yet.
#[derive(Debug, Clone, Copy)]
struct Pending {
    class: u32,
    stragglar: bool,
}

/// What the next call runs: the algorithm, and how StragglAR finishes if it runs StragglAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub choice: Choice,
    pub finish: Finish,
}

/// What feeding one record changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The call the record belongs to (its number among the tracked calls).
    pub call: u64,
    /// Its size class.
    pub class: u32,
    /// The class's designation after it.
    pub designated: Option<usize>,
    /// `Some(previous)` when this record changed the class's designation.
    pub changed: Option<Option<usize>>,
}

/// One communicator's tracking state. Calls are numbered 0, 1, ... in the order they are
/// decided; record `k` must be fed before call `k + lag` is decided.
#[derive(Debug, Clone)]
pub struct Tracker {
    policy: Policy,
    ranks: usize,
    lag: u64,
    detectors: HashMap<u32, Detector>,
    /// Calls decided and not yet fed, oldest first (call `fed` is the front).
    pending: VecDeque<Pending>,
    /// Records fed so far: the number of the next one due.
    fed: u64,
    tally: ArrivalTally,
    /// Whether the engine feeds post-arrival times ([`Tracker::measuring`]).
    measuring: bool,
    /// Per size class: the measured post-arrival times and the calls decided.
    times: HashMap<u32, ClassTimes>,
    /// Tracked calls whose post-arrival time is not fed yet, oldest first (only while
    /// measuring).
    untimed: VecDeque<Untimed>,
    /// Per size class: the class call (its count of decided calls) at which a baseline call was
    /// last measured ([`Tracker::baseline_measured`]).
    baseline_measured: HashMap<u32, u64>,
}

/// Class calls after a measured baseline call past which the next baseline call whose time
/// would be kept is measured even outside the engine's sample ([`Tracker::baseline_time_wanted`]):
/// half of [`super::estimate::MAX_AGE`], so the baseline's estimate never ages out.
pub const REMEASURE_AFTER: u64 = super::estimate::MAX_AGE / 2;

/// A tracked call awaiting its post-arrival time.
#[derive(Debug, Clone, Copy)]
struct Untimed {
    class: u32,
    stragglar: bool,
    /// Its finish when it ran StragglAR.
    finish: Finish,
    /// It ran a finish other than its class's (a probe of another).
    probe: bool,
    /// The class's call before it ran the other algorithm: its time says how the switch went,
    /// not how the algorithm runs, and is not kept (see `estimate`). Per class, so that
    /// interleaved classes (a DDP step's buckets) still sample their explorations.
    after_switch: bool,
}

impl Tracker {
    /// A tracker for `ranks` ranks whose records become readable `lag` (at least 1) calls
    /// after their own.
    pub fn new(policy: Policy, ranks: usize, lag: u64) -> Self {
        Tracker {
            policy,
            ranks,
            lag: lag.max(1),
            detectors: HashMap::new(),
            pending: VecDeque::new(),
            fed: 0,
            tally: ArrivalTally::new(ranks),
            measuring: false,
            times: HashMap::new(),
            untimed: VecDeque::new(),
            baseline_measured: HashMap::new(),
        }
    }

    /// The same tracker, told that its engine feeds every tracked call's post-arrival time
    /// ([`Tracker::feed_time`]): `Auto` then chooses on measured times and explores.
    pub fn measuring(mut self) -> Self {
        self.measuring = true;
        self
    }

    /// The policy every call is decided by.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The next call's number.
    pub fn calls(&self) -> u64 {
        self.fed + self.pending.len() as u64
    }

    /// The record that must be fed before the next call can be decided, if one is due.
    pub fn due(&self) -> Option<u64> {
        (self.pending.len() as u64 >= self.lag).then_some(self.fed)
    }

    /// The choice for the next call, of `bytes`, from the records fed so far, and the call
    /// tracked. Every due record must have been fed (see [`Tracker::due`]).
    pub fn decide(&mut self, bytes: usize) -> Choice {
        self.decide_call(bytes).choice
    }

    /// [`Tracker::decide`], with the finish the call runs if it runs StragglAR.
    pub fn decide_call(&mut self, bytes: usize) -> Decision {
        let choice = self.peek(bytes);
        let finish = self.track_call(bytes, choice);
        Decision { choice, finish }
    }

    /// Tracks the next call, of `bytes`, whose choice was made elsewhere (a fixed algorithm):
    /// its record still feeds the detector and the report.
    pub fn track(&mut self, bytes: usize, choice: Choice) {
        self.track_call(bytes, choice);
    }

    /// [`Tracker::track`], returning the finish the call runs if it runs StragglAR: the
    /// class's, which starts at its first StragglAR call as the model's for the straggler's
    /// lead then ([`Policy::model_finish`]) and, on a measuring tracker, is refined by probing other
    /// finishes (`ClassTimes::finish_for_next`): neighbouring depths with
    /// `STRAGGLAR_PIPELINE=auto`, the other kind where the policy can finish by multicast. The
    /// same on every rank.
    pub fn track_call(&mut self, bytes: usize, choice: Choice) -> Finish {
        debug_assert!(self.due().is_none(), "a due record was not fed");
        let class = size_class(bytes);
        let ranks = self.ranks;
        let detector = self
            .detectors
            .entry(class)
            .or_insert_with(|| Detector::new(ranks, DetectorConfig::default()));
        let stragglar = matches!(choice, Choice::Stragglar { .. });
        self.pending.push_back(Pending { class, stragglar });
        let times = self.times.entry(class).or_default();
        if let Some(rank) = choice.straggler().filter(|_| times.depth() == 0) {
            // The class's first StragglAR call: a straggler is known by then where the policy
            // chose it, and with it the lead the model weighs the finishes at.
            let first = self
                .policy
                .model_finish(bytes, detector.median_lead_ns(rank));
            times.start(self.policy.pieces(bytes), first);
        }
        let most = (self.policy.pipeline() == Pipeline::Auto).then(|| self.policy.depth_cap(bytes));
        let finish = match (stragglar, self.measuring) {
            _ if self.policy.finishes_by_multicast_only() => Finish::Multicast,
            (true, true) => times.finish_for_next(most, self.policy.multicast()),
            _ => times.finish(),
        };
        let after_switch = times.switches(stragglar, finish);
        let probe = stragglar && finish != times.finish();
        times.count_at(stragglar, finish);
        if self.measuring {
            self.untimed.push_back(Untimed {
                class,
                stragglar,
                finish,
                probe,
                after_switch,
            });
        }
        finish
    }

    /// The finish the StragglAR calls of the size class of `bytes` run now, probes aside: what
    /// a call captured into a CUDA graph runs. Before the class's first StragglAR call, the
    /// model's for the lead of its straggler. The same on every rank at the same call.
    pub fn class_finish(&self, bytes: usize) -> Finish {
        match self
            .times
            .get(&size_class(bytes))
            .filter(|t| t.depth() != 0)
        {
            Some(times) => times.finish(),
            None => self.with_class(bytes, |detector, _| {
                let lead = self
                    .policy
                    .straggler(detector)
                    .and_then(|rank| detector.median_lead_ns(rank));
                self.policy.model_finish(bytes, lead)
            }),
        }
    }

    /// The choice [`Tracker::decide`] would make for a call of `bytes`, without tracking a
    /// call (for calls that record no arrival).
    pub fn peek(&self, bytes: usize) -> Choice {
        self.with_class(bytes, |detector, measured| {
            self.policy.choose(detector, measured, bytes)
        })
    }

    /// Whether the policy prefers StragglAR for a call of `bytes` on the records and times fed
    /// so far, explorations aside, priced with the finish `pinned` where the class's graphs
    /// have one ([`Policy::prefers_stragglar`]), without tracking a call: what a call
    /// captured into a CUDA graph goes by. The same on every rank at the same call.
    pub fn prefers_stragglar(&self, bytes: usize, pinned: Option<Finish>) -> bool {
        self.with_class(bytes, |detector, measured| {
            self.policy
                .prefers_stragglar(detector, measured, bytes, pinned)
        })
    }

    /// Runs `f` on the detector and measured times of the size class of `bytes` (a fresh
    /// detector where the class has none yet).
    fn with_class<T>(
        &self,
        bytes: usize,
        f: impl FnOnce(&Detector, Option<&ClassTimes>) -> T,
    ) -> T {
        let class = size_class(bytes);
        let measured = match self.measuring {
            true => self.times.get(&class),
            false => None,
        };
        match self.detectors.get(&class) {
            Some(detector) => f(detector, measured),
            None => f(
                &Detector::new(self.ranks, DetectorConfig::default()),
                measured,
            ),
        }
    }

    /// Feeds the post-arrival time (nanoseconds, the same on every rank) of the oldest tracked
    /// call not yet timed, kept unless the call before it ran the other algorithm; `None`: that
    /// call's time is not known (it is passed over). `false` when no call awaits one or the
    /// tracker is not measuring.
    pub fn feed_time(&mut self, post_ns: Option<u64>) -> bool {
        let Some(call) = self.untimed.pop_front() else {
            return false;
        };
        let Some(post_ns) = post_ns else {
            return true;
        };
        let times = self
            .times
            .get_mut(&call.class)
            .expect("a tracked call created its class's times");
        // A call that ran the class's finish before the class adopted another (its time comes
        // `lag` calls later) measured the old finish but is no probe of it: not kept, so that
        // the old finish's late times cannot take the class straight back.
        let stale = call.stragglar && !call.probe && call.finish != times.finish();
        if !call.after_switch && !stale {
            times.add_at(call.stragglar, call.finish, post_ns);
        }
        true
    }

    /// Whether the call just tracked, of `bytes`, ran the baseline, would keep its time, and
    /// no baseline call of its class was measured in the last [`REMEASURE_AFTER`] class calls.
    /// An engine that measures a sample of the calls the baseline runs (the GPU engine) measures
    /// such a call too: an exploration's kept call, the first kept call after a switch to the
    /// baseline. A choice of what to measure only, never of what runs: it may differ between
    /// ranks without harm.
    pub fn baseline_time_wanted(&self, bytes: usize) -> bool {
        let class = size_class(bytes);
        let Some(call) = self.untimed.back() else {
            return false;
        };
        let decided = self.times.get(&class).map_or(0, |t| t.decided);
        let recent = self
            .baseline_measured
            .get(&class)
            .is_some_and(|&at| decided - at < REMEASURE_AFTER);
        call.class == class && !call.stragglar && !call.after_switch && !recent
    }

    /// Notes that the call just tracked, of `bytes`, a baseline call, is measured.
    pub fn baseline_measured(&mut self, bytes: usize) {
        let class = size_class(bytes);
        let decided = self.times.get(&class).map_or(0, |t| t.decided);
        self.baseline_measured.insert(class, decided);
    }

    /// A size class's measured times and calls (`None` before its first call).
    pub fn class_times(&self, class: u32) -> Option<&ClassTimes> {
        self.times.get(&class)
    }

    /// Feeds the record of the oldest decided call (number [`Tracker::due`] or earlier);
    /// `None` when no call awaits one.
    pub fn feed(&mut self, record: ArrivalRecord) -> Option<Observed> {
        let pending = self.pending.pop_front()?;
        let call = self.fed;
        self.fed += 1;
        let designated = self
            .detectors
            .get_mut(&pending.class)
            .expect("a decided call created its class's detector")
            .observe(record);
        let changed = self
            .tally
            .observe(&record, pending.class, designated, pending.stragglar);
        Some(Observed {
            call,
            class: pending.class,
            designated,
            changed,
        })
    }

    /// `rank`'s arrivals over the records fed so far (`None` outside the communicator).
    pub fn arrivals(&self, rank: usize) -> Option<super::tally::RankArrivals> {
        self.tally.rank(rank)
    }

    /// The straggler report of the records fed so far (`members`: see `ArrivalTally::table`),
    /// then per size class the share of calls each algorithm ran and, where measured, its
    /// median post-arrival time.
    pub fn table(&self, members: &[String]) -> String {
        let mut out = self.tally.table(members);
        let mut classes: Vec<_> = self.times.iter().collect();
        classes.sort_by_key(|(class, _)| **class);
        for (class, times) in classes {
            let share = |calls: u64| 100.0 * calls as f64 / times.decided.max(1) as f64;
            let median =
                |samples: &super::estimate::Samples| match (self.measuring, samples.median()) {
                    (false, _) => "post-arrival not measured".to_string(),
                    (true, None) => "no sample".to_string(),
                    (true, Some(ns)) => format!(
                        "post-arrival median {:.1} us of {}",
                        ns as f64 / 1e3,
                        samples.taken()
                    ),
                };
            let depth = match times.finish() {
                Finish::Pieces(0 | 1) => String::new(),
                finish => format!("{finish}, "),
            };
            out += &format!(
                "# sizes 2^{class} B, {} calls: StragglAR {:.1}% ({depth}{}), baseline {:.1}% ({})\n",
                times.decided,
                share(times.on_stragglar),
                median(&times.stragglar),
                share(times.decided - times.on_stragglar),
                median(&times.baseline),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::policy::{AlgoMode, StragglerMode};
    use crate::schedule::model::Link;

    const LINK: Link = Link {
        alpha: 20e-6,
        bandwidth: 20e6,
    };

    fn tracker(lag: u64) -> Tracker {
        Tracker::new(
            Policy::new(8, AlgoMode::Auto, StragglerMode::Auto, LINK),
            8,
            lag,
        )
    }

    #[test]
    fn a_baseline_time_is_wanted_after_a_switch_and_when_none_is_recent() {
        let mut t = tracker(1000).measuring();
        let bytes = 1 << 20;
        let stragglar = Choice::Stragglar { straggler: 5 };
        let mut wanted = Vec::new();
        // 10 StragglAR calls, then the baseline for good; the engine measures what is wanted.
        for call in 0..200u64 {
            let choice = if call < 10 {
                stragglar
            } else {
                Choice::Baseline
            };
            t.track(bytes, choice);
            if t.baseline_time_wanted(bytes) {
                t.baseline_measured(bytes);
                wanted.push(call);
            }
        }
        // Not the StragglAR calls, not the first baseline call (after a switch: its time is not
        // kept), the second; then once every REMEASURE_AFTER class calls.
        assert_eq!(wanted, [11, 11 + REMEASURE_AFTER, 11 + 2 * REMEASURE_AFTER]);
        // A class measured meanwhile by the sample wants nothing more.
        let mut t = tracker(1000).measuring();
        let mut wanted = 0;
        for call in 0..200u64 {
            t.track(bytes, Choice::Baseline);
            if call % 8 == 0 {
                t.baseline_measured(bytes);
            } else {
                wanted += usize::from(t.baseline_time_wanted(bytes));
            }
        }
        assert_eq!(wanted, 0);
    }

    /// A deterministic arrival pattern: rank 5 last with a long lead in most calls, random
    /// otherwise.
    fn record(call: u64) -> ArrivalRecord {
        let x = call.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
        if x % 10 < 8 {
            ArrivalRecord {
                last_rank: 5,
                lead_ns: Some(300_000_000 + x % 1000),
            }
        } else {
            ArrivalRecord {
                last_rank: (x % 8) as usize,
                lead_ns: Some(x % 5000),
            }
        }
    }

    #[test]
    fn a_record_is_due_exactly_lag_calls_after_its_own() {
        let mut t = tracker(3);
        for call in 0..3 {
            assert_eq!(t.due(), None);
            t.decide(1 << 20);
            assert_eq!(t.calls(), call + 1);
        }
        assert_eq!(t.due(), Some(0));
        assert_eq!(t.feed(record(0)).map(|o| o.call), Some(0));
        assert_eq!(t.due(), None);
        t.decide(1 << 20);
        assert_eq!(t.due(), Some(1));
        let mut empty = tracker(1);
        assert_eq!(empty.feed(record(0)), None, "no call awaits a record");
        assert_eq!(empty.peek(1 << 20), Choice::Baseline);
        assert_eq!(empty.calls(), 0, "peeking tracks no call");
        empty.track(1 << 20, Choice::Stragglar { straggler: 2 });
        assert_eq!(empty.calls(), 1);
        assert_eq!(empty.due(), Some(0));
        empty.feed(record(0));
        assert!(
            empty.table(&[]).contains("1 calls on StragglAR"),
            "{}",
            empty.table(&[])
        );
    }

    /// Runs `calls` calls of `sizes` (cycling), feeding each due record. Returns every choice.
    /// (That every rank chooses alike from its own GPU ring is tested with emulated GPUs in
    /// tests/kernel_emulation.rs.)
    fn run(lag: u64, calls: u64, sizes: &[usize]) -> Vec<Choice> {
        let mut t = tracker(lag);
        (0..calls)
            .map(|c| {
                while let Some(k) = t.due() {
                    t.feed(record(k));
                }
                t.decide(sizes[c as usize % sizes.len()])
            })
            .collect()
    }

    #[test]
    fn a_persistent_straggler_is_used_once_its_records_arrive() {
        let choices = run(32, 400, &[4 << 20]);
        let first = choices
            .iter()
            .position(|c| *c == Choice::Stragglar { straggler: 5 })
            .expect("rank 5 is designated");
        // The window's records arrive 32 calls late, so the first use comes after both.
        assert!((32..=32 + 32 + 16).contains(&first), "{first}");
        assert!(choices[first..]
            .iter()
            .all(|c| *c == Choice::Stragglar { straggler: 5 }));
    }

    #[test]
    fn a_capture_prefers_stragglar_only_once_the_straggler_is_designated() {
        let mut t = tracker(32);
        let bytes = 4 << 20;
        let mut first_preferred = None;
        for call in 0..200u64 {
            while let Some(k) = t.due() {
                t.feed(record(k));
            }
            let prefers = t.prefers_stragglar(bytes, None);
            let calls = t.calls();
            let choice = t.decide(bytes);
            assert_eq!(t.calls(), calls + 1, "asking tracks no call");
            // Unmeasured, nothing explores: the preference is the choice an eager call makes.
            assert_eq!(
                prefers,
                choice == Choice::Stragglar { straggler: 5 },
                "call {call}"
            );
            if prefers && first_preferred.is_none() {
                first_preferred = Some(call);
            }
        }
        assert!(
            first_preferred.is_some_and(|c| c >= 32),
            "{first_preferred:?}"
        );
        assert!(
            !tracker(1).prefers_stragglar(bytes, None),
            "nothing designated"
        );
    }

    #[test]
    fn size_classes_are_tracked_apart_and_the_report_counts_them() {
        let mut t = tracker(2);
        for c in 0..200u64 {
            while let Some(k) = t.due() {
                let o = t.feed(record(k)).unwrap();
                assert_eq!(o.call, k);
                assert_eq!(
                    o.class,
                    size_class(if k % 2 == 0 { 1 << 20 } else { 1 << 10 })
                );
            }
            t.decide(if c % 2 == 0 { 1 << 20 } else { 1 << 10 });
        }
        let members: Vec<String> = (0..8).map(|r| format!("host{r} GPU-0000000{r}")).collect();
        let table = t.table(&members);
        assert!(table.contains("host5 GPU-00000005"), "{table}");
        let five = t.arrivals(5).unwrap();
        assert_eq!(five.calls, 198);
        assert!(
            five.arrived_last > 100 && five.arrived_last < 198,
            "{five:?}"
        );
        assert!(five.median_lead_ns.unwrap() >= 300_000_000);
        assert!(five.p90_lead_ns >= five.median_lead_ns);
        assert_eq!(t.arrivals(8), None);
        assert!(table.contains("198 calls"), "{table}");
        assert!(table.contains("sizes 2^21 B: straggler 5"), "{table}");
        assert!(table.contains("sizes 2^11 B: straggler 5"), "{table}");
    }

    #[test]
    fn a_due_record_was_always_copied_by_a_launched_call() {
        // The GPU engine copies record k into the ring at the start of call k + 1; a host that
        // waits for a due record must already have launched that call, or it waits forever.
        for lag in 2..=40 {
            let mut t = tracker(lag);
            for c in 0..300u64 {
                while let Some(k) = t.due() {
                    assert!(k + 1 < c, "lag {lag}: call {c} waits for record {k}");
                    t.feed(record(k));
                }
                t.decide(1 << 20);
            }
        }
    }

    /// A measuring tracker with the straggler always late: the model says StragglAR, but the
    /// fed post-arrival times say the baseline is three times faster. After the class's first
    /// calls measured both, the baseline runs on every call but one in each exploration period,
    /// and the report gives both medians.
    #[test]
    fn measured_times_override_the_model_within_a_few_calls() {
        let mut t = tracker(1).measuring();
        let late = ArrivalRecord {
            last_rank: 5,
            lead_ns: Some(300_000_000),
        };
        let mut choices = Vec::new();
        for _ in 0..256 {
            // Record k is fed with call k + 1, and its time a call later (as the host engine
            // reads it).
            if let Some(k) = t.due() {
                t.feed(late);
                if k > 0 {
                    assert!(t.feed_time(Some(time_of(choices[k as usize - 1]))));
                }
            }
            let choice = t.decide(1 << 20);
            choices.push(choice);
        }
        let designated_at = choices
            .iter()
            .position(|c| *c != Choice::Baseline)
            .expect("the model chooses StragglAR once rank 5 is designated");
        let settled = designated_at + 4;
        let stragglar_after: Vec<usize> = (settled..choices.len())
            .filter(|&c| choices[c] != Choice::Baseline)
            .collect();
        use super::super::estimate::{EXPLORE_AT, EXPLORE_EVERY};
        let explorations: Vec<usize> = (1..256 / EXPLORE_EVERY)
            .flat_map(|period| EXPLORE_AT.map(|at| (at + period * EXPLORE_EVERY) as usize))
            .collect();
        assert_eq!(
            stragglar_after, explorations,
            "only explorations after call {settled}"
        );
        let times = t.class_times(size_class(1 << 20)).unwrap();
        assert!(times.stragglar.taken() > 0 && times.baseline.taken() > 0);
        let table = t.table(&[]);
        assert!(table.contains("post-arrival median 3000.0 us"), "{table}");
        assert!(table.contains("post-arrival median 1000.0 us"), "{table}");
        assert!(
            !tracker(1).measuring().feed_time(Some(5)),
            "no call awaits a time"
        );
    }

    /// The time of a call that follows a call of the other algorithm is not kept: it says how
    /// the switch went.
    #[test]
    fn a_call_after_a_switch_is_not_sampled() {
        let mut t = tracker(1).measuring();
        let sg = Choice::Stragglar { straggler: 5 };
        for (choice, ns) in [
            (Choice::Baseline, 1_000),
            (sg, 100_000),
            (sg, 5_000),
            (Choice::Baseline, 900_000),
        ] {
            t.track(1 << 20, choice);
            t.feed(record(0));
            assert!(t.feed_time(Some(ns)));
        }
        let times = t.class_times(size_class(1 << 20)).unwrap();
        assert_eq!(times.stragglar.median(), Some(5_000));
        assert_eq!(times.baseline.median(), Some(1_000));
        assert_eq!((times.stragglar.taken(), times.baseline.taken()), (1, 1));
    }

    /// Two size classes called in turn (a DDP step's buckets), one on each algorithm: each
    /// class's exploration pair is sampled, since a call is compared with its own class's call
    /// before it; and a call whose time is unknown (`None`) is passed over.
    #[test]
    fn interleaved_classes_still_sample_their_explorations() {
        let mut t = tracker(1).measuring();
        let sg = Choice::Stragglar { straggler: 5 };
        let (x, y) = (1 << 20, 1 << 10);
        for call in 0..8u64 {
            let (bytes, choice) = match (call % 2 == 0, call / 2) {
                (true, 1 | 2) => (x, sg), // class x explores on its calls 1 and 2
                (true, _) => (x, Choice::Baseline),
                (false, _) => (y, sg),
            };
            t.track(bytes, choice);
            t.feed(record(0));
            assert!(t.feed_time(Some(1_000 + call)));
        }
        let xs = t.class_times(size_class(x)).unwrap();
        assert_eq!(xs.stragglar.taken(), 1, "the second call of the pair");
        assert_eq!(
            xs.baseline.taken(),
            1,
            "call 0; call 3, after the pair, is dropped"
        );
        assert_eq!(t.class_times(size_class(y)).unwrap().stragglar.taken(), 4);
        t.track(x, Choice::Baseline);
        assert!(t.feed_time(None));
        assert_eq!(t.class_times(size_class(x)).unwrap().baseline.taken(), 1);
    }

    /// With `STRAGGLAR_PIPELINE=auto`, measurement refines the model's depth: two trackers fed
    /// the same times (StragglAR fastest at 2 pieces, whatever the model says) probe the same
    /// depths on the same calls and settle on 2; a fixed depth is never probed.
    #[test]
    fn measurement_refines_the_pipeline_depth_alike_on_every_rank() {
        use crate::detect::pipeline::Pipeline;
        let slow_link = Link {
            alpha: 20e-6,
            bandwidth: 20e6,
        };
        let bytes = 1 << 20;
        let policy = |pipeline| {
            Policy::new(8, AlgoMode::Stragglar, StragglerMode::Fixed(7), slow_link)
                .with_pipeline(pipeline)
        };
        let model = policy(Pipeline::Auto).pieces(bytes);
        assert!(model >= 8, "the model's depth here: {model}");
        let time = |pieces: usize| 60_000_000 + 2_000_000 * (pieces as u64).abs_diff(2);
        let mut ranks: Vec<Tracker> = (0..2)
            .map(|_| Tracker::new(policy(Pipeline::Auto), 8, 1).measuring())
            .collect();
        let mut depths = vec![Vec::new(); 2];
        for _ in 0..600 {
            for (t, seen) in ranks.iter_mut().zip(&mut depths) {
                let decision = t.decide_call(bytes);
                seen.push(decision.finish.pieces());
                t.feed(record(0));
                t.feed_time(Some(time(decision.finish.pieces())));
            }
        }
        assert_eq!(depths[0], depths[1]);
        assert_eq!(depths[0][0], model);
        let class = size_class(bytes);
        assert_eq!(ranks[0].class_times(class).unwrap().depth(), 2);
        assert_eq!(depths[0].last(), Some(&2));
        assert!(ranks[0].table(&[]).contains("2 pieces per chunk"));
        let mut fixed = Tracker::new(policy(Pipeline::Pieces(5)), 8, 1).measuring();
        for _ in 0..200 {
            assert_eq!(fixed.decide_call(bytes).finish, Finish::Pieces(5));
            fixed.feed(record(0));
            fixed.feed_time(Some(time(5)));
        }
    }

    /// Where StragglAR may finish by multicast, a class's first finish is the model's at its
    /// straggler's lead, and measurement moves it: two trackers fed the same times probe the
    /// same finishes on the same calls and settle on the faster, which a graph capture then
    /// runs (`class_finish`).
    #[test]
    fn measurement_chooses_between_the_multicast_and_point_to_point_finishes_alike() {
        use crate::schedule::model::Multicast;
        let bytes = 1 << 20;
        let policy = Policy::new(8, AlgoMode::Stragglar, StragglerMode::Fixed(7), LINK)
            .with_multicast(Multicast { ratio: 1.0 });
        let late = |lead_ns| ArrivalRecord {
            last_rank: 7,
            lead_ns: Some(lead_ns),
        };
        let point_to_point = Finish::Pieces(1);
        // Before any record the model's finish is the point-to-point one (it wins from a
        // shorter lead); a lead that hides the gather makes the model finish by multicast.
        let mut fresh = Tracker::new(policy.clone(), 8, 1).measuring();
        assert_eq!(fresh.class_finish(bytes), point_to_point);
        for _ in 0..40 {
            fresh.track(bytes, Choice::Baseline);
            fresh.feed(late(10_000_000_000));
            fresh.feed_time(None);
        }
        assert_eq!(fresh.class_finish(bytes), Finish::Multicast, "10 s of lead");
        assert_eq!(fresh.class_times(size_class(bytes)).unwrap().depth(), 0);
        // Measured: the point-to-point finish 20% faster, whatever the model said.
        let time = |finish: Finish| match finish {
            Finish::Multicast => 6_000_000,
            Finish::Pieces(_) => 5_000_000,
        };
        let mut ranks: Vec<Tracker> = (0..2).map(|_| fresh.clone()).collect();
        let mut finishes = vec![Vec::new(); 2];
        for _ in 0..3 * super::super::estimate::EXPLORE_EVERY {
            for (t, seen) in ranks.iter_mut().zip(&mut finishes) {
                let decision = t.decide_call(bytes);
                seen.push(decision.finish);
                t.feed(late(10_000_000_000));
                t.feed_time(Some(time(decision.finish)));
            }
        }
        assert_eq!(finishes[0], finishes[1]);
        assert_eq!(finishes[0][0], Finish::Multicast, "the model's first");
        assert_eq!(finishes[0].last(), Some(&point_to_point));
        assert_eq!(ranks[0].class_finish(bytes), point_to_point);
        let switched = finishes[0].iter().position(|&f| f == point_to_point);
        assert_eq!(
            switched,
            Some(64 + 33 - 40),
            "the first probe, at class call 97"
        );
        // `STRAGGLAR_MULTICAST=always`: every call finishes by multicast, measured or not.
        let mut only = Tracker::new(policy.clone().multicast_only(), 8, 1).measuring();
        for _ in 0..200 {
            assert_eq!(only.decide_call(bytes).finish, Finish::Multicast);
            only.feed(late(1_000));
            only.feed_time(Some(time(Finish::Multicast)));
        }
        // Without a multicast region nothing finishes by multicast, whatever the lead.
        let plain = Policy::new(8, AlgoMode::Stragglar, StragglerMode::Fixed(7), LINK);
        let mut t = Tracker::new(plain, 8, 1).measuring();
        for _ in 0..200 {
            assert_eq!(t.decide_call(bytes).finish, point_to_point);
            t.feed(late(10_000_000_000));
            t.feed_time(Some(time(point_to_point)));
        }
    }

    /// The measured post-arrival time of a call that ran `choice`: StragglAR 3 ms, the baseline
    /// 1 ms.
    fn time_of(choice: Choice) -> u64 {
        match choice {
            Choice::Baseline => 1_000_000,
            Choice::Stragglar { .. } => 3_000_000,
        }
    }
}
