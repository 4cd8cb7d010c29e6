/*
 * Decode forward: few query rows per kv head against a long (dense or paged) KV cache; every
 * CUDA device from compute capability 8.0 (mma.sync + ldmatrix + cp.async, ptx/sm80.cuh).
 *
 * Algorithm. Decode is bound by the bytes of K and V, so the kernel is built to read each of
 * them once and keep many reads in flight:
 *   - GQA packing: the rows of a query tile are (token, query head) pairs of one kv head, token
 *     major (row r is token r / G, head kvh * G + r % G, G = H / Hkv), so the G heads that share
 *     a kv head read its K and V once. A block holds MT row tiles of 16 rows (one mma M each):
 *     MT = 2 where G * Nq > 16 and D <= 128 (MQA's 32 heads, 8 tokens of a 4-head group), so
 *     the block reads K and V once for both; more rows take more blocks, numbered fastest in
 *     the grid so that they run side by side and their second reads of K and V hit L2. Any Nq
 *     works (chunked prefill on a paged cache).
 *   - Each of the NW warps of a block computes WM of its MT row tiles (all of them, or one) over
 *     one key group of 16 keys: the KG warps that share a row tile split each key block of
 *     BN = 16 KG keys, each keeping its own online-softmax state and O, and merge through
 *     shared memory at the end (fp_softmax_merge's rule, in log2 units). With one tile a warp,
 *     the MT warps of a key group read the same K / V fragments from shared memory; with two,
 *     each fragment a warp loads feeds both tiles, at twice the accumulators.
 *   - K and V stream through ST shared-memory stages as cp.async groups, ST - 1 key blocks
 *     ahead; small tiles let two or three blocks share an SM, which keeps more reads in flight.
 *   - Split-KV from core/plan.c's fp_plan_decode (the SM count, the blocks an SM holds, the
 *     cache length), merged by the sm80 path's combine kernel (fp_cuda_fwd_combine).
 *   - Paged caches: key t of sequence b is row t % page_size of page block_table[b, t /
 *     page_size]. page_size is a multiple of 16, so each warp's 16 keys lie in one page; the
 *     block-table entries of a key block are fetched one key block before its copies are
 *     issued. An entry outside [0, num_pages) is never dereferenced: its rows are zero-filled
 *     and the warp masks its scores (the keys count as masked, include/flashport.h).
 *   - seqused_k: each sequence's key count (fp_cuda_seq_of), which the bottom-right mask uses.
 *
 * Masking, softcap and ALiBi per element (fp_mask32, fp_score_transform), online softmax through
 * fp_softmax_update_exp2 / fp_softmax_exp_base (core/online_softmax.h) with the forward kernels'
 * lazy rescale (FP_RESCALE_SLACK; without it every key block multiplies all of a thread's O
 * elements, 64 at DK = 128), finalize through fp_cuda_out_scale /
 * fp_cuda_lse_exp2.
 *
 * Configurations (head dim DK of the kernel: D <= 64, <= 128, <= 256 with the extra columns
 * zero-filled; fp_dec_cfg): DK 64: 4 warps, BN 64, 4 stages, MT 1 or 2 with every warp on
 * all tiles (66 / 68 KiB); DK 128, MT 1: 4 warps, BN 64, 2 stages (68 KiB); DK 128, MT 2: 4
 * warps of one tile each, BN 32, 3 stages (56 KiB); DK 256: 2 warps, BN 32, 2 stages (72 KiB).
 * All fit the 99 KiB of sm_86/89.
 *
 * Differences from the reference: P is rounded to f16/bf16 before P V; exp2, 1/l and log2 are
 * the hardware approximations. Numbers: docs/performance.md#decode-h200.
 *
 * This header holds the kernel and its launch (fp_decode_fwd_family, sm80/common.cuh); one file
 * per head dim instantiates them (decode/inst/fwd_d64.cu, fwd_d128.cu, fwd_d256.cu), the
 * launcher is decode/fwd.cu.
 */
#ifndef FLASHPORT_BACKENDS_CUDA_DECODE_FWD_CUH
#define FLASHPORT_BACKENDS_CUDA_DECODE_FWD_CUH

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/sm80/common.cuh"

#include "core/plan.h"
#include "core/problem.h"

