/* fake libcudart.so.13 over the fake driver: see fakecuda.h.
 * Real signatures (compiled against the real cuda_runtime_api.h) and the
 * error semantics measured on an H200 with CUDA 13.0 (docs/FACTS.md):
 * cudaMalloc(&p, 0) -> success, p == NULL; cudaMalloc(NULL, n) -> invalid
 * value; impossible size -> cudaErrorMemoryAllocation, p == NULL; cudaFree of
 * a host, interior or already freed pointer -> invalid value; cudaFree(NULL)
 * -> success and creates the context; cudaFree of a pool pointer is legal;
 * every error sets the per-thread last error (cudaGetLastError returns it
 * once, cudaPeekAtLastError does not reset it).
 * Pinned host memory: cudaMallocHost/cudaHostAlloc/cudaFreeHost/
 * cudaHostGetFlags/cudaHostGetDevicePointer are the driver's cuMemHostAlloc/
 * cuMemFreeHost/cuMemHostGetFlags/cuMemHostGetDevicePointer, with its codes
 * (the same numbers: size 0 -> success, p == NULL; NULL out-pointer or
 * unknown flags -> invalid value; impossible size -> cudaErrorMemoryAllocation;
 * cudaFreeHost of anything but the start of live pinned memory -> invalid
 * value); cudaFree of pinned memory -> invalid value, of host pool memory ->
 * success (it frees it).
 * cudaMalloc/cudaFree use the driver's plain path (cuMemAlloc/cuMemFree),
 * never the pool path, so tests can tell them apart. The runtime never calls
 * its own exported functions (an interposer would see them). */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

#define MAXDEV 8

/* Driver entry points the runtime uses: exported symbol, cuGetProcAddress name. */
#define DRIVER_FUNCS(X)                                         \
  X(cuInit, "cuInit")                                           \
  X(cuDeviceGetCount, "cuDeviceGetCount")                       \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute")               \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")       \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease")  \
  X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset")      \
  X(cuCtxSetCurrent, "cuCtxSetCurrent")                         \
  X(cuCtxSynchronize, "cuCtxSynchronize")                       \
  X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess")             \
  X(cuCtxDisablePeerAccess, "cuCtxDisablePeerAccess")           \
  X(cuStreamCreate, "cuStreamCreate")                           \
  X(cuStreamCreateWithPriority, "cuStreamCreateWithPriority")   \
  X(cuStreamDestroy_v2, "cuStreamDestroy")                      \
  X(cuStreamSynchronize, "cuStreamSynchronize")                 \
  X(cuStreamQuery, "cuStreamQuery")                             \
  X(cuStreamBeginCapture_v2, "cuStreamBeginCapture")            \
  X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph") \
  X(cuStreamEndCapture, "cuStreamEndCapture")                   \
  X(cuStreamIsCapturing, "cuStreamIsCapturing")                 \
  X(cuGraphDestroy, "cuGraphDestroy")                           \
  X(cuMemAlloc_v2, "cuMemAlloc")                                \
  X(cuMemAllocPitch_v2, "cuMemAllocPitch")                      \
  X(cuMemFree_v2, "cuMemFree")                                  \
  X(cuMemGetInfo_v2, "cuMemGetInfo")                            \
  X(cuMemAllocAsync, "cuMemAllocAsync")                         \
  X(cuMemFreeAsync, "cuMemFreeAsync")                           \
  X(cuMemAllocHost_v2, "cuMemAllocHost")                        \
  X(cuMemHostAlloc, "cuMemHostAlloc")                           \
  X(cuMemFreeHost, "cuMemFreeHost")                             \
  X(cuMemHostGetFlags, "cuMemHostGetFlags")                     \
  X(cuMemHostGetDevicePointer_v2, "cuMemHostGetDevicePointer") \
  X(cuIpcGetMemHandle, "cuIpcGetMemHandle")                     \
  X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle")                \
  X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle")

