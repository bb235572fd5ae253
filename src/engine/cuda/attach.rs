//! Attaching the GPU engine to an NCCL communicator, at its first eligible call: this rank's
//! GPU and kernels (found once per process), its staging under the device's cap, the setup
//! protocol run through the real communicator's AllGather (`super::setup::run_setup`), and,
//! when the verdict (the same on every rank) is Eligible, the communicator's engine.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::args::Operands;
use super::budget::StagingBudget;
use super::comm::{Baseline, CommParts, CudaComm, Decline, OrderingEvents, NVSWITCH_LINK};
use super::driver::{self, Device, DeviceMemory, IpcMapping, Kernels};
use super::nvls::nccl_would_run_nvls;
use super::rank::{Control, CudaRank, RankConfig};
use super::setup::{
    run_setup, settings_of, Devices, Exchange, Identity, LocalFailure, PeerAccess, SetupError,
    SetupRecord,
};
use super::staging::{StagingLayout, PROBE_WORDS};
use crate::detect::policy::Policy;
use crate::gpu::launch::MAX_THREADS;
use crate::nccl::types::{cudaStream_t, ncclComm_t, DataTypeCode, RedOpCode, ResultCode};
use crate::plan::{PlanCache, Shape};
use crate::reduce::{DataType, ReduceOp, Scale};
use crate::schedule::model::Nvls;

/// The fewest plan blocks a rank's grid takes.
pub const MIN_BLOCKS: u32 = 8;
/// The most plan blocks a rank's grid takes (and what `doctor` sizes the staging for).
pub const MAX_BLOCKS: u32 = 32;

/// Bytes of one chunk a plan block should have at the largest message the staging takes: one
/// batch of loads in flight for each of its threads (8 x 16 B x 512 threads).
pub const BLOCK_MIN_BYTES: usize = 64 << 10;

/// The plan blocks of each rank of an `ranks`-rank communicator on a GPU of `sms`
/// multiprocessors whose staging takes messages of up to `buffer_bytes`, chosen once per
/// communicator: one 512-thread block per multiprocessor, a quarter of them, no more than give
/// each block [`BLOCK_MIN_BYTES`] of a chunk of the largest message (a chunk is at most
/// `buffer_bytes / (ranks - 1)`; `ranks` is taken as the divisor, for pipelined plans' smaller
/// pieces), within [`MIN_BLOCKS`, `MAX_BLOCKS`]. Bytes in flight set a remote read's rate: each
/// block keeps up to 8 x 16 B x 512 threads = 64 KiB of loads in flight, and a link of about
/// 450 GB/s with a few microseconds of latency needs on the order of 1-2 MiB, so 32 blocks on an
/// H100/H200 (132 multiprocessors; 27 on an A100's 108) with the default 256 MiB buffer, where
/// the old fixed grid of 16 held half that; a small buffer (`STRAGGLAR_BUFFER_BYTES`) takes
/// fewer blocks, whose flags would otherwise cost more than their few bytes. The rest of the
/// GPU stays with the job's kernels that overlap the collective. Every rank of a homogeneous
/// server derives the same grid; ranks whose GPUs differ announce different layouts and the
/// setup declines (the communicator stays on NCCL). Not measured on a GPU.
pub fn blocks_for(sms: u32, buffer_bytes: usize, ranks: usize) -> u32 {
    let by_buffer = buffer_bytes / ranks.max(1) / BLOCK_MIN_BYTES;
    (sms / 4)
        .min(u32::try_from(by_buffer).unwrap_or(u32::MAX))
        .clamp(MIN_BLOCKS, MAX_BLOCKS)
}

/// One `ncclAllReduce`, as the engine needs it: the call's arguments as NCCL takes them (to
/// hand it to NCCL), and as our kernels take them.
pub struct EngineCall {
    pub comm: ncclComm_t,
    pub rank: usize,
    pub ranks: usize,
    pub device: i32,
    pub send: u64,
    pub recv: u64,
    pub count: usize,
    /// The caller's `ncclDataType_t` and `ncclRedOp_t`, passed to NCCL unchanged.
    pub nccl_dtype: DataTypeCode,
    pub nccl_op: RedOpCode,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// The copy-in scaling (`Scale::for_op`), computed by the caller.
    pub scale: Scale,
    pub stream: cudaStream_t,
}

impl EngineCall {
    /// What the call's kernel reduces.
    pub fn operands(&self) -> Operands {
        Operands {
            count: self.count,
            dtype: self.dtype,
            op: self.op,
            scale: self.scale,
            input: self.send,
            output: self.recv,
        }
    }

    /// How log lines name the call's communicator.
    pub fn label(&self) -> String {
        format!("communicator {:p}", self.comm)
    }
}

