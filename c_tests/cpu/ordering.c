/* Behaviour 3, ordering at the call level. A block given to cudaFree must
 * not be handed out again, nor reach the driver's pool, before all work
 * issued before that cudaFree on every stream of the device has finished.
 * Under the shim, with non-blocking streams (SOMA_FREE_ORDER=join, the
 * default), cudaFree queues the block and the shim's thread soon records an
 * event on the legacy stream (which covers blocking streams) and on every
 * live non-blocking stream (cudaStreamCreateWithFlags / WithPriority) that
 * cuStreamQuery does not find idle, and keeps the block until the GPU has
 * passed them; with
 * SOMA_FREE_ORDER=barrier the cudaFree records them itself. The double checks
 * the outcome, whatever the mechanism: a block handed out again from the
 * shim's cache must not be used alongside the work of its old owner
 * (unordered_uses, told by malloc_seen), and a block given back to the pool
 * must be freed after that work (unordered_frees). A destroyed stream is no
 * longer recorded on. By default cudaFree does not block the host (the
 * calling thread makes no host wait); with SOMA_FREE_SYNC=1 (and natively)
 * the device is idle when it returns. A block reused at once
 * (SOMA_FREE_ORDER=barrier) must not be used by work on any stream that may
 * run alongside the work before the free (unordered_uses). */
#include "common.h"

struct fakecuda_stream_stats st(cudaStream_t s) {
  struct fakecuda_stream_stats x;
  CHECK(fakecuda_stream_stats(s, &x));
  return x;
}

/* Each stream's work count, and how often it was recorded on or asked, when
 * the last free_and_check ended. */
static struct { cudaStream_t stream; uint64_t work, asked; } g_checked[16];

static int checked_slot(cudaStream_t nb) {
  int i = 0;
  while (i < 16 && g_checked[i].stream && g_checked[i].stream != nb) i++;
  CHECK(i < 16);
  return i < 16 ? i : 15;
}

/* Whether the shim must ask nb about the free: always, unless it tracks work
 * (SOMA_TRACK_WORK, on by default); then only if work was issued on nb since
 * the last check ended and the shim has not asked it since (a stream found
 * idle with no work since has finished everything before the free). The
 * counts cannot tell an ask before that work from one after it, nor a busy
 * answer from an idle one: the double's unordered_* counters judge those. */
static int must_ask(cudaStream_t nb) {
  int i = checked_slot(nb);
  int seen = g_checked[i].stream == nb;
  struct fakecuda_stream_stats now = st(nb);
  int had_work = now.work > (seen ? g_checked[i].work : 0);
  int asked_since = now.records + now.queries > (seen ? g_checked[i].asked : 0);
  return (had_work && !asked_since) || !env_flag("SOMA_TRACK_WORK", 1);
}

static void remember_work(cudaStream_t nb) {
  int i = checked_slot(nb);
  g_checked[i].stream = nb;
  g_checked[i].work = st(nb).work;
  g_checked[i].asked = st(nb).records + st(nb).queries;
}

/* Since the counts `legacy` and `seen`: an event recorded on the legacy
 * stream, and each nb[i] that must be asked recorded on or asked whether it is idle. */
static int ordered_after_all(uint64_t legacy, const uint64_t *seen, const int *ask, cudaStream_t *nb, int n_nb) {
  if (st(NULL).records <= legacy) return 0;
  for (int i = 0; i < n_nb; i++)
    if (ask[i] && st(nb[i]).records + st(nb[i]).queries <= seen[i]) return 0;
  return 1;
}

static int g_reissued; /* allocations served from the shim's cache */

