//! `stragglar report DIR...`: which rank is the persistent straggler of each communicator, from
//! the records observe mode wrote (`STRAGGLAR_OBSERVE=1`, `STRAGGLAR_REPORT_DIR`), one host's
//! directory or several.
//!
//! For each call every rank observed, the rank whose call was the shortest arrived last (the
//! others waited for it): its lateness is the others' median duration minus its own, and the
//! lead that could hide a ReduceScatter the second-shortest minus its own. No clock is
//! compared across GPUs or hosts. The arrivals go through the detector the GPU engine uses
//! (`detect::rule`: last in 75% of a 32-call window, released below half), so "persistent"
//! means what it means to the engine.

mod records;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use super::args::{Args, UsageError};
use crate::detect::{ArrivalRecord, Detector, DetectorConfig};
use crate::engine::cuda::observe::{Collective, MAX_SAMPLES};
use crate::schedule::model::{stragglar_rounds, Link, Times};
use records::RankRecord;

/// Usage of `stragglar report`.
pub const USAGE: &str = "
stragglar report DIR... [--json] [--svg FILE] [--min-lateness-us US] [--alpha-us A]
                 [--bandwidth-gbs B]
    which rank is the persistent straggler of each communicator, how late, in what share of
    calls, from which call on, and what the model says StragglAR would save, from the records
    observe mode wrote (STRAGGLAR_OBSERVE=1 STRAGGLAR_REPORT_DIR=DIR); --json prints JSON;
    --svg draws each communicator's ranks against its calls, coloured by lateness;
    a rank late by less than --min-lateness-us (median, default 100) is not named: launch
    jitter and the events' placement blur smaller leads; the model prices the machine's links
    at --alpha-us (per message, default 3) and --bandwidth-gbs (per direction, default 483.2:
    an NVSwitch server's), as `stragglar model` does
";

/// What the report says of its limits, once, after the communicators (docs/REPORT.md).
const LIMITS: &str = "limits: a call's time starts when its stream reaches it, not when NCCL's kernel starts (a kernel starved of multiprocessors, behind other work, under one hardware queue or MPS looks early); of several late ranks only the last shows; in back-to-back collectives only the first carries the skew; graph captures are not observed";

/// Default of `--min-lateness-us`: a choice, not a measurement (see USAGE).
const MIN_LATENESS_US: u64 = 100;

/// Where a rank ran: its host, its GPU's UUID and PCI bus id, its process.
#[derive(Debug, Clone, PartialEq)]
struct Member {
    host: String,
    gpu: String,
    pci: String,
    pid: u32,
}

/// One call every rank observed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Call {
    number: u64,
    collective: Collective,
    class: u32,
    last: usize,
    /// The others' median duration minus the last rank's, nanoseconds.
    lateness_ns: u64,
    /// The second-shortest duration minus the shortest, nanoseconds.
    lead_ns: u64,
}

/// What the report says of one communicator.
#[derive(Debug, Clone, PartialEq)]
struct Finding {
    comm: u64,
    ranks: usize,
    /// Per rank: its host, GPU (UUID and PCI bus id) and process.
    members: Vec<Member>,
    calls: Vec<Call>,
    unobserved: u64,
    /// Calls past a record's cap (the most any rank dropped): in no record.
    dropped: u64,
    /// The persistent straggler at the last call, and from which call on (late enough).
    straggler: Option<(usize, u64)>,
    /// A rank the detector designates at the last call whose median lateness is under the
    /// threshold: not named.
    too_early: Option<(usize, u64)>,
    /// Every change of the designation: from which call on, which rank (or none).
    changes: Vec<(u64, Option<usize>)>,
    /// The ranks whose records were never closed, each with the last call it lists (`None`:
    /// none): their processes were killed, or still run.
    unclosed: Vec<(usize, Option<u64>)>,
}

