/* What a program can ask of, and do with, the memory an allocation hands out:
 * device memory (cudaMalloc / cuMemAlloc, cudaMallocPitch) and pinned host
 * memory (cudaMallocHost / cudaHostAlloc / cuMemAllocHost / cuMemHostAlloc).
 * For each: every pointer attribute (one by one and batched), the address
 * range, cudaPointerGetAttributes, host flags and device pointer; copies and
 * memsets through the driver and the runtime with the pointer in each role
 * (as the device side of DtoH/HtoD/DtoD copies too, which pinned memory
 * allows), synchronous, on the legacy stream and on a non-blocking one, 2D;
 * a kernel writing through the pointer then a DtoH copy from it (what XLA
 * does with pinned scalars); graph memset and memcpy nodes; prefetch and
 * advise; registering an overlapping host range; retaining the allocation
 * handle; a second context of the same device; buffer ids after a free and
 * a new allocation (with a non-blocking stream alive, so the block is not
 * kept in the shim's cache of the legacy stream: docs/CONTRACT.md). Every answer is printed normalized (codes, sizes,
 * pointers relative to the allocation), so a native and a shim run must print
 * the same lines. */
#include "host_alloc.h"

static const int kNonBlocking = 1;
static CUcontext g_primary;

/* Where v lies relative to the allocation [p, p + n). */
static const char *rel(uint64_t v, const void *p, size_t n) {
  static char buf[4][48];
  static int slot;
  char *b = buf[slot++ & 3];
  uint64_t base = (uint64_t)(uintptr_t)p;
  if (v == 0) return "null";
  if (v == base) return "p";
  if (v > base && v < base + n) {
    snprintf(b, 48, "p+%llu", (unsigned long long)(v - base));
    return b;
  }
  return v < base ? "below p" : "past p";
}

/* ---- attributes ---------------------------------------------------------- */
/* How each CUpointer_attribute's answer is printed: P an address, C a
 * context, I a 32-bit value, L a 64-bit value, N nonzero or not, R code only.
 * The attributes marked '#' describe the physical memory, which a pool lays
 * out as it likes (docs/CONTRACT.md lists them): printed, not compared. */
static const struct { CUpointer_attribute a; const char *name; char how; char known_difference; } kAttrs[] = {
    {CU_POINTER_ATTRIBUTE_CONTEXT, "CONTEXT", 'C'},
    {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "MEMORY_TYPE", 'I'},
    {CU_POINTER_ATTRIBUTE_DEVICE_POINTER, "DEVICE_POINTER", 'P'},
    {CU_POINTER_ATTRIBUTE_HOST_POINTER, "HOST_POINTER", 'P'},
    {CU_POINTER_ATTRIBUTE_P2P_TOKENS, "P2P_TOKENS", 'R'},
    {CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, "SYNC_MEMOPS", 'I'},
    {CU_POINTER_ATTRIBUTE_BUFFER_ID, "BUFFER_ID", 'N'},
    {CU_POINTER_ATTRIBUTE_IS_MANAGED, "IS_MANAGED", 'I'},
    {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "DEVICE_ORDINAL", 'I'},
    {CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, "IS_LEGACY_CUDA_IPC_CAPABLE", 'I'},
    {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, "RANGE_START_ADDR", 'P'},
    {CU_POINTER_ATTRIBUTE_RANGE_SIZE, "RANGE_SIZE", 'L'},
    {CU_POINTER_ATTRIBUTE_MAPPED, "MAPPED", 'I'},
    {CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, "ALLOWED_HANDLE_TYPES", 'L'},
    {CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, "IS_GPU_DIRECT_RDMA_CAPABLE", 'I', '#'},
    {CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, "ACCESS_FLAGS", 'I'},
    {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, "MEMPOOL_HANDLE", 'N'},
    {CU_POINTER_ATTRIBUTE_MAPPING_SIZE, "MAPPING_SIZE", 'L', '#'},
    {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, "MAPPING_BASE_ADDR", 'P', '#'},
    {CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, "MEMORY_BLOCK_ID", 'N'},
    {CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE, "IS_HW_DECOMPRESS_CAPABLE", 'I', '#'},
};
enum { NATTRS = sizeof kAttrs / sizeof kAttrs[0] };

