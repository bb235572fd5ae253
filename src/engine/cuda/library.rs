//! The GPU engine behind `ncclAllReduce` (experimental, off unless `STRAGGLAR_GPU_ENGINE=1`:
//! nothing here has run on several GPUs yet): each communicator's life around its engine
//! (`super::comm::CudaComm`), kept in the engine slot of the communicator's record
//! (`crate::registry::comms`).
//!
//! Per communicator, at its first eligible call (outside groups, never while the stream
//! captures), `super::attach` sets the engine up; the verdict, the same on every rank, either
//! enables it or keeps the communicator on NCCL for good. An enabled call runs on our kernels,
//! or, when the policy picks NCCL, takes its ticket and goes to the real NCCL from here, in
//! one step. Abort, destroy and a new communicator at the same address end an engine; an
//! aborted one's memory waits until no rank can touch it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::attach::{attach, Attached};
use super::comm::{Decline, Ran};
use super::driver;
use super::rank::{status_text, CallError, Control};
use super::watch::SetupWatch;
use crate::gpu::launch::{STATUS_ABORTED, STATUS_OK};
use crate::nccl::types::{cudaStream_t, ncclComm_t, ResultCode};

pub use super::call::EngineCall;

enum State {
    /// The first eligible call is setting it up (the entry exists so that a concurrent abort
    /// finds it).
    SettingUp,
    Ready(Box<Attached>),
    /// Kept on NCCL for good (the verdict was the same on every rank).
    Refused,
}

/// One communicator's engine: its state behind a lock, and what its setup, an abort or a
/// watchdog's poll use beside it, so that they never wait for a call that holds the lock.
struct Entry {
    state: Mutex<State>,
    watch: SetupWatch,
    /// Whether the asynchronous error was logged.
    reported: std::sync::atomic::AtomicBool,
}

impl Drop for Entry {
    /// The last reference to a forgotten communicator's engine goes: if a call still held its
    /// state when `forget` ran (so `forget` could not take it), the memory is abandoned here
    /// rather than freed under kernels NCCL's abort has yet to stop.
    fn drop(&mut self) {
        if self.watch.forgotten() {
            if let State::Ready(ready) = std::mem::replace(self.state.get_mut(), State::Refused) {
                abandon(*ready);
            }
        }
    }
}

/// The engine of `comm`, if one was ever set up or is being set up: the slot of its record.
fn entry_of(comm: ncclComm_t) -> Option<Arc<Entry>> {
    let slot = crate::registry::comms()
        .record(comm)?
        .engine
        .lock()
        .clone()?;
    slot.downcast::<Entry>().ok()
}

/// A communicator aborted while the engine served it: its memory waits here until no rank can
/// touch it (see [`sweep_abandoned`]).
struct Abandoned {
    ready: Attached,
    /// This rank's kernels have finished, and it has released every peer's staging (its
    /// mappings closed, then said so beside its failure word).
    released: bool,
}

static ABANDONED: Lazy<Mutex<Vec<Abandoned>>> = Lazy::new(Default::default);

/// Abandons `ready`'s memory after raising its abort word (its kernels give up; nothing waits
/// for them here); its trace is closed (made valid JSON) first. The memory is freed by a later
/// [`sweep_abandoned`], once no rank can touch it.
fn abandon(mut ready: Attached) {
    ready.comm.abort();
    ready.comm.release_nccl_work();
    ABANDONED.lock().push(Abandoned {
        ready,
        released: false,
    });
    sweep_abandoned();
}

/// Frees what aborted communicators no longer need, without waiting for anything: once this
/// rank's own kernels of one have finished (the abort word ends them), it releases every
/// peer's staging; once every peer has released its own, that staging is freed and its
/// reservation returned. A peer that never releases (it died, or still runs that
/// communicator) keeps it allocated. Runs at every abort, destroy and setup, so an elastic job
/// that aborts and re-creates its communicators holds at most the staging of those its peers
/// have not yet let go.
fn sweep_abandoned() {
    ABANDONED.lock().retain_mut(|abandoned| {
        if !abandoned.released {
            if !abandoned.ready.comm.kernels_finished() {
                return true;
            }
            abandoned.ready.comm.release_peers();
            abandoned.released = true;
        }
        // Dropped (freed) when every peer let go.
        !abandoned.ready.comm.released_by_every_peer()
    });
}

/// The result of a call whose communicator was aborted or destroyed (on another thread) while
/// the call set the engine up: the call must not go to NCCL, whose communicator may be gone.
fn forgotten_during_setup(comm: ncclComm_t) -> ResultCode {
    log::warn!("ncclAllReduce on communicator {comm:p}: the communicator was aborted or destroyed while the call set the GPU engine up");
    CallError::Failed(STATUS_ABORTED).nccl_code()
}

