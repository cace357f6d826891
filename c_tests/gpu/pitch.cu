/* Pitched allocations: cudaMallocPitch, cudaMalloc3D and the driver's
 * cuMemAllocPitch (element sizes 4, 8, 16) return the pitch the real
 * functions return, for widths around and far from the alignment and for
 * large rows; the memory holds a 2D pattern written by a kernel row by row
 * and copied back with cudaMemcpy2D; cudaFree frees it. Requests the real
 * functions refuse or answer without memory print their codes. The runner
 * compares every line natively and under the shim. */
#include "gpu_common.h"

/* row r, column c (a 4-byte word): pattern(r, c) */
__global__ void k_fill_rows(char *base, size_t pitch, size_t words, size_t rows) {
  for (size_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < words; c += (size_t)gridDim.x * blockDim.x)
      ((unsigned *)(base + r * pitch))[c] = pattern((unsigned)r, c);
}

/* Writes every row, copies it back tightly packed, and counts mismatches. */
static size_t check_rows(void *p, size_t pitch, size_t width, size_t rows) {
  size_t words = width / 4;
  if (words == 0 || rows == 0) return 0;
  k_fill_rows<<<dim3(grid_for(words, 64), rows < 64 ? (unsigned)rows : 64), 256>>>((char *)p, pitch, words, rows);
  CHECK_CUDA(cudaGetLastError());
  unsigned *host = (unsigned *)malloc(words * 4 * rows);
  CHECK_CUDA(cudaMemcpy2D(host, words * 4, p, pitch, words * 4, rows, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < words; c++) bad += host[r * words + c] != pattern((unsigned)r, c);
  free(host);
  return bad;
}

int main(void) {
  CHECK_CUDA(cudaFree(NULL));
  static const size_t widths[] = {1, 4, 100, 511, 512, 513, 1000, 2048, 4097, 100000, 1 << 20, 10000000};
  static const size_t heights[] = {1, 3, 100};
  size_t bad = 0;
  for (size_t w = 0; w < sizeof widths / sizeof *widths; w++)
    for (size_t h = 0; h < sizeof heights / sizeof *heights; h++) {
      size_t width = widths[w], height = heights[h];
      if (width * height > (256u << 20)) continue;
      void *p = NULL;
      size_t pitch = 0;
      cudaError_t rc = cudaMallocPitch(&p, &pitch, width, height);
      printf("cudaMallocPitch(%zu, %zu): %d, pitch %zu\n", width, height, (int)rc, pitch);
      if (rc == cudaSuccess) {
        note_alloc(p);
        bad += check_rows(p, pitch, width, height);
        CHECK_CUDA(cudaFree(p));
      }

      cudaPitchedPtr pp = {0};
      rc = cudaMalloc3D(&pp, make_cudaExtent(width, height, 2));
      printf("cudaMalloc3D(%zu, %zu, 2): %d, pitch %zu, xsize %zu, ysize %zu\n", width, height, (int)rc, pp.pitch,
             pp.xsize, pp.ysize);
      if (rc == cudaSuccess) {
        note_alloc(pp.ptr);
        bad += check_rows(pp.ptr, pp.pitch, width, height * 2);
        CHECK_CUDA(cudaFree(pp.ptr));
      }

      for (unsigned element = 4; element <= 16; element *= 2) {
        CUdeviceptr d = 0;
        size_t dpitch = 0;
        CUresult r = cuMemAllocPitch(&d, &dpitch, width, height, element);
        printf("cuMemAllocPitch(%zu, %zu, %u): %d, pitch %zu\n", width, height, element, (int)r, dpitch);
        if (r == CUDA_SUCCESS) {
          note_alloc((void *)d);
          bad += check_rows((void *)d, dpitch, width, height);
          CHECK(cuMemFree(d) == CUDA_SUCCESS);
        }
      }
    }
  printf("rows checked: %zu bad words\n", bad);

  void *p = NULL;
  size_t pitch = 0;
  printf("cudaMallocPitch(NULL, &pitch, 64, 4): %d\n", (int)cudaMallocPitch(NULL, &pitch, 64, 4));
  show_last_error_twice();
  printf("cudaMallocPitch(&p, NULL, 64, 4): %d\n", (int)cudaMallocPitch(&p, NULL, 64, 4));
  show_last_error_twice();
  p = (void *)1;
  pitch = 7;
  cudaError_t rc = cudaMallocPitch(&p, &pitch, 0, 4);
  printf("cudaMallocPitch(&p, &pitch, 0, 4): %d, p %s, pitch %zu\n", (int)rc, nn(p), pitch);
  if (rc == cudaSuccess && p) CHECK_CUDA(cudaFree(p));
  show_last_error_twice();
  rc = cudaMallocPitch(&p, &pitch, 1ULL << 50, 1);
  printf("cudaMallocPitch(&p, &pitch, 1<<50, 1): %d\n", (int)rc);
  show_last_error_twice();
  CUdeviceptr d = 0;
  printf("cuMemAllocPitch(64, 4, 3): %d\n", (int)cuMemAllocPitch(&d, &pitch, 64, 4, 3));
  printf("cuMemAllocPitch(0, 4, 4): %d\n", (int)cuMemAllocPitch(&d, &pitch, 0, 4, 4));
  print_pooled();
  return report();
}
