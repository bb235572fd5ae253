#!/usr/bin/env bash
# The emulated-machine tests (tests/emulated_gpu.rs) under seeded random scheduling, one whole
# run per seed (STRAGGLAR_EMU_SEED: random thread order with switches at strong accesses,
# random block order and start delays, stream jitter, concurrent graph branches; see
# docs/EMULATED-GPU.md). Says which seeds failed, each with its log. A seed makes the same
# choices again: rerun one with `scripts/emulated-seeds.sh 1 SEED [TEST_NAME]`.
#
# usage: scripts/emulated-seeds.sh [COUNT [FIRST [TEST_FILTER]]]   (default: 5 seeds from 1)
# About 4 minutes a seed on 2 cores for the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/wheels.sh
wheels_cu12
wheels_test_env
COUNT="${1:-5}"
FIRST="${2:-1}"
FILTER="${3:-}"
[[ $COUNT =~ ^[0-9]+$ && $FIRST =~ ^[1-9][0-9]*$ ]] || {
  echo "usage: $0 [COUNT [FIRST [TEST_FILTER]]]" >&2
  exit 2
}
cargo build --release --quiet
OUT=target/emulated-seeds
mkdir -p "$OUT"
failed=()
for ((seed = FIRST; seed < FIRST + COUNT; seed++)); do
  log="$OUT/seed-$seed.log"
  if STRAGGLAR_EMU_SEED=$seed cargo test --release --quiet --test emulated_gpu -- $FILTER \
    >"$log" 2>&1; then
    echo "seed $seed: passed ($(grep -o '[0-9]* passed' "$log" | tail -1))"
  else
    echo "seed $seed: FAILED, see $log"
    failed+=("$seed")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failing seeds: ${failed[*]}"
  exit 1
fi
