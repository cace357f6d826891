/* The lifetime of memory shared through CUDA IPC. (1) The exporter frees a
 * block while an importer still has it open, then allocates and overwrites
 * blocks of the same size: the importer must still read the exporter's data
 * (the memory is not reused while mapped elsewhere), then closes it.
 * (2) An importer exits without closing: the exporter frees the block and
 * goes on allocating and checking memory as before.
 * (3) The exporter frees a block a long kernel still writes, allocates one
 * of the same size at once (under the shim, with only blocking streams, the
 * same memory, reused in the legacy stream's order) and exports it: the
 * importer's writes must come after that kernel's (natively the free waited
 * for it), so the exporter finds them after syncing its own stream.
 * (4) After a device reset (the pool the importers were given is gone) a
 * new block is exported and an importer reads it. */
#include "ipc_common.h"

#define WORDS (1024 * 1024)
#define OVERWRITES 8

/* Opens the handle, says so, waits for the word to go on, then checks and closes. */
static int reader(const char *hex) {
  void *p = NULL;
  CHECK_CUDA(cudaIpcOpenMemHandle(&p, handle_from_hex(hex), cudaIpcMemLazyEnablePeerAccess));
  char byte = 'o';
  CHECK(write(1, &byte, 1) == 1);
  CHECK(read(0, &byte, 1) == 1);
  static unsigned host[WORDS];
  if (p) CHECK_CUDA(cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost));
  byte = p && count_bad_host(host, WORDS, 11) == 0 ? 'y' : 'n';
  if (p) CHECK_CUDA(cudaIpcCloseMemHandle(p));
  CHECK(write(1, &byte, 1) == 1);
  return check_failures == 0 ? 0 : 1;
}

/* Opens the handle, writes to the block and exits without closing it. */
static int leaver(const char *hex) {
  void *p = NULL;
  CHECK_CUDA(cudaIpcOpenMemHandle(&p, handle_from_hex(hex), cudaIpcMemLazyEnablePeerAccess));
  if (p) k_fill<<<grid_for(WORDS, 1024), 256>>>((unsigned *)p, WORDS, 12);
  CHECK_CUDA(cudaDeviceSynchronize());
  return check_failures == 0 ? 0 : 1;
}

/* Opens the handle, writes 13 everywhere, syncs, says so and closes. */
static int writer(const char *hex) {
  void *p = NULL;
  CHECK_CUDA(cudaIpcOpenMemHandle(&p, handle_from_hex(hex), cudaIpcMemLazyEnablePeerAccess));
  if (p) k_set<<<grid_for(WORDS, 1024), 256>>>((unsigned *)p, WORDS, 13);
  CHECK_CUDA(cudaDeviceSynchronize());
  char byte = 'w';
  CHECK(write(1, &byte, 1) == 1);
  if (p) CHECK_CUDA(cudaIpcCloseMemHandle(p));
  return check_failures == 0 ? 0 : 1;
}

/* Long enough to outlast the writer's start (its process and context). */
#define OLD_WORK_NS 3000000000ULL

