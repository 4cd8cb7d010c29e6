/*
 * CPU flash backward: dQ, dK, dV from q, k, v, o, lse and dO, recomputing P = exp(S - LSE) tile by
 * tile; never an Nq x Nk buffer. Deterministic by construction: every gradient element is summed
 * by one task in an order fixed by the problem alone (no atomics, no per-thread partial sums), so
 * the bits do not depend on the thread count or the schedule, whatever params.deterministic says.
 *
 * Algorithm (FlashAttention-2 backward split into two passes so no two tasks write one element):
 *   0. Di = rowsum(dO * O) per (b, h, query row), an f32 [H][total_q] buffer.
 *   1. per (key block, batch, kv head): dK, dV of BLOCK_K keys in f32 tiles; for each query head
 *      of the GQA group and each query block that sees the keys: recompute S = Q K^T (Q times
 *      scale), transform (softcap, ALiBi) and mask as the forward does, P = exp(S - LSE),
 *      dV += P^T dO, dP = dO V^T, dS = P (dP - Di) (times fp_softcap_grad), dK += dS^T (scale Q).
 *   2. per (query block, batch, head): dQ of BLOCK_Q rows in an f32 tile; for each visible key
 *      block recompute P and dS the same way, dQ += dS K; dQ is stored times scale.
 * Pass 2 repeats the S and dP products of pass 1 (7 tile products per block pair against 5 for a
 * dQ accumulated with atomics): the price of determinism without an O(Nk / BLOCK_K * Nq * D)
 * buffer of partial dQ. Steps 0-2 run in one OpenMP region, pass 1 without a barrier at its end, so
 * threads drain into pass 2.
 * A row whose LSE is -inf (no visible key) gets P = 0 and thus contributes zero, never NaN.
 * Extra memory: the Di buffer (4 * H * total query rows bytes) and per-thread tiles.
 * Target: portable C11 (+ OpenMP when available); products go through flash_tile.h.
 * Tile shape: block_q x block_k from fp_plan_cpu_tiles, shared with the forward.
 * Known differences from the reference: f32 accumulation and f32 exp; scale folded into Q.
 * Measured (same setup and command as flash_fwd.c; FLOPs by the 2.5 x forward convention):
 *   not causal 1465-1645 ms (26-29 GFLOP/s, 7.5-8.6% of peak); causal 745-825 ms (26-29 GFLOP/s).
 * On the 2-core EPYC development machine: not causal 1223 ms (35 GFLOP/s), causal 549-646 ms
 * (33-39 GFLOP/s).
 */
#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/flash_tile.h"

#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/plan.h"
#include "core/problem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Offsets (floats) of one thread's tiles inside its scratch slice; both passes share it. */
typedef struct bwd_layout {
    int ldd, ldn;        /* leading dims of d-wide and block_k-wide tiles */
    size_t q, dout;      /* block_q x d: scale * Q and dO of a query block */
    size_t kt, vt;       /* d x block_k: K^T and V^T of a key block */
    size_t k;            /* block_k x d: K of a key block (pass 2) */
    size_t acc_a, acc_b; /* accumulators: dK and dV (pass 1), dQ in acc_a (pass 2) */
    size_t s, pr, dp;    /* block_q x block_k: scores/softcap grad, P, dP then dS */
    size_t lse, di;      /* block_q each */
    size_t total;
} bwd_layout;

static bwd_layout bwd_layout_of(int block_q, int block_k, int64_t d)
{
    const size_t bq = (size_t)block_q, bk = (size_t)block_k;
    const size_t bmax = bq > bk ? bq : bk;
    bwd_layout L;
    L.ldd = fp_tile_ld(d);
    L.ldn = fp_tile_ld(block_k);
    L.q = 0;
    L.dout = L.q + bq * L.ldd;
    L.kt = L.dout + bq * L.ldd;
    L.vt = L.kt + (size_t)d * L.ldn;
    L.k = L.vt + (size_t)d * L.ldn;
    L.acc_a = L.k + bk * L.ldd;
    L.acc_b = L.acc_a + bmax * L.ldd;
    L.s = L.acc_b + bk * L.ldd;
    L.pr = L.s + bq * L.ldn;
    L.dp = L.pr + bq * L.ldn;
    L.lse = L.dp + bq * L.ldn;
    L.di = L.lse + (size_t)fp_tile_ld(block_q);
    L.total = L.di + (size_t)fp_tile_ld(block_q);
    return L;
}

/* What every task needs to address the problem. */
typedef struct bwd_ctx {
    const fp_problem *p;
    int block_q, block_k;
    const fp_tile_ops *ops;
    bwd_layout L;
    float *di; /* [H][total_q]: per head, one entry per (dense or packed) query row */
} bwd_ctx;

