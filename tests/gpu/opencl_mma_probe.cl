/*
 * Kernels of the tensor-core fault probe (tests/gpu/opencl_mma_probe.c, which says what each
 * variant isolates). Two programs are built from this file:
 *
 *   PROBE_RAW = 1: this file alone. probe_raw is one mma.sync.aligned.m16n8k16 on fragments
 *     computed in registers (probe_fragments), written out: nothing of the library's kernels.
 *   PROBE_RAW = 0: appended to the library's program text before kernels/flash.cl (prelude,
 *     core headers, shape.cl, mma_nv.cl; FP_OCL_MMA = 1), so the kernels below call the
 *     library's own helpers: fp_ocl_mma16816 and fp_ocl_pack2 (probe_frag), fp_ocl_load_tile16,
 *     fp_ocl_load_a / _b through fp_ocl_tile_dots (probe_dots) and fp_ocl_tile_mm (probe_mm),
 *     each from __local kernel arguments as the real kernels have them. With
 *     FP_OCL_MMA_EMULATE = 1 the same kernels run on any device (the probe's own check on PoCL).
 *
 * FP_OCL_DTYPE: 1 f16, 2 bf16. The fragment values are small multiples of 1/8 and 1/4, exact in
 * both types, so every product is exact in f32: the host compares for equality.
 */

/* The 16 bits of x (exact in the storage type) */
static inline uint probe_bits(float x)
{
#if FP_OCL_DTYPE == 2
    return as_uint(x) >> 16;
#else
    ushort h;
    vstore_half(x, 0, (__private half *)&h);
    return h;
#endif
}

/* Warp w's matrices (the host's probe_a / probe_b / probe_c0 are the same formulas). */
static inline float probe_a(int w, int m, int k)
{
    return (float)((3 * m + 5 * k + 7 * w) % 9 - 4) * 0.5f;
}

static inline float probe_b(int w, int k, int n)
{
    return (float)((7 * k + 3 * n + 5 * w) % 7 - 3) * 0.25f;
}

/* This lane's A, B and C fragments of m16n8k16 by the PTX ISA's layout table (lane = 4 g + t):
 * a[i] = A[g + 8 (i % 2)][2 t + 8 (i / 2) + {0, 1}], b[i] = B[2 t + 8 i + {0, 1}][g],
 * c[i] = C[g + 8 (i / 2)][2 t + i % 2]. pack: fragments as two f32 values each (af, bf) for
 * fp_ocl_pack2 instead of bits. */
static inline void probe_fragments(uint a[4], uint b[2], float c[4], float af[8])
{
    const int w = get_local_id(0) / 32, lane = get_local_id(0) % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int m = g + 8 * (i % 2), k = 2 * t + 8 * (i / 2);
        af[2 * i] = probe_a(w, m, k);
        af[2 * i + 1] = probe_a(w, m, k + 1);
        a[i] = probe_bits(af[2 * i]) | probe_bits(af[2 * i + 1]) << 16;
        c[i] = (float)((get_local_id(0) * 4 + i) % 5) * 0.125f;
    }
    for (int i = 0; i < 2; i++) {
        const int k = 2 * t + 8 * i;
        b[i] = probe_bits(probe_b(w, k, g)) | probe_bits(probe_b(w, k + 1, g)) << 16;
    }
}

#if PROBE_RAW

#if FP_OCL_DTYPE == 2
#define PROBE_MMA "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
#define PROBE_MMA "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif

/* out[lid * 4 + i] = c[i] of work-item lid after one mma.sync; PROBE_WG work-items (32: one
 * warp, 128: the real kernels' four). */