/// Who ran a call the engine took, and its result code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Our kernels (a failure there is this code; its peers are told).
    Stragglar(ResultCode),
    /// NCCL, after the call's ticket: its policy chose NCCL, or (`above_staging`) would have
    /// run StragglAR had the arenas been able to grow to hold the call.
    Nccl {
        code: ResultCode,
        above_staging: bool,
    },
}

/// Runs one eligible call on the GPU engine, setting the communicator up on its first call.
/// `Err` names why the call stays on NCCL, untouched; `Ok` says who ran it.
pub fn all_reduce(call: &EngineCall) -> Result<Served, Decline> {
    let record = crate::registry::comms().record_or_new(call.comm);
    let (entry, fresh) = {
        let mut slot = record.engine.lock();
        match slot.clone().and_then(|e| e.downcast::<Entry>().ok()) {
            Some(e) => (e, false),
            None => {
                let e = Arc::new(Entry {
                    state: Mutex::new(State::SettingUp),
                    watch: SetupWatch::default(),
                    reported: Default::default(),
                });
                *slot = Some(e.clone());
                (e, true)
            }
        }
    };
    let mut state = entry.state.lock();
    if fresh {
        // Staging of aborted communicators no rank touches any more is freed first (and leaves
        // the cap).
        sweep_abandoned();
        // Setting up allocates, synchronises and queries events: beside another thread's
        // capture in the global mode (PyTorch's default) the driver would refuse those calls
        // and invalidate that thread's capture. Relaxed, this thread's calls leave it whole.
        match driver::relaxed_capture_mode(|| attach(call, &entry.watch)) {
            Ok(ready) if entry.watch.forgotten() => {
                // Destroyed or aborted while setting up: nothing of it may be used.
                abandon(ready);
                return Ok(Served::Stragglar(forgotten_during_setup(call.comm)));
            }
            Ok(ready) => *state = State::Ready(Box::new(ready)),
            Err(_) if entry.watch.forgotten() => {
                *state = State::Refused;
                return Ok(Served::Stragglar(forgotten_during_setup(call.comm)));
            }
            Err(Decline::CapturingBeforeSetup) => {
                // Not capturing later may let it set up: forget this attempt (this entry
                // only, if the slot still holds it).
                let mut slot = record.engine.lock();
                let ours = slot
                    .as_ref()
                    .is_some_and(|e| std::ptr::addr_eq(Arc::as_ptr(e), Arc::as_ptr(&entry)));
                if ours {
                    slot.take();
                }
                return Err(Decline::CapturingBeforeSetup);
            }
            Err(cause) => {
                *state = State::Refused;
                return Err(cause);
            }
        }
    }
    let State::Ready(ready) = &mut *state else {
        return Err(Decline::SetupRefused);
    };
    let comm = &mut ready.comm;
    // NCCL's same call on another stream (a capture may take NCCL's work into the graph). On
    // a nonblocking communicator NCCL may still be queueing it when it returns: its state
    // settles before the capture of that stream may end.
    let nccl = |stream: cudaStream_t| {
        // SAFETY: a stream of the communicator's device, which the caller still holds.
        let mut code = unsafe { nccl_all_reduce(call, stream) };
        while code == ResultCode::IN_PROGRESS && !entry.watch.forgotten() {
            std::thread::sleep(Duration::from_micros(50));
            code = crate::nccl::real::async_state(call.comm);
        }
        code
    };
    // SAFETY: NCCL's contract for the caller's ncclAllReduce: its buffers hold `count`
    // elements on the communicator's device, and the stream is a live stream of it; `nccl`
    // makes the same call on a stream of that device.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
        comm.all_reduce(call.operands(), call.stream, &nccl)
    }));
    let served = match ran {
        Err(_) => {
            // Its peers may already wait for this rank's part of the call: its failure word
            // releases them, and its abort word fails its later calls.
            comm.give_up();
            log::warn!(
                "ncclAllReduce on {}: the GPU engine panicked; this rank gives the communicator up",
                call.label()
            );
            Ok(Served::Stragglar(ResultCode::INTERNAL_ERROR))
        }
        Ok(Err(decline)) => Err(decline),
        Ok(Ok(Err(e))) => {
            log::warn!("ncclAllReduce on {}: {e}", call.label());
            Ok(Served::Stragglar(e.nccl_code()))
        }
        Ok(Ok(Ok(Ran::Ticketed { above_staging }))) => {
            // NCCL runs the call without the engine's lock held, so that a watchdog thread's
            // ncclCommGetAsyncError or ncclCommAbort can give this rank up meanwhile (a
            // blocking NCCL call may wait long for a peer).
            drop(state);
            let code = forward_ticketed(call, &entry);
            state = entry.state.lock();
            if let State::Ready(ready) = &mut *state {
                // The communicator's next launch follows NCCL's kernel.
                ready.comm.nccl_ran(call.stream, code);
            }
            Ok(Served::Nccl {
                code,
                above_staging,
            })
        }
        // Its replays run NCCL's work only (counted as NCCL's, as a call the policy forwards).
        Ok(Ok(Ok(Ran::CapturedNccl))) => Ok(Served::Nccl {
            code: ResultCode::SUCCESS,
            above_staging: false,
        }),
        Ok(Ok(Ok(_))) => Ok(Served::Stragglar(ResultCode::SUCCESS)),
    };
    if entry.watch.forgotten() {
        // Aborted (or destroyed) while this call ran: `forget` could not take the state, so
        // the memory is abandoned here, never freed under kernels NCCL's abort has yet to stop.
        if let State::Ready(ready) = std::mem::replace(&mut *state, State::Refused) {
            abandon(*ready);
        }
    }
    served
}

