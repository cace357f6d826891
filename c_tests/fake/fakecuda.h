/* fakecuda: a CPU-only test double of the CUDA driver (libcuda.so.1) and
 * runtime (libcudart.so.13), for testing somashim without a GPU.
 *
 * "Device memory" is host memory (aligned_alloc, 256-byte aligned). All work
 * is done at once, but the double keeps the ordering a GPU would need: every
 * stream has a vector clock, events carry them, waits merge them, host
 * synchronizations are remembered. That lets it check what a real GPU cannot
 * show on a CPU: that a stream-ordered free is ordered after all earlier work
 * on every stream of the device that may touch the block (counter
 * unordered_frees, work simulated with fakecuda_launch), that pool memory
 * is only reused once the pool may reuse it, and what a capture would do.
 *
 * Environment (read once, at the first driver call):
 *   FAKECUDA_DEVICES=n      number of devices (default 1, at most 8; 0: cuInit
 *                           returns CUDA_ERROR_NO_DEVICE)
 *   FAKECUDA_NO_POOLS=1     CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0 and
 *                           every pool call returns CUDA_ERROR_NOT_SUPPORTED
 *                           (host memory pools included)
 *   FAKECUDA_NO_HOST_POOLS=1  CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED
 *                           is 0 and cuMemPoolCreate of a host pool returns
 *                           CUDA_ERROR_NOT_SUPPORTED (device pools work)
 *   FAKECUDA_MEM_LIMIT=n    bytes of device memory per device (default 16 GiB):
 *                           live plain allocations plus every pool's reserved
 *                           memory may not exceed it (CUDA_ERROR_OUT_OF_MEMORY,
 *                           cudaErrorMemoryAllocation). Also what
 *                           cuDeviceTotalMem and cuMemGetInfo report.
 *   FAKECUDA_SHARED_MEMORY=path  device memory is shared by every process
 *                           naming the same file, as one GPU's is: each counts
 *                           its use in a slot of a table mapped from path
 *                           (created, 0600), and the FAKECUDA_MEM_LIMIT check
 *                           and cuMemGetInfo see the sum over processes that
 *                           are alive (kill(pid, 0), and not a zombie), so a
 *                           dead process's memory goes back. A forked child
 *                           counts its own from 0 (64 processes at most at
 *                           once). Pinned host memory stays per process.
 *                           Default: each process has its own devices.
 *   FAKECUDA_LAZY_GPU=1     the GPU makes progress only when the host waits:
 *                           cuEventQuery/cuStreamQuery return
 *                           CUDA_ERROR_NOT_READY until the host synchronized
 *                           (stream, context or event) with the work concerned
 *                           (default: they return CUDA_SUCCESS, and the host
 *                           then knows that work is done)
 *   FAKECUDA_TRACE=path     append one line per allocation and free to path
 *                           (written with write(2), survives _exit)
 *   FAKECUDA_RT_PROCADDR=1  the fake runtime finds the driver the way the real
 *                           one does: dlopen("libcuda.so.1"), dlsym(handle,
 *                           "cuGetProcAddress_v2"), then cuGetProcAddress for
 *                           every entry point (default: direct calls)
 *
 * Model, in short:
 * - one primary context per device (static objects); a per-thread current
 *   context; cuInit required first. cuDevicePrimaryCtxReset (the runtime's
 *   cudaDeviceReset) destroys every stream, event, pool and allocation of the
 *   device, as does releasing its last reference; the old handles then fail
 *   (streams and events with CUDA_ERROR_INVALID_HANDLE, pools with
 *   CUDA_ERROR_INVALID_VALUE; counter invalid_handles) and are never freed,
 *   so a stale handle is caught, not a crash. While a reset context is
 *   current and not retained again, calls that need it return
 *   CUDA_ERROR_CONTEXT_IS_DESTROYED. An event must be recorded on a stream of
 *   its own context.
 * - the default pool of a device is made on first use (a new one after a
 *   reset); cuMemPoolCreate makes more. New pools have the real defaults:
 *   release threshold 0, all three reuse policies on. A pool's freed memory stays reserved in the pool. A freed
 *   block may be reused by an allocation on the stream it was freed on at
 *   once; on another stream only once the free has completed (the host
 *   synchronized with it: stream/context/event synchronization, or a
 *   successful cuEventQuery; the fake GPU only "makes progress" then), or the
 *   allocating stream waited on an event recorded after the free (with
 *   REUSE_FOLLOW_EVENT_DEPENDENCIES), or with REUSE_ALLOW_INTERNAL_DEPENDENCIES
 *   (the allocating stream is then made to wait). Completed free memory above
 *   the release threshold is released at host synchronizations;
 *   cuMemPoolTrimTo releases completed free memory.
 * - the legacy stream (NULL, CU_STREAM_LEGACY) waits for all blocking streams
 *   and they wait for it; non-blocking streams do not. CU_STREAM_PER_THREAD is
 *   a blocking stream per thread and context.
 * - pinned host memory (cuMemAllocHost, cuMemHostAlloc; the runtime's
 *   cudaMallocHost, cudaHostAlloc) is host memory the CPU may touch, mapped
 *   for every device at its host address, at most 64 GiB in all. Its flags
 *   read as requested | DEVICEMAP; cuMemFreeHost synchronizes every device
 *   first, as the real one does; cudaFree/cuMemFree of it, and
 *   cuMemFreeHost of anything else, fail with invalid value (docs/FACTS.md).
 *   A host memory pool (cuMemPoolCreate, location type HOST) belongs to no
 *   device (fakecuda_ptr_info's device -1): it grants no device access until
 *   cuMemPoolSetAccess, and a reset leaves it. Its blocks are ordered like
 *   device pool blocks (unordered_frees, unordered_uses, against the streams
 *   of every device), and the CPU's use of one (fakecuda_cpu_use) must come
 *   after the host saw its allocation and the earlier owners' work finish.
 * - stream capture: modes, prohibited ("unsafe") calls, implicit legacy-stream
 *   dependencies, forks through events and unjoined forks follow the CUDA
 *   documentation and what was measured on an H200 (docs/FACTS.md).
 *
 * - freed memory goes to a quarantine before malloc may reuse it, so a freed
 *   address is not handed out again at once.
 * - both libraries are linked with -Bsymbolic, as the real ones bind their
 *   own functions: cuGetProcAddress hands out the driver's own entry points,
 *   whatever a preload defines. The runtime reaches the driver through the
 *   dynamic linker (or cuGetProcAddress, FAKECUDA_RT_PROCADDR=1), so a
 *   preload's driver exports see the runtime's own driver calls.
 *
 * Observation: the functions below are exported by the fake libcuda.so.1.
 * Tests link to it directly (-lcuda) next to -lcudart. */
