/*
 * CPU decode forward: few query rows per sequence (Nq <= FP_CPU_DECODE_MAX_NQ) against a long KV
 * cache, dense, varlen or paged (docs/semantics.md, "KV cache"), where the read of K and V is
 * the bound, not the products.
 *
 * GQA packing: the H / Hkv query heads that share a kv head, times their Nq rows, are the rows of
 * one query tile (row r = g * Nq + i: head kvh * group + g, query i), so each K and V byte is read
 * once per kv head instead of once per query head. A group of more than DECODE_ROWS rows is cut
 * into chunks of whole heads (then K and V are read once per chunk).
 *
 * Per key block of at most BLOCK_K keys: K^T as a tile (transpose32 of the keys' rows in place, in
 * runs that end at a page's end: f32 elements, or bf16 pairs on a CPU with AVX512_BF16; f16 rows
 * are converted to f32 first), S = Q K^T by the table's
 * gemm with the packed rows as its A operand and the keys across the columns (no padding of a
 * one-row query tile to FP_TILE_COLS columns), softcap / ALiBi / the window per row (core/mask.h,
 * Nq > 1 rows see different keys), the online softmax per row (core/online_softmax.h, exp2 form,
 * the table's exp2), O += P V by gemm with V's f32 rows (in place when f32 with contiguous rows of
 * a multiple of FP_TILE_COLS, else converted). All products and exponentials run in the
 * micro-kernel table chosen at run time (ukernel.h, isa.c: AVX-512, AVX2, NEON or plain C); bf16
 * inputs on the avx512bf16 table stay bf16: S and P V by gemm_bf16 (vdpbf16ps) with P rounded
 * to bf16, V as pairs of rows (interleave_bf16), as flash_fwd.c's bf16 path.
 *
 * Split-KV: core/plan.h's fp_plan_forward, with (batch, kv head, head chunk) as its "heads" and
 * the CPU's threads as workers, splits the keys when there are fewer tasks than threads; each
 * split writes its normalized partial O and LSE, and a second pass merges them through the LSE
 * (fp_softmax_merge). The plan is logged (FLASHPORT_LOG).
 *
 * A block that not every row sees whole (window edges) and that holds an infinite or NaN V takes a
 * scalar P V over the visible pairs, so that a key a row cannot see never reaches it (the NaN rule
 * of include/flashport.h); keys past seqused_k are never read at all.
 * Extra memory: per-thread tiles, and the partial results of a split plan (splits x rows x D f32).
 * Numbers: docs/performance-cpu.md ("Decode").
 */
#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/flash_tile.h"

#include "core/dtype.h"
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

enum { DECODE_ROWS = 64, BLOCK_K = 64, MAX_SPLITS = 64 };

typedef struct dec_layout {
    int ldd, ldk;    /* leading dims: d-wide and BLOCK_K-wide tiles */
    size_t q, o;     /* DECODE_ROWS x d: packed query rows (f32), output accumulator */
    size_t s;        /* DECODE_ROWS x BLOCK_K: scores, then P */
    size_t kf, vf;   /* BLOCK_K x d: K and V rows converted to f32 */
    size_t kt;       /* d x BLOCK_K: K^T */
    size_t st;       /* DECODE_ROWS fp_softmax_state */
    size_t alpha;    /* DECODE_ROWS rescale factors */
    size_t sub, sum; /* BLOCK_K: one row's subtrahend, broadcast; its column sums */
    size_t total;
} dec_layout;

static dec_layout dec_layout_of(int64_t d)
{
    dec_layout L;
    L.ldd = fp_tile_ld(d);
    L.ldk = fp_tile_ld(BLOCK_K);
    L.q = 0;
    L.o = L.q + (size_t)DECODE_ROWS * L.ldd;
    L.s = L.o + (size_t)DECODE_ROWS * L.ldd;
    L.kf = L.s + (size_t)DECODE_ROWS * L.ldk;
    L.vf = L.kf + (size_t)BLOCK_K * L.ldd;
    L.kt = L.vf + (size_t)BLOCK_K * L.ldd;
    L.st = L.kt + (size_t)L.ldd * L.ldk;
    L.alpha = L.st + 2 * (size_t)DECODE_ROWS;
    L.sub = L.alpha + (size_t)DECODE_ROWS;
    L.sum = L.sub + (size_t)L.ldk;
    L.total = L.sum + (size_t)L.ldk;
    return L;
}

