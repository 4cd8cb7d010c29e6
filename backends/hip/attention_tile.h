/*
 * The HIP backend's flash attention kernels, written once over a tile-matmul policy MMA
 * (mma_generic.h or mma_cdna.h). Everything but the two matmul shapes lives here and is shared by
 * both paths: tile loads, masking with whole-block skipping, softcap and ALiBi, online softmax,
 * split-KV partials and their combine, the backward's recomputation of P and dS, and the stores.
 * Masking and softmax are core/mask.h and core/online_softmax.h, called, not copied.
 *
 * Forward (grid B*H x splits x query blocks; FP_HIP_THREADS threads):
 *   Q tile [BQ, D] in LDS; for each visible key block: K, V tiles to LDS;
 *   S = Q K^T (MMA::mm_abt, raw dot products, f32 in LDS); per row: scale, softcap, ALiBi, mask,
 *   online softmax in log2 units (fp_softmax_update_exp2), P rounded to the storage dtype written
 *   back over S; O *= alpha; O += P V (MMA::mm_acc, accumulator in registers). Finalize with
 *   1/l and LSE; with split-KV, f32 partials go to the workspace and the combine kernel merges
 *   them with fp_softmax_merge.
 * Backward (recomputation from LSE; no atomics, deterministic in every mode):
 *   prep     delta = rowsum(dO * O)
 *   dK/dV    one block per (b, kv head, key block): K, V tiles stay in LDS; for every query head
 *            of the group and every query block that sees the key block: S = Q K^T,
 *            dP = dO V^T, P = exp2(S' - LSE), dS = P (dP - delta) softcap'; dV += P^T dO,
 *            dK += dS^T Q. GQA sums happen inside the block, so no atomics.
 *   dQ       one block per (b, head, query block): dQ += dS K over the visible key blocks.
 * P and dS are rounded to the storage dtype before the matmuls, as a GPU kernel feeding f16/bf16
 * matrix units must; accumulation is f32 throughout.
 *
 * Thread mappings: the score tile [BQ, BK] is owned row-wise by FP_HIP_THREADS / BQ consecutive
 * threads per row (columns interleaved), reduced with __shfl_xor of that width; accumulators
 * belong to the MMA policy, which says for each of its elements which row and column it holds.
 * The only cross-lane operation outside the policy is that shuffle within a row's group (at most
 * 16 lanes), so this file works for wave32, wave64 and NVIDIA's warp32 alike.
 *
 * Known differences from the reference: P and dS are rounded to the storage dtype (the reference
 * keeps them in double); scores use exp2 with log2(e) folded in. Both are within the tolerance of
 * tests/test_backends.c. Speed on AMD hardware has not been measured (no AMD GPU was available).
 */
#ifndef FLASHPORT_BACKENDS_HIP_ATTENTION_TILE_H
#define FLASHPORT_BACKENDS_HIP_ATTENTION_TILE_H

#include "backends/hip/hip_common.h"

#include "core/geometry.h"
#include "core/mask.h"
#include "core/online_softmax.h"

/* LDS row padding: dtype tiles by 8 elements (16 bytes: keeps 16-byte loads aligned and moves
 * consecutive rows to other banks), f32 score tiles by 4 floats. */
#define FP_HIP_DPAD 8
#define FP_HIP_SPAD 4

/* ---- storage dtypes ------------------------------------------------------------------------ */

struct fp_hip_f16 {
    static constexpr uint16_t EXP_MASK = 0x7c00u; /* all ones: inf or NaN */
    static __device__ __forceinline__ float load(uint16_t bits)
    {
        return __half2float(__ushort_as_half(bits));
    }
    static __device__ __forceinline__ uint16_t store(float x)
    {
        return __half_as_ushort(__float2half_rn(x));
    }
};

/* Round to nearest even, NaN kept quiet (the rule of core/dtype.h). */
struct fp_hip_bf16 {
    static constexpr uint16_t EXP_MASK = 0x7f80u;
    static __device__ __forceinline__ float load(uint16_t bits)
    {
        return __uint_as_float((uint32_t)bits << 16);
    }
    static __device__ __forceinline__ uint16_t store(float x)
    {
        uint32_t u = __float_as_uint(x);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            return (uint16_t)((u >> 16) | 0x40u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (uint16_t)(u >> 16);
    }
};

template <class T> __device__ __forceinline__ float fp_hip_round(float x)
{
    return T::load(T::store(x));
}

template <class T> __device__ __forceinline__ void fp_hip_unpack8(uint4 v, float *f)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = T::load((uint16_t)(w[i] & 0xffffu));
        f[2 * i + 1] = T::load((uint16_t)(w[i] >> 16));
    }
}

__device__ __forceinline__ int64_t fp_hip_min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* ---- sequences, rows, tiles ---------------------------------------------------------------- */

typedef struct fp_hip_seq {
    int64_t q_off, nq; /* first token of the sequence in q's sequence dimension, and its length */
    int64_t k_off, nk; /* nk: the keys the sequence uses (seqused_k clamped to its capacity) */
    int64_t k_cap;     /* the keys it holds: dK / dV rows [nk, k_cap) are zero */
    int64_t tok0;      /* first row of the sequence in the [H, total_q] workspaces */
} fp_hip_seq;

