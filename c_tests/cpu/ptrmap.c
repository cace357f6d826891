/* Behaviour 2, the pointer map is exact, and error codes are the real ones:
 * cudaFree of an unknown pointer (host, interior, double free) reaches the
 * real cudaFree (cudaErrorInvalidValue, last error set once); a shim pointer
 * freed with cudaFreeAsync is forgotten (a later cudaFree of it is a double
 * free); the program's own cudaMallocAsync pointer may be freed with cudaFree;
 * plain pointers (passed through by size) and the program's cuMemAlloc ones
 * may be freed with cudaFree or cudaFreeAsync. The shim never hands the
 * driver a pointer it does not own (drv_invalid_frees only counts the
 * program's own bad cuMemFree calls that reach it). A block the shim still
 * holds after a cudaFree (queued, or in its cache of passed frees) is freed:
 * a second cudaFree of it is a double free all the same, refused by the shim
 * itself (so a second cuMemFree of such a block never reaches the driver). */
#include "common.h"

static int invalid_expected;

static void bad_free(const char *label, void *p) {
  cudaError_t rc = cudaFree(p);
  SHOW_RC(label, rc);
  CHECK(rc == cudaErrorInvalidValue);
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
  invalid_expected++;
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  struct fakecuda_counters b = snap();

  /* interior pointer: rejected, and the block stays allocated */
  char *a = NULL;
  SHOW_RC("malloc a", cudaMalloc((void **)&a, MiB));
  bad_free("free(a+256)", a + 256);
  bad_free("free(a+1)", a + 1);
  CHECK(ptr_kind(a) != FAKECUDA_NONE);
  CHECK_CUDA(cudaMemset(a, 1, MiB));

  /* host pointers */
  int local = 0;
  bad_free("free(&local)", &local);
  void *heap = malloc(4096);
  bad_free("free(heap)", heap);
  free(heap);

  /* double free: at once (the shim may still hold the block back from the
   * driver), and once the block is back in the pool */
  SHOW_RC("free(a)", cudaFree(a));
  CHECK_LAST_ERROR_ONCE(cudaSuccess);
  bad_free("free(a) again, at once", a);
  nudge();
  CHECK(EVENTUALLY(ptr_kind(a) == FAKECUDA_NONE));
  bad_free("free(a) a third time", a);

  /* a shim pointer freed with cudaFreeAsync is forgotten */
  void *c = NULL;
  SHOW_RC("malloc c", cudaMalloc(&c, MiB));
  SHOW_RC("freeAsync(c, legacy)", cudaFreeAsync(c, 0));
  CHECK_EQ(ptr_kind(c), FAKECUDA_NONE);
  CHECK_LAST_ERROR_ONCE(cudaSuccess);
  bad_free("free(c) after freeAsync", c);

  /* the same on a non-blocking stream, then the pointer's memory reused */
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *d = NULL;
  SHOW_RC("malloc d", cudaMalloc(&d, 2 * MiB));
  SHOW_RC("freeAsync(d, s)", cudaFreeAsync(d, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  bad_free("free(d) after freeAsync", d);

  /* the program's own cudaMallocAsync pointers, freed with cudaFree */
  void *e = NULL;
  SHOW_RC("mallocAsync e", cudaMallocAsync(&e, MiB, 0));
  CHECK_EQ(ptr_kind(e), FAKECUDA_POOL);
  SHOW_RC("free(e)", cudaFree(e));
  CHECK_EQ(ptr_kind(e), FAKECUDA_NONE);
  bad_free("free(e) again", e);
  void *f = NULL;
  SHOW_RC("mallocAsync f on s", cudaMallocAsync(&f, 3 * MiB, s));
  SHOW_RC("free(f+512)", cudaFree((char *)f + 512));
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
  invalid_expected++;
  SHOW_RC("free(f)", cudaFree(f));
  SHOW_RC("mallocAsync g", cudaMallocAsync(&f, MiB, s));
  SHOW_RC("freeAsync(g)", cudaFreeAsync(f, s));

  /* the program's driver-API allocations (plain natively; the shim may serve
   * them from its pool too), freed through the runtime */
  CUdeviceptr dp = 0;
  CHECK(cuMemAlloc(&dp, MiB) == CUDA_SUCCESS);
  CHECK_EQ(ptr_kind((void *)dp), under_shim() ? ptr_kind((void *)dp) : FAKECUDA_PLAIN);
  CHECK(ptr_kind((void *)dp) != FAKECUDA_NONE);
  printf("# cuMemAlloc served by the %s allocator\n", ptr_kind((void *)dp) == FAKECUDA_POOL ? "pool" : "plain");
  SHOW_RC("free(cuMemAlloc ptr)", cudaFree((void *)dp));
  nudge();
  CHECK_RELEASED_KIND((void *)dp);
  bad_free("free(cuMemAlloc ptr) again", (void *)dp);
  CHECK(cuMemAlloc(&dp, MiB) == CUDA_SUCCESS);
  SHOW_RC("freeAsync(cuMemAlloc ptr)", cudaFreeAsync((void *)dp, s));
  CHECK_EQ(ptr_kind((void *)dp), FAKECUDA_NONE);
  CHECK(cuMemAlloc(&dp, MiB) == CUDA_SUCCESS);
  SHOW_RC("cuMemFree(cuMemAlloc ptr)", cuMemFree(dp));
  nudge();
  CHECK_RELEASED_KIND((void *)dp);
  /* the program's three bad cuMemFree calls reach the driver, but this one
   * when the shim still holds the block: the shim refuses it itself */
  int drv_invalid_expected = ptr_kind((void *)dp) == FAKECUDA_NONE ? 3 : 2;
  SHOW_RC("cuMemFree(cuMemAlloc ptr) again", cuMemFree(dp));
  int y;
  SHOW_RC("cuMemFree(&y)", cuMemFree((CUdeviceptr)&y));
  SHOW_RC("cuMemFree(0)", cuMemFree(0));
  CHECK_LAST_ERROR_ONCE(cudaSuccess); /* the driver API leaves the runtime's last error alone */

  /* plain pointers (served plain natively, or passed through by size when
   * SOMA_MAX_BYTES is small) freed either way */
  void *h = NULL, *i = NULL;
  SHOW_RC("malloc h 8MiB", cudaMalloc(&h, 8 * MiB));
  SHOW_RC("malloc i 8MiB", cudaMalloc(&i, 8 * MiB));
  CHECK_EQ(ptr_kind(h), expect_pool(8 * MiB) ? FAKECUDA_POOL : FAKECUDA_PLAIN);
  SHOW_RC("freeAsync(h)", cudaFreeAsync(h, s));
  SHOW_RC("free(i)", cudaFree(i));
  nudge();
  CHECK_EQ(ptr_kind(h), FAKECUDA_NONE); /* the program's own cudaFreeAsync: freed at the driver */
  CHECK_RELEASED_KIND(i);
  bad_free("free(h) after freeAsync", h);
  bad_free("free(i) again", i);
  CHECK_LAST_ERROR_ONCE(cudaSuccess);

  /* cudaFreeAsync of an unknown pointer: the real answer */
  int x;
  SHOW_RC("freeAsync(&x)", cudaFreeAsync(&x, s));
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
  invalid_expected++;

  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_BALANCED(b, pool);
  CHECK_BALANCED(b, plain);
  struct fakecuda_counters m = snap();
  CHECK_EQ(DELTA(b, m, rt_invalid_frees), invalid_expected);
  CHECK_EQ(DELTA(b, m, drv_invalid_frees), drv_invalid_expected);
  CHECK_EQ(DELTA(b, m, invalid_handles), 0);
  CHECK_EQ(DELTA(b, m, unordered_frees), 0);
  show_problem("end");
  return report();
}
