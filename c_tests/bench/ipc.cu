/* CUDA IPC benchmark (scripts/bench_ipc.sh).
 *   ipc pools     alloc+free pairs on the legacy stream from a plain pool and
 *                 from a pool created shareable (POSIX file descriptor), in
 *                 one process, alternating, at 256 B and 1 MiB: what making
 *                 the shim's pool IPC-capable costs each allocation.
 *   ipc handles   export (cudaIpcGetMemHandle) of N blocks, then a child
 *                 (fork+exec) opens and closes each: host time per call.
 *                 Run natively and under the shim to compare with the real calls.
 * Prints one "name value unit" line per figure. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOCKS 64
static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

static double pair_us(CUmemoryPool pool, size_t size, int n) {
  CUdeviceptr p;
  double t = now_us();
  for (int i = 0; i < n; i++) { cuMemAllocFromPoolAsync(&p, size, pool, 0); cuMemFreeAsync(p, 0); }
  cuStreamSynchronize(0);
  return (now_us() - t) / n;
}

static int pools(void) {
  cudaFree(0);
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemoryPool plain, shareable;
  if (cuMemPoolCreate(&plain, &props)) return 1;
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (cuMemPoolCreate(&shareable, &props)) return 1;
  size_t sizes[2] = {256, 1 << 20};
  for (int s = 0; s < 2; s++) {
    double r[2][9];
    for (int rep = 0; rep < 9; rep++) {
      pair_us(plain, sizes[s], 1000);
      r[0][rep] = pair_us(plain, sizes[s], 20000);
      pair_us(shareable, sizes[s], 1000);
      r[1][rep] = pair_us(shareable, sizes[s], 20000);
    }
    qsort(r[0], 9, sizeof(double), cmp);
    qsort(r[1], 9, sizeof(double), cmp);
    printf("pool_pair_plain_%zu %.3f us\npool_pair_shareable_%zu %.3f us\n", sizes[s], r[0][4], sizes[s], r[1][4]);
  }
  return 0;
}

static int opener(const char *hexes) {
  cudaFree(0);
  cudaIpcMemHandle_t h[BLOCKS];
  void *p[BLOCKS];
  for (int b = 0; b < BLOCKS; b++)
    for (int i = 0; i < 64; i++) sscanf(hexes + 128 * b + 2 * i, "%2hhx", &((unsigned char *)&h[b])[i]);
  /* The first open of an exporter's memory also sets up what later ones
   * share (under the shim: the pool's import); it is shown on its own. */
  double open_us[BLOCKS], close_us[BLOCKS];
  for (int b = 0; b < BLOCKS; b++) {
    double t = now_us();
    if (cudaIpcOpenMemHandle(&p[b], h[b], cudaIpcMemLazyEnablePeerAccess)) return 1;
    open_us[b] = now_us() - t;
  }
  for (int b = 0; b < BLOCKS; b++) {
    double t = now_us();
    if (cudaIpcCloseMemHandle(p[b])) return 1;
    close_us[b] = now_us() - t;
  }
  printf("ipc_open_first %.1f us\n", open_us[0]);
  qsort(open_us + 1, BLOCKS - 1, sizeof(double), cmp);
  qsort(close_us, BLOCKS, sizeof(double), cmp);
  printf("ipc_open_median_of_the_rest %.1f us\nipc_close_median %.1f us\n", open_us[BLOCKS / 2], close_us[BLOCKS / 2]);
  return 0;
}

static int handles(const char *self) {
  cudaFree(0);
  void *p[BLOCKS];
  for (int b = 0; b < BLOCKS; b++) cudaMalloc(&p[b], 1 << 20);
  cudaIpcMemHandle_t h[BLOCKS];
  double t = now_us();
  for (int b = 0; b < BLOCKS; b++) cudaIpcGetMemHandle(&h[b], p[b]);
  double first = now_us();
  for (int b = 0; b < BLOCKS; b++) cudaIpcGetMemHandle(&h[b], p[b]);
  double again = now_us();
  printf("ipc_export_first %.2f us\nipc_export_again %.2f us\n", (first - t) / BLOCKS, (again - first) / BLOCKS);
  static char hex[128 * BLOCKS + 1];
  for (int b = 0; b < BLOCKS; b++)
    for (int i = 0; i < 64; i++) sprintf(hex + 128 * b + 2 * i, "%02x", ((unsigned char *)&h[b])[i]);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) { execl("/proc/self/exe", self, "opener", hex, (char *)NULL); _exit(127); }
  int status = 0;
  waitpid(pid, &status, 0);
  for (int b = 0; b < BLOCKS; b++) cudaFree(p[b]);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "opener")) return opener(argv[2]);
  if (argc == 2 && !strcmp(argv[1], "pools")) return pools();
  if (argc == 2 && !strcmp(argv[1], "handles")) return handles(argv[0]);
  fprintf(stderr, "usage: %s pools|handles\n", argv[0]);
  return 2;
}
