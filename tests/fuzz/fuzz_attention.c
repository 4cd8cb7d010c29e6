/*
 * The attention fuzzer: one input is one forward or backward call, decoded from the bytes, run on
 * "cpu" and on "reference" through the public API. Built two ways (tests/fuzz/CMakeLists.txt):
 * with libFuzzer (clang -fsanitize=fuzzer,address,undefined) as fuzz_attention, and with the
 * plain driver fuzz_main.c as fuzz_corpus, which replays the committed seed corpus as a CTest.
 *
 * What an input decides (every field from the bytes; a short input reads zeros past its end):
 *   the direction; the dtype (f32, f16, bf16); dense or varlen; B, Nq, Nk, H, Hkv, D (small, but
 *   crossing the 64-row tiles of the cpu backend); per tensor a layout (dimension order and
 *   padding: contiguous, permuted, padded, strided head dim) and at times one raw stride; the
 *   params (scale down to 0 and up to 1e30, window sides, causal, softcap, ALiBi slopes,
 *   deterministic, cu_seqlens, max_seqlen, seqused_k, a paged KV cache and its block table);
 *   whether lse is passed; the value range of the inputs and whether they hold NaN / inf; and one
 *   deliberate fault (a NULL tensor or data pointer, a wrong dtype, rank or dimension, an output
 *   aliasing an input, a broken cu_seqlens entry, a seqused_k past its sequence, a block-table
 *   entry out of range).
 *
 * What every input must satisfy (a violation aborts, which libFuzzer reports as a finding):
 *   - no sanitizer report;
 *   - a call that fails leaves every output byte as it was poisoned (outputs are whole buffers,
 *     padding included, so a write anywhere is seen);
 *   - a call that succeeds on finite inputs writes finite O, dQ, dK, dV and an LSE that is finite
 *     or -inf (a row with no visible key, where O must be 0); every element of each output view
 *     is written;
 *   - cpu and reference return the same status, and on success every output element (O, LSE,
 *     dQ, dK, dV) of cpu lies within an error bound of the reference's (fuzz_bound.c: derived
 *     per element from the magnitudes of the terms it sums, so that rows whose terms cancel get
 *     the error that rounding those terms to the storage dtype leaves, and no more), when the
 *     scores are small enough for the problem to be well-conditioned (|score| bounded by 30;
 *     beyond, softmax is an argmax whose near-ties may legitimately break either way). The
 *     bound holds for any table, avx512bf16's bf16 products included.
 * Scores must also be representable in f32 for the finiteness rule: values, scale and slopes are
 * bounded so that they are.
 */
#include "core/dtype.h"
#include "flashport.h"
#include "tests/fuzz/fuzz_bound.h"
#include "tests/test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- reading the input --------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *p;
    size_t n, at;
} reader;

static unsigned byte(reader *r)
{
    return r->at < r->n ? r->p[r->at++] : 0u;
}

static unsigned below(reader *r, unsigned n) /* 0 .. n - 1 */
{
    return byte(r) % n;
}

static uint32_t word(reader *r)
{
    uint32_t w = byte(r);
    w |= (uint32_t)byte(r) << 8;
    w |= (uint32_t)byte(r) << 16;
    return w | (uint32_t)byte(r) << 24;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "fuzz_attention: " __VA_ARGS__);                                           \
        fputc('\n', stderr);                                                                       \
        abort();                                                                                   \
    } while (0)

/* ---- tensors ------------------------------------------------------------------------------- */

enum { T_Q, T_K, T_V, T_O, T_DO, T_DQ, T_DK, T_DV, T_N };
static const char *const tname[T_N] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};

/* One q/k/v-shaped tensor in its own buffer: logical [tokens][heads][dim] (dense tokens are
 * b * n + i), placed by strides. */
typedef struct tensor {
    int rank;
    int64_t shape[4], stride[4];
    int64_t elems; /* buffer elements */
    void *buf;
} tensor;

/* Strides for shape (outermost first) in the order perm (perm[0] the innermost dimension), with
 * `pad` extra elements after each dimension. */
static void place(tensor *t, const int *perm, int pad)
{
    int64_t s = 1;
    for (int i = 0; i < t->rank; i++) {
        const int d = perm[i];
        t->stride[d] = s;
        s *= t->shape[d] + pad;
    }
}

