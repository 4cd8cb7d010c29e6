/*
 * Device building blocks of the sm80 (Ampere-class) attention kernels, shared by sm80/fwd.cuh and
 * sm80/bwd.cuh: the argument block the launchers fill, sequence and row addressing (over
 * core/geometry.h), the 32-bit per-element mask, the softmax finalize with the hardware
 * approximations, and small named tile operations (swizzled shared-memory tiles, ldmatrix lane
 * addressing, tile copies, fragment staging, a warp's matrix product: fp_warp_mma). The
 * instructions themselves are backends/cuda/ptx/sm80.cuh.
 *
 * Shared-memory tiles hold 2-byte elements, rows of COLS elements (COLS a multiple of 64), in
 * 16-byte chunks whose index is XORed with (row % 8): the eight rows that one ldmatrix phase
 * reads, or one fragment store writes, then fall in eight different bank groups (no conflicts).
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM80_COMMON_CUH
#define FLASHPORT_BACKENDS_CUDA_SM80_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/ptx/sm80.cuh"
#include "core/backend.h"
#include "core/geometry.h"
#include "core/kernel_args.h"
#include "core/mask.h"
#include "core/online_softmax.h"

/* ---- argument blocks (filled by the launchers, passed by value) ---------------------------- */

/* The kernels' argument block: core/kernel_args.h's (the fields the HIP kernels read too,
 * filled from the problem by fp_kernel_args_fill, kept first so that its layout is the
 * kernels' parameter layout) and the fields of this path's backward. The forward's split-KV
 * partials (o_part, lse_part) are [splits, B, H, nq, d] f32 and [splits, B, H, nq]. Only the
 * decode kernel (decode/fwd.cuh) reads paged caches. */
typedef struct fp_sm80_args : fp_kernel_args {
    float *ws_lse2;  /* [B, H, nq_pad]: LSE * log2(e), +inf where a row sees nothing */
    float *ws_dsum;  /* [B, H, nq_pad]: rowsum(dO * O) */
    float *dq_accum; /* [B, H, nq_pad, DK] f32 (DK: the kernel's head dim), atomic mode only */
    int nq_pad;
    int dq_atomic; /* the dK/dV kernel also accumulates dQ (atomic mode) */
    /* GQA group splits: each kv head's query heads in group_splits contiguous slices, one dK/dV
     * block per (key block, slice); with more than one, each block writes its f32 sums to
     * dkv_part, [2 (dV, dK), group_splits, B, Hkv, nk_pad, DK], and a second kernel adds them */
    int group_splits;
    int nk_pad;
    float *dkv_part;
} fp_sm80_args;

/* The argument block of a validated problem (forward and backward fields). */
static inline void fp_sm80_fill_args(const fp_problem *p, fp_sm80_args *a)
{
    memset(a, 0, sizeof *a);
    fp_kernel_args_fill(p, a);
    a->group_splits = 1;
}

/* Launches the split-KV combine of the forward (sm80/fwd.cu) on a's partials: every path's
 * split forward writes the same o_part / lse_part layout. */
cudaError_t fp_cuda_fwd_combine(const fp_problem *p, const fp_sm80_args *a, cudaStream_t stream);

/* A forward's split-KV plan in a: `splits` splits of keys_per_split keys, and their partials in
 * the workspace, the normalized O (f32) and the LSE of every (split, b, h, row), a's o_part then
 * lse_part. Returns the partials' bytes (0 for one split: no workspace); with ws (a workspace of
 * that size), points a at them. */
static inline size_t fp_cuda_fwd_splits(const fp_problem *p, fp_sm80_args *a, int splits,
                                        int64_t keys_per_split, void *ws)
{
    a->splits = splits;
    a->keys_per_split = keys_per_split;
    if (splits <= 1)
        return 0;
    const size_t rows = (size_t)splits * p->batch * p->heads * a->nq;
    if (ws) {
        a->o_part = (float *)ws;
        a->lse_part = a->o_part + rows * a->d;
    }
    return rows * (size_t)(a->d + 1) * sizeof(float);
}

/* Where sequence b's tokens start and how many there are: fp_seq_lookup (core/geometry.h) with
 * the lengths narrowed to int, as the kernels index with 32-bit positions. */
typedef struct fp_cuda_seq {
    int64_t q_start, k_start;
    int nq, nk;
} fp_cuda_seq;

FP_DEV fp_cuda_seq fp_cuda_seq_of(const fp_sm80_args &a, int b)
{
    /* nk: the keys the sequence uses (seqused_k, clamped to its capacity) */
    const fp_seq q = fp_seq_lookup_used(a.cu_q, a.cu_k, a.seqused_k, a.nq, a.nk, b);
    fp_cuda_seq s;
    s.q_start = q.q_start;
    s.k_start = q.k_start;
    s.nq = (int)q.nq;
    s.nk = (int)q.nk;
    return s;
}

