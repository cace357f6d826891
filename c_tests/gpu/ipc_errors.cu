/* The error codes and results of the CUDA IPC calls, as the real ones give
 * them: a handle of an interior pointer (the same as the base's), opening a
 * handle in the exporting process, an invalid flag, opening one handle twice
 * in a process (the same address, closed twice), a close too many, closing
 * an address that was never opened, a forged handle, an all-zero handle, a
 * NULL out-pointer, the handle of a block the exporter has freed, and the
 * handle of an exporter that has exited; two threads opening, reading and
 * closing one handle at once (a close must not unmap the other's open:
 * checked under the shim only, as the real driver fails it at times).
 * Every code is printed and compared with the native run. */
#include "ipc_common.h"

#define WORDS (64 * 1024)

static void show(const char *label, cudaError_t rc) {
  cudaError_t last = cudaGetLastError();
  printf("%s: rc=%d last=%d\n", label, (int)rc, (int)last);
}

#define ROUNDS 200

static cudaIpcMemHandle_t shared_handle;

/* Opens the handle, reads a word and closes it, ROUNDS times; the failures. */
static void *open_read_close(void *unused) {
  (void)unused;
  long failures = 0;
  for (int i = 0; i < ROUNDS; i++) {
    void *p = NULL;
    unsigned word = 0;
    failures += cudaIpcOpenMemHandle(&p, shared_handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess;
    if (p) {
      failures += cudaMemcpy(&word, (unsigned *)p + 7, sizeof word, cudaMemcpyDeviceToHost) != cudaSuccess;
      failures += word != pattern(5, 7);
      failures += cudaIpcCloseMemHandle(p) != cudaSuccess;
    }
  }
  return (void *)failures;
}

static int importer(const char *hex) {
  cudaIpcMemHandle_t h = handle_from_hex(hex);
  CHECK_CUDA(cudaFree(NULL));
  void *p = NULL, *q = NULL;
  show("open with an invalid flag", cudaIpcOpenMemHandle(&p, h, 2));
  show("open", cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  show("open the same handle again", cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess));
  printf("second open gives the same address: %s\n", p && p == q ? "yes" : "no");
  static unsigned host[WORDS];
  if (p) {
    CHECK_CUDA(cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost));
    printf("opened block holds the exporter's data: %s\n", count_bad_host(host, WORDS, 5) == 0 ? "yes" : "no");
  }
  show("close", cudaIpcCloseMemHandle(p));
  if (q) {
    CHECK_CUDA(cudaMemcpy(host, q, sizeof host, cudaMemcpyDeviceToHost));
    printf("still mapped after one of two closes: %s\n", count_bad_host(host, WORDS, 5) == 0 ? "yes" : "no");
  }
  show("close the second open", cudaIpcCloseMemHandle(q));
  show("close once too often", cudaIpcCloseMemHandle(p));
  show("close an address never opened", cudaIpcCloseMemHandle((void *)0x1000));
  cudaIpcMemHandle_t forged = h;
  for (size_t i = 16; i < sizeof forged; i++) forged.reserved[i] ^= 0x5a;
  show("open a forged handle", cudaIpcOpenMemHandle(&p, forged, cudaIpcMemLazyEnablePeerAccess));
  cudaIpcMemHandle_t zero;
  memset(&zero, 0, sizeof zero);
  show("open an all-zero handle", cudaIpcOpenMemHandle(&p, zero, cudaIpcMemLazyEnablePeerAccess));
  show("open with a NULL out-pointer", cudaIpcOpenMemHandle(NULL, h, cudaIpcMemLazyEnablePeerAccess));
  shared_handle = h;
  pthread_t other;
  void *theirs = NULL;
  CHECK(pthread_create(&other, NULL, open_read_close, NULL) == 0);
  long mine = (long)open_read_close(NULL);
  CHECK(pthread_join(other, &theirs) == 0);
  /* The real driver fails here itself at times (two of six native runs on
   * 2026-11-26 had failures): the native run is no reference for this part.
   * Under the shim every open, read and close must succeed. */
  long failures = mine + (long)theirs;
  int shim = under_shim();
  if (failures) fprintf(stderr, "two threads at once: %ld failures (%s)\n", failures, shim ? "shim" : "native");
  if (shim) CHECK(failures == 0);
  printf("two threads opening, reading and closing at once: done\n");
  cudaGetLastError();
  return check_failures == 0 ? 0 : 1;
}

