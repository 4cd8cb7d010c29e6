/*
 * AVX-512 BF16 micro-kernels (contract in ukernel.h): the AVX-512 f32 table (ukernel_avx512.h,
 * used for f32 and f16 inputs) plus bf16 dot products for bf16 inputs, forward and backward.
 * FLASHPORT_CPU_ISA=avx512bf16; the default where the CPU has AVX512_BF16 (on Intel cores with
 * isa.c's settings, which take the bf16 forward and backward through the f32 products: vdpbf16ps
 * runs there at half the f32 FMA rate).
 *
 * gemm_bf16: ukernel_gemm.h with vdpbf16ps as the multiply-add. A 32-bit broadcast carries a pair
 * of bf16 (two consecutive elements of a row of K in place, two keys of P, two queries of P^T or
 * dS^T, two keys of K^T), the B tile holds 16 pairs per register, and each instruction does 32
 * multiply-adds into 16 f32 accumulators: twice the work of an f32 FMA per instruction, with half
 * the bytes loaded. The bf16 products are exact; each pair sum is rounded into the f32
 * accumulator. It runs all products of the bf16 forward (Q K^T, P V) and backward (the five of
 * flash_bwd.c and Di).
 * exp2_cols_bf16: the f32 exp2 of two key rows, rounded to bf16 by vcvtne2ps2bf16 (nearest even)
 * and interleaved by vpermw into pairs: P enters P V in bf16, as in the GPU kernels (and as the
 * tests' naive bf16 computation does); the row sums use the unrounded values.
 * round_bf16: the backward's f32 P^T and dS^T rounded the same way, two rows per
 * vcvtne2ps2bf16, stored as two bf16 rows and/or interleaved into key pairs.
 * Target: x86-64 with AVX-512 F, BW, VL, BF16 (compiled with those flags alone).
 * Known differences from the reference: every product from bf16 operands with f32
 * accumulation; P (and in the backward dS) rounded to bf16 before the products that use them.
 * vdpbf16ps does two multiply-adds a lane where an FMA does one; whether that makes the bf16
 * path faster than the f32 one depends on the core's vdpbf16ps rate (isa.c: on Intel cores `auto`
 * runs bf16 through the f32 products). Numbers: docs/performance-cpu.md, docs/bench/cpu.md.
 */
#include "backends/cpu/ukernel_avx512.h"

#define UK_OWN_DEC_SCORES_F16
#include "backends/cpu/ukernel_ops.h"

#include "backends/cpu/ukernel_avx512_dec.h"

#include <string.h>

static inline __m512bh bcast_pair(const uint16_t *p)
{
    uint32_t pair;
    memcpy(&pair, p, sizeof pair);
    return (__m512bh)_mm512_set1_epi32((int)pair);
}

#define UK_GEMM               uk_gemm_bf16
#define UK_GEMM_A             uint16_t
#define UK_GEMM_B             uint32_t
#define uk_gemm_avec          __m512bh
#define uk_gemm_bvec          __m512bh
#define uk_gemm_bcast(p)      bcast_pair(p)
#define uk_gemm_loadb(p)      ((__m512bh)_mm512_loadu_si512((const void *)(p)))
#define uk_gemm_madd(c, a, b) _mm512_dpbf16_ps(c, a, b)
#include "backends/cpu/ukernel_gemm.h"

static void uk_exp2_cols_bf16(int rows, int cols, const float *s, ptrdiff_t lds, float mul,
                              const float *sub, float *sum, uint32_t *pairs, ptrdiff_t ldpairs)
{
    /* Word i of the result takes word i / 2 of the low (even row) or high (odd row) half. */
    const __m512i interleave =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512 vmul = _mm512_set1_ps(mul);
    for (int c = 0; c < cols; c += 16) {
        const __m512 vsub = _mm512_loadu_ps(sub + c);
        __m512 acc = _mm512_setzero_ps();
        for (int r = 0; r < rows; r += 2) {
            const __m512 e0 =
                uk_exp2(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + r * lds + c), vmul), vsub));
            acc = _mm512_add_ps(acc, e0);
            __m512 e1 = _mm512_setzero_ps();
            if (r + 1 < rows) {
                e1 = uk_exp2(_mm512_sub_ps(
                    _mm512_mul_ps(_mm512_loadu_ps(s + (r + 1) * lds + c), vmul), vsub));
                acc = _mm512_add_ps(acc, e1);
            }
            const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
            _mm512_storeu_si512((void *)(pairs + (r / 2) * ldpairs + c),
                                _mm512_permutexvar_epi16(interleave, halves));
        }
        if (sum)
            _mm512_storeu_ps(sum + c, _mm512_add_ps(_mm512_loadu_ps(sum + c), acc));
    }
}