/// The calls of one communicator's records (one per rank, in rank order) that every rank
/// observed, each with the rank that arrived last.
fn calls_of(records: &[&RankRecord]) -> Vec<Call> {
    let first = records[0];
    let mut calls = Vec::new();
    for (&number, &(collective, class, _)) in &first.calls {
        // Every rank observed the same collective under this number (or the ranks' calls are
        // not the same sequence, and this call says nothing).
        let durations: Option<Vec<u64>> = records
            .iter()
            .map(|r| match r.calls.get(&number) {
                Some(&(c, _, d)) if c == collective => Some(d),
                _ => None,
            })
            .collect();
        let Some(durations) = durations else {
            continue;
        };
        // The shortest (the highest rank on a tie, as the engine's records break ties).
        let last = (0..durations.len())
            .rev()
            .min_by_key(|&r| durations[r])
            .expect("ranks");
        let mut others: Vec<u64> = (0..durations.len())
            .filter(|&r| r != last)
            .map(|r| durations[r])
            .collect();
        others.sort_unstable();
        let own = durations[last];
        let lateness_ns = others.get(others.len() / 2).map_or(0, |m| m - own);
        let lead_ns = others.first().map_or(0, |s| s - own);
        calls.push(Call {
            number,
            collective,
            class,
            last,
            lateness_ns,
            lead_ns,
        });
    }
    calls
}

/// Every change of the designated straggler over the calls: from which call on which rank (or
/// none) was designated.
fn designations(ranks: usize, calls: &[Call]) -> Vec<(u64, Option<usize>)> {
    let mut detector = Detector::new(ranks, DetectorConfig::default());
    let mut changes = Vec::new();
    for call in calls {
        let before = detector.designated();
        detector.observe(ArrivalRecord {
            last_rank: call.last,
            lead_ns: Some(call.lead_ns),
        });
        if detector.designated() != before {
            changes.push((call.number, detector.designated()));
        }
    }
    changes
}

/// The designated straggler after the last call, and the call from which it has been.
fn persistent(changes: &[(u64, Option<usize>)]) -> Option<(usize, u64)> {
    match changes.last() {
        Some(&(since, Some(rank))) => Some((rank, since)),
        _ => None,
    }
}

/// Groups the records by communicator and reads each; the errors say which input is wrong. A
/// designated rank whose median lateness is under `min_lateness_ns` is not named.
fn findings(records: &[RankRecord], min_lateness_ns: u64) -> (Vec<Finding>, Vec<String>) {
    let mut by_comm: BTreeMap<u64, Vec<&RankRecord>> = BTreeMap::new();
    for r in records {
        by_comm.entry(r.comm).or_default().push(r);
    }
    let mut found = Vec::new();
    let mut errors = Vec::new();
    for (comm, mut ranks) in by_comm {
        ranks.sort_by_key(|r| r.rank);
        let n = ranks[0].ranks;
        if let Some(other) = ranks.iter().find(|r| r.ranks != n) {
            errors.push(format!(
                "communicator {comm:016x}: {} says {} ranks, {} says {n}",
                other.path.display(),
                other.ranks,
                ranks[0].path.display()
            ));
            continue;
        }
        if let Some(pair) = ranks.windows(2).find(|w| w[0].rank == w[1].rank) {
            errors.push(format!(
                "communicator {comm:016x}: two records of rank {} ({} and {}): two jobs' records in one directory?",
                pair[0].rank,
                pair[0].path.display(),
                pair[1].path.display()
            ));
            continue;
        }
        if ranks.len() != n {
            let missing: Vec<String> = (0..n)
                .filter(|r| !ranks.iter().any(|x| x.rank == *r))
                .map(|r| r.to_string())
                .collect();
            errors.push(format!(
                "communicator {comm:016x}: no record of rank(s) {} of {n} (seen by only some ranks: their records are needed to compare)",
                missing.join(", ")
            ));
            continue;
        }
        let calls = calls_of(&ranks);
        let changes = designations(n, &calls);
        let designated = persistent(&changes);
        let mut finding = Finding {
            comm,
            ranks: n,
            members: ranks
                .iter()
                .map(|r| Member {
                    host: r.host.clone(),
                    gpu: r.gpu.clone(),
                    pci: r.pci.clone(),
                    pid: r.pid,
                })
                .collect(),
            // Every rank numbered the same calls: those it listed, left untimed or dropped.
            unobserved: ranks
                .iter()
                .map(|r| r.calls.len() as u64 + r.unobserved + r.dropped)
                .max()
                .unwrap_or(0)
                .saturating_sub(calls.len() as u64),
            dropped: ranks.iter().map(|r| r.dropped).max().unwrap_or(0),
            straggler: designated,
            too_early: None,
            changes,
            calls,
            unclosed: ranks
                .iter()
                .filter(|r| !r.closed)
                .map(|r| (r.rank, r.calls.keys().next_back().copied()))
                .collect(),
        };
        if let Some((rank, _)) = designated {
            let (_, median, _) = figures(&finding, rank);
            if median < min_lateness_ns {
                finding.too_early = Some((rank, median));
                finding.straggler = None;
            }
        }
        found.push(finding);
    }
    (found, errors)
}

