/* Behaviour 6, a process that never uses CUDA (built without any CUDA
 * library): under the preload it prints nothing extra, loads no CUDA library
 * (not even when it looks CUDA names up), and its own dlopen/dlsym work as
 * without the shim. The harness also runs `/bin/true` and `sh -c` under the
 * preload and compares this program's output with its native run. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "../check.h"

static int maps_has(const char *needle) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[4096];
  int hit = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle)) hit = 1;
  fclose(f);
  return hit;
}

int main(void) {
  const char *mode = getenv("CPUTEST_MODE");
  int shim = mode && strcmp(mode, "shim") == 0;
  /* the preload is really there when it should be */
  const char *name = getenv("CPUTEST_SHIM_NAME"); /* the preload's file name */
  CHECK(maps_has(name && *name ? name : "somashim") == shim);
  CHECK(maps_has("libcuda") == 0);
  CHECK(maps_has("libcudart") == 0);

  /* looking CUDA names up does not load CUDA, and what a program probes to
   * see whether the driver is there is not there */
  CHECK(dlsym(RTLD_DEFAULT, "cuInit") == NULL);
  CHECK(dlsym(RTLD_DEFAULT, "cudaGetDeviceCount") == NULL);
  void *h0 = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(h0 == NULL);
  CHECK(maps_has("libcuda") == 0);
  /* driver entry points the preload itself defines (its driver door) fail
   * cleanly here: an error code, no crash, no output, nothing loaded */
  typedef int (*alloc_fn)(unsigned long long *, size_t);
  typedef int (*free_fn)(unsigned long long);
  typedef int (*gpa_fn)(const char *, void **, int, unsigned long long, int *);
  alloc_fn ma = (alloc_fn)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  free_fn mf = (free_fn)dlsym(RTLD_DEFAULT, "cuMemFree_v2");
  gpa_fn gpa = (gpa_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
  if (ma || mf || gpa) printf("# the preload defines cuMemAlloc_v2 %d, cuMemFree_v2 %d, cuGetProcAddress_v2 %d\n",
                              ma != NULL, mf != NULL, gpa != NULL);
  if (ma) {
    unsigned long long d = 0;
    CHECK(ma(&d, 16) != 0);
    CHECK(d == 0);
  }
  if (mf) CHECK(mf(0x1000) != 0);
  if (gpa) {
    void *fn = (void *)1;
    int status = 0;
    CHECK(gpa("cuInit", &fn, 12000, 0, &status) != 0);
    CHECK(fn == NULL || fn == (void *)1);
  }
  CHECK(maps_has("libcuda") == 0);

  /* ordinary lookups are untouched */
  void *m = dlsym(RTLD_DEFAULT, "malloc");
  CHECK(m != NULL && m == (void *)&malloc);
  void *h = dlopen("libm.so.6", RTLD_NOW);
  CHECK(h != NULL);
  if (h) {
    double (*cosine)(double) = (double (*)(double))dlsym(h, "cos");
    CHECK(cosine != NULL && cosine(0.0) == 1.0);
    CHECK(dlsym(h, "no_such_symbol_here") == NULL);
    CHECK(dlerror() != NULL); /* the failed lookup left its error */
    CHECK(dlerror() == NULL);
    dlclose(h);
  }
  void *v = dlvsym(RTLD_DEFAULT, "memcpy", "GLIBC_2.14");
  CHECK(v != NULL);
  CHECK(dlsym(RTLD_NEXT, "puts") == dlsym(RTLD_DEFAULT, "puts"));

  printf("hello from a program without CUDA\n");
  CHECK(maps_has("libcuda") == 0);
  return report();
}
