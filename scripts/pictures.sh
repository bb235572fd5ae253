#!/usr/bin/env bash
# Draws the README's pictures from the CLI: the schedule of 8 ranks as a round-by-rank chart,
# and the model's speedups against message size and delay, over Ring and NCCL's NVLS, with
# links at what NCCL's Ring reaches on 8x H100 (370 GB/s). tests/cli_plan_model.rs checks
# that the committed files are what this script draws.
#
# usage: scripts/pictures.sh          (BIN: the stragglar binary, default target/release/stragglar,
#                                      built if missing; OUT: the folder, default docs/images)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/stragglar}
OUT=${OUT:-docs/images}
if [ ! -x "$BIN" ]; then
  cargo build --release --quiet
fi
mkdir -p "$OUT"
"$BIN" plan --ranks 8 --svg "$OUT/schedule-8-ranks.svg" > /dev/null
"$BIN" model --ranks 4,8,16,64 --bandwidth-gbs 370 --svg "$OUT/speedup-model.svg" > /dev/null
echo "pictures in $OUT"
