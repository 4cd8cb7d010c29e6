/*
 * The forward in FlashAttention-2's shape for NVIDIA's tensor cores through OpenCL (FP_OCL_FA2 = 1,
 * with FP_OCL_MMA = 1; f16 and bf16 storage, every head-dim class, T = 64; the backward's kernels
 * below it: both forms up to class 128, the one-kernel form above, FA2_WIDE).
 *
 * Algorithm: one work-group of 4 warps per (64-row query block, head, batch); warp w owns query
 * rows 16 w .. 16 w + 15 for the whole call. Its Q fragments (the A operands of Q K^T, D / 16
 * m16n8k16 steps) are loaded once into registers (the Q tile staged through K's local buffer, a
 * key block's rows at a time); key blocks of FK keys (FP_OCL_FA2_FK: 64 up to D = 128, 32
 * above) stream through local memory, K as [FK, D + 8] and V transposed as [OD, FK + 8] (both
 * 16-bit, copied in one phase between two barriers), OD the dims of O a pass over the keys
 * computes (FP_OCL_FA2_OD: all of them up to D = 192; at D = 256 two passes of 128, S computed
 * in each, since a warp's 16 x 256 f32 O, 128 registers a lane, beside its 64 registers of Q
 * fragments and S passes 255 registers and spills). Per key block each warp:
 *   S = Q K^T: FK / 8 column tiles of m16n8 C fragments in registers (FK / 2 floats a lane);
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
 * local memory: K 17 KiB + V 18 KiB + 512 bytes of key flags at D = 128; K 16.5 KiB + V 10 KiB
 * at D = 256). Registers: ptxas's counts (tests/opencl/check_ptx.sh, sm_90) in docs/opencl.md.
 * No ldmatrix and no asynchronous copies: plain 32-bit local loads (bank-conflict-free by the
 * pitches of ocl_plan.h) and 16-byte global loads. With FP_OCL_MMA_EMULATE = 1
 * (FLASHPORT_OPENCL_MMA=emulate) the mma.sync and the shuffle are emulated through local memory
 * (mma_nv.cl's fp_ocl_mma16816 and fp_ocl_shfl_xor below), which runs the same data flow on any
 * OpenCL device (PoCL in the tests); tests/opencl/check_ptx.sh compiles the real one to PTX and
 * assembles it.
 *
 * Configuration: ocl_plan.h's fp_ocl_fa2_tile (T = 64; the two-kernel backward above D = 128 is
 * the tile-shaped variant's of mma_nv.cl). Features as flash.cl's forward: masks and windows, softcap,
 * ALiBi, GQA, varlen, seqused_k, paged K / V, LSE, rows that see no key, and the guard for
 * masked keys (V scrubbed in edge blocks; a row that sees a scrubbed key gets O = NaN), with the
 * key flags in their own array, two blocks' worth so that zeroing one block's flags never races
 * with the block that reads or writes the other's. Known differences from the reference: as the
 * tile-shaped tensor-core variant (P rounded to the storage type, f32 accumulation). Numbers:
 * docs/performance.md ("OpenCL backend").
 */
#if FP_OCL_FA2

#if !FP_OCL_MMA || D > 256 || T != 64
#error "the FA2-shaped kernels need the tensor-core policy, D <= 256 and T = 64"
#endif

/* FA2_WIDE: the forward's key blocks are smaller than its query block (head-dim classes above
 * 128): Q is staged a key block's rows at a time and O computed in passes of FA2_OD dims. The
 * code for that is compiled only there (#if FA2_WIDE), so that the forward of the smaller
 * classes, one pass over key blocks of T keys with Q staged whole, stays as plain as before:
 * with the general code compiled at D = 128 too, NVIDIA's compiler gave a forward about 28 %
 * slower (docs/opencl.md). */
#define FA2_WIDE (FP_OCL_FA2_FK(D) < T)
#if FA2_WIDE
#define FA2_FK FP_OCL_FA2_FK(D) /* keys per block of the forward */
#define FA2_OD FP_OCL_FA2_OD(D) /* dims of O a pass of the forward computes */
#else
#define FA2_FK T
#define FA2_OD D
#endif
#define FA2_KS (D / 16)     /* k steps of Q K^T */
#define FA2_SN (FA2_FK / 8) /* column tiles of a warp's S in the forward */
#define FA2_ON (D / 8)      /* column tiles of a warp's O (dQ, dK, dV) */
#define FA2_OP (FA2_OD / 8) /* column tiles of the dims a pass of the forward computes */
#define LDT    (FA2_FK + 8) /* pitch of the transposed V tile (ocl_plan.h's fp_ocl_vt_ld) */
#define LDP    (D + 8)      /* pitch in 32-bit words of a row-pair tile (fp_ocl_fa2_load_pairs) */

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

/* Dims d0 .. d0 + FA2_OD (d0 0 where !FA2_WIDE) of rows [r0, r0 + n) (n <= FA2_FK) of a [seq,
 * dim] slice into vt[(d - d0) * LDT + r] (transposed), zeros as fp_ocl_load_tile's; where scrub,
 * non-finite elements become 0 and set bad[r], and so do those of the row's other dims (read for
 * that alone, so that every pass of the forward flags the same keys). 16 bytes (8 dims of one
 * key) a work-item where fp_ocl_rows_by16 holds, consecutive work-items on consecutive keys
 * (their 16-bit stores then fall on 16 distinct banks). */
FP_OCL_INLINE void fp_ocl_load_vt(__local fp_tile *vt, __global const fp_elem *x,
                                  const fp_ocl_args *a, const fp_ocl_rows *src, long r0, int n,
#if FA2_WIDE
                                  int hd, int d0, int scrub, __local float *bad)
#else
                                  int hd, int scrub, __local float *bad)
