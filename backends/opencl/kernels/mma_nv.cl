/*
 * The tensor-core micro-tile policy of flash.cl's kernels (FP_OCL_MMA = 1; f16 and bf16 storage):
 * every product of a [T, T] or [T, D] tile is a set of warp-level m16n8k16 matrix multiplies,
 * A 16 x 16 and B 16 x 8 in the storage type, C in f32.
 *
 * Target: NVIDIA GPUs of compute capability >= 8.0 through NVIDIA's OpenCL driver, which accepts
 * inline PTX: fp_ocl_mma16816 is `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}` and
 * fp_ocl_pack2 a `cvt.rn.{bf16x2,f16x2}.f32`. Spelled `asm`, the GNU keyword NVIDIA's compiler
 * takes: a compiler without it (PoCL's) fails the build, and the host falls back to the plain
 * kernels; `__asm__` would pass PoCL's front end and abort in its x86 back end on PTX text. The
 * [T, D] local tiles (q, k, v, dO) hold the storage type's 16 bits as loaded (half the local
 * memory of f32 tiles, so larger tiles fit; row pitch D + 2): a fragment's two neighbours along
 * a row are one 32-bit load. P and dS stay f32 in local memory (the softmax and gradient code
 * writes them) and are rounded to the storage type when loaded into fragments, once, as the
 * CUDA path does. No ldmatrix: plain local loads.
 *
 * With FP_OCL_MMA_EMULATE = 1 the same policy runs on any OpenCL device: fp_ocl_mma16816 then
 * emulates one warp's instruction through local memory (each work-item writes its fragments by
 * the PTX ISA's layout table, a barrier, each computes its four results). That is how the
 * fragment layouts and the whole data flow of the tensor-core kernels are tested on PoCL
 * (tests/CMakeLists.txt: test_backends_opencl_mma_emu); tests/opencl/check_ptx.sh compiles the
 * real one to PTX and assembles it for sm_90.
 *
 * Work layout: a warp is 32 consecutive work-items of the 128 (NVIDIA's mapping of a 1-D
 * work-group); the four warps form a WM x WN grid over the tile's 16-row strips and 8-column
 * tiles. Every warp runs the same loop counts (warps whose column tile lies past the tile's edge
 * compute on a clamped copy and their results are dropped by the callers' key / dim guards), so
 * control flow around the emulation's barriers is uniform. Needs T >= 16 (ocl_plan.h's
 * fp_ocl_plan gives the plain path below).
 *
 * Configuration (ocl_plan.h, 48 KiB of local memory as NVIDIA's driver gives): T = 64 forward up
 * to D = 64, 32 up to 128, 16 above; backward 64 at D = 16, 32 up to 128, 16 above. Warp grid:
 * T = 64: 4 x 1, T = 32: 2 x 2, T = 16: 1 x 4. Known differences from the reference as flash.cl,
 * plus P and dS rounded to the storage type. Numbers: docs/opencl.md and docs/performance.md
 * ("OpenCL backend"); not yet run on a GPU.
 *
 * Element e of an accumulator (fp_ocl_s_at / fp_ocl_o_at): strip i = e / (4 CN), column tile
 * j = e / 4 % CN, register q = e % 4, the m16n8 C fragment's (row g + 8 (q / 2), column
 * 2 t + q % 2) for lane = 4 g + t.
 */
#if FP_OCL_MMA

#if T < 16 || FP_OCL_DTYPE == 0
#error "the tensor-core policy needs f16 or bf16 storage and tiles of at least 16 rows"
#endif

#define FP_OCL_WARPS (FP_OCL_WG / 32)
#define MMA_MT       (T / 16)
#define MMA_WM       (MMA_MT < FP_OCL_WARPS ? MMA_MT : FP_OCL_WARPS)
#define MMA_WN       (FP_OCL_WARPS / MMA_WM)
#define MMA_RM       (MMA_MT / MMA_WM)
#define MMA_SCN      ((T / 8 + MMA_WN - 1) / MMA_WN)
#define MMA_OCN      ((D / 8 + MMA_WN - 1) / MMA_WN)
#define FP_OCL_SN    (MMA_RM * MMA_SCN * 4)
#define FP_OCL_ON    (MMA_RM * MMA_OCN * 4)

