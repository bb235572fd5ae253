/* The StragglAR AllReduce kernel: one launch per rank per call executes that rank's plan
 * (cuda/stragglar_plan.h, lowered and encoded by src/plan) over the ranks' staging arenas.
 *
 * Invariants (see src/plan/mod.rs and docs/ALGORITHM.md for the protocol):
 *  - single assignment: every value slot is written once per call, by its owner, then
 *    published by a flag holding the call's epoch, which the owner writes into the inbox of
 *    each of the value's readers (RawPeer::flags; one writer per word), so a reader polls its
 *    own memory; nothing a peer may read is overwritten within a call, and two arena/flag
 *    parities keep call e+1 off call e's memory;
 *  - block b covers the same bytes of every chunk on every rank (the grid is fixed per
 *    communicator), and waits only on block b's flags, so no block ever waits for a sibling:
 *    co-residency of the grid is not needed for progress within a rank; a launch that records
 *    its arrival runs the protocol in the last warp of plan block 0 (the first block each GPU
 *    starts), outside the plan's barriers;
 *  - every wait polls the abort word, the awaited peer's failure word and this rank's own, and
 *    gives up after timeout_ns (when nonzero), writing a STATUS_* code instead of hanging;
 *  - the epoch lives in device memory and is advanced by the last block to finish, so a
 *    replayed CUDA graph stays correct with no host involvement.
 *  - with RawLaunch::ordered_reads, a remote read that is its source's send number k (its plan
 *    turn, RawStep::turn) waits until its turn word for that source (RawPeer::served, in its
 *    own staging, per block and parity) says k, and once read hands turn k + 1 to the source's
 *    next reader (RawStep::next_reader), writing k + 1 into that reader's turn word: every send
 *    port serves in the schedule's round order, as the host engine keeps it; the results are
 *    the same either way. A turn word may be written by several ranks over a call (the
 *    readers of the source's earlier sends), but turn k only by the reader of send k - 1,
 *    after its own turn came (send 0 needs none), so the writes are ordered by the chain of
 *    turns and never race. A turn word is 64 bits, the call's whole flag beside the turn, so
 *    a word that no plan touched for many calls is never taken for this call's. */

#include "stragglar_arrival.h"
#include "stragglar_choice.h"
#include "stragglar_graph.h"
#include "stragglar_reduce.h"

/* The most operands one combine takes (the host engine's MAX_OPERANDS). */
#define SG_MAX_OPERANDS 256

/* Per-block scratch: shared memory on the GPU, one per emulated block on the host. */
struct sg_step_scratch {
  const unsigned char* operands[SG_MAX_OPERANDS];
  /* The outcome of each wait in the step (a STATUS_*), written by the thread that waited:
   * operand i's flag at i, its turn (ordered reads) at operands + i. */
  uint32_t waits[2 * SG_MAX_OPERANDS];
};

/* A block's shared memory: the scratch of two consecutive steps, step i taking step[i % 2].
 * A step's waits fill its half while the block's slower threads may still read the step
 * before's operands from the other half, so no barrier is needed before them: the half a step
 * rewrites was last read two steps earlier, and every thread passed the barrier after the
 * waits of the step between (which no step skips) only once it was done reading it. */
struct sg_scratch {
  sg_step_scratch step[2];
  /* The plan block this block runs (sg_all_reduce claims it at its start). */
  uint32_t plan_block;
};

/* What the element-wise code needs: the op, the world size (for integer avg), the element
 * type and the copy-in scalar (element bytes). */
struct sg_math {
  uint32_t op;
  uint32_t ranks;
  uint32_t dt;
  const unsigned char* scale;
};

/* Where a call's chunks and values lie, from its count and type alone (blobs hold neither):
 * the same arithmetic as chunk_range and slot_bytes in src/plan/layout.rs, so every rank, and
 * the host engine, agree on every byte range. */
struct sg_layout {
  uint64_t count;  /* elements */
  uint64_t elem;   /* bytes per element */
  uint64_t unit;   /* elements per 16-byte unit (1 for elements of 16 bytes or more) */
  uint64_t units;  /* units in the message, the last one possibly partial */
  uint64_t chunks;
  uint64_t in_bytes;   /* the IN region: the message rounded up to 16 bytes */
  uint64_t slot_bytes; /* one arena slot: the largest chunk rounded up to 16 bytes */
};

SG_DEVICE uint64_t sg_align16(uint64_t bytes) { return (bytes + 15) / 16 * 16; }

/* The layout of `count` elements of `elem` bytes in `chunks` chunks. A zero `elem` or `chunks`
 * (a launch that fails sg_plan_ok) is taken as 1, so nothing divides by zero. */
SG_DEVICE sg_layout sg_layout_of(uint64_t count, uint32_t elem, uint32_t chunks) {
  if (elem == 0) elem = 1;
  if (chunks == 0) chunks = 1;
  sg_layout l;
  l.count = count;
  l.elem = elem;
  l.unit = elem < 16 ? 16 / elem : 1;
  l.units = (count + l.unit - 1) / l.unit;
  l.chunks = chunks;
  l.in_bytes = sg_align16(count * elem);
  l.slot_bytes = sg_align16((l.units + chunks - 1) / chunks * l.unit * elem);
  return l;
}

/* Byte range [*start, *start + *bytes) of chunk `c` in the caller's buffer (and in IN). */
SG_DEVICE void sg_chunk(const sg_layout* l, uint64_t c, uint64_t* start, uint64_t* bytes) {
  uint64_t first = c * l->units / l->chunks * l->unit;
  uint64_t end = (c + 1) * l->units / l->chunks * l->unit;
  first = first < l->count ? first : l->count;
  end = end < l->count ? end : l->count;
  *start = first * l->elem;
  *bytes = (end - first) * l->elem;
}

/* Bytes per element of `dt`; 0 for a type the kernel does not know. */
SG_DEVICE uint32_t sg_elem_size(uint32_t dt) {
  uint32_t size = 0;
  SG_WITH_LANE(dt, L, size = (uint32_t)sizeof(L::elem));
  return size;
}

/* What a block knows about the current call. */
struct sg_call {
  sg_math math;
  sg_layout layout;
  const RawLaunch* args;
  const RawPlanHeader* plan;
  const RawPeer* peers;
  uint32_t parity;
  uint32_t flag;  /* the value every flag of this call holds */
  uint32_t block; /* the plan block this block runs (see sg_all_reduce) */
};

/* Whether the launch records its arrival: a graph launch always, an eager one with a board. */
SG_DEVICE bool sg_has_arrival(const RawLaunch* a) {
  return a->graph != 0 || a->arrival.board != 0;
}

template <typename T>
SG_DEVICE const T* sg_at(const RawPlanHeader* plan, uint64_t offset) {
  return (const T*)((const unsigned char*)plan + offset);
}

/* Bytes [begin, end) of a chunk of `chunk_bytes` in shares `[from, to)` of `shares`: whole
 * 16-byte units, the same split on every rank; the range ending at the last share may end in
 * a partial unit. Units times shares stay far below 2^64 (2^40 units, 2^20 shares). */
SG_DEVICE void sg_share(uint64_t chunk_bytes, uint64_t from, uint64_t to, uint64_t shares,
                        uint64_t* begin, uint64_t* end) {
  const uint64_t units = (chunk_bytes + 15) / 16;
  *begin = shares == 0 ? 0 : units * from / shares * 16;
  uint64_t e = shares == 0 ? 0 : units * to / shares * 16; /* no shares: nothing to cover */
  *end = e < chunk_bytes ? e : chunk_bytes;
  if (*begin > *end) *begin = *end;
}

/* Bytes [begin, end) of a chunk of `chunk_bytes` that block `b` of `blocks` covers: an equal
 * share (the bandwidth probe's split). */
SG_DEVICE void sg_slice(uint64_t chunk_bytes, uint32_t b, uint32_t blocks, uint64_t* begin,
                        uint64_t* end) {
  sg_share(chunk_bytes, b, (uint64_t)b + 1, blocks, begin, end);
}

/* Plan block `b`'s bytes [begin, end) of a chunk of `bytes`, the chunk shared out among
 * `blocks` plan blocks of `threads` threads in proportion to the threads that move its data:
 * plan block 0 counts `lanes` (its arrival warp) out when it has more than that. `blocks` is at
 * least 1. */
SG_DEVICE void sg_block_share(uint64_t bytes, uint64_t b, uint64_t blocks, uint64_t threads,
                              uint64_t lanes, uint64_t* begin, uint64_t* end) {
  const uint64_t spare = threads > lanes ? lanes : 0;
  const uint64_t from = b == 0 ? 0 : b * threads - spare;
  sg_share(bytes, from, (b + 1) * threads - spare, blocks * threads - spare, begin, end);
}

/* This block's bytes [begin, end) of a chunk of `bytes` in `call` (sg_block_share), counted
 * alike on every rank and every launch from the communicator's fixed `blocks` and `threads`:
 * plan block 0 counts the arrival warp's threads (SG_ARRIVAL_LANES) out, whether this launch
 * records its arrival or not. A launch that records it (the default) then has no block slower
 * than the rest, where equal shares gave plan block 0's 15 warps of 512 threads 1/15 more work
 * per thread; one that does not leaves plan block 0 that warp's share idle (1/16 of a block's
 * work spread over the others: 0.2% more each at 32 blocks). `blocks` is the running grid's
 * size, so at least 1. */
SG_DEVICE void sg_call_slice(const sg_call* call, uint64_t bytes, uint64_t* begin,
                             uint64_t* end) {
  sg_block_share(bytes, call->block, call->args->blocks, call->args->threads, SG_ARRIVAL_LANES,
                 begin, end);
}

/* The flag of this block's slice of value `value` of rank `owner` in the inbox of rank
 * `reader` (RawPeer::flags): written by the owner, polled by the reader in its own memory, so a
 * wait costs no round trip over the link (the owner's release is a posted write). */
SG_DEVICE uint32_t* sg_inbox(const sg_call* call, uint32_t reader, uint32_t owner,
                             uint32_t value) {
  const uint32_t* bases = sg_at<uint32_t>(call->plan, call->plan->value_bases_at);
  const uint64_t word = (uint64_t)(bases[owner] + value) * call->args->blocks + call->block;
  return (uint32_t*)call->peers[reader].flags[call->parity] + word;
}

/* Value `v` of rank `r` in the plan's value table. */
SG_DEVICE const RawValue* sg_value(const sg_call* call, uint32_t r, uint32_t v) {
  const uint32_t* bases = sg_at<uint32_t>(call->plan, call->plan->value_bases_at);
  return sg_at<RawValue>(call->plan, call->plan->values_at) + bases[r] + v;
}

/* Whether this launch keeps value `v` in its multicast region (RawLaunch::multicast_arena):
 * pushed to several readers, with a region whose parity holds the value's slot, which every
 * rank decides alike (the same blob tables, count and region size). Then `*offset` is where
 * the value lies in the region. */
