//! The GPU engine behind `ncclAllReduce` (experimental, off unless `STRAGGLAR_GPU_ENGINE=1`:
//! nothing here has run on several GPUs yet).
//!
//! Per communicator, at its first eligible call (outside groups, never while the stream
//! captures): the staging is allocated, the setup protocol runs through the real communicator's
//! AllGather (`setup::run_setup`), and the verdict, the same on every rank, either enables the
//! engine or keeps the communicator on NCCL for good. Enabled calls launch our kernel on the
//! caller's stream; calls of one communicator on different streams are ordered by an event, so
//! a rank never starts call e+1 before its call e (the premise of the two parities).
//!
//! Every eligible call outside graph capture records its arrivals on the GPUs (the kernel's
//! arrival block, or the ticket kernel before a call the policy sends to NCCL), and the policy
//! decides each call from the records of calls at least [`RECORD_LAG`] older, which every rank
//! reads identically from its own host-mapped ring: the same choice on every rank.

use std::collections::HashMap;
use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::budget::StagingBudget;
use super::driver::{self, Capture, Device, DeviceMemory, Event, IpcMapping, Kernels};
use super::rank::{status_text, CallError, Control, CudaRank, Operands, RankConfig};
use super::setup::{
    run_setup, settings_of, Devices, Exchange, Identity, LocalFailure, PeerAccess, SetupError,
    SetupRecord,
};
use super::staging::{StagingLayout, PROBE_WORDS};
use crate::detect::policy::Policy;
use crate::detect::Tracker;
use crate::engine::host::runner::{PlanCache, Shape};
use crate::gpu::choice::RawRule;
use crate::gpu::launch::{MAX_THREADS, RING_ENTRIES, STATUS_ABORTED, STATUS_OK};
use crate::intercept::fallback::Fallback;
use crate::nccl::types::{cudaStream_t, ncclComm_t, DataTypeCode, ResultCode};
use crate::plan::Lowered;
use crate::reduce::{DataType, ReduceOp, Scale};
use crate::schedule::model::Link;

/// Blocks per rank on a GPU of its own (each rank of a communicator has one).
pub const BLOCKS: u32 = 16;

/// Ticketed calls between a call and the first call its arrival record can decide. A record
/// reaches a rank's ring when that rank's GPU starts the next ticketed call, so a host more
/// than this many calls ahead of its GPU waits for it (as NCCL's host waits when its queue is
/// full); 32 is the detector's window, and keeps the wait rare.
pub const RECORD_LAG: u64 = 32;

// The ring must still hold a record when it is due: written at most `RECORD_LAG - 2` calls
// before, overwritten `RING_ENTRIES` calls after it was written.
const _: () = assert!(RECORD_LAG >= 2 && RECORD_LAG < RING_ENTRIES as u64 + 2);

/// The model's links for the policy: an NVSwitch GPU (ALGORITHM.md section 4: 3 us per round,
/// 450 GiB/s per direction), until the engine is calibrated on such hardware.
pub const NVSWITCH_LINK: Link = Link {
    alpha: 3e-6,
    bandwidth: 450.0 * 1024.0 * 1024.0 * 1024.0,
};

/// One call, as the engine needs it.
pub struct EngineCall {
    pub comm: ncclComm_t,
    pub rank: usize,
    pub ranks: usize,
    pub device: i32,
    pub send: u64,
    pub recv: u64,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// The copy-in scaling (`Scale::for_op`), computed by the caller.
    pub scale: Scale,
    pub stream: cudaStream_t,
}

impl EngineCall {
    /// What the call's kernel reduces.
    fn operands(&self) -> Operands {
        Operands {
            count: self.count,
            dtype: self.dtype,
            op: self.op,
            scale: self.scale,
            input: self.send,
            output: self.recv,
        }
    }
}

/// A communicator the engine serves.
struct Ready {
    rank: CudaRank,
    /// This rank's index in the communicator.
    index: usize,
    /// Peers' staging, open for the communicator's lifetime.
    mappings: Vec<Option<IpcMapping>>,
    plans: PlanCache,
    /// The straggler policy and its arrival records.
    tracker: Tracker,
    /// The designation after the last record read (of that record's size class), shared with
    /// the entry so that `stragglarGetStats` never waits for a call: the rank, or -1.
    designated: Arc<std::sync::atomic::AtomicI64>,
    /// `STRAGGLAR_TRACE_DIR`'s writer for this communicator, and the tracked calls whose
    /// records are not read yet: (host enqueue time in us, bytes, the straggler StragglAR ran).
    trace: Option<crate::trace::TraceWriter>,
    untraced: std::collections::VecDeque<(f64, u64, Option<usize>)>,
    /// Each rank's host and GPU, for the report.
    members: Vec<String>,
    /// When the straggler report was last logged (every `STRAGGLAR_REPORT_INTERVAL` at INFO).
    reported_at: std::time::Instant,
    /// Eager AllReduce kernels launched so far (those that advance the epoch; not tickets, not
    /// captured calls): with this rank's own epoch, what every peer must reach before the
    /// staging is freed.
    launched: u64,
    /// A ticket was queued for a call the policy sent to NCCL, and NCCL's kernel is not yet
    /// ordered before this communicator's next launch (see [`forwarded`]).
    ticket_awaits_nccl: bool,
    /// The stream of such a call that NCCL (nonblocking) was still launching when it returned:
    /// the order is taken once the application reads `ncclSuccess` (see [`nccl_state_seen`]).
    order_pending: Option<cudaStream_t>,
    /// Calls captured into graphs as graph launches (each replay chooses on the GPU).
    captured: u64,
    /// The plans graph launches choose among could not be built: captured calls stay on NCCL.
    unbuildable: bool,
    /// Orders this communicator's launches across the caller's streams.
    last: Event,
    last_stream: cudaStream_t,
    /// Orders its captured launches across the streams of one capture: recorded after each,
    /// with the capture's id and the stream (a replay of two graph launches at once would mix
    /// their device state). Replays and eager calls are ordered by the caller's streams.
    captured_last: Event,
    captured_stream: Option<(u64, cudaStream_t)>,
    /// The staging counted against the device's cap (released after `rank` frees it).
    _reservation: Reservation,
}

// SAFETY: the raw stream handle is only compared and passed back to the driver, which lets any
// thread use it.
unsafe impl Send for Ready {}

enum State {
    /// The first eligible call is setting it up (the entry exists so that a concurrent abort
    /// finds it).
    SettingUp,
    Ready(Box<Ready>),
    /// Kept on NCCL for good (the verdict was the same on every rank).
    Refused,
}

