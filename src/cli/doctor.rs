//! `stragglar doctor`: what the library would do on this machine.

use super::args::{Args, UsageError};
use super::team_check::{multicast_line, Trial};
use crate::config::{self, SETTINGS};
use crate::gpu::probe::{device_names, probe, Driver};
use crate::nccl::{binding, loader::version_string};

/// Options of `stragglar doctor`, as shown by `stragglar doctor --help`.
pub const USAGE: &str = "
stragglar doctor [--multicast | --multicast-processes]
    what the library would do on this machine: the real NCCL it binds, the CUDA driver, GPUs,
    NVRTC and kernels, staging, and every STRAGGLAR_* setting;
    --multicast also forms an NVLink multicast team of every GPU, one thread each, through
    the protocol a communicator's ranks run, and gives it up again; --multicast-processes
    does so with one process per GPU, passing the object's fd between them
";

/// Prints the report; exit status 0 whatever it finds (it is a report, not a check).
pub fn run(mut args: Args) -> Result<i32, UsageError> {
    let trial = match (
        args.flag(&["--multicast"]),
        args.flag(&["--multicast-processes"]),
    ) {
        (_, true) => Trial::Processes,
        (true, false) => Trial::Threads,
        (false, false) => Trial::No,
    };
    args.finish()?;
    let config = config::get();
    println!("stragglar {}", env!("CARGO_PKG_VERSION"));
    match super::run::library_path() {
        Some(path) => println!("  preloads:  {} (stragglar run)", path.display()),
        None => println!(
            "  preloads:  nothing: no libstragglar.so next to this executable (stragglar run cannot start jobs)"
        ),
    }
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
        Driver::Devices(n) => {
            println!("  driver:    present, {n} GPU(s)");
            for (ordinal, name) in device_names(*n).iter().enumerate() {
                println!("  GPU {ordinal}:     {name}");
            }
        }
    }
    let driver_cuda = crate::gpu::probe::driver_cuda_version();
    if let Some((major, minor)) = driver_cuda {
        println!("  CUDA:      {major}.{minor} (the newest the driver supports)");
    }
    let nvrtc = crate::gpu::nvrtc::version();
    let nvrtc_usable = match nvrtc {
        Some((major, _)) => driver_cuda.is_none_or(|(driver, _)| major <= driver),
        None => false,
    };
    match nvrtc {
        Some((major, minor)) => {
            println!("  NVRTC:     {major}.{minor} (compiles the kernels on first use)");
            if !nvrtc_usable {
                println!("  warning:   this NVRTC is newer than the driver: its CUBINs will not load (put an older one first on LD_LIBRARY_PATH as libnvrtc.so, the name the loader tries first)");
            }
        }
        None => println!(
            "  NVRTC:     not found (not on the loader's search path, nor beside the loaded NCCL or CUDA runtime, nor in their pip nvidia tree)"
        ),
    }
    let gpus = matches!(gpu.driver, Driver::Devices(n) if n > 0);
    // The kernels GPU 0 would run, as the engine finds them: a cache entry the driver can load,
    // read without NVRTC.
    let arch = gpus
        .then(|| crate::engine::cuda::driver::Device::open(0).and_then(|d| d.arch()))
        .and_then(Result::ok);
    if let Driver::Devices(n) = gpu.driver {
        if n > 0 {
            println!("  multicast: {}", multicast_line(n as usize, trial));
            println!("  graphs:    {}", graphs_line());
        }
    }
    let mut cached = false;
    match crate::gpu::nvrtc::default_cache_dir(config.cache_dir.as_deref()) {
        Some(dir) => {
            let entry = arch
                .as_deref()
                .map(|arch| (arch, crate::gpu::nvrtc::read_cached(arch, &dir)));
            let what = match entry {
                Some((arch, Some((_, (major, minor))))) => {
                    let loadable = driver_cuda.is_none_or(|(driver, _)| major <= driver);
                    cached = loadable;
                    match loadable {
                        true => format!(": {arch} kernels there, compiled by NVRTC {major}.{minor}"),
                        false => format!(": {arch} kernels there, compiled by NVRTC {major}.{minor}, newer than the driver (not used)"),
                    }
                }
                Some((arch, None)) => format!(" (no {arch} kernels yet: NVRTC builds them on first use, or `stragglar kernels --cache` now)"),
                None => String::new(),
            };
            // The turn kernel of graph replays on NCCL's turn is a module of its own.
            let turn = arch.as_deref().map(|arch| {
                crate::gpu::nvrtc::Unit::turn()
                    .read_cached(arch, &dir)
                    .is_some()
            });
            let turn = match turn {
                Some(true) => "; the graph turn kernel's module there too",
                Some(false) => "; no graph turn kernel's module yet (NVRTC builds it on first use)",
                None => "",
            };
            println!("  kernels:   cached in {}{what}{turn}", dir.display());
        }
        None => println!("  kernels:   no cache directory (set STRAGGLAR_CACHE_DIR)"),
    }
    println!(
        "  verdict:   {}",
        engine_verdict(gpus, config.gpu_engine, nvrtc_usable || cached)
    );
    if config.shared_gpu {
        println!("  sharing:   STRAGGLAR_TEST_SHARED_GPU=1, for tests only: the ranks of a communicator may share one GPU (each rank's grid shrunk so that all stay resident); a job's ranks need a GPU each");
    }
    let cap = config.staging_cap;
    match crate::engine::cuda::sizing::footprint(8) {
        Ok(mut f) => {
            // The region as the driver allocates it, where GPU 0 can say its granularity.
            let rounded = (f.multicast_region > 0 && gpus)
                .then(|| crate::engine::cuda::driver::Device::open(0).ok())
                .flatten()
                .and_then(|d| {
                    let bytes = usize::try_from(f.multicast_region).ok()?;
                    crate::engine::cuda::multicast::team::bytes_on(&d, 8, bytes).ok()
                });
            if let Some(bytes) = rounded {
                f.multicast_region = bytes as u64;
            }
            let largest = f.control + f.arenas_buffer + f.multicast_region;
            println!(
                "  staging:   {} MiB per rank of an 8-rank communicator, and arenas grown at the first calls StragglAR runs: {} MiB for calls of {} MiB, {} MiB for calls of {} MiB (STRAGGLAR_BUFFER_BYTES), {} MiB at most if grown one step at a time",
                f.control >> 20,
                f.arenas_16m >> 20,
                config.buffer_bytes.min(16 << 20) >> 20,
                f.arenas_buffer >> 20,
                config.buffer_bytes >> 20,
                f.arenas_stepwise >> 20,
            );
            if f.multicast_region > 0 {
                let rounding = match rounded {
                    Some(_) => "rounded up to GPU 0's granularity",
                    None => "before the driver rounds it up to its granularity: no GPU with multicast here to ask",
                };
                println!(
                    "             and a multicast region of {} MiB formed at setup (STRAGGLAR_MULTICAST on; {rounding})",
                    f.multicast_region >> 20
                );
            }
            let stepwise = f.control + f.arenas_stepwise + f.multicast_region;
            println!(
                "             cap {} MiB per device (STRAGGLAR_STAGING_CAP), room for {} with arenas for the largest calls ({} if grown one step at a time)",
                cap >> 20,
                match cap / largest.max(1) {
                    1 => "1 such communicator".to_string(),
                    k => format!("{k} such communicators"),
                },
                cap / stepwise.max(1)
            );
        }
        Err(why) => println!("  staging:   cannot be planned: {why}"),
    }
    println!();
    println!("settings (STRAGGLAR_*)");
    for ((name, value), doc) in config.effective().into_iter().zip(SETTINGS) {
        println!("  {name:<27} {value:<28} {}", doc.meaning);
    }
    Ok(0)
}

