/* Milliseconds on CLOCK_MONOTONIC: one clock for every process of the
 * machine, so that the processes of a test can compare their times. */
#ifndef SOMASHIM_CLOCK_MS_H
#define SOMASHIM_CLOCK_MS_H
#include <time.h>

static inline double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
#endif
