/* Shared by every C test program: CHECK prints file:line and the CUDA error
 * string, counts failures, and report() prints the summary the harness reads.
 * Lines starting with "# " are informational and not compared between the
 * native and the shim run. */
#ifndef SOMASHIM_CHECK_H
#define SOMASHIM_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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

/* How long a test waits for the shim's thread to do something: generous (the
 * cache gives a block back after 1 s unused; the thread looks every 50 ms). A
 * test that passes waits only as long as the shim takes. */
#define SETTLE_MS 5000

/* Polls `cond` every millisecond until it holds or SETTLE_MS have passed;
 * its last value (checked by the caller). */
#define EVENTUALLY(cond)                                                   \
  ({                                                                       \
    int ok_ = 0;                                                           \
    for (int ms_ = 0; !(ok_ = !!(cond)) && ms_ < SETTLE_MS; ms_++) usleep(1000); \
    ok_;                                                                   \
  })

static inline int report(void) {
  printf("# %s\n", check_failures ? "FAILED" : "OK");
  return check_failures ? 1 : 0;
}
#endif
