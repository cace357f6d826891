/* dlsym(RTLD_NEXT, ...) from a library must find the next definition after
 * that library, as without the shim, even though the shim wraps dlsym: the
 * classic interposer failure is to resolve RTLD_NEXT relative to the wrapper,
 * which hands the caller its own function back (infinite recursion in real
 * programs that wrap a function this way: public interposers' recorded
 * failures, docs/DESIGN.md). libnext_a.so and libnext_b.so both define
 * next_probe_target; a's probe asks for the next one and must get b's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "../check.h"

void *next_probe_from_a(void);    /* in libnext_a.so: dlsym(RTLD_NEXT, "next_probe_target") */
int next_probe_target(void);      /* a's (first in the search order) */
void *next_probe_b_address(void); /* in libnext_b.so: &next_probe_target as b sees its own */

int main(void) {
  void *got = next_probe_from_a();
  void *want = next_probe_b_address();
  printf("next_probe_target: a's is %s\n", next_probe_target() == 1 ? "first" : "not first");
  if (got != want) {
    Dl_info i;
    const char *where = got && dladdr(got, &i) && i.dli_fname ? i.dli_fname : "(null)";
    fprintf(stderr, "dlsym(RTLD_NEXT) from libnext_a gave %p in %s, want libnext_b's %p\n", got, where, want);
  }
  CHECK(got == want);
  CHECK(got != NULL);
  if (got) CHECK(((int (*)(void))got)() == 2);
  /* from the program itself, RTLD_NEXT skips the program */
  CHECK(dlsym(RTLD_NEXT, "next_probe_target") == (void *)&next_probe_target);
  return report();
}
