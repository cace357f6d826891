/* The exporter's IPC server against clients that misbehave, and importers of
 * exporters that died (under the shim only, as ipc.c). IPC_SERVER_CASE picks
 * one:
 *   stalled  a client sends its request a byte every 0.45 s: another
 *            process's open is answered at once, and the stalled one cut off;
 *   silent   30 connections that send nothing: the exporter keeps 16 (the
 *            oldest are cut off), its fork returns at once, and 30 more
 *            delay its exit by nothing;
 *   flood    an importer floods its lease's connection with data: the exporter spends
 *            little CPU on it (getrusage) and ends the lease;
 *   killed   the exporter is killed and not reaped yet (a zombie): an open of
 *            its handle gives 400 at once;
 *   forked   the exporter forked a child (no exec) and was killed: the child
 *            holds no socket of its server, so an open gives 400 at once;
 *   fork_import  a thread's open waits on a stopped exporter while another
 *            thread forks: this process's cudaMalloc+cudaFree and another
 *            process's open of its handle are answered at once, the fork
 *            waiting for the open alone;
 *   signalled  a SIGALRM (handled, without SA_RESTART) 50 ms into an open of
 *            the handle of an exporter stopped for 300 ms: the open succeeds;
 *   exit_export  an export from an exit handler that runs after the shim's:
 *            no server starts (its thread would call the driver as the
 *            runtime tears down);
 *   poll_fails  the server's poll fails for good (EINVAL: more descriptors
 *            than RLIMIT_NOFILE) while a block freed by the program is
 *            leased: the lease ends (the block is freed), the socket goes,
 *            and a new export passes through to the real call;
 *   stale_socket  an open of a handle whose socket file's listener is gone
 *            (its exporter killed; its pid, this process's, alive): 400,
 *            and the file removed.
 * The bounds leave room for a loaded machine; the figures are printed as
 * "# " lines. */
#include "common.h"
#include "../ipc_hex.h"
#include "../child.h"
#include "../clock_ms.h"
#include "../shim_ipc_socket.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

/* An answer slower than this is a server that waited on another client. */
#define ANSWER_BOUND_MS 500.0
/* The most connections the server keeps waiting for their request
 * (MAX_PENDING in src/peers/server.rs). */
#define MAX_PENDING 16

/* One line from `fd` (without its newline); 0 at EOF before any byte. */
static int read_line(int fd, char *line, size_t size) {
  size_t n = 0;
  while (n + 1 < size && read(fd, line + n, 1) == 1 && line[n] != '\n') n++;
  line[n] = 0;
  return n > 0;
}

static void say(char byte) { CHECK(write(1, &byte, 1) == 1); }

static void await(int fd, char want) {
  char byte = 0;
  CHECK(read(fd, &byte, 1) == 1 && byte == want);
}

/* A pool block exported: its handle. */
static cudaIpcMemHandle_t exported(void **block, size_t size) {
  cudaIpcMemHandle_t h;
  CHECK_CUDA(cudaMalloc(block, size));
  CHECK_CUDA(cudaIpcGetMemHandle(&h, *block));
  return h;
}

static void print_handle(const cudaIpcMemHandle_t *h) {
  char hex[129];
  handle_to_hex(h, hex);
  printf("%s\n", hex);
}

/* ---- children ---- */

/* Says it is ready ('r'), and on the word ('g') opens the handle: prints the
 * code and how long the open took. */
static int timed_opener(const char *hex) {
  CHECK_CUDA(cudaFree(0)); /* CUDA up before the clock starts */
  say('r');
  await(0, 'g');
  void *p = NULL;
  double t0 = now_ms();
  int rc = cudaIpcOpenMemHandle(&p, handle_from_hex(hex), 0);
  printf("%d %.3f\n", rc, now_ms() - t0);
  if (rc == 0) CHECK_CUDA(cudaIpcCloseMemHandle(p));
  return check_failures ? 1 : 0;
}

/* Exports; on the word ('g') forks and prints how long fork took; on the
 * next ('x') prints the time of its last statement and returns. */
static int forking_exporter(void) {
  void *block = NULL;
  cudaIpcMemHandle_t h = exported(&block, MiB);
  print_handle(&h);
  await(0, 'g');
  double t0 = now_ms();
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  double took = now_ms() - t0;
  waitpid(pid, NULL, 0);
  printf("%.3f\n", took);
  await(0, 'x');
  printf("%.3f\n", now_ms());
  return check_failures ? 1 : 0;
}

