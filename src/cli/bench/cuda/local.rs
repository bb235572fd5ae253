//! The ranks this process holds (all of them with ranks as threads, one in a worker process):
//! one size of one type and op, checked and timed on each, each call through the library's
//! engine (`CudaComm`), which picks its plan as `ncclAllReduce` does.

use std::error::Error;

use super::GpuKernels;
use crate::cli::bench::data;
use crate::cli::bench::options::BenchOptions;
use crate::cli::bench::report::{RankHalf, RankSize};
use crate::engine::cuda::args::Operands;
use crate::engine::cuda::comm::{CudaComm, Ran};
use crate::engine::cuda::driver::{DeviceMemory, Event, GpuError, Graph, Stream};
use crate::engine::cuda::rank::{CallError, CudaRank, GraphCounts};
use crate::gpu::arrival::RING_ENTRIES;
use crate::reduce::{DataType, ReduceOp, Scale};

/// One rank held here: its engine, its own stream and what it chose.
pub struct Local {
    pub rank: usize,
    pub comm: CudaComm,
    pub stream: Stream,
    /// Eager calls so far (the late rank of each follows `--late-rank`/`--late-every`).
    pub calls: u64,
    pub choices: Choices,
}

/// What one rank's calls ran during the current size: the same on every rank, or the policy
/// is broken.
#[derive(Debug, Clone, Copy, Default)]
pub struct Choices {
    /// Calls made, those on StragglAR, and a digest of every choice.
    pub calls: u64,
    pub stragglar: u64,
    pub digest: u64,
    /// The straggler of the last graph replay (`Some(None)`: it ran the baseline), once
    /// replays ran during the size.
    pub replayed: Option<Option<usize>>,
}

impl Choices {
    /// Counts one eager call that ran on `straggler` (`None`: the baseline).
    fn eager(&mut self, straggler: Option<usize>) {
        let code = straggler.map_or(u64::MAX, |s| s as u64);
        self.calls += 1;
        self.stragglar += u64::from(straggler.is_some());
        self.digest = data::digest_more(self.digest, code);
    }

    /// Counts graph replays whose choices the GPU made (`counts` since the size started): the
    /// same columns as eager calls.
    fn replays(&mut self, counts: GraphCounts) {
        let replays = counts.stragglar + counts.baseline;
        self.calls += replays;
        self.stragglar += counts.stragglar;
        self.digest = data::digest_more(self.digest, counts.stragglar);
        self.digest = data::digest_more(self.digest, replays);
        if replays > 0 {
            self.replayed = Some(counts.last_straggler);
        }
    }
}

/// What one rank measured for one size: out of place, then in place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Microseconds per call, from this rank's own stream.
    pub time_us: [f64; 2],
    /// Elements that differ from the expectation.
    pub wrong: [u64; 2],
    /// A digest of the output, which every rank must share.
    pub digest: [u64; 2],
    /// A digest of the arrival records in the rank's ring after the size ran, which every
    /// rank must share too (`u64::MAX` when one is missing).
    pub records: u64,
    /// Eager calls of the size, those on StragglAR, and a digest of every choice (the same on
    /// every rank); the designated straggler after the size (-1 for none).
    pub calls: u64,
    pub stragglar_calls: u64,
    pub choices: u64,
    pub designated: i64,
    /// Host microseconds to queue one eager timed call on this rank (its choice and launch,
    /// and a held-back rank's delay kernel; waits for arrival records the GPU had not written
    /// yet are left out), averaged over both placements; 0 when the timed calls were graph
    /// replays. Threads as ranks each get an equal share of the loop's time.
    pub host_us: f64,
}

