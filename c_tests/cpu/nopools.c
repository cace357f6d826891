/* Behaviour 8, no pool support (FAKECUDA_NO_POOLS=1 makes
 * CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED 0 and every pool call fail):
 * the shim passes everything to the real allocator and the program works,
 * with the same results as natively. */
#include "common.h"

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  int supported = -1;
  SHOW_RC("attr", cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 0));
  SHOW_RC("pools supported", supported);
  struct fakecuda_counters b = snap();
  void *p[16];
  for (int i = 0; i < 16; i++) {
    p[i] = NULL;
    cudaError_t rc = cudaMalloc(&p[i], (size_t)(i + 1) * 100000);
    CHECK(rc == cudaSuccess && p[i]);
    CHECK_EQ(ptr_kind(p[i]), FAKECUDA_PLAIN);
    CHECK_CUDA(cudaMemset(p[i], i, (size_t)(i + 1) * 100000));
    CHECK_EQ(fakecuda_launch(NULL, p[i]), CUDA_SUCCESS);
  }
  for (int i = 0; i < 16; i += 2) SHOW_RC("free", cudaFree(p[i]));
  for (int i = 1; i < 16; i += 2) SHOW_RC("freeAsync", cudaFreeAsync(p[i], 0));
  SHOW_RC("double free", cudaFree(p[0]));
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
  void *z = (void *)1;
  SHOW_RC("malloc(0)", cudaMalloc(&z, 0));
  CHECK(z == NULL);
  SHOW_RC("malloc(NULL)", cudaMalloc(NULL, 64));
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
  void *a = NULL;
  SHOW_RC("mallocAsync", cudaMallocAsync(&a, 1024, 0)); /* not supported: the real answer */
  SHOW_RC("last error", cudaGetLastError());
  struct fakecuda_counters m = snap();
  CHECK_EQ(DELTA(b, m, plain_allocs), 16);
  CHECK_EQ(DELTA(b, m, plain_frees), 16);
  CHECK_EQ(DELTA(b, m, pool_allocs), 0);
  CHECK_EQ(DELTA(b, m, pools_created), 0);
  CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
  for (int i = 0; i < 500; i++) {
    void *q = NULL;
    CHECK_CUDA(cudaMalloc(&q, 4096));
    CHECK_CUDA(cudaFree(q));
  }
  return report();
}
