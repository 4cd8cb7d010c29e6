/*
 * CPU decode forward: few query rows per sequence (Nq <= FP_CPU_DECODE_MAX_NQ) against a long KV
 * cache, dense, varlen or paged (docs/semantics.md, "KV cache"), where the read of K and V is
 * the bound, not the products.
 *
 * GQA packing: the H / Hkv query heads that share a kv head, times their Nq rows, are the rows of
 * one unit (row r = g * Nq + i: head kvh * group + g, query i), so each K and V byte is read once
 * per kv head instead of once per query head. A group of more than DECODE_ROWS rows is cut into
 * units of whole heads (then K and V are read once per unit; such groups are bound by the
 * products, not the read).
 *
 * Streaming: a task holds consecutive kv heads (up to TASK_ROWS rows of O, every kv head for the
 * usual shapes) and walks its keys in blocks of BLOCK_K, each block key by key across the task's
 * kv heads, so that K and V are read in the cache's own order ([N, Hkv, D] rows, or a page's
 * [page_size, Hkv, D]): one sequential stream each per task. The rows are asked for one phase
 * ahead, in address order: while a block's scores are computed, its V rows; while its P V runs,
 * the next block's K rows (and for f32, its V rows too); the bf16 and f16 steps, f32's dec_pv and
 * the conversions of units of more than DOT_ROWS rows spread these requests over their work
 * (ukernel.h's pf_cursor: a key's rows of every kv head asked for at once wait for the core's
 * free miss slots), the K^T path asks key by key, and the paths that convert rows key by key ask
 * NEAR_KEYS keys ahead in the stream they read. The
 * hardware prefetchers alone left the loop waiting on memory, and requests in any other order (a kv
 * head's rows of the block in turn) were read at about half the rate. Per block:
 *   S     the table's dec_scores (ukernel.h) for units of at most DOT_ROWS rows: a key's row
 *         against the unit's query rows, held in L1, summed across the vector lanes (bf16 on
 *         avx512bf16: dec_scores_bf16 over the block, four keys by four rows a step, vdpbf16ps
 *         on the caller's rows, no transposition, no conversion; f16: dec_scores_f16 over the
 *         block, each row converted as it is loaded; bf16 on tables without vdpbf16ps that have
 *         them: dec_scores_bf16_f32, the same on bf16 rows). f32, and units of more rows,
 *         transpose K in 16-key runs for all the task's heads at once (f16 rows converted
 *         first) and run the table's gemm over K^T (bf16: gemm_bf16 on pairs; on CPUs whose
 *         vdpbf16ps gives fewer flops than the f32 FMA, bf16_as_f32, bf16 rows are
 *         widened to f32 as f16's are and take the f32 gemm, P staying f32). For f32 that
 *         sums the products in the order of the backward's gemm: the forward's LSE then matches
 *         the backward's recomputed scores bit for bit, which the f32 gradient tolerances need.
 *   P     softcap / ALiBi / the window per row (core/mask.h, Nq > 1 rows see different keys),
 *         the online softmax per row (core/online_softmax.h, exp2 form, the table's exp2), O
 *         rescaled when a maximum moved; without softcap and ALiBi, on tables that have them, the
 *         unit's maxima and exponentials by dec_row_max and dec_exp2_rows on whole vectors (this
 *         file is compiled for the baseline ISA).
 *   O     the table's dec_pv over the block, O's rows in registers across it, a kv head at a
 *         time (rows converted to f32: CONVERTED_KEYS keys a call); bf16 on avx512bf16: P
 *         rounded to bf16 (as flash_fwd.c's bf16 path does) and dec_pv_bf16 (V pairs by
 *         vpermt2w, vdpbf16ps); f16: dec_pv_f16 over the block, V converted as it is loaded
 *         (bf16 without vdpbf16ps: dec_pv_bf16_f32 where the table has it).
 *         bf16 and converted units of more than DOT_ROWS rows take
 *         gemm_bf16 on V pairs (interleave_bf16), or gemm on V rows converted to f32 (f16, bf16
 *         without vdpbf16ps).
 *
 * Split-KV: core/plan.c's fp_plan_decode, with (batch, task) tiles and the CPU's threads as the
 * workers, splits the keys when there are fewer tiles than threads; each split writes its
 * normalized partial O and LSE, and a second pass merges them through the LSE
 * (fp_softmax_merge). The plan is logged (FLASHPORT_LOG).
 *
 * A block that not every row sees whole (window edges) and that holds an infinite or NaN V takes a
 * scalar P V over the visible pairs, so that a key a row cannot see never reaches it (the NaN rule
 * of include/flashport.h); keys past seqused_k are never read at all.
 * Known differences from the reference: f32 accumulation; bf16 P rounded to bf16 before P V;
 * bf16 and f16 scores of units of at most DOT_ROWS rows summed across vector lanes (not in the
 * backward's order).
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

enum { DECODE_ROWS = 64, BLOCK_K = 64, MAX_SPLITS = 64, MIN_SPLIT_BLOCKS = 4 };

/* bf16 and f16 units of at most this many rows take the table's dec_scores (a dot product a
 * row), larger ones (and f32 ones) K^T and the table's gemm; bf16 ones of more take gemm_bf16 for
 * P V too. */
enum { DOT_ROWS = 4 };

/* Whether view t's rows are f32 with a contiguous head dim: read in place. */
static int f32_rows(const fp_problem *p, const fp_tensor_view *t)
{
    return p->dtype == FLASHPORT_F32 && t->stride[FP_D] == 1;
}

/* Keys of V rows converted to f32 (f16, strided head dims) a dec_pv call: dec_pv holds O's rows
 * in registers across its keys, so a few keys a call would load and store O more often than the
 * keys' rows themselves. */
enum { CONVERTED_KEYS = 16 };

/* The paths that convert rows to f32 key by key (strided head dims, bf16 on tables with neither
 * vdpbf16ps nor the _bf16_f32 steps) ask
 * for the rows of the stream they read this many keys ahead instead of a phase ahead: their
 * conversions are slow enough that requests a block ahead went out in bursts that stalled them
 * (f16 read at about 0.65x before it took the block-wide _f16 steps). */
enum { NEAR_KEYS = 8 };

/* Rows of O a task keeps at most (its units' rows together): 512 rows of D = 128 f32 are 256 KiB,
 * a quarter of a Zen 4 core's L2. */
enum { TASK_ROWS = 512 };

/* Bytes of K^T tiles a task keeps (units x d x BLOCK_K), next to its K and V blocks in L2. */
#define TASK_KT_BYTES ((size_t)256 * 1024)