/// What the communicator's entry lends its setup: whether the communicator was aborted or
/// destroyed meanwhile, and the lock that keeps NCCL from freeing it during a state query.
pub struct SetupWatch {
    /// Set by `forget`: a setup still running must not install its result.
    pub forgotten: AtomicBool,
    /// Held across a setup's check of `forgotten` and its query of NCCL's state, and taken by
    /// `forget` after setting `forgotten`: no query runs on a communicator NCCL is freeing.
    pub polling: Mutex<()>,
    /// The rank's abort and status words, once its staging exists.
    pub control: Mutex<Option<Control>>,
    /// Where the engine publishes its designation (the rank, or -1).
    pub designated: Arc<AtomicI64>,
}

impl Default for SetupWatch {
    fn default() -> SetupWatch {
        SetupWatch {
            forgotten: AtomicBool::new(false),
            polling: Mutex::new(()),
            control: Mutex::new(None),
            designated: Arc::new(AtomicI64::new(-1)),
        }
    }
}

impl SetupWatch {
    pub fn forgotten(&self) -> bool {
        self.forgotten.load(Ordering::Acquire)
    }
}

/// A communicator the engine serves: its engine, and its staging counted against the device's
/// cap (released after the engine frees it: fields drop in order).
pub struct Attached {
    pub comm: CudaComm,
    pub _reservation: Reservation,
}

/// Staging in use per device, against `STRAGGLAR_STAGING_CAP`.
static BUDGET: Lazy<Mutex<StagingBudget>> = Lazy::new(Default::default);