static void uk_round_bf16(int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst,
                          ptrdiff_t ldd, uint32_t *pairs, ptrdiff_t ldpairs)
{
    /* Two rows per step: one vcvtne2ps2bf16 rounds both (row r in the low half), whose halves
     * are the two rows of dst and whose vpermw interleave is the row of pairs. The masked loads
     * give the columns from cols on as 0. */
    const __m512i interleave =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int r = 0; r < rows; r += 2) {
        const int two = r + 1 < rows;
        for (int c = 0; c < cols; c += 16) {
            const __mmask16 m = (__mmask16)(cols - c >= 16 ? 0xffffu : (1u << (cols - c)) - 1u);
            const __m512 x0 = _mm512_maskz_loadu_ps(m, src + r * lds + c);
            const __m512 x1 =
                two ? _mm512_maskz_loadu_ps(m, src + (r + 1) * lds + c) : _mm512_setzero_ps();
            const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
            if (dst) {
                _mm256_storeu_si256((__m256i *)(dst + r * ldd + c), _mm512_castsi512_si256(both));
                if (two)
                    _mm256_storeu_si256((__m256i *)(dst + (r + 1) * ldd + c),
                                        _mm512_extracti64x4_epi64(both, 1));
            }
            if (pairs)
                _mm512_storeu_si512((void *)(pairs + (r / 2) * ldpairs + c),
                                    _mm512_permutexvar_epi16(interleave, both));
        }
    }
}

static void uk_interleave_bf16(int n, const uint16_t *even, const uint16_t *odd, uint32_t *dst)
{
    /* Words 0..31 of the result alternate even[i] and odd[i] (index 32 + i selects odd). */
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                        8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int c = 0; c < n; c += 32) {
        const int left = n - c < 32 ? n - c : 32;
        const __mmask32 m = left == 32 ? ~(__mmask32)0 : (__mmask32)((1u << left) - 1u);
        const __m512i e = _mm512_maskz_loadu_epi16(m, even + c);
        const __m512i o = odd ? _mm512_maskz_loadu_epi16(m, odd + c) : _mm512_setzero_si512();
        const __mmask16 m0 = (__mmask16)(left >= 16 ? 0xffffu : (1u << left) - 1u);
        const __mmask16 m1 = (__mmask16)(left >= 32  ? 0xffffu
                                         : left > 16 ? (1u << (left - 16)) - 1u
                                                     : 0u);
        _mm512_mask_storeu_epi32(dst + c, m0, _mm512_permutex2var_epi16(e, lo, o));
        _mm512_mask_storeu_epi32(dst + c + 16, m1, _mm512_permutex2var_epi16(e, hi, o));
    }
}

/* The first `left` of 32 bf16 lanes (none when left <= 0). */
static inline __mmask32 mask32(int left)
{
    return left >= 32 ? ~(__mmask32)0 : left <= 0 ? 0 : (__mmask32)((1u << left) - 1u);
}

/* dec_scores_bf16 (ukernel.h): four keys by four rows a step, 16 accumulators of vdpbf16ps (32
 * bf16 a product, masked loads for the tail of d: zeros, nothing past d is read), folded by
 * hsum16 into one vector whose 128-bit lanes are the rows' four scores. The keys go in order, a
 * step's kv heads one after the other, so the rows are read as the cache holds them; q comes
 * from L1 at every step. */
static void uk_dec_scores_bf16(int heads, int rows, int d, int keys, const uint16_t *q,
                               ptrdiff_t qhs, ptrdiff_t ldq, const uint16_t *const *k,
                               ptrdiff_t khs, float *s, ptrdiff_t shs, ptrdiff_t lds,
                               const char *const *pf, int pf_rows, size_t pf_bytes)
{
    pf_cursor pc = pf_start(pf, pf_rows, pf_bytes, (keys + 3) / 4 * heads);
    for (int i0 = 0; i0 < keys; i0 += 4) {
        const uint16_t *kr[4];
        const int nk = key_quad(k, i0, keys, kr);
        for (int h = 0; h < heads; h++) {
            pf_step(&pc);
            for (int r0 = 0; r0 < rows; r0 += 4) {
                const int nr = rows - r0 < 4 ? rows - r0 : 4;
                const uint16_t *qh = q + h * qhs + r0 * ldq;
                __m512 acc[16];
                for (int i = 0; i < 16; i++)
                    acc[i] = _mm512_setzero_ps();
                for (int e = 0; e < d; e += 32) {
                    const __mmask32 m = mask32(d - e);
                    __m512bh kv[4];
                    for (int i = 0; i < 4; i++)
                        kv[i] = (__m512bh)_mm512_maskz_loadu_epi16(m, kr[i] + h * khs + e);
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++)
                        if (r < nr) {
                            const __m512bh qv =
                                (__m512bh)_mm512_maskz_loadu_epi16(m, qh + r * ldq + e);
#pragma GCC unroll 4
                            for (int i = 0; i < 4; i++)
                                acc[4 * r + i] = _mm512_dpbf16_ps(acc[4 * r + i], qv, kv[i]);
                        }
                }
                store_quad(acc, s + h * shs + r0 * lds + i0, lds, nk, nr);
            }
        }
    }
}

