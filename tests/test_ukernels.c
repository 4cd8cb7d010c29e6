/*
 * The CPU micro-kernel contract (backends/cpu/ukernel.h), checked entry by entry on every table
 * this build has and this CPU runs (scalar, avx2, avx512, avx512bf16, neon), against plain C:
 *   gemm          bit-exact against the sequential multiply-add chain p = 0 .. k-1 (the fixed
 *                 summation order the deterministic backward relies on), for ragged m, n, k,
 *                 strided and transposed A, overwrite and accumulate; A is surrounded by NaN so a
 *                 read outside its m x k elements shows, and C rows past m must stay untouched
 *   gemm_bf16     against exact f32 products summed in double (pair sums rounded in f32)
 *   exp2          relative error <= 4 ulp on [-126, 127], 2^0 == 1, 0 below -126 and for -inf,
 *                 NaN stays NaN; exp2_cols' sums; col_max
 *   exp2_cols_bf16   the exp2_cols values rounded to bf16, in pairs, the same sums
 *   round_bf16    both layouts bit for bit as core/dtype.h rounds (a denormal may give a zero of
 *                 its sign), NaN stays NaN, columns from cols on 0 whatever the source's padding
 *                 holds (NaN here), nothing written past the padded width or the last row; each
 *                 layout alone gives the same bits; present exactly where gemm_bf16 is
 *   transpose32   exact, from any byte offset (bf16 pairs sit on 2-byte boundaries), edges
 *                 of every size, nothing written outside the rows x cols block
 *   dec_scores, dec_pv (and their _bf16 forms where gemm_bf16 is): against products summed in
 *                 double, for ragged heads, rows, d and key counts; the rows of k and v are
 *                 followed by NaN and q's padding columns hold NaN, so a read past d shows;
 *                 dec_scores_f16 likewise, dec_pv_f16 bit for bit against dec_pv on the rows
 *                 converted to f32; the _bf16_f32 forms the same way on bf16 rows, where a table
 *                 has them (present in pairs)
 *   dec_row_max, dec_exp2_rows   where a table has them: maxima exact (NaN rows, -inf rows),
 *                 the exponentials bit for bit as exp2_cols makes them, the row sums, NaN padding
 *                 ignored and nothing written past n rounded up to 8
 *   gemm_rs       bit for bit as scale_rows then gemm (accumulate), C rows past m untouched
 *   softmax_cols  bit for bit as col_max, core/online_softmax.h's update with the factor by the
 *                 table's exp2, exp2_cols and l * alpha + the sums, on -inf and NaN columns, states
 *                 of -inf, above and below the block, mul > 0 and < 0; the return value
 *   interleave_bf16, dsoftmax_cols, scale_rows, cvt_f16, cvt_bf16 (every 16-bit pattern),
 *   store_f16, store_bf16 (bit for bit as core/dtype.h, NaN, infinities, denormals, overflow)
 * Then one end-to-end bf16 and f16 forward and backward with an odd head dim and odd sequence
 * lengths (bf16: K and V cannot be read in place, odd last pairs of dims, queries and keys) on
 * the default table, against the reference backend.
 */
#include "backends/cpu/ukernel.h"
#include "core/dtype.h"
#include "core/online_softmax.h"
#include "tests/test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LD(n) (((n) + FP_TILE_COLS - 1) / FP_TILE_COLS * FP_TILE_COLS)

static const char *table;
static int fma_table; /* products fused: the chain is fmaf, else multiply then add */

static float *alloc_f(size_t n)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static float chain_step(float a, float b, float c, int fused)
{
    if (fused)
        return fmaf(a, b, c);
    const float prod = a * b; /* a separate statement: never contracted */
    return prod + c;
}

/* Row m of a product's C, past its m rows, as it was before the call (ld words, bit for bit). */
static int row_untouched(const float *row, const float *before, int ld, const char *what, int m)
{
    for (int j = 0; j < ld; j++)
        if (!CHECK_MSG(memcmp(&row[j], &before[j], sizeof(float)) == 0,
                       "%s %s m=%d: wrote row %d, past the output", table, what, m, m))
            return 0;
    return 1;
}

static void check_gemm(const fp_ukernels *uk, tu_rng *rng)
{
    int bad = 0;
    for (int trial = 0; trial < 300 && !bad; trial++) {
        const int m = 1 + (int)(tu_rng_u32(rng) % 14), n = 1 + (int)(tu_rng_u32(rng) % 80);
        const int k = 1 + (int)(tu_rng_u32(rng) % 45), acc = (int)(tu_rng_u32(rng) % 2);
        const int trans = (int)(tu_rng_u32(rng) % 2), pad = (int)(tu_rng_u32(rng) % 5);
        /* A: m x k inside a NaN-filled buffer, row-major with a padded pitch, or transposed. */
        const ptrdiff_t rsa = trans ? 1 : k + pad, csa = trans ? m + pad : 1;
        const size_t a_elems = (size_t)(trans ? (m + pad) * k : (k + pad) * m) + 32;
        float *abuf = alloc_f(a_elems), *a = abuf + 16;
        for (size_t i = 0; i < a_elems; i++)
            abuf[i] = NAN;
        for (int r = 0; r < m; r++)
            for (int p = 0; p < k; p++)
                a[r * rsa + p * csa] = tu_rng_uniform(rng, -1.0f, 1.0f);
        const int ld = LD(n) + FP_TILE_COLS * (int)(tu_rng_u32(rng) % 2);
        float *b = alloc_f((size_t)k * ld), *c = alloc_f((size_t)(m + 1) * ld);
        for (int i = 0; i < k * ld; i++)
            b[i] = tu_rng_uniform(rng, -1.0f, 1.0f);
        for (int i = 0; i < (m + 1) * ld; i++)
            c[i] = tu_rng_uniform(rng, -1.0f, 1.0f);
        float *c0 = alloc_f((size_t)(m + 1) * ld);
        memcpy(c0, c, sizeof(float) * (size_t)(m + 1) * ld);
        uk->gemm(m, n, k, a, rsa, csa, b, ld, c, ld, acc);
        for (int r = 0; r < m && !bad; r++)
            for (int j = 0; j < n && !bad; j++) {
                float want = acc ? c0[r * ld + j] : 0.0f, other = want;
                for (int p = 0; p < k; p++) {
                    want = chain_step(a[r * rsa + p * csa], b[p * ld + j], want, fma_table);
                    other = chain_step(a[r * rsa + p * csa], b[p * ld + j], other, !fma_table);
                }
                const float got = c[r * ld + j];
                /* The portable table is plain C: a compiler may fuse its multiply-add. */
                const int ok = got == want || (!strcmp(table, "scalar") && got == other);
                bad = !CHECK_MSG(ok,
                                 "%s gemm m=%d n=%d k=%d acc=%d trans=%d: C[%d][%d] = %.9g, the "
                                 "sequential chain gives %.9g",
                                 table, m, n, k, acc, trans, r, j, (double)got, (double)want);
            }
        bad = bad || !row_untouched(c + m * ld, c0 + m * ld, ld, "gemm", m);
        free(abuf);
        free(b);
        free(c);
        free(c0);
    }
}

static uint16_t bf16_random(tu_rng *rng)
{
    return fp_f32_to_bf16(tu_rng_uniform(rng, -2.f, 2.f));
}

