/* Pinned host memory (cudaMallocHost, cudaHostAlloc and each flag; with
 * PINNED_DOOR=driver the driver's cuMemAllocHost/cuMemHostAlloc/
 * cuMemFreeHost/cuMemHostGetFlags/cuMemHostGetDevicePointer). Under the shim
 * it comes from a host memory pool (natively, and where the shim passes it
 * through: WriteCombined, SOMA_HOST_POOL=0, SOMA_DISABLE=1, no host pool
 * support, several devices, it is plain pinned memory); either way:
 * - the CPU may write and read it at once (fakecuda_cpu_use: the double
 *   counts a CPU use before the host saw the allocation and the earlier
 *   owners' work finish as an unordered use);
 * - kernels (fakecuda_launch) and async copies on the legacy, a blocking, the
 *   per-thread and non-blocking streams use it;
 * - a block given to cudaFreeHost is not handed out again, nor returned to
 *   the pool, before all work issued before the free on every stream has
 *   finished, with only blocking streams and with non-blocking ones too: the
 *   next owner's CPU writes and every stream's work right after the
 *   allocation must be ordered after the old owner's (unordered_uses,
 *   unordered_frees: 0). Under the shim, where it pools, some block must be
 *   handed out again, or the check would prove nothing;
 * - flags, device pointer (start and interior) and the error codes and last
 *   errors of the real calls (docs/FACTS.md), compared with the native run. */
#include "common.h"

static int g_driver; /* PINNED_DOOR=driver */

static cudaError_t h_alloc(void **p, size_t n, int plain, unsigned flags) {
  if (g_driver) return (cudaError_t)(plain ? cuMemAllocHost(p, n) : cuMemHostAlloc(p, n, flags));
  return plain ? cudaMallocHost(p, n) : cudaHostAlloc(p, n, flags);
}
static cudaError_t h_free(void *p) { return g_driver ? (cudaError_t)cuMemFreeHost(p) : cudaFreeHost(p); }
static cudaError_t h_flags(unsigned *f, void *p) {
  return g_driver ? (cudaError_t)cuMemHostGetFlags(f, p) : cudaHostGetFlags(f, p);
}
static cudaError_t h_device_pointer(void **d, void *p) {
  if (!g_driver) return cudaHostGetDevicePointer(d, p, 0);
  CUdeviceptr x = 0;
  CUresult r = cuMemHostGetDevicePointer(&x, p, 0);
  *d = (void *)(uintptr_t)x;
  return (cudaError_t)r;
}

/* Whether the shim should serve a pinned allocation with these flags from its host pool. */
static int expect_host_pool(unsigned flags) {
  const char *devices = getenv("FAKECUDA_DEVICES");
  return under_shim() && !env_flag("SOMA_DISABLE", 0) && env_flag("SOMA_HOST_POOL", 0) &&
         !env_flag("FAKECUDA_NO_POOLS", 0) && !env_flag("FAKECUDA_NO_HOST_POOLS", 0) &&
         (!devices || strcmp(devices, "1") == 0) && !(flags & cudaHostAllocWriteCombined);
}

/* Allocates, telling the double when the block is one the shim kept after a
 * cudaFreeHost (its cache: no driver allocation by this thread in the call),
 * as malloc_seen does for cudaMalloc. */
static cudaError_t alloc_seen(void **p, size_t n, int plain, unsigned flags, int *reissued) {
  uint64_t before = fakecuda_thread_allocs();
  return seen_if_kept(h_alloc(p, n, plain, flags), p, before, reissued);
}

/* Where the block came from: the host pool when expected, else plain pinned. */
static void check_placement(const char *what, void *p, unsigned flags) {
  struct fakecuda_ptr_info info;
  CHECK(fakecuda_ptr_info(p, &info) && info.host && info.base == (uintptr_t)p);
  int want = expect_host_pool(flags) ? FAKECUDA_POOL : FAKECUDA_PINNED;
  if (info.kind != want) {
    fprintf(stderr, "%s:%d: %s: the block is of kind %d, want %d\n", __FILE__, __LINE__, what, info.kind, want);
    check_failures++;
  }
  struct fakecuda_pool_stats ps;
  if (info.kind == FAKECUDA_POOL) CHECK(fakecuda_pool_stats(info.pool, &ps) && ps.is_host);
}

