#!/usr/bin/env bash
# The GPU self-check: one prepared run on a machine with one GPU (an H200 in mind), no network
# and no Rust toolchain. Prepare here first (`scripts/gpu-check.sh --prepare`: the release build,
# the emulated GPU's driver self-test and our kernels compiled for sm_90 into a kernel cache),
# carry target/release/stragglar, target/release/libstragglar.so, target/emulated-gpu/selftest,
# target/gpu-check-kernels and target/gpu-check-loopback (the loopback NCCL and the tests' rank
# program, which load the real driver there), and run this there: it uses the machine's own PyTorch and NCCL,
# and its NVRTC only if the carried kernels do not match the GPU. Finishes within BUDGET_S
# seconds (450: under 8 minutes); prints one summary table last. In OUT it leaves only
# summary.txt and gpu-check-logs.tar.gz (every log, each cut to its first 192 KiB and last
# 64 KiB: at most 16 MiB for the 64 logs a run may write; named -only-DATE under --only).
#
# usage: scripts/gpu-check.sh [--dry-run] [--quick] [--prepare] [--only REGEX]
#   --dry-run  check the inputs (binaries, self-test, kernels of the current sources) and print
#              every step without running anything (works on any machine); fails on a missing
#              or stale input
#   --quick    fewer world sizes, types and ops (a minute or two)
#   --prepare  on the build machine: build and fill the inputs, then run the dry run
#   --only REGEX  run only the steps whose names match REGEX (bash's =~), the others marked
#              UNSELECTED (the kernels' step always runs: the others need its cache): a rerun
#              of the rows that failed, in what is left of a window; fails if none matches;
#              its summary and archive are named summary-only-DATE.txt and
#              gpu-check-logs-only-DATE.tar.gz, beside an earlier run's
# Each run of the binary (and the PyTorch check) is stopped after RUN_LIMIT_S seconds (240), or
# when the whole check's BUDGET_S is spent: a step cut short shows CUT, later steps SKIPPED.
# Environment: STRAGGLAR_BIN, STRAGGLAR_LIB (the carried binaries, default target/release/),
# STRAGGLAR_SELFTEST (default target/emulated-gpu/selftest), STRAGGLAR_KERNELS (the carried
# kernel cache, default target/gpu-check-kernels), STRAGGLAR_LOOPBACK (the carried loopback NCCL
# and rank program, default target/gpu-check-loopback), PYTHON (python3, the one with PyTorch), OUT
# (where the summary and the logs go), RUN_LIMIT_S, BUDGET_S.
#
# What it checks, the quick and most telling first (a budget cut ends the list):
#   1. doctor: what the library sees (driver, GPUs, NVRTC, NCCL); the emulated GPU's driver
#      self-test against this real driver
#   2. kernels: the carried CUBINs for this GPU (or NVRTC compiles every kernel into checked
#      ones when they do not match); the graph turn kernel's module loaded by this driver (its
#      device-side cudaGraphSetConditional resolved); a multicast team of the GPU(s), its
#      stores checked
#   3. bandwidth: the kernels' copy and reduce code against cuMemcpyDtoD (target: >= 85%), for
#      float, half and bfloat16 (the halves within 10% of float, their device conversions
#      checked against src/reduce)
#      one load's latency (pointer chase, L2 and HBM) and the rate against the grid (the bytes
#      in flight the code keeps, by Little's law)
#      the fixed cost of a step (target <= 2 us) and of a call, fitted over Ring at n = 2..8
#   4. PyTorch under LD_PRELOAD with world size 1: interception active, AllReduce right, no crash;
#      observe mode with 4 PyTorch ranks on the one GPU (the real NCCL), the late one named;
#      observe mode's host cost per call (world size 1)
#   5. correctness: stragglar bench --backend cuda, ranks as threads of one process sharing the
#      GPU (each rank on its own stream), n = 2..8, every type and op, every element checked,
#      every rank bitwise equal to the others, in place and out of place
#      the same under CUDA graph capture and replay (--graph)
#      the straggler policy found on the GPU, eagerly and in graph replays (--algo auto)
#   6. ranks as processes over CUDA IPC on the same GPU (MPS if it can be started), and again
#      with one hardware queue per process (CUDA_DEVICE_MAX_CONNECTIONS=1); the library's whole
#      path (setup through a communicator, tickets, the policy) with 4 processes on the GPU under
#      the loopback NCCL (STRAGGLAR_TEST_SHARED_GPU=1), and the stream and host time a call the
#      engine forwards to NCCL costs, engine on against off; eager calls and graph replays
#      mixed on two streams; a rank killed mid-run, its peers released by the deadline
#   7. sweeps: 8 ranks, 1K..256M, StragglAR and Ring (host time per call), and unordered reads
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
QUICK=0
PREPARE=0
ONLY=""
usage() {
  echo "usage: scripts/gpu-check.sh [--dry-run] [--quick] [--prepare] [--only REGEX]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --quick) QUICK=1 ;;
    --prepare) PREPARE=1 ;;
    --only)
      [ $# -ge 2 ] && [ -n "$2" ] || usage
      ONLY="$2"
      shift
      ;;
    *) usage ;;
  esac
  shift
done
if [ -n "$ONLY" ]; then
  [[ "" =~ $ONLY ]]
  if [ $? -eq 2 ]; then
    echo "gpu-check: --only '$ONLY' is not a valid regular expression" >&2
    usage
  fi
fi
# A rerun with --only keeps an earlier run's summary and logs: its own are named apart.
NAMED=""
if [ -n "$ONLY" ]; then NAMED="-only-$(date +%Y%m%d-%H%M%S)"; fi
# Steps --only selected (the kernels' step aside, which always runs).
SELECTED=0