/* Element offset of row (b, token, h) of a view; token is the packed index (start + position). */
FP_DEV int64_t fp_cuda_row(const fp_kernel_tensor &v, int b, int64_t token, int h)
{
    return (int64_t)b * v.sb + token * v.ss + (int64_t)h * v.sh;
}

/* Element offset of the LSE of row (b, token, h) in the (B, H, Nq) LSE tensor; token as in
 * fp_cuda_row. */
FP_DEV int64_t fp_cuda_lse_off(const fp_sm80_args &a, int b, int64_t token, int h)
{
    return (int64_t)b * a.lse_sb + (int64_t)h * a.lse_sh + token * a.lse_ss;
}

/* fp_mask_visible (core/mask.h) in 32-bit integers for one sequence, for per-element masking:
 * key j is visible from row i iff i + lo_off <= j < i + hi_off and j < nk (the same
 * inequalities; an unbounded side gets an offset no position reaches). Positions < 2^30. */
typedef struct fp_mask32 {
    int lo_off, hi_off, nk;
} fp_mask32;

FP_DEV fp_mask32 fp_mask32_make(int nq, int nk, int64_t left, int64_t right)
{
    const int64_t lim = (int64_t)1 << 30;
    int64_t lo = left < 0 ? -lim : (int64_t)nk - nq - left;
    int64_t hi = right < 0 ? lim : (int64_t)nk - nq + right + 1;
    fp_mask32 m;
    m.lo_off = (int)(lo < -lim ? -lim : lo > lim ? lim : lo);
    m.hi_off = (int)(hi < -lim ? -lim : hi > lim ? lim : hi);
    m.nk = nk;
    return m;
}

FP_DEV bool fp_mask32_visible(const fp_mask32 &m, int i, int j)
{
    return j >= i + m.lo_off && j < i + m.hi_off && j < m.nk;
}

/* fp_mask32_visible for one row i and the keys jb + c: key jb + c is visible iff lo <= c < hi.
 * Per element that is two compares against an immediate c, instead of three against keys. */
typedef struct fp_mask_row {
    int lo, hi;
} fp_mask_row;

FP_DEV fp_mask_row fp_mask32_row(const fp_mask32 &m, int i, int jb)
{
    fp_mask_row r;
    r.lo = i + m.lo_off - jb;
    r.hi = min(i + m.hi_off, m.nk) - jb;
    return r;
}

FP_DEV bool fp_mask_row_visible(const fp_mask_row &r, int c)
{
    return c >= r.lo && c < r.hi;
}

/* Score x of query row (position) i and key j under softcap and ALiBi, in log2 units:
 * fp_score_transform (core/mask.h) of the scaled score, times log2(e). The per-element transform
 * of the forward kernels' score steps (fp_fwd_scores, the decode kernel's). */
FP_DEV float fp_score_log2(const fp_sm80_args &a, float x, float slope, int i, int j, int nq,
                           int nk)
{
    return fp_score_transform(x * a.scale, a.softcap, slope, fp_alibi_distance(i, j, nq, nk)) *
           FP_LOG2E;
}

/* How a block of scores is treated: all visible, per-element mask, or mask plus softcap/ALiBi.
 * A template argument, so each variant is straight-line code (a run-time test per element
 * would split the unrolled tile into hundreds of branches). */
enum { FP_SCORES_FULL, FP_SCORES_MASK, FP_SCORES_TRANSFORM };

/* ---- softmax finalize ---------------------------------------------------------------------- */

/* The lazy rescale of the forward kernels (sm80, sm90 and decode; "LAZY" in their
 * configurations): O and l are rescaled only when some row of a warp sees a block maximum more
 * than FP_RESCALE_SLACK (log2 units) above the maximum its exponentials use; otherwise that
 * maximum stays, P <= 2^8 (within f16) and the rescale (D / 8 x 4 multiplies per row pair, an
 * exp2 per row) is skipped. O / l and LSE = m + log l come out the same: both use the same m.
 * After the first key blocks a row's maximum rarely grows by that much, so most blocks skip it.
 * The table's large-logit cases make rows rescale mid-row; a forward that never rescales fails
 * the f16 ones (P overflows). */
#define FP_RESCALE_SLACK 8.0f

/* The rescale of a warp's MT row tiles of the mma layout (this thread's rows g and g + 8 of
 * each: r = 0, 1): each row's state takes its block maximum mxs (log2 units) and its O elements
 * the factor. The lazy kernels call it only when some row grew by more than FP_RESCALE_SLACK. */
