#!/usr/bin/env bash
# Runs a command on the emulated CUDA machine: a libcuda.so.1 built from tests/emulated/ (8 GPUs
# by default, each P2P-capable with every other; kernels are the host build of cuda/, run on the
# CPU) and a loopback libnccl.so.2 (tests/emulated/nccl/: ranks are processes of this host) first
# on the loader path, NVRTC from the pip wheel beside them, and a kernel cache shared by every
# run. It builds what it needs (the driver and the NCCL, and the wheels into the ignored .venv on
# first use) and is what the tests use, from a fresh clone.
#
# usage: scripts/emulated-gpu.sh CMD [ARGS...]
#        scripts/emulated-gpu.sh --build      (only build; prints the driver's directory)
#        scripts/emulated-gpu.sh --build-without cuNAME   (a driver lacking that export; prints
#                                                          its directory, to put first on
#                                                          LD_LIBRARY_PATH)
#        scripts/emulated-gpu.sh --build-cuda-12.0        (a driver lacking every export newer
#                                                          than CUDA 12.0, to run with
#                                                          STRAGGLAR_EMU_DRIVER_VERSION=12000;
#                                                          prints its directory, likewise)
#        scripts/emulated-gpu.sh --build-mutant NAME      (a driver whose kernels carry the
#                                                          planted bug STRAGGLAR_MUTANT_NAME of
#                                                          docs/EMULATED-GPU.md; prints its
#                                                          directory, likewise)
#        scripts/emulated-gpu.sh --build-loopback-ranks   (the loopback NCCL and
#                                                          tests/c/loopback_ranks.c linked
#                                                          against it alone, libstragglar.so to
#                                                          be preloaded: what gpu-check runs on
#                                                          a real driver; prints the directory)
#
# What it proves and what it does not: the host code, the driver calls and the kernel source run
# as a whole (streams, events, capture, IPC between processes, the kernels' protocol), with real
# concurrency, memory scopes checked, the kernels' plain stores held back until a release
# publishes them, their plain loads stale where no acquire orders them and their strong loads
# returning older values a few times (weak memory), and
# processes sharing a GPU by time slices (or MPS). It says nothing about timing or speed, and
# the CUDA runtime (PyTorch) cannot run on it: it needs more of the driver than the engine does.
#
# Knobs (environment): STRAGGLAR_EMU_GPUS (8), STRAGGLAR_EMU_SMS (32), STRAGGLAR_EMU_MULTICAST (0),
# STRAGGLAR_EMU_DRIVER_VERSION (13000), STRAGGLAR_EMU_FAIL (name[@device][=code],...: make a
# driver call fail), STRAGGLAR_EMU_NO_NVRTC (1: NVRTC left off the loader path, so kernels come
# from the cache or nowhere), STRAGGLAR_EMU_COUNT_LAUNCHES (1: each process prints how many
# times each kernel ran, replays included, to stderr at exit), STRAGGLAR_EMU_KERNEL_FAULT (NAME@N: the Nth launch of
# that kernel faults, and its context is lost), STRAGGLAR_EMU_SEED (N > 0: seeded random
# scheduling, printed at cuInit; 0 or unset: the deterministic order), STRAGGLAR_EMU_WEAK_MEMORY
# (0: the kernels' plain stores land at once instead of at a release, and their loads are never
# stale; stores: held back, never stale), STRAGGLAR_EMU_PEER_LOADS
# (wrong: a kernel's 32-bit acquire loads of another GPU's memory return the complement of what
# it holds, where the copy engine reads it right), CUDA_DEVICE_MAX_CONNECTIONS
# (hardware queues per context, 8), STRAGGLAR_EMU_TIMESLICE_US (2000: how long a process keeps a
# GPU that another process's kernels wait for; 0: processes' kernels run at once),
# STRAGGLAR_EMU_MPS (1: no time slices, the processes share each GPU's multiprocessors),
# STRAGGLAR_EMU_SHARING_REPORT (1: each process prints at exit how often it took a GPU's turn
# from another), STRAGGLAR_EMU_MACHINE (the machine's name, one per run unless set),
# STRAGGLAR_CACHE_DIR (default target/emulated-gpu/kernels).
# Strong accesses narrower than .sys to a word another GPU or the host touches end the process
# (see docs/EMULATED-GPU.md, "The strict machine").
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
. scripts/wheels.sh
wheels_cu12 >&2