#include <math.h>
#include <stdlib.h>

enum { FP_DEC_BM = 16 };

/* A configuration per head-dim class DK and row tiles MT (a block holds MT tiles of 16 rows,
 * so a group of up to 16 MT rows reads its kv head once; MT = 2 only for DK <= 128): NW warps,
 * each computing WM of the MT row tiles over one key group of 16 keys; the warps that share a
 * row tile (KG of them) split each key block of BN = 16 KG keys, and TG = MT / WM warps share a
 * key group (each K / V fragment a warp loads from shared memory feeds its WM tiles). ST stages.
 * Two tiles a warp (WM = 2) need about 240 registers a thread at DK = 128, which leaves an SM
 * eight warps (two a block); one tile a warp keeps the one-tile kernel's registers, three
 * blocks of four warps an SM, whose issue slots the softmax and the products then fill. */
template <int DK, int MT, int NW_, int WM_, int ST_> struct fp_dec_cfg_of {
    enum { NW = NW_, WM = WM_, ST = ST_, TG = MT / WM, KG = NW / TG, BN = 16 * KG };
    static_assert(MT % WM == 0 && NW % TG == 0, "warps cover the row tiles evenly");
};
template <int DK, int MT> struct fp_dec_cfg;
template <int MT> struct fp_dec_cfg<64, MT> : fp_dec_cfg_of<64, MT, 4, MT, 4> {
};
template <> struct fp_dec_cfg<128, 1> : fp_dec_cfg_of<128, 1, 4, 1, 2> {
};
template <> struct fp_dec_cfg<128, 2> : fp_dec_cfg_of<128, 2, 4, 1, 3> {
};
template <> struct fp_dec_cfg<256, 1> : fp_dec_cfg_of<256, 1, 2, 1, 2> {
};
template <int DK> constexpr int fp_dec_max_mt()
{
    return DK <= 128 ? 2 : 1;
}

/* Shared memory: the Q tile (16 MT rows), ST stages of K and V; the warps' merge reuses the K / V
 * stages, one 16-row tile at a time. */
template <int DK, int MT> constexpr size_t fp_dec_q_bytes()
{
    return (size_t)FP_DEC_BM * MT * DK * 2;
}
template <int DK, int MT> constexpr size_t fp_dec_smem()
{
    using C = fp_dec_cfg<DK, MT>;
    return fp_dec_q_bytes<DK, MT>() + (size_t)2 * C::ST * C::BN * DK * 2;
}
template <int DK, int MT> constexpr bool fp_dec_fits()
{
    using C = fp_dec_cfg<DK, MT>;
    return fp_dec_smem<DK, MT>() <= 99 * 1024 && /* the smallest sm_8x shared memory */
           (size_t)C::NW * FP_DEC_BM * (DK + 2) * 4 <= (size_t)2 * C::ST * C::BN * DK * 2;
}
static_assert(fp_dec_fits<64, 1>() && fp_dec_fits<64, 2>() && fp_dec_fits<128, 1>() &&
                  fp_dec_fits<128, 2>() && fp_dec_fits<256, 1>(),
              "decode tiles fit 99 KiB, and the warps' merge of a row tile its K / V stages");

/* Where packed row r (token major: token r / group, head kvh * group + r % group) lives. */
typedef struct fp_dec_row {
    int token, head;
} fp_dec_row;

FP_DEV fp_dec_row fp_dec_row_of(int r, int group, int kvh)
{
    fp_dec_row x;
    x.token = r / group;
    x.head = kvh * group + r % group;
    return x;
}

/* The pages of key block nb's BN / 16 key groups (page_size is a multiple of 16, so a group's 16
 * keys lie in one page): pg[gi], the block-table entry as stored (-1 for a group past nk), and
 * off[gi], the group's first row within its page. Fetched a key block before the copies that use
 * them, so that the entries' latency does not sit in front of the copies' issue; the entries
 * are checked against [0, num_pages) only where used (fp_dec_load_kv). 32-bit arithmetic: a
 * sequence has fewer than 2^31 keys. */