static void print_value(char how, const uint64_t *v, const void *p, size_t n) {
  switch (how) {
    case 'P': printf(" %s", rel(v[0], p, n)); break;
    case 'C': printf(" %s", v[0] == 0 ? "null" : (CUcontext)(uintptr_t)v[0] == g_primary ? "primary" : "other"); break;
    case 'I': printf(" %u", (unsigned)v[0]); break;
    case 'L': printf(" %llu", (unsigned long long)v[0]); break;
    case 'N': printf(" %s", v[0] ? "nonzero" : "0"); break;
    default: break;
  }
}

static void attributes(const char *what, const void *p, size_t n, size_t off) {
  CUdeviceptr q = (CUdeviceptr)(uintptr_t)p + off;
  for (int i = 0; i < NATTRS; i++) {
    uint64_t v[8];
    memset(v, 0, sizeof v);
    CUresult r = cuPointerGetAttribute(v, kAttrs[i].a, q);
    printf("%s%s: attribute %s at p+%zu rc=%d", kAttrs[i].known_difference ? "# " : "", what, kAttrs[i].name, off, (int)r);
    if (r == CUDA_SUCCESS) print_value(kAttrs[i].how, v, p, n);
    printf("\n");
  }
  /* All at once, as cuPointerGetAttributes answers a list (which takes
   * every attribute but P2P_TOKENS): the compared ones, then the others. */
  for (int compared = 1; compared >= 0; compared--) {
    CUpointer_attribute list[NATTRS];
    uint64_t data[NATTRS][8];
    void *slots[NATTRS];
    int index[NATTRS], count = 0;
    memset(data, 0, sizeof data);
    for (int i = 0; i < NATTRS; i++)
      if (kAttrs[i].how != 'R' && (kAttrs[i].known_difference == 0) == compared)
        list[count] = kAttrs[i].a, slots[count] = data[count], index[count++] = i;
    CUresult r = cuPointerGetAttributes(count, list, slots, q);
    printf("%s%s: cuPointerGetAttributes at p+%zu rc=%d", compared ? "" : "# ", what, off, (int)r);
    if (r == CUDA_SUCCESS)
      for (int k = 0; k < count; k++) {
        printf(" %s=", kAttrs[index[k]].name);
        print_value(kAttrs[index[k]].how, data[k], p, n);
      }
    printf("\n");
  }

  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = cuMemGetAddressRange(&base, &size, q);
  printf("%s: cuMemGetAddressRange(p+%zu) rc=%d base %s size %zu\n", what, off, (int)r, rel(base, p, n), size);

  cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  cudaError_t e = cudaPointerGetAttributes(&a, (const char *)p + off);
  printf("%s: cudaPointerGetAttributes(p+%zu) rc=%d type %d device %d devicePointer %s hostPointer %s; last %d\n",
         what, off, (int)e, (int)a.type, a.device, rel((uint64_t)(uintptr_t)a.devicePointer, p, n),
         rel((uint64_t)(uintptr_t)a.hostPointer, p, n), (int)cudaGetLastError());

  unsigned flags = 0xdead;
  cudaError_t rf = cudaHostGetFlags(&flags, (void *)((const char *)p + off));
  void *d = NULL;
  cudaError_t rd = cudaHostGetDevicePointer(&d, (void *)((const char *)p + off), 0);
  printf("%s: cudaHostGetFlags rc=%d 0x%x, cudaHostGetDevicePointer rc=%d %s; last %d\n", what, (int)rf,
         rf == cudaSuccess ? flags : 0, (int)rd, rel((uint64_t)(uintptr_t)d, p, n), (int)cudaGetLastError());
}

/* ---- operations ----------------------------------------------------------- */
/* The bytes the operations move (all of a small allocation). */
static size_t span(size_t n) { return n < 4096 ? n : 4096; }

/* Puts pattern(seed) into the first span(n) bytes of p, through the CPU for
 * host memory and a unified-address copy for device memory. */
