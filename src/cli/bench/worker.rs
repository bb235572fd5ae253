//! One rank's part of a benchmark run: the sweep over sizes, timed and checked.

use std::time::{Duration, Instant};

use super::data;
use super::ending::RankFailure;
use super::options::{BenchAlgo, BenchOptions};
use super::report::{RankHalf, RankSize};
use crate::detect::{ArrivalRecord, Choice, MulticastMode, Observed, Policy, Tracker};
use crate::engine::host::comm::CallRecord;
use crate::engine::host::runner::{all_reduce, layout_for};
use crate::engine::host::segment::SegmentLayout;
use crate::engine::host::{Buffers, EngineError, HostComm, HostCommConfig};
use crate::plan::{PlanCache, Shape};
use crate::reduce::{ReduceOp, Scale};

use crate::schedule::model::Multicast;
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
    /// Timed calls that ran StragglAR.
    pub stragglar_calls: u64,
    /// Digest of every choice this rank made (the same on every rank, or the policy is broken).
    pub choices: u64,
    /// The designated straggler after the last call, -1 for none.
    pub designated: i64,
}

/// One size as one rank measured it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SizeResult {
    pub bytes: u64,
    /// Out-of-place, then in-place.
    pub halves: [Half; 2],
}

impl SizeResult {
    /// What the report combines: times, checks and lateness per placement, and the choices of
    /// both placements as one digest every rank must share.
    pub fn for_report(&self, options: &BenchOptions) -> RankSize {
        let [out, inp] = self.halves;
        RankSize {
            bytes: self.bytes,
            dtype: options.dtype,
            op: options.op,
            halves: self.halves.map(|h| RankHalf {
                time_us: h.time_us,
                wrong: h.wrong,
                digest: h.digest,
            }),
            lead_us: Some((out.lead_us + inp.lead_us) / 2.0),
            post_us: Some((out.post_us + inp.post_us) / 2.0),
            calls: 2 * options.iters as u64,
            stragglar_calls: out.stragglar_calls + inp.stragglar_calls,
            agreed: data::digest_more(out.choices, inp.choices),
            designated: inp.designated,
            host_us: None,
        }
    }
}

/// StragglAR with `straggler`, its chunks cut into `pieces`.
fn stragglar_shape(options: &BenchOptions, straggler: usize, pieces: usize) -> Shape {
    Shape {
        algorithm: Algorithm::Stragglar,
        ranks: options.ranks,
        straggler,
        dtype: options.dtype,
        pieces,
    }
}

/// Multicast StragglAR with `straggler`.
fn multicast_shape(options: &BenchOptions, straggler: usize) -> Shape {
    Shape {
        algorithm: Algorithm::Multicast,
        ..stragglar_shape(options, straggler, 1)
    }
}

fn ring_shape(options: &BenchOptions) -> Shape {
    Shape {
        algorithm: Algorithm::Ring,
        ..stragglar_shape(options, 0, 1)
    }
}

/// The segment layout every rank uses (identical everywhere: derived from the options only).
/// It fits StragglAR (with any straggler: relabelling changes no size, with every finish a size
/// of the run may use, measurement's refinements included) and Ring.
pub fn layout(options: &BenchOptions) -> Result<SegmentLayout, String> {
    let max_bytes = options.sizes().into_iter().max().unwrap_or(0) as usize;
    let max_count = max_bytes / options.dtype.size();
    let mut shapes: Vec<Shape> = bench_policy(options)
        .finishes_up_to(max_bytes)
        .into_iter()
        .map(|finish| stragglar_shape(options, options.ranks - 1, 1).with_finish(finish))
        .collect();
    shapes.push(ring_shape(options));
    if options.algo == BenchAlgo::Multicast {
        shapes.push(multicast_shape(options, options.straggler));
    }
    layout_for(
        &mut PlanCache::default(),
        &shapes,
        max_count,
        options.buffer_bytes,
    )
}

