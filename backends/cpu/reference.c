/*
 * The oracle: naive attention, forward and backward, accumulating in double.
 *
 * Algorithm: one query row at a time. Forward computes every visible score of the row, its
 * maximum, the sum of exponentials and O = sum_j p_j V_j in double; the row's LSE is
 * max + log(sum). Backward recomputes p_j = exp(s_j - LSE) from the given LSE, and with
 * Delta_i = dO_i . O_i:  dS_ij = p_ij (dO_i . V_j - Delta_i), times the softcap derivative;
 * dQ_i = scale sum_j dS_ij K_j, dK_j += scale dS_ij Q_i, dV_j += p_ij dO_i. dK/dV of one kv head
 * are accumulated in double over every query head of its group and written once at the end.
 *
 * Target: any host; serial and deterministic. Speed does not matter, only being obviously right.
 * Extra memory: O(Nk) scores per call in forward, O(Nk * D) accumulators per call in backward.
 *
 * Known differences from the fast backends: masking comes from core/mask.h (the one definition),
 * but the score transform (softcap, ALiBi) and its derivative are evaluated here in double, the
 * same formulas as fp_score_transform / fp_softcap_grad, so the oracle inherits no float
 * rounding (finite-difference tests of the backward need that). Outputs go from double through
 * f32 to the storage dtype (fp_store), so f16/bf16 outputs may sit one unit off a single
 * correctly rounded result on rare ties; tests compare against f32 outputs of the oracle.
 */
#include "backends/cpu/cpu_internal.h"
#include "core/dtype.h"
#include "core/mask.h"
#include "core/problem.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* n doubles (at least one), or NULL when n does not fit in memory. */
static double *alloc_doubles(int64_t n)
{
    if (n < 1)
        n = 1;
    if ((uint64_t)n > SIZE_MAX / sizeof(double))
        return NULL;
    return malloc((size_t)n * sizeof(double));
}

/* Softcap c (0 = off) turns a scaled score s into c * tanh(s / c). */
static double softcap_d(double s, double softcap)
{
    return softcap > 0.0 ? softcap * tanh(s / softcap) : s;
}

/* d softcap_d / ds, written in terms of its output like fp_softcap_grad. */
static double softcap_grad_d(double capped, double softcap)
{
    if (softcap > 0.0) {
        double t = capped / softcap;
        return 1.0 - t * t;
    }
    return 1.0;
}

static void load_row(const fp_problem *p, const fp_tensor_view *t, int64_t off, double *row)
{
    for (int64_t d = 0; d < p->head_dim; d++)
        row[d] = fp_load(t->data, off + d * t->stride[FP_D], p->dtype);
}

static void store_row(const fp_problem *p, const fp_tensor_view *t, int64_t off, const double *row)
{
    for (int64_t d = 0; d < p->head_dim; d++)
        fp_store(t->data, off + d * t->stride[FP_D], p->dtype, (float)row[d]);
}

static double dot_row(const fp_problem *p, const double *a, const fp_tensor_view *t, int64_t off)
{
    double acc = 0.0;
    for (int64_t d = 0; d < p->head_dim; d++)
        acc += a[d] * fp_load(t->data, off + d * t->stride[FP_D], p->dtype);
    return acc;
}

/* The transformed score of query row i (position in its sequence, values in qrow) and key j, or
 * -INFINITY when j is masked. *capped receives the softcapped score before ALiBi. */
static double score(const fp_problem *p, const fp_seq *s, int64_t b, int64_t h, int64_t i,
                    int64_t j, const double *qrow, double *capped)
{
    if (!fp_mask_visible(i, j, s->nq, s->nk, p->window_left, p->window_right))
        return -INFINITY;
    int64_t koff = fp_key_offset(p, &p->k, b, s, j, fp_kv_head(p, h));
    *capped = softcap_d((double)p->scale * dot_row(p, qrow, &p->k, koff), p->softcap);
    double slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0;
    return *capped - slope * fp_alibi_distance(i, j, s->nq, s->nk);
}

/* Whether the call has no query row at all: nothing to compute, nothing to allocate. */
static int no_query_rows(const fp_problem *p)
{
    return p->batch == 0 || p->seqlen_q == 0;
}