typedef struct dec_ctx {
    const fp_problem *p;
    const fp_ukernels *uk;
    dec_layout L;
    int bf16;            /* bf16 dot products (gemm_bf16) on K, V and Q in place */
    int64_t group;       /* query heads per kv head */
    int64_t chunk_heads; /* query heads per task */
    int64_t chunks;      /* tasks per (batch, kv head) */
    fp_plan plan;
    fp_plan_shape shape;
    float *part_o;   /* split plans: [task][row][d] normalized partial O */
    float *part_lse; /* [task][row] natural-log LSE of each partial */
} dec_ctx;

int fp_cpu_decode_eligible(const fp_problem *p)
{
    return p->seqlen_q >= 1 && p->seqlen_q <= FP_CPU_DECODE_MAX_NQ;
}

/* Pointer to the f32 row of key j (of sequence b, kv head kvh) in view t: in place when the
 * tensor is f32 with a contiguous head dim, else converted into dst. */
static const float *key_row(const dec_ctx *c, const fp_tensor_view *t, int64_t b, const fp_seq *seq,
                            int64_t j, int64_t kvh, float *dst)
{
    const fp_problem *p = c->p;
    const int64_t off = fp_key_offset(p, t, b, seq, j, kvh);
    const int d = (int)p->head_dim;
    if (t->stride[FP_D] == 1) {
        switch (p->dtype) {
        case FLASHPORT_F32:
            return (const float *)t->data + off;
        case FLASHPORT_F16:
            c->uk->cvt_f16(d, (const uint16_t *)t->data + off, dst);
            return dst;
        case FLASHPORT_BF16:
            c->uk->cvt_bf16(d, (const uint16_t *)t->data + off, dst);
            return dst;
        default:
            break;
        }
    }
    for (int e = 0; e < d; e++)
        dst[e] = fp_load(t->data, off + e * t->stride[FP_D], p->dtype);
    return dst;
}

/* Whether rows [j0, j0 + n) of view t are f32 rows a uniform stride apart that can be read in
 * place (dense or varlen, or one page). */
static int rows_in_place(const dec_ctx *c, const fp_tensor_view *t, int64_t j0, int n)
{
    const fp_problem *p = c->p;
    if (p->dtype != FLASHPORT_F32 || t->stride[FP_D] != 1)
        return 0;
    return !p->block_table || j0 / p->page_size == (j0 + n - 1) / p->page_size;
}

/* Asks the caches for the K and V rows of keys [j0, j0 + n) (one BLOCK_K ahead of the block being
 * computed). Each row is D elements, a few cache lines, Hkv rows apart in a [N, Hkv, D] cache (or
 * in another page): too short a run for the hardware prefetchers to follow, which left the
 * decode loop waiting on memory at a fraction of the bandwidth. */
static void prefetch_keys(const dec_ctx *c, int64_t b, const fp_seq *seq, int64_t kvh, int64_t j0,
                          int n)
{
    const fp_problem *p = c->p;
    const size_t es = flashport_dtype_size(p->dtype);
    const size_t bytes = (size_t)p->head_dim * es;
    if (p->k.stride[FP_D] != 1 || p->v.stride[FP_D] != 1)
        return;
    for (int x = 0; x < n; x++) {
        const char *k =
            (const char *)p->k.data + (size_t)fp_key_offset(p, &p->k, b, seq, j0 + x, kvh) * es;
        const char *v =
            (const char *)p->v.data + (size_t)fp_key_offset(p, &p->v, b, seq, j0 + x, kvh) * es;
        for (size_t at = 0; at < bytes; at += 64) {
            __builtin_prefetch(k + at, 0, 2);
            __builtin_prefetch(v + at, 0, 2);
        }
    }
}

