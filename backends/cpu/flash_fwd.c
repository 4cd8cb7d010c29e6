/*
 * CPU flash forward: O = softmax(mask(transform(scale * Q K^T))) V and the row LSE, tiled after
 * FlashAttention-2, never holding more than one BLOCK_K x block_q score tile per thread. The
 * portable framework; every O(m * n * d) product and every per-score step runs in the micro-kernel
 * table chosen at run time (ukernel.h, isa.c).
 *
 * Algorithm: one task per (query block, batch, head) of core/plan.h's fp_plan_forward (no KV
 * splits), numbered by fp_plan_task_at in FP_PLAN_ORDER_LOCALITY: (batch, head) by (batch, head),
 * heaviest query blocks first under a causal mask; an OpenMP dynamic loop runs them, so causal
 * work balances. Scores are kept transposed: S^T (keys down the rows, the block's queries
 * across the columns), so that
 *   - S^T = K Q^T reads K in place as the product's A operand (broadcast from the caller's
 *     tensor, any strides), against Q^T packed once per task; on the AVX2 table f32 K and V are
 *     staged instead (below: the caller's rows, H * d apart, would crowd a few L1 sets in every
 *     product that reads them);
 *   - each query's online-softmax statistics (core/online_softmax.h, exp2 form: scores in log2
 *     units) are lane-wise column reductions;
 *   - O += P V reads P^T as A (a transposed view) against V, in place when it is f32 with
 *     contiguous, 16-aligned rows (and not staged), else converted to a tile.
 * Per key block: S^T; softcap/ALiBi (fp_score_transform); the window (core/mask.h) on blocks
 * that straddle it (fp_mask_block_full), whose S^T and P V run over the key bands that each group
 * of 16 queries can see (fp_key_bands: 10 of the 16 squares of 16 x 16 on a causal diagonal, the
 * same sums without the masked pairs' zeros); then, on f32 products, the table's softmax_cols in
 * one call: column max, the online update of core/online_softmax.h vectorized over the queries
 * (the state kept as arrays of m and l; the rescale factor by the table's exp2, not libm's exp2f),
 * P = 2^(S * scale * log2(e) - m) and l; O's rescale rides on O += P V (gemm_rs: the rows of O
 * multiplied as they are loaded into the accumulators, the same bits as a separate pass). On bf16
 * products the same steps one by one (fp_softmax_update_exp2 per query). A block that straddles the
 * mask and holds an infinite or NaN V takes a scalar P V over its visible pairs (pv_visible), so
 * that a key a row cannot see never reaches it; a NaN score a row sees makes its l, O and LSE NaN.
 * bf16 inputs on a CPU with AVX512_BF16 stay bf16: Q^T and V as bf16 pairs, K in place, S^T and
 * P V by vdpbf16ps with P rounded to bf16 (ukernel_avx512bf16.c), except on tables that set
 * bf16_as_f32 (Intel cores, isa.c). Other dtypes convert to f32:
 * f16, and bf16 not on bf16 products, convert each thread's K and V once per (batch,
 * kv head) into an fp_kv_stage (flash_tile.h) that the products then read in place, instead of
 * converting a key block again for every query block that sees it (paged caches, and stages over
 * STAGE_MAX_BYTES, still convert per block). On tables that set fwd_stage_f32 (AVX2, and the
 * AVX-512 tables on Intel cores) f32 K and V are staged the same way, copied to rows
 * fp_tile_ld_sets apart; elsewhere (the AVX-512 tables on AMD cores), and where they cannot be
 * staged, tasks of several sub-blocks copy each key block into tiles at that stride.
 * fp8 inputs (forward only, docs/semantics.md) convert to f32 tiles (fp_fp8_to_f32_vec, in a
 * loop the compiler vectorizes); the scale folds in descale_q * descale_k; P is rounded to e4m3
 * after its unrounded sum went into l, against the running maximum as a GPU kernel does (the
 * tests' fp8 tolerance covers that); O is scaled by descale_v and stored in o's dtype.
 * Extra memory: the per-thread tiles of fwd_layout, and the stage (at most STAGE_MAX_BYTES).
 * Tile shape: block_q queries x BLOCK_K = 64 keys; block_q = BLOCK_Q = 64 (one 4-register
 * column block of the AVX-512 kernel), or the table's fwd_block_q (AVX2, AVX-512: 256)
 * for sequences of at least eight such blocks (fwd_block_q). A taller task works in sub-blocks
 * of BLOCK_Q queries against each key block (fwd_sub_block): K and V are fetched once for the
 * task, while the score tile stays the BLOCK_K x BLOCK_Q of the default (in L1) and the causal
 * diagonal is cut as finely as with 64-query tasks.
 * Known differences from the reference: f32 accumulation, the polynomial exp2 (ukernel.h); the
 * scale is applied to the f32 scores (Q is not pre-scaled); bf16 path: P in bf16 for P V.
 * Numbers: docs/performance.md ("CPU backend") and docs/performance-cpu.md.
 */
