/* The driver front door (docs/DESIGN.md, "How programs reach the allocator"): a
 * program built with nvcc's default, the static runtime, has no cudaMalloc
 * to interpose. It links no CUDA library: it dlopens libcuda.so.1, finds
 * cuGetProcAddress_v2 with dlsym, asks it for "cuGetProcAddress", and gets
 * every entry point through that ("cuMemAlloc"/"cuMemFree" at version 3020,
 * that is the _v2 functions). This program does the same (so it includes no
 * common.h: it links nothing of CUDA, and reaches the double's observation
 * functions with dlsym too). Under the shim, the cuMemAlloc it gets must be
 * served by the pool and cuMemFree must give the block back; natively both
 * are plain, and with SOMA_DISABLE=1 they are the driver's own functions, as
 * every other. Return codes are compared with the native run. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "fakecuda.h"

#define MiB ((size_t)1 << 20)

/* Whether `fn` is code of the shim's library (else the driver's). */
static int in_shim(void *fn) {
  Dl_info info;
  return dladdr(fn, &info) && info.dli_fname && strstr(info.dli_fname, "libsomashim") != NULL;
}

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static gpa_t gpa;
static CUresult (*p_init)(unsigned);
static CUresult (*p_retain)(CUcontext *, CUdevice);
static CUresult (*p_set_current)(CUcontext);
static CUresult (*p_alloc)(CUdeviceptr *, size_t);
static CUresult (*p_free)(CUdeviceptr);
static CUresult (*p_sync)(void);
static void (*p_snapshot)(struct fakecuda_counters *);
static int (*p_ptr_info)(const void *, struct fakecuda_ptr_info *);

static void *proc(const char *name, int version) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult status;
  CUresult r = gpa(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r != CUDA_SUCCESS || !fn) {
    fprintf(stderr, "cuGetProcAddress(%s, %d) failed: %d\n", name, version, (int)r);
    check_failures++;
  }
  return fn;
}

static int kind(CUdeviceptr p) {
  struct fakecuda_ptr_info info;
  p_ptr_info((void *)p, &info);
  return info.kind;
}

static struct fakecuda_counters snap(void) {
  struct fakecuda_counters c;
  p_snapshot(&c);
  return c;
}
#define DELTA(b, m, f) ((long long)((m).f - (b).f))

/* A next allocation and free, through the same entry points (see nudge in
 * common.h; this program has no non-blocking stream, so the shim frees on
 * the legacy stream at once). */
static void nudge(void) {
  CUdeviceptr t = 0;
  if (p_alloc(&t, 4096) == CUDA_SUCCESS) p_free(t);
}

