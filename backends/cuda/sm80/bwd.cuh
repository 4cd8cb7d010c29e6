/*
 * Flash attention backward, sm80 path (mma.sync + ldmatrix + cp.async; runs on sm_80 .. sm_90).
 *
 * Algorithm (FlashAttention-2 backward), P recomputed from the forward's LSE:
 *   1. fp_sm80_bwd_pre: per query row, Dsum = rowsum(dO * O) and LSE * log2(e) (+inf for rows
 *      that saw nothing, so their P is 0), into a [B, H, Nq_pad] f32 workspace; it also zeroes
 *      the dQ accumulator (atomic mode).
 *   2. fp_sm80_bwd_dkdv: one thread block per (key block of BN keys, kv head, batch); its dK and
 *      dV accumulate in f32 registers across every query block that sees the key block, for every
 *      query head of the GQA group (so the group sum needs no extra memory and no atomics). Where
 *      that grid is too small for the device (long groups, few key blocks: MQA),
 *      fp_plan_backward_group_splits cuts each group into slices of heads, one block per (key
 *      block, slice); the slices' f32 dK/dV go to a workspace and fp_sm80_bwd_dkdv_sum adds them
 *      in slice order (deterministic in both modes; FLASHPORT_CUDA_GROUP_SPLITS forces a count).
 * Per query block of BM rows (Q, dO, LSE and Dsum double-buffered through cp.async), each product
 *      is cut into a 2-D grid of warp tiles (FlashAttention-2's layout):
 *        S = Q K^T and dP = dO V^T (BM x BN): SM_Q warps along the queries x NW / SM_Q along the
 *          keys; P = exp2(S * scale * log2 e - LSE2) and dS = P (dP - Dsum), rounded to the input
 *          dtype, go to shared memory [BM][BN] (stmatrix on sm_90); at D = 64 P is computed
 *          between the S and dP products, so its exp2s overlap the dP mma instructions;
 *        dV += P^T dO and dK += dS^T Q (BN x D): KV_K warps along the keys x NW / KV_K along the
 *          head dim, P^T and dS^T read with ldmatrix.trans;
 *        dQ += dS K (BM x D, default mode): DQ_Q warps along the queries x NW / DQ_Q along the
 *          head dim, added to an f32 accumulator with atomics (8-byte vector reductions on
 *          sm_90), kept in mma fragment order so that they coalesce (fp_dq_frag_off);
 *          fp_sm80_bwd_dq_convert scales it into dq. At D = 64 a step's dQ product runs at the
 *          start of the next step (DQ_LAG, at fp_bwd_dq_lag).
 *      Each k step's ldmatrix fragments are all requested before its mma, so the load latency is
 *      paid once per step.
 *   3. Deterministic mode: the dK/dV kernel skips dQ and fp_sm80_bwd_dq computes it without
 *      atomics, one block per query block walking the key blocks in order (S, dP and dS
 *      recomputed: two more products than the atomic mode). Every output then has one writer
 *      and a fixed summation order: bitwise identical run to run.
 * Softcap: dS is multiplied by fp_softcap_grad (core/mask.h) of the capped score (from
 * fp_score_transform); ALiBi adds nothing to the gradient. Masking mirrors the forward: blocks
 * outside the window are never visited, fp_mask_block_full picks the blocks that need no
 * per-element mask, and the others apply fp_mask_visible's inequalities (fp_mask32).
 *
 * Tiles (fp_bwd_cfg; the first configuration of a head dim whose shared memory the device allows
 * runs, FLASHPORT_CUDA_SMEM_KIB lowers that limit for tests): D = 64: BN 128, BM 128 with two
 * dS buffers (194 KiB), else with one (162 KiB), else BM 64 (97 KiB); D = 128: BN 128, BM 64 (161
 * KiB), else 4 warps, BN 64, BM 32 (72 KiB); D = 256: BN 64, BM 64 with two dS buffers (217 KiB),
 * else BM 32 (137 KiB), else (sm_86/89, 99 KiB per block) 4 warps, BN 32, BM 32 with one Q/dO
 * buffer (QBUF 1: the next step's loads are issued after the dK/dV products, behind one more
 * barrier; 68 KiB); 8 warps, one block per SM. A device with less shared memory gets
 * FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM. Deterministic dQ: 64 query rows (4 warps; 32 rows, 2 warps,
 * for D = 256 at 99 KiB), key block 64 (32 for D = 256). Other head dims run on the next larger
 * kernel, zero-filled.
 *
 * Differences from the reference: P and dS are rounded to f16/bf16 before the products that
 * use them (as in every tensor-core flash kernel); exp2 is the hardware approximation; dQ in the
 * atomic mode is summed in an order that varies from run to run (last-bit differences).
 * This header holds the dK/dV and dQ kernels and their launch (fp_sm80_bwd_family, common.cuh);
 * one file per head dim instantiates them (sm80/inst/bwd_d64.cu, ...). The side kernels (1., the
 * dQ conversion and the group splits' sum) and the launcher are sm80/bwd.cu.
 * Limits: 255 registers, one block of 8 warps per SM, latency bound (fewer instructions than
 * FA2's kernel, more cycles per instruction: barriers and the shared-memory queue); at short
 * sequences the side kernels (fp_sm80_bwd_pre, fp_sm80_bwd_dq_convert) decide. Current numbers
 * against FA2 and cuDNN: docs/performance.md#cuda-sm80-path-h200.
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM80_BWD_CUH
#define FLASHPORT_BACKENDS_CUDA_SM80_BWD_CUH

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/dispatch.cuh"
#include "backends/cuda/sm80/common.cuh"
#include "backends/cuda/sm80/config.h"

#include "core/plan.h"
#include "core/problem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

/* Deterministic dQ kernel: NW warps of 16 query rows, BN keys per step; ALT 1 (D = 256 on
 * devices with 99 KiB per block) has half the rows. */
template <int DK, int ALT> struct fp_dq_cfg {
    enum { NW = ALT ? 2 : 4, BN = DK == 256 ? 32 : 64 };
};

template <int DK, int ALT> constexpr size_t fp_dq_smem()
{
    constexpr int BM = 16 * fp_dq_cfg<DK, ALT>::NW, BN = fp_dq_cfg<DK, ALT>::BN;
    return (size_t)(2 * BM * DK + 4 * BN * DK) * 2;
}

/* How many dQ configurations each head dim has (ALT 0 .. n - 1, in order of preference). */
template <int DK> constexpr int fp_dq_alts()
{
    return DK == 256 ? 2 : 1;
}

