//! What `stragglar bench` prints and writes, for both backends: the nccl-tests all_reduce_perf
//! table (our two extra columns after the in-place `#wrong`, so nccl-tests parsers keep
//! working), its footer, the `-J` JSON document and the `--svg` chart.
//!
//! Each backend reduces what one rank measured for one size to a [`RankSize`]; [`combine`]
//! makes a row of every rank's, the same way for both.

use std::fmt::Write;

use super::options::{Backend, BenchAlgo, BenchOptions, RanksAs, TimeStat};
use crate::reduce::{DataType, ReduceOp};

/// One placement (out of place or in place) of one size, as one rank measured it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RankHalf {
    /// Mean time per call, microseconds.
    pub time_us: f64,
    /// Elements that differ from the expectation.
    pub wrong: u64,
    /// A digest of the output, which every rank must share.
    pub digest: u64,
}

/// One size of one type and op, as one rank measured it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankSize {
    pub bytes: u64,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// Out of place, then in place.
    pub halves: [RankHalf; 2],
    /// Mean lead of the last arrival over the second-to-last, and mean time from the last
    /// arrival to this rank's finish, microseconds (`None`: the backend does not measure them
    /// per size).
    pub lead_us: Option<f64>,
    pub post_us: Option<f64>,
    /// Timed calls, and those that ran StragglAR.
    pub calls: u64,
    pub stragglar_calls: u64,
    /// A digest of everything every rank must decide alike (its choices, its arrival records).
    pub agreed: u64,
    /// The designated straggler after the size, -1 for none.
    pub designated: i64,
    /// Host microseconds to queue one eager call (`None`: not measured, or graph replays).
    pub host_us: Option<f64>,
}

/// The word of a worker's line for a size.
const SIZE_WORD: &str = "SIZE";

impl RankSize {
    /// The line a worker process prints for this size (one parser reads it for both backends:
    /// [`RankSize::from_worker_line`]). Floats print as Rust prints them, which parse back exactly.
    pub fn worker_line(&self) -> String {
        let optional = |v: Option<f64>| v.map_or("-".to_string(), |v| v.to_string());
        let halves: Vec<String> = self
            .halves
            .iter()
            .map(|h| format!("{} {} {}", h.time_us, h.wrong, h.digest))
            .collect();
        format!(
            "{SIZE_WORD} {} {} {} {} {} {} {} {} {} {} {}",
            self.bytes,
            self.dtype.name(),
            self.op.name(),
            halves.join(" "),
            optional(self.lead_us),
            optional(self.post_us),
            self.calls,
            self.stragglar_calls,
            self.agreed,
            self.designated,
            optional(self.host_us)
        )
    }

    /// What a worker's line says: `None` when it is not a size's line, `Some(Err)` when it is
    /// one that does not parse.
    pub fn from_worker_line(line: &str) -> Option<Result<RankSize, String>> {
        let rest = line.strip_prefix(SIZE_WORD)?.strip_prefix(' ')?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let parse = || -> Option<RankSize> {
            if f.len() != 16 {
                return None;
            }
            let optional = |at: usize| match f[at] {
                "-" => Some(None),
                v => v.parse().ok().map(Some),
            };
            let half = |at: usize| -> Option<RankHalf> {
                Some(RankHalf {
                    time_us: f[at].parse().ok()?,
                    wrong: f[at + 1].parse().ok()?,
                    digest: f[at + 2].parse().ok()?,
                })
            };
            Some(RankSize {
                bytes: f[0].parse().ok()?,
                dtype: DataType::parse(f[1])?,
                op: ReduceOp::parse(f[2])?,
                halves: [half(3)?, half(6)?],
                lead_us: optional(9)?,
                post_us: optional(10)?,
                calls: f[11].parse().ok()?,
                stragglar_calls: f[12].parse().ok()?,
                agreed: f[13].parse().ok()?,
                designated: f[14].parse().ok()?,
                host_us: optional(15)?,
            })
        };
        Some(parse().ok_or_else(|| format!("unreadable worker line: {line}")))
    }
}

