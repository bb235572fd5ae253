//! The host time of one `ncclAllReduce` that the GPU engine forwards to NCCL, engine on against
//! engine off, on the emulated machine with its loopback NCCL: 4 rank processes
//! (`tests/c/loopback_ranks.c` linked with `libstragglar.so`), each making `CALLS` calls of
//! 4099 floats with no straggler, so the policy sends every call to NCCL; each call is timed
//! alone on the host (its stream drained after it, untimed). Engine on, a call queues the
//! ticket kernel before NCCL's and, on one call in eight, the end kernel after it. A third row:
//! engine off, observe mode on (`STRAGGLAR_OBSERVE=1`, its records into a scratch directory):
//! two event records, a capture query and the reading of finished events a call.
//!
//! Run with `cargo bench --bench forwarded_engine [-- CALLS]` (default 2000, at least 16),
//! after `scripts/test.sh` installed the wheels. It measures the library's own host work per
//! forwarded call plus the emulated driver's launch, not the real driver's; the stream time per
//! forwarded call on a GPU is a gpu-check row.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Rank processes per run.
const RANKS: usize = 4;

fn main() {
    let calls: usize = match std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        None => 2000,
        Some(text) => match text.parse() {
            Ok(n) if n >= 16 => n,
            _ => fail(&format!(
                "usage: cargo bench --bench forwarded_engine [-- CALLS >= 16], not {text}"
            )),
        },
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let library = root.join("target/release/libstragglar.so");
    if !library.exists() {
        fail("no target/release/libstragglar.so: run `cargo build --release` first");
    }
    let driver = emulated_driver(root);
    let program = loopback_ranks(root, &driver);
    let records =
        std::env::temp_dir().join(format!("stragglar-bench-records-{}", std::process::id()));
    println!("{RANKS} ranks, {calls} calls of 4099 floats each, nobody late");
    println!(
        "{:<8} {:>12} {:>12} {:>20}",
        "engine", "median ns", "p90 ns", "calls on NCCL"
    );
    for mode in ["off", "on", "observe"] {
        let output = Command::new(root.join("scripts/emulated-gpu.sh"))
            .arg(&program)
            .arg(RANKS.to_string())
            .current_dir(root)
            .env("STRAGGLAR_GPU_ENGINE", if mode == "on" { "1" } else { "0" })
            .env(
                "STRAGGLAR_OBSERVE",
                if mode == "observe" { "1" } else { "0" },
            )
            .env("STRAGGLAR_REPORT_DIR", &records)
            // The calls (16 KiB) are eligible, so the engine serves them.
            .env("STRAGGLAR_MIN_BYTES", "0")
            .env("STRAGGLAR_DEBUG", "WARN")
            .env("LOOPBACK_FIXED", "1")
            .env("LOOPBACK_HOST_TIMES", "1")
            .env("LOOPBACK_CALLS", calls.to_string())
            .output()
            .unwrap_or_else(|e| fail(&format!("scripts/emulated-gpu.sh: {e}")));
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            fail(&format!(
                "engine {mode}: {}\n{stdout}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let Some((median, p90)) = median_over_ranks(&stdout) else {
            fail(&format!("engine {mode}: no host times in\n{stdout}"));
        };
        // A rank the emulated machine's scheduling keeps late may be designated now and then,
        // and some calls then run StragglAR: counted, not hidden.
        let forwarded: u64 = stdout
            .lines()
            .filter_map(|l| {
                l.strip_suffix(" on NCCL")?
                    .rsplit(", ")
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        println!(
            "{mode:<8} {median:>12} {p90:>12} {:>20}",
            format!("{forwarded} of {}", RANKS * calls)
        );
    }
    let _ = std::fs::remove_dir_all(&records);
}

/// The emulated driver's directory (`scripts/emulated-gpu.sh --build` prints it).
fn emulated_driver(root: &Path) -> PathBuf {
    let built = Command::new(root.join("scripts/emulated-gpu.sh"))
        .arg("--build")
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| fail(&format!("scripts/emulated-gpu.sh --build: {e}")));
    if !built.status.success() {
        fail(&format!(
            "scripts/emulated-gpu.sh --build: {}",
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    PathBuf::from(String::from_utf8_lossy(&built.stdout).trim())
}

/// `tests/c/loopback_ranks.c`, built against our `include/nccl.h`, linked with
/// `libstragglar.so` and the emulated driver, into `target/bench/`.
fn loopback_ranks(root: &Path, driver: &Path) -> PathBuf {
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).unwrap_or_else(|e| fail(&format!("{}: {e}", out.display())));
    let program = out.join("loopback_ranks");
    let cuda_headers = root.join(".venv/cu12/nvidia/cuda_runtime/include");
    let release = root.join("target/release");
    let built = Command::new("cc")
        .args(["-O2", "-std=gnu11", "-Iinclude"])
        .arg(format!("-I{}", cuda_headers.display()))
        .arg("tests/c/loopback_ranks.c")
        .arg(format!("-L{}", release.display()))
        .arg("-lstragglar")
        .arg(format!("-Wl,-rpath,{}", release.display()))
        .arg(format!("-L{}", driver.display()))
        .args(["-lcuda", "-pthread", "-o"])
        .arg(&program)
        .current_dir(root)
        .status()
        .unwrap_or_else(|e| fail(&format!("cc: {e}")));
    if !built.success() {
        fail("cc could not build tests/c/loopback_ranks.c");
    }
    program
}

/// The median over ranks of each rank's median and p90 host time per call, in ns, from
/// `loopback_ranks`' lines ("host time per call over N calls: median M ns, p90 P ns").
fn median_over_ranks(stdout: &str) -> Option<(u64, u64)> {
    let mut ranks: Vec<(u64, u64)> = stdout
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once("host time per call over ")?;
            let (_, rest) = rest.split_once(": median ")?;
            let (median, rest) = rest.split_once(" ns, p90 ")?;
            let p90 = rest.strip_suffix(" ns")?;
            Some((median.parse().ok()?, p90.trim().parse().ok()?))
        })
        .collect();
    if ranks.is_empty() {
        return None;
    }
    ranks.sort_unstable();
    Some(ranks[(ranks.len() - 1) / 2])
}

fn fail(why: &str) -> ! {
    eprintln!("forwarded_engine: {why}");
    std::process::exit(1)
}