static void check_gemm_bf16(const fp_ukernels *uk, tu_rng *rng)
{
    int bad = 0;
    for (int trial = 0; trial < 200 && !bad; trial++) {
        const int m = 1 + (int)(tu_rng_u32(rng) % 14), n = 1 + (int)(tu_rng_u32(rng) % 80);
        const int kp = 1 + (int)(tu_rng_u32(rng) % 40), acc = (int)(tu_rng_u32(rng) % 2);
        const int trans = (int)(tu_rng_u32(rng) % 2);
        /* A pairs: row-major (pairs along a row) or transposed (a uint32 pair per element). */
        const ptrdiff_t rsa = trans ? 2 : 2 * kp + 2, csa = trans ? 2 * (m + 1) : 2;
        const size_t a_elems = (size_t)(trans ? 2 * (m + 1) * kp : (2 * kp + 2) * m);
        uint16_t *a = malloc(a_elems * sizeof(uint16_t));
        const int ld = LD(n);
        uint32_t *b = malloc(sizeof(uint32_t) * (size_t)kp * ld);
        float *c = alloc_f((size_t)m * ld), *c0 = alloc_f((size_t)m * ld);
        if (!CHECK(a && b))
            return;
        for (size_t i = 0; i < a_elems; i++)
            a[i] = bf16_random(rng);
        for (int i = 0; i < kp * ld; i++)
            b[i] = (uint32_t)bf16_random(rng) | (uint32_t)bf16_random(rng) << 16;
        for (int i = 0; i < m * ld; i++)
            c[i] = c0[i] = tu_rng_uniform(rng, -1.0f, 1.0f);
        uk->gemm_bf16(m, n, kp, a, rsa, csa, b, ld, c, ld, acc);
        for (int r = 0; r < m && !bad; r++)
            for (int j = 0; j < n && !bad; j++) {
                double want = acc ? c0[r * ld + j] : 0.0, mag = fabs(want);
                for (int p = 0; p < kp; p++) {
                    const uint16_t *ap = a + r * rsa + p * csa;
                    const uint32_t bp = b[p * ld + j];
                    const double t0 = (double)fp_bf16_to_f32(ap[0]) *
                                      (double)fp_bf16_to_f32((uint16_t)(bp & 0xffffu));
                    const double t1 = (double)fp_bf16_to_f32(ap[1]) *
                                      (double)fp_bf16_to_f32((uint16_t)(bp >> 16));
                    want += t0 + t1;
                    mag += fabs(t0) + fabs(t1);
                }
                const double err = fabs((double)c[r * ld + j] - want);
                bad = !CHECK_MSG(err <= 2.0 * (kp + 1) * 0x1p-24 * mag,
                                 "%s gemm_bf16 m=%d n=%d kp=%d acc=%d trans=%d: C[%d][%d] = %.9g, "
                                 "want %.9g",
                                 table, m, n, kp, acc, trans, r, j, (double)c[r * ld + j], want);
            }
        free(a);
        free(b);
        free(c);
        free(c0);
    }
}

/* Element i of a row of the decode steps' operands, f32 or bf16. */
static double dec_elem(const void *x, size_t i, int bf16)
{
    return bf16 ? (double)fp_bf16_to_f32(((const uint16_t *)x)[i]) : (double)((const float *)x)[i];
}

static void dec_fill(void *x, size_t i, double value, int bf16)
{
    if (bf16)
        ((uint16_t *)x)[i] = fp_f32_to_bf16((float)value);
    else
        ((float *)x)[i] = (float)value;
}

/* dec_scores and dec_pv (bf16: their _bf16 forms; dec_pv and dec_scores_bf16 over up to DEC_KEYS
 * keys) against sums in double. Operands live in f32 or uint16 buffers of `es` bytes an element; k
 * and v rows of d elements are followed by NaN, and q's padding columns are NaN, so that any
 * element read past d poisons a result. */
enum { DEC_KEYS = 11 };

static void check_decode_steps(const fp_ukernels *uk, tu_rng *rng, int bf16)
{
    int bad = 0;
    const size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int trial = 0; trial < 200 && !bad; trial++) {
        const int heads = 1 + (int)(tu_rng_u32(rng) % 3), rows = 1 + (int)(tu_rng_u32(rng) % 9);
        const int d = 1 + (int)(tu_rng_u32(rng) % 150);
        const int keys = 1 + (int)(tu_rng_u32(rng) % DEC_KEYS);
        const int skeys = bf16 ? keys : 1; /* keys of the scores step */
        const int ldq = LD(d) * (bf16 ? 2 : 1), ldo = LD(d), ldp = LD(DEC_KEYS + 1), lds = ldp;
        const ptrdiff_t khs = d + 7, qhs = (ptrdiff_t)rows * ldq, ohs = (ptrdiff_t)rows * ldo;
        const size_t kn = (size_t)heads * (size_t)khs + 16, qn = (size_t)heads * (size_t)qhs;
        char *q = malloc(qn * es), *k[DEC_KEYS], *v[DEC_KEYS], *p;
        float *s = alloc_f((size_t)heads * rows * lds), *o = alloc_f((size_t)heads * ohs);
        int ok = q && s && o;
        p = malloc((size_t)heads * rows * ldp * es);
        for (int i = 0; i < DEC_KEYS; i++) {
            k[i] = malloc(kn * es);
            v[i] = malloc(kn * es);
            ok = ok && k[i] && v[i];
        }
        if (!CHECK(ok && p))
            return;
        for (size_t i = 0; i < qn; i++)
            dec_fill(q, i, (int)(i % ldq) < d ? tu_rng_uniform(rng, -1.0f, 1.0f) : NAN, bf16);
        for (size_t i = 0; i < kn; i++) {
            const int in_row = (ptrdiff_t)(i % khs) < d && i < (size_t)heads * khs;
            for (int j = 0; j < DEC_KEYS; j++) {
                dec_fill(k[j], i, in_row ? tu_rng_uniform(rng, -1.0f, 1.0f) : NAN, bf16);
                dec_fill(v[j], i, in_row ? tu_rng_uniform(rng, -1.0f, 1.0f) : NAN, bf16);
            }
        }
        for (int i = 0; i < heads * rows * ldp; i++) /* P: keys values, then zeros */
            dec_fill(p, (size_t)i, i % ldp < keys ? tu_rng_uniform(rng, 0.0f, 1.0f) : 0.0, bf16);
        for (int i = 0; i < heads * ohs; i++)
            o[i] = tu_rng_uniform(rng, -1.0f, 1.0f);
        float *o0 = alloc_f((size_t)heads * ohs);
        memcpy(o0, o, sizeof(float) * (size_t)heads * ohs);
        if (bf16) {
            const uint16_t *kk[DEC_KEYS], *vv[DEC_KEYS];
            const char *pf[DEC_KEYS]; /* prefetch hints on odd trials (the next rows: k's) */
            for (int i = 0; i < DEC_KEYS; i++) {
                kk[i] = (const uint16_t *)k[i];
                vv[i] = (const uint16_t *)v[i];
                pf[i] = k[i];
            }
            const size_t pf_bytes = trial % 2 ? kn * es : 0;
            uk->dec_scores_bf16(heads, rows, d, skeys, (uint16_t *)q, qhs, ldq, kk, khs, s,
                                (ptrdiff_t)rows * lds, lds, pf_bytes ? pf : NULL, keys, pf_bytes);
            uk->dec_pv_bf16(heads, rows, d, keys, (uint16_t *)p, (ptrdiff_t)rows * ldp, ldp, vv,
                            khs, o, ohs, ldo, pf_bytes ? pf : NULL, keys, pf_bytes);
        } else {
            const float *vv[DEC_KEYS];
            const char *pf[DEC_KEYS];
            for (int i = 0; i < DEC_KEYS; i++) {
                vv[i] = (const float *)v[i];
                pf[i] = k[i];
            }
            const size_t pf_bytes = trial % 2 ? kn * es : 0;
            uk->dec_scores(heads, rows, d, (float *)q, qhs, ldq, (float *)k[0], khs, s,
                           (ptrdiff_t)rows * lds, lds);
            uk->dec_pv(heads, rows, d, keys, (float *)p, (ptrdiff_t)rows * ldp, ldp, vv, khs, o,
                       ohs, ldo, pf_bytes ? pf : NULL, keys, pf_bytes);
        }
        for (int h = 0; h < heads && !bad; h++)
            for (int r = 0; r < rows && !bad; r++) {
                for (int i = 0; i < skeys && !bad; i++) {
                    double want = 0.0, mag = 0.0;
                    for (int e = 0; e < d; e++) {
                        const double t = dec_elem(q, (size_t)(h * qhs + r * ldq + e), bf16) *
                                         dec_elem(k[i], (size_t)(h * khs + e), bf16);
                        want += t;
                        mag += fabs(t);
                    }
                    const double got = s[(h * rows + r) * lds + i];
                    bad = !CHECK_MSG(fabs(got - want) <= 2.0 * (d + 1) * 0x1p-24 * mag,
                                     "%s dec_scores%s heads=%d rows=%d d=%d keys=%d: "
                                     "s[%d][%d][%d] = %.9g, want %.9g",
                                     table, bf16 ? "_bf16" : "", heads, rows, d, skeys, h, r, i,
                                     got, want);
                }
                for (int e = 0; e < d && !bad; e++) {
                    double w = o0[h * ohs + r * ldo + e], m = fabs(w);
                    for (int i = 0; i < keys; i++) {
                        const double t = dec_elem(p, (size_t)((h * rows + r) * ldp + i), bf16) *
                                         dec_elem(v[i], (size_t)(h * khs + e), bf16);
                        w += t;
                        m += fabs(t);
                    }
                    const double g = o[h * ohs + r * ldo + e];
                    bad =
                        !CHECK_MSG(fabs(g - w) <= 2.0 * (keys + 1) * 0x1p-24 * m,
                                   "%s dec_pv%s heads=%d rows=%d d=%d keys=%d: o[%d][%d][%d] "
                                   "= %.9g, want %.9g",
                                   table, bf16 ? "_bf16" : "", heads, rows, d, keys, h, r, e, g, w);
                }
            }
        free(q);
        free(p);
        for (int i = 0; i < DEC_KEYS; i++) {
            free(k[i]);
            free(v[i]);
        }
        free(s);
        free(o);
        free(o0);
    }
}

