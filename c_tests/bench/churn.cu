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
 * CHURN_IDLE_STREAM=1 makes an idle non-blocking stream before the size
 * loops (the shim then orders frees after it too; without one, on the legacy
 * stream); CHURN_THREADS=n sets the number of host threads of the parts
 * threads and threads-legacy (default 4; threads:<n> and threads-legacy:<n>
 * name it in the part instead). A second argument runs one part only (see
 * main).
 *
 * Scenarios after the size loops (host time of one alloc+free pair, median):
 *   nlp        varying sizes as NLP workloads make: 8 blocks live in a ring,
 *              each iteration frees the oldest and allocates 4 KiB..128 MiB
 *              (seeded random, log-uniform), touched by a kernel
 *   threads4   4 host threads, each churning 1 MiB blocks on its own
 *              non-blocking stream
 *   threads4-legacy  the same, all on the legacy stream (tells the cost of
 *              many threads from that of many streams); threads<n> and
 *              threads<n>-legacy: n threads (1..16), 1000 iterations each; the
 *              figure is the median over all threads' iterations of each
 *              iteration's host time (alloc + kernel + free, timed by the
 *              thread that makes it), not wall time / iterations
 *   idle-nb<n> a 1 MiB alloc / 1-block kernel / free on the legacy stream
 *              (async: cudaMallocAsync/cudaFreeAsync on the legacy stream)
 *              while n idle non-blocking streams are alive, made before the
 *              loop; median of 2000 after 100 of warm-up
 *   streams4x4G  4 blocks of 4 GiB live at once, one per non-blocking stream,
 *              a kernel on each, then all freed (time of the whole round)
 *   stall      the host stall (above)
 *   launch-legacy, launch-nb  a loop with no allocation: 40,000 empty-kernel
 *              launches on the legacy stream (on a non-blocking stream), then
 *              a synchronization; wall time per launch, median of 5 loops:
 *              what the hooks that watch work cost a program that gains
 *              nothing from the shim
 *   gpu-chain  GPU time (not host time) per iteration of a chain of ~10 us
 *              kernels with an alloc/free pair around each, the host far
 *              ahead; gpu-chain-kernels: the kernels alone (see below)
 * Each also reports the peak bytes the program held and the peak of
 * cudaMemGetInfo's "used" over its start (sampled during the loop): their
 * ratio is the reserved-over-in-use proxy.
 *
 * Output lines (parsed by bench.sh):
 *   size <bytes> median_us <x> reps <n> used_delta_mib <loop> <after sync>
 *   scenario <name> median_us <x> reps <n> peak_in_use_mib <a> peak_used_mib <b> */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../exit_on_error.h"

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

/* The allocator under test: the real (or preloaded) cudaMalloc/cudaFree, or
 * the stream-ordered pair on `s`. */
static int g_async = 0;
static void alloc_on(void **p, size_t n, cudaStream_t s) {
  if (g_async) CK(cudaMallocAsync(p, n, s));
  else CK(cudaMalloc(p, n));
}
static void release_on(void *p, cudaStream_t s) {
  if (g_async) CK(cudaFreeAsync(p, s));
  else CK(cudaFree(p));
}
static uint64_t g_rng = 88172645463325252ULL;
static uint64_t next_random(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}
static void report(const char *name, double *t, int reps, double peak_in_use, long long peak_used) {
  printf("scenario %s median_us %.2f reps %d peak_in_use_mib %.0f peak_used_mib %.0f\n", name, median(t, reps), reps,
         peak_in_use / 1048576.0, peak_used / 1048576.0);
  fflush(stdout);
}

/* nlp: a ring of 8 live blocks of varying sizes. */
static void scenario_nlp(cudaStream_t s, long long base, double *t) {
  enum { LIVE = 8, REPS = 2000, WARM = 50 };
  void *ring[LIVE] = {0};
  size_t ring_size[LIVE] = {0};
  double live = 0, peak_in_use = 0;
  long long peak_used = 0;
  for (int r = -WARM; r < REPS; r++) {
    int slot = (r + WARM) % LIVE;
    size_t n = (4096ULL << (next_random() % 15));
    n += next_random() % n;
    double t0 = now_us();
    if (ring[slot]) release_on(ring[slot], s);
    alloc_on(&ring[slot], n, s);
    touch<<<1, 32, 0, s>>>((unsigned *)ring[slot], (unsigned)r);
    double dt = now_us() - t0;
    CK(cudaGetLastError()); /* the launch's error, if any (outside the timed part) */
    live += (double)n - (double)ring_size[slot];
    ring_size[slot] = n;
    if (r >= 0) {
      t[r] = dt;
      if (live > peak_in_use) peak_in_use = live;
      if (r % 50 == 0 && used_now() - base > peak_used) peak_used = used_now() - base;
    }
  }
  for (int i = 0; i < LIVE; i++) release_on(ring[i], s);
  CK(cudaDeviceSynchronize());
  report("nlp", t, REPS, peak_in_use, peak_used);
}

