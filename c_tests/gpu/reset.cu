/* Contract 7: cudaDeviceReset destroys the pools of that device; the shim
 * forgets them and their pointers and makes new ones on next use.
 * Before the reset: a live block p (written and verified), a block q already
 * given to cudaFree, a live non-blocking stream. After the reset: cudaFree(p)
 * and cudaFree(q) give what the real runtime gives (rc and last error
 * printed); then allocations work again, are pooled again under the shim (the
 * pooling count restarts at the reset, so the runner's "# pooled N" check is
 * about the allocations after it), on fresh streams. Twice. */
#include "gpu_common.h"

static void show(const char *what, cudaError_t rc) {
  cudaError_t l1 = cudaGetLastError(), l2 = cudaGetLastError();
  printf("%-44s rc=%d last=%d last2=%d\n", what, (int)rc, (int)l1, (int)l2);
}

int main(void) {
  for (int round = 0; round < 2; round++) {
    printf("round %d\n", round);
    unsigned *host = NULL, *p = NULL, *q = NULL;
    CHECK_CUDA(cudaMallocHost(&host, 1 * MiB));
    CHECK_CUDA(TMALLOC(&p, 1 * MiB));
    CHECK_CUDA(TMALLOC(&q, 1 * MiB));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t bad = fill_and_verify(p, 1 * MiB, 5, s, host);
    printf("before reset: verified bad=%zu\n", bad);
    CHECK(bad == 0);
    k_fill<<<64, 256, 0, s>>>(q, MiB / 4, 6);
    CHECK_CUDA(cudaFree(q));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFreeHost(host));

    show("cudaDeviceReset", cudaDeviceReset());
    /* s, host, p and q belonged to the destroyed context. */
    show("cudaFree(live ptr from before the reset)", cudaFree(p));
    show("cudaFree(freed ptr from before the reset)", cudaFree(q));
    show("cudaFree(NULL) after the reset", cudaFree(NULL));
    pool_count_reset();

    CHECK_CUDA(cudaMallocHost(&host, 4 * MiB));
    cudaStream_t s2;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    size_t total_bad = 0;
    int n = 0;
    for (int i = 0; i < 50; i++) {
      size_t bytes = (i % 3 == 0) ? 1 * MiB : (i % 3 == 1 ? 4096 : 3 * MiB);
      void *d = NULL;
      CHECK_CUDA(TMALLOC(&d, bytes));
      if (!d) continue;
      size_t b = fill_and_verify(d, bytes, 1000u + i, i % 2 ? s2 : 0, host);
      total_bad += b;
      n += b == 0;
      CHECK(b == 0);
      CHECK_CUDA(cudaFree(d));
    }
    printf("after reset: %d of 50 blocks verified, bad words=%zu\n", n, total_bad);
    /* A block of the same size as p: maybe at p's address, and it must be an
     * ordinary, freeable block. */
    void *again = NULL;
    CHECK_CUDA(TMALLOC(&again, 1 * MiB));
    printf("# new 1 MiB block at the old block's address: %s\n", again == (void *)p ? "yes" : "no");
    show("cudaFree(new block)", cudaFree(again));
    show("cudaFree(new block) twice", cudaFree(again));
    CHECK_CUDA(cudaStreamDestroy(s2));
    CHECK_CUDA(cudaFreeHost(host));
  }
  print_pooled();
  return report();
}
