//! `stragglar kernels`: compiles every kernel with NVRTC for the given architectures (two
//! modules each: the AllReduce module, and the turn kernel's, which only a driver with
//! conditional graph nodes loads) and writes the CUBINs, checked, into a directory (CI runs it
//! for sm_80 and sm_90 without a GPU).

use std::path::{Path, PathBuf};

use super::args::{Args, UsageError};
use crate::gpu::{cubin, kernels, nvrtc};

/// Usage of `stragglar kernels`.
pub const USAGE: &str = "\
kernels options:
  --arch LIST   architectures, comma-separated (default sm_80,sm_90)
  --out DIR     where to write stragglar_<arch>.cubin and stragglar_turn_<arch>.cubin (the
                turn kernel's module; default: only compile and check)
  --cache       also store each CUBIN as the kernel cache's entry (STRAGGLAR_CACHE_DIR), so
                that the first use on a GPU of that architecture skips NVRTC
  --resources   print ptxas's report of each function: registers, stack, spills, shared memory
  --source DIR  compile the AllReduce module's sources in DIR (another revision's cuda/, to
                compare builds) instead of the built-in ones, and no turn module; not with
                --cache
  --cached      compile nothing: check that the kernel cache (STRAGGLAR_CACHE_DIR) holds a
                valid entry of these sources for each architecture (no NVRTC needed); exit
                status 1 naming those that are missing
";

/// Runs `stragglar kernels`; exit status 1 when a compilation fails.
pub fn run(mut args: Args) -> Result<i32, UsageError> {
    let archs = args
        .value(&["--arch"])?
        .unwrap_or_else(|| "sm_80,sm_90".into());
    let out: Option<PathBuf> = args.value(&["--out"])?.map(PathBuf::from);
    let cache = args
        .flag(&["--cache"])
        .then(|| nvrtc::default_cache_dir(crate::config::get().cache_dir.as_deref()))
        .flatten();
    let resources = args.flag(&["--resources"]);
    let source: Option<PathBuf> = args.value(&["--source"])?.map(PathBuf::from);
    let cached_only = args.flag(&["--cached"]);
    args.finish()?;
    if source.is_some() && cache.is_some() {
        return Err(UsageError(
            "--source and --cache: the cache holds only the built-in kernels".into(),
        ));
    }
    let unit = match &source {
        Some(dir) => match kernels::translation_unit_from(dir) {
            Ok(unit) => Some(unit),
            Err(e) => {
                eprintln!("stragglar kernels: --source {}: {e}", dir.display());
                return Ok(1);
            }
        },
        None => None,
    };
    let archs: Vec<&str> = archs.split(',').map(str::trim).collect();
    if let Some(bad) = archs.iter().find(|a| !kernels::valid_arch(a)) {
        return Err(UsageError(format!(
            "--arch: {bad} is not an architecture (sm_70 or later, e.g. sm_90)"
        )));
    }
    if cached_only {
        if source.is_some() || out.is_some() || cache.is_some() || resources {
            return Err(UsageError(
                "--cached only checks the cache: no --out, --cache, --resources or --source".into(),
            ));
        }
        return Ok(check_cached(&archs));
    }
    let Some((major, minor)) = nvrtc::version() else {
        eprintln!("stragglar kernels: libnvrtc not found (install nvidia-cuda-nvrtc-cu12, and put its lib/ on LD_LIBRARY_PATH or bind its NCCL with STRAGGLAR_NCCL_LIB)");
        return Ok(1);
    };
    if let Some(dir) = &out {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("stragglar kernels: cannot create {}: {e}", dir.display());
            return Ok(1);
        }
    }
    let mut failed = false;
    for arch in archs {
        let mut modules = vec![Module {
            file: format!("stragglar_{arch}.cubin"),
            entry: kernels::ALL_REDUCE_KERNEL,
            unit: match &unit {
                Some(text) => nvrtc::Unit::from_text(text.clone()),
                None => nvrtc::Unit::ours(),
            },
        }];
        if unit.is_none() {
            modules.push(Module {
                file: format!("stragglar_turn_{arch}.cubin"),
                entry: kernels::GRAPH_TURN_KERNEL,
                unit: nvrtc::Unit::turn(),
            });
        }
        for module in modules {
            let nvrtc = format!("NVRTC {major}.{minor}");
            let written = build(
                arch,
                &module,
                &nvrtc,
                resources,
                cache.as_deref(),
                out.as_deref(),
            );
            match written {
                Ok(line) => println!("{line}"),
                Err(e) => {
                    eprintln!("stragglar kernels: {arch}: {}: {e}", module.file);
                    failed = true;
                }
            }
        }
    }
    Ok(failed as i32)
}

