/*
 * The forward in FlashAttention-2's shape for NVIDIA's tensor cores through OpenCL (FP_OCL_FA2 = 1,
 * with FP_OCL_MMA = 1; f16 and bf16 storage, head-dim classes up to 128, T = 64).
 *
 * Algorithm: one work-group of 4 warps per (64-row query block, head, batch); warp w owns query
 * rows 16 w .. 16 w + 15 for the whole call. Its Q fragments (the A operands of Q K^T, D / 16
 * m16n8k16 steps) are loaded once into registers (the Q tile staged through K's local buffer);
 * key blocks of 64 stream through local memory, K as [64, D + 8] and V transposed as
 * [D, 64 + 8] (both 16-bit, copied in one phase between two barriers). Per key block each warp:
 *   S = Q K^T: 8 column tiles of m16n8 C fragments in registers (32 floats a lane);
 *   the mask and score transforms (core/mask.h) on those registers, skipped in blocks that are
 *   wholly visible with no softcap, ALiBi or paged cache;
 *   the row max and (at the end) the row sum: a lane holds rows g and g + 8 (lane = 4 g + t),
 *   columns 2 t, 2 t + 1 of each column tile, so a row is one quad of lanes, reduced by two
 *   butterfly shuffles (shfl.sync.bfly through inline PTX); the online softmax of
 *   core/online_softmax.h per row with the lane's partial sum (l scales by the quad's common
 *   alpha, so the partial sums add up at the end);
 *   O = alpha O + P V: the C fragments of S, rounded to the storage type, are the A fragments of
 *   P V as they stand (C tiles 2 kk and 2 kk + 1 are the A operand of key step kk), so P never
 *   goes to local memory; V's B fragments are 32-bit loads from the transposed tile.
 * No barrier inside a block's computation: only the two around the K / V copy.
 *
 * Target: NVIDIA GPUs of compute capability >= 8.0 through NVIDIA's OpenCL driver (48 KiB of
 * local memory: K 17 KiB + V 18 KiB + 512 bytes of key flags at D = 128). No ldmatrix and no
 * asynchronous copies: plain 32-bit local loads (bank-conflict-free by the pitches of ocl_plan.h)
 * and 16-byte global loads. With FP_OCL_MMA_EMULATE = 1 (FLASHPORT_OPENCL_MMA=emulate) the
 * mma.sync and the shuffle are emulated through local memory (mma_nv.cl's fp_ocl_mma16816 and
 * fp_ocl_shfl_xor below), which runs the same data flow on any OpenCL device (PoCL in the
 * tests); tests/opencl/check_ptx.sh compiles the real one to PTX and assembles it.
 *
 * Configuration: ocl_plan.h's fp_ocl_fa2_tile (T = 64 for D <= 128; above, the tile-shaped
 * variant of mma_nv.cl serves). Features as flash.cl's forward: masks and windows, softcap,
 * ALiBi, GQA, varlen, seqused_k, paged K / V, LSE, rows that see no key, and the guard for
 * masked keys (V scrubbed in edge blocks; a row that sees a scrubbed key gets O = NaN), with the
 * key flags in their own array, two blocks' worth so that zeroing one block's flags never races
 * with the block that reads or writes the other's. Known differences from the reference: as the
 * tile-shaped tensor-core variant (P rounded to the storage type, f32 accumulation). Numbers:
 * docs/performance.md ("OpenCL backend").
 */
#if FP_OCL_FA2

#if !FP_OCL_MMA || D > 128 || T != 64
#error "the FA2 forward needs the tensor-core policy, D <= 128 and T = 64"
#endif

#define FA2_KS (D / 16) /* k steps of Q K^T */
#define FA2_SN (T / 8)  /* column tiles of a warp's S */
#define FA2_ON (D / 8)  /* column tiles of a warp's O */
#define LDT    (T + 8)  /* pitch of the transposed V tile (ocl_plan.h's fp_ocl_vt_ld) */

/* v of lane (lane ^ mask) of this warp: shfl.sync.bfly, or its emulation through the warp's
 * floats of scratch (two barriers: every work-item calls it the same number of times). */
FP_OCL_INLINE float fp_ocl_shfl_xor(float v, int mask, __local float *scratch)
{
#if FP_OCL_MMA_EMULATE
    const int lane = get_local_id(0) % 32;
    __local float *x = scratch + get_local_id(0) / 32 * 32;
    x[lane] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    const float r = x[lane ^ mask];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
#else
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(mask));
    return r;
#endif
}

