/*
 * Flash attention forward, sm90 path (Hopper, sm_90a): TMA + wgmma + warp specialization.
 *
 * Algorithm (the FlashAttention-3 forward's structure, written from the paper and the PTX ISA):
 * thread blocks of three warpgroups; each runs one or more tiles (query block of 128 rows, head,
 * batch [, KV split]): one tile per block, or, where the tiles outnumber the SMs and are short
 * or differ in cost, a persistent grid of one block per SM walking them (fp_sm90_fwd_grid_of,
 * fp_sm90f_walk: a static walk, or tiles claimed as blocks free up), whose next tile's loads
 * overlap its current tile's last products and store.
 *   producer (warpgroup 0; setmaxnreg gives its registers to the consumers): thread 0 issues
 *     the TMA loads of each tile's Q tile (once the consumers are done with the last one) and
 *     the K and V tiles of its key blocks into a ring of ST shared-memory stages that runs on
 *     from tile to tile. Each stage has a "full" mbarrier (the TMA bytes landed) and an
 *     "empty" one (its readers are done with it) for K and for V. Warps 1 .. 3, the V
 *     preparers, take each V stage between its arrival and P V: the masked-key guard's scrub in
 *     edge blocks (f16 / bf16), the V^T transpose (fp8); the consumers wait on their "ready"
 *     mbarrier for those blocks, on V's "full" one for the others.
 *   consumers (warpgroups 1 and 2, 64 query rows each): S = Q K^T by wgmma with both operands
 *     in shared memory; mask / softcap / ALiBi and the online softmax on S in registers (log2
 *     units, exp2); O += P V by wgmma with P from registers (the S accumulator's layout is the
 *     A fragment's) and V from shared memory (MN-major, the transpose bit). Within a
 *     warpgroup, Q K^T of block j + 1 and P V of block j are both in flight while the softmax
 *     of block j + 1 runs; O is rescaled once P V (j) has landed. Between the two
 *     warpgroups, named barriers make them take turns issuing their products (ping-pong), so
 *     that one warpgroup's softmax runs under the other's wgmma.
 * Key blocks are visited from the last to the first, so for causal masks the blocks that need
 * per-element masking come first and the rest run the unmasked code.
 * The steps, as functions: fp_sm90_fwd_load (the producer's thread 0), fp_sm90_fwd_prepare_v
 * (the V preparers), and the consumers' fp_sm90_fwd_qk, fp_sm90_fwd_wait_pv (the P V operand and
 * the guard's row marks), fp_sm90_fwd_softmax, fp_sm90_fwd_pack_p, fp_sm90_fwd_pv,
 * fp_sm90_fwd_rescale_o and fp_sm90_fwd_row_scales; the mbarriers, the ring's stages and the
 * consumers' waits on it are fp_sm90f_bars. The kernel sets up the block, runs the consumers'
 * loop (the ping-pong turns) and their store. The store stays written out in the kernel: moved
 * into functions, it changed the machine code (docs/design.md).
 *
 * Tiles are stored as TMA writes them with 128-byte swizzling: a tile of R rows x DK columns is
 * DK / 64 panels of R x 64 elements (128-byte rows, 8-row atoms of 1024 bytes). O is staged in
 * the warpgroup's own rows of the Q tile (dead once its last Q K^T has landed) and written with
 * 16-byte stores, bounded by the sequence.
 *
 * fp8 (e4m3 q, k, v; docs/semantics.md "fp8 forward"): the same kernel over 1-byte inputs
 * (128-column panels, wgmma K = 32). fp8 wgmma reads both operands K-major, so P V needs V^T:
 * the V preparers transpose each V stage into a V^T stage in shared memory
 * (fp_sm90_transpose_v8, with the guard's scrub), which the consumers read instead. P is rounded to
 * e4m3 from registers; descale_q descale_k ride on the scale, descale_v on the final 1 / l; O (f16
 * or bf16) is stored from registers.
 *
 * Configurations (fp_sm90_cfg, sm90/fwd_config.cuh; BM x BN, stages; 2 consumer warpgroups in
 * ping-pong, 384 threads, one block per SM; LAZY: O is rescaled only when a row maximum grows by
 * more than 2^8): DK = 64: 128 x 128, 2;  DK = 128: 128 x 128, 2, LAZY;  DK = 192: 128 x 96, 2,
 * LAZY; DK = 256: 128 x 80, 2, LAZY;  fp8: DK = 128: 128 x 128, 2, LAZY;  DK = 256: 128 x 96, 2,
 *   LAZY.
 * Head dims that are multiples of 8 run on the next larger DK; TMA reads the columns past D as
 * zeros. Split-KV (chosen by core/plan.h for shapes that leave SMs idle) writes f32 partials
 * that the sm80 path's combine kernel merges.
 *
 * Masking and online softmax: core/mask.h (block range, fully visible blocks, the per-element
 * rule through fp_mask32, fp_score_transform); core/online_softmax.h (fp_softmax_update_exp2;
 * the per-element weight mirrors fp_softmax_weight_exp2; finalize through fp_cuda_out_scale and
 * fp_cuda_lse_exp2 as the sm80 path does).
 *
 * Differences from the reference: P is rounded to f16/bf16 before P V (the row sum uses the
 * unrounded P); exp2, 1/l and log2 are the hardware approximations.
 * Numbers: docs/performance.md.
 *
 * This header holds the kernel and its launch (fp_sm90_fwd_family, sm90/fwd_config.cuh); one file
 * per head dim instantiates them (sm90/inst/fwd_d64.cu ... fwd_d256.cu, f16 and bf16;
 * fwd_d128_e4m3.cu, fwd_d256_e4m3.cu, e4m3 inputs), the launcher is sm90/fwd.cu.
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM90_FWD_CUH
#define FLASHPORT_BACKENDS_CUDA_SM90_FWD_CUH

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/sm80/common.cuh"
#include "backends/cuda/ptx/sm90.cuh"
#include "backends/cuda/sm90/common.cuh"
#include "backends/cuda/sm90/fwd_config.cuh"

#include "core/plan.h"
#include "core/problem.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>

typedef struct fp_sm90_fwd_params {
    CUtensorMap tq, tk, tv; /* 4-d maps (D, tokens, heads, batch); boxes of 128 bytes x rows */
    fp_sm80_args a;         /* fp8: scale and scale_log2 carry descale_q descale_k */
    float descale_v;        /* fp8: O's factor; 1 otherwise */
    int q_blocks;           /* query blocks per (batch, head, split) */
    int tiles;              /* q_blocks x heads x batch x splits: the kernel's work items */
    /* The persistent kernel's walk (fp_sm90f_walk): chunk: (head, batch x split) pairs whose
     * tiles are numbered together, query blocks slowest within a chunk; counter: NULL for the
     * static walk (block x runs tiles x, x + gridDim.x, ...), else a zeroed int in the call's
     * scratch from which the blocks claim their tiles past the first, in order. */
    int chunk;
    int *counter;
    int handoff; /* the consumers' early turn handoff between tiles (HANDOFF) is on */
} fp_sm90_fwd_params;

/* The fp8 kernel's V^T, made in shared memory by the producer warpgroup's V preparers (ptid):
 * wgmma's fp8 B operand must be K-major, and V arrives key-major. vt: VT_PANELS panels of DK
 * rows x 128 keys. The keys of V^T's rows are permuted within each 16 so that the S
 * accumulator's registers are the P V A fragment's as they stand: A fragment byte 4 t + q of a
 * 16-key group (lane t of a quad) holds key 2 t + (q & 1) + 8 (q >> 1), which is where the S
 * accumulator holds P for the thread. One unit, 16 keys x 32 columns of V, by one warp:
 * ldmatrix.trans of four 8 x 8 b16 matrices (keys 0-7 / 8-15 x two 16-byte column chunks) gives
 * each thread keys 2 t, 2 t + 1 (and + 8) of two adjacent columns; byte permutes make the 4-key
 * words of one column; stmatrix writes them as V^T rows. A warp has X units in flight (their
 * loads issued before the first one's stores: one unit alone waits out ldmatrix's latency).
 * GUARD (an edge block, the masked-key guard): e4m3 NaN codes (0x7f, 0xff) become 0 and their
 * keys are flagged in vmask. */
