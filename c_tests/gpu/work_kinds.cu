/* Work of every kind the shim watches, on a non-blocking stream, must be
 * ordered before the reuse of a block it uses (contract 2, as in race.cu,
 * for more than runtime kernel launches).
 *
 * The shim asks a non-blocking stream about a free only if it saw work
 * issued there since it last found the stream idle, and makes a stream wait
 * for a barrier just before its next work (docs/DESIGN.md, "Streams in
 * use"): work it did not see would be left out. One iteration per kind:
 * S1 is idle and was found so (a free was ordered since its last work); S1
 * waits (an event wait, which is not work) for a 1.5 ms kernel on S3; then
 * work of the kind on S1 uses A: a runtime copy from A, a runtime set of A,
 * a graph launch, cudaLaunchKernelEx, and the driver's cuLaunchKernel, of a
 * kernel that reads A for 1.5 ms. cudaFree(A) at once, B = cudaMalloc of the
 * same size 0.3 ms later (past the limit, B is A: the free was ordered behind
 * a barrier), W writes Q into B on S2. What the work read must be P, and B
 * must hold Q at the end. Natively cudaFree synchronizes the device. */
#include <unistd.h>

#include "gpu_common.h"

enum { COPY, SET, GRAPH, KERNEL_EX, DRIVER_LAUNCH, NKINDS };
static const char *kind_name[NKINDS] = {"runtime-copy", "runtime-set", "graph-launch", "launch-kernel-ex",
                                        "driver-launch"};
static const unsigned P = 0x50505050u, Q = 0x51515151u;
static const unsigned long long SPIN_NS = 1500000ULL, READ_NS = 1500000ULL;
static const size_t BYTES = 256 * MiB, N = BYTES / 4;

/* The graph of the last GRAPH iteration, destroyed once it has run. */
static cudaGraphExec_t g_exec;
static cudaGraph_t g_graph;

/* Issues work of `kind` on s1 that uses a (reads it, or for SET writes it);
 * what it reads that is not P is added to *bad. */
static void use_on(int kind, cudaStream_t s1, unsigned *a, unsigned *copy, unsigned long long *bad) {
  unsigned grid = grid_for(N, 64), block = 256;
  unsigned long long read_ns = READ_NS;
  const unsigned *ca = a;
  unsigned expect = P;
  void *args[] = {&ca, (void *)&N, &expect, &read_ns, &bad};
  switch (kind) {
    case COPY:
      CHECK_CUDA(cudaMemcpyAsync(copy, a, BYTES, cudaMemcpyDeviceToDevice, s1));
      break;
    case SET:
      CHECK_CUDA(cudaMemsetAsync(a, 0x50, BYTES, s1)); /* P again: harmless unless it lands on B */
      break;
    case GRAPH: {
      cudaStream_t capture;
      CHECK_CUDA(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
      CHECK_CUDA(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal));
      k_read_until<<<grid, block, 0, capture>>>(a, N, P, READ_NS, bad);
      CHECK_CUDA(cudaStreamEndCapture(capture, &g_graph));
      CHECK_CUDA(cudaGraphInstantiate(&g_exec, g_graph, 0));
      CHECK_CUDA(cudaGraphLaunch(g_exec, s1));
      CHECK_CUDA(cudaStreamDestroy(capture));
      break;
    }
    case KERNEL_EX: {
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(grid);
      config.blockDim = dim3(block);
      config.stream = s1;
      CHECK_CUDA(cudaLaunchKernelExC(&config, (const void *)k_read_until, args));
      break;
    }
    case DRIVER_LAUNCH: {
      cudaFunction_t function;
      CHECK_CUDA(cudaGetFuncBySymbol(&function, (const void *)k_read_until));
      CHECK(cuLaunchKernel((CUfunction)function, grid, 1, 1, block, 1, 1, 0, (CUstream)s1, args, NULL) ==
            CUDA_SUCCESS);
      break;
    }
  }
}

int main(void) {
  CHECK_CUDA(cudaFree(0));
  cudaStream_t s1, s2, s3;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
  cudaEvent_t spun;
  CHECK_CUDA(cudaEventCreateWithFlags(&spun, cudaEventDisableTiming));
  unsigned long long *bad = NULL, *badB = NULL;
  unsigned *copy = NULL;
  CHECK_CUDA(TMALLOC(&bad, NKINDS * sizeof *bad));
  CHECK_CUDA(TMALLOC(&badB, NKINDS * sizeof *badB));
  CHECK_CUDA(TMALLOC(&copy, BYTES));
  CHECK_CUDA(cudaMemset(bad, 0, NKINDS * sizeof *bad));
  CHECK_CUDA(cudaMemset(badB, 0, NKINDS * sizeof *badB));
  int rounds = gpu_quick() ? 1 : 4, same = 0;
  for (int round = 0; round < rounds; round++) {
    for (int k = 0; k < NKINDS; k++) {
      unsigned *A = NULL, *B = NULL;
      CHECK_CUDA(TMALLOC(&A, BYTES));
      k_set<<<grid_for(N, 1024), 256>>>(A, N, P);
      CHECK_CUDA(cudaDeviceSynchronize());
      usleep(2000); /* the shim's thread orders the last frees: s1 is found idle */
      k_spin_ns<<<1, 1, 0, s3>>>(SPIN_NS);
      CHECK_CUDA(cudaEventRecord(spun, s3));
      CHECK_CUDA(cudaStreamWaitEvent(s1, spun, 0));
      use_on(k, s1, A, copy, bad + k);
      CHECK_CUDA(cudaFree(A)); /* the work on s1 has not begun */
      /* Time for the shim's thread to order the free (well within the spin):
       * had it skipped s1, B would be A while the work has yet to use it. */
      usleep(300);
      CHECK_CUDA(TMALLOC(&B, BYTES));
      same += A == B;
      k_set<<<grid_for(N, 1024), 256, 0, s2>>>(B, N, Q);
      CHECK_CUDA(cudaDeviceSynchronize());
      if (k == COPY) k_count_neq<<<grid_for(N, 1024), 256>>>(copy, N, P, bad + k);
      k_count_neq<<<grid_for(N, 1024), 256>>>(B, N, Q, badB + k);
      CHECK_CUDA(cudaDeviceSynchronize());
      if (k == GRAPH) {
        CHECK_CUDA(cudaGraphExecDestroy(g_exec));
        CHECK_CUDA(cudaGraphDestroy(g_graph));
      }
      CHECK_CUDA(cudaFree(B));
    }
  }
  unsigned long long h[NKINDS], hb[NKINDS];
  CHECK_CUDA(cudaMemcpy(h, bad, sizeof h, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hb, badB, sizeof hb, cudaMemcpyDeviceToHost));
  for (int k = 0; k < NKINDS; k++) {
    printf("kind=%s read-not-P=%llu B-not-Q=%llu\n", kind_name[k], h[k], hb[k]);
    CHECK(h[k] == 0 && hb[k] == 0);
  }
  printf("# B == A in %d of %d iterations\n", same, rounds * NKINDS);
  CHECK_CUDA(cudaEventDestroy(spun));
  CHECK_CUDA(cudaStreamDestroy(s1));
  CHECK_CUDA(cudaStreamDestroy(s2));
  CHECK_CUDA(cudaStreamDestroy(s3));
  CHECK_CUDA(cudaFree(copy));
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaFree(badB));
  print_pooled();
  return report();
}
