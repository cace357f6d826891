#!/usr/bin/env bash
# Allocation-churn benchmark (`make bench`): one program, c_tests/bench/churn.cu,
# run three ways:
#   real   cudaMalloc/cudaFree, natively (also with one small block kept
#          allocated throughout: "real*")
#   shim   the same binary under LD_PRELOAD=libsomashim.so (also with an idle
#          non-blocking stream made at start: "shim+nb")
#   async  hand-written cudaMallocAsync/cudaFreeAsync on one stream, pool
#          release threshold UINT64_MAX, natively
# and one table: per-iteration host time (alloc + 1-block kernel + free, median
# after warm-up) for 256 B .. 1 GiB, the ratios, and the host stall of a small
# alloc/free pair while a ~1 ms kernel runs on a non-blocking stream.
#
#   scripts/bench.sh path/to/libsomashim.so
#
# Needs nvcc and an NVIDIA GPU. GPU_ARCH (default sm_90) and NVCC override the
# compiler settings; the log goes to $OUT/bench.log if OUT is set, else
# build/gpu/bench.log. Takes one to two minutes.
set -uo pipefail
# A relative shim path is taken from the caller's directory.
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
SHIM_ARG=${1:-}
NVCC=${NVCC:-nvcc}
ARCH=${GPU_ARCH:-sm_90}
BUILD=build/gpu
T=${BENCH_TIMEOUT:-300}

# shellcheck source=scripts/gpu_common.sh
. scripts/gpu_common.sh
require_gpu bench "$SHIM_ARG"
mkdir -p "$BUILD"
LOG=${OUT:-$BUILD}/bench.log
mkdir -p "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1

cudart_rpath
if ! "$NVCC" -O2 -arch="$ARCH" -cudart shared "${RPATH[@]}" -o "$BUILD/churn" c_tests/bench/churn.cu -lcuda -lpthread \
  >"$BUILD/churn.build.log" 2>&1; then
  echo "bench: building c_tests/bench/churn.cu failed:"
  cat "$BUILD/churn.build.log"
  exit 1
fi

echo "somashim churn benchmark, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "GPU: $(nvidia-smi -L | head -n 1); driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
echo "shim: $SHIM"
# SOMA_* settings in the environment reach the shim run (and are printed here).
env | grep '^SOMA_' | sed 's/^/setting: /'

# Each part in a process of its own, so that no part's figures include what
# the pool cached for an earlier one. Modes: name, environment, churn argument.
PARTS="size:256 size:1048576 size:16777216 size:268435456 size:1073741824 nlp threads threads-legacy streams stall"
MODES=(
  "real|-|real"
  "reallive|CHURN_LIVE_BLOCK=1|real"
  "shim|LD_PRELOAD=$SHIM|real"
  "shimnb|CHURN_IDLE_STREAM=1 LD_PRELOAD=$SHIM|real"
  "async|-|async"
  "shimsync|SOMA_FREE_SYNC=1 LD_PRELOAD=$SHIM|real"
)
fail=0
for mode in "${MODES[@]}"; do
  IFS='|' read -r name envs arg <<<"$mode"
  [ "$envs" = - ] && envs=
  : >"$BUILD/bench.$name.out"
  : >"$BUILD/bench.$name.err"
  for part in $PARTS; do
    # shellcheck disable=SC2086
    timeout "$T" env $envs "$BUILD/churn" "$arg" "$part" >>"$BUILD/bench.$name.out" 2>>"$BUILD/bench.$name.err" || {
      echo "bench: $name $part failed (exit $?)" >>"$BUILD/bench.$name.err"
      fail=1
    }
  done
done
if [ "$fail" != 0 ]; then
  echo "bench: a run failed:"
  for mode in "${MODES[@]}"; do
    name=${mode%%|*}
    echo "--- $name:"
    cat "$BUILD/bench.$name.out" "$BUILD/bench.$name.err"
  done
  exit 1
fi

