# Sourced by scripts/test.sh, scripts/emulated-gpu.sh and scripts/emulated-seeds.sh: the
# Python wheels the tests and the emulated GPU need, installed once into the ignored .venv
# (reused on later runs).
#
#   wheels_cu12   the CUDA 12 wheels (real NCCL, runtime and driver headers, nvcc, NVRTC) into
#                 .venv/cu12; sets NV to their nvidia/ directory
#   wheels_torch  PyTorch (with its own NCCL) into .venv
#   wheels_ours   our own wheel, built from this checkout (`pip install .`), into .venv
#   wheels_test_env  after wheels_cu12: exports what the tests read (STRAGGLAR_TEST_*, NVRTC on
#                 LD_LIBRARY_PATH)
#
# Versions the tests were written against. torch brings its own NCCL (nvidia-nccl-cu13) into
# .venv; the cu12 wheels go to .venv/cu12 so the two libnccl.so.2 files never overwrite each
# other.
TORCH_SPEC="torch==2.15.0"
# What `pip install .` builds our wheel with (pyproject.toml's build requirements).
BUILD_SPECS=("setuptools>=70" "setuptools-rust>=1.9" "wheel")
CU12_SPECS=(
  "nvidia-nccl-cu12==2.32.3"
  "nvidia-cuda-runtime-cu12==12.9.79"
  "nvidia-cuda-nvcc-cu12==12.9.86"
  "nvidia-cuda-cccl-cu12==12.9.27"
  "nvidia-cuda-nvrtc-cu12==12.9.86"
)
VENV=.venv
CU12="$VENV/cu12"

wheels_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
  fi
}

wheels_cu12() {
  wheels_venv
  if [ ! -f "$CU12/.installed" ]; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --target "$CU12" "${CU12_SPECS[@]}"
    touch "$CU12/.installed"
  fi
  NV="$PWD/$CU12/nvidia"
}

wheels_torch() {
  wheels_venv
  if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$TORCH_SPEC"
  fi
}

wheels_ours() {
  wheels_venv
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${BUILD_SPECS[@]}"
  # Built afresh every run (cargo reuses target/release), without an isolated build
  # environment: the build requirements are installed above.
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --force-reinstall .
}

wheels_test_env() {
  export STRAGGLAR_TEST_REAL_NCCL="$NV/nccl/lib/libnccl.so.2"
  export STRAGGLAR_TEST_NVIDIA_INCLUDES="$NV/nccl/include:$NV/cuda_runtime/include:$NV/cuda_nvcc/include:$NV/cuda_cccl/include"
  export STRAGGLAR_TEST_PYTHON="$PWD/$VENV/bin/python"
  # NVRTC for tests/nvrtc.rs (cudarc looks for libnvrtc.so* on the loader's search path); those
  # tests fail rather than skip when it cannot be loaded.
  export LD_LIBRARY_PATH="$NV/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export STRAGGLAR_TEST_REQUIRE_NVRTC=1
}