SG_DEVICE bool sg_in_multicast(const sg_call* call, const RawValue* v, uint64_t* offset) {
  const RawLaunch* a = call->args;
  const uint32_t from = call->plan->multicast_slots_from;
  if (!v->pushed || v->reader_count < 2 || a->multicast_arena[call->parity] == 0 ||
      v->slot == SLOT_NONE || v->slot == SLOT_INPUT || v->slot < from) {
    return false;
  }
  *offset = (uint64_t)(v->slot - from) * call->layout.slot_bytes;
  return *offset + call->layout.slot_bytes <= a->multicast_bytes;
}

/* Where own value `v` lies in this launch's multicast region, at its multicast address (a
 * store there reaches every member's memory), or 0 where the region does not keep it. */
SG_DEVICE unsigned char* sg_multicast_at(const sg_call* call, const RawValue* v) {
  uint64_t offset;
  if (!sg_in_multicast(call, v, &offset)) return 0;
  return (unsigned char*)call->args->multicast_arena[call->parity] + offset;
}

/* Every thread of the block, after its barrier: publishes this block's slice of own value
 * `value` to each of its readers (RawValue::first_reader), one release into each reader's
 * inbox, thread `first + j` taking reader j (`first`: the threads busy with other releases),
 * so that several readers' releases go out together rather than each waiting on the one before
 * (each release is cumulative over the whole block's writes, which the barrier ordered before
 * it; stragglar_device.h). */
SG_DEVICE void sg_publish_to_readers(const sg_call* call, uint32_t value, uint32_t first) {
  const RawPlanHeader* plan = call->plan;
  const uint32_t rank = call->args->rank;
  const RawValue* v = sg_value(call, rank, value);
  const uint32_t* readers = sg_at<uint32_t>(plan, plan->readers_at) + v->first_reader;
  const uint32_t threads = SG_THREADS;
  /* A value pushed through the multicast address reaches its readers' own addresses of those
   * bytes: another proxy, ordered before the flag only through the alias fence. */
  uint64_t region_offset;
  const bool aliased = sg_in_multicast(call, v, &region_offset);
  for (uint32_t i = (SG_THREAD + threads - first % threads) % threads; i < v->reader_count;
       i += threads) {
    /* (A planted bug, built only by the mutation runs of docs/EMULATED-GPU.md, drops it.) */
#ifndef STRAGGLAR_MUTANT_NO_ALIAS_FENCE
    if (aliased) sg_fence_proxy_alias();
#else
    (void)aliased;
#endif
    if (readers[i] < plan->ranks) {
      sg_store_release(sg_inbox(call, readers[i], rank, value), call->flag);
    }
  }
}

/* Records a failure: `status` in this rank's failure word (its peers' waits watch it), then
 * released into the launch's status word (the host's). Outlined: a cold path every wait
 * reaches, whose system-scope release would otherwise be inlined into each. */
SG_OUTLINED void sg_record_failure(uint32_t* failed, uint32_t* status_word, uint32_t status) {
  sg_store_volatile(failed, status);
  sg_store_release(status_word, status);
}

/* Gives up the call on this rank: records why where the host and the peers look. */
SG_DEVICE void sg_fail(const sg_call* call, uint32_t status) {
  const RawLaunch* a = call->args;
  sg_record_failure((uint32_t*)call->peers[a->rank].failed, (uint32_t*)a->status, status);
}

/* `sg_wait`'s `peer` when the word may be written by any rank: every rank's failure word is
 * watched. */
#define SG_ANY_PEER 0xffffffffu

/* Whether some rank of the call has failed (its failure word is set). */
SG_DEVICE bool sg_any_failed(const sg_call* call) {
  for (uint32_t r = 0; r < call->math.ranks; ++r) {
    if (sg_load_volatile((const uint32_t*)call->peers[r].failed) != 0) return true;
  }
  return false;
}

/* A flag (32 bits) or a turn word (64 bits) polled: relaxed, at system scope. */
SG_DEVICE uint32_t sg_poll_word(const uint32_t* p) { return sg_load_relaxed(p); }
SG_DEVICE uint64_t sg_poll_word(const uint64_t* p) { return sg_load_relaxed64(p); }

/* How often a wait looks at the abort word and the failure words, in nanoseconds of the GPU's
 * clock (a bounded delay to notice a failure, whatever one poll costs). */
#define SG_WATCH_NS 4096ull

/* A flag (32 bits) or a turn word (64 bits) read with acquire at system scope. (Planted bugs,
 * built only by the mutation runs of docs/EMULATED-GPU.md, read the flag or the turn word
 * relaxed instead.) */
SG_DEVICE uint32_t sg_load_word(const uint32_t* p) {
#ifdef STRAGGLAR_MUTANT_RELAXED_FLAG
  return sg_load_volatile(p);
#else
  return sg_load_acquire(p);
#endif
}
SG_DEVICE uint64_t sg_load_word(const uint64_t* p) {
#ifdef STRAGGLAR_MUTANT_RELAXED_TURN
  return sg_load_relaxed64(p);
#else
  return sg_load_acquire64(p);
#endif
}

/* The calling thread waits until `flag` (written by rank `peer`, or by any rank: SG_ANY_PEER)
 * holds `want`: it polls relaxed and, once the word holds it, reads it again with acquire (the
 * word never changes again within the call, so that read sees it too, and what its writer
 * released before it is visible after). The abort and failure words are looked at every
 * SG_WATCH_NS of the clock, from the first poll that missed. Returns nonzero (a STATUS_*) if
 * the call must be given up, after recording why. */
template <class W>
SG_DEVICE uint32_t sg_wait(const sg_call* call, const W* flag, W want, uint32_t peer) {
  const RawLaunch* a = call->args;
  const uint32_t* own_failed = (const uint32_t*)call->peers[a->rank].failed;
  uint32_t status = STATUS_OK;
  uint64_t start = 0;
  uint64_t looked = 0;
  while (sg_poll_word(flag) != want || sg_load_word(flag) != want) {
    const uint64_t now = sg_now_ns();
    if (start == 0) {
      start = looked = now;
    } else if (now - looked >= SG_WATCH_NS) {
      looked = now;
      /* This rank's own failure first: a sibling thread's wait that gave up (a timeout, say)
       * keeps its status, rather than a later wait writing PEER_FAILED over it. */
      if (sg_load_volatile((const uint32_t*)a->abort) != 0) {
        status = STATUS_ABORTED;
      } else if (sg_load_volatile(own_failed) != 0) {
        status = sg_load_volatile(own_failed);
      } else if (peer == SG_ANY_PEER ? sg_any_failed(call)
                                     : sg_load_volatile((const uint32_t*)call->peers[peer].failed) != 0) {
        status = STATUS_PEER_FAILED;
      } else if (a->timeout_ns != 0 && now - start > a->timeout_ns) {
        status = STATUS_TIMEOUT;
      }
      if (status != STATUS_OK) break;
    }
    sg_pause();
  }
  /* A peer's failure seen while the word was on its way. A rank is marked failed by its host
   * after its earlier kernels finished, so after everything they released: with the failure
   * word read again with acquire, one more look at `flag` tells a wait its peer served before
   * failing (this call goes on) from one it never will. */
  if (status == STATUS_PEER_FAILED) {
    for (uint32_t r = 0; r < call->math.ranks; ++r) {
      if (peer == SG_ANY_PEER || r == peer) {
        (void)sg_load_acquire((const uint32_t*)call->peers[r].failed);
      }
    }
    if (sg_load_word(flag) == want) status = STATUS_OK;
  }
  if (status != STATUS_OK) sg_fail(call, status);
  return status;
}

/* A turn word's value: `turns` of a rank's sends served in the call whose flags hold `flag`
 * (the whole flag, as a flag word tells calls apart). */
SG_DEVICE uint64_t sg_served(uint32_t flag, uint32_t turns) {
  return ((uint64_t)flag << 32) | turns;
}

/* Block `b`'s turn word for `source`'s sends in the staging of rank `reader` (RawPeer::served),
 * in this call's parity: written by the source's previous reader, polled by `reader` in its own
 * memory. */
SG_DEVICE uint64_t* sg_turn_word(const sg_call* call, uint32_t reader, uint32_t source) {
  const uint64_t word = (uint64_t)source * call->args->blocks + call->block;
  return (uint64_t*)call->peers[reader].served[call->parity] + word;
}

#ifdef STRAGGLAR_HOST_EMULATION
/* Turns handed on out of order (a test reads it: it must stay 0). */
static uint64_t sg_served_out_of_order = 0;
#endif

/* Hands send `turn + 1` of a source to its reader, through `word` (that reader's turn word):
 * send `turn` is read. The emulation also checks that the word was not already handed this
 * turn or a later one in this call (its reader's earlier turns of the source came before),
 * with a relaxed load first, which orders nothing: the store is the GPU's release alone, so no
 * acquire the emulation made could stand in for one the GPU lacks. */
SG_DEVICE void sg_serve(uint64_t* word, uint32_t flag, uint32_t turn) {
#ifdef STRAGGLAR_HOST_EMULATION
  const uint64_t before = __atomic_load_n(word, __ATOMIC_RELAXED);
  if (before >> 32 == flag && (uint32_t)before > turn) {
    __atomic_fetch_add(&sg_served_out_of_order, 1, __ATOMIC_RELAXED);
  }
#endif
  sg_store_release64(word, sg_served(flag, turn + 1));
}

/* Whether `step` reads remotely in its source's send order (see RawLaunch::ordered_reads). */
SG_DEVICE bool sg_ordered(const sg_call* call, const RawStep* step) {
  return call->args->ordered_reads != 0 && step->turn != NO_TURN;
}

/* Publishes this block's slice of own value `value` to its readers. */
SG_DEVICE void sg_publish(const sg_call* call, uint32_t value) {
  sg_block_sync();
  sg_publish_to_readers(call, value, 0);
}

/* Where a kept value lies in an arena: its chunk's place in IN, or its slot. */
SG_DEVICE uint64_t sg_value_offset(const sg_call* call, const RawValue* value) {
  if (value->slot != SLOT_INPUT) {
    return call->layout.in_bytes + (uint64_t)value->slot * call->layout.slot_bytes;
  }
  uint64_t offset, bytes;
  sg_chunk(&call->layout, value->chunk, &offset, &bytes);
  return offset;
}

/* Whether this rank's `IN` chunk `value` (one of its own, SLOT_INPUT) is read where it lies in
 * the caller's input instead of a copy in IN: no other rank reads it (the copy is what peers
 * read), the launch scales nothing (a scaled chunk is rounded once, by its copy-in, as the
 * host engine does) and the input is 16-byte aligned (the combines keep their vector loops).
 * The multicast plan's straggler reads every chunk so, so its copy-in, a whole pass over the
 * message before its first combine, is gone from the critical path; an early rank reads its
 * own chunk of the ReduceScatter so. Nothing of the call overwrites the input before its last
 * read: a rank writes its output chunk c (the same bytes, in place) only once it holds the
 * complete chunk, after every step that read its own contribution to it (the lowering refuses
 * a plan that reads its IN chunk c after writing output chunk c: LowerError::
 * ReadsInputAfterOutput). Every rank decides alike for its own chunks; a peer never asks. */