#define DECL(sym, name) static __typeof__(&sym) d_##sym;
DRIVER_FUNCS(DECL)
#undef DECL

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cudaError_t g_init_err = cudaSuccess;
static int g_ndev;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_retained[MAXDEV];
static CUcontext g_primary[MAXDEV];

static __thread cudaError_t t_last;
static __thread int t_dev = -1;

static cudaError_t seterr(cudaError_t e) {
  if (e != cudaSuccess) t_last = e;
  return e;
}
/* The fake driver's codes that the runtime passes on have the same numbers. */
static cudaError_t rterr(CUresult r) { return seterr((cudaError_t)r); }

static void resolve_driver(void) {
  const char *pa = getenv("FAKECUDA_RT_PROCADDR");
  if (pa && *pa && strcmp(pa, "0") != 0) {
    /* As the real runtime does: the driver library, cuGetProcAddress_v2 by
     * dlsym, cuGetProcAddress through itself, then every entry point. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      g_init_err = cudaErrorInsufficientDriver;
      return;
    }
    __typeof__(&cuGetProcAddress_v2) gpa = (__typeof__(&cuGetProcAddress_v2))dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) {
      g_init_err = cudaErrorInsufficientDriver;
      return;
    }
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa("cuGetProcAddress", &fn, 12000, 0, &st) || !fn) {
      g_init_err = cudaErrorInsufficientDriver;
      return;
    }
    gpa = (__typeof__(&cuGetProcAddress_v2))fn;
#define LOOK(sym, name)                                                  \
  fn = NULL;                                                             \
  if (gpa(name, &fn, 13000, 0, &st) || !fn) {                            \
    fprintf(stderr, "fake cudart: cuGetProcAddress(%s) failed\n", name); \
    g_init_err = cudaErrorInsufficientDriver;                            \
    return;                                                              \
  }                                                                      \
  d_##sym = (__typeof__(&sym))fn;
    DRIVER_FUNCS(LOOK)
#undef LOOK
  } else {
#define DIRECT(sym, name) d_##sym = &sym;
    DRIVER_FUNCS(DIRECT)
#undef DIRECT
  }
}

static void init_once(void) {
  resolve_driver();
  if (g_init_err) return;
  CUresult r = d_cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) {
    g_init_err = cudaErrorNoDevice;
    return;
  }
  if (r) {
    g_init_err = cudaErrorInitializationError;
    return;
  }
  d_cuDeviceGetCount(&g_ndev);
}

static cudaError_t rt_init(void) {
  pthread_once(&g_once, init_once);
  return g_init_err;
}

static CUresult retain_primary(int dev, CUcontext *out) {
  pthread_mutex_lock(&g_mu);
  CUresult r = CUDA_SUCCESS;
  if (!g_retained[dev]) {
    r = d_cuDevicePrimaryCtxRetain(&g_primary[dev], dev);
    if (!r) g_retained[dev] = 1;
  }
  *out = g_primary[dev];
  pthread_mutex_unlock(&g_mu);
  return r;
}

/* Makes sure this thread has a usable context, as the real runtime does on
 * every call that needs one: the driver's current context if it is usable,
 * else this thread's device's primary context, retained and made current. */
static cudaError_t rt_ctx(int *dev_out) {
  cudaError_t e = rt_init();
  if (e) return e;
  int d = fakecuda__current_device();
  if (d >= 0) {
    if (dev_out) *dev_out = d;
    return cudaSuccess;
  }
  int dev = t_dev < 0 ? 0 : t_dev;
  CUcontext p;
  CUresult r = retain_primary(dev, &p);
  if (r) return (cudaError_t)r;
  r = d_cuCtxSetCurrent(p);
  if (r) return (cudaError_t)r;
  if (dev_out) *dev_out = dev;
  return cudaSuccess;
}

static const struct { cudaError_t e; const char *str; } g_errs[] = {
    {cudaSuccess, "no error"},
    {cudaErrorInvalidValue, "invalid argument"},
    {cudaErrorMemoryAllocation, "out of memory"},
    {cudaErrorInitializationError, "initialization error"},
    {cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "invalid device context"},
    {cudaErrorInvalidResourceHandle, "invalid resource handle"},
    {cudaErrorIllegalState, "the operation cannot be performed in the present state"},
    {cudaErrorSymbolNotFound, "named symbol not found"},
    {cudaErrorNotReady, "device not ready"},
    {cudaErrorIllegalAddress, "an illegal memory access was encountered"},
    {cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "peer access has not been enabled"},
    {cudaErrorContextIsDestroyed, "context is destroyed"},
    {cudaErrorNotSupported, "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorStreamCaptureWrongThread, "attempt to terminate a thread-local capture sequence from another thread"},
};

const char *cudaGetErrorString(cudaError_t error) {
  for (size_t i = 0; i < sizeof g_errs / sizeof g_errs[0]; i++)
    if (g_errs[i].e == error) return g_errs[i].str;
  return "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last; }

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
  if (!runtimeVersion) return seterr(cudaErrorInvalidValue);
  *runtimeVersion = 13000;
  return cudaSuccess;
}

/* ---- devices */
cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_init();
  if (e) {
    *count = 0;
    return seterr(e);
  }
  *count = g_ndev;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (!device) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_init();
  if (e) return seterr(e);
  int d = fakecuda__current_device();
  *device = d >= 0 ? d : t_dev < 0 ? 0 : t_dev;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  cudaError_t e = rt_init();
  if (e) return seterr(e);
  if (device < 0 || device >= g_ndev) return seterr(cudaErrorInvalidDevice);
  t_dev = device;
  CUcontext p;
  CUresult r = retain_primary(device, &p);
  if (r) return rterr(r);
  return rterr(d_cuCtxSetCurrent(p));
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  cudaError_t e = rt_init();
  if (e) return seterr(e);
  if (!value) return seterr(cudaErrorInvalidValue);
  return rterr(d_cuDeviceGetAttribute(value, (CUdevice_attribute)attr, device));
}

cudaError_t cudaDeviceSynchronize(void) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuCtxSynchronize());
}

