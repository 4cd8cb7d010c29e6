/*
 * Flash attention backward, sm90 path (Hopper, sm_90a): TMA + wgmma + warp specialization.
 *
 * Algorithm (FlashAttention-2's backward with the FlashAttention-3 paper's Hopper structure,
 * written from the paper and the PTX ISA), P recomputed from the forward's LSE:
 *   1. The sm80 path's side pass (fp_cuda_bwd_side_pre): LSE * log2(e) and Dsum = rowsum(dO * O)
 *      per query row into the [B, H, nq_pad] workspace; the f32 dQ accumulator zeroed.
 *   2. fp_sm90_bwd_kernel: one thread block of three warpgroups per (key block of BN = 128
 *      keys, kv head, batch); its dK and dV accumulate in registers over every query block that
 *      sees the key block, for every query head of the GQA group, or of its slice of the group
 *      where the grid would be too small (fp_cuda_bwd_group_splits; the slices' f32 partials are
 *      then added in slice order by the sm80 path's fp_cuda_bwd_side_dkdv_sum).
 *        producer warpgroup (setmaxnreg gives its registers away): thread 0 issues TMA loads
 *          of the K and V tiles once, then per step (query head, query block of BM rows) the Q
 *          and dO tiles (tensor maps) and the rows' LSE2 and Dsum (bulk copies) into a ring of
 *          ST stages, each with a "full" and an "empty" mbarrier; thread 32 (the dQ writer)
 *          adds each step's dQ tile from shared memory to the f32 accumulator with one bulk
 *          reduction (cp.reduce.async.bulk .add.f32).
 *        consumers (warpgroups 1 and 2, 64 keys each): with the keys as the rows of every
 *          product, so that P^T and dS^T come out of the accumulators in the layout of wgmma's
 *          register A operand:
 *            S^T = K Q^T and dP^T = V dO^T (both operands in shared memory);
 *            P^T = exp2(S^T scale log2(e) - LSE2), dS^T = P^T (dP^T - Dsum) in registers;
 *            dV += P^T dO and dK += dS^T Q (A from registers, B = dO / Q MN-major);
 *            dS^T to shared memory (two buffers, by step parity), one barrier between the two
 *            warpgroups, then dQ = dS K (both operands MN-major) over all 128 keys: at D = 128
 *            each warpgroup takes 64 of dQ's columns, at D = 64 (BM = 128) 64 of its rows;
 *            dQ to a shared tile in the accumulator's order (the sm80 path's fp_dq_frag_off, so
 *            that the conversion pass is shared), handed to the writer through mbarriers.
 *   3. fp_cuda_bwd_side_dq: the accumulator scaled into dq.
 * Query blocks are walked from the last to the first: every key block of a causal mask then
 * reaches a query block at the same step (the last query blocks see every key block).
 * Deterministic mode: a counter per (batch, head, query block) makes the key blocks that see the
 * query block add their dQ tiles one after another in key-block order (the writer waits for its
 * turn, adds, waits for the add to complete, passes the turn on). Blocks are launched in
 * key-block order, so a turn's owner has always started; with the walk above, the key blocks
 * arrive at a query block together and the turns cost a chain of reductions, not a wavefront of
 * steps. Every sum then has a fixed order: bitwise identical run to run.
 * Masking mirrors the forward: only query blocks that see the key block are visited
 * (fp_geom_query_blocks), fp_mask_block_full picks the steps that need no per-element mask, and
 * the others select (never multiply) P and dS to 0 for keys a row cannot see. Softcap
 * multiplies dS by its derivative 1 - tanh^2 (fp_sm90_softcap, the forward's tanh);
 * ALiBi adds nothing to the gradient.
 * The masked-key guard (docs/reliability.md): K rows are scrubbed of non-finite elements once per
 * block where a look at the K tile before the first step finds one, the Q and dO rows of edge
 * steps (masked pairs, or rows past the sequence) before their products when the rows' LSE2 /
 * Dsum say one may hold a non-finite element, so that a masked zero of P or dS never meets a NaN
 * or inf; a visible pair of a scrubbed row gets its NaN back by a select. Its state lives in
 * shared memory and its selects run only where something was flagged, so that a step with
 * nothing flagged runs the mask of the unguarded kernel (edge steps) or none.
 *
 * Configurations (fp_sm90_bwd_cfg, sm90/bwd_config.cuh; 384 threads, one block per SM):
 * D = 64: BM 128, D = 128: BM 64; BN 128, 2 stages. Other head dims run on the next larger
 * kernel (TMA reads the columns past D as zeros); head dims 129 .. 256 on sm90/bwd256.cuh's
 * kernel, whose warpgroups split the columns of dK and dV instead of the keys.
 *
 * Differences from the reference: P and dS are rounded to f16/bf16 before the products that
 * use them; exp2 is the hardware approximation; outside the deterministic mode dQ is summed in an
 * order that varies from run to run (last-bit differences). Numbers: docs/performance.md.
 *
 * This header holds the kernel and its launch (fp_sm90_bwd_family, sm90/bwd_config.cuh); one
 * file per head dim instantiates them (sm90/inst/bwd_d64.cu, bwd_d128.cu; bwd_d256.cu the
 * head-dim-256 kernel of sm90/bwd256.cuh), the launcher is sm90/bwd.cu.
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM90_BWD_CUH
#define FLASHPORT_BACKENDS_CUDA_SM90_BWD_CUH

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/sm80/common.cuh"
#include "backends/cuda/sm90/bwd_config.cuh"
#include "backends/cuda/sm90/common.cuh"

#include "core/problem.h"

#include <math.h>

typedef struct fp_sm90_bwd_params {
    CUtensorMap tq, tk, tv, tdo; /* 4-d maps (D, tokens, heads, batch); boxes of 64 x rows */
    fp_sm80_args a;
    /* deterministic mode: [B, H, nq_pad / BM] turn counters (zeroed), one per query block: the
     * key blocks that see it add their dQ in key-block order; NULL otherwise */
    int *dq_turn;
} fp_sm90_bwd_params;

