/* An IPC handle as 128 hex digits, to pass it to another process's argv
 * (CPU and GPU tests). */
#ifndef SOMASHIM_IPC_HEX_H
#define SOMASHIM_IPC_HEX_H
#include <stdio.h>
#include <cuda_runtime_api.h>

static inline void handle_to_hex(const cudaIpcMemHandle_t *h, char *hex) {
  for (size_t i = 0; i < sizeof *h; i++) sprintf(hex + 2 * i, "%02x", ((const unsigned char *)h)[i]);
}

static inline cudaIpcMemHandle_t handle_from_hex(const char *hex) {
  cudaIpcMemHandle_t h;
  for (size_t i = 0; i < sizeof h; i++) sscanf(hex + 2 * i, "%2hhx", &((unsigned char *)&h)[i]);
  return h;
}
#endif
