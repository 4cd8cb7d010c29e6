/*
 * CPU flash backward: dQ, dK, dV from q, k, v, o, lse and dO, recomputing P = 2^(S - LSE) tile by
 * tile; never an Nq x Nk buffer. The portable framework; every product and per-score step runs
 * in the micro-kernel table chosen at run time (ukernel.h, isa.c).
 *
 * Per (query block i, key block j), tiles transposed as in flash_fwd.c (keys down the rows, the
 * block's queries across the columns):
 *   S^T  = K Q^T          (A = K in place for f32)      P^T = 2^(S^T * scale * log2(e) - LSE)
 *   dP^T = V dO^T         (A = V in place for f32)      dS^T = P^T (dP^T - Di)
 *   dV  += P^T dO         dK += dS^T Q                  dQ^T += K^T dS^T  (A = K^T in place)
 * with softcap/ALiBi (fp_score_transform, fp_softcap_grad) and the window (core/mask.h) applied
 * to S^T as in the forward; Di = rowsum(dO * O). scale is applied to dQ and dK when stored.
 * A pair runs only the block's query columns that see a key of j (block_pair, cut at
 * FP_TILE_COLS): on a causal diagonal a 128-query block's first 64 rows see nothing of the key
 * block of its last 64, so that quarter of the diagonal pair is skipped instead of masked; inside
 * the columns kept, a pair that the mask cuts runs its products over the key bands that each group
 * of 16 queries can see (fp_key_bands; f32 dQ^T too, bf16 dQ^T whole: its key pairs could straddle
 * a band's end), leaving out only pairs whose P and dS are 0.
 *
 * bf16 inputs on a table with bf16 dot products (gemm_bf16: AVX512_BF16, vdpbf16ps) keep every
 * product in bf16 with f32 accumulation, as a GPU flash kernel does: S^T and dP^T read K and V
 * in place (or as even-length row copies) against Q^T and dO^T packed as bf16 pairs; P^T and
 * dS^T are computed in f32 (dS from the f32 P) and then rounded to bf16 (round_bf16) for
 * dV += P^T dO, dK += dS^T Q (against Q and dO as pairs down the rows) and dQ^T += K^T dS^T
 * (K as pairs down the rows, dS^T's key pairs). Di uses the same bf16 dot product as dP. Other
 * dtypes, and bf16 on tables without gemm_bf16 (FLASHPORT_CPU_ISA=avx512, avx2, scalar, neon)
 * or that set bf16_as_f32 (the AVX-512 tables on Intel cores, isa.c), run f32 products on inputs
 * converted to f32.
 *
 * Deterministic by construction, in two schedules that give the same bits:
 *   fused      one task per (batch, kv head): for each query head of the group, each query
 *              block i, each key block j visible to it: the five products, dK/dV accumulated in
 *              per-thread f32 buffers of the whole key range, dQ^T in a tile. Chosen when the
 *              tasks fill the threads (tasks % threads == 0 or tasks >= 4 * threads).
 *   two-pass   pass 1 per (key block, batch, kv head): dK, dV over every (head, query block);
 *              pass 2 per (query block, batch, head): dQ over every key block, recomputing
 *              S^T, P^T, dP^T, dS^T (7 products per block pair instead of 5): for problems with
 *              too few (batch, kv head) pairs to keep every thread busy, e.g. B = H = 1.
 * In both, dK/dV of key block j receive their (head, query block) terms in the same order and
 * dQ of query block i its key-block terms in order j = 0, 1, ..., each through the same
 * micro-kernel calls, so the result depends neither on the schedule nor on the thread count.
 * A row whose LSE is -inf (no visible key) has every score masked, so P = 0: it contributes
 * nothing and its dQ is 0, never NaN. In a block that straddles the mask, P and dS of masked pairs
 * are set to exactly 0 after they are computed (a NaN LSE or a NaN V would make them NaN), and
 * when K, Q or dO of the block holds an infinity or a NaN the three accumulations run over the
 * visible pairs only (accumulate_visible): a key a row cannot see never reaches its dQ, nor that
 * row its dK and dV. A NaN LSE (a visible NaN score in the forward) makes the row's terms NaN.
 * Extra memory: Di (4 * H * total query rows bytes), per-thread tiles, and in the fused schedule
 * two f32 Nk x D buffers per thread (threads <= B * Hkv there), four with f32 products: the
 * task's K and V are staged there as f32 rows ldd floats apart (copied or converted once per task,
 * then read by every block pair instead of the caller's rows H D floats apart, which share few
 * L1 sets, or a conversion per block pair).
 * Tile shape: block_q queries x BLOCK_K = 64 keys; block_q = 128 for f32 products at
 * 64 < d <= 128, else 64 (bwd_block_q); the tiles' leading dims from fp_tile_ld_sets (Q^T and
 * dO^T at 128 queries, d-wide tiles at d = 128: one line wider than 512 bytes).
 * Known differences from the reference: f32 accumulation, the polynomial exp2; scale applied to
 * the f32 scores, dQ and dK rather than folded into Q. bf16 path: products of bf16 operands, P
 * and dS rounded to bf16 before their products (as the tests' naive bf16 computation does).
 * Numbers: docs/performance.md ("CPU backend") and docs/performance-cpu.md; tests/test_memory
 * checks that the two-pass schedule's memory stays flat at N = 65536.
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

enum { BLOCK_K = 64 };

/* Queries per block. With f32 products and 64 < d <= 128 the fused schedule streams K, V and
 * the dK, dV accumulators (4 Nk d floats, beyond L2) once per query block, so taller blocks
 * halve that traffic, and the dV and dK products reduce over twice as many queries per load and
 * store of their accumulators. At d <= 64 the streams are half as long and the taller diagonal
 * blocks of a causal mask cost more than that saves; the bf16 products (half the bytes) measured
 * slower with them under a causal mask; above 128 the five d x block_q tiles would outgrow L2
 * (not measured). */
static int bwd_block_q(int64_t d, int bf16)
{
    return !bf16 && d > 64 && d <= 128 ? 128 : 64;
}

