//! `scripts/gpu-check.sh` is complete and runnable (executable) where no GPU is: its dry run lists every
//! check and ends with the summary table; the CUDA backend it drives fails cleanly here.

mod support;

use std::process::Command;

/// The inputs a device run needs, as `--prepare` makes them: the binaries of this build, the
/// emulated GPU's driver self-test, a kernel cache holding sm_90's entry of these sources, and
/// the loopback NCCL with the tests' rank program.
fn prepared(cmd: &mut Command) -> &mut Command {
    let built =
        support::run(Command::new(support::root().join("scripts/emulated-gpu.sh")).arg("--build"));
    assert!(built.status.success(), "{}", support::describe(&built));
    let emulated = String::from_utf8(built.stdout).unwrap().trim().to_owned();
    let loopback = support::run(
        Command::new(support::root().join("scripts/emulated-gpu.sh")).arg("--build-loopback-ranks"),
    );
    assert!(
        loopback.status.success(),
        "{}",
        support::describe(&loopback)
    );
    let loopback = String::from_utf8(loopback.stdout)
        .unwrap()
        .trim()
        .to_owned();
    let kernels = support::real_kernels(std::path::Path::new(env!("CARGO_BIN_EXE_stragglar")))
        .unwrap_or_else(|e| panic!("{e}"));
    cmd.env("STRAGGLAR_BIN", env!("CARGO_BIN_EXE_stragglar"))
        .env("STRAGGLAR_LIB", support::stragglar_so())
        .env(
            "STRAGGLAR_SELFTEST",
            std::path::Path::new(&emulated).join("selftest"),
        )
        .env("STRAGGLAR_KERNELS", kernels.cache)
        .env("STRAGGLAR_LOOPBACK", loopback)
}

/// The script writing into `out_dir`, with this build's CLI standing in for both binaries and
/// no other input prepared (runs that never reach a step needing them).
fn unprepared(out_dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(support::root().join("scripts/gpu-check.sh"));
    cmd.env("OUT", out_dir)
        .env("STRAGGLAR_BIN", env!("CARGO_BIN_EXE_stragglar"))
        .env("STRAGGLAR_LIB", env!("CARGO_BIN_EXE_stragglar"));
    cmd
}

/// The summary table a run printed last: everything after its heading.
fn summary_of(stdout: &str) -> &str {
    stdout
        .split("== gpu-check summary")
        .nth(1)
        .expect("a summary table")
}

#[test]
fn the_dry_run_checks_its_inputs_lists_every_check_and_ends_with_the_summary() {
    // Run as the README and the device command run it: the script itself, not `bash script`,
    // so a lost executable bit fails here.
    let mut cmd = Command::new(support::root().join("scripts/gpu-check.sh"));
    cmd.arg("--dry-run").env(
        "OUT",
        support::root().join("target").join("gpu-check-dry-run"),
    );
    let out = prepared(&mut cmd).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = summary_of(&stdout);
    for check in [
        "input: stragglar ",
        "input: libstragglar.so ",
        "input: driver self-test ",
        "input: kernels (sm_90, these sources) ",
        "input: loopback NCCL and rank program ",
        "doctor",
        "kernels carried, built here for sm_90",
        "graph turn kernel loads (cudaGraphSetConditional)",
        "multicast team (doctor --multicast)",
        "bench --backend cuda: n=2,3,4,5,6,7,8, types all, ops all",
        "8 ranks, 1K..256M, stragglar",
        "8 ranks, 1K..256M, ring",
        "CUDA graph capture and replay",
        "straggler policy on the GPU: 4 ranks, rank 3 late",
        "policy in graph replays, on the GPU: 4 ranks, rank 3 late",
        "kernel bandwidth vs cuMemcpyDtoD",
        "latency and bytes in flight (pointer chase, grid sweep)",
        "fixed cost per step and per call",
        "processes over CUDA IPC: n=2,3,4",
        "one hardware queue per process: 3 processes, eager and graph",
        "the library's whole path: 4 processes on the GPU, loopback NCCL",
        "forwarded calls' cost, engine on vs off: 4 processes, loopback NCCL",
        "eager calls and graph replays mixed: 4 processes, 200 rounds, loopback NCCL",
        "a rank that never arrives: 4 processes, rank 2 killed, a 5 s deadline",
        "PyTorch LD_PRELOAD, world size 1",
        "observe mode, 4 PyTorch ranks on one GPU (real NCCL), rank 2 late",
    ] {
        assert!(summary.contains(check), "{check} missing from:\n{summary}");
    }
    assert!(!summary.contains("FAIL") && !summary.contains("PENDING"));
    assert!(!summary.contains("MISSING"), "{summary}");
}

