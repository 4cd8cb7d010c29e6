/*
 * Flash attention in OpenCL C: forward, and backward by recomputation from the LSE.
 *
 * Algorithm (FlashAttention-2's schedule, as backends/hip/attention_tile.h):
 *   forward     one work-group per (query block, head, batch). The query tile stays in local
 *               memory; key blocks stream through one local buffer (K, then V of the same block);
 *               S = scale Q K^T with the mask and score transforms of core/mask.h, then the
 *               online softmax of core/online_softmax.h (fp_softmax_update / weight / out_scale /
 *               lse, natural-exp variant: one row's state lives in one work-item), O in registers.
 *   backward dq one work-group per (query block, head, batch): delta = rowsum(dO * O) for its rows
 *               (written for the dK/dV pass), then dQ over the visible key blocks.
 *   backward dk one work-group per (key block, kv head, batch): dK and dV over every query head
 *               of the kv head and every query block that sees the keys.
 *   Every sum runs in a fixed order and nothing is accumulated across work-groups, so the
 *   backward is deterministic whether asked or not, and extra memory is the delta (B H Nq f32).
 *   KV cache: a sequence's key count is core/geometry.h's fp_seq_used_keys (seqused_k, clamped
 *   on the device), every mask and key range aligned to it; K / V rows come through
 *   kernels/shape.cl's fp_ocl_row_at, dense or paged (fp_paged_page, forward only). Keys past
 *   the count and rows of out-of-range pages are zero-filled, never read; the latter are masked.
 *   Masked keys holding NaN or inf reach no row and no key that cannot see them: the guard of
 *   kernels/shape.cl (FP_OCL_BAD) scrubs the operand tiles of edge blocks as they are copied.
 *
 * Target: any OpenCL 1.2 device: f32 arithmetic; storage f32, f16 or bf16 (kernels/shape.cl),
 * chosen at program build time by FP_OCL_DTYPE (0, 1, 2), with the head-dim class FP_OCL_D and
 * the tile FP_OCL_T. A work-group is FP_OCL_WG = 128 work-items; each owns register micro-tiles
 * of the score and output tiles, laid out by a micro-tile policy: the plain one below (f32 FMAs
 * from local memory, every device), or with FP_OCL_MMA = 1 the tensor-core one of
 * kernels/mma_nv.cl (mma.sync through inline PTX on NVIDIA, f16 / bf16 storage, T >= 16; or its
 * local-memory emulation with FP_OCL_MMA_EMULATE = 1, the test of its layouts on any device).
 * The kernels below are written once over the policy.
 *
 * Configuration (fp_ocl_plan in ocl_plan.h; T = query rows = keys per tile):
 *   T = the largest of 64, 32, 16, 8 with (T / 8) * ceil(D / 16) <= FP_OCL_ACC (32) whose local
 *   tiles fit the device's local memory. Plain path: PoCL: 64 (D <= 64), 32 (D <= 128), 16
 *   (D <= 256); a 48 KiB device: forward 64 (D <= 32), 32 (D <= 128), 16; backward 32 (D <= 64),
 *   16 (D <= 128), 8. The tensor-core policy's 16-bit tiles: mma_nv.cl.
 *
 * Known differences from the reference: f32 accumulation (the reference uses double); P is not
 * rounded to the storage type before P V on the plain path (the tensor-core one rounds P and dS
 * to it, as the CUDA path does); the dtype rounding of f16 / bf16 outputs is
 * round-to-nearest-even as core/dtype.h. Numbers: docs/opencl.md.
 */

/* Where sequence b's tokens start and how many there are (core/geometry.h's fp_seq_lookup), nk
 * cut to the keys it uses (fp_seq_used_keys: seqused_k clamped to [0, k_cap], so a bad value
 * never reads past the sequence). Every mask, window and ALiBi distance below takes nk. */
typedef struct fp_ocl_seq {
    long q_start, nq, k_start, nk;
    long k_cap; /* the keys the sequence holds: the backward's dK / dV rows [nk, k_cap) are 0 */
} fp_ocl_seq;

FP_OCL_INLINE fp_ocl_seq fp_ocl_seq_of(const fp_ocl_args *a, __global const int *cu_q,
                                       __global const int *cu_k, __global const int *used, long b)
{
    const fp_seq q = fp_seq_lookup(a->varlen ? cu_q + a->cu_q_off : 0,
                                   a->varlen ? cu_k + a->cu_k_off : 0, a->nq, a->nk, (int)b);
    fp_ocl_seq s;
    s.q_start = q.q_start;
    s.nq = q.nq;
    s.k_start = q.k_start;
    s.k_cap = q.nk;
    s.nk = fp_seq_used_keys(a->has_used ? used + a->used_off : 0, (int)b, q.nk);
    return s;
}

/* The openings of the kernels (flash.cl's and flash_fa2.cl's), from their arguments (ap: the
 * fp_ocl_args, by pointer; cu_q, cu_k and used taken by those names). Macros because they declare
 * the kernel's own variables and return from it where the work-group's block lies past its
 * sequence (the whole work-group, before any barrier).
 *
 * FP_OCL_BLOCK_OF: tid (the work-item), hd (the problem's head dim), head (the head
 * get_group_id(1) names), b and s (the sequence, fp_ocl_seq_of), x0 the block's first row, n rows
 * a block; returns where x0 >= end. FP_OCL_BLOCK: blocks of T rows. */
