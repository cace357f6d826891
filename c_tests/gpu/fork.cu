/* Issue 15, item 4 (the GPU side): processes made with fork, the simpleIPC
 * shape without IPC. The parent forks 3 children before any CUDA call; each
 * child initialises CUDA and allocates, fills (kernel), checks (kernel, and
 * every 10th block on the host) and frees 100 blocks, half of them on a
 * non-blocking stream, freed while the checking kernel still runs. Each child
 * writes its lines into a pipe of its own; the parent, meanwhile, does the
 * same CUDA work itself, then relays each child's lines and exit status in
 * child order (so stdout is the same in every run). Then, with CUDA
 * initialised in the parent, it forks one more child that makes no CUDA call
 * and leaves through exit() (atexit handlers run in it: it must not write the
 * parent's statistics or trace, nor touch CUDA).
 *
 * '# child I pid P cuda' / '# child pid P nocuda' lines name the children for
 * the runner's fork@stats check: under SOMA_STATS=<dir>/stats.txt and
 * SOMA_TRACE=<dir>/trace.csv the parent keeps the paths as given and each
 * child that used CUDA writes <path>.<pid>. The '# pooled' line counts the
 * parent's and the children's pointers. */
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>
#include "gpu_common.h"

enum { NCHILD = 3, NBLOCKS = 100 };

struct result {
  int blocks;
  unsigned long long dev_bad;
  size_t host_bad, failures;
};

/* The work, in a child or in the parent: NBLOCKS blocks. */
static struct result cuda_work(unsigned seed0) {
  struct result r = {0, 0, 0, 0};
  cudaStream_t nb;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  unsigned long long *dbad = NULL;
  CHECK_CUDA(TMALLOC(&dbad, sizeof *dbad));
  CHECK_CUDA(cudaMemset(dbad, 0, sizeof *dbad));
  CHECK_CUDA(cudaDeviceSynchronize());
  unsigned *host = NULL;
  CHECK_CUDA(cudaMallocHost(&host, 4 * MiB));
  int nblocks = gpu_quick() ? 20 : NBLOCKS;
  for (int i = 0; i < nblocks; i++) {
    size_t bytes = ((size_t)1 << (10 + i % 12)) + 4 * (size_t)(i % 7); /* 1 KiB .. 2 MiB */
    size_t n = bytes / 4;
    cudaStream_t s = i % 2 ? nb : (cudaStream_t)0;
    unsigned seed = seed0 + (unsigned)i;
    void *d = NULL;
    cudaError_t rc = TMALLOC(&d, bytes);
    if (rc != cudaSuccess || !d) {
      fprintf(stderr, "fork: block %d: cudaMalloc(%zu) rc=%d\n", i, bytes, (int)rc);
      r.failures++;
      continue;
    }
    if (i % 10 == 0) {
      size_t b = fill_and_verify(d, bytes, seed, s, host);
      if (b == (size_t)-1)
        r.failures++;
      else
        r.host_bad += b;
    } else {
      k_fill<<<grid_for(n, 256), 256, 0, s>>>((unsigned *)d, n, seed);
    }
    k_count_bad<<<grid_for(n, 256), 256, 0, s>>>((const unsigned *)d, n, seed, dbad, 20000ULL);
    if (cudaGetLastError() != cudaSuccess) r.failures++;
    if (cudaFree(d) != cudaSuccess) r.failures++; /* the check may still run */
    r.blocks++;
  }
  r.dev_bad = read_counter(dbad);
  CHECK_CUDA(cudaFree(dbad));
  CHECK_CUDA(cudaFreeHost(host));
  CHECK_CUDA(cudaStreamDestroy(nb));
  return r;
}

static void print_result(FILE *f, const char *who, struct result r) {
  fprintf(f, "%s: blocks=%d device_mismatches=%llu host_mismatches=%zu failures=%zu\n", who, r.blocks, r.dev_bad,
          r.host_bad, r.failures);
}

