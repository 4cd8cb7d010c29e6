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
 *
 * Target: any OpenCL 1.2 device (the plain path): f32 arithmetic, storage f32, f16 (vload_half /
 * vstore_half_rte, so cl_khr_fp16 is not needed) or bf16 (ushort bits), chosen at program build
 * time by FP_OCL_DTYPE (0, 1, 2), with the head-dim class FP_OCL_D and the tile FP_OCL_T. A
 * work-group is FP_OCL_WG = 128 work-items; each owns register micro-tiles of the score and
 * output tiles (see D, T, SR, SC, DPT below).
 *
 * Configuration (fp_ocl_tile in ocl_plan.h; T = query rows = keys per tile):
 *   T = the largest of 64, 32, 16, 8 with (T / 8) * ceil(D / 16) <= FP_OCL_ACC (32) whose local
 *   tiles fit the device's local memory. PoCL: 64 (D <= 64), 32 (D <= 128), 16 (D <= 256);
 *   a 48 KiB device: forward 64 (D <= 32), 32 (D <= 128), 16; backward 32 (D <= 64), 16
 *   (D <= 128), 8.
 *
 * Known differences from the reference: f32 accumulation (the reference uses double); P is not
 * rounded to the storage type before P V; the dtype rounding of f16 / bf16 outputs is
 * round-to-nearest-even as core/dtype.h. Numbers: docs/opencl.md.
 */

#if FP_OCL_DTYPE == 0
typedef float fp_elem;
#define FP_LOAD(p, i)     ((p)[i])
#define FP_STORE(p, i, x) ((p)[i] = (x))
#elif FP_OCL_DTYPE == 1
typedef half fp_elem;
#define FP_LOAD(p, i)     vload_half((size_t)(i), (p))
#define FP_STORE(p, i, x) vstore_half_rte((x), (size_t)(i), (p))
#else
typedef ushort fp_elem;
#define FP_LOAD(p, i)     as_float((uint)(p)[i] << 16)
#define FP_STORE(p, i, x) ((p)[i] = fp_ocl_to_bf16(x))

/* core/dtype.h's fp_f32_to_bf16: round to nearest even, NaN stays NaN. */
static inline ushort fp_ocl_to_bf16(float f)
{
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}
#endif

/* Where sequence b's tokens start and how many there are (core/problem.h's fp_problem_seq). */
typedef struct fp_ocl_seq {
    long q_start, nq, k_start, nk;
} fp_ocl_seq;

static inline fp_ocl_seq fp_ocl_seq_of(const fp_ocl_args *a, __global const int *cu_q,
                                       __global const int *cu_k, long b)
{
    fp_ocl_seq s;
    if (a->varlen) {
        s.q_start = cu_q[a->cu_q_off + b];
        s.nq = cu_q[a->cu_q_off + b + 1] - s.q_start;
        s.k_start = cu_k[a->cu_k_off + b];
        s.nk = cu_k[a->cu_k_off + b + 1] - s.k_start;
    } else {
        s.q_start = 0;
        s.nq = a->nq;
        s.k_start = 0;
        s.nk = a->nk;
    }
    return s;
}

/* Element (b, token, h, 0) of a q/k/v/o-shaped view. */
static inline long fp_ocl_row0(fp_ocl_view v, long b, long token, long h)
{
    return v.off + b * v.s[0] + token * v.s[1] + h * v.s[2];
}

static inline long fp_ocl_lse_at(const fp_ocl_args *a, long b, long h, long token)
{
    return a->lse.off + b * a->lse.s[0] + h * a->lse.s[1] + token * a->lse.s[2];
}

/* The backward's delta of (b, h, row i of sequence b): [H, total_q] packed like the LSE. */
static inline long fp_ocl_delta_at(const fp_ocl_args *a, const fp_ocl_seq *s, long b, long h,
                                   long i)
{
    return a->delta_off +
           (a->varlen ? h * a->total_q + s->q_start + i : (b * a->heads + h) * a->nq + i);
}

