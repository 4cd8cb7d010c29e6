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
 * time by FP_OCL_DTYPE (0, 1, 2). Work-groups of FP_OCL_WG work-items; each owns FP_OCL_ACC
 * output elements in registers; local tiles have an odd row pitch (ld) so work-items reading down
 * a column hit different banks.
 *
 * Configuration (fp_ocl_tile in ocl_attention.c picks t = bm = bn per head dim and local memory):
 *   t = the largest of 64, 32, 16, 8 with t * D <= FP_OCL_WG * FP_OCL_ACC whose local tiles fit.
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
    return a->varlen ? h * a->total_q + s->q_start + i : (b * a->heads + h) * a->nq + i;
}

/* Rows [r0, r0 + n) of a [seq, dim] slice (row0: element of row 0, dim 0) into t[r * ld + d],
 * zeros in rows n .. rows_max - 1 so partial tiles compute on finite values. */
static inline void fp_ocl_load_tile(__local float *t, __global const fp_elem *x, long row0,
                                    long srow, long sdim, long r0, int n, int rows_max, int D,
                                    int ld)
{
    for (int e = get_local_id(0); e < rows_max * D; e += FP_OCL_WG) {
        const int r = e / D, d = e - r * D;
        t[r * ld + d] = r < n ? FP_LOAD(x, row0 + (r0 + r) * srow + d * sdim) : 0.0f;
    }
}

static inline float fp_ocl_dot(__local const float *x, __local const float *y, int D)
{
    float acc = 0.0f;
    for (int d = 0; d < D; d++)
        acc = fma(x[d], y[d], acc);
    return acc;
}

__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_forward(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
               __global const fp_elem *v, __global fp_elem *o, __global float *lse,
               __global const int *cu_q, __global const int *cu_k, __global const float *alibi,
               __local float *sq, __local float *skv, __local float *ss, __local float *srow)
{
    const int tid = get_local_id(0), bm = (int)a.bm, bn = (int)a.bn, D = (int)a.head_dim;
    const int ld = (int)a.ld;
    const long h = get_group_id(1), b = get_group_id(2);
    const fp_ocl_seq s = fp_ocl_seq_of(&a, cu_q, cu_k, b);
    const long i0 = (long)get_group_id(0) * bm;
    if (i0 >= s.nq)
        return;
    const int rows = (int)min((long)bm, s.nq - i0);
    const long hk = h / (a.heads / a.kv_heads);
    const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
    const long k0 = fp_ocl_row0(a.k, b, s.k_start, hk), v0 = fp_ocl_row0(a.v, b, s.k_start, hk);

    fp_ocl_load_tile(sq, q, fp_ocl_row0(a.q, b, s.q_start, h), a.q.s[1], a.q.s[3], i0, rows, bm, D,
                     ld);
    fp_softmax_state st; /* row tid's, for tid < bm */
    fp_softmax_init(&st);
    float acc[FP_OCL_ACC];
    for (int x = 0; x < FP_OCL_ACC; x++)
        acc[x] = 0.0f;

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
    for (long j0 = lo < hi ? lo / bn * bn : hi; j0 < hi; j0 += bn) {
        const int cols = (int)min((long)bn, s.nk - j0);
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous block's readers of skv and ss are done */
        fp_ocl_load_tile(skv, k, k0, a.k.s[1], a.k.s[3], j0, cols, bn, D, ld);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = tid; e < bm * bn; e += FP_OCL_WG) {
            const int r = e / bn, c = e - r * bn;
            const long i = i0 + r, j = j0 + c;
            float x = -INFINITY;
            if (r < rows && c < cols && fp_mask_visible(i, j, s.nq, s.nk, a.left, a.right))
                x = fp_score_transform(fp_ocl_dot(sq + r * ld, skv + c * ld, D) * a.scale,
                                       a.softcap, slope, fp_alibi_distance(i, j, s.nq, s.nk));
            ss[e] = x;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (tid < bm) {
            float mx = -INFINITY;
            for (int c = 0; c < cols; c++)
                mx = fmax(mx, ss[tid * bn + c]);
            srow[tid] = fp_softmax_update(&st, mx);
            float sum = 0.0f;
            for (int c = 0; c < bn; c++) {
                const float p = c < cols ? fp_softmax_weight(&st, ss[tid * bn + c]) : 0.0f;
                ss[tid * bn + c] = p;
                sum += p;
            }
            st.l += sum;
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* P and alpha written; every reader of K is done */
        fp_ocl_load_tile(skv, v, v0, a.v.s[1], a.v.s[3], j0, cols, bn, D, ld);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int x = 0; x < FP_OCL_ACC; x++) {
            const int e = tid + x * FP_OCL_WG;
            if (e < bm * D) {
                const int r = e / D, d = e - r * D;
                float y = acc[x] * srow[r];
                for (int c = 0; c < cols; c++)
                    y = fma(ss[r * bn + c], skv[c * ld + d], y);
                acc[x] = y;
            }
        }
    }

    barrier(CLK_LOCAL_MEM_FENCE); /* the last block's readers of srow are done */
    if (tid < bm) {
        srow[tid] = fp_softmax_out_scale(&st);
        if (a.has_lse && tid < rows)
            lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + tid)] = fp_softmax_lse(&st);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const long o0 = fp_ocl_row0(a.o, b, s.q_start, h);
    for (int x = 0; x < FP_OCL_ACC; x++) {
        const int e = tid + x * FP_OCL_WG;
        if (e < rows * D) {
            const int r = e / D, d = e - r * D;
            FP_STORE(o, o0 + (i0 + r) * a.o.s[1] + d * a.o.s[3], acc[x] * srow[r]);
        }
    }
}

