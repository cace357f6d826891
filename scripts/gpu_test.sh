#!/usr/bin/env bash
# Differential GPU test suite for libsomashim.so (needs an NVIDIA GPU and nvcc;
# no cargo).
#
#   scripts/gpu_test.sh path/to/libsomashim.so        (make gpu-test [SHIM=...])
#
# For each program in c_tests/gpu: build it (nvcc -cudart shared), run it
# natively and with LD_PRELOAD=<shim> (a test's SOMA_* settings apply to both
# runs), and compare their stdout without the informational '# ' lines. Both
# runs must exit 0; the '# pooled N' line must say N == 0 natively and N > 0
# under the shim, or the shim's statistics count large blocks it served from
# the real allocator (so a shim that passes everything through cannot pass), and
# the shim must have logged no warning or error (the program would see it).
# own_context (a context of the program's own) must have '# pooled 0' in both
# runs, and the shim run may take at most 3x the native one + 0.5 s. Then
# the non-C checks (no-CUDA processes, bad configuration), the race test's
# teeth (race --wrong-stream, also with --streams 256 and --threads 16,
# legacy_race --no-stream-wait and capture_free_race --unordered, natively,
# must detect corruption), the
# statistics and trace files of forked children (fork@stats), and the suite
# again under compute-sanitizer memcheck with the shim preloaded into the
# target only. The last line is 'N passed, N failed, N skipped'; the exit
# status is non-zero if any test failed.
#
# Environment:
#   GPU_ARCH=sm_90          nvcc -arch value
#   NVCC=nvcc               the compiler
#   COMPUTE_SANITIZER=...   path of compute-sanitizer (default: PATH, then next to nvcc)
#   GPU_TEST_TIMEOUT=600    seconds allowed to one run of one program
#   GPU_TEST_SANITIZER=0    leave the compute-sanitizer phase out (counted as skipped);
#                           =only runs that phase alone (a lane of its own)
#   GPU_TEST_ONLY="a b"     run only these tests (names as printed, or glob patterns:
#                           'torch_*')
#   GPU_TEST_SKIP="a b"     leave these out (names or patterns; counted nowhere): a
#                           second call runs them with GPU_TEST_ONLY
#   GPU_TEST_VARIANTS="static driver"  only these builds' tests (default all three;
#                           the checks that are no C program count as shared):
#                           lanes of one machine can split the suite by build
#   OUT=dir                 where gpu-test.log goes (default build/gpu)
set -uo pipefail
# A relative shim path is taken from the caller's directory.
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd -P) # output files are refused on a path through a symbolic link

if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: $0 path/to/libsomashim.so" >&2
  exit 2
fi
if [ ! -f "$1" ]; then
  echo "gpu_test: $1: no such file (build the shim first, or pass SHIM=path/to/libsomashim.so)" >&2
  exit 2
fi
SHIM=$(readlink -f "$1")
NVCC=${NVCC:-nvcc}
ARCH=${GPU_ARCH:-sm_90}
BUILD=$ROOT/build/gpu
RUNS=$BUILD/runs
T=${GPU_TEST_TIMEOUT:-600}
LOGDIR=${OUT:-$BUILD}
mkdir -p "$BUILD" "$RUNS" "$LOGDIR"
LOG=$LOGDIR/gpu-test.log
: >"$LOG"

say() { printf '%s\n' "$*" | tee -a "$LOG"; }
logonly() { printf '%s\n' "$*" >>"$LOG"; }
# Append a file to the log (at most 300 lines of it).
logfile() {
  local title=$1 f=$2
  [ -s "$f" ] || return 0
  logonly "----- $title ($f)"
  if [ "$(wc -l <"$f")" -gt 300 ]; then
    head -n 150 "$f" >>"$LOG"
    logonly "[... $(($(wc -l <"$f") - 300)) lines left out ...]"
    tail -n 150 "$f" >>"$LOG"
  else
    cat "$f" >>"$LOG"
  fi
}

if ! command -v "$NVCC" >/dev/null 2>&1; then
  say "gpu_test: nvcc not found (set NVCC=...): cannot build the GPU tests"
  exit 2
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  say "gpu_test: nvidia-smi failed: no usable NVIDIA GPU here"
  exit 2
fi

# shellcheck source=scripts/gpu_common.sh
. scripts/gpu_common.sh
cudart_rpath

say "# somashim GPU test suite, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
say "# shim: $SHIM ($(sha256sum "$SHIM" | cut -c1-16))"
say "# nvcc: $("$NVCC" --version | tail -n 1); arch $ARCH"
nvidia-smi -L 2>/dev/null | sed 's/^/# /' | tee -a "$LOG"
nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 | sed 's/^/# driver /' | tee -a "$LOG"

# The suite's shim processes talk over sockets of their own (SOMA_SOCKET_DIR):
# suites beside it (another lane's) are neither asked for memory nor listed.
SOCKETS=$(mktemp -d /tmp/somashim-gpu-XXXXXX) || exit 2
trap 'rm -rf "$SOCKETS"' EXIT
export SOMA_SOCKET_DIR=${SOMA_SOCKET_DIR:-$SOCKETS/all}

PASS=0 FAIL=0 SKIP=0
FAILED_NAMES=()
pass() { PASS=$((PASS + 1)); say "PASS $1${2:+ ($2)}"; }
fail() {
  FAIL=$((FAIL + 1))
  FAILED_NAMES+=("$1")
  say "FAIL $1: $2"
}
skip() { SKIP=$((SKIP + 1)); say "SKIP $1 ($2)"; }
# A test's build: #static and #driver name theirs; every other check is the shared one's.
VARIANTS=" ${GPU_TEST_VARIANTS:-shared static driver} "
wanted() {
  local variant=shared
  case $1 in *#static) variant=static ;; *#driver) variant=driver ;; esac
  [[ $VARIANTS == *" $variant "* ]] || return 1
  [ "${GPU_TEST_SANITIZER:-1}" = only ] && [[ $1 != sanitizer:* ]] && return 1
  # Each word is a glob pattern matched against the name (set -f: never a file name).
  local - w
  set -f
  for w in ${GPU_TEST_SKIP:-}; do [[ $1 == $w ]] && return 1; done
  [ -z "${GPU_TEST_ONLY:-}" ] && return 0
  for w in $GPU_TEST_ONLY; do [[ $1 == $w ]] && return 0; done
  return 1
}

