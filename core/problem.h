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

/* Host backends only: reads cu_seqlens and seqused_k directly (fp_seq_lookup_used,
 * core/geometry.h). s.nk is the number of keys sequence b uses: the window aligns to it. For a
 * paged problem k_start is 0 and keys are addressed through fp_key_offset. */
static inline fp_seq fp_problem_seq(const fp_problem *p, int64_t b)
{
    return fp_seq_lookup_used(p->varlen ? p->cu_seqlens_q : NULL,
                              p->varlen ? p->cu_seqlens_k : NULL, p->seqused_k, p->seqlen_q,
                              p->seqlen_k, (int)b);
}

/* The key capacity of sequence b before seqused_k (what dK / dV rows exist for it): dense Nk,
 * varlen its cu_seqlens_k length, paged block_table_stride * page_size. */
static inline int64_t fp_problem_key_capacity(const fp_problem *p, int64_t b)
{
    return fp_seq_lookup(p->varlen ? p->cu_seqlens_q : NULL, p->varlen ? p->cu_seqlens_k : NULL,
                         p->seqlen_q, p->seqlen_k, (int)b)
        .nk;
}

/* Element offset of (logical key `key` of sequence b, kv head h, 0) in a k/v-shaped view (k, v,
 * dk, dv) of p: dense and varlen through fp_row_offset at seq.k_start + key, paged through the
 * block table. Host backends only (reads the block table; validated, so the page is in range). */
static inline int64_t fp_key_offset(const fp_problem *p, const fp_tensor_view *t, int64_t b,
                                    const fp_seq *seq, int64_t key, int64_t h)
{
    if (p->block_table) {
        const int64_t page = p->block_table[b * p->block_table_stride + key / p->page_size];
        return page * t->stride[FP_B] + (key % p->page_size) * t->stride[FP_S] +
               h * t->stride[FP_H];
    }
    return b * t->stride[FP_B] + (seq->k_start + key) * t->stride[FP_S] + h * t->stride[FP_H];
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
    const fp_plan_shape s = {p->batch,    p->heads,       p->seqlen_q,    p->seqlen_k,
                             p->head_dim, p->window_left, p->window_right};
    return s;
}

#endif /* FLASHPORT_CORE_PROBLEM_H */
