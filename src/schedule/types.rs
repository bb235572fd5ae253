//! The data types of a schedule: transfers, rounds, phases.

/// How a transfer combines into the destination's copy of a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// The destination merges the source's value into its own; the two contribution sets
    /// must be disjoint (nothing is counted twice).
    Reduce,
    /// The destination's value is replaced by the source's.
    Copy,
}

impl Op {
    /// The name used in plans: `"reduce"` or `"copy"`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Reduce => "reduce",
            Op::Copy => "copy",
        }
    }
}

/// One chunk moving from `src` to `dst` in one round.
///
/// Ranks are physical in an assembled [`Schedule`] (logical while a synthesizer builds it);
/// `chunk` is in `0..Schedule::chunks`. The source's value is read as of the start of the round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// Sending rank.
    pub src: usize,
    /// Receiving rank; never equal to `src`.
    pub dst: usize,
    /// Chunk index (with pipelining, piece `p` of chunk `c` is `c * k + p`).
    pub chunk: usize,
    /// How `dst` combines the value.
    pub op: Op,
}

impl Transfer {
    /// A copy of `chunk` from `src` to `dst`.
    pub fn copy(src: usize, dst: usize, chunk: usize) -> Self {
        Transfer {
            src,
            dst,
            chunk,
            op: Op::Copy,
        }
    }

    /// A reduction of `chunk` from `src` into `dst`.
    pub fn reduce(src: usize, dst: usize, chunk: usize) -> Self {
        Transfer {
            src,
            dst,
            chunk,
            op: Op::Reduce,
        }
    }
}

/// The transfers of one round. Round model: every rank is the source of at most one and the
/// destination of at most one transfer per round (full duplex, any peer); in a multicast
/// schedule ([`Schedule::multicast`]) a rank's sends in one round may instead carry one chunk
/// to any number of destinations, as one multicast store reaches every receiver. The order of
/// the transfers inside a round carries no meaning.
pub type Round = Vec<Transfer>;

/// Which part of a call a phase is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PhaseKind {
    /// Before the straggler arrives: a ReduceScatter among the `n-1` others. The straggler
    /// takes no part.
    ReduceScatter,
    /// Before the straggler arrives, after the ReduceScatter: the early ranks' reduced chunks
    /// written into the straggler's memory (multicast StragglAR). The straggler only receives.
    Gather,
    /// After the straggler arrives: exchanges with the straggler and copies of final chunks.
    Stragglar,
    /// The whole call of an algorithm without a straggler (Ring, halving-doubling).
    AllReduce,
}

impl PhaseKind {
    /// The phase name used in plans: `reduce_scatter`, `gather`, `stragglar` or `allreduce`.
    pub fn name(self) -> &'static str {
        match self {
            PhaseKind::ReduceScatter => "reduce_scatter",
            PhaseKind::Gather => "gather",
            PhaseKind::Stragglar => "stragglar",
            PhaseKind::AllReduce => "allreduce",
        }
    }

    /// Whether the phase runs while the straggler is late (its rounds are hidden by the wait).
    pub fn before_arrival(self) -> bool {
        matches!(self, PhaseKind::ReduceScatter | PhaseKind::Gather)
    }
}

/// A named sequence of rounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    /// What the phase is; decides whether the straggler may take part.
    pub kind: PhaseKind,
    /// The rounds, in execution order.
    pub rounds: Vec<Round>,
}

/// A complete AllReduce schedule in physical ranks.
///
/// Plain data; [`crate::schedule::verify`] checks every invariant: ranks in `0..ranks`, chunks
/// in `0..chunks`, the port rule, no double counting, no straggler in `reduce_scatter`, and
/// every rank holding every chunk with all `ranks` contributions at the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Number of ranks `n >= 2`.
    pub ranks: usize,
    /// The straggler's physical rank, `None` for algorithms without one.
    pub straggler: Option<usize>,
    /// Number of chunks the buffer is cut into (pieces, when pipelined).
    pub chunks: usize,
    /// Pieces per chunk `k >= 1` (1 without pipelining); piece `p` of chunk `c` is
    /// chunk index `c * k + p`.
    pub pieces_per_chunk: usize,
    /// The phases in order: `[reduce_scatter, stragglar]` with a straggler (`[reduce_scatter,
    /// gather, stragglar]` for multicast StragglAR), `[allreduce]` without.
    pub phases: Vec<Phase>,
    /// Whether sends are multicast: a rank's transfers in one round may carry one chunk to
    /// several destinations (see [`Round`]).
    pub multicast: bool,
}

impl Schedule {
    /// The phase of the given kind, if the schedule has one.
    pub fn phase(&self, kind: PhaseKind) -> Option<&Phase> {
        self.phases.iter().find(|p| p.kind == kind)
    }

    /// Rounds that run after the straggler arrives (all rounds when there is no straggler).
    pub fn exposed_rounds(&self) -> usize {
        self.phases
            .iter()
            .filter(|p| !p.kind.before_arrival())
            .map(|p| p.rounds.len())
            .sum()
    }
}
