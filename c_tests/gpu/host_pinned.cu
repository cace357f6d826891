/* Pinned host memory (cudaMallocHost, cudaHostAlloc and each flag, or the
 * driver's cuMemAllocHost/cuMemHostAlloc): the CPU may use it at once; kernels
 * on every kind of stream read and write it through its own address; async
 * copies to and from it work on every stream; cudaHostGetFlags,
 * cudaHostGetDevicePointer (start and interior) and cudaPointerGetAttributes
 * answer as for real pinned memory; cudaFreeHost of NULL, of a malloc
 * pointer, of a device pointer, twice, and cudaFree of pinned memory return
 * the real codes and last errors. WriteCombined passes through (the shim
 * says so in its statistics); every other allocation is pooled. */
#include "host_alloc.h"

enum { LEGACY, BLOCKING, NONBLOCKING, PER_THREAD, NKINDS };
static const char *kind_name[NKINDS] = {"legacy", "blocking", "nonblocking", "per-thread-default"};

static void use_everywhere(const char *what, unsigned *h, size_t bytes, cudaStream_t *s, unsigned *dev) {
  size_t n = bytes / sizeof(unsigned);
  /* The CPU at once, with no call in between. */
  for (size_t i = 0; i < n; i++) h[i] = pattern(1, i);
  size_t bad_cpu = count_bad_host(h, n, 1);
  for (int k = 0; k < NKINDS; k++) {
    unsigned seed = 10 + k;
    /* A kernel writes the memory through its host address, the CPU reads it. */
    k_fill<<<grid_for(n, 1024), 256, 0, s[k]>>>(h, n, seed);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaStreamSynchronize(s[k]));
    size_t bad_kernel = count_bad_host(h, n, seed);
    /* Copies to the device and back, on the same stream. */
    CHECK_CUDA(cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, s[k]));
    k_fill<<<grid_for(n, 1024), 256, 0, s[k]>>>(dev, n, seed + 100);
    CHECK_CUDA(cudaMemcpyAsync(h, dev, bytes, cudaMemcpyDeviceToHost, s[k]));
    CHECK_CUDA(cudaStreamSynchronize(s[k]));
    size_t bad_copy = count_bad_host(h, n, seed + 100);
    printf("%s bytes=%zu stream=%s: cpu bad=%zu kernel bad=%zu copy bad=%zu\n", what, bytes, kind_name[k], bad_cpu,
           bad_kernel, bad_copy);
    CHECK(bad_cpu == 0 && bad_kernel == 0 && bad_copy == 0);
  }
}

static void queries(const char *what, void *p) {
  unsigned flags = 0xdead;
  cudaError_t rf = host_flags(&flags, p);
  void *d = NULL;
  cudaError_t rd = host_device_pointer(&d, p);
  char *q = (char *)p + 100;
  void *dq = NULL;
  cudaError_t rdq = host_device_pointer(&dq, q);
  unsigned fq = 0xdead;
  cudaError_t rfq = host_flags(&fq, q);
  cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  cudaError_t ra = cudaPointerGetAttributes(&a, p);
  printf("%s: flags rc=%d 0x%x; device pointer rc=%d %s; interior: device pointer rc=%d %s, flags rc=%d 0x%x; "
         "attributes rc=%d type=%d device=%d devicePointer%s hostPointer%s; last=%d\n",
         what, (int)rf, flags, (int)rd, d == p ? "==p" : "!=p", (int)rdq, dq == q ? "==q" : "!=q", (int)rfq, fq,
         (int)ra, (int)a.type, a.device, a.devicePointer == p ? "==p" : "!=p", a.hostPointer == p ? "==p" : "!=p",
         (int)cudaGetLastError());
}

int main(void) {
  CHECK_CUDA(cudaFree(NULL));
  cudaStream_t s[NKINDS];
  s[LEGACY] = 0;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s[BLOCKING], cudaStreamDefault));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s[NONBLOCKING], cudaStreamNonBlocking));
  s[PER_THREAD] = cudaStreamPerThread;
  unsigned *dev = NULL;
  CHECK_CUDA(cudaMalloc((void **)&dev, 64 * MiB));

  struct { const char *name; int plain; unsigned flags; } kinds[] = {
#ifdef SOMA_DRIVER_API
    {"cuMemAllocHost", 1, 0},
    {"cuMemHostAlloc(DEVICEMAP)", 0, 2},
    {"cuMemHostAlloc(WRITECOMBINED)", 0, 4},
#else
    {"cudaMallocHost", 1, 0},
    {"cudaHostAlloc(Default)", 0, 0},
    {"cudaHostAlloc(Portable)", 0, 1},
    {"cudaHostAlloc(Mapped)", 0, 2},
    {"cudaHostAlloc(Portable|Mapped)", 0, 3},
    {"cudaHostAlloc(WriteCombined)", 0, 4},
#endif
  };
  size_t sizes[] = {4 * KiB, 1 * MiB, 64 * MiB};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    for (size_t z = 0; z < 3; z++) {
      if ((kinds[k].flags & 4) && z == 2) continue; /* CPU reads of write-combined memory crawl */
      for (int round = 0; round < 2; round++) { /* the second round may get a reused block */
        void *p = NULL;
        cudaError_t r = kinds[k].plain ? thost_malloc(&p, sizes[z]) : thost_alloc(&p, sizes[z], kinds[k].flags);
        printf("%s(%zu) round %d: rc=%d %s\n", kinds[k].name, sizes[z], round, (int)r, nn(p));
        CHECK_CUDA(r);
        if (z == 1) queries(kinds[k].name, p);
        use_everywhere(kinds[k].name, (unsigned *)p, sizes[z], s, dev);
        CHECK_CUDA(host_free(p));
      }
    }
  }

  /* Edge cases and errors, each with the last error it leaves. */
  void *p = (void *)1;
  cudaError_t r = host_malloc(&p, 0);
  printf("size 0: rc=%d p=%s last=%d\n", (int)r, p == (void *)1 ? "untouched" : nn(p), (int)cudaGetLastError());
  r = host_free(NULL);
  printf("free NULL: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  void *m = malloc(4096);
  r = host_free(m);
  printf("free of a malloc pointer: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  free(m);
  r = host_free(dev);
  printf("free of a device pointer: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  CHECK_CUDA(thost_malloc(&p, 1 * MiB));
  r = cudaFree(p);
  printf("cudaFree of pinned memory: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  r = host_free((char *)p + 256);
  printf("free of an interior pointer: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  r = host_free(p);
  printf("free: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  r = host_free(p);
  printf("double free: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  unsigned f = 0;
  r = host_flags(&f, p);
  printf("flags of freed memory: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  void *dp = NULL;
  r = host_device_pointer(&dp, dev);
  printf("device pointer of device memory: rc=%d last=%d\n", (int)r, (int)cudaGetLastError());

  CHECK_CUDA(cudaFree(dev));
  CHECK_CUDA(cudaStreamDestroy(s[BLOCKING]));
  CHECK_CUDA(cudaStreamDestroy(s[NONBLOCKING]));
  print_pooled();
  return 0;
}
