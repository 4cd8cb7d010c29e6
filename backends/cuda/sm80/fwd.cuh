/*
 * Flash attention forward, sm80 path (mma.sync + ldmatrix + cp.async; runs on sm_80 .. sm_90).
 *
 * Algorithm (FlashAttention-2 forward): one thread block per (query block of BM rows, head,
 * batch [, KV split]). Each warp owns MT x 16 query rows. The Q tile goes to shared memory once
 * and its fragments are re-read from there at every k step: the registers go to the O
 * accumulator (D = 128: 2 x 16 rows x 128 f32 per warp) and to S (D = 64: 2 x 16 rows x 128
 * keys). K and V tiles of BN keys stream through two shared-memory
 * buffers each, interleaved K0 V0 K1 V1 ... as cp.async groups: K(j+2) is issued as soon as
 * S(j) = Q K(j)^T is done and V(j+1) as soon as iteration j starts, so each load has about one
 * and a half iterations to land (D = 256: one buffer each and two blocks per SM, ST below).
 * S accumulates in f32 registers; online softmax runs on it in log2 units with the softmax
 * scale folded into one FMA before exp2 (ex2.approx), rescaling O only when a row's maximum
 * grew by more than 2^8 (LAZY, below); P is rounded to the input dtype and fed to
 * P V from registers. Key blocks outside the window/causal range are never visited; blocks fully
 * inside it skip per-element masking.
 *
 * Masking and online softmax: core/mask.h gives the key-block range of a query block
 * (fp_mask_block_range), the blocks that need no per-element mask (fp_mask_block_full), the
 * per-element rule (fp_mask_visible's inequalities in 32-bit form, fp_mask32) and the softcap /
 * ALiBi transform (fp_score_transform). The running max and rescale factor come from
 * fp_softmax_update_exp2 (core/online_softmax.h), called only for blocks that rescale. The
 * per-element weight mirrors
 * fp_softmax_weight_exp2 (masked scores are -inf and give 0; a row whose max is still -inf uses 0
 * as its max, so no -inf - -inf), the finalize calls fp_cuda_out_scale / fp_cuda_lse_exp2
 * (fp_softmax_out_scale / fp_softmax_lse_exp2 with the hardware's rcp and lg2 approximations),
 * and the split-KV combine calls fp_softmax_merge.
 *
 * Split-KV (decode-like shapes, chosen by core/plan.h): each split writes its normalized partial
 * O (f32) and LSE; fp_sm80_fwd_combine merges them in split order.
 *
 * Kernels: one per schedule (fp_sm80_fwd_two_stage_kernel, fp_sm80_fwd_one_stage_kernel,
 * fp_sm80_fwd_pingpong_kernel), each its key loop inside the shared block (fp_fwd_block: setup,
 * the steps of a key block, finalize); fp_fwd_kernel takes a configuration's by its PP and ST.
 * This header holds the kernels and their launch (fp_sm80_fwd_family, common.cuh); one file per
 * head dim instantiates them (sm80/inst/fwd_d64.cu, ...), the launcher is sm80/fwd.cu.
 *
 * Tiles (BM x BN, warps): D=64 128x128, 4 warps (for long key loops 256x128, 8 warps in the
 * ping-pong schedule: PP below); D=128 128x64, 4 warps; D=256 64x64, 4 warps, one K and one V
 * buffer, two blocks per SM (ST below; other configurations where two do not fit). Other head
 * dims (multiples of 8) run on the next larger kernel with the extra columns zero-filled. The
 * configurations are named in sm80/config.h and chosen by fp_sm80_pick; the alternatives timed
 * against these tile sizes: docs/bench/archive/ (tiles, s5, s7).
 *
 * Differences from the reference: P is rounded to f16/bf16 before P V (as every tensor-core
 * flash kernel does; the row sum uses the unrounded P); exp2 is the hardware approximation.
 * Limits: 255 registers (D = 64 and 128 spill a little), 8 warps per SM, latency bound (more
 * cycles per instruction than FA2's kernel for fewer instructions). Current numbers against FA2
 * and cuDNN: docs/performance.md#cuda-sm80-path-h200.
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM80_FWD_CUH
#define FLASHPORT_BACKENDS_CUDA_SM80_FWD_CUH

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/dispatch.cuh"
#include "backends/cuda/sm80/common.cuh"
#include "backends/cuda/sm80/config.h"

#include "core/plan.h"
#include "core/problem.h"

#include <math.h>
#include <stdlib.h>

/* The configurations (sm80/config.h names them; fp_sm80_pick chooses):
 * At D = 256, ALT 0 (64 x 64, 4 warps, one K and one V buffer: ST = 1; 96 KiB) is for devices that
 * fit two of its blocks on an SM (sm_90: 227 KiB per block); ALT 1 (64 x 64, two buffers each,
 * 160 KiB) for sm_80's 163 KiB, ALT 2 (key blocks of 32, two buffers, 96 KiB) for sm_86/89's 99,
 * where one block per SM would leave ALT 0's loads unhidden (ALT 1 and 2 never timed on such a
 * GPU). At D = 64, ALT 1 is the ping-pong schedule (PP, below), for long key loops.
 * ST (K / V stages): 2 keeps two buffers of each, loaded one and a half iterations ahead (the
 * main loop below); 1 keeps one of each, as FA2's sm80 kernel does: V(j) loads during
 * S(j) = Q K(j)^T, K(j + 1) during the exponentials and P V(j), and the other block on the SM
 * hides the waits.
 * LAZY: see FP_RESCALE_SLACK (sm80/common.cuh). FAST_LOAD: tiles that lie wholly inside the
 * sequence are copied without the per-row bounds test (fp_load_tile's FAST); it pays at D = 128
 * only (at D = 64 ptxas spills more with it). EARLY_V: wait for the V tile (and pass the barrier
 * that frees the K buffer for the prefetch) before the exponentials instead of after them, so that
 * the exp2s and the P V mma instructions share one basic block and ptxas interleaves them; it pays
 * at D = 256 and 128, not at D = 64, whose exp2 block is twice as long per mma and better hidden by
 * the scheduler's other warp. The 99 KiB / 163 KiB configurations keep the late wait (not timed
 * with the early one). Each choice's timings: docs/bench/archive/ (aux, s7). */
