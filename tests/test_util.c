/*
 * Shared test helpers (see test_util.h). The naive attention here is deliberately the plain
 * float algorithm a careful but unoptimized implementation would use; its error against the
 * double oracle is the yardstick for every backend, so it must not be more clever than that.
 */
#include "tests/test_util.h"

#include "core/dtype.h"
#include "core/mask.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tu_failures = 0;

int tu_check(int cond, const char *file, int line, const char *expr)
{
    if (!cond) {
        tu_failures++;
        fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, expr);
    }
    return cond;
}

int tu_checkf(int cond, const char *file, int line, const char *fmt, ...)
{
    if (!cond) {
        va_list ap;
        tu_failures++;
        fprintf(stderr, "%s:%d: CHECK failed: ", file, line);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
    }
    return cond;
}

int tu_finish(const char *name, const char *pass_fmt, ...)
{
    if (tu_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, tu_failures);
        return 1;
    }
    va_list ap;
    va_start(ap, pass_fmt);
    printf("%s: ", name);
    vprintf(pass_fmt, ap);
    printf("\n");
    va_end(ap);
    return 0;
}

/* ---- RNG ----------------------------------------------------------------------------------- */

tu_rng tu_rng_seed(uint64_t seed)
{
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    tu_rng r = {z ? z : 1};
    return r;
}

uint32_t tu_rng_u32(tu_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 0x2545f4914f6cdd1dull) >> 32);
}

float tu_rng_uniform(tu_rng *r, float lo, float hi)
{
    float u = (float)(tu_rng_u32(r) >> 8) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
}

/* ---- dtypes -------------------------------------------------------------------------------- */

size_t tu_dtype_size(flashport_dtype dtype)
{
    return dtype == FLASHPORT_F32 ? 4 : fp_is_fp8(dtype) ? 1 : 2;
}

double tu_unit_roundoff(flashport_dtype dtype)
{
    switch (dtype) {
    case FLASHPORT_F16:
        return ldexp(1.0, -11);
    case FLASHPORT_BF16:
        return ldexp(1.0, -8);
    case FLASHPORT_FP8_E4M3:
        return ldexp(1.0, -4);
    case FLASHPORT_FP8_E5M2:
        return ldexp(1.0, -3);
    default:
        return ldexp(1.0, -24);
    }
}

int tu_is_unsupported(flashport_status s)
{
    return s == FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM || s == FLASHPORT_ERR_UNSUPPORTED_DTYPE ||
           s == FLASHPORT_ERR_UNSUPPORTED_LAYOUT || s == FLASHPORT_ERR_UNSUPPORTED_FEATURE;
}

float tu_round(float x, flashport_dtype dtype)
{
    switch (dtype) {
    case FLASHPORT_F16:
        return fp_f16_to_f32(fp_f32_to_f16(x));
    case FLASHPORT_BF16:
        return fp_bf16_to_f32(fp_f32_to_bf16(x));
    case FLASHPORT_FP8_E4M3:
        return fp_fp8_to_f32(fp_f32_to_fp8(x, 1), 1);
    case FLASHPORT_FP8_E5M2:
        return fp_fp8_to_f32(fp_f32_to_fp8(x, 0), 0);
    default:
        return x;
    }
}

void tu_to_f32(const void *buf, int64_t n, flashport_dtype dtype, float *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = fp_load(buf, i, dtype);
}

void tu_from_f32(const float *in, int64_t n, flashport_dtype dtype, void *buf)
{
    for (int64_t i = 0; i < n; i++)
        fp_store(buf, i, dtype, in[i]);
}

void tu_fill_uniform(void *buf, int64_t n, flashport_dtype dtype, float lo, float hi, tu_rng *r)
{
    for (int64_t i = 0; i < n; i++)
        fp_store(buf, i, dtype, tu_rng_uniform(r, lo, hi));
}

static const uint32_t poison_f32 = 0x7fc0dead;
static const uint16_t poison_f16 = 0x7e5a;
static const uint16_t poison_bf16 = 0x7fda;
static const uint8_t poison_fp8 = 0x7f; /* NaN in both fp8 formats */

