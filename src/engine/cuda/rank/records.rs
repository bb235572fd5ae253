//! A rank's arrival records: tickets (the arrival record of a call NCCL runs), the ring its
//! launches copy finished records into, and feeding the due ones to the policy.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{CallError, CudaRank};
use crate::detect::{ArrivalRecord, Observed, Tracker};
use crate::gpu::arrival::{
    measures, RawArrival, RawBoardSlot, RawRingEntry, RawTicket, BOARD_SLOTS, COLLECT_BY,
    END_COLLECTS_ONLY, LEAD_FROM_SPANS, MAX_UNCOLLECTED, POST_UNMEASURED, RING_ENTRIES,
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

/// Records waiting for a collection past which the next call collects them before anything
/// else (`CudaRank::collect_late`): reached only when measured calls' end kernels were not
/// queued (a nonblocking call's), since a call NCCL runs is measured at [`COLLECT_BY`].
const OVERDUE: u64 = COLLECT_BY + 2;
const _: () = assert!(OVERDUE + 1 < MAX_UNCOLLECTED && MAX_UNCOLLECTED + 3 <= BOARD_SLOTS as u64);

/// The most calls after its own at which a record is collected: by the overdue collection,
/// queued by the call at which `OVERDUE + 1` records wait, which collects up to two calls
/// before it.
pub const OVERDUE_CALLS: u64 = OVERDUE + 2;

/// The arguments of a queued ticket kernel, for its end kernel ([`CudaRank::ticket_end`]), and
/// whether the call is measured (its end kernel is queued after NCCL's).
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    args: RawTicket,
    measured: bool,
}

impl Ticket {
    /// Whether the call's end kernel is to be queued after NCCL's: a deterministic sample of
    /// the calls (alike on every rank), and whenever records have waited long for collection.
    pub fn measured(&self) -> bool {
        self.measured
    }

    /// The same ticket, whose end kernel collects but notes no end: for a call of no elements,
    /// which runs no collective, so that its span and post-arrival time (and the lead worked
    /// out from them) say nothing and are published unmeasured.
    pub(super) fn untimed(mut self) -> Ticket {
        self.args.end = END_COLLECTS_ONLY;
        self
    }
}

impl CudaRank {
    /// Ticketed calls launched so far: the next ticketed call's number.
    pub fn arrivals(&self) -> u64 {
        self.arrivals
    }

    /// Ticketed calls whose records a queued launch collects: records `0..collected()`.
    pub fn collected(&self) -> u64 {
        self.collected
    }