static void put(void *p, int host, size_t n, unsigned seed) {
  size_t words = span(n) / 4;
  unsigned *h = (unsigned *)malloc(span(n));
  for (size_t i = 0; i < words; i++) h[i] = pattern(seed, i);
  if (host) memcpy(p, h, span(n));
  else CHECK_CUDA(cudaMemcpy(p, h, span(n), cudaMemcpyDefault));
  /* A copy from pageable memory may return before its DMA lands, and the
   * operation under test may run on a non-blocking stream. */
  CHECK_CUDA(cudaDeviceSynchronize());
  free(h);
}

/* Whether the first span(n) bytes of p hold pattern(seed). */
static const char *holds(const void *p, int host, size_t n, unsigned seed) {
  size_t words = span(n) / 4;
  unsigned *h = (unsigned *)malloc(span(n));
  CHECK_CUDA(cudaDeviceSynchronize());
  if (host) memcpy(h, p, span(n));
  else CHECK_CUDA(cudaMemcpy(h, p, span(n), cudaMemcpyDefault));
  size_t bad = count_bad_host(h, words, seed);
  free(h);
  return bad ? "bad data" : "data ok";
}

/* Prints a driver call's code and, where it succeeded, whether dst now holds
 * what src held. */
#define DRV_COPY(what, label, call, dst, dst_host, src, src_host, n)                           \
  do {                                                                                         \
    put(src, src_host, n, ++seed);                                                             \
    CUresult r_ = (call);                                                                      \
    if (r_ == CUDA_SUCCESS) CHECK_CUDA(cudaDeviceSynchronize());                               \
    printf("%s: %s rc=%d%s%s\n", what, label, (int)r_, r_ == CUDA_SUCCESS ? " " : "",          \
           r_ == CUDA_SUCCESS ? holds(dst, dst_host, n, seed) : "");                           \
  } while (0)

#define RT_COPY(what, label, call, dst, dst_host, src, src_host, n)                            \
  do {                                                                                         \
    put(src, src_host, n, ++seed);                                                             \
    cudaError_t r_ = (call);                                                                   \
    if (r_ == cudaSuccess) CHECK_CUDA(cudaDeviceSynchronize());                                \
    printf("%s: %s rc=%d%s%s; last %d\n", what, label, (int)r_, r_ == cudaSuccess ? " " : "",  \
           r_ == cudaSuccess ? holds(dst, dst_host, n, seed) : "", (int)cudaGetLastError());    \
  } while (0)

__global__ void k_store(unsigned *p, size_t words, unsigned seed) {
  for (size_t i = threadIdx.x; i < words; i += blockDim.x) p[i] = pattern(seed, i);
}