void tu_poison(void *buf, int64_t n, flashport_dtype dtype)
{
    for (int64_t i = 0; i < n; i++) {
        if (fp_is_fp8(dtype))
            ((uint8_t *)buf)[i] = poison_fp8;
        else if (dtype == FLASHPORT_F32)
            ((uint32_t *)buf)[i] = poison_f32;
        else
            ((uint16_t *)buf)[i] = dtype == FLASHPORT_F16 ? poison_f16 : poison_bf16;
    }
}

int tu_is_poison(const void *buf, int64_t i, flashport_dtype dtype)
{
    if (fp_is_fp8(dtype))
        return ((const uint8_t *)buf)[i] == poison_fp8;
    if (dtype == FLASHPORT_F32)
        return ((const uint32_t *)buf)[i] == poison_f32;
    return ((const uint16_t *)buf)[i] == (dtype == FLASHPORT_F16 ? poison_f16 : poison_bf16);
}

/* ---- errors and tolerances ----------------------------------------------------------------- */

tu_err tu_error(const float *x, const float *ref, int64_t n)
{
    tu_err e = {0.0, 0.0, 0.0};
    double diff2 = 0.0, ref2 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double a = x[i], b = ref[i];
        if (!isfinite(b)) {
            if (a != b) /* also catches NaN */
                e.max_abs = e.rel_l2 = INFINITY;
            continue;
        }
        double d = fabs(a - b); /* NaN or inf in x: d is NaN or inf */
        if (!(d <= e.max_abs))
            e.max_abs = isnan(d) ? INFINITY : d;
        diff2 += isfinite(d) ? d * d : INFINITY;
        ref2 += b * b;
        if (fabs(b) > e.ref_max)
            e.ref_max = fabs(b);
    }
    if (e.rel_l2 != INFINITY)
        e.rel_l2 = ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    return e;
}

tu_tol tu_tolerance(tu_err naive, double roundoff)
{
    tu_tol t;
    /* An all-zero reference (e.g. dQ when every row sees one key) gets an absolute floor, as
     * rel_l2 does (tu_error): rounding noise of order roundoff must not fail it. */
    t.max_abs = TU_TOL_FACTOR * naive.max_abs +
                2.0 * roundoff * (naive.ref_max > 0.0 ? naive.ref_max : 1.0);
    t.rel_l2 = TU_TOL_FACTOR * naive.rel_l2 + 2.0 * roundoff;
    return t;
}

tu_tol tu_tolerance_fp8(tu_err naive, double roundoff, double pv_bound)
{
    tu_tol t = tu_tolerance(naive, roundoff);
    t.max_abs += TU_FP8_P_ALLOWANCE * pv_bound;
    t.rel_l2 += TU_FP8_P_ALLOWANCE;
    return t;
}

int tu_within(tu_err e, tu_tol t)
{
    return e.max_abs <= t.max_abs && e.rel_l2 <= t.rel_l2;
}

/* ---- strided views ------------------------------------------------------------------------- */

int64_t tu_view_extent(const tu_view *v)
{
    int64_t last = v->offset;
    int64_t ext[4] = {v->nb, v->n, v->heads, v->dim};
    for (int i = 0; i < 4; i++) {
        if (ext[i] == 0)
            return v->offset;
        last += (ext[i] - 1) * v->stride[i];
    }
    return last + 1;
}

flashport_tensor tu_view_tensor(const tu_view *v, void *base, flashport_dtype dtype)
{
    flashport_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (char *)base + v->offset * (int64_t)tu_dtype_size(dtype);
    t.dtype = dtype;
    if (v->varlen) {
        int64_t shape[3] = {v->n, v->heads, v->dim};
        t.rank = 3;
        for (int i = 0; i < 3; i++) {
            t.shape[i] = shape[i];
            t.stride[i] = v->stride[i + 1];
        }
    } else {
        int64_t shape[4] = {v->nb, v->n, v->heads, v->dim};
        t.rank = 4;
        for (int i = 0; i < 4; i++) {
            t.shape[i] = shape[i];
            t.stride[i] = v->stride[i];
        }
    }
    return t;
}

