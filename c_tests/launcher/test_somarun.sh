#!/usr/bin/env bash
# Tests for the launcher scripts/somarun and scripts/install.sh. No GPU and no real
# libsomashim.so: the "library" is an empty shared object built here (so that
# LD_PRELOAD of it loads cleanly), and the program is a probe script that prints
# LD_PRELOAD, the SOMA_* variables and its arguments.
#
#   c_tests/launcher/test_somarun.sh
#
# One line per check (PASS name / FAIL name: detail), then `N passed, N failed`;
# the exit status is non-zero if anything failed. CC (default cc, else gcc) builds
# the empty library; shellcheck, where installed, is run on the scripts too.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SOMARUN=$ROOT/scripts/somarun
INSTALL=$ROOT/scripts/install.sh
TMP=$(readlink -f "$(mktemp -d)")
trap 'rm -rf "$TMP"' EXIT

# A hermetic environment: nothing inherited that the launcher looks at.
while IFS= read -r v; do
  case $v in SOMA_*) unset "$v" ;; esac
done < <(compgen -e)
unset SOMASHIM_LIB LD_PRELOAD

PASSED=0
FAILED=0
pass() {
  echo "PASS $1"
  PASSED=$((PASSED + 1))
}
fail() {
  echo "FAIL $1: $2"
  FAILED=$((FAILED + 1))
}

VARS=(LD_PRELOAD SOMA_STATS SOMA_TRACE SOMA_RELEASE_THRESHOLD SOMA_POOL SOMA_MIN_BYTES
  SOMA_MAX_BYTES SOMA_FREE_SYNC SOMA_FREE_ORDER SOMA_PENDING_FREE_LIMIT SOMA_LEGACY_CACHE SOMA_TRACK_WORK SOMA_SMALL_BLOCKS SOMA_MEMORY_LIMIT
  SOMA_HOST_POOL SOMA_MEMINFO SOMA_PASSTHROUGH_CALLERS SOMA_LOG SOMA_DISABLE SOMA_DECAY_MS SOMA_IDLE_MS SOMA_NEIGHBOURS SOMA_SNAPSHOT)

# --- fixtures ---------------------------------------------------------------
echo 'int somashim_fake(void) { return 0; }' >"$TMP/empty.c"
CC=${CC:-}
if [ -z "$CC" ]; then
  if command -v cc >/dev/null 2>&1; then CC=cc; else CC=gcc; fi
fi
# With debug info, as the release build has, for install.sh to strip.
if ! "$CC" -g -shared -fPIC -o "$TMP/fake.so" "$TMP/empty.c" 2>"$TMP/cc.err"; then
  echo "FAIL setup: cannot build the empty library with '$CC': $(head -c 300 "$TMP/cc.err")"
  echo "0 passed, 1 failed"
  exit 1
fi
# Copies of the fake library in distinct places, so a test can tell which was taken.
mklib() {
  mkdir -p "$(dirname "$1")"
  cp "$TMP/fake.so" "$1"
}
LIB_A=$TMP/a/libsomashim.so
LIB_ENV=$TMP/env/libsomashim.so
OTHER=$TMP/other/libother.so
mklib "$LIB_A"
mklib "$LIB_ENV"
mklib "$OTHER"

PROBE=$TMP/probe
cat >"$PROBE" <<'EOF'
#!/usr/bin/env bash
for v in LD_PRELOAD SOMA_STATS SOMA_TRACE SOMA_RELEASE_THRESHOLD SOMA_POOL SOMA_MIN_BYTES \
  SOMA_MAX_BYTES SOMA_FREE_SYNC SOMA_FREE_ORDER SOMA_PENDING_FREE_LIMIT SOMA_LEGACY_CACHE SOMA_TRACK_WORK SOMA_SMALL_BLOCKS SOMA_MEMORY_LIMIT \
  SOMA_HOST_POOL SOMA_MEMINFO SOMA_PASSTHROUGH_CALLERS SOMA_LOG SOMA_DISABLE SOMA_DECAY_MS SOMA_IDLE_MS SOMA_NEIGHBOURS SOMA_SNAPSHOT; do
  if [ -n "${!v+x}" ]; then printf '%s=%s\n' "$v" "${!v}"; else printf '%s<unset>\n' "$v"; fi