SG_DEVICE bool sg_input_in_place(const sg_call* call, const RawValue* value) {
  const RawLaunch* a = call->args;
  return value->slot == SLOT_INPUT && value->reader_count == 0 && a->has_scale == 0 &&
         a->input % 16 == 0;
}

/* Where value `v` of rank `r` lives (IN, or its arena slot), or 0 if it is not kept. A pushed
 * value (RawValue::pushed) lies at its slot in this rank's own arena: its owner wrote it into
 * each reader's, and keeps the copy it pushes from in its own. One kept in the multicast region
 * lies in this rank's own memory there, for its readers and its owner alike (the owner's
 * multimem stores write its own copy too; an owner never reads a value it pushes, which the
 * lowering refuses). An own IN chunk that no peer reads may lie in the caller's input
 * (sg_input_in_place). */
SG_DEVICE unsigned char* sg_value_at(const sg_call* call, uint32_t r, uint32_t v) {
  const RawValue* value = sg_value(call, r, v);
  if (value->slot == SLOT_NONE) return 0;
  const uint32_t rank = call->args->rank;
  if (r == rank && sg_input_in_place(call, value)) {
    return (unsigned char*)call->args->input + sg_value_offset(call, value);
  }
  uint64_t region_offset;
  if (sg_in_multicast(call, value, &region_offset)) {
    return (unsigned char*)call->args->multicast_own[call->parity] + region_offset;
  }
  const uint32_t holder = value->pushed ? rank : r;
  return (unsigned char*)call->peers[holder].arena[call->parity] + sg_value_offset(call, value);
}

/* One element of a buffer that may not be 16-byte aligned (a user's; one load when the
 * element is aligned to its size, see sg_copy_bytes). */
template <class L>
SG_DEVICE typename L::elem sg_load_elem(const unsigned char* p) {
  typename L::elem e;
  sg_copy_bytes(&e, p, sizeof(e));
  return e;
}

template <class L>
SG_DEVICE void sg_store_elem(unsigned char* p, typename L::elem e) {
  sg_store_bytes(p, &e, sizeof(e));
}

/* Whether every pointer given is 16-byte aligned (a null destination counts as aligned). */
SG_DEVICE bool sg_aligned16(const unsigned char* const* operands, uint32_t count,
                            const unsigned char* out_a, const unsigned char* out_b) {
  bool aligned = (uint64_t)out_a % 16 == 0 && (uint64_t)out_b % 16 == 0;
  for (uint32_t i = 0; i < count; ++i) aligned = aligned && (uint64_t)operands[i] % 16 == 0;
  return aligned;
}

#ifdef STRAGGLAR_HOST_EMULATION
/* Multimem stores the data loops made (a test tells them from the pushes after a step by it). */
static uint64_t sg_loop_multimem_stores = 0;
#endif

/* Stores one 16-byte vector at byte `at` of up to two destinations; `out_a` is a multicast
 * address where `a_multicast` says so (one multimem store: every member's memory). A flag, not
 * a third pointer: the data loops have no registers to spare (a third pointer made the step and
 * the kernel spill, docs/KERNELS.md). */
SG_DEVICE void sg_store16_to(unsigned char* out_a, unsigned char* out_b, bool a_multicast,
                             uint64_t at, sg_vec16 v) {
  if (out_a && a_multicast) {
    sg_multimem_store16(out_a + at, v);
#ifdef STRAGGLAR_HOST_EMULATION
    __atomic_fetch_add(&sg_loop_multimem_stores, 1, __ATOMIC_RELAXED);
#endif
  } else if (out_a) {
    sg_store16(out_a + at, v);
  }
  if (out_b) sg_store16(out_b + at, v);
}

/* Runs this thread's passes of a vector loop over bytes [begin, end): the thread's first vector
 * at `begin + thread * 16`, each pass PASS::BYTES(ctx) further, with its loads into one of two
 * register buffers and its results stored from it. Pass i + 1's loads are issued before pass
 * i's results are combined and stored (double buffering, the buffers taking turns so that no
 * register moves from one to the other while its loads are in flight), so a thread keeps the
 * next pass's loads in flight through the current pass's arithmetic and stores: every wait on
 * a load's latency overlaps a whole pass of work. PASS gives `buffer`, `BYTES`, `load` (issue
 * every load of a pass, nothing used) and `store` (combine and store a pass whose loads were
 * issued). Inlined into its caller (sg_apply, sg_copy_elems): outlined, the loop's call from
 * sg_apply kept the caller's state in callee-saved registers and every shape spilled. */
template <class PASS>
SG_DEVICE void sg_pipeline(const typename PASS::context& ctx, uint64_t begin, uint64_t end) {
  const uint64_t pass = PASS::BYTES(ctx);
  uint64_t at = begin + (uint64_t)SG_THREAD * 16;
  if (at >= end) return;
  /* Loads past the end are masked (no access, zeros), never skipped by a branch: a buffer
   * written on one path only would keep its old value live on the other, and the compiler
   * then keeps both buffers' old values, in local memory (it spilled). */
  typename PASS::buffer a, b;
  PASS::load(ctx, a, at);
  for (;;) {
    PASS::load(ctx, b, at + pass);
    PASS::store(ctx, a, at);
    at += pass;
    if (at >= end) return;
    PASS::load(ctx, a, at + pass);
    PASS::store(ctx, b, at);
    at += pass;
    if (at >= end) return;
  }
}

/* What a plain copy's passes need: the source, the block stride (bytes), the end of the
 * range and up to two destinations, the first a multicast address with `a_multicast`. */
struct sg_copy_ctx {
  const unsigned char* src;
  uint64_t stride;
  uint64_t end;
  unsigned char* out_a;
  unsigned char* out_b;
  bool a_multicast;
};

/* One pass of a plain copy: UNROLL vectors a block stride apart (those below the end). */
template <uint32_t UNROLL>
struct sg_copy_pass {
  typedef sg_copy_ctx context;
  typedef sg_vec16 buffer[UNROLL];
  SG_DEVICE uint64_t BYTES(const context& c) { return c.stride * UNROLL; }
  SG_DEVICE void load(const context& c, buffer& v, uint64_t at) {
    SG_UNROLL
    for (uint32_t j = 0; j < UNROLL; ++j) {
      const sg_vec16 zero = {{0, 0, 0, 0}};
      const uint64_t pos = at + j * c.stride;
      v[j] = pos < c.end ? sg_load16_fresh(c.src + pos) : zero;
    }
  }
  SG_DEVICE void store(const context& c, const buffer& v, uint64_t at) {
    SG_UNROLL
    for (uint32_t j = 0; j < UNROLL; ++j) {
      if (at + j * c.stride < c.end) {
        sg_store16_to(c.out_a, c.out_b, c.a_multicast, at + j * c.stride, v[j]);
      }
    }
  }
};

/* A copy of bytes [begin, end) (multiples of 16 from 16-byte aligned bases) to up to two
 * destinations: each thread moves 4 vectors a block stride apart per pass, and issues the next
 * pass's 4 loads before it stores this pass's (sg_pipeline), so a copy (most of a call's
 * traffic: the exchange's copies, and copy-in) keeps 4 to 8 16-byte loads in flight per
 * thread, which a read over NVLink needs to approach the link rate (8 x 16 B x 512 threads x
 * 32 blocks: 2 MiB over the default grid). Two buffers of 8 vectors spilled. */
SG_DEVICE void sg_copy16(const unsigned char* src, uint64_t begin, uint64_t end,
                         unsigned char* out_a, unsigned char* out_b, bool a_multicast) {
  sg_copy_ctx c;
  c.src = src;
  c.stride = (uint64_t)SG_THREADS * 16;
  c.end = end;
  c.out_a = out_a;
  c.out_b = out_b;
  c.a_multicast = a_multicast;
  sg_pipeline<sg_copy_pass<4> >(c, begin, end);
}

/* A copy of bytes [begin, end) of elements of `elem` bytes from `src` to up to two
 * destinations, any alignment: whole vectors when every pointer allows, the rest element by
 * element. Bytes move unchanged (a NaN keeps its payload), as the host engine's copies. With
 * `a_multicast`, `out_a` is a multicast address, which only whole vectors may reach: the
 * caller's promise is that every pointer is aligned and the range whole vectors (sg_step).
 * Outlined, so the kernel's own register pressure never spills into this loop. */
SG_OUTLINED void sg_copy_elems(const unsigned char* src, uint64_t begin, uint64_t end,
                               uint32_t elem, unsigned char* out_a, unsigned char* out_b,
                               bool a_multicast) {
  if (elem == 0 || elem > 8) return; /* a type the kernel does not know (sg_plan_ok refuses it) */
  if (sg_aligned16(&src, 1, out_a, out_b)) {
    const uint64_t vec_end = begin + (end - begin) / 16 * 16;
    sg_copy16(src, begin, vec_end, out_a, out_b, a_multicast);
    begin = vec_end;
  }
  const uint64_t stride = (uint64_t)SG_THREADS * elem; /* read once: barriers clobber memory */
  for (uint64_t at = begin + (uint64_t)SG_THREAD * elem; at < end; at += stride) {
    unsigned char e[8];
    sg_copy_bytes(e, src + at, elem);
    if (out_a) sg_store_bytes(out_a + at, e, elem);
    if (out_b) sg_store_bytes(out_b + at, e, elem);
  }
}

/* 16 bytes of elements of lane L. */
template <class L>
union sg_lanes {
  sg_vec16 v;
  typename L::elem e[16 / sizeof(typename L::elem)];
};

/* Loads the POSITIONS vectors at byte `at`, a block stride apart, of operands [first, first +
 * BATCH): every load issued before any is used. An operand past `count` or a position past
 * `end` reads zeros (masked, never a break, so the loops unroll and `in` stays in registers). */
template <class L, uint32_t POSITIONS, uint32_t BATCH>
SG_DEVICE void sg_load_batch(sg_lanes<L> (&in)[POSITIONS][BATCH],
                             const unsigned char* const* operands, uint32_t first,
                             uint32_t count, uint64_t at, uint64_t stride, uint64_t end) {
  SG_UNROLL
  for (uint32_t j = 0; j < BATCH; ++j) {
    SG_UNROLL
    for (uint32_t p = 0; p < POSITIONS; ++p) {
      sg_vec16 zero = {{0, 0, 0, 0}};
      const bool live = first + j < count && at + p * stride < end;
      in[p][j].v = live ? sg_load16_fresh(operands[first + j] + at + p * stride) : zero;
    }
  }
}

/* A lane's fold as it is stored: finished (only a sum finishes, for avg: the other ops'
 * instantiations carry no division) and narrowed. */
template <class L, uint32_t OP>
SG_DEVICE typename L::elem sg_result(const sg_math* m, typename L::acc v, bool finish) {
  return L::narrow(OP == OP_SUM && finish ? L::finish(m->op, v, m->ranks) : v);
}

/* What a reduce's passes need: the math, the operands (16-byte aligned, `count` >= 1), the
 * block stride (bytes), the end of the range, up to two destinations (the first a multicast
 * address with `a_multicast`), whether the first operand is scaled (by `scalar`) and whether
 * the result is finished. */
