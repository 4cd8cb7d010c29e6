/*
 * Flash attention backward, sm90 path, head dims 129 .. 256 (kernel head dim 256).
 *
 * The algorithm and the producer warpgroup are sm90/bwd.cuh's (P recomputed from the
 * forward's LSE, the side passes for LSE2 / Dsum and the dQ conversion, dQ added to the f32
 * accumulator by the producer's writer thread with bulk reductions, the deterministic mode's
 * turns, the masked-key guard). What differs is how the two consumer warpgroups share a key
 * block, since two 256-column f32 accumulators (dK, dV) of 64 keys do not fit one warpgroup's
 * registers:
 *   - a block holds BN = 64 keys, and both warpgroups work on all 64: warpgroup w owns columns
 *     128 w .. 128 w + 127 of dK and dV (64 + 64 registers a thread);
 *   - per step (query head, query block of BM = 64 rows), warpgroup w computes S^T = K Q^T and
 *     dP^T = V dO^T for its 32 queries (32 w .. 32 w + 31; m64n32, K and V from shared memory),
 *     then P^T and dS^T for them in registers;
 *   - dV += P^T dO and dK += dS^T Q over its own 32 queries with P^T and dS^T as register
 *     operands, and over the other warpgroup's 32 from shared memory: each warpgroup stores its
 *     half of P^T and dS^T ([key][query], two buffers each by step parity) and one barrier
 *     between the warpgroups a step makes the other half readable;
 *   - dQ = dS K (dS from the shared dS^T buffer, both operands MN-major): warpgroup w computes
 *     columns 128 w .. 128 w + 127 in two m64n64 pieces, each staged in shared memory in the
 *     accumulator's order and added by the writer thread as four 4 KiB bulk reductions (one
 *     per band of 16 rows).
 * Q and LSE2 have STQ = 2 stages, dO and Dsum STO = 1 (what 227 KiB hold): the dO load of step
 * i + 1 runs under step i's dQ products. (Issuing S^T before waiting for dO made ptxas serialize
 * the wgmma instructions, warning C7520.)
 *
 * Masked-key guard: as in bwd.cuh (K looked at once before the first step, the guard's state in
 * shared memory), except that the edge steps' Q and dO scrub runs once both warpgroups' S^T and
 * dP^T products are done with the tiles.
 *
 * Configuration: fp_sm90_bwd256_cfg (sm90/bwd_config.cuh). Differences from the reference: as
 * bwd.cuh's. Numbers: docs/performance.md.
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM90_BWD256_CUH
#define FLASHPORT_BACKENDS_CUDA_SM90_BWD256_CUH

#include "backends/cuda/sm90/bwd.cuh"

/* The block's mbarriers (fp_sm90_bwd256_cfg::NBARS), 8 bytes each from shared address base: K and
 * V landed (kv); Q stage s full (its Q and LSE2 landed) and empty (both consumer warpgroups done
 * with it); the same for the dO stages (dO and Dsum); dQ piece w full (written by consumer
 * warpgroup w) and empty (added to the accumulator by the writer). */
struct fp_sm90b2_bars {
    uint32_t kv;
    fp_mbar_ring<fp_sm90_bwd256_cfg::STQ> q;
    fp_mbar_ring<fp_sm90_bwd256_cfg::STO> o;
    fp_mbar_ring<2> dq;
    __device__ __forceinline__ explicit fp_sm90b2_bars(uint32_t base)
        : kv(base), q{base + 8u}, o{q.end()}, dq{o.end()}
    {
    }
};

/* Step it's load into its stage of `ring` (it % N), once both consumer warpgroups have freed it:
 * the tile of rows q_row .. of head h from the TMA map (64-column panels) to `tile`, and the
 * rows' floats from src to `rows` (bulk copy). */