#endif
{
    if (fp_ocl_rows_by16(src, hd)) {
        for (int e = get_local_id(0); e < FA2_FK * (FA2_OD / 8); e += FP_OCL_WG) {
            const int r = e % FA2_FK, d = e / FA2_FK * 8;
#if FA2_WIDE
            const uint4 v = fp_ocl_get16(x, a, src, r0, r, n, d0 + d, hd, scrub, bad + r);
#else
            const uint4 v = fp_ocl_get16(x, a, src, r0, r, n, d, hd, scrub, bad + r);
#endif
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
#if FA2_WIDE
        for (int e = get_local_id(0); scrub && e < FA2_FK * ((D - FA2_OD) / 8); e += FP_OCL_WG) {
            const int r = e % FA2_FK, d = e / FA2_FK * 8;
            (void)fp_ocl_get16(x, a, src, r0, r, n, d < d0 ? d : d + FA2_OD, hd, 1, bad + r);
        }
#endif
        return;
    }
    for (int e = get_local_id(0); e < FA2_FK * FA2_OD; e += FP_OCL_WG) {
        const int r = e % FA2_FK, d = e / FA2_FK;
#if FA2_WIDE
        vt[d * LDT + r] = fp_ocl_get1(x, a, src, r0, r, n, d0 + d, hd, scrub, bad + r);
#else
        vt[d * LDT + r] = fp_ocl_get1(x, a, src, r0, r, n, d, hd, scrub, bad + r);
#endif
    }
#if FA2_WIDE
    for (int e = get_local_id(0); scrub && e < FA2_FK * (D - FA2_OD); e += FP_OCL_WG) {
        const int r = e % FA2_FK, d = e / FA2_FK;
        (void)fp_ocl_get1(x, a, src, r0, r, n, d < d0 ? d : d + FA2_OD, hd, 1, bad + r);
    }
#endif
}

/* The 16-bit halves of two rows' words x (row 2 i) and y (row 2 i + 1) regrouped by dim: (x's low,
 * y's low) and (x's high, y's high). */
FP_OCL_INLINE uint fp_ocl_pair_lo(uint x, uint y)
{
    return (x & 0xffffu) | y << 16;
}

FP_OCL_INLINE uint fp_ocl_pair_hi(uint x, uint y)
{
    return x >> 16 | (y & 0xffff0000u);
}

/* Rows [r0, r0 + n) of a [seq, dim] slice, zeros and scrub as fp_ocl_load_rows's (flags at
 * bad[r]), into the row-pair tile tp: word i * LDP + d holds dim d of rows 2 i (low half) and
 * 2 i + 1 (high half), so that a B fragment register of a product over these rows (a pair along
 * a column: fp_ocl_fa2_load_b_pairs) is one 32-bit load where a row-major tile takes two 16-bit
 * ones; where rowmajor, also into t[r * LD + d] as fp_ocl_load_rows. nrows even. Two rows' 16
 * bytes (8 dims) a work-item where fp_ocl_rows_by16 holds, else element-wise. */
FP_OCL_INLINE void fp_ocl_fa2_load_pairs(__local fp_tile *t, int rowmajor, __local uint *tp,
                                         int nrows, __global const fp_elem *x, const fp_ocl_args *a,
                                         const fp_ocl_rows *src, long r0, int n, int hd, int scrub,
                                         __local float *bad)
{
    if (fp_ocl_rows_by16(src, hd)) {
        for (int e = get_local_id(0); e < nrows / 2 * (D / 8); e += FP_OCL_WG) {
            const int i = e / (D / 8), d = (e - i * (D / 8)) * 8;
            const uint4 x0 = fp_ocl_get16(x, a, src, r0, 2 * i, n, d, hd, scrub, bad + 2 * i);
            const uint4 x1 =
                fp_ocl_get16(x, a, src, r0, 2 * i + 1, n, d, hd, scrub, bad + 2 * i + 1);
            if (rowmajor) {
                *(__local uint4 *)(t + 2 * i * LD + d) = x0;
                *(__local uint4 *)(t + (2 * i + 1) * LD + d) = x1;
            }
            __local uint4 *p = (__local uint4 *)(tp + i * LDP + d);
            p[0] = (uint4)(fp_ocl_pair_lo(x0.x, x1.x), fp_ocl_pair_hi(x0.x, x1.x),
                           fp_ocl_pair_lo(x0.y, x1.y), fp_ocl_pair_hi(x0.y, x1.y));
            p[1] = (uint4)(fp_ocl_pair_lo(x0.z, x1.z), fp_ocl_pair_hi(x0.z, x1.z),
                           fp_ocl_pair_lo(x0.w, x1.w), fp_ocl_pair_hi(x0.w, x1.w));
        }
        return;
    }
    for (int e = get_local_id(0); e < nrows * D; e += FP_OCL_WG) {
        const int r = e / D, d = e - r * D;
        const fp_tile v = fp_ocl_get1(x, a, src, r0, r, n, d, hd, scrub, bad + r);
        if (rowmajor)
            t[r * LD + d] = v;
        ((__local fp_tile *)tp)[2 * ((r / 2) * LDP + d) + r % 2] = v;
    }
}

/* The B fragment (16 x 8, B[k][n] = dim n of row k) of this lane from a row-pair tile, p at the
 * word of rows k0, k0 + 1 and dim n0: register i holds rows 2 t + 8 i + {0, 1} of dim g, one word
 * (LDP = 8 mod 32 words for D >= 32, 24 for D = 16: the 32 lanes hit 32 banks). */
FP_OCL_INLINE void fp_ocl_fa2_load_b_pairs(uint b[2], __local const uint *p)
{
    const int lane = get_local_id(0) % 32, g = lane / 4, t = lane % 4;
    b[0] = p[t * LDP + g];
    b[1] = p[(t + 4) * LDP + g];
}

/* The backward's fast path (FP_OCL_BWD_FAST = 1, the default; FLASHPORT_OPENCL_BWD_FAST=0
 * builds without it): in a full block (every pair of its rows and keys visible, no row or key
 * past the sequence) with no softcap and no ALiBi, P = 2^(qk scale log2(e) - lse log2(e)) by the
 * device's fast exp2 (fp_ocl_exp2_fast: ex2.approx, about 2 ulp; P is rounded to the 16-bit
 * storage type before any product takes it), with scale log2(e) folded once a kernel and
 * lse log2(e) once a row (fp_ocl_fa2_lse2), and none of fp_ocl_fa2_grad's per-pair tests: the
 * mask holds for every pair of the block, the score needs no transform, and a row whose lse is
 * -inf or NaN (it saw no key, or a NaN) gets lse2 = +inf, so its P is exp2(-inf) = 0 for every
 * finite score, as the exact path's test gives. The masked-key guard has nothing to do in such a
 * block (no key is masked, no copy is scrubbed there) but for the one-kernel backward's key copy
 * for dS K, always scrubbed: its flagged keys still give dS = NaN (the callers). */
#define FA2_FAST_LOG2E 1.44269504088896340736f

FP_OCL_INLINE float fp_ocl_fa2_lse2(float lse)
{
    return lse > -INFINITY ? lse * FA2_FAST_LOG2E : INFINITY;
}

/* 2^x by the hardware's approximation: ex2.approx.ftz.f32 through inline PTX (what NVIDIA's
 * compiler gives native_exp2; written out so that the PTX check, clang with libclc, which has
 * no native_exp2 for nvptx, compiles the same instruction), or native_exp2 on the emulation's
 * devices. 2^-inf = +0. */
FP_OCL_INLINE float fp_ocl_exp2_fast(float x)
{
#if FP_OCL_MMA_EMULATE
    return native_exp2(x);
#else
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#endif
}

/* P and dS of one pair on the fast path: sl2 = scale log2(e), lse2 = fp_ocl_fa2_lse2(lse). */
FP_OCL_INLINE void fp_ocl_fa2_grad_fast(float qk, float dov, float sl2, float lse2, float delta_i,
                                        float scale, float *p, float *ds)
{
    const float pp = fp_ocl_exp2_fast(fma(qk, sl2, -lse2));
    *p = pp;
    *ds = pp * (dov - delta_i) * scale;
}

/* P and dS of query i and key j from q . k (qk) and dO . v (dov): 0 where the pair is not
 * inside the tiles or the mask hides it, or the row saw no key (lse -inf); dS folds in the
 * softcap's derivative and the scale (flash.cl's fp_ocl_grad_scores). simple: the caller knows
 * the pair visible with no ALiBi (a full block). */
FP_OCL_INLINE void fp_ocl_fa2_grad(const fp_ocl_args *a, const fp_ocl_seq *s, float slope,
                                   int simple, long i, long j, int inside, float qk, float dov,
                                   float lse_i, float delta_i, float *p, float *ds)
{
    float pp = 0.0f, dd = 0.0f;
    if (inside && (simple || fp_mask_visible(i, j, s->nq, s->nk, a->left, a->right)) &&
        lse_i > -INFINITY) {
        const float capped = fp_score_transform(qk * a->scale, a->softcap, 0.0f, 0.0f);
        const float score =
            simple ? capped : capped - slope * fp_alibi_distance(i, j, s->nq, s->nk);
        pp = exp(score - lse_i);
        dd = pp * (dov - delta_i) * fp_softcap_grad(capped, a->softcap) * a->scale;
    }
    *p = pp;
    *ds = dd;
}

/* The m16n8k16 A fragments of ks k-steps of the 16 rows of this warp (rows 16 w ..) of a
 * [64, D] 16-bit matrix, into f[4 ks ..], from a local tile holding all its rows or, where
 * FA2_WIDE, its rows r0 onwards (r0 <= 16 w, the warp's rows inside the tile). */
#if FA2_WIDE
FP_OCL_INLINE void fp_ocl_fa2_frags(uint *f, __local const fp_tile *t, int r0)
#else
FP_OCL_INLINE void fp_ocl_fa2_frags(uint *f, __local const fp_tile *t)
#endif
{
    const int w = get_local_id(0) / 32;
    FP_OCL_UNROLL
    for (int ks = 0; ks < FA2_KS; ks++)
#if FA2_WIDE
        fp_ocl_load_a(f + 4 * ks, t, 1, (16 * w - r0) * LD + 16 * ks, LD, 1);
#else
        fp_ocl_load_a(f + 4 * ks, t, 1, 16 * w * LD + 16 * ks, LD, 1);
#endif
}

/* The backward's (head-dim classes up to FP_OCL_FA2_BWD_D, as below) */
#if D <= FP_OCL_FA2_BWD_D

/* Rows [r0, r0 + n) of x1, then of x2, through the staging tile as this warp's A fragments f1
 * and f2 (three barriers; the staging tile then holds x2's rows); flags[0 .. nflags) zeroed on
 * the way. */
FP_OCL_INLINE void fp_ocl_fa2_stage2(uint *f1, uint *f2, __local fp_tile *stage,
                                     const fp_ocl_args *a, __global const fp_elem *x1,
                                     const fp_ocl_rows *src1, __global const fp_elem *x2,
                                     const fp_ocl_rows *src2, long r0, int n, int hd,
                                     __local float *flags, int nflags)
{
    fp_ocl_load_rows(stage, T, x1, a, src1, r0, n, hd, 0, flags, 1);
    barrier(CLK_LOCAL_MEM_FENCE);
    fp_ocl_fa2_frags(f1, stage);
    barrier(CLK_LOCAL_MEM_FENCE);
    fp_ocl_load_rows(stage, T, x2, a, src2, r0, n, hd, 0, flags, 1);
    if (get_local_id(0) < nflags)
        flags[get_local_id(0)] = 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    fp_ocl_fa2_frags(f2, stage);
}
#endif

/* Stores this warp's 16 x D accumulator or, where FA2_WIDE, its 16 x (8 nt) one of dims d0 ..
 * (C fragments; rows r_lo and r_lo + 8 of the tile, r_lo = 16 w + lane / 4) times f0 / f1 to x
 * (row0: the element of tile row 0, dim 0), rows < n and dims < hd. */
#if FA2_WIDE
FP_OCL_INLINE void fp_ocl_fa2_store(__global fp_elem *x, long row0, long srow, long sdim, int n,
                                    int hd, const float *acc, int nt, int d0, float f0, float f1)
#else
FP_OCL_INLINE void fp_ocl_fa2_store(__global fp_elem *x, long row0, long srow, long sdim, int n,
                                    int hd, const float *acc, float f0, float f1)
#endif
{
    const int lane = get_local_id(0) % 32, t4 = lane % 4;
    const int r_lo = 16 * (get_local_id(0) / 32) + lane / 4;
    FP_OCL_UNROLL
#if FA2_WIDE
    for (int j = 0; j < nt; j++)
#else
    for (int j = 0; j < FA2_ON; j++)
#endif
        FP_OCL_UNROLL
        for (int e = 0; e < 4; e++) {
#if FA2_WIDE
            const int r = r_lo + 8 * (e / 2), d = d0 + 8 * j + 2 * t4 + e % 2;
#else
            const int r = r_lo + 8 * (e / 2), d = 8 * j + 2 * t4 + e % 2;
#endif
            if (r < n && d < hd)
                FP_STORE(x, row0 + r * srow + d * sdim, acc[4 * j + e] * (e < 2 ? f0 : f1));
        }
}

/* acc (16 rows x D of this warp) += X Y, X the 16 x (16 nk) matrix whose C fragments (m16n8,
 * 2 nk of them) are x, rounded to the storage type (so they are its A fragments as they stand),
 * Y[k][n] = dim n of row k of a local tile of 16-bit rows: row-major (y[k * LD + n], two 16-bit
 * loads per B register) or, where pairs, a row-pair tile (fp_ocl_fa2_load_pairs: one load). */
FP_OCL_INLINE void fp_ocl_fa2_cmm(float *acc, const float *x, int nk, __local const void *y,
                                  int pairs, __local float *scratch)
{
    FP_OCL_UNROLL
    for (int kk = 0; kk < nk; kk++) {
        uint pa[4];
        pa[0] = fp_ocl_pack2(x[8 * kk + 0], x[8 * kk + 1]);
        pa[1] = fp_ocl_pack2(x[8 * kk + 2], x[8 * kk + 3]);
        pa[2] = fp_ocl_pack2(x[8 * kk + 4], x[8 * kk + 5]);
        pa[3] = fp_ocl_pack2(x[8 * kk + 6], x[8 * kk + 7]);
        FP_OCL_UNROLL
        for (int n = 0; n < FA2_ON; n++) {
            uint yb[2];
            if (pairs)
                fp_ocl_fa2_load_b_pairs(yb, (__local const uint *)y + 8 * kk * LDP + 8 * n);
            else
                fp_ocl_load_b(yb, (__local const fp_tile *)y + 16 * kk * LD + 8 * n, LD, 1);
            fp_ocl_mma16816(acc + 4 * n, pa, yb, scratch);
        }
    }
}

/* acc (16 x 8 NT of this warp) = X Y^T over D: X's A fragments xf (fp_ocl_fa2_frags), Y the
 * 8 NT rows of a [., D] 16-bit local tile. A function per NT (a compile-time count, so that
 * clang unrolls the loops and acc stays in registers). */
#define FP_OCL_FA2_DOTS(name, NT)                                                                  \
    FP_OCL_INLINE void name(float *acc, const uint *xf, __local const fp_tile *y,                 \
                            __local float *scratch)                                                \
    {                                                                                              \
        FP_OCL_UNROLL                                                                              \
        for (int e = 0; e < 4 * (NT); e++)                                                         \
            acc[e] = 0.0f;                                                                         \
        FP_OCL_UNROLL                                                                              \
        for (int ks = 0; ks < FA2_KS; ks++)                                                        \
            FP_OCL_UNROLL                                                                          \
            for (int j = 0; j < (NT); j++) {                                                       \
                uint yb[2];                                                                        \
                fp_ocl_load_b(yb, y + 8 * j * LD + 16 * ks, 1, LD);                                \
                fp_ocl_mma16816(acc + 4 * j, xf + 4 * ks, yb, scratch);                            \
            }                                                                                      \
    }
FP_OCL_FA2_DOTS(fp_ocl_fa2_dots_bk, FP_OCL_FA2_BK / 8)
FP_OCL_FA2_DOTS(fp_ocl_fa2_dots_bq, FP_OCL_BQ / 8)

__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_forward(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
               __global const fp_elem *v, __global fp_elem *o, __global float *lse,
               __global const int *cu_q, __global const int *cu_k, __global const float *alibi,
               __global const int *used, __global const int *bt, __local fp_tile *sk_arg,
               __local fp_tile *svt_arg, __local float *sbad_arg FP_OCL_SCRATCH_PARAM)
{
    __local fp_tile *sk = FP_OCL_ALIGN16(fp_tile, sk_arg), *svt = FP_OCL_ALIGN16(fp_tile, svt_arg);
    __local float *sbad = FP_OCL_ALIGN16(float, sbad_arg); /* [2][FA2_FK]: key flags, by parity */
#if !FP_OCL_MMA_EMULATE
    __local float scratch[FP_OCL_SCRATCH];
#endif
    FP_OCL_QUERY_BLOCK(&a);
    const long hk = h / (a.heads / a.kv_heads);
    const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
    const fp_ocl_rows qr = fp_ocl_dense_rows(fp_ocl_row0(a.q, b, s.q_start, h), a.q.s[1], a.q.s[3]);
    const fp_ocl_rows kr = fp_ocl_key_rows(&a, a.k, bt, &s, b, hk);
    const fp_ocl_rows vr = fp_ocl_key_rows(&a, a.v, bt, &s, b, hk);
    const int lane = tid % 32, t4 = lane % 4;
    const int r_lo = 16 * (tid / 32) + lane / 4; /* this lane's rows: r_lo and r_lo + 8 */

#if FA2_WIDE
    /* Q through K's buffer into this warp's A fragments, FA2_FK rows at a time (the warps whose
     * rows the buffer holds take theirs) */
    uint qf[FA2_KS * 4];
    FP_OCL_UNROLL
    for (int r0 = 0; r0 < T; r0 += FA2_FK) {
        fp_ocl_load_rows(sk, FA2_FK, q, &a, &qr, i0 + r0, rows - r0, hd, 0, sbad, 1);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (16 * (tid / 32) - r0 >= 0 && 16 * (tid / 32) - r0 < FA2_FK)
            fp_ocl_fa2_frags(qf, sk, r0);
        barrier(CLK_LOCAL_MEM_FENCE); /* the rows' readers are done */
    }
    /* O FA2_OD dims at a time, each a pass over the key blocks: a loop, written as a label and
     * gotos so that the code of a pass below is also, as it stands, the whole forward of the
     * classes up to 128 */
    int d0 = 0;
pass:
    if (d0 >= D)
        goto done;
    barrier(CLK_LOCAL_MEM_FENCE); /* the last pass's readers of sbad are done */
    if (tid < 2 * FA2_FK)
        sbad[tid] = 0.0f;
#else
    /* Q through K's buffer into this warp's A fragments */
    fp_ocl_load_rows(sk, T, q, &a, &qr, i0, rows, hd, 0, sbad, 1);
    if (tid < 2 * T)
        sbad[tid] = 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    uint qf[FA2_KS * 4];
    fp_ocl_fa2_frags(qf, sk);
#endif

    /* rows r_lo (0) and r_lo + 8 (1): the softmax state, l this lane's share until the end;
     * whether the row sees a key whose V row was scrubbed (O = NaN) */
    fp_softmax_state st0, st1;
    fp_softmax_init(&st0);
    fp_softmax_init(&st1);
    int nan0 = 0, nan1 = 0;
    float acc[FA2_OP * 4];
    FP_OCL_UNROLL
    for (int n = 0; n < FA2_OP; n++)
        acc[4 * n + 0] = acc[4 * n + 1] = acc[4 * n + 2] = acc[4 * n + 3] = 0.0f;

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
    for (long j0 = lo < hi ? lo / FA2_FK * FA2_FK : hi; j0 < hi; j0 += FA2_FK) {
        const int par = (int)(j0 / FA2_FK) & 1; /* which half of sbad holds this block's flags */
        const int cols = (int)min((long)FA2_FK, s.nk - j0);
        const int edge =
            !fp_mask_block_full(i0, i0 + rows, j0, j0 + cols, s.nq, s.nk, a.left, a.right);
        __local float *bad = sbad + par * FA2_FK;
        barrier(CLK_LOCAL_MEM_FENCE); /* every reader of sk (Q, the last K) and svt is done */
        fp_ocl_load_rows(sk, FA2_FK, k, &a, &kr, j0, cols, hd, 0, sbad, 1);
#if FA2_WIDE
        fp_ocl_load_vt(svt, v, &a, &vr, j0, cols, hd, d0, edge, bad);
#else
        fp_ocl_load_vt(svt, v, &a, &vr, j0, cols, hd, edge, bad);
#endif
        if (tid < FA2_FK) /* the other parity: read in the block before, written in the next one */
            sbad[(par ^ 1) * FA2_FK + tid] = 0.0f;
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
        const int simple = !edge && cols == FA2_FK && !a.paged && !a.has_alibi && a.softcap == 0.0f;
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
            nan0 |= fp_ocl_sees_bad(&a, &s, i0 + r_lo, j0, cols, bad, 1, 0);
            nan1 |= fp_ocl_sees_bad(&a, &s, i0 + r_lo + 8, j0, cols, bad, 1, 0);
        }

        FP_OCL_UNROLL
        for (int n = 0; n < FA2_OP; n++) {
            acc[4 * n + 0] *= alpha[0];
            acc[4 * n + 1] *= alpha[0];
            acc[4 * n + 2] *= alpha[1];
            acc[4 * n + 3] *= alpha[1];
        }
        FP_OCL_UNROLL
        for (int kk = 0; kk < FA2_FK / 16; kk++) {
            uint pa[4];
            pa[0] = fp_ocl_pack2(sc[4 * (2 * kk) + 0], sc[4 * (2 * kk) + 1]);
            pa[1] = fp_ocl_pack2(sc[4 * (2 * kk) + 2], sc[4 * (2 * kk) + 3]);
            pa[2] = fp_ocl_pack2(sc[4 * (2 * kk + 1) + 0], sc[4 * (2 * kk + 1) + 1]);
            pa[3] = fp_ocl_pack2(sc[4 * (2 * kk + 1) + 2], sc[4 * (2 * kk + 1) + 3]);
            FP_OCL_UNROLL
            for (int n = 0; n < FA2_OP; n++) {
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
    const float f0 = nan0 ? NAN : fp_softmax_out_scale(&st0);
    const float f1 = nan1 ? NAN : fp_softmax_out_scale(&st1);
#if FA2_WIDE
    if (a.has_lse && d0 == 0 && t4 == 0 && r_lo < rows)
        lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + r_lo)] = fp_softmax_lse(&st0);
    if (a.has_lse && d0 == 0 && t4 == 0 && r_lo + 8 < rows)
        lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + r_lo + 8)] = fp_softmax_lse(&st1);
    fp_ocl_fa2_store(o, fp_ocl_row0(a.o, b, s.q_start + i0, h), a.o.s[1], a.o.s[3], rows, hd, acc,
                     FA2_OP, d0, f0, f1);
    d0 += FA2_OD;
    goto pass;
