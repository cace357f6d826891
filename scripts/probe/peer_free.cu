/* Does cudaFree of a block on device 1 wait for a kernel on device 0 that
 * still reads it through peer access (20 ms of reads), and what does that
 * kernel see when device 1 reuses the address? Run natively and under the
 * shim; needs 2 GPUs. One case a process (a fault natively is sticky):
 *
 *   nvcc -O2 -arch=sm_90 scripts/probe/peer_free.cu -lcuda -o build/peer_free
 *   build/peer_free CURRENT NONBLOCKING   (each 0 or 1: the device current at
 *                                          the free; the reader's stream) */
#include "../../c_tests/gpu/gpu_common.h"

int main(int argc, char **argv) {
  int only_current = argc > 2 ? atoi(argv[1]) : -1, only_nb = argc > 2 ? atoi(argv[2]) : -1;
  int n = 0;
  CHECK_CUDA(cudaGetDeviceCount(&n));
  if (n < 2) { printf("needs 2 GPUs\n"); return 0; }
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
  const size_t bytes = 4 * MiB, nw = bytes / 4;
  const unsigned P = 0x50505050u, Q = 0x51515151u;
  unsigned long long *bad = NULL;
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaMalloc(&bad, 4 * sizeof *bad));
  CHECK_CUDA(cudaMemset(bad, 0, 4 * sizeof *bad));
  cudaStream_t nb0;
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb0, cudaStreamNonBlocking));
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int current = 0; current < 2; current++)
    for (int nb = 0; nb < 2; nb++) {
      if (only_current >= 0 && (current != only_current || nb != only_nb)) continue;
      double us_sum = 0;
      int same = 0;
      for (int round = 0; round < 1; round++) {
        void *B = NULL, *C = NULL;
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMalloc(&B, bytes));
        k_set<<<grid_for(nw, 256), 256>>>((unsigned *)B, nw, P);
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaSetDevice(0));
        k_read_until<<<grid_for(nw, 64), 256, 0, nb ? nb0 : 0>>>((const unsigned *)B, nw, P, 20000000ULL,
                                                                 bad + current * 2 + nb);
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaSetDevice(current));
        double t0 = host_us();
        CHECK_CUDA(cudaFree(B));
        us_sum += host_us() - t0;
        printf("  free returned %.0f us after the reader began; last error then: %d\n", host_us() - t0, (int)cudaPeekAtLastError());
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMalloc(&C, bytes));
        same += C == B;
        k_set<<<grid_for(nw, 256), 256>>>((unsigned *)C, nw, Q);
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaSetDevice(0));
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaFree(C));
      }
      unsigned long long h = 0;
      CHECK_CUDA(cudaSetDevice(0));
      CHECK_CUDA(cudaMemcpy(&h, bad + current * 2 + nb, sizeof h, cudaMemcpyDeviceToHost));
      printf("  sticky error at the end: %d\n", (int)cudaDeviceSynchronize());
      printf("free with device %d current, reader on device 0's %s stream: cudaFree %.0f us (one), "
             "next block on device 1 at the same address %d of 1, elements the reader saw overwritten %llu\n",
             current, nb ? "non-blocking" : "legacy", us_sum, same, h);
    }
  return 0;
}