__device__ __forceinline__ fp_hip_seq fp_hip_seq_of(const fp_hip_args &a, int b)
{
    const fp_seq q = fp_seq_lookup(a.cu_q, a.cu_k, a.nq, a.nk, b);
    fp_hip_seq s;
    s.q_off = q.q_start;
    s.nq = q.nq;
    s.k_off = q.k_start;
    s.k_cap = q.nk;
    s.nk = fp_seq_used_keys(a.seqused_k, b, q.nk);
    s.tok0 = a.cu_q ? q.q_start : (int64_t)b * a.nq;
    return s;
}

/* Element (b, off, h, 0) of a q/k/v/o-shaped tensor. */
__device__ __forceinline__ uint16_t *fp_hip_row0(const fp_kernel_tensor &t, int b, int64_t off,
                                                 int h)
{
    return (uint16_t *)t.ptr + b * t.sb + off * t.ss + h * t.sh;
}

/* dst[r][c] = row (row0 + r), column c of `src` (rows `rs` elements apart), for r < ROWS and
 * c < dpad; zero past the sequence (n rows) and past the head dim d, so that padded rows and
 * columns add nothing to any product. */
template <int ROWS, int LD>
__device__ __forceinline__ void fp_hip_load_tile(uint16_t (*dst)[LD], const uint16_t *src,
                                                 int64_t rs, int64_t row0, int64_t n, int d,
                                                 int dpad, int vec_ok)
{
    const int chunks = dpad / 8;
    for (int c = threadIdx.x; c < ROWS * chunks; c += FP_HIP_THREADS) {
        const int r = c / chunks, col = (c - r * chunks) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < n && col < d) {
            const uint16_t *p = src + (row0 + r) * rs + col;
            if (vec_ok) {
                val = *(const uint4 *)p;
            } else {
                val.x = p[0] | (uint32_t)p[1] << 16;
                val.y = p[2] | (uint32_t)p[3] << 16;
                val.z = p[4] | (uint32_t)p[5] << 16;
                val.w = p[6] | (uint32_t)p[7] << 16;
            }
        }
        *(uint4 *)&dst[r][col] = val;
    }
}

/* The masked-key guard (docs/reliability.md, "the NaN rule"): a matrix product multiplies a
 * masked pair's P or dS of exactly 0 by its operand, and 0 x NaN or 0 x inf is NaN, so in tiles
 * that hold masked pairs the operands that meet those zeros are scrubbed: every infinite or NaN
 * element becomes 0 and flags[r] says whether row r held one (rows < ROWS of an LDS tile, head
 * dim padded to dpad; one thread per row, as only such tiles pay for it). The score steps then
 * give a visible pair whose row was scrubbed the NaN it would have had. */
template <class T, int ROWS, int LD>
__device__ __forceinline__ void fp_hip_scrub_tile(uint16_t (*tile)[LD], uint8_t *flags, int dpad)
{
    for (int r = threadIdx.x; r < ROWS; r += FP_HIP_THREADS) {
        int bad = 0;
        for (int c = 0; c < dpad; c++) {
            const uint16_t x = tile[r][c];
            if ((x & T::EXP_MASK) == T::EXP_MASK) {
                tile[r][c] = 0;
                bad = 1;
            }
        }
        flags[r] = (uint8_t)bad;
    }
}

/* Keys row0 .. row0 + ROWS - 1 of a paged sequence b into dst (fp_hip_load_tile's rules): key t
 * is row t % page_size of page fp_paged_page(...); base is the tensor with the kv head folded
 * in. ok[r] says whether key row0 + r lies in a page whose block-table entry is in range (an
 * entry out of range is never dereferenced: its rows are zero and its keys are masked). */
template <int ROWS, int LD>
__device__ __forceinline__ void
fp_hip_load_paged(uint16_t (*dst)[LD], unsigned char *ok, const uint16_t *base, int64_t page_stride,
                  int64_t rs, const fp_hip_args &a, int b, int64_t row0, int64_t n, int d, int dpad)
{
    const int chunks = dpad / 8;
    for (int c = threadIdx.x; c < ROWS * chunks; c += FP_HIP_THREADS) {
        const int r = c / chunks, col = (c - r * chunks) * 8;
        const int64_t t = row0 + r;
        const int64_t pg =
            t < n ? fp_paged_page(a.block_table, a.bt_stride, a.page_size, a.num_pages, b, t) : -1;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (pg >= 0 && col < d) {
            const uint16_t *p = base + pg * page_stride + (t % a.page_size) * rs + col;
            if (a.vec_ok) {
                val = *(const uint4 *)p;
            } else {
                val.x = p[0] | (uint32_t)p[1] << 16;
                val.y = p[2] | (uint32_t)p[3] << 16;
                val.z = p[4] | (uint32_t)p[5] << 16;
                val.w = p[6] | (uint32_t)p[7] << 16;
            }
        }
        *(uint4 *)&dst[r][col] = val;
        if (col == 0)
            ok[r] = t >= n || pg >= 0;
    }
}

