// Probe (natively, no shim): pinned host memory from a host memory pool
// (cuMemPoolCreate, location type host) against cudaMallocHost/cudaHostAlloc:
// what the pointer queries answer, whether kernels reach it, what cudaFreeHost
// returns on bad pointers, copy bandwidth, and the cost of allocate + free.
//   host_pool            everything but the kernel checks
//   host_pool kernel N   a kernel writes host-pool memory; N=1 after
//                        cuMemPoolSetAccess (read/write for device 0), N=0 without
//   host_pool freehost_pool   cudaFreeHost of a host-pool pointer, then its fate
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>

#define P(...) do { printf(__VA_ARGS__); fflush(stdout); } while (0)
static double now_us() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void fill(int *p, int n, int v) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = v + i; }

static CUmemoryPool make_host_pool(bool grant) {
  CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
  pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  pp.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  pp.location.type = CU_MEM_LOCATION_TYPE_HOST;
  pp.location.id = 0;
  CUmemoryPool pool = 0;
  CUresult r = cuMemPoolCreate(&pool, &pp);
  P("cuMemPoolCreate(host) rc=%d\n", r);
  if (r) return 0;
  cuuint64_t max = ~0ULL;
  r = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max);
  P("set release threshold rc=%d\n", r);
  CUmemLocation dev; dev.type = CU_MEM_LOCATION_TYPE_DEVICE; dev.id = 0;
  CUmemAccess_flags f = (CUmemAccess_flags)-1;
  r = cuMemPoolGetAccess(&f, pool, &dev);
  P("cuMemPoolGetAccess(device 0) before grant rc=%d flags=%d\n", r, (int)f);
  CUmemLocation host; host.type = CU_MEM_LOCATION_TYPE_HOST; host.id = 0;
  r = cuMemPoolGetAccess(&f, pool, &host);
  P("cuMemPoolGetAccess(host) rc=%d flags=%d\n", r, (int)f);
  if (grant) {
    CUmemAccessDesc d; d.location = dev; d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cuMemPoolSetAccess(pool, &d, 1);
    f = (CUmemAccess_flags)-1;
    CUresult g = cuMemPoolGetAccess(&f, pool, &dev);
    P("cuMemPoolSetAccess(device 0, rw) rc=%d; get rc=%d flags=%d\n", r, g, (int)f);
  }
  return pool;
}

static void *pool_alloc(CUmemoryPool pool, size_t n, CUstream s) {
  CUdeviceptr d = 0;
  CUresult r = cuMemAllocFromPoolAsync(&d, n, pool, s);
  if (r) { P("cuMemAllocFromPoolAsync rc=%d\n", r); return 0; }
  cuStreamSynchronize(s);
  return (void *)d;
}

