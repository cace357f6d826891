/* Memory the program frees is free at once for its own stream-ordered
 * allocations, as natively: cudaMallocAsync on the device's pool and
 * cuMemAllocFromPoolAsync on a pool of the program's own (CuPy's
 * MemoryAsyncPool, PyTorch's cudaMallocAsync backend). Under the shim a freed
 * block stays cached until it is given back; an allocation of the program's
 * own that finds the device out of memory must make the shim give it back.
 * With the block live, the same request fails as natively. The harness runs
 * it on a device of 1 GiB (FAKECUDA_MEM_LIMIT), where 600 MiB fit once. */
#include "common.h"

static const size_t share = 600 * MiB;

/* cudaMalloc of the share, worked on, then freed. */
static void take_and_free(void) {
  void *p = NULL;
  CHECK_CUDA(cudaMalloc(&p, share));
  CHECK(fakecuda_launch(NULL, p) == CUDA_SUCCESS);
  CHECK_CUDA(cudaFree(p));
}

/* The program's own allocation of the share on `s`: its code; freed if made. */
static int own_alloc(CUmemoryPool pool, cudaStream_t s) {
  void *p = NULL;
  int rc;
  if (pool) {
    CUdeviceptr d = 0;
    rc = (int)cuMemAllocFromPoolAsync(&d, share, pool, (CUstream)s);
    p = (void *)(uintptr_t)d;
  } else {
    rc = (int)cudaMallocAsync(&p, share, s);
  }
  if (rc == 0) {
    CHECK_CUDA(cudaFreeAsync(p, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
  }
  return rc;
}

int main(void) {
  CHECK_CUDA(cudaFree(NULL));
  cudaStream_t s = NULL;
  if (env_flag("MAKE_NONBLOCKING_STREAM", 0)) CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool own = NULL;
  CHECK(cuMemPoolCreate(&own, &props) == CUDA_SUCCESS);
  const struct {
    const char *name;
    CUmemoryPool pool;
  } allocators[] = {{"cudaMallocAsync", NULL}, {"cuMemAllocFromPoolAsync", own}};
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 2; i++) {
      take_and_free();
      printf("%s, round %d, after the free: rc=%d\n", allocators[i].name, round, own_alloc(allocators[i].pool, s));
      printf("  last error %d\n", (int)cudaGetLastError());
      void *live = NULL;
      CHECK_CUDA(cudaMalloc(&live, share));
      printf("%s, round %d, the share live: rc=%d\n", allocators[i].name, round, own_alloc(allocators[i].pool, s));
      printf("  last error %d\n", (int)cudaGetLastError());
      CHECK_CUDA(cudaFree(live));
    }
  }
  CHECK(cuMemPoolDestroy(own) == CUDA_SUCCESS);
  if (s) CHECK_CUDA(cudaStreamDestroy(s));
  return report();
}
