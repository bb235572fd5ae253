//! What a communicator's staging must hold, and the policy it is sized for: room for the
//! largest plan of any type, any straggler and any pipeline depth the policy may run, so every
//! call the policy sends to StragglAR fits.

use super::grid::MAX_BLOCKS;
use super::growth::growth_target;
use super::multicast::region;
use super::setup::SetupRecord;
use super::staging::{ArenaLayout, StagingLayout};
use crate::detect::policy::Policy;
use crate::detect::Finish;
use crate::plan::{PlanCache, Shape};
use crate::reduce::DataType;
use crate::schedule::model::{Link, Nvls};

/// The model's links for the policy: an NVSwitch GPU (3 us per round, 450 GiB/s per
/// direction), until the engine is calibrated on such hardware.
pub const NVSWITCH_LINK: Link = Link {
    alpha: 3e-6,
    bandwidth: 450.0 * 1024.0 * 1024.0 * 1024.0,
};

/// The element widths a job's staging is sized for: the arena a plan needs depends on the
/// element count and size, not on the type otherwise.
pub const EVERY_WIDTH: [DataType; 4] = [DataType::U8, DataType::F16, DataType::F32, DataType::F64];

/// The messages a staging takes.
#[derive(Debug, Clone, Copy)]
pub struct Sizing<'a> {
    /// The largest message, in bytes.
    pub max_bytes: usize,
    /// The types of the messages.
    pub dtypes: &'a [DataType],
    /// Whether our own Ring runs the baseline's eager calls (its arena must fit then; where NCCL
    /// runs them, only graph replays run Ring, where it fits, and StragglAR where not).
    pub ring_runs_eagerly: bool,
    /// Whether StragglAR may finish by one multicast (`STRAGGLAR_MULTICAST`): its plans must fit
    /// too, beside the point-to-point ones a declined team leaves.
    pub multicast: bool,
}

impl Sizing<'_> {
    /// A job's communicator: up to `STRAGGLAR_BUFFER_BYTES` of any type, NCCL the baseline.
    pub fn of_the_library() -> Sizing<'static> {
        Sizing {
            max_bytes: crate::config::get().buffer_bytes,
            dtypes: &EVERY_WIDTH,
            ring_runs_eagerly: false,
            multicast: crate::config::get().multicast.on(),
        }
    }
}

/// The staging every rank of `policy`'s communicator allocates, with `blocks` plan blocks: room
/// for `sizing`'s messages under StragglAR with every straggler and every pipeline depth a call
/// may run (a deeper pipeline needs less arena, smaller pieces, and more flags), and Ring's
/// flags (so that flags never decide the baseline). The schedules are lowered into `plans`,
/// which the communicator's engine keeps.
pub fn layout(
    plans: &mut PlanCache,
    policy: &Policy,
    blocks: u32,
    sizing: Sizing,
) -> Result<StagingLayout, String> {
    let ranks = policy.ranks();
    let mut layout = StagingLayout {
        arena_bytes: 64,
        values: 1,
        blocks: blocks as u64,
        ranks: ranks as u64,
    };
    let mut fit = |shape: Shape, arena: bool| -> Result<(), String> {
        let need = plans.lowered(shape)?.need();
        if arena {
            for &dtype in sizing.dtypes {
                let bytes = need.arena_bytes(sizing.max_bytes / dtype.size(), dtype);
                layout.arena_bytes = layout.arena_bytes.max(bytes as u64);
            }
        }
        layout.values = layout.values.max(need.values as u64);
        Ok(())
    };
    for pieces in policy.pieces_up_to(sizing.max_bytes) {
        for straggler in 0..ranks {
            fit(
                Shape::of_choice(ranks, straggler, DataType::U8).with_pieces(pieces),
                true,
            )?;
        }
    }
    // Only a communicator that can form a region runs multicast plans.
    if sizing.multicast && region::useful(ranks) {
        for straggler in 0..ranks {
            fit(
                Shape::of_choice(ranks, straggler, DataType::U8).with_finish(Finish::Multicast),
                true,
            )?;
        }
    }
    fit(
        Shape::of_choice(ranks, ranks, DataType::U8),
        sizing.ring_runs_eagerly,
    )?;
    Ok(layout)
}

/// Bytes of one arena parity that hold every call up to `max_bytes` of any type, with every
/// straggler and pipeline depth `policy` may run (the arenas `layout` sizes for
/// [`Sizing::of_the_library`] at that size): what a job's communicator grows its arenas to.
pub fn arena_for(
    plans: &mut PlanCache,
    policy: &Policy,
    blocks: u32,
    max_bytes: usize,
) -> Result<u64, String> {
    let sizing = Sizing {
        max_bytes,
        ..Sizing::of_the_library()
    };
    layout(plans, policy, blocks, sizing).map(|l| l.arena_bytes)
}

