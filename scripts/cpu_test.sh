#!/usr/bin/env bash
# The CPU-only test suite (no GPU): `make test` runs it as
#   scripts/cpu_test.sh target/release/libsomashim.so build/cuda/nvidia/cu13/include
#
# It builds, with gcc, against the real CUDA headers given:
#   build/cpu/fake/libcuda.so.1, libcudart.so.13   the CUDA test double (c_tests/fake)
#   build/cpu/bin/*                                 the test programs (c_tests/cpu)
# then runs `cargo test`, and each test program natively and/or under
# LD_PRELOAD=<shim>, with LD_LIBRARY_PATH=build/cpu/fake. A test program
# checks itself (CHECK, exit status); where it runs both ways, the lines it
# prints that do not start with "# " (return codes, SHOW_RC) must also be the
# same in both runs. One line per case (PASS/FAIL name, then the details of a
# failure), and last `N passed, N failed`, the totals (cargo's tests
# included); the exit status is non-zero if anything failed.
#
# Knobs: CPUTEST_SKIP_CARGO=1 skips `cargo test`; CPUTEST_ONLY=regex runs the
# cases whose name matches; CPUTEST_TIMEOUT=seconds per run (default 120);
# CC (default gcc). Every run's output stays in build/cpu/runs until the next.
set -u -o pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 path/to/libsomashim.so path/to/cuda/include" >&2
  exit 2
