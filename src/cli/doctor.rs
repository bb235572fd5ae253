//! `stragglar doctor`: what the library would do on this machine.

use super::args::{Args, UsageError};
use crate::config::{self, SETTINGS};
use crate::gpu::probe::{probe, Driver};
use crate::nccl::{binding, loader::version_string};

/// Prints the report; exit status 0 whatever it finds (it is a report, not a check).
pub fn run(args: Args) -> Result<i32, UsageError> {
    args.finish()?;
    let config = config::get();
    println!("stragglar {}", env!("CARGO_PKG_VERSION"));
    println!();
    println!("real NCCL");
    match binding() {
        Ok(real) => {
            println!("  bound:     yes");
            println!("  path:      {}", real.path);
            println!(
                "  version:   {}",
                real.version
                    .map_or("(did not answer)".to_string(), version_string)
            );
            println!("  found by:  {:?}", real.found_by);
        }
        Err(e) => {
            println!("  bound:     no");
            println!("  why:       {e}");
            println!("  effect:    every NCCL call returns ncclSystemError");
        }
    }
    println!();
    let gpu = probe();
    println!("CUDA");
    match &gpu.driver {
        Driver::Missing => {
            println!("  driver:    not found (no libcuda.so.1): this machine has no usable GPU")
        }
        Driver::Unusable(reason) => println!("  driver:    present but unusable: {reason}"),
        Driver::Devices(0) => println!("  driver:    present, but it sees no GPU"),
        Driver::Devices(n) => println!("  driver:    present, {n} GPU(s)"),
    }
    let driver_cuda = crate::gpu::probe::driver_cuda_version();
    if let Some((major, minor)) = driver_cuda {
        println!("  CUDA:      {major}.{minor} (the newest the driver supports)");
    }
    match crate::gpu::nvrtc::version() {
        Some((major, minor)) => {
            println!("  NVRTC:     {major}.{minor} (compiles the kernels on first use)");
            if driver_cuda.is_some_and(|(driver, _)| major > driver) {
                println!("  warning:   this NVRTC is newer than the driver: its CUBINs will not load (put an older one first on LD_LIBRARY_PATH as libnvrtc.so, the name the loader tries first)");
            }
        }
        None => {
            println!("  NVRTC:     not found (libnvrtc.so* is not on the loader's search path)")
        }
    }
    match crate::gpu::nvrtc::default_cache_dir(config.cache_dir.as_deref()) {
        Some(dir) => println!("  kernels:   cached in {}", dir.display()),
        None => println!("  kernels:   no cache directory (set STRAGGLAR_CACHE_DIR)"),
    }
    let verdict = match (&gpu.driver, config.gpu_engine) {
        (Driver::Devices(n), true) if *n > 0 => {
            "GPUs present and STRAGGLAR_GPU_ENGINE=1: eligible AllReduce calls run on the GPU engine (experimental)"
        }
        (Driver::Devices(n), false) if *n > 0 => {
            "GPUs present; the GPU engine runs under `stragglar bench --backend cuda`; ncclAllReduce uses it only with STRAGGLAR_GPU_ENGINE=1 (experimental), so every AllReduce is forwarded to the real NCCL"
        }
        _ => "no usable GPU: every call is forwarded to the real NCCL",
    };
    println!("  verdict:   {verdict}");
    let cap = config.staging_cap;
    match crate::engine::cuda::library::staging_bytes(8) {
        Ok(bytes) => println!(
            "  staging:   {} MiB per rank of an 8-rank communicator (STRAGGLAR_BUFFER_BYTES {} MiB); cap {} MiB per device (STRAGGLAR_STAGING_CAP), room for {}",
            bytes >> 20,
            config.buffer_bytes >> 20,
            cap >> 20,
            match cap / bytes.max(1) {
                1 => "1 such communicator".to_string(),
                k => format!("{k} such communicators"),
            }
        ),
        Err(why) => println!("  staging:   cannot be planned: {why}"),
    }
    println!();
    println!("settings (STRAGGLAR_*)");
    for ((name, value), doc) in config.effective().into_iter().zip(SETTINGS) {
        println!("  {name:<22} {value:<28} {}", doc.meaning);
    }
    Ok(0)
}
