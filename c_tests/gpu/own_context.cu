/* Issue 15, item 8: a driver-API program with a context of its own (the shape
 * of NVIDIA's threadMigration sample). cuInit, cuCtxCreate, the context
 * popped from the main thread; then
 *   - migration: thread 1 pushes the context, allocates a block and fills it
 *     (cuMemsetD32), pops; thread 2 pushes it, checks the block
 *     (cuMemcpyDtoH), rewrites and checks it again, frees it, pops;
 *   - two threads at once, one with cuCtxPushCurrent/cuCtxPopCurrent, one
 *     with cuCtxSetCurrent, 100 blocks each: allocate, fill (on a non-blocking
 *     stream of the context for one of them), copy back, check, free;
 *   - 200 cuMemAlloc/cuMemFree pairs, timed (on a '# ' line).
 * The device's primary context must not be active before, after the work, or
 * after cuCtxDestroy: the shim must never create (retain) a context the
 * program did not ask for. The total host time is printed on a '# ' line;
 * the runner fails the test if the shim's run takes more than 3x native +
 * 0.5 s.
 *
 * Standalone (no gpu_common.h): no runtime call, no kernel. Memory in a
 * context the program created passes through the shim, so '# pooled' is 0
 * in both runs (the runner expects 0 for this test). */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../check.h"
#include "../driver_past_shim.h"

