/*
 * The fp_ukernels entries that every vector ISA implements the same way (ukernel.h has the
 * contract): the f32 product (ukernel_gemm.h), the column-wise softmax pieces and the decode steps
 * (dec_scores, dec_pv, their _f16 forms, on ukernel.h's pf_cursor, the prefetch schedule the
 * _bf16 ones share). Included once by
 * each ukernel_<isa>.c after it defines its vector primitives:
 *   uk_vec, UK_LANES (divides FP_TILE_COLS), UK_MR, UK_NV
 *   uk_zero(), uk_set1(x), uk_load(p), uk_store(p, v)     unaligned loads and stores
 *   uk_add, uk_sub, uk_mul, uk_max(a, b)
 *   uk_madd(a, b, c)    a * b + c (fused where the ISA has FMA)
 *   uk_exp2(x)          2^x as the contract says (0 below -126, -inf included)
 *   uk_hsum(x)          the sum of x's lanes
 *   uk_load_f16(p)      UK_LANES f16 values from p, converted to f32 (exact)
 * and may define
 *   uk_exp2_le0(x)      uk_exp2 for x <= 0 or NaN only, with UK_HAS_EXP2_LE0: the same bits
 *                       there, fewer operations (no upper clamp)
 *   uk_load_bf16(p)     the same for bf16, with UK_HAS_LOAD_BF16: the table then has the
 *                       generic _bf16_f32 decode steps
 * Column-wise: a tile holds keys down its rows and query rows across
 * its columns, so a query's softmax statistics are lane-wise reductions down a column, with no
 * horizontal shuffles.
 */

#include "core/dtype.h"

#include <math.h>
#include <string.h>

#define UK_GEMM               uk_gemm
#define UK_GEMM_RS            uk_gemm_rs
#define UK_GEMM_A             float
#define UK_GEMM_B             float
#define uk_gemm_avec          uk_vec
#define uk_gemm_bvec          uk_vec
#define uk_gemm_bcast(p)      uk_set1(*(p))
#define uk_gemm_loadb(p)      uk_load(p)
#define uk_gemm_madd(c, a, b) uk_madd(a, b, c)
#include "backends/cpu/ukernel_gemm.h"

static void uk_col_max(int rows, int cols, const float *s, ptrdiff_t lds, float *mx)
{
    for (int c = 0; c < cols; c += UK_LANES) {
        /* Two running maxima halve the dependency chain; max is exact, so the order is free. */
        uk_vec m0 = uk_load(mx + c), m1 = m0;
        int r = 0;
        for (; r + 1 < rows; r += 2) {
            m0 = uk_max(m0, uk_load(s + r * lds + c));
            m1 = uk_max(m1, uk_load(s + (r + 1) * lds + c));
        }
        if (r < rows)
            m0 = uk_max(m0, uk_load(s + r * lds + c));
        uk_store(mx + c, uk_max(m0, m1));
    }
}

#ifndef UK_HAS_EXP2_LE0
static inline uk_vec uk_exp2_le0(uk_vec x)
{
    return uk_exp2(x);
}
#endif

/* One column group's P in place, 2^(s mul - sub) by uk_exp2, and its sum; le0 (a constant): the
 * exponents are <= 0 or NaN (uk_exp2_le0 then, the same bits). exp2_cols and softmax_cols. */
static inline __attribute__((always_inline)) uk_vec
uk_exp2_col(int rows, float *s, ptrdiff_t lds, uk_vec vmul, uk_vec vsub, const int le0)
{
    uk_vec acc = uk_zero();
    for (int r = 0; r < rows; r++) {
        float *p = s + r * lds;
        const uk_vec x = uk_sub(uk_mul(uk_load(p), vmul), vsub);
        const uk_vec e = le0 ? uk_exp2_le0(x) : uk_exp2(x);
        uk_store(p, e);
        acc = uk_add(acc, e);
    }
    return acc;
}

