/*
 * The oracle checked against things simpler than itself:
 *   - forward vs attention written out from docs/semantics.md in this file (double, full-row
 *     softmax, the window and ALiBi formulas typed in directly), on tiny problems covering GQA,
 *     causal with Nq > Nk, windows, softcap, ALiBi, varlen with empty sequences, f16 storage,
 *     strided layouts, rows that see no key (O must be exactly 0, LSE -inf);
 *   - backward vs central finite differences (Richardson-extrapolated) of L = sum(dO * O),
 *     with L evaluated through the reference forward, for every element of q, k and v;
 *   - the float score helpers of core/mask.h vs the double formulas the oracle uses;
 *   - the fp8 forward (docs/semantics.md, "fp8") vs the formula with P rounded to e4m3 by a
 *     nearest-value search over the e4m3 codes written here, and shown to differ from the formula
 *     without that rounding (so the rounding is checked, not only tolerated); the CPU flash
 *     forward against the oracle where it rounds against the final maximum too (one key block),
 *     to o's precision; fp_round_e4m3 (core/dtype.h) against fp_f32_to_fp8 and back, and
 *     fp_fp8_to_f32_vec against fp_fp8_to_f32 on every code.
 * fp_reference_forward/backward are called directly with fp_problem filled in here.
 */
#include "backends/cpu/cpu_internal.h"
#include "core/dtype.h"
#include "core/mask.h"
#include "tests/cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A case staged in host buffers for a direct call. */
typedef struct host_case {
    tc_case c;
    tc_data d;
    tc_plan plan;
    void *buf[TC_TENSORS];
    float *lse; /* contiguous, tc_lse_tensor order */
    fp_problem p;
} host_case;

/* q, k, v in the case's dtype; o, dout and the gradients in o's (they differ for fp8 only). */
static flashport_dtype dtype_of(const host_case *hc, int t)
{
    return t <= TC_V ? hc->c.dtype : tc_out_dtype(&hc->c);
}

static fp_tensor_view view_of(const host_case *hc, int t)
{
    const tu_view *v = &hc->plan.view[t];
    fp_tensor_view fv;
    fv.data =
        (char *)hc->buf[hc->plan.buffer[t]] + v->offset * (int64_t)tu_dtype_size(dtype_of(hc, t));
    for (int i = 0; i < 4; i++)
        fv.stride[i] = v->stride[i];
    if (v->varlen)
        fv.stride[FP_B] = 0;
    return fv;
}

static void host_case_free(host_case *hc)
{
    for (int b = 0; b < TC_TENSORS; b++)
        free(hc->buf[b]);
    free(hc->lse);
    tc_data_free(&hc->d);
}