template <int DK, int BN, int X, bool GUARD>
FP_DEV void fp_sm90_transpose_v8(uint32_t raw, uint32_t vt, uint32_t *vmask, int ptid)
{
    constexpr int GROUPS = BN / 16, UNITS = GROUPS * (DK / 32), WARPS = FP_SM90_PREPARERS / 32;
    const int lane = ptid & 31, warp = ptid >> 5;
    const int mi = lane >> 3, ri = lane & 7, t = lane & 3;
#pragma unroll 1
    for (int u0 = warp; u0 < UNITS; u0 += X * WARPS) {
        uint32_t r[X][4];
#pragma unroll
        for (int x = 0; x < X; ++x) {
            const int u = min(u0 + x * WARPS, UNITS - 1); /* past the end: a repeat, harmless */
            const int g16 = u % GROUPS, dc = 2 * (u / GROUPS); /* 16-byte column chunk pair */
            const int key = 16 * g16 + (mi & 1) * 8 + ri, chunk = dc + (mi >> 1);
            fp_ldsm_x4_t(r[x], raw + (chunk / 8) * BN * 128 + key * 128 +
                                   (((chunk % 8) ^ (key & 7)) << 4));
        }
#pragma unroll
        for (int x = 0; x < X; ++x) {
            const int u = min(u0 + x * WARPS, UNITS - 1);
            const int g16 = u % GROUPS, dc = 2 * (u / GROUPS);
            uint32_t w[4];
            w[0] = __byte_perm(r[x][0], r[x][1], 0x6420);
            w[1] = __byte_perm(r[x][0], r[x][1], 0x7531);
            w[2] = __byte_perm(r[x][2], r[x][3], 0x6420);
            w[3] = __byte_perm(r[x][2], r[x][3], 0x7531);
            if (GUARD) {
                uint32_t bad = 0;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint32_t nan = __vcmpeq4(w[i] & 0x7f7f7f7fu, 0x7f7f7f7fu);
                    w[i] &= ~nan;
                    bad |= nan;
                }
                if (bad) {
                    const int k0 = 16 * g16 + 2 * t;
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        if ((bad >> (8 * q)) & 0xffu) {
                            const int k = k0 + (q & 1) + 8 * (q >> 1);
                            atomicOr(&vmask[k >> 5], 1u << (k & 31));
                        }
                }
            }
            const int d = 16 * (dc + (mi >> 1)) + 2 * ri + (mi & 1); /* this lane's V^T row */
            fp_stsm_x4(vt + (g16 / 8) * DK * 128 + d * 128 + (((g16 % 8) ^ (d & 7)) << 4), w[0],
                       w[1], w[2], w[3]);
        }
    }
}

/* Masks one thread's part of a warpgroup's 64 x BN score tile: rows i_lo and i_lo + 8 of the
 * sequence, keys j0 + 8 j + 2 t + e; s[4 j + 2 r + e] is (row r, key 8 j + 2 t + e). Masked
 * scores become -inf (fp_mask_visible's rule through fp_mask32_row, as the sm80 path). */
template <int BN>
FP_DEV void fp_sm90_mask(float (&s)[BN / 2], const fp_mask32 &mk, int i_lo, int j0, int t)
{
    const int jb = j0 + 2 * t;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const fp_mask_row mr = fp_mask32_row(mk, i_lo + 8 * r, jb);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float &x = s[4 * j + 2 * r + e];
                x = fp_mask_row_visible(mr, 8 * j + e) ? x : -INFINITY;
            }
    }
}

/* The score transform of core/mask.h (fp_score_transform: softcap c tanh(s / c), then ALiBi
 * - slope |i + Nk - Nq - j|) on raw scores q.k, into log2 units. tanh(y) = 1 - 2 / (e^2y + 1)
 * (absolute error near 1e-7; e^2y = inf gives 1), its reciprocal on the FMA pipe where
 * TANH_FMA (fp_sm90_tanh2, the configuration's choice), else on the MUFU pipe beside the
 * exponentials; each feature is one uniform branch around its own pass over the tile. */
typedef struct fp_sm90_xform {
    float scale_log2;      /* no softcap: scale log2(e) */
    float cap_in, cap_out; /* softcap: 2 log2(e) scale / c and c log2(e); 0 = no softcap */
    float slope_log2;      /* ALiBi slope log2(e), 0 = none */
    int shift;             /* Nk - Nq */
} fp_sm90_xform;

template <int BN, bool TANH_FMA>
FP_DEV void fp_sm90_transform(float (&s)[BN / 2], const fp_sm90_xform &x, int i_lo, int j0, int t)
{
    if (x.cap_out > 0.0f) {
#pragma unroll
        for (int k = 0; k < BN / 2; ++k)
            s[k] = x.cap_out * (TANH_FMA ? fp_sm90_tanh2(s[k] * x.cap_in)
                                         : 1.0f - 2.0f * fp_rcp(fp_exp2(s[k] * x.cap_in) + 1.0f));
    } else {
#pragma unroll
        for (int k = 0; k < BN / 2; ++k)
            s[k] *= x.scale_log2;
    }
    if (x.slope_log2 != 0.0f) {
        const int jb = j0 + 2 * t;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int base = i_lo + 8 * r + x.shift - jb; /* distance to key jb, signed */
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    s[4 * j + 2 * r + e] -= x.slope_log2 * fabsf((float)(base - 8 * j - e));
        }
    }
}

/* The masked-key guard (sm80/common.cuh, fp_scrub_tile) on a V stage at generic address v (NP
 * panels of BN rows x 128 bytes, contiguous; a row's 16-byte chunks stay in its 128-byte row
 * whatever the swizzle): every infinite or NaN element becomes 0, and the bit of its key is set
 * in vmask. By the producer warpgroup's 96 V preparers (ptid): a look with LOOK chunks in
 * flight per thread, then, if it found such an element, the scrub with X; a chunk is written
 * back only if it held one. Returns whether this thread's look found one (only then may it
 * have written). */
template <typename T, int BN, int NP, int LOOK, int X>
FP_DEV bool fp_sm90_scrub_v(unsigned char *v, uint32_t *vmask, int ptid)
{
    constexpr int CHUNKS = NP * BN * 8;
    /* First a read-only look, LOOK chunks in flight: the scrub's writes happen for a V stage that
     * holds a non-finite element only, and this look sits between V's arrival and the block's
     * P V, so it must be quick. */
    bool any = false;
#pragma unroll 1
    for (int c0 = ptid; c0 < CHUNKS; c0 += LOOK * FP_SM90_PREPARERS) {
        uint4 d[LOOK];
#pragma unroll
        for (int x = 0; x < LOOK; ++x) {
            const int c = c0 + x * FP_SM90_PREPARERS;
            d[x] = c < CHUNKS ? *reinterpret_cast<const uint4 *>(v + 16 * c) : uint4{};
        }
#pragma unroll
        for (int x = 0; x < LOOK; ++x)
            any |= fp_vec_nonfinite<T>(d[x]);
    }
    if (!any)
        return false;
#pragma unroll 1
    for (int c0 = ptid; c0 < CHUNKS; c0 += X * FP_SM90_PREPARERS) {
        uint4 d[X];
#pragma unroll
        for (int x = 0; x < X; ++x) {
            const int c = c0 + x * FP_SM90_PREPARERS;
            if (c < CHUNKS)
                d[x] = *reinterpret_cast<const uint4 *>(v + 16 * c);
        }
#pragma unroll
        for (int x = 0; x < X; ++x) {
            const int c = c0 + x * FP_SM90_PREPARERS;
            uint4 w = d[x];
            if (fp_scrub_vec<T>(w) && c < CHUNKS) {
                const int row = c % (BN * 8) / 8;
                *reinterpret_cast<uint4 *>(v + 16 * c) = w;
                atomicOr(&vmask[row / 32], 1u << (row % 32));
            }
        }
    }
    return true;
}

/* What the kernel and its steps derive from the inputs' type TI and the configuration CFG. */
template <typename TI, typename CFG> struct fp_sm90f_dims {
    static constexpr int EB = sizeof(TI); /* bytes per input element */
    static constexpr bool FP8 = EB == 1;
    static constexpr int NP = CFG::DK * EB / 128;    /* 128-byte panels of a tile */
    static constexpr int PCOLS = 128 / EB;           /* columns of a 128-byte panel */
    static constexpr int KSTEPS = CFG::DK * EB / 32; /* Q K^T wgmma steps (32 bytes of K each) */
    static constexpr int PK = FP8 ? 32 : 16;         /* P V wgmma K */
    static constexpr uint32_t Q_BYTES = FP_SM90_BM * CFG::DK * EB; /* one Q tile */
    static constexpr uint32_t KV_BYTES = CFG::BN * CFG::DK * EB;   /* one K or V stage */
    static constexpr uint32_t VT_BYTES = FP8 ? CFG::VT_PANELS * CFG::DK * 128 : 0; /* V^T (fp8) */
    static constexpr int VM_WORDS = (CFG::BN + 31) / 32; /* vmask words of a stage */
    /* The producer warpgroup's registers per thread after setmaxnreg (the consumers get the
     * rest: 128 x 40 + 256 x 232 = 128 x 24 + 256 x 240 = the block's 384 x 168): 40 for the fp8
     * transposes and the DK = 64 kernel's guard scrub (4 chunks in flight); 24 elsewhere, so
     * that the f16 / bf16 consumers of the larger head dims keep 240 (docs/bench/). */
    static constexpr int PRODUCER_REGS = FP8 || CFG::DK <= 64 ? 40 : 24;
};

