//! The straggler choice in device memory, for CUDA graph replays (`#[repr(C)]`, shared with
//! `cuda/stragglar_choice.h` through the generated `cuda/stragglar_launch.h`).
//!
//! A captured launch replays with the arguments it was captured with, so it cannot carry a
//! host decision. A graph launch instead reads its call number from device memory, records
//! its arrival on a board of its own, feeds the record to a device twin of the detector
//! (`crate::detect::rule`), one per size class, and picks its plan (StragglAR with the chosen
//! straggler, or the baseline, Ring where it fits the staging) from what earlier replays
//! recorded. Every rank feeds the
//! same records in the same order to the same rule, so every rank picks the same plan, with no
//! host in the loop. The twin is tested against the Rust rule in tests/kernel_emulation.rs.

use crate::detect::estimate::{EXPLORE_AT, EXPLORE_EVERY, MARGIN_PARTS, MAX_AGE, SAMPLES_KEPT};
use crate::detect::policy::{AlgoMode, Policy, StragglerMode};
use crate::detect::rule::{DetectorConfig, MAX_WINDOW};
use crate::detect::{size_class, Finish};

use super::arrival::{RawArrivalNote, RawBoardSlot, RawRingEntry, BOARD_SLOTS, RING_ENTRIES};

/// `RawRule::algo`: StragglAR when the straggler's median lead pays for the call's size.
pub const RULE_ALGO_AUTO: u32 = 0;
/// `RawRule::algo`: StragglAR on every call (`STRAGGLAR_ALGO=stragglar`).
pub const RULE_ALGO_STRAGGLAR: u32 = 1;
/// `RawRule::algo`: the baseline on every call.
pub const RULE_ALGO_BASELINE: u32 = 2;
/// `RawRule::fixed`: the straggler is the detector's designation (`STRAGGLAR_STRAGGLER=auto`).
pub const RULE_DETECTED: u32 = 0xffff_ffff;
/// `RawRule::fixed`: no straggler is ever considered (`STRAGGLAR_STRAGGLER=off`).
pub const RULE_OFF: u32 = 0xffff_fffe;
/// `RawRule::break_even_ns` of a size StragglAR never wins.
pub const RULE_NEVER: u64 = u64::MAX;
/// Records a device detector keeps at most (the Rust rule's `MAX_WINDOW`).
pub const DETECTOR_WINDOW: u32 = 64;
/// Size classes a graph state tracks: `size_class(bytes)` is 0..=64.
pub const SIZE_CLASSES: u32 = 65;

/// Post-arrival times a device class keeps per algorithm (`estimate::SAMPLES_KEPT`).
pub const TIMES_KEPT: u32 = 8;
/// A class explores at its calls `k` with `k % TIMES_EXPLORE_EVERY` equal to
/// `TIMES_EXPLORE_FIRST` or the one after (`estimate::EXPLORE_EVERY`, `EXPLORE_AT`).
pub const TIMES_EXPLORE_EVERY: u64 = 64;
pub const TIMES_EXPLORE_FIRST: u64 = 1;
/// Samples older than this many calls of their class do not count (`estimate::MAX_AGE`).
pub const TIMES_MAX_AGE: u64 = 128;
/// StragglAR wins on measurements when `parts * s < (parts - 1) * b`
/// (`estimate::MARGIN_PARTS`).
pub const TIMES_MARGIN_PARTS: u64 = 50;
/// `RawVerdict::measured`: either algorithm lacks a recent sample (the model decides).
pub const MEASURED_NONE: u32 = 0;
/// `RawVerdict::measured`: StragglAR is faster after arrival by the margin.
pub const MEASURED_STRAGGLAR: u32 = 1;
/// `RawVerdict::measured`: it is not.
pub const MEASURED_BASELINE: u32 = 2;

const _: () = assert!(DETECTOR_WINDOW as usize == MAX_WINDOW);
const _: () = assert!(
    TIMES_KEPT as usize == SAMPLES_KEPT
        && TIMES_EXPLORE_EVERY == EXPLORE_EVERY
        && EXPLORE_AT[0] == TIMES_EXPLORE_FIRST
        && EXPLORE_AT[1] == TIMES_EXPLORE_FIRST + 1
        && TIMES_MAX_AGE == MAX_AGE
        && TIMES_MARGIN_PARTS == MARGIN_PARTS
);
const _: () = assert!(size_class(usize::MAX) < SIZE_CLASSES);

