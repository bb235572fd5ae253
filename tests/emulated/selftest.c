/* The driver semantics the GPU engine relies on, checked against whichever libcuda.so.1 the
 * loader finds: the emulated one in CI (scripts/emulated-gpu.sh), the real one in
 * scripts/gpu-check.sh, so the emulation is held to the real driver. Its kernels are given as
 * PTX (ncclStragglarDelay, a spin on %globaltimer; a branch kernel that sets conditional
 * handles, tests/emulated/set_branch.ptx; the probes below), and the emulated driver runs its
 * host build of each. Checks that only the emulation promises (bad handles answer an
 * error, injected faults) run only on the emulated GPU.
 *
 * usage: selftest              (prints one line per check, then "N passed, N failed")
 *        selftest --child HEX  (internal: opens an IPC handle in a second process)
 *        selftest --vmm-child FD BYTES, --multicast-plain-store, --ipc-probe HEX DEVICE
 *                    (internal: see below)
 *        selftest --load-module PATH  (loads one module and says whether the driver took it) */
#include <cuda.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

static const char kDelayPtx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry ncclStragglarDelay(.param .u64 ns)\n"
    "{\n"
    "  .reg .pred p;\n"
    "  .reg .u64 t0, t1, d, n;\n"
    "  .reg .u32 tid;\n"
    "  mov.u32 tid, %tid.x;\n"
    "  setp.ne.u32 p, tid, 0;\n"
    "  @p bra DONE;\n"
    "  ld.param.u64 n, [ns];\n"
    "  mov.u64 t0, %globaltimer;\n"
    "LOOP:\n"
    "  mov.u64 t1, %globaltimer;\n"
    "  sub.u64 d, t1, t0;\n"
    "  setp.lt.u64 p, d, n;\n"
    "  @p bra LOOP;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

/* Writes to the address it is given: 0 makes an illegal address. (The emulated GPU faults it
 * only when STRAGGLAR_EMU_KERNEL_FAULT=ncclStragglarFault@1 says so.) */
static const char kFaultPtx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry ncclStragglarFault(.param .u64 at)\n"
    "{\n"
    "  .reg .u64 p;\n"
    "  ld.param.u64 p, [at];\n"
    "  st.global.u32 [p], 1;\n"
    "  ret;\n"
    "}\n";

/* The multicast probe of the engine (sg_multicast_probe): thread 0 stores {token, rank, ~token,
 * ~rank} through the multicast address, 16 bytes as four f32 lanes, into slot `rank`. */
static const char kMulticastProbePtx[] =
    ".version 8.1\n"
    ".target sm_90\n"
    ".address_size 64\n"
    ".visible .entry ncclStragglarMulticastProbe(.param .align 8 .b8 args[16])\n"
    "{\n"
    "  .reg .pred p;\n"
    "  .reg .u32 tid, token, rank, nt, nr;\n"
    "  .reg .u64 mc, off;\n"
    "  .reg .f32 a, b, c, d;\n"
    "  mov.u32 tid, %tid.x;\n"
    "  setp.ne.u32 p, tid, 0;\n"
    "  @p bra DONE;\n"
    "  ld.param.u64 mc, [args];\n"
    "  ld.param.u32 token, [args+8];\n"
    "  ld.param.u32 rank, [args+12];\n"
    "  not.b32 nt, token;\n"
    "  not.b32 nr, rank;\n"
    "  mul.wide.u32 off, rank, 16;\n"
    "  add.u64 mc, mc, off;\n"
    "  mov.b32 a, token;\n"
    "  mov.b32 b, rank;\n"
    "  mov.b32 c, nt;\n"
    "  mov.b32 d, nr;\n"
    "  multimem.st.relaxed.sys.global.v4.f32 [mc], {a, b, c, d};\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

static int g_passed, g_failed;
static CUfunction g_delay;
static int g_emulated;
static const char* g_self;

#define CHECK(call)                                                                      \
  do {                                                                                   \
    CUresult r_ = (call);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                            \
      const char* n_ = "?";                                                              \
      cuGetErrorName(r_, &n_);                                                           \
      fprintf(stderr, "  %s:%d: %s returned %s\n", __FILE__, __LINE__, #call, n_);       \
      return 0;                                                                          \
    }                                                                                    \
  } while (0)
