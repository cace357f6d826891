/* Contracts 1 and 2 while the program has only blocking streams, where the
 * shim frees and allocates on the legacy stream: a freed block is reused at
 * once there, in stream order, while the work that used it may still run.
 *
 * Part 1 (blocking streams only): A = cudaMalloc(n); fill A with P on S1;
 * launch R on S1 (reads A for ~1.5 ms, counting elements != P); cudaFree(A);
 * B = cudaMalloc(n); W on S2 writes Q into B. S1 and S2 range over the legacy
 * stream, a blocking stream and the per-thread default stream. If B overlaps
 * A while R runs, R sees Q.
 *
 * Part 3 (a free on the legacy stream orders the work before it): A on a
 * blocking stream S1 is filled and R launched as in part 1; then another
 * block C is allocated and freed (with no other stream work between, a free
 * on the legacy stream, which waits for R), and only then A; B =
 * cudaMalloc(n) and W on the per-thread default stream. A shim that keeps A
 * for B with no mark, relying on C's free as one, must have issued that free
 * on the legacy stream. Under the shim B must be A (unless SOMA_LEGACY_CACHE
 * is off): else the part tests nothing.
 *
 * Part 2 (a non-blocking stream made after the reuse): the same, with R on
 * the legacy stream and W on a non-blocking stream created between
 * cudaMalloc(B) and W (through the runtime or the driver, in turn), then
 * destroyed once idle, so the next round starts with blocking streams only.
 * Such a stream is not ordered after the legacy stream: the shim must keep it
 * from running alongside R. A new stream must also be idle, as natively.
 *
 * --no-stream-wait: the program emulates a shim that reuses on the legacy
 * stream but does nothing when a non-blocking stream is made
 * (cudaMallocAsync/cudaFreeAsync on the legacy stream); part 2 must DETECT
 * corruption: the teeth of this test. Run natively only. */
#include "gpu_common.h"

enum { LEGACY, BLOCKING, PER_THREAD, NKINDS };
static const char *kind_name[NKINDS] = {"legacy", "blocking", "per-thread-default"};
static const size_t sizes[] = {1 * MiB, 256 * KiB, 4 * MiB, 2 * KiB, 64 * KiB + 12};
#define NSIZES (sizeof sizes / sizeof sizes[0])
static const unsigned P = 0x50505050u, Q = 0x51515151u;
static const unsigned long long READ_NS = 1500000ULL;

/* A on s1 is filled, read for ~1.5 ms and freed; B is allocated. */
static void free_while_read(void **A, void **B, size_t bytes, cudaStream_t s1, unsigned long long *bad, int wrong) {
  size_t n = bytes / 4;
  if (wrong) CHECK_CUDA(cudaMallocAsync(A, bytes, 0));
  else CHECK_CUDA(TMALLOC(A, bytes));
  k_set<<<grid_for(n, 256), 256, 0, s1>>>((unsigned *)*A, n, P);
  k_read_until<<<grid_for(n, 64), 256, 0, s1>>>((const unsigned *)*A, n, P, READ_NS, bad);
  CHECK_CUDA(cudaGetLastError());
  if (wrong) {
    CHECK_CUDA(cudaFreeAsync(*A, 0));
    CHECK_CUDA(cudaMallocAsync(B, bytes, 0));
  } else {
    CHECK_CUDA(cudaFree(*A));
    CHECK_CUDA(TMALLOC(B, bytes));
  }
}

/* W on s2 writes Q into B and counts what is not Q. */
static void write_check(void *B, size_t bytes, cudaStream_t s2, unsigned long long *badB) {
  size_t n = bytes / 4;
  k_set<<<grid_for(n, 1024), 256, 0, s2>>>((unsigned *)B, n, Q);
  k_count_neq<<<grid_for(n, 1024), 256, 0, s2>>>((const unsigned *)B, n, Q, badB);
  CHECK_CUDA(cudaGetLastError());
}