/* Rows [r0, r0 + n) of a [seq, dim] slice into vt[d * LDT + r] (transposed), zeros as
 * fp_ocl_load_tile's; where scrub, non-finite elements become 0 and set bad[r]. 16 bytes (8
 * dims of one key) a work-item where fp_ocl_load_tile16's conditions hold, consecutive
 * work-items on consecutive keys (their 16-bit stores then fall on 16 distinct banks). */
FP_OCL_INLINE void fp_ocl_load_vt(__local fp_tile *vt, __global const fp_elem *x,
                                  const fp_ocl_args *a, const fp_ocl_rows *src, long r0, int n,
                                  int hd, int scrub, __local float *bad)
{
    if (src->sdim == 1 && hd % 8 == 0 && src->row0 % 8 == 0 && src->srow % 8 == 0 &&
        src->spage % 8 == 0) {
        for (int e = get_local_id(0); e < T * (D / 8); e += FP_OCL_WG) {
            const int r = e % T, d = e / T * 8;
            const long at = r < n && d < hd ? fp_ocl_row_at(a, src, r0 + r) : -1;
            uint4 v = (uint4)(0);
            if (at >= 0)
                v = *(__global const uint4 *)((__global const ushort *)x + at + d);
            if (scrub && !(fp_ocl_finite2(v.x) && fp_ocl_finite2(v.y) && fp_ocl_finite2(v.z) &&
                           fp_ocl_finite2(v.w))) {
                v = (uint4)(fp_ocl_scrub2(v.x), fp_ocl_scrub2(v.y), fp_ocl_scrub2(v.z),
                            fp_ocl_scrub2(v.w));
                bad[r] = 1.0f;
            }
            __local fp_tile *p = vt + d * LDT + r;
            p[0] = (fp_tile)v.x;
            p[LDT] = (fp_tile)(v.x >> 16);
            p[2 * LDT] = (fp_tile)v.y;
            p[3 * LDT] = (fp_tile)(v.y >> 16);
            p[4 * LDT] = (fp_tile)v.z;
            p[5 * LDT] = (fp_tile)(v.z >> 16);
            p[6 * LDT] = (fp_tile)v.w;
            p[7 * LDT] = (fp_tile)(v.w >> 16);
        }
        return;
    }
    for (int e = get_local_id(0); e < T * D; e += FP_OCL_WG) {
        const int r = e % T, d = e / T;
        const long at = r < n && d < hd ? fp_ocl_row_at(a, src, r0 + r) : -1;
        fp_tile v = at >= 0 ? FP_TILE_PUT(x, at + d * src->sdim) : (fp_tile)0;
        if (scrub && !FP_TILE_FINITE(v)) {
            v = (fp_tile)0;
            bad[r] = 1.0f;
        }
        vt[d * LDT + r] = v;
    }
}

/* Whether query i sees a key of [j0, j0 + cols) whose flag in bad is set (the guard's select). */
FP_OCL_INLINE int fp_ocl_fa2_sees_bad(const fp_ocl_args *a, const fp_ocl_seq *s, long i, long j0,
                                      int cols, __local const float *bad)
{
    const int c0 = (int)clamp(fp_mask_lo(i, s->nq, s->nk, a->left) - j0, 0L, (long)cols);
    const int c1 = (int)clamp(fp_mask_hi(i, s->nq, s->nk, a->right) - j0, 0L, (long)cols);
    int seen = 0;
    for (int c = c0; c < c1; c++)
        seen |= bad[c] != 0.0f;
    return seen;
}