fi
SHIM=$(realpath -m "$1") # relative to where the script was started
INC=$(realpath -m "$2")
# Physical (-P): the shim refuses output paths with a symbolic link in them.
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$ROOT" || exit 2
CC=${CC:-gcc}
TMO=${CPUTEST_TIMEOUT:-120}
ONLY=${CPUTEST_ONLY:-}
B=$ROOT/build/cpu
FAKE=$B/fake
BIN=$B/bin
RUNS=$B/runs
mkdir -p "$FAKE" "$BIN" "$RUNS"
rm -rf "$RUNS"/* "$BIN"/* "$FAKE"/* # nothing stale may pass for a fresh build
# The shim processes of this suite talk over sockets of their own: other suites
# running beside it (another clone's, a user's programs) are neither asked for
# memory nor listed (SOMA_SOCKET_DIR; short, for the socket names' limit).
SOCKETS=$(mktemp -d /tmp/somashim-suite-XXXXXX) || exit 2
trap 'rm -rf "$SOCKETS"' EXIT
export SOMA_SOCKET_DIR=$SOCKETS/all
# An idle device gives back what it caches from the shim's thread (SOMA_IDLE_MS), which a
# pause of a loaded machine would start at any moment of a test: off, but where a case
# sets it (the neighbours' idle case).
export SOMA_IDLE_MS=0

PASSED=0
FAILED=0
pass() {
  echo "PASS $1"
  PASSED=$((PASSED + 1))
}
# fail NAME [DETAIL_FILE...]: the details, indented, at most 25 lines each
fail() {
  echo "FAIL $1"
  shift
  for f in "$@"; do
    [ -s "$f" ] && head -n 25 "$f" | sed 's/^/    /'
  done
  FAILED=$((FAILED + 1))
}
wanted() { [ -z "$ONLY" ] || [[ $1 =~ $ONLY ]]; }

# ------------------------------------------------------------------- build
# shellcheck source=scripts/fake_cuda.sh
. scripts/fake_cuda.sh
CFLAGS=("${FAKE_CFLAGS[@]}")
build_log=$B/build.log
: >"$build_log"
built=1
build() { # output, then the compiler's arguments
  local out=$1
  shift
  if ! "$CC" "${CFLAGS[@]}" -o "$out" "$@" >>"$build_log" 2>&1; then
    built=0
    echo "build of $out failed" >>"$build_log"
  fi
}
if [ ! -f "$INC/cuda.h" ] || [ ! -f "$INC/cuda_runtime_api.h" ]; then
  echo "no CUDA headers in $INC (make headers)" >"$build_log"
  fail "build: CUDA headers" "$build_log"
  echo "$PASSED passed, $FAILED failed"
  exit 1
fi
if ! build_fake_cuda "$FAKE" >>"$build_log" 2>&1; then
  built=0
  echo "build of the test double in $FAKE failed" >>"$build_log"
fi
CUDA_TESTS=(routing ptrmap ordering legacy_stream stream_destroy_pending config threads oom pending_limit nopools reset peer capture callers
  fork pitch pinned ipc ipc_server ipc_leases neighbours pointer_queries libraries held own_allocators)
for t in "${CUDA_TESTS[@]}"; do
  build "$BIN/$t" "c_tests/cpu/$t.c" -L"$FAKE" -lcudart -lcuda -lpthread -ldl
done
build "$BIN/nocuda" c_tests/cpu/nocuda.c -ldl
build "$BIN/static_runtime" c_tests/cpu/static_runtime.c -ldl

for l in a b; do
  build "$BIN/liballoc_$l.so" -fPIC -shared c_tests/cpu/allocating_library.c -L"$FAKE" -lcudart
done
# As a Python extension module installs (libraries.c's PACKAGE_EXTENSION).
PACKAGE_EXTENSION=somepkg/sub/alloc.cpython-312-x86_64-linux-gnu.so
mkdir -p "$BIN/site-packages/$(dirname "$PACKAGE_EXTENSION")"
build "$BIN/site-packages/$PACKAGE_EXTENSION" -fPIC -shared c_tests/cpu/allocating_library.c -L"$FAKE" -lcudart
build "$BIN/libnext_a.so" -fPIC -shared c_tests/cpu/dlsym_next_a.c -ldl
build "$BIN/libnext_b.so" -fPIC -shared c_tests/cpu/dlsym_next_b.c
build "$BIN/dlsym_next" c_tests/cpu/dlsym_next.c -L"$BIN" -Wl,--no-as-needed -lnext_a -lnext_b \
  -Wl,-rpath,"$BIN" -ldl
# Runs $FSIZE_LIMITED with files limited to $FSIZE_LIMIT_KIB KiB, as on a
# full disk: a write past it fails with EFBIG (SIGXFSZ ignored) instead of
# killing the process. Its stdout and stderr pass through pipes (to cat,
# outside the limit): the harness's files for them are limited files too.
cat >"$BIN/fsize_limited" <<'SCRIPT'
#!/usr/bin/env bash
set -o pipefail
{ (ulimit -f "$FSIZE_LIMIT_KIB" && trap '' XFSZ && exec "$FSIZE_LIMITED") 2>&1 1>&3 3>&- | cat >&2; } 3>&1 | cat
SCRIPT
chmod +x "$BIN/fsize_limited"
if [ "$built" = 1 ]; then pass "build (test double and test programs)"; else fail "build" "$build_log"; fi

# -------------------------------------------------------------- cargo test
if [ "${CPUTEST_SKIP_CARGO:-0}" != 1 ] && wanted "cargo test"; then
  cargo_log=$B/cargo_test.log
  cargo test >"$cargo_log" 2>&1
  crc=$?
  read -r cp cf < <(grep -oE 'test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed' "$cargo_log" |
    awk '{p += $4; f += $6} END {print p + 0, f + 0}')
  PASSED=$((PASSED + cp))
  FAILED=$((FAILED + cf))
  if [ "$crc" -eq 0 ] && [ "$cf" -eq 0 ]; then
    echo "PASS cargo test ($cp passed)"
  else
    if [ "$cf" -eq 0 ]; then FAILED=$((FAILED + 1)); fi # it did not build or run
    echo "FAIL cargo test ($cp passed, $cf failed, exit status $crc)"
    { grep -E '^test .* FAILED$|^---- |panicked|^error' "$cargo_log" || tail -n 20 "$cargo_log"; } |
      head -n 25 | sed 's/^/    /'
  fi
fi

# ------------------------------------------------- the launcher (scripts/somarun)
if wanted "launcher"; then
  launcher_log=$B/launcher_test.log
  bash c_tests/launcher/test_somarun.sh >"$launcher_log" 2>&1
  lrc=$?
  read -r lp lf < <(tail -n 1 "$launcher_log" | awk '/passed, .* failed/ {print $1 + 0, $3 + 0; next} {print 0, 0}')
  PASSED=$((PASSED + lp))
  FAILED=$((FAILED + lf))
  if [ "$lrc" -eq 0 ] && [ "$lf" -eq 0 ] && [ "$lp" -gt 0 ]; then
    echo "PASS launcher ($lp checks)"
  else
    if [ "$lf" -eq 0 ]; then FAILED=$((FAILED + 1)); fi # it did not run
    echo "FAIL launcher ($lp passed, $lf failed, exit status $lrc)"
    grep -E '^FAIL' "$launcher_log" | head -n 25 | sed 's/^/    /'
  fi
fi

if [ ! -f "$SHIM" ]; then
  echo "no shim at $SHIM" >"$RUNS/noshim"
  fail "shim library present" "$RUNS/noshim"
  echo "$PASSED passed, $FAILED failed"
  exit 1
fi
SHIM_NAME=$(basename "$SHIM")

# ------------------------------------------------------------------- runs
# run MODE KEY PROGRAM [VAR=VALUE...]: output in $RUNS/KEY.{out,err,rc}.
# The preload applies to the test program only.
run() {
  local mode=$1 key=$2 prog=$3
  shift 3
  local pre=()
  [ "$mode" = shim ] && pre=("LD_PRELOAD=$SHIM")
  timeout -k 5 "$TMO" env CPUTEST_MODE="$mode" CPUTEST_SHIM_NAME="$SHIM_NAME" LD_LIBRARY_PATH="$FAKE" \
    "${pre[@]}" "$@" "$prog" >"$RUNS/$key.out" 2>"$RUNS/$key.err"
  echo $? >"$RUNS/$key.rc"
}
rc_of() { cat "$RUNS/$1.rc"; }
# explain KEY MODE: why a run failed, for the details of a FAIL
explain() {
  local key=$1 mode=$2 rc
  rc=$(rc_of "$key")
  {
    case $rc in
      124 | 137) echo "[$mode] timed out after ${TMO}s" ;;
      0) ;;
      *) echo "[$mode] exit status $rc" ;;
    esac
    grep -v '^# OK$' "$RUNS/$key.err"
    grep '^# fakecuda' "$RUNS/$key.out"
  } >"$RUNS/$key.why"
  echo "$RUNS/$key.why"
}
n=0
next_key() {
  n=$((n + 1))
  KEY=r$n
}

# checked NAME PROBLEM...: PASS if no problem is given, else FAIL with them.
checked() {
  local name=$1
  shift
  if [ $# -eq 0 ]; then
    pass "$name"
  else
    next_key
    printf '%s\n' "$@" >"$RUNS/$KEY.why"
    fail "$name" "$RUNS/$KEY.why"
  fi
}

# compare NAME TEST [VAR=VALUE...]: native and shim runs pass and agree.
compare() {
  local name=$1 test=$2
  shift 2
  compare_settings "$name" "$test" "$*" "$*"
}

# compare_settings NAME TEST NATIVE_SETTINGS SHIM_SETTINGS: as compare, each
# run with its own settings (VAR=VALUE words): a shim setting that must make
# the program see what another setting gives it natively.
compare_settings() {
  local name=$1 test=$2 native_settings shim_settings
  read -ra native_settings <<<"$3"
  read -ra shim_settings <<<"$4"
  wanted "$name" || return 0
  next_key
  local kn=${KEY}n ks=${KEY}s
  run native "$kn" "$BIN/$test" "${native_settings[@]}"
  run shim "$ks" "$BIN/$test" "${shim_settings[@]}"
  local why=()
  [ "$(rc_of "$kn")" = 0 ] || why+=("$(explain "$kn" native)")
  [ "$(rc_of "$ks")" = 0 ] || why+=("$(explain "$ks" shim)")
  if [ ${#why[@]} -eq 0 ]; then
    if diff <(grep -v '^# ' "$RUNS/$kn.out") <(grep -v '^# ' "$RUNS/$ks.out") >"$RUNS/$KEY.diff"; then
      pass "$name"
      return 0
    fi
    { echo "native (<) and shim (>) results differ:"; cat "$RUNS/$KEY.diff"; } >"$RUNS/$KEY.why"
    why+=("$RUNS/$KEY.why")
  fi
  fail "$name" "${why[@]}"
}

# bad_config VAR VALUE [SHOWN [VAR=VALUE...]]: exit status 2 at the first
# intercepted call, a message naming the variable, the value (as SHOWN, if
# the message must escape it) and the accepted forms, nothing allocated. The
# further variables are set too.
bad_config() {
  local var=$1 value=$2 shown=${3:-$2}
  shift $(($# < 3 ? $# : 3))
  local name="config error $var=$shown${*:+ $*}"
  wanted "$name" || return 0
  next_key
  local trace=$RUNS/$KEY.trace
  : >"$trace"
  run shim "$KEY" "$BIN/config" "$var=$value" "$@" "FAKECUDA_TRACE=$trace"
  local rc err problems=()
  rc=$(rc_of "$KEY")
  err=$(cat "$RUNS/$KEY.err")
  [ "$rc" = 2 ] || problems+=("exit status $rc, want 2")
  grep -qF -- "$var" <<<"$err" || problems+=("stderr does not name $var")
  grep -qF -- "\"$shown\"" <<<"$err" || problems+=("stderr does not show the value \"$shown\"")
  # the accepted forms: more than the variable and the value
  local rest=${err//"$var"/}
  rest=${rest//"$shown"/}
  [ "$(tr -cd '[:alnum:]' <<<"$rest" | wc -c)" -ge 8 ] || problems+=("stderr does not say what is accepted")
  [ "$(grep -c . <<<"$err")" -le 3 ] || problems+=("stderr has more than the message")
  ! grep -q 'panicked' <<<"$err" || problems+=("a Rust panic")
  grep -q '^# start' "$RUNS/$KEY.out" || problems+=("the program did not start")
  ! grep -q '^# after' "$RUNS/$KEY.out" || problems+=("the first cudaMalloc returned")
  ! grep -q '^alloc' "$trace" || problems+=("an allocation happened: $(grep -m1 '^alloc' "$trace")")
  if [ ${#problems[@]} -eq 0 ]; then
    pass "$name"
  else
    { printf '%s\n' "${problems[@]}"; echo "stderr:"; head -n 5 "$RUNS/$KEY.err"; } >"$RUNS/$KEY.why"
    fail "$name" "$RUNS/$KEY.why"
  fi
}

# last_err_says NAME TEXT: the last run's stderr contains TEXT.
last_err_says() {
  wanted "$1" || return 0
  if grep -qF -- "$2" "$RUNS/$KEY.err"; then pass "$1"; else fail "$1" "$RUNS/$KEY.err"; fi
}

# no_cuda NAME COMMAND...: under the preload, exit 0, the same output as
# without it (but for "# " lines), and nothing on stderr.
no_cuda() {
  local name=$1
  shift
  wanted "$name" || return 0
  next_key
  timeout -k 5 "$TMO" env CPUTEST_MODE=native "$@" >"$RUNS/${KEY}n.out" 2>"$RUNS/${KEY}n.err"
  echo $? >"$RUNS/${KEY}n.rc"
  timeout -k 5 "$TMO" env CPUTEST_MODE=shim CPUTEST_SHIM_NAME="$SHIM_NAME" LD_PRELOAD="$SHIM" "$@" \
    >"$RUNS/${KEY}s.out" 2>"$RUNS/${KEY}s.err"
  echo $? >"$RUNS/${KEY}s.rc"
  local problems=()
  [ "$(rc_of "${KEY}s")" = 0 ] || problems+=("exit status $(rc_of "${KEY}s") under the preload")
  [ "$(rc_of "${KEY}n")" = 0 ] || problems+=("exit status $(rc_of "${KEY}n") natively")
  [ ! -s "$RUNS/${KEY}s.err" ] || problems+=("stderr under the preload: $(head -c 300 "$RUNS/${KEY}s.err")")
  cmp -s <(grep -v '^# ' "$RUNS/${KEY}n.out") <(grep -v '^# ' "$RUNS/${KEY}s.out") ||
    problems+=("stdout differs from the native run")
  if [ ${#problems[@]} -eq 0 ]; then
    pass "$name"
  else
    printf '%s\n' "${problems[@]}" >"$RUNS/$KEY.why"
    fail "$name" "$RUNS/$KEY.why" "$RUNS/${KEY}n.err"
  fi
}

# ------------------------------------------------------------------ cases
MEM64=FAKECUDA_MEM_LIMIT=67108864

# 1. routing
compare "routing" routing
compare "routing SOMA_DISABLE=1" routing SOMA_DISABLE=1
compare "routing SOMA_MIN_BYTES=4096 SOMA_MAX_BYTES=1MiB" routing SOMA_MIN_BYTES=4096 SOMA_MAX_BYTES=1MiB
compare "routing, runtime resolving the driver by cuGetProcAddress" routing FAKECUDA_RT_PROCADDR=1
# 2. the pointer map and the error codes
compare "ptrmap" ptrmap
compare "ptrmap SOMA_MAX_BYTES=4MiB (8 MiB blocks pass through)" ptrmap SOMA_MAX_BYTES=4MiB
compare "ptrmap SOMA_POOL=default" ptrmap SOMA_POOL=default
compare "ptrmap, runtime resolving the driver by cuGetProcAddress" ptrmap FAKECUDA_RT_PROCADDR=1
# 3. ordering
compare "ordering" ordering
compare "ordering SOMA_FREE_SYNC=1" ordering SOMA_FREE_SYNC=1
compare "ordering SOMA_POOL=default" ordering SOMA_POOL=default
compare "ordering SOMA_FREE_ORDER=barrier" ordering SOMA_FREE_ORDER=barrier
compare "free after destroying a stream with pending work" stream_destroy_pending
compare "free after destroying a stream with pending work, SOMA_FREE_ORDER=barrier" stream_destroy_pending \
  SOMA_FREE_ORDER=barrier
compare "only blocking streams: the legacy stream orders frees" legacy_stream
compare "only blocking streams, SOMA_POOL=default" legacy_stream SOMA_POOL=default
compare "only blocking streams, SOMA_LEGACY_CACHE=on" legacy_stream SOMA_LEGACY_CACHE=on
compare "threads SOMA_LEGACY_CACHE=on" threads SOMA_LEGACY_CACHE=on
compare "SOMA_PENDING_FREE_LIMIT=4MiB, lazy GPU" pending_limit FAKECUDA_LAZY_GPU=1 SOMA_FREE_ORDER=join \
  SOMA_PENDING_FREE_LIMIT=4MiB
compare "SOMA_PENDING_FREE_LIMIT=0, lazy GPU" pending_limit FAKECUDA_LAZY_GPU=1 SOMA_FREE_ORDER=join \
  SOMA_PENDING_FREE_LIMIT=0
# 4. configuration
compare "config (defaults)" config EXPECT_RELEASE_THRESHOLD=max
compare "config SOMA_POOL=default" config SOMA_POOL=default EXPECT_RELEASE_THRESHOLD=max
compare "config SOMA_SMALL_BLOCKS=0: one pool" config SOMA_SMALL_BLOCKS=0 EXPECT_RELEASE_THRESHOLD=max
compare "config SOMA_POOL=own SOMA_RELEASE_THRESHOLD=512MiB" config SOMA_POOL=own \
  SOMA_RELEASE_THRESHOLD=512MiB EXPECT_RELEASE_THRESHOLD=536870912
compare "config SOMA_RELEASE_THRESHOLD=4G" config SOMA_RELEASE_THRESHOLD=4G EXPECT_RELEASE_THRESHOLD=4294967296
compare "config SOMA_RELEASE_THRESHOLD=total" config SOMA_RELEASE_THRESHOLD=total EXPECT_RELEASE_THRESHOLD=total
compare "config SOMA_RELEASE_THRESHOLD=0 on the default pool" config SOMA_POOL=default \
  SOMA_RELEASE_THRESHOLD=0 EXPECT_RELEASE_THRESHOLD=0
compare "config SOMA_REUSE_*" config SOMA_REUSE_FOLLOW_EVENT_DEPS=0 SOMA_REUSE_OPPORTUNISTIC=0 \
  SOMA_REUSE_INTERNAL_DEPS=1
compare "config SOMA_LOG=debug SOMA_FREE_SYNC=1 SOMA_PENDING_FREE_LIMIT=1MiB" config SOMA_LOG=debug \
  SOMA_FREE_SYNC=1 SOMA_PENDING_FREE_LIMIT=1MiB
bad_config SOMA_RELEASE_THRESHOLD banana
bad_config SOMA_RELEASE_THRESHOLD 12XB
bad_config SOMA_DISABLE maybe
bad_config SOMA_POOL shared
bad_config SOMA_MIN_BYTES -5
bad_config SOMA_MAX_BYTES 1.5G
bad_config SOMA_FREE_SYNC 2
bad_config SOMA_REUSE_FOLLOW_EVENT_DEPS perhaps
bad_config SOMA_REUSE_OPPORTUNISTIC 10
bad_config SOMA_REUSE_INTERNAL_DEPS x
bad_config SOMA_PENDING_FREE_LIMIT lots
bad_config SOMA_MEMORY_LIMIT 150%
bad_config SOMA_MEMORY_LIMIT half
bad_config SOMA_DISABLE $'1\xff' '1\xff'        # not UTF-8: not taken as unset
bad_config SOMA_DISABLE $'\u00a01' '\u{a0}1'    # only ASCII whitespace is trimmed
bad_config SOMA_DISABEL 1                        # a misspelt variable
last_err_says "config error SOMA_DISABEL=1 names SOMA_DISABLE" 'did you mean SOMA_DISABLE?'
bad_config SOMA_FOO 1
bad_config SOMA_STAT 1 1 SOMA_HOME=/opt          # misspelt (within two edits), beside another program's
last_err_says "config error SOMA_STAT=1 names SOMA_STATS" 'did you mean SOMA_STATS?'
bad_config SOMA_pool own                         # case aside, a misspelling
last_err_says "config error SOMA_pool=own names SOMA_POOL" 'did you mean SOMA_POOL?'
# Another program's SOMA_* variables (none within two edits of one of ours):
# the program runs as it does without them, with one warning naming them
# (threads: the first calls race in 8 threads).
if wanted "another program's SOMA_* variables"; then
  compare "another program's SOMA_* variables: the program runs" threads SOMA_HOME=/opt SOMA_CACHE_DIR=/tmp
  err=$RUNS/${KEY}s.err
  problems=()
  [ "$(grep -c . "$err")" = 1 ] || problems+=("not one line on stderr: $(head -c 300 "$err")")
  grep -q '^somashim: ignoring .*SOMA_HOME, SOMA_CACHE_DIR$' "$err" || problems+=("no warning naming them: $(head -c 300 "$err")")
  ! grep -q '/opt' "$err" || problems+=("the warning shows a value, which is another program's")
  checked "another program's SOMA_* variables: one warning naming them" "${problems[@]}"
fi
# SOMA_DISABLE=1 checks nothing else, so nothing stops the program.
if wanted "SOMA_DISABLE=1 checks nothing else"; then
  compare "SOMA_DISABLE=1 checks nothing else: the program runs" routing SOMA_DISABLE=1 SOMA_DISABEL=1 SOMA_HOME=/opt \
    SOMA_POOL=shared SOMA_LOG=verbose
  problems=()
  [ ! -s "$RUNS/${KEY}s.err" ] || problems+=("stderr: $(head -c 300 "$RUNS/${KEY}s.err")")
  checked "SOMA_DISABLE=1 checks nothing else: nothing on stderr" "${problems[@]}"
fi
bad_config SOMA_STATS ture                       # a path needs a /, so this is a mistyped flag
if wanted "config error SOMA_STATS=ture"; then
  if [ -e ture ]; then fail "SOMA_STATS=ture wrote a file named ture"; else pass "SOMA_STATS=ture writes no file"; fi
fi
for flag in 0 1 off; do                          # a trace path needs a / too
  bad_config SOMA_TRACE "$flag"
  if wanted "config error SOMA_TRACE=$flag"; then
    if [ -e "$flag" ]; then fail "SOMA_TRACE=$flag wrote a file named $flag"; else pass "SOMA_TRACE=$flag writes no file"; fi
  fi
done
bad_config SOMA_TRACE "$RUNS/same.out" "$RUNS/same.out" "SOMA_STATS=$RUNS/same.out" # the table would replace the trace
last_err_says "config error SOMA_TRACE and SOMA_STATS in the same file names SOMA_STATS" "SOMA_STATS=\"$RUNS/same.out\""
bad_config SOMA_LOG verbose
bad_config SOMA_LOG =
bad_config SOMA_MIN_BYTES 2MiB 2MiB SOMA_MAX_BYTES=1MiB
bad_config SOMA_MIN_BYTES max                    # no request is that large: nothing would be pooled
# 5. threads
compare "threads (8 x 2000)" threads
compare "threads (8 x 2000), SOMA_FREE_ORDER=barrier" threads SOMA_FREE_ORDER=barrier
# 6. processes without CUDA
no_cuda "no-CUDA program" "$BIN/nocuda"
no_cuda "no-CUDA: /bin/true" /bin/true
no_cuda "no-CUDA: sh -c" sh -c 'echo ok; ls / >/dev/null'
if command -v python3 >/dev/null; then
  no_cuda "no-CUDA: python3" python3 -c 'import ctypes, ctypes.util; print(ctypes.util.find_library("c") is not None)'
fi
compare "dlsym(RTLD_NEXT) from a library" dlsym_next
# 7. out of memory
compare "oom (64 MiB device)" oom "$MEM64"
compare "oom SOMA_REUSE_INTERNAL_DEPS=1" oom "$MEM64" SOMA_REUSE_INTERNAL_DEPS=1
compare "oom, lazy GPU" oom "$MEM64" FAKECUDA_LAZY_GPU=1
compare "oom, lazy GPU, SOMA_POOL=default" oom "$MEM64" FAKECUDA_LAZY_GPU=1 SOMA_POOL=default
compare "oom SOMA_POOL=default SOMA_REUSE_FOLLOW_EVENT_DEPS=0 SOMA_REUSE_OPPORTUNISTIC=0" oom "$MEM64" \
  SOMA_POOL=default SOMA_REUSE_FOLLOW_EVENT_DEPS=0 SOMA_REUSE_OPPORTUNISTIC=0
compare "oom, lazy GPU, a non-blocking stream (frees queued)" oom "$MEM64" FAKECUDA_LAZY_GPU=1 MAKE_NONBLOCKING_STREAM=1
# SOMA_MEMORY_LIMIT: a 256 MiB device limited to 64 MiB is, to the program, a 64 MiB device
MEM256=FAKECUDA_MEM_LIMIT=268435456
compare_settings "SOMA_MEMORY_LIMIT=64MiB on a 256 MiB device, as a 64 MiB device" oom "$MEM64" \
  "$MEM256 SOMA_MEMORY_LIMIT=64MiB"
compare_settings "SOMA_MEMORY_LIMIT=25% on a 256 MiB device, as a 64 MiB device" oom "$MEM64" "$MEM256 SOMA_MEMORY_LIMIT=25%"
compare_settings "SOMA_MEMORY_LIMIT=64MiB, lazy GPU, a non-blocking stream (frees queued)" oom \
  "$MEM64 FAKECUDA_LAZY_GPU=1 MAKE_NONBLOCKING_STREAM=1" \
  "$MEM256 SOMA_MEMORY_LIMIT=64MiB FAKECUDA_LAZY_GPU=1 MAKE_NONBLOCKING_STREAM=1"
# pitched allocations
compare "memory held: varied, growing and burst large blocks within 1.25x of the program's peak" held
compare "memory held, a non-blocking stream alive (frees joined)" held MAKE_NONBLOCKING_STREAM=1
compare "the program's own stream-ordered pools get what it freed" own_allocators FAKECUDA_MEM_LIMIT=1073741824
compare "the same, a non-blocking stream alive (frees joined)" own_allocators FAKECUDA_MEM_LIMIT=1073741824 MAKE_NONBLOCKING_STREAM=1
compare "the same, the runtime resolving the driver by cuGetProcAddress" own_allocators FAKECUDA_MEM_LIMIT=1073741824 FAKECUDA_RT_PROCADDR=1
compare "pitched allocations" pitch
compare "pitched allocations, runtime resolving the driver by cuGetProcAddress" pitch FAKECUDA_RT_PROCADDR=1
compare "pitched allocations SOMA_MAX_BYTES=64KiB (larger ones pass through)" pitch SOMA_MAX_BYTES=64KiB
compare "pitched allocations SOMA_DISABLE=1 (no pitch learned)" pitch SOMA_DISABLE=1
# pointer queries answer as for the real allocation
compare "pointer queries" pointer_queries
compare "pointer queries SOMA_SMALL_BLOCKS=0" pointer_queries SOMA_SMALL_BLOCKS=0
# pinned host memory: passed through by default; with SOMA_HOST_POOL=1 from a host memory pool
compare "pinned host memory SOMA_HOST_POOL=1" pinned SOMA_HOST_POOL=1
compare "pinned host memory, driver door" pinned SOMA_HOST_POOL=1 PINNED_DOOR=driver
compare "pinned host memory SOMA_FREE_ORDER=barrier (host frees stay joined)" pinned SOMA_HOST_POOL=1 SOMA_FREE_ORDER=barrier
compare "pinned host memory, lazy GPU, SOMA_PENDING_FREE_LIMIT=4MiB" pinned SOMA_HOST_POOL=1 FAKECUDA_LAZY_GPU=1 \
  SOMA_PENDING_FREE_LIMIT=4MiB
compare "pinned host memory, lazy GPU, driver door, SOMA_PENDING_FREE_LIMIT=4MiB" pinned SOMA_HOST_POOL=1 FAKECUDA_LAZY_GPU=1 \
  PINNED_DOOR=driver SOMA_PENDING_FREE_LIMIT=4MiB
compare "pinned host memory, runtime resolving the driver by cuGetProcAddress" pinned SOMA_HOST_POOL=1 FAKECUDA_RT_PROCADDR=1
compare "pinned host memory (passed through by default)" pinned
compare "pinned host memory SOMA_DISABLE=1 (passed through)" pinned SOMA_DISABLE=1 SOMA_HOST_POOL=1
compare "pinned host memory, no host pool support (passed through)" pinned FAKECUDA_NO_HOST_POOLS=1 SOMA_HOST_POOL=1
compare "pinned host memory, no pool support (passed through)" pinned FAKECUDA_NO_POOLS=1 SOMA_HOST_POOL=1
compare "pinned host memory, 2 devices (passed through)" pinned FAKECUDA_DEVICES=2 SOMA_HOST_POOL=1
# 8. no pool support
compare "no pool support" nopools FAKECUDA_NO_POOLS=1
compare "no pool support, routing" routing FAKECUDA_NO_POOLS=1
# 9. cudaDeviceReset
compare "device reset" reset
compare "device reset SOMA_POOL=default" reset SOMA_POOL=default
# 10. peer access
compare "peer access (2 devices)" peer FAKECUDA_DEVICES=2
# stream capture
compare "stream capture" capture
# the driver front door: a program with the static runtime
compare "static runtime (driver entry points by cuGetProcAddress)" static_runtime
compare "static runtime, SOMA_DISABLE=1" static_runtime SOMA_DISABLE=1

# Memory by library: the SOMA_STATS rows of the program and of the three objects it
# loads, the package's extension named by its path in the package tree.
compare "memory by library: the program and three loaded objects" libraries LIBS_DIR="$BIN" SOMA_MAX_BYTES=16MiB \
  "SOMA_STATS=$RUNS/libraries.stats"
if wanted "memory by library: the table"; then
  problems=()
  for row in 'libraries +5.0 MiB +6.0 MiB +2 +0' 'liballoc_a.so +6.0 MiB +6.0 MiB +3 +0' \
    'liballoc_b.so +1.0 MiB +1.0 MiB +1 +1 \(32.0 MiB\)' "$PACKAGE_EXTENSION +3.0 MiB +3.0 MiB +1 +0"; do
    grep -Eq "^  $row\$" "$RUNS/libraries.stats" 2>/dev/null || problems+=("no row '$row' in $RUNS/libraries.stats")
  done
  checked "memory by library: the table" "${problems[@]}"
fi

# The out-of-memory snapshot: liballoc_a.so fills a 128 MiB device; the shim's
# snapshot names every live block's library, and scripts/snapshot_viz.py
# summarizes it and writes PyTorch's memory-viewer file (checked as the viewer
# reads it: scripts/check_snapshot.py).
compare "out-of-memory snapshot: the same program natively and under the shim" libraries LIBS_DIR="$BIN" FILL=1 \
  SOMA_MAX_BYTES=16MiB FAKECUDA_MEM_LIMIT=134217728 "SOMA_SNAPSHOT=$RUNS/oom.json"
if wanted "out-of-memory snapshot: what it says"; then
  problems=()
  python3 scripts/snapshot_viz.py "$RUNS/oom.json" --pickle "$RUNS/oom.pickle" >"$RUNS/oom.summary" 2>&1 ||
    problems+=("snapshot_viz.py failed: $(head -c 300 "$RUNS/oom.summary")")
  python3 scripts/check_snapshot.py "$RUNS/oom.json" "$RUNS/oom.pickle" --largest liballoc_a.so >"$RUNS/oom.check" 2>&1 ||
    problems+=("$(cat "$RUNS/oom.check")")
  grep -q 'liballoc_a.so' "$RUNS/oom.summary" || problems+=("the summary does not name liballoc_a.so")
  grep -qF "\"name\": \"$PACKAGE_EXTENSION\"" "$RUNS/oom.json" || problems+=("the snapshot does not name $PACKAGE_EXTENSION")
  checked "out-of-memory snapshot: what it says" "${problems[@]}"
fi
bad_config SOMA_SNAPSHOT snapshot.json # a path needs a /

# SOMA_PASSTHROUGH_CALLERS (by the calling object's name) and the SOMA_STATS table
compare "passthrough callers: this program" callers SOMA_PASSTHROUGH_CALLERS=callers EXPECT_POOLED=0 \
  "SOMA_STATS=$RUNS/callers-listed.stats"
compare "passthrough callers: another library" callers SOMA_PASSTHROUGH_CALLERS=libother,libnccl EXPECT_POOLED=1 \
  "SOMA_STATS=$RUNS/callers-other.stats"
# The count on a row of the table: the first field after the row's name.
stats_row() { awk -v k="$2" 'index($0, k) == 3 {split(substr($0, 3 + length(k)), f, " "); print f[1]; exit}' "$1" 2>/dev/null; }
if wanted "stats table"; then
  # 10 pairs and the nudge's: 11 allocations each way (the natively run one writes no table).
  listed=$(stats_row "$RUNS/callers-listed.stats" Caller)
  pooled=$(stats_row "$RUNS/callers-other.stats" "pool allocations")
  frees=$(stats_row "$RUNS/callers-other.stats" "pool frees")
  if [ "$listed" = 11 ] && [ "$pooled" = 11 ] && [ "$frees" = 11 ]; then
    PASSED=$((PASSED + 1))
    echo "PASS stats table (11 passed through with reason Caller; 11 pool allocations and frees)"
  else
    FAILED=$((FAILED + 1))
    echo "FAIL stats table: Caller row '${listed:-}', pool allocations '${pooled:-}', pool frees '${frees:-}' (want 11 each)"
    sed 's/^/    /' "$RUNS/callers-listed.stats" "$RUNS/callers-other.stats" 2>/dev/null | head -n 30
  fi
fi

# CUDA IPC of pool memory between two shims (ipc.c), under the shim only: the
# double has no legacy IPC to compare with. The runtime reaches the driver by
# its exports and, as real runtimes do, through cuGetProcAddress.
for procaddr in 0 1; do
  name="ipc: pool memory shared between two shims (runtime procaddr=$procaddr)"
  wanted "$name" || continue
  next_key
  run shim "$KEY" "$BIN/ipc" FAKECUDA_RT_PROCADDR=$procaddr
  expected='pool descriptors a child inherits: 0
held while the importer has it open: yes
importer exit status 0
freed once the importer closed it: yes
leaver exit status 0
freed once the importer exited without closing it: yes
large block: leaver exit status 0
large block: freed once the importer exited without closing it: yes
leaver across a reset exit status 0
a block of the new pool intact when the lease ends: yes
open the handle of a freed block: 1
exporter exit status 0
open the handle of an exited exporter: 400'
  if [ "$(rc_of "$KEY")" = 0 ] && [ "$(grep -v '^# ' "$RUNS/$KEY.out")" = "$expected" ] && [ ! -s "$RUNS/$KEY.err" ]; then
    pass "$name"
  else
    { explain "$KEY" shim >/dev/null; cat "$RUNS/$KEY.why"; echo "stdout:"; cat "$RUNS/$KEY.out"; } >"$RUNS/$KEY.whyall"
    fail "$name" "$RUNS/$KEY.whyall"
  fi
done

# The exporter's IPC server against clients that stall, stay silent or flood
# their lease, a poll that fails for good, and importers of an exporter killed
# unreaped, with a forked child alive, or gone leaving its socket file
# (ipc_server.c, one case each; under the shim only).
# shim_case NAME PROGRAM VAR=CASE EXPECTED [VAR=VALUE...]: PROGRAM under the
# shim with the case picked by VAR passes, prints EXPECTED (its "# " lines
# aside) and nothing on stderr.
shim_case() {
  local name=$1 program=$2 picked=$3 expected=$4
  shift 4
  wanted "$name" || return 0
  next_key
  run shim "$KEY" "$BIN/$program" "$picked" "$@"
  if [ "$(rc_of "$KEY")" = 0 ] && [ "$(grep -v '^# ' "$RUNS/$KEY.out")" = "$expected" ] && [ ! -s "$RUNS/$KEY.err" ]; then
    pass "$name"
  else
    { explain "$KEY" shim >/dev/null; cat "$RUNS/$KEY.why"; echo "stdout:"; cat "$RUNS/$KEY.out"; } >"$RUNS/$KEY.whyall"
    fail "$name" "$RUNS/$KEY.whyall"
  fi
}
ipc_server_case() { # name case expected-stdout
  shim_case "ipc server: $1" ipc_server IPC_SERVER_CASE="$2" "$3"
}
ipc_server_case "a client that stalls its request delays no other open" stalled 'an open answered at once while a client stalls: yes
the stalled client cut off: yes'
ipc_server_case "silent connections delay neither the exporter's fork nor its exit" silent "the exporter keeps at most 16 silent connections: yes
the exporter's fork waits on no silent client: yes
the exporter's exit waits on no silent client: yes"
ipc_server_case "a lease that floods data is ended, cheaply" flood "a flooding lease ended by the exporter: yes
the exporter's CPU time under 0.5 s: yes
the block freed once the lease ended: yes"
ipc_server_case "an exporter killed and not reaped: 400 at once" killed 'open the handle of a killed exporter not reaped yet: 400'
ipc_server_case "an exporter killed with a forked child alive: 400 at once" forked 'open the handle of a killed exporter whose forked child lives: 400'
ipc_server_case "a fork waiting for an open stalls neither frees nor the server" fork_import "cudaMalloc and cudaFree answered at once while a fork waits for an open: yes
another process's open answered at once while a fork waits for an open: yes"
ipc_server_case "an open interrupted by a signal still succeeds" signalled 'an open interrupted by a signal: 0'
ipc_server_case "no server starts after the shim's exit handler" exit_export 'no server started after exit: yes'
ipc_server_case "a poll that fails for good ends the leases and the server" poll_fails "the socket removed: yes
the leased block freed: yes
a new export passes through (1): yes"
ipc_server_case "a socket file whose listener is gone: 400, and the file removed" stale_socket 'open against a socket whose listener is gone: 400
the stale socket file removed: yes'

# Many leases over one connection, descriptors limited to 1024 in both
# processes (ipc_leases.c, one case each; under the shim only).
ipc_leases_case() { # name case expected-stdout
  shim_case "ipc leases: $1" ipc_leases IPC_LEASES_CASE="$2" "$3"
}
ipc_leases_case "5,000 handles of one exporter cost neither process a descriptor each" many "all 5000 handles opened under a limit of 1024 descriptors: yes
the importer's descriptors stay bounded: yes
the exporter's descriptors stay bounded: yes
both can still open files: yes
the blocks freed while open are held: yes
all handles closed: yes
every block freed to the pool once closed: yes"
ipc_leases_case "an importer killed with 2,000 leases open: every block freed" killed "the importer opened all 2000 handles: yes
the blocks freed while open are held: yes
every block freed once the importer was killed: yes"
ipc_leases_case "two threads opening and closing handles of one exporter at once lose nothing" threads "every open and close of two threads at once succeeded: yes
both threads got the same address for a handle both opened: yes
the importer's descriptors stay bounded: yes
every block held while open: yes
every block freed once closed: yes"

# Processes sharing the double's device (neighbours.c, one case each): what a
# program freed reaches another process, after the decay, once it idles, or when asked.
neighbours_case() { # name case expected-stdout; each case's processes alone in their directory
  shim_case "neighbours: $1" neighbours NEIGHBOURS_CASE="$2" "$3" SOMARUN="$ROOT/scripts/somarun" \
    SOMA_SOCKET_DIR="$SOCKETS/$2"
}
neighbours_case "freed memory reaches a native process once the decay has passed" decay "a native neighbour: out of memory at once: yes
it succeeds once the delay has passed: yes"
neighbours_case "after SOMA_IDLE_MS with no allocation or free, long before the decay" idle "a native neighbour gets it once the holder has idled: yes"
neighbours_case "SOMA_DECAY_MS=0 keeps it" never "with SOMA_DECAY_MS=0 the pool keeps it: yes"
neighbours_case "a process under the shim is given it at once" reclaim "a neighbour under the shim gets it at once: yes"
neighbours_case "a dead and a stopped neighbour cost at most the wait" dead_and_stalled "beside a dead and a stopped neighbour, the taker succeeds within the bound: yes
the dead neighbour's socket removed: yes"
neighbours_case "a stopped holder costs the wait, then out of memory" stalled "a stopped holder: out of memory after the bound, not later: yes"
neighbours_case "SOMA_NEIGHBOURS=0: a process serving CUDA IPC does not give" apart "the holder serves CUDA IPC (it has a socket): yes
with SOMA_NEIGHBOURS=0 it keeps its cache: yes"
neighbours_case "somarun --ps and --trim" ps "somarun --ps lists the holder, with what it caches: yes
somarun --ps names the library that allocated it: yes
somarun --snapshot makes it write a snapshot: yes
somarun --trim gives it back: yes
then a native neighbour gets it at once: yes"

# A forked child reports to files of its own (<path>.<pid>), with its own
# header; no event is written by both processes. fork.c: the parent's blocks
# are 1 MiB (4 pairs before the fork, 4 after), the child's 3 MiB (3 pairs).
if wanted "fork"; then
  compare "fork: parent and child run" fork "SOMA_TRACE=$RUNS/fork.csv" "SOMA_STATS=$RUNS/fork.stats"
  parent=$(sed -n 's/^# parent //p' "$RUNS/${KEY}s.out")
  child=$(sed -n 's/^# child //p' "$RUNS/${KEY}s.out")
  rows() { grep -c -- ",alloc,$2," "$1" 2>/dev/null; }
  problems=()
  [ -n "$parent" ] && [ -n "$child" ] || problems+=("no pids in the output")
  for f in "$RUNS/fork.csv" "$RUNS/fork.csv.$child"; do
    [ "$(head -n 1 "$f" 2>/dev/null)" = "time_us,device,op,size,ptr,in_use,reserved" ] || problems+=("$f: no header")
  done
  [ "$(rows "$RUNS/fork.csv" $((1 << 20)))" = 8 ] || problems+=("parent's trace: $(rows "$RUNS/fork.csv" $((1 << 20))) allocations of 1 MiB, want 8")
  [ "$(rows "$RUNS/fork.csv" $((3 << 20)))" = 0 ] || problems+=("parent's trace has the child's allocations")
  [ "$(rows "$RUNS/fork.csv.$child" $((3 << 20)))" = 3 ] || problems+=("child's trace: $(rows "$RUNS/fork.csv.$child" $((3 << 20))) allocations of 3 MiB, want 3")
  [ "$(rows "$RUNS/fork.csv.$child" $((1 << 20)))" = 0 ] || problems+=("child's trace has the parent's allocations")
  [ "$(head -n 1 "$RUNS/fork.stats" 2>/dev/null)" = "somashim statistics (pid $parent)" ] || problems+=("parent's stats file: $(head -n 1 "$RUNS/fork.stats" 2>&1)")
  [ "$(head -n 1 "$RUNS/fork.stats.$child" 2>/dev/null)" = "somashim statistics (pid $child)" ] || problems+=("child's stats file: $(head -n 1 "$RUNS/fork.stats.$child" 2>&1)")
  checked "fork: each process writes its own trace and stats file" "${problems[@]}"
  next_key
  run shim "$KEY" "$BIN/fork" SOMA_STATS=1
  parent=$(sed -n 's/^# parent //p' "$RUNS/$KEY.out")
  child=$(sed -n 's/^# child //p' "$RUNS/$KEY.out")
  problems=()
  [ "$(rc_of "$KEY")" = 0 ] || problems+=("exit status $(rc_of "$KEY")")
  for pid in "$parent" "$child"; do
    [ "$(grep -c "^somashim statistics (pid $pid)\$" "$RUNS/$KEY.err")" = 1 ] || problems+=("stderr has not one table titled with pid $pid")
  done
  [ "$(grep -c '^somashim statistics' "$RUNS/$KEY.err")" = 2 ] || problems+=("stderr has not two tables")
  checked "fork: SOMA_STATS=1 tables on stderr name their pid" "${problems[@]}"
fi

# Output files: never written through a symbolic link, only when regular
# files, created mode 0600. What is refused costs one warning; the program
# runs on, and a refused SOMA_STATS table goes to stderr.
# refused_output NAME VAR PATH WARNING CONDITION: the callers program under
# the shim with VAR=PATH exits 0 with one "cannot write" line on stderr
# containing WARNING, and the shell test CONDITION holds afterwards.
refused_output() {
  local name=$1 var=$2 path=$3 warning=$4 condition=$5
  wanted "$name" || return 0
  next_key
  local k=$KEY problems=()
  run shim "$k" "$BIN/callers" "$var=$path"
  [ "$(rc_of "$k")" = 0 ] || problems+=("exit status $(rc_of "$k"), want 0")
  [ "$(grep -c 'cannot write' "$RUNS/$k.err")" = 1 ] || problems+=("not one warning: $(head -c 300 "$RUNS/$k.err")")
  grep -qF -- "$warning" "$RUNS/$k.err" || problems+=("the warning does not say '$warning'")
  eval "$condition" || problems+=("afterwards, not: $condition")
  checked "$name" "${problems[@]}"
}
OUTS=$B/outputs
rm -rf "$OUTS" && mkdir -p "$OUTS"
echo keep >"$OUTS/trace-target"
ln -s trace-target "$OUTS/trace-link"
# The shim's own words, which no errno text ("Too many levels of symbolic links") has.
LINK_REFUSED="it is a symbolic link, which is not followed"
refused_output "SOMA_TRACE: a symbolic link is not followed" SOMA_TRACE "$OUTS/trace-link" "$LINK_REFUSED" \
  '[ "$(cat "$OUTS/trace-target")" = keep ]'
ln -s absent "$OUTS/dangling"
refused_output "SOMA_TRACE: a dangling symbolic link creates nothing" SOMA_TRACE "$OUTS/dangling" "$LINK_REFUSED" \
  '[ ! -e "$OUTS/absent" ]'
mkfifo "$OUTS/fifo"
refused_output "SOMA_TRACE: a FIFO does not block, it is refused" SOMA_TRACE "$OUTS/fifo" "not a regular file" true
echo keep >"$OUTS/stats-target"
ln -s stats-target "$OUTS/stats-link"
refused_output "SOMA_STATS: a symbolic link is not followed, the table goes to stderr" SOMA_STATS "$OUTS/stats-link" \
  "$LINK_REFUSED" '[ "$(cat "$OUTS/stats-target")" = keep ] && grep -q "^somashim statistics" "$RUNS/$KEY.err"'
refused_output "SOMA_STATS=/dev/full: not a regular file, the table goes to stderr" SOMA_STATS /dev/full \
  "not a regular file" 'grep -q "^somashim statistics" "$RUNS/$KEY.err"'
ln -s absent "$OUTS/snapshot-link"
if wanted "out-of-memory snapshot: a symbolic link is not followed"; then
  next_key
  run shim "$KEY" "$BIN/libraries" LIBS_DIR="$BIN" FILL=1 FAKECUDA_MEM_LIMIT=134217728 "SOMA_SNAPSHOT=$OUTS/snapshot-link"
  problems=()
  [ "$(rc_of "$KEY")" = 0 ] || problems+=("exit status $(rc_of "$KEY"), want 0")
  [ "$(grep -c 'cannot write the out-of-memory snapshot' "$RUNS/$KEY.err")" = 1 ] || problems+=("not one warning: $(head -c 300 "$RUNS/$KEY.err")")
  [ ! -e "$OUTS/absent" ] || problems+=("the link's target was created")
  checked "out-of-memory snapshot: a symbolic link is not followed" "${problems[@]}"
fi
# What another user may plant: a symbolic link to a directory of the user's
# earlier in the path (one the user made is followed), a hard link to a file
# of the user's, a file of their own (which would stay readable to them); and a device.
mkdir "$OUTS/real"
ln -s real "$OUTS/dir-link"
if wanted "SOMA_STATS: the user's symbolic link to a directory is followed"; then
  next_key
  run shim "$KEY" "$BIN/callers" "SOMA_STATS=$OUTS/dir-link/followed.stats"
  problems=()
  [ "$(rc_of "$KEY")" = 0 ] && [ ! -s "$RUNS/$KEY.err" ] || problems+=("exit status $(rc_of "$KEY"), stderr: $(head -c 300 "$RUNS/$KEY.err")")
  grep -q '^somashim statistics' "$OUTS/real/followed.stats" || problems+=("no table in real/followed.stats")
  checked "SOMA_STATS: the user's symbolic link to a directory is followed" "${problems[@]}"
fi
mkdir -m 777 "$OUTS/shared"
ln -s ../real "$OUTS/shared/dir-link"
refused_output "SOMA_TRACE: nothing is created through a directory link in a directory others may write" SOMA_TRACE \
  "$OUTS/shared/dir-link/new.csv" "a symbolic link in a directory that others may write, which is not followed" \
  '[ ! -e "$OUTS/real/new.csv" ]'
if [ "$(id -u)" = 0 ]; then
  mkdir -m 1777 "$OUTS/sticky"
  echo keep >"$OUTS/real/victim"
  ln -s ../real "$OUTS/sticky/dir-link"
  chown -h 65534 "$OUTS/sticky/dir-link"
  refused_output "SOMA_STATS: another user's directory link in a sticky directory is not followed" SOMA_STATS \
    "$OUTS/sticky/dir-link/victim" "a symbolic link of another user (uid 65534), which is not followed" \
    '[ "$(cat "$OUTS/real/victim")" = keep ] && grep -q "^somashim statistics" "$RUNS/$KEY.err"'
elif wanted "SOMA_STATS: another user's directory link"; then
  echo "SKIP SOMA_STATS: another user's directory link in a sticky directory (giving a link to uid 65534 needs root)"
fi
refused_output "SOMA_STATS: a path ending in / names a directory, the table goes to stderr" SOMA_STATS "$OUTS/real/" \
  "the path names a directory (it ends in '/'), not a file" 'grep -q "^somashim statistics" "$RUNS/$KEY.err"'
if wanted "SOMA_STATS=/dev/stderr: the table on stderr"; then
  next_key
  run shim "$KEY" "$BIN/callers" SOMA_STATS=/dev/stderr SOMA_TRACE=/dev/stdout
  problems=()
  [ "$(rc_of "$KEY")" = 0 ] || problems+=("exit status $(rc_of "$KEY"), want 0")
  ! grep -q 'somashim: ' "$RUNS/$KEY.err" || problems+=("a warning: $(grep -m1 'somashim: ' "$RUNS/$KEY.err")")
  [ "$(grep -c '^somashim statistics' "$RUNS/$KEY.err")" = 1 ] || problems+=("not one table on stderr")
  grep -qx "time_us,device,op,size,ptr,in_use,reserved" "$RUNS/$KEY.out" || problems+=("no trace header on stdout")
  checked "SOMA_STATS=/dev/stderr: the table on stderr, SOMA_TRACE=/dev/stdout: the trace on stdout" "${problems[@]}"
fi
echo keep >"$OUTS/linked"
ln "$OUTS/linked" "$OUTS/hard-link"
refused_output "SOMA_TRACE: a file with another hard link is refused untouched" SOMA_TRACE "$OUTS/hard-link" \
  "it has 2 hard links" '[ "$(cat "$OUTS/linked")" = keep ]'
if [ "$(id -u)" = 0 ]; then
  echo keep >"$OUTS/others"
  chown 65534 "$OUTS/others"
  refused_output "SOMA_STATS: a file of another user is refused untouched, the table goes to stderr" SOMA_STATS \
    "$OUTS/others" "it belongs to another user (uid 65534)" \
    '[ "$(cat "$OUTS/others")" = keep ] && [ "$(stat -c %u "$OUTS/others")" = 65534 ] && grep -q "^somashim statistics" "$RUNS/$KEY.err"'
elif wanted "SOMA_STATS: a file of another user"; then
  echo "SKIP SOMA_STATS: a file of another user is refused (giving a file to uid 65534 needs root)"
fi
refused_output "SOMA_TRACE=/dev/null: not a regular file" SOMA_TRACE /dev/null "it is not a regular file" '[ -c /dev/null ]'
refused_output "SOMA_STATS=/dev/null: not a regular file, the table goes to stderr" SOMA_STATS /dev/null \
  "it is not a regular file" '[ -c /dev/null ] && grep -q "^somashim statistics" "$RUNS/$KEY.err"'
if wanted "output files are created mode 0600"; then
  next_key
  run shim "$KEY" "$BIN/callers" "SOMA_TRACE=$OUTS/new.csv" "SOMA_STATS=$OUTS/new.stats"
  problems=()
  [ "$(rc_of "$KEY")" = 0 ] && [ ! -s "$RUNS/$KEY.err" ] || problems+=("exit status $(rc_of "$KEY"), stderr: $(head -c 300 "$RUNS/$KEY.err")")
  for f in new.csv new.stats; do
    [ "$(stat -c %a "$OUTS/$f" 2>&1)" = 600 ] || problems+=("$f: mode $(stat -c %a "$OUTS/$f" 2>&1), want 600")
  done
  checked "output files are created mode 0600" "${problems[@]}"
fi

# A full disk (files limited to a size, so a write fails with EFBIG): one
# warning, the trace holds whole rows only, and the table counts what was lost.
if wanted "full disk: trace"; then
  next_key
  run shim "$KEY" "$BIN/fsize_limited" FSIZE_LIMIT_KIB=256 "FSIZE_LIMITED=$BIN/threads" "SOMA_TRACE=$RUNS/full.csv" \
    SOMA_STATS=1
  problems=()
  [ "$(rc_of "$KEY")" = 0 ] || problems+=("exit status $(rc_of "$KEY"), want 0")
  [ "$(grep -c 'writing the trace' "$RUNS/$KEY.err")" = 1 ] || problems+=("not one warning: $(grep -c 'writing the trace' "$RUNS/$KEY.err")")
  # under the shim's name, as the SOMA_STATS warning ("full disk: stats file")
  grep -q '^somashim: writing the trace' "$RUNS/$KEY.err" ||
    problems+=("the warning does not start with 'somashim: ': $(grep -m1 'writing the trace' "$RUNS/$KEY.err")")
  [ "$(tail -c 1 "$RUNS/full.csv" | od -An -c | tr -d ' ')" = '\n' ] || problems+=("the trace ends mid-row")
  awk -F, 'NF != 7 {bad = 1} END {exit bad}' "$RUNS/full.csv" || problems+=("a row of the trace is not whole")
  lost=$(sed -n 's/^trace incomplete: \([0-9]*\) rows lost.*/\1/p' "$RUNS/$KEY.err")
  events=$(($(stats_row "$RUNS/$KEY.err" "pool allocations") + $(stats_row "$RUNS/$KEY.err" "pool frees")))
  kept=$(($(wc -l <"$RUNS/full.csv") - 1))
  [ -n "$lost" ] && [ "$((kept + lost))" = "$events" ] || problems+=("rows kept $kept + lost '${lost:-}' != events $events")
  checked "full disk: trace (one warning, whole rows, lost rows counted)" "${problems[@]}"