/// One communicator's engine: its state behind a lock, and its abort and status words beside
/// it, so that an abort or a watchdog's poll never waits for a call that holds the lock.
struct Entry {
    state: Mutex<State>,
    control: Mutex<Option<Control>>,
    /// Set by `forget`: a setup still running must not install its result.
    forgotten: std::sync::atomic::AtomicBool,
    /// Held across a setup's check of `forgotten` and its query of NCCL's state, and taken by
    /// `forget` after setting `forgotten`: no query runs on a communicator NCCL is freeing.
    polling: Mutex<()>,
    /// Whether the asynchronous error was logged.
    reported: std::sync::atomic::AtomicBool,
    /// The designated straggler, or -1 (see `Ready::designated`).
    designated: Arc<std::sync::atomic::AtomicI64>,
}

impl Drop for Entry {
    /// The last reference to a forgotten communicator's engine goes: if a call still held its
    /// state when `forget` ran (so `forget` could not take it), the memory is abandoned here
    /// rather than freed under kernels NCCL's abort has yet to stop.
    fn drop(&mut self) {
        if self.forgotten.load(std::sync::atomic::Ordering::Acquire) {
            if let State::Ready(ready) = std::mem::replace(self.state.get_mut(), State::Refused) {
                abandon(*ready);
            }
        }
    }
}

static ENGINES: Lazy<Mutex<HashMap<usize, Arc<Entry>>>> = Lazy::new(Default::default);

/// A communicator aborted while the engine served it: its memory waits here until no rank can
/// touch it (see [`sweep_abandoned`]).
struct Abandoned {
    ready: Ready,
    /// This rank's kernels have finished, and it has released every peer's staging (its
    /// release token written there, its mapping closed).
    released: bool,
}

static ABANDONED: Lazy<Mutex<Vec<Abandoned>>> = Lazy::new(Default::default);

/// The probe word's token once a rank is done with a peer's staging for good (its kernels of
/// that communicator have finished and it closes its mapping): the high half says "released",
/// the low half is the writer's rank. A rank frees its aborted staging once every peer's token
/// is there.
const RELEASE_TOKEN: u32 = 0x5245_0000;

/// Abandons `ready`'s memory after raising its abort word (its kernels give up; nothing waits
/// for them here); its trace is closed (made valid JSON) first. The memory is freed by a later
/// [`sweep_abandoned`], once no rank can touch it.
fn abandon(mut ready: Ready) {
    ready.rank.abort();
    ready.trace = None;
    ABANDONED.lock().push(Abandoned {
        ready,
        released: false,
    });
    sweep_abandoned();
}

/// Writes this rank's release token into every peer's staging and closes the mappings: this
/// rank will never touch them again (its kernels of this communicator must have finished).
fn release_peers(ready: &mut Ready) {
    let layout = ready.rank.layout();
    for mapping in ready.mappings.iter().flatten() {
        let _ = mapping.write_u32(
            layout.probe_word(ready.index),
            RELEASE_TOKEN | ready.index as u32,
        );
    }
    ready.mappings.clear();
}

/// Whether every peer's release token is in this rank's staging: no peer will touch it again.
fn released_by_every_peer(ready: &Ready) -> bool {
    let layout = ready.rank.layout();
    (0..ready.members.len())
        .filter(|&peer| peer != ready.index)
        .all(|peer| {
            ready.rank.staging().read_u32(layout.probe_word(peer))
                == Ok(RELEASE_TOKEN | peer as u32)
        })
}

/// Frees what aborted communicators no longer need, without waiting for anything: once this
/// rank's own kernels of one have finished (the ordering event recorded after its last launch
/// is complete; the abort word ends them), it releases every peer's staging; once every peer
/// has released its own, that staging is freed and its reservation returned. A peer that never
/// releases (it died, or still runs that communicator) keeps it allocated. Runs at every
/// abort, destroy and setup, so an elastic job that aborts and re-creates its communicators
/// holds at most the staging of those its peers have not yet let go.
fn sweep_abandoned() {
    ABANDONED.lock().retain_mut(|abandoned| {
        if !abandoned.released {
            if !abandoned.ready.last.is_complete() {
                return true;
            }
            release_peers(&mut abandoned.ready);
            abandoned.released = true;
        }
        // Dropped (freed) when every peer let go.
        !released_by_every_peer(&abandoned.ready)
    });
}

/// Staging in use per device, against `STRAGGLAR_STAGING_CAP`.
static BUDGET: Lazy<Mutex<StagingBudget>> = Lazy::new(Default::default);

/// Staging bytes counted against a device's cap until dropped (with the staging it counts:
/// an aborted communicator's once every peer released it, see [`sweep_abandoned`]).
struct Reservation {
    device: i32,
    bytes: u64,
}

