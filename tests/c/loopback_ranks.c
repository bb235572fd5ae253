/* Ranks as processes on their own emulated GPUs, through libstragglar and the loopback NCCL
 * (scripts/emulated-gpu.sh puts both on the loader path): the parent makes the unique id and
 * starts NRANKS children; each opens GPU `rank`, joins the communicator and runs 100
 * ncclAllReduce calls of several types, ops, odd counts, in place and out of place, checking
 * every element against the exact result (values are small integers, so every type reduces
 * them exactly in any order).
 *
 * usage: loopback_ranks NRANKS [KILL_RANK KILL_AT]
 *   With KILL_RANK, that rank kills itself (SIGKILL) before call KILL_AT; every other rank must
 *   then see an error (from ncclCommGetAsyncError after its stream drains), call ncclCommAbort
 *   (ncclCommDestroy with LOOPBACK_DESTROY_ON_ERROR set) and exit 3. Prints one line per
 *   rank; exit status 0 when every rank ended as expected.
 *   With LOOPBACK_NONBLOCKING set, each rank joins through a nonblocking ncclCommInitRankConfig;
 *   with LOOPBACK_GRAPHS set, each call after the first three is captured into a CUDA graph (out
 *   of place) and the graph launched twice; with LOOPBACK_ABORT_AFTER_MS set, a call still
 *   running after that many ms makes the rank call ncclCommAbort (as PyTorch's watchdog does)
 *   and report "aborted"; with LOOPBACK_LATE_RANK=A[,B] and LOOPBACK_LATE_US, rank A sleeps
 *   before every call (before the first half, and rank B before the second, with B); with LOOPBACK_FIXED every call is the same (4099 floats, sum), one size class for
 *   the straggler's detection; LOOPBACK_ENV_<r>=NAME=VALUE sets NAME in rank r's environment
 *   only; with LOOPBACK_NO_DESTROY a rank exits without destroying its communicator; with
 *   LOOPBACK_COLLECTIVES the calls cycle AllReduce, ReduceScatter and AllGather (float sums),
 *   with LOOPBACK_SPLIT on the two communicators split from it (even and odd ranks), with
 *   LOOPBACK_GROUPS each call inside a group of its own with an AllReduce of the same input
 *   beside it (two collectives a group); with LOOPBACK_HOST_TIMES each rank prints
 *   the median and 90th percentile host time of its eager calls, with LOOPBACK_STREAM_TIMES
 *   their stream time (events recorded just before and after each call); LOOPBACK_BUSY=B:US[:K]
 *   launches a kernel of B blocks spinning US microseconds on a stream of its own before each
 *   eager call, or with K once, before call K (the application's kernel holding
 *   multiprocessors); LOOPBACK_HOSTNAME=NAME (through
 *   LOOPBACK_ENV_<r>) runs a rank under another host name; LOOPBACK_MIXED=N: eager calls
 *   and graph replays on two streams, not waited for in between (see run_mixed); LOOPBACK_GROW=N:
 *   float sums of growing sizes up to 7 MiB, the first N eager (see run_growing);
 *   LOOPBACK_CAPTURE_BESIDE: the first calls beside another thread's capture (see
 *   run_capture_beside); LOOPBACK_DEVICE=D puts every rank on device D (ranks sharing one GPU,
 *   with STRAGGLAR_TEST_SHARED_GPU=1 on the GPU engine). Each rank
 *   that finishes prints its stragglarGetStats (the designated straggler,
 *   calls on StragglAR and on NCCL).
 * Built twice by tests/emulated_gpu.rs: linked against libstragglar, and linked against the
 * (loopback) libnccl alone, run with LD_PRELOAD=libstragglar.so. */
#define _GNU_SOURCE
#include <cuda.h>
#include <nccl.h>
#include <stragglar.h>

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Weak: linked against libnccl alone and run with LD_PRELOAD=libstragglar.so, the preloaded
 * library provides it; where nothing does, no statistics are printed. */
#pragma weak stragglarGetStats
#pragma weak stragglarGetArrivals
#pragma weak stragglarGetSizeClass

extern char** environ;

enum { MAX_COUNT = 5003 };
/* Calls per rank: LOOPBACK_CALLS, or 100. */
static int CALLS = 100;

static const ncclDataType_t kTypes[] = {ncclInt8,    ncclInt32,   ncclFloat16, ncclFloat32,
                                        ncclFloat64, ncclBfloat16, ncclUint64};
static const ncclRedOp_t kOps[] = {ncclSum, ncclMax, ncclMin, ncclProd};

static size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclFloat32: return 4;
    default: return 8;
  }
}

/* Small integers only (|v| < 2048): exact in half and bfloat16. */
static uint16_t int_to_half(int v) {
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned a = (unsigned)(v < 0 ? -v : v), e = 0;
  while ((a >> e) > 1) e++;
  unsigned mant = (a << (10 - e)) & 0x3ff;
  return (uint16_t)(sign | ((e + 15) << 10) | mant);
}
static int half_to_int(uint16_t h) {
  if ((h & 0x7fff) == 0) return 0;
  int e = ((h >> 10) & 0x1f) - 15;
  int a = (int)((0x400u | (h & 0x3ffu)) >> (10 - e));
  return (h & 0x8000) ? -a : a;
}
static uint16_t int_to_bf16(int v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return (uint16_t)(bits >> 16);
}
static int bf16_to_int(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return (int)f;
}

/* Rank r's element j of call i. */
static int value(int r, int i, int j, ncclRedOp_t op, ncclDataType_t t) {
  if (op == ncclProd) return (r + i + j) % 2 + 1;
  int v = (r * 7 + i * 3 + j) % 7 - 3;
  return t == ncclUint64 ? v + 3 : v;
}

static void store(void* buf, size_t j, ncclDataType_t t, int v) {
  switch (t) {
    case ncclInt8: ((int8_t*)buf)[j] = (int8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[j] = v; break;
    case ncclFloat16: ((uint16_t*)buf)[j] = int_to_half(v); break;
    case ncclBfloat16: ((uint16_t*)buf)[j] = int_to_bf16(v); break;
    case ncclFloat32: ((float*)buf)[j] = (float)v; break;
    case ncclFloat64: ((double*)buf)[j] = (double)v; break;
    default: ((uint64_t*)buf)[j] = (uint64_t)v; break;
  }
}

static long long load(const void* buf, size_t j, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)buf)[j];
    case ncclInt32: return ((const int32_t*)buf)[j];
    case ncclFloat16: return half_to_int(((const uint16_t*)buf)[j]);
    case ncclBfloat16: return bf16_to_int(((const uint16_t*)buf)[j]);
    case ncclFloat32: return (long long)((const float*)buf)[j];
    case ncclFloat64: return (long long)((const double*)buf)[j];
    default: return (long long)((const uint64_t*)buf)[j];
  }
}

