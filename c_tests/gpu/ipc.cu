/* CUDA IPC on cudaMalloc memory: the parent allocates and fills a block, gets
 * an IPC handle and starts a child process (itself, "child HEX") that opens
 * the handle and checks the contents. Natively this works. Under the shim the
 * block is pool memory, which IPC cannot share: cudaIpcGetMemHandle fails and
 * the shim says so on stderr; with SOMA_PASSTHROUGH_CALLERS naming this
 * program, the block comes from the real allocator and IPC works again. */
#include "gpu_common.h"
#include <sys/wait.h>
#include <unistd.h>

static int child(const char *hex) {
  cudaIpcMemHandle_t h;
  for (size_t i = 0; i < sizeof h; i++) sscanf(hex + 2 * i, "%2hhx", &((unsigned char *)&h)[i]);
  void *p = NULL;
  cudaError_t r = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (r != cudaSuccess) {
    fprintf(stderr, "child: cudaIpcOpenMemHandle: %s\n", cudaGetErrorString(r));
    return 1;
  }
  static unsigned host[(1 << 20) / 4];
  CHECK_CUDA(cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost));
  size_t bad = count_bad_host(host, sizeof host / 4, 77);
  CHECK_CUDA(cudaIpcCloseMemHandle(p));
  return bad == 0 && check_failures == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "child") == 0) return child(argv[2]);
  CHECK_CUDA(cudaFree(NULL));
  void *p = NULL;
  CHECK_CUDA(TMALLOC(&p, 1 << 20));
  k_fill<<<64, 256>>>((unsigned *)p, (1 << 20) / 4, 77);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  cudaError_t r = cudaIpcGetMemHandle(&h, p);
  printf("cudaIpcGetMemHandle rc=%d\n", (int)r);
  if (r == cudaSuccess) {
    char hex[2 * sizeof h + 1];
    for (size_t i = 0; i < sizeof h; i++) sprintf(hex + 2 * i, "%02x", ((unsigned char *)&h)[i]);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      execl("/proc/self/exe", argv[0], "child", hex, (char *)NULL);
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child opened the handle and verified the block: %s\n",
           WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "yes" : "no");
  } else {
    cudaGetLastError();
  }
  CHECK_CUDA(cudaFree(p));
  print_pooled();
  return report();
}
