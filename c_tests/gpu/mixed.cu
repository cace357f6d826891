/* Contract 4: mixed use stays correct and the pointer map stays exact.
 *  - shim pointers (cudaMalloc) freed with cudaFreeAsync;
 *  - the program's own cudaMallocAsync pointers (default pool and its own
 *    pool) freed with cudaFree;
 *  - pointers from the real allocator (cudaMallocPitch, cudaMalloc3D,
 *    cudaMallocManaged, the driver's cuMemAlloc, and a cudaMalloc larger than
 *    SOMA_MAX_BYTES when the runner sets it) freed with cudaFree and with
 *    cudaFreeAsync;
 * after each free, a second cudaFree of the same pointer must fail as the real
 * one does (cudaErrorInvalidValue, 1, for cudaMalloc pointers), with the same
 * last error once, then 0. Contents of
 * the blocks still alive are verified between frees. */
#include "gpu_common.h"

static unsigned *host;
static cudaStream_t s;

static void show_free(const char *what, cudaError_t rc) {
  cudaError_t l1 = cudaGetLastError(), l2 = cudaGetLastError();
  printf("%-52s rc=%d last=%d last2=%d\n", what, (int)rc, (int)l1, (int)l2);
}

/* Fill with a pattern on s and check it (the block is alive and ours). */
static void use(const char *what, void *d, size_t bytes, unsigned seed) {
  size_t bad = fill_and_verify(d, bytes, seed, s, host);
  printf("%-52s verified bad=%zu\n", what, bad);
  CHECK(bad == 0);
}

/* Check that a block still holds what use() wrote into it. */
static void still(const char *what, void *d, size_t bytes, unsigned seed) {
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost));
  size_t bad = count_bad_host(host, bytes / 4, seed);
  printf("%-52s still intact bad=%zu\n", what, bad);
  CHECK(bad == 0);
}

/* The second free of a freed pointer, after the frees have surely happened. */
static void double_free(const char *what, void *p) {
  CHECK_CUDA(cudaDeviceSynchronize());
  char label[96];
  snprintf(label, sizeof label, "double cudaFree(%s)", what);
  cudaError_t rc = cudaFree(p);
  show_free(label, rc);
  CHECK(rc != cudaSuccess); /* the exact code is compared with the native run */
}

