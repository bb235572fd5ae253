#!/usr/bin/env bash
# The main job of this repository on this machine. For now: build the library and the CLI and
# show what the library would do here (stragglar doctor). Uses the real NCCL of the wheels that
# scripts/test.sh installs when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
if [ -z "${STRAGGLAR_NCCL_LIB:-}" ] && [ -f .venv/cu12/nvidia/nccl/lib/libnccl.so.2 ]; then
  export STRAGGLAR_NCCL_LIB="$PWD/.venv/cu12/nvidia/nccl/lib/libnccl.so.2"
fi
exec target/release/stragglar doctor
