/*
 * One binary that runs the shared case table (tests/cases.c) against a backend through the
 * public API, forward and backward, and compares every output with the "reference" backend.
 *
 *   test_backends [BACKEND] [--quick] [--filter TEXT] [--workspace] [--forward-only]
 *
 * BACKEND defaults to $FLASHPORT_BACKEND. The oracle is the reference backend run on f32 copies
 * of the case's inputs (exact: the inputs are generated representable in the case's dtype), in
 * contiguous layout, so its outputs are rounded only once, to f32. The backend under test runs in
 * the case's dtype and layout, with outputs poisoned (NaN) beforehand: an element it forgets to
 * write fails, and an element outside the output views that it overwrites fails too. Its
 * backward receives its own forward's O and LSE.
 *
 * --filter keeps the cases whose name contains TEXT, or with a leading '^' those whose name
 * starts with the rest ("^f16 ": the f16 cases, not the bf16 ones).
 *
 * Pass rule (tests/test_util.h): per tensor, max-abs and relative L2 error within
 * TU_TOL_FACTOR x those of a naive same-precision computation, plus a floor of 2 dtype units.
 * Deterministic cases run the backward twice and require bitwise-identical gradients.
 * A case the backend answers FLASHPORT_ERR_UNSUPPORTED_* counts as "unsupported", never as a
 * pass, and as a failure when docs/semantics.md requires the backend to run it (tc_required).
 * Before every call, flashport_attention_supported must give the status the call then returns.
 * --workspace: each call's scratch (flashport_attention_workspace_size) is allocated with
 * flashport_malloc and handed over with flashport_set_workspace, so GPU backends run the whole
 * table on caller-owned memory.
 * --forward-only: the forward of each case only (checked as above; no backward, oracle's or the
 * backend's), for passes that force a forward kernel and leave the backward as it was.
 * Exit: 0 when nothing failed and something passed, 1 otherwise, 77 (skip) when the backend has
 * no device or its plugin is unavailable.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "tests/cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PASS, FAIL, UNSUPPORTED };
static char be_arch[32]; /* the device's arch (flashport_device_props), "" when unknown */
static const char *verdict_name[] = {"PASS", "FAIL", "UNSUPPORTED"};

/* The outputs of one backend for one case, in logical order (see tu_view). */
typedef struct outputs {
    float *o, *lse, *dq, *dk, *dv;
} outputs;

/* One case staged on one backend: host copies of every buffer and their device twins. */
typedef struct staged {
    flashport_backend *be;
    flashport_dtype dtype[TC_TENSORS]; /* per tensor: q, k, v in the input dtype, the rest in o's */
    flashport_dtype bdtype[TC_TENSORS]; /* per buffer: the dtype of the tensors it holds */
    tc_plan plan;
    void *host[TC_TENSORS], *dev[TC_TENSORS];
    uint8_t *covered[TC_TENSORS]; /* per buffer: elements that belong to some view */
    size_t bytes[TC_TENSORS];
    float *lse_host;
    void *lse_dev, *cu_q_dev, *cu_k_dev, *alibi_dev;
    void *used_dev, *bt_dev, *kpages_dev, *vpages_dev; /* KV cache (paged: under test only) */
    flashport_attention_params params;
    flashport_tensor t[TC_TENSORS], lse;
} staged;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void report_status(const char *what, flashport_status s)
{
    fprintf(stderr, "  %s: %s: %s\n", what, flashport_status_string(s), flashport_last_error());
}

static flashport_status upload(staged *st, void **dev, const void *host, size_t bytes)
{
    flashport_status s = flashport_malloc(st->be, bytes ? bytes : 1, dev);
    if (s == FLASHPORT_OK && bytes)
        s = flashport_memcpy_to_device(st->be, *dev, host, bytes);
    return s;
}

static void unstage(staged *st)
{
    for (int b = 0; b < TC_TENSORS; b++) {
        if (st->dev[b])
            flashport_free(st->be, st->dev[b]);
        free(st->host[b]);
        free(st->covered[b]);
    }
    void *small[] = {st->lse_dev,  st->cu_q_dev, st->cu_k_dev,   st->alibi_dev,
                     st->used_dev, st->bt_dev,   st->kpages_dev, st->vpages_dev};
    for (int i = 0; i < 8; i++)
        if (small[i])
            flashport_free(st->be, small[i]);
    free(st->lse_host);
    memset(st, 0, sizeof *st);
}