template <int MT, int DT8>
FP_DEV void fp_rescale_rows(float (&o)[MT][DT8][4], fp_softmax_state (&st)[MT][2],
                            const float (&mxs)[MT][2])
{
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float alpha = fp_softmax_update_exp2(&st[mt][r], mxs[mt][r]);
#pragma unroll
            for (int j = 0; j < DT8; ++j) {
                o[mt][j][2 * r] *= alpha;
                o[mt][j][2 * r + 1] *= alpha;
            }
        }
}

/* fp_softmax_out_scale and fp_softmax_lse_exp2 (core/online_softmax.h) through fp_rcp and
 * fp_log2: the same rules (a row that saw nothing: 0 and -inf; a NaN l, from a visible NaN
 * score, stays NaN), branch-free. */
FP_DEV float fp_cuda_out_scale(const fp_softmax_state *s)
{
    return s->l == 0.0f ? 0.0f : fp_rcp(s->l);
}

FP_DEV float fp_cuda_lse_exp2(const fp_softmax_state *s)
{
    return s->l == 0.0f ? -INFINITY : s->m * FP_LN2 + fp_log2(s->l) * FP_LN2;
}

/* ---- swizzled shared-memory tiles ---------------------------------------------------------- */

/* Element offset of 16-byte chunk `chunk` of row `row` in a tile of COLS columns. */
template <int COLS> FP_DEV int fp_swz(int row, int chunk)
{
    static_assert(COLS % 64 == 0, "swizzle needs at least 8 chunks per row");
    return row * COLS + ((chunk ^ (row & 7)) << 3);
}

/* ldmatrix x4 addressing. Every lane supplies the address of one 16-byte row piece: lane l
 * reads row R(l) and chunk 2 * pair + C(l) of a 16-row block. With rows starting at multiples
 * of 8, the swizzle XOR depends only on the lane, and (2 * pair + C) ^ (R % 8) equals
 * 8 * (pair / 4) + ((2 * (pair % 4)) ^ (C ^ R % 8)): four per-lane offsets plus a compile-time
 * immediate cover every address (precomputing one address per k step instead costs dozens of
 * registers). The lane patterns, for the fragments of the mma (see top of file):
 *   A   [m][k] tile:  R = l % 16,                  C = l / 16           -> a0..a3
 *   B   [n][k] tile:  R = 8 (l / 16) + l % 8,      C = (l / 8) % 2      -> b0,b1 of n tiles 0, 1
 *   Bt  [k][n] tile:  R = 8 ((l / 8) % 2) + l % 8, C = l / 16  (.trans) -> b0,b1 of n tiles 0, 1
 *   At  [k][m] tile:  same lanes as B           (.trans)              -> a0..a3 of A = tile^T */
typedef struct fp_ldsm_lane {
    uint32_t off[4]; /* bytes, row_base and this lane's row and chunk folded in */
} fp_ldsm_lane;

template <int COLS> FP_DEV fp_ldsm_lane fp_ldsm_lane_make(int row_base, int r, int c)
{
    static_assert(COLS % 64 == 0, "swizzle needs at least 8 chunks per row");
    fp_ldsm_lane l;
    const int x = c ^ (r & 7);
#pragma unroll
    for (int m = 0; m < 4; ++m)
        l.off[m] = (uint32_t)(((row_base + r) * COLS + (((2 * m) ^ x) << 3)) * 2);
    return l;
}
template <int COLS> FP_DEV fp_ldsm_lane fp_lane_a(int row_base, int lane)
{
    return fp_ldsm_lane_make<COLS>(row_base, lane & 15, lane >> 4);
}
FP_DEV int fp_lane_b_row(int lane)
{
    return ((lane >> 4) << 3) + (lane & 7);
}
FP_DEV int fp_lane_b_chunk(int lane)
{
    return (lane >> 3) & 1;
}
FP_DEV int fp_lane_bt_row(int lane)
{
    return (((lane >> 3) & 1) << 3) + (lane & 7);
}
FP_DEV int fp_lane_bt_chunk(int lane)
{
    return lane >> 4;
}
template <int COLS> FP_DEV fp_ldsm_lane fp_lane_b(int row_base, int lane)
{
    return fp_ldsm_lane_make<COLS>(row_base, fp_lane_b_row(lane), fp_lane_b_chunk(lane));
}
template <int COLS> FP_DEV fp_ldsm_lane fp_lane_bt(int row_base, int lane)
{
    return fp_ldsm_lane_make<COLS>(row_base, fp_lane_bt_row(lane), fp_lane_bt_chunk(lane));
}

