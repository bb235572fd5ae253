/* The platform layer of the StragglAR kernels: the few primitives that differ between a GPU
 * (NVRTC, inline PTX, no CUDA headers) and the host emulation (a C++ compiler, one OS thread per
 * GPU thread), so that the same kernel source runs in both and CI can execute it without a GPU.
 *
 * Memory-model contract (both platforms):
 *  - sg_store_release(p, v): every write this block made before the preceding sg_block_sync()
 *    is visible, system-wide, to whoever observes v with sg_load_acquire;
 *  - sg_atomic_add64_sys(p, v): an acquire-release read-modify-write any GPU of the system (and
 *    a peer through CUDA IPC) sees in one total order;
 *  - sg_load_acquire(p): after it and a following sg_block_sync(), the whole block sees what the
 *    writer published;
 *  - data other ranks wrote is read with sg_load16_fresh / sg_copy_bytes, never from a
 *    cache line that may predate the acquire (GPU: ld.global.cg bypasses the L1). */

#ifndef STRAGGLAR_DEVICE_H_
#define STRAGGLAR_DEVICE_H_

#include "stragglar_plan.h"
#include "stragglar_launch.h"

/* 16 bytes, the unit of vector loads and stores. */
typedef struct __attribute__((aligned(16))) sg_vec16 {
  uint32_t w[4];
} sg_vec16;

#ifdef STRAGGLAR_HOST_EMULATION
/* ---------------------------------------------------------------- host emulation ---------- */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SG_DEVICE static inline
#define SG_OUTLINED static
#define SG_UNROLL
#define SG_GLOBAL extern "C"

/* Where the emulated thread runs: set by the harness before it enters the kernel body. Two
 * harnesses: one OS thread per GPU thread (a pthread barrier per block; ThreadSanitizer watches
 * them), or one OS thread per block running its GPU threads as fibers (the emulated driver:
 * `fiber_sync` and `fiber_pause` switch to the block's next fiber, and the harness rewrites
 * `thread` on every switch). */