done:;
#else
    if (a.has_lse && t4 == 0 && r_lo < rows)
        lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + r_lo)] = fp_softmax_lse(&st0);
    if (a.has_lse && t4 == 0 && r_lo + 8 < rows)
        lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + r_lo + 8)] = fp_softmax_lse(&st1);
    fp_ocl_fa2_store(o, fp_ocl_row0(a.o, b, s.q_start + i0, h), a.o.s[1], a.o.s[3], rows, hd, acc,
                     f0, f1);
#endif
}

/* The backward's kernels: the two-kernel form (dQ; dK / dV) at head-dim classes up to
 * FP_OCL_FA2_BWD_D (ocl_args.h), the one-kernel form (preparation, fused kernel, dQ's conversion)
 * at every class; above FP_OCL_FA2_BWD_D (FA2_WIDE) the tile-shaped program serves the
 * two-kernel form (deterministic calls), and the fused kernel is a wide one of its own. */
#define FA2_BK FP_OCL_FA2_BK /* keys per block of the dQ kernel */
#define FA2_BQ FP_OCL_BQ     /* query rows per block of the dK / dV and fused kernels */
#if FA2_BQ != 16 && !(FA2_BQ == 32 && D <= 64)
#error "the backward's query blocks have 16 rows, or 32 up to head-dim class 64 (ocl_args.h)"
#endif
/* keys a work-group of the one-kernel backward owns (ocl_args.h's FP_OCL_FA2_WK: T up to class
 * 128) */
