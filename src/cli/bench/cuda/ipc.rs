//! Ranks as processes on one GPU: each worker assembles its engine as the library does
//! (`engine::cuda::assemble`: the records all-gathered, the verdict, every peer's staging
//! opened through CUDA IPC and probed, the agreement through host memory), with a rendezvous
//! directory standing in for NCCL's AllGather (files written to a temporary name,
//! then renamed, so readers never see half of one). Then it runs the sweep for its own rank,
//! printing one line per size for the parent to combine (the host backend's worker line,
//! `report::RankSize::worker_line`).

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::local::{run_size, Choices, Local};
use super::{open_gpu, Setup};
use crate::cli::args::Args;
use crate::cli::bench::options::BenchOptions;
use crate::engine::cuda::assemble::assemble;
use crate::engine::cuda::driver::Stream;
use crate::engine::cuda::exchange::{DirExchange, DIR_RENDEZVOUS};
use crate::engine::cuda::peers::IpcAccess;

/// The hidden subcommand a worker runs: `__bench-cuda-worker DIR RANK OPTIONS...`.
pub const WORKER_COMMAND: &str = "__bench-cuda-worker";

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
    let setup = Setup::new(options, sms)?;
    let mut exchange = DirExchange::new(dir, rank, options.ranks);
    let mut access = IpcAccess {
        device: &gpu.device,
        layout: setup.layout,
        rank,
    };
    let assembly = setup.assembly(options, &gpu, rank);
    let comm =
        assemble(assembly, &mut exchange, &mut access, |_| {}).map_err(super::setup_failure)?;
    let mut locals = [Local {
        rank,
        comm,
        stream: Stream::new(&gpu.device)?,
        calls: 0,
        choices: Choices::default(),
    }];
    let stdout = std::io::stdout();
    let mut seed = 0;
    for &(dtype, op) in &setup.combos.clone() {
        for &bytes in &setup.sizes.clone() {
            seed += 1;
            let count = bytes as usize / dtype.size();
            let o = match run_size(
                options,
                &gpu,
                &mut locals,
                count,
                dtype,
                op,
                setup.auto,
                seed,
            ) {
                Ok(o) => o[0],
                Err(e) => {
                    // Peers waiting on this rank give up instead of hanging.
                    locals[0].comm.give_up();
                    return Err(e);
                }
            };
            let mut out = stdout.lock();
            let bytes = (count * dtype.size()) as u64;
            writeln!(out, "{}", o.for_report(bytes, dtype, op).worker_line())?;
            out.flush()?;
        }
    }
    // Every peer must be done reading this rank's staging before it goes: the last call's
    // kernels of all ranks have finished once every rank has synchronised its stream, which
    // each does before printing; wait for the peers' "done" files.
    std::fs::write(dir.join(format!("rank-{rank}.done")), b"")?;
    let deadline = Instant::now() + DIR_RENDEZVOUS;
    for peer in 0..options.ranks {
        while !dir.join(format!("rank-{peer}.done")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    // Then each closes its mappings of the peers' staging and says so; its own is freed once
    // every peer has closed theirs (freeing exported memory a peer still maps is undefined
    // behaviour).
    locals[0].comm.release_peers();
    locals[0].comm.wait_released_by_every_peer(deadline);
    drop(locals);
    Ok(())
}
