/* Streams, events, host functions and synchronisation: work on one stream runs in order on the
 * stream's worker thread, asynchronously to the host; the legacy default stream waits for, and
 * is waited for by, the blocking streams of its context; non-blocking streams do not
 * synchronise with it. */
#include "emu.h"
#include "schedule.h"

namespace emu {

namespace {
/* The driver lock: handle registries, capture state, and every enqueue (so that the legacy
 * stream's implicit dependencies are taken at one instant). Never held while waiting for work
 * or running it. */
std::mutex* g_driver = new std::mutex();
std::set<Stream*>* g_streams = new std::set<Stream*>();
std::set<Event*>* g_events = new std::set<Event*>();

/* Seeded scheduling: a stream's worker waits a random while (below 100 us) before one op in
 * four. Streams are numbered in creation order within the process. */
void worker_main(Stream* s, uint64_t number) {
  Rng choices = rng_for(kChoiceStream, number, 0);
  const bool seeded = schedule_seed() != 0;
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> l(s->m);
      s->cv.wait(l, [&] { return !s->queue.empty() || s->destroyed; });
      if (s->queue.empty()) return; /* destroyed and drained */
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    /* Its hardware queue dispatches in order: the op queued before it there starts first,
     * and this one starts once its own dependencies are met (a wait blocks the queue). */
    if (seeded && choices.one_in(4)) random_sleep(choices, 100);
    if (op.after_start.first) wait_started(op.after_start.first, op.after_start.second);
    for (auto& d : op.deps) wait_for(d.first, d.second);
    {
      std::lock_guard<std::mutex> l(s->m);
      s->started++;
    }
    s->cv.notify_all();
    /* A context whose kernel faulted runs nothing more: its queued work is discarded. */
    if (op.run && !s->ctx->fault.load()) op.run();
    {
      std::lock_guard<std::mutex> l(s->m);
      s->completed++;
    }
    s->cv.notify_all();
  }
}

Stream* new_stream(Context* ctx, unsigned flags, bool legacy) {
  Stream* s = new Stream();
  s->ctx = ctx;
  if (ctx->queue_tails.empty()) ctx->queue_tails.assign((size_t)ctx->connections, {nullptr, 0});
  s->hw_queue = ctx->next_queue++ % ctx->connections;
  s->flags = flags;
  s->legacy = legacy;
  static uint64_t streams_made = 0; /* under the driver lock */
  s->worker = std::thread(worker_main, s, ++streams_made);
  s->worker.detach();
  g_streams->insert(s);
  if (!legacy) ctx->streams.push_back(s);
  return s;
}

/* Under the driver lock: the context's legacy stream, made on first use. */
Stream* legacy_of(Context* ctx) {
  if (!ctx->legacy) ctx->legacy = new_stream(ctx, 0, true);
  return ctx->legacy;
}

}  // namespace

/* Under the driver lock: queues an op on an eager (non-capturing) stream with the legacy
 * stream's implicit dependencies. */
CUresult enqueue_locked(Stream* s, std::vector<std::pair<Stream*, uint64_t>> deps,
                        std::function<void()> run) {
  if (s->legacy) {
    for (Stream* b : s->ctx->streams) {
      if (b->destroyed || (b->flags & CU_STREAM_NON_BLOCKING)) continue;
      if (b->capture) {
        b->capture->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
      }
      deps.emplace_back(b, b->enqueued);
    }
  } else if (!(s->flags & CU_STREAM_NON_BLOCKING) && s->ctx->legacy) {
    deps.emplace_back(s->ctx->legacy, s->ctx->legacy->enqueued);
  }
  auto& tail = s->ctx->queue_tails[(size_t)s->hw_queue];
  {
    std::lock_guard<std::mutex> l(s->m);
    Op op;
    op.deps = std::move(deps);
    op.run = std::move(run);
    if (tail.first != s) op.after_start = tail; /* the same stream orders it anyway */
    s->queue.push_back(std::move(op));
    s->enqueued++;
    tail = {s, s->enqueued};
  }
  s->cv.notify_all();
  return CUDA_SUCCESS;
}

