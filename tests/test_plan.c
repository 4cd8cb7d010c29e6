/*
 * Unit tests of the tile planner (core/plan.h), a pure function of shape and target.
 *
 * What is checked, and against what:
 *   - num_q_blocks is ceil(Nq / block_q) and num_tasks the product of the grid;
 *   - split-KV: a decode shape (Nq = 1, Nk = 32768, B * H = 4 on 132 workers) splits and fills
 *     the machine; a large prefill does not split; over random shapes the splits never exceed
 *     max_splits, keys_per_split is a multiple of block_k, the splits cover Nk and none is empty;
 *   - task numbering: task -> (b, h, q_block, split) is a bijection onto the grid, and the tasks
 *     of one query block are adjacent;
 *   - heavy_first: for causal masks the first task's query block is the costliest, and costs never
 *     rise along the task order;
 *   - decode split-KV (fp_plan_decode): one kv head of a long cache on an H200-sized machine
 *     splits until the grid's waves are at least 90 % busy; a grid that already fills them does
 *     not split; a tail wave of 29 % is split away; short caches and max_splits = 1 never split;
 *     over random shapes the splits respect max_splits and min_split_blocks, cover Nk with a
 *     multiple of block_k each, and none is empty;
 *   - fp_plan_block_cost equals a brute-force count of key blocks holding at least one visible
 *     (row, key) pair under fp_mask_visible (core/mask.h), for random windows and shapes;
 *   - backward group splits: fixed GQA/MQA shapes on 132 workers give the expected split counts
 *     (MQA 64:1 at B = 4, N = 1024 splits 16 ways; GQA 8:1 at B = 4, N = 4096 and every shape
 *     without a group do not split); over random shapes the result divides the group, keeps each
 *     block's average steps (counted by brute force over fp_mask_visible) at or above the minimum,
 *     and is the smallest divisor that gives each worker the target multiple of the heaviest
 *     block's steps, or the largest allowed when none does.
 */
#include "core/mask.h"
#include "core/plan.h"
#include "tests/test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static fp_plan_shape make_shape(int64_t b, int64_t h, int64_t nq, int64_t nk, int64_t d,
                                int64_t left, int64_t right)
{
    fp_plan_shape s;
    s.batch = b;
    s.heads = h;
    s.seqlen_q = nq;
    s.seqlen_k = nk;
    s.head_dim = d;
    s.window_left = left;
    s.window_right = right;
    s.kv_heads = h;
    return s;
}

static fp_plan_target make_target(int64_t workers, int32_t bq, int32_t bk, int32_t max_splits)
{
    fp_plan_target t;
    t.workers = workers;
    t.block_q = bq;
    t.block_k = bk;
    t.max_splits = max_splits;
    t.order = FP_PLAN_ORDER_GRID;
    return t;
}

/* Invariants every plan must satisfy; `what` names the shape in failure messages. */
static void check_plan_invariants(const fp_plan *p, const fp_plan_shape *s, const fp_plan_target *t,
                                  const char *what)
{
    CHECK_MSG(p->block_q == t->block_q && p->block_k == t->block_k, "%s: tile sizes changed", what);
    CHECK_MSG(p->num_q_blocks == ceil_div(s->seqlen_q, t->block_q),
              "%s: num_q_blocks %lld, expected ceil(%lld / %d)", what, (long long)p->num_q_blocks,
              (long long)s->seqlen_q, (int)t->block_q);
    CHECK_MSG(p->num_splits >= 1, "%s: num_splits %d < 1", what, (int)p->num_splits);
    int32_t cap = t->max_splits > 1 ? t->max_splits : 1;
    CHECK_MSG(p->num_splits <= cap, "%s: num_splits %d exceeds max_splits %d", what,
              (int)p->num_splits, (int)t->max_splits);
    CHECK_MSG(p->num_tasks == s->batch * s->heads * p->num_q_blocks * p->num_splits,
              "%s: num_tasks %lld is not B * H * q_blocks * splits", what, (long long)p->num_tasks);
    if (s->seqlen_k > 0) {
        CHECK_MSG(p->keys_per_split > 0 && p->keys_per_split % t->block_k == 0,
                  "%s: keys_per_split %lld is not a positive multiple of block_k %d", what,
                  (long long)p->keys_per_split, (int)t->block_k);
        CHECK_MSG(p->keys_per_split * p->num_splits >= s->seqlen_k,
                  "%s: %d splits of %lld keys do not cover Nk = %lld", what, (int)p->num_splits,
                  (long long)p->keys_per_split, (long long)s->seqlen_k);
        CHECK_MSG(p->keys_per_split * (p->num_splits - 1) < s->seqlen_k,
                  "%s: the last of %d splits of %lld keys is empty (Nk = %lld)", what,
                  (int)p->num_splits, (long long)p->keys_per_split, (long long)s->seqlen_k);
        if (p->num_splits > 1)
            CHECK_MSG(p->keys_per_split >= 2 * t->block_k,
                      "%s: a split keeps %lld keys, fewer than two key blocks", what,
                      (long long)p->keys_per_split);
    }
}

