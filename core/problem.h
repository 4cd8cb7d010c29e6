/*
 * Small helpers over fp_problem (core/backend.h) for host-side backends: where a sequence's
 * tokens start and how long it is, element offsets of one row of each tensor, and the shape that
 * core/plan.h plans.
 * Dense and varlen problems share one addressing rule:
 *   element (b, s, h, d) of q is at  b * stride[FP_B] + (q_start(b) + s) * stride[FP_S]
 *                                    + h * stride[FP_H] + d * stride[FP_D]
 * with q_start = 0 for dense problems and cu_seqlens_q[b] (and stride[FP_B] = 0) for varlen.
 */
#ifndef FLASHPORT_CORE_PROBLEM_H
#define FLASHPORT_CORE_PROBLEM_H

#include "core/backend.h"
#include "core/geometry.h"
#include "core/plan.h"

/* Host backends only: reads cu_seqlens directly (fp_seq_lookup, core/geometry.h). */
static inline fp_seq fp_problem_seq(const fp_problem *p, int64_t b)
{
    return fp_seq_lookup(p->varlen ? p->cu_seqlens_q : NULL, p->varlen ? p->cu_seqlens_k : NULL,
                         p->seqlen_q, p->seqlen_k, (int)b);
}

/* Element offset of (b, token, h, 0) in a q/k/v/o-shaped view; token is the packed index
 * (seq start + position). */
static inline int64_t fp_row_offset(const fp_tensor_view *t, int64_t b, int64_t token, int64_t h)
{
    return b * t->stride[FP_B] + token * t->stride[FP_S] + h * t->stride[FP_H];
}

/* Element offset of LSE (b, h, token). */
static inline int64_t fp_lse_offset(const fp_tensor_view *t, int64_t b, int64_t h, int64_t token)
{
    return b * t->stride[0] + h * t->stride[1] + token * t->stride[2];
}

/* The kv head read by query head h. */
static inline int64_t fp_kv_head(const fp_problem *p, int64_t h)
{
    return h / (p->heads / p->kv_heads);
}

/* The problem as core/plan.h sees it (for varlen problems seqlen_q / seqlen_k are the maxima). */
static inline fp_plan_shape fp_problem_plan_shape(const fp_problem *p)
{
    const fp_plan_shape s = {p->batch,    p->heads,       p->seqlen_q,     p->seqlen_k,
                             p->head_dim, p->window_left, p->window_right, p->kv_heads};
    return s;
}

#endif /* FLASHPORT_CORE_PROBLEM_H */
