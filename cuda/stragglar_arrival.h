/* Arrival records: which rank arrived last at each ticketed call, and by how much, recorded by
 * the GPUs themselves and identical on every rank, so every rank's policy reads the same
 * history without exchanging anything (docs/GPU-ENGINE.md; src/detect for the rule).
 *
 * Protocol for call c, on the board in rank 0's staging. Publishing (one thread: the first of
 * the AllReduce kernel's arrival warp, or the ticket kernel before a call that goes to NCCL):
 *  1. publish what this rank noted of c-1 (its RawArrivalNote): its time from its ticket (or
 *     its kernel's start, if earlier) to its call's end, on its own clock, as c-1's `post` if
 *     it arrived last, as its `span` if it arrived second-to-last;
 *  2. take a ticket: atomicAdd on the slot's counter gives this rank's arrival position, which
 *     it notes with its time;
 *  3. the last arrival writes its rank; the second-to-last writes the lead: in an AllReduce
 *     kernel it waits for the last ticket and writes the time it waited on its own clock;
 *     before a call NCCL runs it waits for nobody and writes LEAD_FROM_SPANS (the lead is then
 *     its span minus the last arrival's post: both leave NCCL's kernel together).
 * Collecting (the arrival warp of an AllReduce kernel, or the end kernel a measured call NCCL
 * ran queues after NCCL's kernel): copy the `collect` records of calls before c-1 into this
 * rank's host-mapped ring, waiting for each word's tag. They come: this rank started c, so
 * every rank finished every launch of c-2, and the last of those words is published by a
 * rank's launch of c-1, whose ticket taken (or, for a call NCCL ran, whose end reached) shows
 * it is running.
 * Graph launches run steps 1-3 on their own board, first copying c-1's `last` and `lead` and
 * c-2's `post` (sg_arrive_graph): the device's detector feeds them at once. A graph call on
 * NCCL's turn splits it: the turn kernel publishes and takes the ticket, waiting for nothing,
 * and the rest runs beside NCCL's work (stragglar_graph_turn.cu; stragglar_allreduce.cu,
 * sg_graph_nccl_arrival).
 * Slot reuse is safe (see BOARD_SLOTS). Every wait watches the abort word, every rank's
 * failure word (a rank that failed on its host never takes its ticket) and the timeout, like
 * the AllReduce kernel's waits. */

#ifndef STRAGGLAR_ARRIVAL_H_
#define STRAGGLAR_ARRIVAL_H_

#include "stragglar_device.h"

/* What a spin watches, and where it reports giving up. */
struct sg_watch {
  const uint32_t* abort;
  uint32_t* status;
  const RawPeer* peers; /* every rank's failure word; this rank's is where it reports */
  uint32_t rank, ranks;
  uint64_t timeout_ns; /* 0: no deadline */
};

/* The tag of call c in the high half of a packed word: never 0 (a word nobody wrote). */
SG_DEVICE uint64_t sg_tag(uint64_t call) { return ((call % 0xffffffffull) + 1) << 32; }

/* Whether the spin must stop; records why (once) when it must. `start` is 0 until the first
 * check. Outlined: every spin of the protocol calls it, each 32 polls, and one copy keeps one
 * fence before its status store instead of one per caller. */
SG_OUTLINED uint32_t sg_watch_check(const sg_watch* w, uint64_t* start) {
  uint32_t* own_failed = (uint32_t*)w->peers[w->rank].failed;
  uint32_t status = STATUS_OK;
  if (*start == 0) *start = sg_now_ns();
  if (sg_load_volatile(w->abort) != 0) {
    status = STATUS_ABORTED;
  } else if (sg_load_volatile(own_failed) != 0) {
    status = sg_load_volatile(own_failed);
  } else if (w->timeout_ns != 0 && sg_now_ns() - *start > w->timeout_ns) {
    status = STATUS_TIMEOUT;
  }
  for (uint32_t r = 0; status == STATUS_OK && r < w->ranks; ++r) {
    if (r != w->rank && sg_load_volatile((const uint32_t*)w->peers[r].failed) != 0) {
      status = STATUS_PEER_FAILED;
    }
  }
  if (status != STATUS_OK) {
    sg_store_volatile(own_failed, status);
    sg_store_release(w->status, status);
  }
  return status;
}

/* Waits until the packed word at `p` carries `tag`; returns its value, or 0 if given up. With
 * `acquire`, what its writer did before is visible after; without, only the word itself (a
 * post-arrival time, which publishes nothing else). */
SG_DEVICE uint64_t sg_await_tag(const sg_watch* w, const uint64_t* p, uint64_t tag,
                                bool acquire = true) {
  uint64_t start = 0;
  uint32_t polls = 0;
  for (;;) {
    uint64_t v = acquire ? sg_load_acquire64(p) : sg_load_relaxed64(p);
    if ((v & 0xffffffff00000000ull) == tag) return v;
    if ((++polls & 31u) == 0 && sg_watch_check(w, &start) != STATUS_OK) return 0;
    sg_pause();
  }
}

