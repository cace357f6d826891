/* CUDA IPC under load, both processes limited to 1024 descriptors (the
 * default soft limit). The first argument picks the case:
 *   many    (default) the parent exports 5,000 blocks, an importer opens them
 *           all, reads each one's mark, and reports its descriptors; both can
 *           still open files; the parent frees the blocks while they are open
 *           and allocates and overwrites as much again, and the importer
 *           checks the marks once more before it closes them. Real CUDA IPC
 *           costs no descriptor per handle.
 *   silent  30 connections to the exporter's IPC socket that never send
 *           (under the shim; natively there is no socket to stall): another
 *           process's open is answered within 50 ms, the exporter's fork()
 *           returns at once and its exit waits for none of them.
 *   flood   an importer that holds a lease floods the lease's connection with
 *           32 MiB (under the shim; natively there is nothing to flood): the
 *           exporter spends little CPU on it and ends the lease; a later open
 *           is served as before.
 * Open costs and the other figures are "# " lines. */
#include "gpu_common.h"
#include "../child.h"
#include "../shim_ipc_socket.h"

#include <sys/resource.h>

#define BLOCKS 5000
#define BLOCK_BYTES (2 * MiB) /* a whole allocation natively: one handle each */
/* Descriptors a process may gain for all its handles (the connection, a pool's, the runtime's slack). */
#define FD_GROWTH_BOUND 8
#define OPEN_BOUND_MS 50.0
#define FORK_BOUND_MS 50.0
#define EXIT_BOUND_MS 1000.0
#define FLOOD_BYTES ((size_t)32 << 20)
#define FLOOD_CPU_BOUND_S 0.5

/* ---- plumbing ---- */

/* Whether the handle is one of the shim's (its socket to stall or flood), as
 * the preload says. */
static int shim_handle(const cudaIpcMemHandle_t *h) {
  int ours = memcmp(h->reserved, "SOMASHIM", 8) == 0;
  CHECK(ours == under_shim());
  return ours;
}

static void tell(int fd, double value) { write_all(fd, &value, sizeof value); }
static double told(int fd) {
  double value = -1;
  read_all(fd, &value, sizeof value);
  return value;
}
static void say(int fd, char byte) { write_all(fd, &byte, 1); }
static char heard(int fd) {
  char byte = 0;
  return read(fd, &byte, 1) == 1 ? byte : 0;
}

static double now_ms(void) { return host_us() / 1e3; } /* CLOCK_MONOTONIC: one clock for every process */

static void yes(const char *what, int ok) {
  if (!ok) fprintf(stderr, "failed: %s\n", what);
  CHECK(ok);
  printf("%s: %s\n", what, ok ? "yes" : "no");
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static cudaIpcMemHandle_t exported(void **block) {
  cudaIpcMemHandle_t h;
  CHECK_CUDA(TMALLOC(block, BLOCK_BYTES));
  CHECK_CUDA(cudaMemset(*block, 7, BLOCK_BYTES));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaIpcGetMemHandle(&h, *block));
  return h;
}

