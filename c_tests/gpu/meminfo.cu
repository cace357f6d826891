/* A program that sizes its work from cudaMemGetInfo: after it has allocated
 * and freed a large block, it takes half of the free memory (in whole GiB)
 * for its main buffer. Natively the freed block is free again; under the shim
 * the pool keeps it cached, so with SOMA_MEMINFO=pool the shim must count it
 * as free for the program to size itself the same way. */
#include "gpu_common.h"

int main(void) {
  CHECK_CUDA(cudaFree(NULL));
  void *scratch = NULL, *keep = NULL;
  CHECK_CUDA(TMALLOC(&keep, 64 << 20));
  CHECK_CUDA(TMALLOC(&scratch, 8ULL << 30));
  k_set<<<1024, 256>>>((unsigned *)scratch, (8ULL << 30) / 4, 1);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaFree(scratch));
  CHECK_CUDA(cudaDeviceSynchronize());
  size_t free_b = 0, total_b = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  size_t gib = free_b / 2 / GiB;
  printf("work buffer: %zu GiB of %zu GiB total\n", gib, (size_t)(total_b / GiB));
  printf("# free %.2f GiB\n", free_b / (double)GiB);
  void *work = NULL;
  CHECK_CUDA(TMALLOC(&work, gib * GiB));
  k_set<<<1024, 256>>>((unsigned *)work, gib * GiB / 4, 2);
  unsigned long long *bad;
  CHECK_CUDA(cudaMalloc(&bad, sizeof *bad));
  CHECK_CUDA(cudaMemset(bad, 0, sizeof *bad));
  k_count_neq<<<1024, 256>>>((unsigned *)work, gib * GiB / 4, 2, bad);
  printf("work buffer verified: bad=%llu\n", read_counter(bad));
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaFree(work));
  CHECK_CUDA(cudaFree(keep));
  print_pooled();
  return report();
}
