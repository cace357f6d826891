#!/usr/bin/env bash
# Real-program benchmarks: PyTorch training, CuPy array chains and (with 2+ GPUs)
# DDP over NCCL, each under several allocators, the shim among them, and what the
# preload costs `import torch`; one table.
#
#   scripts/bench_programs.sh path/to/libsomashim.so
#
# Scenarios (a group's first is its baseline, "x base" divides by it; its last, "<baseline>
# again", runs the baseline a second time in the round: the noise floor):
#   transformer/*, resnet/*  scripts/bench_torch.py --model M under
#       caching            PyTorch's caching allocator (default)
#       caching-off        PYTORCH_NO_CUDA_MEMORY_CACHING=1
#       caching-off+shim   the same, LD_PRELOAD=the shim
#       cudaMallocAsync    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
#   generate/*               scripts/bench_generate.py (GPT-2 generation, a KV cache grown
#                            token by token): caching, caching-off, caching-off+shim,
#                            cudaMallocAsync; the tokens must be the same in every run
#   scoring/*                scripts/bench_scoring.py (GPT-2 scoring 28 batch x length shapes
#                            twice: logits upcast and softmaxed, blocks of MiB to GiB):
#                            caching, caching-off, caching-off+shim, cudaMallocAsync; the
#                            scores' checksum must be the same in every run
#   cupy/*                   scripts/bench_cupy.py: pool, nopool, nopool+shim
#   import/*                 scripts/bench_import.py (`import torch` in new processes, time
#                            per process): plain, plain+shim (the preload's cost there)
#   ddp2/*  (2+ GPUs only)   torchrun 2 ranks of scripts/bench_ddp.py: caching,
#                            caching-off, caching-off+shim, cudaMallocAsync
#
# Environment: BENCH_REPS (5: every scenario runs that many times, one round of all
# scenarios after another, so that a slow spell of the machine hits every allocator;
# the table gives medians, ranges, and each round's ratio to the group's baseline and
# to its fastest own allocator in that round, as scripts/ratios.py takes them), PYTHON (python3), BENCH_STEPS (30) and BENCH_WARMUP (5) for the torch
# and DDP runs, BENCH_RESNET_STEPS (default BENCH_STEPS), BENCH_DDP_STEPS (200: each DDP
# step draws its sequence length, 64 to 512, so 30 steps sample few lengths and the
# pool's first growth weighs on their median: docs/BENCHMARKS.md, "DDP, two ranks"),
# BENCH_CUPY_CHAINS (40), BENCH_GEN_REQUESTS (12 generation requests after 2 of warm-up), BENCH_TIMEOUT (90: seconds per scenario, then it is killed
# and reported), BENCH_ONLY (a bash regex on scenario names, e.g. 'transformer|cupy'),
# BENCH_PIN (1: every run but DDP's on the CPUs of GPU 0's NUMA node, with taskset; 0:
# not pinned), BENCH_SHIM_VARIANTS (';'-separated groups of SOMA_* settings: each runs every shim
# scenario once more with them, named SCENARIO[SETTINGS], in the same rounds; e.g.
# 'SOMA_LEGACY_CACHE=off' measures the shim without its legacy-order cache; a group may
# also hold LD_PRELOAD=/absolute/path/other.so, which runs another build of the shim in
# the same rounds: the later assignment wins).
# SOMA_* variables in the environment reach the shim runs; shim runs also get
# SOMA_STATS=<file> (DDP: SOMA_STATS=1, each rank's table in the log), and the table shows the pool's figures from it
# when the shim writes them. LD_PRELOAD and PyTorch's allocator variables are
# cleared first, so that the baselines are clean.
#
# Output: progress and the table on stdout; $OUT/programs.jsonl (one JSON line per
# scenario) and $OUT/programs.log (environment, table, each scenario's stderr) if OUT
# is set, else build/programs/. A failed scenario is reported and the rest go on;
# the exit status is 1 if any failed. About 5-7 minutes a round on one H100/H200
# (the import rows add 12 processes of `import torch`, the scoring rows 5 runs of about
# 15 s).
set -uo pipefail
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
SHIM=${1:-}
PY=${PYTHON:-python3}
STEPS=${BENCH_STEPS:-30}
WARMUP=${BENCH_WARMUP:-5}
RESNET_STEPS=${BENCH_RESNET_STEPS:-$STEPS}
DDP_STEPS=${BENCH_DDP_STEPS:-200}
CUPY_CHAINS=${BENCH_CUPY_CHAINS:-40}
GEN_REQUESTS=${BENCH_GEN_REQUESTS:-12}
T=${BENCH_TIMEOUT:-90}
REPS=${BENCH_REPS:-5}
ONLY=${BENCH_ONLY:-}
VARIANTS=()
[ -n "${BENCH_SHIM_VARIANTS:-}" ] && IFS=';' read -r -a VARIANTS <<<"$BENCH_SHIM_VARIANTS"
WORK=build/programs
DEST=${OUT:-$WORK}
mkdir -p "$WORK" "$DEST" || exit 2
JSONL=$DEST/programs.jsonl
LOG=$DEST/programs.log
: >"$JSONL"
: >"$LOG"
export PYTHONUNBUFFERED=1

