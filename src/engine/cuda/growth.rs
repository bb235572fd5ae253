//! Growing a job communicator's arenas at the eager call that needs more than they hold.
//!
//! A communicator's staging starts with arenas of no size: a job whose calls all stay on NCCL
//! (no straggler, or NVLS faster) holds only the staging's small control part. The first call
//! the policy sends to StragglAR grows them to hold calls up to the next power of two of its
//! size (at least [`MIN_GROWTH_BYTES`], and at least four times what they held), up to
//! `STRAGGLAR_BUFFER_BYTES`. Every rank takes the same step at the same call: it follows from
//! what every rank shares (the call's size, the policy's choice, the arenas so far).
//!
//! The step is the setup's protocol in small, through host memory every rank maps (the page of
//! each rank's failure word, `super::failure`), not through NCCL: no collective a rank that
//! failed alone would leave its peers waiting in, no stream to synchronise, no allocation for
//! it. Each rank allocates and exports its new pair of arenas (under `STRAGGLAR_STAGING_CAP`)
//! and offers the handle, or says it could not; once every rank has offered, each opens and
//! probes every peer's and says whether that worked; once every rank has said, all of them
//! point their later launches at the new arenas if every rank succeeded, and otherwise keep
//! their arenas as they were, alike, larger calls staying on NCCL. While it waits for its peers
//! a rank watches their failure words, its own abort word and `STRAGGLAR_TIMEOUT_MS`, as its
//! kernels do: a peer that failed, or gave up before the step, fails the step (and the call)
//! on every rank that waits for it, never a hang.
//!
//! Nothing is freed before the communicator goes: a captured graph's launches point at the
//! arenas of their capture, and freeing device memory mid-job waits for every stream of the
//! context (which can hang ranks that wait on each other). Growing fourfold keeps what is held
//! below four thirds of the last arenas.

use std::sync::Arc;
use std::time::Instant;

use super::arena::GrownArena;
use super::driver::{Device, PeerMapping};
use super::rank::{CallError, CudaRank};
use super::staging::ArenaLayout;

/// The smallest size of call the arenas grow to hold (bytes).
pub const MIN_GROWTH_BYTES: usize = 1 << 20;

/// The size of call arenas that hold calls up to `staged` bytes grow to for a call of `bytes`
/// (more than `staged`), with `max` (`STRAGGLAR_BUFFER_BYTES`) the most they ever hold.
pub fn growth_target(bytes: usize, staged: usize, max: usize) -> usize {
    bytes
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX)
        .max(staged.saturating_mul(4))
        .max(MIN_GROWTH_BYTES)
        .min(max)
}

/// How a growth ended, the same on every rank.
pub enum Growth {
    /// Every rank's later launches use the new arenas.
    Grown,
    /// Every rank keeps its arenas as they were; `why` names a rank that could not take part.
    Refused { why: String },
}