template <class L>
struct sg_reduce_ctx {
  sg_math math; /* by value: the loop reads it from registers, not the caller's copy */
  const unsigned char* const* operands;
  uint32_t count;
  uint64_t stride;
  uint64_t end;
  unsigned char* out_a;
  unsigned char* out_b;
  bool a_multicast;
  bool scale;
  typename L::acc scalar;
  bool finish;
};

/* One pass of a combine whose operands all fit one batch (`count` <= BATCH, the caller's
 * promise): POSITIONS vectors a block stride apart of every operand, every load issued before
 * any is used. An operand past `count` or a position past the end reads zeros (masked, never a
 * break, so the loops unroll and the buffer stays in registers) and a masked position is not
 * stored. Each lane is folded over the operands in their order, finished and narrowed in turn,
 * so no accumulator outlives its lane and a position's result is packed as its lanes complete
 * (16 one-byte lanes a vector would need 16 accumulators each otherwise, which spilled). */
template <class L, uint32_t OP, uint32_t POSITIONS, uint32_t BATCH>
struct sg_reduce_pass {
  typedef sg_reduce_ctx<L> context;
  typedef sg_lanes<L> buffer[POSITIONS][BATCH];
  SG_DEVICE uint64_t BYTES(const context& c) { return c.stride * POSITIONS; }
  SG_DEVICE void load(const context& c, buffer& in, uint64_t at) {
    sg_load_batch<L, POSITIONS, BATCH>(in, c.operands, 0, c.count, at, c.stride, c.end);
  }
  SG_DEVICE void store(const context& c, const buffer& in, uint64_t at) {
    typedef typename L::acc A;
    enum { LANES = 16 / sizeof(typename L::elem) };
    SG_UNROLL
    for (uint32_t p = 0; p < POSITIONS; ++p) {
      if (p > 0 && at + p * c.stride >= c.end) break;
      sg_lanes<L> out;
      SG_UNROLL
      for (uint32_t k = 0; k < LANES; ++k) {
        const A first = L::widen(in[p][0].e[k]);
        A v = c.scale ? L::multiply(first, c.scalar) : first;
        SG_UNROLL
        for (uint32_t j = 1; j < BATCH; ++j) {
          if (j < c.count) v = L::combine(OP, v, L::widen(in[p][j].e[k]));
        }
        out.e[k] = sg_result<L, OP>(&c.math, v, c.finish);
      }
      sg_store16_to(c.out_a, c.out_b, c.a_multicast, at + p * c.stride, out.v);
    }
  }
};

/* Reduces the vector at byte `at` of every operand, reading them in batches of BATCH (every
 * load of a batch issued before any is combined) into an accumulator per lane, and stores the
 * result to up to two destinations: for more operands than one batch holds. The fold keeps the
 * operands' order, whatever the batching; loops of constant trip count are fully unrolled, so
 * `in` and `acc` stay in registers (an operand past `count` is masked, never a break).
 * `count` >= 1. */
template <class L, uint32_t OP, uint32_t BATCH>
SG_DEVICE void sg_reduce_batched_at(const sg_reduce_ctx<L>& c, uint64_t at) {
  typedef typename L::acc A;
  enum { LANES = 16 / sizeof(typename L::elem) };
  A acc[LANES];
  SG_UNROLL
  for (uint32_t k = 0; k < LANES; ++k) acc[k] = A();
  for (uint32_t first = 0; first < c.count; first += BATCH) {
    sg_lanes<L> in[1][BATCH];
    sg_load_batch<L, 1, BATCH>(in, c.operands, first, c.count, at, c.stride, c.end);
    SG_UNROLL
    for (uint32_t j = 0; j < BATCH; ++j) {
      if (first + j >= c.count) continue;
      SG_UNROLL
      for (uint32_t k = 0; k < LANES; ++k) {
        const A x = L::widen(in[0][j].e[k]);
        /* Only the first operand starts the fold (`j > 0` is known when unrolled). */
        if (j > 0 || first > 0) {
          acc[k] = L::combine(OP, acc[k], x);
        } else {
          acc[k] = c.scale ? L::multiply(x, c.scalar) : x;
        }
      }
    }
  }
  sg_lanes<L> out;
  SG_UNROLL
  for (uint32_t k = 0; k < LANES; ++k) out.e[k] = sg_result<L, OP>(&c.math, acc[k], c.finish);
  sg_store16_to(c.out_a, c.out_b, c.a_multicast, at, out.v);
}

/* The vector core of every combine, for lane L and op OP fixed at compile time (the runtime
 * switch on the op sits outside the loop, in sg_apply_typed): over bytes [begin, end) of
 * 16-byte aligned operands (a multiple of 16 bytes), out = finish?(OP-fold of the operands, the
 * first optionally scaled). With ONE_BATCH (the caller's promise: `count` <= BATCH) each pass
 * is an sg_reduce_pass of POSITIONS vectors a block stride apart, double-buffered by
 * sg_pipeline: the next pass's POSITIONS x BATCH loads are in flight while this one's are
 * combined and stored. Otherwise (POSITIONS is then 1) each vector is folded over batches of
 * BATCH operands. `count` >= 1. */
template <class L, uint32_t OP, uint32_t POSITIONS, uint32_t BATCH, bool ONE_BATCH>
SG_DEVICE void sg_reduce16(const sg_math* m, const unsigned char* const* operands, uint32_t count,
                           uint64_t begin, uint64_t end, unsigned char* out_a,
                           unsigned char* out_b, bool a_multicast, bool scale, bool finish) {
  typedef typename L::elem E;
  sg_reduce_ctx<L> c;
  c.math = *m;
  c.operands = operands;
  c.count = count;
  c.stride = (uint64_t)SG_THREADS * 16;
  c.end = end;
  c.out_a = out_a;
  c.out_b = out_b;
  c.a_multicast = a_multicast;
  c.scale = scale;
  c.scalar = scale ? L::widen(*(const E*)m->scale) : typename L::acc();
  c.finish = finish;
  if (ONE_BATCH) {
    sg_pipeline<sg_reduce_pass<L, OP, POSITIONS, BATCH> >(c, begin, end);
    return;
  }
  for (uint64_t at = begin + (uint64_t)SG_THREAD * 16; at < end; at += c.stride) {
    sg_reduce_batched_at<L, OP, BATCH>(c, at);
  }
}

/* The elements of bytes [from, end) one at a time, for buffers sg_reduce16 cannot take (a
 * partial last unit, or everything when a user's buffer is misaligned). */
template <class L, uint32_t OP>
SG_DEVICE void sg_reduce_elems(const sg_math* m, const unsigned char* const* operands,
                               uint32_t count, uint64_t from, uint64_t end,
                               unsigned char* out_a, unsigned char* out_b, bool scale,
                               bool finish) {
  typedef typename L::elem E;
  typedef typename L::acc A;
  const A scalar = scale ? L::widen(*(const E*)m->scale) : A();
  const uint64_t stride = (uint64_t)SG_THREADS * sizeof(E);
  for (uint64_t at = from + (uint64_t)SG_THREAD * sizeof(E); at < end; at += stride) {
    A acc = L::widen(sg_load_elem<L>(operands[0] + at));
    if (scale) acc = L::multiply(acc, scalar);
    for (uint32_t i = 1; i < count; ++i) {
      acc = L::combine(OP, acc, L::widen(sg_load_elem<L>(operands[i] + at)));
    }
    E e = sg_result<L, OP>(m, acc, finish);
    if (out_a) sg_store_elem<L>(out_a + at, e);
    if (out_b) sg_store_elem<L>(out_b + at, e);
  }
}

/* The element-wise core of every step, for lane L and op OP: for each element of bytes
 * [begin, end) of the chunk, out = finish?(OP-fold of `count` operands, the first optionally
 * scaled), written to up to two destinations. Operands are arena slots (16-byte aligned) or the
 * caller's input. Whole vectors go through sg_reduce16 when every pointer is aligned:
 *  - one operand (a scaled copy-in, which never combines): four vectors per pass;
 *  - two (the exchange: a partial and the straggler's input): two vectors per pass, four
 *    loads;
 *  - three or four: one vector per pass, four operands per batch, three or four loads;
 *  - five or more (the early ranks' direct pull: 7 operands at 8 ranks): one vector per pass,
 *    eight operands per batch, so a pull of up to eight operands issues every load before any
 *    arithmetic (7 in flight at 8 ranks); more take batches of eight.
 * The first three hold every operand in one batch, fold lane by lane (no accumulators), and
 * are double-buffered (sg_pipeline): the next pass's loads are issued before this pass's
 * results are combined and stored, so a thread has up to two passes' loads in flight (8 for
 * the exchange: 2 MiB over the default grid of 32 blocks of 512 threads) and never fewer than
 * one pass's while it stores. Two buffers of 32 registers each (eight 16-byte loads a pass)
 * spilled for one-byte lanes. No function of the kernel spills within one 512-thread block per
 * SM (ptxas; docs/KERNELS.md, tests/nvrtc.rs).
 *
 * Outlined (one function per lane and op, called from each step), not inlined: inlined into
 * every caller, the 40 instantiations made one kernel body NVRTC needed many minutes for. */
template <class L, uint32_t OP>
SG_OUTLINED void sg_apply(const sg_math math, const unsigned char* const* operands,
                          uint32_t count, uint64_t begin, uint64_t end, unsigned char* out_a,
                          unsigned char* out_b, bool a_multicast, bool scale, bool finish) {
  /* `math` comes by value: a pointer to the caller's copy would pin the caller's call state in
   * local memory across the call. */
  const sg_math* m = &math;
  uint64_t vec_end = begin;
  if (sg_aligned16(operands, count, out_a, out_b)) {
    vec_end = begin + (end - begin) / 16 * 16;
    if (OP == OP_SUM && count == 1) { /* sg_apply_typed sends every single operand here */
      sg_reduce16<L, OP, 4, 1, true>(m, operands, count, begin, vec_end, out_a, out_b, a_multicast,
                                     scale, finish);
    } else if (count == 2) {
      sg_reduce16<L, OP, 2, 2, true>(m, operands, count, begin, vec_end, out_a, out_b, a_multicast,
                                     scale, finish);
    } else if (count <= 4) {
      sg_reduce16<L, OP, 1, 4, true>(m, operands, count, begin, vec_end, out_a, out_b, a_multicast,
                                     scale, finish);
    } else {
      /* A pull of up to 8 operands (an early rank's 7 at 8 ranks) loads every one of them
       * before any combining; more take batches of 8. */
      sg_reduce16<L, OP, 1, 8, false>(m, operands, count, begin, vec_end, out_a, out_b, a_multicast,
                                      scale, finish);
    }
  }
  sg_reduce_elems<L, OP>(m, operands, count, vec_end, end, out_a, out_b, scale, finish);
}

/* sg_apply for lane L, the op fixed by one switch here (avg and premulsum combine as sums; a
 * single operand never combines, so it takes the sum's instantiation whatever the op). */