template <int DK, int ALT> struct fp_fwd_cfg;
template <> struct fp_fwd_cfg<64, 0> {
    enum { NW = 4, MT = 2, BN = 128, LAZY = 1, FAST_LOAD = 0, EARLY_V = 0, PP = 0, ST = 2 };
};
template <> struct fp_fwd_cfg<64, 1> {
    enum { NW = 8, MT = 2, BN = 128, LAZY = 1, FAST_LOAD = 0, EARLY_V = 0, PP = 1, ST = 2 };
};
template <> struct fp_fwd_cfg<128, 0> {
    enum { NW = 4, MT = 2, BN = 64, LAZY = 1, FAST_LOAD = 1, EARLY_V = 1, PP = 0, ST = 2 };
};
template <> struct fp_fwd_cfg<256, 0> {
    enum { NW = 4, MT = 1, BN = 64, LAZY = 1, FAST_LOAD = 0, EARLY_V = 1, PP = 0, ST = 1 };
};
template <> struct fp_fwd_cfg<256, 1> {
    enum { NW = 4, MT = 1, BN = 64, LAZY = 1, FAST_LOAD = 0, EARLY_V = 0, PP = 0, ST = 2 };
};
template <> struct fp_fwd_cfg<256, 2> {
    enum { NW = 4, MT = 1, BN = 32, LAZY = 1, FAST_LOAD = 0, EARLY_V = 0, PP = 0, ST = 2 };
};

/* PP (ping-pong): 8 warps in two groups of 4, each group 128 query rows (a block of 256) over
 * the same K and V tiles; group 1 runs half a key block behind group 0, so that on each of the
 * SM's four schedulers (warps w and w + 4 share one) one warp issues its mma instructions (P V
 * of the previous key block, then Q K^T of this one) while the other computes its softmax. A
 * block-wide barrier ends each half (fp_pp_bar; the groups reach it at different places); group
 * 0 alone issues the loads, at its mma halves, and waits for them before the next barrier. One
 * block of 8 warps per SM (255 registers), so a block's first and last half and its prologue
 * are not hidden by another block: it pays only where the key loop is long (fp_fwd_pingpong).
 * At D = 128 (key blocks of 64, so that O, S and the rest fit) ptxas spills heavily and it lost
 * everywhere; at D = 256 it gained nothing: only D = 64 has it (docs/bench/archive/, s5).
 */
/* The barrier between two halves, as two one-way named barriers: group grp arrives at barrier
 * 1 + grp and waits at barrier 2 - grp, which the other group arrives at; each waits until the
 * other has arrived, as one block-wide barrier would. Not one bar.sync of all 256 threads: the
 * groups reach it from different instructions, and bar.sync (the aligned form) requires every
 * thread it waits for to execute the same one (compute-sanitizer's synccheck reports the
 * block-wide form as a divergent barrier); here the waiting threads of a generation, one group,
 * always run the same instruction. The unaligned barrier.sync would do too, but made ptxas
 * allocate this kernel's registers differently, with three times the spill instructions. */
FP_DEV void fp_pp_bar(int grp)
{
#ifdef FP_CUDA_EMU
    (void)grp;
    __syncthreads();
#else
    if (grp == 0)
        asm volatile("bar.arrive 1, 256;\n"
                     "bar.sync 2, 256;\n" ::
                         : "memory");
    else
        asm volatile("bar.arrive 2, 256;\n"
                     "bar.sync 1, 256;\n" ::
                         : "memory");
#endif
}

/* The masked-key guard of one edge block (common.cuh; its use in fp_fwd_block): V's tile of
 * BN keys scrubbed and its keys flagged (vflag), a barrier of the whole block (PP: fp_pp_bar),
 * then rowbad[r] = 1 for each row r of the block (BM rows from m0) that sees a flagged key of
 * the block (keys from j0). Not inlined: it runs at a point where the kernel holds its S and O
 * accumulators, and as a call its registers are its own, so the kernel's register allocation on
 * the path that never calls it (blocks that every row sees whole) stays as it was. */
template <typename T, int BN, int DK, int NT, int BM, bool PP>
FP_DEV_NOINLINE void fp_fwd_guard(T *vtile, uint8_t *vflag, uint8_t *rowbad, fp_mask32 mk, int m0,
                                  int j0, int grp)
{
    const int tid = threadIdx.x;
    fp_scrub_tile<BN, DK, NT, T>(vtile, vflag, tid);
    if constexpr (PP)
        fp_pp_bar(grp);
    else
        __syncthreads();
    for (int r = tid; r < BM; r += NT) {
        const fp_mask_row mr = fp_mask32_row(mk, m0 + r, j0);
        bool bad = false;
        for (int c = max(mr.lo, 0); c < min(mr.hi, BN); ++c)
            bad |= vflag[c] != 0;
        if (bad)
            rowbad[r] = 1;
    }
}

/* How many configurations each head dim has (ALT 0 .. n - 1; sm80/config.h names them). */
template <int DK> constexpr int fp_fwd_alts()
{
    return DK == 64 ? 2 : DK == 128 ? 1 : 3;
}

