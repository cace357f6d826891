/* CUDA IPC of pool memory on the test double, under the shim (the double has
 * no legacy IPC: natively every IPC call refuses, so this runs under the shim
 * only). The protocol between two shims and the codes they give: a handle of
 * the shim's, the same for an interior pointer; 201 in the exporting process;
 * in a child (fork+exec): an invalid flag, open, a second open (the same
 * address), closes (one too many refused), a forged and an all-zero handle;
 * a held block: freed by the exporter while the child has it open, it is not
 * handed out again, and the shim frees it once the child has closed it; the
 * handle of a freed block; handles forged in the secret only (while the
 * child has the genuine one open), and one block's base with another's
 * secret; a child that exits without closing: the block it held is freed;
 * one held across a device reset, whose lease ends after it: nothing of the
 * new pool is freed; the handle of an exporter that has exited. A
 * program's child started after an import inherits no descriptor of the
 * pool (the double's export gives one without close-on-exec: /dev/null). */
#include "common.h"
#include "../ipc_hex.h"

#include <sys/wait.h>

static pid_t start(const char *role, const char *arg, int in, int out) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (in >= 0) dup2(in, 0);
    if (out >= 0) dup2(out, 1);
    execl("/proc/self/exe", "ipc", role, arg, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int finish(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#define EXPECT(call, code) CHECK((int)(call) == (code))

/* A child in `role` that has opened the handle(s) in `hex` and holds them
 * until told ('g') to go on; talks to the parent over two pipes. */
struct holder {
  pid_t pid;
  int to, from; /* the parent's ends */
};

/* Starts the child and returns once it says the block is open ('o'). */
static struct holder hold_open(const char *role, const char *hex) {
  int to_child[2], from_child[2];
  CHECK(pipe(to_child) == 0 && pipe(from_child) == 0);
  struct holder h = {start(role, hex, to_child[0], from_child[1]), to_child[1], from_child[0]};
  close(to_child[0]);
  close(from_child[1]);
  char byte = 0;
  CHECK(read(h.from, &byte, 1) == 1 && byte == 'o');
  return h;
}

/* Tells the child to go on, and returns its exit status. */
static int let_go(struct holder h) {
  CHECK(write(h.to, "g", 1) == 1);
  int status = finish(h.pid);
  close(h.to);
  close(h.from);
  return status;
}

/* Opens, checks the codes, holds the block until told, then closes it. */
static int importer(const char *hex) {
  cudaIpcMemHandle_t h = handle_from_hex(hex), other = handle_from_hex(hex + 2 * sizeof h);
  void *p = NULL, *q = NULL;
  EXPECT(cudaIpcOpenMemHandle(&p, h, 2), 1);
  EXPECT(cudaGetLastError(), 1);
  EXPECT(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), 0);
  EXPECT(cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess), 0);
  CHECK(p != NULL && p == q);
  cudaIpcMemHandle_t forged = h;
  for (size_t i = 16; i < sizeof forged; i++) forged.reserved[i] ^= 0x5a;
  void *r = (void *)0x1;
  EXPECT(cudaIpcOpenMemHandle(&r, forged, 0), 1);
  CHECK(r == (void *)0x1);
  forged = h;
  forged.reserved[40] ^= 1; /* the secret only: the exporter is reached and refuses */
  EXPECT(cudaIpcOpenMemHandle(&r, forged, 0), 1);
  forged = h;
  memcpy(forged.reserved + 32, other.reserved + 32, 32); /* another block's secret */
  EXPECT(cudaIpcOpenMemHandle(&r, forged, 0), 1);
  CHECK(r == (void *)0x1);
  memset(&forged, 0, sizeof forged);
  EXPECT(cudaIpcOpenMemHandle(&r, forged, 0), 1);
  EXPECT(cudaIpcCloseMemHandle(p), 0);
  char byte = 'o';
  CHECK(write(1, &byte, 1) == 1);
  CHECK(read(0, &byte, 1) == 1); /* the exporter has freed its block */
  EXPECT(cudaIpcCloseMemHandle(q), 0);
  EXPECT(cudaIpcCloseMemHandle(q), 1);
  EXPECT(cudaIpcCloseMemHandle((void *)0x1000), 1);
  return check_failures ? 1 : 0;
}

