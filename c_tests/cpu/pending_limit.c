/* SOMA_PENDING_FREE_LIMIT, run with FAKECUDA_LAZY_GPU=1 (the GPU finishes
 * nothing until the host waits): the shim may hold back freed blocks until
 * the work before them has passed, but no more than the limit, so the memory
 * the pool hands out (live blocks plus blocks freed but held back) stays
 * within the limit plus what is live, and every block still reaches the
 * driver ordered after the work that used it. */
#include "common.h"

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  uint64_t limit = env_bytes("SOMA_PENDING_FREE_LIMIT", 256 * MiB);
  cudaStream_t nb;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  struct fakecuda_counters b = snap();
  uint64_t worst = 0;
  void *pool = NULL;
  for (int i = 0; i < 64; i++) {
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, MiB));
    struct fakecuda_ptr_info info;
    if (fakecuda_ptr_info(p, &info) && info.kind == FAKECUDA_POOL) {
      pool = info.pool;
      struct fakecuda_pool_stats ps;
      CHECK(fakecuda_pool_stats(pool, &ps));
      if (ps.used > worst) worst = ps.used;
    }
    CHECK_EQ(fakecuda_launch(nb, p), CUDA_SUCCESS);
    CHECK_EQ(fakecuda_launch(NULL, p), CUDA_SUCCESS);
    CHECK_CUDA(cudaFree(p));
  }
  printf("# pool use peaked at %llu bytes\n", (unsigned long long)worst);
  if (expect_pool(MiB)) {
    /* held back at most `limit`, then the live block, and one block over
     * the limit before the next call waits */
    uint64_t bound = limit + 2 * MiB;
    if (worst > bound) {
      fprintf(stderr, "%s:%d: pool use reached %llu bytes, limit %llu (+ 2 MiB)\n", __FILE__, __LINE__,
              (unsigned long long)worst, (unsigned long long)limit);
      check_failures++;
    }
  }
  struct fakecuda_counters m = snap();
  CHECK_EQ(DELTA(b, m, unordered_frees), 0);
  CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
  CHECK(DELTA(b, m, pool_allocs) - DELTA(b, m, pool_frees) <= (long long)(limit / MiB) + 2);
  CHECK(DELTA(b, m, pool_allocs) + DELTA(b, m, plain_allocs) == 64);
  show_problem("end");
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamDestroy(nb));
  return report();
}
