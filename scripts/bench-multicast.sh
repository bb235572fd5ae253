#!/usr/bin/env bash
# Multicast StragglAR against plain and pipelined StragglAR and Ring on the host engine: 8 rank
# processes over shared memory, links emulated at 20 MB/s and 20 us per transfer, the last rank
# late by enough to hide every phase before its arrival (multicast's gather included). Prints
# each algorithm's measured time from the straggler's arrival to the last rank's finish (the
# bench's "post" column: per rank the mean over its timed calls, the slowest rank's) beside the
# model's (`stragglar model`, multicast stores at the point-to-point rate), every element of
# every call checked by the bench.
#
# usage: scripts/bench-multicast.sh [SIZE]   (default 1M; K/M/G as stragglar bench takes them)
#
# The link model gives a multicast send to every reader for the price of one (the sender's port
# held once, every receiver's from the same start): what this measures beyond the model is the
# engine's own cost around it (steps, flags, the straggler's combines, the readers' copies, its
# broadcasts of the chunks one after another) and the emulated links' wake-ups, not a GPU's
# multicast.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
SIZE="${1:-1M}"
[[ $SIZE =~ ^[0-9]+[KMG]?$ ]] || { echo "usage: $0 [SIZE, e.g. 256K or 1M]" >&2; exit 2; }
cargo build --release --quiet
BIN=target/release/stragglar
GBS=0.02
LATENCY_US=20
model() { # the model's field $1 (seconds) for this size, in microseconds
  "$BIN" model --ranks 8 --bytes "$SIZE" --alpha-us "$LATENCY_US" --bandwidth-gbs "$GBS" \
    --max-pipeline 8 --json |
    sed -n "s/.*\"$1\": \([-0-9.e+]*\).*/\1/p" | awk '{printf "%.0f", $1 * 1e6}'
}
PIECES=$("$BIN" model --ranks 8 --bytes "$SIZE" --alpha-us "$LATENCY_US" --bandwidth-gbs "$GBS" \
  --max-pipeline 8 --json | sed -n 's/.*"best_pieces": \([0-9]*\).*/\1/p')
PRE=$(model multicast_pre_s)
DELAY_US=$((3 * PRE))
ROWS="$(mktemp)"
trap 'rm -f "$ROWS"' EXIT
measured() { # `stragglar bench`'s post-arrival time with the given algorithm options
  "$BIN" bench --ranks 8 -b "$SIZE" -e "$SIZE" -n 6 -w 1 --delay-us "$DELAY_US" \
    --link-gbs "$GBS" --link-latency-us "$LATENCY_US" -J "$ROWS" "$@" >/dev/null
  sed -n 's/.*"post_arrival_us": \([0-9.]*\).*/\1/p' "$ROWS" | head -1 | awk '{printf "%.0f", $1}'
}
echo "8 ranks, $SIZE, links $GBS GB/s + $LATENCY_US us, rank 7 late by $DELAY_US us (3x multicast's pre-arrival $PRE us)"
printf '%-36s %14s %14s %10s\n' "after the straggler arrives" "measured (us)" "model (us)" "ratio"
row() {
  local name="$1" model_us="$2"
  shift 2
  local got
  got=$(measured "$@")
  [ -n "$got" ] || { echo "$name: the bench printed no post-arrival median" >&2; exit 1; }
  printf '%-36s %14s %14s %10s\n' "$name" "$got" "$model_us" "$(awk -v a="$got" -v b="$model_us" 'BEGIN {printf "%.2f", a / b}')"
}
row "Ring" "$(model ring_s)" --algo ring
row "StragglAR, plain" "$(model post_s)" --algo stragglar
row "StragglAR, pipelined (k = $PIECES)" "$(model post_pipelined_s)" --algo stragglar --pipeline "$PIECES"
row "multicast StragglAR" "$(model multicast_post_s)" --algo multicast
