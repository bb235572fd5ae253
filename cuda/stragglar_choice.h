/* The device twin of the straggler rule and the per-call policy (src/detect/rule.rs and
 * src/detect/policy.rs), for CUDA graph replays: a replayed launch cannot carry a host
 * decision, so the GPU keeps the detector of each size class in device memory and picks each
 * call's plan itself (src/gpu/choice.rs describes the state).
 *
 * Every rank feeds the same records in the same order, and this code is integer-only and
 * deterministic, so every rank designates the same straggler and picks the same plan. It must
 * compute exactly what the Rust rule computes: tests/kernel_emulation.rs runs both over random
 * record streams and settings and compares every choice. */

#ifndef STRAGGLAR_CHOICE_H_
#define STRAGGLAR_CHOICE_H_

#include "stragglar_device.h"

/* The window the rule applies (Detector::new clamps it to 1..=MAX_WINDOW). */
SG_DEVICE uint32_t sg_window(const RawRule* rule) {
  if (rule->window == 0) return 1;
  return rule->window < DETECTOR_WINDOW ? rule->window : DETECTOR_WINDOW;
}

/* The fixed straggler of the rule plus one, or 0 (Policy::new reads a rank outside the
 * communicator as auto). */
SG_DEVICE uint32_t sg_fixed(const RawRule* rule) {
  if (rule->fixed == RULE_DETECTED || rule->fixed == RULE_OFF || rule->fixed >= rule->ranks) {
    return 0;
  }
  return rule->fixed + 1;
}

/* In how many remembered records `rank` arrived last. */
SG_DEVICE uint32_t sg_last_count(const RawDetector* d, uint32_t rank) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < d->len && i < DETECTOR_WINDOW; ++i) n += d->last[i] == rank ? 1u : 0u;
  return n;
}

/* The rank last most often in the window (the lowest on a tie), and its count. */
SG_DEVICE uint32_t sg_leader(const RawDetector* d, uint32_t ranks, uint32_t* count) {
  uint32_t best = 0, best_count = 0;
  for (uint32_t r = 0; r < ranks; ++r) {
    uint32_t c = sg_last_count(d, r);
    if (r == 0 || c > best_count) {
      best = r;
      best_count = c;
    }
  }
  *count = best_count;
  return best;
}

/* Adds one record and applies the rule (Detector::observe). A record naming a rank outside the
 * communicator is ignored. */
SG_DEVICE void sg_observe(RawDetector* d, const RawRule* rule, uint32_t last, uint32_t lead) {
  if (last >= rule->ranks) return;
  const uint32_t window = sg_window(rule);
  uint32_t at = (uint32_t)(d->calls % window);
  d->last[at] = last;
  d->lead[at] = lead;
  if (d->len < window) d->len += 1;
  d->calls += 1;
  bool dwelt = d->calls - d->changed_at >= rule->min_dwell;
  uint32_t leader_count = 0;
  uint32_t leader = sg_leader(d, rule->ranks, &leader_count);
  bool qualifies = leader_count >= rule->on_count;
  uint32_t current = d->designated;
  uint32_t next = current;
  if (current == 0) {
    if (qualifies) next = leader + 1;
  } else if (dwelt && leader + 1 != current && qualifies) {
    next = leader + 1;
  } else if (dwelt && sg_last_count(d, current - 1) < rule->off_count) {
    next = 0;
  }
  if (next != current) {
    d->designated = next;
    d->changed_at = d->calls;
  }
}

/* Adds one post-arrival time taken at the class's decided call `at` (Samples::add). */
SG_DEVICE void sg_samples_add(RawSamples* s, uint64_t at, uint32_t ns) {
  uint32_t slot = s->len < TIMES_KEPT ? s->len : s->next % TIMES_KEPT; /* never past the end */
  s->at[slot] = at;
  s->ns[slot] = ns;
  if (s->len < TIMES_KEPT) {
    s->len += 1;
  } else {
    s->next = (s->next + 1) % TIMES_KEPT;
  }
  s->taken += 1;
}

/* The upper median of the samples taken at decided call `from` or later (Samples::
 * median_since); false when there is none. Outlined, as sg_verdict. */
SG_OUTLINED bool sg_median_since(const RawSamples* s, uint64_t from, uint64_t* median) {
  uint32_t sorted[TIMES_KEPT];
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->len && i < TIMES_KEPT; ++i) {
    if (s->at[i] < from) continue;
    uint32_t j = n++;
    while (j > 0 && sorted[j - 1] > s->ns[i]) {
      sorted[j] = sorted[j - 1];
      --j;
    }
    sorted[j] = s->ns[i];
  }
  if (n == 0) return false;
  *median = sorted[n / 2];
  return true;
}

