//! One rank of a GPU-engine communicator: its staging allocation, its host-mapped abort and
//! status words, the table of every rank's memory as this rank addresses it, the plan blobs it
//! has uploaded (one per schedule, for every message size), its ring of arrival records, and
//! the launch of one AllReduce (eager, or captured into a graph with its plan chosen on the GPU)
//! or one ticket.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::args::{LaunchSite, Operands};
use super::driver::{Device, DeviceMemory, GpuError, HostWords, Kernels};
use super::staging::StagingLayout;
use crate::detect::{ArrivalRecord, Observed, Tracker};
use crate::gpu::arrival::{
    RawArrival, RawBoardSlot, RawRingEntry, RawTicket, BOARD_SLOTS, POST_UNMEASURED, RING_ENTRIES,
};
use crate::gpu::choice::{RawGraphState, RawRule};
use crate::gpu::launch::{
    RawPeer, MAX_THREADS, STATUS_ABORTED, STATUS_BAD_PLAN, STATUS_OK, STATUS_PEER_FAILED,
    STATUS_TIMEOUT, WARP_THREADS,
};
use crate::nccl::types::ResultCode;
use crate::plan::{ArenaNeed, Lowered};
use crate::reduce::DataType;

/// Ordered sends of one rank in a call must stay below this: a turn is 32 bits in the plan blob
/// and in the kernel's turn words (`RawStep::turn`, whose `NO_TURN` is `u32::MAX`; `sg_served`
/// in cuda/stragglar_allreduce.cu).
const MAX_SENDS: usize = u32::MAX as usize;

/// Index of the abort word among a rank's host words.
const ABORT_WORD: usize = 0;
/// Index of the status word.
const STATUS_WORD: usize = 1;

/// How one rank runs. Everything but `rank` is identical on every rank of a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankConfig {
    pub rank: usize,
    pub ranks: usize,
    pub layout: StagingLayout,
    /// The fixed grid of the communicator.
    pub blocks: u32,
    pub threads: u32,
    /// Per-wait deadline (`STRAGGLAR_TIMEOUT_MS`); `None` waits until aborted, as NCCL does.
    pub timeout: Option<Duration>,
    /// Remote reads keep their source's send order (`RawLaunch::ordered_reads`); the library
    /// always does, `stragglar bench --unordered-reads` does not, to compare.
    pub ordered_reads: bool,
}

/// Why a GPU-engine call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The driver refused something.
    Gpu(GpuError),
    /// The plan does not fit this communicator's staging or shape.
    Unfit(String),
    /// A kernel of this rank gave up (a `STATUS_*`); the communicator is unusable.
    Failed(u32),
}

impl CallError {
    /// The NCCL code a caller reports.
    pub fn nccl_code(&self) -> ResultCode {
        match self {
            CallError::Gpu(_) => ResultCode::UNHANDLED_CUDA_ERROR,
            CallError::Unfit(_) => ResultCode::INVALID_USAGE,
            CallError::Failed(STATUS_PEER_FAILED) => ResultCode::REMOTE_ERROR,
            CallError::Failed(STATUS_BAD_PLAN) => ResultCode::INTERNAL_ERROR,
            CallError::Failed(_) => ResultCode::SYSTEM_ERROR,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Gpu(e) => write!(f, "{e}"),
            CallError::Unfit(why) => write!(f, "{why}"),
            CallError::Failed(status) => write!(f, "{}", status_text(*status)),
        }
    }
}

/// What a kernel's `STATUS_*` means.
pub fn status_text(status: u32) -> &'static str {
    match status {
        STATUS_OK => "no error",
        STATUS_ABORTED => {
            "aborted (ncclCommAbort or ncclCommRevoke, or a launch or record of this rank that failed on the host)"
        }
        STATUS_TIMEOUT => "a wait exceeded STRAGGLAR_TIMEOUT_MS",
        STATUS_PEER_FAILED => "a peer rank failed",
        STATUS_BAD_PLAN => "the kernel was given a corrupt plan",
        _ => "unknown kernel status",
    }
}