BIN="${STRAGGLAR_BIN:-target/release/stragglar}"
LIB="${STRAGGLAR_LIB:-target/release/libstragglar.so}"
SELFTEST="${STRAGGLAR_SELFTEST:-target/emulated-gpu/selftest}"
KERNELS="${STRAGGLAR_KERNELS:-target/gpu-check-kernels}"
LOOPBACK="${STRAGGLAR_LOOPBACK:-target/gpu-check-loopback}"
# The architecture the carried kernels are built for: the H100's and H200's.
PREPARED_ARCH=sm_90
PYTHON="${PYTHON:-python3}"

# --prepare: the inputs, built on this machine (it needs cargo, c++ and the test wheels).
if [ "$PREPARE" = 1 ]; then
  set -e
  cargo build --release --quiet
  scripts/emulated-gpu.sh --build >/dev/null
  . scripts/wheels.sh
  wheels_cu12
  LD_LIBRARY_PATH="$NV/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    STRAGGLAR_CACHE_DIR="$KERNELS" "$BIN" kernels --arch "$PREPARED_ARCH" --cache
  built_loopback=$(scripts/emulated-gpu.sh --build-loopback-ranks)
  rm -rf "$LOOPBACK"
  cp -r "$built_loopback" "$LOOPBACK"
  set +e
  echo "carry: $BIN $LIB $SELFTEST $KERNELS $LOOPBACK"
  DRY=1
fi

OUT="${OUT:-${TMPDIR:-/tmp}/stragglar-gpu-check}"
mkdir -p "$OUT"
# A run cut short (a window that closed) leaves its logs: they go into this run's archive as
# earlier-NAME, and no row of this run reads them.
if [ "$DRY" = 0 ]; then
  for log in "$OUT"/*.log; do
    [ -f "$log" ] || continue
    case "$(basename "$log")" in earlier-*) continue ;; esac
    mv -f "$log" "$OUT/earlier-$(basename "$log")"
  done
fi
# What the run makes besides its logs (the kernel cache, CUBINs, MPS's directories); removed at
# the end, so that OUT holds only the summary and the logs' archive.
WORK="$OUT/work"
mkdir -p "$WORK"
export STRAGGLAR_CACHE_DIR="$WORK/kernel-cache"
# PyTorch runs with the loader path it came with (an older toolkit's libraries would break it).
ORIGINAL_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
# No step may take the whole session: each run of the binary gives up after this many seconds
# (the summary table still prints).
RUN_LIMIT_S="${RUN_LIMIT_S:-240}"
# The whole check ends within this many seconds: no run outlives it (each run is stopped 15 s
# before the end, its kill grace included, so the summary still prints in time).
BUDGET_S="${BUDGET_S:-450}"
DEADLINE=$((SECONDS + BUDGET_S - 15))
# Seconds a run may take now: RUN_LIMIT_S, or what is left of the budget (0: none left).
run_limit() {
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 0 ]; then left=0; fi
  if [ "$left" -lt "$RUN_LIMIT_S" ]; then echo "$left"; else echo "$RUN_LIMIT_S"; fi
}
# Runs a command under the run limit; 124 at once when no time is left.
limited() {
  local limit
  limit=$(run_limit)
  if [ "$limit" -le 0 ]; then return 124; fi
  timeout -k 5 "$limit" "$@"
}
sg() { limited "$BIN" "$@"; }

SUMMARY=()
FAILED=0
record() { # name result detail
  SUMMARY+=("$(printf '%-58s %-8s %s' "$1" "$2" "$3")")
  if [ "$2" = FAIL ]; then FAILED=1; fi
}

# Records what a run printed on its last line starting with PREFIX, less the text up to and
# including CUT: name, log file, prefix, cut.
measured() {
  if [ "$DRY" = 1 ]; then return 0; fi
  local line
  line=$(grep -h "^$3" "$OUT/$2" 2>/dev/null | tail -n 1)
  if [ -n "$line" ]; then record "$1" MEASURED "${line#*"$4"}"; fi
  return 0
}
# The kernel bandwidth summary of a bench --bandwidth run: name, log file.
bandwidth_shares() { measured "$1" "$2" '# bandwidth summary: ' '# bandwidth summary: '; }
# The host time to queue one eager call that a bench run printed: name, log file.
host_cost() { measured "$1" "$2" '# host time to queue one eager call' '): '; }

# Runs a step: name, log file, command...; records PASS or FAIL by exit status.
step() {
  local name="$1" log="$2"
  shift 2
  case "$name" in
    "kernels carried"* | "kernels compile"*) # every later step needs its kernel cache
      if [ -n "$ONLY" ] && [[ "$name" =~ $ONLY ]]; then SELECTED=$((SELECTED + 1)); fi
      ;;
    *)
      if [ -n "$ONLY" ] && ! [[ "$name" =~ $ONLY ]]; then
        record "$name" UNSELECTED "not matched by --only"
        return 0
      fi
      SELECTED=$((SELECTED + 1))
      ;;
  esac
  # No row may come from an earlier run's log.
  if [ "$DRY" = 0 ]; then rm -f "$OUT/$log"; fi
  printf '\n== %s\n$ %s\n' "$name" "$*"
  if [ "$DRY" = 1 ]; then
    record "$name" DRY-RUN "not run"
    return 0
  fi
  if [ "$SECONDS" -ge "$DEADLINE" ]; then
    record "$name" SKIPPED "the ${BUDGET_S} s budget was spent"
    FAILED=1
    return 1
  fi
  local started=$SECONDS
  "$@" 2>&1 | tee "$OUT/$log"
  local status=${PIPESTATUS[0]}
  local took=$((SECONDS - started))
  if [ "$status" = 0 ]; then
    record "$name" PASS "${took} s, log $OUT/$log"
  elif [ "$SECONDS" -ge "$DEADLINE" ]; then
    record "$name" CUT "the ${BUDGET_S} s budget ran out after ${took} s, log $OUT/$log"
    FAILED=1
  else
    record "$name" FAIL "exit $status after ${took} s, log $OUT/$log"
  fi
  return "$status"
}

# NVRTC: the machine's CUDA toolkit, or the one PyTorch's wheels bring.
# An NVRTC newer than the driver writes CUBINs the driver cannot load: skipped.
find_nvrtc_dir() {
  local candidates=() driver_major nvrtc_major
  driver_major=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)
  if [ -n "${CUDA_HOME:-}" ]; then candidates+=("$CUDA_HOME/lib64"); fi
  candidates+=(/usr/local/cuda/lib64)
  local site
  site=$("$PYTHON" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
  for dir in $site; do
    candidates+=("$dir"/nvidia/cu13/lib "$dir"/nvidia/cuda_nvrtc/lib "$dir"/nvidia/*/lib)
  done
  for dir in "${candidates[@]}"; do
    if ls "$dir"/libnvrtc.so* >/dev/null 2>&1; then
      nvrtc_major=$(ls "$dir"/libnvrtc.so.* 2>/dev/null | sed -n 's/.*libnvrtc\.so\.\([0-9]*\).*/\1/p' | head -1)
      if [ -n "$driver_major" ] && [ -n "$nvrtc_major" ] && [ "$nvrtc_major" -gt "$driver_major" ]; then
        echo "skipping NVRTC $nvrtc_major in $dir: the driver supports CUDA $driver_major" >&2
        continue
      fi
      echo "$dir"
      return 0
    fi
  done
  return 1
}