/* Exports, and with `fork_first`, forks a child that only sleeps (it prints
 * the child's pid); then waits to be killed. */
static int killed_exporter(int fork_first) {
  void *block = NULL;
  cudaIpcMemHandle_t h = exported(&block, MiB);
  print_handle(&h);
  if (fork_first) {
    pid_t pid = fork();
    if (pid == 0) {
      sleep(30); /* killed long before, unless the test failed */
      _exit(0);
    }
    printf("%d\n", (int)pid);
  }
  char byte;
  while (read(0, &byte, 1) != 0) {
  }
  return 0;
}

/* Speaks the protocol itself: takes a lease, says so ('o'); on the word ('g')
 * floods the lease's connection with up to `FLOOD_BYTES` (zeros: no request), and prints how much it sent and
 * whether the exporter ended the lease (the sends then fail). */
#define FLOOD_BYTES ((size_t)32 << 20)
static int flooder(const char *hex) {
  cudaIpcMemHandle_t h = handle_from_hex(hex);
  int fd = take_lease(&h);
  say('o');
  await(0, 'g');
  int ended = 0;
  size_t sent = flood_lease(fd, FLOOD_BYTES, &ended);
  printf("%zu %d\n", sent, ended);
  close(fd);
  return check_failures ? 1 : 0;
}

/* ---- cases ---- */

/* Sends the stalled request, a byte every 0.45 s, until the exporter cuts
 * it off (when: ms after connecting) or 3 s have passed (-1). */
struct drip {
  const char *path;
  volatile int started;
  double cut_off_after;
};

static void *drip(void *arg) {
  struct drip *d = arg;
  int fd = connect_to(d->path);
  double t0 = now_ms();
  d->cut_off_after = -1;
  unsigned char byte = 'S';
  while (now_ms() - t0 < 3000) {
    ssize_t sent = send(fd, &byte, 1, MSG_NOSIGNAL);
    d->started = 1;
    if (sent != 1) { /* cut off between two polls */
      d->cut_off_after = now_ms() - t0;
      break;
    }
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 450) > 0 && read(fd, &byte, 1) <= 0) {
      d->cut_off_after = now_ms() - t0;
      break;
    }
  }
  close(fd);
  return NULL;
}

static void stalled(void) {
  void *block = NULL;
  cudaIpcMemHandle_t h = exported(&block, MiB);
  char hex[129], path[128];
  handle_to_hex(&h, hex);
  socket_path_of(&h, path, sizeof path);
  /* Started before the drip: a server holding the fork handler's lock across the stalled
   * request would delay this fork, and the open would then come after the stall. */
  struct child opener = start_child("ipc_server", "timed_opener", hex);
  await(opener.from, 'r');
  struct drip d = {.path = path};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, drip, &d) == 0);
  while (!d.started) usleep(1000);
  usleep(100000); /* the server has the stalled request by now */
  CHECK(write(opener.to, "g", 1) == 1);
  char line[64] = {0};
  CHECK(read_line(opener.from, line, sizeof line));
  int rc = -1;
  double took = -1;
  CHECK(sscanf(line, "%d %lf", &rc, &took) == 2);
  CHECK(finish_child(opener) == 0);
  pthread_join(thread, NULL);
  printf("# another process's open took %.1f ms (code %d) while a client stalled\n", took, rc);
  printf("# the stalled client was cut off %.1f ms after connecting\n", d.cut_off_after);
  CHECK(rc == 0 && took < ANSWER_BOUND_MS);
  CHECK(d.cut_off_after >= 0 && d.cut_off_after < 2000);
  printf("an open answered at once while a client stalls: %s\n", rc == 0 && took < ANSWER_BOUND_MS ? "yes" : "no");
  printf("the stalled client cut off: %s\n", d.cut_off_after >= 0 ? "yes" : "no");
}

/* `n` connections to `path` that send nothing. */
static void connect_silently(const char *path, int *fds, int n) {
  for (int i = 0; i < n; i++) fds[i] = connect_to(path);
  usleep(100000); /* the server has them by now */
}