/* K^T from the caller's rows of keys [j0, j0 + n), in place: kt[c * ldk + x] = 32-bit word c of
 * key j0 + x's row (an f32 element, or a pair of bf16 ones), `words` words per row, in runs of rows
 * a uniform stride apart (the whole block when dense; up to a page's end when paged). */
static void transpose_keys(const dec_ctx *c, int64_t b, const fp_seq *seq, int64_t kvh, int64_t j0,
                           int n, int words, uint32_t *kt)
{
    const fp_problem *p = c->p;
    const size_t es = flashport_dtype_size(p->dtype);
    for (int x = 0; x < n;) {
        int run = n - x;
        if (p->block_table) {
            const int64_t left = p->page_size - (j0 + x) % p->page_size;
            run = left < run ? (int)left : run;
        }
        const char *src =
            (const char *)p->k.data + (size_t)fp_key_offset(p, &p->k, b, seq, j0 + x, kvh) * es;
        c->uk->transpose32(run, words, src, (ptrdiff_t)p->k.stride[FP_S] * (ptrdiff_t)es, kt + x,
                           c->L.ldk);
        x += run;
    }
}

/* bf16 V rows as pairs down the rows for gemm_bf16: vp[r2 * ldd + e] = V[2 r2][e] | V[2 r2 + 1][e]
 * << 16 (a missing odd row is 0). Returns 0 when a row holds an infinity or NaN and the caller
 * asked (check), else 1. */
static int pair_values(const dec_ctx *c, int64_t b, const fp_seq *seq, int64_t kvh, int64_t j0,
                       int n, uint32_t *vp, int check)
{
    const fp_problem *p = c->p;
    const int d = (int)p->head_dim;
    int finite = 1;
    for (int x = 0; x < n; x += 2) {
        const uint16_t *even =
            (const uint16_t *)p->v.data + fp_key_offset(p, &p->v, b, seq, j0 + x, kvh);
        const uint16_t *odd = x + 1 < n ? (const uint16_t *)p->v.data +
                                              fp_key_offset(p, &p->v, b, seq, j0 + x + 1, kvh)
                                        : NULL;
        c->uk->interleave_bf16(d, even, odd, vp + (size_t)(x / 2) * (size_t)c->L.ldd);
        for (int e = 0; check && e < d; e++) /* an all-ones exponent: inf or NaN */
            finite &= (even[e] & 0x7f80u) != 0x7f80u && (!odd || (odd[e] & 0x7f80u) != 0x7f80u);
    }
    return finite;
}

/* O += P V over the visible (row, key) pairs only, V read element by element: for a block that
 * not every row sees whole and whose V holds an infinite or NaN element. */
static void pv_visible(const dec_ctx *c, float *o, const float *s, const fp_seq *seq,
                       const float *const *vrows, int64_t j0, int n, int rows, int64_t nq)
{
    const fp_problem *p = c->p;
    const int d = (int)p->head_dim;
    for (int r = 0; r < rows; r++) {
        const int64_t i = r % nq;
        float *orow = o + (size_t)r * c->L.ldd;
        for (int x = 0; x < n; x++) {
            if (!fp_mask_visible(i, j0 + x, seq->nq, seq->nk, p->window_left, p->window_right))
                continue;
            const float w = s[(size_t)r * c->L.ldk + x];
            for (int e = 0; e < d; e++)
                orow[e] += w * vrows[x][e];
        }
    }
}

/* One task: the rows of query heads [h0, h0 + nh) of kv head kvh of sequence b, over the keys
 * of split `split`. Writes O and LSE (one split) or the partial of task index `task`. */
