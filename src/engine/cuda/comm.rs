//! One communicator's GPU engine, from the moment its ranks are connected to its teardown:
//! the per-call choice, tickets, launches, the ordering across the caller's streams and after
//! calls NCCL runs, graph capture, abort and drain. The library (`super::library`) and
//! `stragglar bench --backend cuda` both drive it; they differ only in how the ranks connect
//! and in the baseline (NCCL's AllReduce, or Ring on our kernel where NCCL cannot run).
//!
//! Every call outside graph capture records its arrivals on the GPUs (the kernel's arrival
//! block, or the ticket kernel before a call NCCL runs), and the policy decides each call from
//! the records of calls at least [`RECORD_LAG`] older, which every rank reads identically from
//! its own host-mapped ring: the same choice on every rank. Calls on different streams are
//! ordered by an event, so a rank never starts call e+1 before its call e (the premise of the
//! two parities).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::args::Operands;
use super::branch::{BranchError, NcclWork};
use super::driver::{self, Capture, Device, Event, PeerMapping};
use super::growth::{grow, growth_target, Growth};
use super::multicast::region::Region;
use super::rank::{CallError, Control, CudaRank, GraphCounts, Ticket, TimedRecord, OVERDUE_CALLS};
use super::sizing::arena_for;
use super::staging::ArenaLayout;
use crate::detect::policy::{Choice, Policy};
use crate::detect::tally::RankArrivals;
use crate::detect::tracker::Decision;
use crate::detect::{Finish, Tracker};
use crate::gpu::arrival::RING_ENTRIES;
use crate::gpu::choice::RawRule;
use crate::gpu::launch::STATUS_ABORTED;
use crate::nccl::types::{cudaStream_t, ResultCode};
use crate::plan::{Lowered, PlanCache, Shape};
use crate::trace::{CallEvent, TraceWriter};

/// Ticketed calls between a call and the first call its arrival record can decide. A record
/// reaches a rank's ring when a collecting launch of that rank at least two calls later runs:
/// the next StragglAR launch, or the end kernel of the next measured call NCCL runs (one in
/// eight, and at the latest 17 calls on; a call that finds records waiting longer collects them
/// first). A host more than this many calls ahead of its GPU waits for it (as NCCL's host waits
/// when its queue is full); 32 is the detector's window, and keeps the wait rare.
pub const RECORD_LAG: u64 = 32;

// A record must be collected when it is due, and not yet overwritten: call k's is collected by
// a launch of call at most k + OVERDUE_CALLS (the overdue collection), and the launch that
// collects call k + RING_ENTRIES's record overwrites it.
const _: () = assert!(RECORD_LAG > OVERDUE_CALLS && RECORD_LAG <= RING_ENTRIES as u64);

/// What runs a call when the policy picks no straggler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// NCCL's own AllReduce: the engine queues the call's ticket and the caller hands the call
    /// to NCCL, then reports NCCL's result ([`CudaComm::nccl_ran`]).
    Nccl,
    /// Ring on our kernel (ranks sharing one GPU, where NCCL cannot run).
    Ring,
}

/// Why a call the engine was offered stays on NCCL, untouched (no ticket, nothing queued).
/// Each follows from state that is the same on every rank, so every rank declines alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decline {
    /// No usable CUDA driver or device here.
    GpuUnavailable,
    /// The communicator's setup refused the engine (the same verdict on every rank).
    SetupRefused,
    /// Captured before any call outside capture uploaded the plans (or they cannot be built).
    CapturingBeforeSetup,
    /// Larger than the arenas hold: captured (they grow at eager calls only), or eager after
    /// they could not grow.
    AboveStaging,
    /// A captured call of a size the policy never runs on StragglAR.
    PolicyNccl,
}

/// What a call the engine took became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    /// Our kernel, StragglAR with this straggler.
    Stragglar { straggler: usize },
    /// Our kernel, Ring (a communicator whose baseline is [`Baseline::Ring`]).
    Ring,
    /// Its ticket is queued: NCCL must run the call now, and the caller reports NCCL's result
    /// through [`CudaComm::nccl_ran`] before the communicator's next call. `above_staging`:
    /// the policy would have run StragglAR, but the arenas could not grow to hold the call.
    Ticketed { above_staging: bool },
    /// Captured into a graph as a graph launch, which chooses its plan at every replay.
    Captured,
    /// NCCL's own work captured into the graph as it is (it could not go behind a
    /// conditional node): every replay runs NCCL.
    CapturedNccl,
}

/// Everything a connected communicator is made of.
pub struct CommParts {
    /// This rank, connected to every peer.
    pub rank: CudaRank,
    /// Peers' staging, open for the communicator's lifetime (`None` for this rank).
    pub mappings: Vec<Option<PeerMapping>>,
    /// Each rank's host and GPU, for the straggler report.
    pub members: Vec<String>,
    /// Schedules already lowered (sizing the staging); the rest are lowered on first use.
    pub plans: PlanCache,
    pub policy: Policy,
    /// The largest message the engine takes (bytes): graph launches of every pipeline depth
    /// a call up to it may run are prepared.
    pub max_bytes: usize,
    /// The largest message the arenas hold from the start: `max_bytes` (the bench), or 0 (a
    /// job's communicator, whose arenas grow at the calls that need them: `super::growth`).
    pub staged_bytes: usize,
    pub baseline: Baseline,
    /// Where the designation is published for readers that must not wait for a call (the
    /// rank, or -1).
    pub designated: Arc<AtomicI64>,
    /// How log lines name the communicator ("communicator 0x...").
    pub label: String,
    pub ordering: OrderingEvents,
    /// The multicast region the team formed at setup, if any: StragglAR may then finish by one
    /// multicast.
    pub multicast: Option<Region>,
}

