/*
 * The sm80 forward's launcher: which configuration runs (fp_sm80_pick, sm80/config.h; the D = 64
 * ping-pong rule, fp_fwd_pingpong) and its family launched (fp_sm80_fwd_family, common.cuh),
 * plus the split-KV combine kernel that every path's split forward shares.
 *
 * The kernels are in sm80/fwd.cuh (algorithm, tiles, differences from the reference), and each
 * head dim's family, f16 and bf16, is instantiated by a small file of its own
 * (sm80/inst/fwd_d64.cu, fwd_d128.cu, fwd_d256.cu). This file sees only the families' declarations,
 * so that it and each instantiation file compile alone too (FLASHPORT_CUDA_UNITY=OFF,
 * backends/cuda/CMakeLists.txt).
 */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/dispatch.cuh"
#include "backends/cuda/sm80/common.cuh"
#include "backends/cuda/sm80/config.h"

#include "core/plan.h"
#include "core/problem.h"

#include <math.h>
#include <stdlib.h>

/* Merges the splits of one row (a block per row; calls of more than FP_COMBINE_ROWS_SPLITS
 * splits, decode's long caches): LSE = M + log sum_s e^(lse_s - M), M the
 * partial LSEs' maximum; then O = sum_s e^(lse_s - LSE) O_s, warp w of NW summing splits w,
 * w + NW, ... in order and the NW sums added in warp order (deterministic). No split's loads wait
 * on another's, so a row's partials are read with many loads in flight (a decode call may have
 * 128 splits); NW = 16 where the splits number FP_COMBINE_WIDE_SPLITS or more, so that each
 * warp's few splits are read at once (such calls have few rows: the planners split only until
 * the grid fills the SMs, and a grid of few rows leaves the SMs idle while a row's warps wait
 * on their loads in turn), else 4. The partial LSEs are read from global memory once, into
 * shared memory, where the splits fit FP_COMBINE_LSE_CACHE (the planners cap them at 128 for
 * decode, 64 otherwise); more splits (forced by FLASHPORT_CUDA_DECODE_SPLITS) re-read them at
 * each of the three uses. A NaN partial LSE makes the row's LSE and O NaN; a row no split saw a
 * key of gets O = 0 and LSE = -inf (fp_softmax_merge's rule). grid (nq, H, B), NW * 32 threads. */
enum { FP_COMBINE_LSE_CACHE = 128, FP_COMBINE_WIDE_SPLITS = 32 };

/* One warp's step of a combine: acc = wa acc + wb O_s over the row's d columns at src, the lane
 * holding columns 64 c + 2 lane, + 1 (c < 4: d <= 256). */
FP_DEV void fp_combine_add(float (&acc)[4][2], const float *src, int d, int lane, float wa,
                           float wb)
{
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int col = 64 * c + 2 * lane;
        if (col < d) {
            const float2 x = *reinterpret_cast<const float2 *>(src + col);
            acc[c][0] = fmaf(wb, x.x, wa * acc[c][0]);
            acc[c][1] = fmaf(wb, x.y, wa * acc[c][1]);
        }
    }
}
/* x[0] + ... + x[N - 1] added in pairs ((x0 + x1) + (x2 + x3) for N = 4); N a power of two */
template <int N> FP_DEV float fp_pair_sum(const float *x)
{
    if constexpr (N == 1)
        return x[0];
    else
        return fp_pair_sum<N / 2>(x) + fp_pair_sum<N / 2>(x + N / 2);
}