#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/flash_tile.h"

#include "core/dtype.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/plan.h"
#include "core/problem.h"

#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum { BLOCK_Q = 64, BLOCK_K = 64 };

/* Queries per task: the table's fwd_block_q where it sets one (AVX2, whose Zen 2/3 cores have
 * 512 KiB of L2: K and V of one head, streamed again for every query block, come from L3, and
 * 256 queries a pass quarter that stream; the AVX-512 tables, whose 512-bit products wait on
 * those passes too, most where a head's K and V lie beyond L2) and the sequences hold at least
 * eight such blocks, else BLOCK_Q: with fewer, a causal mask's triangle cuts into too few tasks
 * for the threads to balance (docs/performance-cpu.md). seqlen_q: the longest sequence. */
static int fwd_block_q(const fp_ukernels *uk, int64_t seqlen_q)
{
    return uk->fwd_block_q > 0 && seqlen_q >= 8 * (int64_t)uk->fwd_block_q ? uk->fwd_block_q
                                                                           : BLOCK_Q;
}

/* Largest fp_kv_stage a thread takes (f32 K and V of one kv head): 16 MiB, Nk = 16384 at D = 128.
 * Longer sequences convert per block as before, so extra memory stays bounded per thread. */
#define STAGE_MAX_BYTES ((size_t)16 << 20)

/* Largest K plus V of one kv head (seqlen_k rows, in their dtype) for which 64-query tasks that
 * read them in place do not prefetch the next key block: 1 MiB, a Zen 4/5 core's L2. The tasks of
 * a (batch, head) run together (FP_PLAN_ORDER_LOCALITY), so such a head's keys come from L2 after
 * its first task, where the prefetch instructions (one per cache line of the next block, on every
 * key block of every task) cost more than they save; beyond it key blocks come from L3 and the
 * prefetch pays (docs/performance-cpu.md). */
#define PREFETCH_MIN_BYTES ((size_t)1 << 20)

/* Offsets (floats) of one thread's tiles inside its scratch slice. */
typedef struct fwd_layout {
    int bq;         /* queries per block (fwd_block_q) */
    int ldq, ldd;   /* leading dims: bq-wide and d-wide tiles (fp_tile_ld_sets) */
    int lds;        /* leading dim of the sub-block tiles (at most BLOCK_Q queries) */
    size_t qt;      /* Q^T: d x bq f32, or ceil(d/2) x bq bf16 pairs */
    size_t o;       /* bq x d accumulator */
    size_t s;       /* a sub-block's S^T, then P^T: BLOCK_K x lds */
    size_t pp;      /* bf16 path: P^T as pairs, BLOCK_K / 2 x lds */
    size_t kt, vt;  /* K and V when not read in place: BLOCK_K x d (f32, bf16 or pairs) */
    size_t sm, sl;  /* per query: the softmax state's m and l (fp_softmax_state, by field) */
    size_t bm, sub; /* per query: block maximum; subtrahend of the exponent */
    size_t alpha;   /* per query: rescale factor of O */
    size_t bsum;    /* per query: the block's sum of P */
    size_t gk, gv;  /* paged K and V rows of a block spanning pages, gathered: BLOCK_K x d */
    size_t total;
} fwd_layout;

static fwd_layout fwd_layout_of(int64_t d, int bq)
{
    fwd_layout L;
    L.bq = bq;
    L.ldq = fp_tile_ld_sets(bq);
    L.ldd = fp_tile_ld_sets(d);
    L.lds = fp_tile_ld(bq < BLOCK_Q ? bq : BLOCK_Q);
    L.qt = 0;
    L.o = L.qt + (size_t)d * L.ldq;
    L.s = L.o + (size_t)bq * L.ldd;
    L.pp = L.s + (size_t)BLOCK_K * L.lds;
    L.kt = L.pp + (size_t)(BLOCK_K + 1) / 2 * L.lds;
    L.vt = L.kt + (size_t)BLOCK_K * L.ldd;
    L.sm = L.vt + (size_t)BLOCK_K * L.ldd;
    L.sl = L.sm + (size_t)L.ldq;
    L.bm = L.sl + (size_t)L.ldq;
    L.sub = L.bm + (size_t)L.ldq;
    L.alpha = L.sub + (size_t)L.ldq;
    L.bsum = L.alpha + (size_t)L.ldq;
    L.gk = L.bsum + (size_t)L.ldq;
    L.gv = L.gk + (size_t)BLOCK_K * L.ldd;
    L.total = L.gv + (size_t)BLOCK_K * L.ldd;
    return L;
}