BUILD="$ROOT/target/emulated-gpu"
DRIVER="$BUILD/libcuda.so.1"
SOURCES=(tests/emulated/*.cpp tests/emulated/*.h tests/emulated/exports.map cuda/*)
mkdir -p "$BUILD"
stale() {
  local source
  [ ! -f "$1" ] && return 0
  for source in "${SOURCES[@]}" scripts/emulated-gpu.sh; do
    [ "$source" -nt "$1" ] && return 0
  done
  return 1
}
# One build at a time (tests run this script from several threads at once); the lock is
# released before the command runs.
exec 9>"$BUILD/.build.lock"
flock 9
# The driver is linked from an object per source, compiled two at a time. Every object but the
# kernels' (kernel_source.o, which includes cuda/) lies in $OBJ and serves every variant of the
# driver; a mutant compiles only its own kernel_source.o, and a driver lacking an export only
# links again.
CXXFLAGS=(-std=c++17 -O2 -g -fPIC -pthread -Wall -Wextra -Werror -Wno-unused-parameter
  -ffp-contract=off -DSTRAGGLAR_HOST_EMULATION -I "$NV/cuda_runtime/include" -I cuda)
OBJ="$BUILD/obj"
mkdir -p "$OBJ"
# Compiles the driver's sources that are stale: each into $OBJ, kernel_source.cpp into $1 with
# the further flags given.
compile_driver() {
  local kernels="$1" failed=0 source object pid pids=()
  shift
  for source in tests/emulated/*.cpp; do
    object="$OBJ/${source##*/}"
    object="${object%.cpp}.o"
    [ "$source" = tests/emulated/kernel_source.cpp ] && object="$kernels/kernel_source.o"
    stale "$object" || continue
    # Two at a time: the oldest job is waited for by its pid (a `wait -n` may miss a job that
    # ended while the loop ran, and then reports a failure that did not happen).
    if [ "${#pids[@]}" -ge 2 ]; then
      wait "${pids[0]}" || failed=1
      pids=("${pids[@]:1}")
    fi
    if [ "$object" = "$kernels/kernel_source.o" ]; then
      c++ "${CXXFLAGS[@]}" "$@" -c "$source" -o "$object.tmp" && mv "$object.tmp" "$object" &
    else
      c++ "${CXXFLAGS[@]}" -c "$source" -o "$object.tmp" && mv "$object.tmp" "$object" &
    fi
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
  done
  return "$failed"
}
# Links $1 (a libcuda.so.1) with the version script $2 and the kernels' object in $3.
link_driver() {
  local objects=() source name
  for source in tests/emulated/*.cpp; do
    name="${source##*/}"
    [ "$source" = tests/emulated/kernel_source.cpp ] || objects+=("$OBJ/${name%.cpp}.o")
  done
  c++ -shared -pthread -Wl,-soname,libcuda.so.1 -Wl,--no-undefined -Wl,--version-script="$2" \
    "${objects[@]}" "$3/kernel_source.o" -o "$1.tmp"
  mv "$1.tmp" "$1"
  ln -sf libcuda.so.1 "$(dirname "$1")/libcuda.so"
}
if stale "$DRIVER" || [ -n "$(find "$OBJ" -name '*.o' -newer "$DRIVER")" ]; then
  echo "emulated-gpu: building $DRIVER" >&2
fi
compile_driver "$OBJ"
if stale "$DRIVER" || [ -n "$(find "$OBJ" -name '*.o' -newer "$DRIVER")" ]; then
  link_driver "$DRIVER" tests/emulated/exports.map "$OBJ"