struct sg_host_thread {
  /* `threads`: the block's threads that run the plan and meet at sg_block_sync (sg_take_threads);
   * `block_dim`: every thread the harness runs in the block. */
  uint32_t block, blocks, thread, threads, block_dim;
  /* OS-thread harness, per emulated block: barrier[0] for all `block_dim` threads, barrier[1]
   * (the AllReduce kernel's) for the plan threads of a block that has an arrival warp. */
  pthread_barrier_t* barrier;
  /* OS-thread harness: nonzero once the rank's arrival work returned; while it is zero the
   * plan threads wait after the claim (null: they never wait). A test's way to have the
   * arrival thread run to its end before any data is read. */
  const uint32_t* arrival_gate;
  void (*fiber_sync)(void);     /* fiber harness: the plan barrier (null otherwise) */
  void (*fiber_sync_all)(void); /* fiber harness: the whole block's barrier */
  /* Fiber harness: the plan barrier is for the block's first `threads` threads from now on. */
  void (*fiber_set_syncing)(uint32_t threads);
  void (*fiber_pause)(void);  /* fiber harness: lets the block's other fibers run */
  /* Fiber harness: the device the block runs on, and the emulated driver's check of each
   * strong (synchronising) access's scope against the agents that touch the word (null
   * otherwise). `op` names the PTX operation, `file`/`line` the call. */
  int device;
  void (*strong_access)(const void* p, uint32_t bytes, int scope, const char* op,
                        const char* file, int line);
  /* Fiber harness: what a 32-bit acquire load returns, given what memory holds (the emulated
   * driver may make another GPU's memory misread, for the setup's peer probe). */
  uint32_t (*strong_loaded)(const void* p, uint32_t value);
  /* Fiber harness, weak memory (null otherwise: every store lands at once, every load reads
   * memory): `weak_store` holds a plain store (at most 16 bytes) back in the storing thread's
   * buffer, the block barrier passes a thread's held stores on to its block, `release` (every
   * release and acq_rel atomic, before its own access to `p`) lets the block's and the calling
   * thread's held stores land and publishes the thread's view at `p`, `acquired` (every
   * acquire and acq_rel atomic, after its access) takes in the view published at `p`, and
   * `weak_load` reads `n` bytes at `p` into `dst` as the thread may see them (held stores
   * landed first, bytes stored after the thread's view as they were before). */
  void (*weak_store)(void* p, const void* src, uint32_t n);
  void (*weak_load)(void* dst, const void* p, uint32_t n);
  void (*release)(const void* p);
  void (*acquired)(const void* p);
  /* Fiber harness, weak memory: a release store of `bytes` bytes to `p` (after `release`),
   * checked against the word's last release store: the emulated driver ends the run if
   * nothing orders the two (a GPU may land them in either order). */
  void (*release_store)(const void* p, uint32_t bytes, const char* op, const char* file,
                        int line);
  /* Fiber harness, weak memory: the strong accesses (null otherwise: made as C++ atomics). A
   * strong load of the `n`-byte word at `p` (4 or 8 bytes) may return the value before its
   * last store, which nothing ordered before the load and the thread has not seen yet; a
   * strong store or atomic add is recorded as the word's last store (weak_memory.h). */
  uint64_t (*strong_load)(const void* p, uint32_t n);
  void (*strong_store)(void* p, const void* src, uint32_t n, bool release);
  uint64_t (*strong_add)(void* p, uint64_t v, uint32_t n);
  /* Fiber harness: a multimem store of `n` bytes to the multicast address `p`, written into
   * every member's memory bound there; false when `p` is no multicast address of this
   * process (null otherwise: no multicast). */
  bool (*multimem_store)(void* p, const void* src, uint32_t n);
  /* Fiber harness: the calling thread is about to access the block's shared memory (a write,
   * or a pass that reads it); seeded, it may be switched out first (null otherwise). */
  void (*shared_access)(void);
  /* Fiber harness, weak memory: fence.proxy.alias by the calling thread (the multimem stores
   * ordered before it may then land at a release; null otherwise). */
  void (*proxy_fence)(void);
};
extern thread_local sg_host_thread sg_self;

/* The scope of a strong access, as PTX names it: .cta, .gpu or .sys. A word that two GPUs, or
 * a GPU and the host, both touch must only be accessed at system scope. */
enum sg_scope { SG_SCOPE_CTA = 0, SG_SCOPE_GPU = 1, SG_SCOPE_SYS = 2 };

/* Where a primitive was called from, as default arguments (GCC and Clang give the caller's). */
#define SG_CALL_SITE const char *file = __builtin_FILE(), int line = __builtin_LINE()

/* Tells the emulated driver of a strong access (no-op outside the fiber harness). */
SG_DEVICE void sg_strong(const void* p, uint32_t bytes, sg_scope scope, const char* op,
                         const char* file, int line) {
  if (sg_self.strong_access) sg_self.strong_access(p, bytes, (int)scope, op, file, line);
}

/* The scope the release stores and the system-scope atomic report: .sys, unless a planted
 * bug (built only by the mutation runs of docs/EMULATED-GPU.md) narrows one to .gpu. */
#ifdef STRAGGLAR_MUTANT_GPU_SCOPE_RELEASE
#define SG_RELEASE_SCOPE SG_SCOPE_GPU
#else
#define SG_RELEASE_SCOPE SG_SCOPE_SYS
#endif
#ifdef STRAGGLAR_MUTANT_GPU_SCOPE_TICKET
#define SG_TICKET_SCOPE SG_SCOPE_GPU
#else
#define SG_TICKET_SCOPE SG_SCOPE_SYS
#endif