/* dec_scores_f16 against sums in double, dec_pv_f16 bit for bit against dec_pv on the same rows
 * converted to f32 (the contract: the same sums), for ragged heads, rows, d and key counts, with
 * and without prefetch hints; bf16: the _bf16_f32 forms. The 16-bit rows of d elements are
 * followed by NaN, so a read past d poisons a result. */
static void check_decode_h16(const fp_ukernels *uk, tu_rng *rng, int bf16)
{
    const char *form = bf16 ? "_bf16_f32" : "_f16";
    const uint16_t nan16 = bf16 ? 0x7fc0 : 0x7e00;
    if (!CHECK_MSG(!uk->dec_scores_bf16_f32 == !uk->dec_pv_bf16_f32,
                   "%s: dec_scores_bf16_f32 and dec_pv_bf16_f32 not present together", table) ||
        (bf16 && !uk->dec_scores_bf16_f32))
        return;
    int bad = 0;
    for (int trial = 0; trial < 100 && !bad; trial++) {
        const int heads = 1 + (int)(tu_rng_u32(rng) % 3), rows = 1 + (int)(tu_rng_u32(rng) % 9);
        const int d = 1 + (int)(tu_rng_u32(rng) % 150);
        const int keys = 1 + (int)(tu_rng_u32(rng) % DEC_KEYS);
        const int ldq = LD(d), ldo = LD(d), ldp = LD(DEC_KEYS + 1), lds = ldp;
        const ptrdiff_t khs = d + 7, qhs = (ptrdiff_t)rows * ldq, ohs = (ptrdiff_t)rows * ldo;
        const size_t kn = (size_t)heads * (size_t)khs + 16, qn = (size_t)heads * (size_t)qhs;
        const size_t sn = (size_t)heads * rows * lds, on = (size_t)heads * ohs;
        float *q = alloc_f(qn), *p = alloc_f((size_t)heads * rows * ldp);
        float *s = alloc_f(sn), *s16 = alloc_f(sn), *o = alloc_f(on), *o16 = alloc_f(on);
        uint16_t *k[DEC_KEYS], *v[DEC_KEYS];
        float *kf[DEC_KEYS], *vf[DEC_KEYS];
        int ok = q && p && s && s16 && o && o16;
        for (int i = 0; i < DEC_KEYS; i++) {
            k[i] = malloc(kn * sizeof(uint16_t));
            v[i] = malloc(kn * sizeof(uint16_t));
            kf[i] = alloc_f(kn);
            vf[i] = alloc_f(kn);
            ok = ok && k[i] && v[i] && kf[i] && vf[i];
        }
        if (!CHECK(ok))
            return;
        for (size_t i = 0; i < qn; i++)
            q[i] = (int)(i % ldq) < d ? tu_rng_uniform(rng, -1.0f, 1.0f) : NAN;
        for (size_t i = 0; i < kn; i++) {
            const int in_row = (ptrdiff_t)(i % khs) < d && i < (size_t)heads * khs;
            for (int j = 0; j < DEC_KEYS; j++) {
                const float x = tu_rng_uniform(rng, -1.0f, 1.0f),
                            y = tu_rng_uniform(rng, -1.0f, 1.0f);
                k[j][i] = !in_row ? nan16 : bf16 ? fp_f32_to_bf16(x) : fp_f32_to_f16(x);
                v[j][i] = !in_row ? nan16 : bf16 ? fp_f32_to_bf16(y) : fp_f32_to_f16(y);
                kf[j][i] = bf16 ? fp_bf16_to_f32(k[j][i]) : fp_f16_to_f32(k[j][i]);
                vf[j][i] = bf16 ? fp_bf16_to_f32(v[j][i]) : fp_f16_to_f32(v[j][i]);
            }
        }
        for (int i = 0; i < heads * rows * ldp; i++)
            p[i] = i % ldp < keys ? tu_rng_uniform(rng, 0.0f, 1.0f) : 0.0f;
        for (size_t i = 0; i < on; i++)
            o[i] = o16[i] = tu_rng_uniform(rng, -1.0f, 1.0f);
        memset(s, 0, sizeof(float) * sn);
        memset(s16, 0, sizeof(float) * sn);
        const uint16_t *kk[DEC_KEYS], *vv[DEC_KEYS];
        const float *vvf[DEC_KEYS];
        const char *pf[DEC_KEYS]; /* prefetch hints on odd trials */
        for (int i = 0; i < DEC_KEYS; i++) {
            kk[i] = k[i];
            vv[i] = v[i];
            vvf[i] = vf[i];
            pf[i] = (const char *)k[i];
        }
        const size_t pf_bytes = trial % 2 ? kn * sizeof(uint16_t) : 0;
        for (int i = 0; i < keys; i++)
            uk->dec_scores(heads, rows, d, q, qhs, ldq, kf[i], khs, s + i, (ptrdiff_t)rows * lds,
                           lds);
        (bf16 ? uk->dec_scores_bf16_f32 : uk->dec_scores_f16)(heads, rows, d, keys, q, qhs, ldq, kk,
                                                              khs, s16, (ptrdiff_t)rows * lds, lds,
                                                              pf_bytes ? pf : NULL, keys, pf_bytes);
        uk->dec_pv(heads, rows, d, keys, p, (ptrdiff_t)rows * ldp, ldp, vvf, khs, o, ohs, ldo, NULL,
                   0, 0);
        (bf16 ? uk->dec_pv_bf16_f32 : uk->dec_pv_f16)(heads, rows, d, keys, p,
                                                      (ptrdiff_t)rows * ldp, ldp, vv, khs, o16, ohs,
                                                      ldo, pf_bytes ? pf : NULL, keys, pf_bytes);
        for (int h = 0; h < heads && !bad; h++)
            for (int r = 0; r < rows && !bad; r++) {
                for (int i = 0; i < keys && !bad; i++) {
                    const size_t at = (size_t)(h * rows + r) * lds + (size_t)i;
                    double want = 0.0, mag = 0.0;
                    for (int e = 0; e < d; e++) {
                        const double t = (double)q[h * qhs + r * ldq + e] * kf[i][h * khs + e];
                        want += t;
                        mag += fabs(t);
                    }
                    bad = !CHECK_MSG(fabs(s16[at] - want) <= 2.0 * (d + 1) * 0x1p-24 * mag,
                                     "%s dec_scores%s heads=%d rows=%d d=%d keys=%d: "
                                     "s[%d][%d][%d] = %.9g, want %.9g (dec_scores %.9g)",
                                     table, form, heads, rows, d, keys, h, r, i, (double)s16[at],
                                     want, (double)s[at]);
                }
                for (int e = 0; e < d && !bad; e++) {
                    const size_t at = (size_t)(h * ohs + r * ldo + e);
                    bad = !CHECK_MSG(memcmp(&o[at], &o16[at], sizeof(float)) == 0,
                                     "%s dec_pv%s heads=%d rows=%d d=%d keys=%d: o[%d][%d][%d] "
                                     "= %.9g, dec_pv %.9g",
                                     table, form, heads, rows, d, keys, h, r, e, (double)o16[at],
                                     (double)o[at]);
                }
            }
        for (int i = 0; i < DEC_KEYS; i++) {
            free(k[i]);
            free(v[i]);
            free(kf[i]);
            free(vf[i]);
        }
        free(q);
        free(p);
        free(s);
        free(s16);
        free(o);
        free(o16);
    }
}