/* P and dS of the tile rows [i0, i0 + rows) x keys [j0, j0 + cols), from the local q, dO, K, V
 * tiles and each row's LSE (srow[r]) and delta (srow[bm + r]). sp may be NULL (dQ needs dS
 * only). dS is d loss / d(q . k): softcap's derivative and the scale are folded in. */
static inline void fp_ocl_grad_scores(const fp_ocl_args *a, const fp_ocl_seq *s, float slope,
                                      long i0, int rows, long j0, int cols, __local const float *sq,
                                      __local const float *sdo, __local const float *sk,
                                      __local const float *sv, __local const float *srow,
                                      __local float *sp, __local float *sds)
{
    const int bm = (int)a->bm, bn = (int)a->bn, D = (int)a->head_dim, ld = (int)a->ld;
    for (int e = get_local_id(0); e < bm * bn; e += FP_OCL_WG) {
        const int r = e / bn, c = e - r * bn;
        const long i = i0 + r, j = j0 + c;
        float p = 0.0f, ds = 0.0f;
        if (r < rows && c < cols && srow[r] > -INFINITY &&
            fp_mask_visible(i, j, s->nq, s->nk, a->left, a->right)) {
            const float raw = fp_ocl_dot(sq + r * ld, sk + c * ld, D) * a->scale;
            const float capped = fp_score_transform(raw, a->softcap, 0.0f, 0.0f);
            const float score = capped - slope * fp_alibi_distance(i, j, s->nq, s->nk);
            p = exp(score - srow[r]);
            const float dp = fp_ocl_dot(sdo + r * ld, sv + c * ld, D);
            ds = p * (dp - srow[bm + r]) * fp_softcap_grad(capped, a->softcap) * a->scale;
        }
        if (sp)
            sp[e] = p;
        sds[e] = ds;
    }
}

/* Loads the query side of a backward tile: q and dO rows and each row's LSE into srow[r]; the
 * rows' delta into srow[bm + r] is the caller's. */
