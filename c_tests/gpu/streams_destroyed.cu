/* Contract 2 for streams that are destroyed while their work still runs:
 * kernel R on a non-blocking stream S reads block A for ~1 ms; S is destroyed
 * right after the launch (cudaStreamDestroy returns at once, the work goes
 * on); cudaFree(A); B = cudaMalloc(same size) written with Q from another
 * non-blocking stream. R must see no corruption: the work of destroyed
 * streams is still ordered before the reuse. Variants: S destroyed before the
 * free, S destroyed after the free (before the next malloc), S created,
 * launched on and destroyed by another host thread, S made and destroyed
 * through the driver API (cuStreamCreate / cuStreamDestroy). */
#include "gpu_common.h"

enum { DESTROY_THEN_FREE, FREE_THEN_DESTROY, OTHER_THREAD, DRIVER, NVARIANTS };
static const char *vname[NVARIANTS] = {"destroy-then-free", "free-then-destroy", "other-thread-destroys",
                                       "driver-stream"};
static const unsigned P = 0x70707070u, Q = 0x71717171u;
static const unsigned long long READ_NS = 1000000ULL;

struct tjob {
  void *A;
  size_t n;
  unsigned long long *bad;
};
/* Another thread: make S, fill A and launch R on it, destroy S. */
static void *other(void *arg) {
  struct tjob *j = (struct tjob *)arg;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  k_set<<<grid_for(j->n, 256), 256, 0, s>>>((unsigned *)j->A, j->n, P);
  k_read_until<<<grid_for(j->n, 64), 256, 0, s>>>((const unsigned *)j->A, j->n, P, READ_NS, j->bad);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaStreamDestroy(s));
  return NULL;
}

int main(void) {
  int per = gpu_quick() ? 3 : 40;
  CHECK_CUDA(cudaFree(0));
  cudaStream_t s2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  unsigned long long *bad = NULL, *badB = NULL;
  CHECK_CUDA(TMALLOC(&bad, NVARIANTS * sizeof *bad));
  CHECK_CUDA(TMALLOC(&badB, sizeof *badB));
  CHECK_CUDA(cudaMemset(bad, 0, NVARIANTS * sizeof *bad));
  CHECK_CUDA(cudaMemset(badB, 0, sizeof *badB));
  CHECK_CUDA(cudaDeviceSynchronize());

  int same = 0, total = 0;
  const size_t sizes[] = {1 * MiB, 256 * KiB, 2 * MiB};
  for (int i = 0; i < per * NVARIANTS; i++) {
    int v = i % NVARIANTS;
    size_t bytes = sizes[(i / NVARIANTS) % 3], n = bytes / 4;
    void *A = NULL, *B = NULL;
    CHECK_CUDA(TMALLOC(&A, bytes));
    if (v == OTHER_THREAD) {
      struct tjob j = {A, n, bad + v};
      pthread_t t;
      pthread_create(&t, NULL, other, &j);
      pthread_join(t, NULL);
      CHECK_CUDA(cudaFree(A));
    } else if (v == DRIVER) {
      CUstream cs = 0;
      CHECK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
      cudaStream_t s = (cudaStream_t)cs;
      k_set<<<grid_for(n, 256), 256, 0, s>>>((unsigned *)A, n, P);
      k_read_until<<<grid_for(n, 64), 256, 0, s>>>((const unsigned *)A, n, P, READ_NS, bad + v);
      CHECK_CUDA(cudaGetLastError());
      CHECK(cuStreamDestroy(cs) == CUDA_SUCCESS);
      CHECK_CUDA(cudaFree(A));
    } else {
      cudaStream_t s;
      CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      k_set<<<grid_for(n, 256), 256, 0, s>>>((unsigned *)A, n, P);
      k_read_until<<<grid_for(n, 64), 256, 0, s>>>((const unsigned *)A, n, P, READ_NS, bad + v);
      CHECK_CUDA(cudaGetLastError());
      if (v == DESTROY_THEN_FREE) {
        CHECK_CUDA(cudaStreamDestroy(s));
        CHECK_CUDA(cudaFree(A));
      } else {
        CHECK_CUDA(cudaFree(A));
        CHECK_CUDA(cudaStreamDestroy(s));
      }
    }
    CHECK_CUDA(TMALLOC(&B, bytes));
    same += A == B;
    total++;
    k_set<<<grid_for(n, 1024), 256, 0, s2>>>((unsigned *)B, n, Q);
    k_count_neq<<<grid_for(n, 1024), 256, 0, s2>>>((const unsigned *)B, n, Q, badB);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFree(B));
  }
  unsigned long long h[NVARIANTS], hb = read_counter(badB), sum = 0;
  CHECK_CUDA(cudaMemcpy(h, bad, sizeof h, cudaMemcpyDeviceToHost));
  for (int v = 0; v < NVARIANTS; v++) {
    printf("variant=%s iterations=%d corruptions=%llu\n", vname[v], per, h[v]);
    sum += h[v];
  }
  printf("B holds what W wrote: mismatches=%llu\n", hb);
  printf("# corruptions %llu\n", sum);
  printf("# max same-address reuse seen: B == A in %d of %d iterations\n", same, total);
  CHECK(sum == 0 && hb == 0);
  CHECK_CUDA(cudaStreamDestroy(s2));
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaFree(badB));
  print_pooled();
  return report();
}
