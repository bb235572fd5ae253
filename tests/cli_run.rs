//! `stragglar run`: the command runs with our library preloaded ahead of any existing
//! `LD_PRELOAD`, each option sets its `STRAGGLAR_*` variable, bad options and values are
//! refused before anything starts, and under the real PyTorch the library binds NCCL.

mod support;

use std::process::Command;

use support::*;

fn stragglar_run(args: &[&str]) -> Command {
    let mut cmd = clean_command(std::path::Path::new(env!("CARGO_BIN_EXE_stragglar")));
    cmd.arg("run").args(args);
    cmd
}

/// `NAME=value` lines of `env`'s output, as (name, value).
fn environment(stdout: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_command_runs_preloaded_with_the_settings_the_options_name() {
    let lib = stragglar_so().canonicalize().unwrap();
    let out = run(stragglar_run(&[
        "--debug",
        "INFO",
        "--gpu-engine=1",
        "--observe",
        "1",
        "--report-dir",
        "/tmp/records/%h",
        "--",
        "env",
    ])
    .env("LD_PRELOAD", "libc.so.6"));
    assert!(out.status.success(), "{}", describe(&out));
    let env = environment(&out.stdout);
    let get = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} unset: {}", describe(&out)))
    };
    assert_eq!(get("LD_PRELOAD"), format!("{}:libc.so.6", lib.display()));
    assert_eq!(get("STRAGGLAR_DEBUG"), "INFO");
    assert_eq!(get("STRAGGLAR_GPU_ENGINE"), "1");
    assert_eq!(get("STRAGGLAR_OBSERVE"), "1");
    assert_eq!(get("STRAGGLAR_REPORT_DIR"), "/tmp/records/%h");
}

#[test]
fn bad_options_values_and_commands_are_refused_with_a_reason() {
    for (args, status, says) in [
        (
            &["--gpu-engine", "yes", "env"][..],
            2,
            "STRAGGLAR_GPU_ENGINE",
        ),
        (&["--colour", "red", "env"][..], 2, "not a setting"),
        (&["--debug", "INFO"][..], 2, "needs a command"),
        (&["--", "/no/such/program"][..], 127, "/no/such/program"),
    ] {
        let out = run(&mut stragglar_run(args));
        assert_eq!(
            out.status.code(),
            Some(status),
            "{args:?}: {}",
            describe(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{args:?}: {}",
            describe(&out)
        );
    }
}

#[test]
fn doctor_names_the_library_it_preloads() {
    let lib = stragglar_so().canonicalize().unwrap();
    let out =
        run(clean_command(std::path::Path::new(env!("CARGO_BIN_EXE_stragglar"))).arg("doctor"));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("preloads:  {} (stragglar run)", lib.display())),
        "{}",
        describe(&out)
    );
}

#[test]
fn pytorch_started_by_stragglar_run_binds_nccl_through_us() {
    let Ok(python) = std::env::var("STRAGGLAR_TEST_PYTHON") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs scripts/test.sh, which sets STRAGGLAR_TEST_PYTHON"
        );
        eprintln!("STRAGGLAR_TEST_PYTHON unset: skipped (scripts/test.sh sets it)");
        return;
    };
    let out = run(stragglar_run(&[
        "--debug",
        "INFO",
        "--",
        &python,
        "-c",
        "import torch; print(len(torch.cuda.nccl.unique_id()))",
    ])
    .env_remove("LD_PRELOAD"));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("128"),
        "{}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("found by AlreadyLoaded"),
        "the binding line: {}",
        describe(&out)
    );
}

/// Our wheel as `scripts/test.sh` installs it (`pip install .` into the test venv): the
/// package finds its library and headers, and its `stragglar run` preloads the installed
/// library under the real PyTorch.
#[test]
fn the_installed_wheel_runs_pytorch_with_its_own_library() {
    let (Ok(bin), Ok(python)) = (
        std::env::var("STRAGGLAR_TEST_WHEEL_BIN"),
        std::env::var("STRAGGLAR_TEST_PYTHON"),
    ) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs scripts/test.sh, which installs the wheel"
        );
        eprintln!("STRAGGLAR_TEST_WHEEL_BIN unset: skipped (scripts/test.sh sets it)");
        return;
    };
    let script = "import os, stragglar\n\
                  print(stragglar.library_path())\n\
                  print(os.path.isfile(os.path.join(stragglar.include_path(), 'nccl.h')))\n\
                  print(stragglar.cli_path())";
    let out = run(Command::new(&python).args(["-c", script]));
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let library = lines.next().unwrap_or_default().to_string();
    assert!(
        library.contains("site-packages/stragglar/libstragglar"),
        "{stdout}"
    );
    assert_eq!(lines.next(), Some("True"), "the headers: {stdout}");
    assert_eq!(lines.next(), Some(bin.as_str()), "the CLI: {stdout}");
    let bin = std::path::Path::new(&bin);
    let doctor = run(clean_command(bin).arg("doctor"));
    assert!(
        String::from_utf8_lossy(&doctor.stdout).contains(&format!("preloads:  {library}")),
        "{}",
        describe(&doctor)
    );
    let mut cmd = clean_command(bin);
    cmd.args(["run", "--debug", "INFO", "--", &python, "-c"])
        .arg("import torch; print(len(torch.cuda.nccl.unique_id()))")
        .env_remove("LD_PRELOAD");
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("found by AlreadyLoaded"),
        "{}",
        describe(&out)
    );
}
