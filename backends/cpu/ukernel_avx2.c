/*
 * AVX2 + FMA micro-kernels (contract in ukernel.h): FLASHPORT_CPU_ISA=avx2; the default on x86-64
 * CPUs with AVX2, FMA and F16C but no AVX-512 (Intel client chips since Alder Lake, AMD before
 * Zen 4): the laptops people validate on.
 *
 * Products: ukernel_gemm.h with a 6 x 16 register block on ymm registers: 12 accumulators, 2 B
 * vectors and a broadcast fill the 16 registers; per reduction step 2 vector loads and 6
 * broadcasts feed 12 FMAs, within two load ports. Column blocks of 16 keep one k x 16 panel of B
 * (Q^T, V) in L1 while K or P streams through as broadcasts, so no panel is packed here: the
 * forward reads f32, f16 and bf16 K and V from a per-thread f32 stage (copied, or converted by
 * F16C or a shift); the backward's fused schedule stages K and V of
 * every dtype as f32 rows once per task (flash_bwd.c). Those tiles' strides avoid multiples of
 * 512 bytes (fp_tile_ld_sets), at which a panel would fall into a few L1 sets.
 * exp2: 1.5 * 2^23 + 127 added to round and bias the exponent in one step, the shared polynomial
 * (ukernel.h), 2^n by a shift into the exponent field; lanes below -126 are zeroed by a mask.
 * The column softmax pieces (ukernel_ops.h) are lane-wise, one column vector at a time: two at a
 * time would need more than the 16 registers (measured slower). transpose32: 8 x 8 word blocks
 * by shuffles (packing Q^T and dO^T). f16 storage converts with vcvtph2ps (F16C), bf16 by
 * shifting into the high half; there is no bf16 dot product, so bf16 runs the f32 products.
 * Decode: dec_scores_f16 and dec_scores_bf16_f32 take two keys by four rows a step (8
 * accumulators, each query vector loaded once for both keys), folded by hsum8; dec_pv_f16 and
 * dec_pv_bf16_f32 hold 4 rows x 3 vectors of O (12 accumulators, no spills; f32's dec_pv is the
 * generic 4 x 4 of ukernel_ops.h, whose loop waits on memory instead); dec_row_max and
 * dec_exp2_rows give the per-row softmax of flash_decode.c whole vectors (a row's maximum with
 * a NaN flag, its exponentials and their sum), where the shared code had 16 scalar lanes and a
 * column of subtrahends to fill per row.
 * Forward query block: 256 (fwd_block_q). AVX2-only x86 cores include Zen 2/3 with 512 KiB of
 * L2: K and V of one head do not stay there, so each pass over them is a stream from L3, and
 * 256 queries a pass make a quarter of the passes of the default 64 (as torch's CPU flash
 * kernel blocks 256 queries at these lengths); flash_fwd.c works through them in 64-query
 * sub-blocks, so the score tile stays in L1.
 * Target: x86-64 with AVX2, FMA, F16C (compiled with those flags alone; isa.c checks the CPU).
 * Known differences from the reference: f32 accumulation with FMA; the polynomial exp2.
 * Numbers: docs/performance-cpu.md (measured with FLASHPORT_CPU_ISA=avx2 on the Zen 4
 * development machine, whose 256-bit FMA throughput per cycle equals its 512-bit one; decode
 * and the forward also on an AVX2-only Zen 3).
 */
#include "backends/cpu/ukernel.h"

#include <immintrin.h>
#include <math.h>

typedef __m256 uk_vec;
#define UK_LANES 8
#define UK_MR    6
#define UK_NV    2