/* Byte offset of element (row, column c) in a tile of ROWS rows stored as TMA writes it with
 * 128-byte swizzling: panels of ROWS x 64 columns, rows of 128 bytes, 1024-byte aligned. */
template <int ROWS> FP_DEV uint32_t fp_swz128(int row, int c)
{
    return (uint32_t)((c / 64) * ROWS * 128 + row * 128 + ((((c % 64) / 8) ^ (row & 7)) << 4) +
                      (c % 8) * 2);
}

/* The masked-key guard (docs/reliability.md): row `row` of a shared tile stored as TMA writes it
 * (ROWS-row panels of 64 columns, 128-byte rows) with its infinite and NaN elements set to 0
 * (fp_scrub_word); returns whether it had one. The swizzle only permutes a row's 16-byte
 * chunks, so they are visited in storage order. */
template <typename T, int ROWS, int DK> FP_DEV bool fp_sm90_scrub_row(unsigned char *tile, int row)
{
    bool bad = false;
#pragma unroll 4
    for (int c = 0; c < DK / 8; ++c) {
        bad |= fp_scrub_chunk<T>(
            reinterpret_cast<uint4 *>(tile + (c / 8) * ROWS * 128 + row * 128 + (c % 8) * 16));
    }
    return bad;
}

/* The guard's K part, before the first step, by the 256 consumer threads (ct: 0 .. 255): whether
 * the key block's K tile (BN rows, ROWS-row panels as TMA writes them) holds an infinite or NaN
 * element, by integer tests of 16 bytes (fp_vec_nonfinite); the same answer in every consumer
 * thread (one barrier among them). */
template <typename T, int BN, int DK>
FP_DEV bool fp_sm90b_k_suspect(const unsigned char *k_tile, unsigned *guard, int ct)
{
    constexpr int CH = DK / 8;
    bool bad = false;
#pragma unroll
    for (int i = 0; i < BN * CH / FP_SM90B_CONSUMER_THREADS; ++i) {
        const int idx = ct + i * FP_SM90B_CONSUMER_THREADS, row = idx / CH, c = idx % CH;
        bad |= fp_vec_nonfinite<T>(*reinterpret_cast<const uint4 *>(k_tile + (c / 8) * BN * 128 +
                                                                    row * 128 + (c % 8) * 16));
    }
    if (bad)
        *(volatile unsigned *)(guard + FP_SM90B_GUARD_K) = 1u;
    fp_named_bar_sync(1, FP_SM90B_CONSUMER_THREADS);
    return *(volatile unsigned *)(guard + FP_SM90B_GUARD_K) != 0u;
}

/* Its rare path: every K row scrubbed (fp_sm90_scrub_row) and flagged in kflag,
 * ordered before the products that read K (async proxy) and the flags' readers. */
template <typename T, int BN, int DK>
FP_DEV void fp_sm90b_scrub_k(unsigned char *k_tile, uint8_t *kflag, int ct)
{
    if (ct < BN)
        kflag[ct] = fp_sm90_scrub_row<T, BN, DK>(k_tile, ct) ? 1 : 0;
    fp_fence_proxy_async_smem();
    fp_named_bar_sync(1, FP_SM90B_CONSUMER_THREADS);
}

/* The guard's Q / dO part of an edge step whose rows' LSE2 / Dsum say one may hold a non-finite
 * element (fp_rows_suspect), by the 256 consumer threads (ct; warp cw 0 .. 7): Q row
 * ct or dO row ct - BM of the stage (q_tile, do_tile) scrubbed, flagged in qf / of and counted in
 * the guard's words; ordered before the products that follow. Returns whether this step flagged
 * a row. */
template <typename T, int BM, int DK>
FP_DEV bool fp_sm90b_scrub_rows(unsigned char *q_tile, unsigned char *do_tile, uint8_t *qf,
                                uint8_t *of, unsigned *guard, int ct, int cw)
{
    if (ct < 2 * BM) {
        const bool bad = fp_sm90_scrub_row<T, BM, DK>(ct < BM ? q_tile : do_tile, ct % BM);
        (ct < BM ? qf : of)[ct % BM] = bad ? 1 : 0;
        if (bad)
            atomicAdd(guard + FP_SM90B_GUARD_ROWS, 1u);
    }
    fp_fence_proxy_async_smem();
    fp_named_bar_sync(1, FP_SM90B_CONSUMER_THREADS);
    /* the count holds still until every consumer has passed the step's dS barrier */
    const unsigned now = *(volatile unsigned *)(guard + FP_SM90B_GUARD_ROWS);
    volatile unsigned *seen = guard + FP_SM90B_GUARD_SEEN + cw;
    const unsigned before = *seen;
    __syncwarp();
    if ((threadIdx.x & 31) == 0)
        *seen = now;
    return now != before;
}

/* The block's mbarriers, 8 bytes each from shared address base: K and V landed (kv); stage s
 * full (its Q, dO, LSE2 and Dsum landed) and empty (both consumer warpgroups done with it); dQ
 * tile u full (written by the consumers) and empty (added to the accumulator by the writer). */
template <typename CFG> struct fp_sm90b_bars {
    uint32_t kv;
    fp_mbar_ring<CFG::ST> stage;
    fp_mbar_ring<CFG::DQB> dq;
    __device__ __forceinline__ explicit fp_sm90b_bars(uint32_t base)
        : kv(base), stage{base + 8u}, dq{stage.end()}
    {
    }
};

