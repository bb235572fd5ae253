//! One rank of a GPU-engine communicator: its staging allocation, its host-mapped abort and
//! status words (`control`), the table of every rank's memory as this rank addresses it, the
//! plan blobs it has uploaded (one per schedule, for every message size) and the launch of one
//! eager AllReduce. Its arrival records and tickets are in `records`, its graph launches in
//! `graph`, why a call fails in `errors`.

mod agreement;
mod control;
mod errors;
mod graph;
mod records;

pub use control::Control;
pub use errors::{status_text, CallError};
pub use graph::GraphCounts;
pub use records::{Ticket, TimedRecord, OVERDUE_CALLS};

use control::{ABORT_WORD, PEER_PROBE_WORD, STATUS_WORD, WORDS};
use graph::ChoiceTables;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::arena::GrownArena;
use super::args::{LaunchSite, MulticastRegion, Operands};
use super::branch::Branch;
use super::driver::{Device, DeviceMemory, GpuError, HostWords, Kernels};
use super::failure::FailureWord;
use super::staging::{ArenaLayout, StagingLayout};
use crate::gpu::arrival::{RawRingEntry, RING_ENTRIES};
use crate::gpu::launch::{
    RawPeer, RawPeerProbe, MAX_THREADS, PEER_PROBE_FAILED, PEER_PROBE_PASSED, STATUS_OK,
    WARP_THREADS,
};
use crate::plan::{ArenaNeed, Lowered};
use crate::reduce::DataType;

/// Ordered sends of one rank in a call must stay below this: a turn is 32 bits in the plan blob
/// and in the kernel's turn words (`RawStep::turn`, whose `NO_TURN` is `u32::MAX`; `sg_served`
/// in cuda/stragglar_allreduce.cu).
const MAX_SENDS: usize = u32::MAX as usize;

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

