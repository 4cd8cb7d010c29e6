/*
 * Tile planning (see core/plan.h).
 */
#include "core/plan.h"

#include "core/geometry.h"

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

int64_t fp_plan_block_cost(const fp_plan *plan, const fp_plan_shape *s, int64_t q_block)
{
    int64_t i0 = q_block * plan->block_q;
    int64_t i1 = i0 + plan->block_q;
    if (i1 > s->seqlen_q)
        i1 = s->seqlen_q;
    if (i1 <= i0)
        return 0;
    int nb0, nb1;
    fp_geom_key_blocks(i0, i1, s->seqlen_q, s->seqlen_k, s->window_left, s->window_right,
                       plan->block_k, &nb0, &nb1);
    return nb1 - nb0;
}

/* Busy fraction of all waves when `tasks` equal tasks run on `workers` (a grid smaller than the
 * machine counts its idle workers too). */
static double wave_efficiency(int64_t tasks, int64_t workers)
{
    int64_t waves = ceil_div(tasks, workers);
    return (double)tasks / (double)(waves * workers);
}

int32_t fp_plan_heavy_first(const fp_plan_shape *s)
{
    /* A bounded right side with an unbounded left (causal) makes later query blocks the heavier
     * ones; with the left side bounded the cost is flat or falls, and natural order is right. */
    return s->window_right >= 0 && s->window_left < 0;
}

fp_plan fp_plan_forward(const fp_plan_shape *s, const fp_plan_target *t)
{
    fp_plan p;
    p.block_q = t->block_q;
    p.block_k = t->block_k;
    p.num_q_blocks = s->seqlen_q > 0 ? ceil_div(s->seqlen_q, t->block_q) : 0;
    p.heavy_first = fp_plan_heavy_first(s);
    p.order = t->order;

    int64_t k_blocks = s->seqlen_k > 0 ? ceil_div(s->seqlen_k, t->block_k) : 0;
    int64_t base_tasks = s->batch * s->heads * p.num_q_blocks;
    int32_t splits = 1;
    /* Split only when the unsplit grid leaves most workers idle and each split keeps at least
     * two key blocks (below that the combine costs more than it saves). Among the split counts
     * pick the smallest whose wave efficiency is within 85% of the best: fewer splits mean less
     * combine traffic. */
    if (t->max_splits > 1 && base_tasks > 0 && base_tasks * 5 < t->workers * 4 && k_blocks >= 4) {
        int64_t max_s = t->max_splits;
        if (max_s > k_blocks / 2)
            max_s = k_blocks / 2;
        double best = 0.0;
        for (int64_t n = 1; n <= max_s; n++) {
            double e = wave_efficiency(base_tasks * n, t->workers);
            if (e > best)
                best = e;
        }
        for (int64_t n = 1; n <= max_s; n++) {
            double e = wave_efficiency(base_tasks * n, t->workers);
            if (e >= 0.85 * best) {
                splits = (int32_t)n;
                break;
            }
        }
    }
    p.num_splits = splits;
    p.keys_per_split = ceil_div(k_blocks, splits) * t->block_k;
    /* Recount: rounding keys_per_split up can leave trailing splits empty. */
    if (p.keys_per_split > 0)
        p.num_splits = (int32_t)ceil_div(s->seqlen_k, p.keys_per_split);
    if (p.num_splits < 1)
        p.num_splits = 1;
    p.num_tasks = base_tasks * p.num_splits;
    return p;
}

