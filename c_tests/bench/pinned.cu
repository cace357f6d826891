/* Pinned host memory benchmark (scripts/bench.sh runs it three ways).
 *
 *   pinned real   cudaMallocHost / 4 KiB cudaMemcpyAsync / cudaFreeHost
 *                 (natively: "real"; under LD_PRELOAD=libsomashim.so: "shim")
 *   pinned pool   hand-written: a host memory pool (location host, release
 *                 threshold max, device access granted), cuMemAllocFromPoolAsync
 *                 on a stream and a wait for it (the CPU may then touch the
 *                 memory), the copy, cuMemFreeAsync on that stream
 *
 * For each size: host time of one (allocate, copy, free) iteration, median
 * after a warm-up. Then the bandwidth of 64 MiB host-to-device async copies
 * from memory of that mode (best of 3 rounds of 20 copies).
 *
 * Output lines: pinned <bytes> median_us <x> reps <n>
 *               bandwidth_h2d_64mib_gbps <x> */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../exit_on_error.h"

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static CUmemoryPool pool;
static cudaStream_t stream;
static int use_pool;

static void *take(size_t n) {
  if (!use_pool) {
    void *p = NULL;
    CK(cudaMallocHost(&p, n));
    return p;
  }
  CUdeviceptr d = 0;
  if (cuMemAllocFromPoolAsync(&d, n, pool, (CUstream)stream) != CUDA_SUCCESS) exit(1);
  if (cuStreamSynchronize((CUstream)stream) != CUDA_SUCCESS) exit(1);
  return (void *)(uintptr_t)d;
}
static void give(void *p) {
  if (!use_pool) CK(cudaFreeHost(p));
  else if (cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, (CUstream)stream) != CUDA_SUCCESS) exit(1);
}

int main(int argc, char **argv) {
  use_pool = argc > 1 && strcmp(argv[1], "pool") == 0;
  CK(cudaFree(NULL));
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (use_pool) {
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_HOST;
    if (cuMemPoolCreate(&pool, &pp) != CUDA_SUCCESS) return 1;
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (cuMemPoolSetAccess(pool, &a, 1) != CUDA_SUCCESS) return 1;
    cuuint64_t max = ~0ULL;
    if (cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max) != CUDA_SUCCESS) return 1;
  }
  void *dev = NULL;
  CK(cudaMalloc(&dev, 64 << 20));
  size_t sizes[] = {4 << 10, 1 << 20, 64 << 20, 256 << 20};
  for (int z = 0; z < 4; z++) {
    size_t n = sizes[z];
    int reps = n >= (64 << 20) && !use_pool ? 20 : 500, warm = 5;
    double *t = (double *)malloc(sizeof(double) * reps);
    for (int i = -warm; i < reps; i++) {
      double t0 = now_us();
      void *p = take(n);
      CK(cudaMemcpyAsync(dev, p, 4096, cudaMemcpyHostToDevice, stream));
      give(p);
      if (i >= 0) t[i] = now_us() - t0;
    }
    CK(cudaStreamSynchronize(stream));
    qsort(t, reps, sizeof *t, cmp);
    printf("pinned %zu median_us %.2f reps %d\n", n, t[reps / 2], reps);
    free(t);
  }
  size_t b = 64 << 20;
  void *h = take(b);
  memset(h, 1, b);
  double best = 0;
  for (int round = 0; round < 3; round++) {
    CK(cudaStreamSynchronize(stream));
    double t0 = now_us();
    for (int i = 0; i < 20; i++) CK(cudaMemcpyAsync(dev, h, b, cudaMemcpyHostToDevice, stream));
    CK(cudaStreamSynchronize(stream));
    double gbps = 20.0 * b / (now_us() - t0) / 1e3;
    if (gbps > best) best = gbps;
  }
  printf("bandwidth_h2d_64mib_gbps %.2f\n", best);
  give(h);
  CK(cudaStreamSynchronize(stream));
  return 0;
}