/// One rank of a GPU-engine communicator.
pub struct CudaRank {
    device: Arc<Device>,
    kernels: Arc<Kernels>,
    config: RankConfig,
    staging: DeviceMemory,
    words: Arc<HostWords>,
    /// This rank's failure word, which every peer maps.
    failure: Arc<FailureWord>,
    /// The peers' failure words as this process maps them (by rank; `None` for this rank),
    /// once connected.
    peer_failures: Vec<Option<FailureWord>>,
    /// `RawPeer[ranks]` in device memory, once connected, and the same table on the host.
    peer_table: Option<DeviceMemory>,
    peers: Vec<RawPeer>,
    /// Bytes of one arena parity every rank's `peers` entry points at now: the staging's own
    /// (`config.layout.arena_bytes`), then each growth's.
    arena_bytes: u64,
    /// Arenas grown apart from the staging, and the peer tables that pointed at the arenas
    /// before each growth: kept until this rank goes, since a captured graph's launches
    /// point at the table (and so at the arenas) of their capture.
    grown: Vec<GrownArena>,
    old_tables: Vec<DeviceMemory>,
    /// Growths tried so far (alike on every rank): the next one's number is one more.
    growths: u32,
    /// Rank 0's arrival board as this rank addresses it, once connected.
    board: u64,
    /// `RawRingEntry[RING_ENTRIES]`, host-mapped: the records this rank's launches copy.
    ring: HostWords,
    /// Ticketed calls launched so far (the next one's number).
    arrivals: u64,
    /// Records `0..collected` are collected by launches already queued.
    collected: u64,
    /// Uploaded plan blobs: their device addresses by `Lowered::id`, in `blobs` or in the
    /// choice tables' allocation (both live as long as this rank). A blob serves every count.
    plans: HashMap<u64, u64>,
    blobs: Vec<DeviceMemory>,
    /// Rank 0's graph board as this rank addresses it, once connected.
    graph_board: u64,
    /// The plans graph launches choose among, by the finish of their StragglAR plans, once
    /// uploaded.
    choices: Vec<(crate::detect::Finish, ChoiceTables)>,
    /// The communicator's multicast region as this rank's launches see it, once formed.
    multicast: Option<MulticastRegion>,
    /// What puts NCCL's captured work behind a conditional node, where every rank can
    /// (`super::branch`): graph replays then take NCCL as their baseline.
    branch: Option<Branch>,
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
        // The failure word first: a failure after the staging exists would free it, and a
        // free waits for the whole context (another communicator's call included).
        let failure = Arc::new(FailureWord::create(device).map_err(|detail| GpuError {
            call: "shm_open",
            detail,
        })?);
        let words = Arc::new(HostWords::new(device, WORDS)?);
        let staging = DeviceMemory::zeroed(device, config.layout.allocation_bytes() as usize)?;
        let ring_words = RING_ENTRIES as usize * std::mem::size_of::<RawRingEntry>() / 4;
        let ring = HostWords::new(device, ring_words)?;
        Ok(CudaRank {
            device: device.clone(),
            kernels: kernels.clone(),
            config,
            staging,
            words,
            failure,
            peer_failures: Vec::new(),
            peer_table: None,
            peers: Vec::new(),
            arena_bytes: config.layout.arena_bytes,
            grown: Vec::new(),
            old_tables: Vec::new(),
            growths: 0,
            board: 0,
            ring,
            arrivals: 0,
            collected: 0,
            plans: HashMap::new(),
            blobs: Vec::new(),
            graph_board: 0,
            choices: Vec::new(),
            multicast: None,
            branch: None,
        })
    }

    /// This rank's memory as a peer in the same process addresses it.
    pub fn own_peer(&self) -> RawPeer {
        self.config
            .layout
            .peer(self.staging.ptr, self.failure.device_address())
    }

    /// This rank's failure word, whose name its setup record carries.
    pub fn failure_word(&self) -> &FailureWord {
        &self.failure
    }

    /// Whether `peer` has closed its mappings of this communicator's staging (its word beside
    /// its failure word says so; `false` for a rank without one, this one included).
    pub fn peer_released(&self, peer: usize) -> bool {
        self.peer_failures
            .get(peer)
            .and_then(|w| w.as_ref())
            .is_some_and(FailureWord::released)
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

    /// Our kernels on this rank's GPU.
    pub fn kernels(&self) -> &Arc<Kernels> {
        &self.kernels
    }

    /// From now on this rank's launches carry the communicator's multicast region (formed
    /// alike on every rank, before any call).
    pub fn use_multicast(&mut self, region: MulticastRegion) {
        self.multicast = Some(region);
    }

    /// This rank's index in the communicator.
    pub fn index(&self) -> usize {
        self.config.rank
    }

    /// The communicator's size.
    pub fn ranks(&self) -> usize {
        self.config.ranks
    }

    /// `peer`'s failure word as this process maps it (`None` for this rank, or before it is
    /// connected).
    pub fn peer_failure(&self, peer: usize) -> Option<&FailureWord> {
        self.peer_failures.get(peer).and_then(Option::as_ref)
    }

    /// The per-wait deadline (`STRAGGLAR_TIMEOUT_MS`), `None` to wait until aborted.
    pub fn timeout(&self) -> Option<Duration> {
        self.config.timeout
    }

    /// Numbers the next growth of the arenas (from 1; every rank counts the same tries).
    pub fn next_growth(&mut self) -> u32 {
        self.growths += 1;
        self.growths
    }

    /// Whether `plan`'s blob is uploaded already (a call of it, of any size, allocates nothing).
    fn has_plan(&self, plan: &Lowered) -> bool {
        self.plans.contains_key(&plan.id())
    }

    /// Uploads every rank's memory as this rank addresses it (`peers[rank]` is its own). The
    /// peers' memory must stay mapped while this rank is connected: until it is dropped.
    /// `failures` are the peers' failure words, whose addresses `peers` hold (this rank's
    /// `None`); kept as long as this rank.
    pub fn connect(
        &mut self,
        peers: &[RawPeer],
        failures: Vec<Option<FailureWord>>,
    ) -> Result<(), CallError> {
        if peers.len() != self.config.ranks
            || failures.len() != self.config.ranks
            || peers[self.config.rank] != self.own_peer()
        {
            return Err(CallError::Unfit(
                "the peer table does not match the communicator".into(),
            ));
        }
        let table = DeviceMemory::for_upload(&self.device, std::mem::size_of_val(peers))?;
        table.upload(peers)?;
        self.peer_table = Some(table);
        self.peers = peers.to_vec();
        self.peer_failures = failures;
        let layout = self.config.layout;
        self.board = layout.base_of(&peers[0]) + layout.board();
        self.graph_board = layout.base_of(&peers[0]) + layout.graph_board();
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

    /// `Ok` when a plan needing `need` fits this rank's staging (its arenas as they are now)
    /// for `count` elements of `dtype`.
    pub fn fits(&self, need: ArenaNeed, count: usize, dtype: DataType) -> Result<(), CallError> {
        let layout = self.config.layout;
        if need.sends >= MAX_SENDS {
            return Err(CallError::Unfit(format!(
                "the plan has {} sends on one rank; the kernel counts fewer than {MAX_SENDS}",
                need.sends
            )));
        }
        if count == 0 {
            // A call without elements uses no arena (and arenas start with no size).
            return Ok(());
        }
        let arena = need.arena_bytes(count, dtype);
        if arena as u64 > self.arena_bytes || need.values as u64 > layout.values {
            return Err(CallError::Unfit(format!(
                "the plan needs {arena} B of arena and {} flags; staging has {} B and {}",
                need.values, self.arena_bytes, layout.values
            )));
        }
        Ok(())
    }

    /// Runs the peer probe (`RawPeerProbe`) on this GPU, on the device's side stream, once
    /// connected and after the copy engine's round trip left `token` in this rank's probe word
    /// of every peer's staging; waits for its verdict until `deadline`. `Ok(None)` when every
    /// peer passed, `Ok(Some(peer))` for the first that did not (or, with no verdict by the
    /// deadline, this rank).
    pub fn probe_peers_on_the_gpu(
        &self,
        token: u32,
        deadline: std::time::Instant,
    ) -> Result<Option<usize>, CallError> {
        let table = self
            .peer_table
            .as_ref()
            .ok_or_else(|| CallError::Unfit("not connected to the peers".into()))?;
        let layout = self.config.layout;
        let args = RawPeerProbe {
            peers: table.ptr,
            probe_from_flags: layout
                .probe_word(self.config.rank)
                .wrapping_sub(layout.flags(0)),
            result: self.words.device_address(PEER_PROBE_WORD),
            token,
            rank: self.config.rank as u32,
            ranks: self.config.ranks as u32,
            reserved: 0,
        };
        let side = self.device.side_stream()?;
        // SAFETY: the peer table and the host word are live memory of this rank, the probe
        // words lie in the peers' staging this rank maps; the side stream is the device's own.
        unsafe { self.kernels.peer_probe.launch(side, 1, WARP_THREADS, &args) }?;
        let verdict = self.words.word(PEER_PROBE_WORD);
        loop {
            match verdict.load(std::sync::atomic::Ordering::Acquire) {
                PEER_PROBE_PASSED => return Ok(None),
                0 if self.control().aborted() => return Ok(Some(self.config.rank)),
                0 if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_micros(100))
                }
                0 => return Ok(Some(self.config.rank)),
                failed => return Ok(Some(failed.wrapping_sub(PEER_PROBE_FAILED) as usize)),
            }
        }
    }

    /// Bytes of one arena parity the launches use now.
    pub fn arena_bytes(&self) -> u64 {
        self.arena_bytes
    }

    /// Points this rank's later launches at arenas grown to `arenas`: every rank's pair in the
    /// allocation at `bases[rank]` as this process maps it (its own kept by `keep_arena`).
    /// The table before stays allocated for the graphs captured with it. Fails only on the
    /// table's upload; the launches then still use the arenas before.
    pub fn grow_into(&mut self, arenas: ArenaLayout, bases: &[u64]) -> Result<(), CallError> {
        if bases.len() != self.peers.len() {
            return Err(CallError::Unfit(
                "the grown arenas do not match the communicator".into(),
            ));
        }
        let peers: Vec<RawPeer> = self
            .peers
            .iter()
            .zip(bases)
            .map(|(&peer, &base)| arenas.moved(peer, base))
            .collect();
        let table = DeviceMemory::for_upload(&self.device, std::mem::size_of_val(&peers[..]))?;
        if let Err(e) = table.upload(&peers) {
            // Kept, not freed mid-job (see `keep_arena`).
            self.old_tables.push(table);
            return Err(e.into());
        }
        if let Some(before) = self.peer_table.replace(table) {
            self.old_tables.push(before);
        }
        self.peers = peers;
        self.arena_bytes = arenas.arena_bytes;
        Ok(())
    }

    /// Keeps an arena a growth allocated until this rank goes, used or not (freeing device
    /// memory mid-job would wait for every stream of the context).
    pub fn keep_arena(&mut self, arena: GrownArena) {
        self.grown.push(arena);
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
        Control(self.words.clone(), self.failure.clone())
    }

    /// Gives this rank up: its abort word ends its own kernels, and its failure word releases
    /// every peer waiting on it. Never synchronises (a stream may be capturing).
    pub fn give_up(&self) {
        self.abort();
        self.mark_failed();
    }

    /// Says, beside its failure word, that this rank has closed its mappings of every peer's
    /// staging (the caller has dropped them), unless a close failed on this device (a lost
    /// context keeps its mappings): then it says nothing, and each peer keeps its staging
    /// allocated rather than free memory a process still maps.
    pub fn say_released(&self) {
        if self.device().closed_every_mapping() {
            self.failure_word().mark_released();
        } else {
            log::debug!("a mapping of a peer's staging could not be closed here: the peers keep their staging allocated");
        }
    }

    /// Marks this rank failed in its failure word, where every peer's waits on it look, for a
    /// failure on the host side (no kernel of this rank ran to report it, or its GPU context is
    /// lost): a store into host memory, which needs no driver call.
    pub fn mark_failed(&self) {
        self.control().fail();
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
                let ticket = unsafe { self.ticket_within(stream, self.timeout_ns(), true) }?;
                // Its end kernel runs (it collects the records waiting), noting no end.
                let ticket = ticket.untimed();
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
        let collect = if ticket {
            self.collect_count(self.arrivals)?
        } else {
            0
        };
        let args = self.site()?.eager(
            self.plans[&plan.id()],
            self.arrival(ticket, collect),
            &operands,
        );
        // The arrival protocol, if this call records its arrival, runs in plan block 0's last warp.
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
            self.collecting(self.arrivals);
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
            multicast: self.multicast,
        })
    }
}