/* One lane offset for a chunk pair fixed at run time (same lane patterns). */
template <int COLS> FP_DEV uint32_t fp_ldsm_off(int row_base, int r, int c, int pair)
{
    return (uint32_t)(((row_base + r) * COLS + (((2 * pair + c) ^ (r & 7)) << 3)) * 2);
}
template <int COLS> FP_DEV uint32_t fp_ldsm_off_b(int row_base, int lane, int pair)
{
    return fp_ldsm_off<COLS>(row_base, fp_lane_b_row(lane), fp_lane_b_chunk(lane), pair);
}
template <int COLS> FP_DEV uint32_t fp_ldsm_off_bt(int row_base, int lane, int pair)
{
    return fp_ldsm_off<COLS>(row_base, fp_lane_bt_row(lane), fp_lane_bt_chunk(lane), pair);
}

/* Address of the 16 x 16 block at rows row0.. (a multiple of 8, relative to the lane's
 * row_base) and chunks 2 pair, 2 pair + 1 of the tile at shared address `tile`. */
template <int COLS>
FP_DEV uint32_t fp_ldsm_addr(uint32_t tile, const fp_ldsm_lane &l, int row0, int pair)
{
    return tile + l.off[pair & 3] + (uint32_t)((row0 * COLS + (pair >> 2) * 64) * 2);
}

/* Global rows -> shared tile [ROWS][COLS] with cp.async: row r from src + r * stride (16-byte
 * aligned rows: the host stages other layouts, see layout.cu). Rows >= nrows and chunks >=
 * nchunks are zero-filled, so padded head dims and ragged ends add nothing to any product.
 * FAST: a tile wholly inside (nrows >= ROWS, every chunk) is copied without the per-row test
 * and pointer select; more code, which costs registers in some kernels (see fp_fwd_cfg). */
template <int ROWS, int COLS, int NT, bool FAST = false, typename T>
FP_DEV void fp_load_tile(T *tile, const T *src, int64_t stride, int nrows, int nchunks, int tid)
{
    constexpr int CH = COLS / 8;
    static_assert((ROWS * CH) % NT == 0 && NT % CH == 0, "tile copy must split evenly");
    const int r0 = tid / CH, c = tid % CH;
    const uint32_t dst0 = fp_smem_addr(tile);
    const T *from = src + r0 * stride + c * 8;
    const int64_t step = (int64_t)(NT / CH) * stride;
    if (FAST && nrows >= ROWS && nchunks == CH) {
#pragma unroll
        for (int it = 0; it < ROWS * CH / NT; ++it) {
            fp_cp_async16(dst0 + 2u * fp_swz<COLS>(r0 + it * (NT / CH), c), from, 16);
            from += step;
        }
        return;
    }
#pragma unroll
    for (int it = 0; it < ROWS * CH / NT; ++it) {
        const int r = r0 + it * (NT / CH);
        const bool ok = r < nrows && c < nchunks;
        fp_cp_async16(dst0 + 2u * fp_swz<COLS>(r, c), ok ? (const void *)from : (const void *)src,
                      ok ? 16 : 0);
        from += step;
    }
}

/* ---- the masked-key guard (docs/reliability.md, "the NaN rule") ----------------------------
 * A tensor-core product multiplies a masked P or dS of exactly 0 by its operand, and 0 x NaN and
 * 0 x inf are NaN: a key (or query) that a row cannot see would reach it through a non-finite
 * operand. In the blocks that hold masked pairs, the kernels therefore scrub the operands that
 * meet masked zeros (fp_scrub_tile) and put the NaN back, by a select, where a visible pair met a
 * scrubbed row. Blocks that every row sees whole never call these. */

/* w (two 16-bit T values) with its infinite and NaN halves set to 0; bad |= it had one. */
template <typename T> FP_DEV uint32_t fp_scrub_word(uint32_t w, bool &bad)
{
    constexpr uint32_t E = std::is_same<T, __half>::value ? 0x7c00u : 0x7f80u; /* exponent */
    uint32_t keep = 0u;
    if ((w & E) != E)
        keep |= 0x0000ffffu;
    if (((w >> 16) & E) != E)
        keep |= 0xffff0000u;
    bad |= keep != 0xffffffffu;
    return w & keep;
}

/* Whether v (8 T values) holds an infinite or NaN element, in a few integer operations: with E
 * the exponent field and A its lowest bit, a half's (bits & E) + A reaches 0x8000 (its sign bit)
 * exactly when its exponent is all ones, and never carries into the next half. */
template <typename T> FP_DEV bool fp_vec_nonfinite(const uint4 &v)
{
    constexpr uint32_t E = std::is_same<T, __half>::value ? 0x7c00u : 0x7f80u, A = E & (0u - E);
    constexpr uint32_t E2 = E | E << 16, A2 = A | A << 16;
    const uint32_t sum =
        ((v.x & E2) + A2) | ((v.y & E2) + A2) | ((v.z & E2) + A2) | ((v.w & E2) + A2);
    return (sum & 0x80008000u) != 0u;
}