template <int G>
FP_DEV void fp_dec_fetch_pages(int (&pg)[G], int (&off)[G], const fp_sm80_args &a, int b, int nb,
                               int bn, int nk)
{
    const int32_t *row = a.block_table + (int64_t)b * a.bt_stride;
    const int ps = (int)a.page_size;
#pragma unroll
    for (int gi = 0; gi < G; ++gi) {
        const int t = nb * bn + 16 * gi, logical = t / ps;
        pg[gi] = t < nk ? row[logical] : -1;
        off[gi] = t - logical * ps;
    }
}

/* Key block nb (keys nb * BN ..) of K or V (base: the tensor, kv head kvh folded in) into a
 * stage, rows past nk and columns past nchunks zero-filled. Dense (!paged): row t at base + t * ss
 * (base at the sequence's first key). Paged: base + page * sb + (t % page_size) * ss, page
 * pg[(t % BN) / 16] and t % page_size = off[(t % BN) / 16] + t % 16; a page outside [0, num_pages)
 * is never read (its rows zero-filled). Returns a bit per key group: set unless its page was out of
 * range. */
template <int BN, int DK, int NT, typename T>
FP_DEV uint32_t fp_dec_load_kv(T *stage, const T *base, int64_t sb, int64_t ss, const void *tensor,
                               bool paged, const int (&pg)[BN / 16], const int (&off)[BN / 16],
                               const fp_sm80_args &a, int nb, int nk, int nchunks, int tid)
{
    constexpr int CH = DK / 8, RS = NT / CH; /* RS: rows a pass of the threads covers */
    static_assert((BN * CH) % NT == 0 && NT % CH == 0, "tile copy must split evenly");
    static_assert(RS <= 16 && 16 % RS == 0, "a thread's row of pass `it` is in key group it*RS/16");
    const uint32_t dst0 = fp_smem_addr(stage);
    const int c = tid % CH;
    uint32_t groups_ok = (1u << (BN / 16)) - 1u;
#pragma unroll
    for (int it = 0; it < BN * CH / NT; ++it) {
        const int r = tid / CH + it * RS, t = nb * BN + r;
        const T *src = base;
        bool ok = t < nk && c < nchunks;
        if (paged) {
            const int gi = it * RS / 16; /* a constant once unrolled */
            const int e = pg[gi];
            const bool page_ok = e >= 0 && e < a.num_pages;
            if (!page_ok && nb * BN + 16 * gi < nk)
                groups_ok &= ~(1u << gi);
            ok = ok && page_ok;
            src = base + (int64_t)e * sb + (int64_t)(off[gi] + r % 16) * ss + c * 8;
        } else {
            src = base + (int64_t)t * ss + c * 8;
        }
        fp_cp_async16(dst0 + 2u * fp_swz<DK>(r, c), ok ? (const void *)src : tensor, ok ? 16 : 0);
    }
    return groups_ok;
}

/* The masked-key guard (docs/reliability.md) for one warp's 16 keys (rows kw .. kw + 15 of a V
 * stage): their infinite and NaN elements set to 0, so that a masked P of 0 never meets one in
 * O += P V. Returns a 16-bit mask of the keys that had one, the same in every lane. */
template <typename T, int DK> FP_DEV uint32_t fp_dec_guard_v(T *stage, int kw, int lane)
{
    constexpr int CH = DK / 8;
    uint32_t bad_keys = 0;
#pragma unroll 1
    for (int idx = lane; idx < 16 * CH; idx += 32) {
        const int r = idx / CH, c = idx % CH;
        if (fp_scrub_chunk<T>(reinterpret_cast<uint4 *>(stage + fp_swz<DK>(kw + r, c))))
            bad_keys |= 1u << r;
    }
#pragma unroll
    for (int off = 1; off < 32; off <<= 1)
        bad_keys |= __shfl_xor_sync(0xffffffffu, bad_keys, off);
    __syncwarp();
    return bad_keys;
}

/* The merge of one row tile (packed rows rt0 .., 16 of them) over the KG warps that split each
 * key block, by the block's NT threads: row maximum M over the warps (0 while no warp saw a key),
 * l = sum l_w 2^(m_w - M), O = sum O_w 2^(m_w - M) / l from om[w][row][DK] and ml[w][row] =
 * (m_w, l_w); then O and LSE out, or the split's partial for the combine. */