/* P (and dS) of one score, MODE as in FP_SCORES_*: x raw q.k in, P out; dp dP in, dS out
 * (WANT_DS). Row i, key j. The masked modes select (never multiply) the 0 of a masked pair, as
 * its dP or Dsum may be NaN; `bad`: the pair's Q, dO or K row held a non-finite element that the
 * masked-key guard scrubbed (common.cuh), so a visible pair gets the NaN it would have had. */
template <int MODE, bool WANT_DS>
FP_DEV void fp_bwd_elem(const fp_sm80_args &a, const fp_mask32 &mk, float &x, float &dp, int i,
                        int j, int nq, int nk, float lse2, float dsum, float slope, bool bad)
{
    float p, grad = 1.0f;
    if constexpr (MODE == FP_SCORES_TRANSFORM) {
        const float capped = fp_score_transform(x * a.scale, a.softcap, 0.0f, 0.0f);
        p = fp_exp2((capped - slope * fp_alibi_distance(i, j, nq, nk)) * FP_LOG2E - lse2);
        grad = fp_softcap_grad(capped, a.softcap);
    } else {
        p = fp_exp2(fmaf(x, a.scale_log2, -lse2));
    }
    if constexpr (MODE != FP_SCORES_FULL) {
        const bool vis = fp_mask32_visible(mk, i, j);
        p = vis ? (bad ? NAN : p) : -0.0f; /* -0: masked, for a dS computed later (P_FIRST) */
        x = p;
        if constexpr (WANT_DS)
            dp = vis ? p * (dp - dsum) * grad : 0.0f;
    } else {
        x = p;
        if constexpr (WANT_DS)
            dp = p * (dp - dsum) * grad;
    }
}

/* P (and with WANT_DS dS) of a 16 x NJ x 8 tile of scores in mma accumulator layout: 16 queries
 * (rows, from row0) x NJ x 8 keys (columns, from j0); lse2 and dsum per row. With `guard` (an
 * edge block whose operands were scrubbed), rbad[r]: row r's Q or dO held a non-finite element,
 * bit 2 j + e of kbits: key j0 + 8 j + 2 t + e's K did (fp_key_bits); without it neither is
 * read. */
template <int MODE, int NJ, bool WANT_DS = true>
FP_DEV void fp_bwd_tile(const fp_sm80_args &a, const fp_mask32 &mk, float (*s)[4], float (*dp)[4],
                        int row0, int j0, int nq, int nk, const float lse2[2], const float dsum[2],
                        float slope, int lane, bool guard = false, const bool rbad[2] = nullptr,
                        uint32_t kbits = 0u)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = 8 * j + 2 * t + e;
                bool bad = false;
                if constexpr (MODE != FP_SCORES_FULL)
                    bad = guard && (rbad[r] || ((kbits >> (2 * j + e)) & 1u) != 0u);
                fp_bwd_elem<MODE, WANT_DS>(a, mk, s[j][2 * r + e], dp[j][2 * r + e],
                                           row0 + g + 8 * r, j0 + c, nq, nk, lse2[r], dsum[r],
                                           slope, bad);
            }
}

/* The guard's flags (fp_scrub_tile) of the keys whose scores this thread holds in an mma
 * accumulator tile of NJ x 8 keys (flags of its first key at kfl): bit 2 j + e for key
 * 8 j + 2 t + e, so that the per-element test is a shift of one register, not a load. */
template <int NJ> FP_DEV uint32_t fp_key_bits(const uint8_t *kfl, int lane)
{
    static_assert(2 * NJ <= 32, "one bit per key of the thread's");
    const int t = lane & 3;
    uint32_t bits = 0u;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            bits |= (kfl[8 * j + 2 * t + e] != 0 ? 1u : 0u) << (2 * j + e);
    return bits;
}

/* The masked-key guard of the dK/dV kernel's edge steps (fp_sm80_bwd_dkdv): the Q and dO tiles
 * of one step (ROWS rows) scrubbed, flags[r] = 1 where row r of either held a non-finite element.
 * Not inlined: it runs where the kernel holds its dK and dV accumulators, and as a call its
 * registers are its own, so the register allocation of the steps that never call it stays. */
template <typename T, int ROWS, int DK, int NT>
FP_DEV_NOINLINE void fp_bwd_guard_rows(T *q, T *dout, uint8_t *qflags, uint8_t *dflags)
{
    const int tid = threadIdx.x;
    fp_scrub_tile<ROWS, DK, NT, T>(q, qflags, tid);
    fp_scrub_tile<ROWS, DK, NT, T>(dout, dflags, tid);
}

/* The same for one K tile (ROWS keys) of the dQ kernels. */
template <typename T, int ROWS, int DK, int NT>
FP_DEV_NOINLINE void fp_bwd_guard_k(T *k, uint8_t *kflags)
{
    fp_scrub_tile<ROWS, DK, NT, T>(k, kflags, threadIdx.x);
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
    const int64_t w = fp_bwd_ws_row(a, b, h, m);
    if (tid < BM / 4)
        fp_cp_async16(fp_smem_addr(slse + buf * BM + 4 * tid), a.ws_lse2 + w + 4 * tid, 16);
    else if (tid < BM / 2)
        fp_cp_async16(fp_smem_addr(sdsum + buf * BM + 4 * (tid - BM / 4)),
                      a.ws_dsum + w + 4 * (tid - BM / 4), 16);
}

/* dK/dV kernel configurations (see the top of the file): NW warps, BN keys, BM query rows per
 * step, and the warp grids of the three products. ALT 0 is preferred; each later one needs
 * less shared memory (sm80/config.h names them; fp_sm80_pick chooses). The alternatives timed
 * against them (smaller query blocks, 4-warp variants): docs/bench/archive/, bwd2d.
 * P_FIRST: S = Q K^T, then P, then dP = dO V^T, so that P's exp2s (MUFU, 16 per clock per SM)
 * can issue between the dP products' mma instructions; else S and dP in one loop, then P and dS.
 * It pays at D = 64, where a step has twice the exp2s per mma of D = 128, and not at D = 128.
 * Softcaps always take the fused order (their dS needs the raw score).
 * QBUF: Q/dO (and LSE/Dsum) buffers. 2: the next step's loads go out at the top of a step and
 * have all of it to land; 1 (only where 2 does not fit): they go out after the dK/dV products,
 * behind one more barrier, and have the dQ product to land. */
