//! Forming a multicast team: every rank of a communicator ends with one multicast object mapped
//! (stores through it reach every rank's memory, as a probe kernel shows) and its own memory
//! bound to it, or every rank declines with the same cause.
//!
//! The driver makes the order strict: `cuMulticastBindMem` and `cuMemMap` of the object block
//! until every device the object was created for has been added, so a rank that gave up after
//! the create would hang its peers inside the driver. Hence seven steps, each ended by an
//! all-gather of one status per rank that every rank makes whatever happened locally, and no
//! step begins unless every rank finished the one before:
//!
//! 1. **probe**: multicast and POSIX-fd handles supported, and both granularities (the size is
//!    rounded up to a multiple of every rank's);
//! 2. **count**: where the request says so, every rank counts the rounded size against its
//!    device's `STRAGGLAR_STAGING_CAP`, for the team's life (the size the driver allocates, not
//!    the size asked for);
//! 3. **create**: rank 0 takes one of the host's slots for the engine's multicast objects
//!    (`STRAGGLAR_MULTICAST_OBJECTS`, `slots`), listens on the team's socket, creates the
//!    object and exports its fd;
//! 4. **join**: rank 0 passes the fd to every peer (`fds`), each peer imports it, and every rank
//!    adds its own device;
//! 5. **bind**: every rank allocates its memory, binds it and maps both the object and its
//!    memory; no bind can block, since step 4 confirmed every add;
//! 6. **store**: every rank's probe kernel (`ncclStragglarMulticastProbe`) stores a 16-byte
//!    pattern of the team's token and its rank through the object into its slot of every
//!    member's memory;
//! 7. **check**: once every probe finished, every rank finds every rank's pattern, bit for bit,
//!    in its own memory.
//!
//! A local failure (an error, a panic, a missing driver symbol) is logged by the rank that met
//! it and reported through the next all-gather; the team is then declined on every rank alike,
//! naming the step and the first rank that failed it, and what was made is undone on drop.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUdevice_attribute;

use super::fds::{receive, FdServer};
use super::slots::{self, ObjectSlot};
use crate::engine::cuda::budget::Reservation;
use crate::engine::cuda::driver::{Device, Kernel};
use crate::engine::cuda::setup::Exchange;
use crate::engine::cuda::vmm::{
    allocation_granularity, multicast_granularity, MulticastObject, Physical, VirtualMapping,
};
use crate::gpu::launch::RawMulticastProbe;

/// The steps of forming a team, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Probe,
    Count,
    Create,
    Join,
    Bind,
    Store,
    Check,
}

impl Step {
    /// What a rank failing this step could not do.
    fn failure(self) -> &'static str {
        match self {
            Step::Probe => "offer multicast (a GPU without it, or without POSIX-fd memory handles)",
            Step::Count => {
                "count the team's memory against STRAGGLAR_STAGING_CAP (no room beside its staging)"
            }
            Step::Create => {
                "create the multicast object (a slot under STRAGGLAR_MULTICAST_OBJECTS, the object, its fd)"
            }
            Step::Join => "join the multicast object (receive its fd, import it, add its GPU)",
            Step::Bind => "bind its memory to the multicast object and map it",
            Step::Store => "store through the multicast object (its probe kernel)",
            Step::Check => {
                "see every rank's multicast store, bit for bit, in its own memory (multicast does not work here)"
            }
        }
    }
}

/// Why no team was formed: the same on every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Declined {
    /// `rank` (the first of those that failed) could not do `step`.
    Failed { step: Step, rank: usize },
    /// An all-gather failed (the communicator's own error).
    Exchange(String),
}

impl fmt::Display for Declined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Declined::Failed { step, rank } => {
                write!(f, "rank {rank} could not {}", step.failure())
            }
            Declined::Exchange(why) => write!(f, "an all-gather failed: {why}"),
        }
    }
}

/// A formed team, seen from one rank. Dropped: the mappings go, this device's binding is undone
/// and the handles are released (in field order).
pub struct Team {
    /// The multicast object's addresses on this device: only multimem operations may use them.
    pub multicast: VirtualMapping,
    /// This rank's own memory bound to the object, at addresses of its own (plain accesses).
    pub unicast: VirtualMapping,
    _object: MulticastObject,
    _memory: Physical,
    /// Bytes per rank (the request rounded up to every rank's granularity).
    pub bytes: usize,
    /// `bytes` counted against the device's staging cap, where the request asked for it.
    _counted: Option<Reservation>,
    /// The creator's slot among the host's multicast objects, released after the object.
    _slot: Option<ObjectSlot>,
}