/// One size, combined over ranks: the time as `-a` says (nccl-tests' default: the average),
/// wrong elements summed, lateness averaged, post-arrival time the slowest rank's.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub bytes: u64,
    pub count: u64,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// (time us, algbw GB/s, busbw GB/s, #wrong) out-of-place then in-place. A rank whose
    /// output differs from rank 0's counts as one wrong element.
    pub halves: [(f64, f64, f64, u64); 2],
    pub lead_us: Option<f64>,
    pub post_us: Option<f64>,
    /// The designated straggler after the size (rank 0's view), -1 for none.
    pub designated: i64,
    /// Share of timed calls that ran StragglAR (rank 0's), in percent.
    pub stragglar_percent: f64,
    /// Ranks whose choices or records differ from rank 0's (must be 0).
    pub disagreements: u64,
}

impl Row {
    /// Wrong elements and disagreements: what makes a run fail.
    pub fn bad(&self) -> u64 {
        self.halves.iter().map(|h| h.3).sum::<u64>() + self.disagreements
    }
}

impl TimeStat {
    /// The time of a size over every rank's.
    fn over(self, times: impl Iterator<Item = f64> + Clone) -> f64 {
        let n = times.clone().count().max(1) as f64;
        match self {
            TimeStat::Rank0 => times.clone().next().unwrap_or(0.0),
            TimeStat::Average => times.sum::<f64>() / n,
            TimeStat::Min => times.fold(f64::INFINITY, f64::min),
            TimeStat::Max => times.fold(0.0, f64::max),
        }
    }
}

/// Combines every rank's result of one size, `per_rank` in rank order (rank 0 first).
pub fn combine(ranks: usize, stat: TimeStat, per_rank: &[RankSize]) -> Row {
    let first = &per_rank[0];
    let bus = 2.0 * (ranks as f64 - 1.0) / ranks as f64;
    let mut halves = [(0.0, 0.0, 0.0, 0); 2];
    for (h, slot) in halves.iter_mut().enumerate() {
        let time = stat.over(per_rank.iter().map(|r| r.halves[h].time_us));
        let algbw = if time > 0.0 {
            first.bytes as f64 / time / 1e3
        } else {
            0.0
        };
        let disagree = per_rank
            .iter()
            .filter(|r| r.halves[h].digest != first.halves[h].digest)
            .count() as u64;
        let wrong = per_rank.iter().map(|r| r.halves[h].wrong).sum::<u64>() + disagree;
        *slot = (time, algbw, algbw * bus, wrong);
    }
    let n = per_rank.len() as f64;
    let lead_us = per_rank
        .iter()
        .map(|r| r.lead_us)
        .sum::<Option<f64>>()
        .map(|sum| sum / n);
    let post_us = per_rank
        .iter()
        .map(|r| r.post_us)
        .try_fold(0.0, |slowest: f64, post| post.map(|p| slowest.max(p)));
    Row {
        bytes: first.bytes,
        count: first.bytes / first.dtype.size() as u64,
        dtype: first.dtype,
        op: first.op,
        halves,
        lead_us,
        post_us,
        designated: first.designated,
        stragglar_percent: 100.0 * first.stragglar_calls as f64 / first.calls.max(1) as f64,
        disagreements: per_rank.iter().filter(|r| r.agreed != first.agreed).count() as u64,
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

/// A measured value, or `N/A` where the backend does not measure it.
fn fit_or_na(value: Option<f64>, width: usize) -> String {
    value.map_or_else(|| format!("{:>width$}", "N/A"), |v| fit(v, width))
}

fn backend_name(options: &BenchOptions) -> &'static str {
    match options.backend {
        Backend::Host => "host",
        Backend::Cuda => "cuda",
    }
}

/// The header lines; `machine` describes where the ranks ran (the host engine's links, or
/// the GPU and its grid).
pub fn header(options: &BenchOptions, comm_id: u64, machine: &str) -> String {
    let mut s = String::new();
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
        "# backend {} ranks {} as {} algo {} pipeline {} straggler {} late rank {} delay {} us {machine}",
        backend_name(options),
        options.ranks,
        if options.ranks_as == RanksAs::Processes {
            "processes"
        } else {
            "threads"
        },
        options.algo.name(),
        options.pipeline,
        options.straggler,
        options
            .late_ranks
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(","),
        options.delay_us,
    );
    let _ = writeln!(
        s,
        "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: 1 validation: {} graph: {} average: {}",
        options.min_bytes,
        options.max_bytes,
        step,
        options.warmup,
        options.iters,
        options.check,
        u8::from(options.graph),
        options.time_stat.code()
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

/// One table line. Rank disagreements count in the out-of-place `#wrong`.
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
        row.dtype.name(),
        row.op.name(),
        -1
    );
    for (half, (time, algbw, busbw, w)) in row.halves.into_iter().enumerate() {
        let w = if half == 0 { w + row.disagreements } else { w };
        let _ = write!(
            s,
            "  {}  {}  {}  {:>6}",
            fit(time, 7),
            fit(algbw, 6),
            fit(busbw, 6),
            wrong(w)
        );
    }
    let _ = write!(
        s,
        "  {}  {}",
        fit_or_na(row.lead_us, 7),
        fit_or_na(row.post_us, 7)
    );
    let designated = if row.designated < 0 {
        "-".to_string()
    } else {
        row.designated.to_string()
    };
    let _ = write!(s, "  {designated:>5}  {:>4.0}", row.stragglar_percent);
    s
}