typedef ushort fp_tile;
#if FP_OCL_FA2
#define LD (D + 8) /* ocl_plan.h's fp_ocl_tile_ld: the FA2-shaped kernels' 16-byte rows */
#else
#define LD (D + 2)
#endif
#define FP_OCL_KV_APART   1 /* the 16-bit tiles leave room for K and V side by side */
#define FP_TILE_PUT(x, i) (((__global const ushort *)(x))[i])
#if FP_OCL_DTYPE == 2
#define FP_TILE_GET(t, i) as_float((uint)(t)[i] << 16)
#define FP_TILE_INF       0x7f80u /* the exponent bits: all set in inf and NaN */
#else
#define FP_TILE_GET(t, i) vload_half((size_t)(i), (__local const half *)(t))
#define FP_TILE_INF       0x7c00u
#endif
/* A tile element's bits not inf or NaN; fp_ocl_finite2: both of a 32-bit pair. */
#define FP_TILE_FINITE(v) (((uint)(v) & FP_TILE_INF) != FP_TILE_INF)

FP_OCL_INLINE int fp_ocl_finite2(uint w)
{
    return FP_TILE_FINITE(w) && FP_TILE_FINITE(w >> 16);
}

/* w with its non-finite halves set to 0. */
FP_OCL_INLINE uint fp_ocl_scrub2(uint w)
{
    return (FP_TILE_FINITE(w) ? w & 0xffffu : 0u) |
           (FP_TILE_FINITE(w >> 16) ? w & 0xffff0000u : 0u);
}

#if FP_OCL_MMA_EMULATE
/* Per warp: A [16][16] and B [16][8] as f32. */
#define FP_OCL_SCRATCH (FP_OCL_WARPS * (16 * 16 + 16 * 8))
#else
#define FP_OCL_SCRATCH 1
#endif

/* Dims d .. d + 7 of row r0 + r of a slice as stored (dims contiguous, d a multiple of 8, the
 * row 16-byte aligned), zeros where r >= n, d >= hd or the row lies in a page out of range;
 * where scrub, non-finite elements become 0 and set *bad. */
FP_OCL_INLINE uint4 fp_ocl_get16(__global const fp_elem *x, const fp_ocl_args *a,
                                 const fp_ocl_rows *src, long r0, int r, int n, int d, int hd,
                                 int scrub, __local float *bad)
{
    const long at = r < n && d < hd ? fp_ocl_row_at(a, src, r0 + r) : -1;
    uint4 v = (uint4)(0);
    if (at >= 0)
        v = *(__global const uint4 *)((__global const ushort *)x + at + d);
    if (scrub && !(fp_ocl_finite2(v.x) && fp_ocl_finite2(v.y) && fp_ocl_finite2(v.z) &&
                   fp_ocl_finite2(v.w))) {
        v = (uint4)(fp_ocl_scrub2(v.x), fp_ocl_scrub2(v.y), fp_ocl_scrub2(v.z),
                    fp_ocl_scrub2(v.w));
        *bad = 1.0f;
    }
    return v;
}

/* fp_ocl_load_rows's copy 16 bytes (8 elements) a work-item at a time where the slice allows it
 * (fp_ocl_rows_by16); the storage bits go to the tile unchanged. 0 when it does not (the
 * element-wise copy serves). The tile-shaped tiles' rows (pitch D + 2) are only 4-byte aligned,
 * hence four 32-bit stores; the FA2-shaped ones (D + 8) take one 16-byte store. A paged row's
 * page is looked up once per 8 elements (fp_ocl_row_at). Where scrub, non-finite elements become
 * 0 and flag their row r at bad[r * bstride] (flash.cl's fp_ocl_load_rows). */
FP_OCL_INLINE int fp_ocl_load_tile16(__local fp_tile *t, int nrows, __global const fp_elem *x,
                                     const fp_ocl_args *a, const fp_ocl_rows *src, long r0, int n,
                                     int hd, int scrub, __local float *bad, int bstride)
{
    if (!fp_ocl_rows_by16(src, hd))
        return 0;
    for (int e = get_local_id(0); e < nrows * (D / 8); e += FP_OCL_WG) {
        const int r = e / (D / 8), d = (e - r * (D / 8)) * 8;
        const uint4 v = fp_ocl_get16(x, a, src, r0, r, n, d, hd, scrub, bad + r * bstride);
#if FP_OCL_FA2
        *(__local uint4 *)(t + r * LD + d) = v;
#else
        __local uint *dst = (__local uint *)(t + r * LD + d);
        dst[0] = v.x;
        dst[1] = v.y;
        dst[2] = v.z;
        dst[3] = v.w;
#endif
    }
    return 1;
}

