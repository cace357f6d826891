/* Contract 9: cudaMalloc/cudaFree during a stream capture give the result the
 * real functions give, and never invalidate a capture that would otherwise
 * succeed. For capture modes global / thread_local / relaxed x a blocking /
 * non-blocking capturing stream x op (cudaMalloc, cudaFree of a pointer
 * allocated before the capture, cudaFree(NULL)) x from the capturing thread /
 * from another thread: print rc, the out pointer (NULL or not), the last
 * error, cudaStreamIsCapturing after, cudaStreamEndCapture's rc and the last
 * error after it. Where the capture ends well, the graph is instantiated and
 * launched and must have run (it also writes into a block allocated during
 * the capture, where there is one). Pointers are then freed, and each free
 * is printed (so compared with the real runtime); a pointer freed during the
 * capture must not be freeable twice.
 *
 * Then: frees during relaxed captures must really free (a loop of 40 x 128
 * MiB must not grow device memory use by more than 2 GiB: cudaMemGetInfo), and
 * a normal cudaMalloc/cudaFree cycle still works. */
#include "gpu_common.h"

static const char *modes[] = {"global", "thread_local", "relaxed"};
static const char *opname[] = {"cudaMalloc", "cudaFree(ptr from before)", "cudaFree(NULL)"};

struct opres {
  int op;
  void *pre;
  void *p;
  cudaError_t rc, last;
};

static void do_op(struct opres *o) {
  o->p = NULL;
  if (o->op == 0) o->rc = cudaMalloc(&o->p, 4096); /* counted later, outside the capture */
  if (o->op == 1) o->rc = cudaFree(o->pre);
  if (o->op == 2) o->rc = cudaFree(NULL);
  o->last = cudaGetLastError();
}
static void *op_thread(void *a) {
  do_op((struct opres *)a);
  return NULL;
}

static void one_case(int mode, int nonblocking, int op, int other) {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, nonblocking ? cudaStreamNonBlocking : cudaStreamDefault));
  unsigned *out = NULL;
  void *pre = NULL;
  CHECK_CUDA(TMALLOC(&out, 4 * sizeof(unsigned)));
  CHECK_CUDA(TMALLOC(&pre, 1 * MiB));
  CHECK_CUDA(cudaMemset(out, 0, 4 * sizeof(unsigned)));
  CHECK_CUDA(cudaDeviceSynchronize());
  (void)cudaGetLastError();

  cudaError_t b = cudaStreamBeginCapture(s, (cudaStreamCaptureMode)mode);
  k_set<<<1, 1, 0, s>>>(out, 1, 42);
  struct opres o = {op, pre, NULL, cudaSuccess, cudaSuccess};
  if (other) {
    pthread_t t;
    pthread_create(&t, NULL, op_thread, &o);
    pthread_join(t, NULL);
  } else {
    do_op(&o);
  }
  /* A block allocated during the capture is used by the graph. */
  if (o.op == 0 && o.rc == cudaSuccess && o.p) k_set<<<1, 1, 0, s>>>((unsigned *)o.p, 1, 7);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t ic = cudaStreamIsCapturing(s, &st);
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  cudaError_t le = cudaGetLastError();
  printf("capture mode=%s stream=%s op=%s from=%s: begin=%d rc=%d p=%s last=%d is_capturing_rc=%d status=%d "
         "end=%d graph=%s last_after_end=%d\n",
         modes[mode], nonblocking ? "nonblocking" : "blocking", opname[op], other ? "other-thread" : "capturing-thread",
         (int)b, (int)o.rc, nn(o.p), (int)o.last, (int)ic, (int)st, (int)e, nn(g), (int)le);
  if (o.p) note_alloc(o.p);

  if (e == cudaSuccess && g) {
    cudaGraphExec_t ge = NULL;
    cudaError_t ri = cudaGraphInstantiate(&ge, g, 0);
    cudaError_t rl = ri == cudaSuccess ? cudaGraphLaunch(ge, s) : ri;
    cudaError_t rs = cudaStreamSynchronize(s);
    unsigned h[1] = {0}, hp[1] = {0};
    CHECK_CUDA(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
    if (o.op == 0 && o.rc == cudaSuccess && o.p)
      CHECK_CUDA(cudaMemcpy(hp, o.p, sizeof hp, cudaMemcpyDeviceToHost));
    else
      hp[0] = 7;
    printf("  graph: instantiate=%d launch=%d sync=%d ran=%d wrote_new_block=%d\n", (int)ri, (int)rl, (int)rs,
           h[0] == 42, hp[0] == 7);
    CHECK(ri == cudaSuccess && rl == cudaSuccess && rs == cudaSuccess && h[0] == 42 && hp[0] == 7);
    if (ge) CHECK_CUDA(cudaGraphExecDestroy(ge));
  }
  if (g) CHECK_CUDA(cudaGraphDestroy(g));
  CHECK_CUDA(cudaDeviceSynchronize());
  (void)cudaGetLastError();

  /* Clean up, and show that the pointer map is still exact. */
  cudaError_t r1 = cudaFree(pre), l1 = cudaGetLastError();
  printf("  afterwards cudaFree(ptr from before) rc=%d last=%d\n", (int)r1, (int)l1);
  if (o.op == 1 && o.rc == cudaSuccess)
    CHECK(r1 != cudaSuccess); /* freed during the capture: a double free now */
  else if (o.op != 1)
    CHECK(r1 == cudaSuccess);
  /* (a free that failed during the capture: whatever the real runtime does
   * next is compared through the printed line) */
  if (o.p) {
    cudaError_t r2 = cudaFree(o.p), l2 = cudaGetLastError();
    printf("  afterwards cudaFree(ptr allocated during capture) rc=%d last=%d\n", (int)r2, (int)l2);
    CHECK(r2 == cudaSuccess);
  }
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_CUDA(cudaDeviceSynchronize());
  (void)cudaGetLastError();
}