/// The mean of every printed busbw.
fn average_bus_bandwidth(rows: &[Row]) -> f64 {
    let bws: Vec<f64> = rows
        .iter()
        .flat_map(|r| r.halves.iter().map(|h| h.2))
        .collect();
    if bws.is_empty() {
        0.0
    } else {
        bws.iter().sum::<f64>() / bws.len() as f64
    }
}

/// The footer; `Avg bus bandwidth` is the mean of every printed busbw, and our own line counts
/// what makes the run fail.
pub fn footer(rows: &[Row]) -> String {
    format!(
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {:.6}\n# wrong elements and rank disagreements: {}\n#\n# Collective test concluded: all_reduce_perf\n",
        average_bus_bandwidth(rows),
        rows.iter().map(Row::bad).sum::<u64>()
    )
}

fn json_number(value: Option<f64>) -> String {
    value.map_or("null".to_string(), |v| format!("{v:.3}"))
}

/// The `-J` JSON document.
pub fn json(options: &BenchOptions, rows: &[Row]) -> String {
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
                "    {{\"size\": {}, \"count\": {}, \"type\": \"{}\", \"redop\": \"{}\", \"root\": -1, \"out_of_place\": {}, \"in_place\": {}, \"straggler\": {{\"lead_us\": {}, \"post_arrival_us\": {}, \"designated\": {}, \"stragglar_percent\": {:.1}, \"disagreements\": {}}}}}",
                r.bytes,
                r.count,
                r.dtype.name(),
                r.op.name(),
                half(r.halves[0]),
                half(r.halves[1]),
                json_number(r.lead_us),
                json_number(r.post_us),
                r.designated,
                r.stragglar_percent,
                r.disagreements
            )
        })
        .collect();
    format!(
        "{{\n  \"config\": {{\"collective\": \"all_reduce_perf\", \"backend\": \"{}\", \"ranks\": {}, \"ranks_as\": \"{}\", \"algo\": \"{}\", \"pipeline\": \"{}\", \"straggler\": {}, \"delay_us\": {}, \"link_gbs\": {}, \"baseline_link_gbs\": {}, \"minBytes\": {}, \"maxBytes\": {}, \"iters\": {}, \"warmup_iters\": {}, \"validation\": {}, \"graph\": {}, \"average\": {}}},\n  \"results\": [\n{}\n  ],\n  \"out_of_bounds\": 0,\n  \"average_bus_bandwidth\": {:.6}\n}}\n",
        backend_name(options),
        options.ranks,
        match options.ranks_as {
            RanksAs::Processes => "processes",
            RanksAs::Threads => "threads",
        },
        options.algo.name(),
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
        options.graph,
        options.time_stat.code(),
        results.join(",\n"),
        average_bus_bandwidth(rows)
    )
}

