/*
 * Flash attention backward, sm80 path (mma.sync + ldmatrix + cp.async; runs on sm_80 .. sm_90).
 *
 * Algorithm (FlashAttention-2 backward), P recomputed from the forward's LSE:
 *   1. fp_sm80_bwd_pre: per query row, Dsum = rowsum(dO * O) and LSE * log2(e) (+inf for rows
 *      that saw nothing, so their P is 0), into a [B, H, Nq_pad] f32 workspace; it also zeroes
 *      the dQ accumulator (atomic mode).
 *   2. fp_sm80_bwd_dkdv: one thread block per (key block of BN = 16 x warps keys, kv head,
 *      batch). Each warp owns 16 keys: their dK and dV accumulate in f32 registers across every
 *      query block that sees them, for every query head of the GQA group (so the group sum
 *      needs no extra memory and no atomics). Per query block (Q, dO, LSE and Dsum tiles
 *      double-buffered through cp.async): S^T = K Q^T and dP^T = V dO^T (K and V rows as A from
 *      shared memory), P^T = exp2(S^T * scale * log2 e - LSE2), dS^T = P^T (dP^T - Dsum);
 *      dV += P^T dO and dK += dS^T Q straight from registers (the C fragments are the A
 *      fragments of the next product). In the default (atomic) mode dS^T also goes to shared
 *      memory and the block computes dQ_partial = dS K, added to an f32 dQ accumulator with
 *      atomics (8-byte vector reductions on sm_90); fp_sm80_bwd_dq_convert scales it into
 *      dq.
 *      D = 256 would need 256 accumulator registers per thread for dK and dV together, so it
 *      runs the kernel twice: once for dV, once for dK (and dQ), recomputing S.
 *      D = 64, and D = 128 on devices with 226 KiB of shared memory per block (sm_90), run
 *      fp_sm80_bwd_dkdv_sub, the same algorithm with each warp taking the query block in
 *      sub-blocks (only one sub-block's S^T and dP^T in registers beside dK and dV)
 *      and every product software-pipelined in the registers this frees: the next k step's
 *      ldmatrix fragments are requested before this step's mma.
 *   3. Deterministic mode: the dK/dV kernel skips dQ and fp_sm80_bwd_dq computes it without
 *      atomics, one block per query block walking the key blocks in order (S, dP and dS
 *      recomputed: two more products than the atomic mode). Every output then has one writer
 *      and a fixed summation order: bitwise identical run to run.
 * Softcap: dS is multiplied by fp_softcap_grad (core/mask.h) of the capped score (from
 * fp_score_transform); ALiBi adds nothing to the gradient. Masking mirrors the forward: blocks
 * outside the window are never visited, fp_mask_block_full picks the blocks that need no
 * per-element mask, and the others apply fp_mask_visible's inequalities (fp_mask32).
 *
 * Tiles: dK/dV D=64: BN 128 (8 warps), query block 128 in 2 sub-blocks of 64; D=128: 128
 * (8 warps), 128 in 2 sub-blocks of 64 where the 226 KiB of shared memory fit (sm_90), else 64
 * in one (sm_80 .. sm_89); D=256: 64 (4 warps), 64, two passes. Deterministic dQ: 64 query
 * rows (4 warps), key block 64 (32 for D=256). Other head dims run on the next larger kernel,
 * zero-filled.
 *
 * Differences from the reference: P and dS are rounded to f16/bf16 before the products that
 * use them (as in every tensor-core flash kernel); exp2 is the hardware approximation; dQ in the
 * atomic mode is summed in an order that varies from run to run (last-bit differences).
 * Measured (H200, ANCHORS grid, tests/gpu/run_h200.sh -> bench/compare_torch.py, bf16 and
 * fp16, 2026-11-30 04:35): D = 64 0.80 .. 0.85x SDPA flash (FA2), D = 128 0.86 .. 0.91x (was
 * 0.78 .. 0.86x with the one-block kernel); D = 256 0.59 .. 0.67x (03:54); up to 272 TFLOP/s
 * (D = 128). The dK/dV kernel is latency-bound (8 warps per SM at 228 .. 255 registers; ncu at
 * D = 128, one-block kernel: ldmatrix -> mma scoreboard stalls first, dQ reductions second).
 * The deterministic mode ran at 0.91 .. 1.06x the atomic one (03:54, before the D = 64
 * change). Details: docs/bench/.
 */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/sm80_common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* dK/dV kernel: NW warps (BN = 16 NW keys), BM query rows per step, dQ computed in column
 * slices of SLICE (so every warp has one), TWO_PASS: dV and dK in separate launches. QS > 1
 * runs fp_sm80_bwd_dkdv_sub instead: each warp takes the query block in QS sub-blocks and the
 * products are software-pipelined. BIG: the config for devices whose blocks may take
 * fp_dkdv_smem<DK, true, ...> bytes of shared memory (sm_90: 227 KiB); the others run
 * BIG = false. Measured on the H200 (2026-11-30, one run each, every N, causal and not):
 * sub-blocks made D = 64 4.5 .. 7.6 % faster (BM 128 in 2 x 64, bf16) and D = 128 2.5 .. 5.1 %
 * slower with BM 64 in 2 x 32 (bf16; likely because S^T/dP^T then take six ldmatrix per eight
 * mma instead of ten per sixteen) but 2.2 .. 10.2 % faster with BM 128 in 2 x 64 (bf16 and
 * fp16; 226 KiB of shared memory, 52 bytes spilled); at D = 128, 4 warps (BN 64, BM 64) were
 * -7.6 .. +2.7 %. D = 256 with sub-blocks was not timed. */
template <int DK, bool BIG> struct fp_bwd_cfg;
template <> struct fp_bwd_cfg<64, false> {
    enum { NW = 8, BM = 128, QS = 2, SLICE = 64, TWO_PASS = 0 };
};
template <> struct fp_bwd_cfg<128, false> {
    enum { NW = 8, BM = 64, QS = 1, SLICE = 64, TWO_PASS = 0 };
};
template <> struct fp_bwd_cfg<128, true> {
    enum { NW = 8, BM = 128, QS = 2, SLICE = 64, TWO_PASS = 0 };
};
template <> struct fp_bwd_cfg<256, false> {
    enum { NW = 4, BM = 64, QS = 1, SLICE = 64, TWO_PASS = 1 };
};

/* Deterministic dQ kernel: NW warps of 16 query rows, BN keys per step. */
template <int DK> struct fp_dq_cfg {
    enum { NW = 4, BN = DK == 256 ? 32 : 64 };
};

enum { FP_PASS_BOTH = 0, FP_PASS_DV = 1, FP_PASS_DK = 2 };

/* Rows are padded to this in the workspaces, a multiple of every kernel's query block. */
#define FP_BWD_ROW_PAD 128

template <int DK, bool BIG, int PASS> constexpr size_t fp_dkdv_smem()
{
    constexpr int BN = 16 * fp_bwd_cfg<DK, BIG>::NW, BM = fp_bwd_cfg<DK, BIG>::BM;
    constexpr bool WANT_DK = PASS != FP_PASS_DV;
    return (size_t)(BN * DK * (WANT_DK ? 2 : 1) + 4 * BM * DK + (WANT_DK ? BN * BM : 0)) * 2 +
           4 * BM * sizeof(float);
}

template <int DK> constexpr size_t fp_dq_smem()
{
    constexpr int BM = 16 * fp_dq_cfg<DK>::NW, BN = fp_dq_cfg<DK>::BN;
    return (size_t)(2 * BM * DK + 4 * BN * DK) * 2;
}

/* dst[0..1] += (x, y) in global memory: one 8-byte vector reduction on sm_90, two scalar ones
 * before it. */
FP_DEV void fp_red_add2(float *dst, float x, float y)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(dst), make_float2(x, y));
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
#endif
}

/* P (and dS) of one score, MODE as in FP_SCORES_*: x raw q.k in, P out; dp dP in, dS out
 * (WANT_DS). Row i, key j. */
template <int MODE, bool WANT_DS>
FP_DEV void fp_bwd_elem(const fp_sm80_args &a, const fp_mask32 &mk, float &x, float &dp, int i,
                        int j, int nq, int nk, float lse2, float dsum, float slope)
{
    float p, grad = 1.0f;
    if constexpr (MODE == FP_SCORES_TRANSFORM) {
        const float capped = fp_score_transform(x * a.scale, a.softcap, 0.0f, 0.0f);
        p = fp_exp2((capped - slope * fp_alibi_distance(i, j, nq, nk)) * FP_LOG2E - lse2);
        grad = fp_softcap_grad(capped, a.softcap);
    } else {
        p = fp_exp2(fmaf(x, a.scale_log2, -lse2));
    }
    if constexpr (MODE != FP_SCORES_FULL)
        p = fp_mask32_visible(mk, i, j) ? p : 0.0f;
    x = p;
    if constexpr (WANT_DS)
        dp = p * (dp - dsum) * grad;
}

/* The dK/dV kernel's tile: 16 keys (rows, from key0) x NJ x 8 queries (columns, from m0);
 * lse2 and dsum per column from shared memory. */
template <int MODE, bool WANT_DS, int NJ>
FP_DEV void fp_bwd_tile_t(const fp_sm80_args &a, const fp_mask32 &mk, float (*s)[4], float (*dp)[4],
                          int m0, int key0, int nq, int nk, const float *lse2, const float *dsum,
                          float slope, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int c = 8 * j + 2 * t;
        const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + c);
        const float2 ds = WANT_DS ? *reinterpret_cast<const float2 *>(dsum + c) : make_float2(0, 0);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            fp_bwd_elem<MODE, WANT_DS>(a, mk, s[j][2 * r], dp[WANT_DS ? j : 0][2 * r], m0 + c,
                                       key0 + g + 8 * r, nq, nk, l2.x, ds.x, slope);
            fp_bwd_elem<MODE, WANT_DS>(a, mk, s[j][2 * r + 1], dp[WANT_DS ? j : 0][2 * r + 1],
                                       m0 + c + 1, key0 + g + 8 * r, nq, nk, l2.y, ds.y, slope);
        }
    }
}

