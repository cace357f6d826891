/* Behaviour 1, routing: under the shim, cudaMalloc is served by the pool
 * (cuMemAllocFromPoolAsync) and cudaFree of it goes to cuMemFreeAsync (at
 * once, or when the shim's cache gives an unused block back);
 * natively, with SOMA_DISABLE=1, outside SOMA_MIN_BYTES..SOMA_MAX_BYTES, the
 * plain allocator serves it. Size 0 and a NULL out-pointer reach the real
 * function, with its return codes and last error. The memory is usable. */
#include "common.h"

static void one(size_t size) {
  int pool = expect_pool(size);
  struct fakecuda_counters b = snap();
  void *p = NULL;
  cudaError_t rc = cudaMalloc(&p, size);
  struct fakecuda_counters m = snap();
  char label[64];
  snprintf(label, sizeof label, "malloc(%zu)", size);
  SHOW_RC(label, rc);
  CHECK(rc == cudaSuccess);
  CHECK(p != NULL);
  CHECK(((uintptr_t)p & 255) == 0);
  CHECK_EQ(ptr_kind(p), pool ? FAKECUDA_POOL : FAKECUDA_PLAIN);
  CHECK_EQ(DELTA(b, m, pool_allocs), pool ? 1 : 0);
  CHECK_EQ(DELTA(b, m, plain_allocs), pool ? 0 : 1);
  printf("# %s served by the %s allocator\n", label, ptr_kind(p) == FAKECUDA_POOL ? "pool" : "plain");

  /* usable at once: write, read back, a kernel on the legacy stream */
  unsigned char *host = malloc(size), *back = malloc(size);
  for (size_t i = 0; i < size; i++) host[i] = (unsigned char)(i * 7 + 1);
  CHECK_CUDA(cudaMemcpy(p, host, size, cudaMemcpyHostToDevice));
  CHECK_EQ(fakecuda_launch(NULL, p), CUDA_SUCCESS);
  CHECK_CUDA(cudaMemcpy(back, p, size, cudaMemcpyDeviceToHost));
  CHECK(memcmp(host, back, size) == 0);
  free(host);
  free(back);

  b = snap();
  rc = cudaFree(p);
  m = snap();
  snprintf(label, sizeof label, "free(%zu)", size);
  SHOW_RC(label, rc);
  CHECK(rc == cudaSuccess);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK_EQ(DELTA(b, m, plain_frees), pool ? 0 : 1);
  CHECK_EQ(DELTA(b, m, mem_free_calls), pool ? 0 : 1);
  if (!pool) CHECK_EQ(ptr_kind(p), FAKECUDA_NONE);
  /* A pool block reaches cuMemFreeAsync by the next shim call, or, kept in
   * the shim's cache, once the cache gives it back unused. */
  nudge();
  CHECK(EVENTUALLY(ptr_kind(p) == FAKECUDA_NONE));
  m = snap();
  if (pool) {
    CHECK(DELTA(b, m, pool_frees) >= 1);
    CHECK(DELTA(b, m, free_async_calls) >= 1);
    CHECK_EQ(DELTA(b, m, mem_free_calls), 0);
  }
  CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
  CHECK_EQ(DELTA(b, m, rt_invalid_frees), 0);
  CHECK_EQ(DELTA(b, m, unordered_frees), 0);
  show_problem(label);
}

int main(void) {
  int shim = under_shim();
  printf("# mode %s\n", shim ? "shim" : "native");

  /* cudaFree(NULL) succeeds and creates the context */
  CUcontext ctx = NULL;
  SHOW_RC("free(NULL)", cudaFree(NULL));
  CHECK(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != NULL);
  CHECK_LAST_ERROR_ONCE(cudaSuccess);

  struct fakecuda_counters start = snap();
  one(1 * MiB);
  one(1000);
  one(65536);
  one(4 * MiB);
  one(256);

  /* size 0: success, NULL, no allocation, no error */
  struct fakecuda_counters b = snap();
  void *z = (void *)0x1;
  SHOW_RC("malloc(0)", cudaMalloc(&z, 0));
  CHECK(z == NULL);
  CHECK_LAST_ERROR_ONCE(cudaSuccess);
  struct fakecuda_counters m = snap();
  CHECK_EQ(DELTA(b, m, pool_allocs) + DELTA(b, m, plain_allocs), 0);

  /* NULL out-pointer: invalid value, set as the last error once */
  SHOW_RC("malloc(NULL,16)", cudaMalloc(NULL, 16));
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
  SHOW_RC("malloc(NULL,1MiB)", cudaMalloc(NULL, MiB));
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue); /* peek does not reset */
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
  m = snap();
  CHECK_EQ(DELTA(b, m, pool_allocs) + DELTA(b, m, plain_allocs), 0);

  /* many pairs: the counts stay balanced (once the shim gave back all it
   * kept of the blocks above) */
  CHECK_BALANCED(start, pool);
  b = snap();
  for (int i = 0; i < 200; i++) {
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, (size_t)(i + 1) * 4096));
    CHECK_CUDA(cudaFree(p));
  }
  m = snap();
  CHECK_EQ(DELTA(b, m, pool_allocs) + DELTA(b, m, plain_allocs), 200);
  if (expect_pool(4096) && expect_pool(200 * 4096)) CHECK_EQ(DELTA(b, m, pool_allocs), 200);
  if (!shim) CHECK_EQ(DELTA(b, m, plain_allocs), 200);
  CHECK_BALANCED(b, pool);
  CHECK_BALANCED(b, plain);
  m = snap();
  CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
  CHECK_EQ(DELTA(b, m, invalid_handles), 0);
  show_problem("end");
  return report();
}
