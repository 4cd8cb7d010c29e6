/*
 * core/online_softmax.h: a row processed block by block (update, weight, finalize), split into
 * parts whose results are merged through their LSEs, must equal a one-pass double softmax;
 * parts and rows with every score -inf give O = 0 and LSE = -inf, never NaN. Both the natural
 * (exp) and the log2-scaled (exp2) variants are checked.
 */
#include "core/online_softmax.h"
#include "tests/test_util.h"

#include <math.h>
#include <stdio.h>

#define MAX_N 320
#define DV    4 /* value vector length */

/* One-pass softmax in double over scores s[0..n): O = sum p_j v_j, LSE (natural log). */
static void one_pass(const float *s, const float (*v)[DV], int n, double *o, double *lse)
{
    double m = -INFINITY, l = 0.0;
    for (int j = 0; j < n; j++)
        m = s[j] > m ? s[j] : m;
    for (int d = 0; d < DV; d++)
        o[d] = 0.0;
    for (int j = 0; m > -INFINITY && j < n; j++) {
        double w = exp(s[j] - m);
        l += w;
        for (int d = 0; d < DV; d++)
            o[d] += w * v[j][d];
    }
    for (int d = 0; d < DV; d++)
        o[d] = l > 0.0 ? o[d] / l : 0.0;
    *lse = l > 0.0 ? m + log(l) : -INFINITY;
}

/* Online softmax over s[lo..hi) in blocks of `block` keys, as a kernel runs it. */
static void online(const float *s, const float (*v)[DV], int lo, int hi, int block, int use_exp2,
                   float *o, float *lse)
{
    fp_softmax_state st;
    float acc[DV] = {0};
    fp_softmax_init(&st);
    for (int j0 = lo; j0 < hi; j0 += block) {
        int j1 = j0 + block < hi ? j0 + block : hi;
        float x[MAX_N], bm = -INFINITY;
        for (int j = j0; j < j1; j++) {
            x[j - j0] = use_exp2 ? s[j] * FP_LOG2E : s[j];
            bm = x[j - j0] > bm ? x[j - j0] : bm;
        }
        float alpha = use_exp2 ? fp_softmax_update_exp2(&st, bm) : fp_softmax_update(&st, bm);
        for (int d = 0; d < DV; d++)
            acc[d] *= alpha;
        for (int j = j0; j < j1; j++) {
            float w = use_exp2 ? fp_softmax_weight_exp2(&st, x[j - j0])
                               : fp_softmax_weight(&st, x[j - j0]);
            st.l += w;
            for (int d = 0; d < DV; d++)
                acc[d] += w * v[j][d];
        }
    }
    float scale = fp_softmax_out_scale(&st);
    for (int d = 0; d < DV; d++)
        o[d] = acc[d] * scale;
    *lse = use_exp2 ? fp_softmax_lse_exp2(&st) : fp_softmax_lse(&st);
}

/* Splits [0, n) at `cuts` (sorted, may repeat or touch the ends: empty parts), runs each part
 * online and merges the parts left to right. */
static void split_merge(const float *s, const float (*v)[DV], int n, const int *cuts, int ncuts,
                        int block, int use_exp2, float *o, float *lse)
{
    int lo = 0;
    *lse = -INFINITY;
    for (int d = 0; d < DV; d++)
        o[d] = 0.0f;
    for (int c = 0; c <= ncuts; c++) {
        int hi = c < ncuts ? cuts[c] : n;
        float po[DV], plse, wa, wb;
        online(s, v, lo, hi, block, use_exp2, po, &plse);
        float merged = fp_softmax_merge(*lse, plse, &wa, &wb);
        CHECK_MSG(merged == -INFINITY ? wa == 0.0f && wb == 0.0f : fabsf(wa + wb - 1.0f) < 1e-5f,
                  "merge weights %g + %g for lse %g, %g", wa, wb, *lse, plse);
        for (int d = 0; d < DV; d++)
            o[d] = wa * o[d] + wb * po[d];
        *lse = merged;
        lo = hi;
    }
}

static void compare(const char *what, const float *o, float lse, const double *o_ref,
                    double lse_ref)
{
    if (lse_ref == -INFINITY)
        CHECK_MSG(lse == -INFINITY, "%s: LSE %g, expected -inf", what, lse);
    else
        CHECK_MSG(fabs(lse - lse_ref) <= 2e-5 * (1.0 + fabs(lse_ref)), "%s: LSE %.9g vs %.9g", what,
                  lse, lse_ref);
    for (int d = 0; d < DV; d++)
        CHECK_MSG(fabs(o[d] - o_ref[d]) <= 1e-5, "%s: O[%d] %.9g vs %.9g", what, d, o[d], o_ref[d]);
}