impl std::error::Error for CallError {}

impl From<GpuError> for CallError {
    fn from(e: GpuError) -> Self {
        CallError::Gpu(e)
    }
}

/// A rank's abort and status words (host-mapped), shareable across threads.
#[derive(Clone)]
pub struct Control(Arc<super::driver::HostWords>);

impl Control {
    /// Raises the abort word.
    pub fn abort(&self) {
        self.0.word(ABORT_WORD).store(1, Ordering::Release);
    }

    /// The status a kernel of this rank left (0 while all is well).
    pub fn status(&self) -> u32 {
        self.0.word(STATUS_WORD).load(Ordering::Acquire)
    }

    /// Whether the abort word is raised.
    pub fn aborted(&self) -> bool {
        self.0.word(ABORT_WORD).load(Ordering::Acquire) != 0
    }
}

/// How long a host waits for a due arrival record before it says so in the log (it keeps
/// waiting: the record comes unless a rank is stuck, and then the abort word, which a watchdog
/// raises, releases it).
const RECORD_WAIT_WARN: Duration = Duration::from_secs(60);

/// The tag the kernels put in the high half of call `call`'s packed record words
/// (`sg_tag` in cuda/stragglar_arrival.h).
fn record_tag(call: u64) -> u64 {
    ((call % 0xffff_ffff) + 1) << 32
}

/// The plans graph launches choose among, for every size, in one allocation: the blobs, then
/// two tables of `u64[ranks + 1]` blob addresses, StragglAR with straggler `s` at `s` and the
/// baseline last: Ring in one, StragglAR with the last rank as the straggler in the other (for
/// sizes where Ring does not fit the staging).
struct ChoiceTables {
    /// Keeps the blobs and tables alive.
    _memory: DeviceMemory,
    /// Device addresses of the two tables.
    ring_last: u64,
    straggler_last: u64,
    /// What each StragglAR plan and Ring need of the staging.
    stragglar: Vec<ArenaNeed>,
    ring: ArenaNeed,
}

/// What a rank's graph launches chose, counted on its GPU (the same on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphCounts {
    /// Graph calls on StragglAR and on the Ring baseline.
    pub stragglar: u64,
    pub baseline: u64,
    /// The straggler of the latest graph call, `None` when it ran Ring (or none ran).
    pub last_straggler: Option<usize>,
}

/// A ticketed call's arrival record as this rank's ring holds it, with the call's
/// post-arrival time in nanoseconds (`None`: not measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedRecord {
    pub record: ArrivalRecord,
    pub post_ns: Option<u64>,
}

/// The arguments of a queued ticket kernel, for its end kernel ([`CudaRank::ticket_end`]).
#[derive(Debug, Clone, Copy)]
pub struct Ticket(RawTicket);

/// One rank of a GPU-engine communicator.
pub struct CudaRank {
    device: Arc<Device>,
    kernels: Arc<Kernels>,
    config: RankConfig,
    staging: DeviceMemory,
    words: Arc<HostWords>,
    /// `RawPeer[ranks]` in device memory, once connected.
    peer_table: Option<DeviceMemory>,
    /// Rank 0's arrival board as this rank addresses it, once connected.
    board: u64,
    /// `RawRingEntry[RING_ENTRIES]`, host-mapped: the records this rank's launches copy.
    ring: HostWords,
    /// Ticketed calls launched so far (the next one's number).
    arrivals: u64,
    /// Uploaded plan blobs: their device addresses by `Lowered::id`, in `blobs` or in the
    /// choice tables' allocation (both live as long as this rank). A blob serves every count.
    plans: HashMap<u64, u64>,
    blobs: Vec<DeviceMemory>,
    /// Rank 0's graph board as this rank addresses it, once connected.
    graph_board: u64,
    /// The plans graph launches choose among, by pieces per chunk of their StragglAR plans,
    /// once uploaded.
    choices: Vec<(usize, ChoiceTables)>,
}