for v in LD_PRELOAD PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF; do
  if [ -n "${!v:-}" ]; then
    echo "note: clearing $v=${!v} for the baselines"
    unset "$v"
  fi
done

# The helpers: finish a scenario's JSON line (error line if none, shim statistics
# merged in), and print the table. Run without the preload.
HELPER=$(cat <<'PYEOF'
import json, os, re, sys
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import ratios

def finalize(name, rc, out, err, stats, rnd):
    lines = [l for l in open(out, errors="replace").read().splitlines() if l.startswith("{")]
    parsed = []
    for l in lines:
        try:
            parsed.append(json.loads(l))
        except ValueError:
            pass
    good = [r for r in parsed if "error" not in r]
    rec = (good or parsed or [None])[-1 if good else 0]
    killed = {124: "killed after the time limit", 137: "killed (SIGKILL: time limit or out of memory)"}
    if rec is None:
        tail = [l for l in open(err, errors="replace").read().splitlines() if l.strip()][-3:]
        why = killed.get(rc, f"exit status {rc}, no JSON line")
        rec = {"error": why + (": " + " | ".join(tail) if tail else "")}
    rec["scenario"] = name
    rec["round"] = rnd
    rec["exit_status"] = rc
    if rc != 0 and "error" not in rec:
        others = [r["error"] for r in parsed if "error" in r]
        if rec.get("check_ok") is False:
            checks = {k: rec.get(k) for k in ("params_identical", "loss_finite") if k in rec}
            others.insert(0, f"check failed: {checks}")
        rec["error"] = "; ".join(others) or killed.get(rc, f"exit status {rc}")
    try:
        text = open(stats, errors="replace").read()
    except OSError:
        text = None
    if text:
        m = re.search(r"^\s*pool allocations\s+(\d+)", text, re.M)
        rec["shim_pool_allocs"] = int(m.group(1)) if m else 0  # no device section: nothing pooled
        m = re.search(r"^\s*peak reserved \(pool\)\s+([\d.]+ ?[KMGT]?i?B)", text, re.M)
        rec["shim_peak_reserved"] = m.group(1) if m else None
        m = re.search(r"^\s*cudaMalloc/cuMemAlloc\s+([\d.]+) us\s+\((\d+) calls\)", text, re.M)
        rec["shim_alloc_us"] = float(m.group(1)) if m else None
    print(json.dumps(rec))

def fmt(v, spec):
    return "-" if v is None else format(v, spec)

# The rows that are a framework's own allocator: the shim's rows are also given against the
# fastest of them (by median), round by round.
OWN = ("caching", "cudaMallocAsync", "pool")
AGAIN = " again"

def table(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    ms_of = lambda r: None if "error" in r else next(
        (r[k] for k in ("ms_per_step_median", "ms_per_chain_median", "ms_per_token_median", "ms_per_import_median",
                        "ms_per_pass_median") if k in r), None)
    mem_of = lambda r: None if "error" in r else r.get("peak_device_used_mib")
    names, runs, base = [], {}, {}
    for r in rows:
        name = r.get("scenario", "?")
        if name not in runs:
            names.append(name)
            runs[name] = []
            base.setdefault(name.split("/")[0], name)
        runs[name].append(r)
    by_round = lambda name, of: {r.get("round"): of(r) for r in runs[name]}
    group = lambda name: name.split("/")[0]
    def best_own(name):
        own = [n for n in names if group(n) == group(name) and n.split("/", 1)[1] in OWN]
        timed = [(ratios.median([ms_of(r) for r in runs[n]]), n) for n in own]
        timed = [t for t in timed if t[0] is not None]
        return min(timed)[1] if timed else None
    head = ("scenario", "ms", "[min-max]", "host ms", "x base [interval]", "x best own [interval]", "dev MiB",
            "x base", "torch res MiB", "shim pool", "loss/check")
    w = (max([30] + [len(n) for n in names]), 9, 17, 8, 20, 32, 9, 7, 13, 18, 12)
    print("  ".join(h.ljust(x) if i == 0 else h.rjust(x) for i, (h, x) in enumerate(zip(head, w))))
    errors = []
    for name in names:
        these = runs[name]
        ms = [ms_of(r) for r in these if ms_of(r) is not None]
        spread = f"[{min(ms):.2f}-{max(ms):.2f}]" if ms else "-"
        last = these[-1]
        pool = "-"
        if last.get("shim_pool_allocs") is not None:
            pool = str(last["shim_pool_allocs"])
            if last.get("shim_peak_reserved"):
                pool += "/" + last["shim_peak_reserved"]
        checks = []
        group_tokens = {x.get("tokens_sha") for n in names if group(n) == group(name)
                        for x in runs[n] if "error" not in x}
        group_checksums = {x.get("checksum") for n in names if group(n) == group(name)
                           for x in runs[n] if "error" not in x}
        for r in these:
            if "error" in r:
                errors.append(f"{name} (round {r.get('round')}): {r['error']}")
                checks.append("ERROR")
            elif r.get("bench") == "generate":
                # The same tokens from every allocator, every round.
                checks.append(r.get("tokens_sha", "")[:8] if len(group_tokens) == 1 else "FAIL tokens")
            elif r.get("bench") == "scoring":
                # The same scores from every allocator, every round.
                checks.append(r.get("checksum", "")[:8] if len(group_checksums) == 1 else "FAIL checksum")
            elif r.get("bench") == "torch":
                checks.append(fmt(r.get("final_loss"), ".5f"))
            elif r.get("check_ok") is True:
                checks.append("ok" if r.get("bench") in ("cupy", "import") else f"ok {fmt(r.get('final_loss'), '.4f')}")
            else:
                checks.append("FAIL")
        check = next((c for c in checks if c in ("ERROR", "FAIL", "FAIL tokens", "FAIL checksum")), checks[-1])
        host = ratios.median([r.get("host_ms_per_step_median") for r in these if "error" not in r])
        baseline = base[group(name)]
        if name == baseline:
            vs_base = "1.00x"
        elif name == baseline + AGAIN:
            vs_base = ratios.cell(ratios.per_round(by_round(name, ms_of), by_round(baseline, ms_of))) + " noise"
        else:
            vs_base = ratios.cell(ratios.per_round(by_round(name, ms_of), by_round(baseline, ms_of)))
        best = best_own(name)
        vs_best = "-"
        if "+shim" in name and best:
            vs_best = ratios.cell(ratios.per_round(by_round(name, ms_of), by_round(best, ms_of))) + " " + best.split("/", 1)[1]
        mem_base = ratios.median(ratios.per_round(by_round(name, mem_of), by_round(baseline, mem_of)))
        cells = (name, fmt(ratios.median(ms), ".2f"), spread, fmt(host, ".2f"), vs_base, vs_best,
                 fmt(ratios.median([mem_of(r) for r in these]), ".0f"), fmt(mem_base, ".2f"),
                 fmt(ratios.median([r.get("peak_reserved_mib") for r in these]), ".0f"), pool, check)
        print("  ".join(c.ljust(x) if i == 0 else c.rjust(x) for i, (c, x) in enumerate(zip(cells, w))))
    print()
    # One line a row against its reference (shim rows: the group's fastest own allocator;
    # others: the group's first row), with the noise floor of its program beside it.
    for name in names:
        baseline = base[group(name)]
        if name in (baseline, baseline + AGAIN):
            continue
        best = best_own(name)
        against = best if "+shim" in name and best else baseline
        noise = ratios.per_round(by_round(baseline + AGAIN, ms_of), by_round(baseline, ms_of)) \
            if baseline + AGAIN in runs else None
        print(ratios.ratio_line(name, ratios.per_round(by_round(name, ms_of), by_round(against, ms_of)), against, noise))
    print()
    print("ms: median per training step (transformer, resnet, ddp2: rank 0), per generated token (generate),")
    print("  per pass over the 28 shapes (scoring), per array chain (cupy) or per process that imports torch (import),")
    print("  after the warm-up (scoring: both passes), in each run; the table gives the median over the rounds and")
    print("  [min-max].")
    print("  host ms (torch; ddp2: rank 0): the part of a step until the program's thread had issued it, median; near")
    print("  ms, the step waits for the host (allocation calls count there), not for the GPU.")
    print("x base: against the group's first row (PyTorch's caching allocator, CuPy's pool, import without the")
    print("  preload) in the same round;")
    print("  the row ' again' is that allocator run a second time in the round: its ratio is the noise floor.")
    print("  x best own (shim rows): against the group's fastest own allocator (" + ", ".join(OWN) + ") in the same round.")
    print("  " + ratios.LEGEND + ".")
    print("ratio: each row's time against its reference, as above, with its program's noise floor; where the")
    print(f"  interval is wider than {ratios.RESOLUTION:.2f}, or one round gave it, the line says it cannot resolve 5%.")
    print("dev MiB: peak device memory in use (cudaMemGetInfo total - free, probed during and after every")
    print("  step) minus the value before the model, median over the rounds; the one figure comparable")
    print("  across allocators; x base: its median per-round ratio.")
    print("  torch res MiB: torch.cuda.max_memory_reserved() (none with caching off).")
    print("shim pool: allocations the shim's pool served / its peak reserved (SOMA_STATS, last round); 0: the shim")
    print("  pooled nothing; '-': no statistics (not a shim run, or a shim without SOMA_STATS).")
    print("loss/check: final training loss (seeded: similar across allocators), the generated tokens' hash")
    print("  (the same for every allocator, else 'FAIL tokens'), the scores' checksum (the same for every")
    print("  allocator, else 'FAIL checksum'), 'ok' = CuPy results")
    print("  right / DDP parameters identical on every rank / every import exited 0, stderr empty.")
    if errors:
        print()
        print("failed:")
        for e in errors:
            print("  " + e)

if sys.argv[1] == "finalize":
    finalize(sys.argv[2], int(sys.argv[3]), *sys.argv[4:7], int(sys.argv[7]))
else:
    table(sys.argv[2])
PYEOF
)

say() { echo "$@" | tee -a "$LOG"; }

say "somashim real-program benchmarks, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
if nvidia-smi -L >/dev/null 2>&1; then
  NGPU=$(nvidia-smi -L | grep -c '^GPU')
  say "GPU: $(nvidia-smi -L | head -n 1) (x$NGPU); driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
  # The CPUs and NUMA node near each GPU: a process the kernel places far from its GPU
  # launches work more slowly, one possible cause of a program's per-process modes.
  { echo "topology (nvidia-smi topo -m):"; nvidia-smi topo -m 2>&1 | sed 's/^/  /'; } >>"$LOG"
else
  NGPU=0
  say "GPU: nvidia-smi failed (no GPU or no driver): the runs below will report errors"
fi
# Every process but DDP's runs on the CPUs of GPU 0's NUMA node; the GPU's own settings
# are left as they are. BENCH_PIN=0: not pinned.
PIN=()
if [ "$NGPU" -gt 0 ] && [ "${BENCH_PIN:-1}" = 1 ] && command -v taskset >/dev/null; then
  CPUS=$(scripts/gpu_cpus.sh)
  [ -n "$CPUS" ] && PIN=(taskset -c "$CPUS")
  say "pinned to: ${CPUS:-nothing (the CPUs of GPU 0 not found)}"
fi
say "python: $($PY -c 'import sys; print(sys.version.split()[0])' 2>&1)"
say "torch: $($PY -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -n 1)"
say "cupy: $($PY -c 'import cupy; print(cupy.__version__)' 2>&1 | tail -n 1)"
if [ -n "$SHIM" ] && [ -f "$SHIM" ]; then
  SHIM=$(readlink -f "$SHIM")
  say "shim: $SHIM (sha256 $(sha256sum "$SHIM" | cut -c1-16), built $(date -u -r "$SHIM" '+%Y-%m-%d %H:%M UTC'))"
else
  say "shim: '${SHIM}' not found: the +shim scenarios will report errors (pass path/to/libsomashim.so)"
  SHIM=
fi
if REV=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- src 2>/dev/null || REV="$REV + uncommitted changes in src/"
  say "source: $REV"
fi
say "steps: torch $STEPS (resnet $RESNET_STEPS, ddp $DDP_STEPS) after $WARMUP warm-up; cupy $CUPY_CHAINS chains; limit ${T}s each; $REPS rounds"
for v in "${VARIANTS[@]}"; do say "shim variant: [$v]"; done
env | grep '^SOMA_' | sed 's/^/setting: /' | tee -a "$LOG"

FAILED=0
N=0

# scenario NAME [VAR=VALUE...] -- COMMAND...
scenario() {
  local name=$1
  shift
  local envs=()
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]]; then
    return 0
  fi
  N=$((N + 1))
  local f
  f=$WORK/$(echo "$name" | tr '/+ ' '___').$ROUND
  rm -f "$f.out" "$f.err" "$f.stats"
  local shimmed=0 stats=0
  local e
  for e in "${envs[@]}"; do
    [[ $e == LD_PRELOAD=* ]] && shimmed=1
    [[ $e == SOMA_STATS=* ]] && stats=1
  done
  [ "$shimmed" = 1 ] && [ "$stats" = 0 ] && envs+=("SOMA_STATS=$(pwd -P)/$f.stats")
  echo "== [$N] $name (round $ROUND of $REPS): ${envs[*]} $*"
  local start=$SECONDS rc
  if [ "$shimmed" = 1 ] && [ -z "$SHIM" ]; then
    echo "shim library not found" >"$f.err"
    : >"$f.out"
    rc=1
  else
    local pin=("${PIN[@]}")
    [[ $name == ddp2/* ]] && pin=() # two ranks, two GPUs
    timeout -k 10 "$T" env "${envs[@]}" "${pin[@]}" "$@" >"$f.out" 2>"$f.err"
    rc=$?
  fi
  local line
  line=$($PY -c "$HELPER" finalize "$name" "$rc" "$f.out" "$f.err" "$f.stats" "$ROUND" 2>&1 | tail -n 1)
  case $line in
    "{"*) ;;
    *) line="{\"scenario\": \"$name\", \"error\": \"could not read the result\", \"exit_status\": $rc}" ;;
  esac
  echo "$line" >>"$JSONL"
  {
    echo
    echo "===== $name, round $ROUND (exit status $rc, $((SECONDS - start)) s): ${envs[*]} $*"
    cat "$f.err"
    [ -s "$f.stats" ] && { echo "----- SOMA_STATS"; cat "$f.stats"; }
  } >>"$LOG"
  if [ "$rc" != 0 ] || [[ $line == *'"error"'* ]]; then
    FAILED=1
    echo "   FAILED (exit status $rc, $((SECONDS - start)) s); last lines of stderr:"
    grep -v '^\s*$' "$f.err" | tail -n 12 | sed 's/^/   | /'
  else
    echo "   done in $((SECONDS - start)) s: $(grep -o '"ms_per_[a-z]*_median": [0-9.]*' <<<"$line" | head -n 1)"
  fi
}

# shim_scenario NAME [VAR=VALUE...] -- COMMAND...: NAME under the shim, then once
# with each of BENCH_SHIM_VARIANTS' settings (NAME[SETTINGS]).
shim_scenario() {
  local name=$1 variant
  shift
  scenario "$name" LD_PRELOAD="$SHIM" "$@"
  for variant in "${VARIANTS[@]}"; do
    local -a settings
    read -r -a settings <<<"$variant"
    scenario "$name[$variant]" LD_PRELOAD="$SHIM" "${settings[@]}" "$@"
  done
}

# torch_rows GROUP COMMAND...: GROUP under PyTorch's allocators: caching (the baseline),
# caching off, caching off under the shim (with SHIM_ENV's settings too), cudaMallocAsync
# and caching again (the noise floor), each run as COMMAND --label GROUP/ROW.
torch_rows() {
  local group=$1 shim_env
  shift
  read -r -a shim_env <<<"${SHIM_ENV:-}"
  scenario "$group/caching" -- "$@" --label "$group/caching"
  scenario "$group/caching-off" PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- "$@" --label "$group/caching-off"
  shim_scenario "$group/caching-off+shim" PYTORCH_NO_CUDA_MEMORY_CACHING=1 "${shim_env[@]}" -- "$@" \
    --label "$group/caching-off+shim"
  scenario "$group/cudaMallocAsync" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync -- "$@" --label "$group/cudaMallocAsync"
  scenario "$group/caching again" -- "$@" --label "$group/caching again"
}

# One round: every scenario once.
one_round() {
  IMPORT=("$PY" scripts/bench_import.py --module torch --imports 3 --warmup 1)
  scenario import/plain -- "${IMPORT[@]}" --label import/plain
  shim_scenario import/plain+shim -- "${IMPORT[@]}" --label import/plain+shim
  scenario "import/plain again" -- "${IMPORT[@]}" --label "import/plain again"

  for model in transformer resnet; do
    steps=$STEPS
    [ "$model" = resnet ] && steps=$RESNET_STEPS
    torch_rows "$model" "$PY" scripts/bench_torch.py --model "$model" --steps "$steps" --warmup "$WARMUP"
  done

  for gpt2 in generate scoring; do
    case $gpt2 in
      generate) GPT2=("$PY" scripts/bench_generate.py --requests "$GEN_REQUESTS" --warmup 2) ;;
      scoring) GPT2=("$PY" scripts/bench_scoring.py --passes 2) ;;
    esac
    torch_rows "$gpt2" "${GPT2[@]}"
  done

  CUPY=("$PY" scripts/bench_cupy.py --chains "$CUPY_CHAINS" --warmup 5)
  scenario cupy/pool -- "${CUPY[@]}" --mode pool --label cupy/pool
  scenario cupy/nopool -- "${CUPY[@]}" --mode nopool --label cupy/nopool
  shim_scenario cupy/nopool+shim -- "${CUPY[@]}" --mode nopool --label cupy/nopool+shim
  scenario "cupy/pool again" -- "${CUPY[@]}" --mode pool --label "cupy/pool again"

  if [ "$NGPU" -ge 2 ]; then
    DDP=("$PY" -m torch.distributed.run --standalone --nproc_per_node=2 scripts/bench_ddp.py
      --steps "$DDP_STEPS" --warmup "$WARMUP" --timeout "$T")
    # SOMA_STATS=1: each rank's table goes to stderr, into the log (one file would be overwritten).
    SHIM_ENV=SOMA_STATS=1 torch_rows ddp2 "${DDP[@]}"
  fi
}

[ "$NGPU" -ge 2 ] || say "DDP: skipped ($NGPU GPU(s); needs 2)"
for ROUND in $(seq 1 "$REPS"); do
  one_round
done

echo
{
  echo
  echo "===== table"
} >>"$LOG"
$PY -c "$HELPER" table "$JSONL" 2>&1 | tee -a "$LOG"
echo
echo "results: $JSONL; log: $LOG"
exit "$FAILED"
