/* A shared object that allocates device memory for its caller: built three
 * times for libraries.c (liballoc_a.so, liballoc_b.so, and a Python
 * extension's name in a package tree), so that cudaMalloc is called from
 * three loaded objects besides the program. */
#include <cuda_runtime_api.h>
#include <stddef.h>

cudaError_t library_alloc(void **p, size_t size) { return cudaMalloc(p, size); }