__kernel __attribute__((reqd_work_group_size(PROBE_WG, 1, 1))) void probe_raw(__global float *out)
{
    uint a[4], b[2];
    float c[4], af[8];
    probe_fragments(a, b, c, af);
    asm volatile(PROBE_MMA "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    for (int i = 0; i < 4; i++)
        out[get_local_id(0) * 4 + i] = c[i];
}

#else

/* What runs right before the instruction (PROBE_SYNC): 0 nothing; 1 a branch half of each warp
 * takes (the warp diverges and must reconverge at the instruction); 2 a work-group barrier; 3
 * bar.warp.sync over all 32 lanes; 4 the A fragment packed from f32 by fp_ocl_pack2 (cvt.rn). */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
probe_frag(__global float *out, __local float *junk)
{
    __local float scratch[FP_OCL_SCRATCH];
    uint a[4], b[2];
    float c[4], af[8];
    probe_fragments(a, b, c, af);
#if PROBE_SYNC == 1
    junk[get_local_id(0)] = 0.0f;
    if (get_local_id(0) % 32 < 16)
        junk[get_local_id(0)] = af[0] * 2.0f;
    c[0] += junk[get_local_id(0)] * 0.0f;
#elif PROBE_SYNC == 2
    junk[get_local_id(0)] = af[0];
    barrier(CLK_LOCAL_MEM_FENCE);
#elif PROBE_SYNC == 3
    asm volatile("bar.warp.sync -1;");
#elif PROBE_SYNC == 4
    for (int i = 0; i < 4; i++)
        a[i] = fp_ocl_pack2(af[2 * i], af[2 * i + 1]);
#endif
    fp_ocl_mma16816(c, a, b, scratch);
    for (int i = 0; i < 4; i++)
        out[get_local_id(0) * 4 + i] = c[i];
}

/* out[r * T + c] = sum over d of x[r][d] y[c][d]: x and y [T, D] storage elements, contiguous,
 * copied to the local tiles by fp_ocl_load_tile16 (PROBE_COPY = 16, the real kernels' path for
 * the usual layout) or element by element (PROBE_COPY = 1), then fp_ocl_tile_dots (S = Q K^T).
 * out is all NaN before: an element no work-item writes stays NaN. */
FP_OCL_INLINE void probe_copy(__local fp_tile *t, __global const fp_elem *x)
{
#if PROBE_COPY == 16
    if (fp_ocl_load_tile16(t, x, 0, D, 1, 0, T, D))
        return;
#endif
    for (int e = get_local_id(0); e < T * D; e += FP_OCL_WG)
        t[e / D * LD + e % D] = ((__global const ushort *)x)[e];
}

/* PROBE_PAD = 0: sx, sy are the first two __local arguments (l0, l1), as q is the real kernels'
 * first; 1: a 16-byte l0 comes first, so neither starts at __local address 0. */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
probe_dots(__global const fp_elem *x, __global const fp_elem *y, __global float *out,
           __local fp_tile *l0, __local fp_tile *l1, __local fp_tile *l2)
{
    __local float scratch[FP_OCL_SCRATCH];
    __local fp_tile *sx = PROBE_PAD ? l1 : l0, *sy = PROBE_PAD ? l2 : l1;
    probe_copy(sx, x);
    probe_copy(sy, y);
    barrier(CLK_LOCAL_MEM_FENCE);
    float acc[FP_OCL_SN];
    fp_ocl_tile_dots(sx, sy, acc, scratch);
    FP_OCL_UNROLL
    for (int e = 0; e < FP_OCL_SN; e++) {
        int r, c;
        fp_ocl_s_at(e, &r, &c);
        if (c < T)
            out[r * T + c] = acc[e];
    }
}

/* The __local addresses the driver gives arguments of the forward kernel's sizes (q, k and v,
 * scores, rows), in its order: out[0..3]. */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
probe_addr(__global uint *out, __local fp_tile *sq, __local fp_tile *skv, __local float *ss,
           __local float *srow)
{
    if (get_local_id(0) == 0) {
        out[0] = (uint)(size_t)sq;
        out[1] = (uint)(size_t)skv;
        out[2] = (uint)(size_t)ss;
        out[3] = (uint)(size_t)srow;
    }
}

/* out[r * D + d] = sum over n of p(r, n) v[n][d]: p [T, T] f32 copied to a score tile (pitch
 * LS), p(r, n) = p[r][n] (PROBE_TRANSPOSED = 0, the forward's P V) or p[n][r] (1, the backward's
 * P^T dO); v [T, D] storage through fp_ocl_load_tile16; fp_ocl_tile_mm as the kernels call it. */
__kernel __attribute__((reqd_work_group_size(FP_OCL_WG, 1, 1))) void
probe_mm(__global const float *p, __global const fp_elem *v, __global float *out,
         __local float *sp, __local fp_tile *sv)
{
    __local float scratch[FP_OCL_SCRATCH];
    for (int e = get_local_id(0); e < T * T; e += FP_OCL_WG)
        sp[e / T * LS + e % T] = p[e];
    probe_copy(sv, v);
    barrier(CLK_LOCAL_MEM_FENCE);
    float acc[FP_OCL_ON];
    FP_OCL_UNROLL
    for (int e = 0; e < FP_OCL_ON; e++)
        acc[e] = 0.0f;
    fp_ocl_tile_mm(sp, PROBE_TRANSPOSED, sv, T, acc, scratch);
    FP_OCL_UNROLL
    for (int e = 0; e < FP_OCL_ON; e++) {
        int r, d;
        fp_ocl_o_at(e, &r, &d);
        if (d < D)
            out[r * D + d] = acc[e];
    }
}

#endif /* PROBE_RAW */