template <class L>
SG_DEVICE void sg_apply_typed(const sg_math* m, const unsigned char* const* operands,
                              uint32_t count, uint64_t begin, uint64_t end, unsigned char* out_a,
                              unsigned char* out_b, bool a_multicast, bool scale, bool finish) {
  const uint32_t op = count == 1 ? (uint32_t)OP_SUM : m->op;
  switch (op) {
    case OP_PROD:
      sg_apply<L, OP_PROD>(*m, operands, count, begin, end, out_a, out_b, a_multicast, scale,
                           finish);
      break;
    case OP_MAX:
      sg_apply<L, OP_MAX>(*m, operands, count, begin, end, out_a, out_b, a_multicast, scale,
                          finish);
      break;
    case OP_MIN:
      sg_apply<L, OP_MIN>(*m, operands, count, begin, end, out_a, out_b, a_multicast, scale,
                          finish);
      break;
    default:
      sg_apply<L, OP_SUM>(*m, operands, count, begin, end, out_a, out_b, a_multicast, scale,
                          finish);
      break;
  }
}

/* A step's element-wise work over bytes [begin, end): a copy or a combine of the scratch's
 * `operands` into up to two destinations, the first a multicast address with `a_multicast`
 * (then every pointer is aligned and the range whole vectors: see sg_step). */
SG_DEVICE void sg_apply_any(const sg_math* m, const sg_step_scratch* s, uint32_t operands,
                            uint64_t begin, uint64_t end, unsigned char* out_a,
                            unsigned char* out_b, bool a_multicast, bool scale, bool finish) {
  /* A plain copy moves bytes, whatever the type (as the host engine's copies do), so a NaN keeps
   * its payload; everything else goes through the lanes. */
  sg_shared_access();
  if (operands == 1 && !scale && !finish) {
    sg_copy_elems(s->operands[0], begin, end, sg_elem_size(m->dt), out_a, out_b, a_multicast);
    return;
  }
  SG_WITH_LANE(m->dt, L,
               sg_apply_typed<L>(m, s->operands, operands, begin, end, out_a, out_b, a_multicast,
                                 scale, finish));
}

/* Every thread of the block, after a barrier that follows the writes of `from` (this rank's
 * copy of own pushed value `v`, at its slot): writes the block's bytes [begin, end) of it,
 * rounded up to whole 16-byte units (the slot's padding goes along), to each reader. A value
 * the launch keeps in its multicast region goes there with one multimem store per vector,
 * reaching every rank's memory at once; any other to the same slot of each reader's arena,
 * through its peer mapping, two readers a pass, so each of the owner's loads serves two
 * stores. The value's flags go out afterwards (sg_publish_to_readers). */
SG_DEVICE void sg_push(const sg_call* call, const RawValue* v, const unsigned char* from,
                       uint64_t begin, uint64_t end) {
  const uint64_t stop = sg_align16(end);
  uint64_t region_offset;
  if (sg_in_multicast(call, v, &region_offset)) {
    unsigned char* region = (unsigned char*)call->args->multicast_arena[call->parity];
    const uint64_t stride = (uint64_t)SG_THREADS * 16;
    for (uint64_t at = begin + (uint64_t)SG_THREAD * 16; at < stop; at += stride) {
      sg_multimem_store16(region + region_offset + at, sg_load16_fresh(from + at));
    }
    return;
  }
  const uint64_t offset = sg_value_offset(call, v);
  const RawPlanHeader* plan = call->plan;
  const uint32_t* readers = sg_at<uint32_t>(plan, plan->readers_at) + v->first_reader;
  unsigned char* out[2] = {0, 0};
  uint32_t filled = 0;
  for (uint32_t i = 0; i < v->reader_count; ++i) {
    if (readers[i] >= plan->ranks) continue; /* a damaged blob's reader: no rank */
    out[filled++] = (unsigned char*)call->peers[readers[i]].arena[call->parity] + offset;
    if (filled == 2 || i + 1 == v->reader_count) {
      sg_copy16(from, begin, stop, out[0], out[1], false);
      out[1] = 0;
      filled = 0;
    }
  }
}

/* A pushed value goes from the copy a step just made into its readers' arenas, once the
 * block's writes of it are done (the push's threads read bytes other threads wrote): one block
 * barrier more than a step that pushes nothing pays (docs/KERNELS.md). Outlined, so a step's
 * own path keeps its two barriers. */
SG_OUTLINED void sg_push_made(const sg_call* call, const RawValue* v, const unsigned char* from,
                              uint64_t begin, uint64_t end) {
  sg_block_sync();
  sg_push(call, v, from, begin, end);
}

/* Copies this rank's input into IN, chunk by chunk, scaling it, publishing each slice: two
 * barriers a chunk (thread 0's pointer before it is read, and the publish's), as the barrier of
 * each publish, after the copy, also orders the chunk's reads of the pointer before the next
 * chunk's write of it. A chunk read in place (sg_input_in_place) is skipped: no copy, no
 * barrier. Outlined, as sg_step. */
SG_OUTLINED void sg_copy_in(const sg_call* call, sg_step_scratch* s) {
  const RawLaunch* a = call->args;
  for (uint32_t c = 0; c < call->plan->chunk_count; ++c) {
    if (sg_input_in_place(call, sg_value(call, a->rank, c))) continue;
    uint64_t start, bytes;
    sg_chunk(&call->layout, c, &start, &bytes);
    uint64_t begin, end;
    sg_call_slice(call, bytes, &begin, &end);
    if (SG_THREAD == 0) {
      sg_shared_access();
      s->operands[0] = (const unsigned char*)a->input + start;
    }
#ifndef STRAGGLAR_MUTANT_UNSYNCED_OPERAND
    /* (A planted bug, built only by the mutation runs of docs/EMULATED-GPU.md, drops this
     * barrier: the block's threads may read the pointer before thread 0 wrote it.) */
    sg_block_sync();
#endif
    unsigned char* slot = sg_value_at(call, a->rank, c);
    sg_apply_any(&call->math, s, 1, begin, end, slot, 0, false, a->has_scale != 0, false);
    sg_publish(call, c);
  }
}

/* Runs one combine or copy step. Returns nonzero if the call was given up. Outlined: what
 * stays live across its call into the data loop is the step's own state, not the kernel's as
 * well (ptxas: the kernel's spills around the data loops fell from 228 to 108 bytes per
 * thread, per step; docs/KERNELS.md). */
SG_OUTLINED uint32_t sg_step(const sg_call* call, sg_step_scratch* s, const RawStep* step) {
  const RawPlanHeader* plan = call->plan;
  const RawLaunch* a = call->args;
  const RawSource* sources = sg_at<RawSource>(plan, plan->sources_at) + step->first_source;
  uint64_t start, bytes;
  sg_chunk(&call->layout, step->chunk, &start, &bytes);
  uint64_t begin, end;
  sg_call_slice(call, bytes, &begin, &end);
  /* Two barriers a step: after the waits, and once the step's reads and writes are done.
   * Thread i waits on source i's flag and, with ordered reads, thread count + i on its turn (its
   * turn word for the source), both in this rank's own memory, so the waits run side by side
   * and none is a round trip over the link. A wait that gives up marks this rank failed, which
   * releases the block's other waits (sg_wait watches this rank's own failure word). */
  const uint32_t count = step->source_count;
  const uint32_t waits = sg_ordered(call, step) && step->turn > 0 ? 2 * count : count;
  for (uint32_t i = SG_THREAD; i < waits; i += SG_THREADS) {
    const uint32_t source = i < count ? i : i - count;
    uint32_t status = STATUS_OK;
    if (sources[source].rank != a->rank) {
      if (i < count) {
        const uint32_t* flag = sg_inbox(call, a->rank, sources[i].rank, sources[i].value);
        status = sg_wait(call, flag, call->flag, sources[i].rank);
        /* A value its owner pushed through the multicast address is read at this rank's own
         * address of the bytes: the alias fence orders those loads after the flag's acquire.
         * (A planted bug, built only by the mutation runs of docs/EMULATED-GPU.md, drops it.) */
        uint64_t region_offset;
        if (sg_in_multicast(call, sg_value(call, sources[i].rank, sources[i].value),
                            &region_offset)) {
#ifndef STRAGGLAR_MUTANT_NO_READER_ALIAS_FENCE
          sg_fence_proxy_alias();
#endif
        }
      } else {
        /* This read is its source's send number `turn`: the sends before it go first. Their
         * readers may be any ranks, so every rank's failure releases this wait. */
        status = sg_wait(call, sg_turn_word(call, a->rank, sources[source].rank),
                         sg_served(call->flag, step->turn), SG_ANY_PEER);
      }
    }
    sg_shared_access();
    if (i < count) s->operands[i] = sg_value_at(call, sources[i].rank, sources[i].value);
    s->waits[i] = status;
  }
  /* The acquires above and this barrier order every thread's reads of the sources after the
   * flags were seen. (A planted bug, built only by the mutation runs, drops it.) */
#ifndef STRAGGLAR_MUTANT_NO_BARRIER_AFTER_WAITS
  sg_block_sync();
#endif
  sg_shared_access();
  for (uint32_t i = 0; i < waits; ++i) {
    if (s->waits[i] != STATUS_OK) return s->waits[i];
  }
  unsigned char* own = sg_value_at(call, a->rank, step->out_value);
  unsigned char* output = step->complete ? (unsigned char*)a->output + start : 0;
  bool finish = step->kind == STEP_COMBINE && step->complete;
  /* A value kept in the multicast region goes out through it from the data loop itself: each
   * vector is stored through the multicast address (reaching this rank's copy and every
   * reader's) from the registers it was computed in, with no second pass over the value and no
   * barrier before one, where the loop stores the whole slice by vectors. Otherwise (a partial
   * last vector, a misaligned buffer) and for a value pushed rank by rank, the owner's copy is
   * written, then pushed from. */
  /* The value's table entry is looked up again after the data loop, not kept across it: kept,
   * it made the kernel spill on sm_90 (ptxas). */
  unsigned char* multicast =
      own ? sg_multicast_at(call, sg_value(call, a->rank, step->out_value)) : 0;
  const bool fused = multicast != 0 && (end - begin) % 16 == 0 &&
                     sg_aligned16(s->operands, step->source_count, output, multicast);
  /* A partial nobody reads needs no work, but its turn is still served. */
  if (own || output) {
    sg_apply_any(&call->math, s, step->source_count, begin, end, fused ? multicast : own, output,
                 fused, false, finish);
  }
  const RawValue* made = sg_value(call, a->rank, step->out_value);
  if (own && made->pushed && !fused) sg_push_made(call, made, own, begin, end);
  /* NO_READER (the source's last send) is no rank; neither is a damaged blob's reader. */
  bool serves = sg_ordered(call, step) && step->next_reader < plan->ranks;
  if (!serves && !own) return STATUS_OK;
  /* One barrier ends the step: every thread's reads of the sources are done (each source's next
   * send may go) and every write of its value is made (the value may be published). */
  sg_block_sync();
  /* Thread i hands source i's next turn on (a read in turn has one remote source, so one word
   * is written) and the threads after those publish to the readers: the releases go out
   * together. */
  for (uint32_t i = SG_THREAD; serves && i < step->source_count; i += SG_THREADS) {
    if (sources[i].rank != a->rank) {
      sg_serve(sg_turn_word(call, step->next_reader, sources[i].rank), call->flag, step->turn);
    }
  }
  if (own) sg_publish_to_readers(call, step->out_value, serves ? step->source_count : 0);
  return STATUS_OK;
}