echo
awk '
  function human(b) {
    if (b >= 1073741824) return sprintf("%d GiB", b / 1073741824)
    if (b >= 1048576) return sprintf("%d MiB", b / 1048576)
    if (b >= 1024) return sprintf("%d KiB", b / 1024)
    return sprintf("%d B", b)
  }
  function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.2fx", a / b) : "-" }
  function ru(mode, k, in_use) { return (in_use > 0 && used[mode, k] != "") ? sprintf("%.2f", used[mode, k] / in_use) : "-" }
  function row(name, k, in_use) {
    r = us[1, k]; rl = us[2, k]; m = us[3, k]; mn = us[4, k]; a = us[5, k]; y = us[6, k]
    printf "%-12s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9s %9s %9s %6s %6s %6s\n", name, r, rl, m, mn, a, y, \
      ratio(r, m), ratio(m, a), ratio(mn, a), ru(3, k, in_use), ru(4, k, in_use), ru(5, k, in_use)
  }
  # 1 real, 2 real with a live block, 3 shim, 4 shim with an idle non-blocking stream, 5 async, 6 shim with SOMA_FREE_SYNC=1
  FNR == 1 { mode++ }
  $1 == "size"     { if (mode == 1) order[++n] = $2; us[mode, $2] = $4; used[mode, $2] = ($8 > $9 ? $8 : $9) }
  $1 == "scenario" { if (mode == 1) sorder[++ns] = $2; us[mode, $2] = $4; used[mode, $2] = $10; inuse[$2] = $8 }
  END {
    printf "%-12s %8s %8s %8s %8s %8s %8s %9s %9s %9s %6s %6s %6s\n", "scenario", "real", "real*", "shim", "shim+nb", \
      "async", "sync", "real/shim", "shim/asy", "+nb/asy", "r/u", "+nb", "async"
    for (i = 1; i <= n; i++) { k = order[i]; row(human(k), k, (k < 1048576 ? 1048576 : k) / 1048576) }
    for (i = 1; i <= ns; i++) { k = sorder[i]; row(k, k, inuse[k] < 1 ? 1 : inuse[k]) }
    printf "\n"
    printf "Figures in us: host time of one alloc+free (sizes: with a 1-block kernel between them), median after\n"
    printf "  warm-up. real: the program natively; real*: natively with one 4 KiB block kept allocated (the real\n"
    printf "  allocator then keeps its chunk for small sizes); shim: under LD_PRELOAD (only blocking streams in the\n"
    printf "  size loops and nlp: the shim orders frees on the legacy stream); shim+nb: the same with an idle\n"
    printf "  non-blocking stream made at start (the shim joins it at every free); async: rewritten with\n"
    printf "  cudaMallocAsync/cudaFreeAsync on one stream (threshold max); sync: the shim with SOMA_FREE_SYNC=1.\n"
    printf "nlp: 8 live blocks of 4 KiB..128 MiB, the oldest freed each time; threads4: 4 host threads churning\n"
    printf "  1 MiB blocks, each on its own non-blocking stream; threads4-legacy: the same on the legacy stream;\n"
    printf "  streams4x4G: four 4 GiB blocks live, one per\n"
    printf "  non-blocking stream (time of a whole round); stall: a 256 B pair while a ~1 ms kernel runs on a\n"
    printf "  non-blocking stream.\n"
    printf "r/u: peak device memory used beyond the start of the run (cudaMemGetInfo, a proxy for the pool'\''s\n"
    printf "  reserved memory, incl. its 2 MiB-granular chunks) over the peak the program held, counted as at\n"
    printf "  least 1 MiB; for shim, shim+nb and async (the device'\''s default pool).\n"
  }' "$BUILD/bench.real.out" "$BUILD/bench.reallive.out" "$BUILD/bench.shim.out" "$BUILD/bench.shimnb.out" \
  "$BUILD/bench.async.out" "$BUILD/bench.shimsync.out"

# The same figures as CSV (size_bytes,mode,us_per_pair), and the plot of them.
CSV=${OUT:-$BUILD}/bench.csv
{
  echo "size_bytes,mode,us_per_pair"
  for m in real shim shimnb async; do
    awk -v m="$m" '$1 == "size" {print $2 "," m "," $4}' "$BUILD/bench.$m.out"
  done
} >"$CSV"
if python3 scripts/plot_bench.py "$CSV" "${OUT:-$BUILD}/bench.png" >/dev/null 2>&1; then
  echo "csv: $CSV; plot: ${OUT:-$BUILD}/bench.png"
else
  echo "csv: $CSV (no plot: scripts/plot_bench.py needs matplotlib)"
fi
