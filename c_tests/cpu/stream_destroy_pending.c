/* Contract 2 with a stream destroyed while its work still runs: the real
 * cudaStreamDestroy returns at once and the work goes on, and the real
 * cudaFree waits for it (it synchronizes the device). A later cudaFree of a
 * shim pointer must still be ordered after that work, although the stream
 * handle is gone (and must not be used: invalid_handles stays 0). */
#include "common.h"

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  for (int round = 0; round < 3; round++) {
    cudaStream_t s;
    if (round == 1) CHECK_CUDA(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, 0));
    else CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, MiB));
    CHECK_EQ(fakecuda_launch(s, p), CUDA_SUCCESS);
    CHECK_CUDA(cudaStreamDestroy(s));
    if (round == 2) { /* other frees in between */
      void *q = NULL;
      CHECK_CUDA(cudaMalloc(&q, 4096));
      CHECK_CUDA(cudaFree(q));
    }
    struct fakecuda_counters b = snap();
    SHOW_RC("free after destroy", cudaFree(p));
    nudge();
    struct fakecuda_counters m = snap();
    CHECK_RELEASED_KIND(p); /* the shim may keep it: the stream's work is done once its tail passed */
    CHECK_EQ(DELTA(b, m, unordered_frees), 0);
    CHECK_EQ(DELTA(b, m, invalid_handles), 0);
    CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
    show_problem("free after destroy");
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  return report();
}
