//! The real PyTorch CUDA wheel under `LD_PRELOAD=libstragglar.so`: torch imports, finds its own
//! NCCL through us, and `torch.cuda.nccl.unique_id()` goes through our `ncclGetUniqueId`.

mod support;

use std::process::Command;

use support::*;

/// The test venv's Python, which has torch (`STRAGGLAR_TEST_PYTHON`, set by scripts/test.sh).
fn torch_python() -> Option<String> {
    match std::env::var("STRAGGLAR_TEST_PYTHON") {
        Ok(python) => Some(python),
        Err(_) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs scripts/test.sh, which sets STRAGGLAR_TEST_PYTHON"
            );
            eprintln!("STRAGGLAR_TEST_PYTHON unset: skipped (scripts/test.sh sets it)");
            None
        }
    }
}

#[test]
fn torch_runs_under_ld_preload_and_calls_through_us() {
    let Some(python) = torch_python() else { return };
    let script = r#"
import torch, torch.distributed as dist
uid = torch.cuda.nccl.unique_id()
print("unique_id_bytes", len(uid))
print("nccl_available", dist.is_nccl_available())
print("nccl_version", torch.cuda.nccl.version())
"#;
    let mut cmd = Command::new(&python);
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("STRAGGLAR_")) {
        cmd.env_remove(key);
    }
    let out = run(cmd
        .arg("-c")
        .arg(script)
        .env_remove("LD_LIBRARY_PATH")
        .env("LD_PRELOAD", stragglar_so())
        .env("STRAGGLAR_DEBUG", "TRACE"));
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("unique_id_bytes 128"), "{}", describe(&out));
    assert!(stdout.contains("nccl_available True"), "{}", describe(&out));
    assert!(
        log.contains("found by AlreadyLoaded"),
        "torch's own libnccl is bound:\n{log}"
    );
    assert!(
        log.contains("STRAGGLAR TRACE ncclGetUniqueId resolved in"),
        "ncclGetUniqueId did not go through stragglar:\n{log}"
    );
}

#[test]
fn torch_runs_with_stragglar_disabled() {
    let Some(python) = torch_python() else { return };
    let out = run(Command::new(&python)
        .arg("-c")
        .arg("import torch; print(len(torch.cuda.nccl.unique_id()))")
        .env_remove("LD_LIBRARY_PATH")
        .env("LD_PRELOAD", stragglar_so())
        .env("STRAGGLAR_ENABLE", "0"));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("128"),
        "{}",
        describe(&out)
    );
}

/// Observe mode changes nothing PyTorch can do without a GPU: the same outputs, and no new
/// line in the log, with and without it.
#[test]
fn torch_runs_the_same_with_observe_mode_on() {
    let Some(python) = torch_python() else { return };
    let script = r#"
import torch, torch.distributed as dist
print("unique_id_bytes", len(torch.cuda.nccl.unique_id()))
print("nccl_available", dist.is_nccl_available())
print("nccl_version", torch.cuda.nccl.version())
"#;
    let records = support::scratch("torch-observe-records");
    let run_with = |observe: bool| {
        let mut cmd = Command::new(&python);
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("STRAGGLAR_")) {
            cmd.env_remove(key);
        }
        cmd.arg("-c")
            .arg(script)
            .env_remove("LD_LIBRARY_PATH")
            .env("LD_PRELOAD", stragglar_so());
        if observe {
            cmd.env("STRAGGLAR_OBSERVE", "1")
                .env("STRAGGLAR_REPORT_DIR", &records);
        }
        run(&mut cmd)
    };
    let (off, on) = (run_with(false), run_with(true));
    assert!(
        off.status.success() && on.status.success(),
        "{}",
        describe(&on)
    );
    assert_eq!(on.stdout, off.stdout, "{}", describe(&on));
    assert_eq!(on.stderr, off.stderr, "{}", describe(&on));
    // No communicator was made, so no record was written.
    let written = std::fs::read_dir(&records).map_or(0, |d| d.count());
    assert_eq!(written, 0, "records written without a communicator");
}