#define FP_OCL_BLOCK_OF(ap, head, x0, end, n)                                                      \
    const int tid = get_local_id(0), hd = (int)(ap)->head_dim;                                     \
    const long head = get_group_id(1), b = get_group_id(2);                                        \
    const fp_ocl_seq s = fp_ocl_seq_of(ap, cu_q, cu_k, used, b);                                   \
    const long x0 = (long)get_group_id(0) * n;                                                     \
    if (x0 >= end)                                                                                 \
        return
#define FP_OCL_BLOCK(ap, head, x0, end) FP_OCL_BLOCK_OF(ap, head, x0, end, T)

/* FP_OCL_QUERY_BLOCK: query rows i0 .. i0 + rows - 1 of head h. */
#define FP_OCL_QUERY_BLOCK(ap)                                                                     \
    FP_OCL_BLOCK(ap, h, i0, s.nq);                                                                 \
    const int rows = (int)min((long)T, s.nq - i0)

/* FP_OCL_KEY_BLOCK_OF: keys j0 .. j0 + stored - 1 of blocks of n keys (the sequence's capacity
 * cuts the block) of kv head hk, whose query heads are the `group` from hk * group; the keys in
 * use are the first cols (none where the block lies past seqused_k): the backward stores zeros in
 * dK and dV rows [cols, stored), as the rows [nk, k_cap) of the block holding the last used key
 * (zero-filled and masked, they gather nothing). kr, vr: where the block's K and V rows lie
 * (dense). FP_OCL_KEY_BLOCK: blocks of T keys. */
#define FP_OCL_KEY_BLOCK_OF(ap, n)                                                                 \
    FP_OCL_BLOCK_OF(ap, hk, j0, s.k_cap, n);                                                       \
    const int cols = (int)clamp(s.nk - j0, 0L, (long)n);                                           \
    const int stored = (int)min((long)n, s.k_cap - j0);                                            \
    const long group = (ap)->heads / (ap)->kv_heads;                                               \
    const fp_ocl_rows kr = fp_ocl_dense_keys((ap)->k, &s, b, hk);                                  \
    const fp_ocl_rows vr = fp_ocl_dense_keys((ap)->v, &s, b, hk)
#define FP_OCL_KEY_BLOCK(ap) FP_OCL_KEY_BLOCK_OF(ap, T)

/* Element (b, token, h, 0) of a q/k/v/o-shaped view. */
FP_OCL_INLINE long fp_ocl_row0(fp_ocl_view v, long b, long token, long h)
{
    return v.off + b * v.s[0] + token * v.s[1] + h * v.s[2];
}

/* Rows of sequence s's keys of kv head hk in k or v, dense (and varlen): from its first key. The
 * backward's (a paged backward is refused by core/validate.c): rows known dense at compile time
 * keep the paged code out of its registers. */
FP_OCL_INLINE fp_ocl_rows fp_ocl_dense_keys(fp_ocl_view v, const fp_ocl_seq *s, long b, long hk)
{
    return fp_ocl_dense_rows(fp_ocl_row0(v, b, s->k_start, hk), v.s[1], v.s[3]);
}

/* The forward's: dense, or through the block table (a.paged; bt the block-table argument). */
FP_OCL_INLINE fp_ocl_rows fp_ocl_key_rows(const fp_ocl_args *a, fp_ocl_view v,
                                          __global const int *bt, const fp_ocl_seq *s, long b,
                                          long hk)
{
    if (!a->paged)
        return fp_ocl_dense_keys(v, s, b, hk);
    fp_ocl_rows x = {v.off + hk * v.s[2], v.s[1], v.s[3], v.s[0], 1, b, bt + a->bt_off};
    return x;
}

FP_OCL_INLINE long fp_ocl_lse_at(const fp_ocl_args *a, long b, long h, long token)
{
    return a->lse.off + b * a->lse.s[0] + h * a->lse.s[1] + token * a->lse.s[2];
}

/* The backward's delta of (b, h, row i of sequence b): [H, total_q] packed like the LSE. */
FP_OCL_INLINE long fp_ocl_delta_at(const fp_ocl_args *a, const fp_ocl_seq *s, long b, long h,
                                   long i)
{
    return a->delta_off +
           (a->varlen ? h * a->total_q + s->q_start + i : (b * a->heads + h) * a->nq + i);
}