int main(void) {
  const size_t N = 1 * MiB;
  CHECK_CUDA(cudaFree(0));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMallocHost(&host, 16 * MiB));
  const char *maxb = getenv("SOMA_MAX_BYTES");
  printf("# SOMA_MAX_BYTES=%s\n", maxb ? maxb : "(unset)");

  /* A survivor that must stay intact through everything below. */
  void *keep = NULL;
  CHECK_CUDA(TMALLOC(&keep, N));
  use("survivor", keep, N, 1);

  /* 1. shim pointer freed with cudaFreeAsync */
  void *a = NULL;
  CHECK_CUDA(TMALLOC(&a, N));
  use("cudaMalloc ptr", a, N, 2);
  show_free("cudaFreeAsync(cudaMalloc ptr, s)", cudaFreeAsync(a, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  double_free("cudaMalloc ptr freed async", a);
  /* ... and on the legacy stream */
  CHECK_CUDA(TMALLOC(&a, N));
  use("cudaMalloc ptr 2", a, N, 3);
  show_free("cudaFreeAsync(cudaMalloc ptr, legacy)", cudaFreeAsync(a, 0));
  double_free("cudaMalloc ptr freed async on legacy", a);

  /* 2. the program's own cudaMallocAsync pointer freed with cudaFree */
  void *b = NULL;
  CHECK_CUDA(cudaMallocAsync(&b, N, s));
  use("own cudaMallocAsync ptr", b, N, 4);
  CHECK_CUDA(cudaStreamSynchronize(s));
  show_free("cudaFree(own cudaMallocAsync ptr)", cudaFree(b));
  double_free("own cudaMallocAsync ptr", b);
  still("survivor", keep, N, 1);

  /* 3. the program's own pool */
  cudaMemPool_t pool = make_own_pool();
  void *c = NULL;
  CHECK_CUDA(cudaMallocFromPoolAsync(&c, N, pool, s));
  use("own pool ptr", c, N, 5);
  show_free("cudaFree(own pool ptr)", cudaFree(c));
  double_free("own pool ptr", c);

  /* 4. real-allocator pointers */
  void *pitch = NULL;
  size_t pitch_bytes = 0;
  CHECK_CUDA(cudaMallocPitch(&pitch, &pitch_bytes, 1000, 64));
  use("cudaMallocPitch ptr", pitch, 1000 * 4, 6);
  show_free("cudaFree(cudaMallocPitch ptr)", cudaFree(pitch));
  double_free("cudaMallocPitch ptr", pitch);

  CHECK_CUDA(cudaMallocPitch(&pitch, &pitch_bytes, 1000, 64));
  use("cudaMallocPitch ptr 2", pitch, 1000 * 4, 7);
  show_free("cudaFreeAsync(cudaMallocPitch ptr, s)", cudaFreeAsync(pitch, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  double_free("cudaMallocPitch ptr freed async", pitch);

  cudaPitchedPtr p3;
  CHECK_CUDA(cudaMalloc3D(&p3, make_cudaExtent(256, 16, 16)));
  use("cudaMalloc3D ptr", p3.ptr, 4096, 8);
  show_free("cudaFree(cudaMalloc3D ptr)", cudaFree(p3.ptr));
  double_free("cudaMalloc3D ptr", p3.ptr);

  void *m = NULL;
  CHECK_CUDA(cudaMallocManaged(&m, N, cudaMemAttachGlobal));
  use("cudaMallocManaged ptr", m, N, 9);
  show_free("cudaFree(cudaMallocManaged ptr)", cudaFree(m));
  double_free("cudaMallocManaged ptr", m);

  CUdeviceptr dp = 0;
  CHECK(cuMemAlloc(&dp, N) == CUDA_SUCCESS);
  use("cuMemAlloc ptr", (void *)dp, N, 10);
  show_free("cudaFree(cuMemAlloc ptr)", cudaFree((void *)dp));
  double_free("cuMemAlloc ptr", (void *)dp);

  CHECK(cuMemAlloc(&dp, N) == CUDA_SUCCESS);
  use("cuMemAlloc ptr 2", (void *)dp, N, 11);
  show_free("cudaFreeAsync(cuMemAlloc ptr, s)", cudaFreeAsync((void *)dp, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  double_free("cuMemAlloc ptr freed async", (void *)dp);
  still("survivor", keep, N, 1);

  /* 5. a cudaMalloc above SOMA_MAX_BYTES (8 MiB; the runner's variant sets
   * SOMA_MAX_BYTES=1048576): the real allocator's, in the shim's design;
   * freed both ways. Whether it was pooled is information only. */
  void *big = NULL;
  CHECK_CUDA(TMALLOC(&big, 8 * MiB));
  printf("# big (8 MiB) cudaMalloc pooled=%d\n", is_pool_ptr(big));
  use("big cudaMalloc ptr", big, 8 * MiB, 12);
  show_free("cudaFree(big cudaMalloc ptr)", cudaFree(big));
  double_free("big cudaMalloc ptr", big);
  CHECK_CUDA(TMALLOC(&big, 8 * MiB));
  use("big cudaMalloc ptr 2", big, 8 * MiB, 13);
  show_free("cudaFreeAsync(big cudaMalloc ptr, s)", cudaFreeAsync(big, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  double_free("big cudaMalloc ptr freed async", big);

  /* 6. interleaved: several of each kind alive at once, freed in mixed order
   * with the other kind's free; the rest verified after each free. */
  enum { K = 6 };
  void *sh[K], *own[K];
  for (int i = 0; i < K; i++) {
    CHECK_CUDA(TMALLOC(&sh[i], N));
    CHECK_CUDA(cudaMallocAsync(&own[i], N, s));
    use("interleaved cudaMalloc ptr", sh[i], N, 100 + i);
    use("interleaved own cudaMallocAsync ptr", own[i], N, 200 + i);
  }
  for (int i = 0; i < K; i++) {
    int j = (i * 5) % K; /* 0 5 4 3 2 1 */
    show_free("interleaved cudaFreeAsync(cudaMalloc ptr)", cudaFreeAsync(sh[j], i % 2 ? s : 0));
    show_free("interleaved cudaFree(own cudaMallocAsync ptr)", cudaFree(own[i]));
    CHECK_CUDA(cudaDeviceSynchronize());
    int bad = 0;
    for (int x = 0; x < K; x++) {
      int sh_alive = 1, own_alive = x > i;
      for (int y = 0; y <= i; y++) sh_alive &= ((y * 5) % K) != x;
      if (sh_alive) {
        CHECK_CUDA(cudaMemcpy(host, sh[x], N, cudaMemcpyDeviceToHost));
        bad += count_bad_host(host, N / 4, 100 + x) != 0;
      }
      if (own_alive) {
        CHECK_CUDA(cudaMemcpy(host, own[x], N, cudaMemcpyDeviceToHost));
        bad += count_bad_host(host, N / 4, 200 + x) != 0;
      }
    }
    printf("interleaved step %d: blocks alive and intact, bad blocks=%d\n", i, bad);
    CHECK(bad == 0);
  }
  for (int i = 0; i < K; i++) {
    double_free("interleaved cudaMalloc ptr", sh[i]);
    double_free("interleaved own ptr", own[i]);
  }

  /* 7. after all that, the allocator still works and the survivor is intact */
  still("survivor", keep, N, 1);
  show_free("cudaFree(survivor)", cudaFree(keep));
  double_free("survivor", keep);
  void *z = NULL;
  CHECK_CUDA(TMALLOC(&z, N));
  use("final cudaMalloc ptr", z, N, 14);
  show_free("cudaFree(final)", cudaFree(z));

  CHECK_CUDA(cudaMemPoolDestroy(pool));
  CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_CUDA(cudaFreeHost(host));
  print_pooled();
  return report();
}