/* Whether a launch may run `plan`: the blob is one of this rank's, of this layout, the
 * launch's type is one the kernel knows, and plan block 0 can spare the arrival warp it needs. */
SG_DEVICE bool sg_plan_ok(const RawLaunch* a, const RawPlanHeader* plan) {
  /* Every rank splits chunks among blocks by `a->threads` (sg_call_slice): it must be the
   * block's size, in whole warps, with room for the arrival warp when there is one. */
  const bool block_ok = a->threads == SG_BLOCK_DIM && SG_BLOCK_DIM % SG_ARRIVAL_LANES == 0;
  const bool arrival_fits = !sg_has_arrival(a) || SG_BLOCK_DIM > SG_ARRIVAL_LANES;
  return block_ok && arrival_fits && plan != 0 && plan->magic == PLAN_MAGIC && plan->version == PLAN_VERSION &&
         plan->rank == a->rank && plan->ranks >= 1 && plan->ranks <= SG_MAX_OPERANDS &&
         plan->chunk_count >= 1 && sg_elem_size((uint32_t)a->datatype) != 0;
}

/* What the arrival protocol of a launch watches (the words of RawLaunch or RawTicket). */
SG_DEVICE sg_watch sg_watch_of(uint64_t abort, uint64_t status, uint64_t peers, uint32_t rank,
                               uint32_t ranks, uint64_t timeout_ns) {
  sg_watch w;
  w.abort = (const uint32_t*)abort;
  w.status = (uint32_t*)status;
  w.peers = (const RawPeer*)peers;
  w.rank = rank;
  w.ranks = ranks;
  w.timeout_ns = timeout_ns;
  return w;
}

/* Recomputes the verdict of class `fed`'s next call after its detector or times changed:
 * the other half of it when it is this call's class (this call reads its own half), else both
 * (no call of it runs). */
SG_DEVICE void sg_graph_verdict(RawGraphState* g, const RawRule* rule, uint32_t fed,
                                uint32_t own_class, uint64_t own_calls) {
  RawClassState* c = &g->classes[fed];
  /* The class's calls decided by its next call: this one counts for its own class. */
  uint64_t decided = fed == own_class ? own_calls + 1 : c->calls;
  RawVerdict verdict = sg_verdict(&c->detector, rule, &c->times, decided);
  if (fed == own_class) {
    c->verdict[(own_calls + 1) & 1] = verdict;
  } else {
    c->verdict[0] = verdict;
    c->verdict[1] = verdict;
  }
}

/* What a graph call does once the arrival protocol copied its records into the graph ring
 * (`g->calls` is this call's number, not advanced yet): tracks this call, feeds the previous
 * call's record and the post-arrival time of the call before it, rewrites the verdicts of the
 * classes fed and of this call's, and counts the choice. Outlined: one thread of one block runs
 * it, once per call, and it keeps the kernel's own code small. */
SG_OUTLINED void sg_graph_feed(RawGraphState* g, const RawRule* rule, uint32_t choice) {
  const uint32_t own_class = rule->size_class;
  const uint64_t call = g->calls;
  const uint64_t own_calls = g->classes[own_class].calls;
  /* This call, for the feed of its time two calls later. */
  const bool stragglar = choice != rule->ranks;
  RawClassTimes* own_times = &g->classes[own_class].times;
  RawGraphCall* tracked = &g->history[call % 4];
  tracked->class_plus_one = own_class + 1;
  tracked->stragglar = stragglar ? 1u : 0u;
  tracked->after_switch = own_times->last != 0 && (own_times->last == 2) != stragglar ? 1u : 0u;
  own_times->last = stragglar ? 2u : 1u;
  if (call > 0 && g->previous_class != 0) {
    const RawRingEntry* entry = &g->ring[(call - 1) % RING_ENTRIES];
    const uint32_t fed = g->previous_class - 1;
    sg_observe(&g->classes[fed].detector, rule, (uint32_t)entry->last, (uint32_t)entry->lead);
    sg_graph_verdict(g, rule, fed, own_class, own_calls);
  }
  const RawGraphCall* timed = &g->history[(call + 2) % 4]; /* call - 2's */
  if (call > 1 && timed->class_plus_one != 0 && timed->class_plus_one <= SIZE_CLASSES) {
    const uint32_t post = (uint32_t)g->ring[(call - 2) % RING_ENTRIES].post;
    const uint32_t fed = timed->class_plus_one - 1;
    if (post != POST_UNMEASURED && !timed->after_switch) {
      RawClassState* c = &g->classes[fed];
      uint64_t decided = fed == own_class ? own_calls + 1 : c->calls;
      sg_samples_add(timed->stragglar ? &c->times.stragglar : &c->times.baseline, decided, post);
    }
    sg_graph_verdict(g, rule, fed, own_class, own_calls);
  }
  /* This class's next call has one more call behind it: its verdict's age window moves even
   * when nothing of this class was fed. */
  sg_graph_verdict(g, rule, own_class, own_class, own_calls);
  g->previous_class = own_class + 1;
  g->last_choice = choice + 1;
  if (choice == rule->ranks) {
    g->on_baseline += 1;
  } else {
    g->on_stragglar += 1;
  }
}

/* A graph launch's arrival work: the arrival protocol on the graph board; then the feed of
 * what it copied (sg_graph_feed). */
SG_DEVICE void sg_graph_arrival(const RawLaunch* a, uint32_t choice) {
  RawArrival arrival = sg_graph_arrival_of(a);
  sg_watch w = sg_watch_of(a->abort, a->status, a->peers, a->rank, a->arrival.ranks,
                           a->timeout_ns);
  if (sg_arrive_graph(&arrival, a->rank, &w) != STATUS_OK) return;
  sg_graph_feed((RawGraphState*)a->graph, &a->rule, choice);
}

/* Counts a graph call done: its class's calls and the communicator's (the next call's
 * number, released last). Once per call, by whoever of it reads the numbers last. */
SG_DEVICE void sg_graph_count_call(const RawLaunch* a) {
  RawGraphState* g = (RawGraphState*)a->graph;
  if (sg_graph_ok(a)) g->classes[a->rule.size_class].calls += 1;
  sg_store_release64(&g->calls, g->calls + 1);
}

/* Thread 0 of each block of a graph launch once the block's plan is done, and the arrival
 * thread once its work is: the last of these `blocks + 1` counts the call, after every one of
 * them read the numbers. */
SG_DEVICE void sg_graph_finish(const RawLaunch* a) {
  RawGraphState* g = (RawGraphState*)a->graph;
  if (sg_atomic_add(&g->finished, 1) != a->blocks) return;
  sg_store_volatile(&g->finished, 0);
  sg_graph_count_call(a);
}

/* The threads of the block running plan block `plan_block` (of `block_dim` threads) that run
 * the plan and meet at its barriers: all of them, but in plan block 0 of a launch that
 * records its arrival, all but the last warp (SG_ARRIVAL_LANES threads), whose first thread
 * runs the arrival protocol beside the plan. Arrival work is one thread's spinning: a warp of
 * plan block 0 does it, where a block of its own would hold a whole multiprocessor (the
 * kernel's registers fill one). A block too small to spare the warp keeps every thread
 * (sg_plan_ok then refuses the launch). */
SG_DEVICE uint32_t sg_plan_threads(const RawLaunch* a, uint32_t plan_block, uint32_t block_dim) {
  if (plan_block != 0 || !sg_has_arrival(a) || block_dim <= SG_ARRIVAL_LANES) return block_dim;
  return block_dim - SG_ARRIVAL_LANES;
}

/* The arrival work of a launch (lane `lane` of its `lanes` arrival threads): on the eager board,
 * the first lane publishes, takes the ticket and measures the lead while every lane collects
 * its share of the records waiting; in a graph launch, the first lane alone makes the device's
 * choice, runs the protocol on the graph board, feeds the detector and counts the launch.
 * Outlined: it runs beside the plan. */
SG_OUTLINED void sg_arrival_work(const RawLaunch* a, uint32_t lane, uint32_t lanes) {
  if (a->graph == 0) {
    sg_watch w = sg_watch_of(a->abort, a->status, a->peers, a->rank, a->arrival.ranks,
                             a->timeout_ns);
    if (lane == 0) {
      sg_publish_previous(&a->arrival);
      const uint64_t position = sg_take_ticket(&a->arrival, a->rank);
      if (sg_measure_lead(&a->arrival, position, &w) != STATUS_OK) return;
    }
    sg_collect(&a->arrival, &w, lane, lanes);
    return;
  }
  if (lane != 0) return;
  /* Only this thread of the warp reads the graph state: the grid's last block advances its
   * class's calls once every block, and this thread, has finished (RawClassState), so another
   * thread reading it here would race with that. */
  uint32_t choice = 0;
  sg_graph_plan(a, &choice);
  if (sg_graph_ok(a)) sg_graph_arrival(a, choice);
  sg_graph_finish(a);
}

/* The kernel body, shared by the GPU entry point and the host emulation. The blocks run plan
 * blocks 0..blocks-1, claimed in the order they start; when the launch records its arrival,
 * the last warp of the block running plan block 0 does that instead (and, in a graph launch,
 * feeds the device's detector): sg_plan_threads. */
