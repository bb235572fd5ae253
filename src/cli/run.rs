//! `stragglar run [OPTIONS] [--] CMD ARGS...`: runs `CMD` with our library preloaded (ahead of
//! any `LD_PRELOAD` already set), the documented way to start `torchrun` or `python` jobs.
//!
//! One rule maps options to settings: `--NAME VALUE` (or `--NAME=VALUE`) sets
//! `STRAGGLAR_NAME` (upper case, `-` as `_`), for every variable of `config::SETTINGS`; a value
//! the library would refuse is refused here, before the job starts.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use super::args::UsageError;
use crate::config::{Config, Notice, SETTINGS};

pub const USAGE: &str = "
stragglar run [--NAME VALUE ...] [--] CMD [ARGS...]
    runs CMD with libstragglar.so preloaded (kept ahead of an existing LD_PRELOAD);
    --NAME VALUE sets STRAGGLAR_NAME=VALUE, e.g. --gpu-engine 1, --debug INFO, --buffer-bytes 64M
    (every variable 'stragglar doctor' lists); the library is found next to this executable,
    or in the Python environment it was installed into (pip install)
";

/// The file name of our library.
const LIBRARY: &str = "libstragglar.so";

/// The library `stragglar run` preloads: beside this executable (a build's `target/<profile>/`),
/// in `../lib` from it (an installation's `bin/`), or in the `stragglar` package of the Python
/// environment whose `bin/` holds it (`pip install`: `libstragglar*.so` under
/// `../lib/python3*/site-packages/stragglar/`). `None` when none holds one.
pub fn library_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?.canonicalize().ok()?;
    let dir = exe.parent()?;
    [dir.join(LIBRARY), dir.join("../lib").join(LIBRARY)]
        .into_iter()
        .find(|p| p.is_file())
        .or_else(|| in_python_package(&dir.join("../lib")))
        .and_then(|p| p.canonicalize().ok())
}

/// `libstragglar*.so` in `lib/python3*/site-packages/stragglar/`, where a wheel installs it.
fn in_python_package(lib: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages").join("stragglar"))
        .filter_map(|package| std::fs::read_dir(package).ok())
        .flat_map(|entries| entries.flatten().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("libstragglar") && n.ends_with(".so"))
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

/// The variable an option names (`gpu-engine` -> `STRAGGLAR_GPU_ENGINE`), if it is a setting.
fn setting_of(option: &str) -> Option<&'static str> {
    let name = format!(
        "STRAGGLAR_{}",
        option.to_ascii_uppercase().replace('-', "_")
    );
    SETTINGS.iter().map(|s| s.name).find(|&n| n == name)
}

/// The option that sets `variable` (`STRAGGLAR_GPU_ENGINE` -> `--gpu-engine`).
fn option_of(variable: &str) -> String {
    let name = variable.trim_start_matches("STRAGGLAR_");
    format!("--{}", name.to_ascii_lowercase().replace('_', "-"))
}

/// Refuses `value` for `variable` where the library would ignore it.
fn check_value(variable: &'static str, value: &str) -> Result<(), UsageError> {
    let (_, notices) = Config::from_lookup(|name| (name == variable).then(|| value.to_string()));
    match notices.first() {
        Some(Notice::Invalid { default, .. }) => {
            let meaning = SETTINGS
                .iter()
                .find(|s| s.name == variable)
                .map_or("", |s| s.meaning);
            Err(UsageError(format!(
                "{} {value}: not a value of {variable} ({meaning}; default {default})",
                option_of(variable)
            )))
        }
        _ => Ok(()),
    }
}

