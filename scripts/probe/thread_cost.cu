// Where host threads and idle non-blocking streams cost the shim time
// (driver API, no shim). Part 1: N threads churning 1 MiB on the legacy
// stream, by the pieces the shim's legacy path adds. Part 2: what ordering a
// free after 32 idle non-blocking streams costs, per stream. Part 3: device
// memory taken by the objects the shim makes per device.
// Build: nvcc -O2 -arch=sm_90 thread_cost.cu -lcuda -o thread_cost
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now_us() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void touch(int *p) { if (threadIdx.x == 0 && p) p[0] = 1; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
static double median(double *t, int n) { qsort(t, n, sizeof *t, cmp); return t[n / 2]; }

enum { REPS = 2000, MAX_THREADS = 8 };
enum Variant { RUNTIME_ASYNC, DRIVER_POOL, SHARED_RECORD, SHARED_RECORD_MUTEX, OWN_RECORD, MUTEX_ONLY, CONTEXT_QUERIES, VARIANTS };
static const char *names[] = {"cudaMallocAsync/cudaFreeAsync(0)", "pool alloc/free on legacy (driver)",
                              "+ record a shared event before free", "+ shared record, mutex over record+free",
                              "+ record a per-thread event", "+ mutex over free only",
                              "+ shared record, the shim's context queries"};
static CUmemoryPool pool;
static CUcontext ctx;
static CUevent shared_mark;
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static int variant;
static double times[MAX_THREADS * REPS];

/* What the shim asks the driver on each call: the current context, its
 * device and ID (a reset shows as a new ID). */
static void context_queries(void) {
  CUcontext c;
  CUdevice d;
  unsigned long long id;
  cuCtxGetCurrent(&c);
  cuCtxGetDevice(&d);
  cuCtxGetId(c, &id);
}

static void *churn(void *arg) {
  int id = (int)(long)arg;
  cuCtxSetCurrent(ctx);
  CUevent own;
  cuEventCreate(&own, CU_EVENT_DISABLE_TIMING);
  for (int r = -100; r < REPS; r++) {
    double t0 = now_us();
    CUdeviceptr p = 0;
    if (variant == CONTEXT_QUERIES) context_queries();
    if (variant == RUNTIME_ASYNC) cudaMallocAsync((void **)&p, 1 << 20, 0);
    else cuMemAllocFromPoolAsync(&p, 1 << 20, pool, CU_STREAM_LEGACY);
    touch<<<1, 32>>>((int *)p);
    if (variant == RUNTIME_ASYNC) {
      cudaFreeAsync((void *)p, 0);
    } else {
      if (variant == CONTEXT_QUERIES) context_queries();
      int locked = variant == SHARED_RECORD_MUTEX || variant == MUTEX_ONLY;
      if (locked) pthread_mutex_lock(&mutex);
      if (variant == SHARED_RECORD || variant == SHARED_RECORD_MUTEX || variant == CONTEXT_QUERIES) cuEventRecord(shared_mark, CU_STREAM_LEGACY);
      if (variant == OWN_RECORD) cuEventRecord(own, CU_STREAM_LEGACY);
      cuMemFreeAsync(p, CU_STREAM_LEGACY);
      if (locked) pthread_mutex_unlock(&mutex);
    }
    if (r >= 0) times[id * REPS + r] = now_us() - t0;
  }
  cuCtxSynchronize();
  cuEventDestroy(own);
  return NULL;
}

static void part_threads(void) {
  printf("part 1: 1 MiB malloc/launch/free on the legacy stream, median us per iteration\n");
  printf("%-42s %8s %8s %8s\n", "variant", "1 thr", "4 thr", "8 thr");
  for (variant = 0; variant < VARIANTS; variant++) {
    printf("%-42s", names[variant]);
    int counts[] = {1, 4, 8};
    for (int c = 0; c < 3; c++) {
      pthread_t th[MAX_THREADS];
      for (long i = 0; i < counts[c]; i++) pthread_create(&th[i], NULL, churn, (void *)i);
      for (int i = 0; i < counts[c]; i++) pthread_join(th[i], NULL);
      printf(" %8.2f", median(times, counts[c] * REPS));
    }
    printf("\n");
  }
}

/* One free's ordering after K idle non-blocking streams, with a kernel on
 * the legacy stream before it (as a program's work would be). */
static void part_idle_streams(void) {
  enum { K = 32, ITERS = 2000 };
  CUstream streams[K], join;
  for (int i = 0; i < K; i++) cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING);
  cuStreamCreate(&join, CU_STREAM_NON_BLOCKING);
  CUevent scratch;
  cuEventCreate(&scratch, CU_EVENT_DISABLE_TIMING);
  const char *labels[] = {"launch only", "launch + record/wait x32", "launch + cuStreamQuery x32",
                          "launch + record/wait x32 (1 busy)", "launch + cuStreamQuery x32 (1 busy)"};
  printf("part 2: per iteration, %d idle non-blocking streams, median us\n", K);
  static double t[ITERS];
  for (int v = 0; v < 5; v++) {
    int busy = v >= 3;
    for (int i = -100; i < ITERS; i++) {
      if (busy) touch<<<1, 32, 0, streams[0]>>>(NULL);
      double t0 = now_us();
      touch<<<1, 32>>>(NULL);
      for (int s = 0; s < K && v > 0; s++) {
        if (v == 1 || v == 3) {
          cuEventRecord(scratch, streams[s]);
          cuStreamWaitEvent(join, scratch, 0);
        } else {
          cuStreamQuery(streams[s]);
        }
      }
      if (i >= 0) t[i] = now_us() - t0;
      if (i % 64 == 0) cuCtxSynchronize();
    }
    cuCtxSynchronize();
    printf("%-42s %8.2f\n", labels[v], median(t, ITERS));
  }
  for (int i = 0; i < K; i++) cuStreamDestroy(streams[i]);
  cuStreamDestroy(join);
  cuEventDestroy(scratch);
}

