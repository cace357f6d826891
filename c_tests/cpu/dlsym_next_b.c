/* Helper library for dlsym_next.c (libnext_b.so), loaded after libnext_a.so. */
static int b_target(void) { return 2; }
int next_probe_target(void) __attribute__((alias("b_target")));
/* b's own definition (a plain &next_probe_target would bind to a's) */
void *next_probe_b_address(void) { return (void *)&b_target; }
