/* The emulated CUDA machine: a libcuda.so.1 that cudarc, the engine and the tests load as they
 * would the real driver. Device memory is host memory (shared, so that IPC handles open in other
 * processes at an address of their own); streams are worker threads that run their work in
 * order and asynchronously to the host; kernels are the host emulation of cuda/, each block an
 * OS thread running its GPU threads as fibers.
 *
 * Internal declarations shared by the driver's files. Every exported function validates its
 * handles against the registries below before it dereferences one, so a bad or destroyed handle
 * is an error code, never a crash. */
#ifndef STRAGGLAR_EMU_H_
#define STRAGGLAR_EMU_H_

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace emu {

/* ------------------------------------------------------------------ the machine ---------- */

/* The machine every process sees: `STRAGGLAR_EMU_GPUS` devices (default 8) of
 * `STRAGGLAR_EMU_SMS` multiprocessors (default 32), compute capability 9.0, every pair
 * P2P-capable with native atomics, and the driver version `STRAGGLAR_EMU_DRIVER_VERSION`
 * (default 13000). Read once, at cuInit. */
struct Machine {
  int devices = 8;
  int sms = 32;
  int multicast = 0; /* CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (STRAGGLAR_EMU_MULTICAST) */
  int driver_version = 13000;
  size_t memory_bytes = size_t(80) << 30;
};
const Machine& machine();
bool initialized();

/* Under MPS (`STRAGGLAR_EMU_MPS=1`, sharing.cpp): the processes of the machine share each
 * device's multiprocessors, held one at a time (waiting while none is free) and given back. */
bool mps_shares_multiprocessors();
void mps_take_multiprocessor(int device);
void mps_give_multiprocessors(int device, int count);

struct Stream;
struct Capture;

/* A device's primary context. Retained by count; a full release destroys it (a later retain
 * makes a new one), and work against a destroyed context answers CONTEXT_IS_DESTROYED. */
struct Context {
  int device = 0;
  int retains = 0;
  bool alive = true;
  /* Hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS` when the context was made, 8 by default,
   * 1-32): streams are spread over them in creation order, and work of every stream on one
   * queue starts in the order it was queued (the false dependencies a shared queue makes). */
  int connections = 8;
  /* Once a kernel of it faulted (an injected illegal address): the sticky error every later
   * call on the context returns, as the real driver's; its queued work is discarded. */
  std::atomic<int> fault{0};
  int next_queue = 0;
  /* Per queue: the last op queued on it (stream, op number), whose start the next waits for. */
  std::vector<std::pair<Stream*, uint64_t>> queue_tails;
  Stream* legacy = nullptr; /* the context's legacy default stream, made on first use */
  std::vector<Stream*> streams; /* every stream created in it (blocking or not) */
};

/* The context on top of the calling thread's stack (null if none). */
Context* current_context();
/* CUDA_SUCCESS with the current live context in *out, or the error a call without one gets. */
CUresult require_context(Context** out);
/* Whether `ctx` is a context handle this process made (alive or not). */
bool is_context(Context* ctx);

/* ------------------------------------------------------------------ fault injection ------ */

/* `STRAGGLAR_EMU_FAIL=name[@device][=code][,...]` makes the exported call `name` (its exact
 * symbol, e.g. cuIpcOpenMemHandle_v2) fail with `code` (default CUDA_ERROR_UNKNOWN), only while
 * the current context's device is `device` when one is given. The result to return, or
 * CUDA_SUCCESS to proceed. */
CUresult injected(const char* name);

/* ------------------------------------------------------------------ streams -------------- */

/* One unit of stream work: runs after every dependency (a stream reaching a sequence number). */
struct Op {
  std::vector<std::pair<Stream*, uint64_t>> deps;
  std::function<void()> run;
  /* The op queued before it on its hardware queue, which must have started first (null:
   * none). */
  std::pair<Stream*, uint64_t> after_start{nullptr, 0};
};

/* A stream: a worker thread that runs its ops in order. `enqueued` and `completed` count ops;
 * an op numbered k is done once completed >= k. Streams are never freed (a destroyed one drains
 * and its worker ends), so a dependency on one stays safe to wait on. */
struct Stream {
  Context* ctx = nullptr;
  unsigned flags = 0; /* CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING */
  bool legacy = false;
  bool destroyed = false;
  std::mutex m;
  std::condition_variable cv;
  std::deque<Op> queue;
  uint64_t enqueued = 0;
  uint64_t started = 0;
  uint64_t completed = 0;
  int hw_queue = 0; /* its context's hardware queue */
  std::thread worker;
  /* Capture state, guarded by the global capture lock. */
  Capture* capture = nullptr;
  std::vector<size_t> tail; /* the capture's nodes later work on this stream depends on */
  /* The handles of `tail` cuStreamGetCaptureInfo last gave out (valid until the next call). */
  std::vector<CUgraphNode> tail_handles;
};

bool is_stream(Stream* s);
/* The stream a handle names (0 and CU_STREAM_LEGACY: the current context's legacy stream;
 * CU_STREAM_PER_THREAD is treated as the legacy stream too), or an error. */
CUresult resolve_stream(CUstream h, Stream** out);
/* Under the driver lock: queues `run` on `s`, or records it as a node of type `type` when `s`
 * captures. */
CUresult submit(Stream* s, std::function<void()> run, CUgraphNodeType type);
/* Under the driver lock: queues `run` on `s` after the ops `deps` name (stream, op number). */
CUresult enqueue_locked(Stream* s, std::vector<std::pair<Stream*, uint64_t>> deps,
                        std::function<void()> run);
/* Waits on the host until `s` has completed op `seq`. */
void wait_for(Stream* s, uint64_t seq);
/* Waits on the host until every op queued so far on every stream of `c` has completed (what
 * cuCtxSynchronize and cuMemFree wait for). Takes the driver lock itself. */
void drain_context(Context* c);
/* Waits on the host until `s` has started op `seq`. */
void wait_started(Stream* s, uint64_t seq);
/* Queues `run` on the context's legacy stream and waits for it (synchronous copies and sets). */
CUresult run_synchronously(std::function<void()> run);

/* ------------------------------------------------------------------ capture -------------- */

/* A conditional handle (cuGraphConditionalHandleCreate): the value an IF node reads when it
 * starts, set by a kernel of the same launch (cudaGraphSetConditional) and, with
 * CU_GRAPH_COND_ASSIGN_DEFAULT, reset to its default at each launch's start. One value per
 * handle, shared by every instantiation of its graph (the real driver keeps one per exec). */
struct Condition {
  unsigned default_value = 0;
  bool assign_default = false;
  std::atomic<unsigned> value{0};
};
/* Under no lock: sets the value of the conditional handle `handle` (the device side of
 * cudaGraphSetConditional, called by a kernel); a handle the driver never made aborts the
 * process, as a kernel's wild store would fault on a GPU. */
void set_conditional(uint64_t handle, unsigned value);

struct Event;
struct Graph;
/* One recorded node: its dependencies (earlier nodes of the same graph), its type and its work. */
struct Node {
  std::vector<size_t> deps;
  std::function<void()> run;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  /* An event node (captured with CU_EVENT_WAIT_EXTERNAL or CU_EVENT_RECORD_EXTERNAL, or added
   * with cuGraphAddEventWaitNode / cuGraphAddEventRecordNode): each launch waits for the
   * event's latest record at the time of the launch, or records the event (the emulation
   * records it at the launch's end, after every node: a stronger order than the node's own
   * place, never a weaker one). */
  Event* wait_external = nullptr;
  Event* record_external = nullptr;
  /* A child graph node's copy of its graph, or a conditional node's body. */
  std::shared_ptr<Graph> body;
  /* A conditional (IF) node: runs `body` when the handle's value is nonzero as it starts. */
  Condition* condition = nullptr;
  /* Destroyed (cuGraphDestroyNode): an empty node with no edges, kept for the indices. */
  bool removed = false;
};
struct NodeRef;
struct Graph {
  std::vector<Node> nodes;
  /* A conditional node's body: holds only kernel, empty, child graph, memset, memcpy and
   * conditional nodes (the real driver's rule), and cannot be destroyed on its own. */
  bool is_body = false;
  /* Conditional handles made on this graph (never freed, as events): reset at each launch of
   * an instantiation. */
  std::vector<Condition*> conditions;
  /* Handles of nodes, made when first given out (index i's at refs[i]). */
  std::vector<std::unique_ptr<NodeRef>> refs;
};
/* What a CUgraphNode points to. */
struct NodeRef {
  Graph* graph;
  size_t index;
};
struct GraphExec {
  std::vector<Node> nodes; /* in creation order (run in a topological order) */
  std::vector<Condition*> conditions;
  /* Its latest launch (stream, op number): the next launch waits for it to end, on any stream,
   * as a graph exec never runs concurrently with itself. */
  std::pair<Stream*, uint64_t> last_launch{nullptr, 0};
};
struct Capture {
  uint64_t id = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  Stream* origin = nullptr;
  Graph* graph = nullptr;
  bool invalidated = false;
  std::vector<Stream*> members; /* streams that joined (origin included) */
};
/* The driver lock: handle registries of streams, events and graphs, capture state, and every
 * enqueue. Never held while work runs or is waited for. */
std::mutex& capture_lock();
/* Under capture_lock: whether a capture forbids a potentially unsafe call (allocation and
 * free, synchronous copy or set, a query or synchronisation of a stream, an event or the
 * context, IPC) from this thread, by its capture mode; if so, every capture that forbids it is
 * invalidated, as the real driver does. */
bool unsafe_call_forbidden();
/* Under capture_lock: records `run` as a node of type `type` of the capture `s` belongs to. */
void capture_node(Stream* s, std::function<void()> run, CUgraphNodeType type);
bool is_graph_exec(GraphExec* g);

/* ------------------------------------------------------------------ events --------------- */

struct Event {
  unsigned flags = 0;
  /* Eager record: the op on `stream` numbered `seq` (null: never recorded, complete). */
  Stream* stream = nullptr;
  uint64_t seq = 0;
  /* Captured record: the capture and node set (capture != null only while the last record
   * was made by a capturing stream). */
  Capture* capture = nullptr;
  std::vector<size_t> nodes;
  std::atomic<uint64_t> time_ns{0}; /* when the recording op ran */
};
bool is_event(Event* e);

/* ------------------------------------------------------------------ memory --------------- */

/* Whether [p, p + bytes) lies in memory the emulated GPUs can address in this process (a
 * device allocation, an open IPC mapping or host-mapped memory). */
bool addressable(uint64_t p, size_t bytes);

/* Memory of the virtual memory API (vmm.cpp) mapped at [p, p + bytes) on `device` and made
 * accessible, its shadow (see memory.cpp) at `shadow` and its history at `history`: copies,
 * sets and kernels reach it as device memory, scope checks and stale loads included;
 * cuMemFree and cuIpcGetMemHandle refuse it. */
void add_mapped_memory(uint64_t p, size_t bytes, int device, uint32_t* shadow, void* history);
/* The bytes of the history of an allocation of `bytes` (a multiple of 16), which a memfd of
 * the virtual memory API keeps after its shadow. */
size_t history_bytes_of(size_t bytes);
/* Lets a multimem store of `n` bytes (a multiple of 4) from `src` land at `at`, inside the
 * member allocation whose bytes start at `base` and whose history is at `history`, made at
 * `stored_at`: written word by word, and remembered as landed through the multicast proxy
 * (a load sees it only through an alias view that covers it; weak_memory.h). */
void land_multimem(unsigned char* at, const void* src, uint32_t n, uint64_t stored_at,
                   const unsigned char* base, void* history);
/* Forgets the mapping recorded at `p` (nothing if none). */
void remove_mapped_memory(uint64_t p);

/* ------------------------------------------------------------------ kernels -------------- */

/* ------------------------------------------------------------------ time ----------------- */
uint64_t now_ns();

}  // namespace emu

/* Fails the call as STRAGGLAR_EMU_FAIL asks (see `injected`). */
#define EMU_FAULT(name)                          \
  do {                                           \
    CUresult emu_fault_ = emu::injected(name);   \
    if (emu_fault_ != CUDA_SUCCESS) return emu_fault_; \
  } while (0)
#define EMU_REQUIRE_INIT()                                  \
  do {                                                      \
    if (!emu::initialized()) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)

#endif /* STRAGGLAR_EMU_H_ */