/* Largest offset + 1 of the view, or -1 when a stride is negative or it overflows. */
static int64_t extent(const tensor *t)
{
    int64_t off = 0;
    for (int d = 0; d < t->rank; d++) {
        int64_t term;
        if (t->shape[d] == 0)
            return 0;
        if (t->stride[d] < 0 || __builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &term) ||
            __builtin_add_overflow(off, term, &off))
            return -1;
    }
    return off + 1;
}

static int64_t offset_of(const tensor *t, int varlen, int64_t tok, int64_t nper, int64_t h,
                         int64_t e)
{
    if (varlen)
        return tok * t->stride[0] + h * t->stride[1] + e * t->stride[2];
    return (tok / nper) * t->stride[0] + (tok % nper) * t->stride[1] + h * t->stride[2] +
           e * t->stride[3];
}

/* ---- one call ------------------------------------------------------------------------------ */

typedef struct call {
    flashport_dtype dt;
    int backward, varlen, with_lse, finite, fault, compare;
    int b, nq, nk, h, hkv, d;
    int64_t total_q, total_k;
    int32_t cu_q[5], cu_k[5];
    int32_t used[5]; /* seqused_k, when set */
    float slopes[8];
    flashport_attention_params p;
    tensor t[T_N];
    int paged;           /* K and V in pages (t[T_K], t[T_V]) through the block table bt */
    int32_t bt[3 * 101]; /* [B, block_table_stride] */
    tensor kv_dense[2];  /* paged: K and V as decoded, dense, where the bound reads keys */
    float *lse;
    int64_t lse_elems, lse_stride[3];
} call;

static const int perms4[6][4] = {{3, 2, 1, 0}, {3, 1, 2, 0}, {3, 2, 0, 1},
                                 {2, 3, 1, 0}, {3, 0, 2, 1}, {1, 3, 2, 0}};
static const int perms3[3][3] = {{2, 1, 0}, {2, 0, 1}, {1, 2, 0}};

/* Shapes and layouts of every tensor; returns 0 when the input asks for more memory than the
 * fuzzer should spend (skipped, not a finding). */
static int make_tensors(call *c, reader *r)
{
    for (int i = 0; i < T_N; i++) {
        tensor *t = &c->t[i];
        const int qside = i == T_Q || i == T_O || i == T_DO || i == T_DQ;
        const int64_t heads = qside ? c->h : c->hkv;
        if (c->varlen) {
            t->rank = 3;
            t->shape[0] = qside ? c->total_q : c->total_k;
            t->shape[1] = heads;
            t->shape[2] = c->d;
            place(t, perms3[below(r, 3)], (int)below(r, 3));
        } else {
            t->rank = 4;
            t->shape[0] = c->b;
            t->shape[1] = qside ? c->nq : c->nk;
            t->shape[2] = heads;
            t->shape[3] = c->d;
            place(t, perms4[below(r, 6)], (int)below(r, 3));
        }
        if (below(r, 16) == 0) /* a raw stride: negative, zero, huge or just odd */
            t->stride[below(r, (unsigned)t->rank)] = (int64_t)(int32_t)word(r) * (1 + below(r, 4));
        int64_t e = extent(t);
        if (e > ((int64_t)1 << 22))
            return 0;
        t->elems = e < 0 ? 64 : e; /* invalid strides: the call must fail without touching it */
        t->buf = malloc((size_t)(t->elems > 0 ? t->elems : 1) * 4);
        if (!t->buf)
            return 0;
    }
    const int64_t lrows = c->varlen ? c->total_q : c->nq, lb = c->varlen ? 1 : c->b;
    c->lse_elems = lb * c->h * lrows + below(r, 3);
    c->lse = malloc((size_t)(c->lse_elems > 0 ? c->lse_elems : 1) * sizeof(float));
    return c->lse != NULL;
}

static void free_call(call *c)
{
    for (int i = 0; i < T_N; i++)
        free(c->t[i].buf);
    free(c->kv_dense[0].buf);
    free(c->kv_dense[1].buf);
    free(c->lse);
}

static float value(tu_rng *rng, float range, int finite)
{
    float x = tu_rng_uniform(rng, -range, range);
    if (!finite) {
        const uint32_t u = tu_rng_u32(rng) % 64;
        x = u == 0 ? NAN : u == 1 ? INFINITY : u == 2 ? -INFINITY : x;
    }
    return x;
}

