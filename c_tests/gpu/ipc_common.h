/* Shared by the CUDA IPC tests: handles as hex on a child's command line,
 * children started with fork+exec (never a fork that carries CUDA state on),
 * and a pipe to hear from or talk to them. */
#ifndef SOMASHIM_IPC_COMMON_H
#define SOMASHIM_IPC_COMMON_H
#include "gpu_common.h"
#include "../ipc_hex.h"
#include <sys/wait.h>
#include <unistd.h>

/* Starts this program again as "ROLE ARG" with stdin/stdout on the given
 * descriptors (-1: inherited); returns its pid. */
static inline pid_t start_child(const char *self, const char *role, const char *arg, int in, int out) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    if (in >= 0) dup2(in, 0);
    if (out >= 0) dup2(out, 1);
    execl("/proc/self/exe", self, role, arg, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* The child's exit status (128 + signal if it was killed). */
static inline int wait_child(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
#endif
