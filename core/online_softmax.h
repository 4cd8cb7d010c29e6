/*
 * Online softmax: the one definition every kernel calls or mirrors (C, CUDA, HIP).
 *
 * A row's state is (m, l): the running maximum of the scores seen so far and the sum of
 * exp(score - m). The output accumulator is kept unnormalized, relative to m.
 *   update:   new block with maximum bm -> m' = max(m, bm); accumulators *= exp(m - m')
 *   finalize: O = acc / l, LSE = m + log(l); a row that saw nothing (l == 0) gives O = 0 and
 *             LSE = -inf, never NaN. A NaN score makes l NaN, and finalize passes it on: O and
 *             LSE of that row are NaN (the NaN semantics of include/flashport.h).
 *   merge:    two partial results over disjoint key sets (split-KV, several devices) combine
 *             through their LSEs: lse = log(exp(a) + exp(b)), O = wa Oa + wb Ob with
 *             wa = exp(a - lse), wb = exp(b - lse).
 * The *_exp2 variants take scores already multiplied by log2(e) (kernels fold it into the
 * scale and use exp2); their m is in log2 units and finalize converts the LSE back to natural log.
 */
#ifndef FLASHPORT_CORE_ONLINE_SOFTMAX_H
#define FLASHPORT_CORE_ONLINE_SOFTMAX_H

#include "fp_inline.h"

#include <math.h>

#define FP_LOG2E 1.4426950408889634f
#define FP_LN2   0.6931471805599453f

typedef struct fp_softmax_state {
    float m; /* running max; -INFINITY before any visible score */
    float l; /* sum of exp(score - m) */
} fp_softmax_state;

FP_INLINE void fp_softmax_init(fp_softmax_state *s)
{
    s->m = -INFINITY;
    s->l = 0.0f;
}

/* Takes the maximum of the next block's (visible) scores. Returns the factor by which l and the
 * output accumulator must be multiplied; the caller multiplies, then adds the block's terms. */
FP_INLINE float fp_softmax_update(fp_softmax_state *s, float block_max)
{
    float m_new = block_max > s->m ? block_max : s->m;
    float alpha = (m_new == -INFINITY) ? 1.0f : expf(s->m - m_new);
    s->m = m_new;
    s->l *= alpha;
    return alpha;
}

FP_INLINE float fp_softmax_update_exp2(fp_softmax_state *s, float block_max)
{
    float m_new = block_max > s->m ? block_max : s->m;
    float alpha = (m_new == -INFINITY) ? 1.0f : exp2f(s->m - m_new);
    s->m = m_new;
    s->l *= alpha;
    return alpha;
}

/* The maximum a block's exponentials subtract: m, or 0 while the row has seen no visible score
 * (m = -inf). Masked scores are -inf, so exp(-inf - 0) = 0 and never exp(-inf - -inf) = NaN;
 * kernels that compute exp(score - base) over a whole tile without a per-element test use it. */
FP_INLINE float fp_softmax_exp_base(const fp_softmax_state *s)
{
    return s->m == -INFINITY ? 0.0f : s->m;
}

/* The probability weight of one score under the current maximum (0 for masked -inf scores). */
FP_INLINE float fp_softmax_weight(const fp_softmax_state *s, float score)
{
    return score == -INFINITY ? 0.0f : expf(score - s->m);
}

FP_INLINE float fp_softmax_weight_exp2(const fp_softmax_state *s, float score)
{
    return score == -INFINITY ? 0.0f : exp2f(score - s->m);
}

/* Factor that turns the accumulator into O: 1/l, or 0 for a row that saw nothing; NaN when l
 * is (a visible NaN score), which a test of l > 0 would turn into the empty row's 0. */
FP_INLINE float fp_softmax_out_scale(const fp_softmax_state *s)
{
    return s->l == 0.0f ? 0.0f : 1.0f / s->l;
}

/* Natural-log LSE of the row, -INFINITY for a row that saw nothing, NaN when l is NaN. */
FP_INLINE float fp_softmax_lse(const fp_softmax_state *s)
{
    return s->l == 0.0f ? -INFINITY : s->m + logf(s->l);
}

/* For a state kept in log2 units. m ln 2 + ln l rather than (m + log2 l) ln 2: the sum is not
 * rounded at the larger magnitude of m + log2 l (measured on the H200: 2 .. 5 ulp of error
 * became 2 .. 4 against the float64 reference). */
FP_INLINE float fp_softmax_lse_exp2(const fp_softmax_state *s)
{
    return s->l == 0.0f ? -INFINITY : s->m * FP_LN2 + logf(s->l);
}

/* Merge of two partial LSEs. Writes the weights of each partial output; returns the merged LSE.
 * Both -inf: LSE -inf and both weights 0. */
FP_INLINE float fp_softmax_merge(float lse_a, float lse_b, float *w_a, float *w_b)
{
    float mx = lse_a > lse_b ? lse_a : lse_b;
    if (mx == -INFINITY) {
        *w_a = 0.0f;
        *w_b = 0.0f;
        return -INFINITY;
    }
    float ea = expf(lse_a - mx), eb = expf(lse_b - mx);
    float lse = mx + logf(ea + eb);
    *w_a = expf(lse_a - lse);
    *w_b = expf(lse_b - lse);
    return lse;
}

#endif /* FLASHPORT_CORE_ONLINE_SOFTMAX_H */