template <int DK, int ALT> constexpr int fp_fwd_bm()
{
    return fp_fwd_cfg<DK, ALT>::NW * fp_fwd_cfg<DK, ALT>::MT * 16;
}

template <int DK, int ALT> constexpr size_t fp_fwd_smem()
{
    return (size_t)(fp_fwd_bm<DK, ALT>() + 2 * fp_fwd_cfg<DK, ALT>::ST * fp_fwd_cfg<DK, ALT>::BN) *
           DK * 2;
}

/* Masks (and for FP_SCORES_TRANSFORM softcaps and ALiBi-shifts, into log2 units) a warp's
 * score tile: MT x 16 rows from row0, NB8 x 8 keys from j0. Masked scores become -inf. The
 * mask-only mode takes the mask per row (fp_mask32_row), so that a score costs two compares
 * against an immediate column and a select, not three compares against its key; the transform
 * mode keeps the per-key test (taking it per row there made ptxas spill 500 bytes at D = 64). */
template <int MODE, int MT, int NB8>
FP_DEV void fp_fwd_scores(float (*s)[NB8][4], const fp_sm80_args &a, const fp_mask32 &mk, int row0,
                          int j0, int nq, int nk, float slope, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const int jb = j0 + 2 * t; /* this thread's first key; its others are jb + 8 j + e */
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = row0 + mt * 16 + g + 8 * r;
            if constexpr (MODE == FP_SCORES_MASK) {
                const fp_mask_row mr = fp_mask32_row(mk, i, jb);
#pragma unroll
                for (int j = 0; j < NB8; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float &x = s[mt][j][2 * r + e];
                        x = fp_mask_row_visible(mr, 8 * j + e) ? x : -INFINITY;
                    }
            } else {
#pragma unroll
                for (int j = 0; j < NB8; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int kj = jb + 8 * j + e;
                        float &x = s[mt][j][2 * r + e];
                        const float v = fp_score_log2(a, x, slope, i, kj, nq, nk);
                        x = fp_mask32_visible(mk, i, kj) ? v : -INFINITY;
                    }
            }
        }
}

/* K or V of key block nb (rows nb * BN .. of g, row stride ss; nk keys in all) into its buffer,
 * (nb - nb_begin) % ST, of the ST buffers at buf0, with NTH threads. */
template <int BN, int DK, int ST, int NTH, bool FAST, typename T>
FP_DEV void fp_fwd_load_kv(T *buf0, const T *g, int64_t ss, int nb, int nb_begin, int nk,
                           int nchunks, int tid)
{
    fp_load_tile<BN, DK, NTH, FAST>(buf0 + ((nb - nb_begin) & (ST - 1)) * BN * DK,
                                    g + (int64_t)nb * BN * ss, ss, nk - nb * BN, nchunks, tid);
}

/* ---- the schedules ---------------------------------------------------------------------------
 * The kernel's steps of a key block nb are lambdas over the block's state (fp_fwd_block):
 * qk(s, nb): S = Q K^T; softmax_max(s, nb, r0, r1): mask / transform for rows r0 .. r1, row
 * maxima, rescale of O; softmax_exp(s): P and the row sums; pack_p(pa, s): P as P V's A
 * fragments; pv(pa, nb): O += P V; around them the loads of K and V and the masked-key guard of V
 * (guard_v, or edge_block and scrub_v). A schedule is the key loop that composes them. */

/* Two K and V buffers (ST = 2): the prologue issued K(nb_begin), V(nb_begin) and K(nb_begin + 1)
 * as three cp.async groups; V(nb + 1) goes out as iteration nb starts and K(nb + 2) once S(nb) is
 * done. EARLY_V: fp_fwd_cfg. Rows r0 .. r1: the block's. s and pa: S (then P) and P's A fragments
 * of the current key block, the kernel's (as locals here they change the kernel's machine code:
 * inlined, this function's arrays come first among the kernel's, and the compiler then orders the
 * loop-carried O and softmax state differently). */
template <int MT, int NB8, bool EARLY_V, class LoadK, class LoadV, class QK, class Max, class Exp,
          class Pack, class PV, class Guard>
FP_DEV void fp_fwd_two_stage_loop(float (&s)[MT][NB8][4], uint32_t (&pa)[NB8 / 2][MT][4],
                                  int nb_begin, int nb_end, int r0, int r1, const LoadK &load_k,
                                  const LoadV &load_v, const QK &qk, const Max &softmax_max,
                                  const Exp &softmax_exp, const Pack &pack_p, const PV &pv,
                                  const Guard &guard_v)
{
    for (int nb = nb_begin; nb < nb_end; ++nb) {
        fp_cp_async_wait<2>(); /* K(nb) has landed */
        __syncthreads();
        if (nb + 1 < nb_end)
            load_v(nb + 1);
        fp_cp_async_commit();
        qk(s, nb);
        /* V(nb) has landed, and every warp is done with K(nb), whose buffer takes K(nb + 2);
         * before the exponentials or after them (EARLY_V) */
        auto wait_v = [&]() {
            fp_cp_async_wait<2>();
            __syncthreads();
            if (nb + 2 < nb_end)
                load_k(nb + 2);
            fp_cp_async_commit();
            guard_v(nb);
        };
        softmax_max(s, nb, r0, r1);
        if constexpr (EARLY_V)
            wait_v();
        softmax_exp(s);
        if constexpr (!EARLY_V)
            wait_v();
        pack_p(pa, s);
        pv(pa, nb);
    }
}

/* One K and one V buffer (ST = 1): the prologue issued K(nb_begin); V(nb) loads during S(nb) and
 * its row maxima, K(nb + 1) during the exponentials and P V(nb); each wait drains every copy in
 * flight. Rows r0 .. r1, s and pa: as in fp_fwd_two_stage_loop. */
