/* A small "legacy" CUDA program, the kind somashim is for: it allocates with
 * plain cudaMalloc, runs a small kernel on the default stream, and frees with
 * cudaFree, in a loop. Built with `nvcc -cudart shared` so that the preloaded
 * shim can take its cudaMalloc/cudaFree. It prints the time of each phase and
 * a checksum (which must be the same with and without the shim).
 *
 *   legacy_loop [iterations at 1 MiB]     (default 20000) */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../driver_past_shim.h"
#include "../exit_on_error.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* A small kernel: writes a value derived from the iteration into a few
 * elements and adds them into a running checksum on the device. */
__global__ void step(unsigned *buf, size_t n, unsigned i, unsigned long long *sum) {
  size_t j = (size_t)threadIdx.x * (n / blockDim.x);
  buf[j] = i * 2654435761u + threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(sum, (unsigned long long)buf[0] + buf[(n / blockDim.x) * (blockDim.x - 1)]);
}

int main(int argc, char **argv) {
  long iters_1m = argc > 1 ? atol(argv[1]) : 20000;
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
  CK(cudaFree(0)); /* create the context outside the timed part */
  unsigned long long *sum = NULL;
  CK(cudaMalloc(&sum, sizeof *sum));
  CK(cudaMemset(sum, 0, sizeof *sum));
  CK(cudaDeviceSynchronize());

  long pooled = 0, allocs = 0;
  double total = 0;
  for (size_t ph = 0; ph < sizeof phases / sizeof phases[0]; ph++) {
    size_t n = phases[ph].bytes / 4;
    double t0 = now_ms();
    for (long i = 0; i < phases[ph].iters; i++) {
      unsigned *buf = NULL;
      CK(cudaMalloc(&buf, phases[ph].bytes));
      step<<<1, 64>>>(buf, n, (unsigned)i, sum);
      CK(cudaGetLastError());
      if (i == 0) { /* diagnostics, outside the loop's steady state */
        allocs++;
        pooled += driver_says_pooled((uint64_t)(uintptr_t)buf);
      }
      CK(cudaFree(buf));
    }
    CK(cudaDeviceSynchronize());
    double ms = now_ms() - t0;
    total += ms;
    printf("phase %-8s iterations %6ld  time_ms %9.2f  us_per_iteration %8.2f\n", phases[ph].name,
           phases[ph].iters, ms, ms * 1e3 / (phases[ph].iters ? phases[ph].iters : 1));
  }
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, sum, sizeof h, cudaMemcpyDeviceToHost));
  CK(cudaFree(sum));
  printf("checksum %llu\n", h);
  printf("pool_backed_allocations %ld of %ld sampled\n", pooled, allocs);
  printf("total_ms %.2f\n", total);
  return 0;
}
