//! The one assembly of a rank's GPU engine ([`CudaComm`]), for a job's communicator and for
//! the bench's ranks alike: this rank's staging and record, the setup protocol through the
//! caller's exchange and peer access, the checks that must pass before any kernel runs
//! (tickets' atomics, the peer table, the ordering events), and the engine. What differs
//! between callers comes in [`Assembly`].

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use super::branch::Branch;
use super::comm::{Baseline, CommParts, CudaComm, OrderingEvents};
use super::driver::{Device, Kernels, PeerMapping};
use super::grid::THREADS;
use super::multicast::region::{self, form_region, Region};
use super::nvls::nccl_would_run_nvls;
use super::peers::{connect, tickets_are_atomic};
use super::rank::{Control, CudaRank, RankConfig};
use super::setup::{
    run_setup, settings_of, Devices, Exchange, Identity, LocalFailure, PeerAccess, SetupError,
    SetupRecord, Verdict,
};
use super::sizing::with_setup_facts;
use super::staging::StagingLayout;
use crate::detect::policy::Policy;
use crate::detect::MulticastMode;
use crate::plan::PlanCache;
use crate::schedule::model::Multicast;

/// What one rank's engine is assembled from.
pub struct Assembly<'a> {
    pub device: &'a Arc<Device>,
    /// Our kernels on the device, or why this rank cannot run them: it still joins the setup,
    /// with a failed record, so that its peers never wait for it and every rank declines alike.
    pub kernels: Result<&'a Arc<Kernels>, LocalFailure>,
    pub rank: usize,
    pub ranks: usize,
    /// The staging every rank allocates (`super::sizing::layout`) and the plans lowered while
    /// sizing it; `layout.blocks` is the grid.
    pub layout: StagingLayout,
    pub plans: PlanCache,
    pub policy: Policy,
    /// The largest message the staging takes, in bytes.
    pub max_bytes: usize,
    /// The largest message its arenas hold from the start (`CommParts::staged_bytes`).
    pub staged_bytes: usize,
    /// Per-wait deadline of the kernels; `None` waits until aborted, as NCCL does.
    pub timeout: Option<Duration>,
    /// Remote reads keep their source's send order.
    pub ordered_reads: bool,
    /// Whether ranks may share a GPU (the bench) or need one each (a job).
    pub devices: Devices,
    /// What runs a call the policy keeps off StragglAR. With NCCL, the setup's records also
    /// tell the policy whether NCCL would run NVLS.
    pub baseline: Baseline,
    /// How log lines name the communicator.
    pub label: String,
    /// Where the engine publishes its designation (the rank, or -1).
    pub designated: Arc<AtomicI64>,
    /// Whether to form a multicast region once the setup passed, and how StragglAR's calls
    /// then finish (`STRAGGLAR_MULTICAST`, one of the settings every rank agrees on, so every
    /// rank tries alike).
    pub multicast: MulticastMode,
}