/* Stages case c (inputs from table-style generation with `seed`) in `layout`; outputs poisoned. */
static int host_case_make(host_case *hc, const tc_case *c, int seed)
{
    memset(hc, 0, sizeof *hc);
    hc->c = *c;
    if (tc_data_make(c, seed, &hc->d) != 0 || tc_plan_make(c, &hc->d, c->layout, &hc->plan) != 0)
        return -1;
    const tc_data *d = &hc->d;
    const float *inputs[TC_TENSORS] = {d->q, d->k, d->v, NULL, d->dout, NULL, NULL, NULL};
    flashport_dtype bdtype[TC_TENSORS] = {FLASHPORT_F32};
    for (int t = TC_TENSORS - 1; t >= 0; t--) /* a buffer holds tensors of one dtype */
        bdtype[hc->plan.buffer[t]] = dtype_of(hc, t);
    for (int b = 0; b < hc->plan.buffers; b++) {
        hc->buf[b] = malloc((size_t)hc->plan.buffer_elems[b] * tu_dtype_size(bdtype[b]));
        if (!hc->buf[b])
            return -1;
        tu_poison(hc->buf[b], hc->plan.buffer_elems[b], bdtype[b]);
    }
    for (int t = 0; t < TC_TENSORS; t++)
        if (inputs[t])
            tu_scatter(&hc->plan.view[t], inputs[t], hc->buf[hc->plan.buffer[t]], dtype_of(hc, t));
    hc->lse = malloc((size_t)tc_lse_elems(d) * sizeof(float));
    if (!hc->lse)
        return -1;
    tu_poison(hc->lse, tc_lse_elems(d), FLASHPORT_F32);

    fp_problem *p = &hc->p;
    p->dtype = c->dtype;
    p->o_dtype = tc_out_dtype(c);
    p->batch = c->batch;
    p->seqlen_q = c->varlen ? d->max_q : c->seqlen_q;
    p->seqlen_k = c->varlen ? d->max_k : c->seqlen_k;
    p->heads = c->heads;
    p->kv_heads = c->kv_heads;
    p->head_dim = c->head_dim;
    p->total_q = d->total_q;
    p->total_k = d->total_k;
    p->scale = d->prob.scale;
    p->softcap = c->softcap;
    p->window_left = d->prob.window_left;
    p->window_right = d->prob.window_right;
    p->alibi_slopes = d->alibi;
    p->varlen = c->varlen;
    p->cu_seqlens_q = c->varlen ? d->cu_q : NULL;
    p->cu_seqlens_k = c->varlen ? d->cu_k : NULL;
    p->descale_q = c->descale[0] > 0.0f ? c->descale[0] : 1.0f; /* as the core resolves them */
    p->descale_k = c->descale[1] > 0.0f ? c->descale[1] : 1.0f;
    p->descale_v = c->descale[2] > 0.0f ? c->descale[2] : 1.0f;
    p->q = view_of(hc, TC_Q);
    p->k = view_of(hc, TC_K);
    p->v = view_of(hc, TC_V);
    p->o = view_of(hc, TC_O);
    p->dout = view_of(hc, TC_DOUT);
    p->dq = view_of(hc, TC_DQ);
    p->dk = view_of(hc, TC_DK);
    p->dv = view_of(hc, TC_DV);
    p->lse.data = hc->lse;
    p->lse.stride[0] = c->varlen ? 0 : (int64_t)c->heads * c->seqlen_q;
    p->lse.stride[1] = c->varlen ? d->total_q : c->seqlen_q;
    p->lse.stride[2] = 1;
    return 0;
}

/* ---- forward vs the formula -------------------------------------------------------------- */

/* The e4m3 value nearest x >= 0, ties to the even code, by a search over the codes as the OCP
 * format defines them: code e << 3 | m is m 2^-9 (e = 0) or (1 + m / 8) 2^(e - 7); 0x7f is NaN. */
static double nearest_e4m3(double x)
{
    double best = 0.0, best_err = INFINITY;
    int best_code = 0;
    for (int code = 0; code < 0x7f; code++) {
        const int e = code >> 3, m = code & 7;
        const double v = e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
        const double err = fabs(v - x);
        if (err < best_err || (err == best_err && code % 2 == 0 && best_code % 2 != 0)) {
            best = v;
            best_err = err;
            best_code = code;
        }
    }
    return best;
}

/* Attention from docs/semantics.md, in double, over logical [tokens, heads, D] arrays; Nk <= 64.
 * fp8 cases: descales applied, and each P rounded to e4m3 when round_p (the semantics) or left
 * unrounded (what the rounding must visibly change). */