/* dec_pv_bf16 (ukernel.h): per kv head, four rows by 64 columns of o held in 16 registers across
 * all the keys (loaded and stored once a call); each pair of keys' 64 columns interleaved into
 * pairs by vpermt2w (four vectors of 16 column pairs), then one vdpbf16ps a row and 16 columns
 * with P's pair broadcast from memory. */
static void uk_dec_pv_bf16(int heads, int rows, int d, int keys, const uint16_t *p, ptrdiff_t phs,
                           ptrdiff_t ldp, const uint16_t *const *v, ptrdiff_t vhs, float *o,
                           ptrdiff_t ohs, ptrdiff_t ldo, const char *const *pf, int pf_rows,
                           size_t pf_bytes)
{
    pf_cursor pc = pf_start(pf, pf_rows, pf_bytes,
                            heads * ((rows + 3) / 4) * ((d + 63) / 64) * ((keys + 1) / 2));
    /* Words 0..31 of the result alternate even[i] and odd[i] (index 32 + i selects odd). */
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                        8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int h = 0; h < heads; h++)
        for (int r0 = 0; r0 < rows; r0 += 4) {
            const int nr = rows - r0 < 4 ? rows - r0 : 4;
            const uint16_t *ph = p + h * phs + r0 * ldp;
            for (int e = 0; e < d; e += 64) {
                const int groups = d - e >= 64 ? 4 : (d - e + 15) / 16; /* 16 columns each */
                const __mmask32 m0 = mask32(d - e), m1 = mask32(d - e - 32);
                float *oh = o + h * ohs + r0 * ldo + e;
                __m512 acc[4][4];
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                    for (int g = 0; g < 4; g++)
                        acc[r][g] = r < nr && g < groups ? _mm512_loadu_ps(oh + r * ldo + 16 * g)
                                                         : _mm512_setzero_ps();
                for (int i = 0; i < keys; i += 2) {
                    pf_step(&pc);
                    const uint16_t *ev = v[i] + h * vhs + e;
                    const __m512i e0 = _mm512_maskz_loadu_epi16(m0, ev);
                    const __m512i e1 = _mm512_maskz_loadu_epi16(m1, ev + 32);
                    __m512i o0 = _mm512_setzero_si512(), o1 = o0;
                    if (i + 1 < keys) {
                        const uint16_t *od = v[i + 1] + h * vhs + e;
                        o0 = _mm512_maskz_loadu_epi16(m0, od);
                        o1 = _mm512_maskz_loadu_epi16(m1, od + 32);
                    }
                    const __m512bh w[4] = {(__m512bh)_mm512_permutex2var_epi16(e0, lo, o0),
                                           (__m512bh)_mm512_permutex2var_epi16(e0, hi, o0),
                                           (__m512bh)_mm512_permutex2var_epi16(e1, lo, o1),
                                           (__m512bh)_mm512_permutex2var_epi16(e1, hi, o1)};
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++)
                        if (r < nr) {
                            const __m512bh pr = bcast_pair(ph + r * ldp + i);
#pragma GCC unroll 4
                            for (int g = 0; g < 4; g++)
                                acc[r][g] = _mm512_dpbf16_ps(acc[r][g], pr, w[g]);
                        }
                }
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                    for (int g = 0; g < 4; g++)
                        if (r < nr && g < groups)
                            _mm512_storeu_ps(oh + r * ldo + 16 * g, acc[r][g]);
            }
        }
}

const fp_ukernels fp_ukernels_avx512bf16 = {
    "avx512bf16",
    "AVX-512 f32 FMA, 6x64 register block; bf16 inputs: vdpbf16ps, 6x64 block of bf16 pairs",
    uk_gemm,
    uk_gemm_bf16,
    uk_col_max,
    uk_exp2_cols,
    uk_exp2_cols_bf16,
    uk_interleave_bf16,
    uk_round_bf16,
    uk_dsoftmax_cols,
    uk_scale_rows,
    avx512_transpose32,
    avx512_cvt_f16,
    avx512_cvt_bf16,
    avx512_store_f16,
    avx512_store_bf16,
    uk_dec_scores,
    uk_dec_pv,
    uk_dec_scores_bf16,
    uk_dec_pv_bf16,
    avx512_dec_scores_f16,
    uk_dec_pv_f16,
    NULL,
    NULL,
    NULL,
    NULL,
    256,
    0,
    0,
    uk_gemm_rs,
    uk_softmax_cols,
};