/// Assembles this rank's engine: `Ok` when every rank of the communicator is eligible, else
/// the verdict (the same on every rank) or the exchange's failure. Every rank takes both of
/// the setup's steps whatever fails locally (a panic included), so no peer waits for a rank
/// that gave up. `on_control` gets the rank's abort and status words as soon as its
/// staging exists (an abort during the setup must reach them).
pub fn assemble<X: Exchange, A: PeerAccess<Mapping = PeerMapping>>(
    assembly: Assembly,
    exchange: &mut X,
    access: &mut A,
    on_control: impl FnOnce(Control),
) -> Result<CudaComm, SetupError> {
    let config = RankConfig {
        rank: assembly.rank,
        ranks: assembly.ranks,
        layout: assembly.layout,
        blocks: assembly.layout.blocks as u32,
        threads: THREADS,
        timeout: assembly.timeout,
        ordered_reads: assembly.ordered_reads,
    };
    let failed = |why| SetupRecord::failed(assembly.rank, assembly.ranks, why);
    // A panic in the local steps must not make this rank skip the collectives its peers run.
    let local = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        local_part(&assembly, config)
    }));
    let (mut rank, record) = local.unwrap_or_else(|_| {
        log::warn!(
            "{}: a panic while preparing this rank: it joins the setup as failed",
            assembly.label
        );
        let why = LocalFailure::NoMemory;
        (Err(why), failed(why))
    });
    if let Ok(r) = &rank {
        on_control(r.control());
        access.share(r.staging());
    }
    let device = assembly.device;
    let mut ordering = None;
    let finish = |mappings: &[Option<PeerMapping>], records: &[SetupRecord]| {
        let Ok(r) = &mut rank else {
            return false;
        };
        ordering = (tickets_are_atomic(device, records) && connect(r, mappings, records))
            .then(|| OrderingEvents::new(device).ok())
            .flatten();
        ordering.is_some()
    };
    let joined = run_setup(exchange, access, &record, assembly.devices, finish);
    // Every peer that could open this rank's failure word has: each opens every page before
    // it settles its own word of the agreement, which this rank has seen settled (or settled
    // as timed out, and a peer that then finds the page gone refuses alike). Its name goes,
    // so nothing is left behind whatever happens to the job.
    if let Ok(r) = &rank {
        r.failure_word().unlink();
    }
    let joined = match joined {
        Ok(joined) => joined,
        Err(refused) => {
            // Refused after the peers opened this rank's staging (the second step's verdict):
            // it may be freed only once each has closed its mapping.
            if matches!(
                refused,
                SetupError::Refused(Verdict::PeerAccessFailed { .. }) | SetupError::Exchange(_)
            ) {
                if let Ok(r) = rank {
                    free_once_released(r, &assembly.label);
                }
            }
            return Err(refused);
        }
    };
    // The final verdict was Eligible on every rank, so this rank's steps all succeeded.
    let (Ok(mut rank), Some(ordering)) = (rank, ordering) else {
        return Err(SetupError::Exchange(
            "the verdict was Eligible without this rank's engine".into(),
        ));
    };
    agree_on_branch(&assembly, &mut rank, &joined.records);
    let multicast = (assembly.multicast.on() && region::useful(assembly.ranks))
        .then(|| multicast_region(&assembly, exchange, &mut rank, &joined.records))
        .flatten();
    let policy = match assembly.baseline {
        Baseline::Nccl => with_setup_facts(assembly.policy, &joined.records),
        Baseline::Ring => assembly.policy,
    };
    // StragglAR may finish by one multicast: the model prices that, at the assumed store rate,
    // and the policy weighs it against the point-to-point finish (unless told to always use it).
    let assumed = Multicast {
        ratio: Multicast::ASSUMED_RATIO,
    };
    let policy = match (&multicast, assembly.multicast) {
        (Some(_), MulticastMode::Always) => policy.with_multicast(assumed).multicast_only(),
        (Some(_), _) => policy.with_multicast(assumed),
        (None, _) => policy,
    };
    Ok(CudaComm::new(CommParts {
        rank,
        members: joined.records.iter().map(SetupRecord::member).collect(),
        mappings: joined.mappings,
        plans: assembly.plans,
        policy,
        max_bytes: assembly.max_bytes,
        staged_bytes: assembly.staged_bytes,
        baseline: assembly.baseline,
        designated: assembly.designated,
        label: assembly.label,
        ordering,
        multicast,
    }))
}

/// Keeps NCCL's work behind conditional nodes only where every rank's record says it can put
/// it there: a rank whose graphs held NCCL's work where its peers' held our Ring would leave
/// both waiting. Said once, by rank 0.
fn agree_on_branch(assembly: &Assembly, rank: &mut CudaRank, records: &[SetupRecord]) {
    if assembly.baseline != Baseline::Nccl {
        return;
    }
    let unable = records.iter().position(|r| r.branch != 1);
    if unable.is_some() {
        rank.set_branch(None);
    }
    if assembly.rank == 0 {
        match unable {
            None => log::info!(
                "{}: graph replays choose between StragglAR and NCCL's own captured work (conditional graph nodes)",
                assembly.label
            ),
            Some(r) => log::info!(
                "{}: graph replays choose between StragglAR and our Ring: rank {r} cannot put NCCL's captured work behind a conditional node (STRAGGLAR_GRAPH_NCCL=0 there, or its log at DEBUG says why)",
                assembly.label
            ),
        }
    }
}

