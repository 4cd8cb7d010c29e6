/*
 * The sm90 backward's launcher: which problems the sm90 path declines (fp_cuda_sm90_backward sets
 * *declined and the caller takes the sm80 path) and the head dim's family (fp_sm90_bwd_family,
 * sm90/bwd_config.cuh) launched for the others.
 *
 * The kernel is in sm90/bwd.cuh (algorithm, configurations, differences from the
 * reference), and each head dim's family, f16 and bf16, is instantiated by a small file of its
 * own (sm90/inst/bwd_d64.cu, bwd_d128.cu, bwd_d256.cu). This file sees only the families'
 * declarations, so that it and each instantiation file compile alone too (FLASHPORT_CUDA_UNITY=OFF,
 * backends/cuda/CMakeLists.txt).
 */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/dispatch.cuh"
#include "backends/cuda/sm90/bwd_config.cuh"

#include "core/problem.h"

#include <stdlib.h>
#include <string.h>

/* Head dims 129 .. 256 take the sm90 kernel (sm90/bwd256.cuh) unless
 * FLASHPORT_CUDA_SM90_BWD256=0 sends them to the sm80 backward (to compare the two, or to step
 * around a fault in the sm90 kernel). */
static bool fp_sm90_bwd256_enabled()
{
    const char *v = getenv("FLASHPORT_CUDA_SM90_BWD256");
    return !(v && strcmp(v, "0") == 0);
}

extern "C" flashport_status fp_cuda_sm90_backward(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                  const char *why, const char **declined, void *ws,
                                                  size_t *query)
{
    *declined = NULL;
    if (query)
        *query = 0;
    if (ctx->cc_major != 9 || ctx->cc_minor != 0)
        *declined = "the sm90 path needs compute capability 9.0";
    else if (!ctx->encode_tiled)
        *declined = "the driver has no cuTensorMapEncodeTiled";
    else if (p->seqused_k)
        *declined = "the sm90 path does not read seqused_k";
    else if (p->head_dim > 128 && !fp_sm90_bwd256_enabled())
        *declined = "FLASHPORT_CUDA_SM90_BWD256=0 sends head dims above 128 to the sm80 backward";
    else if (ctx->smem_optin < fp_sm90_bwd_cfg<128>::SMEM ||
             ctx->smem_optin < fp_sm90_bwd_cfg<64>::SMEM ||
             (p->head_dim > 128 && ctx->smem_optin < fp_sm90_bwd256_cfg::SMEM))
        *declined = "the sm90 kernels need more shared memory per block than this device allows";
    if (*declined)
        return FLASHPORT_OK;
    return fp_cuda_dispatch<FP_SM90_BWD_DK_CLASSES>(p->dtype, p->head_dim, [&](auto k) {
        using K = decltype(k);
        return fp_sm90_bwd_family<typename K::T, K::DK>::run(ctx, p, why, declined, ws, query);
    });
}
