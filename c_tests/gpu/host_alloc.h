/* Pinned host memory for the host_* GPU tests: the runtime's calls, or in
 * driver-API builds (-DSOMA_DRIVER_API) the driver's, counted for the pooling
 * proof as tmalloc counts device memory (host pool memory answers
 * CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE like device pool memory). */
#ifndef SOMASHIM_HOST_ALLOC_H
#define SOMASHIM_HOST_ALLOC_H
#include "gpu_common.h"

#ifdef SOMA_DRIVER_API
static inline cudaError_t host_malloc(void **p, size_t n) {
  cudaFree(NULL);
  return (cudaError_t)cuMemAllocHost(p, n);
}
/* The runtime's flag values are the driver's (Portable 1, Mapped/DEVICEMAP 2, WriteCombined 4). */
static inline cudaError_t host_alloc(void **p, size_t n, unsigned flags) {
  cudaFree(NULL);
  return (cudaError_t)cuMemHostAlloc(p, n, flags);
}
static inline cudaError_t host_free(void *p) { return (cudaError_t)cuMemFreeHost(p); }
static inline cudaError_t host_flags(unsigned *f, void *p) { return (cudaError_t)cuMemHostGetFlags(f, p); }
static inline cudaError_t host_device_pointer(void **d, void *p) {
  CUdeviceptr x = 0;
  CUresult r = cuMemHostGetDevicePointer(&x, p, 0);
  *d = (void *)(uintptr_t)x;
  return (cudaError_t)r;
}
#else
static inline cudaError_t host_malloc(void **p, size_t n) { return cudaMallocHost(p, n); }
static inline cudaError_t host_alloc(void **p, size_t n, unsigned flags) { return cudaHostAlloc(p, n, flags); }
static inline cudaError_t host_free(void *p) { return cudaFreeHost(p); }
static inline cudaError_t host_flags(unsigned *f, void *p) { return cudaHostGetFlags(f, p); }
static inline cudaError_t host_device_pointer(void **d, void *p) { return cudaHostGetDevicePointer(d, p, 0); }
#endif

/* host_malloc, counted (see tmalloc). */
static inline cudaError_t thost_malloc(void **p, size_t n) {
  cudaError_t r = host_malloc(p, n);
  if (r == cudaSuccess && p && *p) note_alloc(*p);
  return r;
}
static inline cudaError_t thost_alloc(void **p, size_t n, unsigned flags) {
  cudaError_t r = host_alloc(p, n, flags);
  if (r == cudaSuccess && p && *p) note_alloc(*p);
  return r;
}
#endif
