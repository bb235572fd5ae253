/* The turn kernel of a captured ncclAllReduce whose baseline is NCCL's own work: the one kernel
 * a replay runs before NCCL's (src/engine/cuda/branch.rs builds the graph around it). It makes
 * the device's choice and sets the conditional handles of the call's three IF nodes from it.
 *
 * A module of its own: cudaGraphSetConditional is a device-runtime function that the driver
 * resolves when it loads the module (CUDA 12.3 on; no device-runtime library is linked), and a
 * driver without it refuses the whole module, which the AllReduce module must never be. */

#include "stragglar_graph.h"

#ifdef STRAGGLAR_HOST_EMULATION
/* The emulated driver's device side of it (tests/emulated/kernel_source.cpp). */
extern "C" void cudaGraphSetConditional(unsigned long long handle, unsigned int value);
#else
/* As CUDA's cuda_device_runtime_api.h declares it. */
extern "C" __device__ void cudaGraphSetConditional(unsigned long long handle, unsigned int value);
#endif

/* The turn kernel's body (thread 0 of its one block), first of the call: makes the device's
 * choice from the state every rank shares and sets the handle of the body to run to 1 and the
 * others to 0 (RawGraphTurn): StragglAR's, or NCCL's and, when the call is in the sample, the
 * end kernel's after it. On NCCL's turn it also publishes what this rank noted of the call
 * before and takes its ticket on the graph board; the rest of the protocol, which waits, runs
 * beside NCCL's work (sg_graph_nccl_arrival), and on the sample the end kernel after it notes
 * when it finished (sg_graph_end). On StragglAR's turn it notes the call's start, so that both
 * algorithms' post-arrival times start here, and changes nothing else: the AllReduce kernel, in
 * its body, makes the same choice and runs the whole protocol beside its plan. A launch whose
 * state is out of range takes StragglAR's body, whose kernel fails it as a bad plan.
 * Straight-line code: it never waits (tests/nvrtc.rs reads its SASS for a backward branch and
 * for any call but the three to cudaGraphSetConditional). */
SG_DEVICE void sg_graph_turn(const RawGraphTurn* t) {
  if (SG_THREAD != 0) return;
  const RawLaunch* a = &t->call;
  bool nccl = false, measured = false;
  if (a->graph != 0 && sg_graph_ok(a)) {
    uint32_t choice = 0;
    const RawPlanHeader* plan = sg_graph_plan(a, &choice);
    RawGraphState* g = (RawGraphState*)a->graph;
    nccl = plan == 0 && choice == a->rule.ranks;
    if (nccl) {
      const RawArrival arrival = sg_graph_arrival_of(a);
      sg_publish_previous(&arrival);
      sg_take_ticket(&arrival, a->rank);
      measured = sg_graph_measures(a, arrival.call);
    } else {
      sg_note_started((uint64_t)g->notes, g->calls);
    }
  }
  cudaGraphSetConditional(t->stragglar_body, nccl ? 0u : 1u);
  cudaGraphSetConditional(t->nccl_body, nccl ? 1u : 0u);
  cudaGraphSetConditional(t->sample_body, measured ? 1u : 0u);
}

#ifndef STRAGGLAR_HOST_EMULATION
SG_GLOBAL void ncclStragglarGraphTurn(RawGraphTurn args) { sg_graph_turn(&args); }
#endif
