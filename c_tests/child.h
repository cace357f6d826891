/* A test program that plays several processes (CPU and GPU tests):
 * `start_child` runs this program again as `role`, its stdin and stdout on two
 * pipes whose other ends the parent keeps (close-on-exec: a child holding a
 * pipe's other end would never see EOF); `finish_child` closes them and gives
 * the exit status (or 128 + the signal that ended it); `read_all` and
 * `write_all` move whole buffers over them, `put_int` and `get_int` one int
 * (-1 once the other end closed); `fd_count` and `can_open_a_file`
 * tell how a process stands with its descriptors. */
#ifndef SOMASHIM_CHILD_H
#define SOMASHIM_CHILD_H
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

struct child {
  pid_t pid;
  int to, from; /* the parent's ends */
};

static inline struct child start_child(const char *program, const char *role, const char *arg) {
  int to_child[2], from_child[2];
  CHECK(pipe2(to_child, O_CLOEXEC) == 0 && pipe2(from_child, O_CLOEXEC) == 0);
  fflush(stdout);
  struct child c = {fork(), to_child[1], from_child[0]};
  CHECK(c.pid >= 0);
  if (c.pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    execl("/proc/self/exe", program, role, arg, (char *)NULL);
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  return c;
}

static inline int finish_child(struct child c) {
  close(c.to);
  close(c.from);
  if (c.pid <= 0) return -1; /* the fork failed: no child to wait for (not any other one) */
  int status = 0;
  pid_t waited;
  while ((waited = waitpid(c.pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (waited != c.pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static inline void read_all(int fd, void *bytes, size_t size) {
  for (size_t got = 0; got < size;) {
    ssize_t n = read(fd, (char *)bytes + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    CHECK(n > 0);
    if (n <= 0) return;
    got += (size_t)n;
  }
}

static inline void write_all(int fd, const void *bytes, size_t size) {
  for (size_t put = 0; put < size;) {
    ssize_t n = write(fd, (const char *)bytes + put, size - put);
    if (n < 0 && errno == EINTR) continue;
    CHECK(n > 0);
    if (n <= 0) return;
    put += (size_t)n;
  }
}

static inline void put_int(int fd, int v) {
  while (write(fd, &v, sizeof v) < 0 && errno == EINTR) {
  }
}

static inline int get_int(int fd) {
  int v = -1;
  ssize_t n;
  while ((n = read(fd, &v, sizeof v)) < 0 && errno == EINTR) {
  }
  return n == sizeof v ? v : -1;
}

/* The descriptors this process has open. */
static inline int fd_count(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n - 3; /* ".", "..", and the directory's own descriptor */
}

static inline int can_open_a_file(void) {
  int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  close(fd);
  return 1;
}
#endif