static void uk_exp2_cols(int rows, int cols, float *s, ptrdiff_t lds, float mul, const float *sub,
                         float *sum)
{
    const uk_vec vmul = uk_set1(mul);
    for (int c = 0; c < cols; c += UK_LANES) {
        const uk_vec acc = uk_exp2_col(rows, s + c, lds, vmul, uk_load(sub + c), 0);
        if (sum)
            uk_store(sum + c, uk_add(uk_load(sum + c), acc));
    }
}

/* softmax_cols (ukernel.h): in chunks of up to UK_SMG groups of UK_LANES columns, the column
 * maxima as col_max takes them (two chains a group, even and odd rows, so the same maximum bit for
 * bit, NaN included; the chunk's groups side by side, 2 * UK_SMG independent chains over one row's
 * contiguous lines instead of two latency-bound ones), then per group the state's update and the
 * exponentials and their sums as exp2_cols makes them. The update is core/online_softmax.h's
 * fp_softmax_update_exp2 lane by lane, in a loop over plain arrays that the compiler vectorizes,
 * with the rescale factors by uk_exp2 (of m - m' <= 0: 1 exactly where the maximum stays, 0 from a
 * first visible score on). With mul > 0 every exponent s * mul - base is <= 0 or NaN (base is at
 * least the column's largest rounded product), so uk_exp2_le0 serves. */
enum { UK_SMG = 4 };

static int uk_softmax_cols(int rows, int cols, float *s, ptrdiff_t lds, float mul, float *m,
                           float *l, float *alpha)
{
    const uk_vec vmul = uk_set1(mul);
    int rescale = 0;
    for (int c0 = 0; c0 < cols; c0 += UK_SMG * UK_LANES) {
        const int ng = (cols - c0) / UK_LANES < UK_SMG ? (cols - c0) / UK_LANES : UK_SMG;
        float bm[UK_SMG * UK_LANES];
        if (ng == UK_SMG) {
            uk_vec m0[UK_SMG], m1[UK_SMG];
#pragma GCC unroll 4
            for (int g = 0; g < UK_SMG; g++)
                m0[g] = m1[g] = uk_set1(-INFINITY);
            int r = 0;
            for (; r + 1 < rows; r += 2)
#pragma GCC unroll 4
                for (int g = 0; g < UK_SMG; g++) {
                    m0[g] = uk_max(m0[g], uk_load(s + r * lds + c0 + g * UK_LANES));
                    m1[g] = uk_max(m1[g], uk_load(s + (r + 1) * lds + c0 + g * UK_LANES));
                }
#pragma GCC unroll 4
            for (int g = 0; g < UK_SMG; g++) {
                if (r < rows)
                    m0[g] = uk_max(m0[g], uk_load(s + r * lds + c0 + g * UK_LANES));
                uk_store(bm + g * UK_LANES, uk_max(m0[g], m1[g]));
            }
        } else { /* a last chunk of fewer groups: col_max itself, from -inf */
            for (int i = 0; i < ng * UK_LANES; i++)
                bm[i] = -INFINITY;
            uk_col_max(rows, ng * UK_LANES, s + c0, lds, bm);
        }
        for (int g = 0; g < ng; g++) {
            const int c = c0 + g * UK_LANES;
            float dm[UK_LANES], base[UK_LANES];
            for (int i = 0; i < UK_LANES; i++) {
                const float b = bm[g * UK_LANES + i] * mul, mo = m[c + i];
                const int grows = b > mo; /* false for NaN: the maximum stays */
                const float mn = grows ? b : mo;
                dm[i] = grows ? mo - b : 0.0f;
                m[c + i] = mn;
                base[i] = mn == -INFINITY ? 0.0f : mn; /* fp_softmax_exp_base */
            }
            const uk_vec a = uk_exp2_le0(uk_load(dm));
            uk_store(alpha + c, a);
            for (int i = 0; i < UK_LANES; i++)
                rescale |= alpha[c + i] != 1.0f;
            const uk_vec vsub = uk_load(base);
            const uk_vec acc = mul > 0.0f ? uk_exp2_col(rows, s + c, lds, vmul, vsub, 1)
                                          : uk_exp2_col(rows, s + c, lds, vmul, vsub, 0);
            uk_store(l + c, uk_add(uk_mul(uk_load(l + c), a), acc));
        }
    }
    return rescale;
}