static void silent(void) {
  CHECK_CUDA(cudaFree(0));
  struct child exporter = start_child("ipc_server", "forking_exporter", "-");
  char line[160] = {0};
  CHECK(read_line(exporter.from, line, sizeof line));
  cudaIpcMemHandle_t h = handle_from_hex(line);
  char path[128];
  socket_path_of(&h, path, sizeof path);
  int fds[60];
  connect_silently(path, fds, 30);
  int cut_off = 0; /* before their deadline: beyond the cap */
  for (int i = 0; i < 30; i++) {
    struct pollfd p = {fds[i], POLLIN, 0};
    char byte;
    cut_off += poll(&p, 1, 0) == 1 && read(fds[i], &byte, 1) == 0;
  }
  CHECK(write(exporter.to, "g", 1) == 1);
  double fork_took = -1, last = 0;
  CHECK(read_line(exporter.from, line, sizeof line) && sscanf(line, "%lf", &fork_took) == 1);
  connect_silently(path, fds + 30, 30);
  CHECK(write(exporter.to, "x", 1) == 1);
  CHECK(read_line(exporter.from, line, sizeof line) && sscanf(line, "%lf", &last) == 1);
  while (read(exporter.from, line, sizeof line) > 0) { /* EOF: the exporter is gone */
  }
  double exit_took = now_ms() - last;
  CHECK(finish_child(exporter) == 0);
  for (int i = 0; i < 60; i++) close(fds[i]);
  printf("# %d of 30 silent connections cut off at once; the exporter's fork took %.1f ms; with 30 more its exit took "
         "%.1f ms\n",
         cut_off, fork_took, exit_took);
  CHECK(cut_off >= 30 - MAX_PENDING);
  printf("the exporter keeps at most %d silent connections: %s\n", MAX_PENDING, cut_off >= 30 - MAX_PENDING ? "yes" : "no");
  CHECK(fork_took >= 0 && fork_took < ANSWER_BOUND_MS);
  CHECK(exit_took < 2 * ANSWER_BOUND_MS);
  printf("the exporter's fork waits on no silent client: %s\n", fork_took < ANSWER_BOUND_MS ? "yes" : "no");
  printf("the exporter's exit waits on no silent client: %s\n", exit_took < 2 * ANSWER_BOUND_MS ? "yes" : "no");
}

static double cpu_seconds(void) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

static void flood(void) {
  void *block = NULL;
  cudaIpcMemHandle_t h = exported(&block, MiB);
  char hex[129];
  handle_to_hex(&h, hex);
  struct child flooder = start_child("ipc_server", "flooder", hex);
  await(flooder.from, 'o');
  CHECK_CUDA(cudaFree(block)); /* held for the lease */
  double cpu_before = cpu_seconds();
  CHECK(write(flooder.to, "g", 1) == 1);
  char line[64] = {0};
  size_t sent = 0;
  int ended = 0;
  CHECK(read_line(flooder.from, line, sizeof line) && sscanf(line, "%zu %d", &sent, &ended) == 2);
  double cpu = cpu_seconds() - cpu_before;
  CHECK(finish_child(flooder) == 0);
  printf("# the exporter spent %.3f s of CPU while a lease sent %zu bytes\n", cpu, sent);
  CHECK(ended);
  CHECK(cpu < 0.5);
  printf("a flooding lease ended by the exporter: %s\n", ended ? "yes" : "no");
  printf("the exporter's CPU time under 0.5 s: %s\n", cpu < 0.5 ? "yes" : "no");
  int freed = freed_once_released(block);
  CHECK(freed);
  printf("the block freed once the lease ended: %s\n", freed ? "yes" : "no");
}

/* A process's state letter in /proc/<pid>/stat (after the name, in parentheses). */
static char state_of(pid_t pid) {
  char path[64], stat[512] = {0};
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[n] = 0;
  char *end = strrchr(stat, ')');
  return end && end[1] ? end[2] : 0;
}

/* The code and time of an open of `h`, whose exporter has died; the socket
 * file a killed exporter leaves is gone with the open. */
static int open_after_death(const cudaIpcMemHandle_t *h, const char *what) {
  void *p = (void *)0x1;
  double t0 = now_ms();
  int rc = cudaIpcOpenMemHandle(&p, *h, 0);
  double took = now_ms() - t0;
  cudaGetLastError();
  printf("# the open of the handle of %s gave %d in %.1f ms\n", what, rc, took);
  CHECK(rc == 400 && took < ANSWER_BOUND_MS);
  char path[128];
  socket_path_of(h, path, sizeof path);
  CHECK(access(path, F_OK) != 0);
  return rc;
}

