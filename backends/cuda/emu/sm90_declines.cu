/*
 * The sm90 path in the CUDA emulator (docs/cuda_emu.md): the emulator has no TMA, mbarrier or
 * wgmma, so run_emu.sh builds this file in place of the sm90 launchers and kernels (sm90/fwd.cu,
 * sm90/bwd.cu and their inst/ files), and the path declines every call (cudaemu runs the sm80
 * kernels for them).
 */
#include "backends/cuda/cuda_internal.h"

static flashport_status fp_sm90_emu_decline(const char **declined, size_t *query)
{
    if (query)
        *query = 0;
    *declined = "the CUDA emulator has no TMA or wgmma";
    return FLASHPORT_OK;
}

extern "C" void fp_cuda_sm90_init(fp_cuda_ctx *ctx)
{
    ctx->encode_tiled = NULL;
}

extern "C" flashport_status fp_cuda_sm90_forward(const fp_cuda_ctx *, const fp_problem *,
                                                 const char *, const char **declined, void *,
                                                 size_t *query)
{
    return fp_sm90_emu_decline(declined, query);
}

extern "C" flashport_status fp_cuda_sm90_backward(const fp_cuda_ctx *, const fp_problem *,
                                                  const char *, const char **declined, void *,
                                                  size_t *query)
{
    return fp_sm90_emu_decline(declined, query);
}
