//! A rank's arrival records: tickets (the arrival record of a call NCCL runs), the ring its
//! launches copy finished records into, and feeding the due ones to the policy.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{CallError, CudaRank};
use crate::detect::{ArrivalRecord, Observed, Tracker};
use crate::gpu::arrival::{
    RawArrival, RawBoardSlot, RawRingEntry, RawTicket, BOARD_SLOTS, POST_UNMEASURED, RING_ENTRIES,
};
use crate::gpu::choice::RawGraphState;
use crate::gpu::launch::{STATUS_ABORTED, STATUS_OK};

/// How long a host waits for a due arrival record before it says so in the log (it keeps
/// waiting: the record comes unless a rank is stuck, and then the abort word, which a watchdog
/// raises, releases it).
const RECORD_WAIT_WARN: Duration = Duration::from_secs(60);

/// The tag the kernels put in the high half of call `call`'s packed record words
/// (`sg_tag` in cuda/stragglar_arrival.h).
fn record_tag(call: u64) -> u64 {
    ((call % 0xffff_ffff) + 1) << 32
}

/// A ticketed call's arrival record as this rank's ring holds it, with the call's
/// post-arrival time in nanoseconds (`None`: not measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedRecord {
    pub record: ArrivalRecord,
    pub post_ns: Option<u64>,
}

/// The arguments of a queued ticket kernel, for its end kernel ([`CudaRank::ticket_end`]).
#[derive(Debug, Clone, Copy)]
pub struct Ticket(RawTicket);

impl CudaRank {
    /// Ticketed calls launched so far: the next ticketed call's number.
    pub fn arrivals(&self) -> u64 {
        self.arrivals
    }

    /// The arrival record of ticketed call `call` and its post-arrival time, once this rank's
    /// ring holds both (from the start of this rank's call `call + 2` on, until call
    /// `call + RING_ENTRIES` overwrites them). Identical on every rank: each copies the same
    /// board words.
    pub fn record(&self, call: u64) -> Option<TimedRecord> {
        const WORDS: usize = std::mem::size_of::<RawRingEntry>() / 8;
        let entry = (call % RING_ENTRIES as u64) as usize * WORDS;
        let tag = record_tag(call);
        let word = |i: usize| self.ring.word64(entry + i).load(Ordering::Acquire);
        let [last, lead, post] = [word(0), word(1), word(2)];
        let tagged = |w: u64| w & !0xffff_ffff == tag;
        let post_ns = post & 0xffff_ffff;
        (tagged(last) && tagged(lead) && tagged(post)).then_some(TimedRecord {
            record: ArrivalRecord {
                last_rank: (last & 0xffff_ffff) as usize,
                lead_ns: lead & 0xffff_ffff,
            },
            post_ns: (post_ns != u64::from(POST_UNMEASURED)).then_some(post_ns),
        })
    }

    /// Whether every rank's arrival protocol is over: the record of the last ticketed call is
    /// complete on rank 0's board, so no rank still spins on a ticket (reading every rank's
    /// failure word) or writes to the board. A read that fails counts as settled: nothing
    /// better can be known. Read through rank 0's board as this rank maps it.
    /// The graph board is read alike, up to the graph calls this rank's GPU completed.
    pub fn board_settled(&self) -> bool {
        let calls = self.config.layout.graph() + std::mem::offset_of!(RawGraphState, calls) as u64;
        let word = |at: u64| self.staging.read_u32(at).map(u64::from);
        let graph_calls = match (word(calls), word(calls + 4)) {
            (Ok(low), Ok(high)) => low | high << 32,
            _ => 0,
        };
        self.settled(self.board, self.arrivals) && self.settled(self.graph_board, graph_calls)
    }

    /// Whether the record of call `calls - 1` is complete on `board`.
    fn settled(&self, board: u64, calls: u64) -> bool {
        if calls == 0 || board == 0 {
            return true;
        }
        let call = calls - 1;
        let slot = board + (call % BOARD_SLOTS as u64) * std::mem::size_of::<RawBoardSlot>() as u64;
        let tag = (record_tag(call) >> 32) as u32;
        // The high halves of the slot's `last` (offset 8) and `lead` (offset 16) words.
        [slot + 12, slot + 20].iter().all(|&at| {
            // SAFETY: rank 0's board, this rank's own staging or a mapping of it that stays
            // open while this rank is connected (the contract of `connect`).
            match unsafe { crate::engine::cuda::driver::read_word(&self.device, at) } {
                Ok(t) => t == tag,
                Err(_) => true,
            }
        })
    }