#if FA2_WIDE
#define FA2_WK FP_OCL_FA2_WK(D)
#else
#define FA2_WK T
#endif

#if !FA2_WIDE

/* dQ of 64 query rows (4 warps of 16; also delta = rowsum(dO O) of the rows, for the dK / dV
 * kernel): Q's and dO's A fragments in registers, key blocks of FA2_BK keys (K and V side by side
 * in the staging tile), S and dP as C fragments, dS rounded into the A fragments of dS K. The
 * guard: K scrubbed in edge blocks, a visible pair of a flagged key gets dS = NaN. */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_dq(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
                   __global const fp_elem *v, __global const fp_elem *o, __global const float *lse,
                   __global const fp_elem *dout, __global fp_elem *dq, __global float *delta,
                   __global const int *cu_q, __global const int *cu_k, __global const float *alibi,
                   __global const int *used, __local fp_tile *stage_arg, __local float *srow_arg,
                   __local float *sbad_arg FP_OCL_SCRATCH_PARAM)
{
    __local fp_tile *stage = FP_OCL_ALIGN16(fp_tile, stage_arg);
    __local float *srow = FP_OCL_ALIGN16(float, srow_arg);
    __local float *sbad = FP_OCL_ALIGN16(float, sbad_arg); /* [2][FA2_BK], by block parity */
#if !FP_OCL_MMA_EMULATE
    __local float scratch[FP_OCL_SCRATCH];
#endif
    FP_OCL_QUERY_BLOCK(&a);
    const long hk = h / (a.heads / a.kv_heads);
    const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
    const fp_ocl_rows kr = fp_ocl_dense_keys(a.k, &s, b, hk);
    const fp_ocl_rows vr = fp_ocl_dense_keys(a.v, &s, b, hk);
    const fp_ocl_rows qr = fp_ocl_dense_rows(fp_ocl_row0(a.q, b, s.q_start, h), a.q.s[1], a.q.s[3]);
    const fp_ocl_rows dor =
        fp_ocl_dense_rows(fp_ocl_row0(a.dout, b, s.q_start, h), a.dout.s[1], a.dout.s[3]);
    const int lane = tid % 32, t4 = lane % 4;
    const int r_lo = 16 * (tid / 32) + lane / 4; /* this lane's rows: r_lo and r_lo + 8 */
    __local fp_tile *sk = stage, *sv = stage + FA2_BK * LD;

    uint qf[FA2_KS * 4], dof[FA2_KS * 4];
    fp_ocl_fa2_stage2(qf, dof, stage, &a, q, &qr, dout, &dor, i0, rows, hd, sbad, 2 * FA2_BK);
    if (tid < T) { /* dO's rows are in the staging tile */
        float dl = 0.0f;
        if (tid < rows) {
            const long o0 = fp_ocl_row0(a.o, b, s.q_start + i0 + tid, h);
            for (int d = 0; d < hd; d++)
                dl = fma(FP_TILE_GET(stage, tid * LD + d), FP_LOAD(o, o0 + d * a.o.s[3]), dl);
            delta[fp_ocl_delta_at(&a, &s, b, h, i0 + tid)] = dl;
        }
        srow[tid] = dl;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const float dl0 = srow[r_lo], dl1 = srow[r_lo + 8];
    const float lse0 = r_lo < rows ? lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + r_lo)] : -INFINITY;
    const float lse1 =
        r_lo + 8 < rows ? lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + r_lo + 8)] : -INFINITY;
    /* the fast path's (its rows past the sequence: lse -inf, so P = 0 on their zero scores) */
    const float sl2 = a.scale * FA2_FAST_LOG2E;
    const float l2_0 = fp_ocl_fa2_lse2(lse0), l2_1 = fp_ocl_fa2_lse2(lse1);
    float acc[FA2_ON * 4];
    FP_OCL_UNROLL
    for (int e = 0; e < FA2_ON * 4; e++)
        acc[e] = 0.0f;

    int64_t lo, hi;
    fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
    for (long j0 = lo < hi ? lo / FA2_BK * FA2_BK : hi; j0 < hi; j0 += FA2_BK) {
        const int par = (int)(j0 / FA2_BK) & 1; /* which half of sbad holds this block's flags */
        const int cols = (int)min((long)FA2_BK, s.nk - j0);
        const int edge =
            !fp_mask_block_full(i0, i0 + rows, j0, j0 + cols, s.nq, s.nk, a.left, a.right);
        __local float *bad = sbad + par * FA2_BK;
        barrier(CLK_LOCAL_MEM_FENCE); /* every reader of the staging tile is done */
        fp_ocl_load_rows(sk, FA2_BK, k, &a, &kr, j0, cols, hd, edge, bad, 1);
        fp_ocl_load_rows(sv, FA2_BK, v, &a, &vr, j0, cols, hd, 0, bad, 1);
        if (tid < FA2_BK) /* the other parity: read in the block before, written in the next */
            sbad[(par ^ 1) * FA2_BK + tid] = 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        float sc[FA2_BK / 2], dp[FA2_BK / 2]; /* 16 x FA2_BK: FA2_BK / 8 C fragments each */
        fp_ocl_fa2_dots_bk(sc, qf, sk, scratch);
        fp_ocl_fa2_dots_bk(dp, dof, sv, scratch);
        const int simple = !edge && cols == FA2_BK && !a.has_alibi;
        if (FP_OCL_BWD_FAST && simple && a.softcap == 0.0f) {
            FP_OCL_UNROLL
            for (int j = 0; j < FA2_BK / 8; j++)
                FP_OCL_UNROLL
                for (int e = 0; e < 4; e++) {
                    float p;
                    fp_ocl_fa2_grad_fast(sc[4 * j + e], dp[4 * j + e], sl2, e < 2 ? l2_0 : l2_1,
                                         e < 2 ? dl0 : dl1, a.scale, &p, &sc[4 * j + e]);
                }
        } else {
            FP_OCL_UNROLL
            for (int j = 0; j < FA2_BK / 8; j++)
                FP_OCL_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int r = r_lo + 8 * (e / 2), c = 8 * j + 2 * t4 + e % 2;
                    float p, ds;
                    fp_ocl_fa2_grad(&a, &s, slope, simple, i0 + r, j0 + c, r < rows && c < cols,
                                    sc[4 * j + e], dp[4 * j + e], e < 2 ? lse0 : lse1,
                                    e < 2 ? dl0 : dl1, &p, &ds);
                    if (edge && r < rows && c < cols && bad[c] != 0.0f &&
                        fp_mask_visible(i0 + r, j0 + c, s.nq, s.nk, a.left, a.right))
                        ds = NAN;
                    sc[4 * j + e] = ds;
                }
        }
        fp_ocl_fa2_cmm(acc, sc, FA2_BK / 16, sk, 0, scratch);
    }
    fp_ocl_fa2_store(dq, fp_ocl_row0(a.dq, b, s.q_start + i0, h), a.dq.s[1], a.dq.s[3], rows, hd,
                     acc, 1.0f, 1.0f);
}
#endif

/* p[0] += x for every caller at once: `red.global.add.f32` (a reduction, its result unused), or
 * on the emulation's devices a compare-and-swap loop on the float's bits (OpenCL 1.2 has no float
 * atomic add). The order of the adds is the hardware's, so sums of several adds are not bitwise
 * repeatable (the fused backward is never the deterministic one). */
FP_OCL_INLINE void fp_ocl_atomic_addf(__global float *p, float x)
{
#if FP_OCL_MMA_EMULATE
    volatile __global uint *u = (volatile __global uint *)p;
    uint old = *u, seen;
    while ((seen = atomic_cmpxchg(u, old, as_uint(as_float(old) + x))) != old)
        old = seen;
#else
    asm volatile("red.global.add.f32 [%0], %1;" : : "l"(p), "f"(x) : "memory");
#endif
}