/* v (8 T values) with its infinite and NaN elements set to 0; returns whether it had one. */
template <typename T> FP_DEV bool fp_scrub_vec(uint4 &v)
{
    if (!fp_vec_nonfinite<T>(v))
        return false;
    bool bad = false;
    v.x = fp_scrub_word<T>(v.x, bad);
    v.y = fp_scrub_word<T>(v.y, bad);
    v.z = fp_scrub_word<T>(v.z, bad);
    v.w = fp_scrub_word<T>(v.w, bad);
    return bad;
}

/* The masked-key guard's test of a backward step's BM query rows (their LSE2 and Dsum, the side
 * pass's, in shared memory): whether some row may hold a non-finite Q or dO element, the same
 * answer in every warp (so that the scrub's barrier is reached by all or none). A non-finite dO
 * element makes Dsum = rowsum(dO * O) non-finite; a non-finite Q element makes the forward's
 * LSE of the row NaN if the row sees a key, and a row that sees none has LSE2 = +inf (as have
 * rows past the sequence). So rows whose LSE2 and Dsum are both finite need no scrub, given the
 * LSE that the forward computed from this Q. */
template <int BM> FP_DEV bool fp_rows_suspect(const float *lse2, const float *dsum)
{
    const int lane = threadIdx.x & 31;
    bool bad = false;
#pragma unroll
    for (int r = lane; r < BM; r += 32)
        bad |= !(isfinite(lse2[r]) && isfinite(dsum[r]));
    return __any_sync(0xffffffffu, bad);
}

/* The 16 bytes at p (8 T values) with their infinite and NaN elements set to 0 (written back only
 * if there was one); returns whether there was. */
template <typename T> FP_DEV bool fp_scrub_chunk(uint4 *p)
{
    uint4 v = *p;
    const bool bad = fp_scrub_vec<T>(v);
    if (bad)
        *p = v;
    return bad;
}

/* Replaces every infinite or NaN element of a swizzled shared tile [ROWS][COLS] by 0 and sets
 * flags[r] to 1 for each row r that held one, 0 for the others. All NT threads of the block call
 * it (the row's CH chunk owners are consecutive lanes of one warp, which OR their findings with
 * shuffles); the caller's barriers order it after the tile landed and before its readers. */
template <int ROWS, int COLS, int NT, typename T>
FP_DEV void fp_scrub_tile(T *tile, uint8_t *flags, int tid)
{
    constexpr int CH = COLS / 8;
    static_assert(32 % CH == 0 && (ROWS * CH) % NT == 0 && NT % 32 == 0,
                  "a row's chunks lie in one warp, and the tile splits evenly");
    /* not unrolled: it runs where the kernels hold their accumulators, and should take as few
     * registers as it can */
#pragma unroll 1
    for (int it = 0; it < ROWS * CH / NT; ++it) {
        const int idx = tid + it * NT, r = idx / CH, c = idx % CH;
        const bool bad = fp_scrub_chunk<T>(reinterpret_cast<uint4 *>(tile + fp_swz<COLS>(r, c)));
        uint32_t any = bad ? 1u : 0u;
#pragma unroll
        for (int off = 1; off < CH; off <<= 1)
            any |= __shfl_xor_sync(0xffffffffu, any, off);
        if (c == 0)
            flags[r] = (uint8_t)any;
    }
}

/* Shared tile -> global rows, rows < nrows and chunks < nchunks only (16-byte stores). */
template <int ROWS, int COLS, int NT, typename T>
FP_DEV void fp_store_tile(T *dst, int64_t stride, const T *tile, int nrows, int nchunks, int tid)
{
    constexpr int CH = COLS / 8;
    static_assert((ROWS * CH) % NT == 0 && NT % CH == 0, "tile copy must split evenly");
    const int r0 = tid / CH, c = tid % CH;
#pragma unroll
    for (int it = 0; it < ROWS * CH / NT; ++it) {
        const int r = r0 + it * (NT / CH);
        if (r < nrows && c < nchunks)
            *reinterpret_cast<uint4 *>(dst + r * stride + c * 8) =
                *reinterpret_cast<const uint4 *>(tile + fp_swz<COLS>(r, c));
    }
}

/* Writes a warp's C fragments (16 rows from row0, NT8 tiles of 8 columns from chunk0), times a
 * per-row factor, into a shared tile as T. */
