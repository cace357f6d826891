/* Allocation churn benchmark (scripts/bench.sh runs it three ways).
 *
 *   churn real    cudaMalloc / 1-block kernel / cudaFree on the legacy stream
 *                 (run natively: "real"; under LD_PRELOAD=libsomashim.so: "shim")
 *   churn async   hand-written cudaMallocAsync / kernel / cudaFreeAsync on one
 *                 stream, default pool with release threshold UINT64_MAX
 *
 * For each size: host time of one (alloc, kernel, free) iteration, median over
 * the repetitions after a warm-up. Host stall: a small alloc/free pair while a
 * ~1 ms kernel runs on a non-blocking stream (host time of the pair, median).
 * Memory: cudaMemGetInfo's "used" minus its value at start, sampled right
 * after each size's loop (before any synchronization) and after the sync; this
 * is a proxy for what the allocator keeps reserved (a pool's free blocks count
 * as used), while the program itself never holds more than one block.
 *
 * Environment: CHURN_LIVE_BLOCK=1 keeps one 4 KiB block allocated throughout;
 * CHURN_NO_STREAM=1 makes the idle non-blocking stream only after the size
 * loops.
 *
 * Output lines (parsed by bench.sh):
 *   size <bytes> median_us <x> reps <n> used_delta_mib <loop> <after sync>
 *   stall median_us <x> reps <n> */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(call)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
static long long used_now(void) {
  size_t fr = 0, tot = 0;
  CK(cudaMemGetInfo(&fr, &tot));
  return (long long)(tot - fr);
}

__global__ void touch(unsigned *p, unsigned v) {
  if (threadIdx.x == 0) p[0] = v;
}
__global__ void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

int main(int argc, char **argv) {
  int async = argc > 1 && strcmp(argv[1], "async") == 0;
  if (argc < 2 || (!async && strcmp(argv[1], "real") != 0)) {
    fprintf(stderr, "usage: %s real|async\n", argv[0]);
    return 2;
  }
  const size_t sizes[] = {256, 1ULL << 20, 16ULL << 20, 256ULL << 20, 1ULL << 30};
  const int reps[] = {3000, 3000, 3000, 600, 200};
  const int warm = 50;
  CK(cudaFree(0));
  /* An idle non-blocking stream exists during the size loops (as in most real
   * programs; the real cudaFree synchronizes every stream), unless
   * CHURN_NO_STREAM=1: then it is made only for the stall part. */
  const char *ns = getenv("CHURN_NO_STREAM");
  int no_stream = ns && *ns && strcmp(ns, "0") != 0;
  cudaStream_t s = 0, busy = 0;
  if (!no_stream) CK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  if (async) {
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t thr = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
  }
  /* CHURN_LIVE_BLOCK=1: one small block stays allocated throughout. The real
   * allocator then keeps its chunk for small sizes instead of releasing it at
   * every cudaFree, and is much cheaper for them (bench.sh shows both). */
  const char *lb = getenv("CHURN_LIVE_BLOCK");
  void *live = NULL;
  if (lb && *lb && strcmp(lb, "0") != 0) CK(cudaMalloc(&live, 4096));
  CK(cudaDeviceSynchronize());
  long long base = used_now();
  double *t = (double *)malloc(sizeof(double) * 4000);

  for (int si = 0; si < 5; si++) {
    size_t n = sizes[si];
    for (int r = -warm; r < reps[si]; r++) {
      unsigned *p = NULL;
      double t0 = now_us();
      if (async) {
        CK(cudaMallocAsync((void **)&p, n, s));
        touch<<<1, 32, 0, s>>>(p, (unsigned)r);
        CK(cudaFreeAsync(p, s));
      } else {
        CK(cudaMalloc((void **)&p, n));
        touch<<<1, 32>>>(p, (unsigned)r);
        CK(cudaFree(p));
      }
      double dt = now_us() - t0;
      if (r >= 0) t[r] = dt;
    }
    long long loop = used_now() - base;
    CK(cudaDeviceSynchronize());
    long long after = used_now() - base;
    printf("size %zu median_us %.2f reps %d used_delta_mib %.0f %.0f\n", n, median(t, reps[si]), reps[si],
           loop / 1048576.0, after / 1048576.0);
    fflush(stdout);
  }

  /* Host stall: a 256 B alloc/free pair while ~1 ms of work runs on another,
   * non-blocking stream. */
  if (no_stream) CK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  const int sreps = 100;
  for (int r = -5; r < sreps; r++) {
    spin_ns<<<1, 1, 0, busy>>>(1000000ULL);
    CK(cudaGetLastError());
    void *p = NULL;
    double t0 = now_us();
    if (async) {
      CK(cudaMallocAsync(&p, 256, s));
      CK(cudaFreeAsync(p, s));
    } else {
      CK(cudaMalloc(&p, 256));
      CK(cudaFree(p));
    }
    double dt = now_us() - t0;
    if (r >= 0) t[r] = dt;
    CK(cudaStreamSynchronize(busy));
  }
  printf("stall median_us %.2f reps %d\n", median(t, sreps), sreps);
  CK(cudaDeviceSynchronize());
  if (live) CK(cudaFree(live));
  free(t);
  return 0;
}
