/* Shared by the GPU test programs (the .cu files beside it): kernels, patterns, and
 * the pooling proof.
 *
 * Pooling proof: every test allocates through tmalloc(), a plain cudaMalloc
 * that also asks the driver itself (past the shim) whether the returned
 * pointer is pool memory (CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE is non-null
 * only for memory from a stream-ordered pool). print_pooled() prints "# pooled N of M"; the
 * runner (scripts/gpu_test.sh) requires N == 0 natively and N > 0 under the
 * shim, so a shim that passes everything through cannot pass.
 *
 * Durations on the GPU come from %globaltimer (nanoseconds), so a "1 ms
 * kernel" lasts about 1 ms whatever the clock rate; no test asserts anything
 * about time. */
#ifndef SOMASHIM_GPU_COMMON_H
#define SOMASHIM_GPU_COMMON_H
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../check.h"
#include "../driver_past_shim.h"

/* Driver-API builds (-DSOMA_DRIVER_API, the runner's "driver" variant): the
 * tests' cudaMalloc/cudaFree/cudaFreeAsync go through the driver's
 * cuMemAlloc/cuMemFree/cuMemFreeAsync, as a driver-API program's would.
 * cudaFree(NULL) stays the runtime's (it is how the tests create the
 * context), and an allocation first makes the runtime's context current. */
#ifdef SOMA_DRIVER_API
static inline cudaError_t drv_malloc(void **p, size_t n) {
  CUcontext ctx = NULL;
  if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) cudaFree(NULL);
  if (!p) return (cudaError_t)cuMemAlloc(NULL, n);
  CUdeviceptr d = 0;
  CUresult r = cuMemAlloc(&d, n);
  *p = (void *)(uintptr_t)d;
  return (cudaError_t)r;
}
static inline cudaError_t drv_free(void *p) {
  if (!p) return cudaFree(NULL);
  return (cudaError_t)cuMemFree((CUdeviceptr)(uintptr_t)p);
}
static inline cudaError_t drv_free_async(void *p, cudaStream_t s) {
  return (cudaError_t)cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, (CUstream)s);
}
#define cudaMalloc(p, n) drv_malloc((void **)(p), (n))
#define cudaFree(p) drv_free((void *)(p))
#define cudaFreeAsync(p, s) drv_free_async((void *)(p), (s))
#endif

#define KiB (1024ULL)
#define MiB (1024ULL * 1024ULL)
#define GiB (1024ULL * 1024ULL * 1024ULL)

/* GPUTEST_QUICK=1 (set by the runner under compute-sanitizer): fewer
 * iterations. The native and the shim run of one comparison always get the
 * same value, so their outputs stay comparable. */
static inline int gpu_quick(void) {
  const char *q = getenv("GPUTEST_QUICK");
  return q && *q && strcmp(q, "0") != 0;
}

static inline double host_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static inline const char *nn(const void *p) { return p ? "non-NULL" : "NULL"; }

/* Whether the shim is loaded in this process. */
static inline int under_shim(void) {
  FILE *maps = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  while (maps && !found && fgets(line, sizeof line, maps)) found = strstr(line, "libsomashim") != NULL;
  if (maps) fclose(maps);
  return found;
}

/* ---- pooling proof ------------------------------------------------------ */
static int g_allocs = 0, g_pooled = 0;

static inline int is_pool_ptr(const void *p) { return driver_says_pooled((uint64_t)(uintptr_t)p); }

static inline void note_alloc(const void *p) {
  __atomic_add_fetch(&g_allocs, 1, __ATOMIC_RELAXED);
  if (is_pool_ptr(p)) __atomic_add_fetch(&g_pooled, 1, __ATOMIC_RELAXED);
}

/* cudaMalloc, counted. Same return code and out-pointer as cudaMalloc. */
static inline cudaError_t tmalloc(void **p, size_t n) {
  cudaError_t r = cudaMalloc(p, n);
  if (r == cudaSuccess && p && *p) note_alloc(*p);
  return r;
}
#define TMALLOC(pp, n) tmalloc((void **)(pp), (n))

static inline void pool_count_reset(void) {
  __atomic_store_n(&g_allocs, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&g_pooled, 0, __ATOMIC_RELAXED);
}

static inline void print_pooled(void) {
  printf("# pooled %d of %d\n", __atomic_load_n(&g_pooled, __ATOMIC_RELAXED),
         __atomic_load_n(&g_allocs, __ATOMIC_RELAXED));
}

/* Prints the runtime's last error, then what it is after being read once
 * (a failed call must leave its error exactly once). */
