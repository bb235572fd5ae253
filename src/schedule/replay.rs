//! The replay verifier: runs a schedule on contribution sets and checks the round model.
//!
//! Semantics (docs/ALGORITHM.md section 6): every rank starts holding `{r}` for every chunk; a
//! transfer reads its source's value as of the start of the round; `reduce` merges it into the
//! destination (the sets must be disjoint), `copy` replaces the destination's value; per round
//! each rank is the source of at most one transfer (in a multicast schedule: of one chunk, to
//! any number of destinations) and the destination of at most one; the `reduce_scatter` phase
//! never touches the straggler and in the `gather` phase it only receives; at the end every
//! rank holds every chunk with all `n` contributions.

use std::fmt;

use super::contributions::Contributions;
use super::types::{Op, PhaseKind, Round, Schedule, Transfer};

/// Why a schedule is not a valid AllReduce. Rounds are numbered from 0 within their phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerifyError {
    /// `ranks < 2`, a straggler out of range, no phases, or a phase list of the wrong shape.
    Shape(String),
    /// A transfer names a rank or chunk out of range, or sends to itself.
    BadTransfer {
        /// Phase name.
        phase: &'static str,
        /// Round within the phase.
        round: usize,
        /// The offending transfer.
        transfer: Transfer,
    },
    /// A rank is the source of two transfers in one round (of two chunks, in a multicast
    /// schedule).
    SendsTwice {
        /// Phase name.
        phase: &'static str,
        /// Round within the phase.
        round: usize,
        /// The rank.
        rank: usize,
    },
    /// A rank is the destination of two transfers in one round.
    ReceivesTwice {
        /// Phase name.
        phase: &'static str,
        /// Round within the phase.
        round: usize,
        /// The rank.
        rank: usize,
    },
    /// The straggler takes part in the phase before its arrival.
    StragglerBeforeArrival {
        /// Round within `reduce_scatter`.
        round: usize,
        /// The offending transfer.
        transfer: Transfer,
    },
    /// The straggler sends in the `gather` phase, before it arrives.
    StragglerSendsBeforeArrival {
        /// Round within `gather`.
        round: usize,
        /// The offending transfer.
        transfer: Transfer,
    },
    /// A reduction would count some rank's contribution twice.
    DoubleCount {
        /// Phase name.
        phase: &'static str,
        /// Round within the phase.
        round: usize,
        /// The offending transfer.
        transfer: Transfer,
    },
    /// At the end, `rank` holds `chunk` with only `have` of the `ranks` contributions.
    Incomplete {
        /// The rank.
        rank: usize,
        /// The chunk.
        chunk: usize,
        /// Contributions present.
        have: usize,
    },
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t =
            |t: &Transfer| format!("{} -> {} chunk {} ({})", t.src, t.dst, t.chunk, t.op.name());
        match self {
            VerifyError::Shape(why) => write!(f, "malformed schedule: {why}"),
            VerifyError::BadTransfer {
                phase,
                round,
                transfer,
            } => write!(f, "{phase} round {round}: invalid transfer {}", t(transfer)),
            VerifyError::SendsTwice { phase, round, rank } => {
                write!(f, "{phase} round {round}: rank {rank} sends twice")
            }
            VerifyError::ReceivesTwice { phase, round, rank } => {
                write!(f, "{phase} round {round}: rank {rank} receives twice")
            }
            VerifyError::StragglerBeforeArrival { round, transfer } => write!(
                f,
                "reduce_scatter round {round}: the straggler takes part before it arrives: {}",
                t(transfer)
            ),
            VerifyError::StragglerSendsBeforeArrival { round, transfer } => write!(
                f,
                "gather round {round}: the straggler sends before it arrives: {}",
                t(transfer)
            ),
            VerifyError::DoubleCount {
                phase,
                round,
                transfer,
            } => write!(
                f,
                "{phase} round {round}: reduction counts a contribution twice: {}",
                t(transfer)
            ),
            VerifyError::Incomplete { rank, chunk, have } => write!(
                f,
                "rank {rank} ends with chunk {chunk} holding {have} contributions"
            ),
        }
    }
}

impl std::error::Error for VerifyError {}

/// The state of a replay: every rank's contribution set for every chunk.
#[derive(Clone, Debug)]
pub struct Replay {
    ranks: usize,
    chunks: usize,
    straggler: Option<usize>,
    /// Whether a rank may send one chunk to several destinations in a round.
    multicast: bool,
    /// `values[rank * chunks + chunk]`.
    values: Vec<Contributions>,
}

