/* Shared by the CPU tests (c_tests/cpu, one .c file per behaviour): they run on the fake CUDA of
 * c_tests/fake, natively and under the shim, and are told which by the
 * harness (scripts/cpu_test.sh) through CPUTEST_MODE=native|shim. */
#ifndef SOMASHIM_CPU_COMMON_H
#define SOMASHIM_CPU_COMMON_H
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "fakecuda.h"

#define MiB ((size_t)1 << 20)

/* stdout line by line, so that it interleaves with stderr as it happened */
__attribute__((constructor)) static void cputest_line_buffered(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

static inline int env_is(const char *name, const char *value) {
  const char *v = getenv(name);
  return v && strcmp(v, value) == 0;
}

/* A SOMA_* flag as the shim reads it (0/1, true/false, yes/no, on/off). */
static inline int env_flag(const char *name, int dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  return strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0 ||
         strcasecmp(v, "on") == 0;
}

/* A SOMA_* byte count: a number with an optional binary unit, or max. */
static inline uint64_t env_bytes(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  if (strcasecmp(v, "max") == 0) return UINT64_MAX;
  char *end;
  uint64_t n = strtoull(v, &end, 10);
  if (!*end || strcasecmp(end, "b") == 0) return n;
  if (!strcasecmp(end, "k") || !strcasecmp(end, "kb") || !strcasecmp(end, "kib")) return n << 10;
  if (!strcasecmp(end, "m") || !strcasecmp(end, "mb") || !strcasecmp(end, "mib")) return n << 20;
  if (!strcasecmp(end, "g") || !strcasecmp(end, "gb") || !strcasecmp(end, "gib")) return n << 30;
  return dflt;
}

/* Where the program's cudaMalloc resolves: the shim when preloaded. */
static inline int cudamalloc_is_shim(void) {
  Dl_info info;
  void *f = (void *)&cudaMalloc;
  if (!dladdr(f, &info) || !info.dli_fname) return 0;
  return strstr(info.dli_fname, "libcudart") == NULL;
}

/* 1 under the shim. Also checks that the harness and the process agree. */
static inline int under_shim(void) {
  static int checked = -1;
  int shim = env_is("CPUTEST_MODE", "shim");
  if (checked < 0) {
    checked = 1;
    if (shim != cudamalloc_is_shim()) {
      fprintf(stderr, "%s:%d: CHECK failed: CPUTEST_MODE=%s but cudaMalloc resolves to %s\n", __FILE__,
              __LINE__, shim ? "shim" : "native", cudamalloc_is_shim() ? "the preload" : "libcudart");
      check_failures++;
    }
  }
  return shim;
}

/* Whether the shim should serve a cudaMalloc of `size` from its pool. */
static inline int expect_pool(size_t size) {
  if (!under_shim() || size == 0) return 0;
  if (env_flag("SOMA_DISABLE", 0)) return 0;
  if (env_flag("FAKECUDA_NO_POOLS", 0)) return 0;
  return size >= env_bytes("SOMA_MIN_BYTES", 1) && size <= env_bytes("SOMA_MAX_BYTES", UINT64_MAX);
}

static inline struct fakecuda_counters snap(void) {
  struct fakecuda_counters c;
  fakecuda_snapshot(&c);
  return c;
}
#define DELTA(before, after, field) ((long long)((after).field - (before).field))

static inline int ptr_kind(const void *p) {
  struct fakecuda_ptr_info info;
  fakecuda_ptr_info(p, &info);
  return info.kind;
}

/* Under the shim, with a non-blocking stream alive (SOMA_FREE_ORDER=join), a
 * cudaFree only queues the block: the shim's own thread joins queued frees
 * after the work on every stream, and once the GPU has passed that, keeps
 * the blocks in a cache by size (still allocated at the driver: FAKECUDA_POOL)
 * and hands them to the next allocations of that size; it gives the pool
 * (cuMemFreeAsync) those unused for 1 s. Without that thread, an allocation
 * that misses the cache joins and collects frees itself. So a freed block
 * reaches the driver "eventually": tests poll for that (EVENTUALLY), never
 * sleep for a fixed time, and do not synchronize the host for it before the
 * ordering is checked (that would make every ordering hold trivially).
 *
 * nudge(): one more allocation and free through the shim without any host
 * synchronization (natively: a plain pair). */
static inline void nudge(void) {
  size_t size = 4096;
  uint64_t lo = env_bytes("SOMA_MIN_BYTES", 1), hi = env_bytes("SOMA_MAX_BYTES", UINT64_MAX);
  if (size < lo) size = lo;
  if (size > hi) size = hi;
  void *t = NULL;
  if (cudaMalloc(&t, size) == cudaSuccess) cudaFree(t);
}

/* How long a test waits for the shim's thread to do something: generous (the
 * cache gives a block back after 1 s unused; the thread looks every 50 ms). A
 * test that passes waits only as long as the shim takes. */
#define SETTLE_MS 5000

/* Polls `cond` every millisecond until it holds or SETTLE_MS have passed;
 * its last value (checked by the caller). */
#define EVENTUALLY(cond)                                                   \
  ({                                                                       \
    int ok_ = 0;                                                           \
    for (int ms_ = 0; !(ok_ = !!(cond)) && ms_ < SETTLE_MS; ms_++) usleep(1000); \
    ok_;                                                                   \
  })

/* Every allocation of `kind` (pool, plain) made since the snapshot b has
 * been freed at the driver, once the shim had time to give back what it
 * keeps (the program must have freed all it allocated since b). */
#define CHECK_BALANCED(b, kind)                                                           \
  do {                                                                                    \
    struct fakecuda_counters m_;                                                          \
    EVENTUALLY((m_ = snap(), DELTA(b, m_, kind##_allocs) == DELTA(b, m_, kind##_frees))); \
    if (DELTA(b, m_, kind##_allocs) != DELTA(b, m_, kind##_frees)) {                      \
      fprintf(stderr, "%s:%d: %s: %lld allocations, %lld frees after %d ms\n", __FILE__, __LINE__, #kind, \
              DELTA(b, m_, kind##_allocs), DELTA(b, m_, kind##_frees), SETTLE_MS);        \
      check_failures++;                                                                   \
    }                                                                                     \
  } while (0)

/* p was given to cudaFree (or cuMemFree) and nothing of the program's has
 * been allocated at p since: natively, p is no longer device memory. Under
 * the shim its block may also still be allocated at the driver (FAKECUDA_POOL),
 * queued or kept in the shim's cache of passed frees, but it is freed all the
 * same for the program: CHECK_RELEASED then frees it a second time, which
 * must be refused as a double free is natively (cudaErrorInvalidValue, the
 * last error set once; rt_invalid_frees counts it, natively too).
 * CHECK_RELEASED_KIND is the first half, for a test that makes the second
 * free itself. */
#define CHECK_RELEASED_KIND(p)                                                                       \
  do {                                                                                               \
    int kind_ = ptr_kind(p);                                                                         \
    if (!(kind_ == FAKECUDA_NONE || (under_shim() && kind_ == FAKECUDA_POOL))) {                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s is freed, but the double has it as kind %d (%s)\n", __FILE__, \
              __LINE__, #p, kind_, under_shim() ? "want NONE or POOL" : "want NONE");                \
      check_failures++;                                                                              \
    }                                                                                                \
  } while (0)
#define CHECK_RELEASED(p)                                                                     \
  do {                                                                                        \
    CHECK_RELEASED_KIND(p);                                                                   \
    cudaError_t again_ = cudaFree((void *)(p));                                               \
    if (again_ != cudaErrorInvalidValue) {                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: a second cudaFree(%s) returned %d, want %d\n", __FILE__, __LINE__, \
              #p, (int)again_, (int)cudaErrorInvalidValue);                                   \
      check_failures++;                                                                       \
    }                                                                                         \
    CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);                                             \
  } while (0)

/* cudaMalloc, telling the double when the block is not new memory from the
 * driver but one the shim kept after a free (its cache): the double then
 * checks that the new owner's work is ordered after the old owner's
 * (fakecuda_handed_out, unordered_uses). *reissued (if given) says which;
 * natively it is always 0. */
static inline cudaError_t seen_if_kept(cudaError_t rc, void **p, uint64_t allocs_before, int *reissued) {
  /* The shim allocates at the driver on the calling thread: no driver
   * allocation by this thread in the call means a block it kept. */
  struct fakecuda_ptr_info info;
  int old = rc == cudaSuccess && *p && fakecuda_ptr_info(*p, &info) && info.base == (uintptr_t)*p &&
            fakecuda_thread_allocs() == allocs_before;
  if (old) fakecuda_handed_out(*p);
  if (reissued) *reissued = old;
  return rc;
}

static inline cudaError_t malloc_seen(void **p, size_t size, int *reissued) {
  uint64_t before = fakecuda_thread_allocs();
  return seen_if_kept(cudaMalloc(p, size), p, before, reissued);
}

/* The double's last complaint, printed as an informational line. */
static inline void show_problem(const char *where) {
  const char *p = fakecuda_last_problem();
  if (p && *p) printf("# fakecuda (%s): %s\n", where, p);
}

/* Between the snapshots b and m: no free and no use of a block out of order,
 * no stale handle, no bad free reached the driver. */
#define CHECK_ORDERLY(b, m, label)                                 \
  do {                                                             \
    CHECK_EQ(DELTA(b, m, unordered_frees), 0);                     \
    CHECK_EQ(DELTA(b, m, unordered_uses), 0);                      \
    CHECK_EQ(DELTA(b, m, invalid_handles), 0);                     \
    CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);                   \
    show_problem(label);                                           \
  } while (0)

/* cudaGetLastError must give `code` once, then cudaSuccess. */
#define CHECK_LAST_ERROR_ONCE(code)                                   \
  do {                                                                \
    cudaError_t first_ = cudaGetLastError();                          \
    cudaError_t second_ = cudaGetLastError();                         \
    if (first_ != (code) || second_ != cudaSuccess) {                 \
      fprintf(stderr, "%s:%d: last error: got %d then %d, want %d then 0\n", __FILE__, __LINE__, (int)first_, \
              (int)second_, (int)(code));                             \
      check_failures++;                                               \
    }                                                                 \
  } while (0)

#define CHECK_EQ(a, b)                                                            \
  do {                                                                            \
    long long a_ = (long long)(a), b_ = (long long)(b);                           \
    if (a_ != b_) {                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, #a, #b, a_, b_); \
      check_failures++;                                                           \
    }                                                                             \
  } while (0)

/* Whether the block at p, freed by the program while leased, is freed for
 * real once the lease has ended: the server sees the end on its own thread,
 * so the next allocations (which issue the frees it queued) are retried. */
static inline int freed_once_released(void *p) {
  struct fakecuda_ptr_info info;
  for (int attempt = 0; attempt < 200; attempt++) {
    void *next = NULL;
    CHECK_CUDA(cudaMalloc(&next, MiB));
    CHECK_CUDA(cudaDeviceSynchronize());
    int live = fakecuda_ptr_info(p, &info) && info.base == (uintptr_t)p;
    CHECK_CUDA(cudaFree(next));
    if (!live || next == p) return 1;
    usleep(10000);
  }
  return 0;
}

#endif