/* p[0 .. 3] += v (p 16-byte aligned) for every caller at once: one vector reduction,
 * `red.global.add.v4.f32`, where FP_OCL_RED_VEC (devices of compute capability >= 9.0, whose L2
 * reduces four floats in one operation: a quarter of the operations of dQ's accumulation), else
 * four fp_ocl_atomic_addf */
FP_OCL_INLINE void fp_ocl_atomic_add4f(__global float *p, float4 v)
{
#if FP_OCL_RED_VEC && !FP_OCL_MMA_EMULATE
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
#else
    fp_ocl_atomic_addf(p, v.x);
    fp_ocl_atomic_addf(p + 1, v.y);
    fp_ocl_atomic_addf(p + 2, v.z);
    fp_ocl_atomic_addf(p + 3, v.w);
#endif
}

/* Whether fp_ocl_fa2_dq_add adds runs of four dims (fp_ocl_atomic_add4f) */
#define FA2_DQ_QUADS (FP_OCL_RED_VEC || FP_OCL_MMA_EMULATE)

/* The element of (b, h, row i of sequence b), dim 0, in the fused backward's dQ accumulator:
 * [H, total_q, head_dim] f32, rows as the delta's. */
FP_OCL_INLINE long fp_ocl_acc_row(const fp_ocl_args *a, const fp_ocl_seq *s, long b, long h, long i)
{
    return a->dq_acc_off + (fp_ocl_delta_at(a, s, b, h, i) - a->delta_off) * a->head_dim;
}

/* The fast path's per-row values of this lane's query rows 8 j + 2 t4 + u (the columns of its C
 * fragments of S^T and dP^T) in the dK / dV and fused kernels: l2[2 j + u] = fp_ocl_fa2_lse2 of
 * the row's LSE, dl[2 j + u] its delta, from srow (LSE [FA2_BQ], delta [FA2_BQ]). */
FP_OCL_INLINE void fp_ocl_fa2_fast_rows(float *l2, float *dl, __local const float *srow)
{
    const int t4 = get_local_id(0) % 4;
    FP_OCL_UNROLL
    for (int j = 0; j < FA2_BQ / 8; j++)
        FP_OCL_UNROLL
        for (int u = 0; u < 2; u++) {
            l2[2 * j + u] = fp_ocl_fa2_lse2(srow[8 * j + 2 * t4 + u]);
            dl[2 * j + u] = srow[FA2_BQ + 8 * j + 2 * t4 + u];
        }
}

#if FA2_WIDE
/* column tiles of dQ's D per warp and call of fp_ocl_fa2_dq_add in the fused backward: two, in
 * FA2_QP calls (all of them at once would pass 255 registers beside the kernel's accumulators) */
#define FA2_QN 2
#define FA2_QP ((FA2_ON + 4 * FA2_QN - 1) / (4 * FA2_QN))
#else
#define FA2_QN  ((FA2_ON + 3) / 4) /* column tiles of dQ's D per warp in the fused backward */
#endif
#define FA2_LDS (FA2_WK + 8) /* pitch of its dS tile (16-bit, [FA2_BQ queries, FA2_WK keys]) */

/* The one-kernel backward's dQ of query block i0 (rows rows, head h): dS K from sds ([FA2_BQ,
 * FA2_WK + 8] 16-bit, dS rounded; FA2_BQ / 16 strips of 16 rows) and skt (the keys as a row-pair
 * tile), added to the f32 accumulator dq_acc ([H, total_q, head_dim], laid out as the delta) by
 * atomic adds; warp w owns dQ's column tiles w, w + 4, ... (warps past D's tiles compute on a
 * clamped copy and drop it, so that every warp runs the same instructions, as the emulation's
 * barriers need); where FA2_WIDE, the tiles of call `part` of FA2_QP, 4 FA2_QN part + w, + 4, ...
 * sds must be whole (a barrier after its writes). */
#if FA2_WIDE
FP_OCL_INLINE void fp_ocl_fa2_dq_add(const fp_ocl_args *a, const fp_ocl_seq *s, long b, long h,
                                     long i0, int rows, int hd, __local const fp_tile *sds,
                                     __local const uint *skt, __global float *dq_acc,
                                     __local float *scratch, int part)
{
    const int lane = get_local_id(0) % 32, t4 = lane % 4,
              w = get_local_id(0) / 32 + 4 * FA2_QN * part;
#else
FP_OCL_INLINE void fp_ocl_fa2_dq_add(const fp_ocl_args *a, const fp_ocl_seq *s, long b, long h,
                                     long i0, int rows, int hd, __local const fp_tile *sds,
                                     __local const uint *skt, __global float *dq_acc,
                                     __local float *scratch)
{
    const int lane = get_local_id(0) % 32, t4 = lane % 4, w = get_local_id(0) / 32;
#endif
    /* the block's FA2_BQ / 16 strips of 16 rows (m), each K fragment taken by all of them */
    float dqa[FA2_BQ / 16 * FA2_QN * 4];
    FP_OCL_UNROLL
    for (int e = 0; e < FA2_BQ / 16 * FA2_QN * 4; e++)
        dqa[e] = 0.0f;
    FP_OCL_UNROLL
    for (int kk = 0; kk < FA2_WK / 16; kk++) {
        uint pa[FA2_BQ / 16 * 4];
        FP_OCL_UNROLL
        for (int m = 0; m < FA2_BQ / 16; m++)
            fp_ocl_load_a(pa + 4 * m, sds, 1, 16 * m * FA2_LDS + 16 * kk, FA2_LDS, 1);
        FP_OCL_UNROLL
        for (int nn = 0; nn < FA2_QN; nn++) {
            const int n = min(w + 4 * nn, FA2_ON - 1);
            uint yb[2];
            fp_ocl_fa2_load_b_pairs(yb, skt + 8 * kk * LDP + 8 * n);
            FP_OCL_UNROLL
            for (int m = 0; m < FA2_BQ / 16; m++)
                fp_ocl_mma16816(dqa + 4 * (m * FA2_QN + nn), pa + 4 * m, yb, scratch);
        }
    }
    /* A lane's C fragment holds dims 2 t4, + 1 of rows lane / 4 and + 8. With vector reductions
     * (and in the emulation, which tests that code), where every run of four dims is whole and
     * 16-byte aligned (hd % 4 == 0), lanes t4 and t4 ^ 1 swap halves so that the even one holds
     * four dims of the first row, the odd one four of the second, and each adds them by one
     * fp_ocl_atomic_add4f; else one fp_ocl_atomic_addf a float (scalar reductions of a warp
     * spread over 8 rows, not 16 as a run of four's would). */
    const bool quads = FA2_DQ_QUADS && hd % 4 == 0 && a->dq_acc_off % 4 == 0;
    const int odd = t4 & 1;
    FP_OCL_UNROLL
    for (int m = 0; m < FA2_BQ / 16; m++)
        FP_OCL_UNROLL
        for (int nn = 0; nn < FA2_QN; nn++) {
            const float *c = dqa + 4 * (m * FA2_QN + nn);
            const bool tile = w + 4 * nn < FA2_ON;
#if FA2_DQ_QUADS
            /* every work-item shuffles (the emulation's barriers), whether or not it uses them */
            const float sx = fp_ocl_shfl_xor(odd ? c[0] : c[2], 1, scratch),
                        sy = fp_ocl_shfl_xor(odd ? c[1] : c[3], 1, scratch);
            if (quads) {
                const float4 v = odd ? (float4)(sx, sy, c[2], c[3]) : (float4)(c[0], c[1], sx, sy);
                const int r = 16 * m + lane / 4 + 8 * odd, d = 8 * (w + 4 * nn) + 2 * (t4 - odd);
                if (tile && r < rows && d < hd && any(v != (float4)(0.0f)))
                    fp_ocl_atomic_add4f(dq_acc + fp_ocl_acc_row(a, s, b, h, i0 + r) + d, v);
                continue;
            }
#endif
            FP_OCL_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = 16 * m + lane / 4 + 8 * (e / 2);
                const int d = 8 * (w + 4 * nn) + 2 * t4 + e % 2;
                if (tile && r < rows && d < hd && c[e] != 0.0f)
                    fp_ocl_atomic_addf(dq_acc + fp_ocl_acc_row(a, s, b, h, i0 + r) + d, c[e]);
            }
        }
}

#if !FA2_WIDE
/* dK and dV of 64 keys (4 warps of 16) over every query head of the kv head and every query
 * block of FA2_BQ rows that sees them: K's and V's A fragments in registers, S^T = K Q^T and
 * dP^T = V dO^T as C fragments (keys x queries), P^T and dS^T rounded into the A fragments of
 * P^T dO and dS^T Q (dO and q staged twice: row-major for the dots, as row-pair tiles for these
 * products, whose B registers are then one 32-bit load each, not two 16-bit ones). The guard: q
 * and dO scrubbed in edge blocks, a visible pair of a flagged query row gets P = dS = NaN.
 * fused (the one-kernel backward): also dQ of each query block, dS (rounded, transposed through
 * sds: [FA2_BQ, T + 8] 16-bit) times K (skt: the block's keys as a row-pair tile, scrubbed, their
 * flags in skbad; a visible pair of a flagged key gets dS = NaN there, as in the dQ kernel),
 * fp_ocl_fa2_dq_add, run after the next query block's first barrier (and once after the loop),
 * which then also stands for the barrier that makes sds whole: two barriers a query block. */