int main(void) {
  const char *mode = getenv("CPUTEST_MODE");
  int shim = mode && strcmp(mode, "shim") == 0;
  printf("# mode %s\n", shim ? "shim" : "native");
  const char *off = getenv("SOMA_DISABLE");
  if (off && (!strcmp(off, "1") || !strcasecmp(off, "true") || !strcasecmp(off, "yes") || !strcasecmp(off, "on")))
    shim = 0; /* everything plain */
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  CHECK(h != NULL);
  if (!h) return report();
  gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
  CHECK(gpa != NULL);
  if (!gpa) return report();
  gpa_t inner = (gpa_t)proc("cuGetProcAddress", 12000);
  if (inner) gpa = inner;
  p_snapshot = (void (*)(struct fakecuda_counters *))dlsym(h, "fakecuda_snapshot");
  p_ptr_info = (int (*)(const void *, struct fakecuda_ptr_info *))dlsym(h, "fakecuda_ptr_info");
  p_init = (CUresult(*)(unsigned))proc("cuInit", 2000);
  p_retain = (CUresult(*)(CUcontext *, CUdevice))proc("cuDevicePrimaryCtxRetain", 7000);
  p_set_current = (CUresult(*)(CUcontext))proc("cuCtxSetCurrent", 4000);
  p_alloc = (CUresult(*)(CUdeviceptr *, size_t))proc("cuMemAlloc", 3020);
  p_free = (CUresult(*)(CUdeviceptr))proc("cuMemFree", 3020);
  p_sync = (CUresult(*)(void))proc("cuCtxSynchronize", 2000);
  if (check_failures || !p_snapshot || !p_ptr_info) return report();
  /* The shim hands out its own allocation entry points, and only when enabled. */
  CHECK(in_shim((void *)p_alloc) == shim);
  CHECK(in_shim((void *)p_free) == shim);
  CHECK(in_shim((void *)dlsym(h, "cuMemAlloc_v2")) == shim);

  /* what the static runtime does before the first allocation */
  CUcontext ctx = NULL;
  SHOW_RC("cuInit", p_init(0));
  SHOW_RC("retain", p_retain(&ctx, 0));
  SHOW_RC("set current", p_set_current(ctx));

  struct fakecuda_counters b = snap();
  CUdeviceptr p = 0;
  SHOW_RC("cuMemAlloc 1MiB", p_alloc(&p, MiB));
  struct fakecuda_counters m = snap();
  CHECK(p != 0);
  printf("# cuMemAlloc served by the %s allocator\n", kind(p) == FAKECUDA_POOL ? "pool" : "plain");
  if (kind(p) != (shim ? FAKECUDA_POOL : FAKECUDA_PLAIN)) {
    fprintf(stderr, "%s:%d: cuMemAlloc from cuGetProcAddress: %s block, want %s\n", __FILE__, __LINE__,
            kind(p) == FAKECUDA_POOL ? "a pool" : "a plain", shim ? "a pool" : "a plain");
    check_failures++;
  }
  CHECK(DELTA(b, m, pool_allocs) == (shim ? 1 : 0));
  SHOW_RC("cuMemFree", p_free(p));
  nudge();
  CHECK(kind(p) == FAKECUDA_NONE);
  SHOW_RC("cuMemFree again", p_free(p));
  int host = 0;
  SHOW_RC("cuMemFree(host)", p_free((CUdeviceptr)&host));
  SHOW_RC("cuMemAlloc(0)", p_alloc(&p, 0));
  SHOW_RC("cuMemAlloc(NULL)", p_alloc(NULL, 16));

  /* dlsym of the _v2 names, as some programs do */
  CUresult (*d_alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
  CUresult (*d_free)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(h, "cuMemFree_v2");
  CHECK(d_alloc && d_free);
  if (d_alloc && d_free) {
    CUdeviceptr q = 0;
    SHOW_RC("dlsym'd cuMemAlloc_v2", d_alloc(&q, 2 * MiB));
    if (kind(q) != (shim ? FAKECUDA_POOL : FAKECUDA_PLAIN)) {
      fprintf(stderr, "%s:%d: cuMemAlloc_v2 from dlsym: %s block, want %s\n", __FILE__, __LINE__,
              kind(q) == FAKECUDA_POOL ? "a pool" : "a plain", shim ? "a pool" : "a plain");
      check_failures++;
    }
    SHOW_RC("dlsym'd cuMemFree_v2", d_free(q));
  }

  /* many pairs, and the counts balance */
  b = snap();
  for (int i = 0; i < 100; i++) {
    CUdeviceptr r = 0;
    CHECK(p_alloc(&r, (size_t)(i + 1) * 5000) == CUDA_SUCCESS);
    CHECK(p_free(r) == CUDA_SUCCESS);
  }
  nudge();
  SHOW_RC("sync", p_sync());
  m = snap();
  long long out = DELTA(b, m, pool_allocs) - DELTA(b, m, pool_frees);
  CHECK(out >= 0 && out <= (shim ? 2 : 0));
  CHECK(DELTA(b, m, plain_allocs) == DELTA(b, m, plain_frees));
  CHECK(DELTA(b, m, unordered_frees) == 0);
  /* only this program's own bad frees reached the driver as such */
  struct fakecuda_counters all = snap();
  CHECK(all.drv_invalid_frees == 2);
  return report();
}
