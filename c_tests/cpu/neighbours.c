/* Processes that share one device (the double's device memory shared through
 * FAKECUDA_SHARED_MEMORY, 1 GiB): a holder allocates 768 MiB, frees it all,
 * synchronizes and idles; a taker then asks for 700 MiB. NEIGHBOURS_CASE
 * picks one (the parent only starts processes; each child runs under the
 * shim or natively, as the case says):
 *   decay    holder under the shim with SOMA_DECAY_MS=1000 (SOMA_IDLE_MS=0): a
 *            native taker is out of memory at once, and succeeds once the
 *            delay has passed since the holder's last free;
 *   idle     holder with SOMA_DECAY_MS=600000 and the idle release
 *            (SOMA_IDLE_MS=50): a native taker succeeds once the holder has
 *            idled for 50 ms, long before the decay's delay;
 *   never    holder with SOMA_DECAY_MS=0: a native taker stays out of memory;
 *   reclaim  holder with SOMA_DECAY_MS=0: a taker under the shim asks it and
 *            succeeds at once;
 *   dead_and_stalled  beside the holder, a shim process killed (not reaped)
 *            and one stopped: the taker under the shim still succeeds, within
 *            the bound of its wait (200 ms), and the dead one's socket is gone;
 *   stalled  the holder itself stopped: the taker is out of memory after
 *            the bound, not later;
 *   apart    a holder with SOMA_NEIGHBOURS=0 that serves CUDA IPC (so has a
 *            socket) refuses: the taker is out of memory at once;
 *   ps       somarun --ps --json lists the holder with what it caches and
 *            the library that allocated it (this program); somarun --snapshot
 *            makes it write a snapshot of its device;
 *            somarun --trim PID makes it give that back, and --ps shows it.
 * The figures are printed as "# " lines. */
#include "common.h"
#include "../child.h"
#include "../clock_ms.h"
#include "../shim_ipc_socket.h"

#include <signal.h>
#include <sys/stat.h>

#define MiB (1ull << 20)
#define HELD_MIB 768
#define TAKEN_MIB 700
/* How long a taker under the shim waits for its neighbours (ASK_WAIT in
 * src/peers/neighbours.rs), and the slack a loaded machine needs. */
#define ASK_WAIT_MS 200.0
#define SLACK_MS 800.0

/* A child's report: its failures on stderr, its stdout (the pipe to the
 * parent, which may have closed it) left alone. */
static int quiet_report(void) {
  int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) dup2(null, 1);
  return report();
}

/* What a holder says once it has freed everything. */
struct held {
  uint64_t used;      /* the device's use as the double sees it */
  double last_free_ms; /* when its last free returned (CLOCK_MONOTONIC, one clock for every process) */
};

/* Allocates `arg` MiB in 32 MiB blocks (pool blocks under the shim; with an
 * "e" after the number, exports the first through CUDA IPC), frees them,
 * synchronizes, says so, and idles until stdin closes. */
static int holder(const char *arg) {
  char *end = NULL;
  unsigned long mib = strtoul(arg, &end, 10);
  void *blocks[64] = {0};
  unsigned long n = mib / 32;
  CHECK_CUDA(cudaFree(NULL));
  for (unsigned long i = 0; i < n && i < 64; i++) CHECK_CUDA(cudaMalloc(&blocks[i], 32 * MiB));
  if (*end == 'e') {
    cudaIpcMemHandle_t h;
    CHECK_CUDA(cudaIpcGetMemHandle(&h, blocks[0]));
  }
  for (unsigned long i = 0; i < n && i < 64; i++) CHECK_CUDA(cudaFree(blocks[i]));
  struct held h = {0, now_ms()};
  CHECK_CUDA(cudaDeviceSynchronize());
  h.used = fakecuda_device_used(0);
  write_all(1, &h, sizeof h);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  return quiet_report();
}

struct taken {
  int first_rc, rc;
  double first_ms, ms; /* the first attempt; from the start to success (-1: none) */
  double got_at_ms;    /* when it succeeded (CLOCK_MONOTONIC) */
};

/* Asks for `arg` MiB once; with "poll" in TAKER_POLL_MS, again every 5 ms
 * for that long until it succeeds. */