FP_OCL_INLINE void fp_ocl_fa2_dkdv(const fp_ocl_args *a, __global const fp_elem *q,
                                   __global const fp_elem *k, __global const fp_elem *v,
                                   __global const float *lse, __global const fp_elem *dout,
                                   __global fp_elem *dk, __global fp_elem *dv,
                                   __global const float *delta, __global const int *cu_q,
                                   __global const int *cu_k, __global const float *alibi,
                                   __global const int *used, __local fp_tile *stage,
                                   __local float *srow, __local float *sbad, __local float *scratch,
                                   int fused, __global float *dq_acc, __local uint *skt,
                                   __local fp_tile *sds, __local float *skbad)
{
    FP_OCL_KEY_BLOCK(a);
    const int lane = tid % 32, t4 = lane % 4, w = tid / 32;
    const int k_lo = 16 * w + lane / 4; /* this lane's keys: k_lo and k_lo + 8 */
    const float sl2 = a->scale * FA2_FAST_LOG2E; /* the fast path's */
    /* q and dO of a query block, row-major (FA2_BQ rows each), in the staging tile's first half
     * (ocl_plan.h sizes it for 4 FA2_BQ rows, or T where more) */
    __local fp_tile *sq = stage, *sdo = stage + FA2_BQ * LD;
    /* q and dO again as row-pair tiles (the B operands of dK += dS^T Q and dV += P^T dO), in the
     * staging tile's second half */
    __local uint *sqp = (__local uint *)(stage + 2 * FA2_BQ * LD), *sdop = sqp + FA2_BQ / 2 * LDP;

    if (fused) { /* K for dS K, scrubbed; stage2's barriers order it before its readers */
        if (tid < T)
            skbad[tid] = 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        fp_ocl_fa2_load_pairs(stage, 0, skt, T, k, a, &kr, j0, cols, hd, 1, skbad);
    }
    uint kf[FA2_KS * 4], vf[FA2_KS * 4];
    fp_ocl_fa2_stage2(kf, vf, stage, a, k, &kr, v, &vr, j0, cols, hd, sbad, 2 * FA2_BQ);
    float acc_k[FA2_ON * 4], acc_v[FA2_ON * 4]; /* rows: this warp's keys */
    FP_OCL_UNROLL
    for (int e = 0; e < FA2_ON * 4; e++)
        acc_k[e] = acc_v[e] = 0.0f;

    int it = 0; /* query blocks run: their parity picks the half of sbad */
    long dq_h = 0, dq_i0 = -1; /* fused: the query block whose dQ is still to be added */
    int dq_rows = 0;
    for (long h = hk * group; cols > 0 && h < (hk + 1) * group; h++) {
        const float slope = a->has_alibi ? alibi[a->alibi_off + h] : 0.0f;
        const fp_ocl_rows qr =
            fp_ocl_dense_rows(fp_ocl_row0(a->q, b, s.q_start, h), a->q.s[1], a->q.s[3]);
        const fp_ocl_rows dor =
            fp_ocl_dense_rows(fp_ocl_row0(a->dout, b, s.q_start, h), a->dout.s[1], a->dout.s[3]);
        for (long i0 = 0; i0 < s.nq; i0 += FA2_BQ) {
            const int rows = (int)min((long)FA2_BQ, s.nq - i0);
            int64_t lo, hi;
            fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a->left, a->right, &lo, &hi);
            if (hi <= lo || hi <= j0 || lo >= j0 + cols)
                continue; /* no row of this query block sees these keys */
            const int edge =
                !fp_mask_block_full(i0, i0 + rows, j0, j0 + cols, s.nq, s.nk, a->left, a->right);
            const int par = it++ & 1;
            __local float *bad = sbad + par * FA2_BQ;
            /* every reader of the staging tile and srow is done, every writer of sds */
            barrier(CLK_LOCAL_MEM_FENCE);
            if (fused && dq_i0 >= 0) /* the last block's dQ, before this block writes sds */
                fp_ocl_fa2_dq_add(a, &s, b, dq_h, dq_i0, dq_rows, hd, sds, skt, dq_acc, scratch);
            fp_ocl_fa2_load_pairs(sq, 1, sqp, FA2_BQ, q, a, &qr, i0, rows, hd, edge, bad);
            fp_ocl_fa2_load_pairs(sdo, 1, sdop, FA2_BQ, dout, a, &dor, i0, rows, hd, edge, bad);
            if (tid < FA2_BQ) {
                srow[tid] = tid < rows ? lse[fp_ocl_lse_at(a, b, h, s.q_start + i0 + tid)]
                                       : -INFINITY;
                srow[FA2_BQ + tid] =
                    tid < rows ? delta[fp_ocl_delta_at(a, &s, b, h, i0 + tid)] : 0.0f;
                sbad[(par ^ 1) * FA2_BQ + tid] = 0.0f; /* read before, written next */
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            float pt[FA2_BQ / 2], dst[FA2_BQ / 2]; /* 16 keys x FA2_BQ queries */
            fp_ocl_fa2_dots_bq(pt, kf, sq, scratch);
            fp_ocl_fa2_dots_bq(dst, vf, sdo, scratch);
            const int simple = !edge && cols == T && rows == FA2_BQ && !a->has_alibi;
            if (FP_OCL_BWD_FAST && simple && a->softcap == 0.0f) {
                float l2[FA2_BQ / 4], dl[FA2_BQ / 4]; /* this lane's query rows; its keys' flags */
                fp_ocl_fa2_fast_rows(l2, dl, srow);
                const int kbad0 = fused && skbad[k_lo] != 0.0f;
                const int kbad1 = fused && skbad[k_lo + 8] != 0.0f;
                FP_OCL_UNROLL
                for (int j = 0; j < FA2_BQ / 8; j++)
                    FP_OCL_UNROLL
                    for (int e = 0; e < 4; e++) {
                        const int kc = k_lo + 8 * (e / 2), c = 8 * j + 2 * t4 + e % 2;
                        fp_ocl_fa2_grad_fast(pt[4 * j + e], dst[4 * j + e], sl2, l2[2 * j + e % 2],
                                             dl[2 * j + e % 2], a->scale, &pt[4 * j + e],
                                             &dst[4 * j + e]);
                        if (fused)
                            sds[c * FA2_LDS + kc] = (fp_tile)fp_ocl_pack2(
                                (e < 2 ? kbad0 : kbad1) ? NAN : dst[4 * j + e], 0.0f);
                    }
            } else {
                FP_OCL_UNROLL
                for (int j = 0; j < FA2_BQ / 8; j++)
                    FP_OCL_UNROLL
                    for (int e = 0; e < 4; e++) {
                        const int kc = k_lo + 8 * (e / 2), c = 8 * j + 2 * t4 + e % 2;
                        const int inside = c < rows && kc < cols;
                        float p, ds;
                        fp_ocl_fa2_grad(a, &s, slope, simple, i0 + c, j0 + kc, inside,
                                        pt[4 * j + e], dst[4 * j + e], srow[c], srow[FA2_BQ + c],
                                        &p, &ds);
                        if (edge && inside && bad[c] != 0.0f &&
                            fp_mask_visible(i0 + c, j0 + kc, s.nq, s.nk, a->left, a->right))
                            p = ds = NAN;
                        pt[4 * j + e] = p;
                        dst[4 * j + e] = ds;
                        if (fused) {
                            const float dsq = inside && skbad[kc] != 0.0f &&
                                                      fp_mask_visible(i0 + c, j0 + kc, s.nq, s.nk,
                                                                      a->left, a->right)
                                                  ? NAN
                                                  : ds;
                            sds[c * FA2_LDS + kc] = (fp_tile)fp_ocl_pack2(dsq, 0.0f);
                        }
                    }
            }
            fp_ocl_fa2_cmm(acc_v, pt, FA2_BQ / 16, sdop, 1, scratch);
            fp_ocl_fa2_cmm(acc_k, dst, FA2_BQ / 16, sqp, 1, scratch);
            if (fused) { /* its dQ is added after the next block's first barrier */
                dq_h = h;
                dq_i0 = i0;
                dq_rows = rows;
            }
        }
    }
    if (fused && dq_i0 >= 0) {
        barrier(CLK_LOCAL_MEM_FENCE); /* sds is whole */
        fp_ocl_fa2_dq_add(a, &s, b, dq_h, dq_i0, dq_rows, hd, sds, skt, dq_acc, scratch);
    }
    fp_ocl_fa2_store(dk, fp_ocl_row0(a->dk, b, s.k_start + j0, hk), a->dk.s[1], a->dk.s[3], stored,
                     hd, acc_k, 1.0f, 1.0f);
    fp_ocl_fa2_store(dv, fp_ocl_row0(a->dv, b, s.k_start + j0, hk), a->dv.s[1], a->dv.s[3], stored,
                     hd, acc_v, 1.0f, 1.0f);
}

/* The two-kernel backward's dK / dV kernel (fp_ocl_fa2_dkdv without dQ). */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_dkdv(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
                     __global const fp_elem *v, __global const float *lse,
                     __global const fp_elem *dout, __global fp_elem *dk, __global fp_elem *dv,
                     __global const float *delta, __global const int *cu_q,
                     __global const int *cu_k, __global const float *alibi,
                     __global const int *used, __local fp_tile *stage_arg, __local float *srow_arg,
                     __local float *sbad_arg FP_OCL_SCRATCH_PARAM)
{
    __local fp_tile *stage = FP_OCL_ALIGN16(fp_tile, stage_arg);
    __local float *srow = FP_OCL_ALIGN16(float, srow_arg); /* LSE [FA2_BQ], delta [FA2_BQ] */
    __local float *sbad = FP_OCL_ALIGN16(float, sbad_arg); /* [2][FA2_BQ], by block parity */
#if !FP_OCL_MMA_EMULATE
    __local float scratch[FP_OCL_SCRATCH];
#endif
    /* the fused-only tiles are never touched: any local address stands for them */
    fp_ocl_fa2_dkdv(&a, q, k, v, lse, dout, dk, dv, delta, cu_q, cu_k, alibi, used, stage, srow,
                    sbad, scratch, 0, (__global float *)delta, (__local uint *)stage, stage, srow);
}

