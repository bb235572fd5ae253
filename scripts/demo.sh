#!/usr/bin/env bash
# The main job of this repository on this machine: builds the library and the CLI, shows what
# the library does here (stragglar doctor), then runs StragglAR against Ring with a late
# straggler. This version has the host engine only (the GPU engine is not built yet), so the
# demo runs 8 ranks as processes over shared memory with emulated links, on any machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
if [ -z "${STRAGGLAR_NCCL_LIB:-}" ] && [ -f .venv/cu12/nvidia/nccl/lib/libnccl.so.2 ]; then
  export STRAGGLAR_NCCL_LIB="$PWD/.venv/cu12/nvidia/nccl/lib/libnccl.so.2"
fi
target/release/stragglar doctor
echo
exec target/release/stragglar demo