static inline uk_vec uk_zero(void)
{
    return _mm256_setzero_ps();
}
static inline uk_vec uk_set1(float x)
{
    return _mm256_set1_ps(x);
}
static inline uk_vec uk_load(const float *p)
{
    return _mm256_loadu_ps(p);
}
static inline void uk_store(float *p, uk_vec v)
{
    _mm256_storeu_ps(p, v);
}
static inline uk_vec uk_add(uk_vec a, uk_vec b)
{
    return _mm256_add_ps(a, b);
}
static inline uk_vec uk_sub(uk_vec a, uk_vec b)
{
    return _mm256_sub_ps(a, b);
}
static inline uk_vec uk_mul(uk_vec a, uk_vec b)
{
    return _mm256_mul_ps(a, b);
}
static inline uk_vec uk_madd(uk_vec a, uk_vec b, uk_vec c)
{
    return _mm256_fmadd_ps(a, b, c);
}
static inline uk_vec uk_max(uk_vec a, uk_vec b)
{
    return _mm256_max_ps(a, b);
}
static inline float uk_hsum(uk_vec x)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
static inline uk_vec uk_load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
/* bf16 is the high half of an f32: widen to 32 bits, shift into place. */
static inline __m256 bf16x8(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline uk_vec uk_load_bf16(const uint16_t *p)
{
    return bf16x8(_mm_loadu_si128((const __m128i *)(const void *)p));
}
#define UK_HAS_LOAD_BF16      1
#define UK_OWN_DEC_SCORES_F16 1
#define UK_OWN_DEC_PV_H16     1

static inline uk_vec uk_exp2(uk_vec x)
{
    /* NLT_UQ keeps NaN lanes; min with the constant first passes NaN through. Lanes below -126
     * (-inf included) are zeroed by the mask whatever the arithmetic made of them, so there is no
     * lower clamp. */
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_NLT_UQ);
    x = _mm256_min_ps(_mm256_set1_ps(127.0f), x);
    /* x + (1.5 * 2^23 + 127) rounds x to a nearest integer n in the low mantissa bits of t,
     * already biased: shifted left 23 they are the exponent field of 2^n. One add and one
     * subtract instead of vroundps, vcvtps2dq and an integer add. A tie (x = k + 0.5) rounds n +
     * 127 to even, so n itself may go either way; f = x - n is then 0.5 or -0.5, both inside the
     * polynomial's range. */
    const __m256 magic = _mm256_set1_ps(12582912.0f + 127.0f);
    const __m256 t = _mm256_add_ps(x, magic);
    const __m256 f = _mm256_sub_ps(x, _mm256_sub_ps(t, magic));
    __m256 p = _mm256_set1_ps(FP_EXP2_C6);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(FP_EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(FP_EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(FP_EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(FP_EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(FP_EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

#include "backends/cpu/ukernel_ops.h"

/* 8 elements of a 16-bit row (f16, or bf16 when bf16) from p, in f32; n < 8: the first n, zeros
 * after them, nothing past p + n read. */
static inline __attribute__((always_inline)) __m256 load_h16(const uint16_t *p, int n, int bf16)
{
    __m128i h;
    if (n >= 8) {
        h = _mm_loadu_si128((const __m128i *)(const void *)p);
    } else {
        uint16_t t[8] = {0};
        memcpy(t, p, sizeof(uint16_t) * (size_t)n);
        h = _mm_loadu_si128((const __m128i *)(const void *)t);
    }
    return bf16 ? bf16x8(h) : _mm256_cvtph_ps(h);
}

/* Lane j of the result: the sum of the lanes of a[j]. A tree of one-uop shuffles and adds
 * (vhaddps is several uops on AMD cores). */
static inline __m256 hsum8(const __m256 *a)
{
    __m256 t[4];
    for (int i = 0; i < 4; i++) /* 128-bit lane l: a[2i] and a[2i + 1]'s pair sums, interleaved */
        t[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    /* 128-bit lane l of u0: a0 .. a3's sums over their lane l (u1: a4 .. a7) */
    const __m256 u0 =
        _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], 0x44), _mm256_shuffle_ps(t[0], t[1], 0xee));
    const __m256 u1 =
        _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], 0x44), _mm256_shuffle_ps(t[2], t[3], 0xee));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* acc[2 r + i] += query row r's 8 elements from q (rows ldq apart, the first nr) times key i's;
 * tail: the lanes of q to load (the rest 0), NULL for all. */
static inline __attribute__((always_inline)) void scores_step(__m256 *acc, const float *q,
                                                              ptrdiff_t ldq, int nr, __m256 kv0,
                                                              __m256 kv1, const __m256i *tail)
{
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
        if (r < nr) {
            __m256 qv =
                tail ? _mm256_maskload_ps(q + r * ldq, *tail) : _mm256_loadu_ps(q + r * ldq);
            /* In a register for both products: GCC would fold the load into each FMA, two loads
             * of q where one will do, and the loads, not the FMAs, would bound the step. */
            __asm__("" : "+x"(qv));
            acc[2 * r] = _mm256_fmadd_ps(qv, kv0, acc[2 * r]);
            acc[2 * r + 1] = _mm256_fmadd_ps(qv, kv1, acc[2 * r + 1]);
        }
}

/* Lanes 2 r and 2 r + 1 of t (row r's scores of two keys) to s + r * lds, for the first nr rows
 * and nk keys. */
static inline void store_pairs(__m256 t, float *s, ptrdiff_t lds, int nr, int nk)
{
    const __m128 lo = _mm256_castps256_ps128(t), hi = _mm256_extractf128_ps(t, 1);
    if (nk == 2 && nr == 4) {
        _mm_storel_pi((__m64 *)(void *)s, lo);
        _mm_storeh_pi((__m64 *)(void *)(s + lds), lo);
        _mm_storel_pi((__m64 *)(void *)(s + 2 * lds), hi);
        _mm_storeh_pi((__m64 *)(void *)(s + 3 * lds), hi);
        return;
    }
    float u[8];
    _mm256_storeu_ps(u, t);
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < nk; i++)
            s[r * lds + i] = u[2 * r + i];
}

/* dec_scores_f16 / _bf16_f32 (ukernel.h): two keys by four rows a step, 8 accumulators (the
 * query row loaded once for both keys), each 16-bit row converted as it is loaded (vcvtph2ps, or
 * a shift for bf16), folded by hsum8 into one vector of the step's 8 scores; the tail of d is
 * masked (zeros, nothing past d read). A step's kv heads one after the other, so the rows are read
 * as the cache holds them; the pf rows asked for a few lines a kv head. */
static inline __attribute__((always_inline)) void
avx2_dec_scores_h16(int heads, int rows, int d, int keys, const float *q, ptrdiff_t qhs,
                    ptrdiff_t ldq, const uint16_t *const *k, int bf16, ptrdiff_t khs, float *s,
                    ptrdiff_t shs, ptrdiff_t lds, const char *const *pf, int pf_rows,
                    size_t pf_bytes)
{
    pf_cursor pc = pf_start(pf, pf_rows, pf_bytes, (keys + 1) / 2 * heads);
    const int dv = d - d % 8;
    const __m256i tail =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(d - dv), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int i0 = 0; i0 < keys; i0 += 2) {
        const int nk = keys - i0 < 2 ? keys - i0 : 2;
        const uint16_t *k0 = k[i0], *k1 = k[i0 + nk - 1];
        for (int h = 0; h < heads; h++) {
            pf_step(&pc);
            const uint16_t *kh0 = k0 + h * khs, *kh1 = k1 + h * khs;
            for (int r0 = 0; r0 < rows; r0 += 4) {
                const int nr = rows - r0 < 4 ? rows - r0 : 4;
                const float *qh = q + h * qhs + r0 * ldq;
                __m256 acc[8];
                for (int i = 0; i < 8; i++)
                    acc[i] = _mm256_setzero_ps();
                for (int e = 0; e < dv; e += 8)
                    scores_step(acc, qh + e, ldq, nr, load_h16(kh0 + e, 8, bf16),
                                load_h16(kh1 + e, 8, bf16), NULL);
                if (dv < d)
                    scores_step(acc, qh + dv, ldq, nr, load_h16(kh0 + dv, d - dv, bf16),
                                load_h16(kh1 + dv, d - dv, bf16), &tail);
                store_pairs(hsum8(acc), s + h * shs + r0 * lds + i0, lds, nr, nk);
            }
        }
    }
}