typedef struct dec_layout {
    int ldd, ldk;    /* leading dims: d-wide and BLOCK_K-wide tiles */
    size_t q, o;     /* task rows x d: packed query rows (f32, or bf16 2 ldd apart), output */
    size_t s;        /* task rows x BLOCK_K: scores, then P */
    size_t pb;       /* task rows x BLOCK_K bf16: P rounded */
    size_t kt;       /* units x d x BLOCK_K: each unit's K^T */
    size_t vp;       /* bf16: BLOCK_K / 2 x units x d: V as pairs of keys */
    size_t kf, vf;   /* units x d (V: CONVERTED_KEYS keys' worth): K, V rows converted to f32 */
    size_t vblk;     /* BLOCK_K x (units x d + FP_TILE_COLS): a block's K or V rows in f32 */
    size_t st;       /* task rows fp_softmax_state */
    size_t alpha;    /* task rows rescale factors */
    size_t sub, sum; /* BLOCK_K: one row's subtrahend, broadcast; its column sums */
    size_t total;
} dec_layout;

static dec_layout dec_layout_of(int64_t d, int task_rows, int units)
{
    dec_layout L;
    L.ldd = fp_tile_ld(d);
    L.ldk = fp_tile_ld(BLOCK_K);
    L.q = 0;
    L.o = L.q + (size_t)task_rows * L.ldd;
    L.s = L.o + (size_t)task_rows * L.ldd;
    L.pb = L.s + (size_t)task_rows * L.ldk;
    L.kt = L.pb + (size_t)task_rows * L.ldk / 2;
    L.vp = L.kt + (size_t)units * L.ldd * L.ldk;
    L.kf = L.vp + (size_t)(BLOCK_K / 2) * (size_t)units * L.ldd;
    L.vf = L.kf + (size_t)units * L.ldd;
    L.vblk = L.vf + CONVERTED_KEYS * (size_t)units * L.ldd;
    L.st = L.vblk + (size_t)BLOCK_K * ((size_t)units * L.ldd + FP_TILE_COLS);
    L.alpha = L.st + 2 * (size_t)task_rows;
    L.sub = L.alpha + (size_t)task_rows;
    L.sum = L.sub + (size_t)L.ldk;
    L.total = L.sum + (size_t)L.ldk;
    return L;
}

typedef struct dec_ctx {
    const fp_problem *p;
    const fp_ukernels *uk;
    dec_layout L;
    int bf16; /* bf16 dot products (gemm_bf16) on K, V and Q in place */
    /* f16 K and V rows with a contiguous head dim (bf16 too on tables with _bf16_f32 steps and
     * no vdpbf16ps): read in place by these steps, each row converted to f32 as it is loaded;
     * NULL otherwise */
    fp_dec_scores_h16 *scores_h16;
    fp_dec_pv_h16 *pv_h16;
    int64_t group;       /* query heads per kv head */
    int64_t chunk_heads; /* query heads per unit */
    int64_t chunks;      /* units per kv head */
    int64_t units;       /* units per sequence: kv_heads * chunks */
    int64_t unit_rows;   /* chunk_heads * seqlen_q (the rows of a unit at the longest Nq) */
    int64_t per_task;    /* units per task (consecutive, so its K and V rows are adjacent) */
    int64_t tiles;       /* tasks per sequence before the split: ceil(units / per_task) */
    fp_decode_plan plan;
    size_t es;       /* bytes per element */
    float *part_o;   /* split plans: [task][row][d] normalized partial O */
    float *part_lse; /* [task][row] natural-log LSE of each partial */
} dec_ctx;

/* fp8 inputs take flash_fwd.c's path at every Nq (dense, varlen or paged): this one has no P
 * rounding to e4m3 nor descales. */