impl Reservation {
    /// Reserves `bytes` on `device`, or says why not (at WARN, for each communicator refused).
    fn take(device: i32, bytes: u64) -> Option<Reservation> {
        let cap = crate::config::get().staging_cap;
        match BUDGET.lock().reserve(device, bytes, cap) {
            Ok(_) => Some(Reservation { device, bytes }),
            Err(over) => {
                log::warn!("{over}: this communicator stays on NCCL");
                None
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        BUDGET.lock().release(self.device, self.bytes);
    }
}

/// A GPU as the engine found it: opened (or why not), and our kernels loaded on it (or why not:
/// NVRTC missing, compilation failed), each tried once and its failure logged once.
#[derive(Default)]
struct Found {
    device: Option<Result<Arc<Device>, String>>,
    kernels: Option<Result<Arc<Kernels>, String>>,
}

static GPUS: Lazy<Mutex<HashMap<i32, Found>>> = Lazy::new(Default::default);

/// GPU `ordinal`, opened once per process.
fn device(ordinal: i32) -> Result<Arc<Device>, String> {
    GPUS.lock()
        .entry(ordinal)
        .or_default()
        .device
        .get_or_insert_with(|| {
            let device = match crate::gpu::probe::probe().driver {
                crate::gpu::probe::Driver::Devices(n) if n > ordinal => {
                    Device::open(ordinal).map_err(|e| e.to_string())
                }
                _ => Err("no usable CUDA driver or device".into()),
            };
            if let Err(why) = &device {
                log::warn!(
                    "GPU engine unavailable on device {ordinal}: {why}; AllReduce stays on NCCL"
                );
            }
            device
        })
        .clone()
}

/// Our kernels on `device` (GPU `ordinal`), compiled (or taken from the cache) and loaded once
/// per process. Never called while the caller's stream captures: loading is not for a capture.
fn kernels(ordinal: i32, device: &Arc<Device>) -> Result<Arc<Kernels>, String> {
    GPUS.lock()
        .entry(ordinal)
        .or_default()
        .kernels
        .get_or_insert_with(|| {
            let kernels = (|| {
                let arch = device.arch().map_err(|e| e.to_string())?;
                let cache = crate::gpu::nvrtc::default_cache_dir(
                    crate::config::get().cache_dir.as_deref(),
                );
                let (cubin, _) = crate::gpu::nvrtc::cubin_cached(&arch, cache.as_deref())
                    .map_err(|e| e.to_string())?;
                Kernels::load(device, &cubin)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })();
            if let Err(why) = &kernels {
                log::warn!(
                    "GPU engine kernels unavailable on device {ordinal}: {why}; AllReduce stays on NCCL"
                );
            }
            kernels
        })
        .clone()
}

/// The staging every rank of an `n`-rank communicator allocates: room for the largest plan of
/// `STRAGGLAR_BUFFER_BYTES` of any type and any straggler (so every eligible call fits). The
/// schedules are lowered into `plans`, which the communicator keeps.
fn layout(plans: &mut PlanCache, ranks: usize) -> Result<StagingLayout, String> {
    let buffer = crate::config::get().buffer_bytes;
    let mut layout = StagingLayout {
        arena_bytes: 64,
        values: 1,
        blocks: BLOCKS as u64,
    };
    // StragglAR with every straggler (graph replays run Ring as their baseline where it fits).
    for choice in 0..ranks {
        let need = plans
            .lowered(Shape::of_choice(ranks, choice, DataType::U8))?
            .need();
        for dtype in [DataType::U8, DataType::F16, DataType::F32, DataType::F64] {
            let arena = need.arena_bytes(buffer / dtype.size(), dtype);
            layout.arena_bytes = layout.arena_bytes.max(arena as u64);
        }
        layout.values = layout.values.max(need.values as u64);
    }
    Ok(layout)
}

/// Staging bytes one rank of an `n`-rank communicator allocates (for doctor).
pub fn staging_bytes(ranks: usize) -> Result<u64, String> {
    layout(&mut PlanCache::default(), ranks).map(|l| l.allocation_bytes())
}

/// The setup's AllGather through the real communicator, on the caller's stream.
struct NcclExchange<'a> {
    device: &'a Arc<Device>,
    /// The communicator's entry: aborted or destroyed meanwhile when `forgotten` (see
    /// [`forget`]).
    entry: &'a Entry,
    comm: ncclComm_t,
    stream: cudaStream_t,
    ranks: usize,
}

impl Exchange for NcclExchange<'_> {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        let len = mine.len();
        let buffer =
            DeviceMemory::zeroed(self.device, len * self.ranks).map_err(|e| e.to_string())?;
        let own = DeviceMemory::zeroed(self.device, len).map_err(|e| e.to_string())?;
        own.upload(mine).map_err(|e| e.to_string())?;
        let rc = crate::abi::reentry::calling_real(|| {
            crate::abi::passthrough::ncclAllGather(
                own.ptr as *const std::ffi::c_void,
                buffer.ptr as *mut std::ffi::c_void,
                len,
                DataTypeCode(1), // ncclUint8
                self.comm,
                self.stream,
            )
        });
        // A nonblocking communicator may still be launching it: nothing may follow on the
        // stream until NCCL's state settles.
        let rc = match rc {
            ResultCode::IN_PROGRESS => {
                let entry = self.entry;
                let comm = self.comm;
                let poll = || {
                    let _polling = entry.polling.lock();
                    (!entry.forgotten.load(std::sync::atomic::Ordering::Acquire))
                        .then(|| crate::intercept::nonblocking::async_state(comm))
                };
                match crate::intercept::nonblocking::settle(poll) {
                    Some(state) => state,
                    None => {
                        // NCCL may still launch the all-gather into these buffers: they are
                        // abandoned, never freed under it.
                        std::mem::forget(buffer);
                        std::mem::forget(own);
                        return Err("the communicator was aborted or destroyed during setup".into());
                    }
                }
            }
            rc => rc,
        };
        if rc != ResultCode::SUCCESS {
            return Err(format!("ncclAllGather returned {}", rc.0));
        }
        // SAFETY: the caller's live stream of this device's context.
        unsafe { driver::synchronize_raw(self.device, self.stream.cast()) }
            .map_err(|e| e.to_string())?;
        let mut all = vec![0u8; len * self.ranks];
        buffer.download(&mut all).map_err(|e| e.to_string())?;
        Ok(all)
    }
}

/// Peers' staging through CUDA IPC. Shared with the CUDA bench's process mode.
pub struct IpcAccess<'a> {
    pub device: &'a Arc<Device>,
    pub layout: StagingLayout,
    /// This rank: its probe word in each peer's staging is the one it writes.
    pub rank: usize,
}

/// The probe's token: a recognisable high half, the writer's rank in the low half.
const PROBE_TOKEN: u32 = 0x5347_0000;

impl PeerAccess for IpcAccess<'_> {
    type Mapping = IpcMapping;

    fn open(&mut self, record: &SetupRecord) -> Result<IpcMapping, String> {
        IpcMapping::open(self.device, &record.staging_handle).map_err(|e| e.to_string())
    }

    /// A round trip through the mapping: this rank's token, written into its own probe word
    /// of the peer's staging, reads back; and the peer's failure word reads 0 (fresh).
    fn probe(&mut self, mapping: &IpcMapping) -> bool {
        if self.rank as u64 >= PROBE_WORDS {
            return false;
        }
        let at = self.layout.probe_word(self.rank);
        let token = PROBE_TOKEN | self.rank as u32;
        mapping.write_u32(at, token).is_ok()
            && mapping.read_u32(at) == Ok(token)
            && mapping.read_u32(self.layout.failed()) == Ok(0)
    }
}

/// Whether this GPU's system-scope atomics on rank 0's staging (the arrival tickets) are
/// native; says why not at WARN.
pub fn tickets_are_atomic(device: &Device, records: &[SetupRecord]) -> bool {
    let Some(board_owner) = records.first() else {
        return false;
    };
    match device.native_atomics_with(&board_owner.device_uuid) {
        Ok(Some(true)) => true,
        Ok(Some(false)) => {
            log::warn!("this GPU has no native atomics on rank 0's GPU (a PCIe path without them): StragglAR stays off");
            false
        }
        Ok(None) => {
            log::warn!("rank 0's GPU is not visible to this process: StragglAR stays off");
            false
        }
        Err(e) => {
            log::warn!("peer atomics unknown: {e}: StragglAR stays off");
            false
        }
    }
}

