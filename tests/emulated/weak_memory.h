/* Weak memory for the emulated GPU's kernels. A GPU makes a thread's plain stores visible to
 * other agents late and with no order among them, unless a release (or an acq_rel atomic) of
 * that thread publishes them, and a thread's plain load may return an older value than memory
 * holds, unless an acquire orders it after the store; x86 does neither.
 *
 * Stores held back. Every plain store a kernel makes (sg_store16, sg_store_bytes) waits:
 *  - in the storing thread's buffer, where a load by any thread of the block lets it land
 *    first (a thread reads its own stores; whether another thread of the block may see one
 *    early is allowed either way);
 *  - passed on to the block at the thread's block barrier (bar.sync orders it before what the
 *    block does next, at CTA scope);
 *  - landing when a thread of the block releases (the block's held stores, then that thread's:
 *    a release publishes what is ordered before it, cumulatively through the barrier), or when
 *    the block ends (a kernel's completion publishes everything).
 * Relaxed and volatile stores are never held, so a flag published without a release overtakes
 * the data it should publish, as on a GPU. Seeded (STRAGGLAR_EMU_SEED), the block's held stores
 * may also land early, in order, at a strong access. Multimem stores (multimem.st.relaxed) are
 * held back as plain stores are, and land into every member's memory, but a release lands only
 * those a fence.proxy.alias ordered first: PTX orders a store through a multicast address
 * before loads through a member's own address of the bytes only with an alias fence on the
 * path, so a flag released without one announces data that has not landed. The reader needs
 * one too: bytes a multimem store landed in are remembered as landed through the multicast
 * proxy, and a thread's plain load sees such a store only once a fence.proxy.alias it made (or
 * a thread of its block made before a barrier it passed) came after an acquire that covered
 * the store (its alias view, below); before, the load reads what the bytes held.
 *
 * Stale loads. Each thread has a view: a time on the history's clock (memory.cpp) before which
 * every store made is visible to it, and an alias view, the view it had at its last alias
 * fence, for the stores landed through the multicast proxy. A store is stamped when it is made; device memory keeps,
 * per 16 bytes, the last store that landed and what its bytes held before. A plain load
 * (sg_load16_fresh, sg_copy_bytes) of bytes whose last store was made after the thread's view
 * returns what they held before it. The view only moves forward: to the block's start (a
 * launch follows what came before it), to each store the thread makes (it reads its own
 * writes), to the latest view of the block's threads at a block barrier, and, at an acquire,
 * to the view the word's releases published (a release publishes the releasing thread's view).
 * One time for a view is coarser than the memory model's happens-before (a thread may see a
 * store no chain of synchronisation orders before its load, which is always allowed), never
 * finer, so a correct program never reads a stale value here; a reader whose acquire is
 * missing does, and so does one whose alias fence is. Memory with no history (host memory) is
 * always read as it is; a copy engine's or the host's write is not recorded (the bytes keep
 * the record of the last kernel store to them).
 *
 * Strong loads. A relaxed, volatile or acquire load of a word (a flag, a turn word, a board
 * word) may also return an older value: the value before the word's last store, where that
 * store was made after the thread's view and the thread has not yet seen it. Strong stores and
 * atomic adds are recorded in the history as plain stores are (made at once, never held).
 * Each thread keeps, per word it loads, when it last saw the word as memory holds it (its
 * coherence: once it read a value, or stored one, it never reads an older one), and a load
 * returns the older value at most kStaleReads times for one store, then what memory holds, so
 * a poll sees every store in the end (a GPU's stores become visible in finite time). Which
 * value a strong load returns decides only progress in a correct kernel (it polls until the
 * value it wants, which an acquire then orders); a kernel that reads a word once and trusts
 * it, with nothing ordering the word's store before the read, reads the older value here. An
 * acquire that returns the older value still takes in the view the word's latest release
 * published (coarser than the memory model, never finer). A release store, or an acq_rel
 * atomic, publishes the view that covers the store itself, so a thread ordered after an
 * acquire of the word (directly, through a barrier, or through a chain of releases and
 * acquires) reads it as stored. A relaxed load followed by a block barrier is no acquire here:
 * bar.sync orders at CTA scope, which does not synchronise with another GPU's release. Words
 * are keyed by address: one word is always accessed at one size, through one mapping.
 *
 * Coherence. A GPU keeps the stores to one word in one order, but where nothing orders two
 * stores made by different agents, either may come last: a word written by several ranks in
 * turn (a turn word) keeps the right value only if each writer's store is ordered after the
 * one before it by a chain of releases and acquires. Each block keeps a vector clock over
 * agents (a device each, kernel_source.h), every entry at the block's start being the time it
 * started (what came before a launch is ordered before it); a release sets the block's own
 * entry to now and publishes the clock at its word, an acquire joins what the word's releases
 * published. A release store to a word whose last release store another agent made at a time
 * the block's clock does not cover ends the process naming both (check_store_order). The
 * block is one agent and a device's blocks share one, which is coarser than the memory model
 * (it may miss a race between two blocks of one device), never finer: two release stores it
 * reports are unordered on a GPU too. (Unordered release stores to one word are a defect only
 * where the word's last value matters, as it does for every such word of the engine's: a word
 * two agents may store to in either order must use a relaxed store or an atomic.) Relaxed and
 * volatile stores and atomic read-modify-writes are not checked; an acquire of a word a host
 * or copy-engine write made joins nothing.
 *
 * A block's threads are fibers of one OS thread, so nothing here is shared between threads;
 * the history is (memory.cpp locks it). STRAGGLAR_EMU_WEAK_MEMORY=0 turns all three off (every
 * store lands at once, every load reads memory, no store's order is checked),
 * STRAGGLAR_EMU_WEAK_MEMORY=stores the stale loads only. */