/* The forward's mbarriers, 8 bytes each from `base`: per stage s, its K / V tiles landed (full)
 * and their readers done (empty); the V preparers done with it (pv_ready: the V^T stage made
 * (fp8: every block), or the V stage scrubbed (f16 / bf16: edge blocks only; the consumers take
 * the other blocks' V straight from v_full); its phases count the blocks that pass through it,
 * per stage (pv_phase)); fp8's V^T readers done (vt_empty); per Q tile i, it landed (q_full)
 * and its readers are done (q_empty: with it, and with O staged in it). */
template <int ST, bool FP8> struct fp_sm90f_bars {
    static constexpr int NS = FP8 ? 6 : 5; /* mbarriers per stage */
    uint32_t base;
    __device__ __forceinline__ uint32_t k_full(int s) const { return base + 8u * s; }
    __device__ __forceinline__ uint32_t v_full(int s) const { return base + 8u * (ST + s); }
    __device__ __forceinline__ uint32_t k_empty(int s) const { return base + 8u * (2 * ST + s); }
    __device__ __forceinline__ uint32_t v_empty(int s) const { return base + 8u * (3 * ST + s); }
    __device__ __forceinline__ uint32_t pv_ready(int s) const { return base + 8u * (4 * ST + s); }
    __device__ __forceinline__ uint32_t vt_empty(int s) const { return base + 8u * (5 * ST + s); }
    __device__ __forceinline__ uint32_t q_full(int i) const { return base + 8u * (NS * ST + i); }
    __device__ __forceinline__ uint32_t q_empty(int i) const
    {
        return base + 8u * (NS * ST + 2 + i);
    }
    /* the consumers are done with the P V operand: V (f16 / bf16) or V^T (fp8) */
    __device__ __forceinline__ uint32_t pv_empty(int s) const
    {
        return FP8 ? vt_empty(s) : v_empty(s);
    }
    /* The ring's n-th key block (counted over the block's tiles, as the three roles walk them):
     * its stage, and the parity of that stage's phase */
    __device__ __forceinline__ static unsigned stage(unsigned n) { return n % ST; }
    __device__ __forceinline__ static uint32_t parity(unsigned n) { return (n / ST) & 1; }
    /* The consumers' waits for the n-th key block's K tile, and its V tile as TMA wrote it */
    __device__ __forceinline__ void wait_k(unsigned n) const
    {
        fp_mbar_wait(k_full(stage(n)), parity(n));
    }
    __device__ __forceinline__ void wait_v(unsigned n) const
    {
        fp_mbar_wait(v_full(stage(n)), parity(n));
    }
    /* The parity of stage s's next pv_ready phase, from a bit mask of the stages' parities that
     * the block's walk toggles (the V preparers and the consumers make the same walk). */
    __device__ __forceinline__ static uint32_t pv_phase(uint32_t &bits, int s)
    {
        const uint32_t ph = (bits >> s) & 1u;
        bits ^= 1u << s;
        return ph;
    }
};

/* The producer's thread 0, one tile: K and V of the key blocks nb_end - 1 down to nb_end - n
 * (rows from k_row of kv head kvh) into the ring of ST stages at sk, sv, which goes on from the
 * kv blocks of the block's earlier tiles; its Q tile (rows from q_row of head h; the block's
 * qc-th, in Q tile qc % QTILES at sq) once the consumers are done with that Q tile's last tile:
 * first, unless that wait is for the tile now running (one Q tile, past the block's first tile),
 * then after the first K. qb: the batch coordinate of the tensor maps (0 for varlen's packed
 * maps). */
template <typename TI, typename CFG, int QTILES>
FP_DEV void fp_sm90_fwd_load(const fp_sm90_fwd_params &prm,
                             const fp_sm90f_bars<CFG::ST, sizeof(TI) == 1> &bar, uint32_t sq,
                             uint32_t sk, uint32_t sv, int qb, int h, int kvh, int q_row, int k_row,
                             int nb_end, int n, unsigned kv, unsigned qc)
{
    typedef fp_sm90f_dims<TI, CFG> X;
    constexpr int BM = FP_SM90_BM, BN = CFG::BN;
    const bool q_first = QTILES > 1 || qc == 0;
    auto load_q = [&]() {
        const unsigned qt = qc % QTILES, use = qc / QTILES;
        if (use > 0)
            fp_mbar_wait(bar.q_empty(qt), (use - 1) & 1);
        fp_mbar_arrive_expect_tx(bar.q_full(qt), X::Q_BYTES);
#pragma unroll
        for (int p = 0; p < X::NP; ++p)
            fp_tma_load_4d(sq + qt * X::Q_BYTES + p * BM * 128, &prm.tq, bar.q_full(qt),
                           X::PCOLS * p, q_row, h, qb);
    };
    if (q_first)
        load_q();
#pragma unroll 1 /* within the producer's 24 registers */
    for (int it = 0; it < n; ++it) {
        const int nb = nb_end - 1 - it;
        const unsigned s = bar.stage(kv + it);
        const uint32_t ph = bar.parity(kv + it);
        fp_mbar_wait(bar.k_empty(s), ph ^ 1);
        fp_mbar_arrive_expect_tx(bar.k_full(s), X::KV_BYTES);
#pragma unroll
        for (int p = 0; p < X::NP; ++p)
            fp_tma_load_4d(sk + s * X::KV_BYTES + p * BN * 128, &prm.tk, bar.k_full(s),
                           X::PCOLS * p, k_row + nb * BN, kvh, qb);
        if (it == 0 && !q_first)
            load_q();
        fp_mbar_wait(bar.v_empty(s), ph ^ 1);
        fp_mbar_arrive_expect_tx(bar.v_full(s), X::KV_BYTES);
#pragma unroll
        for (int p = 0; p < X::NP; ++p)
            fp_tma_load_4d(sv + s * X::KV_BYTES + p * BN * 128, &prm.tv, bar.v_full(s),
                           X::PCOLS * p, k_row + nb * BN, kvh, qb);
    }
}

/* The producer warpgroup's warps 1 .. 3, the V preparers (ptid 0 .. 95), one tile: each V stage
 * (at sv, generic gv; the ring goes on from the block's earlier tiles' kv blocks, and so do the
 * pv_ready phases in pv_bits) between its arrival and the consumers' P V, for the key blocks
 * nb_end - 1 down to nb_end - n: fp8's V^T (at svt), and the masked-key guard's scrub in edge
 * blocks (those outside the fully visible keys full_lo .. full_hi). */