template <int N>
FP_DEV void fp_sm90_bwd256_load_stage(const fp_mbar_ring<N> &ring, int it, uint32_t tile,
                                      const CUtensorMap *map, uint32_t rows, const float *src,
                                      int q_row, int h, int cb)
{
    using CFG = fp_sm90_bwd256_cfg;
    const int s = it % N;
    fp_mbar_wait(ring.empty(s), ((it / N) & 1) ^ 1);
    fp_mbar_arrive_expect_tx(ring.full(s), CFG::Q_BYTES + CFG::ROW_BYTES);
#pragma unroll
    for (int p = 0; p < CFG::DK / 64; ++p)
        fp_tma_load_4d(tile + s * CFG::Q_BYTES + p * CFG::BM * 128, map, ring.full(s), 64 * p,
                       q_row, h, cb);
    fp_bulk_load(rows + s * CFG::ROW_BYTES, src, CFG::ROW_BYTES, ring.full(s));
}

/* The loader (producer thread 0): K and V once, then per step the Q tile and its rows' LSE2
 * into Q stage it % STQ, and the dO tile and its rows' Dsum into dO stage it % STO. */
FP_DEV void fp_sm90_bwd256_loader(const fp_sm90_bwd_params &prm, uint32_t sk, uint32_t sv,
                                  uint32_t sq, uint32_t sdo, uint32_t slse, uint32_t sdsum,
                                  fp_sm90b2_bars bars, int b, int cb, int k_row, int kvh,
                                  int64_t q_start, int h_first, int mb_lo, int mb_end, int steps)
{
    using CFG = fp_sm90_bwd256_cfg;
    constexpr int BM = CFG::BM, BN = CFG::BN, NP = CFG::DK / 64;
    const fp_sm80_args &a = prm.a;
    fp_mbar_arrive_expect_tx(bars.kv, 2 * CFG::KV_BYTES);
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        fp_tma_load_4d(sk + p * BN * 128, &prm.tk, bars.kv, 64 * p, k_row, kvh, cb);
        fp_tma_load_4d(sv + p * BN * 128, &prm.tv, bars.kv, 64 * p, k_row, kvh, cb);
    }
    int h = h_first, mb = mb_end - 1;
    for (int it = 0; it < steps; ++it) {
        const int q_row = (int)q_start + mb * BM;
        const int64_t w = fp_bwd_ws_row(a, b, h, (int64_t)mb * BM);
        fp_sm90_bwd256_load_stage(bars.q, it, sq, &prm.tq, slse, a.ws_lse2 + w, q_row, h, cb);
        fp_sm90_bwd256_load_stage(bars.o, it, sdo, &prm.tdo, sdsum, a.ws_dsum + w, q_row, h, cb);
        fp_bwd_prev_step(h, mb, mb_lo, mb_end);
    }
}

/* The dQ writer (producer thread 32): per step, two pieces of 64 columns from each consumer
 * warpgroup (piece p of warpgroup w: columns 128 w + 64 p ..), each four bands of 16 rows
 * that are contiguous 4 KiB runs of the accumulator. Deterministic mode: the step's turn is
 * taken before its first addition and passed on once all eight have completed. */
FP_DEV void fp_sm90_bwd256_dq_writer(const fp_sm90_bwd_params &prm, uint32_t sdq,
                                     fp_sm90b2_bars bars, int b, int kb, int h_first, int mb_lo,
                                     int mb_end, int steps, int nq, int nk)
{
    using CFG = fp_sm90_bwd256_cfg;
    constexpr int BM = CFG::BM, BN = CFG::BN, DK = CFG::DK;
    const fp_sm80_args &a = prm.a;
    int h = h_first, mb = mb_end - 1;
    for (int it = 0; it < steps; ++it) {
        const int m0 = mb * BM;
        float *const blk = a.dq_accum + fp_bwd_ws_row(a, b, h, m0) * DK;
        int *turn = NULL;
        if (prm.dq_turn) {
            turn = prm.dq_turn + ((int64_t)b * a.heads + h) * (a.nq_pad / BM) + mb;
            int kb_lo, kb_hi;
            fp_geom_key_blocks(m0, min(m0 + BM, nq), nq, nk, a.left, a.right, BN, &kb_lo, &kb_hi);
            while (fp_ld_acquire_gpu(turn) != kb - kb_lo) {
            }
            fp_fence_proxy_async_global();
        }
        for (int p = 0; p < 2; ++p)
            for (int w = 0; w < 2; ++w) {
                fp_mbar_wait(bars.dq.full(w), (2 * it + p) & 1);
                const int c0 = 128 * w + 64 * p;
#pragma unroll
                for (int band = 0; band < BM / 16; ++band)
                    fp_bulk_reduce_add_f32(blk + band * 16 * DK + (c0 / 8) * 128,
                                           sdq + w * CFG::PIECE_BYTES + band * 4096, 4096);
                fp_bulk_commit();
                fp_bulk_wait_read();
                fp_mbar_arrive(bars.dq.empty(w));
            }
        if (turn) {
            fp_bulk_wait();
            fp_fence_proxy_async_global();
            fp_red_release_gpu(turn, 1);
        }
        fp_bwd_prev_step(h, mb, mb_lo, mb_end);
    }
    fp_bulk_wait();
}