/* threads4: four host threads churning 1 MiB blocks on their own streams,
 * or (`legacy`) all on the legacy stream; `nthreads` (1..16) threads, 0: the
 * default (CHURN_THREADS, else 4). Every thread times each of its iterations;
 * the figure is the median over all threads' iterations. */
enum { MAX_THREADS = 16, THREAD_REPS = 1000 };
static double g_thread_times[MAX_THREADS * THREAD_REPS];
static int g_threads = 4, g_thread_legacy = 0;
static void *churn_thread(void *arg) {
  int id = (int)(intptr_t)arg;
  CK(cudaSetDevice(0));
  cudaStream_t s = 0;
  if (!g_thread_legacy) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int r = -50; r < THREAD_REPS; r++) {
    void *p = NULL;
    double t0 = now_us();
    alloc_on(&p, 1 << 20, s);
    touch<<<1, 32, 0, s>>>((unsigned *)p, (unsigned)r);
    release_on(p, s);
    double dt = now_us() - t0;
    CK(cudaGetLastError());
    if (r >= 0) g_thread_times[id * THREAD_REPS + r] = dt;
  }
  CK(cudaStreamSynchronize(s));
  if (s) CK(cudaStreamDestroy(s));
  return NULL;
}
static void scenario_threads(long long base, int legacy, int nthreads) {
  const char *n = getenv("CHURN_THREADS");
  if (n && atoi(n) > 0 && atoi(n) <= MAX_THREADS) g_threads = atoi(n);
  if (nthreads > 0) g_threads = nthreads;
  g_thread_legacy = legacy;
  pthread_t th[MAX_THREADS];
  for (int i = 0; i < g_threads; i++) {
    int rc = pthread_create(&th[i], NULL, churn_thread, (void *)(intptr_t)i);
    if (rc != 0) {
      fprintf(stderr, "pthread_create: %s\n", strerror(rc));
      exit(1);
    }
  }
  for (int i = 0; i < g_threads; i++) {
    int rc = pthread_join(th[i], NULL);
    if (rc != 0) {
      fprintf(stderr, "pthread_join: %s\n", strerror(rc));
      exit(1);
    }
  }
  long long used = used_now() - base;
  CK(cudaDeviceSynchronize());
  char name[32];
  snprintf(name, sizeof name, "threads%d%s", g_threads, g_thread_legacy ? "-legacy" : "");
  report(name, g_thread_times, g_threads * THREAD_REPS, g_threads * 1048576.0, used);
}

/* streams4x4G: four 4 GiB blocks live at once, one per stream. */
static void scenario_streams(long long base, double *t) {
  enum { N = 4, REPS = 20, WARM = 3 };
  const size_t size = 4ULL << 30;
  cudaStream_t st[N];
  for (int i = 0; i < N; i++) CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
  long long peak_used = 0;
  for (int r = -WARM; r < REPS; r++) {
    void *b[N];
    double t0 = now_us();
    for (int i = 0; i < N; i++) {
      alloc_on(&b[i], size, st[i]);
      touch<<<1, 32, 0, st[i]>>>((unsigned *)b[i], (unsigned)r);
    }
    if (used_now() - base > peak_used) peak_used = used_now() - base;
    for (int i = 0; i < N; i++) release_on(b[i], st[i]);
    double dt = now_us() - t0;
    CK(cudaGetLastError());
    if (r >= 0) t[r] = dt;
  }
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < N; i++) CK(cudaStreamDestroy(st[i]));
  report("streams4x4G", t, REPS, (double)N * size, peak_used);
}

/* idle-nb<n>: the 1 MiB pair on the legacy stream while `nstreams` idle
 * non-blocking streams are alive (made here, before the loop). The async
 * program allocates and frees on the legacy stream too, so the same streams
 * exist in every mode and the pair has the same shape. */