SG_DEVICE void sg_all_reduce(const RawLaunch* a, sg_scratch* s) {
  /* The plan block is claimed in the order the blocks start, not taken from the hardware index:
   * the blocks resident on a GPU are then always plan blocks 0..k-1, whatever order the GPU
   * dispatches them in and however few multiprocessors other work leaves free. Plan block b
   * of a rank waits only on plan block b of its peers, and the arrival warp (whose lead waits
   * for every rank's ticket) rides in plan block 0, the first block each GPU starts: so the
   * resident blocks of any two GPUs always include matching ones, every rank's ticket is
   * taken by its first resident block, and every call progresses with one multiprocessor
   * free per GPU at the least. (By hardware index, two GPUs that dispatch in different orders
   * can each hold only blocks whose partners wait, unstarted, on the other; and an arrival
   * warp in hardware block 0 can hold a GPU's one free multiprocessor waiting for the ticket
   * of a rank whose block 0 waits, undispatched, behind plan blocks that need this GPU's.)
   * The grid's last block resets the claims with the finished count, before the next launch
   * can start. The whole block meets once after the claim, the arrival warp included: thread
   * 0 announces the plan's thread count with the claim, so that one barrier serves both. */
  if (SG_THREAD == 0) {
    const uint32_t claimed = sg_atomic_add((uint32_t*)a->finished_blocks + 1, 1);
    sg_shared_access();
    s->plan_block = claimed;
    sg_announce_threads(sg_plan_threads(a, claimed, SG_BLOCK_DIM));
  }
  sg_block_sync_all();
  sg_shared_access();
  const uint32_t plan_block = s->plan_block;
  const uint32_t plan_threads = sg_plan_threads(a, plan_block, SG_BLOCK_DIM);
  sg_take_threads(plan_threads);
  if (SG_THREAD >= plan_threads) {
    sg_arrival_work(a, SG_THREAD - plan_threads, SG_BLOCK_DIM - plan_threads);
    sg_emu_arrival_done();
    return;
  }
  if (sg_has_arrival(a)) sg_emu_await_arrival();
  uint32_t choice = 0;
  if (plan_block == 0 && SG_THREAD == 0) {
    if (a->graph != 0 && sg_graph_ok(a)) {
      /* (Where a turn kernel ran before this kernel, it noted the start already.) */
      RawGraphState* g = (RawGraphState*)a->graph;
      if (sg_note_of((uint64_t)g->notes, g->calls)->started != sg_tag(g->calls)) {
        sg_note_started((uint64_t)g->notes, g->calls);
      }
    } else if (a->graph == 0 && a->arrival.board != 0) {
      sg_note_started(a->arrival.note, a->arrival.call);
    }
  }
  const RawPlanHeader* plan = (const RawPlanHeader*)a->plan;
  /* (A graph launch whose baseline is NCCL's captured work runs only on StragglAR's turn, in
   * the body of the conditional node sg_graph_turn opened: the same state gives it the same
   * choice. Were it ever to pick the baseline, the table's empty entry fails it as a bad
   * plan.) */
  if (a->graph != 0) plan = sg_graph_plan(a, &choice);
  sg_call call;
  call.args = a;
  call.plan = plan;
  call.peers = (const RawPeer*)a->peers;
  call.math.op = a->op;
  call.math.ranks = plan ? plan->ranks : 1;
  call.math.dt = (uint32_t)a->datatype;
  call.math.scale = a->scale;
  call.layout = sg_layout_of(a->count, sg_elem_size(call.math.dt), plan ? plan->chunk_count : 1);
  call.block = plan_block;
  uint64_t epoch = sg_load_acquire64((const uint64_t*)a->epoch) + 1;
  call.parity = (uint32_t)(epoch & 1);
  call.flag = (uint32_t)((epoch - 1) % 0xffffffffull) + 1;
  uint32_t status = STATUS_OK;
  if (!sg_plan_ok(a, call.plan)) {
    if (SG_THREAD == 0) sg_fail(&call, STATUS_BAD_PLAN);
    status = STATUS_BAD_PLAN;
  }
  for (uint32_t i = 0; status == STATUS_OK && i < call.plan->step_count; ++i) {
    const RawStep* steps = sg_at<RawStep>(call.plan, call.plan->steps_at);
    sg_step_scratch* half = &s->step[i & 1];
    if (steps[i].kind == STEP_COPY_IN) {
      sg_copy_in(&call, half);
    } else {
      status = sg_step(&call, half, &steps[i]);
    }
  }
  /* The last block to finish notes the call's end (for its post-arrival time, see
   * stragglar_arrival.h) and advances the epoch for the next launch. */
  sg_block_sync();
  if (SG_THREAD == 0) {
    if (sg_atomic_add((uint32_t*)a->finished_blocks, 1) == a->blocks - 1) {
      sg_store_volatile((uint32_t*)a->finished_blocks, 0);
      sg_store_volatile((uint32_t*)a->finished_blocks + 1, 0);
      if (a->graph != 0 && sg_graph_ok(a)) {
        RawGraphState* g = (RawGraphState*)a->graph;
        sg_note_finished((uint64_t)g->notes, g->calls);
      } else if (a->graph == 0 && a->arrival.board != 0) {
        sg_note_finished(a->arrival.note, a->arrival.call);
      }
      sg_store_release64((uint64_t*)a->epoch, epoch);
    }
    if (a->graph != 0) sg_graph_finish(a);
  }
}

/* The ticket kernel's body (thread 0 of its one block): publishes, takes the ticket and, if
 * second-to-last, leaves the lead to the spans. Straight-line code: it never waits. */
SG_DEVICE void sg_ticket(const RawTicket* t) {
  if (SG_THREAD != 0) return;
  sg_publish_previous(&t->arrival);
  sg_lead_from_spans(&t->arrival, sg_take_ticket(&t->arrival, t->rank));
}

/* The end kernel's body (one warp), queued after NCCL's kernel of a measured call: thread 0
 * notes that the call finished on this rank (unless queued late), and every thread collects
 * its share of the records waiting. */
SG_DEVICE void sg_ticket_end(const RawTicket* t) {
  if (SG_THREAD == 0 && t->end != END_COLLECTS_ONLY) {
    sg_note_finished(t->arrival.note, t->arrival.call);
  }
  sg_watch w = sg_watch_of(t->abort, t->status, t->peers, t->rank, t->arrival.ranks,
                           t->timeout_ns);
  sg_collect(&t->arrival, &w, SG_THREAD, SG_BLOCK_DIM);
}

/* The rest of a graph call's arrival protocol on NCCL's turn (thread 0 of one block), in the
 * body that holds NCCL's work, beside it: the records the feed reads, the lead if the ticket
 * sg_graph_turn took was second-to-last, the feed, and the call counted. Its only wait for the
 * call itself is for the last rank's ticket, which that rank's turn kernel takes before
 * anything of its call waits: so it ends in whatever order the GPU runs it and NCCL's work. */
SG_DEVICE void sg_graph_nccl_arrival(const RawLaunch* a) {
  if (SG_THREAD != 0 || a->graph == 0 || !sg_graph_ok(a)) return;
  RawGraphState* g = (RawGraphState*)a->graph;
  uint32_t choice = 0;
  sg_graph_plan(a, &choice); /* the turn kernel's choice: nothing changed the state since */
  const RawArrival arrival = sg_graph_arrival_of(a);
  sg_watch w = sg_watch_of(a->abort, a->status, a->peers, a->rank, a->arrival.ranks,
                           a->timeout_ns);
  if (sg_graph_records(&arrival, &w) == STATUS_OK &&
      sg_measure_lead(&arrival, sg_noted_position(&arrival), &w) == STATUS_OK) {
    sg_graph_feed(g, &a->rule, choice);
  }
  sg_graph_count_call(a);
}

/* The end kernel of a graph call on NCCL's turn in the sample (thread 0 of one block), in the
 * body after NCCL's: notes that the call finished on this rank now, for its post-arrival time,
 * which the next call publishes. The arrival kernel beside NCCL's work has counted the call,
 * so it is the one before `calls`. */
SG_DEVICE void sg_graph_end(const RawLaunch* a) {
  if (SG_THREAD != 0 || a->graph == 0 || !sg_graph_ok(a)) return;
  RawGraphState* g = (RawGraphState*)a->graph;
  const uint64_t calls = sg_load_acquire64(&g->calls);
  if (calls > 0) sg_note_finished((uint64_t)g->notes, calls - 1);
}

/* The bandwidth probe's body: out = op-fold of the operands over `bytes`, block b taking its
 * slice as the AllReduce kernel slices a chunk (the same vector code). */
SG_DEVICE void sg_apply_probe(const RawApply* a, sg_scratch* s) {
  if (SG_THREAD == 0) sg_announce_threads(SG_BLOCK_DIM);
  sg_block_sync_all();
  sg_take_threads(SG_BLOCK_DIM);
  sg_math math;
  math.op = a->op;
  math.ranks = 1;
  math.dt = (uint32_t)a->datatype;
  math.scale = 0;
  uint32_t operands = a->operand_count < APPLY_MAX_OPERANDS ? a->operand_count : APPLY_MAX_OPERANDS;
  if (SG_THREAD == 0) {
    sg_shared_access();
    for (uint32_t i = 0; i < operands; ++i)
      s->step[0].operands[i] = (const unsigned char*)a->operands[i];
  }
  sg_block_sync();
  uint64_t begin, end;
  sg_slice(a->bytes, SG_BLOCK, SG_BLOCKS, &begin, &end);
  sg_apply_any(&math, &s->step[0], operands, begin, end, (unsigned char*)a->output, 0, false,
               false, false);
}

/* The pointer chase (RawChase): thread 0 of block 0 alone loads `hops` words in turn, each
 * the offset of the next, with the flag polls' system-scope relaxed load, so no load can
 * start before the one before it returned; it starts where `at` says and leaves there the
 * offset it ended at. */
SG_DEVICE void sg_chase(const RawChase* c) {
  if (SG_THREAD != 0 || SG_BLOCK != 0) return;
  const unsigned char* ring = (const unsigned char*)c->ring;
  uint64_t* at = (uint64_t*)c->at;
  const uint64_t hops = c->hops;
  uint64_t offset = sg_load_relaxed64(at);
  for (uint64_t i = 0; i < hops; ++i) offset = sg_load_relaxed64((const uint64_t*)(ring + offset));
  sg_store_relaxed64(at, offset);
}

/* The peer probe (RawPeerProbe): by the first thread alone, over every peer in turn, the GPU's
 * own acquire load, system-scope atomic add and load of this rank's probe word in the peer's
 * staging, which the copy engine left holding the token; the verdict is released last. */
SG_DEVICE void sg_peer_probe(const RawPeerProbe* p) {
  if (SG_THREAD != 0 || SG_BLOCK != 0) return;
  const RawPeer* peers = (const RawPeer*)p->peers;
  uint32_t verdict = PEER_PROBE_PASSED;
  for (uint32_t r = 0; r < p->ranks; ++r) {
    if (r == p->rank) continue;
    uint32_t* word = (uint32_t*)(peers[r].flags[0] + p->probe_from_flags);
    const uint32_t seen = sg_load_acquire(word);
    const uint32_t before = sg_atomic_add_sys(word, 1);
    const uint32_t after = sg_load_acquire(word);
    if (seen != p->token || before != p->token || after != p->token + 1) {
      verdict = PEER_PROBE_FAILED + r;
      break;
    }
  }
  sg_store_release((uint32_t*)p->result, verdict);
}

/* The multicast probe (RawMulticastProbe): the first thread stores this rank's pattern, 16
 * bytes of the token and the rank (two lanes of it NaN patterns as f32), through the multicast
 * address into slot `rank` of every member's memory; the host reads each member's slots once
 * every rank's probe finished. */
SG_DEVICE void sg_multicast_probe(const RawMulticastProbe* p) {
  if (SG_THREAD != 0 || SG_BLOCK != 0) return;
  sg_vec16 v;
  v.w[0] = p->token;
  v.w[1] = p->rank;
  v.w[2] = ~p->token;
  v.w[3] = ~p->rank;
  sg_multimem_store16((unsigned char*)p->multicast + 16 * (uint64_t)p->rank, v);
}

#ifdef STRAGGLAR_HOST_EMULATION
thread_local sg_host_thread sg_self;

/* The OS-thread harness's multicast objects: a range of addresses [base, base + bytes) that
 * the harness never maps for plain access, whose store at base + o writes o bytes past each
 * member's start. Registered by stragglar_emulate_multicast; a few at once (tests run side by
 * side). */