// q, dout, dq: (B, Nq, H, D); k, v, dk, dv: (B, Nk, Hkv, D); grid (key blocks, Hkv x splits, B).
template <typename T>
__global__ void __launch_bounds__(FP_SM90B_THREADS, 1)
    fp_sm90_bwd256_kernel(const __grid_constant__ fp_sm90_bwd_params prm)
{
#if FP_SM90_DEVICE
    using CFG = fp_sm90_bwd256_cfg;
    constexpr int BM = CFG::BM, BN = CFG::BN, DK = CFG::DK, STQ = CFG::STQ, STO = CFG::STO;
    constexpr uint32_t KV_BYTES = CFG::KV_BYTES, Q_BYTES = CFG::Q_BYTES, ROW_BYTES = CFG::ROW_BYTES,
                       PT_BYTES = CFG::PT_BYTES;
    const fp_sm80_args &a = prm.a;

    /* shared memory: K, V, the Q stages, the dO stages, P^T and dS^T (two buffers each), the
     * two dQ pieces, LSE2 of the Q stages, Dsum of the dO stages, the guard's flags and
     * counter, the barriers */
    extern __shared__ unsigned char fp_smem_raw[];
    const uint32_t raw = fp_smem_addr(fp_smem_raw);
    const uint32_t sk = (raw + 1023u) & ~1023u;
    unsigned char *const gbase = fp_smem_raw + (sk - raw); /* generic pointer to sk */
    const uint32_t sv = sk + KV_BYTES, sq = sv + KV_BYTES, sdo = sq + STQ * Q_BYTES;
    const uint32_t spt = sdo + STO * Q_BYTES, sds = spt + 2 * PT_BYTES;
    const uint32_t sdq = sds + 2 * PT_BYTES, slse = sdq + 2 * CFG::PIECE_BYTES;
    const uint32_t sdsum = slse + STQ * ROW_BYTES, sflags = sdsum + STO * ROW_BYTES;
    uint8_t *const kflag = gbase + (sflags - sk); /* [BN] */
    uint8_t *const qflag = kflag + BN;            /* [STQ][BM] */
    uint8_t *const oflag = qflag + STQ * BM;      /* [STO][BM] */
    unsigned *const guard = reinterpret_cast<unsigned *>(oflag + STO * BM);
    const fp_sm90b2_bars bars(sflags + CFG::FLAG_BYTES);
    auto smem_f = [&](uint32_t addr) { return reinterpret_cast<float *>(gbase + (addr - sk)); };

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
        bars.q.init(1, FP_SM90B_CONSUMER_THREADS);
        bars.o.init(1, FP_SM90B_CONSUMER_THREADS);
        bars.dq.init(128, 1); /* dQ piece w: full when its warpgroup has written it */
        fp_mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) {
        /* ---- producer warpgroup: thread 0 loads, thread 32 writes dQ ---- */
        fp_setmaxnreg_dec<24>();
        if (wtid == 32 && steps > 0)
            fp_sm90_bwd256_dq_writer(prm, sdq, bars, b, kb, h_first, mb_lo, mb_end, steps, nq, nk);
        if (wtid == 0 && steps > 0) {
            fp_tma_prefetch_desc(&prm.tq);
            fp_tma_prefetch_desc(&prm.tdo);
            fp_sm90_bwd256_loader(prm, sk, sv, sq, sdo, slse, sdsum, bars, b, a.cu_q ? 0 : b,
                                  (int)seq.k_start + n0, kvh, seq.q_start, h_first, mb_lo, mb_end,
                                  steps);
        }
        return;
    }

    /* ---- consumers: all 64 keys; warpgroup w owns dK / dV columns 128 w .., queries 32 w ..
     * of each step's S^T and dP^T ---- */
    fp_setmaxnreg_inc<240>();
    const int w = wg - 1, warp = wtid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int kr = 16 * warp + g; /* this thread's keys: n0 + kr, n0 + kr + 8 */
    const int qw = 32 * w;        /* this warpgroup's first query of a step */

    float dv[64], dk[64];
