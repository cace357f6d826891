/* Memory by library (SOMA_STATS' "device memory by library" table) on the
 * test double: the program allocates device memory itself and through three
 * shared objects it loads with dlopen, built from allocating_library.c into
 * LIBS_DIR: two libraries (liballoc_a.so, liballoc_b.so) and what stands for
 * a Python extension module in a package tree (PACKAGE_EXTENSION), which the
 * shim names by its path there. With SOMA_MAX_BYTES=16MiB the 32 MiB request
 * of liballoc_b.so goes to the real allocator. Blocks stay allocated at exit:
 * the runner reads the table the shim writes then.
 *   the program:    1 block of 5 MiB, and one of 1 MiB allocated and freed
 *   liballoc_a.so:  3 blocks of 2 MiB
 *   liballoc_b.so:  1 block of 1 MiB, and 32 MiB passed through
 *   the extension:  1 block of 3 MiB
 * FILL=1 (with FAKECUDA_MEM_LIMIT): then liballoc_a.so allocates blocks of
 * 8 MiB until one is refused, out of memory; with SOMA_SNAPSHOT the shim
 * writes its snapshot then, which the runner reads. */
#include "common.h"

#include <dlfcn.h>

typedef cudaError_t (*library_alloc_fn)(void **, size_t);

/* Below LIBS_DIR; the shim names it somepkg/sub/alloc.cpython-312-x86_64-linux-gnu.so. */
#define PACKAGE_EXTENSION "site-packages/somepkg/sub/alloc.cpython-312-x86_64-linux-gnu.so"

static library_alloc_fn load(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", getenv("LIBS_DIR") ? getenv("LIBS_DIR") : ".", name);
  void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(library != NULL);
  library_alloc_fn alloc = library ? (library_alloc_fn)dlsym(library, "library_alloc") : NULL;
  CHECK(alloc != NULL);
  return alloc;
}

int main(void) {
  CHECK_CUDA(cudaFree(NULL));
  library_alloc_fn alloc_a = load("liballoc_a.so"), alloc_b = load("liballoc_b.so");
  library_alloc_fn alloc_extension = load(PACKAGE_EXTENSION);
  if (!alloc_a || !alloc_b || !alloc_extension) return report();
  void *mine = NULL, *freed = NULL, *a[3] = {NULL}, *b = NULL, *big = NULL, *extension = NULL;
  CHECK_CUDA(cudaMalloc(&mine, 5 * MiB));
  CHECK_CUDA(cudaMalloc(&freed, MiB));
  CHECK_CUDA(cudaFree(freed));
  for (int i = 0; i < 3; i++) CHECK_CUDA(alloc_a(&a[i], 2 * MiB));
  CHECK_CUDA(alloc_b(&b, MiB));
  CHECK_CUDA(alloc_b(&big, 32 * MiB));
  CHECK_CUDA(alloc_extension(&extension, 3 * MiB));
  printf("allocated by the program, two libraries and a package's extension\n");
  if (env_flag("FILL", 0)) {
    void *more[64];
    int n = 0;
    cudaError_t rc = cudaSuccess;
    while (n < 64 && (rc = alloc_a(&more[n], 8 * MiB)) == cudaSuccess) n++;
    printf("liballoc_a.so filled the device: %s, rc=%d\n", n > 0 && n < 64 ? "yes" : "no", (int)rc);
    CHECK_EQ((int)cudaGetLastError(), (int)cudaErrorMemoryAllocation);
  }
  return report();
}