    /// The arrival record of ticketed call `call` and its post-arrival time, once this rank's
    /// ring holds them (once the collecting launch its GPU runs at least two calls later has
    /// run, until call `call + RING_ENTRIES`'s record overwrites them). Identical on every
    /// rank: each copies the same board words.
    pub fn record(&self, call: u64) -> Option<TimedRecord> {
        const WORDS: usize = std::mem::size_of::<RawRingEntry>() / 8;
        let entry = (call % RING_ENTRIES as u64) as usize * WORDS;
        let tag = record_tag(call);
        let word = |i: usize| self.ring.word64(entry + i).load(Ordering::Acquire);
        let words = [word(0), word(1), word(2), word(3)];
        if words.iter().any(|w| w & !0xffff_ffff != tag) {
            return None;
        }
        Some(timed_record(words.map(|w| w & 0xffff_ffff)))
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

    /// Waits until the ring holds the record of ticketed call `call`, which a launch this rank
    /// already queued collects. Gives up on an abort or a
    /// kernel failure of this rank: the kernels apply `STRAGGLAR_TIMEOUT_MS` to their own
    /// waits, and the host does not time the GPU, which may rightly be many calls behind.
    pub fn await_record(&self, call: u64) -> Result<TimedRecord, CallError> {
        debug_assert!(
            call < self.collected,
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

    /// Where the next launch records its arrival (a ticket), collecting `collect` records, or
    /// a launch that takes none.
    pub(super) fn arrival(&self, ticket: bool, collect: u32) -> RawArrival {
        if !ticket {
            return RawArrival::default();
        }
        RawArrival {
            board: self.board,
            ring: self.ring.device_address(0),
            call: self.arrivals,
            ranks: self.config.ranks as u32,
            collect,
            note: self.staging.ptr + self.config.layout.arrival_note(),
        }
    }

    /// Records a collecting launch of call `call` would copy: those of calls
    /// `collected ..= call - 2`.
    fn waiting(&self, call: u64) -> u64 {
        call.saturating_sub(1).saturating_sub(self.collected)
    }

    /// How many records a collecting launch of call `call` copies, within the bound the
    /// board's slots allow.
    pub(super) fn collect_count(&self, call: u64) -> Result<u32, CallError> {
        let waiting = self.waiting(call);
        if waiting > MAX_UNCOLLECTED {
            return Err(CallError::Unfit(format!(
                "{waiting} arrival records wait for a collection (at most {MAX_UNCOLLECTED})"
            )));
        }
        Ok(waiting as u32)
    }

    /// Notes that a launch of call `call` collecting was queued.
    pub(super) fn collecting(&mut self, call: u64) {
        self.collected = self.collected.max(call.saturating_sub(1));
    }

    pub(super) fn timeout_ns(&self) -> u64 {
        self.config
            .timeout
            .map_or(0, |t| t.as_nanos().max(1) as u64)
    }

    /// Queues the ticket kernel on `stream`: the arrival record of a call that goes to NCCL,
    /// which waits for nobody. Returns the call's ticket, whose end kernel
    /// [`CudaRank::ticket_end`] queues after NCCL's kernel when the ticket is measured: on the
    /// sample ([`measures`]), when `time_wanted` (the policy asks for this call's time), or
    /// when [`COLLECT_BY`] records wait for a collection.
    /// Fails fast once a kernel of this rank gave up.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device, not capturing (a replayed ticket would
    /// put the ring's numbering out of step with this rank's).
    pub unsafe fn ticket(
        &mut self,
        stream: cudarc::driver::sys::CUstream,
        time_wanted: bool,
    ) -> Result<Ticket, CallError> {
        // The call is NCCL's: its end kernel's collection waits as long as NCCL would.
        // SAFETY: as the caller vouches.
        unsafe { self.ticket_within(stream, 0, time_wanted) }
    }

    /// [`CudaRank::ticket`] whose end kernel's waits give up after `timeout_ns` (0: never).
    ///
    /// # Safety
    /// As [`CudaRank::ticket`].
    pub(super) unsafe fn ticket_within(
        &mut self,
        stream: cudarc::driver::sys::CUstream,
        timeout_ns: u64,
        time_wanted: bool,
    ) -> Result<Ticket, CallError> {
        self.fail_fast()?;
        let call = self.arrivals;
        let measured = time_wanted || measures(call) || self.waiting(call) >= COLLECT_BY;
        let args = self.site()?.ticket(self.arrival(true, 0), timeout_ns);
        // SAFETY: every address in `args` is live memory of this rank (staging, rank 0's
        // mapped board, host words); the caller vouches for the stream.
        unsafe { self.kernels.ticket.launch(stream, 1, 1, &args) }?;
        self.arrivals += 1;
        Ok(Ticket { args, measured })
    }

    /// Queues the end kernel of `ticket`'s call on `stream`, after the call's own work (NCCL's
    /// kernel): it notes when the call finished on this rank, for its post-arrival time and
    /// span, and collects the records waiting. A ticketed call whose end is not queued is
    /// published as unmeasured, which is safe.
    ///
    /// # Safety
    /// As [`CudaRank::ticket`]; `stream` orders the end after the call's work.
    pub unsafe fn ticket_end(
        &mut self,
        ticket: Ticket,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CallError> {
        let mut args = ticket.args;
        args.arrival.collect = self.collect_count(args.arrival.call)?;
        // SAFETY: the note, rank 0's board and the ring are this rank's live memory; the
        // caller vouches for the stream.
        unsafe { self.kernels.ticket_end.launch(stream, 1, 32, &args) }?;
        self.collecting(args.arrival.call);
        Ok(())
    }

    /// Whether records have waited so long for a collection that the next call must queue one
    /// first ([`CudaRank::collect_late`]).
    pub fn collection_overdue(&self) -> bool {
        self.waiting(self.arrivals) > OVERDUE
    }

    /// Queues an end kernel that only collects, as the next ticketed call would: the records
    /// of calls up to `arrivals() - 2`.
    ///
    /// # Safety
    /// As [`CudaRank::ticket`]; `stream` is ordered after this rank's previous launch.
    pub unsafe fn collect_late(
        &mut self,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CallError> {
        self.fail_fast()?;
        let call = self.arrivals;
        let mut args = self
            .site()?
            .ticket(self.arrival(true, self.collect_count(call)?), 0);
        args.end = END_COLLECTS_ONLY;
        // SAFETY: as in `ticket_end`; the kernel writes no note.
        unsafe { self.kernels.ticket_end.launch(stream, 1, 32, &args) }?;
        self.collecting(call);
        Ok(())
    }
}

/// A ring entry's four values (the tags stripped): the lead of a call NCCL ran is its
/// second-to-last arrival's span minus its last arrival's post, where both were measured.
fn timed_record([last, lead, post, span]: [u64; 4]) -> TimedRecord {
    let measured = |v: u64| (v != u64::from(POST_UNMEASURED)).then_some(v);
    let post_ns = measured(post);
    let lead_ns = if lead == u64::from(LEAD_FROM_SPANS) {
        post_ns
            .zip(measured(span))
            .map(|(post, span)| span.saturating_sub(post))
    } else {
        Some(lead)
    };
    TimedRecord {
        record: ArrivalRecord {
            last_rank: last as usize,
            lead_ns,
        },
        post_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lead_of_a_call_nccl_ran_is_the_difference_of_two_spans() {
        let from_spans = u64::from(LEAD_FROM_SPANS);
        let unmeasured = u64::from(POST_UNMEASURED);
        let record = timed_record([2, from_spans, 5_000, 12_000]);
        assert_eq!(record.record.last_rank, 2);
        assert_eq!(record.record.lead_ns, Some(7_000));
        assert_eq!(record.post_ns, Some(5_000));
        // Clocks of one rank only: a span shorter than the post is a lead of 0, not a wrap.
        assert_eq!(
            timed_record([2, from_spans, 5_000, 4_000]).record.lead_ns,
            Some(0)
        );
        assert_eq!(
            timed_record([2, from_spans, unmeasured, 4_000])
                .record
                .lead_ns,
            None
        );
        assert_eq!(
            timed_record([2, from_spans, 5_000, unmeasured])
                .record
                .lead_ns,
            None
        );
        // A lead the kernel measured is taken as it is, the span ignored.
        let measured = timed_record([1, 900, unmeasured, unmeasured]);
        assert_eq!(
            (measured.record.lead_ns, measured.post_ns),
            (Some(900), None)
        );
    }
}