/// The policy of one graph launch: the rule's parameters (the same for every call of a
/// communicator) and the call's own size class and break-even lead.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawRule {
    /// The communicator's size.
    pub ranks: u32,
    /// Records remembered (1..=`DETECTOR_WINDOW`).
    pub window: u32,
    /// Last arrivals in the window that designate a rank (`DetectorConfig::on_count`).
    pub on_count: u32,
    /// Last arrivals in the window below which the designated rank is released.
    pub off_count: u32,
    /// Calls between two changes of the designation.
    pub min_dwell: u64,
    /// The median lead, in nanoseconds, from which StragglAR wins this call's size
    /// (`Policy::break_even_ns`); `RULE_NEVER` when it never does.
    pub break_even_ns: u64,
    /// `RULE_ALGO_*`.
    pub algo: u32,
    /// A fixed straggler's rank, `RULE_DETECTED` or `RULE_OFF`.
    pub fixed: u32,
    /// The call's size class (`crate::detect::size_class`), below `SIZE_CLASSES`.
    pub size_class: u32,
    /// 1: `RULE_ALGO_AUTO` chooses on the measured post-arrival times once both algorithms
    /// have recent ones, and explores, as `Tracker::measuring` does; 0: on the model alone.
    pub measuring: u32,
}

impl RawRule {
    /// The rule `policy` applies, with the default detector, to a call of `bytes`.
    pub fn new(policy: &Policy, bytes: usize) -> RawRule {
        Self::with_detector(policy, DetectorConfig::default(), bytes)
    }

    /// The rule `policy` applies, with a detector of `config`, to a call of `bytes`.
    pub fn with_detector(policy: &Policy, config: DetectorConfig, bytes: usize) -> RawRule {
        let window = config.window.clamp(1, MAX_WINDOW);
        let config = DetectorConfig { window, ..config };
        RawRule {
            ranks: policy.ranks() as u32,
            window: window as u32,
            on_count: config.on_count() as u32,
            off_count: config.off_count() as u32,
            min_dwell: config.min_dwell,
            break_even_ns: policy.break_even_ns(bytes).unwrap_or(RULE_NEVER),
            algo: match policy.algo() {
                AlgoMode::Auto => RULE_ALGO_AUTO,
                AlgoMode::Stragglar => RULE_ALGO_STRAGGLAR,
                AlgoMode::Baseline => RULE_ALGO_BASELINE,
            },
            fixed: match policy.straggler_mode() {
                StragglerMode::Auto => RULE_DETECTED,
                StragglerMode::Fixed(rank) => rank as u32,
                StragglerMode::Off => RULE_OFF,
            },
            size_class: size_class(bytes),
            measuring: 0,
        }
    }

    /// The rule `policy` applies, with the default detector, to a call of `bytes` whose
    /// StragglAR plans are finished by `finish` (a graph launch runs one finish): the lead it
    /// needs is that finish's.
    pub fn of_finish(policy: &Policy, bytes: usize, finish: Finish) -> RawRule {
        RawRule {
            break_even_ns: policy.break_even_ns_of(bytes, finish).unwrap_or(RULE_NEVER),
            ..Self::new(policy, bytes)
        }
    }

    /// The same rule, choosing on measured post-arrival times (see `measuring`).
    pub fn measuring(mut self) -> RawRule {
        self.measuring = 1;
        self
    }
}

/// The device twin of `crate::detect::rule::Detector` (all zeroes: nothing observed, nothing
/// designated). The remembered records sit at `call % window`: the rule only counts them and
/// takes their median, which the order does not change.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDetector {
    /// The last rank of each remembered record.
    pub last: [u32; 64],
    /// Its lead in nanoseconds (saturated to `u32::MAX`, as recorded).
    pub lead: [u32; 64],
    /// Records remembered (at most the window).
    pub len: u32,
    /// The designated rank plus one; 0 when none is.
    pub designated: u32,
    /// Records observed so far.
    pub calls: u64,
    /// `calls` when the designation last changed.
    pub changed_at: u64,
}

/// What a call's choice needs from the detector of its size class: the rank whose lateness
/// decides (`Policy::considered`) and its median lead.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawVerdict {
    /// The considered rank plus one; 0 when none is.
    pub straggler: u32,
    /// 1 when `lead_ns` holds that rank's median lead (it arrived last in a remembered call).
    pub has_lead: u32,
    pub lead_ns: u64,
    /// `MEASURED_*`: what the class's measured post-arrival times say (with a measuring rule).
    pub measured: u32,
    pub reserved: u32,
}

/// The device twin of `crate::detect::estimate::Samples`: one algorithm's recent post-arrival
/// times in a class.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSamples {
    /// The class's decided calls when each sample was taken.
    pub at: [u64; 8],
    /// Each sample, nanoseconds.
    pub ns: [u32; 8],
    /// Samples kept (at most `TIMES_KEPT`), and where the next goes once full.
    pub len: u32,
    pub next: u32,
    /// Samples ever taken.
    pub taken: u64,
}

