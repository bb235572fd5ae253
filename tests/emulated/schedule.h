/* Seeded random scheduling of the emulated machine. With `STRAGGLAR_EMU_SEED=N` (N > 0) the
 * machine stops running work in one fixed order: a block's GPU threads run in a random order,
 * switched also at strong (synchronising) accesses; a launch's blocks start in a random order,
 * each after a random delay; stream workers wait a random while before some of their work;
 * and a graph's nodes run in a random topological order, independent branches at the same
 * time. Without it (or with 0) the order is the deterministic one of before.
 *
 * Every choice comes from a stream of numbers keyed by the seed and by where it is made (the
 * process's launch number, a block index, a stream's creation number), never by the time or
 * the process id, so a seed makes the same choices on every run; what the OS threads do
 * between them still varies. Each process prints its seed to stderr at cuInit. This header
 * does not see cuda.h: the fibers and the kernel source use it too. */
#ifndef STRAGGLAR_EMU_SCHEDULE_H_
#define STRAGGLAR_EMU_SCHEDULE_H_

#include <cstdint>

namespace emu {

/* STRAGGLAR_EMU_SEED, read once (0: the deterministic schedule). */
uint64_t schedule_seed();

/* A stream of pseudo-random numbers (splitmix64). */
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /* Uniform in [0, n), n > 0. */
  uint32_t below(uint32_t n) { return (uint32_t)(next() % n); }
  /* True once in `n` draws, on average. */
  bool one_in(uint32_t n) { return below(n) == 0; }
};

/* The stream of choices of one place: `what` names the kind of choice, `a` and `b` the
 * place (a launch and a block, say). */
Rng rng_for(uint64_t what, uint64_t a, uint64_t b);

/* Sleeps for a random time below `max_us` microseconds. */
void random_sleep(Rng& r, uint32_t max_us);

/* The kinds of choice, for rng_for. */
enum : uint64_t {
  kChoiceFibers = 1,   /* a block's fiber order and preemptions: (launch, block) */
  kChoiceBlocks = 2,   /* a launch's block order: (launch, 2^32 + device); start delays:
                        * (launch, block + 1) */
  kChoiceStream = 3,   /* a stream worker's delays: (stream number, 0) */
  kChoiceGraph = 4,    /* a graph launch's node order: (graph launch, 0) */
};

}  // namespace emu

#endif
