//! One rank of a host-engine communicator: joining, and running AllReduce calls.

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::fault::{Fault, FaultPhase};
use super::link::{sleep_until, LinkModel};
use super::segment::{segment_name, unlink, Segment, SegmentLayout};
use super::wait::{publish, Liveness, WaitError, Watch};
use crate::clock::now_ns;
use crate::nccl::types::ResultCode;
use crate::plan::{Plan, Step, Turn, ValueRef};
use crate::reduce::{combine, finish, prescale, ReduceOp, Scale};

/// How one rank joins a communicator. Every field but `rank` is identical on every rank.
#[derive(Debug, Clone)]
pub struct HostCommConfig {
    /// Names the shared segments; unique per communicator.
    pub comm_id: u64,
    pub rank: usize,
    pub ranks: usize,
    pub layout: SegmentLayout,
    /// Per-call deadline (`STRAGGLAR_TIMEOUT_MS`); `None` waits forever, as NCCL does.
    pub timeout: Option<Duration>,
    /// How long joining may take before it fails.
    pub setup_timeout: Duration,
    pub link: LinkModel,
}

/// Why an engine call failed. After a failure during a call the communicator is unusable:
/// later calls fail at once with the same error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// Joining failed (a peer never came, shared memory could not be made).
    Setup(String),
    /// The plan does not fit the segments (bytes or flags); split the call or forward it.
    TooLarge { needed: usize, available: usize },
    /// The call's arguments do not match the plan.
    Mismatch(String),
    /// A wait gave up.
    Wait(WaitError),
}

impl EngineError {
    /// The NCCL code a caller reports.
    pub fn nccl_code(&self) -> ResultCode {
        match self {
            EngineError::Setup(_)
            | EngineError::Wait(WaitError::Timeout)
            | EngineError::Wait(WaitError::Aborted) => ResultCode::SYSTEM_ERROR,
            EngineError::TooLarge { .. } | EngineError::Mismatch(_) => ResultCode::INVALID_USAGE,
            EngineError::Wait(WaitError::PeerDied(_))
            | EngineError::Wait(WaitError::PeerFailed(_)) => ResultCode::REMOTE_ERROR,
        }
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Setup(why) => write!(f, "setup failed: {why}"),
            EngineError::TooLarge { needed, available } => {
                write!(f, "needs {needed} bytes of staging, {available} available")
            }
            EngineError::Mismatch(why) => write!(f, "call does not match its plan: {why}"),
            EngineError::Wait(WaitError::Aborted) => write!(f, "aborted"),
            EngineError::Wait(WaitError::PeerFailed(r)) => write!(f, "rank {r} aborted or failed"),
            EngineError::Wait(WaitError::PeerDied(r)) => write!(f, "rank {r} exited"),
            EngineError::Wait(WaitError::Timeout) => write!(f, "timed out (STRAGGLAR_TIMEOUT_MS)"),
        }
    }
}

impl std::error::Error for EngineError {}

/// The caller's buffers of one call.
pub enum Buffers<'a> {
    /// Input and output are the same buffer.
    InPlace(&'a mut [u8]),
    /// Separate input and output, of equal length.
    OutOfPlace {
        input: &'a [u8],
        output: &'a mut [u8],
    },
}

impl Buffers<'_> {
    fn input(&self) -> &[u8] {
        match self {
            Buffers::InPlace(b) => b,
            Buffers::OutOfPlace { input, .. } => input,
        }
    }

    fn output(&mut self) -> &mut [u8] {
        match self {
            Buffers::InPlace(b) => b,
            Buffers::OutOfPlace { output, .. } => output,
        }
    }
}

/// Arrivals of one call and this rank's finish (CLOCK_MONOTONIC ns), summarised without
/// allocating: the last two arrivals and who made the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRecord {
    /// The last arrival.
    pub last_arrival: u64,
    /// The second-to-last arrival.
    pub second_last_arrival: u64,
    /// The rank that arrived last (the highest rank on a tie).
    pub last_rank: usize,
    /// When this rank finished.
    pub finished: u64,
    /// The previous call's post-arrival time: from its last arrival to the finish of the rank
    /// that made it, nanoseconds: the time the critical path spends in the call. (The other
    /// ranks may finish later; had they waited at the next call, the last rank's lead
    /// shrinks, which the next call's own time shows.) Every rank finished that call before
    /// arriving at this one, so once this call is complete every rank reads the same value.
    /// `None` for the first call.
    pub previous_post_ns: Option<u64>,
    /// The engine calls the message ran as (1; more when a message larger than the staging
    /// runs in parts, see `runner::all_reduce`, whose record is the first part's).
    pub parts: usize,
}