static void avx2_dec_scores_f16(int heads, int rows, int d, int keys, const float *q, ptrdiff_t qhs,
                                ptrdiff_t ldq, const uint16_t *const *k, ptrdiff_t khs, float *s,
                                ptrdiff_t shs, ptrdiff_t lds, const char *const *pf, int pf_rows,
                                size_t pf_bytes)
{
    avx2_dec_scores_h16(heads, rows, d, keys, q, qhs, ldq, k, 0, khs, s, shs, lds, pf, pf_rows,
                        pf_bytes);
}

static void avx2_dec_scores_bf16_f32(int heads, int rows, int d, int keys, const float *q,
                                     ptrdiff_t qhs, ptrdiff_t ldq, const uint16_t *const *k,
                                     ptrdiff_t khs, float *s, ptrdiff_t shs, ptrdiff_t lds,
                                     const char *const *pf, int pf_rows, size_t pf_bytes)
{
    avx2_dec_scores_h16(heads, rows, d, keys, q, qhs, ldq, k, 1, khs, s, shs, lds, pf, pf_rows,
                        pf_bytes);
}

/* Vectors of O a 16-bit dec_pv block holds: 4 rows x 3 vectors is 12 accumulators, with the
 * key's 3 V vectors and a broadcast of P the 16 ymm registers exactly, so nothing spills across
 * the keys (the shared 4 x 4 block of ukernel_ops.h spills 4 accumulators every key here). */