static void formula_p(const tc_case *c, const tc_data *d, int round_p, double *o, double *lse)
{
    const int64_t H = c->heads, Hkv = c->kv_heads, D = c->head_dim;
    const int fp8 = tc_fp8(c);
    const double dsq = fp8 && c->descale[0] > 0.0f ? c->descale[0] : 1.0;
    const double dsk = fp8 && c->descale[1] > 0.0f ? c->descale[1] : 1.0;
    const double dsv = fp8 && c->descale[2] > 0.0f ? c->descale[2] : 1.0;
    /* The scale is an f32 parameter of the API; its default is 1/sqrt(D) rounded to f32. */
    const double scale = (c->scale > 0.0f ? c->scale : 1.0f / sqrtf((float)D)) * dsq * dsk;
    for (int64_t b = 0; b < c->batch; b++) {
        int64_t q0 = d->cu_q[b], nq = d->cu_q[b + 1] - q0;
        int64_t k0 = d->cu_k[b], nk = d->cu_k[b + 1] - k0;
        for (int64_t h = 0; h < H; h++) {
            int64_t kvh = h / (H / Hkv);
            for (int64_t i = 0; i < nq; i++) {
                double s[64], m = -INFINITY, l = 0.0;
                int visible[64];
                for (int64_t j = 0; j < nk; j++) {
                    int64_t shift = i + nk - nq;
                    int64_t left = c->window ? c->window_left : -1;
                    int64_t right = c->causal ? 0 : c->window ? c->window_right : -1;
                    visible[j] =
                        (left < 0 || j >= shift - left) && (right < 0 || j <= shift + right);
                    double dot = 0.0;
                    for (int64_t x = 0; x < D; x++)
                        dot += (double)d->q[((q0 + i) * H + h) * D + x] *
                               d->k[((k0 + j) * Hkv + kvh) * D + x];
                    s[j] = scale * dot;
                    if (c->softcap > 0.0f)
                        s[j] = c->softcap * tanh(s[j] / c->softcap);
                    if (c->alibi)
                        s[j] -= d->alibi[h] * fabs((double)(shift - j));
                    if (visible[j] && s[j] > m)
                        m = s[j];
                }
                double *orow = o + ((q0 + i) * H + h) * D;
                for (int64_t x = 0; x < D; x++)
                    orow[x] = 0.0;
                for (int64_t j = 0; j < nk; j++) {
                    if (!visible[j])
                        continue;
                    double w = exp(s[j] - m);
                    l += w;
                    if (fp8 && round_p)
                        w = nearest_e4m3(w);
                    for (int64_t x = 0; x < D; x++)
                        orow[x] += w * d->v[((k0 + j) * Hkv + kvh) * D + x];
                }
                for (int64_t x = 0; l > 0.0 && x < D; x++)
                    orow[x] = orow[x] * dsv / l;
                lse[h * d->total_q + q0 + i] = l > 0.0 ? m + log(l) : -INFINITY;
            }
        }
    }
}

static void formula(const tc_case *c, const tc_data *d, double *o, double *lse)
{
    formula_p(c, d, 1, o, lse);
}