static void test_q_blocks(void)
{
    const int64_t nqs[] = {0, 1, 63, 64, 65, 127, 128, 129, 1000};
    const int32_t bqs[] = {1, 16, 64, 128};
    for (size_t i = 0; i < sizeof nqs / sizeof nqs[0]; i++)
        for (size_t j = 0; j < sizeof bqs / sizeof bqs[0]; j++) {
            fp_plan_shape s = make_shape(2, 3, nqs[i], 100, 64, -1, -1);
            fp_plan_target t = make_target(8, bqs[j], 32, 1);
            fp_plan p = fp_plan_forward(&s, &t);
            char what[64];
            snprintf(what, sizeof what, "Nq=%lld block_q=%d", (long long)nqs[i], (int)bqs[j]);
            check_plan_invariants(&p, &s, &t, what);
            CHECK_MSG(p.num_splits == 1, "%s: max_splits = 1 must disable splitting", what);
        }
}

static void test_split_decisions(void)
{
    /* Decode: one query row, long context, 4 (b, h) pairs on an H100-like 132 workers. */
    fp_plan_shape dec = make_shape(1, 4, 1, 32768, 128, -1, -1);
    fp_plan_target gpu = make_target(132, 64, 128, 128);
    fp_plan p = fp_plan_forward(&dec, &gpu);
    check_plan_invariants(&p, &dec, &gpu, "decode");
    CHECK_MSG(p.num_splits > 1, "decode shape did not split (num_splits %d)", (int)p.num_splits);
    /* Splitting must actually fill the machine: at least 80% of one wave busy. */
    CHECK_MSG(p.num_tasks * 5 >= gpu.workers * 4 && p.num_tasks <= gpu.workers,
              "decode plan has %lld tasks for %lld workers", (long long)p.num_tasks,
              (long long)gpu.workers);
    printf("decode B*H=4 Nk=32768 on 132 workers: %d splits of %lld keys, %lld tasks\n",
           (int)p.num_splits, (long long)p.keys_per_split, (long long)p.num_tasks);

    fp_plan_target capped = make_target(132, 64, 128, 4);
    p = fp_plan_forward(&dec, &capped);
    check_plan_invariants(&p, &dec, &capped, "decode, max_splits 4");
    CHECK_MSG(p.num_splits == 4, "decode with max_splits 4 gave %d splits", (int)p.num_splits);

    /* Prefill: B=4, H=32, N=8192 gives thousands of tasks; splitting only adds combine work. */
    fp_plan_shape pre = make_shape(4, 32, 8192, 8192, 128, -1, 0);
    p = fp_plan_forward(&pre, &gpu);
    check_plan_invariants(&p, &pre, &gpu, "prefill");
    CHECK_MSG(p.num_splits == 1, "prefill split into %d", (int)p.num_splits);

    /* Short keys: fewer than four key blocks never split. */
    fp_plan_shape short_k = make_shape(1, 1, 1, 3 * 128, 128, -1, -1);
    p = fp_plan_forward(&short_k, &gpu);
    check_plan_invariants(&p, &short_k, &gpu, "short keys");
    CHECK_MSG(p.num_splits == 1, "3 key blocks split into %d", (int)p.num_splits);
}