template <int MT, int NB8, class LoadK, class LoadV, class QK, class Max, class Exp, class Pack,
          class PV, class Guard>
FP_DEV void fp_fwd_one_stage_loop(float (&s)[MT][NB8][4], uint32_t (&pa)[NB8 / 2][MT][4],
                                  int nb_begin, int nb_end, int r0, int r1, const LoadK &load_k,
                                  const LoadV &load_v, const QK &qk, const Max &softmax_max,
                                  const Exp &softmax_exp, const Pack &pack_p, const PV &pv,
                                  const Guard &guard_v)
{
    for (int nb = nb_begin; nb < nb_end; ++nb) {
        fp_cp_async_wait<0>(); /* K(nb) has landed */
        __syncthreads();       /* and every warp is done with V(nb - 1) */
        load_v(nb);
        fp_cp_async_commit();
        qk(s, nb);
        softmax_max(s, nb, r0, r1);
        fp_cp_async_wait<0>(); /* V(nb) has landed */
        __syncthreads();       /* and every warp is done with K(nb) */
        if (nb + 1 < nb_end)
            load_k(nb + 1);
        fp_cp_async_commit();
        guard_v(nb);
        softmax_exp(s);
        pack_p(pa, s);
        pv(pa, nb);
    }
}

/* Ping-pong (PP): two groups of four warps (grp), each with BM / 2 of the block's BM rows from m0.
 * Half-block slots 2 m and 2 m + 1 for key block nb_begin + m, n blocks: group 0 runs its P V
 * (m - 1) and Q K^T (m) in slot 2 m and its softmax (m) in slot 2 m + 1; group 1 the same one
 * slot later (its extra first barrier; group 0 has an extra last one). At slot 2 m, group 0 loads
 * K(m + 1) and V(m) (load_step; the prologue issued K(nb_begin) only): their buffers held
 * K(m - 1) and V(m - 2), which both groups finished by slot 2 m - 1; they are needed from slot
 * 2 m + 2 on, after group 0's wait and the barrier that end slot 2 m + 1. */
template <int MT, int NB8, int BM, class Load, class QK, class Max, class Exp, class Pack, class PV,
          class Edge, class Scrub>
FP_DEV void fp_fwd_pingpong_loop(int nb_begin, int nb_end, int m0, int nq, int grp,
                                 const Load &load_step, const QK &qk, const Max &softmax_max,
                                 const Exp &softmax_exp, const Pack &pack_p, const PV &pv,
                                 const Edge &edge_block, const Scrub &scrub_v)
{
    const int n = nb_end - nb_begin;
    const int g0 = m0 + grp * (BM / 2), g1 = min(g0 + BM / 2, nq); /* the group's rows */
    fp_cp_async_wait<0>();                                         /* Q and K(nb_begin) */
    __syncthreads();
    if (n <= 0)
        return;
    float s[MT][NB8][4];
    uint32_t pa[NB8 / 2][MT][4]; /* P of the last softmax, until its P V */
    /* a group's softmax half: S(nb) -> P(nb) */
    auto softmax_half = [&](int nb) {
        softmax_max(s, nb, g0, g1);
        softmax_exp(s);
        pack_p(pa, s);
        if (grp == 0)
            fp_cp_async_wait<0>();
        fp_pp_bar(grp);
    };
    /* The guard of an edge block's V(nb), between the barrier that ends slot 2 m + 1 (V(nb) has
     * landed) and group 0's P V(nb) in slot 2 m + 2: both groups scrub it there (group 0 before
     * its mma half, group 1 before its softmax half), then pass one more barrier. */
    auto scrub_pp = [&](int nb) {
        if (edge_block(nb)) {
            scrub_v(nb, grp);
            fp_pp_bar(grp);
        }
    };
    if (grp == 1)
        fp_pp_bar(grp);
    if (grp == 0)
        load_step(nb_begin);
    qk(s, nb_begin);
    fp_pp_bar(grp);
    if (grp == 1)
        scrub_pp(nb_begin);
    softmax_half(nb_begin);
    for (int nb = nb_begin + 1; nb < nb_end; ++nb) { /* mma half, then softmax half */
        if (grp == 0) {
            scrub_pp(nb - 1);
            load_step(nb);
        }
        pv(pa, nb - 1);
        qk(s, nb);
        fp_pp_bar(grp);
        if (grp == 1)
            scrub_pp(nb);
        softmax_half(nb);
    }
    if (grp == 0)
        scrub_pp(nb_end - 1);
    pv(pa, nb_end - 1);
    fp_pp_bar(grp);
    if (grp == 0)
        fp_pp_bar(grp);
}

/* ---- the end of a block --------------------------------------------------------------------- */

/* Each row's output scale and LSE: O = acc / l, LSE = m + log l (natural log); rows that saw
 * nothing: 0, -inf; rows that saw a non-finite V element (rowbad, the guard): NaN. The warp's rows
 * are MT x 16 from wrow; g: lane / 4. fac and lse are the kernel's (see fp_fwd_two_stage_loop). */
template <int MT>
FP_DEV void fp_fwd_row_scales(fp_softmax_state (&st)[MT][2], const uint8_t *rowbad, int wrow, int g,
                              float (&fac)[MT][2], float (&lse)[MT][2])
{
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            st[mt][r].l = fp_quad_sum(st[mt][r].l);
            fac[mt][r] = rowbad[wrow + mt * 16 + g + 8 * r] ? NAN : fp_cuda_out_scale(&st[mt][r]);
            lse[mt][r] = fp_cuda_lse_exp2(&st[mt][r]);
        }
}