static void queries(const char *what, void *p) {
  cudaPointerAttributes a; memset(&a, 0x5a, sizeof a);
  cudaError_t r = cudaPointerGetAttributes(&a, p);
  cudaError_t le = cudaGetLastError();
  P("%-26s cudaPointerGetAttributes rc=%d last=%d type=%d device=%d devPtr%s hostPtr%s\n", what, r, le,
    (int)a.type, a.device, a.devicePointer == p ? "==p" : (a.devicePointer ? "!=p" : "=NULL"),
    a.hostPointer == p ? "==p" : (a.hostPointer ? "!=p" : "=NULL"));
  void *dp = (void *)1;
  r = cudaHostGetDevicePointer(&dp, p, 0); le = cudaGetLastError();
  P("%-26s cudaHostGetDevicePointer rc=%d last=%d dptr%s\n", what, r, le, dp == p ? "==p" : (dp ? "!=p" : "=NULL"));
  unsigned fl = 0xdead;
  r = cudaHostGetFlags(&fl, p); le = cudaGetLastError();
  P("%-26s cudaHostGetFlags rc=%d last=%d flags=0x%x\n", what, r, le, fl);
  char *q = (char *)p + 100;
  memset(&a, 0x5a, sizeof a);
  r = cudaPointerGetAttributes(&a, q); le = cudaGetLastError();
  dp = (void *)1; cudaError_t r2 = cudaHostGetDevicePointer(&dp, q, 0); cudaError_t le2 = cudaGetLastError();
  fl = 0xdead; cudaError_t r3 = cudaHostGetFlags(&fl, q); cudaGetLastError();
  P("%-26s interior+100: attrs rc=%d last=%d type=%d devPtr%s hostPtr%s; getDevPtr rc=%d last=%d dptr%s; flags rc=%d 0x%x\n", what, r, le,
    (int)a.type, a.devicePointer == q ? "==q" : (a.devicePointer ? "!=q" : "=NULL"), a.hostPointer == q ? "==q" : (a.hostPointer ? "!=q" : "=NULL"),
    r2, le2, dp == q ? "==q" : (dp ? "!=q" : "=NULL"), r3, fl);
  CUdeviceptr d = (CUdeviceptr)p;
  unsigned mt = 0; CUresult c1 = cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d);
  CUmemoryPool mp = 0; CUresult c2 = cuPointerGetAttribute(&mp, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, d);
  CUdeviceptr ddp = 0; CUresult c3 = cuPointerGetAttribute(&ddp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, d);
  void *hp = 0; CUresult c4 = cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, d);
  int ord = -9; CUresult c5 = cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d);
  CUcontext ctx = 0; CUresult c6 = cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, d);
  int mapped = -9; CUresult c7 = cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, d);
  size_t rs = 0; CUresult c8 = cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d);
  unsigned long long aflags = 0; CUresult c9 = cuPointerGetAttribute(&aflags, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, d);
  int ipc = -9; CUresult c10 = cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, d);
  P("%-26s cuPointerGetAttribute MEMORY_TYPE rc=%d %u; MEMPOOL_HANDLE rc=%d %s; DEVICE_POINTER rc=%d %s; HOST_POINTER rc=%d %s; "
    "DEVICE_ORDINAL rc=%d %d; CONTEXT rc=%d %s; MAPPED rc=%d %d; RANGE_SIZE rc=%d %zu; ACCESS_FLAGS rc=%d %llu; LEGACY_IPC rc=%d %d\n",
    what, c1, mt, c2, mp ? "set" : "0", c3, ddp == d ? "==p" : (ddp ? "!=p" : "0"), c4, hp == p ? "==p" : (hp ? "!=p" : "0"),
    c5, ord, c6, ctx ? "set" : "0", c7, mapped, c8, rs, c9, aflags, c10, ipc);
  unsigned cf = 0xdead; CUresult c11 = cuMemHostGetFlags(&cf, p);
  CUdeviceptr hd = 1; CUresult c12 = cuMemHostGetDevicePointer(&hd, p, 0);
  P("%-26s cuMemHostGetFlags rc=%d 0x%x; cuMemHostGetDevicePointer rc=%d %s\n", what, c11, cf, c12, hd == d ? "==p" : (hd ? "!=p" : "0"));
}

