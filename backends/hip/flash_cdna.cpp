/*
 * The CDNA path's kernels: attention_tile.h over mma_cdna.h (MFMA 16x16x16, f16 and bf16_1k,
 * wave64, f32 accumulate). Built only for the gfx90a/gfx94x targets of FLASHPORT_HIP_ARCHITECTURES;
 * the host launches them on those devices unless FLASHPORT_HIP_KERNEL=generic.
 * Not run on hardware (no AMD GPU available): compiled in CI, and backends/hip/check_mfma.sh
 * checks that the code objects' attention kernels contain v_mfma instructions.
 */
#include "backends/hip/mma_cdna.h"

fp_hip_kernel_fn fp_hip_fwd_kernel_cdna(flashport_dtype dtype, int dmax)
{
    return fp_hip_kernels<fp_hip_mma_cdna>(dtype, dmax).fwd;
}

fp_hip_bwd_kernels fp_hip_bwd_kernels_cdna(flashport_dtype dtype, int dmax)
{
    return fp_hip_kernels<fp_hip_mma_cdna>(dtype, dmax).bwd;
}
