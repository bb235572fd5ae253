/* Stream capture and graphs: between cuStreamBeginCapture and cuStreamEndCapture, work on the
 * capturing stream (and on every stream that joined it by waiting on an event recorded in it)
 * becomes nodes of a graph instead of running; cuStreamEndCapture refuses a capture with a fork
 * not joined back to the origin stream; an instantiated graph replays the recorded work, with
 * the recorded arguments, on every cuGraphLaunch. All of it under the driver lock. */
#include "emu.h"
#include "schedule.h"

#include <time.h>

#include <map>

namespace emu {

namespace {
uint64_t g_next_capture = 1;
std::vector<Capture*>* g_captures = new std::vector<Capture*>(); /* active ones */
std::set<Graph*>* g_graphs = new std::set<Graph*>();
std::map<GraphExec*, std::shared_ptr<GraphExec>>* g_execs =
    new std::map<GraphExec*, std::shared_ptr<GraphExec>>();

/* Ends `cap` for every stream in it. */
void leave(Capture* cap) {
  for (Stream* m : cap->members) {
    if (m->capture == cap) {
      m->capture = nullptr;
      m->tail.clear();
    }
  }
  for (size_t i = 0; i < g_captures->size(); ++i) {
    if ((*g_captures)[i] == cap) {
      g_captures->erase(g_captures->begin() + (long)i);
      break;
    }
  }
}

/* Whether every node in `tail` is one of `roots` or an ancestor of one. */
bool joined(const Graph& g, const std::vector<size_t>& roots, const std::vector<size_t>& tail) {
  std::vector<bool> seen(g.nodes.size(), false);
  std::vector<size_t> todo(roots);
  while (!todo.empty()) {
    size_t n = todo.back();
    todo.pop_back();
    if (seen[n]) continue;
    seen[n] = true;
    for (size_t d : g.nodes[n].deps) todo.push_back(d);
  }
  for (size_t n : tail)
    if (!seen[n]) return false;
  return true;
}
/* Runs a graph launch's nodes. Creation order is a topological order: unseeded, they run one
 * after another in it. Seeded, each node runs on a thread of its own once its dependencies
 * have finished, the ready ones started in a random order after random delays (below 100 us),
 * so independent branches run at the same time, as on a GPU. */
void run_nodes(const std::vector<Node>& nodes, uint64_t launch) {
  if (!schedule_seed()) {
    for (const Node& n : nodes)
      if (n.run) n.run();
    return;
  }
  Rng choices = rng_for(kChoiceGraph, launch, 0);
  std::mutex m;
  std::condition_variable cv;
  std::vector<bool> started(nodes.size(), false), finished(nodes.size(), false);
  std::vector<std::thread> running;
  size_t done = 0;
  std::unique_lock<std::mutex> l(m);
  while (done < nodes.size()) {
    std::vector<size_t> ready;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (started[i]) continue;
      bool met = true;
      for (size_t d : nodes[i].deps) met = met && finished[d];
      if (met) ready.push_back(i);
    }
    for (size_t k = ready.size(); k > 1; --k) std::swap(ready[k - 1], ready[choices.below((uint32_t)k)]);
    for (size_t i : ready) {
      started[i] = true;
      const uint32_t delay_us = choices.below(100);
      running.emplace_back([&, i, delay_us] {
        struct timespec t = {0, (long)delay_us * 1000};
        nanosleep(&t, nullptr);
        if (nodes[i].run) nodes[i].run();
        std::lock_guard<std::mutex> g(m);
        finished[i] = true;
        done++;
        cv.notify_all();
      });
    }
    const size_t before = done;
    cv.wait(l, [&] { return done > before; });
  }
  l.unlock();
  for (std::thread& t : running) t.join();
}
}  // namespace

/* The calling thread's capture mode (cuThreadExchangeStreamCaptureMode). */
thread_local CUstreamCaptureMode t_thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* The driver's rule for potentially unsafe calls, by the calling thread's mode: in the global
 * mode (the default) a call is refused while this thread has a capture not begun relaxed, or
 * while any other thread has one begun in the global mode; in the thread-local mode only this
 * thread's own captures count; in the relaxed mode nothing is refused. Every capture that
 * refuses the call is invalidated, another thread's too (that is how a watchdog's event query
 * breaks the capture of the thread beside it). */