template <typename TI, typename CFG>
FP_DEV void fp_sm90_fwd_prepare_v(const fp_sm90f_bars<CFG::ST, sizeof(TI) == 1> &bar,
                                  unsigned char *gv, uint32_t sv, uint32_t svt,
                                  uint32_t (*vmask)[(CFG::BN + 31) / 32], int full_lo, int full_hi,
                                  int nb_end, int n, unsigned kv, uint32_t &pv_bits, int ptid)
{
    typedef fp_sm90f_dims<TI, CFG> X;
    constexpr int DK = CFG::DK, BN = CFG::BN;
    for (int it = 0; it < n; ++it) {
        const int nb = nb_end - 1 - it, j0 = nb * BN;
        const unsigned s = bar.stage(kv + it);
        const uint32_t ph = bar.parity(kv + it);
        /* The masked-key guard (sm80/common.cuh). In a key block that some row of this
         * query block sees only in part (an edge block: the diagonal of a causal mask,
         * a sequence's last block, whose tail TMA fills with the next varlen sequence's
         * tokens), a masked P of 0 would meet that key's V row in P V, and 0 x NaN is
         * NaN: there the V operand's non-finite elements become 0 and their keys are
         * flagged, and the consumers give the rows that see a flagged key O = NaN, the
         * value a non-finite V element gives the rows that see it. */
        const bool edge = !(j0 >= full_lo && j0 + BN <= full_hi);
        fp_mbar_wait(bar.v_full(s), ph);
        if (X::FP8)
            fp_mbar_wait(bar.vt_empty(s), ph ^ 1);
        if (edge) { /* the consumers are done with vmask[s] (the waits above) */
            if (ptid < X::VM_WORDS)
                vmask[s][ptid] = 0;
            fp_named_bar_sync(5, FP_SM90_PREPARERS);
        }
        /* whether this thread may have written the stage (generic stores): then a proxy fence
         * before the wgmma that reads it; the look alone writes nothing */
        bool wrote = X::FP8;
        if constexpr (X::FP8) {
            /* units in flight: as many as the producer's 40 registers hold */
            if (edge)
                fp_sm90_transpose_v8<DK, BN, 2, true>(sv + s * X::KV_BYTES, svt + s * X::VT_BYTES,
                                                      vmask[s], ptid);
            else
                fp_sm90_transpose_v8<DK, BN, (DK >= 256 ? 4 : 3), false>(
                    sv + s * X::KV_BYTES, svt + s * X::VT_BYTES, vmask[s], ptid);
            fp_mbar_arrive(bar.v_empty(s));
        } else if (edge) {
            constexpr int LOOK = DK >= 256 ? 2 : 4, SCRUB = X::PRODUCER_REGS == 40 ? 4 : 1;
            wrote =
                fp_sm90_scrub_v<TI, BN, X::NP, LOOK, SCRUB>(gv + s * X::KV_BYTES, vmask[s], ptid);
        }
        if (X::FP8 || edge) {
            if (wrote)
                fp_fence_proxy_async_smem();
            bar.pv_phase(pv_bits, s);
            fp_mbar_arrive(bar.pv_ready(s));
        }
        if (!X::FP8)
            fp_mbar_arrive(bar.v_empty(s));
    }
}

/* S = Q K^T of the K tile in stage `stage` (issued, not waited for); q_rows: the consumer
 * warpgroup's 64 rows of the Q tile's first panel. */
template <typename TI, typename CFG>
FP_DEV void fp_sm90_fwd_qk(float (&s)[CFG::BN / 2], uint32_t q_rows, uint32_t sk, int stage)
{
    typedef fp_sm90f_dims<TI, CFG> X;
    constexpr int BM = FP_SM90_BM, BN = CFG::BN;
    fp_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < X::KSTEPS; ++kk) {
        const uint32_t off = (kk % 4) * 32; /* 32 bytes into the panel */
        const uint64_t da = fp_wgmma_desc(q_rows + (kk / 4) * BM * 128 + off, 16, 1024);
        const uint64_t db =
            fp_wgmma_desc(sk + stage * X::KV_BYTES + (kk / 4) * BN * 128 + off, 16, 1024);
        if constexpr (X::FP8)
            fp_wgmma_e4m3<BN>::ss(s, da, db, kk > 0);
        else
            fp_wgmma<TI, BN>::ss(s, da, db, kk > 0);
    }
    fp_wgmma_commit();
}

/* O += P V of the V tile in stage `stage` (at sv; fp8: of the V^T tile at svt), issued, not
 * waited for; pa: P as the A fragments (fp_sm90_fwd_pack_p). */
template <typename TI, typename CFG>
FP_DEV void fp_sm90_fwd_pv(float (&o)[CFG::DK / 2],
                           const uint32_t (&pa)[CFG::BN / fp_sm90f_dims<TI, CFG>::PK][4],
                           uint32_t sv, uint32_t svt, int stage)
{
    typedef fp_sm90f_dims<TI, CFG> X;
    constexpr int DK = CFG::DK, BN = CFG::BN;
    fp_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / X::PK; ++kk) {
        if constexpr (X::FP8)
            fp_wgmma_e4m3<DK>::rs(
                o, pa[kk],
                fp_wgmma_desc(svt + stage * X::VT_BYTES + (kk / 4) * DK * 128 + (kk % 4) * 32, 16,
                              1024));
        else
            fp_wgmma<TI, DK>::rs(
                o, pa[kk], fp_wgmma_desc(sv + stage * X::KV_BYTES + kk * 16 * 128, BN * 128, 1024));
    }
    fp_wgmma_commit();
}

/* P from the S accumulator to the A fragments (fp8: V^T's key order makes the accumulator's 4
 * values of a row per 16 keys one register, fp_sm90_transpose_v8). */
template <typename TI, typename CFG>
FP_DEV void fp_sm90_fwd_pack_p(uint32_t (&pa)[CFG::BN / (fp_sm90f_dims<TI, CFG>::PK)][4],
                               const float (&s)[CFG::BN / 2])
{
    typedef fp_sm90f_dims<TI, CFG> X;
#pragma unroll
    for (int kk = 0; kk < CFG::BN / X::PK; ++kk) {
        if constexpr (X::FP8) {
            const float *c = s + 16 * kk;
            pa[kk][0] = fp_pack4_e4m3(c[0], c[1], c[4], c[5]);
            pa[kk][1] = fp_pack4_e4m3(c[2], c[3], c[6], c[7]);
            pa[kk][2] = fp_pack4_e4m3(c[8], c[9], c[12], c[13]);
            pa[kk][3] = fp_pack4_e4m3(c[10], c[11], c[14], c[15]);
        } else {
            pa[kk][0] = fp_pack2<TI>(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = fp_pack2<TI>(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = fp_pack2<TI>(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = fp_pack2<TI>(s[8 * kk + 6], s[8 * kk + 7]);
        }
    }
}

/* O's rows (this thread's two: r = 0, 1) times their rescale factors alpha */
template <int DK> FP_DEV void fp_sm90_fwd_rescale_o(float (&o)[DK / 2], const float (&alpha)[2])
{
#pragma unroll
    for (int j = 0; j < DK / 8; ++j) {
        o[4 * j + 0] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
    }
}

/* The finalize's factors of this thread's rows row_in, row_in + 8 of the warpgroup: their l
 * summed over the quad, fac = 1 / l (FP8: times descale_v; NaN for the rows the guard marked in
 * rowbad) and lse = m + log l (natural log; a row that saw nothing: 0 and -inf). */
template <bool FP8>
FP_DEV void fp_sm90_fwd_row_scales(fp_softmax_state (&st)[2], const uint8_t *rowbad, int row_in,
                                   float descale_v, float (&fac)[2], float (&lse)[2])
{
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        st[r].l = fp_quad_sum(st[r].l);
        fac[r] =
            rowbad[row_in + 8 * r] ? NAN : fp_cuda_out_scale(&st[r]) * (FP8 ? descale_v : 1.0f);
        lse[r] = fp_cuda_lse_exp2(&st[r]);
    }
}

/* The consumers' step on S of the key block from j0 (this thread's rows i_lo, i_lo + 8; t its
 * lane in the quad): softcap / ALiBi (transform), the mask outside the fully visible keys
 * full_lo .. full_hi, row maxima, the online-softmax update of st; S becomes the unrounded P and
 * l grows by this thread's part of the row sums (sc: the scale to log2 units, 1 after the
 * transform). alpha: the rows' rescale factors; returns whether O must be rescaled (always,
 * unless LAZY). */
template <int BN, bool LAZY, bool TANH_FMA>
FP_DEV bool fp_sm90_fwd_softmax(float (&s)[BN / 2], int j0, float (&alpha)[2],
                                fp_softmax_state (&st)[2], bool transform, const fp_sm90_xform &xf,
                                const fp_mask32 &mk, float sc, int i_lo, int t, int full_lo,
                                int full_hi)
{
    if (transform)
        fp_sm90_transform<BN, TANH_FMA>(s, xf, i_lo, j0, t);
    if (!(j0 >= full_lo && j0 + BN <= full_hi))
        fp_sm90_mask<BN>(s, mk, i_lo, j0, t);
    float mxs[2];
    bool grow = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
            mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
        mxs[r] = fp_quad_max(mx) * sc;
        grow |= mxs[r] > st[r].m + FP_RESCALE_SLACK;
    }
    const bool rescale = !LAZY || __any_sync(0xffffffffu, grow);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        alpha[r] = rescale ? fp_softmax_update_exp2(&st[r], mxs[r]) : 1.0f;
        const float mu = fp_softmax_exp_base(&st[r]);
        float l = 0.0f;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float &x = s[4 * j + 2 * r + e];
                x = fp_exp2(fmaf(x, sc, -mu));
                l += x;
            }
        st[r].l += l;
    }
    return rescale;
}