enum { PV_VECS = 3 };

/* O[r][e + g * 8 ..] += sum over the keys of P[r][i] V[i][e + g * 8 ..] for r < nr, g < nv, in
 * key order; vi(i) = v[i] + off elements. Always inlined with constant nr and nv where it can be,
 * so that the key loop has no partial-tile tests. */
static inline __attribute__((always_inline)) void
pv_block(int nr, int nv, int keys, const float *ph, ptrdiff_t ldp, const void *const *v, int kind,
         size_t off, float *oh, ptrdiff_t ldo, pf_cursor *pc)
{
    const size_t es = uk_row_es(kind);
    __m256 acc[4][PV_VECS];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int g = 0; g < PV_VECS; g++)
            acc[r][g] =
                r < nr && g < nv ? _mm256_loadu_ps(oh + r * ldo + g * 8) : _mm256_setzero_ps();
    for (int i = 0; i < keys; i++) {
        pf_step(pc);
        const void *vi = (const char *)v[i] + off * es;
        __m256 vv[PV_VECS];
#pragma GCC unroll 4
        for (int g = 0; g < PV_VECS; g++)
            vv[g] = g < nv ? uk_load_row(vi, kind, g * 8) : _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            if (r < nr) {
                const __m256 pr = _mm256_set1_ps(ph[r * ldp + i]);
#pragma GCC unroll 4
                for (int g = 0; g < PV_VECS; g++)
                    if (g < nv)
                        acc[r][g] = _mm256_fmadd_ps(pr, vv[g], acc[r][g]);
            }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int g = 0; g < PV_VECS; g++)
            if (r < nr && g < nv)
                _mm256_storeu_ps(oh + r * ldo + g * 8, acc[r][g]);
}

/* dec_pv_f16 and dec_pv_bf16_f32 (ukernel.h): per kv head, four rows by PV_VECS vectors of O in
 * registers across the block, each key's vectors loaded and converted once for the four rows;
 * the tail of d past the last whole vector is scalar. The same sums in the same order as
 * ukernel_ops.h's uk_dec_pv_rows (f32 rows keep that one: their loop waits on memory, and the
 * 4 x 3 block's extra broadcasts measured slower there). */
static inline __attribute__((always_inline)) void
avx2_dec_pv_rows(int heads, int rows, int d, int keys, const float *p, ptrdiff_t phs, ptrdiff_t ldp,
                 const void *const *v, int kind, ptrdiff_t vhs, float *o, ptrdiff_t ohs,
                 ptrdiff_t ldo, const char *const *pf, int pf_rows, size_t pf_bytes)
{
    const size_t es = uk_row_es(kind);
    const int dv = d - d % 8, chunk = PV_VECS * 8;
    pf_cursor pc = pf_start(pf, pf_rows, pf_bytes,
                            heads * ((rows + 3) / 4) * ((dv + chunk - 1) / chunk) * keys);
    for (int h = 0; h < heads; h++)
        for (int r0 = 0; r0 < rows; r0 += 4) {
            const int nr = rows - r0 < 4 ? rows - r0 : 4;
            const float *ph = p + h * phs + r0 * ldp;
            float *oh = o + h * ohs + r0 * ldo;
            for (int e = 0; e < dv; e += chunk) {
                const int nv = (dv - e) / 8 < PV_VECS ? (dv - e) / 8 : PV_VECS;
                const size_t off = (size_t)(h * vhs + e);
                if (nr == 4 && nv == 3)
                    pv_block(4, 3, keys, ph, ldp, v, kind, off, oh + e, ldo, &pc);
                else if (nr == 4 && nv == 2)
                    pv_block(4, 2, keys, ph, ldp, v, kind, off, oh + e, ldo, &pc);
                else if (nr == 4)
                    pv_block(4, 1, keys, ph, ldp, v, kind, off, oh + e, ldo, &pc);
                else
                    pv_block(nr, nv, keys, ph, ldp, v, kind, off, oh + e, ldo, &pc);
            }
            for (int r = 0; r < nr; r++)
                for (int e = dv; e < d; e++) {
                    float acc = oh[r * ldo + e];
                    for (int i = 0; i < keys; i++)
                        acc += ph[r * ldp + i] *
                               uk_elem((const char *)v[i] + (size_t)(h * vhs) * es, kind, e);
                    oh[r * ldo + e] = acc;
                }
        }
}