impl CudaRank {
    /// Allocates and zeroes this rank's staging (synchronously: it is ready to be shared when
    /// this returns) and its host-mapped words.
    pub fn new(
        device: &Arc<Device>,
        kernels: &Arc<Kernels>,
        config: RankConfig,
    ) -> Result<CudaRank, GpuError> {
        assert!(
            (2 * WARP_THREADS..=MAX_THREADS).contains(&config.threads)
                && config.threads % WARP_THREADS == 0
                && config.blocks >= 1,
            "the kernel is built for whole warps, 2..={} of them per block (one for arrivals)",
            MAX_THREADS / WARP_THREADS
        );
        let staging = DeviceMemory::zeroed(device, config.layout.allocation_bytes() as usize)?;
        let words = Arc::new(HostWords::new(device, 2)?);
        let ring_words = RING_ENTRIES as usize * std::mem::size_of::<RawRingEntry>() / 4;
        let ring = HostWords::new(device, ring_words)?;
        Ok(CudaRank {
            device: device.clone(),
            kernels: kernels.clone(),
            config,
            staging,
            words,
            peer_table: None,
            board: 0,
            ring,
            arrivals: 0,
            plans: HashMap::new(),
            blobs: Vec::new(),
            graph_board: 0,
            choices: Vec::new(),
        })
    }

    /// This rank's memory as a peer in the same process addresses it.
    pub fn own_peer(&self) -> RawPeer {
        self.config.layout.peer(self.staging.ptr)
    }

    /// The staging allocation, for IPC export.
    pub fn staging(&self) -> &DeviceMemory {
        &self.staging
    }

    /// The staging layout.
    pub fn layout(&self) -> StagingLayout {
        self.config.layout
    }

    /// The GPU this rank runs on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// This rank's index in the communicator.
    pub fn index(&self) -> usize {
        self.config.rank
    }

    /// Whether `plan`'s blob is uploaded already (a call of it, of any size, allocates nothing).
    fn has_plan(&self, plan: &Lowered) -> bool {
        self.plans.contains_key(&plan.id())
    }

    /// Uploads every rank's memory as this rank addresses it (`peers[rank]` is its own). The
    /// peers' memory must stay mapped while this rank is connected: until it is dropped.
    pub fn connect(&mut self, peers: &[RawPeer]) -> Result<(), CallError> {
        if peers.len() != self.config.ranks || peers[self.config.rank] != self.own_peer() {
            return Err(CallError::Unfit(
                "the peer table does not match the communicator".into(),
            ));
        }
        let table = DeviceMemory::for_upload(&self.device, std::mem::size_of_val(peers))?;
        table.upload(peers)?;
        self.peer_table = Some(table);
        let layout = self.config.layout;
        self.board = layout.base_of(&peers[0]) + layout.board();
        self.graph_board = layout.base_of(&peers[0]) + layout.graph_board();
        Ok(())
    }

    /// Ticketed calls launched so far: the next ticketed call's number.
    pub fn arrivals(&self) -> u64 {
        self.arrivals
    }

    /// The arrival record of ticketed call `call` and its post-arrival time, once this rank's
    /// ring holds both (from the start of this rank's call `call + 2` on, until call
    /// `call + RING_ENTRIES` overwrites them). Identical on every rank: each copies the same
    /// board words.
    pub fn record(&self, call: u64) -> Option<TimedRecord> {
        const WORDS: usize = std::mem::size_of::<RawRingEntry>() / 8;
        let entry = (call % RING_ENTRIES as u64) as usize * WORDS;
        let tag = record_tag(call);
        let word = |i: usize| self.ring.word64(entry + i).load(Ordering::Acquire);
        let [last, lead, post] = [word(0), word(1), word(2)];
        let tagged = |w: u64| w & !0xffff_ffff == tag;
        let post_ns = post & 0xffff_ffff;
        (tagged(last) && tagged(lead) && tagged(post)).then_some(TimedRecord {
            record: ArrivalRecord {
                last_rank: (last & 0xffff_ffff) as usize,
                lead_ns: lead & 0xffff_ffff,
            },
            post_ns: (post_ns != u64::from(POST_UNMEASURED)).then_some(post_ns),
        })
    }

