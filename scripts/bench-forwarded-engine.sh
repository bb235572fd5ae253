#!/usr/bin/env bash
# Measures the host time of one ncclAllReduce that the GPU engine forwards to NCCL, engine on
# against engine off, on the emulated machine with the loopback NCCL: 4 rank processes, each
# making CALLS calls of 4099 floats with no straggler (so the policy sends every call to NCCL),
# each call timed alone on the host (its stream drained after it, untimed). Engine on, a call
# queues the ticket kernel before NCCL's and, on one call in eight, the end kernel after it.
# A third row: engine off, observe mode on (STRAGGLAR_OBSERVE=1, its records into a scratch
# directory): two event records, a capture query and the reading of finished events a call.
#
# usage: scripts/bench-forwarded-engine.sh [CALLS]   (default 2000)
#
# What it measures: the library's own host work per forwarded call plus the emulated driver's
# launch, not the real driver's (whose cuLaunchKernel costs a few microseconds); the stream
# time per forwarded call on a GPU is a gpu-check row. Needs what scripts/test.sh installs.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
CALLS="${1:-2000}"
[[ $CALLS =~ ^[0-9]+$ ]] && [ "$CALLS" -ge 16 ] || { echo "usage: $0 [CALLS >= 16]" >&2; exit 2; }
cargo build --release --quiet
DRIVER_DIR="$(scripts/emulated-gpu.sh --build)"
NV="$ROOT/.venv/cu12/nvidia"
PROGRAM="$ROOT/target/bench/loopback_ranks"
mkdir -p "$ROOT/target/bench"
cc -O2 -std=gnu11 -I "$NV/cuda_runtime/include" -Iinclude tests/c/loopback_ranks.c \
  -L target/release -lstragglar -Wl,-rpath,"$ROOT/target/release" \
  -L "$DRIVER_DIR" -lcuda -pthread -o "$PROGRAM"
median_of() { # the median over ranks of each rank's median host time, from loopback_ranks' lines
  sed -n 's/.*host time per call over [0-9]* calls: median \([0-9]*\) ns, p90 \([0-9]*\) ns/\1 \2/p' \
    | sort -n | awk '{m[NR] = $1; p[NR] = $2} END {if (NR == 0) exit 1; print m[int((NR + 1) / 2)], p[int((NR + 1) / 2)]}'
}
log="$(mktemp)"
records="$(mktemp -d)"
trap 'rm -f "$log"; rm -rf "$records"' EXIT
printf '%-8s %12s %12s %20s\n' "engine" "median ns" "p90 ns" "calls on NCCL"
for mode in off on observe; do
  engine=$([ "$mode" = on ] && echo 1 || echo 0)
  observe=$([ "$mode" = observe ] && echo 1 || echo 0)
  # STRAGGLAR_MIN_BYTES=0: the calls (16 KiB) are eligible, so the engine serves them.
  out="$(STRAGGLAR_GPU_ENGINE=$engine STRAGGLAR_OBSERVE=$observe STRAGGLAR_REPORT_DIR="$records" \
    STRAGGLAR_MIN_BYTES=0 STRAGGLAR_DEBUG=WARN LOOPBACK_FIXED=1 LOOPBACK_HOST_TIMES=1 \
    LOOPBACK_CALLS="$CALLS" scripts/emulated-gpu.sh "$PROGRAM" 4 2>"$log")" ||
    { echo "$out" >&2; cat "$log" >&2; exit 1; }
  # Calls on NCCL over every rank (a rank the emulated machine's scheduling keeps late may be
  # designated now and then, and some calls then run StragglAR: counted, not hidden).
  forwarded="$(sed -n 's/.*, \([0-9]*\) on NCCL$/\1/p' <<<"$out" | awk '{s += $1} END {print s + 0}')"
  read -r median p90 < <(echo "$out" | median_of)
  printf '%-8s %12s %12s %20s\n' "$mode" "$median" "$p90" "$forwarded of $((4 * CALLS))"
done
