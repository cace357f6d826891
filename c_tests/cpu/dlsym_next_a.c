/* Helper library for dlsym_next.c (libnext_a.so). */
#define _GNU_SOURCE
#include <dlfcn.h>
int next_probe_target(void) { return 1; }
void *next_probe_from_a(void) { return dlsym(RTLD_NEXT, "next_probe_target"); }