static void uk_dsoftmax_cols(int rows, int cols, const float *p, ptrdiff_t ldp, float *dp,
                             ptrdiff_t lddp, const float *di)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c += UK_LANES) {
            float *d = dp + r * lddp + c;
            uk_store(d, uk_mul(uk_load(p + r * ldp + c), uk_sub(uk_load(d), uk_load(di + c))));
        }
}

/* transpose32 in blocks of 8 x 8 words, so that both sides touch few cache lines at a time. The
 * words go through memcpy: src may sit at any byte offset. */
static inline void uk_transpose32_generic(int rows, int cols, const void *src, ptrdiff_t lds,
                                          uint32_t *dst, ptrdiff_t ldd)
{
    const unsigned char *s = src;
    for (int r0 = 0; r0 < rows; r0 += 8)
        for (int c0 = 0; c0 < cols; c0 += 8) {
            const int r1 = rows - r0 < 8 ? rows : r0 + 8, c1 = cols - c0 < 8 ? cols : c0 + 8;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++)
                    memcpy(dst + c * ldd + r, s + r * lds + 4 * c, sizeof(uint32_t));
        }
}

/* store_f16 / store_bf16 through core/dtype.h, element by element: the definition the vector
 * versions must match. */
static inline void uk_store_f16_generic(int n, const float *src, float scale, uint16_t *dst)
{
    for (int i = 0; i < n; i++)
        dst[i] = fp_f32_to_f16(scale * src[i]);
}

static inline void uk_store_bf16_generic(int n, const float *src, float scale, uint16_t *dst)
{
    for (int i = 0; i < n; i++)
        dst[i] = fp_f32_to_bf16(scale * src[i]);
}

static void uk_scale_rows(int rows, int cols, float *x, ptrdiff_t ldx, const float *f)
{
    for (int r = 0; r < rows; r++) {
        if (f[r] == 1.0f) /* most rows once their maximum has settled */
            continue;
        const uk_vec fr = uk_set1(f[r]);
        for (int c = 0; c < cols; c += UK_LANES)
            uk_store(x + r * ldx + c, uk_mul(uk_load(x + r * ldx + c), fr));
    }
}

/* The storage of the K or V rows a decode step reads. */
enum { UK_ROW_F32, UK_ROW_F16, UK_ROW_BF16 };