#ifndef FAKECUDA_H
#define FAKECUDA_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Process-wide counters, updated atomically. Read them with
 * fakecuda_snapshot() (consistent copy) and compare before/after. */
struct fakecuda_counters {
  /* Allocations by kind. plain: cuMemAlloc (the runtime's cudaMalloc).
   * pool: cuMemAllocAsync (the runtime's cudaMallocAsync) and
   * cuMemAllocFromPoolAsync. A *_frees
   * counter counts frees of that kind of allocation, whatever the call
   * (cuMemFree, cuMemFreeAsync, cudaFree, cudaFreeAsync). */
  uint64_t plain_allocs, plain_frees;
  uint64_t pool_allocs, pool_frees;
  uint64_t alloc_failures;     /* allocations refused: out of memory */
  uint64_t mem_free_calls;     /* cuMemFree_v2 calls that freed something */
  uint64_t free_async_calls;   /* cuMemFreeAsync calls that freed something */
  uint64_t drv_invalid_frees;  /* cuMemFree/cuMemFreeAsync/cuMemFreeHost given a
                                  pointer that is not the start of a live
                                  allocation of their kind */
  uint64_t rt_invalid_frees;   /* cudaFree/cudaFreeAsync rejected a pointer */
  uint64_t event_records_legacy; /* cuEventRecord on the legacy stream */
  uint64_t event_records_other;  /* cuEventRecord on any other stream */
  uint64_t stream_waits;       /* cuStreamWaitEvent */
  uint64_t pool_trims;         /* cuMemPoolTrimTo */
  uint64_t ctx_syncs;          /* cuCtxSynchronize (cudaDeviceSynchronize, and
                                  the implicit one of the runtime's cudaFree) */
  uint64_t stream_syncs;       /* cuStreamSynchronize */
  uint64_t event_syncs;        /* cuEventSynchronize */
  uint64_t pools_created;      /* cuMemPoolCreate */
  uint64_t pool_exports;       /* cuMemPoolExportToShareableHandle */
  uint64_t pointer_exports;    /* cuMemPoolExportPointer */
  uint64_t pool_imports;       /* cuMemPoolImportFromShareableHandle */
  uint64_t pointer_imports;    /* cuMemPoolImportPointer */
  uint64_t legacy_ipc_calls;   /* cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle */
  uint64_t pools_destroyed;    /* cuMemPoolDestroy */
  uint64_t set_access;         /* cuMemPoolSetAccess */
  uint64_t unordered_frees;    /* cuMemFreeAsync of a pool block whose stream
                                  was not ordered after earlier work that may
                                  have touched it, on any stream (destroyed
                                  ones included) of the block's device, and
                                  that the host had not synchronized with */
  uint64_t unordered_uses;     /* work (fakecuda_launch) on a pool block whose
                                  memory was reused while earlier work that
                                  used it may still run, on a stream not
                                  ordered after that work; or the CPU's use
                                  (fakecuda_cpu_use) of host memory before the
                                  host saw that work, or its allocation, finish */
  uint64_t invalid_handles;    /* a call got a destroyed/unknown stream, event,
                                  pool or context (stale after a reset, say) */
  uint64_t streams_created, streams_destroyed;
  uint64_t events_created, events_destroyed;
  uint64_t captured_mem_ops;   /* pool alloc/free enqueued into a capture */
  uint64_t capture_invalidations; /* captures invalidated by a call */
  uint64_t device_resets;      /* cuDevicePrimaryCtxReset */
  uint64_t peer_enables;       /* cuCtxEnablePeerAccess that succeeded */
  uint64_t procaddr_lookups;   /* cuGetProcAddress calls */
  /* Pinned host memory: cuMemAllocHost/cuMemHostAlloc (cudaMallocHost,
   * cudaHostAlloc) and cuMemFreeHost (cudaFreeHost); allocations from host
   * memory pools and their frees (not in pool_allocs, pool_frees). */
  uint64_t pinned_allocs, pinned_frees;
  uint64_t host_pool_allocs, host_pool_frees;
};