/* Offsets (floats) of one thread's tiles inside its scratch slice. */
typedef struct bwd_layout {
    int bq;          /* queries per block (bwd_block_q) */
    int ldq, ldd;    /* leading dims: bq-wide and d-wide tiles */
    size_t qt, dot;  /* d x bq: Q^T, dO^T (bf16: ceil(d / 2) x bq pairs) */
    size_t q, dout;  /* bq x d: Q, dO (bf16: bq / 2 x d pairs down the rows) */
    size_t kt, vt;   /* BLOCK_K x d: K, V as f32 (f16 inputs) or bf16 rows (not in place) */
    size_t kp;       /* bf16: BLOCK_K / 2 x d, K as pairs down the rows (the A of K^T dS^T) */
    size_t s, dp, g; /* BLOCK_K x bq: S^T then P^T; dP^T then dS^T; softcap gradient */
    size_t pb, dsb;  /* bf16: BLOCK_K x bq bf16 rows of P^T, dS^T */
    size_t dsp;      /* bf16: BLOCK_K / 2 x bq, dS^T as pairs down the rows */
    size_t dqt;      /* d x bq: dQ^T accumulator */
    size_t dk, dv;   /* BLOCK_K x d accumulators (two-pass schedule) */
    size_t lse, di;  /* per query: LSE in log2 units (finite), Di */
    size_t total;
} bwd_layout;

static bwd_layout bwd_layout_of(int64_t d, int bf16)
{
    const size_t bq = (size_t)bwd_block_q(d, bf16), bk = BLOCK_K;
    bwd_layout L;
    L.bq = (int)bq;
    L.ldq = fp_tile_ld_sets(L.bq);
    L.ldd = fp_tile_ld_sets(d);
    L.qt = 0;
    L.dot = L.qt + (size_t)d * L.ldq;
    L.q = L.dot + (size_t)d * L.ldq;
    L.dout = L.q + bq * L.ldd;
    L.kt = L.dout + bq * L.ldd;
    L.vt = L.kt + bk * L.ldd;
    L.kp = L.vt + bk * L.ldd;
    L.s = L.kp + (bk + 1) / 2 * L.ldd;
    L.dp = L.s + bk * L.ldq;
    L.g = L.dp + bk * L.ldq;
    L.pb = L.g + bk * L.ldq;
    L.dsb = L.pb + bk * L.ldq / 2;
    L.dsp = L.dsb + bk * L.ldq / 2;
    L.dqt = L.dsp + (bk + 1) / 2 * L.ldq;
    L.dk = L.dqt + (size_t)d * L.ldq;
    L.dv = L.dk + bk * L.ldd;
    L.lse = L.dv + bk * L.ldd;
    L.di = L.lse + (size_t)L.ldq;
    L.total = L.di + (size_t)L.ldq;
    return L;
}

/* What every task needs to address the problem. */
typedef struct bwd_ctx {
    const fp_problem *p;
    const fp_ukernels *uk;
    bwd_layout L;
    int bf16;   /* bf16 operands, gemm_bf16 products */
    int direct; /* K and V read in place (f32 with any strides; bf16 with contiguous even rows) */
    int stage;  /* fused schedule, f32 products: each task's K and V copied (converted) once */
    float *di;  /* [H][total_q]: per head, one entry per (dense or packed) query row */
    float *big; /* fused schedule: per thread, dK and dV of a whole key range (then, with
                 * stage, its K and V as f32 rows) */
    size_t big_slice;
} bwd_ctx;

/* The key block being worked on: where the products read K, K^T and V (f32 or bf16 elements;
 * bf16 K and V have pairs along their rows, kcs = vcs = 1, and K^T comes from the kp tile). */
typedef struct key_side {
    int64_t j0;
    int n;
    const void *k, *v;
    ptrdiff_t krs, kcs, vrs, vcs;
} key_side;

/* Row of di for query row i of batch b: dense rows are b * Nq + i, varlen rows the packed token. */
static int64_t di_row(const bwd_ctx *c, const fp_seq *seq, int64_t b, int64_t i)
{
    return c->p->varlen ? seq->q_start + i : b * c->p->seqlen_q + i;
}

static fp_block block_of(const fp_problem *p, const fp_tensor_view *t, int64_t b, int64_t tok,
                         int64_t h)
{
    fp_block x = {t->data, p->dtype, fp_row_offset(t, b, tok, h), t->stride[FP_S], t->stride[FP_D]};
    return x;
}

/* Loads the query side of (b, h, rows [i0, i0 + m)): Q^T, dO^T, Q, dO, LSE, Di. */
static void load_query_block(const bwd_ctx *c, float *scratch, const fp_seq *seq, int64_t b,
                             int64_t h, int64_t i0, int m)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const int d = (int)p->head_dim;
    const int64_t tok = seq->q_start + i0;
    const fp_block qb = block_of(p, &p->q, b, tok, h), ob = block_of(p, &p->dout, b, tok, h);
    if (c->bf16) {
        fp_tile_pairs_t((uint32_t *)(scratch + L->qt), L->ldq, &qb, m, d, c->uk);
        fp_tile_pairs_t((uint32_t *)(scratch + L->dot), L->ldq, &ob, m, d, c->uk);
        fp_tile_pairs_rows((uint32_t *)(scratch + L->q), L->ldd, &qb, m, d, c->uk);
        fp_tile_pairs_rows((uint32_t *)(scratch + L->dout), L->ldd, &ob, m, d, c->uk);
    } else {
        fp_tile_load_t(scratch + L->qt, L->ldq, &qb, m, d, c->uk);
        fp_tile_load_t(scratch + L->dot, L->ldq, &ob, m, d, c->uk);
        fp_tile_load(scratch + L->q, L->ldd, &qb, m, d, c->uk);
        fp_tile_load(scratch + L->dout, L->ldd, &ob, m, d, c->uk);
    }
    const float *lse = (const float *)p->lse.data;
    const float *di = c->di + h * p->total_q + di_row(c, seq, b, i0);
    for (int r = 0; r < L->ldq; r++) {
        const float x = r < m ? lse[fp_lse_offset(&p->lse, b, h, tok + r)] : 0.0f;
        /* -inf: the row sees no key, all its scores are masked and give 0 against any finite
         * subtrahend. */
        scratch[L->lse + r] = x == -INFINITY ? 0.0f : x * FP_LOG2E; /* NaN stays NaN */
        scratch[L->di + r] = r < m ? di[r] : 0.0f;
    }
}