#ifndef STRAGGLAR_EMU_WEAK_MEMORY_H_
#define STRAGGLAR_EMU_WEAK_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kernel_source.h"
#include "schedule.h"

namespace emu {

/* STRAGGLAR_EMU_WEAK_MEMORY, read once: whether kernels' plain stores are held back (not 0). */
bool weak_memory_enabled();

class WeakMemory {
 public:
  /* A block of `threads` threads on device `device`, starting now. */
  WeakMemory(uint32_t threads, int device);
  WeakMemory(const WeakMemory&) = delete;
  WeakMemory& operator=(const WeakMemory&) = delete;
  /* Lets everything still held land. */
  ~WeakMemory();

  /* Holds back `thread`'s store of `bytes` bytes (at most 16; a larger one lands at once,
   * after everything held) from `src` at `at`, stamped now. */
  void store(uint32_t thread, void* at, const void* src, uint32_t bytes);
  /* Holds back `thread`'s multimem store of `bytes` bytes (at most 16) from `src` to the
   * multicast address `at`, stamped now, as a plain store: it lands (into every member's
   * memory) when a plain store would. A load never lets it land early: no load may read a
   * multicast address, and the members' own addresses are other aliases. */
  void store_multicast(uint32_t thread, void* at, const void* src, uint32_t bytes);
  /* Before a load of `bytes` bytes at `at`: if a held store may overlap it, everything held
   * lands first (by lines of 64 bytes, so a near store counts too). */
  void before_load(const void* at, uint32_t bytes);
  /* `thread`'s plain load of `bytes` bytes at `at` into `to` (a register's worth, which a
   * held store never covers): held stores land first where they may overlap it, then the
   * bytes are read as of the thread's view. */
  void load(uint32_t thread, void* to, const void* at, uint32_t bytes);
  /* `thread` reached the block barrier: its held stores pass to the block, its view to the
   * block's. */
  void at_barrier(uint32_t thread);
  /* `thread` passed the block barrier: it sees what every thread of the block saw there. */
  void after_barrier(uint32_t thread);
  /* `thread` releases to the word at `word`: the block's held stores land, then its own (of
   * the multimem stores, those a proxy fence ordered), and the word publishes the thread's
   * view. */
  void release(uint32_t thread, const void* word);
  /* `thread` made a fence.proxy.alias: the multimem stores the block holds and its own are
   * ordered for the next release, and its later loads see the multimem stores its view covers
   * (its alias view takes its view). */
  void proxy_fence(uint32_t thread);
  /* `thread` acquired the word at `word`: its view takes in what the word's releases
   * published, and so does the block's vector clock. */
  void acquired(uint32_t thread, const void* word);
  /* A release store of `bytes` bytes at `word` (after `release` to it): ends the process if
   * the word's last release store is not ordered before it (the coherence check above). */
  void release_store(const void* word, uint32_t bytes, const char* op, const char* file,
                     int line);
  /* `thread`'s strong store of `bytes` bytes (4 or 8) from `src` at `at`, made at once and
   * recorded in the history; the thread has seen it, and its view moves to it. A release
   * store (after `release` to the word) then publishes that view at the word too, so that
   * whoever is ordered after an acquire of it sees the store itself. */
  void strong_store(uint32_t thread, void* at, const void* src, uint32_t bytes, bool release);
  /* `thread`'s atomic add of `v` to the `bytes`-byte word at `at`; returns the old value
   * (always the latest), which the thread has then seen, as the store it makes; acq_rel, it
   * publishes the view that covers it, as a release store does. */
  uint64_t strong_add(uint32_t thread, void* at, uint64_t v, uint32_t bytes);
  /* `thread`'s strong load of the `bytes`-byte word at `at` (held stores that may overlap it
   * landed first): what memory holds, or the value before the word's last store while that
   * store is after the thread's view, not yet seen, and returned older fewer than
   * kStaleReads times (above). */
  uint64_t strong_load(uint32_t thread, const void* at, uint32_t bytes);
  /* How often one thread's strong loads of a word return the value before one store of it
   * that nothing ordered before them. */
  static constexpr uint32_t kStaleReads = 2;