cudaError_t cudaDeviceReset(void) {
  int dev;
  cudaError_t e = rt_ctx(&dev);
  if (e) return seterr(e);
  pthread_mutex_lock(&g_mu);
  if (g_retained[dev]) {
    g_retained[dev] = 0;
    d_cuDevicePrimaryCtxRelease_v2(dev);
  }
  CUresult r = d_cuDevicePrimaryCtxReset_v2(dev);
  pthread_mutex_unlock(&g_mu);
  return rterr(r);
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  int dev;
  cudaError_t e = rt_ctx(&dev);
  if (e) return seterr(e);
  if (flags != 0) return seterr(cudaErrorInvalidValue);
  if (peerDevice < 0 || peerDevice >= g_ndev || peerDevice == dev) return seterr(cudaErrorInvalidDevice);
  CUcontext p;
  CUresult r = retain_primary(peerDevice, &p);
  if (r) return rterr(r);
  return rterr(d_cuCtxEnablePeerAccess(p, 0));
}

cudaError_t cudaDeviceDisablePeerAccess(int peerDevice) {
  int dev;
  cudaError_t e = rt_ctx(&dev);
  if (e) return seterr(e);
  if (peerDevice < 0 || peerDevice >= g_ndev || peerDevice == dev) return seterr(cudaErrorInvalidDevice);
  CUcontext p;
  CUresult r = retain_primary(peerDevice, &p);
  if (r) return rterr(r);
  return rterr(d_cuCtxDisablePeerAccess(p));
}

/* ---- memory */
static int classify(const void *p, struct fakecuda_ptr_info *info) {
  return fakecuda_ptr_info(p, info) && info->base == (uintptr_t)p && !info->in_graph_free;
}