static int taker(const char *arg) {
  size_t bytes = strtoul(arg, NULL, 10) * MiB;
  double poll_ms = atof(getenv("TAKER_POLL_MS") ? getenv("TAKER_POLL_MS") : "0");
  CHECK_CUDA(cudaFree(NULL));
  struct taken t = {0, 0, 0, -1, 0};
  void *p = NULL;
  double start = now_ms();
  t.first_rc = t.rc = cudaMalloc(&p, bytes);
  t.first_ms = now_ms() - start;
  while (t.rc != cudaSuccess && now_ms() - start < poll_ms) {
    cudaGetLastError();
    usleep(5000);
    t.rc = cudaMalloc(&p, bytes);
  }
  if (t.rc == cudaSuccess) {
    t.got_at_ms = now_ms();
    t.ms = t.got_at_ms - start;
    CHECK_CUDA(cudaFree(p));
  }
  cudaGetLastError();
  write_all(1, &t, sizeof t);
  return quiet_report();
}

/* The shim's path in LD_PRELOAD, as the harness set it. */
static char shim_preload[4096];

/* Starts `role` under the shim (or natively) with the settings given as
 * NAME=VALUE words (NULL-ended), which the child alone sees. */
static struct child start(const char *role, const char *arg, int shim, const char *const *settings) {
  char *saved[8] = {0};
  int n = 0;
  for (; settings && settings[n]; n++) {
    const char *eq = strchr(settings[n], '=');
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(eq - settings[n]), settings[n]);
    saved[n] = getenv(name) ? strdup(getenv(name)) : NULL;
    setenv(name, eq + 1, 1);
  }
  if (shim) setenv("LD_PRELOAD", shim_preload, 1);
  else unsetenv("LD_PRELOAD");
  struct child c = start_child("neighbours", role, arg);
  setenv("LD_PRELOAD", shim_preload, 1);
  for (int i = 0; i < n; i++) {
    const char *eq = strchr(settings[i], '=');
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(eq - settings[i]), settings[i]);
    if (saved[i]) setenv(name, saved[i], 1);
    else unsetenv(name);
    free(saved[i]);
  }
  return c;
}

/* A holder of HELD_MIB (`how`: "768", or "768e" to export a block) under
 * the shim, freed and idle once this returns; `last_free_ms`, if given, gets
 * when its last free returned. */
static struct child start_holder_as(const char *how, const char *const *settings, double *last_free_ms) {
  struct child c = start("holder", how, 1, settings);
  struct held h = {0, 0};
  read_all(c.from, &h, sizeof h);
  printf("# holder %d: the device's use after its frees: %llu MiB\n", (int)c.pid, (unsigned long long)(h.used / MiB));
  if (last_free_ms) *last_free_ms = h.last_free_ms;
  return c;
}

static struct child start_holder(const char *const *settings, double *last_free_ms) {
  return start_holder_as("768", settings, last_free_ms);
}

static struct taken take(int shim, double poll_ms) {
  char poll[32];
  snprintf(poll, sizeof poll, "TAKER_POLL_MS=%.0f", poll_ms);
  const char *settings[] = {poll, NULL};
  struct child c = start("taker", "700", shim, settings);
  struct taken t = {-1, -1, 0, -1, 0};
  read_all(c.from, &t, sizeof t);
  CHECK_EQ(finish_child(c), 0);
  printf("# taker (%s): first rc %d in %.1f ms, rc %d, succeeded after %.1f ms\n", shim ? "shim" : "native", t.first_rc,
         t.first_ms, t.rc, t.ms);
  return t;
}

static const char *const NO_DECAY_ALONE[] = {"SOMA_DECAY_MS=0", "SOMA_NEIGHBOURS=0", NULL};
static const char *const NO_DECAY[] = {"SOMA_DECAY_MS=0", NULL};

/* A holder with `settings`, then a native taker polling for `poll_ms` at
 * most; `after_free_ms` gets how long after the holder's last free it got
 * the memory. */
static struct taken taken_from_holder(const char *const *settings, double poll_ms, double *after_free_ms) {
  double last_free = 0;
  struct child h = start_holder(settings, &last_free);
  struct taken t = take(0, poll_ms);
  *after_free_ms = t.got_at_ms - last_free;
  printf("# the taker got it %.1f ms after the holder's last free\n", *after_free_ms);
  CHECK_EQ(finish_child(h), 0);
  return t;
}

static void decay(void) {
  const char *settings[] = {"SOMA_DECAY_MS=1000", "SOMA_IDLE_MS=0", "SOMA_NEIGHBOURS=0", NULL};
  double after_free = 0;
  struct taken t = taken_from_holder(settings, 6000, &after_free);
  printf("a native neighbour: out of memory at once: %s\n", t.first_rc != cudaSuccess ? "yes" : "no");
  printf("it succeeds once the delay has passed: %s\n", t.rc == cudaSuccess && after_free >= 1000 ? "yes" : "no");
}

