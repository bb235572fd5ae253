//! The per-call choice between StragglAR and the baseline (NCCL's AllReduce on GPUs, Ring on
//! the host engine). Its inputs are identical on every rank (the size of the call, the settings,
//! the shared records), so every rank makes the same choice.

use super::estimate::ClassTimes;
use super::finish::Finish;
use super::pipeline::Pipeline;
use super::rule::Detector;
use crate::schedule::model::{stragglar_rounds, Link, Multicast, Nvls, Times};

/// `STRAGGLAR_ALGO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgoMode {
    /// StragglAR when a straggler is designated and it wins: on the measured post-arrival
    /// times where the engine measures them, else on the model.
    Auto,
    /// StragglAR on every call (the designated straggler, else the last rank).
    Stragglar,
    /// The baseline on every call.
    Baseline,
}

/// `STRAGGLAR_STRAGGLER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StragglerMode {
    /// Detected from the arrival records.
    Auto,
    /// This rank of the communicator (run-to-run deterministic summation order).
    Fixed(usize),
    /// Never designate one.
    Off,
}

/// The modelled phases of StragglAR with one finish, seconds: everything the straggler's lead
/// can hide (`pre`), and what follows its arrival (`post`).
#[derive(Debug, Clone, Copy)]
struct Phases {
    pre: f64,
    post: f64,
}

/// `seconds` in whole nanoseconds, rounded up (0 below zero, saturating).
fn whole_ns(seconds: f64) -> u64 {
    (seconds.max(0.0) * 1e9).ceil().min(u64::MAX as f64) as u64
}

/// What one call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Stragglar { straggler: usize },
    Baseline,
}

impl Choice {
    /// The straggler StragglAR runs with, or `None` for the baseline.
    pub fn straggler(self) -> Option<usize> {
        match self {
            Choice::Stragglar { straggler } => Some(straggler),
            Choice::Baseline => None,
        }
    }
}

/// Pieces per size class and rounds per pieces, worked out on first use.
#[derive(Debug)]
struct PiecesMemo {
    by_class: [std::sync::OnceLock<usize>; 65],
    rounds: std::sync::Mutex<std::collections::HashMap<usize, usize>>,
}

impl Default for PiecesMemo {
    fn default() -> Self {
        PiecesMemo {
            by_class: [const { std::sync::OnceLock::new() }; 65],
            rounds: Default::default(),
        }
    }
}

/// The policy of one communicator.
#[derive(Debug, Clone)]
pub struct Policy {
    ranks: usize,
    algo: AlgoMode,
    straggler: StragglerMode,
    link: Link,
    /// How the model prices the baseline before it is measured: Ring, or NCCL's NVLS where
    /// NCCL would run it (see [`Policy::with_nvls_baseline`]).
    nvls: Option<Nvls>,
    /// Whether StragglAR may finish by one multicast (a communicator with a multicast region),
    /// priced so (see [`Policy::with_multicast`]).
    multicast: Option<Multicast>,
    /// Every StragglAR call finishes by multicast, where it may (`STRAGGLAR_MULTICAST=always`).
    multicast_only: bool,
    /// How deep StragglAR's calls are pipelined (`STRAGGLAR_PIPELINE`).
    pipeline: Pipeline,
    /// Post-arrival rounds of our schedule for `ranks` (`R(n)`), computed once.
    rounds: usize,
    /// What the pipeline depth costs to work out, shared by clones: pieces per size class and
    /// post-arrival rounds per pieces, each computed once (a schedule is synthesized for each).
    pieces_memo: std::sync::Arc<PiecesMemo>,
}

impl Policy {
    /// A policy for `ranks` ranks whose links the model describes as `link`.
    pub fn new(ranks: usize, algo: AlgoMode, straggler: StragglerMode, link: Link) -> Self {
        let straggler = match straggler {
            StragglerMode::Fixed(r) if r >= ranks => StragglerMode::Auto,
            other => other,
        };
        Policy {
            ranks,
            algo,
            straggler,
            link,
            nvls: None,
            multicast: None,
            multicast_only: false,
            pipeline: Pipeline::Pieces(1),
            pieces_memo: Default::default(),
            rounds: if ranks >= 2 {
                stragglar_rounds(ranks, 1)
            } else {
                0
            },
        }
    }

