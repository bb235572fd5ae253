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
std::set<Graph*>* g_graphs = new std::set<Graph*>();  /* ended captures */
std::set<Graph*>* g_bodies = new std::set<Graph*>();  /* conditional nodes' bodies */
std::set<NodeRef*>* g_node_refs = new std::set<NodeRef*>();
std::set<Condition*>* g_conditions = new std::set<Condition*>();
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
/* Runs a graph launch's nodes. Unseeded, they run one after another in a topological order
 * (creation order where it is one). Seeded, each node runs on a thread of its own once its dependencies
 * have finished, the ready ones started in a random order after random delays (below 100 us),
 * so independent branches run at the same time, as on a GPU. */
void run_nodes(const std::vector<Node>& nodes, uint64_t launch);

/* Runs one node: its work, or its child graph, or (a conditional node) its body when its
 * handle's value is nonzero as it starts. */
void run_node(const Node& n, uint64_t launch) {
  if (n.run) n.run();
  if (!n.body) return;
  if (n.condition && n.condition->value.load(std::memory_order_acquire) == 0) return;
  run_nodes(n.body->nodes, launch);
}

/* The nodes in a topological order: each after its dependencies, ties in creation order
 * (creation order is not always one: cuGraphAddDependencies may add an edge to an older
 * node). */
std::vector<size_t> topological(const std::vector<Node>& nodes) {
  std::vector<size_t> order;
  std::vector<bool> placed(nodes.size(), false);
  while (order.size() < nodes.size()) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (placed[i]) continue;
      bool met = true;
      for (size_t d : nodes[i].deps) met = met && placed[d];
      if (!met) continue;
      placed[i] = true;
      order.push_back(i);
      break;
    }
  }
  return order;
}