/* The plain micro-tile policy (FP_OCL_MMA = 0; mma_nv.cl is the tensor-core one): the work-group
 * is an 8 x 16 grid of work-items (ty, tx); tiles are split over it with register micro-tiles:
 *   score tile [T, T]: rows ty + 8 a (a < SR), keys tx + 16 b (b < SC), element a SC + b;
 *   output tile [T, D]: rows ty + 8 a (a < SR), dims VW tx + 16 VW (j / VW) + j % VW (j < DPT),
 *   element a DPT + j: runs of VW adjacent dims, so that one row of y is one VW-wide local load.
 * Out-of-range keys are guarded (every head-dim class is a multiple of 16 VW, so every dim lies
 * in D); SR * DPT <= FP_OCL_ACC by the planner's rule.
 * Local loads bound these products on a GPU (an NVIDIA SM retires four warp-wide FMAs a clock
 * but serves 128 bytes of local memory), so the [T, D] tiles have rows 16-byte aligned (pitch
 * D + 4: 16 consecutive rows still fall on distinct bank quadruples) and the dot products read
 * x and y four dims at a time (float4); P and dS stay scalar (the score tiles keep their odd
 * pitch for the row softmax). This needs every local tile 16-byte aligned, which a driver does
 * not promise for __local arguments (NVIDIA's places them 2 or 4 bytes apart): each kernel rounds
 * its arguments' addresses up to 16 bytes (FP_OCL_ALIGN16, below), in the FP_OCL_LOCAL_ALIGN
 * bytes the host adds to each (ocl_plan.h).
 * Either policy gives: fp_tile and LD, the element type and row pitch of the [T, D] local tiles,
 * FP_TILE_PUT (a global element as a tile element) and FP_TILE_GET (a tile element as f32),
 * FP_OCL_SN and FP_OCL_ON, the accumulator elements of a work-item's
 * score and output micro-tiles, fp_ocl_s_at / fp_ocl_o_at, where element e lies in its tile
 * (a key or dim past T or D means none: skipped), the products fp_ocl_tile_dots and
 * fp_ocl_tile_mm, FP_OCL_SCRATCH, the floats of local scratch they take, and FP_OCL_KV_APART,
 * whether the forward's K and V tiles have a buffer each (ocl_plan.h sizes it so). */
#if !FP_OCL_MMA
typedef float fp_tile; /* the [T, D] local tiles: f32 values, rows 16-byte aligned */
#define LD                (D + 4)
#define FP_TILE_PUT(x, i) FP_LOAD(x, i)
#define FP_TILE_GET(t, i) ((t)[i])
#define FP_TILE_FINITE(v) isfinite(v)
#define SR                (T / 8)
#define SC                ((T + 15) / 16)
#define DPT               (D / 16)
#define VW                (D % 64 == 0 ? 4 : D % 32 == 0 ? 2 : 1)
#define FP_OCL_SN         (SR * SC)
#define FP_OCL_ON         (SR * DPT)
#define FP_OCL_SCRATCH    1
#define FP_OCL_KV_APART   0

#if D % 16 != 0
#error "the plain policy needs a head-dim class that is a multiple of 16"
#endif

FP_OCL_INLINE void fp_ocl_s_at(int e, int *r, int *c)
{
    *r = get_local_id(0) / 16 + 8 * (e / SC);
    *c = get_local_id(0) % 16 + 16 * (e % SC);
}

FP_OCL_INLINE void fp_ocl_o_at(int e, int *r, int *d)
{
    const int j = e % DPT;
    *r = get_local_id(0) / 16 + 8 * (e / DPT);
    *d = VW * (get_local_id(0) % 16) + 16 * VW * (j / VW) + j % VW;
}

/* acc[a SC + b] = x[row ty + 8 a] . y[row tx + 16 b] over D, for this work-item's micro-tile
 * (scratch: unused by this policy). */
FP_OCL_INLINE void fp_ocl_tile_dots(__local const fp_tile *x, __local const fp_tile *y,
                                    float acc[FP_OCL_SN], __local float *scratch)
{
    const int ty = get_local_id(0) / 16, tx = get_local_id(0) % 16;
    FP_OCL_UNROLL
    for (int e = 0; e < FP_OCL_SN; e++)
        acc[e] = 0.0f;
    for (int d = 0; d < D; d += 4) {
        float4 xa[SR], yb[SC];
        FP_OCL_UNROLL
        for (int a = 0; a < SR; a++)
            xa[a] = *(__local const float4 *)(x + (ty + 8 * a) * LD + d);
        FP_OCL_UNROLL
        for (int b = 0; b < SC; b++)
            yb[b] = tx + 16 * b < T ? *(__local const float4 *)(y + (tx + 16 * b) * LD + d)
                                    : (float4)(0.0f);
        FP_OCL_UNROLL
        for (int a = 0; a < SR; a++)
            FP_OCL_UNROLL
            for (int b = 0; b < SC; b++) {
                float s = acc[a * SC + b];
                s = fma(xa[a].x, yb[b].x, s);
                s = fma(xa[a].y, yb[b].y, s);
                s = fma(xa[a].z, yb[b].z, s);
                acc[a * SC + b] = fma(xa[a].w, yb[b].w, s);
            }
    }
}

/* y[n * LD + d .. d + VW - 1] into v[0 .. VW - 1]: one local load (d a multiple of VW). */
FP_OCL_INLINE void fp_ocl_load_run(__local const fp_tile *p, float *v)
{
#if VW == 4
    const float4 x = *(__local const float4 *)p;
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
#elif VW == 2
    const float2 x = *(__local const float2 *)p;
    v[0] = x.x, v[1] = x.y;
#else
    v[0] = p[0];
#endif
}

/* acc[a DPT + j] += sum over n < count of p(row ty + 8 a, n) * y[n * LD + dim j], where
 * p(r, n) = pt[r * LS + n] (transposed = 0) or pt[n * LS + r] (transposed = 1). */
