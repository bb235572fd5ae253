//! The GPU engine behind `ncclAllReduce` (experimental, off unless `STRAGGLAR_GPU_ENGINE=1`:
//! nothing here has run on several GPUs yet).
//!
//! Per communicator, at its first eligible call (outside groups, never while the stream
//! captures): the staging is allocated, the setup protocol runs through the real communicator's
//! AllGather (`setup::run_setup`), and the verdict, the same on every rank, either enables the
//! engine or keeps the communicator on NCCL for good. Enabled calls launch our kernel on the
//! caller's stream; calls of one communicator on different streams are ordered by an event, so
//! a rank never starts call e+1 before its call e (the premise of the two parities).

use std::collections::HashMap;
use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::driver::{self, Device, DeviceMemory, Event, IpcMapping, Kernel};
use super::rank::{status_text, CallError, CudaRank, RankConfig};
use super::setup::{
    run_setup, settings_of, Exchange, Identity, LocalFailure, PeerAccess, SetupError, SetupRecord,
};
use super::staging::StagingLayout;
use crate::engine::host::runner::{PlanCache, Shape};
use crate::gpu::kernels::ALL_REDUCE_KERNEL;
use crate::gpu::launch::{MAX_THREADS, STATUS_OK};
use crate::intercept::fallback::Fallback;
use crate::nccl::types::{cudaStream_t, ncclComm_t, DataTypeCode, ResultCode};
use crate::reduce::{DataType, ReduceOp, Scale};
use crate::schedule::Algorithm;

/// Blocks per rank on a GPU of its own (each rank of a communicator has one).
const BLOCKS: u32 = 16;

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

/// A communicator the engine serves.
struct Ready {
    rank: CudaRank,
    /// Peers' staging, open for the communicator's lifetime.
    mappings: Vec<Option<IpcMapping>>,
    plans: PlanCache,
    straggler: usize,
    /// Orders this communicator's launches across the caller's streams.
    last: Event,
    last_stream: cudaStream_t,
}

// SAFETY: the raw stream handle is only compared and passed back to the driver, which lets any
// thread use it.
unsafe impl Send for Ready {}

enum State {
    Ready(Box<Ready>),
    /// Kept on NCCL for good (the verdict was the same on every rank).
    Refused,
}

static ENGINES: Lazy<Mutex<HashMap<usize, Arc<Mutex<State>>>>> = Lazy::new(Default::default);

/// A GPU opened, and our kernel loaded on it (or why not: NVRTC missing, compilation failed).
type Loaded = Result<(Arc<Device>, Result<Arc<Kernel>, String>), String>;

/// Each GPU as the engine found it, once (the reasons are logged once).
static GPUS: Lazy<Mutex<HashMap<i32, Loaded>>> = Lazy::new(Default::default);

fn gpu(ordinal: i32) -> Loaded {
    GPUS.lock()
        .entry(ordinal)
        .or_insert_with(|| {
            let loaded = load(ordinal);
            match &loaded {
                Err(why) => log::warn!(
                    "GPU engine unavailable on device {ordinal}: {why}; AllReduce stays on NCCL"
                ),
                Ok((_, Err(why))) => log::warn!(
                    "GPU engine kernels unavailable on device {ordinal}: {why}; AllReduce stays on NCCL"
                ),
                Ok(_) => {}
            }
            loaded
        })
        .clone()
}

fn load(ordinal: i32) -> Loaded {
    match crate::gpu::probe::probe().driver {
        crate::gpu::probe::Driver::Devices(n) if n > ordinal => {}
        _ => return Err("no usable CUDA driver or device".into()),
    }
    let device = Device::open(ordinal).map_err(|e| e.to_string())?;
    let kernel = (|| {
        let arch = device.arch().map_err(|e| e.to_string())?;
        let cache = crate::gpu::nvrtc::default_cache_dir(crate::config::get().cache_dir.as_deref());
        let (cubin, _) =
            crate::gpu::nvrtc::cubin_cached(&arch, cache.as_deref()).map_err(|e| e.to_string())?;
        Kernel::load(&device, &cubin, ALL_REDUCE_KERNEL)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    })();
    Ok((device, kernel))
}