# ---- the tests ----------------------------------------------------------
# name | program | args | env (both runs) | GPUs needed | under sanitizer: "-" no, "=" same args, else these args
TESTS=$(
  cat <<'EOF'
streams|streams|||1|=
race|race|||1|=
work_kinds|work_kinds|||1|=
work_kinds@past_limit|work_kinds||SOMA_PENDING_FREE_LIMIT=0|1|-
work_kinds@untracked|work_kinds||SOMA_TRACK_WORK=0|1|-
legacy_race|legacy_race|||1|=
free_sync|free_sync||SOMA_FREE_SYNC=1|1|=
mixed|mixed|||1|=
mixed@max_bytes|mixed||SOMA_MAX_BYTES=1048576|1|=
errors|errors|||1|--no-oom
host_pinned|host_pinned||CUDA_VISIBLE_DEVICES=one SOMA_HOST_POOL=1|1|=
host_race|host_race||CUDA_VISIBLE_DEVICES=one SOMA_HOST_POOL=1|1|=
pointer_ops|pointer_ops||CUDA_VISIBLE_DEVICES=one|1|=
threads|threads|||1|=
threads@legacy|threads|--legacy-only||1|=
capture|capture|||1|=
reset|reset|||1|=
streams_destroyed|streams_destroyed|||1|=
multi_device|multi_device|||2|=
peer|peer|||2|=
streams@barrier|streams||SOMA_FREE_ORDER=barrier|1|-
race@barrier|race||SOMA_FREE_ORDER=barrier|1|-
legacy_race@barrier|legacy_race||SOMA_FREE_ORDER=barrier|1|-
streams_destroyed@barrier|streams_destroyed||SOMA_FREE_ORDER=barrier|1|-
threads@barrier|threads||SOMA_FREE_ORDER=barrier|1|-
streams@pool_default|streams||SOMA_POOL=default|1|-
race@pool_default|race||SOMA_POOL=default|1|-
mixed@pool_default|mixed||SOMA_POOL=default|1|-
errors@pool_default|errors||SOMA_POOL=default|1|-
streams@internal_deps|streams||SOMA_REUSE_INTERNAL_DEPS=1|1|-
race@internal_deps|race||SOMA_REUSE_INTERNAL_DEPS=1|1|-
streams_destroyed@internal_deps|streams_destroyed||SOMA_REUSE_INTERNAL_DEPS=1|1|-
mixed@internal_deps|mixed||SOMA_REUSE_INTERNAL_DEPS=1|1|-
errors@internal_deps|errors||SOMA_REUSE_INTERNAL_DEPS=1|1|-
meminfo|meminfo||SOMA_MEMINFO=pool|1|-
own_allocators|own_allocators|||1|-
own_allocators@no_large|own_allocators||SOMA_LARGE_BLOCKS=0|1|-
memory_limit|memory_limit||SOMA_MEMORY_LIMIT=4GiB|1|-
memory_limit@nonblocking|memory_limit|--nonblocking|SOMA_MEMORY_LIMIT=4GiB|1|-
memory_limit@share|memory_limit||SOMA_MEMORY_LIMIT=5%|1|-
pitch|pitch|||1|=
ipc|ipc|||1|-
ipc_errors|ipc_errors|||1|-
ipc_lifetime|ipc_lifetime|||1|-
ipc_load|ipc_load|||1|-
ipc_load@silent|ipc_load|silent||1|-
ipc_load@flood|ipc_load|flood||1|-
neighbours|neighbours||SOMA_DECAY_MS=3000 SOMA_IDLE_MS=0|1|-
neighbours@idle|neighbours||SOMA_DECAY_MS=600000|1|-
ipc@passthrough_callers|ipc||SOMA_PASSTHROUGH_CALLERS=ipc|1|-
capture_modes|capture_modes|||1|=
capture_free_race|capture_free_race|||1|=
capture_free_race@past_limit|capture_free_race||SOMA_PENDING_FREE_LIMIT=0|1|-
capture_free_race@barrier|capture_free_race||SOMA_FREE_ORDER=barrier|1|-
capture_modes@barrier|capture_modes||SOMA_FREE_ORDER=barrier|1|-
capture_modes@exit_global|capture_modes|--exit-capturing global|SOMA_STATS=1|1|-
capture_modes@exit_global_blocking|capture_modes|--exit-capturing global blocking|SOMA_STATS=1|1|-
capture_modes@exit_thread_local|capture_modes|--exit-capturing thread_local|SOMA_STATS=1|1|-
capture_modes@exit_relaxed|capture_modes|--exit-capturing relaxed|SOMA_STATS=1|1|-
own_context|own_context|||1|-
fork|fork|||1|-
streams@past_limit|streams||SOMA_PENDING_FREE_LIMIT=0|1|-
race@past_limit|race||SOMA_PENDING_FREE_LIMIT=0|1|-
legacy_race@past_limit|legacy_race||SOMA_PENDING_FREE_LIMIT=0|1|-
threads@past_limit|threads||SOMA_PENDING_FREE_LIMIT=0|1|-
mixed@past_limit|mixed||SOMA_PENDING_FREE_LIMIT=0|1|-
streams_destroyed@past_limit|streams_destroyed||SOMA_PENDING_FREE_LIMIT=0|1|-
capture_modes@past_limit|capture_modes||SOMA_PENDING_FREE_LIMIT=0|1|-
race@streams256|race|--streams 256||1|-
race@threads16|race|--threads 16||1|-
race@streams256#static|race.static|--streams 256||1|-
race@threads16#static|race.static|--threads 16||1|-
race@streams256#driver|race.driver|--streams 256||1|-
race@threads16#driver|race.driver|--threads 16||1|-
race@streams256_past_limit|race|--streams 256|SOMA_PENDING_FREE_LIMIT=0|1|-
race@threads16_past_limit|race|--threads 16|SOMA_PENDING_FREE_LIMIT=0|1|-
race@threads16_past_limit#static|race.static|--threads 16|SOMA_PENDING_FREE_LIMIT=0|1|-
race@threads16_past_limit#driver|race.driver|--threads 16|SOMA_PENDING_FREE_LIMIT=0|1|-
legacy_race@legacy_cache|legacy_race||SOMA_LEGACY_CACHE=on|1|=
legacy_race@legacy_cache#static|legacy_race.static||SOMA_LEGACY_CACHE=on|1|-
legacy_race@legacy_cache#driver|legacy_race.driver||SOMA_LEGACY_CACHE=on|1|-
threads@legacy_cache|threads|--legacy-only|SOMA_LEGACY_CACHE=on|1|-
mixed@legacy_cache|mixed||SOMA_LEGACY_CACHE=on|1|-
capture_modes@legacy_cache|capture_modes||SOMA_LEGACY_CACHE=on|1|-
streams_destroyed@legacy_cache|streams_destroyed||SOMA_LEGACY_CACHE=on|1|-
reset@legacy_cache|reset||SOMA_LEGACY_CACHE=on|1|-
ipc@legacy_cache|ipc||SOMA_LEGACY_CACHE=on|1|-
ipc@one_pool|ipc||SOMA_SMALL_BLOCKS=0|1|-
ipc_lifetime@one_pool|ipc_lifetime||SOMA_SMALL_BLOCKS=0|1|-
reset@one_pool|reset||SOMA_SMALL_BLOCKS=0|1|-
memory_limit@one_pool|memory_limit||SOMA_MEMORY_LIMIT=4GiB SOMA_SMALL_BLOCKS=0|1|-
streams@large_blocks|streams||SOMA_LARGE_BLOCKS=1|1|-
race@large_blocks|race||SOMA_LARGE_BLOCKS=1|1|=
race@large_blocks#driver|race.driver||SOMA_LARGE_BLOCKS=1|1|-
race@threads16_large_blocks|race|--threads 16|SOMA_LARGE_BLOCKS=1|1|-
legacy_race@large_blocks|legacy_race||SOMA_LARGE_BLOCKS=1|1|=
legacy_race@large_blocks#static|legacy_race.static||SOMA_LARGE_BLOCKS=1|1|-
work_kinds@large_blocks|work_kinds||SOMA_LARGE_BLOCKS=1|1|-
mixed@large_blocks|mixed||SOMA_LARGE_BLOCKS=1|1|-
errors@large_blocks|errors||SOMA_LARGE_BLOCKS=1|1|-
pointer_ops@large_blocks|pointer_ops||CUDA_VISIBLE_DEVICES=one SOMA_LARGE_BLOCKS=1|1|-
threads@large_blocks|threads||SOMA_LARGE_BLOCKS=1|1|-
threads@legacy_large_blocks|threads|--legacy-only|SOMA_LARGE_BLOCKS=1|1|-
capture@large_blocks|capture||SOMA_LARGE_BLOCKS=1|1|-
capture_modes@large_blocks|capture_modes||SOMA_LARGE_BLOCKS=1|1|-
reset@large_blocks|reset||SOMA_LARGE_BLOCKS=1|1|-
streams_destroyed@large_blocks|streams_destroyed||SOMA_LARGE_BLOCKS=1|1|-
ipc@large_blocks|ipc||SOMA_LARGE_BLOCKS=1|1|-
ipc_lifetime@large_blocks|ipc_lifetime||SOMA_LARGE_BLOCKS=1|1|-
neighbours@large_blocks|neighbours||SOMA_DECAY_MS=3000 SOMA_IDLE_MS=0 SOMA_LARGE_BLOCKS=1|1|-
EOF
)
# The same programs built with the static runtime (all of them) and as
# driver-API programs (those whose checks are about allocation and ordering).
# own_context calls no runtime function: its static build is the same program.
DRIVER_API_TESTS=" memory_limit own_allocators host_pinned pointer_ops host_race streams race work_kinds legacy_race free_sync threads capture reset streams_destroyed multi_device peer capture_modes capture_free_race fork ipc ipc_errors ipc_lifetime "
while IFS='|' read -r name prog args envs gpus _; do
  case $name in *@* | own_context) continue ;; esac
  TESTS+=$'\n'"$name#static|$prog.static|$args|$envs|$gpus|-"
  case $DRIVER_API_TESTS in *" $name "*) TESTS+=$'\n'"$name#driver|$prog.driver|$args|$envs|$gpus|-" ;; esac
