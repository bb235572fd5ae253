#!/usr/bin/env bash
# Soaks `stragglar bench --backend host` as users run it: random runs, several at once, for
# SECONDS. Each run draws 2-9 ranks, a type and an op, sizes from 8 B to 4 MiB, a straggler
# guess that is right or wrong, a delay, link emulation or none, --algo stragglar, ring or
# auto, ranks as processes or threads, and checks every element (-c 1). The same SEED draws
# the same sequence of runs. A failed run (non-zero exit, or still running after 5 minutes)
# keeps its command and output in OUT; a summary line ends the soak.
#
# With BACKEND=cuda the runs drive `stragglar bench --backend cuda` on the emulated GPU
# (scripts/emulated-gpu.sh): 2-6 ranks sharing GPU 0, 8 B to 512 KiB, eager or captured into
# graphs (--graph), no link emulation (a host-engine option).
#
# usage: scripts/soak-cli.sh SECONDS [SEED]
#   BACKEND host (default) or cuda
#   JOBS   runs at once (default 3)
#   OUT    where failed runs are kept (default target/soak-cli/SEED)
#   BIN    the stragglar binary (default: target/release/stragglar, built first)
# Exit status 1 if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || [ $# -gt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/soak-cli.sh SECONDS [SEED]" >&2
  exit 2
fi
SECONDS_WANTED=$1
SEED=${2:-$(( $(date +%s) % 100000 ))}
JOBS=${JOBS:-3}
OUT=${OUT:-target/soak-cli/$SEED}
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet
  BIN=target/release/stragglar
fi
BACKEND=${BACKEND:-host}
case "$BACKEND" in
  host) RUNNER=() ;;
  cuda)
    RUNNER=(scripts/emulated-gpu.sh)
    # One NVRTC compilation before the runs, not one per run at once.
    "${RUNNER[@]}" "$BIN" kernels --arch sm_90 --cache >/dev/null
    ;;
  *) echo "soak-cli: BACKEND is host or cuda, not $BACKEND" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
rm -f "$OUT"/failed-*.txt

TYPES=(int8 uint8 int32 uint32 int64 uint64 half float double bfloat16)
OPS=(sum prod max min avg premulsum)
ALGOS=(stragglar ring auto)
DELAYS=(0 0 100 1000 3000)
LINK_GBS=(0.5 2 10)
LINK_US=(0 10 50)

# Every draw happens in this shell (a subshell would not advance the seeded sequence).
RANDOM=$SEED
pick() { # pick NAME: one element of array NAME, in REPLY
  local -n list=$1
  REPLY=${list[RANDOM % ${#list[@]}]}
}

# One run's arguments, drawn from $RANDOM, in ARGS.
draw() {
  local ranks top=4194304
  if [ "$BACKEND" = cuda ]; then
    ranks=$((2 + RANDOM % 5))
    top=524288
  else
    ranks=$((2 + RANDOM % 8))
  fi
  local straggler=$((RANDOM % ranks)) late
  if ((RANDOM % 2)); then late=$straggler; else late=$((RANDOM % ranks)); fi
  # Sizes log-uniform from 8 B to 4 MiB, not only powers of two.
  local lo=$((3 + RANDOM % 20))
  local min=$(((1 << lo) + (RANDOM * 32768 + RANDOM) % (1 << lo)))
  ((min > top)) && min=$top
  local factor=$((2 + RANDOM % 7)) max=$min steps=$((RANDOM % 4))
  while ((steps > 0 && max * factor <= top)); do
    max=$((max * factor))
    steps=$((steps - 1))
  done
  ARGS=(bench --backend "$BACKEND" --ranks "$ranks" --straggler "$straggler" --late-rank "$late")
  pick DELAYS && ARGS+=(--delay-us "$REPLY")
  pick ALGOS && ARGS+=(--algo "$REPLY")
  ARGS+=(-b "$min" -e "$max" -f "$factor" -n "$((1 + RANDOM % 3))" -w "$((RANDOM % 2))" -c 1)
  pick TYPES && ARGS+=(-d "$REPLY")
  pick OPS && ARGS+=(-o "$REPLY")
  if ((RANDOM % 2)); then ARGS+=(--ranks-as processes); else ARGS+=(--ranks-as threads); fi
  if [ "$BACKEND" = cuda ]; then
    if ((RANDOM % 3 == 0)); then ARGS+=(--graph); fi
  elif ((RANDOM % 3 == 0)); then
    pick LINK_GBS && ARGS+=(--link-gbs "$REPLY")
    pick LINK_US && ARGS+=(--link-latency-us "$REPLY")
  fi
}

# run N ARGS...: one run; keeps its command and output if it fails.
run() {
  local n=$1 output rc=0
  shift
  output=$(timeout 300 "${RUNNER[@]}" "$BIN" "$@" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ]; then
    {
      echo "# run $n of seed $SEED: exit status $rc"
      echo "${RUNNER[*]} $BIN $*"
      echo "$output"
    } >"$OUT/failed-$n.txt"
  fi
}

started=0
start=$(date +%s)
while (($(date +%s) - start < SECONDS_WANTED)); do
  while (($(jobs -rp | wc -l) >= JOBS)); do
    wait -n || true
  done
  started=$((started + 1))
  draw
  run "$started" "${ARGS[@]}" &
done
wait
failed=$(find "$OUT" -name 'failed-*.txt' | wc -l)
kept=""
((failed > 0)) && kept=", kept in $OUT"
echo "soak-cli: $started runs in $(($(date +%s) - start)) s (seed $SEED, $JOBS at once, $BACKEND backend): $failed failed$kept"
((failed == 0))
