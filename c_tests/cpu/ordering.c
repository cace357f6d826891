/* Behaviour 3, ordering at the call level. A cudaFree of a shim pointer must
 * be ordered after all work issued before it on every stream of the device:
 * the double checks that at cuMemFreeAsync (unordered_frees). The shim does it
 * by recording an event on the legacy stream (which covers blocking streams)
 * and on every live non-blocking stream (cudaStreamCreateWithFlags /
 * WithPriority), and returning the block to the pool only after those events
 * (the double checks the outcome, whatever the mechanism: a stream waiting on
 * them, or the host seeing them pass). A destroyed stream is no longer
 * recorded on. By default cudaFree does not block the host; with
 * SOMA_FREE_SYNC=1 (and natively) the device is idle when it returns. A
 * block reused at once (SOMA_FREE_ORDER=barrier) must not be used by work on
 * any stream that may run alongside the work before the free (the double
 * counts that as unordered_uses). */
#include "common.h"

struct fakecuda_stream_stats st(cudaStream_t s) {
  struct fakecuda_stream_stats x;
  CHECK(fakecuda_stream_stats(s, &x));
  return x;
}

static void free_and_check(void *p, cudaStream_t *nb, int n_nb, const char *label) {
  int pool = ptr_kind(p) == FAKECUDA_POOL;
  int sync_expected = !under_shim() || !pool || env_flag("SOMA_FREE_SYNC", 0);
  uint64_t rec_before[8];
  for (int i = 0; i < n_nb; i++) rec_before[i] = st(nb[i]).records;
  struct fakecuda_counters b = snap();
  cudaError_t rc = cudaFree(p);
  struct fakecuda_counters m = snap();
  SHOW_RC(label, rc);
  CHECK(rc == cudaSuccess);
  if (pool) {
    CHECK(DELTA(b, m, event_records_legacy) >= 1);
    for (int i = 0; i < n_nb; i++) {
      uint64_t r = st(nb[i]).records;
      if (r <= rec_before[i]) {
        fprintf(stderr, "%s:%d: %s: no event recorded on live non-blocking stream #%d\n", __FILE__, __LINE__,
                label, i);
        check_failures++;
      }
    }
  }
  int idle = fakecuda_device_idle(0);
  printf("# %s: device %s after cudaFree\n", label, idle ? "idle" : "busy");
  if (sync_expected) CHECK(idle);
  else CHECK(!idle); /* the host was not blocked */
  nudge(); /* the block reaches the driver, ordered after that work */
  m = snap();
  CHECK_EQ(ptr_kind(p), FAKECUDA_NONE);
  if (pool) CHECK(DELTA(b, m, pool_frees) >= 1);
  CHECK_ORDERLY(b, m, label);
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  cudaStream_t nb[4], blk, gone;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb[0], cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithPriority(&nb[1], cudaStreamNonBlocking, -1));
  CHECK_CUDA(cudaStreamCreate(&blk));
  CHECK_CUDA(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking));

  void *p = NULL;
  CHECK_CUDA(cudaMalloc(&p, MiB));
  /* a stream that had work, finished it, and was destroyed */
  CHECK_EQ(fakecuda_launch(gone, p), CUDA_SUCCESS);
  CHECK_CUDA(cudaStreamSynchronize(gone));
  CHECK_CUDA(cudaStreamDestroy(gone));
  /* work using p everywhere, none of it finished */
  CHECK_EQ(fakecuda_launch(nb[0], p), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(nb[1], p), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(blk, p), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(cudaStreamPerThread, p), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(NULL, p), CUDA_SUCCESS);
  CHECK_CUDA(cudaMemset(p, 0, MiB));
  uint64_t gone_records = 0;
  {
    struct fakecuda_stream_stats x;
    if (fakecuda_stream_stats(gone, &x)) gone_records = x.records;
  }
  free_and_check(p, nb, 2, "free p (2 nb streams)");
  {
    struct fakecuda_stream_stats x;
    CHECK(fakecuda_stream_stats(gone, &x) && !x.alive);
    CHECK_EQ(x.records, gone_records); /* the destroyed stream was left alone */
  }

  /* a stream created later is tracked too; a blocking one is not needed */
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb[2], cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb[3], cudaStreamDefault));
  void *q = NULL;
  CHECK_CUDA(cudaMalloc(&q, 3 * MiB));
  CHECK_EQ(fakecuda_launch(nb[2], q), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(nb[3], q), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(nb[0], q), CUDA_SUCCESS);
  free_and_check(q, nb, 3, "free q (3 nb streams)");

  /* work only on a non-blocking stream, the others idle */
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMalloc(&q, 4096));
  CHECK_EQ(fakecuda_launch(nb[1], q), CUDA_SUCCESS);
  free_and_check(q, nb, 3, "free q2 (work on one nb stream)");

  /* one of them destroyed after its work finished: not recorded on any more */
  CHECK_CUDA(cudaStreamSynchronize(nb[2]));
  CHECK_CUDA(cudaStreamDestroy(nb[2]));
  nb[2] = nb[1];
  CHECK_CUDA(cudaMalloc(&q, 8192));
  CHECK_EQ(fakecuda_launch(nb[0], q), CUDA_SUCCESS);
  struct fakecuda_counters b = snap();
  free_and_check(q, nb, 2, "free q3 (after a destroy)");
  struct fakecuda_counters m = snap();
  CHECK_EQ(DELTA(b, m, invalid_handles), 0);

  /* many frees with work in between */
  b = snap();
  for (int i = 0; i < 50; i++) {
    void *r = NULL;
    CHECK_CUDA(cudaMalloc(&r, (size_t)(i + 1) * 1000));
    CHECK_EQ(fakecuda_launch(nb[i % 2], r), CUDA_SUCCESS);
    CHECK_EQ(fakecuda_launch(NULL, r), CUDA_SUCCESS);
    CHECK_CUDA(cudaFree(r));
  }
  nudge();
  m = snap();
  CHECK_EQ(DELTA(b, m, unordered_frees), 0);
  CHECK_EQ(DELTA(b, m, unordered_uses), 0);
  CHECK_BALANCED(b, m, pool);
  CHECK_BALANCED(b, m, plain);
  show_problem("loop");
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int i = 0; i < 2; i++) CHECK_CUDA(cudaStreamDestroy(nb[i]));
  CHECK_CUDA(cudaStreamDestroy(nb[3]));
  CHECK_CUDA(cudaStreamDestroy(blk));
  return report();
}