static inline void fp_ocl_load_query_side(const fp_ocl_args *a, const fp_ocl_seq *s, long b, long h,
                                          long i0, int rows, __global const fp_elem *q,
                                          __global const fp_elem *dout, __global const float *lse,
                                          __local float *sq, __local float *sdo,
                                          __local float *srow)
{
    const int bm = (int)a->bm, D = (int)a->head_dim, ld = (int)a->ld, tid = get_local_id(0);
    fp_ocl_load_tile(sq, q, fp_ocl_row0(a->q, b, s->q_start, h), a->q.s[1], a->q.s[3], i0, rows, bm,
                     D, ld);
    fp_ocl_load_tile(sdo, dout, fp_ocl_row0(a->dout, b, s->q_start, h), a->dout.s[1], a->dout.s[3],
                     i0, rows, bm, D, ld);
    if (tid < bm)
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
    const int tid = get_local_id(0), bm = (int)a.bm, bn = (int)a.bn, D = (int)a.head_dim;
    const int ld = (int)a.ld;
    const long h = get_group_id(1), b = get_group_id(2);
    const fp_ocl_seq s = fp_ocl_seq_of(&a, cu_q, cu_k, b);
    const long i0 = (long)get_group_id(0) * bm;
    if (i0 >= s.nq)
        return;
    const int rows = (int)min((long)bm, s.nq - i0);
    const long hk = h / (a.heads / a.kv_heads);
    const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
    const long k0 = fp_ocl_row0(a.k, b, s.k_start, hk), v0 = fp_ocl_row0(a.v, b, s.k_start, hk);

    fp_ocl_load_query_side(&a, &s, b, h, i0, rows, q, dout, lse, sq, sdo, srow);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (tid < rows) {
        const long o0 = fp_ocl_row0(a.o, b, s.q_start + i0 + tid, h);
        float dl = 0.0f;
        for (int d = 0; d < D; d++)
            dl = fma(sdo[tid * ld + d], FP_LOAD(o, o0 + d * a.o.s[3]), dl);
        srow[bm + tid] = dl;
        delta[fp_ocl_delta_at(&a, &s, b, h, i0 + tid)] = dl;
    }
    float acc[FP_OCL_ACC];
    for (int x = 0; x < FP_OCL_ACC; x++)
        acc[x] = 0.0f;

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
    for (long j0 = lo < hi ? lo / bn * bn : hi; j0 < hi; j0 += bn) {
        const int cols = (int)min((long)bn, s.nk - j0);
        barrier(CLK_LOCAL_MEM_FENCE);
        fp_ocl_load_tile(sk, k, k0, a.k.s[1], a.k.s[3], j0, cols, bn, D, ld);
        fp_ocl_load_tile(sv, v, v0, a.v.s[1], a.v.s[3], j0, cols, bn, D, ld);
        barrier(CLK_LOCAL_MEM_FENCE);
        fp_ocl_grad_scores(&a, &s, slope, i0, rows, j0, cols, sq, sdo, sk, sv, srow, 0, sds);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int x = 0; x < FP_OCL_ACC; x++) {
            const int e = tid + x * FP_OCL_WG;
            if (e < bm * D) {
                const int r = e / D, d = e - r * D;
                float y = acc[x];
                for (int c = 0; c < cols; c++)
                    y = fma(sds[r * bn + c], sk[c * ld + d], y);
                acc[x] = y;
            }
        }
    }

    const long q0 = fp_ocl_row0(a.dq, b, s.q_start, h);
    for (int x = 0; x < FP_OCL_ACC; x++) {
        const int e = tid + x * FP_OCL_WG;
        if (e < rows * D) {
            const int r = e / D, d = e - r * D;
            FP_STORE(dq, q0 + (i0 + r) * a.dq.s[1] + d * a.dq.s[3], acc[x]);
        }
    }
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
    const int tid = get_local_id(0), bm = (int)a.bm, bn = (int)a.bn, D = (int)a.head_dim;
    const int ld = (int)a.ld;
    const long hk = get_group_id(1), b = get_group_id(2);
    const fp_ocl_seq s = fp_ocl_seq_of(&a, cu_q, cu_k, b);
    const long j0 = (long)get_group_id(0) * bn;
    if (j0 >= s.nk)
        return;
    const int cols = (int)min((long)bn, s.nk - j0);
    const long group = a.heads / a.kv_heads;

    fp_ocl_load_tile(sk, k, fp_ocl_row0(a.k, b, s.k_start, hk), a.k.s[1], a.k.s[3], j0, cols, bn, D,
                     ld);
    fp_ocl_load_tile(sv, v, fp_ocl_row0(a.v, b, s.k_start, hk), a.v.s[1], a.v.s[3], j0, cols, bn, D,
                     ld);
    float acc_k[FP_OCL_ACC], acc_v[FP_OCL_ACC];
    for (int x = 0; x < FP_OCL_ACC; x++) {
        acc_k[x] = 0.0f;
        acc_v[x] = 0.0f;
    }

    for (long h = hk * group; h < (hk + 1) * group; h++) {
        const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
        for (long i0 = 0; i0 < s.nq; i0 += bm) {
            const int rows = (int)min((long)bm, s.nq - i0);
            int64_t lo, hi;
            fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
            if (hi <= lo || hi <= j0 || lo >= j0 + cols)
                continue;                 /* no row of this query block sees these keys */
            barrier(CLK_LOCAL_MEM_FENCE); /* the previous block's readers are done */
            fp_ocl_load_query_side(&a, &s, b, h, i0, rows, q, dout, lse, sq, sdo, srow);
            if (tid < bm)
                srow[bm + tid] = tid < rows ? delta[fp_ocl_delta_at(&a, &s, b, h, i0 + tid)] : 0.0f;
            barrier(CLK_LOCAL_MEM_FENCE);
            fp_ocl_grad_scores(&a, &s, slope, i0, rows, j0, cols, sq, sdo, sk, sv, srow, sp, sds);
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int x = 0; x < FP_OCL_ACC; x++) {
                const int e = tid + x * FP_OCL_WG;
                if (e < bn * D) {
                    const int c = e / D, d = e - c * D;
                    float yk = acc_k[x], yv = acc_v[x];
                    for (int r = 0; r < rows; r++) {
                        yv = fma(sp[r * bn + c], sdo[r * ld + d], yv);
                        yk = fma(sds[r * bn + c], sq[r * ld + d], yk);
                    }
                    acc_k[x] = yk;
                    acc_v[x] = yv;
                }
            }
        }
    }

    const long dk0 = fp_ocl_row0(a.dk, b, s.k_start, hk), dv0 = fp_ocl_row0(a.dv, b, s.k_start, hk);
    for (int x = 0; x < FP_OCL_ACC; x++) {
        const int e = tid + x * FP_OCL_WG;
        if (e < cols * D) {
            const int c = e / D, d = e - c * D;
            FP_STORE(dk, dk0 + (j0 + c) * a.dk.s[1] + d * a.dk.s[3], acc_k[x]);
            FP_STORE(dv, dv0 + (j0 + c) * a.dv.s[1] + d * a.dv.s[3], acc_v[x]);
        }
    }
}