struct sg_host_multicast {
  uint64_t base, bytes;
  uint32_t count;
  uint64_t members[SG_MAX_OPERANDS];
};
static sg_host_multicast sg_multicasts[16];
static pthread_mutex_t sg_multicasts_lock = PTHREAD_MUTEX_INITIALIZER;
/* Multimem stores the harness wrote, into any object (a test reads it). */
static uint64_t sg_host_multimem_stores;

/* Registers a multicast object over `count` members (each `bytes` long; count at most
 * SG_MAX_OPERANDS) at the addresses [base, base + bytes), or with `count` 0 removes the one at
 * `base`. Returns 0 when there is no room or too many members. */
extern "C" int stragglar_emulate_multicast(uint64_t base, uint64_t bytes, const uint64_t* members,
                                           uint32_t count) {
  if (count > SG_MAX_OPERANDS) return 0;
  pthread_mutex_lock(&sg_multicasts_lock);
  int done = 0;
  for (sg_host_multicast& m : sg_multicasts) {
    const bool removes = count == 0 && m.base == base && m.count != 0;
    if (removes) {
      m.count = 0;
      done = 1;
      break;
    }
    if (count != 0 && m.count == 0) {
      m.base = base;
      m.bytes = bytes;
      for (uint32_t i = 0; i < count; ++i) m.members[i] = members[i];
      m.count = count;
      done = 1;
      break;
    }
  }
  pthread_mutex_unlock(&sg_multicasts_lock);
  return done;
}

/* A multimem store in the OS-thread harness: written into every member at once (these threads
 * hold nothing back); false when `p` lies in no registered object. */
static bool sg_host_multimem_store(void* p, const void* src, uint32_t n) {
  const uint64_t at = (uint64_t)p;
  pthread_mutex_lock(&sg_multicasts_lock);
  bool found = false;
  for (const sg_host_multicast& m : sg_multicasts) {
    if (m.count == 0 || at < m.base || at + n > m.base + m.bytes) continue;
    for (uint32_t i = 0; i < m.count; ++i) memcpy((void*)(m.members[i] + (at - m.base)), src, n);
    sg_host_multimem_stores += 1;
    found = true;
    break;
  }
  pthread_mutex_unlock(&sg_multicasts_lock);
  return found;
}

/* Plan block `b`'s share [out[0], out[1]) of a chunk of `bytes` (sg_block_share), for any
 * arrival warp's width `lanes` (the GPU's 32, which the emulation's one-thread warps do not
 * exercise). */
extern "C" void stragglar_emulate_block_share(uint64_t bytes, uint64_t b, uint64_t blocks,
                                              uint64_t threads, uint64_t lanes, uint64_t* out) {
  sg_block_share(bytes, b, blocks, threads, lanes, &out[0], &out[1]);
}

/* The threads of the block running plan block `plan_block` of a launch that meet at its plan
 * barrier (the others run the arrival work, see sg_plan_threads). */
extern "C" uint32_t stragglar_emulate_plan_threads(const RawLaunch* args, uint32_t plan_block) {
  return sg_plan_threads(args, plan_block, args->threads);
}

/* Runs one emulated GPU thread of block `block` (the harness starts `threads` OS threads per
 * block, all sharing `scratch`; `barriers` are two: for all of them, and for
 * stragglar_emulate_plan_threads(args, 0) of them). With `arrival_gate` (shared by the rank's
 * threads, zero at the start; or null) the plan threads wait after the claim until the
 * arrival work returned. */
extern "C" void stragglar_emulate_thread(const RawLaunch* args, uint32_t block, uint32_t thread,
                                         pthread_barrier_t* barriers, void* scratch,
                                         const uint32_t* arrival_gate) {
  sg_self.block = block;
  sg_self.blocks = args->blocks;
  sg_self.thread = thread;
  sg_self.threads = args->threads;
  sg_self.block_dim = args->threads;
  sg_self.barrier = barriers;
  sg_self.arrival_gate = arrival_gate;
  sg_self.multimem_store = sg_host_multimem_store;
  sg_all_reduce(args, (sg_scratch*)scratch);
}

/* Runs one emulated GPU thread of the bandwidth probe. */
extern "C" void stragglar_emulate_apply_thread(const RawApply* args, uint32_t block,
                                               uint32_t blocks, uint32_t thread,
                                               uint32_t threads, pthread_barrier_t* barrier,
                                               void* scratch) {
  sg_self.block = block;
  sg_self.blocks = blocks;
  sg_self.thread = thread;
  sg_self.threads = threads;
  sg_self.block_dim = threads;
  sg_self.barrier = barrier;
  sg_self.arrival_gate = nullptr;
  sg_apply_probe(args, (sg_scratch*)scratch);
}

/* Runs the ticket kernel (its one working thread). */
extern "C" void stragglar_emulate_ticket(const RawTicket* args) {
  sg_self.block = 0;
  sg_self.blocks = 1;
  sg_self.thread = 0;
  sg_self.threads = 1;
  sg_self.block_dim = 1;
  sg_self.barrier = 0;
  sg_ticket(args);
}

/* Runs the end kernel of a ticketed call (its one working thread). */
extern "C" void stragglar_emulate_ticket_end(const RawTicket* args) {
  sg_self.block = 0;
  sg_self.blocks = 1;
  sg_self.thread = 0;
  sg_self.threads = 1;
  sg_self.block_dim = 1;
  sg_self.barrier = 0;
  sg_ticket_end(args);
}

/* Runs the device rule over `n` records as graph launches would, one call per record: the
 * choice of call i (written to choices[i]) from the records before it, then record i. */
extern "C" void stragglar_emulate_rule(const RawRule* rule, RawDetector* detector,
                                       const uint32_t* last, const uint32_t* lead, uint32_t n,
                                       uint32_t* choices) {
  RawClassTimes unmeasured;
  memset(&unmeasured, 0, sizeof unmeasured);
  for (uint32_t i = 0; i < n; ++i) {
    RawVerdict verdict = sg_verdict(detector, rule, &unmeasured, i);
    choices[i] = sg_choose(rule, &verdict, i);
    sg_observe(detector, rule, last[i], lead[i]);
  }
}

/* One graph call of `rule` as the device decides and feeds it, without the arrival protocol
 * or the plan: the choice from the state, the feed of what `g->ring` holds (the test writes
 * it there as the protocol would), then the call counted as the last block counts it. Returns
 * the choice. */
extern "C" uint32_t stragglar_emulate_graph_call(RawGraphState* g, const RawRule* rule) {
  uint32_t choice = sg_graph_choice(g, rule);
  sg_graph_feed(g, rule, choice);
  g->classes[rule->size_class].calls += 1;
  g->calls += 1;
  return choice;
}

/* Whether graph call `call` on NCCL's turn is in the sample (sg_measures). */
extern "C" uint32_t stragglar_emulate_measures(uint64_t call) { return sg_measures(call) ? 1 : 0; }

/* The kernel's layout of `count` elements of type `dt` in `chunks` chunks: out[0] the IN bytes,
 * out[1] the slot bytes, then each chunk's start and length in bytes (2 + 2 * chunks words). */
extern "C" void stragglar_emulate_layout(uint64_t count, uint32_t dt, uint32_t chunks,
                                         uint64_t* out) {
  sg_layout l = sg_layout_of(count, sg_elem_size(dt), chunks);
  out[0] = l.in_bytes;
  out[1] = l.slot_bytes;
  for (uint32_t c = 0; c < chunks; ++c) sg_chunk(&l, c, &out[2 + 2 * c], &out[3 + 2 * c]);
}

/* The kernel's fp16 (bf16 when `brain`) conversions over `n` values: widened[i] from bits[i],
 * and narrowed[i] from floats[i] (tests compare them with src/reduce/float16.rs). */
extern "C" void stragglar_emulate_half(uint32_t brain, const uint16_t* bits, float* widened,
                                       const float* floats, uint16_t* narrowed, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    widened[i] = brain ? sg_bf16_to_f32(bits[i]) : sg_f16_to_f32(bits[i]);
    narrowed[i] = brain ? sg_f32_to_bf16(floats[i]) : sg_f32_to_f16(floats[i]);
  }
}

/* How many multimem stores the OS-thread harness wrote so far (see sg_host_multimem_store). */
extern "C" uint64_t stragglar_emulate_multimem_stores(void) {
  pthread_mutex_lock(&sg_multicasts_lock);
  const uint64_t stores = sg_host_multimem_stores;
  pthread_mutex_unlock(&sg_multicasts_lock);
  return stores;
}

/* How many of them the data loops made (see sg_store16_to). */
extern "C" uint64_t stragglar_emulate_loop_multimem_stores(void) {
  return __atomic_load_n(&sg_loop_multimem_stores, __ATOMIC_RELAXED);
}

/* How many turns were handed on out of order so far (see sg_serve). */
extern "C" uint64_t stragglar_emulate_served_out_of_order(void) {
  return __atomic_load_n(&sg_served_out_of_order, __ATOMIC_RELAXED);
}

/* Bytes of scratch one emulated block needs. */
extern "C" uint64_t stragglar_emulate_scratch_bytes(void) { return sizeof(sg_scratch); }
#else
/* One 512-thread block per SM, as NCCL's kernels: the grid is the plan's blocks (the arrival
 * protocol runs in a warp of plan block 0), and the register budget (up to 128 per thread) keeps
 * 8 loads in flight per thread in the data loops without spilling (docs/KERNELS.md). */
SG_GLOBAL void __launch_bounds__(MAX_THREADS, 1) ncclStragglarAllReduce(RawLaunch args) {
  __shared__ sg_scratch scratch;
  sg_all_reduce(&args, &scratch);
}

SG_GLOBAL void ncclStragglarTicket(RawTicket args) { sg_ticket(&args); }

SG_GLOBAL void ncclStragglarTicketEnd(RawTicket args) { sg_ticket_end(&args); }

SG_GLOBAL void ncclStragglarGraphArrival(RawLaunch args) { sg_graph_nccl_arrival(&args); }

SG_GLOBAL void ncclStragglarGraphEnd(RawLaunch args) { sg_graph_end(&args); }

SG_GLOBAL void ncclStragglarPeerProbe(RawPeerProbe args) { sg_peer_probe(&args); }

SG_GLOBAL void ncclStragglarMulticastProbe(RawMulticastProbe args) { sg_multicast_probe(&args); }

SG_GLOBAL void ncclStragglarChase(RawChase args) { sg_chase(&args); }

/* `stragglar bench` only: holds its stream for `ns` nanoseconds of %globaltimer, so that a rank
 * sharing a GPU with its peers arrives late on the device, not just on the host. */
SG_GLOBAL void ncclStragglarDelay(uint64_t ns) {
  if (threadIdx.x != 0) return;
  uint64_t start = sg_now_ns();
  while (sg_now_ns() - start < ns) sg_pause();
}

SG_GLOBAL void __launch_bounds__(MAX_THREADS, 1) ncclStragglarApplyProbe(RawApply args) {
  __shared__ sg_scratch scratch;
  sg_apply_probe(&args, &scratch);
}
#endif
