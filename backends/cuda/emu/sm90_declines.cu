/*
 * The sm90 path in the CUDA emulator (docs/cuda_emu.md): what run_emu.sh builds in place of the
 * sm90 sources it does not emulate. The emulator models TMA, mbarriers, wgmma and the rest of
 * what the sm90 backward uses, so with FP_CUDA_EMU_SM90_BWD (run_emu.sh's default) the backward
 * is the real one (sm90/bwd.cu and sm90/inst/bwd_*.cu) and this file stands in for
 * sm90/fwd.cu and sm90/inst/fwd_*.cu only: fp_cuda_sm90_init looks up cuTensorMapEncodeTiled as
 * that file does (the emulator answers with its own encoder), and the forward declines every call
 * (cudaemu runs the sm80 forward). Without the macro the backward declines too.
 */
#include "backends/cuda/cuda_internal.h"

static flashport_status fp_sm90_emu_decline(const char **declined, size_t *query)
{
    if (query)
        *query = 0;
    *declined = "the CUDA emulator does not build the sm90 forward";
    return FLASHPORT_OK;
}

extern "C" void fp_cuda_sm90_init(fp_cuda_ctx *ctx)
{
#ifdef FP_CUDA_EMU_SM90_BWD
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        fn = NULL;
    ctx->encode_tiled = fn;
#else
    ctx->encode_tiled = NULL;
#endif
}

extern "C" flashport_status fp_cuda_sm90_forward(const fp_cuda_ctx *, const fp_problem *,
                                                 const char *, const char **declined, void *,
                                                 size_t *query)
{
    return fp_sm90_emu_decline(declined, query);
}

#ifndef FP_CUDA_EMU_SM90_BWD
extern "C" flashport_status fp_cuda_sm90_backward(const fp_cuda_ctx *, const fp_problem *,
                                                  const char *, const char **declined, void *,
                                                  size_t *query)
{
    return fp_sm90_emu_decline(declined, query);
}
#endif