/* The CPU writes, or counts the bytes that are not v, at once. */
static void cpu_write(void *p, size_t n, int v) {
  CHECK(fakecuda_cpu_use(p));
  memset(p, v, n);
}
static size_t cpu_bad(const void *p, size_t n, int v) {
  CHECK(fakecuda_cpu_use(p));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += ((const unsigned char *)p)[i] != (unsigned char)v;
  return bad;
}

enum { LEGACY, BLOCKING, PER_THREAD, NONBLOCKING, NONBLOCKING2, NSTREAMS };
static const char *stream_name[NSTREAMS] = {"legacy", "blocking", "per-thread", "nonblocking", "nonblocking2"};
static cudaStream_t g_s[NSTREAMS];

/* The CPU, a kernel and copies to and from device memory on each stream. */
static void use_everywhere(const char *what, void *h, size_t n, void *dev) {
  cpu_write(h, n, 1);
  size_t bad_cpu = cpu_bad(h, n, 1);
  for (int k = 0; k < NSTREAMS; k++) {
    CHECK_EQ(fakecuda_launch(g_s[k], h), CUDA_SUCCESS);
    CHECK_CUDA(cudaStreamSynchronize(g_s[k]));
    cpu_write(h, n, 10 + k);
    CHECK_CUDA(cudaMemcpyAsync(dev, h, n, cudaMemcpyHostToDevice, g_s[k]));
    CHECK_EQ(fakecuda_launch(g_s[k], dev), CUDA_SUCCESS);
    CHECK_CUDA(cudaStreamSynchronize(g_s[k]));
    cpu_write(h, n, 0);
    CHECK_CUDA(cudaMemcpyAsync(h, dev, n, cudaMemcpyDeviceToHost, g_s[k]));
    CHECK_CUDA(cudaStreamSynchronize(g_s[k]));
    size_t bad_copy = cpu_bad(h, n, 10 + k);
    printf("%s bytes=%zu stream=%s: cpu bad=%zu copy bad=%zu\n", what, n, stream_name[k], bad_cpu, bad_copy);
    CHECK(bad_cpu == 0 && bad_copy == 0);
  }
}

static void queries(const char *what, void *p) {
  unsigned flags = 0xdead, interior_flags = 0xdead;
  void *d = NULL, *dq = NULL;
  char *q = (char *)p + 100;
  cudaError_t rf = h_flags(&flags, p), rd = h_device_pointer(&d, p);
  cudaError_t rdq = h_device_pointer(&dq, q), rfq = h_flags(&interior_flags, q);
  printf("%s: flags rc=%d 0x%x; device pointer rc=%d %s; interior: device pointer rc=%d %s, flags rc=%d 0x%x; "
         "last=%d\n",
         what, (int)rf, flags, (int)rd, d == p ? "==p" : "!=p", (int)rdq, dq == q ? "==q" : "!=q", (int)rfq,
         interior_flags, (int)cudaGetLastError());
}

/* Frees of blocks still in use on `nstreams` of the streams, each followed at
 * once by an allocation of the same size that the CPU writes and every stream
 * uses. Under the shim, where it pools, it goes on (up to SETTLE_MS) until
 * one allocation got a block the shim kept after a free (its cache), so that
 * the check has teeth; a block the pool reuses is checked by the double all
 * the same (its earlier work becomes what the CPU and streams must follow). */