template <int DK, int ALT> struct fp_bwd_cfg;
template <> struct fp_bwd_cfg<64, 0> {
    enum { NW = 8, BN = 128, BM = 128, SM_Q = 4, KV_K = 4, DQ_Q = 4, P_FIRST = 1, QBUF = 2 };
};
template <> struct fp_bwd_cfg<64, 1> {
    enum { NW = 8, BN = 128, BM = 128, SM_Q = 4, KV_K = 4, DQ_Q = 4, P_FIRST = 1, QBUF = 2 };
};
template <> struct fp_bwd_cfg<64, 2> {
    enum { NW = 8, BN = 128, BM = 64, SM_Q = 2, KV_K = 4, DQ_Q = 4, P_FIRST = 1, QBUF = 2 };
};
template <> struct fp_bwd_cfg<128, 0> {
    enum { NW = 8, BN = 128, BM = 64, SM_Q = 2, KV_K = 4, DQ_Q = 2, P_FIRST = 0, QBUF = 2 };
};
template <> struct fp_bwd_cfg<128, 1> {
    enum { NW = 4, BN = 64, BM = 32, SM_Q = 2, KV_K = 2, DQ_Q = 2, P_FIRST = 0, QBUF = 2 };
};
template <> struct fp_bwd_cfg<256, 0> {
    enum { NW = 8, BN = 64, BM = 64, SM_Q = 4, KV_K = 2, DQ_Q = 2, P_FIRST = 0, QBUF = 2 };
};
template <> struct fp_bwd_cfg<256, 1> {
    enum { NW = 8, BN = 64, BM = 32, SM_Q = 2, KV_K = 2, DQ_Q = 2, P_FIRST = 0, QBUF = 2 };
};
template <> struct fp_bwd_cfg<256, 2> {
    enum { NW = 4, BN = 32, BM = 32, SM_Q = 2, KV_K = 2, DQ_Q = 2, P_FIRST = 0, QBUF = 1 };
};
/* DQ_LAG (D = 64 and 256, ALT 0): dS in two buffers, by step parity, and each step's dQ product
 * (dQ += dS K and its atomics) run after the next step's first barrier, before its S and dP
 * products, instead of after its own dK / dV products, the last one after the loop. The two
 * halves between barriers are then closer in length, and the atomics issue while the next
 * products run. One more dS buffer of shared memory: 194 KiB at D = 64, whose ALT 1 is the same
 * kernel without it for sm_80's 163 KiB; 217 KiB at D = 256, whose ALT 1 (BM 32) was already
 * sm_80's (the kernel without it, 209 KiB, would fit no device that the lagged one does not).
 * It also lowers the D = 64 kernel's spills; at D = 256 it went after the dQ reductions, which
 * had gone out in one burst at the end of each step (the timings: docs/bench/archive/, s6, s7).
 */
template <int DK, int ALT> struct fp_bwd_dq_lag {
    enum { value = (DK == 64 || DK == 256) && ALT == 0 };
};

/* How many configurations each head dim has (ALT 0 .. n - 1, in order of preference). */
template <int DK> constexpr int fp_bwd_alts()
{
    return DK == 128 ? 2 : 3;
}

/* Row pitch of the P and dS tiles: BN, at least 64 (the swizzle's 8 chunks per row). */
template <int DK, int ALT> struct fp_bwd_pc {
    enum { value = fp_bwd_cfg<DK, ALT>::BN < 64 ? 64 : fp_bwd_cfg<DK, ALT>::BN };
};

template <int DK, int ALT> constexpr size_t fp_dkdv_smem()
{
    using CFG = fp_bwd_cfg<DK, ALT>;
    constexpr int BN = CFG::BN, BM = CFG::BM, QB = CFG::QBUF, PC = fp_bwd_pc<DK, ALT>::value;
    constexpr int DSB = 1 + fp_bwd_dq_lag<DK, ALT>::value; /* dS buffers */
    return (size_t)(2 * BN * DK + 2 * QB * BM * DK + (1 + DSB) * BM * PC) * 2 +
           2 * QB * BM * sizeof(float);
}

/* Compile-time arguments of the dK/dV kernel's generic lambdas. */
template <bool B> using fp_flag = std::bool_constant<B>;
template <int I> using fp_int = std::integral_constant<int, I>;

/* The end of a dK/dV block: the warp's dV and dK tiles (KV_MT x 16 keys from kv_k0 of the block's
 * keys from n0, KV_NP x 16 columns from kv_d0; g, t: lane / 4, lane % 4), dK times the softmax
 * scale. A slice of a GQA group writes its f32 sums to the group-split workspace; otherwise dV,
 * then dK, are staged through sk and stored as 16-byte rows. */