/* out[(row0 + r) * rs + c] = acc(r, c) * (row_scale ? row_scale[r] : scale), for rows inside the
 * sequence (n) and columns inside the head dim (d). */
template <class T, class ACC>
__device__ __forceinline__ void fp_hip_store_acc(const ACC &acc, uint16_t *out, int64_t rs,
                                                 int64_t row0, int64_t n, int d,
                                                 const float *row_scale, float scale)
{
#pragma unroll
    for (int i = 0; i < ACC::N; i++) {
        const int r = ACC::row(i), c = ACC::col(i);
        if (row0 + r < n && c < d)
            out[(row0 + r) * rs + c] = T::store(acc.get(i) * (row_scale ? row_scale[r] : scale));
    }
}

/* ---- scores -------------------------------------------------------------------------------- */

/* What turns a raw q.k of one (sequence, head) into a transformed, masked score. */
typedef struct fp_hip_score {
    float scale, softcap, slope;
    int64_t nq, nk, left, right;
} fp_hip_score;

__device__ __forceinline__ fp_hip_score fp_hip_score_of(const fp_hip_args &a, const fp_hip_seq &s,
                                                        int h)
{
    fp_hip_score sc;
    sc.scale = a.scale;
    sc.softcap = a.softcap;
    sc.slope = a.alibi ? a.alibi[h] : 0.0f;
    sc.nq = s.nq;
    sc.nk = s.nk;
    sc.left = a.left;
    sc.right = a.right;
    return sc;
}

/* Nonzero when no element of tile [i0, i0 + BQ) x [j0, j0 + BK) needs the per-element mask:
 * every real row sees every key, and the tile does not run past the keys. */
template <int BQ, int BK>
__device__ __forceinline__ int fp_hip_tile_full(const fp_hip_score &sc, int64_t i0, int64_t j0)
{
    const int64_t i1 = fp_hip_min64(i0 + BQ, sc.nq);
    return j0 + BK <= sc.nk &&
           fp_mask_block_full(i0, i1, j0, j0 + BK, sc.nq, sc.nk, sc.left, sc.right);
}

/* Visible keys [*lo, *hi) of row i; rows past the sequence see nothing. */
__device__ __forceinline__ void fp_hip_row_range(const fp_hip_score &sc, int64_t i, int64_t *lo,
                                                 int64_t *hi)
{
    if (i < sc.nq) {
        *lo = fp_mask_lo(i, sc.nq, sc.nk, sc.left);
        *hi = fp_mask_hi(i, sc.nq, sc.nk, sc.right);
    } else {
        *lo = 0;
        *hi = 0;
    }
}

/* One key block of the forward's online softmax. s holds raw dot products [BQ, BK]; on return it
 * holds P (rounded to T, as the P V product consumes it) relative to the updated running max,
 * row_alpha[r] the factor by which row r of the output accumulator must be scaled, and st (this
 * thread's row) is updated. The row sum l adds the unrounded weights, so the LSE keeps f32
 * accuracy. */
template <class T, int BQ, int BK>
__device__ __forceinline__ void
fp_hip_softmax_tile(float (*s)[BK + FP_HIP_SPAD], float *row_alpha, fp_softmax_state *st,
                    const fp_hip_score &sc, int64_t i, float slope, int64_t j0, int full,
                    const unsigned char *key_ok, const uint8_t *vflag, int *vbad)
{
    constexpr int TPR = FP_HIP_THREADS / BQ; /* threads per row */
    constexpr int CPT = BK / TPR;            /* columns per thread */
    static_assert(TPR * BQ == FP_HIP_THREADS && CPT * TPR == BK && TPR <= 16, "row mapping");
    const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
    int64_t lo, hi;
    fp_hip_row_range(sc, i, &lo, &hi);

    float x[CPT];
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int col = part + c * TPR;
        const int64_t j = j0 + col;
        x[c] = -INFINITY;
        if ((full || (j >= lo && j < hi)) && (!key_ok || key_ok[col])) {
            x[c] = fp_score_transform(s[r][col] * sc.scale, sc.softcap, slope,
                                      fp_alibi_distance(i, j, sc.nq, sc.nk)) *
                   FP_LOG2E;
            if (!full && vflag[col])
                *vbad = 1; /* this row sees a key whose V was scrubbed */
        }
        mx = fmaxf(mx, x[c]);
    }
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor(mx, o, TPR));

    const float alpha = fp_softmax_update_exp2(st, mx);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const float p = fp_softmax_weight_exp2(st, x[c]);
        s[r][part + c * TPR] = fp_hip_round<T>(p);
        sum += p;
    }
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1)
        sum += __shfl_xor(sum, o, TPR);
    st->l += sum;
    if (part == 0)
        row_alpha[r] = alpha;
}

/* One (query block, key block) pair of the backward. s holds S (raw q.k) and dp holds dO.V^T;
 * on return s holds P and dp holds dS (the gradient with respect to the scaled score, softcap
 * included), both rounded to T. P is the softmax weight of the score under m = LSE (log2 units,
 * lse2), so l = 1; padded rows carry lse2 = +inf and get P = 0. */
