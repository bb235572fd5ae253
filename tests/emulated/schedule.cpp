/* The seed and the choice streams of schedule.h. */
#include "schedule.h"

#include <cstdio>
#include <cstdlib>
#include <time.h>

namespace emu {

uint64_t schedule_seed() {
  static const uint64_t seed = [] {
    const char* v = getenv("STRAGGLAR_EMU_SEED");
    return v ? strtoull(v, nullptr, 10) : 0ull;
  }();
  return seed;
}

Rng rng_for(uint64_t what, uint64_t a, uint64_t b) {
  Rng r{schedule_seed() ^ (what << 56)};
  r.state ^= r.next() ^ a * 0xd6e8feb86659fd93ull;
  r.state ^= r.next() ^ b * 0xa0761d6478bd642full;
  r.next();
  return r;
}

void random_sleep(Rng& r, uint32_t max_us) {
  const uint32_t us = r.below(max_us);
  struct timespec t = {0, (long)us * 1000};
  nanosleep(&t, nullptr);
}

}  // namespace emu