typedef struct fwd_ctx {
    const fp_problem *p;
    const fp_ukernels *uk;
    int bf16;     /* bf16 dot products (gemm_bf16) */
    int k_direct; /* K read in place by the product */
    int v_direct; /* V read in place (f32 only, or the stage's f32 rows) */
    int fp8;      /* fp8 inputs: converted to f32 tiles, P rounded to e4m3 */
    int stage;    /* f16/bf16 K and V converted once per thread into an fp_kv_stage */
    int prefetch; /* the next key block prefetched (PREFETCH_MIN_BYTES) */
    float scale;  /* of the raw q . k: scale, times descale_q * descale_k for fp8 */
    fwd_layout L;
} fwd_ctx;

/* fp8 rows into an f32 row tile, dst[r * ld + c] = x(r, c); contiguous rows in a loop the
 * compiler vectorizes (fp_fp8_to_f32_vec). */
static void fp8_tile_load(float *dst, int ld, const fp_block *x, int rows, int d)
{
    const int e4m3 = x->dtype == FLASHPORT_FP8_E4M3;
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)x->data + x->off + r * x->rs;
        float *restrict out = dst + (ptrdiff_t)r * ld;
        if (x->cs == 1) {
            if (e4m3)
                for (int c = 0; c < d; c++)
                    out[c] = fp_fp8_to_f32_vec(row[c], 1);
            else
                for (int c = 0; c < d; c++)
                    out[c] = fp_fp8_to_f32_vec(row[c], 0);
        } else {
            for (int c = 0; c < d; c++)
                out[c] = fp_fp8_to_f32(row[c * x->cs], e4m3);
        }
    }
}

/* fp8 rows into a transposed f32 tile, dst[c * ld + r] = x(r, c), the padding columns rows ..
 * ld - 1 set to 0 (fp_tile_load_t's contract). Once per query block: plain loads. */
static void fp8_tile_load_t(float *dst, int ld, const fp_block *x, int rows, int d)
{
    const int e4m3 = x->dtype == FLASHPORT_FP8_E4M3;
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)x->data + x->off + r * x->rs;
        for (int c = 0; c < d; c++)
            dst[(ptrdiff_t)c * ld + r] = fp_fp8_to_f32(row[c * x->cs], e4m3);
    }
    for (int c = 0; c < d; c++)
        memset(dst + (ptrdiff_t)c * ld + rows, 0, sizeof(float) * (size_t)(ld - rows));
}

/* The fp8 forward's P rounding (docs/semantics.md): every P of the n x m tile to the nearest e4m3
 * value, after its unrounded sum went into the row's l. */
static void round_p_e4m3(float *s, int ld, int n, int m)
{
    for (int r = 0; r < n; r++) {
        float *restrict row = s + (ptrdiff_t)r * ld;
        for (int c = 0; c < m; c++)
            row[c] = fp_round_e4m3(row[c]);
    }
}

/* Softcap and ALiBi on a transposed score tile (raw q . k in, log2 units out), keys j0 + r down
 * the rows, queries i0 + c across. */
static void transform_tile(float *s, int ld, int n, int m, int64_t i0, int64_t j0,
                           const fp_seq *seq, const fp_problem *p, float scale, float slope)
{
    for (int r = 0; r < n; r++)
        for (int c = 0; c < m; c++) {
            float *x = s + (ptrdiff_t)r * ld + c;
            const float dist = fp_alibi_distance(i0 + c, j0 + r, seq->nq, seq->nk);
            *x = fp_score_transform(*x * scale, p->softcap, slope, dist) * FP_LOG2E;
        }
}

/* O += P V over the visible (query, key) pairs only, V read element by element. For the rare
 * block that straddles the mask and holds an infinite or NaN V: there the product's
 * 0 * inf = NaN of a masked pair would reach a row that cannot see the key. pt: P^T (f32). */
static void pv_visible(float *o, int ldo, const float *pt, int ldp, const fp_block *v, int n, int m,
                       int d, int64_t i0, int64_t j0, const fp_seq *seq, const fp_problem *p)
{
    for (int x = 0; x < m; x++) {
        float *orow = o + (ptrdiff_t)x * ldo;
        for (int r = 0; r < n; r++) {
            if (!fp_mask_visible(i0 + x, j0 + r, seq->nq, seq->nk, p->window_left, p->window_right))
                continue;
            const float w = pt[(ptrdiff_t)r * ldp + x];
            const int64_t row = v->off + r * v->rs;
            for (int e = 0; e < d; e++)
                orow[e] += w * fp_load(v->data, row + e * v->cs, v->dtype);
        }
    }
}

/* Keys [j0, j0 + n) of kv head kvh of sequence b from the k-shaped view t: dense and varlen rows
 * in place; paged rows in place when they lie in one page, else copied (in their dtype, d
 * contiguous elements per row) to buf, BLOCK_K x d. */
