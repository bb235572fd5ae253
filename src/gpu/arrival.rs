//! The `#[repr(C)]` arrival records (the board in rank 0's staging, each rank's host-mapped
//! ring, its notes and the ticket kernel's arguments), shared with `cuda/` through the
//! generated header `cuda/stragglar_launch.h` like the launch arguments.

/// Slots of the arrival board: call `c` uses slot `c % BOARD_SLOTS`. Every rank's ticket of
/// call `c - 2` is taken before any rank starts call `c` (a rank starting `c` finished `c - 1`,
/// which needed every rank to have started it, so to have finished `c - 2`), so 4 slots never
/// mix two calls.
pub const BOARD_SLOTS: u32 = 4;

/// Entries of a rank's host-mapped record ring: the record of call `c` is at `c % RING_ENTRIES`
/// from the start of this rank's call `c + 1` until that of call `c + 1 + RING_ENTRIES`.
pub const RING_ENTRIES: u32 = 64;

/// One slot of the arrival board (in rank 0's staging; 32 bytes). The packed words hold a tag,
/// `(call % 0xffffffff) + 1`, in their high 32 bits, so a reader knows which call wrote them.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawBoardSlot {
    /// Tickets taken in this slot over all its calls: call `c` hands out
    /// `(c / BOARD_SLOTS) * ranks ..` onwards, its arrival order.
    pub arrived: u64,
    /// Tag and the rank that arrived last (written by that rank).
    pub last: u64,
    /// Tag and the lead in nanoseconds, saturated to `u32::MAX` (written by the second-to-last
    /// arrival, which measured it on its own clock from its ticket to the last ticket).
    pub lead: u64,
    /// Tag and the call's post-arrival time in nanoseconds: from the last arrival's ticket (or
    /// its kernel's start, if earlier) to the end of that rank's call, on its own clock, at most `POST_UNMEASURED - 1`, or
    /// [`POST_UNMEASURED`]. Written by the last arrival at its next ticketed call, from its
    /// [`RawArrivalNote`].
    pub post: u64,
}

/// The low half of a `post` word when the last arrival could not time its call's end (a call
/// NCCL ran whose end kernel was never queued, see `RawTicket`).
pub const POST_UNMEASURED: u32 = 0xffff_ffff;

/// One call's record in a rank's host-mapped ring: the board slot's `last` and `lead` words,
/// copied by that rank's next ticketed launch once both carry the call's tag, and its `post`
/// word, copied by the launch after that (the last arrival publishes it at its next call).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawRingEntry {
    pub last: u64,
    pub lead: u64,
    pub post: u64,
}

/// What one rank remembers of a ticketed call, in its own device memory, so that its next
/// ticketed launch can publish the call's post-arrival time (`RawBoardSlot::post`) when it
/// arrived last. Only this rank's kernels touch it; a rank keeps two, by call parity, so that
/// a call's blocks noting it never share a word with its arrival thread reading the previous
/// call's.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawArrivalNote {
    /// The tag of the latest call at which this rank took the last ticket.
    pub last: u64,
    /// Its `%globaltimer` at that ticket (nanoseconds).
    pub arrived_at: u64,
    /// The tag of the latest AllReduce kernel this rank started, and its `%globaltimer` then
    /// (block 0's start): the call's start when the arrival thread took its ticket after the
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
    pub reserved: u32,
    /// `RawArrivalNote[2]`: this rank's, in its own device memory, call `c` at `c % 2` (eager
    /// calls and graph launches keep a pair each).
    pub note: u64,
}

/// The ticket kernel (`ncclStragglarTicket`, one block): the arrival record of a call that
/// goes to NCCL, so the policy keeps seeing arrivals while it forwards. Only the second-to-last
/// arrival waits (for the last, as NCCL's kernel would); the others return at once. Its spins
/// watch the abort word and every rank's failure word like the AllReduce kernel's. The same
/// arguments, queued after NCCL's kernel, make the end kernel (`ncclStragglarTicketEnd`), which
/// notes when the call finished on this rank (`RawArrivalNote::finished`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawTicket {
    pub arrival: RawArrival,
    /// As in `RawLaunch`.
    pub abort: u64,
    pub status: u64,
    /// `const RawPeer[ranks]`: every rank's failure word (this rank's is raised with `status`).
    pub peers: u64,
    /// As in `RawLaunch`; the library passes 0 (a call NCCL runs waits as long as NCCL's).
    pub timeout_ns: u64,
    pub rank: u32,
    pub reserved: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(std::mem::size_of::<RawArrival>(), 40);
        assert_eq!(std::mem::size_of::<RawTicket>(), 80);
        assert_eq!(std::mem::size_of::<RawArrivalNote>(), 48);
        assert_eq!(std::mem::size_of::<RawBoardSlot>(), 32);
        // `CudaRank::board_settled` reads the tags at these offsets.
        assert_eq!(std::mem::offset_of!(RawBoardSlot, last), 8);
        assert_eq!(std::mem::offset_of!(RawBoardSlot, lead), 16);
        assert_eq!(std::mem::size_of::<RawRingEntry>(), 24);
    }
}
