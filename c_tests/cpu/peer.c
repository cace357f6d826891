/* Behaviour 10, peer access (FAKECUDA_DEVICES=2). Memory is reachable from a
 * peer exactly as the real cudaMalloc's: not before cudaDeviceEnablePeerAccess,
 * yes after, for a pool created before the grant and for one created after it
 * (the shim grants the accessor on the owner's pool with cuMemPoolSetAccess).
 * A device-1 pointer freed while device 0 is current goes back to device 1's
 * pool, ordered after device 1's streams, and device 0 stays current. (Under
 * the shim, with a non-blocking stream on device 1, that is eventually: the
 * shim's cache keeps passed blocks until they are unused for 1 s; a second
 * free of one is refused meanwhile.) */
#include "common.h"

static CUcontext current(void) {
  CUcontext c = NULL;
  CHECK(cuCtxGetCurrent(&c) == CUDA_SUCCESS);
  return c;
}

static void check_grant(void *p, int accessor) {
  struct fakecuda_ptr_info info;
  if (!fakecuda_ptr_info(p, &info) || info.kind != FAKECUDA_POOL) return;
  struct fakecuda_pool_stats ps;
  CHECK(fakecuda_pool_stats(info.pool, &ps));
  if (ps.access[accessor] != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
    fprintf(stderr, "%s:%d: device %d's pool does not grant device %d (access %u, %llu set-access calls)\n",
            __FILE__, __LINE__, ps.device, accessor, ps.access[accessor],
            (unsigned long long)ps.set_access_calls);
    check_failures++;
  }
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  int n = 0;
  CHECK_CUDA(cudaGetDeviceCount(&n));
  CHECK_EQ(n, 2);
  if (n < 2) return report();

  /* a0 on device 0: its pool exists before device 1 is granted access */
  CHECK_CUDA(cudaSetDevice(0));
  void *a0 = NULL;
  SHOW_RC("malloc a0 on 0", cudaMalloc(&a0, MiB));
  struct fakecuda_ptr_info info;
  CHECK(fakecuda_ptr_info(a0, &info) && info.device == 0);

  /* device 0 may reach device 1 before device 1 has allocated anything */
  SHOW_RC("0 enables peer 1", cudaDeviceEnablePeerAccess(1, 0));
  SHOW_RC("0 enables peer 1 again", cudaDeviceEnablePeerAccess(1, 0));
  CHECK_LAST_ERROR_ONCE(cudaErrorPeerAccessAlreadyEnabled);
  CUcontext ctx0 = current();

  CHECK_CUDA(cudaSetDevice(1));
  CUcontext ctx1 = current();
  CHECK(ctx1 != ctx0);
  void *a1 = NULL, *b1 = NULL;
  SHOW_RC("malloc a1 on 1", cudaMalloc(&a1, MiB));
  SHOW_RC("malloc b1 on 1", cudaMalloc(&b1, 2 * MiB));
  CHECK(fakecuda_ptr_info(a1, &info) && info.device == 1);
  void *pool1 = info.pool;
  SHOW_RC("kernel on 1 touches a0 (no access yet)", fakecuda_launch(NULL, a0));
  cudaStream_t s1;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_EQ(fakecuda_launch(s1, a1), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(s1, b1), CUDA_SUCCESS);
  CHECK_EQ(fakecuda_launch(NULL, b1), CUDA_SUCCESS);

  CHECK_CUDA(cudaSetDevice(0));
  /* the pool created after the grant covers device 0 */
  SHOW_RC("kernel on 0 touches a1", fakecuda_launch(NULL, a1));
  check_grant(a1, 0);

  /* device 1 enables device 0: a0's pool, older than the grant, covers it */
  CHECK_CUDA(cudaSetDevice(1));
  SHOW_RC("1 enables peer 0", cudaDeviceEnablePeerAccess(0, 0));
  SHOW_RC("kernel on 1 touches a0", fakecuda_launch(NULL, a0));
  check_grant(a0, 1);
  void *c1 = NULL;
  SHOW_RC("malloc c1 on 1", cudaMalloc(&c1, MiB));

  /* free device-1 pointers while device 0 is current */
  CHECK_CUDA(cudaSetDevice(0));
  fakecuda_last_problem(); /* forget the expected complaints above */
  struct fakecuda_pool_stats before, after;
  int have_pool = pool1 && fakecuda_pool_stats(pool1, &before);
  struct fakecuda_counters b = snap();
  SHOW_RC("free a1 from 0", cudaFree(a1));
  SHOW_RC("free b1 from 0", cudaFree(b1));
  struct fakecuda_counters m = snap();
  CHECK(current() == ctx0);
  int dev = -1;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_EQ(dev, 0);
  CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
  CHECK_EQ(DELTA(b, m, invalid_handles), 0);
  CHECK_RELEASED(a1); /* a double free from device 0 is refused */
  CHECK_RELEASED(b1);
  CHECK(current() == ctx0);
  /* the blocks reach device 1's pool */
  CHECK_CUDA(cudaSetDevice(1));
  nudge();
  CHECK_CUDA(cudaSetDevice(0));
  CHECK(EVENTUALLY(ptr_kind(a1) == FAKECUDA_NONE && ptr_kind(b1) == FAKECUDA_NONE));
  m = snap();
  CHECK_EQ(ptr_kind(a1), FAKECUDA_NONE);
  CHECK_EQ(ptr_kind(b1), FAKECUDA_NONE);
  CHECK_EQ(DELTA(b, m, unordered_frees), 0);
  CHECK_EQ(DELTA(b, m, drv_invalid_frees), 0);
  show_problem("free from device 0");
  if (have_pool && expect_pool(MiB)) {
    CHECK(fakecuda_pool_stats(pool1, &after));
    CHECK_EQ(after.device, 1);
    /* back to device 1's pool (which now also holds the nudge's 4 KiB) */
    CHECK((long long)before.used - (long long)after.used >= (long long)(3 * MiB) - 4096);
    CHECK(DELTA(b, m, pool_frees) >= 2);
  }
  /* device 0 still allocates from device 0 */
  void *d0 = NULL;
  SHOW_RC("malloc d0", cudaMalloc(&d0, MiB));
  CHECK(fakecuda_ptr_info(d0, &info) && info.device == 0);
  SHOW_RC("kernel on 0 touches c1", fakecuda_launch(NULL, c1));
  SHOW_RC("free c1 from 0", cudaFree(c1));
  SHOW_RC("free d0", cudaFree(d0));
  SHOW_RC("free a0", cudaFree(a0));
  CHECK(current() == ctx0);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaStreamDestroy(s1));
  CHECK_CUDA(cudaDeviceSynchronize());
  return report();
}