/// Forms the communicator's multicast region (every rank calls this after a setup every rank
/// passed, so the team's protocol runs on all of them), and points this rank's launches at it;
/// `None`, logged with the cause every rank agreed on, when the team declined.
fn multicast_region<X: Exchange>(
    assembly: &Assembly,
    exchange: &mut X,
    rank: &mut CudaRank,
    records: &[SetupRecord],
) -> Option<Region> {
    let kernels = Arc::clone(rank.kernels());
    let formed = form_region(
        exchange,
        assembly.device,
        &kernels.multicast_probe,
        records,
        assembly.rank,
        assembly.max_bytes,
    );
    match formed {
        Ok(region) => {
            rank.use_multicast(region.launch_view());
            if assembly.rank == 0 {
                let finish = match assembly.multicast {
                    MulticastMode::Always => "every StragglAR call finishes by one multicast",
                    _ => "StragglAR may finish by one multicast, chosen per size class",
                };
                log::info!(
                    "{}: multicast region formed ({} bytes per parity on every rank): {finish}",
                    assembly.label,
                    region.parity_bytes
                );
            }
            Some(region)
        }
        Err(declined) => {
            if assembly.rank == 0 {
                log::warn!(
                    "{}: STRAGGLAR_MULTICAST={}, but no multicast region: {declined}; StragglAR runs point to point",
                    assembly.label,
                    assembly.multicast
                );
            }
            None
        }
    }
}

/// How long a refused setup waits for its peers to close their mappings of this rank's
/// staging (they do as they return from the same verdict).
const REFUSED_RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Frees `rank`'s staging after a refused setup, once every peer has closed its mapping of it
/// (this rank's own mappings closed with the setup's end, which it says beside its failure
/// word first): freeing exported memory a peer still maps is undefined behaviour. A peer that
/// does not say so in time, or whose failure word this rank never opened, leaves the staging
/// allocated for the rest of the process (said at DEBUG).
fn free_once_released(rank: CudaRank, label: &str) {
    rank.say_released();
    let known = (0..rank.ranks()).all(|p| p == rank.index() || rank.peer_failure(p).is_some());
    if !known {
        // Refused before it opened every peer's failure word: it cannot learn that they let go.
        log::debug!("{label}: this rank's staging stays allocated after the refused setup (its peers' release cannot be seen)");
        std::mem::forget(rank);
        return;
    }
    let deadline = std::time::Instant::now() + REFUSED_RELEASE_WAIT;
    let released = |r: &CudaRank| (0..r.ranks()).all(|p| p == r.index() || r.peer_released(p));
    while !released(&rank) {
        if std::time::Instant::now() >= deadline {
            log::debug!("{label}: a peer kept this rank's staging mapped after the refused setup: it stays allocated");
            std::mem::forget(rank);
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// This rank's staging (if it can make it) and its record: ready, or failed with the cause.
fn local_part(
    assembly: &Assembly,
    config: RankConfig,
) -> (Result<CudaRank, LocalFailure>, SetupRecord) {
    let (rank, ranks) = (assembly.rank, assembly.ranks);
    let mut made = assembly.kernels.and_then(|kernels| {
        CudaRank::new(assembly.device, kernels, config).map_err(|_| LocalFailure::NoMemory)
    });
    // Graph replays may take NCCL's own work as their baseline where the driver can put it
    // behind a conditional node (every rank must: see `assemble`).
    let wanted = crate::config::get().graph_nccl;
    if let (Ok(r), Baseline::Nccl, true) = (&mut made, assembly.baseline, wanted) {
        match Branch::load(assembly.device) {
            Ok(branch) => r.set_branch(Some(branch)),
            Err(why) => log::debug!("{}: no conditional graph nodes here: {why}", assembly.label),
        }
    }
    let record = match &made {
        Err(why) => SetupRecord::failed(rank, ranks, *why),
        Ok(r) => match (assembly.device.uuid(), r.staging().ipc_handle()) {
            (Ok(uuid), Ok(handle)) => {
                let record = SetupRecord::ready(
                    rank,
                    ranks,
                    &Identity::this_host(uuid),
                    settings_of(crate::config::get()),
                    handle,
                    assembly.layout,
                )
                .with_failure_word(r.failure_word().name());
                match assembly.baseline {
                    Baseline::Nccl => record
                        .with_nvls(nccl_would_run_nvls(assembly.device))
                        .with_branch(r.has_branch()),
                    Baseline::Ring => record,
                }
            }
            _ => SetupRecord::failed(rank, ranks, LocalFailure::NoIpc),
        },
    };
    (made, record)
}
