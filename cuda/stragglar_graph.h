/* What every kernel of a graph call reads of the graph state the same way: whether the launch's
 * indices are in range, the device's choice and its plan, the call's arrival record, and
 * whether the call is in the sample that times NCCL's turn. Shared by the AllReduce module
 * (cuda/stragglar_allreduce.cu: the AllReduce, arrival and end kernels) and the turn kernel's
 * own (cuda/stragglar_graph_turn.cu), so both read one state alike. */

#ifndef STRAGGLAR_GRAPH_H_
#define STRAGGLAR_GRAPH_H_

#include "stragglar_arrival.h"
#include "stragglar_choice.h"

/* Whether a graph launch's state indices are in range (otherwise it fails as a bad plan). */
SG_DEVICE bool sg_graph_ok(const RawLaunch* a) {
  return a->rule.size_class < SIZE_CLASSES && a->rule.ranks == a->arrival.ranks &&
         a->arrival.board != 0 && a->plans != 0;
}

/* The choice of a graph call of `rule`'s size class: what the verdict of its class gives, with
 * the class's calls so far (the exploration schedule's clock). */
SG_DEVICE uint32_t sg_graph_choice(const RawGraphState* g, const RawRule* rule) {
  const RawClassState* own = &g->classes[rule->size_class];
  RawVerdict verdict = own->verdict[own->calls & 1];
  return sg_choose(rule, &verdict, own->calls);
}

/* A graph launch's plan: the choice the verdict of its size class gives (every block reads the
 * same half of it, which no launch writes while this one runs; see RawClassState). */
SG_DEVICE const RawPlanHeader* sg_graph_plan(const RawLaunch* a, uint32_t* choice) {
  *choice = a->rule.ranks;
  if (!sg_graph_ok(a)) return 0;
  *choice = sg_graph_choice((const RawGraphState*)a->graph, &a->rule);
  if (*choice > a->rule.ranks) return 0; /* a damaged rule or state: fail as a bad plan */
  return (const RawPlanHeader*)((const uint64_t*)a->plans)[*choice];
}

/* The arrival record of a graph launch's call: the graph board, with the call's number and
 * this rank's notes from device memory. */
SG_DEVICE RawArrival sg_graph_arrival_of(const RawLaunch* a) {
  RawGraphState* g = (RawGraphState*)a->graph;
  RawArrival arrival = a->arrival;
  arrival.ring = (uint64_t)g->ring;
  arrival.call = g->calls;
  arrival.note = (uint64_t)g->notes;
  return arrival;
}

/* Whether a graph call on NCCL's turn notes when it finished (its post-arrival time): the
 * eager calls' sample (sg_measures); and, under a measuring rule that chooses between the two
 * algorithms (auto) while a straggler is considered, every call of its class whose verdict
 * lacks a recent time of either algorithm, and every call the exploration schedule sends to
 * NCCL: so the class keeps a recent time of NCCL while StragglAR runs its calls (the host's
 * tracker has a rule of its own for that: a baseline time wanted after 64 class calls without
 * one). From the state every rank shares, so alike on every rank. Straight-line. */
SG_DEVICE bool sg_graph_measures(const RawLaunch* a, uint64_t call) {
  if (sg_measures(call)) return true;
  if (!a->rule.measuring || a->rule.algo != RULE_ALGO_AUTO) return false;
  const RawClassState* own = &((const RawGraphState*)a->graph)->classes[a->rule.size_class];
  const RawVerdict verdict = own->verdict[own->calls & 1];
  return verdict.straggler != 0 &&
         (verdict.measured == MEASURED_NONE || sg_explores(own->calls));
}

#endif /* STRAGGLAR_GRAPH_H_ */