/* Opens a handle whose block the exporter has freed. */
static int stale(const char *hex) {
  void *p = NULL;
  CHECK_CUDA(cudaFree(NULL));
  show("open the handle of a freed block", cudaIpcOpenMemHandle(&p, handle_from_hex(hex), cudaIpcMemLazyEnablePeerAccess));
  return check_failures == 0 ? 0 : 1;
}

/* Allocates, exports, prints the handle and exits without freeing. */
static int exiting_exporter(void) {
  void *p = NULL;
  CHECK_CUDA(TMALLOC(&p, WORDS * 4));
  cudaIpcMemHandle_t h;
  CHECK_CUDA(cudaIpcGetMemHandle(&h, p));
  char hex[2 * sizeof h + 1];
  handle_to_hex(&h, hex);
  printf("%s\n", hex);
  return check_failures == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "importer") == 0) return importer(argv[2]);
  if (argc == 3 && strcmp(argv[1], "stale") == 0) return stale(argv[2]);
  if (argc == 3 && strcmp(argv[1], "exporter") == 0) return exiting_exporter();
  CHECK_CUDA(cudaFree(NULL));
  void *p = NULL;
  CHECK_CUDA(TMALLOC(&p, WORDS * 4));
  k_fill<<<grid_for(WORDS, 1024), 256>>>((unsigned *)p, WORDS, 5);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h, interior, again;
  show("get a handle", cudaIpcGetMemHandle(&h, p));
  show("get a handle of an interior pointer", cudaIpcGetMemHandle(&interior, (char *)p + 4096));
  CHECK_CUDA(cudaIpcGetMemHandle(&again, p));
  printf("interior pointer's handle is the base's: %s\n", memcmp(&h, &interior, sizeof h) == 0 ? "yes" : "no");
  printf("a second export gives the same handle: %s\n", memcmp(&h, &again, sizeof h) == 0 ? "yes" : "no");
  show("get a handle of a host address", cudaIpcGetMemHandle(&again, (void *)0x1000));
  void *mine = (void *)0x1;
  show("open in the exporting process", cudaIpcOpenMemHandle(&mine, h, cudaIpcMemLazyEnablePeerAccess));
  printf("out-pointer left alone: %s\n", mine == (void *)0x1 ? "yes" : "no");

  char hex[2 * sizeof h + 1];
  handle_to_hex(&h, hex);
  printf("importer exit status %d\n", wait_child(start_child(argv[0], "importer", hex, -1, -1)));

  void *freed = NULL;
  CHECK_CUDA(TMALLOC(&freed, 4 * MiB)); /* a chunk of its own natively */
  cudaIpcMemHandle_t fh;
  CHECK_CUDA(cudaIpcGetMemHandle(&fh, freed));
  CHECK_CUDA(cudaFree(freed));
  CHECK_CUDA(cudaDeviceSynchronize());
  handle_to_hex(&fh, hex);
  printf("stale-handle importer exit status %d\n", wait_child(start_child(argv[0], "stale", hex, -1, -1)));

  int out[2];
  CHECK(pipe(out) == 0);
  pid_t exporter = start_child(argv[0], "exporter", "-", -1, out[1]);
  close(out[1]);
  char line[2 * sizeof h + 2] = {0};
  size_t got = 0;
  ssize_t n;
  while (got < 2 * sizeof h && (n = read(out[0], line + got, 2 * sizeof h - got)) > 0) got += (size_t)n;
  close(out[0]);
  printf("exporter exit status %d\n", wait_child(exporter));
  void *gone = NULL;
  if (got == 2 * sizeof h) {
    show("open the handle of an exited exporter", cudaIpcOpenMemHandle(&gone, handle_from_hex(line), cudaIpcMemLazyEnablePeerAccess));
  } else {
    printf("no handle from the exporter\n");
  }
  CHECK_CUDA(cudaFree(p));
  print_pooled();
  return report();
}
