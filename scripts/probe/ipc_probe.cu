// Probe of CUDA IPC facts the shim's IPC rests on (run natively, no shim):
// the legacy calls' error codes, and pool export/import between processes.
// Children are started with fork+exec (never fork after CUDA init).
//   nvcc -arch=sm_90 -o ipc_probe scripts/probe/ipc_probe.cu -lcuda && ./ipc_probe
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define P(...) do { printf(__VA_ARGS__); fflush(stdout); } while (0)
static double now_us() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void add1(unsigned *p, size_t n) { size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) p[i] += 1; }
__global__ void fill(unsigned *p, size_t n, unsigned v) { size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) p[i] = v; }

static void hex(const void *b, size_t n, char *out) { for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", ((unsigned char *)b)[i]); }
static void unhex(const char *s, void *b, size_t n) { for (size_t i = 0; i < n; i++) sscanf(s + 2 * i, "%2hhx", &((unsigned char *)b)[i]); }
static const char *self;
static int spawn(const char *a1, const char *a2, const char *a3, int wait_it) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) { execl("/proc/self/exe", self, a1, a2, a3, (char *)NULL); _exit(127); }
  if (!wait_it) return pid;
  int st = 0; waitpid(pid, &st, 0); return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
static unsigned first_word(void *p) { unsigned v = 0; cudaMemcpy(&v, p, 4, cudaMemcpyDeviceToHost); return v; }

// A 64-byte handle in the shim's format (magic, version, pid, endpoint, base, secret): what does the real call say?
static cudaIpcMemHandle_t shim_format(void) {
  cudaIpcMemHandle_t h; memset(&h, 0, sizeof h);
  memcpy(h.reserved, "SOMAIPC\x01", 8); unsigned v = 1, pid = getpid(); memcpy(h.reserved + 8, &v, 4); memcpy(h.reserved + 12, &pid, 4);
  for (int i = 16; i < 64; i++) h.reserved[i] = (char)(i * 37 + 11);
  return h;
}

static int legacy_child(const char *hx) {
  cudaIpcMemHandle_t h; unhex(hx, &h, sizeof h);
  cudaFree(0);
  void *p = 0, *q = 0;
  cudaError_t r = cudaIpcOpenMemHandle(&p, h, 2); cudaError_t le = cudaGetLastError();
  P("child: open flags=2 (invalid): rc=%d last=%d p=%p\n", r, le, p);
  double t0 = now_us(); r = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess); double t1 = now_us();
  P("child: open flags=Lazy: rc=%d first_word=%u (%.1f us)\n", r, r ? 0 : first_word(p), t1 - t0);
  r = cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess); le = cudaGetLastError();
  P("child: open same handle again: rc=%d last=%d same_ptr=%d\n", r, le, q == p);
  if (!r && q) { add1<<<1, 1>>>((unsigned *)q, 1); cudaDeviceSynchronize(); }
  CUdeviceptr dq = 0; CUresult cr = cuIpcOpenMemHandle_v2(&dq, *(CUipcMemHandle *)&h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  P("child: cuIpcOpenMemHandle_v2 same handle again: rc=%d same_ptr=%d\n", cr, (void *)dq == p);
  add1<<<1, 256>>>((unsigned *)p, 256); cudaDeviceSynchronize();
  r = cudaIpcCloseMemHandle(p); P("child: close: rc=%d\n", r);
  if (q) { r = cudaIpcCloseMemHandle(q); P("child: close second open: rc=%d\n", r); }
  if (dq) { cr = cuIpcCloseMemHandle(dq); P("child: cuIpcCloseMemHandle third: rc=%d\n", cr); }
  r = cudaIpcCloseMemHandle(p); le = cudaGetLastError(); P("child: close again: rc=%d last=%d\n", r, le);
  void *mine = 0; cudaMalloc(&mine, 1 << 20);
  r = cudaIpcCloseMemHandle(mine); le = cudaGetLastError(); P("child: close own cudaMalloc ptr: rc=%d last=%d\n", r, le);
  r = cudaIpcCloseMemHandle((char *)mine + 4096); le = cudaGetLastError(); P("child: close interior own ptr: rc=%d last=%d\n", r, le);
  r = cudaIpcCloseMemHandle((void *)0x1000); le = cudaGetLastError(); P("child: close 0x1000: rc=%d last=%d\n", r, le);
  r = cudaIpcCloseMemHandle(NULL); le = cudaGetLastError(); P("child: close NULL: rc=%d last=%d\n", r, le);
  cr = cuIpcCloseMemHandle(0x1000); P("child: cuIpcCloseMemHandle 0x1000: rc=%d\n", cr);
  cudaIpcMemHandle_t f = shim_format(); p = (void *)0x1;
  r = cudaIpcOpenMemHandle(&p, f, cudaIpcMemLazyEnablePeerAccess); le = cudaGetLastError();
  P("child: open shim-format bytes: rc=%d last=%d p=%p\n", r, le, p);
  cr = cuIpcOpenMemHandle_v2(&dq, *(CUipcMemHandle *)&f, 1); P("child: cuIpcOpenMemHandle_v2 shim-format: rc=%d\n", cr);
  memset(&f, 0, sizeof f); r = cudaIpcOpenMemHandle(&p, f, 1); le = cudaGetLastError();
  P("child: open zero handle: rc=%d last=%d\n", r, le);
  cudaIpcMemHandle_t g = h; for (int i = 16; i < 64; i++) g.reserved[i] ^= 0x5a;
  r = cudaIpcOpenMemHandle(&p, g, 1); le = cudaGetLastError(); P("child: open corrupted legacy handle: rc=%d last=%d\n", r, le);
  r = cudaIpcOpenMemHandle(NULL, h, 1); le = cudaGetLastError(); P("child: open with NULL out: rc=%d last=%d\n", r, le);
  return 0;
}