/* Row of di for query row i of batch b: dense rows are b * Nq + i, varlen rows the packed token. */
static int64_t di_row(const bwd_ctx *c, const fp_seq *seq, int64_t b, int64_t i)
{
    return c->p->varlen ? seq->q_start + i : b * c->p->seqlen_q + i;
}

/* Loads the query side of (b, h, rows [i0, i0 + m)): scale * Q, dO, LSE and Di. */
static void load_query_block(const bwd_ctx *c, float *scratch, const fp_seq *seq, int64_t b,
                             int64_t h, int64_t i0, int m)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const int d = (int)p->head_dim;
    const int64_t tok = seq->q_start + i0;
    fp_tile_load(scratch + L->q, L->ldd, p->q.data, p->dtype, fp_row_offset(&p->q, b, tok, h),
                 p->q.stride[FP_S], p->q.stride[FP_D], m, d, p->scale);
    fp_tile_load(scratch + L->dout, L->ldd, p->dout.data, p->dtype,
                 fp_row_offset(&p->dout, b, tok, h), p->dout.stride[FP_S], p->dout.stride[FP_D], m,
                 d, 1.0f);
    const float *lse = (const float *)p->lse.data;
    const float *di = c->di + h * c->p->total_q + di_row(c, seq, b, i0);
    for (int r = 0; r < m; r++) {
        scratch[L->lse + r] = lse[fp_lse_offset(&p->lse, b, h, tok + r)];
        scratch[L->di + r] = di[r];
    }
}

/* P of one row from raw scores s (scale already in Q): transform, mask, exp(S - LSE). The row's
 * final softmax state is (m = LSE, l = 1), so fp_softmax_weight gives exp(S - LSE) (0 where
 * masked). With softcap, s is overwritten by the softcap gradient the dS step needs. */
static void probs_row(float *restrict s, float *restrict pr, int n, int64_t i, int64_t j0,
                      const fp_seq *seq, const fp_problem *p, float slope, int full, float lse)
{
    if (lse == -INFINITY) {
        memset(pr, 0, sizeof(float) * (size_t)n);
        return;
    }
    const fp_softmax_state st = {lse, 1.0f};
    if (p->softcap > 0.0f || slope != 0.0f) {
        for (int j = 0; j < n; j++) {
            float capped = fp_score_transform(s[j], p->softcap, 0.0f, 0.0f);
            pr[j] = fp_score_transform(capped, 0.0f, slope,
                                       fp_alibi_distance(i, j0 + j, seq->nq, seq->nk));
            s[j] = fp_softcap_grad(capped, p->softcap);
        }
    } else {
        memcpy(pr, s, sizeof(float) * (size_t)n);
    }
    if (!full)
        fp_row_mask(pr, n, i, j0, seq->nq, seq->nk, p->window_left, p->window_right);
    for (int j = 0; j < n; j++)
        pr[j] = fp_softmax_weight(&st, pr[j]);
}

/* For query rows [i0, i0 + m) (tiles loaded) and keys [j0, j0 + n) (kt, vt loaded): P into pr and
 * dS = P (dP - Di) into dp, both m x n. */
static void block_grads(const bwd_ctx *c, float *scratch, const fp_seq *seq, int64_t i0, int m,
                        int64_t j0, int n, float slope)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const int d = (int)p->head_dim;
    float *s = scratch + L->s, *pr = scratch + L->pr, *dp = scratch + L->dp;
    const float *lse = scratch + L->lse, *di = scratch + L->di;

    c->ops->qk(m, n, d, scratch + L->q, L->ldd, scratch + L->kt, L->ldn, s, L->ldn);
    const int full = fp_mask_block_full(i0, i0 + m, j0, j0 + n, seq->nq, seq->nk, p->window_left,
                                        p->window_right);
    for (int r = 0; r < m; r++)
        probs_row(s + (size_t)r * L->ldn, pr + (size_t)r * L->ldn, n, i0 + r, j0, seq, p, slope,
                  full, lse[r]);

    c->ops->qk(m, n, d, scratch + L->dout, L->ldd, scratch + L->vt, L->ldn, dp, L->ldn);
    for (int r = 0; r < m; r++) {
        const float *restrict pr_r = pr + (size_t)r * L->ldn;
        const float *restrict g = s + (size_t)r * L->ldn;
        float *restrict ds = dp + (size_t)r * L->ldn;
        const float dir = di[r];
        if (p->softcap > 0.0f) {
            for (int j = 0; j < n; j++)
                ds[j] = pr_r[j] * (ds[j] - dir) * g[j];
        } else {
            for (int j = 0; j < n; j++)
                ds[j] = pr_r[j] * (ds[j] - dir);
        }
    }
}

