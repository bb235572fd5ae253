//! `stragglar plan`: print a schedule, the table of rounds against the bound, or time the
//! synthesis.

use std::fmt::Write;
use std::time::Instant;

use super::args::{parse_list, Args, UsageError};
use crate::schedule::{
    round_bound, to_json, verify, Algorithm, PhaseKind, PlanRequest, Replay, Schedule,
};

/// Options of `stragglar plan`, as shown by `stragglar help`.
pub const USAGE: &str = "
stragglar plan --ranks N [--straggler S] [--algo stragglar|ring|rhd|direct|multicast]
               [--pipeline K] [--json] [--svg FILE]
    the schedule in physical ranks (straggler defaults to N-1; rhd needs a power of two;
    multicast: StragglAR whose straggler multicasts each complete chunk;
    --pipeline cuts each chunk into K pieces, stragglar only; --json: the plan format;
    --svg also draws it as a round-by-rank chart into FILE)
stragglar plan --table A..B
    post-arrival rounds against the bound n-2+ceil(log2 n), each schedule verified
stragglar plan --bench [--ranks N,...]
    times the StragglAR synthesis (default 256,1024; use a release build)
";

/// The post-arrival rounds of the authors' greedy heuristic (docs/ALGORITHM.md 3.2), lower end.
const HEURISTIC: [(usize, usize); 16] = [
    (6, 7),
    (10, 12),
    (12, 15),
    (14, 17),
    (18, 21),
    (20, 24),
    (22, 26),
    (24, 27),
    (26, 31),
    (28, 33),
    (30, 36),
    (34, 40),
    (40, 47),
    (48, 55),
    (96, 106),
    (192, 208),
];

/// The heuristic's round count for `n`, where docs/ALGORITHM.md 3.2 lists one.
pub fn heuristic_rounds(n: usize) -> Option<usize> {
    HEURISTIC.iter().find(|&&(m, _)| m == n).map(|&(_, r)| r)
}

/// Runs `stragglar plan`; returns the exit status.
pub fn run(mut args: Args) -> Result<i32, UsageError> {
    if let Some(range) = args.value(&["--table"])? {
        args.finish()?;
        let (lo, hi) = parse_range(&range)?;
        print!("{}", table(lo, hi));
        return Ok(0);
    }
    if args.flag(&["--bench"]) {
        let ranks = match args.value(&["--ranks", "-n"])? {
            Some(list) => parse_list(&list, parse_ranks)?,
            None => vec![256, 1024],
        };
        args.finish()?;
        print!("{}", bench(&ranks)?);
        return Ok(0);
    }
    let ranks: usize = args
        .parsed(&["--ranks", "-n"], "a number of ranks")?
        .ok_or_else(|| UsageError("plan needs --ranks N".into()))?;
    let straggler: Option<usize> = args.parsed(&["--straggler", "-s"], "a rank")?;
    let algorithm = match args.value(&["--algo", "-a"])? {
        None => Algorithm::Stragglar,
        Some(name) => Algorithm::parse(&name).ok_or_else(|| {
            UsageError(format!(
                "--algo: expected stragglar, ring, rhd, direct or multicast, got '{name}'"
            ))
        })?,
    };
    let pieces: usize = args
        .parsed(&["--pipeline", "-k"], "a number of pieces per chunk")?
        .unwrap_or(1);
    let json = args.flag(&["--json"]);
    let svg = args.value(&["--svg"])?;
    args.finish()?;
    let request = PlanRequest {
        ranks,
        straggler: straggler.unwrap_or(ranks.saturating_sub(1)),
        pieces_per_chunk: pieces,
    };
    let schedule = algorithm
        .schedule(&request)
        .map_err(|e| UsageError(e.to_string()))?;
    if let Some(path) = svg {
        let ring = Algorithm::Ring
            .schedule(&PlanRequest::new(ranks, 0))
            .map_err(|e| UsageError(e.to_string()))?;
        super::charts::schedule(&schedule, ring.exposed_rounds(), &path).map_err(UsageError)?;
    }
    if json {
        print!("{}", to_json(&schedule));
    } else {
        print!("{}", describe(&schedule, algorithm));
    }
    Ok(0)
}

fn parse_ranks(text: &str) -> Result<usize, UsageError> {
    text.parse()
        .map_err(|_| UsageError(format!("expected a number of ranks, got '{text}'")))
}

/// Parses `A..B` (inclusive) with `2 <= A <= B <= 1024`.
fn parse_range(text: &str) -> Result<(usize, usize), UsageError> {
    let bad = || {
        UsageError(format!(
            "--table: expected A..B with 2 <= A <= B <= 1024, got '{text}'"
        ))
    };
    let (a, b) = text.split_once("..").ok_or_else(bad)?;
    let (a, b) = (parse_ranks(a)?, parse_ranks(b.trim_start_matches('='))?);
    if a < 2 || a > b || b > 1024 {
        return Err(bad());
    }
    Ok((a, b))
}