impl Replay {
    /// The initial state of `schedule`: rank `r` holds `{r}` for every chunk.
    pub fn start(schedule: &Schedule) -> Result<Self, VerifyError> {
        let n = schedule.ranks;
        if n < 2 {
            return Err(VerifyError::Shape(format!("{n} ranks; need at least 2")));
        }
        if schedule.chunks == 0 || schedule.pieces_per_chunk == 0 {
            return Err(VerifyError::Shape("no chunks".into()));
        }
        let expected: &[PhaseKind] = match schedule.straggler {
            Some(s) if s >= n => {
                return Err(VerifyError::Shape(format!(
                    "straggler {s} out of range for {n} ranks"
                )))
            }
            Some(_) if schedule.multicast => &[
                PhaseKind::ReduceScatter,
                PhaseKind::Gather,
                PhaseKind::Stragglar,
            ],
            Some(_) => &[PhaseKind::ReduceScatter, PhaseKind::Stragglar],
            None => &[PhaseKind::AllReduce],
        };
        let kinds: Vec<PhaseKind> = schedule.phases.iter().map(|p| p.kind).collect();
        if kinds != expected {
            return Err(VerifyError::Shape(format!(
                "phases {:?}, expected {:?}",
                kinds, expected
            )));
        }
        let values = (0..n)
            .flat_map(|r| (0..schedule.chunks).map(move |_| Contributions::single(n, r)))
            .collect();
        Ok(Replay {
            ranks: n,
            chunks: schedule.chunks,
            straggler: schedule.straggler,
            multicast: schedule.multicast,
            values,
        })
    }

    /// Applies one round of phase `kind` (round number `index` is for error messages).
    pub fn apply(
        &mut self,
        kind: PhaseKind,
        index: usize,
        round: &Round,
    ) -> Result<(), VerifyError> {
        let phase = kind.name();
        // The chunk each rank sends this round, if any.
        let mut sends: Vec<Option<usize>> = vec![None; self.ranks];
        let mut receives = vec![false; self.ranks];
        for &transfer in round {
            let Transfer {
                src, dst, chunk, ..
            } = transfer;
            if src >= self.ranks || dst >= self.ranks || src == dst || chunk >= self.chunks {
                return Err(VerifyError::BadTransfer {
                    phase,
                    round: index,
                    transfer,
                });
            }
            let sent = sends[src].replace(chunk);
            if sent.is_some_and(|c| !self.multicast || c != chunk) {
                return Err(VerifyError::SendsTwice {
                    phase,
                    round: index,
                    rank: src,
                });
            }
            if std::mem::replace(&mut receives[dst], true) {
                return Err(VerifyError::ReceivesTwice {
                    phase,
                    round: index,
                    rank: dst,
                });
            }
            if kind == PhaseKind::ReduceScatter
                && (Some(src) == self.straggler || Some(dst) == self.straggler)
            {
                return Err(VerifyError::StragglerBeforeArrival {
                    round: index,
                    transfer,
                });
            }
            if kind == PhaseKind::Gather && Some(src) == self.straggler {
                return Err(VerifyError::StragglerSendsBeforeArrival {
                    round: index,
                    transfer,
                });
            }
        }
        // Every read sees the state at the start of the round.
        let reads: Vec<Contributions> = round
            .iter()
            .map(|t| self.values[t.src * self.chunks + t.chunk].clone())
            .collect();
        for (transfer, value) in round.iter().zip(reads) {
            let slot = &mut self.values[transfer.dst * self.chunks + transfer.chunk];
            match transfer.op {
                Op::Reduce => {
                    if slot.intersects(&value) {
                        return Err(VerifyError::DoubleCount {
                            phase,
                            round: index,
                            transfer: *transfer,
                        });
                    }
                    slot.union_with(&value);
                }
                Op::Copy => *slot = value,
            }
        }
        Ok(())
    }

    /// How many contributions `rank`'s copy of `chunk` holds now.
    pub fn contributions(&self, rank: usize, chunk: usize) -> usize {
        self.values[rank * self.chunks + chunk].len()
    }

    /// How many ranks hold `chunk` with all contributions (final) now.
    pub fn final_holders(&self, chunk: usize) -> usize {
        (0..self.ranks)
            .filter(|&r| self.contributions(r, chunk) == self.ranks)
            .count()
    }

    /// Fails with [`VerifyError::Incomplete`] unless every rank holds every chunk final.
    pub fn check_complete(&self) -> Result<(), VerifyError> {
        for rank in 0..self.ranks {
            for chunk in 0..self.chunks {
                let have = self.contributions(rank, chunk);
                if have != self.ranks {
                    return Err(VerifyError::Incomplete { rank, chunk, have });
                }
            }
        }
        Ok(())
    }
}

/// Replays `schedule` and checks every rule of the round model; `Ok` means it is a valid
/// AllReduce.
pub fn verify(schedule: &Schedule) -> Result<(), VerifyError> {
    let mut replay = Replay::start(schedule)?;
    for phase in &schedule.phases {
        for (index, round) in phase.rounds.iter().enumerate() {
            replay.apply(phase.kind, index, round)?;
        }
    }
    replay.check_complete()
}