FP_OCL_INLINE void fp_ocl_tile_mm(__local const float *pt, int transposed, __local const fp_tile *y,
                                  int count, float acc[FP_OCL_ON], __local float *scratch)
{
    const int ty = get_local_id(0) / 16, tx = get_local_id(0) % 16;
    for (int n = 0; n < count; n++) {
        float pa[SR], yj[DPT];
        FP_OCL_UNROLL
        for (int a = 0; a < SR; a++)
            pa[a] = transposed ? pt[n * LS + ty + 8 * a] : pt[(ty + 8 * a) * LS + n];
        FP_OCL_UNROLL
        for (int j = 0; j < DPT; j += VW)
            fp_ocl_load_run(y + n * LD + VW * tx + 16 * j, yj + j);
        FP_OCL_UNROLL
        for (int a = 0; a < SR; a++)
            FP_OCL_UNROLL
            for (int j = 0; j < DPT; j++)
                acc[a * DPT + j] = fma(pa[a], yj[j], acc[a * DPT + j]);
    }
}
#endif /* !FP_OCL_MMA */

/* Dim d of row r0 + r of a slice as a tile element, 0 where r >= n, d >= hd or the row lies in a
 * page out of range; where scrub, a non-finite element becomes 0 and sets *bad. */
FP_OCL_INLINE fp_tile fp_ocl_get1(__global const fp_elem *x, const fp_ocl_args *a,
                                  const fp_ocl_rows *src, long r0, int r, int n, int d, int hd,
                                  int scrub, __local float *bad)
{
    const long at = r < n && d < hd ? fp_ocl_row_at(a, src, r0 + r) : -1;
    fp_tile v = at >= 0 ? FP_TILE_PUT(x, at + d * src->sdim) : (fp_tile)0;
    if (scrub && !FP_TILE_FINITE(v)) {
        v = (fp_tile)0;
        *bad = 1.0f;
    }
    return v;
}

/* Rows [r0, r0 + n) of a [seq, dim] slice (src: where its rows lie) with hd dims into
 * t[r * LD + d] for r < nrows, zeros in rows n .. nrows - 1, in rows of a page out of range, and
 * in dims hd .. D - 1, so partial tiles compute on finite values and add nothing: rows past n
 * (keys past seqused_k, a page's unused tail) are never read, whatever they hold. Where scrub,
 * non-finite elements become 0 and flag their row r at bad[r * bstride] (zeroed beforehand by
 * the caller). */
FP_OCL_INLINE void fp_ocl_load_rows(__local fp_tile *t, int nrows, __global const fp_elem *x,
                                    const fp_ocl_args *a, const fp_ocl_rows *src, long r0, int n,
                                    int hd, int scrub, __local float *bad, int bstride)
{
#if FP_OCL_MMA
    if (fp_ocl_load_tile16(t, nrows, x, a, src, r0, n, hd, scrub, bad, bstride))
        return;
#endif
    for (int e = get_local_id(0); e < nrows * D; e += FP_OCL_WG) {
        const int r = e / D, d = e - r * D;
        t[r * LD + d] = fp_ocl_get1(x, a, src, r0, r, n, d, hd, scrub, bad + r * bstride);
    }
}

/* A [T, D] tile (fp_ocl_load_rows), its row flags in column T of the [T, LS] score tile bad
 * (FP_OCL_BAD). */
FP_OCL_INLINE void fp_ocl_load_tile(__local fp_tile *t, __global const fp_elem *x,
                                    const fp_ocl_args *a, const fp_ocl_rows *src, long r0, int n,
                                    int hd, int scrub, __local float *bad)
{
    fp_ocl_load_rows(t, T, x, a, src, r0, n, hd, scrub, bad + T, LS);
}

/* Stores the output micro-tile's elements of rows < n, dims < hd, times factor(row), to x (row0:
 * element of tile row 0, dim 0); factor is rowf[r] where by_row, else `scale` (a flag, not a
 * null test: __local address 0 is a real address, mma_nv.cl's fp_ocl_load_a). */
FP_OCL_INLINE void fp_ocl_store_tile(__global fp_elem *x, long row0, long srow, long sdim, int n,
                                     int hd, float acc[FP_OCL_ON], __local const float *rowf,
                                     int by_row, float scale)
{
    FP_OCL_UNROLL
    for (int e = 0; e < FP_OCL_ON; e++) {
        int r, d;
        fp_ocl_o_at(e, &r, &d);
        if (r < n && d < hd)
            FP_STORE(x, row0 + r * srow + d * sdim, acc[e] * (by_row ? rowf[r] : scale));
    }
}

/* Where score element e lies in the tile (row *r, key *c; a key past T: no element) and whether
 * query i0 + *r sees key j0 + *c (both inside the sequence, and the mask lets it). */
FP_OCL_INLINE int fp_ocl_s_seen(const fp_ocl_args *a, const fp_ocl_seq *s, int e, long i0, int rows,
                                long j0, int cols, int *r, int *c)
{
    fp_ocl_s_at(e, r, c);
    return *r < rows && *c < cols &&
           fp_mask_visible(i0 + *r, j0 + *c, s->nq, s->nk, a->left, a->right);
}