/// The policy of an `n`-rank communicator, from the configuration.
fn tracker(ranks: usize) -> Tracker {
    let config = crate::config::get();
    let policy = Policy::new(ranks, config.algo, config.straggler, NVSWITCH_LINK);
    Tracker::new(policy, ranks, RECORD_LAG)
}

/// What this rank brings to the setup: its staging (if it could make it, under the cap
/// `reserved` says it fits) and its record.
fn local_part(
    call: &EngineCall,
    device: &Arc<Device>,
    kernel: &Result<Arc<Kernels>, String>,
    layout: StagingLayout,
    reserved: bool,
) -> (Result<CudaRank, LocalFailure>, SetupRecord) {
    let config = RankConfig {
        rank: call.rank,
        ranks: call.ranks,
        layout,
        blocks: BLOCKS,
        threads: MAX_THREADS,
        timeout: crate::config::get()
            .timeout_ms
            .map(std::time::Duration::from_millis),
        ordered_reads: true,
    };
    let failed = |why| SetupRecord::failed(call.rank, call.ranks, why);
    let rank = kernel
        .as_ref()
        .map_err(|_| LocalFailure::NoKernels)
        .and_then(|k| match reserved {
            true => CudaRank::new(device, k, config).map_err(|_| LocalFailure::NoMemory),
            false => Err(LocalFailure::NoMemory),
        });
    let record = match &rank {
        Err(why) => failed(*why),
        Ok(r) => match (device.uuid(), r.staging().ipc_handle()) {
            (Ok(uuid), Ok(handle)) => SetupRecord::ready(
                call.rank,
                call.ranks,
                &Identity::this_host(uuid),
                settings_of(crate::config::get()),
                handle,
                layout,
            ),
            _ => failed(LocalFailure::NoIpc),
        },
    };
    (rank, record)
}

fn set_up(call: &EngineCall, entry: &Entry) -> Result<Ready, Fallback> {
    // Staging of aborted communicators no rank touches any more is freed first (and leaves
    // the cap).
    sweep_abandoned();
    // Without a driver or device NCCL cannot run here either, so no peer waits on this rank's
    // setup; from here on, a local failure still joins both all-gathers with a failed record.
    let device = device(call.device).map_err(|_| Fallback::GpuUnavailable)?;
    // Every rank asks its own stream; one that cannot tell still joins the setup (its peers
    // are entering the same collectives) with a failed record, so every rank refuses alike.
    // SAFETY: the caller's stream of this communicator's device.
    let stream_state = match unsafe { driver::is_capturing(&device, call.stream.cast()) } {
        Ok(true) => return Err(Fallback::CapturingBeforeSetup),
        Ok(false) => Ok(()),
        Err(e) => {
            log::warn!(
                "communicator {:p}: {e}: this rank joins the GPU engine's setup as failed",
                call.comm
            );
            Err(LocalFailure::NoStreamState)
        }
    };
    // Kernels that cannot load make this rank's record a failed one: its peers still join.
    let kernel = kernels(call.device, &device);
    let mut plans = PlanCache::default();
    let layout = layout(&mut plans, call.ranks).map_err(|_| Fallback::GpuUnavailable)?;
    // A panic in the local steps must not make this rank skip the collectives its peers run.
    let reservation = Reservation::take(call.device, layout.allocation_bytes());
    let local = match stream_state {
        Ok(()) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            local_part(call, &device, &kernel, layout, reservation.is_some())
        })),
        Err(why) => Ok((Err(why), SetupRecord::failed(call.rank, call.ranks, why))),
    };
    let (mut rank, record) = local.unwrap_or_else(|_| {
        (
            Err(LocalFailure::NoMemory),
            SetupRecord::failed(call.rank, call.ranks, LocalFailure::NoMemory),
        )
    });
    if let Ok(r) = &rank {
        *entry.control.lock() = Some(r.control());
    }
    let mut exchange = NcclExchange {
        device: &device,
        entry,
        comm: call.comm,
        stream: call.stream,
        ranks: call.ranks,
    };
    let mut access = IpcAccess {
        device: &device,
        layout,
        rank: call.rank,
    };
    let mut last = None;
    let finish = |mappings: &[Option<IpcMapping>], records: &[SetupRecord]| {
        let Ok(r) = &mut rank else {
            return false;
        };
        if !tickets_are_atomic(&device, records) {
            return false;
        }
        let peers: Vec<_> = mappings
            .iter()
            .map(|m| m.as_ref().map_or(r.own_peer(), |m| layout.peer(m.ptr)))
            .collect();
        // Two ordering events: eager launches', and captured launches' (an event recorded in a
        // capture may only be waited on within it).
        last = r.connect(&peers).ok().and_then(|()| {
            Some((
                Event::ordering(&device).ok()?,
                Event::ordering(&device).ok()?,
            ))
        });
        last.is_some()
    };
    let joined = match run_setup(
        &mut exchange,
        &mut access,
        &record,
        Devices::OnePerRank,
        finish,
    ) {
        Ok(joined) => joined,
        Err(SetupError::Refused(verdict)) => {
            log::warn!(
                "communicator {:p}: StragglAR stays off: {}",
                call.comm,
                verdict.describe()
            );
            return Err(Fallback::SetupRefused);
        }
        Err(SetupError::Exchange(why)) => {
            log::warn!("communicator {:p}: setup failed: {why}", call.comm);
            return Err(Fallback::SetupRefused);
        }
    };
    // The final verdict was Eligible on every rank, so this rank's steps all succeeded.
    let (Ok(rank), Some((last, captured_last))) = (rank, last) else {
        return Err(Fallback::SetupRefused);
    };
    let Some(reservation) = reservation else {
        return Err(Fallback::SetupRefused);
    };
    log::info!(
        "communicator {:p}: the GPU engine serves its AllReduce ({} ranks, {} MiB of staging on device {}: {} of STRAGGLAR_STAGING_CAP {} MiB in use)",
        call.comm,
        call.ranks,
        layout.allocation_bytes() >> 20,
        call.device,
        BUDGET.lock().used(call.device) >> 20,
        crate::config::get().staging_cap >> 20
    );
    Ok(Ready {
        rank,
        index: call.rank,
        mappings: joined.mappings,
        members: joined.records.iter().map(SetupRecord::member).collect(),
        reported_at: std::time::Instant::now(),
        plans,
        tracker: tracker(call.ranks),
        designated: entry.designated.clone(),
        trace: open_trace(call),
        untraced: Default::default(),
        launched: 0,
        captured: 0,
        unbuildable: false,
        ticket_awaits_nccl: false,
        order_pending: None,
        last,
        last_stream: call.stream,
        captured_last,
        captured_stream: None,
        _reservation: reservation,
    })
}