/// Staging bytes counted against a device's cap until dropped (with the staging it counts:
/// an aborted communicator's once every peer released it).
pub struct Reservation {
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
/// schedules are lowered into `plans`, which the communicator's engine keeps.
pub fn layout(
    plans: &mut PlanCache,
    policy: &Policy,
    blocks: u32,
) -> Result<StagingLayout, String> {
    let buffer = crate::config::get().buffer_bytes;
    let ranks = policy.ranks();
    let mut layout = StagingLayout {
        arena_bytes: 64,
        values: 1,
        blocks: blocks as u64,
        ranks: ranks as u64,
    };
    // StragglAR with every straggler and every pipeline depth a call may run (graph replays
    // run Ring as their baseline where it fits): a deeper pipeline needs less arena (smaller
    // pieces) and more flags.
    for pieces in policy.pieces_up_to(buffer) {
        for choice in 0..ranks {
            let shape = Shape::of_choice(ranks, choice, DataType::U8).with_pieces(pieces);
            let need = plans.lowered(shape)?.need();
            for dtype in [DataType::U8, DataType::F16, DataType::F32, DataType::F64] {
                let arena = need.arena_bytes(buffer / dtype.size(), dtype);
                layout.arena_bytes = layout.arena_bytes.max(arena as u64);
            }
            layout.values = layout.values.max(need.values as u64);
        }
    }
    // Ring's flags too (its arena may not fit: graph replays then take StragglAR's last rank
    // as their baseline), so that flags never decide the baseline.
    let ring = plans
        .lowered(Shape::of_choice(ranks, ranks, DataType::U8))?
        .need();
    layout.values = layout.values.max(ring.values as u64);
    Ok(layout)
}

/// Staging bytes one rank of an `n`-rank communicator allocates at most (the largest grid; for
/// doctor).
pub fn staging_bytes(ranks: usize) -> Result<u64, String> {
    layout(&mut PlanCache::default(), &policy(ranks), MAX_BLOCKS).map(|l| l.allocation_bytes())
}

/// The setup's AllGather through the real communicator, on the caller's stream.
struct NcclExchange<'a> {
    device: &'a Arc<Device>,
    watch: &'a SetupWatch,
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
        // SAFETY: `own` holds `len` bytes and `buffer` `len * ranks` on the communicator's
        // device; the communicator is live (its teardown sets `forgotten` first and waits for
        // `polling`) and the stream is the caller's.
        let rc = unsafe {
            crate::nccl::real::all_gather(
                own.ptr as *const std::ffi::c_void,
                buffer.ptr as *mut std::ffi::c_void,
                len,
                DataTypeCode(1), // ncclUint8
                self.comm,
                self.stream,
            )
        };
        // A nonblocking communicator may still be launching it: nothing may follow on the
        // stream until NCCL's state settles.
        let rc = match rc {
            ResultCode::IN_PROGRESS => {
                let watch = self.watch;
                let comm = self.comm;
                let poll = || {
                    let _polling = watch.polling.lock();
                    (!watch.forgotten()).then(|| crate::nccl::nonblocking::async_state(comm))
                };
                match crate::nccl::nonblocking::settle(poll) {
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

/// Connects `rank` to the peers whose staging `mappings` opened (its own where `None`).
pub fn connect(rank: &mut CudaRank, mappings: &[Option<IpcMapping>]) -> bool {
    let layout = rank.layout();
    let peers: Vec<_> = mappings
        .iter()
        .map(|m| m.as_ref().map_or(rank.own_peer(), |m| layout.peer(m.ptr)))
        .collect();
    rank.connect(&peers).is_ok()
}

/// The policy of an `n`-rank communicator, from the configuration (its model prices NCCL as
/// Ring until [`with_setup_facts`] says otherwise).
pub fn policy(ranks: usize) -> Policy {
    let config = crate::config::get();
    Policy::new(ranks, config.algo, config.straggler, NVSWITCH_LINK).with_pipeline(config.pipeline)
}

/// `policy` once the setup's records are known: its model prices NCCL as NVLS when every
/// rank's record says NCCL would run it there. The depths `policy` worked out while sizing the
/// staging stay with it (no schedule is synthesized again on the first calls).
pub fn with_setup_facts(policy: Policy, records: &[SetupRecord]) -> Policy {
    match !records.is_empty() && records.iter().all(|r| r.nvls == 1) {
        true => policy.with_nvls_baseline(Nvls {
            ratio: Nvls::PUBLISHED_RATIO,
        }),
        false => policy,
    }
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
        blocks: layout.blocks as u32,
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
            )
            .with_nvls(nccl_would_run_nvls(device)),
            _ => failed(LocalFailure::NoIpc),
        },
    };
    (rank, record)
}

/// Runs the setup of `call`'s communicator: `Ok` with its engine when every rank is
/// eligible, or why its calls stay on NCCL. Every rank that has a driver joins both
/// all-gathers, whatever fails locally (with a failed record), so its peers never wait for it.
/// Staging of aborted communicators no rank touches any more should be freed before (it
/// leaves the cap).
pub fn attach(call: &EngineCall, watch: &SetupWatch) -> Result<Attached, Decline> {
    // Without a driver or device NCCL cannot run here either, so no peer waits on this rank's
    // setup; from here on, a local failure still joins both all-gathers with a failed record.
    let device = device(call.device).map_err(|_| Decline::GpuUnavailable)?;
    // Every rank asks its own stream; one that cannot tell still joins the setup (its peers
    // are entering the same collectives) with a failed record, so every rank refuses alike.
    // SAFETY: the caller's stream of this communicator's device.
    let stream_state = match unsafe { driver::is_capturing(&device, call.stream.cast()) } {
        Ok(true) => return Err(Decline::CapturingBeforeSetup),
        Ok(false) => Ok(()),
        Err(e) => {
            log::warn!(
                "{}: {e}: this rank joins the GPU engine's setup as failed",
                call.label()
            );
            Err(LocalFailure::NoStreamState)
        }
    };
    // Kernels that cannot load make this rank's record a failed one: its peers still join.
    let kernel = kernels(call.device, &device);
    let mut plans = PlanCache::default();
    let sms = device.sm_count().unwrap_or_else(|e| {
        log::warn!(
            "{}: {e}: the grid assumes {MIN_BLOCKS} blocks",
            call.label()
        );
        0
    });
    let base_policy = policy(call.ranks);
    let blocks = blocks_for(sms as u32, crate::config::get().buffer_bytes, call.ranks);
    let layout = layout(&mut plans, &base_policy, blocks).map_err(|_| Decline::GpuUnavailable)?;
    let reservation = Reservation::take(call.device, layout.allocation_bytes());
    // A panic in the local steps must not make this rank skip the collectives its peers run.
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
        *watch.control.lock() = Some(r.control());
    }
    let mut exchange = NcclExchange {
        device: &device,
        watch,
        comm: call.comm,
        stream: call.stream,
        ranks: call.ranks,
    };
    let mut access = IpcAccess {
        device: &device,
        layout,
        rank: call.rank,
    };
    let mut ordering = None;
    let finish = |mappings: &[Option<IpcMapping>], records: &[SetupRecord]| {
        let Ok(r) = &mut rank else {
            return false;
        };
        ordering = (tickets_are_atomic(&device, records) && connect(r, mappings))
            .then(|| OrderingEvents::new(&device).ok())
            .flatten();
        ordering.is_some()
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
                "{}: StragglAR stays off: {}",
                call.label(),
                verdict.describe()
            );
            return Err(Decline::SetupRefused);
        }
        Err(SetupError::Exchange(why)) => {
            log::warn!("{}: setup failed: {why}", call.label());
            return Err(Decline::SetupRefused);
        }
    };
    // The final verdict was Eligible on every rank, so this rank's steps all succeeded.
    let (Ok(rank), Some(reservation), Some(ordering)) = (rank, reservation, ordering) else {
        return Err(Decline::SetupRefused);
    };
    let parts = CommParts {
        rank,
        members: joined.records.iter().map(SetupRecord::member).collect(),
        mappings: joined.mappings,
        plans,
        policy: with_setup_facts(base_policy, &joined.records),
        max_bytes: crate::config::get().buffer_bytes,
        baseline: Baseline::Nccl,
        designated: watch.designated.clone(),
        trace: open_trace(call),
        label: call.label(),
        ordering,
    };
    let prior = match parts.policy.nvls_baseline() {
        true => "NVLS",
        false => "Ring",
    };
    let comm = CudaComm::new(parts);
    log::info!(
        "{}: the GPU engine serves its AllReduce ({} ranks, {} MiB of staging on device {}: {} of STRAGGLAR_STAGING_CAP {} MiB in use); until measured, NCCL is priced as {prior}",
        call.label(),
        call.ranks,
        layout.allocation_bytes() >> 20,
        call.device,
        BUDGET.lock().used(call.device) >> 20,
        crate::config::get().staging_cap >> 20
    );
    Ok(Attached {
        comm,
        _reservation: reservation,
    })
}