/* The work of a backward block: key block kb (blockIdx.x; keys n0 ..) of batch b (blockIdx.z) and
 * kv head kvh, the slice `split` of that kv head's query heads it owns (blockIdx.y; group /
 * group_splits heads from h_first, all of them without group splits), the sequence's lengths, and
 * the query blocks mb_lo .. mb_end - 1 that see its keys: `steps` (head, query block) pairs in all.
 * false: the key block lies past the sequence, and the block has nothing to do. */
struct fp_sm90b_work {
    int kb, b, kvh, split, h_first, n0, mb_lo, mb_end, steps;
    fp_cuda_seq seq;
};
template <int BM, int BN> FP_DEV bool fp_sm90b_work_of(const fp_sm80_args &a, fp_sm90b_work &wk)
{
    wk.kb = blockIdx.x;
    wk.b = blockIdx.z;
    wk.kvh = blockIdx.y / a.group_splits;
    wk.split = blockIdx.y % a.group_splits;
    const int slice = a.group / a.group_splits;
    wk.h_first = wk.kvh * a.group + wk.split * slice;
    wk.seq = fp_cuda_seq_of(a, wk.b);
    wk.n0 = wk.kb * BN;
    if (wk.n0 >= wk.seq.nk)
        return false;
    fp_geom_query_blocks(wk.n0, min(wk.n0 + BN, wk.seq.nk), wk.seq.nq, wk.seq.nk, a.left, a.right,
                         BM, &wk.mb_lo, &wk.mb_end);
    wk.steps = slice * (wk.mb_end - wk.mb_lo);
    return true;
}

/* The end of a block: a consumer thread's dK and dV accumulators (NJ x 4 each; element
 * 4 j + 2 r + e is key row kr + 8 r of the block, column c0 + 8 j + 2 t + e).
 * fp_sm90b_dkv_part: with group splits, the slice's f32 sums into a.dkv_part (added in slice
 * order by fp_cuda_bwd_side_dkdv_sum). fp_sm90b_dkv_stage: dK (times the softmax scale) and dV
 * into the K and V tiles (128-byte swizzle, BN-row panels), free once every product that reads
 * them has landed. fp_sm90b_dkv_write: a warpgroup's part of the staged tiles (rows row0 ..
 * row0 + ROWS - 1, 16-byte chunks ch0 .. ch0 + CH - 1) to dk / dv as 16-byte stores. */
template <int DK, int NJ>
FP_DEV void fp_sm90b_dkv_part(const fp_sm80_args &a, const float (&dv)[4 * NJ],
                              const float (&dk)[4 * NJ], int split, int b, int kvh, int key, int c0,
                              int t)
{
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float *pv = a.dkv_part + fp_bwd_part_row(a, 0, split, b, kvh, key + 8 * r) * DK;
        float *pk = a.dkv_part + fp_bwd_part_row(a, 1, split, b, kvh, key + 8 * r) * DK;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int c = c0 + 8 * j + 2 * t;
            *reinterpret_cast<float2 *>(pv + c) =
                make_float2(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
            *reinterpret_cast<float2 *>(pk + c) =
                make_float2(dk[4 * j + 2 * r], dk[4 * j + 2 * r + 1]);
        }
    }
}
template <typename T, int BN, int NJ>
FP_DEV void fp_sm90b_dkv_stage(unsigned char *k_tile, unsigned char *v_tile,
                               const float (&dv)[4 * NJ], const float (&dk)[4 * NJ], float scale,
                               int kr, int c0, int t)
{
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint32_t off = fp_swz128<BN>(kr + 8 * r, c0 + 8 * j + 2 * t);
            *reinterpret_cast<uint32_t *>(k_tile + off) =
                fp_pack2<T>(dk[4 * j + 2 * r] * scale, dk[4 * j + 2 * r + 1] * scale);
            *reinterpret_cast<uint32_t *>(v_tile + off) =
                fp_pack2<T>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
        }
}
template <typename T, int BN, int ROWS, int CH>
FP_DEV void fp_sm90b_dkv_write(const fp_sm80_args &a, const unsigned char *k_tile,
                               const unsigned char *v_tile, int row0, int ch0, int wtid, int n0,
                               int nk, int b, int64_t k_start, int kvh)
{
    T *dkg = reinterpret_cast<T *>(const_cast<void *>(a.dk.ptr));
    T *dvg = reinterpret_cast<T *>(const_cast<void *>(a.dv.ptr));
#pragma unroll 4
    for (int idx = wtid; idx < ROWS * CH; idx += 128) {
        const int row = row0 + idx / CH, c = ch0 + idx % CH, key = n0 + row;
        if (key >= nk || 8 * c >= a.d)
            continue;
        const uint32_t off = fp_swz128<BN>(row, 8 * c);
        *reinterpret_cast<uint4 *>(dkg + fp_cuda_row(a.dk, b, k_start + key, kvh) + 8 * c) =
            *reinterpret_cast<const uint4 *>(k_tile + off);
        *reinterpret_cast<uint4 *>(dvg + fp_cuda_row(a.dv, b, k_start + key, kvh) + 8 * c) =
            *reinterpret_cast<const uint4 *>(v_tile + off);
    }
}

/* The dQ writer (producer thread 32) of key block kb of batch b: the consumers leave each step's
 * dQ tile (query head h, query block mb: the steps walk mb_end - 1 down to mb_lo for each head
 * from h_first) in shared memory at sdq, in the accumulator's order; one bulk reduction adds it
 * to the BM contiguous rows of the accumulator. Deterministic mode: each query block's counter
 * says whose turn it is. */