FP_OCL_INLINE void fp_ocl_zero(float acc[FP_OCL_ON])
{
    FP_OCL_UNROLL
    for (int e = 0; e < FP_OCL_ON; e++)
        acc[e] = 0.0f;
}

/* Whether query i sees a key c of [j0, j0 + cols) whose flag bad[c * stride + at] is set: the
 * guard's select, which gives a visible pair of a scrubbed row its NaN back (the key flags in
 * column T of a score tile, FP_OCL_BAD: stride LS, at T; flash_fa2.cl's own arrays: 1, 0). */
FP_OCL_INLINE int fp_ocl_sees_bad(const fp_ocl_args *a, const fp_ocl_seq *s, long i, long j0,
                                  int cols, __local const float *bad, int stride, int at)
{
    /* the row's visible keys are one range (core/mask.h) */
    const int c0 = (int)clamp(fp_mask_lo(i, s->nq, s->nk, a->left) - j0, 0L, (long)cols);
    const int c1 = (int)clamp(fp_mask_hi(i, s->nq, s->nk, a->right) - j0, 0L, (long)cols);
    int seen = 0;
    for (int c = c0; c < c1; c++)
        seen |= bad[c * stride + at] != 0.0f;
    return seen;
}

/* A __local argument's address rounded up to 16 bytes. Drivers need not align __local
 * arguments beyond their element type (NVIDIA's OpenCL on the H200 put a forward's four at
 * offsets 0x402, 0x2504, 0x6708 and 0xa80c, where the tiles' 16-byte and the tensor-core path's
 * 32-bit loads fault); ocl_plan.h's fp_ocl_local_args gives each argument FP_OCL_LOCAL_ALIGN
 * bytes more, so the rounded address stays inside it. */
#define FP_OCL_ALIGN16(T, p) ((__local T *)(((size_t)(p) + 15) & ~(size_t)15))

/* The emulated tensor-core instruction's and shuffle's local scratch (FP_OCL_SCRATCH floats):
 * with FP_OCL_MMA_EMULATE = 1 a __local argument `scratch` after the kernel's other arguments
 * (ocl_plan.h's fp_ocl_local_args sizes it), otherwise an array of the kernel's own. PoCL's
 * pthread device (3.1) gave the kernel-scope array of work-groups running at once the same
 * memory in some programs (emulated results wrong and different from run to run); an argument
 * is each work-group's own. FP_OCL_SCRATCH_PARAM ends a kernel's parameter list, so that the
 * other programs' source is unchanged after preprocessing (an object-like macro: NVIDIA's
 * OpenCL C 1.2 compiler rejects variadic ones, which clang and PoCL accept). */
#if FP_OCL_MMA_EMULATE
#define FP_OCL_SCRATCH_PARAM , __local float *scratch
#else
#define FP_OCL_SCRATCH_PARAM
#endif

/* The tile-shaped kernels; an FA2 program (FP_OCL_FA2, kernels/flash_fa2.cl) has only its own
 * forward. */
