/* Contract 12 (needs 2 GPUs), after NVIDIA's simpleP2P: once peer access is
 * enabled both ways, cudaMalloc'd blocks are reachable from the peer exactly
 * as the real cudaMalloc's are: cudaMemcpyPeer both ways, and kernels on one
 * device reading the other's block directly. A block allocated on each
 * device BEFORE peer access was enabled must be reachable afterwards too
 * (the grant covers past blocks), and so must blocks allocated after it and
 * blocks reused from the pool. */
#include "gpu_common.h"

static const size_t N = 4 * MiB, NW = 4 * MiB / 4;
static unsigned *host;

static size_t check_pattern(const void *d, int dev, unsigned seed, unsigned add) {
  CHECK_CUDA(cudaSetDevice(dev));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(host, d, N, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < NW; i++) bad += host[i] != pattern(seed, i) + add;
  return bad;
}

static void *alloc_filled(int dev, unsigned seed) {
  CHECK_CUDA(cudaSetDevice(dev));
  void *p = NULL;
  CHECK_CUDA(TMALLOC(&p, N));
  k_fill<<<256, 256>>>((unsigned *)p, NW, seed);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  return p;
}

/* A kernel on device `dev` reads src (on the other device) and writes dst (on
 * dev): dst = src + add. */
static size_t peer_kernel(int dev, const void *src, unsigned seed, const char *what) {
  CHECK_CUDA(cudaSetDevice(dev));
  void *dst = NULL;
  CHECK_CUDA(TMALLOC(&dst, N));
  k_xform<<<256, 256>>>((const unsigned *)src, (unsigned *)dst, NW, 3);
  cudaError_t rl = cudaGetLastError();
  cudaError_t rs = cudaDeviceSynchronize();
  size_t bad = (rl == cudaSuccess && rs == cudaSuccess) ? check_pattern(dst, dev, seed, 3) : NW;
  printf("%-58s launch=%d sync=%d bad=%zu\n", what, (int)rl, (int)rs, bad);
  CHECK(rl == cudaSuccess && rs == cudaSuccess && bad == 0);
  CHECK_CUDA(cudaSetDevice(dev));
  CHECK_CUDA(cudaFree(dst));
  return bad;
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
  int c01 = 0, c10 = 0;
  CHECK_CUDA(cudaDeviceCanAccessPeer(&c01, 0, 1));
  CHECK_CUDA(cudaDeviceCanAccessPeer(&c10, 1, 0));
  printf("can access peer: 0->1 %d, 1->0 %d\n", c01, c10);
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMallocHost(&host, N));
  if (!c01 || !c10) {
    printf("peer access not supported between devices 0 and 1: nothing more to test\n");
    void *p = alloc_filled(0, 1); /* keep the pooling proof meaningful */
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFreeHost(host));
    print_pooled();
    return report();
  }

  /* Blocks allocated before any peer access is enabled. */
  void *early0 = alloc_filled(0, 10);
  void *early1 = alloc_filled(1, 11);
  /* A block freed before enabling, so that a later one may reuse it. */
  void *gone1 = alloc_filled(1, 12);
  CHECK_CUDA(cudaFree(gone1));

  CHECK_CUDA(cudaSetDevice(0));
  cudaError_t e0 = cudaDeviceEnablePeerAccess(1, 0);
  CHECK_CUDA(cudaSetDevice(1));
  cudaError_t e1 = cudaDeviceEnablePeerAccess(0, 0);
  printf("enable peer access: 0->1 rc=%d, 1->0 rc=%d\n", (int)e0, (int)e1);
  CHECK(e0 == cudaSuccess && e1 == cudaSuccess);

  /* Blocks allocated after. */
  void *buf0 = alloc_filled(0, 20);
  void *buf1 = alloc_filled(1, 21);

  /* cudaMemcpyPeer both ways. */
  void *dst1 = alloc_filled(1, 0), *dst0 = alloc_filled(0, 0);
  CHECK_CUDA(cudaMemcpyPeer(dst1, 1, buf0, 0, N));
  size_t b1 = check_pattern(dst1, 1, 20, 0);
  CHECK_CUDA(cudaMemcpyPeer(dst0, 0, buf1, 1, N));
  size_t b0 = check_pattern(dst0, 0, 21, 0);
  printf("cudaMemcpyPeer 0->1 bad=%zu, 1->0 bad=%zu\n", b1, b0);
  CHECK(b1 == 0 && b0 == 0);

  /* Kernels reading the peer's memory directly. */
  peer_kernel(0, buf1, 21, "kernel on 0 reads device-1 block (after enabling)");
  peer_kernel(1, buf0, 20, "kernel on 1 reads device-0 block (after enabling)");
  peer_kernel(0, early1, 11, "kernel on 0 reads device-1 block (before enabling)");
  peer_kernel(1, early0, 10, "kernel on 1 reads device-0 block (before enabling)");

  /* Churn: blocks freed and reallocated after enabling, read by the peer. */
  int ok = 0;
  for (int i = 0; i < 10; i++) {
    int dev = i % 2;
    void *p = alloc_filled(dev, 300u + i);
    ok += peer_kernel(1 - dev, p, 300u + i, "kernel on peer reads a fresh block") == 0;
    CHECK_CUDA(cudaSetDevice(dev));
    CHECK_CUDA(cudaFree(p));
  }
  printf("fresh blocks read by the peer: %d of 10 ok\n", ok);

  void *all[] = {early0, buf0, dst0, early1, buf1, dst1};
  for (int i = 0; i < 6; i++) {
    CHECK_CUDA(cudaSetDevice(i < 3 ? 0 : 1));
    CHECK_CUDA(cudaFree(all[i]));
  }
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFreeHost(host));
  print_pooled();
  return report();
}