static void race(const char *label, int nstreams, void *dev, int iters) {
  const size_t n = MiB;
  struct fakecuda_counters b = snap();
  int reused = 0, waited = 0;
  int want_reuse = expect_host_pool(0);
  void *a = NULL;
  CHECK_CUDA(alloc_seen(&a, n, 1, 0, NULL));
  for (int i = 0; a && (i < iters || (want_reuse && !reused && waited < SETTLE_MS)); i++) {
    if (i >= iters) {
      usleep(1000);
      waited++;
    }
    cpu_write(a, n, i & 0xff);
    CHECK_EQ(fakecuda_launch(g_s[i % nstreams], a), CUDA_SUCCESS); /* a kernel reads it */
    CHECK_CUDA(cudaMemcpyAsync(dev, a, n, cudaMemcpyHostToDevice, g_s[(i + 1) % nstreams]));
    CHECK_CUDA(h_free(a));
    void *next = NULL;
    int reissued = 0;
    CHECK_CUDA(alloc_seen(&next, n, 1, 0, &reissued));
    if (!next) break;
    reused += reissued;
    cpu_write(next, n, (i + 1) & 0xff); /* the next owner's CPU writes at once */
    for (int k = 0; k < nstreams; k++) CHECK_EQ(fakecuda_launch(g_s[k], next), CUDA_SUCCESS);
    a = next;
  }
  CHECK_CUDA(h_free(a));
  printf("# %s: %d allocations got a block the shim kept after a free\n", label, reused);
  if (want_reuse) CHECK(reused > 0);
  else CHECK_EQ(reused, 0);
  struct fakecuda_counters m = snap();
  CHECK_ORDERLY(b, m, label);
}