static void avx2_dec_pv_f16(int heads, int rows, int d, int keys, const float *p, ptrdiff_t phs,
                            ptrdiff_t ldp, const uint16_t *const *v, ptrdiff_t vhs, float *o,
                            ptrdiff_t ohs, ptrdiff_t ldo, const char *const *pf, int pf_rows,
                            size_t pf_bytes)
{
    avx2_dec_pv_rows(heads, rows, d, keys, p, phs, ldp, (const void *const *)v, UK_ROW_F16, vhs, o,
                     ohs, ldo, pf, pf_rows, pf_bytes);
}

static void avx2_dec_pv_bf16_f32(int heads, int rows, int d, int keys, const float *p,
                                 ptrdiff_t phs, ptrdiff_t ldp, const uint16_t *const *v,
                                 ptrdiff_t vhs, float *o, ptrdiff_t ohs, ptrdiff_t ldo,
                                 const char *const *pf, int pf_rows, size_t pf_bytes)
{
    avx2_dec_pv_rows(heads, rows, d, keys, p, phs, ldp, (const void *const *)v, UK_ROW_BF16, vhs, o,
                     ohs, ldo, pf, pf_rows, pf_bytes);
}

/* Lanes i < n of a vector: all ones, the rest zero. */
static inline __m256 lanes_below(int n)
{
    return _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* dec_row_max (ukernel.h): two running maxima a row and a NaN flag (unordered compares ORed),
 * the tail of n loaded masked and filled with -inf. */
static void avx2_dec_row_max(int rows, int n, const float *s, ptrdiff_t lds, float *mx)
{
    const int nv = n - n % 8;
    const __m256 tail = lanes_below(n - nv), ninf = _mm256_set1_ps(-INFINITY);
    for (int r = 0; r < rows; r++) {
        const float *x = s + r * lds;
        __m256 m0 = ninf, m1 = ninf, bad = _mm256_setzero_ps();
        int c = 0;
        for (; c + 16 <= nv; c += 16) {
            const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(x0, x1, _CMP_UNORD_Q));
            m0 = _mm256_max_ps(m0, x0);
            m1 = _mm256_max_ps(m1, x1);
        }
        if (c < nv) {
            const __m256 x0 = _mm256_loadu_ps(x + c);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q));
            m0 = _mm256_max_ps(m0, x0);
        }
        if (nv < n) {
            const __m256 x0 =
                _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + nv, _mm256_castps_si256(tail)), tail);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q));
            m0 = _mm256_max_ps(m0, x0);
        }
        m0 = _mm256_max_ps(m0, m1);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        mx[r] = _mm256_movemask_ps(bad) ? NAN : _mm_cvtss_f32(h);
    }
}

/* dec_exp2_rows (ukernel.h): a row at a time, two partial sums; the tail's lanes past n are
 * zeroed before they are summed. */
static void avx2_dec_exp2_rows(int rows, int n, float *s, ptrdiff_t lds, float mul,
                               const float *sub, float *sum)
{
    const int nv = n - n % 8;
    const __m256 tail = lanes_below(n - nv), vmul = _mm256_set1_ps(mul);
    for (int r = 0; r < rows; r++) {
        float *x = s + r * lds;
        const __m256 vsub = _mm256_set1_ps(sub[r]);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int c = 0;
        for (; c + 16 <= nv; c += 16) {
            const __m256 e0 =
                uk_exp2(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), vmul), vsub));
            const __m256 e1 =
                uk_exp2(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c + 8), vmul), vsub));
            _mm256_storeu_ps(x + c, e0);
            _mm256_storeu_ps(x + c + 8, e1);
            a0 = _mm256_add_ps(a0, e0);
            a1 = _mm256_add_ps(a1, e1);
        }
        for (; c < n; c += 8) {
            __m256 e = uk_exp2(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), vmul), vsub));
            _mm256_storeu_ps(x + c, e);
            if (c + 8 > n)
                e = _mm256_and_ps(e, tail);
            a0 = _mm256_add_ps(a0, e);
        }
        sum[r] = uk_hsum(_mm256_add_ps(a0, a1));
    }
}

