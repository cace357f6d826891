/* Issue 15, item 1: every call the shim makes while a stream of the process
 * captures must be legal in every capture mode, on every path. The shape that
 * broke: NVIDIA's graphMemoryNodes sample begins a global-mode capture on a
 * non-blocking stream, creates another non-blocking stream inside the captured
 * region and calls cudaMallocAsync on the captured stream; natively it passes,
 * under the shim "waiting for the legacy stream failed: CuError(900)" and then
 * 901.
 *
 * Single thread: for each situation (the capture on a non-blocking stream; on
 * a blocking stream while a non-blocking stream lives; on a blocking stream
 * while the process has no non-blocking stream at all, so the shim frees on
 * the legacy stream) x capture mode (global, thread_local, relaxed) x pending
 * frees when the capture begins (none; 4 blocks of 96 MiB freed while kernels
 * still write them: more than SOMA_PENDING_FREE_LIMIT's default, so the next
 * allocation reclaims) x path (nothing; cudaStreamCreate non-blocking and
 * blocking; cudaStreamDestroy of an idle non-blocking and blocking stream made
 * before the capture; cudaMalloc; cudaFree of a block from before the capture;
 * cudaMallocAsync + kernel + cudaFreeAsync on the captured stream; the
 * graphMemoryNodes shape; cudaMalloc of the device's whole memory, the
 * out-of-memory path; cudaFreeHost of pinned memory from before the
 * capture): every call inside the capture prints its return code,
 * cudaGetLastError after it and cudaStreamIsCapturing of the capturing stream
 * after it; then cudaStreamEndCapture's code, and where a graph came out,
 * whether it instantiates, launches and ran. Everything is printed as codes,
 * so the native and the shim run are compared call by call.
 *
 * Two threads: thread A captures (each mode, non-blocking and blocking
 * stream, frees pending) while thread B calls cudaMalloc, cudaFree,
 * cudaStreamCreate, cudaStreamDestroy, an impossible cudaMalloc and
 * cudaMallocAsync/cudaFreeAsync on its own stream; B's codes are printed.
 *
 * --exit-capturing MODE [blocking]: frees pending, a block left allocated,
 * then a capture in MODE (on a non-blocking stream, or a blocking one) that
 * is never ended: the process exits while it captures, so whatever the shim
 * does at exit (SOMA_STATS, the reclaim of pending frees) runs during a
 * capture. */
#include "gpu_common.h"

enum { SIT_NO_NB, SIT_NB, SIT_BLOCKING, NSIT };
static const char *sit_name[NSIT] = {"blocking-stream-no-nonblocking-streams", "nonblocking-stream",
                                     "blocking-stream"};
static const char *mode_name[3] = {"global", "thread_local", "relaxed"};
static const cudaStreamCaptureMode mode_val[3] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                                  cudaStreamCaptureModeRelaxed};
enum {
  P_NOTHING,
  P_CREATE_NB,
  P_CREATE_BLOCKING,
  P_DESTROY_NB,
  P_DESTROY_BLOCKING,
  P_MALLOC,
  P_FREE,
  P_MALLOC_ASYNC,
  P_GRAPH_MEMORY_NODES,
  P_OOM,
  P_FREE_HOST,
  NPATHS
};
static const char *path_name[NPATHS] = {"nothing",    "create-nonblocking-stream", "create-blocking-stream",
                                        "destroy-nonblocking-stream", "destroy-blocking-stream",
                                        "cudaMalloc", "cudaFree",
                                        "cudaMallocAsync+cudaFreeAsync", "graphMemoryNodes-shape",
                                        "cudaMalloc-out-of-memory", "cudaFreeHost"};

static unsigned *g_out;     /* out[0] = 42 first in the graph, out[1] = the new block's value, out[2] = 43 last */
static cudaStream_t g_bg;   /* the non-blocking stream the pending frees' kernels run on (NULL: none) */
static size_t g_total;      /* the device's memory: an allocation that cannot succeed */
static size_t g_pending_bytes;
static const size_t ASYNC_BYTES = 64 * KiB;

/* ---- one call inside a capture: its code, the last error, the capture status */
static void show(cudaStream_t cap, const char *what, cudaError_t rc, const char *extra) {
  cudaError_t last = cudaGetLastError();
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t ic = cudaStreamIsCapturing(cap, &st);
  cudaError_t last2 = cudaGetLastError();
  printf("  %s rc=%d%s last=%d is_capturing_rc=%d status=%d last_after_query=%d\n", what, (int)rc,
         extra ? extra : "", (int)last, (int)ic, (int)st, (int)last2);
}

