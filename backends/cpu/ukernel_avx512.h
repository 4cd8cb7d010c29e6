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
static inline float uk_hsum(uk_vec x)
{
    return _mm512_reduce_add_ps(x);
}
static inline uk_vec uk_load_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

/* 2^x for x <= 127 or NaN (uk_exp2 clamps first). */
static inline __attribute__((always_inline)) uk_vec avx512_exp2_upto127(__m512 x)
{
    /* NLT_UQ keeps NaN lanes (NaN in, NaN out). */
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
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

static inline uk_vec uk_exp2(uk_vec x)
{
    /* min(127, x) passes NaN through. */
    return avx512_exp2_upto127(_mm512_min_ps(_mm512_set1_ps(127.0f), x));
}

/* For x <= 0 or NaN (ukernel_ops.h's softmax_cols): the clamp is a no-op there, one operation of
 * 15 per vector less. */
#define UK_HAS_EXP2_LE0 1
static inline uk_vec uk_exp2_le0(uk_vec x)
{
    return avx512_exp2_upto127(x);
}

/* transpose32 by 16 x 16 blocks: 16 masked row loads, the usual four shuffle stages (32-bit,
 * 64-bit and two 128-bit lane interleaves), 16 masked column stores. Masks keep the edge blocks
 * from reading or writing outside the rows x cols words. */
static void avx512_transpose32(int rows, int cols, const void *src, ptrdiff_t lds, uint32_t *dst,
                               ptrdiff_t ldd)
{
    const unsigned char *s = src;
    for (int r0 = 0; r0 < rows; r0 += 16)
        for (int c0 = 0; c0 < cols; c0 += 16) {
            const int nr = rows - r0 < 16 ? rows - r0 : 16, nc = cols - c0 < 16 ? cols - c0 : 16;
            const __mmask16 cm = (__mmask16)(nc == 16 ? 0xffffu : (1u << nc) - 1u);
            const __mmask16 rm = (__mmask16)(nr == 16 ? 0xffffu : (1u << nr) - 1u);
            __m512i a[16], b[16];
            for (int r = 0; r < 16; r++)
                a[r] = r < nr ? _mm512_maskz_loadu_epi32(cm, s + (r0 + r) * lds + 4 * c0)
                              : _mm512_setzero_si512();
            for (int r = 0; r < 16; r += 2) {
                b[r] = _mm512_unpacklo_epi32(a[r], a[r + 1]);
                b[r + 1] = _mm512_unpackhi_epi32(a[r], a[r + 1]);
            }
            for (int r = 0; r < 16; r += 4) {
                a[r] = _mm512_unpacklo_epi64(b[r], b[r + 2]);
                a[r + 1] = _mm512_unpackhi_epi64(b[r], b[r + 2]);
                a[r + 2] = _mm512_unpacklo_epi64(b[r + 1], b[r + 3]);
                a[r + 3] = _mm512_unpackhi_epi64(b[r + 1], b[r + 3]);
            }
            /* Now 128-bit lane l of a[4q + k] holds column 4 l + k of rows 4q .. 4q + 3; column
             * 4 l + k of the block is lane l of a[k], a[4 + k], a[8 + k], a[12 + k]. */
            for (int k = 0; k < 4; k++) {
                const __m512i t0 = _mm512_shuffle_i32x4(a[k], a[4 + k], 0x88);
                const __m512i t1 = _mm512_shuffle_i32x4(a[k], a[4 + k], 0xdd);
                const __m512i t2 = _mm512_shuffle_i32x4(a[8 + k], a[12 + k], 0x88);
                const __m512i t3 = _mm512_shuffle_i32x4(a[8 + k], a[12 + k], 0xdd);
                b[k] = _mm512_shuffle_i32x4(t0, t2, 0x88);
                b[k + 8] = _mm512_shuffle_i32x4(t0, t2, 0xdd);
                b[k + 4] = _mm512_shuffle_i32x4(t1, t3, 0x88);
                b[k + 12] = _mm512_shuffle_i32x4(t1, t3, 0xdd);
            }
            for (int c = 0; c < nc; c++)
                _mm512_mask_storeu_epi32(dst + (c0 + c) * ldd + r0, rm, b[c]);
        }
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

/* f32 -> bf16 as core/dtype.h: add 0x7fff plus the lowest kept bit and truncate (integer
 * arithmetic: vcvtneps2bf16 would flush denormals), NaN -> its top half with the quiet bit. */
static inline __m256i avx512_bf16_of(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* f32 -> f16 as core/dtype.h: vcvtps2ph rounds to nearest even with IEEE denormals and
 * overflow; NaN lanes are replaced by core/dtype.h's sign | 0x7e00. */
static inline __m256i avx512_f16_of(__m512 x)
{
    __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m256i sign =
        _mm256_and_si256(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)),
                         _mm256_set1_epi16((short)0x8000));
    return _mm256_mask_blend_epi16(nan, h, _mm256_or_si256(sign, _mm256_set1_epi16(0x7e00)));
}

static void avx512_store_bf16(int n, const float *src, float scale, uint16_t *dst)
{
    const __m512 s = _mm512_set1_ps(scale);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1u);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), s);
        _mm256_mask_storeu_epi16(dst + i, m, avx512_bf16_of(x));
    }
}

static void avx512_store_f16(int n, const float *src, float scale, uint16_t *dst)
{
    const __m512 s = _mm512_set1_ps(scale);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1u);
        const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), s);
        _mm256_mask_storeu_epi16(dst + i, m, avx512_f16_of(x));
    }
}

#endif /* FLASHPORT_BACKENDS_CPU_UKERNEL_AVX512_H */