template <typename T, int DK, int KG, int NT>
FP_DEV void fp_dec_merge_out(const fp_sm80_args &a, const float *om, const float *ml, int rt0,
                             int rows, int b, int kvh, int split, const fp_cuda_seq &sq_,
                             int nchunks, int tid)
{
    constexpr int BM = FP_DEC_BM, CH = DK / 8;
    for (int idx = tid; idx < BM * CH; idx += NT) {
        const int row = idx / CH, c = idx % CH;
        if (rt0 + row >= rows || c >= nchunks)
            continue;
        fp_softmax_state m;
        fp_softmax_init(&m);
#pragma unroll
        for (int w = 0; w < KG; ++w)
            m.m = fmaxf(m.m, ml[2 * (w * BM + row)]);
        const float base = fp_softmax_exp_base(&m);
        float wt[KG];
        m.l = 0.0f;
#pragma unroll
        for (int w = 0; w < KG; ++w) {
            wt[w] = fp_exp2(ml[2 * (w * BM + row)] - base);
            m.l += ml[2 * (w * BM + row) + 1] * wt[w];
        }
        const float fac = fp_cuda_out_scale(&m);
        float out[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float acc = 0.0f;
#pragma unroll
            for (int w = 0; w < KG; ++w)
                acc += om[(w * BM + row) * DK + 8 * c + e] * wt[w];
            out[e] = acc * fac;
        }
        const fp_dec_row x = fp_dec_row_of(rt0 + row, a.group, kvh);
        const float lse = fp_cuda_lse_exp2(&m);
        if (a.splits == 1) {
            T *og = reinterpret_cast<T *>(const_cast<void *>(a.o.ptr)) +
                    fp_cuda_row(a.o, b, sq_.q_start + x.token, x.head) + 8 * c;
            uint4 pk;
            pk.x = fp_pack2<T>(out[0], out[1]);
            pk.y = fp_pack2<T>(out[2], out[3]);
            pk.z = fp_pack2<T>(out[4], out[5]);
            pk.w = fp_pack2<T>(out[6], out[7]);
            *reinterpret_cast<uint4 *>(og) = pk;
            if (a.lse && c == 0)
                a.lse[fp_cuda_lse_off(a, b, sq_.q_start + x.token, x.head)] = lse;
        } else {
            /* (split, b, h, token) rows of the combine's layout */
            const int64_t prow =
                (((int64_t)split * a.batch + b) * a.heads + x.head) * a.nq + x.token;
            float *dst = a.o_part + prow * a.d + 8 * c;
            *reinterpret_cast<float4 *>(dst) = make_float4(out[0], out[1], out[2], out[3]);
            *reinterpret_cast<float4 *>(dst + 4) = make_float4(out[4], out[5], out[6], out[7]);
            if (c == 0)
                a.lse_part[prow] = lse;
        }
    }
}