/* The API descriptor of tensor i; lse likewise. */
static flashport_tensor desc(const call *c, int i, void *buf)
{
    flashport_tensor t;
    memset(&t, 0, sizeof t);
    t.data = buf;
    t.dtype = c->dt;
    t.rank = c->t[i].rank;
    for (int d = 0; d < t.rank; d++) {
        t.shape[d] = c->t[i].shape[d];
        t.stride[d] = c->t[i].stride[d];
    }
    return t;
}

static flashport_tensor lse_desc(const call *c, float *buf)
{
    flashport_tensor t;
    memset(&t, 0, sizeof t);
    t.data = buf;
    t.dtype = FLASHPORT_F32;
    const int64_t rows = c->varlen ? c->total_q : c->nq;
    if (c->varlen) {
        t.rank = 2;
        t.shape[0] = c->h, t.shape[1] = rows;
        t.stride[0] = rows, t.stride[1] = 1;
    } else {
        t.rank = 3;
        t.shape[0] = c->b, t.shape[1] = c->h, t.shape[2] = rows;
        t.stride[0] = c->h * rows, t.stride[1] = rows, t.stride[2] = 1;
    }
    return t;
}

/* Outputs of one backend: copies of the output buffers, poisoned. */
typedef struct outs {
    void *buf[T_N];
    float *lse;
} outs;

static int outs_make(const call *c, outs *o, const void *o_from_forward, const float *lse_fwd)
{
    memset(o, 0, sizeof *o);
    for (int i = T_O; i < T_N; i++) {
        if (i == T_DO)
            continue;
        o->buf[i] = malloc((size_t)(c->t[i].elems > 0 ? c->t[i].elems : 1) * 4);
        if (!o->buf[i])
            return 0;
        tu_poison(o->buf[i], c->t[i].elems, c->dt);
    }
    o->lse = malloc((size_t)(c->lse_elems > 0 ? c->lse_elems : 1) * sizeof(float));
    if (!o->lse)
        return 0;
    tu_poison(o->lse, c->lse_elems, FLASHPORT_F32);
    if (o_from_forward) { /* backward: O and LSE are inputs */
        memcpy(o->buf[T_O], o_from_forward, (size_t)c->t[T_O].elems * flashport_dtype_size(c->dt));
        memcpy(o->lse, lse_fwd, (size_t)c->lse_elems * sizeof(float));
    }
    return 1;
}

static void outs_free(outs *o)
{
    for (int i = 0; i < T_N; i++)
        free(o->buf[i]);
    free(o->lse);
}

/* Runs the call on a backend with its own outputs; applies the input's fault. */
static flashport_status run(const call *c, const char *name, outs *o)
{
    flashport_backend *be;
    if (flashport_backend_open(name, &be) != FLASHPORT_OK)
        FAIL("cannot open %s: %s", name, flashport_last_error());
    flashport_tensor t[T_N], l = lse_desc(c, o->lse);
    for (int i = 0; i < T_N; i++)
        t[i] = desc(c, i, i == T_O || i >= T_DQ ? o->buf[i] : c->t[i].buf);
    const flashport_tensor *pt[T_N];
    for (int i = 0; i < T_N; i++)
        pt[i] = &t[i];
    const flashport_tensor *pl = c->with_lse || c->backward ? &l : NULL;
    const int victim = c->fault >> 4;
    switch (c->fault & 15) {
    case 1:
        pt[victim % T_N] = NULL;
        break;
    case 2:
        t[victim % T_N].data = NULL;
        break;
    case 3:
        t[victim % T_N].dtype = (flashport_dtype)((c->dt + 1 + victim) % 6);
        break;
    case 4:
        t[victim % T_N].rank = victim % 6;
        break;
    case 5:
        t[victim % T_N].shape[victim % 4] += 1 + victim % 3;
        break;
    case 6: /* an empty input occupies no memory: pointing an output at it is no alias, and
             * would hand the library a buffer smaller than the output (Nk = 0: O into K's) */
        if (c->t[victim % 3].elems > 0)
            t[c->backward ? T_DQ + victim % 3 : T_O].data = c->t[victim % 3].buf;
        break;
    case 7:
        l.dtype = FLASHPORT_F16;
        break;
    case 8:
        l.shape[victim % 2] += 1;
        break;
    default:
        break;
    }
    flashport_status st =
        c->backward
            ? flashport_attention_backward(be, &c->p, pt[T_Q], pt[T_K], pt[T_V], pt[T_O], pl,
                                           pt[T_DO], pt[T_DQ], pt[T_DK], pt[T_DV])
            : flashport_attention_forward(be, &c->p, pt[T_Q], pt[T_K], pt[T_V], pt[T_O], pl);
    flashport_backend_close(be);
    return st;
}

