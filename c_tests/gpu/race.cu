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
 * DETECT corruption: the teeth of this test. Run natively only.
 *
 * Scaling (issue 12), combinable with each other and with --wrong-stream:
 * --streams N: N idle non-blocking streams made at the start and kept alive
 * to the end (every free the shim orders has them to cover too).
 * --threads T: after the loop above, T host threads at once, each with two
 * non-blocking streams of its own, each repeatedly: A = cudaMalloc; fill A
 * with P and launch R (reads A for ~1 ms) on its first stream; cudaFree(A)
 * while R runs; B = cudaMalloc; write Q into B and check it on its second
 * stream. B may be any thread's freed A. R's corruptions must be 0 (with
 * --wrong-stream, this phase must detect corruption on its own). */
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

/* ---- --threads T ---------------------------------------------------------- */
static const unsigned long long THREAD_READ_NS = 1000000ULL; /* R runs ~1 ms */
static int wrong, thread_iters;
static unsigned long long *t_bad, *t_badB; /* per thread: R's corruptions, B's mismatches */
struct tres {
  int tid;
  int iters, same;
  size_t failures;
};

static void *race_thread(void *arg) {
  struct tres *r = (struct tres *)arg;
  int t = r->tid;
  cudaStream_t s1, s2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (int i = 0; i < thread_iters; i++) {
    size_t bytes = sizes[(size_t)(i + t) % NSIZES], n = bytes / 4;
    void *A = NULL, *B = NULL;
    if (!wrong) {
      if (TMALLOC(&A, bytes) != cudaSuccess || !A) {
        r->failures++;
        continue;
      }
      k_set<<<grid_for(n, 256), 256, 0, s1>>>((unsigned *)A, n, P);
      k_read_until<<<grid_for(n, 64), 256, 0, s1>>>((const unsigned *)A, n, P, THREAD_READ_NS, t_bad + t);
      if (cudaGetLastError() != cudaSuccess) r->failures++;
      if (cudaFree(A) != cudaSuccess) r->failures++; /* R still runs */
      if (TMALLOC(&B, bytes) != cudaSuccess || !B) {
        r->failures++;
        CHECK_CUDA(cudaStreamSynchronize(s1));
        continue;
      }
    } else {
      /* The broken shim, emulated: the default pool on the legacy stream. */
      CHECK_CUDA(cudaMallocAsync(&A, bytes, 0));
      k_set<<<grid_for(n, 256), 256, 0, 0>>>((unsigned *)A, n, P);
      CHECK_CUDA(cudaStreamSynchronize(0));
      k_read_until<<<grid_for(n, 64), 256, 0, s1>>>((const unsigned *)A, n, P, THREAD_READ_NS, t_bad + t);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaFreeAsync(A, 0));
      CHECK_CUDA(cudaMallocAsync(&B, bytes, 0));
      cudaEvent_t e;
      CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      CHECK_CUDA(cudaEventRecord(e, 0));
      CHECK_CUDA(cudaStreamWaitEvent(s2, e, 0));
      CHECK_CUDA(cudaEventDestroy(e));
    }
    r->same += A == B;
    k_set<<<grid_for(n, 1024), 256, 0, s2>>>((unsigned *)B, n, Q);
    k_count_neq<<<grid_for(n, 1024), 256, 0, s2>>>((const unsigned *)B, n, Q, t_badB + t);
    if (cudaGetLastError() != cudaSuccess) r->failures++;
    CHECK_CUDA(cudaStreamSynchronize(s1));
    CHECK_CUDA(cudaStreamSynchronize(s2));
    if (!wrong) {
      if (cudaFree(B) != cudaSuccess) r->failures++;
    } else {
      CHECK_CUDA(cudaFreeAsync(B, 0));
    }
    r->iters++;
  }
  CHECK_CUDA(cudaStreamSynchronize(s1));
  CHECK_CUDA(cudaStreamSynchronize(s2));
  CHECK_CUDA(cudaStreamDestroy(s1));
  CHECK_CUDA(cudaStreamDestroy(s2));
  return NULL;
}