static void check_forward(const tc_case *c, int seed, int with_lse)
{
    char name[200];
    tc_case_name(c, name, sizeof name);
    host_case hc;
    if (!CHECK(host_case_make(&hc, c, seed) == 0)) {
        host_case_free(&hc);
        return;
    }
    const tc_data *d = &hc.d;
    int64_t no = d->total_q * c->heads * c->head_dim, nl = tc_lse_elems(d);
    double *o_ref = malloc((size_t)no * sizeof(double)),
           *lse_ref = malloc((size_t)nl * sizeof(double));
    float *o = malloc((size_t)no * sizeof(float)), *lse = malloc((size_t)nl * sizeof(float));
    if (!CHECK(o_ref && lse_ref && o && lse) || !CHECK(d->max_k <= 64))
        goto out;
    formula(c, d, o_ref, lse_ref);
    if (!with_lse)
        hc.p.lse.data = NULL;
    if (!CHECK_MSG(fp_reference_forward(&hc.p) == FLASHPORT_OK, "%s: forward failed", name))
        goto out;
    tu_gather(&hc.plan.view[TC_O], hc.buf[hc.plan.buffer[TC_O]], tc_out_dtype(c), o);
    tc_lse_to_logical(c, d, hc.lse, lse);

    /* One rounding of the true value to the storage dtype (and f32 for the LSE). */
    const flashport_dtype odt = tc_out_dtype(c);
    double u = tu_unit_roundoff(odt), worst = 0.0;
    double floor = odt == FLASHPORT_F16 ? ldexp(1.0, -25) : 1e-12; /* f16 subnormals */
    for (int64_t x = 0; x < no; x++) {
        double err = fabs(o[x] - o_ref[x]);
        worst = err > worst ? err : worst;
        CHECK_MSG(err <= 1.01 * u * fabs(o_ref[x]) + floor, "%s: O[%lld] = %.9g, formula %.9g",
                  name, (long long)x, o[x], o_ref[x]);
    }
    int64_t masked = 0;
    for (int64_t x = 0; with_lse && x < nl; x++) {
        if (lse_ref[x] == -INFINITY) {
            masked++;
            CHECK_MSG(lse[x] == -INFINITY, "%s: LSE[%lld] = %g for a row that sees nothing", name,
                      (long long)x, lse[x]);
        } else {
            CHECK_MSG(fabs(lse[x] - lse_ref[x]) <= 1e-6 * (1.0 + fabs(lse_ref[x])),
                      "%s: LSE[%lld] = %.9g, formula %.9g", name, (long long)x, lse[x], lse_ref[x]);
        }
    }
    if (!with_lse)
        CHECK_MSG(tu_is_poison(hc.lse, 0, FLASHPORT_F32), "%s: LSE written though absent", name);
    if (tc_fp8(c)) {
        /* Without P's rounding the result must be far from O: its relative L2 distance well
         * above the one rounding to o's dtype that the check above allows. */
        double diff2 = 0.0, ref2 = 0.0;
        formula_p(c, d, 0, o_ref, lse_ref);
        for (int64_t x = 0; x < no; x++) {
            diff2 += (o[x] - o_ref[x]) * (o[x] - o_ref[x]);
            ref2 += o_ref[x] * o_ref[x];
        }
        CHECK_MSG(sqrt(diff2) > 4.0 * u * sqrt(ref2),
                  "%s: O is within %.2e (relative L2) of unrounded P: P's rounding not seen", name,
                  sqrt(diff2 / ref2));
    }
    printf("forward  %-58s max |O - formula| %.2e, %lld masked rows%s\n", name, worst,
           (long long)masked, with_lse ? "" : ", no LSE");
out:
    free(o_ref);
    free(lse_ref);
    free(o);
    free(lse);
    host_case_free(&hc);
}

/* ---- backward vs finite differences ------------------------------------------------------ */

/* L = sum dO * O over the logical output, O from the reference forward of the staged inputs. */
static double loss(host_case *hc)
{
    const tc_data *d = &hc->d;
    if (fp_reference_forward(&hc->p) != FLASHPORT_OK)
        return NAN;
    int64_t n = d->total_q * hc->c.heads * hc->c.head_dim;
    float *o = malloc((size_t)n * sizeof(float));
    if (!o)
        return NAN;
    tu_gather(&hc->plan.view[TC_O], hc->buf[hc->plan.buffer[TC_O]], hc->c.dtype, o);
    double l = 0.0;
    for (int64_t x = 0; x < n; x++)
        l += (double)d->dout[x] * o[x];
    free(o);
    return l;
}

/* dL/dx for element x of tensor t by central differences at steps h and h/2, extrapolated. Steps
 * are powers of two so x +- h is exact in f32 for |x| < 2^16. */
static double numeric_grad(host_case *hc, int t, int64_t x)
{
    const tu_view *v = &hc->plan.view[t];
    int64_t per_token = v->heads * v->dim;
    int64_t tok = x / per_token, h = x % per_token / v->dim, dd = x % v->dim;
    int64_t b = v->varlen ? 0 : tok / v->n, s = v->varlen ? tok : tok % v->n;
    int64_t off =
        v->offset + b * v->stride[0] + s * v->stride[1] + h * v->stride[2] + dd * v->stride[3];
    float *elem = (float *)hc->buf[hc->plan.buffer[t]] + off;
    const float x0 = *elem, step = 1.0f / 64.0f;
    double diff[2];
    for (int k = 0; k < 2; k++) {
        float hk = k ? step / 2 : step;
        *elem = x0 + hk;
        double lp = loss(hc);
        *elem = x0 - hk;
        double lm = loss(hc);
        diff[k] = (lp - lm) / (2.0 * hk);
    }
    *elem = x0;
    return (4.0 * diff[1] - diff[0]) / 3.0;
}