static void scenario_idle_nb(int nstreams, long long base, double *t) {
  enum { REPS = 2000, WARM = 100 };
  cudaStream_t *st = (cudaStream_t *)calloc(nstreams > 0 ? nstreams : 1, sizeof *st);
  if (!st) {
    fprintf(stderr, "out of host memory\n");
    exit(1);
  }
  for (int i = 0; i < nstreams; i++) CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
  long long peak_used = 0;
  for (int r = -WARM; r < REPS; r++) {
    void *p = NULL;
    double t0 = now_us();
    alloc_on(&p, 1 << 20, 0);
    touch<<<1, 32>>>((unsigned *)p, (unsigned)r);
    release_on(p, 0);
    double dt = now_us() - t0;
    CK(cudaGetLastError());
    if (r >= 0) {
      t[r] = dt;
      if (r % 50 == 0 && used_now() - base > peak_used) peak_used = used_now() - base;
    }
  }
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < nstreams; i++) CK(cudaStreamDestroy(st[i]));
  free(st);
  char name[32];
  snprintf(name, sizeof name, "idle-nb%d", nstreams);
  report(name, t, REPS, 1048576.0, peak_used);
}

/* pitch2d: a 1000-byte x 1000-row image, cudaMallocPitch + kernel + cudaFree
 * on the legacy stream; async: cudaMallocAsync of the same pitch x rows
 * there (the pitch asked once of the real cudaMallocPitch, as a hand-written
 * program would compute it). */
static void scenario_pitch(long long base, double *t) {
  enum { REPS = 3000, WARM = 50 };
  const size_t width = 1000, rows = 1000;
  size_t pitch = 0;
  void *p = NULL;
  CK(cudaMallocPitch(&p, &pitch, width, rows));
  CK(cudaFree(p));
  long long peak_used = 0;
  for (int r = -WARM; r < REPS; r++) {
    size_t got = pitch;
    double t0 = now_us();
    if (g_async) CK(cudaMallocAsync(&p, pitch * rows, 0));
    else CK(cudaMallocPitch(&p, &got, width, rows));
    touch<<<1, 32>>>((unsigned *)p, (unsigned)r);
    release_on(p, 0);
    double dt = now_us() - t0;
    CK(cudaGetLastError());
    if (got != pitch) {
      fprintf(stderr, "pitch %zu, then %zu\n", pitch, got);
      exit(1);
    }
    if (r >= 0) {
      t[r] = dt;
      if (r % 50 == 0 && used_now() - base > peak_used) peak_used = used_now() - base;
    }
  }
  CK(cudaDeviceSynchronize());
  report("pitch2d", t, REPS, (double)(pitch * rows), peak_used);
}

/* One size's loop: alloc, kernel, free on the legacy stream (or on s, async). */
static void churn_size(size_t n, int reps, cudaStream_t s, long long base, double *t) {
  const int warm = 50;
  for (int r = -warm; r < reps; r++) {
    unsigned *p = NULL;
    double t0 = now_us();
    if (g_async) {
      CK(cudaMallocAsync((void **)&p, n, s));
      touch<<<1, 32, 0, s>>>(p, (unsigned)r);
      CK(cudaFreeAsync(p, s));
    } else {
      CK(cudaMalloc((void **)&p, n));
      touch<<<1, 32>>>(p, (unsigned)r);
      CK(cudaFree(p));
    }
    double dt = now_us() - t0;
    CK(cudaGetLastError());
    if (r >= 0) t[r] = dt;
  }
  long long loop = used_now() - base;
  CK(cudaDeviceSynchronize());
  long long after = used_now() - base;
  printf("size %zu median_us %.2f reps %d used_delta_mib %.0f %.0f\n", n, median(t, reps), reps, loop / 1048576.0,
         after / 1048576.0);
  fflush(stdout);
}

/* Host stall: a 256 B alloc/free pair while ~1 ms of work runs on `busy`, a
 * non-blocking stream. */
static void scenario_stall(cudaStream_t s, cudaStream_t busy, long long base, double *t) {
  const int sreps = 100;
  long long peak_used = 0;
  for (int r = -5; r < sreps; r++) {
    spin_ns<<<1, 1, 0, busy>>>(1000000ULL);
    CK(cudaGetLastError());
    void *p = NULL;
    double t0 = now_us();
    alloc_on(&p, 256, s);
    release_on(p, s);
    double dt = now_us() - t0;
    if (r >= 0) {
      t[r] = dt;
      if (used_now() - base > peak_used) peak_used = used_now() - base;
    }
    CK(cudaStreamSynchronize(busy));
  }
  report("stall", t, sreps, 256.0, peak_used);
}

