//! What CUDA this machine offers, asked without ever aborting: cudarc panics when a library is
//! missing, so presence is probed first and every call runs under `catch_unwind`.

use std::panic::catch_unwind;

/// The CUDA driver as seen from this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driver {
    /// No libcuda.so: no GPU can be used.
    Missing,
    /// libcuda.so loads but `cuInit` or the device count failed (e.g. no GPU).
    Unusable(String),
    /// The driver works and sees this many GPUs.
    Devices(i32),
}

/// The result of [`probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProbe {
    pub driver: Driver,
    /// Whether libnvrtc (any of the names cudarc looks for) can be loaded.
    pub nvrtc: bool,
}

/// Asks the driver and the loader; takes milliseconds; never panics.
pub fn probe() -> GpuProbe {
    GpuProbe {
        driver: probe_driver(),
        // SAFETY: is_culib_present only tries to dlopen the library.
        nvrtc: catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false),
    }
}

/// The CUDA version the driver supports, as (major, minor), when a driver loads.
pub fn driver_cuda_version() -> Option<(i32, i32)> {
    // SAFETY: is_culib_present only tries to dlopen the library.
    let present =
        catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return None;
    }
    catch_unwind(|| {
        let mut version = 0;
        // SAFETY: a valid output; cuDriverGetVersion needs no cuInit.
        let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
        (r == cudarc::driver::sys::CUresult::CUDA_SUCCESS)
            .then_some((version / 1000, version % 1000 / 10))
    })
    .ok()
    .flatten()
}

/// The names of GPUs `0..count` as the driver reports them (an emulated GPU says so in its
/// name); a GPU whose name cannot be read is left out. Call after [`probe`] found `count`.
pub fn device_names(count: i32) -> Vec<String> {
    (0..count)
        .filter_map(|ordinal| {
            catch_unwind(|| {
                let device = cudarc::driver::result::device::get(ordinal).ok()?;
                cudarc::driver::result::device::get_name(device).ok()
            })
            .ok()
            .flatten()
        })
        .collect()
}

fn probe_driver() -> Driver {
    // SAFETY: is_culib_present only tries to dlopen the library.
    let present =
        catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return Driver::Missing;
    }
    let counted = catch_unwind(|| {
        cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
        cudarc::driver::result::device::get_count()
            .map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))
    });
    match counted {
        Ok(Ok(count)) => Driver::Devices(count),
        Ok(Err(reason)) => Driver::Unusable(reason),
        Err(_) => Driver::Unusable("the CUDA driver library could not be used".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_never_panics_and_is_consistent() {
        let first = probe();
        assert_eq!(first, probe());
        if let Driver::Devices(n) = first.driver {
            assert!(n >= 0);
        }
    }
}