impl Outcome {
    /// What the report combines for `bytes` of `dtype` and `op`: the times, checks and
    /// output digests per placement, and the choices and records every rank must share (the
    /// lateness is not measured per size here).
    pub fn for_report(&self, bytes: u64, dtype: DataType, op: ReduceOp) -> RankSize {
        RankSize {
            bytes,
            dtype,
            op,
            halves: [0, 1].map(|h| RankHalf {
                time_us: self.time_us[h],
                wrong: self.wrong[h],
                digest: self.digest[h],
            }),
            lead_us: None,
            post_us: None,
            calls: self.calls,
            stragglar_calls: self.stragglar_calls,
            agreed: data::digest_more(self.choices, self.records),
            designated: self.designated,
            host_us: (self.host_us > 0.0).then_some(self.host_us),
        }
    }
}

/// A digest of the arrival records and post-arrival times `comm`'s ring holds once its stream
/// is idle: those its launches collected, at most a ring's worth less one.
fn records_digest(comm: &CudaRank) -> u64 {
    let complete = comm.collected();
    let held = complete.min(RING_ENTRIES as u64 - 1);
    (complete - held..complete).fold(0xcbf2_9ce4_8422_2325, |h, c| match comm.record(c) {
        Some(r) => {
            let post = r.post_ns.unwrap_or(u64::MAX);
            let record =
                (r.record.last_rank as u64) ^ (r.record.lead_ns.map_or(2, |ns| ns.min(1)) << 32);
            (h ^ record ^ post.rotate_left(40)).wrapping_mul(0x100_0000_01b3)
        }
        None => u64::MAX,
    })
}

/// The copy-in scaling of `rank` for the check data.
pub fn scale_of(dtype: DataType, op: ReduceOp, ranks: usize, rank: usize) -> Scale {
    let encoded = data::encode(dtype, data::premul_scalar(rank) as f64);
    let mut scalar = [0u8; 8];
    scalar[..encoded.len()].copy_from_slice(&encoded);
    Scale::for_op(op, dtype, ranks, Some(scalar)).expect("a host scalar")
}

/// Runs one call of `operands` on `l`'s engine (captured when its stream captures).
///
/// # Safety
/// The buffers hold `count` elements on this device until the streams are synchronised (and
/// the graphs replayed).
unsafe fn run_call(l: &mut Local, operands: Operands) -> Result<(), Box<dyn Error>> {
    // The bench's communicators have Ring as their baseline: NCCL is never asked for.
    let no_nccl = |_| crate::nccl::types::ResultCode::INVALID_USAGE;
    // SAFETY: as the caller vouches; the stream is the rank's own.
    match unsafe { l.comm.all_reduce(operands, l.stream.raw.cast(), &no_nccl) } {
        Ok(Ok(Ran::Stragglar { straggler })) => l.choices.eager(Some(straggler)),
        Ok(Ok(Ran::Ring)) => l.choices.eager(None),
        Ok(Ok(Ran::Captured)) => {}
        Ok(Ok(Ran::Ticketed { .. } | Ran::CapturedNccl)) => {
            return Err("the engine handed a call to NCCL, which the bench has not".into())
        }
        Ok(Err(e)) => return Err(Box::new(e)),
        Err(decline) => {
            return Err(Box::new(CallError::Unfit(format!(
                "the engine declined the call: {decline:?}"
            ))))
        }
    }
    Ok(())
}