/* Opens the handle, says so, waits for the word to go on, exits without closing. */
static int leaver(const char *hex) {
  void *p = NULL;
  EXPECT(cudaIpcOpenMemHandle(&p, handle_from_hex(hex), 0), 0);
  char byte = 'o';
  CHECK(write(1, &byte, 1) == 1);
  CHECK(read(0, &byte, 1) == 1);
  return check_failures ? 1 : 0;
}

static int opener(const char *hex) {
  void *p = (void *)0x1;
  int rc = cudaIpcOpenMemHandle(&p, handle_from_hex(hex), 0);
  printf("%d\n", rc);
  return 0;
}

/* Prints how many descriptors above stderr this process inherited that
 * open /dev/null (the double's pool descriptors). */
static int inherited(void) {
  int count = 0;
  for (int fd = 3; fd < 1024; fd++) {
    char link[64], target[64] = {0};
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    count += readlink(link, target, sizeof target - 1) > 0 && strcmp(target, "/dev/null") == 0;
  }
  printf("%d\n", count);
  return 0;
}

static int exiting_exporter(void) {
  void *p = NULL;
  CHECK_CUDA(cudaMalloc(&p, MiB));
  cudaIpcMemHandle_t h;
  CHECK_CUDA(cudaIpcGetMemHandle(&h, p));
  char hex[129];
  handle_to_hex(&h, hex);
  printf("%s\n", hex);
  return check_failures ? 1 : 0;
}

/* The code a child gets opening `hex` (it prints it). */
static int open_in_child(const char *hex) {
  int out[2];
  CHECK(pipe(out) == 0);
  pid_t pid = start("opener", hex, -1, out[1]);
  close(out[1]);
  char line[16] = {0};
  CHECK(read(out[0], line, sizeof line - 1) > 0);
  close(out[0]);
  CHECK(finish(pid) == 0);
  return atoi(line);
}

/* How many /dev/null descriptors a child started now inherits. */
static int inherited_by_child(void) {
  int out[2];
  CHECK(pipe(out) == 0);
  pid_t pid = start("inherited", "-", -1, out[1]);
  close(out[1]);
  char count[16] = {0};
  CHECK(read(out[0], count, sizeof count - 1) > 0);
  close(out[0]);
  CHECK(finish(pid) == 0);
  return atoi(count);
}

/* A block of `size` bytes exported, opened by a child that exits without
 * closing it, and freed meanwhile: held until the child is gone, then freed.
 * `label` starts each line printed. */