    /// Whether every rank's arrival protocol is over: the record of the last ticketed call is
    /// complete on rank 0's board, so no rank still spins on a ticket (reading every rank's
    /// failure word) or writes to the board. A read that fails counts as settled: nothing
    /// better can be known. Read through rank 0's board as this rank maps it.
    /// The graph board is read alike, up to the graph calls this rank's GPU completed.
    pub fn board_settled(&self) -> bool {
        let calls = self.config.layout.graph() + std::mem::offset_of!(RawGraphState, calls) as u64;
        let word = |at: u64| self.staging.read_u32(at).map(u64::from);
        let graph_calls = match (word(calls), word(calls + 4)) {
            (Ok(low), Ok(high)) => low | high << 32,
            _ => 0,
        };
        self.settled(self.board, self.arrivals) && self.settled(self.graph_board, graph_calls)
    }

    /// Whether the record of call `calls - 1` is complete on `board`.
    fn settled(&self, board: u64, calls: u64) -> bool {
        if calls == 0 || board == 0 {
            return true;
        }
        let call = calls - 1;
        let slot = board + (call % BOARD_SLOTS as u64) * std::mem::size_of::<RawBoardSlot>() as u64;
        let tag = (record_tag(call) >> 32) as u32;
        // The high halves of the slot's `last` (offset 8) and `lead` (offset 16) words.
        [slot + 12, slot + 20].iter().all(|&at| {
            // SAFETY: rank 0's board, this rank's own staging or a mapping of it that stays
            // open while this rank is connected (the contract of `connect`).
            match unsafe { super::driver::read_word(&self.device, at) } {
                Ok(t) => t == tag,
                Err(_) => true,
            }
        })
    }