static void test_random_plans(void)
{
    tu_rng r = tu_rng_seed(1234);
    for (int it = 0; it < 20000; it++) {
        int64_t b = 1 + tu_rng_u32(&r) % 4, h = 1 + tu_rng_u32(&r) % 16;
        int64_t nq = tu_rng_u32(&r) % 3 == 0 ? 1 + tu_rng_u32(&r) % 4 : tu_rng_u32(&r) % 5000;
        int64_t nk = tu_rng_u32(&r) % 70000;
        int32_t bq = (int32_t)(16 << (tu_rng_u32(&r) % 4));
        int32_t bk = (int32_t)(16 << (tu_rng_u32(&r) % 4));
        int32_t max_splits = (int32_t)(tu_rng_u32(&r) % 200);
        int64_t workers = 1 + tu_rng_u32(&r) % 300;
        int64_t left = (int64_t)(tu_rng_u32(&r) % 3) - 1, right = (int64_t)(tu_rng_u32(&r) % 3) - 1;
        fp_plan_shape s = make_shape(b, h, nq, nk, 64, left, right);
        fp_plan_target t = make_target(workers, bq, bk, max_splits);
        fp_plan p = fp_plan_forward(&s, &t);
        char what[160];
        snprintf(what, sizeof what, "B%lld H%lld Nq%lld Nk%lld bq%d bk%d max_splits%d workers%lld",
                 (long long)b, (long long)h, (long long)nq, (long long)nk, (int)bq, (int)bk,
                 (int)max_splits, (long long)workers);
        int before = tu_failures;
        check_plan_invariants(&p, &s, &t, what);
        if (tu_failures != before)
            break; /* one failing shape is enough to read */
    }
}

/* Visits every task of a plan: a bijection onto the grid, query blocks adjacent, and under
 * heavy_first costs never rising. */
static void check_task_order(const fp_plan_shape *s, const fp_plan_target *t, const char *what)
{
    fp_plan p = fp_plan_forward(s, t);
    int64_t n = p.num_tasks;
    uint8_t *seen = (uint8_t *)calloc((size_t)(n > 0 ? n : 1), 1);
    if (!CHECK(seen != NULL))
        return;
    int64_t prev_block = -1, prev_cost = INT64_MAX, max_cost = 0;
    int64_t per_block = s->batch * s->heads * p.num_splits;
    for (int64_t qb = 0; qb < p.num_q_blocks; qb++) {
        int64_t c = fp_plan_block_cost(&p, s, qb);
        if (c > max_cost)
            max_cost = c;
    }
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        fp_plan_task k = fp_plan_task_at(&p, s, i);
        ok = CHECK_MSG(k.batch >= 0 && k.batch < s->batch && k.head >= 0 && k.head < s->heads &&
                           k.q_block >= 0 && k.q_block < p.num_q_blocks && k.split >= 0 &&
                           k.split < p.num_splits,
                       "%s: task %lld maps outside the grid", what, (long long)i);
        if (!ok)
            break;
        int64_t idx =
            ((k.batch * s->heads + k.head) * p.num_q_blocks + k.q_block) * p.num_splits + k.split;
        ok = CHECK_MSG(!seen[idx], "%s: task %lld repeats (b %lld, h %lld, qb %lld, split %d)",
                       what, (long long)i, (long long)k.batch, (long long)k.head,
                       (long long)k.q_block, (int)k.split);
        seen[idx] = 1;
        if (i % per_block == 0) {
            prev_block = k.q_block;
        } else {
            ok = ok && CHECK_MSG(k.q_block == prev_block,
                                 "%s: tasks of query block %lld are not adjacent", what,
                                 (long long)prev_block);
        }
        int64_t cost = fp_plan_block_cost(&p, s, k.q_block);
        if (i == 0 && p.heavy_first)
            ok = ok && CHECK_MSG(cost == max_cost,
                                 "%s: first task's block costs %lld, the costliest %lld", what,
                                 (long long)cost, (long long)max_cost);
        if (p.heavy_first)
            ok = ok && CHECK_MSG(cost <= prev_cost, "%s: cost rises from %lld to %lld at task %lld",
                                 what, (long long)prev_cost, (long long)cost, (long long)i);
        prev_cost = cost;
    }
    /* Bijection: n tasks, each distinct, onto a grid of n cells. */
    for (int64_t i = 0; i < n && ok; i++)
        ok = CHECK_MSG(seen[i], "%s: grid cell %lld is never visited", what, (long long)i);
    free(seen);
}