/* Runs BODY for every element of the view, with OFF its buffer offset and IDX its logical index. */
#define TU_FOR_EACH_ELEMENT(v, OFF, IDX, BODY)                                                     \
    do {                                                                                           \
        int64_t IDX = 0;                                                                           \
        for (int64_t b_ = 0; b_ < (v)->nb; b_++)                                                   \
            for (int64_t t_ = 0; t_ < (v)->n; t_++)                                                \
                for (int64_t h_ = 0; h_ < (v)->heads; h_++)                                        \
                    for (int64_t d_ = 0; d_ < (v)->dim; d_++, IDX++) {                             \
                        int64_t OFF = (v)->offset + b_ * (v)->stride[0] + t_ * (v)->stride[1] +    \
                                      h_ * (v)->stride[2] + d_ * (v)->stride[3];                   \
                        BODY;                                                                      \
                    }                                                                              \
    } while (0)

void tu_scatter(const tu_view *v, const float *logical, void *buf, flashport_dtype dtype)
{
    TU_FOR_EACH_ELEMENT(v, off, idx, fp_store(buf, off, dtype, logical[idx]));
}

void tu_gather(const tu_view *v, const void *buf, flashport_dtype dtype, float *logical)
{
    TU_FOR_EACH_ELEMENT(v, off, idx, logical[idx] = fp_load(buf, off, dtype));
}

void tu_view_mark(const tu_view *v, uint8_t *covered)
{
    TU_FOR_EACH_ELEMENT(v, off, idx, (void)idx; covered[off] = 1);
}

/* ---- naive same-precision attention -------------------------------------------------------- */

static float dot_f(const float *a, const float *b, int64_t n)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static float descale_or_1(float x)
{
    return x > 0.0f ? x : 1.0f;
}

/* The score of (i, j) of one sequence as a float kernel computes it; *capped gets the softcapped
 * score before ALiBi. -INFINITY when masked. */
static float naive_score(const tu_problem *p, int64_t h, int64_t i, int64_t j, int64_t nq,
                         int64_t nk, const float *qrow, const float *krow, float *capped)
{
    if (!fp_mask_visible(i, j, nq, nk, p->window_left, p->window_right))
        return -INFINITY;
    const int fp8 = fp_is_fp8(p->dtype);
    const float scale =
        fp8 ? p->scale * descale_or_1(p->descale_q) * descale_or_1(p->descale_k) : p->scale;
    float s = scale * dot_f(qrow, krow, p->head_dim);
    *capped = fp_score_transform(s, p->softcap, 0.0f, 0.0f);
    float slope = p->alibi ? p->alibi[h] : 0.0f;
    return *capped - slope * fp_alibi_distance(i, j, nq, nk);
}

/* The most keys of one sequence, at least 1: the size of the per-row scratch. */
static int64_t max_keys(const tu_problem *p)
{
    int64_t nk_max = 1;
    for (int64_t b = 0; b < p->batch; b++)
        if (p->cu_k[b + 1] - p->cu_k[b] > nk_max)
            nk_max = p->cu_k[b + 1] - p->cu_k[b];
    return nk_max;
}

int tu_naive_forward(const tu_problem *p, float *o, float *lse)
{
    const int64_t D = p->head_dim, H = p->heads, Hkv = p->kv_heads, group = H / Hkv;
    const int64_t total_q = p->cu_q[p->batch];
    const int64_t nk_max = max_keys(p);
    float *s = malloc((size_t)nk_max * sizeof(float));
    float *acc = malloc((size_t)D * sizeof(float));
    if (!s || !acc) {
        free(s);
        free(acc);
        return -1;
    }
    const int fp8 = fp_is_fp8(p->dtype);
    const flashport_dtype odt = fp8 ? p->o_dtype : p->dtype;
    const float dv = fp8 ? descale_or_1(p->descale_v) : 1.0f;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t q0 = p->cu_q[b], nq = p->cu_q[b + 1] - q0;
        int64_t k0 = p->cu_k[b], nk = p->used_k ? p->used_k[b] : p->cu_k[b + 1] - k0;
        for (int64_t h = 0; h < H; h++) {
            int64_t kvh = h / group;
            for (int64_t i = 0; i < nq; i++) {
                const float *qrow = p->q + ((q0 + i) * H + h) * D;
                float m = -INFINITY, capped, l = 0.0f;
                for (int64_t j = 0; j < nk; j++) {
                    const float *krow = p->k + ((k0 + j) * Hkv + kvh) * D;
                    s[j] = naive_score(p, h, i, j, nq, nk, qrow, krow, &capped);
                    m = s[j] > m ? s[j] : m;
                }
                for (int64_t d = 0; d < D; d++)
                    acc[d] = 0.0f;
                for (int64_t j = 0; m > -INFINITY && j < nk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    float w = expf(s[j] - m);
                    /* P enters P V in the storage dtype; fp8: always e4m3 */
                    float wr = tu_round(w, fp8 ? FLASHPORT_FP8_E4M3 : p->dtype);
                    const float *vrow = p->v + ((k0 + j) * Hkv + kvh) * D;
                    l += w;
                    for (int64_t d = 0; d < D; d++)
                        acc[d] += wr * vrow[d];
                }
                float *orow = o + ((q0 + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++)
                    orow[d] = tu_round(l > 0.0f ? acc[d] * dv / l : 0.0f, odt);
                lse[h * total_q + q0 + i] = l > 0.0f ? m + logf(l) : -INFINITY;
            }
        }
    }
    free(s);
    free(acc);
    return 0;
}

