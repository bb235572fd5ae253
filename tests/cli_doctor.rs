//! `stragglar doctor` reports the binding, the GPU situation and the settings.

mod support;

use std::path::Path;

use support::*;

fn doctor(env: &[(&str, &str)]) -> (String, String) {
    let mut cmd = clean_command(Path::new(env!("CARGO_BIN_EXE_stragglar")));
    cmd.arg("doctor").envs(env.iter().copied());
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", describe(&out));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn doctor_says_why_nothing_is_bound() {
    let (out, _) = doctor(&[("STRAGGLAR_NCCL_LIB", "/nonexistent/libnccl.so.2")]);
    assert!(out.contains("bound:     no"), "{out}");
    assert!(
        out.contains("STRAGGLAR_NCCL_LIB=/nonexistent/libnccl.so.2 cannot be used"),
        "{out}"
    );
    assert!(
        out.contains("every NCCL call returns ncclSystemError"),
        "{out}"
    );
}

#[test]
fn doctor_reports_the_bound_library_and_settings() {
    let Some(real) = real_nccl() else { return };
    let real = real.to_string_lossy().into_owned();
    let (out, err) = doctor(&[("STRAGGLAR_NCCL_LIB", &real), ("STRAGGLAR_DEBUG", "loud")]);
    assert!(out.contains("bound:     yes"), "{out}");
    assert!(out.contains(&format!("path:      {real}")), "{out}");
    assert!(out.contains("version:   2."), "{out}");
    for setting in [
        "STRAGGLAR_ENABLE",
        "STRAGGLAR_NCCL_LIB",
        "STRAGGLAR_DEBUG",
        "STRAGGLAR_DEBUG_FILE",
    ] {
        assert!(out.contains(setting), "{setting} missing:\n{out}");
    }
    assert!(
        err.contains("STRAGGLAR_DEBUG has an invalid value 'loud'; using the default WARN"),
        "{err}"
    );
}

/// The pip layout: with NVRTC only in `site-packages/nvidia/cuda_nvrtc/lib`, the real NCCL of
/// the same `nvidia` tree bound and nothing on the loader's path, the library still finds NVRTC
/// (beside the loaded NCCL, in its pip tree) and says where at INFO.
#[test]
fn nvrtc_is_found_in_the_pip_tree_of_the_bound_nccl() {
    let Some(real) = real_nccl() else { return };
    let nvrtc_dir = real
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|nvidia| nvidia.join("cuda_nvrtc").join("lib"));
    let Some(nvrtc_dir) = nvrtc_dir.filter(|d| d.join("libnvrtc.so.12").is_file()) else {
        return;
    };
    let real = real.to_string_lossy().into_owned();
    let (out, err) = doctor(&[("STRAGGLAR_NCCL_LIB", &real), ("STRAGGLAR_DEBUG", "INFO")]);
    assert!(out.contains("NVRTC:     12."), "{out}\n{err}");
    assert!(
        err.contains(&format!("NVRTC found at {}", nvrtc_dir.display())),
        "{err}"
    );
}

#[test]
fn logs_go_to_the_debug_file_with_host_and_pid_expanded() {
    let dir = scratch("debug_file");
    let pattern = dir.join("stragglar.%h.%p.log");
    let (_, err) = doctor(&[
        ("STRAGGLAR_DEBUG", "INFO"),
        ("STRAGGLAR_DEBUG_FILE", pattern.to_str().unwrap()),
    ]);
    assert!(
        !err.contains("STRAGGLAR INFO"),
        "INFO lines belong in the file:\n{err}"
    );
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(!name.contains("%h") && !name.contains("%p"), "{name}");
    let log = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        log.contains("STRAGGLAR INFO STRAGGLAR_DEBUG set by environment to INFO"),
        "{log}"
    );
}

#[test]
fn doctor_names_the_test_setting_that_lets_ranks_share_a_gpu() {
    let (out, _) = doctor(&[]);
    assert!(!out.contains("sharing:"), "{out}");
    let (out, _) = doctor(&[("STRAGGLAR_TEST_SHARED_GPU", "1")]);
    assert!(
        out.contains("sharing:   STRAGGLAR_TEST_SHARED_GPU=1, for tests only"),
        "{out}"
    );
    assert!(out.contains("a job's ranks need a GPU each"), "{out}");
}

#[test]
fn doctor_says_plainly_when_there_is_no_gpu() {
    let (out, _) = doctor(&[]);
    let no_driver = !Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1").exists()
        && !Path::new("/usr/lib64/libcuda.so.1").exists()
        && !Path::new("/usr/local/nvidia/lib64/libcuda.so.1").exists();
    if no_driver {
        assert!(out.contains("this machine has no usable GPU"), "{out}");
    }
    assert!(out.contains("verdict:"), "{out}");
    assert!(
        out.contains("per rank of an 8-rank communicator") && out.contains("cap 4096 MiB"),
        "{out}"
    );
}

#[test]
fn unknown_commands_and_arguments_are_usage_errors() {
    let exe = Path::new(env!("CARGO_BIN_EXE_stragglar"));
    let out = run(clean_command(exe).arg("frobnicate"));
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let out = run(clean_command(exe).args(["doctor", "--bogus"]));
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn the_readme_documents_every_setting_with_its_default() {
    let readme = std::fs::read_to_string(support::root().join("README.md")).unwrap();
    for setting in stragglar::config::SETTINGS {
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", setting.name)))
            .unwrap_or_else(|| panic!("README has no row for {}", setting.name));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert!(cells.len() >= 4, "{row}");
        // The default column says what the table declares: the value, or that it is unset.
        let default = cells[2];
        match setting.default.strip_prefix("(unset") {
            Some(_) => assert!(default.starts_with("unset"), "{}: {row}", setting.name),
            None => assert!(
                default.contains(&format!("`{}`", setting.default)),
                "{}: the README's default is not `{}`: {row}",
                setting.name,
                setting.default
            ),
        }
    }
    // No row for a variable the library does not read.
    for row in readme.lines().filter(|l| l.starts_with("| `STRAGGLAR_")) {
        let name = row.split('`').nth(1).unwrap_or_default();
        assert!(
            stragglar::config::SETTINGS.iter().any(|s| s.name == name),
            "README documents {name}, which the library does not read"
        );
    }
}

/// A reader that closes the pipe early (`stragglar help | head -1`) ends the tool quietly:
/// no panic message, and the exit is by SIGPIPE, as for other command-line tools.
#[test]
fn a_closed_output_pipe_ends_the_tool_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let exe = Path::new(env!("CARGO_BIN_EXE_stragglar"));
    // 300 KB of output: more than a pipe holds, so the tool writes into the closed pipe even
    // when it runs before the read end is closed.
    let mut child = clean_command(exe)
        .args(["plan", "--ranks", "64", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{}",
        describe(&out)
    );
}
