#!/usr/bin/env bash
# The GPU kernels' CPU emulation (tests/kernel_emulation.rs) under gcc's ThreadSanitizer: the
# kernel source is built for the host with -fsanitize=thread (every release and acquire of the
# protocol an atomic, peer data plain loads), libtsan is preloaded into the test binary, and
# every emulated thread is joined explicitly, so TSan checks the memory-ordering argument on a
# CPU. Two runs:
#   1. every emulation test: any report fails;
#   2. planted bugs on a few tests each, which TSan must report, or the check above proves
#      nothing: on the writer's side the release that publishes a value made relaxed
#      (STRAGGLAR_MUTANT_RELAXED_RELEASE); on the reader's side the flag's acquire made relaxed
#      (RELAXED_FLAG) and the barrier after a step's waits removed (NO_BARRIER_AFTER_WAITS).
#
# usage: scripts/tsan-emulation.sh      (needs gcc's libtsan, c++ and cargo)
set -euo pipefail
cd "$(dirname "$0")/.."
TSAN="$(gcc -print-file-name=libtsan.so)"
if [ ! -f "$TSAN" ]; then
  echo "tsan-emulation: gcc's libtsan.so not found" >&2
  exit 1
fi
BIN="$(cargo test --test kernel_emulation --no-run 2>&1 |
  sed -n 's/.*Executable tests\/kernel_emulation.rs (\(.*\))/\1/p')"
if [ ! -x "$BIN" ]; then
  echo "tsan-emulation: the kernel_emulation test binary was not built" >&2
  exit 1
fi
OUT=target/tsan-emulation
mkdir -p "$OUT"
export TSAN_OPTIONS="suppressions=$PWD/scripts/tsan.supp exitcode=66 halt_on_error=0 report_signal_unsafe=0"
# TSan sees a memcpy through its runtime's interceptor, but gcc expands a memcpy whose size it
# can bound (the kernels' 16-byte loads and stores) into plain moves late in compilation, after
# TSan's pass instrumented the code: those copies never reach the interceptor, so TSan never saw
# most of the kernels' data accesses, and a race on the data went unreported unless the build
# happened to keep a call. With -fno-builtin-memcpy every memcpy stays a call (the planted
# writer-side bug went from 3 reports, or none, to 257).
FLAGS="-fsanitize=thread -g -fno-builtin-memcpy"

# gcc 12's TSan maps its shadow at fixed addresses and dies ("FATAL: ThreadSanitizer: unexpected
# memory mapping", exit 66) when the kernel randomizes mmap with more bits than it expects
# (vm.mmap_rnd_bits = 32 on newer kernels). Running the test binary without address
# randomization avoids that; setarch itself must not carry libtsan, so LD_PRELOAD is set inside.
NO_ASLR=()
if setarch "$(uname -m)" -R true 2>/dev/null; then
  NO_ASLR=(setarch "$(uname -m)" -R)
fi
under_tsan() { "${NO_ASLR[@]}" env LD_PRELOAD="$TSAN" "$@"; }

# TSan's reports in a log: each ends with a SUMMARY line (a data race, or a crash it caught).
reports() { grep -c "SUMMARY: ThreadSanitizer" "$1" || true; }

# Runs the test binary under TSan with the kernels built with the flags $1, its output in the
# log $2, the rest its arguments: two tests at a time (the machine's two cores), or, where TSan
# could not map its shadow memory for two (it once failed to on this kind of host, before
# address randomization was turned off above), again one at a time. Returns its exit status.
run_emulation() {
  local flags="$1" log="$2" status=0
  shift 2
  STRAGGLAR_EMULATION_CFLAGS="$flags" under_tsan "$BIN" --test-threads=2 "$@" > "$log" 2>&1 ||
    status=$?
  if grep -qE "FATAL: ThreadSanitizer|ThreadSanitizer failed to allocate|ERROR: Failed to mmap" \
    "$log"; then
    echo "tsan-emulation: TSan's memory did not fit two tests at a time; one at a time" >&2
    status=0
    STRAGGLAR_EMULATION_CFLAGS="$flags" under_tsan "$BIN" --test-threads=1 "$@" > "$log" 2>&1 ||
      status=$?
  fi
  return "$status"
}

status=0
run_emulation "$FLAGS" "$OUT/clean.log" || status=$?
found=$(reports "$OUT/clean.log")
grep "^test result" "$OUT/clean.log" || true
if [ "$status" -ne 0 ] || [ "$found" -ne 0 ]; then
  if [ "$found" -ne 0 ]; then
    grep -A30 "WARNING: ThreadSanitizer" "$OUT/clean.log" | head -120 >&2 || true
  else
    tail -20 "$OUT/clean.log" >&2
  fi
  echo "tsan-emulation: $found report(s), exit status $status (log: $OUT/clean.log)" >&2
  exit 1
fi
echo "tsan-emulation: no report in the emulation tests"

# Each planted bug, with the tests that run the code it breaks: one on the writer's side, two
# on the reader's (the GPU may let a reader see the flag and then stale data; x86 does not, so
# only TSan sees these).
for planted in "RELAXED_RELEASE every_type_and_op world_sizes" \
  "RELAXED_FLAG every_type_and_op world_sizes" \
  "NO_BARRIER_AFTER_WAITS every_type_and_op world_sizes"; do
  read -r mutant tests <<<"$planted"
  status=0
  # One report is the proof: TSan ends the run at the first (each planted bug made hundreds,
  # whose reporting took most of the step's time).
  # shellcheck disable=SC2086 # $tests: test-name filters, one word each
  TSAN_OPTIONS="${TSAN_OPTIONS/halt_on_error=0/halt_on_error=1}" \
    run_emulation "$FLAGS -DSTRAGGLAR_MUTANT_$mutant" "$OUT/mutant-$mutant.log" $tests ||
    status=$?
  found=$(reports "$OUT/mutant-$mutant.log")
  if [ "$found" -eq 0 ]; then
    tail -20 "$OUT/mutant-$mutant.log" >&2
    echo "tsan-emulation: the planted $mutant went unreported (exit status $status; log: $OUT/mutant-$mutant.log)" >&2
    exit 1
  fi
  echo "tsan-emulation: the planted $mutant is reported ($found report(s))"
done
rm -f target/kernel-emulation/libemulated-*.so
