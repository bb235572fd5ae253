//! `stragglar bench` options: nccl-tests' all_reduce_perf flags plus ours.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::args::{parse_bytes, Args, UsageError};
use crate::detect::pipeline::{Pipeline, MAX_PIECES};
use crate::engine::host::fault::Fault;
use crate::engine::host::link::LinkModel;
use crate::reduce::{DataType, ReduceOp};
use crate::schedule::model::Link;

/// Where the ranks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RanksAs {
    Processes,
    Threads,
}

/// Which engine runs the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The host engine over shared memory.
    Host,
    /// The GPU engine on GPU 0 (ranks as threads sharing it).
    Cuda,
}

/// The algorithm each call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchAlgo {
    Stragglar,
    Ring,
    /// The per-call policy: StragglAR with the detected straggler when it wins, else Ring.
    Auto,
    /// Multicast StragglAR with `--straggler` (the host engine only: its link model serves a
    /// multicast send's readers for the price of one send; the bench's GPU ranks share one GPU,
    /// where no multicast team forms).
    Multicast,
}

impl BenchAlgo {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            BenchAlgo::Stragglar => "stragglar",
            BenchAlgo::Ring => "ring",
            BenchAlgo::Auto => "auto",
            BenchAlgo::Multicast => "multicast",
        }
    }
}

/// Which rank's time a row shows (nccl-tests' `-a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeStat {
    /// `-a 0`: rank 0's.
    Rank0,
    /// `-a 1` (the default): the average over ranks.
    Average,
    /// `-a 2`: the fastest rank's.
    Min,
    /// `-a 3`: the slowest rank's.
    Max,
}

impl TimeStat {
    /// The `-a` code.
    pub fn code(self) -> u8 {
        match self {
            TimeStat::Rank0 => 0,
            TimeStat::Average => 1,
            TimeStat::Min => 2,
            TimeStat::Max => 3,
        }
    }

    fn from_code(code: u8) -> Option<TimeStat> {
        [
            TimeStat::Rank0,
            TimeStat::Average,
            TimeStat::Min,
            TimeStat::Max,
        ]
        .into_iter()
        .find(|s| s.code() == code)
    }
}

/// Everything a run needs; every rank gets the same.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// `-f`: multiply the size by this; `None` adds `step_bytes` instead.
    pub step_factor: Option<u64>,
    pub step_bytes: u64,
    pub iters: usize,
    pub warmup: usize,
    /// `-c`: correctness-check iterations per size and placement (0: `N/A`).
    pub check: usize,
    pub op: ReduceOp,
    pub dtype: DataType,
    /// Every op and type to run (`-o all`, `-d all`, or lists such as `-d half,float`; the
    /// CUDA backend only); `op` and `dtype` are the first of each.
    pub ops: Vec<ReduceOp>,
    pub dtypes: Vec<DataType>,
    pub json: Option<PathBuf>,
    /// `-a`: which rank's time each row shows.
    pub time_stat: TimeStat,
    pub ranks: usize,
    pub ranks_as: RanksAs,
    pub backend: Backend,
    /// `--bandwidth` (CUDA backend): first measure the kernels against the device's copy rate.
    pub bandwidth: bool,
    /// `--latency` (CUDA backend): first measure one load's latency (a pointer chase) and the
    /// kernels' rate against their blocks (the bytes in flight they keep).
    pub latency: bool,
    /// `--graph` (CUDA backend): the timed calls are captured once into a CUDA graph per rank
    /// and replayed, and the replayed results are checked too. With `--algo auto` they are
    /// graph launches, whose replays choose their plan on the GPU.
    pub graph: bool,
    /// `--unordered-reads` (CUDA backend): remote reads go as soon as their value is published,
    /// instead of in their source's send order (`RawLaunch::ordered_reads`), to compare.
    pub unordered_reads: bool,
    pub algo: BenchAlgo,
    /// Pieces per chunk of StragglAR's calls (`--pipeline`).
    pub pipeline: Pipeline,
    /// The rank the schedule treats as the straggler.
    pub straggler: usize,
    /// The ranks that actually arrive late, in turn (`--late-rank R[,R...]`, default: the
    /// straggler); a different one than `straggler` tests a wrong guess, which must cost time,
    /// never correctness.
    pub late_ranks: Vec<usize>,
    /// With several late ranks, each is late for this many calls before the next takes over.
    pub late_every: u64,
    /// The late rank arrives this late on every call, in microseconds.
    pub delay_us: u64,
    /// Every rank also waits a pseudo-random time in `[0, jitter_us)` before each call (seeded
    /// by rank and call): random arrival orders, on which every rank must still choose alike.
    pub jitter_us: u64,
    /// Emulated link rate, 10^9 bytes per second per direction.
    pub link_gbs: Option<f64>,
    /// Emulated latency per transfer, microseconds.
    pub link_latency_us: f64,
    /// The baseline's (Ring's) own emulated link rate, 10^9 bytes per second, standing in for
    /// an NCCL faster than the model knows (NVLS): the policy's model is not told.
    pub baseline_link_gbs: Option<f64>,
    /// Arena bytes per rank and parity; larger messages run in segments.
    pub buffer_bytes: usize,
    /// Per-call deadline in milliseconds.
    pub timeout_ms: Option<u64>,
    /// A fault rank `fault_rank` injects into its own run (`--fault kill@copies:2`).
    pub fault: Option<Fault>,
    /// The rank that misbehaves.
    pub fault_rank: usize,
    /// `--svg FILE`: the run's times per size drawn into FILE.
    pub svg: Option<PathBuf>,
}