/// Feeds the tracker every due record (waiting for them) and logs designation changes (rank 0
/// says it; every rank sees the same change).
fn feed_due_records(ready: &mut Ready, comm: ncclComm_t, rank: usize) -> Result<(), CallError> {
    let Ready {
        rank: engine,
        tracker,
        designated,
        trace,
        untraced,
        ..
    } = ready;
    engine.feed_due(tracker, |record, observed| {
        designated.store(
            observed.designated.map_or(-1, |r| r as i64),
            std::sync::atomic::Ordering::Relaxed,
        );
        trace_call(trace, untraced, record, observed.designated, comm);
        if let (Some(before), 0) = (observed.changed, rank) {
            let who = |r: Option<usize>| r.map_or("none".to_string(), |r| format!("rank {r}"));
            log::warn!(
                "communicator {comm:p}: designated straggler for sizes 2^{} B changed from {} to {} at call {}",
                observed.class,
                who(before),
                who(observed.designated),
                observed.call
            );
        }
    })
    .map(|_waited| ())
}

/// This rank's trace of `call`'s communicator, with `STRAGGLAR_TRACE_DIR`.
fn open_trace(call: &EngineCall) -> Option<crate::trace::TraceWriter> {
    let dir = crate::config::get().trace_dir.as_deref()?;
    let label = format!("-comm{:x}", call.comm as usize);
    match crate::trace::TraceWriter::create_labelled(std::path::Path::new(dir), call.rank, &label) {
        Ok(writer) => Some(writer),
        Err(e) => {
            log::warn!(
                "STRAGGLAR_TRACE_DIR {dir}: {e}; no trace for communicator {:p}",
                call.comm
            );
            None
        }
    }
}

/// Writes the trace event of the call whose record was just read (its host enqueue time: the
/// GPU-side duration is not measured), with the record and the designation after it.
fn trace_call(
    trace: &mut Option<crate::trace::TraceWriter>,
    untraced: &mut std::collections::VecDeque<(f64, u64, Option<usize>)>,
    record: &crate::detect::ArrivalRecord,
    designated: Option<usize>,
    comm: ncclComm_t,
) {
    let Some((start_us, bytes, straggler)) = untraced.pop_front() else {
        return;
    };
    let Some(writer) = trace else {
        return;
    };
    let event = crate::trace::CallEvent {
        start_us,
        duration_us: 0.0,
        bytes,
        algorithm: if straggler.is_some() {
            "stragglar"
        } else {
            "nccl"
        },
        straggler,
        last_rank: Some(record.last_rank),
        lead_us: record.lead_ns as f64 / 1e3,
        designated,
    };
    if let Err(e) = writer.call(&event) {
        log::warn!(
            "{}: {e}; tracing of communicator {comm:p} stops",
            writer.path().display()
        );
        *trace = None;
    }
}

/// Logs the straggler report at INFO (a table per communicator; see `ArrivalTally::table`).
fn log_report(ready: &Ready, comm: ncclComm_t) {
    if ready.tracker.calls() > 0 {
        log::info!(
            "communicator {comm:p}: straggler report\n{}",
            ready.tracker.table(&ready.members).trim_end()
        );
    }
}

/// Logs the report when `STRAGGLAR_REPORT_INTERVAL` seconds passed since the last one (0: only
/// at destroy).
fn maybe_log_report(ready: &mut Ready, comm: ncclComm_t) {
    let seconds = crate::config::get().report_interval_s;
    let interval = std::time::Duration::from_secs(seconds);
    if seconds > 0 && log::log_enabled!(log::Level::Info) && ready.reported_at.elapsed() >= interval
    {
        ready.reported_at = std::time::Instant::now();
        log_report(ready, comm);
    }
}

/// Orders this communicator's next launch after everything queued on `stream` so far (calls on
/// different streams: a rank never starts call e+1 before its call e).
fn order_after(ready: &mut Ready, stream: cudaStream_t) -> Result<(), CallError> {
    // SAFETY: the caller's live stream of this device.
    unsafe { ready.last.record_raw(stream.cast()) }?;
    ready.last_stream = stream;
    Ok(())
}

