// Quick smoke check of the shim: pooled pointers, timing, basic reuse ordering.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
static double now_us() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void fill(int *p, int n, int v) { for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = v; }
__global__ void spin_check(const int *p, int n, int v, long long cycles, int *bad) {
  long long s = clock64();
  while (clock64() - s < cycles) for (int i = threadIdx.x; i < n; i += blockDim.x) if (p[i] != v) atomicAdd(bad, 1);
}
int main() {
  cudaFree(0);
  int *bad; cudaMallocManaged(&bad, 4); *bad = 0;
  void *p; cudaError_t r = cudaMalloc(&p, 1 << 20);
  CUmemoryPool h; CUresult cr = cuPointerGetAttribute(&h, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)p);
  printf("alloc rc=%d cr=%d handle=%p\n", r, cr, (void*)h);
  cudaFree(p);
  for (size_t sz : {(size_t)256, (size_t)1 << 20, (size_t)1 << 30}) {
    int N = sz >= (1 << 30) ? 200 : 5000;
    for (int i = 0; i < 50; i++) { cudaMalloc(&p, sz); fill<<<1, 32>>>((int *)p, 8, i); cudaFree(p); }
    cudaDeviceSynchronize();
    double t0 = now_us();
    for (int i = 0; i < N; i++) { cudaMalloc(&p, sz); fill<<<1, 32>>>((int *)p, 8, i); cudaFree(p); }
    cudaDeviceSynchronize();
    printf("size %zu: %.2f us/pair\n", sz, (now_us() - t0) / N);
  }
  cudaStream_t s1, s2; cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking); cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  int reused = 0; int n = 1 << 18;
  for (int it = 0; it < 100; it++) {
    int *a; cudaMalloc(&a, n * 4); fill<<<1, 1024, 0, s1>>>(a, n, 7);
    spin_check<<<1, 1024, 0, s1>>>(a, n, 7, 200000, bad);
    cudaFree(a);
    int *b; cudaMalloc(&b, n * 4); if (b == a) reused++;
    fill<<<1, 1024, 0, s2>>>(b, n, 9);
    cudaStreamSynchronize(s2);
    cudaFree(b);
  }
  cudaDeviceSynchronize();
  printf("race: corruptions=%d reused=%d last=%d\n", *bad, reused, cudaGetLastError());
  size_t fr, tot; cudaMemGetInfo(&fr, &tot); printf("used after: %zu MiB\n", (tot - fr) >> 20);
  return 0;
}
