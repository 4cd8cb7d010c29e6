/*
 * Unit tests of the attention geometry every backend calls (core/geometry.h, core/mask.h,
 * core/online_softmax.h's exp base, core/plan.h's work orders).
 *
 * What is checked, and against what (the oracle is fp_mask_visible, the per-element rule):
 *   - fp_geom_key_blocks: the key blocks holding a visible (row, key) pair for query rows
 *     [i0, i1) are all inside the returned range, and its first and last blocks hold one;
 *     empty exactly when no row of the block sees any key;
 *   - fp_geom_rows_for_keys / fp_geom_query_blocks: the same from the key side, rows exact;
 *   - fp_mask_block_full: nonzero only when every (row, key) pair of the block is visible, and
 *     then also for every sub-block;
 *   - those over the edges: empty sequences (Nq = 0 or Nk = 0), Nq != Nk both ways, windows wider
 *     than the sequence, windows whose rows see nothing (fully masked blocks), block sizes 1 and
 *     larger than the sequence, and random shapes;
 *   - fp_seq_lookup: dense and varlen batches, including empty sequences;
 *   - fp_softmax_exp_base: 0 for a row that has seen nothing, m otherwise;
 *   - fp_plan_task_at in both orders is a bijection onto the grid, FP_PLAN_ORDER_LOCALITY keeps
 *     each (batch, head)'s query blocks adjacent, both put the heaviest blocks first.
 */
#include "core/geometry.h"
#include "core/online_softmax.h"
#include "core/plan.h"
#include "tests/test_util.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct shape {
    int64_t nq, nk, left, right;
} shape;

static int visible(const shape *s, int64_t i, int64_t j)
{
    return fp_mask_visible(i, j, s->nq, s->nk, s->left, s->right);
}

/* Whether any row of [i0, i1) sees any key of [j0, j1) (clipped to the sequence). */
static int any_visible(const shape *s, int64_t i0, int64_t i1, int64_t j0, int64_t j1)
{
    for (int64_t i = i0; i < i1 && i < s->nq; i++)
        for (int64_t j = j0; j < j1 && j < s->nk; j++)
            if (visible(s, i, j))
                return 1;
    return 0;
}

static int all_visible(const shape *s, int64_t i0, int64_t i1, int64_t j0, int64_t j1)
{
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = j0; j < j1; j++)
            if (!visible(s, i, j))
                return 0;
    return 1;
}

