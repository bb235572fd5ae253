//! The host engine as users run it: `stragglar bench` with ranks as real processes over shared
//! memory, every data type and op checked element by element, wrong straggler guesses, and
//! peers that die or never arrive.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::*;

fn stragglar() -> Command {
    clean_command(Path::new(env!("CARGO_BIN_EXE_stragglar")))
}

fn bench(args: &[&str]) -> Output {
    run(stragglar().arg("bench").args(args))
}

/// The table lines (not comments) of a bench run.
fn rows(out: &Output) -> Vec<Vec<String>> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

#[test]
fn every_type_and_op_is_exact_across_processes() {
    for dtype in [
        "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
        "bfloat16",
    ] {
        for op in ["sum", "prod", "max", "min", "avg", "premulsum"] {
            let out = bench(&[
                "--ranks",
                "4",
                "--straggler",
                "2",
                "-b",
                "4",
                "-e",
                "4100",
                "-i",
                "2048",
                "-n",
                "1",
                "-w",
                "0",
                "-c",
                "2",
                "-d",
                dtype,
                "-o",
                op,
            ]);
            assert!(out.status.success(), "{dtype} {op}: {}", describe(&out));
            let table = rows(&out);
            assert_eq!(table.len(), 3, "{dtype} {op}: {}", describe(&out));
            for row in table {
                assert_eq!(
                    (row[8].as_str(), row[12].as_str()),
                    ("0", "0"),
                    "{dtype} {op}: {row:?}"
                );
            }
        }
    }
}

#[test]
fn odd_counts_and_many_ranks() {
    for ranks in ["2", "3", "5", "9"] {
        let out = bench(&[
            "--ranks",
            ranks,
            "--straggler",
            "0",
            "-b",
            "1",
            "-e",
            "100003",
            "-f",
            "7",
            "-n",
            "1",
            "-d",
            "int32",
        ]);
        assert!(out.status.success(), "n={ranks}: {}", describe(&out));
    }
    let threads = bench(&[
        "--ranks",
        "12",
        "--ranks-as",
        "threads",
        "-b",
        "999",
        "-e",
        "999",
        "-n",
        "2",
        "-d",
        "half",
    ]);
    assert!(threads.status.success(), "{}", describe(&threads));
}