    /// Waits until the ring holds the record of ticketed call `call`, which launches this rank
    /// already made copy there (the starts of calls `call + 1` and `call + 2`). Gives up on an abort or a
    /// kernel failure of this rank: the kernels apply `STRAGGLAR_TIMEOUT_MS` to their own
    /// waits, and the host does not time the GPU, which may rightly be many calls behind.
    pub fn await_record(&self, call: u64) -> Result<TimedRecord, CallError> {
        debug_assert!(
            call + 2 < self.arrivals,
            "record {call} has no launch to copy it"
        );
        let control = self.control();
        let started = std::time::Instant::now();
        let mut warned = false;
        for spin in 0u64.. {
            if let Some(record) = self.record(call) {
                return Ok(record);
            }
            if control.status() != STATUS_OK {
                return Err(CallError::Failed(control.status()));
            }
            if control.aborted() {
                return Err(CallError::Failed(STATUS_ABORTED));
            }
            let waited = started.elapsed();
            if !warned && waited > RECORD_WAIT_WARN {
                warned = true;
                log::warn!(
                    "still waiting after {} s for the arrival record of call {call}: a rank of this communicator is stuck",
                    waited.as_secs()
                );
            }
            if spin < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        unreachable!("the loop returns")
    }

    /// Feeds `tracker` every due record and post-arrival time from this rank's ring, waiting
    /// for each (see [`CudaRank::await_record`]), and hands each record and what it changed to
    /// `each`. Returns how long it waited for records the GPU had not written yet.
    pub fn feed_due(
        &self,
        tracker: &mut Tracker,
        mut each: impl FnMut(&TimedRecord, Observed),
    ) -> Result<Duration, CallError> {
        let mut waited = Duration::ZERO;
        while let Some(call) = tracker.due() {
            let record = match self.record(call) {
                Some(record) => record,
                None => {
                    let started = std::time::Instant::now();
                    let record = self.await_record(call)?;
                    waited += started.elapsed();
                    record
                }
            };
            let Some(observed) = tracker.feed(record.record) else {
                break;
            };
            tracker.feed_time(record.post_ns);
            each(&record, observed);
        }
        Ok(waited)
    }

    /// Where the next launch records its arrival (a ticket), or a launch that takes none.
    fn arrival(&self, ticket: bool) -> RawArrival {
        if !ticket {
            return RawArrival::default();
        }
        RawArrival {
            board: self.board,
            ring: self.ring.device_address(0),
            call: self.arrivals,
            ranks: self.config.ranks as u32,
            reserved: 0,
            note: self.staging.ptr + self.config.layout.arrival_note(),
        }
    }

    fn timeout_ns(&self) -> u64 {
        self.config
            .timeout
            .map_or(0, |t| t.as_nanos().max(1) as u64)
    }

    /// Queues the ticket kernel on `stream`: the arrival record of a call that goes to NCCL.
    /// Returns the call's ticket, which [`CudaRank::ticket_end`] takes once NCCL's kernel is
    /// queued. Fails fast once a kernel of this rank gave up.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device, not capturing (a replayed ticket would
    /// put the ring's numbering out of step with this rank's).
    pub unsafe fn ticket(
        &mut self,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<Ticket, CallError> {
        // The call is NCCL's: its ticket waits for the last arrival as long as NCCL would.
        // SAFETY: as the caller vouches.
        unsafe { self.ticket_within(stream, 0) }
    }

    /// [`CudaRank::ticket`] whose wait for the last arrival gives up after `timeout_ns` (0:
    /// never).
    ///
    /// # Safety
    /// As [`CudaRank::ticket`].
    unsafe fn ticket_within(
        &mut self,
        stream: cudarc::driver::sys::CUstream,
        timeout_ns: u64,
    ) -> Result<Ticket, CallError> {
        self.fail_fast()?;
        let args = self.site()?.ticket(self.arrival(true), timeout_ns);
        // SAFETY: every address in `args` is live memory of this rank (staging, rank 0's
        // mapped board, host words); the caller vouches for the stream.
        unsafe { self.kernels.ticket.launch(stream, 1, 32, &args) }?;
        self.arrivals += 1;
        Ok(Ticket(args))
    }

    /// Queues the end kernel of `ticket`'s call on `stream`, after the call's own work (NCCL's
    /// kernel): it notes when the call finished on this rank, for its post-arrival time. A
    /// ticketed call whose end is never queued is published as unmeasured, which is safe.
    ///
    /// # Safety
    /// As [`CudaRank::ticket`]; `stream` orders the end after the call's work.
    pub unsafe fn ticket_end(
        &self,
        ticket: Ticket,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CallError> {
        // SAFETY: the note is this rank's staging; the caller vouches for the stream.
        unsafe { self.kernels.ticket_end.launch(stream, 1, 32, &ticket.0) }?;
        Ok(())
    }

    /// Uploads `plan`'s blob for this rank unless it is there already: once per schedule, for
    /// every count. Not during graph capture.
    fn prepare(&mut self, plan: &Lowered) -> Result<(), CallError> {
        self.check_ranks(plan)?;
        if !self.has_plan(plan) {
            let blob = plan.blob(self.config.rank).bytes;
            let memory = DeviceMemory::for_upload(&self.device, blob.len())?;
            memory.upload(&blob)?;
            self.plans.insert(plan.id(), memory.ptr);
            self.blobs.push(memory);
        }
        Ok(())
    }

    fn check_ranks(&self, plan: &Lowered) -> Result<(), CallError> {
        if plan.ranks() != self.config.ranks {
            return Err(CallError::Unfit(format!(
                "a plan for {} ranks",
                plan.ranks()
            )));
        }
        Ok(())
    }

    /// `Ok` when a plan needing `need` fits this rank's staging for `count` elements of
    /// `dtype`.
    pub fn fits(&self, need: ArenaNeed, count: usize, dtype: DataType) -> Result<(), CallError> {
        let layout = self.config.layout;
        if need.sends >= MAX_SENDS {
            return Err(CallError::Unfit(format!(
                "the plan has {} sends on one rank; the kernel counts fewer than {MAX_SENDS}",
                need.sends
            )));
        }
        let arena = need.arena_bytes(count, dtype);
        if arena as u64 > layout.arena_bytes || need.values as u64 > layout.values {
            return Err(CallError::Unfit(format!(
                "the plan needs {arena} B of arena and {} flags; staging has {} B and {}",
                need.values, layout.arena_bytes, layout.values
            )));
        }
        Ok(())
    }

    /// The status a kernel of this rank left (0 while all is well).
    pub fn status(&self) -> u32 {
        self.control().status()
    }

    /// `Err` once a kernel of this rank gave up: later launches fail fast.
    fn fail_fast(&self) -> Result<(), CallError> {
        match self.status() {
            STATUS_OK => Ok(()),
            status => Err(CallError::Failed(status)),
        }
    }

    /// Raises the abort word: every running and later kernel of this rank gives up (and then
    /// marks this rank failed where its peers look). Never waits for the GPU.
    pub fn abort(&self) {
        self.control().abort()
    }

    /// The abort and status words, usable without holding this rank (a watchdog aborting a
    /// communicator must not wait for the lock a stuck call holds).
    pub fn control(&self) -> Control {
        Control(self.words.clone())
    }

    /// Gives this rank up: its abort word ends its own kernels, and its failure word releases
    /// every peer waiting on it. Never synchronises (a stream may be capturing).
    pub fn give_up(&self) {
        self.abort();
        self.mark_failed();
    }

    /// Marks this rank failed in its staging, where every peer's waits on it look, for a
    /// failure on the host side (no kernel of this rank ran to report it). Best effort; queued
    /// on the device's side stream, so it is allowed while the caller's stream captures.
    fn mark_failed(&self) {
        let _ = self
            .staging
            .post_u32(self.config.layout.failed(), STATUS_ABORTED);
    }

    /// Queues one AllReduce of `plan` on `stream`: the operands' `input` and `output` hold
    /// `count` elements (the same address for in place). A call with zero elements launches nothing
    /// and does not advance the epoch (with `ticket`, it launches the ticket kernel instead,
    /// bound by this rank's deadline).
    /// With `ticket`, the launch also records its arrival (never while `stream` captures).
    /// Fails fast once a kernel of this rank gave up.
    ///
    /// # Safety
    /// `input` and `output` must be device memory of this device holding `count` elements
    /// until the kernel finishes; `stream` must be a live stream of this device.
    pub unsafe fn all_reduce(
        &mut self,
        plan: &Lowered,
        operands: Operands,
        stream: cudarc::driver::sys::CUstream,
        ticket: bool,
    ) -> Result<(), CallError> {
        self.fail_fast()?;
        self.check_ranks(plan)?;
        self.fits(plan.need(), operands.count, operands.dtype)?;
        if operands.count == 0 {
            // Our own call (not NCCL's): its ticket keeps this rank's deadline.
            if ticket {
                // SAFETY: as the caller vouches.
                let ticket = unsafe { self.ticket_within(stream, self.timeout_ns()) }?;
                // SAFETY: as above; nothing else runs for this call.
                unsafe { self.ticket_end(ticket, stream) }?;
            }
            return Ok(());
        }
        // SAFETY: the caller vouches that `stream` is a live stream of this device.
        if !self.has_plan(plan) && unsafe { super::driver::is_capturing(&self.device, stream) }? {
            return Err(CallError::Unfit(
                "the plan must be prepared before graph capture (no allocation while capturing)"
                    .into(),
            ));
        }
        self.prepare(plan)?;
        let args = self
            .site()?
            .eager(self.plans[&plan.id()], self.arrival(ticket), &operands);
        // The arrival protocol, if this call records its arrival, runs in block 0's last warp.
        let grid = self.config.blocks;
        // SAFETY: every address in `args` is live device memory of this rank (staging, plan,
        // peer table, host words, rank 0's mapped board) or the caller's buffers, which the
        // caller vouches for.
        unsafe {
            self.kernels
                .all_reduce
                .launch(stream, grid, self.config.threads, &args)
        }?;
        if ticket {
            self.arrivals += 1;
        }
        Ok(())
    }

    /// Where this rank's launches point, once it is connected to its peers.
    fn site(&self) -> Result<LaunchSite, CallError> {
        let peers = self
            .peer_table
            .as_ref()
            .ok_or_else(|| CallError::Unfit("not connected to the peers".into()))?;
        Ok(LaunchSite {
            staging: self.staging.ptr,
            layout: self.config.layout,
            peer_table: peers.ptr,
            abort: self.words.device_address(ABORT_WORD),
            status: self.words.device_address(STATUS_WORD),
            rank: self.config.rank as u32,
            ranks: self.config.ranks as u32,
            blocks: self.config.blocks,
            threads: self.config.threads,
            timeout_ns: self.timeout_ns(),
            ordered_reads: self.config.ordered_reads,
        })
    }

    /// Whether graph launches can be captured: the plans they choose among are uploaded.
    pub fn has_choices(&self) -> bool {
        !self.choices.is_empty()
    }

    /// Uploads every plan a graph launch whose StragglAR plans cut chunks into `pieces` may
    /// pick, for every size, and their tables: `plans[s]` is StragglAR with straggler `s`,
    /// `plans[ranks]` Ring. One allocation and one copy for the whole set; once per rank and
    /// `pieces` (later calls do nothing). Not during graph capture.
    pub fn prepare_choices(&mut self, plans: &[&Lowered], pieces: usize) -> Result<(), CallError> {
        if self.choices.iter().any(|(k, _)| *k == pieces) {
            return Ok(());
        }
        let ranks = self.config.ranks;
        let in_order = plans.len() == ranks + 1
            && plans.iter().enumerate().all(|(choice, p)| {
                p.ranks() == ranks && (choice == ranks || p.straggler() == Some(choice))
            });
        if !in_order {
            return Err(CallError::Unfit(format!(
                "a graph launch chooses among {} plans: StragglAR with each straggler, then Ring",
                ranks + 1
            )));
        }
        // Every blob at a 256-byte boundary, then the two tables of their addresses.
        let blobs: Vec<Vec<u8>> = plans
            .iter()
            .map(|p| p.blob(self.config.rank).bytes)
            .collect();
        let mut offsets = Vec::with_capacity(blobs.len());
        let mut end = 0usize;
        for blob in &blobs {
            offsets.push(end);
            end = (end + blob.len()).div_ceil(256) * 256;
        }
        let ring_last = end;
        let straggler_last = ring_last + 8 * (ranks + 1);
        let mut bytes = vec![0u8; straggler_last + 8 * (ranks + 1)];
        let memory = DeviceMemory::for_upload(&self.device, bytes.len())?;
        let address = |choice: usize| memory.ptr + offsets[choice] as u64;
        for (choice, (blob, &at)) in blobs.iter().zip(&offsets).enumerate() {
            bytes[at..at + blob.len()].copy_from_slice(blob);
            let entry = ring_last + 8 * choice;
            bytes[entry..entry + 8].copy_from_slice(&address(choice).to_le_bytes());
            let baseline = if choice == ranks { ranks - 1 } else { choice };
            let entry = straggler_last + 8 * choice;
            bytes[entry..entry + 8].copy_from_slice(&address(baseline).to_le_bytes());
        }
        memory.upload(&bytes)?;
        // Eager calls of these plans use the same blobs (no second upload).
        for (choice, plan) in plans.iter().enumerate() {
            self.plans.entry(plan.id()).or_insert(address(choice));
        }
        let stragglar = plans[..ranks].iter().map(|p| p.need()).collect();
        self.choices.push((
            pieces,
            ChoiceTables {
                ring_last: memory.ptr + ring_last as u64,
                straggler_last: memory.ptr + straggler_last as u64,
                _memory: memory,
                stragglar,
                ring: plans[ranks].need(),
            },
        ));
        Ok(())
    }

    /// `Ok` when every StragglAR plan with `pieces` pieces per chunk a graph launch may pick is
    /// uploaded and fits the staging at `count` elements of `dtype` (the same answer on every
    /// rank: the staging layout is agreed).
    pub fn choices_fit(
        &self,
        count: usize,
        dtype: DataType,
        pieces: usize,
    ) -> Result<(), CallError> {
        self.fitting_choices(count, dtype, pieces).map(|_| ())
    }

    /// The uploaded choices of `pieces`, when every StragglAR plan fits at `count` elements of
    /// `dtype`.
    fn fitting_choices(
        &self,
        count: usize,
        dtype: DataType,
        pieces: usize,
    ) -> Result<&ChoiceTables, CallError> {
        let Some((_, choices)) = self.choices.iter().find(|(k, _)| *k == pieces) else {
            return Err(CallError::Unfit(format!(
                "the plans with {pieces} pieces per chunk must be prepared before graph capture (no allocation while capturing)"
            )));
        };
        for &need in &choices.stragglar {
            self.fits(need, count, dtype)?;
        }
        Ok(choices)
    }

    /// Queues one AllReduce captured into a graph: each replay numbers itself, records its
    /// arrival on the graph board, feeds the device detector of its size class and runs the
    /// plan `rule` picks from the records (see `crate::gpu::choice`), with no host involved:
    /// StragglAR with `pieces` pieces per chunk, or the baseline. `prepare_choices` must have
    /// uploaded the plans of `pieces`. The baseline is Ring where it fits the
    /// staging at this size, StragglAR with the last rank as the straggler above (the staging
    /// is sized for StragglAR: Ring's single-assignment arena is 2.6 times the message at 8
    /// ranks, StragglAR's 1.7). A call without elements queues nothing (on every rank alike).
    ///
    /// # Safety
    /// As [`CudaRank::all_reduce`]: the operands hold `count` elements of this device for
    /// every replay; `stream` is a live stream of this device.
    pub unsafe fn all_reduce_graph(
        &mut self,
        operands: Operands,
        stream: cudarc::driver::sys::CUstream,
        rule: RawRule,
        pieces: usize,
    ) -> Result<(), CallError> {
        self.fail_fast()?;
        let (count, dtype) = (operands.count, operands.dtype);
        let choices = self.fitting_choices(count, dtype, pieces)?;
        if count == 0 {
            return Ok(());
        }
        let table = if self.fits(choices.ring, count, dtype).is_ok() {
            choices.ring_last
        } else {
            choices.straggler_last
        };
        let args = self.site()?.graph(table, self.graph_board, rule, &operands);
        // SAFETY: every address in `args` is live device memory of this rank (staging with its
        // graph state, plan table and blobs, peer table, host words, rank 0's mapped graph
        // board) or the caller's buffers, which the caller vouches for.
        unsafe {
            self.kernels
                .all_reduce
                .launch(stream, self.config.blocks, self.config.threads, &args)
        }?;
        Ok(())
    }

    /// What this rank's graph launches chose so far, as its GPU counted them; `None` when the
    /// device cannot be read. Synchronous: read once the replays are done (or at destroy).
    pub fn graph_counts(&self) -> Option<GraphCounts> {
        let base = self.config.layout.graph();
        let word = |offset: usize| self.staging.read_u32(base + offset as u64).map(u64::from);
        let counter = |offset: usize| Some(word(offset).ok()? | word(offset + 4).ok()? << 32);
        let last = word(std::mem::offset_of!(RawGraphState, last_choice)).ok()?;
        Some(GraphCounts {
            stragglar: counter(std::mem::offset_of!(RawGraphState, on_stragglar))?,
            baseline: counter(std::mem::offset_of!(RawGraphState, on_baseline))?,
            last_straggler: (1..=self.config.ranks as u64)
                .contains(&last)
                .then(|| last as usize - 1),
        })
    }
}
