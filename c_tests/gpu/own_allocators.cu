/* Memory the program frees is free at once for its own other allocators, as
 * natively: its stream-ordered pools (cudaMallocAsync, cudaMallocFromPoolAsync:
 * CuPy's MemoryAsyncPool, PyTorch's cudaMallocAsync backend) and its virtual
 * memory (cuMemCreate: PyTorch's expandable segments). Under the shim a freed
 * block stays cached, or in the shim's pool, until the shim gives it back; when
 * one of those allocators finds the device out of memory, it must.
 *
 * Each round takes 60% of the device with cudaMalloc, fills and frees it, and
 * asks another allocator for 60%: natively that succeeds. Then, with the first
 * block live, the same request must fail as natively, with the same error left
 * behind (the shim makes no room from what the program uses). */
#include "gpu_common.h"

static size_t share; /* 60% of the device, in whole 2 MiB pages */

/* cudaMalloc of the share, filled and read back, then freed. */
static void take_fill_free(void) {
  void *p = NULL;
  CHECK_CUDA(TMALLOC(&p, share));
  if (!p) return;
  k_set<<<1024, 256>>>((unsigned *)p, share / 4, 7);
  unsigned long long *bad = NULL;
  CHECK_CUDA(TMALLOC(&bad, sizeof *bad));
  CHECK_CUDA(cudaMemset(bad, 0, sizeof *bad));
  k_count_neq<<<1024, 256>>>((unsigned *)p, share / 4, 7, bad);
  printf("  share filled: bad=%llu\n", read_counter(bad));
  CHECK_CUDA(cudaFree(bad));
  CHECK_CUDA(cudaFree(p));
}

/* The program's own allocators, each asked for the share on `s`; 0 or the error. */
static int async_alloc(cudaStream_t s, void **p) { return (int)cudaMallocAsync(p, share, s); }

static cudaMemPool_t own_pool;
static int own_pool_alloc(cudaStream_t s, void **p) { return (int)cudaMallocFromPoolAsync(p, share, own_pool, s); }

static CUmemGenericAllocationHandle vmm_handle;
static int vmm_create(cudaStream_t, void **p) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  int rc = (int)cuMemCreate(&vmm_handle, share, &prop, 0);
  *p = rc == 0 ? (void *)1 : NULL;
  return rc;
}

static void release(const char *name, cudaStream_t s, void *p) {
  if (strcmp(name, "cuMemCreate") == 0) {
    CHECK(cuMemRelease(vmm_handle) == CUDA_SUCCESS);
  } else {
    CHECK_CUDA(cudaFreeAsync(p, s));
  }
  CHECK_CUDA(cudaStreamSynchronize(s));
}

int main(void) {
  CHECK_CUDA(cudaFree(NULL));
  size_t free_b = 0, total_b = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  share = total_b / 10 * 6 / (2 * MiB) * (2 * MiB);
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  own_pool = make_own_pool();

  struct {
    const char *name;
    int (*alloc)(cudaStream_t, void **);
  } allocators[] = {{"cudaMallocAsync", async_alloc}, {"cudaMallocFromPoolAsync", own_pool_alloc}, {"cuMemCreate", vmm_create}};
  for (int round = 0; round < 2; round++) {
    for (auto &a : allocators) {
      printf("%s, round %d\n", a.name, round);
      /* The share freed: the allocator gets it. */
      take_fill_free();
      void *p = NULL;
      int rc = a.alloc(s, &p);
      printf("  after the free: rc=%d\n", rc);
      show_last_error_twice();
      if (rc == 0) release(a.name, s, p);
      /* The share live: the allocator is out of memory, as natively. */
      void *live = NULL;
      CHECK_CUDA(TMALLOC(&live, share));
      rc = a.alloc(s, &p);
      printf("  with the share live: rc=%d\n", rc);
      show_last_error_twice();
      if (rc == 0) release(a.name, s, p);
      CHECK_CUDA(cudaFree(live));
    }
  }
  CHECK_CUDA(cudaMemPoolDestroy(own_pool));
  CHECK_CUDA(cudaStreamDestroy(s));
  print_pooled();
  return report();
}
