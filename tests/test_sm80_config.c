/*
 * The CUDA sm80 path's configuration choice (backends/cuda/sm80/config.h), a pure function of the
 * head dim and the device's shared memory per block, checked on the CPU at the sizes of the GPUs
 * the path targets: H200 / H100 (227 KiB per block), A100 (163 KiB), sm_86/89 (99 KiB), and a
 * device with less (48 KiB). What each must run is the table in config.h; every chosen
 * configuration must also fit.
 */
#include "backends/cuda/sm80/config.h"
#include "tests/test_util.h"

#include <stdio.h>

#define KIB 1024u

typedef struct expect {
    unsigned kib;
    int d, pingpong;
    fp_sm80_choice want;
} expect;

static const expect table[] = {
    /* H200 */
    {227, 64, 0, {64, FP_FWD_D64, 0, 0}},
    {227, 64, 1, {64, FP_FWD_D64_PINGPONG, 0, 0}},
    {227, 40, 0, {64, FP_FWD_D64, 0, 0}},
    {227, 128, 0, {128, FP_FWD_D128, 0, 0}},
    {227, 72, 1, {128, FP_FWD_D128, 0, 0}},
    {227, 256, 0, {256, FP_FWD_D256_TWO_PER_SM, 0, 0}},
    {227, 160, 0, {256, FP_FWD_D256_TWO_PER_SM, 0, 0}},
    /* A100 */
    {163, 64, 1, {64, FP_FWD_D64_PINGPONG, 1, 0}},
    {163, 128, 0, {128, FP_FWD_D128, 0, 0}},
    {163, 256, 0, {256, FP_FWD_D256_TWO_STAGE, 1, 0}},
    /* sm_86 / sm_89 */
    {99, 64, 0, {64, FP_FWD_D64, 2, 0}},
    {99, 64, 1, {64, FP_FWD_D64_PINGPONG, 2, 0}},
    {99, 128, 0, {128, FP_FWD_D128, 1, 0}},
    {99, 256, 0, {256, FP_FWD_D256_BN32, 2, 1}},
    /* a device with 48 KiB: the forward at D <= 128 still runs (its launch asks the device and
     * fails with a device error), D = 256 and every backward are refused up front */
    {48, 64, 1, {64, FP_FWD_D64, -1, 0}},
    {48, 256, 0, {256, -1, -1, -1}},
};

static size_t fwd_smem(int dk, int alt)
{
    if (dk == 64)
        return alt == FP_FWD_D64_PINGPONG ? FP_FWD_SMEM_D64_PINGPONG : FP_FWD_SMEM_D64;
    if (dk == 128)
        return FP_FWD_SMEM_D128;
    return alt == FP_FWD_D256_TWO_PER_SM  ? 2 * (size_t)FP_FWD_SMEM_D256_TWO_PER_SM
           : alt == FP_FWD_D256_TWO_STAGE ? FP_FWD_SMEM_D256_TWO_STAGE
                                          : FP_FWD_SMEM_D256_BN32;
}

int main(void)
{
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const expect *e = &table[i];
        const size_t smem = (size_t)e->kib * KIB;
        const fp_sm80_choice c = fp_sm80_pick(e->d, smem, e->pingpong);
        CHECK_MSG(c.dk == e->want.dk && c.fwd == e->want.fwd && c.dkdv == e->want.dkdv &&
                      c.dq == e->want.dq,
                  "%u KiB, D = %d%s: got (%d, fwd %d, dkdv %d, dq %d), want (%d, %d, %d, %d)",
                  e->kib, e->d, e->pingpong ? ", ping-pong" : "", c.dk, c.fwd, c.dkdv, c.dq,
                  e->want.dk, e->want.fwd, e->want.dkdv, e->want.dq);
        const int k = c.dk == 64 ? 0 : c.dk == 128 ? 1 : 2;
        if (c.dk == 256 && c.fwd >= 0)
            CHECK_MSG(fwd_smem(c.dk, c.fwd) <= smem, "%u KiB, D = %d: forward does not fit", e->kib,
                      e->d);
        if (c.dkdv >= 0)
            CHECK_MSG(fp_sm80_dkdv_smem_bytes[k][c.dkdv] <= smem &&
                          fp_sm80_dq_smem_bytes[k][c.dq] <= smem,
                      "%u KiB, D = %d: backward does not fit", e->kib, e->d);
    }
    /* Out of range head dims choose nothing. */
    CHECK(fp_sm80_pick(0, 227 * KIB, 0).dk == 0 && fp_sm80_pick(264, 227 * KIB, 0).fwd == -1);
    return tu_finish("test_sm80_config", "all checks passed");
}