/// What the library's AllReduce does here: whether GPUs are usable, the GPU engine is switched
/// on (`STRAGGLAR_GPU_ENGINE`), and an NVRTC that can build kernels the driver loads is found
/// (the kernel cache is keyed by NVRTC's version, so even cached kernels need it).
/// What the library does here: `kernels` when NVRTC can build them or the cache holds them.
/// What graph replays choose between on GPU 0 (a communicator needs every rank to say yes).
fn graphs_line() -> String {
    use crate::engine::cuda::{branch::Branch, driver::Device};
    match Device::open(0)
        .map_err(|e| e.to_string())
        .and_then(|d| Branch::load(&d))
    {
        Ok(_) => {
            "replays choose between StragglAR and NCCL's own captured work (conditional nodes)"
                .into()
        }
        Err(why) => format!("replays choose between StragglAR and our Ring ({why})"),
    }
}

fn engine_verdict(gpus: bool, engine: bool, kernels: bool) -> &'static str {
    match (gpus, engine, kernels) {
        (false, _, _) => "no usable GPU: every call is forwarded to the real NCCL",
        (true, false, _) => {
            "GPUs present; the GPU engine runs under `stragglar bench --backend cuda`; ncclAllReduce uses it only with STRAGGLAR_GPU_ENGINE=1 (experimental), so every AllReduce is forwarded to the real NCCL"
        }
        (true, true, false) => {
            "GPUs present and STRAGGLAR_GPU_ENGINE=1, but no usable NVRTC and no cached kernels: the kernels cannot be built, so every AllReduce is forwarded to the real NCCL (counted as setup-refused)"
        }
        (true, true, true) => {
            "GPUs present and STRAGGLAR_GPU_ENGINE=1: eligible AllReduce calls run on the GPU engine (experimental)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::engine_verdict;

    #[test]
    fn the_verdict_runs_the_engine_only_with_gpus_the_switch_and_nvrtc() {
        for gpus in [false, true] {
            for engine in [false, true] {
                for nvrtc in [false, true] {
                    let verdict = engine_verdict(gpus, engine, nvrtc);
                    let runs = verdict.contains("run on the GPU engine");
                    assert_eq!(runs, gpus && engine && nvrtc, "{verdict}");
                    assert_eq!(runs, !verdict.contains("forwarded to the real NCCL"));
                }
            }
        }
    }
}