impl CallRecord {
    /// Summarises per-rank arrival times.
    pub fn from_arrivals(arrivals: impl Iterator<Item = u64>, finished: u64) -> Self {
        let mut record = CallRecord {
            last_arrival: 0,
            second_last_arrival: 0,
            last_rank: 0,
            finished,
            previous_post_ns: None,
            parts: 1,
        };
        for (rank, t) in arrivals.enumerate() {
            if t >= record.last_arrival {
                record.second_last_arrival = record.last_arrival;
                record.last_arrival = t;
                record.last_rank = rank;
            } else if t > record.second_last_arrival {
                record.second_last_arrival = t;
            }
        }
        record
    }

    /// The last arrival minus the second-to-last: the time that can hide the ReduceScatter.
    pub fn lead_ns(&self) -> u64 {
        self.last_arrival - self.second_last_arrival
    }

    /// Time from the last arrival to this rank's finish.
    pub fn after_last_arrival_ns(&self) -> u64 {
        self.finished.saturating_sub(self.last_arrival)
    }
}

/// The most operands one combine step takes: the direct-pull ReduceScatter reads `n-1`.
pub const MAX_OPERANDS: usize = 256;

/// One read of a peer's value within a call.
#[derive(Clone, Copy)]
struct Read {
    source: ValueRef,
    /// The fingerprint of this rank's plan; the source must run the same.
    plan: u64,
    /// The call's parity and flag value.
    parity: usize,
    epoch: u32,
    turn: Turn,
    /// Whether the value's producer pushed it into this rank (see `Plan::delivery`).
    pushed: bool,
}

/// The ranks `value` is pushed into when it is made (see `Plan::delivery`): none unless the
/// plan is multicast.
fn pushed_to(plan: &Plan, value: ValueRef) -> &[usize] {
    plan.delivery
        .as_ref()
        .map_or(&[], |d| d.pushed_to[value.rank][value.id].as_slice())
}

/// One rank of a host-engine communicator.
pub struct HostComm {
    config: HostCommConfig,
    /// Every rank's segment, by rank.
    segments: Vec<Segment>,
    liveness: Vec<Liveness>,
    /// Calls run so far (the epoch of the last call).
    epoch: u64,
    /// Set by the first failed call.
    failed: Option<EngineError>,
    /// The previous call's last arrival (CLOCK_MONOTONIC ns) and the rank that made it, for
    /// its post-arrival time.
    previous_last_arrival: Option<(u64, usize)>,
    /// A fault to inject (reliability tests and `stragglar bench --fault`).
    fault: Option<Fault>,
}

/// The flag value of call `epoch`: never 0 (the value of a flag nobody wrote).
fn flag_value(epoch: u64) -> u32 {
    ((epoch - 1) % u32::MAX as u64) as u32 + 1
}

impl HostComm {
    /// Joins the communicator: creates this rank's segment, maps every peer's, waits until all
    /// ranks have, then removes this rank's name from /dev/shm (the memory lives on in the
    /// mappings, so nothing is left behind however the processes end).
    pub fn join(config: HostCommConfig) -> Result<HostComm, EngineError> {
        let own_name = segment_name(config.comm_id, config.rank);
        let pid = std::process::id() as i32;
        let own = Segment::create(&own_name, config.layout, pid)
            .map_err(|e| EngineError::Setup(format!("create {own_name}: {e}")))?;
        let result = Self::attach(&config, own);
        unlink(&own_name);
        result
    }

