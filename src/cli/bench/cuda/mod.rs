//! `stragglar bench --backend cuda`: the library's GPU engine (`CudaComm`, the engine behind
//! `ncclAllReduce`) on one GPU, with every rank a thread of this process on its own stream
//! (peers' staging addressed as plain device pointers) or a worker process (peers' staging
//! opened through CUDA IPC, by the library's setup protocol). Only the bootstrap differs from
//! a job's (no NCCL communicator: ranks share one GPU, where NCCL cannot run), and the
//! baseline the policy falls back to is Ring on our kernel instead of NCCL's AllReduce. Every
//! element of every rank is checked, and ranks must agree bit for bit. `--bandwidth` first
//! measures the kernels' element-wise code against the device's own device-to-device copy rate.

mod bandwidth;
mod conversions;
pub mod ipc;
mod latency;
mod local;
mod timing;

use std::io::{BufRead, BufReader};
use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use super::options::{BenchAlgo, BenchOptions, RanksAs};
use super::report::{combine, RankSize, Report, Row};
use crate::detect::policy::{AlgoMode, Policy, StragglerMode};
use crate::detect::MulticastMode;
use crate::engine::cuda::assemble::{assemble, Assembly};
use crate::engine::cuda::comm::{Baseline, CudaComm};
use crate::engine::cuda::driver::{Device, GpuError, Kernel, Kernels, Stream};
use crate::engine::cuda::exchange::ThreadExchange;
use crate::engine::cuda::gpus;
use crate::engine::cuda::grid::{shared_gpu_blocks, THREADS};
use crate::engine::cuda::peers::{SameProcessAccess, SharedStaging};
use crate::engine::cuda::rank::status_text;
use crate::engine::cuda::setup::{Devices, SetupError};
use crate::engine::cuda::sizing::NVSWITCH_LINK;
use crate::engine::cuda::sizing::{layout, Sizing};
use crate::engine::cuda::staging::StagingLayout;
use crate::gpu::kernels::{APPLY_PROBE_KERNEL, CHASE_KERNEL, DELAY_KERNEL};
use crate::plan::PlanCache;
use crate::reduce::{DataType, ReduceOp};
use crate::schedule::Algorithm;
use local::{run_size, Choices, Local};

/// The GPU the ranks share, our kernels on it, and the bench's own kernels beside them.
pub struct GpuKernels {
    pub device: Arc<Device>,
    /// The AllReduce and ticket kernels.
    pub kernels: Arc<Kernels>,
    /// The late rank's device-side delay (`--delay-us`).
    pub delay: Kernel,
    pub probe: Kernel,
    /// `--latency`'s pointer chase.
    pub chase: Kernel,
    pub arch: String,
}

/// Opens GPU 0 and loads the kernels (compiled with NVRTC, or from the cache) as the library
/// does; the reason as text when anything is missing.
pub fn open_gpu() -> Result<GpuKernels, String> {
    let device = gpus::device(0, |_| {})?;
    let loaded = gpus::kernels(0, &device, |_| {})?;
    let gpu = |e: GpuError| e.to_string();
    let probe = Kernel::load(&device, &loaded.cubin, APPLY_PROBE_KERNEL).map_err(gpu)?;
    let delay = Kernel::load(&device, &loaded.cubin, DELAY_KERNEL).map_err(gpu)?;
    let chase = Kernel::load(&device, &loaded.cubin, CHASE_KERNEL).map_err(gpu)?;
    Ok(GpuKernels {
        kernels: loaded.kernels.clone(),
        arch: loaded.arch.clone(),
        device,
        delay,
        probe,
        chase,
    })
}

/// The hardware queues a device gives a process at most (`CUDA_DEVICE_MAX_CONNECTIONS`).
const MAX_CONNECTIONS: u32 = 32;

/// The most ranks that can run as threads of one process: each rank's stream needs a hardware
/// queue of its own, or a rank's queued calls could wait behind a peer's that wait for it, and
/// one queue stays with the device's side stream (the signals and reads that must never wait
/// behind a rank's kernel).
pub const MAX_THREAD_RANKS: usize = MAX_CONNECTIONS as usize - 1;

/// What every rank of a run derives alike from the options: the grid, the staging layout,
/// the sizes, the (type, op) pairs, the policy and the plans lowered while sizing.
pub struct Setup {
    pub blocks: u32,
    pub layout: StagingLayout,
    pub sizes: Vec<u64>,
    pub combos: Vec<(DataType, ReduceOp)>,
    pub ranks: usize,
    /// `--algo auto`: each call's plan comes from the policy, as in a job.
    pub auto: bool,
    policy: Policy,
    plans: PlanCache,
}