static void check_backward(const tc_case *c, int seed)
{
    char name[200];
    tc_case_name(c, name, sizeof name);
    host_case hc;
    float *grad = NULL;
    if (!CHECK(host_case_make(&hc, c, seed) == 0) ||
        !CHECK(c->dtype == FLASHPORT_F32 && c->layout == TC_CONTIGUOUS))
        goto out;
    if (!CHECK(fp_reference_forward(&hc.p) == FLASHPORT_OK) ||
        !CHECK(fp_reference_backward(&hc.p) == FLASHPORT_OK))
        goto out;
    static const int tensors[3] = {TC_DQ, TC_DK, TC_DV}, inputs[3] = {TC_Q, TC_K, TC_V};
    static const char *names[3] = {"dQ", "dK", "dV"};
    double worst = 0.0;
    for (int g = 0; g < 3; g++) {
        const tu_view *v = &hc.plan.view[tensors[g]];
        int64_t n = v->nb * v->n * v->heads * v->dim;
        grad = malloc((size_t)n * sizeof(float));
        if (!CHECK(grad != NULL))
            goto out;
        tu_gather(v, hc.buf[hc.plan.buffer[tensors[g]]], c->dtype, grad);
        double gmax = 0.0;
        for (int64_t x = 0; x < n; x++)
            gmax = fabs(grad[x]) > gmax ? fabs(grad[x]) : gmax;
        for (int64_t x = 0; x < n; x++) {
            double num = numeric_grad(&hc, inputs[g], x);
            double err = fabs(num - grad[x]);
            worst = err / (gmax + 1e-30) > worst ? err / (gmax + 1e-30) : worst;
            CHECK_MSG(err <= 3e-4 * gmax + 1e-5, "%s: %s[%lld] = %.7g, finite difference %.7g",
                      name, names[g], (long long)x, grad[x], num);
        }
        free(grad);
        grad = NULL;
    }
    printf("backward %-58s max |grad - finite diff| / max |grad| %.2e\n", name, worst);
out:
    free(grad);
    host_case_free(&hc);
}

/* Rows that see no key get dQ = 0, keys no row sees get dK = dV = 0, and every gradient element
 * is written (the outputs start poisoned). */
static void check_backward_masked(const tc_case *c, int seed)
{
    char name[200];
    tc_case_name(c, name, sizeof name);
    host_case hc;
    if (!CHECK(host_case_make(&hc, c, seed) == 0) ||
        !CHECK(fp_reference_forward(&hc.p) == FLASHPORT_OK) ||
        !CHECK(fp_reference_backward(&hc.p) == FLASHPORT_OK)) {
        host_case_free(&hc);
        return;
    }
    const tc_data *d = &hc.d;
    const int64_t H = c->heads, Hkv = c->kv_heads, D = c->head_dim;
    int64_t nq = d->total_q * H * D, nk = d->total_k * Hkv * D;
    float *dq = malloc((size_t)nq * sizeof(float)), *dk = malloc((size_t)nk * sizeof(float));
    float *dv = malloc((size_t)nk * sizeof(float)), *lse = malloc((size_t)tc_lse_elems(d) * 4);
    int64_t zero_rows = 0, zero_keys = 0;
    if (!CHECK(dq && dk && dv && lse))
        goto out;
    tu_gather(&hc.plan.view[TC_DQ], hc.buf[hc.plan.buffer[TC_DQ]], c->dtype, dq);
    tu_gather(&hc.plan.view[TC_DK], hc.buf[hc.plan.buffer[TC_DK]], c->dtype, dk);
    tu_gather(&hc.plan.view[TC_DV], hc.buf[hc.plan.buffer[TC_DV]], c->dtype, dv);
    tc_lse_to_logical(c, d, hc.lse, lse);
    for (int64_t x = 0; x < nq; x++)
        CHECK_MSG(isfinite(dq[x]), "%s: dQ[%lld] not finite", name, (long long)x);
    for (int64_t x = 0; x < nk; x++)
        CHECK_MSG(isfinite(dk[x]) && isfinite(dv[x]), "%s: dK/dV[%lld] not finite", name,
                  (long long)x);
    for (int64_t b = 0; b < c->batch; b++) {
        int64_t q0 = d->cu_q[b], sq = d->cu_q[b + 1] - q0;
        int64_t k0 = d->cu_k[b], sk = d->cu_k[b + 1] - k0;
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < sq; i++) {
                if (lse[h * d->total_q + q0 + i] != -INFINITY)
                    continue;
                zero_rows++;
                for (int64_t x = 0; x < D; x++)
                    CHECK_MSG(dq[((q0 + i) * H + h) * D + x] == 0.0f,
                              "%s: dQ of a row that sees nothing is not 0", name);
            }
        for (int64_t j = 0; j < sk; j++) {
            int seen = 0;
            for (int64_t i = 0; i < sq && !seen; i++)
                seen = fp_mask_visible(i, j, sq, sk, d->prob.window_left, d->prob.window_right);
            if (seen)
                continue;
            zero_keys++;
            for (int64_t x = 0; x < Hkv * D; x++)
                CHECK_MSG(dk[(k0 + j) * Hkv * D + x] == 0.0f && dv[(k0 + j) * Hkv * D + x] == 0.0f,
                          "%s: dK/dV of a key no row sees is not 0", name);
        }
    }
    CHECK_MSG(zero_rows + zero_keys > 0, "%s: meant to have unseen rows or keys", name);
    printf("masked   %-58s %lld rows and %lld keys without partner: zero gradients\n", name,
           (long long)zero_rows, (long long)zero_keys);
