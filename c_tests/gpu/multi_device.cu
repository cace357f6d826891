/* Contract 6 (needs 2 GPUs): allocation comes from the current device's pool;
 * a pointer of device 1 freed while device 0 is current goes back to device
 * 1's pool and the current device stays 0. cudaPointerGetAttributes tells
 * each block's device. */
#include "gpu_common.h"

static unsigned *host;

static int dev_of(const void *p) {
  cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  cudaError_t r = cudaPointerGetAttributes(&a, p);
  if (r != cudaSuccess) {
    (void)cudaGetLastError();
    return -100 - (int)r;
  }
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

static int cur(void) {
  int d = -1;
  CHECK_CUDA(cudaGetDevice(&d));
  return d;
}

/* Allocate on device dev (made current), check where the block lives, use it
 * there. */
static void *alloc_on(int dev, size_t bytes, unsigned seed, const char *what) {
  CHECK_CUDA(cudaSetDevice(dev));
  void *p = NULL;
  cudaError_t rc = TMALLOC(&p, bytes);
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  size_t bad = p ? fill_and_verify(p, bytes, seed, s, host) : 1;
  CHECK_CUDA(cudaStreamDestroy(s));
  printf("%-40s current=%d rc=%d block_device=%d verified_bad=%zu\n", what, dev, (int)rc, dev_of(p), bad);
  CHECK(rc == cudaSuccess && dev_of(p) == dev && bad == 0);
  return p;
}

static void free_from(int current, void *p, const char *what) {
  CHECK_CUDA(cudaSetDevice(current));
  cudaError_t rc = cudaFree(p);
  cudaError_t l = cudaGetLastError();
  printf("%-40s current=%d rc=%d last=%d current_after=%d\n", what, current, (int)rc, (int)l, cur());
  CHECK(rc == cudaSuccess && cur() == current);
}

struct tjob {
  void *p;
};
static void *thread_alloc_dev1(void *a) {
  struct tjob *j = (struct tjob *)a;
  unsigned *h = NULL;
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaMallocHost(&h, 1 * MiB));
  CHECK_CUDA(TMALLOC(&j->p, 1 * MiB));
  size_t bad = j->p ? fill_and_verify(j->p, 1 * MiB, 31, 0, h) : 1;
  CHECK(bad == 0);
  CHECK_CUDA(cudaFreeHost(h));
  return NULL;
}

int main(void) {
  int n = 0;
  CHECK_CUDA(cudaGetDeviceCount(&n));
  printf("# devices: %d\n", n);
  if (n < 2) {
    printf("needs 2 GPUs\n");
    CHECK(n >= 2);
    return report();
  }
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMallocHost(&host, 4 * MiB));

  void *p1 = alloc_on(1, 1 * MiB, 1, "alloc on device 1");
  void *p0 = alloc_on(0, 1 * MiB, 2, "alloc on device 0");
  free_from(0, p1, "free device-1 block from device 0");
  cudaError_t rc = cudaFree(p1);
  cudaError_t l = cudaGetLastError();
  printf("%-40s rc=%d last=%d current_after=%d\n", "double free of it", (int)rc, (int)l, cur());
  CHECK(rc != cudaSuccess && cur() == 0);

  /* Back on device 1, the same size again: from device 1's pool. */
  void *p1b = alloc_on(1, 1 * MiB, 3, "alloc on device 1 again");
  printf("# device-1 block reused at the same address: %s\n", p1b == p1 ? "yes" : "no");
  free_from(1, p1b, "free device-1 block from device 1");

  /* Alternate: allocate on one device, free with the other current. */
  int ok = 0;
  for (int i = 0; i < 40; i++) {
    int dev = i % 2;
    size_t bytes = (i % 4 < 2) ? 1 * MiB : 64 * KiB;
    CHECK_CUDA(cudaSetDevice(dev));
    void *p = NULL;
    CHECK_CUDA(TMALLOC(&p, bytes));
    size_t bad = p ? fill_and_verify(p, bytes, 100u + i, 0, host) : 1;
    int d = dev_of(p);
    CHECK_CUDA(cudaSetDevice(1 - dev));
    cudaError_t r = cudaFree(p);
    ok += bad == 0 && d == dev && r == cudaSuccess && cur() == 1 - dev;
  }
  printf("alternating alloc/free across devices: %d of 40 ok\n", ok);
  CHECK(ok == 40);

  /* Another thread allocates on device 1; this thread (device 0) frees it. */
  struct tjob j = {NULL};
  pthread_t t;
  pthread_create(&t, NULL, thread_alloc_dev1, &j);
  pthread_join(t, NULL);
  printf("block from a device-1 thread: block_device=%d\n", dev_of(j.p));
  free_from(0, j.p, "free it from device 0");

  /* The current device's own blocks are unaffected. */
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMemcpy(host, p0, 1 * MiB, cudaMemcpyDeviceToHost));
  size_t bad0 = count_bad_host(host, MiB / 4, 2);
  printf("device-0 block intact: bad=%zu\n", bad0);
  CHECK(bad0 == 0);
  free_from(0, p0, "free device-0 block");
  CHECK_CUDA(cudaFreeHost(host));
  print_pooled();
  return report();
}