/* The expected bf16 of x for round_bf16: core/dtype.h's, or a zero of x's sign for a denormal. */
static int round_ok(float x, uint16_t got)
{
    const uint32_t u = fp_f32_bits(x);
    if (x != x)
        return (got & 0x7f80u) == 0x7f80u && (got & 0x7fu) != 0;
    if ((u & 0x7f800000u) == 0 && got == (uint16_t)((u >> 16) & 0x8000u))
        return 1;
    return got == fp_f32_to_bf16(x);
}

static void check_round_bf16(const fp_ukernels *uk, tu_rng *rng)
{
    int bad = 0;
    for (int trial = 0; trial < 200 && !bad; trial++) {
        const int rows = 1 + (int)(tu_rng_u32(rng) % 70), cols = 1 + (int)(tu_rng_u32(rng) % 70);
        const int prs = (rows + 1) / 2, lds = LD(cols), ld = LD(cols) + FP_TILE_COLS;
        float *src = alloc_f((size_t)rows * lds);
        uint16_t *dst = malloc(sizeof(uint16_t) * (size_t)(rows + 1) * ld);
        uint16_t *dst1 = malloc(sizeof(uint16_t) * (size_t)(rows + 1) * ld);
        uint32_t *pairs = malloc(sizeof(uint32_t) * (size_t)(prs + 1) * ld);
        uint32_t *pairs1 = malloc(sizeof(uint32_t) * (size_t)(prs + 1) * ld);
        if (!CHECK(dst && dst1 && pairs && pairs1))
            return;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < lds; c++) {
                const uint32_t kind = tu_rng_u32(rng) % 8;
                float x = tu_rng_uniform(rng, -3.0f, 3.0f);
                if (kind == 1) /* bf16 halfway */
                    x = fp_bits_f32((fp_f32_bits(x) & 0xffff0000u) | 0x8000u);
                if (kind == 2) /* denormal */
                    x = fp_bits_f32(tu_rng_u32(rng) & 0x807fffffu);
                if (kind == 3)
                    x = 1e-3f * x;
                src[r * lds + c] = c < cols ? x : NAN;
            }
        src[0] = NAN;
        for (int i = 0; i < (rows + 1) * ld; i++)
            dst[i] = dst1[i] = 0xdeadu;
        for (int i = 0; i < (prs + 1) * ld; i++)
            pairs[i] = pairs1[i] = 0xdeadbeefu;
        uk->round_bf16(rows, cols, src, lds, dst, ld, pairs, ld);
        for (int r = 0; r <= rows && !bad; r++)
            for (int c = 0; c < ld && !bad; c++) {
                const uint16_t got = dst[r * ld + c];
                const int ok = r == rows || c >= lds ? got == 0xdeadu
                               : c >= cols           ? got == 0
                                                     : round_ok(src[r * lds + c], got);
                bad = !CHECK_MSG(ok, "%s round_bf16 %d x %d rows: (%d, %d) = %04x from %a", table,
                                 rows, cols, r, c, got,
                                 r < rows && c < lds ? (double)src[r * lds + c] : 0.0);
            }
        for (int r2 = 0; r2 <= prs && !bad; r2++)
            for (int c = 0; c < ld && !bad; c++) {
                const uint32_t got = pairs[r2 * ld + c];
                int ok = 1;
                if (r2 == prs || c >= lds)
                    ok = got == 0xdeadbeefu;
                else
                    for (int h = 0; h < 2; h++) {
                        const int r = 2 * r2 + h;
                        const uint16_t half = (uint16_t)(h ? got >> 16 : got & 0xffffu);
                        ok &= r >= rows || c >= cols ? half == 0 : round_ok(src[r * lds + c], half);
                    }
                bad = !CHECK_MSG(ok, "%s round_bf16 %d x %d pairs: (%d, %d) = %08x", table, rows,
                                 cols, r2, c, got);
            }
        /* Each layout alone: the same bits. */
        uk->round_bf16(rows, cols, src, lds, dst1, ld, NULL, 0);
        uk->round_bf16(rows, cols, src, lds, NULL, 0, pairs1, ld);
        bad = bad ||
              !CHECK_MSG(memcmp(dst, dst1, sizeof(uint16_t) * (size_t)(rows + 1) * ld) == 0 &&
                             memcmp(pairs, pairs1, sizeof(uint32_t) * (size_t)(prs + 1) * ld) == 0,
                         "%s round_bf16 %d x %d: one layout alone differs", table, rows, cols);
        free(src);
        free(dst);
        free(dst1);
        free(pairs);
        free(pairs1);
    }
}

/* exp2 through exp2_cols (mul = 1, sub = 0) on `count` values, one row of a 16-wide tile each. */
static void exp2_values(const fp_ukernels *uk, const float *x, float *out, int count)
{
    float sub[FP_TILE_COLS] = {0}, tile[FP_TILE_COLS];
    for (int i = 0; i < count; i += FP_TILE_COLS) {
        for (int j = 0; j < FP_TILE_COLS; j++)
            tile[j] = i + j < count ? x[i + j] : 0.0f;
        uk->exp2_cols(1, FP_TILE_COLS, tile, FP_TILE_COLS, 1.0f, sub, NULL);
        for (int j = 0; j < FP_TILE_COLS && i + j < count; j++)
            out[i + j] = tile[j];
    }
}