/* A child: stdout is its pipe. Leaves through exit(), so atexit handlers run. */
static void child_main(int idx) {
  CHECK_CUDA(cudaFree(NULL));
  struct result r = cuda_work(1000u * (unsigned)(idx + 1));
  CHECK(r.dev_bad == 0 && r.host_bad == 0 && r.failures == 0);
  CHECK_CUDA(cudaDeviceSynchronize());
  print_result(stdout, "work", r);
  print_pooled(); /* "# pooled N of M": the parent adds it to its own count */
  int rc = report();
  fflush(stdout);
  exit(rc);
}

int main(void) {
  pid_t pid[NCHILD];
  FILE *in[NCHILD];
  /* The children first, before any CUDA call in this process. */
  for (int c = 0; c < NCHILD; c++) {
    int fd[2];
    if (pipe(fd) != 0) {
      perror("pipe");
      return 1;
    }
    fflush(stdout);
    fflush(stderr);
    pid[c] = fork();
    if (pid[c] < 0) {
      perror("fork");
      return 1;
    }
    if (pid[c] == 0) {
      close(fd[0]);
      for (int k = 0; k < c; k++) fclose(in[k]); /* the earlier children's pipes */
      if (dup2(fd[1], 1) < 0) _exit(98);
      close(fd[1]);
      child_main(c);
    }
    close(fd[1]);
    in[c] = fdopen(fd[0], "r");
    CHECK(in[c] != NULL);
  }
  for (int c = 0; c < NCHILD; c++) printf("# child %d pid %d cuda\n", c, (int)pid[c]);

  /* The parent's own CUDA work, while the children run. */
  CHECK_CUDA(cudaFree(NULL));
  struct result pr = cuda_work(7u);

  /* The children's lines and exit status, in order. */
  for (int c = 0; c < NCHILD; c++) {
    char line[512];
    while (in[c] && fgets(line, sizeof line, in[c])) {
      int pooled = 0, allocs = 0;
      if (sscanf(line, "# pooled %d of %d", &pooled, &allocs) == 2) {
        __atomic_add_fetch(&g_pooled, pooled, __ATOMIC_RELAXED);
        __atomic_add_fetch(&g_allocs, allocs, __ATOMIC_RELAXED);
      }
      if (strncmp(line, "# ", 2) == 0)
        printf("# child %d: %s", c, line + 2);
      else
        printf("child %d: %s", c, line);
    }
    if (in[c]) fclose(in[c]);
    int status = 0;
    pid_t w;
    do {
      w = waitpid(pid[c], &status, 0);
    } while (w < 0 && errno == EINTR);
    int ok = w == pid[c] && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("child %d: exited=%d status=%d\n", c, w == pid[c] && WIFEXITED(status),
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(ok);
  }
  print_result(stdout, "parent", pr);
  CHECK(pr.dev_bad == 0 && pr.host_bad == 0 && pr.failures == 0);

  /* A child forked after CUDA is initialised here: no CUDA call, exit(). */
  CHECK_CUDA(cudaDeviceSynchronize());
  fflush(stdout);
  fflush(stderr);
  pid_t p = fork();
  if (p < 0) {
    perror("fork");
    return 1;
  }
  if (p == 0) exit(0);
  printf("# child pid %d nocuda\n", (int)p);
  int status = 0;
  pid_t w;
  do {
    w = waitpid(p, &status, 0);
  } while (w < 0 && errno == EINTR);
  printf("child forked after CUDA init (no CUDA, exit()): exited=%d status=%d\n", w == p && WIFEXITED(status),
         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  CHECK(w == p && WIFEXITED(status) && WEXITSTATUS(status) == 0);

  /* The parent still works after that child has gone. */
  unsigned *host = NULL;
  void *d = NULL;
  CHECK_CUDA(cudaMallocHost(&host, 1 * MiB));
  CHECK_CUDA(TMALLOC(&d, 1 * MiB));
  size_t bad = fill_and_verify(d, 1 * MiB, 4242, 0, host);
  printf("parent after the nocuda child: verified bad=%zu\n", bad);
  CHECK(bad == 0);
  CHECK_CUDA(cudaFree(d));
  CHECK_CUDA(cudaFreeHost(host));
  print_pooled();
  return report();
}
