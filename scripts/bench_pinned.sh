#!/usr/bin/env bash
# Pinned host memory benchmark (part of `make bench`; alone: scripts/bench_pinned.sh SHIM):
# c_tests/bench/pinned.cu natively with cudaMallocHost/cudaFreeHost (real), the
# same under the shim (shim), and a hand-written host memory pool (pool), side
# by side, with the issue's targets: shim <= 1.3 x pool, real >= 100 x shim at
# 1 MiB, shim's copy bandwidth within 5% of real pinned memory's.
set -uo pipefail
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
NVCC=${NVCC:-nvcc}
ARCH=${GPU_ARCH:-sm_90}
BUILD=build/gpu
# shellcheck source=scripts/gpu_common.sh
. scripts/gpu_common.sh
require_gpu bench_pinned "${1:-}"
cudart_rpath
mkdir -p "$BUILD"
if ! "$NVCC" -O2 -arch="$ARCH" -cudart shared "${RPATH[@]}" -o "$BUILD/pinned" c_tests/bench/pinned.cu -lcuda \
  >"$BUILD/pinned.build.log" 2>&1; then
  echo "bench: building c_tests/bench/pinned.cu failed:"
  cat "$BUILD/pinned.build.log"
  exit 1
fi
export CUDA_VISIBLE_DEVICES=$ONE_GPU # several devices: the shim passes pinned memory through
status=0
for mode in real shim pool; do
  case $mode in
    real) envs=() arg=real ;;
    shim) envs=("LD_PRELOAD=$SHIM" SOMA_HOST_POOL=1) arg=real ;;
    pool) envs=() arg=pool ;;
  esac
  if ! timeout 300 env "${envs[@]}" "$BUILD/pinned" "$arg" >"$BUILD/pinned.$mode.out" 2>"$BUILD/pinned.$mode.err"; then
    echo "bench: pinned $mode failed:"
    tail -n 20 "$BUILD/pinned.$mode.err"
    status=1
  fi
done
echo
echo "pinned host memory: allocate + 4 KiB async copy + free, median us (bandwidth: 64 MiB H2D, GB/s)"
awk '
  FNR == 1 { mode = FILENAME; sub(/.*pinned\./, "", mode); sub(/\.out$/, "", mode) }
  $1 == "pinned" { us[mode, $2] = $4; sizes[$2] = 1 }
  $1 == "bandwidth_h2d_64mib_gbps" { bw[mode] = $2 }
  END {
    printf "%-10s %12s %12s %12s %10s %10s %s\n", "size", "real", "shim", "pool", "shim/pool", "real/shim", "verdicts"
    n = split("4096 1048576 67108864 268435456", order, " ")
    for (i = 1; i <= n; i++) {
      s = order[i]
      if (!((("shim", s) in us) && (("pool", s) in us) && (("real", s) in us))) continue
      sp = us["shim", s] / us["pool", s]; rs = us["real", s] / us["shim", s]
      v = (sp <= 1.3 ? "shim<=1.3xpool ok" : "shim<=1.3xpool MISSED")
      if (s == 1048576) v = v (rs >= 100 ? ", >=100x real ok" : ", >=100x real MISSED")
      label = s >= 1048576 ? (s / 1048576) " MiB" : (s / 1024) " KiB"
      printf "%-10s %12.2f %12.2f %12.2f %10.2f %10.1f %s\n", label, us["real", s], us["shim", s], us["pool", s], sp, rs, v
    }
    if (("real" in bw) && ("shim" in bw)) {
      d = (bw["shim"] - bw["real"]) / bw["real"] * 100
      printf "%-10s %12.2f %12.2f %12.2f %10s %10s %s\n", "bandwidth", bw["real"], bw["shim"], bw["pool"], "", "", \
        sprintf("shim %+.1f%% of real: %s", d, (d >= -5 && d <= 5) ? "within 5% ok" : "MISSED")
    }
  }' "$BUILD/pinned.real.out" "$BUILD/pinned.shim.out" "$BUILD/pinned.pool.out"
exit $status