/* This rank's note of call `call` among its two (`notes`: RawArrivalNote[2]): call c writes
 * the one at c % 2 while its arrival thread reads c-1's, so the two never touch one word. */
SG_DEVICE RawArrivalNote* sg_note_of(uint64_t notes, uint64_t call) {
  return &((RawArrivalNote*)notes)[call & 1];
}

/* Call `call`'s slot of `board`. */
SG_DEVICE RawBoardSlot* sg_slot_of(uint64_t board, uint64_t call) {
  return &((RawBoardSlot*)board)[call % BOARD_SLOTS];
}

/* Notes that this rank finished call `call` now (the kernel's last plan block, or the end
 * kernel after NCCL's): read by its next ticketed launch, which the engine orders after it. */
SG_DEVICE void sg_note_finished(uint64_t notes, uint64_t call) {
  RawArrivalNote* note = sg_note_of(notes, call);
  note->finished_at = sg_now_ns();
  note->finished = sg_tag(call);
}

/* Notes that this rank's call `call` started now (the AllReduce kernel's plan block 0, the
 * first block to start, before its plan; or a graph call's turn kernel, on StragglAR's turn):
 * the call's start if the ticket is taken later. */
SG_DEVICE void sg_note_started(uint64_t notes, uint64_t call) {
  RawArrivalNote* note = sg_note_of(notes, call);
  note->started_at = sg_now_ns();
  note->started = sg_tag(call);
}

/* This rank's time of the call its note `note` holds (tag `tag`): from its ticket, or its
 * kernel's start if that came first, to its end; POST_UNMEASURED when its end was not noted. */
SG_DEVICE uint64_t sg_time_of(const RawArrivalNote* note, uint64_t tag) {
  uint64_t start = note->arrived_at;
  if (note->started == tag && note->started_at < start) start = note->started_at;
  if (note->finished != tag || note->finished_at < start) return POST_UNMEASURED;
  uint64_t took = note->finished_at - start;
  return took < POST_UNMEASURED ? took : POST_UNMEASURED - 1;
}

/* Step 1: publishes what this rank noted of call `a->call - 1`: its time as the call's post
 * if it arrived last, as its span if second-to-last. No wait. */
SG_DEVICE void sg_publish_previous(const RawArrival* a) {
  if (a->call == 0) return;
  const uint64_t call = a->call - 1;
  const RawArrivalNote* note = sg_note_of(a->note, call);
  const uint64_t tag = sg_tag(call);
  if ((note->arrived & 0xffffffff00000000ull) != tag) return;
  const uint64_t position = note->arrived & 0xffffffffull;
  const uint64_t took = sg_time_of(note, tag);
  RawBoardSlot* slot = sg_slot_of(a->board, call);
  /* Self-tagged words, and the ticket's atomic after them orders them before this rank's
   * later board accesses. */
  if (position + 1 == a->ranks) sg_store_relaxed64(&slot->post, tag | took);
  if (position + 2 == a->ranks || a->ranks == 1) sg_store_relaxed64(&slot->span, tag | took);
}

/* Steps 2-3 but the lead's wait: takes this rank's ticket of call `a->call`, notes it, and
 * writes the slot's `last` if it arrived last. Returns its arrival position. No wait. */
SG_DEVICE uint64_t sg_take_ticket(const RawArrival* a, uint32_t rank) {
  RawBoardSlot* slot = sg_slot_of(a->board, a->call);
  const uint64_t first = (a->call / BOARD_SLOTS) * a->ranks;
  const uint64_t tag = sg_tag(a->call);
  const uint64_t arrived_at = sg_now_ns();
  const uint64_t position = sg_atomic_add64_sys(&slot->arrived, 1) - first;
  RawArrivalNote* note = sg_note_of(a->note, a->call);
  note->arrived_at = arrived_at;
  note->arrived = tag | (position & 0xffffffffull);
  if (position + 1 == a->ranks) sg_store_release64(&slot->last, tag | rank);
  if (a->ranks == 1) sg_store_release64(&slot->lead, tag);
  return position;
}

/* Step 3's lead before a call NCCL runs: the second-to-last arrival says it is to be worked
 * out from the spans. No wait. */
SG_DEVICE void sg_lead_from_spans(const RawArrival* a, uint64_t position) {
  if (position + 2 != a->ranks) return;
  sg_store_release64(&sg_slot_of(a->board, a->call)->lead, sg_tag(a->call) | LEAD_FROM_SPANS);
}

/* Step 3's lead in an AllReduce kernel: the second-to-last arrival waits for the last ticket
 * and writes how long it waited. Returns a STATUS_*. */