template <typename T, int DK, int BN, int NT, int KV_MT, int KV_NP>
FP_DEV void fp_bwd_store_dkdv(const fp_sm80_args &a, const float (&dv)[KV_MT][2 * KV_NP][4],
                              const float (&dk)[KV_MT][2 * KV_NP][4], T *sk, const fp_cuda_seq &sq_,
                              int b, int kvh, int split, int n0, int nk, int kv_k0, int kv_d0,
                              int nchunks, int tid, int lane, int g, int t)
{
    if (a.dkv_part) {
        /* a slice of the group: its f32 sums, which fp_sm80_bwd_dkdv_sum adds in slice order
         * (rows n0 + kv_k0 + 16 mi + g + 8 r, columns kv_d0 + 8 j + 2 t, two at a time) */
        float *pv =
            a.dkv_part + fp_bwd_part_row(a, 0, split, b, kvh, n0 + kv_k0 + g) * DK + kv_d0 + 2 * t;
        float *pk =
            a.dkv_part + fp_bwd_part_row(a, 1, split, b, kvh, n0 + kv_k0 + g) * DK + kv_d0 + 2 * t;
#pragma unroll
        for (int mi = 0; mi < KV_MT; ++mi)
#pragma unroll
            for (int j = 0; j < 2 * KV_NP; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int off = (16 * mi + 8 * r) * DK + 8 * j;
                    *reinterpret_cast<float2 *>(pv + off) =
                        make_float2(dv[mi][j][2 * r], dv[mi][j][2 * r + 1]);
                    *reinterpret_cast<float2 *>(pk + off) =
                        make_float2(dk[mi][j][2 * r], dk[mi][j][2 * r + 1]);
                }
        return;
    }
    /* dV, then dK * scale, staged through sk */
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

// q, dout: (B, Nq, H, D); k, v, dk, dv: (B, Nk, Hkv, D); grid (key blocks, Hkv x group splits,
// B), blockIdx.y = kv head x group_splits + slice.
template <typename T, int DK, int ALT>
__global__ void __launch_bounds__(fp_bwd_cfg<DK, ALT>::NW * 32, 1)
    fp_sm80_bwd_dkdv(const fp_sm80_args a)
{
    using CFG = fp_bwd_cfg<DK, ALT>;
    constexpr int NW = CFG::NW, BN = CFG::BN, BM = CFG::BM, NT = NW * 32, KT = DK / 16;
    constexpr int QB = CFG::QBUF, PC = fp_bwd_pc<DK, ALT>::value;
    constexpr bool DQ_LAG = fp_bwd_dq_lag<DK, ALT>::value;
    /* warp tiles: MT x 16 rows, NP x 16 columns */
    constexpr int S_MT = BM / CFG::SM_Q / 16, S_NP = BN / (NW / CFG::SM_Q) / 16;
    constexpr int KV_MT = BN / CFG::KV_K / 16, KV_NP = DK / (NW / CFG::KV_K) / 16;
    constexpr int DQ_MT = BM / CFG::DQ_Q / 16, DQ_NP = DK / (NW / CFG::DQ_Q) / 16;
    static_assert(S_MT >= 1 && S_NP >= 1 && KV_MT >= 1 && KV_NP >= 1 && DQ_MT >= 1 && DQ_NP >= 1,
                  "every warp tile has whole 16 x 16 pieces");

    extern __shared__ __align__(128) unsigned char fp_smem[];
    T *sk = reinterpret_cast<T *>(fp_smem); /* [BN][DK], later the dK/dV staging tile */
    T *sv = sk + BN * DK;                   /* [BN][DK] */
    T *sq = sv + BN * DK;                   /* [QB][BM][DK] */
    T *sdo = sq + QB * BM * DK;             /* [QB][BM][DK] */
    T *sp = sdo + QB * BM * DK;             /* [BM][PC] */
    T *sds = sp + BM * PC;                  /* [1 + DQ_LAG][BM][PC] */
    float *slse = reinterpret_cast<float *>(sds + (1 + DQ_LAG) * BM * PC); /* [QB][BM] */
    float *sdsum = slse + QB * BM;                                         /* [QB][BM] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int kb = blockIdx.x, b = blockIdx.z;
    /* this block's slice of the kv head's query heads (all of them without group splits) */
    const int kvh = blockIdx.y / a.group_splits, split = blockIdx.y % a.group_splits;
    const int slice = a.group / a.group_splits, h_first = kvh * a.group + split * slice;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    const int nq = sq_.nq, nk = sq_.nk;
    const int n0 = kb * BN;
    if (n0 >= nk)
        return;
    const int nchunks = a.d / 8;

    int mb_lo, mb_end;
    fp_geom_query_blocks(n0, min(n0 + BN, nk), nq, nk, a.left, a.right, BM, &mb_lo, &mb_end);
    const int nmb = mb_end - mb_lo;
    const int iters = slice * nmb;

    const T *kg = reinterpret_cast<const T *>(a.k.ptr) + fp_cuda_row(a.k, b, sq_.k_start + n0, kvh);
    const T *vg = reinterpret_cast<const T *>(a.v.ptr) + fp_cuda_row(a.v, b, sq_.k_start + n0, kvh);
    fp_load_tile<BN, DK, NT>(sk, kg, a.k.ss, nk - n0, nchunks, tid);
    fp_load_tile<BN, DK, NT>(sv, vg, a.v.ss, nk - n0, nchunks, tid);
    if (iters > 0)
        fp_bwd_load_step<T, DK, NT, BM>(a, sq, sdo, slse, sdsum, b, h_first, sq_.q_start, nq,
                                        mb_lo * BM, nchunks, 0);
    fp_cp_async_commit();

    /* The masked-key guard (common.cuh). A masked pair's P and dS are 0 (selected); they meet
     * K in dQ += dS K, Q in dK += dS^T Q and dO in dV += P^T dO, so in a step that holds masked
     * pairs (an edge step) those operands must be finite. K stays for every step: where some
     * step of this block is an edge step (the first or the last query block: the steps between
     * them are fully visible when those two are), K is scrubbed once and its non-finite keys
     * flagged (kfl); if it had any (kbad), every step takes the guarded path, whose flags give
     * the visible pairs their NaN back. Q and dO are scrubbed in each edge step (qfl). V meets
     * only dO in dP = dO V^T, whose masked entries the dS select drops. */
    __shared__ __align__(16) uint8_t kfl[BN];
    __shared__ __align__(4) uint8_t qfl[QB][2][BM]; /* Q's, dO's row flags per buffer */
    auto step_full = [&](int mb_) {
        return fp_mask_block_full(mb_ * BM, min(mb_ * BM + BM, nq), n0, n0 + BN, nq, nk, a.left,
                                  a.right);
    };
    bool kbad = false;
    if (iters > 0 && !(step_full(mb_lo) && step_full(mb_end - 1))) {
        fp_cp_async_wait<0>();
        __syncthreads();
        fp_bwd_guard_k<T, BN, DK, NT>(sk, kfl);
        __syncthreads();
        uint32_t any = 0u;
#pragma unroll
        for (int c = 0; c < BN / 4; ++c)
            any |= reinterpret_cast<const uint32_t *>(kfl)[c];
        kbad = any != 0u;
    }

    float dv[KV_MT][2 * KV_NP][4], dk[KV_MT][2 * KV_NP][4];
    fp_acc_zero(dv);
    fp_acc_zero(dk);

    /* This warp's tiles: first row and column of each product. */
    const int s_q0 = (warp % CFG::SM_Q) * S_MT * 16, s_k0 = (warp / CFG::SM_Q) * S_NP * 16;
    const int kv_k0 = (warp % CFG::KV_K) * KV_MT * 16, kv_d0 = (warp / CFG::KV_K) * KV_NP * 16;
    const int dq_q0 = (warp % CFG::DQ_Q) * DQ_MT * 16, dq_d0 = (warp / CFG::DQ_Q) * DQ_NP * 16;

    const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);
    const uint32_t sk_a = fp_smem_addr(sk), sv_a = fp_smem_addr(sv), sq_a = fp_smem_addr(sq);
    const uint32_t sdo_a = fp_smem_addr(sdo), sp_a = fp_smem_addr(sp), sds_a = fp_smem_addr(sds);
    /* Operands whose k runs along the tile's columns: lane patterns with the warp's first row. */
    const fp_ldsm_lane la_s = fp_lane_a<DK>(s_q0, lane), lb_s = fp_lane_b<DK>(s_k0, lane);
    const fp_ldsm_lane la_dq = fp_lane_a<PC>(dq_q0, lane);
    /* Operands whose k runs down the rows (ldmatrix.trans): one lane offset per 16-column piece,
     * k step kk adds 16 kk rows. At lanes (P^T, dS^T) = B lanes; Bt lanes for dO, Q and K. */
    uint32_t kv_a_off[KV_MT], kv_b_off[KV_NP], dq_b_off[DQ_NP];
#pragma unroll
    for (int mi = 0; mi < KV_MT; ++mi)
        kv_a_off[mi] = fp_ldsm_off_b<PC>(0, lane, kv_k0 / 16 + mi);
#pragma unroll
    for (int p = 0; p < KV_NP; ++p)
        kv_b_off[p] = fp_ldsm_off_bt<DK>(0, lane, kv_d0 / 16 + p);
#pragma unroll
    for (int p = 0; p < DQ_NP; ++p)
        dq_b_off[p] = fp_ldsm_off_bt<DK>(0, lane, dq_d0 / 16 + p);

    /* P and dS go to shared memory with stmatrix where the device has it (sm_90: a quarter of
     * the store instructions), else with 32-bit stores. Byte offsets of
     * this thread's 32-bit stores (row s_q0 + g, 8-column piece j; rows 8 and 16 further down
     * share the swizzle, so they are immediates): */
    uint32_t st_off[2 * S_NP];
    unsigned char *sp_b = reinterpret_cast<unsigned char *>(sp);
#pragma unroll
    for (int j = 0; j < 2 * S_NP; ++j)
        st_off[j] = (uint32_t)(fp_swz<PC>(s_q0 + g, s_k0 / 8 + j) + 2 * t) * 2;
    /* and the shared addresses of its stmatrix rows: stmatrix takes its row addresses in the Bt
     * lane pattern (matrix i = rows 8 (i % 2).., 8-column half i / 2 of a 16-column piece). */
    constexpr bool use_stsm = FP_HAVE_STSM;
    uint32_t stsm_off[S_NP];
#pragma unroll
    for (int jp = 0; jp < S_NP; ++jp)
        stsm_off[jp] = fp_smem_addr(sp) + fp_ldsm_off_bt<PC>(s_q0, lane, s_k0 / 16 + jp);
    /* bytes of one [BM][PC] tile: sds - sp, and the distance between the two dS buffers */
    constexpr uint32_t TILE_BYTES = BM * PC * 2;

    /* dQ += dS K in atomic mode, for the step of rows m0_ of head h_ whose dS sits at byte
     * offset ds_off of sds (this warp's DQ_MT x 16 queries x DQ_NP x 16 columns) */
    auto dq_product = [&](int m0_, int h_, uint32_t ds_off) {
        if (!a.dq_atomic)
            return;
        float acc[DQ_MT][2 * DQ_NP][4];
        fp_acc_zero(acc);
        fp_warp_mma<T, BN / 16, FP_MMA_LOAD_ALL>(
            acc,
            [&](uint32_t(&f)[4], int mi, int kk) {
                fp_ldsm_x4(f, fp_ldsm_addr<PC>(sds_a + ds_off, la_dq, 16 * mi, kk));
            },
            [&](uint32_t(&f)[4], int p, int kk) {
                fp_ldsm_x4_t(f, sk_a + dq_b_off[p] + 16 * kk * DK * 2);
            });
#pragma unroll
        for (int mi = 0; mi < DQ_MT; ++mi) {
            /* fragment order (fp_dq_frag_off): piece j of the warp's columns at 128 j, rows
             * g + 8 at + 64 */
            float *dst = a.dq_accum + fp_bwd_ws_row(a, b, h_, m0_ + dq_q0 + 16 * mi) * DK +
                         fp_dq_frag_off(g, dq_d0 + 2 * t);
#pragma unroll
            for (int j = 0; j < 2 * DQ_NP; ++j) {
                fp_red_add2(dst + 128 * j, acc[mi][j][0], acc[mi][j][1]);
                fp_red_add2(dst + 128 * j + 64, acc[mi][j][2], acc[mi][j][3]);
            }
        }
    };

    int h = h_first, mb = mb_lo - 1; /* the step's query head and block, advanced first */
    for (int it = 0; it < iters; ++it) {
        const int buf = QB == 2 ? it & 1 : 0;
        const int ph = h, pm0 = mb * BM; /* the last step's */
        /* DQ_LAG: dS in buffer it % 2, so that the last step's dQ product can run after this
         * step's first barrier */
        const uint32_t ds_off = DQ_LAG ? (it & 1) * TILE_BYTES : 0;
        fp_bwd_next_step(h, mb, mb_lo, mb_lo + nmb);
        const int m0 = mb * BM;
        int h1 = h, mb1 = mb; /* step it + 1 */
        fp_bwd_next_step(h1, mb1, mb_lo, mb_lo + nmb);
        fp_cp_async_wait<0>();
        __syncthreads(); /* also: every warp is done with the last step's P and dS */
        if constexpr (QB == 2) {
            if (it + 1 < iters)
                fp_bwd_load_step<T, DK, NT, BM>(a, sq, sdo, slse, sdsum, b, h1, sq_.q_start, nq,
                                                mb1 * BM, nchunks, buf ^ 1);
            fp_cp_async_commit();
        }
        const bool full = !kbad && step_full(mb);
        if (!full) { /* an edge step: Q and dO of this buffer scrubbed, if a row may need it */
            if (fp_rows_suspect<BM>(slse + buf * BM, sdsum + buf * BM))
                fp_bwd_guard_rows<T, BM, DK, NT>(sq + buf * BM * DK, sdo + buf * BM * DK,
                                                 qfl[buf][0], qfl[buf][1]);
            else if (tid < BM / 2)
                reinterpret_cast<uint32_t *>(qfl[buf])[tid] = 0u;
            __syncthreads();
        }
        if (DQ_LAG && it > 0)
            dq_product(pm0, ph, ds_off ^ TILE_BYTES);
        const uint32_t qt = sq_a + buf * BM * DK * 2, dot = sdo_a + buf * BM * DK * 2;

        /* S = Q K^T, dP = dO V^T (this warp's S_MT x 16 queries x S_NP x 16 keys) */
        float s[S_MT][2 * S_NP][4], dp[S_MT][2 * S_NP][4];
        fp_acc_zero(s);
        fp_acc_zero(dp);
        /* the operands' fragments: Q and dO rows (A), K and V rows (B) */
        auto ld_q = [&](uint32_t(&f)[4], int mi, int kk) {
            fp_ldsm_x4(f, fp_ldsm_addr<DK>(qt, la_s, 16 * mi, kk));
        };
        auto ld_do = [&](uint32_t(&f)[4], int mi, int kk) {
            fp_ldsm_x4(f, fp_ldsm_addr<DK>(dot, la_s, 16 * mi, kk));
        };
        auto ld_k = [&](uint32_t(&f)[4], int p, int kk) {
            fp_ldsm_x4(f, fp_ldsm_addr<DK>(sk_a, lb_s, 16 * p, kk));
        };
        auto ld_v = [&](uint32_t(&f)[4], int p, int kk) {
            fp_ldsm_x4(f, fp_ldsm_addr<DK>(sv_a, lb_s, 16 * p, kk));
        };

        /* P and dS (f32 in s and dp), then to shared memory */
        const float slope = a.alibi ? a.alibi[h] : 0.0f;
        const float *lse_b = slse + buf * BM + s_q0 + g, *dsum_b = sdsum + buf * BM + s_q0 + g;
        /* mode-specific P (and dS for softcaps, whose gradient needs the raw score) */
        auto elementwise = [&](auto mode, auto want_ds) {
            constexpr int MODE = decltype(mode)::value;
#pragma unroll
            for (int mi = 0; mi < S_MT; ++mi) {
                const float l2[2] = {lse_b[16 * mi], lse_b[16 * mi + 8]};
                const float ds[2] = {dsum_b[16 * mi], dsum_b[16 * mi + 8]};
                bool rbad[2] = {false, false};
                uint32_t kbits = 0u;
                if constexpr (MODE != FP_SCORES_FULL) {
                    if (!full) {
                        /* per step, not carried through the loop (a register there cost more
                         * spills than these loads) */
                        if (kbad)
                            kbits = fp_key_bits<2 * S_NP>(kfl + s_k0, lane);
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            const int row = s_q0 + 16 * mi + g + 8 * r;
                            rbad[r] = (qfl[buf][0][row] | qfl[buf][1][row]) != 0;
                        }
                    }
                }
                fp_bwd_tile<MODE, 2 * S_NP, decltype(want_ds)::value>(
                    a, mk, s[mi], dp[mi], m0 + s_q0 + 16 * mi, n0 + s_k0, nq, nk, l2, ds, slope,
                    lane, !full, rbad, kbits);
            }
        };
        /* P or dS of the warp's tile (f32 in acc) to shared memory at byte offset `off` */
        auto store_tile = [&](float(*acc)[2 * S_NP][4], uint32_t off) {
#pragma unroll
            for (int mi = 0; mi < S_MT; ++mi) {
                if constexpr (use_stsm) {
#pragma unroll
                    for (int jp = 0; jp < S_NP; ++jp)
                        fp_stsm_x4(stsm_off[jp] + off + (uint32_t)(16 * mi * PC * 2),
                                   fp_pack2<T>(acc[mi][2 * jp][0], acc[mi][2 * jp][1]),
                                   fp_pack2<T>(acc[mi][2 * jp][2], acc[mi][2 * jp][3]),
                                   fp_pack2<T>(acc[mi][2 * jp + 1][0], acc[mi][2 * jp + 1][1]),
                                   fp_pack2<T>(acc[mi][2 * jp + 1][2], acc[mi][2 * jp + 1][3]));
                } else {
#pragma unroll
                    for (int j = 0; j < 2 * S_NP; ++j)
#pragma unroll
                        for (int r = 0; r < 2; ++r)
                            *reinterpret_cast<uint32_t *>(sp_b + off + st_off[j] +
                                                          (uint32_t)((16 * mi + 8 * r) * PC * 2)) =
                                fp_pack2<T>(acc[mi][j][2 * r], acc[mi][j][2 * r + 1]);
                }
            }
        };
        if (!CFG::P_FIRST || a.transform) {
            fp_warp_mma2<T, KT, FP_MMA_LOAD_ALL>(s, ld_q, ld_k, dp, ld_do, ld_v);
            if (a.transform)
                elementwise(fp_int<FP_SCORES_TRANSFORM>(), fp_flag<true>());
            else if (!full)
                elementwise(fp_int<FP_SCORES_MASK>(), fp_flag<true>());
            else
                elementwise(fp_int<FP_SCORES_FULL>(), fp_flag<true>());
            store_tile(s, 0);
            store_tile(dp, TILE_BYTES + ds_off);
        } else {
            /* P first, so that its exp2s overlap the dP products; then dS = P (dP - Dsum). The
             * dP products are called in each branch so that they share a basic block with the
             * exp2s, which the scheduler then interleaves (after the branch they would not). */
            fp_warp_mma<T, KT, FP_MMA_LOAD_ALL>(s, ld_q, ld_k);
            if (!full) {
                /* edge steps: a masked pair's P is -0 (fp_bwd_elem), and its dS is selected to
                 * 0 by that sign: its dP or Dsum may be NaN */
                elementwise(fp_int<FP_SCORES_MASK>(), fp_flag<false>());
                fp_warp_mma<T, KT, FP_MMA_LOAD_ALL>(dp, ld_do, ld_v);
#pragma unroll
                for (int mi = 0; mi < S_MT; ++mi) {
                    const float ds[2] = {dsum_b[16 * mi], dsum_b[16 * mi + 8]};
#pragma unroll
                    for (int j = 0; j < 2 * S_NP; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            dp[mi][j][e] = s[mi][j][e] == 0.0f && signbit(s[mi][j][e])
                                               ? 0.0f
                                               : s[mi][j][e] * (dp[mi][j][e] - ds[e >> 1]);
                }
            } else {
                elementwise(fp_int<FP_SCORES_FULL>(), fp_flag<false>());
                fp_warp_mma<T, KT, FP_MMA_LOAD_ALL>(dp, ld_do, ld_v);
#pragma unroll
                for (int mi = 0; mi < S_MT; ++mi) {
                    const float ds[2] = {dsum_b[16 * mi], dsum_b[16 * mi + 8]};
#pragma unroll
                    for (int j = 0; j < 2 * S_NP; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            dp[mi][j][e] = s[mi][j][e] * (dp[mi][j][e] - ds[e >> 1]);
                }
            }
            store_tile(s, 0);
            store_tile(dp, TILE_BYTES + ds_off);
        }
        __syncthreads();

        /* dV += P^T dO, dK += dS^T Q (this warp's KV_MT x 16 keys x KV_NP x 16 columns). Written
         * out, not through fp_warp_mma2 (the same instructions in the same order): through it
         * the compiler orders the loop-carried dV and dK registers differently, and the
         * kernel's machine code changes. */
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            uint32_t pa[KV_MT][4], sa[KV_MT][4], of[KV_NP][4], qf[KV_NP][4];
#pragma unroll
            for (int mi = 0; mi < KV_MT; ++mi) {
                fp_ldsm_x4_t(pa[mi], sp_a + kv_a_off[mi] + 16 * kk * PC * 2);
                fp_ldsm_x4_t(sa[mi], sds_a + ds_off + kv_a_off[mi] + 16 * kk * PC * 2);
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

        /* One Q/dO buffer: the next step's loads wait until every warp is done with this one's
         * (the dQ product below reads only dS and K). */
        if constexpr (QB == 1) {
            __syncthreads();
            if (it + 1 < iters)
                fp_bwd_load_step<T, DK, NT, BM>(a, sq, sdo, slse, sdsum, b, h1, sq_.q_start, nq,
                                                mb1 * BM, nchunks, 0);
            fp_cp_async_commit();
        }

        /* dQ += dS K (atomic mode), or the last step's after the next barrier (DQ_LAG) */
        if constexpr (!DQ_LAG)
            dq_product(m0, h, ds_off);
    }
    if (DQ_LAG && iters > 0)
        dq_product(mb * BM, h, ((iters - 1) & 1) * TILE_BYTES);

    fp_cp_async_wait<0>();
    fp_bwd_store_dkdv<T, DK, BN, NT, KV_MT, KV_NP>(a, dv, dk, sk, sq_, b, kvh, split, n0, nk, kv_k0,
                                                   kv_d0, nchunks, tid, lane, g, t);
}

// Deterministic dQ. q, dout, dq: (B, Nq, H, D); k, v: (B, Nk, Hkv, D); grid (q blocks, H, B).
template <typename T, int DK, int ALT>
__global__ void __launch_bounds__(fp_dq_cfg<DK, ALT>::NW * 32) fp_sm80_bwd_dq(const fp_sm80_args a)
{
    constexpr int NW = fp_dq_cfg<DK, ALT>::NW, BN = fp_dq_cfg<DK, ALT>::BN;
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

    int nb_begin, nb_end;
    fp_geom_key_blocks(m0, min(m0 + BM, nq), nq, nk, a.left, a.right, BN, &nb_begin, &nb_end);

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
        const int64_t idx = fp_bwd_ws_row(a, b, h, m0 + wrow + g + 8 * r);
        lse2[r] = a.ws_lse2[idx];
        dsum[r] = a.ws_dsum[idx];
    }
    const float slope = a.alibi ? a.alibi[h] : 0.0f;
    const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);

    float dq[1][DT8][4];
    fp_acc_zero(dq);
    const uint32_t sq_a = fp_smem_addr(sq), sdo_a = fp_smem_addr(sdo);
    const uint32_t sk_a = fp_smem_addr(sk), sv_a = fp_smem_addr(sv);
    const fp_ldsm_lane la = fp_lane_a<DK>(wrow, lane), lb = fp_lane_b<DK>(0, lane);
    const fp_ldsm_lane lbt = fp_lane_bt<DK>(0, lane);

    /* The masked-key guard (common.cuh): in an edge block K, which masked pairs' dS = 0 meet in
     * dQ += dS K, is scrubbed and its non-finite keys flagged (per K buffer); Q and dO meet only
     * visible pairs here (dQ is per row), and dP's masked entries are dropped by the dS select. */
    __shared__ uint8_t kfl[2][BN];
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
        const bool full =
            fp_mask_block_full(m0, min(m0 + BM, nq), j0, j0 + BN, nq, nk, a.left, a.right);
        if (!full) {
            fp_bwd_guard_k<T, BN, DK, NT>(sk + buf * BN * DK, kfl[buf]);
            __syncthreads();
        }

        /* S = Q K^T, dP = dO V^T (this warp's 16 queries x BN keys) */
        float s[1][NB8][4], dp[1][NB8][4];
        fp_acc_zero(s);
        fp_acc_zero(dp);
        const uint32_t kt = sk_a + buf * BN * DK * 2, vt = sv_a + buf * BN * DK * 2;
        fp_warp_mma2<T, KT, FP_MMA_STREAM_B>(
            s,
            [&](uint32_t(&f)[4], int, int kk) { fp_ldsm_x4(f, fp_ldsm_addr<DK>(sq_a, la, 0, kk)); },
            [&](uint32_t(&f)[4], int p, int kk) {
                fp_ldsm_x4(f, fp_ldsm_addr<DK>(kt, lb, 16 * p, kk));
            },
            dp,
            [&](uint32_t(&f)[4], int, int kk) {
                fp_ldsm_x4(f, fp_ldsm_addr<DK>(sdo_a, la, 0, kk));
            },
            [&](uint32_t(&f)[4], int p, int kk) {
                fp_ldsm_x4(f, fp_ldsm_addr<DK>(vt, lb, 16 * p, kk));
            });

        const bool no_rbad[2] = {false, false};
        const uint32_t kbits = full ? 0u : fp_key_bits<NB8>(kfl[buf], lane);
        if (a.transform)
            fp_bwd_tile<FP_SCORES_TRANSFORM, NB8>(a, mk, s[0], dp[0], m0 + wrow, j0, nq, nk, lse2,
                                                  dsum, slope, lane, !full, no_rbad, kbits);
        else if (!full)
            fp_bwd_tile<FP_SCORES_MASK, NB8>(a, mk, s[0], dp[0], m0 + wrow, j0, nq, nk, lse2, dsum,
                                             slope, lane, true, no_rbad, kbits);
        else
            fp_bwd_tile<FP_SCORES_FULL, NB8>(a, mk, s[0], dp[0], m0 + wrow, j0, nq, nk, lse2, dsum,
                                             slope, lane);

        /* dQ += dS K, dS from registers */
        fp_warp_mma<T, BN / 16, FP_MMA_STREAM_B>(
            dq,
            [&](uint32_t(&f)[4], int, int kk) {
                fp_acc_to_a<T>(f, dp[0][2 * kk], dp[0][2 * kk + 1]);
            },
            [&](uint32_t(&f)[4], int p, int kk) {
                fp_ldsm_x4_t(f, fp_ldsm_addr<DK>(kt, lbt, 16 * kk, p));
            });
    }
    fp_cp_async_wait<0>();
    __syncthreads();
    fp_stage_acc<DK, DT8, T>(sq, wrow, 0, dq[0], a.scale, a.scale, lane);
    __syncthreads();
    T *dst = reinterpret_cast<T *>(const_cast<void *>(a.dq.ptr)) + fp_cuda_row(a.dq, b, qrow, h);
    fp_store_tile<BM, DK, NT>(dst, a.dq.ss, sq, nq - m0, nchunks, tid);
}

