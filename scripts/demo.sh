#!/usr/bin/env bash
# The README's main command (`make demo`): a small legacy CUDA program (plain
# cudaMalloc / work / cudaFree in a loop), run natively and under
# LD_PRELOAD=libsomashim.so, wherever it is typed. Its first line says which
# of the two it ran:
# - with nvcc and an NVIDIA GPU: c_tests/demo/legacy_loop.cu on the GPU; both
#   times and the speed-up, and the checksums (which must agree);
# - without them: c_tests/demo/legacy_loop_fake.c, built with gcc against the
#   CUDA test double (c_tests/fake) and the headers of `make headers` (run if
#   they are missing); how many blocks the pool served, the SOMA_STATS table,
#   and the SOMA_TRACE timeline, drawn by scripts/plot_trace.py where
#   matplotlib can be imported.
#
#   scripts/demo.sh path/to/libsomashim.so [iterations at 1 MiB, default 20000 on a GPU, 2000 on the double]
#
# GPU_ARCH (default sm_90), NVCC and CC override the compiler settings; the
# log goes to $OUT/demo.log if OUT is set, else build/gpu/demo.log (GPU) or
# build/demo/demo.log (test double).
set -uo pipefail
# A relative shim path is taken from the caller's directory.
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
SHIM_ARG=${1:-}
NVCC=${NVCC:-nvcc}
ARCH=${GPU_ARCH:-sm_90}

# The demo on the CUDA test double, for a machine without a GPU ($1: why).
demo_on_test_double() {
  local why=$1 b=build/demo
  local iters=${ITERS:-2000}
  if [ -z "$SHIM_ARG" ] || [ ! -f "$SHIM_ARG" ]; then
    echo "demo: shim library '$SHIM_ARG' not found (build it, or pass SHIM=path/to/libsomashim.so)"
    exit 1
  fi
  SHIM=$(readlink -f "$SHIM_ARG")
  ROOT=$(pwd -P)
  INC=$ROOT/build/cuda/nvidia/cu13/include
  CC=${CC:-gcc}
  if [ ! -f "$INC/cuda_runtime_api.h" ]; then
    make --no-print-directory headers || {
      echo "demo: no GPU here ($why), so the demo runs on the CUDA test double, which needs the CUDA 13.0 headers: see make headers above"
      exit 1
    }
  fi
  mkdir -p "$b/fake"
  local log=${OUT:-$b}/demo.log
  mkdir -p "$(dirname "$log")"
  exec > >(tee "$log") 2>&1
  # shellcheck source=scripts/fake_cuda.sh
  . scripts/fake_cuda.sh
  if ! { build_fake_cuda "$b/fake" && "$CC" "${FAKE_CFLAGS[@]}" -o "$b/legacy_loop_fake" \
    c_tests/demo/legacy_loop_fake.c -L"$b/fake" -lcudart -lcuda -ldl -lpthread; } >"$b/build.log" 2>&1; then
    echo "demo: building the test double and c_tests/demo/legacy_loop_fake.c failed:"
    cat "$b/build.log"
    exit 1
  fi

  echo "somashim demo, run on the CUDA TEST DOUBLE (c_tests/fake), not a GPU: $why"
  echo "A legacy program doing cudaMalloc -> work on the default stream -> cudaFree in a loop, natively and"
  echo "under LD_PRELOAD=libsomashim.so (on the double, times say nothing about a GPU: make demo on one for them)."
  echo
  LD_LIBRARY_PATH=$b/fake "$b/legacy_loop_fake" "$iters" >"$b/native.out" 2>"$b/native.err"
  local nrc=$?
  rm -f "$b/trace.csv"
  LD_LIBRARY_PATH=$b/fake LD_PRELOAD=$SHIM SOMA_STATS=1 SOMA_TRACE=$b/trace.csv "$b/legacy_loop_fake" "$iters" \
    >"$b/shim.out" 2>"$b/shim.err"
  local src=$?
  if [ "$nrc" != 0 ] || [ "$src" != 0 ]; then
    echo "demo: a run failed (native exit $nrc, with the shim exit $src)"
    cat "$b/native.out" "$b/native.err" "$b/shim.out" "$b/shim.err"
    exit 1
  fi
  echo "blocks served from a memory pool: natively $(sed -n 's/^pool_backed_allocations //p' "$b/native.out")," \
    "under the shim $(sed -n 's/^pool_backed_allocations //p' "$b/shim.out") (the 256 MiB ones are large blocks, of the real allocator, which the shim caches: SOMA_STATS below)"
  echo
  echo "SOMA_STATS=1 (the shim's table at exit):"
  cat "$b/shim.err"
  echo
  echo "SOMA_TRACE=$b/trace.csv: $(($(wc -l <"$b/trace.csv") - 1)) pool events"
  if python3 -c 'import matplotlib' 2>/dev/null; then
    python3 scripts/plot_trace.py "$b/trace.csv" "$b/trace.png" --title "somashim demo on the CUDA test double" &&
      echo "drawn: $b/trace.png"
  else
    echo "not drawn: matplotlib cannot be imported (with it: python3 scripts/plot_trace.py $b/trace.csv $b/trace.png)"
  fi
  # Every allocation the shim's: from its pool, or (256 MiB) its cache of large blocks.
  grep -q '^pool_backed_allocations [1-9]' "$b/shim.out" &&
    sed -n '/^passed through to the real allocator/{n;p;}' "$b/shim.err" | grep -q '^  nothing$' || {
    echo "demo: the shim did not serve every allocation (is it preloaded?)"
    exit 1
  }
}