echo "stragglar gpu-check: binaries $BIN and $LIB, logs in $OUT"

# The inputs. A missing binary ends the check at once; a missing self-test or kernel cache is a
# failed row on the GPU (the kernels are then compiled there), and fails the dry run.
INPUTS_MISSING=0
input() { # name, ok (0/1), detail
  if [ "$2" = 1 ]; then
    record "input: $1" OK "$3"
  else
    record "input: $1" MISSING "$3"
    INPUTS_MISSING=1
  fi
}
for f in "$BIN" "$LIB"; do
  if [ -f "$f" ]; then
    input "$(basename "$f")" 1 "$f"
  else
    input "$(basename "$f")" 0 "$f: run scripts/gpu-check.sh --prepare and carry it"
    if [ "$DRY" = 0 ]; then
      echo "missing $f: run scripts/gpu-check.sh --prepare on the build machine and carry target/release" >&2
      exit 2
    fi
  fi
done
if [ -x "$SELFTEST" ]; then
  input "driver self-test" 1 "$SELFTEST"
else
  input "driver self-test" 0 "$SELFTEST: scripts/emulated-gpu.sh --build, then carry it"
fi
if [ -x "$LOOPBACK/loopback_ranks" ] && [ -f "$LOOPBACK/libnccl.so.2" ]; then
  input "loopback NCCL and rank program" 1 "$LOOPBACK"
else
  input "loopback NCCL and rank program" 0 "$LOOPBACK: scripts/gpu-check.sh --prepare, then carry it"
fi
# The carried kernels match these sources when the binary finds their cache entry.
kernels_carried() { # arch
  [ -f "$BIN" ] && STRAGGLAR_CACHE_DIR="$KERNELS" "$BIN" kernels --arch "$1" --cached >/dev/null 2>&1
}
if kernels_carried "$PREPARED_ARCH"; then
  input "kernels ($PREPARED_ARCH, these sources)" 1 "$KERNELS"
elif [ -f "$BIN" ]; then
  input "kernels ($PREPARED_ARCH, these sources)" 0 "none in $KERNELS: scripts/gpu-check.sh --prepare"
else
  input "kernels ($PREPARED_ARCH, these sources)" 0 "not checked without $BIN"
fi

if [ "$DRY" = 0 ]; then
  # The policy tables are written inside their steps: none may be left from an earlier run.
  rm -f "$OUT/policy-table.log" "$OUT/graph-policy-table.log"
  if NVRTC_DIR=$(find_nvrtc_dir); then
    # The loader is asked for libnvrtc.so before any versioned name, and the system's cache
    # may hold another toolkit's: a link of that name to the chosen library comes first.
    mkdir -p "$WORK/nvrtc"
    ln -sf "$(ls "$NVRTC_DIR"/libnvrtc.so.[0-9]* | head -1)" "$WORK/nvrtc/libnvrtc.so"
    export LD_LIBRARY_PATH="$WORK/nvrtc:$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "NVRTC from $NVRTC_DIR"
  else
    echo "no libnvrtc found: the kernels cannot be compiled here" >&2
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader 2>/dev/null || true
fi

# 1. What the library sees.
step "doctor" doctor.log sg doctor

# 1b. The driver semantics the emulated GPU promises (tests/emulated/selftest.c), against this
#     real driver: what CI proves on the emulation holds only as far as these pass here.
selftest() {
  if [ ! -x "$SELFTEST" ]; then
    echo "$SELFTEST not carried (build it with scripts/emulated-gpu.sh --build)"
    return 1
  fi
  limited "$SELFTEST"
}
step "driver self-test (the emulated GPU's reference)" selftest.log selftest

# 2. Kernels for this GPU.
ARCH=sm_90
if [ "$DRY" = 0 ]; then
  CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  if [ -n "$CC" ]; then ARCH="sm_$CC"; fi
fi
# The carried cache entry when it is this GPU's architecture (no NVRTC on the device: a minute
# saved), else NVRTC compiles them here.
carried_kernels() {
  mkdir -p "$STRAGGLAR_CACHE_DIR"
  cp "$KERNELS"/stragglar-*-"$ARCH"-*.cubin "$STRAGGLAR_CACHE_DIR"/ &&
    "$BIN" kernels --arch "$ARCH" --cached
}
if [ "$DRY" = 1 ] || kernels_carried "$ARCH"; then
  step "kernels carried, built here for $ARCH" kernels.log carried_kernels
else
  step "kernels compile with NVRTC ($ARCH)" kernels.log sg kernels --arch "$ARCH" --cache --out "$WORK/cubins"
