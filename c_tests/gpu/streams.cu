/* Contract 1: memory from cudaMalloc is usable at once from every stream: the
 * legacy default stream, a blocking stream, a non-blocking stream, the
 * per-thread default stream, and from another host thread. Each iteration
 * allocates, immediately writes a pattern with a kernel on that stream,
 * copies it back and verifies it, then frees (so blocks are reused).
 *
 * Meanwhile a background writer keeps a non-blocking stream busy: it gets a
 * fresh cudaMalloc'd 1 MiB block X, writes a constant into X for ~1 ms, and
 * X is given to cudaFree right after the launch. If the shim handed X out
 * again while the writer still runs, the new owner's pattern gets
 * overwritten and the verification fails (contract 2 from the other side). */
#include "gpu_common.h"

enum { LEGACY, BLOCKING, NONBLOCKING, PER_THREAD, OTHER_THREAD, NKINDS };
static const char *kind_name[NKINDS] = {"legacy", "blocking", "nonblocking", "per-thread-default",
                                        "other-host-thread"};
static const size_t sizes[] = {256, 4 * KiB, 1 * MiB, 3 * MiB + 4, 64 * KiB};
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define MAXBYTES (4 * MiB)

struct job {
  void *d;
  size_t bytes;
  unsigned seed;
  unsigned *host;
  size_t bad;
};

/* Another host thread uses memory the main thread has just allocated. */
static void *other_thread(void *arg) {
  struct job *j = (struct job *)arg;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  j->bad = fill_and_verify(j->d, j->bytes, j->seed, s, j->host);
  CHECK_CUDA(cudaStreamDestroy(s));
  return NULL;
}

int main(void) {
  int per_kind = gpu_quick() ? 8 : 120;
  CHECK_CUDA(cudaFree(0));
  cudaStream_t s[NKINDS], bg;
  s[LEGACY] = 0;
  CHECK_CUDA(cudaStreamCreate(&s[BLOCKING]));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s[NONBLOCKING], cudaStreamNonBlocking));
  s[PER_THREAD] = cudaStreamPerThread;
  s[OTHER_THREAD] = 0; /* unused: the thread makes its own */
  CHECK_CUDA(cudaStreamCreateWithFlags(&bg, cudaStreamNonBlocking));
  unsigned *host = NULL;
  CHECK_CUDA(cudaMallocHost(&host, MAXBYTES));

  size_t bad[NKINDS] = {0};
  int ok_allocs[NKINDS] = {0}, bg_launches = 0;
  for (int i = 0; i < per_kind * NKINDS; i++) {
    /* Background writer: relaunched whenever the previous one has finished
     * (natively every time, since cudaFree waits for it). */
    cudaError_t q = cudaStreamQuery(bg);
    (void)cudaGetLastError();
    if (q == cudaSuccess) {
      unsigned *x = NULL;
      CHECK_CUDA(TMALLOC(&x, 1 * MiB));
      k_write_until<<<8, 256, 0, bg>>>(x, MiB / 4, 0xdeadbeefu, 1000000ULL);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaFree(x));
      bg_launches++;
    }
    int k = i % NKINDS;
    size_t bytes = sizes[(i / NKINDS) % NSIZES];
    unsigned seed = 1000u + (unsigned)i;
    void *d = NULL;
    cudaError_t r = TMALLOC(&d, bytes);
    CHECK_CUDA(r);
    if (r != cudaSuccess) continue;
    size_t b;
    if (k == OTHER_THREAD) {
      struct job j = {d, bytes, seed, host, 0};
      pthread_t t;
      pthread_create(&t, NULL, other_thread, &j);
      pthread_join(t, NULL);
      b = j.bad;
    } else {
      b = fill_and_verify(d, bytes, seed, s[k], host);
    }
    if (b != 0) fprintf(stderr, "kind %s iteration %d size %zu: %zu bad words\n", kind_name[k], i, bytes, b);
    bad[k] += b;
    ok_allocs[k] += b == 0;
    CHECK(b == 0);
    CHECK_CUDA(cudaFree(d));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int k = 0; k < NKINDS; k++)
    printf("stream=%s allocations=%d verified=%d bad_words=%zu\n", kind_name[k], per_kind, ok_allocs[k], bad[k]);
  printf("# background writer launches: %d\n", bg_launches);

  CHECK_CUDA(cudaStreamDestroy(s[BLOCKING]));
  CHECK_CUDA(cudaStreamDestroy(s[NONBLOCKING]));
  CHECK_CUDA(cudaStreamDestroy(bg));
  CHECK_CUDA(cudaFreeHost(host));
  print_pooled();
  return report();
}