/* A release or acq_rel atomic is about to be made to `p`: the stores it publishes land first,
 * and the word publishes the thread's view (emulation only; not the kernel's sg_publish of a
 * value to its readers). */
SG_DEVICE void sg_emu_release(const void* p) {
  if (sg_self.release) sg_self.release(p);
}
/* A release store to `p` of `bytes` bytes, after sg_emu_release: the emulated driver checks
 * that the word's last release store is ordered before it. */
SG_DEVICE void sg_emu_release_store(const void* p, uint32_t bytes, const char* op,
                                    const char* file, int line) {
  if (sg_self.release_store) sg_self.release_store(p, bytes, op, file, line);
}
/* An acquire or acq_rel atomic read `p`: the thread sees what its releases published. */
SG_DEVICE void sg_emu_acquired(const void* p) {
  if (sg_self.acquired) sg_self.acquired(p);
}

/* The strong access itself, as the emulated driver's weak memory sees it, or a C++ atomic of
 * `order` (the harnesses without weak memory). */
template <class W>
SG_DEVICE W sg_emu_load(const W* p, int order) {
  if (sg_self.strong_load) return (W)sg_self.strong_load(p, sizeof(W));
  return __atomic_load_n(p, order);
}
template <class W>
SG_DEVICE void sg_emu_store(W* p, W v, int order) {
  if (sg_self.strong_store)
    sg_self.strong_store(p, &v, sizeof(W), order == __ATOMIC_RELEASE);
  else
    __atomic_store_n(p, v, order);
}
template <class W>
SG_DEVICE W sg_emu_add(W* p, W v) {
  if (sg_self.strong_add) return (W)sg_self.strong_add(p, v, sizeof(W));
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}

