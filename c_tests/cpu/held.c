/* Memory held (promise 46): the device memory in use (fakecuda_device_used),
 * read after every allocation, peaks at no more than 1.25 times the program's
 * own peak, natively and under the shim, whose default SOMA_LARGE_BLOCKS (64
 * MiB) makes every block here large. Three patterns, one after another:
 *   varied   160 blocks of 16 sizes (64 to 184 MiB) in a fixed shuffled order,
 *            one live at a time (allocate, work on it, free);
 *   growing  a buffer grown like a vector, 64 to 544 MiB by 32 MiB (allocate
 *            the larger, copy the old into it, free the old), twice;
 *   burst    8 blocks of 128 MiB live at once, then freed, three times.
 * MAKE_NONBLOCKING_STREAM=1: a non-blocking stream is alive, so the shim
 * queues its frees and joins them. */
#include "common.h"

static uint64_t start_used, peak_used;

static void note_use(void) {
  uint64_t used = fakecuda_device_used(0) - start_used;
  if (used > peak_used) peak_used = used;
}

static void *alloc_used(size_t size) {
  void *p = NULL;
  CHECK_CUDA(cudaMalloc(&p, size));
  note_use();
  CHECK(fakecuda_launch(NULL, p) == CUDA_SUCCESS);
  return p;
}

/* Prints whether the pattern held at most 1.25 times its own peak (`own`). */
static void report_pattern(const char *name, uint64_t own) {
  printf("# %s: peak in use %llu MiB, the program's own %llu MiB\n", name, (unsigned long long)(peak_used / MiB),
         (unsigned long long)(own / MiB));
  printf("%s: within 1.25x of the program's peak: %s\n", name, peak_used <= own + own / 4 ? "yes" : "no");
  peak_used = 0;
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  cudaStream_t side = NULL;
  if (env_flag("MAKE_NONBLOCKING_STREAM", 0)) CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  start_used = fakecuda_device_used(0);

  uint64_t own = 0;
  unsigned x = 12345;
  for (int i = 0; i < 160; i++) {
    x = x * 1103515245u + 12345u;
    size_t size = (64 + 8 * ((x >> 16) % 16)) * MiB;
    CHECK_CUDA(cudaFree(alloc_used(size)));
    if (size > own) own = size;
  }
  report_pattern("varied", own);

  own = 0;
  for (int pass = 0; pass < 2; pass++) {
    size_t size = 64 * MiB;
    void *buffer = alloc_used(size);
    for (; size < 544 * MiB; size += 32 * MiB) {
      void *larger = alloc_used(size + 32 * MiB);
      CHECK_CUDA(cudaMemcpy(larger, buffer, size, cudaMemcpyDeviceToDevice));
      CHECK_CUDA(cudaFree(buffer));
      buffer = larger;
      if (2 * size + 32 * MiB > own) own = 2 * size + 32 * MiB;
    }
    CHECK_CUDA(cudaFree(buffer));
  }
  report_pattern("growing", own);

  for (int round = 0; round < 3; round++) {
    void *blocks[8];
    for (int i = 0; i < 8; i++) blocks[i] = alloc_used(128 * MiB);
    for (int i = 0; i < 8; i++) CHECK_CUDA(cudaFree(blocks[i]));
  }
  report_pattern("burst", 8 * 128 * MiB);
  CHECK_CUDA(cudaDeviceSynchronize());
  if (side) CHECK_CUDA(cudaStreamDestroy(side));
  return report();
}
