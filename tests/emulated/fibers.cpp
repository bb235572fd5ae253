/* The fiber scheduler of fibers.h: a hand-written context switch (x86-64 System V: the six
 * callee-saved registers and the stack pointer), stacks from a pool (64 KiB each, a guard page
 * below each), and round-robin (or, seeded, randomly ordered) scheduling with a block
 * barrier. */
#include "fibers.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <utility>
#include <vector>

#if !defined(__x86_64__)
#error "the emulated GPU's fibers switch x86-64 registers"
#endif

extern "C" {
/* Saves the callee-saved registers and the stack pointer into *save, then resumes `next`. */
void sgemu_switch(void** save, void* next);
/* A new fiber's first instructions: calls rbx(r12) (never returns). */
void sgemu_trampoline(void);
}

asm(R"(
  .text
  .globl sgemu_switch
  .hidden sgemu_switch
  .type sgemu_switch,@function
sgemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size sgemu_switch, .-sgemu_switch

  .globl sgemu_trampoline
  .hidden sgemu_trampoline
  .type sgemu_trampoline,@function
sgemu_trampoline:
  movq %r12, %rdi
  call *%rbx
  ud2
  .size sgemu_trampoline, .-sgemu_trampoline
)");

namespace emu {

namespace {
constexpr size_t kStackBytes = 64 * 1024;

/* AtBarrier: at the plan barrier (the first `syncing_below` fibers'); AtBarrierAll: at the
 * whole block's. */
enum State : uint8_t { Runnable, AtBarrier, AtBarrierAll, Done };

struct Block {
  uint32_t threads = 0;
  void (*body)(void*, uint32_t) = nullptr;
  void (*on_switch)(void*, uint32_t) = nullptr;
  void* arg = nullptr;
  std::vector<void*> sp;
  std::vector<State> state;
  uint32_t live = 0;
  /* Fibers below `syncing_below` take part in the barrier; `syncing` of them have not returned. */
  uint32_t syncing_below = 0;
  uint32_t syncing = 0;
  uint32_t arrived = 0;
  /* Fibers waiting at the whole block's barrier. */
  uint32_t arrived_all = 0;
  uint32_t current = 0;
  bool progressed = false;
  void* scheduler_sp = nullptr;
};
thread_local Block* t_block = nullptr;

/* A pool of stack arenas, each `slots` stacks with a guard page below each. */
struct Arena {
  char* base;
  size_t slots;
};
std::mutex* g_pool_lock = new std::mutex();
std::vector<Arena>* g_pool = new std::vector<Arena>();

Arena take_arena(size_t slots) {
  {
    std::lock_guard<std::mutex> g(*g_pool_lock);
    for (size_t i = 0; i < g_pool->size(); ++i) {
      if ((*g_pool)[i].slots >= slots) {
        Arena a = (*g_pool)[i];
        g_pool->erase(g_pool->begin() + (long)i);
        return a;
      }
    }
  }
  size_t bytes = slots * kStackBytes;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) abort();
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < slots; ++i) mprotect((char*)p + i * kStackBytes, page, PROT_NONE);
  return Arena{(char*)p, slots};
}

void give_back(Arena a) {
  std::lock_guard<std::mutex> g(*g_pool_lock);
  g_pool->push_back(a);
}

void release_barrier(Block* b) {
  for (uint32_t i = 0; i < b->threads; ++i)
    if (b->state[i] == AtBarrier) b->state[i] = Runnable;
  b->arrived = 0;
}

void to_scheduler(Block* b) { sgemu_switch(&b->sp[b->current], b->scheduler_sp); }

void fiber_main(Block* b) {
  uint32_t me = b->current;
  b->body(b->arg, me);
  b->state[me] = Done;
  b->live--;
  if (b->arrived_all > 0) {
    fprintf(stderr, "emulated GPU: thread %u returned while %u threads wait at the block barrier\n",
            me, b->arrived_all);
    abort();
  }
  if (me < b->syncing_below) {
    /* A GPU's named barrier with a count waits for that many threads: one that returned while
     * the others wait there never comes, and the block hangs. Stop here instead. */
    if (b->arrived > 0) {
      fprintf(stderr, "emulated GPU: thread %u returned while %u threads wait at the barrier\n",
              me, b->arrived);
      abort();
    }
    b->syncing--;
  }
  b->progressed = true;
  void* unused;
  sgemu_switch(&unused, b->scheduler_sp); /* never resumed */
}

