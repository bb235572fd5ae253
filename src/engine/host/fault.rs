//! Fault injection for the reliability tests and `stragglar bench --fault`: one rank kills or
//! stops itself, or aborts, at a chosen phase of a chosen call.

use std::fmt;
use std::str::FromStr;

use crate::plan::Step;

/// What the faulty rank does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// SIGKILL itself: the process vanishes mid-call.
    Kill,
    /// SIGSTOP itself: alive but silent (peers need `STRAGGLAR_TIMEOUT_MS`, as with NCCL).
    Stop,
    /// Raise its abort word and fail the call, as `ncclCommAbort` would.
    Abort,
}

/// Where in the protocol it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPhase {
    /// On entering the call, before its input is published.
    Arrival,
    /// At the ReduceScatter (the direct-pull step before the straggler arrives).
    ReduceScatter,
    /// At a reduce after the straggler arrived (the exchange with it, or a baseline reduce).
    Exchange,
    /// At a copy of a final chunk.
    Copies,
}

impl FaultPhase {
    /// Whether `step` belongs to this phase (`Arrival` is checked before the first step).
    pub fn matches(self, step: &Step) -> bool {
        matches!(
            (self, step),
            (FaultPhase::ReduceScatter, Step::Combine { turn: None, .. })
                | (FaultPhase::Exchange, Step::Combine { turn: Some(_), .. })
                | (FaultPhase::Copies, Step::Copy { .. })
        )
    }
}

/// One injected fault: `action` at the first step of `phase` in call `call` (counted from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub action: FaultAction,
    pub phase: FaultPhase,
    pub call: u64,
}

impl Fault {
    /// Performs a kill or stop (an abort is the caller's to perform).
    pub fn signal_self(self) {
        let signal = match self.action {
            FaultAction::Kill => libc::SIGKILL,
            FaultAction::Stop => libc::SIGSTOP,
            FaultAction::Abort => return,
        };
        // SAFETY: raising a signal on this process is what the fault asks for.
        unsafe { libc::raise(signal) };
    }
}

impl FromStr for Fault {
    type Err = String;

    /// `ACTION@PHASE[:CALL]`, e.g. `kill@copies:3`; ACTION is kill, stop or abort; PHASE is
    /// arrival, rs, exchange or copies; CALL defaults to 1.
    fn from_str(text: &str) -> Result<Fault, String> {
        let bad = || format!("expected ACTION@PHASE[:CALL] such as kill@copies:3, got '{text}'");
        let (action, rest) = text.split_once('@').ok_or_else(bad)?;
        let (phase, call) = match rest.split_once(':') {
            Some((phase, call)) => (phase, call.parse::<u64>().map_err(|_| bad())?),
            None => (rest, 1),
        };
        let action = match action {
            "kill" => FaultAction::Kill,
            "stop" => FaultAction::Stop,
            "abort" => FaultAction::Abort,
            _ => return Err(bad()),
        };
        let phase = match phase {
            "arrival" => FaultPhase::Arrival,
            "rs" => FaultPhase::ReduceScatter,
            "exchange" => FaultPhase::Exchange,
            "copies" => FaultPhase::Copies,
            _ => return Err(bad()),
        };
        if call == 0 {
            return Err(bad());
        }
        Ok(Fault {
            action,
            phase,
            call,
        })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match self.action {
            FaultAction::Kill => "kill",
            FaultAction::Stop => "stop",
            FaultAction::Abort => "abort",
        };
        let phase = match self.phase {
            FaultPhase::Arrival => "arrival",
            FaultPhase::ReduceScatter => "rs",
            FaultPhase::Exchange => "exchange",
            FaultPhase::Copies => "copies",
        };
        write!(f, "{action}@{phase}:{}", self.call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_print() {
        let f: Fault = "kill@copies:3".parse().unwrap();
        assert_eq!(
            f,
            Fault {
                action: FaultAction::Kill,
                phase: FaultPhase::Copies,
                call: 3
            }
        );
        assert_eq!(f.to_string(), "kill@copies:3");
        assert_eq!("abort@rs".parse::<Fault>().unwrap().call, 1);
        for bad in ["kill", "boom@rs", "kill@nowhere", "stop@rs:0", "stop@rs:x"] {
            assert!(bad.parse::<Fault>().is_err(), "{bad}");
        }
    }
}