template <typename T, int NW>
__global__ void __launch_bounds__(NW * 32) fp_sm80_fwd_combine(const fp_sm80_args a)
{
    constexpr int COLS = 256; /* d <= 256 */
    __shared__ float part[NW][COLS];
    __shared__ float wmax[NW], wsum[NW];
    __shared__ int wnan[NW];
    __shared__ float lse_s[FP_COMBINE_LSE_CACHE];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    if (i >= sq_.nq)
        return;
    /* row (split s, b, h, i) of the partials' layout: row0 + s * per_split */
    const int64_t row0 = ((int64_t)b * a.heads + h) * a.nq + i;
    const int64_t per_split = (int64_t)a.batch * a.heads * a.nq;
    const bool cached = a.splits <= FP_COMBINE_LSE_CACHE;
    auto lse_of = [&](int s) { return cached ? lse_s[s] : a.lse_part[row0 + s * per_split]; };
    float mx = -INFINITY;
    int nan = 0;
    for (int s = tid; s < a.splits; s += NW * 32) {
        const float x = a.lse_part[row0 + s * per_split];
        if (cached)
            lse_s[s] = x;
        nan |= x != x;
        mx = fmaxf(mx, x);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    nan = __any_sync(0xffffffffu, nan);
    if (lane == 0) {
        wmax[warp] = mx;
        wnan[warp] = nan;
    }
    __syncthreads();
    mx = wmax[0];
    nan = wnan[0];
#pragma unroll
    for (int w = 1; w < NW; ++w) {
        mx = fmaxf(mx, wmax[w]);
        nan |= wnan[w];
    }
    float sum = 0.0f;
    if (mx != -INFINITY)
        for (int s = tid; s < a.splits; s += NW * 32)
            sum += expf(lse_of(s) - mx);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0)
        wsum[warp] = sum;
    __syncthreads();
    sum = fp_pair_sum<NW>(wsum);
    const float lse = nan ? NAN : mx == -INFINITY ? -INFINITY : mx + logf(sum);

    float acc[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
    if (lse != -INFINITY) {
#pragma unroll(NW == 4 ? 4 : 8)
        for (int s = warp; s < a.splits; s += NW) {
            const int64_t row = row0 + s * per_split;
            const float w = expf(lse_of(s) - lse); /* 0 for a split that saw no key */
            fp_combine_add(acc, a.o_part + row * a.d, a.d, lane, 1.0f, w);
        }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        part[warp][64 * c + 2 * lane] = acc[c][0];
        part[warp][64 * c + 2 * lane + 1] = acc[c][1];
    }
    __syncthreads();
    T *og = reinterpret_cast<T *>(const_cast<void *>(a.o.ptr)) +
            fp_cuda_row(a.o, b, sq_.q_start + i, h);
    for (int col = tid; col < a.d; col += NW * 32) {
        float x[NW];
#pragma unroll
        for (int w = 0; w < NW; ++w)
            x[w] = part[w][col];
        og[col] = fp_from_f32<T>(fp_pair_sum<NW>(x));
    }
    if (a.lse && tid == 0)
        a.lse[fp_cuda_lse_off(a, b, sq_.q_start + i, h)] = lse;
}

/* The combine of few splits (at most FP_COMBINE_ROWS_SPLITS, the prefill forwards' usual
 * case): one warp per row, its splits merged one after another with fp_softmax_merge's weights,
 * in split order (a NaN partial LSE: the row's LSE and O NaN); four rows a block. Where a call has
 * many rows and few splits, a block per row costs more than its parallel loads gain: each row's
 * few partials leave most of a block's threads idle. grid (ceil(nq / 4), H, B), 128 threads. */
enum { FP_COMBINE_ROWS_SPLITS = 8 };
template <typename T>
__global__ void __launch_bounds__(128) fp_sm80_fwd_combine_rows(const fp_sm80_args a)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * 4 + warp, h = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    if (i >= sq_.nq)
        return;
    float acc[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
    float lse = -INFINITY;
    bool nan = false;
    for (int s = 0; s < a.splits; ++s) {
        const int64_t row = (((int64_t)s * a.batch + b) * a.heads + h) * a.nq + i;
        const float part = a.lse_part[row];
        if (part != part) { /* the row's LSE and O end NaN, as the block-per-row kernel's */
            nan = true;
            continue;
        }
        float wa, wb;
        lse = fp_softmax_merge(lse, part, &wa, &wb);
        fp_combine_add(acc, a.o_part + row * a.d, a.d, lane, wa, wb);
    }
    T *og = reinterpret_cast<T *>(const_cast<void *>(a.o.ptr)) +
            fp_cuda_row(a.o, b, sq_.q_start + i, h);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int col = 64 * c + 2 * lane;
        if (col < a.d) {
            og[col] = fp_from_f32<T>(nan ? NAN : acc[c][0]);
            og[col + 1] = fp_from_f32<T>(nan ? NAN : acc[c][1]);
        }
    }
    if (a.lse && lane == 0)
        a.lse[fp_cuda_lse_off(a, b, sq_.q_start + i, h)] = nan ? NAN : lse;
}

/* FLASHPORT_CUDA_COMBINE_ROWS=N (read at each call; tests and A/B runs): the few-split kernel
 * for at most N splits instead of FP_COMBINE_ROWS_SPLITS (0: the block-per-row kernel always). */
static int fp_combine_rows_splits(void)
{
    const char *v = getenv("FLASHPORT_CUDA_COMBINE_ROWS");
    char *end = NULL;
    const long n = v ? strtol(v, &end, 10) : -1;
    return v && end != v && *end == '\0' && n >= 0 ? (int)n : FP_COMBINE_ROWS_SPLITS;
}

/* FLASHPORT_CUDA_COMBINE_WIDE=N (read at each call; tests and A/B runs): the 16-warp
 * block-per-row kernel from N splits instead of FP_COMBINE_WIDE_SPLITS. */
