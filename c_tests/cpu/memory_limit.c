/* SOMA_MEMORY_LIMIT: the shim on a large device with a limit behaves as a
 * device of the limit's size does natively. The harness runs this natively
 * on a 64 MiB device and under the shim on a 256 MiB one with
 * SOMA_MEMORY_LIMIT=64MiB (or 25%): cudaMemGetInfo gives the same total,
 * filling it with 8 MiB blocks stops at the same count with the real error
 * (cudaErrorMemoryAllocation, p == NULL, the last error set once), and after
 * everything is freed a block of all of it fits again (the shim waits for
 * its frees and trims, and leaves no error behind), also with frees queued
 * behind a non-blocking stream (MAKE_NONBLOCKING_STREAM=1). */
#include "common.h"

#define BLOCK (8 * MiB)

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  cudaStream_t side = NULL; /* with a non-blocking stream alive, the shim queues its frees */
  if (env_flag("MAKE_NONBLOCKING_STREAM", 0)) CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  size_t free0 = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free0, &total));
  printf("cudaMemGetInfo: total %zu, free %zu\n", total, free0);
  int expected = (int)(total / BLOCK);
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
    printf("round %d: %d blocks fit\n", round, n);
    CHECK_EQ(n, expected);
    SHOW_RC("malloc past the end", rc);
    CHECK(p == NULL);
    CHECK_LAST_ERROR_ONCE(cudaErrorMemoryAllocation);
    size_t free_now = 1, total_now = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_now, &total_now));
    printf("full: total %zu, free %zu\n", total_now, free_now);

    for (int i = 0; i < n; i++) CHECK_CUDA(cudaFree(blocks[i]));
    void *all = NULL;
    rc = cudaMalloc(&all, (size_t)n * BLOCK);
    SHOW_RC("malloc of all after freeing", rc);
    CHECK(all != NULL);
    CHECK_LAST_ERROR_ONCE(cudaSuccess);
    if (all) CHECK_CUDA(cudaFree(all));
  }
  if (side) CHECK_CUDA(cudaStreamDestroy(side));
  return check_failures ? 1 : 0;
}