  /* Seeded: a random number of the block's oldest held stores land. */
  void land_early(Rng& choices);

  /* One held store. */
  struct Held {
    unsigned char* at;
    uint32_t bytes;
    /* When the store was made (memory.cpp's history clock). */
    uint64_t stored_at;
    /* A multimem store: `at` is a multicast address, landing writes every member. */
    bool multicast;
    /* A multimem store a proxy fence ordered: a release lets it land. */
    bool fenced;
    unsigned char value[16];
  };

 private:
  /* Counters of held stores per 64-byte line, hashed into kLines slots. */
  static constexpr uint32_t kLines = 4096;
  static uint32_t slot(uintptr_t address) { return (uint32_t)(address >> 6) & (kLines - 1); }
  void count(const Held& h, int32_t by);
  /* `thread` made a strong store (or atomic) at `at`, made at `made` (0: not recorded): it
   * sees its own store, and its view moves to it as at a plain store (a release after it
   * publishes it). */
  void saw_own_store(uint32_t thread, const void* at, uint64_t made);
  /* store and store_multicast: holds the store in `thread`'s buffer (a larger one, or one of
   * no thread the block runs, lands at once after everything held). */
  void hold(uint32_t thread, void* at, const void* src, uint32_t bytes, bool multicast);
  /* Lets one store land: into memory with its history, or into every multicast member. */
  static void land_now(void* at, const void* src, uint32_t bytes, uint64_t stored_at,
                       bool multicast);
  /* Lets held[from, to) land, in order. */
  void land(std::vector<Held>& held, size_t to);
  /* Lets everything in `held` that a release may publish land, in order (the plain stores and
   * the fenced multimem stores); the rest stays held. */
  void land_released(std::vector<Held>& held);
  void land_everything();

  std::vector<std::vector<Held>> own_;
  std::vector<Held> block_;
  /* Each thread's view, and the latest view a thread brought to a block barrier (a view only
   * grows, so this one never needs resetting: a thread past the barrier may take a later
   * thread's view early, which is allowed). */
  std::vector<uint64_t> view_;
  uint64_t block_view_ = 0;
  /* Each thread's alias view: the view its last fence.proxy.alias had (a load of bytes a
   * multimem store landed in sees that store only if this view covers it), and the latest a
   * thread brought to a block barrier, passed on as the view is. */
  std::vector<uint64_t> alias_view_;
  uint64_t block_alias_view_ = 0;
  /* Per thread, per word address its strong accesses touched: when it last saw the word as
   * memory held it, and the store it has been reading older than (its time, and how many
   * times). */
  struct Coherence {
    uint64_t seen = 0;
    uint64_t missed_store = 0;
    uint32_t misses = 0;
  };
  std::vector<std::unordered_map<uintptr_t, Coherence>> coherence_;
  std::vector<uint32_t> lines_;
  uint64_t held_ = 0;
  /* The device the block runs on, and the block's vector clock (the coherence check). */
  int device_;
  uint64_t order_[kOrderAgents];
};

}  // namespace emu

#endif