/* What the class's measured times say for a call after `decided` calls of it
 * (ClassTimes::stragglar_wins): a MEASURED_* value. */
SG_DEVICE uint32_t sg_measured(const RawClassTimes* t, uint64_t decided) {
  uint64_t from = decided > TIMES_MAX_AGE ? decided - TIMES_MAX_AGE : 0;
  uint64_t stragglar = 0, baseline = 0;
  if (!sg_median_since(&t->stragglar, from, &stragglar) ||
      !sg_median_since(&t->baseline, from, &baseline)) {
    return MEASURED_NONE;
  }
  /* Both below 2^32: the products fit. */
  return stragglar * TIMES_MARGIN_PARTS < baseline * (TIMES_MARGIN_PARTS - 1) ? MEASURED_STRAGGLAR
                                                                             : MEASURED_BASELINE;
}

/* Whether a class's call after `decided` calls of it explores (ClassTimes::explores_next). */
SG_DEVICE bool sg_explores(uint64_t decided) {
  uint64_t at = decided % TIMES_EXPLORE_EVERY;
  return at == TIMES_EXPLORE_FIRST || at == TIMES_EXPLORE_FIRST + 1;
}

/* What the next call's choice needs (Policy::considered, Detector::median_lead_ns: the lower
 * median of the considered rank's leads), and, with a measuring rule, what the class's times
 * say for its next call, the class's `decided`-th. Outlined: a graph call computes up to three
 * verdicts, and their sorts inlined at each place tripled NVRTC's time for the whole kernel
 * (about 200 s for sm_90 on a 2-core machine, 60 s outlined; docs/KERNELS.md). */
SG_OUTLINED RawVerdict sg_verdict(const RawDetector* d, const RawRule* rule, const RawClassTimes* t,
                                uint64_t decided) {
  RawVerdict v;
  v.straggler = 0;
  v.has_lead = 0;
  v.lead_ns = 0;
  v.measured = rule->measuring ? sg_measured(t, decided) : MEASURED_NONE;
  v.reserved = 0;
  if (rule->fixed == RULE_OFF) return v;
  uint32_t considered = sg_fixed(rule) ? sg_fixed(rule) : d->designated;
  if (considered == 0) return v;
  v.straggler = considered;
  uint32_t leads[64];
  uint32_t n = 0;
  for (uint32_t i = 0; i < d->len && i < DETECTOR_WINDOW; ++i) {
    if (d->last[i] != considered - 1) continue;
    /* Insertion sort as the leads arrive: at most 64 of them. */
    uint32_t j = n++;
    while (j > 0 && leads[j - 1] > d->lead[i]) {
      leads[j] = leads[j - 1];
      --j;
    }
    leads[j] = d->lead[i];
  }
  if (n > 0) {
    v.has_lead = 1;
    v.lead_ns = leads[(n - 1) / 2];
  }
  return v;
}

/* The plan a call runs (Policy::choose), the class's `decided`-th: a straggler's rank for
 * StragglAR, or `ranks` for the baseline. */
SG_DEVICE uint32_t sg_choose(const RawRule* rule, const RawVerdict* v, uint64_t decided) {
  const uint32_t baseline = rule->ranks;
  if (rule->ranks < 2 || rule->algo == RULE_ALGO_BASELINE) return baseline;
  uint32_t straggler = 0; /* plus one; 0: none */
  if (sg_fixed(rule)) {
    straggler = sg_fixed(rule);
  } else if (rule->fixed != RULE_OFF) {
    straggler = v->straggler <= rule->ranks ? v->straggler : 0;
  }
  if (rule->algo == RULE_ALGO_STRAGGLAR) return straggler ? straggler - 1 : rule->ranks - 1;
  if (straggler == 0 || v->straggler != straggler) return baseline;
  bool modelled =
      v->has_lead && rule->break_even_ns != RULE_NEVER && v->lead_ns >= rule->break_even_ns;
  if (!rule->measuring) return modelled ? straggler - 1 : baseline;
  bool prefers = v->measured == MEASURED_NONE ? modelled : v->measured == MEASURED_STRAGGLAR;
  return prefers != sg_explores(decided) ? straggler - 1 : baseline;
}

#endif /* STRAGGLAR_CHOICE_H_ */