/// Launches one call. `Err(Fallback)` keeps it on NCCL (the same on every rank: it depends on
/// the policy's shared records, the plan cache and the capture state, which every rank
/// shares); `Ok(Err(_))` is a failure of this rank, after which its peers are told.
fn launch(ready: &mut Ready, call: &EngineCall) -> Result<Result<(), CallError>, Fallback> {
    let stream = call.stream.cast();
    // SAFETY: the caller's stream of this device.
    let capture = match unsafe { driver::capture_of(ready.rank.device(), stream) } {
        Ok(capture) => capture,
        Err(e) => {
            // Its peers take a ticket for this call (or capture it) and this rank cannot tell
            // whether to; giving up never synchronises, so a capturing stream is safe.
            ready.rank.give_up();
            return Ok(Err(e.into()));
        }
    };
    let bytes = call.count * call.dtype.size();
    if capture != Capture::None {
        return capture_call(ready, call, bytes, capture);
    }
    if ready.order_pending.take().is_some() {
        // The application did not read NCCL's state through ncclCommGetAsyncError, which
        // takes this order (see `nccl_state_seen`), and its stream may be capturing or gone by
        // now: this launch stays ordered after the forwarded call's ticket only (as the
        // protocol needs), not after NCCL's kernel.
        log::debug!(
            "communicator {:p}: a forwarded call's order was not taken",
            call.comm
        );
    }
    let prepared =
        feed_due_records(ready, call.comm, call.rank).and_then(|()| prepare_choices(ready, call));
    if let Err(e) = prepared {
        // This rank cannot take part in the call: its peers must not wait for it.
        ready.rank.give_up();
        return Ok(Err(e));
    }
    maybe_log_report(ready, call.comm);
    let choice = ready.tracker.decide(bytes);
    let straggler = choice.straggler();
    // Fields borrowed apart: the plan stays in the cache (no copy of it per call). It serves
    // every count: a new size builds and uploads nothing.
    let Ready {
        rank,
        plans,
        launched,
        last,
        last_stream,
        ticket_awaits_nccl,
        trace,
        untraced,
        ..
    } = ready;
    let plan = straggler.and_then(|straggler| {
        let shape = Shape::of_choice(call.ranks, straggler, call.dtype);
        plans.lowered(shape).ok()
    });
    if trace.is_some() {
        // The call as it runs: StragglAR with its plan, or NCCL after a ticket.
        let now_us = crate::engine::host::link::now_ns() as f64 / 1e3;
        untraced.push_back((now_us, bytes as u64, plan.and(straggler)));
    }
    let result = (|| {
        // Calls on different streams are ordered by the event (not across a capture boundary:
        // a captured graph is replayed on the stream it was captured from).
        if call.stream != *last_stream {
            // SAFETY: both are the caller's live streams of this device.
            unsafe { last.wait_on(stream) }?;
            *last_stream = call.stream;
        }
        let operands = call.operands();
        match plan {
            Some(plan) => {
                // SAFETY: the caller's buffers hold `count` elements on this device (NCCL's
                // contract for ncclAllReduce), and the stream is the caller's.
                unsafe { rank.all_reduce(plan, operands, stream, true) }?;
                // A call without elements queues a ticket only and leaves the epoch alone.
                *launched += u64::from(call.count > 0);
            }
            None => {
                // SAFETY: the caller's stream, not capturing.
                unsafe { rank.ticket(stream) }?;
            }
        }
        // SAFETY: as above.
        unsafe { last.record_raw(stream) }?;
        Ok(())
    })();
    if result.is_err() {
        // Peers already launched this call: tell them this rank will not.
        rank.give_up();
        return Ok(result);
    }
    match plan {
        Some(_) => Ok(Ok(())),
        None => {
            // The ticket is queued; NCCL runs the call (see `forwarded`).
            *ticket_awaits_nccl = true;
            Err(Fallback::PolicyNccl)
        }
    }
}

/// Captures one call into the caller's graph as a graph launch, whose every replay chooses its
/// plan on the GPU from the records of earlier replays (`crate::gpu::choice`). It stays on NCCL
/// (captured as usual) when the policy never picks StragglAR at this size, or when the plans
/// are not uploaded (no allocation while capturing; they are, from the first call outside
/// capture on). Both follow from the settings and the calls so far: the same on every rank.
fn capture_call(
    ready: &mut Ready,
    call: &EngineCall,
    bytes: usize,
    capture: Capture,
) -> Result<Result<(), CallError>, Fallback> {
    let policy = ready.tracker.policy();
    if !policy.may_choose_stragglar(bytes) {
        return Err(Fallback::PolicyNccl);
    }
    if !ready.rank.has_choices() {
        return Err(Fallback::CapturingBeforeSetup);
    }
    if let Err(e) = ready.rank.choices_fit(call.count, call.dtype) {
        // Eligibility keeps calls within the staging; should that ever not hold, the call
        // stays on NCCL (alike on every rank: the staging layout is agreed) rather than fail.
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            log::warn!("a captured ncclAllReduce of {bytes} B stays on NCCL: {e} (logged once)");
        }
        return Err(Fallback::AboveBufferBytes);
    }
    let rule = RawRule::new(policy, bytes);
    let operands = call.operands();
    let stream = call.stream.cast();
    let id = match capture {
        Capture::Id(id) => Some(id),
        _ => None,
    };
    let result = (|| {
        if let (Some(id), Some((previous, other))) = (id, ready.captured_stream) {
            if previous == id && other != call.stream {
                // SAFETY: the caller's capturing stream; the event was recorded in this capture.
                unsafe { ready.captured_last.wait_on(stream) }?;
            }
        }
        // SAFETY: the caller's buffers hold `count` elements on this device whenever the graph
        // is replayed (CUDA's contract for captured work), and the stream is the caller's.
        unsafe { ready.rank.all_reduce_graph(operands, stream, rule) }?;
        if let Some(id) = id {
            // SAFETY: as above.
            unsafe { ready.captured_last.record_raw(stream) }?;
            ready.captured_stream = Some((id, call.stream));
        }
        Ok(())
    })();
    match result {
        Ok(()) => ready.captured += 1,
        // Its peers' graphs hold this call: their replays must not wait for this rank.
        Err(_) => ready.rank.give_up(),
    }
    Ok(result)
}

/// Uploads, at the communicator's first call outside capture, every plan a graph launch may
/// pick (StragglAR with each straggler, and Ring), for every size: capture allocates nothing,
/// and eager calls use the same blobs. Done alike on every rank: the plans follow from the
/// rank count. If they cannot be built, captured calls stay on NCCL.
fn prepare_choices(ready: &mut Ready, call: &EngineCall) -> Result<(), CallError> {
    if ready.unbuildable || ready.rank.has_choices() {
        return Ok(());
    }
    let shapes = (0..=call.ranks).map(|choice| Shape::of_choice(call.ranks, choice, call.dtype));
    let mut plans = Vec::with_capacity(call.ranks + 1);
    for shape in shapes {
        match ready.plans.lowered(shape) {
            Ok(plan) => plans.push(plan.clone()),
            Err(why) => {
                // Not tried again: the same plans fail alike on every rank, every time.
                log::info!("communicator {:p}: graphs stay on NCCL: {why}", call.comm);
                ready.unbuildable = true;
                return Ok(());
            }
        }
    }
    let plans: Vec<&Lowered> = plans.iter().collect();
    ready.rank.prepare_choices(&plans)
}

/// Called after a call the policy sent to NCCL was forwarded on `stream`, with NCCL's result:
/// the communicator's next launch is ordered after NCCL's kernel too, not just after the
/// ticket. Where a nonblocking communicator returned `ncclInProgress`, NCCL's helper thread may
/// not have launched its kernel yet: the order is taken when the application reads
/// `ncclSuccess` through `ncclCommGetAsyncError` (NCCL requires it to, before anything else on
/// the stream; see [`nccl_state_seen`]), so the call returns at once, as NCCL's did. Does
/// nothing for a call that queued no ticket (one captured into a graph).
pub fn forwarded(comm: ncclComm_t, stream: cudaStream_t, code: ResultCode) {
    let Some(entry) = ENGINES.lock().get(&(comm as usize)).cloned() else {
        return;
    };
    let mut state = entry.state.lock();
    if let State::Ready(ready) = &mut *state {
        if !std::mem::take(&mut ready.ticket_awaits_nccl) {
            return;
        }
        if code == ResultCode::IN_PROGRESS {
            ready.order_pending = Some(stream);
            return;
        }
        if let Err(e) = order_after(ready, stream) {
            log::warn!("ncclAllReduce on communicator {comm:p}: {e}");
            ready.rank.give_up();
        }
    }
}

