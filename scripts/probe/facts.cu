// Probe of real CUDA behaviour the shim must reproduce (run natively, no shim).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <pthread.h>
#include <time.h>

#define P(...) do { printf(__VA_ARGS__); fflush(stdout); } while (0)
static const char *modes[] = {"global", "thread_local", "relaxed"};
static double now_us() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void spin(long long cycles) { long long s = clock64(); while (clock64() - s < cycles) {} }

static void capture_case(int mode, unsigned sflags, int op) {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, sflags);
  void *pre = 0; cudaMalloc(&pre, 1 << 20);
  void *apre = 0; cudaMallocAsync(&apre, 1 << 20, s); cudaStreamSynchronize(s);
  cudaGetLastError();
  cudaError_t b = cudaStreamBeginCapture(s, (cudaStreamCaptureMode)mode);
  spin<<<1, 1, 0, s>>>(10);
  void *p = 0; cudaError_t r = cudaSuccess;
  const char *opn = "";
  if (op == 0) { opn = "cudaMalloc"; r = cudaMalloc(&p, 4096); }
  if (op == 1) { opn = "cudaFree(cudaMalloc ptr)"; r = cudaFree(pre); }
  if (op == 2) { opn = "cudaFree(cudaMallocAsync ptr)"; r = cudaFree(apre); }
  if (op == 3) { opn = "cudaFree(NULL)"; r = cudaFree(0); }
  if (op == 4) { opn = "cudaEventRecord(legacy)"; cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); r = cudaEventRecord(e, 0); }
  if (op == 5) { opn = "cuEventRecord(own nonblocking stream)+wait"; cudaStream_t o; cudaStreamCreateWithFlags(&o, cudaStreamNonBlocking); cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); r = cudaEventRecord(e, o); if (!r) r = cudaStreamWaitEvent(o, e, 0); }
  if (op == 6) { opn = "cuMemAllocFromPoolAsync(own nonblocking stream)"; cudaStream_t o; cudaStreamCreateWithFlags(&o, cudaStreamNonBlocking); cudaMemPool_t pool; cudaDeviceGetDefaultMemPool(&pool, 0); r = cudaMallocFromPoolAsync(&p, 4096, pool, o); }
  cudaError_t le = cudaGetLastError();
  cudaStreamCaptureStatus st; cudaStreamIsCapturing(s, &st);
  cudaGraph_t g = 0; cudaError_t e = cudaStreamEndCapture(s, &g);
  cudaError_t le2 = cudaGetLastError();
  P("capture mode=%s stream=%s op=%-45s begin=%d rc=%d p=%p last=%d status_after=%d end=%d last_after_end=%d\n",
    modes[mode], sflags ? "nonblocking" : "blocking", opn, b, r, p, le, st, e, le2);
  cudaDeviceSynchronize(); cudaGetLastError();
}

struct other { int op; cudaError_t r; cudaError_t le; };
static void *other_thread(void *a) {
  other *o = (other *)a; void *p = 0;
  if (o->op == 0) o->r = cudaMalloc(&p, 4096); else { void *q; cudaMalloc(&q, 4096); cudaGetLastError(); o->r = cudaFree(q); }
  o->le = cudaGetLastError(); return 0;
}