/* gpu-chain: the host far ahead of the GPU, as in a training step: 1000
 * iterations of (1 MiB alloc, a ~10 us kernel that writes it, free) on the
 * legacy stream. The figure is GPU time per iteration (events around the
 * loop), median of 7 loops: what the allocator's stream operations cost the
 * GPU beside the kernels. gpu-chain-kernels: the same kernels on one block
 * allocated before, no allocator call (the floor, as a caching allocator
 * that hands out blocks without a stream operation would reach). (The real
 * cudaFree waits for the GPU: its loop runs the kernels one at a time, idle
 * gaps included.) */
__global__ void spin_then_touch(unsigned *p, unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
  if (threadIdx.x == 0) p[0] = (unsigned)t;
}
static void gpu_chain(const char *name, int allocate, long long base, double *t) {
  enum { ITERS = 1000, LOOPS = 7 };
  const size_t bytes = 1 << 20;
  cudaEvent_t start, end;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&end));
  void *kept = NULL;
  if (!allocate) alloc_on(&kept, bytes, 0);
  long long peak_used = 0;
  for (int r = -1; r < LOOPS; r++) {
    CK(cudaEventRecord(start, 0));
    for (int i = 0; i < ITERS; i++) {
      void *p = kept;
      if (allocate) alloc_on(&p, bytes, 0);
      spin_then_touch<<<1, 32>>>((unsigned *)p, 10000ULL);
      if (allocate) release_on(p, 0);
    }
    CK(cudaEventRecord(end, 0));
    CK(cudaGetLastError());
    if (used_now() - base > peak_used) peak_used = used_now() - base;
    CK(cudaEventSynchronize(end));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, end));
    if (r >= 0) t[r] = ms * 1000.0 / ITERS;
  }
  if (kept) release_on(kept, 0);
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(end));
  report(name, t, LOOPS, (double)bytes, peak_used);
}

__global__ void empty_kernel(void) {}

/* launch-legacy, launch-nb (see the top). */
static void launches(const char *name, cudaStream_t s, long long base, double *t) {
  enum { PER_LOOP = 40000, LOOPS = 5 };
  for (int r = -1; r < LOOPS; r++) {
    double t0 = now_us();
    for (int i = 0; i < PER_LOOP; i++) empty_kernel<<<1, 1, 0, s>>>();
    CK(cudaStreamSynchronize(s));
    if (r >= 0) t[r] = (now_us() - t0) / PER_LOOP;
  }
  CK(cudaGetLastError());
  report(name, t, LOOPS, 0, used_now() - base);
}

