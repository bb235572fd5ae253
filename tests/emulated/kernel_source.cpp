/* The kernels the emulated GPU runs: cuda/stragglar_allreduce.cu and
 * cuda/stragglar_graph_turn.cu themselves, compiled for the host (STRAGGLAR_HOST_EMULATION),
 * each launch's blocks run by the fiber harness. This file does not see cuda.h; kernels.cpp
 * reaches it through kernel_source.h. */
#include "kernel_source.h"

#include "fibers.h"
#include "stragglar_allreduce.cu"
#include "stragglar_graph_turn.cu"
#include "weak_memory.h"

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <new>

/* The device runtime's function the turn kernel (cuda/stragglar_graph_turn.cu) calls: the
 * emulated driver sets the handle's value for its conditional nodes (capture.cpp). */
extern "C" void cudaGraphSetConditional(unsigned long long handle, unsigned int value) {
  emu::set_conditional(handle, value);
}

namespace {

struct BlockRun {
  emu::KernelId kernel;
  const void* params;
  sg_scratch* scratch;
};

void on_switch(void*, uint32_t thread) { sg_self.thread = thread; }

/* The application's delay kernel: holds its multiprocessor for `ns` and touches nothing, so it
 * sleeps rather than spins (a spinning block per multiprocessor held would starve the
 * emulated blocks beside it of the host's few cores, which a GPU's would not). */
void delay_body(uint64_t ns) {
  if (SG_THREAD != 0) return;
  const uint64_t start = sg_now_ns();
  for (uint64_t now = start; now - start < ns; now = sg_now_ns()) {
    const uint64_t left = ns - (now - start);
    const uint64_t nap = left < 1000000 ? left : 1000000;
    struct timespec t = {0, (long)nap};
    nanosleep(&t, nullptr);
  }
}

/* The self-test's litmus kernel (emulation only; selftest.c says what each shape must show):
 * thread 0 stores 1 into `words[0]` (the data, a volatile store) and releases 1 into
 * `words[4]` (the flag, in other 16 bytes: the history keeps one store per 16); thread 1
 * waits for the flag (acquiring it in shape 1, polling it relaxed in shapes 0 and 2) and
 * counts its polls into `words[12]`, then reads the data into `words[8..12)`: four relaxed
 * loads (shapes 0, 1, 3 and 4), or an atomic add of 0 and three relaxed loads (shape 2). In
 * shapes 3 and 4 the host's copy engine is the writer: thread 0 stores nothing, thread 1 says
 * it started (a volatile 1 into `words[14]`), then the host sets the data and the flag on
 * another stream; thread 1 polls the flag relaxed (shape 3) or acquires it (shape 4). The
 * results are written plainly, read by the host once the kernel ended. */
struct LitmusArgs {
  uint64_t words;
  uint32_t shape;
  uint32_t unused;
};
void litmus_body(const LitmusArgs* a) {
  uint32_t* words = (uint32_t*)a->words;
  const bool copy_engine_writes = a->shape >= 3;
  if (SG_THREAD == 0) {
    if (copy_engine_writes) return;
    sg_store_volatile(&words[0], 1);
    sg_store_release(&words[4], 1);
    return;
  }
  if (SG_THREAD != 1) return;
  if (copy_engine_writes) sg_store_volatile(&words[14], 1);
  const bool acquire = a->shape == 1 || a->shape == 4;
  uint32_t polls = 1;
  while ((acquire ? sg_load_acquire(&words[4]) : sg_load_relaxed(&words[4])) != 1) {
    ++polls;
    sg_pause();
  }
  words[12] = polls;
  for (uint32_t i = 0; i < 4; ++i) {
    words[8 + i] = a->shape == 2 && i == 0 ? sg_atomic_add_sys(&words[0], 0)
                                           : sg_load_relaxed(&words[0]);
  }
}

void body(void* arg, uint32_t thread) {
  BlockRun* run = (BlockRun*)arg;
  sg_self.thread = thread;
  switch (run->kernel) {
    case emu::KernelId::AllReduce:
      sg_all_reduce((const RawLaunch*)run->params, run->scratch);
      break;
    case emu::KernelId::Ticket:
      sg_ticket((const RawTicket*)run->params);
      break;
    case emu::KernelId::TicketEnd:
      sg_ticket_end((const RawTicket*)run->params);
      break;
    case emu::KernelId::Delay: {
      uint64_t ns;
      memcpy(&ns, run->params, sizeof ns);
      delay_body(ns);
      break;
    }
    case emu::KernelId::ApplyProbe:
      sg_apply_probe((const RawApply*)run->params, run->scratch);
      break;
    case emu::KernelId::PeerProbe:
      sg_peer_probe((const RawPeerProbe*)run->params);
      break;
    case emu::KernelId::MulticastProbe:
      sg_multicast_probe((const RawMulticastProbe*)run->params);
      break;
    case emu::KernelId::Chase:
      sg_chase((const RawChase*)run->params);
      break;
    case emu::KernelId::SetBranch: {
      /* The self-test's set_branch.ptx: thread 0 sets three handles from a word's bits. */
      uint64_t args[4];
      memcpy(args, run->params, sizeof args);
      if (SG_THREAD == 0) {
        const uint32_t word = *(const uint32_t*)args[3];
        emu::set_conditional(args[0], (word & 1u) ^ 1u);
        emu::set_conditional(args[1], word & 1u);
        emu::set_conditional(args[2], (word >> 1) & 1u);
      }
      break;
    }
    case emu::KernelId::GraphTurn:
      sg_graph_turn((const RawGraphTurn*)run->params);
      break;
    case emu::KernelId::GraphArrival:
      sg_graph_nccl_arrival((const RawLaunch*)run->params);
      break;
    case emu::KernelId::GraphEnd:
      sg_graph_end((const RawLaunch*)run->params);
      break;
    case emu::KernelId::Litmus:
      litmus_body((const LitmusArgs*)run->params);
      break;
    case emu::KernelId::Fault:
      /* The self-test's kernel that writes to address 0 on a GPU: here it faults only when
       * STRAGGLAR_EMU_KERNEL_FAULT says so (kernels.cpp). */
      break;
  }
}

/* The running block's held-back stores (null: weak memory is off). */
thread_local emu::WeakMemory* t_weak = nullptr;

/* A block barrier (`wait`: the plan's or the whole block's), with the held stores it orders. */
void emu_barrier(void (*wait)()) {
  const uint32_t me = sg_self.thread;
  if (t_weak) t_weak->at_barrier(me);
  wait();
  emu::wait_for_turn(sg_self.device);
  if (t_weak) t_weak->after_barrier(me);
}
void emu_sync(void) { emu_barrier(emu::fiber_sync); }
void emu_sync_all(void) { emu_barrier(emu::fiber_sync_all); }
void emu_pause(void) {
  emu::fiber_pause();
  emu::wait_for_turn(sg_self.device);
}
/* Seeded scheduling: the running block's choices (null: the deterministic schedule). */
thread_local emu::Rng* t_choices = nullptr;

/* Checks a strong access's scope; seeded, it may first let some of the block's held stores
 * land, or the block's other threads run. A strong access reads its own word too. */
void emu_strong_access(const void* p, uint32_t bytes, int scope, const char* op,
                       const char* file, int line) {
  emu::check_strong_access(p, bytes, scope, op, file, line, sg_self.device);
  if (t_weak) {
    t_weak->before_load(p, bytes);
    if (t_choices && t_choices->one_in(8)) t_weak->land_early(*t_choices);
  }
  if (t_choices && t_choices->one_in(4)) emu::fiber_pause();
}

/* Seeded scheduling: a thread about to access the block's shared memory may let the block's
 * other threads run first. */
void emu_shared_access(void) {
  if (t_choices && t_choices->one_in(4)) emu_pause();
}

uint32_t emu_strong_loaded(const void* p, uint32_t value) {
  return emu::loaded_by(p, value, sg_self.device);
}

/* A multimem store: refused (false) where `p` is no multicast address; with weak memory, held
 * back until a release or the block's end, as a plain store. */
std::atomic<uint64_t> g_multimem_stores{0};

bool emu_multimem_store(void* p, const void* src, uint32_t n) {
  g_multimem_stores.fetch_add(1, std::memory_order_relaxed);
  if (!t_weak) return emu::multicast_store(p, src, n, emu::history_clock());
  if (!emu::is_multicast_address(p, n)) return false;
  t_weak->store_multicast(sg_self.thread, p, src, n);
  return true;
}

void emu_weak_store(void* p, const void* src, uint32_t n) {
  t_weak->store(sg_self.thread, p, src, n);
}
void emu_weak_load(void* dst, const void* p, uint32_t n) {
  t_weak->load(sg_self.thread, dst, p, n);
}
uint64_t emu_strong_load(const void* p, uint32_t n) {
  return t_weak->strong_load(sg_self.thread, p, n);
}
void emu_strong_store(void* p, const void* src, uint32_t n, bool release) {
  t_weak->strong_store(sg_self.thread, p, src, n, release);
}
uint64_t emu_strong_add(void* p, uint64_t v, uint32_t n) {
  return t_weak->strong_add(sg_self.thread, p, v, n);
}
void emu_release(const void* p) { t_weak->release(sg_self.thread, p); }
void emu_proxy_fence() { t_weak->proxy_fence(sg_self.thread); }
void emu_acquired(const void* p) { t_weak->acquired(sg_self.thread, p); }
void emu_release_store(const void* p, uint32_t bytes, const char* op, const char* file,
                       int line) {
  t_weak->release_store(p, bytes, op, file, line);
}

const emu::KernelSpec kSpecs[] = {
    {"ncclStragglarAllReduce", emu::KernelId::AllReduce, sizeof(RawLaunch), MAX_THREADS},
    {"ncclStragglarTicket", emu::KernelId::Ticket, sizeof(RawTicket), 1024},
    {"ncclStragglarTicketEnd", emu::KernelId::TicketEnd, sizeof(RawTicket), 1024},
    {"ncclStragglarDelay", emu::KernelId::Delay, sizeof(uint64_t), 1024},
    {"ncclStragglarApplyProbe", emu::KernelId::ApplyProbe, sizeof(RawApply), MAX_THREADS},
    {"ncclStragglarPeerProbe", emu::KernelId::PeerProbe, sizeof(RawPeerProbe), 1024},
    {"ncclStragglarMulticastProbe", emu::KernelId::MulticastProbe, sizeof(RawMulticastProbe),
     1024},
    {"ncclStragglarChase", emu::KernelId::Chase, sizeof(RawChase), 1024},
    {"ncclStragglarFault", emu::KernelId::Fault, sizeof(uint64_t), 1024},
    {"stragglarEmuSetBranch", emu::KernelId::SetBranch, 4 * sizeof(uint64_t), 1024},
    {"ncclStragglarGraphTurn", emu::KernelId::GraphTurn, sizeof(RawGraphTurn), 1024},
    {"ncclStragglarGraphArrival", emu::KernelId::GraphArrival, sizeof(RawLaunch), 1024},
    {"ncclStragglarGraphEnd", emu::KernelId::GraphEnd, sizeof(RawLaunch), 1024},
    {"stragglarEmuLitmus", emu::KernelId::Litmus, sizeof(LitmusArgs), 1024},
};

}  // namespace

