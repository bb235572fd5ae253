//! How each rank of a run ended, and the failure report built from it: every rank that ended
//! badly (or that a peer took for gone) says how and in which call, first causes first, the
//! echoes of a failure (a rank that saw a peer exit or fail) after the rank they echo.

use std::fmt;
use std::process::ExitStatus;

use crate::engine::host::wait::WaitError;
use crate::engine::host::EngineError;

/// Why a rank's sweep stopped, and where, as the rank saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFailure {
    /// The engine call it was in, counted from 1 as `--fault` counts; 0 for a failure outside
    /// any call (joining, or a worker that could not start its sweep).
    pub call: u64,
    /// The peer it saw exit or fail, when that is what stopped it.
    pub peer: Option<usize>,
    /// What it saw.
    pub why: String,
}

impl RankFailure {
    /// A failure outside any call.
    pub fn outside_calls(why: String) -> Self {
        RankFailure {
            call: 0,
            peer: None,
            why,
        }
    }

    /// `error` in call `call`.
    pub fn in_call(call: u64, error: &EngineError) -> Self {
        let peer = match error {
            EngineError::Wait(WaitError::PeerDied(r) | WaitError::PeerFailed(r)) => Some(*r),
            _ => None,
        };
        RankFailure {
            call,
            peer,
            why: error.to_string(),
        }
    }

    /// The worker's line: `FAILED CALL PEER|- WHY`.
    pub fn to_line(&self) -> String {
        let peer = self.peer.map_or("-".to_string(), |p| p.to_string());
        format!("FAILED {} {peer} {}", self.call, self.why)
    }

    /// Reads a worker's failure line (after `FAILED `).
    pub fn from_line(rest: &str) -> Option<Self> {
        let mut fields = rest.splitn(3, ' ');
        let call = fields.next()?.parse().ok()?;
        let peer = match fields.next()? {
            "-" => None,
            p => Some(p.parse().ok()?),
        };
        Some(RankFailure {
            call,
            peer,
            why: fields.next()?.to_string(),
        })
    }
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.call > 0 {
            write!(f, "call {}: ", self.call)?;
        }
        f.write_str(&self.why)
    }
}

/// How a rank's thread or process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// A thread: whether it panicked.
    Thread { panicked: bool },
    /// A worker process's exit status (or the signal that ended it).
    Process(ExitStatus),
    /// The worker could not be waited for.
    Unknown(String),
}

impl Exit {
    fn clean(&self) -> bool {
        match self {
            Exit::Thread { panicked } => !panicked,
            Exit::Process(status) => status.success(),
            Exit::Unknown(_) => false,
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Thread { panicked: true } => f.write_str("its thread panicked"),
            Exit::Thread { panicked: false } => f.write_str("its thread returned"),
            Exit::Process(status) => write!(f, "its worker ended with {status}"),
            Exit::Unknown(why) => write!(f, "its worker could not be waited for: {why}"),
        }
    }
}

/// What a rank told the bench during the run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Told {
    /// The failure it reported, if any (its first).
    pub failure: Option<RankFailure>,
    /// The engine calls it ran, if it reported finishing its sweep.
    pub finished: Option<u64>,
    /// The sizes it reported.
    pub sizes: usize,
}

/// What the bench knows of one rank once the run is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnd {
    /// What it said.
    pub told: Told,
    /// Whether the bench killed it, still running well after the first failure.
    pub stopped: bool,
    /// How it ended.
    pub exit: Exit,
}

/// One line per rank that ended badly or that a peer lost, causes first: a rank that stopped
/// on its own account before the ranks that saw it go, and those before the ranks that saw
/// them go; ranks the bench stopped come last. `sizes` is how many sizes the run has.
pub fn explain(ends: &[RankEnd], sizes: usize) -> Vec<String> {
    let peer = |rank: usize| ends[rank].told.failure.as_ref().and_then(|f| f.peer);
    // How many echoes away from a first cause each rank is. A rank sees a peer's abort or exit
    // only after it happened, so echoes form no cycle; the cap guards against garbled lines.
    let depth = |rank: usize| {
        let mut at = rank;
        let mut steps = 0;
        while let Some(p) = peer(at).filter(|&p| p < ends.len() && steps < ends.len()) {
            at = p;
            steps += 1;
        }
        steps
    };
    let mut lines: Vec<((bool, usize, usize), String)> = ends
        .iter()
        .enumerate()
        .filter_map(|(rank, end)| {
            let lost_in = ends
                .iter()
                .filter_map(|e| e.told.failure.as_ref())
                .filter(|f| f.peer == Some(rank))
                .map(|f| f.call)
                .min();
            let line = describe(end, lost_in, sizes)?;
            Some((
                (end.stopped, depth(rank), rank),
                format!("rank {rank}: {line}"),
            ))
        })
        .collect();
    lines.sort_by_key(|(key, _)| *key);
    lines.into_iter().map(|(_, line)| line).collect()
}