fi

# 2a. The graph turn kernel's module: the driver resolves its device-runtime call
#     (cudaGraphSetConditional) when it loads it, from CUDA 12.3 on; the doctor's graphs line
#     says whether it loaded (graph replays then choose between StragglAR and NCCL's own work).
turn_module() {
  mkdir -p "$WORK"
  sg doctor >"$WORK/turn-doctor.txt" || return 1
  grep "graphs:" "$WORK/turn-doctor.txt"
  grep -q "graphs:    replays choose between StragglAR and NCCL's own captured work" "$WORK/turn-doctor.txt"
}
step "graph turn kernel loads (cudaGraphSetConditional)" turn-module.log turn_module

# 2b. NVLink multicast: a team of every GPU through the engine's protocol (probe, create, join,
#     bind), then its probe kernel's multimem stores checked bit for bit in every GPU's memory
#     (one GPU: a team of one, whose stores still go through the multicast object where the GPU
#     has multicast); the doctor's line says what happened, or that the GPU has none.
step "multicast team (doctor --multicast)" multicast.log sg doctor --multicast
measured "  multicast" multicast.log '  multicast: ' '  multicast: '
#     The engine's multicast StragglAR (STRAGGLAR_MULTICAST=1) needs one GPU per rank in its team
#     (a GPU joins a multicast object once), so ranks sharing this machine's GPU cannot run it:
#     said once the team's step ran, never counted as a pass.
if [ "$DRY" = 0 ] && [ -s "$OUT/multicast.log" ]; then
  record "  multicast StragglAR on the engine" "NOT RUN" "not in this check: it needs a rank per GPU on two or more GPUs with multicast (tested on the emulated machine only)"
fi

# 3. Kernel bandwidth against the device's copy rate.
#    At two grids: two blocks per SM (the device's rate), and the AllReduce's own grid (the
#    blocks one call gets: what a real call's copies and reductions can reach).
#    With half and bfloat16 the run first checks the device's conversions (hardware cvt)
#    against src/reduce bit for bit, and fails if they differ; compare their shares with
#    float's (target: within 10%).
for t in float half bfloat16; do
  step "kernel bandwidth vs cuMemcpyDtoD ($t)" "bandwidth-$t.log" \
    sg bench --backend cuda --ranks 8 --bandwidth -d "$t" -b 256M -e 256M -n 20 -w 2 --buffer-bytes 1G \
    --timeout-ms 60000
  bandwidth_shares "  $t: share of cuMemcpyDtoD (HBM on one GPU, not NVLink; targets: copy and reduce of 2 >= 85%, reduce of 7 >= 80%)" "bandwidth-$t.log"
  if [ "$t" != float ]; then
    measured "  $t: the device's cvt against src/reduce" "bandwidth-$t.log" '# conversions: ' '# conversions: '
  fi
done

# 3a. Latency and bytes in flight: one load's latency by a pointer chase (a ring in the L2,
#     one of four times the L2 in HBM), then the copy and the reduce of 2 on 256 MiB at 1 block,
#     2, 4 .. two per SM and the AllReduce grid, with the reads each keeps in flight by
#     Little's law (rate x unloaded latency, an estimate): how many blocks the code needs to
#     reach its rate. One GPU: L2 and HBM, not NVLink (the row says so). The bench's own
#     AllReduce after it runs 2 ranks at 256 MiB (a few seconds).
step "latency and bytes in flight (pointer chase, grid sweep)" "latency.log" \
  sg bench --backend cuda --ranks 2 --latency -b 256M -e 256M -n 10 -w 1 --buffer-bytes 1G \
  --timeout-ms 60000
measured "  latency and bytes in flight" "latency.log" '# latency summary: ' '# latency summary: '

# 3b. Fixed costs: Ring on 1 KiB (the data moves in no time), each rank's calls captured into a
#     graph and replayed (no host in the timing), at 2, 4, 6 and 8 ranks sharing the GPU. The time
#     per call against the steps every rank runs, 2(n-1), fitted by least squares: the slope is
#     the fixed cost of a step (target: at most 2 us), the intercept that of a call. On one GPU a
#     step's flag crosses L2, not NVLink: a floor for what a step costs between GPUs.
fixed_cost() {
  local n steps time points=""
  for n in 2 4 6 8; do
    local log="$OUT/fixed-cost-$n.log"
    if ! sg bench --backend cuda --graph --ranks "$n" --algo ring -d float -o sum -b 1K -e 1K \
      -n 200 -w 10 -a 3 --timeout-ms 20000 >"$log" 2>&1; then
      tail -5 "$log"
      return 1
    fi
    steps=$((2 * (n - 1)))
    # The slowest rank's time (-a 3), out of place: the table's sixth column.
    time=$(awk '$1 == 1024 && $5 == -1 { t = $6 } END { print t }' "$log")
    if [ -z "$time" ]; then
      echo "n=$n: no time in $log"
      return 1
    fi
    echo "n=$n: $steps steps per rank, $time us per call"
    points="$points $steps $time"
  done
  fixed_cost_fit $points
}
# Least squares over pairs "steps time_us ...": prints the '# fixed cost:' line.
fixed_cost_fit() {
  echo "$@" | awk '{
    for (i = 1; i < NF; i += 2) { x = $i; y = $(i + 1); k++; sx += x; sy += y; sxx += x * x; sxy += x * y }
    b = (k * sxy - sx * sy) / (k * sxx - sx * sx); a = (sy - b * sx) / k
    printf "# fixed cost: %.2f us per step (target <= 2 us), %.2f us per call (Ring on 1 KiB, n = 2..8, graph replays; one GPU: L2, not NVLink)\n", b, a
  }'
}
step "fixed cost per step and per call (Ring, graphs)" fixed-cost.log fixed_cost
measured "  fixed costs (least squares over n = 2, 4, 6, 8)" fixed-cost.log '# fixed cost: ' '# fixed cost: '