/* Blocks freed while kernels still write them: under the shim their frees
 * are pending (not yet passed by the GPU) when the capture begins. With no
 * non-blocking stream in the process, the kernels run on the legacy stream. */
static void make_pending(int on_legacy) {
  cudaStream_t bs = on_legacy ? (cudaStream_t)0 : g_bg;
  size_t n = g_pending_bytes / 4;
  for (int j = 0; j < 4; j++) {
    unsigned *x = NULL;
    CHECK_CUDA(TMALLOC(&x, g_pending_bytes));
    k_write_until<<<64, 256, 0, bs>>>(x, n, 0xabcd0000u + (unsigned)j, 2000000ULL);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaFree(x));
  }
}

/* After a graph came out of the capture: instantiate, launch, check. */
static void run_graph(cudaStream_t s, cudaGraph_t g, int want_block) {
  cudaGraphExec_t ge = NULL;
  cudaError_t ri = cudaGraphInstantiate(&ge, g, 0);
  cudaError_t rl = ri == cudaSuccess ? cudaGraphLaunch(ge, s) : ri;
  cudaError_t rs = cudaStreamSynchronize(s);
  cudaError_t le = cudaGetLastError();
  unsigned h[4] = {0, 0, 0, 0};
  CHECK_CUDA(cudaMemcpy(h, g_out, sizeof h, cudaMemcpyDeviceToHost));
  printf("  graph instantiate=%d launch=%d sync=%d last=%d ran_first=%d ran_last=%d new_block=%s\n", (int)ri,
         (int)rl, (int)rs, (int)le, h[0] == 42, h[2] == 43, want_block ? (h[1] == 5 ? "used" : "NOT-USED") : "none");
  CHECK(ri == cudaSuccess && rl == cudaSuccess && rs == cudaSuccess && h[0] == 42 && h[2] == 43);
  if (want_block) CHECK(h[1] == 5);
  if (ge) CHECK_CUDA(cudaGraphExecDestroy(ge));
}

