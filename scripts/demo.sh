#!/usr/bin/env bash
# The main job of this repository on this machine: builds the library and the CLI, shows what
# the library does here (stragglar doctor), then runs StragglAR with a late straggler.
#  - Where a GPU is: the GPU engine, 4 ranks sharing GPU 0 (NCCL cannot run two ranks on one
#    GPU, so this is our own bootstrap), rank 3 held back 300 us on the device before each
#    call; the policy must find rank 3 from the GPUs' arrival records and move to StragglAR,
#    every rank choosing alike and every element checked.
#  - Elsewhere: the host engine, 8 ranks as processes over shared memory with emulated links,
#    StragglAR against Ring.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
if [ -z "${STRAGGLAR_NCCL_LIB:-}" ] && [ -f .venv/cu12/nvidia/nccl/lib/libnccl.so.2 ]; then
  export STRAGGLAR_NCCL_LIB="$PWD/.venv/cu12/nvidia/nccl/lib/libnccl.so.2"
fi
doctor=$(target/release/stragglar doctor)
echo "$doctor"
echo
if grep -Eq 'driver: +present, [1-9][0-9]* GPU' <<<"$doctor"; then
  exec target/release/stragglar bench --backend cuda --ranks 4 --algo auto --late-rank 3 \
    --delay-us 300 -b 1M -e 64M -f 4 -n 50 -w 5 --timeout-ms 60000
fi
exec target/release/stragglar demo