/// The policy of the run: `STRAGGLAR_ALGO` and `STRAGGLAR_STRAGGLER` steer it as in the
/// library, on the link the model assumes here, with `--pipeline`'s depth (refined by
/// measurement under `auto`). Under `--algo auto` with `STRAGGLAR_MULTICAST=1` and 3 ranks or
/// more, StragglAR may also finish by one multicast (the host engine's links serve a multicast
/// send's readers for the price of one send), which the policy weighs and measures.
fn bench_policy(options: &BenchOptions) -> Policy {
    let config = crate::config::get();
    let policy = Policy::new(
        options.ranks,
        config.algo,
        config.straggler,
        options.model_link(),
    )
    .with_pipeline(options.pipeline);
    match (
        options.algo == BenchAlgo::Auto && options.ranks >= 3,
        config.multicast,
    ) {
        (true, MulticastMode::Weighed) => policy.with_multicast(Multicast { ratio: 1.0 }),
        (true, MulticastMode::Always) => policy
            .with_multicast(Multicast { ratio: 1.0 })
            .multicast_only(),
        _ => policy,
    }
}

/// How each call's algorithm is chosen: fixed by `--algo`, or by the policy from the arrival
/// records of earlier calls, through the library's own `Tracker` (a detector per size class;
/// lag 1: the host engine's record is read when the call returns).
struct Chooser {
    /// `--algo stragglar`, `ring` or `multicast`: every call's choice.
    fixed: Option<Choice>,
    /// `--algo multicast`: the fixed StragglAR choice runs the multicast schedule (tracked as
    /// StragglAR with that straggler).
    multicast: bool,
    tracker: Tracker,
    /// The engine calls the last recorded call ran as.
    previous_parts: usize,
}

impl Chooser {
    fn new(options: &BenchOptions) -> Self {
        let fixed = match options.algo {
            BenchAlgo::Stragglar | BenchAlgo::Multicast => Some(Choice::Stragglar {
                straggler: options.straggler,
            }),
            BenchAlgo::Ring => Some(Choice::Baseline),
            BenchAlgo::Auto => None,
        };
        Chooser {
            fixed,
            multicast: options.algo == BenchAlgo::Multicast,
            tracker: Tracker::new(bench_policy(options), options.ranks, 1).measuring(),
            previous_parts: 1,
        }
    }

    /// The shape of the next call, of `bytes`; `recorded` when the call will leave an arrival
    /// record (every call with elements), which is then tracked.
    fn shape(&mut self, options: &BenchOptions, bytes: usize, recorded: bool) -> Shape {
        let (choice, finish) = match (self.fixed, recorded) {
            (Some(choice), true) => (choice, self.tracker.track_call(bytes, choice)),
            (None, true) => {
                let decision = self.tracker.decide_call(bytes);
                (decision.choice, decision.finish)
            }
            (fixed, false) => (
                fixed.unwrap_or_else(|| self.tracker.peek(bytes)),
                self.tracker.class_finish(bytes),
            ),
        };
        match choice {
            Choice::Stragglar { straggler } if self.multicast => {
                multicast_shape(options, straggler)
            }
            Choice::Stragglar { straggler } => {
                stragglar_shape(options, straggler, 1).with_finish(finish)
            }
            Choice::Baseline => ring_shape(options),
        }
    }

    /// Feeds a call's record: the previous call's post-arrival time, then its own arrivals.
    /// A previous call that ran in parts has no time (the record's covers its last part only).
    fn observe(&mut self, record: &CallRecord) -> Option<Observed> {
        if let Some(post_ns) = record.previous_post_ns {
            let whole = self.previous_parts == 1;
            self.tracker.feed_time(whole.then_some(post_ns));
        }
        self.previous_parts = record.parts;
        self.tracker.feed(ArrivalRecord {
            last_rank: record.last_rank,
            lead_ns: Some(record.lead_ns()),
        })
    }
}