static void dec_task(const dec_ctx *c, float *scratch, int64_t b, int64_t kvh, int64_t chunk,
                     int split, int64_t task)
{
    const fp_problem *p = c->p;
    const fp_ukernels *uk = c->uk;
    const dec_layout *L = &c->L;
    const fp_seq seq = fp_problem_seq(p, b);
    const int64_t nq = seq.nq;
    const int64_t h0 = kvh * c->group + chunk * c->chunk_heads;
    const int64_t nh = c->chunk_heads;
    const int rows = (int)(nh * nq);
    const int d = (int)p->head_dim;
    const int split_plan = c->plan.num_splits > 1;
    float *q = scratch + L->q, *o = scratch + L->o, *s = scratch + L->s;
    float *kf = scratch + L->kf, *vf = scratch + L->vf, *kt = scratch + L->kt;
    fp_softmax_state *st = (fp_softmax_state *)(scratch + L->st);
    float *alpha = scratch + L->alpha, *sub = scratch + L->sub, *sum = scratch + L->sum;
    const float *vrows[BLOCK_K];
    if (rows == 0)
        return;

    for (int64_t g = 0; g < nh; g++) {
        const fp_block qb = {p->q.data, p->dtype, fp_row_offset(&p->q, b, seq.q_start, h0 + g),
                             p->q.stride[FP_S], p->q.stride[FP_D]};
        if (c->bf16) /* bf16 rows, 2 ldd elements apart */
            for (int64_t i = 0; i < nq; i++)
                memcpy((uint16_t *)q + (size_t)(g * nq + i) * 2 * (size_t)L->ldd,
                       (const uint16_t *)qb.data + qb.off + i * qb.rs,
                       sizeof(uint16_t) * (size_t)d);
        else
            fp_tile_load(q + (size_t)(g * nq) * L->ldd, L->ldd, &qb, (int)nq, d, uk);
    }
    for (int r = 0; r < rows; r++)
        fp_softmax_init(&st[r]);
    memset(o, 0, sizeof(float) * (size_t)rows * (size_t)L->ldd);

    /* Keys any row sees, cut to this split. */
    int64_t lo, hi;
    fp_mask_block_range(0, nq, seq.nq, seq.nk, p->window_left, p->window_right, &lo, &hi);
    const int64_t k0 = (int64_t)split * c->plan.keys_per_split;
    const int64_t k1 = k0 + c->plan.keys_per_split;
    lo = lo > k0 ? lo : k0;
    hi = hi < k1 ? hi : k1;
    const float log2_scale = p->scale * FP_LOG2E;

    for (int64_t j0 = lo; j0 < hi; j0 += BLOCK_K) {
        const int n = (int)(hi - j0 < BLOCK_K ? hi - j0 : BLOCK_K);
        if (j0 + BLOCK_K < hi)
            prefetch_keys(c, b, &seq, kvh, j0 + BLOCK_K,
                          (int)(hi - j0 - BLOCK_K < BLOCK_K ? hi - j0 - BLOCK_K : BLOCK_K));
        /* K^T (d x n; bf16: d / 2 x n pairs), then S = Q K^T, raw dot products, rows x n */
        if (c->bf16) {
            transpose_keys(c, b, &seq, kvh, j0, n, d / 2, (uint32_t *)kt);
            uk->gemm_bf16(rows, n, d / 2, (const uint16_t *)q, 2 * L->ldd, 2, (const uint32_t *)kt,
                          L->ldk, s, L->ldk, 0);
        } else if (p->dtype == FLASHPORT_F32 && p->k.stride[FP_D] == 1) {
            transpose_keys(c, b, &seq, kvh, j0, n, d, (uint32_t *)kt);
        } else if (rows_in_place(c, &p->k, j0, n)) {
            const float *k = (const float *)p->k.data + fp_key_offset(p, &p->k, b, &seq, j0, kvh);
            uk->transpose32(n, d, k, (ptrdiff_t)p->k.stride[FP_S] * (ptrdiff_t)sizeof(float),
                            (uint32_t *)kt, L->ldk);
        } else {
            for (int x = 0; x < n; x++) {
                float *dst = kf + (size_t)x * L->ldd;
                const float *src = key_row(c, &p->k, b, &seq, j0 + x, kvh, dst);
                if (src != dst)
                    memcpy(dst, src, sizeof(float) * (size_t)d);
            }
            uk->transpose32(n, d, kf, (ptrdiff_t)L->ldd * (ptrdiff_t)sizeof(float), (uint32_t *)kt,
                            L->ldk);
        }
        if (!c->bf16)
            uk->gemm(rows, n, d, q, L->ldd, 1, kt, L->ldk, s, L->ldk, 0);

        const int full =
            fp_mask_block_full(0, nq, j0, j0 + n, seq.nq, seq.nk, p->window_left, p->window_right);
        int rescale = 0;
        for (int r = 0; r < rows; r++) {
            const int64_t i = r % nq, h = h0 + r / nq;
            const float slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0f;
            float *srow = s + (size_t)r * L->ldk;
            float mul = log2_scale;
            if (p->softcap > 0.0f || slope != 0.0f) {
                for (int x = 0; x < n; x++) {
                    const float dist = fp_alibi_distance(i, j0 + x, seq.nq, seq.nk);
                    srow[x] =
                        fp_score_transform(srow[x] * p->scale, p->softcap, slope, dist) * FP_LOG2E;
                }
                mul = 1.0f;
            }
            if (!full) {
                const int64_t a = fp_mask_lo(i, seq.nq, seq.nk, p->window_left) - j0;
                const int64_t e = fp_mask_hi(i, seq.nq, seq.nk, p->window_right) - j0;
                for (int x = 0; x < n; x++)
                    if (x < a || x >= e)
                        srow[x] = -INFINITY;
            }
            /* A NaN score makes the row's state NaN for good: its O and LSE are NaN. */
            float mx = -INFINITY;
            int nan = 0;
            for (int x = 0; x < n; x++) {
                nan |= isnan(srow[x]);
                mx = srow[x] > mx ? srow[x] : mx;
            }
            mx *= mul;
            alpha[r] = 1.0f;
            if (nan) {
                st[r].m = NAN;
                st[r].l = NAN;
            } else if (mx > st[r].m) {
                alpha[r] = fp_softmax_update_exp2(&st[r], mx);
                rescale |= alpha[r] != 1.0f;
            }
            const float base = fp_softmax_exp_base(&st[r]);
            for (int x = 0; x < L->ldk; x++) {
                sub[x] = isnan(base) ? 0.0f : base;
                sum[x] = 0.0f;
            }
            uk->exp2_cols(1, n, srow, L->ldk, mul, sub, sum);
            float l = 0.0f;
            for (int x = 0; x < n; x++)
                l += sum[x];
            st[r].l += isnan(base) ? NAN : l;
        }
        if (rescale)
            uk->scale_rows(rows, d, o, L->ldd, alpha);

        /* O += P V; bf16: P rounded to bf16 (as flash_fwd.c's bf16 path does), V as pairs */
        if (c->bf16) {
            uint16_t *pb = (uint16_t *)kf; /* rows x ldk bf16 */
            uk->round_bf16(rows, n, s, L->ldk, pb, L->ldk, NULL, 0);
            if (pair_values(c, b, &seq, kvh, j0, n, (uint32_t *)vf, !full)) {
                uk->gemm_bf16(rows, d, (n + 1) / 2, pb, L->ldk, 2, (const uint32_t *)vf, L->ldd, o,
                              L->ldd, 1);
                continue;
            }
            /* an infinite or NaN V in a block not every row sees whole: f32, visible pairs */
            for (int x = 0; x < n; x++)
                vrows[x] = key_row(c, &p->v, b, &seq, j0 + x, kvh, vf + (size_t)x * L->ldd);
            pv_visible(c, o, s, &seq, vrows, j0, n, rows, nq);
            continue;
        }
        const float *vt;
        ptrdiff_t ldv;
        int finite = 1;
        if (rows_in_place(c, &p->v, j0, n) && d % FP_TILE_COLS == 0) {
            vt = (const float *)p->v.data + fp_key_offset(p, &p->v, b, &seq, j0, kvh);
            ldv = (ptrdiff_t)p->v.stride[FP_S];
            for (int x = 0; x < n; x++)
                vrows[x] = vt + x * ldv;
        } else {
            for (int x = 0; x < n; x++) {
                float *dst = vf + (size_t)x * L->ldd;
                const float *src = key_row(c, &p->v, b, &seq, j0 + x, kvh, dst);
                if (src != dst)
                    memcpy(dst, src, sizeof(float) * (size_t)d);
                vrows[x] = dst;
            }
            vt = vf;
            ldv = L->ldd;
        }
        if (!full)
            for (int x = 0; x < n && finite; x++)
                for (int e = 0; e < d && finite; e++)
                    finite = isfinite(vrows[x][e]);
        if (finite)
            uk->gemm(rows, d, n, s, L->ldk, 1, vt, ldv, o, L->ldd, 1);
        else
            pv_visible(c, o, s, &seq, vrows, j0, n, rows, nq);
    }

    for (int r = 0; r < rows; r++) {
        float *orow = o + (size_t)r * L->ldd;
        const float f = fp_softmax_out_scale(&st[r]);
        if (f == 0.0f) /* no visible key: O = 0 */
            memset(orow, 0, sizeof(float) * (size_t)d);
        else
            for (int x = 0; x < d; x++)
                orow[x] *= f;
    }
    if (split_plan) {
        for (int r = 0; r < rows; r++) {
            memcpy(c->part_o + ((size_t)task * DECODE_ROWS + (size_t)r) * (size_t)d,
                   o + (size_t)r * L->ldd, sizeof(float) * (size_t)d);
            c->part_lse[(size_t)task * DECODE_ROWS + (size_t)r] = fp_softmax_lse_exp2(&st[r]);
        }
        return;
    }
    for (int64_t g = 0; g < nh; g++) {
        const fp_block ob = {p->o.data, p->dtype, fp_row_offset(&p->o, b, seq.q_start, h0 + g),
                             p->o.stride[FP_S], p->o.stride[FP_D]};
        fp_tile_store(&ob, o + (size_t)(g * nq) * L->ldd, L->ldd, (int)nq, d, 1.0f, uk);
        if (p->lse.data)
            for (int64_t i = 0; i < nq; i++)
                ((float *)p->lse.data)[fp_lse_offset(&p->lse, b, h0 + g, seq.q_start + i)] =
                    fp_softmax_lse_exp2(&st[g * nq + i]);
    }
}

