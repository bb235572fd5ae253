/* Weak memory for the emulated GPU's kernels (see weak_memory.h). */
#include "weak_memory.h"

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

WeakMemory::WeakMemory(uint32_t threads) : own_(threads), lines_(kLines, 0) {}

WeakMemory::~WeakMemory() { land_everything(); }

void WeakMemory::count(const Held& h, int32_t by) {
  uintptr_t first = (uintptr_t)h.at, last = first + h.bytes - 1;
  lines_[slot(first)] += by;
  if (slot(last) != slot(first)) lines_[slot(last)] += by;
  held_ += by;
}

void WeakMemory::store(uint32_t thread, void* at, const void* src, uint32_t bytes) {
  if (bytes == 0) return;
  if (bytes > sizeof(Held::value) || thread >= own_.size()) {
    land_everything();
    memcpy(at, src, bytes);
    return;
  }
  Held h;
  h.at = (unsigned char*)at;
  h.bytes = bytes;
  memcpy(h.value, src, bytes);
  count(h, 1);
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

void WeakMemory::at_barrier(uint32_t thread) {
  if (thread >= own_.size() || own_[thread].empty()) return;
  std::vector<Held>& mine = own_[thread];
  block_.insert(block_.end(), mine.begin(), mine.end());
  mine.clear();
}

void WeakMemory::publish(uint32_t thread) {
  land(block_, block_.size());
  if (thread < own_.size()) land(own_[thread], own_[thread].size());
}

void WeakMemory::land_early(Rng& choices) {
  if (block_.empty()) return;
  land(block_, choices.below((uint32_t)block_.size() + 1));
}

void WeakMemory::land(std::vector<Held>& held, size_t to) {
  for (size_t i = 0; i < to; ++i) {
    memcpy(held[i].at, held[i].value, held[i].bytes);
    count(held[i], -1);
  }
  held.erase(held.begin(), held.begin() + (ptrdiff_t)to);
}

void WeakMemory::land_everything() {
  land(block_, block_.size());
  for (std::vector<Held>& mine : own_) land(mine, mine.size());
}

}  // namespace emu
