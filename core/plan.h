/*
 * Tile planning as pure functions (after FlashAttention's hopper/tile_size.h): given a problem's
 * shape and a backend's target (how many parallel workers, its tile sizes, how far it may split
 * the keys), decide the grid of work. No allocation, no side effects: unit-tested in
 * tests/test_plan.c.
 *
 *   - query blocks per (batch, head): ceil(Nq / block_q);
 *   - KV splits for decode-like shapes (few query blocks, long keys): split the key range so the
 *     machine is filled, combining partial results through the LSE merge (core/online_softmax.h);
 *   - work order: with a causal/windowed mask query blocks differ in cost; tasks are numbered so
 *     the heaviest come first, which keeps a dynamic scheduler (OpenMP dynamic, or a GPU's block
 *     dispatcher) from ending on one long straggler. The target says how tasks are grouped:
 *     FP_PLAN_ORDER_GRID runs one query block of every (batch, head) before the next (a GPU grid,
 *     where all run at once), FP_PLAN_ORDER_LOCALITY keeps the query blocks of one (batch, head)
 *     adjacent (a CPU, whose few threads then stream the same K and V and share them in cache);
 *   - group splits for the backward's dK/dV under GQA/MQA: a GPU block that owns a key block of
 *     a kv head walks the query heads of its group; when (key blocks x kv heads x batch) is too
 *     small a grid, the group is cut into contiguous slices of heads, each slice summed by its own
 *     block and the slices' partial dK/dV added afterwards.
 */
#ifndef FLASHPORT_CORE_PLAN_H
#define FLASHPORT_CORE_PLAN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp_plan_shape {
    int64_t batch, heads;
    int64_t seqlen_q, seqlen_k; /* dense lengths, or varlen maxima */
    int64_t head_dim;
    int64_t window_left, window_right; /* -1 = unbounded; causal is right = 0 */
    int64_t kv_heads; /* GQA/MQA: heads % kv_heads == 0; 0 means kv_heads = heads */
} fp_plan_shape;

enum {
    FP_PLAN_ORDER_GRID = 0,    /* rank of the query block outermost: GPU grids */
    FP_PLAN_ORDER_LOCALITY = 1 /* (batch, head) outermost, query blocks within: CPU threads */
};

typedef struct fp_plan_target {
    int64_t workers;    /* parallel units to fill: CPU threads, or GPU SMs x resident blocks */
    int32_t block_q;    /* query rows per tile */
    int32_t block_k;    /* keys per tile */
    int32_t max_splits; /* upper bound on KV splits; 1 disables split-KV */
    int32_t order;      /* FP_PLAN_ORDER_*; 0 (zero-initialized) is FP_PLAN_ORDER_GRID */
} fp_plan_target;

typedef struct fp_plan {
    int32_t block_q, block_k;
    int64_t num_q_blocks;   /* per (batch, head) */
    int32_t num_splits;     /* KV splits per query block; 1 = none */
    int64_t keys_per_split; /* a multiple of block_k */
    int64_t num_tasks;      /* batch * heads * num_q_blocks * num_splits */
    int32_t heavy_first;    /* 1: later query blocks cost more (causal); they are run first */
    int32_t order;          /* the target's FP_PLAN_ORDER_* */
} fp_plan;

typedef struct fp_plan_task {
    int64_t batch, head, q_block;
    int32_t split;
} fp_plan_task;

/* The plan for a forward pass (the backward uses the same numbering with num_splits = 1). */
fp_plan fp_plan_forward(const fp_plan_shape *shape, const fp_plan_target *target);

/* Whether later query blocks of a shape cost more (a bounded right side with an unbounded left:
 * causal), so that a schedule should run them first. fp_plan_forward's heavy_first; kernels that
 * number their own blocks (the backward's dQ) ask it here. */
int32_t fp_plan_heavy_first(const fp_plan_shape *shape);

/* Task index (0 .. num_tasks - 1) to coordinates, heaviest query blocks first when
 * plan->heavy_first. FP_PLAN_ORDER_GRID: tasks of one query block across (batch, head, split)
 * are adjacent; FP_PLAN_ORDER_LOCALITY: the query blocks (and splits) of one (batch, head) are
 * adjacent. */
fp_plan_task fp_plan_task_at(const fp_plan *plan, const fp_plan_shape *shape, int64_t task);

/* Backward dK/dV under GQA/MQA: into how many contiguous slices of equal size (a divisor of the
 * group, heads / kv_heads) to cut each kv head's query heads, so that the grid of
 * key blocks x kv_heads x batch x splits blocks, one block per worker at a time, gives each of
 * `workers` at least FP_PLAN_BWD_GROUP_WAVES times the heaviest block's work (for equal blocks:
 * that many waves; a causal mask's first key blocks cost twice the average), while each block
 * still walks at least FP_PLAN_BWD_MIN_STEPS (query head, query block) steps on average (block_k
 * stands for the query block too). The smallest such divisor wins: each split adds a partial
 * dK/dV to write and sum. When no divisor gets there, the largest that keeps the steps. 1 (no
 * split) without a group, for empty shapes and when the unsplit grid is enough. */
enum { FP_PLAN_BWD_GROUP_WAVES = 2, FP_PLAN_BWD_MIN_STEPS = 8 };
int32_t fp_plan_backward_group_splits(const fp_plan_shape *shape, int64_t workers, int32_t block_k);

/* Split-KV for the decode kernels (few query rows per kv head, a long cache): `tiles` independent
 * blocks of work (batch x kv heads x query-row tiles) each stream their keys, so the time is the
 * bytes read over the bandwidth the blocks in flight draw. The keys are split until the grid
 * fills the machine's resident block slots (`workers`) in waves that are at least 90 % busy,
 * never below min_split_blocks key blocks per split (the combine then reads at most a few percent
 * of what the splits read) and never above max_splits. */
typedef struct fp_decode_target {
    int64_t workers;          /* resident blocks the device holds at once (SMs x blocks per SM) */
    int32_t block_k;          /* keys per key block */
    int32_t min_split_blocks; /* smallest split, in key blocks */
    int32_t max_splits;       /* 1 disables split-KV */
} fp_decode_target;

typedef struct fp_decode_plan {
    int32_t num_splits;     /* 1 = none */
    int64_t keys_per_split; /* a multiple of block_k; covers seqlen_k in num_splits pieces */
    int64_t num_tasks;      /* tiles * num_splits */
} fp_decode_plan;

fp_decode_plan fp_plan_decode(int64_t tiles, int64_t seqlen_k, const fp_decode_target *target);

/* Number of key blocks that query block q_block must visit (its cost), for a dense problem. */
int64_t fp_plan_block_cost(const fp_plan *plan, const fp_plan_shape *shape, int64_t q_block);

#ifdef __cplusplus
}
#endif

#endif /* FLASHPORT_CORE_PLAN_H */
