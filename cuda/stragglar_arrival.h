/* Arrival records: which rank arrived last at each ticketed call, and by how much, recorded by
 * the GPUs themselves and identical on every rank, so every rank's policy reads the same
 * history without exchanging anything (docs/ALGORITHM.md; src/detect for the rule).
 *
 * Protocol for call c (one thread per rank: the first of the AllReduce kernel's arrival warp,
 * the last warp of its block 0, or the ticket kernel before a call that goes to NCCL), on the
 * board in rank 0's staging:
 *  1. if this rank arrived last at c-1, publish c-1's post-arrival time: from its ticket (or
 *     its kernel's start, if earlier) to its call's end, all on its own clock (its
 *     RawArrivalNote; the end is noted by the kernel's last plan block, or by the end kernel
 *     queued after NCCL's);
 *  2. copy the record of call c-1 from its board slot into this rank's host-mapped ring, once
 *     both of its words carry c-1's tag (they will: this rank finished c-1, so every rank
 *     arrived at it, and its second-to-last arrival is about to finish measuring);
 *  3. copy c-2's post-arrival time into the ring (it will come: every rank started c-1, and
 *     c-2's last arrival publishes it first thing in c-1);
 *  4. take a ticket: atomicAdd on the slot's counter gives this rank's arrival position;
 *  5. the last arrival writes its rank (and notes its ticket's time); the second-to-last waits
 *     for the last ticket and writes the time it waited on its own clock (the lead), so no two
 *     clocks are compared.
 * Slot reuse is safe with 4 slots (see BOARD_SLOTS). Every spin watches the abort word, every
 * rank's failure word (a rank that failed on its host never takes its ticket) and the timeout,
 * like the AllReduce kernel's waits. */

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

/* Notes that this rank finished call `call` now (the kernel's last plan block, or the end
 * kernel after NCCL's): read by its next ticketed launch, which the engine orders after it. */
SG_DEVICE void sg_note_finished(uint64_t notes, uint64_t call) {
  RawArrivalNote* note = sg_note_of(notes, call);
  note->finished_at = sg_now_ns();
  note->finished = sg_tag(call);
}

/* Notes that this rank's AllReduce kernel of call `call` started now (block 0, before its
 * plan): the call's start if its arrival thread takes the ticket later. */
SG_DEVICE void sg_note_started(uint64_t notes, uint64_t call) {
  RawArrivalNote* note = sg_note_of(notes, call);
  note->started_at = sg_now_ns();
  note->started = sg_tag(call);
}

/* Step 1: publishes call `call`'s post-arrival time on the board if this rank arrived last at
 * it, from its note: from its ticket, or its kernel's start if that came first, to its end
 * (POST_UNMEASURED when its end was not noted). */
SG_DEVICE void sg_publish_post(RawBoardSlot* board, uint64_t notes, uint64_t call) {
  const RawArrivalNote* note = sg_note_of(notes, call);
  const uint64_t tag = sg_tag(call);
  if (note->last != tag) return;
  uint64_t start = note->arrived_at;
  if (note->started == tag && note->started_at < start) start = note->started_at;
  uint64_t post = POST_UNMEASURED;
  if (note->finished == tag && note->finished_at >= start) {
    uint64_t took = note->finished_at - start;
    post = took < POST_UNMEASURED ? took : POST_UNMEASURED - 1;
  }
  /* Self-tagged, and the ticket's atomic after it orders it before this rank's later board
   * accesses. */
  sg_store_relaxed64(&board[call % BOARD_SLOTS].post, tag | post);
}

/* Runs the arrival protocol of call `a->call` for `rank` (one thread). Returns a STATUS_*. */
SG_DEVICE uint32_t sg_arrive(const RawArrival* a, uint32_t rank, const sg_watch* w) {
  RawBoardSlot* board = (RawBoardSlot*)a->board;
  RawRingEntry* ring = (RawRingEntry*)a->ring;
  const uint64_t call = a->call;
  if (call > 0) {
    sg_publish_post(board, a->note, call - 1);
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
  RawBoardSlot* slot = &board[call % BOARD_SLOTS];
  const uint64_t first = (call / BOARD_SLOTS) * a->ranks;
  const uint64_t tag = sg_tag(call);
  uint64_t arrived_at = sg_now_ns();
  uint64_t position = sg_atomic_add64_sys(&slot->arrived, 1) - first;
  if (position + 1 == a->ranks) {
    RawArrivalNote* note = sg_note_of(a->note, call);
    note->arrived_at = arrived_at;
    note->last = tag;
    sg_store_release64(&slot->last, tag | rank);
  }
  if (position + 2 == a->ranks || a->ranks == 1) {
    uint64_t start = 0;
    uint32_t polls = 0;
    while (sg_load_acquire64(&slot->arrived) - first < a->ranks) {
      if ((++polls & 31u) == 0 && sg_watch_check(w, &start) != STATUS_OK) {
        return sg_load_volatile(w->status);
      }
      sg_pause();
    }
    uint64_t lead = sg_now_ns() - arrived_at;
    if (a->ranks == 1) lead = 0;
    sg_store_release64(&slot->lead, tag | (lead < 0xffffffffull ? lead : 0xffffffffull));
  }
  return STATUS_OK;
}

#endif /* STRAGGLAR_ARRIVAL_H_ */