static void count_rt_invalid_free(void) {
  __atomic_add_fetch(&fakecuda_counters()->rt_invalid_frees, 1, __ATOMIC_SEQ_CST);
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
  if (!devPtr) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  if (size == 0) {
    *devPtr = NULL;
    return cudaSuccess;
  }
  if (fakecuda__unsafe_call(NULL)) return seterr(cudaErrorStreamCaptureUnsupported);
  CUdeviceptr d = 0;
  CUresult r = d_cuMemAlloc_v2(&d, size);
  if (r) {
    *devPtr = NULL;
    return rterr(r == CUDA_ERROR_OUT_OF_MEMORY ? CUDA_ERROR_OUT_OF_MEMORY : r);
  }
  *devPtr = (void *)d;
  return cudaSuccess;
}

/* As the real runtime: the driver's pitched allocation, 16-byte elements. */
cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
  if (!devPtr || !pitch) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  if (fakecuda__unsafe_call(NULL)) return seterr(cudaErrorStreamCaptureUnsupported);
  CUdeviceptr d = 0;
  CUresult r = d_cuMemAllocPitch_v2(&d, pitch, width, height, 16);
  if (r) {
    *devPtr = NULL;
    return rterr(r);
  }
  *devPtr = (void *)d;
  return cudaSuccess;
}

cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent) {
  if (!pitchedDevPtr) return seterr(cudaErrorInvalidValue);
  void *p = NULL;
  size_t pitch = 0;
  cudaError_t e = cudaMallocPitch(&p, &pitch, extent.width, extent.height * extent.depth);
  if (e) return e;
  *pitchedDevPtr = (struct cudaPitchedPtr){.ptr = p, .pitch = pitch, .xsize = extent.width, .ysize = extent.height};
  return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  int in_capture = 0;
  if (fakecuda__unsafe_call(&in_capture)) return seterr(cudaErrorStreamCaptureUnsupported);
  if (!devPtr) return cudaSuccess;
  struct fakecuda_ptr_info info;
  if (!classify(devPtr, &info) || info.kind == FAKECUDA_PINNED) {
    count_rt_invalid_free();
    return seterr(cudaErrorInvalidValue);
  }
  /* The real cudaFree synchronizes the device (not during a relaxed capture). */
  if (!in_capture) {
    CUresult r = d_cuCtxSynchronize();
    if (r) return rterr(r);
  }
  return rterr(d_cuMemFree_v2((CUdeviceptr)devPtr));
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  if (!devPtr) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  if (size == 0) {
    *devPtr = NULL;
    return cudaSuccess;
  }
  CUdeviceptr d = 0;
  CUresult r = d_cuMemAllocAsync(&d, size, (CUstream)hStream);
  if (r) {
    *devPtr = NULL;
    return rterr(r);
  }
  *devPtr = (void *)d;
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  if (!devPtr) return cudaSuccess;
  struct fakecuda_ptr_info info;
  if (!classify(devPtr, &info) || info.kind == FAKECUDA_PINNED) {
    count_rt_invalid_free();
    return seterr(cudaErrorInvalidValue);
  }
  return rterr(d_cuMemFreeAsync((CUdeviceptr)devPtr, (CUstream)hStream));
}

/* ---- pinned host memory */
static cudaError_t fake_host_alloc(void **ptr, size_t size, unsigned int flags) {
  if (!ptr) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuMemHostAlloc(ptr, size, flags));
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return fake_host_alloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) { return fake_host_alloc(pHost, size, flags); }

cudaError_t cudaFreeHost(void *ptr) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuMemFreeHost(ptr));
}

cudaError_t cudaHostGetFlags(unsigned int *pFlags, void *pHost) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuMemHostGetFlags(pFlags, pHost));
}

cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags) {
  if (!pDevice) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  CUdeviceptr d = 0;
  CUresult r = d_cuMemHostGetDevicePointer_v2(&d, pHost, flags);
  if (r) return rterr(r);
  *pDevice = (void *)(uintptr_t)d;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_, size_t *total) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuMemGetInfo_v2(free_, total));
}