template <class T, int BQ, int BK>
__device__ __forceinline__ void
fp_hip_grad_tile(float (*s)[BK + FP_HIP_SPAD], float (*dp)[BK + FP_HIP_SPAD], const float *lse2,
                 const float *delta, const fp_hip_score &sc, int64_t i0, int64_t j0, int full,
                 const uint8_t *rflag, const uint8_t *kflag)
{
    constexpr int TPR = FP_HIP_THREADS / BQ;
    constexpr int CPT = BK / TPR;
    static_assert(TPR * BQ == FP_HIP_THREADS && CPT * TPR == BK, "row mapping");
    const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
    const int64_t i = i0 + r;
    int64_t lo, hi;
    fp_hip_row_range(sc, i, &lo, &hi);
    fp_softmax_state st;
    st.m = lse2[r];
    st.l = 1.0f;

#pragma unroll
    for (int c = 0; c < CPT; c++) {
        const int col = part + c * TPR;
        const int64_t j = j0 + col;
        float p = 0.0f, ds = 0.0f;
        if (full || (j >= lo && j < hi)) {
            const float capped = fp_score_transform(s[r][col] * sc.scale, sc.softcap, 0.0f, 0.0f);
            const float t =
                fp_score_transform(capped, 0.0f, sc.slope, fp_alibi_distance(i, j, sc.nq, sc.nk));
            p = fp_softmax_weight_exp2(&st, t * FP_LOG2E);
            ds = p * (dp[r][col] - delta[r]) * fp_softcap_grad(capped, sc.softcap);
            /* the guard's flags (edge tiles only): a scrubbed Q / dO row or K row */
            if (!full && ((rflag && rflag[r]) || (kflag && kflag[col])))
                p = ds = NAN;
        }
        s[r][col] = fp_hip_round<T>(p);
        dp[r][col] = fp_hip_round<T>(ds);
    }
}

/* ---- forward ------------------------------------------------------------------------------- */

template <int DMAX, int BQ, int BK> struct fp_hip_fwd_smem {
    alignas(16) uint16_t q[BQ][DMAX + FP_HIP_DPAD];
    alignas(16) uint16_t k[BK][DMAX + FP_HIP_DPAD];
    alignas(16) uint16_t v[BK][DMAX + FP_HIP_DPAD];
    alignas(16) float s[BQ][BK + FP_HIP_SPAD];
    float alpha[BQ];
    float oscale[BQ];
    uint8_t vflag[BK];        /* the guard's flags of the V tile */
    unsigned char key_ok[BK]; /* paged: the key's page is in range */
};

/* The forward's query rows: row r of the block is packed row i0 + r of its (batch, head group),
 * token (i0 + r) / G of head h0 + (i0 + r) % G, G = a.pack_group (1: one head, row = token). */
typedef struct fp_hip_rows {
    int64_t i0;
    int g, h0;
} fp_hip_rows;

__device__ __forceinline__ int64_t fp_hip_row_token(const fp_hip_rows &w, int r)
{
    return (w.i0 + r) / w.g;
}
__device__ __forceinline__ int fp_hip_row_head(const fp_hip_rows &w, int r)
{
    return w.h0 + (int)((w.i0 + r) % w.g);
}

/* Q rows of the block (packed: one (token, head) each) into dst, fp_hip_load_tile's rules. */
template <int ROWS, int LD>
__device__ __forceinline__ void fp_hip_load_q_rows(uint16_t (*dst)[LD], const fp_hip_args &a,
                                                   const fp_hip_seq &sq, int b,
                                                   const fp_hip_rows &w, int d, int dpad)
{
    const int chunks = dpad / 8;
    for (int c = threadIdx.x; c < ROWS * chunks; c += FP_HIP_THREADS) {
        const int r = c / chunks, col = (c - r * chunks) * 8;
        const int64_t i = fp_hip_row_token(w, r);
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (i < sq.nq && col < d) {
            const uint16_t *p = fp_hip_row0(a.q, b, sq.q_off + i, fp_hip_row_head(w, r)) + col;
            if (a.vec_ok) {
                val = *(const uint4 *)p;
            } else {
                val.x = p[0] | (uint32_t)p[1] << 16;
                val.y = p[2] | (uint32_t)p[3] << 16;
                val.z = p[4] | (uint32_t)p[5] << 16;
                val.w = p[6] | (uint32_t)p[7] << 16;
            }
        }
        *(uint4 *)&dst[r][col] = val;
    }
}

