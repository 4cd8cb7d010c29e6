/*
 * The kernels both paths share and that do no tile matmul (attention_tile.h): the split-KV
 * combine (merges the f32 partials of each split with core's fp_softmax_merge and writes O and
 * LSE) and the backward's preprocessing (delta = rowsum(dO * O)). One thread per output column
 * (combine) or per row (preprocessing). Every target; the shim build runs them on NVIDIA GPUs.
 */
#include "backends/hip/attention_tile.h"

template <class T> __global__ __launch_bounds__(FP_HIP_THREADS) void fp_hip_combine(fp_hip_args a)
{
    fp_hip_combine_rows<T>(a);
}

template <class T> __global__ __launch_bounds__(FP_HIP_THREADS) void fp_hip_bwd_prep(fp_hip_args a)
{
    fp_hip_bwd_prep_rows<T>(a);
}

fp_hip_kernel_fn fp_hip_combine_kernel(flashport_dtype dtype)
{
    if (dtype == FLASHPORT_F16)
        return fp_hip_combine<fp_hip_f16>;
    if (dtype == FLASHPORT_BF16)
        return fp_hip_combine<fp_hip_bf16>;
    return NULL;
}

fp_hip_kernel_fn fp_hip_bwd_prep_kernel(flashport_dtype dtype)
{
    if (dtype == FLASHPORT_F16)
        return fp_hip_bwd_prep<fp_hip_f16>;
    if (dtype == FLASHPORT_BF16)
        return fp_hip_bwd_prep<fp_hip_bf16>;
    return NULL;
}
