#!/usr/bin/env bash
# The README's main command (`make demo`): build a small legacy CUDA program
# (plain cudaMalloc / kernel / cudaFree in a loop), run it natively and under
# LD_PRELOAD=libsomashim.so, print both times and the speed-up.
#
#   scripts/demo.sh path/to/libsomashim.so [iterations at 1 MiB, default 20000]
#
# Needs nvcc and an NVIDIA GPU; without them it says so in one line and exits 1.
# GPU_ARCH (default sm_90) and NVCC override the compiler settings; the log
# goes to $OUT/demo.log if OUT is set, else build/gpu/demo.log.
set -uo pipefail
# A relative shim path is taken from the caller's directory.
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
SHIM_ARG=${1:-}
ITERS=${2:-20000}
NVCC=${NVCC:-nvcc}
ARCH=${GPU_ARCH:-sm_90}
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

echo "somashim demo: a legacy CUDA program doing cudaMalloc -> small kernel -> cudaFree in a loop"
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