/* The plan barrier: the block's SG_THREADS threads that run the plan. */
SG_DEVICE void sg_block_sync(void) {
  if (sg_self.fiber_sync)
    sg_self.fiber_sync();
  else
    pthread_barrier_wait(&sg_self.barrier[sg_self.threads == sg_self.block_dim ? 0 : 1]);
}
/* Every thread of the block (__syncthreads). */
SG_DEVICE void sg_block_sync_all(void) {
  if (sg_self.fiber_sync_all)
    sg_self.fiber_sync_all();
  else
    pthread_barrier_wait(&sg_self.barrier[0]);
}
/* The arrival work returned (opens the OS-thread harness's gate; no-op on the GPU). */
SG_DEVICE void sg_emu_arrival_done(void) {
  if (sg_self.arrival_gate) __atomic_store_n((uint32_t*)sg_self.arrival_gate, 1, __ATOMIC_RELEASE);
}
/* A plan thread waits at the OS-thread harness's gate, if any (no-op on the GPU). */
SG_DEVICE void sg_emu_await_arrival(void) {
  if (!sg_self.arrival_gate) return;
  while (!__atomic_load_n(sg_self.arrival_gate, __ATOMIC_ACQUIRE)) sched_yield();
}
SG_DEVICE uint32_t sg_load_acquire(const uint32_t* p, SG_CALL_SITE) {
  sg_strong(p, 4, SG_SCOPE_SYS, "ld.acquire.sys.u32", file, line);
  const uint32_t v = sg_emu_load(p, __ATOMIC_ACQUIRE);
  sg_emu_acquired(p);
  return sg_self.strong_loaded ? sg_self.strong_loaded(p, v) : v;
}
SG_DEVICE uint64_t sg_load_acquire64(const uint64_t* p, SG_CALL_SITE) {
  sg_strong(p, 8, SG_SCOPE_SYS, "ld.acquire.sys.u64", file, line);
  const uint64_t v = sg_emu_load(p, __ATOMIC_ACQUIRE);
  sg_emu_acquired(p);
  return v;
}
SG_DEVICE uint64_t sg_load_relaxed64(const uint64_t* p, SG_CALL_SITE) {
  sg_strong(p, 8, SG_SCOPE_SYS, "ld.relaxed.sys.u64", file, line);
  return sg_emu_load(p, __ATOMIC_RELAXED);
}
SG_DEVICE uint32_t sg_load_relaxed(const uint32_t* p, SG_CALL_SITE) {
  sg_strong(p, 4, SG_SCOPE_SYS, "ld.relaxed.sys.u32", file, line);
  return sg_emu_load(p, __ATOMIC_RELAXED);
}
SG_DEVICE void sg_store_release(uint32_t* p, uint32_t v, SG_CALL_SITE) {
  sg_strong(p, 4, SG_RELEASE_SCOPE, "st.release.sys.u32", file, line);
#ifdef STRAGGLAR_MUTANT_RELAXED_RELEASE
  /* A planted bug, built by scripts/tsan-emulation.sh (ThreadSanitizer must report it) and by
   * the emulated GPU's weak-memory test (the data it should publish stays held back): x86
   * would order the store anyway. */
  sg_emu_store(p, v, __ATOMIC_RELAXED);
#else
  sg_emu_release(p);
  sg_emu_release_store(p, 4, "st.release.sys.u32", file, line);
  sg_emu_store(p, v, __ATOMIC_RELEASE);
#endif
}
SG_DEVICE void sg_store_release64(uint64_t* p, uint64_t v, SG_CALL_SITE) {
  sg_strong(p, 8, SG_RELEASE_SCOPE, "st.release.sys.u64", file, line);
  sg_emu_release(p);
  sg_emu_release_store(p, 8, "st.release.sys.u64", file, line);
  sg_emu_store(p, v, __ATOMIC_RELEASE);
}
SG_DEVICE uint32_t sg_load_volatile(const uint32_t* p, SG_CALL_SITE) {
  sg_strong(p, 4, SG_SCOPE_SYS, "ld.volatile.u32", file, line);
  return sg_emu_load(p, __ATOMIC_RELAXED);
}
SG_DEVICE void sg_store_volatile(uint32_t* p, uint32_t v, SG_CALL_SITE) {
  sg_strong(p, 4, SG_SCOPE_SYS, "st.volatile.u32", file, line);
  sg_emu_store(p, v, __ATOMIC_RELAXED);
}
SG_DEVICE void sg_store_relaxed64(uint64_t* p, uint64_t v, SG_CALL_SITE) {
  sg_strong(p, 8, SG_SCOPE_SYS, "st.relaxed.sys.u64", file, line);
  sg_emu_store(p, v, __ATOMIC_RELAXED);
}
SG_DEVICE uint32_t sg_atomic_add(uint32_t* p, uint32_t v, SG_CALL_SITE) {
  sg_strong(p, 4, SG_SCOPE_GPU, "atom.acq_rel.gpu.add.u32", file, line);
  sg_emu_release(p);
  const uint32_t old = sg_emu_add(p, v);
  sg_emu_acquired(p);
  return old;
}
SG_DEVICE uint32_t sg_atomic_add_sys(uint32_t* p, uint32_t v, SG_CALL_SITE) {
  sg_strong(p, 4, SG_SCOPE_SYS, "atom.acq_rel.sys.add.u32", file, line);
  sg_emu_release(p);
  const uint32_t old = sg_emu_add(p, v);
  sg_emu_acquired(p);
  return old;
}
SG_DEVICE uint64_t sg_atomic_add64_sys(uint64_t* p, uint64_t v, SG_CALL_SITE) {
  sg_strong(p, 8, SG_TICKET_SCOPE, "atom.acq_rel.sys.add.u64", file, line);
  sg_emu_release(p);
  const uint64_t old = sg_emu_add(p, v);
  sg_emu_acquired(p);
  return old;
}
SG_DEVICE uint64_t sg_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
SG_DEVICE void sg_pause(void) {
  if (sg_self.fiber_pause)
    sg_self.fiber_pause();
  else
    sched_yield();
}
/* Before a write to the block's shared memory, or a pass that reads it: a seeded schedule may
 * switch the thread out there (no-op on the GPU and in the OS-thread harness). */