/* Points the products at key block [j0, j0 + n) of (b, kvh): the task's staged f32 rows when
 * kv (K rows, then V rows, each Nk x ldd) is given, else in place where c->direct, else as
 * tiles in scratch (f32 converted from f16, or bf16 rows with an even length); bf16 also packs
 * K's pairs down the rows for K^T dS^T. */
static key_side load_key_block(const bwd_ctx *c, float *scratch, const fp_seq *seq, int64_t b,
                               int64_t kvh, int64_t j0, int n, const float *kv)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const int64_t tok = seq->k_start + j0;
    const fp_block kb = block_of(p, &p->k, b, tok, kvh), vb = block_of(p, &p->v, b, tok, kvh);
    key_side ks;
    const int d = (int)p->head_dim;
    const size_t es = c->bf16 ? sizeof(uint16_t) : sizeof(float);
    ks.j0 = j0;
    ks.n = n;
    if (kv) {
        ks.k = kv + (size_t)j0 * L->ldd;
        ks.v = kv + ((size_t)seq->nk + (size_t)j0) * L->ldd;
        ks.krs = ks.vrs = L->ldd;
        ks.kcs = ks.vcs = 1;
    } else if (c->direct) {
        ks.k = (const char *)kb.data + (size_t)kb.off * es;
        ks.v = (const char *)vb.data + (size_t)vb.off * es;
        ks.krs = kb.rs;
        ks.kcs = kb.cs;
        ks.vrs = vb.rs;
        ks.vcs = vb.cs;
    } else if (c->bf16) {
        fp_tile_load_bf16((uint16_t *)(scratch + L->kt), 2 * L->ldd, &kb, n, d);
        fp_tile_load_bf16((uint16_t *)(scratch + L->vt), 2 * L->ldd, &vb, n, d);
        ks.k = scratch + L->kt;
        ks.v = scratch + L->vt;
        ks.krs = ks.vrs = 2 * L->ldd;
        ks.kcs = ks.vcs = 1;
    } else {
        fp_tile_load(scratch + L->kt, L->ldd, &kb, n, d, c->uk);
        fp_tile_load(scratch + L->vt, L->ldd, &vb, n, d, c->uk);
        ks.k = scratch + L->kt;
        ks.v = scratch + L->vt;
        ks.krs = ks.vrs = L->ldd;
        ks.kcs = ks.vcs = 1;
    }
    if (c->bf16)
        fp_tile_pairs_rows((uint32_t *)(scratch + L->kp), L->ldd, &kb, n, d, c->uk);
    return ks;
}

/* Prefetches K and V of key block j0 of (b, kvh) (see fp_block_prefetch), from the staged rows
 * kv when given (load_key_block); no-op past the end. */
static void prefetch_key_block(const bwd_ctx *c, const fp_seq *seq, int64_t b, int64_t kvh,
                               int64_t j0, int64_t end, const float *kv)
{
    const fp_problem *p = c->p;
    if (j0 >= end)
        return;
    const int n = (int)(seq->nk - j0 < BLOCK_K ? seq->nk - j0 : BLOCK_K);
    fp_block kb = block_of(p, &p->k, b, seq->k_start + j0, kvh);
    fp_block vb = block_of(p, &p->v, b, seq->k_start + j0, kvh);
    if (kv) {
        const fp_block ks = {(void *)kv, FLASHPORT_F32, j0 * c->L.ldd, c->L.ldd, 1};
        const fp_block vs = {(void *)kv, FLASHPORT_F32, (seq->nk + j0) * c->L.ldd, c->L.ldd, 1};
        kb = ks;
        vb = vs;
    }
    fp_block_prefetch(&kb, n, (int)p->head_dim);
    fp_block_prefetch(&vb, n, (int)p->head_dim);
}

/* fp_tile_fill_masked over sequence seq's window */
static void fill_masked(float *s, int ld, int n, int m, int64_t i0, int64_t j0, const fp_seq *seq,
                        const fp_problem *p, float value)
{
    fp_tile_fill_masked(s, ld, n, m, i0, j0, seq->nq, seq->nk, p->window_left, p->window_right,
                        value);
}

/* x = A B^T for S^T = K Q^T and dP^T = V dO^T: A the n key rows (f32 or bf16 elements, strides
 * rs, cs), bt the query tile's column 0 (Q^T or dO^T, f32 or bf16 pairs), x an n x mp tile. Over
 * the key bands alone when band is given (block_grads). */
static void scores_t(const bwd_ctx *c, const void *a, ptrdiff_t rs, ptrdiff_t cs, int n, int mp,
                     const float *bt, float *x, const fp_key_band *band, int bands)
{
    const bwd_layout *L = &c->L;
    const int d = (int)c->p->head_dim;
    const size_t es = c->bf16 ? sizeof(uint16_t) : sizeof(float);
    const fp_key_band all = {0, n, 0, mp};
    if (!band) {
        band = &all;
        bands = 1;
    }
    for (int i = 0; i < bands; i++) {
        const fp_key_band *y = &band[i];
        const void *ay = (const char *)a + (size_t)(y->r0 * rs) * es;
        float *xy = x + (ptrdiff_t)y->r0 * L->ldq + y->x0;
        if (c->bf16)
            c->uk->gemm_bf16(y->rows, y->cols, (d + 1) / 2, ay, rs, 2, (const uint32_t *)bt + y->x0,
                             L->ldq, xy, L->ldq, 0);
        else
            c->uk->gemm(y->rows, y->cols, d, ay, rs, cs, bt + y->x0, L->ldq, xy, L->ldq, 0);
    }
}

