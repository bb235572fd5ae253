//! The GPUs this process drives and our kernels on them, each opened or loaded once per process
//! (a failure is remembered too, so it is tried and reported once; a panic is a failure).

use std::collections::HashMap;
use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::driver::{Device, Kernel, Kernels};

/// Our kernels on one GPU, and the CUBIN they came from (for kernels loaded beside them).
pub struct Loaded {
    pub kernels: Arc<Kernels>,
    pub cubin: Vec<u8>,
    /// The architecture it was built for (`sm_90`).
    pub arch: String,
}

/// A GPU as this process found it: opened (or why not), and our kernels loaded on it (or why
/// not: NVRTC missing, compilation failed): the AllReduce module's, and the turn kernel's.
#[derive(Default)]
struct Found {
    device: Option<Result<Arc<Device>, String>>,
    kernels: Option<Result<Arc<Loaded>, String>>,
    turn: Option<Result<Arc<Kernel>, String>>,
}

static GPUS: Lazy<Mutex<HashMap<i32, Found>>> = Lazy::new(Default::default);

/// Runs `attempt`; a panic (cudarc panics when the driver lacks a function it looks up, as an
/// older driver may) becomes an error naming it, like any other failure to open or load.
pub fn without_panics<T>(
    what: &str,
    attempt: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(attempt)).unwrap_or_else(|payload| {
        let why = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(format!("{what} panicked: {why}"))
    })
}

/// GPU `ordinal`, opened once per process; `first_failure` hears why not, once.
pub fn device(ordinal: i32, first_failure: impl FnOnce(&str)) -> Result<Arc<Device>, String> {
    GPUS.lock()
        .entry(ordinal)
        .or_default()
        .device
        .get_or_insert_with(|| {
            let device = without_panics("opening the GPU", || {
                match crate::gpu::probe::probe().driver {
                    crate::gpu::probe::Driver::Devices(n) if n > ordinal => {
                        Device::open(ordinal).map_err(|e| e.to_string())
                    }
                    crate::gpu::probe::Driver::Devices(_) => {
                        Err(format!("the CUDA driver sees no GPU {ordinal}"))
                    }
                    crate::gpu::probe::Driver::Missing => {
                        Err("no CUDA driver (libcuda.so) on this machine".into())
                    }
                    crate::gpu::probe::Driver::Unusable(why) => Err(why),
                }
            });
            if let Err(why) = &device {
                first_failure(why);
            }
            device
        })
        .clone()
}

/// Our kernels on `device` (GPU `ordinal`), compiled with NVRTC or taken from the kernel cache
/// (`STRAGGLAR_CACHE_DIR`), and loaded once per process; `first_failure` hears why not, once.
/// Never called while the caller's stream captures: loading is not for a capture.
pub fn kernels(
    ordinal: i32,
    device: &Arc<Device>,
    first_failure: impl FnOnce(&str),
) -> Result<Arc<Loaded>, String> {
    GPUS.lock()
        .entry(ordinal)
        .or_default()
        .kernels
        .get_or_insert_with(|| {
            let loaded =
                without_panics("loading the kernels", || -> Result<Arc<Loaded>, String> {
                    let arch = device.arch().map_err(|e| e.to_string())?;
                    let cache = crate::gpu::nvrtc::default_cache_dir(
                        crate::config::get().cache_dir.as_deref(),
                    );
                    let (cubin, _) = crate::gpu::nvrtc::cubin_cached(&arch, cache.as_deref())
                        .map_err(|e| e.to_string())?;
                    let kernels = Kernels::load(device, &cubin).map_err(|e| e.to_string())?;
                    Ok(Arc::new(Loaded {
                        kernels: Arc::new(kernels),
                        cubin,
                        arch,
                    }))
                });
            if let Err(why) = &loaded {
                first_failure(why);
            }
            loaded
        })
        .clone()
}

/// The turn kernel of graph calls whose baseline is NCCL's work (`crate::gpu::kernels::turn_sources`,
/// a module of its own) on `device` (GPU `device.ordinal`), compiled with NVRTC or taken from the
/// kernel cache, and loaded once per process. Only for a driver with conditional graph nodes,
/// which resolves the module's call to `cudaGraphSetConditional` (the caller checks); never
/// called while the caller's stream captures.
pub fn turn_kernel(device: &Arc<Device>) -> Result<Arc<Kernel>, String> {
    GPUS.lock()
        .entry(device.ordinal)
        .or_default()
        .turn
        .get_or_insert_with(|| {
            without_panics("loading the turn kernel", || {
                use crate::gpu::{kernels::GRAPH_TURN_KERNEL, nvrtc};
                let arch = device.arch().map_err(|e| e.to_string())?;
                let cache = nvrtc::default_cache_dir(crate::config::get().cache_dir.as_deref());
                let (cubin, _) = nvrtc::Unit::turn()
                    .cubin_cached(&arch, cache.as_deref())
                    .map_err(|e| format!("the turn kernel: {e}"))?;
                let kernel = Kernel::load(device, &cubin, GRAPH_TURN_KERNEL)
                    .map_err(|e| format!("the turn kernel: {e}"))?;
                Ok(Arc::new(kernel))
            })
        })
        .clone()
}