// q, o: (B, Nq, H, D); k, v: (B, Nk, Hkv, D) or paged (pages, page_size, Hkv, D); lse: (B, H, Nq)
// grid (row tiles of 16 MT rows, Hkv, B * splits)
template <typename T, int DK, int MT>
__global__ void __launch_bounds__(fp_dec_cfg<DK, MT>::NW * 32)
    fp_decode_fwd_kernel(const fp_sm80_args a)
{
    using C = fp_dec_cfg<DK, MT>;
    constexpr int NW = C::NW, ST = C::ST, NT = NW * 32, BM = FP_DEC_BM * MT, BN = C::BN;
    constexpr int WM = C::WM, TG = C::TG, KG = C::KG;
    constexpr int KT = DK / 16, DT8 = DK / 8, CH = DK / 8, G = BN / 16;
    static_assert(ST * G <= 32, "the key groups' page bits of every stage fit a word");
    __shared__ uint32_t vbad_s[G]; /* the guard's bits per key group, where TG > 1 */

    extern __shared__ __align__(128) unsigned char fp_smem[];
    T *sq = reinterpret_cast<T *>(fp_smem); /* [BM][DK] */
    T *sk = sq + BM * DK;                   /* [ST][BN][DK] */
    T *sv = sk + ST * BN * DK;              /* [ST][BN][DK] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int kvh = blockIdx.y;
    const int b = blockIdx.z / a.splits, split = blockIdx.z % a.splits;
    const fp_cuda_seq sq_ = fp_cuda_seq_of(a, b);
    const int nq = sq_.nq, nk = sq_.nk, group = a.group;
    const int rows = nq * group, r0 = blockIdx.x * BM;
    if (r0 >= rows)
        return;
    const int nchunks = a.d / 8;

    /* Key blocks of the tokens of this tile, cut to the split. */
    const int i0 = r0 / group, i1 = (min(r0 + BM, rows) - 1) / group + 1;
    int nb_begin, nb_end;
    fp_geom_key_blocks(i0, i1, nq, nk, a.left, a.right, BN, &nb_begin, &nb_end);
    if (a.splits > 1) {
        const int per = (int)(a.keys_per_split / BN);
        nb_begin = max(nb_begin, split * per);
        nb_end = min(nb_end, (split + 1) * per);
    }

    const T *kb = reinterpret_cast<const T *>(a.k.ptr) + (int64_t)kvh * a.k.sh;
    const T *vb = reinterpret_cast<const T *>(a.v.ptr) + (int64_t)kvh * a.v.sh;
    if (!a.block_table) {
        kb += (int64_t)b * a.k.sb + sq_.k_start * a.k.ss;
        vb += (int64_t)b * a.v.sb + sq_.k_start * a.v.ss;
    }
    /* Paged: the block-table entries of the next key block to load (fp_dec_fetch_pages), and a
     * bit per (stage, key group) set unless the group's page was out of range (its keys are
     * masked, include/flashport.h). */
    int pg[G] = {}, off[G] = {};
    uint32_t pages_ok = ~0u;
    auto fetch_pages = [&](int nb) {
        if (a.block_table && nb < nb_end)
            fp_dec_fetch_pages<G>(pg, off, a, b, nb, BN, nk);
    };
    auto load_stage = [&](int nb) {
        const int s = (nb - nb_begin) % ST;
        const bool paged = a.block_table != nullptr;
        const uint32_t ok = fp_dec_load_kv<BN, DK, NT>(
            sk + s * BN * DK, kb, a.k.sb, a.k.ss, a.k.ptr, paged, pg, off, a, nb, nk, nchunks, tid);
        fp_dec_load_kv<BN, DK, NT>(sv + s * BN * DK, vb, a.v.sb, a.v.ss, a.v.ptr, paged, pg, off, a,
                                   nb, nk, nchunks, tid);
        pages_ok = (pages_ok & ~(((1u << G) - 1u) << (s * G))) | (ok << (s * G));
    };

    /* Q rows: one (token, head) each, rows past the tile's end zero-filled. */
    {
        const T *qg = reinterpret_cast<const T *>(a.q.ptr);
        const uint32_t dst0 = fp_smem_addr(sq);
        for (int idx = tid; idx < BM * CH; idx += NT) {
            const int r = idx / CH, c = idx % CH;
            const bool ok = r0 + r < rows && c < nchunks;
            const T *src = qg;
            if (ok) {
                const fp_dec_row x = fp_dec_row_of(r0 + r, group, kvh);
                src = qg + fp_cuda_row(a.q, b, sq_.q_start + x.token, x.head) + c * 8;
            }
            fp_cp_async16(dst0 + 2u * fp_swz<DK>(r, c), src, ok ? 16 : 0);
        }
    }
    fp_cp_async_commit();
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
        if (nb_begin + s < nb_end) {
            fetch_pages(nb_begin + s);
            load_stage(nb_begin + s);
        }
        fp_cp_async_commit();
    }
    fetch_pages(nb_begin + ST - 1);

    const uint32_t sq_a = fp_smem_addr(sq), sk_a = fp_smem_addr(sk), sv_a = fp_smem_addr(sv);
    const fp_ldsm_lane lq = fp_lane_a<DK>(0, lane), lk = fp_lane_b<DK>(0, lane);
    const fp_ldsm_lane lv = fp_lane_bt<DK>(0, lane);
    /* This warp's key group kg (keys 16 kg .. of each key block) and row tiles mw .. mw + WM - 1 */
    const int kg = warp / TG, mw = warp % TG * WM, kw = 16 * kg;

    float o[WM][DT8][4];
    fp_softmax_state st[WM][2];
    /* This thread's rows g and g + 8 of each of its row tiles: their token and (for ALiBi) slope.
     */
    int tok[WM][2];
    float slope[WM][2];
    bool rowbad[WM][2]; /* the row saw a key whose V the guard scrubbed */