/* Split plans: merges the partials of the splits of (b, kv head, chunk) through their LSEs
 * (fp_softmax_merge) into O and LSE. first: the task index of split 0. */
static void dec_merge(const dec_ctx *c, float *scratch, int64_t b, int64_t kvh, int64_t chunk,
                      int64_t first)
{
    const fp_problem *p = c->p;
    const fp_seq seq = fp_problem_seq(p, b);
    const int64_t nq = seq.nq, h0 = kvh * c->group + chunk * c->chunk_heads;
    const int d = (int)p->head_dim;
    const int rows = (int)(c->chunk_heads * nq);
    float *o = scratch + c->L.o;
    for (int r = 0; r < rows; r++) {
        float *orow = o + (size_t)r * c->L.ldd;
        float lse = -INFINITY;
        memset(orow, 0, sizeof(float) * (size_t)d);
        for (int sp = 0; sp < c->plan.num_splits; sp++) {
            const size_t at = (size_t)(first + sp) * DECODE_ROWS + (size_t)r;
            const float *part = c->part_o + at * (size_t)d;
            float wa, wb;
            lse = fp_softmax_merge(lse, c->part_lse[at], &wa, &wb);
            for (int e = 0; e < d; e++)
                orow[e] = (wa == 0.0f ? 0.0f : wa * orow[e]) + (wb == 0.0f ? 0.0f : wb * part[e]);
        }
        if (p->lse.data)
            ((float *)p->lse.data)[fp_lse_offset(&p->lse, b, h0 + r / nq, seq.q_start + r % nq)] =
                lse;
    }
    for (int64_t g = 0; g < c->chunk_heads; g++) {
        const fp_block ob = {p->o.data, p->dtype, fp_row_offset(&p->o, b, seq.q_start, h0 + g),
                             p->o.stride[FP_S], p->o.stride[FP_D]};
        fp_tile_store(&ob, o + (size_t)(g * nq) * c->L.ldd, c->L.ldd, (int)nq, d, 1.0f, c->uk);
    }
}

