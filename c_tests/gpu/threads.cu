/* Contract 8: many threads allocating and freeing at once lose nothing.
 * 16 host threads x 2000 iterations: cudaMalloc (256 B .. 4 MiB, log-uniform,
 * sizes from a per-thread seeded generator, so the totals are the same in
 * every run), a kernel writes a per-(thread, iteration) pattern, a second
 * kernel on the same stream counts mismatches into the thread's device
 * counter after a ~50 us delay (the window in which a block handed out too
 * early gets overwritten by its next owner), cudaFree right after the
 * launches (no host wait). Every 50th iteration the
 * host also copies the start of the block back and checks it. Streams: the
 * legacy stream, the per-thread default stream, or the thread's own
 * non-blocking stream (thread number mod 3); with --legacy-only, the legacy
 * stream for all (no non-blocking stream: the shim frees on the legacy
 * stream, and a freed address may go to another thread at once). A host-side
 * table of the live block of each thread catches two threads being handed
 * overlapping blocks. */
#include "gpu_common.h"

enum { NTHREADS = 16 };
static int iters, legacy_only;
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t live_lo[NTHREADS], live_hi[NTHREADS];

struct res {
  int tid;
  unsigned long long allocs, bytes, dev_bad, host_bad, overlaps, failures;
};

static unsigned long long rng_next(unsigned long long *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return *s >> 33;
}

static void *worker(void *arg) {
  struct res *r = (struct res *)arg;
  int tid = r->tid;
  cudaStream_t st = 0;
  if (tid % 3 == 1 && !legacy_only) st = cudaStreamPerThread;
  if (tid % 3 == 2 && !legacy_only) CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  unsigned long long *dbad = NULL;
  CHECK_CUDA(TMALLOC(&dbad, sizeof *dbad));
  CHECK_CUDA(cudaMemsetAsync(dbad, 0, sizeof *dbad, st));
  unsigned hostbuf[64];
  unsigned long long seed = 0x1234567ULL + (unsigned long long)tid * 7919ULL;
  for (int i = 0; i < iters; i++) {
    unsigned shift = 8 + (unsigned)(rng_next(&seed) % 15); /* 2^8 .. 2^22 */
    size_t bytes = ((size_t)1 << shift) + (size_t)(rng_next(&seed) % ((size_t)1 << shift));
    if (bytes > 4 * MiB) bytes = 4 * MiB;
    bytes &= ~(size_t)3;
    size_t n = bytes / 4;
    void *d = NULL;
    cudaError_t rc = TMALLOC(&d, bytes);
    if (rc != cudaSuccess || !d) {
      fprintf(stderr, "thread %d iteration %d: cudaMalloc(%zu) rc=%d\n", tid, i, bytes, (int)rc);
      r->failures++;
      continue;
    }
    uintptr_t lo = (uintptr_t)d, hi = lo + bytes;
    pthread_mutex_lock(&live_mu);
    for (int t = 0; t < NTHREADS; t++)
      if (t != tid && live_lo[t] < hi && lo < live_hi[t]) r->overlaps++;
    live_lo[tid] = lo;
    live_hi[tid] = hi;
    pthread_mutex_unlock(&live_mu);

    unsigned pseed = (unsigned)(tid * 100000 + i);
    k_fill<<<grid_for(n, 512), 256, 0, st>>>((unsigned *)d, n, pseed);
    k_count_bad<<<grid_for(n, 512), 256, 0, st>>>((const unsigned *)d, n, pseed, dbad, 50000ULL);
    if (cudaGetLastError() != cudaSuccess) r->failures++;
    if (i % 50 == 0) {
      size_t m = n < 64 ? n : 64;
      if (cudaMemcpyAsync(hostbuf, d, m * 4, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
          cudaStreamSynchronize(st) != cudaSuccess)
        r->failures++;
      r->host_bad += count_bad_host(hostbuf, m, pseed);
    }
    pthread_mutex_lock(&live_mu);
    live_lo[tid] = live_hi[tid] = 0; /* before the free: the block may be reused at once */
    pthread_mutex_unlock(&live_mu);
    if (cudaFree(d) != cudaSuccess) r->failures++;
    r->allocs++;
    r->bytes += bytes;
  }
  CHECK_CUDA(cudaStreamSynchronize(st));
  unsigned long long h = ~0ULL;
  CHECK_CUDA(cudaMemcpy(&h, dbad, sizeof h, cudaMemcpyDeviceToHost));
  r->dev_bad = h;
  CHECK_CUDA(cudaFree(dbad));
  if (tid % 3 == 2 && !legacy_only) CHECK_CUDA(cudaStreamDestroy(st));
  return NULL;
}

int main(int argc, char **argv) {
  iters = gpu_quick() ? 60 : 2000;
  legacy_only = argc > 1 && strcmp(argv[1], "--legacy-only") == 0;
  CHECK_CUDA(cudaFree(0));
  pthread_t th[NTHREADS];
  struct res r[NTHREADS];
  memset(r, 0, sizeof r);
  for (int t = 0; t < NTHREADS; t++) {
    r[t].tid = t;
    pthread_create(&th[t], NULL, worker, &r[t]);
  }
  struct res tot;
  memset(&tot, 0, sizeof tot);
  for (int t = 0; t < NTHREADS; t++) {
    pthread_join(th[t], NULL);
    tot.allocs += r[t].allocs;
    tot.bytes += r[t].bytes;
    tot.dev_bad += r[t].dev_bad;
    tot.host_bad += r[t].host_bad;
    tot.overlaps += r[t].overlaps;
    tot.failures += r[t].failures;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  printf("threads=%d iterations=%d allocations=%llu bytes=%llu\n", NTHREADS, iters, tot.allocs, tot.bytes);
  printf("device_mismatches=%llu host_mismatches=%llu overlapping_live_blocks=%llu failed_calls=%llu\n",
         tot.dev_bad, tot.host_bad, tot.overlaps, tot.failures);
  CHECK(tot.allocs == (unsigned long long)NTHREADS * iters);
  CHECK(tot.dev_bad == 0 && tot.host_bad == 0 && tot.overlaps == 0 && tot.failures == 0);
  print_pooled();
  return report();
}