/// A rehearsal on the emulated machine (one GPU, as the device has) of the rows that run the
/// library's own path under the loopback NCCL, selected with `--only`: each runs and passes as
/// it would on the real driver (the step functions, their settings and the lines they parse),
/// the forwarded cost is measured (emulated: its numbers mean nothing), and every row not
/// selected is marked so and left unrun.
#[test]
fn the_library_rows_pass_on_the_emulated_machine_and_only_runs_the_rows_it_names() {
    let out_dir = support::scratch("gpu-check-emulated");
    let mut cmd = Command::new(support::root().join("scripts/emulated-gpu.sh"));
    cmd.args([
        "scripts/gpu-check.sh",
        "--quick",
        "--only",
        "kernels carried|turn kernel|whole path|forwarded|mixed|never arrives",
    ])
    .env("OUT", &out_dir)
    .env("STRAGGLAR_EMU_GPUS", "1");
    let out = support::run(prepared(&mut cmd));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", support::describe(&out));
    let summary = summary_of(&stdout);
    for row in [
        "kernels carried, built here for sm_90",
        "graph turn kernel loads (cudaGraphSetConditional)",
        "the library's whole path: 4 processes on the GPU, loopback NCCL",
        "forwarded calls' cost, engine on vs off",
        "eager calls and graph replays mixed: 4 processes, 40 rounds, loopback NCCL",
        "a rank that never arrives: 4 processes, rank 2 killed, a 5 s deadline",
    ] {
        let line = summary
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("{row} missing from:\n{summary}"));
        assert!(
            line.contains(" PASS "),
            "{line}\n{}",
            support::describe(&out)
        );
    }
    assert!(
        summary.contains("a forwarded call's stream and host time")
            && summary.contains("on NCCL: 4000 of 4000 calls"),
        "{summary}"
    );
    for unselected in ["doctor", "multicast team", "CUDA graph capture and replay"] {
        let line = summary
            .lines()
            .find(|l| l.starts_with(unselected))
            .unwrap_or_else(|| panic!("{unselected} missing from:\n{summary}"));
        assert!(line.contains("UNSELECTED"), "{line}");
    }
    assert!(!stdout.contains("\n== doctor\n"), "{stdout}");
}

/// A missing binary, self-test, kernel cache (or one of other sources) or loopback kit fails
/// the dry run, each named in its row.
#[test]
fn the_dry_run_fails_on_a_missing_input() {
    let empty = support::scratch("gpu-check-no-kernels");
    for (variable, value, row) in [
        (
            "STRAGGLAR_BIN",
            "/nonexistent/stragglar",
            "input: stragglar ",
        ),
        (
            "STRAGGLAR_LIB",
            "/nonexistent/libstragglar.so",
            "input: libstragglar.so ",
        ),
        (
            "STRAGGLAR_SELFTEST",
            "/nonexistent/selftest",
            "input: driver self-test ",
        ),
        (
            "STRAGGLAR_KERNELS",
            empty.to_str().unwrap(),
            "input: kernels (sm_90, these sources) ",
        ),
        (
            "STRAGGLAR_LOOPBACK",
            empty.to_str().unwrap(),
            "input: loopback NCCL and rank program ",
        ),
    ] {
        let mut cmd = Command::new(support::root().join("scripts/gpu-check.sh"));
        cmd.arg("--dry-run").env(
            "OUT",
            support::root().join("target").join("gpu-check-dry-missing"),
        );
        let out = prepared(&mut cmd).env(variable, value).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{variable}: {stdout}");
        let missing: Vec<&str> = stdout.lines().filter(|l| l.contains("MISSING")).collect();
        // Without the binary the kernels cannot be checked either; otherwise only the one.
        let expected = if variable == "STRAGGLAR_BIN" { 2 } else { 1 };
        assert!(
            missing.len() == expected && missing[0].starts_with(row),
            "{variable}: {stdout}"
        );
    }
}