/// What to say of one rank, if anything; `lost_in` is the first call in which a peer saw it go.
fn describe(end: &RankEnd, lost_in: Option<u64>, sizes: usize) -> Option<String> {
    let told = &end.told;
    let lost = lost_in.map_or(String::new(), |call| {
        format!("; peers lost it in call {call}")
    });
    if let Some(failure) = &told.failure {
        return Some(if end.exit.clean() {
            failure.to_string()
        } else {
            format!("{failure} ({})", end.exit)
        });
    }
    if end.stopped {
        return Some(format!(
            "still running well after the first failure, so the bench killed it ({}), after {} of {sizes} sizes{lost}",
            end.exit, told.sizes
        ));
    }
    match told.finished {
        Some(_) if end.exit.clean() && lost_in.is_none() => None,
        Some(calls) => Some(format!(
            "finished its sweep ({calls} calls), then {}{lost}",
            end.exit
        )),
        None => Some(format!(
            "{} without reporting why, after {} of {sizes} sizes{lost}",
            end.exit, told.sizes
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn end(failure: Option<RankFailure>, finished: Option<u64>, status: i32) -> RankEnd {
        RankEnd {
            told: Told {
                failure,
                finished,
                sizes: 1,
            },
            stopped: false,
            exit: Exit::Process(ExitStatus::from_raw(status)),
        }
    }

    fn lost(call: u64, error: WaitError) -> Option<RankFailure> {
        Some(RankFailure::in_call(call, &EngineError::Wait(error)))
    }

    #[test]
    fn failure_lines_round_trip() {
        for failure in [
            RankFailure::in_call(7, &EngineError::Wait(WaitError::PeerDied(3))),
            RankFailure::in_call(2, &EngineError::Wait(WaitError::Timeout)),
            RankFailure::outside_calls("setup failed: rank 2 did not join in time".into()),
        ] {
            let line = failure.to_line();
            let rest = line.strip_prefix("FAILED ").unwrap();
            assert_eq!(RankFailure::from_line(rest), Some(failure));
        }
        assert_eq!(RankFailure::from_line("x - boom"), None);
    }

    #[test]
    fn the_first_cause_comes_first_and_a_clean_rank_taken_for_gone_is_named() {
        // Rank 3 took rank 1, which had finished, for gone; ranks 5 and 6 echo rank 3.
        let ends = vec![
            end(None, Some(12), 0),
            end(None, Some(12), 0),
            end(None, Some(12), 0),
            end(lost(12, WaitError::PeerDied(1)), None, 1 << 8),
            end(None, Some(12), 0),
            end(lost(12, WaitError::PeerFailed(3)), None, 1 << 8),
            end(lost(12, WaitError::PeerFailed(3)), None, 1 << 8),
        ];
        assert_eq!(
            explain(&ends, 3),
            [
                "rank 1: finished its sweep (12 calls), then its worker ended with exit status: 0; peers lost it in call 12",
                "rank 3: call 12: rank 1 exited (its worker ended with exit status: 1)",
                "rank 5: call 12: rank 3 aborted or failed (its worker ended with exit status: 1)",
                "rank 6: call 12: rank 3 aborted or failed (its worker ended with exit status: 1)",
            ]
        );
    }

    #[test]
    fn a_killed_worker_says_how_it_ended_and_stopped_ranks_come_last() {
        let mut ends = vec![
            end(lost(2, WaitError::PeerDied(1)), None, 1 << 8),
            end(None, None, libc::SIGKILL),
            end(lost(2, WaitError::PeerFailed(0)), None, 1 << 8),
            end(None, None, libc::SIGKILL),
        ];
        ends[1].told.sizes = 0;
        ends[3].stopped = true;
        assert_eq!(
            explain(&ends, 1),
            [
                "rank 1: its worker ended with signal: 9 (SIGKILL) without reporting why, after 0 of 1 sizes; peers lost it in call 2",
                "rank 0: call 2: rank 1 exited (its worker ended with exit status: 1)",
                "rank 2: call 2: rank 0 aborted or failed (its worker ended with exit status: 1)",
                "rank 3: still running well after the first failure, so the bench killed it (its worker ended with signal: 9 (SIGKILL)), after 1 of 1 sizes",
            ]
        );
    }

    #[test]
    fn a_timeout_is_a_first_cause_and_a_stopped_rank_is_named_last() {
        let mut ends = vec![
            end(lost(2, WaitError::PeerFailed(2)), None, 1 << 8),
            end(None, None, libc::SIGKILL),
            end(lost(2, WaitError::Timeout), None, 1 << 8),
        ];
        ends[1].stopped = true;
        assert_eq!(
            explain(&ends, 1),
            [
                "rank 2: call 2: timed out (STRAGGLAR_TIMEOUT_MS) (its worker ended with exit status: 1)",
                "rank 0: call 2: rank 2 aborted or failed (its worker ended with exit status: 1)",
                "rank 1: still running well after the first failure, so the bench killed it (its worker ended with signal: 9 (SIGKILL)), after 1 of 1 sizes",
            ]
        );
    }

    #[test]
    fn clean_ranks_nobody_lost_are_not_mentioned() {
        let threads = RankEnd {
            told: Told {
                failure: None,
                finished: Some(4),
                sizes: 2,
            },
            stopped: false,
            exit: Exit::Thread { panicked: false },
        };
        let own = RankEnd {
            told: Told {
                failure: Some(RankFailure::in_call(
                    3,
                    &EngineError::Mismatch("rank 0 runs another plan in this call".into()),
                )),
                finished: None,
                sizes: 2,
            },
            ..threads.clone()
        };
        assert_eq!(
            explain(&[threads.clone(), own], 2),
            ["rank 1: call 3: call does not match its plan: rank 0 runs another plan in this call"]
        );
        assert!(explain(&[threads.clone(), threads], 2).is_empty());
    }
}
