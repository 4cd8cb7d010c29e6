/*
 * The sm90 path in the CUDA emulator (docs/cuda_emu.md) with FP_CUDA_EMU_SM90=0: what run_emu.sh
 * builds in place of sm90/fwd.cu, sm90/bwd.cu and sm90/inst/*.cu, so that every call takes the
 * sm80 path (and the fp8 cases are unsupported), as before the emulator modeled TMA, mbarriers
 * and wgmma. With FP_CUDA_EMU_SM90=1 (run_emu.sh's default) the real sm90 sources are built.
 */
#include "backends/cuda/cuda_internal.h"

static flashport_status fp_sm90_emu_decline(const char **declined, size_t *query)
{
    if (query)
        *query = 0;
    *declined = "the CUDA emulator was built without the sm90 path (FP_CUDA_EMU_SM90=0)";
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