/// A real (not dry) run whose budget is already spent: every step is SKIPPED at once (no row
/// taken from an earlier run's logs), the summary still prints with its time line, and the
/// exit status says the check is incomplete.
#[test]
fn a_spent_budget_skips_every_step_and_still_prints_the_summary() {
    let out_dir = support::root()
        .join("target")
        .join("gpu-check-spent-budget");
    // Logs of an earlier run that measured something: no row may come from them.
    std::fs::create_dir_all(&out_dir).unwrap();
    for (log, line) in [
        (
            "sweep-stragglar.log",
            "# host time to queue one eager call (x): mean 1 us",
        ),
        (
            "policy-table.log",
            "# host time to queue one eager call (x): mean 1 us",
        ),
        ("bandwidth-float.log", "# bandwidth summary: of 1 GB/s"),
    ] {
        std::fs::write(out_dir.join(log), format!("{line}\n")).unwrap();
    }
    let out = unprepared(&out_dir).env("BUDGET_S", "0").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let summary = summary_of(&stdout);
    assert!(summary.contains("of a 0 s budget"), "{summary}");
    let rows: Vec<&str> = summary
        .lines()
        .skip(2)
        .filter(|l| !l.is_empty() && !l.starts_with("input: ") && !l.starts_with("logs: "))
        .collect();
    assert!(rows.len() >= 10, "{summary}");
    for row in rows {
        assert!(row.contains("SKIPPED"), "{row}");
    }
    // What OUT keeps: the summary and one archive of the logs (the earlier run's too).
    let mut kept: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(kept, ["gpu-check-logs.tar.gz", "summary.txt"], "{stdout}");
    // The earlier run's logs are in it, named apart from this run's.
    let listed = Command::new("tar")
        .arg("-tzf")
        .arg(out_dir.join("gpu-check-logs.tar.gz"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    for log in [
        "sweep-stragglar.log",
        "policy-table.log",
        "bandwidth-float.log",
    ] {
        assert!(listed.contains(&format!("logs/earlier-{log}")), "{listed}");
    }
}

#[test]
fn the_cuda_backend_without_a_gpu_says_why_and_fails_cleanly() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_stragglar"))
        .args([
            "bench",
            "--backend",
            "cuda",
            "--ranks",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--backend cuda:"), "{stderr}");
}

#[test]
fn cuda_workers_refuse_bad_arguments_and_the_process_mode_fails_cleanly_without_a_gpu() {
    let worker = Command::new(env!("CARGO_BIN_EXE_stragglar"))
        .args(["__bench-cuda-worker", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(worker.status.code(), Some(2));
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_stragglar"))
        .args([
            "bench",
            "--backend",
            "cuda",
            "--ranks-as",
            "processes",
            "--ranks",
            "3",
        ])
        .args([
            "-d",
            "float,half",
            "-o",
            "all",
            "-b",
            "1K",
            "-e",
            "4K",
            "-f",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--backend cuda:"));
}

/// `--only` with a pattern bash cannot read is a usage error, and one that matches no step
/// fails the run (a rerun that ran nothing must not look green); the kernels' step runs
/// whatever the pattern, every later one needing its cache.
#[test]
fn only_refuses_a_bad_pattern_and_fails_when_it_selects_nothing() {
    let script = support::root().join("scripts/gpu-check.sh");
    let out_dir = support::scratch("gpu-check-only");
    let bad = Command::new(&script)
        .args(["--dry-run", "--only", "(unclosed"])
        .env("OUT", &out_dir)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", support::describe(&bad));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not a valid regular expression"),
        "{}",
        support::describe(&bad)
    );
    let none = unprepared(&out_dir)
        .args(["--dry-run", "--only", "no step is named this"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&none.stdout);
    assert_eq!(none.status.code(), Some(1), "{stdout}");
    let summary = summary_of(&stdout);
    let row = |name: &str| {
        summary
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing from:\n{summary}"))
            .to_owned()
    };
    assert!(row("--only no step is named this").contains("matched no step"));
    assert!(row("kernels carried").contains("DRY-RUN"));
    assert!(row("doctor").contains("UNSELECTED"));
    let kept: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        kept.len() == 1 && kept[0].starts_with("summary-only-") && kept[0].ends_with(".txt"),
        "{kept:?}"
    );
}