/// Draws the run's rows into `path` (`--svg`): the time per call out of place of each type and
/// op (and in place too when one ran), the measured time after the last arrival where the
/// backend measures it, and the model's where the links are emulated (`--link-gbs`) and one
/// algorithm ran.
pub fn draw(options: &BenchOptions, rows: &[Row], path: &std::path::Path) -> Result<(), String> {
    use crate::schedule::model::{stragglar_rounds, Link, Multicast, Times};
    let mut groups: Vec<(DataType, ReduceOp)> = Vec::new();
    for r in rows {
        if !groups.contains(&(r.dtype, r.op)) {
            groups.push((r.dtype, r.op));
        }
    }
    let points = |dtype, op, value: &dyn Fn(&Row) -> f64| -> Vec<(u64, f64)> {
        let mut p: Vec<(u64, f64)> = rows
            .iter()
            .filter(|r| (r.dtype, r.op) == (dtype, op))
            .map(|r| (r.bytes, value(r)))
            .collect();
        p.sort_by_key(|&(bytes, _)| bytes);
        p
    };
    let mut measured = Vec::new();
    for &(dtype, op) in &groups {
        let label = format!("{} {}", dtype.name(), op.name());
        measured.push((
            format!("time per call, {label}, out of place"),
            points(dtype, op, &|r| r.halves[0].0),
        ));
        if groups.len() == 1 {
            measured.push((
                format!("time per call, {label}, in place"),
                points(dtype, op, &|r| r.halves[1].0),
            ));
        }
    }
    if groups.len() == 1 && rows.iter().all(|r| r.post_us.is_some()) {
        let (dtype, op) = groups[0];
        measured.push((
            "after the last arrival, measured".to_string(),
            points(dtype, op, &|r| r.post_us.unwrap_or(0.0)),
        ));
    }
    let n = options.ranks;
    let link = options.link_gbs.map(|gbs| Link {
        alpha: options.link_latency_us * 1e-6,
        bandwidth: gbs * 1e9,
    });
    let rounds = stragglar_rounds(n, 1);
    let post = |bytes: f64| {
        let link = link.expect("checked below");
        let t = Times::new(n, rounds, bytes, link);
        match options.algo {
            BenchAlgo::Ring => t.ring,
            BenchAlgo::Multicast => Multicast { ratio: 1.0 }.times(n, bytes, link).post,
            _ => t.stragglar_post,
        }
    };
    let algo = match options.algo {
        BenchAlgo::Stragglar => "StragglAR",
        BenchAlgo::Ring => "Ring",
        BenchAlgo::Auto => "auto",
        BenchAlgo::Multicast => "multicast StragglAR",
    };
    let model_label = format!("after the last arrival, model ({algo})");
    let model: Option<(&str, &dyn Fn(f64) -> f64)> = match (link, options.algo) {
        (Some(_), BenchAlgo::Stragglar | BenchAlgo::Ring | BenchAlgo::Multicast) => {
            Some((&model_label, &post))
        }
        _ => None,
    };
    let late = format!(
        "{} late by {} us",
        options.late_in_words(),
        options.delay_us
    );
    let title = match (options.backend, options.link_gbs) {
        (Backend::Cuda, _) => format!(
            "stragglar bench --backend cuda: {algo}, {n} ranks on one GPU, {late}; no model (one GPU, no links to price)"
        ),
        (Backend::Host, Some(gbs)) => format!(
            "stragglar bench: {algo}, {n} ranks, {late}; links emulated at {gbs} GB/s, {} us",
            options.link_latency_us
        ),
        (Backend::Host, None) => {
            format!("stragglar bench: {algo}, {n} ranks, {late}; links not emulated: no model")
        }
    };
    super::super::charts::bench(&title, measured, model, &path.display().to_string())
}

/// Prints the table of a run as its rows arrive, then its footer, and writes `-J` and `--svg`.
pub struct Report<'a> {
    options: &'a BenchOptions,
    rows: Vec<Row>,
}

