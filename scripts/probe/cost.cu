// Cost of each step of the shim's scheme (driver API, no shim), 1 MiB churn.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
static double now_us() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void touch(int *p) { if (threadIdx.x == 0) p[0] = 1; }
enum { ALLOC = 1, FREE = 2, RECORD = 4, QUERY = 8, LAUNCH = 16 };
static CUmemoryPool pool; static CUstream A; static CUevent ev[64];
static void run(const char *name, int steps, int iters) {
  CUdeviceptr prev = 0, p = 0; double t0 = 0;
  cuMemAllocFromPoolAsync(&p, 1 << 20, pool, A);
  for (int i = 0; i < iters + 200; i++) {
    if (i == 200) { cuCtxSynchronize(); t0 = now_us(); }
    if (steps & QUERY) cuEventQuery(ev[(i + 63) % 64]);
    if (steps & FREE && prev) { cuMemFreeAsync(prev, A); prev = 0; }
    if (steps & ALLOC) cuMemAllocFromPoolAsync(&p, 1 << 20, pool, A);
    if (steps & LAUNCH) touch<<<1, 32>>>((int *)p);
    if (steps & RECORD) cuEventRecord(ev[i % 64], CU_STREAM_LEGACY);
    if (steps & ALLOC) prev = p;
  }
  cuCtxSynchronize();
  printf("%-40s %6.3f us/iter\n", name, (now_us() - t0) / iters);
}
int main() {
  cudaFree(0);
  CUmemPoolProps pp = {}; pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE; pp.location.id = 0;
  cuMemPoolCreate(&pool, &pp); cuuint64_t th = ~0ull; cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &th);
  cuStreamCreate(&A, CU_STREAM_NON_BLOCKING);
  for (int i = 0; i < 64; i++) cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING);
  int N = 20000;
  run("launch only", LAUNCH, N);
  run("alloc+free (idle stream)", ALLOC | FREE, N);
  run("launch+alloc+free", LAUNCH | ALLOC | FREE, N);
  run("launch+record(legacy)", LAUNCH | RECORD, N);
  run("launch+record+query", LAUNCH | RECORD | QUERY, N);
  run("launch+alloc+free+record+query (shim)", LAUNCH | ALLOC | FREE | RECORD | QUERY, N);
  run("record(legacy) only", RECORD, N);
  run("query only", QUERY, N);
  // Native async pair on the legacy stream, for reference.
  CUmemoryPool dp; cuDeviceGetDefaultMemPool(&dp, 0); cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &th);
  double t0 = 0;
  for (int i = 0; i < N + 200; i++) { if (i == 200) { cudaDeviceSynchronize(); t0 = now_us(); }
    void *q; cudaMallocAsync(&q, 1 << 20, 0); touch<<<1, 32>>>((int *)q); cudaFreeAsync(q, 0); }
  cudaDeviceSynchronize(); printf("%-40s %6.3f us/iter\n", "native cudaMallocAsync pair (legacy)", (now_us() - t0) / N);
  for (int i = 0; i < N + 200; i++) { if (i == 200) { cudaDeviceSynchronize(); t0 = now_us(); }
    void *q; cudaMallocAsync(&q, 1 << 20, 0); cudaFreeAsync(q, 0); }
  cudaDeviceSynchronize(); printf("%-40s %6.3f us/iter\n", "native async pair, no launch (legacy)", (now_us() - t0) / N);
  return 0;
}