static fp_block key_block(const fp_problem *p, const fp_tensor_view *t, int64_t b,
                          const fp_seq *seq, int64_t j0, int n, int64_t kvh, void *buf)
{
    fp_block x = {t->data, p->dtype, fp_key_offset(p, t, b, seq, j0, kvh), t->stride[FP_S],
                  t->stride[FP_D]};
    if (!p->block_table || j0 / p->page_size == (j0 + n - 1) / p->page_size)
        return x;
    const size_t es = flashport_dtype_size(p->dtype);
    const int64_t d = p->head_dim;
    for (int r = 0; r < n; r++) {
        const int64_t off = fp_key_offset(p, t, b, seq, j0 + r, kvh);
        char *dst = (char *)buf + (size_t)r * (size_t)d * es;
        if (t->stride[FP_D] == 1)
            memcpy(dst, (const char *)t->data + (size_t)off * es, (size_t)d * es);
        else
            for (int64_t e = 0; e < d; e++)
                memcpy(dst + (size_t)e * es,
                       (const char *)t->data + (size_t)(off + e * t->stride[FP_D]) * es, es);
    }
    x.data = buf;
    x.off = 0;
    x.rs = d;
    x.cs = 1;
    return x;
}

/* A key block's operands, prepared once for every sub-block of a task: K as the A operand of
 * S^T = K Q^T (f32 or bf16 elements, strides in elements) and V as the B operand of O += P V (f32
 * rows ldv apart, or bf16 pairs), with kb and vb the caller's rows for the masked-V check. */
typedef struct key_ops {
    int64_t j0;
    int n;
    fp_block kb, vb;
    const void *k;
    ptrdiff_t krs, kcs;
    const void *v;
    ptrdiff_t ldv;
} key_ops;

/* Key rows [*r0, *r1) of the column group at column x: the bands (fp_key_bands) it is in, which
 * are contiguous; P of the group's other keys is 0 (masked). */
static void group_keys(const fp_key_band *band, int bands, int x, int *r0, int *r1)
{
    *r0 = *r1 = 0;
    for (int i = 0; i < bands; i++)
        if (band[i].x0 <= x && x < band[i].x0 + band[i].cols) {
            if (*r1 == *r0)
                *r0 = band[i].r0;
            *r1 = band[i].r0 + band[i].rows;
        }
}

/* Query columns [x0, x0 + m) of a task whose first row is i0 (Q^T loaded, the softmax state and O
 * running) against the key block ko: S^T, the mask, the online softmax and O += P V. Sub-blocks
 * are independent column ranges of the same arithmetic: a column's result does not depend on how
 * the task's columns are cut. */
