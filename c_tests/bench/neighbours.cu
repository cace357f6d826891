/* Two processes on one GPU (scripts/bench_neighbours.sh runs it natively and
 * under the shim). A turn: allocate SHARE of the device in 64 blocks, fill
 * them (cudaMemset), free them all, synchronize.
 *
 *   neighbours second [SECOND_PRELOAD]  a first process takes a turn and
 *       idles; a second one (under the shim if SECOND_PRELOAD is set, else
 *       native) asks for SHARE in one block, again every 5 ms until it gets
 *       it. Prints "second_ms <ms> first_call_ms <ms>": from its first
 *       request to success, and how long that first request took.
 *   neighbours burst  one process, fresh: the time of its first 64
 *       allocations of SHARE / 64 (and a synchronization). Prints
 *       "burst_ms <ms> failed <failed allocations>".
 *   neighbours turns <rounds> <idle_ms>  two processes take turns, each
 *       idling <idle_ms> after its turn before telling the other to go.
 *       Prints "turns_ms <ms of all turns> oom <failed allocations>".
 *   neighbours pauses <rounds> <pause_ms>  one process alone: each round
 *       allocates 1 GiB in 256 blocks of 4 MiB (pool sizes under the shim),
 *       fills, frees, synchronizes, then pauses <pause_ms> with its GPU
 *       idle (a step waiting for its data). Prints "pauses_ms <median ms of
 *       a round, the pause left out>": what the shim's idle give-back costs
 *       a program that pauses.
 *   neighbours handover  how soon memory another process freed can be
 *       allocated again (run natively: a fact of the driver): a player takes
 *       a turn, then this process waits 0 to 800 ms and asks for SHARE in one
 *       block. Prints "handover delay_ms <ms> alloc_ms <ms>" per try.
 *
 * Processes run as this one is (LD_PRELOAD inherited), the second of
 * "second" as SECOND_PRELOAD says. NEIGHBOURS_VERBOSE=1: each turn's
 * timings on stderr. */
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

#define PIECES 64
#define SHARE 0.6

static size_t share_of_device(void) {
  size_t free_now = 0, total = 0;
  cudaMemGetInfo(&free_now, &total);
  return (size_t)(total * SHARE) / PIECES / (2u << 20) * (2u << 20) * PIECES;
}

/* One turn; returns the allocations that failed. With NEIGHBOURS_VERBOSE
 * set, prints where its time went on stderr: the allocations (and the
 * slowest), the frees, the final synchronization. */
static int turn(void) {
  size_t piece = share_of_device() / PIECES;
  void *blocks[PIECES] = {0};
  int failed = 0;
  double start = now_ms(), alloc_ms = 0, slowest = 0;
  for (int i = 0; i < PIECES; i++) {
    double t = now_ms();
    cudaError_t rc = cudaMalloc(&blocks[i], piece);
    t = now_ms() - t;
    alloc_ms += t;
    if (t > slowest) slowest = t;
    if (rc != cudaSuccess) {
      cudaGetLastError();
      blocks[i] = NULL;
      failed++;
      continue;
    }
    cudaMemset(blocks[i], i, piece);
  }
  double frees = now_ms();
  for (int i = 0; i < PIECES; i++)
    if (blocks[i]) cudaFree(blocks[i]);
  double sync = now_ms();
  cudaDeviceSynchronize();
  if (getenv("NEIGHBOURS_VERBOSE"))
    fprintf(stderr, "turn pid %d ms %.1f alloc_ms %.1f slowest_alloc_ms %.1f free_ms %.1f sync_ms %.1f failed %d\n",
            (int)getpid(), now_ms() - start, alloc_ms, slowest, sync - frees, now_ms() - sync, failed);
  return failed;
}

/* A player: takes a turn at each request, answers with the failed
 * allocations, until stdin closes. */
static int player(void) {
  cudaFree(NULL);
  for (int v; (v = get_int(0)) >= 0;) {
    if (v == 1) put_int(1, turn());
    else put_int(1, 0); /* ready */
  }
  return 0;
}

/* Asks for SHARE in one block until it gets it; answers two doubles. */
static int asker(void) {
  cudaFree(NULL);
  get_int(0);
  size_t bytes = share_of_device();
  void *p = NULL;
  double start = now_ms();
  cudaError_t rc = cudaMalloc(&p, bytes);
  double first = now_ms() - start;
  while (rc != cudaSuccess && now_ms() - start < 20000) {
    cudaGetLastError();
    usleep(5000);
    rc = cudaMalloc(&p, bytes);
  }
  double got = rc == cudaSuccess ? now_ms() - start : -1;
  if (rc == cudaSuccess) cudaFree(p);
  double out[2] = {got, first};
  if (write(1, out, sizeof out) != sizeof out) return 1;
  return 0;
}

