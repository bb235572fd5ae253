#!/usr/bin/env bash
# Installs what the tests need (Python wheels into the ignored .venv, reused on later runs)
# and runs every test: formatting, lints, the Rust unit and integration tests (C programs
# against the real libnccl, LD_PRELOAD under the real PyTorch, header conformance, the emulated
# GPU and its loopback NCCL), the kernels' emulation under ThreadSanitizer, a 100 s seeded soak
# of the CLI, and the shell scripts' syntax.
#
# usage: scripts/test.sh            (from anywhere; needs python3, cc, c++, cargo and the network
#                                    for the first run)
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/wheels.sh

# The last line of every run, passed or failed: `N passed, N failed[, N skipped]`, counting each
# check step below as one test and each test `cargo test` ran (its ignored ones as skipped).
CHECKS_PASSED=0
CURRENT_STEP=""
# Each step's elapsed seconds, printed at the end with the total ("SECONDS  STEP" lines).
STEP_TIMES=()
STEP_STARTED=$SECONDS
step_took() {
  if [ -n "$CURRENT_STEP" ]; then
    STEP_TIMES+=("$(printf '%6d s  %s' $((SECONDS - STEP_STARTED)) "$CURRENT_STEP")")
  fi
  STEP_STARTED=$SECONDS
}
step() {
  if [ -n "$CURRENT_STEP" ]; then CHECKS_PASSED=$((CHECKS_PASSED + 1)); fi
  step_took
  CURRENT_STEP="$*"
  printf '\n== %s\n' "$*"
}
summary() {
  local status=$? passed=$CHECKS_PASSED failed=0 skipped=0 p f i
  step_took
  printf '\n== time per step\n'
  printf '%s\n' "${STEP_TIMES[@]}"
  printf '%6d s  total\n' "$SECONDS"
  if [ "$CURRENT_STEP" = "cargo test" ] && [ -f target/test-output.log ]; then
    while read -r p f i; do
      passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + i))
    done < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' target/test-output.log)
    # A run that failed without a failing test (a build error, a crash) counts as one failure.
    if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
  elif [ -n "$CURRENT_STEP" ]; then
    if [ "$status" -eq 0 ]; then passed=$((passed + 1)); else failed=1; fi
  fi
  printf '\n%d passed, %d failed' "$passed" "$failed"
  if [ "$skipped" -gt 0 ]; then printf ', %d skipped' "$skipped"; fi
  printf '\n'
  exit "$status"
}
trap summary EXIT

# A full run writes about 3 GiB of build output under target/ and, the first time, about 6.5 GiB
# of wheels into the virtual environment. A disk that fills mid-run fails far from the cause (the
# linker dies of SIGBUS), so a disk too full is said here, before anything is built.
step "free disk"
free_gib=$(($(df --output=avail -k . | tail -n 1) / 1048576))
needed_gib=3
if [ ! -d "$VENV" ]; then needed_gib=$((needed_gib + 7)); fi
printf '%d GiB free on the disk of %s (a run needs about %d GiB)\n' "$free_gib" "$PWD" "$needed_gib"
if [ "$free_gib" -lt "$needed_gib" ]; then
  echo "test.sh: not enough free disk for the build; free some and run again" >&2
  exit 1
fi

step "Python wheels ($VENV)"
wheels_torch
wheels_cu12
"$VENV/bin/python" -c "import torch; print('torch', torch.__version__, 'with NCCL', torch.cuda.nccl.version())"

wheels_test_env
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

step "our wheel: pip install . into $VENV (the library, the stragglar CLI, the headers)"
wheels_ours
export STRAGGLAR_TEST_WHEEL_BIN="$PWD/$VENV/bin/stragglar"
test -x "$STRAGGLAR_TEST_WHEEL_BIN"

step "CLI soak: seeded random stragglar bench runs, 100 s (scripts/soak-cli.sh)"
BIN=target/release/stragglar JOBS=2 OUT=target/soak-cli/ci scripts/soak-cli.sh 100 4242

step "the kernels' emulation under ThreadSanitizer, and three planted races it must report (scripts/tsan-emulation.sh)"
scripts/tsan-emulation.sh

step "cargo test"
# `cargo test` links the library as an rlib only; the C, preload and ctypes tests need the
# cdylib of the same profile, which `cargo build` makes.
cargo build --quiet
rm -f target/test-output.log
cargo test 2>&1 | tee target/test-output.log
