//! The emulated CUDA machine (tests/emulated, run through scripts/emulated-gpu.sh): its driver
//! self-test, and the GPU engine's bench driving it as it would a GPU, ranks as threads and as
//! processes, eager and captured into graphs, with an injected driver failure.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// `scripts/emulated-gpu.sh ARGS...` with no inherited STRAGGLAR_* or loader variables, killed
/// after 5 minutes (a hang fails the test instead of the whole run).
fn emulated(args: &[&str]) -> Command {
    let mut cmd = support::clean_command(Path::new("timeout"));
    cmd.args(["--kill-after=10", "300"])
        .arg(support::root().join("scripts/emulated-gpu.sh"))
        .args(args);
    cmd
}

/// Builds the driver and the self-test once per test binary; the directory holding them.
fn built() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = support::run(&mut emulated(&["--build"]));
        assert!(out.status.success(), "{}", support::describe(&out));
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// The CLI these tests were built with.
fn stragglar() -> &'static str {
    env!("CARGO_BIN_EXE_stragglar")
}

/// Fills the shared kernel cache (scripts/emulated-gpu.sh's default) unless it holds this
/// build's sm_90 entry, once (NVRTC takes about 20 s), so the runs below load the CUBIN rather
/// than each compiling it.
fn kernels_cached() {
    static CACHED: OnceLock<()> = OnceLock::new();
    CACHED.get_or_init(|| {
        let entry = stragglar::gpu::nvrtc::version()
            .map(|version| stragglar::gpu::nvrtc::cache_key("sm_90", version));
        if entry.is_some_and(|entry| built().join("kernels").join(entry).exists()) {
            return;
        }
        let out = support::run(&mut emulated(&[
            stragglar(),
            "kernels",
            "--arch",
            "sm_90",
            "--cache",
        ]));
        assert!(out.status.success(), "{}", support::describe(&out));
    });
}

fn bench(extra: &[&str], env: &[(&str, &str)]) -> Output {
    kernels_cached();
    let mut args = vec![
        stragglar(),
        "bench",
        "--backend",
        "cuda",
        "--ranks",
        "4",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "3",
        "-w",
        "1",
        "-c",
        "1",
    ];
    args.extend_from_slice(extra);
    let mut cmd = emulated(&args);
    for (key, value) in env {
        cmd.env(key, value);
    }
    support::run(&mut cmd)
}

fn assert_clean_bench(out: &Output) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", support::describe(out));
    assert!(
        text.contains("Stragglar emulated GPU"),
        "{}",
        support::describe(out)
    );
    assert!(
        text.contains("wrong elements and rank disagreements: 0"),
        "{}",
        support::describe(out)
    );
}

#[test]
fn the_driver_self_test_passes() {
    let selftest = built().join("selftest");
    let out = support::run(&mut emulated(&[selftest.to_str().unwrap()]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", support::describe(&out));
    assert!(text.contains("GPU 0: Stragglar emulated GPU"), "{text}");
    assert!(text.lines().any(|l| l == "9 passed, 0 failed"), "{text}");
}

#[test]
fn doctor_says_the_gpus_are_emulated() {
    built();
    let out = support::run(emulated(&[stragglar(), "doctor"]).env("STRAGGLAR_EMU_GPUS", "3"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("driver:    present, 3 GPU(s)"), "{text}");
    assert!(text.contains("GPU 2:     Stragglar emulated GPU"), "{text}");
}

#[test]
fn bench_ranks_as_threads_run_eager_and_in_graphs() {
    assert_clean_bench(&bench(&[], &[]));
    assert_clean_bench(&bench(&["--graph"], &[]));
    assert_clean_bench(&bench(
        &["--algo", "auto", "--late-rank", "2", "--delay-us", "3000"],
        &[],
    ));
}

#[test]
fn bench_ranks_as_processes_run_through_ipc_eager_and_in_graphs() {
    assert_clean_bench(&bench(&["--ranks-as", "processes"], &[]));
    assert_clean_bench(&bench(
        &[
            "--ranks-as",
            "processes",
            "--graph",
            "-d",
            "half",
            "-o",
            "max",
        ],
        &[],
    ));
}

#[test]
fn a_failing_ipc_open_refuses_the_setup_on_every_rank() {
    let out = bench(
        &["--ranks-as", "processes"],
        &[("STRAGGLAR_EMU_FAIL", "cuIpcOpenMemHandle_v2")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", support::describe(&out));
    // Every rank reports (their lines may interleave: the ranks are processes).
    assert_eq!(
        err.matches("setup refused").count(),
        4,
        "{}",
        support::describe(&out)
    );
    assert!(
        err.contains("could not reach every peer's staging through CUDA IPC"),
        "{}",
        support::describe(&out)
    );
}