out:
    free(dq);
    free(dk);
    free(dv);
    free(lse);
    host_case_free(&hc);
}

/* The oracle evaluates softcap in double; the kernels' float helpers must agree with it. */
static void check_score_helpers(void)
{
    static const float caps[] = {0.0f, 0.5f, 2.0f, 30.0f};
    tu_rng r = tu_rng_seed(3);
    for (int t = 0; t < 4000; t++) {
        float c = caps[t % 4], s = tu_rng_uniform(&r, -40.0f, 40.0f);
        float slope = tu_rng_uniform(&r, 0.0f, 1.0f), dist = (float)(tu_rng_u32(&r) % 2000);
        double capped = c > 0.0f ? c * tanh((double)s / c) : s;
        double want = capped - (double)slope * dist;
        float got = fp_score_transform(s, c, slope, dist);
        CHECK_MSG(fabs(got - want) <= 4e-7 * (fabs(capped) + slope * dist) + 1e-30,
                  "fp_score_transform(%g, cap %g, slope %g, dist %g) = %.9g, want %.9g", s, c,
                  slope, dist, got, want);
        double grad = c > 0.0f ? 1.0 - tanh((double)s / c) * tanh((double)s / c) : 1.0;
        float ggot = fp_softcap_grad((float)capped, c);
        CHECK_MSG(fabs(ggot - grad) <= 1e-6, "fp_softcap_grad(cap %g, s %g) = %.9g, want %.9g", c,
                  s, ggot, grad);
    }
}

static const tc_case forward_cases[] = {
    {DENSE(F32, 2, 4, 2, 5, 7, 8)},
    {DENSE(F32, 1, 2, 1, 9, 4, 3), .causal = 1, .alibi = 1}, /* rows 0..4 see nothing */
    {VARLEN(F32, 3, 2, 2, 5), WINDOW(1, 1), .softcap = 1.5f, .seqlens_q = {3, 0, 4},
     .seqlens_k = {0, 2, 6}},
    {DENSE(F16, 1, 3, 1, 6, 6, 16), WINDOW(2, 0), .softcap = 3.0f, .alibi = 1,
     .layout = TC_HEAD_MAJOR},
    {DENSE(BF16, 2, 2, 2, 7, 5, 9), .causal = 1, .layout = TC_DIM_STRIDED},
    {DENSE(F32, 1, 8, 1, 4, 4, 4), .scale = 3.0f, .range = 3.0f, .layout = TC_PACKED_QKV},
    {DENSE(F32, 1, 2, 2, 6, 8, 4), WINDOW(0, 0)},
    {DENSE(F32, 1, 1, 1, 1, 1, 1)},
};

