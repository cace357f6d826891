// Where the time goes when GPU memory changes hands (run natively on device 0,
// no shim). For each block size (2 MiB, 32 MiB, 256 MiB, 1344 MiB, 4 GiB) and
// count = total / size (at most 4096; total = min(84 GiB, 60% of the device),
// 8 GiB for 2 MiB blocks):
//
//   malloc / free          N x cudaMalloc, then N x cudaFree
//   pool_*                 an explicit pool (pinned, release threshold
//                          UINT64_MAX) on one non-blocking stream: grow, free,
//                          trim to 0, regrow, free, reuse (all reserved),
//                          free, trim again
//   pool_trim_half         (1344 MiB) grow, free, trim to half the total
//   pool_grow_after_one_big (1344 MiB) one block of the whole total, freed,
//                          then N blocks from that reservation
//   vmm_*                  N x cuMemAddressReserve + cuMemCreate + cuMemMap +
//                          cuMemSetAccess (each phase summed), the teardown
//   vmm_chunks2m           (1344 MiB) up to 8 GiB of 2 MiB physical chunks
//                          mapped into one reservation
//   export / import        (1344 MiB) POSIX fd export and same-process import
//   malloc_one             one cudaMalloc of the whole total and its cudaFree
//
// One measurement per line, `key name value ...` pairs, times in ms (wall,
// CLOCK_MONOTONIC, device synchronized before each timer). Every measurement
// returns its memory before the next starts; after ~100 s the rest is printed
// as `skip` lines so the run stays under 2 minutes.
//
//   nvcc -O2 -arch=sm_90 scripts/probe/growth.cu -lcuda -lpthread -o build/growth && build/growth
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "../../c_tests/exit_on_error.h"

#define P(...) do { printf(__VA_ARGS__); fflush(stdout); } while (0)

