/*
 * CPU flash forward: O = softmax(mask(transform(scale * Q K^T))) V and the row LSE, tiled after
 * FlashAttention-2, never storing more than one BLOCK_Q x BLOCK_K score tile per thread.
 *
 * Algorithm: one task per (query block, batch, head) numbered by core/plan.h (fp_plan_forward
 * without KV splits, fp_plan_task_at: heaviest query blocks first under a causal mask), run by an
 * OpenMP dynamic loop so causal work balances; block sizes from fp_plan_cpu_tiles.
 * A task loads its BLOCK_Q query rows into an f32 tile (times scale), then for each BLOCK_K key
 * block of the range core/mask.h says the rows may see: converts K (transposed) and V to f32
 * tiles, S = Q K^T (fp_tile_ops.qk), softcap/ALiBi (fp_score_transform), the per-row window
 * (skipped when fp_mask_block_full), the online softmax update of core/online_softmax.h, and
 * O_acc += P V (fp_tile_ops.pv). Finalize with fp_softmax_out_scale / fp_softmax_lse.
 * Extra memory: the per-thread tiles of fwd_layout only.
 * Target: portable C11 (+ OpenMP when available); the products go through flash_tile.h.
 * Tile shape: block_q x block_k from fp_plan_cpu_tiles (64 x 64 for D <= 128, 64 x 32 above).
 * Known differences from the reference: f32 accumulation and f32 exp; Q is multiplied by scale
 * before the product (one rounding earlier than scale * (q . k)).
 * Measured (f32, B=1 H=8 N=2048 D=128, Release build, 2 threads of a shared 16-core Xeon host whose
 * measured 2-thread AVX-512 FMA peak is ~345 GFLOP/s):
 *   FLASHPORT_NUM_THREADS=2 flashport-bench --backend cpu --heads 8 --seqlen 2048 --hdim 128
 *       --direction both --causal=0,1 --check
 *   not causal 480-570 ms (30-36 GFLOP/s, 9-10% of peak); causal 250-265 ms (32-34 GFLOP/s).
 * Same command on the 2-core AVX-512 EPYC development machine (shared, noisy): not causal 370 ms
 * (46 GFLOP/s), causal 186-228 ms (38-46 GFLOP/s).
 * The portable products run 128-bit vectors without FMA, a quarter of that peak at best; ISA
 * micro-kernels behind fp_tile_ops are the way up.
 */
#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/flash_tile.h"

#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/plan.h"
#include "core/problem.h"

#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Offsets (floats) of one thread's tiles inside its scratch slice. */
typedef struct fwd_layout {
    int ldd, ldn;       /* leading dims of d-wide and block_k-wide tiles */
    size_t q, o, kt, v; /* q, o: block_q x d; kt: d x block_k; v: block_k x d */
    size_t s;           /* block_q x block_k scores, then probabilities */
    size_t state;       /* block_q fp_softmax_state (2 floats each) */
    size_t total;
} fwd_layout;

static fwd_layout fwd_layout_of(int block_q, int block_k, int64_t d)
{
    fwd_layout L;
    L.ldd = fp_tile_ld(d);
    L.ldn = fp_tile_ld(block_k);
    L.q = 0;
    L.o = L.q + (size_t)block_q * L.ldd;
    L.kt = L.o + (size_t)block_q * L.ldd;
    L.v = L.kt + (size_t)d * L.ldn;
    L.s = L.v + (size_t)block_k * L.ldd;
    L.state = L.s + (size_t)block_q * L.ldn;
    L.total = L.state + (size_t)fp_tile_ld(2 * block_q);
    return L;
}

/* Applies softcap and ALiBi to one score row (keys j0 .. j0 + n - 1 of query row i). */
static void transform_row(float *s, int n, int64_t i, int64_t j0, int64_t nq, int64_t nk,
                          float softcap, float slope)
{
    for (int j = 0; j < n; j++)
        s[j] = fp_score_transform(s[j], softcap, slope, fp_alibi_distance(i, j0 + j, nq, nk));
}

static float row_max(const float *restrict s, int n)
{
    float mx = -INFINITY;
    for (int j = 0; j < n; j++)
        mx = s[j] > mx ? s[j] : mx;
    return mx;
}

/* Replaces scores by their weights under the row's state; returns the sum of the weights. */
static float weights_row(float *restrict s, int n, const fp_softmax_state *st)
{
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        s[j] = fp_softmax_weight(st, s[j]);
        sum += s[j];
    }
    return sum;
}

static void scale_row(float *restrict x, int d, float f)
{
    for (int c = 0; c < d; c++)
        x[c] *= f;
}

