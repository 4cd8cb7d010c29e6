/*
 * Planning and launching the HIP backend's attention kernels (attention_tile.h) on the caller's
 * stream. The grid comes from core/plan.h (fp_plan_forward): query blocks per (batch, head),
 * heaviest first for causal masks, and KV splits for decode-like shapes, whose f32 partials the
 * combine kernel merges. The planner's worker count is compute units x resident blocks of the
 * chosen kernel (the runtime's occupancy query).
 *
 * The backward is deterministic in every mode (flashport_attention_params.deterministic is
 * honoured trivially): dK/dV accumulate in registers of one block per key block, GQA heads
 * included, and dQ is a separate pass over query blocks; no float atomics anywhere. The price is
 * recomputing S and dP in the dQ pass (7 matmuls per tile pair instead of 5).
 */
#include "backends/hip/hip_host.h"

#include "core/plan.h"
#include "core/problem.h"

#include <stdlib.h>
#include <string.h>

#define FP_HIP_MAX_SPLITS  32
#define FP_HIP_GRID_YZ_MAX 65535

static int aligned_view(const fp_tensor_view *t)
{
    return !t->data || ((uintptr_t)t->data % 16 == 0 && t->stride[FP_B] % 8 == 0 &&
                        t->stride[FP_S] % 8 == 0 && t->stride[FP_H] % 8 == 0);
}

/* The kernels' block of a validated problem: core's fill and this backend's own fields. */
static void make_args(const fp_problem *p, fp_hip_args *a)
{
    memset(a, 0, sizeof *a);
    fp_kernel_args_fill(p, a);
    a->kv_heads = (int)p->kv_heads;
    a->total_q = p->total_q;
    const fp_tensor_view *views[] = {&p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv};
    a->vec_ok = 1;
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++)
        a->vec_ok &= aligned_view(views[i]);
    a->pack_group = 1;
}

/* GQA packing for the forward (fp_hip_args.pack_group): where the H / Hkv heads of a kv head have
 * few query rows in all (Nq * H / Hkv <= FP_HIP_PACK_MAX_ROWS: decode and speculative decoding),
 * one block takes them all, so K and V are read once per kv head instead of once per head, and
 * the query tile is filled instead of holding Nq rows. FLASHPORT_HIP_PACK_GQA (read at each call,
 * for tests): 1 packs every GQA forward, 0 none. */
#define FP_HIP_PACK_MAX_ROWS 64

static int pack_group(const fp_problem *p)
{
    const int group = (int)(p->heads / p->kv_heads);
    if (group == 1)
        return 1;
    const char *force = getenv("FLASHPORT_HIP_PACK_GQA");
    if (force && *force)
        return atoi(force) ? group : 1;
    return p->seqlen_q * group <= FP_HIP_PACK_MAX_ROWS ? group : 1;
}

static fp_plan plan_for(const fp_hip_ctx *ctx, const fp_problem *p, fp_hip_kernel_fn kernel,
                        int dmax, int backward, int pack)
{
    int bq, bk, per_cu = 0;
    fp_hip_tiles(dmax, backward, &bq, &bk);
    if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_cu, (const void *)kernel, FP_HIP_THREADS,
                                                     0) != hipSuccess ||
        per_cu < 1) {
        (void)hipGetLastError(); /* the launch reports a real problem; the plan needs an estimate */
        per_cu = 1;
    }
    /* Packed: Hkv head groups of Nq * pack rows each (token major, so the causal order holds) */
    fp_plan_shape shape = fp_problem_plan_shape(p);
    shape.heads /= pack;
    shape.seqlen_q *= pack;
    fp_plan_target target = {(int64_t)ctx->cus * per_cu, bq, bk, backward ? 1 : FP_HIP_MAX_SPLITS,
                             FP_PLAN_ORDER_GRID};
    return fp_plan_forward(&shape, &target);
}