template <typename CFG>
FP_DEV void fp_sm90_bwd_dq_writer(const fp_sm90_bwd_params &prm, uint32_t sdq,
                                  fp_sm90b_bars<CFG> bars, int b, int kb, int h_first, int mb_lo,
                                  int mb_end, int steps, int nq, int nk)
{
    constexpr int BM = CFG::BM, BN = CFG::BN, DK = CFG::DK, DQB = CFG::DQB;
    const fp_sm80_args &a = prm.a;
    int h = h_first, mb = mb_end - 1;
    for (int it = 0; it < steps; ++it) {
        const int u = it % DQB, m0 = mb * BM;
        fp_mbar_wait(bars.dq.full(u), (it / DQB) & 1);
        float *dst = a.dq_accum + fp_bwd_ws_row(a, b, h, m0) * DK;
        int *turn = NULL;
        if (prm.dq_turn) {
            turn = prm.dq_turn + ((int64_t)b * a.heads + h) * (a.nq_pad / BM) + mb;
            int kb_lo, kb_hi;
            fp_geom_key_blocks(m0, min(m0 + BM, nq), nq, nk, a.left, a.right, BN, &kb_lo, &kb_hi);
            while (fp_ld_acquire_gpu(turn) != kb - kb_lo) {
            }
            fp_fence_proxy_async_global();
        }
        fp_bulk_reduce_add_f32(dst, sdq + u * CFG::DQ_BYTES, CFG::DQ_BYTES);
        fp_bulk_commit();
        /* the tile is free once read: the consumers write the next one while the addition
         * completes and (deterministic mode) the turn waits for it */
        fp_bulk_wait_read();
        fp_mbar_arrive(bars.dq.empty(u));
        if (turn) {
            fp_bulk_wait();
            fp_fence_proxy_async_global();
            fp_red_release_gpu(turn, 1);
        }
        fp_bwd_prev_step(h, mb, mb_lo, mb_end);
    }
    fp_bulk_wait();
}

/* The loader (producer thread 0): the K and V tiles of the key block (rows k_row .. of kv head
 * kvh, batch coordinate cb) once, then each step's Q and dO tiles (TMA, rows q_start + mb BM ..)
 * and its rows' LSE2 and Dsum (bulk copies) into stage it % ST, once both consumer warpgroups
 * have freed it; the steps as in fp_sm90_bwd_dq_writer. */
template <typename CFG>
FP_DEV void fp_sm90_bwd_loader(const fp_sm90_bwd_params &prm, uint32_t sk, uint32_t sv, uint32_t sq,
                               uint32_t sdo, uint32_t srow, fp_sm90b_bars<CFG> bars, int b, int cb,
                               int k_row, int kvh, int64_t q_start, int h_first, int mb_lo,
                               int mb_end, int steps)
{
    constexpr int BM = CFG::BM, BN = CFG::BN, ST = CFG::ST, NP = CFG::DK / 64;
    constexpr uint32_t Q_BYTES = CFG::Q_BYTES, ROW_BYTES = CFG::ROW_BYTES;
    const fp_sm80_args &a = prm.a;
    fp_mbar_arrive_expect_tx(bars.kv, 2 * CFG::KV_BYTES);
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        fp_tma_load_4d(sk + p * BN * 128, &prm.tk, bars.kv, 64 * p, k_row, kvh, cb);
        fp_tma_load_4d(sv + p * BN * 128, &prm.tv, bars.kv, 64 * p, k_row, kvh, cb);
    }
    int h = h_first, mb = mb_end - 1;
    for (int it = 0; it < steps; ++it) {
        const int s = it % ST;
        fp_mbar_wait(bars.stage.empty(s), ((it / ST) & 1) ^ 1);
        fp_mbar_arrive_expect_tx(bars.stage.full(s), 2 * Q_BYTES + 2 * ROW_BYTES);
        const int q_row = (int)q_start + mb * BM;
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            fp_tma_load_4d(sq + s * Q_BYTES + p * BM * 128, &prm.tq, bars.stage.full(s), 64 * p,
                           q_row, h, cb);
            fp_tma_load_4d(sdo + s * Q_BYTES + p * BM * 128, &prm.tdo, bars.stage.full(s), 64 * p,
                           q_row, h, cb);
        }
        const int64_t w = fp_bwd_ws_row(a, b, h, (int64_t)mb * BM);
        fp_bulk_load(srow + s * ROW_BYTES, a.ws_lse2 + w, ROW_BYTES, bars.stage.full(s));
        fp_bulk_load(srow + (ST + s) * ROW_BYTES, a.ws_dsum + w, ROW_BYTES, bars.stage.full(s));
        fp_bwd_prev_step(h, mb, mb_lo, mb_end);
    }
}

/* ---- the consumers' steps: element 4 j + 2 r + e of a warpgroup's S^T or dP^T accumulator
 * (BM / 2 floats a thread) is key kr + 8 r (kr: the thread's first key) and query
 * 8 j + 2 t + e of the step's block (t: lane % 4) */

/* dS^T (da: as wgmma's A fragments, BM / 16 k steps) -> a dS buffer at gds ([key][query], BM / 64
 * panels of BN rows, as TMA would write it), for the dQ product's B operand. */
/* The mask of a step's P^T (sacc) and dS^T (dpacc), element 4 j + 2 r + e: key key0 + 8 r,
 * query m0 + c with c = c0 + 8 j + 2 t + e. Masked pairs get 0 by a select (their dP or Dsum may
 * be NaN); a visible pair whose K row (kbad[r]) or, when this step flagged rows (rnew), Q or dO
 * row (qf[c], of[c]) the masked-key guard scrubbed gets the NaN it would have had. */