/// The readable view: every round with its transfers, and after each post-arrival round how
/// many ranks hold each chunk final.
pub fn describe(schedule: &Schedule, algorithm: Algorithm) -> String {
    let mut out = String::new();
    let n = schedule.ranks;
    let straggler = schedule
        .straggler
        .map_or("none".to_string(), |s| s.to_string());
    let _ = writeln!(
        out,
        "{} on {n} ranks, straggler {straggler}, {} chunks ({} piece(s) per chunk)",
        algorithm.name(),
        schedule.chunks,
        schedule.pieces_per_chunk
    );
    if algorithm == Algorithm::Stragglar {
        let _ = writeln!(
            out,
            "post-arrival rounds {} (bound n-2+ceil(log2 n) = {})",
            schedule.exposed_rounds(),
            round_bound(n, schedule.pieces_per_chunk)
        );
    }
    let _ = writeln!(
        out,
        "transfer: src>dst cCHUNK r(educe)|c(opy); holders: ranks holding each chunk final"
    );
    let mut replay = match Replay::start(schedule) {
        Ok(replay) => replay,
        Err(e) => return format!("{out}invalid schedule: {e}\n"),
    };
    for phase in &schedule.phases {
        let when = match phase.kind {
            PhaseKind::ReduceScatter => "before the straggler arrives",
            PhaseKind::Gather => "before the straggler arrives, into its memory",
            PhaseKind::Stragglar => "after the straggler arrives",
            PhaseKind::AllReduce => "no straggler",
        };
        let _ = writeln!(
            out,
            "phase {} ({when}): {} rounds",
            phase.kind.name(),
            phase.rounds.len()
        );
        for (index, round) in phase.rounds.iter().enumerate() {
            let transfers: Vec<String> = round
                .iter()
                .map(|t| {
                    let op = if t.op == crate::schedule::Op::Reduce {
                        'r'
                    } else {
                        'c'
                    };
                    format!("{}>{} c{} {op}", t.src, t.dst, t.chunk)
                })
                .collect();
            let _ = writeln!(out, "  round {index:>3}: {}", transfers.join(", "));
            if let Err(e) = replay.apply(phase.kind, index, round) {
                let _ = writeln!(out, "invalid schedule: {e}");
                return out;
            }
            let holders: Vec<String> = (0..schedule.chunks)
                .map(|c| replay.final_holders(c).to_string())
                .collect();
            let _ = writeln!(out, "             holders: {}", holders.join(" "));
        }
    }
    let verdict = match replay.check_complete() {
        Ok(()) => "valid: every rank holds every chunk with all contributions".to_string(),
        Err(e) => format!("invalid schedule: {e}"),
    };
    let _ = writeln!(out, "{verdict}");
    out
}

/// The table of post-arrival rounds against the bound for `lo..=hi` (Markdown), each
/// schedule verified by replay.
pub fn table(lo: usize, hi: usize) -> String {
    let mut out = String::from(
        "| n | bound n-2+ceil(log2 n) | our rounds | over the bound | authors' heuristic |\n\
         |---|---|---|---|---|\n",
    );
    for n in lo..=hi {
        let schedule = Algorithm::Stragglar
            .schedule(&PlanRequest::new(n, n - 1))
            .expect("every n in 2..=1024 is plannable");
        let valid = verify(&schedule).is_ok();
        let rounds = schedule.exposed_rounds();
        let bound = round_bound(n, 1);
        let heuristic = heuristic_rounds(n).map_or("-".to_string(), |r| r.to_string());
        let over = if valid {
            (rounds - bound).to_string()
        } else {
            "INVALID".to_string()
        };
        let _ = writeln!(out, "| {n} | {bound} | {rounds} | {over} | {heuristic} |");
    }
    out
}

/// Times the synthesis of the StragglAR schedule (both phases, physical ranks) for each `n`:
/// the best and the median of repeated runs, in milliseconds.
pub fn bench(ranks: &[usize]) -> Result<String, UsageError> {
    let mut out = String::from("n  rounds  runs  best_ms  median_ms\n");
    for &n in ranks {
        let request = PlanRequest::new(n, n - 1);
        let mut times = Vec::new();
        let mut rounds = 0;
        let started = Instant::now();
        while times.len() < 3 || (times.len() < 50 && started.elapsed().as_secs_f64() < 5.0) {
            let t = Instant::now();
            let schedule = Algorithm::Stragglar
                .schedule(&request)
                .map_err(|e| UsageError(e.to_string()))?;
            rounds = schedule.exposed_rounds();
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let _ = writeln!(
            out,
            "{n}  {rounds}  {}  {:.3}  {:.3}",
            times.len(),
            times[0],
            times[times.len() / 2]
        );
    }
    Ok(out)
}