/* Lets `kernel` use `smem` bytes of dynamic shared memory. A refusal is returned and also
 * cleared from the runtime's last error, so that the next launch check does not see it. */
template <typename F> static cudaError_t fp_set_smem(F kernel, size_t smem)
{
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        (void)cudaGetLastError();
    return e;
}

/* Shared memory of each configuration, as sm80/config.h lists it for fp_sm80_pick. */
template <int DK> constexpr int fp_dk_class()
{
    return DK == 64 ? 0 : DK == 128 ? 1 : 2;
}
template <int DK, int ALT> constexpr bool fp_bwd_smem_listed()
{
    return fp_dkdv_smem<DK, ALT>() == fp_sm80_dkdv_smem_bytes[fp_dk_class<DK>()][ALT];
}
static_assert(fp_bwd_smem_listed<64, 0>() && fp_bwd_smem_listed<64, 1>() &&
                  fp_bwd_smem_listed<64, 2>() && fp_bwd_smem_listed<128, 0>() &&
                  fp_bwd_smem_listed<128, 1>() && fp_bwd_smem_listed<256, 0>() &&
                  fp_bwd_smem_listed<256, 1>() && fp_bwd_smem_listed<256, 2>(),
              "sm80/config.h's dK/dV shared-memory table");
static_assert(fp_dq_smem<64, 0>() == fp_sm80_dq_smem_bytes[0][0] &&
                  fp_dq_smem<128, 0>() == fp_sm80_dq_smem_bytes[1][0] &&
                  fp_dq_smem<256, 0>() == fp_sm80_dq_smem_bytes[2][0] &&
                  fp_dq_smem<256, 1>() == fp_sm80_dq_smem_bytes[2][1],
              "sm80/config.h's dQ shared-memory table");