static void *filled_block(unsigned seed) {
  void *p = NULL;
  CHECK_CUDA(TMALLOC(&p, WORDS * 4));
  if (p) k_fill<<<grid_for(WORDS, 1024), 256>>>((unsigned *)p, WORDS, seed);
  CHECK_CUDA(cudaDeviceSynchronize());
  return p;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "reader") == 0) return reader(argv[2]);
  if (argc == 3 && strcmp(argv[1], "leaver") == 0) return leaver(argv[2]);
  if (argc == 3 && strcmp(argv[1], "writer") == 0) return writer(argv[2]);
  CHECK_CUDA(cudaFree(NULL));
  static unsigned host[WORDS];
  char hex[2 * sizeof(cudaIpcMemHandle_t) + 1];

  void *busy = filled_block(10);
  k_write_until<<<grid_for(WORDS, 1024), 256>>>((unsigned *)busy, WORDS, 10, OLD_WORK_NS);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaFree(busy));
  void *fresh = NULL;
  CHECK_CUDA(TMALLOC(&fresh, WORDS * 4));
  cudaIpcMemHandle_t fresh_handle;
  CHECK_CUDA(cudaIpcGetMemHandle(&fresh_handle, fresh));
  handle_to_hex(&fresh_handle, hex);
  int from_writer[2];
  CHECK(pipe(from_writer) == 0);
  pid_t writer_pid = start_child(argv[0], "writer", hex, -1, from_writer[1]);
  close(from_writer[1]);
  char said = 0;
  CHECK(read(from_writer[0], &said, 1) == 1 && said == 'w');
  close(from_writer[0]);
  printf("writer exit status %d\n", wait_child(writer_pid));
  CHECK_CUDA(cudaStreamSynchronize(0));
  CHECK_CUDA(cudaMemcpy(host, fresh, sizeof host, cudaMemcpyDeviceToHost));
  size_t old_values = 0;
  for (size_t i = 0; i < WORDS; i++) old_values += host[i] != 13;
  printf("importer's writes after the exporter's earlier work on the memory: %s\n", old_values == 0 ? "yes" : "no");
  CHECK(old_values == 0);
  CHECK_CUDA(cudaFree(fresh));

  void *shared = filled_block(11);
  cudaIpcMemHandle_t h;
  CHECK_CUDA(cudaIpcGetMemHandle(&h, shared));
  handle_to_hex(&h, hex);
  int to_child[2], from_child[2];
  CHECK(pipe(to_child) == 0 && pipe(from_child) == 0);
  pid_t pid = start_child(argv[0], "reader", hex, to_child[0], from_child[1]);
  close(to_child[0]);
  close(from_child[1]);
  char byte = 0;
  CHECK(read(from_child[0], &byte, 1) == 1 && byte == 'o');
  CHECK_CUDA(cudaFree(shared));
  void *others[OVERWRITES];
  for (int i = 0; i < OVERWRITES; i++) others[i] = filled_block(200 + i);
  CHECK(write(to_child[1], "g", 1) == 1);
  CHECK(read(from_child[0], &byte, 1) == 1);
  printf("importer read the exporter's data after the exporter freed it: %s\n", byte == 'y' ? "yes" : "no");
  printf("reader exit status %d\n", wait_child(pid));
  int intact = 1;
  for (int i = 0; i < OVERWRITES; i++) {
    CHECK_CUDA(cudaMemcpy(host, others[i], sizeof host, cudaMemcpyDeviceToHost));
    intact &= count_bad_host(host, WORDS, 200 + i) == 0;
    CHECK_CUDA(cudaFree(others[i]));
  }
  printf("blocks allocated meanwhile intact: %s\n", intact ? "yes" : "no");

  void *left = filled_block(11);
  CHECK_CUDA(cudaIpcGetMemHandle(&h, left));
  handle_to_hex(&h, hex);
  printf("leaver exit status %d\n", wait_child(start_child(argv[0], "leaver", hex, -1, -1)));
  CHECK_CUDA(cudaMemcpy(host, left, sizeof host, cudaMemcpyDeviceToHost));
  printf("exporter sees the leaver's writes: %s\n", count_bad_host(host, WORDS, 12) == 0 ? "yes" : "no");
  CHECK_CUDA(cudaFree(left));
  int after = 1;
  for (int i = 0; i < OVERWRITES; i++) {
    void *p = filled_block(300 + i);
    CHECK_CUDA(cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost));
    after &= count_bad_host(host, WORDS, 300 + i) == 0;
    CHECK_CUDA(cudaFree(p));
  }
  printf("allocations after the leaver's exit correct: %s\n", after ? "yes" : "no");

  CHECK_CUDA(cudaDeviceReset());
  CHECK_CUDA(cudaFree(NULL)); /* the new primary context current (a driver-API build allocates through it) */
  void *renewed = filled_block(11);
  CHECK_CUDA(cudaIpcGetMemHandle(&h, renewed));
  handle_to_hex(&h, hex);
  CHECK(pipe(to_child) == 0 && pipe(from_child) == 0);
  pid = start_child(argv[0], "reader", hex, to_child[0], from_child[1]);
  close(to_child[0]);
  close(from_child[1]);
  byte = 0;
  CHECK(read(from_child[0], &byte, 1) == 1 && byte == 'o');
  CHECK(write(to_child[1], "g", 1) == 1);
  CHECK(read(from_child[0], &byte, 1) == 1);
  printf("importer read a block exported after a device reset: %s\n", byte == 'y' ? "yes" : "no");
  printf("reader after the reset exit status %d\n", wait_child(pid));
  CHECK_CUDA(cudaFree(renewed));
  CHECK_CUDA(cudaFree(NULL));
  print_pooled();
  return report();
}