static void operations(const char *what, void *p, int host, size_t n, cudaStream_t *streams) {
  static unsigned seed = 1000;
  size_t m = span(n);
  CUdeviceptr dp = (CUdeviceptr)(uintptr_t)p;
  void *dev = NULL; /* a device buffer of the same kind as the program's others */
  CHECK_CUDA(cudaMalloc(&dev, 4096));
  CUdeviceptr dd = (CUdeviceptr)(uintptr_t)dev;
  void *pageable = malloc(4096);

  /* Synchronous driver copies, the allocation in each role its memory allows. */
  DRV_COPY(what, "cuMemcpyHtoD(p, pageable)", cuMemcpyHtoD(dp, pageable, m), p, host, pageable, 1, n);
  DRV_COPY(what, "cuMemcpyDtoH(pageable, p)", cuMemcpyDtoH(pageable, dp, m), pageable, 1, p, host, n);
  DRV_COPY(what, "cuMemcpyDtoD(dev, p)", cuMemcpyDtoD(dd, dp, m), dev, 0, p, host, n);
  DRV_COPY(what, "cuMemcpyDtoD(p, dev)", cuMemcpyDtoD(dp, dd, m), p, host, dev, 0, n);
  DRV_COPY(what, "cuMemcpy(dev, p)", cuMemcpy(dd, dp, m), dev, 0, p, host, n);
  DRV_COPY(what, "cuMemcpy(p, dev)", cuMemcpy(dp, dd, m), p, host, dev, 0, n);
  if (host) {
    /* Host memory is also the host side of a copy. */
    DRV_COPY(what, "cuMemcpyHtoD(dev, p)", cuMemcpyHtoD(dd, p, m), dev, 0, p, host, n);
    DRV_COPY(what, "cuMemcpyDtoH(p, dev)", cuMemcpyDtoH(p, dd, m), p, host, dev, 0, n);
  }
  for (int k = 0; k < 2; k++) {
    CUstream s = (CUstream)streams[k];
    char label[96];
    const char *sn = k == kNonBlocking ? "nonblocking" : "legacy";
    snprintf(label, sizeof label, "cuMemcpyHtoDAsync(p, pageable, %s)", sn);
    DRV_COPY(what, label, cuMemcpyHtoDAsync(dp, pageable, m, s), p, host, pageable, 1, n);
    snprintf(label, sizeof label, "cuMemcpyDtoHAsync(pageable, p, %s)", sn);
    DRV_COPY(what, label, cuMemcpyDtoHAsync(pageable, dp, m, s), pageable, 1, p, host, n);
    snprintf(label, sizeof label, "cuMemcpyDtoDAsync(dev, p, %s)", sn);
    DRV_COPY(what, label, cuMemcpyDtoDAsync(dd, dp, m, s), dev, 0, p, host, n);
    snprintf(label, sizeof label, "cuMemcpyDtoDAsync(p, dev, %s)", sn);
    DRV_COPY(what, label, cuMemcpyDtoDAsync(dp, dd, m, s), p, host, dev, 0, n);
    snprintf(label, sizeof label, "cuMemcpyAsync(dev, p, %s)", sn);
    DRV_COPY(what, label, cuMemcpyAsync(dd, dp, m, s), dev, 0, p, host, n);
    if (host) {
      snprintf(label, sizeof label, "cuMemcpyHtoDAsync(dev, p, %s)", sn);
      DRV_COPY(what, label, cuMemcpyHtoDAsync(dd, p, m, s), dev, 0, p, host, n);
      snprintf(label, sizeof label, "cuMemcpyDtoHAsync(p, dev, %s)", sn);
      DRV_COPY(what, label, cuMemcpyDtoHAsync(p, dd, m, s), p, host, dev, 0, n);
    }
    /* A kernel writes through the pointer, then the stream copies it out. */
    unsigned out[1024];
    k_store<<<1, 128, 0, streams[k]>>>((unsigned *)p, m / 4, ++seed);
    CUresult r = cuMemcpyDtoHAsync(out, dp, m, s);
    cudaError_t sync = cudaStreamSynchronize(streams[k]);
    printf("%s: kernel store then cuMemcpyDtoHAsync(out, p, %s) rc=%d sync=%d %s\n", what, sn, (int)r, (int)sync,
           r == CUDA_SUCCESS && count_bad_host(out, m / 4, seed) == 0 ? "data ok" : "no data");
  }

  /* Memsets. */
  CUresult r = cuMemsetD8(dp, 0x5a, m);
  unsigned char probe = 0;
  if (r == CUDA_SUCCESS) CHECK_CUDA(cudaMemcpy(&probe, (char *)p + m - 1, 1, cudaMemcpyDefault));
  printf("%s: cuMemsetD8 rc=%d last byte 0x%x\n", what, (int)r, probe);
  r = cuMemsetD32Async(dp, 0x01020304u, m / 4, (CUstream)streams[kNonBlocking]);
  unsigned word = 0;
  if (r == CUDA_SUCCESS) {
    CHECK_CUDA(cudaStreamSynchronize(streams[kNonBlocking]));
    CHECK_CUDA(cudaMemcpy(&word, p, 4, cudaMemcpyDefault));
  }
  printf("%s: cuMemsetD32Async(nonblocking) rc=%d first word 0x%x\n", what, (int)r, word);
  cudaError_t e = cudaMemset(p, 0x33, m);
  probe = 0;
  if (e == cudaSuccess) CHECK_CUDA(cudaMemcpy(&probe, p, 1, cudaMemcpyDefault));
  printf("%s: cudaMemset rc=%d first byte 0x%x; last %d\n", what, (int)e, probe, (int)cudaGetLastError());

  /* 2D copies naming the memory type of each side. */
  CUDA_MEMCPY2D c2;
  memset(&c2, 0, sizeof c2);
  c2.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c2.srcDevice = dp;
  c2.srcPitch = m;
  c2.dstMemoryType = CU_MEMORYTYPE_HOST;
  c2.dstHost = pageable;
  c2.dstPitch = m;
  c2.WidthInBytes = m;
  c2.Height = 1;
  DRV_COPY(what, "cuMemcpy2D(host <- p as DEVICE)", cuMemcpy2D(&c2), pageable, 1, p, host, n);
  c2.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  DRV_COPY(what, "cuMemcpy2D(host <- p as UNIFIED)", cuMemcpy2D(&c2), pageable, 1, p, host, n);
  memset(&c2, 0, sizeof c2);
  c2.srcMemoryType = CU_MEMORYTYPE_HOST;
  c2.srcHost = pageable;
  c2.srcPitch = m;
  c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c2.dstDevice = dp;
  c2.dstPitch = m;
  c2.WidthInBytes = m;
  c2.Height = 1;
  DRV_COPY(what, "cuMemcpy2DAsync(p as DEVICE <- host, nonblocking)",
           cuMemcpy2DAsync(&c2, (CUstream)streams[kNonBlocking]), p, host, pageable, 1, n);

  /* The runtime, each kind named. */
  RT_COPY(what, "cudaMemcpy(pageable, p, DeviceToHost)", cudaMemcpy(pageable, p, m, cudaMemcpyDeviceToHost), pageable, 1,
          p, host, n);
  RT_COPY(what, "cudaMemcpy(p, pageable, HostToDevice)", cudaMemcpy(p, pageable, m, cudaMemcpyHostToDevice), p, host,
          pageable, 1, n);
  RT_COPY(what, "cudaMemcpy(dev, p, DeviceToDevice)", cudaMemcpy(dev, p, m, cudaMemcpyDeviceToDevice), dev, 0, p, host, n);
  RT_COPY(what, "cudaMemcpy(p, dev, DeviceToDevice)", cudaMemcpy(p, dev, m, cudaMemcpyDeviceToDevice), p, host, dev, 0, n);
  RT_COPY(what, "cudaMemcpy(pageable, p, HostToHost)", cudaMemcpy(pageable, p, m, cudaMemcpyHostToHost), pageable, 1, p,
          host, n);
  RT_COPY(what, "cudaMemcpyAsync(pageable, p, DeviceToHost, nonblocking)",
          cudaMemcpyAsync(pageable, p, m, cudaMemcpyDeviceToHost, streams[kNonBlocking]), pageable, 1, p, host, n);
  RT_COPY(what, "cudaMemcpy2D(pageable, p, DeviceToHost)",
          cudaMemcpy2D(pageable, m, p, m, m, 1, cudaMemcpyDeviceToHost), pageable, 1, p, host, n);

  /* Prefetch and advise (managed memory's calls). */
  cudaMemLocation loc;
  memset(&loc, 0, sizeof loc);
  loc.type = cudaMemLocationTypeDevice;
  loc.id = 0;
  e = cudaMemPrefetchAsync(p, m, loc, 0, streams[kNonBlocking]);
  printf("%s: cudaMemPrefetchAsync rc=%d; last %d\n", what, (int)e, (int)cudaGetLastError());
  e = cudaMemAdvise(p, m, cudaMemAdviseSetReadMostly, loc);
  printf("%s: cudaMemAdvise(SetReadMostly) rc=%d; last %d\n", what, (int)e, (int)cudaGetLastError());

  /* Registering a host range over the allocation. */
  r = cuMemHostRegister(p, m, 0);
  printf("%s: cuMemHostRegister(p) rc=%d\n", what, (int)r);
  if (r == CUDA_SUCCESS) CHECK(cuMemHostUnregister(p) == CUDA_SUCCESS);
  e = cudaHostRegister(p, m, cudaHostRegisterDefault);
  printf("%s: cudaHostRegister(p) rc=%d; last %d\n", what, (int)e, (int)cudaGetLastError());
  if (e == cudaSuccess) CHECK_CUDA(cudaHostUnregister(p));

  /* The virtual memory management view of it. */
  CUmemGenericAllocationHandle handle = 0;
  r = cuMemRetainAllocationHandle(&handle, p);
  printf("%s: cuMemRetainAllocationHandle rc=%d\n", what, (int)r);
  if (r == CUDA_SUCCESS) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    CUresult rp = cuMemGetAllocationPropertiesFromHandle(&prop, handle);
    printf("%s: cuMemGetAllocationPropertiesFromHandle rc=%d type %d location %d handles 0x%x\n", what, (int)rp,
           (int)prop.type, (int)prop.location.type, (unsigned)prop.requestedHandleTypes);
    CHECK(cuMemRelease(handle) == CUDA_SUCCESS);
  }
  CUmemLocation where;
  memset(&where, 0, sizeof where);
  where.type = CU_MEM_LOCATION_TYPE_DEVICE;
  where.id = 0;
  unsigned long long access = 0;
  r = cuMemGetAccess(&access, &where, dp);
  printf("%s: cuMemGetAccess(device 0) rc=%d flags %llu\n", what, (int)r, access);

  /* Graph nodes that reference it. */
  CUgraph g = NULL;
  CHECK(cuGraphCreate(&g, 0) == CUDA_SUCCESS);
  CUDA_MEMSET_NODE_PARAMS ms;
  memset(&ms, 0, sizeof ms);
  ms.dst = dp;
  ms.elementSize = 1;
  ms.width = m;
  ms.height = 1;
  ms.pitch = m;
  ms.value = 0x77;
  CUgraphNode set_node = NULL, copy_node = NULL;
  CUresult rs = cuGraphAddMemsetNode(&set_node, g, NULL, 0, &ms, g_primary);
  CUDA_MEMCPY3D c3;
  memset(&c3, 0, sizeof c3);
  c3.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c3.srcDevice = dp;
  c3.srcPitch = m;
  c3.dstMemoryType = CU_MEMORYTYPE_HOST;
  c3.dstHost = pageable;
  c3.dstPitch = m;
  c3.WidthInBytes = m;
  c3.Height = 1;
  c3.Depth = 1;
  CUresult rc = cuGraphAddMemcpyNode(&copy_node, g, rs == CUDA_SUCCESS ? &set_node : NULL, rs == CUDA_SUCCESS ? 1 : 0,
                                     &c3, g_primary);
  CUgraphExec exec = NULL;
  CUresult ri = cuGraphInstantiate(&exec, g, 0);
  memset(pageable, 0, m); /* before the launch: the graph's copy writes it */
  CUresult rl = ri == CUDA_SUCCESS ? cuGraphLaunch(exec, (CUstream)streams[kNonBlocking]) : ri;
  CUresult rw = rl == CUDA_SUCCESS ? cuStreamSynchronize((CUstream)streams[kNonBlocking]) : rl;
  printf("%s: graph memset node rc=%d, memcpy node (p as DEVICE) rc=%d, instantiate rc=%d, launch rc=%d, sync rc=%d, "
         "byte 0x%x\n",
         what, (int)rs, (int)rc, (int)ri, (int)rl, (int)rw, ((unsigned char *)pageable)[m - 1]);
  if (exec) CHECK(cuGraphExecDestroy(exec) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(g) == CUDA_SUCCESS);

  /* A second context of the same device. */
  CUcontext other = NULL;
  CUdevice device0 = 0;
  CHECK(cuDeviceGet(&device0, 0) == CUDA_SUCCESS);
  r = cuCtxCreate(&other, NULL, 0, device0);
  if (r == CUDA_SUCCESS) {
    put(p, host, n, ++seed);
    CUresult rx = cuMemcpyDtoH(pageable, dp, m);
    uint64_t ctx = 0;
    CUresult ra = cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, dp);
    CHECK(cuCtxDestroy(other) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(g_primary) == CUDA_SUCCESS);
    printf("%s: from another context: cuMemcpyDtoH rc=%d %s, CONTEXT rc=%d %s\n", what, (int)rx,
           rx == CUDA_SUCCESS ? holds(pageable, 1, n, seed) : "", (int)ra,
           ra == CUDA_SUCCESS ? (ctx == (uint64_t)(uintptr_t)g_primary ? "primary" : "other") : "-");
  } else {
    printf("%s: cuCtxCreate rc=%d\n", what, (int)r);
  }

  free(pageable);
  CHECK_CUDA(cudaFree(dev));
}

