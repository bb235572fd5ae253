//! Attaching the GPU engine to a job's NCCL communicator, at its first eligible call: this
//! rank's GPU and kernels (found once per process), the grid and staging sized from the
//! configuration under the device's cap, and the one assembly (`super::assemble`) run through
//! the real communicator's AllGather and CUDA IPC.

use super::assemble::{assemble, Assembly};
use super::budget::{self, Reservation};
use super::call::EngineCall;
use super::comm::{Baseline, CudaComm, Decline};
use super::driver;
use super::exchange::NcclExchange;
use super::gpus;
use super::grid::{blocks_for, shared_gpu_blocks, MIN_BLOCKS};
use super::peers::IpcAccess;
use super::setup::{Devices, LocalFailure, SetupError};
use super::sizing::{layout, policy, Sizing};
use super::staging::StagingLayout;
use super::watch::SetupWatch;
use crate::plan::PlanCache;

/// A communicator the engine serves: its engine, and its staging counted against the device's
/// cap (released after the engine frees it: fields drop in order).
pub struct Attached {
    pub comm: CudaComm,
    pub _reservation: Reservation,
}

/// Runs the setup of `call`'s communicator: `Ok` with its engine when every rank is
/// eligible, or why its calls stay on NCCL. Every rank that has a driver joins both
/// all-gathers, whatever fails locally (with a failed record), so its peers never wait for it.
/// Staging of aborted communicators no rank touches any more should be freed before (it
/// leaves the cap).
pub fn attach(call: &EngineCall, watch: &SetupWatch) -> Result<Attached, Decline> {
    let ordinal = call.device;
    // Without a driver or device NCCL cannot run here either, so no peer waits on this rank's
    // setup; from here on, a local failure still takes both of the setup's steps, failed.
    let device = gpus::device(ordinal, |why| {
        log::warn!("GPU engine unavailable on device {ordinal}: {why}; AllReduce stays on NCCL")
    })
    .map_err(|_| Decline::GpuUnavailable)?;
    // Every rank asks its own stream; one that cannot tell still joins the setup (its peers
    // are entering the same collectives) with a failed record, so every rank refuses alike.
    let capturing = gpus::without_panics("asking the stream", || {
        // SAFETY: the caller's stream of this communicator's device.
        unsafe { driver::is_capturing(&device, call.stream.cast()) }.map_err(|e| e.to_string())
    });
    let stream_state = match capturing {
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
    let loaded = gpus::kernels(ordinal, &device, |why| {
        log::warn!(
            "GPU engine kernels unavailable on device {ordinal}: {why}; AllReduce stays on NCCL"
        )
    });
    let sms = gpus::without_panics("counting multiprocessors", || {
        device.sm_count().map_err(|e| e.to_string())
    })
    .unwrap_or_else(|e| {
        log::warn!(
            "{}: {e}: the grid assumes {MIN_BLOCKS} blocks",
            call.label()
        );
        0
    });
    let config = crate::config::get();
    let policy = policy(call.ranks);
    let grid = grid_of(sms as u32, config, call.ranks);
    if let Err(why) = &grid {
        log::warn!(
            "{}: {why}: this rank joins the setup as failed",
            call.label()
        );
    }
    // A rank that fails here still sizes a layout (its record's), from the smallest grid.
    let blocks = *grid.as_ref().unwrap_or(&MIN_BLOCKS);
    let mut plans = PlanCache::default();
    // Flags for every plan up to STRAGGLAR_BUFFER_BYTES, but arenas of no size: they grow at
    // the first calls StragglAR runs (`super::growth`), so a job whose calls stay on NCCL holds
    // only the control part.
    let full = layout(&mut plans, &policy, blocks, Sizing::of_the_library())
        .map_err(|_| Decline::GpuUnavailable)?;
    let layout = StagingLayout {
        arena_bytes: 0,
        ..full
    };
    let reservation = Reservation::take(ordinal, layout.allocation_bytes());
    let kernels = stream_state
        .and(grid.map_err(|_| LocalFailure::TooFewMultiprocessors))
        .and(loaded.as_ref().map_err(|_| LocalFailure::NoKernels))
        .map(|loaded| &loaded.kernels)
        .and_then(|kernels| match reservation {
            Some(_) => Ok(kernels),
            None => Err(LocalFailure::NoMemory),
        });
    let assembly = Assembly {
        device: &device,
        kernels,
        rank: call.rank,
        ranks: call.ranks,
        layout,
        plans,
        policy,
        max_bytes: config.buffer_bytes,
        staged_bytes: 0,
        timeout: config.timeout_ms.map(std::time::Duration::from_millis),
        ordered_reads: true,
        devices: match config.shared_gpu {
            true => Devices::MayShare,
            false => Devices::OnePerRank,
        },
        baseline: Baseline::Nccl,
        label: call.label(),
        designated: watch.designated.clone(),
        multicast: config.multicast,
    };
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
    let on_control = |control| *watch.control.lock() = Some(control);
    let mut comm = match assemble(assembly, &mut exchange, &mut access, on_control) {
        Ok(comm) => comm,
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
    // The verdict was Eligible on every rank, so this rank reserved its staging.
    let reservation = reservation.ok_or(Decline::SetupRefused)?;
    if let Some(trace) = open_trace(call) {
        comm.trace_into(trace);
    }
    let prior = match comm.nvls_baseline() {
        true => "NVLS",
        false => "Ring",
    };
    log::info!(
        "{}: the GPU engine serves its AllReduce ({} ranks, {} MiB of staging on device {}, its arenas grown at the first calls StragglAR runs: {} of STRAGGLAR_STAGING_CAP {} MiB in use); until measured, NCCL is priced as {prior}",
        call.label(),
        call.ranks,
        layout.allocation_bytes() >> 20,
        ordinal,
        budget::used(ordinal) >> 20,
        config.staging_cap >> 20
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

/// The plan blocks of each rank on a GPU of `sms` multiprocessors: [`blocks_for`] with a GPU
/// per rank, or, where the ranks may share one (`STRAGGLAR_TEST_SHARED_GPU`, tests only), as
/// many as keep every rank's grid resident at once ([`shared_gpu_blocks`], all `ranks` taken
/// to share it), `Err` when even one block each cannot.
fn grid_of(sms: u32, config: &crate::config::Config, ranks: usize) -> Result<u32, String> {
    if config.shared_gpu {
        shared_gpu_blocks(sms, ranks)
    } else {
        Ok(blocks_for(sms, config.buffer_bytes, ranks))
    }
}