#pragma unroll
    for (int i = 0; i < 64; ++i)
        dv[i] = dk[i] = 0.0f;

    if (steps > 0) {
        const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);
        fp_mbar_wait(bars.kv, 0);
        /* The guard's K part, once per block, as in bwd.cuh */
        const int ct = tid - 128;
        if (fp_sm90b_k_suspect<T, BN, DK>(gbase, guard, ct))
            fp_sm90b_scrub_k<T, BN, DK>(gbase, kflag, ct);
        int h = h_first, mb = mb_end - 1;
        for (int it = 0; it < steps; ++it) {
            const int sqi = it % STQ, soi = it % STO, m0 = mb * BM;
            const uint32_t qs = sq + sqi * Q_BYTES, dos = sdo + soi * Q_BYTES;
            const float *const lse2 = smem_f(slse + sqi * ROW_BYTES);
            const float *const dsum = smem_f(sdsum + soi * ROW_BYTES);
            float sacc[16], dpacc[16];

            /* S^T = K Q^T and dP^T = V dO^T, this warpgroup's 32 queries (m64n32, both operands
             * K-major) */
            fp_mbar_wait(bars.q.full(sqi), (it / STQ) & 1);
            fp_mbar_wait(bars.o.full(soi), (it / STO) & 1);
            fp_wgmma_fence();
            fp_wgmma_ss_abt<T, 32, DK / 16>(sacc, sk, BN * 128, qs + qw * 128, BM * 128);
            fp_wgmma_commit();
            fp_wgmma_ss_abt<T, 32, DK / 16>(dpacc, sv, BN * 128, dos + qw * 128, BM * 128);
            fp_wgmma_commit();

            /* P^T and dS^T: element 4 j + 2 r + e is key n0 + kr + 8 r, query
             * m0 + qw + 8 j + 2 t + e */
            if (!a.transform) {
                fp_wgmma_wait<1>();
                fp_wgmma_fence_regs(sacc);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float2 l = *reinterpret_cast<const float2 *>(lse2 + qw + 8 * j + 2 * t);
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        sacc[4 * j + 2 * r] =
                            fp_exp2(fmaf(sacc[4 * j + 2 * r], a.scale_log2, -l.x));
                        sacc[4 * j + 2 * r + 1] =
                            fp_exp2(fmaf(sacc[4 * j + 2 * r + 1], a.scale_log2, -l.y));
                    }
                }
                fp_wgmma_wait<0>();
                fp_wgmma_fence_regs(dpacc);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float2 d = *reinterpret_cast<const float2 *>(dsum + qw + 8 * j + 2 * t);
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        dpacc[4 * j + 2 * r] = sacc[4 * j + 2 * r] * (dpacc[4 * j + 2 * r] - d.x);
                        dpacc[4 * j + 2 * r + 1] =
                            sacc[4 * j + 2 * r + 1] * (dpacc[4 * j + 2 * r + 1] - d.y);
                    }
                }
            } else {
                fp_wgmma_wait<0>();
                fp_wgmma_fence_regs(sacc);
                fp_wgmma_fence_regs(dpacc);
                const float slope = a.alibi ? a.alibi[h] : 0.0f;
                const float cap_in = a.softcap > 0.0f ? 2.0f * FP_LOG2E / a.softcap : 0.0f;
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int r = 0; r < 2; ++r)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int k = 4 * j + 2 * r + e, c = qw + 8 * j + 2 * t + e;
                            float grad;
                            const float capped =
                                fp_sm90_softcap(sacc[k] * a.scale, a.softcap, cap_in, &grad);
                            const float p =
                                fp_exp2((capped - slope * fp_alibi_distance(m0 + c, n0 + kr + 8 * r,
                                                                            nq, nk)) *
                                            FP_LOG2E -
                                        lse2[c]);
                            sacc[k] = p;
                            dpacc[k] = p * (dpacc[k] - dsum[c]) * grad;
                        }
            }

            /* Edge steps scrub Q and dO rows that may hold a non-finite element (as in
             * bwd.cuh), once both warpgroups' products are done with the tiles */
            const bool edge = m0 + BM > nq || !fp_mask_block_full(m0, min(m0 + BM, nq), n0, n0 + BN,
                                                                  nq, nk, a.left, a.right);
            uint8_t *const qf = qflag + sqi * BM, *const of = oflag + soi * BM;
            bool rnew = false;
            if (edge && fp_rows_suspect<BM>(lse2, dsum)) {
                fp_named_bar_sync(1, FP_SM90B_CONSUMER_THREADS);
                rnew = fp_sm90b_scrub_rows<T, BM, DK>(gbase + (qs - sk), gbase + (dos - sk), qf, of,
                                                      guard, ct, 4 * w + warp);
            }
            /* the mask, with the guard's selects where K or this step's rows had a flagged row */
            const bool kany = *(volatile unsigned *)(guard + FP_SM90B_GUARD_K) != 0u;
            if (kany || rnew) {
                const bool kbad[2] = {kany && kflag[kr] != 0, kany && kflag[kr + 8] != 0};
                fp_sm90b_mask_pairs<4>(sacc, dpacc, mk, nq, m0, qw, n0 + kr, t, kbad, rnew, qf, of);
            } else if (edge) {
                const bool clean[2] = {false, false};
                fp_sm90b_mask_pairs<4>(sacc, dpacc, mk, nq, m0, qw, n0 + kr, t, clean, false, qf,
                                       of);
            }

            /* this warpgroup's 32 queries of P^T and dS^T: wgmma A fragments (two k steps),
             * and into this step's buffers ([key][query], one 64 x 64 panel) */
            uint32_t pa[2][4], da[2][4];