static void check_row(const char *what, const float *s, const float (*v)[DV], int n,
                      const int *cuts, int ncuts, int block)
{
    double o_ref[DV], lse_ref;
    one_pass(s, v, n, o_ref, &lse_ref);
    for (int use_exp2 = 0; use_exp2 < 2; use_exp2++) {
        float o[DV], lse;
        char name[96];
        snprintf(name, sizeof name, "%s (%s, block %d)", what, use_exp2 ? "exp2" : "exp", block);
        online(s, v, 0, n, block, use_exp2, o, &lse);
        compare(name, o, lse, o_ref, lse_ref);
        split_merge(s, v, n, cuts, ncuts, block, use_exp2, o, &lse);
        compare(name, o, lse, o_ref, lse_ref);
    }
}

static void random_rows(void)
{
    tu_rng r = tu_rng_seed(7);
    float s[MAX_N], v[MAX_N][DV];
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(tu_rng_u32(&r) % MAX_N);
        float masked = trial % 3 == 0 ? 0.0f : trial % 3 == 1 ? 0.2f : 0.9f;
        float range = trial % 2 ? 30.0f : 3.0f;
        for (int j = 0; j < n; j++) {
            s[j] = tu_rng_uniform(&r, 0.0f, 1.0f) < masked ? -INFINITY
                                                           : tu_rng_uniform(&r, -range, range);
            for (int d = 0; d < DV; d++)
                v[j][d] = tu_rng_uniform(&r, -1.0f, 1.0f);
        }
        int cuts[4], ncuts = (int)(tu_rng_u32(&r) % 5);
        for (int c = 0; c < ncuts; c++)
            cuts[c] = (int)(tu_rng_u32(&r) % (uint32_t)(n + 1));
        for (int a = 0; a < ncuts; a++) /* sort */
            for (int b = a + 1; b < ncuts; b++)
                if (cuts[b] < cuts[a]) {
                    int t = cuts[a];
                    cuts[a] = cuts[b];
                    cuts[b] = t;
                }
        int block = 1 + (int)(tu_rng_u32(&r) % 64);
        check_row("random row", s, (const float(*)[DV])v, n, cuts, ncuts, block);
    }
}

/* Rows where one part, both parts, or everything is masked. */
static void masked_rows(void)
{
    enum { N = 40 };
    float s[N], v[N][DV];
    tu_rng r = tu_rng_seed(11);
    for (int j = 0; j < N; j++)
        for (int d = 0; d < DV; d++)
            v[j][d] = tu_rng_uniform(&r, -1.0f, 1.0f);
    int cut[1] = {N / 2};

    for (int j = 0; j < N; j++)
        s[j] = j < N / 2 ? -INFINITY : tu_rng_uniform(&r, -5.0f, 5.0f);
    check_row("left part masked", s, (const float(*)[DV])v, N, cut, 1, 8);
    for (int j = 0; j < N; j++)
        s[j] = j >= N / 2 ? -INFINITY : tu_rng_uniform(&r, -5.0f, 5.0f);
    check_row("right part masked", s, (const float(*)[DV])v, N, cut, 1, 8);
    for (int j = 0; j < N; j++)
        s[j] = -INFINITY;
    check_row("all masked", s, (const float(*)[DV])v, N, cut, 1, 8);
    check_row("all masked, one block", s, (const float(*)[DV])v, N, cut, 0, N);
    s[N - 1] = 1000.0f; /* one huge visible score at the very end: everything rescales */
    check_row("single visible key", s, (const float(*)[DV])v, N, cut, 1, 8);
}

/* A row that saw nothing: update with -inf keeps l = 0, and finalize gives 0 and -inf. */
static void empty_state(void)
{
    fp_softmax_state st;
    fp_softmax_init(&st);
    float alpha = fp_softmax_update(&st, -INFINITY);
    CHECK(alpha == 1.0f);
    CHECK(st.l == 0.0f && st.m == -INFINITY);
    CHECK(fp_softmax_weight(&st, -INFINITY) == 0.0f);
    CHECK(fp_softmax_out_scale(&st) == 0.0f);
    CHECK(fp_softmax_lse(&st) == -INFINITY);
    fp_softmax_init(&st);
    alpha = fp_softmax_update_exp2(&st, -INFINITY);
    CHECK(alpha == 1.0f && st.l == 0.0f);
    CHECK(fp_softmax_weight_exp2(&st, -INFINITY) == 0.0f);
    CHECK(fp_softmax_out_scale(&st) == 0.0f);
    CHECK(fp_softmax_lse_exp2(&st) == -INFINITY);
    float wa = -1.0f, wb = -1.0f;
    CHECK(fp_softmax_merge(-INFINITY, -INFINITY, &wa, &wb) == -INFINITY);
    CHECK(wa == 0.0f && wb == 0.0f);
    CHECK(fp_softmax_merge(2.0f, -INFINITY, &wa, &wb) == 2.0f);
    CHECK(wa == 1.0f && wb == 0.0f);
}

int main(void)
{
    random_rows();
    masked_rows();
    empty_state();
    return tu_finish("test_softmax", "all checks passed");
}