/// The two events that order a communicator's launches: eager launches', and captured
/// launches' (an event recorded in a capture may only be waited on within it). Made during the
/// setup, so that a rank that cannot make them refuses like any other local failure.
pub struct OrderingEvents {
    last: Event,
    captured_last: Event,
}

impl OrderingEvents {
    pub fn new(device: &Arc<Device>) -> Result<OrderingEvents, CallError> {
        Ok(OrderingEvents {
            last: Event::ordering(device)?,
            captured_last: Event::ordering(device)?,
        })
    }
}

/// One rank's engine of one communicator.
pub struct CudaComm {
    rank: CudaRank,
    mappings: Vec<Option<PeerMapping>>,
    members: Vec<String>,
    baseline: Baseline,
    label: String,
    plans: PlanCache,
    /// The straggler policy and its arrival records.
    tracker: Tracker,
    designated: Arc<AtomicI64>,
    /// `STRAGGLAR_TRACE_DIR`'s writer, and the tracked calls whose records are not read yet:
    /// (host enqueue time in us, bytes, the straggler StragglAR ran).
    trace: Option<TraceWriter>,
    untraced: VecDeque<(f64, u64, Option<usize>)>,
    /// When the straggler report was last logged (every `STRAGGLAR_REPORT_INTERVAL` at INFO).
    reported_at: Instant,
    /// Time spent waiting for arrival records the GPU had not written yet.
    record_waits: Duration,
    /// Eager AllReduce kernels launched so far (those that advance the epoch; not tickets, not
    /// captured calls): with this rank's own epoch, what every peer must reach before the
    /// staging is freed.
    launched: u64,
    /// The ticket queued for a call NCCL runs, whose result is not reported yet.
    ticket_awaits_nccl: Option<Ticket>,
    /// The stream of such a call that NCCL (nonblocking) was still launching when it
    /// returned: the order is taken once the application reads `ncclSuccess` (see
    /// [`CudaComm::nccl_state`]); its time is not measured (no end kernel is queued).
    order_pending: Option<cudaStream_t>,
    /// Calls captured into graphs as graph launches.
    captured: u64,
    /// NCCL's work of captured calls, captured apart (`super::branch`): kept until the
    /// communicator goes (the caller's graphs hold copies of it), and dropped before NCCL's
    /// own teardown of it, whose wait for its captured work would otherwise never end.
    nccl_work: Vec<NcclWork>,
    /// Captures that put NCCL's work behind a conditional node (or tried to), numbered alike
    /// on every rank: the round of each one's vote.
    branch_captures: u32,
    /// The plans graph launches choose among could not be built: captured calls stay on NCCL.
    unbuildable: bool,
    /// See [`CommParts::max_bytes`].
    max_bytes: usize,
    /// The largest message the arenas hold now (see [`CommParts::staged_bytes`]).
    staged_bytes: usize,
    /// A growth was refused (alike on every rank): the arenas stay as they are.
    growth_refused: bool,
    /// Peers' grown arenas, open until the peers are released.
    grown_mappings: Vec<PeerMapping>,
    /// (size class, finish) pairs whose first StragglAR call was announced (the plain
    /// point-to-point finish is not).
    finishes_run: std::collections::HashSet<(u32, Finish)>,
    /// The finish each size class's graph launches run, fixed at its first capture.
    graph_finishes: std::collections::HashMap<u32, Finish>,
    /// Orders this communicator's launches across the caller's streams.
    last: Event,
    last_stream: cudaStream_t,
    /// Orders its captured launches across the streams of one capture: recorded after each,
    /// with the capture's id and the stream (a replay of two graph launches at once would mix
    /// their device state). Replays and eager calls are ordered by the caller's streams.
    captured_last: Event,
    captured_stream: Option<(u64, cudaStream_t)>,
    /// The multicast region, if the team formed: held only to be dropped last, after every
    /// other part, the rank's staging and its synchronisation included (the launches address
    /// it through the rank's copy of its view; the policy knows it is there).
    _multicast: Option<Region>,
}

// SAFETY: the raw stream handles are only compared and passed back to the driver, which lets
// any thread use them.
unsafe impl Send for CudaComm {}

impl CudaComm {
    /// The engine of a connected rank.
    pub fn new(parts: CommParts) -> CudaComm {
        let ranks = parts.policy.ranks();
        CudaComm {
            last: parts.ordering.last,
            captured_last: parts.ordering.captured_last,
            rank: parts.rank,
            mappings: parts.mappings,
            members: parts.members,
            baseline: parts.baseline,
            label: parts.label,
            plans: parts.plans,
            tracker: Tracker::new(parts.policy, ranks, RECORD_LAG).measuring(),
            designated: parts.designated,
            trace: None,
            untraced: VecDeque::new(),
            reported_at: Instant::now(),
            record_waits: Duration::ZERO,
            launched: 0,
            ticket_awaits_nccl: None,
            order_pending: None,
            captured: 0,
            nccl_work: Vec::new(),
            branch_captures: 0,
            unbuildable: false,
            max_bytes: parts.max_bytes,
            staged_bytes: parts.staged_bytes,
            growth_refused: false,
            grown_mappings: Vec::new(),
            finishes_run: Default::default(),
            graph_finishes: Default::default(),
            last_stream: std::ptr::null_mut(),
            captured_stream: None,
            _multicast: parts.multicast,
        }
    }

    /// Destroys NCCL's work captured apart for graphs (the caller's graphs keep their copies):
    /// before NCCL's own teardown of the communicator, which waits for what its captured work
    /// holds to be released.
    pub fn release_nccl_work(&mut self) {
        self.nccl_work.clear();
    }