/// The `p`-th percentile (0..=100) of `values` (sorted here), nearest rank.
fn percentile(values: &mut [u64], p: usize) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let at = (p * values.len()).div_ceil(100).clamp(1, values.len()) - 1;
    values[at]
}

/// The straggler's figures: share of calls it arrived last in, and its lateness's median and
/// p90 over those calls, nanoseconds.
fn figures(finding: &Finding, rank: usize) -> (f64, u64, u64) {
    let mut late: Vec<u64> = finding
        .calls
        .iter()
        .filter(|c| c.last == rank)
        .map(|c| c.lateness_ns)
        .collect();
    let share = late.len() as f64 / finding.calls.len().max(1) as f64;
    (share, percentile(&mut late, 50), percentile(&mut late, 90))
}

/// The straggler's median lateness over the calls of each collective it arrived last in,
/// nanoseconds, in [`Collective::ALL`]'s order (those it was never last in left out): which of
/// a job's collectives (FSDP's three, say) carry the skew.
fn lateness_by_collective(finding: &Finding, rank: usize) -> Vec<(Collective, u64)> {
    Collective::ALL
        .iter()
        .filter_map(|&kind| {
            let mut late: Vec<u64> = finding
                .calls
                .iter()
                .filter(|c| c.last == rank && c.collective == kind)
                .map(|c| c.lateness_ns)
                .collect();
            (!late.is_empty()).then(|| (kind, percentile(&mut late, 50)))
        })
        .collect()
}

/// `text` as a JSON string's contents: quotes, backslashes and control characters escaped.
fn json_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// How many of the AllReduce calls' size classes the model prices (the most common first).
const PRICED_CLASSES: usize = 3;

/// What the model says of the AllReduce calls (the collective StragglAR speeds up) at
/// `lateness_ns` on `link`, for their most common size classes (up to [`PRICED_CLASSES`], the
/// most common first): each class's bytes (its lower bound), share of the AllReduce calls, and
/// Ring's and StragglAR's time per call, seconds. Empty without AllReduce calls.
fn modelled(finding: &Finding, lateness_ns: u64, link: Link) -> Vec<(u64, f64, f64, f64)> {
    let mut classes: BTreeMap<u32, usize> = BTreeMap::new();
    for c in finding
        .calls
        .iter()
        .filter(|c| c.collective == Collective::AllReduce)
    {
        *classes.entry(c.class).or_default() += 1;
    }
    let total: usize = classes.values().sum();
    let mut common: Vec<(u32, usize)> = classes.into_iter().collect();
    common.sort_by_key(|&(class, n)| (std::cmp::Reverse(n), class));
    let n = finding.ranks.max(2);
    common
        .into_iter()
        .take(PRICED_CLASSES)
        .map(|(class, calls)| {
            let bytes = 1u64 << class.saturating_sub(1).min(62);
            let times = Times::new(n, stragglar_rounds(n, 1), bytes as f64, link);
            let at = times.with_delay(lateness_ns as f64 * 1e-9);
            (bytes, calls as f64 / total as f64, at.ring, at.stragglar)
        })
        .collect()
}

