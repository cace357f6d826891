#!/usr/bin/env bash
# Memory a program holds under the shim, against natively (`make bench` runs it
# last, from scripts/bench.sh): peak device memory in use over patterns of
# large blocks, a fresh process's first allocations (how fast memory grows),
# and how soon a second process gets what a first one freed.
#
#   scripts/bench_held.sh path/to/libsomashim.so
#
# c_tests/bench/held.cu, each scenario a fresh process, in modes
#   native   no preload
#   shim     LD_PRELOAD=the shim
#   nolarge  the same with SOMA_LARGE_BLOCKS=0 (every size from the pools)
# Scenarios:
#   held/<pattern>/<mode>  native, shim, nolarge: each block allocated, filled, a
#       word read back and checked, freed; device memory in use (cudaMemGetInfo's
#       total - free) read after every allocation and every free. Figures: the
#       peak in use beyond the start (held MiB), the loop's wall time (ms), and
#       what is still in use SOMA_DECAY_MS + 250 ms after the last free (after MiB).
#       steady    200 blocks of 1 GiB
#       varied16  120 blocks of 16 sizes, 512 to 1472 MiB, shuffled (fixed seed)
#       varied64  2000 blocks of 64 sizes, 512 to 1520 MiB
#       growing   4 passes of a buffer grown like a vector or a KV cache, 128 MiB
#                 to 3 GiB by 64 MiB (allocate the larger, copy, free the old)
#       mixed     60 iterations of one block of 64 MiB to 1 GiB and 64 of 4 KiB
#                 to 2 MiB, all filled, then freed
#   burst/<MiB>/<mode>  native, shim: a fresh process's first allocations of MiB
#       each (64 x 512, 128 x 256, 300 x 256, 1344 x 64; 2 x 4096: small blocks,
#       where the shim must stay faster), each filled, then a synchronization
#       (ms); fewer blocks where they would pass 70% of the device (column blocks)
#   ask/<blocks>/<mode>  native, shim (both processes so): a first process
#       allocates 60% of the device in <blocks> blocks (64, 1024), fills, frees,
#       synchronizes; at once a second, started beforehand, asks for 60% in
#       <blocks> blocks, a failed allocation again every 1 ms: ms from its first
#       request to its last success (5 s at most)
# Every round runs every scenario once, the modes of a scenario next to each
# other, so that a slow spell of the machine falls on all; the table gives
# medians and ranges over the rounds. Then, each as the median [interval] of the
# per-round ratios (scripts/ratios.py):
#   held/<pattern>: shim / native    peak memory in use (also nolarge / native)
#   time/<pattern>: shim / best      loop time against the faster (by median) of
#                                    native and nolarge
#   growth/<MiB>: shim / native      burst time
#   ask/<blocks>: shim - native      the second's wait, the per-round difference in ms
# and three summary lines: "held: shim / native" (the worst pattern), "growth:
# shim / native" (the worst of 64, 128, 300 and 1344 MiB) and "ask: shim - native"
# (the worse block count), each its median.
#
# Environment: BENCH_REPS (5: rounds), BENCH_SCENARIOS (extended regex on the
# whole scenario name, e.g. 'held/.*' or 'burst/.*'; default all), SOMA_* (reach
# the shim runs; SOMA_MEMINFO is set to real there, so that cudaMemGetInfo shows
# what the pools hold; SOMA_DECAY_MS also sets the programs' wait before "after";
# a SOMA_MEMORY_LIMIT makes the figures the limit's). Sized for a device of 96 GiB
# or more (H200); a whole run with BENCH_REPS=3 takes about 2 minutes on one.
# Output: the table on stdout, and in $OUT/held.log (else build/gpu/held.log);
# each round's figures in held.tsv beside it. Exit status 1 if a run failed (an
# allocation, a CUDA call, a word read back, or no figure).
set -uo pipefail
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
NVCC=${NVCC:-nvcc}
ARCH=${GPU_ARCH:-sm_90}
PY=${PYTHON:-python3}
BUILD=build/gpu
REPS=${BENCH_REPS:-5}
ONLY=${BENCH_SCENARIOS:-}
PATTERNS=(steady:200 varied16:120 varied64:2000 growing:4 mixed:60)
BURSTS=(64:512 128:256 300:256 1344:64 2:4096)
ASKS=(64 1024)