impl<'a> Report<'a> {
    /// Prints the header.
    pub fn start(options: &'a BenchOptions, comm_id: u64, machine: &str) -> Report<'a> {
        print!("{}", header(options, comm_id, machine));
        Report {
            options,
            rows: Vec::new(),
        }
    }

    /// Prints one row and keeps it.
    pub fn add(&mut self, row: Row) {
        println!("{}", line(self.options, &row));
        self.rows.push(row);
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Prints the footer and writes the files asked for; the error says which failed.
    pub fn finish(self) -> Result<Vec<Row>, String> {
        print!("{}", footer(&self.rows));
        if let Some(path) = &self.options.svg {
            draw(self.options, &self.rows, path)?;
        }
        if let Some(path) = &self.options.json {
            std::fs::write(path, json(self.options, &self.rows))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        Ok(self.rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(time: [f64; 2], digest: u64, agreed: u64) -> RankSize {
        RankSize {
            bytes: 4096,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            halves: [0, 1].map(|h| RankHalf {
                time_us: time[h],
                wrong: 0,
                digest,
            }),
            lead_us: Some(10.0),
            post_us: None,
            calls: 4,
            stragglar_calls: 3,
            agreed,
            designated: 2,
            host_us: None,
        }
    }

    #[test]
    fn worker_lines_round_trip() {
        let mut r = rank([12.5, 1e-3], 0xfeed_beef_dead_cafe, 7);
        r.halves[1].wrong = 3;
        r.post_us = Some(3.25);
        r.host_us = Some(2.0);
        r.dtype = DataType::Bf16;
        r.op = ReduceOp::PreMulSum;
        assert_eq!(RankSize::from_worker_line(&r.worker_line()), Some(Ok(r)));
        let plain = rank([1.0, 2.0], 1, 0);
        assert_eq!(
            RankSize::from_worker_line(&plain.worker_line()),
            Some(Ok(plain))
        );
        assert!(matches!(
            RankSize::from_worker_line("SIZE 12 x"),
            Some(Err(_))
        ));
        assert_eq!(RankSize::from_worker_line("noise"), None);
        assert_eq!(RankSize::from_worker_line("SIZES 1"), None);
    }

    #[test]
    fn the_time_statistic_is_nccl_tests_a() {
        let ranks = [
            rank([4.0, 8.0], 1, 0),
            rank([2.0, 2.0], 1, 0),
            rank([6.0, 2.0], 1, 0),
        ];
        let time = |stat| combine(3, stat, &ranks).halves.map(|h| h.0);
        assert_eq!(time(TimeStat::Rank0), [4.0, 8.0]);
        assert_eq!(time(TimeStat::Average), [4.0, 4.0]);
        assert_eq!(time(TimeStat::Min), [2.0, 2.0]);
        assert_eq!(time(TimeStat::Max), [6.0, 8.0]);
    }

    #[test]
    fn ranks_that_differ_count_and_unmeasured_columns_stay_unmeasured() {
        let ranks = [
            rank([1.0; 2], 1, 0),
            rank([1.0; 2], 2, 0),
            rank([1.0; 2], 1, 9),
        ];
        let row = combine(3, TimeStat::Average, &ranks);
        assert_eq!(row.halves.map(|h| h.3), [1, 1], "rank 1's output differs");
        assert_eq!(row.disagreements, 1, "rank 2's choices differ");
        assert_eq!(row.bad(), 3);
        assert_eq!((row.lead_us, row.post_us), (Some(10.0), None));
        assert_eq!(row.stragglar_percent, 75.0);
        assert_eq!(row.count, 1024);
        let options = BenchOptions::parse(crate::cli::args::Args::new(Vec::<String>::new()))
            .expect("defaults");
        let text = line(&options, &row);
        assert!(text.contains(" N/A "), "{text}");
        assert!(text.trim_end().ends_with("2    75"), "{text}");
        let doc = json(&options, &[row]);
        assert!(doc.contains("\"post_arrival_us\": null"), "{doc}");
        assert!(doc.contains("\"lead_us\": 10.000"), "{doc}");
    }
}