static long long used_mib(void) {
  size_t fr, tot;
  cudaMemGetInfo(&fr, &tot);
  return (long long)((tot - fr) >> 20);
}

static void part_memory(void) {
  printf("part 3: device MiB in use after each step\n");
  printf("  start %lld\n", used_mib());
  CUmemoryPool own;
  CUmemPoolProps pp = {};
  pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  cuMemPoolCreate(&own, &pp);
  printf("  + a pool %lld\n", used_mib());
  CUstream a, b;
  cuStreamCreate(&a, CU_STREAM_NON_BLOCKING);
  printf("  + a non-blocking stream %lld\n", used_mib());
  cuStreamCreate(&b, CU_STREAM_NON_BLOCKING);
  printf("  + another %lld\n", used_mib());
  CUevent e[2];
  for (int i = 0; i < 2; i++) cuEventCreate(&e[i], CU_EVENT_DISABLE_TIMING);
  printf("  + two events %lld\n", used_mib());
  CUdeviceptr p;
  cuMemAllocFromPoolAsync(&p, 256, own, CU_STREAM_LEGACY);
  cuCtxSynchronize();
  printf("  + 256 B from the pool %lld\n", used_mib());
}

int main() {
  cudaFree(0);
  cuCtxGetCurrent(&ctx);
  touch<<<1, 32>>>(NULL);
  cudaDeviceSynchronize();
  part_memory();
  CUmemPoolProps pp = {};
  pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  cuMemPoolCreate(&pool, &pp);
  cuuint64_t th = ~0ull;
  cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &th);
  cudaMemPool_t def;
  cudaDeviceGetDefaultMemPool(&def, 0);
  cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &th);
  cuEventCreate(&shared_mark, CU_EVENT_DISABLE_TIMING);
  part_threads();
  part_idle_streams();
  return 0;
}
