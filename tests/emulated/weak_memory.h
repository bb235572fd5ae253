/* Weak memory for the emulated GPU's kernels: a GPU makes a thread's plain stores visible to
 * other agents late and with no order among them, unless a release (or an acq_rel atomic) of
 * that thread publishes them; x86 makes them visible at once, in order. Here every plain store
 * a kernel makes (sg_store16, sg_store_bytes) is held back:
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
 * may also land early, in order, at a strong access. A block's threads are fibers of one OS
 * thread, so nothing here is shared between threads. STRAGGLAR_EMU_WEAK_MEMORY=0 turns it off
 * (every store lands at once, as before). */
#ifndef STRAGGLAR_EMU_WEAK_MEMORY_H_
#define STRAGGLAR_EMU_WEAK_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "schedule.h"

namespace emu {

/* STRAGGLAR_EMU_WEAK_MEMORY, read once: whether kernels' plain stores are held back. */
bool weak_memory_enabled();

class WeakMemory {
 public:
  explicit WeakMemory(uint32_t threads);
  WeakMemory(const WeakMemory&) = delete;
  WeakMemory& operator=(const WeakMemory&) = delete;
  /* Lets everything still held land. */
  ~WeakMemory();

  /* Holds back `thread`'s store of `bytes` bytes (at most 16; a larger one lands at once,
   * after everything held) from `src` at `at`. */
  void store(uint32_t thread, void* at, const void* src, uint32_t bytes);
  /* Before a load of `bytes` bytes at `at`: if a held store may overlap it, everything held
   * lands first (by lines of 64 bytes, so a near store counts too). */
  void before_load(const void* at, uint32_t bytes);
  /* `thread` reached the block barrier: its held stores pass to the block. */
  void at_barrier(uint32_t thread);
  /* `thread` releases: the block's held stores land, then its own. */
  void publish(uint32_t thread);
  /* Seeded: a random number of the block's oldest held stores land. */
  void land_early(Rng& choices);

  /* One held store. */
  struct Held {
    unsigned char* at;
    uint32_t bytes;
    unsigned char value[16];
  };

 private:
  /* Counters of held stores per 64-byte line, hashed into kLines slots. */
  static constexpr uint32_t kLines = 4096;
  static uint32_t slot(uintptr_t address) { return (uint32_t)(address >> 6) & (kLines - 1); }
  void count(const Held& h, int32_t by);
  /* Lets held[from, to) land, in order. */
  void land(std::vector<Held>& held, size_t to);
  void land_everything();

  std::vector<std::vector<Held>> own_;
  std::vector<Held> block_;
  std::vector<uint32_t> lines_;
  uint64_t held_ = 0;
};

}  // namespace emu

#endif