template <class T, int DMAX, class MMA> __device__ void fp_hip_forward_tile(const fp_hip_args &a)
{
    enum { BQ = fp_hip_tile<DMAX, 0>::BQ, BK = fp_hip_tile<DMAX, 0>::BK };
    constexpr int TPR = FP_HIP_THREADS / BQ;
    static_assert(sizeof(fp_hip_fwd_smem<DMAX, BQ, BK>) <= 48 * 1024, "LDS budget");
    __shared__ fp_hip_fwd_smem<DMAX, BQ, BK> sm;

    const int groups = a.heads / a.pack_group; /* blocks along x per batch entry */
    const int b = blockIdx.x / groups, split = blockIdx.y;
    const int64_t qb = a.reverse ? a.num_q_blocks - 1 - blockIdx.z : blockIdx.z;
    const fp_hip_seq sq = fp_hip_seq_of(a, b);
    fp_hip_rows w;
    w.i0 = qb * BQ;
    w.g = a.pack_group;
    w.h0 = (blockIdx.x % groups) * a.pack_group;
    const int64_t rows = sq.nq * w.g;
    if (w.i0 >= rows)
        return; /* a shorter sequence of a varlen batch */
    const int kh = w.h0 / (a.heads / a.kv_heads);
    const int d = a.d, dpad = (d + 15) & ~15;
    const fp_hip_score sc = fp_hip_score_of(a, sq, w.h0);
    /* The tokens of the block's rows */
    const int64_t t0 = w.i0 / w.g, t1 = (fp_hip_min64(w.i0 + BQ, rows) - 1) / w.g + 1;

    /* Keys this block visits: those any of its rows sees, within its split. Splits are whole
     * key blocks (keys_per_split is a multiple of BK), so tiles never straddle two splits. */
    int nb0, nb1;
    fp_geom_key_blocks(t0, t1, sq.nq, sq.nk, a.left, a.right, BK, &nb0, &nb1);
    const int per_split = (int)(a.keys_per_split / BK);
    nb0 = nb0 > split * per_split ? nb0 : split * per_split;
    nb1 = nb1 < (split + 1) * per_split ? nb1 : (split + 1) * per_split;

    fp_hip_load_q_rows<BQ>(sm.q, a, sq, b, w, d, dpad);
    const uint16_t *kp, *vp;
    if (a.block_table) {
        kp = (const uint16_t *)a.k.ptr + kh * a.k.sh;
        vp = (const uint16_t *)a.v.ptr + kh * a.v.sh;
    } else {
        kp = fp_hip_row0(a.k, b, sq.k_off, kh);
        vp = fp_hip_row0(a.v, b, sq.k_off, kh);
    }
    typename MMA::template acc<BQ, DMAX> o;
    o.zero();
    fp_softmax_state st;
    fp_softmax_init(&st);
    int vbad = 0; /* this thread's part of its row saw a scrubbed V row */
    /* This thread's softmax row: its token and ALiBi slope */
    const int r = threadIdx.x / TPR;
    const int64_t i = fp_hip_row_token(w, r);
    const int hr = fp_hip_row_head(w, r);
    const float slope = a.alibi && i < sq.nq ? a.alibi[hr] : 0.0f;

    for (int64_t j0 = (int64_t)nb0 * BK; j0 < (int64_t)nb1 * BK; j0 += BK) {
        __syncthreads(); /* the previous block's readers of k, v and s are done */
        if (a.block_table) {
            fp_hip_load_paged<BK>(sm.k, sm.key_ok, kp, a.k.sb, a.k.ss, a, b, j0, sq.nk, d, dpad);
            fp_hip_load_paged<BK>(sm.v, sm.key_ok, vp, a.v.sb, a.v.ss, a, b, j0, sq.nk, d, dpad);
        } else {
            fp_hip_load_tile<BK>(sm.k, kp, a.k.ss, j0, sq.nk, d, dpad, a.vec_ok);
            fp_hip_load_tile<BK>(sm.v, vp, a.v.ss, j0, sq.nk, d, dpad, a.vec_ok);
        }
        __syncthreads();
        const int full = j0 + BK <= sc.nk &&
                         fp_mask_block_full(t0, t1, j0, j0 + BK, sc.nq, sc.nk, sc.left, sc.right);
        if (!full) /* masked P = 0 meets V in O += P V: V finite (the guard, above) */
            fp_hip_scrub_tile<T, BK>(sm.v, sm.vflag, dpad);
        MMA::template mm_abt<T, BQ, BK>(sm.q, sm.k, d, sm.s);
        __syncthreads();
        fp_hip_softmax_tile<T, BQ, BK>(sm.s, sm.alpha, &st, sc, i, slope, j0, full,
                                       a.block_table ? sm.key_ok : NULL, sm.vflag, &vbad);
        __syncthreads();
#pragma unroll
        for (int e = 0; e < o.N; e++)
            o.mul(e, sm.alpha[o.row(e)]);
        MMA::template mm_acc<T, BK>(o, &sm.s[0][0], BK + FP_HIP_SPAD, 1, sm.v, d);
    }

    float seen = vbad ? 1.0f : 0.0f; /* any part of the row's */
#pragma unroll
    for (int o_ = TPR / 2; o_ > 0; o_ >>= 1)
        seen = fmaxf(seen, __shfl_xor(seen, o_, TPR));
    if (threadIdx.x % TPR == 0) {
        /* a row that saw a non-finite V element: O NaN (the CPU backend: only those elements) */
        sm.oscale[r] = seen != 0.0f ? NAN : fp_softmax_out_scale(&st);
        if (i < sq.nq) {
            if (a.splits > 1)
                a.lse_part[((int64_t)split * a.heads + hr) * a.total_q + sq.tok0 + i] =
                    fp_softmax_lse_exp2(&st);
            else if (a.lse)
                a.lse[b * a.lse_sb + hr * a.lse_sh + (sq.q_off + i) * a.lse_ss] =
                    fp_softmax_lse_exp2(&st);
        }
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < o.N; e++) {
        const int rr = o.row(e), c = o.col(e);
        const int64_t ie = fp_hip_row_token(w, rr);
        if (ie >= sq.nq || c >= d)
            continue;
        const int he = fp_hip_row_head(w, rr);
        if (a.splits > 1)
            a.o_part[(((int64_t)split * a.heads + he) * a.total_q + sq.tok0 + ie) * d + c] =
                o.get(e) * sm.oscale[rr];
        else
            fp_hip_row0(a.o, b, sq.q_off + ie, he)[c] = T::store(o.get(e) * sm.oscale[rr]);
    }
}