static void test_task_order(void)
{
    fp_plan_target gpu = make_target(132, 64, 128, 128);
    fp_plan_target cpu = make_target(16, 64, 64, 1);
    /* Causal prefill: later query blocks see more keys. */
    fp_plan_shape causal = make_shape(2, 3, 1000, 1000, 64, -1, 0);
    fp_plan p = fp_plan_forward(&causal, &cpu);
    CHECK_MSG(p.heavy_first, "causal plan is not heavy_first");
    fp_plan_task first = fp_plan_task_at(&p, &causal, 0);
    CHECK_MSG(first.q_block == p.num_q_blocks - 1, "causal: first task runs block %lld of %lld",
              (long long)first.q_block, (long long)p.num_q_blocks);
    check_task_order(&causal, &cpu, "causal");
    /* Causal with Nq > Nk (leading rows see nothing) and Nq < Nk. */
    fp_plan_shape tall = make_shape(1, 2, 777, 300, 64, -1, 0);
    check_task_order(&tall, &cpu, "causal Nq > Nk");
    fp_plan_shape wide = make_shape(1, 2, 300, 777, 64, -1, 0);
    check_task_order(&wide, &cpu, "causal Nq < Nk");
    /* Split decode shape, then plain and windowed shapes in natural order. */
    fp_plan_shape dec = make_shape(2, 2, 1, 32768, 128, -1, -1);
    check_task_order(&dec, &gpu, "decode split");
    fp_plan_shape dec_causal = make_shape(1, 4, 3, 20000, 128, -1, 0);
    check_task_order(&dec_causal, &gpu, "causal decode split");
    fp_plan_shape full = make_shape(3, 5, 200, 130, 64, -1, -1);
    check_task_order(&full, &cpu, "no mask");
    fp_plan_shape win = make_shape(2, 2, 500, 500, 64, 64, 0);
    check_task_order(&win, &cpu, "sliding window");
    fp_plan_shape empty = make_shape(2, 2, 0, 100, 64, -1, 0);
    check_task_order(&empty, &cpu, "Nq = 0");
}

/* Key blocks holding at least one (row, key) pair of the query block that the mask shows. */
static int64_t brute_cost(const fp_plan *p, const fp_plan_shape *s, int64_t qb)
{
    int64_t i0 = qb * p->block_q, i1 = i0 + p->block_q;
    if (i1 > s->seqlen_q)
        i1 = s->seqlen_q;
    int64_t blocks = 0;
    for (int64_t j0 = 0; j0 < s->seqlen_k; j0 += p->block_k) {
        int any = 0;
        for (int64_t i = i0; i < i1 && !any; i++)
            for (int64_t j = j0; j < j0 + p->block_k && j < s->seqlen_k && !any; j++)
                any = fp_mask_visible(i, j, s->seqlen_q, s->seqlen_k, s->window_left,
                                      s->window_right);
        blocks += any;
    }
    return blocks;
}