template <int COLS, int NT8, typename T>
FP_DEV void fp_stage_acc(T *tile, int row0, int chunk0, const float (*acc)[4], float f_lo,
                         float f_hi, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NT8; ++j) {
        *reinterpret_cast<uint32_t *>(tile + fp_swz<COLS>(row0 + g, chunk0 + j) + 2 * t) =
            fp_pack2<T>(acc[j][0] * f_lo, acc[j][1] * f_lo);
        *reinterpret_cast<uint32_t *>(tile + fp_swz<COLS>(row0 + g + 8, chunk0 + j) + 2 * t) =
            fp_pack2<T>(acc[j][2] * f_hi, acc[j][3] * f_hi);
    }
}

/* Zeroes a warp's accumulator fragments: N m16n8 tiles of 4 floats a lane, or M x N of them. */
template <int N> FP_DEV void fp_acc_zero(float (&c)[N][4])
{
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            c[j][e] = 0.0f;
}
template <int M, int N> FP_DEV void fp_acc_zero(float (&c)[M][N][4])
{
#pragma unroll
    for (int i = 0; i < M; ++i)
        fp_acc_zero(c[i]);
}

/* The A fragment of k step kk from the C fragments of n tiles 2kk and 2kk+1 (see top of file). */
template <typename T> FP_DEV void fp_acc_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = fp_pack2<T>(c0[0], c0[1]);
    a[1] = fp_pack2<T>(c0[2], c0[3]);
    a[2] = fp_pack2<T>(c1[0], c1[1]);
    a[3] = fp_pack2<T>(c1[2], c1[3]);
}

/* ---- warp-tile products -------------------------------------------------------------------- */

/* The order of a k step's instructions in fp_warp_mma (the loads before the products that use
 * them either way; the choice is each kernel's, by what its registers allow):
 *   FP_MMA_LOAD_ALL: every A and B fragment of the step, then its mma: the load latency is paid
 *     once per step;
 *   FP_MMA_STREAM_B: the A fragments, then each B piece's load followed by its mma: one B
 *     fragment live at a time. */
enum { FP_MMA_LOAD_ALL, FP_MMA_STREAM_B };

/* C += A B for one warp over KS k steps of 16 (mma.sync m16n8k16): A is MT pieces of 16 rows,
 * B is NP pieces of 16 columns, C the MT x 2 NP m16n8 accumulator tiles c[mi][2 p], c[mi][2 p
 * + 1] of piece (mi, p). B comes from a loader, ld_b(frag, p, kk), that fills piece p's fragment
 * at k step kk (an ldmatrix or ldmatrix.trans of a shared tile). A likewise (ld_a(frag, mi, kk);
 * a fragment computed from registers, such as dS, works the same way), or with A_REG from a
 * getter, ld_a(mi, kk), that returns a fragment already held in registers (P): its fragments are
 * then used where they are, not copied (a copy changes the register allocation of the kernels
 * that keep P). With TWO, a second product of the same shape (c2 += A2 B2) runs in the same k
 * loop, its loads and mma each right after the first's, so that the two share the load latency.
 * Callers use fp_warp_mma, fp_warp_mma_ra and fp_warp_mma2. */
template <typename T, int KS, int ORDER, bool TWO, bool A_REG, int MT, int N8, class LA, class LB,
          class LA2, class LB2>
FP_DEV void fp_warp_mma_k(float (&c)[MT][N8][4], const LA &ld_a, const LB &ld_b,
                          float (&c2)[MT][N8][4], const LA2 &ld_a2, const LB2 &ld_b2)
{
    static_assert(N8 % 2 == 0, "B pieces of 16 columns");
    static_assert(!(TWO && A_REG), "one product with A in registers");
    constexpr int NP = N8 / 2;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
        uint32_t af[MT][4], af2[MT][4];
        if constexpr (!A_REG) {
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                ld_a(af[mi], mi, kk);
                if constexpr (TWO)
                    ld_a2(af2[mi], mi, kk);
            }
        }
        /* the A x B products of piece p (B fragment bf, B2 fragment bf2) */
        auto mma_p = [&](int p, const uint32_t(&bf)[4], const uint32_t(&bf2)[4]) {
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                if constexpr (A_REG) {
                    fp_mma<T>(c[mi][2 * p], ld_a(mi, kk), bf[0], bf[1]);
                    fp_mma<T>(c[mi][2 * p + 1], ld_a(mi, kk), bf[2], bf[3]);
                } else {
                    fp_mma<T>(c[mi][2 * p], af[mi], bf[0], bf[1]);
                    fp_mma<T>(c[mi][2 * p + 1], af[mi], bf[2], bf[3]);
                }
                if constexpr (TWO) {
                    fp_mma<T>(c2[mi][2 * p], af2[mi], bf2[0], bf2[1]);
                    fp_mma<T>(c2[mi][2 * p + 1], af2[mi], bf2[2], bf2[3]);
                }
            }
        };
        if constexpr (ORDER == FP_MMA_LOAD_ALL) {
            uint32_t bf[NP][4], bf2[NP][4];
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                ld_b(bf[p], p, kk);
                if constexpr (TWO)
                    ld_b2(bf2[p], p, kk);
            }
