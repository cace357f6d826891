#!/usr/bin/env bash
# Allocation-churn benchmark (`make bench`): one program, c_tests/bench/churn.cu,
# run three ways (and three variants):
#   real   cudaMalloc/cudaFree, natively (also with one small block kept
#          allocated throughout: "real*")
#   shim   the same binary under LD_PRELOAD=libsomashim.so (also with an idle
#          non-blocking stream made at start: "shim+nb"; with
#          SOMA_FREE_SYNC=1: "sync"; and, for the 1 MiB pair and the threads
#          rows, with SOMA_BY_LIBRARY=0: "nolib")
#   async  hand-written cudaMallocAsync/cudaFreeAsync, pool release threshold
#          UINT64_MAX, natively
# and two tables (scripts/bench_table.awk):
#  1. the allocation call: per-iteration host time (alloc + 1-block kernel +
#     free, median after warm-up) for 256 B .. 1 GiB, varying sizes (nlp),
#     4 threads, 4 x 4 GiB on 4 streams, the host stall of a small pair
#     while a ~1 ms kernel runs on a non-blocking stream, and a pitched
#     allocation (cudaMallocPitch, 1000 x 1000 bytes); the ratios, r/u;
#  2. issue 12: the 1 MiB pair on the legacy stream with 0, 1, 8, 64, 256 idle
#     non-blocking streams alive, and 1, 4, 8, 16 host threads (each on its
#     own non-blocking stream, or all on the legacy stream); real, shim and
#     async; the ratios shim/real, shim/async, shim(N streams)/shim(0);
# and 3. what counting by library costs: shim / nolib, each repetition's pair
# of runs compared; then the verdict on the targets (ok/MISS; a miss does not fail
# the benchmark: speed targets live here, never in timed tests); then pinned
# host memory (scripts/bench_pinned.sh), CUDA IPC (scripts/bench_ipc.sh), two processes
# sharing the GPU (scripts/bench_neighbours.sh) and the memory a program holds
# (scripts/bench_held.sh).
#
# Every scenario runs BENCH_REPS times (default 3), each time in a fresh
# process; the repetitions go round the whole list, so that a noisy spell of
# a shared machine is spread over all scenarios. The tables give the median
# of the repetitions' medians and their spread (min-max).
#
#   scripts/bench.sh path/to/libsomashim.so
#
# Knobs (environment):
#   BENCH_ONLY      extended regex; a part runs if it matches the whole name of
#                   its group (sizes, nlp, threads, streams, 4x4G, stall) or of
#                   the part itself (size:1048576, threads:8,
#                   threads-legacy:16, idle-nb:256, streams4x4G, ...), and
#                   the benchmarks run after them (pinned, ipc, neighbours, held),
#                   e.g. BENCH_ONLY='streams|threads'
#   BENCH_MODES     extended regex on the whole mode name (real reallive shim
#                   shimnb async shimsync shimnolib); default all
#   BENCH_REPS      repetitions of every scenario (default 3)
#   BENCH_BUDGET_S  no run starts after this many seconds (default 330); the
#                   tables then give what ran and name the rows that have
#                   fewer repetitions
#   BENCH_TIMEOUT   limit of each run, seconds (default 300)
#   GPU_ARCH (default sm_90), NVCC: the compiler settings
# SOMA_* settings in the environment reach every run (and are printed).
#
# Output under $OUT if set, else build/gpu: bench.log (everything printed),
# bench.csv (the tables: one row per scenario), bench-reps.csv (every
# repetition), bench.png (the sizes, scripts/plot_bench.py; needs matplotlib).
# Needs nvcc and an NVIDIA GPU. Takes about 3 to 4 minutes on an H100 or H200
# with the defaults (279 processes; most of the time is their start).
set -uo pipefail
# A relative shim path is taken from the caller's directory.
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
SHIM_ARG=${1:-}
NVCC=${NVCC:-nvcc}
ARCH=${GPU_ARCH:-sm_90}
BUILD=build/gpu
T=${BENCH_TIMEOUT:-300}
REPS=${BENCH_REPS:-3}
ONLY=${BENCH_ONLY:-}
MODES_ONLY=${BENCH_MODES:-}
BUDGET=${BENCH_BUDGET_S:-330}
case $REPS in '' | *[!0-9]* | 0)
  echo "bench: BENCH_REPS must be a positive integer, not '$REPS'"
  exit 2
  ;;
esac
case $BUDGET in '' | *[!0-9]*)
  echo "bench: BENCH_BUDGET_S must be a whole number of seconds, not '$BUDGET'"
  exit 2
  ;;
esac

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
echo "shim: $SHIM (sha256 $(sha256sum "$SHIM" | cut -c1-16))"
if REV=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- src c_tests/bench scripts 2>/dev/null || REV="$REV + uncommitted changes"
  echo "source: $REV"
fi
echo "repetitions: $REPS of every scenario, each a fresh process; budget ${BUDGET} s${ONLY:+; BENCH_ONLY=$ONLY}${MODES_ONLY:+; BENCH_MODES=$MODES_ONLY}"
env | grep '^SOMA_' | sed 's/^/setting: /'