static void test_block_cost(void)
{
    tu_rng r = tu_rng_seed(99);
    int fails = 0;
    for (int it = 0; it < 3000 && fails < 5; it++) {
        int64_t nq = 1 + tu_rng_u32(&r) % 150, nk = 1 + tu_rng_u32(&r) % 150;
        int64_t left = (int64_t)(tu_rng_u32(&r) % 60) - 1;
        int64_t right = (int64_t)(tu_rng_u32(&r) % 60) - 1;
        if (tu_rng_u32(&r) % 4 == 0)
            right = 0; /* causal-like */
        if (tu_rng_u32(&r) % 4 == 0)
            left = -1;
        int32_t bq = (int32_t)(1 + tu_rng_u32(&r) % 40), bk = (int32_t)(1 + tu_rng_u32(&r) % 40);
        fp_plan_shape s = make_shape(1, 1, nq, nk, 64, left, right);
        fp_plan_target t = make_target(4, bq, bk, 1);
        fp_plan p = fp_plan_forward(&s, &t);
        for (int64_t qb = 0; qb < p.num_q_blocks; qb++) {
            int64_t got = fp_plan_block_cost(&p, &s, qb), want = brute_cost(&p, &s, qb);
            if (!CHECK_MSG(got == want,
                           "block cost Nq %lld Nk %lld window (%lld, %lld) bq %d bk %d block "
                           "%lld: %lld, brute force %lld",
                           (long long)nq, (long long)nk, (long long)left, (long long)right, (int)bq,
                           (int)bk, (long long)qb, (long long)got, (long long)want)) {
                fails++;
                break;
            }
        }
    }
}

/* Query blocks of block_k rows that see key block kb: brute force over fp_mask_visible. */
static int64_t brute_visits(const fp_plan_shape *s, int32_t bk, int64_t kb)
{
    int64_t n = 0;
    for (int64_t mb = 0; mb * bk < s->seqlen_q; mb++) {
        int seen = 0;
        for (int64_t i = mb * bk; i < (mb + 1) * bk && i < s->seqlen_q && !seen; i++)
            for (int64_t j = kb * bk; j < (kb + 1) * bk && j < s->seqlen_k && !seen; j++)
                seen = fp_mask_visible(i, j, s->seqlen_q, s->seqlen_k, s->window_left,
                                       s->window_right);
        n += seen;
    }
    return n;
}

static fp_plan_shape make_gqa(int64_t b, int64_t h, int64_t hkv, int64_t nq, int64_t nk, int causal)
{
    fp_plan_shape s = make_shape(b, h, nq, nk, 128, -1, causal ? 0 : -1);
    s.kv_heads = hkv;
    return s;
}

/* fp_plan_backward_group_splits on 132 workers (an H200's SMs) and key blocks of 128 against the
 * expected count. */
static void check_splits(const char *name, const fp_plan_shape *s, int32_t want)
{
    const int32_t got = fp_plan_backward_group_splits(s, 132, 128);
    CHECK_MSG(got == want, "%s: %d splits, want %d", name, (int)got, (int)want);
}

