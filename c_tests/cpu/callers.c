/* SOMA_PASSTHROUGH_CALLERS and SOMA_STATS on the test double.
 *
 * The runner runs this program with SOMA_PASSTHROUGH_CALLERS naming it
 * (EXPECT_POOLED=0: its cudaMalloc calls must reach the real allocator) and
 * naming another library (EXPECT_POOLED=1: they are pooled), with
 * SOMA_STATS=<file>. The program checks the kinds of its blocks; the runner
 * checks the table the shim wrote at exit. */
#include "common.h"

int main(void) {
  int shim = under_shim();
  int expect_pooled = shim && env_flag("EXPECT_POOLED", 1);
  CHECK_CUDA(cudaFree(NULL));
  struct fakecuda_counters b = snap();
  for (int i = 0; i < 10; i++) {
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, MiB));
    CHECK_EQ(ptr_kind(p), expect_pooled ? FAKECUDA_POOL : FAKECUDA_PLAIN);
    CHECK_CUDA(cudaFree(p));
  }
  nudge();
  struct fakecuda_counters m = snap();
  printf("ten pairs done\n");
  printf("# pooled %lld\n", DELTA(b, m, pool_allocs));
  return report();
}