static void fwd_sub_block(const fwd_ctx *c, float *scratch, const fp_seq *seq, int64_t h,
                          int64_t i0, int x0, int m, const key_ops *ko)
{
    const fp_problem *p = c->p;
    const fp_ukernels *uk = c->uk;
    const fwd_layout *L = &c->L;
    const int d = (int)p->head_dim, n = ko->n, mp = fp_tile_ld(m);
    const int64_t j0 = ko->j0, q0 = i0 + x0;
    const float slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0f;
    float *qt = scratch + L->qt + x0, *o = scratch + L->o + (size_t)x0 * L->ldd;
    float *s = scratch + L->s;
    uint32_t *pp = (uint32_t *)(scratch + L->pp);
    float *sm = scratch + L->sm + x0, *sl = scratch + L->sl + x0;
    float *bm = scratch + L->bm + x0, *sub = scratch + L->sub + x0;
    float *alpha = scratch + L->alpha + x0, *bsum = scratch + L->bsum + x0;

    /* S^T = K Q^T, raw dot products. Where the mask cuts the block, only over its bands
     * (fp_key_bands: on a causal diagonal, 10 of the 16 squares of 16 keys x 16 queries); the
     * scores left out are masked, and fp_tile_fill_masked overwrites whatever the tile held there.
     */
    const int full = fp_mask_block_full(q0, q0 + m, j0, j0 + n, seq->nq, seq->nk, p->window_left,
                                        p->window_right);
    fp_key_band band[FP_KEY_BANDS];
    const int bands =
        full ? 0
             : fp_key_bands(q0, m, j0, n, seq->nq, seq->nk, p->window_left, p->window_right, band);
    if (full && c->bf16)
        uk->gemm_bf16(n, mp, (d + 1) / 2, ko->k, ko->krs, 2, (const uint32_t *)qt, L->ldq, s,
                      L->lds, 0);
    else if (full)
        uk->gemm(n, mp, d, ko->k, ko->krs, ko->kcs, qt, L->ldq, s, L->lds, 0);
    for (int i = 0; i < bands; i++) {
        const fp_key_band *x = &band[i];
        float *sx = s + (ptrdiff_t)x->r0 * L->lds + x->x0;
        if (c->bf16)
            uk->gemm_bf16(x->rows, x->cols, (d + 1) / 2, (const uint16_t *)ko->k + x->r0 * ko->krs,
                          ko->krs, 2, (const uint32_t *)qt + x->x0, L->ldq, sx, L->lds, 0);
        else
            uk->gemm(x->rows, x->cols, d, (const float *)ko->k + x->r0 * ko->krs, ko->krs, ko->kcs,
                     qt + x->x0, L->ldq, sx, L->lds, 0);
    }

    float mul = c->scale * FP_LOG2E;
    if (p->softcap > 0.0f || slope != 0.0f) {
        transform_tile(s, L->lds, n, m, q0, j0, seq, p, c->scale, slope);
        mul = 1.0f;
    }
    if (!full)
        fp_tile_fill_masked(s, L->lds, n, m, q0, j0, seq->nq, seq->nk, p->window_left,
                            p->window_right, -INFINITY);

    /* Online softmax (core/online_softmax.h, exp2 form), one query per column: on f32 products
     * the table's softmax_cols (the column maxima, the update vectorized over the queries, P and
     * l), whose rescale of O then rides on O += P V (gemm_rs); on bf16 products the steps one by
     * one, P rounded to bf16 pairs. */
    int rescale = 0;
    if (c->bf16) {
        for (int x = 0; x < mp; x++)
            bm[x] = -INFINITY;
        uk->col_max(n, mp, s, L->lds, bm);
        for (int x = 0; x < m; x++) {
            fp_softmax_state t = {sm[x], sl[x]};
            const float block_max = bm[x] * mul;
            alpha[x] = 1.0f;
            if (block_max > t.m) {
                alpha[x] = fp_softmax_update_exp2(&t, block_max);
                rescale |= alpha[x] != 1.0f;
            }
            /* A column that has seen only -inf keeps m = -inf; its scores are all -inf, which
             * give 0 against any finite subtrahend. */
            sub[x] = fp_softmax_exp_base(&t);
            sm[x] = t.m;
            sl[x] = t.l;
            bsum[x] = 0.0f;
        }
    } else {
        rescale = uk->softmax_cols(n, mp, s, L->lds, mul, sm, sl, alpha);
        if (c->fp8) /* after P's unrounded sum went into l */
            round_p_e4m3(s, L->lds, n, m);
    }

    /* O += P V (O first rescaled by alpha where the maximum grew). fp8: V is an f32 tile. */
    const fp_block vf = {(void *)ko->v, FLASHPORT_F32, 0, ko->ldv, 1};
    if (!full && !fp_block_finite(c->fp8 ? &vf : &ko->vb, n, d)) {
        if (rescale)
            uk->scale_rows(m, d, o, L->ldd, alpha);
        if (c->bf16)
            uk->exp2_cols(n, mp, s, L->lds, mul, sub, bsum);
        pv_visible(o, L->ldd, s, L->lds, c->fp8 ? &vf : &ko->vb, n, m, d, q0, j0, seq, p);
    } else if (c->bf16) {
        if (rescale)
            uk->scale_rows(m, d, o, L->ldd, alpha);
        uk->exp2_cols_bf16(n, mp, s, L->lds, mul, sub, bsum, pp, L->lds);
        if (full)
            uk->gemm_bf16(m, d, (n + 1) / 2, (const uint16_t *)pp, 2, 2 * (ptrdiff_t)L->lds, ko->v,
                          ko->ldv, o, L->ldd, 1);
        else
            for (int x = 0; x < m; x += FP_TILE_COLS) { /* a column group over its key pairs */
                int r0, r1;
                group_keys(band, bands, x, &r0, &r1);
                const int mg = m - x < FP_TILE_COLS ? m - x : FP_TILE_COLS;
                const int a = r0 / 2, b = (r1 + 1) / 2; /* the pairs' other rows: masked, 0 */
                if (b > a)
                    uk->gemm_bf16(mg, d, b - a,
                                  (const uint16_t *)(pp + (ptrdiff_t)a * L->lds) + 2 * x, 2,
                                  2 * (ptrdiff_t)L->lds, (const uint32_t *)ko->v + a * ko->ldv,
                                  ko->ldv, o + (ptrdiff_t)x * L->ldd, L->ldd, 1);
            }
    } else if (full) {
        if (rescale)
            uk->gemm_rs(m, d, n, s, 1, L->lds, ko->v, ko->ldv, o, L->ldd, alpha);
        else
            uk->gemm(m, d, n, s, 1, L->lds, ko->v, ko->ldv, o, L->ldd, 1);
    } else {
        for (int x = 0; x < m; x += FP_TILE_COLS) { /* a column group over its keys */
            int r0, r1;
            group_keys(band, bands, x, &r0, &r1);
            const int mg = m - x < FP_TILE_COLS ? m - x : FP_TILE_COLS;
            float *ox = o + (ptrdiff_t)x * L->ldd;
            const float *px = s + (ptrdiff_t)r0 * L->lds + x,
                        *vx = (const float *)ko->v + r0 * ko->ldv;
            if (r1 > r0 && rescale)
                uk->gemm_rs(mg, d, r1 - r0, px, 1, L->lds, vx, ko->ldv, ox, L->ldd, alpha + x);
            else if (r1 > r0)
                uk->gemm(mg, d, r1 - r0, px, 1, L->lds, vx, ko->ldv, ox, L->ldd, 1);
            else if (rescale) /* no visible key: alpha is 1 there, kept exact all the same */
                uk->scale_rows(mg, d, ox, L->ldd, alpha + x);
        }
    }
    if (c->bf16)
        for (int x = 0; x < m; x++)
            sl[x] += bsum[x];
}