    /// Whether the policy prices NCCL as NVLS (the setup's records said NCCL would run it).
    pub fn nvls_baseline(&self) -> bool {
        self.tracker.policy().nvls_baseline()
    }

    /// Traces this rank's calls from now on into `trace` (`STRAGGLAR_TRACE_DIR`).
    pub fn trace_into(&mut self, trace: TraceWriter) {
        self.trace = Some(trace);
    }

    /// This rank's part (its staging, ring and words).
    pub fn rank(&self) -> &CudaRank {
        &self.rank
    }

    /// The abort and status words, usable without holding this engine.
    pub fn control(&self) -> Control {
        self.rank.control()
    }

    /// Tells the peers this rank will not take part in calls any more (its failure word), and
    /// fails its later calls. Never synchronises: any stream may be capturing.
    pub fn give_up(&self) {
        self.rank.give_up();
    }

    /// The designated straggler after the last record read (of that record's size class).
    pub fn designated(&self) -> Option<usize> {
        usize::try_from(self.designated.load(Ordering::Relaxed)).ok()
    }

    /// `rank`'s arrivals so far (a line of the straggler report).
    pub fn arrivals(&self, rank: usize) -> Option<RankArrivals> {
        self.tracker.arrivals(rank)
    }

    /// What the policy measured and chose for size class `class` so far (`None` before its
    /// first call).
    pub fn class_times(&self, class: u32) -> Option<&crate::detect::estimate::ClassTimes> {
        self.tracker.class_times(class)
    }

    /// How long calls waited for arrival records their GPU had not written yet (GPU progress,
    /// not host cost).
    pub fn record_waits(&self) -> Duration {
        self.record_waits
    }

    /// What this rank's graph launches chose so far, read from its GPU.
    pub fn graph_counts(&self) -> Option<GraphCounts> {
        self.rank.graph_counts()
    }

    /// Runs one call of `operands` on `stream`. `Err(Decline)` leaves it untouched for NCCL;
    /// `Ok(Err(_))` is a failure of this rank, whose peers are told (its failure word).
    /// `nccl` makes the same call to NCCL on the stream it is given (a capture may take NCCL's
    /// work into the graph itself).
    ///
    /// # Safety
    /// NCCL's contract for `ncclAllReduce`: the buffers hold `count` elements on this device
    /// (whenever a captured graph is replayed, too), and `stream` is a live stream of it;
    /// `nccl` queues only work of this device.
    pub unsafe fn all_reduce(
        &mut self,
        operands: Operands,
        stream: cudaStream_t,
        nccl: &dyn Fn(cudaStream_t) -> ResultCode,
    ) -> Result<Result<Ran, CallError>, Decline> {
        // SAFETY: the caller's stream of this device.
        let capture = match unsafe { driver::capture_of(self.rank.device(), stream.cast()) } {
            Ok(capture) => capture,
            Err(e) => {
                // Its peers take a ticket for this call (or capture it) and this rank cannot
                // tell whether to; giving up never synchronises, so a capturing stream is safe.
                self.rank.give_up();
                return Ok(Err(e.into()));
            }
        };
        if capture != Capture::None {
            // SAFETY: as the caller vouches.
            return unsafe { self.capture(operands, stream, capture, nccl) };
        }
        // An eager call may allocate (growth, plan uploads), map peers' memory and read
        // events: beside another thread's capture in the global mode (PyTorch's default) the
        // driver would refuse those calls and invalidate that capture. Relaxed, they leave it
        // whole. (A capture of this thread's stream takes the path above, which makes none.)
        // SAFETY: as the caller vouches.
        driver::relaxed_capture_mode(|| unsafe { self.eager(operands, stream) })
    }

    /// Says at INFO the first time a size class runs StragglAR finished by `finish` other than
    /// the plain point-to-point schedule (the model's finish, or one that measurement probes
    /// or adopts).
    fn announce_finish(&mut self, bytes: usize, finish: Finish) {
        let class = crate::detect::size_class(bytes);
        if finish != Finish::Pieces(1) && self.finishes_run.insert((class, finish)) {
            let how = match finish {
                Finish::Multicast => "finished by one multicast".to_string(),
                Finish::Pieces(k) => format!("pipelined, {k} pieces per chunk"),
            };
            log::info!(
                "{}: StragglAR calls of sizes 2^{class} B run {how}",
                self.label
            );
        }
    }