flashport_status fp_cpu_decode_forward(const fp_problem *p, const fp_ukernels *uk)
{
    dec_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.uk = uk;
    c.L = dec_layout_of(p->head_dim);
    c.group = p->heads / p->kv_heads;
    c.bf16 = p->dtype == FLASHPORT_BF16 && uk->gemm_bf16 && p->head_dim % 2 == 0 &&
             p->q.stride[FP_D] == 1 && p->k.stride[FP_D] == 1 && p->v.stride[FP_D] == 1;
    /* Whole heads per task, at most DECODE_ROWS rows, the group cut into equal chunks. */
    int64_t per = DECODE_ROWS / p->seqlen_q;
    c.chunk_heads = c.group;
    while (c.chunk_heads > per || c.group % c.chunk_heads != 0)
        c.chunk_heads--;
    c.chunks = c.group / c.chunk_heads;

    const int workers = fp_cpu_threads();
    const fp_plan_shape shape = {p->batch, p->kv_heads * c.chunks, 1, p->seqlen_k, p->head_dim, -1,
                                 -1};
    const fp_plan_target target = {workers, 1, BLOCK_K, MAX_SPLITS, FP_PLAN_ORDER_LOCALITY};
    c.shape = shape;
    c.plan = fp_plan_forward(&shape, &target);
    if (fp_host()->log_enabled())
        fp_host()->log("cpu: decode forward (GQA packing: %lld query heads x %lld rows per kv-head "
                       "task, %lld task(s) per kv head), %s micro-kernels, %s%s; "
                       "split-KV plan: %d split(s) of %lld keys, %lld tasks for %d threads",
                       (long long)c.chunk_heads, (long long)p->seqlen_q, (long long)c.chunks,
                       uk->name,
                       c.bf16                      ? "bf16 dot products (vdpbf16ps), P in bf16"
                       : p->dtype == FLASHPORT_F32 ? "f32 products"
                                                   : "f32 products on K/V rows converted to f32",
                       p->block_table ? ", paged K/V" : "", (int)c.plan.num_splits,
                       (long long)c.plan.keys_per_split, (long long)c.plan.num_tasks, workers);
    if (c.plan.num_tasks == 0)
        return FLASHPORT_OK;
    const int threads = c.plan.num_tasks < workers ? (int)c.plan.num_tasks : workers;

    size_t slice;
    float *scratch = fp_scratch_alloc(threads, c.L.total, &slice);
    const size_t part =
        c.plan.num_splits > 1 ? (size_t)c.plan.num_tasks * DECODE_ROWS * (size_t)p->head_dim : 0;
    if (part) {
        c.part_o = malloc(sizeof(float) * part);
        c.part_lse = malloc(sizeof(float) * (size_t)c.plan.num_tasks * DECODE_ROWS);
    }
    if (!scratch || (part && (!c.part_o || !c.part_lse))) {
        fp_scratch_free(scratch);
        free(c.part_o);
        free(c.part_lse);
        return fp_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                    "cpu decode forward: cannot allocate %d x %zu bytes of tiles "
                                    "and %zu bytes of split partials",
                                    threads, c.L.total * sizeof(float), part * sizeof(float));
    }
    const int64_t units = c.plan.num_tasks / c.plan.num_splits;

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
        for (int64_t t = 0; t < c.plan.num_tasks; t++) {
            const fp_plan_task task = fp_plan_task_at(&c.plan, &c.shape, t);
            dec_task(&c, mine, task.batch, task.head / c.chunks, task.head % c.chunks, task.split,
                     (task.batch * shape.heads + task.head) * c.plan.num_splits + task.split);
        }
        if (part) {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t u = 0; u < units; u++)
                dec_merge(&c, mine, u / shape.heads, (u % shape.heads) / c.chunks,
                          (u % shape.heads) % c.chunks, u * c.plan.num_splits);
        }
    }
    fp_scratch_free(scratch);
    free(c.part_o);
    free(c.part_lse);
    return FLASHPORT_OK;
}