/* The deterministic dQ kernel's tile: 16 queries (rows, from row0) x NJ x 8 keys (columns,
 * from j0); lse2 and dsum per row. */
template <int MODE, int NJ>
FP_DEV void fp_bwd_tile(const fp_sm80_args &a, const fp_mask32 &mk, float (*s)[4], float (*dp)[4],
                        int row0, int j0, int nq, int nk, const float lse2[2], const float dsum[2],
                        float slope, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                fp_bwd_elem<MODE, true>(a, mk, s[j][2 * r + e], dp[j][2 * r + e], row0 + g + 8 * r,
                                        j0 + 8 * j + 2 * t + e, nq, nk, lse2[r], dsum[r], slope);
}

// o, dout: (B, Nq, H, D); lse: (B, H, Nq) -> ws_lse2, ws_dsum: (B, H, nq_pad); zeroes dq_accum.
// grid (nq_pad / 4, H, B), 128 threads, one warp per row.
template <typename T> __global__ void __launch_bounds__(128) fp_sm80_bwd_pre(const fp_sm80_args a)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * 4 + warp, h = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    float dsum = 0.0f, lse2 = INFINITY;
    if (i < sq_.nq) {
        const T *o = reinterpret_cast<const T *>(a.o.ptr) + fp_cuda_row(a.o, b, sq_.q_start + i, h);
        const T *d =
            reinterpret_cast<const T *>(a.dout.ptr) + fp_cuda_row(a.dout, b, sq_.q_start + i, h);
        for (int c = lane; c < a.d; c += 32)
            dsum += fp_to_f32(o[c]) * fp_to_f32(d[c]);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            dsum += __shfl_xor_sync(0xffffffffu, dsum, off);
        const float l =
            a.lse[(int64_t)b * a.lse_sb + (int64_t)h * a.lse_sh + (sq_.q_start + i) * a.lse_ss];
        lse2 = l == -INFINITY ? INFINITY : l * FP_LOG2E;
    }
    const int64_t idx = ((int64_t)b * a.heads + h) * a.nq_pad + i;
    if (lane == 0) {
        a.ws_lse2[idx] = lse2;
        a.ws_dsum[idx] = dsum;
    }
    if (a.dq_accum) {
        float4 *row = reinterpret_cast<float4 *>(a.dq_accum + idx * a.d_accum);
        for (int c = lane; c < a.d_accum / 4; c += 32)
            row[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* The steps of a dK/dV kernel: every query block mb_lo <= mb < mb_end that sees the key block,
 * for each query head of the kv head's group in turn. Walked with counters: a division per step
 * costs about twenty instructions per thread. */
FP_DEV void fp_bwd_next_step(int &h, int &mb, int mb_lo, int mb_end)
{
    if (++mb == mb_end) {
        mb = mb_lo;
        ++h;
    }
}

/* cp.async loads of one step (query head h, query rows m..) into buffer `buf`: the Q and dO
 * tiles, LSE2 and Dsum. */
template <typename T, int DK, int NT, int BM>
FP_DEV void fp_bwd_load_step(const fp_sm80_args &a, T *sq, T *sdo, float *slse, float *sdsum, int b,
                             int h, int64_t q_start, int nq, int m, int nchunks, int buf)
{
    const int tid = threadIdx.x;
    const int64_t row = q_start + m;
    fp_load_tile<BM, DK, NT>(sq + buf * BM * DK,
                             reinterpret_cast<const T *>(a.q.ptr) + fp_cuda_row(a.q, b, row, h),
                             a.q.ss, nq - m, nchunks, tid);
    fp_load_tile<BM, DK, NT>(sdo + buf * BM * DK,
                             reinterpret_cast<const T *>(a.dout.ptr) +
                                 fp_cuda_row(a.dout, b, row, h),
                             a.dout.ss, nq - m, nchunks, tid);
    const int64_t w = ((int64_t)b * a.heads + h) * a.nq_pad + m;
    if (tid < BM / 4)
        fp_cp_async16(fp_smem_addr(slse + buf * BM + 4 * tid), a.ws_lse2 + w + 4 * tid, 16);
    else if (tid < BM / 2)
        fp_cp_async16(fp_smem_addr(sdsum + buf * BM + 4 * (tid - BM / 4)),
                      a.ws_dsum + w + 4 * (tid - BM / 4), 16);
}

/* The end of the dK/dV kernels: waits for the last copies, then writes dV, and dK * scale,
 * staged through sk (rows past nrows and padded columns not written). */
template <typename T, int DK, int NW, bool WANT_DV, bool WANT_DK>
FP_DEV void fp_bwd_store_dkdv(const fp_sm80_args &a, T *sk, const float (*dv)[4],
                              const float (*dk)[4], int b, int64_t key0, int kvh, int nrows,
                              int nchunks)
{
    constexpr int NT = NW * 32, BN = 16 * NW, DT8 = DK / 8;
    const int tid = threadIdx.x, krow = (tid >> 5) * 16, lane = tid & 31;
    fp_cp_async_wait<0>();
    __syncthreads();
    if constexpr (WANT_DV) {
        fp_stage_acc<DK, DT8, T>(sk, krow, 0, dv, 1.0f, 1.0f, lane);
        __syncthreads();
        T *dst =
            reinterpret_cast<T *>(const_cast<void *>(a.dv.ptr)) + fp_cuda_row(a.dv, b, key0, kvh);
        fp_store_tile<BN, DK, NT>(dst, a.dv.ss, sk, nrows, nchunks, tid);
        __syncthreads();
    }
    if constexpr (WANT_DK) {
        fp_stage_acc<DK, DT8, T>(sk, krow, 0, dk, a.scale, a.scale, lane);
        __syncthreads();
        T *dst =
            reinterpret_cast<T *>(const_cast<void *>(a.dk.ptr)) + fp_cuda_row(a.dk, b, key0, kvh);
        fp_store_tile<BN, DK, NT>(dst, a.dk.ss, sk, nrows, nchunks, tid);
    }
}

// q, dout: (B, Nq, H, D); k, v, dk, dv: (B, Nk, Hkv, D); grid (key blocks, Hkv, B).
template <typename T, int DK, bool BIG, int PASS>
__global__ void __launch_bounds__(fp_bwd_cfg<DK, BIG>::NW * 32)
    fp_sm80_bwd_dkdv(const fp_sm80_args a)
{
    constexpr int NW = fp_bwd_cfg<DK, BIG>::NW, BM = fp_bwd_cfg<DK, BIG>::BM;
    constexpr int SLICE = fp_bwd_cfg<DK, BIG>::SLICE;
    constexpr int NT = NW * 32, BN = 16 * NW;
    constexpr int KT = DK / 16, MB8 = BM / 8, DT8 = DK / 8;
    constexpr bool WANT_DV = PASS != FP_PASS_DK, WANT_DK = PASS != FP_PASS_DV;
    constexpr int ITEMS = (BM / 16) * (DK / SLICE);
    static_assert(ITEMS % NW == 0 && NW % (BM / 16) == 0 && SLICE % 16 == 0,
                  "dQ slices: one 16-row tile per warp, whole k steps per slice");

    extern __shared__ __align__(128) unsigned char fp_smem[];
    T *sk = reinterpret_cast<T *>(fp_smem); /* [BN][DK], later the dK/dV staging tile */
    T *sv = sk + BN * DK;                   /* [BN][DK] (WANT_DK) */
    T *sq = sv + (WANT_DK ? BN * DK : 0);   /* [2][BM][DK] */
    T *sdo = sq + 2 * BM * DK;              /* [2][BM][DK] */
    T *sds = sdo + 2 * BM * DK;             /* [BN][BM] (WANT_DK) */
    float *slse = reinterpret_cast<float *>(sds + (WANT_DK ? BN * BM : 0)); /* [2][BM] */
    float *sdsum = slse + 2 * BM;                                           /* [2][BM] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    const int nq = sq_.nq, nk = sq_.nk;
    const int n0 = kb * BN;
    if (n0 >= nk)
        return;
    const int nchunks = a.d / 8;

    int64_t i0, i1;
    fp_cuda_rows_for_keys(n0, min(n0 + BN, nk), nq, nk, a.left, a.right, &i0, &i1);
    const int mb_lo = (int)(i0 / BM);
    const int nmb = i1 > i0 ? (int)((i1 + BM - 1) / BM) - mb_lo : 0;
    const int iters = a.group * nmb;

    const T *kg = reinterpret_cast<const T *>(a.k.ptr) + fp_cuda_row(a.k, b, sq_.k_start + n0, kvh);
    const T *vg = reinterpret_cast<const T *>(a.v.ptr) + fp_cuda_row(a.v, b, sq_.k_start + n0, kvh);
    fp_load_tile<BN, DK, NT>(sk, kg, a.k.ss, nk - n0, nchunks, tid);
    if constexpr (WANT_DK)
        fp_load_tile<BN, DK, NT>(sv, vg, a.v.ss, nk - n0, nchunks, tid);

    if (iters > 0)
        fp_bwd_load_step<T, DK, NT, BM>(a, sq, sdo, slse, sdsum, b, kvh * a.group, sq_.q_start,
                                        nq, mb_lo * BM, nchunks, 0);
    fp_cp_async_commit();

    float dv[WANT_DV ? DT8 : 1][4], dk[WANT_DK ? DT8 : 1][4];
#pragma unroll
    for (int j = 0; j < (WANT_DV ? DT8 : 1); ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dv[j][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < (WANT_DK ? DT8 : 1); ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dk[j][e] = 0.0f;

    const int krow = warp * 16; /* this warp's keys within the block */
    const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);
    const uint32_t sk_a = fp_smem_addr(sk), sv_a = fp_smem_addr(sv);
    const uint32_t sq_a = fp_smem_addr(sq), sdo_a = fp_smem_addr(sdo), sds_a = fp_smem_addr(sds);
    const fp_ldsm_lane lka = fp_lane_a<DK>(krow, lane), lb = fp_lane_b<DK>(0, lane);
    const fp_ldsm_lane lbt = fp_lane_bt<DK>(0, lane);
    /* dQ: this warp's 16-row tile of the query block, read as A from dS^T (At lanes = B lanes) */
    const int dq_mt = warp % (BM / 16);
    const uint32_t ds_off =
        fp_ldsm_off<BM>(0, ((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1, dq_mt);

    int h = kvh * a.group, mb = mb_lo - 1; /* the step's query head and block, advanced first */
    for (int it = 0; it < iters; ++it) {
        const int buf = it & 1;
        fp_bwd_next_step(h, mb, mb_lo, mb_lo + nmb);
        const int m0 = mb * BM;
        int h1 = h, mb1 = mb; /* step it + 1 */
        fp_bwd_next_step(h1, mb1, mb_lo, mb_lo + nmb);
        fp_cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < iters)
            fp_bwd_load_step<T, DK, NT, BM>(a, sq, sdo, slse, sdsum, b, h1, sq_.q_start, nq,
                                            mb1 * BM, nchunks, buf ^ 1);
        fp_cp_async_commit();

        /* S^T = K Q^T, dP^T = V dO^T (this warp's 16 keys x BM queries) */
        float s[MB8][4], dp[WANT_DK ? MB8 : 1][4];
#pragma unroll
        for (int j = 0; j < MB8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[j][e] = 0.0f;
#pragma unroll
        for (int j = 0; j < (WANT_DK ? MB8 : 1); ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dp[j][e] = 0.0f;
        const uint32_t qt = sq_a + buf * BM * DK * 2, dot = sdo_a + buf * BM * DK * 2;
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            uint32_t ka[4], va[4];
            fp_ldsm_x4(ka, fp_ldsm_addr<DK>(sk_a, lka, 0, kk));
            if constexpr (WANT_DK)
                fp_ldsm_x4(va, fp_ldsm_addr<DK>(sv_a, lka, 0, kk));
#pragma unroll
            for (int p = 0; p < BM / 16; ++p) {
                uint32_t qb[4];
                fp_ldsm_x4(qb, fp_ldsm_addr<DK>(qt, lb, 16 * p, kk));
                fp_mma<T>(s[2 * p], ka, qb[0], qb[1]);
                fp_mma<T>(s[2 * p + 1], ka, qb[2], qb[3]);
                if constexpr (WANT_DK) {
                    uint32_t db[4];
                    fp_ldsm_x4(db, fp_ldsm_addr<DK>(dot, lb, 16 * p, kk));
                    fp_mma<T>(dp[2 * p], va, db[0], db[1]);
                    fp_mma<T>(dp[2 * p + 1], va, db[2], db[3]);
                }
            }
        }

        /* P^T and dS^T */
        const bool full =
            fp_mask_block_full(m0, min(m0 + BM, nq), n0, n0 + BN, nq, nk, a.left, a.right);
        const float slope = a.alibi ? a.alibi[h] : 0.0f;
        const float *lse2 = slse + buf * BM, *dsum = sdsum + buf * BM;
        if (a.transform)
            fp_bwd_tile_t<FP_SCORES_TRANSFORM, WANT_DK, MB8>(a, mk, s, dp, m0, n0 + krow, nq, nk,
                                                             lse2, dsum, slope, lane);
        else if (!full)
            fp_bwd_tile_t<FP_SCORES_MASK, WANT_DK, MB8>(a, mk, s, dp, m0, n0 + krow, nq, nk, lse2,
                                                        dsum, slope, lane);
        else
            fp_bwd_tile_t<FP_SCORES_FULL, WANT_DK, MB8>(a, mk, s, dp, m0, n0 + krow, nq, nk, lse2,
                                                        dsum, slope, lane);

            /* dV += P^T dO, dK += dS^T Q */
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            uint32_t pa[4], da[4];
            if constexpr (WANT_DV)
                fp_acc_to_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
            if constexpr (WANT_DK)
                fp_acc_to_a<T>(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
            for (int p = 0; p < DK / 16; ++p) {
                if constexpr (WANT_DV) {
                    uint32_t ob[4];
                    fp_ldsm_x4_t(ob, fp_ldsm_addr<DK>(dot, lbt, 16 * kk, p));
                    fp_mma<T>(dv[2 * p], pa, ob[0], ob[1]);
                    fp_mma<T>(dv[2 * p + 1], pa, ob[2], ob[3]);
                }
                if constexpr (WANT_DK) {
                    uint32_t qb[4];
                    fp_ldsm_x4_t(qb, fp_ldsm_addr<DK>(qt, lbt, 16 * kk, p));
                    fp_mma<T>(dk[2 * p], da, qb[0], qb[1]);
                    fp_mma<T>(dk[2 * p + 1], da, qb[2], qb[3]);
                }
            }
        }

        /* dQ += dS K (atomic mode): dS^T through shared memory, then BM x DK in slices. */
        if constexpr (WANT_DK) {
            if (!a.dq_atomic)
                continue;
            fp_stage_acc<BM, MB8, T>(sds, krow, 0, dp, 1.0f, 1.0f, lane);
            __syncthreads();
#pragma unroll
            for (int w = 0; w < ITEMS / NW; ++w) {
                const int mt = dq_mt, sl = (w * NW + warp) / (BM / 16);
                /* K^T lane offsets of this slice's chunk pairs (Bt lanes); a slice of whole
                 * swizzle groups (SLICE % 64 == 0) reuses lbt, a narrower one computes them. */
                uint32_t koff[SLICE / 16];
#pragma unroll
                for (int p = 0; p < SLICE / 16; ++p) {
                    if constexpr (SLICE % 64 == 0)
                        koff[p] = lbt.off[p & 3] + (uint32_t)((sl * SLICE + (p >> 2) * 64) * 2);
                    else
                        koff[p] = fp_ldsm_off<DK>(0, (((lane >> 3) & 1) << 3) + (lane & 7),
                                                  lane >> 4, sl * (SLICE / 16) + p);
                }
                float acc[SLICE / 8][4];
#pragma unroll
                for (int j = 0; j < SLICE / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        acc[j][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < BN / 16; ++kk) {
                    uint32_t da[4];
                    fp_ldsm_x4_t(da, sds_a + ds_off + 16 * kk * BM * 2);
#pragma unroll
                    for (int p = 0; p < SLICE / 16; ++p) {
                        uint32_t kb2[4];
                        fp_ldsm_x4_t(kb2, sk_a + koff[p] + 16 * kk * DK * 2);
                        fp_mma<T>(acc[2 * p], da, kb2[0], kb2[1]);
                        fp_mma<T>(acc[2 * p + 1], da, kb2[2], kb2[3]);
                    }
                }
                float *dst = a.dq_accum +
                             (((int64_t)b * a.heads + h) * a.nq_pad + m0 + mt * 16 + g) * DK +
                             sl * SLICE + 2 * t;
#pragma unroll
                for (int j = 0; j < SLICE / 8; ++j) {
                    fp_red_add2(dst + 8 * j, acc[j][0], acc[j][1]);
                    fp_red_add2(dst + 8 * DK + 8 * j, acc[j][2], acc[j][3]);
                }
            }
        }
    }
    fp_bwd_store_dkdv<T, DK, NW, WANT_DV, WANT_DK>(a, sk, dv, dk, b, sq_.k_start + n0, kvh, nk - n0,
                                                   nchunks);
}

/* ldmatrix fragments of k step kk of S^T = K Q^T and dP^T = V dO^T: this warp's K and V rows (A)
 * and NP 16-column pieces of Q and dO from column c0 (B). */
template <int DK, int NP, bool WANT_DK>
FP_DEV void fp_bwd_sdp_frags(uint32_t ka[4], uint32_t va[4], uint32_t (*qb)[4], uint32_t (*db)[4],
                             uint32_t sk_a, uint32_t sv_a, uint32_t qt, uint32_t dot,
                             const fp_ldsm_lane &lka, const fp_ldsm_lane &lb, int c0, int kk)
{
    fp_ldsm_x4(ka, fp_ldsm_addr<DK>(sk_a, lka, 0, kk));
    if constexpr (WANT_DK)
        fp_ldsm_x4(va, fp_ldsm_addr<DK>(sv_a, lka, 0, kk));
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        fp_ldsm_x4(qb[p], fp_ldsm_addr<DK>(qt, lb, c0 + 16 * p, kk));
        if constexpr (WANT_DK)
            fp_ldsm_x4(db[p], fp_ldsm_addr<DK>(dot, lb, c0 + 16 * p, kk));
    }
}

/* Transposed dO and Q fragments of step i of dV += P^T dO, dK += dS^T Q (i = kk * DK / 16 + p:
 * query rows c0 + 16 kk.., head-dim columns 16 p..). */
template <int DK, bool WANT_DV, bool WANT_DK>
FP_DEV void fp_bwd_dkv_frags(uint32_t ob[4], uint32_t qb[4], uint32_t dot, uint32_t qt,
                             const fp_ldsm_lane &lbt, int c0, int i)
{
    const int kk = i / (DK / 16), p = i % (DK / 16);
    if constexpr (WANT_DV)
        fp_ldsm_x4_t(ob, fp_ldsm_addr<DK>(dot, lbt, c0 + 16 * kk, p));
    if constexpr (WANT_DK)
        fp_ldsm_x4_t(qb, fp_ldsm_addr<DK>(qt, lbt, c0 + 16 * kk, p));
}

// The dK/dV kernel with QS > 1 sub-blocks, software-pipelined. Same arguments and grid.
template <typename T, int DK, bool BIG, int PASS>
__global__ void __launch_bounds__(fp_bwd_cfg<DK, BIG>::NW * 32)
    fp_sm80_bwd_dkdv_sub(const fp_sm80_args a)
{
    using CFG = fp_bwd_cfg<DK, BIG>;
    constexpr int NW = CFG::NW, BM = CFG::BM, QS = CFG::QS, SLICE = CFG::SLICE;
    constexpr int NT = NW * 32, BN = 16 * NW, BMS = BM / QS;
    constexpr int KT = DK / 16, MB8 = BMS / 8, DT8 = DK / 8;
    constexpr bool WANT_DV = PASS != FP_PASS_DK, WANT_DK = PASS != FP_PASS_DV;
    constexpr int ITEMS = (BM / 16) * (DK / SLICE);
    static_assert(ITEMS % NW == 0 && NW % (BM / 16) == 0 && SLICE % 16 == 0,
                  "dQ slices: one 16-row tile per warp, whole k steps per slice");
    static_assert(BM % QS == 0 && BMS % 16 == 0, "sub-blocks of whole 16-column steps");

    extern __shared__ __align__(128) unsigned char fp_smem[];
    T *sk = reinterpret_cast<T *>(fp_smem); /* [BN][DK], later the dK/dV staging tile */
    T *sv = sk + BN * DK;                   /* [BN][DK] (WANT_DK) */
    T *sq = sv + (WANT_DK ? BN * DK : 0);   /* [2][BM][DK] */
    T *sdo = sq + 2 * BM * DK;              /* [2][BM][DK] */
    T *sds = sdo + 2 * BM * DK;             /* [BN][BM] (WANT_DK) */
    float *slse = reinterpret_cast<float *>(sds + (WANT_DK ? BN * BM : 0)); /* [2][BM] */
    float *sdsum = slse + 2 * BM;                                           /* [2][BM] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    const int nq = sq_.nq, nk = sq_.nk;
    const int n0 = kb * BN;
    if (n0 >= nk)
        return;
    const int nchunks = a.d / 8;

    int64_t i0, i1;
    fp_cuda_rows_for_keys(n0, min(n0 + BN, nk), nq, nk, a.left, a.right, &i0, &i1);
    const int mb_lo = (int)(i0 / BM);
    const int nmb = i1 > i0 ? (int)((i1 + BM - 1) / BM) - mb_lo : 0;
    const int iters = a.group * nmb;

    const T *kg = reinterpret_cast<const T *>(a.k.ptr) + fp_cuda_row(a.k, b, sq_.k_start + n0, kvh);
    const T *vg = reinterpret_cast<const T *>(a.v.ptr) + fp_cuda_row(a.v, b, sq_.k_start + n0, kvh);
    fp_load_tile<BN, DK, NT>(sk, kg, a.k.ss, nk - n0, nchunks, tid);
    if constexpr (WANT_DK)
        fp_load_tile<BN, DK, NT>(sv, vg, a.v.ss, nk - n0, nchunks, tid);

    if (iters > 0)
        fp_bwd_load_step<T, DK, NT, BM>(a, sq, sdo, slse, sdsum, b, kvh * a.group, sq_.q_start,
                                        nq, mb_lo * BM, nchunks, 0);
    fp_cp_async_commit();

    float dv[WANT_DV ? DT8 : 1][4], dk[WANT_DK ? DT8 : 1][4];
#pragma unroll
    for (int j = 0; j < (WANT_DV ? DT8 : 1); ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dv[j][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < (WANT_DK ? DT8 : 1); ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dk[j][e] = 0.0f;

    const int krow = warp * 16; /* this warp's keys within the block */
    const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);
    const uint32_t sk_a = fp_smem_addr(sk), sv_a = fp_smem_addr(sv);
    const uint32_t sq_a = fp_smem_addr(sq), sdo_a = fp_smem_addr(sdo), sds_a = fp_smem_addr(sds);
    const fp_ldsm_lane lka = fp_lane_a<DK>(krow, lane), lb = fp_lane_b<DK>(0, lane);
    const fp_ldsm_lane lbt = fp_lane_bt<DK>(0, lane);
    /* dQ: this warp's 16-row tile of the query block, read as A from dS^T (At lanes = B lanes) */
    const int dq_mt = warp % (BM / 16);
    const uint32_t ds_off =
        fp_ldsm_off<BM>(0, ((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1, dq_mt);

    int h = kvh * a.group, mb = mb_lo - 1; /* the step's query head and block, advanced first */
    for (int it = 0; it < iters; ++it) {
        const int buf = it & 1;
        fp_bwd_next_step(h, mb, mb_lo, mb_lo + nmb);
        const int m0 = mb * BM;
        int h1 = h, mb1 = mb; /* step it + 1 */
        fp_bwd_next_step(h1, mb1, mb_lo, mb_lo + nmb);
        fp_cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < iters)
            fp_bwd_load_step<T, DK, NT, BM>(a, sq, sdo, slse, sdsum, b, h1, sq_.q_start, nq,
                                            mb1 * BM, nchunks, buf ^ 1);
        fp_cp_async_commit();

        const uint32_t qt = sq_a + buf * BM * DK * 2, dot = sdo_a + buf * BM * DK * 2;

        /* A real loop: unrolled, the sub-blocks' products would be interleaved and their S^T
         * and dP^T live at once, which is what the sub-blocks are there to avoid. */
#pragma unroll 1
        for (int qs = 0; qs < QS; ++qs) {
            const int c0 = qs * BMS; /* the sub-block's first query within the block */

            /* S^T = K Q^T, dP^T = V dO^T (this warp's 16 keys x BMS queries) */
            float s[MB8][4], dp[WANT_DK ? MB8 : 1][4];
#pragma unroll
            for (int j = 0; j < MB8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[j][e] = 0.0f;
#pragma unroll
            for (int j = 0; j < (WANT_DK ? MB8 : 1); ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dp[j][e] = 0.0f;
            /* Software-pipelined: k step kk + 1's fragments are requested before step kk's
             * products, so the ldmatrix latency overlaps the mma. */
            constexpr int NP = BMS / 16;
            uint32_t ka[2][4], va[2][4], qb[2][NP][4], db[2][NP][4];
            fp_bwd_sdp_frags<DK, NP, WANT_DK>(ka[0], va[0], qb[0], db[0], sk_a, sv_a, qt, dot, lka,
                                              lb, c0, 0);
#pragma unroll
            for (int kk = 0; kk < KT; ++kk) {
                const int cur = kk & 1;
                if (kk + 1 < KT)
                    fp_bwd_sdp_frags<DK, NP, WANT_DK>(ka[cur ^ 1], va[cur ^ 1], qb[cur ^ 1],
                                                      db[cur ^ 1], sk_a, sv_a, qt, dot, lka, lb, c0,
                                                      kk + 1);
#pragma unroll
                for (int p = 0; p < NP; ++p) {
                    fp_mma<T>(s[2 * p], ka[cur], qb[cur][p][0], qb[cur][p][1]);
                    fp_mma<T>(s[2 * p + 1], ka[cur], qb[cur][p][2], qb[cur][p][3]);
                    if constexpr (WANT_DK) {
                        fp_mma<T>(dp[2 * p], va[cur], db[cur][p][0], db[cur][p][1]);
                        fp_mma<T>(dp[2 * p + 1], va[cur], db[cur][p][2], db[cur][p][3]);
                    }
                }
            }

            /* P^T and dS^T */
            const bool full =
                fp_mask_block_full(m0, min(m0 + BM, nq), n0, n0 + BN, nq, nk, a.left, a.right);
            const float slope = a.alibi ? a.alibi[h] : 0.0f;
            const float *lse2 = slse + buf * BM + c0, *dsum = sdsum + buf * BM + c0;
            if (a.transform)
                fp_bwd_tile_t<FP_SCORES_TRANSFORM, WANT_DK, MB8>(a, mk, s, dp, m0 + c0, n0 + krow,
                                                                 nq, nk, lse2, dsum, slope, lane);
            else if (!full)
                fp_bwd_tile_t<FP_SCORES_MASK, WANT_DK, MB8>(a, mk, s, dp, m0 + c0, n0 + krow, nq,
                                                            nk, lse2, dsum, slope, lane);
            else
                fp_bwd_tile_t<FP_SCORES_FULL, WANT_DK, MB8>(a, mk, s, dp, m0 + c0, n0 + krow, nq,
                                                            nk, lse2, dsum, slope, lane);

            /* dV += P^T dO, dK += dS^T Q, fragments requested two steps ahead */
            constexpr int NI = (BMS / 16) * (DK / 16);
            uint32_t ob[3][4], qtb[3][4];
            fp_bwd_dkv_frags<DK, WANT_DV, WANT_DK>(ob[0], qtb[0], dot, qt, lbt, c0, 0);
            fp_bwd_dkv_frags<DK, WANT_DV, WANT_DK>(ob[1], qtb[1], dot, qt, lbt, c0, 1);
#pragma unroll
            for (int kk = 0; kk < BMS / 16; ++kk) {
                uint32_t pa[4], da[4];
                if constexpr (WANT_DV)
                    fp_acc_to_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
                if constexpr (WANT_DK)
                    fp_acc_to_a<T>(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
                for (int p = 0; p < DK / 16; ++p) {
                    const int i = kk * (DK / 16) + p, cur = i % 3;
                    if (i + 2 < NI)
                        fp_bwd_dkv_frags<DK, WANT_DV, WANT_DK>(ob[(i + 2) % 3], qtb[(i + 2) % 3],
                                                               dot, qt, lbt, c0, i + 2);
                    if constexpr (WANT_DV) {
                        fp_mma<T>(dv[2 * p], pa, ob[cur][0], ob[cur][1]);
                        fp_mma<T>(dv[2 * p + 1], pa, ob[cur][2], ob[cur][3]);
                    }
                    if constexpr (WANT_DK) {
                        fp_mma<T>(dk[2 * p], da, qtb[cur][0], qtb[cur][1]);
                        fp_mma<T>(dk[2 * p + 1], da, qtb[cur][2], qtb[cur][3]);
                    }
                }
            }

            /* dS^T of the sub-block to shared memory for dQ (atomic mode) */
            if constexpr (WANT_DK) {
                if (a.dq_atomic)
                    fp_stage_acc<BM, MB8, T>(sds, krow, c0 / 8, dp, 1.0f, 1.0f, lane);
            }
        }

        /* dQ += dS K (atomic mode): dS^T (staged above), BM x DK in slices. */
        if constexpr (WANT_DK) {
            if (!a.dq_atomic)
                continue;
            __syncthreads();
#pragma unroll
            for (int w = 0; w < ITEMS / NW; ++w) {
                const int mt = dq_mt, sl = (w * NW + warp) / (BM / 16);
                /* K^T lane offsets of this slice's chunk pairs (Bt lanes); a slice of whole
                 * swizzle groups (SLICE % 64 == 0) reuses lbt, a narrower one computes them. */
                uint32_t koff[SLICE / 16];
#pragma unroll
                for (int p = 0; p < SLICE / 16; ++p) {
                    if constexpr (SLICE % 64 == 0)
                        koff[p] = lbt.off[p & 3] + (uint32_t)((sl * SLICE + (p >> 2) * 64) * 2);
                    else
                        koff[p] = fp_ldsm_off<DK>(0, (((lane >> 3) & 1) << 3) + (lane & 7),
                                                  lane >> 4, sl * (SLICE / 16) + p);
                }
                float acc[SLICE / 8][4];
#pragma unroll
                for (int j = 0; j < SLICE / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        acc[j][e] = 0.0f;
                /* pipelined like the products above: k step kk + 1's fragments first */
                uint32_t da[2][4], kb2[2][SLICE / 16][4];
#pragma unroll
                for (int kk = 0; kk <= BN / 16; ++kk) {
                    if (kk < BN / 16) {
                        fp_ldsm_x4_t(da[kk & 1], sds_a + ds_off + 16 * kk * BM * 2);
#pragma unroll
                        for (int p = 0; p < SLICE / 16; ++p)
                            fp_ldsm_x4_t(kb2[kk & 1][p], sk_a + koff[p] + 16 * kk * DK * 2);
                    }
                    if (kk > 0) {
                        const int c = (kk - 1) & 1;
#pragma unroll
                        for (int p = 0; p < SLICE / 16; ++p) {
                            fp_mma<T>(acc[2 * p], da[c], kb2[c][p][0], kb2[c][p][1]);
                            fp_mma<T>(acc[2 * p + 1], da[c], kb2[c][p][2], kb2[c][p][3]);
                        }
                    }
                }
                float *dst = a.dq_accum +
                             (((int64_t)b * a.heads + h) * a.nq_pad + m0 + mt * 16 + g) * DK +
                             sl * SLICE + 2 * t;
#pragma unroll
                for (int j = 0; j < SLICE / 8; ++j) {
                    fp_red_add2(dst + 8 * j, acc[j][0], acc[j][1]);
                    fp_red_add2(dst + 8 * DK + 8 * j, acc[j][2], acc[j][3]);
                }
            }
        }
    }
    fp_bwd_store_dkdv<T, DK, NW, WANT_DV, WANT_DK>(a, sk, dv, dk, b, sq_.k_start + n0, kvh, nk - n0,
                                                   nchunks);
}

/* The 2-D tiled dK/dV kernel (FlashAttention-2's backward layout), D = 64 and 128 where its
 * shared memory fits: one thread block per (key block of BN keys, kv head, batch), query blocks
 * of BM rows double-buffered as above. Unlike fp_sm80_bwd_dkdv, no warp owns whole rows of every
 * product; each product is cut into a 2-D grid of warp tiles so that every warp reads less of
 * the shared operands per mma:
 *   S = Q K^T and dP = dO V^T (BM x BN):  SM_Q warps along the queries x NW / SM_Q along the keys;
 *     P and dS (rounded to T) go to shared memory, [BM][BN];
 *   dV += P^T dO and dK += dS^T Q (BN x DK): KV_K warps along the keys x NW / KV_K along the head
 *     dim, P^T and dS^T read with ldmatrix.trans; dK and dV stay in registers across the loop;
 *   dQ += dS K (BM x DK, atomic mode): DQ_Q warps along the queries x NW / DQ_Q along the head
 *     dim, added to the f32 accumulator with vector reductions.
 * Each k step's fragments are all requested before its mma, so the ldmatrix latency is paid once
 * per step, not once per product. */
template <int DK, int ALT> struct fp_bwd2_cfg;
template <> struct fp_bwd2_cfg<64, 0> {
    enum { NW = 8, BN = 128, BM = 64, SM_Q = 2, KV_K = 4, DQ_Q = 4, MINB = 1 };
};
template <> struct fp_bwd2_cfg<64, 1> {
    enum { NW = 8, BN = 128, BM = 128, SM_Q = 4, KV_K = 4, DQ_Q = 4, MINB = 1 };
};
template <> struct fp_bwd2_cfg<64, 2> {
    enum { NW = 4, BN = 64, BM = 64, SM_Q = 2, KV_K = 2, DQ_Q = 2, MINB = 2 };
};
template <> struct fp_bwd2_cfg<128, 0> {
    enum { NW = 8, BN = 128, BM = 64, SM_Q = 2, KV_K = 4, DQ_Q = 2, MINB = 1 };
};
template <> struct fp_bwd2_cfg<128, 1> {
    enum { NW = 4, BN = 64, BM = 64, SM_Q = 2, KV_K = 2, DQ_Q = 2, MINB = 2 };
};

template <int DK, int ALT> constexpr size_t fp_dkdv2_smem()
{
    constexpr int BN = fp_bwd2_cfg<DK, ALT>::BN, BM = fp_bwd2_cfg<DK, ALT>::BM;
    return (size_t)(2 * BN * DK + 4 * BM * DK + 2 * BM * BN) * 2 + 4 * BM * sizeof(float);
}

// q, dout: (B, Nq, H, D); k, v, dk, dv: (B, Nk, Hkv, D); grid (key blocks, Hkv, B).
template <typename T, int DK, int ALT>
__global__ void __launch_bounds__(fp_bwd2_cfg<DK, ALT>::NW * 32, fp_bwd2_cfg<DK, ALT>::MINB)
    fp_sm80_bwd_dkdv_2d(const fp_sm80_args a)
{
    using CFG = fp_bwd2_cfg<DK, ALT>;
    constexpr int NW = CFG::NW, BN = CFG::BN, BM = CFG::BM, NT = NW * 32, KT = DK / 16;
    /* warp tiles: MT x 16 rows, NP x 16 columns */
    constexpr int S_MT = BM / CFG::SM_Q / 16, S_NP = BN / (NW / CFG::SM_Q) / 16;
    constexpr int KV_MT = BN / CFG::KV_K / 16, KV_NP = DK / (NW / CFG::KV_K) / 16;
    constexpr int DQ_MT = BM / CFG::DQ_Q / 16, DQ_NP = DK / (NW / CFG::DQ_Q) / 16;
    static_assert(S_MT >= 1 && S_NP >= 1 && KV_MT >= 1 && KV_NP >= 1 && DQ_MT >= 1 && DQ_NP >= 1,
                  "every warp tile has whole 16 x 16 pieces");

    extern __shared__ __align__(128) unsigned char fp_smem[];
    T *sk = reinterpret_cast<T *>(fp_smem); /* [BN][DK], later the dK/dV staging tile */
    T *sv = sk + BN * DK;                   /* [BN][DK] */
    T *sq = sv + BN * DK;                   /* [2][BM][DK] */
    T *sdo = sq + 2 * BM * DK;              /* [2][BM][DK] */
    T *sp = sdo + 2 * BM * DK;              /* [BM][BN] */
    T *sds = sp + BM * BN;                  /* [BM][BN] */
    float *slse = reinterpret_cast<float *>(sds + BM * BN); /* [2][BM] */
    float *sdsum = slse + 2 * BM;                           /* [2][BM] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    const int nq = sq_.nq, nk = sq_.nk;
    const int n0 = kb * BN;
    if (n0 >= nk)
        return;
    const int nchunks = a.d / 8;

    int64_t i0, i1;
    fp_cuda_rows_for_keys(n0, min(n0 + BN, nk), nq, nk, a.left, a.right, &i0, &i1);
    const int mb_lo = (int)(i0 / BM);
    const int nmb = i1 > i0 ? (int)((i1 + BM - 1) / BM) - mb_lo : 0;
    const int iters = a.group * nmb;

    const T *kg = reinterpret_cast<const T *>(a.k.ptr) + fp_cuda_row(a.k, b, sq_.k_start + n0, kvh);
    const T *vg = reinterpret_cast<const T *>(a.v.ptr) + fp_cuda_row(a.v, b, sq_.k_start + n0, kvh);
    fp_load_tile<BN, DK, NT>(sk, kg, a.k.ss, nk - n0, nchunks, tid);
    fp_load_tile<BN, DK, NT>(sv, vg, a.v.ss, nk - n0, nchunks, tid);
    if (iters > 0)
        fp_bwd_load_step<T, DK, NT, BM>(a, sq, sdo, slse, sdsum, b, kvh * a.group, sq_.q_start,
                                        nq, mb_lo * BM, nchunks, 0);
    fp_cp_async_commit();

    float dv[KV_MT][2 * KV_NP][4], dk[KV_MT][2 * KV_NP][4];
#pragma unroll
    for (int mi = 0; mi < KV_MT; ++mi)
#pragma unroll
        for (int j = 0; j < 2 * KV_NP; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                dv[mi][j][e] = 0.0f;
                dk[mi][j][e] = 0.0f;
            }

    /* This warp's tiles: first row and column of each product. */
    const int s_q0 = (warp % CFG::SM_Q) * S_MT * 16, s_k0 = (warp / CFG::SM_Q) * S_NP * 16;
    const int kv_k0 = (warp % CFG::KV_K) * KV_MT * 16, kv_d0 = (warp / CFG::KV_K) * KV_NP * 16;
    const int dq_q0 = (warp % CFG::DQ_Q) * DQ_MT * 16, dq_d0 = (warp / CFG::DQ_Q) * DQ_NP * 16;

    const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);
    const uint32_t sk_a = fp_smem_addr(sk), sv_a = fp_smem_addr(sv), sq_a = fp_smem_addr(sq);
    const uint32_t sdo_a = fp_smem_addr(sdo), sp_a = fp_smem_addr(sp), sds_a = fp_smem_addr(sds);
    /* Operands whose k runs along the tile's columns: lane patterns with the warp's first row. */
    const fp_ldsm_lane la_s = fp_lane_a<DK>(s_q0, lane), lb_s = fp_lane_b<DK>(s_k0, lane);
    const fp_ldsm_lane la_dq = fp_lane_a<BN>(dq_q0, lane);
    /* Operands whose k runs down the rows (ldmatrix.trans): one lane offset per 16-column piece,
     * k step kk adds 16 kk rows. At lanes (P^T, dS^T) = B lanes; Bt lanes for dO, Q and K. */
    const int rb = ((lane >> 4) << 3) + (lane & 7), cb = (lane >> 3) & 1;
    const int rbt = (((lane >> 3) & 1) << 3) + (lane & 7), cbt = lane >> 4;
    uint32_t kv_a_off[KV_MT], kv_b_off[KV_NP], dq_b_off[DQ_NP];
    /* Byte offsets of this thread's P and dS stores (row s_q0 + g, 8-column piece j; rows 8 and
     * 16 further down share the swizzle, so they are immediates). */
    uint32_t st_off[2 * S_NP];
    unsigned char *sp_b = reinterpret_cast<unsigned char *>(sp);
    unsigned char *sds_b = reinterpret_cast<unsigned char *>(sds);
#pragma unroll
    for (int j = 0; j < 2 * S_NP; ++j)
        st_off[j] = (uint32_t)(fp_swz<BN>(s_q0 + g, s_k0 / 8 + j) + 2 * t) * 2;
#pragma unroll
    for (int mi = 0; mi < KV_MT; ++mi)
        kv_a_off[mi] = fp_ldsm_off<BN>(0, rb, cb, kv_k0 / 16 + mi);
#pragma unroll
    for (int p = 0; p < KV_NP; ++p)
        kv_b_off[p] = fp_ldsm_off<DK>(0, rbt, cbt, kv_d0 / 16 + p);
#pragma unroll
    for (int p = 0; p < DQ_NP; ++p)
        dq_b_off[p] = fp_ldsm_off<DK>(0, rbt, cbt, dq_d0 / 16 + p);

    int h = kvh * a.group, mb = mb_lo - 1; /* the step's query head and block, advanced first */
    for (int it = 0; it < iters; ++it) {
        const int buf = it & 1;
        fp_bwd_next_step(h, mb, mb_lo, mb_lo + nmb);
        const int m0 = mb * BM;
        int h1 = h, mb1 = mb; /* step it + 1 */
        fp_bwd_next_step(h1, mb1, mb_lo, mb_lo + nmb);
        fp_cp_async_wait<0>();
        __syncthreads(); /* also: every warp is done with the last step's P and dS */
        if (it + 1 < iters)
            fp_bwd_load_step<T, DK, NT, BM>(a, sq, sdo, slse, sdsum, b, h1, sq_.q_start, nq,
                                            mb1 * BM, nchunks, buf ^ 1);
        fp_cp_async_commit();
        const uint32_t qt = sq_a + buf * BM * DK * 2, dot = sdo_a + buf * BM * DK * 2;

        /* S = Q K^T, dP = dO V^T (this warp's S_MT x 16 queries x S_NP x 16 keys) */
        float s[S_MT][2 * S_NP][4], dp[S_MT][2 * S_NP][4];
#pragma unroll
        for (int mi = 0; mi < S_MT; ++mi)
#pragma unroll
            for (int j = 0; j < 2 * S_NP; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[mi][j][e] = 0.0f;
                    dp[mi][j][e] = 0.0f;
                }
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            uint32_t qa[S_MT][4], da[S_MT][4], kf[S_NP][4], vf[S_NP][4];
#pragma unroll
            for (int mi = 0; mi < S_MT; ++mi) {
                fp_ldsm_x4(qa[mi], fp_ldsm_addr<DK>(qt, la_s, 16 * mi, kk));
                fp_ldsm_x4(da[mi], fp_ldsm_addr<DK>(dot, la_s, 16 * mi, kk));
            }
#pragma unroll
            for (int p = 0; p < S_NP; ++p) {
                fp_ldsm_x4(kf[p], fp_ldsm_addr<DK>(sk_a, lb_s, 16 * p, kk));
                fp_ldsm_x4(vf[p], fp_ldsm_addr<DK>(sv_a, lb_s, 16 * p, kk));
            }
#pragma unroll
            for (int p = 0; p < S_NP; ++p)
#pragma unroll
                for (int mi = 0; mi < S_MT; ++mi) {
                    fp_mma<T>(s[mi][2 * p], qa[mi], kf[p][0], kf[p][1]);
                    fp_mma<T>(s[mi][2 * p + 1], qa[mi], kf[p][2], kf[p][3]);
                    fp_mma<T>(dp[mi][2 * p], da[mi], vf[p][0], vf[p][1]);
                    fp_mma<T>(dp[mi][2 * p + 1], da[mi], vf[p][2], vf[p][3]);
                }
        }

        /* P and dS, to shared memory */
        const bool full =
            fp_mask_block_full(m0, min(m0 + BM, nq), n0, n0 + BN, nq, nk, a.left, a.right);
        const float slope = a.alibi ? a.alibi[h] : 0.0f;
#pragma unroll
        for (int mi = 0; mi < S_MT; ++mi) {
            const int r = s_q0 + 16 * mi + g;
            const float l2[2] = {slse[buf * BM + r], slse[buf * BM + r + 8]};
            const float ds[2] = {sdsum[buf * BM + r], sdsum[buf * BM + r + 8]};
            const int row0 = m0 + s_q0 + 16 * mi, j0 = n0 + s_k0;
            if (a.transform)
                fp_bwd_tile<FP_SCORES_TRANSFORM, 2 * S_NP>(a, mk, s[mi], dp[mi], row0, j0, nq, nk,
                                                           l2, ds, slope, lane);
            else if (!full)
                fp_bwd_tile<FP_SCORES_MASK, 2 * S_NP>(a, mk, s[mi], dp[mi], row0, j0, nq, nk, l2,
                                                      ds, slope, lane);
            else
                fp_bwd_tile<FP_SCORES_FULL, 2 * S_NP>(a, mk, s[mi], dp[mi], row0, j0, nq, nk, l2,
                                                      ds, slope, lane);
#pragma unroll
            for (int j = 0; j < 2 * S_NP; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint32_t at = st_off[j] + (uint32_t)((16 * mi + 8 * r) * BN * 2);
                    *reinterpret_cast<uint32_t *>(sp_b + at) =
                        fp_pack2<T>(s[mi][j][2 * r], s[mi][j][2 * r + 1]);
                    *reinterpret_cast<uint32_t *>(sds_b + at) =
                        fp_pack2<T>(dp[mi][j][2 * r], dp[mi][j][2 * r + 1]);
                }
        }
        __syncthreads();

        /* dV += P^T dO, dK += dS^T Q (this warp's KV_MT x 16 keys x KV_NP x 16 columns) */
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            uint32_t pa[KV_MT][4], sa[KV_MT][4], of[KV_NP][4], qf[KV_NP][4];
#pragma unroll
            for (int mi = 0; mi < KV_MT; ++mi) {
                fp_ldsm_x4_t(pa[mi], sp_a + kv_a_off[mi] + 16 * kk * BN * 2);
                fp_ldsm_x4_t(sa[mi], sds_a + kv_a_off[mi] + 16 * kk * BN * 2);
            }
#pragma unroll
            for (int p = 0; p < KV_NP; ++p) {
                fp_ldsm_x4_t(of[p], dot + kv_b_off[p] + 16 * kk * DK * 2);
                fp_ldsm_x4_t(qf[p], qt + kv_b_off[p] + 16 * kk * DK * 2);
            }
#pragma unroll
            for (int p = 0; p < KV_NP; ++p)
#pragma unroll
                for (int mi = 0; mi < KV_MT; ++mi) {
                    fp_mma<T>(dv[mi][2 * p], pa[mi], of[p][0], of[p][1]);
                    fp_mma<T>(dv[mi][2 * p + 1], pa[mi], of[p][2], of[p][3]);
                    fp_mma<T>(dk[mi][2 * p], sa[mi], qf[p][0], qf[p][1]);
                    fp_mma<T>(dk[mi][2 * p + 1], sa[mi], qf[p][2], qf[p][3]);
                }
        }

        /* dQ += dS K (atomic mode; this warp's DQ_MT x 16 queries x DQ_NP x 16 columns) */
        if (!a.dq_atomic)
            continue;
        float acc[DQ_MT][2 * DQ_NP][4];
#pragma unroll
        for (int mi = 0; mi < DQ_MT; ++mi)
#pragma unroll
            for (int j = 0; j < 2 * DQ_NP; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    acc[mi][j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t ea[DQ_MT][4], kf[DQ_NP][4];
#pragma unroll
            for (int mi = 0; mi < DQ_MT; ++mi)
                fp_ldsm_x4(ea[mi], fp_ldsm_addr<BN>(sds_a, la_dq, 16 * mi, kk));
#pragma unroll
            for (int p = 0; p < DQ_NP; ++p)
                fp_ldsm_x4_t(kf[p], sk_a + dq_b_off[p] + 16 * kk * DK * 2);
#pragma unroll
            for (int p = 0; p < DQ_NP; ++p)
#pragma unroll
                for (int mi = 0; mi < DQ_MT; ++mi) {
                    fp_mma<T>(acc[mi][2 * p], ea[mi], kf[p][0], kf[p][1]);
                    fp_mma<T>(acc[mi][2 * p + 1], ea[mi], kf[p][2], kf[p][3]);
                }
        }
#pragma unroll
        for (int mi = 0; mi < DQ_MT; ++mi) {
            float *dst = a.dq_accum +
                         (((int64_t)b * a.heads + h) * a.nq_pad + m0 + dq_q0 + 16 * mi + g) * DK +
                         dq_d0 + 2 * t;
#pragma unroll
            for (int j = 0; j < 2 * DQ_NP; ++j) {
                fp_red_add2(dst + 8 * j, acc[mi][j][0], acc[mi][j][1]);
                fp_red_add2(dst + 8 * DK + 8 * j, acc[mi][j][2], acc[mi][j][3]);
            }
        }
    }

    /* dV, then dK * scale, staged through sk */
    fp_cp_async_wait<0>();
    __syncthreads();
    T *dv_g = reinterpret_cast<T *>(const_cast<void *>(a.dv.ptr)) +
              fp_cuda_row(a.dv, b, sq_.k_start + n0, kvh);
    T *dk_g = reinterpret_cast<T *>(const_cast<void *>(a.dk.ptr)) +
              fp_cuda_row(a.dk, b, sq_.k_start + n0, kvh);
#pragma unroll
    for (int mi = 0; mi < KV_MT; ++mi)
        fp_stage_acc<DK, 2 * KV_NP, T>(sk, kv_k0 + 16 * mi, kv_d0 / 8, dv[mi], 1.0f, 1.0f, lane);
    __syncthreads();
    fp_store_tile<BN, DK, NT>(dv_g, a.dv.ss, sk, nk - n0, nchunks, tid);
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < KV_MT; ++mi)
        fp_stage_acc<DK, 2 * KV_NP, T>(sk, kv_k0 + 16 * mi, kv_d0 / 8, dk[mi], a.scale, a.scale,
                                       lane);
    __syncthreads();
    fp_store_tile<BN, DK, NT>(dk_g, a.dk.ss, sk, nk - n0, nchunks, tid);
}

// Deterministic dQ. q, dout, dq: (B, Nq, H, D); k, v: (B, Nk, Hkv, D); grid (q blocks, H, B).
template <typename T, int DK>
__global__ void __launch_bounds__(fp_dq_cfg<DK>::NW * 32) fp_sm80_bwd_dq(const fp_sm80_args a)
{
    constexpr int NW = fp_dq_cfg<DK>::NW, BN = fp_dq_cfg<DK>::BN;
    constexpr int NT = NW * 32, BM = 16 * NW;
    constexpr int KT = DK / 16, NB8 = BN / 8, DT8 = DK / 8;

    extern __shared__ __align__(128) unsigned char fp_smem[];
    T *sq = reinterpret_cast<T *>(fp_smem); /* [BM][DK], later the dQ staging tile */
    T *sdo = sq + BM * DK;                  /* [BM][DK] */
    T *sk = sdo + BM * DK;                  /* [2][BN][DK] */
    T *sv = sk + 2 * BN * DK;               /* [2][BN][DK] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2;
    const int qblk = a.reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    const int nq = sq_.nq, nk = sq_.nk;
    const int m0 = qblk * BM;
    if (m0 >= nq)
        return;
    const int kvh = h / a.group;
    const int nchunks = a.d / 8;

    int64_t lo, hi;
    fp_mask_block_range(m0, min(m0 + BM, nq), nq, nk, a.left, a.right, &lo, &hi);
    int nb_begin = 0, nb_end = 0;
    if (hi > lo) {
        nb_begin = (int)(lo / BN);
        nb_end = (int)((hi + BN - 1) / BN);
    }

    const int64_t qrow = sq_.q_start + m0;
    const T *kg = reinterpret_cast<const T *>(a.k.ptr) + fp_cuda_row(a.k, b, sq_.k_start, kvh);
    const T *vg = reinterpret_cast<const T *>(a.v.ptr) + fp_cuda_row(a.v, b, sq_.k_start, kvh);
    fp_load_tile<BM, DK, NT>(sq,
                             reinterpret_cast<const T *>(a.q.ptr) + fp_cuda_row(a.q, b, qrow, h),
                             a.q.ss, nq - m0, nchunks, tid);
    fp_load_tile<BM, DK, NT>(
        sdo, reinterpret_cast<const T *>(a.dout.ptr) + fp_cuda_row(a.dout, b, qrow, h), a.dout.ss,
        nq - m0, nchunks, tid);
    if (nb_begin < nb_end) {
        fp_load_tile<BN, DK, NT>(sk, kg + (int64_t)nb_begin * BN * a.k.ss, a.k.ss,
                                 nk - nb_begin * BN, nchunks, tid);
        fp_load_tile<BN, DK, NT>(sv, vg + (int64_t)nb_begin * BN * a.v.ss, a.v.ss,
                                 nk - nb_begin * BN, nchunks, tid);
    }
    fp_cp_async_commit();

    const int wrow = warp * 16;
    float lse2[2], dsum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int64_t idx = ((int64_t)b * a.heads + h) * a.nq_pad + m0 + wrow + g + 8 * r;
        lse2[r] = a.ws_lse2[idx];
        dsum[r] = a.ws_dsum[idx];
    }
    const float slope = a.alibi ? a.alibi[h] : 0.0f;
    const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);

    float dq[DT8][4];
#pragma unroll
    for (int j = 0; j < DT8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dq[j][e] = 0.0f;
    const uint32_t sq_a = fp_smem_addr(sq), sdo_a = fp_smem_addr(sdo);
    const uint32_t sk_a = fp_smem_addr(sk), sv_a = fp_smem_addr(sv);
    const fp_ldsm_lane la = fp_lane_a<DK>(wrow, lane), lb = fp_lane_b<DK>(0, lane);
    const fp_ldsm_lane lbt = fp_lane_bt<DK>(0, lane);

    for (int nb = nb_begin; nb < nb_end; ++nb) {
        const int buf = (nb - nb_begin) & 1;
        const int j0 = nb * BN;
        fp_cp_async_wait<0>();
        __syncthreads();
        if (nb + 1 < nb_end) {
            fp_load_tile<BN, DK, NT>(sk + (buf ^ 1) * BN * DK, kg + (int64_t)(nb + 1) * BN * a.k.ss,
                                     a.k.ss, nk - (nb + 1) * BN, nchunks, tid);
            fp_load_tile<BN, DK, NT>(sv + (buf ^ 1) * BN * DK, vg + (int64_t)(nb + 1) * BN * a.v.ss,
                                     a.v.ss, nk - (nb + 1) * BN, nchunks, tid);
        }
        fp_cp_async_commit();

        float s[NB8][4], dp[NB8][4];
#pragma unroll
        for (int j = 0; j < NB8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[j][e] = 0.0f;
                dp[j][e] = 0.0f;
            }
        const uint32_t kt = sk_a + buf * BN * DK * 2, vt = sv_a + buf * BN * DK * 2;
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            uint32_t qa[4], da[4];
            fp_ldsm_x4(qa, fp_ldsm_addr<DK>(sq_a, la, 0, kk));
            fp_ldsm_x4(da, fp_ldsm_addr<DK>(sdo_a, la, 0, kk));
#pragma unroll
            for (int p = 0; p < BN / 16; ++p) {
                uint32_t kb[4], vb[4];
                fp_ldsm_x4(kb, fp_ldsm_addr<DK>(kt, lb, 16 * p, kk));
                fp_ldsm_x4(vb, fp_ldsm_addr<DK>(vt, lb, 16 * p, kk));
                fp_mma<T>(s[2 * p], qa, kb[0], kb[1]);
                fp_mma<T>(s[2 * p + 1], qa, kb[2], kb[3]);
                fp_mma<T>(dp[2 * p], da, vb[0], vb[1]);
                fp_mma<T>(dp[2 * p + 1], da, vb[2], vb[3]);
            }
        }

        const bool full =
            fp_mask_block_full(m0, min(m0 + BM, nq), j0, j0 + BN, nq, nk, a.left, a.right);
        if (a.transform)
            fp_bwd_tile<FP_SCORES_TRANSFORM, NB8>(a, mk, s, dp, m0 + wrow, j0, nq, nk, lse2, dsum,
                                                  slope, lane);
        else if (!full)
            fp_bwd_tile<FP_SCORES_MASK, NB8>(a, mk, s, dp, m0 + wrow, j0, nq, nk, lse2, dsum, slope,
                                             lane);
        else
            fp_bwd_tile<FP_SCORES_FULL, NB8>(a, mk, s, dp, m0 + wrow, j0, nq, nk, lse2, dsum, slope,
                                             lane);

            /* dQ += dS K */
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t da[4];
            fp_acc_to_a<T>(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
            for (int p = 0; p < DK / 16; ++p) {
                uint32_t kb[4];
                fp_ldsm_x4_t(kb, fp_ldsm_addr<DK>(kt, lbt, 16 * kk, p));
                fp_mma<T>(dq[2 * p], da, kb[0], kb[1]);
                fp_mma<T>(dq[2 * p + 1], da, kb[2], kb[3]);
            }
        }
    }
    fp_cp_async_wait<0>();
    __syncthreads();
    fp_stage_acc<DK, DT8, T>(sq, wrow, 0, dq, a.scale, a.scale, lane);
    __syncthreads();
    T *dst = reinterpret_cast<T *>(const_cast<void *>(a.dq.ptr)) + fp_cuda_row(a.dq, b, qrow, h);
    fp_store_tile<BM, DK, NT>(dst, a.dq.ss, sq, nq - m0, nchunks, tid);
}

// dq_accum (B, H, nq_pad, DK) f32 -> dq (B, Nq, H, D) * scale. grid (ceil(nq / 4), H, B).
template <typename T, int DK>
__global__ void __launch_bounds__(128) fp_sm80_bwd_dq_convert(const fp_sm80_args a)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * 4 + warp, h = blockIdx.y, b = blockIdx.z;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    if (i >= sq_.nq)
        return;
    const float *src = a.dq_accum + (((int64_t)b * a.heads + h) * a.nq_pad + i) * DK;
    T *dst = reinterpret_cast<T *>(const_cast<void *>(a.dq.ptr)) +
             fp_cuda_row(a.dq, b, sq_.q_start + i, h);
#pragma unroll
    for (int c = 2 * lane; c < DK; c += 64) {
        if (c < a.d) {
            const float2 x = *reinterpret_cast<const float2 *>(src + c);
            dst[c] = fp_from_f32<T>(x.x * a.scale);
            dst[c + 1] = fp_from_f32<T>(x.y * a.scale);
        }
    }
}

template <typename F> static cudaError_t fp_set_smem(F kernel, size_t smem)
{
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

template <typename T, int DK, bool BIG, int PASS>
static cudaError_t fp_dkdv_launch(const fp_cuda_ctx *ctx, const fp_problem *p,
                                  const fp_sm80_args &a)
{
    constexpr size_t smem = fp_dkdv_smem<DK, BIG, PASS>();
    constexpr int BN = 16 * fp_bwd_cfg<DK, BIG>::NW;
    dim3 grid((unsigned)((a.nk + BN - 1) / BN), (unsigned)p->kv_heads, (unsigned)p->batch);
    if (grid.x == 0)
        return cudaSuccess;
    void (*kernel)(const fp_sm80_args);
    if constexpr (fp_bwd_cfg<DK, BIG>::QS > 1)
        kernel = fp_sm80_bwd_dkdv_sub<T, DK, BIG, PASS>;
    else
        kernel = fp_sm80_bwd_dkdv<T, DK, BIG, PASS>;
    cudaError_t e = fp_set_smem(kernel, smem);
    if (e != cudaSuccess)
        return e;
    kernel<<<grid, fp_bwd_cfg<DK, BIG>::NW * 32, smem, ctx->stream>>>(a);
    fp_cuda_log("backward: sm80 dK/dV D%d kernel pass %d (BN %d, BM %d in %d), grid %ux%ux%u", DK,
                PASS, BN, fp_bwd_cfg<DK, BIG>::BM, fp_bwd_cfg<DK, BIG>::QS, grid.x, grid.y, grid.z);
    return cudaGetLastError();
}

/* Whether the 2-D tiled dK/dV kernel runs: D = 64 and 128 where its shared memory fits.
 * FP_CUDA_BWD_DKDV=1d forces the older kernels (A/B timing). */
static int fp_dkdv_choice(void)
{
    const char *env = getenv("FP_CUDA_BWD_DKDV");
    if (env && strcmp(env, "1d") == 0)
        return -1;
    if (env && strcmp(env, "2d1") == 0)
        return 1;
    return env && strcmp(env, "2d2") == 0 ? 2 : 0;
}

template <int DK> static bool fp_dkdv2_fits(const fp_cuda_ctx *ctx)
{
    if constexpr (DK == 64 || DK == 128) {
        const int c = fp_dkdv_choice();
        if (c < 0)
            return false;
        return ctx->smem_optin >= fp_dkdv2_smem<DK, 0>();
    }
    return false;
}

template <typename T, int DK, int ALT>
static cudaError_t fp_dkdv2_launch_cfg(const fp_cuda_ctx *ctx, const fp_problem *p,
                                       const fp_sm80_args &a)
{
    constexpr size_t smem = fp_dkdv2_smem<DK, ALT>();
    constexpr int BN = fp_bwd2_cfg<DK, ALT>::BN;
    dim3 grid((unsigned)((a.nk + BN - 1) / BN), (unsigned)p->kv_heads, (unsigned)p->batch);
    if (grid.x == 0)
        return cudaSuccess;
    cudaError_t e = fp_set_smem(fp_sm80_bwd_dkdv_2d<T, DK, ALT>, smem);
    if (e != cudaSuccess)
        return e;
    fp_sm80_bwd_dkdv_2d<T, DK, ALT><<<grid, fp_bwd2_cfg<DK, ALT>::NW * 32, smem, ctx->stream>>>(a);
    fp_cuda_log("backward: sm80 2-D dK/dV D%d kernel (BN %d, BM %d), grid %ux%ux%u", DK, BN,
                fp_bwd2_cfg<DK, ALT>::BM, grid.x, grid.y, grid.z);
    return cudaGetLastError();
}

template <typename T, int DK>
static cudaError_t fp_dkdv2_launch(const fp_cuda_ctx *ctx, const fp_problem *p,
                                   const fp_sm80_args &a)
{
    if constexpr (DK == 64) {
        if (fp_dkdv_choice() == 1)
            return fp_dkdv2_launch_cfg<T, 64, 1>(ctx, p, a);
        if (fp_dkdv_choice() == 2)
            return fp_dkdv2_launch_cfg<T, 64, 2>(ctx, p, a);
        return fp_dkdv2_launch_cfg<T, 64, 0>(ctx, p, a);
    } else if constexpr (DK == 128) {
        if (fp_dkdv_choice() == 1)
            return fp_dkdv2_launch_cfg<T, 128, 1>(ctx, p, a);
        return fp_dkdv2_launch_cfg<T, 128, 0>(ctx, p, a);
    }
    return cudaErrorInvalidValue;
}

template <typename T, int DK, bool BIG>
static flashport_status fp_bwd_launch(const fp_cuda_ctx *ctx, const fp_problem *p, fp_sm80_args a)
{
    const cudaStream_t stream = ctx->stream;
    if (p->batch == 0 || p->heads == 0)
        return FLASHPORT_OK;
    /* Empty sequences still get their outputs written (zeros); only empty grids are skipped. */
    a.nq_pad = (max(a.nq, 1) + FP_BWD_ROW_PAD - 1) / FP_BWD_ROW_PAD * FP_BWD_ROW_PAD;
    a.dq_atomic = !p->deterministic;
    a.reverse = p->window_right >= 0 && p->window_left < 0;
    const size_t rows = (size_t)p->batch * p->heads * a.nq_pad;
    const size_t accum = a.dq_atomic ? rows * DK : 0;
    void *ws = NULL;
    cudaError_t e = cudaMallocAsync(&ws, (2 * rows + accum) * sizeof(float), stream);
    if (e != cudaSuccess)
        return fp_cuda_error(e == cudaErrorMemoryAllocation ? FLASHPORT_ERR_OUT_OF_MEMORY
                                                            : FLASHPORT_ERR_DEVICE,
                             e, "backward workspace");
    a.ws_lse2 = (float *)ws;
    a.ws_dsum = a.ws_lse2 + rows;
    a.dq_accum = a.dq_atomic ? a.ws_dsum + rows : NULL;
    a.d_accum = DK;

    const dim3 pre_grid((unsigned)(a.nq_pad / 4), (unsigned)p->heads, (unsigned)p->batch);
    fp_sm80_bwd_pre<T><<<pre_grid, 128, 0, stream>>>(a);
    e = cudaGetLastError();
    if (e == cudaSuccess) {
        if constexpr (fp_bwd_cfg<DK, BIG>::TWO_PASS) {
            e = fp_dkdv_launch<T, DK, BIG, FP_PASS_DV>(ctx, p, a);
            if (e == cudaSuccess)
                e = fp_dkdv_launch<T, DK, BIG, FP_PASS_DK>(ctx, p, a);
        } else if (fp_dkdv2_fits<DK>(ctx)) {
            e = fp_dkdv2_launch<T, DK>(ctx, p, a);
        } else {
            e = fp_dkdv_launch<T, DK, BIG, FP_PASS_BOTH>(ctx, p, a);
        }
    }
    if (e == cudaSuccess && a.dq_atomic && a.nq > 0) {
        dim3 grid((unsigned)((a.nq + 3) / 4), (unsigned)p->heads, (unsigned)p->batch);
        fp_sm80_bwd_dq_convert<T, DK><<<grid, 128, 0, stream>>>(a);
        e = cudaGetLastError();
    } else if (e == cudaSuccess && !a.dq_atomic && a.nq > 0) {
        constexpr size_t smem = fp_dq_smem<DK>();
        constexpr int BM = 16 * fp_dq_cfg<DK>::NW;
        e = fp_set_smem(fp_sm80_bwd_dq<T, DK>, smem);
        if (e == cudaSuccess) {
            dim3 grid((unsigned)((a.nq + BM - 1) / BM), (unsigned)p->heads, (unsigned)p->batch);
            fp_sm80_bwd_dq<T, DK><<<grid, fp_dq_cfg<DK>::NW * 32, smem, stream>>>(a);
            e = cudaGetLastError();
            fp_cuda_log("backward: deterministic dQ D%d kernel (BM %d, BN %d), grid %ux%ux%u", DK,
                        BM, fp_dq_cfg<DK>::BN, grid.x, grid.y, grid.z);
        }
    }
    cudaError_t ef = cudaFreeAsync(ws, stream);
    if (e == cudaSuccess)
        e = ef;
    return e == cudaSuccess ? FLASHPORT_OK
                            : fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "backward kernel launch");
}

template <typename T>
static flashport_status fp_bwd_dispatch(const fp_cuda_ctx *ctx, const fp_problem *p,
                                        const fp_sm80_args &a)
{
    if (p->head_dim <= 64)
        return fp_bwd_launch<T, 64, false>(ctx, p, a);
    if (p->head_dim <= 128) {
        if (ctx->smem_optin >= fp_dkdv_smem<128, true, FP_PASS_BOTH>())
            return fp_bwd_launch<T, 128, true>(ctx, p, a);
        return fp_bwd_launch<T, 128, false>(ctx, p, a);
    }
    return fp_bwd_launch<T, 256, false>(ctx, p, a);
}

extern "C" flashport_status fp_cuda_sm80_backward(const fp_cuda_ctx *ctx, const fp_problem *p)
{
    fp_sm80_args a;
    fp_sm80_fill_args(p, &a);
    if (p->dtype == FLASHPORT_F16)
        return fp_bwd_dispatch<__half>(ctx, p, a);
    return fp_bwd_dispatch<__nv_bfloat16>(ctx, p, a);
}
