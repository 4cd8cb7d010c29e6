/*
 * AVX-512 vector primitives of the micro-kernels (the interface ukernel_ops.h expects), shared by
 * ukernel_avx512.c and ukernel_avx512bf16.c. Only for files compiled with AVX-512 F/BW/VL target
 * flags (CMakeLists.txt), and only run after isa.c has checked the CPU.
 *
 * Register block 6 x 4 zmm: 24 accumulators (6 rows x 64 columns) plus 4 B vectors leave 4 of
 * the 32 registers for broadcasts; per reduction step 4 vector loads and 6 broadcast loads feed
 * 24 FMAs, well inside the two load ports while the FMA pipes stay busy. 64 columns is the query
 * block of the flash kernels, so S^T = K Q^T is one column block per key row block.
 * exp2: round to nearest with vrndscaleps, the shared polynomial (ukernel.h) on the fraction,
 * vscalefps for 2^n (exact, handles every n), then a mask zeroes x < -126 (and -inf).
 */
#ifndef FLASHPORT_BACKENDS_CPU_UKERNEL_AVX512_H
#define FLASHPORT_BACKENDS_CPU_UKERNEL_AVX512_H

#include "backends/cpu/ukernel.h"

#include <immintrin.h>

typedef __m512 uk_vec;
#define UK_LANES 16
#define UK_MR    6
#define UK_NV    4

static inline uk_vec uk_zero(void)
{
    return _mm512_setzero_ps();
}
static inline uk_vec uk_set1(float x)
{
    return _mm512_set1_ps(x);
}
static inline uk_vec uk_load(const float *p)
{
    return _mm512_loadu_ps(p);
}
static inline void uk_store(float *p, uk_vec v)
{
    _mm512_storeu_ps(p, v);
}
static inline uk_vec uk_add(uk_vec a, uk_vec b)
{
    return _mm512_add_ps(a, b);
}
static inline uk_vec uk_sub(uk_vec a, uk_vec b)
{
    return _mm512_sub_ps(a, b);
}
static inline uk_vec uk_mul(uk_vec a, uk_vec b)
{
    return _mm512_mul_ps(a, b);
}
static inline uk_vec uk_madd(uk_vec a, uk_vec b, uk_vec c)
{
    return _mm512_fmadd_ps(a, b, c);
}
static inline uk_vec uk_max(uk_vec a, uk_vec b)
{
    return _mm512_max_ps(a, b);
}

static inline uk_vec uk_exp2(uk_vec x)
{
    /* NLT_UQ keeps NaN lanes (NaN in, NaN out); min(127, x) also passes NaN through. */
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    x = _mm512_min_ps(_mm512_set1_ps(127.0f), x);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(FP_EXP2_C6);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(FP_EXP2_C5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(FP_EXP2_C4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(FP_EXP2_C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(FP_EXP2_C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(FP_EXP2_C1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

/* 16-bit storage to f32: f16 by vcvtph2ps, bf16 by moving the bits into the high half. The tail
 * goes through masked loads and stores, so nothing past n is touched. */
static inline __m512 avx512_f16x16(__m256i h)
{
    return _mm512_cvtph_ps(h);
}
static inline __m512 avx512_bf16x16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void avx512_cvt_f16(int n, const uint16_t *src, float *dst)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, avx512_f16x16(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, avx512_f16x16(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

static void avx512_cvt_bf16(int n, const uint16_t *src, float *dst)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, avx512_bf16x16(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, avx512_bf16x16(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

#endif /* FLASHPORT_BACKENDS_CPU_UKERNEL_AVX512_H */