/// A rank's finished sweep.
pub struct Finished {
    /// The straggler report of the run (the same on every rank).
    pub report: String,
    /// The engine calls the rank ran.
    pub calls: u64,
}

/// Joins communicator `comm_id` as `rank` and runs the sweep, calling `report` per size.
pub fn run(
    options: &BenchOptions,
    comm_id: u64,
    rank: usize,
    report: impl FnMut(SizeResult),
) -> Result<Finished, RankFailure> {
    let setup = |e: EngineError| RankFailure::outside_calls(e.to_string());
    let layout = layout(options).map_err(|e| setup(EngineError::Setup(e)))?;
    let mut run = RankRun::join(options, comm_id, rank, layout).map_err(setup)?;
    match run.sweep(report) {
        Ok(report) => Ok(Finished {
            report,
            calls: run.comm.calls(),
        }),
        Err(e) => Err(RankFailure::in_call(run.comm.calls(), &e)),
    }
}

impl<'a> RankRun<'a> {
    /// Joins the communicator, with this rank's fault, tracer and scale.
    fn join(
        options: &'a BenchOptions,
        comm_id: u64,
        rank: usize,
        layout: SegmentLayout,
    ) -> Result<Self, EngineError> {
        let mut comm = HostComm::join(HostCommConfig {
            comm_id,
            rank,
            ranks: options.ranks,
            layout,
            timeout: options.timeout_ms.map(Duration::from_millis),
            setup_timeout: Duration::from_secs(60),
            link: options.emulated_link(false),
        })?;
        if let Some(fault) = options.fault.filter(|_| rank == options.fault_rank) {
            comm.inject(fault);
        }
        Ok(RankRun {
            options,
            rank,
            comm,
            cache: PlanCache::default(),
            chooser: Chooser::new(options),
            layout,
            trace: match &crate::config::get().trace_dir {
                Some(dir) => Some(
                    crate::trace::TraceWriter::create(std::path::Path::new(dir), rank).map_err(
                        |e| EngineError::Setup(format!("STRAGGLAR_TRACE_DIR {dir}: {e}")),
                    )?,
                ),
                None => None,
            },
            // The bench always gives PreMulSum a host scalar, so a scale always exists.
            scale: Scale::for_op(
                options.op,
                options.dtype,
                options.ranks,
                scalar_bytes(options, rank),
            )
            .unwrap_or(Scale::None),
            calls: 0,
        })
    }

    /// Runs the sweep, calling `report` per size; returns the straggler report.
    fn sweep(&mut self, mut report: impl FnMut(SizeResult)) -> Result<String, EngineError> {
        let (options, rank) = (self.options, self.rank);
        for bytes in options.sizes() {
            let count = bytes as usize / options.dtype.size();
            let mut result = SizeResult {
                bytes,
                ..Default::default()
            };
            for (placement, half) in result.halves.iter_mut().enumerate() {
                let in_place = placement == 1;
                let input = data::input(options.dtype, options.op, rank, count, 0);
                let mut output = input.clone();
                for _ in 0..options.warmup {
                    self.call(&input, &mut output, in_place, false, half)?;
                }
                let (mut lead, mut post) = (0u64, 0u64);
                let start = Instant::now();
                for _ in 0..options.iters {
                    let (record, stragglar) =
                        self.call(&input, &mut output, in_place, false, half)?;
                    half.stragglar_calls += stragglar as u64;
                    if let Some(record) = record {
                        lead += record.lead_ns();
                        post += record.after_last_arrival_ns();
                    }
                }
                let n = options.iters as f64;
                half.time_us = start.elapsed().as_secs_f64() * 1e6 / n;
                half.lead_us = lead as f64 / n / 1e3;
                half.post_us = post as f64 / n / 1e3;
                for seed in 1..=options.check {
                    let input = data::input(options.dtype, options.op, rank, count, seed);
                    self.call(&input, &mut output, in_place, true, half)?;
                    half.wrong +=
                        data::count_wrong(options.dtype, options.op, options.ranks, &output, seed);
                    half.digest = data::digest_more(half.digest, data::digest(&output));
                }
            }
            report(result);
        }
        Ok(self.chooser.tracker.table(&[]))
    }
}