static void check_exp2(const fp_ukernels *uk)
{
    enum { N = 270001 };
    float *x = alloc_f(N + 8), *y = alloc_f(N + 8);
    for (int i = 0; i < N; i++)
        x[i] = -130.0f + 260.0f * (float)i / (float)(N - 1); /* [-130, 130] */
    const float special[8] = {-INFINITY, NAN, 0.0f, -126.0f, -126.00002f, 127.0f, -0.5f, 0.5f};
    memcpy(x + N, special, sizeof special);
    exp2_values(uk, x, y, N + 8);
    double worst = 0.0;
    int bad = 0;
    for (int i = 0; i < N && !bad; i++) {
        if (x[i] > 127.0f)
            continue; /* outside the contract */
        if (x[i] < -126.0f) {
            bad = !CHECK_MSG(y[i] == 0.0f, "%s exp2(%.9g) = %.9g, want 0 below -126", table,
                             (double)x[i], (double)y[i]);
            continue;
        }
        const double want = exp2((double)x[i]), rel = fabs((double)y[i] - want) / want;
        worst = rel > worst ? rel : worst;
        bad = !CHECK_MSG(rel <= 4.0 * 0x1p-24, "%s exp2(%.9g) = %.9g, want %.9g", table,
                         (double)x[i], (double)y[i], want);
    }
    CHECK_MSG(y[N] == 0.0f, "%s exp2(-inf) = %g", table, (double)y[N]);
    CHECK_MSG(y[N + 1] != y[N + 1], "%s exp2(NaN) = %g", table, (double)y[N + 1]);
    CHECK_MSG(y[N + 2] == 1.0f, "%s exp2(0) = %.9g", table, (double)y[N + 2]);
    CHECK_MSG(y[N + 3] == 0x1p-126f, "%s exp2(-126) = %g", table, (double)y[N + 3]);
    CHECK_MSG(y[N + 4] == 0.0f, "%s exp2(just below -126) = %g", table, (double)y[N + 4]);
    printf("  %s exp2: max relative error %.2f ulp on [-126, 127]\n", table, worst / 0x1p-24);
    free(x);
    free(y);
}

static void check_softmax_ops(const fp_ukernels *uk, tu_rng *rng)
{
    for (int trial = 0; trial < 40; trial++) {
        const int rows = 1 + (int)(tu_rng_u32(rng) % 70), cols = 1 + (int)(tu_rng_u32(rng) % 70);
        const int ld = LD(cols);
        float *s = alloc_f((size_t)rows * ld), *s2 = alloc_f((size_t)rows * ld);
        float *mx = alloc_f((size_t)ld), *sub = alloc_f((size_t)ld);
        float *sum = alloc_f((size_t)ld), *sum2 = alloc_f((size_t)ld);
        for (int i = 0; i < rows * ld; i++)
            s[i] = (tu_rng_u32(rng) % 9 == 0) ? -INFINITY : tu_rng_uniform(rng, -20.0f, 20.0f);
        memcpy(s2, s, sizeof(float) * (size_t)rows * ld);
        for (int c = 0; c < ld; c++)
            mx[c] = -INFINITY;
        uk->col_max(rows, cols, s, ld, mx);
        for (int c = 0; c < cols; c++) {
            float want = -INFINITY;
            for (int r = 0; r < rows; r++)
                want = s[r * ld + c] > want ? s[r * ld + c] : want;
            CHECK_MSG(mx[c] == want, "%s col_max rows=%d column %d: %g, want %g", table, rows, c,
                      (double)mx[c], (double)want);
            sub[c] = want == -INFINITY ? 0.0f : want * 0.3f;
            sum[c] = sum2[c] = 1.0f;
        }
        for (int c = cols; c < ld; c++)
            sub[c] = sum[c] = sum2[c] = 0.0f;
        uk->exp2_cols(rows, cols, s, ld, 0.3f, sub, sum);
        int bad = 0;
        for (int c = 0; c < cols && !bad; c++) {
            double want_sum = 1.0;
            for (int r = 0; r < rows && !bad; r++) {
                const double x = (double)s2[r * ld + c] * 0.3 - sub[c];
                const double want = s2[r * ld + c] == -INFINITY ? 0.0 : exp2(x);
                want_sum += (double)s[r * ld + c];
                bad = !CHECK_MSG(fabs(s[r * ld + c] - want) <= 2e-6 * want + 1e-30,
                                 "%s exp2_cols (%d, %d): %.9g, want %.9g", table, r, c,
                                 (double)s[r * ld + c], want);
            }
            bad = bad || !CHECK_MSG(fabs(sum[c] - want_sum) <= 1e-5 * want_sum,
                                    "%s exp2_cols sum of column %d: %.9g, want %.9g", table, c,
                                    (double)sum[c], want_sum);
        }
        if (uk->exp2_cols_bf16) {
            const int prs = (rows + 1) / 2;
            uint32_t *pairs = malloc(sizeof(uint32_t) * (size_t)prs * ld);
            if (!CHECK(pairs))
                return;
            uk->exp2_cols_bf16(rows, cols, s2, ld, 0.3f, sub, sum2, pairs, ld);
            for (int c = 0; c < cols && !bad; c++) {
                bad = !CHECK_MSG(sum2[c] == sum[c], "%s exp2_cols_bf16 sum %d: %.9g vs %.9g", table,
                                 c, (double)sum2[c], (double)sum[c]);
                for (int r = 0; r < 2 * prs && !bad; r++) {
                    const uint32_t pr = pairs[(r / 2) * ld + c];
                    const uint16_t got = (uint16_t)(r % 2 ? pr >> 16 : pr & 0xffffu);
                    const uint16_t want = r < rows ? fp_f32_to_bf16(s[r * ld + c]) : 0;
                    bad = !CHECK_MSG(got == want, "%s exp2_cols_bf16 (%d, %d): %04x, want %04x",
                                     table, r, c, got, want);
                }
            }
            free(pairs);
        }
        /* dsoftmax_cols and scale_rows, exact: one subtraction and one multiplication. */
        float *dp = alloc_f((size_t)rows * ld), *dp0 = alloc_f((size_t)rows * ld);
        for (int i = 0; i < rows * ld; i++)
            dp[i] = dp0[i] = tu_rng_uniform(rng, -1.0f, 1.0f);
        uk->dsoftmax_cols(rows, cols, s, ld, dp, ld, mx);
        for (int r = 0; r < rows && !bad; r++)
            for (int c = 0; c < cols && !bad; c++) {
                const float want = s[r * ld + c] * (dp0[r * ld + c] - mx[c]);
                bad = !CHECK_MSG(memcmp(&dp[r * ld + c], &want, sizeof want) == 0,
                                 "%s dsoftmax_cols (%d, %d)", table, r, c);
            }
        float *f = alloc_f((size_t)rows);
        for (int r = 0; r < rows; r++)
            f[r] = r % 3 ? tu_rng_uniform(rng, 0.0f, 1.0f) : 1.0f;
        memcpy(dp, dp0, sizeof(float) * (size_t)rows * ld);
        uk->scale_rows(rows, cols, dp, ld, f);
        for (int r = 0; r < rows && !bad; r++)
            for (int c = 0; c < cols && !bad; c++)
                bad = !CHECK_MSG(dp[r * ld + c] == dp0[r * ld + c] * f[r], "%s scale_rows (%d, %d)",
                                 table, r, c);
        free(s);
        free(s2);
        free(mx);
        free(sub);
        free(sum);
        free(sum2);
        free(dp);
        free(dp0);
        free(f);
    }
}