/* Compile-time shape of one program (ocl_attention.c builds one per dtype, head-dim class and
 * tile, planned by ocl_plan.h): D the head-dim class (16, 32, 64, 96, 128, 192 or 256; the
 * problem's head dim a.head_dim <= D, the tiles zero-filled beyond it, so dot products over D
 * are exact), T query rows = keys per tile, LD the row pitch of the local tiles (odd, so
 * work-items reading one column of different rows hit different banks). The work-group is an
 * 8 x 16 grid of work-items (ty, tx); tiles are split over it with register micro-tiles:
 *   score tile [T, T]: rows ty + 8 a (a < SR), keys tx + 16 b (b < SC);
 *   output tile [T, D]: rows ty + 8 a (a < SR), dims tx + 16 j (j < DPT).
 * Out-of-range keys and dims are guarded; SR * DPT <= FP_OCL_ACC by the planner's rule. */
#define D   FP_OCL_D
#define T   FP_OCL_T
#define LD  (D | 1)
#define SR  (T / 8)
#define SC  ((T + 15) / 16)
#define DPT ((D + 15) / 16)

/* Rows [r0, r0 + n) of a [seq, dim] slice (row0: element of row 0, dim 0) with hd dims into
 * t[r * LD + d], zeros in rows n .. T - 1 and dims hd .. D - 1 so partial tiles compute on
 * finite values and add nothing. */
static inline void fp_ocl_load_tile(__local float *t, __global const fp_elem *x, long row0,
                                    long srow, long sdim, long r0, int n, int hd)
{
    for (int e = get_local_id(0); e < T * D; e += FP_OCL_WG) {
        const int r = e / D, d = e - r * D;
        t[r * LD + d] = r < n && d < hd ? FP_LOAD(x, row0 + (r0 + r) * srow + d * sdim) : 0.0f;
    }
}

/* acc[a][b] = x[row ty + 8 a] . y[row tx + 16 b] over D, for this work-item's micro-tile. */
static inline void fp_ocl_tile_dots(__local const float *x, __local const float *y,
                                    float acc[SR][SC])
{
    const int ty = get_local_id(0) / 16, tx = get_local_id(0) % 16;
    for (int a = 0; a < SR; a++)
        for (int b = 0; b < SC; b++)
            acc[a][b] = 0.0f;
    for (int d = 0; d < D; d++) {
        float xa[SR], yb[SC];
        for (int a = 0; a < SR; a++)
            xa[a] = x[(ty + 8 * a) * LD + d];
        for (int b = 0; b < SC; b++)
            yb[b] = tx + 16 * b < T ? y[(tx + 16 * b) * LD + d] : 0.0f;
        for (int a = 0; a < SR; a++)
            for (int b = 0; b < SC; b++)
                acc[a][b] = fma(xa[a], yb[b], acc[a][b]);
    }
}

/* acc[a][j] += sum over n < count of p(row ty + 8 a, n) * y[n * LD + tx + 16 j], where
 * p(r, n) = pt[r * T + n] (transposed = 0) or pt[n * T + r] (transposed = 1). */
static inline void fp_ocl_tile_mm(__local const float *pt, int transposed, __local const float *y,
                                  int count, float acc[SR][DPT])
{
    const int ty = get_local_id(0) / 16, tx = get_local_id(0) % 16;
    for (int n = 0; n < count; n++) {
        float pa[SR], yj[DPT];
        for (int a = 0; a < SR; a++)
            pa[a] = transposed ? pt[n * T + ty + 8 * a] : pt[(ty + 8 * a) * T + n];
        for (int j = 0; j < DPT; j++)
            yj[j] = tx + 16 * j < D ? y[n * LD + tx + 16 * j] : 0.0f;
        for (int a = 0; a < SR; a++)
            for (int j = 0; j < DPT; j++)
                acc[a][j] = fma(pa[a], yj[j], acc[a][j]);
    }
}

/* Stores rows ty + 8 a < n, dims tx + 16 j < hd of acc * factor(row) to x (row0: element of
 * tile row 0, dim 0); factor is rowf[r] where rowf is given, else `scale`. */
static inline void fp_ocl_store_tile(__global fp_elem *x, long row0, long srow, long sdim, int n,
                                     int hd, float acc[SR][DPT], __local const float *rowf,
                                     float scale)
{
    const int ty = get_local_id(0) / 16, tx = get_local_id(0) % 16;
    for (int a = 0; a < SR; a++) {
        const int r = ty + 8 * a;
        if (r >= n)
            continue;
        const float f = rowf ? rowf[r] : scale;
        for (int j = 0; j < DPT; j++) {
            const int d = tx + 16 * j;
            if (d < hd)
                FP_STORE(x, row0 + r * srow + d * sdim, acc[a][j] * f);
        }
    }
}