fi
if wanted "full disk: stats file"; then
  next_key
  run shim "$KEY" "$BIN/fsize_limited" FSIZE_LIMIT_KIB=0 "FSIZE_LIMITED=$BIN/callers" "SOMA_STATS=$OUTS/full.stats"
  problems=()
  [ "$(rc_of "$KEY")" = 0 ] || problems+=("exit status $(rc_of "$KEY"), want 0")
  [ "$(grep -c '^somashim: cannot write statistics' "$RUNS/$KEY.err")" = 1 ] || problems+=("not one warning")
  grep -q '^somashim statistics' "$RUNS/$KEY.err" || problems+=("the table is not on stderr")
  [ ! -e "$OUTS/full.stats" ] || problems+=("an incomplete stats file is left")
  checked "full disk: stats file (one warning, the table on stderr, no empty file)" "${problems[@]}"
fi

# scripts/replay_orderings.py. Three 1 MiB blocks; A freed at 10 us, B at 12 us
# (during A's ordering, so it waits for the next), C freed with cudaFreeAsync at
# 15 us (reusable at once); then requests at 16, 22 and 25 us. With orderings of
# 10 us, A's ends at 20 and B's at 30: the request at 25 finds nothing and the pool
# grows to 4 MiB, with 2 MiB waiting at 12 us. With 0 or 1 us every request is
# served (3 MiB). A model that reused C late, B at the end of A's ordering, or left
# B's wait out would print other figures. The rows come out of time order, as the
# shim's threads flush theirs.
if wanted "replay of orderings" && command -v python3 >/dev/null; then
  next_key
  m=$((1 << 20))
  printf '%s\n' time_us,device,op,size,ptr,in_use,reserved "1,0,alloc,$m,0xb,0,0" "0,0,alloc,$m,0xa,0,0" \
    "2,0,alloc,$m,0xc,0,0" "10,0,free,$m,0xa,0,0" "12,0,free,$m,0xb,0,0" "15,0,free_async,$m,0xc,0,0" \
    "16,0,alloc,$m,0xd,0,0" "22,0,alloc,$m,0xe,0,0" "25,0,alloc,$m,0xf,0,0" >"$RUNS/$KEY.csv"
  python3 scripts/replay_orderings.py "$RUNS/$KEY.csv" --latency-us 0,1,10 >"$RUNS/$KEY.out" 2>&1
  got=$(awk 'NR > 1 { print $2, $3, $4 }' "$RUNS/$KEY.out" | tr '\n' ';')
  want="0 3.0 0.0;1 3.0 1.0;10 4.0 2.0;"
  problems=()
  [ "$got" = "$want" ] || problems+=("latency, peak, waiting: '$got', want '$want'" "$(cat "$RUNS/$KEY.out")")
  checked "replay of orderings (scripts/replay_orderings.py)" "${problems[@]}"