/* O times fac and the LSE of the warp's rows (MT x 16 from wrow, of the block's rows from m0;
 * g, t: lane / 4, lane % 4): with one split O staged through sq and stored as 16-byte rows, and
 * the LSE; with several the split's f32 partials. */
template <typename T, int DK, int MT, int BM, int NT>
FP_DEV void fp_fwd_store(const fp_sm80_args &a, const float (&o)[MT][DK / 8][4],
                         const float (&fac)[MT][2], const float (&lse)[MT][2], T *sq,
                         const fp_cuda_seq &sq_, int b, int h, int split, int m0, int wrow,
                         int nchunks, int tid, int lane, int g, int t)
{
    constexpr int DT8 = DK / 8;
    const int nq = sq_.nq;
    if (a.splits == 1) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            fp_stage_acc<DK, DT8, T>(sq, wrow + mt * 16, 0, o[mt], fac[mt][0], fac[mt][1], lane);
        __syncthreads();
        T *og = reinterpret_cast<T *>(const_cast<void *>(a.o.ptr)) +
                fp_cuda_row(a.o, b, sq_.q_start + m0, h);
        fp_store_tile<BM, DK, NT>(og, a.o.ss, sq, nq - m0, nchunks, tid);
        if (a.lse && t == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int i = m0 + wrow + mt * 16 + g + 8 * r;
                    if (i < nq)
                        a.lse[fp_cuda_lse_off(a, b, sq_.q_start + i, h)] = lse[mt][r];
                }
        }
    } else {
        const int64_t rows = ((int64_t)split * a.batch + b) * a.heads + h; /* (split, b, h) */
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = m0 + wrow + mt * 16 + g + 8 * r;
                if (i >= nq)
                    continue;
                float *dst = a.o_part + (rows * a.nq + i) * a.d;
#pragma unroll
                for (int j = 0; j < DT8; ++j)
                    if (8 * j < a.d)
                        *reinterpret_cast<float2 *>(dst + 8 * j + 2 * t) = make_float2(
                            o[mt][j][2 * r] * fac[mt][r], o[mt][j][2 * r + 1] * fac[mt][r]);
                if (t == 0)
                    a.lse_part[rows * a.nq + i] = lse[mt][r];
            }
    }
}

/* ---- the block ------------------------------------------------------------------------------
 * One thread block of the forward around its schedule, shared by the three kernels below: the
 * setup (the block's rows, key blocks and pointers, Q and the first K / V tiles in flight, O and
 * the softmax state), the steps of a key block (lambdas over that state), schedule(k) (the
 * kernel's key loop; k: the steps and what a loop needs of the block), and the finalize. The
 * kernels differ only in the schedule they pass. */
