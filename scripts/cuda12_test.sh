#!/usr/bin/env bash
# The shim under the CUDA 12 runtime, shared and static (c_tests/cuda12).
#
#   scripts/cuda12_test.sh path/to/libsomashim.so [CU12_DIR]
#
# CU12_DIR (default build/cu12) holds the unpacked nvidia-cuda-runtime-cu12
# wheel (`make cuda12-runtime` fetches it; a GPU machine without network gets
# it carried). Builds c_tests/cuda12/host_calls.c with gcc against
# libcudart.so.12 and libcudart_static.a, runs each natively and under the
# shim, compares the outputs (without '# ' lines), and requires the shim run's
# pointers to come from a pool. Ends with 'N passed, N failed, N skipped'.
set -uo pipefail
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")" "${@:2}"
cd "$(dirname "$0")/.." || exit 2
SHIM=${1:?usage: $0 path/to/libsomashim.so [CU12_DIR]}
CU12=$(readlink -f "${2:-build/cu12}")/nvidia/cuda_runtime
OUTDIR=build/cuda12
mkdir -p "$OUTDIR"
PASS=0 FAIL=0 SKIP=0
if [ ! -f "$CU12/lib/libcudart.so.12" ]; then
  echo "SKIP cuda12 (no CUDA 12 runtime at $CU12: run 'make cuda12-runtime')"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
fi
INC=(-I"$CU12/include")
cc -O2 "${INC[@]}" -o "$OUTDIR/host_calls.shared" c_tests/cuda12/host_calls.c \
  -L"$CU12/lib" -l:libcudart.so.12 -Wl,-rpath,"$CU12/lib" -ldl || exit 1
cc -O2 "${INC[@]}" -o "$OUTDIR/host_calls.static" c_tests/cuda12/host_calls.c \
  "$CU12/lib/libcudart_static.a" -ldl -lpthread -lrt || exit 1
pooled_of() { sed -n 's/^# pooled \([0-9][0-9]*\) of .*/\1/p' "$1"; }
for build in shared static; do
  bin=$OUTDIR/host_calls.$build
  "$bin" >"$OUTDIR/$build.native.out" 2>"$OUTDIR/$build.native.err"
  nrc=$?
  LD_PRELOAD=$SHIM "$bin" >"$OUTDIR/$build.shim.out" 2>"$OUTDIR/$build.shim.err"
  src=$?
  reasons=()
  [ "$nrc" = 0 ] || reasons+=("native exit $nrc")
  [ "$src" = 0 ] || reasons+=("shim exit $src")
  diff <(grep -v '^# ' "$OUTDIR/$build.native.out") <(grep -v '^# ' "$OUTDIR/$build.shim.out") \
    >"$OUTDIR/$build.diff" || reasons+=("stdout differs: $(head -c 400 "$OUTDIR/$build.diff")")
  [ "$(pooled_of "$OUTDIR/$build.native.out")" = 0 ] || reasons+=("native pointers from a pool")
  sp=$(pooled_of "$OUTDIR/$build.shim.out")
  [ "${sp:-0}" -gt 0 ] || reasons+=("no pooled pointer under the shim")
  version=$(sed -n 's/^# runtime //p' "$OUTDIR/$build.native.out")
  if [ ${#reasons[@]} -eq 0 ]; then
    PASS=$((PASS + 1))
    echo "PASS cuda12:$build (runtime $version, pooled $sp)"
  else
    FAIL=$((FAIL + 1))
    echo "FAIL cuda12:$build: $(IFS=';'; echo "${reasons[*]}")"
    tail -n 5 "$OUTDIR/$build.native.err" "$OUTDIR/$build.shim.err"
  fi
done
echo "$PASS passed, $FAIL failed, $SKIP skipped"
[ "$FAIL" = 0 ]