    /// An eager call: due records fed, the arenas grown if the call the policy will send to
    /// StragglAR needs it, the policy's choice, the launch (or the ticket).
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce`], with `stream` not capturing.
    unsafe fn eager(
        &mut self,
        operands: Operands,
        stream: cudaStream_t,
    ) -> Result<Result<Ran, CallError>, Decline> {
        if self.ticket_awaits_nccl.take().is_some() {
            // The library reports every ticketed call's result while the engine is ready, and
            // that report takes the order this launch needs (after the ticket): without it,
            // this rank cannot go on.
            log::warn!(
                "{}: NCCL's result for a ticketed call was not reported; this rank gives the GPU engine up",
                self.label
            );
            self.rank.give_up();
            return Ok(Err(CallError::Unfit(
                "a ticketed call's result was not reported".into(),
            )));
        }
        if self.order_pending.take().is_some() {
            // The application did not read NCCL's state through ncclCommGetAsyncError, which
            // takes this order (see `nccl_state`), and its stream may be capturing or gone by
            // now: this launch stays ordered after the forwarded call's ticket only, not after
            // NCCL's kernel (NCCL's contract orders the application's next call after it).
            log::debug!("{}: a forwarded call's order was not taken", self.label);
        }
        if self.rank.collection_overdue() {
            // Measured calls' end kernels were not queued (nonblocking calls'): this call
            // collects first, ordered after this rank's previous launch like any launch.
            let collected = (|| -> Result<(), CallError> {
                follow_last_launch(&self.last, &mut self.last_stream, self.captured, stream)?;
                // SAFETY: the caller's stream, not capturing, ordered just above.
                unsafe { self.rank.collect_late(stream.cast()) }
            })();
            if let Err(e) = collected {
                self.rank.give_up();
                return Ok(Err(e));
            }
        }
        let prepared = self
            .feed_due_records()
            .and_then(|()| self.prepare_choices(operands));
        if let Err(e) = prepared {
            // This rank cannot take part in the call: its peers must not wait for it.
            self.rank.give_up();
            return Ok(Err(e));
        }
        self.maybe_log_report();
        let bytes = operands.count * operands.dtype.size();
        // The choice below is this one (nothing is fed in between); a call StragglAR would
        // run needs arenas that hold it. One they cannot grow to hold goes to NCCL with its
        // ticket, tracked as NCCL's (alike on every rank).
        let mut above_staging = false;
        // Only a job's communicator (NCCL the baseline) starts with arenas too small; the
        // bench's hold its largest call from the start.
        debug_assert!(self.baseline == Baseline::Nccl || self.staged_bytes >= self.max_bytes);
        if bytes > self.staged_bytes && matches!(self.tracker.peek(bytes), Choice::Stragglar { .. })
        {
            match self.make_room(bytes) {
                Ok(fits) => above_staging = !fits,
                Err(e) => {
                    self.rank.give_up();
                    return Ok(Err(e));
                }
            }
        }
        let decision = match above_staging {
            false => self.tracker.decide_call(bytes),
            true => Decision {
                finish: self.tracker.track_call(bytes, Choice::Baseline),
                choice: Choice::Baseline,
            },
        };
        let ranks = self.tracker.policy().ranks();
        let run = match (decision.choice.straggler(), self.baseline) {
            (Some(straggler), _) => {
                self.announce_finish(bytes, decision.finish);
                Some((
                    Shape::of_choice(ranks, straggler, operands.dtype).with_finish(decision.finish),
                    Ran::Stragglar { straggler },
                ))
            }
            (None, Baseline::Ring) => {
                Some((Shape::of_choice(ranks, ranks, operands.dtype), Ran::Ring))
            }
            (None, Baseline::Nccl) => None,
        };
        // Fields borrowed apart: the plan stays in the cache (no copy of it per call). It
        // serves every count: a new size builds and uploads nothing.
        // A StragglAR plan that cannot be built sends the call to the baseline (alike on every
        // rank: lowering is deterministic); Ring on our kernel must be buildable.
        let plan = run.and_then(|(shape, ran)| Some((self.plans.lowered(shape).ok()?, ran)));
        if plan.is_none() && self.baseline == Baseline::Ring {
            self.rank.give_up();
            return Ok(Err(CallError::Unfit(
                "the Ring plan cannot be built".into(),
            )));
        }
        if self.trace.is_some() {
            let now_us = crate::clock::now_ns() as f64 / 1e3;
            let straggler = match plan {
                Some((_, Ran::Stragglar { straggler })) => Some(straggler),
                _ => None,
            };
            self.untraced.push_back((now_us, bytes as u64, straggler));
        }
        let raw = stream.cast();
        let time_wanted = self.tracker.baseline_time_wanted(bytes);
        let ordered = follow_last_launch(&self.last, &mut self.last_stream, self.captured, stream);
        let rank = &mut self.rank;
        let result = (|| -> Result<Ran, CallError> {
            ordered?;
            let ran = match plan {
                Some((plan, ran)) => {
                    // SAFETY: as the caller vouches.
                    unsafe { rank.all_reduce(plan, operands, raw, true) }?;
                    // A call without elements queues a ticket only and leaves the epoch alone.
                    self.launched += u64::from(operands.count > 0);
                    ran
                }
                None => {
                    // SAFETY: the caller's stream, not capturing.
                    let ticket = unsafe { rank.ticket(raw, time_wanted) }?;
                    if ticket.measured() {
                        self.tracker.baseline_measured(bytes);
                    }
                    self.ticket_awaits_nccl = Some(ticket);
                    Ran::Ticketed { above_staging }
                }
            };
            // A call handed to NCCL takes its order once NCCL has queued its kernel
            // (`nccl_ran`): one event record per call, after NCCL's kernel.
            if !matches!(ran, Ran::Ticketed { .. }) {
                // SAFETY: as above.
                unsafe { self.last.record_raw(raw) }?;
            }
            Ok(ran)
        })();
        if result.is_err() {
            // Peers already launched this call: tell them this rank will not.
            rank.give_up();
        }
        Ok(result)
    }

    /// Grows the arenas, with every peer, to hold a call of `bytes` (more than they hold
    /// now; `super::growth`): `Ok(true)` when they hold it then, `Ok(false)` when they cannot
    /// grow (they hold the most a call may be, or a growth was refused, now or before: alike on
    /// every rank). `Err`: this rank or a peer failed, or this rank was given up or aborted;
    /// the caller gives this rank up, and its arenas never grow again.
    fn make_room(&mut self, bytes: usize) -> Result<bool, CallError> {
        if self.growth_refused || self.staged_bytes >= self.max_bytes {
            return Ok(false);
        }
        let target = growth_target(bytes, self.staged_bytes, self.max_bytes);
        let policy = self.tracker.policy();
        let blocks = self.rank.layout().blocks as u32;
        let arenas = match arena_for(&mut self.plans, policy, blocks, target) {
            Ok(arena_bytes) => ArenaLayout { arena_bytes },
            Err(why) => {
                // Lowering is deterministic: every rank fails alike, before any collective.
                log::info!("{}: the arenas cannot grow: {why}", self.label);
                self.growth_refused = true;
                return Ok(false);
            }
        };
        let grown = grow(&mut self.rank, arenas, &mut self.grown_mappings);
        if grown.is_err() {
            self.growth_refused = true;
        }
        match grown? {
            Growth::Grown => {
                self.staged_bytes = target;
                log::info!(
                    "{}: the arenas grew to hold calls up to {} MiB ({} MiB more on device {}, at a call of {bytes} B)",
                    self.label,
                    target >> 20,
                    arenas.allocation_bytes() >> 20,
                    self.rank.device().ordinal
                );
                Ok(bytes <= target)
            }
            Growth::Refused { why } => {
                self.growth_refused = true;
                log::warn!(
                    "{}: the arenas stay at calls up to {} MiB ({why}): larger calls stay on NCCL",
                    self.label,
                    self.staged_bytes >> 20
                );
                Ok(false)
            }
        }
    }

    /// Reports NCCL's result for the call [`Ran::Ticketed`] handed it, run on `stream`: the
    /// communicator's next launch is ordered after NCCL's kernel too, not just after the
    /// ticket. Where a nonblocking communicator returned `ncclInProgress`, NCCL's helper thread
    /// may not have launched its kernel yet: the order is taken when the application reads
    /// `ncclSuccess` (NCCL requires it to, before anything else on the stream; see
    /// [`CudaComm::nccl_state`]). Does nothing when no ticket awaits NCCL.
    pub fn nccl_ran(&mut self, stream: cudaStream_t, code: ResultCode) {
        let Some(ticket) = self.ticket_awaits_nccl.take() else {
            return;
        };
        if code == ResultCode::IN_PROGRESS {
            // Ordered after the ticket now, and after NCCL's kernel once the application reads
            // success (`nccl_state`).
            if let Err(e) = self.order_after(stream) {
                log::warn!("{}: {e}; this rank gives the GPU engine up", self.label);
                self.rank.give_up();
                return;
            }
            self.order_pending = Some(stream);
            return;
        }
        if code != ResultCode::SUCCESS {
            // NCCL failed the call: this rank's later calls fail too, and its failure word
            // releases peers whose kernels would wait for it. The ticket stays covered by the
            // ordering event, which teardown waits on.
            let _ = self.order_after(stream);
            log::warn!(
                "{}: NCCL returned {} for a call it ran; this rank gives the GPU engine up",
                self.label,
                code.0
            );
            self.rank.give_up();
            return;
        }
        if let Err(e) = self.end_and_order_after(ticket, stream) {
            log::warn!("ncclAllReduce on {}: {e}", self.label);
            self.rank.give_up();
        }
    }

    /// The real NCCL state the application just read (`ncclCommGetAsyncError`), or that was
    /// read after one of its calls went to NCCL. On `ncclSuccess`, a call NCCL was still
    /// launching is now queued: the next launch is ordered after it; on an error, this rank is
    /// given up, so that peers still running calls on StragglAR stop waiting for it. Never
    /// synchronises (a stream may be capturing).
    pub fn nccl_state(&mut self, state: ResultCode) {
        if state == ResultCode::IN_PROGRESS {
            return;
        }
        if state != ResultCode::SUCCESS {
            self.rank.give_up();
            return;
        }
        // The call's end kernel is not queued now: whatever the stream ran since NCCL's kernel
        // (and the time until the application asked) would count in the call's time. The call
        // is published as unmeasured; only the order is taken.
        let Some(forwarded_on) = self.order_pending.take() else {
            return;
        };
        // Where the stream began a capture since, the order is dropped: the next launch stays
        // ordered after the call's ticket only.
        // SAFETY: the application's stream of the forwarded call, which NCCL's contract keeps
        // valid until the application has seen that call succeed.
        match unsafe { driver::capture_of(self.rank.device(), forwarded_on.cast()) } {
            Ok(Capture::None) => {
                if let Err(e) = self.order_after(forwarded_on) {
                    log::warn!("{}: {e}", self.label);
                    self.rank.give_up();
                }
            }
            _ => log::debug!("{}: a forwarded call's order was not taken", self.label),
        }
    }

    /// Queues the end kernel of a measured call NCCL ran on `stream` (the call's end, for its
    /// post-arrival time and span; the collection of waiting records), and orders this
    /// communicator's next launch after the call. A call outside the sample queues nothing.
    fn end_and_order_after(
        &mut self,
        ticket: Ticket,
        stream: cudaStream_t,
    ) -> Result<(), CallError> {
        let ended = match ticket.measured() {
            // SAFETY: the caller's live stream of this device, with NCCL's kernel of the call
            // queued on it; not capturing (an eager call's, checked where it was taken).
            true => unsafe { self.rank.ticket_end(ticket, stream.cast()) },
            false => Ok(()),
        };
        // Ordered after the call whatever happened to its end kernel.
        self.order_after(stream)?;
        ended
    }

    /// Orders this communicator's next launch after everything queued on `stream` so far.
    fn order_after(&mut self, stream: cudaStream_t) -> Result<(), CallError> {
        // SAFETY: the caller's live stream of this device.
        unsafe { self.last.record_raw(stream.cast()) }?;
        self.last_stream = stream;
        Ok(())
    }

    /// Captures one call into the caller's graph as a graph launch, whose every replay chooses
    /// its plan on the GPU from the records of earlier replays (`crate::gpu::choice`).
    ///
    /// Where every rank can put NCCL's work behind a conditional node (`super::branch`: CUDA
    /// 12.3 on, NCCL the baseline), the replays choose between StragglAR and NCCL's own work
    /// for the call, captured apart here ([`CudaComm::capture_or_nccl`]). Otherwise the
    /// baseline of the replays is our Ring, and the call stays on NCCL (captured as usual, so
    /// its replays run NCCL's work: NVLS where NCCL runs it) when NCCL is the baseline and the
    /// policy does not prefer StragglAR for this call now (no straggler designated for its
    /// size, or a lead that does not pay; under a fixed `STRAGGLAR_ALGO=stragglar` it always
    /// does). Either way it stays on NCCL when the plans are not uploaded (no allocation while
    /// capturing; they are, from the first call outside capture on) or do not fit the arenas.
    /// All of it follows from the settings, the setup and the eager calls so far: the same on
    /// every rank.
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce`].
    unsafe fn capture(
        &mut self,
        operands: Operands,
        stream: cudaStream_t,
        capture: Capture,
        nccl: &dyn Fn(cudaStream_t) -> ResultCode,
    ) -> Result<Result<Ran, CallError>, Decline> {
        if self.rank.control().aborted() {
            // A rank given up captures nothing: NCCL captured here while its peers captured our
            // kernel (their arenas may have grown where this rank's did not) would leave their
            // replays waiting in NCCL.
            return Ok(Err(CallError::Failed(STATUS_ABORTED)));
        }
        let bytes = operands.count * operands.dtype.size();
        // Every capture of a size class runs the finish its first capture took: the device keeps
        // one set of StragglAR times per class, which must be one finish's (alike on every rank:
        // captures come in the same order everywhere). Whether to leave NCCL is asked of that
        // finish too.
        let class = crate::detect::size_class(bytes);
        let pinned = self.graph_finishes.get(&class).copied();
        let branch = self.baseline == Baseline::Nccl && self.rank.has_branch();
        if self.baseline == Baseline::Nccl
            && !branch
            && !self.tracker.prefers_stragglar(bytes, pinned)
        {
            return Err(Decline::PolicyNccl);
        }
        let policy = self.tracker.policy();
        if !self.rank.has_choices() {
            return Err(Decline::CapturingBeforeSetup);
        }
        let finish = pinned.unwrap_or_else(|| self.tracker.class_finish(bytes));
        if let Err(e) = self
            .rank
            .choices_fit(operands.count, operands.dtype, finish)
        {
            // The arenas grow at eager calls only (a capture allocates nothing): the call stays
            // on NCCL, alike on every rank (the arenas are agreed).
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                log::info!(
                    "a captured ncclAllReduce of {bytes} B stays on NCCL: {e} (the arenas grow at eager calls only; logged once)"
                );
            }
            return Err(Decline::AboveStaging);
        }
        let rule = RawRule::of_finish(policy, bytes, finish);
        let id = match capture {
            Capture::Id(id) => Some(id),
            _ => None,
        };
        let result = if branch {
            // NCCL's turn is timed on the sample and where the measuring rule needs a time (the
            // end kernel behind its own conditional node), StragglAR's at every replay: the
            // device rule chooses on measured times.
            // SAFETY: as the caller vouches.
            unsafe { self.capture_or_nccl(operands, stream, id, rule.measuring(), finish, nccl) }
        } else {
            let raw = stream.cast();
            // SAFETY: as the caller vouches.
            unsafe {
                self.captured_in_order(stream, id, |rank| {
                    rank.all_reduce_graph(operands, raw, rule.measuring(), finish)
                })
            }
        };
        match result {
            Ok(Ran::Captured) => {
                self.captured += 1;
                self.graph_finishes.entry(class).or_insert(finish);
            }
            Ok(_) => {}
            // Its peers' graphs hold this call: their replays must not wait for this rank.
            Err(_) => self.rank.give_up(),
        }
        Ok(result)
    }

    /// Captures NCCL's work for the call apart and, where it can go behind a conditional node,
    /// a graph launch whose replays choose between StragglAR and that work; otherwise the work
    /// as it is (logged once), and every replay of it runs NCCL.
    ///
    /// # Safety
    /// As [`CudaComm::all_reduce`].
    unsafe fn capture_or_nccl(
        &mut self,
        operands: Operands,
        stream: cudaStream_t,
        id: Option<u64>,
        rule: RawRule,
        finish: Finish,
        nccl: &dyn Fn(cudaStream_t) -> ResultCode,
    ) -> Result<Ran, CallError> {
        // SAFETY: `nccl` queues this call's NCCL work on this device, as the caller vouches.
        let mut work = match unsafe { self.rank.capture_nccl_apart(nccl) } {
            Ok(work) => work,
            Err(BranchError::Nccl(code)) => return Err(CallError::Nccl(code)),
            Err(BranchError::Gpu(e)) => return Err(e.into()),
        };
        let raw = stream.cast();
        let qualified = work.qualified();
        self.branch_captures += 1;
        let capture = self.branch_captures;
        let work_ref = &work;
        let mut behind = Ok(());
        // SAFETY: as the caller vouches; `work` is this call's.
        unsafe {
            self.captured_in_order(stream, id, |rank| {
                behind = rank.all_reduce_graph_or_nccl(
                    operands, raw, rule, finish, work_ref, &qualified, capture,
                )?;
                Ok(())
            })
        }?;
        let ran = match behind {
            Ok(()) => Ran::Captured,
            Err(why) => {
                static SAID: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    log::info!(
                        "{}: a captured ncclAllReduce replays NCCL's work only: {why} (logged once)",
                        self.label
                    );
                }
                Ran::CapturedNccl
            }
        };
        self.nccl_work.push(work);
        Ok(ran)
    }

    /// Captures `launch`'s work on `stream` between the communicator's ordering events: after
    /// its latest launch as of each replay (an eager call, another replay), before its next
    /// one, and after its previous captured launch on another stream of the same capture.
    ///
    /// # Safety
    /// `stream` is the caller's capturing stream of this device.
    unsafe fn captured_in_order(
        &mut self,
        stream: cudaStream_t,
        id: Option<u64>,
        launch: impl FnOnce(&mut CudaRank) -> Result<(), CallError>,
    ) -> Result<Ran, CallError> {
        let raw = stream.cast();
        if let (Some(id), Some((previous, other))) = (id, self.captured_stream) {
            if previous == id && other != stream {
                // SAFETY: the caller's capturing stream; the event was recorded in this
                // capture.
                unsafe { self.captured_last.wait_on(raw) }?;
            }
        }
        // Every replay follows this communicator's latest launch as of the replay (an
        // eager call, another replay) and is what the next eager launch follows: the
        // graph's own event nodes, no kernel waiting on another stream's. Eager calls and
        // replays share the epoch and its parity, so two of them must never overlap.
        // SAFETY: the caller's capturing stream; `last` is this communicator's event.
        unsafe { self.last.wait_external(raw) }?;
        launch(&mut self.rank)?;
        // SAFETY: as above.
        unsafe { self.last.record_external(raw) }?;
        if let Some(id) = id {
            // SAFETY: as above.
            unsafe { self.captured_last.record_raw(raw) }?;
            self.captured_stream = Some((id, stream));
        }
        Ok(Ran::Captured)
    }

    /// Uploads, at the communicator's first call outside capture, every plan a graph launch
    /// may pick (StragglAR with each straggler, and Ring), for every size and every finish a
    /// call up to [`CommParts::max_bytes`] may run (each pipeline depth, and the multicast
    /// finish where the communicator has a region): capture allocates nothing, and
    /// eager calls use the same blobs. Done alike on every rank: the plans follow from the
    /// rank count and the settings. If they cannot be built, captured calls stay on NCCL.
    fn prepare_choices(&mut self, operands: Operands) -> Result<(), CallError> {
        if self.unbuildable || self.rank.has_choices() {
            return Ok(());
        }
        let policy = self.tracker.policy();
        let ranks = policy.ranks();
        let mut sets = Vec::new();
        for finish in policy.finishes_up_to(self.max_bytes) {
            let mut plans = Vec::with_capacity(ranks + 1);
            for choice in 0..=ranks {
                let shape = Shape::of_choice(ranks, choice, operands.dtype).with_finish(finish);
                match self.plans.lowered(shape) {
                    Ok(plan) => plans.push(plan.clone()),
                    Err(why) => {
                        // Not tried again: the same plans fail alike on every rank, every time.
                        log::info!("{}: graphs stay on NCCL: {why}", self.label);
                        self.unbuildable = true;
                        return Ok(());
                    }
                }
            }
            sets.push((finish, plans));
        }
        for (finish, plans) in &sets {
            let plans: Vec<&Lowered> = plans.iter().collect();
            self.rank.prepare_choices(&plans, *finish)?;
        }
        Ok(())
    }

    /// Feeds the tracker every due record (waiting for them) and logs designation changes
    /// (rank 0 says it; every rank sees the same change).
    fn feed_due_records(&mut self) -> Result<(), CallError> {
        let index = self.rank.index();
        let CudaComm {
            rank,
            tracker,
            designated,
            trace,
            untraced,
            label,
            ..
        } = self;
        let waited = rank.feed_due(tracker, |record, observed| {
            designated.store(
                observed.designated.map_or(-1, |r| r as i64),
                Ordering::Relaxed,
            );
            trace_call(trace, untraced, record, observed.designated, label);
            if let (Some(before), 0) = (observed.changed, index) {
                let who = |r: Option<usize>| r.map_or("none".to_string(), |r| format!("rank {r}"));
                log::info!(
                    "{label}: designated straggler for sizes 2^{} B changed from {} to {} at call {}",
                    observed.class,
                    who(before),
                    who(observed.designated),
                    observed.call
                );
            }
        })?;
        self.record_waits += waited;
        Ok(())
    }

    /// Logs the straggler report at INFO (a table per communicator; see `ArrivalTally::table`).
    fn log_report(&self) {
        if self.tracker.calls() > 0 {
            log::info!(
                "{}: straggler report\n{}",
                self.label,
                self.tracker.table(&self.members).trim_end()
            );
        }
    }

    /// Logs the report when `STRAGGLAR_REPORT_INTERVAL` seconds passed since the last one (0:
    /// only at destroy).
    fn maybe_log_report(&mut self) {
        let seconds = crate::config::get().report_interval_s;
        let interval = Duration::from_secs(seconds);
        if seconds > 0
            && log::log_enabled!(log::Level::Info)
            && self.reported_at.elapsed() >= interval
        {
            self.reported_at = Instant::now();
            self.log_report();
        }
    }

    /// Raises the abort word (every kernel of this rank gives up, nothing waits for them) and
    /// closes the trace (made valid JSON). While a kernel of this rank may still be running,
    /// or where the driver cannot say (its context lost), this rank is also marked failed
    /// from the host, so that peers waiting for its part stop (a kernel that sees the abort
    /// marks it too, but a lost context runs none).
    pub fn abort(&mut self) {
        self.rank.abort();
        if !self.kernels_finished() {
            self.rank.mark_failed();
        }
        self.trace = None;
    }

    /// Whether this rank's kernels of this communicator have all finished (the ordering event
    /// recorded after its last launch is complete).
    pub fn kernels_finished(&self) -> bool {
        self.last.is_complete()
    }

    /// Closes this rank's mappings of every peer's staging, then says so in host memory (the
    /// word beside its failure word): this rank will never touch them again (its kernels must
    /// have finished), and each peer may free its own once every rank said it. Where a close
    /// failed (a lost context keeps its mappings) it says nothing, and its peers keep their
    /// staging allocated.
    pub fn release_peers(&mut self) {
        self.mappings.clear();
        self.grown_mappings.clear();
        self.rank.say_released();
    }

    /// Whether every peer has closed its mapping of this rank's staging: it may be freed.
    pub fn released_by_every_peer(&self) -> bool {
        let index = self.rank.index();
        (0..self.members.len())
            .filter(|&peer| peer != index)
            .all(|peer| self.rank.peer_released(peer))
    }

    /// Waits (at most until `deadline`, polling every millisecond) until every peer has closed
    /// its mapping of this rank's staging; whether they all have.
    pub fn wait_released_by_every_peer(&self, deadline: Instant) -> bool {
        while !self.released_by_every_peer() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Waits (at most until `deadline`) until every peer has finished reading this rank's
    /// staging: every eager call of this rank has run, every peer has run as many calls as this
    /// rank did, and rank 0's arrival board has settled (a waiting ticket reads every rank's
    /// failure word). Then logs the report and what graph replays chose, waits for this
    /// rank's own kernels of this communicator (as NCCL's teardown waits for its own: the free
    /// that follows must not rely on `cuMemFree` waiting, which the driver does not promise),
    /// and releases the peers' staging. The caller frees the staging by dropping `self`.
    /// A rank whose own staging cannot be read because its GPU context is lost (a fault made
    /// every later driver call fail) marks itself failed first: its kernels will never tell
    /// the peers that still wait for them, and a destroy, unlike an abort, marks nothing else.
    pub fn drain(&mut self, deadline: Instant) {
        self.log_report();
        let layout = self.rank.layout();
        let launched = self.launched as u32;
        let behind = |a: u32, b: u32| b.wrapping_sub(a) as i32 > 0;
        // Read afresh on every pass, since this rank's own calls may still be finishing; graph
        // replays may have advanced its epoch beyond its eager launches.
        let drained = || {
            let Ok(own) = self.rank.staging().read_u32(layout.epoch()) else {
                if self.rank.device().context_lost() {
                    self.rank.mark_failed();
                }
                return true;
            };
            let target = if behind(launched, own) { own } else { launched };
            !behind(own, launched)
                && self.mappings.iter().flatten().all(|m| {
                    m.read_u32(layout.epoch())
                        .map_or(true, |peer| !behind(peer, target))
                })
        };
        while !drained() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        while !self.rank.board_settled() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.captured > 0 {
            if let Some(counts) = self.rank.graph_counts() {
                let last = match counts.last_straggler {
                    Some(rank) => {
                        format!("the last on StragglAR with rank {rank} as the straggler")
                    }
                    None => "the last on the baseline".into(),
                };
                let baseline = match self.rank.has_branch() {
                    true => "NCCL's own work",
                    false => "Ring where it fits the staging",
                };
                log::info!(
                    "{}: {} calls captured into graphs; their replays chose on the GPU: {} StragglAR, {} the baseline ({baseline}); {last}; {} post-arrival times of the baseline taken",
                    self.label,
                    self.captured,
                    counts.stragglar,
                    counts.baseline,
                    self.rank.graph_baseline_timed().unwrap_or(0)
                );
            }
        }
        // The last launch, eager or replayed, recorded `last`: once it completed, nothing of
        // this rank touches its own or its peers' staging.
        if let Err(e) = self.last.synchronize() {
            log::warn!("{}: {e} while waiting for its kernels", self.label);
        }
        // Peers that aborted wait for this rank's release before they free their staging.
        self.release_peers();
    }
}