static void free_and_check(void *p, cudaStream_t *nb, int n_nb, cudaStream_t blk, const char *label) {
  struct fakecuda_ptr_info info;
  CHECK(fakecuda_ptr_info(p, &info));
  int pool = info.kind == FAKECUDA_POOL;
  size_t size = info.size;
  int sync_expected = !under_shim() || !pool || env_flag("SOMA_FREE_SYNC", 0);
  uint64_t seen_before[8];
  int ask[8];
  for (int i = 0; i < n_nb; i++) {
    seen_before[i] = st(nb[i]).records + st(nb[i]).queries;
    ask[i] = must_ask(nb[i]);
  }
  uint64_t legacy_before = st(NULL).records;
  struct fakecuda_counters b = snap();
  uint64_t waits = fakecuda_thread_waits();
  cudaError_t rc = cudaFree(p);
  waits = fakecuda_thread_waits() - waits;
  int idle = fakecuda_device_idle(0);
  SHOW_RC(label, rc);
  CHECK(rc == cudaSuccess);
  printf("# %s: device %s after cudaFree, %llu host waits in it\n", label, idle ? "idle" : "busy",
         (unsigned long long)waits);
  if (sync_expected) {
    CHECK(idle);
    CHECK(waits >= 1);
  } else {
    CHECK_EQ(waits, 0); /* the host was not blocked (the shim's thread may query events meanwhile) */
  }
  if (pool) {
    /* the free is ordered after the legacy stream and every live non-blocking stream */
    if (!EVENTUALLY(ordered_after_all(legacy_before, seen_before, ask, nb, n_nb))) {
      CHECK(st(NULL).records > legacy_before);
      for (int i = 0; i < n_nb; i++)
        if (ask[i] && st(nb[i]).records + st(nb[i]).queries <= seen_before[i]) {
          fprintf(stderr, "%s:%d: %s: live non-blocking stream #%d neither recorded on nor queried within %d ms\n",
                  __FILE__, __LINE__, label, i, SETTLE_MS);
          check_failures++;
        }
    }
  }
  CHECK_RELEASED(p);
  /* The next allocation of that size may be that block (from the shim's
   * cache): every stream may use it at once, after the work before the free. */
  void *r = NULL;
  int reissued = 0;
  CHECK_CUDA(malloc_seen(&r, size, &reissued));
  g_reissued += reissued;
  printf("# %s: the next allocation of %zu bytes is %s\n", label, size,
         r == p ? "the same block" : reissued ? "another kept block" : "new memory");
  for (int i = 0; i < n_nb; i++) CHECK_EQ(fakecuda_launch(nb[i], r), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(blk, r), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(NULL, r), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(cudaStreamPerThread, r), CUDA_SUCCESS);
  CHECK_CUDA(cudaFree(r));
  for (int i = 0; i < n_nb; i++) remember_work(nb[i]);
  struct fakecuda_counters m = snap();
  CHECK_ORDERLY(b, m, label);
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  struct fakecuda_counters start = snap();
  cudaStream_t nb[4], blk, gone;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb[0], cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithPriority(&nb[1], cudaStreamNonBlocking, -1));
  CHECK_CUDA(cudaStreamCreate(&blk));
  CHECK_CUDA(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking));

  void *p = NULL;
  CHECK_CUDA(malloc_seen(&p, MiB, NULL));
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
  free_and_check(p, nb, 2, blk, "free p (2 nb streams)");
  {
    struct fakecuda_stream_stats x;
    CHECK(fakecuda_stream_stats(gone, &x) && !x.alive);
    CHECK_EQ(x.records, gone_records); /* the destroyed stream was left alone */
  }

  /* a stream created later is tracked too; a blocking one is not needed */
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb[2], cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb[3], cudaStreamDefault));
  void *q = NULL;
  CHECK_CUDA(malloc_seen(&q, 3 * MiB, NULL));
  CHECK_EQ(fakecuda_launch(nb[2], q), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(nb[3], q), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(nb[0], q), CUDA_SUCCESS);
  free_and_check(q, nb, 3, blk, "free q (3 nb streams)");

  /* work only on a non-blocking stream, the others idle */
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(malloc_seen(&q, 4096, NULL));
  CHECK_EQ(fakecuda_launch(nb[1], q), CUDA_SUCCESS);
  free_and_check(q, nb, 3, blk, "free q2 (work on one nb stream)");

  /* one of them destroyed after its work finished: not recorded on any more */
  CHECK_CUDA(cudaStreamSynchronize(nb[2]));
  CHECK_CUDA(cudaStreamDestroy(nb[2]));
  nb[2] = nb[1];
  CHECK_CUDA(malloc_seen(&q, 8192, NULL));
  CHECK_EQ(fakecuda_launch(nb[0], q), CUDA_SUCCESS);
  struct fakecuda_counters b = snap();
  free_and_check(q, nb, 2, blk, "free q3 (after a destroy)");
  struct fakecuda_counters m = snap();
  CHECK_EQ(DELTA(b, m, invalid_handles), 0);

  /* many frees with work in between, then many of one size: those blocks
   * come back from the shim's cache, used from another stream each time */
  b = snap();
  for (int i = 0; i < 100; i++) {
    void *r = NULL;
    int reissued = 0;
    CHECK_CUDA(malloc_seen(&r, i < 50 ? (size_t)(i + 1) * 1000 : 65536, &reissued));
    g_reissued += reissued;
    CHECK_EQ(fakecuda_launch(nb[(i + 1) % 2], r), CUDA_SUCCESS);
    CHECK_EQ(fakecuda_launch(NULL, r), CUDA_SUCCESS);
    CHECK_EQ(fakecuda_launch(nb[i % 2], r), CUDA_SUCCESS);
    CHECK_CUDA(cudaFree(r));
  }
  printf("# %d allocations served from the shim's cache\n", g_reissued);
  if (!under_shim()) CHECK_EQ(g_reissued, 0);
  m = snap();
  CHECK_EQ(DELTA(b, m, unordered_uses), 0);
  /* every block of the test reaches the driver's pool in the end, ordered
   * after its work */
  CHECK_BALANCED(start, pool);
  CHECK_BALANCED(start, plain);
  m = snap();
  CHECK_EQ(DELTA(start, m, unordered_frees), 0);
  CHECK_EQ(DELTA(start, m, unordered_uses), 0);
  show_problem("loop");

  /* The check's teeth: a block handed to a new owner while work on nb[0] may
   * still use it, then used on nb[1], is one unordered use. */
  void *t = NULL;
  CHECK_CUDA(cudaMalloc(&t, 65536 + 256));
  b = snap();
  CHECK_EQ(fakecuda_launch(nb[0], t), CUDA_SUCCESS);
  CHECK(fakecuda_handed_out(t));
  CHECK_EQ(fakecuda_launch(nb[1], t), CUDA_SUCCESS);
  m = snap();
  CHECK_EQ(DELTA(b, m, unordered_uses), 1);
  printf("# teeth: %s\n", fakecuda_last_problem());
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaFree(t));

  CHECK_CUDA(cudaDeviceSynchronize());
  for (int i = 0; i < 2; i++) CHECK_CUDA(cudaStreamDestroy(nb[i]));
  CHECK_CUDA(cudaStreamDestroy(nb[3]));
  CHECK_CUDA(cudaStreamDestroy(blk));
  return report();
}