/* A paged copy of the case's logical K and V for the backend under test: sequence b's used keys
 * in ceil(seqused[b] / page_size) pages, numbered in a shuffled order, plus two spare pages; the
 * rows of a page past the used keys, and the spare pages, hold NaN; block-table entries past the
 * used pages hold an out-of-range page (never read). */
static flashport_status stage_paged(staged *st, const tc_case *c, const tc_data *d,
                                    flashport_dtype dtype, int index, int hole)
{
    const int64_t ps = c->page_size, Hkv = c->kv_heads, D = c->head_dim, row = Hkv * D;
    const int64_t stride = (c->seqlen_k + ps - 1) / ps + (hole ? 1 : 0);
    int32_t used_hole[TC_MAX_BATCH]; /* hole: the seqused_k the backend gets */
    const size_t esz = tu_dtype_size(dtype);
    int64_t pages = 2;
    for (int b = 0; b < c->batch; b++)
        pages += (c->seqused[b] + ps - 1) / ps;
    int32_t *perm = malloc((size_t)pages * sizeof(int32_t));
    int32_t *bt = malloc((size_t)(c->batch * stride) * sizeof(int32_t) + 1);
    void *kp = malloc((size_t)(pages * ps * row) * esz),
         *vp = malloc((size_t)(pages * ps * row) * esz);
    float *nan_row = malloc((size_t)row * sizeof(float));
    flashport_status s = FLASHPORT_ERR_OUT_OF_MEMORY;
    if (!perm || !bt || !kp || !vp || !nan_row)
        goto out;
    tu_rng r = tu_rng_seed(0x9a9e5ull + (uint64_t)index);
    for (int64_t i = 0; i < pages; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = pages - 1; i > 0; i--) {
        int64_t j = tu_rng_u32(&r) % (uint64_t)(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = (int32_t)t;
    }
    tu_poison(kp, pages * ps * row, dtype);
    tu_poison(vp, pages * ps * row, dtype);
    for (int64_t x = 0; x < row; x++)
        nan_row[x] = NAN;
    int64_t next = 0;
    tu_view rv; /* one [1, 1, Hkv, D] row, placed by its offset */
    memset(&rv, 0, sizeof rv);
    rv.nb = rv.n = 1;
    rv.heads = Hkv;
    rv.dim = D;
    rv.stride[2] = D;
    rv.stride[3] = 1;
    for (int b = 0; b < c->batch; b++) {
        const int64_t used = c->seqused[b], np = (used + ps - 1) / ps;
        for (int64_t i = 0; i < stride; i++)
            bt[b * stride + i] = i < np ? perm[next + i] : INT32_MAX - (int32_t)i;
        used_hole[b] = (int32_t)used;
        if (hole && np >= 2) { /* the out-of-range entry at logical page 1 (cases.h) */
            for (int64_t i = np; i > 1; i--)
                bt[b * stride + i] = bt[b * stride + i - 1];
            bt[b * stride + 1] = (b & 1) ? -1 - (int32_t)b : (int32_t)pages + (int32_t)b;
            used_hole[b] = (int32_t)(used + ps);
        }
        for (int64_t i = 0; i < np * ps; i++) {
            rv.offset = ((int64_t)perm[next + i / ps] * ps + i % ps) * row;
            const int64_t tok = d->cu_k[b] + i;
            tu_scatter(&rv, i < used ? d->k + tok * row : nan_row, kp, dtype);
            tu_scatter(&rv, i < used ? d->v + tok * row : nan_row, vp, dtype);
        }
        next += np;
    }
    const size_t bytes = (size_t)(pages * ps * row) * esz;
    if ((s = upload(st, &st->kpages_dev, kp, bytes)) == FLASHPORT_OK &&
        (s = upload(st, &st->vpages_dev, vp, bytes)) == FLASHPORT_OK)
        s = upload(st, &st->bt_dev, bt, (size_t)(c->batch * stride) * sizeof(int32_t));
    if (s == FLASHPORT_OK && hole)
        s = flashport_memcpy_to_device(st->be, st->used_dev, used_hole,
                                       (size_t)c->batch * sizeof(int32_t));
    if (s == FLASHPORT_OK) {
        const int64_t shape[4] = {pages, ps, Hkv, D};
        st->t[TC_K] = flashport_tensor_contiguous(st->kpages_dev, dtype, 4, shape);
        st->t[TC_V] = flashport_tensor_contiguous(st->vpages_dev, dtype, 4, shape);
        st->params.block_table = st->bt_dev;
        st->params.block_table_stride = (int32_t)stride;
    }
out:
    free(perm);
    free(bt);
    free(kp);
    free(vp);
    free(nan_row);
    return s;
}

/* Copies the case's inputs to the backend in `layout`, outputs poisoned: q, k, v in `dtype`,
 * o, dout and the gradients in `odtype` (a buffer holds tensors of one dtype in every layout);
 * paged (the backend under test of a paged case): k and v as a paged cache (stage_paged). */
static flashport_status stage(staged *st, flashport_backend *be, const tc_case *c, const tc_data *d,
                              flashport_dtype dtype, flashport_dtype odtype, tc_layout layout,
                              int paged, int index)
{
    static const int is_input[TC_TENSORS] = {1, 1, 1, 0, 1, 0, 0, 0};
    const float *logical[TC_TENSORS] = {d->q, d->k, d->v, NULL, d->dout, NULL, NULL, NULL};
    flashport_status s = FLASHPORT_OK;
    memset(st, 0, sizeof *st);
    st->be = be;
    for (int t = 0; t < TC_TENSORS; t++)
        st->dtype[t] = t <= TC_V ? dtype : odtype;
    if (tc_plan_make(c, d, layout, &st->plan) != 0) {
        fprintf(stderr, "  case table bug: layout %d cannot hold this case\n", (int)layout);
        return FLASHPORT_ERR_INTERNAL;
    }
    for (int t = TC_TENSORS - 1; t >= 0; t--)
        st->bdtype[st->plan.buffer[t]] = st->dtype[t];
    for (int b = 0; b < st->plan.buffers; b++) {
        int64_t n = st->plan.buffer_elems[b];
        st->bytes[b] = (size_t)n * tu_dtype_size(st->bdtype[b]);
        st->host[b] = malloc(st->bytes[b] ? st->bytes[b] : 1);
        st->covered[b] = calloc((size_t)(n ? n : 1), 1);
        if (!st->host[b] || !st->covered[b])
            return FLASHPORT_ERR_OUT_OF_MEMORY;
        tu_poison(st->host[b], n, st->bdtype[b]);
    }
    for (int t = 0; t < TC_TENSORS; t++) {
        int b = st->plan.buffer[t];
        tu_view_mark(&st->plan.view[t], st->covered[b]);
        if (is_input[t])
            tu_scatter(&st->plan.view[t], logical[t], st->host[b], st->dtype[t]);
    }
    int64_t lse_n = tc_lse_elems(d);
    st->lse_host = malloc((size_t)(lse_n ? lse_n : 1) * sizeof(float));
    if (!st->lse_host)
        return FLASHPORT_ERR_OUT_OF_MEMORY;
    tu_poison(st->lse_host, lse_n, FLASHPORT_F32);

    for (int b = 0; b < st->plan.buffers && s == FLASHPORT_OK; b++)
        s = upload(st, &st->dev[b], st->host[b], st->bytes[b]);
    if (s == FLASHPORT_OK)
        s = upload(st, &st->lse_dev, st->lse_host, (size_t)lse_n * sizeof(float));
    st->params = d->params;
    if (s == FLASHPORT_OK && c->varlen) {
        size_t cu_bytes = (size_t)(c->batch + 1) * sizeof(int32_t);
        s = upload(st, &st->cu_q_dev, d->cu_q, cu_bytes);
        if (s == FLASHPORT_OK)
            s = upload(st, &st->cu_k_dev, d->cu_k, cu_bytes);
        st->params.cu_seqlens_q = st->cu_q_dev;
        st->params.cu_seqlens_k = st->cu_k_dev;
    }
    if (s == FLASHPORT_OK && c->alibi) {
        s = upload(st, &st->alibi_dev, d->alibi, (size_t)c->heads * sizeof(float));
        st->params.alibi_slopes = st->alibi_dev;
    }
    if (s == FLASHPORT_OK && c->use_seqused) {
        s = upload(st, &st->used_dev, d->used, (size_t)c->batch * sizeof(int32_t));
        st->params.seqused_k = st->used_dev;
    }
    for (int t = 0; t < TC_TENSORS; t++)
        st->t[t] = tu_view_tensor(&st->plan.view[t], st->dev[st->plan.buffer[t]], st->dtype[t]);
    if (s == FLASHPORT_OK && paged)
        s = stage_paged(st, c, d, dtype, index, paged == 2);
    if (s != FLASHPORT_OK) {
        report_status("staging", s);
        return s;
    }
    st->lse = tc_lse_tensor(c, d, st->lse_dev);
    return FLASHPORT_OK;
}

/* Copies buffer b back to its host copy (-1 when that fails); checks that elements outside
 * every view of it still hold the poison. */
static int fetch(staged *st, int b, const char *what)
{
    flashport_status s = flashport_memcpy_to_host(st->be, st->host[b], st->dev[b], st->bytes[b]);
    if (!CHECK_MSG(s == FLASHPORT_OK, "%s: copy to host failed: %s", what, flashport_last_error()))
        return -1;
    int64_t n = st->plan.buffer_elems[b], clobbered = 0;
    for (int64_t i = 0; i < n; i++)
        clobbered += !st->covered[b][i] && !tu_is_poison(st->host[b], i, st->bdtype[b]);
    CHECK_MSG(clobbered == 0, "%s: %lld elements outside the tensor view were written", what,
              (long long)clobbered);
    return 0;
}

static int repoison(staged *st, int b)
{
    tu_poison(st->host[b], st->plan.buffer_elems[b], st->bdtype[b]);
    return flashport_memcpy_to_device(st->be, st->dev[b], st->host[b], st->bytes[b]) == FLASHPORT_OK
               ? 0
               : -1;
}

static int use_workspace; /* --workspace */
static int forward_only;  /* --forward-only */

/* Before a call: what flashport_attention_supported says of it (*sup) and, with --workspace, the
 * call's scratch from the backend's memory set as the handle's workspace (*ws, NULL if none). */
static flashport_status prepare(staged *st, flashport_direction dir, flashport_status *sup,
                                void **ws)
{
    const int bwd = dir == FLASHPORT_BACKWARD;
    const flashport_tensor *t = st->t;
    const flashport_tensor *dout = bwd ? &t[TC_DOUT] : NULL, *dq = bwd ? &t[TC_DQ] : NULL;
    const flashport_tensor *dk = bwd ? &t[TC_DK] : NULL, *dv = bwd ? &t[TC_DV] : NULL;
    *ws = NULL;
    *sup = flashport_attention_supported(st->be, dir, &st->params, &t[TC_Q], &t[TC_K], &t[TC_V],
                                         &t[TC_O], &st->lse, dout, dq, dk, dv);
    if (*sup != FLASHPORT_OK || !use_workspace)
        return FLASHPORT_OK;
    size_t bytes = 0;
    flashport_status s =
        flashport_attention_workspace_size(st->be, dir, &st->params, &t[TC_Q], &t[TC_K], &t[TC_V],
                                           &t[TC_O], &st->lse, dout, dq, dk, dv, &bytes);
    if (s == FLASHPORT_OK && bytes > 0 && (s = flashport_malloc(st->be, bytes, ws)) == FLASHPORT_OK)
        s = flashport_set_workspace(st->be, *ws, bytes);
    return s;
}

/* After the call: the workspace is released once the work is done, and supported() must have
 * predicted the call's status. */
static flashport_status finish(staged *st, void *ws, flashport_status sup, flashport_status call)
{
    if (ws) {
        flashport_synchronize(st->be);
        flashport_set_workspace(st->be, NULL, 0);
        flashport_free(st->be, ws);
    }
    if (sup != call) {
        printf("  flashport_attention_supported said %s, the call returned %s\n",
               flashport_status_string(sup), flashport_status_string(call));
        return FLASHPORT_ERR_INTERNAL;
    }
    return call;
}

static flashport_status run_forward(staged *st, const tc_case *c, const tc_data *d, outputs *out)
{
    flashport_status sup;
    void *ws;
    flashport_status s = prepare(st, FLASHPORT_FORWARD, &sup, &ws);
    if (s != FLASHPORT_OK)
        return s;
    s = flashport_attention_forward(st->be, &st->params, &st->t[TC_Q], &st->t[TC_K], &st->t[TC_V],
                                    &st->t[TC_O], &st->lse);
    s = finish(st, ws, sup, s);
    if (s == FLASHPORT_OK)
        s = flashport_synchronize(st->be);
    if (s != FLASHPORT_OK)
        return s;
    int bo = st->plan.buffer[TC_O];
    if (fetch(st, bo, "O") != 0 ||
        flashport_memcpy_to_host(st->be, st->lse_host, st->lse_dev,
                                 (size_t)tc_lse_elems(d) * sizeof(float)) != FLASHPORT_OK)
        return FLASHPORT_ERR_INTERNAL;
    tu_gather(&st->plan.view[TC_O], st->host[bo], st->dtype[TC_O], out->o);
    tc_lse_to_logical(c, d, st->lse_host, out->lse);
    return FLASHPORT_OK;
}

static flashport_status call_backward(staged *st)
{
    static const int grads[3] = {TC_DQ, TC_DK, TC_DV};
    for (int g = 0; g < 3; g++)
        if (repoison(st, st->plan.buffer[grads[g]]) != 0)
            return FLASHPORT_ERR_INTERNAL;
    flashport_status sup;
    void *ws;
    flashport_status s = prepare(st, FLASHPORT_BACKWARD, &sup, &ws);
    if (s != FLASHPORT_OK)
        return s;
    s = flashport_attention_backward(st->be, &st->params, &st->t[TC_Q], &st->t[TC_K], &st->t[TC_V],
                                     &st->t[TC_O], &st->lse, &st->t[TC_DOUT], &st->t[TC_DQ],
                                     &st->t[TC_DK], &st->t[TC_DV]);
    s = finish(st, ws, sup, s);
    if (s == FLASHPORT_OK)
        s = flashport_synchronize(st->be);
    if (s != FLASHPORT_OK)
        return s;
    for (int g = 0; g < 3; g++)
        if (fetch(st, st->plan.buffer[grads[g]], g == 0 ? "dQ" : g == 1 ? "dK" : "dV") != 0)
            return FLASHPORT_ERR_INTERNAL;
    return FLASHPORT_OK;
}

/* Backward after run_forward; deterministic cases run it twice and compare the bits. */
static flashport_status run_backward(staged *st, int twice, outputs *out)
{
    static const int grads[3] = {TC_DQ, TC_DK, TC_DV};
    flashport_status s = call_backward(st);
    if (s != FLASHPORT_OK)
        return s;
    float *dst[3] = {out->dq, out->dk, out->dv};
    for (int g = 0; g < 3; g++)
        tu_gather(&st->plan.view[grads[g]], st->host[st->plan.buffer[grads[g]]],
                  st->dtype[grads[g]], dst[g]);
    if (!twice)
        return FLASHPORT_OK;
    void *first[3] = {NULL, NULL, NULL};
    for (int g = 0; g < 3; g++) {
        int b = st->plan.buffer[grads[g]];
        first[g] = malloc(st->bytes[b] ? st->bytes[b] : 1);
        if (first[g])
            memcpy(first[g], st->host[b], st->bytes[b]);
    }
    s = first[0] && first[1] && first[2] ? call_backward(st) : FLASHPORT_ERR_OUT_OF_MEMORY;
    for (int g = 0; g < 3 && s == FLASHPORT_OK; g++) {
        int b = st->plan.buffer[grads[g]];
        CHECK_MSG(memcmp(first[g], st->host[b], st->bytes[b]) == 0,
                  "deterministic backward: %s differs between two runs",
                  g == 0   ? "dQ"
                  : g == 1 ? "dK"
                           : "dV");
    }
    for (int g = 0; g < 3; g++)
        free(first[g]);
    return s;
}

/* The inputs must come back as they went in. */
static void check_inputs_intact(staged *st)
{
    static const int inputs[4] = {TC_Q, TC_K, TC_V, TC_DOUT};
    for (int i = 0; i < 4; i++) {
        int b = st->plan.buffer[inputs[i]];
        void *copy = malloc(st->bytes[b] ? st->bytes[b] : 1);
        if (!CHECK(copy != NULL))
            return;
        if (flashport_memcpy_to_host(st->be, copy, st->dev[b], st->bytes[b]) == FLASHPORT_OK)
            CHECK_MSG(memcmp(copy, st->host[b], st->bytes[b]) == 0,
                      "an input buffer was modified by the backend");
        free(copy);
    }
}

static int outputs_alloc(outputs *o, const tc_data *d)
{
    int64_t nq = d->total_q * d->prob.heads * d->prob.head_dim;
    int64_t nk = d->total_k * d->prob.kv_heads * d->prob.head_dim;
    int64_t sizes[5] = {nq, tc_lse_elems(d), nq, nk, nk};
    float **p[5] = {&o->o, &o->lse, &o->dq, &o->dk, &o->dv};
    int ok = 1;
    for (int i = 0; i < 5; i++) {
        *p[i] = malloc((size_t)(sizes[i] > 0 ? sizes[i] : 1) * sizeof(float));
        ok = ok && *p[i];
    }
    return ok ? 0 : -1;
}

static void outputs_free(outputs *o)
{
    free(o->o);
    free(o->lse);
    free(o->dq);
    free(o->dk);
    free(o->dv);
}

/* Compares tensor `what` of the backend with the oracle, the naive result setting the bar; the
 * O of an fp8 case (pv_bound >= 0) gets the P-rounding allowance of tu_tolerance_fp8.
 * Appends "what max a/tol rel r/tol" to line; returns 1 when within tolerance. */
static int compare(const char *what, const float *x, const float *naive, const float *oracle,
                   int64_t n, double roundoff, double pv_bound, char *line, size_t size)
{
    tu_err e = tu_error(x, oracle, n);
    tu_err en = tu_error(naive, oracle, n);
    tu_tol tol =
        pv_bound >= 0.0 ? tu_tolerance_fp8(en, roundoff, pv_bound) : tu_tolerance(en, roundoff);
    int ok = tu_within(e, tol);
    size_t len = strlen(line);
    snprintf(line + len, size - len, "  %s max %.2e/%.2e rel %.2e/%.2e%s", what, e.max_abs,
             tol.max_abs, e.rel_l2, tol.rel_l2, ok ? "" : " <-");
    return ok;
}

static int verdict_of(flashport_status s, int required, const char *dir)
{
    if (s == FLASHPORT_OK)
        return PASS;
    report_status(dir, s);
    if (tu_is_unsupported(s) && !required)
        return UNSUPPORTED;
    if (tu_is_unsupported(s))
        fprintf(stderr, "  docs/semantics.md requires this backend to run this case\n");
    return FAIL;
}

typedef struct tally {
    int passed, failed, unsupported;
} tally;

static void count(tally *t, int v)
{
    t->passed += v == PASS;
    t->failed += v == FAIL;
    t->unsupported += v == UNSUPPORTED;
}

static void run_case(flashport_backend *be, flashport_backend *ref, const tc_case *c, int index,
                     tally *t)
{
    char name[200], line[512];
    tc_case_name(c, name, sizeof name);
    tc_data d;
    outputs oracle, naive, got;
    memset(&oracle, 0, sizeof oracle);
    memset(&naive, 0, sizeof naive);
    memset(&got, 0, sizeof got);
    staged so, sb;
    memset(&so, 0, sizeof so);
    memset(&sb, 0, sizeof sb);
    int fwd = FAIL, bwd = FAIL, failures_before = tu_failures;
    double t_fwd = 0.0, t_bwd = 0.0;

    if (!CHECK(tc_data_make(c, index, &d) == 0))
        goto done_nodata;
    if (!CHECK(outputs_alloc(&oracle, &d) == 0 && outputs_alloc(&naive, &d) == 0 &&
               outputs_alloc(&got, &d) == 0))
        goto done;

    /* The oracle: reference backend, f32, contiguous, dense. fp8 cases (forward only): the fp8
     * inputs themselves (P's rounding is part of the result), o in f16, the finer of its two
     * dtypes. */
    const int fp8 = tc_fp8(c);
    flashport_status s =
        fp8 ? stage(&so, ref, c, &d, c->dtype, FLASHPORT_F16, TC_CONTIGUOUS, 0, index)
            : stage(&so, ref, c, &d, FLASHPORT_F32, FLASHPORT_F32, TC_CONTIGUOUS, 0, index);
    if (s == FLASHPORT_OK)
        s = run_forward(&so, c, &d, &oracle);
    if (s == FLASHPORT_OK && !fp8 && !forward_only)
        s = run_backward(&so, 0, &oracle);
    if (!CHECK_MSG(s == FLASHPORT_OK, "oracle failed on %s: %s", name, flashport_last_error()))
        goto done;
    if (!CHECK(tu_naive_forward(&d.prob, naive.o, naive.lse) == 0 &&
               (fp8 || forward_only ||
                tu_naive_backward(&d.prob, naive.o, naive.lse, d.dout, naive.dq, naive.dk,
                                  naive.dv) == 0)))
        goto done;

    int required = tc_required(c, flashport_backend_name(be), be_arch);
    /* hole_page: GPU backends only (cases.h); host backends refuse the table */
    const char *be_name = flashport_backend_name(be);
    const int host_be = !strcmp(be_name, "cpu") || !strcmp(be_name, "reference");
    if (c->hole_page && host_be) {
        printf("fwd %-60s skipped (an out-of-range block-table entry: GPU backends only)\n", name);
        fwd = bwd = UNSUPPORTED;
        goto done;
    }
    s = stage(&sb, be, c, &d, c->dtype, tc_out_dtype(c), c->layout,
              c->page_size > 0 ? (c->hole_page ? 2 : 1) : 0, index);
    if (s != FLASHPORT_OK)
        goto done;
    double t0 = now_ms();
    s = run_forward(&sb, c, &d, &got);
    t_fwd = now_ms() - t0;
    fwd = verdict_of(s, required, "forward");
    if (fwd == PASS) {
        double u = tu_unit_roundoff(tc_out_dtype(c)), u32 = tu_unit_roundoff(FLASHPORT_F32);
        int64_t nq = d.total_q * c->heads * c->head_dim;
        /* fp8: descale_v max |V| bounds sum_j p_ij |V_jd| (tu_tolerance_fp8); V is in [-1, 1] */
        double pv_bound = fp8 ? (c->descale[2] > 0.0f ? c->descale[2] : 1.0) : -1.0;
        line[0] = '\0';
        int ok = compare("O", got.o, naive.o, oracle.o, nq, u, pv_bound, line, sizeof line);
        ok &= compare("LSE", got.lse, naive.lse, oracle.lse, tc_lse_elems(&d),
                      fp8 ? TU_FP8_LSE_ROUNDOFF : u32, -1.0, line, sizeof line);
        fwd = ok && tu_failures == failures_before ? PASS : FAIL;
        printf("fwd %-60s %7.1f ms%s  %s\n", name, t_fwd, line, verdict_name[fwd]);
    } else {
        printf("fwd %-60s %s\n", name, verdict_name[fwd]);
    }

    if (forward_only) {
        check_inputs_intact(&sb);
        goto done;
    }
    if (s != FLASHPORT_OK) { /* the backward needs this forward's O and LSE */
        bwd = fwd;
        printf("bwd %-60s %s (not run: forward did not run)\n", name, verdict_name[bwd]);
        goto done;
    }
    if (c->page_size > 0) { /* paged caches are forward only: the backward must be refused */
        s = call_backward(&sb);
        bwd = CHECK_MSG(s == FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                        "paged backward returned %s; expected FLASHPORT_ERR_UNSUPPORTED_FEATURE",
                        flashport_status_string(s))
                  ? PASS
                  : FAIL;
        printf("bwd %-60s refused (paged caches are forward only)  %s\n", name, verdict_name[bwd]);
        check_inputs_intact(&sb);
        goto done;
    }
    int before_bwd = tu_failures;
    if (fp8) { /* forward only: every backend must refuse the backward, by dtype */
        s = call_backward(&sb);
        CHECK_MSG(s == FLASHPORT_ERR_UNSUPPORTED_DTYPE,
                  "fp8 backward returned %s, not FLASHPORT_ERR_UNSUPPORTED_DTYPE",
                  flashport_status_string(s));
        bwd = tu_failures == before_bwd ? UNSUPPORTED : FAIL;
        printf("bwd %-60s %s (fp8 is forward only: %s)\n", name, verdict_name[bwd],
               flashport_status_string(s));
        check_inputs_intact(&sb);
        goto done;
    }
    t0 = now_ms();
    s = run_backward(&sb, c->deterministic, &got);
    t_bwd = now_ms() - t0;
    bwd = verdict_of(s, required, "backward");
    if (bwd == PASS) {
        double u = tu_unit_roundoff(c->dtype);
        int64_t nq = d.total_q * c->heads * c->head_dim;
        int64_t nk = d.total_k * c->kv_heads * c->head_dim;
        line[0] = '\0';
        int ok = compare("dQ", got.dq, naive.dq, oracle.dq, nq, u, -1.0, line, sizeof line);
        ok &= compare("dK", got.dk, naive.dk, oracle.dk, nk, u, -1.0, line, sizeof line);
        ok &= compare("dV", got.dv, naive.dv, oracle.dv, nk, u, -1.0, line, sizeof line);
        bwd = ok && tu_failures == before_bwd ? PASS : FAIL;
        printf("bwd %-60s %7.1f ms%s  %s\n", name, t_bwd, line, verdict_name[bwd]);
    } else {
        printf("bwd %-60s %s\n", name, verdict_name[bwd]);
    }
    check_inputs_intact(&sb);

done:
    tc_data_free(&d);
done_nodata:
    unstage(&so);
    unstage(&sb);
    outputs_free(&oracle);
    outputs_free(&naive);
    outputs_free(&got);
    /* A failed CHECK anywhere in this case fails both directions that were not unsupported. */
    if (tu_failures != failures_before) {
        fwd = fwd == UNSUPPORTED ? fwd : FAIL;
        bwd = bwd == UNSUPPORTED ? bwd : FAIL;
    }
    if (forward_only)
        bwd = UNSUPPORTED; /* not run, not counted */
    if (fwd == FAIL || bwd == FAIL)
        printf("    FAIL: %s (details on stderr)\n", name);
    count(t, fwd);
    if (!forward_only)
        count(t, bwd);
}

static int name_matches(const char *name, const char *filter)
{
    return filter[0] == '^' ? !strncmp(name, filter + 1, strlen(filter + 1))
                            : strstr(name, filter) != NULL;
}

int main(int argc, char **argv)
{
    const char *backend_name = getenv("FLASHPORT_BACKEND"), *filter = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--workspace"))
            use_workspace = 1;
        else if (!strcmp(argv[i], "--forward-only"))
            forward_only = 1;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            filter = argv[++i];
        else if (argv[i][0] != '-')
            backend_name = argv[i];
        else {
            fprintf(stderr,
                    "usage: %s [BACKEND] [--quick] [--filter TEXT] [--workspace] "
                    "[--forward-only]\n",
                    argv[0]);
            return 1;
        }
    }
    if (!backend_name) {
        fprintf(stderr, "test_backends: no backend given (argument or FLASHPORT_BACKEND)\n");
        return 1;
    }

    flashport_backend *be = NULL, *ref = NULL;
    flashport_status s = flashport_backend_open(backend_name, &be);
    if (s == FLASHPORT_ERR_NO_DEVICE || s == FLASHPORT_ERR_BACKEND_UNAVAILABLE) {
        printf("SKIP: backend \"%s\" cannot run here: %s: %s\n", backend_name,
               flashport_status_string(s), flashport_last_error());
        return TU_SKIP;
    }
    if (s != FLASHPORT_OK) {
        fprintf(stderr, "cannot open backend \"%s\": %s: %s\n", backend_name,
                flashport_status_string(s), flashport_last_error());
        return 1;
    }
    flashport_device_props props;
    if (flashport_device_properties(backend_name, flashport_backend_device(be), &props) ==
        FLASHPORT_OK)
        snprintf(be_arch, sizeof be_arch, "%s", props.arch);
    s = flashport_backend_open("reference", &ref);
    if (s != FLASHPORT_OK) {
        fprintf(stderr, "cannot open the reference backend: %s: %s\n", flashport_status_string(s),
                flashport_last_error());
        flashport_backend_close(be);
        return 1;
    }

    int n;
    const tc_case *cases = tc_table(&n);
    tally t = {0, 0, 0};
    double t0 = now_ms();
    printf("backend %s, device %d; error vs oracle / tolerance per tensor\n",
           flashport_backend_name(be), flashport_backend_device(be));
    for (int i = 0; i < n; i++) {
        char name[200];
        tc_case_name(&cases[i], name, sizeof name);
        if ((quick && !cases[i].quick) || (filter && !name_matches(name, filter)))
            continue;
        run_case(be, ref, &cases[i], i, &t);
        fflush(stdout);
    }
    printf("%s: %d passed, %d failed, %d unsupported (%s of each case) in %.1f s\n",
           flashport_backend_name(be), t.passed, t.failed, t.unsupported,
           forward_only ? "forward" : "forward and backward", (now_ms() - t0) / 1e3);
    flashport_backend_close(ref);
    flashport_backend_close(be);
    if (t.passed == 0 && t.failed == 0) {
        printf("nothing passed: no case ran\n");
        return 1;
    }
    return t.failed ? 1 : 0;
}