static inline size_t uk_row_es(int kind)
{
    return kind == UK_ROW_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* Element e of a row of that kind, in f32. */
static inline float uk_elem(const void *row, int kind, int e)
{
    if (kind == UK_ROW_F16)
        return fp_f16_to_f32(((const uint16_t *)row)[e]);
    if (kind == UK_ROW_BF16)
        return fp_bf16_to_f32(((const uint16_t *)row)[e]);
    return ((const float *)row)[e];
}

/* UK_LANES elements of such a row from element e, in f32. */
static inline __attribute__((always_inline)) uk_vec uk_load_row(const void *row, int kind, int e)
{
#ifdef UK_HAS_LOAD_BF16
    if (kind == UK_ROW_BF16)
        return uk_load_bf16((const uint16_t *)row + e);
#endif
    return kind == UK_ROW_F16 ? uk_load_f16((const uint16_t *)row + e)
                              : uk_load((const float *)row + e);
}

/* One key of dec_scores (ukernel.h) on K rows of any kind: per kv head, rows in fours sharing
 * each load of the key's row (16-bit rows converted as they are loaded), one accumulator a row,
 * summed across its lanes at the end; the tail of d past the last whole vector is scalar. pc: the
 * call's prefetch schedule, a step a kv head (NULL: none). */
static inline __attribute__((always_inline)) void
uk_dec_scores_key(int heads, int rows, int d, const float *q, ptrdiff_t qhs, ptrdiff_t ldq,
                  const void *k, int kind, ptrdiff_t khs, float *s, ptrdiff_t shs, ptrdiff_t lds,
                  pf_cursor *pc)
{
    const int dv = d - d % UK_LANES;
    const size_t es = uk_row_es(kind);
    for (int h = 0; h < heads; h++) {
        if (pc)
            pf_step(pc);
        const void *kh = (const char *)k + (size_t)(h * khs) * es;
        const float *qh = q + h * qhs;
        float *sh = s + h * shs;
        for (int r0 = 0; r0 < rows; r0 += 4) {
            const int nr = rows - r0 < 4 ? rows - r0 : 4;
            uk_vec acc[4] = {uk_zero(), uk_zero(), uk_zero(), uk_zero()};
            for (int e = 0; e < dv; e += UK_LANES) {
                const uk_vec kv = uk_load_row(kh, kind, e);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
                    if (r < nr)
                        acc[r] = uk_madd(uk_load(qh + (r0 + r) * ldq + e), kv, acc[r]);
            }
            for (int r = 0; r < nr; r++) {
                float t = uk_hsum(acc[r]);
                for (int e = dv; e < d; e++)
                    t += qh[(r0 + r) * ldq + e] * uk_elem(kh, kind, e);
                sh[(r0 + r) * lds] = t;
            }
        }
    }
}

static void uk_dec_scores(int heads, int rows, int d, const float *q, ptrdiff_t qhs, ptrdiff_t ldq,
                          const float *k, ptrdiff_t khs, float *s, ptrdiff_t shs, ptrdiff_t lds)
{
    uk_dec_scores_key(heads, rows, d, q, qhs, ldq, k, UK_ROW_F32, khs, s, shs, lds, NULL);
}

/* dec_scores_f16 / _bf16_f32 (ukernel.h): dec_scores key by key over the block, the 16-bit
 * rows converted as they are loaded, the pf rows asked for a few lines a kv head. */
static inline __attribute__((always_inline)) void
uk_dec_scores_h16(int heads, int rows, int d, int keys, const float *q, ptrdiff_t qhs,
                  ptrdiff_t ldq, const uint16_t *const *k, int kind, ptrdiff_t khs, float *s,
                  ptrdiff_t shs, ptrdiff_t lds, const char *const *pf, int pf_rows, size_t pf_bytes)
{
    pf_cursor pc = pf_start(pf, pf_rows, pf_bytes, keys * heads);
    for (int i = 0; i < keys; i++)
        uk_dec_scores_key(heads, rows, d, q, qhs, ldq, k[i], kind, khs, s + i, shs, lds, &pc);
}

#ifndef UK_OWN_DEC_SCORES_F16 /* an ISA file may have its own */
static void uk_dec_scores_f16(int heads, int rows, int d, int keys, const float *q, ptrdiff_t qhs,
                              ptrdiff_t ldq, const uint16_t *const *k, ptrdiff_t khs, float *s,
                              ptrdiff_t shs, ptrdiff_t lds, const char *const *pf, int pf_rows,
                              size_t pf_bytes)
{
    uk_dec_scores_h16(heads, rows, d, keys, q, qhs, ldq, k, UK_ROW_F16, khs, s, shs, lds, pf,
                      pf_rows, pf_bytes);
}
#if defined(UK_HAS_LOAD_BF16)
static void uk_dec_scores_bf16_f32(int heads, int rows, int d, int keys, const float *q,
                                   ptrdiff_t qhs, ptrdiff_t ldq, const uint16_t *const *k,
                                   ptrdiff_t khs, float *s, ptrdiff_t shs, ptrdiff_t lds,
                                   const char *const *pf, int pf_rows, size_t pf_bytes)
{
    uk_dec_scores_h16(heads, rows, d, keys, q, qhs, ldq, k, UK_ROW_BF16, khs, s, shs, lds, pf,
                      pf_rows, pf_bytes);
}
#endif
#endif

/* dec_pv (ukernel.h) on V rows of any kind: per kv head, four rows by UK_PV_VECS vectors of o's
 * columns held in registers across all the keys, each key's vectors loaded once for the four rows
 * (16-bit rows converted as they are loaded); the tail of d past the last whole vector is
 * scalar. The same order of sums as one key at a time. */
enum { UK_PV_VECS = 4 };

static inline __attribute__((always_inline)) void
uk_dec_pv_rows(int heads, int rows, int d, int keys, const float *p, ptrdiff_t phs, ptrdiff_t ldp,
               const void *const *v, int kind, ptrdiff_t vhs, float *o, ptrdiff_t ohs,
               ptrdiff_t ldo, const char *const *pf, int pf_rows, size_t pf_bytes)
{
    const size_t es = uk_row_es(kind);
    const int dv = d - d % UK_LANES, chunk = UK_PV_VECS * UK_LANES;
    pf_cursor pc = pf_start(pf, pf_rows, pf_bytes,
                            heads * ((rows + 3) / 4) * ((dv + chunk - 1) / chunk) * keys);
    for (int h = 0; h < heads; h++)
        for (int r0 = 0; r0 < rows; r0 += 4) {
            const int nr = rows - r0 < 4 ? rows - r0 : 4;
            const float *ph = p + h * phs + r0 * ldp;
            float *oh = o + h * ohs + r0 * ldo;
            for (int e = 0; e < dv; e += chunk) {
                const int nv = (dv - e) / UK_LANES < UK_PV_VECS ? (dv - e) / UK_LANES : UK_PV_VECS;
                uk_vec acc[4][UK_PV_VECS];
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                    for (int g = 0; g < UK_PV_VECS; g++)
                        acc[r][g] =
                            r < nr && g < nv ? uk_load(oh + r * ldo + e + g * UK_LANES) : uk_zero();
                for (int i = 0; i < keys; i++) {
                    pf_step(&pc);
                    const void *vi = (const char *)v[i] + (size_t)(h * vhs) * es;
                    uk_vec vv[UK_PV_VECS];
#pragma GCC unroll 4
                    for (int g = 0; g < UK_PV_VECS; g++)
                        vv[g] = g < nv ? uk_load_row(vi, kind, e + g * UK_LANES) : uk_zero();
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++)
                        if (r < nr) {
                            const uk_vec pr = uk_set1(ph[r * ldp + i]);
#pragma GCC unroll 4
                            for (int g = 0; g < UK_PV_VECS; g++)
                                acc[r][g] = uk_madd(pr, vv[g], acc[r][g]);
                        }
                }
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                    for (int g = 0; g < UK_PV_VECS; g++)
                        if (r < nr && g < nv)
                            uk_store(oh + r * ldo + e + g * UK_LANES, acc[r][g]);
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

static void uk_dec_pv(int heads, int rows, int d, int keys, const float *p, ptrdiff_t phs,
                      ptrdiff_t ldp, const float *const *v, ptrdiff_t vhs, float *o, ptrdiff_t ohs,
                      ptrdiff_t ldo, const char *const *pf, int pf_rows, size_t pf_bytes)
{
    uk_dec_pv_rows(heads, rows, d, keys, p, phs, ldp, (const void *const *)v, UK_ROW_F32, vhs, o,
                   ohs, ldo, pf, pf_rows, pf_bytes);
}

#ifndef UK_OWN_DEC_PV_H16 /* an ISA file may have its own 16-bit forms */
static void uk_dec_pv_f16(int heads, int rows, int d, int keys, const float *p, ptrdiff_t phs,
                          ptrdiff_t ldp, const uint16_t *const *v, ptrdiff_t vhs, float *o,
                          ptrdiff_t ohs, ptrdiff_t ldo, const char *const *pf, int pf_rows,
                          size_t pf_bytes)
{
    uk_dec_pv_rows(heads, rows, d, keys, p, phs, ldp, (const void *const *)v, UK_ROW_F16, vhs, o,
                   ohs, ldo, pf, pf_rows, pf_bytes);
}

#if defined(UK_HAS_LOAD_BF16)
static void uk_dec_pv_bf16_f32(int heads, int rows, int d, int keys, const float *p, ptrdiff_t phs,
                               ptrdiff_t ldp, const uint16_t *const *v, ptrdiff_t vhs, float *o,
                               ptrdiff_t ohs, ptrdiff_t ldo, const char *const *pf, int pf_rows,
                               size_t pf_bytes)
{
    uk_dec_pv_rows(heads, rows, d, keys, p, phs, ldp, (const void *const *)v, UK_ROW_BF16, vhs, o,
                   ohs, ldo, pf, pf_rows, pf_bytes);
}
#endif
#endif