# shellcheck source=scripts/gpu_common.sh
. scripts/gpu_common.sh
require_gpu bench_held "${1:-}"
mkdir -p "$BUILD"
LOG=${OUT:-$BUILD}/held.log
mkdir -p "$(dirname "$LOG")"
TSV=$(dirname "$LOG")/held.tsv
: >"$TSV"
exec > >(tee "$LOG") 2>&1

for v in LD_PRELOAD SECOND_PRELOAD; do
  if [ -n "${!v:-}" ]; then
    echo "note: clearing $v=${!v} for the native runs"
    unset "$v"
  fi
done

build_bench held bench_held
echo "somashim held-memory benchmark, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "GPU: $(nvidia-smi -L | head -n 1); shim: $SHIM (sha256 $(sha256sum "$SHIM" | cut -c1-16))"
env | grep '^SOMA_' | sed 's/^/setting: /'

failed=0
# run SCENARIO MODE LIMIT_S ARGS...: one round of SCENARIO/MODE; every "key value"
# of its last figures line goes to the TSV, and "ok 0" if it failed.
run() {
  local scenario=$1/$2 mode=$2 limit=$3 out rc line
  shift 3
  [ -z "$ONLY" ] || [[ $scenario =~ ^($ONLY)$ ]] || return 0
  local envs=()
  case $mode in
    shim) envs=(LD_PRELOAD="$SHIM" SOMA_MEMINFO=real) ;;
    nolarge) envs=(LD_PRELOAD="$SHIM" SOMA_MEMINFO=real SOMA_LARGE_BLOCKS=0) ;;
  esac
  out=$(timeout "$limit" env "${envs[@]}" "$BUILD/held" "$@" 2>&1)
  rc=$?
  echo "  $scenario: $out (exit status $rc)"
  line=$(grep -E '^(held_peak_mib|burst_ms|ask_ms) ' <<<"$out" | tail -n 1)
  if [ "$rc" != 0 ] || [ -z "$line" ]; then
    failed=1
    echo "$scenario $ROUND ok 0" >>"$TSV"
  else
    echo "$scenario $ROUND ok 1" >>"$TSV"
  fi
  awk -v s="$scenario" -v r="$ROUND" '{for (i = 1; i < NF; i += 2) print s, r, $i, $(i + 1)}' <<<"$line" >>"$TSV"
}

for ROUND in $(seq 1 "$REPS"); do
  echo "round $ROUND of $REPS"
  for p in "${PATTERNS[@]}"; do
    for mode in native shim nolarge; do
      run "held/${p%%:*}" "$mode" 180 held "${p%%:*}" "${p##*:}"
    done
  done
  for b in "${BURSTS[@]}"; do
    for mode in native shim; do
      run "burst/${b%%:*}" "$mode" 120 burst "${b%%:*}" "${b##*:}"
    done
  done
  for n in "${ASKS[@]}"; do
    for mode in native shim; do
      run "ask/$n" "$mode" 120 ask "$n"
    done
  done
done