/* For the query rows [i0, i0 + m) that sit in columns [x0, x0 + m) of the loaded query block
 * (x0 a multiple of FP_TILE_COLS) and the key block ks: P^T into s and dS^T = P^T (dP^T - Di)
 * into dp, both n x m f32 from column 0; bf16: S^T and dP^T from bf16 operands, and P^T, dS^T
 * also rounded to bf16 (pb, dsb, dsp) for the three products that follow. band: NULL when every
 * pair is visible, else the block's key bands (fp_key_bands, bands of them): S^T and dP^T are
 * computed there alone, and the pairs outside, all masked, are set as every masked pair is.
 * Returns 1 when the block straddles the mask and its K, Q or dO holds an infinity or a NaN: the
 * caller then accumulates through accumulate_visible instead of the products. */
static int block_grads(const bwd_ctx *c, float *scratch, const fp_seq *seq, int64_t b, int64_t h,
                       int64_t i0, int x0, int m, const key_side *ks, const fp_key_band *band,
                       int bands)
{
    const fp_problem *p = c->p;
    const fp_ukernels *uk = c->uk;
    const bwd_layout *L = &c->L;
    const int d = (int)p->head_dim, n = ks->n, mp = fp_tile_ld(m);
    const int64_t j0 = ks->j0;
    const float slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0f;
    float *s = scratch + L->s, *dp = scratch + L->dp, *g = scratch + L->g;
    /* Column x0 of the d x bq query tiles: f32 values or bf16 pairs, one 32-bit word each. */
    float *qt = scratch + L->qt + x0, *dot = scratch + L->dot + x0;

    scores_t(c, ks->k, ks->krs, ks->kcs, n, mp, qt, s, band, bands);
    float mul = p->scale * FP_LOG2E;
    if (p->softcap > 0.0f || slope != 0.0f) {
        /* The forward's transform, keeping the softcap gradient for dS. */
        for (int r = 0; r < n; r++)
            for (int x = 0; x < m; x++) {
                float *e = s + (ptrdiff_t)r * L->ldq + x;
                const float capped = fp_score_transform(*e * p->scale, p->softcap, 0.0f, 0.0f);
                const float dist = fp_alibi_distance(i0 + x, j0 + r, seq->nq, seq->nk);
                *e = fp_score_transform(capped, 0.0f, slope, dist) * FP_LOG2E;
                g[(ptrdiff_t)r * L->ldq + x] = fp_softcap_grad(capped, p->softcap);
            }
        mul = 1.0f;
    }
    const int full = band == NULL;
    if (!full)
        fill_masked(s, L->ldq, n, m, i0, j0, seq, p, -INFINITY);
    uk->exp2_cols(n, mp, s, L->ldq, mul, scratch + L->lse + x0, NULL);
    if (!full) /* exactly 0 even against a NaN LSE */
        fill_masked(s, L->ldq, n, m, i0, j0, seq, p, 0.0f);

    scores_t(c, ks->v, ks->vrs, ks->vcs, n, mp, dot, dp, band, bands);
    uk->dsoftmax_cols(n, mp, s, L->ldq, dp, L->ldq, scratch + L->di + x0);
    if (p->softcap > 0.0f)
        for (int r = 0; r < n; r++)
            for (int x = 0; x < m; x++)
                dp[(ptrdiff_t)r * L->ldq + x] *= g[(ptrdiff_t)r * L->ldq + x];
    if (!full) /* a masked pair's dP holds V of a key the row cannot see, perhaps NaN */
        fill_masked(dp, L->ldq, n, m, i0, j0, seq, p, 0.0f);
    if (c->bf16) {
        /* P and dS enter their products in bf16, as in the GPU kernels; dS = P (dP - Di) itself
         * uses the f32 P. Columns from m on become 0: the odd last query pair reads one. */
        uk->round_bf16(n, m, s, L->ldq, (uint16_t *)(scratch + L->pb), L->ldq, NULL, 0);
        uk->round_bf16(n, m, dp, L->ldq, (uint16_t *)(scratch + L->dsb), L->ldq,
                       (uint32_t *)(scratch + L->dsp), L->ldq);
    }
    if (full)
        return 0;
    if (!c->bf16) {
        /* The f32 copies the products read, still in cache (f16 converts exactly: the same
         * infinities and NaNs), rather than the caller's rows again. */
        const fp_block kb = {(void *)ks->k, FLASHPORT_F32, 0, ks->krs, ks->kcs};
        const fp_block qb = {scratch + L->q, FLASHPORT_F32, (int64_t)x0 * L->ldd, L->ldd, 1};
        const fp_block ob = {scratch + L->dout, FLASHPORT_F32, (int64_t)x0 * L->ldd, L->ldd, 1};
        return !fp_block_finite(&kb, n, d) || !fp_block_finite(&qb, m, d) ||
               !fp_block_finite(&ob, m, d);
    }
    const int64_t kvh = fp_kv_head(p, h), qtok = seq->q_start + i0;
    const fp_block kb = block_of(p, &p->k, b, seq->k_start + j0, kvh);
    const fp_block qb = block_of(p, &p->q, b, qtok, h), ob = block_of(p, &p->dout, b, qtok, h);
    return !fp_block_finite(&kb, n, d) || !fp_block_finite(&qb, m, d) ||
           !fp_block_finite(&ob, m, d);
}

/* The three accumulations of a block pair over its visible pairs only, from the f32 P^T (s) and
 * dS^T (dp) and the operands read element by element: for the rare block that straddles the mask
 * and holds an infinite or NaN K, Q or dO, whose product with a masked pair's 0 would reach a
 * row (dQ) or key (dK, dV) on the other side of the mask. dk, dv: n x d tiles, or NULL (dQ only);
 * dq_t: the d x bq dQ^T tile, or NULL (dK, dV only). */