#pragma unroll
            for (int p = 0; p < NP; ++p)
                mma_p(p, bf[p], bf2[p]);
        } else {
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                uint32_t bf[4], bf2[4];
                ld_b(bf, p, kk);
                if constexpr (TWO)
                    ld_b2(bf2, p, kk);
                mma_p(p, bf, bf2);
            }
        }
    }
}

/* One product: c += A B, A loaded by ld_a(frag, mi, kk) (fp_warp_mma_k). */
template <typename T, int KS, int ORDER, int MT, int N8, class LA, class LB>
FP_DEV void fp_warp_mma(float (&c)[MT][N8][4], const LA &ld_a, const LB &ld_b)
{
    fp_warp_mma_k<T, KS, ORDER, false, false>(c, ld_a, ld_b, c, ld_a, ld_b);
}

/* One product: c += A B, A in registers, ld_a(mi, kk) its fragment (fp_warp_mma_k). */
template <typename T, int KS, int ORDER, int MT, int N8, class LA, class LB>
FP_DEV void fp_warp_mma_ra(float (&c)[MT][N8][4], const LA &ld_a, const LB &ld_b)
{
    fp_warp_mma_k<T, KS, ORDER, false, true>(c, ld_a, ld_b, c, ld_a, ld_b);
}

/* Two products in one k loop: c += A B and c2 += A2 B2 (fp_warp_mma_k). */
template <typename T, int KS, int ORDER, int MT, int N8, class LA, class LB, class LA2, class LB2>
FP_DEV void fp_warp_mma2(float (&c)[MT][N8][4], const LA &ld_a, const LB &ld_b,
                         float (&c2)[MT][N8][4], const LA2 &ld_a2, const LB2 &ld_b2)
{
    fp_warp_mma_k<T, KS, ORDER, true, false>(c, ld_a, ld_b, c2, ld_a2, ld_b2);
}

/* Rows (and keys, in the group-split partials) are padded to this in the workspaces, a multiple
 * of every kernel's query and key block. */
#define FP_BWD_ROW_PAD 128

/* Index of row i of (batch b, head h) in the [B, H, nq_pad] workspaces (a row of dq_accum is
 * DK floats). */
FP_DEV int64_t fp_bwd_ws_row(const fp_sm80_args &a, int b, int h, int64_t i)
{
    return ((int64_t)b * a.heads + h) * a.nq_pad + i;
}

/* The steps of a dK/dV kernel: every query block mb_lo <= mb < mb_end that sees the key block,
 * for each query head of the kv head's group in turn. Walked with counters: a division per step
 * costs about twenty instructions per thread. fp_bwd_next_step walks the query blocks first to
 * last (the sm80 kernels), fp_bwd_prev_step last to first (the sm90 kernel: sm90/bwd.cuh says
 * why); either moves to the next query head after the last block. */
FP_DEV void fp_bwd_next_step(int &h, int &mb, int mb_lo, int mb_end)
{
    if (++mb == mb_end) {
        mb = mb_lo;
        ++h;
    }
}
FP_DEV void fp_bwd_prev_step(int &h, int &mb, int mb_lo, int mb_end)
{
    /* selects, not fp_bwd_next_step's branch: the sm90 kernel's machine code is then the same
     * as with the walk written out in place */
    const bool wrap = --mb < mb_lo;
    mb = wrap ? mb_end - 1 : mb;
    h += wrap ? 1 : 0;
}

/* Row n (a key of sequence b) of kv head kvh in slice `split`'s partial dV (c = 0) or dK (c = 1)
 * of the group-split workspace (a row is DK floats). */
FP_DEV int64_t fp_bwd_part_row(const fp_sm80_args &a, int c, int split, int b, int kvh, int n)
{
    const int kv_heads = a.heads / a.group;
    return ((((int64_t)c * a.group_splits + split) * a.batch + b) * kv_heads + kvh) * a.nk_pad + n;
}