#[test]
fn a_wrong_straggler_guess_costs_time_not_correctness() {
    let out = bench(&[
        "--ranks",
        "5",
        "--straggler",
        "0",
        "--late-rank",
        "3",
        "--delay-us",
        "3000",
        "-b",
        "64K",
        "-e",
        "64K",
        "-n",
        "3",
        "-o",
        "sum",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("late rank 3"));
}

#[test]
fn ring_and_large_messages_in_segments() {
    let out = bench(&[
        "--ranks",
        "4",
        "--algo",
        "ring",
        "-b",
        "1M",
        "-e",
        "1M",
        "-n",
        "2",
        "--buffer-bytes",
        "64K",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = bench(&[
        "--ranks",
        "4",
        "-b",
        "1M",
        "-e",
        "1M",
        "-n",
        "2",
        "--buffer-bytes",
        "64K",
        "-d",
        "bfloat16",
        "-o",
        "avg",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// The communicator id a bench run printed in its header.
fn comm_id(stdout: &[u8]) -> String {
    let text = String::from_utf8_lossy(stdout);
    let header = text.lines().next().unwrap_or_default();
    header.rsplit(' ').next().unwrap_or_default().to_string()
}

/// The run's segments still named in /dev/shm.
fn shm_leftovers(comm_id: &str) -> Vec<String> {
    assert_eq!(comm_id.len(), 16, "no communicator id: '{comm_id}'");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .filter(|n| n.starts_with(&format!("stragglar.{comm_id}.")))
                .collect()
        })
        .unwrap_or_default()
}

/// The worker processes of a running bench.
fn workers(parent: u32) -> Vec<u32> {
    let path = format!("/proc/{parent}/task/{parent}/children");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn a_peer_killed_mid_run_makes_every_rank_fail_promptly() {
    let child = stragglar()
        .args([
            "bench",
            "--ranks",
            "4",
            "-b",
            "256K",
            "-e",
            "256K",
            "-n",
            "100000",
            "-w",
            "0",
            "--link-gbs",
            "0.5",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let victims = loop {
        let w = workers(child.id());
        if w.len() == 4 {
            break w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "workers did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: sending a signal to a child process of the bench we started.
    unsafe { libc::kill(victims[1] as i32, libc::SIGKILL) };
    let killed_at = Instant::now();
    let out = child.wait_with_output().unwrap();
    let took = killed_at.elapsed();
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rank 1 exited") || err.contains("signal"),
        "{err}"
    );
    let first = err
        .lines()
        .find_map(|l| l.strip_prefix("stragglar bench: "))
        .unwrap_or_default();
    assert!(
        first.starts_with("rank 1: its worker ended with signal: 9 (SIGKILL)"),
        "the killed rank comes first, before its peers' echoes: {err}"
    );
    let left = shm_leftovers(&comm_id(&out.stdout));
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

#[test]
fn a_peer_that_never_arrives_times_out_cleanly() {
    let start = Instant::now();
    let out = bench(&[
        "--ranks",
        "3",
        "-b",
        "4K",
        "-e",
        "4K",
        "-n",
        "1",
        "-w",
        "0",
        "--delay-us",
        "600000000",
        "--timeout-ms",
        "300",
    ]);
    let took = start.elapsed();
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("timed out"), "{err}");
    let left = shm_leftovers(&comm_id(&out.stdout));
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// Multicast StragglAR across processes: several types and ops exact at several sizes, a wrong
/// straggler guess included, every rank bitwise equal.
#[test]
fn multicast_stragglar_is_exact_across_processes() {
    for (dtype, op, straggler, late) in [
        ("float", "sum", "4", "4"),
        ("bfloat16", "max", "1", "1"),
        ("int64", "prod", "0", "3"),
        ("half", "avg", "2", "2"),
    ] {
        let out = bench(&[
            "--ranks",
            "5",
            "--algo",
            "multicast",
            "--straggler",
            straggler,
            "--late-rank",
            late,
            "--delay-us",
            "2000",
            "-b",
            "4",
            "-e",
            "70000",
            "-f",
            "16",
            "-n",
            "2",
            "-w",
            "1",
            "-d",
            dtype,
            "-o",
            op,
        ]);
        assert!(out.status.success(), "{dtype} {op}: {}", describe(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("algo multicast"), "{text}");
        assert!(
            text.contains("wrong elements and rank disagreements: 0"),
            "{dtype} {op}: {text}"
        );
    }
}

/// Under `--algo auto` with `STRAGGLAR_MULTICAST` set, the measured policy may finish StragglAR
/// by multicast: forced (`always`) every StragglAR call of the class does, and the report says
/// so; weighed (`1`) the class starts on the model's finish and probes the other, and every
/// element stays right whichever ran. Unset, nothing finishes by multicast.
#[test]
fn the_measured_policy_weighs_the_multicast_finish_on_the_host_engine() {
    let args = [
        "--ranks",
        "5",
        "--algo",
        "auto",
        "--late-rank",
        "4",
        "--delay-us",
        "5000",
        "-b",
        "64K",
        "-e",
        "64K",
        "-n",
        "50",
        "-w",
        "2",
    ];
    for (setting, multicast) in [("always", Some(true)), ("1", None), ("0", Some(false))] {
        let out = run(stragglar()
            .arg("bench")
            .args(args)
            .env("STRAGGLAR_MULTICAST", setting));
        assert!(out.status.success(), "{setting}: {}", describe(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("wrong elements and rank disagreements: 0"),
            "{setting}: {text}"
        );
        let class = text
            .lines()
            .find(|l| l.starts_with("# sizes 2^17 B,"))
            .unwrap_or_else(|| panic!("{setting}: no class line: {text}"));
        assert!(!class.contains("StragglAR 0.0%"), "{setting}: {class}");
        if let Some(multicast) = multicast {
            assert_eq!(
                class.contains("one multicast"),
                multicast,
                "{setting}: {class}"
            );
        }
    }
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        vec!["--ranks", "1"],
        vec!["--ranks", "4", "--straggler", "4"],
        vec!["-d", "f8e4m3"],
        vec!["--backend", "tpu"],
        vec!["--backend", "cuda", "--jitter-us", "5"],
        vec!["--graph"],
        vec!["--bandwidth"],
        vec!["--latency"],
        vec!["-o", "all"],
        vec!["--algo", "bogus"],
        vec!["--late-rank", "1,x"],
        vec!["-b", "2M", "-e", "1M"],
        vec!["--link-gbs", "-1"],
        vec!["--baseline-link-gbs", "1"],
        vec!["--link-gbs", "1", "--baseline-link-gbs", "0"],
        vec!["--backend", "cuda", "--baseline-link-gbs", "1"],
        vec!["--backend", "cuda", "--algo", "multicast"],
        vec!["--algo", "multicast", "--pipeline", "2"],
    ] {
        let out = bench(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
    }
}

#[test]
fn the_demo_runs_and_checks_every_result() {
    let out = run(stragglar().arg("demo"));
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for size in ["65536", "262144", "1048576"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(size)),
            "{size}: {text}"
        );
    }
    assert!(text.contains("checked"), "{text}");
}

/// The policy columns (designated straggler, percent of timed calls on StragglAR) of each row.
fn policy_columns(out: &Output) -> Vec<(String, f64)> {
    rows(out)
        .into_iter()
        .map(|r| (r[r.len() - 2].clone(), r[r.len() - 1].parse().unwrap()))
        .collect()
}

#[test]
fn auto_detects_a_persistent_straggler_and_uses_stragglar() {
    let out = bench(&[
        "--ranks",
        "5",
        "--algo",
        "auto",
        "--late-rank",
        "3",
        "--delay-us",
        "4000",
        // Ring's links five times slower, so that StragglAR is measured faster whatever the
        // build (a debug build's compute would otherwise weigh as much as the links).
        "--link-gbs",
        "0.05",
        "--baseline-link-gbs",
        "0.01",
        "-b",
        "64K",
        "-e",
        "64K",
        "-n",
        "60",
        "-w",
        "0",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let (designated, percent) = policy_columns(&out).remove(0);
    assert_eq!(designated, "3", "{}", describe(&out));
    assert!(percent > 30.0, "{}", describe(&out));
}

/// The policy's model knows only StragglAR's links (`--link-gbs`), so it says StragglAR wins for
/// a straggler this late, whatever the baseline's links (`--baseline-link-gbs`, standing in for
/// an NCCL slower or faster than modelled). The class's first calls (warm-up) measure both
/// algorithms, and then the measured times decide: with the baseline's links ten times slower
/// StragglAR runs on the timed calls, with them a hundred times faster the baseline does, on
/// every timed call but the explorations. (The links differ by tens of milliseconds per call, so
/// that a debug build's compute on a loaded machine, which the links do not hide, cannot
/// reverse them.)
#[test]
fn auto_follows_measured_post_arrival_times_over_the_model() {
    let run = |links: [&str; 2]| {
        let out = bench(&[
            "--ranks",
            "4",
            "--algo",
            "auto",
            "--late-rank",
            "3",
            "--delay-us",
            "30000",
            "-b",
            "64K",
            "-e",
            "64K",
            "-n",
            "40",
            "-w",
            "30",
            "--link-gbs",
            links[0],
            "--baseline-link-gbs",
            links[1],
        ]);
        assert!(out.status.success(), "{}", describe(&out));
        let (designated, percent) = policy_columns(&out).remove(0);
        assert_eq!(designated, "3", "{}", describe(&out));
        (percent, out)
    };
    let (percent, out) = run(["0.05", "0.005"]);
    assert!(percent >= 80.0, "{}", describe(&out));
    let (percent, out) = run(["0.005", "0.5"]);
    assert!(percent <= 10.0, "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("the baseline's 0.5 GB/s"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("# sizes 2^17 B, ") && l.contains("post-arrival median")),
        "{text}"
    );
}

/// Pipelined StragglAR across processes: every element checked (the bench exits 1 on a wrong
/// one), fixed depths and the model's choice per size, odd sizes, in and out of place; the
/// header says which.
#[test]
fn pipelined_stragglar_is_exact_across_processes() {
    for (ranks, pipeline) in [("5", "3"), ("8", "auto"), ("4", "2")] {
        let out = bench(&[
            "--ranks",
            ranks,
            "--pipeline",
            pipeline,
            "-b",
            "4100",
            "-e",
            "40100",
            "-i",
            "12000",
            "-n",
            "3",
            "-w",
            "1",
            "--link-gbs",
            "1",
        ]);
        assert!(out.status.success(), "{}", describe(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("pipeline {pipeline} ")), "{text}");
        assert_eq!(rows(&out).len(), 4, "{text}");
    }
    let out = bench(&["--ranks", "4", "--pipeline", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let out = bench(&["--ranks", "4", "--pipeline", "1000"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn auto_stays_on_ring_without_a_straggler() {
    let out = bench(&[
        "--ranks", "4", "--algo", "auto", "-b", "16K", "-e", "16K", "-n", "60", "-w", "0",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let (designated, percent) = policy_columns(&out).remove(0);
    assert_eq!(
        (designated.as_str(), percent),
        ("-", 0.0),
        "{}",
        describe(&out)
    );
}

#[test]
fn a_moving_straggler_is_followed_and_every_rank_chooses_alike() {
    // Rank 1, then rank 4, then rank 1 again are late (20 ms), 40 calls each, on top of random
    // arrival jitter: the designation changes twice during the run. The bench exits 1 if any rank's sequence
    // of choices (algorithm and straggler, call by call) differs from rank 0's.
    let out = bench(&[
        "--ranks",
        "6",
        "--algo",
        "auto",
        "--late-rank",
        "1,4",
        "--late-every",
        "40",
        "--delay-us",
        "20000",
        "--jitter-us",
        "1000",
        // Emulated links, Ring's five times slower, so that StragglAR is measured faster than
        // Ring once rank 1 or 4 is designated, whatever the build (unlimited, 6 processes on
        // 2 cores measure Ring faster).
        "--link-gbs",
        "0.05",
        "--baseline-link-gbs",
        "0.01",
        "-b",
        "32K",
        "-e",
        "32K",
        "-n",
        "60",
        "-w",
        "0",
        "-c",
        "0",
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    let (designated, percent) = policy_columns(&out).remove(0);
    // 120 timed calls: late ranks 1 (1-40), 4 (41-80), 1 (81-120); a switch needs about 24
    // calls of the window, so rank 1 is designated again at the end.
    assert_eq!(designated, "1", "{}", describe(&out));
    assert!(percent > 30.0, "{}", describe(&out));
}