template <int NJ>
FP_DEV void fp_sm90b_mask_pairs(float (&sacc)[4 * NJ], float (&dpacc)[4 * NJ], const fp_mask32 &mk,
                                int nq, int m0, int c0, int key0, int t, const bool (&kbad)[2],
                                bool rnew, const uint8_t *qf, const uint8_t *of)
{
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int k = 4 * j + 2 * r + e, c = c0 + 8 * j + 2 * t + e, i = m0 + c;
                const bool vis = i < nq && fp_mask32_visible(mk, i, key0 + 8 * r);
                const bool bad = kbad[r] || (rnew && (qf[c] != 0 || of[c] != 0));
                sacc[k] = vis ? (bad ? NAN : sacc[k]) : 0.0f;
                dpacc[k] = vis ? (bad ? NAN : dpacc[k]) : 0.0f;
            }
}

template <int BM, int BN>
FP_DEV void fp_sm90_bwd_store_ds(unsigned char *gds, const uint32_t (&da)[BM / 16][4], int kr,
                                 int t)
{
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
            *reinterpret_cast<uint32_t *>(gds + fp_swz128<BN>(kr + 8 * r, 8 * j + 2 * t)) =
                da[j / 2][2 * (j % 2) + r];
}

/* Warpgroup w's 64 x 64 piece of dQ (the m64n64 accumulator dq) -> the dQ tile at tile, in the
 * accumulator's order (bands of 16 rows, fp_dq_frag_off): element 4 j + 2 r + e is row
 * 16 band + g + 8 r, column c0 + 8 j + 2 t + e, with the piece's rows or columns by w. */