/* Every query block of bm rows against key blocks of bn keys, from both sides. */
static int check_shape(const shape *s, int bm, int bn)
{
    char what[160];
    snprintf(what, sizeof what, "nq %lld nk %lld window (%lld, %lld) blocks %lld x %lld",
             (long long)s->nq, (long long)s->nk, (long long)s->left, (long long)s->right,
             (long long)bm, (long long)bn);
    const int64_t kblocks = (s->nk + bn - 1) / bn, qblocks = (s->nq + bm - 1) / bm;
    for (int64_t qb = 0; qb < qblocks; qb++) {
        const int64_t i0 = qb * bm, i1 = i0 + bm < s->nq ? i0 + bm : s->nq;
        int nb0, nb1;
        fp_geom_key_blocks(i0, i1, s->nq, s->nk, s->left, s->right, bn, &nb0, &nb1);
        int any = 0;
        for (int64_t kb = 0; kb < kblocks; kb++) {
            const int seen = any_visible(s, i0, i1, kb * bn, kb * bn + bn);
            any |= seen;
            if (seen && !CHECK_MSG(kb >= nb0 && kb < nb1,
                                   "%s: rows [%lld, %lld) see key block %lld outside [%lld, %lld)",
                                   what, (long long)i0, (long long)i1, (long long)kb,
                                   (long long)nb0, (long long)nb1))
                return 0;
            const int64_t j0 = kb * bn, j1 = j0 + bn < s->nk ? j0 + bn : s->nk;
            if (fp_mask_block_full(i0, i1, j0, j1, s->nq, s->nk, s->left, s->right) &&
                !CHECK_MSG(all_visible(s, i0, i1, j0, j1),
                           "%s: block (%lld, %lld) called full but has a masked pair", what,
                           (long long)qb, (long long)kb))
                return 0;
        }
        if (!any) {
            if (!CHECK_MSG(nb0 == 0 && nb1 == 0,
                           "%s: rows [%lld, %lld) see nothing, range %lld..%lld", what,
                           (long long)i0, (long long)i1, (long long)nb0, (long long)nb1))
                return 0;
        } else if (!CHECK_MSG(any_visible(s, i0, i1, nb0 * bn, nb0 * bn + bn) &&
                                  any_visible(s, i0, i1, (nb1 - 1) * bn, nb1 * bn),
                              "%s: rows [%lld, %lld): range %lld..%lld not tight", what,
                              (long long)i0, (long long)i1, (long long)nb0, (long long)nb1)) {
            return 0;
        }
    }
    for (int64_t kb = 0; kb < kblocks; kb++) {
        const int64_t j0 = kb * bn, j1 = j0 + bn < s->nk ? j0 + bn : s->nk;
        int64_t r0, r1;
        int mb0, mb1;
        fp_geom_rows_for_keys(j0, j1, s->nq, s->nk, s->left, s->right, &r0, &r1);
        fp_geom_query_blocks(j0, j1, s->nq, s->nk, s->left, s->right, bm, &mb0, &mb1);
        for (int64_t i = 0; i < s->nq; i++) {
            const int seen = any_visible(s, i, i + 1, j0, j1);
            if (!CHECK_MSG(seen == (i >= r0 && i < r1),
                           "%s: row %lld %s keys [%lld, %lld) but rows_for_keys gives [%lld, %lld)",
                           what, (long long)i, seen ? "sees" : "does not see", (long long)j0,
                           (long long)j1, (long long)r0, (long long)r1))
                return 0;
        }
        int any = 0;
        for (int64_t qb = 0; qb < qblocks; qb++) {
            const int seen = any_visible(s, qb * bm, qb * bm + bm, j0, j1);
            any |= seen;
            if (!CHECK_MSG(seen == (qb >= mb0 && qb < mb1),
                           "%s: query block %lld %s key block %lld, query_blocks [%lld, %lld)",
                           what, (long long)qb, seen ? "feeds" : "does not feed", (long long)kb,
                           (long long)mb0, (long long)mb1))
                return 0;
        }
        if (!any &&
            !CHECK_MSG(mb0 == 0 && mb1 == 0, "%s: empty query block range not (0, 0)", what))
            return 0;
    }
    return 1;
}

static void test_edges(void)
{
    /* left, right pairs: unbounded, causal, a window, windows wider than any sequence here,
     * and windows under which some rows see nothing (right < 0 with a bounded left is not a
     * public input, but left/right of 0 and shifts by Nk - Nq make empty rows). */
    static const int64_t windows[][2] = {{-1, -1}, {-1, 0},   {3, 0},    {0, 0},       {5, 7},
                                         {0, 2},   {100, -1}, {-1, 100}, {1000, 1000}, {2, 1}};
    static const int64_t lens[] = {0, 1, 2, 7, 16, 33, 64, 100};
    static const int blocks[][2] = {{1, 1}, {16, 16}, {64, 32}, {32, 128}, {128, 128}};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
        for (size_t a = 0; a < sizeof lens / sizeof lens[0]; a++)
            for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++)
                for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++) {
                    const shape s = {lens[a], lens[c], windows[w][0], windows[w][1]};
                    if (!check_shape(&s, blocks[k][0], blocks[k][1]))
                        return;
                }
}

static void test_random(void)
{
    tu_rng r = tu_rng_seed(14);
    for (int n = 0; n < 400; n++) {
        shape s;
        s.nq = tu_rng_u32(&r) % 200;
        s.nk = tu_rng_u32(&r) % 200;
        s.left = (int64_t)(tu_rng_u32(&r) % 80) - 1;
        s.right = (int64_t)(tu_rng_u32(&r) % 80) - 1;
        const int bm = 1 + (int)(tu_rng_u32(&r) % 70), bn = 1 + (int)(tu_rng_u32(&r) % 70);
        if (!check_shape(&s, bm, bn))
            return;
    }
}

/* A key block the diagonal of a causal mask crosses needs the per-element mask; one below it
 * does not; one above it is never visited. */
