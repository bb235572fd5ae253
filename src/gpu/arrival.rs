//! The `#[repr(C)]` arrival records (the board in rank 0's staging, each rank's host-mapped
//! ring, its notes and the ticket kernel's arguments), shared with `cuda/` through the
//! generated header `cuda/stragglar_launch.h` like the launch arguments.

/// Slots of the arrival board: call `c` uses slot `c % BOARD_SLOTS`. A rank taking its ticket
/// of call `c` finished `c - 1`, which needed every rank to have started it, so to have
/// finished every launch of call `c - 2` (tickets, end kernels, collections). A launch of call
/// `c` collects records of calls `c - 1 - collect ..= c - 2` while no rank is past the ticket
/// of `c + 1`, which reuses the slot of `c + 1 - BOARD_SLOTS`: with at most
/// [`MAX_UNCOLLECTED`] records collected at once, the slots never mix two calls.
pub const BOARD_SLOTS: u32 = 32;

/// Records one launch may collect at most (`RawArrival::collect`): a rank that would have to
/// collect more gives the engine up rather than read a reused slot. Eager StragglAR launches
/// and measured calls NCCL runs collect; a call NCCL runs is measured whenever the records
/// waiting would reach [`COLLECT_BY`], so this bound is reached only when end kernels could not
/// be queued (`BOARD_SLOTS - 3` is the most the slots allow, see [`BOARD_SLOTS`]).
pub const MAX_UNCOLLECTED: u64 = BOARD_SLOTS as u64 - 3;

/// Records waiting to be collected at which the next call NCCL runs is measured (its end
/// kernel collects them) even when the sample would skip it.
pub const COLLECT_BY: u64 = 16;

/// One call NCCL runs in `MEASURE_ONE_IN` is measured (a deterministic sample, alike on every
/// rank: [`measures`]); the others run the ticket kernel alone.
pub const MEASURE_ONE_IN: u64 = 8;

/// Whether ticketed call `call`, if NCCL runs it, is in the sample whose end kernels measure it
/// (the post-arrival time and the lead) and collect records. A hash of the call number, not
/// its remainder, so that a job whose step makes a fixed number of calls still samples every
/// one of its sizes.
pub fn measures(call: u64) -> bool {
    let mut x = call.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) % MEASURE_ONE_IN == 0
}

/// Entries of a rank's host-mapped record ring: the record of call `c` is at `c % RING_ENTRIES`
/// from the end of the first collecting launch of this rank at least two calls later (eager
/// calls; graph calls: from the next graph launch) until call `c + RING_ENTRIES`'s record is
/// copied over it.
pub const RING_ENTRIES: u32 = 64;

/// One slot of the arrival board (in rank 0's staging; 40 bytes). The packed words hold a tag,
/// `(call % 0xffffffff) + 1`, in their high 32 bits, so a reader knows which call wrote them.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawBoardSlot {
    /// Tickets taken in this slot over all its calls: call `c` hands out
    /// `(c / BOARD_SLOTS) * ranks ..` onwards, its arrival order.
    pub arrived: u64,
    /// Tag and the rank that arrived last (written by that rank).
    pub last: u64,
    /// Tag and the lead in nanoseconds, saturated to `LEAD_FROM_SPANS - 1` (written by the
    /// second-to-last arrival of a StragglAR launch, which measured it on its own clock from
    /// its ticket to the last ticket), or [`LEAD_FROM_SPANS`] (written by the second-to-last
    /// arrival of a call NCCL runs, which waits for nobody).
    pub lead: u64,
    /// Tag and the call's post-arrival time in nanoseconds: from the last arrival's ticket (or
    /// its kernel's start, if earlier) to the end of that rank's call, on its own clock, at most `POST_UNMEASURED - 1`, or
    /// [`POST_UNMEASURED`]. Written by the last arrival at its next ticketed call, from its
    /// [`RawArrivalNote`].
    pub post: u64,
    /// Tag and the second-to-last arrival's own time from its ticket (or its kernel's start)
    /// to its call's end, like `post` (written by that rank at its next ticketed call). Where
    /// the lead is [`LEAD_FROM_SPANS`] the lead is this minus `post`: both ranks leave NCCL's
    /// kernel together, so the difference of their two times is how much later the last one
    /// arrived, with no two clocks compared.
    pub span: u64,
}

/// The low half of a `lead` word of a call NCCL ran: the lead is `span - post`, measured only
/// where both are ([`measures`]).
pub const LEAD_FROM_SPANS: u32 = 0xffff_ffff;

/// The low half of a `post` word when the last arrival could not time its call's end (a call
/// NCCL ran whose end kernel was never queued, see `RawTicket`).
pub const POST_UNMEASURED: u32 = 0xffff_ffff;

/// One call's record in a rank's host-mapped ring: the board slot's words, each copied once it
/// carries the call's tag. Eager calls: by the first collecting launch of this rank at least
/// two calls later (`RawArrival::collect`). Graph calls: `last` and `lead` by the next graph
/// launch, `post` by the one after (`span` is not copied).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawRingEntry {
    pub last: u64,
    pub lead: u64,
    pub post: u64,
    pub span: u64,
}

