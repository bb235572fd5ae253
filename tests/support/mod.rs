//! Shared helpers of the integration tests: where things are, and compiling C programs.

#![allow(dead_code)]

pub mod exports;
pub mod svg;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding the `libstragglar.so` of the profile these tests were built with.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    assert!(
        dir.join("libstragglar.so").exists(),
        "libstragglar.so not built in {}",
        dir.display()
    );
    dir
}

/// Our library.
pub fn stragglar_so() -> PathBuf {
    lib_dir().join("libstragglar.so")
}

/// The real libnccl.so.2 of the nvidia-nccl-cu12 wheel, which scripts/test.sh installs and
/// names in `STRAGGLAR_TEST_REAL_NCCL`. Tests that need it fail in CI without it and are
/// skipped (with a message) elsewhere.
pub fn real_nccl() -> Option<PathBuf> {
    match std::env::var("STRAGGLAR_TEST_REAL_NCCL") {
        Ok(path) => Some(PathBuf::from(path)),
        Err(_) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs scripts/test.sh, which sets STRAGGLAR_TEST_REAL_NCCL"
            );
            eprintln!("STRAGGLAR_TEST_REAL_NCCL unset: skipped (scripts/test.sh sets it)");
            None
        }
    }
}

/// A fresh scratch directory under target/ for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = root().join("target").join("test-scratch").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a command, failing the test if it cannot start.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Compiles a C program with our headers; `link` are the linker arguments.
pub fn compile_c(source: &Path, output: &Path, link: &[String]) {
    let out = run(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(source)
        .arg("-o")
        .arg(output)
        .args(link)
        .arg("-ldl"));
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// stdout and stderr of a finished program, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A command with no `STRAGGLAR_*` or loader variables inherited from the test environment.
pub fn clean_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars() {
        if key.starts_with("STRAGGLAR_") || key == "LD_PRELOAD" || key == "LD_LIBRARY_PATH" {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Prepares a fuzzing test binary, before its first NCCL call (the configuration is read once
/// per process): logs go to a fresh file, whose path is returned; the real NCCL is the one the
/// test environment names, unless `without_nccl`; and `dead` is registered as a communicator
/// that was destroyed, so every call on it must be refused.
pub fn fuzz_setup(name: &str, without_nccl: bool, dead: usize) -> PathBuf {
    use stragglar::registry::{self, CommInfo, CommOrigin, CommState};
    let log = std::env::temp_dir().join(format!("stragglar-{name}-{}.log", std::process::id()));
    std::env::set_var("STRAGGLAR_DEBUG_FILE", &log);
    if without_nccl {
        std::env::set_var("STRAGGLAR_NCCL_LIB", "/nonexistent/libnccl.so.2");
    } else if let Ok(real) = std::env::var("STRAGGLAR_TEST_REAL_NCCL") {
        std::env::set_var("STRAGGLAR_NCCL_LIB", real);
    }
    registry::comms().insert(
        dead as stragglar::nccl::types::ncclComm_t,
        CommInfo {
            nranks: Some(8),
            rank: Some(3),
            cuda_device: Some(0),
            blocking: true,
            origin: CommOrigin::InitRank,
            state: CommState::Destroyed,
            single_process: false,
        },
    );
    log
}

/// Our real kernels, compiled once per revision of their sources for every test binary that
/// needs them (NVRTC takes most of a minute per architecture): `stragglar kernels --arch A
/// --cache --resources --out` for each architecture side by side, under a lock, kept in `target/test-kernels`
/// while the cache keys (a hash of the sources and options) and the CLI are the same.
pub struct RealKernels {
    /// `stragglar_{arch}.cubin` and `stragglar_turn_{arch}.cubin` for each architecture.
    pub out: PathBuf,
    /// A kernel cache holding each architecture's entries (both modules).
    pub cache: PathBuf,
    /// What the command printed (each CUBIN's line, and ptxas's resources with `--resources`).
    pub report: String,
}

/// The architectures [`real_kernels`] builds.
pub const KERNEL_ARCHS: [&str; 3] = ["sm_75", "sm_80", "sm_90"];

/// Builds (or finds built) our kernels with the CLI `cli`; `Err` with the command's output
/// when it fails.
pub fn real_kernels(cli: &Path) -> Result<RealKernels, String> {
    use std::os::fd::AsRawFd;
    let dir = root().join("target").join("test-kernels");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let lock = std::fs::File::create(dir.join(".lock")).map_err(|e| e.to_string())?;
    // SAFETY: `lock` is an open descriptor for the call's duration; flock only locks it (the
    // lock goes with the descriptor, when this function returns).
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err("cannot lock target/test-kernels".into());
    }
    let binary = std::fs::metadata(cli).map_err(|e| e.to_string())?;
    let stamp = format!(
        "{:?} {:?} {}\n",
        KERNEL_ARCHS.map(|arch| [
            stragglar::gpu::nvrtc::Unit::ours().cache_key(arch),
            stragglar::gpu::nvrtc::Unit::turn().cache_key(arch)
        ]),
        binary.modified().ok(),
        binary.len()
    );
    let built = RealKernels {
        out: dir.join("out"),
        cache: dir.join("cache"),
        report: std::fs::read_to_string(dir.join("report.txt")).unwrap_or_default(),
    };
    if std::fs::read_to_string(dir.join("stamp")).ok().as_deref() == Some(&stamp) {
        return Ok(built);
    }
    for stale in [&built.out, &built.cache] {
        let _ = std::fs::remove_dir_all(stale);
    }
    let _ = std::fs::remove_file(dir.join("stamp"));
    // NVRTC from the wheel scripts/test.sh installs, also when a test binary runs on its own.
    let nvrtc = root().join(".venv/cu12/nvidia/cuda_nvrtc/lib");
    let mut library_path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    if nvrtc.is_dir() {
        library_path = format!("{}:{library_path}", nvrtc.display());
    }
    // One process per architecture, side by side (NVRTC compiles on one thread).
    let runs: Vec<_> = KERNEL_ARCHS
        .iter()
        .map(|arch| {
            Command::new(cli)
                .args(["kernels", "--arch", arch, "--cache", "--resources", "--out"])
                .arg(&built.out)
                .env("STRAGGLAR_CACHE_DIR", &built.cache)
                .env("LD_LIBRARY_PATH", &library_path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let mut report = String::new();
    for run in runs {
        let run = run.wait_with_output().map_err(|e| e.to_string())?;
        if !run.status.success() {
            return Err(describe(&run));
        }
        report.push_str(&String::from_utf8_lossy(&run.stdout));
    }
    std::fs::write(dir.join("report.txt"), &report).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("stamp"), stamp).map_err(|e| e.to_string())?;
    Ok(RealKernels { report, ..built })
}