fi

# `make install`: the library goes without its debug info and still serves a
# program; the build keeps its debug info for developers; the installed
# somarun --ps finds somactl.
if wanted "make install"; then
  inst=$B/install
  rm -rf "$inst"
  problems=()
  make -s install PREFIX="$inst" SHIM="$SHIM" >"$RUNS/install.out" 2>&1 || problems+=("make install failed: $(tail -n 3 "$RUNS/install.out")")
  if command -v readelf >/dev/null; then
    ! readelf -S -W "$inst/lib/libsomashim.so" | grep -q ' \.debug_info ' || problems+=("the installed library has a .debug_info section")
  else
    echo "# readelf not installed: the installed library's debug info not checked"
  fi
  [ -x "$inst/bin/somactl" ] && "$inst/bin/somarun" --ps --json >/dev/null 2>&1 ||
    problems+=("the installed somarun --ps does not find somactl next to it")
  checked "make install: the library without debug info ($(($(stat -c %s "$inst/lib/libsomashim.so" 2>/dev/null || echo 0) >> 10)) KiB; $(($(stat -c %s "$SHIM") >> 10)) KiB built)" "${problems[@]}"
  SHIM=$inst/lib/libsomashim.so compare "make install: the installed library serves a program" routing
fi

# The test double defines no function named as one the GPU tests define: tools
# that map a project's structure by names would take one for the other and see
# the double and the GPU tests include each other.
if wanted "test double's function names"; then
  defined() {
    grep -ohE '^[A-Za-z_][A-Za-z0-9_ ]*[ *]+[A-Za-z_][A-Za-z0-9_]*\(' "$@" |
      sed -E 's/.*[ *]([A-Za-z_][A-Za-z0-9_]*)\($/\1/' | sort -u
  }
  shared=$(comm -12 <(defined c_tests/fake/*.c) <(defined c_tests/gpu/*.h c_tests/gpu/*.cu) | tr '\n' ' ')
  problems=()
  [ "$(defined c_tests/fake/*.c | wc -l)" -gt 100 ] || problems+=("too few definitions found in c_tests/fake: the pattern is broken")
  [ -z "$shared" ] || problems+=("defined in both c_tests/fake and c_tests/gpu: $shared")
  checked "test double's function names differ from the GPU tests' (c_tests/fake, c_tests/gpu)" "${problems[@]}"
fi

# The driver calls that issue work on a stream, as the shim's list names them,
# against the headers (scripts/check_work_entry_points.py); and the check's
# teeth: a list missing cuMemsetD8Async, with cuMemcpyAsync's stream one
# place off, must be refused on both counts.
if wanted "work entry points" && command -v python3 >/dev/null; then
  next_key
  problems=()
  python3 scripts/check_work_entry_points.py "$INC" src/lib.rs >"$RUNS/$KEY.out" 2>&1 ||
    problems+=("the shim's list" "$(tail -n 20 "$RUNS/$KEY.out")")
  sed -e '/^    cuMemsetD8Async(/d' -e '/^    cuMemsetD32_v2_ptds(/d' -e 's/^    cuMemcpyAsync(dst, src, bytes, s) => \[stream(s)\];/    cuMemcpyAsync(dst, src, s, bytes) => [stream(s)];/' \
    src/lib.rs >"$RUNS/$KEY.broken.rs"
  python3 scripts/check_work_entry_points.py "$INC" "$RUNS/$KEY.broken.rs" >"$RUNS/$KEY.broken" 2>&1
  grep -q '^cuMemsetD8Async(.*neither on the list' "$RUNS/$KEY.broken" || problems+=("a missing entry point not found" "$(cat "$RUNS/$KEY.broken")")
  grep -q '^cuMemsetD32_v2_ptds: works on the per-thread default stream, not on the list' "$RUNS/$KEY.broken" ||
    problems+=("a missing per-thread synchronous call not found" "$(cat "$RUNS/$KEY.broken")")
  grep -q "^cuMemcpyAsync: argument 2 is 'size_t ByteCount', not a stream" "$RUNS/$KEY.broken" ||
    problems+=("a misplaced stream not found" "$(cat "$RUNS/$KEY.broken")")
  checked "work entry points match the CUDA headers (scripts/check_work_entry_points.py)" "${problems[@]}"
fi

# The benchmarks' ratios (scripts/ratios.py checks itself), and the program
# benchmarks' table on made-up rounds: the noise floor row, the shim against the
# fastest own allocator, the tokens' check.
if wanted "benchmark ratios" && command -v python3 >/dev/null; then
  next_key
  problems=()
  python3 scripts/ratios.py >"$RUNS/$KEY.out" 2>&1 || problems+=("ratios.py: $(tail -n 3 "$RUNS/$KEY.out")")
  python3 - >"$RUNS/$KEY.jsonl" <<'PYEOF'
import json
times = {"caching": [20, 22, 19, 21, 20], "caching-off": [40, 41, 39, 42, 40], "caching-off+shim": [19, 21, 18, 20, 19],
         "cudaMallocAsync": [18, 20, 17, 19, 18], "caching again": [21, 22, 19, 20, 20]}
for r in range(5):
    for name, ms in times.items():
        print(json.dumps({"scenario": "generate/" + name, "round": r + 1, "bench": "generate", "tokens_sha": "ab12cd34",
                          "ms_per_token_median": ms[r], "peak_device_used_mib": 100}))
PYEOF
  sed -n "/^HELPER=\$(cat <<'PYEOF'/,/^PYEOF/p" scripts/bench_programs.sh | sed '1d;$d' >"$RUNS/$KEY.helper.py"
  python3 "$RUNS/$KEY.helper.py" table "$RUNS/$KEY.jsonl" >"$RUNS/$KEY.table" 2>&1 || problems+=("the table failed: $(tail -n 3 "$RUNS/$KEY.table")")
  # The shim per round: against caching 19/20 21/22 18/19 20/21 19/20 (0.947-0.955), against
  # cudaMallocAsync (the faster) 19/18 21/20 18/17 20/19 19/18 (1.050-1.059, median 1.056).
  grep -qE '^generate/caching-off\+shim .* 0\.95x \[0\.95-0\.95\] +1\.06x \[1\.05-1\.06\] cudaMallocAsync ' "$RUNS/$KEY.table" ||
    problems+=("the shim's row lacks its ratios" "$(cat "$RUNS/$KEY.table")")
  grep -qE '^generate/caching again .* 1\.00x \[0\.95-1\.05\] noise ' "$RUNS/$KEY.table" ||
    problems+=("no noise floor row" "$(cat "$RUNS/$KEY.table")")
  grep -qE '^generate/.* FAIL tokens$' "$RUNS/$KEY.table" && problems+=("equal tokens called different")
  # The ratio lines: the shim's resolves 5% (its interval 0.01 wide), caching-off's does not (0.19).
  grep -qxF 'ratio: generate/caching-off+shim = 1.06x [1.05-1.06] against generate/cudaMallocAsync; noise 1.00x [0.95-1.05]' \
    "$RUNS/$KEY.table" || problems+=("no ratio line for the shim's row" "$(cat "$RUNS/$KEY.table")")
  grep -qE '^ratio: generate/caching-off = 2\.00x \[1\.86-2\.05\] against generate/caching; noise .*: cannot resolve 5%$' \
    "$RUNS/$KEY.table" || problems+=("a wide interval not called so" "$(grep '^ratio' "$RUNS/$KEY.table")")
  checked "benchmark ratios (scripts/ratios.py, the program benchmarks' table)" "${problems[@]}"
fi

# The program benchmarks' import rows end to end, on a stand-in `torch` module (no
# GPU): each row timed and checked, the noise floor row; an import that writes to
# stderr fails its rows and the run.
if wanted "benchmark import rows" && command -v python3 >/dev/null; then
  next_key
  problems=()
  stand_in=$RUNS/$KEY.torch
  mkdir -p "$stand_in"
  import_rows() {
    PYTHONPATH=$stand_in OUT=$RUNS/$KEY.$1 BENCH_REPS=$2 BENCH_ONLY=import timeout -k 5 "$TMO" \
      scripts/bench_programs.sh "$SHIM" >"$RUNS/$KEY.$1.out" 2>&1
  }
  echo 'import time; time.sleep(0.02)' >"$stand_in/torch.py"
  import_rows quiet 2
  rc=$?
  [ "$rc" = 0 ] || problems+=("exit status $rc" "$(tail -n 5 "$RUNS/$KEY.quiet.out")")
  [ "$(grep -c '"ms_per_import_median"' "$RUNS/$KEY.quiet/programs.jsonl")" = 6 ] ||
    problems+=("not 6 timed runs (3 rows, 2 rounds)" "$(cat "$RUNS/$KEY.quiet/programs.jsonl")")
  grep -qE '^import/plain\+shim +[0-9.]+ .* ok$' "$RUNS/$KEY.quiet.out" || problems+=("no shim row" "$(cat "$RUNS/$KEY.quiet.out")")
  grep -qE '^import/plain again .* noise .* ok$' "$RUNS/$KEY.quiet.out" || problems+=("no noise floor row")
  echo 'import sys; sys.stderr.write("a warning\n")' >"$stand_in/torch.py"
  import_rows noisy 1
  rc=$?
  [ "$rc" = 1 ] || problems+=("an import that writes to stderr: exit status $rc, not 1")
  grep -qE '^import/plain\+shim .* ERROR$' "$RUNS/$KEY.noisy.out" || problems+=("its row not marked ERROR")
  grep -q 'stderr: a warning' "$RUNS/$KEY.noisy.out" || problems+=("its stderr not reported" "$(tail -n 5 "$RUNS/$KEY.noisy.out")")
  checked "benchmark import rows (scripts/bench_programs.sh, a stand-in torch)" "${problems[@]}"
fi

# `make demo` on a machine without a GPU: the legacy loop on the test double.
if wanted "make demo on the test double"; then
  next_key
  NVCC=/nonexistent/nvcc OUT=$RUNS/$KEY.demo timeout -k 5 "$TMO" scripts/demo.sh "$SHIM" >"$RUNS/$KEY.out" 2>&1
  demo_rc=$?
  problems=()
  [ "$demo_rc" = 0 ] || problems+=("exit status $demo_rc" "$(tail -n 5 "$RUNS/$KEY.out")")
  grep -q '^somashim demo, run on the CUDA TEST DOUBLE' "$RUNS/$KEY.out" || problems+=("it does not say where it ran")
  grep -q '^somashim statistics (pid' "$RUNS/$KEY.out" || problems+=("no SOMA_STATS table")
  grep -qE '^(drawn|not drawn)' "$RUNS/$KEY.out" || problems+=("nothing said of the trace's drawing")
  checked "make demo on the test double (no nvcc)" "${problems[@]}"
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