impl Setup {
    /// Sizes the staging for every size of every type of the run, as the library sizes a
    /// communicator's for its buffer.
    pub fn new(options: &BenchOptions, sms: u32) -> Result<Setup, String> {
        let blocks = shared_gpu_blocks(sms, options.ranks)?;
        if options.ranks_as == RanksAs::Threads && options.ranks > MAX_THREAD_RANKS {
            return Err(format!(
                "at most {MAX_THREAD_RANKS} ranks run as threads of one process (one hardware queue each, one more for the side stream); use --ranks-as processes"
            ));
        }
        let algorithm = match options.algo {
            BenchAlgo::Ring => Algorithm::Ring,
            _ => Algorithm::Stragglar,
        };
        let auto = options.algo == BenchAlgo::Auto;
        let policy = bench_policy(options, auto, algorithm);
        let sizes = options.sizes();
        let mut plans = PlanCache::default();
        let sizing = Sizing {
            max_bytes: sizes.iter().copied().max().unwrap_or(0) as usize,
            dtypes: &options.dtypes,
            // The baseline is our Ring (where NCCL cannot run) when the policy may pick it.
            ring_runs_eagerly: auto || algorithm == Algorithm::Ring,
            // The bench's engine forms no multicast region.
            multicast: false,
        };
        let layout = layout(&mut plans, &policy, blocks, sizing)?;
        if layout.arena_bytes > options.buffer_bytes as u64 {
            return Err(format!(
                "the largest size needs {} B of staging per rank and parity; --buffer-bytes allows {} (lower -e)",
                layout.arena_bytes, options.buffer_bytes
            ));
        }
        Ok(Setup {
            blocks,
            layout,
            sizes,
            combos: options
                .dtypes
                .iter()
                .flat_map(|&d| options.ops.iter().map(move |&o| (d, o)))
                .collect(),
            ranks: options.ranks,
            auto,
            policy,
            plans,
        })
    }

    /// What rank `rank`'s engine is assembled from: the library's assembly, with ranks that may
    /// share the GPU and our Ring as the baseline.
    pub fn assembly<'a>(
        &self,
        options: &BenchOptions,
        gpu: &'a GpuKernels,
        rank: usize,
    ) -> Assembly<'a> {
        Assembly {
            device: &gpu.device,
            kernels: Ok(&gpu.kernels),
            rank,
            ranks: self.ranks,
            layout: self.layout,
            plans: self.plans.clone(),
            policy: self.policy.clone(),
            max_bytes: self.sizes.iter().copied().max().unwrap_or(0) as usize,
            // The bench sizes its staging for its largest message up front.
            staged_bytes: self.sizes.iter().copied().max().unwrap_or(0) as usize,
            timeout: options.timeout_ms.map(std::time::Duration::from_millis),
            ordered_reads: !options.unordered_reads,
            devices: Devices::MayShare,
            baseline: Baseline::Ring,
            label: format!("bench rank {rank}"),
            designated: Arc::new(AtomicI64::new(-1)),
            multicast: MulticastMode::Off,
        }
    }
}

/// The policy every rank's engine follows: `--algo auto` is the library's (from
/// `STRAGGLAR_ALGO` and `STRAGGLAR_STRAGGLER`); `stragglar` runs StragglAR with `--straggler`
/// on every call, `ring` the baseline (Ring on our kernel). StragglAR's calls are pipelined as
/// `--pipeline` says, priced on the policy's link.
fn bench_policy(options: &BenchOptions, auto: bool, algorithm: Algorithm) -> Policy {
    let (algo, straggler) = match (auto, algorithm) {
        (true, _) => {
            let config = crate::config::get();
            (config.algo, config.straggler)
        }
        (false, Algorithm::Ring) => (AlgoMode::Baseline, StragglerMode::Auto),
        (false, _) => (AlgoMode::Stragglar, StragglerMode::Fixed(options.straggler)),
    };
    Policy::new(options.ranks, algo, straggler, NVSWITCH_LINK).with_pipeline(options.pipeline)
}

/// The setup's failure in words.
pub fn setup_failure(error: SetupError) -> String {
    match error {
        SetupError::Refused(verdict) => format!("setup refused: {}", verdict.describe()),
        SetupError::Exchange(why) => format!("setup failed: {why}"),
    }
}

/// The host time to queue one eager call, over the sizes of a run: each size's slowest rank.
#[derive(Default)]
struct HostCost {
    sum_us: f64,
    sizes: usize,
    worst_us: f64,
}

impl HostCost {
    fn add(&mut self, per_rank: &[RankSize]) {
        let host_us = per_rank
            .iter()
            .filter_map(|r| r.host_us)
            .fold(0.0, f64::max);
        if host_us > 0.0 {
            self.sum_us += host_us;
            self.sizes += 1;
            self.worst_us = self.worst_us.max(host_us);
        }
    }

