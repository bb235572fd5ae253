/* Weak memory for the emulated GPU's kernels (see weak_memory.h). */
#include "weak_memory.h"

#include "kernel_source.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace emu {

bool weak_memory_enabled() {
  static const bool enabled = [] {
    const char* v = getenv("STRAGGLAR_EMU_WEAK_MEMORY");
    return !(v && strcmp(v, "0") == 0);
  }();
  return enabled;
}

namespace {
/* Whether loads may be stale: weak memory on, and not STRAGGLAR_EMU_WEAK_MEMORY=stores (stores
 * held back, loads reading memory: the machine before stale loads, for the mutation runs). */
bool stale_loads_enabled() {
  static const bool enabled = [] {
    const char* v = getenv("STRAGGLAR_EMU_WEAK_MEMORY");
    return weak_memory_enabled() && !(v && strcmp(v, "stores") == 0);
  }();
  return enabled;
}
}  // namespace

WeakMemory::WeakMemory(uint32_t threads, int device)
    : own_(threads),
      view_(threads, history_clock()),
      alias_view_(view_),
      coherence_(threads),
      lines_(kLines, 0),
      device_(device) {
  const uint64_t start = view_.empty() ? history_clock() : view_[0];
  for (uint64_t& entry : order_) entry = start;
}

WeakMemory::~WeakMemory() { land_everything(); }

void WeakMemory::count(const Held& h, int32_t by) {
  uintptr_t first = (uintptr_t)h.at, last = first + h.bytes - 1;
  lines_[slot(first)] += by;
  if (slot(last) != slot(first)) lines_[slot(last)] += by;
  held_ += by;
}

void WeakMemory::store(uint32_t thread, void* at, const void* src, uint32_t bytes) {
  hold(thread, at, src, bytes, false);
}

void WeakMemory::store_multicast(uint32_t thread, void* at, const void* src, uint32_t bytes) {
  hold(thread, at, src, bytes, true);
}

void WeakMemory::hold(uint32_t thread, void* at, const void* src, uint32_t bytes,
                      bool multicast) {
  if (bytes == 0) return;
  const uint64_t now = history_clock();
  if (thread < view_.size() && view_[thread] < now) view_[thread] = now;
  if (bytes > sizeof(Held::value) || thread >= own_.size()) {
    land_everything();
    land_now(at, src, bytes, now, multicast);
    return;
  }
  Held h;
  h.at = (unsigned char*)at;
  h.bytes = bytes;
  h.stored_at = now;
  h.multicast = multicast;
  h.fenced = false;
  memcpy(h.value, src, bytes);
  if (!multicast) count(h, 1);
  own_[thread].push_back(h);
}

void WeakMemory::before_load(const void* at, uint32_t bytes) {
  if (held_ == 0 || bytes == 0) return;
  uintptr_t first = (uintptr_t)at, last = first + bytes - 1;
  for (uintptr_t line = first >> 6; line <= last >> 6; ++line) {
    if (lines_[slot(line << 6)] != 0) {
      land_everything();
      return;
    }
  }
}

void WeakMemory::load(uint32_t thread, void* to, const void* at, uint32_t bytes) {
  before_load(at, bytes);
  const bool stale = stale_loads_enabled() && thread < view_.size();
  load_as_of(to, at, bytes, stale ? view_[thread] : UINT64_MAX,
             stale ? alias_view_[thread] : UINT64_MAX);
}

void WeakMemory::strong_store(uint32_t thread, void* at, const void* src, uint32_t bytes,
                              bool release) {
  saw_own_store(thread, at, emu::strong_store(at, src, bytes));
  if (release && thread < view_.size()) note_release(at, view_[thread]);
}

uint64_t WeakMemory::strong_add(uint32_t thread, void* at, uint64_t v, uint32_t bytes) {
  uint64_t old = 0;
  saw_own_store(thread, at, emu::strong_add(at, v, bytes, &old));
  if (thread < view_.size()) note_release(at, view_[thread]);
  return old;
}

void WeakMemory::saw_own_store(uint32_t thread, const void* at, uint64_t made) {
  if (thread >= coherence_.size()) return;
  if (view_[thread] < made) view_[thread] = made;
  if (made == 0) return;
  Coherence& c = coherence_[thread][(uintptr_t)at];
  if (c.seen < made) c.seen = made;
}

