/*
 * AArch64 Advanced SIMD micro-kernels (contract in ukernel.h): FLASHPORT_CPU_ISA=neon; the
 * default on AArch64, where NEON is part of the base architecture.
 *
 * Products: ukernel_gemm.h with a 6 x 16 register block on 128-bit registers: 24 accumulators,
 * 4 B vectors and a broadcast (ld1r) fit the 32 registers. exp2: frintn to nearest, the shared
 * polynomial (ukernel.h), 2^n built in the exponent field (n clamped to [-126, 127], lanes below
 * -126 zeroed). f16 storage converts with fcvtl, bf16 by shifting into the high half.
 * Target: AArch64 (no extra flags). Compiled and run in CI through a cross compiler and
 * qemu-aarch64 (backends/cpu/cross_check.sh); not timed on real hardware.
 * Known differences from the reference: f32 accumulation with FMA; the polynomial exp2.
 */
#include "backends/cpu/ukernel.h"

#include <arm_neon.h>

typedef float32x4_t uk_vec;
#define UK_LANES 4
#define UK_MR    6
#define UK_NV    4

static inline uk_vec uk_zero(void)
{
    return vdupq_n_f32(0.0f);
}
static inline uk_vec uk_set1(float x)
{
    return vdupq_n_f32(x);
}
static inline uk_vec uk_load(const float *p)
{
    return vld1q_f32(p);
}
static inline void uk_store(float *p, uk_vec v)
{
    vst1q_f32(p, v);
}
static inline uk_vec uk_add(uk_vec a, uk_vec b)
{
    return vaddq_f32(a, b);
}
static inline uk_vec uk_sub(uk_vec a, uk_vec b)
{
    return vsubq_f32(a, b);
}
static inline uk_vec uk_mul(uk_vec a, uk_vec b)
{
    return vmulq_f32(a, b);
}
static inline uk_vec uk_madd(uk_vec a, uk_vec b, uk_vec c)
{
    return vfmaq_f32(c, a, b);
}
static inline uk_vec uk_max(uk_vec a, uk_vec b)
{
    return vmaxq_f32(a, b);
}
static inline float uk_hsum(uk_vec x)
{
    return vaddvq_f32(x);
}
static inline uk_vec uk_load_f16(const uint16_t *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static inline uk_vec uk_exp2(uk_vec x)
{
    /* NOT(x < -126) keeps NaN lanes (NaN in, NaN out). */
    const uint32x4_t keep = vmvnq_u32(vcltq_f32(x, vdupq_n_f32(-126.0f)));
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-126.0f)), vdupq_n_f32(127.0f));
    const float32x4_t n = vrndnq_f32(x);
    const float32x4_t f = vsubq_f32(x, n);
    float32x4_t p = vdupq_n_f32(FP_EXP2_C6);
    p = vfmaq_f32(vdupq_n_f32(FP_EXP2_C5), p, f);
    p = vfmaq_f32(vdupq_n_f32(FP_EXP2_C4), p, f);
    p = vfmaq_f32(vdupq_n_f32(FP_EXP2_C3), p, f);
    p = vfmaq_f32(vdupq_n_f32(FP_EXP2_C2), p, f);
    p = vfmaq_f32(vdupq_n_f32(FP_EXP2_C1), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(y)));
}

#include "backends/cpu/ukernel_ops.h"

static void cvt_f16(int n, const uint16_t *src, float *dst)
{
    int i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
    for (; i < n; i++)
        dst[i] = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_dup_u16(src + i))), 0);
}

static void cvt_bf16(int n, const uint16_t *src, float *dst)
{
    int i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(src + i), 16)));
    for (; i < n; i++)
        dst[i] = vgetq_lane_f32(vreinterpretq_f32_u32(vshll_n_u16(vld1_dup_u16(src + i), 16)), 0);
}

const fp_ukernels fp_ukernels_neon = {
    "neon",
    "AArch64 NEON f32 FMA, 6x16 register block",
    uk_gemm,
    NULL,
    uk_col_max,
    uk_exp2_cols,
    NULL,
    NULL,
    NULL,
    uk_dsoftmax_cols,
    uk_scale_rows,
    uk_transpose32_generic,
    cvt_f16,
    cvt_bf16,
    uk_store_f16_generic,
    uk_store_bf16_generic,
    uk_dec_scores,
    uk_dec_pv,
    NULL,
    NULL,
    uk_dec_scores_f16,
    uk_dec_pv_f16,
    NULL,
    NULL,
    NULL,
    NULL,
    0,
    0,
    0,
    uk_gemm_rs,
    uk_softmax_cols,
};