/* The consumers' wait for the P V operand of their tile's key block it (the ring's block kv + it;
 * the tile's key blocks run from nb_end - 1 down): V^T made by the V preparers (fp8), V scrubbed
 * by them (f16 / bf16 edge blocks: outside the fully visible keys full_lo .. full_hi), or V as
 * TMA wrote it. In edge blocks, the rows of warpgroup w (from m0 + 64 w) that see a key the guard
 * flagged in vmask are marked in rowbad (one thread per row, wtid < 64): they end with O = NaN.
 * Not __forceinline__, and the kernel's values by reference: the compiler simplifies it alone
 * and then inlines it, as it did the kernel's lambda that this replaces, which keeps the
 * kernel's machine code (a forced inline changed it). */
template <int BN>
static __device__ bool fp_sm90_fwd_block_full(int j0, const int &full_lo, const int &full_hi)
{
    return j0 >= full_lo && j0 + BN <= full_hi;
}

template <typename TI, typename CFG>
static __device__ void
fp_sm90_fwd_wait_pv(int it, const unsigned &kv, const int &nb_end, const int &full_lo,
                    const int &full_hi, const fp_sm90f_bars<CFG::ST, sizeof(TI) == 1> &bar,
                    uint32_t &pv_bits, const uint32_t (*vmask)[(CFG::BN + 31) / 32],
                    uint8_t *rowbad, const fp_mask32 &mk, const int &m0, const int &w,
                    const int &wtid)
{
    typedef fp_sm90f_dims<TI, CFG> X;
    constexpr int BN = CFG::BN;
    const int stage = bar.stage(kv + it), j0 = (nb_end - 1 - it) * BN;
    const bool edge = !fp_sm90_fwd_block_full<BN>(j0, full_lo, full_hi);
    if (X::FP8 || edge)
        fp_mbar_wait(bar.pv_ready(stage), bar.pv_phase(pv_bits, stage));
    else
        bar.wait_v(kv + it);
    if (!edge)
        return;
    const uint32_t *vm = vmask[stage];
    uint32_t any = 0;
#pragma unroll
    for (int i = 0; i < X::VM_WORDS; ++i)
        any |= vm[i];
    if (wtid < 64 && any) {
        const fp_mask_row mr = fp_mask32_row(mk, m0 + 64 * w + wtid, j0);
        bool bad = false;
        for (int c = max(mr.lo, 0); c < min(mr.hi, BN); ++c)
            bad |= ((vm[c >> 5] >> (c & 31)) & 1u) != 0;
        if (bad)
            rowbad[64 * w + wtid] = 1;
    }
}

/* One work item of the forward, a tile: the query block, head, batch and KV split of tile
 * number `tile`, and the key blocks it visits. The kernel of one block per tile takes them from
 * its block coordinates (query blocks, heads, batch x splits); the persistent kernel numbers
 * them in chunks of prm.chunk (head, batch x split) pairs, heads fastest, and within a chunk
 * query blocks slowest, so that the tiles of one query block of every pair of the chunk come
 * together (with chunk = 1: query blocks fastest, then heads, then batch x splits, the order of
 * the per-tile grid). Query blocks run from the last to the first when the plan asks
 * heavy-first: a chunk's costliest tiles are claimed first and its cheapest last. live: the query
 * block starts inside its sequence (varlen's shorter sequences have fewer); n: its key blocks,
 * nb_end - 1 down to nb_end - n (0 when not live); full_lo .. full_hi: the keys every row of it
 * sees whole (the others are its edge blocks). */
struct fp_sm90f_tile {
    fp_cuda_seq seq;
    int h, b, split, m0;
    int nb_end, n, full_lo, full_hi;
    bool live;
};

template <int BN, bool PERSIST>
FP_DEV fp_sm90f_tile fp_sm90f_tile_of(const fp_sm90_fwd_params &prm, int tile)
{
    const fp_sm80_args &a = prm.a;
    fp_sm90f_tile w;
    int qx, z; /* the tile's block coordinates on a grid of one block per tile */
    if constexpr (PERSIST) {
        const int per = prm.chunk * prm.q_blocks, first = tile / per * prm.chunk;
        const int pairs = min(prm.chunk, a.heads * a.batch * a.splits - first);
        const int r = tile % per, pair = first + r % pairs;
        qx = r / pairs;
        w.h = pair % a.heads;
        z = pair / a.heads;
    } else {
        qx = blockIdx.x;
        w.h = blockIdx.y;
        z = blockIdx.z;
    }
    const int qblk = a.reverse ? prm.q_blocks - 1 - qx : qx;
    w.b = z / a.splits;
    w.split = z % a.splits;
    w.seq = fp_cuda_seq_of(a, w.b);
    const int nq = w.seq.nq, nk = w.seq.nk;
    w.m0 = qblk * FP_SM90_BM;
    w.live = w.m0 < nq;
    w.n = 0;
    w.nb_end = 0;
    w.full_lo = w.full_hi = 0;
    if (!w.live)
        return w;
    const int m1 = min(w.m0 + FP_SM90_BM, nq);
    int nb_begin, nb_end;
    fp_geom_key_blocks(w.m0, m1, nq, nk, a.left, a.right, BN, &nb_begin, &nb_end);
    if (a.splits > 1) {
        const int per = (int)(a.keys_per_split / BN);
        nb_begin = max(nb_begin, w.split * per);
        nb_end = min(nb_end, (w.split + 1) * per);
    }
    w.nb_end = nb_end;
    w.n = max(nb_end - nb_begin, 0);
    int64_t lo, hi;
    fp_mask_full_range(w.m0, m1, nq, nk, a.left, a.right, &lo, &hi);
    w.full_lo = (int)lo;
    w.full_hi = (int)max(hi, (int64_t)0);
    return w;
}

/* The persistent kernel's walk over its tiles, the same sequence for the three roles: the
 * producer's thread 0 picks each next tile (the first: blockIdx.x; then blockIdx.x + gridDim.x
 * steps, or with prm.counter the next unclaimed one, in the order of the numbering, claimed when
 * the producer is ready to load it, which balances tiles of unequal cost) and posts it in a ring
 * of two slots in shared memory; the consumers and the V preparers read the k-th one from slot
 * k % 2. full: the slot was written (1 arrival); empty: its readers have read it
 * (FP_SM90_CONSUMER_THREADS + FP_SM90_PREPARERS arrivals). A tile number >= prm.tiles ends the
 * walk. */
struct fp_sm90f_walk {
    uint64_t *bars; /* full 0, full 1, empty 0, empty 1 */
    int *slot;      /* 2 tile numbers */
    enum { READERS = FP_SM90_CONSUMER_THREADS + FP_SM90_PREPARERS };
    __device__ __forceinline__ void init() const
    {
        for (int i = 0; i < 2; ++i) {
            fp_mbar_init(fp_smem_addr(bars + i), 1);
            fp_mbar_init(fp_smem_addr(bars + 2 + i), READERS);
        }
    }
    /* the producer's thread 0: the k-th tile, after the (k - 1)-th, `last` */
    __device__ __forceinline__ int post(const fp_sm90_fwd_params &prm, int k, int last) const
    {
        const int tile = k == 0        ? (int)blockIdx.x
                         : prm.counter ? atomicAdd(prm.counter, 1) + (int)gridDim.x
                                       : last + (int)gridDim.x;
        const int i = k & 1;
        if (k >= 2)
            fp_mbar_wait(fp_smem_addr(bars + 2 + i), ((k >> 1) - 1) & 1);
        slot[i] = tile;
        fp_mbar_arrive(fp_smem_addr(bars + i));
        return tile;
    }
    /* a reader: the k-th tile */
    __device__ __forceinline__ int read(int k) const
    {
        const int i = k & 1;
        fp_mbar_wait(fp_smem_addr(bars + i), (k >> 1) & 1);
        const int tile = *(volatile int *)&slot[i];
        fp_mbar_arrive(fp_smem_addr(bars + 2 + i));
        return tile;
    }
};