/* The one-kernel backward (the default where the call is not deterministic; FLASHPORT_OPENCL_BWD=
 * two gives the two kernels): dK, dV and dQ's f32 accumulator (fp_ocl_fa2_dkdv with fused), after
 * fp_ocl_backward_prep and before fp_ocl_backward_dq_out. */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_fused(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
                      __global const fp_elem *v, __global const float *lse,
                      __global const fp_elem *dout, __global fp_elem *dk, __global fp_elem *dv,
                      __global const float *delta, __global float *dq_acc,
                      __global const int *cu_q, __global const int *cu_k,
                      __global const float *alibi, __global const int *used,
                      __local fp_tile *stage_arg, __local float *srow_arg, __local float *sbad_arg,
                      __local uint *skt_arg, __local fp_tile *sds_arg,
                                         __local float *skbad_arg FP_OCL_SCRATCH_PARAM)
{
    __local fp_tile *stage = FP_OCL_ALIGN16(fp_tile, stage_arg);
    __local float *srow = FP_OCL_ALIGN16(float, srow_arg);
    __local float *sbad = FP_OCL_ALIGN16(float, sbad_arg);
    __local uint *skt = FP_OCL_ALIGN16(uint, skt_arg); /* [T / 2, LDP]: the keys, by row pairs */
    __local fp_tile *sds = FP_OCL_ALIGN16(fp_tile, sds_arg); /* [FA2_BQ, T + 8]: dS */
    __local float *skbad = FP_OCL_ALIGN16(float, skbad_arg); /* [T]: key flags */
#if !FP_OCL_MMA_EMULATE
    __local float scratch[FP_OCL_SCRATCH];
#endif
    fp_ocl_fa2_dkdv(&a, q, k, v, lse, dout, dk, dv, delta, cu_q, cu_k, alibi, used, stage, srow,
                    sbad, scratch, 1, dq_acc, skt, sds, skbad);
}

#else
/* The B fragment of a product over the dims (16 x 8, B[k][n] = dim k of row n) from a row-pair
 * tile (fp_ocl_fa2_load_pairs), p at the word of rows n0, n0 + 1 (n0 even) and dim k0: register
 * i holds dims 2 t + 8 i + {0, 1} of row n0 + g, the 16-bit halves of row n0 + g in two adjacent
 * words, one 64-bit load (rows g and g ^ 1 read the same words; LDP = 8 mod 32 words: the 16
 * distinct pairs of a load hit 32 banks). */
FP_OCL_INLINE void fp_ocl_fa2_load_b_rows(uint b[2], __local const uint *p)
{
    const int lane = get_local_id(0) % 32, g = lane / 4, t = lane % 4;
    FP_OCL_UNROLL
    for (int i = 0; i < 2; i++) {
        const uint2 x = *(__local const uint2 *)(p + g / 2 * LDP + 2 * t + 8 * i);
        b[i] = g % 2 ? fp_ocl_pair_hi(x.x, x.y) : fp_ocl_pair_lo(x.x, x.y);
    }
}

/* acc (16 keys x FA2_BQ queries of this warp) = X Y^T over D: X's A fragments xf, Y the FA2_BQ
 * rows of a row-pair tile (fp_ocl_fa2_load_b_rows). */
FP_OCL_INLINE void fp_ocl_fa2_dots_pairs(float *acc, const uint *xf, __local const uint *y,
                                         __local float *scratch)
{
    FP_OCL_UNROLL
    for (int e = 0; e < FA2_BQ / 2; e++)
        acc[e] = 0.0f;
    FP_OCL_UNROLL
    for (int ks = 0; ks < FA2_KS; ks++)
        FP_OCL_UNROLL
        for (int j = 0; j < FA2_BQ / 8; j++) {
            uint yb[2];
            fp_ocl_fa2_load_b_rows(yb, y + 4 * j * LDP + 16 * ks);
            fp_ocl_mma16816(acc + 4 * j, xf + 4 * ks, yb, scratch);
        }
}

