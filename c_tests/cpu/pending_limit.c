/* SOMA_PENDING_FREE_LIMIT, run with FAKECUDA_LAZY_GPU=1 (the GPU finishes
 * nothing until the host waits) and a non-blocking stream alive (frees in
 * join order). The shim keeps freed blocks until the work before them has
 * passed; those whose work has passed wait in its cache and serve the next
 * allocations of their size without any wait. Past the limit, it orders the
 * queued frees behind a barrier on the GPU instead (every stream waits for
 * the work before them), so they are handed out again at once, and gives the
 * oldest kept blocks back to the pool: it never waits on the host. So
 * whenever the pool hands out new memory, the blocks the program freed whose
 * work the GPU may still be running and that the shim still holds (the
 * double knows which: fakecuda_block_idle) total at most the limit; no
 * allocation waits on the host; every allocation is either new memory or a
 * block the shim kept, used only after its old work (unordered_uses); and
 * every block still reaches the driver, ordered after the work that used it,
 * once the program synchronizes.
 *
 * The pool itself holds at most the limit (the program holds one 1 MiB block,
 * less than the limits tested, so the limit is the bound), one block over it
 * before the next allocation orders it, and the live block: limit + 2 MiB.
 */
#include "common.h"

#define N 64

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  size_t free_mem = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_mem, &total));
  uint64_t limit = env_bytes("SOMA_PENDING_FREE_LIMIT", 256 * MiB); /* the default */
  cudaStream_t nb;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  struct fakecuda_counters b = snap();
  uint64_t worst = 0, worst_unpassed = 0;
  void *freed[N]; /* what the program freed, kept or not by the shim */
  int nfreed = 0, reissued_total = 0, new_allocs = 0;
  for (int i = 0; i < N; i++) {
    /* The program's blocks, freed and still allocated at the driver, whose
     * work has not passed (none of them is the program's now). */
    uint64_t unpassed_before = 0;
    for (int j = 0; j < nfreed; j++)
      if (ptr_kind(freed[j]) == FAKECUDA_POOL && !fakecuda_block_idle(freed[j])) unpassed_before += MiB;
    void *p = NULL;
    int reissued = 0;
    uint64_t waits = fakecuda_thread_waits();
    CHECK_CUDA(malloc_seen(&p, MiB, &reissued));
    waits = fakecuda_thread_waits() - waits;
    reissued_total += reissued;
    struct fakecuda_ptr_info info;
    if (fakecuda_ptr_info(p, &info) && info.kind == FAKECUDA_POOL) {
      struct fakecuda_pool_stats ps;
      CHECK(fakecuda_pool_stats(info.pool, &ps));
      if (ps.used > worst) worst = ps.used;
    }
    /* the same after the call (p, if reissued, is the program's again) */
    uint64_t unpassed = 0;
    for (int j = 0; j < nfreed; j++)
      if (freed[j] != p && ptr_kind(freed[j]) == FAKECUDA_POOL && !fakecuda_block_idle(freed[j])) unpassed += MiB;
    if (under_shim() && waits != 0) {
      fprintf(stderr, "%s:%d: allocation %d waited on the host with %llu bytes of frees not passed, limit %llu\n",
              __FILE__, __LINE__, i, (unsigned long long)unpassed_before, (unsigned long long)limit);
      check_failures++;
    }
    if (!reissued && expect_pool(MiB)) {
      new_allocs++;
      if (unpassed > worst_unpassed) worst_unpassed = unpassed;
      if (unpassed > limit) {
        fprintf(stderr, "%s:%d: allocation %d: new memory while %llu bytes of frees had not passed, limit %llu\n",
                __FILE__, __LINE__, i, (unsigned long long)unpassed, (unsigned long long)limit);
        check_failures++;
      }
    }
    CHECK_EQ(fakecuda_launch(nb, p), CUDA_SUCCESS);
    CHECK_EQ(fakecuda_launch(NULL, p), CUDA_SUCCESS);
    CHECK_CUDA(cudaFree(p));
    int known = 0;
    for (int j = 0; j < nfreed; j++) known |= freed[j] == p;
    if (!known) freed[nfreed++] = p;
  }
  printf("# pool use peaked at %llu bytes; %d new allocations, %d from the shim's cache; at most %llu bytes "
         "of frees not passed at a new allocation\n",
         (unsigned long long)worst, new_allocs, reissued_total, (unsigned long long)worst_unpassed);
  if (!under_shim()) CHECK_EQ(reissued_total, 0);
  if (expect_pool(MiB) && worst > limit + 2 * MiB) {
    fprintf(stderr, "%s:%d: pool use reached %llu bytes, limit %llu (+ 2 MiB)\n", __FILE__, __LINE__,
            (unsigned long long)worst, (unsigned long long)limit);
    check_failures++;
  }
  struct fakecuda_counters m = snap();
  CHECK_EQ(DELTA(b, m, unordered_frees), 0);
  CHECK_EQ(DELTA(b, m, unordered_uses), 0);
  CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
  /* every allocation: new memory from the driver, or a block the shim kept */
  CHECK_EQ(DELTA(b, m, pool_allocs) + DELTA(b, m, plain_allocs) + reissued_total, N);
  show_problem("loop");
  /* Once the work is done, every block goes back to the driver, in order.
   * The shim's thread may join the last frees after a synchronization, and
   * the lazy GPU runs that join only at a later host wait: the program
   * synchronizes while it polls. */
  EVENTUALLY((cudaDeviceSynchronize(), m = snap(), DELTA(b, m, pool_allocs) == DELTA(b, m, pool_frees)));
  CHECK_BALANCED(b, pool);
  CHECK_BALANCED(b, plain);
  m = snap();
  CHECK_EQ(DELTA(b, m, unordered_frees), 0);
  show_problem("end");
  CHECK_CUDA(cudaStreamDestroy(nb));
  return report();
}