static void killed(void) {
  CHECK_CUDA(cudaFree(0));
  struct child exporter = start_child("ipc_server", "killed_exporter", "-");
  char line[160] = {0};
  CHECK(read_line(exporter.from, line, sizeof line));
  cudaIpcMemHandle_t h = handle_from_hex(line);
  kill(exporter.pid, SIGKILL);
  for (int i = 0; i < 2000 && state_of(exporter.pid) != 'Z'; i++) usleep(1000);
  CHECK(state_of(exporter.pid) == 'Z');
  int rc = open_after_death(&h, "a killed exporter not reaped yet");
  printf("open the handle of a killed exporter not reaped yet: %d\n", rc);
  CHECK(finish_child(exporter) == 128 + SIGKILL);
}

static void forked(void) {
  CHECK_CUDA(cudaFree(0));
  struct child exporter = start_child("ipc_server", "forked_exporter", "-");
  char line[160] = {0};
  CHECK(read_line(exporter.from, line, sizeof line));
  cudaIpcMemHandle_t h = handle_from_hex(line);
  int child = 0;
  CHECK(read_line(exporter.from, line, sizeof line) && (child = atoi(line)) > 0);
  kill(exporter.pid, SIGKILL);
  CHECK(finish_child(exporter) == 128 + SIGKILL);
  int rc = open_after_death(&h, "a killed exporter whose forked child lives");
  if (child > 0) kill(child, SIGKILL);
  printf("open the handle of a killed exporter whose forked child lives: %d\n", rc);
}

/* Stops `pid` and waits until it is: its server answers nothing from then on. */
static void stop(pid_t pid) {
  kill(pid, SIGSTOP);
  for (int i = 0; i < 2000 && state_of(pid) != 'T'; i++) usleep(1000);
  CHECK(state_of(pid) == 'T');
}

/* The open in progress ('fork_import'): its code. */
struct opening {
  cudaIpcMemHandle_t h;
  void *p;
  int rc;
};

static void *open_handle(void *arg) {
  struct opening *o = arg;
  o->rc = cudaIpcOpenMemHandle(&o->p, o->h, 0);
  return NULL;
}

static void *timed_fork(void *arg) {
  double t0 = now_ms();
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  *(double *)arg = now_ms() - t0;
  waitpid(pid, NULL, 0);
  return NULL;
}

/* The exporter stopped this long: the open, and the fork behind it, wait as long. */
#define STOPPED_MS 1000

static void fork_import(void) {
  void *block = NULL;
  cudaIpcMemHandle_t mine = exported(&block, MiB);
  char hex[129];
  handle_to_hex(&mine, hex);
  struct child opener = start_child("ipc_server", "timed_opener", hex);
  await(opener.from, 'r');
  struct child exporter = start_child("ipc_server", "killed_exporter", "-");
  char line[160] = {0};
  CHECK(read_line(exporter.from, line, sizeof line));
  struct opening o = {.h = handle_from_hex(line)};
  stop(exporter.pid);
  double stopped_at = now_ms();
  pthread_t opening_thread, forking_thread;
  CHECK(pthread_create(&opening_thread, NULL, open_handle, &o) == 0);
  usleep(100000); /* the open waits for its answer by now */
  double fork_took = -1;
  CHECK(pthread_create(&forking_thread, NULL, timed_fork, &fork_took) == 0);
  usleep(100000); /* the fork waits for the open by now */
  double t0 = now_ms();
  void *p = NULL;
  CHECK_CUDA(cudaMalloc(&p, MiB));
  CHECK_CUDA(cudaFree(p));
  double alloc_took = now_ms() - t0;
  CHECK(write(opener.to, "g", 1) == 1);
  int rc = -1;
  double open_took = -1;
  CHECK(read_line(opener.from, line, sizeof line) && sscanf(line, "%d %lf", &rc, &open_took) == 2);
  double left = STOPPED_MS - (now_ms() - stopped_at);
  if (left > 0) usleep((useconds_t)(left * 1000));
  kill(exporter.pid, SIGCONT);
  pthread_join(opening_thread, NULL);
  pthread_join(forking_thread, NULL);
  if (o.rc == 0) CHECK_CUDA(cudaIpcCloseMemHandle(o.p));
  CHECK(finish_child(opener) == 0);
  kill(exporter.pid, SIGKILL); /* it holds its stdin's other end: no EOF comes */
  CHECK(finish_child(exporter) == 128 + SIGKILL);
  printf("# while an open waited on an exporter stopped for %d ms: the fork took %.1f ms, cudaMalloc+cudaFree %.1f ms, "
         "another process's open %.1f ms (code %d); the waiting open gave %d\n",
         STOPPED_MS, fork_took, alloc_took, open_took, rc, o.rc);
  CHECK(o.rc == 0 && rc == 0);
  CHECK(alloc_took < ANSWER_BOUND_MS && open_took < ANSWER_BOUND_MS);
  printf("cudaMalloc and cudaFree answered at once while a fork waits for an open: %s\n", alloc_took < ANSWER_BOUND_MS ? "yes" : "no");
  printf("another process's open answered at once while a fork waits for an open: %s\n",
         rc == 0 && open_took < ANSWER_BOUND_MS ? "yes" : "no");
}

