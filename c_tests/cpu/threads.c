/* Behaviour 5, threads: 8 threads x 2000 cudaMalloc/cudaFree of varying sizes
 * (each thread keeps up to 8 blocks live; odd threads use them on a
 * non-blocking stream of their own). Every live pointer is distinct and holds
 * what its owner wrote, every call succeeds, nothing reaches the driver that
 * it does not know, and the counts balance: every allocation is new memory
 * from the driver or, under the shim, a block it kept after a free (its
 * cache), used only after the work of its previous owner (unordered_uses),
 * and in the end every block is freed at the driver. */
#include "common.h"

#include <pthread.h>

#define THREADS 8
#define ITERS 2000
#define LIVE 8

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_live[THREADS * LIVE];
static int g_errors;
static long long g_reissued; /* allocations served from the shim's cache */

static void live_add(void *p) {
  pthread_mutex_lock(&g_mu);
  int dup = 0, slot = -1;
  for (int i = 0; i < THREADS * LIVE; i++) {
    if (g_live[i] == p) dup = 1;
    if (!g_live[i] && slot < 0) slot = i;
  }
  if (dup) g_errors++;
  if (slot >= 0) g_live[slot] = p;
  pthread_mutex_unlock(&g_mu);
}

static void live_remove(void *p) {
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < THREADS * LIVE; i++)
    if (g_live[i] == p) g_live[i] = NULL;
  pthread_mutex_unlock(&g_mu);
}

static void fail(const char *what, int t, int i, int rc) {
  pthread_mutex_lock(&g_mu);
  if (g_errors < 20) fprintf(stderr, "thread %d iteration %d: %s (rc %d)\n", t, i, what, rc);
  g_errors++;
  pthread_mutex_unlock(&g_mu);
}

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg;
  void *mine[LIVE] = {0};
  uint64_t tags[LIVE] = {0};
  unsigned seed = 12345u + (unsigned)t * 7919u;
  cudaStream_t s = NULL;
  if (t % 2 && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) fail("stream", t, -1, 0);
  for (int i = 0; i < ITERS; i++) {
    int k = i % LIVE;
    if (mine[k]) {
      uint64_t got = 0;
      int rc = cudaMemcpy(&got, mine[k], sizeof got, cudaMemcpyDeviceToHost);
      if (rc || got != tags[k]) fail("block lost its content", t, i, rc);
      live_remove(mine[k]);
      rc = cudaFree(mine[k]);
      if (rc) fail("cudaFree", t, i, rc);
      mine[k] = NULL;
    }
    seed = seed * 1103515245u + 12345u;
    size_t size = 8 + (seed >> 8) % (1u << ((seed >> 4) % 22 + 1)); /* 9 B .. 4 MiB, all kinds */
    void *p = NULL;
    int reissued = 0;
    int rc = malloc_seen(&p, size, &reissued);
    if (rc || !p) {
      fail("cudaMalloc", t, i, rc);
      continue;
    }
    if (reissued) __atomic_add_fetch(&g_reissued, 1, __ATOMIC_RELAXED);
    live_add(p);
    tags[k] = ((uint64_t)t << 32) | (uint64_t)i;
    rc = cudaMemcpy(p, &tags[k], sizeof tags[k], cudaMemcpyHostToDevice);
    if (rc) fail("cudaMemcpy", t, i, rc);
    if (s && fakecuda_launch(s, p)) fail("launch", t, i, 0);
    mine[k] = p;
  }
  for (int k = 0; k < LIVE; k++)
    if (mine[k]) {
      live_remove(mine[k]);
      int rc = cudaFree(mine[k]);
      if (rc) fail("final cudaFree", t, k, rc);
    }
  if (s && cudaStreamDestroy(s)) fail("stream destroy", t, -1, 0);
  if (cudaGetLastError() != cudaSuccess) fail("a last error left behind", t, -1, 0);
  return NULL;
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  struct fakecuda_counters b = snap();
  pthread_t th[THREADS];
  for (int t = 0; t < THREADS; t++) CHECK(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0);
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  struct fakecuda_counters m = snap();
  CHECK_EQ(g_errors, 0);
  long long allocs = DELTA(b, m, pool_allocs) + DELTA(b, m, plain_allocs);
  CHECK_EQ(allocs + g_reissued, THREADS * ITERS);
  if (!under_shim()) CHECK_EQ(g_reissued, 0);
  CHECK_BALANCED(b, pool);
  CHECK_BALANCED(b, plain);
  m = snap();
  if (under_shim() && expect_pool(9) && expect_pool(4 * MiB)) CHECK_EQ(DELTA(b, m, plain_allocs), 0);
  CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
  CHECK_EQ(DELTA(b, m, rt_invalid_frees), 0);
  CHECK_EQ(DELTA(b, m, invalid_handles), 0);
  CHECK_EQ(DELTA(b, m, unordered_frees), 0);
  CHECK_EQ(DELTA(b, m, unordered_uses), 0);
  show_problem("end");
  printf("# %lld pool, %lld plain allocations at the driver, %lld from the shim's cache\n",
         DELTA(b, m, pool_allocs), DELTA(b, m, plain_allocs), g_reissued);
  return report();
}