# Each run in a process of its own, so that no figure includes what the pool
# cached for an earlier one. Modes: name|environment|churn argument.
MODES=(
  "real|-|real"
  "reallive|CHURN_LIVE_BLOCK=1|real"
  "shim|LD_PRELOAD=$SHIM|real"
  "shimnb|CHURN_IDLE_STREAM=1 LD_PRELOAD=$SHIM|real"
  "async|-|async"
  "shimsync|SOMA_FREE_SYNC=1 LD_PRELOAD=$SHIM|real"
  "shimnolib|SOMA_BY_LIBRARY=0 LD_PRELOAD=$SHIM|real"
)
# Parts: group|name|churn part|modes ("all": the six above; "rsa": real, shim
# and async, the three of issue 12's table). threads:4 and threads-legacy:4
# are in both tables.
PARTS=(
  "sizes|size:256|size:256|all"
  "sizes|size:1048576|size:1048576|all"
  "sizes|size:16777216|size:16777216|all"
  "sizes|size:268435456|size:268435456|all"
  "sizes|size:1073741824|size:1073741824|all"
  "nlp|nlp|nlp|all"
  "threads|threads:4|threads:4|all"
  "threads|threads-legacy:4|threads-legacy:4|all"
  "4x4G|streams4x4G|streams|all"
  "stall|stall|stall|all"
  "pitch|pitch2d|pitch|all"
  "gpu|gpu-chain|gpu-chain|all"
  "launch|launch-legacy|launch-legacy|rsa"
  "launch|launch-nb|launch-nb|rsa"
  "streams|idle-nb:0|idle-nb:0|rsa"
  "streams|idle-nb:1|idle-nb:1|rsa"
  "streams|idle-nb:8|idle-nb:8|rsa"
  "streams|idle-nb:64|idle-nb:64|rsa"
  "streams|idle-nb:256|idle-nb:256|rsa"
  "threads|threads:1|threads:1|rsa"
  "threads|threads:8|threads:8|rsa"
  "threads|threads:16|threads:16|rsa"
  "threads|threads-legacy:1|threads-legacy:1|rsa"
  "threads|threads-legacy:8|threads-legacy:8|rsa"
  "threads|threads-legacy:16|threads-legacy:16|rsa"
)
part_wanted() { [ -z "$ONLY" ] || [[ $1 =~ ^($ONLY)$ ]] || [[ $2 =~ ^($ONLY)$ ]]; }
# shimnolib (the shim not counting by library) only where its cost is judged:
# the 1 MiB pair and the threads rows.
mode_wanted() { # mode name, the part's mode set, the part's name
  if [ "$1" = shimnolib ]; then
    [[ $3 =~ ^(size:1048576|threads(-legacy)?:[0-9]+)$ ]] || return 1
  else
    [ "$2" = all ] || [[ $1 =~ ^(real|shim|async)$ ]] || return 1
  fi
  [ -z "$MODES_ONLY" ] || [[ $1 =~ ^($MODES_ONLY)$ ]]
}
RUNS=0
for p in "${PARTS[@]}"; do
  IFS='|' read -r group pname _ set <<<"$p"
  part_wanted "$group" "$pname" || continue
  for mode in "${MODES[@]}"; do mode_wanted "${mode%%|*}" "$set" "$pname" && RUNS=$((RUNS + 1)); done
done
if [ "$RUNS" = 0 ]; then
  echo "bench: nothing selected (BENCH_ONLY='$ONLY', BENCH_MODES='$MODES_ONLY')"
  exit 2
fi
echo "runs: $RUNS per repetition, $((RUNS * REPS)) in all"

RAW=$BUILD/bench.raw
: >"$RAW"
# stderr of every run, by mode; that of the failed runs also in bench.failed
for mode in "${MODES[@]}"; do : >"$BUILD/bench.${mode%%|*}.err"; done
: >"$BUILD/bench.failed"
FAILED=()
SKIPPED=0
START=$SECONDS
for rep in $(seq 1 "$REPS"); do
  rstart=$SECONDS
  for p in "${PARTS[@]}"; do
    IFS='|' read -r group pname arg set <<<"$p"
    part_wanted "$group" "$pname" || continue
    for mode in "${MODES[@]}"; do
      IFS='|' read -r name envs prog <<<"$mode"
      mode_wanted "$name" "$set" "$pname" || continue
      if [ $((SECONDS - START)) -ge "$BUDGET" ]; then
        SKIPPED=$((SKIPPED + 1))
        continue
      fi
      [ "$envs" = - ] && envs=
      # shellcheck disable=SC2086 # envs: words on purpose
      timeout "$T" env $envs "$BUILD/churn" "$prog" "$arg" >"$BUILD/bench.run.out" 2>"$BUILD/bench.run.err"
      rc=$?
      {
        echo "== repetition $rep, $arg (exit status $rc)"
        cat "$BUILD/bench.run.err"
      } >>"$BUILD/bench.$name.err"
      if [ "$rc" != 0 ]; then
        FAILED+=("$name $arg (repetition $rep, exit status $rc)")
        {
          echo "--- $name $arg, repetition $rep, exit status $rc; stderr (last 20 lines):"
          tail -n 20 "$BUILD/bench.run.err"
        } >>"$BUILD/bench.failed"
        continue
      fi
      grep -E '^(size|scenario) ' "$BUILD/bench.run.out" | sed "s/^/$name $rep /" >>"$RAW"
    done
  done
  echo "repetition $rep of $REPS: $((SECONDS - rstart)) s"