static void errors(void *dev) {
  void *p = (void *)1;
  cudaError_t r = h_alloc(&p, 0, 1, 0);
  printf("size 0: rc=%d p=%s last=%d\n", (int)r, p ? "set" : "NULL", (int)cudaGetLastError());
  r = h_alloc(NULL, 16, 1, 0);
  printf("NULL out-pointer: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  p = (void *)1;
  r = h_alloc(&p, 4096, 0, 0x100);
  printf("unknown flags: rc=%d p=%s last=%d\n", (int)r, p ? "set" : "NULL", (int)cudaGetLastError());
  p = (void *)1;
  r = h_alloc(&p, (size_t)1 << 50, 1, 0);
  printf("impossible size: rc=%d p=%s last=%d\n", (int)r, p ? "set" : "NULL", (int)cudaGetLastError());
  r = h_free(NULL);
  printf("free NULL: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  void *m = malloc(4096);
  r = h_free(m);
  printf("free of a malloc pointer: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  free(m);
  r = h_free(dev);
  printf("free of a device pointer: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  p = NULL;
  CHECK_CUDA(h_alloc(&p, MiB, 1, 0));
  r = cudaFree(p);
  printf("cudaFree of pinned memory: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  r = h_free((char *)p + 256);
  printf("free of an interior pointer: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  r = h_free(p);
  printf("free: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  r = h_free(p);
  printf("double free: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  unsigned f = 0;
  r = h_flags(&f, p);
  printf("flags of freed memory: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  void *d = NULL;
  r = h_device_pointer(&d, dev);
  printf("device pointer of device memory: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  r = h_flags(&f, dev);
  printf("flags of device memory: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
}

int main(void) {
  g_driver = env_is("PINNED_DOOR", "driver");
  printf("# mode %s, %s door\n", under_shim() ? "shim" : "native", g_driver ? "driver" : "runtime");
  CHECK_CUDA(cudaFree(NULL));
  struct fakecuda_counters start = snap();
  void *dev = NULL;
  CHECK_CUDA(cudaMalloc(&dev, 4 * MiB));
  g_s[LEGACY] = 0;
  g_s[PER_THREAD] = cudaStreamPerThread;
  CHECK_CUDA(cudaStreamCreate(&g_s[BLOCKING]));

  /* Only blocking streams: a shim that orders its device frees on the legacy
   * stream must not reuse host blocks in that order (the CPU is not ordered). */
  race("only blocking streams", 3, dev, 100);

  CHECK_CUDA(cudaStreamCreateWithFlags(&g_s[NONBLOCKING], cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithPriority(&g_s[NONBLOCKING2], cudaStreamNonBlocking, -1));

  struct { const char *name; int plain; unsigned flags; } kinds[] = {
      {"cudaMallocHost", 1, 0},
      {"cudaHostAlloc(Default)", 0, cudaHostAllocDefault},
      {"cudaHostAlloc(Portable)", 0, cudaHostAllocPortable},
      {"cudaHostAlloc(Mapped)", 0, cudaHostAllocMapped},
      {"cudaHostAlloc(Portable|Mapped)", 0, cudaHostAllocPortable | cudaHostAllocMapped},
      {"cudaHostAlloc(WriteCombined)", 0, cudaHostAllocWriteCombined},
  }, driver_kinds[] = {
      {"cuMemAllocHost", 1, 0},
      {"cuMemHostAlloc(0)", 0, 0},
      {"cuMemHostAlloc(PORTABLE)", 0, CU_MEMHOSTALLOC_PORTABLE},
      {"cuMemHostAlloc(DEVICEMAP)", 0, CU_MEMHOSTALLOC_DEVICEMAP},
      {"cuMemHostAlloc(WRITECOMBINED)", 0, CU_MEMHOSTALLOC_WRITECOMBINED},
  };
  int nkinds = g_driver ? 5 : 6;
  const size_t sizes[] = {4096, MiB};
  for (int k = 0; k < nkinds; k++) {
    const char *name = g_driver ? driver_kinds[k].name : kinds[k].name;
    int plain = g_driver ? driver_kinds[k].plain : kinds[k].plain;
    unsigned flags = g_driver ? driver_kinds[k].flags : kinds[k].flags;
    for (int z = 0; z < 2; z++) {
      for (int round = 0; round < 2; round++) { /* the second round may get the first one's block */
        struct fakecuda_counters b = snap();
        void *p = NULL;
        cudaError_t r = alloc_seen(&p, sizes[z], plain, flags, NULL);
        printf("%s(%zu) round %d: rc=%d %s\n", name, sizes[z], round, (int)r, p ? "set" : "NULL");
        CHECK_CUDA(r);
        if (!p) continue;
        check_placement(name, p, flags);
        if (z == 1) queries(name, p);
        use_everywhere(name, p, sizes[z], dev);
        /* freed while a kernel and a copy may still use it */
        CHECK_EQ(fakecuda_launch(g_s[NONBLOCKING], p), CUDA_SUCCESS);
        CHECK_CUDA(cudaMemcpyAsync(dev, p, sizes[z], cudaMemcpyHostToDevice, g_s[BLOCKING]));
        CHECK_CUDA(h_free(p));
        struct fakecuda_counters m = snap();
        CHECK_ORDERLY(b, m, name);
      }
    }
  }

  race("non-blocking streams too", NSTREAMS, dev, 100);
  errors(dev);

  CHECK_CUDA(cudaFree(dev));
  for (int k = BLOCKING; k < NSTREAMS; k++)
    if (k != PER_THREAD) CHECK_CUDA(cudaStreamDestroy(g_s[k]));
  /* All ordering checked: the host may now let every free pass. Every block
   * reaches its pool (or the real free) in the end. A lazy GPU passes what
   * the shim's thread joins only when the host waits again: so wait until
   * the shim has given every host block back. */
  struct fakecuda_counters m;
  EVENTUALLY((cudaDeviceSynchronize(), m = snap(), DELTA(start, m, host_pool_allocs) == DELTA(start, m, host_pool_frees)));
  CHECK_BALANCED(start, host_pool);
  CHECK_BALANCED(start, pinned);
  m = snap();
  if (expect_host_pool(0)) CHECK(DELTA(start, m, host_pool_allocs) > 0);
  else CHECK_EQ(DELTA(start, m, host_pool_allocs), 0);
  CHECK_EQ(DELTA(start, m, unordered_frees), 0);
  CHECK_EQ(DELTA(start, m, unordered_uses), 0);
  show_problem("end");
  return report();
}