SG_DEVICE uint32_t sg_measure_lead(const RawArrival* a, uint64_t position, const sg_watch* w) {
  if (position + 2 != a->ranks) return STATUS_OK;
  RawBoardSlot* slot = sg_slot_of(a->board, a->call);
  const uint64_t first = (a->call / BOARD_SLOTS) * a->ranks;
  const uint64_t arrived_at = sg_note_of(a->note, a->call)->arrived_at;
  uint64_t start = 0;
  uint32_t polls = 0;
  while (sg_load_acquire64(&slot->arrived) - first < a->ranks) {
    if ((++polls & 31u) == 0 && sg_watch_check(w, &start) != STATUS_OK) {
      return sg_load_volatile(w->status);
    }
    sg_pause();
  }
  uint64_t lead = sg_now_ns() - arrived_at;
  if (lead >= LEAD_FROM_SPANS) lead = LEAD_FROM_SPANS - 1;
  sg_store_release64(&slot->lead, sg_tag(a->call) | lead);
  return STATUS_OK;
}

/* Collecting: lane `lane` of `lanes` copies its share of the records of calls
 * `a->call - 1 - a->collect ..= a->call - 2` into the ring, each word once it carries its
 * call's tag. Returns a STATUS_*. */
SG_DEVICE uint32_t sg_collect(const RawArrival* a, const sg_watch* w, uint32_t lane,
                              uint32_t lanes) {
  if (a->call < 2) return STATUS_OK;
  const uint64_t count = a->collect < a->call - 1 ? a->collect : a->call - 1;
  RawRingEntry* ring = (RawRingEntry*)a->ring;
  for (uint64_t i = lane; i < count; i += lanes) {
    const uint64_t call = a->call - 1 - count + i;
    const RawBoardSlot* slot = sg_slot_of(a->board, call);
    const uint64_t tag = sg_tag(call);
    /* Each word is self-tagged and publishes nothing else: read and copied relaxed, the four
     * reads in flight together, a word waited for only if it is not there yet. */
    const uint64_t* at[4] = {&slot->last, &slot->lead, &slot->post, &slot->span};
    uint64_t words[4];
    for (int j = 0; j < 4; ++j) words[j] = sg_load_relaxed64(at[j]);
    RawRingEntry* entry = &ring[call % RING_ENTRIES];
    uint64_t* to[4] = {&entry->last, &entry->lead, &entry->post, &entry->span};
    for (int j = 0; j < 4; ++j) {
      if ((words[j] & 0xffffffff00000000ull) != tag) words[j] = sg_await_tag(w, at[j], tag, false);
      if (!words[j]) return sg_load_volatile(w->status);
      sg_store_relaxed64(to[j], words[j]);
    }
  }
  return STATUS_OK;
}

/* The records a graph launch's feed reads, for call `a->call` (one thread): c-1's `last` and
 * `lead` and c-2's `post`, each waited for and copied into the ring. Returns a STATUS_*. */
SG_DEVICE uint32_t sg_graph_records(const RawArrival* a, const sg_watch* w) {
  const RawBoardSlot* board = (const RawBoardSlot*)a->board;
  RawRingEntry* ring = (RawRingEntry*)a->ring;
  const uint64_t call = a->call;
  if (call > 0) {
    const RawBoardSlot* previous = &board[(call - 1) % BOARD_SLOTS];
    uint64_t tag = sg_tag(call - 1);
    uint64_t last = sg_await_tag(w, &previous->last, tag);
    uint64_t lead = last ? sg_await_tag(w, &previous->lead, tag) : 0;
    if (!lead) return sg_load_volatile(w->status);
    RawRingEntry* entry = &ring[(call - 1) % RING_ENTRIES];
    sg_store_release64(&entry->last, last);
    sg_store_release64(&entry->lead, lead);
  }
  if (call > 1) {
    uint64_t post =
        sg_await_tag(w, &board[(call - 2) % BOARD_SLOTS].post, sg_tag(call - 2), false);
    if (!post) return sg_load_volatile(w->status);
    sg_store_relaxed64(&ring[(call - 2) % RING_ENTRIES].post, post); /* self-tagged */
  }
  return STATUS_OK;
}

/* A graph launch's protocol for call `a->call` (one thread): step 1, the records the feed
 * reads (sg_graph_records), then steps 2-3, the lead measured. Returns a STATUS_*. */
SG_DEVICE uint32_t sg_arrive_graph(const RawArrival* a, uint32_t rank, const sg_watch* w) {
  sg_publish_previous(a);
  const uint32_t status = sg_graph_records(a, w);
  if (status != STATUS_OK) return status;
  return sg_measure_lead(a, sg_take_ticket(a, rank), w);
}

/* Whether call `call`, if NCCL runs it, is in the sample whose end is noted: the hash of
 * src/gpu/arrival.rs's `measures` (the host's, for eager calls; this one, for graph calls). */
SG_DEVICE bool sg_measures(uint64_t call) {
  uint64_t x = call + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return (x ^ (x >> 31)) % MEASURE_ONE_IN == 0;
}

/* This rank's arrival position at call `a->call`, as its ticket noted it. */
SG_DEVICE uint64_t sg_noted_position(const RawArrival* a) {
  return sg_note_of(a->note, a->call)->arrived & 0xffffffffull;
}

#endif /* STRAGGLAR_ARRIVAL_H_ */
