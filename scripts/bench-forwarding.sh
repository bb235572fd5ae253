#!/usr/bin/env bash
# Measures what forwarding costs per call (see benches/forwarding.c). Needs the wheels that
# scripts/test.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
REAL="${STRAGGLAR_NCCL_LIB:-$PWD/.venv/cu12/nvidia/nccl/lib/libnccl.so.2}"
[ -f "$REAL" ] || { echo "no real libnccl at $REAL: run scripts/test.sh first or set STRAGGLAR_NCCL_LIB" >&2; exit 1; }
cargo build --release --quiet
mkdir -p target/bench
cc -O2 -std=c11 -Iinclude benches/forwarding.c -Ltarget/release -lstragglar \
  -Wl,-rpath,"$PWD/target/release" -ldl -o target/bench/forwarding
STRAGGLAR_NCCL_LIB="$REAL" target/bench/forwarding "$REAL" "${1:-20000000}"