static void accumulate_visible(const bwd_ctx *c, float *scratch, const fp_seq *seq, int64_t b,
                               int64_t h, int64_t i0, int m, const key_side *ks, float *dk,
                               float *dv, float *dq_t)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const int d = (int)p->head_dim, n = ks->n;
    const int64_t kvh = fp_kv_head(p, h), qtok = seq->q_start + i0;
    const fp_block kb = block_of(p, &p->k, b, seq->k_start + ks->j0, kvh);
    const fp_block qb = block_of(p, &p->q, b, qtok, h), ob = block_of(p, &p->dout, b, qtok, h);
    const float *pt = scratch + L->s, *dst = scratch + L->dp;
    for (int r = 0; r < n; r++)
        for (int x = 0; x < m; x++) {
            if (!fp_mask_visible(i0 + x, ks->j0 + r, seq->nq, seq->nk, p->window_left,
                                 p->window_right))
                continue;
            const float w = pt[(ptrdiff_t)r * L->ldq + x], g = dst[(ptrdiff_t)r * L->ldq + x];
            for (int e = 0; e < d; e++) {
                if (dk) {
                    dv[(ptrdiff_t)r * L->ldd + e] +=
                        w * fp_load(ob.data, ob.off + x * ob.rs + e * ob.cs, p->dtype);
                    dk[(ptrdiff_t)r * L->ldd + e] +=
                        g * fp_load(qb.data, qb.off + x * qb.rs + e * qb.cs, p->dtype);
                }
                if (dq_t)
                    dq_t[(ptrdiff_t)e * L->ldq + x] +=
                        g * fp_load(kb.data, kb.off + r * kb.rs + e * kb.cs, p->dtype);
            }
        }
}

/* dV += P^T dO and dK += dS^T Q for the block pair just computed (block_grads' columns
 * [x0, x0 + m) of the query block); dk, dv: n x d tiles. bf16: the query pairs of P^T and dS^T
 * rows against dO and Q as pairs down the rows (x0 is even: row x0 / 2 of the pairs). With key
 * bands (block_grads), each band's rows over its own query columns: the others' P and dS are 0. */
static void accumulate_dkdv(const bwd_ctx *c, float *scratch, int x0, int m, int n, float *dk,
                            float *dv, const fp_key_band *band, int bands)
{
    const bwd_layout *L = &c->L;
    const int d = (int)c->p->head_dim;
    const fp_key_band all = {0, n, 0, m};
    if (!band) {
        band = &all;
        bands = 1;
    }
    for (int i = 0; i < bands; i++) {
        const int r0 = band[i].r0, rows = band[i].rows, y0 = band[i].x0;
        const int my = m - y0 < band[i].cols ? m - y0 : band[i].cols; /* queries, from y0 */
        const ptrdiff_t t = (ptrdiff_t)r0 * L->ldq + y0, o = (ptrdiff_t)r0 * L->ldd;
        if (c->bf16) {
            const int kp = (my + 1) / 2;
            const size_t row = (size_t)((x0 + y0) / 2) * L->ldd;
            c->uk->gemm_bf16(rows, d, kp, (const uint16_t *)(scratch + L->pb) + t, L->ldq, 2,
                             (const uint32_t *)(scratch + L->dout) + row, L->ldd, dv + o, L->ldd,
                             1);
            c->uk->gemm_bf16(rows, d, kp, (const uint16_t *)(scratch + L->dsb) + t, L->ldq, 2,
                             (const uint32_t *)(scratch + L->q) + row, L->ldd, dk + o, L->ldd, 1);
            continue;
        }
        const size_t row = (size_t)(x0 + y0) * L->ldd;
        c->uk->gemm(rows, d, my, scratch + L->s + t, L->ldq, 1, scratch + L->dout + row, L->ldd,
                    dv + o, L->ldd, 1);
        c->uk->gemm(rows, d, my, scratch + L->dp + t, L->ldq, 1, scratch + L->q + row, L->ldd,
                    dk + o, L->ldd, 1);
    }
}

/* dQ^T += K^T dS^T for the block pair just computed, into columns [x0, x0 + m) of the dQ^T
 * tile. bf16: element (x, p) of K^T is the pair x of row p of the kp tile (stride 2 down, 2 ldd
 * across), against dS^T's key pairs. */
static void accumulate_dq(const bwd_ctx *c, float *scratch, int x0, int m, const key_side *ks,
                          const fp_key_band *band, int bands)
{
    const bwd_layout *L = &c->L;
    const int d = (int)c->p->head_dim;
    float *dqt = scratch + L->dqt + x0;
    if (band && !c->bf16) {
        /* Band by band in key order, each over its own query columns: every dQ^T element still
         * sums its keys in order, leaving out the keys of dS = 0. */
        for (int i = 0; i < bands; i++) {
            const fp_key_band *y = &band[i];
            c->uk->gemm(d, y->cols, y->rows, (const float *)ks->k + y->r0 * ks->krs, ks->kcs,
                        ks->krs, scratch + L->dp + (ptrdiff_t)y->r0 * L->ldq + y->x0, L->ldq,
                        dqt + y->x0, L->ldq, 1);
        }
        return;
    }
    if (c->bf16) { /* key pairs: a band may start at an odd key */
        c->uk->gemm_bf16(d, fp_tile_ld(m), (ks->n + 1) / 2, (const uint16_t *)(scratch + L->kp), 2,
                         2 * (ptrdiff_t)L->ldd, (const uint32_t *)(scratch + L->dsp), L->ldq, dqt,
                         L->ldq, 1);
        return;
    }
    c->uk->gemm(d, fp_tile_ld(m), ks->n, ks->k, ks->kcs, ks->krs, scratch + L->dp, L->ldq, dqt,
                L->ldq, 1);
}

/* One block pair: the loaded query block (rows [i0, i0 + m) of (b, h)) against the key block ks,
 * adding to dk and dv (n x d tiles; NULL: not wanted) and, when dq, to the dQ^T tile. Only the
 * query columns that see a key of the block take part, cut at FP_TILE_COLS: on the diagonal of a
 * causal mask (a 128-query block against the key block of its last 64 rows) and at the edges of
 * a window, the columns left out have P = dS = 0 there, so their products would add nothing.
 * Cutting a column range keeps each remaining sum in its order, so the result is the same in
 * every schedule. */
