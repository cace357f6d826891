/* CUDA IPC in the shape of NVIDIA's simpleIPC sample: the parent allocates a
 * block with cudaMalloc and exports it with cudaIpcGetMemHandle; several
 * child processes open the handle (with cudaIpcMemLazyEnablePeerAccess),
 * each writes its own slice, and closes it; the parent checks every slice.
 * Under the shim the block is pool memory, shared through the shim's own
 * handles: the output must be the native one. */
#include "ipc_common.h"

#define CHILDREN 4
#define SLICE_WORDS (256 * 1024)

static int child(const char *arg) {
  int index = arg[0] - '0';
  cudaIpcMemHandle_t h = handle_from_hex(arg + 2);
  void *p = NULL;
  CHECK_CUDA(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  if (!p) return 1;
  unsigned *slice = (unsigned *)p + (size_t)index * SLICE_WORDS;
  k_fill<<<grid_for(SLICE_WORDS, 1024), 256>>>(slice, SLICE_WORDS, 100 + index);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaIpcCloseMemHandle(p));
  return check_failures == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "child") == 0) return child(argv[2]);
  CHECK_CUDA(cudaFree(NULL));
  const size_t words = (size_t)CHILDREN * SLICE_WORDS;
  void *p = NULL;
  CHECK_CUDA(TMALLOC(&p, words * 4));
  CHECK_CUDA(cudaMemset(p, 0, words * 4));
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  SHOW_RC("cudaIpcGetMemHandle", cudaIpcGetMemHandle(&h, p));
  char arg[2 + 2 * sizeof h + 1];
  handle_to_hex(&h, arg + 2);
  arg[1] = ':';
  pid_t pids[CHILDREN];
  for (int i = 0; i < CHILDREN; i++) {
    arg[0] = (char)('0' + i);
    pids[i] = start_child(argv[0], "child", arg, -1, -1);
  }
  for (int i = 0; i < CHILDREN; i++) printf("child %d exit status %d\n", i, wait_child(pids[i]));
  static unsigned host[SLICE_WORDS];
  for (int i = 0; i < CHILDREN; i++) {
    CHECK_CUDA(cudaMemcpy(host, (unsigned *)p + (size_t)i * SLICE_WORDS, sizeof host, cudaMemcpyDeviceToHost));
    printf("slice %d written by child %d: %s\n", i, i, count_bad_host(host, SLICE_WORDS, 100 + i) == 0 ? "yes" : "no");
  }
  CHECK_CUDA(cudaFree(p));
  print_pooled();
  return report();
}