/* One task: query rows [i0, i0 + m) of (b, h). */
static void fwd_block(const fp_problem *p, const fp_plan *plan, const fp_tile_ops *ops,
                      const fwd_layout *L, float *scratch, int64_t b, int64_t h, int64_t i0)
{
    const fp_seq seq = fp_problem_seq(p, b);
    if (i0 >= seq.nq)
        return;
    const int d = (int)p->head_dim;
    const int m = (int)(seq.nq - i0 < plan->block_q ? seq.nq - i0 : plan->block_q);
    const int64_t kvh = fp_kv_head(p, h);
    const float slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0f;
    const int transform = p->softcap > 0.0f || slope != 0.0f;
    float *q = scratch + L->q, *o = scratch + L->o, *kt = scratch + L->kt, *v = scratch + L->v;
    float *s = scratch + L->s;
    fp_softmax_state *st = (fp_softmax_state *)(scratch + L->state);

    fp_tile_load(q, L->ldd, p->q.data, p->dtype, fp_row_offset(&p->q, b, seq.q_start + i0, h),
                 p->q.stride[FP_S], p->q.stride[FP_D], m, d, p->scale);
    for (int r = 0; r < m; r++) {
        fp_softmax_init(&st[r]);
        memset(o + (size_t)r * L->ldd, 0, sizeof(float) * (size_t)d);
    }

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + m, seq.nq, seq.nk, p->window_left, p->window_right, &lo, &hi);
    for (int64_t j0 = lo; j0 < hi; j0 += plan->block_k) {
        const int n = (int)(hi - j0 < plan->block_k ? hi - j0 : plan->block_k);
        const int64_t k_off = fp_row_offset(&p->k, b, seq.k_start + j0, kvh);
        const int64_t v_off = fp_row_offset(&p->v, b, seq.k_start + j0, kvh);
        fp_tile_load_t(kt, L->ldn, p->k.data, p->dtype, k_off, p->k.stride[FP_S], p->k.stride[FP_D],
                       n, d);
        fp_tile_load(v, L->ldd, p->v.data, p->dtype, v_off, p->v.stride[FP_S], p->v.stride[FP_D], n,
                     d, 1.0f);

        ops->qk(m, n, d, q, L->ldd, kt, L->ldn, s, L->ldn);

        const int full = fp_mask_block_full(i0, i0 + m, j0, j0 + n, seq.nq, seq.nk, p->window_left,
                                            p->window_right);
        for (int r = 0; r < m; r++) {
            float *sr = s + (size_t)r * L->ldn;
            if (transform)
                transform_row(sr, n, i0 + r, j0, seq.nq, seq.nk, p->softcap, slope);
            if (!full)
                fp_row_mask(sr, n, i0 + r, j0, seq.nq, seq.nk, p->window_left, p->window_right);
            float alpha = fp_softmax_update(&st[r], row_max(sr, n));
            if (alpha != 1.0f)
                scale_row(o + (size_t)r * L->ldd, d, alpha);
            st[r].l += weights_row(sr, n, &st[r]);
        }

        ops->pv(m, n, d, s, L->ldn, v, L->ldd, o, L->ldd);
    }

    for (int r = 0; r < m; r++) {
        float *orow = o + (size_t)r * L->ldd;
        float f = fp_softmax_out_scale(&st[r]);
        if (f == 0.0f) /* no visible key: O = 0 even if V holds inf or NaN */
            memset(orow, 0, sizeof(float) * (size_t)d);
        else
            scale_row(orow, d, f);
    }
    fp_tile_store(p->o.data, p->dtype, fp_row_offset(&p->o, b, seq.q_start + i0, h),
                  p->o.stride[FP_S], p->o.stride[FP_D], o, L->ldd, m, d, 1.0f);
    if (p->lse.data) {
        float *lse = (float *)p->lse.data;
        for (int r = 0; r < m; r++)
            lse[fp_lse_offset(&p->lse, b, h, seq.q_start + i0 + r)] = fp_softmax_lse(&st[r]);
    }
}

flashport_status fp_cpu_flash_forward(const fp_problem *p)
{
    const fp_plan_shape shape = {p->batch,    p->heads,       p->seqlen_q,    p->seqlen_k,
                                 p->head_dim, p->window_left, p->window_right};
    int32_t block_q, block_k;
    fp_plan_cpu_tiles(p->head_dim, &block_q, &block_k);
    const fp_plan_target target = {fp_cpu_threads(), block_q, block_k, 1};
    const fp_plan plan = fp_plan_forward(&shape, &target);
    const fwd_layout L = fwd_layout_of(block_q, block_k, p->head_dim);
    const fp_tile_ops *ops = fp_cpu_tile_ops();
    if (plan.num_tasks == 0)
        return FLASHPORT_OK;
    const int threads = plan.num_tasks < target.workers ? (int)plan.num_tasks : (int)target.workers;

    size_t slice;
    float *scratch = fp_scratch_alloc(threads, L.total, &slice);
    if (!scratch)
        return fp_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                    "cpu flash forward: cannot allocate %d x %zu bytes of scratch",
                                    threads, L.total * sizeof(float));

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
            fwd_block(p, &plan, ops, &L, mine, task.batch, task.head, task.q_block * block_q);
        }
    }
    fp_scratch_free(scratch);
    return FLASHPORT_OK;
}