/* Points ko at key block [j0, j0 + n) of (b, kvh): K and V in place where the products can read
 * them (or the stage's f32 rows), else converted once into the kt and vt tiles. */
static void key_ops_of(const fwd_ctx *c, float *scratch, fp_kv_stage *stage, const fp_seq *seq,
                       int64_t b, int64_t kvh, int64_t j0, int n, int64_t hi, key_ops *ko)
{
    const fp_problem *p = c->p;
    const fp_ukernels *uk = c->uk;
    const fwd_layout *L = &c->L;
    const int d = (int)p->head_dim;
    ko->j0 = j0;
    ko->n = n;
    ko->kb = key_block(p, &p->k, b, seq, j0, n, kvh, scratch + L->gk);
    ko->vb = key_block(p, &p->v, b, seq, j0, n, kvh, scratch + L->gv);
    if (c->prefetch && j0 + BLOCK_K < hi &&
        !(stage && fp_kv_stage_ready(stage, b, kvh, j0 + BLOCK_K))) {
        const int n_next = (int)(hi - j0 - BLOCK_K < BLOCK_K ? hi - j0 - BLOCK_K : BLOCK_K);
        fp_block next = ko->kb;
        next.off += BLOCK_K * ko->kb.rs;
        fp_block_prefetch(&next, n_next, d);
        next = ko->vb;
        next.off += BLOCK_K * ko->vb.rs;
        fp_block_prefetch(&next, n_next, d);
    }
    if (stage)
        fp_kv_stage_rows(stage, b, kvh, seq->nk, j0, n, d, uk, &ko->kb, &ko->vb);

    const fp_block *kb = &ko->kb, *vb = &ko->vb;
    ko->kcs = 1;
    if (c->bf16) {
        ko->k = (const uint16_t *)kb->data + kb->off;
        ko->krs = kb->rs;
        if (!c->k_direct) {
            fp_tile_load_bf16((uint16_t *)(scratch + L->kt), 2 * L->ldd, kb, n, d);
            ko->k = scratch + L->kt;
            ko->krs = 2 * L->ldd;
        }
        fp_tile_pairs_rows((uint32_t *)(scratch + L->vt), L->ldd, vb, n, d, uk);
        ko->v = scratch + L->vt;
        ko->ldv = L->ldd;
        return;
    }
    if (c->fp8) {
        fp8_tile_load(scratch + L->kt, L->ldd, kb, n, d);
        fp8_tile_load(scratch + L->vt, L->ldd, vb, n, d);
        ko->k = scratch + L->kt;
        ko->krs = L->ldd;
        ko->v = scratch + L->vt;
        ko->ldv = L->ldd;
        return;
    }
    if (c->k_direct) {
        ko->k = (const float *)kb->data + kb->off;
        ko->krs = kb->rs;
        ko->kcs = kb->cs;
    } else {
        fp_tile_load(scratch + L->kt, L->ldd, kb, n, d, uk);
        ko->k = scratch + L->kt;
        ko->krs = L->ldd;
    }
    if (c->v_direct) {
        ko->v = (const float *)vb->data + vb->off;
        ko->ldv = vb->rs;
    } else {
        fp_tile_load(scratch + L->vt, L->ldd, vb, n, d, uk);
        ko->v = scratch + L->vt;
        ko->ldv = L->ldd;
    }
}

/* One task: query rows [i0, i0 + m) of (b, h), in sub-blocks of at most BLOCK_Q queries against
 * each key block it sees (stage: the thread's stage when c->stage). A task holds up to bq queries
 * so that each key block is read from memory once for all of them, and a sub-block's score tile
 * stays in L1; a sub-block skips the key blocks its own rows cannot see (the diagonal of a causal
 * mask is cut at BLOCK_Q rows, not bq). */