#define EXPECT(cond)                                                     \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "  %s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      return 0;                                                          \
    }                                                                    \
  } while (0)

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static CUresult delay(CUstream s, uint64_t ms) {
  uint64_t ns = ms * 1000000ull;
  void* args[] = {&ns};
  return cuLaunchKernel(g_delay, 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
}

static void count_up(void* p) { __atomic_add_fetch((int*)p, 1, __ATOMIC_SEQ_CST); }

/* A launch returns before its kernel ends; the stream reports the work pending. */
static int launches_are_asynchronous(void) {
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  double t0 = now_ms();
  CHECK(delay(s, 300));
  double queued = now_ms() - t0;
  EXPECT(queued < 150);
  EXPECT(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
  CHECK(cuStreamSynchronize(s));
  EXPECT(now_ms() - t0 >= 295);
  EXPECT(cuStreamQuery(s) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(s));
  return 1;
}

/* Work on one stream runs in order: a set queued after a delay waits for it. */
static int one_stream_runs_in_order(void) {
  CUstream s;
  int* word;
  CUdeviceptr dword;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemHostAlloc((void**)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostGetDevicePointer(&dword, word, 0));
  *word = 0;
  CHECK(delay(s, 200));
  CHECK(cuMemsetD32Async(dword, 7, 1, s));
  EXPECT(__atomic_load_n(word, __ATOMIC_SEQ_CST) == 0);
  CHECK(cuStreamSynchronize(s));
  EXPECT(*word == 7);
  CHECK(cuMemFreeHost(word));
  CHECK(cuStreamDestroy(s));
  return 1;
}

/* cuStreamWaitEvent orders one stream after another's recorded work; events report it. */
static int event_waits_order_streams(void) {
  CUstream a, b;
  CUevent start, end;
  int* word;
  CUdeviceptr dword;
  CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
  CHECK(cuEventCreate(&end, CU_EVENT_DEFAULT));
  CHECK(cuMemHostAlloc((void**)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostGetDevicePointer(&dword, word, 0));
  *word = 0;
  double t0 = now_ms();
  CHECK(cuEventRecord(start, a));
  CHECK(delay(a, 300));
  CHECK(cuEventRecord(end, a));
  EXPECT(cuEventQuery(end) == CUDA_ERROR_NOT_READY);
  CHECK(cuStreamWaitEvent(b, end, 0));
  CHECK(cuMemsetD32Async(dword, 9, 1, b));
  EXPECT(__atomic_load_n(word, __ATOMIC_SEQ_CST) == 0);
  CHECK(cuStreamSynchronize(b));
  EXPECT(now_ms() - t0 >= 295);
  EXPECT(*word == 9);
  CHECK(cuEventSynchronize(end));
  float ms = 0;
  CHECK(cuEventElapsedTime(&ms, start, end));
  EXPECT(ms >= 290 && ms < 5000);
  CHECK(cuMemFreeHost(word));
  CHECK(cuEventDestroy(start));
  CHECK(cuEventDestroy(end));
  CHECK(cuStreamDestroy(a));
  CHECK(cuStreamDestroy(b));
  return 1;
}

/* The legacy stream waits for blocking streams, not for non-blocking ones. */
static int legacy_stream_synchronises_with_blocking_streams_only(void) {
  CUstream blocking, nonblocking;
  CUdeviceptr d;
  CHECK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  CHECK(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemAlloc(&d, 4096));
  double t0 = now_ms();
  CHECK(delay(blocking, 300));
  CHECK(cuMemsetD32Async(d, 1, 1, 0));
  CHECK(cuStreamSynchronize(0));
  EXPECT(now_ms() - t0 >= 295);
  t0 = now_ms();
  CHECK(delay(nonblocking, 400));
  CHECK(cuMemsetD32Async(d, 2, 1, 0));
  CHECK(cuStreamSynchronize(0));
  EXPECT(now_ms() - t0 < 300);
  CHECK(cuStreamSynchronize(nonblocking));
  CHECK(cuMemFree(d));
  CHECK(cuStreamDestroy(blocking));
  CHECK(cuStreamDestroy(nonblocking));
  return 1;
}

/* A capture across a forked and joined stream records instead of running, and replays the
 * recorded work on every launch of the instantiated graph. */
static int capture_forks_joins_and_replays(void) {
  CUstream origin, side;
  CUevent fork, join;
  static int on_origin, on_side;
  CHECK(cuStreamCreate(&origin, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  CHECK(cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus status;
  cuuint64_t id = 0, side_id = 0;
  CHECK(cuStreamGetCaptureInfo_v3(origin, &status, &id, NULL, NULL, NULL, NULL));
  EXPECT(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(cuEventRecord(fork, origin));
  CHECK(cuStreamWaitEvent(side, fork, 0));
  CHECK(cuStreamGetCaptureInfo_v3(side, &status, &side_id, NULL, NULL, NULL, NULL));
  EXPECT(status == CU_STREAM_CAPTURE_STATUS_ACTIVE && side_id == id);
  CHECK(delay(side, 10));
  CHECK(cuLaunchHostFunc(side, count_up, &on_side));
  CHECK(cuLaunchHostFunc(origin, count_up, &on_origin));
  CHECK(cuEventRecord(join, side));
  CHECK(cuStreamWaitEvent(origin, join, 0));
  CUgraph graph;
  CHECK(cuStreamEndCapture(origin, &graph));
  CHECK(cuStreamIsCapturing(side, &status));
  EXPECT(status == CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT(on_origin == 0 && on_side == 0);
  CUgraphExec exec;
  CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CHECK(cuGraphLaunch(exec, origin));
  CHECK(cuStreamSynchronize(origin));
  EXPECT(on_origin == 3 && on_side == 3);
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));
  CHECK(cuEventDestroy(fork));
  CHECK(cuEventDestroy(join));
  CHECK(cuStreamDestroy(origin));
  CHECK(cuStreamDestroy(side));
  return 1;
}

/* A fork never joined back fails the capture, which ends for every stream in it. */
static int an_unjoined_fork_fails_the_capture(void) {
  CUstream origin, side;
  CUevent fork;
  static int ran;
  CHECK(cuStreamCreate(&origin, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CHECK(cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuEventRecord(fork, origin));
  CHECK(cuStreamWaitEvent(side, fork, 0));
  CHECK(cuLaunchHostFunc(side, count_up, &ran));
  CUgraph graph = NULL;
  EXPECT(cuStreamEndCapture(origin, &graph) == CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  CUstreamCaptureStatus status;
  CHECK(cuStreamIsCapturing(side, &status));
  EXPECT(status == CU_STREAM_CAPTURE_STATUS_NONE);
  CHECK(cuStreamSynchronize(side));
  EXPECT(ran == 0);
  CHECK(cuEventDestroy(fork));
  CHECK(cuStreamDestroy(origin));
  CHECK(cuStreamDestroy(side));
  return 1;
}

/* Waiting on uncaptured work from a capturing stream, or allocating while a global capture
 * runs, is refused, and the capture is invalidated. */
static int capture_refuses_what_crosses_it(void) {
  CUstream s, other;
  CUevent eager;
  CUdeviceptr d = 0;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&eager, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventRecord(eager, other));
  CHECK(cuStreamSynchronize(other));
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT(cuStreamWaitEvent(s, eager, 0) == CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  CUgraph graph = NULL;
  EXPECT(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT(cuMemAlloc(&d, 4096) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(cuMemAlloc(&d, 4096));
  CHECK(cuMemFree(d));
  CHECK(cuEventDestroy(eager));
  CHECK(cuStreamDestroy(s));
  CHECK(cuStreamDestroy(other));
  return 1;
}

/* What another thread may do during a capture, by the capture's mode and the thread's own
 * (cuThreadExchangeStreamCaptureMode): the thread queries an event recorded before the capture,
 * as a job's watchdog does. */
struct query_during_capture {
  CUcontext ctx;
  CUevent event;
  CUstreamCaptureMode mode; /* the querying thread's */
  CUresult result;
};

static void* query_event_beside_a_capture(void* arg) {
  struct query_during_capture* q = arg;
  CUstreamCaptureMode mode = q->mode;
  q->result = cuCtxSetCurrent(q->ctx);
  if (q->result == CUDA_SUCCESS) q->result = cuThreadExchangeStreamCaptureMode(&mode);
  if (q->result == CUDA_SUCCESS) q->result = cuEventQuery(q->event);
  return NULL;
}

/* Captures on `s` in `capture_mode` while another thread in `thread_mode` queries `event`:
 * returns the query's result, and whether the capture ended with a graph in `*ended`. */
static CUresult query_beside(CUstream s, CUevent event, CUstreamCaptureMode capture_mode,
                             CUstreamCaptureMode thread_mode, int* ended) {
  struct query_during_capture q = {NULL, event, thread_mode, CUDA_ERROR_UNKNOWN};
  CUgraph graph = NULL;
  pthread_t thread;
  *ended = 0;
  if (cuCtxGetCurrent(&q.ctx) || cuStreamBeginCapture(s, capture_mode)) return CUDA_ERROR_UNKNOWN;
  if (pthread_create(&thread, NULL, query_event_beside_a_capture, &q) != 0) q.result = CUDA_ERROR_UNKNOWN;
  else pthread_join(thread, NULL);
  if (cuStreamEndCapture(s, &graph) == CUDA_SUCCESS && graph) {
    *ended = 1;
    cuGraphDestroy(graph);
  }
  return q.result;
}

/* The thread's capture mode decides which captures refuse its potentially unsafe calls: a
 * global capture refuses another thread's event query in the global mode, and is invalidated
 * by it; a thread in the thread-local or relaxed mode may query; a thread-local capture
 * refuses no other thread; a thread that relaxed its own mode may allocate during its own
 * capture; waiting in one capture on an event of another would merge them, and is refused. */
static int capture_modes_decide_what_is_refused(void) {
  CUstream s, t;
  CUevent eager, captured;
  CUdeviceptr d = 0;
  int ended = 0;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&eager, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&captured, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventRecord(eager, t));
  CHECK(cuStreamSynchronize(t));
  EXPECT(query_beside(s, eager, CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
                      &ended) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT(!ended);
  EXPECT(query_beside(s, eager, CU_STREAM_CAPTURE_MODE_GLOBAL,
                      CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, &ended) == CUDA_SUCCESS);
  EXPECT(ended);
  EXPECT(query_beside(s, eager, CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED,
                      &ended) == CUDA_SUCCESS);
  EXPECT(ended);
  EXPECT(query_beside(s, eager, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                      CU_STREAM_CAPTURE_MODE_GLOBAL, &ended) == CUDA_SUCCESS);
  EXPECT(ended);
  /* This thread, relaxed, allocates during its own global capture. */
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CUgraph graph = NULL;
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT(cuMemAlloc(&d, 4096) == CUDA_SUCCESS);
  CHECK(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT(mode == CU_STREAM_CAPTURE_MODE_RELAXED);
  EXPECT(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS && graph);
  if (graph) CHECK(cuGraphDestroy(graph));
  if (d) CHECK(cuMemFree(d));
  /* Two captures merging. */
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuStreamBeginCapture(t, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuEventRecord(captured, s));
  EXPECT(cuStreamWaitEvent(t, captured, 0) == CUDA_ERROR_STREAM_CAPTURE_MERGE);
  graph = NULL;
  EXPECT(cuStreamEndCapture(t, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  graph = NULL;
  if (cuStreamEndCapture(s, &graph) == CUDA_SUCCESS && graph) CHECK(cuGraphDestroy(graph));
  CHECK(cuEventDestroy(eager));
  CHECK(cuEventDestroy(captured));
  CHECK(cuStreamDestroy(s));
  CHECK(cuStreamDestroy(t));
  return 1;
}

/* What a global capture refuses, call by call: each call is made by the capturing thread during
 * a capture of its own begun in the global mode (on a stream the call does not use), and is
 * either refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture then ending
 * INVALIDATED) or allowed (the capture then ends with its graph). The table holds the calls
 * the engine makes or could make while a job captures, each as the emulated driver answers it
 * (which also refuses cuIpcOpenMemHandle, cuIpcCloseMemHandle and the synchronous cuMemcpy,
 * calls the engine never makes then): run against a real driver, a row that answers otherwise
 * fails the check, naming the call, so the table is the real driver's once gpu-check has
 * passed on a GPU. */
static CUmemAllocationProp device_memory(int device, int shareable);

struct capture_probe_resources {
  CUstream other;
  CUevent done;
  CUdeviceptr device, freed;
  void* pinned;
  void* registered; /* pageable, registered before the capture */
  void* to_register; /* pageable, page-aligned */
  void* pageable;
  int vmm;
  /* cuMemCreate's granularity, asked before the capture (a refusal is then cuMemCreate's). */
  size_t granularity;
};

enum capture_probe {
  PROBE_MEM_ALLOC,
  PROBE_MEM_FREE,
  PROBE_MEM_ALLOC_HOST,
  PROBE_MEM_HOST_ALLOC,
  PROBE_MEM_FREE_HOST,
  PROBE_MEM_HOST_REGISTER,
  PROBE_MEM_HOST_UNREGISTER,
  PROBE_MEMCPY_HTOD,
  PROBE_MEMCPY_DTOH,
  PROBE_MEMCPY_DTOD,
  PROBE_MEMSET_D8,
  PROBE_MEMSET_D32,
  PROBE_STREAM_SYNCHRONIZE,
  PROBE_STREAM_QUERY,
  PROBE_EVENT_SYNCHRONIZE,
  PROBE_EVENT_QUERY,
  PROBE_CTX_SYNCHRONIZE,
  PROBE_MEM_CREATE,
  /* allowed from here on */
  PROBE_MEM_GET_INFO,
  PROBE_STREAM_CREATE,
  PROBE_EVENT_CREATE,
  PROBE_HOST_DEVICE_POINTER,
  PROBE_IPC_GET_HANDLE,
  PROBE_COUNT
};
#define PROBE_FIRST_ALLOWED PROBE_MEM_GET_INFO

static const char* const kCaptureProbeNames[PROBE_COUNT] = {
    "cuMemAlloc", "cuMemFree", "cuMemAllocHost", "cuMemHostAlloc", "cuMemFreeHost",
    "cuMemHostRegister", "cuMemHostUnregister", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoD",
    "cuMemsetD8", "cuMemsetD32", "cuStreamSynchronize", "cuStreamQuery", "cuEventSynchronize",
    "cuEventQuery", "cuCtxSynchronize", "cuMemCreate", "cuMemGetInfo", "cuStreamCreate",
    "cuEventCreate", "cuMemHostGetDevicePointer", "cuIpcGetMemHandle"};

/* Makes call `which` with `r`'s resources; whatever it made is released again (after the
 * capture, by the caller, through `made`). */
static CUresult capture_probe_call(int which, struct capture_probe_resources* r, void** made,
                                   CUdeviceptr* made_device, CUstream* made_stream,
                                   CUevent* made_event) {
  char bytes[64] = {0};
  switch (which) {
    case PROBE_MEM_ALLOC: return cuMemAlloc(made_device, 4096);
    case PROBE_MEM_FREE: return cuMemFree(r->freed);
    case PROBE_MEM_ALLOC_HOST: return cuMemAllocHost(made, 4096);
    case PROBE_MEM_HOST_ALLOC: return cuMemHostAlloc(made, 4096, 0);
    case PROBE_MEM_FREE_HOST: return cuMemFreeHost(r->pinned);
    case PROBE_MEM_HOST_REGISTER: return cuMemHostRegister(r->to_register, 4096, 0);
    case PROBE_MEM_HOST_UNREGISTER: return cuMemHostUnregister(r->registered);
    case PROBE_MEMCPY_HTOD: return cuMemcpyHtoD(r->device, bytes, sizeof bytes);
    case PROBE_MEMCPY_DTOH: return cuMemcpyDtoH(bytes, r->device, sizeof bytes);
    case PROBE_MEMCPY_DTOD: return cuMemcpyDtoD(r->device + 64, r->device, 64);
    case PROBE_MEMSET_D8: return cuMemsetD8(r->device, 1, 64);
    case PROBE_MEMSET_D32: return cuMemsetD32(r->device, 1, 16);
    case PROBE_STREAM_SYNCHRONIZE: return cuStreamSynchronize(r->other);
    case PROBE_STREAM_QUERY: return cuStreamQuery(r->other);
    case PROBE_EVENT_SYNCHRONIZE: return cuEventSynchronize(r->done);
    case PROBE_EVENT_QUERY: return cuEventQuery(r->done);
    case PROBE_CTX_SYNCHRONIZE: return cuCtxSynchronize();
    case PROBE_MEM_CREATE: {
      if (!r->vmm) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* as expected: skipped */
      CUmemAllocationProp prop = device_memory(0, 0);
      CUmemGenericAllocationHandle handle;
      CUresult c = cuMemCreate(&handle, r->granularity, &prop, 0);
      if (c == CUDA_SUCCESS) cuMemRelease(handle);
      return c;
    }
    case PROBE_MEM_GET_INFO: {
      size_t free_bytes, total;
      return cuMemGetInfo(&free_bytes, &total);
    }
    case PROBE_STREAM_CREATE: return cuStreamCreate(made_stream, CU_STREAM_NON_BLOCKING);
    case PROBE_EVENT_CREATE: return cuEventCreate(made_event, CU_EVENT_DISABLE_TIMING);
    case PROBE_HOST_DEVICE_POINTER: {
      CUdeviceptr mapped;
      return cuMemHostGetDevicePointer(&mapped, r->pinned, 0);
    }
    case PROBE_IPC_GET_HANDLE: {
      CUipcMemHandle handle;
      return cuIpcGetMemHandle(&handle, r->device);
    }
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

static int a_global_capture_refuses_exactly_the_unsafe_calls(void) {
  struct capture_probe_resources r;
  memset(&r, 0, sizeof r);
  CUstream s;
  int wrong = 0;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&r.other, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&r.done, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventRecord(r.done, r.other));
  CHECK(cuStreamSynchronize(r.other));
  CHECK(cuMemAlloc(&r.device, 4096));
  CHECK(cuDeviceGetAttribute(&r.vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  r.granularity = 0;
  if (r.vmm) {
    CUmemAllocationProp prop = device_memory(0, 0);
    CHECK(cuMemGetAllocationGranularity(&r.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  }
  long page = sysconf(_SC_PAGESIZE);
  EXPECT(posix_memalign(&r.registered, (size_t)page, 4096) == 0);
  EXPECT(posix_memalign(&r.to_register, (size_t)page, 4096) == 0);
  CHECK(cuMemHostRegister(r.registered, 4096, 0));
  for (int which = 0; which < PROBE_COUNT; ++which) {
    /* What a refused call would have released, made again for each row that releases it. */
    if (!r.freed) CHECK(cuMemAlloc(&r.freed, 4096));
    if (!r.pinned) CHECK(cuMemHostAlloc(&r.pinned, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    void* made = NULL;
    CUdeviceptr made_device = 0;
    CUstream made_stream = NULL;
    CUevent made_event = NULL;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult got = capture_probe_call(which, &r, &made, &made_device, &made_stream, &made_event);
    CUgraph graph = NULL;
    CUresult ended = cuStreamEndCapture(s, &graph);
    if (graph) CHECK(cuGraphDestroy(graph));
    const int refused = which < PROBE_FIRST_ALLOWED;
    const CUresult want = refused ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
    const CUresult want_end = refused ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
    const int skipped = which == PROBE_MEM_CREATE && !r.vmm;
    if (!skipped && (got != want || ended != want_end)) {
      const char *got_name = "?", *end_name = "?";
      cuGetErrorName(got, &got_name);
      cuGetErrorName(ended, &end_name);
      fprintf(stderr, "  %s during a global capture: %s, the capture ending %s (expected %s)\n",
              kCaptureProbeNames[which], got_name, end_name, refused ? "refused" : "allowed");
      wrong++;
    }
    /* Undo what an allowed (or wrongly allowed) call did. */
    if (got == CUDA_SUCCESS) {
      if (which == PROBE_MEM_FREE) r.freed = 0;
      if (which == PROBE_MEM_FREE_HOST) r.pinned = NULL;
      if (which == PROBE_MEM_HOST_REGISTER) CHECK(cuMemHostUnregister(r.to_register));
      if (which == PROBE_MEM_HOST_UNREGISTER) CHECK(cuMemHostRegister(r.registered, 4096, 0));
    }
    if (made) CHECK(cuMemFreeHost(made));
    if (made_device) CHECK(cuMemFree(made_device));
    if (made_stream) CHECK(cuStreamDestroy(made_stream));
    if (made_event) CHECK(cuEventDestroy(made_event));
  }
  CHECK(cuMemHostUnregister(r.registered));
  free(r.registered);
  free(r.to_register);
  if (r.freed) CHECK(cuMemFree(r.freed));
  if (r.pinned) CHECK(cuMemFreeHost(r.pinned));
  CHECK(cuMemFree(r.device));
  CHECK(cuEventDestroy(r.done));
  CHECK(cuStreamDestroy(r.other));
  CHECK(cuStreamDestroy(s));
  return wrong == 0;
}

/* External event nodes: a graph captured with an event wait node (CU_EVENT_WAIT_EXTERNAL)
 * waits, at each launch, for the event's latest record as of that launch (eager work on
 * another stream); a record node (CU_EVENT_RECORD_EXTERNAL) records the event at each launch,
 * so an eager wait on it orders after the replay. Stream a sets 1 at 200 ms, the replay on b
 * 100 ms after a's set sets 2, stream c waiting on the event sets 3: 3 is last only if both
 * nodes work (without the wait node, a's 1 comes last; without the record node, the replay's 2). */
static int external_event_nodes_order_replays_and_eager_work(void) {
  CUstream a, b, c;
  CUevent order;
  CUgraph graph;
  CUgraphExec exec;
  int* word;
  CUdeviceptr dword;
  CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&order, CU_EVENT_DISABLE_TIMING));
  CHECK(cuMemHostAlloc((void**)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostGetDevicePointer(&dword, word, 0));
  CHECK(cuStreamBeginCapture(b, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuStreamWaitEvent(b, order, CU_EVENT_WAIT_EXTERNAL));
  CHECK(delay(b, 100));
  CHECK(cuMemsetD32Async(dword, 2, 1, b));
  CHECK(cuEventRecordWithFlags(order, b, CU_EVENT_RECORD_EXTERNAL));
  CHECK(cuStreamEndCapture(b, &graph));
  CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
  for (int round = 0; round < 2; ++round) {
    *word = 0;
    CHECK(delay(a, 200));
    CHECK(cuMemsetD32Async(dword, 1, 1, a));
    CHECK(cuEventRecord(order, a));
    CHECK(cuGraphLaunch(exec, b));
    CHECK(cuStreamWaitEvent(c, order, 0));
    CHECK(cuMemsetD32Async(dword, 3, 1, c));
    CHECK(cuStreamSynchronize(a));
    CHECK(cuStreamSynchronize(b));
    CHECK(cuStreamSynchronize(c));
    EXPECT(*word == 3);
  }
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));
  CHECK(cuMemFreeHost(word));
  CHECK(cuEventDestroy(order));
  CHECK(cuStreamDestroy(a));
  CHECK(cuStreamDestroy(b));
  CHECK(cuStreamDestroy(c));
  return 1;
}

/* Two launches of one graph on two streams run one after the other: a graph never runs
 * concurrently with itself. */
static int a_graph_launched_on_two_streams_runs_once_at_a_time(void) {
  CUstream origin, a, b;
  CUgraph graph;
  CUgraphExec exec;
  CHECK(cuStreamCreate(&origin, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamBeginCapture(origin, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(delay(origin, 200));
  CHECK(cuStreamEndCapture(origin, &graph));
  CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
  double t0 = now_ms();
  CHECK(cuGraphLaunch(exec, a));
  CHECK(cuGraphLaunch(exec, b));
  CHECK(cuStreamSynchronize(a));
  CHECK(cuStreamSynchronize(b));
  EXPECT(now_ms() - t0 >= 390);
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));
  CHECK(cuStreamDestroy(origin));
  CHECK(cuStreamDestroy(a));
  CHECK(cuStreamDestroy(b));
  return 1;
}

/* The self-test's branch kernel (tests/emulated/set_branch.ptx), built into this program: it
 * sets three conditional handles from a word's bits (the complement of bit 0, bit 0, bit 1),
 * calling the device runtime's cudaGraphSetConditional as the engine's turn kernel does. */
__asm__(".section .rodata\n"
        ".global stragglar_branch_ptx\n"
        "stragglar_branch_ptx:\n"
        ".incbin \"tests/emulated/set_branch.ptx\"\n"
        ".byte 0\n"
        ".previous\n");
extern const char stragglar_branch_ptx[];

/* A graph `*out` captured apart on a stream of its own: a set of `word` to `value`, after a
 * host function when `host` (what a conditional body may not hold). */
static int captured_apart(CUdeviceptr word, unsigned value, int host, CUgraph* out) {
  static int ran;
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  if (host) CHECK(cuLaunchHostFunc(s, count_up, &ran));
  CHECK(cuMemsetD32Async(word, value, 1, s));
  CHECK(cuStreamEndCapture(s, out));
  CHECK(cuStreamDestroy(s));
  return 1;
}

/* What the engine builds for a captured ncclAllReduce whose baseline is NCCL (CUDA 12.3 on;
 * before, a driver refuses the module of a kernel that sets a handle): a kernel sets three
 * handles made on the capture's graph from a word, and three IF nodes (NCCL's made before the
 * kernel, then given it as its dependency through StragglAR's, the sample's after NCCL's and
 * made what later captured work depends on) each run their body (a graph captured apart, added
 * as a child graph node): StragglAR's at the replays where bit 0 of the word was 0, NCCL's
 * where it was 1, the sample's where bit 1 was. A body refuses a child graph with a host node
 * (now or at instantiation), and the nodes of a graph read back with their types and edges. */
static int a_conditional_node_runs_its_body_when_a_kernel_says_so(void) {
  int version = 0;
  CHECK(cuDriverGetVersion(&version));
  CUmodule module;
  if (version < 12030) {
    /* No device-side cudaGraphSetConditional to resolve: the module is refused whole. */
    EXPECT(cuModuleLoadData(&module, stragglar_branch_ptx) != CUDA_SUCCESS);
    return 1;
  }
  CUfunction branch;
  CHECK(cuModuleLoadData(&module, stragglar_branch_ptx));
  CHECK(cuModuleGetFunction(&branch, module, "stragglarEmuSetBranch"));
  CUcontext ctx;
  CHECK(cuCtxGetCurrent(&ctx));
  uint32_t* words;
  CUdeviceptr dwords;
  CHECK(cuMemHostAlloc((void**)&words, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostGetDevicePointer(&dwords, words, 0));
  CUgraph apart, other_apart, sample_apart, with_host;
  if (!captured_apart(dwords + 4, 7, 0, &apart) || !captured_apart(dwords + 8, 9, 1, &with_host) ||
      !captured_apart(dwords + 16, 11, 0, &other_apart) ||
      !captured_apart(dwords + 20, 13, 0, &sample_apart))
    return 0;
  /* Read back: one memset node; a host node, then a memset after it. */
  CUgraphNode nodes[4];
  size_t count = 4;
  CHECK(cuGraphGetNodes(with_host, nodes, &count));
  EXPECT(count == 2);
  CUgraphNodeType first, second;
  CHECK(cuGraphNodeGetType(nodes[0], &first));
  CHECK(cuGraphNodeGetType(nodes[1], &second));
  EXPECT(first == CU_GRAPH_NODE_TYPE_HOST && second == CU_GRAPH_NODE_TYPE_MEMSET);
  CUgraphNode dep = NULL;
  size_t deps = 1;
  CHECK(cuGraphNodeGetDependencies(nodes[1], &dep, &deps));
  EXPECT(deps == 1 && dep == nodes[0]);

  CUstream s;
  CUgraph graph, captured, body, other_body, sample_body;
  CUgraphExec exec;
  CUgraphConditionalHandle handle, other_handle, sample_handle;
  CUstreamCaptureStatus status;
  const CUgraphNode* tail;
  size_t tail_count;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  /* As the engine builds it: the IF nodes and their bodies first, with no dependency, then
   * the kernel that sets the handles, then edges from that kernel to the first two IF nodes
   * (side by side) and from the second to the third, and the capture going on from the first
   * and the third. */
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuStreamGetCaptureInfo_v2(s, &status, NULL, &captured, NULL, NULL));
  CHECK(cuGraphConditionalHandleCreate(&handle, captured, ctx, 0, CU_GRAPH_COND_ASSIGN_DEFAULT));
  CHECK(cuGraphConditionalHandleCreate(&other_handle, captured, ctx, 0,
                                       CU_GRAPH_COND_ASSIGN_DEFAULT));
  CHECK(cuGraphConditionalHandleCreate(&sample_handle, captured, ctx, 0,
                                       CU_GRAPH_COND_ASSIGN_DEFAULT));
  CUgraphNodeParams cond;
  memset(&cond, 0, sizeof cond);
  cond.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  cond.conditional.handle = handle;
  cond.conditional.type = CU_GRAPH_COND_TYPE_IF;
  cond.conditional.size = 1;
  cond.conditional.phGraph_out = &body;
  cond.conditional.ctx = ctx;
  CUgraphNode if_node, other_if_node, sample_if_node, child;
  CHECK(cuGraphAddNode(&if_node, captured, NULL, 0, &cond));
  CHECK(cuGraphAddChildGraphNode(&child, body, NULL, 0, apart));
  cond.conditional.handle = other_handle;
  cond.conditional.phGraph_out = &other_body;
  CHECK(cuGraphAddNode(&other_if_node, captured, NULL, 0, &cond));
  CHECK(cuGraphAddChildGraphNode(&child, other_body, NULL, 0, other_apart));
  cond.conditional.handle = sample_handle;
  cond.conditional.phGraph_out = &sample_body;
  CHECK(cuGraphAddNode(&sample_if_node, captured, NULL, 0, &cond));
  CHECK(cuGraphAddChildGraphNode(&child, sample_body, NULL, 0, sample_apart));
  uint64_t args[4] = {other_handle, handle, sample_handle, (uint64_t)dwords};
  void* params[] = {args};
  CHECK(cuLaunchKernel(branch, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
  CHECK(cuStreamGetCaptureInfo_v2(s, &status, NULL, &captured, &tail, &tail_count));
  EXPECT(tail_count == 1);
  CUgraphNode from[3] = {tail[0], tail[0], if_node};
  CUgraphNode to[3] = {other_if_node, if_node, sample_if_node};
  CHECK(cuGraphAddDependencies(captured, from, to, 3));
  CUgraphNode last[2] = {other_if_node, sample_if_node};
  CHECK(cuStreamUpdateCaptureDependencies(s, last, 2, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  CHECK(cuMemsetD32Async(dwords + 12, 5, 1, s));
  CHECK(cuStreamEndCapture(s, &graph));
  CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
  const uint32_t turns[] = {1, 0, 3, 1, 0, 3};
  for (unsigned i = 0; i < sizeof turns / sizeof turns[0]; ++i) {
    words[0] = turns[i];
    words[1] = 0;
    words[3] = 0;
    words[4] = 0;
    words[5] = 0;
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    EXPECT(words[1] == (turns[i] & 1 ? 7u : 0u));
    EXPECT(words[4] == (turns[i] & 1 ? 0u : 11u));
    EXPECT(words[5] == (turns[i] & 2 ? 13u : 0u));
    EXPECT(words[3] == 5);
  }

  /* A body takes no host node, whether refused when added or when instantiated. */
  CUgraph refusing, refusing_body;
  CUgraphConditionalHandle other;
  CUgraphNode other_if, host_child;
  CUgraphExec refused_exec;
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuStreamGetCaptureInfo_v2(s, &status, NULL, &captured, NULL, NULL));
  CHECK(cuGraphConditionalHandleCreate(&other, captured, ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
  cond.conditional.handle = other;
  cond.conditional.phGraph_out = &refusing_body;
  CHECK(cuGraphAddNode(&other_if, captured, NULL, 0, &cond));
  CUresult added = cuGraphAddChildGraphNode(&host_child, refusing_body, NULL, 0, with_host);
  CHECK(cuStreamUpdateCaptureDependencies(s, &other_if, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  CHECK(cuStreamEndCapture(s, &refusing));
  if (added == CUDA_SUCCESS) {
    EXPECT(cuGraphInstantiateWithFlags(&refused_exec, refusing, 0) != CUDA_SUCCESS);
  }
  CHECK(cuGraphDestroy(refusing));
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));
  CHECK(cuGraphDestroy(apart));
  CHECK(cuGraphDestroy(other_apart));
  CHECK(cuGraphDestroy(sample_apart));
  CHECK(cuGraphDestroy(with_host));
  CHECK(cuStreamDestroy(s));
  CHECK(cuMemFreeHost(words));
  CHECK(cuModuleUnload(module));
  return 1;
}

/* cuMemFree waits for the context's queued work, on any stream, before it returns (observed
 * of the real driver, not documented: the engine does not rely on it, and the emulation does
 * it so that a free under running work waits here as on a GPU). */
static int memory_free_waits_for_the_contexts_work(void) {
  CUstream s;
  CUdeviceptr spare;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemAlloc(&spare, 4096));
  double t0 = now_ms();
  CHECK(delay(s, 300));
  CHECK(cuMemFree(spare));
  EXPECT(now_ms() - t0 >= 250);
  EXPECT(cuStreamQuery(s) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(s));
  return 1;
}

static void to_hex(const unsigned char* bytes, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) sprintf(out + 2 * i, "%02x", bytes[i]);
}

/* The IPC handle written by to_hex; 0 when `hex` is not one. */
static int handle_from_hex(const char* hex, CUipcMemHandle* handle) {
  for (size_t i = 0; i < sizeof *handle; ++i) {
    unsigned v = 0;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 0;
    ((unsigned char*)handle)[i] = (unsigned char)v;
  }
  return 1;
}

/* Runs this program again with `args` (NULL-terminated, after the program's name) and one more
 * environment entry (none if NULL); returns its exit status, or -1. */
static int spawn_self(const char* self, const char* const* args, const char* setting) {
  char* argv[5] = {(char*)self, NULL, NULL, NULL, NULL};
  for (int i = 0; args[i] && i < 3; ++i) argv[i + 1] = (char*)args[i];
  size_t n = 0;
  while (environ[n]) ++n;
  char** env = calloc(n + 2, sizeof(char*));
  for (size_t i = 0; i < n; ++i) env[i] = environ[i];
  env[n] = (char*)setting;
  pid_t pid;
  int rc = posix_spawn(&pid, self, NULL, NULL, argv, env);
  free(env);
  if (rc != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFSIGNALED(status)) return 1000 + WTERMSIG(status);
  if (!WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

static int run_child(const char* self, const char* hex, const char* fail) {
  const char* args[] = {"--child", hex, NULL};
  char fail_env[128];
  if (fail) snprintf(fail_env, sizeof fail_env, "STRAGGLAR_EMU_FAIL=%s", fail);
  return spawn_self(self, args, fail ? fail_env : NULL);
}

/* An IPC handle opens in another process (at an address of that process) and maps the same
 * memory: each side sees what the other wrote. Opened twice in one context it is the same
 * pointer, counted (cuIpcOpenMemHandle's documentation); opened in a second device's context
 * (where the machine has two GPUs) it maps for that context too. */
static int ipc_maps_memory_across_processes(const char* self) {
  enum { BYTES = 1 << 20 };
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, BYTES));
  unsigned char* host = malloc(BYTES);
  for (int i = 0; i < BYTES; ++i) host[i] = (unsigned char)(i * 7 + 3);
  CHECK(cuMemcpyHtoD(d, host, BYTES));
  CUipcMemHandle handle;
  CHECK(cuIpcGetMemHandle(&handle, d));
  char hex[2 * sizeof handle + 1];
  to_hex((const unsigned char*)&handle, sizeof handle, hex);
  EXPECT(run_child(self, hex, NULL) == 0);
  CHECK(cuMemcpyDtoH(host, d, BYTES));
  for (int i = 0; i < BYTES; ++i) EXPECT(host[i] == (unsigned char)(i < 4096 ? 0x5c : i * 7 + 3));
  if (g_emulated) EXPECT(run_child(self, hex, "cuIpcOpenMemHandle_v2=201") == 201 % 256);
  free(host);
  CHECK(cuMemFree(d));
  return 1;
}

/* The child: opens the handle, checks the parent's bytes, writes 0x5c over the first page. */
static int child(const char* hex) {
  CUipcMemHandle handle;
  if (!handle_from_hex(hex, &handle)) return 2;
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx))
    return 3;
  CUdeviceptr d;
  CUresult r = cuIpcOpenMemHandle(&d, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) return (int)r % 256;
  unsigned char page[4096];
  if (cuMemcpyDtoH(page, d, sizeof page)) return 4;
  for (int i = 0; i < 4096; ++i)
    if (page[i] != (unsigned char)(i * 7 + 3)) return 5;
  /* Opened again in the same context: the same pointer, counted; the first close leaves it
   * mapped. */
  CUdeviceptr again;
  if (cuIpcOpenMemHandle(&again, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) || again != d)
    return 8;
  if (cuIpcCloseMemHandle(again) || cuMemcpyDtoH(page, d, sizeof page)) return 9;
  /* Opened in a second device's context (where there is one): a mapping of that context's,
   * which reads the same bytes and is closed there. */
  int devices = 0;
  CUdevice dev1;
  CUcontext ctx1;
  if (cuDeviceGetCount(&devices)) return 10;
  if (devices > 1) {
    CUdeviceptr other;
    unsigned char seen[4096];
    if (cuDeviceGet(&dev1, 1) || cuDevicePrimaryCtxRetain(&ctx1, dev1) || cuCtxSetCurrent(ctx1))
      return 11;
    if (cuIpcOpenMemHandle(&other, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) return 12;
    if (cuMemcpyDtoH(seen, other, sizeof seen) || memcmp(seen, page, sizeof seen) != 0) return 13;
    if (cuIpcCloseMemHandle(other) || cuCtxSetCurrent(ctx)) return 14;
  }
  memset(page, 0x5c, sizeof page);
  if (cuMemcpyHtoD(d, page, sizeof page) || cuCtxSynchronize()) return 6;
  if (cuIpcCloseMemHandle(d)) return 7;
  return 0;
}

/* The exporter of `--export-free`: allocates, prints its IPC handle, waits for a line on stdin
 * (its importer opened the handle), then frees the memory the importer still maps. */
static int export_then_free(void) {
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr d;
  CUipcMemHandle handle;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx) || cuMemAlloc(&d, 1 << 20) || cuIpcGetMemHandle(&handle, d))
    return 3;
  char hex[2 * sizeof handle + 1];
  to_hex((const unsigned char*)&handle, sizeof handle, hex);
  printf("%s\n", hex);
  fflush(stdout);
  char line[8];
  if (!fgets(line, sizeof line, stdin)) return 4;
  cuMemFree(d);
  return 0;
}

/* Freeing exported memory while another process still maps it (undefined behaviour on a GPU,
 * by cuIpcOpenMemHandle's documentation): the emulated exporter ends itself saying so. */
static int a_free_under_an_importer_is_reported(const char* self) {
  int out[2], in[2];
  EXPECT(pipe(out) == 0 && pipe(in) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  posix_spawn_file_actions_addclose(&actions, in[1]);
  char* argv[] = {(char*)self, "--export-free", NULL};
  pid_t pid;
  const int spawned = posix_spawn(&pid, self, &actions, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(in[0]);
  EXPECT(spawned == 0);
  FILE* from = fdopen(out[0], "r");
  char hex[2 * sizeof(CUipcMemHandle) + 2] = "";
  EXPECT(from && fgets(hex, sizeof hex, from));
  CUipcMemHandle handle;
  EXPECT(handle_from_hex(hex, &handle));
  CUdeviceptr d;
  CHECK(cuIpcOpenMemHandle(&d, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  EXPECT(write(in[1], "go\n", 3) == 3);
  int status = 0;
  EXPECT(waitpid(pid, &status, 0) == pid);
  EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  CHECK(cuIpcCloseMemHandle(d));
  close(in[1]);
  if (from) fclose(from);
  return 1;
}

/* The engine's peer probe kernel (sg_peer_probe), declared for the emulated driver, which
 * binds the name to its host build of cuda/: with two ranks, an acquire load, a system-scope
 * atomic add and a load of word `probe_from_flags` of peer 1's flags, then the verdict. */
static const char kPeerProbeDecl[] =
    ".version 8.0\n"
    ".target sm_90\n"
    ".address_size 64\n"
    ".visible .entry ncclStragglarPeerProbe(.param .align 8 .b8 args[40])\n"
    "{\n"
    "  ret;\n"
    "}\n";

/* The child of `--ipc-probe HEX DEVICE`: opens the parent's handle in the context of GPU
 * `DEVICE`, then runs the peer probe on GPU 1 over it (the parent wrote 7 into its first word).
 * Returns 0 once the probe ran; the emulated GPU ends the process when the mapping is another
 * device's. */
static int ipc_probe_child(const char* hex, const char* device) {
  CUipcMemHandle handle;
  if (!handle_from_hex(hex, &handle)) return 2;
  CUdevice opener, prober;
  CUcontext opener_ctx, prober_ctx;
  CUdeviceptr mapping, peers, result;
  CUmodule module;
  CUfunction probe;
  if (cuInit(0) || cuDeviceGet(&opener, atoi(device)) || cuDeviceGet(&prober, 1) ||
      cuDevicePrimaryCtxRetain(&opener_ctx, opener) ||
      cuDevicePrimaryCtxRetain(&prober_ctx, prober) || cuCtxSetCurrent(opener_ctx))
    return 3;
  if (cuIpcOpenMemHandle(&mapping, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) return 4;
  if (cuCtxSetCurrent(prober_ctx) || cuMemAlloc(&peers, 4096) || cuMemAlloc(&result, 4096) ||
      cuModuleLoadData(&module, kPeerProbeDecl) ||
      cuModuleGetFunction(&probe, module, "ncclStragglarPeerProbe"))
    return 5;
  uint64_t table[2][7]; /* two RawPeer: arena[2], flags[2], failed, served[2] */
  memset(table, 0, sizeof table);
  table[1][2] = mapping;
  struct {
    uint64_t peers, probe_from_flags, result;
    uint32_t token, rank, ranks, reserved;
  } args = {peers, 0, result, 7, 0, 2, 0};
  void* params[] = {&args};
  if (cuMemcpyHtoD(peers, table, sizeof table) ||
      cuLaunchKernel(probe, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL) || cuCtxSynchronize())
    return 6;
  cuCtxSetCurrent(opener_ctx);
  return cuIpcCloseMemHandle(mapping) ? 7 : 0;
}

/* A kernel using an IPC mapping that another device's context opened is reported (emulation
 * only: the mapping is not in that GPU's address space, an illegal address on a GPU); opened
 * in the kernel's own device's context, the same probe runs. */
static int an_ipc_mapping_of_another_device_is_reported(void) {
  int devices = 0;
  CHECK(cuDeviceGetCount(&devices));
  if (devices < 2) return 2;
  CUdeviceptr d;
  const uint32_t seven = 7;
  CHECK(cuMemAlloc(&d, 1 << 20));
  CHECK(cuMemcpyHtoD(d, &seven, sizeof seven));
  CUipcMemHandle handle;
  CHECK(cuIpcGetMemHandle(&handle, d));
  char hex[2 * sizeof handle + 1];
  to_hex((const unsigned char*)&handle, sizeof handle, hex);
  const char* own[] = {"--ipc-probe", hex, "1", NULL};
  const char* other[] = {"--ipc-probe", hex, "0", NULL};
  EXPECT(spawn_self(g_self, own, NULL) == 0);
  EXPECT(spawn_self(g_self, other, NULL) == 1000 + SIGABRT);
  CHECK(cuMemFree(d));
  return 1;
}

/* The emulation's own promises: stale handles and destroyed contexts answer errors, never a
 * crash. */
static int stale_handles_are_errors(void) {
  CUstream s;
  CUevent e;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamDestroy(s));
  EXPECT(cuStreamSynchronize(s) == CUDA_ERROR_INVALID_HANDLE);
  EXPECT(cuStreamDestroy(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuEventCreate(&e, 0));
  CHECK(cuEventDestroy(e));
  EXPECT(cuEventRecord(e, 0) == CUDA_ERROR_INVALID_HANDLE);
  EXPECT(cuMemFree((CUdeviceptr)16) == CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemcpyHtoD((CUdeviceptr)16, &s, 8) == CUDA_ERROR_INVALID_VALUE);
  /* A primary context released to zero is destroyed: using it is an error. (Shown on a second
   * GPU, whose context the check may destroy: a machine of one GPU, as the device has, checks
   * the rest only.) */
  int gpus = 0;
  CHECK(cuDeviceGetCount(&gpus));
  if (gpus < 2) return 3;
  CUdevice other;
  CUcontext ctx, current;
  CHECK(cuCtxGetCurrent(&current));
  CHECK(cuDeviceGet(&other, 1));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, other));
  CHECK(cuCtxPushCurrent(ctx));
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuCtxPopCurrent(NULL));
  CHECK(cuDevicePrimaryCtxRelease(other));
  EXPECT(cuCtxPushCurrent(ctx) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT(cuStreamSynchronize(s) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CUcontext still;
  CHECK(cuCtxGetCurrent(&still));
  EXPECT(still == current);
  return 1;
}

/* Pinned device memory of `device`, shareable as a POSIX fd when `shareable`. */
static CUmemAllocationProp device_memory(int device, int shareable) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes =
      shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

/* Reserves `bytes` of addresses, maps `handle` there and grants `devices` (0..devices-1)
 * read-write access. */
static CUresult map_for(CUmemGenericAllocationHandle handle, size_t bytes, int devices,
                        CUdeviceptr* va) {
  CUresult r = cuMemAddressReserve(va, bytes, 0, 0, 0);
  if (r == CUDA_SUCCESS) r = cuMemMap(*va, bytes, 0, handle, 0);
  CUmemAccessDesc access[2];
  memset(access, 0, sizeof access);
  for (int d = 0; d < devices && d < 2; ++d) {
    access[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[d].location.id = d;
    access[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  if (r == CUDA_SUCCESS) r = cuMemSetAccess(*va, bytes, access, (size_t)devices);
  return r;
}

static CUresult unmap_and_free(CUdeviceptr va, size_t bytes) {
  CUresult r = cuMemUnmap(va, bytes);
  return r == CUDA_SUCCESS ? cuMemAddressFree(va, bytes) : r;
}

/* Memory of the virtual memory API (cuMemCreate): mapped and granted, it takes copies; a
 * second process imports it from a POSIX fd (inherited here; a Unix socket in the engine) and
 * maps the same bytes; cuIpcGetMemHandle cannot export it; a size off the granularity, a
 * second mapping over a mapped range and exporting what was not made shareable are refused. */
static int virtual_memory_maps_and_shares_by_fd(void) {
  int vmm = 0, by_fd = 0;
  CHECK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  CHECK(cuDeviceGetAttribute(&by_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
  EXPECT(vmm == 1 && by_fd == 1);
  CUmemAllocationProp prop = device_memory(0, 1);
  size_t granularity = 0;
  CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT(granularity > 0 && granularity % 4096 == 0);
  const size_t bytes = 2 * granularity;
  CUmemGenericAllocationHandle handle;
  EXPECT(cuMemCreate(&handle, granularity + 4096, &prop, 0) != CUDA_SUCCESS);
  CHECK(cuMemCreate(&handle, bytes, &prop, 0));
  CUdeviceptr va;
  CHECK(map_for(handle, bytes, 1, &va));
  EXPECT(cuMemMap(va, granularity, 0, handle, 0) != CUDA_SUCCESS);
  unsigned char* host = malloc(bytes);
  for (size_t i = 0; i < bytes; ++i) host[i] = (unsigned char)(i * 7 + 3);
  CHECK(cuMemcpyHtoD(va, host, bytes));
  CUipcMemHandle ipc;
  EXPECT(cuIpcGetMemHandle(&ipc, va) != CUDA_SUCCESS);
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT(fd >= 0 && fcntl(fd, F_SETFD, 0) == 0);
  char fd_text[16], bytes_text[32];
  snprintf(fd_text, sizeof fd_text, "%d", fd);
  snprintf(bytes_text, sizeof bytes_text, "%zu", bytes);
  const char* args[] = {"--vmm-child", fd_text, bytes_text, NULL};
  EXPECT(spawn_self(g_self, args, NULL) == 0);
  close(fd);
  CHECK(cuMemcpyDtoH(host, va, bytes));
  for (size_t i = 0; i < bytes; ++i)
    EXPECT(host[i] == (unsigned char)(i < 4096 ? 0x5c : i * 7 + 3));
  free(host);
  CHECK(unmap_and_free(va, bytes));
  CHECK(cuMemRelease(handle));
  CUmemAllocationProp private_prop = device_memory(0, 0);
  CHECK(cuMemCreate(&handle, granularity, &private_prop, 0));
  EXPECT(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
         CUDA_SUCCESS);
  CHECK(cuMemRelease(handle));
  return 1;
}

/* The importer of `--vmm-child FD BYTES`: imports the fd, maps it, checks the exporter's bytes,
 * writes 0x5c over the first page. */
static int vmm_child(const char* fd_text, const char* bytes_text) {
  const int fd = atoi(fd_text);
  const size_t bytes = (size_t)strtoull(bytes_text, NULL, 10);
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx))
    return 3;
  CUmemGenericAllocationHandle handle;
  if (cuMemImportFromShareableHandle(&handle, (void*)(intptr_t)fd,
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return 4;
  close(fd);
  CUdeviceptr va;
  if (map_for(handle, bytes, 1, &va)) return 5;
  unsigned char* host = malloc(bytes);
  if (cuMemcpyDtoH(host, va, bytes)) return 6;
  for (size_t i = 0; i < bytes; ++i)
    if (host[i] != (unsigned char)(i * 7 + 3)) return 7;
  memset(host, 0x5c, 4096);
  if (cuMemcpyHtoD(va, host, 4096) || cuCtxSynchronize()) return 8;
  free(host);
  if (unmap_and_free(va, bytes) || cuMemRelease(handle)) return 9;
  return 0;
}

struct bind_in_thread {
  CUcontext context; /* made current in the thread first, as in the caller's */
  CUmemGenericAllocationHandle group, memory;
  size_t bytes;
  CUresult result;
  int returned;       /* set (release) once the bind returned */
  double returned_at; /* when it did */
};

static void* bind_memory(void* p) {
  struct bind_in_thread* b = p;
  b->result = cuCtxSetCurrent(b->context);
  if (b->result == CUDA_SUCCESS)
    b->result = cuMulticastBindMem(b->group, 0, b->memory, 0, b->bytes, 0);
  b->returned_at = now_ms();
  __atomic_store_n(&b->returned, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* A multicast object for devices 0 and 1: a bind waits until both were added (the driver's
 * documented blocking, which a rank that declines after the create turns into a hang of its
 * peers); then both bind, the object maps for both, and the engine's probe kernel, storing 16
 * bytes through it from device 0 (two of its f32 lanes NaN patterns), reaches both devices'
 * memory bit for bit. Where the GPU has no multicast or there is one GPU, it is skipped. */
static int multicast_binds_and_maps_wait_for_every_device(void) {
  int multicast = 0, count = 0;
  CHECK(cuDeviceGetAttribute(&multicast, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0));
  CHECK(cuDeviceGetCount(&count));
  if (!multicast || count < 2) return 2;
  CUmulticastObjectProp prop;
  memset(&prop, 0, sizeof prop);
  prop.numDevices = 2;
  prop.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0, memory_granularity = 0;
  CHECK(cuMulticastGetGranularity(&granularity, &prop, CU_MULTICAST_GRANULARITY_MINIMUM));
  CUmemAllocationProp mem_prop[2] = {device_memory(0, 1), device_memory(1, 1)};
  CHECK(cuMemGetAllocationGranularity(&memory_granularity, &mem_prop[0],
                                      CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT(granularity > 0 && memory_granularity > 0);
  size_t bytes = granularity;
  while (bytes % memory_granularity) bytes += granularity;
  prop.size = bytes;
  CUmemGenericAllocationHandle group, memory[2];
  CHECK(cuMulticastCreate(&group, &prop));
  for (int d = 0; d < 2; ++d) CHECK(cuMemCreate(&memory[d], bytes, &mem_prop[d], 0));
  CHECK(cuMulticastAddDevice(group, 0));
  CUcontext context;
  CHECK(cuCtxGetCurrent(&context));
  struct bind_in_thread bind = {context, group, memory[0], bytes, CUDA_ERROR_UNKNOWN, 0, 0};
  pthread_t thread;
  EXPECT(pthread_create(&thread, NULL, bind_memory, &bind) == 0);
  usleep(300 * 1000);
  const double added_at = now_ms();
  const int waited = __atomic_load_n(&bind.returned, __ATOMIC_ACQUIRE) == 0;
  CHECK(cuMulticastAddDevice(group, 1));
  pthread_join(thread, NULL);
  EXPECT(waited);
  EXPECT(bind.result == CUDA_SUCCESS && bind.returned_at >= added_at);
  CHECK(cuMulticastBindMem(group, 0, memory[1], 0, bytes, 0));
  CUdeviceptr va;
  CHECK(map_for(group, bytes, 2, &va));
  CUmodule module;
  CUfunction probe;
  CHECK(cuModuleLoadData(&module, kMulticastProbePtx));
  CHECK(cuModuleGetFunction(&probe, module, "ncclStragglarMulticastProbe"));
  struct {
    uint64_t multicast;
    uint32_t token, rank;
  } probe_args = {va, 0x5347d00du, 1};
  void* params[] = {&probe_args};
  CHECK(cuLaunchKernel(probe, 1, 1, 1, 32, 1, 1, 0, 0, params, NULL));
  CHECK(cuCtxSynchronize());
  const uint32_t want[4] = {0x5347d00du, 1, ~0x5347d00du, ~1u};
  for (int d = 0; d < 2; ++d) {
    CUdeviceptr mine;
    uint32_t got[4];
    CHECK(map_for(memory[d], bytes, 2, &mine));
    CHECK(cuMemcpyDtoH(got, mine + 16, sizeof got));
    CHECK(unmap_and_free(mine, bytes));
    EXPECT(memcmp(got, want, sizeof got) == 0);
  }
  CHECK(cuModuleUnload(module));
  CHECK(unmap_and_free(va, bytes));
  for (int d = 0; d < 2; ++d) CHECK(cuMulticastUnbind(group, d, 0, bytes));
  for (int d = 0; d < 2; ++d) CHECK(cuMemRelease(memory[d]));
  CHECK(cuMemRelease(group));
  return 1;
}

/* `--multicast-plain-store`: maps a one-device multicast object and stores to it with a plain
 * store, which the emulated GPU must end the process for. */
static int multicast_plain_store(void) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx))
    return 3;
  CUmulticastObjectProp prop;
  memset(&prop, 0, sizeof prop);
  prop.numDevices = 1;
  size_t bytes = 0;
  if (cuMulticastGetGranularity(&bytes, &prop, CU_MULTICAST_GRANULARITY_MINIMUM)) return 4;
  prop.size = bytes;
  CUmemGenericAllocationHandle group, memory;
  CUmemAllocationProp mem_prop = device_memory(0, 0);
  CUdeviceptr va;
  if (cuMulticastCreate(&group, &prop) || cuMemCreate(&memory, bytes, &mem_prop, 0) ||
      cuMulticastAddDevice(group, 0) || cuMulticastBindMem(group, 0, memory, 0, bytes, 0) ||
      map_for(group, bytes, 1, &va))
    return 5;
  *(volatile int*)va = 1;
  return 0;
}

/* The emulation's litmus kernel (kernel_source.cpp), declared for the emulated driver. */
static const char kLitmusDecl[] =
    ".version 8.0\n"
    ".target sm_90\n"
    ".address_size 64\n"
    ".visible .entry stragglarEmuLitmus(.param .align 8 .b8 args[16])\n"
    "{\n"
    "  ret;\n"
    "}\n";

/* Shapes 3 and 4 of the litmus kernel: once its reader said it started (`words[14]`, read by
 * copies on `side`), sets the data (`words[0]`), then the flag (`words[4]`), on `side`. */
static int write_litmus_by_copy_engine(CUdeviceptr words, CUstream side) {
  uint32_t started = 0;
  const double deadline = now_ms() + 10000;
  while (!started) {
    EXPECT(now_ms() < deadline);
    CHECK(cuMemcpyDtoHAsync(&started, words + 14 * sizeof(uint32_t), sizeof started, side));
    CHECK(cuStreamSynchronize(side));
  }
  CHECK(cuMemsetD32Async(words, 1, 1, side));
  CHECK(cuMemsetD32Async(words + 4 * sizeof(uint32_t), 1, 1, side));
  return 1;
}

/* Runs the litmus kernel's shape `shape` over fresh zeroed words; `reads` gets the reader's
 * four reads of the data, `polls` how many loads of the flag it made. */
static int run_litmus(CUfunction litmus, uint32_t shape, uint32_t reads[4], uint32_t* polls) {
  CUdeviceptr words;
  uint32_t host[16];
  CUstream own, side;
  CHECK(cuMemAlloc(&words, sizeof host));
  CHECK(cuMemsetD32(words, 0, 16));
  CHECK(cuStreamCreate(&own, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
  struct {
    uint64_t words;
    uint32_t shape, unused;
  } args = {words, shape, 0};
  void* params[] = {&args};
  CHECK(cuLaunchKernel(litmus, 1, 1, 1, 2, 1, 1, 0, own, params, NULL));
  if (shape >= 3 && !write_litmus_by_copy_engine(words, side)) {
    /* The reader is released before the check fails: left spinning, it would hold every
     * later check that waits for the device. */
    cuMemsetD32Async(words + 4 * sizeof(uint32_t), 1, 1, side);
    cuCtxSynchronize();
    return 0;
  }
  CHECK(cuCtxSynchronize());
  CHECK(cuStreamDestroy(own));
  CHECK(cuStreamDestroy(side));
  CHECK(cuMemcpyDtoH(host, words, sizeof host));
  CHECK(cuMemFree(words));
  memcpy(reads, host + 8, 4 * sizeof(uint32_t));
  *polls = host[12];
  return 1;
}

/* Emulation only: a strong load may return a word's value before a store that nothing ordered
 * before it, never older than a value its thread saw, and a poll sees the store in the end.
 * Thread 0 stores the data (volatile), then releases the flag; thread 1 waits for the flag,
 * then reads the data four times with relaxed loads. With the flag polled relaxed, nothing
 * orders the data's store before those reads: the first returns 0, and once one returns 1
 * every later one does. With the flag acquired, every read returns 1. With the flag polled
 * relaxed but the first read an atomic add, every read returns 1: an atomic reads the latest
 * value, and the loads after it never read an older one. (Without a seed the emulation runs
 * thread 0 to its end first, and the flag takes 3 polls; a seeded schedule may have thread 1
 * poll sooner, but the data reads are the same. STRAGGLAR_EMU_WEAK_MEMORY=stores, the machine
 * without stale loads, reads 1 four times where the first must be 0.) The same holds where the
 * host's copy engine sets the data, then the flag, on another stream while the reader runs:
 * polled relaxed, the first read returns 0 (a set is recorded as a kernel's store is);
 * acquired, every read returns 1 (an acquire of bytes a copy wrote sees what the copy's stream
 * did before it). */
static int strong_loads_may_be_stale_until_ordered(void) {
  CUmodule module;
  CUfunction litmus;
  CHECK(cuModuleLoadData(&module, kLitmusDecl));
  CHECK(cuModuleGetFunction(&litmus, module, "stragglarEmuLitmus"));
  uint32_t reads[4], polls = 0;
  if (!run_litmus(litmus, 0, reads, &polls)) return 0;
  printf("  flag polled relaxed: %u polls, then the data read %u %u %u %u\n", polls, reads[0],
         reads[1], reads[2], reads[3]);
  EXPECT(polls > 1);
  EXPECT(reads[0] == 0);
  EXPECT(reads[3] == 1);
  for (int i = 1; i < 4; ++i) EXPECT(reads[i] >= reads[i - 1]);
  for (uint32_t shape = 1; shape <= 2; ++shape) {
    if (!run_litmus(litmus, shape, reads, &polls)) return 0;
    for (int i = 0; i < 4; ++i) EXPECT(reads[i] == 1);
  }
  if (!run_litmus(litmus, 3, reads, &polls)) return 0;
  printf("  set by the copy engine, flag polled relaxed: the data read %u %u %u %u\n", reads[0],
         reads[1], reads[2], reads[3]);
  EXPECT(reads[0] == 0);
  EXPECT(reads[3] == 1);
  for (int i = 1; i < 4; ++i) EXPECT(reads[i] >= reads[i - 1]);
  if (!run_litmus(litmus, 4, reads, &polls)) return 0;
  printf("  set by the copy engine, flag acquired: the data read %u %u %u %u\n", reads[0],
         reads[1], reads[2], reads[3]);
  for (int i = 0; i < 4; ++i) EXPECT(reads[i] == 1);
  CHECK(cuModuleUnload(module));
  return 1;
}

/* Emulation only: what is undefined on a GPU ends the process here. */
static int a_plain_store_to_a_multicast_address_is_trapped(void) {
  const char* args[] = {"--multicast-plain-store", NULL};
  EXPECT(spawn_self(g_self, args, "STRAGGLAR_EMU_MULTICAST=1") == 1000 + SIGABRT);
  return 1;
}

/* A check returns 0 (failed), 1 (passed), 2 (skipped: not on this machine) or 3 (passed, its
 * part that needs a second GPU skipped). */
static void run(const char* name, int (*check)(void)) {
  double t0 = now_ms();
  int ok = check();
  const char* verdict = ok == 2   ? "skipped (not on this machine)"
                        : ok == 3 ? "ok, its second GPU's part skipped (one GPU)"
                        : ok      ? "ok"
                                  : "FAILED";
  printf("%-60s %s (%.0f ms)\n", name, verdict, now_ms() - t0);
  fflush(stdout);
  if (ok == 2) return;
  if (ok)
    g_passed++;
  else
    g_failed++;
}

static int ipc_check(void) { return ipc_maps_memory_across_processes(g_self); }
static int free_under_importer_check(void) { return a_free_under_an_importer_is_reported(g_self); }

/* In a process started with CUDA_DEVICE_MAX_CONNECTIONS=1 (every stream on one hardware
 * queue): stream c runs a 300 ms kernel and records an event, stream a waits on it, and a set
 * on stream b, queued after that wait, waits behind it too (a false dependency: b shares the
 * queue). Returns 1 when the set came late, 0 otherwise. */
static int one_queue_scenario(void) {
  CUdevice dev;
  CUcontext ctx;
  CUmodule module;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx) || cuModuleLoadData(&module, kDelayPtx) ||
      cuModuleGetFunction(&g_delay, module, "ncclStragglarDelay"))
    return 0;
  CUstream a, b, c;
  CUevent done;
  int* word;
  CUdeviceptr dword;
  CHECK(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  CHECK(cuMemHostAlloc((void**)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostGetDevicePointer(&dword, word, 0));
  *word = 0;
  double t0 = now_ms();
  CHECK(delay(c, 300));
  CHECK(cuEventRecord(done, c));
  CHECK(cuStreamWaitEvent(a, done, 0));
  CHECK(cuMemsetD32Async(dword, 5, 1, b));
  while (__atomic_load_n(word, __ATOMIC_SEQ_CST) == 0 && now_ms() - t0 < 1000) usleep(1000);
  double at = now_ms() - t0;
  CHECK(cuCtxSynchronize());
  EXPECT(at >= 250);
  EXPECT(*word == 5);
  return 1;
}

/* In a child process: a kernel writing to address 0 faults; the error comes at the next
 * synchronisation, and is sticky: a later allocation fails with it too. Returns 1 if so. */
static int fault_scenario(void) {
  CUdevice dev;
  CUcontext ctx;
  CUmodule module;
  CUfunction fault;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx) || cuModuleLoadData(&module, kFaultPtx) ||
      cuModuleGetFunction(&fault, module, "ncclStragglarFault"))
    return 0;
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  uint64_t at = 0;
  void* args[] = {&at};
  CHECK(cuLaunchKernel(fault, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
  EXPECT(cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_ADDRESS);
  CUdeviceptr p;
  EXPECT(cuMemAlloc(&p, 4096) == CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT(cuStreamQuery(s) == CUDA_ERROR_ILLEGAL_ADDRESS);
  return 1;
}

static int spawn_with_env(const char* self, const char* flag, const char* setting) {
  const char* args[] = {flag, NULL};
  return spawn_self(self, args, setting);
}

static int a_kernel_fault_is_sticky(void) {
  EXPECT(spawn_with_env(g_self, "--fault", "STRAGGLAR_EMU_KERNEL_FAULT=ncclStragglarFault@1") == 0);
  return 1;
}

static int one_hardware_queue_makes_streams_wait_for_each_other(void) {
  EXPECT(spawn_with_env(g_self, "--one-queue", "CUDA_DEVICE_MAX_CONNECTIONS=1") == 0);
  return 1;
}

/* `--load-module PATH`: loads the CUBIN or PTX in PATH on GPU 0 and says "loaded" (exit 0) or
 * "refused: ERROR" (exit 1): what this driver makes of one of the engine's modules (the
 * emulated one refuses a module that calls a device-runtime function it lacks). */
static int load_module(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    printf("cannot open %s\n", path);
    return 2;
  }
  fseek(f, 0, SEEK_END);
  const long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* image = calloc((size_t)size + 1, 1); /* NUL-terminated, as PTX must be */
  const int read_whole = image && fread(image, 1, (size_t)size, f) == (size_t)size;
  fclose(f);
  CUdevice dev;
  CUcontext ctx;
  CUmodule module;
  if (!read_whole || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx)) {
    printf("no usable CUDA driver, or %s unreadable\n", path);
    free(image);
    return 2;
  }
  const CUresult r = cuModuleLoadData(&module, image);
  free(image);
  if (r != CUDA_SUCCESS) {
    const char* name = "?";
    cuGetErrorName(r, &name);
    printf("refused: %s\n", name);
    return 1;
  }
  cuModuleUnload(module);
  printf("loaded\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--load-module") == 0) return load_module(argv[2]);
  if (argc == 2 && strcmp(argv[1], "--one-queue") == 0) return one_queue_scenario() ? 0 : 2;
  if (argc == 2 && strcmp(argv[1], "--fault") == 0) return fault_scenario() ? 0 : 2;
  if (argc == 2 && strcmp(argv[1], "--export-free") == 0) return export_then_free();
  if (argc == 4 && strcmp(argv[1], "--vmm-child") == 0) return vmm_child(argv[2], argv[3]);
  if (argc == 2 && strcmp(argv[1], "--multicast-plain-store") == 0) return multicast_plain_store();
  if (argc == 4 && strcmp(argv[1], "--ipc-probe") == 0) return ipc_probe_child(argv[2], argv[3]);
  g_self = argv[0];
  CUdevice dev;
  CUcontext ctx;
  CUmodule module;
  char name[128];
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx) || cuDeviceGetName(name, sizeof name, dev)) {
    printf("0 passed, 1 failed: no usable CUDA driver\n");
    return 1;
  }
  g_emulated = strstr(name, "emulated") != NULL;
  int version = 0;
  cuDriverGetVersion(&version);
  printf("driver %d.%d, GPU 0: %s\n", version / 1000, version % 1000 / 10, name);
  if (cuModuleLoadData(&module, kDelayPtx) || cuModuleGetFunction(&g_delay, module, "ncclStragglarDelay")) {
    printf("0 passed, 1 failed: the delay kernel does not load\n");
    return 1;
  }
  run("launches are asynchronous", launches_are_asynchronous);
  run("one stream runs in order", one_stream_runs_in_order);
  run("event waits order streams", event_waits_order_streams);
  run("the legacy stream synchronises with blocking streams only",
      legacy_stream_synchronises_with_blocking_streams_only);
  run("capture forks, joins and replays", capture_forks_joins_and_replays);
  run("an unjoined fork fails the capture", an_unjoined_fork_fails_the_capture);
  run("capture refuses what crosses it", capture_refuses_what_crosses_it);
  run("capture modes decide what is refused", capture_modes_decide_what_is_refused);
  run("a global capture refuses exactly the unsafe calls",
      a_global_capture_refuses_exactly_the_unsafe_calls);
  run("external event nodes order replays and eager work",
      external_event_nodes_order_replays_and_eager_work);
  run("a graph launched on two streams runs once at a time",
      a_graph_launched_on_two_streams_runs_once_at_a_time);
  run("a conditional node runs its body when a kernel says so (CUDA 12.3 on)",
      a_conditional_node_runs_its_body_when_a_kernel_says_so);
  run("cuMemFree waits for the context's work", memory_free_waits_for_the_contexts_work);
  run("IPC maps memory across processes", ipc_check);
  run("one hardware queue makes streams wait for each other",
      one_hardware_queue_makes_streams_wait_for_each_other);
  run("a kernel fault is sticky", a_kernel_fault_is_sticky);
  run("virtual memory maps, and shares by fd", virtual_memory_maps_and_shares_by_fd);
  run("multicast binds and maps wait for every device",
      multicast_binds_and_maps_wait_for_every_device);
  if (g_emulated)
    run("a plain store to a multicast address is trapped (emulation only)",
        a_plain_store_to_a_multicast_address_is_trapped);
  if (g_emulated)
    run("strong loads may be stale until ordered (emulation only)",
        strong_loads_may_be_stale_until_ordered);
  if (g_emulated) run("stale handles and destroyed contexts are errors (emulation only)", stale_handles_are_errors);
  if (g_emulated)
    run("freeing memory another process maps through IPC is reported (emulation only)",
        free_under_importer_check);
  if (g_emulated)
    run("an IPC mapping used by another device's kernel is reported (emulation only)",
        an_ipc_mapping_of_another_device_is_reported);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