/// The device twin of `crate::detect::estimate::ClassTimes`, less the counts the class keeps
/// already.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawClassTimes {
    pub stragglar: RawSamples,
    pub baseline: RawSamples,
    /// What the class's latest call ran: 0 before the first, 1 the baseline, 2 StragglAR.
    pub last: u32,
    pub reserved: u32,
}

/// What a graph call left for the feed of its post-arrival time two calls later.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawGraphCall {
    /// Its size class plus one (0: no call).
    pub class_plus_one: u32,
    /// 1 when it ran StragglAR.
    pub stragglar: u32,
    /// 1 when its class's call before it ran the other algorithm: its time is not kept.
    pub after_switch: u32,
    pub reserved: u32,
}

/// One size class of a graph state.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawClassState {
    pub detector: RawDetector,
    /// The verdict class call `k` reads at `verdict[k % 2]`: written only while no launch
    /// reads that half (by an earlier call, for a later one).
    pub verdict: [RawVerdict; 2],
    /// Graph calls of this class completed.
    pub calls: u64,
    pub times: RawClassTimes,
}

/// One rank's graph state, in its staging (zeroed at allocation: a fresh communicator, and
/// so a split or shrunk one, starts with nothing observed).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawGraphState {
    /// Graph calls of this communicator completed: the next one's number, the same on every
    /// rank (all replay the same collectives in the same order).
    pub calls: u64,
    /// Blocks of the current graph call that have finished, and its arrival thread.
    pub finished: u32,
    /// The size class of the previous graph call plus one (whose record the next call feeds);
    /// 0 before the first.
    pub previous_class: u32,
    /// The choice of the latest graph call plus one (a straggler's rank + 1, or `ranks + 1`
    /// for the baseline), for the host's report; 0 before the first.
    pub last_choice: u32,
    /// Keeps the counters below 8-byte aligned, with no implicit padding.
    pub reserved: u32,
    /// Graph calls on StragglAR and on the baseline so far (written by the arrival thread).
    pub on_stragglar: u64,
    pub on_baseline: u64,
    /// What this rank's graph calls noted for their post-arrival times, by call parity (the
    /// eager calls' notes are apart: the two boards number their calls apart).
    pub notes: [RawArrivalNote; 2],
    /// The latest graph calls, call `c` at `c % 4`.
    pub history: [RawGraphCall; 4],
    /// Records of graph calls, as copied from the board (the eager ring's format).
    pub ring: [RawRingEntry; 64],
    /// The graph calls' arrival board (rank 0's is the one every rank uses).
    pub board: [RawBoardSlot; 32],
    pub classes: [RawClassState; 65],
}

const _: () = assert!(RING_ENTRIES == 64 && BOARD_SLOTS == 32 && SIZE_CLASSES == 65);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::model::Link;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(std::mem::size_of::<RawRule>(), 48);
        assert_eq!(std::mem::size_of::<RawDetector>(), 64 * 8 + 24);
        assert_eq!(std::mem::size_of::<RawVerdict>(), 24);
        assert_eq!(std::mem::size_of::<RawSamples>(), 112);
        assert_eq!(std::mem::size_of::<RawClassTimes>(), 232);
        assert_eq!(std::mem::size_of::<RawClassState>(), 536 + 48 + 8 + 232);
        assert_eq!(
            std::mem::size_of::<RawGraphState>(),
            40 + 96 + 64 + 64 * 32 + 32 * 40 + 65 * 824
        );
    }

    #[test]
    fn the_rule_carries_the_policy() {
        let link = Link {
            alpha: 20e-6,
            bandwidth: 20e6,
        };
        let policy = Policy::new(8, AlgoMode::Auto, StragglerMode::Fixed(3), link);
        let rule = RawRule::new(&policy, 1 << 20);
        assert_eq!((rule.ranks, rule.window), (8, 32));
        assert_eq!((rule.on_count, rule.off_count), (24, 16));
        assert_eq!(rule.fixed, 3);
        assert_eq!(rule.size_class, 21);
        assert_eq!(Some(rule.break_even_ns), policy.break_even_ns(1 << 20));
        let three = Policy::new(3, AlgoMode::Stragglar, StragglerMode::Off, link);
        let rule = RawRule::new(&three, 1 << 20);
        assert_eq!(rule.break_even_ns, RULE_NEVER);
        assert_eq!((rule.algo, rule.fixed), (RULE_ALGO_STRAGGLAR, RULE_OFF));
    }
}
