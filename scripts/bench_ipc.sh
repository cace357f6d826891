#!/usr/bin/env bash
# CUDA IPC benchmark: c_tests/bench/ipc.cu. The allocation speed of a
# shareable pool against a plain one (one process, alternating), then the
# time of cudaIpcGetMemHandle, cudaIpcOpenMemHandle and cudaIpcCloseMemHandle
# natively (the real calls, on cudaMalloc memory) and under the shim (its
# handles, on pool memory).
#   scripts/bench_ipc.sh path/to/libsomashim.so
set -euo pipefail
[ -n "${1:-}" ] && [ -e "$1" ] && set -- "$(readlink -f "$1")"
cd "$(dirname "$0")/.."
SHIM=${1:?usage: $0 path/to/libsomashim.so}
BUILD=build/bench
mkdir -p "$BUILD"
"${NVCC:-nvcc}" -O2 -arch="${GPU_ARCH:-sm_90}" -cudart shared -o "$BUILD/ipc" c_tests/bench/ipc.cu -lcuda
echo "== pools (driver API, no shim)"
"$BUILD/ipc" pools
for run in 1 2 3; do
  echo "== handles, real calls (run $run)"
  "$BUILD/ipc" handles
  echo "== handles, under the shim (run $run)"
  LD_PRELOAD="$SHIM" "$BUILD/ipc" handles
done
