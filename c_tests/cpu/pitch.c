/* Pitched allocations: cudaMallocPitch, cudaMalloc3D and the driver's
 * cuMemAllocPitch give the pitch the real functions give (rows aligned as the
 * driver aligns them), under the shim from the pool; cudaFree frees them.
 * Requests the real functions refuse or answer without memory (a zero width
 * or height, a NULL out-pointer, an element size other than 4, 8 or 16) get
 * the real codes and last error. The shim learns the driver's row alignment
 * from one real pitched allocation, kept, and only once it pools a request:
 * nothing else of the real allocator's is left behind. */
#include "common.h"

static int g_pooled = 0;

static void use_and_free(void *p, size_t pitch, size_t width, size_t height) {
  CHECK(p != NULL);
  CHECK(pitch >= width);
  CHECK_EQ(ptr_kind(p), expect_pool(pitch * height) ? FAKECUDA_POOL : FAKECUDA_PLAIN);
  g_pooled += ptr_kind(p) == FAKECUDA_POOL;
  CHECK_CUDA(cudaMemset(p, 0x5a, pitch * height)); /* every row, to its pitch */
  unsigned char last = 0;
  CHECK_CUDA(cudaMemcpy(&last, (char *)p + pitch * height - 1, 1, cudaMemcpyDeviceToHost));
  CHECK_EQ(last, 0x5a);
  CHECK_CUDA(cudaFree(p));
  CHECK_RELEASED(p);
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  struct fakecuda_counters b = snap();
  static const size_t widths[] = {1, 100, 511, 512, 513, 1000, 4096, 100000};
  static const size_t heights[] = {1, 3, 64};
  for (size_t w = 0; w < sizeof widths / sizeof *widths; w++)
    for (size_t h = 0; h < sizeof heights / sizeof *heights; h++) {
      void *p = NULL;
      size_t pitch = 0;
      cudaError_t rc = cudaMallocPitch(&p, &pitch, widths[w], heights[h]);
      printf("cudaMallocPitch(%zu, %zu): rc %d pitch %zu\n", widths[w], heights[h], (int)rc, pitch);
      CHECK_CUDA(rc);
      use_and_free(p, pitch, widths[w], heights[h]);

      struct cudaPitchedPtr pp = {0};
      struct cudaExtent extent = {.width = widths[w], .height = heights[h], .depth = 2};
      rc = cudaMalloc3D(&pp, extent);
      printf("cudaMalloc3D(%zu, %zu, 2): rc %d pitch %zu xsize %zu ysize %zu\n", widths[w], heights[h], (int)rc,
             pp.pitch, pp.xsize, pp.ysize);
      CHECK_CUDA(rc);
      use_and_free(pp.ptr, pp.pitch, widths[w], heights[h] * 2);

      for (unsigned element = 4; element <= 16; element *= 2) {
        CUdeviceptr d = 0;
        size_t dpitch = 0;
        CUresult r = cuMemAllocPitch(&d, &dpitch, widths[w], heights[h], element);
        printf("cuMemAllocPitch(%zu, %zu, %u): rc %d pitch %zu\n", widths[w], heights[h], element, (int)r, dpitch);
        CHECK_EQ(r, CUDA_SUCCESS);
        CHECK_EQ(dpitch, pitch);
        use_and_free((void *)d, dpitch, widths[w], heights[h]);
      }
    }

  /* what the real functions answer themselves */
  void *p = NULL;
  size_t pitch = 0;
  SHOW_RC("cudaMallocPitch(NULL, &pitch, 64, 4)", cudaMallocPitch(NULL, &pitch, 64, 4));
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
  SHOW_RC("cudaMallocPitch(&p, NULL, 64, 4)", cudaMallocPitch(&p, NULL, 64, 4));
  CHECK_LAST_ERROR_ONCE(cudaErrorInvalidValue);
  CUdeviceptr d = 0;
  printf("cuMemAllocPitch(64, 4, 3): rc %d\n", (int)cuMemAllocPitch(&d, &pitch, 64, 4, 3));
  printf("cuMemAllocPitch(0, 4, 4): rc %d\n", (int)cuMemAllocPitch(&d, &pitch, 0, 4, 4));
  CHECK_LAST_ERROR_ONCE(cudaSuccess);
  struct fakecuda_counters m = snap();
  long long left = DELTA(b, m, plain_allocs) - DELTA(b, m, plain_frees);
  printf("# %d pooled, %lld plain allocation(s) left\n", g_pooled, left);
  CHECK_EQ(left, g_pooled > 0 ? 1 : 0);
  CHECK_ORDERLY(b, m, "pitch");
  return check_failures ? 1 : 0;
}