static void test_full_blocks(void)
{
    int nb0, nb1;
    CHECK(!fp_mask_block_full(0, 64, 0, 64, 256, 256, -1, 0));
    CHECK(fp_mask_block_full(64, 128, 0, 64, 256, 256, -1, 0));
    fp_geom_key_blocks(0, 64, 256, 256, -1, 0, 64, &nb0, &nb1);
    CHECK(nb0 == 0 && nb1 == 1);
    /* Nq > Nk, causal: the first Nq - Nk rows see nothing (bottom-right alignment). */
    fp_geom_key_blocks(0, 32, 128, 64, -1, 0, 32, &nb0, &nb1);
    CHECK(nb0 == 0 && nb1 == 0);
    /* Nq < Nk, causal: row 0 sees keys 0 .. Nk - Nq. */
    fp_geom_key_blocks(0, 1, 16, 80, -1, 0, 16, &nb0, &nb1);
    CHECK(nb0 == 0 && nb1 == 5);
}

static void test_seq_lookup(void)
{
    const int32_t cu_q[] = {0, 5, 5, 12}, cu_k[] = {0, 0, 9, 20};
    fp_seq s = fp_seq_lookup(NULL, NULL, 37, 41, 3);
    CHECK(s.q_start == 0 && s.nq == 37 && s.k_start == 0 && s.nk == 41);
    s = fp_seq_lookup(cu_q, cu_k, 7, 11, 0);
    CHECK(s.q_start == 0 && s.nq == 5 && s.k_start == 0 && s.nk == 0);
    s = fp_seq_lookup(cu_q, cu_k, 7, 11, 1);
    CHECK(s.q_start == 5 && s.nq == 0 && s.k_start == 0 && s.nk == 9);
    s = fp_seq_lookup(cu_q, cu_k, 7, 11, 2);
    CHECK(s.q_start == 5 && s.nq == 7 && s.k_start == 9 && s.nk == 11);
}

static void test_exp_base(void)
{
    fp_softmax_state st;
    fp_softmax_init(&st);
    CHECK(fp_softmax_exp_base(&st) == 0.0f);
    CHECK(fp_softmax_weight_exp2(&st, -INFINITY) == 0.0f);
    fp_softmax_update_exp2(&st, 3.5f);
    CHECK(fp_softmax_exp_base(&st) == 3.5f);
    CHECK(fp_softmax_out_scale(&st) == 0.0f); /* l is still 0: nothing added */
    CHECK(fp_softmax_lse_exp2(&st) == -INFINITY);
}

static void check_order(int32_t order, int64_t batch, int64_t heads, int64_t nq)
{
    const fp_plan_shape sh = {batch, heads, nq, nq, 64, -1, 0, heads};
    const fp_plan_target t = {8, 16, 16, 1, order};
    const fp_plan p = fp_plan_forward(&sh, &t);
    CHECK(p.order == order && p.heavy_first == fp_plan_heavy_first(&sh) && p.heavy_first);
    uint8_t *seen = (uint8_t *)calloc((size_t)p.num_tasks + 1, 1);
    if (!CHECK(seen != NULL))
        return;
    for (int64_t i = 0; i < p.num_tasks; i++) {
        const fp_plan_task k = fp_plan_task_at(&p, &sh, i);
        const int64_t idx = (k.batch * heads + k.head) * p.num_q_blocks + k.q_block;
        if (!CHECK_MSG(idx >= 0 && idx < p.num_tasks && !seen[idx],
                       "order %d: task %lld repeats or leaves the grid", (int)order, (long long)i))
            break;
        seen[idx] = 1;
        const int64_t rank =
            order == FP_PLAN_ORDER_LOCALITY ? i % p.num_q_blocks : i / (batch * heads);
        const int64_t bh = order == FP_PLAN_ORDER_LOCALITY ? i / p.num_q_blocks : -1;
        if (!CHECK_MSG(k.q_block == p.num_q_blocks - 1 - rank &&
                           (bh < 0 || bh == k.batch * heads + k.head),
                       "order %d: task %lld is (b %lld, h %lld, qb %lld)", (int)order, (long long)i,
                       (long long)k.batch, (long long)k.head, (long long)k.q_block))
            break;
    }
    free(seen);
}

static void test_orders(void)
{
    check_order(FP_PLAN_ORDER_GRID, 2, 3, 100);
    check_order(FP_PLAN_ORDER_LOCALITY, 2, 3, 100);
    check_order(FP_PLAN_ORDER_LOCALITY, 1, 1, 16);
    const fp_plan_shape window = {1, 1, 64, 64, 64, 8, 8, 1};
    CHECK(!fp_plan_heavy_first(&window));
}

int main(void)
{
    test_edges();
    test_random();
    test_full_blocks();
    test_seq_lookup();
    test_exp_base();
    test_orders();
    return tu_finish("test_geometry", "all checks passed");
}