uint64_t WeakMemory::strong_load(uint32_t thread, const void* at, uint32_t bytes) {
  const StrongRead read = strong_read(at, bytes);
  if (!stale_loads_enabled() || thread >= coherence_.size() || read.stored_at == 0)
    return read.current;
  Coherence& c = coherence_[thread][(uintptr_t)at];
  const uint64_t view = read.proxy ? alias_view_[thread] : view_[thread];
  if (read.stored_at > view && read.stored_at > c.seen) {
    if (c.missed_store != read.stored_at) {
      c.missed_store = read.stored_at;
      c.misses = 0;
    }
    if (c.misses < kStaleReads) {
      ++c.misses;
      return read.older;
    }
  }
  /* Memory as it was at that instant: every store made before it is seen. */
  if (c.seen < read.read_at) c.seen = read.read_at;
  return read.current;
}

void WeakMemory::at_barrier(uint32_t thread) {
  if (thread >= own_.size()) return;
  if (view_[thread] > block_view_) block_view_ = view_[thread];
  if (alias_view_[thread] > block_alias_view_) block_alias_view_ = alias_view_[thread];
  if (own_[thread].empty()) return;
  std::vector<Held>& mine = own_[thread];
  block_.insert(block_.end(), mine.begin(), mine.end());
  mine.clear();
}

void WeakMemory::after_barrier(uint32_t thread) {
  if (thread >= view_.size()) return;
  if (view_[thread] < block_view_) view_[thread] = block_view_;
  if (alias_view_[thread] < block_alias_view_) alias_view_[thread] = block_alias_view_;
}

void WeakMemory::release(uint32_t thread, const void* word) {
  land_released(block_);
  if (thread >= own_.size()) return;
  land_released(own_[thread]);
  note_release(word, view_[thread]);
  order_[(uint32_t)device_ % kOrderAgents] = history_clock();
  publish_order(word, order_);
}

void WeakMemory::release_store(const void* word, uint32_t bytes, const char* op,
                               const char* file, int line) {
  check_store_order(word, bytes, order_, device_, op, file, line);
}

void WeakMemory::proxy_fence(uint32_t thread) {
  for (Held& h : block_) h.fenced = true;
  if (thread < own_.size()) {
    for (Held& h : own_[thread]) h.fenced = true;
    if (alias_view_[thread] < view_[thread]) alias_view_[thread] = view_[thread];
  }
}

void WeakMemory::land_released(std::vector<Held>& held) {
  std::vector<Held> kept;
  for (const Held& h : held) {
    if (h.multicast && !h.fenced) {
      kept.push_back(h);
      continue;
    }
    land_now(h.at, h.value, h.bytes, h.stored_at, h.multicast);
    if (!h.multicast) count(h, -1);
  }
  held.swap(kept);
}

void WeakMemory::acquired(uint32_t thread, const void* word) {
  if (thread >= view_.size()) return;
  const uint64_t published = released_view(word);
  if (published > view_[thread]) view_[thread] = published;
  take_order(word, order_);
}

void WeakMemory::land_early(Rng& choices) {
  if (block_.empty()) return;
  land(block_, choices.below((uint32_t)block_.size() + 1));
}

void WeakMemory::land(std::vector<Held>& held, size_t to) {
  for (size_t i = 0; i < to; ++i) {
    const Held& h = held[i];
    land_now(h.at, h.value, h.bytes, h.stored_at, h.multicast);
    if (!h.multicast) count(h, -1);
  }
  held.erase(held.begin(), held.begin() + (ptrdiff_t)to);
}

void WeakMemory::land_now(void* at, const void* src, uint32_t bytes, uint64_t stored_at,
                          bool multicast) {
  if (!multicast) {
    land_store(at, src, bytes, stored_at);
  } else if (!multicast_store(at, src, bytes, stored_at)) {
    fprintf(stderr, "emulated GPU: a held multimem store to %p landed after its multicast "
            "mapping was gone\n", at);
    abort();
  }
}

void WeakMemory::land_everything() {
  land(block_, block_.size());
  for (std::vector<Held>& mine : own_) land(mine, mine.size());
}

}  // namespace emu