/* transpose32 by 8 x 8 blocks of words: 8 row loads, the usual three shuffle stages (32-bit,
 * 64-bit and 128-bit interleaves), 8 column stores. Edge blocks (fewer than 8 rows or columns
 * left) take the generic word-by-word copy, so nothing outside the rows x cols words is read. */
static void avx2_transpose32(int rows, int cols, const void *src, ptrdiff_t lds, uint32_t *dst,
                             ptrdiff_t ldd)
{
    const unsigned char *s = src;
    const int rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
    for (int r0 = 0; r0 < rows8; r0 += 8)
        for (int c0 = 0; c0 < cols8; c0 += 8) {
            __m256 a[8], b[8];
            for (int r = 0; r < 8; r++)
                a[r] = _mm256_loadu_ps((const float *)(s + (r0 + r) * lds + 4 * c0));
            for (int r = 0; r < 8; r += 2) {
                b[r] = _mm256_unpacklo_ps(a[r], a[r + 1]);
                b[r + 1] = _mm256_unpackhi_ps(a[r], a[r + 1]);
            }
            for (int r = 0; r < 8; r += 4) {
                a[r] = _mm256_shuffle_ps(b[r], b[r + 2], 0x44);
                a[r + 1] = _mm256_shuffle_ps(b[r], b[r + 2], 0xee);
                a[r + 2] = _mm256_shuffle_ps(b[r + 1], b[r + 3], 0x44);
                a[r + 3] = _mm256_shuffle_ps(b[r + 1], b[r + 3], 0xee);
            }
            /* 128-bit lane l of a[4q + k] holds column 4 l + k of rows 4q .. 4q + 3. */
            for (int k = 0; k < 4; k++) {
                b[k] = _mm256_permute2f128_ps(a[k], a[4 + k], 0x20);
                b[4 + k] = _mm256_permute2f128_ps(a[k], a[4 + k], 0x31);
            }
            for (int c = 0; c < 8; c++)
                _mm256_storeu_ps((float *)(dst + (c0 + c) * ldd + r0), b[c]);
        }
    if (cols8 < cols)
        uk_transpose32_generic(rows8, cols - cols8, s + 4 * cols8, lds, dst + cols8 * ldd, ldd);
    if (rows8 < rows)
        uk_transpose32_generic(rows - rows8, cols, s + rows8 * lds, lds, dst + rows8, ldd);
}

static void cvt_f16(int n, const uint16_t *src, float *dst)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    if (i < n) {
        uint16_t in[8] = {0};
        float out[8];
        for (int j = 0; j < n - i; j++)
            in[j] = src[i + j];
        _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)in)));
        for (int j = 0; j < n - i; j++)
            dst[i + j] = out[j];
    }
}

static void cvt_bf16(int n, const uint16_t *src, float *dst)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, bf16x8(_mm_loadu_si128((const __m128i *)(src + i))));
    if (i < n) {
        uint16_t in[8] = {0};
        float out[8];
        for (int j = 0; j < n - i; j++)
            in[j] = src[i + j];
        _mm256_storeu_ps(out, bf16x8(_mm_loadu_si128((const __m128i *)in)));
        for (int j = 0; j < n - i; j++)
            dst[i + j] = out[j];
    }
}

const fp_ukernels fp_ukernels_avx2 = {
    "avx2",
    "AVX2 f32 FMA, 6x16 register block",
    uk_gemm,
    NULL,
    uk_col_max,
    uk_exp2_cols,
    NULL,
    NULL,
    NULL,
    uk_dsoftmax_cols,
    uk_scale_rows,
    avx2_transpose32,
    cvt_f16,
    cvt_bf16,
    uk_store_f16_generic,
    uk_store_bf16_generic,
    uk_dec_scores,
    uk_dec_pv,
    NULL,
    NULL,
    avx2_dec_scores_f16,
    avx2_dec_pv_f16,
    avx2_dec_scores_bf16_f32,
    avx2_dec_pv_bf16_f32,
    avx2_dec_row_max,
    avx2_dec_exp2_rows,
    256,
    1,
    0,
    uk_gemm_rs,
    uk_softmax_cols,
};