/* Live counters (fields change under you; prefer fakecuda_snapshot). */
struct fakecuda_counters *fakecuda_counters(void);
void fakecuda_snapshot(struct fakecuda_counters *out);

/* PLAIN: cuMemAlloc; POOL: from a pool (a host memory pool too); PINNED:
 * cuMemAllocHost/cuMemHostAlloc. */
enum { FAKECUDA_NONE = 0, FAKECUDA_PLAIN = 1, FAKECUDA_POOL = 2, FAKECUDA_PINNED = 3 };

struct fakecuda_ptr_info {
  int kind;          /* FAKECUDA_NONE (not inside a live allocation), _PLAIN, _POOL, _PINNED */
  int device;        /* -1 for host memory */
  int host;          /* host memory: PINNED, or POOL of a host memory pool */
  uintptr_t base;    /* start of the allocation containing the pointer */
  size_t size;       /* its size as requested */
  void *pool;        /* CUmemoryPool it came from (pool kind), else NULL */
  void *stream;      /* CUstream it was allocated on (pool kind; the legacy
                        stream reads as CU_STREAM_LEGACY), else NULL */
  int in_graph_free; /* a captured cuMemFreeAsync "freed" it inside a graph */
};
/* 1 if p points inside a live allocation (info filled), else 0 (kind NONE). */
int fakecuda_ptr_info(const void *p, struct fakecuda_ptr_info *out);

struct fakecuda_stream_stats {
  int alive, device;
  unsigned flags;      /* CU_STREAM_DEFAULT (blocking) or CU_STREAM_NON_BLOCKING */
  int is_legacy, is_per_thread;
  uint64_t records;    /* cuEventRecord on it */
  uint64_t waits;      /* cuStreamWaitEvent on it */
  uint64_t queries;    /* cuStreamQuery on it */
  uint64_t work;       /* fakecuda_launch, cudaMemset, cudaMemcpy on it */
  uint64_t pool_allocs, pool_frees; /* cuMemAllocFromPoolAsync/cuMemFreeAsync on it */
  int capturing;       /* part of an active capture */
};
/* stream: a CUstream/cudaStream_t; NULL or CU_STREAM_LEGACY: the current
 * context's legacy stream; CU_STREAM_PER_THREAD: this thread's. Returns 0 if
 * it is not a stream the double knows (nor a destroyed one). */
int fakecuda_stream_stats(const void *stream, struct fakecuda_stream_stats *out);