/* Launches kernel on the handle's stream; an empty grid launches nothing. */
static flashport_status launch(const fp_hip_ctx *ctx, fp_hip_kernel_fn kernel, dim3 grid,
                               const fp_hip_args *a, const char *what)
{
    if (grid.x == 0 || grid.y == 0 || grid.z == 0)
        return FLASHPORT_OK;
    hipLaunchKernelGGL(kernel, grid, dim3(FP_HIP_THREADS), 0, ctx->stream, *a);
    return fp_hip_check(hipGetLastError(), what);
}

/* The caller's workspace when the call brings one (too small: refused before any launch);
 * otherwise makes the handle's at least `bytes` and orders the handle's stream after its last
 * user. Growing waits for the device: the old buffer may still be read. */
static flashport_status workspace(fp_hip_ctx *ctx, const fp_problem *p, size_t bytes, float **ws)
{
    if (p->workspace) {
        if (bytes > p->workspace_bytes)
            return fp_hip_host()->set_error(FLASHPORT_ERR_BUFFER_TOO_SMALL,
                                            "%s: this call needs %zu bytes of workspace; the "
                                            "handle's has %zu",
                                            FP_HIP_BACKEND_NAME, bytes, p->workspace_bytes);
        *ws = (float *)p->workspace;
        return FLASHPORT_OK;
    }
    if (bytes > ctx->ws_bytes) {
        flashport_status st = fp_hip_check(hipDeviceSynchronize(), "hipDeviceSynchronize");
        if (st != FLASHPORT_OK)
            return st;
        if (ctx->ws) {
            st = fp_hip_check(hipFree(ctx->ws), "hipFree (workspace)");
            ctx->ws = NULL;
            ctx->ws_bytes = 0;
            if (st != FLASHPORT_OK)
                return st;
        }
        st = fp_hip_check(hipMalloc(&ctx->ws, bytes), "hipMalloc (workspace)");
        if (st != FLASHPORT_OK)
            return st;
        ctx->ws_bytes = bytes;
    }
    *ws = (float *)ctx->ws;
    return fp_hip_check(hipStreamWaitEvent(ctx->stream, ctx->ws_free, 0), "hipStreamWaitEvent");
}

static flashport_status too_many_blocks(const char *what, int64_t blocks)
{
    return fp_hip_host()->set_error(FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                                    "%s: %s needs %lld blocks along a grid dimension limited to %d",
                                    FP_HIP_BACKEND_NAME, what, (long long)blocks,
                                    FP_HIP_GRID_YZ_MAX);
}

/* The plugin links nothing of libflashport, so it names dtypes itself. */
static const char *dtype_name(flashport_dtype dtype)
{
    return dtype == FLASHPORT_F16 ? "f16" : dtype == FLASHPORT_BF16 ? "bf16" : "?";
}

static const char *path_name(const fp_hip_ctx *ctx)
{
    return ctx->cdna ? "cdna (mfma 16x16x16)" : "generic";
}

