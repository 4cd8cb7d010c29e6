/*
 * The generic path's kernels: attention_tile.h over mma_generic.h (f32 FMAs from LDS, no matrix
 * instructions, any wave size). Built for every target of FLASHPORT_HIP_ARCHITECTURES (gfx908,
 * gfx90a, gfx940, gfx1030 by default) and, through hip_to_cuda.h, for NVIDIA GPUs in the
 * FLASHPORT_HIP_SHIM build, where tests/test_backends.c checks it against the CPU reference.
 * It is what RDNA and gfx908 run, and what CDNA runs when FLASHPORT_HIP_KERNEL=generic.
 * Speed on AMD hardware: not measured (no AMD GPU available).
 */
#include "backends/hip/mma_generic.h"

fp_hip_kernel_fn fp_hip_fwd_kernel_generic(flashport_dtype dtype, int dmax)
{
    return fp_hip_kernels<fp_hip_mma_generic>(dtype, dmax).fwd;
}

fp_hip_bwd_kernels fp_hip_bwd_kernels_generic(flashport_dtype dtype, int dmax)
{
    return fp_hip_kernels<fp_hip_mma_generic>(dtype, dmax).bwd;
}
