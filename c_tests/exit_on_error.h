/* For the benchmark and demo programs (not the tests, which count failures
 * with check.h): CK(call) runs a CUDA runtime call that must succeed, else
 * prints file:line, the call and the error string, and exits with status 1.
 * The runtime API header alone, so that gcc programs (the demo on the test
 * double) use it as nvcc's do. */
#ifndef SOMASHIM_EXIT_ON_ERROR_H
#define SOMASHIM_EXIT_ON_ERROR_H
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)
#endif