/* Two f32 values rounded to the storage type, lo in bits 0..15 and hi in bits 16..31. */
FP_OCL_INLINE uint fp_ocl_pack2(float lo, float hi)
{
#if FP_OCL_MMA_EMULATE
    ushort h[2];
    FP_STORE((__private fp_elem *)h, 0, lo);
    FP_STORE((__private fp_elem *)h, 1, hi);
    return (uint)h[0] | (uint)h[1] << 16;
#else
    uint d;
#if FP_OCL_DTYPE == 2
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#endif
    return d;
#endif
}

/* The A fragment (16 x 16) of this lane: register i holds A[g + 8 (i % 2)][2 t + 8 (i / 2) + {0,
 * 1}], element (m, k) at x0 + m * sm + k * sk of x: 16-bit tile elements where x16 (q, dO, k, v
 * tiles; sk = 1, so a pair is one aligned 32-bit load: x0, sm and 2 t are even), else f32 values
 * (P, dS), rounded to the storage type. x16 is a flag, never a null test of a pointer: __local
 * address 0 is a real address (NVIDIA's driver puts the first __local argument there), so a null
 * __local pointer cannot mean "not given". */
FP_OCL_INLINE void fp_ocl_load_a(uint a[4], __local const void *x, int x16, int x0, int sm, int sk)
{
    const int lane = get_local_id(0) % 32, g = lane / 4, t = lane % 4;
    __local const fp_tile *ph = (__local const fp_tile *)x + x0;
    __local const float *pf = (__local const float *)x + x0;
    FP_OCL_UNROLL
    for (int i = 0; i < 4; i++) {
        const int m = g + 8 * (i % 2), k = 2 * t + 8 * (i / 2);
        a[i] = x16 ? *(__local const uint *)(ph + m * sm + k)
                   : fp_ocl_pack2(pf[m * sm + k * sk], pf[m * sm + (k + 1) * sk]);
    }
}

/* The B fragment (16 x 8, B[k][n] = p[k * sk + n * sn], 16-bit tile elements) of this lane:
 * register i holds B[2 t + 8 i + {0, 1}][g], one 32-bit load where the pair is adjacent
 * (sk = 1). */
FP_OCL_INLINE void fp_ocl_load_b(uint b[2], __local const fp_tile *p, int sk, int sn)
{
    const int lane = get_local_id(0) % 32, g = lane / 4, t = lane % 4;
    FP_OCL_UNROLL
    for (int i = 0; i < 2; i++) {
        __local const fp_tile *x = p + (2 * t + 8 * i) * sk + g * sn;
        b[i] = sk == 1 ? *(__local const uint *)x : (uint)x[0] | (uint)x[sk] << 16;
    }
}

#if FP_OCL_MMA_EMULATE
FP_OCL_INLINE float fp_ocl_unpack(uint bits)
{
#if FP_OCL_DTYPE == 2
    return as_float(bits << 16);
#else
    const ushort h = (ushort)bits;
    return vload_half(0, (__private const half *)&h);
#endif
}
#endif

/* c += A B for one warp: the m16n8k16 tensor-core multiply (f32 accumulators), or its
 * emulation (scratch: FP_OCL_SCRATCH floats of local memory; unused by the real one). */
