/* What a program frees reaches another process, as natively. This program
 * (the holder) allocates 60% of the device in 64 blocks, frees them all,
 * synchronizes and idles; then
 *   1. a native process (the shim not preloaded) asks for 60% every 20 ms
 *      until it gets it (10 s at most): natively at once; under the shim once
 *      the decay's delay has passed (the suite runs it with SOMA_DECAY_MS=3000
 *      and SOMA_IDLE_MS=0), or, in the row neighbours@idle, once the holder
 *      has idled for SOMA_IDLE_MS (50 ms; its decay then 600 s);
 *   2. the holder fills and frees again, and a process run as this one is
 *      (under the shim in the shim run) asks once, well before the decay's
 *      3 s have passed: it gets it at once (under the shim, only because the
 *      holder gives back what its pool holds when asked).
 * Each taker touches what it got with a kernel. Printed: whether each got
 * it; "# " lines: how long it took. */
#include "gpu_common.h"
#include "../child.h"
#include "../clock_ms.h"

#define PIECES 64
#define SHARE 0.6

static size_t share_of_device(void) {
  size_t free_now = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_now, &total));
  return (size_t)(total * SHARE) / PIECES / (2 * MiB) * (2 * MiB) * PIECES;
}

/* Allocates SHARE of the device in PIECES blocks, touches and frees them, and synchronizes. */
static void fill_and_free(void) {
  size_t piece = share_of_device() / PIECES;
  void *blocks[PIECES];
  for (int i = 0; i < PIECES; i++) {
    CHECK_CUDA(TMALLOC(&blocks[i], piece));
    k_set<<<1, 1>>>((unsigned *)blocks[i], 1, 1);
  }
  for (int i = 0; i < PIECES; i++) CHECK_CUDA(cudaFree(blocks[i]));
  CHECK_CUDA(cudaDeviceSynchronize());
}

struct taken {
  int first_rc, rc;
  double first_ms, ms; /* the first attempt; from the start to success (-1: never) */
};

/* Asks for SHARE of the device in one block, again every 20 ms for
 * `poll_ms`, until it gets it; touches it; reports on stdout. */
static int taker(const char *poll_ms) {
  CHECK_CUDA(cudaFree(NULL));
  size_t bytes = share_of_device();
  struct taken t = {0, 0, 0, -1};
  void *p = NULL;
  double start = now_ms();
  t.first_rc = t.rc = cudaMalloc(&p, bytes);
  t.first_ms = now_ms() - start;
  while (t.rc != cudaSuccess && now_ms() - start < atof(poll_ms)) {
    cudaGetLastError();
    usleep(20000);
    t.rc = cudaMalloc(&p, bytes);
  }
  if (t.rc == cudaSuccess) {
    t.ms = now_ms() - start;
    k_set<<<1, 1>>>((unsigned *)p, 1, 1);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFree(p));
  }
  cudaGetLastError();
  write_all(1, &t, sizeof t);
  return check_failures ? 1 : 0;
}

/* Runs a taker (`native`: without the shim) and returns what it saw. */
static struct taken take(int native, const char *poll_ms) {
  char *preload = getenv("LD_PRELOAD") ? strdup(getenv("LD_PRELOAD")) : NULL;
  if (native) unsetenv("LD_PRELOAD");
  struct child c = start_child("neighbours", "taker", poll_ms);
  if (preload) setenv("LD_PRELOAD", preload, 1);
  free(preload);
  struct taken t = {-1, -1, 0, -1};
  read_all(c.from, &t, sizeof t);
  CHECK(finish_child(c) == 0);
  printf("# %s taker: first attempt rc %d in %.1f ms; got it after %.1f ms\n", native ? "native" : "this program's",
         t.first_rc, t.first_ms, t.ms);
  return t;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "taker") == 0) return taker(argv[2]);
  CHECK_CUDA(cudaFree(NULL));
  fill_and_free();
  struct taken native = take(1, "10000");
  printf("a native process got 60%% of the device: %s\n", native.rc == cudaSuccess ? "yes" : "no");
  fill_and_free();
  struct taken same = take(0, "0");
  printf("a process run as this one got it at its first attempt: %s\n", same.first_rc == cudaSuccess ? "yes" : "no");
  print_pooled();
  return report();
}