static int exit_exporter(const char *unused) {
  (void)unused; void *p; cudaMalloc(&p, 1 << 20); cudaIpcMemHandle_t h; cudaIpcGetMemHandle(&h, p);
  char hx[129]; hex(&h, 64, hx); P("%s\n", hx); return 0;  // exits without freeing
}

static int stale_child(const char *hx) {
  cudaIpcMemHandle_t h; unhex(hx, &h, sizeof h); void *p = 0;
  cudaError_t r = cudaIpcOpenMemHandle(&p, h, 1); cudaError_t le = cudaGetLastError();
  P("stale_child: open handle of a freed block: rc=%d last=%d\n", r, le);
  return 0;
}

// Pool export/import across processes: argv fd, export data hex.
static int pool_child(const char *fds, const char *hx) {
  int fd = atoi(fds); CUmemPoolPtrExportData d; unhex(hx, &d, sizeof d);
  cudaFree(0); CUmemoryPool pool = 0;
  double t0 = now_us();
  CUresult r = cuMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  double t1 = now_us();
  P("pool_child: import pool: rc=%d (%.1f us)\n", r, t1 - t0);
  CUmemoryPool pool2 = 0;
  CUresult r2 = cuMemPoolImportFromShareableHandle(&pool2, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  P("pool_child: import same fd again: rc=%d same_pool=%d\n", r2, pool2 == pool);
  CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  t0 = now_us(); r = cuMemPoolSetAccess(pool, &a, 1); t1 = now_us();
  P("pool_child: set access dev0 on imported pool: rc=%d (%.1f us)\n", r, t1 - t0);
  CUdeviceptr p = 0, q = 0;
  t0 = now_us(); r = cuMemPoolImportPointer(&p, pool, &d); t1 = now_us();
  P("pool_child: import pointer: rc=%d (%.1f us)\n", r, t1 - t0);
  r2 = cuMemPoolImportPointer(&q, pool, &d); P("pool_child: import pointer again: rc=%d same=%d\n", r2, q == p);
  if (r == CUDA_SUCCESS) {
    P("pool_child: first word=%u\n", first_word((void *)p));
    add1<<<(1 << 18) / 256, 256>>>((unsigned *)p, 1 << 18); cudaError_t k = cudaDeviceSynchronize(); P("pool_child: kernel: %d\n", k);
    CUdeviceptr base = 0; size_t sz = 0; CUresult rr = cuMemGetAddressRange(&base, &sz, p + 4096);
    P("pool_child: address range of interior imported: rc=%d base_ok=%d size=%zu\n", rr, base == p, sz);
    t0 = now_us(); r = cuMemFree(p); t1 = now_us(); P("pool_child: cuMemFree imported: rc=%d (%.1f us)\n", r, t1 - t0);
    if (r2 == CUDA_SUCCESS && q != p) { r = cuMemFree(q); P("pool_child: free second import: rc=%d\n", r); }
    cudaError_t rc = cudaIpcCloseMemHandle((void *)p); P("pool_child: cudaIpcCloseMemHandle on freed import: rc=%d\n", rc); cudaGetLastError();
  }
  return 0;
}

int main(int argc, char **argv) {
  self = argv[0];
  if (argc >= 3 && !strcmp(argv[1], "legacy")) return legacy_child(argv[2]);
  if (argc >= 2 && !strcmp(argv[1], "exiter")) return exit_exporter(argv[1]);
  if (argc >= 3 && !strcmp(argv[1], "stale")) return stale_child(argv[2]);
  if (argc >= 4 && !strcmp(argv[1], "pool")) return pool_child(argv[2], argv[3]);
  cudaFree(0);
  int v = 0; cuDriverGetVersion(&v); P("driver version %d\n", v);
  // ---- legacy IPC codes
  unsigned *buf; cudaMalloc(&buf, 1 << 20); fill<<<1024, 256>>>(buf, 1 << 18, 5); cudaDeviceSynchronize();
  cudaIpcMemHandle_t h, hi; char hx[129];
  cudaError_t r = cudaIpcGetMemHandle(&h, buf); P("get handle: rc=%d\n", r);
  r = cudaIpcGetMemHandle(&hi, (char *)buf + 4096); P("get handle interior: rc=%d same_bytes=%d\n", r, !memcmp(&h, &hi, 64));
  cudaIpcMemHandle_t h2; cudaIpcGetMemHandle(&h2, buf); P("get handle twice: same_bytes=%d\n", !memcmp(&h, &h2, 64));
  hex(&h, 64, hx); P("legacy handle bytes: %s\n", hx);
  r = cudaIpcGetMemHandle(&h2, NULL); P("get handle NULL: rc=%d last=%d\n", r, cudaGetLastError());
  r = cudaIpcGetMemHandle(&h2, (void *)0x1000); P("get handle 0x1000: rc=%d last=%d\n", r, cudaGetLastError());
  void *ap; cudaMallocAsync(&ap, 1 << 20, 0); cudaStreamSynchronize(0);
  r = cudaIpcGetMemHandle(&h2, ap); P("get handle cudaMallocAsync ptr: rc=%d last=%d\n", r, cudaGetLastError());
  CUipcMemHandle dh; CUresult cr = cuIpcGetMemHandle(&dh, (CUdeviceptr)ap); P("cuIpcGetMemHandle cudaMallocAsync ptr: rc=%d\n", cr);
  void *p = (void *)0x1; r = cudaIpcOpenMemHandle(&p, h, 1); P("open in exporting process: rc=%d last=%d p=%p\n", r, cudaGetLastError(), p);
  CUdeviceptr dp = 0; cr = cuIpcOpenMemHandle_v2(&dp, *(CUipcMemHandle *)&h, 1); P("cuIpcOpenMemHandle_v2 in exporting process: rc=%d\n", cr);
  hex(&hi, 64, hx); spawn("legacy", hx, NULL, 1);
  P("parent after child: first word=%u (5 + child adds)\n", first_word(buf));
  // exporter that exits
  int pfd[2]; pipe(pfd); fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) { dup2(pfd[1], 1); close(pfd[0]); execl("/proc/self/exe", self, "exiter", (char *)NULL); _exit(127); }
  close(pfd[1]); char line[200] = {0}; ssize_t n = read(pfd[0], line, 129); (void)n; int st; waitpid(pid, &st, 0);
  cudaIpcMemHandle_t eh; unhex(line, &eh, 64);
  p = 0; r = cudaIpcOpenMemHandle(&p, eh, 1); P("open handle of an exited exporter: rc=%d last=%d\n", r, cudaGetLastError());
  cr = cuIpcOpenMemHandle_v2(&dp, *(CUipcMemHandle *)&eh, 1); P("cuIpcOpenMemHandle_v2 of exited exporter: rc=%d\n", cr);
  // freed block's handle
  unsigned *tmp; cudaMalloc(&tmp, 2 << 20); cudaIpcMemHandle_t th; cudaIpcGetMemHandle(&th, tmp); cudaFree(tmp);
  hex(&th, 64, hx); spawn("stale", hx, NULL, 1);
  // ---- pools
  CUmemPoolProps props; memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; props.location.type = CU_MEM_LOCATION_TYPE_DEVICE; props.location.id = 0;
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemoryPool pool; cr = cuMemPoolCreate(&pool, &props); P("create IPC pool: rc=%d\n", cr);
  CUmemoryPool plain; props.handleTypes = CU_MEM_HANDLE_TYPE_NONE; cuMemPoolCreate(&plain, &props);
  CUdeviceptr pp = 0; cr = cuMemAllocFromPoolAsync(&pp, 1 << 20, pool, 0); cuStreamSynchronize(0);
  fill<<<1024, 256>>>((unsigned *)pp, 1 << 18, 9); cudaDeviceSynchronize();
  r = cudaIpcGetMemHandle(&h2, (void *)pp); P("legacy get handle on IPC-pool ptr: rc=%d last=%d\n", r, cudaGetLastError());
  CUdeviceptr pl = 0; cuMemAllocFromPoolAsync(&pl, 1 << 20, plain, 0); cuStreamSynchronize(0);
  int fd = -1; double t0 = now_us();
  cr = cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  P("export pool fd: rc=%d fd>=0:%d (%.1f us)\n", cr, fd >= 0, now_us() - t0);
  int fd2 = -1; cuMemPoolExportToShareableHandle(&fd2, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0); P("export again gives new fd: %d\n", fd2 != fd);
  cr = cuMemPoolExportToShareableHandle(&fd2, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0); P("export plain pool: rc=%d\n", cr);
  CUmemPoolPtrExportData d; t0 = now_us(); cr = cuMemPoolExportPointer(&d, pp); P("export pointer: rc=%d (%.1f us)\n", cr, now_us() - t0);
  CUmemPoolPtrExportData d2; cr = cuMemPoolExportPointer(&d2, pp + 4096); P("export interior pointer: rc=%d\n", cr);
  cuMemPoolExportPointer(&d2, pp); P("export pointer twice same bytes: %d\n", !memcmp(&d, &d2, sizeof d));
  cr = cuMemPoolExportPointer(&d2, pl); P("export pointer of plain pool: rc=%d\n", cr);
  CUdeviceptr base = 0; size_t sz = 0; cr = cuMemGetAddressRange(&base, &sz, pp + 4096); P("address range interior pool ptr: rc=%d base_ok=%d size=%zu\n", cr, base == pp, sz);
  CUmemoryPool imp; cr = cuMemPoolImportFromShareableHandle(&imp, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0); P("import own pool in exporter: rc=%d\n", cr);
  fcntl(fd, F_SETFD, 0);
  char fds[16]; sprintf(fds, "%d", fd); char dx[2 * sizeof d + 1]; hex(&d, sizeof d, dx);
  spawn("pool", fds, dx, 1);
  P("parent: pool block first word after child=%u (expect 10)\n", first_word((void *)pp));
  // importer holds it; exporter frees; memory still valid in importer? (child spawned, exporter frees after import, child reads later)
  // ---- allocation cost: IPC pool against plain pool (pairs of alloc+free on the legacy stream)
  for (int rep = 0; rep < 2; rep++)
    for (int which = 0; which < 2; which++) {
      CUmemoryPool pl2 = which ? pool : plain; size_t sizes[2] = {256, 1 << 20};
      for (int s = 0; s < 2; s++) {
        CUdeviceptr x; for (int i = 0; i < 1000; i++) { cuMemAllocFromPoolAsync(&x, sizes[s], pl2, 0); cuMemFreeAsync(x, 0); }
        cuStreamSynchronize(0); double t = now_us(); int N = 20000;
        for (int i = 0; i < N; i++) { cuMemAllocFromPoolAsync(&x, sizes[s], pl2, 0); cuMemFreeAsync(x, 0); }
        cuStreamSynchronize(0); P("rep %d pool=%s size=%zu: %.2f us per alloc+free\n", rep, which ? "ipc" : "plain", sizes[s], (now_us() - t) / N);
      }
    }
  // legacy timing: get handle and (in-process impossible) so just get
  t0 = now_us(); for (int i = 0; i < 1000; i++) cudaIpcGetMemHandle(&h2, buf); P("legacy cudaIpcGetMemHandle: %.2f us\n", (now_us() - t0) / 1000);
  return 0;
}
