/* fake libcuda.so.1: see fakecuda.h for the model and the observation API.
 * Compiled against the real cuda.h, so every entry point has its real
 * signature; cuda.h #defines some names to their _v2 symbols (cuMemAlloc ->
 * cuMemAlloc_v2...), which is what gets exported, as in the real library.
 * One process-wide (recursive) lock serializes everything. Handles are never
 * freed: a stale one is caught by its magic/alive/generation fields. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda.h"

#define MAXDEV 8
#define CTX_MAGIC 0xC0C7C0C7u
#define STREAM_MAGIC 0x57E4A115u
#define EVENT_MAGIC 0xE7E7E7E7u
#define POOL_MAGIC 0x9001F00Du
#define GRAPH_MAGIC 0x64A9F000u

/* ------------------------------------------------------------------ state */
struct vce { uint32_t sid; uint64_t clk; };
struct vc { uint32_t n, cap; struct vce *e; };

struct capture;

struct CUctx_st {
  uint32_t magic;
  int dev;
  int active;      /* retained and not reset */
  int refcount;
  unsigned gen;    /* bumped by every reset: older objects are dead */
  int peer[MAXDEV];
};

struct CUstream_st {
  uint32_t magic, sid;
  struct CUctx_st *ctx;
  unsigned gen;
  int alive;
  unsigned flags;
  int prio;
  int is_legacy, is_per_thread;
  uint64_t clock, last_work, ops;
  uint64_t last_untargeted;     /* last work that may touch any memory */
  struct vc vc;
  uint64_t records, waits, queries, work, pool_allocs, pool_frees;
  struct capture *cap;
};

struct CUevent_st {
  uint32_t magic;
  struct CUctx_st *ctx;
  unsigned gen;
  int alive;
  unsigned flags;
  int recorded;
  struct vc vc;
  struct capture *cap;          /* recorded inside this capture */
  struct CUstream_st *rec_stream;
  uint64_t rec_ops;
};

struct fblk {                   /* freed, still reserved pool memory */
  size_t bytes;
  struct CUstream_st *stream;   /* NULL: completed (synchronous free) */
  uint64_t clk;                 /* stream clock of the free */
  struct vc vc;                 /* the free stream's clock at the free */
  struct vc touch;              /* the work that used the memory before */
  struct fblk *next;
};

struct CUmemPoolHandle_st {
  uint32_t magic;
  int dev, alive, is_default; /* dev -1: a host memory pool */
  unsigned gen;
  uint64_t threshold;
  int follow, opportunistic, internal;
  uint64_t reserved, used, reserved_high, used_high, live_allocs;
  uint64_t trims, set_access_calls;
  unsigned access[MAXDEV];
  int last_access_device;
  unsigned last_access_flags;
  int shareable;                /* created with a POSIX file descriptor handle type */
  int exported;                 /* cuMemPoolExportToShareableHandle has been called */
  struct fblk *free;
};

struct CUgraph_st { uint32_t magic; };

struct member { struct CUstream_st *s; int unjoined; uint64_t unjoin_ops; };
struct capture {
  int mode, invalidated, ended;
  struct CUstream_st *origin;
  pthread_t thread;
  struct CUctx_st *ctx;
  struct CUgraph_st *graph;     /* BeginCaptureToGraph */
  int nmem;
  struct member mem[64];
};

struct alloc {
  uintptr_t base;
  size_t size, rsize;
  int kind, dev;                /* dev -1: host memory (pinned, or of a host pool) */
  unsigned host_flags;          /* pinned: what cuMemHostGetFlags answers */
  struct CUmemPoolHandle_st *pool;
  struct CUstream_st *stream;
  int in_graph_free;
  void *mem;
  struct vc touch;              /* per stream, the clock of the last work on it */
  struct vc ready;              /* work that used its memory before it was
                                   reused: later work must be ordered after */
  struct alloc *hnext, *prev, *next;
};

static pthread_mutex_t g_mu;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_ndev = 1, g_nopools, g_nohostpools, g_initialized, g_lazy;
static uint64_t g_limit = 16ull << 30;
/* Pinned host memory (plain, and host pools' reserve) may not exceed this:
 * a larger request is out of memory, as on a real machine. */
#define HOST_MEM_LIMIT (64ull << 30)
static uint64_t g_host_used;
static int g_trace_fd = -1;
static struct fakecuda_counters g_cnt;
static char g_problem[1024];

static struct CUctx_st g_ctx[MAXDEV];
static struct CUstream_st *g_legacy[MAXDEV];
static struct CUmemPoolHandle_st *g_default_pool[MAXDEV];
static uint64_t g_used[MAXDEV];

/* FAKECUDA_SHARED_MEMORY: device memory is one GPU's, shared by every process
 * on the double. Each process counts its own use in a slot of a table in that
 * file (mmap MAP_SHARED); what limits an allocation and what cuMemGetInfo
 * reports is the sum over live processes, so a dead process's memory goes
 * back, as the real driver frees it. Only the owner writes its slot. */
#define SHM_SLOTS 64
struct shm_slot {
  int32_t pid;                      /* 0: free; -1: being claimed */
  uint32_t pad;
  uint64_t used[MAXDEV];
};
static struct shm_slot *g_shm;      /* NULL: device use is per process (g_used) */
static struct shm_slot *g_slot;     /* this process's */
static int32_t g_slot_pid;          /* pid that claimed g_slot (a forked child claims anew) */

/* Alive: kill(pid, 0) finds it (EPERM: another user's) and it is not a
 * zombie: an exited process holds no memory, reaped or not (an orphan under
 * an init that never reaps stays a zombie). */
static int pid_alive(int32_t pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM)) return 0;
  char path[32], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n > 0 ? n : 0] = 0;
  const char *st = strrchr(buf, ')'); /* "pid (comm) S ...": the state follows comm */
  return !(st && st[1] == ' ' && (st[2] == 'Z' || st[2] == 'X'));
}

/* Takes a free slot, or one of a dead process (or of a dead one whose pid
 * this process got), and zeroes it before it counts as ours. */
