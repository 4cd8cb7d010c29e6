/*
 * The sm90 backward's configurations (fp_sm90_bwd_cfg, one per kernel head dim) and the
 * declaration of its kernel families, which is all the launcher (sm90/bwd.cu) sees of the
 * kernel: sm90/bwd.cuh and sm90/bwd256.cuh define them, and one small file per head dim
 * instantiates both dtypes (sm90/inst/bwd_d64.cu, bwd_d128.cu, bwd_d256.cu;
 * backends/cuda/CMakeLists.txt compiles them with their launcher).
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM90_BWD_CONFIG_CUH
#define FLASHPORT_BACKENDS_CUDA_SM90_BWD_CONFIG_CUH

#include <stddef.h>
#include <stdint.h>

#include "backends/cuda/cuda_internal.h"
#include "core/problem.h"

enum { FP_SM90B_THREADS = 384, FP_SM90B_CONSUMER_THREADS = 256 };

/* The masked-key guard's shared words in the D = 64 / 128 kernel (after its row flags): the count
 * of Q / dO rows flagged so far, ever growing; whether K held a non-finite element; and per
 * consumer warp the count it saw at its last look (no change: the step flagged none). In shared
 * memory, not registers: only the guard's rare paths touch them. */
enum {
    FP_SM90B_GUARD_ROWS = 0,
    FP_SM90B_GUARD_K = 1,
    FP_SM90B_GUARD_SEEN = 2,
    FP_SM90B_GUARD_WORDS = 2 + FP_SM90B_CONSUMER_THREADS / 32
};

/* One configuration: kernel head dim DK, query rows per step BM, keys per block BN (64 per
 * consumer warpgroup), ST stages of Q / dO / LSE2 / Dsum. */
template <int DK_> struct fp_sm90_bwd_cfg {
    static constexpr int DK = DK_, BN = 128, BM = DK_ == 64 ? 128 : 64, ST = 2;
    /* dQ = dS K split between the two warpgroups by rows (BM = 128) or by columns */
    static constexpr bool DQ_BY_ROWS = BM == 128;
    /* dQ tiles in shared memory, for the writer warp's bulk reductions (one at D = 64: two
     * would pass the 227 KiB a block may have) */
    static constexpr int DQB = DK_ == 64 ? 1 : 2;
    static constexpr uint32_t KV_BYTES = BN * DK * 2, Q_BYTES = BM * DK * 2, ROW_BYTES = BM * 4,
                              DS_BYTES = BM * BN * 2, DQ_BYTES = BM * DK * 4;
    static_assert(DK == 64 || DK == 128, "the sm90 backward's head dims");
    static_assert((DQ_BY_ROWS ? DK : DK / 2) == 64, "dQ products are m64n64");
    /* K, V, the stages, two dS buffers, the dQ tiles, the masked-key guard's row flags (K, and
     * Q and dO of each stage) and words, the barriers, and 1024 bytes to align to the swizzle atom
     */
    static constexpr size_t SMEM = 2 * KV_BYTES + ST * (2 * Q_BYTES + 2 * ROW_BYTES) +
                                   2 * DS_BYTES + DQB * DQ_BYTES + BN + ST * 2 * BM +
                                   4 * FP_SM90B_GUARD_WORDS + (1 + 2 * ST + 2 * DQB) * 8 + 1024;
    static_assert(SMEM <= 227 * 1024, "one block per SM");
    static_assert((BN + ST * 2 * BM + 4 * FP_SM90B_GUARD_WORDS) % 8 == 0, "barriers 8-aligned");
};

/* The configuration of head dim 256 (sm90/bwd256.cuh): the two consumer warpgroups share one
 * block of BN = 64 keys, each owning 128 of dK's and dV's columns (256 columns of two f32
 * accumulators would not fit one warpgroup's registers); query blocks of BM = 64 rows; STQ
 * stages of Q and LSE2, STO of dO and Dsum (what 227 KiB hold); P^T and dS^T pass between the
 * warpgroups through shared memory (two buffers each, by step parity); dQ leaves in pieces of
 * 64 x 64 (one buffer per warpgroup). */
struct fp_sm90_bwd256_cfg {
    static constexpr int DK = 256, BN = 64, BM = 64, STQ = 2, STO = 1;
    static constexpr uint32_t KV_BYTES = BN * DK * 2, Q_BYTES = BM * DK * 2, ROW_BYTES = BM * 4,
                              PT_BYTES = BN * BM * 2, PIECE_BYTES = BM * 64 * 4;
    /* K's row flags, Q's of each Q stage, dO's of each dO stage, the guard's words */
    static constexpr uint32_t FLAG_BYTES = BN + STQ * BM + STO * BM + 4 * FP_SM90B_GUARD_WORDS;
    /* kv_full, q_full / q_empty per Q stage, o_full / o_empty per dO stage, dq_full / dq_empty
     * per warpgroup */
    static constexpr int NBARS = 1 + 2 * STQ + 2 * STO + 4;
    static constexpr size_t SMEM = 2 * KV_BYTES + (STQ + STO) * (Q_BYTES + ROW_BYTES) +
                                   4 * PT_BYTES + 2 * PIECE_BYTES + FLAG_BYTES + NBARS * 8 + 1024;
    static_assert(SMEM <= 227 * 1024, "one block per SM");
    static_assert((BN + STQ * BM + STO * BM) % 4 == 0 && FLAG_BYTES % 8 == 0,
                  "guard words 4-aligned, barriers 8-aligned");
};

/* The head dims of the kernel classes: problems of smaller head dims run on the next larger. */
#define FP_SM90_BWD_DK_CLASSES 64, 128, 256

/* The sm90 backward's families: one per head-dim class of FP_SM90_BWD_DK_CLASSES and element
 * type T (__half, __nv_bfloat16). run launches the side passes and the kernel, or with
 * query != NULL sets *query to the workspace bytes; it sets *declined where a tensor map cannot
 * describe an operand (the caller then takes the sm80 path). */
template <typename T, int DK> struct fp_sm90_bwd_family {
    static flashport_status run(const fp_cuda_ctx *ctx, const fp_problem *p, const char *why,
                                const char **declined, void *ws, size_t *query);
};

/* The head-dim-256 kernel's launch (sm90/bwd256.cuh), which fp_sm90_bwd_family<T, 256> runs. */
template <typename T>
flashport_status fp_sm90_bwd256_run(const fp_cuda_ctx *ctx, const fp_problem *p, const char *why,
                                    const char **declined, void *ws, size_t *query);

#endif /* FLASHPORT_BACKENDS_CUDA_SM90_BWD_CONFIG_CUH */