/* The forward's fused steps against the unfused ones (ukernel.h: the same bits). */
static void check_fwd_fused(const fp_ukernels *uk, tu_rng *rng)
{
    if (!CHECK_MSG(uk->gemm_rs && uk->softmax_cols, "%s: gemm_rs or softmax_cols missing", table))
        return;
    int bad = 0;
    /* The portable table is plain C: a compiler may fuse a multiply into the next add. */
    const float tol = strcmp(table, "scalar") ? 0.0f : 1e-6f;
    for (int trial = 0; trial < 200 && !bad; trial++) {
        const int m = 1 + (int)(tu_rng_u32(rng) % 20), n = 1 + (int)(tu_rng_u32(rng) % 140);
        const int k = 1 + (int)(tu_rng_u32(rng) % 70), lda = m + (int)(tu_rng_u32(rng) % 3);
        const int ld = LD(n);
        float *a = alloc_f((size_t)k * lda), *b = alloc_f((size_t)k * ld);
        float *c = alloc_f((size_t)(m + 1) * ld), *c0 = alloc_f((size_t)(m + 1) * ld);
        float *f = alloc_f((size_t)m);
        for (int i = 0; i < k * lda; i++)
            a[i] = tu_rng_uniform(rng, 0.0f, 1.0f);
        for (int i = 0; i < k * ld; i++)
            b[i] = tu_rng_uniform(rng, -1.0f, 1.0f);
        for (int i = 0; i < (m + 1) * ld; i++)
            c[i] = c0[i] = tu_rng_uniform(rng, -2.0f, 2.0f);
        for (int r = 0; r < m; r++)
            f[r] = r % 3 == 0 ? 1.0f : r % 5 == 1 ? 0.0f : tu_rng_uniform(rng, 0.0f, 1.0f);
        /* A as P^T read as P (rows 1 apart), as flash_fwd.c passes it. */
        uk->gemm_rs(m, n, k, a, 1, lda, b, ld, c, ld, f);
        uk->scale_rows(m, n, c0, ld, f);
        uk->gemm(m, n, k, a, 1, lda, b, ld, c0, ld, 1);
        for (int r = 0; r < m && !bad; r++)
            for (int j = 0; j < n && !bad; j++) {
                const float got = c[r * ld + j], want = c0[r * ld + j];
                bad = !CHECK_MSG(got == want || fabsf(got - want) <= tol * fabsf(want),
                                 "%s gemm_rs m=%d n=%d k=%d: C[%d][%d] = %.9g, scale_rows + "
                                 "gemm give %.9g",
                                 table, m, n, k, r, j, (double)got, (double)want);
            }
        bad = bad || !row_untouched(c + m * ld, c0 + m * ld, ld, "gemm_rs", m);
        free(a);
        free(b);
        free(c);
        free(c0);
        free(f);
    }
    for (int trial = 0; trial < 60 && !bad; trial++) {
        const int rows = 1 + (int)(tu_rng_u32(rng) % 70);
        const int cols = FP_TILE_COLS * (1 + (int)(tu_rng_u32(rng) % 4)), ld = cols;
        const float mul = trial % 7 == 3 ? -0.2f : trial % 5 == 0 ? 1.0f : 0.18f;
        float *s = alloc_f((size_t)rows * ld), *s0 = alloc_f((size_t)rows * ld);
        float *m = alloc_f((size_t)ld), *l = alloc_f((size_t)ld), *alpha = alloc_f((size_t)ld);
        float *m0 = alloc_f((size_t)ld), *l0 = alloc_f((size_t)ld), *a0 = alloc_f((size_t)ld);
        float *mx = alloc_f((size_t)ld), *sub = alloc_f((size_t)ld), *sum = alloc_f((size_t)ld);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                float x = tu_rng_uniform(rng, -40.0f, 40.0f);
                if (c % 11 == 4 || tu_rng_u32(rng) % 9 == 0)
                    x = -INFINITY; /* column 4 (and 15, ...): all masked */
                if (c == 9 && r == rows / 2)
                    x = NAN;
                s[r * ld + c] = s0[r * ld + c] = x;
            }
        for (int c = 0; c < cols; c++) {
            const int kind = (int)(tu_rng_u32(rng) % 4);
            m[c] = m0[c] = kind == 0   ? -INFINITY
                           : kind == 1 ? 100.0f /* above every block maximum */
                                       : tu_rng_uniform(rng, -8.0f, 8.0f);
            l[c] = l0[c] = kind == 0 ? 0.0f : tu_rng_uniform(rng, 0.5f, 30.0f);
            mx[c] = -INFINITY;
        }
        const int got_rescale = uk->softmax_cols(rows, cols, s, ld, mul, m, l, alpha);
        uk->col_max(rows, cols, s0, ld, mx);
        float dm[4 * FP_TILE_COLS];
        for (int c = 0; c < cols; c++) {
            fp_softmax_state t = {m0[c], l0[c]};
            const float bm = mx[c] * mul;
            dm[c] = bm > t.m ? t.m - bm : 0.0f;
            t.m = bm > t.m ? bm : t.m;
            m0[c] = t.m;
            sub[c] = fp_softmax_exp_base(&t);
            sum[c] = 0.0f;
        }
        exp2_values(uk, dm, a0, cols);
        uk->exp2_cols(rows, cols, s0, ld, mul, sub, sum);
        int want_rescale = 0;
        for (int c = 0; c < cols; c++) {
            l0[c] = l0[c] * a0[c] + sum[c];
            want_rescale |= a0[c] != 1.0f;
        }
        CHECK_MSG(!got_rescale == !want_rescale, "%s softmax_cols returned %d, alpha says %d",
                  table, got_rescale, want_rescale);
        bad = memcmp(s, s0, sizeof(float) * (size_t)rows * ld) != 0 ||
              memcmp(m, m0, sizeof(float) * (size_t)cols) != 0 ||
              memcmp(alpha, a0, sizeof(float) * (size_t)cols) != 0;
        for (int c = 0; c < cols && !bad; c++)
            bad = !(l[c] == l0[c] || (l[c] != l[c] && l0[c] != l0[c]) ||
                    fabsf(l[c] - l0[c]) <= tol * fabsf(l0[c]));
        CHECK_MSG(!bad, "%s softmax_cols rows=%d cols=%d mul=%g: differs from the unfused steps",
                  table, rows, cols, (double)mul);
        free(s);
        free(s0);
        free(m);
        free(l);
        free(alpha);
        free(m0);
        free(l0);
        free(a0);
        free(mx);
        free(sub);
        free(sum);
    }
}

/* dec_row_max and dec_exp2_rows where a table has them (present together): the maxima exact
 * (NaN for a row holding one, -inf for a row of -inf), the exponentials bit for bit as
 * exp2_cols makes them, the sums within rounding; the padding past n holds NaN, which must change
 * neither, and nothing past n rounded up to 8 is written. */
