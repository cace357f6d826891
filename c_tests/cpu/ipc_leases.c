/* Many leases over one connection (under the shim only, as ipc.c), with
 * descriptors limited to 1024 in both processes (soft limit, as by default).
 * IPC_LEASES_CASE picks one:
 *   many     an importer opens 5,000 handles of one exporter: every open
 *            succeeds, neither process's descriptors grow with the handles
 *            (/proc/self/fd before and after) and both can still open files;
 *            the blocks the exporter frees while open are held, and freed
 *            to its pool once the importer has closed them;
 *   killed   an importer holding 2,000 leases is killed: every block the
 *            exporter freed meanwhile is freed to its pool;
 *   threads  two threads of an importer open and close 1,400 handles (600
 *            each of their own, 200 both use) at once, five rounds, then
 *            keep them open: every open and close succeeds, every block is
 *            held while open (no lease lost) and freed once closed (none
 *            left over).
 * The figures are printed as "# " lines. */
#include "common.h"
#include "../child.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#define BLOCK ((size_t)4096)
/* Descriptors a process may gain for all its handles: the connection, the
 * pools' (the exporter's server keeps one per pool), slack for the runtime. */
#define FD_GROWTH_BOUND 8

static void say(int fd, char byte) { write_all(fd, &byte, 1); }

static char heard(int fd) {
  char byte = 0;
  return read(fd, &byte, 1) == 1 ? byte : 0;
}

/* A number sent as one line. */
static void tell(int fd, long value) {
  char line[32];
  int n = snprintf(line, sizeof line, "%ld\n", value);
  write_all(fd, line, (size_t)n);
}

static long told(int fd) {
  char line[32] = {0};
  size_t n = 0;
  while (n + 1 < sizeof line && read(fd, line + n, 1) == 1 && line[n] != '\n') n++;
  line[n] = 0;
  return n > 0 ? atol(line) : -1;
}

/* `role` of this program in a child, given a count. */
static struct child start_n(const char *role, int n) {
  char arg[16];
  snprintf(arg, sizeof arg, "%d", n);
  return start_child("ipc_leases", role, arg);
}

/* ---- the exporter's side ---- */

/* `n` pool blocks, exported: their handles. */
static void export_blocks(void **blocks, cudaIpcMemHandle_t *handles, int n) {
  for (int i = 0; i < n; i++) {
    CHECK_CUDA(cudaMalloc(&blocks[i], BLOCK));
    CHECK_CUDA(cudaIpcGetMemHandle(&handles[i], blocks[i]));
  }
}

/* How many of the blocks the double still has allocated. */
static int live_blocks(void **blocks, int n) {
  struct fakecuda_ptr_info info;
  int live = 0;
  for (int i = 0; i < n; i++) live += fakecuda_ptr_info(blocks[i], &info) && info.base == (uintptr_t)blocks[i];
  return live;
}

/* Frees every block: how many are held (still allocated in the double). */
static int free_all(void **blocks, int n) {
  for (int i = 0; i < n; i++) CHECK_CUDA(cudaFree(blocks[i]));
  CHECK_CUDA(cudaDeviceSynchronize());
  return live_blocks(blocks, n);
}

/* How many of the freed blocks are freed to the pool once their leases
 * ended (the next pool calls issue the frees the server queued). */
static int released(void **blocks, int n) {
  for (int attempt = 0; attempt < 300; attempt++) {
    void *next = NULL;
    CHECK_CUDA(cudaMalloc(&next, BLOCK));
    CHECK_CUDA(cudaFree(next));
    CHECK_CUDA(cudaDeviceSynchronize());
    if (live_blocks(blocks, n) == 0) break;
    usleep(10000);
  }
  return n - live_blocks(blocks, n);
}

/* Exports `n` blocks and sends their handles; then on 'c' reports its
 * descriptors (after the exports, now) and whether it can open a file, on
 * 'f' frees every block and reports how many are held, on 'r' reports how
 * many are freed to the pool. */
static int exporter(int n) {
  void **blocks = calloc((size_t)n, sizeof *blocks);
  cudaIpcMemHandle_t *handles = calloc((size_t)n, sizeof *handles);
  export_blocks(blocks, handles, n);
  int fds_before = fd_count();
  write_all(1, handles, (size_t)n * sizeof *handles);
  for (char command; (command = heard(0)) != 0;) {
    if (command == 'c') {
      tell(1, fds_before);
      tell(1, fd_count());
      tell(1, can_open_a_file());
    } else if (command == 'f') {
      tell(1, free_all(blocks, n));
    } else if (command == 'r') {
      tell(1, released(blocks, n));
    }
  }
  free(blocks);
  free(handles);
  return check_failures ? 1 : 0;
}