static void test_group_splits(void)
{
    /* MQA 64:1, B = 4, N = 1024, key blocks of 128: 32 blocks unsplit; 16 splits (512 blocks)
     * is the first divisor past two waves of 132, and each block keeps 4 heads x 8 blocks. */
    fp_plan_shape mqa = make_gqa(4, 64, 1, 1024, 1024, 0);
    check_splits("MQA 64:1 B4 N1024", &mqa, 16);
    /* GQA 8:1 at B = 4, N = 4096: 512 blocks unsplit, enough. */
    fp_plan_shape gqa = make_gqa(4, 32, 4, 4096, 4096, 0);
    check_splits("GQA 8:1 B4 N4096", &gqa, 1);
    /* ... at B = 3 with a causal mask: 384 blocks are 2.9 waves, but the first key blocks see 32
     * query blocks and the average 16.5, so a worker's share (16.5 x 384 / 132 = 48 block
     * visits) is under twice the heaviest (32): 2 splits. */
    fp_plan_shape gqa_causal = make_gqa(3, 32, 4, 4096, 4096, 1);
    check_splits("GQA 8:1 B3 N4096 causal", &gqa_causal, 2);
    /* GQA 8:1 at B = 1, N = 1024: 32 blocks; no divisor of 8 reaches 264, the whole group does. */
    fp_plan_shape gqa1 = make_gqa(1, 32, 4, 1024, 1024, 0);
    check_splits("GQA 8:1 B1 N1024", &gqa1, 8);
    /* Short sequences: 2 key blocks that each see 2 query blocks; 16 heads allow 4 splits of 4
     * heads (8 steps), not 8 splits of 2 (4 steps). */
    fp_plan_shape tiny = make_gqa(1, 16, 1, 200, 200, 0);
    check_splits("MQA 16:1 N200", &tiny, 4);
    /* No group, kv_heads 0 (= heads), empty shapes: no split. */
    fp_plan_shape mha = make_gqa(1, 16, 16, 1024, 1024, 0);
    check_splits("MHA", &mha, 1);
    mha.kv_heads = 0;
    check_splits("MHA, kv_heads 0", &mha, 1);
    fp_plan_shape none = make_gqa(1, 16, 1, 0, 1024, 0);
    check_splits("Nq 0", &none, 1);
    none = make_gqa(1, 16, 1, 1024, 0, 0);
    check_splits("Nk 0", &none, 1);

    tu_rng r = tu_rng_seed(4321);
    for (int it = 0; it < 300; it++) {
        const int64_t hkv = 1 + tu_rng_u32(&r) % 3, group = 1 + tu_rng_u32(&r) % 24;
        const int64_t b = 1 + tu_rng_u32(&r) % 3;
        const int64_t nq = 1 + tu_rng_u32(&r) % 400, nk = 1 + tu_rng_u32(&r) % 400;
        const int32_t bk = (int32_t)(32 << (tu_rng_u32(&r) % 3));
        const int64_t workers = 1 + tu_rng_u32(&r) % 160;
        const int64_t left = (int64_t)(tu_rng_u32(&r) % 4) * 40 - 1;
        const int64_t right = (int64_t)(tu_rng_u32(&r) % 3) - 1;
        fp_plan_shape s = make_shape(b, hkv * group, nq, nk, 64, left, right);
        s.kv_heads = hkv;
        const int32_t got = fp_plan_backward_group_splits(&s, workers, bk);
        const int64_t kblocks = (nk + bk - 1) / bk;
        int64_t visits = 0, most = 0;
        for (int64_t kb = 0; kb < kblocks; kb++) {
            const int64_t v = brute_visits(&s, bk, kb);
            visits += v;
            most = v > most ? v : most;
        }
        /* enough: each worker's share of the steps at least the waves times the heaviest block */
        const int64_t have = visits * hkv * b, need = FP_PLAN_BWD_GROUP_WAVES * workers * most;
        char what[160];
        snprintf(what, sizeof what,
                 "B%lld H%lld Hkv%lld Nq%lld Nk%lld window (%lld, %lld) bk%d "
                 "workers%lld: %d splits",
                 (long long)b, (long long)(hkv * group), (long long)hkv, (long long)nq,
                 (long long)nk, (long long)left, (long long)right, (int)bk, (long long)workers,
                 (int)got);
        /* allowed: a divisor of the group whose blocks keep the minimum average steps */
        int64_t want = 1;
        int reached = visits == 0 || have >= need;
        for (int64_t n = 2; n <= group && !reached; n++) {
            if (group % n || (group / n) * visits < FP_PLAN_BWD_MIN_STEPS * kblocks)
                continue;
            want = n;
            reached = have * n >= need;
        }
        if (!CHECK_MSG(got == want && group % got == 0, "%s, expected %lld", what, (long long)want))
            break;
    }
}

/* Busy fraction of the waves of `tasks` on `workers` (the planner's measure, recomputed). */
static double waves_busy(int64_t tasks, int64_t workers)
{
    return (double)tasks / (double)(ceil_div(tasks, workers) * workers);
}

