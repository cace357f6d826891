/* Shared by every C test program: CHECK prints file:line and the CUDA error
 * string, counts failures, and report() prints the summary the harness reads.
 * Lines starting with "# " are informational and not compared between the
 * native and the shim run. */
#ifndef SOMASHIM_CHECK_H
#define SOMASHIM_CHECK_H
#include <stdio.h>
#include <stdlib.h>

static int check_failures = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      check_failures++;                                                      \
    }                                                                        \
  } while (0)

/* A CUDA call that must succeed. */
#define CHECK_CUDA(call)                                                     \
  do {                                                                       \
    cudaError_t check_rc_ = (call);                                          \
    if (check_rc_ != cudaSuccess) {                                          \
      fprintf(stderr, "%s:%d: %s returned %d (%s)\n", __FILE__, __LINE__,    \
              #call, (int)check_rc_, cudaGetErrorString(check_rc_));         \
      check_failures++;                                                      \
    }                                                                        \
  } while (0)

/* A CUDA call whose exact return code matters: printed, so the native and the
 * shim run are compared on it. */
#define SHOW_RC(label, call)                                                 \
  printf("%s rc=%d\n", label, (int)(call))

static inline int report(void) {
  printf("# %s\n", check_failures ? "FAILED" : "OK");
  return check_failures ? 1 : 0;
}
#endif