#pragma unroll
    for (int m = 0; m < WM; ++m) {
        fp_acc_zero(o[m]);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = r0 + 16 * (mw + m) + g + 8 * r;
            const fp_dec_row x = fp_dec_row_of(row, group, kvh);
            fp_softmax_init(&st[m][r]);
            tok[m][r] = x.token;
            slope[m][r] = a.alibi && row < rows ? a.alibi[x.head] : 0.0f;
            rowbad[m][r] = false;
        }
    }
    const fp_mask32 mk = fp_mask32_make(nq, nk, a.left, a.right);

    for (int nb = nb_begin; nb < nb_end; ++nb) {
        if (nb + ST - 1 < nb_end) {
            load_stage(nb + ST - 1);
            fetch_pages(nb + ST);
        }
        fp_cp_async_commit();
        fp_cp_async_wait<ST - 1>(); /* Q and key block nb have landed */
        __syncthreads();
        const int stage = (nb - nb_begin) % ST;
        const int j0 = nb * BN + kw; /* the warp's first key */
        /* S = Q K^T over the warp's 16 keys, each K fragment used by every row tile: n tiles 0
         * (keys j0 ..) and 1 (j0 + 8 ..) */
        float s[WM][2][4];
#pragma unroll
        for (int m = 0; m < WM; ++m)
            fp_acc_zero(s[m]);
        const uint32_t kt = sk_a + stage * BN * DK * 2;
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            uint32_t kf[4];
            fp_ldsm_x4(kf, fp_ldsm_addr<DK>(kt, lk, kw, kk));
#pragma unroll
            for (int m = 0; m < WM; ++m) {
                uint32_t qa[4];
                fp_ldsm_x4(qa, fp_ldsm_addr<DK>(sq_a, lq, 16 * (mw + m), kk));
                fp_mma<T>(s[m][0], qa, kf[0], kf[1]);
                fp_mma<T>(s[m][1], qa, kf[2], kf[3]);
            }
        }
        /* The keys of a page whose block-table entry is out of range are masked. */
        const bool page_ok = (pages_ok >> (stage * G + kg)) & 1u;
        /* Blocks with pairs a row of the tile cannot see: the guard. The TG warps of a key group
         * read the same keys: one scrubs them and hands the bits on (the condition is the
         * block's, so every warp meets the barrier). */
        uint32_t vbad = 0u;
        if (!fp_mask_block_full(i0, i1, nb * BN, nb * BN + BN, nq, nk, a.left, a.right)) {
            if constexpr (TG == 1) {
                vbad = fp_dec_guard_v<T, DK>(sv + stage * BN * DK, kw, lane);
            } else {
                if (warp % TG == 0) {
                    const uint32_t bits = fp_dec_guard_v<T, DK>(sv + stage * BN * DK, kw, lane);
                    if (lane == 0)
                        vbad_s[kg] = bits;
                }
                __syncthreads();
                vbad = vbad_s[kg];
            }
        }
        /* Scores in log2 units, masked ones -inf; row maxima; the lazy rescale
         * (FP_RESCALE_SLACK: O and l only when some row of the warp grew by more than it); P.
         * The sm80 forward's score step (fp_fwd_scores) has the first loop's shape but not its
         * work, so the two share only the per-element transform (fp_score_log2): here a row's
         * token and ALiBi slope are per row (GQA packing), not per block; the page bits and the
         * guard's bits join the mask per element; the scale is applied before the maximum. */
        float mxs[WM][2];
        bool grow = false;
#pragma unroll
        for (int m = 0; m < WM; ++m) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int kj = j0 + 8 * j + 2 * t + e;
                        float &x = s[m][j][2 * r + e];
                        const float v =
                            a.transform ? fp_score_log2(a, x, slope[m][r], tok[m][r], kj, nq, nk)
                                        : x * a.scale_log2;
                        const bool vis = page_ok && fp_mask32_visible(mk, tok[m][r], kj);
                        x = vis ? v : -INFINITY;
                        rowbad[m][r] |= vis && ((vbad >> (8 * j + 2 * t + e)) & 1u);
                        mx = fmaxf(mx, x);
                    }
                mxs[m][r] = fp_quad_max(mx);
                grow |= mxs[m][r] > st[m][r].m + FP_RESCALE_SLACK;
            }
        }
        if (__any_sync(0xffffffffu, grow))
            fp_rescale_rows(o, st, mxs);
        uint32_t pa[WM][4];