/* The deterministic dQ configuration that runs, -1 if none fits (fp_sm80_pick). */
template <int DK> static int fp_dq_pick(const fp_cuda_ctx *ctx)
{
    return fp_sm80_pick(DK, ctx->smem_optin, 0).dq;
}

/* The dK/dV configuration that runs (a deterministic dQ configuration must fit too), -1 if none
 * does (fp_sm80_pick). */
template <int DK> static int fp_dkdv_pick(const fp_cuda_ctx *ctx)
{
    return fp_sm80_pick(DK, ctx->smem_optin, 0).dkdv;
}

/* The deterministic dQ kernel: one block per query block walking the key blocks in order. */
template <typename T, int DK, int ALT>
static cudaError_t fp_dq_launch(const fp_cuda_ctx *ctx, const fp_problem *p, const fp_sm80_args &a)
{
    using CFG = fp_dq_cfg<DK, ALT>;
    constexpr size_t smem = fp_dq_smem<DK, ALT>();
    constexpr int BM = 16 * CFG::NW;
    cudaError_t e = fp_set_smem(fp_sm80_bwd_dq<T, DK, ALT>, smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)((a.nq + BM - 1) / BM), (unsigned)p->heads, (unsigned)p->batch);
    fp_sm80_bwd_dq<T, DK, ALT><<<grid, CFG::NW * 32, smem, ctx->stream>>>(a);
    fp_cuda_log("backward: deterministic dQ D%d kernel (BM %d, BN %d), grid %ux%ux%u", DK, BM,
                CFG::BN, grid.x, grid.y, grid.z);
    return cudaGetLastError();
}

