//! The fault matrix: for n = 3..8 ranks (processes), each phase of the protocol (arrival,
//! ReduceScatter, the exchange with the straggler, the copies) and each fault (SIGKILL,
//! SIGSTOP past a deadline, abort), one rank misbehaves in the second call. Every other rank
//! must report an error of its own promptly, nothing may be left in /dev/shm, and a new
//! communicator must work afterwards.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::*;

const VICTIM: usize = 1;

fn stragglar() -> Command {
    clean_command(Path::new(env!("CARGO_BIN_EXE_stragglar")))
}

fn comm_id(stdout: &[u8]) -> String {
    let text = String::from_utf8_lossy(stdout);
    text.lines()
        .next()
        .unwrap_or_default()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string()
}

fn leftovers(comm_id: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .filter(|n| n.starts_with(&format!("stragglar.{comm_id}.")))
                .collect()
        })
        .unwrap_or_default()
}

/// What a rank other than the victim may report: its own view of the failure.
fn reports_own_failure(stderr: &str, rank: usize) -> bool {
    let prefix = format!("rank {rank}: ");
    stderr
        .lines()
        .filter_map(|l| l.split_once("stragglar bench: ").map(|(_, r)| r))
        .any(|l| {
            l.starts_with(&prefix)
                && ["exited", "aborted or failed", "timed out", "aborted"]
                    .iter()
                    .any(|w| l.contains(w))
        })
}

#[test]
fn every_fault_in_every_phase_fails_every_rank_promptly_and_cleanly() {
    let mut injected = 0;
    for ranks in 3..=8usize {
        for phase in ["arrival", "rs", "exchange", "copies"] {
            for action in ["kill", "stop", "abort"] {
                let fault = format!("{action}@{phase}:2");
                let start = Instant::now();
                let out = run(stragglar().args([
                    "bench",
                    "--ranks",
                    &ranks.to_string(),
                    "-b",
                    "16K",
                    "-e",
                    "16K",
                    "-n",
                    "3",
                    "-w",
                    "0",
                    "-c",
                    "0",
                    "--fault",
                    &fault,
                    "--fault-rank",
                    &VICTIM.to_string(),
                    "--timeout-ms",
                    "300",
                ]));
                let took = start.elapsed();
                let what = format!("n={ranks} {fault}: {}", describe(&out));
                assert_eq!(out.status.code(), Some(1), "{what}");
                assert!(took < Duration::from_secs(20), "took {took:?}: {what}");
                let stderr = String::from_utf8_lossy(&out.stderr);
                for rank in (0..ranks).filter(|&r| r != VICTIM) {
                    assert!(
                        reports_own_failure(&stderr, rank),
                        "rank {rank} did not report: {what}"
                    );
                }
                let left = leftovers(&comm_id(&out.stdout));
                assert!(left.is_empty(), "left in /dev/shm: {left:?}: {what}");
                injected += 1;
            }
        }
        let after = run(stragglar().args([
            "bench",
            "--ranks",
            &ranks.to_string(),
            "-b",
            "16K",
            "-e",
            "16K",
            "-n",
            "2",
        ]));
        assert!(
            after.status.success(),
            "a new communicator after the faults, n={ranks}: {}",
            describe(&after)
        );
    }
    assert_eq!(injected, 72);
}