/* fp8 forward cases: Nk <= 64 (formula's limit and one CPU key block), o in f16 for the
 * tightest comparison, bf16 once. */
#define FP8(dt, odt, B, H, HKV, NQ, NK, D)                                                         \
    DENSE(dt, B, H, HKV, NQ, NK, D), .odtype = FLASHPORT_##odt
static const tc_case fp8_cases[] = {
    {FP8(FP8_E4M3, F16, 2, 4, 2, 9, 40, 16), .descale = {0.5f, 4.0f, 0.25f}},
    {FP8(FP8_E5M2, F16, 1, 2, 1, 7, 33, 8), .causal = 1, .softcap = 3.0f, .alibi = 1,
     .descale = {2.0f, 0.125f, 8.0f}},
    {FP8(FP8_E4M3, BF16, 1, 2, 2, 5, 64, 32), WINDOW(20, 3), .scale = 0.1f,
     .layout = TC_HEAD_MAJOR},
    {FP8(FP8_E4M3, F16, 1, 4, 2, 64, 64, 64), .causal = 1, .layout = TC_PACKED_QKV},
};

/* The CPU flash forward against the oracle on an fp8 case of one key block: both round each P
 * against the row's final maximum, so they agree to o's precision (P's polynomial exp2 and f32
 * sums move an e4m3 rounding only in the rare case of a near tie). */
static void check_cpu_fp8(const tc_case *c, int seed)
{
    char name[200];
    tc_case_name(c, name, sizeof name);
    host_case hr, hf;
    const int ok_r = host_case_make(&hr, c, seed) == 0, ok_f = host_case_make(&hf, c, seed) == 0;
    int64_t no = hr.d.total_q * c->heads * c->head_dim;
    float *o_r = malloc((size_t)no * sizeof(float)), *o_f = malloc((size_t)no * sizeof(float));
    if (CHECK(ok_r && ok_f && o_r && o_f) && CHECK(fp_reference_forward(&hr.p) == FLASHPORT_OK) &&
        CHECK(fp_cpu_flash_forward(&hf.p) == FLASHPORT_OK)) {
        tu_gather(&hr.plan.view[TC_O], hr.buf[hr.plan.buffer[TC_O]], tc_out_dtype(c), o_r);
        tu_gather(&hf.plan.view[TC_O], hf.buf[hf.plan.buffer[TC_O]], tc_out_dtype(c), o_f);
        tu_err e = tu_error(o_f, o_r, no);
        const double u = tu_unit_roundoff(tc_out_dtype(c));
        CHECK_MSG(e.rel_l2 <= 2.0 * u && e.max_abs <= 4.0 * u * e.ref_max,
                  "%s: cpu vs oracle rel %.2e max %.2e (o's unit roundoff %.2e)", name, e.rel_l2,
                  e.max_abs, u);
        printf("cpu fp8  %-58s rel %.2e max %.2e vs oracle\n", name, e.rel_l2, e.max_abs);
    }
    free(o_r);
    free(o_f);
    host_case_free(&hr);
    host_case_free(&hf);
}

/* fp_round_e4m3 against the definition through fp_f32_to_fp8 / fp_fp8_to_f32: a sweep of f32
 * patterns of both signs up to past 448, every pattern next to a rounding tie of every
 * exponent, infinities and NaN. */
