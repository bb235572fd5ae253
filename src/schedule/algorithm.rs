//! Choosing and assembling a schedule: the public entry point of the module.

use std::fmt;

use super::relabel::Relabel;
use super::types::{Phase, PhaseKind, Schedule};
use super::{baseline, multicast, post_arrival, reduce_scatter};

/// The largest world size a plan is built for (the schedule grows as `n^2` transfers).
pub const MAX_RANKS: usize = 2048;

/// A plan is built only while `n (n-1) k`, about the number of transfers in each phase, stays
/// within this budget (about 130 MiB of transfers per phase).
pub const MAX_TRANSFERS: usize = 1 << 22;

/// The largest pieces per chunk `k` that [`MAX_TRANSFERS`] allows for `ranks >= 2` ranks.
pub fn max_pieces_per_chunk(ranks: usize) -> usize {
    MAX_TRANSFERS / (ranks * (ranks - 1))
}

/// The AllReduce algorithms this crate can schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// ReduceScatter among the early ranks, then the post-arrival StragglAR phase.
    Stragglar,
    /// Ring AllReduce (no straggler).
    Ring,
    /// Recursive halving-doubling (no straggler; powers of two only).
    HalvingDoubling,
    /// Reduction of the early ranks, one exchange with the straggler, binomial broadcast.
    Direct,
    /// StragglAR on multicast: the early ranks' ReduceScatter, their chunks gathered into the
    /// straggler before it arrives, then one multicast of each complete chunk.
    Multicast,
}

impl Algorithm {
    /// Every algorithm, in the order tables list them.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Stragglar,
        Algorithm::Ring,
        Algorithm::HalvingDoubling,
        Algorithm::Direct,
        Algorithm::Multicast,
    ];

    /// The command-line name: `stragglar`, `ring`, `rhd`, `direct` or `multicast`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Stragglar => "stragglar",
            Algorithm::Ring => "ring",
            Algorithm::HalvingDoubling => "rhd",
            Algorithm::Direct => "direct",
            Algorithm::Multicast => "multicast",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether the algorithm uses the wait for a straggler.
    pub fn has_straggler(self) -> bool {
        matches!(
            self,
            Algorithm::Stragglar | Algorithm::Direct | Algorithm::Multicast
        )
    }

    /// Builds and assembles the schedule in physical ranks.
    pub fn schedule(self, request: &PlanRequest) -> Result<Schedule, PlanError> {
        let n = request.ranks;
        request.validate(self)?;
        let relabel = Relabel::new(n, request.straggler).ok_or(PlanError::StragglerOutOfRange {
            ranks: n,
            straggler: request.straggler,
        })?;
        let k = request.pieces_per_chunk;
        let (chunks, phases) = match self {
            Algorithm::Stragglar => (
                (n - 1) * k,
                vec![
                    (PhaseKind::ReduceScatter, reduce_scatter::ring(n - 1, k)),
                    (PhaseKind::Stragglar, post_arrival::synthesize(n, k)),
                ],
            ),
            Algorithm::Direct => {
                let (before, after) = baseline::direct(n);
                (
                    1,
                    vec![
                        (PhaseKind::ReduceScatter, before),
                        (PhaseKind::Stragglar, after),
                    ],
                )
            }
            Algorithm::Multicast => (
                n - 1,
                vec![
                    (PhaseKind::ReduceScatter, reduce_scatter::ring(n - 1, 1)),
                    (PhaseKind::Gather, multicast::gather(n)),
                    (PhaseKind::Stragglar, multicast::broadcast(n)),
                ],
            ),
            Algorithm::Ring => (n, vec![(PhaseKind::AllReduce, baseline::ring(n))]),
            Algorithm::HalvingDoubling => (
                n,
                vec![(PhaseKind::AllReduce, baseline::halving_doubling(n))],
            ),
        };
        let straggler = self.has_straggler().then_some(request.straggler);
        let phases = phases
            .into_iter()
            .map(|(kind, mut rounds)| {
                if straggler.is_some() {
                    relabel.to_physical(&mut rounds);
                }
                Phase { kind, rounds }
            })
            .collect();
        Ok(Schedule {
            ranks: n,
            straggler,
            chunks,
            pieces_per_chunk: k,
            phases,
            multicast: self == Algorithm::Multicast,
        })
    }
}

/// What to plan: world size, the straggler's physical rank (ignored by algorithms without
/// one, but still range-checked) and pieces per chunk (`1` = no pipelining; StragglAR only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanRequest {
    /// Number of ranks, `2..=MAX_RANKS`.
    pub ranks: usize,
    /// The straggler's physical rank, `< ranks`.
    pub straggler: usize,
    /// Pieces per chunk `k >= 1`, at most [`max_pieces_per_chunk`]`(ranks)`.
    pub pieces_per_chunk: usize,
}

impl PlanRequest {
    /// A request without pipelining.
    pub fn new(ranks: usize, straggler: usize) -> Self {
        PlanRequest {
            ranks,
            straggler,
            pieces_per_chunk: 1,
        }
    }

    /// Checks that `algorithm` can be planned for this request, without building anything.
    pub fn validate(&self, algorithm: Algorithm) -> Result<(), PlanError> {
        let n = self.ranks;
        if !(2..=MAX_RANKS).contains(&n) {
            return Err(PlanError::RanksOutOfRange(n));
        }
        if self.straggler >= n {
            return Err(PlanError::StragglerOutOfRange {
                ranks: n,
                straggler: self.straggler,
            });
        }
        if algorithm == Algorithm::HalvingDoubling && !n.is_power_of_two() {
            return Err(PlanError::NotPowerOfTwo(n));
        }
        let k = self.pieces_per_chunk;
        if k != 1 && algorithm != Algorithm::Stragglar {
            return Err(PlanError::PipelineUnsupported(algorithm));
        }
        if k == 0 || k > max_pieces_per_chunk(n) {
            return Err(PlanError::PiecesOutOfRange {
                ranks: n,
                pieces: k,
            });
        }
        Ok(())
    }
}

/// Why no schedule can be built for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// `ranks` is not in `2..=MAX_RANKS`.
    RanksOutOfRange(usize),
    /// The straggler is not a rank.
    StragglerOutOfRange {
        /// Number of ranks.
        ranks: usize,
        /// The requested straggler.
        straggler: usize,
    },
    /// Halving-doubling was asked for a world size that is not a power of two.
    NotPowerOfTwo(usize),
    /// Pipelining was asked for an algorithm other than StragglAR.
    PipelineUnsupported(Algorithm),
    /// `k = 0`, or `k > max_pieces_per_chunk(ranks)`.
    PiecesOutOfRange {
        /// Number of ranks.
        ranks: usize,
        /// The requested pieces per chunk.
        pieces: usize,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::RanksOutOfRange(n) => {
                write!(f, "--ranks must be between 2 and {MAX_RANKS}, got {n}")
            }
            PlanError::StragglerOutOfRange { ranks, straggler } => write!(
                f,
                "--straggler must be a rank in 0..{}, got {straggler}",
                ranks - 1
            ),
            PlanError::NotPowerOfTwo(n) => write!(
                f,
                "rhd (recursive halving-doubling) needs a power-of-two number of ranks, got {n}"
            ),
            PlanError::PipelineUnsupported(a) => {
                write!(f, "--pipeline applies to stragglar only, not {}", a.name())
            }
            PlanError::PiecesOutOfRange { ranks, pieces } => write!(
                f,
                "--pipeline must be between 1 and {} for {ranks} ranks, got {pieces}",
                max_pieces_per_chunk(*ranks)
            ),
        }
    }
}

impl std::error::Error for PlanError {}