/// One rank's communicator and choices during a run.
struct RankRun<'a> {
    options: &'a BenchOptions,
    rank: usize,
    comm: HostComm,
    cache: PlanCache,
    chooser: Chooser,
    layout: SegmentLayout,
    scale: Scale,
    /// Calls made so far (seeds the jitter).
    calls: u64,
    /// `STRAGGLAR_TRACE_DIR`'s writer for this rank, if set.
    trace: Option<crate::trace::TraceWriter>,
}

impl RankRun<'_> {
    /// One call: the late rank sleeps first; the chooser picks the algorithm; the record feeds
    /// the detector. In place, `output` is the input, refilled only for check runs (as
    /// nccl-tests does). Returns the record and whether StragglAR ran.
    fn call(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        in_place: bool,
        refill: bool,
        half: &mut Half,
    ) -> Result<(Option<CallRecord>, bool), EngineError> {
        let options = self.options;
        self.calls += 1;
        let mut late_us = if self.rank == options.late_rank(self.calls) {
            options.delay_us
        } else {
            0
        };
        if options.jitter_us > 0 {
            late_us += data::digest_more(self.rank as u64, self.calls) % options.jitter_us;
        }
        if late_us > 0 {
            std::thread::sleep(Duration::from_micros(late_us));
        }
        let bytes = input.len();
        let shape = self
            .chooser
            .shape(options, bytes, bytes / options.dtype.size() > 0);
        let stragglar = shape.algorithm != Algorithm::Ring;
        self.comm.set_link(options.emulated_link(!stragglar));
        half.choices = data::digest_more(
            half.choices,
            if stragglar {
                shape.straggler as u64
            } else {
                u64::MAX
            },
        );
        let buffers = if in_place {
            if refill {
                output.copy_from_slice(input);
            }
            Buffers::InPlace(output)
        } else {
            Buffers::OutOfPlace { input, output }
        };
        let started = crate::clock::now_ns();
        let record = all_reduce(
            &mut self.comm,
            &mut self.cache,
            shape,
            options.op,
            self.scale,
            self.layout,
            buffers,
        )?;
        let mut designated = None;
        if let Some(observed) = record.as_ref().and_then(|r| self.chooser.observe(r)) {
            designated = observed.designated;
            half.designated = designated.map_or(-1, |r| r as i64);
            let class = observed.class;
            // Every rank sees the same change; rank 0 says it.
            match (observed.changed, self.rank) {
                (Some(Some(before)), 0) => log::warn!(
                    "designated straggler for sizes 2^{class} B changed from rank {before} to {} at call {}",
                    designated.map_or("none".to_string(), |r| format!("rank {r}")),
                    self.calls
                ),
                (Some(None), 0) => log::info!(
                    "rank {} designated as the straggler for sizes 2^{class} B at call {}",
                    designated.map_or(-1, |r| r as i64),
                    self.calls
                ),
                _ => {}
            }
        }
        if let Some(trace) = &mut self.trace {
            let finished = crate::clock::now_ns();
            let event = crate::trace::CallEvent {
                start_us: started as f64 / 1e3,
                duration_us: finished.saturating_sub(started) as f64 / 1e3,
                bytes: bytes as u64,
                algorithm: if stragglar { "stragglar" } else { "ring" },
                straggler: stragglar.then_some(shape.straggler),
                last_rank: record.as_ref().map(|r| r.last_rank),
                lead_us: record.as_ref().map(|r| r.lead_ns() as f64 / 1e3),
                designated,
                // Known only once the next call completes (see `detect::estimate`).
                post_us: None,
            };
            if let Err(e) = trace.call(&event) {
                log::warn!("{}: {e}; tracing stops", trace.path().display());
                self.trace = None;
            }
        }
        Ok((record, stragglar))
    }
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
