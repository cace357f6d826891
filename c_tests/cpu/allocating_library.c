/* A shared library that allocates device memory for its caller: built twice
 * (liballoc_a.so, liballoc_b.so) for libraries.c, so that cudaMalloc is called
 * from two loaded objects besides the program. */
#include <cuda_runtime_api.h>
#include <stddef.h>

cudaError_t library_alloc(void **p, size_t size) { return cudaMalloc(p, size); }
