/* A cap on the process's device memory (run with SOMA_MEMORY_LIMIT=4GiB; the
 * native run has no cap, so only what must hold either way is compared):
 * cudaMemGetInfo's free memory is what the program can take, to within a
 * block; filling the device with 256 MiB blocks stops with the real error
 * (cudaErrorMemoryAllocation, p == NULL, the last error set once); after
 * everything is freed, a block of all that fitted fits again with no error
 * left behind, and so does the fill; also with a non-blocking stream alive
 * (--nonblocking). Under the shim the counts and totals
 * printed as '# ' lines show the cap. */
#include "gpu_common.h"

#define BLOCK (256 * MiB)

/* The limit SOMA_MEMORY_LIMIT sets on this device ("4GiB" or "5%"), 0 if none. */
static size_t expected_limit(void) {
  const char *v = getenv("SOMA_MEMORY_LIMIT");
  if (!v || !*v) return 0;
  char *end = NULL;
  double number = strtod(v, &end);
  if (strcmp(end, "%") == 0) {
    size_t device = 0;
    CHECK(cuDeviceTotalMem(&device, 0) == CUDA_SUCCESS);
    return (size_t)((unsigned __int128)device * (unsigned)(number * 100 + 0.5) / 10000);
  }
  CHECK(strcmp(end, "GiB") == 0);
  return (size_t)number * GiB;
}

int main(int argc, char **argv) {
  CHECK_CUDA(cudaFree(NULL));
  /* --nonblocking: a non-blocking stream is alive, so the shim queues its frees */
  cudaStream_t side = NULL;
  if (argc > 1 && strcmp(argv[1], "--nonblocking") == 0)
    CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  k_set<<<1, 1>>>(NULL, 0, 0); /* loads the module before memory is counted */
  CHECK_CUDA(cudaDeviceSynchronize());
  size_t free0 = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free0, &total));
  printf("# cudaMemGetInfo: total %.2f GiB, free %.2f GiB\n", total / (double)GiB, free0 / (double)GiB);
  printf("free <= total: %s\n", free0 <= total ? "yes" : "no");
  for (int round = 0; round < 2; round++) {
    static void *blocks[1024];
    int n = 0;
    cudaError_t rc = cudaSuccess;
    void *p = NULL;
    while (n < 1024) {
      p = (void *)1;
      rc = TMALLOC(&p, BLOCK);
      if (rc != cudaSuccess) break;
      k_set<<<256, 256>>>((unsigned *)p, BLOCK / 4, (unsigned)n);
      blocks[n++] = p;
    }
    long expected = (long)(free0 / BLOCK);
    if (g_pooled > 0) { /* under the shim: the device is as large as the limit */
      CHECK(total == expected_limit());
      CHECK((size_t)n * BLOCK <= expected_limit());
    }
    printf("# round %d: %d blocks of 256 MiB fit, free memory said %ld\n", round, n, expected);
    printf("round %d: the fill stops within a block of the free memory: %s\n", round,
           n >= expected - 1 && n <= expected ? "yes" : "no");
    printf("round %d: past the end: %d, p %s\n", round, (int)rc, nn(p));
    show_last_error_twice();
    size_t free_full = 0, total_full = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_full, &total_full));
    printf("round %d: full, free < one block: %s, total unchanged: %s\n", round, free_full < BLOCK ? "yes" : "no",
           total_full == total ? "yes" : "no");
    for (int i = 0; i < n; i++) CHECK_CUDA(cudaFree(blocks[i]));
    void *all = NULL;
    rc = TMALLOC(&all, (size_t)n * BLOCK);
    printf("round %d: one block of all that fitted after freeing: %d\n", round, (int)rc);
    show_last_error_twice();
    if (all) {
      k_set<<<1024, 256>>>((unsigned *)all, (size_t)n * BLOCK / 4, 7);
      CHECK_CUDA(cudaDeviceSynchronize());
      CHECK_CUDA(cudaFree(all));
    }
  }
  if (side) CHECK_CUDA(cudaStreamDestroy(side));
  print_pooled();
  return report();
}