/* ---- the allocations ------------------------------------------------------- */
static void device_memory(size_t n, cudaStream_t *streams) {
  char what[64];
  snprintf(what, sizeof what, "device %zu B", n);
  void *p = NULL;
  CHECK_CUDA(tmalloc(&p, n));
  attributes(what, p, n, 0);
  attributes(what, p, n, n / 2);
  operations(what, p, 0, n, streams);
  /* A buffer id is the allocation's: a new allocation has a new one. */
  uint64_t before = 0, after = 0;
  CHECK(cuPointerGetAttribute(&before, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS);
  CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(tmalloc(&p, n));
  CHECK(cuPointerGetAttribute(&after, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS);
  printf("%s: buffer id after free and a new allocation: %s\n", what, before == after ? "the same" : "new");
  CHECK_CUDA(cudaFree(p));
}

static void pitched_memory(cudaStream_t *streams) {
#ifndef SOMA_DRIVER_API
  void *p = NULL;
  size_t pitch = 0, width = 1000, height = 7;
  CHECK_CUDA(cudaMallocPitch(&p, &pitch, width, height));
  note_alloc(p);
  printf("pitched: pitch %zu\n", pitch);
  attributes("pitched 1000x7", p, pitch * height, 0);
  operations("pitched 1000x7", p, 0, pitch * height, streams);
  CHECK_CUDA(cudaFree(p));
#else
  (void)streams;
#endif
}

static void host_memory(const char *name, unsigned flags, int plain, size_t n, cudaStream_t *streams) {
  char what[96];
  snprintf(what, sizeof what, "%s %zu B", name, n);
  void *p = NULL;
  CHECK_CUDA(plain ? thost_malloc(&p, n) : thost_alloc(&p, n, flags));
  if (!p) return;
  attributes(what, p, n, 0);
  attributes(what, p, n, n / 2);
  operations(what, p, 1, n, streams);
  CHECK_CUDA(host_free(p));
}

int main(void) {
  CHECK_CUDA(cudaFree(NULL));
  CHECK(cuCtxGetCurrent(&g_primary) == CUDA_SUCCESS);
  cudaStream_t streams[2] = {0, NULL};
  CHECK_CUDA(cudaStreamCreateWithFlags(&streams[kNonBlocking], cudaStreamNonBlocking));

  device_memory(200, streams);
  device_memory(1 * MiB + 100, streams);
  pitched_memory(streams);
#ifdef SOMA_DRIVER_API
  host_memory("cuMemAllocHost", 0, 1, 8, streams);
  host_memory("cuMemAllocHost", 0, 1, 1 * MiB + 100, streams);
  host_memory("cuMemHostAlloc(PORTABLE)", 1, 0, 8, streams);
  host_memory("cuMemHostAlloc(DEVICEMAP)", 2, 0, 4096, streams);
#else
  host_memory("cudaMallocHost", 0, 1, 8, streams);
  host_memory("cudaMallocHost", 0, 1, 1 * MiB + 100, streams);
  host_memory("cudaHostAlloc(Portable)", 1, 0, 8, streams);
  host_memory("cudaHostAlloc(Mapped)", 2, 0, 4096, streams);
#endif

  CHECK_CUDA(cudaStreamDestroy(streams[kNonBlocking]));
  print_pooled();
  return report();
}