#pragma unroll
            for (int kk = 0; kk < 2; ++kk)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    pa[kk][q] = fp_pack2<T>(sacc[8 * kk + 2 * q], sacc[8 * kk + 2 * q + 1]);
                    da[kk][q] = fp_pack2<T>(dpacc[8 * kk + 2 * q], dpacc[8 * kk + 2 * q + 1]);
                }
            const uint32_t ptb = spt + (it & 1) * PT_BYTES, dsb = sds + (it & 1) * PT_BYTES;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint32_t off = fp_swz128<BN>(kr + 8 * r, qw + 8 * j + 2 * t);
                    *reinterpret_cast<uint32_t *>(gbase + (ptb - sk) + off) =
                        pa[j / 2][2 * (j % 2) + r];
                    *reinterpret_cast<uint32_t *>(gbase + (dsb - sk) + off) =
                        da[j / 2][2 * (j % 2) + r];
                }
            fp_fence_proxy_async_smem();

            /* dV += P^T dO and dK += dS^T Q over this warpgroup's queries (A from registers,
             * B = dO / Q columns 128 w .., MN-major) */
            const uint32_t dcol = 2 * w * BM * 128; /* panel 2 w of a Q / dO tile */
            fp_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 2; ++kk)
                fp_wgmma<T, 128>::rs(
                    dv, pa[kk], fp_wgmma_desc(dos + dcol + (qw + 16 * kk) * 128, BM * 128, 1024));