done <<<"$TESTS"
# Pinned host memory is pooled only in a process that sees one device.
TESTS=${TESTS//CUDA_VISIBLE_DEVICES=one/CUDA_VISIBLE_DEVICES=$ONE_GPU}

# ---- build (in parallel) --------------------------------------------------
say "# building c_tests/gpu/*.cu into $BUILD"
JOBS=$(nproc 2>/dev/null || echo 4)
build_one() {
  local src=$1 name
  name=$(basename "$src" .cu)
  local variant out
  local -a flags
  # Three builds of each program: the shared runtime, nvcc's default static
  # runtime (reached through the driver: dlsym/cuGetProcAddress), and a
  # driver-API program (cuMemAlloc/cuMemFree; see gpu_common.h).
  for variant in shared static driver; do
    case $variant in
      shared) flags=(-cudart shared) out=$name ;;
      static) flags=(-cudart static) out=$name.static ;;
      driver) flags=(-cudart shared -DSOMA_DRIVER_API) out=$name.driver ;;
    esac
    if "$NVCC" -O2 -lineinfo -arch="$ARCH" "${flags[@]}" "${RPATH[@]}" -o "$BUILD/$out" "$src" -lcuda -lpthread \
      >"$BUILD/$out.build.log" 2>&1; then
      echo 0 >"$BUILD/$out.build.rc"
    else
      echo 1 >"$BUILD/$out.build.rc"
    fi
  done
}
running=0
for src in c_tests/gpu/*.cu; do
  rm -f "$BUILD/$(basename "$src" .cu).build.rc"
  build_one "$src" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then
    wait -n 2>/dev/null || wait
    running=$((running - 1))
  fi
done
wait
built() { [ "$(cat "$BUILD/$1.build.rc" 2>/dev/null)" = 0 ]; }
for src in c_tests/gpu/*.cu; do
  for name in "$(basename "$src" .cu)"{,.static,.driver}; do
    if ! built "$name"; then
      say "# build of $name FAILED:"
      sed 's/^/#   /' "$BUILD/$name.build.log" | head -n 40 | tee -a "$LOG"
    fi
  done
done

# The GPUs CUDA sees here (CUDA_VISIBLE_DEVICES counts; nvidia-smi ignores it).
printf '#include <cstdio>\n#include <cuda_runtime.h>\nint main(){int n=0;if(cudaGetDeviceCount(&n))n=0;printf("%%d\\n",n);}\n' >"$BUILD/device_count.cu"
NGPU=0
if "$NVCC" "${RPATH[@]}" -o "$BUILD/device_count" "$BUILD/device_count.cu" >"$BUILD/device_count.build.log" 2>&1; then
  NGPU=$("$BUILD/device_count")
fi
say "# GPUs visible to CUDA: $NGPU"

pooled_of() { sed -n 's/^# pooled \([0-9][0-9]*\) of .*/\1/p' "$1" | tail -n 1; }
# The large blocks of the real allocator a shim run's statistics counted (0 without them).
large_blocks_of() { awk '/^  large blocks \(real allocator\)/ {n += $NF} END {print n + 0}' "$1" 2>/dev/null || echo 0; }

# run_env OUTBASE ENV PRELOAD(0/1) PROG ARGS...: one run; sets RC.
run_one() {
  local base=$1 envs=$2 preload=$3 prog=$4
  shift 4
  local -a e=()
  [ -n "$envs" ] && read -r -a e <<<"$envs"
  if [ "$preload" = 1 ]; then
    # The statistics tell the large blocks the shim served (their pointers
    # are the real allocator's: the driver cannot tell them from native ones).
    [[ $envs == *SOMA_STATS* ]] || e+=("SOMA_STATS=$base.stats")
    env -u GPUTEST_QUICK "${e[@]}" timeout "$T" env LD_PRELOAD="$SHIM" "$BUILD/$prog" "$@" >"$base.out" 2>"$base.err"
  else
    env -u GPUTEST_QUICK "${e[@]}" timeout "$T" "$BUILD/$prog" "$@" >"$base.out" 2>"$base.err"
  fi
  RC=$?
}