/// What one rank of an `n`-rank job communicator holds on its GPU (the largest grid; for
/// `stragglar doctor` and the docs), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// The staging without arenas, from the communicator's first call on.
    pub control: u64,
    /// Arenas grown once, for calls of 16 MiB (or the buffer, if smaller).
    pub arenas_16m: u64,
    /// Arenas grown once, for calls of `STRAGGLAR_BUFFER_BYTES`.
    pub arenas_buffer: u64,
    /// Every arena kept when calls grow one step at a time from the smallest growth to the
    /// buffer: the most a communicator ever holds beside `control`.
    pub arenas_stepwise: u64,
    /// The multicast region formed at setup with `STRAGGLAR_MULTICAST` on (both parities, before
    /// the driver's granularity rounds it up), or 0.
    pub multicast_region: u64,
}

/// The [`Footprint`] of one rank of an `n`-rank job communicator under the configuration.
pub fn footprint(ranks: usize) -> Result<Footprint, String> {
    let mut plans = PlanCache::default();
    let policy = policy(ranks);
    let buffer = crate::config::get().buffer_bytes;
    let full = layout(&mut plans, &policy, MAX_BLOCKS, Sizing::of_the_library())?;
    let control = StagingLayout {
        arena_bytes: 0,
        ..full
    }
    .allocation_bytes();
    let mut arenas = |bytes: usize| -> Result<u64, String> {
        let arena_bytes = arena_for(&mut plans, &policy, MAX_BLOCKS, bytes)?;
        Ok(ArenaLayout { arena_bytes }.allocation_bytes())
    };
    let (mut staged, mut stepwise) = (0, 0);
    while staged < buffer {
        staged = growth_target(staged + 1, staged, buffer);
        stepwise += arenas(staged)?;
    }
    let multicast = crate::config::get().multicast.on() && region::useful(ranks);
    Ok(Footprint {
        control,
        arenas_16m: arenas(buffer.min(16 << 20))?,
        arenas_buffer: arenas(buffer)?,
        arenas_stepwise: stepwise,
        multicast_region: match multicast {
            true => 2 * region::parity_bytes(ranks, buffer) as u64,
            false => 0,
        },
    })
}

/// The policy of a job's `n`-rank communicator, from the configuration (its model prices NCCL
/// as Ring until [`with_setup_facts`] says otherwise).
pub fn policy(ranks: usize) -> Policy {
    let config = crate::config::get();
    Policy::new(ranks, config.algo, config.straggler, NVSWITCH_LINK).with_pipeline(config.pipeline)
}

/// `policy` once the setup's records are known: its model prices NCCL as NVLS when every
/// rank's record says NCCL would run it there. The depths `policy` worked out while sizing the
/// staging stay with it (no schedule is synthesized again on the first calls).
pub fn with_setup_facts(policy: Policy, records: &[SetupRecord]) -> Policy {
    match !records.is_empty() && records.iter().all(|r| r.nvls == 1) {
        true => policy.with_nvls_baseline(Nvls {
            ratio: Nvls::PUBLISHED_RATIO,
        }),
        false => policy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_staging_fits_every_eligible_call() {
        let sizing = Sizing::of_the_library();
        let buffer = sizing.max_bytes;
        let plain = layout(&mut PlanCache::default(), &policy(8), 27, sizing).unwrap();
        assert!(plain.arena_bytes >= buffer as u64);
        assert_eq!(plain.blocks, 27);
        // Pipelined per size class: every depth's plans fit, in no more arena than the plain
        // schedule's (smaller pieces), with more flags.
        let auto = policy(8).with_pipeline(crate::detect::pipeline::Pipeline::Auto);
        let mut plans = PlanCache::default();
        let piped = layout(&mut plans, &auto, 27, sizing).unwrap();
        let depths = auto.pieces_up_to(buffer);
        assert!(depths.len() > 1 && depths[0] == 1, "{depths:?}");
        for &pieces in &depths {
            for straggler in 0..8 {
                let shape = Shape::of_choice(8, straggler, DataType::F32).with_pieces(pieces);
                let need = plans.lowered(shape).unwrap().need();
                assert!(need.arena_bytes(buffer / 4, DataType::F32) as u64 <= piped.arena_bytes);
                assert!(need.values as u64 <= piped.values);
            }
        }
        for ranks in 2..=16 {
            let mut plans = PlanCache::default();
            let fitted = layout(&mut plans, &policy(ranks), 8, sizing).unwrap();
            let ring = Shape::of_choice(ranks, ranks, DataType::U8);
            let need = plans.lowered(ring).unwrap().need();
            assert!(
                need.values as u64 <= fitted.values,
                "Ring's flags at {ranks} ranks"
            );
            // Where our Ring runs eagerly, its arena fits too.
            let eager = Sizing {
                ring_runs_eagerly: true,
                ..sizing
            };
            let with_ring = layout(&mut PlanCache::default(), &policy(ranks), 8, eager).unwrap();
            assert!(need.arena_bytes(buffer, DataType::U8) as u64 <= with_ring.arena_bytes);
        }
        assert_eq!(piped.arena_bytes, plain.arena_bytes);
        assert!(piped.values > plain.values);
        eprintln!(
            "8 ranks, {buffer} B: plain {} B ({} flags), auto {depths:?} {} B ({} flags)",
            plain.allocation_bytes(),
            plain.values,
            piped.allocation_bytes(),
            piped.values
        );
    }
}
