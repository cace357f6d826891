/* Contract 3: with SOMA_FREE_SYNC=1 (set by the runner for both runs), cudaFree
 * returns only once the device is idle, as the real one does: a ~2 ms kernel
 * on some stream, then cudaFree(p), then cudaStreamQuery(that stream) must be
 * cudaSuccess (0) natively and under the shim. The streams: non-blocking,
 * blocking, legacy, per-thread default, and a non-blocking stream of another
 * host thread. Without SOMA_FREE_SYNC the shim's answer differs (600,
 * cudaErrorNotReady, is expected): the runner prints that as information. */
#include "gpu_common.h"

enum { NONBLOCKING, BLOCKING, LEGACY, PER_THREAD, OTHER_THREAD, NKINDS };
static const char *kind_name[NKINDS] = {"nonblocking", "blocking", "legacy", "per-thread-default",
                                        "other-host-thread-nonblocking"};
static const unsigned long long SPIN_NS = 2000000ULL;

static cudaStream_t other_stream;
static void *other_launch(void *arg) {
  (void)arg;
  CHECK_CUDA(cudaStreamCreateWithFlags(&other_stream, cudaStreamNonBlocking));
  k_spin_ns<<<1, 1, 0, other_stream>>>(SPIN_NS);
  CHECK_CUDA(cudaGetLastError());
  return NULL;
}

int main(void) {
  CHECK_CUDA(cudaFree(0));
  cudaStream_t s[NKINDS];
  CHECK_CUDA(cudaStreamCreateWithFlags(&s[NONBLOCKING], cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreate(&s[BLOCKING]));
  s[LEGACY] = 0;
  s[PER_THREAD] = cudaStreamPerThread;

  int rounds = gpu_quick() ? 2 : 5;
  for (int round = 0; round < rounds; round++) {
    for (int k = 0; k < NKINDS; k++) {
      void *p = NULL;
      size_t bytes = round % 2 ? 4096 : 8 * MiB;
      CHECK_CUDA(TMALLOC(&p, bytes));
      CHECK_CUDA(cudaMemset(p, 1, bytes));
      CHECK_CUDA(cudaDeviceSynchronize());
      cudaStream_t st;
      if (k == OTHER_THREAD) {
        pthread_t t;
        pthread_create(&t, NULL, other_launch, NULL);
        pthread_join(t, NULL);
        st = other_stream;
      } else {
        st = s[k];
        k_spin_ns<<<1, 1, 0, st>>>(SPIN_NS);
        CHECK_CUDA(cudaGetLastError());
      }
      double t0 = host_us();
      cudaError_t rf = cudaFree(p);
      double dt = host_us() - t0;
      cudaError_t q = cudaStreamQuery(st);
      cudaError_t last = cudaGetLastError();
      printf("round=%d stream=%s bytes=%zu cudaFree rc=%d then cudaStreamQuery=%d\n", round, kind_name[k], bytes,
             (int)rf, (int)q);
      printf("# cudaFree host time %.0f us; last error after query %d\n", dt, (int)last);
      CHECK(rf == cudaSuccess);
      CHECK_CUDA(cudaDeviceSynchronize());
      if (k == OTHER_THREAD) CHECK_CUDA(cudaStreamDestroy(other_stream));
    }
  }

  /* Information only: the program's own cudaMallocAsync pointer given to
   * cudaFree (the real one does not synchronize then). Timing-dependent, so
   * not compared. */
  void *a = NULL;
  CHECK_CUDA(cudaMallocAsync(&a, 4096, s[NONBLOCKING]));
  CHECK_CUDA(cudaStreamSynchronize(s[NONBLOCKING]));
  k_spin_ns<<<1, 1, 0, s[NONBLOCKING]>>>(SPIN_NS);
  cudaError_t rf = cudaFree(a);
  cudaError_t q = cudaStreamQuery(s[NONBLOCKING]);
  (void)cudaGetLastError();
  printf("# own cudaMallocAsync pointer: cudaFree rc=%d then cudaStreamQuery=%d\n", (int)rf, (int)q);
  CHECK(rf == cudaSuccess);
  CHECK_CUDA(cudaDeviceSynchronize());

  CHECK_CUDA(cudaStreamDestroy(s[NONBLOCKING]));
  CHECK_CUDA(cudaStreamDestroy(s[BLOCKING]));
  print_pooled();
  return report();
}