# 4. PyTorch under LD_PRELOAD, world size 1: the results, and the library's own log saying it
#    bound the real NCCL and saw the AllReduce (which forwards: one rank is too few).
torch_check() {
  local run="$OUT/torch-run.log" status
  LD_LIBRARY_PATH="$ORIGINAL_LD_LIBRARY_PATH" STRAGGLAR_DEBUG=INFO LD_PRELOAD="$(realpath "$LIB")" \
    limited "$PYTHON" - >"$run" 2>&1 <<'PY'
import os, socket
import torch
import torch.distributed as dist

assert torch.cuda.is_available(), "PyTorch sees no GPU"
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
for dtype in (torch.float32, torch.bfloat16, torch.int32):
    t = torch.arange(4096, device="cuda").to(dtype)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    assert torch.equal(t, torch.arange(4096, device="cuda").to(dtype)), dtype
maps = open("/proc/self/maps").read()
assert "libstragglar.so" in maps, "libstragglar.so is not loaded"
print("NCCL", torch.cuda.nccl.version(), "- AllReduce through libstragglar.so: ok")
dist.destroy_process_group()
PY
  status=$?
  cat "$run"
  [ "$status" = 0 ] || return "$status"
  local expected
  for expected in "bound real NCCL" "goes to NCCL: fewer than 4 ranks"; do
    if ! grep -q "$expected" "$run"; then
      echo "the library's log lacks \"$expected\": interception is not active"
      return 1
    fi
  done
}
step "PyTorch LD_PRELOAD, world size 1" torch.log torch_check

# 4b. Observe mode on the real NCCL: 4 PyTorch processes on the one GPU, each with an NCCL_HOSTID
#     of its own (reported to make NCCL take ranks sharing a GPU over its network path; if it
#     refuses, the row says so), rank 2 sleeping 5 ms before each of 80 AllReduces of 4 MiB;
#     `stragglar report` on their records must name rank 2, 4 to 6 ms late.
observe_check() {
  local records="$WORK/observe-records" run="$OUT/observe-run.log" status
  rm -rf "$records"
  mkdir -p "$records"
  # A file, not standard input: the spawned ranks import the script's functions from it.
  cat >"$WORK/observe.py" <<'PY'
import os, socket, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def rank_main(rank, world, port):
    os.environ["NCCL_HOSTID"] = f"stragglar-gpu-check-{rank}"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    t = torch.empty(1 << 20, device="cuda")
    for _ in range(80):
        t.fill_(1.0)
        if rank == 2:
            time.sleep(0.005)
        dist.all_reduce(t)
    torch.cuda.synchronize()
    assert t[0].item() == world, t[0].item()
    dist.destroy_process_group()

if __name__ == "__main__":
    assert torch.cuda.is_available(), "PyTorch sees no GPU"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(4, port), nprocs=4, join=True)
    print("4 ranks on one GPU, 80 AllReduces each: ok")
PY
  LD_LIBRARY_PATH="$ORIGINAL_LD_LIBRARY_PATH" STRAGGLAR_OBSERVE=1 STRAGGLAR_REPORT_DIR="$records" \
    LD_PRELOAD="$(realpath "$LIB")" limited "$PYTHON" "$WORK/observe.py" >"$run" 2>&1
  status=$?
  tail -20 "$run"
  if [ "$status" != 0 ]; then
    if grep -q "Duplicate GPU detected" "$run"; then
      echo "# observe: NCCL refused 4 ranks on one GPU (NCCL_HOSTID per rank did not help): see $run"
    else
      echo "# observe: the 4 ranks failed (exit status $status), not for sharing the GPU: see $run"
    fi
    return "$status"
  fi
  "$BIN" report "$records" || return 1
  local named late
  named=$("$BIN" report "$records" | grep -m1 "persistent straggler: rank 2 ")
  if [ -z "$named" ]; then
    echo "# observe: the report did not name rank 2"
    return 1
  fi
  late=$(sed -n 's/.*late by \([0-9.]*\) ms (median).*/\1/p' <<<"$named")
  echo "# observe: $named"
  if ! awk -v ms="$late" 'BEGIN { exit !(ms >= 4 && ms <= 6) }'; then
    echo "# observe: rank 2 named, but late by ${late:-?} ms, not 4 to 6"
    return 1
  fi
}
step "observe mode, 4 PyTorch ranks on one GPU (real NCCL), rank 2 late" observe.log observe_check
measured "  the report on the real NCCL" observe.log '# observe: ' '# observe: '

# Observe mode's cost on the real NCCL: the host time of 2000 AllReduces of 4 KiB through
# PyTorch (world size 1), with observe mode off and on: the medians and their difference.
observe_cost() {
  local run="$OUT/observe-cost-run.log"
  cat >"$WORK/observe_cost.py" <<'PY'
import os, socket, time
import torch
import torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.ones(1024, device="cuda")
for _ in range(200):
    dist.all_reduce(t)
torch.cuda.synchronize()
ns = []
for _ in range(2000):
    start = time.perf_counter_ns()
    dist.all_reduce(t)
    ns.append(time.perf_counter_ns() - start)
torch.cuda.synchronize()
dist.destroy_process_group()
ns.sort()
print(f"host_ns {ns[len(ns) // 2]}")
PY
  local off on
  off=$(LD_LIBRARY_PATH="$ORIGINAL_LD_LIBRARY_PATH" LD_PRELOAD="$(realpath "$LIB")" \
    limited "$PYTHON" "$WORK/observe_cost.py" 2>>"$run" | sed -n 's/^host_ns //p')
  on=$(LD_LIBRARY_PATH="$ORIGINAL_LD_LIBRARY_PATH" STRAGGLAR_OBSERVE=1 \
    STRAGGLAR_REPORT_DIR="$WORK/observe-cost-records" LD_PRELOAD="$(realpath "$LIB")" \
    limited "$PYTHON" "$WORK/observe_cost.py" 2>>"$run" | sed -n 's/^host_ns //p')
  if [ -z "$off" ] || [ -z "$on" ]; then
    echo "# observe cost: the timing runs failed: see $run"
    return 1
  fi
  echo "# observe cost: host time per AllReduce of 4 KiB through PyTorch (world size 1, median of 2000): off $((off / 1000)).$(((off % 1000) / 100)) us, on $((on / 1000)).$(((on % 1000) / 100)) us, difference $((on - off)) ns"
}
step "observe mode's cost per call (PyTorch, world size 1, real NCCL)" observe-cost.log observe_cost
measured "  observe mode's host cost per call" observe-cost.log '# observe cost: ' '# observe cost: '