/// Called with the real NCCL state of `comm` that the application just read through
/// `ncclCommGetAsyncError`, or that was read after one of its calls went to NCCL as
/// `nonblocking-comm`. On `ncclSuccess`, a forwarded call that NCCL was still launching is now
/// queued: the communicator's next launch is ordered after it (see [`forwarded`]); read by the
/// application's own thread, this is the moment its stream holds nothing newer (NCCL forbids
/// other work on it before). On an error, this rank's part of the engine is given up, so that
/// peers still running calls on StragglAR stop waiting for it instead of hanging. Never waits
/// for a call in progress, and never synchronises (a stream may be capturing).
pub fn nccl_state_seen(comm: ncclComm_t, state: ResultCode) {
    if state == ResultCode::IN_PROGRESS {
        return;
    }
    let Some(entry) = ENGINES.lock().get(&(comm as usize)).cloned() else {
        return;
    };
    if state != ResultCode::SUCCESS {
        if let Some(control) = entry.control.lock().as_ref() {
            if !control.aborted() {
                log::warn!(
                    "communicator {comm:p}: NCCL reports error {}; the GPU engine gives this rank up",
                    state.0
                );
            }
            control.abort();
        }
    }
    let Some(mut engine) = entry.state.try_lock() else {
        // A call holds it; that call's launch takes a pending order itself, and a raised
        // abort word fails it.
        return;
    };
    if let State::Ready(ready) = &mut *engine {
        if state != ResultCode::SUCCESS {
            // Any thread may be here, while any stream may capture: nothing synchronous.
            ready.rank.give_up();
        } else if let Some(forwarded_on) = ready.order_pending.take() {
            // Where another thread read the state, or the stream began a capture since, the
            // order is dropped: the next launch stays ordered after the call's ticket only.
            // SAFETY: the application's stream of the forwarded call, which NCCL's contract
            // keeps valid until the application has seen that call succeed.
            match unsafe { driver::capture_of(ready.rank.device(), forwarded_on.cast()) } {
                Ok(Capture::None) => {
                    if let Err(e) = order_after(ready, forwarded_on) {
                        log::warn!("communicator {comm:p}: {e}");
                        ready.rank.give_up();
                    }
                }
                _ => log::debug!("communicator {comm:p}: a forwarded call's order was not taken"),
            }
        }
    }
}

/// The result of a call whose communicator was aborted or destroyed (on another thread) while
/// the call set the engine up: the call must not go to NCCL, whose communicator may be gone.
fn forgotten_during_setup(comm: ncclComm_t) -> ResultCode {
    log::warn!("ncclAllReduce on communicator {comm:p}: the communicator was aborted or destroyed while the call set the GPU engine up");
    CallError::Failed(STATUS_ABORTED).nccl_code()
}

/// Runs one eligible call on the GPU engine, setting the communicator up on its first call.
/// `Err` names why the call stays on NCCL; `Ok` is the call's result code.
pub fn all_reduce(call: &EngineCall) -> Result<ResultCode, Fallback> {
    let key = call.comm as usize;
    let (entry, fresh) = {
        let mut engines = ENGINES.lock();
        match engines.get(&key) {
            Some(e) => (e.clone(), false),
            None => {
                let e = Arc::new(Entry {
                    state: Mutex::new(State::SettingUp),
                    control: Mutex::new(None),
                    forgotten: Default::default(),
                    polling: Mutex::new(()),
                    reported: Default::default(),
                    designated: Arc::new(std::sync::atomic::AtomicI64::new(-1)),
                });
                engines.insert(key, e.clone());
                (e, true)
            }
        }
    };
    let mut state = entry.state.lock();
    if fresh {
        match set_up(call, &entry) {
            Ok(ready) if entry.forgotten.load(std::sync::atomic::Ordering::Acquire) => {
                // Destroyed or aborted while setting up: nothing of it may be used.
                abandon(ready);
                return Ok(forgotten_during_setup(call.comm));
            }
            Ok(ready) => *state = State::Ready(Box::new(ready)),
            Err(Fallback::CapturingBeforeSetup) => {
                // Not capturing later may let it set up: forget this attempt.
                ENGINES.lock().remove(&key);
                return Err(Fallback::CapturingBeforeSetup);
            }
            Err(_) if entry.forgotten.load(std::sync::atomic::Ordering::Acquire) => {
                *state = State::Refused;
                return Ok(forgotten_during_setup(call.comm));
            }
            Err(cause) => {
                *state = State::Refused;
                return Err(cause);
            }
        }
    }
    let outcome = match &mut *state {
        State::SettingUp | State::Refused => return Err(Fallback::SetupRefused),
        State::Ready(ready) => {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| launch(ready, call))) {
                Ok(outcome) => outcome,
                Err(_) => {
                    // Its peers may already wait for this rank's part of the call: its failure
                    // word releases them, and its abort word fails its later calls.
                    ready.rank.give_up();
                    log::warn!(
                        "ncclAllReduce on communicator {:p}: the GPU engine panicked; this rank gives the communicator up",
                        call.comm
                    );
                    return Ok(ResultCode::INTERNAL_ERROR);
                }
            }
        }
    };
    if entry.forgotten.load(std::sync::atomic::Ordering::Acquire) {
        // Aborted (or destroyed) while this call ran: `forget` could not take the state, so
        // the memory is abandoned here, never freed under kernels NCCL's abort has yet to stop.
        if let State::Ready(ready) = std::mem::replace(&mut *state, State::Refused) {
            abandon(*ready);
        }
    }
    match outcome? {
        Ok(()) => Ok(ResultCode::SUCCESS),
        Err(e) => {
            log::warn!("ncclAllReduce on communicator {:p}: {e}", call.comm);
            Ok(e.nccl_code())
        }
    }
}

/// The straggler designated after the last arrival record the engine read for `comm` (for
/// that record's size class); `None` when none is or the engine does not serve `comm`. Never
/// waits for a call in progress.
pub fn designated(comm: ncclComm_t) -> Option<usize> {
    let entry = ENGINES.lock().get(&(comm as usize)).cloned()?;
    usize::try_from(entry.designated.load(std::sync::atomic::Ordering::Relaxed)).ok()
}