__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_forward(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
               __global const fp_elem *v, __global fp_elem *o, __global float *lse,
               __global const int *cu_q, __global const int *cu_k, __global const float *alibi,
               __global const int *used, __global const int *bt, __local fp_tile *sk_arg,
               __local fp_tile *svt_arg, __local float *sbad_arg)
{
    __local fp_tile *sk = FP_OCL_ALIGN16(fp_tile, sk_arg), *svt = FP_OCL_ALIGN16(fp_tile, svt_arg);
    __local float *sbad = FP_OCL_ALIGN16(float, sbad_arg); /* [2][T]: key flags, by block parity */
    __local float scratch[FP_OCL_SCRATCH];
    const int tid = get_local_id(0), hd = (int)a.head_dim;
    const long h = get_group_id(1), b = get_group_id(2);
    const fp_ocl_seq s = fp_ocl_seq_of(&a, cu_q, cu_k, used, b);
    const long i0 = (long)get_group_id(0) * T;
    if (i0 >= s.nq)
        return;
    const int rows = (int)min((long)T, s.nq - i0);
    const long hk = h / (a.heads / a.kv_heads);
    const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
    const fp_ocl_rows qr = fp_ocl_dense_rows(fp_ocl_row0(a.q, b, s.q_start, h), a.q.s[1], a.q.s[3]);
    const fp_ocl_rows kr = fp_ocl_key_rows(&a, a.k, bt, &s, b, hk);
    const fp_ocl_rows vr = fp_ocl_key_rows(&a, a.v, bt, &s, b, hk);
    const int w = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const int r_lo = 16 * w + g; /* this lane's rows of the tile: r_lo and r_lo + 8 */

    /* Q through K's buffer into this warp's A fragments */
    fp_ocl_load_tile(sk, q, &a, &qr, i0, rows, hd, 0, sbad);
    if (tid < 2 * T)
        sbad[tid] = 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    uint qf[FA2_KS * 4];
    FP_OCL_UNROLL
    for (int ks = 0; ks < FA2_KS; ks++)
        fp_ocl_load_a(qf + 4 * ks, sk, 1, 16 * w * LD + 16 * ks, LD, 1);

    /* rows r_lo (0) and r_lo + 8 (1): the softmax state, l this lane's share until the end;
     * whether the row sees a key whose V row was scrubbed (O = NaN) */
    fp_softmax_state st0, st1;
    fp_softmax_init(&st0);
    fp_softmax_init(&st1);
    int nan0 = 0, nan1 = 0;
    float acc[FA2_ON * 4];
    FP_OCL_UNROLL
    for (int n = 0; n < FA2_ON; n++)
        acc[4 * n + 0] = acc[4 * n + 1] = acc[4 * n + 2] = acc[4 * n + 3] = 0.0f;

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
    for (long j0 = lo < hi ? lo / T * T : hi; j0 < hi; j0 += T) {
        const int par = (int)(j0 / T) & 1; /* which half of sbad holds this block's flags */
        const int cols = (int)min((long)T, s.nk - j0);
        const int edge =
            !fp_mask_block_full(i0, i0 + rows, j0, j0 + cols, s.nq, s.nk, a.left, a.right);
        __local float *bad = sbad + par * T;
        barrier(CLK_LOCAL_MEM_FENCE); /* every reader of sk (Q, the last K) and svt is done */
        fp_ocl_load_tile(sk, k, &a, &kr, j0, cols, hd, 0, sbad);
        fp_ocl_load_vt(svt, v, &a, &vr, j0, cols, hd, edge, bad);
        if (tid < T) /* the other parity: read in the block before, written in the next one */
            sbad[(par ^ 1) * T + tid] = 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);

        float sc[FA2_SN * 4];
        FP_OCL_UNROLL
        for (int j = 0; j < FA2_SN; j++)
            sc[4 * j + 0] = sc[4 * j + 1] = sc[4 * j + 2] = sc[4 * j + 3] = 0.0f;
        FP_OCL_UNROLL
        for (int ks = 0; ks < FA2_KS; ks++)
            FP_OCL_UNROLL
            for (int j = 0; j < FA2_SN; j++) {
                uint kb[2];
                fp_ocl_load_b(kb, sk + 8 * j * LD + 16 * ks, 1, LD);
                fp_ocl_mma16816(sc + 4 * j, qf + 4 * ks, kb, scratch);
            }

        /* scores: scaled; in a block with a masked pair, a key past the sequence, a paged
         * cache (a key of a page out of range is masked), softcap or ALiBi, the whole of
         * core/mask.h's transform per element */
        const int simple = !edge && cols == T && !a.paged && !a.has_alibi && a.softcap == 0.0f;
        FP_OCL_UNROLL
        for (int j = 0; j < FA2_SN; j++)
            FP_OCL_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = r_lo + 8 * (e / 2), c = 8 * j + 2 * t4 + e % 2;
                float x = sc[4 * j + e] * a.scale;
                if (!simple) {
                    const int seen =
                        r < rows && c < cols &&
                        fp_mask_visible(i0 + r, j0 + c, s.nq, s.nk, a.left, a.right) &&
                        (!a.paged || fp_ocl_row_at(&a, &kr, j0 + c) >= 0);
                    x = seen ? fp_score_transform(x, a.softcap, slope,
                                                  fp_alibi_distance(i0 + r, j0 + c, s.nq, s.nk))
                             : -INFINITY;
                }
                sc[4 * j + e] = x;
            }

        float mx[2] = {-INFINITY, -INFINITY};
        FP_OCL_UNROLL
        for (int j = 0; j < FA2_SN; j++) {
            mx[0] = fmax(mx[0], fmax(sc[4 * j + 0], sc[4 * j + 1]));
            mx[1] = fmax(mx[1], fmax(sc[4 * j + 2], sc[4 * j + 3]));
        }
        mx[0] = fmax(mx[0], fp_ocl_shfl_xor(mx[0], 1, scratch));
        mx[0] = fmax(mx[0], fp_ocl_shfl_xor(mx[0], 2, scratch));
        mx[1] = fmax(mx[1], fp_ocl_shfl_xor(mx[1], 1, scratch));
        mx[1] = fmax(mx[1], fp_ocl_shfl_xor(mx[1], 2, scratch));
        float alpha[2], sum[2] = {0.0f, 0.0f};
        alpha[0] = fp_softmax_update(&st0, mx[0]);
        alpha[1] = fp_softmax_update(&st1, mx[1]);
        FP_OCL_UNROLL
        for (int j = 0; j < FA2_SN; j++)
            FP_OCL_UNROLL
            for (int e = 0; e < 4; e++) {
                const float p = fp_softmax_weight(e < 2 ? &st0 : &st1, sc[4 * j + e]);
                sc[4 * j + e] = p;
                sum[e / 2] += p;
            }
        st0.l += sum[0];
        st1.l += sum[1];
        if (edge) {
            nan0 |= fp_ocl_fa2_sees_bad(&a, &s, i0 + r_lo, j0, cols, bad);
            nan1 |= fp_ocl_fa2_sees_bad(&a, &s, i0 + r_lo + 8, j0, cols, bad);
        }

        FP_OCL_UNROLL
        for (int n = 0; n < FA2_ON; n++) {
            acc[4 * n + 0] *= alpha[0];
            acc[4 * n + 1] *= alpha[0];
            acc[4 * n + 2] *= alpha[1];
            acc[4 * n + 3] *= alpha[1];
        }
        FP_OCL_UNROLL
        for (int kk = 0; kk < T / 16; kk++) {
            uint pa[4];
            pa[0] = fp_ocl_pack2(sc[4 * (2 * kk) + 0], sc[4 * (2 * kk) + 1]);
            pa[1] = fp_ocl_pack2(sc[4 * (2 * kk) + 2], sc[4 * (2 * kk) + 3]);
            pa[2] = fp_ocl_pack2(sc[4 * (2 * kk + 1) + 0], sc[4 * (2 * kk + 1) + 1]);
            pa[3] = fp_ocl_pack2(sc[4 * (2 * kk + 1) + 2], sc[4 * (2 * kk + 1) + 3]);
            FP_OCL_UNROLL
            for (int n = 0; n < FA2_ON; n++) {
                uint vb[2];
                fp_ocl_load_b(vb, svt + 8 * n * LDT + 16 * kk, 1, LDT);
                fp_ocl_mma16816(acc + 4 * n, pa, vb, scratch);
            }
        }
    }

    st0.l += fp_ocl_shfl_xor(st0.l, 1, scratch);
    st0.l += fp_ocl_shfl_xor(st0.l, 2, scratch);
    st1.l += fp_ocl_shfl_xor(st1.l, 1, scratch);
    st1.l += fp_ocl_shfl_xor(st1.l, 2, scratch);
    /* a row that saw a scrubbed V row: NaN, as its 0 x NaN-free sum would not be */
    const float f[2] = {nan0 ? NAN : fp_softmax_out_scale(&st0),
                        nan1 ? NAN : fp_softmax_out_scale(&st1)};
    if (a.has_lse && t4 == 0 && r_lo < rows)
        lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + r_lo)] = fp_softmax_lse(&st0);
    if (a.has_lse && t4 == 0 && r_lo + 8 < rows)
        lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + r_lo + 8)] = fp_softmax_lse(&st1);
    const long o0 = fp_ocl_row0(a.o, b, s.q_start + i0, h);
    FP_OCL_UNROLL
    for (int n = 0; n < FA2_ON; n++)
        FP_OCL_UNROLL
        for (int e = 0; e < 4; e++) {
            const int r = r_lo + 8 * (e / 2), d = 8 * n + 2 * t4 + e % 2;
            if (r < rows && d < hd)
                FP_STORE(o, o0 + r * a.o.s[1] + d * a.o.s[3], acc[4 * n + e] * f[e / 2]);
        }
}

#endif /* FP_OCL_FA2 */