namespace emu {

uint64_t multimem_stores() { return g_multimem_stores.load(std::memory_order_relaxed); }

const KernelSpec* kernel_specs(size_t* count) {
  *count = sizeof(kSpecs) / sizeof(kSpecs[0]);
  return kSpecs;
}

void run_block(const KernelSpec* k, const void* params, uint32_t block, uint32_t blocks,
               uint32_t threads, int device, uint64_t launch) {
  /* The block's shared memory. */
  void* shared = aligned_alloc(16, (sizeof(sg_scratch) + 15) / 16 * 16);
  if (!shared) abort();
  BlockRun run{k->id, params, (sg_scratch*)shared};
  sg_self.block = block;
  sg_self.blocks = blocks;
  sg_self.threads = threads;
  sg_self.block_dim = threads;
  sg_self.barrier = nullptr;
  sg_self.arrival_gate = nullptr;
  sg_self.fiber_sync = emu_sync;
  sg_self.fiber_sync_all = emu_sync_all;
  sg_self.fiber_set_syncing = emu::fiber_set_syncing;
  sg_self.fiber_pause = emu_pause;
  sg_self.device = device;
  sg_self.strong_access = emu_strong_access;
  sg_self.strong_loaded = emu_strong_loaded;
  sg_self.multimem_store = emu_multimem_store;
  Rng choices = rng_for(kChoiceFibers, launch, block);
  Rng* seeded = schedule_seed() ? &choices : nullptr;
  t_choices = seeded;
  sg_self.shared_access = seeded ? emu_shared_access : nullptr;
  {
    /* Whatever the block still holds lands when it ends (with `weak`). */
    WeakMemory weak(threads, device);
    if (weak_memory_enabled()) {
      t_weak = &weak;
      sg_self.weak_store = emu_weak_store;
      sg_self.weak_load = emu_weak_load;
      sg_self.release = emu_release;
      sg_self.acquired = emu_acquired;
      sg_self.strong_load = emu_strong_load;
      sg_self.strong_store = emu_strong_store;
      sg_self.strong_add = emu_strong_add;
      sg_self.release_store = emu_release_store;
      sg_self.proxy_fence = emu_proxy_fence;
    }
    /* Every thread meets at the plan barrier until the kernel says otherwise (the AllReduce
     * kernel's arrival warp leaves it, sg_take_threads). */
    run_fibers(threads, threads, body, on_switch, &run, seeded);
    t_weak = nullptr;
    sg_self.weak_store = nullptr;
    sg_self.weak_load = nullptr;
    sg_self.release = nullptr;
    sg_self.acquired = nullptr;
    sg_self.strong_load = nullptr;
    sg_self.strong_store = nullptr;
    sg_self.strong_add = nullptr;
    sg_self.release_store = nullptr;
    sg_self.proxy_fence = nullptr;
  }
  t_choices = nullptr;
  sg_self.shared_access = nullptr;
  sg_self.fiber_sync = nullptr;
  sg_self.fiber_sync_all = nullptr;
  sg_self.fiber_set_syncing = nullptr;
  sg_self.fiber_pause = nullptr;
  sg_self.strong_access = nullptr;
  sg_self.strong_loaded = nullptr;
  sg_self.multimem_store = nullptr;
  free(shared);
}

}  // namespace emu