static void leave_open_after_free(size_t size, const char *label) {
  void *block = NULL;
  cudaIpcMemHandle_t h;
  char hex[257];
  struct fakecuda_ptr_info info;
  CHECK_CUDA(cudaMalloc(&block, size));
  CHECK_CUDA(cudaIpcGetMemHandle(&h, block));
  handle_to_hex(&h, hex);
  struct holder leaver = hold_open("leaver", hex);
  CHECK_CUDA(cudaFree(block)); /* held: the leaver has it open */
  CHECK(fakecuda_ptr_info(block, &info) == 1);
  printf("%sleaver exit status %d\n", label, let_go(leaver));
  int freed = freed_once_released(block);
  printf("%sfreed once the importer exited without closing it: %s\n", label, freed ? "yes" : "no");
  CHECK(freed);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "importer") == 0) return importer(argv[2]);
  if (argc == 3 && strcmp(argv[1], "opener") == 0) return opener(argv[2]);
  if (argc == 3 && strcmp(argv[1], "leaver") == 0) return leaver(argv[2]);
  if (argc == 3 && strcmp(argv[1], "exporter") == 0) return exiting_exporter();
  if (argc == 3 && strcmp(argv[1], "inherited") == 0) return inherited();
  under_shim();
  int inherited_before = inherited_by_child();
  void *p = NULL;
  CHECK_CUDA(cudaMalloc(&p, MiB));
  cudaIpcMemHandle_t h, interior;
  CHECK_CUDA(cudaIpcGetMemHandle(&h, p));
  CHECK_CUDA(cudaIpcGetMemHandle(&interior, (char *)p + 4096));
  CHECK(memcmp(&h, &interior, sizeof h) == 0);
  void *self = (void *)0x1;
  EXPECT(cudaIpcOpenMemHandle(&self, h, 0), 201);
  EXPECT(cudaGetLastError(), 201);
  CHECK(self == (void *)0x1);

  void *other = NULL;
  cudaIpcMemHandle_t other_handle;
  CHECK_CUDA(cudaMalloc(&other, MiB));
  CHECK_CUDA(cudaIpcGetMemHandle(&other_handle, other));
  char hex[257];
  handle_to_hex(&h, hex);
  handle_to_hex(&other_handle, hex + 2 * sizeof h);
  struct holder importer_child = hold_open("importer", hex);
  int out[2];
  int pool_descriptors = inherited_by_child() - inherited_before;
  printf("pool descriptors a child inherits: %d\n", pool_descriptors);
  CHECK(pool_descriptors == 0);
  CHECK_CUDA(cudaFree(p));
  EXPECT(cudaFree(p), 1); /* held: still a double free */
  cudaGetLastError();
  struct fakecuda_ptr_info info;
  int reused = 0;
  void *others[8];
  for (int i = 0; i < 8; i++) {
    CHECK_CUDA(cudaMalloc(&others[i], MiB));
    reused |= others[i] == p;
  }
  CHECK(!reused);
  CHECK(fakecuda_ptr_info(p, &info) == 1); /* still allocated in its pool */
  printf("held while the importer has it open: %s\n", !reused && fakecuda_ptr_info(p, &info) ? "yes" : "no");
  printf("importer exit status %d\n", let_go(importer_child));
  for (int i = 0; i < 8; i++) CHECK_CUDA(cudaFree(others[i]));
  CHECK_CUDA(cudaFree(other));
  CHECK_CUDA(cudaDeviceSynchronize());
  int freed_then = freed_once_released(p);
  printf("freed once the importer closed it: %s\n", freed_then ? "yes" : "no");
  CHECK(freed_then);

  leave_open_after_free(MiB, "");
  /* A block too large for the small blocks' pool (SOMA_SMALL_BLOCKS, 4 MiB):
   * exported from the main pool, whose descriptor the server sends beside the
   * small pool's it sent for the blocks above. */
  leave_open_after_free(8 * MiB, "large block: ");

  /* A block held for an importer when the device is reset: it went with the
   * pool; the lease's end later must free nothing of the new pool's. */
  void *before_reset = NULL;
  CHECK_CUDA(cudaMalloc(&before_reset, MiB));
  CHECK_CUDA(cudaIpcGetMemHandle(&h, before_reset));
  handle_to_hex(&h, hex);
  struct holder across_reset = hold_open("leaver", hex);
  CHECK_CUDA(cudaFree(before_reset));
  CHECK_CUDA(cudaDeviceReset());
  void *after_reset = NULL;
  CHECK_CUDA(cudaMalloc(&after_reset, MiB));
  printf("leaver across a reset exit status %d\n", let_go(across_reset));
  int intact = 1;
  for (int attempt = 0; attempt < 20; attempt++) { /* the server sees the lease end on its own */
    void *next = NULL;
    CHECK_CUDA(cudaMalloc(&next, MiB));
    CHECK_CUDA(cudaDeviceSynchronize());
    intact &= fakecuda_ptr_info(after_reset, &info) == 1;
    CHECK_CUDA(cudaFree(next));
    usleep(10000);
  }
  printf("a block of the new pool intact when the lease ends: %s\n", intact ? "yes" : "no");
  CHECK(intact);
  CHECK_CUDA(cudaFree(after_reset));

  void *freed = NULL;
  CHECK_CUDA(cudaMalloc(&freed, 3 * MiB));
  CHECK_CUDA(cudaIpcGetMemHandle(&h, freed));
  CHECK_CUDA(cudaFree(freed));
  handle_to_hex(&h, hex);
  printf("open the handle of a freed block: %d\n", open_in_child(hex));

  CHECK(pipe(out) == 0);
  pid_t pid = start("exporter", "-", -1, out[1]);
  close(out[1]);
  char line[130] = {0};
  size_t got = 0;
  ssize_t n;
  while (got < 128 && (n = read(out[0], line + got, 128 - got)) > 0) got += (size_t)n;
  close(out[0]);
  printf("exporter exit status %d\n", finish(pid));
  void *gone = NULL;
  printf("open the handle of an exited exporter: %d\n", (int)cudaIpcOpenMemHandle(&gone, handle_from_hex(line), 0));
  cudaGetLastError();
  return report();
}
