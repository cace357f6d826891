/* Memory a program holds, how fast its first large allocations come, and how
 * soon a neighbour gets what it freed (scripts/bench_held.sh runs it natively,
 * under the shim, and under the shim with SOMA_LARGE_BLOCKS=0). Every CUDA call
 * is checked: one that fails exits with status 1; an allocation that fails or a
 * word read back wrong is counted in "failed" and makes the exit status 1.
 *
 *   held held PATTERN [N]  one process, large blocks: each allocated, filled
 *       (cudaMemset), one word of it read back to the host and checked, freed.
 *       Device memory in use (cudaMemGetInfo's total - free) is read after
 *       every allocation and every free. Prints "held_peak_mib <MiB> ms <ms>
 *       after_mib <MiB> failed <n>": the peak in use beyond the value read at
 *       start (after cudaFree(NULL)), the wall time of the loop, and what is
 *       still in use beyond the start SOMA_DECAY_MS (1000 unless set) + 250 ms
 *       after the last free (the program sleeps, then reads). Patterns, with N
 *       and its default:
 *     steady [200]    N blocks of 1 GiB, one after another
 *     varied16 [120]  N blocks of 16 sizes, 512 to 1472 MiB 64 MiB apart: each
 *                     cycle takes all 16 in an order a fixed-seed LCG shuffles
 *     varied64 [2000] the same with 64 sizes, 512 to 1520 MiB 16 MiB apart
 *     growing [4]     a buffer that grows like a vector or a KV cache, N passes
 *                     from 128 MiB to 3 GiB by 64 MiB: each step allocates the
 *                     larger buffer, copies the old one into it (device to
 *                     device), fills the new 64 MiB, frees the old one, and
 *                     checks the last copied word
 *     mixed [60]      N iterations of one large block (64 MiB to 1 GiB, a
 *                     multiple of 2 MiB drawn by the LCG) and 64 small ones
 *                     (4 KiB to 2 MiB, multiples of 4 KiB), all filled, a word
 *                     of the large one and of one small one checked, all freed
 *   held burst <MiB> <count>  a fresh process's first <count> allocations of
 *       <MiB> each (fewer where they would pass 70% of the device), each filled
 *       by cudaMemset, then cudaDeviceSynchronize. Prints "burst_ms <ms> failed
 *       <n> blocks <count allocated>".
 *   held ask <blocks>  two more processes, both started and their contexts
 *       made first: one allocates 60% of the device in <blocks> blocks, fills
 *       them, frees them all and synchronizes; as soon as it says so, the other
 *       asks for 60% in <blocks> blocks, a failed allocation again every 1 ms
 *       for 5 s at most. Prints "ask_ms <ms from the second's first cudaMalloc
 *       to its last success, -1 if some never came> failed <n>".
 *
 * Processes run as this one does (LD_PRELOAD inherited); the second of "ask"
 * with SECOND_PRELOAD instead where that is set (empty: native). */
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../child.h"
#include "../clock_ms.h"
#include "../exit_on_error.h"

#define MIB ((size_t)1 << 20)
#define SHARE 0.6

static int failed = 0;

/* A fixed-seed linear congruential generator: the same sizes in every run. */
static unsigned long long lcg_state;
static void lcg_seed(unsigned long long seed) { lcg_state = seed; }
static unsigned lcg(void) {
  lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
  return (unsigned)(lcg_state >> 33);
}

/* ---- held: peak device memory in use */

static size_t start_used, peak_used;

static size_t used_now(void) {
  size_t free_now = 0, total = 0;
  CK(cudaMemGetInfo(&free_now, &total));
  return total - free_now;
}

static void probe(void) {
  size_t used = used_now();
  if (used > peak_used) peak_used = used;
}

/* `bytes` from cudaMalloc, then a probe; NULL (counted) if it failed. */
static void *alloc_block(size_t bytes) {
  void *p = NULL;
  cudaError_t rc = cudaMalloc(&p, bytes);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    fprintf(stderr, "held: cudaMalloc of %zu bytes: %s\n", bytes, cudaGetErrorString(rc));
    failed++;
    return NULL;
  }
  probe();
  return p;
}

