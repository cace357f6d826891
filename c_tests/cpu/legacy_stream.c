/* Contracts 1 and 2 while the program has only blocking streams: the shim
 * then frees and allocates on the legacy stream, so a freed block is reused
 * at once, in stream order, without blocking the host. Work on the legacy
 * stream, a blocking stream and the per-thread default stream may use such
 * a block at once (they are ordered after the legacy stream). A non-blocking
 * stream made afterwards is not: it must not run alongside the work that
 * used the memory before (the double counts that as unordered_uses). Once
 * the non-blocking stream is gone and its work done, frees go back to the
 * legacy stream. With SOMA_LEGACY_CACHE=on the shim keeps each such block
 * instead (after a mark on the legacy stream) and hands it to the next
 * cudaMalloc of its size: allocations go through malloc_seen, so the double
 * checks the new owner's work against the old owner's all the same. By
 * default it keeps a block where no mark is needed: no work went off the
 * legacy stream since its last operation there. */
#include "common.h"

static int kept; /* under the shim with SOMA_LEGACY_CACHE=on */

/* Frees p, which work on the legacy stream still uses, and checks how.
 * `kept_here`: the shim keeps it rather than free it on the legacy stream.
 * `alone`: no non-blocking stream was ever made, so the shim has no thread
 * that could learn meanwhile that the work is done (its event queries do, on
 * the double): the device is then still busy. */
static void free_busy(void *p, const char *label, int expect_at_once, int kept_here, int alone) {
  struct fakecuda_counters b = snap();
  uint64_t waits = fakecuda_thread_waits();
  SHOW_RC(label, cudaFree(p));
  waits = fakecuda_thread_waits() - waits;
  struct fakecuda_counters m = snap();
  if (expect_at_once) {
    if (kept_here) {
      CHECK_EQ(ptr_kind(p), FAKECUDA_POOL); /* kept for the next allocation */
      CHECK_EQ(DELTA(b, m, pool_frees), 0);
    } else {
      CHECK_EQ(ptr_kind(p), FAKECUDA_NONE); /* back in the pool at once, stream-ordered */
      CHECK(DELTA(b, m, pool_frees) >= 1);
    }
    CHECK_EQ(waits, 0); /* the host was not blocked */
    if (alone) CHECK(!fakecuda_device_idle(0));
  }
  CHECK_EQ(DELTA(b, m, unordered_frees), 0);
}

/* The first free after the non-blocking stream is gone, of a block used on
 * the legacy stream: by default on the legacy stream at once; with
 * SOMA_LEGACY_CACHE=on kept, after a mark for the gone stream's work (this
 * thread's record on the legacy stream). Either once a free finds that
 * stream's last work passed: a free that finds the shim's thread retiring
 * it from the stream registry queues its block instead (ordered after that
 * work all the same). Blocks are freed until one goes at once, for
 * SETTLE_MS at most. Prints what free_busy prints. */
static void first_free_back_on_legacy(void) {
  cudaError_t rc = cudaSuccess;
  int at_once = 0;
  for (int ms = 0; !at_once && ms < SETTLE_MS; ms++) {
    void *p = NULL;
    CHECK_CUDA(malloc_seen(&p, MiB, NULL));
    CHECK_EQ(fakecuda_launch(NULL, p), CUDA_SUCCESS);
    struct fakecuda_counters b = snap();
    uint64_t waits = fakecuda_thread_waits(), marks = fakecuda_thread_legacy_records();
    rc = cudaFree(p);
    waits = fakecuda_thread_waits() - waits;
    marks = fakecuda_thread_legacy_records() - marks;
    struct fakecuda_counters m = snap();
    CHECK_EQ(waits, 0); /* the host was not blocked */
    CHECK_EQ(DELTA(b, m, unordered_frees), 0);
    if (kept)
      at_once = ptr_kind(p) == FAKECUDA_POOL && DELTA(b, m, pool_frees) == 0 && marks == 1;
    else
      at_once = ptr_kind(p) == FAKECUDA_NONE && DELTA(b, m, pool_frees) >= 1;
    if (!at_once) usleep(1000);
  }
  printf("free after the stream is gone rc=%d\n", (int)rc);
  CHECK(at_once);
}