/// Hands a ticketed call to the real NCCL, unless its communicator was aborted or destroyed
/// meanwhile (NCCL may be freeing it): then the call fails as an aborted one. Holds no lock
/// across NCCL's call: an abort from another thread is what ends a call NCCL cannot finish.
fn forward_ticketed(call: &EngineCall, entry: &Entry) -> ResultCode {
    if entry.watch.forgotten() {
        log::warn!(
            "ncclAllReduce on {}: the communicator was aborted or destroyed before NCCL could run the call",
            call.label()
        );
        return CallError::Failed(STATUS_ABORTED).nccl_code();
    }
    // SAFETY: the caller's own stream, of the communicator the caller still holds (NCCL's
    // contract: no call after its destroy returned).
    unsafe { nccl_all_reduce(call, call.stream) }
}

/// The caller's call, its arguments passed to the real NCCL unchanged, on `stream`.
///
/// # Safety
/// `stream` is a live stream of the communicator's device, and the communicator is live.
unsafe fn nccl_all_reduce(call: &EngineCall, stream: cudaStream_t) -> ResultCode {
    // SAFETY: NCCL's own contract, which the caller's call met and the caller vouches for.
    unsafe {
        crate::nccl::real::all_reduce(
            call.send as *const std::ffi::c_void,
            call.recv as *mut std::ffi::c_void,
            call.count,
            call.nccl_dtype,
            call.nccl_op,
            call.comm,
            stream,
        )
    }
}

/// Called with the real NCCL state of `comm` that the application just read through
/// `ncclCommGetAsyncError`, or that was read after one of its calls went to NCCL as
/// `nonblocking-comm` (see `CudaComm::nccl_state`). On an error, this rank's part of the
/// engine is given up, so that peers still running calls on StragglAR stop waiting for it
/// instead of hanging. Never waits for a call in progress, and never synchronises (a stream
/// may be capturing).
pub fn nccl_state_seen(comm: ncclComm_t, state: ResultCode) {
    if state == ResultCode::IN_PROGRESS {
        return;
    }
    let Some(entry) = entry_of(comm) else {
        return;
    };
    if state != ResultCode::SUCCESS {
        if let Some(control) = entry.watch.control.lock().as_ref() {
            if !control.aborted() {
                log::warn!(
                    "communicator {comm:p}: NCCL reports error {}; the GPU engine gives this rank up",
                    state.0
                );
            }
            control.abort();
            control.fail();
        }
    }
    let Some(mut engine) = entry.state.try_lock() else {
        // A call holds it: a pending order is then dropped (the next launch stays ordered
        // after the forwarded call's ticket), and a raised abort word fails that call.
        return;
    };
    if let State::Ready(ready) = &mut *engine {
        ready.comm.nccl_state(state);
    }
}

/// The straggler designated after the last arrival record the engine read for `comm` (for
/// that record's size class); `None` when none is or the engine does not serve `comm`. Never
/// waits for a call in progress.
pub fn designated(comm: ncclComm_t) -> Option<usize> {
    let entry = entry_of(comm)?;
    usize::try_from(entry.watch.designated.load(Ordering::Relaxed)).ok()
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
    with_served(comm, |engine| {
        engine.arrivals(rank).ok_or(NoArrivals::NoSuchRank)
    })
}