    /// One comment line under the table (nothing when no eager call was timed).
    fn print(&self) {
        if self.sizes > 0 {
            println!(
                "# host time to queue one eager call (choice and launch, waits for records left out): mean {:.2} us, worst size {:.2} us",
                self.sum_us / self.sizes as f64,
                self.worst_us
            );
        }
    }
}

/// The rows of a run as every rank reports its sizes: the report, and the host cost.
struct Rows<'a> {
    options: &'a BenchOptions,
    report: Report<'a>,
    host: HostCost,
}

impl Rows<'_> {
    /// Adds the size every rank ran, `per_rank` in rank order.
    fn add(&mut self, per_rank: &[RankSize]) {
        self.host.add(per_rank);
        self.report.add(combine(
            self.options.ranks,
            self.options.time_stat,
            per_rank,
        ));
    }

    /// Wrong elements and disagreements so far.
    fn bad(&self) -> u64 {
        self.report.rows().iter().map(Row::bad).sum()
    }
}

/// Runs `stragglar bench --backend cuda`; exit status 1 on any wrong element or failure.
pub fn run(options: &BenchOptions) -> i32 {
    // Ranks as threads: every rank's stream needs its own hardware queue: with the driver's
    // default of 8, two ranks' streams could share one, and a captured graph of one rank would
    // queue its later calls ahead of a peer's first. Set before the driver initialises. A
    // smaller preset value (some container images export 1) is raised, with a note. Ranks as
    // processes are processes of their own, as a job's ranks are, each reading the variable
    // for itself: a preset value is kept (1, as Megatron-style jobs set, runs the engine on one
    // hardware queue per rank).
    const CONNECTIONS: u32 = MAX_CONNECTIONS;
    let preset = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok();
    if options.ranks_as == RanksAs::Threads
        && preset
            .as_deref()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .is_none_or(|v| v < CONNECTIONS)
    {
        if let Some(v) = preset {
            eprintln!("# CUDA_DEVICE_MAX_CONNECTIONS={v} raised to {CONNECTIONS}: every rank's stream needs its own hardware queue");
        }
        std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", CONNECTIONS.to_string());
    }
    let gpu = match open_gpu() {
        Ok(g) => g,
        Err(why) => {
            eprintln!("stragglar bench --backend cuda: {why}");
            return 1;
        }
    };
    let result = preamble(options, &gpu).and_then(|(setup, machine)| {
        let mut rows = Rows {
            options,
            report: Report::start(options, super::fresh_comm_id(), &machine),
            host: HostCost::default(),
        };
        match options.ranks_as {
            RanksAs::Threads => run_threads(options, &gpu, &setup, &mut rows),
            RanksAs::Processes => run_processes(options, &mut rows),
        }?;
        rows.host.print();
        let bad = rows.bad();
        rows.report.finish()?;
        Ok(bad)
    });
    match result {
        Ok(0) => 0,
        Ok(bad) => {
            eprintln!("stragglar bench: {bad} wrong element(s) or disagreement(s)");
            1
        }
        Err(e) => {
            eprintln!("stragglar bench --backend cuda: {e}");
            1
        }
    }
}

/// The run's setup, and the machine it runs on in words for the header; the kernels' rates
/// first with `--bandwidth`, the latencies and rates against the grid with `--latency`.
fn preamble(options: &BenchOptions, gpu: &GpuKernels) -> Result<(Setup, String), String> {
    let err = |e: GpuError| e.to_string();
    let sms = gpu.device.sm_count().map_err(err)? as u32;
    let setup = Setup::new(options, sms)?;
    let machine = format!(
        "on one {} ({}, {sms} SMs), {} x {THREADS} threads per rank",
        gpu.device.name().map_err(err)?,
        gpu.arch,
        setup.blocks,
    );
    if options.bandwidth {
        bandwidth::table(options, gpu, sms)?;
    }
    if options.latency {
        latency::table(options, gpu, sms)?;
    }
    Ok((setup, machine))
}

/// Every rank's engine, each assembled on a thread of its own (the setup's all-gathers are a
/// barrier among them), peers' staging addressed as plain device pointers.
fn assemble_threads(
    options: &BenchOptions,
    gpu: &GpuKernels,
    setup: &Setup,
) -> Result<Vec<CudaComm>, String> {
    let staging: SharedStaging = Arc::new(parking_lot::Mutex::new(vec![None; options.ranks]));
    let assembled: Vec<Result<CudaComm, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ThreadExchange::group(options.ranks)
            .into_iter()
            .enumerate()
            .map(|(rank, mut exchange)| {
                let staging = staging.clone();
                scope.spawn(move || {
                    let mut access = SameProcessAccess {
                        device: &gpu.device,
                        layout: setup.layout,
                        rank,
                        staging,
                    };
                    let assembly = setup.assembly(options, gpu, rank);
                    assemble(assembly, &mut exchange, &mut access, |_| {}).map_err(setup_failure)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a rank's setup panicked".into()))
            })
            .collect()
    });
    assembled.into_iter().collect()
}