/// What a team is asked for.
pub struct TeamRequest<'a> {
    pub rank: usize,
    pub ranks: usize,
    /// Bytes of memory per rank, before rounding up to the granularity.
    pub bytes: usize,
    /// Whether the team's memory, rounded up, counts against the device's
    /// `STRAGGLAR_STAGING_CAP` for the team's life (the engine's region does; a one-off check
    /// does not). A rank without room declines, and every rank with it.
    pub counted: bool,
    /// The abstract socket name rank 0 serves the fd on: the same on every rank, unique on the
    /// host per team (for instance from the communicator's unique id).
    pub socket: &'a str,
    /// When waits for peers' connections give up.
    pub deadline: Instant,
    /// `ncclStragglarMulticastProbe` on this rank's GPU.
    pub probe: &'a Kernel,
}

/// Runs `local` under a panic guard; `None` (logged) when it failed or panicked.
fn attempt<T>(rank: usize, step: Step, local: impl FnOnce() -> Result<T, String>) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(local)) {
        Ok(Ok(value)) => Some(value),
        Ok(Err(why)) => {
            log::warn!(
                "rank {rank}: multicast: could not {}: {why}",
                step.failure()
            );
            None
        }
        Err(_) => {
            log::warn!(
                "rank {rank}: multicast: a panic while trying to {}",
                step.failure()
            );
            None
        }
    }
}

/// All-gathers `payload` behind one ok word from every rank; the first rank whose word says it
/// failed `step` declines the team, else every rank's payload.
fn gather<E: Exchange>(
    exchange: &mut E,
    step: Step,
    ok: bool,
    payload: [u64; 2],
) -> Result<Vec<[u64; 2]>, Declined> {
    let mut mine = Vec::with_capacity(24);
    mine.extend_from_slice(&u64::from(ok).to_le_bytes());
    for word in payload {
        mine.extend_from_slice(&word.to_le_bytes());
    }
    let all = exchange.all_gather(&mine).map_err(Declined::Exchange)?;
    if all.len() % 24 != 0 || all.is_empty() {
        return Err(Declined::Exchange(format!(
            "the all-gather returned {} bytes",
            all.len()
        )));
    }
    let word = |c: &[u8], i: usize| u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap());
    let mut out = Vec::new();
    for (rank, chunk) in all.chunks(24).enumerate() {
        if word(chunk, 0) != 1 {
            return Err(Declined::Failed { step, rank });
        }
        out.push([word(chunk, 1), word(chunk, 2)]);
    }
    Ok(out)
}

/// Whether `device` offers multicast and POSIX-fd handles, and its two granularities.
fn probe(device: &Device, ranks: usize) -> Result<[u64; 2], String> {
    let attribute = |a| device.attribute(a).map_err(|e| e.to_string());
    if attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)? != 1 {
        return Err(format!("GPU {} has no multicast", device.ordinal));
    }
    if attribute(
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    )? != 1
    {
        return Err(format!(
            "GPU {} has no POSIX-fd memory handles",
            device.ordinal
        ));
    }
    let multicast = multicast_granularity(device, ranks as u32).map_err(|e| e.to_string())?;
    let memory = allocation_granularity(device).map_err(|e| e.to_string())?;
    if multicast == 0 || memory == 0 {
        return Err("a granularity of 0".into());
    }
    Ok([multicast as u64, memory as u64])
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `bytes` rounded up to a multiple of every granularity gathered; `None` on overflow.
fn team_bytes(bytes: usize, granularities: &[[u64; 2]]) -> Option<usize> {
    let mut unit: u64 = 1;
    for &g in granularities.iter().flatten() {
        unit = unit.checked_mul(g / gcd(unit, g))?;
    }
    let unit = usize::try_from(unit).ok()?;
    bytes.max(1).checked_next_multiple_of(unit)
}