#define CHECK_CU(call)                                                                                    \
  do {                                                                                                    \
    CUresult check_cu_ = (call);                                                                          \
    if (check_cu_ != CUDA_SUCCESS) {                                                                      \
      const char *check_s_ = NULL;                                                                        \
      cuGetErrorString(check_cu_, &check_s_);                                                             \
      fprintf(stderr, "%s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call, (int)check_cu_,          \
              check_s_ ? check_s_ : "?");                                                                 \
      __atomic_add_fetch(&check_failures, 1, __ATOMIC_RELAXED);                                           \
    }                                                                                                     \
  } while (0)

#define MiB (1024ULL * 1024ULL)

static CUcontext g_ctx;
static int g_allocs, g_pooled;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void note_alloc(CUdeviceptr d) {
  __atomic_add_fetch(&g_allocs, 1, __ATOMIC_RELAXED);
  if (driver_says_pooled(d)) __atomic_add_fetch(&g_pooled, 1, __ATOMIC_RELAXED);
}

static int primary_active(CUdevice dev) {
  unsigned flags = 0;
  int active = -1;
  CHECK_CU(cuDevicePrimaryCtxGetState(dev, &flags, &active));
  return active;
}

/* Copy n words of d back and count those != v. */
static size_t count_neq(CUdeviceptr d, size_t n, unsigned v, unsigned *host) {
  size_t bad = 0;
  CUresult r = cuMemcpyDtoH(host, d, n * 4);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuMemcpyDtoH: %d\n", (int)r);
    return (size_t)-1;
  }
  for (size_t i = 0; i < n; i++) bad += host[i] != v;
  return bad;
}

/* ---- migration: one thread allocates, another uses and frees ------------ */
static CUdeviceptr g_mig;
static const size_t MIG_BYTES = 1 * MiB;
static void *mig_alloc(void *arg) {
  (void)arg;
  CHECK_CU(cuCtxPushCurrent(g_ctx));
  CHECK_CU(cuMemAlloc(&g_mig, MIG_BYTES));
  if (g_mig) note_alloc(g_mig);
  CHECK_CU(cuMemsetD32(g_mig, 0xa5a5a5a5u, MIG_BYTES / 4));
  CHECK_CU(cuCtxSynchronize());
  CUcontext popped = NULL;
  CHECK_CU(cuCtxPopCurrent(&popped));
  CHECK(popped == g_ctx);
  return NULL;
}
static size_t g_mig_bad1, g_mig_bad2;
static void *mig_use(void *arg) {
  (void)arg;
  unsigned *host = (unsigned *)malloc(MIG_BYTES);
  CHECK_CU(cuCtxPushCurrent(g_ctx));
  g_mig_bad1 = count_neq(g_mig, MIG_BYTES / 4, 0xa5a5a5a5u, host);
  CHECK_CU(cuMemsetD32(g_mig, 0x5a5a5a5au, MIG_BYTES / 4));
  g_mig_bad2 = count_neq(g_mig, MIG_BYTES / 4, 0x5a5a5a5au, host);
  CHECK_CU(cuMemFree(g_mig));
  CUcontext popped = NULL;
  CHECK_CU(cuCtxPopCurrent(&popped));
  CHECK(popped == g_ctx);
  free(host);
  return NULL;
}

/* ---- two threads at once -------------------------------------------------- */
struct work {
  int tid, iters;
  size_t bad, failures, allocs;
  int current_ok;
};
static void *worker(void *arg) {
  struct work *w = (struct work *)arg;
  const size_t maxb = 4 * MiB;
  unsigned *host = (unsigned *)malloc(maxb);
  CUstream st = NULL;
  if (w->tid == 0) {
    CHECK_CU(cuCtxPushCurrent(g_ctx));
  } else {
    CHECK_CU(cuCtxSetCurrent(g_ctx));
    CHECK_CU(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  }
  CUcontext cur = NULL;
  CHECK_CU(cuCtxGetCurrent(&cur));
  w->current_ok = cur == g_ctx;
  for (int i = 0; i < w->iters; i++) {
    size_t bytes = ((size_t)(i % 9) + 1) * (size_t)(w->tid + 1) * 65536 + 4 * (size_t)i;
    if (bytes > maxb) bytes = maxb;
    size_t n = bytes / 4;
    unsigned v = 0x01000000u * (unsigned)(w->tid + 1) + (unsigned)i;
    CUdeviceptr d = 0;
    if (cuMemAlloc(&d, bytes) != CUDA_SUCCESS || !d) {
      w->failures++;
      continue;
    }
    note_alloc(d);
    w->allocs++;
    CUresult r = st ? cuMemsetD32Async(d, v, n, st) : cuMemsetD32(d, v, n);
    if (r == CUDA_SUCCESS && st) r = cuStreamSynchronize(st);
    if (r != CUDA_SUCCESS) w->failures++;
    size_t b = count_neq(d, n, v, host);
    if (b == (size_t)-1)
      w->failures++;
    else
      w->bad += b;
    if (st && cuMemsetD32Async(d, ~v, n, st) != CUDA_SUCCESS) w->failures++; /* still running at the free */
    if (cuMemFree(d) != CUDA_SUCCESS) w->failures++;
  }
  if (st) {
    CHECK_CU(cuStreamSynchronize(st));
    CHECK_CU(cuStreamDestroy(st));
  }
  if (w->tid == 0) {
    CUcontext popped = NULL;
    CHECK_CU(cuCtxPopCurrent(&popped));
    CHECK(popped == g_ctx);
  } else {
    CHECK_CU(cuCtxSetCurrent(NULL));
  }
  free(host);
  return NULL;
}

int main(void) {
  double t0 = now_ms();
  CHECK_CU(cuInit(0));
  CUdevice dev = 0;
  CHECK_CU(cuDeviceGet(&dev, 0));
  printf("before cuCtxCreate: primary_active=%d\n", primary_active(dev));
#if CUDA_VERSION >= 13000
  CHECK_CU(cuCtxCreate(&g_ctx, NULL, 0, dev));
#else
  CHECK_CU(cuCtxCreate(&g_ctx, 0, dev));
#endif
  CUcontext popped = NULL;
  CHECK_CU(cuCtxPopCurrent(&popped));
  CHECK(popped == g_ctx);
  CUcontext cur = (CUcontext)1;
  CHECK_CU(cuCtxGetCurrent(&cur));
  printf("main thread after pop: current=%s\n", cur ? "non-NULL" : "NULL");

  pthread_t t;
  CHECK(pthread_create(&t, NULL, mig_alloc, NULL) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(pthread_create(&t, NULL, mig_use, NULL) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  printf("migration: block allocated in thread 1, checked and freed in thread 2: mismatches=%zu,%zu\n", g_mig_bad1,
         g_mig_bad2);
  CHECK(g_mig_bad1 == 0 && g_mig_bad2 == 0);

  struct work w[2];
  pthread_t th[2];
  memset(w, 0, sizeof w);
  for (int i = 0; i < 2; i++) {
    w[i].tid = i;
    w[i].iters = 100;
    CHECK(pthread_create(&th[i], NULL, worker, &w[i]) == 0);
  }
  for (int i = 0; i < 2; i++) {
    CHECK(pthread_join(th[i], NULL) == 0);
    printf("thread %d (%s): context current=%d allocations=%zu mismatches=%zu failures=%zu\n", i,
           i == 0 ? "push/pop" : "set-current, non-blocking stream", w[i].current_ok, w[i].allocs, w[i].bad,
           w[i].failures);
    CHECK(w[i].current_ok && w[i].allocs == (size_t)w[i].iters && w[i].bad == 0 && w[i].failures == 0);
  }

  /* 200 pairs, timed: the pass-through must cost what the real calls cost. */
  CHECK_CU(cuCtxPushCurrent(g_ctx));
  const int PAIRS = 200;
  int fails = 0;
  double l0 = now_ms();
  for (int i = 0; i < PAIRS; i++) {
    CUdeviceptr d = 0;
    if (cuMemAlloc(&d, 1 * MiB) != CUDA_SUCCESS) {
      fails++;
      continue;
    }
    if (i % 50 == 0) note_alloc(d);
    if (cuMemFree(d) != CUDA_SUCCESS) fails++;
  }
  double l1 = now_ms();
  printf("alloc/free loop: pairs=%d failures=%d\n", PAIRS, fails);
  printf("# alloc/free loop: %.2f us per cuMemAlloc+cuMemFree pair\n", (l1 - l0) * 1e3 / PAIRS);
  CHECK(fails == 0);
  CHECK_CU(cuCtxSynchronize());
  CHECK_CU(cuCtxPopCurrent(&popped));
  CHECK(popped == g_ctx);

  int a1 = primary_active(dev);
  printf("after the work: primary_active=%d\n", a1);
  CHECK_CU(cuCtxDestroy(g_ctx));
  int a2 = primary_active(dev);
  printf("after cuCtxDestroy: primary_active=%d\n", a2);
  CHECK(a1 == 0 && a2 == 0);

  printf("# total host time %.1f ms\n", now_ms() - t0);
  printf("# pooled %d of %d\n", __atomic_load_n(&g_pooled, __ATOMIC_RELAXED),
         __atomic_load_n(&g_allocs, __ATOMIC_RELAXED));
  return report();
}