/* Returns R's corruptions over all threads. */
static unsigned long long threads_phase(int nthreads) {
  thread_iters = gpu_quick() ? 3 : 25;
  if (wrong) {
    /* Keep freed memory in the default pool (no trim at synchronizations):
     * reuse, not a release, is what the emulation is about. */
    cudaMemPool_t pool;
    unsigned long long big = ~0ULL;
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
    CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &big));
  }
  size_t cnt = (size_t)nthreads * sizeof(unsigned long long);
  CHECK_CUDA(TMALLOC(&t_bad, cnt));
  CHECK_CUDA(TMALLOC(&t_badB, cnt));
  CHECK_CUDA(cudaMemset(t_bad, 0, cnt));
  CHECK_CUDA(cudaMemset(t_badB, 0, cnt));
  CHECK_CUDA(cudaDeviceSynchronize());
  pthread_t *th = (pthread_t *)calloc((size_t)nthreads, sizeof *th);
  struct tres *r = (struct tres *)calloc((size_t)nthreads, sizeof *r);
  for (int t = 0; t < nthreads; t++) {
    r[t].tid = t;
    CHECK(pthread_create(&th[t], NULL, race_thread, &r[t]) == 0);
  }
  int iters = 0, same = 0;
  size_t failures = 0;
  for (int t = 0; t < nthreads; t++) {
    CHECK(pthread_join(th[t], NULL) == 0);
    iters += r[t].iters;
    same += r[t].same;
    failures += r[t].failures;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  unsigned long long *h = (unsigned long long *)calloc((size_t)nthreads, sizeof *h);
  unsigned long long *hb = (unsigned long long *)calloc((size_t)nthreads, sizeof *hb);
  CHECK_CUDA(cudaMemcpy(h, t_bad, cnt, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hb, t_badB, cnt, cudaMemcpyDeviceToHost));
  unsigned long long total = 0, totalB = 0;
  for (int t = 0; t < nthreads; t++) {
    total += h[t];
    totalB += hb[t];
  }
  if (!wrong)
    printf("threads=%d iterations=%d corruptions=%llu failed_calls=%zu\n", nthreads, iters, total, failures);
  else
    printf("# threads=%d iterations=%d corruptions=%llu failed_calls=%zu\n", nthreads, iters, total, failures);
  printf("threads: B holds what W wrote: mismatches=%llu\n", totalB);
  printf("# threads: B == A in %d of %d iterations\n", same, iters);
  CHECK(iters == nthreads * thread_iters && failures == 0 && totalB == 0);
  if (wrong) {
    printf("wrong-stream emulation detected corruption with %d threads: %s\n", nthreads, total > 0 ? "yes" : "NO");
    CHECK(total > 0);
  } else {
    CHECK(total == 0);
  }
  CHECK_CUDA(cudaFree(t_bad));
  CHECK_CUDA(cudaFree(t_badB));
  free(th);
  free(r);
  free(h);
  free(hb);
  return total;
}

int main(int argc, char **argv) {
  int nstreams = 0, nthreads = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--wrong-stream") == 0) {
      wrong = 1;
    } else if (strcmp(argv[i], "--streams") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 0) {
      nstreams = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 0) {
      nthreads = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: %s [--wrong-stream] [--streams N] [--threads T]\n", argv[0]);
      return 2;
    }
  }
  int per_kind = gpu_quick() ? 3 : 60;
  CHECK_CUDA(cudaFree(0));
  cudaStream_t *idle = NULL;
  if (nstreams > 0) {
    idle = (cudaStream_t *)calloc((size_t)nstreams, sizeof *idle);
    for (int i = 0; i < nstreams; i++) CHECK_CUDA(cudaStreamCreateWithFlags(&idle[i], cudaStreamNonBlocking));
    printf("idle non-blocking streams kept alive: %d\n", nstreams);
  }

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
  printf("# max same-address reuse seen: B == A in %d of %d iterations\n", same, iters);
  if (wrong) {
    printf("wrong-stream emulation detected corruption: %s\n", total > 0 ? "yes" : "NO");
    CHECK(total > 0); /* the test must have teeth */
  } else {
    CHECK(total == 0);
  }
  if (nthreads > 0) total += threads_phase(nthreads);
  printf("# corruptions %llu\n", total);

  for (int k = 0; k < NKINDS; k++) {
    if (k == NB_DRIVER)
      CHECK(cuStreamDestroy(cs) == CUDA_SUCCESS);
    else if (k != PER_THREAD && k != LEGACY)
      CHECK_CUDA(cudaStreamDestroy(s[k]));
  }
  CHECK_CUDA(cudaStreamDestroy(s2));
  for (int i = 0; i < nstreams; i++) CHECK_CUDA(cudaStreamDestroy(idle[i]));
  free(idle);
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaFree(badB));
  print_pooled();
  return report();
}