static void one_case(int sit, int mode, int pend, int path) {
  cudaStream_t s = NULL, victim = NULL, made = NULL;
  cudaEvent_t e1 = NULL, e2 = NULL;
  void *pre = NULL, *p = NULL, *pinned = NULL;
  int want_block = 0;
  char extra[64];

  CHECK_CUDA(cudaStreamCreateWithFlags(&s, sit == SIT_NB ? cudaStreamNonBlocking : cudaStreamDefault));
  CHECK_CUDA(TMALLOC(&pre, 1 * MiB));
  if (path == P_FREE_HOST) CHECK_CUDA(cudaMallocHost(&pinned, 64 * KiB));
  if (path == P_GRAPH_MEMORY_NODES) {
    CHECK_CUDA(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
  }
  if (path == P_DESTROY_BLOCKING) CHECK_CUDA(cudaStreamCreate(&victim));
  CHECK_CUDA(cudaMemset(g_out, 0, 4 * sizeof(unsigned)));
  CHECK_CUDA(cudaDeviceSynchronize());
  if (pend) make_pending(sit == SIT_NO_NB);
  /* Made after the frees (in the no-non-blocking-streams situation, the
   * frees then went to the legacy stream). */
  if (path == P_DESTROY_NB) CHECK_CUDA(cudaStreamCreateWithFlags(&victim, cudaStreamNonBlocking));
  (void)cudaGetLastError();

  printf("case situation=%s mode=%s pending=%s path=%s\n", sit_name[sit], mode_name[mode], pend ? "yes" : "no",
         path_name[path]);
  show(s, "cudaStreamBeginCapture", cudaStreamBeginCapture(s, mode_val[mode]), NULL);
  k_set<<<1, 1, 0, s>>>(g_out, 1, 42);
  show(s, "launch k_set(out[0])", cudaPeekAtLastError(), NULL);

  cudaError_t rc;
  switch (path) {
    case P_NOTHING:
      break;
    case P_CREATE_NB:
      rc = cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking);
      snprintf(extra, sizeof extra, " stream=%s", nn(made));
      show(s, "cudaStreamCreateWithFlags(NonBlocking)", rc, extra);
      break;
    case P_CREATE_BLOCKING:
      rc = cudaStreamCreate(&made);
      snprintf(extra, sizeof extra, " stream=%s", nn(made));
      show(s, "cudaStreamCreate", rc, extra);
      break;
    case P_DESTROY_NB:
    case P_DESTROY_BLOCKING:
      rc = cudaStreamDestroy(victim);
      show(s, path == P_DESTROY_NB ? "cudaStreamDestroy(idle nonblocking)" : "cudaStreamDestroy(idle blocking)", rc,
           NULL);
      if (rc == cudaSuccess) victim = NULL;
      break;
    case P_MALLOC:
      rc = cudaMalloc(&p, 4096); /* counted after the capture */
      snprintf(extra, sizeof extra, " p=%s", nn(p));
      show(s, "cudaMalloc(4096)", rc, extra);
      if (rc == cudaSuccess && p) {
        want_block = 1;
        k_set<<<1, 1, 0, s>>>((unsigned *)p, 1, 5);
        k_xform<<<1, 1, 0, s>>>((const unsigned *)p, g_out + 1, 1, 0);
        show(s, "launch k_set+k_xform(new block)", cudaPeekAtLastError(), NULL);
      }
      break;
    case P_FREE:
      rc = cudaFree(pre);
      show(s, "cudaFree(block from before)", rc, NULL);
      if (rc == cudaSuccess) pre = NULL;
      break;
    case P_FREE_HOST:
      rc = cudaFreeHost(pinned);
      show(s, "cudaFreeHost(pinned block from before)", rc, NULL);
      if (rc == cudaSuccess) pinned = NULL;
      break;
    case P_MALLOC_ASYNC: {
      void *q = NULL;
      rc = cudaMallocAsync(&q, ASYNC_BYTES, s);
      snprintf(extra, sizeof extra, " p=%s", nn(q));
      show(s, "cudaMallocAsync(captured stream)", rc, extra);
      if (rc == cudaSuccess && q) {
        want_block = 1;
        k_set<<<1, 1, 0, s>>>((unsigned *)q, 1, 5);
        k_xform<<<1, 1, 0, s>>>((const unsigned *)q, g_out + 1, 1, 0);
        show(s, "launch k_set+k_xform(new block)", cudaPeekAtLastError(), NULL);
        show(s, "cudaFreeAsync(captured stream)", cudaFreeAsync(q, s), NULL);
      }
      break;
    }
    case P_GRAPH_MEMORY_NODES: {
      void *q = NULL;
      rc = cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking);
      snprintf(extra, sizeof extra, " stream=%s", nn(made));
      show(s, "cudaStreamCreateWithFlags(NonBlocking)", rc, extra);
      rc = cudaMallocAsync(&q, ASYNC_BYTES, s);
      snprintf(extra, sizeof extra, " p=%s", nn(q));
      show(s, "cudaMallocAsync(captured stream)", rc, extra);
      if (made && q && rc == cudaSuccess) {
        want_block = 1;
        show(s, "cudaEventRecord(captured stream)", cudaEventRecord(e1, s), NULL);
        show(s, "cudaStreamWaitEvent(new stream)", cudaStreamWaitEvent(made, e1, 0), NULL);
        k_set<<<1, 1, 0, made>>>((unsigned *)q, 1, 5);
        k_xform<<<1, 1, 0, made>>>((const unsigned *)q, g_out + 1, 1, 0);
        show(s, "launch k_set+k_xform(new block, new stream)", cudaPeekAtLastError(), NULL);
        show(s, "cudaEventRecord(new stream)", cudaEventRecord(e2, made), NULL);
        show(s, "cudaStreamWaitEvent(captured stream)", cudaStreamWaitEvent(s, e2, 0), NULL);
        show(s, "cudaFreeAsync(captured stream)", cudaFreeAsync(q, s), NULL);
      } else {
        printf("  (stream or block missing: the rest of the shape left out)\n");
      }
      break;
    }
    case P_OOM:
      p = (void *)1;
      rc = cudaMalloc(&p, g_total);
      snprintf(extra, sizeof extra, " p=%s", nn(p));
      show(s, "cudaMalloc(device memory size)", rc, extra);
      if (rc != cudaSuccess) p = NULL;
      break;
  }

  k_set<<<1, 1, 0, s>>>(g_out + 2, 1, 43);
  show(s, "launch k_set(out[2])", cudaPeekAtLastError(), NULL);
  cudaGraph_t g = NULL;
  rc = cudaStreamEndCapture(s, &g);
  snprintf(extra, sizeof extra, " graph=%s", nn(g));
  show(s, "cudaStreamEndCapture", rc, extra);
  if (rc == cudaSuccess && g) run_graph(s, g, want_block);
  if (g) CHECK_CUDA(cudaGraphDestroy(g));
  (void)cudaGetLastError();

  /* Clean up outside the capture; the codes that depend on what happened
   * inside it are printed. */
  CHECK_CUDA(cudaDeviceSynchronize());
  if (p) {
    note_alloc(p);
    cudaError_t r = cudaFree(p);
    printf("  after: cudaFree(block from the capture) rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  }
  if (pre) {
    cudaError_t r = cudaFree(pre);
    printf("  after: cudaFree(block from before) rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  }
  if (pinned) {
    cudaError_t r = cudaFreeHost(pinned);
    printf("  after: cudaFreeHost(pinned block from before) rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  }
  if (made) {
    cudaError_t r = cudaStreamDestroy(made);
    printf("  after: cudaStreamDestroy(stream from the capture) rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  }
  if (victim) {
    cudaError_t r = cudaStreamDestroy(victim);
    printf("  after: cudaStreamDestroy(stream from before) rc=%d last=%d\n", (int)r, (int)cudaGetLastError());
  }
  if (e1) CHECK_CUDA(cudaEventDestroy(e1));
  if (e2) CHECK_CUDA(cudaEventDestroy(e2));
  CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_CUDA(cudaDeviceSynchronize());
  printf("  after: last=%d\n", (int)cudaGetLastError());
}

/* ---- thread A captures, thread B allocates ------------------------------ */
enum { B_MALLOC, B_FREE_BEFORE, B_FREE_NEW, B_CREATE_NB, B_CREATE_BLOCKING, B_DESTROY_NB, B_OOM, B_MALLOC_ASYNC,
       B_FREE_ASYNC, NBOPS };
static const char *bop_name[NBOPS] = {"cudaMalloc(64 KiB)",
                                      "cudaFree(block from before)",
                                      "cudaFree(block from the cudaMalloc above)",
                                      "cudaStreamCreateWithFlags(NonBlocking)",
                                      "cudaStreamCreate",
                                      "cudaStreamDestroy(idle nonblocking)",
                                      "cudaMalloc(device memory size)",
                                      "cudaMallocAsync(own stream)",
                                      "cudaFreeAsync(own stream)"};
struct bstate {
  pthread_barrier_t *bar;
  cudaError_t rc[NBOPS], last[NBOPS];
  int nonnull[NBOPS];
  void *pre, *p, *huge, *q;
  cudaStream_t own, victim, made_nb, made_b;
};

static void *thread_b(void *arg) {
  struct bstate *b = (struct bstate *)arg;
  CHECK_CUDA(cudaFree(NULL)); /* the context current in this thread */
  CHECK_CUDA(TMALLOC(&b->pre, 1 * MiB));
  CHECK_CUDA(cudaStreamCreateWithFlags(&b->own, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&b->victim, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamSynchronize(b->own));
  (void)cudaGetLastError();
  pthread_barrier_wait(b->bar); /* 1: set up */
  pthread_barrier_wait(b->bar); /* 2: A captures */
  for (int op = 0; op < NBOPS; op++) {
    cudaError_t rc = cudaSuccess;
    int nonnull = -1;
    switch (op) {
      case B_MALLOC:
        rc = cudaMalloc(&b->p, 64 * KiB);
        nonnull = b->p != NULL;
        break;
      case B_FREE_BEFORE:
        rc = cudaFree(b->pre);
        if (rc == cudaSuccess) b->pre = NULL;
        break;
      case B_FREE_NEW:
        if (!b->p) {
          rc = (cudaError_t)-1; /* nothing to free: not called */
          break;
        }
        rc = cudaFree(b->p); /* (not counted: no driver query during the capture) */
        if (rc == cudaSuccess) b->p = NULL;
        break;
      case B_CREATE_NB:
        rc = cudaStreamCreateWithFlags(&b->made_nb, cudaStreamNonBlocking);
        nonnull = b->made_nb != NULL;
        break;
      case B_CREATE_BLOCKING:
        rc = cudaStreamCreate(&b->made_b);
        nonnull = b->made_b != NULL;
        break;
      case B_DESTROY_NB:
        rc = cudaStreamDestroy(b->victim);
        if (rc == cudaSuccess) b->victim = NULL;
        break;
      case B_OOM:
        b->huge = (void *)1;
        rc = cudaMalloc(&b->huge, g_total);
        nonnull = b->huge != NULL;
        if (rc != cudaSuccess) b->huge = NULL;
        break;
      case B_MALLOC_ASYNC:
        rc = cudaMallocAsync(&b->q, 64 * KiB, b->own);
        nonnull = b->q != NULL;
        break;
      case B_FREE_ASYNC:
        if (!b->q) {
          rc = (cudaError_t)-1;
          break;
        }
        rc = cudaFreeAsync(b->q, b->own);
        if (rc == cudaSuccess) b->q = NULL;
        break;
    }
    b->rc[op] = rc;
    b->nonnull[op] = nonnull;
    b->last[op] = cudaGetLastError();
  }
  pthread_barrier_wait(b->bar); /* 3: done, A ends its capture */
  pthread_barrier_wait(b->bar); /* 4: A has ended it: clean up */
  CHECK_CUDA(cudaDeviceSynchronize());
  (void)cudaGetLastError();
  if (b->p) {
    note_alloc(b->p);
    CHECK_CUDA(cudaFree(b->p));
  }
  if (b->pre) CHECK_CUDA(cudaFree(b->pre));
  if (b->huge) CHECK_CUDA(cudaFree(b->huge));
  if (b->q) CHECK_CUDA(cudaFreeAsync(b->q, b->own));
  if (b->made_nb) CHECK_CUDA(cudaStreamDestroy(b->made_nb));
  if (b->made_b) CHECK_CUDA(cudaStreamDestroy(b->made_b));
  if (b->victim) CHECK_CUDA(cudaStreamDestroy(b->victim));
  CHECK_CUDA(cudaStreamSynchronize(b->own));
  CHECK_CUDA(cudaStreamDestroy(b->own));
  CHECK_CUDA(cudaDeviceSynchronize());
  (void)cudaGetLastError();
  return NULL;
}

static void two_thread_case(int mode, int nonblocking) {
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  struct bstate b;
  memset(&b, 0, sizeof b);
  b.bar = &bar;
  cudaStream_t s = NULL;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, nonblocking ? cudaStreamNonBlocking : cudaStreamDefault));
  CHECK_CUDA(cudaMemset(g_out, 0, 4 * sizeof(unsigned)));
  CHECK_CUDA(cudaDeviceSynchronize());
  pthread_t t;
  CHECK(pthread_create(&t, NULL, thread_b, &b) == 0);
  pthread_barrier_wait(&bar); /* 1 */
  make_pending(0);
  (void)cudaGetLastError();
  cudaError_t rb = cudaStreamBeginCapture(s, mode_val[mode]);
  k_set<<<1, 1, 0, s>>>(g_out, 1, 42);
  cudaError_t rk = cudaPeekAtLastError();
  (void)cudaGetLastError();
  pthread_barrier_wait(&bar); /* 2 */
  pthread_barrier_wait(&bar); /* 3 */
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t ic = cudaStreamIsCapturing(s, &st);
  cudaError_t la = cudaGetLastError();
  k_set<<<1, 1, 0, s>>>(g_out + 2, 1, 43);
  cudaError_t rk2 = cudaPeekAtLastError();
  (void)cudaGetLastError();
  cudaGraph_t g = NULL;
  cudaError_t re = cudaStreamEndCapture(s, &g);
  cudaError_t le = cudaGetLastError();
  printf("two threads: A captures mode=%s stream=%s (frees pending), B calls:\n", mode_name[mode],
         nonblocking ? "nonblocking" : "blocking");
  for (int op = 0; op < NBOPS; op++) {
    if (b.rc[op] == (cudaError_t)-1)
      printf("  B %s: not called (nothing to free)\n", bop_name[op]);
    else if (b.nonnull[op] >= 0)
      printf("  B %s rc=%d out=%s last=%d\n", bop_name[op], (int)b.rc[op], b.nonnull[op] ? "non-NULL" : "NULL",
             (int)b.last[op]);
    else
      printf("  B %s rc=%d last=%d\n", bop_name[op], (int)b.rc[op], (int)b.last[op]);
  }
  printf("  A begin=%d launch=%d is_capturing_rc=%d status=%d last=%d launch_after=%d end=%d graph=%s last=%d\n",
         (int)rb, (int)rk, (int)ic, (int)st, (int)la, (int)rk2, (int)re, nn(g), (int)le);
  if (re == cudaSuccess && g) run_graph(s, g, 0);
  if (g) CHECK_CUDA(cudaGraphDestroy(g));
  (void)cudaGetLastError();
  pthread_barrier_wait(&bar); /* 4 */
  CHECK(pthread_join(t, NULL) == 0);
  pthread_barrier_destroy(&bar);
  CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_CUDA(cudaDeviceSynchronize());
  printf("  after: last=%d\n", (int)cudaGetLastError());
}

/* ---- exit while a capture is in progress -------------------------------- */
static int exit_capturing(const char *mode, int blocking) {
  int m = -1;
  for (int i = 0; i < 3; i++)
    if (strcmp(mode, mode_name[i]) == 0) m = i;
  if (m < 0) {
    fprintf(stderr, "--exit-capturing: mode must be global, thread_local or relaxed, not '%s'\n", mode);
    return 2;
  }
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_bg, cudaStreamNonBlocking));
  void *keep = NULL; /* left allocated at exit */
  CHECK_CUDA(TMALLOC(&keep, 1 * MiB));
  make_pending(0);
  cudaStream_t s = NULL;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
  cudaError_t rb = cudaStreamBeginCapture(s, mode_val[m]);
  k_set<<<1, 1, 0, s>>>(g_out, 1, 42);
  cudaError_t rk = cudaPeekAtLastError();
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t ic = cudaStreamIsCapturing(s, &st);
  printf("exit while capturing: mode=%s stream=%s begin=%d launch=%d is_capturing_rc=%d status=%d\n", mode,
         blocking ? "blocking" : "nonblocking", (int)rb, (int)rk, (int)ic, (int)st);
  CHECK(rb == cudaSuccess && rk == cudaSuccess && st == cudaStreamCaptureStatusActive);
  print_pooled();
  fflush(stdout);
  return report(); /* the capture is still in progress */
}

int main(int argc, char **argv) {
  g_pending_bytes = gpu_quick() ? 8 * MiB : 96 * MiB;
  CHECK_CUDA(cudaFree(0));
  size_t fr = 0;
  CHECK_CUDA(cudaMemGetInfo(&fr, &g_total));
  CHECK_CUDA(TMALLOC(&g_out, 4 * sizeof(unsigned)));
  if (argc > 2 && strcmp(argv[1], "--exit-capturing") == 0)
    return exit_capturing(argv[2], argc > 3 && strcmp(argv[3], "blocking") == 0);
  if (argc > 1) {
    fprintf(stderr, "usage: %s [--exit-capturing global|thread_local|relaxed [blocking]]\n", argv[0]);
    return 2;
  }

  /* First with no non-blocking stream in the process (the pending frees'
   * kernels on the legacy stream), then with one. */
  int sits[NSIT] = {SIT_NO_NB, SIT_NB, SIT_BLOCKING};
  for (int si = 0; si < NSIT; si++) {
    int sit = sits[si];
    if (sit == SIT_NB) CHECK_CUDA(cudaStreamCreateWithFlags(&g_bg, cudaStreamNonBlocking));
    for (int mode = 0; mode < 3; mode++)
      for (int pend = 0; pend < 2; pend++)
        for (int path = 0; path < NPATHS; path++) one_case(sit, mode, pend, path);
  }
  for (int mode = 0; mode < 3; mode++)
    for (int nb = 1; nb >= 0; nb--) two_thread_case(mode, nb);

  /* A plain cycle still works afterwards. */
  unsigned *host = NULL, *d = NULL;
  CHECK_CUDA(cudaMallocHost(&host, 1 * MiB));
  CHECK_CUDA(TMALLOC(&d, 1 * MiB));
  size_t bad = fill_and_verify(d, 1 * MiB, 99, g_bg, host);
  printf("final cycle: verified bad=%zu\n", bad);
  CHECK(bad == 0);
  CHECK_CUDA(cudaFree(d));
  CHECK_CUDA(cudaFreeHost(host));
  CHECK_CUDA(cudaFree(g_out));
  CHECK_CUDA(cudaStreamDestroy(g_bg));
  CHECK_CUDA(cudaDeviceSynchronize());
  print_pooled();
  return report();
}