/// What one rank remembers of a ticketed call, in its own device memory, so that its next
/// ticketed launch can publish the call's post-arrival time (`RawBoardSlot::post`) when it
/// arrived last, or its span (`RawBoardSlot::span`) when it arrived second-to-last. Only this rank's kernels touch it; a rank keeps two, by call parity, so that
/// a call's blocks noting it never share a word with its arrival thread reading the previous
/// call's.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawArrivalNote {
    /// The tag of the latest call at which this rank took a ticket, and its arrival position
    /// in the low half (`ranks - 1` for the last).
    pub arrived: u64,
    /// Its `%globaltimer` at that ticket (nanoseconds).
    pub arrived_at: u64,
    /// The tag of the latest AllReduce kernel this rank started, and its `%globaltimer` then
    /// (plan block 0's start): the call's start when the arrival thread took its ticket after the
    /// plan had begun (or even finished): its protocol first waits for earlier calls' records.
    pub started: u64,
    pub started_at: u64,
    /// The tag of the latest call this rank finished: its AllReduce kernel's last plan block,
    /// or the ticket kernel's end kernel after NCCL's.
    pub finished: u64,
    /// Its `%globaltimer` then (nanoseconds).
    pub finished_at: u64,
}

/// Where a launch records its arrival (part of `RawLaunch` and [`RawTicket`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawArrival {
    /// `RawBoardSlot[BOARD_SLOTS]`: rank 0's board as this rank sees it; 0 takes no ticket.
    pub board: u64,
    /// `RawRingEntry[RING_ENTRIES]`: this rank's host-mapped ring.
    pub ring: u64,
    /// The call's number among this communicator's ticketed calls (0, 1, ...), the same on
    /// every rank.
    pub call: u64,
    /// The communicator's size.
    pub ranks: u32,
    /// Records this launch copies into the ring: those of calls `call - 1 - collect ..=
    /// call - 2`, waiting for each word's tag (at most [`MAX_UNCOLLECTED`]; 0 for a ticket
    /// kernel, which waits for nobody). Graph launches copy their own way (`RawRingEntry`).
    pub collect: u32,
    /// `RawArrivalNote[2]`: this rank's, in its own device memory, call `c` at `c % 2` (eager
    /// calls and graph launches keep a pair each).
    pub note: u64,
}

/// The ticket kernel (`ncclStragglarTicket`, one thread): the arrival record of a call that
/// goes to NCCL, so the policy keeps seeing arrivals while it forwards. It waits for nobody (no
/// loop in its code: `tests/nvrtc.rs`): it publishes what this rank noted of its previous call,
/// takes the ticket and, arriving last, writes its rank. The same arguments, queued after
/// NCCL's kernel on the measured calls only ([`measures`]), make the end kernel
/// (`ncclStragglarTicketEnd`, one warp), which notes when the call finished on this rank
/// (`RawArrivalNote::finished`, unless `end` is [`END_COLLECTS_ONLY`]) and collects the
/// records waiting (`RawArrival::collect`); its waits watch the abort word and every rank's
/// failure word like the AllReduce kernel's.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawTicket {
    pub arrival: RawArrival,
    /// As in `RawLaunch`.
    pub abort: u64,
    pub status: u64,
    /// `const RawPeer[ranks]`: every rank's failure word (this rank's is raised with `status`).
    pub peers: u64,
    /// As in `RawLaunch`, for the end kernel's collection; the library passes 0 (records of
    /// calls NCCL finished are waited for as long as NCCL would).
    pub timeout_ns: u64,
    pub rank: u32,
    /// 0, or [`END_COLLECTS_ONLY`].
    pub end: u32,
}

/// `RawTicket::end` of an end kernel queued late (a nonblocking call's, once NCCL launched):
/// it collects records but does not note the call's end, which is long past.
pub const END_COLLECTS_ONLY: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(std::mem::size_of::<RawArrival>(), 40);
        assert_eq!(std::mem::size_of::<RawTicket>(), 80);
        assert_eq!(std::mem::size_of::<RawArrivalNote>(), 48);
        assert_eq!(std::mem::size_of::<RawBoardSlot>(), 40);
        // `CudaRank::board_settled` reads the tags at these offsets.
        assert_eq!(std::mem::offset_of!(RawBoardSlot, last), 8);
        assert_eq!(std::mem::offset_of!(RawBoardSlot, lead), 16);
        assert_eq!(std::mem::size_of::<RawRingEntry>(), 32);
    }

    #[test]
    fn the_sample_measures_about_one_call_in_eight_at_every_phase() {
        // A job whose step makes 8 calls (or 4, or 16) still measures each of them.
        for period in [4u64, 8, 16] {
            for phase in 0..period {
                let measured = (0..4096).filter(|i| measures(i * period + phase)).count() as f64;
                let share = measured / 4096.0;
                assert!((0.09..0.16).contains(&share), "{period}/{phase}: {share}");
            }
        }
    }
}