static void shm_claim(void) {
  int32_t me = (int32_t)getpid();
  g_slot = NULL;
  for (int i = 0; i < SHM_SLOTS; i++) {
    struct shm_slot *s = &g_shm[i];
    int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    if (pid != 0 && (pid < 0 || (pid != me && pid_alive(pid)))) continue;
    if (g_slot) { /* another stale slot of our pid: it would count as ours */
      if (pid == me) __atomic_compare_exchange_n(&s->pid, &pid, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
      continue;
    }
    if (!__atomic_compare_exchange_n(&s->pid, &pid, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
    for (int d = 0; d < MAXDEV; d++) __atomic_store_n(&s->used[d], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&s->pid, me, __ATOMIC_RELEASE);
    g_slot = s;
  }
  if (!g_slot) {
    fprintf(stderr, "fakecuda: FAKECUDA_SHARED_MEMORY: all %d slots taken by live processes\n", SHM_SLOTS);
    abort();
  }
  g_slot_pid = me;
}

static void shm_open_table(const char *path) {
  size_t size = SHM_SLOTS * sizeof(struct shm_slot);
  struct stat st;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || fstat(fd, &st) != 0 || ((size_t)st.st_size < size && ftruncate(fd, (off_t)size) != 0) ||
      (g_shm = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    fprintf(stderr, "fakecuda: FAKECUDA_SHARED_MEMORY=%s: %s\n", path, strerror(errno));
    abort();
  }
  close(fd);
  shm_claim();
}

/* This process's count of its use of dev. Host memory belongs to no device
 * (dev -1): it is counted apart, per process, and a device reset leaves it
 * alone (the shim gives its host pool back itself). */
static uint64_t *own_used(int dev) {
  if (dev < 0) return &g_host_used;
  if (!g_shm) return &g_used[dev];
  if (g_slot_pid != (int32_t)getpid()) shm_claim(); /* a forked child: its own slot, from 0 */
  return &g_slot->used[dev];
}
static uint64_t limit_of(int dev) { return dev < 0 ? HOST_MEM_LIMIT : g_limit; }

/* Bytes of dev in use: this process's, or with a shared table every live
 * process's (a forked child that has not allocated yet counts its parent's). */
static uint64_t mem_used(int dev) {
  if (dev < 0 || !g_shm) return *own_used(dev);
  uint64_t sum = 0;
  for (int i = 0; i < SHM_SLOTS; i++)
    if (pid_alive(__atomic_load_n(&g_shm[i].pid, __ATOMIC_ACQUIRE)))
      sum += __atomic_load_n(&g_shm[i].used[dev], __ATOMIC_ACQUIRE);
  return sum;
}

/* Adds delta (negative: frees) to this process's use of dev, not below 0: a
 * forked child freeing what its parent allocated gives back nothing. */
static void mem_add(int dev, int64_t delta) {
  uint64_t *u = own_used(dev), v = __atomic_load_n(u, __ATOMIC_RELAXED), nv;
  do nv = delta < 0 && v < (uint64_t)-delta ? 0 : v + (uint64_t)delta;
  while (!__atomic_compare_exchange_n(u, &v, nv, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
}

/* Counts n more bytes of dev if they fit under its limit (1), else nothing
 * (0). Counted first, checked after: two processes cannot both squeeze in. */
static int mem_take(int dev, uint64_t n) {
  mem_add(dev, (int64_t)n);
  if (mem_used(dev) <= limit_of(dev)) return 1;
  mem_add(dev, -(int64_t)n);
  return 0;
}

static struct CUstream_st **g_streams;  /* every stream ever made, index = sid */
static uint32_t g_nstreams, g_capstreams;
static struct CUmemPoolHandle_st **g_pools;
static uint32_t g_npools, g_cappools;
static struct capture *g_caps[256];
static int g_ncaps;
static struct vc g_host_vc;     /* what the host has synchronized with */

#define NBUCKET 4096
static struct alloc *g_bucket[NBUCKET];
static struct alloc *g_live;    /* list of all live allocations */

static __thread struct CUctx_st *t_stack[64];
static __thread int t_depth;    /* t_stack[t_depth-1] is current */
static __thread struct CUstream_st *t_pt[MAXDEV];
static __thread unsigned t_pt_gen[MAXDEV];
static __thread char t_problem[1024];
static __thread uint64_t t_waits; /* host waits of this thread (fakecuda_thread_waits) */
static __thread uint64_t t_allocs; /* driver allocations by this thread (fakecuda_thread_allocs) */
static __thread uint64_t t_legacy_records; /* fakecuda_thread_legacy_records */
/* Work the thread's next driver allocation issues last (fakecuda_launch_inside_next_alloc). */
static __thread struct {
  int armed;
  const void *stream, *p;
} t_inside;
static void launch_inside_if_armed(void);

#define CNT(f) __atomic_add_fetch(&g_cnt.f, 1, __ATOMIC_SEQ_CST)
#define LOCK() pthread_mutex_lock(&g_mu)
#define UNLOCK() pthread_mutex_unlock(&g_mu)
#define RET(x) do { CUresult r__ = (x); UNLOCK(); return r__; } while (0)

static void problem(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_problem, sizeof g_problem, fmt, ap);
  va_end(ap);
}

static void trace(const char *fmt, ...) {
  if (g_trace_fd < 0) return;
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 1) n = sizeof buf - 1;
  if (write(g_trace_fd, buf, (size_t)n) < 0) { /* nothing to do */ }
}

/* ------------------------------------------------------------ vector clocks */
static uint64_t vc_get(const struct vc *v, uint32_t sid) {
  for (uint32_t i = 0; i < v->n; i++)
    if (v->e[i].sid == sid) return v->e[i].clk;
  return 0;
}
static void vc_set_max(struct vc *v, uint32_t sid, uint64_t clk) {
  for (uint32_t i = 0; i < v->n; i++)
    if (v->e[i].sid == sid) {
      if (v->e[i].clk < clk) v->e[i].clk = clk;
      return;
    }
  if (v->n == v->cap) {
    v->cap = v->cap ? v->cap * 2 : 8;
    v->e = realloc(v->e, v->cap * sizeof *v->e);
    if (!v->e) abort();
  }
  v->e[v->n].sid = sid;
  v->e[v->n].clk = clk;
  v->n++;
}
static void vc_merge(struct vc *dst, const struct vc *src) {
  if (dst == src) return;
  for (uint32_t i = 0; i < src->n; i++) vc_set_max(dst, src->e[i].sid, src->e[i].clk);
}
static void vc_copy(struct vc *dst, const struct vc *src) {
  dst->n = 0;
  vc_merge(dst, src);
}
static void vc_free(struct vc *v) {
  free(v->e);
  v->e = NULL;
  v->n = v->cap = 0;
}

/* ------------------------------------------------------------------- init */
static uint64_t parse_u64(const char *s, uint64_t dflt) {
  if (!s || !*s) return dflt;
  char *end;
  unsigned long long v = strtoull(s, &end, 0);
  if (*end) return dflt;
  return v;
}

static struct CUstream_st *new_stream(struct CUctx_st *ctx, unsigned flags, int prio) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) abort();
  s->magic = STREAM_MAGIC;
  s->ctx = ctx;
  s->gen = ctx->gen;
  s->alive = 1;
  s->flags = flags;
  s->prio = prio;
  if (g_nstreams == g_capstreams) {
    g_capstreams = g_capstreams ? g_capstreams * 2 : 64;
    g_streams = realloc(g_streams, g_capstreams * sizeof *g_streams);
    if (!g_streams) abort();
  }
  s->sid = g_nstreams;
  g_streams[g_nstreams++] = s;
  return s;
}

static struct CUmemPoolHandle_st *new_pool(int dev, int is_default) {
  struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
  if (!p) abort();
  p->magic = POOL_MAGIC;
  p->dev = dev;
  p->alive = 1;
  p->is_default = is_default;
  p->gen = dev < 0 ? 0 : g_ctx[dev].gen;
  p->threshold = 0;
  p->follow = p->opportunistic = p->internal = 1;
  if (dev >= 0) p->access[dev] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; /* a host pool grants no device */
  p->last_access_device = -1;
  if (g_npools == g_cappools) {
    g_cappools = g_cappools ? g_cappools * 2 : 16;
    g_pools = realloc(g_pools, g_cappools * sizeof *g_pools);
    if (!g_pools) abort();
  }
  g_pools[g_npools++] = p;
  return p;
}

static void init_once(void) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&g_mu, &a);
  const char *d = getenv("FAKECUDA_DEVICES");
  g_ndev = (int)parse_u64(d, 1);
  if (g_ndev > MAXDEV) g_ndev = MAXDEV;
  if (g_ndev < 0) g_ndev = 0;
  const char *np = getenv("FAKECUDA_NO_POOLS");
  g_nopools = np && strcmp(np, "0") != 0 && *np;
  const char *nh = getenv("FAKECUDA_NO_HOST_POOLS");
  g_nohostpools = g_nopools || (nh && strcmp(nh, "0") != 0 && *nh);
  g_limit = parse_u64(getenv("FAKECUDA_MEM_LIMIT"), 16ull << 30);
  const char *lz = getenv("FAKECUDA_LAZY_GPU");
  g_lazy = lz && *lz && strcmp(lz, "0") != 0;
  const char *t = getenv("FAKECUDA_TRACE");
  if (t && *t) g_trace_fd = open(t, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const char *sm = getenv("FAKECUDA_SHARED_MEMORY");
  if (sm && *sm) shm_open_table(sm);
  for (int i = 0; i < MAXDEV; i++) {
    g_ctx[i].magic = CTX_MAGIC;
    g_ctx[i].dev = i;
    g_ctx[i].gen = 1;
  }
  for (int i = 0; i < g_ndev; i++) {
    g_legacy[i] = new_stream(&g_ctx[i], CU_STREAM_DEFAULT, 0);
    g_legacy[i]->is_legacy = 1;
  }
}
static void init(void) { pthread_once(&g_once, init_once); }

#define NEED_INIT()                                   \
  do {                                                \
    init();                                           \
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)

/* ---------------------------------------------------------------- helpers */
static struct CUctx_st *cur_raw(void) { return t_depth ? t_stack[t_depth - 1] : NULL; }

/* The current context, usable (active). */
static CUresult cur_ctx(struct CUctx_st **out) {
  struct CUctx_st *c = cur_raw();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->active) {
    problem("call with the context of device %d current after it was reset/released", c->dev);
    return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  }
  *out = c;
  return CUDA_SUCCESS;
}

static int ctx_valid(CUcontext c) {
  for (int i = 0; i < g_ndev; i++)
    if (c == &g_ctx[i]) return 1;
  return 0;
}

/* Not destroyed, nor reset with its device (a host pool has none). */
static int pool_current(const struct CUmemPoolHandle_st *p) {
  return p->dev < 0 || p->gen == g_ctx[p->dev].gen;
}

static int stream_live(const struct CUstream_st *s) {
  return s->alive && s->gen == s->ctx->gen && s->ctx->active;
}

static struct CUstream_st *per_thread_stream(struct CUctx_st *c) {
  int d = c->dev;
  if (!t_pt[d] || t_pt_gen[d] != c->gen || !t_pt[d]->alive) {
    t_pt[d] = new_stream(c, CU_STREAM_DEFAULT, 0);
    t_pt[d]->is_per_thread = 1;
    t_pt_gen[d] = c->gen;
  }
  return t_pt[d];
}

