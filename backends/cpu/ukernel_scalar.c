/*
 * Portable micro-kernels (contract in ukernel.h): the table every build has and every CPU runs;
 * FLASHPORT_CPU_ISA=scalar selects it on any machine.
 *
 * Plain C with GCC/Clang generic 4-float vectors (no intrinsics: SSE2 on baseline x86-64, NEON on
 * AArch64, plain registers elsewhere). Products: ukernel_gemm.h with a 6 x 8 register block
 * (12 accumulators of 4 floats fit 16 SSE registers). Multiply and add are separate roundings
 * here (the x86-64 baseline has no FMA), so this table's results differ in the last bits from
 * the FMA tables'. exp2: the shared polynomial (ukernel.h), lane by lane, with the exponent built
 * from the bits of a round-to-nearest done by adding 1.5 * 2^23.
 * Target: any C11 compiler with GNU vector extensions; the fallback and the reference path for
 * the ISA tables; about a fifth of the FMA peak where the vector tables reach most of it
 * (docs/bench/cpu.md, "scalar").
 */
#include "backends/cpu/ukernel.h"

#include "core/dtype.h"

#include <string.h>

typedef float uk_vec __attribute__((vector_size(16)));
#define UK_LANES 4
#define UK_MR    6
#define UK_NV    2

static inline uk_vec uk_zero(void)
{
    return (uk_vec){0.0f, 0.0f, 0.0f, 0.0f};
}
static inline uk_vec uk_set1(float x)
{
    return (uk_vec){x, x, x, x};
}
static inline uk_vec uk_load(const float *p)
{
    uk_vec v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void uk_store(float *p, uk_vec v)
{
    memcpy(p, &v, sizeof v);
}
static inline uk_vec uk_add(uk_vec a, uk_vec b)
{
    return a + b;
}
static inline uk_vec uk_sub(uk_vec a, uk_vec b)
{
    return a - b;
}
static inline uk_vec uk_mul(uk_vec a, uk_vec b)
{
    return a * b;
}
static inline uk_vec uk_madd(uk_vec a, uk_vec b, uk_vec c)
{
    return a * b + c;
}
static inline uk_vec uk_max(uk_vec a, uk_vec b)
{
    uk_vec r = a;
    for (int i = 0; i < UK_LANES; i++)
        r[i] = b[i] > a[i] ? b[i] : a[i];
    return r;
}
static inline float uk_hsum(uk_vec x)
{
    return (x[0] + x[1]) + (x[2] + x[3]);
}
static inline uk_vec uk_load_f16(const uint16_t *p)
{
    uk_vec r;
    for (int i = 0; i < UK_LANES; i++)
        r[i] = fp_f16_to_f32(p[i]);
    return r;
}

static inline uk_vec uk_load_bf16(const uint16_t *p)
{
    uk_vec r;
    for (int i = 0; i < UK_LANES; i++)
        r[i] = fp_bf16_to_f32(p[i]);
    return r;
}
#define UK_HAS_LOAD_BF16 1

/* 2^x per the contract: 0 below -126 (and for -inf), NaN stays NaN. */
static inline float exp2_lane(float x)
{
    if (x < -126.0f)
        return 0.0f;
    x = x > 127.0f ? 127.0f : x;
    const float t = x + 0x1.8p23f; /* round to nearest even: the integer lands in the low bits */
    const float f = x - (t - 0x1.8p23f);
    float p = FP_EXP2_C6;
    p = p * f + FP_EXP2_C5;
    p = p * f + FP_EXP2_C4;
    p = p * f + FP_EXP2_C3;
    p = p * f + FP_EXP2_C2;
    p = p * f + FP_EXP2_C1;
    p = p * f + 1.0f;
    /* t's bits are those of 1.5 * 2^23 plus the integer: move it into the exponent field. */
    return p * fp_bits_f32((fp_f32_bits(t) - 0x4b400000u + 127u) << 23);
}

static inline uk_vec uk_exp2(uk_vec x)
{
    uk_vec r = x;
    for (int i = 0; i < UK_LANES; i++)
        r[i] = exp2_lane(x[i]);
    return r;
}

#include "backends/cpu/ukernel_ops.h"

static void cvt_f16(int n, const uint16_t *src, float *dst)
{
    for (int i = 0; i < n; i++)
        dst[i] = fp_f16_to_f32(src[i]);
}

static void cvt_bf16(int n, const uint16_t *src, float *dst)
{
    for (int i = 0; i < n; i++)
        dst[i] = fp_bf16_to_f32(src[i]);
}

const fp_ukernels fp_ukernels_scalar = {
    "scalar",
    "portable C, 4-float generic vectors, 6x8 register block, no FMA",
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
    uk_dec_scores_bf16_f32,
    uk_dec_pv_bf16_f32,
    NULL,
    NULL,
    0,
    0,
    0,
    uk_gemm_rs,
    uk_softmax_cols,
};