static void check_clean(struct fakecuda_counters b, const char *label) {
  struct fakecuda_counters m = snap();
  CHECK_ORDERLY(b, m, label);
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  int pooled = expect_pool(MiB);
  kept = pooled && env_is("SOMA_LEGACY_CACHE", "on");
  CHECK_CUDA(cudaFree(NULL));
  cudaStream_t blocking;
  CHECK_CUDA(cudaStreamCreate(&blocking));
  size_t free_at_start, total_at_start;
  CHECK_CUDA(cudaMemGetInfo(&free_at_start, &total_at_start));
  struct fakecuda_counters start = snap();

  /* Churn on the legacy stream, the block used everywhere a blocking stream can. */
  for (int i = 0; i < 20; i++) {
    void *p = NULL;
    CHECK_CUDA(malloc_seen(&p, MiB, NULL));
    /* The last use on a blocking stream other than the next owner's first:
     * only an operation on the legacy stream in between orders the two. */
    CHECK_EQ(fakecuda_launch(blocking, p), CUDA_SUCCESS);
    CHECK_EQ(fakecuda_launch(NULL, p), CUDA_SUCCESS);
    CHECK_EQ(fakecuda_launch(cudaStreamPerThread, p), CUDA_SUCCESS);
    free_busy(p, "free on the legacy stream", pooled, kept, 1);
  }
  struct fakecuda_counters churned = snap();
  if (pooled) {
    CHECK_EQ(DELTA(start, churned, pool_allocs), kept ? 1 : 20); /* kept: the one block, again and again */
    CHECK_EQ(DELTA(start, churned, ctx_syncs) + DELTA(start, churned, stream_syncs), 0);
  }
  /* reused in stream order: never more than the one block */
  size_t free_now, total;
  CHECK_CUDA(cudaMemGetInfo(&free_now, &total));
  printf("# used after the churn: %zu bytes over the start\n", free_at_start - free_now);
  CHECK(free_at_start - free_now <= MiB);
  check_clean(start, "churn");

  /* A free on the legacy stream after work on another blocking stream is a
   * mark for that work: the block it used, freed next, is kept with no mark,
   * and its next owner's work on the per-thread default stream still runs
   * after the old work (the double counts an unordered use otherwise). */
  void *x = NULL, *y = NULL, *z = NULL;
  CHECK_CUDA(malloc_seen(&x, MiB, NULL));
  CHECK_CUDA(malloc_seen(&y, 2 * MiB, NULL));
  CHECK_EQ(fakecuda_launch(blocking, x), CUDA_SUCCESS);
  CHECK_CUDA(cudaFree(y));
  uint64_t marks = fakecuda_thread_legacy_records();
  free_busy(x, "free after a free on the legacy stream", pooled, pooled, 0);
  CHECK_EQ(fakecuda_thread_legacy_records() - marks, 0);
  CHECK_CUDA(malloc_seen(&z, MiB, NULL));
  if (pooled) CHECK(z == x);
  CHECK_EQ(fakecuda_launch(cudaStreamPerThread, z), CUDA_SUCCESS);
  CHECK_CUDA(cudaFree(z));
  check_clean(start, "a free as a mark");

  /* Work issued from inside another call (under the shim: inside its
   * cudaMalloc hook, where the launch re-enters the shim) is work off the
   * legacy stream all the same: the block it used is not kept without a
   * mark (the default frees it on the legacy stream; SOMA_LEGACY_CACHE=on
   * marks first), so its next owner on the per-thread default stream runs
   * after that work. */
  void *u = NULL, *v = NULL, *w = NULL;
  CHECK_CUDA(malloc_seen(&u, MiB, NULL));
  CHECK_EQ(fakecuda_launch(NULL, u), CUDA_SUCCESS);
  struct fakecuda_stream_stats before_inside, after_inside;
  CHECK(fakecuda_stream_stats(blocking, &before_inside));
  fakecuda_launch_inside_next_alloc(blocking, u);
  CHECK_CUDA(malloc_seen(&v, 3 * MiB, NULL)); /* a size not freed before: the driver allocates */
  CHECK(fakecuda_stream_stats(blocking, &after_inside));
  CHECK_EQ(after_inside.work - before_inside.work, 1); /* the launch inside ran */
  free_busy(u, "free after work issued inside a call", pooled, kept, 0);
  CHECK_CUDA(malloc_seen(&w, MiB, NULL));
  CHECK_EQ(fakecuda_launch(cudaStreamPerThread, w), CUDA_SUCCESS);
  CHECK_CUDA(cudaFree(w));
  CHECK_CUDA(cudaFree(v));
  check_clean(start, "work issued inside a call");

  /* A block reused while the legacy stream still runs the work that used its
   * memory, then a non-blocking stream made and given that block. */
  void *q = NULL, *r = NULL;
  CHECK_CUDA(malloc_seen(&q, MiB, NULL));
  CHECK_EQ(fakecuda_launch(NULL, q), CUDA_SUCCESS);
  /* The last free was on the legacy stream, after the work off it: kept with no mark. */
  free_busy(q, "free before the non-blocking stream", pooled, pooled, 1);
  CHECK_CUDA(malloc_seen(&r, MiB, NULL));
  cudaStream_t nb;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  printf("new stream query rc=%d\n", (int)cudaStreamQuery(nb)); /* idle, as natively */
  CHECK_EQ(fakecuda_launch(nb, r), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(NULL, r), CUDA_SUCCESS);
  free_busy(r, "free with a non-blocking stream", 0, 0, 0);
  nudge();
  CHECK_RELEASED(r); /* maybe kept by the shim, but a second free is refused */
  check_clean(churned, "non-blocking stream made");

  /* The non-blocking stream gone and idle: back to the legacy stream. */
  CHECK_CUDA(cudaStreamSynchronize(nb));
  CHECK_CUDA(cudaStreamDestroy(nb));
  struct fakecuda_counters after = snap();
  if (pooled) first_free_back_on_legacy();
  for (int i = pooled; i < 3; i++) {
    void *p = NULL;
    CHECK_CUDA(malloc_seen(&p, MiB, NULL));
    CHECK_EQ(fakecuda_launch(NULL, p), CUDA_SUCCESS);
    /* After the first: kept with no mark (nothing went off the legacy stream since). */
    free_busy(p, "free after the stream is gone", pooled, pooled, 0);
  }
  check_clean(after, "stream gone");

  /* A lookup answered with a variant of a work entry point the shim does
   * not wrap (as from a driver newer than the shim): work may pass the shim
   * unseen from now on, so a block is kept only after a mark. */
  for (int looked = 0; looked < 2; looked++) {
    if (looked) {
      void *variant = NULL;
      CHECK_EQ(cuGetProcAddress("cuLaunchKernel_ptsz", &variant, 13000, 0, NULL), CUDA_SUCCESS);
    }
    void *p = NULL;
    CHECK_CUDA(malloc_seen(&p, MiB, NULL));
    CHECK_EQ(fakecuda_launch(NULL, p), CUDA_SUCCESS);
    /* The free's own mark: the shim's thread may meanwhile record on the
     * legacy stream for frees queued while the non-blocking stream lived. */
    uint64_t marks = fakecuda_thread_legacy_records();
    free_busy(p, looked ? "free after the lookup" : "free before the lookup", pooled, kept || (pooled && !looked), 0);
    CHECK_EQ(fakecuda_thread_legacy_records() - marks, kept && looked); /* the mark */
  }

  /* A double free right after a free on the legacy stream is refused, as natively. */
  void *d = NULL;
  CHECK_CUDA(malloc_seen(&d, MiB, NULL));
  CHECK_CUDA(cudaFree(d));
  SHOW_RC("double free", cudaFree(d));
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);

  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaStreamDestroy(blocking));
  return report();
}