static void check_decode_softmax(const fp_ukernels *uk, tu_rng *rng)
{
    if (!CHECK_MSG(!uk->dec_row_max == !uk->dec_exp2_rows,
                   "%s: dec_row_max and dec_exp2_rows not present together", table) ||
        !uk->dec_row_max)
        return;
    for (int trial = 0; trial < 60; trial++) {
        const int rows = 1 + (int)(tu_rng_u32(rng) % 20), n = 1 + (int)(tu_rng_u32(rng) % 70);
        const int ld = LD(n), n8 = (n + 7) / 8 * 8;
        float *s = alloc_f((size_t)rows * ld), *want = alloc_f((size_t)rows * ld);
        float *mx = alloc_f((size_t)rows), *sub = alloc_f((size_t)rows),
              *sum = alloc_f((size_t)rows);
        float *colsub = alloc_f((size_t)ld), *colsum = alloc_f((size_t)ld);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < ld; c++) {
                const uint32_t u = tu_rng_u32(rng) % 16;
                float x = u == 0 ? -INFINITY : tu_rng_uniform(rng, -20.0f, 20.0f);
                if (r % 5 == 3) /* a row without a visible score */
                    x = -INFINITY;
                if (r % 7 == 4 && c == (r + trial) % n) /* a NaN score */
                    x = NAN;
                s[r * ld + c] = c < n ? x : NAN;
            }
        memcpy(want, s, sizeof(float) * (size_t)rows * ld);
        uk->dec_row_max(rows, n, s, ld, mx);
        int bad = 0;
        for (int r = 0; r < rows && !bad; r++) {
            float m = -INFINITY;
            int nan = 0;
            for (int c = 0; c < n; c++) {
                nan |= isnan(s[r * ld + c]);
                m = s[r * ld + c] > m ? s[r * ld + c] : m;
            }
            bad = !CHECK_MSG(nan ? isnan(mx[r]) : mx[r] == m,
                             "%s dec_row_max rows=%d n=%d row %d: %g, want %g", table, rows, n, r,
                             (double)mx[r], nan ? (double)NAN : (double)m);
            sub[r] = isnan(mx[r]) || mx[r] == -INFINITY ? 0.0f : mx[r] * 0.3f;
        }
        uk->dec_exp2_rows(rows, n, s, ld, 0.3f, sub, sum);
        for (int r = 0; r < rows && !bad; r++) {
            for (int c = 0; c < ld; c++)
                colsub[c] = sub[r];
            memset(colsum, 0, sizeof(float) * (size_t)ld);
            uk->exp2_cols(1, n, want + r * ld, ld, 0.3f, colsub, colsum);
            double want_sum = 0.0;
            for (int c = 0; c < n && !bad; c++) {
                want_sum += (double)want[r * ld + c];
                bad = !CHECK_MSG(memcmp(&s[r * ld + c], &want[r * ld + c], sizeof(float)) == 0,
                                 "%s dec_exp2_rows (%d, %d): %.9g, want %.9g", table, r, c,
                                 (double)s[r * ld + c], (double)want[r * ld + c]);
            }
            for (int c = n8; c < ld && !bad; c++)
                bad = !CHECK_MSG(isnan(s[r * ld + c]),
                                 "%s dec_exp2_rows wrote (%d, %d) past n = %d", table, r, c, n);
            bad = bad || !CHECK_MSG(isnan(want_sum) ? isnan(sum[r])
                                                    : fabs(sum[r] - want_sum) <= 1e-5 * want_sum,
                                    "%s dec_exp2_rows sum of row %d: %.9g, want %.9g", table, r,
                                    (double)sum[r], want_sum);
        }
        free(s);
        free(want);
        free(mx);
        free(sub);
        free(sum);
        free(colsub);
        free(colsum);
    }
}

static void check_conversions(const fp_ukernels *uk)
{
    enum { ALL = 65536 };
    uint16_t *h = malloc(ALL * sizeof(uint16_t));
    float *out = alloc_f(ALL + 1);
    if (!CHECK(h))
        return;
    for (int i = 0; i < ALL; i++)
        h[i] = (uint16_t)i;
    for (int kind = 0; kind < 2; kind++) {
        int bad = 0;
        /* An odd count exercises the tail; the element after it must stay untouched. */
        out[ALL - 1] = 12345.0f;
        (kind ? uk->cvt_bf16 : uk->cvt_f16)(ALL - 1, h, out);
        for (int i = 0; i < ALL - 1 && !bad; i++) {
            const float want = kind ? fp_bf16_to_f32(h[i]) : fp_f16_to_f32(h[i]);
            const int same =
                memcmp(&out[i], &want, sizeof want) == 0 || (out[i] != out[i] && want != want);
            bad = !CHECK_MSG(same, "%s cvt_%s(0x%04x) = %g, want %g", table, kind ? "bf16" : "f16",
                             h[i], (double)out[i], (double)want);
        }
        CHECK_MSG(out[ALL - 1] == 12345.0f, "%s cvt wrote past n", table);
    }
    /* Stores: every bf16/f16 neighbourhood, halfway cases, NaN, infinities, denormals. */
    enum { NS = 70001 };
    float *x = alloc_f(NS);
    uint16_t *got = malloc(sizeof(uint16_t) * (NS + 1));
    if (!CHECK(got))
        return;
    tu_rng rng = tu_rng_seed(5);
    for (int i = 0; i < NS; i++) {
        uint32_t u = tu_rng_u32(&rng);
        if (i % 4 == 1)
            u = (u & 0x8000ffffu) | 0x47700000u; /* near the f16 overflow */
        if (i % 4 == 2)
            u = (u & 0xffff0000u) | 0x8000u; /* bf16 halfway */
        if (i % 4 == 3)
            u &= 0x807fffffu; /* f32 denormals */
        x[i] = fp_bits_f32(u);
    }
    x[0] = NAN;
    x[1] = -INFINITY;
    x[2] = 65520.0f;
    for (int kind = 0; kind < 2; kind++) {
        int bad = 0;
        got[NS - 1] = 0x1234;
        (kind ? uk->store_bf16 : uk->store_f16)(NS - 1, x, 1.0f, got);
        for (int i = 0; i < NS - 1 && !bad; i++) {
            const uint16_t want = kind ? fp_f32_to_bf16(x[i]) : fp_f32_to_f16(x[i]);
            bad =
                !CHECK_MSG(got[i] == want, "%s store_%s(%a = 0x%08x) = 0x%04x, want 0x%04x", table,
                           kind ? "bf16" : "f16", (double)x[i], fp_f32_bits(x[i]), got[i], want);
        }
        CHECK_MSG(got[NS - 1] == 0x1234, "%s store wrote past n", table);
        uk->store_bf16(5, x + 10, 0.5f, got);
        for (int i = 0; i < 5; i++)
            CHECK_MSG(got[i] == fp_f32_to_bf16(0.5f * x[10 + i]), "%s store_bf16 scale", table);
    }
    free(x);
    free(got);
    if (uk->interleave_bf16) {
        uint32_t dst[101];
        for (int n = 1; n <= 100; n++)
            for (int odd = 0; odd < 2; odd++) {
                dst[n] = 0xdeadbeefu;
                uk->interleave_bf16(n, h + 7, odd ? h + 1000 : NULL, dst);
                for (int c = 0; c < n; c++)
                    CHECK_MSG(dst[c] ==
                                  ((uint32_t)h[7 + c] | (odd ? (uint32_t)h[1000 + c] << 16 : 0u)),
                              "%s interleave_bf16 n=%d c=%d", table, n, c);
                CHECK_MSG(dst[n] == 0xdeadbeefu, "%s interleave_bf16 n=%d wrote past n", table, n);
            }
    }
    free(h);
    free(out);
}

static void check_transpose(const fp_ukernels *uk, tu_rng *rng)
{
    enum { MAXR = 40, MAXC = 40, LDD = 48 };
    unsigned char *src = malloc(4 * (MAXR * (MAXC + 3)) + 8);
    uint32_t *dst = malloc(sizeof(uint32_t) * (MAXC + 1) * LDD);
    if (!CHECK(src && dst))
        return;
    int bad = 0;
    for (int trial = 0; trial < 300 && !bad; trial++) {
        const int rows = 1 + (int)(tu_rng_u32(rng) % MAXR),
                  cols = 1 + (int)(tu_rng_u32(rng) % MAXC);
        const int shift = (int)(tu_rng_u32(rng) % 4); /* byte offset of the block */
        const ptrdiff_t lds = 4 * (cols + (int)(tu_rng_u32(rng) % 3)) + (shift % 2) * 2;
        for (int i = 0; i < 4 * (MAXR * (MAXC + 3)) + 8; i++)
            src[i] = (unsigned char)tu_rng_u32(rng);
        for (int i = 0; i < (MAXC + 1) * LDD; i++)
            dst[i] = 0xdeadbeefu;
        uk->transpose32(rows, cols, src + shift, lds, dst, LDD);
        for (int c = 0; c < MAXC + 1 && !bad; c++)
            for (int r = 0; r < LDD && !bad; r++) {
                uint32_t want = 0xdeadbeefu;
                if (r < rows && c < cols)
                    memcpy(&want, src + shift + r * lds + 4 * c, sizeof want);
                bad = !CHECK_MSG(dst[c * LDD + r] == want,
                                 "%s transpose32 %d x %d (byte offset %d): dst[%d][%d] = %08x, "
                                 "want %08x",
                                 table, rows, cols, shift, c, r, dst[c * LDD + r], want);
            }
    }
    free(src);
    free(dst);
}