template <typename T, int DK, int ALT, class Schedule>
FP_DEV void fp_fwd_block(const fp_sm80_args &a, const Schedule &schedule)
{
    constexpr int NW = fp_fwd_cfg<DK, ALT>::NW, MT = fp_fwd_cfg<DK, ALT>::MT;
    constexpr int BN = fp_fwd_cfg<DK, ALT>::BN;
    constexpr bool LAZY = fp_fwd_cfg<DK, ALT>::LAZY;
    constexpr bool FAST = fp_fwd_cfg<DK, ALT>::FAST_LOAD;
    constexpr bool PP = fp_fwd_cfg<DK, ALT>::PP;
    constexpr int ST = fp_fwd_cfg<DK, ALT>::ST;
    constexpr int NT = NW * 32, BM = NW * MT * 16;
    constexpr int KT = DK / 16, NB8 = BN / 8, DT8 = DK / 8;

    extern __shared__ __align__(128) unsigned char fp_smem[];
    T *sq = reinterpret_cast<T *>(fp_smem); /* [BM][DK], later the O staging tile */
    T *sk = sq + BM * DK;                   /* [ST][BN][DK] */
    T *sv = sk + ST * BN * DK;              /* [ST][BN][DK] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int qblk = a.reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z / a.splits, split = blockIdx.z % a.splits;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    const int nq = sq_.nq, nk = sq_.nk;
    const int m0 = qblk * BM;
    if (m0 >= nq)
        return;
    const int kvh = h / a.group;
    const int nchunks = a.d / 8;

    /* Key blocks this block visits: the window's range for its rows, cut to its split. */
    int nb_begin, nb_end;
    fp_geom_key_blocks(m0, min(m0 + BM, nq), nq, nk, a.left, a.right, BN, &nb_begin, &nb_end);
    if (a.splits > 1) {
        const int per = (int)(a.keys_per_split / BN);
        nb_begin = max(nb_begin, split * per);
        nb_end = min(nb_end, (split + 1) * per);
    }

    const T *qg = reinterpret_cast<const T *>(a.q.ptr) + fp_cuda_row(a.q, b, sq_.q_start + m0, h);
    const T *kg = reinterpret_cast<const T *>(a.k.ptr) + fp_cuda_row(a.k, b, sq_.k_start, kvh);
    const T *vg = reinterpret_cast<const T *>(a.v.ptr) + fp_cuda_row(a.v, b, sq_.k_start, kvh);

    /* K(nb) and V(nb) into their buffers, by the whole block */
    auto load_k = [&](int nb) {
        fp_fwd_load_kv<BN, DK, ST, NT, FAST>(sk, kg, a.k.ss, nb, nb_begin, nk, nchunks, tid);
    };
    auto load_v = [&](int nb) {
        fp_fwd_load_kv<BN, DK, ST, NT, FAST>(sv, vg, a.v.ss, nb, nb_begin, nk, nchunks, tid);
    };

    fp_load_tile<BM, DK, NT, FAST>(sq, qg, a.q.ss, nq - m0, nchunks, tid);
    if (nb_begin < nb_end)
        load_k(nb_begin);
    fp_cp_async_commit();
    if (!PP && ST == 2 && nb_begin < nb_end)
        load_v(nb_begin);
    fp_cp_async_commit();
    if (!PP && ST == 2 && nb_begin + 1 < nb_end)
        load_k(nb_begin + 1);
    fp_cp_async_commit();

    const uint32_t sq_a = fp_smem_addr(sq), sk_a = fp_smem_addr(sk), sv_a = fp_smem_addr(sv);
    const int wrow = warp * MT * 16; /* this warp's first row within the block */
    const fp_ldsm_lane lq = fp_lane_a<DK>(wrow, lane), lk = fp_lane_b<DK>(0, lane);
    const fp_ldsm_lane lv = fp_lane_bt<DK>(0, lane);

    float o[MT][DT8][4];
    fp_acc_zero(o);
    fp_softmax_state st[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        fp_softmax_init(&st[mt][0]);
        fp_softmax_init(&st[mt][1]);
    }
    /* Transformed scores are already in log2 units; raw ones get the scale in the exp2 FMA. */
    const float sc = a.transform ? 1.0f : a.scale_log2;
    const float slope = a.alibi ? a.alibi[h] : 0.0f;
    const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);

    /* The masked-key guard (common.cuh): in a key block that some row of this block sees only in
     * part (an edge block), V's infinite and NaN elements become 0 once the tile has landed, and
     * their keys are flagged (vflag); then each row of the block that sees a flagged key is
     * marked (rowbad, in shared memory so that the key loop carries no registers for it) and
     * ends with O = NaN, the value a non-finite V element gives the rows that see it (the CPU
     * backend makes only the matching elements NaN). Blocks that every row sees whole skip it. */
    __shared__ uint8_t vflag[BN], rowbad[BM];
    for (int r = tid; r < BM; r += NT) /* ordered before the marks by the loop's barriers */
        rowbad[r] = 0;
    auto edge_block = [&](int nb) {
        return !fp_mask_block_full(m0, min(m0 + BM, nq), nb * BN, nb * BN + BN, nq, nk, a.left,
                                   a.right);
    };
    /* By every thread of the block, after the barrier that follows V(nb)'s landing (fp_fwd_guard);
     * the caller's next barrier orders the marks before P V and the flags' next scrub after
     * them. grp: the ping-pong group (PP), else 0. */
    auto scrub_v = [&](int nb, int grp_) {
        fp_fwd_guard<T, BN, DK, NT, BM, PP>(sv + ((nb - nb_begin) & (ST - 1)) * BN * DK, vflag,
                                            rowbad, mk, m0, nb * BN, grp_);
    };
    /* The one- and two-stage schedules: right after the barrier that follows V(nb)'s landing
     * (placed after P is packed instead, it made ptxas spill more at D = 128). */
    auto guard_v = [&](int nb) {
        if (edge_block(nb)) {
            scrub_v(nb, 0);
            __syncthreads();
        }
    };

    /* The steps of one key block nb, which the schedule (fp_fwd_*_loop) composes. K(nb) and V(nb)
     * sit in buffer (nb - nb_begin) % ST. */
    /* S = Q K^T */
    auto qk = [&](float(&s)[MT][NB8][4], int nb) {
        fp_acc_zero(s);
        const uint32_t kt = sk_a + ((nb - nb_begin) & (ST - 1)) * BN * DK * 2;
        fp_warp_mma<T, KT, FP_MMA_STREAM_B>(
            s,
            [&](uint32_t(&f)[4], int mt, int kk) {
                fp_ldsm_x4(f, fp_ldsm_addr<DK>(sq_a, lq, mt * 16, kk));
            },
            [&](uint32_t(&f)[4], int p, int kk) {
                fp_ldsm_x4(f, fp_ldsm_addr<DK>(kt, lk, 16 * p, kk));
            });
    };
    /* Mask and transform (blocks that need it for rows r0 .. r1), row maxima, and the rescale
     * of O and l where a row's maximum grew (LAZY). */
    auto softmax_max = [&](float(&s)[MT][NB8][4], int nb, int r0, int r1) {
        const int j0 = nb * BN;
        const bool full = fp_mask_block_full(r0, r1, j0, j0 + BN, nq, nk, a.left, a.right);
        if (a.transform)
            fp_fwd_scores<FP_SCORES_TRANSFORM, MT, NB8>(s, a, mk, m0 + wrow, j0, nq, nk, slope,
                                                        lane);
        else if (!full)
            fp_fwd_scores<FP_SCORES_MASK, MT, NB8>(s, a, mk, m0 + wrow, j0, nq, nk, slope, lane);
        float mxs[MT][2];
        bool grow = false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < NB8; ++j)
                    mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
                mxs[mt][r] = fp_quad_max(mx) * sc;
                grow |= mxs[mt][r] > st[mt][r].m + FP_RESCALE_SLACK;
            }
        }
        if (!LAZY || __any_sync(0xffffffffu, grow))
            fp_rescale_rows(o, st, mxs);
    };
    /* P overwrites S; l += row sums */
    auto softmax_exp = [&](float(&s)[MT][NB8][4]) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float mu = fp_softmax_exp_base(&st[mt][r]);
                float l = 0.0f;