# 5. Correctness: every type and op, world sizes 2..8, ranks as threads sharing the GPU, the
#    straggler and the algorithm varied; one process per world size and algorithm.
TYPES=all
OPS=all
RANKS="2 3 4 5 6 7 8"
if [ "$QUICK" = 1 ]; then
  TYPES=int32,half,float,bfloat16
  OPS=sum,avg,premulsum
  RANKS="2 4 8"
fi
matrix() {
  local failures=0 runs=0
  for n in $RANKS; do
    for algo in stragglar ring; do
      runs=$((runs + 1))
      local log="$OUT/matrix-$n-$algo.log"
      if ! sg bench --backend cuda --ranks "$n" --algo "$algo" -d "$TYPES" -o "$OPS" \
        -b 1 -e 4M -f 16 -n 2 -w 1 --straggler $((runs % n)) --timeout-ms 20000 >"$log" 2>&1; then
        failures=$((failures + 1))
        echo "FAILED: n=$n $algo (see $log)"
        grep -v '^ ' "$log" | tail -5
      fi
    done
    echo "n=$n done ($runs runs so far, $failures failed)"
  done
  echo "$runs runs, $failures failed"
  [ "$failures" = 0 ]
}
step "bench --backend cuda: n=${RANKS// /,}, types $TYPES, ops $OPS" matrix.log matrix

# Odd sizes (counts that are no multiple of anything): one plan blob per schedule serves every
# count, the kernel deriving chunk ranges and slots from the count; eager calls, then graph
# replays choosing on the GPU.
odd_sizes() {
  sg bench --backend cuda --ranks 5 -d all -o sum,max -b 997 -e 200000 -i 49999 -n 2 -w 1 \
    --straggler 2 --timeout-ms 20000 || return 1
  sg bench --backend cuda --ranks 5 --graph --algo auto -d float,bfloat16,int8 -o sum \
    -b 1001 -e 300000 -i 99999 -n 4 -w 1 --timeout-ms 20000
}
step "bench --backend cuda: odd sizes, 5 ranks, eager and graph" odd-sizes.log odd_sizes

# CUDA graphs: each rank's timed calls captured once and replayed; the replays are checked
# (the epochs live in device memory and must advance with no host help).
graphs() {
  for n in 4 8; do
    sg bench --backend cuda --graph --ranks "$n" -d float,bfloat16,int32 -o sum,avg,min \
      -b 1K -e 16M -f 4 -n 5 -w 1 --straggler 1 --timeout-ms 60000 || return 1
  done
}
step "CUDA graph capture and replay: 4 and 8 ranks" graphs.log graphs

# The straggler policy on the GPU: rank 3 held back on the device for 300 us before each call;
# every rank decides from its own ring of arrival records (as ncclAllReduce does), so the
# bench fails on any disagreement; the last rows must show rank 3 designated (the column before
# last) and StragglAR used (the last, its share of calls).
# With --graph, each rank captures its timed calls once as graph launches: every replay numbers
# itself, records its arrival and picks StragglAR or Ring from the device's own records (no
# host involved); replay outputs join the digest all ranks share, and the last rows show the
# GPU's choice. usage: policy TABLE [bench options...]
policy() {
  local table="$OUT/$1"
  shift
  rm -f "$table"
  sg bench --backend cuda --ranks 4 --algo auto --late-rank 3 --delay-us 300 \
    -b 1M -e 4M -f 2 -n 60 -w 4 --timeout-ms 60000 "$@" >"$table" 2>&1
  local status=$?
  cat "$table"
  [ "$status" = 0 ] || return 1
  grep -E '^ +[0-9]+ ' "$table" | tail -n 1 |
    awk '$(NF-1) == 3 && $NF > 0 { found = 1 } END { exit !found }'
}
step "straggler policy on the GPU: 4 ranks, rank 3 late" policy.log policy policy-table.log
host_cost "host time per eager call, 4 ranks, policy" policy-table.log
step "policy in graph replays, on the GPU: 4 ranks, rank 3 late" graph-policy.log \
  policy graph-policy-table.log --graph

# 6. Ranks as processes over CUDA IPC on the same GPU. Without MPS their kernels time-slice,
#    so a waiting rank spins until its slice ends: small sizes. MPS is started if it can be.
MPS_STARTED=0
if [ "$DRY" = 0 ] && [ "$(run_limit)" -gt 90 ] && command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  export CUDA_MPS_PIPE_DIRECTORY="$WORK/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$WORK/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d 2>/dev/null; then
    # The daemon may start yet serve no client (in some containers): a small run, which
    # creates a context and launches kernels, checks one.
    if timeout -k 5 45 "$BIN" bench --backend cuda --ranks 2 -b 1K -e 1K -n 1 -w 1 \
      --timeout-ms 10000 >"$OUT/mps-check.log" 2>&1; then
      MPS_STARTED=1
      echo "MPS started"
    else
      echo "MPS started but its clients fail (see $OUT/mps-check.log): running without it"
      timeout 10 sh -c 'echo quit | nvidia-cuda-mps-control' || true
    fi
  fi
  if [ "$MPS_STARTED" = 0 ]; then unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; fi