void idle(uint32_t rounds) {
  if (rounds < 64) {
    sched_yield();
  } else {
    struct timespec t = {0, 20000};
    nanosleep(&t, nullptr);
  }
}
}  // namespace

void fiber_sync() {
  Block* b = t_block;
  if (b->arrived_all > 0) {
    fprintf(stderr,
            "emulated GPU: thread %u reached the plan barrier while %u wait at the block's\n",
            b->current, b->arrived_all);
    abort();
  }
  if (b->syncing < b->syncing_below) {
    /* A thread of the barrier returned: a GPU's counted barrier would wait for it forever. */
    fprintf(stderr, "emulated GPU: a barrier thread returned before thread %u's barrier\n",
            b->current);
    abort();
  }
  b->state[b->current] = AtBarrier;
  b->arrived++;
  b->progressed = true;
  if (b->arrived == b->syncing) release_barrier(b);
  to_scheduler(b);
}

void fiber_sync_all() {
  Block* b = t_block;
  if (b->live != b->threads || b->arrived > 0) {
    /* A thread that returned, or threads held at the plan barrier, never reach this one. */
    fprintf(stderr, "emulated GPU: thread %u reached the block barrier, which %u returned and %u "
            "plan-barrier threads never reach\n", b->current, b->threads - b->live, b->arrived);
    abort();
  }
  b->state[b->current] = AtBarrierAll;
  b->progressed = true;
  if (++b->arrived_all == b->threads) {
    for (uint32_t i = 0; i < b->threads; ++i)
      if (b->state[i] == AtBarrierAll) b->state[i] = Runnable;
    b->arrived_all = 0;
  }
  to_scheduler(b);
}

void fiber_set_syncing(uint32_t syncing) {
  Block* b = t_block;
  const uint32_t below = syncing < b->threads ? syncing : b->threads;
  if (below == b->syncing_below) return;
  if (b->arrived > 0) {
    fprintf(stderr, "emulated GPU: the plan barrier's count changed while %u threads wait there\n",
            b->arrived);
    abort();
  }
  uint32_t returned = 0;
  for (uint32_t i = 0; i < below; ++i) returned += b->state[i] == Done;
  b->syncing_below = below;
  b->syncing = below - returned;
}

void fiber_pause() { to_scheduler(t_block); }

void run_fibers(uint32_t threads, uint32_t syncing, void (*body)(void*, uint32_t),
                void (*on_switch)(void*, uint32_t), void* arg, Rng* order) {
  Block b;
  b.threads = threads;
  b.syncing_below = syncing < threads ? syncing : threads;
  b.syncing = b.syncing_below;
  b.body = body;
  b.on_switch = on_switch;
  b.arg = arg;
  b.sp.assign(threads, nullptr);
  b.state.assign(threads, Runnable);
  b.live = threads;
  Arena arena = take_arena(threads);
  for (uint32_t i = 0; i < threads; ++i) {
    /* The frame sgemu_switch pops: r15, r14, r13, r12 (the block), rbx (the entry), rbp, then
     * the return address (the trampoline); after `ret` the stack is 16-byte aligned, as a
     * `call` inside the trampoline needs. */
    uintptr_t top = (uintptr_t)(arena.base + (size_t)(i + 1) * kStackBytes);
    void** frame = (void**)(top - 72);
    frame[0] = nullptr;
    frame[1] = nullptr;
    frame[2] = nullptr;
    frame[3] = (void*)&b;
    frame[4] = (void*)&fiber_main;
    frame[5] = nullptr;
    frame[6] = (void*)&sgemu_trampoline;
    b.sp[i] = frame;
  }
  Block* outer = t_block;
  t_block = &b;
  uint32_t idle_rounds = 0;
  std::vector<uint32_t> visit(threads);
  for (uint32_t i = 0; i < threads; ++i) visit[i] = i;
  while (b.live > 0) {
    b.progressed = false;
    if (order)
      for (uint32_t k = threads; k > 1; --k) std::swap(visit[k - 1], visit[order->below(k)]);
    for (uint32_t i : visit) {
      if (b.state[i] != Runnable) continue;
      b.current = i;
      on_switch(arg, i);
      sgemu_switch(&b.scheduler_sp, b.sp[i]);
    }
    if (b.progressed) {
      idle_rounds = 0;
    } else {
      idle(idle_rounds++);
    }
  }
  t_block = outer;
  give_back(arena);
}

}  // namespace emu