/* ---- checks -------------------------------------------------------------------------------- */

static void check_untouched(const call *c, const outs *o, const char *name, flashport_status st)
{
    for (int i = T_O; i < T_N; i++) {
        if (!o->buf[i] || (c->backward && i == T_O) || (!c->backward && i > T_O))
            continue;
        for (int64_t x = 0; x < c->t[i].elems; x++)
            if (!tu_is_poison(o->buf[i], x, c->dt))
                FAIL("%s failed (%s: %s) but wrote %s[%lld]", name, flashport_status_string(st),
                     flashport_last_error(), tname[i], (long long)x);
    }
    if (!c->backward)
        for (int64_t x = 0; x < c->lse_elems; x++)
            if (!tu_is_poison(o->lse, x, FLASHPORT_F32))
                FAIL("%s failed (%s) but wrote lse[%lld]", name, flashport_status_string(st),
                     (long long)x);
}

/* Sequence of packed token tok (dense: tok / Nq), and its row index and the lengths. */
static void seq_of(const call *c, int64_t tok, int qside, int *b, int64_t *i)
{
    if (!c->varlen) {
        const int64_t n = qside ? c->nq : c->nk;
        *b = (int)(tok / n), *i = tok % n;
        return;
    }
    const int32_t *cu = qside ? c->cu_q : c->cu_k;
    *b = 0;
    while (*b < c->b && tok >= cu[*b + 1])
        (*b)++;
    *i = *b < c->b ? tok - cu[*b] : -1; /* -1: past the last sequence, never written */
}

/* Logical f32 copy [tokens][heads][D] of tensor i's view in buf (the tu_problem layout). */
static float *gather(const call *c, int i, const void *buf)
{
    const tensor *t = c->paged && (i == T_K || i == T_V) ? &c->kv_dense[i - T_K] : &c->t[i];
    const int qside = i == T_Q || i == T_O || i == T_DO || i == T_DQ;
    const int64_t tokens = qside ? c->total_q : c->total_k, heads = qside ? c->h : c->hkv;
    const int64_t nper = qside ? c->nq : c->nk;
    float *out = malloc((size_t)(tokens * heads * c->d > 0 ? tokens * heads * c->d : 1) * 4);
    for (int64_t tok = 0; out && tok < tokens; tok++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t e = 0; e < c->d; e++)
                out[(tok * heads + h) * c->d + e] =
                    fp_load(buf ? buf : t->buf, offset_of(t, c->varlen, tok, nper, h, e), c->dt);
    return out;
}

/* Index of LSE row (b, h, i) of the call's lse buffer, and of the same row in the tu_problem
 * layout [H][total_q] (tok the packed query token). */
static int64_t lse_at(const call *c, int b, int64_t h, int64_t i)
{
    const int64_t rows = c->varlen ? c->total_q : c->nq;
    return ((int64_t)(c->varlen ? 0 : b) * c->h + h) * rows + i;
}

/* The error bounds of the comparison (tests/fuzz/fuzz_bound.c): per element of O or dQ / dK /
 * dV in the logical layout, and per LSE row. */
typedef struct bounds {
    int32_t cu_q[5], cu_k[5];
    tu_problem prob;
    float *in[T_N], *lse;
    double *out[T_N], *lse_bound;
} bounds;

static void bounds_free(bounds *bd)
{
    for (int i = 0; i < T_N; i++) {
        free(bd->in[i]);
        free(bd->out[i]);
    }
    free(bd->lse);
    free(bd->lse_bound);
}

/* Fills bd for a successful call; o_fwd and lse_fwd: the backward's O and LSE inputs. Returns 0
 * when out of memory (the comparison is skipped, not failed). */