void run_nodes(const std::vector<Node>& nodes, uint64_t launch) {
  if (!schedule_seed()) {
    for (size_t i : topological(nodes)) run_node(nodes[i], launch);
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
        run_node(nodes[i], launch);
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

/* The handle of node `i` of `g`, made on first use. */
CUgraphNode ref_of(Graph* g, size_t i) {
  if (g->refs.size() < g->nodes.size()) g->refs.resize(g->nodes.size());
  if (!g->refs[i]) {
    g->refs[i].reset(new NodeRef{g, i});
    g_node_refs->insert(g->refs[i].get());
  }
  return (CUgraphNode)g->refs[i].get();
}

/* The node a handle names, or null (never made, destroyed, or of a destroyed graph). */
NodeRef* node_of(CUgraphNode h) {
  NodeRef* r = (NodeRef*)h;
  if (!r || !g_node_refs->count(r) || r->graph->nodes[r->index].removed) return nullptr;
  return r;
}

/* A graph nodes may be added to: an ended capture, a conditional body, or the graph of a
 * capture in progress (cuStreamGetCaptureInfo gives it out for that). */
Graph* writable_graph(CUgraph h) {
  Graph* g = (Graph*)h;
  if (!g) return nullptr;
  if (g_graphs->count(g) || g_bodies->count(g)) return g;
  for (Capture* c : *g_captures)
    if (c->graph == g) return g;
  return nullptr;
}

/* The graph `g`'s node indices of the handles `deps[0..n)`, or false when one is not a node
 * of `g`. */
bool indices_in(Graph* g, const CUgraphNode* deps, size_t n, std::vector<size_t>* out) {
  if (n != 0 && !deps) return false;
  for (size_t i = 0; i < n; ++i) {
    NodeRef* r = node_of(deps[i]);
    if (!r || r->graph != g) return false;
    out->push_back(r->index);
  }
  return true;
}

/* Whether a conditional body may hold every node of `nodes` (kernel, empty, child graph,
 * memset, memcpy and conditional nodes, child graphs checked through). */
bool fits_a_body(const std::vector<Node>& nodes) {
  for (const Node& n : nodes) {
    if (n.removed) continue;
    switch (n.type) {
      case CU_GRAPH_NODE_TYPE_KERNEL:
      case CU_GRAPH_NODE_TYPE_EMPTY:
      case CU_GRAPH_NODE_TYPE_MEMSET:
      case CU_GRAPH_NODE_TYPE_MEMCPY:
      case CU_GRAPH_NODE_TYPE_CONDITIONAL:
        break;
      case CU_GRAPH_NODE_TYPE_GRAPH:
        if (!fits_a_body(n.body->nodes)) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

bool has_conditional(const std::vector<Node>& nodes) {
  for (const Node& n : nodes) {
    if (n.removed) continue;
    if (n.type == CU_GRAPH_NODE_TYPE_CONDITIONAL) return true;
    if (n.type == CU_GRAPH_NODE_TYPE_GRAPH && has_conditional(n.body->nodes)) return true;
  }
  return false;
}

/* The event nodes of `nodes` and of their child graphs (conditional bodies hold none). */
void event_nodes(const std::vector<Node>& nodes, std::vector<const Node*>* out) {
  for (const Node& n : nodes) {
    if (n.wait_external || n.record_external) out->push_back(&n);
    if (n.type == CU_GRAPH_NODE_TYPE_GRAPH) event_nodes(n.body->nodes, out);
  }
}

/* Forgets the handles of `g`'s nodes and of its conditional bodies'. */
void forget_graph(Graph* g) {
  for (auto& r : g->refs)
    if (r) g_node_refs->erase(r.get());
  for (Node& n : g->nodes) {
    if (n.condition && n.body) {
      g_bodies->erase(n.body.get());
      forget_graph(n.body.get());
    }
  }
}

/* Adds node `n` to `g` after `deps` and gives out its handle. */
CUresult add(Graph* g, const CUgraphNode* deps, size_t count, Node n, CUgraphNode* out) {
  if (!indices_in(g, deps, count, &n.deps)) return CUDA_ERROR_INVALID_VALUE;
  if (g->is_body && !fits_a_body({n})) return CUDA_ERROR_NOT_SUPPORTED;
  g->nodes.push_back(std::move(n));
  *out = ref_of(g, g->nodes.size() - 1);
  return CUDA_SUCCESS;
}

/* Whether the edge data of an edge is the default (a full dependency), the only kind
 * modelled. */
bool default_edges(const CUgraphEdgeData* edges, size_t n) {
  if (!edges) return true;
  for (size_t i = 0; i < n; ++i)
    if (edges[i].from_port != 0 || edges[i].to_port != 0 || edges[i].type != 0) return false;
  return true;
}

/* The handles `list` of node indices of `g` into `out[0..*count)` (cuGraphGetNodes' rule: a
 * null `out` asks for the count; entries past the list are null). */
CUresult give_nodes(Graph* g, const std::vector<size_t>& list, CUgraphNode* out, size_t* count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  if (out) {
    for (size_t i = 0; i < *count; ++i) out[i] = i < list.size() ? ref_of(g, list[i]) : nullptr;
  }
  *count = list.size();
  return CUDA_SUCCESS;
}
}  // namespace

void set_conditional(uint64_t handle, unsigned value) {
  Condition* c = (Condition*)handle;
  {
    std::lock_guard<std::mutex> g(capture_lock());
    if (!g_conditions->count(c)) {
      fprintf(stderr, "emulated GPU: cudaGraphSetConditional with handle %#llx, which the driver never made\n",
              (unsigned long long)handle);
      abort();
    }
  }
  c->value.store(value, std::memory_order_release);
}

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

void capture_node(Stream* s, std::function<void()> run, CUgraphNodeType type) {
  Graph* g = s->capture->graph;
  Node n;
  n.deps = s->tail;
  n.run = std::move(run);
  n.type = type;
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
    forget_graph(c->graph);
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
  /* The nodes later work on the stream will depend on, valid until the next call. */
  s->tail_handles.clear();
  for (size_t n : s->tail) s->tail_handles.push_back(ref_of(c->graph, n));
  if (deps) *deps = s->tail_handles.empty() ? nullptr : s->tail_handles.data();
  if (edges) *edges = nullptr;
  if (count) *count = s->tail_handles.size();
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
  exec->conditions = graph->conditions;
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
  std::vector<const Node*> events;
  event_nodes(exec->nodes, &events);
  for (const Node* n : events) {
    Event* e = n->wait_external;
    if (e && is_event(e) && !e->capture && e->stream) deps.push_back({e->stream, e->seq});
  }
  static uint64_t graph_launches = 0; /* under the driver lock */
  const uint64_t launch = ++graph_launches;
  r = enqueue_locked(s, std::move(deps), [exec, launch] {
    for (Condition* c : exec->conditions)
      if (c->assign_default) c->value.store(c->default_value, std::memory_order_relaxed);
    run_nodes(exec->nodes, launch);
  });
  if (r != CUDA_SUCCESS) return r;
  exec->last_launch = {s, s->enqueued};
  for (const Node* n : events) {
    Event* e = n->record_external;
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
  forget_graph(graph);
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

/* ------------------------------------------------------------ building graphs by hand ---- */

CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph hg, CUcontext ctx,
                                        unsigned int default_value, unsigned int flags) {
  EMU_FAULT("cuGraphConditionalHandleCreate");
  EMU_REQUIRE_INIT();
  if (!out || (flags & ~CU_GRAPH_COND_ASSIGN_DEFAULT) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!is_context((Context*)ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> g(capture_lock());
  Graph* graph = writable_graph(hg);
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  Condition* c = new Condition();
  c->default_value = default_value;
  c->assign_default = (flags & CU_GRAPH_COND_ASSIGN_DEFAULT) != 0;
  c->value.store(default_value);
  graph->conditions.push_back(c);
  g_conditions->insert(c);
  *out = (CUgraphConditionalHandle)c;
  return CUDA_SUCCESS;
}

/* An empty node, or a conditional IF node with one body (the body's handle into
 * `phGraph_out[0]`); other types through this call are not modelled. */
CUresult cuGraphAddNode_v2(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                           const CUgraphEdgeData* edges, size_t count, CUgraphNodeParams* params) {
  EMU_FAULT("cuGraphAddNode_v2");
  EMU_REQUIRE_INIT();
  if (!out || !params) return CUDA_ERROR_INVALID_VALUE;
  if (!default_edges(edges, count)) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> g(capture_lock());
  Graph* graph = writable_graph(hg);
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  Node n;
  n.type = params->type;
  if (params->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
    CUDA_CONDITIONAL_NODE_PARAMS& p = params->conditional;
    Condition* c = (Condition*)p.handle;
    bool own = false;
    for (Condition* mine : graph->conditions) own = own || mine == c;
    if (!own || !p.phGraph_out) return CUDA_ERROR_INVALID_VALUE;
    if (p.type != CU_GRAPH_COND_TYPE_IF || p.size != 1) return CUDA_ERROR_NOT_SUPPORTED;
    n.condition = c;
    n.body = std::make_shared<Graph>();
    n.body->is_body = true;
  } else if (params->type != CU_GRAPH_NODE_TYPE_EMPTY) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  std::shared_ptr<Graph> body = n.body;
  CUresult r = add(graph, deps, count, std::move(n), out);
  if (r == CUDA_SUCCESS && body) {
    g_bodies->insert(body.get());
    params->conditional.phGraph_out[0] = (CUgraph)body.get();
  }
  return r;
}

CUresult cuGraphAddNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, size_t count,
                        CUgraphNodeParams* params) {
  EMU_FAULT("cuGraphAddNode");
  return cuGraphAddNode_v2(out, hg, deps, nullptr, count, params);
}

/* A child graph node: a copy of `child` (which may hold no conditional node, the real
 * driver's rule) runs in its place at every launch. */
CUresult cuGraphAddChildGraphNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                  size_t count, CUgraph hchild) {
  EMU_FAULT("cuGraphAddChildGraphNode");
  EMU_REQUIRE_INIT();
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(capture_lock());
  Graph* graph = writable_graph(hg);
  Graph* child = (Graph*)hchild;
  if (!graph || !child || !g_graphs->count(child) || child == graph) return CUDA_ERROR_INVALID_VALUE;
  if (has_conditional(child->nodes)) return CUDA_ERROR_INVALID_VALUE;
  Node n;
  n.type = CU_GRAPH_NODE_TYPE_GRAPH;
  n.body = std::make_shared<Graph>();
  n.body->nodes = child->nodes;
  return add(graph, deps, count, std::move(n), out);
}

static CUresult add_event_node(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                               size_t count, CUevent he, bool wait) {
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> g(capture_lock());
  Graph* graph = writable_graph(hg);
  Event* e = (Event*)he;
  if (!graph || !e || !is_event(e)) return CUDA_ERROR_INVALID_VALUE;
  Node n;
  n.type = wait ? CU_GRAPH_NODE_TYPE_WAIT_EVENT : CU_GRAPH_NODE_TYPE_EVENT_RECORD;
  (wait ? n.wait_external : n.record_external) = e;
  return add(graph, deps, count, std::move(n), out);
}

CUresult cuGraphAddEventWaitNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                 size_t count, CUevent e) {
  EMU_FAULT("cuGraphAddEventWaitNode");
  EMU_REQUIRE_INIT();
  return add_event_node(out, hg, deps, count, e, true);
}

CUresult cuGraphAddEventRecordNode(CUgraphNode* out, CUgraph hg, const CUgraphNode* deps,
                                   size_t count, CUevent e) {
  EMU_FAULT("cuGraphAddEventRecordNode");
  EMU_REQUIRE_INIT();
  return add_event_node(out, hg, deps, count, e, false);
}

CUresult cuGraphGetNodes(CUgraph hg, CUgraphNode* out, size_t* count) {
  EMU_FAULT("cuGraphGetNodes");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(capture_lock());
  Graph* graph = writable_graph(hg);
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  std::vector<size_t> list;
  for (size_t i = 0; i < graph->nodes.size(); ++i)
    if (!graph->nodes[i].removed) list.push_back(i);
  return give_nodes(graph, list, out, count);
}

CUresult cuGraphNodeGetType(CUgraphNode h, CUgraphNodeType* type) {
  EMU_FAULT("cuGraphNodeGetType");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(capture_lock());
  NodeRef* r = node_of(h);
  if (!r || !type) return CUDA_ERROR_INVALID_VALUE;
  *type = r->graph->nodes[r->index].type;
  return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetDependencies(CUgraphNode h, CUgraphNode* out, size_t* count) {
  EMU_FAULT("cuGraphNodeGetDependencies");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(capture_lock());
  NodeRef* r = node_of(h);
  if (!r) return CUDA_ERROR_INVALID_VALUE;
  return give_nodes(r->graph, r->graph->nodes[r->index].deps, out, count);
}

CUresult cuGraphNodeGetDependentNodes(CUgraphNode h, CUgraphNode* out, size_t* count) {
  EMU_FAULT("cuGraphNodeGetDependentNodes");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(capture_lock());
  NodeRef* r = node_of(h);
  if (!r) return CUDA_ERROR_INVALID_VALUE;
  std::vector<size_t> list;
  const std::vector<Node>& nodes = r->graph->nodes;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t d : nodes[i].deps)
      if (d == r->index && !nodes[i].removed) list.push_back(i);
  return give_nodes(r->graph, list, out, count);
}

static CUresult event_of_node(CUgraphNode h, CUevent* out, bool wait) {
  std::lock_guard<std::mutex> g(capture_lock());
  NodeRef* r = node_of(h);
  if (!r || !out) return CUDA_ERROR_INVALID_VALUE;
  const Node& n = r->graph->nodes[r->index];
  Event* e = wait ? n.wait_external : n.record_external;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  *out = (CUevent)e;
  return CUDA_SUCCESS;
}

CUresult cuGraphEventWaitNodeGetEvent(CUgraphNode h, CUevent* out) {
  EMU_FAULT("cuGraphEventWaitNodeGetEvent");
  EMU_REQUIRE_INIT();
  return event_of_node(h, out, true);
}

CUresult cuGraphEventRecordNodeGetEvent(CUgraphNode h, CUevent* out) {
  EMU_FAULT("cuGraphEventRecordNodeGetEvent");
  EMU_REQUIRE_INIT();
  return event_of_node(h, out, false);
}

/* Adds the edges from[i] -> to[i] (each `to` then waits for its `from`); an edge that would
 * close a cycle is refused. */
CUresult cuGraphAddDependencies(CUgraph hg, const CUgraphNode* from, const CUgraphNode* to,
                                size_t count) {
  EMU_FAULT("cuGraphAddDependencies");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(capture_lock());
  Graph* graph = writable_graph(hg);
  std::vector<size_t> a, b;
  if (!graph || !indices_in(graph, from, count, &a) || !indices_in(graph, to, count, &b))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    /* A cycle: `from` already depends, through its dependencies, on `to`. */
    std::vector<size_t> todo{a[i]};
    std::vector<bool> seen(graph->nodes.size(), false);
    while (!todo.empty()) {
      size_t n = todo.back();
      todo.pop_back();
      if (n == b[i]) return CUDA_ERROR_INVALID_VALUE;
      if (seen[n]) continue;
      seen[n] = true;
      for (size_t d : graph->nodes[n].deps) todo.push_back(d);
    }
    graph->nodes[b[i]].deps.push_back(a[i]);
  }
  return CUDA_SUCCESS;
}

/* Removes a node and its edges (kept as an empty node with no edges, so indices stay). */
CUresult cuGraphDestroyNode(CUgraphNode h) {
  EMU_FAULT("cuGraphDestroyNode");
  EMU_REQUIRE_INIT();
  std::lock_guard<std::mutex> g(capture_lock());
  NodeRef* r = node_of(h);
  if (!r) return CUDA_ERROR_INVALID_VALUE;
  Graph* graph = r->graph;
  Node& n = graph->nodes[r->index];
  if (n.condition && n.body) {
    g_bodies->erase(n.body.get());
    forget_graph(n.body.get());
  }
  n = Node();
  n.removed = true;
  for (Node& other : graph->nodes) {
    std::vector<size_t> kept;
    for (size_t d : other.deps)
      if (d != r->index) kept.push_back(d);
    other.deps.swap(kept);
  }
  return CUDA_SUCCESS;
}

/* Sets (CU_STREAM_SET_CAPTURE_DEPENDENCIES) or adds to (CU_STREAM_ADD_CAPTURE_DEPENDENCIES)
 * the nodes later work captured on the stream depends on. */
CUresult cuStreamUpdateCaptureDependencies_v2(CUstream hs, CUgraphNode* deps,
                                              const CUgraphEdgeData* edges, size_t count,
                                              unsigned int flags) {
  EMU_FAULT("cuStreamUpdateCaptureDependencies_v2");
  if (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES && flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES)
    return CUDA_ERROR_INVALID_VALUE;
  if (!default_edges(edges, count)) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> g(capture_lock());
  Stream* s = nullptr;
  CUresult r = resolve_stream(hs, &s);
  if (r != CUDA_SUCCESS) return r;
  if (!s->capture) return CUDA_ERROR_ILLEGAL_STATE;
  std::vector<size_t> nodes;
  if (!indices_in(s->capture->graph, deps, count, &nodes)) return CUDA_ERROR_INVALID_VALUE;
  if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES) s->tail.clear();
  for (size_t n : nodes) s->tail.push_back(n);
  return CUDA_SUCCESS;
}

CUresult cuStreamUpdateCaptureDependencies(CUstream hs, CUgraphNode* deps, size_t count,
                                           unsigned int flags) {
  EMU_FAULT("cuStreamUpdateCaptureDependencies");
  return cuStreamUpdateCaptureDependencies_v2(hs, deps, nullptr, count, flags);
}

}  // extern "C"
