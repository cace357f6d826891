/* Minimal stand-in for CUDA's crt/host_defines.h, which the pinned
 * nvidia-cuda-runtime wheel does not ship (it comes with the compiler). It is
 * only reached through -idirafter, so a real one always wins. It defines what
 * cuda_runtime_api.h and the headers it includes need for a plain host C/C++
 * compiler (gcc/clang): CUDA's function-space and builtin markers expand to
 * nothing, default arguments only exist in C++. */
#ifndef FAKECUDA_COMPAT_HOST_DEFINES_H
#define FAKECUDA_COMPAT_HOST_DEFINES_H
#if defined(__CUDACC__)
#error "compat crt/host_defines.h is for host compilers only"
#endif
#define __no_return__ __attribute__((noreturn))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a) __attribute__((a))
#define __location__(a) __annotate__(a)
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define CUDART_CB
#define __specialization_static
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __grid_constant__
#define __cudart_builtin__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __builtin_align__(a) __align__(a)
#define __CUDA_DEPRECATED __attribute__((deprecated))
#if defined(__cplusplus)
#define __dv(v) = v
#else
#define __dv(v)
#endif
#endif