static int bounds_make(const call *c, bounds *bd, const void *o_fwd, const float *lse_fwd)
{
    memset(bd, 0, sizeof *bd);
    for (int b = 0; b <= c->b; b++) {
        bd->cu_q[b] = c->varlen ? c->cu_q[b] : b * c->nq;
        bd->cu_k[b] = c->varlen ? c->cu_k[b] : b * c->nk;
    }
    tu_problem *p = &bd->prob;
    p->dtype = p->o_dtype = c->dt;
    p->batch = c->b, p->heads = c->h, p->kv_heads = c->hkv, p->head_dim = c->d;
    p->cu_q = bd->cu_q, p->cu_k = bd->cu_k;
    p->scale = c->p.scale > 0.0f ? c->p.scale : 1.0f / sqrtf((float)c->d);
    p->softcap = c->p.softcap;
    p->window_left = c->p.window_left;
    p->window_right = c->p.causal ? 0 : c->p.window_right;
    p->alibi = c->p.alibi_slopes;
    p->used_k = c->p.seqused_k;
    const int ins[5] = {T_Q, T_K, T_V, T_O, T_DO};
    for (int x = 0; x < (c->backward ? 5 : 3); x++)
        if (!(bd->in[ins[x]] = gather(c, ins[x], ins[x] == T_O ? o_fwd : NULL)))
            return 0;
    p->q = bd->in[T_Q], p->k = bd->in[T_K], p->v = bd->in[T_V];
    const int64_t qn = c->total_q * c->h * c->d, kn = c->total_k * c->hkv * c->d;
    const int64_t lrows = bd->cu_q[c->b];
    for (int i = c->backward ? T_DQ : T_O; i <= (c->backward ? T_DV : T_O); i++)
        if (!(bd->out[i] = calloc((size_t)((i == T_O || i == T_DQ ? qn : kn) + 1), sizeof(double))))
            return 0;
    bd->lse = calloc((size_t)(c->h * lrows + 1), sizeof(float));
    bd->lse_bound = calloc((size_t)(c->h * lrows + 1), sizeof(double));
    if (!bd->lse || !bd->lse_bound)
        return 0;
    if (!c->backward)
        return fb_forward_bound(p, bd->out[T_O], bd->lse_bound) == 0;
    for (int b = 0; b < c->b; b++)
        for (int64_t h = 0; h < c->h; h++)
            for (int64_t i = 0; i < bd->cu_q[b + 1] - bd->cu_q[b]; i++)
                bd->lse[h * lrows + bd->cu_q[b] + i] =
                    lse_fwd[lse_at(c, b, h, c->varlen ? bd->cu_q[b] + i : i)];
    return fb_backward_bound(p, bd->in[T_O], bd->lse, bd->in[T_DO], bd->out[T_DQ], bd->out[T_DK],
                             bd->out[T_DV]) == 0;
}

/* Every element of each output view: written, finite (when the inputs are), and, when compared,
 * within the error bound of the reference's (fuzz_bound.h). */
static void check_success(const call *c, const outs *mine, const outs *ref, const void *o_fwd,
                          const float *lse_fwd)
{
    const int first = c->backward ? T_DQ : T_O, last = c->backward ? T_DV : T_O;
    bounds bd;
    const int compare = c->compare && bounds_make(c, &bd, o_fwd, lse_fwd);
    for (int i = first; i <= last; i++) {
        const int qside = i == T_O || i == T_DQ;
        const int64_t tokens = qside ? c->total_q : c->total_k, heads = qside ? c->h : c->hkv;
        const int64_t nper = qside ? c->nq : c->nk;
        for (int64_t tok = 0; tok < tokens; tok++) {
            int b;
            int64_t row;
            seq_of(c, tok, qside, &b, &row);
            if (row < 0)
                continue;
            for (int64_t h = 0; h < heads; h++)
                for (int64_t e = 0; e < c->d; e++) {
                    const int64_t at = offset_of(&c->t[i], c->varlen, tok, nper, h, e);
                    const float x = fp_load(mine->buf[i], at, c->dt);
                    const float y = fp_load(ref->buf[i], at, c->dt);
                    if (tu_is_poison(mine->buf[i], at, c->dt))
                        FAIL("cpu left %s token %lld head %lld elem %lld unwritten", tname[i],
                             (long long)tok, (long long)h, (long long)e);
                    if (c->finite && !isfinite(x))
                        FAIL("cpu: %s token %lld head %lld elem %lld is %g on finite inputs",
                             tname[i], (long long)tok, (long long)h, (long long)e, (double)x);
                    if (c->finite && !isfinite(y))
                        FAIL("reference: %s token %lld is %g on finite inputs", tname[i],
                             (long long)tok, (double)y);
                    if (!compare)
                        continue;
                    const double bound =
                        bd.out[i][(tok * heads + h) * c->d + e] + fb_store_slack(c->dt, x, y);
                    if (fabs((double)x - y) > bound)
                        FAIL("cpu and reference disagree on %s token %lld head %lld elem %lld: "
                             "%.9g vs %.9g (bound %.3g)",
                             tname[i], (long long)tok, (long long)h, (long long)e, (double)x,
                             (double)y, bound);
                }
        }
    }
    if (!c->backward && c->with_lse) {
        const int64_t rows = c->varlen ? c->total_q : c->nq;
        for (int b = 0; b < (c->varlen ? 1 : c->b); b++)
            for (int64_t h = 0; h < c->h; h++)
                for (int64_t i = 0; i < rows; i++) {
                    int sb;
                    int64_t row;
                    const int64_t tok = c->varlen ? i : b * c->nq + i;
                    seq_of(c, tok, 1, &sb, &row);
                    if (row < 0)
                        continue;
                    const int64_t at = lse_at(c, b, h, i);
                    const float x = mine->lse[at], y = ref->lse[at];
                    if (tu_is_poison(mine->lse, at, FLASHPORT_F32))
                        FAIL("cpu left lse[%lld] unwritten", (long long)at);
                    if (c->finite && (isnan(x) || x == INFINITY))
                        FAIL("cpu: lse[%lld] = %g on finite inputs", (long long)at, (double)x);
                    if (c->finite && (x == -INFINITY) != (y == -INFINITY))
                        FAIL("lse[%lld]: cpu %g, reference %g (one sees no key)", (long long)at,
                             (double)x, (double)y);
                    if (!compare || !isfinite(y))
                        continue;
                    const double bound =
                        bd.lse_bound[h * bd.cu_q[c->b] + tok] + fb_store_slack(FLASHPORT_F32, x, y);
                    if (fabs((double)x - y) > bound)
                        FAIL("cpu and reference disagree on lse[%lld]: %.9g vs %.9g (bound %.3g)",
                             (long long)at, (double)x, (double)y, bound);
                }
    }
    if (c->compare)
        bounds_free(&bd);
}