static inline void show_last_error_twice(void) {
  int first = (int)cudaGetLastError();
  int second = (int)cudaGetLastError();
  printf("  last error %d, then %d\n", first, second);
}

/* ---- patterns ----------------------------------------------------------- */
__host__ __device__ static inline unsigned pattern(unsigned seed, size_t i) {
  unsigned x = seed * 2654435761u + (unsigned)i * 40503u + (unsigned)(i >> 32);
  return x ^ (x >> 13) ^ 0x5bd1e995u;
}

static inline size_t count_bad_host(const unsigned *h, size_t n, unsigned seed) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != pattern(seed, i);
  return bad;
}

static inline unsigned grid_for(size_t n, unsigned cap) {
  size_t g = (n + 255) / 256;
  if (g < 1) g = 1;
  return (unsigned)(g > cap ? cap : g);
}

/* ---- kernels ------------------------------------------------------------ */
__device__ static inline unsigned long long gt_now(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Spin for about ns nanoseconds. */
__global__ void k_spin_ns(unsigned long long ns) {
  unsigned long long t0 = gt_now();
  while (gt_now() - t0 < ns) {
  }
}

/* p[i] = pattern(seed, i) */
__global__ void k_fill(unsigned *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = pattern(seed, i);
}

/* p[i] = v */
__global__ void k_set(unsigned *p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = v;
}

/* After about delay_ns nanoseconds (a window in which a wrongly reused block
 * gets overwritten), *bad += number of i with p[i] != pattern(seed, i). */
__global__ void k_count_bad(const unsigned *p, size_t n, unsigned seed, unsigned long long *bad,
                            unsigned long long delay_ns) {
  unsigned long long t0 = gt_now(), mine = 0;
  while (gt_now() - t0 < delay_ns) {
  }
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    mine += p[i] != pattern(seed, i);
  if (mine) atomicAdd(bad, mine);
}

/* *bad += number of i with p[i] != v */
__global__ void k_count_neq(const unsigned *p, size_t n, unsigned v, unsigned long long *bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    mine += p[i] != v;
  if (mine) atomicAdd(bad, mine);
}

/* The reader R of the race tests: reads p again and again for about ns
 * nanoseconds (volatile loads, so every pass goes to memory) and adds to *bad
 * every element that is not `expect`. */
__global__ void k_read_until(const unsigned *p, size_t n, unsigned expect, unsigned long long ns,
                             unsigned long long *bad) {
  const volatile unsigned *vp = p;
  unsigned long long t0 = gt_now(), mine = 0;
  size_t start = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  do {
    for (size_t i = start; i < n; i += stride) mine += vp[i] != expect;
  } while (gt_now() - t0 < ns);
  if (mine) atomicAdd(bad, mine);
}

/* A writer that keeps writing v into p for about ns nanoseconds. */
__global__ void k_write_until(unsigned *p, size_t n, unsigned v, unsigned long long ns) {
  volatile unsigned *vp = p;
  unsigned long long t0 = gt_now();
  size_t start = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  do {
    for (size_t i = start; i < n; i += stride) vp[i] = v;
  } while (gt_now() - t0 < ns);
}

/* dst[i] = src[i] + add (src may live on a peer device) */
__global__ void k_xform(const unsigned *src, unsigned *dst, size_t n, unsigned add) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i] + add;
}

/* Fill a device block with pattern(seed) on stream s, copy it back and count
 * the mismatches on the host (synchronizes s). Returns the mismatches, or
 * (size_t)-1 if a CUDA call failed. */
static inline size_t fill_and_verify(void *d, size_t bytes, unsigned seed, cudaStream_t s, unsigned *host) {
  size_t n = bytes / 4;
  if (n == 0) return 0;
  k_fill<<<grid_for(n, 1024), 256, 0, s>>>((unsigned *)d, n, seed);
  cudaError_t r = cudaGetLastError();
  if (r == cudaSuccess) r = cudaMemcpyAsync(host, d, n * 4, cudaMemcpyDeviceToHost, s);
  if (r == cudaSuccess) r = cudaStreamSynchronize(s);
  if (r != cudaSuccess) {
    fprintf(stderr, "fill_and_verify: %s\n", cudaGetErrorString(r));
    return (size_t)-1;
  }
  return count_bad_host(host, n, seed);
}

/* A stream-ordered pool of the program's own on device 0 (pinned device memory). */
static inline cudaMemPool_t make_own_pool(void) {
  cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = NULL;
  CHECK_CUDA(cudaMemPoolCreate(&pool, &props));
  return pool;
}

/* Read back one 64-bit counter (synchronizes the device). */
static inline unsigned long long read_counter(const unsigned long long *d) {
  unsigned long long h = ~0ULL;
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}
#endif