static void free_block(void *p) {
  if (!p) return;
  CK(cudaFree(p));
  probe();
}

static unsigned char tag_of(int i) { return (unsigned char)(i % 251 + 1); }

static void fill(void *p, size_t bytes, unsigned char tag) {
  if (p) CK(cudaMemset(p, tag, bytes));
}

/* The word at `offset` (a multiple of 4) must be `tag` in each byte. */
static void check_word(const void *p, size_t offset, unsigned char tag) {
  if (!p) return;
  unsigned word = 0;
  CK(cudaMemcpy(&word, (const char *)p + offset, sizeof word, cudaMemcpyDeviceToHost));
  if (word != tag * 0x01010101u) {
    fprintf(stderr, "held: word at %p + %zu is 0x%08x, not 0x%08x\n", p, offset, word, tag * 0x01010101u);
    failed++;
  }
}

/* A word of a block of `bytes`, drawn by the LCG. */
static size_t some_word(size_t bytes) { return (size_t)lcg() % (bytes / 4) * 4; }

static void one_block(size_t bytes, unsigned char tag) {
  void *p = alloc_block(bytes);
  fill(p, bytes, tag);
  check_word(p, some_word(bytes), tag);
  free_block(p);
}

/* The index of the next of `n` sizes: each cycle through all n in an order
 * the LCG shuffles. */
static int next_size(int n, int *order, int *pos) {
  if (*pos % n == 0) {
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
      int j = (int)(lcg() % (unsigned)(i + 1)), t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
  }
  return order[(*pos)++ % n];
}

/* `blocks` blocks of `sizes` sizes: first, first + step, ... */
static void varied(int blocks, int sizes, size_t first, size_t step) {
  int order[64], pos = 0;
  for (int i = 0; i < blocks; i++) one_block(first + step * (size_t)next_size(sizes, order, &pos), tag_of(i));
}

static void growing(int passes) {
  const size_t first = 128 * MIB, step = 64 * MIB, last = 3072 * MIB;
  for (int pass = 0; pass < passes; pass++) {
    size_t size = first;
    unsigned char tag = tag_of(0);
    void *buf = alloc_block(size);
    if (!buf) continue;
    fill(buf, size, tag);
    for (int k = 1; size < last; k++) {
      void *grown = alloc_block(size + step);
      if (!grown) break;
      CK(cudaMemcpy(grown, buf, size, cudaMemcpyDeviceToDevice));
      fill((char *)grown + size, step, tag_of(k));
      free_block(buf);
      /* The old buffer's last word, copied before its free. */
      check_word(grown, size - 4, tag);
      buf = grown;
      size += step;
      tag = tag_of(k);
    }
    free_block(buf);
  }
}

static void mixed(int iterations) {
  enum { SMALL = 64 };
  void *small[SMALL];
  size_t small_bytes[SMALL];
  for (int it = 0; it < iterations; it++) {
    unsigned char tag = tag_of(it);
    size_t large = 64 * MIB + (size_t)(lcg() % 481) * 2 * MIB; /* 64 MiB to 1 GiB */
    void *big = alloc_block(large);
    fill(big, large, tag);
    for (int s = 0; s < SMALL; s++) {
      small_bytes[s] = (size_t)(lcg() % 512 + 1) * 4096; /* 4 KiB to 2 MiB */
      small[s] = alloc_block(small_bytes[s]);
      fill(small[s], small_bytes[s], tag);
    }
    check_word(big, some_word(large), tag);
    check_word(small[it % SMALL], some_word(small_bytes[it % SMALL]), tag);
    free_block(big);
    for (int s = 0; s < SMALL; s++) free_block(small[s]);
  }
}

/* SOMA_DECAY_MS as the shim reads it (milliseconds), 1000 when unset. */
static long decay_ms(void) {
  const char *v = getenv("SOMA_DECAY_MS");
  if (!v || !*v) return 1000;
  char *end = NULL;
  long ms = strtol(v, &end, 10);
  return *end || ms < 0 ? 1000 : ms;
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, ms % 1000 * 1000000L};
  while (nanosleep(&t, &t) < 0 && errno == EINTR) {
  }
}

