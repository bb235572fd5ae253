//! `STRAGGLAR_TRACE_DIR`, `STRAGGLAR_ALGO` and `STRAGGLAR_STRAGGLER` on the host engine: each
//! rank writes a Chrome trace that parses as JSON with one event per call, and the settings
//! steer the per-call policy as documented.

mod support;

use std::process::Command;

/// Runs a 4-rank bench with `--algo auto` and a late rank 1; returns each rank's trace text.
fn traced_run(env: &[(&str, &str)], name: &str) -> Vec<String> {
    let dir = support::root().join("target").join("trace-test").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stragglar"));
    cmd.args([
        "bench",
        "--ranks",
        "4",
        "--ranks-as",
        "threads",
        "--algo",
        "auto",
    ])
    .args([
        "-b", "4K", "-e", "16K", "-f", "2", "-n", "5", "-w", "1", "-c", "1",
    ])
    .args(["--late-rank", "1", "--delay-us", "3000"])
    .env("STRAGGLAR_TRACE_DIR", &dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut traces: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    traces.sort();
    assert_eq!(traces.len(), 4, "one trace per rank");
    for (path, _) in &traces {
        // The real JSON parser: what Perfetto and chrome://tracing need first.
        let check = Command::new("python3")
            .args([
                "-c",
                "import json,sys; d=json.load(open(sys.argv[1])); e=d['traceEvents']; \
                 assert all(x['ph']=='X' and x['dur']>=0 for x in e); print(len(e))",
                path,
            ])
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{path}: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        // 3 sizes x 2 placements x (1 warm-up + 5 timed + 1 checked) calls.
        assert_eq!(
            String::from_utf8_lossy(&check.stdout).trim(),
            "42",
            "{path}"
        );
    }
    traces.into_iter().map(|(_, t)| t).collect()
}

#[test]
fn each_rank_writes_a_chrome_trace_with_one_event_per_call() {
    let traces = traced_run(&[], "auto");
    for t in &traces {
        assert!(
            t.contains("\"last_rank\":1"),
            "the late rank shows in the records"
        );
    }
}

#[test]
fn a_fixed_straggler_is_used_on_every_stragglar_call() {
    let traces = traced_run(
        &[
            ("STRAGGLAR_STRAGGLER", "2"),
            ("STRAGGLAR_ALGO", "stragglar"),
        ],
        "fixed",
    );
    for t in &traces {
        assert!(t.contains("\"algorithm\":\"stragglar\""));
        assert!(!t.contains("\"algorithm\":\"ring\""));
        assert!(
            !t.contains("\"straggler\":1")
                && !t.contains("\"straggler\":0")
                && !t.contains("\"straggler\":3")
        );
    }
}

#[test]
fn algo_nccl_keeps_every_call_on_the_baseline() {
    let traces = traced_run(&[("STRAGGLAR_ALGO", "nccl")], "nccl");
    for t in &traces {
        assert!(!t.contains("\"algorithm\":\"stragglar\""));
    }
}

#[test]
fn the_bench_ends_with_a_straggler_report_from_the_shared_records() {
    // Ranks as processes: the report travels from rank 0's worker to the parent.
    let out = Command::new(env!("CARGO_BIN_EXE_stragglar"))
        .args([
            "bench", "--ranks", "3", "--algo", "auto", "-b", "4K", "-e", "4K",
        ])
        .args([
            "-n",
            "60",
            "-w",
            "1",
            "--late-rank",
            "1",
            "--delay-us",
            "3000",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = text
        .split("# straggler report:")
        .nth(1)
        .unwrap_or_else(|| panic!("no straggler report in:\n{text}"));
    assert!(
        report.contains("sizes 2^13 B: straggler 1 since call"),
        "{report}"
    );
    let share: f64 = report
        .lines()
        .find(|l| l.starts_with("#     1 "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no line for rank 1 in:\n{report}"));
    assert!(
        share > 75.0,
        "rank 1 arrived last in {share}% of calls:\n{report}"
    );
}