fi
NCCL_SOURCES=(tests/emulated/nccl/* include/nccl.h)
if stale "$BUILD/libnccl.so.2" || [ -n "$(find "${NCCL_SOURCES[@]}" -newer "$BUILD/libnccl.so.2")" ]; then
  echo "emulated-gpu: building $BUILD/libnccl.so.2 (the loopback NCCL)" >&2
  c++ -std=c++17 -O2 -g -fPIC -shared -pthread -Wall -Wextra -Werror -Wno-unused-parameter \
    -I "$NV/cuda_runtime/include" -I include -Wl,-soname,libnccl.so.2 -Wl,--no-undefined \
    -Wl,--version-script=tests/emulated/nccl/exports.map tests/emulated/nccl/loopback.cpp \
    -o "$BUILD/libnccl.so.2.tmp" -L "$BUILD" -lcuda -lrt
  mv "$BUILD/libnccl.so.2.tmp" "$BUILD/libnccl.so.2"
fi
if stale "$BUILD/selftest" || [ tests/emulated/selftest.c -nt "$BUILD/selftest" ] ||
  [ tests/emulated/set_branch.ptx -nt "$BUILD/selftest" ]; then
  cc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -I "$NV/cuda_runtime/include" \
    tests/emulated/selftest.c -o "$BUILD/selftest" -L "$BUILD" -lcuda
fi

# A variant of the driver in directory $1, linked with the version script $2; with further
# compiler flags, its kernels compiled with them (else the driver's own).
build_variant() {
  local dir="$1" map="$2" kernels="$OBJ"
  shift 2
  if [ "$#" -gt 0 ]; then
    kernels="$dir"
    compile_driver "$dir" "$@"
  fi
  if stale "$dir/libcuda.so.1" || [ "$kernels/kernel_source.o" -nt "$dir/libcuda.so.1" ]; then
    link_driver "$dir/libcuda.so.1" "$map" "$kernels"
  fi
}

# A driver whose kernels carry a planted bug: for the tests that the strict machine reports
# it. Prints its directory.
if [ "${1:-}" = "--build-mutant" ]; then
  [ "$#" -eq 2 ] && [[ $2 =~ ^[A-Z0-9_]+$ ]] || { echo "usage: $0 --build-mutant NAME" >&2; exit 2; }
  grep -q "STRAGGLAR_MUTANT_$2\b" cuda/* || { echo "emulated-gpu: no mutant $2 in cuda/" >&2; exit 2; }
  dir="$BUILD/mutant-$2"
  mkdir -p "$dir"
  build_variant "$dir" tests/emulated/exports.map "-DSTRAGGLAR_MUTANT_$2"
  echo "$dir"
  exit 0
fi

# build_without DIR cuNAME...: a driver in DIR lacking the exports named (cudarc panics when it
# looks a missing name up). Prints DIR.
build_without() {
  local dir=$1 name
  shift
  mkdir -p "$dir"
  printf '{\n  global: cu*;\n  local: %s*;\n};\n' "$(printf '%s; ' "$@")" > "$dir/exports.map.new"
  cmp -s "$dir/exports.map.new" "$dir/exports.map" || mv "$dir/exports.map.new" "$dir/exports.map"
  rm -f "$dir/exports.map.new"
  build_variant "$dir" "$dir/exports.map"
  for name in "$@"; do
    if nm -D --defined-only "$dir/libcuda.so.1" | grep -qw "$name"; then
      echo "emulated-gpu: $dir/libcuda.so.1 still exports $name" >&2
      exit 1
    fi
  done
  echo "$dir"
}

# A driver that lacks one export: for tests of what a panic inside the engine does.
if [ "${1:-}" = "--build-without" ]; then
  [ "$#" -eq 2 ] && [[ $2 =~ ^cu[A-Za-z0-9_]+$ ]] || { echo "usage: $0 --build-without cuNAME" >&2; exit 2; }
  build_without "$BUILD/without-$2" "$2"
  exit 0
fi

# A CUDA 12.0 driver (R525): the emulated driver's exports that came later are missing, as
# they are from the real one. Multicast objects came with 12.1, cuGraphAddNode with 12.2, its
# _v2, conditional handles and the _v3/_v2 capture-info and capture-dependency calls with 12.3,
# cuEventElapsedTime_v2 with 12.8.
if [ "${1:-}" = "--build-cuda-12.0" ]; then
  [ "$#" -eq 1 ] || { echo "usage: $0 --build-cuda-12.0" >&2; exit 2; }
  build_without "$BUILD/cuda-12.0" cuMulticastCreate cuMulticastAddDevice cuMulticastBindMem \
    cuMulticastUnbind cuMulticastGetGranularity cuGraphAddNode cuGraphAddNode_v2 \
    cuGraphConditionalHandleCreate cuStreamGetCaptureInfo_v3 \
    cuStreamUpdateCaptureDependencies_v2 cuEventElapsedTime_v2
  exit 0
fi
# The loopback NCCL beside the rank program of the tests, linked against it alone: on a GPU
# machine (gpu-check) both load the real libcuda.so.1, and libstragglar.so comes in by
# LD_PRELOAD, so the library's whole path runs there with ranks as processes of one host.
# Prints its directory.
if [ "${1:-}" = "--build-loopback-ranks" ]; then
  dir="$BUILD/loopback-ranks"
  mkdir -p "$dir"
  cp "$BUILD/libnccl.so.2" "$dir/libnccl.so.2.tmp"
  mv "$dir/libnccl.so.2.tmp" "$dir/libnccl.so.2"
  if [ ! -f "$dir/loopback_ranks" ] || [ tests/c/loopback_ranks.c -nt "$dir/loopback_ranks" ] ||
    [ include/nccl.h -nt "$dir/loopback_ranks" ]; then
    cc -std=c11 -O2 -Wall -Werror -I include -I "$NV/cuda_runtime/include" \
      tests/c/loopback_ranks.c -o "$dir/loopback_ranks.tmp" -L "$dir" -l:libnccl.so.2 \
      -L "$BUILD" -lcuda -pthread -ldl
    mv "$dir/loopback_ranks.tmp" "$dir/loopback_ranks"
  fi
  echo "$dir"
  exit 0
fi
exec 9>&-

if [ "${STRAGGLAR_EMU_NO_NVRTC:-0}" = 1 ]; then
  export LD_LIBRARY_PATH="$BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  export LD_LIBRARY_PATH="$BUILD:$NV/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export STRAGGLAR_CACHE_DIR="${STRAGGLAR_CACHE_DIR:-$BUILD/kernels}"
# One machine per run: processes of this run share its GPUs (time slices, MPS), runs beside it
# do not.
export STRAGGLAR_EMU_MACHINE="${STRAGGLAR_EMU_MACHINE:-$$-$(date +%s%N)}"
if [ "${1:-}" = "--build" ]; then
  echo "$BUILD"
  exit 0
fi
if [ "$#" -eq 0 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
exec "$@"