/* ---- the importer's side ---- */

/* Opens handles [from, to): how many opened, stopping at the first failure
 * (an open the shim cannot serve may wait long). */
static int open_handles(const cudaIpcMemHandle_t *handles, void **opened, int from, int to) {
  for (int i = from; i < to; i++) {
    if (cudaIpcOpenMemHandle(&opened[i], handles[i], cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      cudaGetLastError();
      return i - from;
    }
  }
  return to - from;
}

static int close_handles(void **opened, int from, int to) {
  int closed = 0;
  for (int i = from; i < to; i++) closed += cudaIpcCloseMemHandle(opened[i]) == cudaSuccess;
  return closed;
}

/* Opens the `n` handles it reads, says how many opened, then waits to be killed. */
static int holder(int n) {
  cudaIpcMemHandle_t *handles = calloc((size_t)n, sizeof *handles);
  void **opened = calloc((size_t)n, sizeof *opened);
  read_all(0, handles, (size_t)n * sizeof *handles);
  tell(1, open_handles(handles, opened, 0, n));
  while (heard(0) != 0) {
  }
  return 0;
}

static void yes(const char *what, int ok) {
  CHECK(ok);
  printf("%s: %s\n", what, ok ? "yes" : "no");
}

static void many(void) {
  enum { N = 5000 };
  CHECK_CUDA(cudaFree(0));
  int fds_before = fd_count();
  struct child exporter = start_n("exporter", N);
  static cudaIpcMemHandle_t handles[N];
  static void *opened[N];
  read_all(exporter.from, handles, sizeof handles);
  int fds_started = fd_count(); /* with the pipes to the exporter */
  int opens = open_handles(handles, opened, 0, N);
  int fds_open = fd_count(), importer_opens = can_open_a_file();
  say(exporter.to, 'c');
  long exporter_before = told(exporter.from), exporter_open = told(exporter.from), exporter_opens = told(exporter.from);
  say(exporter.to, 'f');
  long held = told(exporter.from);
  int closed = close_handles(opened, 0, opens);
  int fds_closed = fd_count();
  say(exporter.to, 'r');
  long freed = told(exporter.from);
  CHECK(finish_child(exporter) == 0);
  printf("# %d of %d opens succeeded under a limit of 1024 descriptors\n", opens, N);
  printf("# importer's descriptors: %d before, %d with the handles open, %d after the closes (the pipes: %d)\n", fds_started,
         fds_open, fds_closed, fds_started - fds_before);
  printf("# exporter's descriptors: %ld after its exports, %ld with the handles open\n", exporter_before, exporter_open);
  printf("# %ld of %d blocks held when freed while open, %ld freed to the pool once closed\n", held, N, freed);
  yes("all 5000 handles opened under a limit of 1024 descriptors", opens == N);
  yes("the importer's descriptors stay bounded", fds_open > 0 && fds_open - fds_started <= FD_GROWTH_BOUND && fds_closed <= fds_open);
  yes("the exporter's descriptors stay bounded", exporter_before > 0 && exporter_open > 0 && exporter_open - exporter_before <= FD_GROWTH_BOUND);
  yes("both can still open files", importer_opens && exporter_opens == 1);
  yes("the blocks freed while open are held", held == N);
  yes("all handles closed", closed == N);
  yes("every block freed to the pool once closed", freed == N);
}

static void killed(void) {
  enum { N = 2000 };
  static void *blocks[N];
  static cudaIpcMemHandle_t handles[N];
  export_blocks(blocks, handles, N);
  struct child importer = start_n("holder", N);
  write_all(importer.to, handles, sizeof handles);
  long opens = told(importer.from);
  int held = free_all(blocks, N);
  kill(importer.pid, SIGKILL);
  CHECK(finish_child(importer) == 128 + SIGKILL);
  int freed = released(blocks, N);
  printf("# the importer opened %ld of %d handles; %d blocks held when freed, %d freed once it was killed\n", opens, N, held,
         freed);
  yes("the importer opened all 2000 handles", opens == N);
  yes("the blocks freed while open are held", held == N);
  yes("every block freed once the importer was killed", freed == N);
}

enum { OWN = 600, SHARED = 200, ALL = 2 * OWN + SHARED, ROUNDS = 5 };

struct worker {
  int index;
  const cudaIpcMemHandle_t *handles;
  void *own[OWN], *shared[SHARED];
  int failures;
};

/* The worker's handles: its own, then the shared ones, in an order of its
 * own; 1 at the first failure (an open the shim cannot serve may wait long). */
static int open_all(struct worker *w) {
  for (int k = 0; k < OWN + SHARED; k++) {
    int i = w->index == 0 ? k : OWN + SHARED - 1 - k;
    void **out = i < OWN ? &w->own[i] : &w->shared[i - OWN];
    const cudaIpcMemHandle_t *h = i < OWN ? &w->handles[w->index * OWN + i] : &w->handles[2 * OWN + i - OWN];
    if (cudaIpcOpenMemHandle(out, *h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      cudaGetLastError();
      return 1;
    }
  }
  return 0;
}

static int close_all(struct worker *w) {
  int failed = 0;
  for (int i = 0; i < OWN; i++) failed += cudaIpcCloseMemHandle(w->own[i]) != cudaSuccess;
  for (int i = 0; i < SHARED; i++) failed += cudaIpcCloseMemHandle(w->shared[i]) != cudaSuccess;
  cudaGetLastError();
  return failed;
}

static void *rounds(void *arg) {
  struct worker *w = arg;
  for (int round = 0; round < ROUNDS && !w->failures; round++) {
    w->failures += open_all(w);
    w->failures += close_all(w);
  }
  if (!w->failures) w->failures += open_all(w);
  return NULL;
}

static void *closer(void *arg) {
  struct worker *w = arg;
  w->failures += close_all(w);
  return NULL;
}

/* Both workers at once. */
static void in_two_threads(void *(*work)(void *), struct worker *w) {
  pthread_t threads[2];
  for (int t = 0; t < 2; t++) CHECK(pthread_create(&threads[t], NULL, work, &w[t]) == 0);
  for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
}

static void threads(void) {
  CHECK_CUDA(cudaFree(0));
  struct child exporter = start_n("exporter", ALL);
  static cudaIpcMemHandle_t handles[ALL];
  read_all(exporter.from, handles, sizeof handles);
  int fds_started = fd_count();
  static struct worker w[2];
  for (int t = 0; t < 2; t++) w[t] = (struct worker){.index = t, .handles = handles};
  in_two_threads(rounds, w);
  int fds_open = fd_count(), open_failures = w[0].failures + w[1].failures;
  int same = 1; /* a second open of a handle gives the same address */
  for (int i = 0; i < SHARED; i++) same &= w[0].shared[i] == w[1].shared[i];
  say(exporter.to, 'f');
  long held = told(exporter.from);
  w[0].failures = w[1].failures = 0;
  in_two_threads(closer, w);
  int close_failures = w[0].failures + w[1].failures;
  say(exporter.to, 'r');
  long freed = told(exporter.from);
  CHECK(finish_child(exporter) == 0);
  printf("# %d failed opens or closes in %d rounds, %d failed final closes; importer's descriptors %d before, %d with "
         "the handles open\n",
         open_failures, ROUNDS, close_failures, fds_started, fds_open);
  printf("# %ld of %d blocks held when freed while open, %ld freed once closed\n", held, ALL, freed);
  yes("every open and close of two threads at once succeeded", open_failures == 0 && close_failures == 0);
  yes("both threads got the same address for a handle both opened", same);
  yes("the importer's descriptors stay bounded", fds_open > 0 && fds_open - fds_started <= FD_GROWTH_BOUND);
  yes("every block held while open", held == ALL);
  yes("every block freed once closed", freed == ALL);
}

int main(int argc, char **argv) {
  struct rlimit limit;
  CHECK(getrlimit(RLIMIT_NOFILE, &limit) == 0);
  limit.rlim_cur = 1024;
  CHECK(setrlimit(RLIMIT_NOFILE, &limit) == 0);
  if (argc == 3 && strcmp(argv[1], "exporter") == 0) return exporter(atoi(argv[2]));
  if (argc == 3 && strcmp(argv[1], "holder") == 0) return holder(atoi(argv[2]));
  CHECK(under_shim());
  const char *which = getenv("IPC_LEASES_CASE");
  if (!which) which = "";
  if (strcmp(which, "many") == 0) many();
  else if (strcmp(which, "killed") == 0) killed();
  else if (strcmp(which, "threads") == 0) threads();
  else CHECK(!"IPC_LEASES_CASE is many, killed or threads");
  return report();
}