#pragma unroll
        for (int m = 0; m < WM; ++m) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float mu = fp_softmax_exp_base(&st[m][r]);
                float l = 0.0f;
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float &x = s[m][j][2 * r + e];
                        x = fp_exp2(x - mu);
                        l += x;
                    }
                st[m][r].l += l; /* this thread's columns; the quad's sum is taken at the end */
            }
            fp_acc_to_a<T>(pa[m], s[m][0], s[m][1]);
        }
        /* O += P V over the warp's 16 keys, each V fragment used by every row tile */
        const uint32_t vt = sv_a + stage * BN * DK * 2;
#pragma unroll
        for (int p = 0; p < DK / 16; ++p) {
            uint32_t vf[4];
            fp_ldsm_x4_t(vf, fp_ldsm_addr<DK>(vt, lv, kw, p));
#pragma unroll
            for (int m = 0; m < WM; ++m) {
                fp_mma<T>(o[m][2 * p], pa[m], vf[0], vf[1]);
                fp_mma<T>(o[m][2 * p + 1], pa[m], vf[2], vf[3]);
            }
        }
        __syncthreads(); /* every warp is done with this stage before it is refilled */
    }
    fp_cp_async_wait<0>();
    __syncthreads();

    /* The warps' partial results, unnormalized, into shared memory over the K / V stages, then
     * their merge. Pass m: each warp's row tile mw + m into region warp % TG (om[KG][row][DK] and
     * ml[KG][row] = (m, l), m in log2 units, slot kg), then the TG row tiles of the pass merged. */
#pragma unroll
    for (int m = 0; m < WM; ++m) {
        if (r0 + 16 * m >= rows) /* every row tile of this pass and the next lies past the rows */
            break;
        const int rg = warp % TG; /* this warp's region */
        float *om = reinterpret_cast<float *>(sk) + rg * (KG * FP_DEC_BM * DK);
        float *ml =
            reinterpret_cast<float *>(sk) + TG * (KG * FP_DEC_BM * DK) + rg * (2 * KG * FP_DEC_BM);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            /* A row that saw a key whose V held a non-finite element: O NaN (the quad's lanes
             * share the row; the merge below carries the NaN) */
            int bad = rowbad[m][r] ? 1 : 0;
            bad |= __shfl_xor_sync(0xffffffffu, bad, 1);
            bad |= __shfl_xor_sync(0xffffffffu, bad, 2);
            const float l = fp_quad_sum(st[m][r].l);
            const int row = g + 8 * r;
#pragma unroll
            for (int j = 0; j < DT8; ++j)
                *reinterpret_cast<float2 *>(om + (kg * FP_DEC_BM + row) * DK + 8 * j + 2 * t) =
                    bad ? make_float2(NAN, NAN) : make_float2(o[m][j][2 * r], o[m][j][2 * r + 1]);
            if (t == 0) {
                ml[2 * (kg * FP_DEC_BM + row)] = st[m][r].m;
                ml[2 * (kg * FP_DEC_BM + row) + 1] = l;
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < TG; ++q) {
            const int rt0 = r0 + 16 * (q * WM + m); /* the row tile's first packed row */
            if (rt0 < rows)
                fp_dec_merge_out<T, DK, KG, NT>(
                    a, reinterpret_cast<float *>(sk) + q * (KG * FP_DEC_BM * DK),
                    reinterpret_cast<float *>(sk) + TG * (KG * FP_DEC_BM * DK) +
                        q * (2 * KG * FP_DEC_BM),
                    rt0, rows, b, kvh, split, sq_, nchunks, tid);
        }
        __syncthreads(); /* the next pass reuses om and ml */
    }
}

