// Does querying a freshly recorded event cost a flush of batched work?
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
static double now_us() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void touch(int *p) { if (threadIdx.x == 0 && p) p[0] = 1; }
int main() {
  cudaFree(0);
  CUevent ev[64]; for (int i = 0; i < 64; i++) cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING);
  CUcontext ctx; cuCtxGetCurrent(&ctx);
  const char *names[] = {"launch", "launch+record", "launch+record+query(this)", "launch+record+query(prev)", "launch+record+query(prev-4)", "launch+record+2x query(prev)", "launch+cuCtxGetId"};
  for (int v = 0; v < 7; v++) {
    int N = 20000; double t0 = 0;
    for (int i = 0; i < N + 200; i++) {
      if (i == 200) { cudaDeviceSynchronize(); t0 = now_us(); }
      touch<<<1, 32>>>(0);
      if (v >= 1 && v <= 5) cuEventRecord(ev[i % 64], CU_STREAM_LEGACY);
      if (v == 2) cuEventQuery(ev[i % 64]);
      if (v == 3 || v == 5) cuEventQuery(ev[(i + 63) % 64]);
      if (v == 5) cuEventQuery(ev[(i + 63) % 64]);
      if (v == 4) cuEventQuery(ev[(i + 60) % 64]);
      if (v == 6) { unsigned long long id; cuCtxGetId(ctx, &id); }
    }
    double t = now_us() - t0; cudaDeviceSynchronize();
    printf("%-32s %6.3f us/iter\n", names[v], t / N);
  }
  return 0;
}