SG_DEVICE void sg_shared_access(void) {
  if (sg_self.shared_access) sg_self.shared_access();
}
SG_DEVICE sg_vec16 sg_load16_fresh(const void* p) {
  sg_vec16 v;
  if (sg_self.weak_load)
    sg_self.weak_load(&v, p, 16);
  else
    memcpy(&v, p, 16);
  return v;
}
SG_DEVICE void sg_store_bytes(void* dst, const void* src, uint32_t n) {
  if (sg_self.weak_store)
    sg_self.weak_store(dst, src, n);
  else
    memcpy(dst, src, n);
}
SG_DEVICE void sg_store16(void* p, sg_vec16 v) { sg_store_bytes(p, &v, 16); }
/* multimem.st.relaxed.sys of 16 bytes to a multicast address: written into the memory of every
 * GPU bound there. Only the emulated driver has multicast; anywhere else, or at an address that
 * is not multicast, the emulated thread stops the process (a GPU's behaviour is undefined). */
SG_DEVICE void sg_multimem_store16(void* p, sg_vec16 v, SG_CALL_SITE) {
  if (!sg_self.multimem_store || !sg_self.multimem_store(p, &v, 16)) {
    fprintf(stderr, "emulated GPU: multimem.st at %s:%d to %p, which is no multicast address\n",
            file, line, p);
    abort();
  }
}
/* fence.proxy.alias: orders this thread's accesses through one virtual address of memory
 * (a multicast address) against those through another (the same bytes' own address). The host
 * has one address per byte; the emulated GPU's weak memory lets a block's multimem stores land
 * at a release only once a fence ordered them (weak_memory.h). */
SG_DEVICE void sg_fence_proxy_alias(void) {
  if (sg_self.proxy_fence) sg_self.proxy_fence();
}
/* `dst` is a register's worth in the kernels (a held store never covers it). */
SG_DEVICE void sg_copy_bytes(void* dst, const void* src, uint32_t n) {
  if (sg_self.weak_load)
    sg_self.weak_load(dst, src, n);
  else
    memcpy(dst, src, n);
}
#define SG_THREAD (sg_self.thread)
#define SG_THREADS (sg_self.threads)
#define SG_BLOCK_DIM (sg_self.block_dim)
#define SG_BLOCK (sg_self.block)
#define SG_BLOCKS (sg_self.blocks)
/* The emulation's warp is one thread: the arrival "warp" of plan block 0 is its last thread. */
#define SG_ARRIVAL_LANES 1u
/* SG_THREADS at a kernel's start, in two halves around one whole-block barrier: thread 0
 * announces the count before it (the GPU's shared word; nothing here), and every thread takes
 * it after (each emulated thread has its own copy; every thread takes the same count). */
SG_DEVICE void sg_announce_threads(uint32_t threads) { (void)threads; }
SG_DEVICE void sg_take_threads(uint32_t threads) {
  sg_self.threads = threads;
  if (sg_self.fiber_set_syncing) sg_self.fiber_set_syncing(threads);
}

#else
/* ---------------------------------------------------------------- GPU (NVRTC) ------------- */
#define SG_DEVICE static __device__ __forceinline__
/* A device function compiled once and called, for large bodies with several callers. */
#define SG_OUTLINED static __device__ __noinline__
/* Before a loop of constant trip count whose arrays must stay in registers. */
#define SG_UNROLL _Pragma("unroll")
#define SG_GLOBAL extern "C" __global__

/* The threads of this block that run the data path and meet at sg_block_sync: every thread
 * but an arrival warp. Set once at a kernel's start: thread 0 announces it, then the whole
 * block, the arrival warp included, meets at barrier 0 (the kernel's own first barrier, which
 * the count shares), after which every thread takes it (nothing to do on the GPU: SG_THREADS
 * reads the shared word). */
