# shellcheck shell=bash
# Sourced by the GPU scripts (demo.sh, bench.sh, gpu_test.sh); needs NVCC set.
# shellcheck disable=SC2034 # SHIM, NVCC_DIR, RPATH and ONE_GPU are for the sourcing script

# The first device this process may use. The shim pools pinned host memory only
# in a process that sees one device (with several it passes through), so the
# pinned-memory tests and benchmark run with this one visible alone.
ONE_GPU=${CUDA_VISIBLE_DEVICES:-0}
ONE_GPU=${ONE_GPU%%,*}

# require_gpu WHAT SHIM_PATH: one clear line and exit 1 unless nvcc, a GPU and
# the shim library are all here; then SHIM is the library's absolute path.
require_gpu() {
  local what=$1 shim=$2
  if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "$what: needs nvcc and an NVIDIA GPU: nvcc not found, nothing run"
    exit 1
  fi
  if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "$what: needs nvcc and an NVIDIA GPU: nvidia-smi failed (no GPU or no driver), nothing run"
    exit 1
  fi
  if [ -z "$shim" ] || [ ! -f "$shim" ]; then
    echo "$what: shim library '$shim' not found (build it, or pass SHIM=path/to/libsomashim.so)"
    exit 1
  fi
  SHIM=$(readlink -f "$shim")
}

# cudart_rpath: NVCC_DIR, and RPATH = nvcc flags that make programs find the
# libcudart.so next to the compiler, in case the loader does not know it.
cudart_rpath() {
  NVCC_DIR=$(dirname "$(readlink -f "$(command -v "$NVCC")")")
  RPATH=()
  local d
  for d in "$NVCC_DIR/../lib64" "$NVCC_DIR/../lib" "$NVCC_DIR/../targets/x86_64-linux/lib"; do
    if ls "$d"/libcudart.so.* >/dev/null 2>&1; then
      RPATH=(-Xlinker -rpath -Xlinker "$(readlink -f "$d")")
      return
    fi
  done
}

# build_bench NAME WHAT: c_tests/bench/NAME.cu into $BUILD/NAME (shared runtime),
# its messages in $BUILD/NAME.build.log; on failure, says so and exits 1.
build_bench() {
  local name=$1 what=$2
  cudart_rpath
  if ! "$NVCC" -O2 -arch="$ARCH" -cudart shared "${RPATH[@]}" -o "$BUILD/$name" "c_tests/bench/$name.cu" \
    >"$BUILD/$name.build.log" 2>&1; then
    echo "$what: building c_tests/bench/$name.cu failed:"
    cat "$BUILD/$name.build.log"
    exit 1
  fi
}