/* Step 0 for query rows [i0, i0 + m) of (b, h): Di = rowsum(dO * O), from the stored O. */
static void di_block(const bwd_ctx *c, float *scratch, int64_t b, int64_t h, int64_t i0)
{
    const fp_problem *p = c->p;
    const fp_seq seq = fp_problem_seq(p, b);
    if (i0 >= seq.nq)
        return;
    const int d = (int)p->head_dim;
    const int m = (int)(seq.nq - i0 < c->block_q ? seq.nq - i0 : c->block_q);
    const int64_t tok = seq.q_start + i0;
    float *o = scratch + c->L.q, *dout = scratch + c->L.dout;
    fp_tile_load(o, c->L.ldd, p->o.data, p->dtype, fp_row_offset(&p->o, b, tok, h),
                 p->o.stride[FP_S], p->o.stride[FP_D], m, d, 1.0f);
    fp_tile_load(dout, c->L.ldd, p->dout.data, p->dtype, fp_row_offset(&p->dout, b, tok, h),
                 p->dout.stride[FP_S], p->dout.stride[FP_D], m, d, 1.0f);
    float *di = c->di + h * c->p->total_q + di_row(c, &seq, b, i0);
    for (int r = 0; r < m; r++) {
        const float *orow = o + (size_t)r * c->L.ldd, *grow = dout + (size_t)r * c->L.ldd;
        float sum = 0.0f;
        for (int x = 0; x < d; x++)
            sum += orow[x] * grow[x];
        di[r] = sum;
    }
}

/* Pass 1 for keys [j0, j0 + n) of (b, kv head kvh): dK, dV over all query heads of the group. */
static void dkdv_block(const bwd_ctx *c, float *scratch, int64_t b, int64_t kvh, int64_t j0)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const fp_seq seq = fp_problem_seq(p, b);
    if (j0 >= seq.nk)
        return;
    const int d = (int)p->head_dim;
    const int bq = c->block_q;
    const int n = (int)(seq.nk - j0 < c->block_k ? seq.nk - j0 : c->block_k);
    const int64_t tok = seq.k_start + j0;
    float *dk = scratch + L->acc_a, *dv = scratch + L->acc_b;

    fp_tile_load_t(scratch + L->kt, L->ldn, p->k.data, p->dtype, fp_row_offset(&p->k, b, tok, kvh),
                   p->k.stride[FP_S], p->k.stride[FP_D], n, d);
    fp_tile_load_t(scratch + L->vt, L->ldn, p->v.data, p->dtype, fp_row_offset(&p->v, b, tok, kvh),
                   p->v.stride[FP_S], p->v.stride[FP_D], n, d);
    for (int r = 0; r < n; r++) {
        memset(dk + (size_t)r * L->ldd, 0, sizeof(float) * (size_t)d);
        memset(dv + (size_t)r * L->ldd, 0, sizeof(float) * (size_t)d);
    }

    const int64_t group = p->heads / p->kv_heads;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
        const float slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0f;
        for (int64_t i0 = 0; i0 < seq.nq; i0 += bq) {
            const int m = (int)(seq.nq - i0 < bq ? seq.nq - i0 : bq);
            int64_t lo, hi;
            fp_mask_block_range(i0, i0 + m, seq.nq, seq.nk, p->window_left, p->window_right, &lo,
                                &hi);
            if (hi <= lo || hi <= j0 || lo >= j0 + n)
                continue;
            load_query_block(c, scratch, &seq, b, h, i0, m);
            block_grads(c, scratch, &seq, i0, m, j0, n, slope);
            c->ops->ptx(m, n, d, scratch + L->pr, L->ldn, scratch + L->dout, L->ldd, dv, L->ldd);
            c->ops->ptx(m, n, d, scratch + L->dp, L->ldn, scratch + L->q, L->ldd, dk, L->ldd);
        }
    }

    fp_tile_store(p->dk.data, p->dtype, fp_row_offset(&p->dk, b, tok, kvh), p->dk.stride[FP_S],
                  p->dk.stride[FP_D], dk, L->ldd, n, d, 1.0f);
    fp_tile_store(p->dv.data, p->dtype, fp_row_offset(&p->dv, b, tok, kvh), p->dv.stride[FP_S],
                  p->dv.stride[FP_D], dv, L->ldd, n, d, 1.0f);
}