static void block_pair(const bwd_ctx *c, float *scratch, const fp_seq *seq, int64_t b, int64_t h,
                       int64_t i0, int m, const key_side *ks, float *dk, float *dv, int dq)
{
    const fp_problem *p = c->p;
    int64_t r0, r1;
    fp_geom_rows_for_keys(ks->j0, ks->j0 + ks->n, seq->nq, seq->nk, p->window_left, p->window_right,
                          &r0, &r1);
    r0 = r0 > i0 ? (r0 - i0) / FP_TILE_COLS * FP_TILE_COLS : 0;
    r1 = r1 < i0 + m ? (r1 - i0 + FP_TILE_COLS - 1) / FP_TILE_COLS * FP_TILE_COLS : m;
    if (r1 <= r0)
        return;
    const int x0 = (int)r0, ms = (int)(r1 < m ? r1 : m) - x0;
    /* Where the mask cuts the pair, its key bands (fp_key_bands): the products leave out the
     * squares of 16 keys x 16 queries that no query sees (6 of 16 on a causal diagonal). */
    const int64_t q0 = i0 + x0;
    const int full = fp_mask_block_full(q0, q0 + ms, ks->j0, ks->j0 + ks->n, seq->nq, seq->nk,
                                        p->window_left, p->window_right);
    fp_key_band band[FP_KEY_BANDS];
    const int bands = full ? 0
                           : fp_key_bands(q0, ms, ks->j0, ks->n, seq->nq, seq->nk, p->window_left,
                                          p->window_right, band);
    const fp_key_band *cut = full ? NULL : band;
    if (block_grads(c, scratch, seq, b, h, q0, x0, ms, ks, cut, bands)) {
        accumulate_visible(c, scratch, seq, b, h, i0 + x0, ms, ks, dk, dv,
                           dq ? scratch + c->L.dqt + x0 : NULL);
        return;
    }
    if (dk)
        accumulate_dkdv(c, scratch, x0, ms, ks->n, dk, dv, cut, bands);
    if (dq)
        accumulate_dq(c, scratch, x0, ms, ks, cut, bands);
}

static void store_dq(const bwd_ctx *c, float *scratch, const fp_seq *seq, int64_t b, int64_t h,
                     int64_t i0, int m)
{
    const fp_problem *p = c->p;
    const fp_block qb = block_of(p, &p->dq, b, seq->q_start + i0, h);
    fp_tile_store_t(&qb, scratch + c->L.dqt, c->L.ldq, m, (int)p->head_dim, p->scale, c->uk);
}

static void store_dkdv(const bwd_ctx *c, const fp_seq *seq, int64_t b, int64_t kvh, int64_t j0,
                       int n, const float *dk, const float *dv)
{
    const fp_problem *p = c->p;
    const int d = (int)p->head_dim;
    const fp_block kb = block_of(p, &p->dk, b, seq->k_start + j0, kvh);
    const fp_block vb = block_of(p, &p->dv, b, seq->k_start + j0, kvh);
    fp_tile_store(&kb, dk, c->L.ldd, n, d, p->scale, c->uk);
    fp_tile_store(&vb, dv, c->L.ldd, n, d, 1.0f, c->uk);
}

/* Di = rowsum(dO * O) for query rows [i0, i0 + bq) of (b, h), from the stored O. Each sum
 * is the micro-kernel's dot product of O's row with dO's, the same operation in the same order
 * (f32 or bf16 pairs) as the elements of dP^T = V dO^T: where a row's O equals a V row (one
 * visible key), dP - Di is exactly 0, as in exact arithmetic. */
static void di_block(const bwd_ctx *c, float *scratch, int64_t b, int64_t h, int64_t i0)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const fp_seq seq = fp_problem_seq(p, b);
    if (i0 >= seq.nq)
        return;
    const int d = (int)p->head_dim;
    const int m = (int)(seq.nq - i0 < c->L.bq ? seq.nq - i0 : c->L.bq);
    const int64_t tok = seq.q_start + i0;
    float *o = scratch + L->q, *dot = scratch + L->dot, *out = scratch + L->s;
    const fp_block ob = block_of(p, &p->o, b, tok, h), gb = block_of(p, &p->dout, b, tok, h);
    float *di = c->di + h * p->total_q + di_row(c, &seq, b, i0);
    if (c->bf16) {
        const uint16_t *orow = (const uint16_t *)ob.data + ob.off;
        ptrdiff_t ors = ob.rs;
        if (ob.cs != 1 || d % 2) {
            fp_tile_load_bf16((uint16_t *)o, 2 * L->ldd, &ob, m, d);
            orow = (const uint16_t *)o;
            ors = 2 * L->ldd;
        }
        fp_tile_pairs_t((uint32_t *)dot, L->ldq, &gb, m, d, c->uk);
        for (int r = 0; r < m; r++) {
            const int c0 = r / FP_TILE_COLS * FP_TILE_COLS;
            c->uk->gemm_bf16(1, FP_TILE_COLS, (d + 1) / 2, orow + r * ors, 0, 2,
                             (const uint32_t *)dot + c0, L->ldq, out, L->ldq, 0);
            di[r] = out[r - c0];
        }
        return;
    }
    fp_tile_load(o, L->ldd, &ob, m, d, c->uk);
    fp_tile_load_t(dot, L->ldq, &gb, m, d, c->uk);
    for (int r = 0; r < m; r++) {
        /* Row r of O against the FP_TILE_COLS columns of dO^T that hold row r. */
        const int c0 = r / FP_TILE_COLS * FP_TILE_COLS;
        c->uk->gemm(1, FP_TILE_COLS, d, o + (size_t)r * L->ldd, 0, 1, dot + c0, L->ldq, out, L->ldq,
                    0);
        di[r] = out[r - c0];
    }
}

/* The key blocks that query rows [i0, i0 + m) see, on the fixed grid j0 = 0, BLOCK_K, ... that
 * every schedule uses: [*first, *end) (empty when the rows see nothing). */
static void key_blocks(const bwd_ctx *c, const fp_seq *seq, int64_t i0, int m, int64_t *first,
                       int64_t *end)
{
    int nb0, nb1;
    fp_geom_key_blocks(i0, i0 + m, seq->nq, seq->nk, c->p->window_left, c->p->window_right, BLOCK_K,
                       &nb0, &nb1);
    *first = (int64_t)nb0 * BLOCK_K;
    *end = (int64_t)nb1 * BLOCK_K;
}

