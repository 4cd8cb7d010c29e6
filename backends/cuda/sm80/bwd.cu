/*
 * The sm80 backward's launcher (its head dim's family, fp_sm80_bwd_family: common.cuh) and the
 * side passes that the sm90 backward shares: fp_sm80_bwd_pre (Dsum and LSE * log2(e), zeroes the
 * dQ accumulator), fp_sm80_bwd_dq_convert (the accumulator into dq), fp_sm80_bwd_dkdv_sum (the
 * group splits' dK/dV in slice order), fp_sm80_bwd_zero_unused (seqused_k's unused keys), the GQA
 * group splits.
 *
 * The dK/dV and deterministic dQ kernels are in sm80/bwd.cuh (algorithm, tiles, differences from
 * the reference), and each head dim's family, f16 and bf16, is instantiated by a small file of its
 * own (sm80/inst/bwd_d64.cu, bwd_d128.cu, bwd_d256.cu). This file sees only the families'
 * declarations, so that it and each instantiation file compile alone too
 * (FLASHPORT_CUDA_UNITY=OFF, backends/cuda/CMakeLists.txt).
 */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/dispatch.cuh"
#include "backends/cuda/sm80/common.cuh"
#include "backends/cuda/sm80/config.h"

#include "core/plan.h"
#include "core/problem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows of the preprocessing and dQ conversion kernels' blocks: one band of the dQ accumulator
 * (fp_dq_frag_off), so that a block zeroes or reads 16 x DK contiguous floats. */
#define FP_BWD_BAND 16

// o, dout: (B, Nq, H, D); lse: (B, H, Nq) -> ws_lse2, ws_dsum: (B, H, nq_pad); zeroes dq_accum.
// grid (nq_pad / 16, H, B), 128 threads: 16 rows per block, 8 columns (16 bytes) per thread.
// Every row's loads are issued before the first product, so that a thread has NP x 32 bytes in
// flight: this is a memory-bound pass, and at short sequences it and the dQ conversion below decide
// the backward's speed (one warp per row with 2-byte loads was twice as slow; docs/bench/archive/,
// aux).
template <typename T, int DK>
__global__ void __launch_bounds__(128) fp_sm80_bwd_pre(const fp_sm80_args a)
{
    constexpr int TPR = DK / 8;           /* threads per row */
    constexpr int RPP = 128 / TPR;        /* rows per pass */
    constexpr int NP = FP_BWD_BAND / RPP; /* passes */
    const int tid = threadIdx.x, c = (tid % TPR) * 8;
    const int i0 = blockIdx.x * FP_BWD_BAND + tid / TPR, h = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    uint4 ov[NP], dv[NP];
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        const int i = i0 + p * RPP;
        ov[p] = dv[p] = make_uint4(0u, 0u, 0u, 0u);
        if (i < sq_.nq && c < a.d) {
            ov[p] = *reinterpret_cast<const uint4 *>(reinterpret_cast<const T *>(a.o.ptr) +
                                                     fp_cuda_row(a.o, b, sq_.q_start + i, h) + c);
            dv[p] =
                *reinterpret_cast<const uint4 *>(reinterpret_cast<const T *>(a.dout.ptr) +
                                                 fp_cuda_row(a.dout, b, sq_.q_start + i, h) + c);
        }
    }
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        const int i = i0 + p * RPP;
        /* word by word (taking the vectors' addresses put them in local memory on sm_80) */
        const uint32_t ow[4] = {ov[p].x, ov[p].y, ov[p].z, ov[p].w};
        const uint32_t dw[4] = {dv[p].x, dv[p].y, dv[p].z, dv[p].w};
        float dsum = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 x = fp_unpack2<T>(ow[e]), y = fp_unpack2<T>(dw[e]);
            dsum = fmaf(x.x, y.x, dsum);
            dsum = fmaf(x.y, y.y, dsum);
        }