/* The dQ accumulator is stored in mma fragment order, so that each warp's atomics are
 * coalesced: every band of 16 rows (16 x DK floats, where rows 16 R .. 16 R + 15 would be) holds
 * its 16 x 8 pieces one after another, column piece C at 128 C, and within a piece the lane that
 * owns an element in the m16n8 accumulator layout comes first: row 8 r + g, columns 2 t and
 * 2 t + 1 (lane 4 g + t) at 64 r + 2 (4 g + t). A warp's 8-byte reduction then covers 256
 * contiguous bytes, two cache lines, instead of eight rows of 32 bytes: the dQ reductions are a
 * bottleneck of the backward (A/B: docs/bench/archive/, pfirst). Returns the offset of row i's
 * column c from the start of row i's band (c even: c and c + 1 are adjacent). */
FP_DEV int fp_dq_frag_off(int i, int c)
{
    return (c / 8) * 128 + ((i % 16) / 8) * 64 + (i % 8) * 8 + (c % 8);
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

/* The backward's side passes (sm80/bwd.cu), which the sm90 backward shares: the workspace
 * ([B, H, nq_pad] LSE * log2(e) and Dsum; in atomic mode the [B, H, nq_pad, dk] f32 dQ
 * accumulator in fp_dq_frag_off's order; with GQA group splits each slice's f32 dV and dK,
 * fp_bwd_part_row), the pass that fills it (and zeroes the accumulator), the pass that adds the
 * slices' dK/dV in slice order into dk and dv, and the pass that scales the accumulator into dq.
 * dk is the kernel's head dim (64, 128 or 256). fp_cuda_bwd_side_setup sets a's nq_pad, nk_pad,
 * dq_atomic (= accumulate: dQ goes through the accumulator), group_splits and (ws != NULL) the
 * workspace pointers, and returns the bytes (0: nothing to do). fp_cuda_bwd_group_splits: the
 * planner's group splits (core/plan.h) for a kernel of block_k keys a block, or the count that
 * FLASHPORT_CUDA_GROUP_SPLITS forces. */
size_t fp_cuda_bwd_side_setup(const fp_problem *p, fp_sm80_args *a, int dk, int accumulate,
                              int group_splits, void *ws);
int fp_cuda_bwd_group_splits(const fp_cuda_ctx *ctx, const fp_problem *p, int block_k);
cudaError_t fp_cuda_bwd_side_pre(const fp_problem *p, const fp_sm80_args &a, int dk,
                                 cudaStream_t stream);
cudaError_t fp_cuda_bwd_side_dkdv_sum(const fp_problem *p, const fp_sm80_args &a, int dk,
                                      cudaStream_t stream);
cudaError_t fp_cuda_bwd_side_dq(const fp_problem *p, const fp_sm80_args &a, int dk,
                                cudaStream_t stream);
/* Zeroes dk and dv at the keys [nk, capacity) of seqused_k's sequences (sm80/bwd.cu). */
void fp_cuda_bwd_zero_unused(const fp_problem *p, const fp_sm80_args &a, cudaStream_t stream);

/* The sm80 kernel families: one per kernel head dim (the classes of FP_SM80_DK_CLASSES,
 * sm80/config.h) and element type T (__half, __nv_bfloat16). A family's run launches its
 * kernels in the configuration fp_sm80_pick chooses (the forward's: `alt`, an ALT of
 * sm80/config.h), or with query != NULL sets *query to the workspace bytes. The launchers
 * (sm80/fwd.cu, sm80/bwd.cu) see only these declarations; the kernel headers (sm80/fwd.cuh,
 * sm80/bwd.cuh) define them, and one small file per head dim instantiates both dtypes
 * (sm80/inst/fwd_d64.cu, ...; backends/cuda/CMakeLists.txt compiles them with their launcher). */
template <typename T, int DK> struct fp_sm80_fwd_family {
    static flashport_status run(const fp_cuda_ctx *ctx, const fp_problem *p, const fp_sm80_args &a,
                                int alt, void *ws, size_t *query);
};
template <typename T, int DK> struct fp_sm80_bwd_family {
    static flashport_status run(const fp_cuda_ctx *ctx, const fp_problem *p, const fp_sm80_args &a,
                                void *ws, size_t *query);
};

/* The decode kernel's families (decode/fwd.cu; the same instructions and argument block as the
 * sm80 kernels): one per head-dim class of FP_DECODE_DK_CLASSES and element type T. run picks
 * the row tiles a block holds and launches, or with query != NULL sets *query to the workspace
 * bytes. decode/fwd.cuh defines it; decode/inst/fwd_d64.cu, ... instantiate both dtypes. */
#define FP_DECODE_DK_CLASSES 64, 128, 256
template <typename T, int DK> struct fp_decode_fwd_family {
    static flashport_status run(const fp_cuda_ctx *ctx, const fp_problem *p, const fp_sm80_args &a,
                                void *ws, size_t *query);
};

#endif /* FLASHPORT_BACKENDS_CUDA_SM80_COMMON_CUH */
