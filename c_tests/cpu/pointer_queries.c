/* Pointer queries on memory the shim hands out answer as for the real
 * allocation: cuPointerGetAttribute (one attribute) and cuPointerGetAttributes
 * (a list) give the context, legacy-IPC capability, range, handle types and
 * pool handle of cudaMalloc memory, not of the pool allocation behind it, at
 * the start and inside; cuMemGetAddressRange gives the block itself; a
 * pointer the shim did not hand out (the program's own cudaMallocAsync, a
 * stack address) keeps the driver's answer. */
#include "common.h"

static const struct { CUpointer_attribute a; const char *name; } kAttrs[] = {
    {CU_POINTER_ATTRIBUTE_CONTEXT, "CONTEXT"},
    {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "MEMORY_TYPE"},
    {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "DEVICE_ORDINAL"},
    {CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, "IS_LEGACY_CUDA_IPC_CAPABLE"},
    {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, "RANGE_START_ADDR"},
    {CU_POINTER_ATTRIBUTE_RANGE_SIZE, "RANGE_SIZE"},
    {CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, "ALLOWED_HANDLE_TYPES"},
    {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, "MEMPOOL_HANDLE"},
};
enum { NATTRS = sizeof kAttrs / sizeof kAttrs[0] };

/* Addresses and handles relative to the allocation, so runs compare. */
static void show(const char *what, int i, uint64_t v, uint64_t base, CUcontext primary) {
  switch (kAttrs[i].a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: printf(" %s=%s", what, v == (uint64_t)(uintptr_t)primary ? "primary" : v ? "other" : "null"); break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: printf(" %s=%s", what, v == base ? "p" : v ? "other" : "null"); break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: printf(" %s=%s", what, v ? "a pool" : "null"); break;
    default: printf(" %s=%llu", what, (unsigned long long)v);
  }
}

static void queries(const char *label, void *p, size_t size, CUcontext primary) {
  uint64_t base = (uint64_t)(uintptr_t)p;
  for (size_t off = 0; off <= size / 2; off += size / 2) {
    printf("%s p+%zu:", label, off);
    for (int i = 0; i < NATTRS; i++) {
      uint64_t v = 0;
      CUresult r = cuPointerGetAttribute(&v, kAttrs[i].a, base + off);
      CHECK_EQ(r, CUDA_SUCCESS);
      show(kAttrs[i].name, i, v, base, primary);
    }
    printf("\n%s p+%zu list:", label, off);
    CUpointer_attribute list[NATTRS];
    uint64_t data[NATTRS];
    void *slots[NATTRS];
    for (int i = 0; i < NATTRS; i++) list[i] = kAttrs[i].a, data[i] = 0, slots[i] = &data[i];
    CHECK_EQ(cuPointerGetAttributes(NATTRS, list, slots, base + off), CUDA_SUCCESS);
    for (int i = 0; i < NATTRS; i++) show(kAttrs[i].name, i, data[i], base, primary);
    CUdeviceptr start = 0;
    size_t bytes = 0;
    CHECK_EQ(cuMemGetAddressRange(&start, &bytes, base + off), CUDA_SUCCESS);
    printf("\n%s p+%zu range: start %s size %zu\n", label, off, start == base ? "p" : "other", bytes);
  }
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  CUcontext primary = NULL;
  CHECK_EQ(cuCtxGetCurrent(&primary), CUDA_SUCCESS);
  static const size_t sizes[] = {200, 1 << 20, (1 << 20) + 100};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, sizes[i]));
    CHECK_EQ(ptr_kind(p), expect_pool(sizes[i]) ? FAKECUDA_POOL : FAKECUDA_PLAIN);
    char label[64];
    snprintf(label, sizeof label, "cudaMalloc(%zu)", sizes[i]);
    queries(label, p, sizes[i], primary);
    CHECK_CUDA(cudaFree(p));
  }
  /* A pointer CUDA does not know: an error alone, defaults in a list. */
  int local = 0;
  uint64_t v = 1;
  printf("stack address: rc %d", (int)cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)&local));
  CUpointer_attribute context = CU_POINTER_ATTRIBUTE_CONTEXT;
  void *slot = &v;
  printf(", list rc %d context %llu\n", (int)cuPointerGetAttributes(1, &context, &slot, (CUdeviceptr)(uintptr_t)&local),
         (unsigned long long)v);
  /* The program's own stream-ordered memory is pool memory natively too. */
  void *own = NULL;
  CHECK_CUDA(cudaMallocAsync(&own, 4096, 0));
  queries("cudaMallocAsync(4096)", own, 4096, primary);
  CHECK_CUDA(cudaFreeAsync(own, 0));
  CHECK_CUDA(cudaStreamSynchronize(0));
  return report();
}