#if !FP_OCL_FA2
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_forward(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
               __global const fp_elem *v, __global fp_elem *o, __global float *lse,
               __global const int *cu_q, __global const int *cu_k, __global const float *alibi,
               __global const int *used, __global const int *bt, __local fp_tile *sq_arg,
               __local fp_tile *skv_arg, __local float *ss_arg,
                                  __local float *srow_arg FP_OCL_SCRATCH_PARAM)
{
    __local fp_tile *sq = FP_OCL_ALIGN16(fp_tile, sq_arg), *skv = FP_OCL_ALIGN16(fp_tile, skv_arg);
    __local float *ss = FP_OCL_ALIGN16(float, ss_arg), *srow = FP_OCL_ALIGN16(float, srow_arg);
#if !FP_OCL_MMA_EMULATE
    __local float scratch[FP_OCL_SCRATCH];
#endif
    FP_OCL_QUERY_BLOCK(&a);
    const long hk = h / (a.heads / a.kv_heads);
    const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
    const fp_ocl_rows qr = fp_ocl_dense_rows(fp_ocl_row0(a.q, b, s.q_start, h), a.q.s[1], a.q.s[3]);
    const fp_ocl_rows kr = fp_ocl_key_rows(&a, a.k, bt, &s, b, hk);
    const fp_ocl_rows vr = fp_ocl_key_rows(&a, a.v, bt, &s, b, hk);
    /* V's tile: K's buffer again (plain path), or its own (FP_OCL_KV_APART) so that K and V of a
     * key block are copied in one phase. */
    __local fp_tile *sv = skv + (FP_OCL_KV_APART ? T * LD : 0);

    fp_ocl_load_tile(sq, q, &a, &qr, i0, rows, hd, 0, ss);
    fp_softmax_state st; /* row tid's, for tid < T */
    fp_softmax_init(&st);
    int nan_row = 0; /* row tid's: it sees a key whose V row was scrubbed (O = NaN) */
    float acc[FP_OCL_ON];
    fp_ocl_zero(acc);
    /* V rows' flags (the guard, above); with FP_OCL_KV_APART V is scrubbed in the loop's first
     * phase, so the flags are zeroed ahead of it: here, and after each block's last reader. */
    if (FP_OCL_KV_APART && tid < T)
        FP_OCL_BAD(ss, tid) = 0.0f;

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
    for (long j0 = lo < hi ? lo / T * T : hi; j0 < hi; j0 += T) {
        const int cols = (int)min((long)T, s.nk - j0);
        const int edge =
            !fp_mask_block_full(i0, i0 + rows, j0, j0 + cols, s.nq, s.nk, a.left, a.right);
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous block's readers of skv, sv and ss are done */
        fp_ocl_load_tile(skv, k, &a, &kr, j0, cols, hd, 0, ss);
        if (FP_OCL_KV_APART)
            fp_ocl_load_tile(sv, v, &a, &vr, j0, cols, hd, edge, ss);
        barrier(CLK_LOCAL_MEM_FENCE);
        float sc[FP_OCL_SN];
        fp_ocl_tile_dots(sq, skv, sc, scratch);
        FP_OCL_UNROLL
        for (int e = 0; e < FP_OCL_SN; e++) {
            int r, c;
            /* a key of a page out of range is masked (its row was zero-filled) */
            const int seen = fp_ocl_s_seen(&a, &s, e, i0, rows, j0, cols, &r, &c) &&
                             (!a.paged || fp_ocl_row_at(&a, &kr, j0 + c) >= 0);
            if (c < T)
                ss[r * LS + c] =
                    seen ? fp_score_transform(sc[e] * a.scale, a.softcap, slope,
                                              fp_alibi_distance(i0 + r, j0 + c, s.nq, s.nk))
                         : -INFINITY;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (tid < T) {
            float mx = -INFINITY;
            for (int c = 0; c < cols; c++)
                mx = fmax(mx, ss[tid * LS + c]);
            srow[tid] = fp_softmax_update(&st, mx);
            float sum = 0.0f;
            for (int c = 0; c < T; c++) {
                const float p = c < cols ? fp_softmax_weight(&st, ss[tid * LS + c]) : 0.0f;
                ss[tid * LS + c] = p;
                sum += p;
            }
            st.l += sum;
            if (edge && FP_OCL_KV_APART)
                nan_row |= fp_ocl_sees_bad(&a, &s, i0 + tid, j0, cols, ss, LS, T);
            else if (edge)
                FP_OCL_BAD(ss, tid) = 0.0f; /* for V's copy, next */
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* P and alpha written; every reader of K is done */
        if (!FP_OCL_KV_APART) {
            fp_ocl_load_tile(sv, v, &a, &vr, j0, cols, hd, edge, ss);
            barrier(CLK_LOCAL_MEM_FENCE);
            if (edge && tid < T)
                nan_row |= fp_ocl_sees_bad(&a, &s, i0 + tid, j0, cols, ss, LS, T);
        } else if (edge && tid < T) {
            FP_OCL_BAD(ss, tid) = 0.0f; /* read in the phase before: for the next block's V */
        }
        FP_OCL_UNROLL
        for (int e = 0; e < FP_OCL_ON; e++) {
            int r, d;
            fp_ocl_o_at(e, &r, &d);
            acc[e] *= srow[r];
        }
        fp_ocl_tile_mm(ss, 0, sv, cols, acc, scratch);
    }

    barrier(CLK_LOCAL_MEM_FENCE); /* the last block's readers of srow are done */
    if (tid < T) {
        /* a row that saw a scrubbed V row: NaN, as its 0 x NaN-free sum would not be */
        srow[tid] = nan_row ? NAN : fp_softmax_out_scale(&st);
        if (a.has_lse && tid < rows)
            lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + tid)] = fp_softmax_lse(&st);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    fp_ocl_store_tile(o, fp_ocl_row0(a.o, b, s.q_start + i0, h), a.o.s[1], a.o.s[3], rows, hd, acc,
                      srow, 1, 1.0f);
}

/* P and dS of the tile rows [i0, i0 + rows) x keys [j0, j0 + cols), from the local q, dO, K, V
 * tiles and each row's LSE (srow[r]) and delta (srow[T + r]), into sp (where want_p; dQ needs
 * dS only) and sds ([T, T]). dS is d loss / d(q . k): softcap's derivative and the scale are
 * folded in. A masked pair's P and dS are selected to 0; a visible pair whose key (guard 1) or
 * query row (guard 2) bad flags (FP_OCL_BAD: scrubbed) gets P = dS = NaN; guard 0: no flags. */
FP_OCL_INLINE void fp_ocl_grad_scores(const fp_ocl_args *a, const fp_ocl_seq *s, float slope,
                                      long i0, int rows, long j0, int cols,
                                      __local const fp_tile *sq, __local const fp_tile *sdo,
                                      __local const fp_tile *sk, __local const fp_tile *sv,
                                      __local const float *srow, int want_p, __local float *sp,
                                      __local float *sds, int guard, __local const float *bad,
                                      __local float *scratch)
{
    float qk[FP_OCL_SN], dov[FP_OCL_SN];
    fp_ocl_tile_dots(sq, sk, qk, scratch);
    fp_ocl_tile_dots(sdo, sv, dov, scratch);
    FP_OCL_UNROLL
    for (int e = 0; e < FP_OCL_SN; e++) {
        int r, c;
        const int seen = fp_ocl_s_seen(a, s, e, i0, rows, j0, cols, &r, &c);
        if (c >= T)
            continue;
        float p = 0.0f, ds = 0.0f;
        if (seen && srow[r] > -INFINITY) {
            const float capped = fp_score_transform(qk[e] * a->scale, a->softcap, 0.0f, 0.0f);
            const float score = capped - slope * fp_alibi_distance(i0 + r, j0 + c, s->nq, s->nk);
            p = exp(score - srow[r]);
            ds = p * (dov[e] - srow[T + r]) * fp_softcap_grad(capped, a->softcap) * a->scale;
        }
        if (want_p)
            sp[r * LS + c] = p;
        sds[r * LS + c] = ds;
    }
    /* the guard's select, a pass of its own over this work-item's elements (no barrier needed),
     * so that the loop above stays the unguarded one */
    for (int e = 0; guard && e < FP_OCL_SN; e++) {
        int r, c;
        if (fp_ocl_s_seen(a, s, e, i0, rows, j0, cols, &r, &c) &&
            FP_OCL_BAD(bad, guard == 1 ? c : r) != 0.0f) {
            if (want_p)
                sp[r * LS + c] = NAN;
            sds[r * LS + c] = NAN;
        }
    }
}

/* Loads the query side of a backward tile: q and dO rows and each row's LSE into srow[r]; the
 * rows' delta into srow[T + r] is the caller's. Where scrub, q and dO as fp_ocl_load_tile's. */
FP_OCL_INLINE void fp_ocl_load_query_side(const fp_ocl_args *a, const fp_ocl_seq *s, long b, long h,
                                          long i0, int rows, __global const fp_elem *q,
                                          __global const fp_elem *dout, __global const float *lse,
                                          __local fp_tile *sq, __local fp_tile *sdo,
                                          __local float *srow, int scrub, __local float *bad)
{
    const int tid = get_local_id(0), hd = (int)a->head_dim;
    const fp_ocl_rows qr =
        fp_ocl_dense_rows(fp_ocl_row0(a->q, b, s->q_start, h), a->q.s[1], a->q.s[3]);
    const fp_ocl_rows dor =
        fp_ocl_dense_rows(fp_ocl_row0(a->dout, b, s->q_start, h), a->dout.s[1], a->dout.s[3]);
    fp_ocl_load_tile(sq, q, a, &qr, i0, rows, hd, scrub, bad);
    fp_ocl_load_tile(sdo, dout, a, &dor, i0, rows, hd, scrub, bad);
    if (tid < T)
        srow[tid] = tid < rows ? lse[fp_ocl_lse_at(a, b, h, s->q_start + i0 + tid)] : -INFINITY;
}

__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_dq(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
                   __global const fp_elem *v, __global const fp_elem *o, __global const float *lse,
                   __global const fp_elem *dout, __global fp_elem *dq, __global float *delta,
                   __global const int *cu_q, __global const int *cu_k, __global const float *alibi,
                   __global const int *used, __local fp_tile *sq_arg, __local fp_tile *sdo_arg,
                   __local fp_tile *sk_arg, __local fp_tile *sv_arg, __local float *sds_arg,
                   __local float *srow_arg FP_OCL_SCRATCH_PARAM)
{
    __local fp_tile *sq = FP_OCL_ALIGN16(fp_tile, sq_arg), *sdo = FP_OCL_ALIGN16(fp_tile, sdo_arg);
    __local fp_tile *sk = FP_OCL_ALIGN16(fp_tile, sk_arg), *sv = FP_OCL_ALIGN16(fp_tile, sv_arg);
    __local float *sds = FP_OCL_ALIGN16(float, sds_arg), *srow = FP_OCL_ALIGN16(float, srow_arg);
#if !FP_OCL_MMA_EMULATE
    __local float scratch[FP_OCL_SCRATCH];
#endif
    FP_OCL_QUERY_BLOCK(&a);
    const long hk = h / (a.heads / a.kv_heads);
    const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
    const fp_ocl_rows kr = fp_ocl_dense_keys(a.k, &s, b, hk);
    const fp_ocl_rows vr = fp_ocl_dense_keys(a.v, &s, b, hk);

    fp_ocl_load_query_side(&a, &s, b, h, i0, rows, q, dout, lse, sq, sdo, srow, 0, sds);
    if (tid < T)
        FP_OCL_BAD(sds, tid) = 0.0f; /* K rows' flags (the guard: dS K) */
    barrier(CLK_LOCAL_MEM_FENCE);
    if (tid < rows) {
        const long o0 = fp_ocl_row0(a.o, b, s.q_start + i0 + tid, h);
        float dl = 0.0f;
        for (int d = 0; d < hd; d++)
            dl = fma(FP_TILE_GET(sdo, tid * LD + d), FP_LOAD(o, o0 + d * a.o.s[3]), dl);
        srow[T + tid] = dl;
        delta[fp_ocl_delta_at(&a, &s, b, h, i0 + tid)] = dl;
    }
    float acc[FP_OCL_ON];
    fp_ocl_zero(acc);

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
    for (long j0 = lo < hi ? lo / T * T : hi; j0 < hi; j0 += T) {
        const int cols = (int)min((long)T, s.nk - j0);
        const int edge =
            !fp_mask_block_full(i0, i0 + rows, j0, j0 + cols, s.nq, s.nk, a.left, a.right);
        barrier(CLK_LOCAL_MEM_FENCE);
        fp_ocl_load_tile(sk, k, &a, &kr, j0, cols, hd, edge, sds);
        fp_ocl_load_tile(sv, v, &a, &vr, j0, cols, hd, 0, sds);
        barrier(CLK_LOCAL_MEM_FENCE);
        fp_ocl_grad_scores(&a, &s, slope, i0, rows, j0, cols, sq, sdo, sk, sv, srow, 0, sds, sds,
                           edge, sds, scratch);
        barrier(CLK_LOCAL_MEM_FENCE);
        fp_ocl_tile_mm(sds, 0, sk, cols, acc, scratch);
        if (edge && tid < T)
            FP_OCL_BAD(sds, tid) = 0.0f; /* read in the phase before: for the next block's K */
    }
    fp_ocl_store_tile(dq, fp_ocl_row0(a.dq, b, s.q_start + i0, h), a.dq.s[1], a.dq.s[3], rows, hd,
                      acc, srow, 0, 1.0f);
}

__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_dkdv(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
                     __global const fp_elem *v, __global const float *lse,
                     __global const fp_elem *dout, __global fp_elem *dk, __global fp_elem *dv,
                     __global const float *delta, __global const int *cu_q,
                     __global const int *cu_k, __global const float *alibi,
                     __global const int *used, __local fp_tile *sq_arg, __local fp_tile *sdo_arg,
                     __local fp_tile *sk_arg, __local fp_tile *sv_arg, __local float *sp_arg,
                     __local float *sds_arg, __local float *srow_arg FP_OCL_SCRATCH_PARAM)
{
    __local fp_tile *sq = FP_OCL_ALIGN16(fp_tile, sq_arg), *sdo = FP_OCL_ALIGN16(fp_tile, sdo_arg);
    __local fp_tile *sk = FP_OCL_ALIGN16(fp_tile, sk_arg), *sv = FP_OCL_ALIGN16(fp_tile, sv_arg);
    __local float *sp = FP_OCL_ALIGN16(float, sp_arg), *sds = FP_OCL_ALIGN16(float, sds_arg);
    __local float *srow = FP_OCL_ALIGN16(float, srow_arg);
#if !FP_OCL_MMA_EMULATE
    __local float scratch[FP_OCL_SCRATCH];
#endif
    FP_OCL_KEY_BLOCK(&a);

    fp_ocl_load_tile(sk, k, &a, &kr, j0, cols, hd, 0, sp);
    fp_ocl_load_tile(sv, v, &a, &vr, j0, cols, hd, 0, sp);
    if (tid < T)
        FP_OCL_BAD(sp, tid) = 0.0f; /* q and dO rows' flags (the guard: P^T dO, dS^T Q) */
    float acc_k[FP_OCL_ON], acc_v[FP_OCL_ON]; /* rows: keys of the block */
    fp_ocl_zero(acc_k);
    fp_ocl_zero(acc_v);

    for (long h = hk * group; cols > 0 && h < (hk + 1) * group; h++) {
        const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
        for (long i0 = 0; i0 < s.nq; i0 += T) {
            const int rows = (int)min((long)T, s.nq - i0);
            int64_t lo, hi;
            fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
            if (hi <= lo || hi <= j0 || lo >= j0 + cols)
                continue; /* no row of this query block sees these keys */
            const int edge =
                !fp_mask_block_full(i0, i0 + rows, j0, j0 + cols, s.nq, s.nk, a.left, a.right);
            barrier(CLK_LOCAL_MEM_FENCE); /* the previous block's readers are done */
            fp_ocl_load_query_side(&a, &s, b, h, i0, rows, q, dout, lse, sq, sdo, srow, edge, sp);
            if (tid < T)
                srow[T + tid] = tid < rows ? delta[fp_ocl_delta_at(&a, &s, b, h, i0 + tid)] : 0.0f;
            barrier(CLK_LOCAL_MEM_FENCE);
            fp_ocl_grad_scores(&a, &s, slope, i0, rows, j0, cols, sq, sdo, sk, sv, srow, 1, sp,
                               sds, edge ? 2 : 0, sp, scratch);
            barrier(CLK_LOCAL_MEM_FENCE);
            fp_ocl_tile_mm(sp, 1, sdo, rows, acc_v, scratch);
            fp_ocl_tile_mm(sds, 1, sq, rows, acc_k, scratch);
            if (edge && tid < T)
                FP_OCL_BAD(sp, tid) = 0.0f; /* read in the phase before: for the next q, dO */
        }
    }
    fp_ocl_store_tile(dk, fp_ocl_row0(a.dk, b, s.k_start + j0, hk), a.dk.s[1], a.dk.s[3], stored,
                      hd, acc_k, srow, 0, 1.0f);
    fp_ocl_store_tile(dv, fp_ocl_row0(a.dv, b, s.k_start + j0, hk), a.dv.s[1], a.dv.s[3], stored,
                      hd, acc_v, srow, 0, 1.0f);
}
#endif /* !FP_OCL_FA2 */