/* query != NULL: *query gets the workspace bytes and nothing is launched. */
static flashport_status run_forward(fp_hip_ctx *ctx, const fp_problem *p, size_t *query)
{
    const int dmax = fp_hip_dmax(p->head_dim);
    fp_hip_kernel_fn kernel = NULL;
#ifdef FP_HIP_HAVE_CDNA
    if (ctx->cdna)
        kernel = fp_hip_fwd_kernel_cdna(p->dtype, dmax);
    else
#endif
        kernel = fp_hip_fwd_kernel_generic(p->dtype, dmax);
    fp_hip_kernel_fn combine = fp_hip_combine_kernel(p->dtype);
    if (!kernel || !combine)
        return fp_hip_host()->set_error(FLASHPORT_ERR_INTERNAL,
                                        "%s: no forward kernel for %s D=%lld", FP_HIP_BACKEND_NAME,
                                        dtype_name(p->dtype), (long long)p->head_dim);

    fp_hip_args a;
    make_args(p, &a);
    a.pack_group = pack_group(p);
    const fp_plan plan = plan_for(ctx, p, kernel, dmax, 0, a.pack_group);
    if (plan.num_q_blocks > FP_HIP_GRID_YZ_MAX)
        return too_many_blocks("the forward's query blocks", plan.num_q_blocks);
    a.num_q_blocks = plan.num_q_blocks;
    a.reverse = plan.heavy_first;
    a.splits = plan.num_splits;
    a.keys_per_split = plan.keys_per_split;
    /* split-KV partials: O (f32) and LSE of every (split, head, packed query row) */
    const size_t rows = (size_t)plan.num_splits * (size_t)p->heads * (size_t)p->total_q;
    const size_t ws_bytes =
        plan.num_splits > 1 ? rows * (size_t)(p->head_dim + 1) * sizeof(float) : 0;
    if (query) {
        *query = ws_bytes;
        return FLASHPORT_OK;
    }
    if (fp_hip_host()->log_enabled())
        fp_hip_host()->log(
            "%s: forward, %s kernel, %s D=%lld (class %d), tile %dx%d, grid %lldx%dx%lld"
            " (%s), %d KV split(s), %d threads, %d query head(s) a block%s, %s cache",
            FP_HIP_BACKEND_NAME, path_name(ctx), dtype_name(p->dtype), (long long)p->head_dim, dmax,
            plan.block_q, plan.block_k, (long long)(p->batch * p->heads / a.pack_group),
            plan.num_splits, (long long)plan.num_q_blocks,
            plan.heavy_first ? "heaviest query blocks first" : "natural order", plan.num_splits,
            FP_HIP_THREADS, a.pack_group, a.pack_group > 1 ? " (GQA packed)" : "",
            p->block_table ? "paged" : "dense");

    const dim3 grid((unsigned)(p->batch * p->heads / a.pack_group), (unsigned)plan.num_splits,
                    (unsigned)plan.num_q_blocks);
    if (plan.num_splits == 1)
        return launch(ctx, kernel, grid, &a, "forward kernel launch");

    /* Split-KV: partials in the workspace, then the combine. */
    float *ws;
    flashport_status st = workspace(ctx, p, ws_bytes, &ws);
    if (st == FLASHPORT_OK) {
        a.o_part = ws;
        a.lse_part = ws + rows * (size_t)p->head_dim;
        st = launch(ctx, kernel, grid, &a, "forward kernel launch (split-KV)");
    }
    if (st == FLASHPORT_OK) {
        const int64_t y = p->seqlen_q < FP_HIP_GRID_YZ_MAX ? p->seqlen_q : FP_HIP_GRID_YZ_MAX;
        st = launch(ctx, combine, dim3((unsigned)(p->batch * p->heads), (unsigned)y), &a,
                    "split-KV combine launch");
    }
    if (st == FLASHPORT_OK)
        st = fp_hip_check(hipEventRecord(ctx->ws_free, ctx->stream), "hipEventRecord");
    return st;
}