/* The first PIECES allocations of a fresh process, timed. */
static int burst(void) {
  cudaFree(NULL);
  size_t piece = share_of_device() / PIECES;
  void *blocks[PIECES] = {0};
  int failed = 0;
  cudaDeviceSynchronize();
  double start = now_ms();
  for (int i = 0; i < PIECES; i++)
    if (cudaMalloc(&blocks[i], piece) != cudaSuccess) {
      cudaGetLastError();
      blocks[i] = NULL;
      failed++;
    }
  cudaDeviceSynchronize();
  double took = now_ms() - start;
  for (int i = 0; i < PIECES; i++)
    if (blocks[i]) cudaFree(blocks[i]);
  printf("burst_ms %.1f failed %d\n", took, failed);
  return failed != 0;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Rounds of 1 GiB in 4 MiB blocks with a pause between. */
static int pauses(int rounds, int pause_ms) {
  enum { BLOCKS = 256, MAX_ROUNDS = 1000 };
  const size_t piece = 4u << 20;
  static void *blocks[BLOCKS];
  static double took[MAX_ROUNDS];
  if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
  int failed = 0;
  cudaFree(NULL);
  for (int r = 0; r < rounds; r++) {
    double start = now_ms();
    for (int i = 0; i < BLOCKS; i++) {
      if (cudaMalloc(&blocks[i], piece) != cudaSuccess) {
        cudaGetLastError();
        blocks[i] = NULL;
        failed++;
        continue;
      }
      cudaMemset(blocks[i], i, piece);
    }
    for (int i = 0; i < BLOCKS; i++)
      if (blocks[i]) cudaFree(blocks[i]);
    cudaDeviceSynchronize();
    took[r] = now_ms() - start;
    usleep(pause_ms * 1000);
  }
  qsort(took, rounds, sizeof took[0], by_value);
  printf("pauses_ms %.2f failed %d\n", took[rounds / 2], failed);
  return failed != 0;
}

/* The time of one allocation of SHARE, `delay_ms` after a player freed as much. */
static int handover(void) {
  struct child giver = start_child("neighbours", "player", NULL);
  cudaFree(NULL);
  size_t bytes = share_of_device();
  const int delays[] = {0, 25, 50, 100, 200, 400, 800};
  int failed = 0;
  for (unsigned d = 0; d < sizeof delays / sizeof delays[0]; d++)
    for (int rep = 0; rep < 3; rep++) {
      put_int(giver.to, 1);
      failed += get_int(giver.from) != 0;
      usleep(delays[d] * 1000);
      void *p = NULL;
      double start = now_ms();
      cudaError_t rc = cudaMalloc(&p, bytes);
      double took = now_ms() - start;
      if (rc != cudaSuccess) {
        cudaGetLastError();
        failed++;
        continue;
      }
      double freeing = now_ms();
      cudaFree(p);
      printf("handover delay_ms %d alloc_ms %.1f free_ms %.1f\n", delays[d], took, now_ms() - freeing);
      fflush(stdout);
    }
  return finish_child(giver) | (failed != 0);
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "player") == 0) return player();
  if (argc == 2 && strcmp(argv[1], "asker") == 0) return asker();
  if (argc == 2 && strcmp(argv[1], "burst") == 0) return burst();
  if (argc == 4 && strcmp(argv[1], "pauses") == 0 && atoi(argv[2]) > 0)
    return pauses(atoi(argv[2]), atoi(argv[3]));
  if (argc == 2 && strcmp(argv[1], "handover") == 0) return handover();
  if (argc >= 2 && strcmp(argv[1], "second") == 0) {
    struct child first = start_child("neighbours", "player", NULL);
    put_int(first.to, 1);
    int failed = get_int(first.from);
    char *preload = getenv("LD_PRELOAD") ? strdup(getenv("LD_PRELOAD")) : NULL;
    const char *second_preload = getenv("SECOND_PRELOAD");
    if (second_preload && *second_preload) setenv("LD_PRELOAD", second_preload, 1);
    else unsetenv("LD_PRELOAD");
    struct child second = start_child("neighbours", "asker", NULL);
    if (preload) setenv("LD_PRELOAD", preload, 1);
    put_int(second.to, 1);
    double out[2] = {-1, -1};
    if (read(second.from, out, sizeof out) != sizeof out) out[0] = -1;
    printf("second_ms %.1f first_call_ms %.1f first_failed %d\n", out[0], out[1], failed);
    return finish_child(second) | finish_child(first);
  }
  if (argc == 4 && strcmp(argv[1], "turns") == 0) {
    int rounds = atoi(argv[2]), idle_ms = atoi(argv[3]), oom = 0;
    struct child players[2] = {start_child("neighbours", "player", NULL), start_child("neighbours", "player", NULL)};
    for (int p = 0; p < 2; p++) {
      put_int(players[p].to, 0);
      get_int(players[p].from);
    }
    double busy = 0;
    for (int r = 0; r < rounds; r++) {
      double start = now_ms();
      put_int(players[r % 2].to, 1);
      oom += get_int(players[r % 2].from);
      busy += now_ms() - start;
      usleep(idle_ms * 1000);
    }
    printf("turns_ms %.1f oom %d\n", busy, oom);
    return finish_child(players[0]) | finish_child(players[1]);
  }
  fprintf(stderr, "usage: neighbours second | neighbours burst | neighbours turns ROUNDS IDLE_MS | neighbours pauses ROUNDS PAUSE_MS | neighbours handover\n");
  return 2;
}
