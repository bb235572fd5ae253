//! Ranks as processes on one GPU: each worker assembles its engine as the library does
//! (`engine::cuda::assemble`: the records all-gathered, the verdict, every peer's staging
//! opened through CUDA IPC and probed, the second all-gather), with a rendezvous directory
//! standing in for NCCL's AllGather (files written to a temporary name,
//! then renamed, so readers never see half of one). Then it runs the sweep for its own rank,
//! printing one line per size for the parent to combine (the host backend's worker line,
//! `report::RankSize::worker_line`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::local::{run_size, Choices, Local};
use super::{open_gpu, Setup};
use crate::cli::args::Args;
use crate::cli::bench::options::BenchOptions;
use crate::engine::cuda::assemble::assemble;
use crate::engine::cuda::driver::Stream;
use crate::engine::cuda::peers::IpcAccess;
use crate::engine::cuda::setup::Exchange;

/// The hidden subcommand a worker runs: `__bench-cuda-worker DIR RANK OPTIONS...`.
pub const WORKER_COMMAND: &str = "__bench-cuda-worker";

/// How long a worker waits for its peers' handles.
const RENDEZVOUS: Duration = Duration::from_secs(120);

/// An all-gather through files in a directory shared by the ranks' processes.
struct DirExchange<'a> {
    dir: &'a Path,
    rank: usize,
    ranks: usize,
    round: usize,
}

impl DirExchange<'_> {
    fn path(&self, rank: usize) -> PathBuf {
        self.dir.join(format!("round-{}-rank-{rank}", self.round))
    }
}

impl Exchange for DirExchange<'_> {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        let temporary = self
            .dir
            .join(format!(".round-{}-rank-{}", self.round, self.rank));
        std::fs::write(&temporary, mine)
            .and_then(|()| std::fs::rename(&temporary, self.path(self.rank)))
            .map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let deadline = Instant::now() + RENDEZVOUS;
        let mut all = Vec::with_capacity(mine.len() * self.ranks);
        for rank in 0..self.ranks {
            loop {
                if let Ok(bytes) = std::fs::read(self.path(rank)) {
                    all.extend_from_slice(&bytes);
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("rank {rank} never joined round {}", self.round));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        self.round += 1;
        Ok(all)
    }
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
    let mut exchange = DirExchange {
        dir,
        rank,
        ranks: options.ranks,
        round: 0,
    };
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
    let deadline = Instant::now() + RENDEZVOUS;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_exchange_gathers_in_rank_order() {
        let dir = std::env::temp_dir().join(format!("stragglar-dirx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let results: Vec<Vec<u8>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let dir = &dir;
                    scope.spawn(move || {
                        let mut x = DirExchange {
                            dir,
                            rank,
                            ranks: 3,
                            round: 0,
                        };
                        let first = x.all_gather(&[rank as u8; 2]).unwrap();
                        let second = x.all_gather(&[10 + rank as u8]).unwrap();
                        [first, second].concat()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let _ = std::fs::remove_dir_all(&dir);
        for r in results {
            assert_eq!(r, vec![0, 0, 1, 1, 2, 2, 10, 11, 12]);
        }
    }
}