/* q, k, v: (B, N, H|Hkv, D) or packed varlen; o: like q; lse: (B, H, Nq) f32, may be absent. */
flashport_status fp_reference_forward(const fp_problem *p)
{
    const int64_t D = p->head_dim;
    if (no_query_rows(p))
        return FLASHPORT_OK;
    double *scores = alloc_doubles(p->seqlen_k);
    double *row = alloc_doubles(2 * D);
    if (!scores || !row) {
        free(scores);
        free(row);
        return fp_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                    "reference forward: cannot allocate %lld scores",
                                    (long long)p->seqlen_k);
    }
    double *qrow = row, *orow = row + D;
    for (int64_t b = 0; b < p->batch; b++) {
        fp_seq s = fp_problem_seq(p, b);
        for (int64_t h = 0; h < p->heads; h++) {
            int64_t kvh = fp_kv_head(p, h);
            for (int64_t i = 0; i < s.nq; i++) {
                int64_t qoff = fp_row_offset(&p->q, b, s.q_start + i, h);
                load_row(p, &p->q, qoff, qrow);
                /* A NaN score makes m NaN and stays (fmax would drop it): the row is NaN. */
                double m = -INFINITY, capped;
                for (int64_t j = 0; j < s.nk; j++) {
                    scores[j] = score(p, &s, b, h, i, j, qrow, &capped);
                    if (scores[j] > m || isnan(scores[j]))
                        m = isnan(m) ? m : scores[j];
                }
                double l = 0.0;
                for (int64_t d = 0; d < D; d++)
                    orow[d] = 0.0;
                if (m != -INFINITY) {
                    for (int64_t j = 0; j < s.nk; j++) {
                        if (scores[j] == -INFINITY)
                            continue;
                        double w = exp(scores[j] - m);
                        int64_t voff = fp_key_offset(p, &p->v, b, &s, j, kvh);
                        l += w;
                        for (int64_t d = 0; d < D; d++)
                            orow[d] +=
                                w * fp_load(p->v.data, voff + d * p->v.stride[FP_D], p->dtype);
                    }
                    for (int64_t d = 0; d < D; d++)
                        orow[d] /= l;
                }
                store_row(p, &p->o, fp_row_offset(&p->o, b, s.q_start + i, h), orow);
                if (p->lse.data) {
                    float lse = m != -INFINITY ? (float)(m + log(l)) : -INFINITY;
                    ((float *)p->lse.data)[fp_lse_offset(&p->lse, b, h, s.q_start + i)] = lse;
                }
            }
        }
    }
    free(scores);
    free(row);
    return FLASHPORT_OK;
}

/* q, k, v, o, dout: as in forward; lse: (B, H, Nq) f32 from the forward; dq like q; dk, dv like
 * k, summed over the H / Hkv query heads of each kv head. */
flashport_status fp_reference_backward(const fp_problem *p)
{
    const int64_t D = p->head_dim, group = p->heads / p->kv_heads;
    if (p->batch == 0)
        return FLASHPORT_OK;
    int64_t acc_size = p->seqlen_k > INT64_MAX / D ? INT64_MAX : p->seqlen_k * D;
    double *dk_acc = alloc_doubles(acc_size);
    double *dv_acc = alloc_doubles(acc_size);
    double *row = alloc_doubles(3 * D);
    if (!dk_acc || !dv_acc || !row) {
        free(dk_acc);
        free(dv_acc);
        free(row);
        return fp_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                    "reference backward: cannot allocate %lld x %lld accumulators",
                                    (long long)p->seqlen_k, (long long)D);
    }
    double *qrow = row, *dorow = row + D, *dqrow = row + 2 * D;
    for (int64_t b = 0; b < p->batch; b++) {
        fp_seq s = fp_problem_seq(p, b);
        for (int64_t kvh = 0; kvh < p->kv_heads; kvh++) {
            for (int64_t x = 0; x < s.nk * D; x++)
                dk_acc[x] = dv_acc[x] = 0.0;
            for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int64_t i = 0; i < s.nq; i++) {
                    int64_t qoff = fp_row_offset(&p->q, b, s.q_start + i, h);
                    int64_t ooff = fp_row_offset(&p->o, b, s.q_start + i, h);
                    int64_t dooff = fp_row_offset(&p->dout, b, s.q_start + i, h);
                    load_row(p, &p->q, qoff, qrow);
                    load_row(p, &p->dout, dooff, dorow);
                    double delta = dot_row(p, dorow, &p->o, ooff);
                    double lse =
                        ((const float *)p->lse.data)[fp_lse_offset(&p->lse, b, h, s.q_start + i)];
                    for (int64_t d = 0; d < D; d++)
                        dqrow[d] = 0.0;
                    /* A row that saw no key has LSE -inf and contributes nothing; a NaN
                     * LSE (a visible NaN score) makes its terms NaN. */
                    for (int64_t j = 0; lse != -INFINITY && j < s.nk; j++) {
                        double capped, t = score(p, &s, b, h, i, j, qrow, &capped);
                        if (t == -INFINITY)
                            continue;
                        int64_t koff = fp_key_offset(p, &p->k, b, &s, j, kvh);
                        int64_t voff = fp_key_offset(p, &p->v, b, &s, j, kvh);
                        double pij = exp(t - lse);
                        double dp = dot_row(p, dorow, &p->v, voff);
                        double ds = pij * (dp - delta) * softcap_grad_d(capped, p->softcap) *
                                    (double)p->scale;
                        for (int64_t d = 0; d < D; d++) {
                            double kd = fp_load(p->k.data, koff + d * p->k.stride[FP_D], p->dtype);
                            dqrow[d] += ds * kd;
                            dk_acc[j * D + d] += ds * qrow[d];
                            dv_acc[j * D + d] += pij * dorow[d];
                        }
                    }
                    store_row(p, &p->dq, fp_row_offset(&p->dq, b, s.q_start + i, h), dqrow);
                }
            }
            /* Keys past seqused_k get no gradient: their rows are written as zeros. */
            const int64_t cap = fp_problem_key_capacity(p, b);
            for (int64_t x = s.nk * D; x < cap * D; x++)
                dk_acc[x] = dv_acc[x] = 0.0;
            for (int64_t j = 0; j < cap; j++) {
                store_row(p, &p->dk, fp_row_offset(&p->dk, b, s.k_start + j, kvh), dk_acc + j * D);
                store_row(p, &p->dv, fp_row_offset(&p->dv, b, s.k_start + j, kvh), dv_acc + j * D);
            }
        }
    }
    free(dk_acc);
    free(dv_acc);
    free(row);
    return FLASHPORT_OK;
}