template <typename CFG>
FP_DEV void fp_sm90_bwd_stage_dq(unsigned char *tile_bytes, const float (&dq)[32], int w, int warp,
                                 int g, int t)
{
    const int band = (CFG::DQ_BY_ROWS ? 4 * w : 0) + warp;
    const int c0 = CFG::DQ_BY_ROWS ? 0 : 64 * w;
    float *tile = reinterpret_cast<float *>(tile_bytes) + band * 16 * CFG::DK;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
            *reinterpret_cast<float2 *>(tile + fp_dq_frag_off(g + 8 * r, c0 + 8 * j + 2 * t)) =
                make_float2(dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
}

// q, dout, dq: (B, Nq, H, D); k, v, dk, dv: (B, Nk, Hkv, D); grid (key blocks, Hkv, B).
template <typename T, typename CFG>
__global__ void __launch_bounds__(FP_SM90B_THREADS, 1)
    fp_sm90_bwd_kernel(const __grid_constant__ fp_sm90_bwd_params prm)
{
#if FP_SM90_DEVICE
    constexpr int BM = CFG::BM, BN = CFG::BN, DK = CFG::DK, ST = CFG::ST;
    constexpr uint32_t KV_BYTES = CFG::KV_BYTES, Q_BYTES = CFG::Q_BYTES, ROW_BYTES = CFG::ROW_BYTES,
                       DS_BYTES = CFG::DS_BYTES;
    const fp_sm80_args &a = prm.a;

    extern __shared__ unsigned char fp_smem_raw[];
    const uint32_t raw = fp_smem_addr(fp_smem_raw);
    const uint32_t sk = (raw + 1023u) & ~1023u;
    unsigned char *const gbase = fp_smem_raw + (sk - raw); /* generic pointer to sk */
    const uint32_t sv = sk + KV_BYTES, sq = sv + KV_BYTES, sdo = sq + ST * Q_BYTES;
    constexpr int DQB = CFG::DQB;
    constexpr uint32_t DQ_BYTES = CFG::DQ_BYTES;
    const uint32_t sds = sdo + ST * Q_BYTES, sdq = sds + 2 * DS_BYTES;
    const uint32_t srow = sdq + DQB * DQ_BYTES;
    const uint32_t sflags = srow + 2 * ST * ROW_BYTES; /* K's row flags, then each stage's */
    uint8_t *const kflag = gbase + (sflags - sk);
    unsigned *const guard = reinterpret_cast<unsigned *>(kflag + BN + ST * 2 * BM);
    const fp_sm90b_bars<CFG> bars(sflags + BN + ST * 2 * BM + 4 * FP_SM90B_GUARD_WORDS);
    /* LSE2 and Dsum of stage s */
    auto lse_of = [&](int s) {
        return reinterpret_cast<const float *>(gbase + (srow - sk) + s * ROW_BYTES);
    };
    auto dsum_of = [&](int s) {
        return reinterpret_cast<const float *>(gbase + (srow - sk) + (ST + s) * ROW_BYTES);
    };

    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127;
    fp_sm90b_work wk;
    if (!fp_sm90b_work_of<BM, BN>(a, wk))
        return;
    const int kb = wk.kb, b = wk.b, kvh = wk.kvh, split = wk.split;
    const int h_first = wk.h_first, n0 = wk.n0, mb_lo = wk.mb_lo, mb_end = wk.mb_end;
    const int steps = wk.steps;
    const fp_cuda_seq seq = wk.seq;
    const int nq = seq.nq, nk = seq.nk;

    if (tid == 0) {
        for (int i = 0; i < FP_SM90B_GUARD_WORDS; ++i)
            guard[i] = 0u;
        fp_mbar_init(bars.kv, 1);
        bars.stage.init(1, FP_SM90B_CONSUMER_THREADS);
        bars.dq.init(FP_SM90B_CONSUMER_THREADS, 1);
        fp_mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {
        /* ---- producer warpgroup: thread 0 issues every load, thread 32 writes dQ ---- */
        /* the 168 registers a thread starts with: 128 x (168 - 24) given up, 256 x (240 - 168)
         * taken */
        fp_setmaxnreg_dec<24>();
        if (wtid == 32 && steps > 0)
            fp_sm90_bwd_dq_writer<CFG>(prm, sdq, bars, b, kb, h_first, mb_lo, mb_end, steps, nq,
                                       nk);
        if (wtid == 0 && steps > 0) {
            fp_tma_prefetch_desc(&prm.tq);
            fp_tma_prefetch_desc(&prm.tdo);
            /* varlen maps are (D, packed tokens, heads, 1): the batch coordinate is 0 */
            fp_sm90_bwd_loader<CFG>(prm, sk, sv, sq, sdo, srow, bars, b, a.cu_q ? 0 : b,
                                    (int)seq.k_start + n0, kvh, seq.q_start, h_first, mb_lo, mb_end,
                                    steps);
        }
        return;
    }

    /* ---- consumers: warpgroup w owns keys 64 w .. 64 w + 63 of the block ---- */
    fp_setmaxnreg_inc<240>();
    const int w = wg - 1, warp = wtid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int kr = 64 * w + 16 * warp + g; /* this thread's keys: n0 + kr, n0 + kr + 8 */
    const uint32_t k_rows = sk + 64 * w * 128, v_rows = sv + 64 * w * 128;

    float dv[DK / 2], dk[DK / 2];
#pragma unroll
    for (int i = 0; i < DK / 2; ++i)
        dv[i] = dk[i] = 0.0f;

    if (steps > 0) {
        const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);
        fp_mbar_wait(bars.kv, 0);
        /* The guard's K part, once per block: dQ = dS K would meet a non-finite K element with
         * the masked zeros of dS, so if the K tile holds one, every K row is scrubbed and flagged
         * in kflag before the first product reads K; the steps then select with kflag (the
         * guard's K word says so: read each step from shared memory, as a register held over
         * the loop made ptxas spill in the softcap / ALiBi branch at D = 64). */
        const int ct = tid - 128;
        if (fp_sm90b_k_suspect<T, BN, DK>(gbase, guard, ct))
            fp_sm90b_scrub_k<T, BN, DK>(gbase, kflag, ct);
        /* The steps' P^T = exp2(S^T scale log2(e) - LSE2) over sacc (once S^T has landed) and
         * dS^T = P^T (dP^T - Dsum) over dpacc (once dP^T has: the two wgmma groups are waited for
         * in turn, so that the exp2s overlap the dP^T product); lse2, dsum: the step's rows */
        auto p_ds = [&](float(&sacc)[BM / 2], float(&dpacc)[BM / 2], const float *lse2,
                        const float *dsum) {
            fp_wgmma_wait<1>();
            fp_wgmma_fence_regs(sacc);
#pragma unroll
            for (int j = 0; j < BM / 8; ++j) {
                const float2 l = *reinterpret_cast<const float2 *>(lse2 + 8 * j + 2 * t);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    sacc[4 * j + 2 * r] = fp_exp2(fmaf(sacc[4 * j + 2 * r], a.scale_log2, -l.x));
                    sacc[4 * j + 2 * r + 1] =
                        fp_exp2(fmaf(sacc[4 * j + 2 * r + 1], a.scale_log2, -l.y));
                }
            }
            fp_wgmma_wait<0>();
            fp_wgmma_fence_regs(dpacc);
#pragma unroll
            for (int j = 0; j < BM / 8; ++j) {
                const float2 d = *reinterpret_cast<const float2 *>(dsum + 8 * j + 2 * t);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    dpacc[4 * j + 2 * r] = sacc[4 * j + 2 * r] * (dpacc[4 * j + 2 * r] - d.x);
                    dpacc[4 * j + 2 * r + 1] =
                        sacc[4 * j + 2 * r + 1] * (dpacc[4 * j + 2 * r + 1] - d.y);
                }
            }
        };
        /* the same with softcap / ALiBi: fp_sm90_softcap and the ALiBi bias per element, dS^T
         * times the softcap's derivative (rows from m0, query head hq) */
        auto p_ds_transform = [&](float(&sacc)[BM / 2], float(&dpacc)[BM / 2], const float *lse2,
                                  const float *dsum, int m0, int hq) {
            fp_wgmma_wait<0>();
            fp_wgmma_fence_regs(sacc);
            fp_wgmma_fence_regs(dpacc);
            const float slope = a.alibi ? a.alibi[hq] : 0.0f;
            const float cap_in = a.softcap > 0.0f ? 2.0f * FP_LOG2E / a.softcap : 0.0f;
#pragma unroll
            for (int j = 0; j < BM / 8; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int k = 4 * j + 2 * r + e, i = m0 + 8 * j + 2 * t + e;
                        float grad;
                        const float capped =
                            fp_sm90_softcap(sacc[k] * a.scale, a.softcap, cap_in, &grad);
                        const float p = fp_exp2(
                            (capped - slope * fp_alibi_distance(i, n0 + kr + 8 * r, nq, nk)) *
                                FP_LOG2E -
                            lse2[8 * j + 2 * t + e]);
                        sacc[k] = p;
                        dpacc[k] = p * (dpacc[k] - dsum[8 * j + 2 * t + e]) * grad;
                    }
        };
        int h = h_first, mb = mb_end - 1;
        for (int it = 0; it < steps; ++it) {
            const int s = it % ST, m0 = mb * BM;
            const uint32_t qs = sq + s * Q_BYTES, dos = sdo + s * Q_BYTES;
            float sacc[BM / 2], dpacc[BM / 2];

            /* Edge steps (pairs a row cannot see, or rows past the sequence) scrub the stage's Q
             * and dO rows for dK = dS^T Q and dV = P^T dO, when a row's LSE2 or
             * Dsum says it may hold a non-finite element (fp_rows_suspect) */
            fp_mbar_wait(bars.stage.full(s), (it / ST) & 1);
            const bool edge = m0 + BM > nq || !fp_mask_block_full(m0, min(m0 + BM, nq), n0, n0 + BN,
                                                                  nq, nk, a.left, a.right);
            uint8_t *const rflag = kflag + BN + s * 2 * BM; /* Q rows, then dO rows */
            bool rnew = false;                              /* this step flagged a Q or dO row */
            if (edge && fp_rows_suspect<BM>(lse_of(s), dsum_of(s)))
                rnew = fp_sm90b_scrub_rows<T, BM, DK>(gbase + (qs - sk), gbase + (dos - sk), rflag,
                                                      rflag + BM, guard, ct, 4 * w + warp);

            /* S^T = K Q^T and dP^T = V dO^T, issued together */
            fp_wgmma_fence();
            fp_wgmma_ss_abt<T, BM, DK / 16>(sacc, k_rows, BN * 128, qs, BM * 128);
            fp_wgmma_commit();
            fp_wgmma_ss_abt<T, BM, DK / 16>(dpacc, v_rows, BN * 128, dos, BM * 128);
            fp_wgmma_commit();

            /* P^T and dS^T: element 4 j + 2 r + e is key n0 + kr + 8 r, query m0 + 8 j + 2 t + e */
            const float *lse2 = lse_of(s), *dsum = dsum_of(s);
            if (!a.transform)
                p_ds(sacc, dpacc, lse2, dsum);
            else
                p_ds_transform(sacc, dpacc, lse2, dsum, m0, h);
            /* the mask, with the guard's selects where K or this step's rows had a flagged row */
            const bool kany = *(volatile unsigned *)(guard + FP_SM90B_GUARD_K) != 0u;
            if (kany || rnew) {
                const bool kbad[2] = {kany && kflag[kr] != 0, kany && kflag[kr + 8] != 0};
                fp_sm90b_mask_pairs<BM / 8>(sacc, dpacc, mk, nq, m0, 0, n0 + kr, t, kbad, rnew,
                                            rflag, rflag + BM);
            } else if (edge) {
                const bool clean[2] = {false, false};
                fp_sm90b_mask_pairs<BM / 8>(sacc, dpacc, mk, nq, m0, 0, n0 + kr, t, clean, false,
                                            rflag, rflag + BM);
            }

            /* dV += P^T dO, dK += dS^T Q */
            uint32_t pa[BM / 16][4], da[BM / 16][4];
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    pa[kk][q] = fp_pack2<T>(sacc[8 * kk + 2 * q], sacc[8 * kk + 2 * q + 1]);
                    da[kk][q] = fp_pack2<T>(dpacc[8 * kk + 2 * q], dpacc[8 * kk + 2 * q + 1]);
                }
            fp_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk)
                fp_wgmma<T, DK>::rs(dv, pa[kk], fp_wgmma_desc(dos + kk * 16 * 128, BM * 128, 1024));
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk)
                fp_wgmma<T, DK>::rs(dk, da[kk], fp_wgmma_desc(qs + kk * 16 * 128, BM * 128, 1024));
            fp_wgmma_commit();

            /* dS^T -> this step's dS buffer ([key][query], BM / 64 panels of BN rows); the
             * other buffer may still be read by the other warpgroup's previous dQ product */
            const uint32_t dsb = sds + (it & 1) * DS_BYTES;
            fp_sm90_bwd_store_ds<BM, BN>(gbase + (dsb - sk), da, kr, t);
            fp_fence_proxy_async_smem();
            fp_named_bar_sync(1, FP_SM90B_CONSUMER_THREADS);

            /* dQ = dS K: 64 rows x 64 columns of it per warpgroup */
            float dq[32];
            fp_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                const uint32_t a_off = (CFG::DQ_BY_ROWS ? w * BN * 128 : 0) + kk * 16 * 128;
                const uint32_t b_off = (CFG::DQ_BY_ROWS ? 0 : w * BN * 128) + kk * 16 * 128;
                fp_wgmma_ss_tt64<T>(dq, fp_wgmma_desc(dsb + a_off, BN * 128, 1024),
                                    fp_wgmma_desc(sk + b_off, BN * 128, 1024), kk > 0);
            }
            fp_wgmma_commit();
            fp_wgmma_wait<0>();
            fp_wgmma_fence_regs(dq);
            fp_wgmma_fence_regs(dv);
            fp_wgmma_fence_regs(dk);
            fp_fence_u32(pa);
            fp_fence_u32(da);
            fp_mbar_arrive(bars.stage.empty(s));

            /* dQ -> the shared tile of this step, in the accumulator's order (bands of 16 rows,
             * fp_dq_frag_off): element 4 j + 2 r + e is row 16 band + g + 8 r, column
             * c0 + 8 j + 2 t + e; then the writer warp's turn */
            const int u = it % DQB;
            fp_mbar_wait(bars.dq.empty(u), ((it / DQB) & 1) ^ 1);
            fp_sm90_bwd_stage_dq<CFG>(gbase + (sdq - sk) + u * DQ_BYTES, dq, w, warp, g, t);
            fp_fence_proxy_async_smem();
            fp_mbar_arrive(bars.dq.full(u));
            fp_bwd_prev_step(h, mb, mb_lo, mb_end);
        }
    }

    if (a.dkv_part) {
        fp_sm90b_dkv_part<DK, DK / 8>(a, dv, dk, split, b, kvh, n0 + kr, 0, t);
        return;
    }
    /* dK and dV staged in this warpgroup's rows of the K and V tiles (free once both
     * warpgroups' last dQ product, which reads all of K, has landed), then written */
    fp_named_bar_sync(1, FP_SM90B_CONSUMER_THREADS);
    fp_sm90b_dkv_stage<T, BN, DK / 8>(gbase, gbase + (sv - sk), dv, dk, a.scale, kr, 0, t);
    fp_named_bar_sync(2 + w, 128);
    fp_sm90b_dkv_write<T, BN, 64, DK / 8>(a, gbase, gbase + (sv - sk), 64 * w, 0, wtid, n0, nk, b,
                                          seq.k_start, kvh);