static void idle(void) {
  const char *settings[] = {"SOMA_DECAY_MS=600000", "SOMA_IDLE_MS=50", "SOMA_NEIGHBOURS=0", NULL};
  double after_free = 0;
  struct taken t = taken_from_holder(settings, 60000, &after_free);
  printf("a native neighbour gets it once the holder has idled: %s\n", t.rc == cudaSuccess && after_free >= 50 ? "yes" : "no");
}

static void never(void) {
  struct child h = start_holder(NO_DECAY_ALONE, NULL);
  struct taken t = take(0, 1000);
  printf("with SOMA_DECAY_MS=0 the pool keeps it: %s\n", t.rc != cudaSuccess ? "yes" : "no");
  CHECK_EQ(finish_child(h), 0);
}

static void reclaim(void) {
  struct child h = start_holder(NO_DECAY, NULL);
  struct taken t = take(1, 0);
  printf("a neighbour under the shim gets it at once: %s\n",
         t.first_rc == cudaSuccess && t.first_ms < ASK_WAIT_MS + SLACK_MS ? "yes" : "no");
  CHECK_EQ(finish_child(h), 0);
}

/* Whether this user's socket directory holds a socket of process `pid`. */
static int has_socket(pid_t pid) {
  char dir[96], prefix[32];
  shim_socket_dir(dir, sizeof dir);
  snprintf(prefix, sizeof prefix, "%d-", (int)pid);
  DIR *d = opendir(dir);
  int found = 0;
  for (struct dirent *e; d && (e = readdir(d));) found |= strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  if (d) closedir(d);
  return found;
}

static void dead_and_stalled(void) {
  const char *small[] = {"SOMA_DECAY_MS=0", NULL};
  struct child dead = start("holder", "64", 1, small), stopped = start("holder", "64", 1, small);
  struct held held;
  read_all(dead.from, &held, sizeof held);
  read_all(stopped.from, &held, sizeof held);
  CHECK(has_socket(dead.pid));
  kill(dead.pid, SIGKILL);
  kill(stopped.pid, SIGSTOP);
  usleep(50000); /* dead, not reaped */
  struct child h = start_holder(NO_DECAY, NULL);
  struct taken t = take(1, 0);
  printf("beside a dead and a stopped neighbour, the taker succeeds within the bound: %s\n",
         t.first_rc == cudaSuccess && t.first_ms < ASK_WAIT_MS + SLACK_MS ? "yes" : "no");
  printf("the dead neighbour's socket removed: %s\n", has_socket(dead.pid) ? "no" : "yes");
  kill(stopped.pid, SIGCONT);
  CHECK_EQ(finish_child(h), 0);
  CHECK_EQ(finish_child(stopped), 0);
  CHECK_EQ(finish_child(dead), 128 + SIGKILL);
}

static void stalled(void) {
  struct child h = start_holder(NO_DECAY, NULL);
  kill(h.pid, SIGSTOP);
  struct taken t = take(1, 0);
  printf("a stopped holder: out of memory after the bound, not later: %s\n",
         t.first_rc != cudaSuccess && t.first_ms >= ASK_WAIT_MS * 0.9 && t.first_ms < ASK_WAIT_MS + SLACK_MS ? "yes" : "no");
  kill(h.pid, SIGCONT);
  CHECK_EQ(finish_child(h), 0);
}

static void apart(void) {
  struct child h = start_holder_as("768e", NO_DECAY_ALONE, NULL);
  printf("the holder serves CUDA IPC (it has a socket): %s\n", has_socket(h.pid) ? "yes" : "no");
  struct taken t = take(1, 0);
  printf("with SOMA_NEIGHBOURS=0 it keeps its cache: %s\n",
         t.first_rc != cudaSuccess && t.first_ms < ASK_WAIT_MS ? "yes" : "no");
  CHECK_EQ(finish_child(h), 0);
}

/* Process `pid`'s line of `somarun --ps --json` in `line` (empty if it is not listed). */
static void ps_line(pid_t pid, char *line, size_t size) {
  char command[4200], pid_key[32];
  snprintf(command, sizeof command, "%s --ps --json", getenv("SOMARUN"));
  snprintf(pid_key, sizeof pid_key, "{\"pid\": %d,", (int)pid);
  FILE *ps = popen(command, "r");
  int found = 0;
  while (ps && !found && fgets(line, (int)size, ps)) found = strncmp(line, pid_key, strlen(pid_key)) == 0;
  while (ps && fgetc(ps) != EOF) {
  }
  if (!found) line[0] = 0;
  if (ps) CHECK_EQ(pclose(ps), 0);
}

