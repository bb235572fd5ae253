#!/usr/bin/env bash
# Installs what the tests need (Python wheels into the ignored .venv, reused on later runs)
# and runs every test: formatting, lints, the Rust unit and integration tests (C programs
# against the real libnccl, LD_PRELOAD under the real PyTorch, header conformance, the emulated
# GPU and its loopback NCCL), a 100 s seeded soak of the CLI, and the shell scripts' syntax.
#
# usage: scripts/test.sh            (from anywhere; needs python3, cc, c++, cargo and the network
#                                    for the first run)
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/wheels.sh
step() { printf '\n== %s\n' "$*"; }

step "Python wheels ($VENV)"
wheels_torch
wheels_cu12
"$VENV/bin/python" -c "import torch; print('torch', torch.__version__, 'with NCCL', torch.cuda.nccl.version())"

export STRAGGLAR_TEST_REAL_NCCL="$NV/nccl/lib/libnccl.so.2"
export STRAGGLAR_TEST_NVIDIA_INCLUDES="$NV/nccl/include:$NV/cuda_runtime/include:$NV/cuda_nvcc/include:$NV/cuda_cccl/include"
export STRAGGLAR_TEST_PYTHON="$PWD/$VENV/bin/python"
# NVRTC for tests/nvrtc.rs (cudarc looks for libnvrtc.so* on the loader's search path); those
# tests fail rather than skip when it cannot be loaded.
export LD_LIBRARY_PATH="$NV/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STRAGGLAR_TEST_REQUIRE_NVRTC=1
test -f "$STRAGGLAR_TEST_REAL_NCCL"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --all-targets --quiet -- -D warnings

step "shell scripts"
for script in scripts/*.sh .ci/run; do
  bash -n "$script"
done

step "cargo build --release (libstragglar.so and the stragglar CLI)"
cargo build --release --quiet

step "CLI soak: seeded random stragglar bench runs, 100 s (scripts/soak-cli.sh)"
BIN=target/release/stragglar JOBS=2 OUT=target/soak-cli/ci scripts/soak-cli.sh 100 4242

step "cargo test"
# `cargo test` links the library as an rlib only; the C, preload and ctypes tests need the
# cdylib of the same profile, which `cargo build` makes.
cargo build --quiet
cargo test 2>&1 | tee target/test-output.log