    fn attach(config: &HostCommConfig, own: Segment) -> Result<HostComm, EngineError> {
        let deadline = Instant::now() + config.setup_timeout;
        let mut own = Some(own);
        let mut segments = Vec::with_capacity(config.ranks);
        for rank in 0..config.ranks {
            if rank == config.rank {
                segments.push(own.take().expect("own segment"));
                continue;
            }
            let name = segment_name(config.comm_id, rank);
            let peer = loop {
                match Segment::open(&name, config.layout) {
                    Ok(Some(segment)) => break segment,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Ok(None) => {
                        return Err(EngineError::Setup(format!(
                            "rank {rank} did not join in time"
                        )))
                    }
                    Err(e) => return Err(EngineError::Setup(format!("open {name}: {e}"))),
                }
            };
            peer.header().attached.fetch_add(1, Ordering::AcqRel);
            segments.push(peer);
        }
        segments[config.rank]
            .header()
            .ready
            .store(1, Ordering::Release);
        for (rank, segment) in segments.iter().enumerate() {
            while segment.header().ready.load(Ordering::Acquire) == 0 {
                if Instant::now() >= deadline {
                    return Err(EngineError::Setup(format!(
                        "rank {rank} did not become ready in time"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let liveness = segments
            .iter()
            .map(|s| Liveness::watch(s.header().pid.load(Ordering::Acquire)))
            .collect();
        Ok(HostComm {
            config: config.clone(),
            segments,
            liveness,
            epoch: 0,
            failed: None,
            previous_last_arrival: None,
            fault: None,
        })
    }

    /// Makes this rank misbehave as `fault` says (tests and benchmarks only).
    pub fn inject(&mut self, fault: Fault) {
        self.fault = Some(fault);
    }

    /// Triggers the injected fault if it is due at this point of the current call.
    fn maybe_fault(&self, at_arrival: bool, step: Option<&Step>) -> Result<(), EngineError> {
        let Some(fault) = self.fault.filter(|f| f.call == self.epoch) else {
            return Ok(());
        };
        let due = match step {
            None => at_arrival && fault.phase == FaultPhase::Arrival,
            Some(step) => fault.phase.matches(step),
        };
        if !due {
            return Ok(());
        }
        fault.signal_self();
        self.abort();
        Err(EngineError::Wait(WaitError::Aborted))
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.config.rank
    }

    /// The calls this rank has entered, counted as `Fault::call` counts: during a call, the
    /// number of that call; between calls, of the last one (a call refused by its argument
    /// checks is not entered).
    pub fn calls(&self) -> u64 {
        self.epoch
    }

    /// Raises this rank's abort word: its own waits and every peer's wait on it give up within
    /// a few milliseconds. Safe to call from any thread holding a shared reference.
    pub fn abort(&self) {
        let header = self.segments[self.config.rank].header();
        header.abort.store(1, Ordering::Release);
    }

    /// Emulates links as `link` from the next call on. Every rank must set the same link for
    /// the same call (the ports' emulated state is shared).
    pub fn set_link(&mut self, link: LinkModel) {
        self.config.link = link;
    }

    /// Runs one AllReduce of `plan`. `scale` is this rank's copy-in scaling. Returns the call's
    /// arrival record; a call with zero elements returns `None` at once and does not count as a
    /// call (no record: nobody arrived anywhere).
    pub fn all_reduce(
        &mut self,
        plan: &Plan,
        op: ReduceOp,
        scale: Scale,
        mut buffers: Buffers<'_>,
    ) -> Result<Option<CallRecord>, EngineError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        self.check(plan, &buffers)?;
        if plan.count == 0 {
            return Ok(None);
        }
        self.epoch += 1;
        let parity = (self.epoch % 2) as usize;
        let header = self.segments[self.config.rank].header();
        header.served[parity].store(0, Ordering::Release);
        header.plan[parity].store(plan.fingerprint, Ordering::Release);
        header.arrival[parity].store(now_ns(), Ordering::Release);
        let result = self.run(plan, op, scale, &mut buffers, parity);
        match result {
            Ok(()) => {
                let own = self.segments[self.config.rank].header();
                own.finished.store(self.epoch, Ordering::Release);
                let arrivals = self
                    .segments
                    .iter()
                    .map(|s| s.header().arrival[parity].load(Ordering::Acquire));
                let mut record = CallRecord::from_arrivals(arrivals, now_ns());
                // Every peer stored its finish of the previous call before its arrival at this
                // one, which the loads above acquired.
                record.previous_post_ns = self.previous_last_arrival.map(|(last, rank)| {
                    self.segments[rank].header().finish_time[1 - parity]
                        .load(Ordering::Acquire)
                        .saturating_sub(last)
                });
                own.finish_time[parity].store(record.finished, Ordering::Release);
                self.previous_last_arrival = Some((record.last_arrival, record.last_rank));
                Ok(Some(record))
            }
            Err(error) => {
                self.abort();
                self.failed = Some(error.clone());
                Err(error)
            }
        }
    }

    fn check(&self, plan: &Plan, buffers: &Buffers<'_>) -> Result<(), EngineError> {
        if plan.ranks != self.config.ranks || plan.ranks > MAX_OPERANDS {
            return Err(EngineError::Mismatch(format!(
                "plan for {} ranks",
                plan.ranks
            )));
        }
        let bytes = plan.count * plan.dtype.size();
        let lengths_match = match buffers {
            Buffers::InPlace(b) => b.len() == bytes,
            Buffers::OutOfPlace { input, output } => input.len() == bytes && output.len() == bytes,
        };
        if !lengths_match {
            return Err(EngineError::Mismatch(format!(
                "buffers are not {bytes} bytes"
            )));
        }
        let layout = self.config.layout;
        if plan.max_arena_bytes() > layout.arena_bytes {
            return Err(EngineError::TooLarge {
                needed: plan.max_arena_bytes(),
                available: layout.arena_bytes,
            });
        }
        if plan.max_values() > layout.flags_per_bank {
            return Err(EngineError::TooLarge {
                needed: plan.max_values(),
                available: layout.flags_per_bank,
            });
        }
        Ok(())
    }

    /// A value's bytes in its owner's arena of `parity`.
    ///
    /// # Safety
    /// The value must be kept (it has an offset) and published for this call, and nobody may
    /// write it during the borrow: the protocol's single assignment guarantees both once its
    /// flag holds this call's epoch.
    unsafe fn value_bytes(&self, plan: &Plan, parity: usize, value: ValueRef) -> &[u8] {
        let slot = plan.programs[value.rank].values[value.id];
        let offset = slot.offset.expect("a read value is kept");
        let len = plan.chunk_bytes(slot.chunk).len();
        // SAFETY: offset + len lies inside the arena (the plan fits, checked in `check`); the
        // caller guarantees no concurrent writer.
        unsafe {
            std::slice::from_raw_parts(self.segments[value.rank].arena(parity).add(offset), len)
        }
    }

    /// This rank's own slot for `value`, to write.
    ///
    /// # Safety
    /// Only the step producing `value` may call this, before publishing it; no peer reads the
    /// slot before the publication.
    #[allow(clippy::mut_from_ref)]
    unsafe fn own_slot(&self, plan: &Plan, parity: usize, id: usize, offset: usize) -> &mut [u8] {
        let rank = self.config.rank;
        let len = plan.chunk_bytes(plan.programs[rank].values[id].chunk).len();
        // SAFETY: inside the arena (checked in `check`); exclusive per the caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(self.segments[rank].arena(parity).add(offset), len)
        }
    }

    /// Waits for `source` (and, for an ordered read, for its turn on the source's send port)
    /// and pays its emulated transfer; nothing for this rank's own values.
    fn fetch(&self, watch: &Watch<'_>, read: Read, bytes: usize) -> Result<(), EngineError> {
        if read.source.rank == self.config.rank {
            return Ok(());
        }
        let peer = &self.segments[read.source.rank];
        watch
            .until(peer.flag(read.parity, read.source.id), read.epoch)
            .map_err(EngineError::Wait)?;
        if peer.header().plan[read.parity].load(Ordering::Acquire) != read.plan {
            return Err(EngineError::Mismatch(format!(
                "rank {} runs another plan in this call (ranks chose differently)",
                read.source.rank
            )));
        }
        if let Some(turn) = read.turn {
            watch
                .until(&peer.header().served[read.parity], turn as u32)
                .map_err(EngineError::Wait)?;
        }
        let link = self.config.link;
        // A pushed value was paid for by its producer, before it raised the flag.
        if link.is_active() && !read.pushed {
            let own = self.segments[self.config.rank].header();
            let done = link.book(&peer.header().send_free_at, &own.recv_free_at, bytes);
            sleep_until(done);
        }
        Ok(())
    }

    /// Pays the emulated transfer of a value this rank made into the ranks it is pushed into
    /// (see `Plan::delivery`: one send reaching them all), before its flag is raised: the data
    /// then lies in every reader's memory when the reader sees the flag, as a push made before
    /// the reader's arrival, or a multicast store, would leave it.
    fn push(&self, plan: &Plan, value: usize, bytes: usize) {
        let rank = self.config.rank;
        let link = self.config.link;
        let to = pushed_to(plan, ValueRef { rank, id: value });
        if to.is_empty() || !link.is_active() {
            return;
        }
        let receivers = to.iter().map(|&r| &self.segments[r].header().recv_free_at);
        let done =
            link.book_multicast(&self.segments[rank].header().send_free_at, receivers, bytes);
        sleep_until(done);
    }

    /// Hands the source's send port to its next turn once an ordered read is done.
    fn served(&self, read: Read) {
        if let (Some(turn), true) = (read.turn, read.source.rank != self.config.rank) {
            publish(
                &self.segments[read.source.rank].header().served[read.parity],
                turn as u32 + 1,
            );
        }
    }

    fn run(
        &self,
        plan: &Plan,
        op: ReduceOp,
        scale: Scale,
        buffers: &mut Buffers<'_>,
        parity: usize,
    ) -> Result<(), EngineError> {
        let rank = self.config.rank;
        let epoch = flag_value(self.epoch);
        let own = &self.segments[rank];
        let watch = Watch {
            segments: &self.segments,
            liveness: &self.liveness,
            rank,
            deadline: self.config.timeout.map(|t| Instant::now() + t),
            epoch: self.epoch,
        };
        let program = &plan.programs[rank];
        self.maybe_fault(true, None)?;
        for step in &program.steps {
            self.maybe_fault(false, Some(step))?;
            match step {
                Step::CopyIn => {
                    for chunk in 0..plan.chunks.len() {
                        let range = plan.chunk_bytes(chunk);
                        let offset = program.values[chunk].offset.expect("IN values are kept");
                        // SAFETY: value `chunk` is this rank's IN chunk, produced by this step.
                        let slot = unsafe { self.own_slot(plan, parity, chunk, offset) };
                        slot.copy_from_slice(&buffers.input()[range.clone()]);
                        prescale(plan.dtype, scale, slot);
                        self.push(plan, chunk, range.len());
                        publish(own.flag(parity, chunk), epoch);
                    }
                }
                Step::Combine {
                    chunk,
                    sources,
                    out,
                    complete,
                    turn,
                } => {
                    let range = plan.chunk_bytes(*chunk);
                    let read = |source| Read {
                        source,
                        plan: plan.fingerprint,
                        parity,
                        epoch,
                        turn: *turn,
                        pushed: pushed_to(plan, source).contains(&rank),
                    };
                    for &source in sources {
                        self.fetch(&watch, read(source), range.len())?;
                    }
                    let mut operand_slots: [&[u8]; MAX_OPERANDS] = [&[]; MAX_OPERANDS];
                    for (slot, &s) in operand_slots.iter_mut().zip(sources) {
                        // SAFETY: every source was published for this call (waited above, or
                        // produced earlier by this rank).
                        *slot = unsafe { self.value_bytes(plan, parity, s) };
                    }
                    let operands = &operand_slots[..sources.len()];
                    match program.values[*out].offset {
                        Some(offset) => {
                            // SAFETY: this step produces `out`.
                            let slot = unsafe { self.own_slot(plan, parity, *out, offset) };
                            combine(plan.dtype, op, operands, slot);
                            if *complete {
                                finish(plan.dtype, op, plan.ranks, slot);
                                buffers.output()[range.clone()].copy_from_slice(slot);
                            }
                            self.push(plan, *out, range.len());
                            publish(own.flag(parity, *out), epoch);
                        }
                        None if !complete => {}
                        None => {
                            let target = &mut buffers.output()[range];
                            combine(plan.dtype, op, operands, target);
                            finish(plan.dtype, op, plan.ranks, target);
                        }
                    }
                    for &source in sources {
                        self.served(read(source));
                    }
                }
                Step::Copy {
                    chunk,
                    source,
                    out,
                    turn,
                } => {
                    let range = plan.chunk_bytes(*chunk);
                    let read = Read {
                        source: *source,
                        plan: plan.fingerprint,
                        parity,
                        epoch,
                        turn: *turn,
                        pushed: pushed_to(plan, *source).contains(&rank),
                    };
                    self.fetch(&watch, read, range.len())?;
                    // SAFETY: the source was published for this call.
                    let value = unsafe { self.value_bytes(plan, parity, *source) };
                    buffers.output()[range].copy_from_slice(value);
                    if let Some(offset) = program.values[*out].offset {
                        // SAFETY: this step produces `out`.
                        unsafe { self.own_slot(plan, parity, *out, offset) }.copy_from_slice(value);
                        publish(own.flag(parity, *out), epoch);
                    }
                    self.served(read);
                }
            }
        }
        Ok(())
    }
}