static int fp_combine_wide_splits(void)
{
    const char *v = getenv("FLASHPORT_CUDA_COMBINE_WIDE");
    char *end = NULL;
    const long n = v ? strtol(v, &end, 10) : -1;
    return v && end != v && *end == '\0' && n >= 0 ? (int)n : FP_COMBINE_WIDE_SPLITS;
}

cudaError_t fp_cuda_fwd_combine(const fp_problem *p, const fp_sm80_args *a, cudaStream_t stream)
{
    const bool f16 = p->o_dtype == FLASHPORT_F16; /* o's dtype: the sm90 fp8 kernels' output too */
    if (a->splits <= fp_combine_rows_splits()) {
        dim3 grid((unsigned)((a->nq + 3) / 4), (unsigned)p->heads, (unsigned)p->batch);
        if (f16)
            fp_sm80_fwd_combine_rows<__half><<<grid, 128, 0, stream>>>(*a);
        else
            fp_sm80_fwd_combine_rows<__nv_bfloat16><<<grid, 128, 0, stream>>>(*a);
        return cudaGetLastError();
    }
    dim3 grid((unsigned)a->nq, (unsigned)p->heads, (unsigned)p->batch);
    if (a->splits >= fp_combine_wide_splits()) {
        if (f16)
            fp_sm80_fwd_combine<__half, 16><<<grid, 16 * 32, 0, stream>>>(*a);
        else
            fp_sm80_fwd_combine<__nv_bfloat16, 16><<<grid, 16 * 32, 0, stream>>>(*a);
    } else if (f16) {
        fp_sm80_fwd_combine<__half, 4><<<grid, 4 * 32, 0, stream>>>(*a);
    } else {
        fp_sm80_fwd_combine<__nv_bfloat16, 4><<<grid, 4 * 32, 0, stream>>>(*a);
    }
    return cudaGetLastError();
}

/* Whether the D = 64 forward takes the ping-pong kernel (FP_FWD_D64_PINGPONG): where its query
 * blocks of 256 visit, on average, 16 key blocks (2048 keys) or more without a mask and 32 or
 * more with one (causal or a window: its diagonal blocks are twice as large as the 4-warp
 * kernel's), without splitting the keys, and fill the SMs once at least. Shorter loops pay more
 * for its unhidden first and last half and prologue than its overlap gains; on the H200 this rule
 * picked the faster kernel in all 20 shapes of its A/B (docs/bench/archive/, s5 and s7).
 * FLASHPORT_CUDA_FWD_PINGPONG (1 always, 0 never; read at each call, for tests and A/B timings)
 * forces the choice. */
static bool fp_fwd_pingpong(const fp_cuda_ctx *ctx, const fp_problem *p)
{
    if (ctx->smem_optin < FP_FWD_SMEM_D64_PINGPONG)
        return false;
    const char *force = getenv("FLASHPORT_CUDA_FWD_PINGPONG");
    if (force && *force)
        return atoi(force) != 0;
    const fp_plan_shape shape = fp_problem_plan_shape(p);
    /* one block per SM */
    const fp_plan plan =
        fp_cuda_grid_plan(p, ctx->sm_count, FP_FWD_D64_PINGPONG_BM, FP_FWD_D64_PINGPONG_BN);
    if (plan.num_splits > 1 || plan.num_q_blocks * p->batch * p->heads < ctx->sm_count)
        return false;
    int64_t blocks = 0;
    for (int64_t qb = 0; qb < plan.num_q_blocks; ++qb)
        blocks += fp_plan_block_cost(&plan, &shape, qb);
    const bool masked = p->window_left >= 0 || p->window_right >= 0;
    return blocks >= (masked ? 32 : 16) * plan.num_q_blocks;
}

/* The configuration fp_sm80_pick (sm80/config.h) chooses, launched. */
extern "C" flashport_status fp_cuda_sm80_forward(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                 void *ws, size_t *query)
{
    const bool pingpong = p->head_dim <= 64 && fp_fwd_pingpong(ctx, p);
    const fp_sm80_choice c = fp_sm80_pick(p->head_dim, ctx->smem_optin, pingpong);
    if (c.fwd < 0)
        return fp_cuda_refuse(FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM,
                              "the forward at head dim %lld needs %zu KiB of shared memory per "
                              "block; this device allows %zu KiB",
                              (long long)p->head_dim, (size_t)FP_FWD_SMEM_D256_BN32 / 1024,
                              ctx->smem_optin / 1024);
    fp_sm80_args a;
    fp_sm80_fill_args(p, &a);
    return fp_cuda_dispatch<FP_SM80_DK_CLASSES>(p->dtype, c.dk, [&](auto k) {
        using K = decltype(k);
        return fp_sm80_fwd_family<typename K::T, K::DK>::run(ctx, p, a, c.fwd, ws, query);
    });
}