static void fwd_block(const fwd_ctx *c, float *scratch, fp_kv_stage *stage, int64_t b, int64_t h,
                      int64_t i0)
{
    const fp_problem *p = c->p;
    const fp_ukernels *uk = c->uk;
    const fwd_layout *L = &c->L;
    const fp_seq seq = fp_problem_seq(p, b);
    if (i0 >= seq.nq)
        return;
    const int d = (int)p->head_dim;
    const int m = (int)(seq.nq - i0 < L->bq ? seq.nq - i0 : L->bq);
    const int mp = fp_tile_ld(m);
    const int64_t kvh = fp_kv_head(p, h);
    float *qt = scratch + L->qt, *o = scratch + L->o, *sub = scratch + L->sub;
    float *sm = scratch + L->sm, *sl = scratch + L->sl;

    const fp_block qb = {p->q.data, p->dtype, fp_row_offset(&p->q, b, seq.q_start + i0, h),
                         p->q.stride[FP_S], p->q.stride[FP_D]};
    if (c->bf16)
        fp_tile_pairs_t((uint32_t *)qt, L->ldq, &qb, m, d, uk);
    else if (c->fp8)
        fp8_tile_load_t(qt, L->ldq, &qb, m, d);
    else
        fp_tile_load_t(qt, L->ldq, &qb, m, d, uk);
    for (int x = 0; x < mp; x++) {
        fp_softmax_state t;
        fp_softmax_init(&t);
        sm[x] = t.m;
        sl[x] = t.l;
        sub[x] = 0.0f; /* finite for padding columns too; real ones are set per block */
    }
    memset(o, 0, sizeof(float) * (size_t)m * (size_t)L->ldd);

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + m, seq.nq, seq.nk, p->window_left, p->window_right, &lo, &hi);
    for (int64_t j0 = lo; j0 < hi; j0 += BLOCK_K) {
        const int n = (int)(hi - j0 < BLOCK_K ? hi - j0 : BLOCK_K);
        key_ops ko;
        key_ops_of(c, scratch, stage, &seq, b, kvh, j0, n, hi, &ko);
        for (int x0 = 0; x0 < m; x0 += BLOCK_Q) {
            const int ms = m - x0 < BLOCK_Q ? m - x0 : BLOCK_Q;
            int64_t slo, shi;
            fp_mask_block_range(i0 + x0, i0 + x0 + ms, seq.nq, seq.nk, p->window_left,
                                p->window_right, &slo, &shi);
            if (j0 + n > slo && j0 < shi) /* else every pair is masked: nothing to add */
                fwd_sub_block(c, scratch, &seq, h, i0, x0, ms, &ko);
        }
    }

    for (int r = 0; r < m; r++) {
        float *orow = o + (size_t)r * L->ldd;
        const fp_softmax_state t = {sm[r], sl[r]};
        float f = fp_softmax_out_scale(&t) * p->descale_v; /* descale_v: 1 unless fp8 */
        if (f == 0.0f)                                     /* no visible key: O = 0 */
            memset(orow, 0, sizeof(float) * (size_t)d);
        else
            for (int x = 0; x < d; x++)
                orow[x] *= f;
    }
    const fp_block ob = {p->o.data, p->o_dtype, fp_row_offset(&p->o, b, seq.q_start + i0, h),
                         p->o.stride[FP_S], p->o.stride[FP_D]};
    fp_tile_store(&ob, o, L->ldd, m, d, 1.0f, uk);
    if (p->lse.data) {
        float *lse = (float *)p->lse.data;
        for (int r = 0; r < m; r++) {
            const fp_softmax_state t = {sm[r], sl[r]};
            lse[fp_lse_offset(&p->lse, b, h, seq.q_start + i0 + r)] = fp_softmax_lse_exp2(&t);
        }
    }
}