# The table, the ratios and the summary lines, from the TSV.
TABLE=$(cat <<'PYEOF'
import os
import sys

sys.path.insert(0, "scripts")
import ratios

patterns = [p.split(":")[0] for p in os.environ["PATTERN_NAMES"].split()]
sizes = [b.split(":")[0] for b in os.environ["BURST_SIZES"].split()]
asks = os.environ["ASK_BLOCKS"].split()
GROWTH = ["64", "128", "300", "1344"]  # the growth summary's sizes; 2 MiB is the small blocks' check

figs, names = {}, []  # (scenario, key) -> {round: value}; None where the round failed
for line in open(sys.argv[1]):
    scenario, rnd, key, value = line.split()
    if scenario not in names:
        names.append(scenario)
    figs.setdefault((scenario, key), {})[int(rnd)] = float(value)
for (scenario, key), by_round in figs.items():
    ok = figs.get((scenario, "ok"), {})
    for r in by_round:
        if key != "ok" and (not ok.get(r) or (key == "ask_ms" and by_round[r] < 0)):
            by_round[r] = None


def fig(scenario, key):
    return figs.get((scenario, key), {})


def ms_key(scenario):
    return {"held": "ms", "burst": "burst_ms", "ask": "ask_ms"}[scenario.split("/")[0]]


def spread(by_round, spec):
    values = [v for v in by_round.values() if v is not None]
    if not values:
        return "-", "-"
    return format(ratios.median(values), spec), f"{min(values):{spec}}-{max(values):{spec}}"


head = ("scenario", "median ms", "range ms", "held MiB", "range MiB", "after MiB", "blocks", "failed rounds")
print(f"{head[0]:<24} {head[1]:>10} {head[2]:>19} {head[3]:>9} {head[4]:>13} {head[5]:>9} {head[6]:>6}  {head[7]}")
for s in names:
    ms, ms_range = spread(fig(s, ms_key(s)), ".1f")
    held, held_range = spread(fig(s, "held_peak_mib"), ".0f")
    after, _ = spread(fig(s, "after_mib"), ".0f")
    blocks, _ = spread(fig(s, "blocks"), ".0f")
    bad = [str(r) for r, ok in sorted(fig(s, "ok").items()) if not ok]
    print(f"{s:<24} {ms:>10} {ms_range:>19} {held:>9} {held_range:>13} {after:>9} {blocks:>6}  {' '.join(bad) or '-'}")
print()
print("ms: the loop (held), the first allocations and their fill (burst), the second's wait (ask).")
print("held MiB: peak device memory in use beyond the start; after MiB: in use SOMA_DECAY_MS + 250 ms after the last free.")
print(ratios.LEGEND.split("; noise floor")[0] + ".")
print()


def worst(cells):
    """The largest median of (name, per-round values) pairs, and its name."""
    medians = [(ratios.median(values), name) for name, values in cells if ratios.median(values) is not None]
    return max(medians) if medians else (None, None)


held_cells, growth_cells, ask_cells = [], [], []
ran = lambda scenario: scenario in names
for p in patterns:
    native, shim, nolarge = (f"held/{p}/{m}" for m in ("native", "shim", "nolarge"))
    if not ran(shim) or not ran(native):
        continue
    r = ratios.per_round(fig(shim, "held_peak_mib"), fig(native, "held_peak_mib"))
    held_cells.append((p, r))
    print(f"held/{p}: shim / native = {ratios.cell(r)}; SOMA_LARGE_BLOCKS=0 / native = "
          f"{ratios.cell(ratios.per_round(fig(nolarge, 'held_peak_mib'), fig(native, 'held_peak_mib')))}")
for p in patterns:
    if not ran(f"held/{p}/shim"):
        continue
    timed = [(ratios.median(list(fig(f"held/{p}/{m}", "ms").values())), m) for m in ("native", "nolarge")]
    timed = [t for t in timed if t[0] is not None]
    if timed:
        best = min(timed)[1]
        r = ratios.per_round(fig(f"held/{p}/shim", "ms"), fig(f"held/{p}/{best}", "ms"))
        print(f"time/{p}: shim / best = {ratios.cell(r)} ({'SOMA_LARGE_BLOCKS=0' if best == 'nolarge' else best})")
for size in sizes:
    if not ran(f"burst/{size}/shim") or not ran(f"burst/{size}/native"):
        continue
    r = ratios.per_round(fig(f"burst/{size}/shim", "burst_ms"), fig(f"burst/{size}/native", "burst_ms"))
    if size in GROWTH:
        growth_cells.append((size + " MiB", r))
    print(f"growth/{size}: shim / native = {ratios.cell(r)}")
    if size not in GROWTH and ratios.median(r) is not None:
        print(f"  small blocks ({size} MiB): the shim {'faster than native: ok' if ratios.median(r) < 1 else 'not faster than native: MISS'}")
for n in asks:
    if not ran(f"ask/{n}/shim") or not ran(f"ask/{n}/native"):
        continue
    shim, native = fig(f"ask/{n}/shim", "ask_ms"), fig(f"ask/{n}/native", "ask_ms")
    d = [shim[r] - native[r] for r in shim if shim[r] is not None and native.get(r) is not None]
    ask_cells.append((f"{n} blocks", d))
    if d:
        print(f"ask/{n}: shim - native = {ratios.median(d):.0f} ms [{min(d):.0f} to {max(d):.0f}]")
    else:
        print(f"ask/{n}: shim - native = -")
print()
for label, cells, form in (("held: shim / native", held_cells, "{:.2f}x"),
                           ("growth: shim / native", growth_cells, "{:.2f}x"),
                           ("ask: shim - native", ask_cells, "{:.0f} ms")):
    m, name = worst(cells)
    print(f"{label} = " + ("-" if m is None else form.format(m) + f" (worst: {name})"))
PYEOF
)
echo
PATTERN_NAMES="${PATTERNS[*]}" BURST_SIZES="${BURSTS[*]}" ASK_BLOCKS="${ASKS[*]}" "$PY" -c "$TABLE" "$TSV" || failed=1
echo
echo "figures: $TSV; log: $LOG"
exit $failed