fn run_threads(
    options: &BenchOptions,
    gpu: &GpuKernels,
    setup: &Setup,
    rows: &mut Rows,
) -> Result<(), String> {
    let err = |e: GpuError| e.to_string();
    let comms = assemble_threads(options, gpu, setup)?;
    let mut locals = Vec::with_capacity(options.ranks);
    for (rank, comm) in comms.into_iter().enumerate() {
        locals.push(Local {
            rank,
            comm,
            stream: Stream::new(&gpu.device).map_err(err)?,
            calls: 0,
            choices: Choices::default(),
        });
    }
    let mut seed = 0;
    for (dtype, op) in setup.combos.clone() {
        for bytes in setup.sizes.clone() {
            seed += 1;
            let count = bytes as usize / dtype.size();
            let outcomes = match run_size(
                options,
                gpu,
                &mut locals,
                count,
                dtype,
                op,
                setup.auto,
                seed,
            ) {
                Ok(o) => o,
                Err(e) => {
                    // Release every kernel still waiting before the buffers are freed.
                    for l in &locals {
                        l.comm.control().abort();
                    }
                    return Err(e.to_string());
                }
            };
            let bytes = (count * dtype.size()) as u64;
            let per_rank: Vec<RankSize> = outcomes
                .iter()
                .map(|o| o.for_report(bytes, dtype, op))
                .collect();
            rows.add(&per_rank);
        }
    }
    for l in &locals {
        let status = l.comm.control().status();
        if status != 0 {
            return Err(format!(
                "rank {}: a kernel gave up: {}",
                l.rank,
                status_text(status)
            ));
        }
    }
    Ok(())
}

fn run_processes(options: &BenchOptions, rows: &mut Rows) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!(
        "stragglar-cuda-{}-{}",
        std::process::id(),
        super::fresh_comm_id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = collect(options, &dir, rows);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Runs the workers and adds a row once every rank reported a size.
fn collect(options: &BenchOptions, dir: &std::path::Path, rows: &mut Rows) -> Result<(), String> {
    let mut children =
        ipc::spawn(options, dir).map_err(|e| format!("cannot start workers: {e}"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    for (rank, child) in children.iter_mut().enumerate() {
        let stdout = child.stdout.take().expect("piped stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(size) = RankSize::from_worker_line(&line) {
                    let _ = tx.send((rank, size));
                }
            }
        });
    }
    drop(tx);
    // Each (type, op, size) until every rank reported it, then in rank order: rank 0's is the
    // one the others are compared with.
    type Key = (DataType, ReduceOp, u64);
    let mut pending: Vec<(Key, Vec<(usize, RankSize)>)> = Vec::new();
    let mut unreadable = Vec::new();
    for (rank, size) in rx {
        let size = match size {
            Ok(size) => size,
            Err(why) => {
                unreadable.push(format!("rank {rank}: {why}"));
                continue;
            }
        };
        let key = (size.dtype, size.op, size.bytes);
        let at = match pending.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                pending.push((key, Vec::new()));
                pending.len() - 1
            }
        };
        pending[at].1.push((rank, size));
        if pending[at].1.len() == options.ranks {
            let (_, mut ranked) = pending.remove(at);
            ranked.sort_by_key(|&(rank, _)| rank);
            let per_rank: Vec<RankSize> = ranked.into_iter().map(|(_, s)| s).collect();
            rows.add(&per_rank);
        }
    }
    let mut failed = Vec::new();
    for (rank, mut child) in children.into_iter().enumerate() {
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => failed.push(format!("rank {rank} ended with {status}")),
            Err(e) => failed.push(format!("rank {rank}: {e}")),
        }
    }
    failed.extend(unreadable);
    if !failed.is_empty() || !pending.is_empty() {
        return Err(format!(
            "{}; {} size(s) incomplete",
            failed.join(", "),
            pending.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::probe::{probe, Driver};

    #[test]
    fn without_a_driver_the_backend_says_why() {
        if let Driver::Devices(n) = probe().driver {
            if n > 0 {
                return;
            }
        }
        let why = open_gpu().err().expect("no GPU here");
        assert!(!why.is_empty());
    }
}