/// Runs `read` on `comm`'s engine once it serves the communicator, waiting at most 10 ms for a
/// call in progress.
fn with_served<T>(
    comm: ncclComm_t,
    read: impl FnOnce(&super::comm::CudaComm) -> Result<T, NoArrivals>,
) -> Result<T, NoArrivals> {
    let entry = entry_of(comm).ok_or(NoArrivals::Unserved)?;
    let state = entry
        .state
        .try_lock_for(Duration::from_millis(10))
        .ok_or(NoArrivals::Busy)?;
    match &*state {
        State::Ready(ready) => read(&ready.comm),
        _ => Err(NoArrivals::Unserved),
    }
}

/// What the policy measured and chose for size class `class` of `comm` (`None`: no call of
/// that class yet). Waits at most 10 ms for a call in progress.
pub fn class_times(
    comm: ncclComm_t,
    class: u32,
) -> Result<Option<crate::detect::estimate::ClassTimes>, NoArrivals> {
    with_served(comm, |engine| Ok(engine.class_times(class).cloned()))
}

/// The asynchronous error the engine holds for `comm`, if a kernel of it gave up (logged once).
/// Never waits for a call in progress.
pub fn async_error(comm: ncclComm_t) -> Option<ResultCode> {
    let entry = entry_of(comm)?;
    let status = entry.watch.control.lock().as_ref().map(Control::status)?;
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
const DRAIN: Duration = Duration::from_secs(10);

/// Forgets `comm` (Destroy, Abort, Finalize, Revoke; or a new communicator at its address).
/// With `abort`, every kernel of it is released first, without waiting for anything, and its
/// memory is set aside until no rank can touch it (see [`sweep_abandoned`]). Otherwise the
/// staging is freed once every peer has finished as many calls as this rank launched (10 s at
/// most; see `CudaComm::drain`) and this rank's own kernels have ended, as NCCL's teardown
/// waits for its own: a kernel waiting for a peer that never comes ends only by
/// `STRAGGLAR_TIMEOUT_MS`, a peer's failure, or ncclCommAbort.
pub fn forget(comm: ncclComm_t, abort: bool) {
    let Some(record) = crate::registry::comms().record(comm) else {
        return;
    };
    let Some(entry) = record
        .engine
        .lock()
        .take()
        .and_then(|e| e.downcast::<Entry>().ok())
    else {
        return;
    };
    entry.watch.forgotten.store(true, Ordering::Release);
    // A setup's query of NCCL's state in flight ends before NCCL frees the communicator (the
    // caller forwards the teardown after this returns); later ones see `forgotten`.
    drop(entry.watch.polling.lock());
    if abort {
        if let Some(control) = entry.watch.control.lock().as_ref() {
            control.abort();
        }
        // A call or a setup in progress holds the state; it finds `forgotten` set. Its
        // kernels may be running: peers waiting for them are released from here (a lost
        // context runs no kernel that would tell them).
        match entry.state.try_lock() {
            Some(mut state) => {
                if let State::Ready(ready) = std::mem::replace(&mut *state, State::Refused) {
                    abandon(*ready);
                }
            }
            None => {
                if let Some(control) = entry.watch.control.lock().as_ref() {
                    control.fail();
                }
            }
        }
        return;
    }
    let mut state = entry.state.lock();
    let State::Ready(mut ready) = std::mem::replace(&mut *state, State::Refused) else {
        return;
    };
    ready.comm.release_nccl_work();
    let deadline = Instant::now() + DRAIN;
    ready.comm.drain(deadline);
    // `drain` waited for this rank's own kernels and released the peers' staging. Its own is
    // freed once every peer has closed its mapping of it (freeing exported memory a peer still
    // maps is undefined behaviour, by cuIpcOpenMemHandle's documentation): the peers release it
    // at their own destroy, so it is waited for here, within the same deadline; a peer that
    // has not let go by then leaves it to a later sweep.
    if ready.comm.wait_released_by_every_peer(deadline) {
        drop(ready);
    } else {
        log::info!("a peer still maps this rank's staging: it is freed once the peer lets go");
        ABANDONED.lock().push(Abandoned {
            ready: *ready,
            released: true,
        });
    }
    sweep_abandoned();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::types::{DataTypeCode, RedOpCode};
    use crate::reduce::{DataType, ReduceOp, Scale};

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
            nccl_dtype: DataTypeCode(7),
            nccl_op: RedOpCode(0),
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            scale: Scale::None,
            stream: std::ptr::null_mut(),
        };
        assert_eq!(all_reduce(&call), Err(Decline::GpuUnavailable));
        assert_eq!(
            all_reduce(&call),
            Err(Decline::SetupRefused),
            "decided once"
        );
        assert_eq!(async_error(call.comm), None);
        forget(call.comm, false);
        assert_eq!(
            all_reduce(&call),
            Err(Decline::GpuUnavailable),
            "a new communicator"
        );
        forget(call.comm, true);
    }
}
