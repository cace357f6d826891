/* Pinned host memory given to cudaFreeHost is not handed out again before
 * every kernel and copy issued before the free has finished, on every stream,
 * nor before the CPU could observe that: the next owner's CPU writes must not
 * race them.
 *
 * One iteration: A = pinned(n); the CPU fills A with P; on non-blocking
 * stream S1 a kernel R reads A through its address for ~1 ms counting
 * elements != P; on non-blocking stream S2, behind a ~1 ms spin, an async
 * copy of A to device memory D[i]; cudaFreeHost(A) at once; B = pinned(n);
 * the CPU writes Q into B at once. If B is A's memory, R or the copy sees Q:
 * a corruption (counted from R, and from D[i] after the loop). Natively
 * cudaFreeHost synchronizes the device, so there is none.
 *
 * --wrong: the program emulates a broken shim (a host memory pool whose
 * block is freed on the legacy stream, which does not order S1 and S2, and
 * taken again at once) and must DETECT corruption: the test's teeth. Run
 * natively only. */
#include "host_alloc.h"

static CUmemoryPool g_wrong_pool;

static void *pinned(size_t n, int wrong) {
  void *p = NULL;
  if (!wrong) {
    CHECK_CUDA(thost_malloc(&p, n));
    return p;
  }
  CUdeviceptr d = 0;
  CHECK(cuMemAllocFromPoolAsync(&d, n, g_wrong_pool, CU_STREAM_LEGACY) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(CU_STREAM_LEGACY) == CUDA_SUCCESS);
  return (void *)(uintptr_t)d;
}

static void unpin(void *p, int wrong) {
  if (!wrong) {
    CHECK_CUDA(host_free(p));
    return;
  }
  CHECK(cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, CU_STREAM_LEGACY) == CUDA_SUCCESS);
}

int main(int argc, char **argv) {
  int wrong = argc > 1 && strcmp(argv[1], "--wrong") == 0;
  CHECK_CUDA(cudaFree(NULL));
  if (wrong) {
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CHECK(cuMemPoolCreate(&g_wrong_pool, &pp) == CUDA_SUCCESS);
    CUmemAccessDesc a;
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = 0;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemPoolSetAccess(g_wrong_pool, &a, 1) == CUDA_SUCCESS);
    cuuint64_t max = ~0ULL;
    CHECK(cuMemPoolSetAttribute(g_wrong_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max) == CUDA_SUCCESS);
  }
  cudaStream_t s1, s2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  const size_t bytes = 1 * MiB, n = bytes / sizeof(unsigned);
  const int iters = gpu_quick() ? 8 : 40;
  const unsigned P = 0x12345678u, Q = 0x9abcdef0u;
  unsigned long long *bad = NULL;
  CHECK_CUDA(cudaMalloc((void **)&bad, sizeof *bad));
  CHECK_CUDA(cudaMemset(bad, 0, sizeof *bad));
  unsigned *copies = NULL;
  CHECK_CUDA(cudaMalloc((void **)&copies, bytes * iters));
  CHECK_CUDA(cudaDeviceSynchronize());
  void *seen[2 * 64] = {0};
  int nseen = 0, reused = 0;
  for (int i = 0; i < iters; i++) {
    unsigned *a = (unsigned *)pinned(bytes, wrong);
    for (int k = 0; k < nseen; k++) reused += seen[k] == a;
    seen[nseen++] = a;
    for (size_t j = 0; j < n; j++) a[j] = P;
    k_read_until<<<64, 256, 0, s1>>>(a, n, P, 1000000ull, bad);
    CHECK_CUDA(cudaGetLastError());
    k_spin_ns<<<1, 1, 0, s2>>>(1000000ull);
    CHECK_CUDA(cudaMemcpyAsync(copies + (size_t)i * n, a, bytes, cudaMemcpyHostToDevice, s2));
    unpin(a, wrong);
    unsigned *b = (unsigned *)pinned(bytes, wrong);
    for (int k = 0; k < nseen; k++) reused += seen[k] == b;
    seen[nseen++] = b;
    for (size_t j = 0; j < n; j++) b[j] = Q;
    unpin(b, wrong);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  unsigned long long read_bad = 0, copy_bad = 0;
  CHECK_CUDA(cudaMemcpy(&read_bad, bad, sizeof read_bad, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemset(bad, 0, sizeof *bad));
  k_count_neq<<<256, 256>>>(copies, n * iters, P, bad);
  CHECK_CUDA(cudaMemcpy(&copy_bad, bad, sizeof copy_bad, cudaMemcpyDeviceToHost));
  printf("%d iterations of %zu bytes: reads of freed pinned memory done\n", iters, bytes);
  printf("# corruptions %llu (kernel reads %llu, copies %llu); %d allocations at an address given out before\n",
         read_bad + copy_bad, read_bad, copy_bad, reused);
  if (!wrong) CHECK(read_bad + copy_bad == 0);
  CHECK_CUDA(cudaFree(copies));
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaStreamDestroy(s1));
  CHECK_CUDA(cudaStreamDestroy(s2));
  print_pooled();
  return 0;
}