# ---- differential runs --------------------------------------------------
say "# differential runs: native vs LD_PRELOAD=$(basename "$SHIM")"
while IFS='|' read -r name prog args envs gpus san; do
  [ -z "$name" ] && continue
  wanted "$name" || continue
  if [ "$gpus" -gt "$NGPU" ]; then
    skip "$name" "needs $gpus GPUs"
    continue
  fi
  if ! built "$prog"; then
    fail "$name" "the program $prog did not build (see above)"
    continue
  fi
  safe=${name//[@#]/_}
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  run_one "$RUNS/$safe.native" "$envs" 0 "$prog" $args
  nrc=$RC
  # shellcheck disable=SC2086
  run_one "$RUNS/$safe.shim" "$envs" 1 "$prog" $args
  src=$RC
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f s", b-a}')
  np=$(pooled_of "$RUNS/$safe.native.out")
  sp=$(pooled_of "$RUNS/$safe.shim.out")
  reasons=()
  [ "$nrc" = 0 ] || reasons+=("native run exited $nrc")
  [ "$src" = 0 ] || reasons+=("shim run exited $src")
  grep -v '^# ' "$RUNS/$safe.native.out" >"$RUNS/$safe.native.cmp"
  grep -v '^# ' "$RUNS/$safe.shim.out" >"$RUNS/$safe.shim.cmp"
  if ! diff -q "$RUNS/$safe.native.cmp" "$RUNS/$safe.shim.cmp" >/dev/null; then
    reasons+=("stdout differs")
  fi
  # The shim logs warnings and errors (SOMA_LOG=warn); the program must not see any.
  if grep -q '^\[\(WARN\|ERROR\)' "$RUNS/$safe.shim.err"; then
    reasons+=("the shim wrote: $(grep -m 1 '^\[\(WARN\|ERROR\)' "$RUNS/$safe.shim.err" | head -c 200)")
  fi
  if [ -z "$np" ]; then
    reasons+=("no '# pooled' line natively")
  elif [ "$np" != 0 ]; then reasons+=("native run saw $np pooled cudaMalloc pointers (must be 0)"); fi
  if [ -z "$sp" ]; then
    reasons+=("no '# pooled' line under the shim")
  elif [[ $envs == *SOMA_PASSTHROUGH_CALLERS* ]]; then
    # Every allocation comes from the listed program: none may be pooled.
    [ "$sp" = 0 ] || reasons+=("$sp pointers pooled although their caller is listed in SOMA_PASSTHROUGH_CALLERS")
  elif [ "${prog%%.*}" = own_context ]; then
    # Memory of a context the program created passes through: none may be pooled.
    [ "$sp" = 0 ] || reasons+=("$sp pointers pooled in a context the program created (they pass through)")
  elif [ "$sp" = 0 ] && [ "$(large_blocks_of "$RUNS/$safe.shim.stats")" = 0 ]; then
    reasons+=("no cudaMalloc pointer came from a pool or the shim's large blocks (is it preloaded?)")
  fi
  if [ "${prog%%.*}" = own_context ]; then
    # The pass-through must cost what the real calls cost (a shim that spent
    # 243 ms per cuMemAlloc in such a context took 200 x that here).
    nms=$(sed -n 's/^# total host time \([0-9.][0-9.]*\) ms$/\1/p' "$RUNS/$safe.native.out" | tail -n 1)
    sms=$(sed -n 's/^# total host time \([0-9.][0-9.]*\) ms$/\1/p' "$RUNS/$safe.shim.out" | tail -n 1)
    if [ -z "$nms" ] || [ -z "$sms" ]; then
      reasons+=("no '# total host time' line (native '${nms:-}', shim '${sms:-}')")
    elif ! awk -v n="$nms" -v s="$sms" 'BEGIN{exit !(s <= 3 * n + 500)}'; then
      reasons+=("the shim run took $sms ms, native $nms ms (allowed: 3x native + 500 ms)")
    fi
    logonly "# $name: total host time native ${nms:-?} ms, shim ${sms:-?} ms"
  fi
  logonly "===== $name: env [$envs] args [$args] native rc=$nrc shim rc=$src pooled native=${np:-?} shim=${sp:-?} ($secs)"
  logfile "$name native stdout" "$RUNS/$safe.native.out"
  logfile "$name native stderr" "$RUNS/$safe.native.err"
  logfile "$name shim stdout" "$RUNS/$safe.shim.out"
  logfile "$name shim stderr" "$RUNS/$safe.shim.err"
  if [ ${#reasons[@]} -eq 0 ]; then
    large=$(large_blocks_of "$RUNS/$safe.shim.stats")
    pass "$name" "$secs, pooled $sp$([ "$large" = 0 ] || echo ", large blocks $large")"
  else
    fail "$name" "$(
      IFS=';'
      echo "${reasons[*]}"
    )"
    diff -u --label native --label shim "$RUNS/$safe.native.cmp" "$RUNS/$safe.shim.cmp" | head -n 60 | tee -a "$LOG"
    for w in native shim; do
      if [ -s "$RUNS/$safe.$w.err" ]; then
        say "  --- $w stderr (last 20 lines):"
        tail -n 20 "$RUNS/$safe.$w.err" | sed 's/^/  /' | tee -a "$LOG"
      fi
    done
  fi
  if [ "$name" = free_sync ]; then
    # Information: the same program under the shim without SOMA_FREE_SYNC.
    run_one "$RUNS/free_sync_nosync.shim" "" 1 free_sync
    say "# info: free_sync under the shim WITHOUT SOMA_FREE_SYNC (exit $RC; 0 = idle, 600 = still running):"
    grep -v '^# ' "$RUNS/free_sync_nosync.shim.out" | sed 's/^/#   /' | tee -a "$LOG"
  fi
done <<<"$TESTS"

# ---- the race tests' teeth ----------------------------------------------
# Each emulates, natively, a shim that orders reuse wrongly, and must detect it
# (race with --threads: its thread phase must detect it on its own too).
for teeth in "race_teeth race --wrong-stream" \
  "race_teeth@streams256 race --wrong-stream --streams 256" \
  "race_teeth@threads16 race --wrong-stream --threads 16" \
  "legacy_race_teeth legacy_race --no-stream-wait" \
  "capture_free_race_teeth capture_free_race --unordered" \
  "host_race_teeth host_race --wrong"; do
  read -r name prog flags <<<"$teeth"
  wanted "$name" || continue
  if ! built "$prog"; then
    fail "$name" "$prog did not build"
    continue
  fi
  safe=${name//[@#]/_}
  # shellcheck disable=SC2086
  run_one "$RUNS/$safe.native" "" 0 "$prog" $flags
  n=$(sed -n 's/^# corruptions \([0-9][0-9]*\).*/\1/p' "$RUNS/$safe.native.out" | tail -n 1)
  logonly "===== $name: rc=$RC corruptions=${n:-?}"
  logfile "$name stdout" "$RUNS/$safe.native.out"
  logfile "$name stderr" "$RUNS/$safe.native.err"
  if [ "$RC" = 0 ] && [ -n "$n" ] && [ "$n" -gt 0 ]; then
    pass "$name" "$prog $flags natively detected $n corrupted reads"
  else
    fail "$name" "$prog $flags (a broken shim, emulated) was not detected: exit $RC, corruptions ${n:-?}"
    tail -n 20 "$RUNS/$safe.native.out" "$RUNS/$safe.native.err" | sed 's/^/  /' | tee -a "$LOG"
  fi
done

# ---- processes that never use CUDA ---------------------------------------
if wanted nocuda_true; then
  LD_PRELOAD="$SHIM" /bin/true >"$RUNS/true.out" 2>"$RUNS/true.err"
  rc=$?
  if [ "$rc" = 0 ] && [ ! -s "$RUNS/true.out" ] && [ ! -s "$RUNS/true.err" ]; then
    pass nocuda_true
  else
    fail nocuda_true "LD_PRELOAD=shim /bin/true: exit $rc, stdout $(wc -c <"$RUNS/true.out") bytes, stderr: $(head -c 300 "$RUNS/true.err")"
  fi
fi
if wanted nocuda_shell; then
  out=$(LD_PRELOAD="$SHIM" sh -c 'echo hello' 2>"$RUNS/sh.err")
  rc=$?
  if [ "$rc" = 0 ] && [ "$out" = hello ] && [ ! -s "$RUNS/sh.err" ]; then
    pass nocuda_shell
  else
    fail nocuda_shell "LD_PRELOAD=shim sh -c 'echo hello': exit $rc, stdout [$out], stderr: $(head -c 300 "$RUNS/sh.err")"
  fi
fi
if wanted nocuda_python; then
  PY=${PYTHON:-python3}
  LD_PRELOAD="$SHIM" "$PY" -c 'print(open("/proc/self/maps").read())' >"$RUNS/py.out" 2>"$RUNS/py.err"
  rc=$?
  reasons=()
  [ "$rc" = 0 ] || reasons+=("exit $rc")
  [ -s "$RUNS/py.err" ] && reasons+=("stderr: $(head -c 300 "$RUNS/py.err")")
  grep -q "$(basename "$SHIM")" "$RUNS/py.out" || reasons+=("the shim is not in /proc/self/maps (not preloaded?)")
  if grep -E 'libcuda|libcudart|libnvidia' "$RUNS/py.out" >"$RUNS/py.cuda"; then
    reasons+=("CUDA libraries mapped: $(awk '{print $NF}' "$RUNS/py.cuda" | sort -u | tr '\n' ' ')")
  fi
  if [ ${#reasons[@]} -eq 0 ]; then
    pass nocuda_python "no CUDA library mapped, nothing on stderr"
  else
    fail nocuda_python "$(
      IFS=';'
      echo "${reasons[*]}"
    )"
  fi
fi

# ---- SOMA_STATS and SOMA_TRACE against the pool's own figures -----------------
if wanted stats_trace; then
  if built streams; then
    SOMA_STATS="$RUNS/stats.txt" SOMA_TRACE="$RUNS/trace.csv" LD_PRELOAD="$SHIM" timeout "$T" "$BUILD/streams" \
      >"$RUNS/stats.out" 2>"$RUNS/stats.err"
    rc=$?
    logfile "stats_trace SOMA_STATS" "$RUNS/stats.txt"
    fig() { awk -v k="$1" 'index($0, k) == 3 {print $(NF-1) " " $NF; exit}' "$RUNS/stats.txt"; }
    count() { awk -v k="$1" 'index($0, k) == 3 {print $3; exit}' "$RUNS/stats.txt"; }
    allocs=$(count "pool allocations") frees=$(count "pool frees")
    rows=$(($(wc -l <"$RUNS/trace.csv" 2>/dev/null || echo 1) - 1))
    trace_allocs=$(grep -c ',alloc,' "$RUNS/trace.csv" 2>/dev/null)
    pooled=$(pooled_of "$RUNS/stats.out")
    reasons=()
    [ "$rc" = 0 ] || reasons+=("exit $rc")
    [ -n "$allocs" ] && [ "$allocs" = "$frees" ] || reasons+=("pool allocations $allocs, frees $frees")
    [ "$(fig 'in use now')" = "0 B" ] || reasons+=("in use at exit: $(fig 'in use now')")
    [ "$(fig 'peak in use (pool)')" != "" ] || reasons+=("no pool figures")
    # The program counts the pooled pointers it got itself: the table has at least those.
    [ -n "$pooled" ] && [ "${allocs:-0}" -ge "$pooled" ] && [ "$pooled" -gt 0 ] || reasons+=("table says ${allocs:-?} pool allocations, the program counted ${pooled:-?} pooled pointers")
    [ "$trace_allocs" = "$allocs" ] || reasons+=("trace has $trace_allocs alloc rows, the table $allocs")
    if [ ${#reasons[@]} -eq 0 ]; then
      pass stats_trace "$allocs pool allocations in table, trace ($rows rows) and program; peak in use $(fig 'peak in use (shim)'), pool peak $(fig 'peak in use (pool)'), reserved $(fig 'peak reserved (pool)')"
    else
      fail stats_trace "$(IFS=';'; echo "${reasons[*]}")"
    fi
    [ -n "${OUT:-}" ] && cp "$RUNS/trace.csv" "$OUT/trace-streams.csv" 2>/dev/null
  else
    fail stats_trace "streams did not build"
  fi
fi

# ---- forked children: SOMA_STATS and SOMA_TRACE of each process ---------------
# fork.cu forks 3 children before any CUDA call (each then uses CUDA) and,
# later, one that makes no CUDA call and leaves through exit(). The parent
# keeps the paths as given; a child writes <path>.<pid>. Each trace has one
# header line (the first) and no row twice (a copy of the parent's buffer).
TRACE_HEADER='time_us,device,op,size,ptr,in_use,reserved'
# trace_problem FILE: nothing if FILE is a well-formed trace, else why not.
trace_problem() {
  local f=$1 h d
  h=$(grep -c "^$TRACE_HEADER\$" "$f")
  if [ "$h" != 1 ] || [ "$(head -n 1 "$f")" != "$TRACE_HEADER" ]; then
    echo "$(basename "$f"): $h header lines (want exactly one, first)"
    return
  fi
  d=$(sort "$f" | uniq -d | head -n 1)
  [ -z "$d" ] || echo "$(basename "$f"): a row written twice: $d"
}
for prog in fork fork.static; do
  name=fork@stats
  [ "$prog" = fork.static ] && name=fork@stats#static
  wanted "$name" || continue
  if ! built "$prog"; then
    fail "$name" "$prog did not build"
    continue
  fi
  safe=${name//[@#]/_}
  dir=$RUNS/$safe.files
  rm -rf "$dir"
  mkdir -p "$dir"
  SOMA_STATS="$dir/stats.txt" SOMA_TRACE="$dir/trace.csv" LD_PRELOAD="$SHIM" timeout "$T" "$BUILD/$prog" \
    >"$RUNS/$safe.out" 2>"$RUNS/$safe.err"
  rc=$?
  files=$(cd "$dir" && ls | tr '\n' ' ')
  logonly "===== $name: rc=$rc files: $files"
  logfile "$name stdout" "$RUNS/$safe.out"
  logfile "$name stderr" "$RUNS/$safe.err"
  reasons=()
  [ "$rc" = 0 ] || reasons+=("exit $rc")
  if grep -q '^\[\(WARN\|ERROR\)' "$RUNS/$safe.err"; then
    reasons+=("the shim wrote: $(grep -m 1 '^\[\(WARN\|ERROR\)' "$RUNS/$safe.err" | head -c 200)")
  fi
  mapfile -t kids < <(sed -n 's/^# child [0-9][0-9]* pid \([0-9][0-9]*\) cuda$/\1/p' "$RUNS/$safe.out")
  nocuda=$(sed -n 's/^# child pid \([0-9][0-9]*\) nocuda$/\1/p' "$RUNS/$safe.out" | tail -n 1)
  [ ${#kids[@]} = 3 ] || reasons+=("the program named ${#kids[@]} CUDA children, not 3")
  # The parent's files.
  [ -s "$dir/stats.txt" ] || reasons+=("no parent statistics stats.txt")
  if [ -f "$dir/trace.csv" ]; then
    why=$(trace_problem "$dir/trace.csv")
    [ -z "$why" ] || reasons+=("$why")
    [ "$(grep -c ',alloc,' "$dir/trace.csv")" -gt 0 ] || reasons+=("trace.csv (the parent's) has no alloc row")
  else
    reasons+=("no parent trace trace.csv")
  fi
  # One pair per child that used CUDA.
  missing=0
  for pid in "${kids[@]}"; do
    for f in stats.txt trace.csv; do
      if [ ! -s "$dir/$f.$pid" ]; then
        missing=1
        reasons+=("no $f.$pid for the child with pid $pid")
      fi
    done
    if [ -s "$dir/trace.csv.$pid" ]; then
      why=$(trace_problem "$dir/trace.csv.$pid")
      [ -z "$why" ] || reasons+=("$why")
      a=$(grep -c ',alloc,' "$dir/trace.csv.$pid")
      [ "$a" -ge 100 ] || reasons+=("trace.csv.$pid has $a alloc rows, the child made 100 pooled allocations or more")
    fi
  done
  [ "$missing" = 0 ] || reasons+=("a child process must write its statistics and trace to <path>.<pid> (the parent keeps <path>); files written: ${files:-none}")
  # The child without CUDA: files are optional, but well-formed.
  if [ -n "$nocuda" ] && [ -f "$dir/trace.csv.$nocuda" ]; then
    why=$(trace_problem "$dir/trace.csv.$nocuda")
    [ -z "$why" ] || reasons+=("(child without CUDA) $why")
  fi
  # Nothing else: a file of another name means another naming.
  for f in "$dir"/*; do
    [ -e "$f" ] || continue
    b=$(basename "$f")
    case $b in
      stats.txt | trace.csv) continue ;;
    esac
    ok=0
    for pid in "${kids[@]}" $nocuda; do
      [ "$b" = "stats.txt.$pid" ] || [ "$b" = "trace.csv.$pid" ] && ok=1
    done
    [ "$ok" = 1 ] || reasons+=("unexpected file $b (want <path>.<pid> of a child)")
  done
  for f in "$dir"/*; do
    [ -f "$f" ] || continue
    logonly "----- $name: $(basename "$f") (first 40 lines)"
    head -n 40 "$f" >>"$LOG"
  done
  if [ ${#reasons[@]} -eq 0 ]; then
    pass "$name" "parent stats.txt and trace.csv, and <path>.<pid> for the ${#kids[@]} CUDA children"
  else
    fail "$name" "$(
      IFS=';'
      echo "${reasons[*]}"
    )"
  fi
done

# ---- work on streams: the shim sees it, whatever the front door ---------------
# race --streams 256 (256 idle non-blocking streams besides the ones in use),
# in the shared-runtime, static-runtime and driver-API builds: the shim tracks
# the streams' work (SOMA_TRACK_WORK, on by default), so each batch asks only
# the few streams with work (runtime launches reach the shim's cuLaunchKernel
# through cuGetProcAddress); past the limit, barriers' waits are issued at the
# streams' next work. Untracked, every batch asks all of them.
stats_row() { awk -v row="$2" 'index($0, "  " row) == 1 { print $NF; exit }' "$1"; }
for variant in race race.static race.driver race@past_limit race@untracked; do
  name=work_tracked@$variant
  wanted "$name" || continue
  prog=${variant%@*}
  case $variant in
    *@past_limit) extra=(SOMA_PENDING_FREE_LIMIT=0) ;;
    *@untracked) extra=(SOMA_TRACK_WORK=0) ;;
    *) extra=() ;;
  esac
  if ! built "$prog"; then
    fail "$name" "$prog did not build"
    continue
  fi
  safe=${name//[@#.]/_}
  env GPUTEST_QUICK=1 SOMA_STATS="$RUNS/$safe.stats" "${extra[@]}" LD_PRELOAD="$SHIM" timeout "$T" \
    "$BUILD/$prog" --streams 256 >"$RUNS/$safe.out" 2>"$RUNS/$safe.err"
  rc=$?
  logfile "$name statistics" "$RUNS/$safe.stats"
  most=$(stats_row "$RUNS/$safe.stats" "non-blocking streams, most")
  asked=$(stats_row "$RUNS/$safe.stats" "streams asked per batch")
  waits=$(stats_row "$RUNS/$safe.stats" "barrier waits before work")
  reasons=()
  [ "$rc" = 0 ] || reasons+=("exit $rc: $(tail -n 2 "$RUNS/$safe.err" | tr '\n' ' ')")
  [ "${most:-0}" -ge 256 ] || reasons+=("${most:-no} non-blocking streams at a batch, want 256 or more")
  case $variant in
    *@untracked) awk -v a="${asked:-0}" -v m="${most:-0}" 'BEGIN { exit !(a >= m - 8) }' ||
      reasons+=("$asked streams asked per batch of $most: untracked, every live one is asked") ;;
    *) awk -v a="${asked:-999}" 'BEGIN { exit !(a > 0 && a < 16) }' ||
      reasons+=("${asked:-no} streams asked per batch of $most, want the few in use (1 to 15)") ;;
  esac
  case $variant in
    *@past_limit) [ "${waits:-0}" -gt 0 ] || reasons+=("no barrier wait issued before a stream's work") ;;
  esac
  if [ ${#reasons[@]} -eq 0 ]; then
    pass "$name" "$asked streams asked per batch of $most live${waits:+, $waits barrier waits before work}"
  else
    fail "$name" "$(IFS=';'; echo "${reasons[*]}")"
  fi
done

# ---- PyTorch under the preload ---------------------------------------------
PY=${PYTHON:-python3}
if wanted torch_train && "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  # Caching off: every tensor is a cudaMalloc/cudaFree, all through the shim.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 SOMA_STATS="$RUNS/torch.stats" SOMA_TRACE="$RUNS/torch-trace.csv" \
    LD_PRELOAD="$SHIM" timeout "$T" "$PY" c_tests/gpu/torch_steps.py >"$RUNS/torch.out" 2>"$RUNS/torch.err"
  rc=$?
  # The timeline of this run, as a picture (scripts/plot_trace.py), next to the log.
  "$PY" scripts/plot_trace.py "$RUNS/torch-trace.csv" "$LOGDIR/torch-trace.png" \
    --title "somashim: PyTorch, 8 training steps, caching allocator off" >>"$LOG" 2>&1
  cp "$RUNS/torch.stats" "$LOGDIR/torch-stats.txt" 2>/dev/null
  pooled=$(awk '/pool allocations/ {s += $3} END {print s + 0}' "$RUNS/torch.stats" 2>/dev/null)
  logfile "torch_train stdout" "$RUNS/torch.out"
  logfile "torch_train stderr" "$RUNS/torch.err"
  logfile "torch_train SOMA_STATS" "$RUNS/torch.stats"
  if [ "$rc" = 0 ] && grep -q 'steps ok' "$RUNS/torch.out" && [ "${pooled:-0}" -gt 0 ]; then
    pass torch_train "8 steps, losses decrease, $pooled pool allocations"
  else
    fail torch_train "exit $rc, pool allocations ${pooled:-?}: $(tail -n 3 "$RUNS/torch.err" | tr '\n' ' ')"
  fi
elif wanted torch_train; then
  skip torch_train "no PyTorch with CUDA"
fi
# CUDA tensors (one, and a view at an offset into a bigger one) shared with a
# spawned child through torch.multiprocessing: the same output natively and
# under the shim, with the caching allocator on (shared) and off (PyTorch
# refuses to share; the child must not hang either way: the script times out).
if wanted torch_ipc && "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  for caching in on off; do
    name=torch_ipc@caching_$caching
    nocache=$([ $caching = off ] && echo 1 || echo 0)
    PYTORCH_NO_CUDA_MEMORY_CACHING=$nocache timeout "$T" "$PY" c_tests/gpu/torch_ipc.py >"$RUNS/$name.native" 2>"$RUNS/$name.native.err"
    rn=$?
    PYTORCH_NO_CUDA_MEMORY_CACHING=$nocache SOMA_STATS="$RUNS/$name.stats" LD_PRELOAD="$SHIM" \
      timeout "$T" "$PY" c_tests/gpu/torch_ipc.py >"$RUNS/$name.shim" 2>"$RUNS/$name.shim.err"
    rs=$?
    pooled=$(awk '/pool allocations/ {s += $3} END {print s + 0}' "$RUNS/$name.stats" 2>/dev/null)
    logfile "$name native stdout" "$RUNS/$name.native"
    logfile "$name shim stdout" "$RUNS/$name.shim"
    logfile "$name shim stderr" "$RUNS/$name.shim.err"
    # PyTorch's own error names an address, which differs between runs.
    same=$(diff <(sed -E 's/0x[0-9a-f]+/ADDR/g' "$RUNS/$name.native") <(sed -E 's/0x[0-9a-f]+/ADDR/g' "$RUNS/$name.shim") >/dev/null && echo yes)
    if [ "$rn" = "$rs" ] && [ "$same" = yes ] && [ "${pooled:-0}" -gt 0 ] && [ "$rn" != 124 ]; then
      pass "$name" "exit $rs, $(head -n 1 "$RUNS/$name.shim"), $pooled pool allocations"
    else
      fail "$name" "native exit $rn, shim exit $rs, same output: ${same:-no}, pool allocations ${pooled:-?}: $(head -n 2 "$RUNS/$name.shim" | tr '\n' ' ')"
    fi
  done
elif wanted torch_ipc; then
  skip torch_ipc "no PyTorch with CUDA"
fi
# Memory by library: SOMA_STATS' table names PyTorch's, NCCL's and the
# program's own allocations (c_tests/gpu/torch_libraries.py); PyTorch's row
# holds what torch.cuda.memory_reserved() said, within one 20 MiB segment.
if wanted torch_libraries && "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  # NCCL_CUMEM_ENABLE=0: NCCL's buffers from cudaMalloc (by default it maps
  # them with cuMemCreate, which the shim neither pools nor counts).
  rm -f "$RUNS/torch_libraries.json"
  NCCL_CUMEM_ENABLE=0 SOMA_STATS="$RUNS/torch_libraries.stats" SOMA_SNAPSHOT="$RUNS/torch_libraries.json" \
    LD_PRELOAD="$SHIM" timeout "$T" "$PY" c_tests/gpu/torch_libraries.py \
    >"$RUNS/torch_libraries.out" 2>"$RUNS/torch_libraries.err"
  rc=$?
  cp "$RUNS/torch_libraries.stats" "$LOGDIR/torch-libraries-stats.txt" 2>/dev/null
  logfile "torch_libraries stdout" "$RUNS/torch_libraries.out"
  logfile "torch_libraries stderr" "$RUNS/torch_libraries.err"
  logfile "torch_libraries SOMA_STATS" "$RUNS/torch_libraries.stats"
  reserved=$(sed -n 's/^reserved //p' "$RUNS/torch_libraries.out")
  verdict=$("$PY" scripts/library_rows.py "$RUNS/torch_libraries.stats" "${reserved:-0}" 2>&1)
  if [ "$rc" = 0 ] && [ -n "$reserved" ] && [ "${verdict%%:*}" = ok ]; then
    pass torch_libraries "$verdict"
  else
    fail torch_libraries "exit $rc, reserved ${reserved:-?}: $verdict"
  fi
  # The snapshot: summarized, made PyTorch's viewer file (checked as its viewer
  # reads it, then read by torch.cuda._memory_viz itself), and drawn.
  snap=$RUNS/torch_libraries.json viewer=$LOGDIR/torch-oom.pickle
  problems=()
  grep -q '^a 1 TiB tensor: out of memory$' "$RUNS/torch_libraries.out" || problems+=("PyTorch was not told it is out of memory")
  "$PY" scripts/snapshot_viz.py "$snap" --pickle "$viewer" >"$LOGDIR/torch-oom.txt" 2>&1 ||
    problems+=("snapshot_viz.py: $(tail -n 2 "$LOGDIR/torch-oom.txt" | tr '\n' ' ')")
  # The picture, next to the log (matplotlib: not a check).
  "$PY" scripts/snapshot_viz.py "$snap" --png "$LOGDIR/torch-oom.png" >/dev/null 2>>"$LOG"
  check=$("$PY" scripts/check_snapshot.py "$snap" "$viewer" --largest libc10_cuda.so 2>&1) || problems+=("$check")
  for viz in stats trace; do
    "$PY" -m torch.cuda._memory_viz "$viz" "$viewer" >"$RUNS/torch-oom.$viz" 2>&1 ||
      problems+=("torch.cuda._memory_viz $viz: $(tail -n 2 "$RUNS/torch-oom.$viz" | tr '\n' ' ')")
  done
  "$PY" -m torch.cuda._memory_viz trace_plot "$viewer" -o "$LOGDIR/torch-oom.html" >>"$LOG" 2>&1 ||
    problems+=("torch.cuda._memory_viz trace_plot failed")
  logfile "torch_libraries snapshot summary" "$LOGDIR/torch-oom.txt"
  logfile "torch_libraries _memory_viz stats" "$RUNS/torch-oom.stats"
  if [ ${#problems[@]} -eq 0 ]; then
    pass torch_oom_snapshot "$(head -n 1 "$LOGDIR/torch-oom.txt")"
  else
    fail torch_oom_snapshot "$(IFS=';'; echo "${problems[*]}")"
  fi
elif wanted torch_libraries; then
  skip torch_libraries "no PyTorch with CUDA"
fi
if wanted torch_import && "$PY" -c 'import torch' 2>/dev/null; then
  # 'import torch' loads the CUDA libraries and allocates nothing: under the
  # preload it works and the shim says nothing. What it costs is a benchmark's
  # (the import rows of scripts/bench_programs.sh), not a timed test's.
  LD_PRELOAD="$SHIM" timeout "$T" "$PY" -c 'import torch' 2>"$RUNS/import.err"
  rc=$?
  if [ "$rc" = 0 ] && [ ! -s "$RUNS/import.err" ]; then
    pass torch_import "exit status 0, nothing on stderr"
  else
    fail torch_import "exit status $rc; stderr: $(head -c 300 "$RUNS/import.err")"
  fi
elif wanted torch_import; then
  skip torch_import "no PyTorch"
fi

# ---- bad configuration ------------------------------------------------------
if wanted bad_config; then
  if built errors; then
    SOMA_RELEASE_THRESHOLD=banana LD_PRELOAD="$SHIM" timeout "$T" "$BUILD/errors" --no-oom \
      >"$RUNS/badcfg.out" 2>"$RUNS/badcfg.err"
    rc=$?
    logonly "===== bad_config: rc=$rc"
    logfile "bad_config stdout" "$RUNS/badcfg.out"
    logfile "bad_config stderr" "$RUNS/badcfg.err"
    reasons=()
    [ "$rc" = 2 ] || reasons+=("exit $rc, want 2")
    grep -q SOMA_RELEASE_THRESHOLD "$RUNS/badcfg.err" || reasons+=("stderr does not name SOMA_RELEASE_THRESHOLD")
    grep -q banana "$RUNS/badcfg.err" || reasons+=("stderr does not name the value 'banana'")
    grep -qi 'panick' "$RUNS/badcfg.err" && reasons+=("a Rust panic message on stderr")
    grep -q 'cudaMalloc' "$RUNS/badcfg.out" && reasons+=("cudaMalloc calls ran before the exit")
    if [ ${#reasons[@]} -eq 0 ]; then
      pass bad_config "exit 2: $(head -n 1 "$RUNS/badcfg.err" | cut -c1-120)"
    else
      fail bad_config "$(
        IFS=';'
        echo "${reasons[*]}"
      )"
      head -n 10 "$RUNS/badcfg.err" | sed 's/^/  /' | tee -a "$LOG"
    fi
  else
    fail bad_config "errors did not build"
  fi
fi

# ---- compute-sanitizer memcheck, shim preloaded into the target only ----------
SAN=${COMPUTE_SANITIZER:-}
if [ -z "$SAN" ]; then
  SAN=$(command -v compute-sanitizer 2>/dev/null || true)
  [ -z "$SAN" ] && [ -x "$NVCC_DIR/compute-sanitizer" ] && SAN=$NVCC_DIR/compute-sanitizer
  [ -z "$SAN" ] && [ -x "$NVCC_DIR/../compute-sanitizer/compute-sanitizer" ] && SAN=$NVCC_DIR/../compute-sanitizer/compute-sanitizer
fi
# The tests provoke API errors on purpose (double frees, capture errors): only
# memory errors count. GPU_TEST_SANITIZER_FLAGS overrides.
read -r -a SANFLAGS <<<"${GPU_TEST_SANITIZER_FLAGS:---tool memcheck --error-exitcode 99 --report-api-errors no --target-processes all}"
san_skip_all() {
  while IFS='|' read -r name prog args envs gpus san; do
    [ -z "$name" ] || [ "$san" = - ] && continue
    wanted "sanitizer:$name" || wanted "$name" || continue
    skip "sanitizer:$name" "$1"
  done <<<"$TESTS"
}
if [ "${GPU_TEST_SANITIZER:-1}" = 0 ]; then
  san_skip_all "GPU_TEST_SANITIZER=0"
elif [ -z "$SAN" ]; then
  say "# compute-sanitizer not found: sanitizer phase skipped"
  san_skip_all "compute-sanitizer not found"
elif ! built errors; then
  san_skip_all "errors did not build, no sanity run possible"
else
  say "# sanitizer phase: $SAN ${SANFLAGS[*]} (GPUTEST_QUICK=1: fewer iterations; errors without its OOM part)"
  # Sanity: the sanitizer must work on this machine at all (natively).
  GPUTEST_QUICK=1 timeout "$T" "$SAN" "${SANFLAGS[@]}" "$BUILD/errors" --no-oom >"$RUNS/san_sanity.out" 2>&1
  rc=$?
  if [ "$rc" != 0 ] || ! grep -q 'ERROR SUMMARY: 0 errors' "$RUNS/san_sanity.out"; then
    say "# compute-sanitizer does not work here (native sanity run of errors: exit $rc):"
    tail -n 8 "$RUNS/san_sanity.out" | sed 's/^/#   /' | tee -a "$LOG"
    san_skip_all "compute-sanitizer does not work on this machine"
  else
    while IFS='|' read -r name prog args envs gpus san; do
      [ -z "$name" ] || [ "$san" = - ] && continue
      wanted "sanitizer:$name" || wanted "$name" || continue
      if [ "$gpus" -gt "$NGPU" ]; then
        skip "sanitizer:$name" "needs $gpus GPUs"
        continue
      fi
      if ! built "$prog"; then
        fail "sanitizer:$name" "the program $prog did not build"
        continue
      fi
      [ "$san" != = ] && args=$san
      safe=${name//[@#]/_}
      e=()
      [ -n "$envs" ] && read -r -a e <<<"$envs"
      t0=$(date +%s.%N)
      # The shim goes into LD_PRELOAD inside the sanitizer's tree, in front of
      # whatever the sanitizer itself preloads, so it reaches the program only.
      # shellcheck disable=SC2086,SC2016
      [[ $envs == *SOMA_STATS* ]] || e+=("SOMA_STATS=$RUNS/$safe.san.stats")
      env GPUTEST_QUICK=1 "${e[@]}" timeout "$T" "$SAN" "${SANFLAGS[@]}" \
        sh -c 'LD_PRELOAD="$0${LD_PRELOAD:+:$LD_PRELOAD}" exec "$@"' "$SHIM" "$BUILD/$prog" $args \
        >"$RUNS/$safe.san.out" 2>"$RUNS/$safe.san.err"
      rc=$?
      secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f s", b-a}')
      sp=$(pooled_of "$RUNS/$safe.san.out")
      # One summary per process the sanitizer followed: all must say 0 errors.
      summaries=$(grep -h 'ERROR SUMMARY' "$RUNS/$safe.san.out" "$RUNS/$safe.san.err")
      summary=$(grep -v 'ERROR SUMMARY: 0 errors' <<<"$summaries" | head -n 1)
      [ -z "$summaries" ] && summary="no ERROR SUMMARY line"
      [ -z "$summary" ] && summary=$(tail -n 1 <<<"$summaries")
      logonly "===== sanitizer:$name rc=$rc pooled=${sp:-?} [$summary] ($secs)"
      logfile "sanitizer:$name stdout" "$RUNS/$safe.san.out"
      logfile "sanitizer:$name stderr" "$RUNS/$safe.san.err"
      reasons=()
      [ "$rc" = 0 ] || reasons+=("exit $rc")
      case "$summary" in *"ERROR SUMMARY: 0 errors"*) ;; *) reasons+=("$summary") ;; esac
      if { [ -z "$sp" ] || [ "$sp" = 0 ]; } && [ "$(large_blocks_of "$RUNS/$safe.san.stats")" = 0 ]; then
        reasons+=("pooled=${sp:-?}, no large blocks: the shim did not reach the program")
      fi
      if [ ${#reasons[@]} -eq 0 ]; then
        pass "sanitizer:$name" "$secs, 0 errors, pooled $sp"
      else
        fail "sanitizer:$name" "$(
          IFS=';'
          echo "${reasons[*]}"
        )"
        grep -h -A 12 -m 3 '^========= [A-Z]' "$RUNS/$safe.san.out" "$RUNS/$safe.san.err" | head -n 40 | sed 's/^/  /' | tee -a "$LOG"
        tail -n 10 "$RUNS/$safe.san.err" | sed 's/^/  /' | tee -a "$LOG"
      fi
    done <<<"$TESTS"
  fi
fi

# ---- the CUDA 12 runtime (shared and static), if build/cu12 is here --------------
if wanted cuda12; then
  # Its own lines go to the log indented: the suite's verdicts below are the ones counted.
  scripts/cuda12_test.sh "$SHIM" build/cu12 >"$RUNS/cuda12.out" 2>&1
  sed 's/^/  /' "$RUNS/cuda12.out" >>"$LOG"
  while read -r verdict name rest; do
    detail=${rest#(}
    detail=${detail%)}
    case $verdict in
      PASS) pass "$name" "$detail" ;;
      FAIL) fail "${name%:}" "$rest" ;;
      SKIP) skip "$name" "$detail" ;;
    esac
  done < <(grep -E '^(PASS|FAIL|SKIP) ' "$RUNS/cuda12.out")
fi

if [ ${#FAILED_NAMES[@]} -gt 0 ]; then say "# failed: ${FAILED_NAMES[*]}"; fi
say "# full log: $LOG"
say "$PASS passed, $FAIL failed, $SKIP skipped"
[ "$FAIL" = 0 ]
