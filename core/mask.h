/*
 * Masking and score transforms shared by every backend (C, CUDA, HIP).
 *
 * The window is aligned bottom-right: with shift = i + Nk - Nq, query row i sees key j iff
 *   shift - left <= j <= shift + right        (left/right = -1: unbounded on that side).
 * Both bounds grow with i, so the visible keys of a block of rows [i0, i1) lie in
 * [lo(i0), hi(i1 - 1)), and a key block is fully visible to all of them iff it lies in
 * [lo(i1 - 1), hi(i0)). Kernels use these to skip whole blocks and to drop per-element masking on
 * interior blocks.
 */
#ifndef FLASHPORT_CORE_MASK_H
#define FLASHPORT_CORE_MASK_H

#include "fp_inline.h"

#include <math.h>
#include <stdint.h>

/* First visible key of row i (may exceed nk: nothing visible). */
FP_INLINE int64_t fp_mask_lo(int64_t i, int64_t nq, int64_t nk, int64_t left)
{
    int64_t lo = left < 0 ? 0 : i + nk - nq - left;
    return lo < 0 ? 0 : lo;
}

/* One past the last visible key of row i (may be <= 0: nothing visible). */
FP_INLINE int64_t fp_mask_hi(int64_t i, int64_t nq, int64_t nk, int64_t right)
{
    int64_t hi = right < 0 ? nk : i + nk - nq + right + 1;
    return hi > nk ? nk : hi;
}

FP_INLINE int fp_mask_visible(int64_t i, int64_t j, int64_t nq, int64_t nk, int64_t left,
                              int64_t right)
{
    return j >= fp_mask_lo(i, nq, nk, left) && j < fp_mask_hi(i, nq, nk, right);
}

/* Keys [*lo, *hi) that any row of [i0, i1) may see; *hi <= *lo means the block sees nothing. */
FP_INLINE void fp_mask_block_range(int64_t i0, int64_t i1, int64_t nq, int64_t nk, int64_t left,
                                   int64_t right, int64_t *lo, int64_t *hi)
{
    *lo = fp_mask_lo(i0, nq, nk, left);
    *hi = fp_mask_hi(i1 - 1, nq, nk, right);
}

/* Keys [*lo, *hi) that every row of [i0, i1) sees (*hi <= *lo: none), within [0, Nk]. */
FP_INLINE void fp_mask_full_range(int64_t i0, int64_t i1, int64_t nq, int64_t nk, int64_t left,
                                  int64_t right, int64_t *lo, int64_t *hi)
{
    *lo = fp_mask_lo(i1 - 1, nq, nk, left);
    *hi = fp_mask_hi(i0, nq, nk, right);
}

/* Nonzero when every row of [i0, i1) sees every key of [j0, j1): no per-element mask needed. */
FP_INLINE int fp_mask_block_full(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t nq,
                                 int64_t nk, int64_t left, int64_t right)
{
    int64_t lo, hi;
    fp_mask_full_range(i0, i1, nq, nk, left, right, &lo, &hi);
    return j0 >= lo && j1 <= hi;
}

/* ALiBi distance |i + Nk - Nq - j|, as a float. */
FP_INLINE float fp_alibi_distance(int64_t i, int64_t j, int64_t nq, int64_t nk)
{
    int64_t d = i + nk - nq - j;
    return (float)(d < 0 ? -d : d);
}

/* s = scale * q.k already applied. Softcap (c > 0): c * tanh(s / c); then ALiBi. */
FP_INLINE float fp_score_transform(float s, float softcap, float alibi_slope, float alibi_dist)
{
    if (softcap > 0.0f)
        s = softcap * tanhf(s / softcap);
    return s - alibi_slope * alibi_dist;
}

/* d(transformed score)/d(scaled score): 1 without softcap, 1 - tanh^2(s / c) with it.
 * `capped` is the softcapped value c * tanh(s / c) (before ALiBi), which the backward already has.
 */
FP_INLINE float fp_softcap_grad(float capped, float softcap)
{
    if (softcap > 0.0f) {
        float t = capped / softcap;
        return 1.0f - t * t;
    }
    return 1.0f;
}

#endif /* FLASHPORT_CORE_MASK_H */