static int held(const char *pattern, int n) {
  const size_t GIB = 1024 * MIB;
  CK(cudaFree(NULL));
  CK(cudaDeviceSynchronize());
  start_used = peak_used = used_now();
  lcg_seed(48);
  double start = now_ms();
  if (strcmp(pattern, "steady") == 0) varied(n > 0 ? n : 200, 1, GIB, 0);
  else if (strcmp(pattern, "varied16") == 0) varied(n > 0 ? n : 120, 16, 512 * MIB, 64 * MIB);
  else if (strcmp(pattern, "varied64") == 0) varied(n > 0 ? n : 2000, 64, 512 * MIB, 16 * MIB);
  else if (strcmp(pattern, "growing") == 0) growing(n > 0 ? n : 4);
  else if (strcmp(pattern, "mixed") == 0) mixed(n > 0 ? n : 60);
  else {
    fprintf(stderr, "held: no pattern '%s' (steady, varied16, varied64, growing, mixed)\n", pattern);
    return 2;
  }
  CK(cudaDeviceSynchronize());
  double took = now_ms() - start;
  sleep_ms(decay_ms() + 250);
  double after = ((double)used_now() - (double)start_used) / MIB;
  printf("held_peak_mib %.0f ms %.1f after_mib %.0f failed %d\n", (double)(peak_used - start_used) / MIB, took, after,
         failed);
  return failed != 0;
}

/* ---- burst: a fresh process's first allocations */

static int burst(size_t mib, int count) {
  CK(cudaFree(NULL));
  size_t free_now = 0, total = 0;
  CK(cudaMemGetInfo(&free_now, &total));
  size_t fits = (size_t)(total * 0.7) / (mib * MIB);
  if ((size_t)count > fits) count = (int)fits;
  void **blocks = (void **)calloc(count > 0 ? count : 1, sizeof *blocks);
  if (!blocks) return 1;
  CK(cudaDeviceSynchronize());
  double start = now_ms();
  for (int i = 0; i < count; i++) {
    if (cudaMalloc(&blocks[i], mib * MIB) != cudaSuccess) {
      (void)cudaGetLastError();
      blocks[i] = NULL;
      failed++;
      continue;
    }
    CK(cudaMemset(blocks[i], tag_of(i), mib * MIB));
  }
  CK(cudaDeviceSynchronize());
  double took = now_ms() - start;
  lcg_seed(48);
  for (int i = 0; i < count; i++) {
    check_word(blocks[i], some_word(mib * MIB), tag_of(i));
    if (blocks[i]) CK(cudaFree(blocks[i]));
  }
  free(blocks);
  printf("burst_ms %.1f failed %d blocks %d\n", took, failed, count);
  return failed != 0 || count == 0;
}

/* ---- ask: two processes, the second asks for what the first freed */

/* SHARE of the device in `blocks` blocks, each a multiple of 2 MiB. */
static size_t piece_of_share(int blocks) {
  size_t free_now = 0, total = 0;
  CK(cudaMemGetInfo(&free_now, &total));
  return (size_t)(total * SHARE) / (size_t)blocks / (2 * MIB) * (2 * MIB);
}

/* Either process of `ask`: its context made, room for `blocks` pointers of
 * `piece` bytes each; says it is ready and waits for the go (NULL if none came). */
static void **ask_ready(int blocks, size_t *piece) {
  CK(cudaFree(NULL));
  *piece = piece_of_share(blocks);
  void **p = (void **)calloc(blocks, sizeof *p);
  put_int(1, 0);
  if (!p || get_int(0) != 1) {
    free(p);
    return NULL;
  }
  return p;
}

/* The first process: ready once its context exists; at 1, allocates SHARE,
 * fills, frees, synchronizes, answers its failed allocations; then idles
 * until stdin closes. */