int fp_cpu_decode_eligible(const fp_problem *p)
{
    return p->seqlen_q >= 1 && p->seqlen_q <= FP_CPU_DECODE_MAX_NQ && !fp_is_fp8(p->dtype);
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

/* Asks the caches for the row of key j (sequence b) of kv heads [kvh0, kvh0 + nu) in view t, a
 * few keys ahead of the one being read: the rows stream in the cache's order, but one key's
 * rows are a few KiB and the hardware prefetchers alone left the loop waiting on memory. Always
 * inlined: GCC counts a function of prefetches alone as free of side effects and drops its
 * calls. */
static inline __attribute__((always_inline)) void prefetch_row(const dec_ctx *c,
                                                               const fp_tensor_view *t, int64_t b,
                                                               const fp_seq *seq, int64_t j,
                                                               int64_t kvh0, int nu)
{
    const fp_problem *p = c->p;
    const size_t es = c->es;
    const int whole = nu == 1 || t->stride[FP_H] == p->head_dim;
    const size_t bytes = (size_t)p->head_dim * es * (size_t)(whole ? nu : 1);
    const char *row = (const char *)t->data + (size_t)fp_key_offset(p, t, b, seq, j, kvh0) * es;
    for (int u = 0; u < (whole ? 1 : nu); u++, row += (size_t)t->stride[FP_H] * es)
        for (size_t at = 0; at < bytes; at += 64)
            __builtin_prefetch(row + at, 0, 3);
}

/* The rows of keys [j, j + n) of view t (kv head kvh0; j < hi), keys from hi on replaced by key
 * hi - 1: one offset (a block-table lookup, divisions) a run of consecutive keys in one page,
 * not one a key. */
static void block_rows(const dec_ctx *c, const fp_tensor_view *t, int64_t b, const fp_seq *seq,
                       int64_t j, int n, int64_t hi, int64_t kvh0, const char **rows)
{
    const fp_problem *p = c->p;
    const ptrdiff_t step = (ptrdiff_t)t->stride[FP_S] * (ptrdiff_t)c->es;
    const int valid = hi - j < n ? (int)(hi - j) : n;
    for (int i = 0; i < valid;) {
        int run = valid - i;
        if (p->block_table) {
            const int64_t left = p->page_size - (j + i) % p->page_size;
            run = left < run ? (int)left : run;
        }
        const char *row =
            (const char *)t->data + (size_t)fp_key_offset(p, t, b, seq, j + i, kvh0) * c->es;
        for (int x = 0; x < run; x++)
            rows[i + x] = row + x * step;
        i += run;
    }
    for (int i = valid; i < n; i++)
        rows[i] = rows[valid - 1];
}

/* The rows that the _bf16 steps ask the caches for while they work (ukernel.h's pf): of keys
 * [j, j + n) of view t, kv heads [kvh0, kvh0 + nu), as block_rows. Returns the bytes a key, or 0
 * when the heads' rows are not adjacent (the caller then asks with prefetch_row). */
static size_t ahead_rows(const dec_ctx *c, const fp_tensor_view *t, int64_t b, const fp_seq *seq,
                         int64_t j, int n, int64_t hi, int64_t kvh0, int nu, const char **pf)
{
    const fp_problem *p = c->p;
    if (nu > 1 && t->stride[FP_H] != p->head_dim) {
        for (int i = 0; i < n && j + i < hi; i++)
            prefetch_row(c, t, b, seq, j + i, kvh0, nu);
        return 0;
    }
    block_rows(c, t, b, seq, j, n, hi, kvh0, pf);
    return (size_t)p->head_dim * c->es * (size_t)nu;
}

/* The 16-bit rows of keys [j0, j0 + n) of view t (kv head kvh0) for the _bf16 and _f16 steps. */
static void half_rows(const dec_ctx *c, const fp_tensor_view *t, int64_t b, const fp_seq *seq,
                      int64_t j0, int n, int64_t kvh0, const uint16_t **rows)
{
    const char *at[BLOCK_K];
    block_rows(c, t, b, seq, j0, n, j0 + n, kvh0, at);
    for (int x = 0; x < n; x++)
        rows[x] = (const uint16_t *)(const void *)at[x];
}

/* Whether the converted paths of units of more than DOT_ROWS rows widen a key's rows of all nu
 * kv heads in one call (widen_block): 16-bit rows with a contiguous head dim, the heads adjacent,
 * d a multiple of FP_TILE_COLS (so that each head's part starts a tile row). */
static int widen_whole(const dec_ctx *c, const fp_tensor_view *t, int nu)
{
    const fp_problem *p = c->p;
    return (p->dtype == FLASHPORT_F16 || p->dtype == FLASHPORT_BF16) && t->stride[FP_D] == 1 &&
           (nu == 1 || t->stride[FP_H] == p->head_dim) && p->head_dim % FP_TILE_COLS == 0;
}

/* The rows of keys [j0, j0 + n) of view t, kv heads [kvh0, kvh0 + nu), widened to f32 a key at a
 * time (one table call a key instead of one a key and head): key x's rows from dst + x * ld, head
 * u's part at + u * d, with ld = nu * d + FP_TILE_COLS (a tile's leading dimension, off the
 * multiples of 512 bytes that would put a block's rows in a few L1 sets). pc: a step a key. */
static void widen_block(const dec_ctx *c, const fp_tensor_view *t, int64_t b, const fp_seq *seq,
                        int64_t kvh0, int nu, int64_t j0, int n, float *dst, ptrdiff_t ld,
                        pf_cursor *pc)
{
    const uint16_t *rows[BLOCK_K];
    const int w = nu * (int)c->p->head_dim;
    half_rows(c, t, b, seq, j0, n, kvh0, rows);
    for (int x = 0; x < n; x++) {
        pf_step(pc);
        if (c->p->dtype == FLASHPORT_F16)
            c->uk->cvt_f16(w, rows[x], dst + (size_t)x * (size_t)ld);
        else
            c->uk->cvt_bf16(w, rows[x], dst + (size_t)x * (size_t)ld);
    }
}

/* The f32 rows of key j for the task's nu units (kv heads kvh0 + u, one unit when a kv head's
 * group is cut into chunks): a pointer to unit 0's row and the distance *hs between two units'
 * rows, in place when the tensor is f32 with a contiguous head dim, else converted into dst
 * (nu rows, ldd apart). */
static const float *unit_rows(const dec_ctx *c, const fp_tensor_view *t, int64_t b,
                              const fp_seq *seq, int64_t j, int64_t kvh0, int nu, float *dst,
                              ptrdiff_t *hs)
{
    const fp_problem *p = c->p;
    if (p->dtype == FLASHPORT_F32 && t->stride[FP_D] == 1) {
        *hs = (ptrdiff_t)t->stride[FP_H];
        return (const float *)t->data + fp_key_offset(p, t, b, seq, j, kvh0);
    }
    for (int u = 0; u < nu; u++)
        key_row(c, t, b, seq, j, kvh0 + u, dst + (size_t)u * (size_t)c->L.ldd);
    *hs = c->L.ldd;
    return dst;
}

/* Whether the V rows of keys [j0, j0 + n) of kv heads [kvh0, kvh0 + nu) are all finite. */
static int values_finite(const dec_ctx *c, int64_t b, const fp_seq *seq, int64_t kvh0, int nu,
                         int64_t j0, int n, float *tmp)
{
    const fp_problem *p = c->p;
    const int d = (int)p->head_dim;
    for (int x = 0; x < n; x++)
        for (int u = 0; u < nu; u++) {
            const float *v = key_row(c, &p->v, b, seq, j0 + x, kvh0 + u, tmp);
            for (int e = 0; e < d; e++)
                if (!isfinite(v[e]))
                    return 0;
        }
    return 1;
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

/* S = Q K^T of keys [j0, j0 + n) for the task's nu units (kv heads kvh0 + u), key by key, the
 * units' rows of a key side by side: the K rows are read once, in the cache's order (a sequential
 * read when the task holds every kv head of a dense cache). s: unit u's rows x ldk from row
 * u * rows. */
static void dec_scores(const dec_ctx *c, float *scratch, int64_t b, const fp_seq *seq, int64_t kvh0,
                       int nu, int rows, const float *q, int64_t j0, int n, int64_t hi)
{
    const fp_problem *p = c->p;
    const dec_layout *L = &c->L;
    const int d = (int)p->head_dim;
    float *s = scratch + L->s;
    const ptrdiff_t shs = (ptrdiff_t)rows * L->ldk;
    if (c->bf16 || c->scores_h16) { /* the whole block; its V rows asked for meanwhile */
        const uint16_t *k[BLOCK_K];
        const char *pf[BLOCK_K];
        const size_t pf_bytes = ahead_rows(c, &p->v, b, seq, j0, n, hi, kvh0, nu, pf);
        const ptrdiff_t khs = (ptrdiff_t)p->k.stride[FP_H];
        half_rows(c, &p->k, b, seq, j0, n, kvh0, k);
        if (c->bf16)
            c->uk->dec_scores_bf16(nu, rows, d, n, (const uint16_t *)q,
                                   (ptrdiff_t)rows * 2 * L->ldd, 2 * L->ldd, k, khs, s, shs, L->ldk,
                                   pf_bytes ? pf : NULL, n, pf_bytes);
        else /* 16-bit rows converted as they are loaded */
            c->scores_h16(nu, rows, d, n, q, (ptrdiff_t)rows * L->ldd, L->ldd, k, khs, s, shs,
                          L->ldk, pf_bytes ? pf : NULL, n, pf_bytes);
        return;
    }
    for (int x = 0; x < n; x++) {
        if (j0 + x + NEAR_KEYS < hi)
            prefetch_row(c, &p->k, b, seq, j0 + x + NEAR_KEYS, kvh0, nu);
        ptrdiff_t khs;
        const float *k = unit_rows(c, &p->k, b, seq, j0 + x, kvh0, nu, scratch + L->kf, &khs);
        c->uk->dec_scores(nu, rows, d, q, (ptrdiff_t)rows * L->ldd, L->ldd, k, khs, s + x, shs,
                          L->ldk);
    }
}

/* S = Q K^T by the table's gemm on K^T, for f32 (the products summed in the order the backward's
 * gemm sums them, ukernel.h, so that the forward's LSE and the backward's recomputed scores agree
 * to the bit and P sums to 1 there) and for units of more than DOT_ROWS rows (the register
 * blocked product beats a dot product a row once the rows share each K load enough). K^T of all
 * the task's units (f32 elements or bf16 pairs) is transposed from the caller's rows in 16-key
 * runs, each run's rows read whole when the units' heads are adjacent in the cache; f16 rows (or
 * rows with a strided head dim) are converted to f32 first, a unit at a time. ask_v: whether
 * to ask for the block's V rows meanwhile (not when the previous block's P V did). */
static void dec_scores_gemm(const dec_ctx *c, float *scratch, int64_t b, const fp_seq *seq,
                            int64_t kvh0, int nu, int rows, const float *q, int64_t j0, int n,
                            int ask_v)
{
    const fp_problem *p = c->p;
    const dec_layout *L = &c->L;
    const int d = (int)p->head_dim, words = c->bf16 ? d / 2 : d;
    uint32_t *kt = (uint32_t *)(scratch + L->kt);
    const int whole = (nu == 1 || p->k.stride[FP_H] == p->head_dim) && words % FP_TILE_COLS == 0;
    const size_t unit_kt = (size_t)(whole ? words : L->ldd) * (size_t)L->ldk;
    const ptrdiff_t lds = (ptrdiff_t)p->k.stride[FP_S] * (ptrdiff_t)c->es;
    if (!c->bf16 && (p->dtype != FLASHPORT_F32 || p->k.stride[FP_D] != 1)) {
        /* rows converted to f32 first, a unit at a time */
        float *kf = scratch + L->vblk;
        const char *pf[BLOCK_K];
        const size_t pf_bytes =
            ask_v ? ahead_rows(c, &p->v, b, seq, j0, n, j0 + n, kvh0, nu, pf) : 0;
        const int wide = widen_whole(c, &p->k, nu);
        const ptrdiff_t ld = wide ? (ptrdiff_t)nu * d + FP_TILE_COLS : L->ldd;
        pf_cursor pc = pf_start(pf_bytes ? pf : NULL, n, pf_bytes, wide ? n : nu * n);
        if (wide)
            widen_block(c, &p->k, b, seq, kvh0, nu, j0, n, kf, ld, &pc);
        for (int u = 0; u < nu; u++) {
            for (int x = 0; x < n && !wide; x++) {
                pf_step(&pc);
                key_row(c, &p->k, b, seq, j0 + x, kvh0 + u, kf + (size_t)x * L->ldd);
            }
            c->uk->transpose32(n, d, kf + (wide ? u * d : 0), ld * (ptrdiff_t)sizeof(float),
                               kt + u * (size_t)L->ldd * L->ldk, L->ldk);
            c->uk->gemm(rows, n, d, q + (size_t)u * rows * L->ldd, L->ldd, 1,
                        (const float *)kt + u * (size_t)L->ldd * L->ldk, L->ldk,
                        scratch + L->s + (size_t)u * rows * L->ldk, L->ldk, 0);
        }
        return;
    }
    for (int x = 0; x < n;) {
        int run = n - x < FP_TILE_COLS ? n - x : FP_TILE_COLS; /* a 16 x 16 transposition */
        if (p->block_table) {
            const int64_t left = p->page_size - (j0 + x) % p->page_size;
            run = left < run ? (int)left : run;
        }
        for (int64_t j = j0 + x; j < j0 + x + run && ask_v; j++)
            prefetch_row(c, &p->v, b, seq, j, kvh0, nu);
        const char *src =
            (const char *)p->k.data + (size_t)fp_key_offset(p, &p->k, b, seq, j0 + x, kvh0) * c->es;
        if (whole)
            c->uk->transpose32(run, nu * words, src, lds, kt + x, L->ldk);
        else
            for (int u = 0; u < nu; u++)
                c->uk->transpose32(run, words, src + (size_t)u * (size_t)p->k.stride[FP_H] * c->es,
                                   lds, kt + u * unit_kt + x, L->ldk);
        x += run;
    }
    for (int u = 0; u < nu; u++) {
        float *su = scratch + L->s + (size_t)u * rows * L->ldk;
        if (c->bf16)
            c->uk->gemm_bf16(rows, n, words, (const uint16_t *)q + (size_t)u * rows * 2 * L->ldd,
                             2 * L->ldd, 2, kt + u * unit_kt, L->ldk, su, L->ldk, 0);
        else
            c->uk->gemm(rows, n, d, q + (size_t)u * rows * L->ldd, L->ldd, 1,
                        (const float *)kt + u * unit_kt, L->ldk, su, L->ldk, 0);
    }
}

/* Lanes of the partial maxima and sums below: fixed-size inner loops that the compiler turns
 * into vector instructions (a plain running maximum or sum is a chain of scalar operations, as
 * C's order of evaluation asks). */
enum { ROW_LANES = 16 };

/* The maximum of x[0 .. n), NaN ignored; *nan: whether there was one. */
static float row_max(const float *x, int n, int *nan)
{
    float m[ROW_LANES];
    int bad[ROW_LANES];
    for (int i = 0; i < ROW_LANES; i++) {
        m[i] = -INFINITY;
        bad[i] = 0;
    }
    int j = 0;
    for (; j + ROW_LANES <= n; j += ROW_LANES)
        for (int i = 0; i < ROW_LANES; i++) {
            bad[i] |= x[j + i] != x[j + i];
            m[i] = x[j + i] > m[i] ? x[j + i] : m[i];
        }
    for (; j < n; j++) {
        bad[0] |= x[j] != x[j];
        m[0] = x[j] > m[0] ? x[j] : m[0];
    }
    float mx = m[0];
    int any = bad[0];
    for (int i = 1; i < ROW_LANES; i++) {
        mx = m[i] > mx ? m[i] : mx;
        any |= bad[i];
    }
    *nan = any;
    return mx;
}

/* The sum of x[0 .. n) in ROW_LANES partial sums. */
static float row_sum(const float *x, int n)
{
    float a[ROW_LANES] = {0};
    int j = 0;
    for (; j + ROW_LANES <= n; j += ROW_LANES)
        for (int i = 0; i < ROW_LANES; i++)
            a[i] += x[j + i];
    for (; j < n; j++)
        a[0] += x[j];
    float t = 0.0f;
    for (int i = 0; i < ROW_LANES; i++)
        t += a[i];
    return t;
}

/* Row i's scores (srow, keys j0 .. j0 + n) outside its window set to -inf. */
static void dec_mask_row(const fp_problem *p, const fp_seq *seq, int64_t i, int64_t j0, int n,
                         float *srow)
{
    const int64_t a = fp_mask_lo(i, seq->nq, seq->nk, p->window_left) - j0;
    const int64_t e = fp_mask_hi(i, seq->nq, seq->nk, p->window_right) - j0;
    for (int x = 0; x < n; x++)
        if (x < a || x >= e)
            srow[x] = -INFINITY;
}

/* A row's state after a block whose scaled maximum is mx; nan: the block had a NaN score, which
 * makes the row's state NaN for good (its O and LSE are NaN). Returns O's rescale factor. */
static float dec_row_state(fp_softmax_state *st, int nan, float mx)
{
    if (nan) {
        st->m = NAN;
        st->l = NAN;
        return 1.0f;
    }
    return mx > st->m ? fp_softmax_update_exp2(st, mx) : 1.0f;
}

/* The online softmax step of one unit's rows over a key block whose raw scores are in s (rows
 * x n, turned into P in place): softcap / ALiBi / the window per row (core/mask.h, Nq > 1 rows
 * see different keys), the running maximum and sum (core/online_softmax.h, exp2 form, the
 * table's exp2), O rescaled when a maximum moved. */
static void dec_softmax(const dec_ctx *c, float *scratch, const fp_seq *seq, int64_t h0, float *s,
                        float *o, fp_softmax_state *st, int rows, int64_t j0, int n, int full)
{
    const fp_problem *p = c->p;
    const fp_ukernels *uk = c->uk;
    const dec_layout *L = &c->L;
    const int64_t nq = seq->nq;
    const float log2_scale = p->scale * FP_LOG2E;
    float *alpha = scratch + L->alpha, *sub = scratch + L->sub, *sum = scratch + L->sum;
    int rescale = 0;
    if (uk->dec_exp2_rows && p->softcap <= 0.0f && !p->alibi_slopes) {
        /* every row's scores scaled alike: the maxima and the exponentials of all the rows in two
         * vector passes, the states between them */
        if (!full)
            for (int r = 0; r < rows; r++)
                dec_mask_row(p, seq, r % nq, j0, n, s + (size_t)r * L->ldk);
        uk->dec_row_max(rows, n, s, L->ldk, sum);
        for (int r = 0; r < rows; r++) {
            alpha[r] = dec_row_state(&st[r], isnan(sum[r]), sum[r] * log2_scale);
            rescale |= alpha[r] != 1.0f;
            const float base = fp_softmax_exp_base(&st[r]);
            sub[r] = isnan(base) ? 0.0f : base;
        }
        uk->dec_exp2_rows(rows, n, s, L->ldk, log2_scale, sub, sum);
        for (int r = 0; r < rows; r++)
            st[r].l += isnan(st[r].m) ? NAN : sum[r];
        if (rescale)
            uk->scale_rows(rows, (int)p->head_dim, o, L->ldd, alpha);
        return;
    }
    for (int r = 0; r < rows; r++) {
        const int64_t i = r % nq, h = h0 + r / nq;
        const float slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0f;
        float *srow = s + (size_t)r * L->ldk;
        float mul = log2_scale;
        if (p->softcap > 0.0f || slope != 0.0f) {
            for (int x = 0; x < n; x++) {
                const float dist = fp_alibi_distance(i, j0 + x, seq->nq, seq->nk);
                srow[x] =
                    fp_score_transform(srow[x] * p->scale, p->softcap, slope, dist) * FP_LOG2E;
            }
            mul = 1.0f;
        }
        if (!full)
            dec_mask_row(p, seq, i, j0, n, srow);
        int nan;
        const float mx = row_max(srow, n, &nan);
        alpha[r] = dec_row_state(&st[r], nan, mx * mul);
        rescale |= alpha[r] != 1.0f;
        const float base = fp_softmax_exp_base(&st[r]);
        for (int x = 0; x < L->ldk; x++) {
            sub[x] = isnan(base) ? 0.0f : base;
            sum[x] = 0.0f;
        }
        uk->exp2_cols(1, n, srow, L->ldk, mul, sub, sum);
        st[r].l += isnan(base) ? NAN : row_sum(sum, n);
    }
    if (rescale)
        uk->scale_rows(rows, (int)p->head_dim, o, L->ldd, alpha);
}

/* bf16 units of more than DOT_ROWS rows: O += P V by gemm_bf16 (O's rows stay in registers
 * across the block), P rounded to bf16, V as pairs of keys (interleave_bf16) for all the task's
 * units at once, a pair of keys' whole rows at a time when the units' heads are adjacent. */
static void dec_values_gemm(const dec_ctx *c, float *scratch, int64_t b, const fp_seq *seq,
                            int64_t kvh0, int nu, int rows, float *o, int64_t j0, int n, int64_t hi)
{
    const fp_problem *p = c->p;
    const dec_layout *L = &c->L;
    const int d = (int)p->head_dim;
    uint16_t *pb = (uint16_t *)(scratch + L->pb);
    uint32_t *vp = (uint32_t *)(scratch + L->vp);
    const int whole = (nu == 1 || p->v.stride[FP_H] == p->head_dim) && d % FP_TILE_COLS == 0;
    const ptrdiff_t ldv = whole ? (ptrdiff_t)nu * d : L->ldd;
    const size_t unit_vp = whole ? (size_t)d : (size_t)(BLOCK_K / 2) * L->ldd;
    c->uk->round_bf16(nu * rows, n, scratch + L->s, L->ldk, pb, L->ldk, NULL, 0);
    for (int x = 0; x < n; x += 2) {
        for (int64_t j = j0 + x + BLOCK_K; j < j0 + x + BLOCK_K + 2 && j < hi; j++)
            prefetch_row(c, &p->k, b, seq, j, kvh0, nu);
        const uint16_t *v = p->v.data;
        const uint16_t *even = v + fp_key_offset(p, &p->v, b, seq, j0 + x, kvh0);
        const uint16_t *odd =
            x + 1 < n ? v + fp_key_offset(p, &p->v, b, seq, j0 + x + 1, kvh0) : NULL;
        if (whole)
            c->uk->interleave_bf16(nu * d, even, odd, vp + (x / 2) * ldv);
        else
            for (int u = 0; u < nu; u++) {
                const ptrdiff_t hs = (ptrdiff_t)u * (ptrdiff_t)p->v.stride[FP_H];
                c->uk->interleave_bf16(d, even + hs, odd ? odd + hs : NULL,
                                       vp + u * unit_vp + (x / 2) * ldv);
            }
    }
    for (int u = 0; u < nu; u++)
        c->uk->gemm_bf16(rows, d, (n + 1) / 2, pb + (size_t)u * rows * L->ldk, L->ldk, 2,
                         vp + u * unit_vp, ldv, o + (size_t)u * rows * L->ldd, L->ldd, 1);
}

/* O += P V of keys [j0, j0 + n) for the task's nu units, a pair of keys at a time, the units'
 * rows of a key side by side (read once, in the cache's order). bf16: P rounded to bf16 (as
 * flash_fwd.c's bf16 path does) and vdpbf16ps. A block that not every row sees whole and whose V
 * holds an infinite or NaN element takes pv_visible instead, so that a key a row cannot see
 * never reaches it (the NaN rule of include/flashport.h). */
static void dec_values(const dec_ctx *c, float *scratch, int64_t b, const fp_seq *seq, int64_t kvh0,
                       int nu, int rows, float *o, int64_t j0, int n, int full, int64_t hi)
{
    const fp_problem *p = c->p;
    const dec_layout *L = &c->L;
    const int d = (int)p->head_dim;
    const float *s = scratch + L->s;
    const ptrdiff_t shs = (ptrdiff_t)rows * L->ldk, ohs = (ptrdiff_t)rows * L->ldd;
    if (!full && !values_finite(c, b, seq, kvh0, nu, j0, n, scratch + L->vblk)) {
        float *vblk = scratch + L->vblk;
        const float *vrows[BLOCK_K];
        for (int u = 0; u < nu; u++) {
            for (int x = 0; x < n; x++)
                vrows[x] = key_row(c, &p->v, b, seq, j0 + x, kvh0 + u, vblk + (size_t)x * L->ldd);
            pv_visible(c, o + u * ohs, s + u * shs, seq, vrows, j0, n, rows, seq->nq);
        }
        return;
    }
    if (c->bf16 && rows > DOT_ROWS) {
        dec_values_gemm(c, scratch, b, seq, kvh0, nu, rows, o, j0, n, hi);
        return;
    }
    if (c->bf16 || (c->pv_h16 && rows <= DOT_ROWS)) {
        /* the whole block; the next block's K rows asked for meanwhile */
        const uint16_t *v[BLOCK_K];
        const char *pf[BLOCK_K];
        const size_t pf_bytes =
            j0 + BLOCK_K < hi ? ahead_rows(c, &p->k, b, seq, j0 + BLOCK_K, n, hi, kvh0, nu, pf) : 0;
        const ptrdiff_t vhs = (ptrdiff_t)p->v.stride[FP_H];
        half_rows(c, &p->v, b, seq, j0, n, kvh0, v);
        if (c->pv_h16) { /* 16-bit rows converted as they are loaded */
            c->pv_h16(nu, rows, d, n, s, shs, L->ldk, v, vhs, o, ohs, L->ldd, pf_bytes ? pf : NULL,
                      n, pf_bytes);
            return;
        }
        uint16_t *pb = (uint16_t *)(scratch + L->pb); /* the units' rows of P in bf16, ldk apart */
        c->uk->round_bf16(nu * rows, n, s, L->ldk, pb, L->ldk, NULL, 0);
        c->uk->dec_pv_bf16(nu, rows, d, n, pb, shs, L->ldk, v, vhs, o, ohs, L->ldd,
                           pf_bytes ? pf : NULL, n, pf_bytes);
        return;
    }
    if (rows > DOT_ROWS && (p->dtype != FLASHPORT_F32 || p->v.stride[FP_D] != 1)) {
        /* many rows on converted V: gemm over the unit's rows in f32, O in registers */
        float *vblk = scratch + L->vblk;
        const char *pf[BLOCK_K];
        const int ahead = hi - (j0 + BLOCK_K) < BLOCK_K ? (int)(hi - (j0 + BLOCK_K)) : BLOCK_K;
        const size_t pf_bytes =
            ahead > 0 ? ahead_rows(c, &p->k, b, seq, j0 + BLOCK_K, ahead, hi, kvh0, nu, pf) : 0;
        const int wide = widen_whole(c, &p->v, nu);
        const ptrdiff_t ld = wide ? (ptrdiff_t)nu * d + FP_TILE_COLS : L->ldd;
        pf_cursor pc = pf_start(pf_bytes ? pf : NULL, ahead, pf_bytes, wide ? n : nu * n);
        if (wide)
            widen_block(c, &p->v, b, seq, kvh0, nu, j0, n, vblk, ld, &pc);
        for (int u = 0; u < nu; u++) {
            for (int x = 0; x < n && !wide; x++) {
                pf_step(&pc);
                key_row(c, &p->v, b, seq, j0 + x, kvh0 + u, vblk + (size_t)x * L->ldd);
            }
            c->uk->gemm(rows, d, n, s + u * shs, L->ldk, 1, vblk + (wide ? u * d : 0), ld,
                        o + u * ohs, L->ldd, 1);
        }
        return;
    }
    if (f32_rows(p,
                 &p->v)) { /* the whole block; the next block's K and V rows asked for meanwhile */
        const char *at[BLOCK_K], *pf[2 * BLOCK_K];
        const float *v[BLOCK_K];
        size_t pf_bytes = 0;
        int pf_rows = 0;
        block_rows(c, &p->v, b, seq, j0, n, j0 + n, kvh0, at);
        for (int x = 0; x < n; x++)
            v[x] = (const float *)(const void *)at[x];
        if (j0 + BLOCK_K < hi) {
            const int ahead = hi - (j0 + BLOCK_K) < BLOCK_K ? (int)(hi - (j0 + BLOCK_K)) : BLOCK_K;
            /* K's rows, then V's; a view whose heads are not adjacent is prefetched at once
             * instead (ahead_rows returns 0 and fills none), so that it lists no rows */
            pf_bytes = ahead_rows(c, &p->k, b, seq, j0 + BLOCK_K, ahead, hi, kvh0, nu, pf);
            const size_t v_bytes =
                ahead_rows(c, &p->v, b, seq, j0 + BLOCK_K, ahead, hi, kvh0, nu, pf + ahead);
            pf_rows = v_bytes ? 2 * ahead : ahead;
        }
        c->uk->dec_pv(nu, rows, d, n, s, shs, L->ldk, v, (ptrdiff_t)p->v.stride[FP_H], o, ohs,
                      L->ldd, pf_bytes ? pf : NULL, pf_rows, pf_bytes);
        return;
    }
    float *vf = scratch + L->vf;
    for (int x = 0; x < n; x += CONVERTED_KEYS) {
        const int keys = n - x < CONVERTED_KEYS ? n - x : CONVERTED_KEYS;
        const float *v[CONVERTED_KEYS];
        ptrdiff_t vhs = 0;
        for (int i = 0; i < keys; i++) {
            if (j0 + x + i + NEAR_KEYS < hi)
                prefetch_row(c, &p->v, b, seq, j0 + x + i + NEAR_KEYS, kvh0, nu);
            v[i] = unit_rows(c, &p->v, b, seq, j0 + x + i, kvh0, nu,
                             vf + (size_t)i * (size_t)nu * L->ldd, &vhs);
        }
        c->uk->dec_pv(nu, rows, d, keys, s + x, shs, L->ldk, v, vhs, o, ohs, L->ldd, NULL, 0, 0);
    }
}

/* One task: units [u0, u1) of sequence b (kv heads u / chunks, consecutive), over the keys of
 * split `split`, key block by key block, each block's units one after the other: the block's K
 * and V rows of all the task's kv heads are read once from memory, in the cache's order. Writes
 * O and LSE (one split) or the partial of task index `task`. */
static void dec_task(const dec_ctx *c, float *scratch, int64_t b, int64_t u0, int64_t u1, int split,
                     int64_t task)
{
    const fp_problem *p = c->p;
    const fp_ukernels *uk = c->uk;
    const dec_layout *L = &c->L;
    const fp_seq seq = fp_problem_seq(p, b);
    const int64_t nq = seq.nq;
    const int64_t nh = c->chunk_heads;
    const int rows = (int)(nh * nq), all = (int)((u1 - u0) * rows);
    const int d = (int)p->head_dim;
    const int split_plan = c->plan.num_splits > 1;
    float *q = scratch + L->q, *o = scratch + L->o;
    fp_softmax_state *st = (fp_softmax_state *)(scratch + L->st);
    if (rows == 0)
        return;

    for (int64_t u = u0; u < u1; u++) {
        const int64_t h0 = (u / c->chunks) * c->group + (u % c->chunks) * nh;
        for (int64_t g = 0; g < nh; g++) {
            const int64_t r0 = (u - u0) * rows + g * nq;
            const fp_block qb = {p->q.data, p->dtype, fp_row_offset(&p->q, b, seq.q_start, h0 + g),
                                 p->q.stride[FP_S], p->q.stride[FP_D]};
            if (c->bf16) /* bf16 rows, 2 ldd elements apart */
                for (int64_t i = 0; i < nq; i++)
                    memcpy((uint16_t *)q + (size_t)(r0 + i) * 2 * (size_t)L->ldd,
                           (const uint16_t *)qb.data + qb.off + i * qb.rs,
                           sizeof(uint16_t) * (size_t)d);
            else
                fp_tile_load(q + (size_t)r0 * L->ldd, L->ldd, &qb, (int)nq, d, uk);
        }
    }
    for (int r = 0; r < all; r++)
        fp_softmax_init(&st[r]);
    memset(o, 0, sizeof(float) * (size_t)all * (size_t)L->ldd);

    /* Keys any row sees, cut to this split. */
    int64_t lo, hi;
    fp_mask_block_range(0, nq, seq.nq, seq.nk, p->window_left, p->window_right, &lo, &hi);
    const int64_t k0 = (int64_t)split * c->plan.keys_per_split;
    const int64_t k1 = k0 + c->plan.keys_per_split;
    lo = lo > k0 ? lo : k0;
    hi = hi < k1 ? hi : k1;
    /* units of one kv head (chunks > 1) come one per task: nu is 1 */
    const int64_t kv0 = u0 / c->chunks;
    const int nu = (int)(u1 - u0);

    for (int64_t j = lo; j < lo + BLOCK_K && j < hi; j++) /* the first block's K (prefetch_row) */
        prefetch_row(c, &p->k, b, &seq, j, kv0, nu);
    for (int64_t j0 = lo; j0 < hi; j0 += BLOCK_K) {
        const int n = (int)(hi - j0 < BLOCK_K ? hi - j0 : BLOCK_K);
        const int full =
            fp_mask_block_full(0, nq, j0, j0 + n, seq.nq, seq.nk, p->window_left, p->window_right);
        if ((p->dtype == FLASHPORT_F32 && p->k.stride[FP_D] == 1) || rows > DOT_ROWS)
            dec_scores_gemm(c, scratch, b, &seq, kv0, nu, rows, q, j0, n,
                            j0 == lo || !f32_rows(p, &p->v));
        else
            dec_scores(c, scratch, b, &seq, kv0, nu, rows, q, j0, n, hi);
        for (int64_t u = u0; u < u1; u++) {
            const size_t r0 = (size_t)((u - u0) * rows);
            const int64_t h0 = (u / c->chunks) * c->group + (u % c->chunks) * nh;
            dec_softmax(c, scratch, &seq, h0, scratch + L->s + r0 * L->ldk, o + r0 * L->ldd,
                        st + r0, rows, j0, n, full);
        }
        dec_values(c, scratch, b, &seq, kv0, nu, rows, o, j0, n, full, hi);
    }

    for (int r = 0; r < all; r++) {
        float *orow = o + (size_t)r * L->ldd;
        const float f = fp_softmax_out_scale(&st[r]);
        if (f == 0.0f) /* no visible key: O = 0 */
            memset(orow, 0, sizeof(float) * (size_t)d);
        else
            for (int x = 0; x < d; x++)
                orow[x] *= f;
    }
    if (split_plan) {
        const size_t task_rows = (size_t)(c->per_task * c->unit_rows);
        for (int r = 0; r < all; r++) {
            memcpy(c->part_o + ((size_t)task * task_rows + (size_t)r) * (size_t)d,
                   o + (size_t)r * L->ldd, sizeof(float) * (size_t)d);
            c->part_lse[(size_t)task * task_rows + (size_t)r] = fp_softmax_lse_exp2(&st[r]);
        }
        return;
    }
    for (int64_t u = u0; u < u1; u++) {
        const int64_t h0 = (u / c->chunks) * c->group + (u % c->chunks) * nh;
        for (int64_t g = 0; g < nh; g++) {
            const int64_t r0 = (u - u0) * rows + g * nq;
            const fp_block ob = {p->o.data, p->dtype, fp_row_offset(&p->o, b, seq.q_start, h0 + g),
                                 p->o.stride[FP_S], p->o.stride[FP_D]};
            fp_tile_store(&ob, o + (size_t)r0 * L->ldd, L->ldd, (int)nq, d, 1.0f, uk);
            if (p->lse.data)
                for (int64_t i = 0; i < nq; i++)
                    ((float *)p->lse.data)[fp_lse_offset(&p->lse, b, h0 + g, seq.q_start + i)] =
                        fp_softmax_lse_exp2(&st[r0 + i]);
        }
    }
}

/* Split plans: merges the partials of the splits of units [u0, u1) of sequence b through their
 * LSEs (fp_softmax_merge) into O and LSE. first: the task index of split 0. */
static void dec_merge(const dec_ctx *c, float *scratch, int64_t b, int64_t u0, int64_t u1,
                      int64_t first)
{
    const fp_problem *p = c->p;
    const fp_seq seq = fp_problem_seq(p, b);
    const int64_t nq = seq.nq, nh = c->chunk_heads;
    const int d = (int)p->head_dim;
    const int rows = (int)(nh * nq);
    const size_t task_rows = (size_t)(c->per_task * c->unit_rows);
    float *o = scratch + c->L.o;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t h0 = (u / c->chunks) * c->group + (u % c->chunks) * nh;
        for (int r = 0; r < rows; r++) {
            const size_t row = (size_t)((u - u0) * rows + r);
            float *orow = o + (size_t)r * c->L.ldd;
            float lse = -INFINITY;
            memset(orow, 0, sizeof(float) * (size_t)d);
            for (int sp = 0; sp < c->plan.num_splits; sp++) {
                const size_t at = (size_t)(first + sp) * task_rows + row;
                const float *part = c->part_o + at * (size_t)d;
                float wa, wb;
                lse = fp_softmax_merge(lse, c->part_lse[at], &wa, &wb);
                for (int e = 0; e < d; e++)
                    orow[e] =
                        (wa == 0.0f ? 0.0f : wa * orow[e]) + (wb == 0.0f ? 0.0f : wb * part[e]);
            }
            if (p->lse.data)
                ((float *)
                     p->lse.data)[fp_lse_offset(&p->lse, b, h0 + r / nq, seq.q_start + r % nq)] =
                    lse;
        }
        for (int64_t g = 0; g < nh; g++) {
            const fp_block ob = {p->o.data, p->dtype, fp_row_offset(&p->o, b, seq.q_start, h0 + g),
                                 p->o.stride[FP_S], p->o.stride[FP_D]};
            fp_tile_store(&ob, o + (size_t)(g * nq) * c->L.ldd, c->L.ldd, (int)nq, d, 1.0f, c->uk);
        }
    }
}

flashport_status fp_cpu_decode_forward(const fp_problem *p, const fp_ukernels *uk)
{
    dec_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.uk = uk;
    c.group = p->heads / p->kv_heads;
    c.bf16 = p->dtype == FLASHPORT_BF16 && uk->gemm_bf16 && p->head_dim % 2 == 0 &&
             p->q.stride[FP_D] == 1 && p->k.stride[FP_D] == 1 && p->v.stride[FP_D] == 1;
    if (p->k.stride[FP_D] == 1 && p->v.stride[FP_D] == 1) {
        if (p->dtype == FLASHPORT_F16) {
            c.scores_h16 = uk->dec_scores_f16;
            c.pv_h16 = uk->dec_pv_f16;
        } else if (p->dtype == FLASHPORT_BF16 && !c.bf16 && uk->dec_scores_bf16_f32) {
            c.scores_h16 = uk->dec_scores_bf16_f32;
            c.pv_h16 = uk->dec_pv_bf16_f32;
        }
    }
    /* Whole heads per unit, at most DECODE_ROWS rows, the group cut into equal chunks. */
    int64_t per = DECODE_ROWS / p->seqlen_q;
    c.chunk_heads = c.group;
    while (c.chunk_heads > per || c.group % c.chunk_heads != 0)
        c.chunk_heads--;
    c.chunks = c.group / c.chunk_heads;
    c.units = p->kv_heads * c.chunks;
    c.unit_rows = c.chunk_heads * p->seqlen_q;
    /* Units of more rows than DOT_ROWS are bound by the products: on tables that take bf16
     * through the f32 products (bf16_as_f32: vdpbf16ps gives fewer flops than the f32 FMA),
     * their bf16 rows are widened to f32 (as f16's are) and run f32 products. */
    const int bf16_widened = c.bf16 && c.unit_rows > DOT_ROWS && uk->bf16_as_f32;
    if (bf16_widened)
        c.bf16 = 0;
    /* As many consecutive kv heads per task as TASK_ROWS allows: the key blocks of all kv heads
     * then stream in the cache's order; the threads get work from the key splits. A kv head cut
     * into chunks (so many rows that the products, not the read, are the bound) is one unit a
     * task. */
    c.per_task = c.chunks > 1 ? 1 : TASK_ROWS / c.unit_rows;
    /* the units' K^T tiles stay within TASK_KT_BYTES */
    while (c.per_task > 1 && (size_t)c.per_task * (size_t)fp_tile_ld(p->head_dim) *
                                     (size_t)fp_tile_ld(BLOCK_K) * sizeof(float) >
                                 TASK_KT_BYTES)
        c.per_task--;
    c.per_task = c.per_task < 1 ? 1 : c.per_task > c.units ? c.units : c.per_task;
    c.tiles = (c.units + c.per_task - 1) / c.per_task;
    c.L = dec_layout_of(p->head_dim, (int)(c.per_task * c.unit_rows), (int)c.per_task);

    c.es = flashport_dtype_size(p->dtype);
    const int workers = fp_cpu_threads();
    const fp_decode_target target = {workers, BLOCK_K, MIN_SPLIT_BLOCKS, MAX_SPLITS};
    c.plan = fp_plan_decode(p->batch * c.tiles, p->seqlen_k, &target);
    if (fp_host()->log_enabled())
        fp_host()->log("cpu: decode forward (GQA packing: %lld query heads x %lld rows per unit, "
                       "%lld unit(s) per kv head, %lld unit(s) per task), %s micro-kernels, %s%s; "
                       "split-KV plan: %d split(s) of %lld keys, %lld tasks for %d threads",
                       (long long)c.chunk_heads, (long long)p->seqlen_q, (long long)c.chunks,
                       (long long)c.per_task, uk->name,
                       c.bf16                      ? "bf16 dot products (vdpbf16ps), P in bf16"
                       : p->dtype == FLASHPORT_F32 ? "f32 products"
                       : c.scores_h16 ? "f32 products on 16-bit rows converted as they are loaded"
                       : bf16_widened ? "f32 products on bf16 K/V rows widened to f32 (vdpbf16ps "
                                        "gives fewer flops than the FMA on this CPU)"
                                      : "f32 products on K/V rows converted to f32",
                       p->block_table ? ", paged K/V" : "", (int)c.plan.num_splits,
                       (long long)c.plan.keys_per_split, (long long)c.plan.num_tasks, workers);
    if (c.plan.num_tasks == 0)
        return FLASHPORT_OK;
    const int threads = c.plan.num_tasks < workers ? (int)c.plan.num_tasks : workers;
    const size_t task_rows = (size_t)(c.per_task * c.unit_rows);

    size_t slice;
    float *scratch = fp_scratch_alloc(threads, c.L.total, c.L.total, &slice);
    const size_t part =
        c.plan.num_splits > 1 ? (size_t)c.plan.num_tasks * task_rows * (size_t)p->head_dim : 0;
    if (part) {
        c.part_o = malloc(sizeof(float) * part);
        c.part_lse = malloc(sizeof(float) * (size_t)c.plan.num_tasks * task_rows);
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
    const int64_t tiles = p->batch * c.tiles;

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
            const int64_t tile = t / c.plan.num_splits, b = tile / c.tiles;
            const int64_t u0 = (tile % c.tiles) * c.per_task;
            const int64_t u1 = u0 + c.per_task < c.units ? u0 + c.per_task : c.units;
            dec_task(&c, mine, b, u0, u1, (int)(t % c.plan.num_splits), t);
        }
        if (part) {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t tile = 0; tile < tiles; tile++) {
                const int64_t u0 = (tile % c.tiles) * c.per_task;
                const int64_t u1 = u0 + c.per_task < c.units ? u0 + c.per_task : c.units;
                dec_merge(&c, mine, tile / c.tiles, u0, u1, tile * c.plan.num_splits);
            }
        }
    }
    fp_scratch_free(scratch);
    free(c.part_o);
    free(c.part_lse);
    return FLASHPORT_OK;
}