fp_decode_plan fp_plan_decode(int64_t tiles, int64_t seqlen_k, const fp_decode_target *t)
{
    fp_decode_plan p;
    const int64_t k_blocks = seqlen_k > 0 ? ceil_div(seqlen_k, t->block_k) : 0;
    int64_t cap = t->min_split_blocks > 0 ? k_blocks / t->min_split_blocks : k_blocks;
    if (cap > t->max_splits)
        cap = t->max_splits;
    int64_t splits = 1;
    if (tiles > 0 && t->workers > 0 && cap > 1) {
        /* The fewest splits whose waves are 90 % busy; failing that, the busiest. A grid of
         * less than one wave counts its idle slots, so a small grid always splits. */
        double best = wave_efficiency(tiles, t->workers);
        for (int64_t n = 1; n <= cap; n++) {
            const double e = wave_efficiency(tiles * n, t->workers);
            if (e >= 0.9) {
                splits = n;
                break;
            }
            if (e > best + 1e-9) {
                best = e;
                splits = n;
            }
        }
    }
    p.keys_per_split = k_blocks > 0 ? ceil_div(k_blocks, splits) * t->block_k : t->block_k;
    /* Recount: rounding keys_per_split up can leave trailing splits empty. */
    p.num_splits = k_blocks > 0 ? (int32_t)ceil_div(seqlen_k, p.keys_per_split) : 1;
    p.num_tasks = tiles * p.num_splits;
    return p;
}

fp_plan_task fp_plan_task_at(const fp_plan *p, const fp_plan_shape *s, int64_t task)
{
    fp_plan_task out;
    int64_t rank, rest; /* rank: position of the query block in the work order */
    if (p->order == FP_PLAN_ORDER_LOCALITY) {
        const int64_t per_bh = p->num_q_blocks * p->num_splits;
        const int64_t bh = task / per_bh;
        rest = task % per_bh;
        out.split = (int32_t)(rest % p->num_splits);
        rank = rest / p->num_splits;
        out.head = bh % s->heads;
        out.batch = bh / s->heads;
    } else {
        const int64_t per_block = s->batch * s->heads * p->num_splits;
        rank = task / per_block;
        rest = task % per_block;
        out.split = (int32_t)(rest % p->num_splits);
        rest /= p->num_splits;
        out.head = rest % s->heads;
        out.batch = rest / s->heads;
    }
    /* heavy_first: later query blocks see more keys (see fp_plan_forward), so run them first. */
    out.q_block = p->heavy_first ? p->num_q_blocks - 1 - rank : rank;
    return out;
}

int32_t fp_plan_backward_group_splits(const fp_plan_shape *s, int64_t workers, int32_t block_k)
{
    const int64_t kv = s->kv_heads > 0 ? s->kv_heads : s->heads;
    if (kv <= 0 || s->heads % kv != 0 || workers <= 0 || block_k <= 0 || s->batch <= 0 ||
        s->seqlen_q <= 0 || s->seqlen_k <= 0)
        return 1;
    const int64_t group = s->heads / kv;
    if (group <= 1)
        return 1;
    /* Query blocks (per head) that the key blocks visit: in all, and the most of one key block.
     * A block of a slice of g heads walks g times its key block's visits. */
    const int64_t k_blocks = ceil_div(s->seqlen_k, block_k);
    int64_t visits = 0, most = 0;
    for (int64_t kb = 0; kb < k_blocks; kb++) {
        const int64_t j1 = (kb + 1) * block_k < s->seqlen_k ? (kb + 1) * block_k : s->seqlen_k;
        int mb0, mb1;
        fp_geom_query_blocks(kb * block_k, j1, s->seqlen_q, s->seqlen_k, s->window_left,
                             s->window_right, block_k, &mb0, &mb1);
        visits += mb1 - mb0;
        most = mb1 - mb0 > most ? mb1 - mb0 : most;
    }
    /* n splits: each worker's share, group * visits * kv * batch / workers steps, against the
     * heaviest block's group / n * most: enough when visits * kv * batch * n >= waves * workers *
     * most */
    const int64_t have = visits * kv * s->batch, need = FP_PLAN_BWD_GROUP_WAVES * workers * most;
    if (visits == 0 || have >= need)
        return 1;
    int32_t best = 1;
    for (int64_t n = 2; n <= group; n++) {
        if (group % n != 0)
            continue;
        /* average steps of a block: (group / n) heads x visits / k_blocks query blocks */
        if ((group / n) * visits < FP_PLAN_BWD_MIN_STEPS * k_blocks)
            break;
        best = (int32_t)n;
        if (have * n >= need)
            break;
    }
    return best;
}