static int flag(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

/* "<prefix><n>" with 0 <= n <= max: n; else -1. */
static int part_number(const char *part, const char *prefix, int max) {
  size_t k = strlen(prefix);
  if (!part || strncmp(part, prefix, k) != 0 || !part[k]) return -1;
  char *end = NULL;
  long v = strtol(part + k, &end, 10);
  if (*end || v < 0 || v > max) return -1;
  return (int)v;
}

/* churn real|async [PART]: PART is size:<bytes>, nlp, threads[:<n>],
 * threads-legacy[:<n>], streams, stall, idle-nb:<n>, pitch, launch-legacy, launch-nb or
 * gpu-chain; without one, every
 * part in turn in this process (threads with CHURN_THREADS or 4, idle-nb with
 * 0, 1, 8, 64, 256; then the pool keeps what earlier parts cached, and the
 * memory figures of later parts include it). */
int main(int argc, char **argv) {
  g_async = argc > 1 && strcmp(argv[1], "async") == 0;
  const char *part = argc > 2 ? argv[2] : NULL;
  if (argc < 2 || argc > 3 || (!g_async && strcmp(argv[1], "real") != 0)) {
    fprintf(stderr,
            "usage: %s real|async [size:<bytes>|nlp|threads[:<n>]|threads-legacy[:<n>]|streams|stall|idle-nb:<n>|pitch|"
            "launch-legacy|launch-nb|gpu-chain]\n",
            argv[0]);
    return 2;
  }
  int threads_n = part_number(part, "threads:", MAX_THREADS);
  int threads_legacy_n = part_number(part, "threads-legacy:", MAX_THREADS);
  int idle_nb_n = part_number(part, "idle-nb:", 4096);
  if ((part && strncmp(part, "threads:", 8) == 0 && threads_n < 1) ||
      (part && strncmp(part, "threads-legacy:", 15) == 0 && threads_legacy_n < 1) ||
      (part && strncmp(part, "idle-nb:", 8) == 0 && idle_nb_n < 0)) {
    fprintf(stderr, "%s: bad part '%s' (threads: 1..%d, idle-nb: 0..4096)\n", argv[0], part, (int)MAX_THREADS);
    return 2;
  }
  const size_t sizes[] = {256, 1ULL << 20, 16ULL << 20, 256ULL << 20, 1ULL << 30};
  const int reps[] = {3000, 3000, 3000, 600, 200};
  CK(cudaFree(0));
  /* CHURN_IDLE_STREAM=1: an idle non-blocking stream exists from here on
   * (programs that have one make the shim join it at every free); else it
   * is made only for the stall part. */
  int idle_stream = flag("CHURN_IDLE_STREAM");
  cudaStream_t s = 0, busy = 0;
  if (idle_stream) CK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  if (g_async) {
    /* The async sizes, nlp and stall loops run on a non-blocking stream of
     * their own; the other parts make the streams they use, and an extra
     * stream would change their shape. */
    if (!part || strncmp(part, "size:", 5) == 0 || strcmp(part, "nlp") == 0 || strcmp(part, "stall") == 0)
      CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t thr = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
  }
  /* CHURN_LIVE_BLOCK=1: one small block stays allocated throughout. The real
   * allocator then keeps its chunk for small sizes instead of releasing it at
   * every cudaFree, and is much cheaper for them (bench.sh shows both). */
  void *live = NULL;
  if (flag("CHURN_LIVE_BLOCK")) CK(cudaMalloc(&live, 4096));
  /* Load the kernels first (lazy loading reserves device memory at a
   * kernel's first launch), on pinned host memory, so that no allocator
   * under test has cached anything when `base` is read. */
  unsigned *pinned = NULL;
  CK(cudaMallocHost((void **)&pinned, 4096));
  touch<<<1, 32>>>(pinned, 0);
  spin_ns<<<1, 1>>>(0);
  CK(cudaDeviceSynchronize());
  CK(cudaFreeHost(pinned));
  long long base = used_now();
  double *t = (double *)malloc(sizeof(double) * 4000);
  if (!t) {
    fprintf(stderr, "out of host memory\n");
    return 1;
  }

  int ran = 0;
  for (int si = 0; si < 5; si++) {
    char name[32];
    snprintf(name, sizeof name, "size:%zu", sizes[si]);
    if (!part || strcmp(part, name) == 0) {
      churn_size(sizes[si], reps[si], s, base, t);
      ran++;
    }
  }
  if (!part || strcmp(part, "nlp") == 0) {
    scenario_nlp(s, base, t);
    ran++;
  }
  if (!part || strcmp(part, "threads") == 0 || threads_n > 0) {
    scenario_threads(base, 0, threads_n);
    ran++;
  }
  if (!part || strcmp(part, "threads-legacy") == 0 || threads_legacy_n > 0) {
    scenario_threads(base, 1, threads_legacy_n);
    ran++;
  }
  if (!part || strcmp(part, "streams") == 0) {
    scenario_streams(base, t);
    ran++;
  }
  if (!part) {
    const int idle[] = {0, 1, 8, 64, 256};
    for (int i = 0; i < 5; i++) scenario_idle_nb(idle[i], base, t);
    ran++;
  } else if (idle_nb_n >= 0) {
    scenario_idle_nb(idle_nb_n, base, t);
    ran++;
  }
  if (!part || strcmp(part, "pitch") == 0) {
    scenario_pitch(base, t);
    ran++;
  }
  if (!part || strcmp(part, "launch-legacy") == 0) {
    launches("launch-legacy", 0, base, t);
    ran++;
  }
  if (!part || strcmp(part, "launch-nb") == 0) {
    cudaStream_t nb;
    CK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    launches("launch-nb", nb, base, t);
    CK(cudaStreamDestroy(nb));
    ran++;
  }
  if (!part || strcmp(part, "gpu-chain") == 0) {
    gpu_chain("gpu-chain-kernels", 0, base, t);
    gpu_chain("gpu-chain", 1, base, t);
    ran++;
  }
  if (!part || strcmp(part, "stall") == 0) {
    if (!idle_stream) CK(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
    scenario_stall(s, busy, base, t);
    ran++;
  }
  if (!ran) {
    fprintf(stderr, "%s: unknown part '%s'\n", argv[0], part);
    return 2;
  }
  CK(cudaDeviceSynchronize());
  if (live) CK(cudaFree(live));
  free(t);
  return 0;
}