/* A device range [p, p+n) inside one live allocation? */
static int dev_range(const void *p, size_t n) {
  struct fakecuda_ptr_info info;
  if (!fakecuda_ptr_info(p, &info)) return 0;
  return (uintptr_t)p + n <= info.base + info.size;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  if (count == 0) return cudaSuccess;
  if (!dev_range(devPtr, count)) return seterr(cudaErrorInvalidValue);
  int r = fakecuda__work(NULL, devPtr); /* asynchronous on the legacy stream */
  if (r) return rterr((CUresult)r);
  memset(devPtr, value, count);
  return cudaSuccess;
}

/* A copy of count bytes on stream: checked against kind, counted as work on
 * the stream for the device (or pinned) memory it touches, then made at once. */
static cudaError_t copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  if (count == 0) return cudaSuccess;
  int dd = dev_range(dst, count), sd = dev_range(src, count);
  switch (kind) {
    case cudaMemcpyHostToHost: break;
    case cudaMemcpyHostToDevice: if (!dd) return seterr(cudaErrorInvalidValue); break;
    case cudaMemcpyDeviceToHost: if (!sd) return seterr(cudaErrorInvalidValue); break;
    case cudaMemcpyDeviceToDevice: if (!dd || !sd) return seterr(cudaErrorInvalidValue); break;
    case cudaMemcpyDefault: break;
    default: return seterr(cudaErrorInvalidValue);
  }
  int r = dd ? fakecuda__work(stream, dst) : 0;
  if (!r && sd) r = fakecuda__work(stream, src);
  if (r) return rterr((CUresult)r);
  memmove(dst, src, count);
  return cudaSuccess;
}

/* On the legacy stream, and synchronous when it touches device memory. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  cudaError_t e = copy(dst, src, count, kind, NULL);
  if (e || count == 0 || (!dev_range(dst, count) && !dev_range(src, count))) return e;
  return rterr(d_cuStreamSynchronize(NULL));
}

/* On stream, without waiting for it. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  return copy(dst, src, count, kind, stream);
}

/* ---- streams */
cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  if (!pStream) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamCreate((CUstream *)pStream, CU_STREAM_DEFAULT));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  if (!pStream) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamCreate((CUstream *)pStream, flags));
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
  if (!pStream) return seterr(cudaErrorInvalidValue);
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamCreateWithPriority((CUstream *)pStream, flags, priority));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamDestroy_v2((CUstream)stream));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamSynchronize((CUstream)stream));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamQuery((CUstream)stream));
}

/* ---- capture */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamBeginCapture_v2((CUstream)stream, (CUstreamCaptureMode)mode));
}

cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t *dependencies,
                                          const cudaGraphEdgeData *dependencyData, size_t numDependencies,
                                          enum cudaStreamCaptureMode mode) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamBeginCaptureToGraph((CUstream)stream, (CUgraph)graph, (const CUgraphNode *)dependencies,
                                             (const CUgraphEdgeData *)dependencyData, numDependencies,
                                             (CUstreamCaptureMode)mode));
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamEndCapture((CUstream)stream, (CUgraph *)pGraph));
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuStreamIsCapturing((CUstream)stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  cudaError_t e = rt_init();
  if (e) return seterr(e);
  return rterr(d_cuGraphDestroy((CUgraph)graph));
}

/* ---- IPC: through the driver's entry points, as the real runtime (which
 * passes the driver's codes on with the same numbers). */
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  if (!handle) return seterr(cudaErrorInvalidValue);
  return rterr(d_cuIpcGetMemHandle((CUipcMemHandle *)handle, (CUdeviceptr)devPtr));
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  if (!devPtr) return seterr(cudaErrorInvalidValue);
  CUipcMemHandle h;
  memcpy(&h, &handle, sizeof h);
  CUdeviceptr d = 0;
  CUresult r = d_cuIpcOpenMemHandle_v2(&d, h, flags);
  if (r) return rterr(r);
  *devPtr = (void *)d;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr) {
  cudaError_t e = rt_ctx(NULL);
  if (e) return seterr(e);
  return rterr(d_cuIpcCloseMemHandle((CUdeviceptr)devPtr));
}