#pragma unroll
                for (int j = 0; j < NB8; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float &x = s[mt][j][2 * r + e];
                        x = fp_exp2(fmaf(x, sc, -mu));
                        l += x;
                    }
                st[mt][r].l += l; /* this thread's columns; the quad's sum is taken at the end */
            }
        }
    };
    /* P (rounded to T) as the A fragments of P V's k steps */
    auto pack_p = [&](uint32_t(&pa)[BN / 16][MT][4], float(&s)[MT][NB8][4]) {
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                fp_acc_to_a<T>(pa[kk][mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
    };
    /* O += P V */
    auto pv = [&](uint32_t(&pa)[BN / 16][MT][4], int nb) {
        const uint32_t vt = sv_a + ((nb - nb_begin) & (ST - 1)) * BN * DK * 2;
        fp_warp_mma_ra<T, BN / 16, FP_MMA_STREAM_B>(
            o, [&](int mt, int kk) -> const uint32_t(&)[4] { return pa[kk][mt]; },
            [&](uint32_t(&f)[4], int p, int kk) {
                fp_ldsm_x4_t(f, fp_ldsm_addr<DK>(vt, lv, 16 * kk, p));
            });
    };

    /* S (then P) and P's A fragments of the current key block, for the one- and two-stage loops
     * (the ping-pong loop keeps its own): here, after the block's other arrays, and not in the
     * kernels' schedules, where inlined they would come first among the kernel's and change its
     * machine code (fp_fwd_two_stage_loop) */
    float s[MT][NB8][4];
    uint32_t pa[BN / 16][MT][4];
    /* What the schedule composes: the steps, and the block's key range, rows and K / V buffers */
    struct {
        int nb_begin, nb_end, m0, nq, nk, warp, tid, nchunks;
        T *sk, *sv;
        const T *kg, *vg;
        decltype(load_k) &load_k;
        decltype(load_v) &load_v;
        decltype(qk) &qk;
        decltype(softmax_max) &softmax_max;
        decltype(softmax_exp) &softmax_exp;
        decltype(pack_p) &pack_p;
        decltype(pv) &pv;
        decltype(edge_block) &edge_block;
        decltype(scrub_v) &scrub_v;
        decltype(guard_v) &guard_v;
    } k = {nb_begin,    nb_end, m0, nq,         nk,      warp,   tid, nchunks,
           sk,          sv,     kg, vg,         load_k,  load_v, qk,  softmax_max,
           softmax_exp, pack_p, pv, edge_block, scrub_v, guard_v};
    schedule(k, s, pa);
    fp_cp_async_wait<0>();

    /* Finalize */
    __syncthreads(); /* every warp is done reading sq, and every mark is made */
    float fac[MT][2], lse[MT][2];
    fp_fwd_row_scales<MT>(st, rowbad, wrow, g, fac, lse);
    fp_fwd_store<T, DK, MT, BM, NT>(a, o, fac, lse, sq, sq_, b, h, split, m0, wrow, nchunks, tid,
                                    lane, g, t);
}

/* ---- the kernels: one a schedule -------------------------------------------------------------
 * q, o: (B, Nq, H, D); k, v: (B, Nk, Hkv, D); lse: (B, H, Nq); grid (q blocks, H, B * splits) */

/* Two K and V buffers (fp_fwd_two_stage_loop) */
template <typename T, int DK, int ALT>
__global__ void __launch_bounds__(fp_fwd_cfg<DK, ALT>::NW * 32)
    fp_sm80_fwd_two_stage_kernel(const fp_sm80_args a)
{
    using CFG = fp_fwd_cfg<DK, ALT>;
    static_assert(CFG::ST == 2 && !CFG::PP, "two stages: fp_fwd_cfg's ST = 2");
    constexpr int MT = CFG::MT, NB8 = CFG::BN / 8, BM = CFG::NW * MT * 16;
    fp_fwd_block<T, DK, ALT>(a, [](const auto &k, auto &s, auto &pa) {
        fp_fwd_two_stage_loop<MT, NB8, CFG::EARLY_V>(
            s, pa, k.nb_begin, k.nb_end, k.m0, min(k.m0 + BM, k.nq), k.load_k, k.load_v, k.qk,
            k.softmax_max, k.softmax_exp, k.pack_p, k.pv, k.guard_v);
    });
}

/* One K and one V buffer (fp_fwd_one_stage_loop) */
template <typename T, int DK, int ALT>
__global__ void __launch_bounds__(fp_fwd_cfg<DK, ALT>::NW * 32)
    fp_sm80_fwd_one_stage_kernel(const fp_sm80_args a)
{
    using CFG = fp_fwd_cfg<DK, ALT>;
    static_assert(CFG::ST == 1 && !CFG::PP && CFG::EARLY_V, "one stage: the EARLY_V loop only");
    constexpr int MT = CFG::MT, NB8 = CFG::BN / 8, BM = CFG::NW * MT * 16;
    fp_fwd_block<T, DK, ALT>(a, [](const auto &k, auto &s, auto &pa) {
        fp_fwd_one_stage_loop<MT, NB8>(s, pa, k.nb_begin, k.nb_end, k.m0, min(k.m0 + BM, k.nq),
                                       k.load_k, k.load_v, k.qk, k.softmax_max, k.softmax_exp,
                                       k.pack_p, k.pv, k.guard_v);
    });
}

/* Ping-pong (fp_fwd_pingpong_loop) */
template <typename T, int DK, int ALT>
__global__ void __launch_bounds__(fp_fwd_cfg<DK, ALT>::NW * 32)
    fp_sm80_fwd_pingpong_kernel(const fp_sm80_args a)
{
    using CFG = fp_fwd_cfg<DK, ALT>;
    static_assert(CFG::PP && CFG::NW == 8 && CFG::ST == 2, "ping-pong: two groups of four warps");
    constexpr int MT = CFG::MT, BN = CFG::BN, NB8 = BN / 8, BM = CFG::NW * MT * 16;
    constexpr int NT = CFG::NW * 32;
    constexpr bool FAST = CFG::FAST_LOAD;
    fp_fwd_block<T, DK, ALT>(a, [&](const auto &k, auto &, auto &) {
        /* group 0 (NT / 2 threads): K(nb + 1), V(nb) */
        auto load_step = [&](int nb) {
            if (nb + 1 < k.nb_end)
                fp_fwd_load_kv<BN, DK, 2, NT / 2, FAST>(k.sk, k.kg, a.k.ss, nb + 1, k.nb_begin,
                                                        k.nk, k.nchunks, k.tid);
            fp_fwd_load_kv<BN, DK, 2, NT / 2, FAST>(k.sv, k.vg, a.v.ss, nb, k.nb_begin, k.nk,
                                                    k.nchunks, k.tid);
            fp_cp_async_commit();
        };
        fp_fwd_pingpong_loop<MT, NB8, BM>(k.nb_begin, k.nb_end, k.m0, k.nq, k.warp / 4, load_step,
                                          k.qk, k.softmax_max, k.softmax_exp, k.pack_p, k.pv,
                                          k.edge_block, k.scrub_v);
    });
}

/* The kernel of a configuration: its schedule's (fp_fwd_cfg's PP and ST). */
template <typename T, int DK, int ALT> constexpr auto fp_fwd_kernel()
{
    using CFG = fp_fwd_cfg<DK, ALT>;
    if constexpr (CFG::PP)
        return fp_sm80_fwd_pingpong_kernel<T, DK, ALT>;
    else if constexpr (CFG::ST == 1)
        return fp_sm80_fwd_one_stage_kernel<T, DK, ALT>;
    else
        return fp_sm80_fwd_two_stage_kernel<T, DK, ALT>;
}

/* One configuration's kernel launched (and the split-KV combine after it), or with query !=
 * NULL the workspace bytes of its split plan. */
template <typename T, int DK, int ALT>
static flashport_status fp_fwd_launch(const fp_cuda_ctx *ctx, const fp_problem *p, fp_sm80_args a,
                                      void *ws, size_t *query)
{
    using CFG = fp_fwd_cfg<DK, ALT>;
    constexpr int BM = fp_fwd_bm<DK, ALT>(), BN = CFG::BN;
    constexpr size_t smem = fp_fwd_smem<DK, ALT>();
    const cudaStream_t stream = ctx->stream;

    void (*kernel)(const fp_sm80_args) = fp_fwd_kernel<T, DK, ALT>();
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int resident = 1;
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, CFG::NW * 32, smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not left for the next launch check to find */
        return fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "forward kernel setup");
    }
    const fp_plan plan =
        fp_cuda_grid_plan(p, (int64_t)ctx->sm_count * (resident > 0 ? resident : 1), BM, BN);
    const bool empty = plan.num_q_blocks == 0 || p->batch == 0 || p->heads == 0;
    if (query) {
        *query = empty ? 0 : fp_cuda_fwd_splits(p, &a, plan.num_splits, plan.keys_per_split, NULL);
        return FLASHPORT_OK;
    }
    if (empty)
        return FLASHPORT_OK;
    fp_cuda_fwd_splits(p, &a, plan.num_splits, plan.keys_per_split, ws);
    a.reverse = plan.heavy_first;

    {
        dim3 grid((unsigned)plan.num_q_blocks, (unsigned)p->heads, (unsigned)(p->batch * a.splits));
        kernel<<<grid, CFG::NW * 32, smem, stream>>>(a);
        e = cudaGetLastError();
        fp_cuda_log("forward: sm80 D%d kernel (BM %d, BN %d, %d warps%s) for D=%lld, grid "
                    "%ux%ux%u, %d split(s)",
                    DK, BM, BN, CFG::NW, CFG::PP ? ", ping-pong" : "", (long long)p->head_dim,
                    grid.x, grid.y, grid.z, a.splits);
    }
    if (e == cudaSuccess && a.splits > 1)
        e = fp_cuda_fwd_combine(p, &a, stream);
    return e == cudaSuccess ? FLASHPORT_OK
                            : fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "forward kernel launch");
}

