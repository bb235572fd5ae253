/* The bridge between the driver (which sees cuda.h) and the kernel source (which must not). */
#ifndef STRAGGLAR_EMU_KERNEL_SOURCE_H_
#define STRAGGLAR_EMU_KERNEL_SOURCE_H_

#include <cstddef>
#include <cstdint>

namespace emu {

enum class KernelId {
  AllReduce,
  Ticket,
  TicketEnd,
  Delay,
  ApplyProbe,
  PeerProbe,
  MulticastProbe,
  Chase,
  Fault,
  SetBranch,
  GraphTurn,
  GraphArrival,
  GraphEnd,
  Litmus
};

/* The device side of cudaGraphSetConditional (capture.cpp). */
void set_conditional(uint64_t handle, unsigned value);

/* A kernel of cuda/ (or the driver self-test's) the emulated GPU can run: its entry name, its one parameter's size in
 * bytes, and the most threads a block may have (its __launch_bounds__, else 1024). */
struct KernelSpec {
  const char* name;
  KernelId id;
  size_t param_bytes;
  uint32_t max_threads;
};

const KernelSpec* kernel_specs(size_t* count);

/* Runs block `block` of a `blocks`-block launch of `k` with `threads` threads on the calling
 * thread (as fibers), on device `device`; returns when every thread of the block has
 * returned. `launch` numbers the launch in this process (the key of its seeded choices). */
void run_block(const KernelSpec* k, const void* params, uint32_t block, uint32_t blocks,
               uint32_t threads, int device, uint64_t launch);

/* The scope check of every strong access a kernel makes (memory.cpp): `scope` is an
 * sg_scope, `device` the GPU making the access. A narrower scope than .sys on a word that
 * another GPU or the host touches too, or on another GPU's or host memory, ends the process,
 * naming the word and the call. */
void check_strong_access(const void* p, uint32_t bytes, int scope, const char* op,
                         const char* file, int line, int device);

/* What a 32-bit acquire load by device `device` of the word at `p` returns, `value` being what
 * memory holds: `value`, or, with STRAGGLAR_EMU_PEER_LOADS=wrong, its complement where the word
 * is another GPU's memory (a machine whose multiprocessors misread peer memory that its copy
 * engines reach; memory.cpp). */
uint32_t loaded_by(const void* p, uint32_t value, int device);

/* Stale loads (memory.cpp; weak_memory.h says when a load may be stale). The clock of the
 * history, in nanoseconds, the same in every process (CLOCK_MONOTONIC). */
uint64_t history_clock();
/* Lets a kernel's plain store of `n` bytes from `src` land at `at`, made at `stored_at`: device
 * memory remembers, per 16 bytes, the last store that landed there, which bytes it wrote and
 * what they held before. */
void land_store(void* at, const void* src, uint32_t n, uint64_t stored_at);
/* Copies `n` bytes at `src` into `dst` as a thread whose view is `view`, and whose alias view
 * (what a fence.proxy.alias last ordered its loads after) is `alias_view`, may see them: bytes
 * whose last store was made after `view` (after `alias_view`, for a multimem store landed
 * through a multicast address) read what they held before it. */
void load_as_of(void* dst, const void* src, uint32_t n, uint64_t view, uint64_t alias_view);
/* A release to the word at `word` publishes the releasing thread's `view`; an acquire that
 * reads the word takes the latest view published there (released_view: the clock's now for
 * a word with no history, which is taken to publish everything). */
void note_release(const void* word, uint64_t view);
uint64_t released_view(const void* word);

/* Strong accesses with a history (weak_memory.h: a strong load may return the value before the
 * last store to its word, until the thread saw that store). A strong store or atomic add of `n`
 * bytes (4 or 8, naturally aligned) at `at` is made atomically and, in device memory with a
 * history, recorded as the 16 bytes' last store (what they held before, made now); each
 * returns when it was made (0 where nothing is recorded). strong_store writes `src`;
 * strong_add adds `v` and returns the old value in `*old`. */
uint64_t strong_store(void* at, const void* src, uint32_t n);
uint64_t strong_add(void* at, uint64_t v, uint32_t n, uint64_t* old);
/* A strong load of `n` bytes (4 or 8, naturally aligned) at `at`, as of one instant: what
 * memory holds, what the bytes held before their last recorded store (`older`, equal to
 * `current` where no recorded store wrote them) and when that store was made, whether it
 * landed through the multicast proxy, and the instant itself. */
struct StrongRead {
  uint64_t current;
  uint64_t older;
  uint64_t stored_at;
  bool proxy;
  uint64_t read_at;
};
StrongRead strong_read(const void* at, uint32_t n);

/* The coherence check (weak_memory.h): vector clocks over agents, an agent being a device
 * (modulo kOrderAgents; devices that share an agent count as ordered), each entry the history
 * clock's time of the latest event of that agent the clock's holder is ordered after.
 * publish_order: a release to the word at `word` publishes `clock`; take_order: an acquire of
 * it joins what its releases published into `clock` (a word with no record, such as host
 * memory, is taken to publish everything so far); check_store_order: device `device`, whose
 * block's clock is `clock`, makes a release store of `bytes` bytes at `word` (op, file and
 * line name it): if the last release store to one of its 4-byte words was made by another
 * agent at a time `clock` does not cover, nothing orders the two and a GPU may let them land
 * in either order, so the process ends naming both; then the store is recorded, at
 * clock[its agent]. Device memory with no record (from cuMemCreate) is not checked. */
constexpr uint32_t kOrderAgents = 16;
void publish_order(const void* word, const uint64_t* clock);
void take_order(const void* word, uint64_t* clock);
void check_store_order(const void* word, uint32_t bytes, const uint64_t* clock, int device,
                       const char* op, const char* file, int line);

/* A multimem store of `n` bytes at `p` made at `stored_at` (vmm.cpp): written into the memory
 * every member bound at that offset of the multicast object mapped there, in whichever process
 * it lives, and remembered there as landed through the multicast proxy; false when `p` is not
 * inside an accessible multicast mapping of this process. */
bool multicast_store(void* p, const void* src, uint32_t n, uint64_t stored_at);
/* Whether `n` bytes at `p` lie inside an accessible multicast mapping of this process (vmm.cpp):
 * where a multimem store may go. */
bool is_multicast_address(const void* p, uint32_t n);
/* Multimem stores the kernels of this process made so far (printed with the launch counts,
 * STRAGGLAR_EMU_COUNT_LAUNCHES=1). */
uint64_t multimem_stores();

/* Sharing a GPU between processes (sharing.cpp): a block calls block_started before it runs
 * (which waits for its process's turn on the device), wait_for_turn whenever it resumes after
 * a pause or a barrier, and block_ended once it returned. */
void block_started(int device);
void wait_for_turn(int device);
void block_ended(int device);

}  // namespace emu

#endif