/* ---- decoding ------------------------------------------------------------------------------ */

/* A paged KV cache (forward only, dense, with seqused_k): K and V move into pages of page_size
 * rows, used pages in a shuffled order; the rows of a page past its sequence's used keys and two
 * spare pages hold NaN (never read, so finite inputs must still give finite outputs), and the
 * block table's entries past the used pages are out of range (never read). Now and then a used
 * entry is out of range, which both backends must refuse. Skipped (1, unpaged) where a stride of
 * K or V is invalid or a seqused_k is the refused one; 0 when out of memory. */
static int make_paged(call *c, reader *r)
{
    static const int sizes[4] = {1, 3, 16, 64};
    const int ps = sizes[below(r, 4)];
    const int stride = (c->nk + ps - 1) / ps + (int)below(r, 2) + (c->nk == 0);
    int32_t first[4], npages = 2;
    if (extent(&c->t[T_K]) < 0 || extent(&c->t[T_V]) < 0)
        return 1;
    for (int b = 0; b < c->b; b++) {
        if (c->used[b] > c->nk) /* the refused seqused_k: kept as it is, unpaged */
            return 1;
        first[b] = npages - 2;
        npages += (c->used[b] + ps - 1) / ps;
    }
    first[c->b] = npages - 2;
    int32_t perm[3 * 100 + 2];
    tu_rng rng = tu_rng_seed(word(r));
    for (int i = 0; i < npages; i++)
        perm[i] = i;
    for (int i = npages - 1; i > 0; i--) {
        const int j = (int)(tu_rng_u32(&rng) % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    const int64_t row = (int64_t)c->hkv * c->d;
    for (int i = 0; i < 2; i++) {
        tensor *t = &c->t[T_K + i], pg;
        memset(&pg, 0, sizeof pg);
        pg.rank = 4;
        pg.shape[0] = npages, pg.shape[1] = ps, pg.shape[2] = c->hkv, pg.shape[3] = c->d;
        place(&pg, perms4[0], 0);
        pg.elems = npages * ps * row;
        if (!(pg.buf = malloc((size_t)(pg.elems > 0 ? pg.elems : 1) * 4)))
            return 0;
        for (int64_t x = 0; x < pg.elems; x++)
            fp_store(pg.buf, x, c->dt, NAN);
        for (int b = 0; b < c->b; b++)
            for (int64_t k = 0; k < c->used[b]; k++)
                for (int64_t e = 0; e < row; e++) {
                    const int64_t at = (perm[first[b] + k / ps] * ps + k % ps) * row + e;
                    const int64_t from =
                        offset_of(t, 0, (int64_t)b * c->nk + k, c->nk, e / c->d, e % c->d);
                    fp_store(pg.buf, at, c->dt, fp_load(t->buf, from, c->dt));
                }
        c->kv_dense[i] = *t;
        *t = pg;
    }
    for (int b = 0; b < c->b; b++)
        for (int k = 0; k < stride; k++)
            c->bt[b * stride + k] = k < first[b + 1] - first[b] ? perm[first[b] + k]
                                    : k % 2                     ? -1
                                                                : INT32_MAX - k;
    if (below(r, 8) == 7) { /* a used entry out of range (when there is one) */
        const int b = (int)below(r, (unsigned)c->b), n = first[b + 1] - first[b];
        if (n > 0)
            c->bt[b * stride + (int)below(r, (unsigned)n)] = below(r, 2) ? -1 : npages;
    }
    c->paged = 1;
    c->p.block_table = c->bt;
    c->p.block_table_stride = stride;
    return 1;
}

static int decode(call *c, reader *r)
{
    static const flashport_dtype dts[3] = {FLASHPORT_F32, FLASHPORT_F16, FLASHPORT_BF16};
    static const int dims[8] = {1, 3, 8, 16, 24, 40, 64, 72};
    memset(c, 0, sizeof *c);
    c->dt = dts[below(r, 3)];
    c->backward = (int)below(r, 2);
    c->varlen = below(r, 4) == 0;
    c->with_lse = below(r, 4) != 0;
    c->finite = below(r, 8) != 0;
    c->fault = below(r, 3) == 0 ? (int)byte(r) : 0;
    c->hkv = 1 + (int)below(r, 2);
    c->h = c->hkv * (1 + (int)below(r, 3));
    c->d = dims[below(r, 8)];
    flashport_attention_params_init(&c->p);
    if (c->varlen) {
        c->b = 1 + (int)below(r, 4);
        int maxq = 0, maxk = 0;
        for (int b = 0; b < c->b; b++) {
            const int lq = (int)below(r, 4) == 0 ? 0 : (int)below(r, 90);
            const int lk = (int)below(r, 5) == 0 ? 0 : (int)below(r, 90);
            c->cu_q[b + 1] = c->cu_q[b] + lq;
            c->cu_k[b + 1] = c->cu_k[b] + lk;
            maxq = lq > maxq ? lq : maxq;
            maxk = lk > maxk ? lk : maxk;
        }
        c->total_q = c->cu_q[c->b] + below(r, 3);
        c->total_k = c->cu_k[c->b] + below(r, 3);
        c->nq = maxq + (below(r, 4) == 0 ? (int)below(r, 5) : 0);
        c->nk = maxk + (below(r, 4) == 0 ? (int)below(r, 5) : 0);
        if ((c->fault & 15) == 9) /* a broken offset: not monotone, past the buffer, or cu[0] */
            (c->fault >> 4 & 1 ? c->cu_q : c->cu_k)[below(r, (unsigned)c->b + 1)] +=
                (int32_t)below(r, 200) - 100;
        c->p.cu_seqlens_q = c->cu_q;
        c->p.cu_seqlens_k = c->cu_k;
        c->p.batch = c->b;
        c->p.max_seqlen_q = c->nq;
        c->p.max_seqlen_k = c->nk;
    } else {
        c->b = (int)below(r, 8) == 0 ? 0 : 1 + (int)below(r, 3);
        c->nq = (int)below(r, 100);
        c->nk = (int)below(r, 100);
        c->total_q = (int64_t)c->b * c->nq;
        c->total_k = (int64_t)c->b * c->nk;
    }
    static const float scales[8] = {0.0f, 0.0f, 0.0f, 0.05f, 1.0f, 3.0f, 1e10f, 1e30f};
    c->p.scale = scales[below(r, 8)];
    const unsigned mask = below(r, 6);
    if (mask == 1)
        c->p.causal = 1;
    if (mask >= 2) {
        c->p.window_left = (int)below(r, 70) - 1;
        c->p.window_right = (int)below(r, 70) - 1;
        c->p.causal = mask == 5;
    }
    static const float caps[6] = {0.0f, 0.0f, 0.0f, 1.0f, 30.0f, 1e-20f};
    c->p.softcap = caps[below(r, 6)];
    if (below(r, 4) == 0) {
        for (int h = 0; h < c->h; h++)
            c->slopes[h] = ldexpf((float)below(r, 17) - 8.0f, -(int)below(r, 12));
        if (!c->finite && below(r, 4) == 0)
            c->slopes[below(r, (unsigned)c->h)] = NAN;
        c->p.alibi_slopes = c->slopes;
    }
    c->p.deterministic = (int)below(r, 2);
    /* Scores bounded by 30: a well-conditioned softmax the two backends must agree on. */
    static const float ranges[4] = {0.25f, 1.0f, 2.0f, 8.0f};
    const float range = ranges[below(r, 4)];
    const double scale = c->p.scale > 0.0f ? c->p.scale : 1.0 / sqrt((double)c->d);
    double smax = scale * range * range * c->d;
    if (c->p.softcap > 0.0f && c->p.softcap < smax)
        smax = c->p.softcap;
    for (int h = 0; c->p.alibi_slopes && h < c->h; h++)
        smax += fabs(c->slopes[h]) * 100.0;
    c->compare = c->finite && smax <= 30.0;
    /* The backward recomputes P from an f32 LSE, whose rounding at |score| ~ 1e10 is ~1e3: only
     * the forward is held to finite outputs at such scales. */
    if (c->backward && smax > 1e6)
        c->finite = 0;
    if (!make_tensors(c, r))
        return 0;
    tu_rng rng = tu_rng_seed(word(r));
    for (int i = 0; i < T_N; i++) {
        if (i == T_O || i >= T_DQ)
            continue;
        for (int64_t x = 0; x < c->t[i].elems; x++)
            fp_store(c->t[i].buf, x, c->dt, value(&rng, range, c->finite));
    }
    /* seqused_k, decoded last so that inputs written before it decode as they did (an exhausted
     * input reads 0: off): each sequence's used keys, now and then one past its capacity, which
     * both backends must refuse alike. */
    if (below(r, 4) == 3) {
        for (int b = 0; b < c->b; b++) {
            const int cap = c->varlen ? c->cu_k[b + 1] - c->cu_k[b] : c->nk;
            c->used[b] = cap <= 0 ? 0 : (int32_t)below(r, (unsigned)cap + 1);
        }
        if (c->b > 0 && below(r, 8) == 7) {
            const int b = (int)below(r, (unsigned)c->b);
            c->used[b] = (c->varlen ? c->cu_k[b + 1] - c->cu_k[b] : c->nk) + 1;
        }
        c->p.seqused_k = c->used;
    }
    if (c->p.seqused_k && !c->varlen && !c->backward && c->b > 0 && below(r, 2))
        return make_paged(c, r);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    call c;
    if (!decode(&c, &r)) {
        free_call(&c);
        return 0;
    }
    const void *o_fwd = NULL;
    float *lse_fwd = NULL;
    outs fwd = {{0}, 0};
    if (c.backward) { /* O and LSE from a clean cpu forward of the same inputs */
        call f = c;
        f.backward = 0;
        f.with_lse = 1;
        f.fault = 0;
        if (!outs_make(&f, &fwd, NULL, NULL) || run(&f, "cpu", &fwd) != FLASHPORT_OK) {
            outs_free(&fwd);
            free_call(&c);
            return 0;
        }
        o_fwd = fwd.buf[T_O];
        lse_fwd = fwd.lse;
    }
    outs mine, ref;
    memset(&mine, 0, sizeof mine);
    memset(&ref, 0, sizeof ref);
    if (outs_make(&c, &mine, o_fwd, lse_fwd) && outs_make(&c, &ref, o_fwd, lse_fwd)) {
        const flashport_status s1 = run(&c, "cpu", &mine);
        char m1[1024];
        snprintf(m1, sizeof m1, "%s", flashport_last_error());
        const flashport_status s2 = run(&c, "reference", &ref);
        if (s1 != s2)
            FAIL("cpu returned %s (%s), reference %s (%s)", flashport_status_string(s1), m1,
                 flashport_status_string(s2), flashport_last_error());
        if (s1 != FLASHPORT_OK) {
            check_untouched(&c, &mine, "cpu", s1);
            check_untouched(&c, &ref, "reference", s2);
        } else {
            check_success(&c, &mine, &ref, o_fwd, lse_fwd);
        }
    }
    outs_free(&mine);
    outs_free(&ref);
    outs_free(&fwd);
    free_call(&c);
    return 0;
}
