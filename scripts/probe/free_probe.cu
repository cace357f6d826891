// What a driver-level free of an invalid address returns during captures, and
// whether it invalidates the capture (candidate probe for the driver door).
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
__global__ void k() {}
struct arg { CUdeviceptr p; CUresult r; CUcontext ctx; };
static void *other(void *a) { arg *x = (arg *)a; x->r = cuMemFree(x->p); return 0; }
int main() {
  cudaFree(0);
  CUcontext ctx; cuCtxGetCurrent(&ctx);
  const char *modes[] = {"global", "thread_local", "relaxed"};
  CUdeviceptr cands[] = {0, 0x10, 0x7f0000000000ull};
  for (int m = 0; m < 3; m++) for (int c = 0; c < 3; c++) for (int th = 0; th < 2; th++) {
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaStreamBeginCapture(s, (cudaStreamCaptureMode)m); k<<<1,1,0,s>>>();
    arg a = {cands[c], CUDA_SUCCESS, ctx};
    if (th) { pthread_t t; pthread_create(&t, 0, other, &a); pthread_join(t, 0); } else a.r = cuMemFree(a.p);
    cudaStreamCaptureStatus st; cudaStreamIsCapturing(s, &st);
    cudaGraph_t g; cudaError_t e = cudaStreamEndCapture(s, &g); cudaGetLastError();
    printf("mode=%-12s cuMemFree(%#llx) from %s: rc=%d status_after=%d end=%d\n", modes[m], (unsigned long long)cands[c], th ? "other " : "capturing", a.r, st, e);
    cudaStreamDestroy(s);
  }
  return 0;
}