flashport_status fp_cpu_flash_forward(const fp_problem *p)
{
    fwd_ctx c;
    c.p = p;
    flashport_status status = fp_cpu_ukernels(&c.uk, NULL);
    if (status != FLASHPORT_OK)
        return status;
    if (fp_cpu_decode_eligible(p))
        return fp_cpu_decode_forward(p, c.uk); /* logs its plan itself */
    const int64_t d = p->head_dim;
    c.bf16 = p->dtype == FLASHPORT_BF16 && c.uk->gemm_bf16 != NULL && !c.uk->bf16_as_f32;
    /* In place: f32 K with any strides; bf16 K whose pairs are contiguous and never run past a
     * row (even d); f32 V whose rows the product reads whole (d a multiple of 16). */
    c.k_direct = c.bf16 ? p->k.stride[FP_D] == 1 && d % 2 == 0 : p->dtype == FLASHPORT_F32;
    c.v_direct =
        !c.bf16 && p->dtype == FLASHPORT_F32 && p->v.stride[FP_D] == 1 && d % FP_TILE_COLS == 0;
    c.L = fwd_layout_of(d, fwd_block_q(c.uk, p->seqlen_q));
    c.fp8 = fp_is_fp8(p->dtype);
    /* f16, and bf16 without bf16 products, would otherwise convert a key block once per query
     * block that sees it; staged, the products read the f32 copy in place. f32 is staged too on
     * tables that set fwd_stage_f32 (AVX2; AVX-512 on Intel cores, isa.c): the copy's rows lie
     * fp_tile_ld_sets apart, where the caller's (H * d apart, a power of two in most layouts)
     * crowd a few L1 sets in every product that reads them. Paged caches keep converting per
     * block (their rows are not linear in the key). */
    const int stage_f32 = p->dtype == FLASHPORT_F32 && c.uk->fwd_block_q > 0 && c.uk->fwd_stage_f32;
    c.stage = !c.bf16 && (p->dtype == FLASHPORT_F16 || p->dtype == FLASHPORT_BF16 || stage_f32) &&
              !p->block_table &&
              fp_kv_stage_floats(p->seqlen_k, d) * sizeof(float) <= STAGE_MAX_BYTES;
    if (c.stage)
        c.k_direct = c.v_direct = 1;
    /* f32 not staged (fwd_stage_f32 unset, paged, or longer than the stage) in tasks of several
     * sub-blocks: K and V are copied once per task and key block into tiles at the same stride. */
    if (p->dtype == FLASHPORT_F32 && !c.stage && c.L.bq > BLOCK_Q)
        c.k_direct = c.v_direct = 0;
    c.scale = c.fp8 ? p->scale * p->descale_q * p->descale_k : p->scale;
    /* A stage reads each key block of the caller's once per thread, so its fill keeps the
     * prefetch (key_ops_of stops it where the stage is ready); in tasks of several sub-blocks one
     * prefetch serves them all. */
    c.prefetch =
        !p->block_table &&
        (c.stage || c.L.bq > BLOCK_Q ||
         2 * (size_t)p->seqlen_k * (size_t)d * flashport_dtype_size(p->dtype) > PREFETCH_MIN_BYTES);
    if (fp_host()->log_enabled())
        fp_host()->log("cpu: flash forward (tiled, online softmax), %s micro-kernels: %s%s%s; "
                       "block_q=%d block_k=%d, %d threads",
                       c.uk->name,
                       c.bf16  ? "bf16 dot products (vdpbf16ps), P in bf16"
                       : c.fp8 ? "f32 products on fp8 inputs converted to f32, P rounded to e4m3"
                       : p->dtype == FLASHPORT_F32 ? "f32 products"
                                                   : "f32 products on inputs converted to f32",
                       c.stage      ? ", K and V staged as f32 once per thread and kv head"
                       : c.k_direct ? ", K read in place"
                                    : "",
                       !c.stage && c.v_direct ? ", V read in place" : "", c.L.bq, BLOCK_K,
                       fp_cpu_threads());

    const fp_plan_shape shape = fp_problem_plan_shape(p);
    /* Locality order: the threads work on the query blocks of one (batch, head) together and
     * share its K and V in L3, instead of each streaming another head's from memory. */
    const fp_plan_target target = {fp_cpu_threads(), c.L.bq, BLOCK_K, 1, FP_PLAN_ORDER_LOCALITY};
    const fp_plan plan = fp_plan_forward(&shape, &target);
    if (plan.num_tasks == 0)
        return FLASHPORT_OK;
    const int threads = plan.num_tasks < target.workers ? (int)plan.num_tasks : (int)target.workers;

    /* A thread's slice: its tiles, then (c.stage) its stage, on a 64-byte boundary. */
    size_t slice;
    const size_t stage_at = (c.L.total + 15) / 16 * 16;
    const size_t floats = c.stage ? stage_at + fp_kv_stage_floats(p->seqlen_k, d) : c.L.total;
    float *scratch =
        fp_scratch_alloc(threads, floats, c.L.total, &slice); /* stage: written first */
    if (!scratch)
        return fp_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                    "cpu flash forward: cannot allocate %d x %zu bytes of scratch",
                                    threads, floats * sizeof(float));

#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
#ifdef _OPENMP
        float *mine = scratch + slice * (size_t)omp_get_thread_num();
#else
        float *mine = scratch;
#endif
        fp_kv_stage st = {0};
        if (c.stage)
            st = fp_kv_stage_init(mine + stage_at, p->seqlen_k, d);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < plan.num_tasks; t++) {
            const fp_plan_task task = fp_plan_task_at(&plan, &shape, t);
            fwd_block(&c, mine, c.stage ? &st : NULL, task.batch, task.head, task.q_block * c.L.bq);
        }
    }
    fp_scratch_free(scratch);
    return FLASHPORT_OK;
}