    /// The same policy, whose model prices the baseline as NCCL's NVLS AllReduce (`nvls`)
    /// instead of Ring: what NCCL runs on NVSwitch servers of Hopper and later. Communicators
    /// larger than [`Nvls::MAX_RANKS`] keep Ring's price (the published figure does not cover
    /// them).
    pub fn with_nvls_baseline(mut self, nvls: Nvls) -> Self {
        self.nvls = Some(nvls);
        self
    }

    /// The same policy for a communicator whose StragglAR may also finish by one multicast
    /// (`multicast` prices the stores): the model then weighs both finishes
    /// ([`Policy::model_finish`]), and StragglAR wins from the shorter of their break-evens.
    pub fn with_multicast(mut self, multicast: Multicast) -> Self {
        self.multicast = Some(multicast);
        self
    }

    /// The same policy, finishing every StragglAR call by multicast where
    /// [`Policy::with_multicast`] says it may (`STRAGGLAR_MULTICAST=always`): the point-to-point
    /// finish is neither modelled nor probed.
    pub fn multicast_only(mut self) -> Self {
        self.multicast_only = true;
        self
    }

    /// Whether StragglAR may finish by one multicast (see [`Policy::with_multicast`]).
    pub fn multicast(&self) -> bool {
        self.multicast.is_some()
    }

    /// Whether every StragglAR call finishes by multicast (see [`Policy::multicast_only`]).
    pub fn finishes_by_multicast_only(&self) -> bool {
        self.multicast_only && self.multicast.is_some()
    }

    /// The same policy, pipelining StragglAR's calls as `pipeline` says.
    pub fn with_pipeline(mut self, pipeline: Pipeline) -> Self {
        self.pipeline = pipeline;
        self.pieces_memo = Default::default();
        self
    }

    /// `STRAGGLAR_PIPELINE` as this policy applies it.
    pub fn pipeline(&self) -> Pipeline {
        self.pipeline
    }

    /// Pieces per chunk of a StragglAR call of `bytes` (1: the plain schedule): the same for
    /// every call of a size class, on every rank. Worked out once per class.
    pub fn pieces(&self, bytes: usize) -> usize {
        let class = super::classes::size_class(bytes) as usize;
        *self.pieces_memo.by_class[class]
            .get_or_init(|| self.pipeline.pieces(self.ranks, bytes, self.link))
    }

    /// The deepest pipeline a StragglAR call of `bytes` may run while measurement refines the
    /// model's depth (`STRAGGLAR_PIPELINE=auto`): twice the model's, within what the schedule
    /// allows; a fixed depth is never refined.
    pub fn depth_cap(&self, bytes: usize) -> usize {
        match self.pipeline {
            Pipeline::Auto => (2 * self.pieces(bytes)).clamp(1, Pipeline::most_pieces(self.ranks)),
            Pipeline::Pieces(_) => self.pieces(bytes),
        }
    }

    /// Every pieces per chunk a StragglAR call of at most `max_bytes` may run, ascending: the
    /// fixed depth, or with `auto` every depth up to the largest [`Policy::depth_cap`].
    pub fn pieces_up_to(&self, max_bytes: usize) -> Vec<usize> {
        let classes = 0..=super::classes::size_class(max_bytes);
        let bytes_of = |class: u32| match class {
            0 => 0,
            c => 1usize << (c - 1),
        };
        match self.pipeline {
            Pipeline::Pieces(_) => vec![self.pieces(max_bytes)],
            Pipeline::Auto => {
                let deepest = classes.map(|c| self.depth_cap(bytes_of(c))).max();
                (1..=deepest.unwrap_or(1)).collect()
            }
        }
    }