/// Runs one growth of `rank`'s arenas to `arenas` with every peer. The peers' new arenas this
/// rank maps go to `kept` as they are opened (they stay open until the peers are released),
/// and this rank's own new arenas stay with `rank` whatever happens. `Err`: a peer failed, this
/// rank was aborted or failed, the deadline passed while waiting for a peer, or the new peer
/// table could not be uploaded after every rank agreed; the caller gives this rank up.
/// Made from an eager call, in the relaxed capture mode (see `CudaComm::all_reduce`).
pub fn grow(
    rank: &mut CudaRank,
    arenas: ArenaLayout,
    kept: &mut Vec<PeerMapping>,
) -> Result<Growth, CallError> {
    let growth = rank.next_growth();
    let me = rank.index();
    let device = rank.device().clone();
    // One deadline for both rounds, from this rank's arrival (a huge timeout: none).
    let deadline = rank.timeout().and_then(|t| Instant::now().checked_add(t));
    // A rank already given up, or whose peer failed, allocates nothing: its caller gives it
    // up, and its peers waiting for its offer see its failure word.
    rank.nobody_failed()?;
    // Round 1: this rank's new arenas, offered to the peers (or why not).
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        GrownArena::allocate(&device, arenas)
    }))
    .unwrap_or_else(|_| Err("a panic while allocating".into()));
    let (arena, handle) = match made {
        Ok(arena) => match arena.ipc_handle() {
            Ok(handle) => (Some(arena), Ok(handle)),
            Err(why) => (Some(arena), Err(why)),
        },
        Err(why) => (None, Err(why)),
    };
    rank.failure_word()
        .offer_growth(growth, handle.as_ref().ok());
    let offers = rank.wait_for_every_rank(deadline, |word| word.growth_offer(growth));
    // From here on, this rank's new arenas stay with it whatever happens (never freed mid-job).
    let own = arena.as_ref().map(GrownArena::ptr);
    if let Some(arena) = arena {
        rank.keep_arena(arena);
    }
    let offers = offers?;
    let handles: Option<Vec<[u8; 64]>> = offers.iter().copied().collect();
    // Round 2, which every rank makes whatever round 1 gave, so that a refusal is agreed as
    // much as a growth (no rank goes on to NCCL while a peer that timed out has given up):
    // every peer's new arenas opened and probed, where every rank offered some.
    let bases = match (&handles, own) {
        (Some(handles), Some(own)) => {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                open_peers(&device, handles, me, own, arenas, kept)
            }))
            .unwrap_or(None)
        }
        _ => None,
    };
    rank.failure_word().reach_growth(growth, bases.is_some());
    let reached = rank.wait_for_every_rank(deadline, |word| word.growth_reached(growth))?;
    if let (Some(bases), None) = (&bases, reached.iter().position(|&r| !r)) {
        rank.grow_into(arenas, bases)?;
        return Ok(Growth::Grown);
    }
    let why = match (offers.iter().position(Option::is_none), handle) {
        (Some(peer), Err(why)) if peer == me => format!("rank {me}: {why}"),
        (Some(peer), _) => format!("rank {peer} could not allocate them"),
        (None, _) => format!(
            "rank {} could not reach its peers' new arenas",
            reached.iter().position(|&r| !r).unwrap_or(me)
        ),
    };
    Ok(Growth::Refused { why })
}

/// Opens every peer's new arenas from `handles` (this rank's own, at `own`, is not opened) into
/// `kept`, and writes a word into each and reads it back. Every rank's base as this process
/// addresses it, when all of that worked.
fn open_peers(
    device: &Arc<Device>,
    handles: &[[u8; 64]],
    me: usize,
    own: u64,
    arenas: ArenaLayout,
    kept: &mut Vec<PeerMapping>,
) -> Option<Vec<u64>> {
    let mut bases = Vec::with_capacity(handles.len());
    // Each rank probes its own word of the peer's parity-0 arena: no two ranks write one.
    let token = 0x5347_4100 | me as u32;
    let at = arenas.arena(0) + 4 * me as u64;
    for (peer, handle) in handles.iter().enumerate() {
        if peer == me {
            bases.push(own);
            continue;
        }
        let mapping = PeerMapping::open(device, handle).ok()?;
        let reached = mapping.write_u32(at, token).is_ok() && mapping.read_u32(at) == Ok(token);
        bases.push(mapping.ptr);
        kept.push(mapping);
        if !reached {
            return None;
        }
    }
    Some(bases)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arenas_grow_by_powers_of_two_from_a_floor_to_the_buffer() {
        let max = 256 << 20;
        assert_eq!(growth_target(1, 0, max), MIN_GROWTH_BYTES);
        assert_eq!(growth_target(25 << 20, 0, max), 32 << 20);
        assert_eq!(growth_target(32 << 20, 0, max), 32 << 20);
        // At least four times what they held: few steps, and what is kept stays below four
        // thirds of the last.
        assert_eq!(growth_target(33 << 20, 32 << 20, max), 128 << 20);
        assert_eq!(growth_target((16 << 20) + 1, 16 << 20, max), 64 << 20);
        assert_eq!(growth_target(5 << 20, 4 << 20, max), 16 << 20);
        assert_eq!(growth_target(100 << 20, 16 << 20, max), 128 << 20);
        assert_eq!(growth_target(200 << 20, 64 << 20, max), max);
        assert_eq!(growth_target(usize::MAX, 0, max), max);
        assert_eq!(
            growth_target(3 << 20, 0, 2 << 20),
            2 << 20,
            "never past the buffer"
        );
        let (mut staged, mut steps) = (0, 0);
        for bytes in (1..=max).step_by(1 << 20) {
            if bytes > staged {
                staged = growth_target(bytes, staged, max);
                steps += 1;
            }
        }
        assert_eq!((staged, steps), (max, 5), "1, 4, 16, 64 and 256 MiB");
    }
}