static_assert(fp_fwd_smem<64, FP_FWD_D64>() == FP_FWD_SMEM_D64 &&
                  fp_fwd_smem<64, FP_FWD_D64_PINGPONG>() == FP_FWD_SMEM_D64_PINGPONG &&
                  fp_fwd_smem<128, FP_FWD_D128>() == FP_FWD_SMEM_D128 &&
                  fp_fwd_smem<256, FP_FWD_D256_TWO_PER_SM>() == FP_FWD_SMEM_D256_TWO_PER_SM &&
                  fp_fwd_smem<256, FP_FWD_D256_TWO_STAGE>() == FP_FWD_SMEM_D256_TWO_STAGE &&
                  fp_fwd_smem<256, FP_FWD_D256_BN32>() == FP_FWD_SMEM_D256_BN32,
              "sm80/config.h's forward shared-memory table");

static_assert(fp_fwd_bm<64, FP_FWD_D64_PINGPONG>() == FP_FWD_D64_PINGPONG_BM &&
                  (int)fp_fwd_cfg<64, FP_FWD_D64_PINGPONG>::BN == (int)FP_FWD_D64_PINGPONG_BN,
              "sm80/config.h's ping-pong tile");

/* The configuration `alt` of head dim DK (fp_sm80_pick's choice), launched. */
template <typename T, int DK>
flashport_status fp_sm80_fwd_family<T, DK>::run(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                const fp_sm80_args &a, int alt, void *ws,
                                                size_t *query)
{
    return fp_cuda_with_index<fp_fwd_alts<DK>()>(alt, [&](auto i) {
        return fp_fwd_launch<T, DK, decltype(i)::value>(ctx, p, a, ws, query);
    });
}

#endif /* FLASHPORT_BACKENDS_CUDA_SM80_FWD_CUH */