/// What `stragglar run` was asked: the settings, in order, and the command.
#[derive(Debug, PartialEq)]
struct Request {
    settings: Vec<(&'static str, String)>,
    command: Vec<String>,
}

fn parse(argv: Vec<String>) -> Result<Request, UsageError> {
    let mut settings = Vec::new();
    let mut it = argv.into_iter().peekable();
    while let Some(arg) = it.peek().cloned() {
        if arg == "--" {
            it.next();
            break;
        }
        let Some(option) = arg.strip_prefix("--") else {
            break;
        };
        it.next();
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name.to_string(), value.to_string()),
            None => {
                let value = it
                    .next()
                    .ok_or_else(|| UsageError(format!("--{option} needs a value")))?;
                (option.to_string(), value)
            }
        };
        let variable = setting_of(&name).ok_or_else(|| {
            let known: Vec<String> = SETTINGS.iter().map(|s| option_of(s.name)).collect();
            UsageError(format!(
                "--{name} is not a setting; the options are {}",
                known.join(", ")
            ))
        })?;
        check_value(variable, &value)?;
        settings.push((variable, value));
    }
    let command: Vec<String> = it.collect();
    if command.is_empty() {
        return Err(UsageError(
            "stragglar run needs a command to run (stragglar run [--NAME VALUE ...] [--] CMD [ARGS...])"
                .into(),
        ));
    }
    Ok(Request { settings, command })
}

/// `library` ahead of the entries of an existing `LD_PRELOAD` (space or colon separated), once.
fn preload_list(library: &Path, existing: Option<&str>) -> String {
    let ours = library.display().to_string();
    let mut entries = vec![ours.clone()];
    entries.extend(
        existing
            .unwrap_or("")
            .split([':', ' '])
            .filter(|e| !e.is_empty() && *e != ours)
            .map(String::from),
    );
    entries.join(":")
}

/// Runs the subcommand: replaces this process with the command, or says why it cannot.
pub fn run(argv: Vec<String>) -> Result<i32, UsageError> {
    let request = parse(argv)?;
    let library = library_path().ok_or_else(|| {
        UsageError(format!(
            "no {LIBRARY} next to this executable or in ../lib from it (build it with cargo build --release)"
        ))
    })?;
    let preload = preload_list(&library, std::env::var("LD_PRELOAD").ok().as_deref());
    let mut command = std::process::Command::new(&request.command[0]);
    command
        .args(&request.command[1..])
        .env("LD_PRELOAD", preload);
    for (variable, value) in &request.settings {
        command.env(variable, value);
    }
    // Only returns when the command could not be started.
    let error = command.exec();
    eprintln!("stragglar run: {}: {error}", request.command[0]);
    Ok(if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_map_to_settings_by_one_rule() {
        let r = parse(strings(&[
            "--gpu-engine",
            "1",
            "--debug=INFO",
            "--",
            "python",
            "--gpu-engine",
        ]))
        .unwrap();
        assert_eq!(
            r.settings,
            vec![
                ("STRAGGLAR_GPU_ENGINE", "1".to_string()),
                ("STRAGGLAR_DEBUG", "INFO".to_string())
            ]
        );
        assert_eq!(r.command, strings(&["python", "--gpu-engine"]));
        let r = parse(strings(&["--buffer-bytes", "64M", "torchrun", "x.py"])).unwrap();
        assert_eq!(r.command, strings(&["torchrun", "x.py"]));
        for setting in SETTINGS {
            assert_eq!(
                setting_of(&option_of(setting.name)[2..]),
                Some(setting.name)
            );
        }
    }

    #[test]
    fn bad_options_and_values_are_refused() {
        let err = |items: &[&str]| parse(strings(items)).unwrap_err().0;
        assert!(err(&["--nope", "1", "x"]).contains("--gpu-engine"));
        assert!(err(&["--gpu-engine", "2", "x"]).contains("STRAGGLAR_GPU_ENGINE"));
        assert!(err(&["--buffer-bytes", "lots", "x"]).contains("STRAGGLAR_BUFFER_BYTES"));
        assert!(err(&["--debug"]).contains("needs a value"));
        assert!(err(&["--debug", "INFO"]).contains("needs a command"));
        assert!(err(&[]).contains("needs a command"));
    }

    #[test]
    fn our_library_goes_first_and_once() {
        let lib = Path::new("/x/libstragglar.so");
        assert_eq!(preload_list(lib, None), "/x/libstragglar.so");
        assert_eq!(
            preload_list(lib, Some("/a.so /x/libstragglar.so:/b.so")),
            "/x/libstragglar.so:/a.so:/b.so"
        );
    }
}
