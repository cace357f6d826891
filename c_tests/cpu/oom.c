/* Behaviour 7, out of memory. Run with FAKECUDA_MEM_LIMIT=64 MiB: filling the
 * device with 8 MiB blocks stops at the same count natively and under the
 * shim, with the real error (cudaErrorMemoryAllocation, p == NULL, the last
 * error set once). Freeing everything and then asking for a block that needs
 * the freed memory succeeds, and leaves no error behind: the shim waits for
 * its pending frees (and trims) and retries. A truly impossible size fails
 * with the real error, set once. MAKE_NONBLOCKING_STREAM=1: a non-blocking
 * stream is alive, so the shim queues its frees.
 *
 * The device's size is what cudaMemGetInfo says: the harness also runs this
 * under the shim on a 256 MiB device with SOMA_MEMORY_LIMIT=64MiB, which must
 * look to the program like the 64 MiB device does natively. */
#include "common.h"

#define BLOCK (8 * MiB)

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  cudaStream_t side = NULL;
  if (env_flag("MAKE_NONBLOCKING_STREAM", 0)) CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  size_t free0 = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free0, &total));
  printf("cudaMemGetInfo: total %zu, free %zu\n", total, free0);
  int expected = (int)(total / BLOCK);
  printf("# device memory %zu, %d blocks\n", total, expected);
  CHECK(expected >= 2 && expected <= 64);

  for (int round = 0; round < 3; round++) {
    void *blocks[80] = {0};
    int n = 0;
    cudaError_t rc = cudaSuccess;
    void *p = NULL;
    while (n < 80) {
      p = (void *)0x1;
      rc = cudaMalloc(&p, BLOCK);
      if (rc != cudaSuccess) break;
      CHECK_CUDA(cudaMemset(p, n, BLOCK));
      blocks[n++] = p;
    }
    printf("# round %d: %d blocks fit\n", round, n);
    CHECK_EQ(n, expected);
    SHOW_RC("malloc past the end", rc);
    CHECK(rc == cudaErrorMemoryAllocation);
    CHECK(p == NULL);
    CHECK_LAST_ERROR_ONCE(cudaErrorMemoryAllocation);

    for (int i = 0; i < n; i++) CHECK_CUDA(cudaFree(blocks[i]));
    CHECK_LAST_ERROR_ONCE(cudaSuccess);

    /* needs the memory just freed: half, then all of it */
    size_t big = round == 1 ? (size_t)n * BLOCK : (size_t)n * BLOCK / 2;
    void *q = NULL;
    rc = cudaMalloc(&q, big);
    SHOW_RC("malloc after freeing", rc);
    CHECK(rc == cudaSuccess && q != NULL);
    CHECK_LAST_ERROR_ONCE(cudaSuccess);
    if (q) {
      CHECK_CUDA(cudaMemset(q, 0, big));
      CHECK_CUDA(cudaFree(q));
    }
    /* everything again at once */
    rc = cudaMalloc(&q, (size_t)n * BLOCK);
    SHOW_RC("malloc of all", rc);
    CHECK(rc == cudaSuccess && q != NULL);
    CHECK_LAST_ERROR_ONCE(cudaSuccess);
    if (q) CHECK_CUDA(cudaFree(q));
  }

  /* impossible sizes */
  void *p = (void *)0x1;
  SHOW_RC("malloc(1<<50)", cudaMalloc(&p, (size_t)1 << 50));
  CHECK(p == NULL);
  CHECK_LAST_ERROR_ONCE(cudaErrorMemoryAllocation);
  p = (void *)0x1;
  SHOW_RC("malloc(total+1)", cudaMalloc(&p, total + 1));
  CHECK(p == NULL);
  CHECK_LAST_ERROR_ONCE(cudaErrorMemoryAllocation);
  p = (void *)0x1;
  SHOW_RC("malloc(SIZE_MAX)", cudaMalloc(&p, (size_t)-1));
  CHECK(p == NULL);
  CHECK_LAST_ERROR_ONCE(cudaErrorMemoryAllocation);

  if (side) CHECK_CUDA(cudaStreamDestroy(side));
  /* and the allocator still works */
  CHECK_CUDA(cudaMalloc(&p, MiB));
  CHECK_CUDA(cudaFree(p));
  CHECK_LAST_ERROR_ONCE(cudaSuccess);
  struct fakecuda_counters c = snap();
  CHECK_EQ(c.drv_invalid_frees, 0);
  CHECK_EQ(c.unordered_frees, 0);
  printf("# %llu failed allocations in the driver, %llu trims\n", (unsigned long long)c.alloc_failures,
         (unsigned long long)c.pool_trims);
  show_problem("end");
  return report();
}