static long long used_bytes(void) {
  size_t fr = 0, total = 0;
  CHECK_CUDA(cudaMemGetInfo(&fr, &total));
  return (long long)(total - fr);
}

int main(void) {
  CHECK_CUDA(cudaFree(0));
  for (int mode = 0; mode < 3; mode++)
    for (int nb = 0; nb < 2; nb++)
      for (int op = 0; op < 3; op++)
        for (int other = 0; other < 2; other++) one_case(mode, nb, op, other);

  /* Frees during relaxed captures really free. */
  const size_t BIG = 128 * MiB;
  const int LOOPS = gpu_quick() ? 8 : 40;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned *out = NULL;
  CHECK_CUDA(TMALLOC(&out, 16));
  void *w = NULL;
  CHECK_CUDA(TMALLOC(&w, BIG)); /* warm-up outside any capture */
  CHECK_CUDA(cudaFree(w));
  CHECK_CUDA(cudaDeviceSynchronize());
  long long before = used_bytes();
  int malloc_fail = 0, free_fail = 0, end_fail = 0;
  for (int i = 0; i < LOOPS; i++) {
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    k_set<<<1, 1, 0, s>>>(out, 1, (unsigned)i);
    void *p = NULL;
    malloc_fail += cudaMalloc(&p, BIG) != cudaSuccess;
    free_fail += cudaFree(p) != cudaSuccess;
    cudaGraph_t g = NULL;
    end_fail += cudaStreamEndCapture(s, &g) != cudaSuccess;
    if (g) CHECK_CUDA(cudaGraphDestroy(g));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  void *z = NULL; /* a normal cycle after the captures */
  CHECK_CUDA(TMALLOC(&z, BIG));
  CHECK_CUDA(cudaFree(z));
  CHECK_CUDA(cudaDeviceSynchronize());
  long long after = used_bytes();
  long long growth = after - before;
  printf("relaxed loop: %d x (cudaMalloc + cudaFree of 128 MiB): malloc failures=%d free failures=%d end failures=%d\n",
         LOOPS, malloc_fail, free_fail, end_fail);
  printf("relaxed loop: device memory growth below 2 GiB: %s\n", growth < (long long)(2 * GiB) ? "yes" : "no");
  printf("# relaxed loop: device memory in use grew by %lld MiB (cudaMemGetInfo)\n", growth / (long long)MiB);
  CHECK(malloc_fail == 0 && free_fail == 0 && end_fail == 0);
  CHECK(growth < (long long)(2 * GiB));

  /* A normal cycle still works. */
  unsigned *host = NULL, *d = NULL;
  CHECK_CUDA(cudaMallocHost(&host, 1 * MiB));
  CHECK_CUDA(TMALLOC(&d, 1 * MiB));
  size_t bad = fill_and_verify(d, 1 * MiB, 99, s, host);
  printf("final cycle: verified bad=%zu\n", bad);
  CHECK(bad == 0);
  CHECK_CUDA(cudaFree(d));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFreeHost(host));
  CHECK_CUDA(cudaStreamDestroy(s));
  print_pooled();
  return report();
}