/// Runs one size of `count` elements of `dtype` with `op` on every local rank: one checked call
/// and `iters` timed ones, out of place and in place, each call on the plan its engine's
/// policy picks. Every rank of the communicator must run the same sequence. `auto`: the
/// policy may pick different plans, so graph replays are compared by digest, not with the
/// checked call.
#[allow(clippy::too_many_arguments)]
pub fn run_size(
    options: &BenchOptions,
    gpu: &GpuKernels,
    locals: &mut [Local],
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    auto: bool,
    seed: usize,
) -> Result<Vec<Outcome>, Box<dyn Error>> {
    let n = options.ranks;
    let bytes = count * dtype.size();
    for l in locals.iter_mut() {
        l.choices = Choices::default();
    }
    let inputs: Vec<Vec<u8>> = locals
        .iter()
        .map(|l| data::input(dtype, op, l.rank, count, seed))
        .collect();
    let device_inputs = inputs
        .iter()
        .map(|d| {
            let m = DeviceMemory::zeroed(&gpu.device, bytes)?;
            m.upload(d)?;
            Ok(m)
        })
        .collect::<Result<Vec<_>, GpuError>>()?;
    let outputs = locals
        .iter()
        .map(|_| DeviceMemory::zeroed(&gpu.device, bytes))
        .collect::<Result<Vec<_>, GpuError>>()?;
    let mut outcomes = vec![
        Outcome {
            time_us: [0.0; 2],
            wrong: [0; 2],
            digest: [0; 2],
            records: 0,
            calls: 0,
            stragglar_calls: 0,
            choices: 0,
            designated: -1,
            host_us: 0.0,
        };
        locals.len()
    ];
    for (placement, in_place) in [false, true].into_iter().enumerate() {
        let buffers = |i: usize| {
            if in_place {
                (outputs[i].ptr, outputs[i].ptr)
            } else {
                (device_inputs[i].ptr, outputs[i].ptr)
            }
        };
        // `first` is the index of `locals[0]` among all local ranks (a graph captures one).
        // Eager calls (`captured` None) record their arrivals and choose on the host; captured
        // call `k` is a graph launch choosing on the GPU.
        let call = |locals: &mut [Local],
                    first: usize,
                    captured: Option<u64>|
         -> Result<(), Box<dyn Error>> {
            for (i, l) in locals.iter_mut().enumerate() {
                let (input, output) = buffers(first + i);
                if captured.is_none() {
                    l.calls += 1;
                }
                let late = options.late_rank(captured.unwrap_or(l.calls));
                if options.delay_us > 0 && l.rank == late {
                    let ns = options.delay_us.saturating_mul(1000);
                    // SAFETY: the delay kernel takes one u64 by value; the stream is live.
                    unsafe { gpu.delay.launch(l.stream.raw, 1, 32, &ns) }?;
                }
                let operands = Operands {
                    count,
                    dtype,
                    op,
                    scale: scale_of(dtype, op, n, l.rank),
                    input,
                    output,
                };
                // SAFETY: input and output hold `count` elements on this device and live
                // until the streams are synchronised (and the graphs replayed), before this
                // function returns.
                unsafe { run_call(l, operands) }?;
            }
            Ok(())
        };
        // The checked call: in place, the output buffer starts as the input. (Every plan the
        // policy or a graph launch may pick is uploaded at a communicator's first call.)
        if in_place {
            for (i, input) in inputs.iter().enumerate() {
                outputs[i].upload(input)?;
            }
        }
        call(locals, 0, None)?;
        for l in locals.iter() {
            l.stream.synchronize()?;
        }
        for (i, output) in outputs.iter().enumerate() {
            let mut out = vec![0u8; bytes];
            output.download(&mut out)?;
            if options.check > 0 {
                outcomes[i].wrong[placement] = data::count_wrong(dtype, op, n, &out, seed);
            }
            outcomes[i].digest[placement] = data::digest(&out);
        }
        // Timing: warm-up, then `iters` calls queued back to back on every rank's stream
        // (with --graph: captured once per rank into a CUDA graph, replayed, and checked).
        for _ in 0..options.warmup {
            call(locals, 0, None)?;
        }
        let counts_before = locals
            .iter()
            .map(|l| match options.graph {
                true => l
                    .comm
                    .graph_counts()
                    .ok_or("the graph state cannot be read"),
                false => Ok(GraphCounts::default()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let graphs = if options.graph {
            let mut graphs = Vec::with_capacity(locals.len());
            for i in 0..locals.len() {
                let stream = locals[i].stream.raw;
                let capture = || {
                    for k in 1..=options.iters as u64 {
                        call(&mut locals[i..=i], i, Some(k)).map_err(|e| GpuError {
                            call: "ncclStragglarAllReduce during capture",
                            detail: e.to_string(),
                        })?;
                    }
                    Ok(())
                };
                // SAFETY: the rank's own stream, alive for the whole capture.
                let graph = unsafe { Graph::capture(&gpu.device, stream, capture) }?;
                graphs.push(graph);
            }
            Some(graphs)
        } else {
            None
        };
        let starts = locals
            .iter()
            .map(|_| Event::new(&gpu.device))
            .collect::<Result<Vec<_>, _>>()?;
        let ends = locals
            .iter()
            .map(|_| Event::new(&gpu.device))
            .collect::<Result<Vec<_>, _>>()?;
        for (l, e) in locals.iter().zip(&starts) {
            e.record(&l.stream)?;
        }
        match &graphs {
            Some(graphs) => {
                for (l, g) in locals.iter().zip(graphs) {
                    g.launch(&l.stream)?;
                }
            }
            None => {
                let waited_before: std::time::Duration =
                    locals.iter().map(|l| l.comm.record_waits()).sum();
                let queued = std::time::Instant::now();
                for _ in 0..options.iters {
                    call(locals, 0, None)?;
                }
                let elapsed = queued.elapsed();
                let waited: std::time::Duration = locals
                    .iter()
                    .map(|l| l.comm.record_waits())
                    .sum::<std::time::Duration>()
                    - waited_before;
                // Threads as ranks queue one after another: each gets an equal share, waits
                // for records (GPU progress) left out.
                let per_call = elapsed.saturating_sub(waited).as_secs_f64() * 1e6
                    / (options.iters.max(1) * locals.len()) as f64;
                for o in outcomes.iter_mut() {
                    o.host_us += per_call / 2.0;
                }
            }
        }
        for (l, e) in locals.iter().zip(&ends) {
            e.record(&l.stream)?;
        }
        for (i, (s, e)) in starts.iter().zip(&ends).enumerate() {
            outcomes[i].time_us[placement] = s.elapsed_ms(e)? as f64 * 1e3 / options.iters as f64;
        }
        // Replayed calls must be right too (out of place: each replay recomputes the same
        // result from the unchanged input; the epochs advance on the device). A replay that
        // chose its plan on the GPU may sum in another order than the checked call: its
        // output joins the digest every rank must share instead.
        if graphs.is_some() && !in_place {
            for (i, output) in outputs.iter().enumerate() {
                let mut out = vec![0u8; bytes];
                output.download(&mut out)?;
                if options.check > 0 {
                    outcomes[i].wrong[placement] += data::count_wrong(dtype, op, n, &out, seed);
                }
                let digest = data::digest(&out);
                if auto {
                    outcomes[i].digest[placement] =
                        data::digest_more(outcomes[i].digest[placement], digest);
                } else if digest != outcomes[i].digest[placement] {
                    outcomes[i].wrong[placement] += 1;
                }
            }
        }
        if graphs.is_some() {
            for (l, before) in locals.iter_mut().zip(&counts_before) {
                let after = l
                    .comm
                    .graph_counts()
                    .ok_or("the graph state cannot be read")?;
                l.choices.replays(GraphCounts {
                    stragglar: after.stragglar.saturating_sub(before.stragglar),
                    baseline: after.baseline.saturating_sub(before.baseline),
                    last_straggler: after.last_straggler,
                });
            }
        }
    }
    for (o, l) in outcomes.iter_mut().zip(locals.iter()) {
        o.records = records_digest(l.comm.rank());
        o.calls = l.choices.calls;
        o.stragglar_calls = l.choices.stragglar;
        o.choices = l.choices.digest;
        // Graph replays said their last choice; eager calls, the engine's designation.
        let designated = l.choices.replayed.unwrap_or_else(|| l.comm.designated());
        o.designated = designated.map_or(-1, |r| r as i64);
    }
    Ok(outcomes)
}