done
printf 'ARGC=%d\n' "$#"
for a in "$@"; do printf 'ARG<%s>\n' "$a"; done
EOF
chmod +x "$PROBE"

# run CMD...: stdout in $TMP/out, stderr in $TMP/err, status in RC.
RC=0
# (The shell's own "Killed"/"Terminated" notice, for a program killed by a signal,
# goes to /dev/null.)
run() {
  { "$@" >"$TMP/out" 2>"$TMP/err" </dev/null; } 2>/dev/null
  RC=$?
}
# The probe's value of VAR in the last run ("<unset>" if unset).
getvar() {
  local line
  while IFS= read -r line; do
    case $line in
      "$1="*) printf '%s' "${line#"$1="}" && return ;;
      "$1<unset>") printf '<unset>' && return ;;
    esac
  done <"$TMP/out"
  printf '<missing from output>'
}
short() { head -c 400 "$1" | tr '\n' '|'; }

# expect_vars NAME VAR=VALUE... : after `run`, status 0, nothing on stderr, each VAR
# has VALUE ("<unset>" for unset), and every SOMA_* variable not named is unset.
expect_vars() {
  local name=$1 kv var want got v named
  shift
  if [ "$RC" != 0 ]; then
    fail "$name" "exit status $RC, stderr: $(short "$TMP/err")"
    return
  fi
  if [ -s "$TMP/err" ]; then
    fail "$name" "unexpected stderr: $(short "$TMP/err")"
    return
  fi
  for kv in "$@"; do
    var=${kv%%=*}
    want=${kv#*=}
    got=$(getvar "$var")
    if [ "$got" != "$want" ]; then
      fail "$name" "$var='$got', expected '$want'"
      return
    fi
  done
  for v in "${VARS[@]}"; do
    named=0
    for kv in "$@"; do [ "${kv%%=*}" = "$v" ] && named=1; done
    if [ $named = 0 ] && [ "$(getvar "$v")" != "<unset>" ]; then
      fail "$name" "$v='$(getvar "$v")', expected unset"
      return
    fi
  done
  pass "$name"
}

# expect_error NAME PATTERN: after `run`, status 2, nothing on stdout (so the
# program did not run), exactly one line on stderr, matching the glob PATTERN.
expect_error() {
  local name=$1 pattern=$2 lines msg
  lines=$(wc -l <"$TMP/err")
  msg=$(cat "$TMP/err")
  # shellcheck disable=SC2053 # PATTERN is a glob on purpose
  if [ "$RC" != 2 ]; then
    fail "$name" "exit status $RC, expected 2; stderr: $(short "$TMP/err")"
  elif [ -s "$TMP/out" ]; then
    fail "$name" "stdout not empty (program ran?): $(short "$TMP/out")"
  elif [ "$lines" != 1 ]; then
    fail "$name" "expected one line on stderr, got $lines: $(short "$TMP/err")"
  elif [[ $msg != $pattern ]]; then
    fail "$name" "stderr '$msg' does not match '$pattern'"
  else
    pass "$name"
  fi
}

expect_status() {
  local name=$1 want=$2
  if [ "$RC" = "$want" ]; then pass "$name"; else fail "$name" "exit status $RC, expected $want; stderr: $(short "$TMP/err")"; fi
}

# --- each option, both forms ------------------------------------------------
# option | variable | value
OPTS=(
  "--trace|SOMA_TRACE|/tmp/pool trace.csv"
  "--oom-snapshot|SOMA_SNAPSHOT|/tmp/oom snapshot.json"
  "--threshold|SOMA_RELEASE_THRESHOLD|4GiB"
  "--pool|SOMA_POOL|default"
  "--min-bytes|SOMA_MIN_BYTES|1K"
  "--max-bytes|SOMA_MAX_BYTES|512MiB"
  "--pending-free-limit|SOMA_PENDING_FREE_LIMIT|64MiB"
  "--legacy-cache|SOMA_LEGACY_CACHE|on"
  "--track-work|SOMA_TRACK_WORK|0"
  "--small-blocks|SOMA_SMALL_BLOCKS|1MiB"
  "--memory-limit|SOMA_MEMORY_LIMIT|50%"
  "--host-pool|SOMA_HOST_POOL|0"
  "--meminfo|SOMA_MEMINFO|pool"
  "--passthrough-callers|SOMA_PASSTHROUGH_CALLERS|libnccl,libfoo"
  "--log|SOMA_LOG|somashim=debug"
  "--decay-ms|SOMA_DECAY_MS|2000"
  "--idle-ms|SOMA_IDLE_MS|100"
  "--neighbours|SOMA_NEIGHBOURS|0"
)
for row in "${OPTS[@]}"; do
  IFS='|' read -r opt var val <<<"$row"
  run "$SOMARUN" --lib "$LIB_A" "$opt" "$val" -- "$PROBE"
  expect_vars "option $opt VALUE" "$var=$val" "LD_PRELOAD=$LIB_A"
  run "$SOMARUN" --lib "$LIB_A" "$opt=$val" -- "$PROBE"
  expect_vars "option $opt=VALUE" "$var=$val" "LD_PRELOAD=$LIB_A"
done
# Values are not checked by the launcher (the library does that).
run "$SOMARUN" --lib "$LIB_A" --threshold lots -- "$PROBE"
expect_vars "size value passed unchecked" "SOMA_RELEASE_THRESHOLD=lots" "LD_PRELOAD=$LIB_A"
run "$SOMARUN" --lib "$LIB_A" --min-bytes -1 -- "$PROBE"
expect_vars "value starting with one dash" "SOMA_MIN_BYTES=-1" "LD_PRELOAD=$LIB_A"
run "$SOMARUN" --lib "$LIB_A" --trace=--odd-name.csv -- "$PROBE"
expect_vars "option=VALUE takes a value starting with --" "SOMA_TRACE=./--odd-name.csv" "LD_PRELOAD=$LIB_A"
# The library takes a SOMA_TRACE path only with a '/'.
run "$SOMARUN" --lib "$LIB_A" --trace t.csv -- "$PROBE"
expect_vars "option --trace FILE without a / gets ./" "SOMA_TRACE=./t.csv" "LD_PRELOAD=$LIB_A"
run "$SOMARUN" --lib "$LIB_A" --trace=out/t.csv -- "$PROBE"
expect_vars "option --trace=DIR/FILE kept as given" "SOMA_TRACE=out/t.csv" "LD_PRELOAD=$LIB_A"
run "$SOMARUN" --lib "$LIB_A" --oom-snapshot oom.json -- "$PROBE"
expect_vars "option --oom-snapshot FILE without a / gets ./" "SOMA_SNAPSHOT=./oom.json" "LD_PRELOAD=$LIB_A"

run "$SOMARUN" --lib "$LIB_A" --stats -- "$PROBE"
expect_vars "option --stats" "SOMA_STATS=1" "LD_PRELOAD=$LIB_A"
run "$SOMARUN" --lib "$LIB_A" --stats=/tmp/stats out.txt -- "$PROBE"
expect_error "option --stats FILE (not a form) is an error" "*--stats=FILE*"
run "$SOMARUN" --lib "$LIB_A" "--stats=/tmp/stats out.txt" -- "$PROBE"
expect_vars "option --stats=FILE" "SOMA_STATS=/tmp/stats out.txt" "LD_PRELOAD=$LIB_A"
run "$SOMARUN" --lib "$LIB_A" --free-sync -- "$PROBE"
expect_vars "option --free-sync" "SOMA_FREE_SYNC=1" "LD_PRELOAD=$LIB_A"
run "$SOMARUN" --lib "$LIB_A" --disable -- "$PROBE"
expect_vars "option --disable" "SOMA_DISABLE=1" "LD_PRELOAD=$LIB_A"
run "$SOMARUN" --lib="$LIB_A" -- "$PROBE"
expect_vars "option --lib=PATH" "LD_PRELOAD=$LIB_A"

run "$SOMARUN" --lib "$LIB_A" -- "$PROBE"
expect_vars "no options: only LD_PRELOAD set" "LD_PRELOAD=$LIB_A"

run "$SOMARUN" --lib "$LIB_A" --stats=s.txt --trace t.csv --threshold=0 --pool own --min-bytes 2K \
  --max-bytes=1G --free-sync --free-order join --pending-free-limit=1MiB --meminfo real --passthrough-callers=libnccl \
  --log trace --disable -- "$PROBE"
expect_vars "all options together" "LD_PRELOAD=$LIB_A" SOMA_STATS=./s.txt SOMA_TRACE=./t.csv \
  SOMA_RELEASE_THRESHOLD=0 SOMA_POOL=own SOMA_MIN_BYTES=2K SOMA_MAX_BYTES=1G SOMA_FREE_SYNC=1 \
  SOMA_FREE_ORDER=join SOMA_PENDING_FREE_LIMIT=1MiB SOMA_MEMINFO=real SOMA_PASSTHROUGH_CALLERS=libnccl SOMA_LOG=trace \
  SOMA_DISABLE=1

run "$SOMARUN" --lib "$LIB_A" --pool own --pool=default -- "$PROBE"
expect_vars "a later option wins" "SOMA_POOL=default" "LD_PRELOAD=$LIB_A"
run env SOMA_POOL=default SOMA_LOG=info "$SOMARUN" --lib "$LIB_A" -- "$PROBE"
expect_vars "environment kept without an option" "SOMA_POOL=default" "SOMA_LOG=info" "LD_PRELOAD=$LIB_A"
run env SOMA_POOL=default "$SOMARUN" --lib "$LIB_A" --pool own -- "$PROBE"
expect_vars "option overrides environment" "SOMA_POOL=own" "LD_PRELOAD=$LIB_A"

# --- LD_PRELOAD -------------------------------------------------------------
run env LD_PRELOAD="$OTHER" "$SOMARUN" --lib "$LIB_A" -- "$PROBE"
expect_vars "LD_PRELOAD prepended to an existing one" "LD_PRELOAD=$LIB_A:$OTHER"
run env LD_PRELOAD="$OTHER:$OTHER" "$SOMARUN" --lib "$LIB_A" -- "$PROBE"
expect_vars "LD_PRELOAD prepended to a list" "LD_PRELOAD=$LIB_A:$OTHER:$OTHER"
run env LD_PRELOAD= "$SOMARUN" --lib "$LIB_A" -- "$PROBE"
expect_vars "empty LD_PRELOAD: no stray colon" "LD_PRELOAD=$LIB_A"
run sh -c 'cd "$1" && exec "$2" --lib ./libsomashim.so -- "$3"' sh "$TMP/a" "$SOMARUN" "$PROBE"
expect_vars "relative --lib made absolute" "LD_PRELOAD=$LIB_A"
mkdir -p "$TMP/sp ace"
cp "$TMP/fake.so" "$TMP/sp ace/libsomashim.so"
run "$SOMARUN" --lib "$TMP/sp ace/libsomashim.so" -- "$PROBE"
expect_error "library path with a space refused" "*space or colon*"

# --- finding the library ----------------------------------------------------
run env SOMASHIM_LIB="$LIB_ENV" "$SOMARUN" -- "$PROBE"
expect_vars "library from SOMASHIM_LIB" "LD_PRELOAD=$LIB_ENV"
run env SOMASHIM_LIB="$LIB_ENV" "$SOMARUN" --lib "$LIB_A" -- "$PROBE"
expect_vars "--lib beats SOMASHIM_LIB" "LD_PRELOAD=$LIB_A"
run "$SOMARUN" --lib "$TMP/nowhere/libsomashim.so" -- "$PROBE"
expect_error "--lib not found" "*--lib*not found*nowhere*"
run env SOMASHIM_LIB="$TMP/nowhere/libsomashim.so" "$SOMARUN" -- "$PROBE"
expect_error "SOMASHIM_LIB not found" "*SOMASHIM_LIB*not found*"

# A copy of the launcher alone (no library anywhere near it).
mkdir -p "$TMP/alone/bin"
cp "$SOMARUN" "$TMP/alone/bin/somarun"
run "$TMP/alone/bin/somarun" -- "$PROBE"
expect_error "library not found" "*libsomashim.so not found*--lib*SOMASHIM_LIB*"
run "$TMP/alone/bin/somarun" --help
if [ "$RC" = 0 ] && grep -q '^Usage: somarun' "$TMP/out"; then pass "--help needs no library"; else fail "--help needs no library" "status $RC"; fi

# Next to the script.
mkdir -p "$TMP/side"
cp "$SOMARUN" "$TMP/side/somarun"
mklib "$TMP/side/libsomashim.so"
run "$TMP/side/somarun" -- "$PROBE"
expect_vars "library next to the script" "LD_PRELOAD=$TMP/side/libsomashim.so"
run env SOMASHIM_LIB="$LIB_ENV" "$TMP/side/somarun" -- "$PROBE"
expect_vars "SOMASHIM_LIB beats next to the script" "LD_PRELOAD=$LIB_ENV"

# The source tree's layout: scripts/somarun, target/release/libsomashim.so.
mkdir -p "$TMP/repo/scripts"
cp "$SOMARUN" "$TMP/repo/scripts/somarun"
mklib "$TMP/repo/target/release/libsomashim.so"
run "$TMP/repo/scripts/somarun" -- "$PROBE"
expect_vars "library in ../target/release" "LD_PRELOAD=$TMP/repo/target/release/libsomashim.so"
ln -s "$TMP/repo/scripts/somarun" "$TMP/alone/bin/somarun-link"
run "$TMP/alone/bin/somarun-link" -- "$PROBE"
expect_vars "symlink to the script resolved" "LD_PRELOAD=$TMP/repo/target/release/libsomashim.so"
mklib "$TMP/repo/lib/libsomashim.so"
run "$TMP/repo/scripts/somarun" -- "$PROBE"
expect_vars "../lib before ../target/release" "LD_PRELOAD=$TMP/repo/lib/libsomashim.so"
mklib "$TMP/repo/scripts/libsomashim.so"
run "$TMP/repo/scripts/somarun" -- "$PROBE"
expect_vars "next to the script before ../lib" "LD_PRELOAD=$TMP/repo/scripts/libsomashim.so"

# --- install ----------------------------------------------------------------
PREFIX=$TMP/prefix
run "$INSTALL" "$PREFIX" "$LIB_A"
if [ "$RC" = 0 ] && [ -f "$PREFIX/lib/libsomashim.so" ] && [ -f "$PREFIX/bin/somarun" ] &&
  cmp -s "$SOMARUN" "$PREFIX/bin/somarun"; then
  pass "install.sh installs both files"
else
  fail "install.sh installs both files" "status $RC, stderr: $(short "$TMP/err")"
fi
# The library goes without its debug info; the one given keeps it.
if command -v readelf >/dev/null 2>&1; then
  has_debug_info() { readelf -S -W "$1" | grep -q ' \.debug_info '; }
  dynamic_symbols() { readelf --dyn-syms -W "$1" | grep -v '^Symbol table'; }
  if ! has_debug_info "$LIB_A"; then
    fail "install.sh strips debug info" "the fixture $LIB_A has no .debug_info to strip"
  elif has_debug_info "$PREFIX/lib/libsomashim.so"; then
    fail "install.sh strips debug info" "$PREFIX/lib/libsomashim.so has a .debug_info section"
  elif [ "$(dynamic_symbols "$LIB_A")" != "$(dynamic_symbols "$PREFIX/lib/libsomashim.so")" ]; then
    fail "install.sh strips debug info" "the installed library's dynamic symbols differ from $LIB_A's"
  else
    pass "install.sh strips debug info (the given library keeps it; the same dynamic symbols)"
  fi
else
  echo "# readelf not installed: install.sh's stripping not checked" >&2
fi
modes="$(stat -c %a "$PREFIX/lib/libsomashim.so" 2>&1) $(stat -c %a "$PREFIX/bin/somarun" 2>&1)"
if [ "$modes" = "755 755" ]; then pass "install.sh modes 755"; else fail "install.sh modes 755" "got $modes"; fi
run "$PREFIX/bin/somarun" --pool default -- "$PROBE"
expect_vars "installed somarun finds PREFIX/lib" "LD_PRELOAD=$PREFIX/lib/libsomashim.so" "SOMA_POOL=default"
mkdir -p "$TMP/path"
ln -s "$PREFIX/bin/somarun" "$TMP/path/somarun"
run env PATH="$TMP/path:$PATH" somarun -- "$PROBE"
expect_vars "installed somarun through a symlink on PATH" "LD_PRELOAD=$PREFIX/lib/libsomashim.so"
run "$INSTALL" "$PREFIX" "$LIB_A"
expect_status "install.sh again over an existing install" 0
(cd "$TMP/a" && "$INSTALL" ../prefix-rel ./libsomashim.so >/dev/null 2>&1)
if [ -f "$TMP/prefix-rel/lib/libsomashim.so" ] && [ -x "$TMP/prefix-rel/bin/somarun" ]; then
  pass "install.sh with relative paths"
else
  fail "install.sh with relative paths" "files missing under $TMP/prefix-rel"
fi
run env DESTDIR="$TMP/stage" "$INSTALL" /opt/soma "$LIB_A"
if [ "$RC" = 0 ] && [ -f "$TMP/stage/opt/soma/lib/libsomashim.so" ] && [ -x "$TMP/stage/opt/soma/bin/somarun" ]; then
  pass "install.sh honours DESTDIR"
else
  fail "install.sh honours DESTDIR" "status $RC, stderr: $(short "$TMP/err")"
fi
run "$INSTALL"
expect_status "install.sh without arguments exits 2" 2
run "$INSTALL" "$TMP/prefix2" "$TMP/nowhere.so"
expect_status "install.sh with a missing library exits 2" 2
run env STRIP="$TMP/no-such-strip" "$INSTALL" "$TMP/prefix3" "$LIB_A"
if [ "$RC" = 2 ] && [ ! -e "$TMP/prefix3" ] && grep -q 'STRIP' "$TMP/err"; then
  pass "install.sh without a strip program exits 2, installing nothing"
else
  fail "install.sh without a strip program exits 2, installing nothing" "status $RC, stderr: $(short "$TMP/err")"
fi

# --- exit status and signals ------------------------------------------------
for code in 0 3 42; do
  run "$SOMARUN" --lib "$LIB_A" -- sh -c "exit $code"
  expect_status "exit status $code passed through" "$code"
done
run "$SOMARUN" --lib "$LIB_A" -- sh -c 'kill -TERM $$'
expect_status "death by SIGTERM passed through (143)" 143
run "$SOMARUN" --lib "$LIB_A" -- sh -c 'kill -KILL $$'
expect_status "death by SIGKILL passed through (137)" 137
# expect_cannot_run NAME STATUS PATTERN: after `run`, STATUS, nothing on
# stdout, and one line on stderr from the launcher, matching the glob PATTERN.
expect_cannot_run() {
  local name=$1 want=$2 pattern=$3 msg
  msg=$(cat "$TMP/err")
  # shellcheck disable=SC2053 # PATTERN is a glob on purpose
  if [ "$RC" != "$want" ]; then
    fail "$name" "exit status $RC, expected $want; stderr: $(short "$TMP/err")"
  elif [ -s "$TMP/out" ] || [ "$(wc -l <"$TMP/err")" != 1 ] || [[ $msg != $pattern ]]; then
    fail "$name" "stderr '$(short "$TMP/err")' is not one line matching '$pattern'"
  else
    pass "$name"
  fi
}
run "$SOMARUN" --lib "$LIB_A" -- "$TMP/no-such-program"
expect_cannot_run "program not found: 127, said by the launcher" 127 "somarun: $TMP/no-such-program: no such program"
run "$SOMARUN" --lib "$LIB_A" -- /nonexistent/prog
expect_cannot_run "/nonexistent/prog: 127, said by the launcher" 127 "somarun: /nonexistent/prog: no such program"
run "$SOMARUN" --lib "$LIB_A" -- somarun-test-no-such-program
expect_cannot_run "program not in PATH: 127, said by the launcher" 127 \
  "somarun: somarun-test-no-such-program: no such program in PATH"
echo 'echo ran' >"$TMP/not-executable"
chmod 644 "$TMP/not-executable"
run "$SOMARUN" --lib "$LIB_A" -- "$TMP/not-executable"
expect_cannot_run "program not executable: 126, said by the launcher" 126 "somarun: $TMP/not-executable: not executable"
run "$SOMARUN" --lib "$LIB_A" -- "$TMP"
expect_cannot_run "a directory as program: 126, said by the launcher" 126 "somarun: $TMP: is a directory*"
run sh -c 'echo $$; exec "$0" --lib "$1" -- sh -c "echo \$\$"' "$SOMARUN" "$LIB_A"
if [ "$RC" = 0 ] && [ "$(wc -l <"$TMP/out")" = 2 ] && [ "$(sed -n 1p "$TMP/out")" = "$(sed -n 2p "$TMP/out")" ]; then
  pass "program replaces the launcher (same pid)"
else
  fail "program replaces the launcher (same pid)" "status $RC, output: $(short "$TMP/out")"
fi

# --- arguments reach the program intact -------------------------------------
# shellcheck disable=SC2016 # '$HOME' is meant literally
ARGS=("two words" "it's" 'say "hi"' "" "*" '$HOME' 'back\slash' $'line1\nline2' "-x" "--" "--stats"
  "--lib=/x" "  padded  " "tab	here" "a=b")
run "$SOMARUN" --lib "$LIB_A" -- "$PROBE" "${ARGS[@]}"
{
  printf 'ARGC=%d\n' "${#ARGS[@]}"
  for a in "${ARGS[@]}"; do printf 'ARG<%s>\n' "$a"; done
} >"$TMP/want"
sed -n '/^ARGC=/,$p' "$TMP/out" >"$TMP/got"
if [ "$RC" = 0 ] && cmp -s "$TMP/want" "$TMP/got"; then
  pass "arguments with spaces, quotes, newlines, dashes intact"
else
  fail "arguments with spaces, quotes, newlines, dashes intact" "status $RC, got: $(short "$TMP/got")"
fi
run "$SOMARUN" --lib "$LIB_A" -- sh -c 'printf "%s|" "$@"' prog "a b" "" "c'd"
if [ "$RC" = 0 ] && [ "$(cat "$TMP/out")" = "a b||c'd|" ]; then pass "arguments through sh -c"; else fail "arguments through sh -c" "got '$(cat "$TMP/out")'"; fi
mkdir -p "$TMP/pathprog"
cp "$PROBE" "$TMP/pathprog/soma-probe"
run env PATH="$TMP/pathprog:$PATH" "$SOMARUN" --lib "$LIB_A" --log info -- soma-probe x
expect_vars "PROGRAM looked up in PATH" "LD_PRELOAD=$LIB_A" "SOMA_LOG=info"

# --- usage errors -----------------------------------------------------------
run "$SOMARUN" --lib "$LIB_A" --bogus -- "$PROBE"
expect_error "unknown option" "*unknown option*--bogus*--help*"
run "$SOMARUN" --lib "$LIB_A" -x -- "$PROBE"
expect_error "unknown short option" "*unknown option*-x*--help*"
run "$SOMARUN" --lib "$LIB_A" --bogus=1 -- "$PROBE"
expect_error "unknown option=value" "*unknown option*--bogus*--help*"
run "$SOMARUN"
expect_error "no arguments at all" "*missing*--*PROGRAM*--help*"
run "$SOMARUN" --lib "$LIB_A" --stats
expect_error "options but no --" "*missing*--*PROGRAM*--help*"
run "$SOMARUN" --lib "$LIB_A" --
expect_error "missing PROGRAM after --" "*missing PROGRAM*--help*"
run "$SOMARUN" --lib "$LIB_A" -- ""
expect_error "empty PROGRAM" "*PROGRAM*empty*--help*"
run "$SOMARUN" --lib "$LIB_A" "$PROBE"
expect_error "PROGRAM without --" "*expected '--' before PROGRAM*--help*"
run "$SOMARUN" --trim
expect_error "--trim without a PID" "*--trim*needs a PID*--help*"
run "$SOMARUN" --trim 12x
expect_error "--trim with a PID that is not a number" "*--trim*needs a PID*12x*--help*"
run "$SOMARUN" --ps --all
expect_error "--ps with another word" "*--ps takes only --json*--help*"
run "$SOMARUN" --trim 1 extra
expect_error "--trim PID with another word" "*--trim PID takes only --json*--help*"
run "$SOMARUN" --snapshot x1
expect_error "--snapshot with a PID that is not a number" "*--snapshot*needs a PID*x1*--help*"
# No shim process has this pid (PID 1 is init): --trim says so, exit status 1.
run env TMPDIR="$TMP" "$SOMARUN" --trim 1
if [ "$RC" = 1 ] && grep -q "1: no shim process of this user" "$TMP/err"; then pass "--trim of a process not under the shim"; else fail "--trim of a process not under the shim" "status $RC: $(short "$TMP/err")"; fi
run "$SOMARUN" --ps --json
if [ "$RC" = 0 ] && ! grep -v '^{' "$TMP/out" | grep -q .; then pass "--ps --json: JSON lines only"; else fail "--ps --json: JSON lines only" "status $RC: $(short "$TMP/out")"; fi
run "$SOMARUN" --lib "$LIB_A" --threshold
expect_error "missing value at the end" "*--threshold*needs a value*--help*"
run "$SOMARUN" --lib "$LIB_A" --threshold -- "$PROBE"
expect_error "missing value before --" "*--threshold*needs a value*--help*"
run "$SOMARUN" --lib "$LIB_A" --threshold= -- "$PROBE"
expect_error "empty value with =" "*--threshold*needs a value*--help*"
run "$SOMARUN" --lib "$LIB_A" --trace --stats -- "$PROBE"
expect_error "missing value before another option" "*--trace*needs a value*--help*"
run "$SOMARUN" --lib "$LIB_A" --log "" -- "$PROBE"
expect_error "empty value" "*--log*needs a value*--help*"
run "$SOMARUN" --lib -- "$PROBE"
expect_error "missing value of --lib" "*--lib*needs a value*--help*"
run "$SOMARUN" --lib "$LIB_A" --stats= -- "$PROBE"
expect_error "empty --stats=" "*--stats=*--help*"
run "$SOMARUN" --lib "$LIB_A" --disable=1 -- "$PROBE"
expect_error "flag given a value" "*--disable*takes no value*--help*"
for opt in --pool --min-bytes --max-bytes --pending-free-limit --meminfo --passthrough-callers --log; do
  run "$SOMARUN" --lib "$LIB_A" "$opt"
  expect_error "missing value of $opt" "*$opt*needs a value*"
done

# --- help and version -------------------------------------------------------
for h in -h --help; do
  run "$SOMARUN" "$h"
  if [ "$RC" = 0 ] && [ ! -s "$TMP/err" ] && grep -q '^Usage: somarun \[OPTIONS\] -- PROGRAM' "$TMP/out"; then
    pass "$h prints usage to stdout, exit 0"
  else
    fail "$h prints usage to stdout, exit 0" "status $RC, stderr: $(short "$TMP/err")"
  fi
done
run "$SOMARUN" --lib "$LIB_A" --pool own --help -- "$PROBE"
if [ "$RC" = 0 ] && grep -q '^Usage:' "$TMP/out" && ! grep -q '^ARGC=' "$TMP/out"; then
  pass "--help after other options, program not run"
else
  fail "--help after other options, program not run" "status $RC"
fi
missing=""
for opt in --stats --trace --threshold --pool --min-bytes --max-bytes --free-sync --pending-free-limit \
  --legacy-cache --track-work --small-blocks --meminfo --passthrough-callers --log --disable --lib --help --version SOMASHIM_LIB; do
  "$SOMARUN" --help | grep -q -e "$opt" || missing="$missing $opt"
done
if [ -z "$missing" ]; then pass "usage names every option"; else fail "usage names every option" "missing:$missing"; fi
run "$SOMARUN" --version
cargo_version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n 1)
if [ "$RC" = 0 ] && [ "$(cat "$TMP/out")" = "somarun (somashim) $cargo_version" ]; then
  pass "--version matches Cargo.toml ($cargo_version)"
else
  fail "--version matches Cargo.toml ($cargo_version)" "status $RC, got '$(cat "$TMP/out")'"
fi

# --- shellcheck (where installed) -------------------------------------------
if command -v shellcheck >/dev/null 2>&1; then
  if shellcheck "$SOMARUN" "$INSTALL" "$0" >"$TMP/sc" 2>&1; then
    pass "shellcheck clean"
  else
    fail "shellcheck clean" "$(short "$TMP/sc")"
  fi
else
  echo "# shellcheck not installed: not run" >&2
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