#pragma unroll
            for (int kk = 0; kk < 2; ++kk)
                fp_wgmma<T, 128>::rs(
                    dk, da[kk], fp_wgmma_desc(qs + dcol + (qw + 16 * kk) * 128, BM * 128, 1024));
            fp_wgmma_commit();

            /* the other warpgroup's half of P^T and dS^T is in the buffers after this */
            fp_named_bar_sync(1, FP_SM90B_CONSUMER_THREADS);
            const int qo = BM / 2 - qw; /* the other warpgroup's first query */
            fp_wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                const int q16 = qo / 16 + kk; /* k step of 16 queries */
                fp_wgmma_ss_bt128<T>(dv, fp_wgmma_desc(ptb + q16 * 32, 16, 1024),
                                     fp_wgmma_desc(dos + dcol + 16 * q16 * 128, BM * 128, 1024), 1);
                fp_wgmma_ss_bt128<T>(dk, fp_wgmma_desc(dsb + q16 * 32, 16, 1024),
                                     fp_wgmma_desc(qs + dcol + 16 * q16 * 128, BM * 128, 1024), 1);
            }
            fp_wgmma_commit();

            /* dQ = dS K, columns 128 w + 64 p .. in two m64n64 pieces (dS from the dS^T buffer
             * and K, both MN-major); each piece staged in the accumulator's order (bands of 16
             * rows, fp_dq_frag_off) for the writer */
            float *const piece = smem_f(sdq + w * CFG::PIECE_BYTES);
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                float dq[32];
                fp_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BN / 16; ++kk)
                    fp_wgmma_ss_tt64<T>(
                        dq, fp_wgmma_desc(dsb + kk * 16 * 128, BN * 128, 1024),
                        fp_wgmma_desc(sk + (2 * w + p) * BN * 128 + kk * 16 * 128, BN * 128, 1024),
                        kk > 0);
                fp_wgmma_commit();
                fp_wgmma_wait<0>();
                fp_wgmma_fence_regs(dq);
                if (p == 0) {
                    /* every product reading this step's Q and dO stages has landed */
                    fp_wgmma_fence_regs(dv);
                    fp_wgmma_fence_regs(dk);
                    fp_fence_u32(pa);
                    fp_fence_u32(da);
                    fp_mbar_arrive(bars.q.empty(sqi));
                    fp_mbar_arrive(bars.o.empty(soi));
                }
                fp_mbar_wait(bars.dq.empty(w), ((2 * it + p) & 1) ^ 1);
                float *const band = piece + warp * 1024;
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int r = 0; r < 2; ++r)
                        *reinterpret_cast<float2 *>(band +
                                                    fp_dq_frag_off(g + 8 * r, 8 * j + 2 * t)) =
                            make_float2(dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
                fp_fence_proxy_async_smem();
                fp_mbar_arrive(bars.dq.full(w));
            }
            fp_bwd_prev_step(h, mb, mb_lo, mb_end);
        }
    }

    if (a.dkv_part) {
        fp_sm90b_dkv_part<DK, 16>(a, dv, dk, split, b, kvh, n0 + kr, 128 * w, t);
        return;
    }
    /* dK and dV staged in this warpgroup's column panels of the K and V tiles once both
     * warpgroups' products are done with them, then written */
    fp_named_bar_sync(1, FP_SM90B_CONSUMER_THREADS);
    fp_sm90b_dkv_stage<T, BN, 16>(gbase, gbase + (sv - sk), dv, dk, a.scale, kr, 128 * w, t);
    fp_named_bar_sync(2 + w, 128);
    fp_sm90b_dkv_write<T, BN, BN, 16>(a, gbase, gbase + (sv - sk), 0, 16 * w, wtid, n0, nk, b,
                                      seq.k_start, kvh);
#endif
}

/* ---- host ---------------------------------------------------------------------------------- */

template <typename T>
flashport_status fp_sm90_bwd256_run(const fp_cuda_ctx *ctx, const fp_problem *p, const char *why,
                                    const char **declined, void *ws, size_t *query)
{
    return fp_sm90_bwd_run<T, fp_sm90_bwd256_cfg>(
        ctx, p, why, declined, ws, query, fp_sm90_bwd256_kernel<T>,
        "2 Q / 1 dO stages, 2 consumer warpgroups of 128 dK / dV columns");
}

#endif /* FLASHPORT_BACKENDS_CUDA_SM90_BWD256_CUH */