done
[ "$SKIPPED" != 0 ] && echo "budget of $BUDGET s reached: $SKIPPED run(s) not started (BENCH_BUDGET_S)"
echo "runs took $((SECONDS - START)) s"

echo
CSV=${OUT:-$BUILD}/bench.csv
RAWCSV=${OUT:-$BUILD}/bench-reps.csv
awk -v reps="$REPS" -v csv="$CSV" -v rawcsv="$RAWCSV" -f scripts/bench_table.awk "$RAW"
cat <<'NOTES'

Figures in us: host time of one alloc+free (sizes, nlp, idle-nb, threads: with a 1-block kernel
  between them), the median of a process's iterations after warm-up. Every scenario ran in
  BENCH_REPS fresh processes: the tables give the median of those medians, the spread table and
  [min-max] their range, n the repetitions.
Modes: real: the program natively; real*: natively with one 4 KiB block kept allocated (the real
  allocator then keeps its chunk for small sizes); shim: under LD_PRELOAD (only blocking streams in
  the size loops and nlp: the shim orders frees on the legacy stream); shim+nb: the same with an
  idle non-blocking stream made at start (the shim joins it at every free); async: rewritten with
  cudaMallocAsync/cudaFreeAsync (release threshold max) on one non-blocking stream (sizes, nlp,
  stall), on the legacy stream (idle-nb, threadsN-legacy) or on each thread's own stream
  (threadsN); sync: the shim with SOMA_FREE_SYNC=1; nolib: the shim with SOMA_BY_LIBRARY=0.
nlp: 8 live blocks of 4 KiB..128 MiB, the oldest freed each time; threadsN: N host threads each
  churning 1 MiB blocks on its own non-blocking stream, 1000 iterations each; threadsN-legacy: the
  same on the legacy stream; for both, the median over all threads' iterations of one iteration's
  host time, as the thread that made it timed it (not wall time / iterations); idle-nbN: the
  1 MiB pair on the legacy stream, median of 2000, while N idle non-blocking streams are alive
  (made at start, in every mode); streams4x4G: four 4 GiB blocks live, one per non-blocking stream
  (time of a whole round); stall: a 256 B pair while a ~1 ms kernel runs on a non-blocking stream;
  pitch2d: cudaMallocPitch of 1000 rows of 1000 bytes (async: cudaMallocAsync of pitch x rows);
  gpu-chain: GPU time, not host time: 1000 kernels of ~10 us on the legacy stream with a 1 MiB
  pair around each, the host far ahead (as in a training step), us of GPU time per kernel;
  gpu-chain-kernels: the same kernels with no allocator call (the floor).
launch-legacy, launch-nb: no allocation at all: 40,000 empty-kernel launches on the legacy (a
  non-blocking) stream and a synchronization, wall time per launch (the hooks' cost to a program
  that gains nothing from the shim; async runs the same program as real).
r/u: peak device memory used beyond the start of the run (cudaMemGetInfo, a proxy for the pool's
  reserved memory, incl. its 2 MiB-granular chunks) over the peak the program held, counted as at
  least 1 MiB; for shim, shim+nb and async (the device's default pool).
Verdicts, on the medians: shim<=real (T3): shim not slower than real; nb<=1.25x (T1): shim
  idle-nb256 <= 1.25 x shim idle-nb0; <=1.25xasy (T2): shim <= 1.25 x async of the same shape;
  by library (T4): the median over the repetitions of shim / nolib (the two runs of one
  repetition, next to each other in time) <= 1.02 in every row measured.
NOTES

if python3 scripts/plot_bench.py "$CSV" "${OUT:-$BUILD}/bench.png" >/dev/null 2>&1; then
  echo "csv: $CSV, $RAWCSV; plot: ${OUT:-$BUILD}/bench.png"
else
  echo "csv: $CSV, $RAWCSV (no plot: scripts/plot_bench.py needs matplotlib, and the sizes)"
fi

for tail in "pinned|pinned host memory" "ipc|CUDA IPC" "neighbours|neighbours" "held|memory held"; do
  IFS='|' read -r name what <<<"$tail"
  part_wanted "$name" "$name" || continue
  echo
  "scripts/bench_$name.sh" "$SHIM" || FAILED+=("$what (scripts/bench_$name.sh)")
done

if [ "${#FAILED[@]}" != 0 ]; then
  echo
  echo "bench: ${#FAILED[@]} run(s) failed (their rows have fewer repetitions):"
  printf '  %s\n' "${FAILED[@]}"
  head -n 120 "$BUILD/bench.failed"
  exit 1
fi
exit 0