static inline void fp_ocl_zero(float acc[SR][DPT])
{
    for (int a = 0; a < SR; a++)
        for (int j = 0; j < DPT; j++)
            acc[a][j] = 0.0f;
}

__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_forward(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
               __global const fp_elem *v, __global fp_elem *o, __global float *lse,
               __global const int *cu_q, __global const int *cu_k, __global const float *alibi,
               __local float *sq, __local float *skv, __local float *ss, __local float *srow)
{
    const int tid = get_local_id(0), ty = tid / 16, tx = tid % 16, hd = (int)a.head_dim;
    const long h = get_group_id(1), b = get_group_id(2);
    const fp_ocl_seq s = fp_ocl_seq_of(&a, cu_q, cu_k, b);
    const long i0 = (long)get_group_id(0) * T;
    if (i0 >= s.nq)
        return;
    const int rows = (int)min((long)T, s.nq - i0);
    const long hk = h / (a.heads / a.kv_heads);
    const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
    const long k0 = fp_ocl_row0(a.k, b, s.k_start, hk), v0 = fp_ocl_row0(a.v, b, s.k_start, hk);

    fp_ocl_load_tile(sq, q, fp_ocl_row0(a.q, b, s.q_start, h), a.q.s[1], a.q.s[3], i0, rows, hd);
    fp_softmax_state st; /* row tid's, for tid < T */
    fp_softmax_init(&st);
    float acc[SR][DPT];
    fp_ocl_zero(acc);

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
    for (long j0 = lo < hi ? lo / T * T : hi; j0 < hi; j0 += T) {
        const int cols = (int)min((long)T, s.nk - j0);
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous block's readers of skv and ss are done */
        fp_ocl_load_tile(skv, k, k0, a.k.s[1], a.k.s[3], j0, cols, hd);
        barrier(CLK_LOCAL_MEM_FENCE);
        float sc[SR][SC];
        fp_ocl_tile_dots(sq, skv, sc);
        for (int x = 0; x < SR; x++)
            for (int y = 0; y < SC; y++) {
                const int r = ty + 8 * x, c = tx + 16 * y;
                const long i = i0 + r, j = j0 + c;
                if (c >= T)
                    continue;
                float z = -INFINITY;
                if (r < rows && c < cols && fp_mask_visible(i, j, s.nq, s.nk, a.left, a.right))
                    z = fp_score_transform(sc[x][y] * a.scale, a.softcap, slope,
                                           fp_alibi_distance(i, j, s.nq, s.nk));
                ss[r * T + c] = z;
            }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (tid < T) {
            float mx = -INFINITY;
            for (int c = 0; c < cols; c++)
                mx = fmax(mx, ss[tid * T + c]);
            srow[tid] = fp_softmax_update(&st, mx);
            float sum = 0.0f;
            for (int c = 0; c < T; c++) {
                const float p = c < cols ? fp_softmax_weight(&st, ss[tid * T + c]) : 0.0f;
                ss[tid * T + c] = p;
                sum += p;
            }
            st.l += sum;
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* P and alpha written; every reader of K is done */
        fp_ocl_load_tile(skv, v, v0, a.v.s[1], a.v.s[3], j0, cols, hd);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int x = 0; x < SR; x++)
            for (int y = 0; y < DPT; y++)
                acc[x][y] *= srow[ty + 8 * x];
        fp_ocl_tile_mm(ss, 0, skv, cols, acc);
    }

    barrier(CLK_LOCAL_MEM_FENCE); /* the last block's readers of srow are done */
    if (tid < T) {
        srow[tid] = fp_softmax_out_scale(&st);
        if (a.has_lse && tid < rows)
            lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + tid)] = fp_softmax_lse(&st);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    fp_ocl_store_tile(o, fp_ocl_row0(a.o, b, s.q_start + i0, h), a.o.s[1], a.o.s[3], rows, hd, acc,
                      srow, 1.0f);
}

/* P and dS of the tile rows [i0, i0 + rows) x keys [j0, j0 + cols), from the local q, dO, K, V
 * tiles and each row's LSE (srow[r]) and delta (srow[T + r]), into sp and sds ([T, T]; sp may be
 * NULL: dQ needs dS only). dS is d loss / d(q . k): softcap's derivative and the scale are
 * folded in. */
