// What one ordering of frees costs the host with N live non-blocking streams
// (each rank of scripts/bench_ddp.py under the shim has 131), while a second
// thread makes driver calls too: a 10 us kernel on the legacy stream after
// each sleep_for(5 us) (the sleep often lasts longer, so the GPU idles a lot).
//
//   query:  the shim's barrier: cuStreamQuery each stream; record on the busy
//           ones and make the join stream wait; record done; every stream
//           and the legacy one wait for done
//   record: the same, recording on every stream instead of asking
//   split:  the query barrier with its per-stream calls shared by T threads
//
//   nvcc -O2 -arch=sm_90 scripts/probe/barrier_cost.cu -lcuda -lpthread -o build/barrier_cost
//   build/barrier_cost [N]
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CHECK(call)                                                           \
  do {                                                                        \
    CUresult r_ = (call);                                                     \
    if (r_ != CUDA_SUCCESS) {                                                 \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, r_); \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static int N;
static std::vector<CUstream> streams;
static std::vector<CUevent> covers;
static CUstream join;
static CUevent done, scratch;
// Streams the asking barriers found busy, over all barriers of a measurement:
// asking a busy stream costs less than an idle one, covering it more.
static std::atomic<long> busy_found{0};

static bool is_busy(CUstream stream) {
  CUresult r = cuStreamQuery(stream);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) {
    fprintf(stderr, "cuStreamQuery failed: %d\n", r);
    exit(1);
  }
  return r == CUDA_ERROR_NOT_READY;
}

// Phase 1: cover stream i's work so far on the join stream (asking first,
// or recording at once); phase 2: stream i waits for done.
static void per_stream(int i, int phase, bool ask) {
  if (phase == 2) {
    CHECK(cuStreamWaitEvent(streams[i], done, 0));
  } else if (!ask || is_busy(streams[i])) {
    if (ask) busy_found++;
    CHECK(cuEventRecord(covers[i], streams[i]));
    CHECK(cuStreamWaitEvent(join, covers[i], 0));
  }
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One barrier with its per-stream calls shared by `threads` threads
// (this one and threads - 1 helpers, woken through `generation`).
struct Split {
  int threads;
  bool ask;
  // Apart, so that the helpers' spinning on one does not slow the other.
  alignas(64) std::atomic<int> generation{0};
  alignas(64) std::atomic<int> finished{0};
  std::vector<std::thread> helpers;
  CUcontext ctx;

  Split(int t, bool a, CUcontext c) : threads(t), ask(a), ctx(c) {
    for (int h = 1; h < threads; h++) helpers.emplace_back([this, h] { help(h); });
  }
  ~Split() {
    generation = -1;
    for (auto &h : helpers) h.join();
  }
  void help(int h) {
    CHECK(cuCtxSetCurrent(ctx));
    int seen = 0;
    for (;;) {
      int g;
      while ((g = generation.load()) == seen) {}
      if (g < 0) return;
      seen = g;
      share(h, g % 2 ? 1 : 2);
      finished++;
    }
  }
  void share(int h, int phase) {
    for (int i = h; i < N; i += threads) per_stream(i, phase, ask);
  }
  void phase(int p, int &g) {
    finished = 0;
    generation = ++g;  // odd: phase 1, even: phase 2
    share(0, p);
    while (finished.load() < threads - 1) {}
  }
  double barrier(int &g) {
    double t0 = now_us();
    CHECK(cuEventRecord(scratch, CU_STREAM_LEGACY));
    CHECK(cuStreamWaitEvent(join, scratch, 0));
    phase(1, g);
    CHECK(cuEventRecord(done, join));
    phase(2, g);
    CHECK(cuStreamWaitEvent(CU_STREAM_LEGACY, done, 0));
    return now_us() - t0;
  }
};

static void measure(const char *name, int threads, bool ask, CUcontext ctx) {
  Split split(threads, ask, ctx);
  busy_found = 0;
  int g = 0;
  std::vector<double> t;
  for (int rep = 0; rep < 300; rep++) {
    t.push_back(split.barrier(g));
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::vector<double> sorted = t;
  std::sort(sorted.begin(), sorted.end());
  printf("%-8s threads %d: barrier %7.1f us median [p10 %.1f, p90 %.1f], %.2f us a stream", name, threads,
         median(t), sorted[30], sorted[270], median(t) / N);
  if (ask) printf(", %.1f streams found busy a barrier", busy_found.load() / 300.0);
  printf("\n");
}

int main(int argc, char **argv) {
  N = argc > 1 ? atoi(argv[1]) : 131;
  CHECK(cuInit(0));
  if (cudaFree(0) != cudaSuccess) return 1;
  CUcontext ctx;
  CHECK(cuCtxGetCurrent(&ctx));
  streams.resize(N);
  covers.resize(N);
  for (int i = 0; i < N; i++) {
    CHECK(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&covers[i], CU_EVENT_DISABLE_TIMING));
  }
  CHECK(cuStreamCreate(&join, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&scratch, CU_EVENT_DISABLE_TIMING));

  // The program: 10 us kernels on the legacy stream, a host sync every 50.
  std::atomic<bool> stop{false};
  std::thread program([&] {
    CHECK(cuCtxSetCurrent(ctx));
    for (int i = 1; !stop; i++) {
      spin<<<1, 1>>>(20000);
      if (i % 50 == 0 && cudaStreamSynchronize(0) != cudaSuccess) exit(1);
      std::this_thread::sleep_for(std::chrono::microseconds(5));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  printf("%d non-blocking streams, a thread launching on the legacy stream\n", N);
  for (int round = 0; round < 2; round++) {
    measure("query", 1, true, ctx);
    measure("record", 1, false, ctx);
  }
  for (int threads : {2, 4, 8}) measure("query", threads, true, ctx);
  stop = true;
  program.join();
  cudaError_t e = cudaDeviceSynchronize();
  printf("last error: %s\n", cudaGetErrorString(e));
  return e != cudaSuccess;
}