/// The model's latency and copy rate for the host engine when links are not emulated: its own
/// rough costs on a small machine.
const HOST_ALPHA: f64 = 10e-6;
const HOST_BANDWIDTH: f64 = 2e9;

/// Options of `stragglar bench`, as shown by `stragglar help`.
pub const USAGE: &str = "
stragglar bench [-b SIZE] [-e SIZE] [-i SIZE | -f F] [-n ITERS] [-w WARMUP] [-c CHECK]
                [-d TYPE,...|all] [-o OP,...|all] [-a 0|1|2|3] [-J FILE] [--svg FILE]
                [--backend host|cuda] [--ranks N] [--ranks-as processes|threads]
                [--algo stragglar|ring|auto|multicast] [--pipeline K|auto] [--straggler R] [--late-rank R,...]
                [--late-every K] [--delay-us D] [--jitter-us J] [--link-gbs G]
                [--link-latency-us A] [--baseline-link-gbs G] [--buffer-bytes B] [--timeout-ms T]
                [--fault ACTION@PHASE[:CALL]] [--fault-rank R]
                [--bandwidth] [--latency] [--graph] [--unordered-reads]
    nccl-tests' all_reduce_perf on the host engine (default: 8 processes over shared memory)
    or on the GPU engine (--backend cuda: every rank on GPU 0), every element checked; the
    late rank arrives D us late on every call; --link-gbs emulates links on the host
    (--baseline-link-gbs: Ring's own, hidden from the policy's model);
    --svg draws the measured times per size (and the model's, with --link-gbs);
    --pipeline cuts StragglAR's chunks into K pieces (auto: the model's best per size);
    --algo multicast runs multicast StragglAR (host engine: a multicast send's readers share
    the sender's emulated port);
    -a: each row's time is rank 0's (0), the average over ranks (1, default), the fastest
    rank's (2) or the slowest's (3); -J writes the rows as JSON; --bandwidth (the kernels
    against cuMemcpyDtoD), --latency (a pointer chase and the kernels' rate against their
    blocks), --graph and --unordered-reads need cuda
";

impl BenchOptions {
    /// Parses the arguments of `stragglar bench`.
    pub fn parse(mut args: Args) -> Result<BenchOptions, UsageError> {
        let bytes = |args: &mut Args, names: &[&str], default: u64| -> Result<u64, UsageError> {
            args.value(names)?.map_or(Ok(default), |v| parse_bytes(&v))
        };
        let min_bytes = bytes(&mut args, &["-b", "--minbytes"], 32 << 20)?;
        let max_bytes = bytes(&mut args, &["-e", "--maxbytes"], 32 << 20)?;
        let step_bytes = bytes(&mut args, &["-i", "--stepbytes"], 1 << 20)?;
        let step_factor = args.parsed::<u64>(&["-f", "--stepfactor"], "an integer factor >= 2")?;
        let iters = args.parsed(&["-n", "--iters"], "a count")?.unwrap_or(20);
        let warmup = args
            .parsed(&["-w", "--warmup_iters"], "a count")?
            .unwrap_or(1);
        let check = args.parsed(&["-c", "--check"], "a count")?.unwrap_or(1);
        let ops = match args.value(&["-o", "--op"])?.as_deref() {
            None => vec![ReduceOp::Sum],
            Some("all") => ReduceOp::ALL.to_vec(),
            Some(list) => {
                list.split(',')
                    .map(|name| {
                        ReduceOp::parse(if name == "mulsum" { "premulsum" } else { name })
                            .ok_or_else(|| {
                                UsageError(format!(
                                "-o: unknown op '{name}' (sum, prod, max, min, avg, premulsum, all)"
                            ))
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        let dtypes = match args.value(&["-d", "--datatype"])?.as_deref() {
            None => vec![DataType::F32],
            Some("all") => DataType::ALL.to_vec(),
            Some(list) => list
                .split(',')
                .map(|name| {
                    DataType::parse(name).ok_or_else(|| {
                        UsageError(format!("-d: '{name}' is not supported here (int8 uint8 int32 uint32 int64 uint64 half float double bfloat16, all)"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        let (op, dtype) = (ops[0], dtypes[0]);
        let json = args.value(&["-J", "--output_file"])?.map(PathBuf::from);
        let svg = args.value(&["--svg"])?.map(PathBuf::from);
        let time_stat = match args.parsed::<u8>(&["-a", "--average"], "0, 1, 2 or 3")? {
            None => TimeStat::Average,
            Some(code) => TimeStat::from_code(code).ok_or_else(|| {
                UsageError(format!(
                    "-a {code}: expected 0 (rank 0), 1 (average), 2 (min) or 3 (max)"
                ))
            })?,
        };
        let backend = match args.value(&["--backend"])?.as_deref() {
            None | Some("host") => Backend::Host,
            Some("cuda") => Backend::Cuda,
            Some(other) => {
                return Err(UsageError(format!(
                    "--backend: expected host or cuda, got '{other}'"
                )))
            }
        };
        let bandwidth = args.flag(&["--bandwidth"]);
        let latency = args.flag(&["--latency"]);
        let graph = args.flag(&["--graph"]);
        let unordered_reads = args.flag(&["--unordered-reads"]);
        let ranks: usize = args.parsed(&["--ranks"], "a rank count")?.unwrap_or(8);
        let ranks_as = match args.value(&["--ranks-as"])?.as_deref() {
            None if backend == Backend::Cuda => RanksAs::Threads,
            None | Some("processes") => RanksAs::Processes,
            Some("threads") => RanksAs::Threads,
            Some(other) => {
                return Err(UsageError(format!(
                    "--ranks-as: expected processes or threads, got '{other}'"
                )))
            }
        };
        let algo = match args.value(&["--algo"])?.as_deref() {
            None | Some("stragglar") => BenchAlgo::Stragglar,
            Some("ring") => BenchAlgo::Ring,
            Some("nccl") => {
                return Err(UsageError(
                    "--algo nccl is not a bench algorithm (the bench runs our engines, not NCCL); use ring for the baseline"
                        .into(),
                ))
            }
            Some("auto") => BenchAlgo::Auto,
            Some("multicast") => BenchAlgo::Multicast,
            Some(other) => {
                return Err(UsageError(format!(
                    "--algo: expected stragglar, ring, auto or multicast, got '{other}'"
                )))
            }
        };
        let pipeline = match args.value(&["--pipeline", "-k"])?.as_deref() {
            None => Pipeline::Pieces(1),
            Some(text) => Pipeline::parse(text).ok_or_else(|| {
                UsageError(format!(
                    "--pipeline: expected a number of pieces per chunk (1 to {MAX_PIECES}) or auto, got '{text}'"
                ))
            })?,
        };
        let straggler = args
            .parsed(&["--straggler"], "a rank")?
            .unwrap_or(ranks.saturating_sub(1));
        let late_ranks = match args.value(&["--late-rank"])? {
            None => vec![straggler],
            Some(list) => list
                .split(',')
                .map(|r| r.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| {
                    UsageError(format!(
                        "--late-rank: expected ranks such as 3 or 2,5, got '{list}'"
                    ))
                })?,
        };
        let late_every = args
            .parsed(&["--late-every"], "a number of calls")?
            .unwrap_or(u64::MAX);
        let delay_us = args.parsed(&["--delay-us"], "microseconds")?.unwrap_or(0);
        let jitter_us = args.parsed(&["--jitter-us"], "microseconds")?.unwrap_or(0);
        let link_gbs = args.parsed::<f64>(&["--link-gbs"], "GB/s (10^9 bytes per second)")?;
        let link_latency_us = args
            .parsed(&["--link-latency-us"], "microseconds")?
            .unwrap_or(0.0);
        let baseline_link_gbs =
            args.parsed::<f64>(&["--baseline-link-gbs"], "GB/s (10^9 bytes per second)")?;
        let buffer_bytes = match args.value(&["--buffer-bytes"])? {
            Some(v) => parse_bytes(&v)? as usize,
            None => crate::config::get().buffer_bytes,
        };
        let timeout_ms = args
            .parsed(&["--timeout-ms"], "milliseconds")?
            .or(crate::config::get().timeout_ms);
        let fault = match args.value(&["--fault"])? {
            None => None,
            Some(spec) => Some(
                spec.parse::<Fault>()
                    .map_err(|e| UsageError(format!("--fault: {e}")))?,
            ),
        };
        let fault_rank = args.parsed(&["--fault-rank"], "a rank")?.unwrap_or(0);
        args.finish()?;
        let options = BenchOptions {
            min_bytes,
            max_bytes,
            step_factor,
            step_bytes,
            iters,
            warmup,
            check,
            op,
            dtype,
            ops,
            dtypes,
            json,
            time_stat,
            ranks,
            ranks_as,
            backend,
            bandwidth,
            latency,
            graph,
            unordered_reads,
            algo,
            pipeline,
            straggler,
            late_ranks,
            late_every,
            delay_us,
            jitter_us,
            link_gbs,
            link_latency_us,
            baseline_link_gbs,
            buffer_bytes,
            timeout_ms,
            fault,
            fault_rank,
            svg,
        };
        options.validate()?;
        Ok(options)
    }

    fn validate(&self) -> Result<(), UsageError> {
        let fail = |m: String| Err(UsageError(m));
        if self.backend == Backend::Cuda {
            if self.jitter_us > 0
                || self.fault.is_some()
                || self.link_gbs.is_some()
                || self.baseline_link_gbs.is_some()
            {
                return fail("--backend cuda takes no --jitter-us, --fault, --link-gbs or --baseline-link-gbs (host-engine emulations; --delay-us delays the late rank on the GPU)".into());
            }
            if self.algo == BenchAlgo::Multicast {
                return fail("--algo multicast runs on the host engine only: the bench's GPU ranks share GPU 0, and a multicast team needs a GPU per rank (a job's communicators run it with STRAGGLAR_MULTICAST=1)".into());
            }
        } else if self.bandwidth || self.latency || self.graph || self.unordered_reads {
            return fail(
                "--bandwidth, --latency, --graph and --unordered-reads are about GPU kernels: use them with --backend cuda"
                    .into(),
            );
        } else if self.ops.len() > 1 || self.dtypes.len() > 1 {
            return fail("several types or ops (-d all, -o all, lists) need --backend cuda; the host engine runs one of each".into());
        }
        if self.algo == BenchAlgo::Multicast && self.pipeline != Pipeline::Pieces(1) {
            return fail("--pipeline applies to stragglar and auto, not multicast".into());
        }
        if let Pipeline::Pieces(k) = self.pipeline {
            let most = Pipeline::most_pieces(self.ranks.max(2));
            if k > most {
                return fail(format!(
                    "--pipeline {k}: at most {most} pieces per chunk at {} ranks",
                    self.ranks
                ));
            }
        }
        if !(2..=64).contains(&self.ranks) {
            return fail(format!(
                "--ranks {}: the host engine runs 2 to 64 ranks",
                self.ranks
            ));
        }
        if self.straggler >= self.ranks
            || self.fault_rank >= self.ranks
            || self.late_ranks.is_empty()
            || self.late_ranks.iter().any(|&r| r >= self.ranks)
        {
            return fail(format!(
                "--straggler, --late-rank and --fault-rank must be ranks of {}",
                self.ranks
            ));
        }
        if self.min_bytes > self.max_bytes {
            return fail("-b must not exceed -e".into());
        }
        if self.step_factor.is_some_and(|f| f < 2)
            || (self.step_factor.is_none() && self.step_bytes == 0)
        {
            return fail("-f must be >= 2 and -i > 0".into());
        }
        if self.iters == 0 {
            return fail("-n must be at least 1".into());
        }
        if self.link_gbs.is_some_and(|g| !(g > 0.0 && g.is_finite()))
            || self.link_latency_us.is_nan()
            || self.link_latency_us < 0.0
        {
            return fail("--link-gbs must be positive and --link-latency-us not negative".into());
        }
        match (self.baseline_link_gbs, self.link_gbs) {
            (Some(g), _) if !(g > 0.0 && g.is_finite()) => {
                return fail("--baseline-link-gbs must be positive".into())
            }
            (Some(_), None) => {
                return fail("--baseline-link-gbs needs --link-gbs (StragglAR's links)".into())
            }
            _ => {}
        }
        if self.buffer_bytes < 4096 {
            return fail("--buffer-bytes must be at least 4K".into());
        }
        Ok(())
    }

    /// The rank that is late on call `call` (counted from 1 on every rank).
    pub fn late_rank(&self, call: u64) -> usize {
        let turn = (call.saturating_sub(1) / self.late_every.max(1)) as usize;
        self.late_ranks[turn % self.late_ranks.len()]
    }

    /// The emulated links of a call that runs StragglAR (`baseline` false) or the baseline.
    pub fn emulated_link(&self, baseline: bool) -> LinkModel {
        let gbs = match baseline {
            true => self.baseline_link_gbs.or(self.link_gbs),
            false => self.link_gbs,
        };
        LinkModel {
            bytes_per_second: gbs.map(|g| g * 1e9),
            latency: Duration::from_nanos((self.link_latency_us * 1000.0) as u64),
        }
    }

    /// The link the policy's and the pipeline's model assume: StragglAR's emulated link, else
    /// the host engine's rough costs (never the baseline's: see `baseline_link_gbs`).
    pub fn model_link(&self) -> Link {
        Link {
            alpha: (self.link_latency_us * 1e-6).max(HOST_ALPHA),
            bandwidth: self.link_gbs.map_or(HOST_BANDWIDTH, |g| g * 1e9),
        }
    }

    /// The late ranks in words, for titles: `rank 3`, or `ranks in turn`.
    pub fn late_in_words(&self) -> String {
        match self.late_ranks.as_slice() {
            [rank] => format!("rank {rank}"),
            _ => "ranks in turn".to_string(),
        }
    }

    /// The message sizes of the sweep, in bytes (whole elements).
    pub fn sizes(&self) -> Vec<u64> {
        let elem = self.dtype.size() as u64;
        let mut sizes = Vec::new();
        let mut size = self.min_bytes;
        while size <= self.max_bytes {
            sizes.push(size / elem * elem);
            size = match self.step_factor {
                Some(f) => size.max(1) * f,
                None => size + self.step_bytes,
            };
        }
        sizes
    }

    /// The arguments that reproduce these options, for worker processes.
    pub fn to_args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "-b".into(),
            self.min_bytes.to_string(),
            "-e".into(),
            self.max_bytes.to_string(),
            "-i".into(),
            self.step_bytes.to_string(),
            "-n".into(),
            self.iters.to_string(),
            "-w".into(),
            self.warmup.to_string(),
            "-c".into(),
            self.check.to_string(),
            "-a".into(),
            self.time_stat.code().to_string(),
            "-o".into(),
            self.ops
                .iter()
                .map(|o| o.name())
                .collect::<Vec<_>>()
                .join(","),
            "-d".into(),
            self.dtypes
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(","),
            "--backend".into(),
            match self.backend {
                Backend::Host => "host",
                Backend::Cuda => "cuda",
            }
            .into(),
            "--ranks".into(),
            self.ranks.to_string(),
            "--ranks-as".into(),
            "processes".into(),
            "--pipeline".into(),
            self.pipeline.to_string(),
            "--algo".into(),
            self.algo.name().into(),
            "--straggler".into(),
            self.straggler.to_string(),
            "--late-rank".into(),
            self.late_ranks
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(","),
            "--late-every".into(),
            self.late_every.to_string(),
            "--delay-us".into(),
            self.delay_us.to_string(),
            "--jitter-us".into(),
            self.jitter_us.to_string(),
            "--link-latency-us".into(),
            self.link_latency_us.to_string(),
            "--buffer-bytes".into(),
            self.buffer_bytes.to_string(),
        ];
        if let Some(f) = self.step_factor {
            a.extend(["-f".into(), f.to_string()]);
        }
        if self.graph {
            a.push("--graph".into());
        }
        if self.unordered_reads {
            a.push("--unordered-reads".into());
        }
        if let Some(g) = self.link_gbs {
            a.extend(["--link-gbs".into(), g.to_string()]);
        }
        if let Some(g) = self.baseline_link_gbs {
            a.extend(["--baseline-link-gbs".into(), g.to_string()]);
        }
        if let Some(fault) = self.fault {
            a.extend([
                "--fault".into(),
                fault.to_string(),
                "--fault-rank".into(),
                self.fault_rank.to_string(),
            ]);
        }
        if let Some(t) = self.timeout_ms {
            a.extend(["--timeout-ms".into(), t.to_string()]);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<BenchOptions, UsageError> {
        BenchOptions::parse(Args::new(words.iter().map(|w| w.to_string())))
    }

    /// A worker process gets the parent's options through `to_args` (workers are processes):
    /// every one must survive.
    #[test]
    fn options_survive_the_worker_command_line() {
        let options = parse(&[
            "--backend",
            "cuda",
            "--ranks",
            "5",
            "--ranks-as",
            "processes",
            "--graph",
            "--unordered-reads",
            "--algo",
            "auto",
            "-d",
            "float,int8",
            "-b",
            "997",
            "-e",
            "200000",
            "-i",
            "49999",
            "--timeout-ms",
            "2000",
            "-a",
            "3",
        ])
        .unwrap();
        assert!(options.graph && options.unordered_reads);
        assert_eq!(options.time_stat, TimeStat::Max);
        let words = options.to_args();
        let again = BenchOptions::parse(Args::new(words)).unwrap();
        assert_eq!(again, options);
    }

    #[test]
    fn the_time_statistic_is_one_of_four() {
        assert_eq!(parse(&[]).unwrap().time_stat, TimeStat::Average);
        assert_eq!(parse(&["-a", "0"]).unwrap().time_stat, TimeStat::Rank0);
        assert_eq!(parse(&["--average", "2"]).unwrap().time_stat, TimeStat::Min);
        for bad in ["4", "x", "-1"] {
            let refused = parse(&["-a", bad]).unwrap_err();
            assert!(refused.0.contains("-a"), "{bad}: {}", refused.0);
        }
    }

    #[test]
    fn unordered_reads_are_a_gpu_option() {
        let refused = parse(&["--backend", "host", "--unordered-reads"]).unwrap_err();
        assert!(refused.0.contains("--unordered-reads"), "{}", refused.0);
    }
}