/// Why `arrivals` has no line to give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoArrivals {
    /// The GPU engine does not serve the communicator: no records are kept.
    Unserved,
    /// The rank is not one of the communicator's.
    NoSuchRank,
    /// A call of the communicator holds its state (its host waits for its GPU): try again.
    Busy,
}

/// `rank`'s arrivals on `comm` (a line of its straggler report). Waits at most 10 ms for a
/// call in progress.
pub fn arrivals(
    comm: ncclComm_t,
    rank: usize,
) -> Result<crate::detect::tally::RankArrivals, NoArrivals> {
    let entry = ENGINES
        .lock()
        .get(&(comm as usize))
        .cloned()
        .ok_or(NoArrivals::Unserved)?;
    let state = entry
        .state
        .try_lock_for(std::time::Duration::from_millis(10))
        .ok_or(NoArrivals::Busy)?;
    match &*state {
        State::Ready(ready) => ready.tracker.arrivals(rank).ok_or(NoArrivals::NoSuchRank),
        _ => Err(NoArrivals::Unserved),
    }
}

/// The asynchronous error the engine holds for `comm`, if a kernel of it gave up (logged once).
/// Never waits for a call in progress.
pub fn async_error(comm: ncclComm_t) -> Option<ResultCode> {
    let entry = ENGINES.lock().get(&(comm as usize)).cloned()?;
    let status = entry.control.lock().as_ref().map(Control::status)?;
    if status == STATUS_OK {
        return None;
    }
    if !entry
        .reported
        .swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        log::warn!("communicator {comm:p}: {}", status_text(status));
    }
    Some(CallError::Failed(status).nccl_code())
}

/// How long a destroyed communicator waits for its peers to finish reading its staging.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Forgets `comm` (Destroy, Abort, Finalize, Revoke; or a new communicator at its address).
/// With `abort`, every kernel of it is released first, without waiting for anything, and its
/// memory is set aside until no rank can touch it (see [`sweep_abandoned`]). Otherwise the
/// staging is freed once every peer has finished as many calls as this rank launched (their
/// epochs, read through the mappings; 10 s at most) and this rank released the peers'
/// staging. The free waits for this
/// rank's own kernels, as NCCL's teardown waits for its own: a kernel waiting for a peer that
/// never comes ends only by `STRAGGLAR_TIMEOUT_MS`, a peer's failure, or ncclCommAbort.
pub fn forget(comm: ncclComm_t, abort: bool) {
    let Some(entry) = ENGINES.lock().remove(&(comm as usize)) else {
        return;
    };
    entry
        .forgotten
        .store(true, std::sync::atomic::Ordering::Release);
    // A setup's query of NCCL's state in flight ends before NCCL frees the communicator (the
    // caller forwards the teardown after this returns); later ones see `forgotten`.
    drop(entry.polling.lock());
    if abort {
        if let Some(control) = entry.control.lock().as_ref() {
            control.abort();
        }
        // A call or a setup in progress holds the state; it finds `forgotten` set.
        if let Some(mut state) = entry.state.try_lock() {
            if let State::Ready(ready) = std::mem::replace(&mut *state, State::Refused) {
                abandon(*ready);
            }
        }
        return;
    }
    let mut state = entry.state.lock();
    let State::Ready(ready) = std::mem::replace(&mut *state, State::Refused) else {
        return;
    };
    log_report(&ready, comm);
    let layout = ready.rank.layout();
    let launched = ready.launched as u32;
    let behind = |a: u32, b: u32| b.wrapping_sub(a) as i32 > 0;
    // Every eager call of this rank has run, and every peer has run as many calls as this
    // rank did (more than its eager launches where graph replays advanced its epoch): read
    // afresh on every pass, since this rank's own calls may still be finishing.
    let drained = || {
        let Ok(own) = ready.rank.staging().read_u32(layout.epoch()) else {
            return true;
        };
        let target = if behind(launched, own) { own } else { launched };
        !behind(own, launched)
            && ready.mappings.iter().flatten().all(|m| {
                m.read_u32(layout.epoch())
                    .map_or(true, |peer| !behind(peer, target))
            })
    };
    let deadline = std::time::Instant::now() + DRAIN;
    while !drained() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Every rank's tickets go to rank 0's board, and a waiting ticket reads every rank's
    // failure word: each rank stays until the last call's record is complete, so no peer's
    // arrival protocol touches freed memory.
    while !ready.rank.board_settled() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    if ready.captured > 0 {
        if let Some(counts) = ready.rank.graph_counts() {
            let last = match counts.last_straggler {
                Some(rank) => format!("the last on StragglAR with rank {rank} as the straggler"),
                None => "the last on the baseline".into(),
            };
            log::info!(
                "communicator {comm:p}: {} calls captured into graphs; their replays chose on the GPU: {} StragglAR, {} the baseline (Ring where it fits the staging); {last}",
                ready.captured,
                counts.stragglar,
                counts.baseline
            );
        }
    }
    // Peers that aborted wait for this rank's release before they free their staging.
    let mut ready = ready;
    release_peers(&mut ready);
    // Freed here (cuMemFree waits for this rank's own kernels).
    drop(ready);
    sweep_abandoned();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_a_call_stays_on_nccl_and_the_communicator_is_remembered() {
        if let crate::gpu::probe::Driver::Devices(n) = crate::gpu::probe::probe().driver {
            if n > 0 {
                return;
            }
        }
        let call = EngineCall {
            comm: 0x7700 as ncclComm_t,
            rank: 1,
            ranks: 8,
            device: 0,
            send: 0x1000,
            recv: 0x2000,
            count: 1 << 20,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            scale: Scale::None,
            stream: std::ptr::null_mut(),
        };
        assert_eq!(all_reduce(&call), Err(Fallback::GpuUnavailable));
        assert_eq!(
            all_reduce(&call),
            Err(Fallback::SetupRefused),
            "decided once"
        );
        assert_eq!(async_error(call.comm), None);
        forget(call.comm, false);
        assert_eq!(
            all_reduce(&call),
            Err(Fallback::GpuUnavailable),
            "a new communicator"
        );
        forget(call.comm, true);
    }

    #[test]
    fn the_staging_fits_every_eligible_call() {
        let l = layout(&mut PlanCache::default(), 8).unwrap();
        assert!(l.arena_bytes >= crate::config::get().buffer_bytes as u64);
        assert_eq!(l.blocks, BLOCKS as u64);
    }
}
