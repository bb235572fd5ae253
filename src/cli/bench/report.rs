//! The nccl-tests all_reduce_perf table, footer and `-J` JSON, with our two extra columns
//! after the in-place `#wrong` (so nccl-tests parsers keep working).

use std::fmt::Write;

use super::options::{BenchOptions, RanksAs};
use super::worker::SizeResult;

/// One size, combined over ranks: times averaged (nccl-tests' default `-a 1`), wrong elements
/// summed, lateness averaged, post-arrival time the slowest rank's.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub bytes: u64,
    pub count: u64,
    /// (time us, algbw GB/s, busbw GB/s, #wrong) out-of-place then in-place.
    pub halves: [(f64, f64, f64, u64); 2],
    pub lead_us: f64,
    pub post_us: f64,
    /// The designated straggler after the size (rank 0's view), -1 for none.
    pub designated: i64,
    /// Share of timed calls that ran StragglAR, in percent.
    pub stragglar_percent: f64,
    /// Ranks whose sequence of choices differs from rank 0's (must be 0).
    pub disagreements: u64,
}

/// Combines every rank's result of one size. Outputs that differ between ranks count as
/// wrong elements too (one per rank that disagrees with rank 0).
pub fn combine(options: &BenchOptions, per_rank: &[SizeResult]) -> Row {
    let n = per_rank.len() as f64;
    let bytes = per_rank[0].bytes;
    let bus = 2.0 * (options.ranks as f64 - 1.0) / options.ranks as f64;
    let mut halves = [(0.0, 0.0, 0.0, 0); 2];
    for (h, slot) in halves.iter_mut().enumerate() {
        let time = per_rank.iter().map(|r| r.halves[h].time_us).sum::<f64>() / n;
        let algbw = if time > 0.0 {
            bytes as f64 / time / 1e3
        } else {
            0.0
        };
        let disagree = per_rank
            .iter()
            .filter(|r| r.halves[h].digest != per_rank[0].halves[h].digest)
            .count() as u64;
        let wrong = per_rank.iter().map(|r| r.halves[h].wrong).sum::<u64>() + disagree;
        *slot = (time, algbw, algbw * bus, wrong);
    }
    let lead_us = per_rank
        .iter()
        .map(|r| (r.halves[0].lead_us + r.halves[1].lead_us) / 2.0)
        .sum::<f64>()
        / n;
    let post_us = per_rank
        .iter()
        .map(|r| (r.halves[0].post_us + r.halves[1].post_us) / 2.0)
        .fold(0.0, f64::max);
    let disagreements = per_rank
        .iter()
        .filter(|r| (0..2).any(|h| r.halves[h].choices != per_rank[0].halves[h].choices))
        .count() as u64;
    let timed = per_rank[0]
        .halves
        .iter()
        .map(|h| h.stragglar_calls)
        .sum::<u64>() as f64;
    Row {
        bytes,
        count: bytes / options.dtype.size() as u64,
        halves,
        lead_us,
        post_us,
        designated: per_rank[0].halves[1].designated,
        stragglar_percent: 100.0 * timed / (2 * options.iters) as f64,
        disagreements,
    }
}

/// A number in at most `width` characters, with as many decimals as fit (nccl-tests style).
fn fit(value: f64, width: usize) -> String {
    for decimals in (0..=2).rev() {
        let s = format!("{value:>width$.decimals$}");
        if s.len() <= width {
            return s;
        }
    }
    format!("{value:>width$.0}")
}

fn describe_algo(options: &BenchOptions) -> &'static str {
    options.algo.name()
}

/// The header lines.
pub fn header(options: &BenchOptions, comm_id: u64) -> String {
    let mut s = String::new();
    let link = match (options.link_gbs, options.baseline_link_gbs) {
        (Some(g), None) => format!("{g} GB/s + {} us per transfer", options.link_latency_us),
        (Some(g), Some(b)) => format!(
            "{g} GB/s (the baseline's {b} GB/s) + {} us per transfer",
            options.link_latency_us
        ),
        (None, _) => "unlimited".into(),
    };
    let step = match options.step_factor {
        Some(f) => format!("{f}(factor)"),
        None => format!("{}(bytes)", options.step_bytes),
    };
    let _ = writeln!(
        s,
        "# stragglar bench {} (all_reduce_perf format) comm {comm_id:016x}",
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(
        s,
        "# backend host ranks {} as {} algo {} pipeline {} straggler {} late rank {} delay {} us link {}",
        options.ranks,
        if options.ranks_as == RanksAs::Processes {
            "processes"
        } else {
            "threads"
        },
        describe_algo(options),
        options.pipeline,
        options.straggler,
        options
            .late_ranks
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(","),
        options.delay_us,
        link
    );
    let _ = writeln!(
        s,
        "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: 1 validation: {} graph: 0",
        options.min_bytes, options.max_bytes, step, options.warmup, options.iters, options.check
    );
    let _ = writeln!(s, "#");
    let _ = writeln!(
        s,
        "#                                                              out-of-place                       in-place                  straggler        policy"
    );
    let _ = writeln!(
        s,
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong     lead     post  strag   sg%"
    );
    let _ = writeln!(
        s,
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)            (us)     (us)"
    );
    s
}