/* One forward and backward with an odd head dim in `dtype` on the default table, against the
 * reference on f32 copies of the inputs; each backend's backward gets its own O and LSE. */
static void check_odd_head_dim(flashport_dtype dtype)
{
    enum { NQ = 37, NK = 45, H = 2, D = 33 };
    const int64_t qs[4] = {1, NQ, H, D}, ks[4] = {1, NK, H, D}, ls[3] = {1, H, NQ};
    const size_t es = tu_dtype_size(dtype), nq = NQ * H * D, nk = NK * H * D;
    /* Inputs, outputs and gradients in `dtype`, their f32 copies, the reference's results. */
    enum { Q, K, V, O, DO, DQ, DK, DV, BUFS };
    const size_t elems[BUFS] = {nq, nk, nk, nq, nq, nq, nk, nk};
    void *x[BUFS];
    float *xf[BUFS], *ref[BUFS];
    float *lse = malloc(H * NQ * 4), *lse_ref = malloc(H * NQ * 4);
    flashport_tensor t[BUFS], rt[BUFS];
    int ok = lse && lse_ref;
    for (int i = 0; i < BUFS; i++) {
        x[i] = malloc(elems[i] * es);
        xf[i] = malloc(elems[i] * 4);
        ref[i] = malloc(elems[i] * 4);
        ok &= x[i] && xf[i] && ref[i];
    }
    flashport_backend *cpu, *reference;
    if (!CHECK(ok) || !CHECK(flashport_backend_open("cpu", &cpu) == FLASHPORT_OK) ||
        !CHECK(flashport_backend_open("reference", &reference) == FLASHPORT_OK))
        return;
    tu_rng rng = tu_rng_seed(7);
    const int inputs[4] = {Q, K, V, DO};
    for (int i = 0; i < 4; i++) {
        const int b = inputs[i];
        tu_fill_uniform(x[b], (int64_t)elems[b], dtype, -1.0f, 1.0f, &rng);
        tu_to_f32(x[b], (int64_t)elems[b], dtype, xf[b]);
        memcpy(ref[b], xf[b], elems[b] * 4);
    }
    for (int i = 0; i < BUFS; i++) {
        const int64_t *shape = elems[i] == nq ? qs : ks;
        t[i] = flashport_tensor_contiguous(x[i], dtype, 4, shape);
        rt[i] = flashport_tensor_contiguous(ref[i], FLASHPORT_F32, 4, shape);
    }
    flashport_tensor tl = flashport_tensor_contiguous(lse, FLASHPORT_F32, 3, ls);
    flashport_tensor rl = flashport_tensor_contiguous(lse_ref, FLASHPORT_F32, 3, ls);
    flashport_attention_params params;
    flashport_attention_params_init(&params);
    params.causal = 1;
    const char *name = dtype == FLASHPORT_BF16 ? "bf16" : "f16";
    CHECK(flashport_attention_forward(cpu, &params, &t[Q], &t[K], &t[V], &t[O], &tl) ==
          FLASHPORT_OK);
    CHECK(flashport_attention_forward(reference, &params, &rt[Q], &rt[K], &rt[V], &rt[O], &rl) ==
          FLASHPORT_OK);
    tu_to_f32(x[O], (int64_t)nq, dtype, xf[O]);
    tu_err e = tu_error(xf[O], ref[O], (int64_t)nq), el = tu_error(lse, lse_ref, H * NQ);
    /* bf16: P and O rounded to 8 bits; f16: O rounded to 11 bits. */
    const double tol = dtype == FLASHPORT_BF16 ? 2e-2 : 2e-3;
    printf("  odd head dim D=%d %s forward: O max %.2e (tol %.0e), LSE max %.2e\n", D, name,
           e.max_abs, tol, el.max_abs);
    CHECK_MSG(e.max_abs <= tol && el.max_abs <= 1e-4, "odd head dim %s forward: error too large",
              name);

    CHECK(flashport_attention_backward(cpu, &params, &t[Q], &t[K], &t[V], &t[O], &tl, &t[DO],
                                       &t[DQ], &t[DK], &t[DV]) == FLASHPORT_OK);
    CHECK(flashport_attention_backward(reference, &params, &rt[Q], &rt[K], &rt[V], &rt[O], &rl,
                                       &rt[DO], &rt[DQ], &rt[DK], &rt[DV]) == FLASHPORT_OK);
    /* Relative to the largest gradient: bf16 rounds P, dS and the gradients to 8 bits. */
    const double gtol = dtype == FLASHPORT_BF16 ? 2e-2 : 2e-3;
    static const char *gname[3] = {"dQ", "dK", "dV"};
    for (int g = 0; g < 3; g++) {
        const int b = DQ + g;
        tu_to_f32(x[b], (int64_t)elems[b], dtype, xf[b]);
        const tu_err eg = tu_error(xf[b], ref[b], (int64_t)elems[b]);
        printf("  odd head dim D=%d %s backward: %s max %.2e (tol %.0e x max |%s| %.2e)\n", D, name,
               gname[g], eg.max_abs, gtol, gname[g], eg.ref_max);
        CHECK_MSG(eg.ref_max > 0.0 && eg.max_abs <= gtol * eg.ref_max,
                  "odd head dim %s backward: %s error too large", name, gname[g]);
    }
    flashport_backend_close(cpu);
    flashport_backend_close(reference);
    for (int i = 0; i < BUFS; i++) {
        free(x[i]);
        free(xf[i]);
        free(ref[i]);
    }
    free(lse);
    free(lse_ref);
}

int main(void)
{
    static const char *names[] = {"scalar", "avx2", "avx512", "avx512bf16", "neon"};
    int tested = 0;
    tu_rng rng = tu_rng_seed(11);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const fp_ukernels *uk = fp_cpu_ukernels_find(names[i]);
        if (!uk) {
            printf("%s: not built or not supported by this CPU, skipped\n", names[i]);
            continue;
        }
        table = names[i];
        fma_table = strcmp(table, "scalar") != 0;
        const int before = tu_failures;
        check_gemm(uk, &rng);
        CHECK_MSG(!uk->gemm_bf16 == !uk->exp2_cols_bf16 && !uk->gemm_bf16 == !uk->interleave_bf16 &&
                      !uk->gemm_bf16 == !uk->round_bf16,
                  "%s: the bf16 entries must all be present or all NULL", table);
        CHECK_MSG(!uk->gemm_bf16 == !uk->dec_scores_bf16 && !uk->gemm_bf16 == !uk->dec_pv_bf16,
                  "%s: the decode bf16 entries must be present exactly where gemm_bf16 is", table);
        check_decode_steps(uk, &rng, 0);
        check_decode_h16(uk, &rng, 0);
        check_decode_h16(uk, &rng, 1);
        if (uk->gemm_bf16) {
            check_gemm_bf16(uk, &rng);
            check_round_bf16(uk, &rng);
            check_decode_steps(uk, &rng, 1);
        }
        check_exp2(uk);
        check_softmax_ops(uk, &rng);
        check_fwd_fused(uk, &rng);
        check_decode_softmax(uk, &rng);
        check_conversions(uk);
        check_transpose(uk, &rng);
        printf("%s: %s\n", table, tu_failures == before ? "ok" : "FAILED");
        tested++;
    }
    check_odd_head_dim(FLASHPORT_BF16);
    check_odd_head_dim(FLASHPORT_F16);
    CHECK_MSG(tested >= 1, "no micro-kernel table ran");
    return tu_failures ? 1 : 0;
}
