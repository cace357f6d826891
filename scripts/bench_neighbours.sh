#!/usr/bin/env bash
# Two processes on one GPU (`make bench` runs it, from scripts/bench.sh):
# what a program frees reaches its neighbour, natively and under the shim.
#
#   scripts/bench_neighbours.sh path/to/libsomashim.so
#
# c_tests/bench/neighbours.cu, each scenario a fresh pair of processes:
#   second/<first>-<second>  the first process allocates 60% of the device in 64
#       blocks, fills, frees, synchronizes and idles; the second asks for 60% in
#       one block every 5 ms until it gets it: ms from its first request (the
#       first process native or under the shim, the second native or under the shim)
#   burst/<mode>  a fresh process's first 64 allocations of 60% of the device
#       in all (ms), natively or under the shim
#   turns/<mode>  two processes take 20 turns (each allocates 60% in 64 blocks,
#       fills, frees, synchronizes; 200 ms idle between turns): ms of all turns,
#       failed allocations (out of memory)
#   pauses/<mode>  one process alone, 10 rounds of 1 GiB in 4 MiB blocks (fill, free,
#       synchronize) with BENCH_PAUSE_MS between, its GPU idle: the median round's ms
#       (what the idle give-back costs a program that pauses), natively or under the shim
# Environment: BENCH_REPS (3: rounds of every scenario; medians and ranges),
# BENCH_SCENARIOS (extended regex on the whole scenario name, e.g. 'burst/.*'; default all),
# BENCH_TURN_IDLE_MS (200), BENCH_PAUSE_MS (100), SOMA_* (reach the shim runs). Output: the table on
# stdout, and in $OUT/neighbours.log (else build/gpu/neighbours.log).
set -uo pipefail
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
NVCC=${NVCC:-nvcc}
ARCH=${GPU_ARCH:-sm_90}
BUILD=build/gpu
REPS=${BENCH_REPS:-3}
IDLE_MS=${BENCH_TURN_IDLE_MS:-200}
PAUSE_MS=${BENCH_PAUSE_MS:-100}
ONLY=${BENCH_SCENARIOS:-}

# shellcheck source=scripts/gpu_common.sh
. scripts/gpu_common.sh
require_gpu bench_neighbours "${1:-}"
mkdir -p "$BUILD"
LOG=${OUT:-$BUILD}/neighbours.log
mkdir -p "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1

build_bench neighbours bench_neighbours
echo "somashim neighbours benchmark, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "GPU: $(nvidia-smi -L | head -n 1); shim: $SHIM (sha256 $(sha256sum "$SHIM" | cut -c1-16))"
env | grep '^SOMA_' | sed 's/^/setting: /'

declare -A FIG # scenario -> figures, one per round
failed=0
# run SCENARIO FIELD [VAR=VALUE...] -- ARGS: one round, the figure after FIELD.
run() {
  local scenario=$1 field=$2 out
  shift 2
  [ -z "$ONLY" ] || [[ $scenario =~ ^($ONLY)$ ]] || return 0
  local envs=()
  while [ "$1" != -- ]; do
    envs+=("$1")
    shift
  done
  shift
  local rc value
  out=$(timeout 120 env "${envs[@]}" "$BUILD/neighbours" "$@" 2>&1)
  rc=$?
  echo "  $scenario: $out (exit status $rc)"
  value=$(awk -v f="$field" '{for (i = 1; i < NF; i++) if ($i == f) print $(i + 1)}' <<<"$out" | tail -n 1)
  if [ "$rc" != 0 ] || [ -z "$value" ] || [ "$value" = -1.0 ]; then
    failed=1
    value=nan
  fi
  FIG[$scenario]+="$value "
  if [ "$field" = turns_ms ]; then
    FIG[$scenario/oom]+="$(awk '{for (i = 1; i < NF; i++) if ($i == "oom") print $(i + 1)}' <<<"$out" | tail -n 1) "
  fi
}

for round in $(seq 1 "$REPS"); do
  echo "round $round of $REPS"
  run second/native-native second_ms -- second
  run second/shim-native second_ms LD_PRELOAD="$SHIM" -- second
  run second/shim-shim second_ms LD_PRELOAD="$SHIM" SECOND_PRELOAD="$SHIM" -- second
  run burst/native burst_ms -- burst
  run burst/shim burst_ms LD_PRELOAD="$SHIM" -- burst
  run turns/native turns_ms -- turns 20 "$IDLE_MS"
  run turns/shim turns_ms LD_PRELOAD="$SHIM" -- turns 20 "$IDLE_MS"
  run pauses/native pauses_ms -- pauses 10 "$PAUSE_MS"
  run pauses/shim pauses_ms LD_PRELOAD="$SHIM" -- pauses 10 "$PAUSE_MS"
done

# median and range of a list of numbers
stats() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {if (NR == 0) {print "nan nan nan"; exit} m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m, v[1], v[NR]}'; }
echo
printf '%-22s %12s %20s %s\n' scenario "median ms" "range ms" "out of memory (each round)"
for s in second/native-native second/shim-native second/shim-shim burst/native burst/shim turns/native turns/shim \
  pauses/native pauses/shim; do
  [ -n "${FIG[$s]:-}" ] || continue
  read -r med lo hi <<<"$(stats "${FIG[$s]}")"
  printf '%-22s %12s %20s %s\n' "$s" "$med" "$lo-$hi" "${FIG[$s/oom]:-}"
done
for s in burst turns pauses; do
  read -r native _ <<<"$(stats "${FIG[$s/native]:-}")"
  read -r shim _ <<<"$(stats "${FIG[$s/shim]:-}")"
  awk -v s="$shim" -v n="$native" -v name="$s" 'BEGIN {if (n + 0 > 0 && s + 0 > 0) printf "%s: shim / native = %.2fx\n", name, s / n}'
done
exit $failed
