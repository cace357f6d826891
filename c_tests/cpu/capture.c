/* Contract 9, stream capture: cudaMalloc/cudaFree during a capture give the
 * result the real functions give (measured on an H200: global and
 * thread-local captures fail them with cudaErrorStreamCaptureUnsupported and
 * are invalidated; relaxed captures let them succeed), and the shim never
 * invalidates a capture that would otherwise succeed (say, by recording on the
 * legacy stream while a blocking stream captures, or by making its free
 * stream join a capture through an event). Every return code is compared with
 * the native run. */
#include "common.h"

#include <pthread.h>

static const char *mode_name[] = {"global", "thread_local", "relaxed"};

struct other { int rc_malloc, rc_free; };
static void *other_thread(void *arg) {
  struct other *o = arg;
  void *p = NULL;
  o->rc_malloc = cudaMalloc(&p, MiB);
  o->rc_free = p ? (int)cudaFree(p) : -1;
  cudaGetLastError();
  return NULL;
}

int main(void) {
  printf("# mode %s\n", under_shim() ? "shim" : "native");
  CHECK_CUDA(cudaFree(NULL));
  cudaStream_t blk, nb;
  CHECK_CUDA(cudaStreamCreate(&blk));
  CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  struct fakecuda_counters b0 = snap();
  for (int m = 0; m < 3; m++) {
    for (int which = 0; which < 2; which++) {
      cudaStream_t s = which ? nb : blk;
      char label[160];
#define SHOW(what, call) \
  (snprintf(label, sizeof label, "%s/%s %s", mode_name[m], which ? "nonblocking" : "blocking", what), \
   SHOW_RC(label, call))
      void *old = NULL, *fresh = NULL;
      CHECK_CUDA(cudaMalloc(&old, MiB));
      CHECK_EQ(fakecuda_launch(s, old), CUDA_SUCCESS);
      SHOW("begin", cudaStreamBeginCapture(s, (enum cudaStreamCaptureMode)m));
      CHECK_EQ(fakecuda_launch(s, old), CUDA_SUCCESS); /* captured work */
      cudaError_t rm = cudaMalloc(&fresh, MiB);
      SHOW("malloc", rm);
      SHOW("malloc last error", cudaGetLastError());
      cudaError_t rf = cudaFree(old);
      SHOW("free(old)", rf);
      SHOW("free(old) last error", cudaGetLastError());
      SHOW("free(NULL)", cudaFree(NULL));
      cudaGetLastError();
      if (rm == cudaSuccess) {
        SHOW("free(fresh)", cudaFree(fresh));
        cudaGetLastError();
        fresh = NULL;
      }
      struct other o;
      pthread_t t;
      pthread_create(&t, NULL, other_thread, &o);
      pthread_join(t, NULL);
      SHOW("other thread malloc", o.rc_malloc);
      SHOW("other thread free", o.rc_free);
      enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      SHOW("is capturing", cudaStreamIsCapturing(s, &status));
      SHOW("status", status);
      cudaGraph_t g = NULL;
      SHOW("end", cudaStreamEndCapture(s, &g));
      SHOW("end last error", cudaGetLastError());
      if (g) CHECK_CUDA(cudaGraphDestroy(g));
      /* after the capture everything works again; "old" was freed or not */
      if (rf != cudaSuccess) CHECK_CUDA(cudaFree(old));
      nudge();
      CHECK_RELEASED(old);
      CHECK_CUDA(cudaStreamSynchronize(s));
      CHECK_CUDA(cudaDeviceSynchronize());
      void *p = NULL;
      CHECK_CUDA(cudaMalloc(&p, MiB));
      CHECK_EQ(fakecuda_launch(s, p), CUDA_SUCCESS);
      CHECK_CUDA(cudaFree(p));
      CHECK_LAST_ERROR_ONCE(cudaSuccess);
      show_problem(label);
    }
  }
  struct fakecuda_counters b1 = snap();
  /* the shim's own work never went into a capture */
  CHECK_EQ(DELTA(b0, b1, captured_mem_ops), 0);
  CHECK_EQ(DELTA(b0, b1, drv_invalid_frees), 0);
  CHECK_EQ(DELTA(b0, b1, invalid_handles), 0);
  CHECK_EQ(DELTA(b0, b1, unordered_frees), 0);
  printf("# %lld captures invalidated\n", DELTA(b0, b1, capture_invalidations));

  /* a capture on a stream of the program while the shim's free is pending */
  void *p = NULL;
  CHECK_CUDA(cudaMalloc(&p, MiB));
  CHECK_EQ(fakecuda_launch(nb, p), CUDA_SUCCESS);
  CHECK_CUDA(cudaFree(p));
  SHOW_RC("capture after free: begin", cudaStreamBeginCapture(nb, cudaStreamCaptureModeGlobal));
  CHECK_EQ(fakecuda_launch(nb, NULL), CUDA_SUCCESS);
  cudaGraph_t g = NULL;
  SHOW_RC("capture after free: end", cudaStreamEndCapture(nb, &g));
  if (g) cudaGraphDestroy(g);
  CHECK_CUDA(cudaStreamDestroy(blk));
  CHECK_CUDA(cudaStreamDestroy(nb));
  return report();
}