/* Split-KV combine: one block per (b * H + h, row); thread c merges column c over the splits. */
template <class T> __device__ void fp_hip_combine_rows(const fp_hip_args &a)
{
    const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
    const fp_hip_seq sq = fp_hip_seq_of(a, b);
    const int d = a.d, c = threadIdx.x;
    for (int64_t i = blockIdx.y; i < sq.nq; i += gridDim.y) {
        float lse = -INFINITY, acc = 0.0f;
        for (int s = 0; s < a.splits; s++) {
            const int64_t row = ((int64_t)s * a.heads + h) * a.total_q + sq.tok0 + i;
            float wa, wb;
            lse = fp_softmax_merge(lse, a.lse_part[row], &wa, &wb);
            acc = wa * acc + (c < d ? wb * a.o_part[row * d + c] : 0.0f);
        }
        if (c < d)
            fp_hip_row0(a.o, b, sq.q_off, h)[i * a.o.ss + c] = T::store(acc);
        if (c == 0 && a.lse)
            a.lse[b * a.lse_sb + h * a.lse_sh + (sq.q_off + i) * a.lse_ss] = lse;
    }
}

/* ---- backward ------------------------------------------------------------------------------ */

/* delta[h, tok] = sum_d dO * O, one thread per row. */
template <class T> __device__ void fp_hip_bwd_prep_rows(const fp_hip_args &a)
{
    const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
    const fp_hip_seq sq = fp_hip_seq_of(a, b);
    const int64_t i = (int64_t)blockIdx.y * FP_HIP_THREADS + threadIdx.x;
    if (i >= sq.nq)
        return;
    const uint16_t *o = fp_hip_row0(a.o, b, sq.q_off + i, h);
    const uint16_t *g = fp_hip_row0(a.dout, b, sq.q_off + i, h);
    float sum = 0.0f;
    for (int c = 0; c < a.d; c++)
        sum += T::load(o[c]) * T::load(g[c]);
    a.delta[(int64_t)h * a.total_q + sq.tok0 + i] = sum;
}

template <int DMAX, int BQ, int BK> struct fp_hip_bwd_smem {
    alignas(16) uint16_t q[BQ][DMAX + FP_HIP_DPAD];
    alignas(16) uint16_t dout[BQ][DMAX + FP_HIP_DPAD];
    alignas(16) uint16_t k[BK][DMAX + FP_HIP_DPAD];
    alignas(16) uint16_t v[BK][DMAX + FP_HIP_DPAD];
    alignas(16) float s[BQ][BK + FP_HIP_SPAD];
    alignas(16) float dp[BQ][BK + FP_HIP_SPAD];
    float lse2[BQ];
    float delta[BQ];
    uint8_t qflag[BQ], dflag[BQ], kflag[BK]; /* the guard's flags of Q, dO, K rows */
};

/* Q and dO rows [i0, i0 + BQ) of head h, with their LSE (log2 units) and delta. */
template <int DMAX, int BQ, int BK>
__device__ __forceinline__ void fp_hip_load_query_side(fp_hip_bwd_smem<DMAX, BQ, BK> &sm,
                                                       const fp_hip_args &a, int b, int h,
                                                       const fp_hip_seq &sq, int64_t i0, int dpad)
{
    const int d = a.d;
    fp_hip_load_tile<BQ>(sm.q, fp_hip_row0(a.q, b, sq.q_off, h), a.q.ss, i0, sq.nq, d, dpad,
                         a.vec_ok);
    fp_hip_load_tile<BQ>(sm.dout, fp_hip_row0(a.dout, b, sq.q_off, h), a.dout.ss, i0, sq.nq, d,
                         dpad, a.vec_ok);
    for (int r = threadIdx.x; r < BQ; r += FP_HIP_THREADS) {
        const int64_t i = i0 + r;
        if (i < sq.nq) {
            sm.lse2[r] = a.lse[b * a.lse_sb + h * a.lse_sh + (sq.q_off + i) * a.lse_ss] * FP_LOG2E;
            sm.delta[r] = a.delta[(int64_t)h * a.total_q + sq.tok0 + i];
        } else {
            sm.lse2[r] = INFINITY;
            sm.delta[r] = 0.0f;
        }
    }
}

/* With Q, dO (rows i0..) and K, V (keys j0..) in LDS: P into sm.s and dS into sm.dp. The guard:
 * in a tile that holds masked pairs, DKDV (the dK/dV kernel, whose products meet Q and dO)
 * scrubs Q and dO, else (the dQ kernel, whose product meets K) K; S and dP are computed from the
 * scrubbed tiles, and the flags make the visible pairs of a scrubbed row NaN. dP's masked
 * entries are dropped by the mask's branch in fp_hip_grad_tile. */