template <typename T, int DK, int MT>
static flashport_status fp_decode_launch(const fp_cuda_ctx *ctx, const fp_problem *p,
                                         fp_sm80_args a, void *ws, size_t *query)
{
    using C = fp_dec_cfg<DK, MT>;
    constexpr int NT = C::NW * 32, BN = C::BN, BM = FP_DEC_BM * MT;
    constexpr size_t smem = fp_dec_smem<DK, MT>();
    void (*kernel)(const fp_sm80_args) = fp_decode_fwd_kernel<T, DK, MT>;
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int resident = 1;
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, NT, smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "decode kernel setup");
    }
    const int64_t row_tiles = (p->seqlen_q * a.group + BM - 1) / BM;
    const int64_t tiles = row_tiles * p->kv_heads * p->batch;
    /* The longest sequence's keys (a paged cache: its capacity); seqused_k only shortens them. */
    const int64_t keys = p->seqlen_k;
    fp_decode_target target;
    target.workers = (int64_t)ctx->sm_count * (resident > 0 ? resident : 1);
    target.block_k = BN;
    target.min_split_blocks = 4;
    target.max_splits = 128;
    fp_decode_plan plan = fp_plan_decode(tiles, keys, &target);
    /* FLASHPORT_CUDA_DECODE_SPLITS=n (tests): n splits where the cache has n key blocks. */
    const char *force = getenv("FLASHPORT_CUDA_DECODE_SPLITS");
    if (force && *force && keys > 0) {
        const int64_t k_blocks = (keys + BN - 1) / BN;
        int64_t n = atoi(force);
        n = n < 1 ? 1 : n > k_blocks ? k_blocks : n;
        plan.keys_per_split = (k_blocks + n - 1) / n * BN;
        plan.num_splits = (int32_t)((keys + plan.keys_per_split - 1) / plan.keys_per_split);
        plan.num_tasks = tiles * plan.num_splits;
    }
    const bool empty = tiles == 0;
    if (query) {
        *query = empty ? 0 : fp_cuda_fwd_splits(p, &a, plan.num_splits, plan.keys_per_split, NULL);
        return FLASHPORT_OK;
    }
    if (empty)
        return FLASHPORT_OK;
    fp_cuda_fwd_splits(p, &a, plan.num_splits, plan.keys_per_split, ws);
    dim3 grid((unsigned)row_tiles, (unsigned)p->kv_heads, (unsigned)(p->batch * a.splits));
    kernel<<<grid, NT, smem, ctx->stream>>>(a);
    e = cudaGetLastError();
    fp_cuda_log("forward: decode D%d kernel (%d query rows a tile, %d keys a block, %d warps, "
                "%d stages) for D=%lld, %s cache, grid %ux%ux%u, %d split(s) of %lld keys, "
                "%d blocks per SM",
                DK, BM, BN, NT / 32, C::ST, (long long)p->head_dim,
                p->block_table ? "paged" : "dense", grid.x, grid.y, grid.z, a.splits,
                (long long)a.keys_per_split, resident);
    if (e == cudaSuccess && a.splits > 1)
        e = fp_cuda_fwd_combine(p, &a, ctx->stream);
    return e == cudaSuccess ? FLASHPORT_OK
                            : fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "decode kernel launch");
}

/* The launch of head dim DK's kernel: two 16-row tiles a block where a kv head's rows
 * (Nq * H / Hkv) need more than one and the accumulators fit (K and V are then read once for up to
 * 32 rows), else one. FLASHPORT_CUDA_DECODE_TILES=1 (read at each call, for tests and A/B timings)
 * keeps one tile a block. */
template <typename T, int DK>
flashport_status fp_decode_fwd_family<T, DK>::run(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                  const fp_sm80_args &a, void *ws, size_t *query)
{
    constexpr int MAX_MT = fp_dec_max_mt<DK>();
    const char *tiles = getenv("FLASHPORT_CUDA_DECODE_TILES");
    const bool one_tile = tiles && atoi(tiles) == 1;
    if (MAX_MT > 1 && !one_tile && (int64_t)p->seqlen_q * a.group > FP_DEC_BM)
        return fp_decode_launch<T, DK, MAX_MT>(ctx, p, a, ws, query);
    return fp_decode_launch<T, DK, 1>(ctx, p, a, ws, query);
}

#endif /* FLASHPORT_BACKENDS_CUDA_DECODE_FWD_CUH */