// q, o: (B, Nq, H, D); k, v: (B, Nk, Hkv, D); lse: (B, H, Nq).
// PERSIST: a grid of at most prm.tiles blocks, each running the tiles of its walk
// (fp_sm90f_walk), its mbarrier rings and phases running on from tile to tile; else one block
// per tile on the grid (q blocks, H, B * splits).
// TI: the inputs' type (f16, bf16, or e4m3 as uint8_t); TO: o's (f16 or bf16)
template <typename TI, typename TO, typename CFG, bool PERSIST>
__global__ void __launch_bounds__(FP_SM90_THREADS, 1)
    fp_sm90_fwd_kernel(const __grid_constant__ fp_sm90_fwd_params prm)
{
#if FP_SM90_DEVICE
    constexpr int BM = FP_SM90_BM, DK = CFG::DK, BN = CFG::BN, ST = CFG::ST;
    constexpr bool LAZY = CFG::LAZY;
    typedef fp_sm90f_dims<TI, CFG> X;
    constexpr int EB = X::EB, PK = X::PK, VM_WORDS = X::VM_WORDS;
    constexpr bool FP8 = X::FP8;
    constexpr uint32_t KV_BYTES = X::KV_BYTES, VT_BYTES = X::VT_BYTES;
    constexpr int QTILES = CFG::q_tiles(EB, PERSIST);
    static_assert(!FP8 || BN % 32 == 0, "fp8 tiles: whole wgmma K steps of keys");
    /* O is staged in the Q tile (f16 / bf16); fp8's Q tile is too small for it: O is stored
     * from registers, and the Q tile is free once the last Q K^T has landed */
    constexpr bool STAGE_O = !FP8;
    const fp_sm80_args &a = prm.a;

    extern __shared__ unsigned char fp_smem_raw[];
    const uint32_t raw = fp_smem_addr(fp_smem_raw);
    const uint32_t sq = (raw + 1023u) & ~1023u;
    unsigned char *const gq = fp_smem_raw + (sq - raw); /* generic pointer to the Q tiles */
    const uint32_t sk = sq + QTILES * X::Q_BYTES, sv = sk + ST * KV_BYTES;
    const uint32_t svt = sv + ST * KV_BYTES;
    const uint32_t bars = svt + ST * VT_BYTES;
    const fp_sm90f_bars<ST, FP8> bar{bars};
    /* The masked-key guard's flags: the keys of a stage's edge block whose V row held a
     * non-finite element (up to 128 keys, bit k of word k / 32) */
    __shared__ uint32_t vmask[ST][VM_WORDS];

    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127;
    /* The tile of a block of the per-tile grid, found before setmaxnreg leaves the producer
     * warpgroup too few registers for its geometry; the persistent kernel's roles find theirs
     * in their walk: the k-th tile number (next_tile: the producer's thread 0 posts it, the
     * others read it; past the last one, a number >= prm.tiles) and its tile (tile_at). */
    fp_sm90f_tile only{};
    if constexpr (!PERSIST) {
        only = fp_sm90f_tile_of<BN, false>(prm, 0);
        if (!only.live)
            return;
    }
    __shared__ uint64_t walk_bars[4];
    __shared__ int walk_slot[2];
    const fp_sm90f_walk walk{walk_bars, walk_slot};
    const int tiles = PERSIST ? prm.tiles : 1;
    auto next_tile = [&](int k, int last, bool post) {
        if constexpr (PERSIST)
            return post ? walk.post(prm, k, last) : walk.read(k);
        else
            return k;
    };
    auto tile_at = [&](int tile) {
        if constexpr (PERSIST)
            return fp_sm90f_tile_of<BN, true>(prm, tile);
        else
            return only;
    };

    if (tid == 0) {
        for (int i = 0; i < QTILES; ++i) {
            fp_mbar_init(bar.q_full(i), 1);
            fp_mbar_init(bar.q_empty(i), FP_SM90_CONSUMER_THREADS);
        }
        for (int s = 0; s < ST; ++s) {
            fp_mbar_init(bar.k_full(s), 1);
            fp_mbar_init(bar.v_full(s), 1);
            fp_mbar_init(bar.k_empty(s), FP_SM90_CONSUMER_THREADS);
            fp_mbar_init(bar.v_empty(s),
                         FP8 ? FP_SM90_PREPARERS : FP_SM90_CONSUMER_THREADS + FP_SM90_PREPARERS);
            fp_mbar_init(bar.pv_ready(s), FP_SM90_PREPARERS);
            if (FP8)
                fp_mbar_init(bar.vt_empty(s), FP_SM90_CONSUMER_THREADS);
        }
        if (PERSIST)
            walk.init();
        fp_mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {
        /* ---- producer warpgroup: thread 0 issues every TMA load; warps 1 .. 3 (the V
         * preparers) make V^T (fp8) and run the masked-key guard's scrub ---- */
        if constexpr (X::PRODUCER_REGS == 40)
            fp_setmaxnreg_dec<40>();
        else
            fp_setmaxnreg_dec<24>();
        /* kv: the key blocks of the block's earlier tiles (where the stage ring stands); qc:
         * its earlier tiles that loaded Q */
        if (wtid >= 32) {
            uint32_t pv_bits = 0;
            unsigned kv = 0;
            for (int k = 0, tile; (tile = next_tile(k, 0, false)) < tiles; ++k) {
                const fp_sm90f_tile tl = tile_at(tile);
                if (tl.n == 0)
                    continue;
                fp_sm90_fwd_prepare_v<TI, CFG>(bar, gq + (sv - sq), sv, svt, vmask, tl.full_lo,
                                               tl.full_hi, tl.nb_end, tl.n, kv, pv_bits, wtid - 32);
                kv += tl.n;
            }
        } else if (wtid == 0) {
            fp_tma_prefetch_desc(&prm.tq);
            fp_tma_prefetch_desc(&prm.tk);
            fp_tma_prefetch_desc(&prm.tv);
            unsigned kv = 0, qc = 0;
            for (int k = 0, tile = 0; (tile = next_tile(k, tile, true)) < tiles; ++k) {
                const fp_sm90f_tile tl = tile_at(tile);
                if (tl.n == 0)
                    continue;
                fp_sm90_fwd_load<TI, CFG, QTILES>(prm, bar, sq, sk, sv, a.cu_q ? 0 : tl.b, tl.h,
                                                  tl.h / a.group, (int)tl.seq.q_start + tl.m0,
                                                  (int)tl.seq.k_start, tl.nb_end, tl.n, kv, qc);
                kv += tl.n;
                ++qc;
            }
        }
    } else {
        /* ---- consumers: warpgroup w owns rows 64 w .. 64 w + 63 of each query block ---- */
        if constexpr (X::PRODUCER_REGS == 40)
            fp_setmaxnreg_inc<232>();
        else
            fp_setmaxnreg_inc<240>();
        const int w = wg - 1, warp = wtid >> 5, lane = tid & 31;
        const int g = lane >> 2, t = lane & 3;
        const int row_in = 64 * w + 16 * warp + g; /* this thread's rows: row_in, row_in + 8 */

        /* Ping-pong: the two warpgroups take turns issuing their matrix products; each turn
         * ends by opening the other's, so one warpgroup's softmax runs while the other's
         * products occupy the tensor cores. Turn barriers 3 + w (256 threads: the owner syncs,
         * the other arrives). Warpgroup 1's last turn of a tile opens warpgroup 0's first turn
         * of the block's next tile (more: there is one), so that warpgroup 0's first product
         * there runs under warpgroup 1's finalize and store (HANDOFF: in the persistent kernel
         * where the next tile's Q has a Q tile of its own, not the one that O is staged in);
         * `opened` says it did. Its first
         * tile's first turn warpgroup 1 opens at that tile's start, and a tile without products
         * takes up an opened turn (warpgroup 0 syncs), so every barrier sees as many arrivals
         * as syncs. */
        auto turn_begin = [&]() { fp_named_bar_sync(3 + w, 256); };
        auto turn_end = [&](bool last, bool more) {
            if (!(last && w == 1 && !more))
                fp_named_bar_arrive(3 + (1 - w), 256);
        };
        constexpr bool HANDOFF = PERSIST && QTILES > 1;
        bool opened = false;
        auto close_turn = [&]() {
            if (opened && w == 0)
                fp_named_bar_sync(3, 256);
            opened = false;
        };

        __shared__ uint8_t rowbad[FP_SM90_BM];
        unsigned kv = 0, qc = 0; /* as the producer's */
        uint32_t pv_bits = 0;
        int tile = next_tile(0, 0, false), next = 0;
        for (int k = 0; tile < tiles; ++k, tile = next) {
            /* the block's next tile number, read once from the walk: at the tile's last turn,
             * else at its end */
            bool have_next = false;
            auto read_next = [&]() {
                if constexpr (!PERSIST) {
                    next = tiles; /* the one tile */
                } else if (!have_next) {
                    next = next_tile(k + 1, 0, false);
                    have_next = true;
                }
                return next;
            };
            const fp_sm90f_tile tl = tile_at(tile);
            if (!tl.live) {
                close_turn();
                read_next();
                continue;
            }
            const int h = tl.h, b = tl.b, split = tl.split, m0 = tl.m0;
            const fp_cuda_seq &seq = tl.seq;
            const int nq = seq.nq, nk = seq.nk, nb_end = tl.nb_end, n = tl.n;
            const int full_lo = tl.full_lo, full_hi = tl.full_hi;
            const unsigned qt = qc % QTILES;                             /* this tile's Q tile */
            const uint32_t q_rows = sq + qt * X::Q_BYTES + 64 * w * 128; /* ours, of panel 0 */
            unsigned char *const gqt = gq + qt * X::Q_BYTES;
            const int i_lo = m0 + row_in;
            const float sc = a.transform ? 1.0f : a.scale_log2;
            fp_sm90_xform xf;
            xf.scale_log2 = a.scale_log2;
            xf.cap_in = a.softcap > 0.0f ? 2.0f * FP_LOG2E * a.scale / a.softcap : 0.0f;
            xf.cap_out = a.softcap > 0.0f ? a.softcap * FP_LOG2E : 0.0f;
            xf.slope_log2 = a.alibi ? a.alibi[h] * FP_LOG2E : 0.0f;
            xf.shift = nk - nq;
            const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);

            float o[DK / 2];
#pragma unroll
            for (int i = 0; i < DK / 2; ++i)
                o[i] = 0.0f;
            fp_softmax_state st[2];
            fp_softmax_init(&st[0]);
            fp_softmax_init(&st[1]);

            if (PERSIST && k > 0) /* the warpgroup has read the last tile's marks */
                fp_named_bar_sync(1 + w, 128);
            if (wtid < 64)
                rowbad[64 * w + wtid] = 0;
            auto wait_pv = [&](int it_) {
                fp_sm90_fwd_wait_pv<TI, CFG>(it_, kv, nb_end, full_lo, full_hi, bar, pv_bits, vmask,
                                             rowbad, mk, m0, w, wtid);
            };

            if (n > 0) {
                if (w == 1 && !opened)
                    fp_named_bar_arrive(3, 256);
                fp_mbar_wait(bar.q_full(qt), (qc / QTILES) & 1);
                float s[BN / 2];
                uint32_t pa[BN / PK][4];
                float alpha[2];
                turn_begin();
                bar.wait_k(kv);
                fp_sm90_fwd_qk<TI, CFG>(s, q_rows, sk, bar.stage(kv));
                turn_end(false, true);
                fp_wgmma_wait<0>();
                fp_wgmma_fence_regs(s);
                fp_mbar_arrive(bar.k_empty(bar.stage(kv)));
                if (!STAGE_O && n == 1)
                    fp_mbar_arrive(bar.q_empty(qt));
                fp_sm90_fwd_softmax<BN, LAZY, CFG::TANH_FMA>(s, (nb_end - 1) * BN, alpha, st,
                                                             a.transform, xf, mk, sc, i_lo, t,
                                                             full_lo, full_hi);
                fp_sm90_fwd_pack_p<TI, CFG>(pa, s);
                for (int it = 1; it < n; ++it) {
                    const int prev = it - 1;
                    const unsigned cs = bar.stage(kv + it), ps = bar.stage(kv + prev);
                    turn_begin();
                    bar.wait_k(kv + it);
                    fp_sm90_fwd_qk<TI, CFG>(s, q_rows, sk, cs);
                    wait_pv(prev);
                    fp_sm90_fwd_pv<TI, CFG>(o, pa, sv, svt, ps);
                    turn_end(false, true);
                    fp_wgmma_wait<1>(); /* S (it) has landed; P V (it - 1) may still run */
                    fp_wgmma_fence_regs(s);
                    fp_mbar_arrive(bar.k_empty(cs));
                    if (!STAGE_O && it == n - 1) /* the last Q K^T has landed */
                        fp_mbar_arrive(bar.q_empty(qt));
                    const bool rescale = fp_sm90_fwd_softmax<BN, LAZY, CFG::TANH_FMA>(
                        s, (nb_end - 1 - it) * BN, alpha, st, a.transform, xf, mk, sc, i_lo, t,
                        full_lo, full_hi);
                    fp_wgmma_wait<0>();
                    fp_wgmma_fence_regs(o);
                    fp_fence_u32(pa);
                    fp_mbar_arrive(bar.pv_empty(ps));
                    if (rescale)
                        fp_sm90_fwd_rescale_o<DK>(o, alpha);
                    fp_sm90_fwd_pack_p<TI, CFG>(pa, s);
                }
                const int last = n - 1;
                const unsigned ls = bar.stage(kv + last);
                opened = HANDOFF && prm.handoff && read_next() < tiles;
                turn_begin();
                wait_pv(last);
                fp_sm90_fwd_pv<TI, CFG>(o, pa, sv, svt, ls);
                turn_end(true, opened);
                fp_wgmma_wait<0>();
                fp_wgmma_fence_regs(o);
                fp_mbar_arrive(bar.pv_empty(ls));
            }

            /* Finalize: O = acc / l, LSE = m + log l (natural log); rows that saw nothing: 0,
             * -inf; rows that saw a non-finite V element: O NaN (the guard). */
            fp_named_bar_sync(1 + w, 128); /* the warpgroup's marks are made */
            float fac[2], lse[2];
            fp_sm90_fwd_row_scales<FP8>(st, rowbad, row_in, prm.descale_v, fac, lse);
            const int r0 = m0 + 64 * w, nrows = min(64, nq - r0), nch = a.d / 8;
            if (a.splits > 1) {
                const int64_t rows =
                    ((int64_t)split * a.batch + b) * a.heads + h; /* (split, b, h) */
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int i = i_lo + 8 * r;
                    if (i >= nq)
                        continue;
                    float *dst = a.o_part + (rows * a.nq + i) * a.d;
#pragma unroll
                    for (int j = 0; j < DK / 8; ++j)
                        if (8 * j < a.d)
                            *reinterpret_cast<float2 *>(dst + 8 * j + 2 * t) = make_float2(
                                o[4 * j + 2 * r] * fac[r], o[4 * j + 2 * r + 1] * fac[r]);
                    if (t == 0)
                        a.lse_part[rows * a.nq + i] = lse[r];
                }
            } else {
                TO *og = reinterpret_cast<TO *>(const_cast<void *>(a.o.ptr)) +
                         fp_cuda_row(a.o, b, seq.q_start + r0, h);
                constexpr int CH = DK / 8;
                if (!STAGE_O && n > 0) {
                    /* The Q tile (fp8) is too small to stage O: 4-byte stores from registers,
                     * a quad's 16 bytes of a row per column group. */
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int row = 16 * warp + g + 8 * r; /* within the warpgroup's 64 */
                        if (row >= nrows)
                            continue;
#pragma unroll
                        for (int j = 0; j < DK / 8; ++j)
                            if (8 * j < a.d)
                                *reinterpret_cast<uint32_t *>(og + (int64_t)row * a.o.ss + 8 * j +
                                                              2 * t) =
                                    fp_pack2<TO>(o[4 * j + 2 * r] * fac[r],
                                                 o[4 * j + 2 * r + 1] * fac[r]);
                    }
                } else if (n > 0) {
                    /* Stage O in this warpgroup's rows of the Q tile (same swizzled panels),
                     * then 16-byte rows to global memory. */
#pragma unroll
                    for (int j = 0; j < DK / 8; ++j)
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            const int row = 16 * warp + g + 8 * r; /* within the warpgroup's 64 */
                            unsigned char *dst = gqt + (j / 8) * BM * 128 + (64 * w + row) * 128 +
                                                 (((j % 8) ^ (row & 7)) << 4) + 4 * t;
                            *reinterpret_cast<uint32_t *>(dst) = fp_pack2<TO>(
                                o[4 * j + 2 * r] * fac[r], o[4 * j + 2 * r + 1] * fac[r]);
                        }
                    fp_named_bar_sync(1 + w, 128);
#pragma unroll 4
                    for (int idx = wtid; idx < 64 * CH; idx += 128) {
                        const int row = idx / CH, c = idx % CH;
                        if (row < nrows && c < nch)
                            *reinterpret_cast<uint4 *>(og + (int64_t)row * a.o.ss + c * 8) =
                                *reinterpret_cast<const uint4 *>(gqt + (c / 8) * BM * 128 +
                                                                 (64 * w + row) * 128 +
                                                                 (((c % 8) ^ (row & 7)) << 4));
                    }
                } else {
                    /* No key visible (and no Q loaded): zeros straight to global memory. */
                    for (int idx = wtid; idx < 64 * CH; idx += 128) {
                        const int row = idx / CH, c = idx % CH;
                        if (row < nrows && c < nch)
                            *reinterpret_cast<uint4 *>(og + (int64_t)row * a.o.ss + c * 8) =
                                make_uint4(0u, 0u, 0u, 0u);
                    }
                }
                if (a.lse && t == 0) {
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int i = i_lo + 8 * r;
                        if (i < nq)
                            a.lse[fp_cuda_lse_off(a, b, seq.q_start + i, h)] = lse[r];
                    }
                }
            }
            if (n > 0) {
                if (STAGE_O) { /* done with the Q tile: the producer may load the next one */
                    fp_fence_proxy_async_smem();
                    fp_mbar_arrive(bar.q_empty(qt));
                }
                kv += n;
                ++qc;
            } else {
                close_turn();
            }
            read_next();
        }
    }
