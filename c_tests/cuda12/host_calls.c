/* The CUDA 12 runtime (shared and static) under the shim, with no kernels and
 * no CUDA 12 compiler: the runtime functions used are declared here (their
 * C ABI is stable), the program is built with gcc against libcudart.so.12 or
 * libcudart_static.a from the nvidia-cuda-runtime-cu12 wheel. Each result is
 * printed; scripts/cuda12_test.sh compares the native and the shim run. The
 * pooling proof asks the driver itself (driver_past_shim.h) whether the
 * pointers came from a pool. */
#define _GNU_SOURCE /* dl_iterate_phdr, for driver_past_shim.h */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../check.h"
#include "../driver_past_shim.h"

typedef void *stream_t;
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaMemset(void *p, int v, size_t n);
int cudaMemsetAsync(void *p, int v, size_t n, stream_t s);
int cudaMemcpy(void *dst, const void *src, size_t n, int kind);
int cudaStreamCreateWithFlags(stream_t *s, unsigned flags);
int cudaStreamDestroy(stream_t s);
int cudaDeviceSynchronize(void);
int cudaGetLastError(void);
int cudaDeviceReset(void);
int cudaRuntimeGetVersion(int *v);
const char *cudaGetErrorString(int e);
#define cudaSuccess 0
#define cudaMemcpyDeviceToHost 2

static int pooled, allocs;

static void note(void *p) {
  allocs++;
  pooled += driver_says_pooled((uint64_t)(uintptr_t)p);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  int version = 0;
  cudaRuntimeGetVersion(&version);
  printf("# runtime %d\n", version);
  CHECK(version >= 12000 && version < 13000);

  printf("cudaFree(NULL) rc=%d\n", cudaFree(NULL));
  void *p = (void *)1;
  int rc = cudaMalloc(&p, 0);
  printf("cudaMalloc(&p, 0) rc=%d p=%s last=%d\n", rc, p ? "non-NULL" : "NULL", cudaGetLastError());
  rc = cudaMalloc(NULL, 16);
  printf("cudaMalloc(NULL, 16) rc=%d last=%d last=%d\n", rc, cudaGetLastError(), cudaGetLastError());
  rc = cudaMalloc(&p, (size_t)1 << 50);
  printf("cudaMalloc(huge) rc=%d last=%d last=%d\n", rc, cudaGetLastError(), cudaGetLastError());

  /* A block freed while a memset on a non-blocking stream still writes it,
   * then reallocated and written from another stream: the reader must see
   * only the new value. */
  stream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, 1) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&s2, 1) == cudaSuccess);
  const size_t n = 64 << 20;
  unsigned char *host = malloc(n);
  size_t bad = 0;
  for (int i = 0; i < 50; i++) {
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, n) == cudaSuccess);
    note(a);
    for (int k = 0; k < 8; k++) CHECK(cudaMemsetAsync(a, 0x11, n, s1) == cudaSuccess);
    CHECK(cudaFree(a) == cudaSuccess);
    CHECK(cudaMalloc(&b, n) == cudaSuccess);
    note(b);
    CHECK(cudaMemsetAsync(b, 0xab, n, s2) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cudaMemcpy(host, b, n, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (size_t j = 0; j < n; j++) bad += host[j] != 0xab;
    CHECK(cudaFree(b) == cudaSuccess);
  }
  printf("reuse after a free behind pending work: wrong bytes=%zu\n", bad);
  CHECK(bad == 0);
  CHECK(cudaStreamDestroy(s1) == cudaSuccess);
  CHECK(cudaStreamDestroy(s2) == cudaSuccess);

  void *q = NULL;
  CHECK(cudaMalloc(&q, 4096) == cudaSuccess);
  note(q);
  printf("cudaFree(interior) rc=%d last=%d\n", cudaFree((char *)q + 256), cudaGetLastError());
  printf("cudaFree(host) rc=%d last=%d\n", cudaFree(host), cudaGetLastError());
  printf("cudaFree(block) rc=%d\n", cudaFree(q));
  printf("cudaFree(block) again rc=%d last=%d last=%d\n", cudaFree(q), cudaGetLastError(), cudaGetLastError());

  void *live = NULL;
  CHECK(cudaMalloc(&live, 1 << 20) == cudaSuccess);
  note(live);
  printf("cudaDeviceReset rc=%d\n", cudaDeviceReset());
  printf("cudaFree(ptr from before the reset) rc=%d last=%d\n", cudaFree(live), cudaGetLastError());
  void *after = NULL;
  CHECK(cudaMalloc(&after, 1 << 20) == cudaSuccess);
  note(after);
  CHECK(cudaMemset(after, 0, 1 << 20) == cudaSuccess);
  printf("cudaFree(new block) rc=%d\n", cudaFree(after));
  free(host);
  printf("# pooled %d of %d\n", pooled, allocs);
  return report();
}
