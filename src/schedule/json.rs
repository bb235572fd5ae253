//! The plan format of docs/ALGORITHM.md section 6, written by hand so that it stays stable.
//!
//! Layout (one key per line, one round per line):
//!
//! ```text
//! {
//!   "ranks": 4,
//!   "straggler": 3,
//!   "chunks": 3,
//!   "phases": [
//!     {"name": "reduce_scatter", "rounds": [
//!       [{"src": 0, "dst": 1, "chunk": 2, "op": "reduce"}, ...],
//!       ...
//!     ]},
//!     {"name": "stragglar", "rounds": [
//!       ...
//!     ]}
//!   ]
//! }
//! ```

use std::fmt::Write;

use super::types::{Round, Schedule};

/// The schedule as one JSON object with keys `ranks`, `straggler` (physical rank or `null`),
/// `chunks`, `"multicast": true` for a multicast schedule only (a rank's sends in one round may
/// then carry one chunk to several destinations), and `phases` (`[{"name": ..., "rounds": [[transfer, ...], ...]}, ...]`); each
/// transfer is `{"src": i, "dst": j, "chunk": c, "op": "reduce" | "copy"}`. Ends with a newline.
pub fn to_json(schedule: &Schedule) -> String {
    let mut out = String::new();
    let straggler = schedule
        .straggler
        .map_or_else(|| "null".to_string(), |s| s.to_string());
    let _ = write!(
        out,
        "{{\n  \"ranks\": {},\n  \"straggler\": {},\n  \"chunks\": {},{}\n  \"phases\": [",
        schedule.ranks,
        straggler,
        schedule.chunks,
        if schedule.multicast {
            "\n  \"multicast\": true,"
        } else {
            ""
        }
    );
    for (p, phase) in schedule.phases.iter().enumerate() {
        let sep = if p == 0 { "" } else { "," };
        let _ = write!(
            out,
            "{sep}\n    {{\"name\": \"{}\", \"rounds\": [",
            phase.kind.name()
        );
        for (r, round) in phase.rounds.iter().enumerate() {
            let sep = if r == 0 { "" } else { "," };
            let _ = write!(out, "{sep}\n      {}", round_json(round));
        }
        if !phase.rounds.is_empty() {
            out.push_str("\n    ");
        }
        out.push_str("]}");
    }
    if !schedule.phases.is_empty() {
        out.push_str("\n  ");
    }
    out.push_str("]\n}\n");
    out
}

fn round_json(round: &Round) -> String {
    let items: Vec<String> = round
        .iter()
        .map(|t| {
            format!(
                "{{\"src\": {}, \"dst\": {}, \"chunk\": {}, \"op\": \"{}\"}}",
                t.src,
                t.dst,
                t.chunk,
                t.op.name()
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}
