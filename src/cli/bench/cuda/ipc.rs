//! Ranks as processes on one GPU: each worker allocates its staging, publishes the CUDA IPC
//! handle in a rendezvous directory (written to a temporary name, then renamed, so readers
//! never see half a handle), opens every peer's handle once, and runs the sweep for its own
//! rank, printing one `outcome` line per size for the parent to combine.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::local::{run_size, Local, Outcome};
use super::{open_gpu, Setup};
use crate::cli::args::Args;
use crate::cli::bench::options::BenchOptions;
use crate::engine::cuda::driver::{IpcMapping, Stream};
use crate::engine::cuda::rank::CudaRank;

/// The hidden subcommand a worker runs: `__bench-cuda-worker DIR RANK OPTIONS...`.
pub const WORKER_COMMAND: &str = "__bench-cuda-worker";

/// How long a worker waits for its peers' handles.
const RENDEZVOUS: Duration = Duration::from_secs(120);

fn handle_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}.handle"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 64]> {
    let text = text.trim();
    if text.len() != 128 {
        return None;
    }
    let mut out = [0u8; 64];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Starts one worker per rank; their stdout is piped.
pub fn spawn(options: &BenchOptions, dir: &Path) -> std::io::Result<Vec<Child>> {
    let exe = std::env::current_exe()?;
    (0..options.ranks)
        .map(|rank| {
            Command::new(&exe)
                .arg(WORKER_COMMAND)
                .arg(dir)
                .arg(rank.to_string())
                .args(options.to_args())
                .stdout(Stdio::piped())
                .stdin(Stdio::null())
                .spawn()
        })
        .collect()
}

/// Parses a worker's `outcome COMBO SIZE T0 T1 W0 W1 D0 D1` line.
pub fn parse_outcome(line: &str) -> Option<(usize, usize, Outcome)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 9 || f[0] != "outcome" {
        return None;
    }
    Some((
        f[1].parse().ok()?,
        f[2].parse().ok()?,
        Outcome {
            time_us: [f[3].parse().ok()?, f[4].parse().ok()?],
            wrong: [f[5].parse().ok()?, f[6].parse().ok()?],
            digest: [f[7].parse().ok()?, f[8].parse().ok()?],
        },
    ))
}

/// The worker's main; exit status 0 when its rank ran every size.
pub fn worker_main(argv: Vec<String>) -> i32 {
    let mut it = argv.into_iter();
    let (Some(dir), Some(rank)) = (it.next(), it.next().and_then(|r| r.parse::<usize>().ok()))
    else {
        eprintln!("{WORKER_COMMAND}: expected DIR RANK OPTIONS");
        return 2;
    };
    let options = match BenchOptions::parse(Args::new(it)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{WORKER_COMMAND}: {e}");
            return 2;
        }
    };
    match work(&options, Path::new(&dir), rank) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("stragglar bench --backend cuda: rank {rank}: {e}");
            1
        }
    }
}

fn work(options: &BenchOptions, dir: &Path, rank: usize) -> Result<(), Box<dyn std::error::Error>> {
    let gpu = open_gpu()?;
    let sms = gpu.device.sm_count()? as u32;
    let mut setup = Setup::new(options, sms)?;
    let comm = CudaRank::new(
        &gpu.device,
        &gpu.all_reduce,
        setup.rank_config(options, rank),
    )?;
    let own = handle_path(dir, rank);
    let temporary = dir.join(format!(".rank-{rank}.tmp"));
    std::fs::write(&temporary, hex(&comm.staging().ipc_handle()?))?;
    std::fs::rename(&temporary, &own)?;
    let deadline = Instant::now() + RENDEZVOUS;
    let mut mappings = Vec::new();
    let mut peers = Vec::new();
    for peer in 0..options.ranks {
        if peer == rank {
            peers.push(comm.own_peer());
            continue;
        }
        let handle = loop {
            if let Some(h) = std::fs::read_to_string(handle_path(dir, peer))
                .ok()
                .and_then(|t| unhex(&t))
            {
                break h;
            }
            if Instant::now() > deadline {
                return Err(format!("rank {peer} never published its handle").into());
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let mapping = IpcMapping::open(&gpu.device, &handle)?;
        peers.push(setup.layout.peer(mapping.ptr));
        mappings.push(mapping);
    }
    let mut locals = [Local {
        rank,
        comm,
        stream: Stream::new(&gpu.device)?,
    }];
    locals[0].comm.connect(&peers)?;
    let stdout = std::io::stdout();
    let mut seed = 0;
    for (combo, &(dtype, op)) in setup.combos.clone().iter().enumerate() {
        for (size, &bytes) in setup.sizes.clone().iter().enumerate() {
            seed += 1;
            let plan = setup.plan(dtype, bytes)?;
            let o = match run_size(options, &gpu, &mut locals, &plan, op, seed) {
                Ok(o) => o[0],
                Err(e) => {
                    // Peers waiting on this rank give up instead of hanging.
                    locals[0].comm.abort();
                    return Err(e);
                }
            };
            let mut out = stdout.lock();
            writeln!(
                out,
                "outcome {combo} {size} {} {} {} {} {} {}",
                o.time_us[0], o.time_us[1], o.wrong[0], o.wrong[1], o.digest[0], o.digest[1]
            )?;
            out.flush()?;
        }
    }
    // Every peer must be done reading this rank's staging before it goes: the last call's
    // kernels of all ranks have finished once every rank has synchronised its stream, which
    // each does before printing; wait for the peers' "done" files.
    std::fs::write(dir.join(format!("rank-{rank}.done")), b"")?;
    let deadline = Instant::now() + RENDEZVOUS;
    for peer in 0..options.ranks {
        while !dir.join(format!("rank-{peer}.done")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    drop(mappings);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_and_outcomes_round_trip() {
        let handle: [u8; 64] = std::array::from_fn(|i| (i * 37) as u8);
        assert_eq!(unhex(&hex(&handle)), Some(handle));
        assert_eq!(unhex("abc"), None);
        let line = "outcome 2 5 10.5 11 0 3 17 18";
        let (combo, size, o) = parse_outcome(line).unwrap();
        assert_eq!((combo, size), (2, 5));
        assert_eq!(o.time_us, [10.5, 11.0]);
        assert_eq!(o.wrong, [0, 3]);
        assert_eq!(o.digest, [17, 18]);
        assert!(parse_outcome("size 1 2").is_none());
    }
}