#define CHECK_DRV(call)                                                              \
  do {                                                                               \
    CUresult r_ = (call);                                                            \
    if (r_ != CUDA_SUCCESS) {                                                        \
      const char *s_ = "?";                                                          \
      cuGetErrorName(r_, &s_);                                                       \
      P("error %s:%d %s rc %d %s\n", __FILE__, __LINE__, #call, (int)r_, s_);        \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

static const size_t MiB = 1ull << 20, GiB = 1ull << 30;
static const size_t SIZES[] = {2 * MiB, 32 * MiB, 256 * MiB, 1344 * MiB, 4 * GiB};
static const size_t BIG = 1344 * MiB;  // the size the single-size measurements use
static const int MAX_COUNT = 4096;
static const double BUDGET_MS = 100e3;  // start no measurement after this

static size_t g_cap;      // the most memory one measurement may hold
static double g_start;    // ms, program start
static cudaStream_t g_stream;

static double now_ms() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Wait for the device, then read the clock: the start of every timer.
static double start_timer() {
  CK(cudaDeviceSynchronize());
  return now_ms();
}

static size_t free_mib() {
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  return free_b / MiB;
}

// The total one measurement of blocks of `size` uses (2 MiB: 8 GiB).
static size_t total_for(size_t size) { return size == 2 * MiB && g_cap > 8 * GiB ? 8 * GiB : g_cap; }

static int count_for(size_t size) {
  size_t n = total_for(size) / size;
  return (int)(n > (size_t)MAX_COUNT ? MAX_COUNT : n);
}

// False (with a `skip` line) when the measurement must not run.
static bool may_run(const char *key, size_t size, int count) {
  if (count < 1) {
    P("skip key %s size_mib %zu reason size_over_cap cap_mib %zu\n", key, size / MiB, g_cap / MiB);
    return false;
  }
  if (now_ms() - g_start > BUDGET_MS) {
    P("skip key %s size_mib %zu reason time_budget\n", key, size / MiB);
    return false;
  }
  return true;
}

static void print_timed(const char *key, size_t size, int count, double ms) {
  P("%s size_mib %zu count %d total_ms %.3f per_call_ms %.4f\n", key, size / MiB, count, ms, ms / count);
}

// 1. cudaMalloc / cudaFree -------------------------------------------------

static void measure_malloc(size_t size) {
  int n = count_for(size);
  if (!may_run("malloc", size, n)) return;
  size_t before = free_mib();
  std::vector<void *> p(n);
  double t = start_timer();
  for (int i = 0; i < n; i++) CK(cudaMalloc(&p[i], size));
  double malloc_ms = now_ms() - t;
  P("malloc size_mib %zu count %d total_ms %.3f per_call_ms %.4f free_before_mib %zu\n",
    size / MiB, n, malloc_ms, malloc_ms / n, before);
  t = start_timer();
  for (int i = 0; i < n; i++) CK(cudaFree(p[i]));
  print_timed("free", size, n, now_ms() - t);
}

// 2-4. Explicit stream-ordered pool -----------------------------------------

static cudaMemPool_t make_pool() {
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool;
  CK(cudaMemPoolCreate(&pool, &props));
  uint64_t threshold = UINT64_MAX;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  return pool;
}

static size_t reserved_mib(cudaMemPool_t pool) {
  uint64_t v = 0;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v));
  return (size_t)(v / MiB);
}

// N allocations of `size` from the pool, ordered on g_stream; ms until done.
static double pool_alloc_all(cudaMemPool_t pool, size_t size, std::vector<void *> &p) {
  double t = start_timer();
  for (size_t i = 0; i < p.size(); i++) CK(cudaMallocFromPoolAsync(&p[i], size, pool, g_stream));
  CK(cudaStreamSynchronize(g_stream));
  return now_ms() - t;
}

static double pool_free_all(std::vector<void *> &p) {
  double t = start_timer();
  for (size_t i = 0; i < p.size(); i++) CK(cudaFreeAsync(p[i], g_stream));
  CK(cudaStreamSynchronize(g_stream));
  return now_ms() - t;
}

static double pool_trim(cudaMemPool_t pool, size_t keep) {
  double t = start_timer();
  CK(cudaMemPoolTrimTo(pool, keep));
  CK(cudaDeviceSynchronize());
  return now_ms() - t;
}

static void print_pool(const char *key, size_t size, int count, double ms, cudaMemPool_t pool) {
  P("%s size_mib %zu count %d total_ms %.3f per_call_ms %.4f reserved_after_mib %zu\n",
    key, size / MiB, count, ms, ms / count, reserved_mib(pool));
}

static void destroy_pool(cudaMemPool_t pool) {
  CK(cudaMemPoolTrimTo(pool, 0));
  CK(cudaMemPoolDestroy(pool));
  CK(cudaDeviceSynchronize());
}

// grow, free, trim; regrow, free; reuse (all reserved), free; trim again.
static void measure_pool(size_t size) {
  int n = count_for(size);
  if (!may_run("pool_grow", size, n)) return;
  size_t before = free_mib();
  cudaMemPool_t pool = make_pool();
  std::vector<void *> p(n);
  double ms = pool_alloc_all(pool, size, p);
  P("pool_grow size_mib %zu count %d total_ms %.3f per_call_ms %.4f reserved_after_mib %zu free_before_mib %zu\n",
    size / MiB, n, ms, ms / n, reserved_mib(pool), before);
  print_pool("pool_free", size, n, pool_free_all(p), pool);
  print_pool("pool_trim", size, 1, pool_trim(pool, 0), pool);
  print_pool("pool_regrow", size, n, pool_alloc_all(pool, size, p), pool);
  print_pool("pool_regrow_free", size, n, pool_free_all(p), pool);
  print_pool("pool_reuse", size, n, pool_alloc_all(pool, size, p), pool);
  print_pool("pool_reuse_free", size, n, pool_free_all(p), pool);
  print_pool("pool_retrim", size, 1, pool_trim(pool, 0), pool);
  destroy_pool(pool);
}

// 3. Grow, free all, trim to half of the total.
static void measure_pool_trim_half(size_t size) {
  int n = count_for(size);
  if (!may_run("pool_trim_half", size, n)) return;
  cudaMemPool_t pool = make_pool();
  std::vector<void *> p(n);
  pool_alloc_all(pool, size, p);
  pool_free_all(p);
  size_t keep = (size_t)n * size / 2;
  double ms = pool_trim(pool, keep);
  P("pool_trim_half size_mib %zu count %d keep_mib %zu total_ms %.3f reserved_after_mib %zu\n",
    size / MiB, n, keep / MiB, ms, reserved_mib(pool));
  destroy_pool(pool);
}

// 4. One block of the whole total, freed (reserved as one chunk), then N blocks.
static void measure_pool_after_one_big(size_t size) {
  int n = count_for(size);
  if (!may_run("pool_grow_after_one_big", size, n)) return;
  cudaMemPool_t pool = make_pool();
  std::vector<void *> one(1), p(n);
  double big_ms = pool_alloc_all(pool, (size_t)n * size, one);
  P("pool_one_big size_mib %zu count 1 total_ms %.3f reserved_after_mib %zu\n",
    (size_t)n * size / MiB, big_ms, reserved_mib(pool));
  pool_free_all(one);
  print_pool("pool_grow_after_one_big", size, n, pool_alloc_all(pool, size, p), pool);
  pool_free_all(p);
  destroy_pool(pool);
}

// 5-6. Driver VMM -----------------------------------------------------------

static CUmemAllocationProp vmm_prop() {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

static size_t g_granularity;  // minimum; sizes are rounded up to it

static void print_granularity() {
  CUmemAllocationProp prop = vmm_prop();
  size_t minimum = 0, recommended = 0;
  CHECK_DRV(cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK_DRV(cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  P("granularity minimum_bytes %zu recommended_bytes %zu\n", minimum, recommended);
  g_granularity = minimum;
}

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

static CUmemAccessDesc rw_access() {
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

// Adds the ms the call takes (device synchronized first) to `sum`.
#define TIMED(sum, call)            \
  do {                              \
    double t_ = start_timer();      \
    CHECK_DRV(call);                \
    (sum) += now_ms() - t_;         \
  } while (0)

// N blocks, each its own reservation, physical handle, mapping and access.
static void measure_vmm(size_t size) {
  int n = count_for(size);
  if (!may_run("vmm", size, n)) return;
  size_t bytes = round_up(size, g_granularity), before = free_mib();
  CUmemAllocationProp prop = vmm_prop();
  CUmemAccessDesc access = rw_access();
  std::vector<CUdeviceptr> va(n);
  std::vector<CUmemGenericAllocationHandle> h(n);
  double reserve = 0, create = 0, map = 0, set = 0;
  for (int i = 0; i < n; i++) {
    TIMED(reserve, cuMemAddressReserve(&va[i], bytes, 0, 0, 0));
    TIMED(create, cuMemCreate(&h[i], bytes, &prop, 0));
    TIMED(map, cuMemMap(va[i], bytes, 0, h[i], 0));
    TIMED(set, cuMemSetAccess(va[i], bytes, &access, 1));
  }
  P("vmm size_mib %zu count %d vmm_reserve_ms %.3f vmm_create_ms %.3f vmm_map_ms %.3f vmm_access_ms %.3f "
    "total_ms %.3f per_block_ms %.4f free_before_mib %zu\n",
    bytes / MiB, n, reserve, create, map, set, reserve + create + map + set,
    (reserve + create + map + set) / n, before);
  double unmap = 0, release = 0, addr_free = 0;
  for (int i = 0; i < n; i++) {
    TIMED(unmap, cuMemUnmap(va[i], bytes));
    TIMED(release, cuMemRelease(h[i]));
    TIMED(addr_free, cuMemAddressFree(va[i], bytes));
  }
  double all = unmap + release + addr_free;
  P("vmm_release size_mib %zu count %d vmm_release_ms %.3f per_block_ms %.4f unmap_ms %.3f release_ms %.3f "
    "address_free_ms %.3f\n", bytes / MiB, n, all, all / n, unmap, release, addr_free);
}

// The total of `size` blocks (at most 8 GiB) as 2 MiB physical chunks mapped
// into one reservation, with one cuMemSetAccess over it all.
static void measure_vmm_chunks(size_t size) {
  const size_t chunk = round_up(2 * MiB, g_granularity);
  int blocks = count_for(size);
  size_t total = (size_t)blocks * size;
  if (total > 8 * GiB) total = 8 * GiB;
  total = total / chunk * chunk;
  int n = (int)(total / chunk);
  if (!may_run("vmm_chunks2m", size, blocks < 1 ? 0 : n)) return;
  CUmemAllocationProp prop = vmm_prop();
  CUmemAccessDesc access = rw_access();
  CUdeviceptr va = 0;
  std::vector<CUmemGenericAllocationHandle> h(n);
  double reserve = 0, create = 0, map = 0, set = 0;
  TIMED(reserve, cuMemAddressReserve(&va, total, 0, 0, 0));
  for (int i = 0; i < n; i++) {
    TIMED(create, cuMemCreate(&h[i], chunk, &prop, 0));
    TIMED(map, cuMemMap(va + (size_t)i * chunk, chunk, 0, h[i], 0));
  }
  TIMED(set, cuMemSetAccess(va, total, &access, 1));
  double all = reserve + create + map + set;
  P("vmm_chunks2m total_mib %zu chunk_mib %zu chunks %d vmm_reserve_ms %.3f vmm_create_ms %.3f vmm_map_ms %.3f "
    "vmm_access_ms %.3f total_ms %.3f per_chunk_ms %.4f\n",
    total / MiB, chunk / MiB, n, reserve, create, map, set, all, all / n);
  double unmap = 0, release = 0, addr_free = 0;
  TIMED(unmap, cuMemUnmap(va, total));
  for (int i = 0; i < n; i++) TIMED(release, cuMemRelease(h[i]));
  TIMED(addr_free, cuMemAddressFree(va, total));
  all = unmap + release + addr_free;
  P("vmm_chunks2m_release total_mib %zu chunks %d vmm_release_ms %.3f per_chunk_ms %.4f unmap_ms %.3f "
    "release_ms %.3f address_free_ms %.3f\n", total / MiB, n, all, all / n, unmap, release, addr_free);
}

// One POSIX-fd handle of `size`: export it, import the fd in this process.
static void measure_export(size_t size) {
  if (!may_run("export", size, 1)) return;
  size_t bytes = round_up(size, g_granularity);
  CUmemAllocationProp prop = vmm_prop();
  CUmemGenericAllocationHandle h;
  double create = 0, exp = 0;
  TIMED(create, cuMemCreate(&h, bytes, &prop, 0));
  int fd = -1;
  TIMED(exp, cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  P("export size_mib %zu create_ms %.3f export_ms %.4f fd %d\n", bytes / MiB, create, exp, fd);
  CUmemGenericAllocationHandle imported;
  double t = start_timer();
  CUresult r = cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  double imp = now_ms() - t;
  const char *name = "?";
  cuGetErrorName(r, &name);
  P("import size_mib %zu import_ms %.4f rc %d rc_name %s\n", bytes / MiB, imp, (int)r, name);
  if (r == CUDA_SUCCESS) CHECK_DRV(cuMemRelease(imported));
  close(fd);
  CHECK_DRV(cuMemRelease(h));
  CK(cudaDeviceSynchronize());
}

// 7. The whole total as one cudaMalloc ---------------------------------------

static void measure_malloc_one() {
  if (!may_run("malloc_one", g_cap, 1)) return;
  void *p = 0;
  double t = start_timer();
  CK(cudaMalloc(&p, g_cap));
  double malloc_ms = now_ms() - t;
  t = start_timer();
  CK(cudaFree(p));
  P("malloc_one size_mib %zu malloc_ms %.3f free_ms %.3f\n", g_cap / MiB, malloc_ms, now_ms() - t);
}

int main() {
  g_start = now_ms();
  CK(cudaSetDevice(0));
  CK(cudaFree(0));  // create the primary context; driver calls use it
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CK(cudaDriverGetVersion(&driver));
  CK(cudaRuntimeGetVersion(&runtime));
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  g_cap = (size_t)(0.6 * (double)total_b);
  if (g_cap > 84 * GiB) g_cap = 84 * GiB;
  g_cap = g_cap / (2 * MiB) * (2 * MiB);
  for (char *c = prop.name; *c; c++) if (*c == ' ') *c = '_';  // one token
  P("gpu name %s total_mib %zu free_mib %zu cap_mib %zu driver %d runtime %d\n",
    prop.name, total_b / MiB, free_b / MiB, g_cap / MiB, driver, runtime);
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));

  for (size_t size : SIZES) measure_malloc(size);
  for (size_t size : SIZES) measure_pool(size);
  measure_pool_trim_half(BIG);
  measure_pool_after_one_big(BIG);
  print_granularity();
  for (size_t size : SIZES) measure_vmm(size);
  measure_vmm_chunks(BIG);
  measure_export(BIG);
  measure_malloc_one();

  CK(cudaStreamDestroy(g_stream));
  P("done elapsed_ms %.0f\n", now_ms() - g_start);
  return 0;
}