static __shared__ uint32_t sg_block_threads;
SG_DEVICE void sg_announce_threads(uint32_t threads) {
  if (threadIdx.x == 0) sg_block_threads = threads;
}
SG_DEVICE void sg_take_threads(uint32_t threads) { (void)threads; }
/* The block barrier of the data path: named barrier 1 for SG_THREADS threads (a multiple of
 * the warp size), so a warp doing other work (the arrival protocol) never takes part. Like
 * __syncthreads, bar.sync orders the memory accesses of the threads taking part. */
SG_DEVICE void sg_block_sync(void) {
  asm volatile("bar.sync 1, %0;" ::"r"(sg_block_threads) : "memory");
}
/* Every thread of the block (barrier 0). */
SG_DEVICE void sg_block_sync_all(void) { __syncthreads(); }
/* Hooks of the OS-thread harness's gate (see sg_host_thread::arrival_gate): none here. */
SG_DEVICE void sg_emu_arrival_done(void) {}
SG_DEVICE void sg_emu_await_arrival(void) {}
SG_DEVICE uint32_t sg_load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
SG_DEVICE uint64_t sg_load_acquire64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/* A tagged 64-bit word read whole, which orders nothing after it (sg_store_relaxed64's). */
SG_DEVICE uint64_t sg_load_relaxed64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/* A 32-bit word polled until it holds a value, ordering nothing (unlike an acquire, it leaves
 * the L1 alone): the wait then reads it once with sg_load_acquire. */
SG_DEVICE uint32_t sg_load_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
/* One system-scope ordering per publish: st.release.sys alone, no fence before it. A caller
 * either publishes only its own thread's earlier writes (the failure and arrival words), or a
 * block's work as sg_publish does: all threads write, sg_block_sync(), then one thread per
 * reader releases (the epoch and graph counters add a gpu-scope acq_rel atomic across blocks
 * before it). That is enough for the whole block's stores, not only the releasing thread's:
 *  - bar.sync orders each thread's earlier writes before what any thread of the block does
 *    after the barrier (it synchronizes the block, at CTA scope);
 *  - in the PTX memory model a release is cumulative: it publishes every write that precedes
 *    it in causality order, and causality order is transitive across scopes, so the other
 *    threads' writes (ordered before the release by the barrier) are published with it;
 *  - the reader's ld.acquire.sys that sees the value synchronizes with the release at system
 *    scope (both are morally strong: the same scope, both strong), and its block's
 *    sg_block_sync() then orders the whole reading block after it.
 * The emulation is no stronger: a pthread barrier, then a release store (TSan checks it). */
SG_DEVICE void sg_store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/* As sg_store_release, for a 64-bit word. */
SG_DEVICE void sg_store_release64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
SG_DEVICE uint32_t sg_load_volatile(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
SG_DEVICE void sg_store_volatile(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/* A 64-bit word other GPUs and the host read whole, that publishes nothing but itself (a
 * tagged value): no fence before it. */
SG_DEVICE void sg_store_relaxed64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
SG_DEVICE uint32_t sg_atomic_add(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v)
               : "memory");
  return old;
}
/* A 32-bit acquire-release add any GPU of the system sees in one total order (the setup's peer
 * probe). */
SG_DEVICE uint32_t sg_atomic_add_sys(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.sys.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v)
               : "memory");
  return old;
}
SG_DEVICE uint64_t sg_atomic_add64_sys(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.sys.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v)
               : "memory");
  return old;
}
SG_DEVICE uint64_t sg_now_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
SG_DEVICE void sg_pause(void) { __nanosleep(64); }
SG_DEVICE void sg_shared_access(void) {}
SG_DEVICE sg_vec16 sg_load16_fresh(const void* p) {
  sg_vec16 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p)
               : "memory");
  return v;
}
SG_DEVICE void sg_store16(void* p, sg_vec16 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]),
               "r"(v.w[2]), "r"(v.w[3])
               : "memory");
}
/* 16 bytes stored through the multicast address `p` into the memory of every GPU bound there
 * (multimem.st, relaxed, system scope; sm_90 and later: an older GPU traps). PTX takes vectors
 * of floating-point lanes only, so the 16 bytes go as four f32 lanes: a store, not arithmetic. */