#endif
}

/* ---- host ---------------------------------------------------------------------------------- */

/* Launches one of the forward kernels on `grid` */
template <typename TI, typename TO, typename CFG, bool PERSIST>
static cudaError_t fp_sm90_fwd_start(dim3 grid, cudaStream_t stream, const fp_sm90_fwd_params &prm)
{
    constexpr size_t smem = CFG::smem(sizeof(TI), PERSIST);
    static_assert(smem + 512 <= 227 * 1024, "one block per SM, with the kernel's static arrays");
    void (*kernel)(const fp_sm90_fwd_params) = fp_sm90_fwd_kernel<TI, TO, CFG, PERSIST>;
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return e;
    }
    kernel<<<grid, FP_SM90_THREADS, smem, stream>>>(prm);
    return cudaGetLastError();
}

template <typename TI, typename TO, typename CFG>
static flashport_status fp_sm90_launch(const fp_cuda_ctx *ctx, const fp_problem *p,
                                       fp_sm90_fwd_params &prm, const char *why_path, void *ws,
                                       size_t *query)
{
    constexpr int DK = CFG::DK, BN = CFG::BN;
    fp_sm80_args &a = prm.a;
    const cudaStream_t stream = ctx->stream;
    const fp_plan plan = fp_cuda_grid_plan(p, ctx->sm_count, FP_SM90_BM, BN); /* a block per SM */
    const bool empty = plan.num_q_blocks == 0 || p->batch == 0 || p->heads == 0;
    /* split-KV partials, as the sm80 path lays them out (its combine merges them) */
    const size_t rows = (size_t)plan.num_splits * p->batch * p->heads * a.nq;
    /* the kernel's work items (fp_sm90f_tile), numbered in int */
    const int64_t pairs = p->heads * p->batch * plan.num_splits;
    const int64_t tiles = plan.num_q_blocks * pairs;
    if (tiles > INT_MAX)
        return fp_cuda_refuse(FLASHPORT_ERR_BAD_SIZE,
                              "sm90 forward: %lld tiles of 128 queries exceed the kernel's int "
                              "indices",
                              (long long)tiles);
    /* the persistent kernel is built for f16 / bf16 inputs */
    fp_sm90_fwd_grid grid = {0, false, 1};
    if (sizeof(TI) == 2 && !empty)
        grid = fp_sm90_fwd_grid_of(ctx, p, tiles, pairs, (p->seqlen_k + BN - 1) / BN, sizeof(TI));
    /* scratch: the split-KV partials, then the dynamic walk's counter */
    const size_t part_bytes = plan.num_splits <= 1 ? 0 : rows * (size_t)(a.d + 1) * sizeof(float);
    if (query) {
        *query = empty ? 0 : part_bytes + (grid.dynamic ? sizeof(int) : 0);
        return FLASHPORT_OK;
    }
    if (empty)
        return FLASHPORT_OK;
    a.splits = plan.num_splits;
    a.keys_per_split = plan.keys_per_split;
    a.reverse = plan.heavy_first;

    if (a.splits > 1) {
        a.o_part = (float *)ws;
        a.lse_part = a.o_part + rows * a.d;
    }
    prm.q_blocks = (int)plan.num_q_blocks;
    prm.tiles = (int)tiles;
    prm.chunk = grid.chunk;
    prm.handoff = fp_sm90_env_count("FLASHPORT_CUDA_SM90_FWD_HANDOFF") != 0;
    prm.counter = grid.dynamic ? (int *)((char *)ws + part_bytes) : NULL;
    const int64_t persist = grid.blocks;
    cudaError_t e = cudaSuccess;
    if constexpr (sizeof(TI) == 2) {
        if (persist > 0 && prm.counter)
            e = cudaMemsetAsync(prm.counter, 0, sizeof(int), stream);
        if (persist > 0 && e == cudaSuccess)
            e = fp_sm90_fwd_start<TI, TO, CFG, true>(dim3((unsigned)persist), stream, prm);
    }
    if (persist == 0)
        e = fp_sm90_fwd_start<TI, TO, CFG, false>(
            dim3((unsigned)plan.num_q_blocks, (unsigned)p->heads, (unsigned)(p->batch * a.splits)),
            stream, prm);
    char walk[64] = "";
    if (persist)
        snprintf(walk, sizeof walk, "persistent (%s walk, chunks of %d pairs), ",
                 grid.dynamic ? "claimed" : "static", grid.chunk);
    fp_cuda_log("forward: sm90 D%d %skernel (TMA + wgmma, BM %d, BN %d, %d stages, 2 consumer "
                "warpgroups, ping-pong%s) for D=%lld, %lld tiles, %s%lld blocks, %d split(s); %s",
                DK, sizeof(TI) == 1 ? "fp8 e4m3 (V^T in shared memory) " : "", FP_SM90_BM, BN,
                CFG::ST, CFG::LAZY ? ", lazy rescale" : "", (long long)p->head_dim,
                (long long)tiles, walk, (long long)(persist ? persist : tiles), a.splits, why_path);
    if (e == cudaSuccess && a.splits > 1)
        e = fp_cuda_fwd_combine(p, &a, stream);
    return e == cudaSuccess ? FLASHPORT_OK
                            : fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "sm90 forward kernel launch");
}