static void on_alarm(int sig) { (void)sig; }

/* Interrupts the opening thread 50 ms in, and resumes the exporter 300 ms in. */
struct interrupter {
  pthread_t opening;
  pid_t exporter;
};

static void *interrupt(void *arg) {
  struct interrupter *i = arg;
  usleep(50000);
  pthread_kill(i->opening, SIGALRM);
  usleep(250000);
  kill(i->exporter, SIGCONT);
  return NULL;
}

static void signalled(void) {
  CHECK_CUDA(cudaFree(0));
  struct sigaction action = {.sa_handler = on_alarm}; /* no SA_RESTART */
  CHECK(sigaction(SIGALRM, &action, NULL) == 0);
  struct child exporter = start_child("ipc_server", "killed_exporter", "-");
  char line[160] = {0};
  CHECK(read_line(exporter.from, line, sizeof line));
  cudaIpcMemHandle_t h = handle_from_hex(line);
  stop(exporter.pid);
  struct interrupter i = {pthread_self(), exporter.pid};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, interrupt, &i) == 0);
  void *p = NULL;
  double t0 = now_ms();
  int rc = cudaIpcOpenMemHandle(&p, h, 0);
  double took = now_ms() - t0;
  pthread_join(thread, NULL);
  if (rc == 0) CHECK_CUDA(cudaIpcCloseMemHandle(p));
  kill(exporter.pid, SIGKILL); /* it holds its stdin's other end: no EOF comes */
  CHECK(finish_child(exporter) == 128 + SIGKILL);
  printf("# an open interrupted by a signal 50 ms in gave %d in %.1f ms (the exporter stopped for 300 ms)\n", rc, took);
  CHECK(rc == 0);
  printf("an open interrupted by a signal: %d\n", rc);
}

/* This process's server sockets in the shim's directory. */
static int own_sockets(void) {
  char dir[96], prefix[32];
  shim_socket_dir(dir, sizeof dir);
  snprintf(prefix, sizeof prefix, "%d-", (int)getpid());
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  if (d) closedir(d);
  return n;
}

static void *exit_block;

/* Registered before CUDA's first call, so it runs after the shim's exit handler. */
static void export_after_exit(void) {
  int before = own_sockets();
  cudaIpcMemHandle_t h;
  cudaIpcGetMemHandle(&h, exit_block);
  int after = own_sockets();
  printf("# this process's server sockets after the shim's exit handler: %d, after an export then: %d\n", before, after);
  printf("no server started after exit: %s\n", before == 0 && after == 0 ? "yes" : "no");
  fflush(stdout);
}

static void exit_export(void) {
  CHECK(atexit(export_after_exit) == 0);
  cudaIpcMemHandle_t h = exported(&exit_block, MiB);
  (void)h;
  CHECK(own_sockets() == 1);
}