/// The bytes per GPU a team of `ranks` GPUs like `device` would bind for a request of `bytes`:
/// rounded up to its granularities (what `stragglar doctor` reports), or why it has none.
pub fn bytes_on(device: &Device, ranks: usize, bytes: usize) -> Result<usize, String> {
    let granularities = probe(device, ranks)?;
    team_bytes(bytes, &[granularities]).ok_or_else(|| "the size overflows".into())
}

/// Takes this rank's part in a team it cannot even try (its GPU or kernels unavailable): the
/// first all-gather, failing, so its peers decline at once instead of waiting for it.
pub fn decline<E: Exchange>(exchange: &mut E) -> Declined {
    match gather(exchange, Step::Probe, false, [0; 2]) {
        Err(declined) => declined,
        Ok(_) => Declined::Exchange("a failed probe was gathered as a success".into()),
    }
}

/// Forms the team for this rank (see the module's documentation): the same outcome on every
/// rank of the exchange.
pub fn form<E: Exchange>(
    exchange: &mut E,
    device: &Arc<Device>,
    request: &TeamRequest<'_>,
) -> Result<Team, Declined> {
    let (rank, ranks) = (request.rank, request.ranks);
    // 1. Probe.
    let probed = attempt(rank, Step::Probe, || probe(device, ranks));
    let granularities = gather(
        exchange,
        Step::Probe,
        probed.is_some(),
        probed.unwrap_or([0; 2]),
    )?;
    let size = team_bytes(request.bytes, &granularities);
    // 2. Count: the rounded size, before anything is made.
    let counted = attempt(rank, Step::Count, || match request.counted {
        true => {
            let bytes = size.ok_or("the size overflows")?;
            Reservation::try_take(device.ordinal, bytes as u64)
                .map(Some)
                .map_err(|over| over.to_string())
        }
        false => Ok(None),
    });
    gather(exchange, Step::Count, counted.is_some(), [0; 2])?;
    let counted = counted.flatten();
    // 3. Create (rank 0), the socket listening before any peer looks for it.
    let created = match rank {
        0 => attempt(rank, Step::Create, || {
            let bytes = size.ok_or("the size overflows")?;
            let slot = slots::take(&slots::host_dir(), crate::config::get().multicast_objects)?;
            log::debug!(
                "multicast team: object slot {} of this host's",
                slot.index()
            );
            let server = FdServer::bind(request.socket).map_err(|e| e.to_string())?;
            let object =
                MulticastObject::create(device, ranks as u32, bytes).map_err(|e| e.to_string())?;
            let fd = object.export().map_err(|e| e.to_string())?;
            Ok(Some((slot, server, object, fd)))
        }),
        _ => Some(None),
    };
    gather(exchange, Step::Create, created.is_some(), [0; 2])?;
    let created = created.flatten();
    // 4. Join: the fd to every peer, every device added.
    let object = attempt(rank, Step::Join, || {
        let bytes = size.ok_or("the size overflows")?;
        let (object, slot) = match created {
            // (Bound slot first, so dropped last, after the object, on an error below.)
            Some((slot, server, object, fd)) => {
                server
                    .serve(std::os::fd::AsFd::as_fd(&fd), ranks - 1, request.deadline)
                    .map_err(|e| format!("passing the fd to the peers: {e}"))?;
                (object, Some(slot))
            }
            None => {
                let fd = receive(request.socket, request.deadline)
                    .map_err(|e| format!("receiving the fd from rank 0: {e}"))?;
                let object = MulticastObject::import(device, std::os::fd::AsFd::as_fd(&fd), bytes)
                    .map_err(|e| e.to_string())?;
                (object, None)
            }
        };
        object.add_device().map_err(|e| e.to_string())?;
        Ok((object, slot))
    });
    gather(exchange, Step::Join, object.is_some(), [0; 2])?;
    // 5. Bind and map: every device was added, so nothing here blocks.
    let team = object.and_then(|(mut object, slot)| {
        attempt(rank, Step::Bind, || {
            let bytes = object.bytes;
            let memory = Physical::create(device, bytes).map_err(|e| e.to_string())?;
            object.bind(&memory).map_err(|e| e.to_string())?;
            let multicast = object.map().map_err(|e| e.to_string())?;
            let unicast = memory.map().map_err(|e| e.to_string())?;
            Ok(Team {
                multicast,
                unicast,
                _object: object,
                _memory: memory,
                bytes,
                _counted: counted,
                _slot: slot,
            })
        })
    });
    gather(exchange, Step::Bind, team.is_some(), [0; 2])?;
    let team = team.ok_or(Declined::Failed {
        step: Step::Bind,
        rank,
    })?;
    // 6. Every rank's probe stores its pattern through the object.
    let token = team_token(request.socket);
    let stored = attempt(rank, Step::Store, || {
        store_probe(device, request.probe, &team, rank, token)
    });
    gather(exchange, Step::Store, stored.is_some(), [0; 2])?;
    // 7. Every probe finished: every pattern must be in every rank's memory.
    let seen = attempt(rank, Step::Check, || {
        check_probe(&team, request.ranks, token)
    });
    gather(exchange, Step::Check, seen.is_some(), [0; 2])?;
    Ok(team)
}

