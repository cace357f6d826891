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

/* The shim may keep a freed block from the driver until it has seen the
 * work issued before the free pass (it checks with cuEventQuery at its next
 * call), so a block reaches cuMemFreeAsync "eventually". One more shim
 * allocation and free, without any host synchronization (that would make
 * every ordering hold trivially), is that next call. With FAKECUDA_LAZY_GPU=1
 * nothing passes on its own: tests run that way with
 * SOMA_PENDING_FREE_LIMIT=0, so the shim waits for the events itself. */
static inline void nudge(void) {
  /* The shim asks the driver about pending frees at most every 20 us while
   * little is pending (it is costly on a GPU): give that interval time. */
  usleep(100);
  size_t size = 4096;
  uint64_t lo = env_bytes("SOMA_MIN_BYTES", 1), hi = env_bytes("SOMA_MAX_BYTES", UINT64_MAX);
  if (size < lo) size = lo;
  if (size > hi) size = hi;
  void *t = NULL;
  if (cudaMalloc(&t, size) == cudaSuccess) cudaFree(t);
}

/* Frees the shim may still hold back after a nudge (natively: none). */
#define PENDING_SLACK (under_shim() ? 2 : 0)
#define CHECK_BALANCED(b, m, kind)                                                       do {                                                                                     long long out_ = DELTA(b, m, kind##_allocs) - DELTA(b, m, kind##_frees);               if (out_ < 0 || out_ > PENDING_SLACK) {                                                  fprintf(stderr, "%s:%d: %s: %lld allocations, %lld frees\n", __FILE__, __LINE__, #kind,               DELTA(b, m, kind##_allocs), DELTA(b, m, kind##_frees));                        check_failures++;                                                                    }                                                                                    } while (0)

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
#endif