#endif
}

/* ---- host ---------------------------------------------------------------------------------- */

/* The side passes and the launch of a backward kernel of configuration CFG (DK, BN, BM, SMEM);
 * tiling: how the kernel splits its block, for the log. */
template <typename T, typename CFG>
static flashport_status fp_sm90_bwd_run(const fp_cuda_ctx *ctx, const fp_problem *p,
                                        const char *why, const char **declined, void *ws,
                                        size_t *query, void (*kernel)(const fp_sm90_bwd_params),
                                        const char *tiling)
{
    constexpr int DK = CFG::DK;
    fp_sm90_bwd_params prm;
    fp_sm80_args &a = prm.a;
    fp_sm80_fill_args(p, &a);
    /* the side passes' workspace (always with the dQ accumulator), then the turn counters of the
     * deterministic mode */
    const int splits =
        p->batch == 0 || p->heads == 0 ? 1 : fp_cuda_bwd_group_splits(ctx, p, CFG::BN);
    const size_t side = fp_cuda_bwd_side_setup(p, &a, DK, 1, splits, query ? NULL : ws);
    const size_t turns =
        side && p->deterministic ? (size_t)p->batch * p->heads * (a.nq_pad / CFG::BM) : 0;
    const size_t bytes = side ? fp_cuda_ws_round(side) + turns * sizeof(int) : 0;
    prm.dq_turn = turns && !query ? (int *)((char *)ws + fp_cuda_ws_round(side)) : NULL;
    if (query)
        *query = bytes;
    const int64_t bq = p->varlen ? 1 : p->batch;
    const int64_t tq = p->varlen ? p->total_q : p->seqlen_q;
    const int64_t tk = p->varlen ? p->total_k : p->seqlen_k;
    if (!fp_sm90_tmap(ctx, &prm.tq, p->q, p->dtype, p->head_dim, tq, p->heads, bq, CFG::BM,
                      declined) ||
        !fp_sm90_tmap(ctx, &prm.tdo, p->dout, p->dtype, p->head_dim, tq, p->heads, bq, CFG::BM,
                      declined) ||
        !fp_sm90_tmap(ctx, &prm.tk, p->k, p->dtype, p->head_dim, tk, p->kv_heads, bq, CFG::BN,
                      declined) ||
        !fp_sm90_tmap(ctx, &prm.tv, p->v, p->dtype, p->head_dim, tk, p->kv_heads, bq, CFG::BN,
                      declined))
        return FLASHPORT_OK;
    if (query || bytes == 0)
        return FLASHPORT_OK;

    const cudaStream_t stream = ctx->stream;
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)CFG::SMEM);
    if (e == cudaSuccess && prm.dq_turn)
        e = cudaMemsetAsync(prm.dq_turn, 0, turns * sizeof(int), stream);
    if (e == cudaSuccess)
        e = fp_cuda_bwd_side_pre(p, a, DK, stream);
    const dim3 grid((unsigned)((a.nk + CFG::BN - 1) / CFG::BN),
                    (unsigned)(p->kv_heads * a.group_splits), (unsigned)p->batch);
    if (e == cudaSuccess && grid.x > 0) {
        kernel<<<grid, FP_SM90B_THREADS, CFG::SMEM, stream>>>(prm);
        e = cudaGetLastError();
    }
    fp_cuda_log("backward: sm90 D%d kernel (TMA + wgmma, BN %d, BM %d, %s, dQ by bulk "
                "reductions%s) for D=%lld, grid %ux%ux%u, group of %d query heads in %d "
                "split(s); %s",
                DK, CFG::BN, CFG::BM, tiling, prm.dq_turn ? " in key-block order" : "",
                (long long)p->head_dim, grid.x, grid.y, grid.z, a.group, a.group_splits, why);
    if (e == cudaSuccess)
        e = fp_cuda_bwd_side_dkdv_sum(p, a, DK, stream);
    if (e == cudaSuccess)
        e = fp_cuda_bwd_side_dq(p, a, DK, stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "sm90 backward kernel launch");
    }
    return FLASHPORT_OK;
}

/* The launch of head dim DK's kernel (fp_sm90_bwd_cfg<DK>; head dim 256: sm90/bwd256.cuh). */
template <typename T, int DK>
flashport_status fp_sm90_bwd_family<T, DK>::run(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                const char *why, const char **declined, void *ws,
                                                size_t *query)
{
    if constexpr (DK == 256)
        return fp_sm90_bwd256_run<T>(ctx, p, why, declined, ws, query);
    else
        return fp_sm90_bwd_run<T, fp_sm90_bwd_cfg<DK>>(
            ctx, p, why, declined, ws, query, fp_sm90_bwd_kernel<T, fp_sm90_bwd_cfg<DK>>,
            "2 stages, 2 consumer warpgroups of 64 keys");
}

#endif /* FLASHPORT_BACKENDS_CUDA_SM90_BWD_CUH */