/* Fused schedule: all of (b, kv head kvh); big holds dK then dV, Nk x ldd each. */
static void fused_task(const bwd_ctx *c, float *scratch, float *big, int64_t b, int64_t kvh)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const fp_seq seq = fp_problem_seq(p, b);
    const size_t kv_floats = (size_t)seq.nk * L->ldd;
    float *dk = big, *dv = big + kv_floats;
    memset(big, 0, 2 * kv_floats * sizeof(float));
    /* Staged: K and V rows as f32 with a ldd pitch, read by every (query head, query block) of
     * the task, instead of the caller's rows (H D apart, and set-conflicting in L1) or a
     * conversion per block pair. */
    float *kv = NULL;
    if (c->stage) {
        kv = big + 2 * kv_floats;
        const fp_block kb = block_of(p, &p->k, b, seq.k_start, kvh);
        const fp_block vb = block_of(p, &p->v, b, seq.k_start, kvh);
        fp_tile_load(kv, L->ldd, &kb, (int)seq.nk, (int)p->head_dim, c->uk);
        fp_tile_load(kv + kv_floats, L->ldd, &vb, (int)seq.nk, (int)p->head_dim, c->uk);
    }

    const int64_t group = p->heads / p->kv_heads;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++)
        for (int64_t i0 = 0; i0 < seq.nq; i0 += c->L.bq) {
            const int m = (int)(seq.nq - i0 < c->L.bq ? seq.nq - i0 : c->L.bq);
            int64_t first, end;
            key_blocks(c, &seq, i0, m, &first, &end);
            load_query_block(c, scratch, &seq, b, h, i0, m);
            memset(scratch + L->dqt, 0, sizeof(float) * (size_t)p->head_dim * (size_t)L->ldq);
            for (int64_t j0 = first; j0 < end; j0 += BLOCK_K) {
                const int n = (int)(seq.nk - j0 < BLOCK_K ? seq.nk - j0 : BLOCK_K);
                prefetch_key_block(c, &seq, b, kvh, j0 + BLOCK_K, end, kv);
                if (j0 + BLOCK_K < end) { /* and the next dK, dV tiles, to be written */
                    const float *next[2] = {dk + (size_t)(j0 + BLOCK_K) * L->ldd,
                                            dv + (size_t)(j0 + BLOCK_K) * L->ldd};
                    for (int t = 0; t < 2; t++)
                        for (size_t x = 0; x < (size_t)BLOCK_K * L->ldd; x += 16)
                            __builtin_prefetch(next[t] + x, 1, 2);
                }
                const key_side ks = load_key_block(c, scratch, &seq, b, kvh, j0, n, kv);
                float *dkj = dk + (size_t)j0 * L->ldd, *dvj = dv + (size_t)j0 * L->ldd;
                block_pair(c, scratch, &seq, b, h, i0, m, &ks, dkj, dvj, 1);
            }
            store_dq(c, scratch, &seq, b, h, i0, m);
        }
    for (int64_t j0 = 0; j0 < seq.nk; j0 += BLOCK_K) {
        const int n = (int)(seq.nk - j0 < BLOCK_K ? seq.nk - j0 : BLOCK_K);
        store_dkdv(c, &seq, b, kvh, j0, n, dk + (size_t)j0 * L->ldd, dv + (size_t)j0 * L->ldd);
    }
}

/* Two-pass schedule, pass 1: keys [j0, j0 + BLOCK_K) of (b, kvh) over every query head of the
 * group and every query block that sees them. */
static void dkdv_task(const bwd_ctx *c, float *scratch, int64_t b, int64_t kvh, int64_t j0)
{
    const fp_problem *p = c->p;
    const bwd_layout *L = &c->L;
    const fp_seq seq = fp_problem_seq(p, b);
    if (j0 >= seq.nk)
        return;
    const int n = (int)(seq.nk - j0 < BLOCK_K ? seq.nk - j0 : BLOCK_K);
    float *dk = scratch + L->dk, *dv = scratch + L->dv;
    memset(dk, 0, sizeof(float) * (size_t)n * (size_t)L->ldd);
    memset(dv, 0, sizeof(float) * (size_t)n * (size_t)L->ldd);

    const key_side ks = load_key_block(c, scratch, &seq, b, kvh, j0, n, NULL);
    const int64_t group = p->heads / p->kv_heads;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++)
        for (int64_t i0 = 0; i0 < seq.nq; i0 += c->L.bq) {
            const int m = (int)(seq.nq - i0 < c->L.bq ? seq.nq - i0 : c->L.bq);
            int64_t first, end;
            key_blocks(c, &seq, i0, m, &first, &end);
            if (j0 < first || j0 >= end)
                continue;
            load_query_block(c, scratch, &seq, b, h, i0, m);
            block_pair(c, scratch, &seq, b, h, i0, m, &ks, dk, dv, 0);
        }
    store_dkdv(c, &seq, b, kvh, j0, n, dk, dv);
}

/* Two-pass schedule, pass 2: dQ of query rows [i0, i0 + bq) of (b, h). */
static void dq_task(const bwd_ctx *c, float *scratch, int64_t b, int64_t h, int64_t i0)
{
    const fp_problem *p = c->p;
    const fp_seq seq = fp_problem_seq(p, b);
    if (i0 >= seq.nq)
        return;
    const int m = (int)(seq.nq - i0 < c->L.bq ? seq.nq - i0 : c->L.bq);
    const int64_t kvh = fp_kv_head(p, h);
    load_query_block(c, scratch, &seq, b, h, i0, m);
    memset(scratch + c->L.dqt, 0, sizeof(float) * (size_t)p->head_dim * (size_t)c->L.ldq);
    int64_t first, end;
    key_blocks(c, &seq, i0, m, &first, &end);
    for (int64_t j0 = first; j0 < end; j0 += BLOCK_K) {
        const int n = (int)(seq.nk - j0 < BLOCK_K ? seq.nk - j0 : BLOCK_K);
        prefetch_key_block(c, &seq, b, kvh, j0 + BLOCK_K, end, NULL);
        const key_side ks = load_key_block(c, scratch, &seq, b, kvh, j0, n, NULL);
        block_pair(c, scratch, &seq, b, h, i0, m, &ks, NULL, NULL, 1);
    }
    store_dq(c, scratch, &seq, b, h, i0, m);
}

