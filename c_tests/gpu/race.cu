/* Contract 2, the key test: a block given to cudaFree is never handed out again
 * before the work issued before that cudaFree, on every stream, has finished.
 *
 * One iteration: A = cudaMalloc(n); fill A with P on S1; launch R on S1 (reads
 * A again and again for ~1.5 ms, counting elements != P); cudaFree(A) at once;
 * B = cudaMalloc(n); launch W on S2 (non-blocking) writing Q into B. If B
 * overlaps A while R still runs, R sees Q: a corruption. Natively cudaFree
 * synchronizes the device, so there is none; the shim must order the reuse.
 * S1 takes every kind of stream the program can have (created non-blocking
 * through the runtime, with a priority, through the driver, by another
 * thread; blocking; per-thread default; legacy).
 *
 * --wrong-stream: the program emulates a broken shim (A and B from the default
 * pool with cudaMallocAsync/cudaFreeAsync on the legacy stream only) and must
 * DETECT corruption: the teeth of this test. Run natively only. */
#include "gpu_common.h"

enum { NB, NB_PRIO, NB_DRIVER, NB_THREAD, BLOCKING, PER_THREAD, LEGACY, NKINDS };
static const char *kind_name[NKINDS] = {"nonblocking",         "nonblocking-priority", "nonblocking-driver",
                                        "nonblocking-other-thread", "blocking",         "per-thread-default",
                                        "legacy"};
static const size_t sizes[] = {1 * MiB, 256 * KiB, 4 * MiB, 2 * KiB, 64 * KiB + 12};
#define NSIZES (sizeof sizes / sizeof sizes[0])
static const unsigned P = 0x50505050u, Q = 0x51515151u;
static const unsigned long long READ_NS = 1500000ULL; /* R runs ~1.5 ms */

static cudaStream_t thread_stream;
static void *make_stream_thread(void *arg) {
  (void)arg;
  CHECK_CUDA(cudaStreamCreateWithFlags(&thread_stream, cudaStreamNonBlocking));
  return NULL;
}

int main(int argc, char **argv) {
  int wrong = argc > 1 && strcmp(argv[1], "--wrong-stream") == 0;
  int per_kind = gpu_quick() ? 3 : 60;
  CHECK_CUDA(cudaFree(0));

  cudaStream_t s[NKINDS], s2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s[NB], cudaStreamNonBlocking));
  int lo = 0, hi = 0;
  CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CHECK_CUDA(cudaStreamCreateWithPriority(&s[NB_PRIO], cudaStreamNonBlocking, hi));
  CUstream cs = 0;
  CHECK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  s[NB_DRIVER] = (cudaStream_t)cs;
  pthread_t t;
  pthread_create(&t, NULL, make_stream_thread, NULL);
  pthread_join(t, NULL);
  s[NB_THREAD] = thread_stream;
  CHECK_CUDA(cudaStreamCreate(&s[BLOCKING]));
  s[PER_THREAD] = cudaStreamPerThread;
  s[LEGACY] = (cudaStream_t)0;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

  unsigned long long *bad = NULL, *badB = NULL; /* R's corruptions, W's check of B */
  CHECK_CUDA(TMALLOC(&bad, NKINDS * sizeof *bad));
  CHECK_CUDA(TMALLOC(&badB, sizeof *badB));
  CHECK_CUDA(cudaMemset(bad, 0, NKINDS * sizeof *bad));
  CHECK_CUDA(cudaMemset(badB, 0, sizeof *badB));
  CHECK_CUDA(cudaDeviceSynchronize());

  int nkinds = wrong ? BLOCKING : NKINDS; /* wrong mode: the non-blocking kinds */
  int iters = 0, same = 0, same_kind[NKINDS] = {0};
  for (int i = 0; i < per_kind * nkinds; i++) {
    int k = i % nkinds;
    size_t bytes = sizes[(i / nkinds) % NSIZES], n = bytes / 4;
    cudaStream_t s1 = s[k];
    void *A = NULL, *B = NULL;
    if (!wrong) {
      CHECK_CUDA(TMALLOC(&A, bytes));
      k_set<<<grid_for(n, 256), 256, 0, s1>>>((unsigned *)A, n, P);
      k_read_until<<<grid_for(n, 64), 256, 0, s1>>>((const unsigned *)A, n, P, READ_NS, bad + k);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaFree(A));
      CHECK_CUDA(TMALLOC(&B, bytes));
    } else {
      CHECK_CUDA(cudaMallocAsync(&A, bytes, 0));
      k_set<<<grid_for(n, 256), 256, 0, 0>>>((unsigned *)A, n, P);
      CHECK_CUDA(cudaStreamSynchronize(0));
      k_read_until<<<grid_for(n, 64), 256, 0, s1>>>((const unsigned *)A, n, P, READ_NS, bad + k);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaFreeAsync(A, 0));
      CHECK_CUDA(cudaMallocAsync(&B, bytes, 0));
      /* What a shim would do to make B usable from every stream: order the
       * other streams after the allocating (legacy) stream. */
      cudaEvent_t e;
      CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      CHECK_CUDA(cudaEventRecord(e, 0));
      CHECK_CUDA(cudaStreamWaitEvent(s2, e, 0));
      CHECK_CUDA(cudaEventDestroy(e));
    }
    if (A == B) {
      same++;
      same_kind[k]++;
    }
    k_set<<<grid_for(n, 1024), 256, 0, s2>>>((unsigned *)B, n, Q);
    k_count_neq<<<grid_for(n, 1024), 256, 0, s2>>>((const unsigned *)B, n, Q, badB);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaStreamSynchronize(s1));
    CHECK_CUDA(cudaStreamSynchronize(s2));
    if (!wrong)
      CHECK_CUDA(cudaFree(B));
    else
      CHECK_CUDA(cudaFreeAsync(B, 0));
    iters++;
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  unsigned long long h[NKINDS], hb = read_counter(badB), total = 0;
  CHECK_CUDA(cudaMemcpy(h, bad, sizeof h, cudaMemcpyDeviceToHost));
  for (int k = 0; k < nkinds; k++) {
    total += h[k];
    if (!wrong)
      printf("kind=%s iterations=%d corruptions=%llu\n", kind_name[k], per_kind, h[k]);
    else
      printf("# kind=%s iterations=%d corruptions=%llu same-address=%d\n", kind_name[k], per_kind, h[k],
             same_kind[k]);
  }
  printf("B holds what W wrote: mismatches=%llu\n", hb);
  CHECK(hb == 0);
  printf("# corruptions %llu\n", total);
  printf("# max same-address reuse seen: B == A in %d of %d iterations\n", same, iters);
  if (wrong) {
    printf("wrong-stream emulation detected corruption: %s\n", total > 0 ? "yes" : "NO");
    CHECK(total > 0); /* the test must have teeth */
  } else {
    CHECK(total == 0);
  }

  for (int k = 0; k < NKINDS; k++) {
    if (k == NB_DRIVER)
      CHECK(cuStreamDestroy(cs) == CUDA_SUCCESS);
    else if (k != PER_THREAD && k != LEGACY)
      CHECK_CUDA(cudaStreamDestroy(s[k]));
  }
  CHECK_CUDA(cudaStreamDestroy(s2));
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaFree(badB));
  print_pooled();
  return report();
}