/* Resolves a stream handle (NULL/LEGACY/PER_THREAD are the current context's). */
static CUresult get_stream(CUstream h, struct CUstream_st **out) {
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    struct CUctx_st *c;
    CUresult r = cur_ctx(&c);
    if (r) return r;
    *out = h == CU_STREAM_PER_THREAD ? per_thread_stream(c) : g_legacy[c->dev];
    return CUDA_SUCCESS;
  }
  struct CUstream_st *s = (struct CUstream_st *)h;
  if (s->magic != STREAM_MAGIC) {
    CNT(invalid_handles);
    problem("unknown stream handle %p", (void *)h);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (!stream_live(s)) {
    CNT(invalid_handles);
    problem("stream %p used after it was destroyed (or its device reset)", (void *)h);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *out = s;
  return CUDA_SUCCESS;
}

static CUresult get_event(CUevent h, struct CUevent_st **out) {
  struct CUevent_st *e = (struct CUevent_st *)h;
  if (!e || e->magic != EVENT_MAGIC) {
    CNT(invalid_handles);
    problem("unknown event handle %p", (void *)h);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (!e->alive || e->gen != e->ctx->gen || !e->ctx->active) {
    CNT(invalid_handles);
    problem("event %p used after it was destroyed (or its device reset)", (void *)h);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *out = e;
  return CUDA_SUCCESS;
}

static CUresult get_pool(CUmemoryPool h, struct CUmemPoolHandle_st **out) {
  struct CUmemPoolHandle_st *p = (struct CUmemPoolHandle_st *)h;
  if (!p || p->magic != POOL_MAGIC) {
    CNT(invalid_handles);
    problem("unknown pool handle %p", (void *)h);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!p->alive || !pool_current(p)) {
    CNT(invalid_handles);
    problem("pool %p used after it was destroyed (or its device reset)", (void *)h);
    return CUDA_ERROR_INVALID_VALUE;
  }
  *out = p;
  return CUDA_SUCCESS;
}

static const char *stream_name(const struct CUstream_st *s, char *buf, size_t n) {
  if (s->is_legacy) snprintf(buf, n, "legacy(dev %d)", s->ctx->dev);
  else if (s->is_per_thread) snprintf(buf, n, "per-thread#%u(dev %d)", s->sid, s->ctx->dev);
  else
    snprintf(buf, n, "%s#%u(dev %d)", (s->flags & CU_STREAM_NON_BLOCKING) ? "nonblocking" : "blocking",
             s->sid, s->ctx->dev);
  return buf;
}

/* ------------------------------------------------------------ allocations */
static unsigned bucket_of(uintptr_t p) { return (unsigned)((p >> 8) * 2654435761u) % NBUCKET; }

static struct alloc *find_exact(uintptr_t p) {
  for (struct alloc *a = g_bucket[bucket_of(p)]; a; a = a->hnext)
    if (a->base == p) return a;
  return NULL;
}

static struct alloc *find_containing(uintptr_t p) {
  struct alloc *a = find_exact(p);
  if (a) return a;
  for (a = g_live; a; a = a->next)
    if (p >= a->base && p < a->base + a->size) return a;
  return NULL;
}

static void insert_alloc(struct alloc *a) {
  unsigned b = bucket_of(a->base);
  a->hnext = g_bucket[b];
  g_bucket[b] = a;
  a->prev = NULL;
  a->next = g_live;
  if (g_live) g_live->prev = a;
  g_live = a;
}

static void remove_alloc(struct alloc *a) {
  unsigned b = bucket_of(a->base);
  for (struct alloc **pp = &g_bucket[b]; *pp; pp = &(*pp)->hnext)
    if (*pp == a) {
      *pp = a->hnext;
      break;
    }
  if (a->prev) a->prev->next = a->next;
  else g_live = a->next;
  if (a->next) a->next->prev = a->prev;
}

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

static struct alloc *make_alloc(size_t n, int kind, int dev) {
  size_t rn = round256(n);
  void *m = aligned_alloc(256, rn);
  if (!m) return NULL;
  struct alloc *a = calloc(1, sizeof *a);
  if (!a) {
    free(m);
    return NULL;
  }
  a->base = (uintptr_t)m;
  a->mem = m;
  a->size = n;
  a->rsize = rn;
  a->kind = kind;
  a->dev = dev;
  insert_alloc(a);
  return a;
}

/* Freed memory waits in a quarantine before it goes back to malloc, so that
 * an address is not handed out again at once: a test can then tell "this
 * pointer was freed" from "a new block has the same address". */
#define QUARANTINE_SLOTS 1024
#define QUARANTINE_BYTES (512ull << 20)
static void *g_quarantine[QUARANTINE_SLOTS];
static size_t g_quarantine_size[QUARANTINE_SLOTS];
static unsigned g_qhead, g_qcount;
static uint64_t g_qbytes;

static void quarantine(void *m, size_t n) {
  while (g_qcount == QUARANTINE_SLOTS || (g_qcount && g_qbytes + n > QUARANTINE_BYTES)) {
    unsigned oldest = (g_qhead + QUARANTINE_SLOTS - g_qcount) % QUARANTINE_SLOTS;
    free(g_quarantine[oldest]);
    g_qbytes -= g_quarantine_size[oldest];
    g_qcount--;
  }
  g_quarantine[g_qhead] = m;
  g_quarantine_size[g_qhead] = n;
  g_qhead = (g_qhead + 1) % QUARANTINE_SLOTS;
  g_qcount++;
  g_qbytes += n;
}

static void destroy_alloc(struct alloc *a) {
  remove_alloc(a);
  vc_free(&a->touch);
  vc_free(&a->ready);
  quarantine(a->mem, a->rsize);
  free(a);
}

/* ------------------------------------------------------------------ pools */
static void fblk_destroy(struct fblk *b) {
  vc_free(&b->vc);
  vc_free(&b->touch);
  free(b);
}

static int blk_completed(const struct fblk *b) {
  return b->stream == NULL || vc_get(&g_host_vc, b->stream->sid) >= b->clk;
}

static void pool_release(struct CUmemPoolHandle_st *p, uint64_t keep) {
  for (struct fblk **pp = &p->free; *pp && p->reserved > keep;) {
    struct fblk *b = *pp;
    if (!blk_completed(b)) {
      pp = &b->next;
      continue;
    }
    uint64_t r = p->reserved - keep;
    if (r > b->bytes) r = b->bytes;
    b->bytes -= r;
    p->reserved -= r;
    mem_add(p->dev, -(int64_t)r);
    if (b->bytes == 0) {
      *pp = b->next;
      fblk_destroy(b);
    } else {
      pp = &b->next;
    }
  }
}

static void release_all_pools(void) {
  for (uint32_t i = 0; i < g_npools; i++) {
    struct CUmemPoolHandle_st *p = g_pools[i];
    if (pool_current(p)) pool_release(p, p->threshold);
  }
}

/* How a free block may serve an allocation on s: 0 no, 1 yes, 2 yes with an
 * internal dependency (s must wait for the free). */
static int blk_reusable(struct CUmemPoolHandle_st *p, struct fblk *b, struct CUstream_st *s) {
  if (b->stream == s || blk_completed(b)) return 1;
  if (p->follow && vc_get(&s->vc, b->stream->sid) >= b->clk) return 1;
  if (p->internal) return 2;
  return 0;
}

static CUresult pool_alloc(struct CUmemPoolHandle_st *p, struct CUstream_st *s, size_t n, struct alloc **out) {
  size_t rn = round256(n);
  uint64_t avail = 0;
  for (struct fblk *b = p->free; b; b = b->next)
    if (blk_reusable(p, b, s)) avail += b->bytes;
  uint64_t take = avail < rn ? avail : rn;
  uint64_t need = rn - take;
  if (n > limit_of(p->dev) || !mem_take(p->dev, need)) goto oom;
  struct alloc *a = make_alloc(n, FAKECUDA_POOL, p->dev);
  if (!a) {
    mem_add(p->dev, -(int64_t)need);
    goto oom;
  }
  for (struct fblk **pp = &p->free; *pp && take;) {
    struct fblk *b = *pp;
    int how = blk_reusable(p, b, s);
    if (!how) {
      pp = &b->next;
      continue;
    }
    if (how == 2) vc_merge(&s->vc, &b->vc);
    /* Reused before the GPU passed the free (in the order of its stream, say):
     * only work ordered after the old work may use the memory. */
    if (!blk_completed(b)) vc_merge(&a->ready, &b->touch);
    uint64_t t = b->bytes < take ? b->bytes : take;
    b->bytes -= t;
    take -= t;
    if (b->bytes == 0) {
      *pp = b->next;
      fblk_destroy(b);
    } else {
      pp = &b->next;
    }
  }
  p->reserved += need;
  p->used += rn;
  if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
  if (p->used > p->used_high) p->used_high = p->used;
  p->live_allocs++;
  a->pool = p;
  a->stream = s;
  *out = a;
  return CUDA_SUCCESS;
oom:
  CNT(alloc_failures);
  trace("oom pool %zu dev%d\n", n, p->dev);
  return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Returns a pool block's memory to its pool as freed on s (NULL: completed). */
static void pool_take_back(struct alloc *a, struct CUstream_st *s) {
  struct CUmemPoolHandle_st *p = a->pool;
  p->used -= a->rsize;
  p->live_allocs--;
  struct fblk *b = calloc(1, sizeof *b);
  if (!b) abort();
  b->bytes = a->rsize;
  b->stream = s;
  if (s) {
    b->clk = s->clock;
    vc_copy(&b->vc, &s->vc);
    vc_copy(&b->touch, &a->touch);
    vc_merge(&b->touch, &a->ready);
  }
  b->next = p->free;
  p->free = b;
  if (!p->alive) pool_release(p, 0);
}

/* ---------------------------------------------------------------- capture */
static void invalidate(struct capture *c) {
  if (!c->invalidated) {
    c->invalidated = 1;
    CNT(capture_invalidations);
  }
}

/* Is an "unsafe" call prohibited on this thread now (capture rules)? If so,
 * the captures concerned are invalidated, as the real driver does. */
static int prohibited(void) {
  int hit = 0;
  pthread_t self = pthread_self();
  for (int i = 0; i < g_ncaps; i++) {
    struct capture *c = g_caps[i];
    if (pthread_equal(c->thread, self) && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
      invalidate(c);
      hit = 1;
    } else if (!pthread_equal(c->thread, self) && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
      invalidate(c);
      hit = 1;
    }
  }
  if (hit) problem("unsafe call during stream capture (cudaErrorStreamCaptureUnsupported)");
  return hit;
}

/* A blocking stream of ctx that is capturing makes the legacy stream unusable. */
static int blocking_capture_in(struct CUctx_st *ctx, int do_invalidate) {
  int hit = 0;
  for (int i = 0; i < g_ncaps; i++) {
    struct capture *c = g_caps[i];
    if (c->ctx != ctx) continue;
    for (int m = 0; m < c->nmem; m++) {
      struct CUstream_st *s = c->mem[m].s;
      if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
        hit = 1;
        if (do_invalidate) invalidate(c);
      }
    }
  }
  return hit;
}

static int capture_in_ctx(struct CUctx_st *ctx, int do_invalidate) {
  int hit = 0;
  for (int i = 0; i < g_ncaps; i++)
    if (g_caps[i]->ctx == ctx) {
      hit = 1;
      if (do_invalidate) invalidate(g_caps[i]);
    }
  return hit;
}

static struct member *member_of(struct capture *c, struct CUstream_st *s) {
  for (int m = 0; m < c->nmem; m++)
    if (c->mem[m].s == s) return &c->mem[m];
  return NULL;
}

enum { OP_RECORD, OP_WAIT, OP_WORK, OP_MEM };
#define CAPTURED ((CUresult)-1)

/* Capture rules for an operation enqueued on s. Returns CUDA_SUCCESS (run it),
 * CAPTURED (it goes into a capture, do not run it), or an error. */
static CUresult gate(struct CUstream_st *s, int op) {
  if (s->is_legacy && blocking_capture_in(s->ctx, 1)) {
    problem("legacy-stream operation while a blocking stream captures");
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  if (s->cap) {
    if (s->cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if ((op == OP_WORK || op == OP_MEM) && s != s->cap->origin) {
      struct member *m = member_of(s->cap, s);
      s->ops++;
      if (m) {
        m->unjoined = 1;
        m->unjoin_ops = s->ops;
      }
    }
    return CAPTURED;
  }
  if (op == OP_MEM && prohibited()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return CUDA_SUCCESS;
}

/* Enqueues one operation on s: implicit dependencies and the clock. */
static void enqueue(struct CUstream_st *s) {
  vc_merge(&s->vc, &g_host_vc);
  if (s->is_legacy) {
    for (uint32_t i = 0; i < g_nstreams; i++) {
      struct CUstream_st *b = g_streams[i];
      if (b != s && b->ctx == s->ctx && b->gen == s->ctx->gen && !(b->flags & CU_STREAM_NON_BLOCKING))
        vc_merge(&s->vc, &b->vc);
    }
  } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
    vc_merge(&s->vc, &g_legacy[s->ctx->dev]->vc);
  }
  s->clock++;
  s->ops++;
  vc_set_max(&s->vc, s->sid, s->clock);
}

/* Has the host synchronized with everything v covers? */
static int host_covers(const struct vc *v) {
  for (uint32_t i = 0; i < v->n; i++)
    if (vc_get(&g_host_vc, v->e[i].sid) < v->e[i].clk) return 0;
  return 1;
}

static void host_knows(const struct vc *v) {
  vc_merge(&g_host_vc, v);
  release_all_pools();
}

/* ---------------------------------------------------------------- the API */
CUresult cuInit(unsigned int Flags) {
  init();
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (g_ndev == 0) return CUDA_ERROR_NO_DEVICE;
  LOCK();
  g_initialized = 1;
  RET(CUDA_SUCCESS);
}

/* The CUDA version of the headers the double is built with. */
CUresult cuDriverGetVersion(int *driverVersion) {
  if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = CUDA_VERSION;
  return CUDA_SUCCESS;
}

/* ---- devices */
CUresult cuDeviceGetCount(int *count) {
  NEED_INIT();
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = g_ndev;
  return CUDA_SUCCESS;
}

/* A device's UUID (the shim names devices to other processes by it): the
 * same in the processes that share one device (FAKECUDA_SHARED_MEMORY's
 * file, hashed), else this process's own, so that unrelated processes of
 * the double (other tests running at once) never share a device. */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
  NEED_INIT();
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  const char *shared = getenv("FAKECUDA_SHARED_MEMORY");
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  if (shared && *shared)
    for (const char *c = shared; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  else
    h ^= (uint64_t)getpid() << 16;
  memcpy(uuid->bytes, "fakecuda", 8);
  memcpy(uuid->bytes + 8, &h, 7);
  uuid->bytes[15] = (char)dev;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  NEED_INIT();
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  if ((int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = !g_nopools; break;
    case CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED: *pi = !g_nohostpools; break;
    default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  NEED_INIT();
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = (size_t)g_limit;
  return CUDA_SUCCESS;
}

static struct CUmemPoolHandle_st *default_pool(int dev) {
  struct CUmemPoolHandle_st *p = g_default_pool[dev];
  if (!p || p->gen != g_ctx[dev].gen) p = g_default_pool[dev] = new_pool(dev, 1);
  return p;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
  NEED_INIT();
  if (!pool_out) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  if (g_nopools) return CUDA_ERROR_NOT_SUPPORTED;
  LOCK();
  *pool_out = default_pool(dev);
  RET(CUDA_SUCCESS);
}

/* ---- primary contexts */
static void destroy_device_state(int dev) {
  struct CUctx_st *c = &g_ctx[dev];
  for (struct alloc *a = g_live, *n; a; a = n) {
    n = a->next;
    if (a->dev == dev) {
      if (a->kind == FAKECUDA_POOL) a->pool->live_allocs--;
      destroy_alloc(a);
    }
  }
  for (uint32_t i = 0; i < g_nstreams; i++) {
    struct CUstream_st *s = g_streams[i];
    if (s->ctx == c && !s->is_legacy) s->alive = 0;
  }
  /* The legacy stream object lives on (its clock keeps counting, so the
   * host's knowledge of it stays right); its old work is gone. */
  g_legacy[dev]->last_work = g_legacy[dev]->last_untargeted = 0;
  for (uint32_t i = 0; i < g_npools; i++) {
    struct CUmemPoolHandle_st *p = g_pools[i];
    if (p->dev == dev && p->alive) {
      p->alive = 0;
      for (struct fblk *b = p->free, *n; b; b = n) {
        n = b->next;
        fblk_destroy(b);
      }
      p->free = NULL;
      p->reserved = p->used = 0;
    }
  }
  g_default_pool[dev] = NULL;
  for (int i = 0; i < g_ncaps;) {
    if (g_caps[i]->ctx == c) {
      for (int m = 0; m < g_caps[i]->nmem; m++) g_caps[i]->mem[m].s->cap = NULL;
      g_caps[i]->ended = 1;
      g_caps[i] = g_caps[--g_ncaps];
    } else {
      i++;
    }
  }
  for (int i = 0; i < MAXDEV; i++) {
    c->peer[i] = 0;
    g_ctx[i].peer[dev] = 0;
  }
  __atomic_store_n(own_used(dev), 0, __ATOMIC_RELEASE);
  c->active = 0;
  c->gen++;
  g_legacy[dev]->gen = c->gen;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  LOCK();
  struct CUctx_st *c = &g_ctx[dev];
  c->refcount++;
  c->active = 1;
  *pctx = c;
  RET(CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  NEED_INIT();
  if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  LOCK();
  struct CUctx_st *c = &g_ctx[dev];
  if (c->refcount <= 0) {
    problem("cuDevicePrimaryCtxRelease(%d) without a matching retain", dev);
    RET(CUDA_ERROR_INVALID_CONTEXT);
  }
  if (--c->refcount == 0 && c->active) destroy_device_state(dev);
  RET(CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  NEED_INIT();
  if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  LOCK();
  CNT(device_resets);
  if (g_ctx[dev].active) destroy_device_state(dev);
  RET(CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  NEED_INIT();
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  LOCK();
  *flags = 0;
  *active = g_ctx[dev].active;
  RET(CUDA_SUCCESS);
}

/* ---- current context */
CUresult cuCtxGetCurrent(CUcontext *pctx) {
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = cur_raw();
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  NEED_INIT();
  if (ctx == NULL) {
    if (t_depth) t_depth--;
    return CUDA_SUCCESS;
  }
  if (!ctx_valid(ctx)) {
    CNT(invalid_handles);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (t_depth == 0) t_depth = 1;
  t_stack[t_depth - 1] = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  NEED_INIT();
  if (!ctx || !ctx_valid(ctx)) {
    CNT(invalid_handles);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (t_depth == 64) return CUDA_ERROR_INVALID_VALUE;
  t_stack[t_depth++] = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx) {
  NEED_INIT();
  if (!t_depth) return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext c = t_stack[--t_depth];
  if (pctx) *pctx = c;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  NEED_INIT();
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  *device = c->dev;
  RET(CUDA_SUCCESS);
}

/* A context's ID is unique for the life of the process: a reset (which bumps
 * the generation) gives the device's primary context a new one. */
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) {
  NEED_INIT();
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c = ctx;
  if (!c) {
    CUresult r = cur_ctx(&c);
    if (r) RET(r);
  }
  *id = ((unsigned long long)c->gen << 8 | (unsigned)c->dev) + 1;
  RET(CUDA_SUCCESS);
}

/* The host waits for all work issued so far in context c. */
static void host_waits_for_context(struct CUctx_st *c) {
  for (uint32_t i = 0; i < g_nstreams; i++) {
    struct CUstream_st *s = g_streams[i];
    if (s->ctx == c && s->gen == c->gen) vc_merge(&g_host_vc, &s->vc);
  }
  release_all_pools();
}

CUresult cuCtxSynchronize(void) {
  NEED_INIT();
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  CNT(ctx_syncs);
  t_waits++;
  if (capture_in_ctx(c, 1)) {
    problem("cuCtxSynchronize during a stream capture");
    RET(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  host_waits_for_context(c);
  RET(CUDA_SUCCESS);
}

CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  NEED_INIT();
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  if (!peerContext || !ctx_valid(peerContext)) RET(CUDA_ERROR_INVALID_HANDLE);
  if (Flags != 0) RET(CUDA_ERROR_INVALID_VALUE);
  if (!peerContext->active) RET(CUDA_ERROR_INVALID_CONTEXT);
  if (peerContext == c) RET(CUDA_ERROR_INVALID_DEVICE);
  if (c->peer[peerContext->dev]) RET(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  c->peer[peerContext->dev] = 1;
  CNT(peer_enables);
  RET(CUDA_SUCCESS);
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
  NEED_INIT();
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  if (!peerContext || !ctx_valid(peerContext)) RET(CUDA_ERROR_INVALID_HANDLE);
  if (!c->peer[peerContext->dev]) RET(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  c->peer[peerContext->dev] = 0;
  RET(CUDA_SUCCESS);
}

/* ---- streams */
static CUresult stream_create(CUstream *ph, unsigned flags, int prio) {
  NEED_INIT();
  if (!ph) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  *ph = new_stream(c, flags, prio);
  CNT(streams_created);
  RET(CUDA_SUCCESS);
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) { return stream_create(phStream, Flags, 0); }

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
  return stream_create(phStream, flags, priority);
}

CUresult cuStreamDestroy(CUstream hStream) {
  NEED_INIT();
  LOCK();
  if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
    RET(CUDA_ERROR_INVALID_HANDLE);
  struct CUstream_st *s;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  s->alive = 0;
  CNT(streams_destroyed);
  RET(CUDA_SUCCESS);
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
  NEED_INIT();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUstream_st *s;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  *pctx = s->ctx;
  RET(CUDA_SUCCESS);
}

static CUresult stream_sync(CUstream hStream, int count);

CUresult cuStreamQuery(CUstream hStream) {
  NEED_INIT();
  LOCK();
  struct CUstream_st *s;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  s->queries++;
  if (g_lazy && !s->cap && !host_covers(&s->vc)) RET(CUDA_ERROR_NOT_READY);
  RET(stream_sync(hStream, 0));
}

static CUresult stream_sync(CUstream hStream, int count) {
  NEED_INIT();
  LOCK();
  struct CUstream_st *s;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  if (count) {
    CNT(stream_syncs);
    t_waits++;
  }
  if (s->cap) {
    invalidate(s->cap);
    problem("synchronizing a capturing stream");
    RET(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  if (s->is_legacy && blocking_capture_in(s->ctx, 1)) RET(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  vc_merge(&s->vc, &g_host_vc);
  if (s->is_legacy) {
    for (uint32_t i = 0; i < g_nstreams; i++) {
      struct CUstream_st *b = g_streams[i];
      if (b->ctx == s->ctx && b->gen == s->ctx->gen && !(b->flags & CU_STREAM_NON_BLOCKING))
        vc_merge(&g_host_vc, &b->vc);
    }
  }
  host_knows(&s->vc);
  RET(CUDA_SUCCESS);
}

CUresult cuStreamSynchronize(CUstream hStream) { return stream_sync(hStream, 1); }

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  NEED_INIT();
  LOCK();
  struct CUstream_st *s;
  struct CUevent_st *e;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  r = get_event(hEvent, &e);
  if (r) RET(r);
  if (Flags & ~1u) RET(CUDA_ERROR_INVALID_VALUE);
  CNT(stream_waits);
  s->waits++;
  if (e->cap && !e->cap->ended) {
    struct capture *c = e->cap;
    if (s->is_legacy && blocking_capture_in(s->ctx, 1)) RET(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    if (s->cap && s->cap != c) RET(CUDA_ERROR_STREAM_CAPTURE_MERGE);
    if (c->invalidated) RET(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    if (!s->cap) { /* s joins the capture (a fork) */
      if (c->nmem == 64) RET(CUDA_ERROR_INVALID_VALUE);
      s->cap = c;
      c->mem[c->nmem].s = s;
      c->mem[c->nmem].unjoined = 0;
      c->nmem++;
    } else if (s == c->origin && e->rec_stream != s) { /* a join */
      struct member *m = member_of(c, e->rec_stream);
      if (m && e->rec_ops >= m->unjoin_ops) m->unjoined = 0;
    }
    RET(CUDA_SUCCESS);
  }
  r = gate(s, OP_WAIT);
  if (r == CAPTURED) RET(CUDA_SUCCESS); /* external dependency: fine */
  if (r) RET(r);
  enqueue(s);
  if (e->recorded) vc_merge(&s->vc, &e->vc);
  RET(CUDA_SUCCESS);
}

/* ---- capture */
static CUresult begin_capture(CUstream hStream, CUstreamCaptureMode mode, struct CUgraph_st *graph) {
  NEED_INIT();
  LOCK();
  if (hStream == NULL || hStream == CU_STREAM_LEGACY) RET(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  struct CUstream_st *s;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED) RET(CUDA_ERROR_INVALID_VALUE);
  if (s->cap) RET(CUDA_ERROR_ILLEGAL_STATE);
  if (g_ncaps == 256) RET(CUDA_ERROR_INVALID_VALUE);
  struct capture *c = calloc(1, sizeof *c);
  if (!c) abort();
  c->mode = mode;
  c->origin = s;
  c->thread = pthread_self();
  c->ctx = s->ctx;
  c->graph = graph;
  c->mem[0].s = s;
  c->nmem = 1;
  s->cap = c;
  g_caps[g_ncaps++] = c;
  RET(CUDA_SUCCESS);
}

CUresult cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode) { return begin_capture(hStream, mode, NULL); }

CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                                     const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                     CUstreamCaptureMode mode) {
  (void)dependencies;
  (void)dependencyData;
  if (!hGraph || hGraph->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_VALUE;
  if (numDependencies) return CUDA_ERROR_NOT_SUPPORTED; /* not modelled */
  return begin_capture(hStream, mode, hGraph);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  NEED_INIT();
  if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUstream_st *s;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  struct capture *c = s->cap;
  if (!c) RET(CUDA_ERROR_ILLEGAL_STATE);
  if (c->origin != s) RET(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
    RET(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  CUresult res = CUDA_SUCCESS;
  if (c->invalidated) res = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  else
    for (int m = 0; m < c->nmem; m++)
      if (c->mem[m].unjoined) {
        char b[64];
        problem("capture ended with unjoined work on stream %s", stream_name(c->mem[m].s, b, sizeof b));
        res = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
      }
  for (int m = 0; m < c->nmem; m++) c->mem[m].s->cap = NULL;
  c->ended = 1;
  for (int i = 0; i < g_ncaps; i++)
    if (g_caps[i] == c) {
      g_caps[i] = g_caps[--g_ncaps];
      break;
    }
  if (res == CUDA_SUCCESS) {
    struct CUgraph_st *g = c->graph;
    if (!g) {
      g = calloc(1, sizeof *g);
      if (!g) abort();
      g->magic = GRAPH_MAGIC;
    }
    *phGraph = g;
  } else {
    *phGraph = NULL;
  }
  RET(res);
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  NEED_INIT();
  if (!captureStatus) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUstream_st *s;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  if (s->is_legacy && blocking_capture_in(s->ctx, 0)) RET(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  *captureStatus = !s->cap ? CU_STREAM_CAPTURE_STATUS_NONE
                   : s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                         : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  RET(CUDA_SUCCESS);
}

CUresult cuGraphDestroy(CUgraph hGraph) {
  NEED_INIT();
  if (!hGraph || hGraph->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_VALUE;
  hGraph->magic = 0; /* never freed: a stale handle stays detectable */
  return CUDA_SUCCESS;
}

/* ---- events */
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  NEED_INIT();
  if (!phEvent) return CUDA_ERROR_INVALID_VALUE;
  if (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS))
    return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) abort();
  e->magic = EVENT_MAGIC;
  e->ctx = c;
  e->gen = c->gen;
  e->alive = 1;
  e->flags = Flags;
  *phEvent = e;
  CNT(events_created);
  RET(CUDA_SUCCESS);
}

CUresult cuEventDestroy(CUevent hEvent) {
  NEED_INIT();
  LOCK();
  struct CUevent_st *e;
  CUresult r = get_event(hEvent, &e);
  if (r) RET(r);
  e->alive = 0;
  vc_free(&e->vc);
  CNT(events_destroyed);
  RET(CUDA_SUCCESS);
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  NEED_INIT();
  LOCK();
  struct CUevent_st *e;
  struct CUstream_st *s;
  CUresult r = get_event(hEvent, &e);
  if (r) RET(r);
  r = get_stream(hStream, &s);
  if (r) RET(r);
  if (e->ctx != s->ctx) {
    CNT(invalid_handles);
    problem("cuEventRecord: event of device %d recorded on a stream of device %d", e->ctx->dev, s->ctx->dev);
    RET(CUDA_ERROR_INVALID_HANDLE);
  }
  r = gate(s, OP_RECORD);
  if (r != CUDA_SUCCESS && r != CAPTURED) RET(r);
  if (s->is_legacy) {
    CNT(event_records_legacy);
    t_legacy_records++;
  } else {
    CNT(event_records_other);
  }
  s->records++;
  if (r == CAPTURED) {
    e->cap = s->cap;
    e->rec_stream = s;
    e->rec_ops = s->ops;
    e->recorded = 1;
    e->vc.n = 0;
    RET(CUDA_SUCCESS);
  }
  enqueue(s);
  vc_copy(&e->vc, &s->vc);
  e->recorded = 1;
  e->cap = NULL;
  e->rec_stream = s;
  RET(CUDA_SUCCESS);
}

static CUresult event_sync(CUevent hEvent, int count) {
  NEED_INIT();
  LOCK();
  struct CUevent_st *e;
  CUresult r = get_event(hEvent, &e);
  if (r) RET(r);
  if (count) {
    CNT(event_syncs);
    t_waits++;
  }
  if (e->cap && !e->cap->ended) {
    invalidate(e->cap);
    RET(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  if (e->recorded && !e->cap) host_knows(&e->vc);
  RET(CUDA_SUCCESS);
}

CUresult cuEventQuery(CUevent hEvent) {
  NEED_INIT();
  LOCK();
  struct CUevent_st *e;
  CUresult r = get_event(hEvent, &e);
  if (r) RET(r);
  if (g_lazy && e->recorded && !e->cap && !host_covers(&e->vc)) RET(CUDA_ERROR_NOT_READY);
  RET(event_sync(hEvent, 0));
}
CUresult cuEventSynchronize(CUevent hEvent) { return event_sync(hEvent, 1); }

/* ---- memory */
static CUresult plain_alloc(CUdeviceptr *dptr, size_t bytesize) {
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  if (bytesize == 0) RET(CUDA_ERROR_INVALID_VALUE);
  if (prohibited()) RET(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  int d = c->dev;
  struct alloc *a = NULL;
  if (bytesize <= g_limit && mem_take(d, round256(bytesize))) {
    a = make_alloc(bytesize, FAKECUDA_PLAIN, d);
    if (!a) mem_add(d, -(int64_t)round256(bytesize));
  }
  if (!a) {
    CNT(alloc_failures);
    trace("oom plain %zu dev%d\n", bytesize, d);
    RET(CUDA_ERROR_OUT_OF_MEMORY);
  }
  CNT(plain_allocs);
  t_allocs++;
  trace("alloc plain %#" PRIxPTR " %zu dev%d\n", a->base, bytesize, d);
  *dptr = (CUdeviceptr)a->base;
  RET(CUDA_SUCCESS);
}
CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  NEED_INIT();
  CUresult r = plain_alloc(dptr, bytesize);
  launch_inside_if_armed();
  return r;
}

/* Rows aligned to 512 bytes, as the real driver aligns them (docs/FACTS.md). */
#define FAKECUDA_PITCH_ALIGNMENT 512

CUresult cuMemAllocPitch(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                         unsigned int ElementSizeBytes) {
  if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) return CUDA_ERROR_INVALID_VALUE;
  size_t pitch = (WidthInBytes + FAKECUDA_PITCH_ALIGNMENT - 1) / FAKECUDA_PITCH_ALIGNMENT * FAKECUDA_PITCH_ALIGNMENT;
  if (pitch < WidthInBytes || Height > SIZE_MAX / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = cuMemAlloc(dptr, pitch * Height);
  if (r == CUDA_SUCCESS) *pPitch = pitch;
  return r;
}

static void count_pool_free(const struct alloc *a) {
  if (a->pool->dev < 0) CNT(host_pool_frees);
  else CNT(pool_frees);
}

static void free_plain(struct alloc *a) {
  mem_add(a->dev, -(int64_t)a->rsize);
  CNT(plain_frees);
  trace("free plain %#" PRIxPTR "\n", a->base);
  destroy_alloc(a);
}

CUresult cuMemFree(CUdeviceptr dptr) {
  NEED_INIT();
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  if (prohibited()) RET(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  struct alloc *a = find_exact((uintptr_t)dptr);
  if (!a || a->kind == FAKECUDA_PINNED) {
    CNT(drv_invalid_frees);
    problem("cuMemFree(%#llx): not the start of a live allocation", (unsigned long long)dptr);
    RET(CUDA_ERROR_INVALID_VALUE);
  }
  CNT(mem_free_calls);
  if (a->kind == FAKECUDA_PLAIN) {
    free_plain(a);
  } else { /* synchronous free of a pool block */
    pool_take_back(a, NULL);
    count_pool_free(a);
    trace("free pool %#" PRIxPTR "\n", a->base);
    destroy_alloc(a);
  }
  RET(CUDA_SUCCESS);
}

CUresult cuMemGetInfo(size_t *free_, size_t *total) {
  NEED_INIT();
  if (!free_ || !total) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  *total = (size_t)g_limit;
  uint64_t used = mem_used(c->dev); /* over the limit a moment: another process's try */
  *free_ = (size_t)(used < g_limit ? g_limit - used : 0);
  RET(CUDA_SUCCESS);
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  if (g_nopools) return CUDA_ERROR_NOT_SUPPORTED;
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  *dptr = 0;
  LOCK();
  struct CUmemPoolHandle_st *p;
  struct CUstream_st *s;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  r = get_pool(pool, &p);
  if (r) RET(r);
  if (bytesize == 0) RET(CUDA_ERROR_INVALID_VALUE);
  r = gate(s, OP_MEM);
  if (r != CUDA_SUCCESS && r != CAPTURED) RET(r);
  int captured = r == CAPTURED;
  if (captured) CNT(captured_mem_ops);
  else enqueue(s);
  struct alloc *a;
  r = pool_alloc(p, s, bytesize, &a);
  if (r) RET(r);
  if (p->dev < 0) {
    CNT(host_pool_allocs);
    /* The CPU may use host memory only once the host has seen the allocation
     * complete (fakecuda_cpu_use), as work on a stream not ordered after it
     * may not (fakecuda_launch). */
    if (!captured) vc_set_max(&a->ready, s->sid, s->clock);
  } else {
    CNT(pool_allocs);
  }
  t_allocs++;
  s->pool_allocs++;
  trace("alloc pool %#" PRIxPTR " %zu dev%d\n", a->base, bytesize, p->dev);
  *dptr = (CUdeviceptr)a->base;
  RET(CUDA_SUCCESS);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  NEED_INIT();
  CUresult r = alloc_from_pool(dptr, bytesize, pool, hStream);
  launch_inside_if_armed();
  return r;
}

/* From the current device's pool, which in this double is always its default one. */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  NEED_INIT();
  CUdevice dev;
  CUresult r = cuCtxGetDevice(&dev);
  if (r) return r;
  CUmemoryPool pool;
  r = cuDeviceGetDefaultMemPool(&pool, dev);
  if (r) return r;
  return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

/* Is the free of block a on s ordered after all earlier work on every stream
 * of the block's device (of every device, for host memory) that may have touched it (work that touched it, and
 * work whose memory is not known)? Work on other blocks is left out, so that
 * a free is not blamed for work another thread issued while it ran. */
static void check_ordered(struct CUstream_st *s, struct alloc *a) {
  for (uint32_t i = 0; i < g_nstreams; i++) {
    struct CUstream_st *t = g_streams[i];
    if (t == s || (a->dev >= 0 && t->ctx->dev != a->dev) || t->gen != t->ctx->gen) continue;
    uint64_t need = vc_get(&a->touch, t->sid);
    if (t->last_untargeted > need) need = t->last_untargeted;
    if (!need) continue;
    if (vc_get(&s->vc, t->sid) < need && vc_get(&g_host_vc, t->sid) < need) {
      char x[64], y[64];
      CNT(unordered_frees);
      problem("cuMemFreeAsync(%#" PRIxPTR ") on stream %s is not ordered after the work (clock %llu) on stream %s%s",
              a->base, stream_name(s, x, sizeof x), (unsigned long long)need, stream_name(t, y, sizeof y),
              t->alive ? "" : " (destroyed)");
    }
  }
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  NEED_INIT();
  LOCK();
  struct CUstream_st *s;
  CUresult r = get_stream(hStream, &s);
  if (r) RET(r);
  struct alloc *a = find_exact((uintptr_t)dptr);
  if (!a || a->in_graph_free || a->kind == FAKECUDA_PINNED) {
    CNT(drv_invalid_frees);
    problem("cuMemFreeAsync(%#llx): not the start of a live allocation", (unsigned long long)dptr);
    RET(CUDA_ERROR_INVALID_VALUE);
  }
  r = gate(s, OP_MEM);
  if (r == CAPTURED) {
    CNT(captured_mem_ops);
    a->in_graph_free = 1;
    RET(CUDA_SUCCESS);
  }
  if (r) RET(r);
  CNT(free_async_calls);
  if (a->kind == FAKECUDA_PLAIN) {
    free_plain(a);
    RET(CUDA_SUCCESS);
  }
  enqueue(s);
  check_ordered(s, a);
  s->pool_frees++;
  pool_take_back(a, s);
  count_pool_free(a);
  trace("free pool %#" PRIxPTR "\n", a->base);
  destroy_alloc(a);
  RET(CUDA_SUCCESS);
}

/* ---- pinned host memory: real host memory, mapped for every device (its
 * device address is its host address), not the device's: a device reset
 * leaves it. Codes as measured (docs/FACTS.md, "Pinned host memory"). */
#define HOST_ALLOC_FLAGS (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  NEED_INIT();
  if (!pp) return CUDA_ERROR_INVALID_VALUE;
  *pp = NULL;
  if (Flags & ~(unsigned)HOST_ALLOC_FLAGS) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  if (bytesize == 0) RET(CUDA_SUCCESS); /* NULL, as the real one */
  if (prohibited()) RET(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  struct alloc *a = NULL;
  if (bytesize <= HOST_MEM_LIMIT && g_host_used + round256(bytesize) <= HOST_MEM_LIMIT)
    a = make_alloc(bytesize, FAKECUDA_PINNED, -1);
  if (!a) {
    CNT(alloc_failures);
    trace("oom pinned %zu\n", bytesize);
    RET(CUDA_ERROR_OUT_OF_MEMORY);
  }
  g_host_used += a->rsize;
  a->host_flags = Flags | CU_MEMHOSTALLOC_DEVICEMAP; /* every allocation is mapped */
  CNT(pinned_allocs);
  t_allocs++;
  trace("alloc pinned %#" PRIxPTR " %zu\n", a->base, bytesize);
  *pp = a->mem;
  RET(CUDA_SUCCESS);
}

CUresult cuMemAllocHost(void **pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

/* As the real one, it synchronizes the device first (every device here). */
CUresult cuMemFreeHost(void *p) {
  NEED_INIT();
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  if (!p) RET(CUDA_SUCCESS);
  if (prohibited()) RET(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  struct alloc *a = find_exact((uintptr_t)p);
  if (!a || a->kind != FAKECUDA_PINNED) {
    CNT(drv_invalid_frees);
    problem("cuMemFreeHost(%p): not the start of live pinned host memory", p);
    RET(CUDA_ERROR_INVALID_VALUE);
  }
  t_waits++;
  for (int d = 0; d < g_ndev; d++)
    if (g_ctx[d].active) host_waits_for_context(&g_ctx[d]);
  g_host_used -= a->rsize;
  CNT(pinned_frees);
  trace("free pinned %#" PRIxPTR "\n", a->base);
  destroy_alloc(a);
  RET(CUDA_SUCCESS);
}

/* The pinned allocation holding p (at its start or inside it), or NULL:
 * host pool memory is not pinned memory to these queries (measured). */
static struct alloc *pinned_holding(const void *p) {
  struct alloc *a = find_containing((uintptr_t)p);
  return a && a->kind == FAKECUDA_PINNED ? a : NULL;
}

CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p) {
  NEED_INIT();
  if (!pFlags) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  struct alloc *a = pinned_holding(p);
  if (!a) RET(CUDA_ERROR_INVALID_VALUE);
  *pFlags = a->host_flags;
  RET(CUDA_SUCCESS);
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags) {
  NEED_INIT();
  if (!pdptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r) RET(r);
  if (!pinned_holding(p)) RET(CUDA_ERROR_INVALID_VALUE);
  *pdptr = (CUdeviceptr)(uintptr_t)p;
  RET(CUDA_SUCCESS);
}

/* ---- pools */
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
  NEED_INIT();
  if (g_nopools) return CUDA_ERROR_NOT_SUPPORTED;
  if (!pool || !poolProps) return CUDA_ERROR_INVALID_VALUE;
  if (poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  int host = poolProps->location.type == CU_MEM_LOCATION_TYPE_HOST;
  if (host && g_nohostpools) return CUDA_ERROR_NOT_SUPPORTED;
  if (!host && poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (!host && (poolProps->location.id < 0 || poolProps->location.id >= g_ndev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCK();
  *pool = new_pool(host ? -1 : poolProps->location.id, 0);
  (*pool)->shareable = (poolProps->handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  CNT(pools_created);
  RET(CUDA_SUCCESS);
}

/* ---- IPC. The fake's device memory is each process's own heap, so nothing
 * is really shared: an imported pool is a new pool, an imported pointer a
 * new block of the exported one's size. What is checked is the protocol:
 * which calls are made, with what, and the codes they give (the real ones:
 * docs/FACTS.md, "CUDA IPC"). Legacy IPC handles are refused (1), as the real
 * driver refuses the handles of pool memory. */
struct fake_export { char magic[8]; uint64_t base, size; int pid; char pad[36]; };

CUresult cuMemPoolExportToShareableHandle(void *handle, CUmemoryPool pool, CUmemAllocationHandleType type,
                                          unsigned long long flags) {
  NEED_INIT();
  (void)flags;
  if (!handle || !pool || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  if (!pool->shareable) RET(CUDA_ERROR_INVALID_VALUE);
  int fd = open("/dev/null", O_RDONLY); /* as a driver may: without close-on-exec */
  if (fd < 0) RET(CUDA_ERROR_OUT_OF_MEMORY);
  *(int *)handle = fd;
  pool->exported = 1;
  CNT(pool_exports);
  RET(CUDA_SUCCESS);
}

CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *data, CUdeviceptr ptr) {
  NEED_INIT();
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct alloc *a = find_exact((uintptr_t)ptr);
  /* Only a block of a pool already exported (as the real driver, it seems:
   * docs/FACTS.md "CUDA IPC"). */
  if (!a || a->kind == FAKECUDA_PLAIN || !a->pool || !a->pool->shareable || !a->pool->exported)
    RET(CUDA_ERROR_INVALID_VALUE);
  struct fake_export e;
  memset(&e, 0, sizeof e);
  memcpy(e.magic, "FAKEEXP", 8);
  e.base = a->base;
  e.size = a->size;
  e.pid = getpid();
  memcpy(data, &e, sizeof e);
  CNT(pointer_exports);
  RET(CUDA_SUCCESS);
}

CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle, CUmemAllocationHandleType type,
                                            unsigned long long flags) {
  NEED_INIT();
  (void)flags;
  if (!pool_out || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  if (fcntl((int)(intptr_t)handle, F_GETFD) < 0) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  *pool_out = new_pool(0, 0);
  CNT(pool_imports);
  RET(CUDA_SUCCESS);
}

CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData *data) {
  NEED_INIT();
  struct fake_export e;
  if (!ptr_out || !pool || !data) return CUDA_ERROR_INVALID_VALUE;
  memcpy(&e, data, sizeof e);
  if (memcmp(e.magic, "FAKEEXP", 8) != 0 || e.pid == getpid()) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = cuMemAllocFromPoolAsync(ptr_out, e.size, pool, CU_STREAM_LEGACY);
  if (r == CUDA_SUCCESS) r = cuStreamSynchronize(CU_STREAM_LEGACY);
  if (r == CUDA_SUCCESS) CNT(pointer_imports);
  return r;
}

CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  NEED_INIT();
  LOCK();
  struct alloc *a = find_containing((uintptr_t)ptr);
  if (!a) RET(CUDA_ERROR_NOT_FOUND);
  if (base) *base = (CUdeviceptr)a->base;
  if (size) *size = a->size;
  RET(CUDA_SUCCESS);
}

/* One pointer attribute, as the real driver answers it (measured on an H100,
 * c_tests/gpu/pointer_ops.cu): pool memory has no context, names its pool and
 * the pool's handle types, and is not legacy-IPC capable; cuMemAlloc memory
 * is the reverse. The caller holds the lock. */
static CUresult attribute_of(struct alloc *a, CUpointer_attribute attribute, void *data) {
  int plain = a->kind == FAKECUDA_PLAIN, pinned = a->kind == FAKECUDA_PINNED;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *(CUcontext *)data = plain || pinned ? &g_ctx[a->dev < 0 ? 0 : a->dev] : NULL;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(unsigned *)data = a->dev < 0 ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *(int *)data = a->dev < 0 ? 0 : a->dev;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *(int *)data = plain;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *(CUdeviceptr *)data = (CUdeviceptr)a->base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *(size_t *)data = a->size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      *(unsigned long long *)data = a->pool && a->pool->shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *(CUmemoryPool *)data = a->kind == FAKECUDA_POOL ? a->pool : NULL;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  NEED_INIT();
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct alloc *a = find_containing((uintptr_t)ptr);
  if (!a) RET(CUDA_ERROR_INVALID_VALUE);
  RET(attribute_of(a, attribute, data));
}

/* As documented: no error for a pointer CUDA does not know, or an attribute
 * it cannot answer for it; those get zero (NULL, false). */
CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute *attributes, void **data, CUdeviceptr ptr) {
  NEED_INIT();
  if (!attributes || !data) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct alloc *a = find_containing((uintptr_t)ptr);
  for (unsigned i = 0; i < count; i++) {
    if (!data[i]) RET(CUDA_ERROR_INVALID_VALUE);
    uint64_t value = 0;
    if (a) attribute_of(a, attributes[i], &value);
    memcpy(data[i], &value, attributes[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE ||
                                    attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL ||
                                    attributes[i] == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
                                ? sizeof(int)
                                : sizeof value);
  }
  RET(CUDA_SUCCESS);
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr ptr) {
  NEED_INIT();
  (void)handle;
  (void)ptr;
  CNT(legacy_ipc_calls);
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *ptr, CUipcMemHandle handle, unsigned int flags) {
  NEED_INIT();
  (void)ptr;
  (void)handle;
  (void)flags;
  CNT(legacy_ipc_calls);
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
  NEED_INIT();
  (void)ptr;
  CNT(legacy_ipc_calls);
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  NEED_INIT();
  LOCK();
  struct CUmemPoolHandle_st *p;
  CUresult r = get_pool(pool, &p);
  if (r) RET(r);
  if (p->is_default) RET(CUDA_ERROR_INVALID_VALUE);
  p->alive = 0; /* outstanding blocks stay valid until freed */
  pool_release(p, 0);
  CNT(pools_destroyed);
  RET(CUDA_SUCCESS);
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  NEED_INIT();
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUmemPoolHandle_st *p;
  CUresult r = get_pool(pool, &p);
  if (r) RET(r);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: p->follow = *(int *)value != 0; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: p->opportunistic = *(int *)value != 0; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: p->internal = *(int *)value != 0; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->threshold = *(cuuint64_t *)value; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (*(cuuint64_t *)value) RET(CUDA_ERROR_INVALID_VALUE);
      p->reserved_high = p->reserved;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (*(cuuint64_t *)value) RET(CUDA_ERROR_INVALID_VALUE);
      p->used_high = p->used;
      break;
    default: RET(CUDA_ERROR_INVALID_VALUE);
  }
  RET(CUDA_SUCCESS);
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  NEED_INIT();
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUmemPoolHandle_st *p;
  CUresult r = get_pool(pool, &p);
  if (r) RET(r);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: *(int *)value = p->follow; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: *(int *)value = p->opportunistic; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = p->internal; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = p->used_high; break;
    default: RET(CUDA_ERROR_INVALID_VALUE);
  }
  RET(CUDA_SUCCESS);
}

CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
  NEED_INIT();
  if (!map && count) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUmemPoolHandle_st *p;
  CUresult r = get_pool(pool, &p);
  if (r) RET(r);
  CNT(set_access);
  p->set_access_calls++;
  for (size_t i = 0; i < count; i++) {
    const CUmemAccessDesc *d = &map[i];
    if (d->location.type != CU_MEM_LOCATION_TYPE_DEVICE) RET(CUDA_ERROR_INVALID_VALUE);
    if (d->location.id < 0 || d->location.id >= g_ndev) RET(CUDA_ERROR_INVALID_DEVICE);
    if (d->flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d->flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        d->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      RET(CUDA_ERROR_INVALID_VALUE);
    if (d->location.id == p->dev && d->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) RET(CUDA_ERROR_INVALID_DEVICE);
  }
  for (size_t i = 0; i < count; i++) {
    p->access[map[i].location.id] = map[i].flags;
    p->last_access_device = map[i].location.id;
    p->last_access_flags = map[i].flags;
  }
  RET(CUDA_SUCCESS);
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  NEED_INIT();
  LOCK();
  struct CUmemPoolHandle_st *p;
  CUresult r = get_pool(pool, &p);
  if (r) RET(r);
  CNT(pool_trims);
  p->trims++;
  pool_release(p, minBytesToKeep);
  RET(CUDA_SUCCESS);
}

/* A variant of a work entry point that the double does not export, as a
 * driver newer than the shim may hand out: its calls pass the shim. */
static CUresult launch_kernel_unexported(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                         unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                         unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                         void **kernelParams, void **extra) {
  return cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                        kernelParams, extra);
}

/* ---- cuGetProcAddress: the entry points the fake runtime (FAKECUDA_RT_PROCADDR=1)
 * and c_tests/cpu/static_runtime.c ask for, as a real runtime does */
#define PROC(n, f) {n, (void *)(f)}
static const struct { const char *name; void *fn; } g_procs[] = {
    PROC("cuInit", cuInit),
    PROC("cuDeviceGetCount", cuDeviceGetCount),
    PROC("cuDeviceGetAttribute", cuDeviceGetAttribute),
    PROC("cuDeviceGetUuid", cuDeviceGetUuid_v2),
    PROC("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool),
    PROC("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain),
    PROC("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2),
    PROC("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2),
    PROC("cuCtxSetCurrent", cuCtxSetCurrent),
    PROC("cuCtxSynchronize", cuCtxSynchronize),
    PROC("cuCtxEnablePeerAccess", cuCtxEnablePeerAccess),
    PROC("cuCtxDisablePeerAccess", cuCtxDisablePeerAccess),
    PROC("cuStreamCreate", cuStreamCreate),
    PROC("cuStreamCreateWithPriority", cuStreamCreateWithPriority),
    PROC("cuStreamDestroy", cuStreamDestroy_v2),
    PROC("cuStreamSynchronize", cuStreamSynchronize),
    PROC("cuStreamQuery", cuStreamQuery),
    PROC("cuStreamBeginCapture", cuStreamBeginCapture_v2),
    PROC("cuStreamBeginCaptureToGraph", cuStreamBeginCaptureToGraph),
    PROC("cuStreamEndCapture", cuStreamEndCapture),
    PROC("cuStreamIsCapturing", cuStreamIsCapturing),
    PROC("cuLaunchKernel", cuLaunchKernel),
    PROC("cuLaunchKernel_ptsz", launch_kernel_unexported), /* c_tests/cpu/legacy_stream.c */
    PROC("cuDriverGetVersion", cuDriverGetVersion),
    PROC("cuGraphDestroy", cuGraphDestroy),
    PROC("cuMemAlloc", cuMemAlloc_v2),
    PROC("cuMemAllocPitch", cuMemAllocPitch_v2),
    PROC("cuMemFree", cuMemFree_v2),
    PROC("cuMemGetInfo", cuMemGetInfo_v2),
    PROC("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync),
    PROC("cuMemAllocAsync", cuMemAllocAsync),
    PROC("cuMemFreeAsync", cuMemFreeAsync),
    PROC("cuMemAllocHost", cuMemAllocHost_v2),
    PROC("cuMemHostAlloc", cuMemHostAlloc),
    PROC("cuMemFreeHost", cuMemFreeHost),
    PROC("cuMemHostGetFlags", cuMemHostGetFlags),
    PROC("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2),
    PROC("cuIpcGetMemHandle", cuIpcGetMemHandle),
    PROC("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2),
    PROC("cuIpcCloseMemHandle", cuIpcCloseMemHandle),
    PROC("cuGetProcAddress", cuGetProcAddress_v2),
};

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *symbolStatus) {
  (void)cudaVersion;
  (void)flags;
  CNT(procaddr_lookups);
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++)
    if (strcmp(g_procs[i].name, symbol) == 0) {
      *pfn = g_procs[i].fn;
      if (symbolStatus) *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *pfn = NULL;
  if (symbolStatus) *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

/* ------------------------------------------------------------ observation */
struct fakecuda_counters *fakecuda_counters(void) {
  init();
  return &g_cnt;
}

void fakecuda_snapshot(struct fakecuda_counters *out) {
  init();
  LOCK();
  uint64_t *src = (uint64_t *)&g_cnt, *dst = (uint64_t *)out;
  for (size_t i = 0; i < sizeof g_cnt / sizeof(uint64_t); i++) dst[i] = __atomic_load_n(&src[i], __ATOMIC_SEQ_CST);
  UNLOCK();
}

int fakecuda_ptr_info(const void *p, struct fakecuda_ptr_info *out) {
  init();
  LOCK();
  memset(out, 0, sizeof *out);
  struct alloc *a = find_containing((uintptr_t)p);
  if (!a) {
    UNLOCK();
    return 0;
  }
  out->kind = a->kind;
  out->device = a->dev;
  out->host = a->dev < 0;
  out->base = a->base;
  out->size = a->size;
  out->pool = a->pool;
  out->stream = a->stream && a->stream->is_legacy ? (void *)CU_STREAM_LEGACY : (void *)a->stream;
  out->in_graph_free = a->in_graph_free;
  UNLOCK();
  return 1;
}

uint64_t fakecuda_thread_waits(void) { return t_waits; }
uint64_t fakecuda_thread_allocs(void) { return t_allocs; }
uint64_t fakecuda_thread_legacy_records(void) { return t_legacy_records; }

/* The block's earlier uses become what work of its new owner must be ordered
 * after, as at a reuse by the pool (pool_alloc); the new owner's own work
 * starts a new record. */
int fakecuda_handed_out(const void *p) {
  init();
  LOCK();
  struct alloc *a = find_exact((uintptr_t)p);
  if (!a) {
    UNLOCK();
    return 0;
  }
  vc_merge(&a->ready, &a->touch);
  a->touch.n = 0;
  UNLOCK();
  return 1;
}

int fakecuda_block_idle(const void *p) {
  init();
  LOCK();
  struct alloc *a = find_containing((uintptr_t)p);
  int idle = a && host_covers(&a->touch) && host_covers(&a->ready);
  UNLOCK();
  return idle;
}

int fakecuda_stream_stats(const void *stream, struct fakecuda_stream_stats *out) {
  init();
  LOCK();
  memset(out, 0, sizeof *out);
  struct CUstream_st *s = NULL;
  if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    struct CUctx_st *c = cur_raw();
    if (!c || !c->active) {
      UNLOCK();
      return 0;
    }
    s = stream == CU_STREAM_PER_THREAD ? per_thread_stream(c) : g_legacy[c->dev];
  } else {
    for (uint32_t i = 0; i < g_nstreams; i++)
      if (g_streams[i] == stream) s = g_streams[i];
  }
  if (!s) {
    UNLOCK();
    return 0;
  }
  out->alive = stream_live(s);
  out->device = s->ctx->dev;
  out->flags = s->flags;
  out->is_legacy = s->is_legacy;
  out->is_per_thread = s->is_per_thread;
  out->records = s->records;
  out->queries = s->queries;
  out->waits = s->waits;
  out->work = s->work;
  out->pool_allocs = s->pool_allocs;
  out->pool_frees = s->pool_frees;
  out->capturing = s->cap != NULL;
  UNLOCK();
  return 1;
}

int fakecuda_pool_stats(const void *pool, struct fakecuda_pool_stats *out) {
  init();
  LOCK();
  memset(out, 0, sizeof *out);
  struct CUmemPoolHandle_st *p = NULL;
  for (uint32_t i = 0; i < g_npools; i++)
    if (g_pools[i] == pool) p = g_pools[i];
  if (!p) {
    UNLOCK();
    return 0;
  }
  out->alive = p->alive && pool_current(p);
  out->device = p->dev;
  out->is_default = p->is_default;
  out->is_host = p->dev < 0;
  out->release_threshold = p->threshold;
  out->reuse_follow_event_deps = p->follow;
  out->reuse_allow_opportunistic = p->opportunistic;
  out->reuse_allow_internal_deps = p->internal;
  out->reserved = p->reserved;
  out->used = p->used;
  out->live_allocs = p->live_allocs;
  out->trims = p->trims;
  out->set_access_calls = p->set_access_calls;
  for (int i = 0; i < MAXDEV; i++) out->access[i] = p->access[i];
  out->last_access_device = p->last_access_device;
  out->last_access_flags = p->last_access_flags;
  UNLOCK();
  return 1;
}

/* May work on s use block a? Not while work that used its memory before a
 * reuse may still run: s must be ordered after it, or the host past it. */
static void check_ready(struct CUstream_st *s, struct alloc *a) {
  for (uint32_t i = 0; i < a->ready.n; i++) {
    uint32_t sid = a->ready.e[i].sid;
    uint64_t clk = a->ready.e[i].clk;
    if (vc_get(&s->vc, sid) < clk && vc_get(&g_host_vc, sid) < clk) {
      char x[64], y[64];
      CNT(unordered_uses);
      problem("work on stream %s uses %#" PRIxPTR ", whose memory work on stream %s (clock %llu) may still use",
              stream_name(s, x, sizeof x), a->base, stream_name(g_streams[sid], y, sizeof y), (unsigned long long)clk);
    }
  }
}

static int launch(const void *stream, const void *p, int check_access) {
  init();
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  LOCK();
  struct CUstream_st *s;
  CUresult r = get_stream((CUstream)stream, &s);
  if (r) RET(r);
  struct alloc *a = NULL;
  if (p) {
    a = find_containing((uintptr_t)p);
    int from = s->ctx->dev;
    if (!a) {
      problem("kernel touched %p: not device memory", p);
      RET(CUDA_ERROR_ILLEGAL_ADDRESS);
    }
    int ok = !check_access || a->dev == from || a->kind == FAKECUDA_PINNED || /* mapped for every device */
             (a->kind == FAKECUDA_PLAIN ? s->ctx->peer[a->dev]
                                        : a->pool->access[from] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (!ok) {
      problem("kernel on device %d touched %p of device %d without access", from, p, a->dev);
      RET(CUDA_ERROR_ILLEGAL_ADDRESS);
    }
  }
  r = gate(s, OP_WORK);
  if (r == CAPTURED) RET(CUDA_SUCCESS);
  if (r) RET(r);
  enqueue(s);
  if (a) check_ready(s, a);
  s->last_work = s->clock;
  if (a) vc_set_max(&a->touch, s->sid, s->clock);
  else s->last_untargeted = s->clock;
  s->work++;
  RET(CUDA_SUCCESS);
}

/* The one kernel the double runs: its parameters are the address it touches
 * and whether the stream's device must be able to reach it. */
struct CUfunc_st {
  uint32_t magic;
};
static struct CUfunc_st g_touch_kernel = {0x70C4u};

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
  (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX, (void)blockDimY, (void)blockDimZ;
  (void)sharedMemBytes, (void)extra;
  if (f != &g_touch_kernel || !kernelParams) return CUDA_ERROR_INVALID_HANDLE;
  return launch(hStream, *(const void *const *)kernelParams[0], *(const int *)kernelParams[1]);
}

/* Work goes through the cuLaunchKernel the process finds first, as a
 * program's launches do: a preloaded shim's, which must see every one. */
static int launch_as_program(const void *stream, const void *p, int check_access) {
  typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                CUstream, void **, void **);
  static launch_fn found; /* looked up once */
  launch_fn entry = __atomic_load_n(&found, __ATOMIC_ACQUIRE);
  if (!entry) {
    /* The program's handle: its global scope, preloads first (RTLD_DEFAULT
     * would find this library's own, which binds symbolically). */
    void *program = dlopen(NULL, RTLD_LAZY);
    entry = program ? (launch_fn)dlsym(program, "cuLaunchKernel") : NULL;
    if (!entry) entry = cuLaunchKernel;
    __atomic_store_n(&found, entry, __ATOMIC_RELEASE);
  }
  void *params[] = {&p, &check_access};
  return entry(&g_touch_kernel, 1, 1, 1, 1, 1, 1, 0, (CUstream)stream, params, NULL);
}

int fakecuda_launch(const void *stream, const void *p) { return launch_as_program(stream, p, 1); }

void fakecuda_launch_inside_next_alloc(const void *stream, const void *p) {
  t_inside.armed = 1;
  t_inside.stream = stream;
  t_inside.p = p;
}

static void launch_inside_if_armed(void) {
  if (!t_inside.armed) return;
  t_inside.armed = 0;
  launch_as_program(t_inside.stream, t_inside.p, 1);
}

int fakecuda_cpu_use(const void *p) {
  init();
  LOCK();
  struct alloc *a = find_containing((uintptr_t)p);
  if (!a || a->dev >= 0) {
    problem("the CPU touched %p: not live pinned host memory", p);
    UNLOCK();
    return 0;
  }
  for (uint32_t i = 0; i < a->ready.n; i++) {
    uint32_t sid = a->ready.e[i].sid;
    uint64_t clk = a->ready.e[i].clk;
    if (vc_get(&g_host_vc, sid) < clk) {
      char y[64];
      CNT(unordered_uses);
      problem("the CPU uses %#" PRIxPTR ", which work on stream %s (clock %llu) may still use, or allocates", a->base,
              stream_name(g_streams[sid], y, sizeof y), (unsigned long long)clk);
      break;
    }
  }
  UNLOCK();
  return 1;
}

uint64_t fakecuda_device_used(int dev) {
  init();
  if (dev < -1 || dev >= MAXDEV) return 0;
  LOCK();
  uint64_t u = mem_used(dev);
  UNLOCK();
  return u;
}

int fakecuda_device_idle(int dev) {
  init();
  LOCK();
  int idle = 1;
  for (uint32_t i = 0; i < g_nstreams; i++) {
    struct CUstream_st *t = g_streams[i];
    if (t->ctx->dev == dev && t->gen == t->ctx->gen && vc_get(&g_host_vc, t->sid) < t->last_work) idle = 0;
  }
  UNLOCK();
  return idle;
}

const char *fakecuda_last_problem(void) {
  init();
  LOCK();
  snprintf(t_problem, sizeof t_problem, "%s", g_problem);
  g_problem[0] = 0;
  UNLOCK();
  return t_problem;
}

/* For the fake runtime only: capture state seen by its cudaMalloc/cudaFree.
 * Returns 1 if an unsafe call is prohibited now (and invalidates captures as
 * the driver would); *in_capture says whether the current context has any
 * capture going on (the runtime's cudaFree then skips its implicit sync). */
int fakecuda__unsafe_call(int *in_capture) {
  init();
  LOCK();
  int pro = prohibited();
  struct CUctx_st *c = cur_raw();
  if (in_capture) *in_capture = c ? capture_in_ctx(c, 0) : 0;
  UNLOCK();
  return pro;
}

/* For the fake runtime only: the device of the current context if it is
 * usable (not reset), else -1. */
int fakecuda__current_device(void) {
  init();
  LOCK();
  struct CUctx_st *c = cur_raw();
  int d = c && c->active ? c->dev : -1;
  UNLOCK();
  return d;
}

/* For the fake runtime only: work (cudaMemset/cudaMemcpy) on a stream that
 * touches device memory at p (NULL: unknown memory). */
int fakecuda__work(const void *stream, const void *p) { return launch_as_program(stream, p, 0); }