static void poll_fails(void) {
  void *block = NULL;
  cudaIpcMemHandle_t h = exported(&block, MiB);
  char hex[129], path[128];
  handle_to_hex(&h, hex);
  socket_path_of(&h, path, sizeof path);
  struct child lessee = start_child("ipc_server", "flooder", hex);
  await(lessee.from, 'o');
  CHECK_CUDA(cudaFree(block)); /* held for the lease */
  /* Made before the limit, whose warning would fail the case's empty stderr. */
  int waker = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), quiet = open("/dev/null", O_WRONLY | O_CLOEXEC), saved = dup(2);
  CHECK(waker >= 0 && quiet >= 0 && saved >= 0 && dup2(quiet, 2) == 2);
  struct rlimit limit, one;
  CHECK(getrlimit(RLIMIT_NOFILE, &limit) == 0);
  one = limit;
  one.rlim_cur = 1; /* below the server's 3 polled descriptors */
  CHECK(setrlimit(RLIMIT_NOFILE, &one) == 0);
  struct sockaddr_un address = {.sun_family = AF_UNIX};
  snprintf(address.sun_path, sizeof address.sun_path, "%s", path);
  CHECK(connect(waker, (struct sockaddr *)&address, sizeof address) == 0); /* wakes the server */
  for (int i = 0; i < 200 && access(path, F_OK) == 0; i++) usleep(10000);
  int gone = access(path, F_OK) != 0;
  CHECK(setrlimit(RLIMIT_NOFILE, &limit) == 0);
  CHECK(dup2(saved, 2) == 2);
  close(saved);
  close(quiet);
  close(waker);
  printf("# the server's socket %s after its poll failed\n", gone ? "removed" : "still there");
  int freed = freed_once_released(block);
  void *other = NULL;
  cudaIpcMemHandle_t again;
  CHECK_CUDA(cudaMalloc(&other, MiB));
  int rc = cudaIpcGetMemHandle(&again, other);
  cudaGetLastError();
  int passed = rc != 0 && memcmp(again.reserved, "SOMASHIM", 8) != 0;
  CHECK_CUDA(cudaFree(other));
  CHECK(write(lessee.to, "g", 1) == 1); /* its flood then fails at once */
  char line[64];
  read_line(lessee.from, line, sizeof line);
  CHECK(finish_child(lessee) == 0);
  CHECK(gone && freed && passed);
  printf("the socket removed: %s\n", gone ? "yes" : "no");
  printf("the leased block freed: %s\n", freed ? "yes" : "no");
  printf("a new export passes through (%d): %s\n", rc, passed ? "yes" : "no");
}

static void stale_socket(void) {
  CHECK_CUDA(cudaFree(0));
  cudaIpcMemHandle_t h = {{0}};
  uint32_t version = 1, pid = (uint32_t)getpid();
  uint64_t endpoint = 0x57a1e50c4e700000ull | pid, base = 0x7f0000000000ull;
  memcpy(h.reserved, "SOMASHIM", 8);
  memcpy(h.reserved + 8, &version, sizeof version);
  memcpy(h.reserved + 12, &pid, sizeof pid);
  memcpy(h.reserved + 16, &endpoint, sizeof endpoint);
  memcpy(h.reserved + 24, &base, sizeof base);
  char dir[96], path[128];
  shim_socket_dir(dir, sizeof dir);
  mkdir(dir, 0700); /* the shim's own checks judge it */
  socket_path_of(&h, path, sizeof path);
  /* A listener closed without its file removed, as a killed exporter's. */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un address = {.sun_family = AF_UNIX};
  snprintf(address.sun_path, sizeof address.sun_path, "%s", path);
  CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&address, sizeof address) == 0 && listen(fd, 1) == 0);
  close(fd);
  void *p = (void *)0x1;
  double t0 = now_ms();
  int rc = cudaIpcOpenMemHandle(&p, h, 0);
  double took = now_ms() - t0;
  cudaGetLastError();
  int removed = access(path, F_OK) != 0;
  unlink(path);
  printf("# the open against a socket whose listener is gone gave %d in %.1f ms\n", rc, took);
  CHECK(rc == 400 && removed);
  printf("open against a socket whose listener is gone: %d\n", rc);
  printf("the stale socket file removed: %s\n", removed ? "yes" : "no");
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "timed_opener") == 0) return timed_opener(argv[2]);
  if (argc == 3 && strcmp(argv[1], "forking_exporter") == 0) return forking_exporter();
  if (argc == 3 && strcmp(argv[1], "killed_exporter") == 0) return killed_exporter(0);
  if (argc == 3 && strcmp(argv[1], "forked_exporter") == 0) return killed_exporter(1);
  if (argc == 3 && strcmp(argv[1], "flooder") == 0) return flooder(argv[2]);
  CHECK(under_shim());
  const char *which = getenv("IPC_SERVER_CASE");
  if (!which) which = "";
  if (strcmp(which, "stalled") == 0) stalled();
  else if (strcmp(which, "silent") == 0) silent();
  else if (strcmp(which, "flood") == 0) flood();
  else if (strcmp(which, "killed") == 0) killed();
  else if (strcmp(which, "forked") == 0) forked();
  else if (strcmp(which, "fork_import") == 0) fork_import();
  else if (strcmp(which, "signalled") == 0) signalled();
  else if (strcmp(which, "exit_export") == 0) exit_export();
  else if (strcmp(which, "poll_fails") == 0) poll_fails();
  else if (strcmp(which, "stale_socket") == 0) stale_socket();
  else CHECK(!"IPC_SERVER_CASE is stalled, silent, flood, killed, forked, fork_import, signalled, exit_export, poll_fails or stale_socket");
  return report();
}