/// This rank's trace of `call`'s communicator, with `STRAGGLAR_TRACE_DIR`.
fn open_trace(call: &EngineCall) -> Option<crate::trace::TraceWriter> {
    let dir = crate::config::get().trace_dir.as_deref()?;
    let label = format!("-comm{:x}", call.comm as usize);
    match crate::trace::TraceWriter::create_labelled(std::path::Path::new(dir), call.rank, &label) {
        Ok(writer) => Some(writer),
        Err(e) => {
            log::warn!(
                "STRAGGLAR_TRACE_DIR {dir}: {e}; no trace for {}",
                call.label()
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_staging_fits_every_eligible_call() {
        let buffer = crate::config::get().buffer_bytes;
        let plain = layout(&mut PlanCache::default(), &policy(8), 27).unwrap();
        assert!(plain.arena_bytes >= buffer as u64);
        assert_eq!(plain.blocks, 27);
        // Pipelined per size class: every depth's plans fit, in no more arena than the plain
        // schedule's (smaller pieces), with more flags.
        let auto = policy(8).with_pipeline(crate::detect::pipeline::Pipeline::Auto);
        let mut plans = PlanCache::default();
        let piped = layout(&mut plans, &auto, 27).unwrap();
        let depths = auto.pieces_up_to(buffer);
        assert!(depths.len() > 1 && depths[0] == 1, "{depths:?}");
        for &pieces in &depths {
            for straggler in 0..8 {
                let shape = Shape::of_choice(8, straggler, DataType::F32).with_pieces(pieces);
                let need = plans.lowered(shape).unwrap().need();
                assert!(need.arena_bytes(buffer / 4, DataType::F32) as u64 <= piped.arena_bytes);
                assert!(need.values as u64 <= piped.values);
            }
        }
        for ranks in 2..=16 {
            let mut plans = PlanCache::default();
            let fitted = layout(&mut plans, &policy(ranks), 8).unwrap();
            let ring = Shape::of_choice(ranks, ranks, DataType::U8);
            let need = plans.lowered(ring).unwrap().need();
            assert!(
                need.values as u64 <= fitted.values,
                "Ring's flags at {ranks} ranks"
            );
        }
        assert_eq!(piped.arena_bytes, plain.arena_bytes);
        assert!(piped.values > plain.values);
        eprintln!(
            "8 ranks, {buffer} B: plain {} B ({} flags), auto {depths:?} {} B ({} flags)",
            plain.allocation_bytes(),
            plain.values,
            piped.allocation_bytes(),
            piped.values
        );
    }

    #[test]
    fn the_grid_follows_the_multiprocessors_within_bounds() {
        let buffer = crate::config::DEFAULT_BUFFER_BYTES;
        assert_eq!(blocks_for(132, buffer, 8), 32, "H100/H200");
        assert_eq!(blocks_for(108, buffer, 8), 27, "A100");
        assert_eq!(blocks_for(32, buffer, 8), MIN_BLOCKS);
        assert_eq!(blocks_for(0, buffer, 8), MIN_BLOCKS, "an unknown count");
        assert_eq!(blocks_for(1000, buffer, 8), MAX_BLOCKS);
        // A small buffer: each block keeps a batch of loads' worth of the largest chunk.
        assert_eq!(blocks_for(132, 16 << 20, 8), 32);
        assert_eq!(blocks_for(132, 12 << 20, 8), 24);
        assert_eq!(blocks_for(132, 12 << 20, 4), 32);
        assert_eq!(blocks_for(132, 1 << 20, 8), MIN_BLOCKS);
        assert_eq!(blocks_for(132, usize::MAX, 8), 32, "no overflow");
    }
}