template <class T, int DMAX, int BQ, int BK, class MMA, bool DKDV>
__device__ __forceinline__ void fp_hip_grad_scores(fp_hip_bwd_smem<DMAX, BQ, BK> &sm,
                                                   const fp_hip_score &sc, int64_t i0, int64_t j0,
                                                   int d, int dpad)
{
    const int full = fp_hip_tile_full<BQ, BK>(sc, i0, j0);
    if (!full) {
        if (DKDV) {
            fp_hip_scrub_tile<T, BQ>(sm.q, sm.qflag, dpad);
            fp_hip_scrub_tile<T, BQ>(sm.dout, sm.dflag, dpad);
            for (int r = threadIdx.x; r < BQ; r += FP_HIP_THREADS)
                sm.qflag[r] |= sm.dflag[r];
        } else {
            fp_hip_scrub_tile<T, BK>(sm.k, sm.kflag, dpad);
        }
        __syncthreads();
    }
    MMA::template mm_abt<T, BQ, BK>(sm.q, sm.k, d, sm.s);
    MMA::template mm_abt<T, BQ, BK>(sm.dout, sm.v, d, sm.dp);
    __syncthreads();
    fp_hip_grad_tile<T, BQ, BK>(sm.s, sm.dp, sm.lse2, sm.delta, sc, i0, j0, full,
                                DKDV ? sm.qflag : NULL, DKDV ? NULL : sm.kflag);
    __syncthreads();
}

template <class T, int DMAX, class MMA> __device__ void fp_hip_bwd_dkdv_tile(const fp_hip_args &a)
{
    enum { BQ = fp_hip_tile<DMAX, 1>::BQ, BK = fp_hip_tile<DMAX, 1>::BK };
    static_assert(sizeof(fp_hip_bwd_smem<DMAX, BQ, BK>) <= 48 * 1024, "LDS budget");
    __shared__ fp_hip_bwd_smem<DMAX, BQ, BK> sm;

    const int b = blockIdx.x / a.kv_heads, kh = blockIdx.x % a.kv_heads;
    const fp_hip_seq sq = fp_hip_seq_of(a, b);
    const int64_t j0 = (int64_t)blockIdx.z * BK;
    if (j0 >= sq.k_cap)
        return;
    const int d = a.d, dpad = (d + 15) & ~15, group = a.heads / a.kv_heads;
    typename MMA::template acc<BK, DMAX> dk, dv;
    dk.zero();
    dv.zero();
    /* Keys past seqused_k take no part: their dK and dV rows (up to k_cap) are stored as 0. */
    if (j0 >= sq.nk) {
        fp_hip_store_acc<T>(dk, fp_hip_row0(a.dk, b, sq.k_off, kh), a.dk.ss, j0, sq.k_cap, d, NULL,
                            1.0f);
        fp_hip_store_acc<T>(dv, fp_hip_row0(a.dv, b, sq.k_off, kh), a.dv.ss, j0, sq.k_cap, d, NULL,
                            1.0f);
        return;
    }
    const int64_t j1 = fp_hip_min64(j0 + BK, sq.nk);

    fp_hip_load_tile<BK>(sm.k, fp_hip_row0(a.k, b, sq.k_off, kh), a.k.ss, j0, sq.nk, d, dpad,
                         a.vec_ok);
    fp_hip_load_tile<BK>(sm.v, fp_hip_row0(a.v, b, sq.k_off, kh), a.v.ss, j0, sq.nk, d, dpad,
                         a.vec_ok);

    /* The query blocks with a row that sees one of these keys. */
    int mb0, mb1;
    fp_geom_query_blocks(j0, j1, sq.nq, sq.nk, a.left, a.right, BQ, &mb0, &mb1);
    for (int g = 0; g < group; g++) {
        const int h = kh * group + g;
        const fp_hip_score sc = fp_hip_score_of(a, sq, h);
        for (int64_t i0 = (int64_t)mb0 * BQ; i0 < (int64_t)mb1 * BQ; i0 += BQ) {
            __syncthreads(); /* the previous pair's readers of q, dout, s, dp are done */
            fp_hip_load_query_side(sm, a, b, h, sq, i0, dpad);
            __syncthreads();
            fp_hip_grad_scores<T, DMAX, BQ, BK, MMA, true>(sm, sc, i0, j0, d, dpad);
            /* A(m = key, k = query row) = P[row][key]: the transposed score tile. */
            MMA::template mm_acc<T, BQ>(dv, &sm.s[0][0], 1, BK + FP_HIP_SPAD, sm.dout, d);
            MMA::template mm_acc<T, BQ>(dk, &sm.dp[0][0], 1, BK + FP_HIP_SPAD, sm.q, d);
        }
    }
    /* Rows [nk, k_cap) of this block hold zeros: their keys were zero-filled and masked. */
    fp_hip_store_acc<T>(dk, fp_hip_row0(a.dk, b, sq.k_off, kh), a.dk.ss, j0, sq.k_cap, d, NULL,
                        a.scale);
    fp_hip_store_acc<T>(dv, fp_hip_row0(a.dv, b, sq.k_off, kh), a.dv.ss, j0, sq.k_cap, d, NULL,
                        1.0f);
}