/* The first figure `name` in process `pid`'s line of `somarun --ps --json`
 * (device 0's, or its first library's; -1 if it is not listed). */
static long long ps_figure(pid_t pid, const char *name) {
  char line[8192], key[64];
  ps_line(pid, line, sizeof line);
  snprintf(key, sizeof key, "\"%s\": ", name);
  char *at = strstr(line, key);
  return at ? atoll(at + strlen(key)) : -1;
}

/* Whether `somarun --snapshot PID --json` made process `pid` write a snapshot
 * asked for, of its device, where the reply says. */
static int snapshot_written(pid_t pid) {
  char command[4200], reply[4096] = "", text[8192] = "";
  snprintf(command, sizeof command, "%s --snapshot %d --json", getenv("SOMARUN"), (int)pid);
  FILE *p = popen(command, "r");
  if (p && !fgets(reply, sizeof reply, p)) reply[0] = 0;
  if (p) CHECK_EQ(pclose(p), 0);
  const char *key = "\"snapshot\": \"";
  char *path = strstr(reply, key);
  if (!path) return 0;
  path += strlen(key);
  char *end = strchr(path, '"');
  if (end) *end = 0;
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = 0;
  return strstr(text, "\"format\": \"somashim-snapshot-1\"") && strstr(text, "\"reason\": \"asked\"") &&
         strstr(text, "\"pools\": [\n    {\"device\": 0,");
}

static void ps(void) {
  struct child h = start_holder(NO_DECAY, NULL);
  long long reserved = ps_figure(h.pid, "reserved"), in_use = ps_figure(h.pid, "in_use");
  printf("# --ps: reserved %lld, in use %lld\n", reserved, in_use);
  printf("somarun --ps lists the holder, with what it caches: %s\n", reserved >= (long long)(HELD_MIB * MiB) && in_use == 0 ? "yes" : "no");
  char line[8192];
  ps_line(h.pid, line, sizeof line);
  long long peak = ps_figure(h.pid, "peak");
  printf("# --ps: the first library's peak %lld\n", peak);
  printf("somarun --ps names the library that allocated it: %s\n",
         strstr(line, "\"libraries\": [{\"name\": \"neighbours\"") && peak >= (long long)(HELD_MIB * MiB) ? "yes" : "no");
  printf("somarun --snapshot makes it write a snapshot: %s\n", snapshot_written(h.pid) ? "yes" : "no");
  char command[4200];
  snprintf(command, sizeof command, "%s --trim %d >/dev/null", getenv("SOMARUN"), (int)h.pid);
  CHECK_EQ(system(command), 0);
  reserved = ps_figure(h.pid, "reserved");
  long long given = ps_figure(h.pid, "given_back");
  printf("# after --trim: reserved %lld, given back %lld\n", reserved, given);
  printf("somarun --trim gives it back: %s\n", reserved == 0 && given >= (long long)(HELD_MIB * MiB) ? "yes" : "no");
  struct taken t = take(0, 0);
  printf("then a native neighbour gets it at once: %s\n", t.first_rc == cudaSuccess ? "yes" : "no");
  CHECK_EQ(finish_child(h), 0);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "holder") == 0) return holder(argv[2]);
  if (argc == 3 && strcmp(argv[1], "taker") == 0) return taker(argv[2]);
  CHECK(under_shim());
  snprintf(shim_preload, sizeof shim_preload, "%s", getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
  char table[] = "/tmp/somashim-test-device-XXXXXX";
  int fd = mkstemp(table);
  CHECK(fd >= 0);
  close(fd);
  setenv("FAKECUDA_SHARED_MEMORY", table, 1);
  setenv("FAKECUDA_MEM_LIMIT", "1073741824", 1);
  const char *which = getenv("NEIGHBOURS_CASE");
  if (!which) which = "";
  if (strcmp(which, "decay") == 0) decay();
  else if (strcmp(which, "idle") == 0) idle();
  else if (strcmp(which, "never") == 0) never();
  else if (strcmp(which, "reclaim") == 0) reclaim();
  else if (strcmp(which, "dead_and_stalled") == 0) dead_and_stalled();
  else if (strcmp(which, "stalled") == 0) stalled();
  else if (strcmp(which, "apart") == 0) apart();
  else if (strcmp(which, "ps") == 0) ps();
  else CHECK(!"NEIGHBOURS_CASE is decay, idle, never, reclaim, dead_and_stalled, stalled, apart or ps");
  unlink(table);
  return report();
}