static inline void fp_ocl_grad_scores(const fp_ocl_args *a, const fp_ocl_seq *s, float slope,
                                      long i0, int rows, long j0, int cols, __local const float *sq,
                                      __local const float *sdo, __local const float *sk,
                                      __local const float *sv, __local const float *srow,
                                      __local float *sp, __local float *sds)
{
    const int ty = get_local_id(0) / 16, tx = get_local_id(0) % 16;
    float qk[SR][SC], dov[SR][SC];
    fp_ocl_tile_dots(sq, sk, qk);
    fp_ocl_tile_dots(sdo, sv, dov);
    for (int x = 0; x < SR; x++)
        for (int y = 0; y < SC; y++) {
            const int r = ty + 8 * x, c = tx + 16 * y;
            const long i = i0 + r, j = j0 + c;
            if (c >= T)
                continue;
            float p = 0.0f, ds = 0.0f;
            if (r < rows && c < cols && srow[r] > -INFINITY &&
                fp_mask_visible(i, j, s->nq, s->nk, a->left, a->right)) {
                const float capped =
                    fp_score_transform(qk[x][y] * a->scale, a->softcap, 0.0f, 0.0f);
                const float score = capped - slope * fp_alibi_distance(i, j, s->nq, s->nk);
                p = exp(score - srow[r]);
                ds = p * (dov[x][y] - srow[T + r]) * fp_softcap_grad(capped, a->softcap) * a->scale;
            }
            if (sp)
                sp[r * T + c] = p;
            sds[r * T + c] = ds;
        }
}

/* Loads the query side of a backward tile: q and dO rows and each row's LSE into srow[r]; the
 * rows' delta into srow[T + r] is the caller's. */
static inline void fp_ocl_load_query_side(const fp_ocl_args *a, const fp_ocl_seq *s, long b, long h,
                                          long i0, int rows, __global const fp_elem *q,
                                          __global const fp_elem *dout, __global const float *lse,
                                          __local float *sq, __local float *sdo,
                                          __local float *srow)
{
    const int tid = get_local_id(0), hd = (int)a->head_dim;
    fp_ocl_load_tile(sq, q, fp_ocl_row0(a->q, b, s->q_start, h), a->q.s[1], a->q.s[3], i0, rows,
                     hd);
    fp_ocl_load_tile(sdo, dout, fp_ocl_row0(a->dout, b, s->q_start, h), a->dout.s[1], a->dout.s[3],
                     i0, rows, hd);
    if (tid < T)
        srow[tid] = tid < rows ? lse[fp_ocl_lse_at(a, b, h, s->q_start + i0 + tid)] : -INFINITY;
}

__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_dq(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
                   __global const fp_elem *v, __global const fp_elem *o, __global const float *lse,
                   __global const fp_elem *dout, __global fp_elem *dq, __global float *delta,
                   __global const int *cu_q, __global const int *cu_k, __global const float *alibi,
                   __local float *sq, __local float *sdo, __local float *sk, __local float *sv,
                   __local float *sds, __local float *srow)
{
    const int tid = get_local_id(0), hd = (int)a.head_dim;
    const long h = get_group_id(1), b = get_group_id(2);
    const fp_ocl_seq s = fp_ocl_seq_of(&a, cu_q, cu_k, b);
    const long i0 = (long)get_group_id(0) * T;
    if (i0 >= s.nq)
        return;
    const int rows = (int)min((long)T, s.nq - i0);
    const long hk = h / (a.heads / a.kv_heads);
    const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
    const long k0 = fp_ocl_row0(a.k, b, s.k_start, hk), v0 = fp_ocl_row0(a.v, b, s.k_start, hk);

    fp_ocl_load_query_side(&a, &s, b, h, i0, rows, q, dout, lse, sq, sdo, srow);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (tid < rows) {
        const long o0 = fp_ocl_row0(a.o, b, s.q_start + i0 + tid, h);
        float dl = 0.0f;
        for (int d = 0; d < hd; d++)
            dl = fma(sdo[tid * LD + d], FP_LOAD(o, o0 + d * a.o.s[3]), dl);
        srow[T + tid] = dl;
        delta[fp_ocl_delta_at(&a, &s, b, h, i0 + tid)] = dl;
    }
    float acc[SR][DPT];
    fp_ocl_zero(acc);

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
    for (long j0 = lo < hi ? lo / T * T : hi; j0 < hi; j0 += T) {
        const int cols = (int)min((long)T, s.nk - j0);
        barrier(CLK_LOCAL_MEM_FENCE);
        fp_ocl_load_tile(sk, k, k0, a.k.s[1], a.k.s[3], j0, cols, hd);
        fp_ocl_load_tile(sv, v, v0, a.v.s[1], a.v.s[3], j0, cols, hd);
        barrier(CLK_LOCAL_MEM_FENCE);
        fp_ocl_grad_scores(&a, &s, slope, i0, rows, j0, cols, sq, sdo, sk, sv, srow, 0, sds);
        barrier(CLK_LOCAL_MEM_FENCE);
        fp_ocl_tile_mm(sds, 0, sk, cols, acc);
    }
    fp_ocl_store_tile(dq, fp_ocl_row0(a.dq, b, s.q_start + i0, h), a.dq.s[1], a.dq.s[3], rows, hd,
                      acc, 0, 1.0f);
}

