/* Forwarding overhead: ncclGetVersion called through libstragglar.so (PLT -> our export ->
 * guard -> real pncclGetVersion) against the real pncclGetVersion called directly through a
 * function pointer. ncclGetVersion does almost nothing, so the difference is our cost.
 *
 * usage: forwarding REAL_LIBNCCL [CALLS]   (scripts/bench-forwarding.sh builds and runs it) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <nccl.h>

typedef ncclResult_t (*get_version_fn)(int*);

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Best of several rounds, in ns per call. */
static double time_calls(get_version_fn f, long calls) {
  double best = 1e30;
  for (int round = 0; round < 7; round++) {
    volatile int sink = 0;
    double t0 = now_ns();
    for (long i = 0; i < calls; i++) {
      int v;
      f(&v);
      sink += v;
    }
    double per = (now_ns() - t0) / (double)calls;
    if (per < best) best = per;
  }
  return best;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s REAL_LIBNCCL [CALLS]\n", argv[0]);
    return 2;
  }
  long calls = argc > 2 ? atol(argv[2]) : 20000000L;
  void* real = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!real) {
    fprintf(stderr, "cannot open %s: %s\n", argv[1], dlerror());
    return 1;
  }
  get_version_fn direct = (get_version_fn)dlsym(real, "pncclGetVersion");
  if (!direct) return 1;
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) { /* resolves our symbol once */
    fprintf(stderr, "ncclGetVersion through stragglar failed\n");
    return 1;
  }
  double through_us = time_calls(ncclGetVersion, calls);
  double direct_ns = time_calls(direct, calls);
  printf("calls per round:        %ld (best of 7 rounds)\n", calls);
  printf("real pncclGetVersion:   %.2f ns/call\n", direct_ns);
  printf("through libstragglar:   %.2f ns/call\n", through_us);
  printf("forwarding overhead:    %.2f ns/call\n", through_us - direct_ns);
  return 0;
}