/* seqused_k: the dK and dV rows of keys past a sequence's used ones get no gradient and are
 * written as zeros (docs/semantics.md). */
static void zero_unused_keys(const fp_problem *p)
{
    const int64_t d = p->head_dim;
    for (int64_t b = 0; b < p->batch; b++) {
        const fp_seq seq = fp_problem_seq(p, b);
        const int64_t cap = fp_problem_key_capacity(p, b);
        for (int64_t kvh = 0; kvh < p->kv_heads; kvh++)
            for (int64_t j = seq.nk; j < cap; j++) {
                const int64_t ok = fp_row_offset(&p->dk, b, seq.k_start + j, kvh);
                const int64_t ov = fp_row_offset(&p->dv, b, seq.k_start + j, kvh);
                for (int64_t e = 0; e < d; e++) {
                    fp_store(p->dk.data, ok + e * p->dk.stride[FP_D], p->dtype, 0.0f);
                    fp_store(p->dv.data, ov + e * p->dv.stride[FP_D], p->dtype, 0.0f);
                }
            }
    }
}

flashport_status fp_cpu_flash_backward(const fp_problem *p)
{
    bwd_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    flashport_status status = fp_cpu_ukernels(&c.uk, NULL);
    if (status != FLASHPORT_OK)
        return status;
    c.bf16 = p->dtype == FLASHPORT_BF16 && c.uk->gemm_bf16 != NULL && !c.uk->bf16_as_f32;
    c.L = bwd_layout_of(p->head_dim, c.bf16);
    /* bf16 K and V in place when their pairs are contiguous and never run past a row, as in
     * flash_fwd.c. */
    c.direct = c.bf16 ? p->k.stride[FP_D] == 1 && p->v.stride[FP_D] == 1 && p->head_dim % 2 == 0
                      : p->dtype == FLASHPORT_F32;

    const fp_plan_shape shape = fp_problem_plan_shape(p);
    const int workers = fp_cpu_threads();
    const fp_plan_target target = {workers, c.L.bq, BLOCK_K, 1, FP_PLAN_ORDER_GRID};
    /* Query-side tasks (Di, dQ) in the forward's numbering: heaviest blocks first. */
    const fp_plan plan = fp_plan_forward(&shape, &target);
    const int64_t bhkv = p->batch * p->kv_heads;
    const int64_t k_tasks = bhkv * ((p->seqlen_k + BLOCK_K - 1) / BLOCK_K);
    const int64_t most = plan.num_tasks > k_tasks ? plan.num_tasks : k_tasks;
    if (most == 0)
        return FLASHPORT_OK;
    const int threads = most < workers ? (int)most : workers;
    const int fused = bhkv % threads == 0 || bhkv >= 4 * (int64_t)threads;
    c.stage = fused && !c.bf16;
    /* Per thread: dK and dV of a task's whole key range, then (stage) its K and V. */
    const size_t big_floats = (c.stage ? 4 : 2) * (size_t)p->seqlen_k * c.L.ldd;

    if (fp_host()->log_enabled())
        fp_host()->log("cpu: flash backward (recompute P from LSE; deterministic), %s "
                       "micro-kernels: %s%s; %s schedule (%lld batch x kv-head tasks "
                       "for %d threads); block_q=%d block_k=%d",
                       c.uk->name,
                       c.bf16 ? "bf16 dot products (vdpbf16ps), P and dS in bf16" : "f32 products",
                       c.stage    ? ", K and V staged as f32 rows once per task"
                       : c.direct ? ", K and V read in place"
                       : c.bf16   ? ", K and V copied to even-length rows"
                                  : " on inputs converted to f32",
                       fused ? "fused one-pass" : "two-pass (dK/dV, then dQ)", (long long)bhkv,
                       threads, c.L.bq, BLOCK_K);

    size_t slice;
    const size_t di_floats = (size_t)(p->heads * p->total_q);
    float *scratch = fp_scratch_alloc(threads, c.L.total, c.L.total, &slice);
    c.di = malloc(sizeof(float) * (di_floats > 0 ? di_floats : 1));
    if (fused && scratch && c.di)
        c.big = fp_scratch_alloc(threads, big_floats, 0, &c.big_slice); /* fused_task clears */
    if (!scratch || !c.di || (fused && !c.big)) {
        fp_scratch_free(scratch);
        fp_scratch_free(c.big);
        free(c.di);
        return fp_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                    "cpu flash backward: cannot allocate %d x %zu bytes of tiles, "
                                    "%zu bytes of row sums and %d x %zu bytes of dK/dV buffers",
                                    threads, c.L.total * sizeof(float), di_floats * sizeof(float),
                                    fused ? threads : 0, big_floats * sizeof(float));
    }

#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
#ifdef _OPENMP
        const int me = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
#else
        const int me = 0;
#endif
        for (int64_t t = 0; t < plan.num_tasks; t++) {
            const fp_plan_task task = fp_plan_task_at(&plan, &shape, t);
            di_block(&c, scratch + slice * (size_t)me, task.batch, task.head,
                     task.q_block * c.L.bq);
        }
        float *mine = scratch + slice * (size_t)me;
        if (fused) {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t t = 0; t < bhkv; t++)
                fused_task(&c, mine, c.big + c.big_slice * (size_t)me, t / p->kv_heads,
                           t % p->kv_heads);
        } else {
            /* Pass 1, first key blocks first: under a causal mask they are seen by the most
             * rows. No barrier after it: threads drain into pass 2. */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1) nowait
#endif
            for (int64_t t = 0; t < k_tasks; t++)
                dkdv_task(&c, mine, (t % bhkv) / p->kv_heads, t % p->kv_heads,
                          (t / bhkv) * BLOCK_K);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t t = 0; t < plan.num_tasks; t++) {
                const fp_plan_task task = fp_plan_task_at(&plan, &shape, t);
                dq_task(&c, mine, task.batch, task.head, task.q_block * c.L.bq);
            }
        }
    }
    fp_scratch_free(scratch);
    fp_scratch_free(c.big);
    free(c.di);
    if (p->seqused_k)
        zero_unused_keys(p);
    return FLASHPORT_OK;
}
