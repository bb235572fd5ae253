/* A loopback NCCL for the emulated GPU: a libnccl.so.2 whose ranks are processes of one host.
 * Ranks meet through a shared-memory segment named in the unique id; every collective is a host
 * function queued on the caller's stream (so it runs in stream order), captured into graphs as
 * a kernel node between two event nodes, as NCCL's kernels are (queue_work, launch); it moves
 * data through the emulated device memory (host memory) and the segment's per-rank exchange
 * slots, one chunk at a time. A peer process that dies, or a peer
 * that aborts, fails the collective with an error (ncclCommGetAsyncError) instead of a hang.
 *
 * Only the emulated GPU can use it: its device pointers must be host addresses. */
#include <cuda.h>
#include <dlfcn.h>

#include "nccl.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <poll.h>
#include <random>
#include <signal.h>
#include <string>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <thread>
#include <time.h>
#include <unistd.h>
#include <vector>

namespace {

constexpr int kMaxRanks = 64;
/* Bytes each rank exchanges per round. */
constexpr size_t kSlotBytes = size_t(1) << 20;
constexpr uint32_t kMagic = 0x4c474e53; /* "SNGL" */
/* The version this library reports: the NCCL whose API it follows. */
constexpr int kVersion = 23203;

/* One rank's words in the segment. `arrived` and `left` count exchange rounds: a rank has put
 * its contribution to round r in its slot once arrived >= r, and is done reading round r's
 * slots once left >= r; `failed` is raised by a rank that aborted or failed. */
struct RankWords {
  std::atomic<int64_t> pid;
  std::atomic<int32_t> device;
  std::atomic<uint32_t> failed;
  std::atomic<uint64_t> arrived;
  std::atomic<uint64_t> left;
};

struct Segment {
  uint32_t magic;
  int32_t nranks;
  std::atomic<uint32_t> joined;
  RankWords ranks[kMaxRanks];
  /* then nranks slots of kSlotBytes */
};

size_t segment_bytes(int nranks) {
  return (sizeof(Segment) + 4095) / 4096 * 4096 + (size_t)nranks * kSlotBytes;
}

struct Id {
  uint32_t magic;
  char name[120];
};
static_assert(sizeof(Id) <= NCCL_UNIQUE_ID_BYTES, "a unique id is 128 bytes");

std::mutex g_error_lock;
std::string g_last_error;

void set_error(const std::string& text) {
  std::lock_guard<std::mutex> g(g_error_lock);
  g_last_error = text;
  fprintf(stderr, "loopback NCCL: %s\n", text.c_str());
}

uint64_t now_ns() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

}  // namespace

struct ncclComm {
  int rank = 0;
  int nranks = 0;
  int device = 0;
  bool blocking = true;
  std::string name;
  Segment* seg = nullptr;
  size_t seg_bytes = 0;
  std::vector<int> pidfds; /* one per peer, -1 for self or where pidfd_open is not available */
  /* ncclSuccess, ncclInProgress (nonblocking init), or the error that failed the comm. */
  std::atomic<int> state{ncclSuccess};
  std::atomic<bool> aborted{false};
  std::thread init_thread;
  /* Splits of this communicator so far (a child's segment is named by its parent's, this
   * number and its color). */
  uint64_t splits = 0;
  /* Serialises this comm's collectives (they may be queued on several streams) and numbers
   * the exchange rounds, identically on every rank. */
  std::mutex exec;
  uint64_t round = 0;
  /* Eager collectives run in the order they were issued, whatever their streams (as NCCL's
   * do): each takes the next number when it is queued and waits for its turn when it runs.
   * Captured ones run when their stream reaches them (a graph replays with the arguments it
   * captured, so a number taken at capture would be stale). */
  std::mutex order;
  std::condition_variable turn;
  uint64_t issued = 0;   /* under `order` */
  uint64_t executed = 0; /* under `order` */
  /* NCCL's graph-mixing event (NCCL_GRAPH_MIXING_SUPPORT, on by default): recorded after every
   * eager collective; a captured one is put between a wait node and a record node on it, as
   * NCCL orders captured work after its uncaptured work. Made at the first collective. */
  CUevent serial = nullptr; /* under `order` */

