/*
 * Host-side dispatch from run-time choices to kernel template instances, shared by the CUDA
 * paths' launchers: the problem's dtype and head dim to the (element type, head-dim class) a
 * kernel family is instantiated for, and a configuration index (an ALT of sm80/config.h) to a
 * compile-time constant. Each call instantiates its callable once per listed value, so the set
 * of kernels a launcher builds is the list it names.
 */
#ifndef FLASHPORT_BACKENDS_CUDA_DISPATCH_CUH
#define FLASHPORT_BACKENDS_CUDA_DISPATCH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "flashport.h"

/* What one kernel instance is built for: K::T, the element type (__half or __nv_bfloat16), and
 * K::DK, the kernel's head dim (problems of smaller head dims run on it too). */
template <typename T_, int DK_> struct fp_kernel_class {
    typedef T_ T;
    enum { DK = DK_ };
};

/* A compile-time integer passed as a value: decltype(i)::value. */
template <int V> struct fp_const_int {
    enum { value = V };
};

/* f(fp_kernel_class<T, DK>()) for DK the first of the ascending DK0, DKS... that holds head_dim,
 * the last where none does (callers decline larger head dims first). */
template <typename T, int DK0, int... DKS, typename F>
static inline auto fp_cuda_with_head_dim(int64_t head_dim, F &f)
{
    if constexpr (sizeof...(DKS) == 0)
        return f(fp_kernel_class<T, DK0>());
    else
        return head_dim <= DK0 ? f(fp_kernel_class<T, DK0>())
                               : fp_cuda_with_head_dim<T, DKS...>(head_dim, f);
}

/* The launcher of a kernel family with head-dim classes DKS... (ascending), for a problem of
 * `dtype` (FLASHPORT_F16, else bf16) and `head_dim`: returns f(fp_kernel_class<T, DK>()). */
template <int... DKS, typename F>
static inline auto fp_cuda_dispatch(flashport_dtype dtype, int64_t head_dim, F &&f)
{
    if (dtype == FLASHPORT_F16)
        return fp_cuda_with_head_dim<__half, DKS...>(head_dim, f);
    return fp_cuda_with_head_dim<__nv_bfloat16, DKS...>(head_dim, f);
}

/* f(fp_const_int<I>()) for I = i, a configuration index of 0 .. N - 1 (one of these: callers
 * refuse "none fits", -1, first; a larger i gets N - 1). */
template <int N, int I = 0, typename F> static inline auto fp_cuda_with_index(int i, F &&f)
{
    if constexpr (I + 1 >= N)
        return f(fp_const_int<I>());
    else
        return i <= I ? f(fp_const_int<I>()) : fp_cuda_with_index<N, I + 1>(i, f);
}

#endif /* FLASHPORT_BACKENDS_CUDA_DISPATCH_CUH */