/* Opens the handle and says how long it took (ms) and whether the block reads as exported; closes it. */
static void timed_open(int out, const cudaIpcMemHandle_t *h) {
  void *p = NULL;
  double t0 = now_ms();
  cudaError_t rc = cudaIpcOpenMemHandle(&p, *h, cudaIpcMemLazyEnablePeerAccess);
  tell(out, now_ms() - t0);
  unsigned char byte = 0;
  if (rc == cudaSuccess) {
    CHECK_CUDA(cudaMemcpy(&byte, p, 1, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaIpcCloseMemHandle(p));
  } else {
    fprintf(stderr, "open: %s\n", cudaGetErrorString(rc));
    cudaGetLastError();
  }
  tell(out, rc == cudaSuccess && byte == 7);
}

/* ---- many ---- */

/* Reads the handles, opens them all, checks each block's mark (its index's
 * low byte) and reports: opens, marks right, first open (ms), median open
 * (us), descriptors gained, whether it can open a file. On 'v' checks the
 * marks again, on 'c' closes them all and reports how many closed. */
static int importer(void) {
  static cudaIpcMemHandle_t handles[BLOCKS];
  static void *opened[BLOCKS];
  static double open_us[BLOCKS];
  read_all(0, handles, sizeof handles);
  CHECK_CUDA(cudaFree(0)); /* CUDA up before the clock starts */
  int fds_before = fd_count(), opens = 0;
  CHECK(fds_before >= 0);
  for (; opens < BLOCKS; opens++) {
    double t0 = host_us();
    cudaError_t rc = cudaIpcOpenMemHandle(&opened[opens], handles[opens], cudaIpcMemLazyEnablePeerAccess);
    open_us[opens] = host_us() - t0;
    if (rc != cudaSuccess) {
      fprintf(stderr, "open %d: %s\n", opens, cudaGetErrorString(rc));
      cudaGetLastError();
      break;
    }
  }
  int fds_now = fd_count();
  CHECK(fds_now >= 0);
  int fds_gained = fds_now - fds_before;
  double first_ms = open_us[0] / 1e3;
  qsort(open_us + 1, opens > 1 ? opens - 1 : 0, sizeof *open_us, cmp_double);
  double median_us = opens > 1 ? open_us[1 + (opens - 1) / 2] : -1;
  for (char command = 'v'; command == 'v';) {
    int right = 0;
    for (int i = 0; i < opens; i++) {
      unsigned char byte = 0;
      CHECK_CUDA(cudaMemcpy(&byte, opened[i], 1, cudaMemcpyDeviceToHost));
      right += byte == (unsigned char)i;
    }
    tell(1, opens);
    tell(1, right);
    tell(1, first_ms);
    tell(1, median_us);
    tell(1, fds_gained);
    tell(1, can_open_a_file());
    command = heard(0);
  }
  int closed = 0;
  for (int i = 0; i < opens; i++) closed += cudaIpcCloseMemHandle(opened[i]) == cudaSuccess;
  tell(1, closed);
  return check_failures ? 1 : 0;
}

static void many(const char *self) {
  static void *blocks[BLOCKS];
  static cudaIpcMemHandle_t handles[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    CHECK_CUDA(TMALLOC(&blocks[i], BLOCK_BYTES));
    CHECK_CUDA(cudaMemset(blocks[i], i & 0xff, BLOCK_BYTES));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  double t0 = host_us();
  for (int i = 0; i < BLOCKS; i++) CHECK_CUDA(cudaIpcGetMemHandle(&handles[i], blocks[i]));
  double export_us = (host_us() - t0) / BLOCKS;
  int fds_before = fd_count();
  CHECK(fds_before >= 0);
  struct child k = start_child(self, "importer", "-");
  write_all(k.to, handles, sizeof handles);
  double opens = told(k.from), right = told(k.from), first_ms = told(k.from), median_us = told(k.from),
         gained = told(k.from), importer_opens = told(k.from);
  int fds_now = fd_count();
  CHECK(fds_now >= 0);
  int exporter_gained = fds_now - fds_before - 2; /* less the two pipes */
  int exporter_opens = can_open_a_file();
  /* Freed while open, then as much allocated and overwritten: the importer must still read the marks. */
  for (int i = 0; i < BLOCKS; i++) CHECK_CUDA(cudaFree(blocks[i]));
  static void *next[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    CHECK_CUDA(TMALLOC(&next[i], BLOCK_BYTES));
    CHECK_CUDA(cudaMemset(next[i], 0xAA, BLOCK_BYTES));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  say(k.to, 'v'); /* again, the blocks freed by the exporter */
  told(k.from);
  double right_after_free = told(k.from);
  for (int i = 0; i < 4; i++) told(k.from);
  say(k.to, 'c');
  double closed = told(k.from);
  CHECK(finish_child(k) == 0);
  for (int i = 0; i < BLOCKS; i++) CHECK_CUDA(cudaFree(next[i]));
  printf("# export %.1f us a handle; first open %.2f ms, then %.1f us (median of %d)\n", export_us, first_ms, median_us,
         (int)opens - 1);
  printf("# descriptors gained with %d handles open: importer %d, exporter %d\n", (int)opens, (int)gained, exporter_gained);
  yes("all 5000 handles opened under a limit of 1024 descriptors", opens == BLOCKS);
  yes("every block read as exported", right == BLOCKS);
  yes("every block read as exported after the exporter freed it and allocated as much again", right_after_free == BLOCKS);
  yes("the importer's descriptors stay bounded", gained <= FD_GROWTH_BOUND);
  yes("the exporter's descriptors stay bounded", exporter_gained <= FD_GROWTH_BOUND);
  yes("both can still open files", importer_opens == 1 && exporter_opens);
  yes("all handles closed", closed == BLOCKS);
}

/* ---- silent ---- */

/* Exports a block and sends its handle; on 'f' forks (the child exits at
 * once) and reports how long fork took (ms); on 'x' reports the time (ms)
 * and returns from main. */
static int forking_exporter(void) {
  void *block = NULL;
  cudaIpcMemHandle_t h = exported(&block);
  write_all(1, &h, sizeof h);
  for (char command; (command = heard(0)) == 'f';) {
    double t0 = now_ms();
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    tell(1, now_ms() - t0);
    waitpid(pid, NULL, 0);
  }
  tell(1, now_ms());
  return check_failures ? 1 : 0;
}

/* Reads a handle; on 'o' opens it (timed_open). */
static int opener(void) {
  cudaIpcMemHandle_t h;
  read_all(0, &h, sizeof h);
  CHECK_CUDA(cudaFree(0));
  say(1, 'r');
  while (heard(0) == 'o') timed_open(1, &h);
  return check_failures ? 1 : 0;
}

static void silent(const char *self) {
  CHECK_CUDA(cudaFree(0));
  struct child exporter = start_child(self, "forking_exporter", "-");
  cudaIpcMemHandle_t h;
  read_all(exporter.from, &h, sizeof h);
  struct child other = start_child(self, "opener", "-");
  write_all(other.to, &h, sizeof h);
  CHECK(heard(other.from) == 'r');
  int fds[30], stalled = 0;
  if (shim_handle(&h)) {
    char path[128];
    socket_path_of(&h, path, sizeof path);
    for (; stalled < 30; stalled++) fds[stalled] = connect_to(path);
    usleep(100000); /* the server has them by now */
  } else {
    printf("# natively there is no IPC socket to stall: the figures are the reference\n");
  }
  say(other.to, 'o');
  double open_ms = told(other.from), open_right = told(other.from);
  say(exporter.to, 'f');
  double fork_ms = told(exporter.from);
  say(exporter.to, 'x');
  double last = told(exporter.from);
  CHECK(finish_child(exporter) == 0); /* EOF, then reaped: the exporter is gone */
  double exit_ms = now_ms() - last;
  CHECK(finish_child(other) == 0);
  for (int i = 0; i < stalled; i++) close(fds[i]);
  printf("# with %d silent connections: open %.2f ms, fork %.2f ms, exit %.1f ms\n", stalled, open_ms, fork_ms, exit_ms);
  yes("another process's open answered within 50 ms", open_right == 1 && open_ms < OPEN_BOUND_MS);
  yes("the exporter's fork returns at once", fork_ms >= 0 && fork_ms < FORK_BOUND_MS);
  yes("the exporter's exit waits on no client", exit_ms < EXIT_BOUND_MS);
}

/* ---- flood ---- */

/* Speaks the shim's protocol (src/peers/wire.rs): takes a lease on the
 * handle it reads, says 'o'; on 'g' floods the connection with FLOOD_BYTES of
 * zeros (no request) and reports how much it sent and whether the exporter
 * ended the lease (the sends then fail). */
static int flooder(void) {
  cudaIpcMemHandle_t h;
  read_all(0, &h, sizeof h);
  int fd = take_lease(&h);
  say(1, 'o');
  CHECK(heard(0) == 'g');
  int ended = 0;
  size_t sent = flood_lease(fd, FLOOD_BYTES, &ended);
  tell(1, (double)sent);
  tell(1, ended);
  close(fd);
  return check_failures ? 1 : 0;
}

static double cpu_seconds(void) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

static void flood(const char *self) {
  void *block = NULL;
  cudaIpcMemHandle_t h = exported(&block);
  double sent = 0, ended = 1, cpu = 0;
  if (shim_handle(&h)) {
    struct child k = start_child(self, "flooder", "-");
    write_all(k.to, &h, sizeof h);
    CHECK(heard(k.from) == 'o');
    double cpu_before = cpu_seconds();
    say(k.to, 'g');
    sent = told(k.from);
    ended = told(k.from);
    cpu = cpu_seconds() - cpu_before;
    CHECK(finish_child(k) == 0);
  } else {
    printf("# natively there is no IPC socket to flood: the figures are the reference\n");
  }
  struct child other = start_child(self, "opener", "-");
  write_all(other.to, &h, sizeof h);
  CHECK(heard(other.from) == 'r');
  say(other.to, 'o');
  double open_ms = told(other.from), open_right = told(other.from);
  CHECK(finish_child(other) == 0);
  CHECK_CUDA(cudaFree(block));
  printf("# flood: %.1f MiB sent before the lease ended, exporter CPU %.3f s; a later open %.2f ms\n", sent / MiB, cpu,
         open_ms);
  yes("the flooded lease ended", ended == 1);
  yes("the exporter spends little CPU on a flood", cpu < FLOOD_CPU_BOUND_S);
  yes("a later open is served", open_right == 1);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN); /* a child gone: a failed write, not a silent death */
  struct rlimit limit;
  CHECK(getrlimit(RLIMIT_NOFILE, &limit) == 0);
  limit.rlim_cur = limit.rlim_max < 1024 ? limit.rlim_max : 1024;
  CHECK(setrlimit(RLIMIT_NOFILE, &limit) == 0);
  if (argc == 3 && strcmp(argv[1], "importer") == 0) return importer();
  if (argc == 3 && strcmp(argv[1], "forking_exporter") == 0) return forking_exporter();
  if (argc == 3 && strcmp(argv[1], "opener") == 0) return opener();
  if (argc == 3 && strcmp(argv[1], "flooder") == 0) return flooder();
  CHECK_CUDA(cudaFree(0));
  const char *which = argc > 1 ? argv[1] : "many";
  if (strcmp(which, "many") == 0) many(argv[0]);
  else if (strcmp(which, "silent") == 0) silent(argv[0]);
  else if (strcmp(which, "flood") == 0) flood(argv[0]);
  else CHECK(!"the case is many, silent or flood");
  if (strcmp(which, "silent") == 0) {
    void *p = NULL; /* the pooling proof: this process allocates nothing else */
    CHECK_CUDA(TMALLOC(&p, MiB));
    CHECK_CUDA(cudaFree(p));
  }
  print_pooled();
  return report();
}