    /// Waits until the ring holds the record of ticketed call `call`, which launches this rank
    /// already made copy there (the starts of calls `call + 1` and `call + 2`). Gives up on an abort or a
    /// kernel failure of this rank: the kernels apply `STRAGGLAR_TIMEOUT_MS` to their own
    /// waits, and the host does not time the GPU, which may rightly be many calls behind.
    pub fn await_record(&self, call: u64) -> Result<TimedRecord, CallError> {
        debug_assert!(
            call + 2 < self.arrivals,
            "record {call} has no launch to copy it"
        );
        let control = self.control();
        let started = std::time::Instant::now();
        let mut warned = false;
        for spin in 0u64.. {
            if let Some(record) = self.record(call) {
                return Ok(record);
            }
            if control.status() != STATUS_OK {
                return Err(CallError::Failed(control.status()));
            }
            if control.aborted() {
                return Err(CallError::Failed(STATUS_ABORTED));
            }
            let waited = started.elapsed();
            if !warned && waited > RECORD_WAIT_WARN {
                warned = true;
                log::warn!(
                    "still waiting after {} s for the arrival record of call {call}: a rank of this communicator is stuck",
                    waited.as_secs()
                );
            }
            if spin < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        unreachable!("the loop returns")
    }

    /// Feeds `tracker` every due record and post-arrival time from this rank's ring, waiting
    /// for each (see [`CudaRank::await_record`]), and hands each record and what it changed to
    /// `each`. Returns how long it waited for records the GPU had not written yet.
    pub fn feed_due(
        &self,
        tracker: &mut Tracker,
        mut each: impl FnMut(&TimedRecord, Observed),
    ) -> Result<Duration, CallError> {
        let mut waited = Duration::ZERO;
        while let Some(call) = tracker.due() {
            let record = match self.record(call) {
                Some(record) => record,
                None => {
                    let started = std::time::Instant::now();
                    let record = self.await_record(call)?;
                    waited += started.elapsed();
                    record
                }
            };
            let Some(observed) = tracker.feed(record.record) else {
                break;
            };
            tracker.feed_time(record.post_ns);
            each(&record, observed);
        }
        Ok(waited)
    }

    /// Where the next launch records its arrival (a ticket), or a launch that takes none.
    pub(super) fn arrival(&self, ticket: bool) -> RawArrival {
        if !ticket {
            return RawArrival::default();
        }
        RawArrival {
            board: self.board,
            ring: self.ring.device_address(0),
            call: self.arrivals,
            ranks: self.config.ranks as u32,
            reserved: 0,
            note: self.staging.ptr + self.config.layout.arrival_note(),
        }
    }

    pub(super) fn timeout_ns(&self) -> u64 {
        self.config
            .timeout
            .map_or(0, |t| t.as_nanos().max(1) as u64)
    }

    /// Queues the ticket kernel on `stream`: the arrival record of a call that goes to NCCL.
    /// Returns the call's ticket, which [`CudaRank::ticket_end`] takes once NCCL's kernel is
    /// queued. Fails fast once a kernel of this rank gave up.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device, not capturing (a replayed ticket would
    /// put the ring's numbering out of step with this rank's).
    pub unsafe fn ticket(
        &mut self,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<Ticket, CallError> {
        // The call is NCCL's: its ticket waits for the last arrival as long as NCCL would.
        // SAFETY: as the caller vouches.
        unsafe { self.ticket_within(stream, 0) }
    }

    /// [`CudaRank::ticket`] whose wait for the last arrival gives up after `timeout_ns` (0:
    /// never).
    ///
    /// # Safety
    /// As [`CudaRank::ticket`].
    pub(super) unsafe fn ticket_within(
        &mut self,
        stream: cudarc::driver::sys::CUstream,
        timeout_ns: u64,
    ) -> Result<Ticket, CallError> {
        self.fail_fast()?;
        let args = self.site()?.ticket(self.arrival(true), timeout_ns);
        // SAFETY: every address in `args` is live memory of this rank (staging, rank 0's
        // mapped board, host words); the caller vouches for the stream.
        unsafe { self.kernels.ticket.launch(stream, 1, 32, &args) }?;
        self.arrivals += 1;
        Ok(Ticket(args))
    }

    /// Queues the end kernel of `ticket`'s call on `stream`, after the call's own work (NCCL's
    /// kernel): it notes when the call finished on this rank, for its post-arrival time. A
    /// ticketed call whose end is never queued is published as unmeasured, which is safe.
    ///
    /// # Safety
    /// As [`CudaRank::ticket`]; `stream` orders the end after the call's work.
    pub unsafe fn ticket_end(
        &self,
        ticket: Ticket,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CallError> {
        // SAFETY: the note is this rank's staging; the caller vouches for the stream.
        unsafe { self.kernels.ticket_end.launch(stream, 1, 32, &ticket.0) }?;
        Ok(())
    }
}