static void check_decode_invariants(const fp_decode_plan *p, int64_t tiles, int64_t nk,
                                    const fp_decode_target *t, const char *what)
{
    const int64_t k_blocks = ceil_div(nk, t->block_k);
    CHECK_MSG(p->num_splits >= 1, "%s: num_splits %d < 1", what, (int)p->num_splits);
    CHECK_MSG(p->num_splits == 1 || p->num_splits <= t->max_splits,
              "%s: %d splits exceed max_splits %d", what, (int)p->num_splits, (int)t->max_splits);
    CHECK_MSG(p->num_tasks == tiles * p->num_splits, "%s: num_tasks %lld != tiles * splits", what,
              (long long)p->num_tasks);
    CHECK_MSG(p->keys_per_split > 0 && p->keys_per_split % t->block_k == 0,
              "%s: keys_per_split %lld not a positive multiple of %d", what,
              (long long)p->keys_per_split, (int)t->block_k);
    if (nk > 0) {
        CHECK_MSG(p->keys_per_split * p->num_splits >= nk &&
                      p->keys_per_split * (p->num_splits - 1) < nk,
                  "%s: %d splits of %lld keys do not tile Nk = %lld without an empty one", what,
                  (int)p->num_splits, (long long)p->keys_per_split, (long long)nk);
        CHECK_MSG(p->num_splits == 1 || p->num_splits <= k_blocks / t->min_split_blocks,
                  "%s: %d splits of a %lld-block cache, below %d blocks each", what,
                  (int)p->num_splits, (long long)k_blocks, (int)t->min_split_blocks);
    }
}

static void test_decode_splits(void)
{
    /* H200: 132 SMs x 3 resident decode blocks; key blocks of 64, splits of 4 blocks or more. */
    fp_decode_target t = {132 * 3, 64, 4, 128};
    /* B = 1, Hkv = 8, Nk = 131072: 8 tiles would leave 388 of 396 slots idle. */
    fp_decode_plan p = fp_plan_decode(8, 131072, &t);
    check_decode_invariants(&p, 8, 131072, &t, "B1 Hkv8 Nk128k");
    CHECK_MSG(p.num_splits > 1 && waves_busy(p.num_tasks, t.workers) >= 0.9,
              "B1 Hkv8: %d splits, waves %.2f busy", (int)p.num_splits,
              waves_busy(p.num_tasks, t.workers));
    printf("decode 8 tiles, Nk=131072, 396 workers: %d splits of %lld keys\n", (int)p.num_splits,
           (long long)p.keys_per_split);
    /* 792 tiles: two full waves, nothing to gain. */
    p = fp_plan_decode(792, 8192, &t);
    check_decode_invariants(&p, 792, 8192, &t, "792 tiles");
    CHECK_MSG(p.num_splits == 1, "two full waves split into %d", (int)p.num_splits);
    /* 512 tiles: a second wave 29 % busy; splitting brings the waves to 90 % or more. */
    p = fp_plan_decode(512, 65536, &t);
    check_decode_invariants(&p, 512, 65536, &t, "512 tiles");
    CHECK_MSG(p.num_splits > 1 && waves_busy(p.num_tasks, t.workers) >= 0.9,
              "512 tiles: %d splits, waves %.2f busy", (int)p.num_splits,
              waves_busy(p.num_tasks, t.workers));
    /* A cache of 7 key blocks cannot make two splits of 4. */
    p = fp_plan_decode(1, 7 * 64, &t);
    check_decode_invariants(&p, 1, 7 * 64, &t, "7 blocks");
    CHECK_MSG(p.num_splits == 1, "7 key blocks split into %d", (int)p.num_splits);
    /* An empty cache: one split, no task of zero keys counted as work. */
    p = fp_plan_decode(4, 0, &t);
    CHECK_MSG(p.num_splits == 1 && p.num_tasks == 4, "empty cache: %d splits, %lld tasks",
              (int)p.num_splits, (long long)p.num_tasks);
    fp_decode_target one = t;
    one.max_splits = 1;
    p = fp_plan_decode(1, 1 << 20, &one);
    CHECK_MSG(p.num_splits == 1, "max_splits 1 gave %d splits", (int)p.num_splits);
    srand(18);
    for (int it = 0; it < 2000; ++it) {
        fp_decode_target r = {1 + rand() % 1000, 16 << (rand() % 3), 1 + rand() % 8,
                              1 + rand() % 200};
        const int64_t tiles = rand() % 3000, nk = rand() % 300000;
        p = fp_plan_decode(tiles, nk, &r);
        check_decode_invariants(&p, tiles, nk, &r, "random decode plan");
    }
}

int main(void)
{
    test_q_blocks();
    test_split_decisions();
    test_random_plans();
    test_task_order();
    test_block_cost();
    test_group_splits();
    test_decode_splits();
    return tu_finish("test_plan", "all checks passed");
}