int tu_naive_backward(const tu_problem *p, const float *o, const float *lse, const float *dout,
                      float *dq, float *dk, float *dv)
{
    const int64_t D = p->head_dim, H = p->heads, Hkv = p->kv_heads, group = H / Hkv;
    const int64_t total_q = p->cu_q[p->batch];
    const int64_t nk_max = max_keys(p);
    float *dk_acc = malloc((size_t)(nk_max * D) * sizeof(float));
    float *dv_acc = malloc((size_t)(nk_max * D) * sizeof(float));
    float *dq_acc = malloc((size_t)D * sizeof(float));
    if (!dk_acc || !dv_acc || !dq_acc) {
        free(dk_acc);
        free(dv_acc);
        free(dq_acc);
        return -1;
    }
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t q0 = p->cu_q[b], nq = p->cu_q[b + 1] - q0;
        /* Keys past used_k get no gradient: their dK and dV rows are zeros. */
        int64_t k0 = p->cu_k[b], cap = p->cu_k[b + 1] - k0, nk = p->used_k ? p->used_k[b] : cap;
        for (int64_t kvh = 0; kvh < Hkv; kvh++) {
            memset(dk_acc, 0, (size_t)(cap * D) * sizeof(float));
            memset(dv_acc, 0, (size_t)(cap * D) * sizeof(float));
            for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int64_t i = 0; i < nq; i++) {
                    int64_t row = (q0 + i) * H + h;
                    const float *qrow = p->q + row * D, *dorow = dout + row * D;
                    float delta = dot_f(dorow, o + row * D, D);
                    float row_lse = lse[h * total_q + q0 + i];
                    memset(dq_acc, 0, (size_t)D * sizeof(float));
                    for (int64_t j = 0; row_lse > -INFINITY && j < nk; j++) {
                        const float *krow = p->k + ((k0 + j) * Hkv + kvh) * D;
                        const float *vrow = p->v + ((k0 + j) * Hkv + kvh) * D;
                        float capped, t = naive_score(p, h, i, j, nq, nk, qrow, krow, &capped);
                        if (t == -INFINITY)
                            continue;
                        float pij = expf(t - row_lse);
                        float ds = pij * (dot_f(dorow, vrow, D) - delta) *
                                   fp_softcap_grad(capped, p->softcap);
                        /* P and dS enter their matrix products in the storage dtype */
                        float pr = tu_round(pij, p->dtype), dsr = tu_round(ds, p->dtype);
                        for (int64_t d = 0; d < D; d++) {
                            dq_acc[d] += dsr * krow[d];
                            dk_acc[j * D + d] += dsr * qrow[d];
                            dv_acc[j * D + d] += pr * dorow[d];
                        }
                    }
                    for (int64_t d = 0; d < D; d++)
                        dq[row * D + d] = tu_round(p->scale * dq_acc[d], p->dtype);
                }
            }
            for (int64_t j = 0; j < cap; j++)
                for (int64_t d = 0; d < D; d++) {
                    int64_t x = ((k0 + j) * Hkv + kvh) * D + d;
                    dk[x] = tu_round(p->scale * dk_acc[j * D + d], p->dtype);
                    dv[x] = tu_round(dv_acc[j * D + d], p->dtype);
                }
        }
    }
    free(dk_acc);
    free(dv_acc);
    free(dq_acc);
    return 0;
}

/* ---- files -------------------------------------------------------------------------------- */

int tu_copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    int ok = in && out;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        ok = 0;
    return ok ? 0 : -1;
}