fi
processes() {
  local failures=0
  for n in 2 3 4; do
    if ! sg bench --backend cuda --ranks-as processes --ranks "$n" -d float,bfloat16,int32 \
      -o sum,avg,max -b 1 -e 64K -f 16 -n 2 -w 1 --straggler $((n - 1)) --timeout-ms 60000 \
      >"$OUT/processes-$n.log" 2>&1; then
      failures=$((failures + 1))
      echo "FAILED: $n processes (see $OUT/processes-$n.log)"
      grep -v '^ ' "$OUT/processes-$n.log" | tail -5
    else
      echo "$n processes: ok"
    fi
  done
  [ "$failures" = 0 ]
}
step "processes over CUDA IPC: n=2,3,4 (MPS: $([ "$MPS_STARTED" = 1 ] && echo on || echo off))" processes.log processes
# One hardware queue per process (CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron-style jobs set):
# every stream of a rank shares one queue, whose work starts in the order it was queued, so a
# kernel of ours that spun for work queued behind it would hang here; eager calls, then graph
# replays choosing on the GPU. The emulated machine models the queues; this holds the engine
# to the real ones.
one_queue() {
  CUDA_DEVICE_MAX_CONNECTIONS=1 sg bench --backend cuda --ranks-as processes --ranks 3 \
    -d float,bfloat16 -o sum,max -b 1 -e 64K -f 16 -n 2 -w 1 --straggler 2 \
    --timeout-ms 60000 || return 1
  CUDA_DEVICE_MAX_CONNECTIONS=1 sg bench --backend cuda --ranks-as processes --ranks 3 --graph \
    --algo auto -d float -o sum -b 1K -e 64K -f 8 -n 4 -w 1 --timeout-ms 60000
}
step "one hardware queue per process: 3 processes, eager and graph (MPS: $([ "$MPS_STARTED" = 1 ] && echo on || echo off))" one-queue.log one_queue

# The library's own path, which the bench above leaves out: ranks as processes joining through
# a communicator (the loopback NCCL: ranks are processes of this host, its collectives run on
# the host), the engine's setup over IPC, tickets, the policy and teardown, with every rank on
# this one GPU (STRAGGLAR_TEST_SHARED_GPU=1, for tests only: the grid sized so that every
# rank's blocks stay resident), libstragglar.so preloaded. usage: loopback_ranks ARGS... (with
# the run's settings in the environment)
loopback_ranks() {
  local dir
  dir=$(realpath "$LOOPBACK")
  LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LD_PRELOAD="$(realpath "$LIB")" \
    STRAGGLAR_NCCL_LIB="$dir/libnccl.so.2" STRAGGLAR_TEST_SHARED_GPU=1 LOOPBACK_DEVICE=0 \
    STRAGGLAR_MIN_BYTES=0 STRAGGLAR_TIMEOUT_MS="${STRAGGLAR_TIMEOUT_MS:-30000}" \
    limited "$dir/loopback_ranks" "$@"
}
#    Every call on StragglAR, each checked element by element on every rank.
whole_path() {
  local run="$OUT/whole-path-run.log" status on_engine
  STRAGGLAR_GPU_ENGINE=1 STRAGGLAR_ALGO=stragglar STRAGGLAR_BUFFER_BYTES=1M STRAGGLAR_DEBUG=INFO \
    loopback_ranks 4 >"$run" 2>&1
  status=$?
  grep -v " STRAGGLAR INFO " "$run" | tail -n 12
  on_engine=$(grep -c "100 calls, 100 on StragglAR, 0 on NCCL" "$run")
  echo "# whole path: $on_engine of 4 ranks ran their 100 calls on the engine, every element checked"
  [ "$status" = 0 ] && [ "$on_engine" = 4 ]
}
step "the library's whole path: 4 processes on the GPU, loopback NCCL (MPS: $([ "$MPS_STARTED" = 1 ] && echo on || echo off))" whole-path.log whole_path
#    What a call the engine forwards to NCCL costs the stream (target: at most 2 us more than
#    with the engine off) and the host: 1000 calls of 16 KiB with nobody late, each timed
#    between events recorded on the caller's stream just before and after it (loopback NCCL's
#    own work included, alike in both runs), the medians over the ranks of each rank's median.
medians() { # "host" or "stream", log: the median over ranks of each rank's median, in ns
  sed -n "s/.*: $1 time per call over [0-9]* calls: median \([0-9]*\) ns.*/\1/p" "$2" | sort -n |
    awk '{ m[NR] = $1 } END { if (NR == 0) exit 1; print m[int((NR + 1) / 2)] }'
}
forwarded_cost() {
  local engine run stream host forwarded
  local -a line=()
  for engine in 0 1; do
    run="$OUT/forwarded-$engine.log"
    STRAGGLAR_GPU_ENGINE=$engine LOOPBACK_FIXED=1 LOOPBACK_CALLS=1000 LOOPBACK_HOST_TIMES=1 \
      LOOPBACK_STREAM_TIMES=1 loopback_ranks 4 >"$run" 2>&1 || { tail -n 12 "$run"; return 1; }
    stream=$(medians stream "$run") && host=$(medians host "$run") || { tail -n 12 "$run"; return 1; }
    forwarded=$(sed -n 's/.*, \([0-9]*\) on NCCL$/\1/p' "$run" | awk '{ s += $1 } END { print s + 0 }')
    echo "engine $engine: stream $stream ns, host $host ns, $forwarded of 4000 calls on NCCL"
    line+=("$stream" "$host" "$forwarded")
  done
  echo "# forwarded: stream time per call engine off $((line[0] / 1000)).$(((line[0] % 1000) / 100)) us, on $((line[3] / 1000)).$(((line[3] % 1000) / 100)) us, difference $((line[3] - line[0])) ns (target <= 2000); host time off $((line[1] / 1000)).$(((line[1] % 1000) / 100)) us, on $((line[4] / 1000)).$(((line[4] % 1000) / 100)) us; on NCCL: ${line[5]} of 4000 calls (4 processes, one GPU, loopback NCCL)"
}
step "forwarded calls' cost, engine on vs off: 4 processes, loopback NCCL (MPS: $([ "$MPS_STARTED" = 1 ] && echo on || echo off))" forwarded.log forwarded_cost
measured "  a forwarded call's stream and host time" forwarded.log '# forwarded: ' '# forwarded: '
#    A soak mixing the engine's eager calls and graph replays of one communicator: each round an
#    eager call not waited for on one stream (rank 1 late to it), then a replay of a captured call
#    on another, both checked; the two must never overlap on the GPU with the same flags.
SOAK_ROUNDS=200
if [ "$QUICK" = 1 ]; then SOAK_ROUNDS=40; fi
mixed_soak() {
  local run="$OUT/mixed-soak-run.log" status checked
  STRAGGLAR_GPU_ENGINE=1 STRAGGLAR_ALGO=stragglar STRAGGLAR_BUFFER_BYTES=1M \
    LOOPBACK_MIXED=$SOAK_ROUNDS loopback_ranks 4 >"$run" 2>&1
  status=$?
  tail -n 12 "$run"
  checked=$(grep -c ": $SOAK_ROUNDS mixed rounds checked" "$run")
  echo "# mixed soak: $checked of 4 ranks checked $SOAK_ROUNDS rounds of an eager call and a replay"
  [ "$status" = 0 ] && [ "$checked" = 4 ]
}
step "eager calls and graph replays mixed: 4 processes, $SOAK_ROUNDS rounds, loopback NCCL" mixed-soak.log mixed_soak
#    A rank that never arrives: rank 2 is killed before call 30, and every other rank's call
#    must give up by the deadline (5 s), report the error and abort its communicator, on the
#    engine (the GPU's waits watch the deadline and the failure words), not hang.
#    The whole run (setup, 30 calls, the wait) must end within NEVER_ARRIVES_S (60) seconds:
#    ranks released by the deadline, not by the run limit.
NEVER_ARRIVES_S=60
never_arrives() {
  local run="$OUT/never-arrives-run.log" status failed started=$SECONDS took
  STRAGGLAR_GPU_ENGINE=1 STRAGGLAR_ALGO=stragglar STRAGGLAR_BUFFER_BYTES=1M \
    STRAGGLAR_TIMEOUT_MS=5000 loopback_ranks 4 2 30 >"$run" 2>&1
  status=$?
  took=$((SECONDS - started))
  tail -n 12 "$run"
  failed=$(grep -c "^rank [013]: error at call 30" "$run")
  echo "# never arrives: $failed of the 3 other ranks failed call 30 and aborted (exit $status) in $took s (at most $NEVER_ARRIVES_S)"
  [ "$status" = 0 ] && [ "$failed" = 3 ] && [ "$took" -le "$NEVER_ARRIVES_S" ]
}
step "a rank that never arrives: 4 processes, rank 2 killed, a 5 s deadline" never-arrives.log never_arrives
if [ "$MPS_STARTED" = 1 ]; then
  timeout 10 sh -c 'echo quit | nvidia-cuda-mps-control' || true
  sleep 2
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