/// The staging every rank of an `n`-rank communicator allocates: room for the largest plan of
/// `STRAGGLAR_BUFFER_BYTES` of any type (so every eligible call fits).
fn layout(ranks: usize, straggler: usize) -> Result<StagingLayout, String> {
    let buffer = crate::config::get().buffer_bytes;
    let mut cache = PlanCache::default();
    let mut layout = StagingLayout {
        arena_bytes: 64,
        values: 1,
        blocks: BLOCKS as u64,
    };
    for dtype in [DataType::U8, DataType::F16, DataType::F32, DataType::F64] {
        let shape = Shape {
            algorithm: Algorithm::Stragglar,
            ranks,
            straggler,
            dtype,
        };
        let plan = cache.get(shape, buffer / dtype.size())?;
        layout.arena_bytes = layout.arena_bytes.max(plan.max_arena_bytes() as u64);
        layout.values = layout.values.max(plan.max_values() as u64);
    }
    Ok(layout)
}

/// The setup's AllGather through the real communicator, on the caller's stream.
struct NcclExchange<'a> {
    device: &'a Arc<Device>,
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

/// Peers' staging through CUDA IPC; the probe reads a peer's failure word (0 when fresh).
struct IpcAccess<'a> {
    device: &'a Arc<Device>,
    layout: StagingLayout,
}

impl PeerAccess for IpcAccess<'_> {
    type Mapping = IpcMapping;

    fn open(&mut self, record: &SetupRecord) -> Result<IpcMapping, String> {
        IpcMapping::open(self.device, &record.staging_handle).map_err(|e| e.to_string())
    }

    fn probe(&mut self, mapping: &IpcMapping) -> bool {
        mapping.read_u32(self.layout.failed()) == Ok(0)
    }
}

/// The straggler the plans assume until the device records arrive: `STRAGGLAR_STRAGGLER` when
/// fixed, else the last rank. Correctness never depends on it.
fn assumed_straggler(ranks: usize) -> usize {
    match crate::config::get().straggler {
        crate::detect::policy::StragglerMode::Fixed(r) if r < ranks => r,
        _ => ranks - 1,
    }
}