struct fakecuda_pool_stats {
  int alive, device, is_default;
  int is_host;                    /* a host memory pool (device -1) */
  uint64_t release_threshold;
  int reuse_follow_event_deps, reuse_allow_opportunistic, reuse_allow_internal_deps;
  uint64_t reserved, used;        /* bytes */
  uint64_t live_allocs;
  uint64_t trims, set_access_calls;
  /* access[d]: CUmemAccess_flags that device d has, as set with
   * cuMemPoolSetAccess (the owning device always reads 3 = READWRITE) */
  unsigned access[8];
  int last_access_device;         /* location.id of the last descriptor set */
  unsigned last_access_flags;     /* and its flags; -1/0 before any */
};
/* pool: a CUmemoryPool/cudaMemPool_t. Returns 0 if unknown. */
int fakecuda_pool_stats(const void *pool, struct fakecuda_pool_stats *out);

/* Simulates a kernel on stream (NULL: legacy) of the current context that
 * reads and writes the block containing p (p NULL: memory not known, so any
 * block). Counts as work on the stream: a later stream-ordered free of that
 * block (any block for p NULL) must be ordered after it (unordered_frees).
 * Work that touched other blocks is not required before a free, so that a
 * free is not blamed for work another thread issued while it ran. Returns a
 * CUresult: CUDA_ERROR_ILLEGAL_ADDRESS (700, not sticky) when p is not in a
 * live allocation or its device is not reachable from the stream's device:
 * for plain memory, peer access must be enabled (cuCtxEnablePeerAccess); for
 * pool memory (a host pool's too), the pool must grant the device access
 * (cuMemPoolSetAccess); pinned memory is reachable from every device.
 * Launched as a program launches, through the first cuLaunchKernel the
 * process finds (a preloaded shim's), with the double's one kernel. */
int fakecuda_launch(const void *stream, const void *p);

/* The calling thread's next allocation at the driver (cuMemAlloc,
 * cuMemAllocFromPoolAsync) ends by launching work on stream touching p, as
 * fakecuda_launch does: work issued from inside another call, as a driver
 * callback or a library's nested call issues it (under the shim: inside its
 * hook of the allocation, where the shim's cuLaunchKernel is re-entered). */
void fakecuda_launch_inside_next_alloc(const void *stream, const void *p);

/* The CPU reads or writes the host memory (pinned, or of a host pool)
 * containing p now. Work of its earlier owners that the host has not seen
 * finish, or the block's allocation on a stream the host has not seen pass
 * it, counts as unordered_uses: the CPU would race it. Returns 1 if p is in
 * live host memory, else 0 (nothing counted). */
int fakecuda_cpu_use(const void *p);

/* 1 if the host has synchronized with all work issued so far on every stream
 * of device dev (what a device-wide synchronization gives), else 0. Any
 * thread's synchronization counts (a successful cuEventQuery/cuStreamQuery
 * included: the fake GPU makes progress then), a shim's own thread too. */
int fakecuda_device_idle(int dev);

/* Bytes of device dev in use, as the FAKECUDA_MEM_LIMIT check and
 * cuMemGetInfo see them: live plain allocations plus pools' reserved memory,
 * of every live process with FAKECUDA_SHARED_MEMORY, else of this one. dev -1:
 * this process's pinned host memory. 0 for any other dev out of range. */
uint64_t fakecuda_device_used(int dev);

/* Host waits (cuCtxSynchronize, cuStreamSynchronize, cuEventSynchronize)
 * made by the calling thread so far: whether a call blocked the thread that
 * made it, whatever other threads did meanwhile. */
uint64_t fakecuda_thread_waits(void);

/* Allocations (pool or plain) the calling thread has made at the driver. */
uint64_t fakecuda_thread_allocs(void);

/* Events the calling thread has recorded on a legacy stream: a free's own
 * mark, apart from those the shim's thread records meanwhile. */
uint64_t fakecuda_thread_legacy_records(void);

/* The program got the block starting at p from an allocator above the driver
 * (the shim's cache of freed blocks): the driver saw no free and no new
 * allocation. As at a reuse by the pool, work of the new owner that is not
 * ordered after the work that used the block before, and that the host has
 * not synchronized with, counts as unordered_uses. Returns 1 if p is the
 * start of a live allocation, else 0 (nothing done). */
int fakecuda_handed_out(const void *p);

/* 1 if the host has synchronized with all work that used the block
 * containing p (its owners' since the driver allocated it), else 0 (also
 * when p is not in a live allocation). */
int fakecuda_block_idle(const void *p);

/* Text of the last problem the double noticed (an unordered free, a stale
 * handle, an invalid free...), "" if none. Cleared by reading. */
const char *fakecuda_last_problem(void);

/* Internal, for the fake runtime only. */
int fakecuda__unsafe_call(int *in_capture);
int fakecuda__work(const void *stream, const void *p);
int fakecuda__current_device(void);

#ifdef __cplusplus
}
#endif
#endif