# Sweeps last (a short window loses these first): larger messages, both algorithms, with
# timings (nccl-tests style tables).
for algo in stragglar ring; do
  step "bench --backend cuda: 8 ranks, 1K..256M, $algo" "sweep-$algo.log" \
    sg bench --backend cuda --ranks 8 --algo "$algo" -b 1K -e 256M -f 4 -n 10 -w 2 \
    --straggler 7 --timeout-ms 60000 --buffer-bytes 1G
done
host_cost "host time per eager call, 8 ranks, fixed plan" sweep-stragglar.log
# The same StragglAR calls with reads unordered (the sweep above keeps each send port in round
# order, as the library does): correctness, and the times to compare.
step "bench --backend cuda: 8 ranks, 1M..64M, unordered reads" sweep-unordered.log \
  sg bench --backend cuda --ranks 8 --algo stragglar --unordered-reads -b 1M -e 64M -f 4 -n 10 \
  -w 2 --straggler 7 --timeout-ms 60000

# Every log in one archive of bounded size, each cut to its first 192 KiB and last 64 KiB; the
# work files go. OUT keeps the summary and the archive.
if [ "$DRY" = 0 ]; then
  mkdir -p "$WORK/logs"
  for log in "$OUT"/*.log; do
    [ -f "$log" ] || continue
    if [ "$(stat -c %s "$log")" -gt $((256 << 10)) ]; then
      { head -c $((192 << 10)) "$log"; printf '\n[... cut: %s bytes in all ...]\n' "$(stat -c %s "$log")"; tail -c $((64 << 10)) "$log"; } >"$WORK/logs/$(basename "$log")"
    else
      cp "$log" "$WORK/logs/"
    fi
    rm -f "$log"
  done
  tar -czf "$OUT/gpu-check-logs$NAMED.tar.gz" -C "$WORK" logs
  rm -rf "$WORK"
fi

if [ "$DRY" = 1 ]; then
  rm -rf "$WORK"
  if [ "$INPUTS_MISSING" = 1 ]; then FAILED=1; fi
fi
if [ -n "$ONLY" ] && [ "$SELECTED" = 0 ]; then
  record "--only $ONLY" FAIL "matched no step"
fi
{
  echo
  echo "== gpu-check summary ($((SECONDS)) s of a ${BUDGET_S} s budget)"
  printf '%-58s %-8s %s\n' "check" "result" "detail"
  for line in "${SUMMARY[@]}"; do
    echo "$line"
  done
  if [ "$DRY" = 0 ]; then echo "logs: $OUT/gpu-check-logs$NAMED.tar.gz (log names as in the rows)"; fi
} | tee "$OUT/summary$NAMED.txt"
exit "$FAILED"