fn set_up(call: &EngineCall) -> Result<Ready, Fallback> {
    // Without a driver or device NCCL cannot run here either, so no peer waits on this rank's
    // setup; from here on, a local failure still joins both all-gathers with a failed record.
    let (device, kernel) = gpu(call.device).map_err(|_| Fallback::GpuUnavailable)?;
    // SAFETY: the caller's stream of this communicator's device.
    if unsafe { driver::is_capturing(&device, call.stream.cast()) }.unwrap_or(true) {
        return Err(Fallback::CapturingBeforeSetup);
    }
    let straggler = assumed_straggler(call.ranks);
    let layout = layout(call.ranks, straggler).map_err(|_| Fallback::GpuUnavailable)?;
    let config = RankConfig {
        rank: call.rank,
        ranks: call.ranks,
        layout,
        blocks: BLOCKS,
        threads: MAX_THREADS,
        timeout: crate::config::get()
            .timeout_ms
            .map(std::time::Duration::from_millis),
    };
    let failed = |why| SetupRecord::failed(call.rank, call.ranks, why);
    let rank = kernel
        .as_ref()
        .map_err(|_| LocalFailure::NoKernels)
        .and_then(|k| CudaRank::new(&device, k, config).map_err(|_| LocalFailure::NoMemory));
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
    let mut exchange = NcclExchange {
        device: &device,
        comm: call.comm,
        stream: call.stream,
        ranks: call.ranks,
    };
    let mut access = IpcAccess {
        device: &device,
        layout,
    };
    let mappings = match run_setup(&mut exchange, &mut access, &record) {
        Ok(m) => m,
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
    let mut rank = rank.map_err(|_| Fallback::SetupRefused)?;
    let peers: Vec<_> = mappings
        .iter()
        .map(|m| m.as_ref().map_or(rank.own_peer(), |m| layout.peer(m.ptr)))
        .collect();
    rank.connect(&peers).map_err(|_| Fallback::SetupRefused)?;
    let last = Event::new(&device).map_err(|_| Fallback::SetupRefused)?;
    log::info!(
        "communicator {:p}: the GPU engine serves its AllReduce ({} ranks, {} B of staging per rank)",
        call.comm,
        call.ranks,
        layout.allocation_bytes()
    );
    Ok(Ready {
        rank,
        mappings,
        plans: PlanCache::default(),
        straggler,
        last,
        last_stream: call.stream,
    })
}

fn launch(ready: &mut Ready, call: &EngineCall) -> Result<(), CallError> {
    let shape = Shape {
        algorithm: Algorithm::Stragglar,
        ranks: call.ranks,
        straggler: ready.straggler,
        dtype: call.dtype,
    };
    let plan = ready
        .plans
        .get(shape, call.count)
        .map_err(CallError::Unfit)?
        .clone();
    let stream = call.stream.cast();
    if call.stream != ready.last_stream {
        // SAFETY: both are the caller's live streams of this device.
        unsafe { ready.last.wait_on(stream) }?;
        ready.last_stream = call.stream;
    }
    // SAFETY: the caller's buffers hold `count` elements on this device (NCCL's contract for
    // ncclAllReduce), and the stream is the caller's.
    unsafe {
        ready
            .rank
            .all_reduce(&plan, call.op, call.scale, call.send, call.recv, stream)
    }?;
    // SAFETY: as above.
    unsafe { ready.last.record_raw(stream) }?;
    Ok(())
}

/// Runs one eligible call on the GPU engine, setting the communicator up on its first call.
/// `Err` names why the call stays on NCCL; `Ok` is the call's result code.
pub fn all_reduce(call: &EngineCall) -> Result<ResultCode, Fallback> {
    let state = ENGINES.lock().get(&(call.comm as usize)).cloned();
    let state = match state {
        Some(s) => s,
        None => {
            let (made, first) = match set_up(call) {
                Ok(ready) => (State::Ready(Box::new(ready)), None),
                // Not capturing now may mean capturing later: try again at the next call.
                Err(Fallback::CapturingBeforeSetup) => return Err(Fallback::CapturingBeforeSetup),
                Err(cause) => (State::Refused, Some(cause)),
            };
            ENGINES
                .lock()
                .insert(call.comm as usize, Arc::new(Mutex::new(made)));
            if let Some(cause) = first {
                return Err(cause);
            }
            ENGINES
                .lock()
                .get(&(call.comm as usize))
                .cloned()
                .expect("just inserted")
        }
    };
    let mut state = state.lock();
    match &mut *state {
        State::Refused => Err(Fallback::SetupRefused),
        State::Ready(ready) => Ok(match launch(ready, call) {
            Ok(()) => ResultCode::SUCCESS,
            Err(e) => {
                log::warn!("ncclAllReduce on communicator {:p}: {e}", call.comm);
                e.nccl_code()
            }
        }),
    }
}

/// The asynchronous error the engine holds for `comm`, if a kernel of it gave up.
pub fn async_error(comm: ncclComm_t) -> Option<ResultCode> {
    let state = ENGINES.lock().get(&(comm as usize)).cloned()?;
    let state = state.lock();
    match &*state {
        State::Ready(ready) if ready.rank.status() != STATUS_OK => {
            log::warn!(
                "communicator {comm:p}: {}",
                status_text(ready.rank.status())
            );
            Some(CallError::Failed(ready.rank.status()).nccl_code())
        }
        _ => None,
    }
}

/// How long a destroyed communicator waits for its peers to finish reading its staging.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Forgets `comm` (Destroy, Abort, Finalize, Revoke). With `abort`, every kernel of it still
/// waiting is released first; otherwise the staging is kept until every peer has finished as
/// many calls as this rank (their epochs, read through the mappings), so no peer still reads it
/// when it is freed.
pub fn forget(comm: ncclComm_t, abort: bool) {
    let Some(state) = ENGINES.lock().remove(&(comm as usize)) else {
        return;
    };
    let state = state.lock();
    let State::Ready(ready) = &*state else {
        return;
    };
    if abort {
        ready.rank.abort();
        return;
    }
    let layout = ready.rank.layout();
    let own = ready.rank.staging().read_u32(layout.epoch()).unwrap_or(0);
    let deadline = std::time::Instant::now() + DRAIN;
    for mapping in ready.mappings.iter().flatten() {
        while mapping
            .read_u32(layout.epoch())
            .is_ok_and(|peer| peer.wrapping_sub(own) > u32::MAX / 2)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    // The staging is freed with the last reference (cuMemFree waits for our own kernels).
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
        let l = layout(8, 7).unwrap();
        assert!(l.arena_bytes >= crate::config::get().buffer_bytes as u64);
        assert_eq!(l.blocks, BLOCKS as u64);
    }
}