FP_OCL_INLINE void fp_ocl_mma16816(float c[4], const uint a[4], const uint b[2],
                                   __local float *scratch)
{
#if FP_OCL_MMA_EMULATE
    /* Decodes the fragments by the PTX ISA's table for mma.m16n8k16 (.bf16 / .f16 A and B, .f32
     * C), written out here apart from the loaders above so that the two are checked against
     * each other. */
    const int lane = get_local_id(0) % 32, g = lane / 4, t = lane % 4;
    __local float *sa = scratch + get_local_id(0) / 32 * (16 * 16 + 16 * 8), *sb = sa + 16 * 16;
    /* a0..a7 pairwise: rows g, g + 8, g, g + 8; columns 2t.., 2t.., 2t + 8.., 2t + 8.. */
    for (int i = 0; i < 4; i++) {
        const int m = i % 2 ? g + 8 : g, k = i < 2 ? 2 * t : 2 * t + 8;
        sa[m * 16 + k] = fp_ocl_unpack(a[i] & 0xffffu);
        sa[m * 16 + k + 1] = fp_ocl_unpack(a[i] >> 16);
    }
    for (int i = 0; i < 2; i++) { /* b0..b3 pairwise: rows 2t.., 2t + 8..; column g */
        const int k = i ? 2 * t + 8 : 2 * t;
        sb[k * 8 + g] = fp_ocl_unpack(b[i] & 0xffffu);
        sb[(k + 1) * 8 + g] = fp_ocl_unpack(b[i] >> 16);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; i++) { /* c0..c3: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t+1) */
        const int m = i < 2 ? g : g + 8, n = i % 2 ? 2 * t + 1 : 2 * t;
        float s = c[i];
        for (int k = 0; k < 16; k++)
            s = fma(sa[m * 16 + k], sb[k * 8 + n], s);
        c[i] = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* every lane has read the warp's fragments */
#else
#if FP_OCL_DTYPE == 2
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
#endif
}

/* (row, column) in the tile of element e of an accumulator with cn column tiles per warp; the
 * column may lie past the tile (a clamped tile's lanes, see above). */
FP_OCL_INLINE void fp_ocl_mma_at(int e, int cn, int *r, int *c)
{
    const int w = get_local_id(0) / 32, lane = get_local_id(0) % 32;
    const int i = e / (4 * cn), j = e / 4 % cn, q = e % 4;
    *r = 16 * (w % MMA_WM + MMA_WM * i) + lane / 4 + 8 * (q / 2);
    *c = 8 * (w / MMA_WM + MMA_WN * j) + 2 * (lane % 4) + q % 2;
}

FP_OCL_INLINE void fp_ocl_s_at(int e, int *r, int *c)
{
    fp_ocl_mma_at(e, MMA_SCN, r, c);
}

FP_OCL_INLINE void fp_ocl_o_at(int e, int *r, int *d)
{
    fp_ocl_mma_at(e, MMA_OCN, r, d);
}

/* acc (RM x cn m16n8 tiles of this warp) += X Y over kdim: X of T rows, X[m][k] = x[m * xm +
 * k * xk], 16-bit tile elements where x16 (then xk = 1), else f32 (fp_ocl_load_a); Y[k][n] =
 * y[k * yk + n * yn] of nt * 8 columns. */
FP_OCL_INLINE void fp_ocl_mma_product(__local const void *x, int x16, int xm, int xk,
                                      __local const fp_tile *y, int yk, int yn, int kdim, int cn,
                                      int nt, float *acc, __local float *scratch)
{
    const int w = get_local_id(0) / 32;
    for (int k0 = 0; k0 < kdim; k0 += 16) {
        uint a[MMA_RM][4];
        FP_OCL_UNROLL
        for (int i = 0; i < MMA_RM; i++) {
            fp_ocl_load_a(a[i], x, x16, 16 * (w % MMA_WM + MMA_WM * i) * xm + k0 * xk, xm, xk);
        }
        FP_OCL_UNROLL
        for (int j = 0; j < cn; j++) {
            const int n = min(w / MMA_WM + MMA_WN * j, nt - 1);
            uint b[2];
            fp_ocl_load_b(b, y + k0 * yk + 8 * n * yn, yk, yn);
            FP_OCL_UNROLL
            for (int i = 0; i < MMA_RM; i++)
                fp_ocl_mma16816(acc + 4 * (i * cn + j), a[i], b, scratch);
        }
    }
}

/* The policy's two products, as flash.cl's plain ones. acc = x y^T over D (x, y [T, LD]). */
FP_OCL_INLINE void fp_ocl_tile_dots(__local const fp_tile *x, __local const fp_tile *y,
                                    float acc[FP_OCL_SN], __local float *scratch)
{
    FP_OCL_UNROLL
    for (int e = 0; e < FP_OCL_SN; e++)
        acc[e] = 0.0f;
    fp_ocl_mma_product(x, 1, LD, 1, y, 1, LD, D, MMA_SCN, T / 8, acc, scratch);
}

/* acc += p y over all T keys, p(r, n) = pt[r * LS + n] (transposed = 0) or pt[n * LS + r]; the
 * entries past `count` are zeros in both operands, so the plain path's bound is not needed. */
FP_OCL_INLINE void fp_ocl_tile_mm(__local const float *pt, int transposed, __local const fp_tile *y,
                                  int count, float acc[FP_OCL_ON], __local float *scratch)
{
    (void)count;
    fp_ocl_mma_product(pt, 0, transposed ? 1 : LS, transposed ? LS : 1, y, LD, 1, T, MMA_OCN,
                       D / 8, acc, scratch);
}

#endif /* FP_OCL_MMA */
