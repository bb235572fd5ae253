//! One rank's part of a benchmark run: the sweep over sizes, timed and checked.

use std::time::{Duration, Instant};

use super::data;
use super::options::{BenchAlgo, BenchOptions};
use crate::engine::host::comm::CallRecord;
use crate::engine::host::link::LinkModel;
use crate::engine::host::runner::{all_reduce, layout_for, PlanCache, Shape};
use crate::engine::host::segment::SegmentLayout;
use crate::engine::host::{Buffers, EngineError, HostComm, HostCommConfig};
use crate::reduce::{ReduceOp, Scale};
use crate::schedule::Algorithm;

/// One placement (out-of-place or in-place) of one size, as one rank measured it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Half {
    /// Mean time per call, microseconds.
    pub time_us: f64,
    /// Wrong elements in the check runs.
    pub wrong: u64,
    /// Mean lead of the last arrival over the second-to-last, microseconds.
    pub lead_us: f64,
    /// Mean time from the last arrival to this rank's finish, microseconds.
    pub post_us: f64,
    /// Digest of this rank's output of the last check run (0 without checks).
    pub digest: u64,
}

/// One size as one rank measured it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SizeResult {
    pub bytes: u64,
    /// Out-of-place, then in-place.
    pub halves: [Half; 2],
}

/// The shared plan choice of the run.
pub fn shape(options: &BenchOptions) -> Shape {
    Shape {
        algorithm: match options.algo {
            BenchAlgo::Stragglar => Algorithm::Stragglar,
            BenchAlgo::Ring => Algorithm::Ring,
        },
        ranks: options.ranks,
        straggler: options.straggler,
        dtype: options.dtype,
    }
}

/// The segment layout every rank uses (identical everywhere: derived from the options only).
pub fn layout(options: &BenchOptions) -> Result<SegmentLayout, String> {
    let max_count = options.sizes().into_iter().max().unwrap_or(0) as usize / options.dtype.size();
    layout_for(
        &mut PlanCache::default(),
        &[shape(options)],
        max_count,
        options.buffer_bytes,
    )
}

/// Joins communicator `comm_id` as `rank` and runs the sweep, calling `report` per size.
pub fn run(
    options: &BenchOptions,
    comm_id: u64,
    rank: usize,
    mut report: impl FnMut(SizeResult),
) -> Result<(), EngineError> {
    let layout = layout(options).map_err(EngineError::Setup)?;
    let mut comm = HostComm::join(HostCommConfig {
        comm_id,
        rank,
        ranks: options.ranks,
        layout,
        timeout: options.timeout_ms.map(Duration::from_millis),
        setup_timeout: Duration::from_secs(60),
        link: LinkModel {
            bytes_per_second: options.link_gbs.map(|g| g * 1e9),
            latency: Duration::from_nanos((options.link_latency_us * 1000.0) as u64),
        },
    })?;
    let mut cache = PlanCache::default();
    let shape = shape(options);
    let scale = Scale::for_op(
        options.op,
        options.dtype,
        options.ranks,
        scalar_bytes(options, rank),
    );
    for bytes in options.sizes() {
        let count = bytes as usize / options.dtype.size();
        let mut result = SizeResult {
            bytes,
            ..Default::default()
        };
        for (placement, half) in result.halves.iter_mut().enumerate() {
            let in_place = placement == 1;
            // In place, the output buffer is the input: refilled for check runs only, as
            // nccl-tests does.
            let mut call = |input: &[u8],
                            output: &mut Vec<u8>,
                            refill: bool|
             -> Result<CallRecord, EngineError> {
                if rank == options.late_rank && options.delay_us > 0 {
                    std::thread::sleep(Duration::from_micros(options.delay_us));
                }
                let buffers = if in_place {
                    if refill {
                        output.copy_from_slice(input);
                    }
                    Buffers::InPlace(output)
                } else {
                    Buffers::OutOfPlace { input, output }
                };
                all_reduce(
                    &mut comm, &mut cache, shape, options.op, scale, layout, buffers,
                )
            };
            let input = data::input(options.dtype, options.op, rank, count, 0);
            let mut output = input.clone();
            for _ in 0..options.warmup {
                call(&input, &mut output, false)?;
            }
            let (mut lead, mut post) = (0u64, 0u64);
            let start = Instant::now();
            for _ in 0..options.iters {
                let record = call(&input, &mut output, false)?;
                lead += record.lead_ns();
                post += record.after_last_arrival_ns();
            }
            let n = options.iters as f64;
            half.time_us = start.elapsed().as_secs_f64() * 1e6 / n;
            half.lead_us = lead as f64 / n / 1e3;
            half.post_us = post as f64 / n / 1e3;
            for seed in 1..=options.check {
                let input = data::input(options.dtype, options.op, rank, count, seed);
                call(&input, &mut output, true)?;
                half.wrong +=
                    data::count_wrong(options.dtype, options.op, options.ranks, &output, seed);
                half.digest = data::digest(&output);
            }
        }
        report(result);
    }
    Ok(())
}

/// This rank's PreMulSum scalar in the element type (nccl-tests' choice), for premulsum.
fn scalar_bytes(options: &BenchOptions, rank: usize) -> Option<[u8; 8]> {
    (options.op == ReduceOp::PreMulSum).then(|| {
        let encoded = data::encode(options.dtype, data::premul_scalar(rank) as f64);
        let mut bytes = [0u8; 8];
        bytes[..encoded.len()].copy_from_slice(&encoded);
        bytes
    })
}