template <typename T, int DK, int ALT>
static cudaError_t fp_dkdv_launch(const fp_cuda_ctx *ctx, const fp_problem *p,
                                  const fp_sm80_args &a)
{
    constexpr size_t smem = fp_dkdv_smem<DK, ALT>();
    constexpr int BN = fp_bwd_cfg<DK, ALT>::BN;
    dim3 grid((unsigned)((a.nk + BN - 1) / BN), (unsigned)(p->kv_heads * a.group_splits),
              (unsigned)p->batch);
    if (grid.x == 0)
        return cudaSuccess;
    void (*kernel)(const fp_sm80_args) = fp_sm80_bwd_dkdv<T, DK, ALT>;
    cudaError_t e = fp_set_smem(kernel, smem);
    if (e != cudaSuccess)
        return e;
    kernel<<<grid, fp_bwd_cfg<DK, ALT>::NW * 32, smem, ctx->stream>>>(a);
    fp_cuda_log("backward: sm80 dK/dV D%d kernel (BN %d, BM %d%s), grid %ux%ux%u, group of %d "
                "query heads in %d split(s)",
                DK, BN, fp_bwd_cfg<DK, ALT>::BM,
                fp_bwd_dq_lag<DK, ALT>::value ? ", dQ one step late" : "", grid.x, grid.y, grid.z,
                a.group, a.group_splits);
    if (a.seqused_k)
        fp_cuda_bwd_zero_unused(p, a, ctx->stream);
    return cudaGetLastError();
}

