//! `stragglar doctor`'s multicast line, and its check that a multicast team of every GPU forms
//! through the engine's protocol: one thread per GPU (`--multicast`) or one process per GPU
//! (`--multicast-processes`, the fd passed between processes as between a job's ranks).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED;

use crate::engine::cuda::driver::Device;
use crate::engine::cuda::multicast::local::{rank_of_process_team, team_of_local_gpus};
use crate::engine::cuda::multicast::slots;

/// The hidden subcommand one rank of a process team runs: `__multicast-rank DIR RANK RANKS
/// SOCKET`; it prints `formed BYTES` or `declined CAUSE`.
pub const WORKER_COMMAND: &str = "__multicast-rank";

/// Bytes each GPU binds in a check (rounded up to the granularity).
const CHECK_BYTES: usize = 1;

/// How a team is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trial {
    /// Only say whether GPU 0 has multicast.
    No,
    Threads,
    Processes,
}

/// Whether the engine would use multicast, and how many of its multicast objects this host
/// holds, as the doctor's line ends.
fn engine_use() -> String {
    let config = crate::config::get();
    let cap = config.multicast_objects;
    let held = slots::in_use(&slots::host_dir(), cap);
    let apart = slots::test_dir().map_or(String::new(), |dir| {
        format!(
            ", counted in {} (STRAGGLAR_TEST_MULTICAST_SLOTS, for tests only: apart from the host's jobs)",
            dir.display()
        )
    });
    let objects = format!("the engine's multicast objects on this host: {held} of {cap} in use (STRAGGLAR_MULTICAST_OBJECTS){apart}");
    if config.multicast.on() {
        format!("STRAGGLAR_MULTICAST on: the GPU engine forms a team per communicator and may finish StragglAR by one multicast; experimental, not yet run on an NVSwitch server; {objects}")
    } else {
        format!("the GPU engine uses it only with STRAGGLAR_MULTICAST=1 or always, off until it has run on an NVSwitch server; {objects}")
    }
}

/// The doctor's multicast line for a machine with `gpus` GPUs.
pub fn multicast_line(gpus: usize, trial: Trial) -> String {
    let has = Device::open(0)
        .and_then(|d| d.attribute(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED))
        .is_ok_and(|v| v == 1);
    let outcome = match trial {
        Trial::No => {
            return match has {
                false => "GPU 0 has none (it needs an NVSwitch system, Hopper or later)".into(),
                true => format!(
                    "GPU 0 has it; `stragglar doctor --multicast` forms a team of the {gpus} GPU(s) ({})",
                    engine_use()
                ),
            }
        }
        Trial::Threads => team_of_local_gpus(gpus, CHECK_BYTES).map(|f| {
            format!(
                "a team of {} GPU(s), one thread each, formed in {} ms: {} MiB per GPU",
                f.gpus,
                f.millis,
                f.bytes >> 20
            )
        }),
        Trial::Processes => team_of_processes(gpus),
    };
    match outcome {
        Ok(formed) => {
            format!(
                "{formed} bound and mapped, then given up ({})",
                engine_use()
            )
        }
        Err(why) => format!("no team of the {gpus} GPU(s): {why}"),
    }
}

/// Starts one process per GPU and gathers their outcomes, which must agree.
fn team_of_processes(gpus: usize) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let id = format!("{}-{}", std::process::id(), crate::clock::now_ns());
    let dir = std::env::temp_dir().join(format!("stragglar-multicast-{id}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let socket = format!("stragglar-doctor-{id}");
    let start = std::time::Instant::now();
    let mut children = Vec::with_capacity(gpus);
    let mut spawned = Ok(());
    for rank in 0..gpus {
        match Command::new(&exe)
            .arg(WORKER_COMMAND)
            .arg(&dir)
            .args([rank.to_string(), gpus.to_string(), socket.clone()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(child) => children.push(child),
            Err(e) => {
                // The ranks started would wait for this one: end them.
                for child in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                spawned = Err(e);
                break;
            }
        }
    }
    let spawned = spawned.map(|()| children);
    let outcomes: Result<Vec<String>, String> = match spawned {
        Ok(children) => Ok(children
            .into_iter()
            .map(|mut child| {
                let line = child
                    .stdout
                    .take()
                    .and_then(|out| BufReader::new(out).lines().next().and_then(Result::ok));
                let _ = child.wait();
                line.unwrap_or_else(|| "declined: the process printed nothing".into())
            })
            .collect()),
        Err(e) => Err(format!("cannot start the ranks' processes: {e}")),
    };
    let _ = std::fs::remove_dir_all(&dir);
    let outcomes = outcomes?;
    let millis = start.elapsed().as_millis();
    if outcomes.iter().any(|o| o != &outcomes[0]) {
        return Err(format!("the ranks disagree: {outcomes:?}"));
    }
    match outcomes[0].strip_prefix("formed ") {
        Some(bytes) => {
            let bytes: usize = bytes.parse().map_err(|_| outcomes[0].clone())?;
            Ok(format!(
                "a team of {gpus} GPU(s), one process each, formed in {millis} ms: {} MiB per GPU",
                bytes >> 20
            ))
        }
        None => Err(outcomes[0]
            .strip_prefix("declined: ")
            .unwrap_or(&outcomes[0])
            .to_string()),
    }
}

/// The main of [`WORKER_COMMAND`]; exit status 0 once it printed its outcome.
pub fn worker_main(argv: Vec<String>) -> i32 {
    let [dir, rank, ranks, socket] = argv.as_slice() else {
        eprintln!("{WORKER_COMMAND}: expected DIR RANK RANKS SOCKET");
        return 2;
    };
    let (Ok(rank), Ok(ranks)) = (rank.parse::<usize>(), ranks.parse::<usize>()) else {
        eprintln!("{WORKER_COMMAND}: RANK and RANKS are numbers");
        return 2;
    };
    match rank_of_process_team(std::path::Path::new(dir), rank, ranks, CHECK_BYTES, socket) {
        Ok(bytes) => println!("formed {bytes}"),
        Err(why) => println!("declined: {why}"),
    }
    0
}
