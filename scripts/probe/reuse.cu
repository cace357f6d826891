// How a pool decides opportunistic reuse across streams, and what each step of the
// shim's scheme costs. Driver API, no shim.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
static double now_us() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void touch(int *p) { if (threadIdx.x == 0) p[0] = 1; }
#define CK(x) do { CUresult r_ = (x); if (r_) { printf("%s:%d %s -> %d\n", __FILE__, __LINE__, #x, r_); return 1; } } while (0)

int run(int variant, size_t size, int iters) {
  CUmemoryPool pool; CUmemPoolProps pp = {}; pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE; pp.location.id = 0;
  CK(cuMemPoolCreate(&pool, &pp));
  cuuint64_t th = ~0ull; CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &th));
  int zero = 0, one = 1;
  CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &zero));
  CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &one));
  CUstream A, F; CK(cuStreamCreate(&A, CU_STREAM_NON_BLOCKING)); CK(cuStreamCreate(&F, CU_STREAM_NON_BLOCKING));
  CUevent scratch, done[4096]; CK(cuEventCreate(&scratch, CU_EVENT_DISABLE_TIMING));
  for (int i = 0; i < 4096; i++) CK(cuEventCreate(&done[i], CU_EVENT_DISABLE_TIMING));
  double t0 = 0; int reused = 0; CUdeviceptr prev = 0;
  for (int i = 0; i < iters + 100; i++) {
    if (i == 100) { cuCtxSynchronize(); t0 = now_us(); reused = 0; }
    if (i > 0) {
      CUevent d = done[(i - 1) % 4096];
      if (variant == 1) cuStreamQuery(F);
      if (variant == 2) cuEventQuery(d);
      if (variant == 3) cuEventSynchronize(d);
    }
    CUdeviceptr p;
    CUstream as = variant == 4 ? F : A;
    CK(cuMemAllocFromPoolAsync(&p, size, pool, as));
    if (p == prev) reused++;
    prev = p;
    touch<<<1, 32>>>((int *)p);
    if (variant != 5) { CK(cuEventRecord(scratch, CU_STREAM_LEGACY)); CK(cuStreamWaitEvent(F, scratch, 0)); }
    CK(cuMemFreeAsync(p, F));
    if (variant != 5) CK(cuEventRecord(done[i % 4096], F));
  }
  CK(cuCtxSynchronize());
  double us = (now_us() - t0) / iters;
  cuuint64_t hi = 0; cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &hi);
  const char *names[] = {"nothing", "cuStreamQuery(F)", "cuEventQuery(done)", "cuEventSynchronize(done)", "alloc on F (same stream)", "no events (free on F w/o waits)"};
  printf("size %9zu variant %-34s %7.2f us/iter  reused %5d/%d  reserved_high %8.1f MiB\n", size, names[variant], us, reused, iters, hi / 1048576.0);
  cuStreamDestroy(A); cuStreamDestroy(F); cuMemPoolDestroy(pool);
  return 0;
}

int main() {
  cudaFree(0);
  for (size_t size : {(size_t)1 << 20, (size_t)64 << 20}) for (int v = 0; v < 6; v++) if (run(v, size, 3000)) return 1;
  // Native async pair for reference: one stream (legacy), default-like pool with max threshold.
  CUmemoryPool pool; cuDeviceGetDefaultMemPool(&pool, 0); cuuint64_t th = ~0ull; cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &th);
  for (int i = 0; i < 3100; i++) { static double t0; if (i == 100) { cudaDeviceSynchronize(); t0 = now_us(); }
    void *p; cudaMallocAsync(&p, 1 << 20, 0); touch<<<1, 32>>>((int *)p); cudaFreeAsync(p, 0);
    if (i == 3099) { cudaDeviceSynchronize(); printf("native async pair on legacy, 1 MiB: %.2f us/iter\n", (now_us() - t0) / 3000); } }
  // Cost of single calls.
  CUstream F; cuStreamCreate(&F, CU_STREAM_NON_BLOCKING); CUevent e; cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  double t0 = now_us(); for (int i = 0; i < 20000; i++) touch<<<1, 32>>>((int *)0); cudaDeviceSynchronize();
  printf("kernel launch: %.3f us (incl. drain)\n", (now_us() - t0) / 20000);
  t0 = now_us(); for (int i = 0; i < 20000; i++) cuEventRecord(e, F); printf("cuEventRecord(F): %.3f us\n", (now_us() - t0) / 20000);
  int d; t0 = now_us(); for (int i = 0; i < 20000; i++) cuCtxGetDevice(&d); printf("cuCtxGetDevice: %.3f us\n", (now_us() - t0) / 20000);
  return 0;
}