SG_DEVICE void sg_multimem_store16(void* p, sg_vec16 v) {
#if __CUDA_ARCH__ >= 900
  asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p),
               "f"(__uint_as_float(v.w[0])), "f"(__uint_as_float(v.w[1])),
               "f"(__uint_as_float(v.w[2])), "f"(__uint_as_float(v.w[3]))
               : "memory");
#else
  (void)p;
  (void)v;
  __trap();
#endif
}
/* fence.proxy.alias: PTX treats two virtual addresses of the same memory (a multicast address
 * and a member's own) as different proxies, ordered only through this fence: a writer's
 * multimem stores reach a reader's loads at its own address only with one on the path. */
SG_DEVICE void sg_fence_proxy_alias(void) { asm volatile("fence.proxy.alias;" ::: "memory"); }
/* Copies n bytes (one element) of memory other ranks may write into dst: one load when src is
 * aligned to n (2, 4 or 8), byte by byte otherwise. Values move through memcpy (no type
 * punning; NVVM makes it a register move). */
SG_DEVICE void sg_copy_bytes(void* dst, const void* src, uint32_t n) {
  const uint64_t at = (uint64_t)src;
  if (n == 2 && at % 2 == 0) {
    unsigned short v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(src) : "memory");
    memcpy(dst, &v, 2);
  } else if (n == 4 && at % 4 == 0) {
    uint32_t v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(src) : "memory");
    memcpy(dst, &v, 4);
  } else if (n == 8 && at % 8 == 0) {
    uint64_t v;
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(src) : "memory");
    memcpy(dst, &v, 8);
  } else {
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t b;
      asm volatile("ld.global.cg.u8 %0, [%1];" : "=r"(b) : "l"((const char*)src + i) : "memory");
      ((unsigned char*)dst)[i] = (unsigned char)b;
    }
  }
}
/* Stores n bytes (one element) from src at dst: one store when dst is aligned to n (2, 4 or
 * 8), byte by byte otherwise. */
SG_DEVICE void sg_store_bytes(void* dst, const void* src, uint32_t n) {
  const uint64_t at = (uint64_t)dst;
  if (n == 2 && at % 2 == 0) {
    unsigned short v;
    memcpy(&v, src, 2);
    asm volatile("st.global.u16 [%0], %1;" ::"l"(dst), "h"(v) : "memory");
  } else if (n == 4 && at % 4 == 0) {
    uint32_t v;
    memcpy(&v, src, 4);
    asm volatile("st.global.u32 [%0], %1;" ::"l"(dst), "r"(v) : "memory");
  } else if (n == 8 && at % 8 == 0) {
    uint64_t v;
    memcpy(&v, src, 8);
    asm volatile("st.global.u64 [%0], %1;" ::"l"(dst), "l"(v) : "memory");
  } else {
    for (uint32_t i = 0; i < n; ++i) ((unsigned char*)dst)[i] = ((const unsigned char*)src)[i];
  }
}
#define SG_THREAD (threadIdx.x)
#define SG_THREADS (sg_block_threads)
#define SG_BLOCK_DIM (blockDim.x)
#define SG_BLOCK (blockIdx.x)
/* The arrival warp of plan block 0 (see sg_plan_threads). */
#define SG_ARRIVAL_LANES WARP_THREADS
#define SG_BLOCKS (gridDim.x)
#endif

#endif /* STRAGGLAR_DEVICE_H_ */