static flashport_status run_backward(fp_hip_ctx *ctx, const fp_problem *p, size_t *query)
{
    const int dmax = fp_hip_dmax(p->head_dim);
    fp_hip_bwd_kernels k;
#ifdef FP_HIP_HAVE_CDNA
    if (ctx->cdna)
        k = fp_hip_bwd_kernels_cdna(p->dtype, dmax);
    else
#endif
        k = fp_hip_bwd_kernels_generic(p->dtype, dmax);
    fp_hip_kernel_fn prep = fp_hip_bwd_prep_kernel(p->dtype);
    if (!k.dkdv || !k.dq || !prep)
        return fp_hip_host()->set_error(FLASHPORT_ERR_INTERNAL,
                                        "%s: no backward kernel for %s D=%lld", FP_HIP_BACKEND_NAME,
                                        dtype_name(p->dtype), (long long)p->head_dim);

    fp_hip_args a;
    make_args(p, &a);
    int bq, bk;
    fp_hip_tiles(dmax, 1, &bq, &bk);
    const fp_plan plan = plan_for(ctx, p, k.dq, dmax, 1, 1);
    const int64_t key_blocks = (p->seqlen_k + bk - 1) / bk;
    const int64_t prep_blocks = (p->seqlen_q + FP_HIP_THREADS - 1) / FP_HIP_THREADS;
    if (plan.num_q_blocks > FP_HIP_GRID_YZ_MAX)
        return too_many_blocks("the backward's query blocks", plan.num_q_blocks);
    if (key_blocks > FP_HIP_GRID_YZ_MAX)
        return too_many_blocks("the backward's key blocks", key_blocks);
    a.num_q_blocks = plan.num_q_blocks;
    a.reverse = plan.heavy_first;
    a.splits = 1;
    const size_t ws_bytes = (size_t)p->heads * (size_t)p->total_q * sizeof(float); /* delta */
    if (query) {
        *query = ws_bytes;
        return FLASHPORT_OK;
    }
    if (fp_hip_host()->log_enabled())
        fp_hip_host()->log("%s: backward, %s kernels, %s D=%lld (class %d), tile %dx%d: delta, "
                           "dK/dV over %lld key blocks x %lld kv heads, dQ over %lld query "
                           "blocks; deterministic (no atomics)",
                           FP_HIP_BACKEND_NAME, path_name(ctx), dtype_name(p->dtype),
                           (long long)p->head_dim, dmax, bq, bk, (long long)key_blocks,
                           (long long)(p->batch * p->kv_heads), (long long)plan.num_q_blocks);

    float *ws;
    flashport_status st = workspace(ctx, p, ws_bytes, &ws);
    if (st == FLASHPORT_OK) {
        a.delta = ws;
        st = launch(ctx, prep, dim3((unsigned)(p->batch * p->heads), (unsigned)prep_blocks), &a,
                    "backward preprocessing launch");
    }
    if (st == FLASHPORT_OK)
        st = launch(ctx, k.dkdv, dim3((unsigned)(p->batch * p->kv_heads), 1, (unsigned)key_blocks),
                    &a, "backward dK/dV kernel launch");
    if (st == FLASHPORT_OK)
        st =
            launch(ctx, k.dq, dim3((unsigned)(p->batch * p->heads), 1, (unsigned)plan.num_q_blocks),
                   &a, "backward dQ kernel launch");
    if (st == FLASHPORT_OK)
        st = fp_hip_check(hipEventRecord(ctx->ws_free, ctx->stream), "hipEventRecord");
    return st;
}

/* run(ctx, p, NULL) on the context's device, under the lock, which covers the stream and the
 * workspace for the whole call. */
static flashport_status run_locked(fp_hip_ctx *ctx, const fp_problem *p,
                                   flashport_status (*run)(fp_hip_ctx *, const fp_problem *,
                                                           size_t *))
{
    int prev;
    flashport_status st = fp_hip_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    pthread_mutex_lock(&ctx->lock);
    st = run(ctx, p, NULL);
    pthread_mutex_unlock(&ctx->lock);
    return fp_hip_leave(ctx, prev, st);
}

flashport_status fp_hip_forward(fp_hip_ctx *ctx, const fp_problem *p)
{
    return run_locked(ctx, p, run_forward);
}

flashport_status fp_hip_backward(fp_hip_ctx *ctx, const fp_problem *p)
{
    return run_locked(ctx, p, run_backward);
}

flashport_status fp_hip_workspace_size(fp_hip_ctx *ctx, const fp_problem *p, int backward,
                                       size_t *bytes)
{
    int prev;
    flashport_status st = fp_hip_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    st = backward ? run_backward(ctx, p, bytes) : run_forward(ctx, p, bytes);
    return fp_hip_leave(ctx, prev, st);
}
