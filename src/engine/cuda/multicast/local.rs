//! A multicast team of the GPUs this machine has, formed through the same protocol a
//! communicator's ranks run, one GPU per thread of this process or per process
//! (`stragglar doctor --multicast`, `--multicast-processes`): whether this machine can give the
//! engine multicast at all, and what declines it.

use std::path::Path;
use std::time::{Duration, Instant};

use super::team::{decline, form, Declined, TeamRequest};
use crate::engine::cuda::driver::Device;
use crate::engine::cuda::exchange::{DirExchange, ThreadExchange};
use crate::engine::cuda::gpus::{self, Loaded};
use std::sync::Arc;

/// GPU `ordinal` and our kernels on it (opened and loaded once per process).
fn gpu(ordinal: usize) -> Result<(Arc<Device>, Arc<Loaded>), String> {
    let ordinal = ordinal as i32;
    let device = gpus::device(ordinal, |_| {}).map_err(|e| format!("GPU {ordinal}: {e}"))?;
    let loaded = gpus::kernels(ordinal, &device, |_| {})
        .map_err(|e| format!("GPU {ordinal}: our kernels: {e}"))?;
    Ok((device, loaded))
}

/// How long a check's ranks wait for each other's connections.
const CHECK_DEADLINE: Duration = Duration::from_secs(30);

/// A team that was formed, and undone again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Formed {
    /// GPUs in the team.
    pub gpus: usize,
    /// Bytes bound and mapped per GPU.
    pub bytes: usize,
    /// From the first probe to the last map, milliseconds.
    pub millis: u128,
}

/// Forms a team of the `gpus` first GPUs with `bytes` each (rounded up to the granularity),
/// gives it up, and says how it went: `Err` with the cause every rank agreed on, or with why a
/// GPU could not even be opened.
pub fn team_of_local_gpus(gpus: usize, bytes: usize) -> Result<Formed, String> {
    let devices = (0..gpus).map(gpu).collect::<Result<Vec<_>, _>>()?;
    let socket = format!(
        "stragglar-doctor-{}-{}",
        std::process::id(),
        crate::clock::now_ns()
    );
    let start = Instant::now();
    let deadline = start + CHECK_DEADLINE;
    let outcomes: Vec<Result<usize, Declined>> = std::thread::scope(|scope| {
        let threads: Vec<_> = ThreadExchange::group(gpus)
            .into_iter()
            .zip(&devices)
            .enumerate()
            .map(|(rank, (mut exchange, (device, loaded)))| {
                let socket = socket.as_str();
                scope.spawn(move || {
                    let request = TeamRequest {
                        rank,
                        ranks: gpus,
                        bytes,
                        socket,
                        deadline,
                        probe: &loaded.kernels.multicast_probe,
                        counted: false,
                    };
                    form(&mut exchange, device, &request).map(|team| team.bytes)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(Declined::Exchange("a rank's thread panicked".into())))
            })
            .collect()
    });
    let millis = start.elapsed().as_millis();
    match outcomes.first() {
        Some(Ok(bytes)) if outcomes.iter().all(|o| o.as_ref() == Ok(bytes)) => Ok(Formed {
            gpus,
            bytes: *bytes,
            millis,
        }),
        Some(Err(declined)) if outcomes.iter().all(|o| o.as_ref().err() == Some(declined)) => {
            Err(declined.to_string())
        }
        _ => Err(format!("the ranks disagree: {outcomes:?}")),
    }
}

/// Rank `rank` of a team of `ranks` processes on GPU `rank`, gathering through files in `dir`:
/// the bytes bound per GPU, or the cause every rank agreed on.
pub fn rank_of_process_team(
    dir: &Path,
    rank: usize,
    ranks: usize,
    bytes: usize,
    socket: &str,
) -> Result<usize, String> {
    let mut exchange = DirExchange::new(dir, rank, ranks);
    let (device, loaded) = match gpu(rank) {
        Ok(found) => found,
        Err(why) => {
            log::warn!("rank {rank}: multicast: {why}");
            return Err(decline(&mut exchange).to_string());
        }
    };
    let request = TeamRequest {
        rank,
        ranks,
        bytes,
        socket,
        deadline: Instant::now() + CHECK_DEADLINE,
        probe: &loaded.kernels.multicast_probe,
        counted: false,
    };
    form(&mut exchange, &device, &request)
        .map(|team| team.bytes)
        .map_err(|declined| declined.to_string())
}