/* Keys per block of the dK/dV configuration `alt` of head dim DK. */
template <int DK> static int fp_bwd_block_k(int alt)
{
    return fp_cuda_with_index<fp_bwd_alts<DK>()>(
        alt, [](auto i) { return (int)fp_bwd_cfg<DK, decltype(i)::value>::BN; });
}

/* The backward of head dim DK: the side passes and the dK/dV and dQ configurations fp_sm80_pick
 * chooses, launched. */
template <typename T, int DK>
flashport_status fp_sm80_bwd_family<T, DK>::run(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                const fp_sm80_args &args, void *ws, size_t *query)
{
    fp_sm80_args a = args;
    const cudaStream_t stream = ctx->stream;
    const int alt = fp_dkdv_pick<DK>(ctx);
    if (alt < 0)
        return fp_cuda_refuse(FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM,
                              "the backward at head dim %lld needs %zu KiB of shared memory per "
                              "block; this device allows %zu KiB",
                              (long long)p->head_dim,
                              fp_dkdv_smem<DK, fp_bwd_alts<DK>() - 1>() / 1024,
                              ctx->smem_optin / 1024);
    const int splits = p->batch == 0 || p->heads == 0
                           ? 1
                           : fp_cuda_bwd_group_splits(ctx, p, fp_bwd_block_k<DK>(alt));
    const size_t bytes =
        fp_cuda_bwd_side_setup(p, &a, DK, !p->deterministic, splits, query ? NULL : ws);
    if (query) {
        *query = bytes;
        return FLASHPORT_OK;
    }
    if (bytes == 0)
        return FLASHPORT_OK;
    const fp_plan_shape shape = fp_problem_plan_shape(p);
    a.reverse = fp_plan_heavy_first(&shape);
    cudaError_t e = fp_cuda_bwd_side_pre(p, a, DK, stream);
    if (e == cudaSuccess)
        e = fp_cuda_with_index<fp_bwd_alts<DK>()>(
            alt, [&](auto i) { return fp_dkdv_launch<T, DK, decltype(i)::value>(ctx, p, a); });
    if (e == cudaSuccess)
        e = fp_cuda_bwd_side_dkdv_sum(p, a, DK, stream);
    if (e == cudaSuccess && a.dq_atomic)
        e = fp_cuda_bwd_side_dq(p, a, DK, stream);
    else if (e == cudaSuccess && !a.dq_atomic && a.nq > 0)
        e = fp_cuda_with_index<fp_dq_alts<DK>()>(fp_dq_pick<DK>(ctx), [&](auto i) {
            return fp_dq_launch<T, DK, decltype(i)::value>(ctx, p, a);
        });
    return e == cudaSuccess ? FLASHPORT_OK
                            : fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "backward kernel launch");
}

#endif /* FLASHPORT_BACKENDS_CUDA_SM80_BWD_CUH */