    /// Every finish a StragglAR call of at most `max_bytes` may run: the depths of
    /// [`Policy::pieces_up_to`], and the multicast finish where the communicator has it.
    pub fn finishes_up_to(&self, max_bytes: usize) -> Vec<Finish> {
        if self.finishes_by_multicast_only() {
            return vec![Finish::Multicast];
        }
        let point_to_point = self.pieces_up_to(max_bytes).into_iter().map(Finish::Pieces);
        let multicast = self.multicast.map(|_| Finish::Multicast);
        point_to_point.chain(multicast).collect()
    }

    /// Post-arrival rounds of our schedule with `pieces` pieces per chunk (`R_k(n)`).
    fn rounds_with(&self, pieces: usize) -> usize {
        if pieces == 1 {
            return self.rounds;
        }
        let mut memo = self
            .pieces_memo
            .rounds
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *memo
            .entry(pieces)
            .or_insert_with(|| stragglar_rounds(self.ranks, pieces))
    }

    /// Whether the model prices the baseline as NVLS.
    pub fn nvls_baseline(&self) -> bool {
        self.nvls.is_some() && self.ranks <= Nvls::MAX_RANKS
    }

    /// The smallest lead (seconds) from which StragglAR beats the baseline for `bytes`, per
    /// the model, with whichever finish needs the shorter lead; `None` when it never does (n =
    /// 3, or no faster after arrival).
    pub fn break_even(&self, bytes: usize) -> Option<f64> {
        if self.finishes_by_multicast_only() {
            return self.break_even_of(bytes, Finish::Multicast);
        }
        let point_to_point = self.break_even_of(bytes, Finish::Pieces(self.pieces(bytes)));
        let multicast = self.break_even_of(bytes, Finish::Multicast);
        match (point_to_point, multicast) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// [`Policy::break_even`] of StragglAR finished by `finish`; `None` also for a multicast
    /// finish this communicator does not have.
    pub fn break_even_of(&self, bytes: usize, finish: Finish) -> Option<f64> {
        if self.ranks < 3 {
            return None;
        }
        let phases = self.phases(bytes, finish)?;
        let baseline = self.baseline_time(bytes);
        (phases.post < baseline).then(|| (phases.pre + phases.post - baseline).max(0.0))
    }

    /// The finish the model expects fastest for a StragglAR call of `bytes` whose straggler
    /// leads by `lead_ns` (`max(D, T_pre) + T_post`, the smaller; the point-to-point one on a
    /// tie, or where the communicator has no multicast region). With no lead known yet, the
    /// finish that wins from the shorter lead.
    pub fn model_finish(&self, bytes: usize, lead_ns: Option<u64>) -> Finish {
        let point_to_point = Finish::Pieces(self.pieces(bytes));
        if self.finishes_by_multicast_only() {
            return Finish::Multicast;
        }
        if self.multicast.is_none() || self.ranks < 3 {
            return point_to_point;
        }
        let faster = match lead_ns {
            Some(lead) => {
                let completion = |finish| {
                    self.phases(bytes, finish)
                        .map(|p| (lead as f64 * 1e-9).max(p.pre) + p.post)
                };
                completion(Finish::Multicast) < completion(point_to_point)
            }
            None => {
                let lead = |finish| self.break_even_of(bytes, finish).unwrap_or(f64::INFINITY);
                lead(Finish::Multicast) < lead(point_to_point)
            }
        };
        match faster {
            true => Finish::Multicast,
            false => point_to_point,
        }
    }

    /// The modelled phases of StragglAR finished by `finish` for `bytes` (`None`: a multicast
    /// finish without a multicast region, or fewer than 3 ranks).
    fn phases(&self, bytes: usize, finish: Finish) -> Option<Phases> {
        if self.ranks < 3 {
            return None;
        }
        let m = bytes as f64;
        match finish {
            Finish::Multicast => {
                let times = self.multicast?.times(self.ranks, m, self.link);
                Some(Phases {
                    pre: times.pre(),
                    post: times.post,
                })
            }
            Finish::Pieces(pieces) => {
                let times = Times::new(self.ranks, self.rounds, m, self.link);
                let pieces = pieces.max(1);
                // The pipelined schedule after arrival: R_k rounds of M / ((n-1) k).
                let piece = m / ((self.ranks - 1) * pieces) as f64;
                Some(Phases {
                    pre: times.reduce_scatter,
                    post: match pieces {
                        1 => times.stragglar_post,
                        k => self.link.rounds(self.rounds_with(k), piece),
                    },
                })
            }
        }
    }

    /// The baseline's modelled time once every rank has arrived: NCCL's NVLS where the policy
    /// prices it so, else Ring.
    fn baseline_time(&self, bytes: usize) -> f64 {
        let m = bytes as f64;
        self.nvls
            .and_then(|nvls| nvls.time(self.ranks, m, self.link))
            .unwrap_or_else(|| Times::new(self.ranks, self.rounds, m, self.link).ring)
    }

    /// [`Policy::break_even`] in whole nanoseconds, rounded up: the lead a call of `bytes`
    /// needs, compared with the recorded leads as integers (as the device twin compares them).
    pub fn break_even_ns(&self, bytes: usize) -> Option<u64> {
        self.break_even(bytes).map(whole_ns)
    }

    /// [`Policy::break_even_of`] in whole nanoseconds, rounded up (see
    /// [`Policy::break_even_ns`]).
    pub fn break_even_ns_of(&self, bytes: usize, finish: Finish) -> Option<u64> {
        self.break_even_of(bytes, finish).map(whole_ns)
    }

    /// `STRAGGLAR_ALGO` as this policy applies it.
    pub fn algo(&self) -> AlgoMode {
        self.algo
    }

    /// `STRAGGLAR_STRAGGLER` as this policy applies it (a fixed rank outside the
    /// communicator reads as `Auto`).
    pub fn straggler_mode(&self) -> StragglerMode {
        self.straggler
    }

    /// The communicator's size.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The rank whose lateness decides a call: the fixed rank, the designated one, or none.
    pub fn considered(&self, designated: Option<usize>) -> Option<usize> {
        match self.straggler {
            StragglerMode::Auto => designated,
            StragglerMode::Fixed(rank) => Some(rank),
            StragglerMode::Off => None,
        }
    }

    /// The straggler this call would designate.
    pub fn straggler(&self, detector: &Detector) -> Option<usize> {
        self.considered(detector.designated())
    }

    /// The choice for a call of `bytes` given everything observed before it: the class's
    /// arrival records (`detector`) and, where the engine measures them, its post-arrival
    /// times (`measured`). With measurements, `Auto` prefers the faster algorithm once both
    /// have a sample (the model decides before), and the class's exploration calls run the
    /// other one.
    pub fn choose(
        &self,
        detector: &Detector,
        measured: Option<&ClassTimes>,
        bytes: usize,
    ) -> Choice {
        self.choose_exploring(detector, measured, bytes, true, None)
    }

    /// Whether StragglAR is what the policy prefers for a call of `bytes` on what was
    /// observed before it: [`Policy::choose`] with the class's explorations left aside. A
    /// graph capture goes by it: its replays all run what it captured, and none of them is an
    /// exploration. `pinned`: the finish the replays will run, where the class's graphs have one
    /// already (fixed at its first capture); the lead must then pay for that finish, and a
    /// class whose StragglAR times were measured on another finish is priced on the model
    /// alone (its baseline times set aside with them: the comparison needs both).
    pub fn prefers_stragglar(
        &self,
        detector: &Detector,
        measured: Option<&ClassTimes>,
        bytes: usize,
        pinned: Option<Finish>,
    ) -> bool {
        let measured = match pinned {
            Some(finish) => measured.filter(|t| t.depth() == 0 || t.finish() == finish),
            None => measured,
        };
        matches!(
            self.choose_exploring(detector, measured, bytes, false, pinned),
            Choice::Stragglar { .. }
        )
    }

    /// [`Policy::choose`], running the class's exploration calls only where `explore`, and
    /// pricing StragglAR with `finish` where given.
    fn choose_exploring(
        &self,
        detector: &Detector,
        measured: Option<&ClassTimes>,
        bytes: usize,
        explore: bool,
        finish: Option<Finish>,
    ) -> Choice {
        if self.ranks < 2 {
            return Choice::Baseline;
        }
        let straggler = self.straggler(detector);
        match self.algo {
            AlgoMode::Baseline => Choice::Baseline,
            AlgoMode::Stragglar => Choice::Stragglar {
                straggler: straggler.unwrap_or(self.ranks - 1),
            },
            AlgoMode::Auto => {
                let Some(rank) = straggler else {
                    return Choice::Baseline;
                };
                let lead = detector.median_lead_ns(rank);
                // A class that ran StragglAR runs its own finish: the lead that finish needs;
                // before, the shorter of the finishes' (the one its first call would take).
                let needed = match (finish, measured.filter(|times| times.depth() != 0)) {
                    (Some(finish), _) => self.break_even_ns_of(bytes, finish),
                    (None, Some(times)) => self.break_even_ns_of(bytes, times.finish()),
                    (None, None) => self.break_even_ns(bytes),
                };
                let modelled =
                    matches!((needed, lead), (Some(needed), Some(lead)) if lead >= needed);
                let (prefers, explores) = match measured {
                    Some(times) => (
                        times.stragglar_wins().unwrap_or(modelled),
                        explore && times.explores_next(),
                    ),
                    None => (modelled, false),
                };
                match prefers != explores {
                    true => Choice::Stragglar { straggler: rank },
                    false => Choice::Baseline,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::rule::{ArrivalRecord, DetectorConfig};

    const LINK: Link = Link {
        alpha: 20e-6,
        bandwidth: 20e6,
    };

    fn detector_with(ranks: usize, last: usize, lead_ns: u64) -> Detector {
        let mut d = Detector::new(ranks, DetectorConfig::default());
        for _ in 0..40 {
            d.observe(ArrivalRecord {
                last_rank: last,
                lead_ns: Some(lead_ns),
            });
        }
        d
    }

    #[test]
    fn auto_needs_a_straggler_late_enough_for_the_size() {
        let p = Policy::new(8, AlgoMode::Auto, StragglerMode::Auto, LINK);
        let late = detector_with(8, 7, 200_000_000);
        assert_eq!(
            p.choose(&late, None, 1 << 20),
            Choice::Stragglar { straggler: 7 }
        );
        let barely = detector_with(8, 7, 1_000);
        assert_eq!(
            p.choose(&barely, None, 1 << 20),
            Choice::Baseline,
            "1 us does not pay at 1 MiB"
        );
        let nobody = Detector::new(8, DetectorConfig::default());
        assert_eq!(p.choose(&nobody, None, 1 << 20), Choice::Baseline);
        assert_eq!(Choice::Baseline.straggler(), None);
        assert_eq!(p.choose(&late, None, 1 << 20).straggler(), Some(7));
    }

    #[test]
    fn three_ranks_never_use_stragglar_in_auto() {
        let p = Policy::new(3, AlgoMode::Auto, StragglerMode::Auto, LINK);
        assert_eq!(p.break_even(1 << 30), None);
        assert_eq!(
            p.choose(&detector_with(3, 2, u64::MAX / 2), None, 1 << 20),
            Choice::Baseline
        );
    }

    #[test]
    fn settings_force_or_forbid() {
        let d = detector_with(8, 2, 200_000_000);
        let forced = Policy::new(8, AlgoMode::Stragglar, StragglerMode::Off, LINK);
        assert_eq!(
            forced.choose(&d, None, 64),
            Choice::Stragglar { straggler: 7 }
        );
        let fixed = Policy::new(8, AlgoMode::Stragglar, StragglerMode::Fixed(4), LINK);
        assert_eq!(
            fixed.choose(&d, None, 64),
            Choice::Stragglar { straggler: 4 }
        );
        let never = Policy::new(8, AlgoMode::Baseline, StragglerMode::Auto, LINK);
        assert_eq!(never.choose(&d, None, 1 << 20), Choice::Baseline);
        let off = Policy::new(8, AlgoMode::Auto, StragglerMode::Off, LINK);
        assert_eq!(off.choose(&d, None, 1 << 20), Choice::Baseline);
        let out_of_range = Policy::new(8, AlgoMode::Auto, StragglerMode::Fixed(9), LINK);
        assert_eq!(
            out_of_range.choose(&d, None, 1 << 20),
            Choice::Stragglar { straggler: 2 },
            "falls back to auto"
        );
    }

    #[test]
    fn measured_times_override_the_model_and_exploration_runs_the_other() {
        let p = Policy::new(8, AlgoMode::Auto, StragglerMode::Auto, LINK);
        let late = detector_with(8, 7, 200_000_000);
        let mut times = ClassTimes::default();
        let sg = Choice::Stragglar { straggler: 7 };
        assert_eq!(p.choose(&late, Some(&times), 1 << 20), sg, "the model's");
        times.count(true);
        for _ in 0..2 {
            let choice = p.choose(&late, Some(&times), 1 << 20);
            assert_eq!(choice, Choice::Baseline, "explores two in a row");
            times.count(false);
        }
        assert_eq!(p.choose(&late, Some(&times), 1 << 20), sg, "the model's");
        // Measured: the baseline three times faster after arrival, whatever the model says.
        times.add(true, 3_000_000);
        times.add(false, 1_000_000);
        assert_eq!(p.choose(&late, Some(&times), 1 << 20), Choice::Baseline);
        while !times.explores_next() {
            times.count(false);
        }
        assert_eq!(p.choose(&late, Some(&times), 1 << 20), sg, "explores");
        // No straggler: nothing to explore.
        let nobody = Detector::new(8, DetectorConfig::default());
        assert_eq!(p.choose(&nobody, Some(&times), 1 << 20), Choice::Baseline);
        // A fixed algorithm never explores.
        let fixed = Policy::new(8, AlgoMode::Baseline, StragglerMode::Auto, LINK);
        assert_eq!(fixed.choose(&late, Some(&times), 1 << 20), Choice::Baseline);
    }

    /// An NVSwitch GPU's link as NCCL's Ring reaches it (3 us, 370 GB/s), and NVLS at NCCL's
    /// published ratio.
    const SWITCH_LINK: Link = Link {
        alpha: 3e-6,
        bandwidth: 370e9,
    };
    const PUBLISHED_NVLS: Nvls = Nvls {
        ratio: Nvls::PUBLISHED_RATIO,
    };

    /// Priced against NVLS (as NCCL runs on an 8-GPU NVSwitch server) the model needs a
    /// longer lead than against Ring, and above 8 ranks it keeps Ring's price.
    #[test]
    fn an_nvls_baseline_needs_a_longer_lead() {
        let (link, nvls) = (SWITCH_LINK, PUBLISHED_NVLS);
        let ring = Policy::new(8, AlgoMode::Auto, StragglerMode::Auto, link);
        let switch = ring.clone().with_nvls_baseline(nvls);
        assert!(!ring.nvls_baseline() && switch.nvls_baseline());
        let bytes = 1 << 30;
        let (against_ring, against_nvls) = (
            ring.break_even(bytes).unwrap(),
            switch.break_even(bytes).unwrap(),
        );
        assert!(against_nvls > against_ring, "{against_ring} {against_nvls}");
        // T_RS + T_post - T_nvls, by hand: 6 rounds and 9 rounds of M/7, NVLS 2a + M/(rB).
        let m = bytes as f64;
        let by_hand = 15.0 * (3e-6 + m / 7.0 / 370e9) - (6e-6 + m / (nvls.ratio * 370e9));
        assert!(
            (against_nvls - by_hand).abs() < 1e-9,
            "{against_nvls} {by_hand}"
        );
        let sixteen = Policy::new(16, AlgoMode::Auto, StragglerMode::Auto, link);
        assert_eq!(
            sixteen.clone().with_nvls_baseline(nvls).break_even(bytes),
            sixteen.break_even(bytes)
        );
    }

    /// A communicator whose StragglAR may finish by one multicast prices that finish by the
    /// multicast model (against NVLS where NCCL runs it, Ring otherwise) beside the
    /// point-to-point one: StragglAR wins from the shorter break-even, and the model's finish
    /// is the one that completes first at the straggler's lead.
    #[test]
    fn a_multicast_finish_is_weighed_against_the_point_to_point_one() {
        let (link, nvls) = (SWITCH_LINK, PUBLISHED_NVLS);
        let multicast = Multicast {
            ratio: Multicast::ASSUMED_RATIO,
        };
        let plain = Policy::new(8, AlgoMode::Auto, StragglerMode::Auto, link)
            .with_pipeline(Pipeline::Auto)
            .with_nvls_baseline(nvls);
        let both = plain.clone().with_multicast(multicast);
        assert!(!plain.multicast() && both.multicast());
        let bytes = 1 << 30;
        let m = bytes as f64;
        let modelled = multicast.times(8, m, link);
        let baseline = nvls.time(8, m, link).unwrap();
        assert_eq!(
            both.break_even_of(bytes, Finish::Multicast),
            modelled.break_even(baseline)
        );
        assert_eq!(plain.break_even_of(bytes, Finish::Multicast), None);
        // One broadcast after arrival is shorter than NVLS, so some lead makes it win; it needs
        // a longer one than the pipelined point-to-point schedule (its gather comes first), so
        // StragglAR wins from the point-to-point break-even.
        let pieces = both.pieces(bytes);
        assert!(pieces > 1, "still pipelined: {pieces}");
        let point_to_point = both.break_even_of(bytes, Finish::Pieces(pieces)).unwrap();
        let by_multicast = both.break_even_of(bytes, Finish::Multicast).unwrap();
        assert!(modelled.post < baseline);
        assert!(
            point_to_point < by_multicast,
            "{point_to_point} {by_multicast}"
        );
        assert_eq!(both.break_even(bytes), Some(point_to_point));
        assert_eq!(plain.break_even(bytes), Some(point_to_point));
        // The model's finish: point to point while the lead is short (or unknown), one
        // multicast once the lead hides the gather too (its post-arrival time is shorter).
        let ns = |seconds: f64| Some((seconds * 1e9) as u64);
        assert_eq!(both.model_finish(bytes, None), Finish::Pieces(pieces));
        assert_eq!(
            both.model_finish(bytes, ns(by_multicast)),
            Finish::Pieces(pieces)
        );
        assert_eq!(
            both.model_finish(bytes, ns(modelled.pre() + 1e-3)),
            Finish::Multicast
        );
        assert_eq!(plain.model_finish(bytes, ns(1.0)), Finish::Pieces(pieces));
        // `STRAGGLAR_MULTICAST=always`: the multicast finish alone, where the region formed.
        let only = both.clone().multicast_only();
        assert!(only.finishes_by_multicast_only());
        assert!(!plain.clone().multicast_only().finishes_by_multicast_only());
        assert_eq!(only.model_finish(bytes, None), Finish::Multicast);
        assert_eq!(only.break_even(bytes), Some(by_multicast));
        assert_eq!(only.finishes_up_to(bytes), [Finish::Multicast]);
        // Against Ring.
        let ring =
            Policy::new(8, AlgoMode::Auto, StragglerMode::Auto, link).with_multicast(multicast);
        assert_eq!(
            ring.break_even_of(bytes, Finish::Multicast),
            modelled.break_even(Times::new(8, stragglar_rounds(8, 1), m, link).ring)
        );
        // Every finish a call may run: each depth, then the multicast one.
        let finishes = both.finishes_up_to(bytes);
        assert_eq!(finishes.last(), Some(&Finish::Multicast));
        assert_eq!(finishes.len(), plain.pieces_up_to(bytes).len() + 1);
        assert_eq!(
            plain.finishes_up_to(bytes).last(),
            Some(&Finish::Pieces(finishes.len() - 1))
        );
    }

    /// Before measurements decide, a class that started on one finish needs that finish's lead:
    /// a lead between the point-to-point and the multicast break-evens sends a fresh class to
    /// StragglAR (its first call would finish point to point) and a class on multicast to NCCL.
    #[test]
    fn a_started_class_needs_the_lead_of_its_own_finish() {
        let multicast = Multicast {
            ratio: Multicast::ASSUMED_RATIO,
        };
        let policy = Policy::new(8, AlgoMode::Auto, StragglerMode::Auto, SWITCH_LINK)
            .with_nvls_baseline(PUBLISHED_NVLS)
            .with_multicast(multicast);
        let bytes = 1 << 30;
        let short = policy.break_even_ns_of(bytes, Finish::Pieces(1)).unwrap();
        let long = policy.break_even_ns_of(bytes, Finish::Multicast).unwrap();
        assert!(short < long, "{short} {long}");
        let between = detector_with(8, 7, (short + long) / 2);
        let sg = Choice::Stragglar { straggler: 7 };
        let fresh = ClassTimes::default();
        assert_eq!(policy.choose(&between, Some(&fresh), bytes), sg);
        let mut on_multicast = ClassTimes::default();
        on_multicast.start(1, Finish::Multicast);
        assert_eq!(
            policy.choose(&between, Some(&on_multicast), bytes),
            Choice::Baseline
        );
        let mut point_to_point = ClassTimes::default();
        point_to_point.start(1, Finish::Pieces(1));
        assert_eq!(policy.choose(&between, Some(&point_to_point), bytes), sg);
        // A capture goes by the finish its class's graphs were pinned to, whatever the class
        // runs now: the lead between the two break-evens pays for one and not the other.
        let prefers = |times: &ClassTimes, pinned| {
            policy.prefers_stragglar(&between, Some(times), bytes, pinned)
        };
        assert!(prefers(&point_to_point, None));
        assert!(!prefers(&point_to_point, Some(Finish::Multicast)));
        assert!(!prefers(&on_multicast, None));
        assert!(prefers(&on_multicast, Some(Finish::Pieces(1))));
        assert!(prefers(&fresh, Some(Finish::Pieces(1))));
        assert!(!prefers(&fresh, Some(Finish::Multicast)));
        // Times measured on another finish say nothing of the pinned one: a class whose
        // multicast calls beat NCCL, at a lead too short for the point-to-point finish, does
        // not capture a graph pinned to point to point; unpinned, its measurements decide.
        let short_lead = detector_with(8, 7, short / 2);
        let mut measured = ClassTimes::default();
        measured.start(1, Finish::Multicast);
        for _ in 0..8 {
            measured.add(true, 1_000_000);
            measured.add(false, 2_000_000);
            measured.decided += 1;
        }
        assert_eq!(measured.stragglar_wins(), Some(true));
        let prefers_short =
            |pinned| policy.prefers_stragglar(&short_lead, Some(&measured), bytes, pinned);
        assert!(prefers_short(None));
        assert!(prefers_short(Some(Finish::Multicast)));
        assert!(!prefers_short(Some(Finish::Pieces(1))));
    }

    #[test]
    fn the_break_even_grows_with_size() {
        let p = Policy::new(8, AlgoMode::Auto, StragglerMode::Auto, LINK);
        let small = p.break_even(64 << 10).unwrap();
        let large = p.break_even(4 << 20).unwrap();
        assert!(0.0 <= small && small < large, "{small} {large}");
    }
}