if ! command -v "$NVCC" >/dev/null 2>&1; then
  ITERS=${2:-} demo_on_test_double "nvcc not found"
  exit
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  ITERS=${2:-} demo_on_test_double "nvidia-smi failed (no GPU or no driver)"
  exit
fi
ITERS=${2:-20000}
BUILD=build/gpu

# shellcheck source=scripts/gpu_common.sh
. scripts/gpu_common.sh
require_gpu demo "$SHIM_ARG"
mkdir -p "$BUILD"
LOG=${OUT:-$BUILD}/demo.log
mkdir -p "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1

cudart_rpath
if ! "$NVCC" -O2 -arch="$ARCH" -cudart shared "${RPATH[@]}" -o "$BUILD/legacy_loop" c_tests/demo/legacy_loop.cu \
  -lcuda -lpthread >"$BUILD/legacy_loop.build.log" 2>&1; then
  echo "demo: building c_tests/demo/legacy_loop.cu failed:"
  cat "$BUILD/legacy_loop.build.log"
  exit 1
fi

echo "somashim demo, run on the GPU: a legacy CUDA program doing cudaMalloc -> small kernel -> cudaFree in a loop"
echo "GPU: $(nvidia-smi -L | head -n 1)"
echo
"$BUILD/legacy_loop" "$ITERS" >"$BUILD/demo.native.out" 2>"$BUILD/demo.native.err"
nrc=$?
LD_PRELOAD="$SHIM" "$BUILD/legacy_loop" "$ITERS" >"$BUILD/demo.shim.out" 2>"$BUILD/demo.shim.err"
src=$?
if [ "$nrc" != 0 ] || [ "$src" != 0 ]; then
  echo "demo: a run failed (native exit $nrc, with the shim exit $src)"
  for w in native shim; do
    echo "--- $w:"
    cat "$BUILD/demo.$w.out" "$BUILD/demo.$w.err"
  done
  exit 1
fi

# phase lines: "phase NAME UNIT iterations N time_ms X us_per_iteration Y"
printf '%-10s %10s %16s %16s %9s\n' "size" "iterations" "native us/iter" "shim us/iter" "speed-up"
paste <(grep '^phase' "$BUILD/demo.native.out") <(grep '^phase' "$BUILD/demo.shim.out") |
  awk '{ printf "%-10s %10s %16.2f %16.2f %8.1fx\n", $2" "$3, $5, $9, $18, ($18 > 0 ? $9/$18 : 0) }'
nt=$(sed -n 's/^total_ms //p' "$BUILD/demo.native.out")
st=$(sed -n 's/^total_ms //p' "$BUILD/demo.shim.out")
echo
printf 'total: native %.1f ms, with libsomashim.so %.1f ms: %sx faster\n' "$nt" "$st" \
  "$(awk -v a="$nt" -v b="$st" 'BEGIN{ if (b > 0) printf "%.1f", a/b; else print "?" }')"
nc=$(sed -n 's/^checksum //p' "$BUILD/demo.native.out")
sc=$(sed -n 's/^checksum //p' "$BUILD/demo.shim.out")
echo "results: checksum native $nc, shim $sc: $([ "$nc" = "$sc" ] && echo same || echo DIFFERENT)"
echo "allocations served from a pool under the shim: $(sed -n 's/^pool_backed_allocations //p' "$BUILD/demo.shim.out")"
if [ -s "$BUILD/demo.shim.err" ]; then
  echo "shim run stderr:"
  cat "$BUILD/demo.shim.err"
fi
[ "$nc" = "$sc" ] || exit 1
grep -q '^pool_backed_allocations [1-9]' "$BUILD/demo.shim.out" || {
  echo "demo: the shim did not serve any allocation (is it preloaded?)"
  exit 1
}