int main(int argc, char **argv) {
  int wrong = argc > 1 && strcmp(argv[1], "--no-stream-wait") == 0;
  int rounds = gpu_quick() ? 3 : 40;
  CHECK_CUDA(cudaFree(0));
  cudaStream_t s[NKINDS];
  s[LEGACY] = (cudaStream_t)0;
  CHECK_CUDA(cudaStreamCreate(&s[BLOCKING]));
  s[PER_THREAD] = cudaStreamPerThread;

  /* R's corruptions: part 1 by the kind of S1, then parts 2 and 3; W's check of B */
  enum { PART2 = NKINDS, PART3, NCOUNTS };
  unsigned long long *bad = NULL, *badB = NULL;
  CHECK_CUDA(TMALLOC(&bad, NCOUNTS * sizeof *bad));
  CHECK_CUDA(TMALLOC(&badB, sizeof *badB));
  CHECK_CUDA(cudaMemset(bad, 0, NCOUNTS * sizeof *bad));
  CHECK_CUDA(cudaMemset(badB, 0, sizeof *badB));
  CHECK_CUDA(cudaDeviceSynchronize());

  int same = 0, iters = 0, same3 = 0;
  if (!wrong) {
    for (int i = 0; i < rounds * NKINDS * (NKINDS - 1); i++) {
      int k1 = i % NKINDS, k2 = (k1 + 1 + (i / NKINDS) % (NKINDS - 1)) % NKINDS;
      size_t bytes = sizes[(i / NKINDS) % NSIZES];
      void *A = NULL, *B = NULL;
      free_while_read(&A, &B, bytes, s[k1], bad + k1, 0);
      same += A == B;
      iters++;
      write_check(B, bytes, s[k2], badB);
      CHECK_CUDA(cudaDeviceSynchronize());
      CHECK_CUDA(cudaFree(B));
    }
    for (int i = 0; i < rounds * NSIZES; i++) {
      size_t bytes = sizes[i % NSIZES], n = bytes / 4;
      void *A = NULL, *B = NULL, *C = NULL;
      CHECK_CUDA(TMALLOC(&A, bytes));
      k_set<<<grid_for(n, 256), 256, 0, s[BLOCKING]>>>((unsigned *)A, n, P);
      k_read_until<<<grid_for(n, 64), 256, 0, s[BLOCKING]>>>((const unsigned *)A, n, P, READ_NS, bad + PART3);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(TMALLOC(&C, bytes + 512));
      CHECK_CUDA(cudaFree(C));
      CHECK_CUDA(cudaFree(A));
      CHECK_CUDA(TMALLOC(&B, bytes));
      same3 += A == B;
      iters++;
      write_check(B, bytes, s[PER_THREAD], badB);
      CHECK_CUDA(cudaDeviceSynchronize());
      CHECK_CUDA(cudaFree(B));
    }
  }

  int busy_new_streams = 0;
  for (int i = 0; i < rounds * 2; i++) {
    size_t bytes = sizes[i % NSIZES];
    void *A = NULL, *B = NULL;
    free_while_read(&A, &B, bytes, s[LEGACY], bad + PART2, wrong);
    same += A == B;
    iters++;
    cudaStream_t nb;
    if (i % 2) {
      CUstream cs = 0;
      CHECK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
      nb = (cudaStream_t)cs;
    } else {
      CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    }
    busy_new_streams += cudaStreamQuery(nb) != cudaSuccess;
    write_check(B, bytes, nb, badB);
    CHECK_CUDA(cudaDeviceSynchronize());
    if (wrong) CHECK_CUDA(cudaFreeAsync(B, 0));
    else CHECK_CUDA(cudaFree(B));
    CHECK_CUDA(cudaStreamDestroy(nb));
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  unsigned long long h[NCOUNTS], part1 = 0, part2, part3;
  CHECK_CUDA(cudaMemcpy(h, bad, sizeof h, cudaMemcpyDeviceToHost));
  unsigned long long hb = read_counter(badB);
  for (int k = 0; k < NKINDS && !wrong; k++) {
    printf("part 1 (blocking streams only), R on %s: corruptions=%llu\n", kind_name[k], h[k]);
    part1 += h[k];
  }
  part2 = h[PART2];
  part3 = h[PART3];
  if (!wrong) printf("part 3 (a free on the legacy stream after R, then A's): corruptions=%llu\n", part3);
  printf("%spart 2 (non-blocking stream made after the reuse): corruptions=%llu\n", wrong ? "# " : "", part2);
  printf("new non-blocking streams not idle: %d\n", busy_new_streams);
  printf("B holds what W wrote: mismatches=%llu\n", hb);
  printf("# same-address reuse: B == A in %d of %d iterations, %d of them in part 3\n", same + same3, iters, same3);
  printf("# corruptions %llu\n", part1 + part2 + part3);
  CHECK(hb == 0);
  CHECK(busy_new_streams == 0);
  if (wrong) {
    printf("no-stream-wait emulation detected corruption: %s\n", part2 > 0 ? "yes" : "NO");
    CHECK(part2 > 0); /* the test must have teeth */
  } else {
    CHECK(part1 == 0 && part2 == 0 && part3 == 0);
    const char *cache = getenv("SOMA_LEGACY_CACHE");
    if (under_shim() && !(cache && strcmp(cache, "off") == 0)) CHECK(same3 > 0);
  }

  CHECK_CUDA(cudaStreamDestroy(s[BLOCKING]));
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaFree(badB));
  print_pooled();
  return report();
}
