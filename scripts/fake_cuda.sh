# shellcheck shell=bash
# Sourced by cpu_test.sh and demo.sh: the CUDA test double (c_tests/fake) and
# programs built against it with gcc and the real CUDA headers (`make headers`).
# Needs ROOT (the source tree), INC (the headers) and CC.
# shellcheck disable=SC2034 # FAKE_CFLAGS is for the sourcing script

# The compiler flags for the double and the programs built against it.
FAKE_CFLAGS=(-std=gnu11 -O1 -g -Wall -Wextra -I"$INC" -idirafter "$ROOT/c_tests/fake/compat" -I"$ROOT/c_tests/fake")

# build_fake_cuda DIR: DIR/libcuda.so.1 and DIR/libcudart.so.13 (and their .so
# links); the compiler's messages on stderr, non-zero status on failure.
# -Bsymbolic: like the real libraries, each binds its own functions
# internally (the driver's cuGetProcAddress hands out its own entry points,
# whatever a preload defines).
build_fake_cuda() {
  local dir=$1
  "$CC" "${FAKE_CFLAGS[@]}" -o "$dir/libcuda.so.1" -fPIC -shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic \
    "$ROOT/c_tests/fake/fake_driver.c" -lpthread &&
    ln -sf libcuda.so.1 "$dir/libcuda.so" &&
    "$CC" "${FAKE_CFLAGS[@]}" -o "$dir/libcudart.so.13" -fPIC -shared -Wl,-soname,libcudart.so.13 -Wl,-Bsymbolic \
      "$ROOT/c_tests/fake/fake_runtime.c" -L"$dir" -lcuda -ldl -lpthread &&
    ln -sf libcudart.so.13 "$dir/libcudart.so"
}
