/* Behaviour 4, configuration. With valid SOMA_* values, the pool serving
 * cudaMalloc has the settings asked for: SOMA_POOL=own makes a pool of the
 * shim's (pools_created), default uses the device's default pool;
 * with SOMA_SMALL_BLOCKS (4MiB unless 0) small blocks come from a second pool of
 * the shim's; SOMA_RELEASE_THRESHOLD and the SOMA_REUSE_* policies are set on each (the
 * harness gives the expected threshold in EXPECT_RELEASE_THRESHOLD, as a
 * number, "max" or "total"). With an invalid value the harness checks that
 * the process stops at the first intercepted call (exit status 2, a message
 * naming the variable, the value and the accepted forms, no allocation): this
 * program prints "# start" before its first CUDA call, and "# after" after. */
#include "common.h"

/* The release threshold and reuse policies of `pool`, read back through the
 * driver, against what the environment asked for. */
static void check_pool_settings(void *pool) {
  cuuint64_t threshold = 0;
  CHECK(cuMemPoolGetAttribute((CUmemoryPool)pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) == CUDA_SUCCESS);
  const char *want = getenv("EXPECT_RELEASE_THRESHOLD");
  if (want) {
    uint64_t w;
    if (strcmp(want, "max") == 0) w = UINT64_MAX;
    else if (strcmp(want, "total") == 0) {
      size_t total = 0;
      CHECK(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS);
      w = total;
    } else w = strtoull(want, NULL, 10);
    if (threshold != w) {
      fprintf(stderr, "%s:%d: release threshold %llu, want %llu (SOMA_RELEASE_THRESHOLD=%s)\n", __FILE__, __LINE__,
              (unsigned long long)threshold, (unsigned long long)w, getenv("SOMA_RELEASE_THRESHOLD"));
      check_failures++;
    }
  }
  int v = -1;
  CHECK(cuMemPoolGetAttribute((CUmemoryPool)pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &v) == 0);
  if (getenv("SOMA_REUSE_FOLLOW_EVENT_DEPS")) CHECK_EQ(v, env_flag("SOMA_REUSE_FOLLOW_EVENT_DEPS", 1));
  CHECK(cuMemPoolGetAttribute((CUmemoryPool)pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &v) == 0);
  if (getenv("SOMA_REUSE_OPPORTUNISTIC")) CHECK_EQ(v, env_flag("SOMA_REUSE_OPPORTUNISTIC", 1));
  CHECK(cuMemPoolGetAttribute((CUmemoryPool)pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &v) == 0);
  if (getenv("SOMA_REUSE_INTERNAL_DEPS")) CHECK_EQ(v, env_flag("SOMA_REUSE_INTERNAL_DEPS", 0));
  printf("# pool threshold %llu\n", (unsigned long long)threshold);
}

int main(void) {
  printf("# start\n");
  fflush(stdout);
  struct fakecuda_counters b = snap();
  void *p = NULL, *large = NULL;
  cudaError_t rc = cudaMalloc(&p, MiB);
  struct fakecuda_counters m = snap();
  printf("# after\n");
  SHOW_RC("malloc", rc);
  CHECK(rc == cudaSuccess);
  CHECK_CUDA(cudaMalloc(&large, 8 * MiB));
  int shim = under_shim();
  if (!expect_pool(MiB)) {
    CHECK_EQ(ptr_kind(p), FAKECUDA_PLAIN);
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFree(large));
    return report();
  }
  struct fakecuda_ptr_info info, large_info;
  CHECK(fakecuda_ptr_info(p, &info) && info.kind == FAKECUDA_POOL);
  CHECK(fakecuda_ptr_info(large, &large_info) && large_info.kind == FAKECUDA_POOL);
  struct fakecuda_pool_stats ps;
  CHECK(fakecuda_pool_stats(info.pool, &ps));
  CUmemoryPool dflt = NULL;
  CHECK(cuDeviceGetDefaultMemPool(&dflt, 0) == CUDA_SUCCESS);
  const char *pool = getenv("SOMA_POOL");
  /* SOMA_SMALL_BLOCKS (4MiB unless set): the 1 MiB block from a pool of its own. */
  const char *small = getenv("SOMA_SMALL_BLOCKS");
  int small_pool = !(small && strcmp(small, "0") == 0);
  if (pool && strcasecmp(pool, "default") == 0) {
    CHECK(info.pool == (void *)dflt);
    CHECK(large_info.pool == (void *)dflt);
    CHECK(ps.is_default);
    CHECK_EQ(DELTA(b, m, pools_created), 0);
  } else { /* own, the default */
    CHECK(info.pool != (void *)dflt);
    CHECK(large_info.pool != (void *)dflt);
    CHECK(!ps.is_default);
    CHECK_EQ(DELTA(b, m, pools_created), 1 + small_pool);
    CHECK_EQ(info.pool != large_info.pool, small_pool);
  }
  check_pool_settings(info.pool);
  check_pool_settings(large_info.pool);
  printf("# pool: %s\n", ps.is_default ? "default" : "own");

  /* the program's own cudaMallocAsync still uses the default pool */
  void *q = NULL;
  CHECK_CUDA(cudaMallocAsync(&q, MiB, 0));
  CHECK(fakecuda_ptr_info(q, &info) && info.pool == (void *)dflt);
  CHECK_CUDA(cudaFreeAsync(q, 0));

  CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(large));
  /* pools per device, not per call */
  b = snap();
  for (int i = 0; i < 10; i++) {
    CHECK_CUDA(cudaMalloc(&p, MiB));
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaMalloc(&p, 8 * MiB));
    CHECK_CUDA(cudaFree(p));
  }
  m = snap();
  CHECK_EQ(DELTA(b, m, pools_created), 0);
  (void)shim;
  return report();
}