static long long expected(int nranks, int i, int j, ncclRedOp_t op, ncclDataType_t t) {
  long long acc = value(0, i, j, op, t);
  for (int r = 1; r < nranks; ++r) {
    long long v = value(r, i, j, op, t);
    switch (op) {
      case ncclSum: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      default: acc = v < acc ? v : acc; break;
    }
  }
  return acc;
}

/* Prints this rank's stragglarGetStats: the designated straggler, calls on StragglAR and on
 * NCCL. */
static void print_stats(int rank, ncclComm_t comm) {
  stragglarStats_t stats;
  if (stragglarGetStats && stragglarGetStats(comm, &stats) == ncclSuccess)
    printf("rank %d: designated %d, %llu on StragglAR, %llu on NCCL\n", rank,
           stats.designatedStraggler, (unsigned long long)stats.onStragglar,
           (unsigned long long)stats.onNccl);
  /* The first late rank's arrivals, as this rank's straggler report counts them. */
  const char* late = getenv("LOOPBACK_LATE_RANK");
  stragglarArrivals_t arrivals;
  if (late && stragglarGetArrivals &&
      stragglarGetArrivals(comm, atoi(late), &arrivals) == ncclSuccess)
    printf("rank %d: rank %d arrived last %llu of %llu calls\n", rank, atoi(late),
           (unsigned long long)arrivals.arrivedLast, (unsigned long long)arrivals.calls);
  /* What the policy measured and chose per size class: the same numbers on every rank. */
  for (int c = 0; stragglarGetSizeClass && c <= 64; ++c) {
    stragglarSizeClass_t s;
    if (stragglarGetSizeClass(comm, c, &s) != ncclSuccess || s.calls == 0) continue;
    printf("rank %d: size class %d: %llu calls, %llu on StragglAR, post-arrival StragglAR "
           "%.3f us of %llu, NCCL %.3f us of %llu\n",
           rank, c, (unsigned long long)s.calls, (unsigned long long)s.onStragglar,
           s.stragglarPostUs, (unsigned long long)s.stragglarSamples, s.ncclPostUs,
           (unsigned long long)s.ncclSamples);
  }
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Waits for the stream; with a limit, calls ncclCommAbort once the call has taken longer (as
 * PyTorch's watchdog does), after which the stream must drain promptly. */
static CUresult drain(CUstream stream, ncclComm_t comm, long abort_after_ms, int rank, int call) {
  if (abort_after_ms <= 0) return cuStreamSynchronize(stream);
  double start = now_ms();
  CUresult r;
  while ((r = cuStreamQuery(stream)) == CUDA_ERROR_NOT_READY) {
    if (now_ms() - start > (double)abort_after_ms) {
      printf("rank %d: call %d still running after %ld ms: ncclCommAbort\n", rank, call,
             abort_after_ms);
      ncclCommAbort(comm);
      return cuStreamSynchronize(stream) == CUDA_SUCCESS ? CUDA_ERROR_LAUNCH_TIMEOUT
                                                          : CUDA_ERROR_UNKNOWN;
    }
    struct timespec t = {0, 1000000};
    nanosleep(&t, NULL);
  }
  return r;
}

#define CU(call)                                                       \
  do {                                                                 \
    CUresult r_ = (call);                                              \
    if (r_ != CUDA_SUCCESS) {                                          \
      fprintf(stderr, "rank %d: %s failed: %d\n", rank, #call, (int)r_); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

/* LOOPBACK_CYCLES=N: N communicators one after another, each running one checked AllReduce,
 * handing the next one's unique id to every rank (ncclBroadcast from rank 0), then aborted
 * (ncclCommAbort, as an elastic job does before it re-creates). Prints the device memory in
 * use after the first and the last cycle. */
static int run_cycles(int rank, int nranks, ncclUniqueId id, int cycles, CUstream stream,
                      CUdeviceptr send, CUdeviceptr recv) {
  size_t free_bytes, total, used_first = 0, used_last = 0;
  static float host[4099];
  for (int k = 0; k < cycles; ++k) {
    ncclComm_t comm;
    ncclResult_t nr = ncclCommInitRank(&comm, nranks, id, rank);
    if (nr != ncclSuccess) {
      fprintf(stderr, "rank %d: cycle %d: ncclCommInitRank: %s\n", rank, k, ncclGetErrorString(nr));
      return 1;
    }
    for (int j = 0; j < 4099; ++j) host[j] = (float)(rank + j % 5);
    CU(cuMemcpyHtoD(send, host, sizeof host));
    nr = ncclAllReduce((const void*)send, (void*)recv, 4099, ncclFloat32, ncclSum, comm, stream);
    CU(cuStreamSynchronize(stream));
    CU(cuMemcpyDtoH(host, recv, sizeof host));
    for (int j = 0; j < 4099; ++j) {
      float want = (float)(nranks * (nranks - 1) / 2 + nranks * (j % 5));
      if (nr != ncclSuccess || host[j] != want) {
        printf("rank %d: cycle %d: element %d is %g, not %g\n", rank, k, j, host[j], want);
        return 4;
      }
    }
    /* The next communicator's id, from rank 0. */
    if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) return 1;
    CU(cuMemcpyHtoD(send, &id, sizeof id));
    nr = ncclBroadcast((const void*)send, (void*)send, sizeof id, ncclInt8, 0, comm, stream);
    CU(cuStreamSynchronize(stream));
    CU(cuMemcpyDtoH(&id, send, sizeof id));
    if (nr != ncclSuccess) return 1;
    ncclCommAbort(comm);
    CU(cuMemGetInfo(&free_bytes, &total));
    if (k == 0) used_first = total - free_bytes;
    used_last = total - free_bytes;
  }
  printf("rank %d: %d cycles; device memory in use after the first %zu, after the last %zu\n",
         rank, cycles, used_first, used_last);
  return 0;
}

/* LOOPBACK_TWO_STREAMS: calls in pairs, call i on one stream and call i + 1 on another (with
 * buffers of their own), both queued before either is waited for, so that (with
 * STRAGGLAR_MIN_BYTES between their sizes) calls forwarded to NCCL and calls on StragglAR
 * interleave across streams. */
static int run_pairs(int rank, int nranks, ncclComm_t comm) {
  CUstream streams[2];
  CUdeviceptr send[2], recv[2];
  static unsigned char host[2][MAX_COUNT * 8];
  for (int k = 0; k < 2; ++k) {
    CU(cuStreamCreate(&streams[k], CU_STREAM_NON_BLOCKING));
    CU(cuMemAlloc(&send[k], MAX_COUNT * 8));
    CU(cuMemAlloc(&recv[k], MAX_COUNT * 8));
  }
  for (int i = 0; i < CALLS; i += 2) {
    ncclDataType_t t[2];
    ncclRedOp_t op[2];
    size_t count[2];
    for (int k = 0; k < 2; ++k) {
      int c = i + k;
      t[k] = kTypes[c % (sizeof kTypes / sizeof kTypes[0])];
      op[k] = kOps[c % (sizeof kOps / sizeof kOps[0])];
      count[k] = 1 + (size_t)(c * 613) % (MAX_COUNT - 1);
      for (size_t j = 0; j < count[k]; ++j) store(host[k], j, t[k], value(rank, c, (int)j, op[k], t[k]));
      CU(cuMemcpyHtoD(send[k], host[k], count[k] * type_bytes(t[k])));
    }
    for (int k = 0; k < 2; ++k) {
      ncclResult_t nr = ncclAllReduce((const void*)send[k], (void*)recv[k], count[k], t[k], op[k],
                                      comm, streams[k]);
      if (nr != ncclSuccess) {
        printf("rank %d: error at call %d: %s\n", rank, i + k, ncclGetErrorString(nr));
        return 3;
      }
    }
    for (int k = 0; k < 2; ++k) CU(cuStreamSynchronize(streams[k]));
    for (int k = 0; k < 2; ++k) {
      CU(cuMemcpyDtoH(host[k], recv[k], count[k] * type_bytes(t[k])));
      for (size_t j = 0; j < count[k]; ++j) {
        long long want = expected(nranks, i + k, (int)j, op[k], t[k]), got = load(host[k], j, t[k]);
        if (got != want) {
          printf("rank %d: call %d: element %zu is %lld, not %lld\n", rank, i + k, j, got, want);
          return 4;
        }
      }
    }
  }
  print_stats(rank, comm);
  /* LOOPBACK_NO_DESTROY: the process exits with its communicator alive, as scripts that never
   * destroy their process group do. */
  if (!getenv("LOOPBACK_NO_DESTROY")) ncclCommDestroy(comm);
  printf("rank %d: %d calls checked\n", rank, CALLS);
  return 0;
}

/* Checks the 4099 float sums of `out` (every rank's input `rank + j % 5 + shift`): 0 if right. */
static int check_sums(int rank, int nranks, CUdeviceptr out, int shift, int call, const char* what) {
  static float host[4099];
  CU(cuMemcpyDtoH(host, out, sizeof host));
  for (int j = 0; j < 4099; ++j) {
    float want = (float)(nranks * (nranks - 1) / 2 + nranks * (j % 5 + shift));
    if (host[j] != want) {
      printf("rank %d: call %d (%s): element %d is %g, not %g\n", rank, call, what, j, host[j], want);
      return 4;
    }
  }
  return 0;
}

/* LOOPBACK_REPLAYS=N: LOOPBACK_WARMUP (default 3) eager calls, then one call (4099 floats, sum)
 * captured into a graph and replayed N times, every result checked. With LOOPBACK_LATE_RANK=A,B
 * rank A sleeps LOOPBACK_LATE_US before each warm-up call and the first half of the replays,
 * rank B before the second half. */
static int run_replays(int rank, int nranks, ncclComm_t comm, CUstream stream, CUdeviceptr send,
                       CUdeviceptr recv, int replays) {
  static float host[4099];
  const char* late = getenv("LOOPBACK_LATE_RANK");
  int late_first = late ? atoi(late) : -1;
  int late_second = late && strchr(late, ',') ? atoi(strchr(late, ',') + 1) : late_first;
  const long late_us = getenv("LOOPBACK_LATE_US") ? atol(getenv("LOOPBACK_LATE_US")) : 0;
  const int warmup = getenv("LOOPBACK_WARMUP") ? atoi(getenv("LOOPBACK_WARMUP")) : 3;
  for (int j = 0; j < 4099; ++j) host[j] = (float)(rank + j % 5);
  CU(cuMemcpyHtoD(send, host, sizeof host));
  CUgraph graph;
  CUgraphExec exec;
  for (int i = 0; i <= replays + warmup; ++i) {
    if (i == warmup) {
      CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
      ncclResult_t nr = ncclAllReduce((const void*)send, (void*)recv, 4099, ncclFloat32, ncclSum,
                                      comm, stream);
      CU(cuStreamEndCapture(stream, &graph));
      CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
      if (nr != ncclSuccess) return 3;
      continue;
    }
    int late_now = i - warmup - 1 < replays / 2 ? late_first : late_second;
    if (rank == late_now) {
      struct timespec t = {late_us / 1000000, (late_us % 1000000) * 1000};
      nanosleep(&t, NULL);
    }
    CU(cuMemsetD32(recv, 0, 4099));
    if (i < warmup) {
      if (ncclAllReduce((const void*)send, (void*)recv, 4099, ncclFloat32, ncclSum, comm,
                        stream) != ncclSuccess)
        return 3;
    } else {
      CU(cuGraphLaunch(exec, stream));
    }
    CU(cuStreamSynchronize(stream));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess) {
      printf("rank %d: error at call %d: %s\n", rank, i, ncclGetErrorString(async));
      return 3;
    }
    int bad = check_sums(rank, nranks, recv, 0, i, i < warmup ? "eager" : "replay");
    if (bad) return bad;
  }
  cuGraphExecDestroy(exec);
  cuGraphDestroy(graph);
  print_stats(rank, comm);
  ncclCommDestroy(comm);
  printf("rank %d: %d replays checked\n", rank, replays);
  return 0;
}

/* LOOPBACK_CAPTURE_BESIDE: while a second thread of the rank holds a capture begun in the
 * global mode (PyTorch's default) on a stream of its own, the main thread makes the rank's first
 * three calls (4099 float sums) eagerly, so the engine sets up beside the capture; each call is
 * waited for through a host function, since a synchronisation would itself be refused beside
 * the capture. The capture must end whole (the engine's set-up made no call that invalidates
 * it) and its graph, a memset, must run; then every result is checked. */
struct beside {
  CUcontext ctx;
  CUdeviceptr scratch;
  volatile int phase; /* 1: capturing, 2: the calls are done, 3: ended */
  CUresult ended;
};

static void* capture_beside(void* arg) {
  struct beside* b = arg;
  CUstream side;
  CUgraph graph = NULL;
  cuCtxSetCurrent(b->ctx);
  cuStreamCreate(&side, CU_STREAM_NON_BLOCKING);
  CUresult r = cuStreamBeginCapture(side, CU_STREAM_CAPTURE_MODE_GLOBAL);
  if (r == CUDA_SUCCESS) r = cuMemsetD32Async(b->scratch, 7, 16, side);
  __atomic_store_n(&b->phase, 1, __ATOMIC_RELEASE);
  while (__atomic_load_n(&b->phase, __ATOMIC_ACQUIRE) != 2) sched_yield();
  CUresult end = cuStreamEndCapture(side, &graph);
  if (r == CUDA_SUCCESS) r = end;
  if (r == CUDA_SUCCESS) {
    CUgraphExec exec;
    r = cuGraphInstantiateWithFlags(&exec, graph, 0);
    if (r == CUDA_SUCCESS) r = cuGraphLaunch(exec, side);
    if (r == CUDA_SUCCESS) r = cuStreamSynchronize(side);
    if (r == CUDA_SUCCESS) cuGraphExecDestroy(exec);
  }
  if (graph) cuGraphDestroy(graph);
  cuStreamDestroy(side);
  b->ended = r;
  __atomic_store_n(&b->phase, 3, __ATOMIC_RELEASE);
  return NULL;
}

static void CUDA_CB mark_done(void* flag) { __atomic_store_n((volatile int*)flag, 1, __ATOMIC_RELEASE); }

static int run_capture_beside(int rank, int nranks, ncclComm_t comm, CUcontext ctx, CUstream stream,
                              CUdeviceptr send, CUdeviceptr recv) {
  static float host[4099];
  struct beside b = {ctx, 0, 0, CUDA_SUCCESS};
  CU(cuMemAlloc(&b.scratch, 64));
  for (int j = 0; j < 4099; ++j) host[j] = (float)(rank + j % 5);
  CU(cuMemcpyHtoD(send, host, sizeof host));
  pthread_t t;
  pthread_create(&t, NULL, capture_beside, &b);
  while (__atomic_load_n(&b.phase, __ATOMIC_ACQUIRE) != 1) sched_yield();
  for (int i = 0; i < 3; ++i) {
    ncclResult_t nr = ncclAllReduce((const void*)send, (void*)recv, 4099, ncclFloat32, ncclSum,
                                    comm, stream);
    if (nr != ncclSuccess) {
      printf("rank %d: call %d beside the capture: %s\n", rank, i, ncclGetErrorString(nr));
      __atomic_store_n(&b.phase, 2, __ATOMIC_RELEASE);
      pthread_join(t, NULL);
      return 3;
    }
    volatile int done = 0;
    CU(cuLaunchHostFunc(stream, mark_done, (void*)&done));
    while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) sched_yield();
  }
  __atomic_store_n(&b.phase, 2, __ATOMIC_RELEASE);
  pthread_join(t, NULL);
  if (b.ended != CUDA_SUCCESS) {
    const char* name = "?";
    cuGetErrorName(b.ended, &name);
    printf("rank %d: the capture beside the first calls ended with %s\n", rank, name);
    return 3;
  }
  int bad = check_sums(rank, nranks, recv, 0, 2, "beside a capture");
  if (bad) return bad;
  print_stats(rank, comm);
  ncclCommDestroy(comm);
  printf("rank %d: capture beside the first calls whole\n", rank);
  return 0;
}

/* LOOPBACK_GROW=N: float sums of 4 KiB, 1.5 MiB, 1 MiB, 3 MiB, 7 MiB and 5 MiB, in that order
 * (the arenas of a job's communicator grow at the calls that need them), the first N eager and
 * each later one captured into a graph of its own and launched once; every element checked:
 * rank r's element j is (r + j % 9 - 4), exact in float. Rank `kill_rank` dies before call
 * `kill_at`; the others report the call that failed. */
static int run_growing(int rank, int nranks, ncclComm_t comm, CUstream stream, int eager,
                       int kill_rank, int kill_at) {
  static const size_t kBytes[] = {4 << 10, 3 << 19, 1 << 20, 3 << 20, 7 << 20, 5 << 20};
  enum { MOST = 7 << 20 };
  float* host = malloc(MOST);
  CUdeviceptr send, recv;
  if (!host || cuMemAlloc(&send, MOST) || cuMemAlloc(&recv, MOST)) return 2;
  const int calls = (int)(sizeof kBytes / sizeof kBytes[0]);
  for (int i = 0; i < calls; ++i) {
    if (rank == kill_rank && i == kill_at) raise(SIGKILL);
    size_t count = kBytes[i] / sizeof(float);
    for (size_t j = 0; j < count; ++j) host[j] = (float)(rank + (int)(j % 9) - 4);
    CU(cuMemcpyHtoD(send, host, count * sizeof(float)));
    CU(cuMemsetD32(recv, 0, count));
    CUgraph graph;
    CUgraphExec exec;
    if (i >= eager) CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ncclResult_t nr = ncclAllReduce((const void*)send, (void*)recv, count, ncclFloat32, ncclSum,
                                    comm, stream);
    if (i >= eager) {
      CU(cuStreamEndCapture(stream, &graph));
      CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
      CU(cuGraphLaunch(exec, stream));
    }
    CUresult cr = nr == ncclSuccess ? cuStreamSynchronize(stream) : CUDA_SUCCESS;
    if (nr != ncclSuccess || cr != CUDA_SUCCESS) {
      printf("rank %d: error at call %d: %s\n", rank, i,
             nr != ncclSuccess ? ncclGetErrorString(nr) : "the stream failed");
      ncclCommAbort(comm);
      return 3;
    }
    if (i >= eager) {
      CU(cuGraphExecDestroy(exec));
      CU(cuGraphDestroy(graph));
    }
    CU(cuMemcpyDtoH(host, recv, count * sizeof(float)));
    for (size_t j = 0; j < count; ++j) {
      float want = (float)(nranks * (nranks - 1) / 2 + nranks * ((int)(j % 9) - 4));
      if (host[j] != want) {
        printf("rank %d: call %d (%zu floats): element %zu is %g, not %g\n", rank, i, count, j,
               host[j], want);
        return 4;
      }
    }
  }
  print_stats(rank, comm);
  ncclCommDestroy(comm);
  printf("rank %d: %d growing calls checked\n", rank, calls);
  return 0;
}

/* LOOPBACK_MIXED=N: N rounds of an eager call on one stream, not waited for, then a replay of a
 * captured call on another stream, both on buffers of their own, then both streams drained and
 * both results checked; rank 1 comes LOOPBACK_LATE_US late to each eager call, so that the
 * replay is queued while the eager call still waits for it. */
static int run_mixed(int rank, int nranks, ncclComm_t comm, int rounds) {
  static float host[4099];
  const long late_us = getenv("LOOPBACK_LATE_US") ? atol(getenv("LOOPBACK_LATE_US")) : 2000;
  CUstream eager, replay;
  CUdeviceptr buf[4]; /* eager in, eager out, graph in, graph out */
  CU(cuStreamCreate(&eager, CU_STREAM_NON_BLOCKING));
  CU(cuStreamCreate(&replay, CU_STREAM_NON_BLOCKING));
  for (int k = 0; k < 4; ++k) CU(cuMemAlloc(&buf[k], sizeof host));
  for (int k = 0; k < 2; ++k) {
    for (int j = 0; j < 4099; ++j) host[j] = (float)(rank + j % 5 + k);
    CU(cuMemcpyHtoD(buf[2 * k], host, sizeof host));
  }
  /* Warm-up on the eager stream (the engine sets up on an eager call), then the capture. */
  for (int i = 0; i < 3; ++i) {
    if (ncclAllReduce((const void*)buf[0], (void*)buf[1], 4099, ncclFloat32, ncclSum, comm, eager) !=
        ncclSuccess)
      return 3;
    CU(cuStreamSynchronize(eager));
  }
  CUgraph graph;
  CUgraphExec exec;
  CU(cuStreamBeginCapture(replay, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ncclResult_t nr = ncclAllReduce((const void*)buf[2], (void*)buf[3], 4099, ncclFloat32, ncclSum,
                                  comm, replay);
  CU(cuStreamEndCapture(replay, &graph));
  if (nr != ncclSuccess) return 3;
  CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  for (int i = 0; i < rounds; ++i) {
    CU(cuMemsetD32(buf[1], 0, 4099));
    CU(cuMemsetD32(buf[3], 0, 4099));
    if (rank == 1) {
      struct timespec t = {late_us / 1000000, (late_us % 1000000) * 1000};
      nanosleep(&t, NULL);
    }
    if (ncclAllReduce((const void*)buf[0], (void*)buf[1], 4099, ncclFloat32, ncclSum, comm, eager) !=
        ncclSuccess)
      return 3;
    CU(cuGraphLaunch(exec, replay));
    CU(cuStreamSynchronize(eager));
    CU(cuStreamSynchronize(replay));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess) {
      printf("rank %d: error at round %d: %s\n", rank, i, ncclGetErrorString(async));
      return 3;
    }
    int bad = check_sums(rank, nranks, buf[1], 0, i, "eager");
    if (!bad) bad = check_sums(rank, nranks, buf[3], 1, i, "replay");
    if (bad) return bad;
  }
  cuGraphExecDestroy(exec);
  cuGraphDestroy(graph);
  print_stats(rank, comm);
  ncclCommDestroy(comm);
  printf("rank %d: %d mixed rounds checked\n", rank, rounds);
  return 0;
}

/* LOOPBACK_TWO_COMMS=1|2: a second communicator over the same ranks (its id broadcast over the
 * first), and CALLS calls on each: with 1, one thread alternates between them on one stream;
 * with 2, each has a thread and a stream of its own. */
struct comm_worker {
  int rank, nranks, which, calls;
  ncclComm_t comm;
  CUcontext ctx;
  CUstream stream; /* shared in the one-thread mode */
  int result;
};

static int comm_call(struct comm_worker* w, int i, CUdeviceptr send, CUdeviceptr recv,
                     unsigned char* host) {
  int rank = w->rank;
  int call = 2 * i + w->which; /* different data on the two communicators */
  ncclDataType_t t = kTypes[call % (sizeof kTypes / sizeof kTypes[0])];
  ncclRedOp_t op = kOps[call % (sizeof kOps / sizeof kOps[0])];
  size_t count = 1 + (size_t)(call * 613) % (MAX_COUNT - 1);
  for (size_t j = 0; j < count; ++j) store(host, j, t, value(rank, call, (int)j, op, t));
  CU(cuMemcpyHtoD(send, host, count * type_bytes(t)));
  ncclResult_t nr = ncclAllReduce((const void*)send, (void*)recv, count, t, op, w->comm, w->stream);
  CU(cuStreamSynchronize(w->stream));
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(w->comm, &async);
  if (nr != ncclSuccess || async != ncclSuccess) {
    printf("rank %d: communicator %d: error at call %d\n", rank, w->which, i);
    return 3;
  }
  CU(cuMemcpyDtoH(host, recv, count * type_bytes(t)));
  for (size_t j = 0; j < count; ++j) {
    long long want = expected(w->nranks, call, (int)j, op, t), got = load(host, j, t);
    if (got != want) {
      printf("rank %d: communicator %d: call %d: element %zu is %lld, not %lld\n", rank, w->which,
             i, j, got, want);
      return 4;
    }
  }
  return 0;
}

static void* comm_thread(void* arg) {
  struct comm_worker* w = arg;
  int rank = w->rank;
  CUdeviceptr send, recv;
  unsigned char* host = malloc(MAX_COUNT * 8);
  w->result = 1;
  if (cuCtxSetCurrent(w->ctx) || cuStreamCreate(&w->stream, CU_STREAM_NON_BLOCKING) ||
      cuMemAlloc(&send, MAX_COUNT * 8) || cuMemAlloc(&recv, MAX_COUNT * 8)) {
    fprintf(stderr, "rank %d: thread setup failed\n", rank);
    free(host);
    return NULL;
  }
  w->result = 0;
  for (int i = 0; i < w->calls && w->result == 0; ++i) w->result = comm_call(w, i, send, recv, host);
  free(host);
  return NULL;
}

static int run_two_comms(int rank, int nranks, ncclComm_t first, CUcontext ctx, CUstream stream,
                         CUdeviceptr send, CUdeviceptr recv, int threads) {
  ncclUniqueId id;
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) return 1;
  CU(cuMemcpyHtoD(send, &id, sizeof id));
  if (ncclBroadcast((const void*)send, (void*)send, sizeof id, ncclInt8, 0, first, stream) !=
      ncclSuccess)
    return 1;
  CU(cuStreamSynchronize(stream));
  CU(cuMemcpyDtoH(&id, send, sizeof id));
  ncclComm_t second;
  ncclResult_t nr = ncclCommInitRank(&second, nranks, id, rank);
  if (nr != ncclSuccess) {
    fprintf(stderr, "rank %d: second ncclCommInitRank: %s\n", rank, ncclGetErrorString(nr));
    return 1;
  }
  struct comm_worker w[2] = {{rank, nranks, 0, CALLS, first, ctx, stream, 0},
                             {rank, nranks, 1, CALLS, second, ctx, stream, 0}};
  if (threads == 2) {
    pthread_t t[2];
    for (int k = 0; k < 2; ++k) pthread_create(&t[k], NULL, comm_thread, &w[k]);
    for (int k = 0; k < 2; ++k) pthread_join(t[k], NULL);
  } else {
    static unsigned char host[MAX_COUNT * 8];
    for (int i = 0; i < CALLS; ++i)
      for (int k = 0; k < 2 && w[0].result == 0 && w[1].result == 0; ++k)
        w[k].result = comm_call(&w[k], i, send, recv, host);
  }
  for (int k = 0; k < 2; ++k)
    if (w[k].result != 0) return w[k].result;
  for (int k = 0; k < 2; ++k) {
    stragglarStats_t stats;
    if (stragglarGetStats && stragglarGetStats(w[k].comm, &stats) == ncclSuccess)
      printf("rank %d: communicator %d: %llu on StragglAR, %llu on NCCL\n", rank, k,
             (unsigned long long)stats.onStragglar, (unsigned long long)stats.onNccl);
    ncclCommDestroy(w[k].comm);
  }
  printf("rank %d: %d calls checked on each of 2 communicators (%d thread%s)\n", rank, CALLS,
         threads, threads == 2 ? "s" : "");
  return 0;
}

/* LOOPBACK_COLLECTIVES: 99 calls of float sums cycling AllReduce, ReduceScatter and AllGather
 * (FSDP's collectives), 1000 elements per rank, every element checked; LOOPBACK_LATE_RANK and
 * LOOPBACK_LATE_US hold a rank back before every call as in the main loop. */
static int run_collectives(int rank, int nranks, ncclComm_t comm, CUstream stream,
                           CUdeviceptr send, CUdeviceptr recv) {
  enum { PER_RANK = 1000, ROUNDS = 99 };
  static float host[MAX_COUNT * 2];
  if ((size_t)PER_RANK * nranks > MAX_COUNT * 2) return 2;
  const char* late = getenv("LOOPBACK_LATE_RANK");
  const int late_rank = late ? atoi(late) : -1;
  const long late_us = getenv("LOOPBACK_LATE_US") ? atol(getenv("LOOPBACK_LATE_US")) : 0;
  for (int i = 0; i < ROUNDS; ++i) {
    if (rank == late_rank) {
      struct timespec t = {late_us / 1000000, (late_us % 1000000) * 1000};
      nanosleep(&t, NULL);
    }
    const int kind = i % 3; /* 0 AllReduce, 1 ReduceScatter, 2 AllGather */
    const size_t in = kind == 1 ? (size_t)PER_RANK * nranks : PER_RANK;
    const size_t out = kind == 2 ? (size_t)PER_RANK * nranks : PER_RANK;
    for (size_t j = 0; j < in; ++j) host[j] = (float)value(rank, i, (int)j, ncclSum, ncclFloat32);
    CU(cuMemcpyHtoD(send, host, in * sizeof(float)));
    /* LOOPBACK_GROUPS: each call inside its own ncclGroupStart/End, with an AllReduce of the
     * first PER_RANK inputs into `recv` past the largest output (an AllGather's), 16-byte
     * aligned. */
    const int grouped = getenv("LOOPBACK_GROUPS") != NULL;
    const size_t beside_at = ((size_t)PER_RANK * nranks * sizeof(float) + 15) / 16 * 16;
    if (grouped && beside_at + PER_RANK * sizeof(float) > (size_t)MAX_COUNT * 8) return 2;
    const CUdeviceptr beside = recv + (CUdeviceptr)beside_at;
    if (grouped) ncclGroupStart();
    ncclResult_t nr =
        kind == 0 ? ncclAllReduce((const void*)send, (void*)recv, PER_RANK, ncclFloat32, ncclSum,
                                  comm, stream)
        : kind == 1 ? ncclReduceScatter((const void*)send, (void*)recv, PER_RANK, ncclFloat32,
                                        ncclSum, comm, stream)
                    : ncclAllGather((const void*)send, (void*)recv, PER_RANK, ncclFloat32, comm,
                                    stream);
    if (grouped) {
      ncclResult_t also = ncclAllReduce((const void*)send, (void*)beside, PER_RANK, ncclFloat32,
                                        ncclSum, comm, stream);
      ncclResult_t end = ncclGroupEnd();
      if (nr == ncclSuccess) nr = also;
      if (nr == ncclSuccess) nr = end;
    }
    if (nr != ncclSuccess || cuStreamSynchronize(stream) != CUDA_SUCCESS) {
      printf("rank %d: error at call %d: %s\n", rank, i, ncclGetErrorString(nr));
      return 3;
    }
    if (grouped) {
      CU(cuMemcpyDtoH(host, beside, PER_RANK * sizeof(float)));
      for (size_t j = 0; j < PER_RANK; ++j) {
        long long want = expected(nranks, i, (int)j, ncclSum, ncclFloat32);
        if ((long long)host[j] != want) {
          printf("rank %d: call %d (the grouped AllReduce): element %zu is %lld, not %lld\n",
                 rank, i, j, (long long)host[j], want);
          return 4;
        }
      }
    }
    CU(cuMemcpyDtoH(host, recv, out * sizeof(float)));
    for (size_t j = 0; j < out; ++j) {
      long long want =
          kind == 0   ? expected(nranks, i, (int)j, ncclSum, ncclFloat32)
          : kind == 1 ? expected(nranks, i, (int)((size_t)rank * PER_RANK + j), ncclSum, ncclFloat32)
                      : value((int)(j / PER_RANK), i, (int)(j % PER_RANK), ncclSum, ncclFloat32);
      if ((long long)host[j] != want) {
        printf("rank %d: call %d (kind %d): element %zu is %lld, not %lld\n", rank, i, kind, j,
               (long long)host[j], want);
        return 4;
      }
    }
  }
  ncclCommDestroy(comm);
  printf("rank %d: %d calls checked\n", rank, ROUNDS);
  return 0;
}

/* LOOPBACK_BUSY=BLOCKS:US[:K]: a kernel of the application's own holding BLOCKS multiprocessors
 * for US microseconds, launched on a stream of its own just before each eager call, or only
 * before call K (PTX, so a real
 * GPU compiles it too; the emulated driver binds the entry to its delay kernel, which holds a
 * multiprocessor per block while it runs). */
static const char kBusyPtx[] =
    ".version 6.0\n.target sm_60\n.address_size 64\n"
    ".visible .entry ncclStragglarDelay(.param .u64 ns)\n{\n"
    "  .reg .u64 %rd<5>;\n  .reg .pred %p;\n"
    "  ld.param.u64 %rd1, [ns];\n  mov.u64 %rd2, %globaltimer;\n"
    "WAIT:\n  mov.u64 %rd3, %globaltimer;\n  sub.u64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p, %rd4, %rd1;\n  @%p bra WAIT;\n  ret;\n}\n";

struct busy {
  CUfunction kernel;
  CUstream stream;
  unsigned blocks;
  unsigned long long ns;
  int once_at; /* the one eager call it precedes, or -1: every one */
};

/* Reads LOOPBACK_BUSY into `b`: 0 when unset, 1 when set and ready, -1 on a bad value. */
static int busy_setup(struct busy* b) {
  const char* v = getenv("LOOPBACK_BUSY");
  if (!v) return 0;
  unsigned long long us = 0;
  b->once_at = -1;
  const int fields = sscanf(v, "%u:%llu:%d", &b->blocks, &us, &b->once_at);
  if (fields < 2 || b->blocks == 0 || (fields == 3 && b->once_at < 0)) return -1;
  b->ns = us * 1000;
  CUmodule module;
  if (cuModuleLoadData(&module, kBusyPtx) != CUDA_SUCCESS ||
      cuModuleGetFunction(&b->kernel, module, "ncclStragglarDelay") != CUDA_SUCCESS ||
      cuStreamCreate(&b->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
    return -1;
  return 1;
}

static CUresult busy_launch(struct busy* b) {
  void* params[] = {&b->ns};
  return cuLaunchKernel(b->kernel, b->blocks, 1, 1, 32, 1, 1, 0, b->stream, params, NULL);
}

/* Host time of each eager ncclAllReduce call (the call alone: the stream is drained after it,
 * untimed), for LOOPBACK_HOST_TIMES; the stream time of each (between events recorded on the
 * stream just before and just after it), for LOOPBACK_STREAM_TIMES. */
enum { MAX_TIMED = 100000 };
static long long host_ns[MAX_TIMED];
static long long stream_ns[MAX_TIMED];

static int by_value(const void* a, const void* b) {
  long long x = *(const long long*)a, y = *(const long long*)b;
  return (x > y) - (x < y);
}

/* LOOPBACK_HOST_TIMES and LOOPBACK_STREAM_TIMES: the median and 90th percentile of the
 * (`what`: host or stream) time per call, leaving out the first 8 calls (the engine's setup
 * runs in the first). */
static void print_times(int rank, const char* what, long long* ns, int calls) {
  int n = (calls < MAX_TIMED ? calls : MAX_TIMED) - 8;
  if (n < 1) return;
  qsort(ns + 8, (size_t)n, sizeof *ns, by_value);
  printf("rank %d: %s time per call over %d calls: median %lld ns, p90 %lld ns\n", rank, what,
         n, ns[8 + n / 2], ns[8 + n * 9 / 10]);
}

static int run_rank(int rank, int nranks, const char* hex, int kill_rank, int kill_at) {
  ncclUniqueId id;
  for (size_t i = 0; i < sizeof id; ++i) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 2;
    id.internal[i] = (char)v;
  }
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  CUdeviceptr send, recv;
  CU(cuInit(0));
  /* LOOPBACK_DEVICE: every rank on that device (ranks sharing one GPU), else rank r on r. */
  const char* on = getenv("LOOPBACK_DEVICE");
  CU(cuDeviceGet(&dev, on ? atoi(on) : rank));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CU(cuMemAlloc(&send, MAX_COUNT * 8));
  CU(cuMemAlloc(&recv, MAX_COUNT * 8));
  if (getenv("LOOPBACK_CYCLES"))
    return run_cycles(rank, nranks, id, atoi(getenv("LOOPBACK_CYCLES")), stream, send, recv);
  ncclComm_t comm;
  ncclResult_t nr;
  if (getenv("LOOPBACK_NONBLOCKING")) {
    /* A nonblocking communicator: in progress until ncclCommGetAsyncError says success. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    nr = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
    if (nr != ncclInProgress && nr != ncclSuccess) {
      fprintf(stderr, "rank %d: ncclCommInitRankConfig: %s\n", rank, ncclGetErrorString(nr));
      return 1;
    }
    do {
      ncclCommGetAsyncError(comm, &nr);
    } while (nr == ncclInProgress);
  } else {
    nr = ncclCommInitRank(&comm, nranks, id, rank);
  }
  if (nr != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclCommInitRank: %s\n", rank, ncclGetErrorString(nr));
    return 1;
  }
  if (getenv("LOOPBACK_SPLIT")) {
    /* Two communicators split from this one: the even ranks and the odd ones, each running the
     * collectives' cycle (LOOPBACK_LATE_RANK then names a rank of the split communicator). */
    ncclComm_t sub = NULL;
    nr = ncclCommSplit(comm, rank % 2, rank, &sub, NULL);
    if (nr != ncclSuccess || !sub) {
      fprintf(stderr, "rank %d: ncclCommSplit: %s\n", rank, ncclGetErrorString(nr));
      return 1;
    }
    return run_collectives(rank / 2, (nranks + 1 - rank % 2) / 2, sub, stream, send, recv);
  }
  if (getenv("LOOPBACK_COLLECTIVES")) return run_collectives(rank, nranks, comm, stream, send, recv);
  if (getenv("LOOPBACK_TWO_STREAMS")) return run_pairs(rank, nranks, comm);
  if (getenv("LOOPBACK_TWO_COMMS"))
    return run_two_comms(rank, nranks, comm, ctx, stream, send, recv,
                         atoi(getenv("LOOPBACK_TWO_COMMS")));
  if (getenv("LOOPBACK_GROW"))
    return run_growing(rank, nranks, comm, stream, atoi(getenv("LOOPBACK_GROW")), kill_rank,
                       kill_at);
  if (getenv("LOOPBACK_MIXED")) return run_mixed(rank, nranks, comm, atoi(getenv("LOOPBACK_MIXED")));
  if (getenv("LOOPBACK_CAPTURE_BESIDE"))
    return run_capture_beside(rank, nranks, comm, ctx, stream, send, recv);
  if (getenv("LOOPBACK_REPLAYS"))
    return run_replays(rank, nranks, comm, stream, send, recv, atoi(getenv("LOOPBACK_REPLAYS")));
  static unsigned char host[MAX_COUNT * 8];
  const int graphs = getenv("LOOPBACK_GRAPHS") != NULL;
  const int stream_times = getenv("LOOPBACK_STREAM_TIMES") != NULL;
  struct busy busy;
  const int busy_on = busy_setup(&busy);
  if (busy_on < 0) {
    fprintf(stderr, "rank %d: LOOPBACK_BUSY=BLOCKS:US[:K] could not be set up\n", rank);
    return 2;
  }
  CUevent marks[2];
  if (stream_times) {
    CU(cuEventCreate(&marks[0], CU_EVENT_DEFAULT));
    CU(cuEventCreate(&marks[1], CU_EVENT_DEFAULT));
  }
  const long abort_after_ms = getenv("LOOPBACK_ABORT_AFTER_MS") ? atol(getenv("LOOPBACK_ABORT_AFTER_MS")) : 0;
  const int fixed = getenv("LOOPBACK_FIXED") != NULL;
  const char* late = getenv("LOOPBACK_LATE_RANK");
  const int late_first = late ? atoi(late) : -1;
  const int late_second = late && strchr(late, ',') ? atoi(strchr(late, ',') + 1) : late_first;
  const long late_us = getenv("LOOPBACK_LATE_US") ? atol(getenv("LOOPBACK_LATE_US")) : 0;
  for (int i = 0; i < CALLS; ++i) {
    if (rank == kill_rank && i == kill_at) raise(SIGKILL);
    if (rank == (i < CALLS / 2 ? late_first : late_second)) {
      /* Held back on the host before every call: this rank's launches come late. */
      struct timespec t = {late_us / 1000000, (late_us % 1000000) * 1000};
      nanosleep(&t, NULL);
    }
    ncclDataType_t t = fixed ? ncclFloat32 : kTypes[i % (sizeof kTypes / sizeof kTypes[0])];
    ncclRedOp_t op = fixed ? ncclSum : kOps[i % (sizeof kOps / sizeof kOps[0])];
    size_t count = fixed ? 4099 : 1 + (size_t)(i * 613) % (MAX_COUNT - 1);
    int in_place = i % 3 == 0;
    for (size_t j = 0; j < count; ++j) store(host, j, t, value(rank, i, (int)j, op, t));
    CU(cuMemcpyHtoD(send, host, count * type_bytes(t)));
    CUdeviceptr out = in_place && !graphs ? send : recv;
    CUresult cr = CUDA_SUCCESS;
    if (graphs && i >= 3) {
      /* Captured once, replayed twice: a replay recomputes the same result. (The first calls
       * run eagerly, as a job's warm-up does: the engine sets up on an eager call.) */
      CUgraph graph;
      CUgraphExec exec;
      CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
      nr = ncclAllReduce((const void*)send, (void*)out, count, t, op, comm, stream);
      CU(cuStreamEndCapture(stream, &graph));
      CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
      for (int replay = 0; replay < 2 && cr == CUDA_SUCCESS; ++replay) {
        cr = cuGraphLaunch(exec, stream);
        if (cr == CUDA_SUCCESS) cr = cuStreamSynchronize(stream);
      }
      cuGraphExecDestroy(exec);
      cuGraphDestroy(graph);
    } else {
      struct timespec before, after;
      if (busy_on && (busy.once_at < 0 || busy.once_at == i)) CU(busy_launch(&busy));
      if (stream_times) CU(cuEventRecord(marks[0], stream));
      clock_gettime(CLOCK_MONOTONIC, &before);
      nr = ncclAllReduce((const void*)send, (void*)out, count, t, op, comm, stream);
      clock_gettime(CLOCK_MONOTONIC, &after);
      if (stream_times) CU(cuEventRecord(marks[1], stream));
      if (i < MAX_TIMED)
        host_ns[i] = (after.tv_sec - before.tv_sec) * 1000000000LL + (after.tv_nsec - before.tv_nsec);
      /* The watchdog watches the call a killed peer never joins (and those after it), not a
       * first call that a loaded machine may make slow. */
      cr = drain(stream, comm, kill_rank >= 0 && i < kill_at ? 0 : abort_after_ms, rank, i);
      float ms = 0;
      if (stream_times && cr == CUDA_SUCCESS && i < MAX_TIMED &&
          cuEventElapsedTime(&ms, marks[0], marks[1]) == CUDA_SUCCESS)
        stream_ns[i] = (long long)(ms * 1e6);
    }
    if (cr == CUDA_ERROR_LAUNCH_TIMEOUT) {
      printf("rank %d: error at call %d: aborted\n", rank, i);
      return 3;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (nr != ncclSuccess || cr != CUDA_SUCCESS || async != ncclSuccess) {
      printf("rank %d: error at call %d: %s\n", rank, i,
             ncclGetErrorString(nr != ncclSuccess ? nr : async));
      if (getenv("LOOPBACK_DESTROY_ON_ERROR"))
        ncclCommDestroy(comm);
      else
        ncclCommAbort(comm);
      return 3;
    }
    CU(cuMemcpyDtoH(host, out, count * type_bytes(t)));
    for (size_t j = 0; j < count; ++j) {
      long long want = expected(nranks, i, (int)j, op, t), got = load(host, j, t);
      if (got != want) {
        printf("rank %d: call %d (type %d, op %d, %zu elements): element %zu is %lld, not %lld\n",
               rank, i, (int)t, (int)op, count, j, got, want);
        return 4;
      }
    }
  }
  print_stats(rank, comm);
  if (getenv("LOOPBACK_HOST_TIMES") && !graphs) print_times(rank, "host", host_ns, CALLS);
  if (stream_times && !graphs) print_times(rank, "stream", stream_ns, CALLS);
  /* LOOPBACK_NO_DESTROY: the process exits with its communicator alive, as scripts that never
   * destroy their process group do. */
  if (!getenv("LOOPBACK_NO_DESTROY")) ncclCommDestroy(comm);
  printf("rank %d: %d calls checked\n", rank, CALLS);
  return 0;
}

/* Rank r's environment: this process's, with LOOPBACK_ENV_<r>=NAME=VALUE (if set) replacing or
 * adding NAME. The array is malloc'd; its strings are not. */
static char** rank_environment(int r) {
  char key[32];
  snprintf(key, sizeof key, "LOOPBACK_ENV_%d", r);
  const char* extra = getenv(key);
  size_t n = 0;
  while (environ[n]) ++n;
  char** env = calloc(n + 2, sizeof(char*));
  size_t out = 0;
  size_t name_len = extra && strchr(extra, '=') ? (size_t)(strchr(extra, '=') - extra) : 0;
  for (size_t i = 0; i < n; ++i) {
    if (name_len && strncmp(environ[i], extra, name_len + 1) == 0) continue;
    env[out++] = environ[i];
  }
  if (name_len) env[out++] = (char*)extra;
  return env;
}

/* LOOPBACK_HOSTNAME (set for one rank through LOOPBACK_ENV_<r>): the rank runs in a UTS
 * namespace of its own under that host name, as a rank of another host would (needs the
 * privilege to make one: the test checks with `unshare -u` first). */
static int take_hostname(void) {
  const char* name = getenv("LOOPBACK_HOSTNAME");
  if (!name) return 0;
  if (unshare(CLONE_NEWUTS) != 0 || sethostname(name, strlen(name)) != 0) {
    perror("LOOPBACK_HOSTNAME");
    return -1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (getenv("LOOPBACK_CALLS")) CALLS = atoi(getenv("LOOPBACK_CALLS"));
  if (argc == 7 && strcmp(argv[1], "--rank") == 0 && take_hostname() != 0) return 5;
  if (argc == 7 && strcmp(argv[1], "--rank") == 0)
    return run_rank(atoi(argv[2]), atoi(argv[3]), argv[4], atoi(argv[5]), atoi(argv[6]));
  if (argc != 2 && argc != 4) {
    fprintf(stderr, "usage: loopback_ranks NRANKS [KILL_RANK KILL_AT]\n");
    return 2;
  }
  int nranks = atoi(argv[1]);
  const char* kill_rank = argc == 4 ? argv[2] : "-1";
  const char* kill_at = argc == 4 ? argv[3] : "-1";
  ncclUniqueId id;
  ncclResult_t nr = ncclGetUniqueId(&id);
  if (nr != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetErrorString(nr));
    return 1;
  }
  char hex[2 * sizeof id + 1];
  for (size_t i = 0; i < sizeof id; ++i) sprintf(hex + 2 * i, "%02x", (unsigned char)id.internal[i]);
  pid_t pids[64];
  for (int r = 0; r < nranks; ++r) {
    char rank[16], n[16];
    snprintf(rank, sizeof rank, "%d", r);
    snprintf(n, sizeof n, "%d", nranks);
    char* args[] = {argv[0], "--rank", rank, n, hex, (char*)kill_rank, (char*)kill_at, NULL};
    char** env = rank_environment(r);
    int spawned = posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, args, env);
    free(env);
    if (spawned != 0) return 1;
  }
  int ok = 1;
  for (int r = 0; r < nranks; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    int want_killed = r == atoi(kill_rank);
    int expect_code = atoi(kill_rank) >= 0 ? 3 : 0;
    if (want_killed) {
      if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) ok = 0;
      printf("rank %d: killed\n", r);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != expect_code) {
      printf("rank %d: ended with status %d, not exit %d\n", r, status, expect_code);
      ok = 0;
    }
  }
  printf(ok ? "every rank ended as expected\n" : "some rank did not end as expected\n");
  return ok ? 0 : 1;
}