#pragma unroll
        for (int off = TPR / 2; off > 0; off >>= 1)
            dsum += __shfl_xor_sync(0xffffffffu, dsum, off);
        if (tid % TPR == 0) {
            float lse2 = INFINITY; /* rows past the end, and rows that saw nothing: P = 0 */
            if (i < sq_.nq) {
                const float l = a.lse[fp_cuda_lse_off(a, b, sq_.q_start + i, h)];
                lse2 = l == -INFINITY ? INFINITY : l * FP_LOG2E;
            }
            const int64_t idx = fp_bwd_ws_row(a, b, h, i);
            a.ws_lse2[idx] = lse2;
            a.ws_dsum[idx] = dsum;
        }
    }
    if (a.dq_accum) {
        float4 *band = reinterpret_cast<float4 *>(
            a.dq_accum + fp_bwd_ws_row(a, b, h, blockIdx.x * FP_BWD_BAND) * DK);
#pragma unroll
        for (int k = tid; k < FP_BWD_BAND * DK / 4; k += 128)
            band[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* With seqused_k, keys [nk, capacity) of a sequence take no part in the attention: their dK and
 * dV rows are 0. A kernel of its own, launched only for seqused_k calls, so that the dK/dV
 * kernel's registers do not pay for it. grid (ceil(capacity / 64), Hkv, B), 128 threads. */
__global__ void __launch_bounds__(128) fp_sm80_bwd_zero_unused(const fp_sm80_args a)
{
    const int kvh = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    const int cap = (int)fp_seq_lookup(a.cu_q, a.cu_k, a.nq, a.nk, b).nk;
    const int r_begin = max((int)blockIdx.x * 64, sq_.nk),
              r_end = min((int)blockIdx.x * 64 + 64, cap);
    const int ch = a.d / 8;
    uint16_t *dk = reinterpret_cast<uint16_t *>(const_cast<void *>(a.dk.ptr));
    uint16_t *dv = reinterpret_cast<uint16_t *>(const_cast<void *>(a.dv.ptr));
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int idx = threadIdx.x; idx < (r_end - r_begin) * ch; idx += 128) {
        const int r = r_begin + idx / ch, c = idx % ch;
        *reinterpret_cast<uint4 *>(dk + fp_cuda_row(a.dk, b, sq_.k_start + r, kvh) + 8 * c) = zero;
        *reinterpret_cast<uint4 *>(dv + fp_cuda_row(a.dv, b, sq_.k_start + r, kvh) + 8 * c) = zero;
    }
}

void fp_cuda_bwd_zero_unused(const fp_problem *p, const fp_sm80_args &a, cudaStream_t stream)
{
    const dim3 grid((unsigned)((a.nk + 63) / 64), (unsigned)p->kv_heads, (unsigned)p->batch);
    fp_sm80_bwd_zero_unused<<<grid, 128, 0, stream>>>(a);
}

// dq_accum (B, H, nq_pad, DK) f32 in fragment order (fp_dq_frag_off) -> dq (B, Nq, H, D) *
// scale. grid (ceil(nq / 16), H, B), 128 threads: one band of 16 rows per block. Column piece
// C of a band (128 C ..) is 16 rows x 8 columns, row-major, so a thread reads one row's piece
// as 32 contiguous bytes and writes it as 16; all its loads go out before the first store.
template <typename T, int DK>
__global__ void __launch_bounds__(128) fp_sm80_bwd_dq_convert(const fp_sm80_args a)
{
    constexpr int NI = FP_BWD_BAND * DK / 8 / 128; /* (row, piece) items per thread */
    const int i0 = blockIdx.x * FP_BWD_BAND, h = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    if (i0 >= sq_.nq)
        return;
    const float4 *band =
        reinterpret_cast<const float4 *>(a.dq_accum + fp_bwd_ws_row(a, b, h, i0) * DK);
    T *dst = reinterpret_cast<T *>(const_cast<void *>(a.dq.ptr)) +
             fp_cuda_row(a.dq, b, sq_.q_start + i0, h);
    float4 x[NI][2];
#pragma unroll
    for (int n = 0; n < NI; ++n) {
        const int k = threadIdx.x + 128 * n; /* piece k / 16, row k % 16 */
        x[n][0] = band[2 * k];
        x[n][1] = band[2 * k + 1];
    }
#pragma unroll
    for (int n = 0; n < NI; ++n) {
        const int k = threadIdx.x + 128 * n, r = k % FP_BWD_BAND, c = 8 * (k / FP_BWD_BAND);
        if (i0 + r < sq_.nq && c < a.d) {
            const float f = a.scale;
            *reinterpret_cast<uint4 *>(dst + r * a.dq.ss + c) =
                make_uint4(fp_pack2<T>(x[n][0].x * f, x[n][0].y * f),
                           fp_pack2<T>(x[n][0].z * f, x[n][0].w * f),
                           fp_pack2<T>(x[n][1].x * f, x[n][1].y * f),
                           fp_pack2<T>(x[n][1].z * f, x[n][1].w * f));
        }
    }
}

// dkv_part (2, group_splits, B, Hkv, nk_pad, DK) f32 -> dv, dk * scale (B, Nk, Hkv, D).
// grid (ceil(nk / 16), Hkv, B), 128 threads: 16 key rows per block, 8 columns per item; the
// slices are added in order (bitwise identical run to run).
template <typename T, int DK>
__global__ void __launch_bounds__(128) fp_sm80_bwd_dkdv_sum(const fp_sm80_args a)
{
    constexpr int CH = DK / 8, NI = FP_BWD_BAND * CH / 128; /* (row, 8 columns) items a thread */
    const int n0 = blockIdx.x * FP_BWD_BAND, kvh = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    if (n0 >= sq_.nk)
        return;
    const int64_t split_stride = (int64_t)a.batch * (a.heads / a.group) * a.nk_pad * DK;
#pragma unroll
    for (int n = 0; n < NI; ++n) {
        const int k = threadIdx.x + 128 * n, r = k / CH, c = 8 * (k % CH);
        if (n0 + r >= sq_.nk || c >= a.d)
            continue;
#pragma unroll
        for (int which = 0; which < 2; ++which) {
            const float *src0 = a.dkv_part + fp_bwd_part_row(a, which, 0, b, kvh, n0 + r) * DK + c;
            float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            for (int split = 0; split < a.group_splits; ++split) {
                const float4 *src = reinterpret_cast<const float4 *>(src0 + split * split_stride);
                const float4 x = src[0], y = src[1];
                acc[0] += x.x;
                acc[1] += x.y;
                acc[2] += x.z;
                acc[3] += x.w;
                acc[4] += y.x;
                acc[5] += y.y;
                acc[6] += y.z;
                acc[7] += y.w;
            }
            const fp_kernel_tensor &out = which ? a.dk : a.dv;
            const float f = which ? a.scale : 1.0f;
            T *dst = reinterpret_cast<T *>(const_cast<void *>(out.ptr)) +
                     fp_cuda_row(out, b, sq_.k_start + n0 + r, kvh) + c;
            *reinterpret_cast<uint4 *>(dst) = make_uint4(
                fp_pack2<T>(acc[0] * f, acc[1] * f), fp_pack2<T>(acc[2] * f, acc[3] * f),
                fp_pack2<T>(acc[4] * f, acc[5] * f), fp_pack2<T>(acc[6] * f, acc[7] * f));
        }
    }
}

/* Group splits of a dK/dV kernel (one block per SM): fp_plan_backward_group_splits (core/plan.h)
 * for the kernel's key block. FLASHPORT_CUDA_GROUP_SPLITS (read at each call, for tests
 * and A/B timings) forces a count, the largest divisor of the group not above it; unset, empty
 * or "auto" leaves the choice to the planner. */
int fp_cuda_bwd_group_splits(const fp_cuda_ctx *ctx, const fp_problem *p, int block_k)
{
    const int group = (int)(p->heads / p->kv_heads);
    const char *force = getenv("FLASHPORT_CUDA_GROUP_SPLITS");
    if (force && *force && strcmp(force, "auto") != 0) {
        int n = atoi(force);
        n = n < 1 ? 1 : n > group ? group : n;
        while (group % n != 0)
            --n;
        return n;
    }
    const fp_plan_shape shape = fp_problem_plan_shape(p);
    return fp_plan_backward_group_splits(&shape, ctx->sm_count, block_k);
}

/* ---- the side passes, shared with the sm90 path (common.cuh declares them) ---------------- */

size_t fp_cuda_bwd_side_setup(const fp_problem *p, fp_sm80_args *a, int dk, int accumulate,
                              int group_splits, void *ws)
{
    if (p->batch == 0 || p->heads == 0)
        return 0;
    /* Empty sequences still get their outputs written (zeros); only empty grids are skipped. */
    a->nq_pad = (max(a->nq, 1) + FP_BWD_ROW_PAD - 1) / FP_BWD_ROW_PAD * FP_BWD_ROW_PAD;
    a->nk_pad = (max(a->nk, 1) + FP_BWD_ROW_PAD - 1) / FP_BWD_ROW_PAD * FP_BWD_ROW_PAD;
    a->dq_atomic = accumulate;
    a->group_splits = group_splits;
    /* scratch: LSE * log2(e) and Dsum per row, the f32 dQ accumulator in atomic mode, and with
     * group splits each slice's f32 dV and dK */
    const size_t rows = (size_t)p->batch * p->heads * a->nq_pad;
    const size_t accum = a->dq_atomic ? rows * dk : 0;
    const size_t part =
        group_splits > 1 ? 2 * (size_t)group_splits * p->batch * p->kv_heads * a->nk_pad * dk : 0;
    if (ws) {
        a->ws_lse2 = (float *)ws;
        a->ws_dsum = a->ws_lse2 + rows;
        a->dq_accum = a->dq_atomic ? a->ws_dsum + rows : NULL;
        a->dkv_part = part ? a->ws_dsum + rows + accum : NULL;
    }
    return (2 * rows + accum + part) * sizeof(float);
}

/* The side passes run on the accumulator's head dim, dk (64, 128 or 256). */
cudaError_t fp_cuda_bwd_side_pre(const fp_problem *p, const fp_sm80_args &a, int dk,
                                 cudaStream_t stream)
{
    const dim3 grid((unsigned)(a.nq_pad / FP_BWD_BAND), (unsigned)p->heads, (unsigned)p->batch);
    return fp_cuda_dispatch<FP_SM80_DK_CLASSES>(p->dtype, dk, [&](auto k) {
        using K = decltype(k);
        fp_sm80_bwd_pre<typename K::T, K::DK><<<grid, 128, 0, stream>>>(a);
        return cudaGetLastError();
    });
}

cudaError_t fp_cuda_bwd_side_dq(const fp_problem *p, const fp_sm80_args &a, int dk,
                                cudaStream_t stream)
{
    if (!a.dq_atomic || a.nq == 0)
        return cudaSuccess;
    const dim3 grid((unsigned)((a.nq + FP_BWD_BAND - 1) / FP_BWD_BAND), (unsigned)p->heads,
                    (unsigned)p->batch);
    return fp_cuda_dispatch<FP_SM80_DK_CLASSES>(p->dtype, dk, [&](auto k) {
        using K = decltype(k);
        fp_sm80_bwd_dq_convert<typename K::T, K::DK><<<grid, 128, 0, stream>>>(a);
        return cudaGetLastError();
    });
}

cudaError_t fp_cuda_bwd_side_dkdv_sum(const fp_problem *p, const fp_sm80_args &a, int dk,
                                      cudaStream_t stream)
{
    if (a.group_splits <= 1 || a.nk == 0)
        return cudaSuccess;
    const dim3 grid((unsigned)((a.nk + FP_BWD_BAND - 1) / FP_BWD_BAND), (unsigned)p->kv_heads,
                    (unsigned)p->batch);
    return fp_cuda_dispatch<FP_SM80_DK_CLASSES>(p->dtype, dk, [&](auto k) {
        using K = decltype(k);
        fp_sm80_bwd_dkdv_sum<typename K::T, K::DK><<<grid, 128, 0, stream>>>(a);
        fp_cuda_log("backward: dK/dV of %d group splits summed in order, grid %ux%ux%u",
                    a.group_splits, grid.x, grid.y, grid.z);
        return cudaGetLastError();
    });
}

extern "C" flashport_status fp_cuda_sm80_backward(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                  void *ws, size_t *query)
{
    fp_sm80_args a;
    fp_sm80_fill_args(p, &a);
    return fp_cuda_dispatch<FP_SM80_DK_CLASSES>(p->dtype, p->head_dim, [&](auto k) {
        using K = decltype(k);
        return fp_sm80_bwd_family<typename K::T, K::DK>::run(ctx, p, a, ws, query);
    });
}