static void check_round_e4m3(void)
{
    int64_t bad = 0, n = 0;
    for (int neg = 0; neg < 2; neg++) {
        for (uint64_t a = 0; a <= 0x44000000u; a += 4099) {
            for (int64_t t = -2; t <= 2; t++) {
                /* a near pattern and, per exponent, the patterns around its e4m3 tie */
                const uint32_t tie = (uint32_t)((a & 0xfff80000u) | 0x80000u);
                const uint32_t bits[2] = {(uint32_t)a, (uint32_t)((int64_t)tie + t)};
                for (int k = 0; k < 2; k++) {
                    const float x = fp_bits_f32(bits[k] | (neg ? 0x80000000u : 0u));
                    const float want = fp_fp8_to_f32(fp_f32_to_fp8(x, 1), 1);
                    const float got = fp_round_e4m3(x);
                    bad += fp_f32_bits(got) != fp_f32_bits(want);
                    n++;
                }
            }
        }
    }
    const float special[] = {INFINITY, -INFINITY, NAN, 448.0f, 464.0f, 1e30f, 0.0f, -0.0f};
    for (int i = 0; i < 8; i++) {
        const float want = fp_fp8_to_f32(fp_f32_to_fp8(special[i], 1), 1);
        const float got = fp_round_e4m3(special[i]);
        bad += isnan(want) ? !isnan(got) : fp_f32_bits(got) != fp_f32_bits(want);
        n++;
    }
    CHECK_MSG(bad == 0, "fp_round_e4m3: %lld of %lld values differ from fp_f32_to_fp8",
              (long long)bad, (long long)n);
    /* fp_fp8_to_f32_vec, the CPU kernel's conversion, against fp_fp8_to_f32: every code */
    for (int e4m3 = 0; e4m3 <= 1; e4m3++)
        for (int code = 0; code < 256; code++) {
            const float want = fp_fp8_to_f32((uint8_t)code, e4m3);
            const float got = fp_fp8_to_f32_vec((uint8_t)code, e4m3);
            CHECK_MSG(isnan(want) ? isnan(got) : fp_f32_bits(got) == fp_f32_bits(want),
                      "fp_fp8_to_f32_vec(0x%02x, %s) = %g, fp_fp8_to_f32 %g", code,
                      e4m3 ? "e4m3" : "e5m2", (double)got, (double)want);
        }
    printf("fp_round_e4m3: %lld values checked\n", (long long)n);
}

static const tc_case backward_cases[] = {
    {DENSE(F32, 1, 2, 1, 5, 6, 4), .causal = 1, .softcap = 1.5f, .alibi = 1},
    {DENSE(F32, 2, 4, 2, 4, 3, 3), WINDOW(1, 2)},
    {VARLEN(F32, 2, 2, 2, 5), .causal = 1, .seqlens_q = {4, 3}, .seqlens_k = {2, 5}},
    {DENSE(F32, 1, 1, 1, 3, 7, 2), WINDOW(3, -1), .softcap = 0.7f, .scale = 2.0f},
};

/* Nq > Nk with a window leaves rows without keys; Nq < Nk with a left window, keys without
 * rows; an empty key sequence, rows without keys. */
static const tc_case masked_cases[] = {
    {DENSE(F32, 2, 4, 2, 9, 5, 4), WINDOW(0, 1)},
    {DENSE(F16, 1, 2, 1, 4, 9, 8), .causal = 1, WINDOW(1, 0)},
    {VARLEN(F32, 2, 2, 1, 3), .causal = 1, WINDOW(1, 0), .seqlens_q = {3, 2}, .seqlens_k = {6, 0}},
};

int main(void)
{
    const int nf = (int)(sizeof forward_cases / sizeof forward_cases[0]);
    const int nb = (int)(sizeof backward_cases / sizeof backward_cases[0]);
    const int nm = (int)(sizeof masked_cases / sizeof masked_cases[0]);
    for (int i = 0; i < nf; i++)
        check_forward(&forward_cases[i], 100 + i, i != 1);
    check_forward(&forward_cases[1], 101, 1);
    for (int i = 0; i < nb; i++)
        check_backward(&backward_cases[i], 200 + i);
    for (int i = 0; i < nm; i++)
        check_backward_masked(&masked_cases[i], 300 + i);
    check_score_helpers();
    const int n8 = (int)(sizeof fp8_cases / sizeof fp8_cases[0]);
    for (int i = 0; i < n8; i++) {
        check_forward(&fp8_cases[i], 400 + i, 1);
        check_cpu_fp8(&fp8_cases[i], 400 + i);
    }
    check_round_e4m3();
    return tu_finish("test_reference", "all checks passed");
}