/* query: the split-KV bytes of this configuration, whether or not TMA can read the tensors
 * (cuda_backend.c sizes the scratch for either path), and *declined as a run would set it. */
template <typename TI, typename TO, typename CFG>
static flashport_status fp_sm90_run(const fp_cuda_ctx *ctx, const fp_problem *p, const char *why,
                                    const char **declined, void *ws, size_t *query)
{
    fp_sm90_fwd_params prm;
    if (query) {
        fp_sm80_fill_args(p, &prm.a);
        flashport_status st = fp_sm90_launch<TI, TO, CFG>(ctx, p, prm, why, NULL, query);
        if (st != FLASHPORT_OK)
            return st;
    }
    const int64_t bq = p->varlen ? 1 : p->batch;
    const int64_t tq = p->varlen ? p->total_q : p->seqlen_q;
    const int64_t tk = p->varlen ? p->total_k : p->seqlen_k;
    const int bn = CFG::BN;
    if (!fp_sm90_tmap(ctx, &prm.tq, p->q, p->dtype, p->head_dim, tq, p->heads, bq, FP_SM90_BM,
                      declined) ||
        !fp_sm90_tmap(ctx, &prm.tk, p->k, p->dtype, p->head_dim, tk, p->kv_heads, bq, bn,
                      declined) ||
        !fp_sm90_tmap(ctx, &prm.tv, p->v, p->dtype, p->head_dim, tk, p->kv_heads, bq, bn, declined))
        return FLASHPORT_OK;
    if (query)
        return FLASHPORT_OK;
    fp_sm80_fill_args(p, &prm.a);
    prm.descale_v = 1.0f;
    if (sizeof(TI) == 1) { /* fp8: S = scale descale_q descale_k Q K^T, O = descale_v P V / l */
        const float dqk = p->descale_q * p->descale_k;
        prm.a.scale *= dqk;
        prm.a.scale_log2 *= dqk;
        prm.descale_v = p->descale_v;
    }
    return fp_sm90_launch<TI, TO, CFG>(ctx, p, prm, why, ws, NULL);
}

/* The launch of a head-dim class's kernel: the configuration fp_sm90_fwd_cfg_of gives it for
 * inputs of TI. */
template <typename TI, typename TO, int DK>
flashport_status fp_sm90_fwd_family<TI, TO, DK>::run(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                     const char *why, const char **declined,
                                                     void *ws, size_t *query)
{
    return fp_sm90_run<TI, TO, typename fp_sm90_fwd_cfg_of<DK, sizeof(TI) == 1>::type>(
        ctx, p, why, declined, ws, query);
}

#endif /* FLASHPORT_BACKENDS_CUDA_SM90_FWD_CUH */
