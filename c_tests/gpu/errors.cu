/* Contract 5: return codes, the out pointer and cudaGetLastError (read twice:
 * the error once, then success) match the real runtime for: size 0, NULL
 * out-pointer, impossible size, host pointers, an interior pointer, a double
 * free, cudaFree(NULL); and an out-of-memory the shim recovers from leaves no
 * error behind.
 *
 * Recovered OOM: cudaMalloc 1 GiB blocks until one fails (their count is
 * information only: it may differ by one or two under the shim), free them
 * all, then cudaMalloc one block of (count - 2) GiB: it must succeed and the
 * last error must then be cudaSuccess. `--no-oom` leaves that part out (the
 * runner uses it under compute-sanitizer). */
#include "gpu_common.h"

static void show(const char *what, cudaError_t rc, const void *p, int print_p) {
  cudaError_t l1 = cudaGetLastError(), l2 = cudaGetLastError();
  if (print_p)
    printf("%-40s rc=%d p=%s last=%d last2=%d\n", what, (int)rc, nn(p), (int)l1, (int)l2);
  else
    printf("%-40s rc=%d last=%d last2=%d\n", what, (int)rc, (int)l1, (int)l2);
}

int main(int argc, char **argv) {
  int oom = !(argc > 1 && strcmp(argv[1], "--no-oom") == 0);
  cudaError_t rc;

  rc = cudaFree(NULL);
  show("cudaFree(NULL) first call", rc, NULL, 0);
  CHECK(rc == cudaSuccess);

  void *p = (void *)1;
  rc = cudaMalloc(&p, 0);
  show("cudaMalloc(&p, 0)", rc, p, 1);

  rc = cudaMalloc(NULL, 16);
  show("cudaMalloc(NULL, 16)", rc, NULL, 0);
  CHECK(rc != cudaSuccess);

  p = (void *)1;
  rc = cudaMalloc(&p, 1ULL << 50);
  show("cudaMalloc(&p, 1<<50)", rc, p, 1);
  CHECK(rc == cudaErrorMemoryAllocation);

  int stack_var = 0;
  rc = cudaFree(&stack_var);
  show("cudaFree(host stack ptr)", rc, NULL, 0);

  void *heap = malloc(4096);
  rc = cudaFree(heap);
  show("cudaFree(host heap ptr)", rc, NULL, 0);
  free(heap);

  void *pinned = NULL;
  CHECK_CUDA(cudaMallocHost(&pinned, 4096));
  rc = cudaFree(pinned);
  show("cudaFree(cudaMallocHost ptr)", rc, NULL, 0);
  rc = cudaFreeHost(pinned);
  show("cudaFreeHost(cudaMallocHost ptr)", rc, NULL, 0);

  /* Interior pointer: refused, and the block stays alive and usable. */
  unsigned *blk = NULL, *hbuf = NULL;
  CHECK_CUDA(cudaMallocHost(&hbuf, 1 * MiB));
  CHECK_CUDA(TMALLOC(&blk, 1 * MiB));
  rc = cudaFree((char *)blk + 256);
  show("cudaFree(interior ptr p+256)", rc, NULL, 0);
  CHECK(rc != cudaSuccess);
  size_t bad = fill_and_verify(blk, 1 * MiB, 77, 0, hbuf);
  printf("block after interior free: verified bad=%zu\n", bad);
  CHECK(bad == 0);
  rc = cudaFree(blk);
  show("cudaFree(block)", rc, NULL, 0);
  CHECK(rc == cudaSuccess);
  rc = cudaFree(blk);
  show("cudaFree(block) again (double free)", rc, NULL, 0);
  CHECK(rc != cudaSuccess);

  /* Double free of a small block, and of a freshly reallocated one. */
  void *s1 = NULL, *s2 = NULL;
  CHECK_CUDA(TMALLOC(&s1, 256));
  CHECK_CUDA(cudaFree(s1));
  rc = cudaFree(s1);
  show("double free of a 256 B block", rc, NULL, 0);
  CHECK_CUDA(TMALLOC(&s2, 256));
  CHECK_CUDA(TMALLOC(&s1, 256));
  CHECK_CUDA(cudaFree(s2));
  CHECK_CUDA(cudaFree(s1));
  rc = cudaFree(s2);
  show("double free after reuse", rc, NULL, 0);

  rc = cudaFree(NULL);
  show("cudaFree(NULL) again", rc, NULL, 0);
  CHECK(rc == cudaSuccess);

  /* A failed cudaMalloc does not disturb a later good one. */
  void *after = NULL;
  rc = TMALLOC(&after, 4096);
  show("cudaMalloc(4096) after the errors", rc, after, 1);
  CHECK(rc == cudaSuccess);
  CHECK_CUDA(cudaFree(after));

  if (oom) {
    enum { MAXB = 4096 };
    static void *blocks[MAXB];
    int count = 0;
    cudaError_t last_rc = cudaSuccess;
    while (count < MAXB) {
      void *q = NULL;
      last_rc = TMALLOC(&q, 1 * GiB);
      if (last_rc != cudaSuccess) {
        printf("OOM: failing cudaMalloc(1 GiB) p=%s\n", nn(q));
        break;
      }
      blocks[count++] = q;
    }
    show("OOM: the failing cudaMalloc", last_rc, NULL, 0);
    CHECK(last_rc == cudaErrorMemoryAllocation);
    printf("# OOM: %d blocks of 1 GiB before the failure\n", count);
    int free_fail = 0;
    for (int i = 0; i < count; i++) free_fail += cudaFree(blocks[i]) != cudaSuccess;
    printf("OOM: freed all blocks, failures=%d\n", free_fail);
    CHECK(free_fail == 0);
    size_t want = (count > 2 ? count - 2 : 1) * GiB;
    void *huge = NULL;
    rc = TMALLOC(&huge, want);
    show("OOM: cudaMalloc((count-2) GiB) after freeing", rc, huge, 1);
    CHECK(rc == cudaSuccess);
    if (huge) {
      /* Touch both ends of it. */
      CHECK_CUDA(cudaMemset(huge, 0x11, 1 * MiB));
      CHECK_CUDA(cudaMemset((char *)huge + want - 1 * MiB, 0x22, 1 * MiB));
      CHECK_CUDA(cudaDeviceSynchronize());
      rc = cudaFree(huge);
      show("OOM: cudaFree(big block)", rc, NULL, 0);
    }
    /* And the allocator is still fine. */
    void *small = NULL;
    rc = TMALLOC(&small, 1 * MiB);
    show("OOM: cudaMalloc(1 MiB) afterwards", rc, small, 1);
    CHECK_CUDA(cudaFree(small));
  }

  CHECK_CUDA(cudaFreeHost(hbuf));
  print_pooled();
  return report();
}