/// One table line.
pub fn line(options: &BenchOptions, row: &Row) -> String {
    let wrong = |w: u64| {
        if options.check == 0 {
            "N/A".to_string()
        } else {
            w.to_string()
        }
    };
    let mut s = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
        row.bytes,
        row.count,
        options.dtype.name(),
        options.op.name(),
        -1
    );
    for (time, algbw, busbw, w) in row.halves {
        let _ = write!(
            s,
            "  {}  {}  {}  {:>6}",
            fit(time, 7),
            fit(algbw, 6),
            fit(busbw, 6),
            wrong(w)
        );
    }
    let _ = write!(s, "  {}  {}", fit(row.lead_us, 7), fit(row.post_us, 7));
    let designated = if row.designated < 0 {
        "-".to_string()
    } else {
        row.designated.to_string()
    };
    let _ = write!(s, "  {designated:>5}  {:>4.0}", row.stragglar_percent);
    s
}

/// The footer; `Avg bus bandwidth` is the mean of every printed busbw.
pub fn footer(rows: &[Row]) -> String {
    let bws: Vec<f64> = rows
        .iter()
        .flat_map(|r| r.halves.iter().map(|h| h.2))
        .collect();
    let avg = if bws.is_empty() {
        0.0
    } else {
        bws.iter().sum::<f64>() / bws.len() as f64
    };
    format!("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {avg:.6}\n#\n# Collective test concluded: all_reduce_perf\n")
}

/// The `-J` JSON document.
pub fn json(options: &BenchOptions, rows: &[Row]) -> String {
    let bws: Vec<f64> = rows
        .iter()
        .flat_map(|r| r.halves.iter().map(|h| h.2))
        .collect();
    let avg = if bws.is_empty() {
        0.0
    } else {
        bws.iter().sum::<f64>() / bws.len() as f64
    };
    let half = |h: (f64, f64, f64, u64)| {
        format!(
            "{{\"time\": {:.3}, \"alg_bw\": {:.6}, \"bus_bw\": {:.6}, \"nwrong\": {}}}",
            h.0, h.1, h.2, h.3
        )
    };
    let results: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "    {{\"size\": {}, \"count\": {}, \"type\": \"{}\", \"redop\": \"{}\", \"root\": -1, \"out_of_place\": {}, \"in_place\": {}, \"straggler\": {{\"lead_us\": {:.3}, \"post_arrival_us\": {:.3}, \"designated\": {}, \"stragglar_percent\": {:.1}}}}}",
                r.bytes,
                r.count,
                options.dtype.name(),
                options.op.name(),
                half(r.halves[0]),
                half(r.halves[1]),
                r.lead_us,
                r.post_us,
                r.designated,
                r.stragglar_percent
            )
        })
        .collect();
    format!(
        "{{\n  \"config\": {{\"collective\": \"all_reduce_perf\", \"backend\": \"host\", \"ranks\": {}, \"algo\": \"{}\", \"pipeline\": \"{}\", \"straggler\": {}, \"delay_us\": {}, \"link_gbs\": {}, \"baseline_link_gbs\": {}, \"minBytes\": {}, \"maxBytes\": {}, \"iters\": {}, \"warmup_iters\": {}, \"validation\": {}}},\n  \"results\": [\n{}\n  ],\n  \"out_of_bounds\": 0,\n  \"average_bus_bandwidth\": {:.6}\n}}\n",
        options.ranks,
        describe_algo(options),
        options.pipeline,
        options.straggler,
        options.delay_us,
        options.link_gbs.map_or("null".to_string(), |g| g.to_string()),
        options
            .baseline_link_gbs
            .map_or("null".to_string(), |g| g.to_string()),
        options.min_bytes,
        options.max_bytes,
        options.iters,
        options.warmup,
        options.check,
        results.join(",\n"),
        avg
    )
}
