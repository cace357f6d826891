/* Behaviour 9, cudaDeviceReset: it destroys the device's memory, streams and
 * pools. The shim forgets its pointers (cudaFree of an old one reaches the
 * real free: cudaErrorInvalidValue) and its pool, and the next cudaMalloc
 * gets a new pool. No stale handle (stream, event, pool) is used afterwards. */
#include "common.h"

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  void *old_pool = NULL;
  for (int round = 0; round < 3; round++) {
    cudaStream_t nb;
    CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    void *p = NULL, *q = NULL, *r = NULL;
    SHOW_RC("malloc p", cudaMalloc(&p, MiB));
    SHOW_RC("malloc q", cudaMalloc(&q, 2 * MiB));
    CHECK_EQ(fakecuda_launch(nb, p), CUDA_SUCCESS);
    SHOW_RC("free q", cudaFree(q));
    struct fakecuda_ptr_info info;
    CHECK(fakecuda_ptr_info(p, &info));
    if (expect_pool(MiB)) {
      CHECK_EQ(info.kind, FAKECUDA_POOL);
      if (round > 0) CHECK(info.pool != old_pool); /* a new pool after the reset */
      struct fakecuda_pool_stats ps;
      CHECK(fakecuda_pool_stats(info.pool, &ps) && ps.alive);
    }
    old_pool = info.pool;

    /* Programs synchronize before a reset; a block the shim gives back to its
     * pool right before the reset is then ordered after that work (without
     * it, the double would count that free as unordered, though the reset
     * destroys the pool before anything could reuse the block). */
    CHECK_CUDA(cudaDeviceSynchronize());
    struct fakecuda_counters b = snap();
    SHOW_RC("reset", cudaDeviceReset());
    CHECK_EQ(ptr_kind(p), FAKECUDA_NONE); /* the double destroyed it */
    SHOW_RC("free old p", cudaFree(p));
    CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
    SHOW_RC("free old q", cudaFree(q));
    CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);

    SHOW_RC("malloc r", cudaMalloc(&r, MiB));
    CHECK(r != NULL);
    CHECK_LAST_ERROR_ONCE(cudaSuccess);
    CHECK_EQ(ptr_kind(r), expect_pool(MiB) ? FAKECUDA_POOL : FAKECUDA_PLAIN);
    if (expect_pool(MiB)) {
      CHECK(fakecuda_ptr_info(r, &info) && info.pool != old_pool);
      struct fakecuda_pool_stats ps;
      CHECK(fakecuda_pool_stats(info.pool, &ps) && ps.alive);
    }
    CHECK_CUDA(cudaMemset(r, 7, MiB));
    CHECK_EQ(fakecuda_launch(NULL, r), CUDA_SUCCESS);
    cudaStream_t nb2;
    CHECK_CUDA(cudaStreamCreateWithFlags(&nb2, cudaStreamNonBlocking));
    CHECK_EQ(fakecuda_launch(nb2, r), CUDA_SUCCESS);
    SHOW_RC("free r", cudaFree(r));
    nudge();
    CHECK_RELEASED(r); /* a second free of it is refused */
    for (int i = 0; i < 20; i++) {
      CHECK_CUDA(cudaMalloc(&r, 4096 * (size_t)(i + 1)));
      CHECK_CUDA(cudaFree(r));
    }
    CHECK_CUDA(cudaStreamDestroy(nb2));
    CHECK_CUDA(cudaDeviceSynchronize());
    struct fakecuda_counters m = snap();
    CHECK_EQ(DELTA(b, m, invalid_handles), 0);
    CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
    CHECK_EQ(DELTA(b, m, unordered_frees), 0);
    CHECK_EQ(DELTA(b, m, rt_invalid_frees), 3); /* old p, old q, r again */
    show_problem("after reset");
  }
  return report();
}