static double bw(void *src, void *dst, size_t n, cudaStream_t s, int reps, double *call_us) {
  cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s); cudaStreamSynchronize(s);
  double t0 = now_us(), calls = 0;
  for (int i = 0; i < reps; i++) { double c = now_us(); cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s); calls += now_us() - c; }
  cudaStreamSynchronize(s);
  double t = now_us() - t0;
  *call_us = calls / reps;
  return (double)n * reps / t / 1e3;  // GB/s
}

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main(int argc, char **argv) {
  cudaFree(0);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (argc > 2 && !strcmp(argv[1], "kernel")) {
    int grant = atoi(argv[2]);
    CUmemoryPool pool = make_host_pool(grant);
    int *p = (int *)pool_alloc(pool, 1 << 20, (CUstream)s);
    memset(p, 0, 1 << 20);
    fill<<<256, 1024, 0, s>>>(p, 1 << 18, 7);
    cudaError_t le = cudaGetLastError();
    cudaError_t r = cudaStreamSynchronize(s);
    P("kernel on host-pool memory grant=%d: launch last=%d sync rc=%d p[5]=%d (want 12)\n", grant, le, r, p[5]);
    int *q = 0; cudaMallocHost((void **)&q, 4096); r = cudaGetLastError();
    P("after: cudaMallocHost rc=%d\n", r);
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "freehost_pool")) {
    CUmemoryPool pool = make_host_pool(true);
    void *p = pool_alloc(pool, 1 << 20, (CUstream)s);
    cudaError_t r = cudaFreeHost(p); cudaError_t le = cudaGetLastError();
    P("cudaFreeHost(host-pool ptr) rc=%d last=%d\n", r, le);
    CUresult c = cuMemFreeHost(p);
    P("cuMemFreeHost(host-pool ptr) rc=%d\n", c);
    c = cuMemFreeAsync((CUdeviceptr)p, (CUstream)s); CUresult c2 = cuStreamSynchronize((CUstream)s);
    P("then cuMemFreeAsync rc=%d sync=%d\n", c, c2);
    r = cudaFree(0); P("cudaFree(0) after rc=%d\n", r);
    return 0;
  }
  int v = -1;
  cudaDeviceGetAttribute(&v, cudaDevAttrHostMemoryPoolsSupported, 0); P("cudaDevAttrHostMemoryPoolsSupported=%d\n", v);
  cudaDeviceGetAttribute(&v, cudaDevAttrHostNumaMemoryPoolsSupported, 0); P("cudaDevAttrHostNumaMemoryPoolsSupported=%d\n", v);
  cudaDeviceGetAttribute(&v, cudaDevAttrCanMapHostMemory, 0); P("cudaDevAttrCanMapHostMemory=%d\n", v);
  cudaDeviceGetAttribute(&v, cudaDevAttrPageableMemoryAccess, 0); P("cudaDevAttrPageableMemoryAccess=%d\n", v);
  cudaDeviceGetAttribute(&v, cudaDevAttrHostRegisterSupported, 0); P("cudaDevAttrHostRegisterSupported=%d\n", v);
  unsigned dflags = 0; cudaGetDeviceFlags(&dflags); P("cudaGetDeviceFlags=0x%x\n", dflags);

  CUmemoryPool pool = make_host_pool(true);
  const size_t N = 1 << 20;
  void *hp = pool_alloc(pool, N, (CUstream)s);
  P("host-pool block alignment: %lu\n", (unsigned long)((uintptr_t)hp & 0xfffff));
  memset(hp, 1, N);
  void *mh = 0; cudaError_t r = cudaMallocHost(&mh, N); P("cudaMallocHost rc=%d\n", r);
  void *hd = 0, *hpo = 0, *hm = 0, *hw = 0, *hpm = 0;
  cudaHostAlloc(&hd, N, cudaHostAllocDefault);
  cudaHostAlloc(&hpo, N, cudaHostAllocPortable);
  cudaHostAlloc(&hm, N, cudaHostAllocMapped);
  cudaHostAlloc(&hw, N, cudaHostAllocWriteCombined);
  cudaHostAlloc(&hpm, N, cudaHostAllocPortable | cudaHostAllocMapped);
  CUdeviceptr dmh = 0; CUresult c = cuMemAllocHost((void **)&dmh, N); P("cuMemAllocHost rc=%d\n", c);
  void *dha = 0; c = cuMemHostAlloc(&dha, N, CU_MEMHOSTALLOC_DEVICEMAP); P("cuMemHostAlloc(DEVICEMAP) rc=%d\n", c);
  void *dev = 0; cudaMalloc(&dev, N);
  void *pg = malloc(N); memset(pg, 0, N);
  queries("host-pool", hp);
  queries("cudaMallocHost", mh);
  queries("cudaHostAlloc(Default)", hd);
  queries("cudaHostAlloc(Portable)", hpo);
  queries("cudaHostAlloc(Mapped)", hm);
  queries("cudaHostAlloc(WriteComb)", hw);
  queries("cudaHostAlloc(Port|Map)", hpm);
  queries("cuMemAllocHost", (void *)dmh);
  queries("cuMemHostAlloc(DEVICEMAP)", dha);
  queries("cudaMalloc", dev);
  queries("malloc", pg);

  // Input checks and error codes.
  void *z = (void *)1; r = cudaMallocHost(&z, 0); P("cudaMallocHost(size 0) rc=%d p=%s last=%d\n", r, z ? (z == (void *)1 ? "untouched" : "set") : "NULL", cudaGetLastError());
  r = cudaMallocHost(NULL, 16); P("cudaMallocHost(NULL) rc=%d last=%d\n", r, cudaGetLastError());
  z = (void *)1; r = cudaHostAlloc(&z, 16, 0x100); P("cudaHostAlloc(flags 0x100) rc=%d p=%s last=%d\n", r, z ? (z == (void *)1 ? "untouched" : "set") : "NULL", cudaGetLastError());
  z = (void *)1; r = cudaHostAlloc(&z, 16, cudaHostAllocMapped | cudaHostAllocWriteCombined | cudaHostAllocPortable); P("cudaHostAlloc(all 3) rc=%d last=%d\n", r, cudaGetLastError()); cudaFreeHost(z);
  z = (void *)1; r = cudaMallocHost(&z, (size_t)1 << 50); P("cudaMallocHost(2^50) rc=%d p=%s last=%d last2=%d\n", r, z ? (z == (void *)1 ? "untouched" : "set") : "NULL", cudaGetLastError(), cudaGetLastError());
  z = (void *)1; c = cuMemAllocHost(&z, 0); P("cuMemAllocHost(size 0) rc=%d p=%s\n", c, z ? (z == (void *)1 ? "untouched" : "set") : "NULL");
  z = (void *)1; c = cuMemHostAlloc(&z, 16, 0x100); P("cuMemHostAlloc(flags 0x100) rc=%d\n", c);
  r = cudaFreeHost(NULL); P("cudaFreeHost(NULL) rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaFreeHost(pg); P("cudaFreeHost(malloc ptr) rc=%d last=%d last2=%d\n", r, cudaGetLastError(), cudaGetLastError());
  int stackv; r = cudaFreeHost(&stackv); P("cudaFreeHost(stack ptr) rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaFreeHost((void *)0x10); P("cudaFreeHost(0x10) rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaFreeHost(dev); P("cudaFreeHost(cudaMalloc ptr) rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaFreeHost((char *)mh + 64); P("cudaFreeHost(interior of cudaMallocHost) rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaFree(mh); P("cudaFree(cudaMallocHost ptr) rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaFree(hp); P("cudaFree(host-pool ptr) rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaFreeHost(mh); P("cudaFreeHost(cudaMallocHost) rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaFreeHost(mh); P("cudaFreeHost(same again) rc=%d last=%d last2=%d\n", r, cudaGetLastError(), cudaGetLastError());
  c = cuMemFreeHost(NULL); P("cuMemFreeHost(NULL) rc=%d\n", c);
  c = cuMemFreeHost(pg); P("cuMemFreeHost(malloc ptr) rc=%d rt_last=%d\n", c, cudaGetLastError());
  c = cuMemFreeHost(dev); P("cuMemFreeHost(cudaMalloc ptr) rc=%d\n", c);
  c = cuMemFreeHost((void *)dmh); P("cuMemFreeHost(cuMemAllocHost) rc=%d\n", c);
  c = cuMemFreeHost((void *)dmh); P("cuMemFreeHost(same again) rc=%d rt_last=%d\n", c, cudaGetLastError());
  r = cudaFreeHost(dha); P("cudaFreeHost(cuMemHostAlloc ptr) rc=%d\n", r);
  r = cudaFreeHost(hw); P("cudaFreeHost(WriteCombined) rc=%d\n", r);

  // Bandwidth, 64 MiB H2D and D2H async.
  size_t B = 64 << 20; int reps = 20;
  void *dbig; cudaMalloc(&dbig, B);
  void *hbig = pool_alloc(pool, B, (CUstream)s); memset(hbig, 2, B);
  void *rbig; cudaMallocHost(&rbig, B); memset(rbig, 2, B);
  void *pbig = malloc(B); memset(pbig, 2, B);
  for (int round = 0; round < 2; round++) {
    double cu;
    double a = bw(hbig, dbig, B, s, reps, &cu); P("H2D 64MiB host-pool: %.2f GB/s, call %.1f us\n", a, cu);
    a = bw(rbig, dbig, B, s, reps, &cu); P("H2D 64MiB cudaMallocHost: %.2f GB/s, call %.1f us\n", a, cu);
    a = bw(pbig, dbig, B, s, 5, &cu); P("H2D 64MiB malloc: %.2f GB/s, call %.1f us\n", a, cu);
    a = bw(dbig, hbig, B, s, reps, &cu); P("D2H 64MiB host-pool: %.2f GB/s, call %.1f us\n", a, cu);
    a = bw(dbig, rbig, B, s, reps, &cu); P("D2H 64MiB cudaMallocHost: %.2f GB/s, call %.1f us\n", a, cu);
  }

  // Allocate + 4 KiB async copy + free, median us.
  size_t sizes[] = {4096, 1 << 20, 64 << 20};
  for (size_t n : sizes) {
    int it = n >= (64 << 20) ? 30 : 200;
    std::vector<double> t1, t2, t3;
    for (int i = 0; i < it; i++) {
      double a = now_us(); void *x; cudaMallocHost(&x, n); cudaMemcpyAsync(dbig, x, 4096, cudaMemcpyHostToDevice, s); cudaFreeHost(x); t1.push_back(now_us() - a);
      a = now_us(); CUdeviceptr y; cuMemAllocFromPoolAsync(&y, n, pool, (CUstream)s); cuStreamSynchronize((CUstream)s);
      cudaMemcpyAsync(dbig, (void *)y, 4096, cudaMemcpyHostToDevice, s); cuMemFreeAsync(y, (CUstream)s); t2.push_back(now_us() - a);
      a = now_us(); cuMemAllocFromPoolAsync(&y, n, pool, (CUstream)s);
      cudaMemcpyAsync(dbig, (void *)y, 4096, cudaMemcpyHostToDevice, s); cuMemFreeAsync(y, (CUstream)s); t3.push_back(now_us() - a);
    }
    cudaStreamSynchronize(s);
    P("alloc+4KiB copy+free %zu B: cudaMallocHost/FreeHost %.2f us; host pool with sync %.2f us; host pool no sync %.2f us\n", n, median(t1), median(t2), median(t3));
  }
  // Does a fresh host-pool block read as the CPU wrote it after reuse (same address reused?)
  CUdeviceptr a1, a2; cuMemAllocFromPoolAsync(&a1, N, pool, (CUstream)s); cuMemFreeAsync(a1, (CUstream)s);
  cuMemAllocFromPoolAsync(&a2, N, pool, (CUstream)s); cuStreamSynchronize((CUstream)s);
  P("host pool same-stream reuse: %s\n", a1 == a2 ? "same address" : "other address");
  cuuint64_t res = 0; cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
  P("host pool reserved %llu MiB\n", (unsigned long long)res >> 20);
  c = cuMemPoolTrimTo(pool, 0); P("cuMemPoolTrimTo rc=%d\n", c);
  size_t fr, tot; cudaMemGetInfo(&fr, &tot); P("done\n");
  return 0;
}