int main() {
  cudaFree(0);
  int pools = -1; cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0);
  P("pools_supported=%d\n", pools);
  for (int mode = 0; mode < 3; mode++)
    for (int f = 0; f < 2; f++)
      for (int op = 0; op < 7; op++) capture_case(mode, f ? cudaStreamNonBlocking : cudaStreamDefault, op);
  for (int mode = 0; mode < 3; mode++) for (int op = 0; op < 2; op++) {
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaStreamBeginCapture(s, (cudaStreamCaptureMode)mode); spin<<<1,1,0,s>>>(10);
    other o = {op}; pthread_t t; pthread_create(&t, 0, other_thread, &o); pthread_join(t, 0);
    cudaGraph_t g; cudaError_t e = cudaStreamEndCapture(s, &g);
    P("other-thread during %s capture: %s rc=%d last=%d end=%d\n", modes[mode], op ? "cudaFree" : "cudaMalloc", o.r, o.le, e);
    cudaGetLastError();
  }
  // Pool pointer edge cases through the real cudaFree.
  cudaMemPool_t pool; cudaMemPoolProps pp = {}; pp.allocType = cudaMemAllocationTypePinned; pp.location.type = cudaMemLocationTypeDevice; pp.location.id = 0;
  cudaMemPoolCreate(&pool, &pp);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  char *a = 0; cudaMallocFromPoolAsync((void **)&a, 1 << 20, pool, s); cudaStreamSynchronize(s);
  cudaError_t r = cudaFree(a + 256); P("real cudaFree(interior of pool ptr) rc=%d last=%d\n", r, cudaGetLastError());
  CUmemoryPool ph = 0; CUresult cr = cuPointerGetAttribute(&ph, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)(a + 256));
  P("interior MEMPOOL_HANDLE cr=%d match=%d\n", cr, ph == (CUmemoryPool)pool);
  r = cudaFreeAsync(a, s); cudaStreamSynchronize(s);
  cr = cuPointerGetAttribute(&ph, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)a);
  P("freed-block MEMPOOL_HANDLE cr=%d\n", cr);
  r = cudaFree(a); P("real cudaFree(freed pool ptr) rc=%d last=%d\n", r, cudaGetLastError());
  int x; r = cudaFree(&x); P("real cudaFree(host ptr) rc=%d last=%d\n", r, cudaGetLastError());
  void *m; cudaMalloc(&m, 4096); cudaFree(m); r = cudaFree(m); P("real double cudaFree rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaMalloc(0, 16); P("cudaMalloc(NULL) rc=%d last=%d\n", r, cudaGetLastError());
  void *z = (void *)1; r = cudaMalloc(&z, 0); P("cudaMalloc size0 rc=%d p=%p last=%d\n", r, z, cudaGetLastError());
  z = (void *)1; r = cudaMalloc(&z, (size_t)1 << 50); P("cudaMalloc huge rc=%d p=%p last=%d last2=%d\n", r, z, cudaGetLastError(), cudaGetLastError());
  z = (void *)1; r = cudaMallocFromPoolAsync(&z, (size_t)1 << 50, pool, s); P("MallocFromPoolAsync huge rc=%d p=%p last=%d\n", r, z, cudaGetLastError());
  CUdeviceptr dz = 1; cr = cuMemAllocFromPoolAsync(&dz, (size_t)1 << 50, (CUmemoryPool)pool, (CUstream)s); P("cuMemAllocFromPoolAsync huge cr=%d p=%llx rt_last=%d\n", cr, dz, cudaGetLastError());
  // Cost of the driver calls the free path uses.
  CUevent ev; cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  CUstream fs; cuStreamCreate(&fs, CU_STREAM_NON_BLOCKING);
  int N = 20000; double t0 = now_us();
  for (int i = 0; i < N; i++) { cuEventRecord(ev, CU_STREAM_LEGACY); cuStreamWaitEvent(fs, ev, 0); }
  double t1 = now_us(); P("legacy record+wait: %.3f us\n", (t1 - t0) / N);
  t0 = now_us();
  for (int i = 0; i < N; i++) { cuEventRecord(ev, (CUstream)s); cuStreamWaitEvent(fs, ev, 0); }
  t1 = now_us(); P("nonblocking record+wait: %.3f us\n", (t1 - t0) / N);
  t0 = now_us();
  for (int i = 0; i < N; i++) { CUresult q = cuEventQuery(ev); (void)q; }
  t1 = now_us(); P("event query: %.3f us\n", (t1 - t0) / N);
  t0 = now_us();
  for (int i = 0; i < N; i++) { CUcontext c; cuCtxGetCurrent(&c); }
  t1 = now_us(); P("cuCtxGetCurrent: %.3f us\n", (t1 - t0) / N);
  cuStreamSynchronize(fs); t0 = now_us();
  for (int i = 0; i < N; i++) { cuStreamSynchronize(fs); }
  t1 = now_us(); P("cuStreamSynchronize(idle): %.3f us\n", (t1 - t0) / N);
  // Does cudaDeviceReset destroy a created pool?
  cudaDeviceReset();
  cudaFree(0);
  cuuint64_t v = 0; cr = cuMemPoolGetAttribute((CUmemoryPool)pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v);
  P("after reset: created pool attr cr=%d\n", cr);
  return 0;
}
