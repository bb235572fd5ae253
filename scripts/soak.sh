#!/usr/bin/env bash
# The full soak of the host engine: 10^5 seeded AllReduce calls with random world sizes
# (2..16), sizes (log-uniform up to 64 MiB, some empty), types, ops, placements, algorithms,
# designated and actually-late ranks; every element checked, every rank compared bit for bit.
# Takes about 2 hours on 2 cores (about 14 calls per second). A run can be split: FROM_CALL (a
# multiple of 40, where a communicator starts) resumes the same seeded sequence there.
# usage: scripts/soak.sh [SEED] [CALLS] [MAX_BYTES] [FROM_CALL]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec target/release/stragglar soak --seed "${1:-1}" --calls "${2:-100000}" --max-bytes "${3:-64M}" \
  --from-call "${4:-0}"