/// Orders an eager launch on `stream` after the communicator's last launch (`last`, made on
/// `last_stream`): calls on different streams are ordered by the event; once graphs hold
/// calls of the communicator (`captured`), on the same stream too, since a replay on any
/// stream records the event (see `CudaComm::capture`).
fn follow_last_launch(
    last: &Event,
    last_stream: &mut cudaStream_t,
    captured: u64,
    stream: cudaStream_t,
) -> Result<(), CallError> {
    if stream != *last_stream || captured > 0 {
        // SAFETY: both are the caller's live streams of this device.
        unsafe { last.wait_on(stream.cast()) }?;
        *last_stream = stream;
    }
    Ok(())
}

/// Writes the trace event of the call whose record was just read (its host enqueue time: the
/// GPU-side duration is not measured), with the record and the designation after it.
fn trace_call(
    trace: &mut Option<TraceWriter>,
    untraced: &mut VecDeque<(f64, u64, Option<usize>)>,
    timed: &TimedRecord,
    designated: Option<usize>,
    label: &str,
) {
    let Some((start_us, bytes, straggler)) = untraced.pop_front() else {
        return;
    };
    let Some(writer) = trace else {
        return;
    };
    let event = CallEvent {
        start_us,
        duration_us: 0.0,
        bytes,
        algorithm: if straggler.is_some() {
            "stragglar"
        } else {
            "nccl"
        },
        straggler,
        last_rank: Some(timed.record.last_rank),
        lead_us: timed.record.lead_ns.map(|ns| ns as f64 / 1e3),
        designated,
        post_us: timed.post_ns.map(|ns| ns as f64 / 1e3),
    };
    if let Err(e) = writer.call(&event) {
        log::warn!("{}: {e}; tracing of {label} stops", writer.path().display());
        *trace = None;
    }
}
