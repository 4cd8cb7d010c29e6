/*
 * AVX-512 decode steps shared by ukernel_avx512.c and ukernel_avx512bf16.c (contract in
 * ukernel.h), included after ukernel_ops.h (they use ukernel.h's pf_cursor): hsum16, the fold that
 * sums 16 dot products at once, the four-keys-by-four-rows step's key pointers and stores, and
 * dec_scores_f16 on them (the generic one sums each row's lanes on its own, most of its work
 * besides the FMAs).
 */
#ifndef FLASHPORT_BACKENDS_CPU_UKERNEL_AVX512_DEC_H
#define FLASHPORT_BACKENDS_CPU_UKERNEL_AVX512_DEC_H

/* The sums of the lanes of a[0 .. 16), a[j]'s in lane j: four folds, each adding two shuffles
 * of a pair of vectors (within 64-bit, 128-bit, 256-bit, then 512-bit halves), 45 operations for
 * 16 dot products instead of a fold chain per vector. */
static inline __m512 hsum16(const __m512 *a)
{
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: a2i, a2i+1, a2i, a2i+1 (two halves each) */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per 128-bit lane: a4i .. a4i+3 */
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xee));
    for (int i = 0; i < 2; i++) /* 128-bit lanes: c2i (two halves), c2i+1 (two halves) */
        d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88),
                         _mm512_shuffle_f32x4(d[0], d[1], 0xdd));
}

/* The four keys of a step from key i0 (of keys): a missing key reads key i0 again (its sums are
 * not stored). Returns how many are real. */
static inline int key_quad(const uint16_t *const *k, int i0, int keys, const uint16_t **kr)
{
    const int nk = keys - i0 < 4 ? keys - i0 : 4;
    for (int i = 0; i < 4; i++)
        kr[i] = k[i0 + (i < nk ? i : 0)];
    return nk;
}

/* Four rows' sums of four keys (acc[4 r + i]: row r, key i) folded by hsum16 and stored to the
 * first nr rows of s (lds apart), the first nk keys of each. */
static inline void store_quad(const __m512 *acc, float *s, ptrdiff_t lds, int nk, int nr)
{
    const __mmask8 km = (__mmask8)((1u << nk) - 1u);
    const __m512 t = hsum16(acc);
    _mm_mask_storeu_ps(s, km, _mm512_castps512_ps128(t));
    if (nr > 1)
        _mm_mask_storeu_ps(s + lds, km, _mm512_extractf32x4_ps(t, 1));
    if (nr > 2)
        _mm_mask_storeu_ps(s + 2 * lds, km, _mm512_extractf32x4_ps(t, 2));
    if (nr > 3)
        _mm_mask_storeu_ps(s + 3 * lds, km, _mm512_extractf32x4_ps(t, 3));
}

/* dec_scores_f16 (ukernel.h): four keys by four rows a step, 16 FMA accumulators (16 lanes a
 * product, masked loads for the tail of d: zeros, nothing past d is read), each f16 row converted
 * by vcvtph2ps as it is loaded, folded by hsum16 into one vector whose 128-bit lanes are the
 * rows' four scores; a step's kv heads one after the other, so the rows are read as the cache
 * holds them. */
static void avx512_dec_scores_f16(int heads, int rows, int d, int keys, const float *q,
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
                const float *qh = q + h * qhs + r0 * ldq;
                __m512 acc[16];
                for (int i = 0; i < 16; i++)
                    acc[i] = _mm512_setzero_ps();
                for (int e = 0; e < d; e += 16) {
                    const __mmask16 m = (__mmask16)(d - e >= 16 ? 0xffffu : (1u << (d - e)) - 1u);
                    __m512 kv[4];
                    for (int i = 0; i < 4; i++)
                        kv[i] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, kr[i] + h * khs + e));
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++)
                        if (r < nr) {
                            const __m512 qv = _mm512_maskz_loadu_ps(m, qh + r * ldq + e);
#pragma GCC unroll 4
                            for (int i = 0; i < 4; i++)
                                acc[4 * r + i] = _mm512_fmadd_ps(qv, kv[i], acc[4 * r + i]);
                        }
                }
                store_quad(acc, s + h * shs + r0 * lds + i0, lds, nk, nr);
            }
        }
    }
}

#endif /* FLASHPORT_BACKENDS_CPU_UKERNEL_AVX512_DEC_H */