template <class T, int DMAX, class MMA> __device__ void fp_hip_bwd_dq_tile(const fp_hip_args &a)
{
    enum { BQ = fp_hip_tile<DMAX, 1>::BQ, BK = fp_hip_tile<DMAX, 1>::BK };
    __shared__ fp_hip_bwd_smem<DMAX, BQ, BK> sm;

    const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
    const int64_t qb = a.reverse ? a.num_q_blocks - 1 - blockIdx.z : blockIdx.z;
    const fp_hip_seq sq = fp_hip_seq_of(a, b);
    const int64_t i0 = qb * BQ;
    if (i0 >= sq.nq)
        return;
    const int kh = h / (a.heads / a.kv_heads);
    const int d = a.d, dpad = (d + 15) & ~15;
    const fp_hip_score sc = fp_hip_score_of(a, sq, h);
    int nb0, nb1;
    fp_geom_key_blocks(i0, fp_hip_min64(i0 + BQ, sq.nq), sq.nq, sq.nk, a.left, a.right, BK, &nb0,
                       &nb1);

    fp_hip_load_query_side(sm, a, b, h, sq, i0, dpad);
    const uint16_t *kp = fp_hip_row0(a.k, b, sq.k_off, kh), *vp = fp_hip_row0(a.v, b, sq.k_off, kh);
    typename MMA::template acc<BQ, DMAX> dq;
    dq.zero();
    for (int64_t j0 = (int64_t)nb0 * BK; j0 < (int64_t)nb1 * BK; j0 += BK) {
        __syncthreads();
        fp_hip_load_tile<BK>(sm.k, kp, a.k.ss, j0, sq.nk, d, dpad, a.vec_ok);
        fp_hip_load_tile<BK>(sm.v, vp, a.v.ss, j0, sq.nk, d, dpad, a.vec_ok);
        __syncthreads();
        fp_hip_grad_scores<T, DMAX, BQ, BK, MMA, false>(sm, sc, i0, j0, d, dpad);
        MMA::template mm_acc<T, BK>(dq, &sm.dp[0][0], BK + FP_HIP_SPAD, 1, sm.k, d);
    }
    fp_hip_store_acc<T>(dq, fp_hip_row0(a.dq, b, sq.q_off, h), a.dq.ss, i0, sq.nq, d, NULL,
                        a.scale);
}

/* ---- kernels and their tables -------------------------------------------------------------- */

template <class T, int DMAX, class MMA>
__global__ __launch_bounds__(FP_HIP_THREADS) void fp_hip_fwd_kernel(fp_hip_args a)
{
    fp_hip_forward_tile<T, DMAX, MMA>(a);
}

template <class T, int DMAX, class MMA>
__global__ __launch_bounds__(FP_HIP_THREADS) void fp_hip_bwd_dkdv_kernel(fp_hip_args a)
{
    fp_hip_bwd_dkdv_tile<T, DMAX, MMA>(a);
}

template <class T, int DMAX, class MMA>
__global__ __launch_bounds__(FP_HIP_THREADS) void fp_hip_bwd_dq_kernel(fp_hip_args a)
{
    fp_hip_bwd_dq_tile<T, DMAX, MMA>(a);
}

/* The forward and backward kernels of path MMA for one element type and head-dim class. */
typedef struct fp_hip_kernel_set {
    fp_hip_kernel_fn fwd;
    fp_hip_bwd_kernels bwd;
} fp_hip_kernel_set;

template <class T, int DMAX, class MMA> fp_hip_kernel_set fp_hip_kernels_of()
{
    const fp_hip_kernel_set k = {
        fp_hip_fwd_kernel<T, DMAX, MMA>,
        {fp_hip_bwd_dkdv_kernel<T, DMAX, MMA>, fp_hip_bwd_dq_kernel<T, DMAX, MMA>}};
    return k;
}

template <class T, class MMA> fp_hip_kernel_set fp_hip_kernels_by_dmax(int dmax)
{
    const fp_hip_kernel_set none = {NULL, {NULL, NULL}};
    switch (dmax) {
    case 64:
        return fp_hip_kernels_of<T, 64, MMA>();
    case 128:
        return fp_hip_kernels_of<T, 128, MMA>();
    case 256:
        return fp_hip_kernels_of<T, 256, MMA>();
    default:
        return none;
    }
}

/* The kernels of path MMA for a dtype and head-dim class; NULL where there is none. */
template <class MMA> fp_hip_kernel_set fp_hip_kernels(flashport_dtype dtype, int dmax)
{
    const fp_hip_kernel_set none = {NULL, {NULL, NULL}};
    if (dtype == FLASHPORT_F16)
        return fp_hip_kernels_by_dmax<fp_hip_f16, MMA>(dmax);
    if (dtype == FLASHPORT_BF16)
        return fp_hip_kernels_by_dmax<fp_hip_bf16, MMA>(dmax);
    return none;
}

#endif /* FLASHPORT_BACKENDS_HIP_ATTENTION_TILE_H */
