//! Growing a job communicator's arenas at the eager call that needs more than they hold.
//!
//! A communicator's staging starts with arenas of no size: a job whose calls all stay on NCCL
//! (no straggler, or NVLS faster) holds only the staging's small control part. The first call
//! the policy sends to StragglAR grows them to hold calls up to the next power of two of its
//! size (at least [`MIN_GROWTH_BYTES`], and at least four times what they held), up to
//! `STRAGGLAR_BUFFER_BYTES`. Every rank takes the same step at the same call: it follows from
//! what every rank shares (the call's size, the policy's choice, the arenas so far).
//!
//! The step is the setup's protocol in small, run through the communicator's own AllGather:
//! each rank allocates and exports its new pair of arenas (under `STRAGGLAR_STAGING_CAP`), the
//! handles are gathered with whether each rank could, each rank opens and probes every peer's,
//! and a second gather says whether that worked. Only when every rank succeeded do all of them
//! point their later launches at the new arenas; otherwise every rank keeps its arenas as they
//! were, alike, and larger calls stay on NCCL. Each rank makes both gathers whatever happens
//! locally (a panic included), so no peer waits for one that gave up.
//!
//! Nothing is freed before the communicator goes: a captured graph's launches point at the
//! arenas of their capture, and freeing device memory mid-job waits for every stream of the
//! context (which can hang ranks that wait on each other). Growing fourfold keeps what is held
//! below four thirds of the last arenas.

use std::sync::Arc;

use super::arena::GrownArena;
use super::driver::{self, Device, PeerMapping};
use super::rank::{CallError, CudaRank};
use super::setup::Exchange;
use super::staging::ArenaLayout;

/// The smallest size of call the arenas grow to hold (bytes).
pub const MIN_GROWTH_BYTES: usize = 1 << 20;

/// Bytes one rank's entry of the handle gather takes: whether it allocated, its IPC handle.
const HANDLE_RECORD: usize = 4 + 64;

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
    /// Every rank's later launches use the new arenas; the peers' mappings must stay open
    /// until the communicator releases its peers.
    Grown { mappings: Vec<PeerMapping> },
    /// Every rank keeps its arenas as they were; `why` names a rank that could not take part.
    /// Mappings opened before the refusal stay open until the peers are released.
    Refused {
        mappings: Vec<PeerMapping>,
        why: String,
    },
}

/// Runs one growth of `rank`'s arenas to `arenas` through `exchange` (the communicator's
/// AllGather, synchronous). `Err` is a failed gather (NCCL's error; every rank's gathers fail
/// alike) or a failure to upload the new peer table after every rank agreed: this rank must
/// then give up, so that peers running on the new arenas stop waiting for it.
pub fn grow(
    rank: &mut CudaRank,
    ranks: usize,
    arenas: ArenaLayout,
    exchange: &mut dyn Exchange,
) -> Result<Growth, CallError> {
    let me = rank.index();
    let device = rank.device().clone();
    let local = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // An allocation while another thread captures in the global mode would end its
        // capture.
        driver::relaxed_capture_mode(|| GrownArena::allocate(&device, arenas))
    }))
    .unwrap_or_else(|_| Err("a panic while allocating".into()));
    let mut mine = vec![0u8; HANDLE_RECORD];
    if let Ok((_, handle)) = &local {
        mine[..4].copy_from_slice(&1u32.to_le_bytes());
        mine[4..].copy_from_slice(handle);
    }
    let gathered = gather(exchange, &mine, ranks)?;
    let handles: Vec<Option<[u8; 64]>> = gathered
        .iter()
        .map(|r| (r[0] == 1).then(|| r[4..].try_into().expect("64 bytes")))
        .collect();
    let (arena, missing) = match (local, handles.iter().position(Option::is_none)) {
        (Ok((arena, _)), None) => (arena, None),
        (Ok((arena, _)), Some(peer)) => (arena, Some(format!("rank {peer} could not allocate"))),
        (Err(why), _) => {
            // Every peer saw this rank's empty record, so none waits for what follows.
            return Ok(Growth::Refused {
                mappings: Vec::new(),
                why: format!("rank {me}: {why}"),
            });
        }
    };
    if let Some(why) = missing {
        rank.keep_arena(arena);
        return Ok(Growth::Refused {
            mappings: Vec::new(),
            why,
        });
    }
    let handles: Vec<[u8; 64]> = handles.into_iter().flatten().collect();
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        open_peers(&device, &handles, me, arena.ptr(), arenas)
    }));
    // A panic opened nothing this rank knows of: it says it failed.
    let (mappings, bases) = opened.unwrap_or_default();
    let flags = gather(exchange, &u32::from(bases.is_some()).to_le_bytes(), ranks)?;
    match (flags.iter().position(|f| f[0] != 1), bases) {
        (None, Some(bases)) => {
            rank.grow_into(arenas, &bases, arena)?;
            Ok(Growth::Grown { mappings })
        }
        (failed, _) => {
            rank.keep_arena(arena);
            Ok(Growth::Refused {
                mappings,
                why: format!(
                    "rank {} could not reach its peers' new arenas",
                    failed.unwrap_or(me)
                ),
            })
        }
    }
}

/// Opens every peer's new arenas from `handles` (this rank's, at `own`, is not opened) and
/// writes a word into each and reads it back. The mappings opened, and every rank's base as
/// this process addresses it when all worked.
fn open_peers(
    device: &Arc<Device>,
    handles: &[[u8; 64]],
    me: usize,
    own: u64,
    arenas: ArenaLayout,
) -> (Vec<PeerMapping>, Option<Vec<u64>>) {
    let mut mappings = Vec::with_capacity(handles.len());
    let mut bases = Vec::with_capacity(handles.len());
    // Each rank probes its own word of the peer's parity-0 arena: no two ranks write one.
    let token = 0x5347_4100 | me as u32;
    let at = arenas.arena(0) + 4 * me as u64;
    for (peer, handle) in handles.iter().enumerate() {
        if peer == me {
            bases.push(own);
            continue;
        }
        let Ok(mapping) = PeerMapping::open(device, handle) else {
            return (mappings, None);
        };
        let reached = mapping.write_u32(at, token).is_ok() && mapping.read_u32(at) == Ok(token);
        bases.push(mapping.ptr);
        mappings.push(mapping);
        if !reached {
            return (mappings, None);
        }
    }
    (mappings, Some(bases))
}

/// One all-gather of `mine` (the same length on every rank), split per rank.
fn gather(
    exchange: &mut dyn Exchange,
    mine: &[u8],
    ranks: usize,
) -> Result<Vec<Vec<u8>>, CallError> {
    let all = exchange
        .all_gather(mine)
        .map_err(|e| CallError::Unfit(format!("growing the arenas: {e}")))?;
    if all.len() != mine.len() * ranks {
        return Err(CallError::Unfit(format!(
            "growing the arenas: the all-gather returned {} bytes",
            all.len()
        )));
    }
    Ok(all.chunks(mine.len()).map(<[u8]>::to_vec).collect())
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