bool unsafe_call_forbidden() {
  if (t_thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  bool forbidden = false;
  for (Capture* c : *g_captures) {
    if (c->mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
    const bool mine = c->thread == std::this_thread::get_id();
    const bool counts = mine || (t_thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                                 c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (!counts) continue;
    forbidden = true;
    c->invalidated = true;
  }
  return forbidden;
}

void capture_node(Stream* s, std::function<void()> run) {
  Graph* g = s->capture->graph;
  Node n;
  n.deps = s->tail;
  n.run = std::move(run);
  g->nodes.push_back(std::move(n));
  s->tail.assign(1, g->nodes.size() - 1);
}

bool is_graph_exec(GraphExec* g) { return g_execs->count(g) != 0; }

}  // namespace emu

using namespace emu;

extern "C" {

CUresult cuStreamBeginCapture_v2(CUstream hs, CUstreamCaptureMode mode) {
  EMU_FAULT("cuStreamBeginCapture_v2");
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(capture_lock());
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (s->capture) return CUDA_ERROR_ILLEGAL_STATE;
  Capture* c = new Capture();
  c->id = g_next_capture++;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s;
  c->graph = new Graph();
  c->members.push_back(s);
  g_captures->push_back(c);
  s->capture = c;
  s->tail.clear();
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hs, CUgraph* out) {
  EMU_FAULT("cuStreamEndCapture");
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(capture_lock());
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  Capture* c = s->capture;
  if (!c) return CUDA_ERROR_ILLEGAL_STATE;
  if (c->origin != s) {
    c->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != std::this_thread::get_id())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  *out = nullptr;
  r = CUDA_SUCCESS;
  if (c->invalidated) {
    r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  } else {
    for (Stream* m : c->members) {
      if (m != s && m->capture == c && !joined(*c->graph, s->tail, m->tail)) {
        r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
        break;
      }
    }
  }
  leave(c);
  if (r == CUDA_SUCCESS) {
    g_graphs->insert(c->graph);
    *out = (CUgraph)c->graph;
  } else {
    delete c->graph;
  }
  c->graph = nullptr;
  /* Events recorded in the capture keep pointing at `c`, so it is never freed. */
  return r;
}

/* The calling thread's capture mode, which decides whether another thread's capture refuses
 * its potentially unsafe calls (unsafe_call_forbidden). */
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  EMU_FAULT("cuThreadExchangeStreamCaptureMode");
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      *mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(capture_lock());
  CUstreamCaptureMode previous = t_thread_mode;
  t_thread_mode = *mode;
  *mode = previous;
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hs, CUstreamCaptureStatus* status) {
  EMU_FAULT("cuStreamIsCapturing");
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(capture_lock());
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  if (!s->capture)
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
  else
    *status = s->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                      : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCaptureInfo_v3(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id,
                                   CUgraph* graph, const CUgraphNode** deps,
                                   const CUgraphEdgeData** edges, size_t* count) {
  EMU_FAULT("cuStreamGetCaptureInfo_v3");
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(capture_lock());
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  Capture* c = s->capture;
  if (!c) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  *status = c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id) *id = c->id;
  if (graph) *graph = (CUgraph)c->graph;
  /* Node handles are not modelled: callers get the count and no list. */
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (count) *count = 0;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCaptureInfo_v2(CUstream hs, CUstreamCaptureStatus* status, cuuint64_t* id,
                                   CUgraph* graph, const CUgraphNode** deps, size_t* count) {
  EMU_FAULT("cuStreamGetCaptureInfo_v2");
  return cuStreamGetCaptureInfo_v3(hs, status, id, graph, deps, nullptr, count);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph hg, unsigned long long flags) {
  EMU_FAULT("cuGraphInstantiateWithFlags");
  EMU_REQUIRE_INIT();
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  (void)flags;
  std::lock_guard<std::mutex> g(capture_lock());
  Graph* graph = (Graph*)hg;
  if (!graph || !g_graphs->count(graph)) return CUDA_ERROR_INVALID_HANDLE;
  auto exec = std::make_shared<GraphExec>();
  exec->nodes = graph->nodes;
  (*g_execs)[exec.get()] = exec;
  *out = (CUgraphExec)exec.get();
  return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec he, CUstream hs) {
  EMU_FAULT("cuGraphLaunch");
  std::lock_guard<std::mutex> g(capture_lock());
  auto it = g_execs->find((GraphExec*)he);
  if (it == g_execs->end()) return CUDA_ERROR_INVALID_HANDLE;
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  if (s->capture) return CUDA_ERROR_NOT_SUPPORTED; /* child graphs are not modelled */
  std::shared_ptr<GraphExec> exec = it->second;
  if (!s->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  /* The previous launch of this graph, then external event waits: the events' latest eager
   * records, as of this launch. */
  std::vector<std::pair<Stream*, uint64_t>> deps;
  if (exec->last_launch.first) deps.push_back(exec->last_launch);
  for (const Node& n : exec->nodes) {
    Event* e = n.wait_external;
    if (e && is_event(e) && !e->capture && e->stream) deps.push_back({e->stream, e->seq});
  }
  static uint64_t graph_launches = 0; /* under the driver lock */
  const uint64_t launch = ++graph_launches;
  r = enqueue_locked(s, std::move(deps), [exec, launch] { run_nodes(exec->nodes, launch); });
  if (r != CUDA_SUCCESS) return r;
  exec->last_launch = {s, s->enqueued};
  for (const Node& n : exec->nodes) {
    Event* e = n.record_external;
    if (!e || !is_event(e)) continue;
    e->capture = nullptr;
    e->nodes.clear();
    e->stream = s;
    e->seq = s->enqueued;
  }
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hg) {
  EMU_FAULT("cuGraphDestroy");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(capture_lock());
  Graph* graph = (Graph*)hg;
  if (!graph || !g_graphs->count(graph)) return CUDA_ERROR_INVALID_HANDLE;
  g_graphs->erase(graph);
  delete graph;
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec he) {
  EMU_FAULT("cuGraphExecDestroy");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(capture_lock());
  auto it = g_execs->find((GraphExec*)he);
  if (it == g_execs->end()) return CUDA_ERROR_INVALID_HANDLE;
  g_execs->erase(it); /* a launch still queued keeps its own reference */
  return CUDA_SUCCESS;
}

}  // extern "C"
