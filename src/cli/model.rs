//! `stragglar model`: the alpha-beta cost model of docs/ALGORITHM.md section 4 as a table.

use std::fmt::Write;

use super::args::{parse_bytes, parse_list, Args, UsageError};
use crate::detect::pipeline::Pipeline;
use crate::detect::policy::{AlgoMode, StragglerMode};
use crate::detect::{Finish, Policy};
use crate::schedule::model::{
    best_pipelining, stragglar_rounds, Completion, Link, Multicast, MulticastTimes, Nvls,
    Pipelining, Times,
};
use crate::schedule::{max_pieces_per_chunk, round_bound, Algorithm, PlanRequest};

/// Options of `stragglar model`, as shown by `stragglar help`.
pub const USAGE: &str = "
stragglar model [--ranks N,...] [--bytes SIZE,...] [--alpha-us A] [--bandwidth-gbs B]
                [--delay-us D,...] [--max-pipeline K] [--nvls-ratio R]
                [--multicast-ratio C] [--json] [--svg FILE]
    alpha-beta times of every algorithm for each combination (defaults: ranks 4..256 in
    powers of two, 1G, 3 us, 483.1838208 GB/s = 450 GiB/s, delay 0, pipelines up to 64);
    SIZE takes K/M/G (powers of 1024); GB/s are 10^9 bytes/s per link direction, what
    point-to-point transfers reach;
    NCCL's NVLS is priced for N <= 8 as 2 rounds of latency and M / (R x bandwidth), R by
    default 0.741 (NCCL's published NVLS over Ring bandwidth on 8x H100; 0 leaves NVLS out);
    multicast StragglAR is priced with its stores at C x bandwidth, by default 1 (an
    assumption, not a measurement; 0 leaves it out);
    policy: what the library's policy runs on this model with the straggler D late, under
    STRAGGLAR_PIPELINE=auto and, where multicast is priced, STRAGGLAR_MULTICAST=1: the baseline
    (nvls, or ring), stragglar/K (point to point, K pieces per chunk) or multicast;
    --svg also draws, one line per N, the speedup after arrival against size (64K to 4G) and
    the whole call's speedup against the delay, for the first SIZE, over Ring and (dashed)
    over NVLS
";

/// Defaults: the authors' prototype (3 us, 450 GiB/s, 1 GiB) on the powers of two.
const DEFAULT_RANKS: &str = "4,8,16,32,64,128,256";

/// One row: the times for one `(n, bytes, delay)`.
struct Row {
    times: Times,
    bound: usize,
    completion: Completion,
    pipelined: Pipelining,
    /// NCCL's NVLS time for this size, where it is priced.
    nvls: Option<f64>,
    /// Multicast StragglAR's phases, where it is priced.
    multicast: Option<MulticastTimes>,
    /// What the library's policy runs on the model ([`policy_choice`]).
    policy: String,
}

/// The policy the library applies on this model to `ranks` ranks: StragglAR on a designated
/// straggler's lead, the depth the model finds (`STRAGGLAR_PIPELINE=auto`), NCCL priced as NVLS
/// where `nvls` prices it, and the multicast finish weighed where `multicast` prices it.
fn model_policy(
    ranks: usize,
    link: Link,
    nvls: Option<Nvls>,
    multicast: Option<Multicast>,
) -> Policy {
    let policy =
        Policy::new(ranks, AlgoMode::Auto, StragglerMode::Auto, link).with_pipeline(Pipeline::Auto);
    let policy = match nvls {
        Some(nvls) => policy.with_nvls_baseline(nvls),
        None => policy,
    };
    match multicast {
        Some(multicast) => policy.with_multicast(multicast),
        None => policy,
    }
}

/// What `policy` runs for a call of `bytes` whose straggler leads by `delay` seconds: the
/// baseline (`nvls` or `ring`) below the break-even lead, else StragglAR with the finish the
/// model expects fastest at that lead (`stragglar/K`, `multicast`).
fn policy_choice(policy: &Policy, bytes: usize, delay: f64) -> String {
    let lead_ns = (delay * 1e9).round() as u64;
    match policy.break_even_ns(bytes) {
        Some(needed) if lead_ns >= needed => match policy.model_finish(bytes, Some(lead_ns)) {
            Finish::Multicast => "multicast".into(),
            Finish::Pieces(k) => format!("stragglar/{k}"),
        },
        _ if policy.nvls_baseline() => "nvls".into(),
        _ => "ring".into(),
    }
}

/// The link `--alpha-us` (microseconds per message, default 3) and `--bandwidth-gbs` (GB/s per
/// direction, default 483.2: an NVSwitch server's 450 GiB/s) describe, checked; `stragglar
/// model` and `stragglar report` price with it.
pub(super) fn link_options(args: &mut Args) -> Result<Link, UsageError> {
    let alpha_us: f64 = args.parsed(&["--alpha-us"], "microseconds")?.unwrap_or(3.0);
    let bandwidth_gbs: f64 = args
        .parsed(&["--bandwidth-gbs"], "GB/s")?
        .unwrap_or(483.183_820_8);
    if !(alpha_us.is_finite() && alpha_us >= 0.0) {
        return Err(UsageError("--alpha-us must be a number >= 0".into()));
    }
    if !(bandwidth_gbs.is_finite() && bandwidth_gbs > 0.0) {
        return Err(UsageError("--bandwidth-gbs must be a number > 0".into()));
    }
    Ok(Link {
        alpha: alpha_us * 1e-6,
        bandwidth: bandwidth_gbs * 1e9,
    })
}

/// Runs `stragglar model`; returns the exit status.
pub fn run(mut args: Args) -> Result<i32, UsageError> {
    let ranks = parse_list(
        &args
            .value(&["--ranks", "-n"])?
            .unwrap_or_else(|| DEFAULT_RANKS.to_string()),
        parse_ranks,
    )?;
    let sizes = parse_list(
        &args
            .value(&["--bytes", "-b"])?
            .unwrap_or_else(|| "1G".into()),
        parse_bytes,
    )?;
    let link = link_options(&mut args)?;
    let delays = parse_list(
        &args.value(&["--delay-us"])?.unwrap_or_else(|| "0".into()),
        parse_micros,
    )?;
    let max_pipeline: usize = args
        .parsed(&["--max-pipeline"], "a number of pieces")?
        .unwrap_or(64);
    let nvls_ratio: f64 = args
        .parsed(&["--nvls-ratio"], "a ratio")?
        .unwrap_or(Nvls::PUBLISHED_RATIO);
    let multicast_ratio: f64 = args
        .parsed(&["--multicast-ratio"], "a ratio")?
        .unwrap_or(Multicast::ASSUMED_RATIO);
    let json = args.flag(&["--json"]);
    let svg = args.value(&["--svg"])?;
    args.finish()?;
    if !(nvls_ratio.is_finite() && nvls_ratio >= 0.0) {
        return Err(UsageError("--nvls-ratio must be a number >= 0".into()));
    }
    if !(multicast_ratio.is_finite() && multicast_ratio >= 0.0) {
        return Err(UsageError("--multicast-ratio must be a number >= 0".into()));
    }
    let nvls = (nvls_ratio > 0.0).then_some(Nvls { ratio: nvls_ratio });
    let multicast = (multicast_ratio > 0.0).then_some(Multicast {
        ratio: multicast_ratio,
    });
    if ranks.is_empty() || sizes.is_empty() || delays.is_empty() {
        return Err(UsageError(
            "--ranks, --bytes and --delay-us need at least one value".into(),
        ));
    }
    if max_pipeline == 0 {
        return Err(UsageError("--max-pipeline must be at least 1".into()));
    }
    let mut rows = Vec::new();
    for &n in &ranks {
        PlanRequest::new(n, n.saturating_sub(1))
            .validate(Algorithm::Stragglar)
            .map_err(|e| UsageError(e.to_string()))?;
        let rounds = stragglar_rounds(n, 1);
        let policy = model_policy(n, link, nvls, multicast);
        for &bytes in &sizes {
            let times = Times::new(n, rounds, bytes as f64, link);
            let limit = max_pipeline.min(max_pieces_per_chunk(n));
            let pipelined = best_pipelining(n, bytes as f64, link, limit.max(1), |k| {
                if k == 1 {
                    rounds
                } else {
                    stragglar_rounds(n, k)
                }
            });
            for &delay in &delays {
                rows.push(Row {
                    times,
                    bound: round_bound(n, 1),
                    completion: times.with_delay(delay),
                    pipelined,
                    nvls: nvls.and_then(|nvls| nvls.time(n, bytes as f64, link)),
                    multicast: multicast.map(|mc| mc.times(n, bytes as f64, link)),
                    policy: policy_choice(&policy, bytes as usize, delay),
                });
            }
        }
    }
    if let Some(path) = svg {
        super::charts::speedup(&ranks, link, nvls, sizes[0], &path).map_err(UsageError)?;
    }
    print!("{}", if json { to_json(&rows) } else { to_text(&rows) });
    Ok(0)
}

fn parse_ranks(text: &str) -> Result<usize, UsageError> {
    text.parse()
        .map_err(|_| UsageError(format!("--ranks: expected numbers of ranks, got '{text}'")))
}

/// Parses microseconds into seconds.
fn parse_micros(text: &str) -> Result<f64, UsageError> {
    match text.parse::<f64>() {
        Ok(us) if us.is_finite() && us >= 0.0 => Ok(us * 1e-6),
        _ => Err(UsageError(format!(
            "--delay-us: expected microseconds >= 0, got '{text}'"
        ))),
    }
}

fn us(seconds: f64) -> String {
    format!("{:.1}", seconds * 1e6)
}

fn opt_us(seconds: Option<f64>) -> String {
    seconds.map_or("-".to_string(), us)
}

fn opt_ratio(ratio: Option<f64>) -> String {
    ratio.map_or("-".to_string(), |r| format!("{r:.3}"))
}

const COLUMNS: [&str; 29] = [
    "n",
    "bytes",
    "delay_us",
    "rounds",
    "bound",
    "ring_us",
    "rhd_us",
    "direct_us",
    "rs_us",
    "post_us",
    "stragglar_us",
    "ring_call_us",
    "speedup_post",
    "speedup_call",
    "break_even_us",
    "best_k",
    "post_k_us",
    "floor_us",
    "nvls_us",
    "speedup_post_nvls",
    "speedup_k_nvls",
    "speedup_call_nvls",
    "mc_pre_us",
    "mc_post_us",
    "mc_call_us",
    "speedup_post_mc_nvls",
    "speedup_call_mc_nvls",
    "mc_break_even_nvls_us",
    "policy",
];

/// The multicast columns of a row: its phases, the whole call, and its speedups over NVLS
/// after arrival and for the whole call, and its break-even delay against NVLS.
struct MulticastCells {
    pre: Option<f64>,
    post: Option<f64>,
    call: Option<f64>,
    post_over_nvls: Option<f64>,
    call_over_nvls: Option<f64>,
    break_even_nvls: Option<f64>,
}

impl MulticastCells {
    fn of(row: &Row) -> Self {
        let delay = row.completion.delay;
        let mc = row.multicast;
        let both = mc.zip(row.nvls);
        MulticastCells {
            pre: mc.map(|m| m.pre()),
            post: mc.map(|m| m.post),
            call: mc.map(|m| m.completion(delay)),
            post_over_nvls: both.map(|(m, nvls)| nvls / m.post),
            call_over_nvls: both.map(|(m, nvls)| (delay + nvls) / m.completion(delay)),
            break_even_nvls: both.and_then(|(m, nvls)| m.break_even(nvls)),
        }
    }
}

/// The NVLS columns of a row: NVLS's time, and StragglAR's speedups over it after arrival
/// (plain, pipelined) and for the whole call.
struct OverNvls {
    time: Option<f64>,
    post: Option<f64>,
    pipelined: Option<f64>,
    call: Option<f64>,
}

impl OverNvls {
    fn of(row: &Row) -> Self {
        let c = &row.completion;
        OverNvls {
            time: row.nvls,
            post: row.nvls.map(|t| t / row.times.stragglar_post),
            pipelined: row.nvls.map(|t| t / row.pipelined.time),
            call: row.nvls.map(|t| (c.delay + t) / c.stragglar),
        }
    }
}

fn to_text(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", COLUMNS.join("  "));
    for row in rows {
        let (t, c, p) = (&row.times, &row.completion, &row.pipelined);
        let nvls = OverNvls::of(row);
        let mc = MulticastCells::of(row);
        let cells = [
            t.ranks.to_string(),
            (t.bytes as u64).to_string(),
            us(c.delay),
            t.stragglar_rounds.to_string(),
            row.bound.to_string(),
            us(t.ring),
            opt_us(t.halving_doubling),
            us(c.direct),
            us(t.reduce_scatter),
            us(t.stragglar_post),
            us(c.stragglar),
            us(c.ring),
            format!("{:.3}", c.speedup_post),
            format!("{:.3}", c.speedup_call),
            opt_us(c.break_even),
            p.pieces.to_string(),
            us(p.time),
            us(p.floor),
            opt_us(nvls.time),
            opt_ratio(nvls.post),
            opt_ratio(nvls.pipelined),
            opt_ratio(nvls.call),
            opt_us(mc.pre),
            opt_us(mc.post),
            opt_us(mc.call),
            opt_ratio(mc.post_over_nvls),
            opt_ratio(mc.call_over_nvls),
            opt_us(mc.break_even_nvls),
            row.policy.clone(),
        ];
        let _ = writeln!(out, "{}", cells.join("  "));
    }
    out
}

fn json_number(x: Option<f64>) -> String {
    x.map_or("null".to_string(), |x| format!("{x:.9e}"))
}

/// A JSON array with one object per row; times in seconds, sizes in bytes.
fn to_json(rows: &[Row]) -> String {
    let mut out = String::from("[");
    for (i, row) in rows.iter().enumerate() {
        let (t, c, p) = (&row.times, &row.completion, &row.pipelined);
        let nvls = OverNvls::of(row);
        let mc = MulticastCells::of(row);
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            out,
            "{sep}\n  {{\"ranks\": {}, \"bytes\": {}, \"delay_s\": {}, \"rounds\": {}, \
             \"bound\": {}, \"ring_s\": {}, \"rhd_s\": {}, \"direct_s\": {}, \
             \"reduce_scatter_s\": {}, \"post_s\": {}, \"stragglar_s\": {}, \
             \"ring_call_s\": {}, \"speedup_post\": {}, \"speedup_call\": {}, \
             \"break_even_s\": {}, \"best_pieces\": {}, \"post_pipelined_s\": {}, \
             \"floor_s\": {}, \"nvls_s\": {}, \"speedup_post_nvls\": {}, \
             \"speedup_pipelined_nvls\": {}, \"speedup_call_nvls\": {}, \
             \"multicast_pre_s\": {}, \"multicast_post_s\": {}, \"multicast_s\": {}, \
             \"speedup_post_multicast_nvls\": {}, \"speedup_call_multicast_nvls\": {}, \
             \"multicast_break_even_nvls_s\": {}, \"policy\": \"{}\"}}",
            t.ranks,
            t.bytes as u64,
            json_number(Some(c.delay)),
            t.stragglar_rounds,
            row.bound,
            json_number(Some(t.ring)),
            json_number(t.halving_doubling),
            json_number(Some(c.direct)),
            json_number(Some(t.reduce_scatter)),
            json_number(Some(t.stragglar_post)),
            json_number(Some(c.stragglar)),
            json_number(Some(c.ring)),
            json_number(Some(c.speedup_post)),
            json_number(Some(c.speedup_call)),
            json_number(c.break_even),
            p.pieces,
            json_number(Some(p.time)),
            json_number(Some(p.floor)),
            json_number(nvls.time),
            json_number(nvls.post),
            json_number(nvls.pipelined),
            json_number(nvls.call),
            json_number(mc.pre),
            json_number(mc.post),
            json_number(mc.call),
            json_number(mc.post_over_nvls),
            json_number(mc.call_over_nvls),
            json_number(mc.break_even_nvls),
            row.policy,
        );
    }
    out.push_str("\n]\n");
    out
}