/* Pass 2 for query rows [i0, i0 + m) of (b, h): dQ over the visible key blocks. */
static void dq_block(const bwd_ctx *c, float *scratch, int64_t b, int64_t h, int64_t i0)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const fp_seq seq = fp_problem_seq(p, b);
    if (i0 >= seq.nq)
        return;
    const int d = (int)p->head_dim;
    const int bk = c->block_k;
    const int m = (int)(seq.nq - i0 < c->block_q ? seq.nq - i0 : c->block_q);
    const int64_t kvh = fp_kv_head(p, h);
    const float slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0f;
    float *dq = scratch + L->acc_a;

    load_query_block(c, scratch, &seq, b, h, i0, m);
    for (int r = 0; r < m; r++)
        memset(dq + (size_t)r * L->ldd, 0, sizeof(float) * (size_t)d);

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + m, seq.nq, seq.nk, p->window_left, p->window_right, &lo, &hi);
    for (int64_t j0 = lo; j0 < hi; j0 += bk) {
        const int n = (int)(hi - j0 < bk ? hi - j0 : bk);
        const int64_t tok = seq.k_start + j0;
        const int64_t k_off = fp_row_offset(&p->k, b, tok, kvh);
        fp_tile_load_t(scratch + L->kt, L->ldn, p->k.data, p->dtype, k_off, p->k.stride[FP_S],
                       p->k.stride[FP_D], n, d);
        fp_tile_load_t(scratch + L->vt, L->ldn, p->v.data, p->dtype,
                       fp_row_offset(&p->v, b, tok, kvh), p->v.stride[FP_S], p->v.stride[FP_D], n,
                       d);
        fp_tile_load(scratch + L->k, L->ldd, p->k.data, p->dtype, k_off, p->k.stride[FP_S],
                     p->k.stride[FP_D], n, d, 1.0f);
        block_grads(c, scratch, &seq, i0, m, j0, n, slope);
        c->ops->pv(m, n, d, scratch + L->dp, L->ldn, scratch + L->k, L->ldd, dq, L->ldd);
    }

    fp_tile_store(p->dq.data, p->dtype, fp_row_offset(&p->dq, b, seq.q_start + i0, h),
                  p->dq.stride[FP_S], p->dq.stride[FP_D], dq, L->ldd, m, d, p->scale);
}

flashport_status fp_cpu_flash_backward(const fp_problem *p)
{
    const fp_plan_shape shape = {p->batch,    p->heads,       p->seqlen_q,    p->seqlen_k,
                                 p->head_dim, p->window_left, p->window_right};
    int32_t block_q, block_k;
    fp_plan_cpu_tiles(p->head_dim, &block_q, &block_k);
    const fp_plan_target target = {fp_cpu_threads(), block_q, block_k, 1};
    /* Query-side tasks (Di, dQ) in the forward's numbering: heaviest blocks first. */
    const fp_plan plan = fp_plan_forward(&shape, &target);
    const int64_t bhkv = p->batch * p->kv_heads;
    const int64_t k_tasks = bhkv * ((p->seqlen_k + block_k - 1) / block_k);
    const int64_t most = plan.num_tasks > k_tasks ? plan.num_tasks : k_tasks;
    if (most == 0)
        return FLASHPORT_OK;
    const int threads = most < target.workers ? (int)most : (int)target.workers;

    bwd_ctx c;
    c.p = p;
    c.block_q = block_q;
    c.block_k = block_k;
    c.ops = fp_cpu_tile_ops();
    c.L = bwd_layout_of(block_q, block_k, p->head_dim);
    size_t slice;
    const size_t di_floats = (size_t)(p->heads * p->total_q);
    float *scratch = fp_scratch_alloc(threads, c.L.total, &slice);
    c.di = malloc(sizeof(float) * (di_floats > 0 ? di_floats : 1));
    if (!scratch || !c.di) {
        fp_scratch_free(scratch);
        free(c.di);
        return fp_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                    "cpu flash backward: cannot allocate %d x %zu bytes of tiles "
                                    "and %zu bytes of row sums",
                                    threads, c.L.total * sizeof(float), di_floats * sizeof(float));
    }

#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
#ifdef _OPENMP
        float *mine = scratch + slice * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
#else
        float *mine = scratch;
#endif
        for (int64_t t = 0; t < plan.num_tasks; t++) {
            const fp_plan_task task = fp_plan_task_at(&plan, &shape, t);
            di_block(&c, mine, task.batch, task.head, task.q_block * block_q);
        }

        /* Pass 1, first key blocks first: under a causal mask they are seen by the most rows. */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1) nowait
#endif
        for (int64_t t = 0; t < k_tasks; t++)
            dkdv_block(&c, mine, (t % bhkv) / p->kv_heads, t % p->kv_heads, (t / bhkv) * block_k);

            /* Pass 2. */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < plan.num_tasks; t++) {
            const fp_plan_task task = fp_plan_task_at(&plan, &shape, t);
            dq_block(&c, mine, task.batch, task.head, task.q_block * block_q);
        }
    }
    fp_scratch_free(scratch);
    free(c.di);
    return FLASHPORT_OK;
}