static int ask_first(int blocks) {
  size_t piece;
  void **p = ask_ready(blocks, &piece);
  if (!p) return 1;
  for (int i = 0; i < blocks; i++) {
    if (cudaMalloc(&p[i], piece) != cudaSuccess) {
      (void)cudaGetLastError();
      p[i] = NULL;
      failed++;
      continue;
    }
    CK(cudaMemset(p[i], tag_of(i), piece));
  }
  for (int i = 0; i < blocks; i++)
    if (p[i]) CK(cudaFree(p[i]));
  CK(cudaDeviceSynchronize());
  put_int(1, failed);
  while (get_int(0) >= 0) {
  }
  free(p);
  return 0;
}

/* The second: ready once its context exists; at 1, asks for SHARE in
 * `blocks` blocks, each again every 1 ms until 5 s have passed; answers the
 * ms to its last success (-1 if some never came) and the blocks it lacks. */
static int ask_second(int blocks) {
  size_t piece;
  void **p = ask_ready(blocks, &piece);
  if (!p) return 1;
  double start = now_ms(), last = -1;
  int got = 0;
  for (int i = 0; i < blocks; i++) {
    cudaError_t rc;
    while ((rc = cudaMalloc(&p[i], piece)) != cudaSuccess) {
      (void)cudaGetLastError();
      p[i] = NULL;
      if (now_ms() - start >= 5000) break;
      usleep(1000);
    }
    if (rc != cudaSuccess) break;
    last = now_ms() - start;
    got++;
  }
  double out[2] = {got == blocks ? last : -1, (double)(blocks - got)};
  for (int i = 0; i < got; i++) CK(cudaMemset(p[i], tag_of(i), piece));
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < got; i++) CK(cudaFree(p[i]));
  free(p);
  if (write(1, out, sizeof out) != sizeof out) return 1;
  return 0;
}

static int ask(const char *blocks) {
  struct child first = start_child("held", "ask-first", blocks);
  char *preload = getenv("LD_PRELOAD") ? strdup(getenv("LD_PRELOAD")) : NULL;
  const char *second_preload = getenv("SECOND_PRELOAD");
  if (second_preload && *second_preload) setenv("LD_PRELOAD", second_preload, 1);
  else if (second_preload) unsetenv("LD_PRELOAD");
  struct child second = start_child("held", "ask-second", blocks);
  if (preload) setenv("LD_PRELOAD", preload, 1);
  int ready = get_int(first.from) == 0 && get_int(second.from) == 0;
  double out[2] = {-1, -1};
  int first_failed = -1;
  if (ready) {
    put_int(first.to, 1);
    first_failed = get_int(first.from);
    if (first_failed >= 0) {
      put_int(second.to, 1);
      if (read(second.from, out, sizeof out) != sizeof out) out[0] = out[1] = -1;
    }
  }
  int lacking = (int)out[1];
  int all_failed = (first_failed > 0 ? first_failed : 0) + (lacking > 0 ? lacking : 0);
  printf("ask_ms %.1f failed %d\n", out[0], all_failed);
  int rc = finish_child(second) | finish_child(first);
  return rc | !ready | (first_failed != 0) | (lacking != 0) | (out[0] < 0);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "ask-first") == 0 && atoi(argv[2]) > 0) return ask_first(atoi(argv[2]));
  if (argc == 3 && strcmp(argv[1], "ask-second") == 0 && atoi(argv[2]) > 0) return ask_second(atoi(argv[2]));
  if (argc == 3 && strcmp(argv[1], "ask") == 0 && atoi(argv[2]) > 0) return ask(argv[2]);
  if ((argc == 3 || argc == 4) && strcmp(argv[1], "held") == 0) return held(argv[2], argc == 4 ? atoi(argv[3]) : 0);
  if (argc == 4 && strcmp(argv[1], "burst") == 0 && atoi(argv[2]) > 0 && atoi(argv[3]) > 0)
    return burst((size_t)atoi(argv[2]), atoi(argv[3]));
  fprintf(stderr,
          "usage: held held steady|varied16|varied64|growing|mixed [N] | held burst MIB COUNT | held ask BLOCKS\n");
  return 2;
}