/* The one-kernel backward above head-dim class 128: dK, dV and dQ's f32 accumulator of FA2_WK
 * (32) keys. A warp holding 16 keys' dK and dV (2 x 128 f32 a lane at D = 256) beside K's and V's
 * fragments (2 x 64) would pass 255 registers, so each 16 keys take two warps: warp w (keys
 * 16 (w % 2) ..) of role w / 2 holds K's fragments and computes S^T = K Q^T and dV += P^T dO
 * (role 0), or V's and dP^T = V dO^T and dK += dS^T Q (role 1), the two exchanging their C
 * fragments through local memory (sx, a lane's own floats: one barrier), so that each computes P
 * and dS of the pair (fp_ocl_fa2_grad) and every product is made once. q and dO of each query
 * block of FA2_BQ rows are staged as row-pair tiles only (the B operands of the accumulations,
 * one 32-bit load a register; the dots' B registers from the same tiles, one 64-bit load each:
 * fp_ocl_fa2_load_b_rows), so the keys' row-pair tile for dQ fits beside them in 48 KiB. dQ as
 * the narrow fused kernel's (fp_ocl_fa2_dq_add, after the next query block's first barrier), and
 * so is the guard: q and dO scrubbed in edge blocks, the keys' copy for dQ always, NaN for a
 * visible pair of a flagged row. Three barriers a query block. */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_fused(const fp_ocl_args a, __global const fp_elem *q, __global const fp_elem *k,
                      __global const fp_elem *v, __global const float *lse,
                      __global const fp_elem *dout, __global fp_elem *dk, __global fp_elem *dv,
                      __global const float *delta, __global float *dq_acc,
                      __global const int *cu_q, __global const int *cu_k,
                      __global const float *alibi, __global const int *used,
                      __local fp_tile *stage_arg, __local float *srow_arg, __local float *sbad_arg,
                      __local uint *skt_arg, __local fp_tile *sds_arg,
                                         __local float *skbad_arg, __local float *sx_arg FP_OCL_SCRATCH_PARAM)
{
    /* [FA2_WK, LD] 16-bit: K's rows for the fragments, then q and dO of a query block by row
     * pairs ([FA2_BQ / 2, LDP] words each) */
    __local fp_tile *stage = FP_OCL_ALIGN16(fp_tile, stage_arg);
    __local float *srow = FP_OCL_ALIGN16(float, srow_arg); /* LSE [FA2_BQ], delta [FA2_BQ] */
    __local float *sbad = FP_OCL_ALIGN16(float, sbad_arg); /* [2][FA2_BQ], by block parity */
    /* [FA2_WK / 2, LDP]: V's rows for the fragments, then the keys by row pairs (dQ) */
    __local uint *skt = FP_OCL_ALIGN16(uint, skt_arg);
    __local fp_tile *sds = FP_OCL_ALIGN16(fp_tile, sds_arg); /* [FA2_BQ, FA2_LDS]: dS */
    __local float *skbad = FP_OCL_ALIGN16(float, skbad_arg); /* [FA2_WK]: key flags */
    __local float *sx = FP_OCL_ALIGN16(float, sx_arg); /* [4 warps][FA2_BQ / 2][32 lanes] */
#if !FP_OCL_MMA_EMULATE
    __local float scratch[FP_OCL_SCRATCH];
#endif
    FP_OCL_KEY_BLOCK_OF(&a, FA2_WK);
    const int lane = tid % 32, t4 = lane % 4, w = tid / 32, role = w / 2;
    const int k_lo = 16 * (w % 2) + lane / 4; /* this lane's keys: k_lo and k_lo + 8 */
    const float sl2 = a.scale * FA2_FAST_LOG2E; /* the fast path's */
    __local uint *sqp = (__local uint *)stage, *sdop = sqp + FA2_BQ / 2 * LDP;

    fp_ocl_load_rows(stage, FA2_WK, k, &a, &kr, j0, cols, hd, 0, sbad, 1);
    fp_ocl_load_rows((__local fp_tile *)skt, FA2_WK, v, &a, &vr, j0, cols, hd, 0, sbad, 1);
    if (tid < FA2_WK)
        skbad[tid] = 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    uint xf[FA2_KS * 4]; /* K's (role 0) or V's (role 1) A fragments of this warp's keys */
    FP_OCL_UNROLL
    for (int ks = 0; ks < FA2_KS; ks++)
        fp_ocl_load_a(xf + 4 * ks, role ? (__local const fp_tile *)skt : stage, 1,
                      16 * (w % 2) * LD + 16 * ks, LD, 1);
    barrier(CLK_LOCAL_MEM_FENCE);
    /* the keys for dS K, scrubbed; the loop's first barrier orders it before its readers */
    fp_ocl_fa2_load_pairs(stage, 0, skt, FA2_WK, k, &a, &kr, j0, cols, hd, 1, skbad);
    if (tid < FA2_BQ)
        sbad[tid] = 0.0f;
    float acc[FA2_ON * 4]; /* dV (role 0) or dK (role 1) of this warp's keys */
    FP_OCL_UNROLL
    for (int e = 0; e < FA2_ON * 4; e++)
        acc[e] = 0.0f;

    int it = 0; /* query blocks run: their parity picks the half of sbad */
    long dq_h = 0, dq_i0 = -1; /* the query block whose dQ is still to be added */
    int dq_rows = 0;
    for (long h = hk * group; cols > 0 && h < (hk + 1) * group; h++) {
        const float slope = a.has_alibi ? alibi[a.alibi_off + h] : 0.0f;
        const fp_ocl_rows qr =
            fp_ocl_dense_rows(fp_ocl_row0(a.q, b, s.q_start, h), a.q.s[1], a.q.s[3]);
        const fp_ocl_rows dor =
            fp_ocl_dense_rows(fp_ocl_row0(a.dout, b, s.q_start, h), a.dout.s[1], a.dout.s[3]);
        for (long i0 = 0; i0 < s.nq; i0 += FA2_BQ) {
            const int rows = (int)min((long)FA2_BQ, s.nq - i0);
            int64_t lo, hi;
            fp_mask_block_range(i0, i0 + rows, s.nq, s.nk, a.left, a.right, &lo, &hi);
            if (hi <= lo || hi <= j0 || lo >= j0 + cols)
                continue; /* no row of this query block sees these keys */
            const int edge =
                !fp_mask_block_full(i0, i0 + rows, j0, j0 + cols, s.nq, s.nk, a.left, a.right);
            const int par = it++ & 1;
            __local float *bad = sbad + par * FA2_BQ;
            /* every reader of the staging tile, srow and sx is done, every writer of sds */
            barrier(CLK_LOCAL_MEM_FENCE);
            if (dq_i0 >= 0) /* the last block's dQ, before this block writes sds */
                for (int part = 0; part < FA2_QP; part++)
                    fp_ocl_fa2_dq_add(&a, &s, b, dq_h, dq_i0, dq_rows, hd, sds, skt, dq_acc,
                                      scratch, part);
            fp_ocl_fa2_load_pairs(stage, 0, sqp, FA2_BQ, q, &a, &qr, i0, rows, hd, edge, bad);
            fp_ocl_fa2_load_pairs(stage, 0, sdop, FA2_BQ, dout, &a, &dor, i0, rows, hd, edge, bad);
            if (tid < FA2_BQ) {
                srow[tid] = tid < rows ? lse[fp_ocl_lse_at(&a, b, h, s.q_start + i0 + tid)]
                                       : -INFINITY;
                srow[FA2_BQ + tid] =
                    tid < rows ? delta[fp_ocl_delta_at(&a, &s, b, h, i0 + tid)] : 0.0f;
                sbad[(par ^ 1) * FA2_BQ + tid] = 0.0f; /* read before, written next */
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            float x[FA2_BQ / 2]; /* S^T (role 0) or dP^T (role 1): 16 keys x FA2_BQ queries */
            fp_ocl_fa2_dots_pairs(x, xf, role ? sdop : sqp, scratch);
            FP_OCL_UNROLL
            for (int e = 0; e < FA2_BQ / 2; e++)
                sx[(w * (FA2_BQ / 2) + e) * 32 + lane] = x[e];
            barrier(CLK_LOCAL_MEM_FENCE);
            const int simple = !edge && cols == FA2_WK && rows == FA2_BQ && !a.has_alibi;
            if (FP_OCL_BWD_FAST && simple && a.softcap == 0.0f) {
                /* as fp_ocl_fa2_dkdv's fast path; role 0 keeps P, role 1 dS */
                float l2[FA2_BQ / 4], dl[FA2_BQ / 4];
                fp_ocl_fa2_fast_rows(l2, dl, srow);
                const int kbad0 = skbad[k_lo] != 0.0f, kbad1 = skbad[k_lo + 8] != 0.0f;
                FP_OCL_UNROLL
                for (int j = 0; j < FA2_BQ / 8; j++)
                    FP_OCL_UNROLL
                    for (int e = 0; e < 4; e++) {
                        const int kc = k_lo + 8 * (e / 2), c = 8 * j + 2 * t4 + e % 2;
                        const float y = sx[((w ^ 2) * (FA2_BQ / 2) + 4 * j + e) * 32 + lane];
                        float p, ds;
                        fp_ocl_fa2_grad_fast(role ? y : x[4 * j + e], role ? x[4 * j + e] : y, sl2,
                                             l2[2 * j + e % 2], dl[2 * j + e % 2], a.scale, &p,
                                             &ds);
                        x[4 * j + e] = role ? ds : p;
                        if (role)
                            sds[c * FA2_LDS + kc] = (fp_tile)fp_ocl_pack2(
                                (e < 2 ? kbad0 : kbad1) ? NAN : ds, 0.0f);
                    }
            } else {
                FP_OCL_UNROLL
                for (int j = 0; j < FA2_BQ / 8; j++)
                    FP_OCL_UNROLL
                    for (int e = 0; e < 4; e++) {
                        const int kc = k_lo + 8 * (e / 2), c = 8 * j + 2 * t4 + e % 2;
                        const int inside = c < rows && kc < cols;
                        const float y = sx[((w ^ 2) * (FA2_BQ / 2) + 4 * j + e) * 32 + lane];
                        float p, ds;
                        fp_ocl_fa2_grad(&a, &s, slope, simple, i0 + c, j0 + kc, inside,
                                        role ? y : x[4 * j + e], role ? x[4 * j + e] : y, srow[c],
                                        srow[FA2_BQ + c], &p, &ds);
                        if (edge && inside && bad[c] != 0.0f &&
                            fp_mask_visible(i0 + c, j0 + kc, s.nq, s.nk, a.left, a.right))
                            p = ds = NAN;
                        x[4 * j + e] = role ? ds : p;
                        if (role) {
                            const float dsq = inside && skbad[kc] != 0.0f &&
                                                      fp_mask_visible(i0 + c, j0 + kc, s.nq, s.nk,
                                                                      a.left, a.right)
                                                  ? NAN
                                                  : ds;
                            sds[c * FA2_LDS + kc] = (fp_tile)fp_ocl_pack2(dsq, 0.0f);
                        }
                    }
            }
            fp_ocl_fa2_cmm(acc, x, FA2_BQ / 16, role ? sqp : sdop, 1, scratch);
            dq_h = h; /* its dQ is added after the next block's first barrier */
            dq_i0 = i0;
            dq_rows = rows;
        }
    }
    if (dq_i0 >= 0) {
        barrier(CLK_LOCAL_MEM_FENCE); /* sds is whole */
        for (int part = 0; part < FA2_QP; part++)
                    fp_ocl_fa2_dq_add(&a, &s, b, dq_h, dq_i0, dq_rows, hd, sds, skt, dq_acc,
                                      scratch, part);
    }
    /* fp_ocl_fa2_store takes warp w's rows as 16 w ..; this warp's keys are 16 (w % 2) .. */
    const int shift = 16 * (w % 2) - 16 * w;
    if (role)
        fp_ocl_fa2_store(dk, fp_ocl_row0(a.dk, b, s.k_start + j0 + shift, hk), a.dk.s[1],
                         a.dk.s[3], stored - shift, hd, acc, FA2_ON, 0, 1.0f, 1.0f);
    else
        fp_ocl_fa2_store(dv, fp_ocl_row0(a.dv, b, s.k_start + j0 + shift, hk), a.dv.s[1],
                         a.dv.s[3], stored - shift, hd, acc, FA2_ON, 0, 1.0f, 1.0f);
}
#endif

/* Before the fused backward: delta = rowsum(dO O) of 64 query rows (the dQ kernel's sum, in its
 * order) and their dQ accumulator rows zeroed. */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_prep(const fp_ocl_args a, __global const fp_elem *o, __global const fp_elem *dout,
                     __global float *delta, __global float *dq_acc, __global const int *cu_q,
                     __global const int *cu_k, __global const int *used)
{
    FP_OCL_QUERY_BLOCK(&a);
    if (tid < rows) {
        const long o0 = fp_ocl_row0(a.o, b, s.q_start + i0 + tid, h);
        const long d0 = fp_ocl_row0(a.dout, b, s.q_start + i0 + tid, h);
        float dl = 0.0f;
        for (int d = 0; d < hd; d++)
            dl = fma(FP_LOAD(dout, d0 + d * a.dout.s[3]), FP_LOAD(o, o0 + d * a.o.s[3]), dl);
        delta[fp_ocl_delta_at(&a, &s, b, h, i0 + tid)] = dl;
    }
    __global float *acc = dq_acc + fp_ocl_acc_row(&a, &s, b, h, i0);
    for (int e = tid; e < rows * hd; e += FP_OCL_WG)
        acc[e] = 0.0f; /* the rows of a block are consecutive in the delta's layout */
}

/* After the fused backward: dQ of 64 query rows from their f32 accumulator rows (the scale is in
 * dS already), in the caller's dtype. */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
fp_ocl_backward_dq_out(const fp_ocl_args a, __global const float *dq_acc, __global fp_elem *dq,
                       __global const int *cu_q, __global const int *cu_k,
                       __global const int *used)
{
    FP_OCL_QUERY_BLOCK(&a);
    __global const float *acc = dq_acc + fp_ocl_acc_row(&a, &s, b, h, i0);
    for (int e = tid; e < rows * hd; e += FP_OCL_WG) {
        const int r = e / hd, d = e - r * hd;
        FP_STORE(dq, fp_ocl_row0(a.dq, b, s.q_start + i0 + r, h) + d * a.dq.s[3], acc[e]);
    }
}


#endif /* FP_OCL_FA2 */