/// One CUBIN `stragglar kernels` builds per architecture.
struct Module {
    /// Its name under `--out`.
    file: String,
    /// The kernel the summary line names.
    entry: &'static str,
    unit: nvrtc::Unit,
}

/// Compiles `module` for `arch` with `nvrtc` (its name and version, for the summary), checks
/// the CUBIN, stores it in `cache` and writes it into `out` where given; `Ok` is the summary
/// line, `Err` why not.
fn build(
    arch: &str,
    module: &Module,
    nvrtc: &str,
    resources: bool,
    cache: Option<&Path>,
    out: Option<&Path>,
) -> Result<String, String> {
    let started = std::time::Instant::now();
    let bin = match resources {
        true => module.unit.compile_reporting(arch).map(|(bin, log)| {
            print_resources(arch, &log);
            bin
        }),
        false => module.unit.compile(arch),
    }
    .map_err(|e| e.to_string())?;
    cubin::check(&bin, arch, module.unit.kernels())?;
    if let Some(dir) = cache {
        module.unit.store_cached(arch, dir, &bin);
    }
    let place = match out {
        Some(dir) => {
            let path = dir.join(&module.file);
            std::fs::write(&path, &bin)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            path.display().to_string()
        }
        None => "not written".into(),
    };
    Ok(format!(
        "{arch}: {} bytes, {} in {:.1} s with {nvrtc} ({place})",
        bin.len(),
        module.entry,
        started.elapsed().as_secs_f64()
    ))
}

/// `--cached`: whether the kernel cache holds a valid entry of the built-in sources for each of
/// `archs`; exit status 0 when every one is there.
fn check_cached(archs: &[&str]) -> i32 {
    let Some(dir) = nvrtc::default_cache_dir(crate::config::get().cache_dir.as_deref()) else {
        eprintln!("stragglar kernels: no kernel cache directory (set STRAGGLAR_CACHE_DIR)");
        return 1;
    };
    let mut missing = 0;
    for arch in archs {
        for (what, unit) in [("", nvrtc::Unit::ours()), (" turn", nvrtc::Unit::turn())] {
            match unit.read_cached(arch, &dir) {
                Some((cubin, (major, minor))) => println!(
                    "{arch}{what}: cached in {} ({} bytes, compiled by NVRTC {major}.{minor})",
                    dir.join(unit.cache_key(arch)).display(),
                    cubin.len()
                ),
                None => {
                    eprintln!(
                        "stragglar kernels: {arch}{what}: no entry of these sources in {} (build it with `stragglar kernels --arch {arch} --cache`)",
                        dir.display()
                    );
                    missing += 1;
                }
            }
        }
    }
    i32::from(missing > 0)
}

/// Prints ptxas's report in NVRTC's log (its `info` lines and each function's stack and spill
/// line), prefixed by `arch`.
fn print_resources(arch: &str, log: &str) {
    for line in log.lines() {
        let text = match line.split_once("ptxas info") {
            Some((_, rest)) => rest.trim_start_matches([' ', ':']),
            None if line.contains("bytes stack frame") => line.trim(),
            None => continue,
        };
        println!("{arch}: {}", text.trim_end());
    }
}