/// The probe's token: the same on every rank (from the team's socket name, unique per team),
/// so a pattern left in memory by an earlier team cannot pass for this one's.
fn team_token(socket: &str) -> u32 {
    // FNV-1a.
    socket.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// The pattern rank `rank`'s probe stores: 16 bytes, two of its f32 lanes NaN patterns.
fn pattern(token: u32, rank: usize) -> [u8; 16] {
    let rank = rank as u32;
    let mut out = [0u8; 16];
    for (i, word) in [token, rank, !token, !rank].into_iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&word.to_le_bytes());
    }
    out
}

/// Launches this rank's probe on the device's side stream and waits for it.
fn store_probe(
    device: &Device,
    probe: &Kernel,
    team: &Team,
    rank: usize,
    token: u32,
) -> Result<(), String> {
    let args = RawMulticastProbe {
        multicast: team.multicast.ptr,
        token,
        rank: rank as u32,
    };
    let side = device.side_stream().map_err(|e| e.to_string())?;
    // SAFETY: the arguments name the team's multicast mapping, which lives until the team is
    // dropped, after the side stream was synchronised below.
    unsafe { probe.launch(side, 1, 32, &args) }.map_err(|e| e.to_string())?;
    device.synchronize_side().map_err(|e| e.to_string())
}

/// Reads this rank's memory and finds every rank's pattern in its slot.
fn check_probe(team: &Team, ranks: usize, token: u32) -> Result<(), String> {
    let mut slots = vec![0u8; 16 * ranks];
    team.unicast.read(&mut slots).map_err(|e| e.to_string())?;
    for (r, slot) in slots.chunks(16).enumerate() {
        let want = pattern(token, r);
        if slot != want {
            return Err(format!(
                "slot {r} holds {slot:02x?}, not rank {r}'s pattern {want:02x?}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_is_a_multiple_of_every_granularity() {
        let mib = 1 << 20;
        assert_eq!(team_bytes(1, &[[2 * mib, 2 * mib]]), Some(2 * mib as usize));
        assert_eq!(
            team_bytes(5 << 20, &[[2 * mib, 2 * mib], [2 * mib, 3 * mib]]),
            Some(6 << 20)
        );
        assert_eq!(team_bytes(usize::MAX, &[[2 * mib, 2 * mib]]), None);
    }

    #[test]
    fn the_probe_pattern_is_the_kernels() {
        // {token, rank, !token, !rank}, little-endian words, as sg_multicast_probe stores it.
        let p = pattern(0x0102_0304, 5);
        assert_eq!(&p[..4], &[4, 3, 2, 1]);
        assert_eq!(&p[4..8], &[5, 0, 0, 0]);
        assert_eq!(&p[8..12], &[0xfb, 0xfc, 0xfd, 0xfe]);
        assert_eq!(&p[12..], &[0xfa, 0xff, 0xff, 0xff]);
        assert_eq!(team_token("a"), team_token("a"));
        assert_ne!(team_token("a"), team_token("b"));
    }

    #[test]
    fn a_failure_names_the_step_and_the_first_rank() {
        let text = Declined::Failed {
            step: Step::Join,
            rank: 3,
        }
        .to_string();
        assert_eq!(
            text,
            "rank 3 could not join the multicast object (receive its fd, import it, add its GPU)"
        );
    }
}
