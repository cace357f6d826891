/* fork with SOMA_TRACE and SOMA_STATS: a forked child reports to files of its
 * own (<path>.<pid>), and neither process writes the other's events.
 *
 * The parent allocates and frees PARENT_PAIRS blocks of 1 MiB, forks, and
 * waits for the child, which allocates and frees CHILD_PAIRS blocks of 3 MiB
 * and exits (its exit handlers write its reports); then the parent does
 * PARENT_PAIRS more. The harness (scripts/cpu_test.sh) reads the files; the
 * "# parent"/"# child" lines give it the pids. */
#include "common.h"

#include <sys/wait.h>
#include <unistd.h>

#define PARENT_PAIRS 4
#define CHILD_PAIRS 3

static void pairs(int count, size_t size) {
  for (int i = 0; i < count; i++) {
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, size));
    CHECK_CUDA(cudaFree(p));
  }
}

int main(void) {
  under_shim();
  pairs(PARENT_PAIRS, MiB);
  printf("# parent %d\n", (int)getpid());
  fflush(stdout);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    printf("# child %d\n", (int)getpid());
    pairs(CHILD_PAIRS, 3 * MiB);
    exit(report());
  }
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  printf("child exit status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  pairs(PARENT_PAIRS, MiB);
  return report();
}
