/* The demo's legacy program for machines without a GPU (`make demo` there):
 * plain cudaMalloc, work on the default stream, cudaFree, in a loop, as in
 * legacy_loop.cu, but built with gcc against the CUDA test double
 * (c_tests/fake), whose "work" is fakecuda_launch. It prints how many of its
 * blocks came from a memory pool (none natively; all under the shim).
 *
 *   legacy_loop_fake [iterations at 1 MiB]     (default 2000) */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "../exit_on_error.h"
#include "fakecuda.h"

int main(int argc, char **argv) {
  long iters_1m = argc > 1 ? atol(argv[1]) : 2000;
  struct {
    size_t bytes;
    long iters;
    const char *name;
  } phases[] = {
      {1 << 20, iters_1m, "1 MiB"},
      {256, iters_1m / 4, "256 B"},
      {64 << 10, iters_1m / 4, "64 KiB"},
      {16 << 20, iters_1m / 10, "16 MiB"},
      {256 << 20, iters_1m / 40, "256 MiB"},
  };
  CK(cudaFree(0));
  long pooled = 0, allocs = 0;
  for (size_t ph = 0; ph < sizeof phases / sizeof phases[0]; ph++) {
    for (long i = 0; i < phases[ph].iters; i++) {
      void *buf = NULL;
      CK(cudaMalloc(&buf, phases[ph].bytes));
      if (fakecuda_launch(NULL, buf) != CUDA_SUCCESS) {
        fprintf(stderr, "work on a fresh block failed\n");
        return 1;
      }
      struct fakecuda_ptr_info info;
      allocs++;
      pooled += fakecuda_ptr_info(buf, &info) && info.kind == FAKECUDA_POOL;
      CK(cudaFree(buf));
    }
    printf("phase %-8s iterations %6ld\n", phases[ph].name, phases[ph].iters);
  }
  CK(cudaDeviceSynchronize());
  printf("pool_backed_allocations %ld of %ld\n", pooled, allocs);
  return 0;
}