namespace {

bool capture_active(Stream* s) { return s->capture != nullptr; }

/* Under the driver lock: fails a query or synchronisation of a capturing stream (invalidating
 * its capture, as the real driver does), or of any stream while a capture forbids this
 * thread's unsafe calls. */
CUresult refuse_if_capturing(Stream* s) {
  if (capture_active(s)) {
    s->capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return unsafe_call_forbidden() ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}
}  // namespace

std::mutex& capture_lock() { return *g_driver; }

bool is_stream(Stream* s) { return g_streams->count(s) != 0; }
bool is_event(Event* e) { return g_events->count(e) != 0; }

/* Under the driver lock. */
CUresult resolve_stream(CUstream h, Stream** out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    Context* c = nullptr;
    CUresult r = require_context(&c);
    if (r != CUDA_SUCCESS) return r;
    *out = legacy_of(c);
    return CUDA_SUCCESS;
  }
  Stream* s = (Stream*)h;
  if (!is_stream(s) || s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
  if (!s->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (int fault = s->ctx->fault.load()) return (CUresult)fault;
  *out = s;
  return CUDA_SUCCESS;
}

/* Under the driver lock. */
CUresult submit(Stream* s, std::function<void()> run, CUgraphNodeType type) {
  if (!s->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (s->capture) {
    if (s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    capture_node(s, std::move(run), type);
    return CUDA_SUCCESS;
  }
  return enqueue_locked(s, {}, std::move(run));
}

void wait_started(Stream* s, uint64_t seq) {
  std::unique_lock<std::mutex> l(s->m);
  s->cv.wait(l, [&] { return s->started >= seq; });
}

void wait_for(Stream* s, uint64_t seq) {
  std::unique_lock<std::mutex> l(s->m);
  s->cv.wait(l, [&] { return s->completed >= seq; });
}

CUresult run_synchronously(std::function<void()> run) {
  Stream* s = nullptr;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> g(*g_driver);
    if (unsafe_call_forbidden()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CUresult r = resolve_stream(nullptr, &s);
    if (r != CUDA_SUCCESS) return r;
    r = enqueue_locked(s, {}, std::move(run));
    if (r != CUDA_SUCCESS) return r;
    seq = s->enqueued;
  }
  wait_for(s, seq);
  return CUDA_SUCCESS;
}

void drain_context(Context* c) {
  std::vector<std::pair<Stream*, uint64_t>> all;
  {
    std::lock_guard<std::mutex> g(*g_driver);
    for (Stream* s : c->streams) all.emplace_back(s, s->enqueued);
    if (c->legacy) all.emplace_back(c->legacy, c->legacy->enqueued);
  }
  for (auto& p : all) wait_for(p.first, p.second);
}

}  // namespace emu

using namespace emu;

extern "C" {

CUresult cuStreamCreate(CUstream* ph, unsigned int flags) {
  EMU_FAULT("cuStreamCreate");
  if (!ph) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
  Context* c = nullptr;
  CUresult r = require_context(&c);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> g(*g_driver);
  *ph = (CUstream)new_stream(c, flags, false);
  return CUDA_SUCCESS;
}

CUresult cuStreamCreateWithPriority(CUstream* ph, unsigned int flags, int priority) {
  EMU_FAULT("cuStreamCreateWithPriority");
  (void)priority;
  return cuStreamCreate(ph, flags);
}

CUresult cuStreamDestroy_v2(CUstream h) {
  EMU_FAULT("cuStreamDestroy_v2");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(*g_driver);
  Stream* s = (Stream*)h;
  if (!s || !is_stream(s) || s->legacy || s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capture) s->capture->invalidated = true;
  g_streams->erase(s);
  auto& list = s->ctx->streams;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == s) {
      list.erase(list.begin() + (long)i);
      break;
    }
  }
  {
    std::lock_guard<std::mutex> l(s->m);
    s->destroyed = true; /* the worker drains what was queued, then ends */
  }
  s->cv.notify_all();
  return CUDA_SUCCESS;
}

CUresult cuStreamGetFlags(CUstream h, unsigned int* flags) {
  EMU_FAULT("cuStreamGetFlags");
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(*g_driver);
  Stream* s = nullptr;
  CUresult r = resolve_stream(h, &s);
  if (r != CUDA_SUCCESS) return r;
  *flags = s->flags;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(CUstream h, CUcontext* pctx) {
  EMU_FAULT("cuStreamGetCtx");
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(*g_driver);
  Stream* s = nullptr;
  CUresult r = resolve_stream(h, &s);
  if (r != CUDA_SUCCESS) return r;
  *pctx = (CUcontext)s->ctx;
  return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream h) {
  EMU_FAULT("cuStreamQuery");
  std::lock_guard<std::mutex> g(*g_driver);
  Stream* s = nullptr;
  CUresult r = resolve_stream(h, &s);
  if (r != CUDA_SUCCESS) return r;
  r = refuse_if_capturing(s);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> l(s->m);
  return s->completed >= s->enqueued ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamSynchronize(CUstream h) {
  EMU_FAULT("cuStreamSynchronize");
  Stream* s = nullptr;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> g(*g_driver);
    CUresult r = resolve_stream(h, &s);
    if (r != CUDA_SUCCESS) return r;
    r = refuse_if_capturing(s);
    if (r != CUDA_SUCCESS) return r;
    seq = s->enqueued;
  }
  wait_for(s, seq);
  return (CUresult)s->ctx->fault.load(); /* a fault while it waited is reported now */
}

CUresult cuCtxSynchronize(void) {
  EMU_FAULT("cuCtxSynchronize");
  Context* c = nullptr;
  {
    std::lock_guard<std::mutex> g(*g_driver);
    CUresult r = require_context(&c);
    if (r != CUDA_SUCCESS) return r;
    if (unsafe_call_forbidden()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  drain_context(c);
  return (CUresult)c->fault.load();
}

/* Queues `fn(data)` on stream `h`, in stream order; a capture records it as a node of `type`. */
static CUresult queue_host_work(CUstream h, CUhostFn fn, void* data, CUgraphNodeType type) {
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(*g_driver);
  Stream* s = nullptr;
  CUresult r = resolve_stream(h, &s);
  if (r != CUDA_SUCCESS) return r;
  return submit(s, [fn, data] { fn(data); }, type);
}

CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void* data) {
  EMU_FAULT("cuLaunchHostFunc");
  return queue_host_work(h, fn, data, CU_GRAPH_NODE_TYPE_HOST);
}

/* Not in the real driver: the loopback NCCL's kernels. `fn(data)` runs in stream order like a
 * host function, but a capture records it as a kernel node, as it records NCCL's kernels (so
 * a conditional body may hold it). */
CUresult cuEmuLaunchNative(CUstream h, CUhostFn fn, void* data) {
  EMU_FAULT("cuEmuLaunchNative");
  return queue_host_work(h, fn, data, CU_GRAPH_NODE_TYPE_KERNEL);
}

CUresult cuEventCreate(CUevent* ph, unsigned int flags) {
  EMU_FAULT("cuEventCreate");
  if (!ph) return CUDA_ERROR_INVALID_VALUE;
  Context* c = nullptr;
  CUresult r = require_context(&c);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> g(*g_driver);
  Event* e = new Event();
  e->flags = flags;
  g_events->insert(e);
  *ph = (CUevent)e;
  return CUDA_SUCCESS;
}

/* Events are never freed (a queued record may still write its time); a destroyed handle is
 * forgotten, so later uses answer INVALID_HANDLE. */
CUresult cuEventDestroy_v2(CUevent h) {
  EMU_FAULT("cuEventDestroy_v2");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(*g_driver);
  Event* e = (Event*)h;
  if (!e || !is_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  g_events->erase(e);
  return CUDA_SUCCESS;
}

/* An event record: eager, or in a capture a record of the captured work (an external one,
 * CU_EVENT_RECORD_EXTERNAL, a node every launch of the graph records the event at). */
static CUresult record_event(CUevent h, CUstream hs, bool external) {
  std::lock_guard<std::mutex> g(*g_driver);
  Event* e = (Event*)h;
  if (!e || !is_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  if (s->capture) {
    if (s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (external) {
      capture_node(s, {}, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
      s->capture->graph->nodes.back().record_external = e;
      return CUDA_SUCCESS;
    }
    e->capture = s->capture;
    e->nodes = s->tail;
    return CUDA_SUCCESS;
  }
  r = enqueue_locked(s, {}, [e] { e->time_ns.store(now_ns(), std::memory_order_release); });
  if (r != CUDA_SUCCESS) return r;
  e->capture = nullptr;
  e->nodes.clear();
  e->stream = s;
  e->seq = s->enqueued;
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent h, CUstream hs) {
  EMU_FAULT("cuEventRecord");
  return record_event(h, hs, false);
}

CUresult cuEventRecordWithFlags(CUevent h, CUstream hs, unsigned int flags) {
  EMU_FAULT("cuEventRecordWithFlags");
  if (flags != 0 && flags != CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_NOT_SUPPORTED;
  return record_event(h, hs, flags == CU_EVENT_RECORD_EXTERNAL);
}

/* Under the driver lock: the eager record an event waits for (stream null: none). */
static CUresult event_target(Event* e, Stream** s, uint64_t* seq) {
  if (!e || !is_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (e->capture) return CUDA_ERROR_CAPTURED_EVENT;
  if (unsafe_call_forbidden()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (e->stream)
    if (int fault = e->stream->ctx->fault.load()) return (CUresult)fault;
  *s = e->stream;
  *seq = e->seq;
  return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent h) {
  EMU_FAULT("cuEventQuery");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(*g_driver);
  Stream* s = nullptr;
  uint64_t seq = 0;
  CUresult r = event_target((Event*)h, &s, &seq);
  if (r != CUDA_SUCCESS || !s) return r;
  std::lock_guard<std::mutex> l(s->m);
  return s->completed >= seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent h) {
  EMU_FAULT("cuEventSynchronize");
  EMU_REQUIRE_INIT();
  Stream* s = nullptr;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> g(*g_driver);
    CUresult r = event_target((Event*)h, &s, &seq);
    if (r != CUDA_SUCCESS || !s) return r;
  }
  wait_for(s, seq);
  return (CUresult)s->ctx->fault.load();
}

CUresult cuEventElapsedTime_v2(float* ms, CUevent hstart, CUevent hend) {
  EMU_FAULT("cuEventElapsedTime_v2");
  EMU_REQUIRE_INIT();
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(*g_driver);
  Event* a = (Event*)hstart;
  Event* b = (Event*)hend;
  if (!a || !b || !is_event(a) || !is_event(b)) return CUDA_ERROR_INVALID_HANDLE;
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->stream || !b->stream) return CUDA_ERROR_INVALID_HANDLE;
  for (Event* e : {a, b}) {
    std::lock_guard<std::mutex> l(e->stream->m);
    if (e->stream->completed < e->seq) return CUDA_ERROR_NOT_READY;
  }
  uint64_t t0 = a->time_ns.load(std::memory_order_acquire);
  uint64_t t1 = b->time_ns.load(std::memory_order_acquire);
  *ms = (float)(((double)t1 - (double)t0) / 1e6);
  return CUDA_SUCCESS;
}

#undef cuEventElapsedTime
CUresult cuEventElapsedTime(float* ms, CUevent hstart, CUevent hend) {
  EMU_FAULT("cuEventElapsedTime");
  return cuEventElapsedTime_v2(ms, hstart, hend);
}

CUresult cuStreamWaitEvent(CUstream hs, CUevent he, unsigned int flags) {
  EMU_FAULT("cuStreamWaitEvent");
  if (flags != 0 && flags != CU_EVENT_WAIT_EXTERNAL) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> g(*g_driver);
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  Event* e = (Event*)he;
  if (!e || !is_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (flags == CU_EVENT_WAIT_EXTERNAL && s->capture) {
    /* An event wait node: every launch of the graph waits for the event's latest record as of
     * that launch. */
    if (s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    capture_node(s, {}, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
    s->capture->graph->nodes.back().wait_external = e;
    return CUDA_SUCCESS;
  }
  if (e->capture) {
    /* A fork or a join of a capture. */
    if (s->capture == e->capture) {
      for (size_t n : e->nodes) s->tail.push_back(n);
      return CUDA_SUCCESS;
    }
    if (s->capture) {
      /* Two captures would become one. */
      e->capture->invalidated = true;
      s->capture->invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    }
    if (s->legacy) {
      e->capture->invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    s->capture = e->capture;
    s->tail = e->nodes;
    e->capture->members.push_back(s);
    return CUDA_SUCCESS;
  }
  if (s->capture) {
    /* Waiting on uncaptured work from a capturing stream crosses the capture's boundary. */
    s->capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  if (!e->stream) return CUDA_SUCCESS; /* never recorded: nothing to wait for */
  return enqueue_locked(s, {{e->stream, e->seq}}, nullptr);
}

}  // extern "C"