/// Groups of communicators that share no process (by host and pid) with any other group:
/// one job's communicators share its processes, so more than one group suggests two jobs'
/// records side by side. Each group lists its communicators.
fn jobs(findings: &[Finding]) -> Vec<Vec<u64>> {
    // Union-find over the findings: a communicator joins the group of every process it has.
    let mut parent: Vec<usize> = (0..findings.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut owner: std::collections::HashMap<(&str, u32), usize> = Default::default();
    for (i, f) in findings.iter().enumerate() {
        for m in &f.members {
            let first = *owner.entry((m.host.as_str(), m.pid)).or_insert(i);
            let (a, b) = (root(&mut parent, first), root(&mut parent, i));
            parent[a] = b;
        }
    }
    let mut groups: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for (i, f) in findings.iter().enumerate() {
        let r = root(&mut parent, i);
        groups.entry(r).or_default().push(f.comm);
    }
    let mut out: Vec<Vec<u64>> = groups
        .into_values()
        .map(|mut comms| {
            comms.sort_unstable();
            comms
        })
        .collect();
    out.sort();
    out
}

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

fn text(findings: &[Finding], files: usize, link: Link) -> String {
    let mut s = format!(
        "# stragglar report: {} communicator(s) from {files} record file(s)\n",
        findings.len()
    );
    for f in findings {
        let _ = writeln!(
            s,
            "communicator {:016x}: {} ranks, {} calls observed on every rank ({} not observed on some rank)",
            f.comm,
            f.ranks,
            f.calls.len(),
            f.unobserved
        );
        let kinds: Vec<String> = Collective::ALL
            .iter()
            .filter_map(|&c| {
                let n = f.calls.iter().filter(|x| x.collective == c).count();
                (n > 0).then(|| format!("{n} {}", c.name()))
            })
            .collect();
        let _ = writeln!(s, "  calls: {}", kinds.join(", "));
        if f.calls.iter().any(|c| c.collective == Collective::Group) {
            let _ = writeln!(
                s,
                "  a Group call is one ncclGroupStart/End's collectives of this communicator, timed as one"
            );
        }
        if f.dropped > 0 {
            let _ = writeln!(
                s,
                "  {} later call(s) were dropped: a record keeps at most {MAX_SAMPLES} calls per communicator",
                f.dropped
            );
        }
        for &(rank, last) in &f.unclosed {
            let stops = match last {
                Some(call) => format!("stops after call {call}"),
                None => "lists no call".to_string(),
            };
            let _ = writeln!(
                s,
                "  rank {rank}'s record {stops} and was never closed: its process did not end the communicator (killed, or still running)"
            );
        }
        match f.straggler {
            Some((rank, since)) => {
                let (share, median, p90) = figures(f, rank);
                let m = &f.members[rank];
                let _ = writeln!(
                    s,
                    "  persistent straggler: rank {rank} (host {}, GPU {} at PCI {}, pid {}), last in {:.0}% of calls, late by {} (median), {} (p90), designated from call {since}",
                    m.host,
                    m.gpu,
                    m.pci,
                    m.pid,
                    100.0 * share,
                    ms(median),
                    ms(p90)
                );
                let by_kind = lateness_by_collective(f, rank);
                if by_kind.len() > 1 {
                    let kinds: Vec<String> = by_kind
                        .iter()
                        .map(|(kind, ns)| format!("{} {}", kind.name(), ms(*ns)))
                        .collect();
                    let _ = writeln!(
                        s,
                        "  late by collective (median, when last): {}",
                        kinds.join(", ")
                    );
                }
                for (bytes, share, ring, stragglar) in modelled(f, median, link) {
                    let _ = writeln!(
                        s,
                        "  model, links of {:.1} us and {:.1} GB/s (not measured): an AllReduce of {bytes} B ({:.0}% of the AllReduce calls) at that lateness takes {:.1} us on Ring, {:.1} us on StragglAR: {:.1} us saved per call",
                        link.alpha * 1e6,
                        link.bandwidth / 1e9,
                        100.0 * share,
                        ring * 1e6,
                        stragglar * 1e6,
                        (ring - stragglar) * 1e6
                    );
                }
            }
            None => {
                let _ = writeln!(s, "  no persistent straggler");
                if let Some((rank, median)) = f.too_early {
                    let _ = writeln!(
                        s,
                        "  (rank {rank} arrived last persistently, but by only {} (median): under --min-lateness-us)",
                        ms(median)
                    );
                }
            }
        }
        if f.changes.len() > 1 {
            let moves: Vec<String> = f
                .changes
                .iter()
                .map(|(call, rank)| match rank {
                    Some(r) => format!("rank {r} from call {call}"),
                    None => format!("none from call {call}"),
                })
                .collect();
            let _ = writeln!(s, "  the straggler moved: {}", moves.join(", then "));
        }
        let _ = writeln!(s, "  rank  last (%)  median lateness when last");
        for rank in 0..f.ranks {
            let (share, median, _) = figures(f, rank);
            let _ = writeln!(s, "  {rank:>4}  {:>8.1}  {}", 100.0 * share, ms(median));
        }
    }
    let jobs = jobs(findings);
    if jobs.len() > 1 {
        let groups: Vec<String> = jobs
            .iter()
            .map(|comms| {
                let names: Vec<String> = comms.iter().map(|c| format!("{c:016x}")).collect();
                names.join(" ")
            })
            .collect();
        let _ = writeln!(
            s,
            "note: these communicators fall into {} groups with no process in common ({}): the records of {} jobs side by side?",
            jobs.len(),
            groups.join(" | "),
            jobs.len()
        );
    }
    if !findings.is_empty() {
        let _ = writeln!(s, "{LIMITS}");
    }
    s
}

fn json(findings: &[Finding]) -> String {
    let items: Vec<String> = findings
        .iter()
        .map(|f| {
            let straggler = match f.straggler {
                Some((rank, since)) => {
                    let (share, median, p90) = figures(f, rank);
                    let m = &f.members[rank];
                    let by_kind: Vec<String> = lateness_by_collective(f, rank)
                        .iter()
                        .map(|(kind, ns)| format!("\"{}\": {ns}", kind.name()))
                        .collect();
                    format!(
                        "{{\"rank\": {rank}, \"host\": \"{}\", \"gpu\": \"{}\", \"pci\": \"{}\", \"pid\": {}, \"last_share\": {share:.4}, \"lateness_median_ns\": {median}, \"lateness_p90_ns\": {p90}, \"lateness_median_ns_by_collective\": {{{}}}, \"since_call\": {since}}}",
                        json_escaped(&m.host),
                        json_escaped(&m.gpu),
                        json_escaped(&m.pci),
                        m.pid,
                        by_kind.join(", ")
                    )
                }
                None => "null".to_string(),
            };
            let unclosed: Vec<String> = f.unclosed.iter().map(|(r, _)| r.to_string()).collect();
            format!(
                "    {{\"comm\": \"{:016x}\", \"ranks\": {}, \"calls\": {}, \"unobserved\": {}, \"dropped\": {}, \"unclosed_ranks\": [{}], \"straggler\": {straggler}}}",
                f.comm,
                f.ranks,
                f.calls.len(),
                f.unobserved,
                f.dropped,
                unclosed.join(", ")
            )
        })
        .collect();
    format!(
        "{{\n  \"communicators\": [\n{}\n  ]\n}}\n",
        items.join(",\n")
    )
}

/// The picture's panels: per communicator, each call's last rank and lateness.
fn panels(findings: &[Finding]) -> Vec<super::charts::ArrivalPanel> {
    findings
        .iter()
        .map(|f| super::charts::ArrivalPanel {
            title: match f.straggler {
                Some((rank, since)) => format!(
                    "communicator {:016x}: {} ranks, rank {rank} the persistent straggler from call {since}",
                    f.comm, f.ranks
                ),
                None => format!(
                    "communicator {:016x}: {} ranks, no persistent straggler",
                    f.comm, f.ranks
                ),
            },
            ranks: f.ranks,
            calls: f.calls.iter().map(|c| (c.last, c.lateness_ns)).collect(),
        })
        .collect()
}

/// Runs `stragglar report`; exit status 1 when an input is wrong (the rest is still reported).
pub fn run(mut args: Args) -> Result<i32, UsageError> {
    let as_json = args.flag(&["--json"]);
    let svg = args.value(&["--svg"])?.map(PathBuf::from);
    let min_lateness_us = args
        .parsed::<u64>(&["--min-lateness-us"], "microseconds")?
        .unwrap_or(MIN_LATENESS_US);
    let link = super::model::link_options(&mut args)?;
    let dirs: Vec<PathBuf> = args.rest()?.into_iter().map(PathBuf::from).collect();
    if dirs.is_empty() {
        return Err(UsageError(
            "report: name the directories of the records".into(),
        ));
    }
    let (records, unread) = records::read_dirs(&dirs);
    if records.is_empty() {
        for e in &unread {
            eprintln!("stragglar report: {e}");
        }
        eprintln!(
            "stragglar report: no record files (stragglar-*.rec) read in the directories given"
        );
        return Ok(1);
    }
    let (found, mut errors) = findings(&records, min_lateness_us * 1000);
    errors.splice(0..0, unread);
    match as_json {
        true => print!("{}", json(&found)),
        false => print!("{}", text(&found, records.len(), link)),
    }
    for e in &errors {
        eprintln!("stragglar report: {e}");
    }
    if let Some(path) = svg {
        if let Err(e) = super::charts::arrivals(&panels(&found), &path.display().to_string()) {
            eprintln!("stragglar report: {e}");
            return Ok(1);
        }
    }
    Ok(i32::from(!errors.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda::sizing::NVSWITCH_LINK;

    fn record(rank: usize, durations: impl Fn(u64) -> u64) -> RankRecord {
        RankRecord {
            path: PathBuf::from(format!("r{rank}.rec")),
            comm: 0xab,
            rank,
            ranks: 4,
            host: "h".into(),
            pid: rank as u32,
            gpu: "g".into(),
            pci: "0000:10:00.0".into(),
            unobserved: 0,
            dropped: 0,
            closed: true,
            calls: (0..100)
                .map(|c| (c, (Collective::AllReduce, 14, durations(c))))
                .collect(),
        }
    }

    #[test]
    fn the_shortest_call_names_the_last_arrival_and_the_detector_the_straggler() {
        // Rank 2 arrives 5 ms late on every call: the others wait for it.
        let records: Vec<RankRecord> = (0..4)
            .map(|r| {
                record(
                    r,
                    move |c| if r == 2 { 100_000 } else { 5_100_000 + c * 10 },
                )
            })
            .collect();
        let (found, errors) = findings(&records, 0);
        assert!(errors.is_empty(), "{errors:?}");
        let f = &found[0];
        assert_eq!(f.calls.len(), 100);
        let (rank, since) = f.straggler.expect("a straggler");
        assert_eq!(rank, 2);
        assert!(since < 32, "designated within a window: {since}");
        let (share, median, _) = figures(f, 2);
        assert_eq!(share, 1.0);
        assert!((4_900_000..5_100_000).contains(&median), "{median}");
        assert!(text(&found, 4, NVSWITCH_LINK).contains("persistent straggler: rank 2"));
        assert!(json(&found).contains("\"rank\": 2"));
        // Late by 5 ms: under a 6 ms threshold it is not named, and the report says why.
        let (quiet, _) = findings(&records, 6_000_000);
        assert_eq!(quiet[0].straggler, None);
        assert!(text(&quiet, 4, NVSWITCH_LINK)
            .contains("rank 2 arrived last persistently, but by only"));
    }

    #[test]
    fn nobody_is_named_when_the_last_rank_keeps_changing() {
        let records: Vec<RankRecord> = (0..4)
            .map(|r| record(r, move |c| if c % 4 == r as u64 { 100 } else { 2_000 }))
            .collect();
        let (found, _) = findings(&records, 0);
        assert_eq!(found[0].straggler, None);
        assert!(text(&found, 4, NVSWITCH_LINK).contains("no persistent straggler"));
    }

    #[test]
    fn the_lateness_is_given_per_collective_and_host_names_stay_valid_json() {
        // FSDP's three collectives in turn; rank 1 is late by 3 ms at AllReduce, 5 ms at
        // ReduceScatter and 7 ms at AllGather.
        let kinds = [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
        ];
        let records: Vec<RankRecord> = (0..4)
            .map(|r| {
                let mut rec = record(r, |_| 0);
                rec.host = "rack \"7\"\\node\n".into();
                for (c, call) in rec.calls.iter_mut() {
                    let kind = (*c % 3) as usize;
                    call.0 = kinds[kind];
                    call.2 = if r == 1 {
                        100_000
                    } else {
                        100_000 + 3_000_000 + 2_000_000 * kind as u64
                    };
                }
                rec
            })
            .collect();
        let (found, errors) = findings(&records, 0);
        assert!(errors.is_empty(), "{errors:?}");
        let by_kind = lateness_by_collective(&found[0], 1);
        assert_eq!(
            by_kind,
            vec![
                (Collective::AllReduce, 3_000_000),
                (Collective::ReduceScatter, 5_000_000),
                (Collective::AllGather, 7_000_000)
            ]
        );
        let report = text(&found, 4, NVSWITCH_LINK);
        assert!(
            report.contains("late by collective (median, when last): AllReduce 3.000 ms, ReduceScatter 5.000 ms, AllGather 7.000 ms"),
            "{report}"
        );
        let json = json(&found);
        assert!(
            json.contains("\"host\": \"rack \\\"7\\\"\\\\node\\u000a\""),
            "{json}"
        );
        assert!(
            json.contains("\"lateness_median_ns_by_collective\": {\"AllReduce\": 3000000, \"ReduceScatter\": 5000000, \"AllGather\": 7000000}"),
            "{json}"
        );
    }

    #[test]
    fn two_jobs_side_by_side_are_noted_and_the_caps_and_limits_said() {
        let late = |r: usize| move |_| if r == 2 { 100_000 } else { 5_100_000 };
        let job = |comm: u64, pid: u32| -> Vec<RankRecord> {
            (0..4)
                .map(|r| {
                    let mut rec = record(r, late(r));
                    rec.comm = comm;
                    rec.pid = pid + r as u32;
                    rec
                })
                .collect()
        };
        // Two jobs: no process in common.
        let mut two = job(0xab, 100);
        two.extend(job(0xcd, 200));
        two[0].dropped = 5;
        let (found, errors) = findings(&two, 0);
        assert!(errors.is_empty(), "{errors:?}");
        let report = text(&found, 8, NVSWITCH_LINK);
        assert!(
            report.contains("note: these communicators fall into 2 groups with no process in common (00000000000000ab | 00000000000000cd)"),
            "{report}"
        );
        assert!(
            report.contains("5 later call(s) were dropped: a record keeps at most 1048576 calls"),
            "{report}"
        );
        assert!(report.ends_with(&format!("{LIMITS}\n")), "{report}");
        assert!(json(&found).contains("\"dropped\": 5,"));
        // One job: a communicator split from the first shares its processes.
        let mut one = job(0xab, 100);
        for (i, r) in [0usize, 2].into_iter().enumerate() {
            let mut rec = record(i, late(r));
            rec.comm = 0xcd;
            rec.ranks = 2;
            rec.pid = 100 + r as u32;
            one.push(rec);
        }
        let (found, errors) = findings(&one, 0);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(found.len(), 2);
        assert!(!text(&found, 6, NVSWITCH_LINK).contains("note:"));
        // The model prices the links given.
        let slow = Link {
            alpha: 10e-6,
            bandwidth: 25e9,
        };
        let report = text(&found, 6, slow);
        assert!(
            report.contains("model, links of 10.0 us and 25.0 GB/s (not measured): an AllReduce of 8192 B (100% of the AllReduce calls)"),
            "{report}"
        );
    }

    #[test]
    fn missing_ranks_and_two_jobs_are_errors() {
        let three: Vec<RankRecord> = (0..3).map(|r| record(r, |_| 1)).collect();
        let (found, errors) = findings(&three, 0);
        assert!(found.is_empty() && errors[0].contains("no record of rank(s) 3 of 4"));
        let mut twice: Vec<RankRecord> = (0..4).map(|r| record(r, |_| 1)).collect();
        twice.push(record(1, |_| 1));
        let (_, errors) = findings(&twice, 0);
        assert!(errors[0].contains("two records of rank 1"), "{errors:?}");
    }
}