__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_dkdv(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
                     __global const fp_elem *v, __global const float *lse,
                     __global const fp_elem *dout, __global fp_elem *dk, __global fp_elem *dv,
                     __global const float *delta, __global const int *cu_q,
                     __global const int *cu_k, __global const float *alibi, __local float *sq,
                     __local float *sdo, __local float *sk, __local float *sv, __local float *sp,
                     __local float *sds, __local float *srow)
{
    const int tid = get_local_id(0), hd = (int)a.head_dim;
    const long hk = get_group_id(1), b = get_group_id(2);
    const fp_ocl_seq s = fp_ocl_seq_of(&a, cu_q, cu_k, b);
    const long j0 = (long)get_group_id(0) * T;
    if (j0 >= s.nk)
        return;
    const int cols = (int)min((long)T, s.nk - j0);
    const long group = a.heads / a.kv_heads;

    fp_ocl_load_tile(sk, k, fp_ocl_row0(a.k, b, s.k_start, hk), a.k.s[1], a.k.s[3], j0, cols, hd);
    fp_ocl_load_tile(sv, v, fp_ocl_row0(a.v, b, s.k_start, hk), a.v.s[1], a.v.s[3], j0, cols, hd);
    float acc_k[SR][DPT], acc_v[SR][DPT]; /* rows: keys of the block */
    fp_ocl_zero(acc_k);
    fp_ocl_zero(acc_v);

    for (long h = hk * group; h < (hk + 1) * group; h++) {
        const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
        for (long i0 = 0; i0 < s.nq; i0 += T) {
            const int rows = (int)min((long)T, s.nq - i0);
            int64_t lo, hi;
            fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
            if (hi <= lo || hi <= j0 || lo >= j0 + cols)
                continue;                 /* no row of this query block sees these keys */
            barrier(CLK_LOCAL_MEM_FENCE); /* the previous block's readers are done */
            fp_ocl_load_query_side(&a, &s, b, h, i0, rows, q, dout, lse, sq, sdo, srow);
            if (tid < T)
                srow[T + tid] = tid < rows ? delta[fp_ocl_delta_at(&a, &s, b, h, i0 + tid)] : 0.0f;
            barrier(CLK_LOCAL_MEM_FENCE);
            fp_ocl_grad_scores(&a, &s, slope, i0, rows, j0, cols, sq, sdo, sk, sv, srow, sp, sds);
            barrier(CLK_LOCAL_MEM_FENCE);
            fp_ocl_tile_mm(sp, 1, sdo, rows, acc_v);
            fp_ocl_tile_mm(sds, 1, sq, rows, acc_k);
        }
    }
    fp_ocl_store_tile(dk, fp_ocl_row0(a.dk, b, s.k_start + j0, hk), a.dk.s[1], a.dk.s[3], cols, hd,
                      acc_k, 0, 1.0f);
    fp_ocl_store_tile(dv, fp_ocl_row0(a.dv, b, s.k_start + j0, hk), a.dv.s[1], a.dv.s[3], cols, hd,
                      acc_v, 0, 1.0f);
}