  unsigned char* slot(int r) const {
    return (unsigned char*)seg + (sizeof(Segment) + 4095) / 4096 * 4096 + (size_t)r * kSlotBytes;
  }
};

namespace {

/* Whether peer r's process has ended (a zombie counts: its pidfd is readable). */
bool peer_dead(ncclComm* c, int r) {
  int fd = c->pidfds[r];
  if (fd >= 0) {
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  int64_t pid = c->seg->ranks[r].pid.load();
  return pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Fails the comm (once) with `code`, raising its failed word so peers stop waiting. */
void fail(ncclComm* c, ncclResult_t code, const std::string& why) {
  int expected = ncclSuccess;
  if (c->state.compare_exchange_strong(expected, code)) set_error(why);
  if (c->seg) c->seg->ranks[c->rank].failed.store(1, std::memory_order_release);
}

/* Waits until every rank's word (`arrived` or `left`) reaches `want`; false (with the comm
 * failed) if a peer died, failed or this comm was aborted. */
bool wait_all(ncclComm* c, std::atomic<uint64_t> RankWords::*word, uint64_t want) {
  uint32_t spins = 0;
  uint64_t last_check = now_ns();
  for (int r = 0; r < c->nranks; ++r) {
    while ((c->seg->ranks[r].*word).load(std::memory_order_acquire) < want) {
      if (c->aborted.load()) {
        fail(c, ncclInvalidUsage, "the communicator was aborted");
        return false;
      }
      if (c->seg->ranks[r].failed.load(std::memory_order_acquire)) {
        fail(c, ncclRemoteError, "rank " + std::to_string(r) + " failed or aborted");
        return false;
      }
      if (now_ns() - last_check > 1000000) {
        last_check = now_ns();
        if (peer_dead(c, r)) {
          fail(c, ncclRemoteError, "rank " + std::to_string(r) + " exited");
          return false;
        }
      }
      if (++spins < 64) {
        sched_yield();
      } else {
        struct timespec t = {0, 50000};
        nanosleep(&t, nullptr);
      }
    }
  }
  return true;
}

/* One exchange round: put `bytes` of `mine` into this rank's slot, wait for every rank's, let
 * `consume` read the slots, and say this rank is done with them. */
template <typename Consume>
bool exchange(ncclComm* c, const void* mine, size_t bytes, Consume consume) {
  uint64_t r = ++c->round;
  /* Nobody may still read the slots of round r - 1. */
  if (!wait_all(c, &RankWords::left, r - 1)) return false;
  if (mine) memcpy(c->slot(c->rank), mine, bytes);
  c->seg->ranks[c->rank].arrived.store(r, std::memory_order_release);
  if (!wait_all(c, &RankWords::arrived, r)) return false;
  consume();
  c->seg->ranks[c->rank].left.store(r, std::memory_order_release);
  return true;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    float f = std::ldexp((float)mant, -24);
    return sign ? -f : f;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  float a = std::fabs(f);
  if (std::isnan(f)) return (uint16_t)(sign | 0x7e00u);
  if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
  if (a < std::ldexp(1.0f, -14)) {
    /* Subnormal: a multiple of 2^-24, rounded to nearest even by rint. */
    return (uint16_t)(sign | (uint32_t)std::nearbyint(a * std::ldexp(1.0f, 24)));
  }
  uint32_t ax;
  memcpy(&ax, &a, 4);
  uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
  return (uint16_t)(sign | (((rounded >> 23) - 112) << 10) | ((rounded >> 13) & 0x3ffu));
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if (std::isnan(f)) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

template <typename T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum: case ncclAvg: return (T)(a + b);
    case ncclProd: return (T)(a * b);
    case ncclMax: return a < b ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return a;
  }
}

/* acc = acc (op) other over n elements; `last` applies avg's division. */
template <typename T>
void fold(void* acc, const void* other, size_t n, ncclRedOp_t op, bool last, int nranks) {
  T* a = (T*)acc;
  const T* b = (const T*)other;
  for (size_t i = 0; i < n; ++i) {
    T x, y;
    memcpy(&x, &a[i], sizeof(T));
    memcpy(&y, &b[i], sizeof(T));
    x = combine(x, y, op);
    if (last && op == ncclAvg) x = (T)(x / (T)nranks);
    memcpy(&a[i], &x, sizeof(T));
  }
}

template <uint16_t (*To)(float), float (*From)(uint16_t)>
void fold16(void* acc, const void* other, size_t n, ncclRedOp_t op, bool last, int nranks) {
  uint16_t* a = (uint16_t*)acc;
  const uint16_t* b = (const uint16_t*)other;
  for (size_t i = 0; i < n; ++i) {
    float x = combine(From(a[i]), From(b[i]), op);
    if (last && op == ncclAvg) x /= (float)nranks;
    a[i] = To(x);
  }
}

/* acc (op)= other, n elements of type t. */
void fold_any(ncclDataType_t t, void* acc, const void* other, size_t n, ncclRedOp_t op, bool last,
              int nranks) {
  switch (t) {
    case ncclInt8: fold<int8_t>(acc, other, n, op, last, nranks); break;
    case ncclUint8: fold<uint8_t>(acc, other, n, op, last, nranks); break;
    case ncclInt32: fold<int32_t>(acc, other, n, op, last, nranks); break;
    case ncclUint32: fold<uint32_t>(acc, other, n, op, last, nranks); break;
    case ncclInt64: fold<int64_t>(acc, other, n, op, last, nranks); break;
    case ncclUint64: fold<uint64_t>(acc, other, n, op, last, nranks); break;
    case ncclFloat32: fold<float>(acc, other, n, op, last, nranks); break;
    case ncclFloat64: fold<double>(acc, other, n, op, last, nranks); break;
    case ncclFloat16: fold16<float_to_half, half_to_float>(acc, other, n, op, last, nranks); break;
    case ncclBfloat16: fold16<float_to_bf16, bf16_to_float>(acc, other, n, op, last, nranks); break;
    default: break;
  }
}

enum class Kind { AllReduce, ReduceScatter, AllGather, Broadcast };

/* One collective, as queued: kept alive as long as its host function may run (for ever when
 * captured into a graph, whose replays run it again). */
struct Call {
  ncclComm* comm;
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  bool captured;
  /* Eager calls: the issue number whose turn this call waits for. */
  uint64_t seq;
};

void run_all_reduce(ncclComm* c, const Call& k) {
  size_t es = type_bytes(k.type);
  size_t per = kSlotBytes / es;
  for (size_t at = 0; at < k.count; at += per) {
    size_t n = std::min(per, k.count - at);
    const unsigned char* src = (const unsigned char*)k.send + at * es;
    unsigned char* dst = (unsigned char*)k.recv + at * es;
    bool ok = exchange(c, src, n * es, [&] {
      /* Every rank folds the slots in rank order: bitwise equal results everywhere. */
      std::vector<unsigned char> acc(c->slot(0), c->slot(0) + n * es);
      for (int r = 1; r < c->nranks; ++r)
        fold_any(k.type, acc.data(), c->slot(r), n, k.op, r == c->nranks - 1, c->nranks);
      memcpy(dst, acc.data(), n * es);
    });
    if (!ok) return;
  }
}

/* ReduceScatter: the AllReduce of every rank's whole send buffer (count x nranks), of which
 * rank r keeps chunk r. */
void run_reduce_scatter(ncclComm* c, const Call& k) {
  size_t es = type_bytes(k.type);
  std::vector<unsigned char> all(k.count * c->nranks * es);
  Call whole = k;
  whole.count = k.count * c->nranks;
  whole.recv = all.data();
  run_all_reduce(c, whole);
  memcpy(k.recv, all.data() + (size_t)c->rank * k.count * es, k.count * es);
}

void run_all_gather(ncclComm* c, const Call& k) {
  size_t es = type_bytes(k.type);
  size_t per = kSlotBytes / es;
  std::vector<unsigned char> mine;
  for (size_t at = 0; at < k.count; at += per) {
    size_t n = std::min(per, k.count - at);
    const unsigned char* src = (const unsigned char*)k.send + at * es;
    /* In place, the send buffer is inside recv: copy it out before anything is written. */
    mine.assign(src, src + n * es);
    bool ok = exchange(c, mine.data(), n * es, [&] {
      for (int r = 0; r < c->nranks; ++r)
        memcpy((unsigned char*)k.recv + ((size_t)r * k.count + at) * es, c->slot(r), n * es);
    });
    if (!ok) return;
  }
}

void run_broadcast(ncclComm* c, const Call& k) {
  size_t es = type_bytes(k.type);
  size_t per = kSlotBytes / es;
  for (size_t at = 0; at < k.count; at += per) {
    size_t n = std::min(per, k.count - at);
    const unsigned char* src = (const unsigned char*)k.send + at * es;
    bool ok = exchange(c, c->rank == k.root ? src : nullptr, n * es, [&] {
      memcpy((unsigned char*)k.recv + at * es, c->slot(k.root), n * es);
    });
    if (!ok) return;
  }
}

/* Waits until eager call `seq` is next; false if the comm failed or was aborted first. */
bool await_turn(ncclComm* c, uint64_t seq) {
  std::unique_lock<std::mutex> l(c->order);
  while (c->executed != seq) {
    if (c->aborted.load() || c->state.load() != ncclSuccess) return false;
    c->turn.wait_for(l, std::chrono::milliseconds(1));
  }
  return true;
}

void finish_turn(ncclComm* c) {
  {
    std::lock_guard<std::mutex> l(c->order);
    c->executed++;
  }
  c->turn.notify_all();
}

/* The multiprocessors a collective holds while it runs on the emulated GPU, as NCCL's kernel
 * holds one per channel: LOOPBACK_NCCL_SMS (default 2; 0 holds none). */
int collective_sms() {
  static const int n = [] {
    const char* v = getenv("LOOPBACK_NCCL_SMS");
    return v ? std::max(0, atoi(v)) : 2;
  }();
  return n;
}

/* Holds `count` multiprocessors of `device` for its lifetime, through the emulated driver's own
 * calls (none where the driver has no such calls). */
class HeldSms {
 public:
  HeldSms(int device, int count) : device_(device), count_(count) {
    static auto hold = (void (*)(int, int))dlsym(RTLD_DEFAULT, "cuEmuHoldMultiprocessors");
    static auto release = (void (*)(int, int))dlsym(RTLD_DEFAULT, "cuEmuReleaseMultiprocessors");
    release_ = release;
    if (!hold || !release || count_ <= 0) {
      count_ = 0;
      return;
    }
    hold(device_, count_);
  }
  ~HeldSms() {
    if (count_ > 0) release_(device_, count_);
  }
  HeldSms(const HeldSms&) = delete;
  HeldSms& operator=(const HeldSms&) = delete;

 private:
  int device_;
  int count_;
  void (*release_)(int, int) = nullptr;
};

void run_call(void* arg) {
  Call* k = (Call*)arg;
  ncclComm* c = k->comm;
  if (!k->captured && !await_turn(c, k->seq)) {
    finish_turn(c);
    delete k;
    return;
  }
  {
    HeldSms held(c->device, collective_sms());
    std::lock_guard<std::mutex> g(c->exec);
    if (c->state.load() == ncclSuccess) {
      switch (k->kind) {
        case Kind::AllReduce: run_all_reduce(c, *k); break;
        case Kind::ReduceScatter: run_reduce_scatter(c, *k); break;
        case Kind::AllGather: run_all_gather(c, *k); break;
        case Kind::Broadcast: run_broadcast(c, *k); break;
      }
    }
  }
  if (!k->captured) {
    finish_turn(c);
    delete k;
  }
}

ncclResult_t wait_init(ncclComm* c) {
  if (c->init_thread.joinable() && c->state.load() != ncclInProgress) c->init_thread.join();
  if (c->state.load() == ncclInProgress) {
    c->init_thread.join();
  }
  return (ncclResult_t)c->state.load();
}

/* NCCL's groups: a collective called between ncclGroupStart and the outermost ncclGroupEnd of
 * its thread is checked at once but launched by that ncclGroupEnd, in the order called (so
 * nothing of it runs, or is on a stream, before the group ends), as NCCL does. */
struct Deferred {
  ncclComm* comm;
  Call call;
  cudaStream_t stream;
};
thread_local int group_depth = 0;
thread_local std::vector<Deferred> group_calls;

/* Whether captured collectives are bracketed by event nodes, as NCCL's are by default
 * (NCCL_GRAPH_MIXING_SUPPORT=0 turns it off, as in NCCL). */
bool graph_mixing() {
  static const bool on = [] {
    const char* v = getenv("NCCL_GRAPH_MIXING_SUPPORT");
    return !(v && strcmp(v, "0") == 0);
  }();
  return on;
}

/* Adds an event node on `event` (a wait, or a record) after what `stream`'s capture has so
 * far, and makes it what later captured work depends on: what NCCL does around its captured
 * kernels. */
bool add_event_node(cudaStream_t stream, CUevent event, bool wait) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = nullptr;
  const CUgraphNode* deps = nullptr;
  size_t count = 0;
  CUgraphNode node = nullptr;
  if (cuStreamGetCaptureInfo_v2((CUstream)stream, &status, NULL, &graph, &deps, &count) !=
      CUDA_SUCCESS)
    return false;
  CUresult r = wait ? cuGraphAddEventWaitNode(&node, graph, deps, count, event)
                    : cuGraphAddEventRecordNode(&node, graph, deps, count, event);
  return r == CUDA_SUCCESS &&
         cuStreamUpdateCaptureDependencies((CUstream)stream, &node, 1,
                                           CU_STREAM_SET_CAPTURE_DEPENDENCIES) == CUDA_SUCCESS;
}

/* Queues the collective's work on `stream`: eager, a host function; captured, a kernel node
 * where the emulated driver can record one (LOOPBACK_NCCL_HOST_NODES=1 keeps a host node, as
 * a network proxy's would be). */
CUresult queue_work(cudaStream_t stream, Call* k) {
  static auto native = (CUresult(*)(CUstream, CUhostFn, void*))dlsym(RTLD_DEFAULT, "cuEmuLaunchNative");
  static const bool host_nodes = [] {
    const char* v = getenv("LOOPBACK_NCCL_HOST_NODES");
    return v && strcmp(v, "1") == 0;
  }();
  if (k->captured && native && !host_nodes) return native((CUstream)stream, run_call, k);
  return cuLaunchHostFunc((CUstream)stream, run_call, k);
}

/* Queues `call` on `stream` (its turn numbered now, if eager). */
ncclResult_t launch(ncclComm* c, Call call, cudaStream_t stream) {
  /* Asked through cuStreamGetCaptureInfo_v2, a name the engine does not use, so that a fault
   * injected into the engine's capture query (cuStreamIsCapturing) leaves NCCL working. */
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  if (cuStreamGetCaptureInfo_v2((CUstream)stream, &capturing, NULL, NULL, NULL, NULL) !=
      CUDA_SUCCESS) {
    set_error("the stream is not a stream of this process's current context");
    return ncclUnhandledCudaError;
  }
  call.comm = c;
  call.captured = capturing != CU_STREAM_CAPTURE_STATUS_NONE;
  std::lock_guard<std::mutex> g(c->order);
  if (graph_mixing() && !c->serial && cuEventCreate(&c->serial, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    c->serial = nullptr;
    set_error("cuEventCreate failed");
    return ncclUnhandledCudaError;
  }
  if (call.captured && c->serial && !add_event_node(stream, c->serial, true)) {
    set_error("adding the graph-mixing wait node failed");
    return ncclUnhandledCudaError;
  }
  if (!call.captured) call.seq = c->issued;
  Call* k = new Call(call);
  if (queue_work(stream, k) != CUDA_SUCCESS) {
    delete k;
    /* Later eager calls would wait for this one's turn for ever: the comm fails instead. */
    if (!call.captured) fail(c, ncclUnhandledCudaError, "queueing the collective failed");
    return ncclUnhandledCudaError;
  }
  if (!call.captured) c->issued++;
  if (c->serial) {
    const bool recorded = call.captured ? add_event_node(stream, c->serial, false)
                                        : cuEventRecord(c->serial, (CUstream)stream) == CUDA_SUCCESS;
    if (!recorded) {
      set_error("recording the graph-mixing event failed");
      return ncclUnhandledCudaError;
    }
  }
  return ncclSuccess;
}

ncclResult_t enqueue(ncclComm* c, Call call, cudaStream_t stream) {
  if (!c) return ncclInvalidArgument;
  ncclResult_t state = wait_init(c);
  if (state != ncclSuccess) return state;
  if (type_bytes(call.type) == 0) {
    set_error("unsupported data type");
    return ncclInvalidArgument;
  }
  if ((call.kind == Kind::AllReduce || call.kind == Kind::ReduceScatter) &&
      (call.op < ncclSum || call.op > ncclAvg)) {
    set_error("unsupported reduction op");
    return ncclInvalidArgument;
  }
  if (call.count == 0) return ncclSuccess;
  if (group_depth > 0) {
    group_calls.push_back(Deferred{c, call, stream});
    return ncclSuccess;
  }
  return launch(c, call, stream);
}

/* Joins the segment named in `id` as `rank`, then waits for every rank. */
void rendezvous(ncclComm* c) {
  int fd = shm_open(c->name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return fail(c, ncclSystemError, "shm_open " + c->name + ": " + strerror(errno));
  c->seg_bytes = segment_bytes(c->nranks);
  if (ftruncate(fd, (off_t)c->seg_bytes) != 0) {
    close(fd);
    return fail(c, ncclSystemError, std::string("ftruncate: ") + strerror(errno));
  }
  void* p = mmap(nullptr, c->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return fail(c, ncclSystemError, std::string("mmap: ") + strerror(errno));
  c->seg = (Segment*)p;
  RankWords& me = c->seg->ranks[c->rank];
  if (me.pid.load() != 0) {
    return fail(c, ncclInvalidUsage, "rank " + std::to_string(c->rank) + " joined twice");
  }
  me.device.store(c->device);
  me.pid.store((int64_t)getpid(), std::memory_order_release);
  c->seg->joined.fetch_add(1);
  while (c->seg->joined.load() < (uint32_t)c->nranks) {
    if (c->aborted.load()) return fail(c, ncclInvalidUsage, "aborted during initialisation");
    struct timespec t = {0, 200000};
    nanosleep(&t, nullptr);
  }
  /* Everyone has it open: the name can go (nothing is left in /dev/shm). */
  shm_unlink(c->name.c_str());
  c->pidfds.assign(c->nranks, -1);
  for (int r = 0; r < c->nranks; ++r) {
    while (c->seg->ranks[r].pid.load(std::memory_order_acquire) == 0) sched_yield();
    if (r != c->rank)
      c->pidfds[r] = (int)syscall(SYS_pidfd_open, (pid_t)c->seg->ranks[r].pid.load(), 0);
  }
  int expected = ncclInProgress;
  c->state.compare_exchange_strong(expected, ncclSuccess);
}

ncclResult_t init(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, bool blocking) {
  if (!out) return ncclInvalidArgument;
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
    set_error("nranks or rank out of range");
    return ncclInvalidArgument;
  }
  Id parsed;
  memcpy(&parsed, id.internal, sizeof parsed);
  if (parsed.magic != kMagic || parsed.name[0] != '/') {
    set_error("not a unique id of the loopback NCCL");
    return ncclInvalidArgument;
  }
  CUdevice device = 0;
  if (cuCtxGetDevice(&device) != CUDA_SUCCESS) {
    set_error("no current CUDA context");
    return ncclUnhandledCudaError;
  }
  ncclComm* c = new ncclComm();
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->blocking = blocking;
  c->name.assign(parsed.name, strnlen(parsed.name, sizeof parsed.name));
  c->state.store(ncclInProgress);
  *out = c;
  if (!blocking) {
    c->init_thread = std::thread(rendezvous, c);
    return ncclInProgress;
  }
  rendezvous(c);
  return (ncclResult_t)c->state.load();
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = kVersion;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  static std::atomic<uint32_t> counter{0};
  std::random_device random;
  Id made;
  memset(&made, 0, sizeof made);
  made.magic = kMagic;
  snprintf(made.name, sizeof made.name, "/stragglar-loopback-%d-%u-%08x", (int)getpid(),
           counter.fetch_add(1), (unsigned)random());
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &made, sizeof made);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return init(comm, nranks, id, rank, true);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  bool blocking = true;
  if (config && config->size >= offsetof(ncclConfig_t, blocking) + sizeof(int) &&
      config->blocking != INT_MIN /* NCCL_CONFIG_UNDEF_INT */)
    blocking = config->blocking != 0;
  return init(comm, nranks, id, rank, blocking);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (!comm || !error) return ncclInvalidArgument;
  *error = (ncclResult_t)comm->state.load();
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, Call{nullptr, Kind::AllReduce, send, recv, count, type, op, 0, false, 0},
                 stream);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, Call{nullptr, Kind::ReduceScatter, send, recv, count, type, op, 0, false, 0},
                 stream);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm,
                 Call{nullptr, Kind::AllGather, send, recv, count, type, ncclSum, 0, false, 0},
                 stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (comm && (root < 0 || root >= comm->nranks)) return ncclInvalidArgument;
  return enqueue(comm,
                 Call{nullptr, Kind::Broadcast, send, recv, count, type, ncclSum, root, false, 0},
                 stream);
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) {
    set_error("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--group_depth > 0) return ncclSuccess;
  std::vector<Deferred> calls;
  calls.swap(group_calls);
  ncclResult_t first = ncclSuccess;
  for (const Deferred& d : calls) {
    ncclResult_t r = launch(d.comm, d.call, d.stream);
    if (first == ncclSuccess) first = r;
  }
  return first;
}

/* Every rank's color and key, gathered through the parent on the calling thread (no collective
 * of the parent may be queued meanwhile); members of a color ordered by key, then parent rank,
 * meet in a segment named by the parent's name, the split's number and the color. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  (void)config;
  if (!comm || !newcomm) return ncclInvalidArgument;
  ncclResult_t state = wait_init(comm);
  if (state != ncclSuccess) return state;
  int mine[2] = {color, key};
  std::vector<int> all(2 * (size_t)comm->nranks);
  bool ok;
  {
    std::lock_guard<std::mutex> g(comm->exec);
    ok = exchange(comm, mine, sizeof mine, [&] {
      for (int r = 0; r < comm->nranks; ++r) memcpy(&all[2 * (size_t)r], comm->slot(r), sizeof mine);
    });
  }
  if (!ok) return ncclRemoteError;
  uint64_t split = comm->splits++;
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  std::vector<std::pair<int, int>> members;
  for (int r = 0; r < comm->nranks; ++r)
    if (all[2 * (size_t)r] == color) members.push_back({all[2 * (size_t)r + 1], r});
  std::sort(members.begin(), members.end());
  int rank = 0;
  while (members[(size_t)rank].second != comm->rank) ++rank;
  Id made;
  memset(&made, 0, sizeof made);
  made.magic = kMagic;
  snprintf(made.name, sizeof made.name, "%s-s%llu-c%d", comm->name.c_str(),
           (unsigned long long)split, color);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  memcpy(id.internal, &made, sizeof made);
  return init(newcomm, (int)members.size(), id, rank, true);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  return wait_init(comm);
}

static void release(ncclComm_t comm) {
  if (comm->init_thread.joinable()) comm->init_thread.join();
  shm_unlink(comm->name.c_str()); /* gone already unless a rank never arrived */
  for (int fd : comm->pidfds)
    if (fd >= 0) close(fd);
  /* The segment stays mapped and the comm allocated: a host function still queued or captured
   * may refer to them (the emulation's memory is not reclaimed). */
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  release(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  comm->aborted.store(true);
  if (comm->seg) comm->seg->ranks[comm->rank].failed.store(1, std::memory_order_release);
  release(comm);
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  static thread_local std::string copy;
  std::lock_guard<std::mutex> g(g_error_lock);
  copy = g_last_error;
  return copy.c_str();
}

}  // extern "C"
