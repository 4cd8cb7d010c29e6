/*
 * Portable tile layer of the CPU flash kernels (contract in flash_tile.h): the f32 tile products,
 * tile loads/stores with f16/bf16 conversion (core/dtype.h) and per-thread scratch.
 *
 * Products: all three are one register-blocked kernel C (+)= A B, with A read through (row,
 * column) strides, so the transposed operand of P^T X costs nothing, and B and C row-major. C is
 * computed in MR x NR = 6 x 8 blocks whose accumulators stay in registers across the whole
 * reduction: GCC/Clang generic 4-float vectors (SSE, NEON, any target; no intrinsics), unrolled
 * so the vector code does not depend on the optimization level; other compilers and edge blocks
 * take plain loops. Vectors run across output columns, never across the reduction, so each
 * output element is summed in index order whatever the thread count or schedule.
 * Target: any C11 compiler; tuned for 16 x 128-bit registers (x86-64 baseline SSE2, NEON).
 * Known differences from the reference: f32 accumulation instead of double.
 */
#include "backends/cpu/flash_tile.h"

#include "core/dtype.h"

#include <stdlib.h>
#include <string.h>

/* Block of the products: MR rows x NR columns of C, 12 SSE/NEON registers of accumulators. */
enum { MR = 6, NR = 8 };

/* c[mr x nr] (+)= a[mr x k] b[k x nr] for mr <= MR, nr <= NR; a(r, p) = a[r * rsa + p * csa].
 * Plain C: the edge blocks, and every block on compilers without generic vectors. */
static void block_scalar(int mr, int nr, int k, const float *a, ptrdiff_t rsa, ptrdiff_t csa,
                         const float *restrict b, ptrdiff_t ldb, float *restrict c, ptrdiff_t ldc,
                         int accumulate)
{
    float t[MR][NR];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++)
            t[r][j] = accumulate ? c[r * ldc + j] : 0.0f;
    for (int p = 0; p < k; p++) {
        const float *restrict bp = b + p * ldb;
        for (int r = 0; r < mr; r++) {
            float ar = a[r * rsa + p * csa];
            for (int j = 0; j < nr; j++)
                t[r][j] += ar * bp[j];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++)
            c[r * ldc + j] = t[r][j];
}

#if defined(__GNUC__)
/* GCC/Clang generic vectors of 4 floats (no ISA intrinsics: SSE, NEON, anything), so the
 * accumulators of a block stay in registers across the whole reduction. */
typedef float fp_vec4 __attribute__((vector_size(16)));
enum { NV = NR / 4 };

/* block_scalar for nr == NR. Always inlined into rows_vec's switch, so mr is a constant and the
 * unrolled loops leave mr x NV vector accumulators. */
static inline __attribute__((always_inline)) void
block_vec(int mr, int k, const float *a, ptrdiff_t rsa, ptrdiff_t csa, const float *restrict b,
          ptrdiff_t ldb, float *restrict c, ptrdiff_t ldc, int accumulate)
{
    fp_vec4 t[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            fp_vec4 x = {0};
            if (accumulate)
                memcpy(&x, c + r * ldc + 4 * v, sizeof x);
            t[r][v] = x;
        }
    for (int p = 0; p < k; p++) {
        fp_vec4 bp[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++)
            memcpy(&bp[v], b + p * ldb + 4 * v, sizeof bp[v]);
        const float *ap = a + p * csa;
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const float ar = ap[r * rsa];
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++)
                t[r][v] += ar * bp[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            fp_vec4 x = t[r][v];
            memcpy(c + r * ldc + 4 * v, &x, sizeof x);
        }
}

static void block_full_width(int mr, int k, const float *a, ptrdiff_t rsa, ptrdiff_t csa,
                             const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate)
{
    switch (mr) {
    case 6:
        block_vec(6, k, a, rsa, csa, b, ldb, c, ldc, accumulate);
        break;
    case 5:
        block_vec(5, k, a, rsa, csa, b, ldb, c, ldc, accumulate);
        break;
    case 4:
        block_vec(4, k, a, rsa, csa, b, ldb, c, ldc, accumulate);
        break;
    case 3:
        block_vec(3, k, a, rsa, csa, b, ldb, c, ldc, accumulate);
        break;
    case 2:
        block_vec(2, k, a, rsa, csa, b, ldb, c, ldc, accumulate);
        break;
    default:
        block_vec(1, k, a, rsa, csa, b, ldb, c, ldc, accumulate);
        break;
    }
}
#else
static void block_full_width(int mr, int k, const float *a, ptrdiff_t rsa, ptrdiff_t csa,
                             const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate)
{
    block_scalar(mr, NR, k, a, rsa, csa, b, ldb, c, ldc, accumulate);
}
#endif

/* c[m x n] (+)= A[m x k] b[k x n], A(r, p) = a[r * rsa + p * csa], b and c row-major. */
static void gemm(int m, int n, int k, const float *a, ptrdiff_t rsa, ptrdiff_t csa, const float *b,
                 ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate)
{
    for (int i = 0; i < m; i += MR) {
        const int mr = m - i < MR ? m - i : MR;
        const float *ai = a + i * rsa;
        for (int j = 0; j < n; j += NR) {
            float *cij = c + i * ldc + j;
            if (n - j >= NR)
                block_full_width(mr, k, ai, rsa, csa, b + j, ldb, cij, ldc, accumulate);
            else
                block_scalar(mr, n - j, k, ai, rsa, csa, b + j, ldb, cij, ldc, accumulate);
        }
    }
}

static void qk_tile(int m, int n, int d, const float *q, int ldq, const float *kt, int ldkt,
                    float *s, int lds)
{
    gemm(m, n, d, q, ldq, 1, kt, ldkt, s, lds, 0);
}

static void pv_tile(int m, int n, int d, const float *p, int ldp, const float *v, int ldv, float *o,
                    int ldo)
{
    gemm(m, d, n, p, ldp, 1, v, ldv, o, ldo, 1);
}

static void ptx_tile(int m, int n, int d, const float *p, int ldp, const float *x, int ldx,
                     float *g, int ldg)
{
    gemm(n, d, m, p, 1, ldp, x, ldx, g, ldg, 1);
}

static const fp_tile_ops portable_ops = {qk_tile, pv_tile, ptx_tile};

const fp_tile_ops *fp_cpu_tile_ops(void)
{
    return &portable_ops;
}

/* One row of d elements, x[off + c * cs], into dst, times scale. The dtype switch sits outside
 * the loops so each loop is a plain conversion the compiler can vectorize. */
static void load_row(float *restrict dst, const void *x, flashport_dtype dtype, int64_t off,
                     int64_t cs, int d, float scale)
{
    switch (dtype) {
    case FLASHPORT_F16: {
        const uint16_t *src = (const uint16_t *)x + off;
        for (int c = 0; c < d; c++)
            dst[c] = scale * fp_f16_to_f32(src[c * cs]);
        break;
    }
    case FLASHPORT_BF16: {
        const uint16_t *src = (const uint16_t *)x + off;
        for (int c = 0; c < d; c++)
            dst[c] = scale * fp_bf16_to_f32(src[c * cs]);
        break;
    }
    default: {
        const float *src = (const float *)x + off;
        if (cs == 1 && scale == 1.0f)
            memcpy(dst, src, sizeof(float) * (size_t)d);
        else
            for (int c = 0; c < d; c++)
                dst[c] = scale * src[c * cs];
        break;
    }
    }
}

void fp_tile_load(float *dst, int ld, const void *x, flashport_dtype dtype, int64_t off,
                  int64_t row_stride, int64_t col_stride, int rows, int d, float scale)
{
    for (int r = 0; r < rows; r++)
        load_row(dst + (ptrdiff_t)r * ld, x, dtype, off + r * row_stride, col_stride, d, scale);
}

void fp_tile_load_t(float *dst, int ld, const void *x, flashport_dtype dtype, int64_t off,
                    int64_t row_stride, int64_t col_stride, int rows, int d)
{
    /* Bands of 16 source rows: each source row is read sequentially and each destination row
     * receives 64 contiguous bytes per band. Walking a whole column at once instead strides
     * through the source by the row pitch, which for power-of-two head counts maps every access
     * to one L1 set. */
    enum { BAND = 16 };
    for (int r0 = 0; r0 < rows; r0 += BAND) {
        const int nr = rows - r0 < BAND ? rows - r0 : BAND;
        for (int c = 0; c < d; c++) {
            float *restrict out = dst + (ptrdiff_t)c * ld + r0;
            const int64_t o = off + r0 * row_stride + c * col_stride;
            switch (dtype) {
            case FLASHPORT_F16:
                for (int r = 0; r < nr; r++)
                    out[r] = fp_f16_to_f32(((const uint16_t *)x)[o + r * row_stride]);
                break;
            case FLASHPORT_BF16:
                for (int r = 0; r < nr; r++)
                    out[r] = fp_bf16_to_f32(((const uint16_t *)x)[o + r * row_stride]);
                break;
            default:
                for (int r = 0; r < nr; r++)
                    out[r] = ((const float *)x)[o + r * row_stride];
                break;
            }
        }
    }
}

void fp_tile_store(void *x, flashport_dtype dtype, int64_t off, int64_t row_stride,
                   int64_t col_stride, const float *src, int ld, int rows, int d, float scale)
{
    for (int r = 0; r < rows; r++) {
        const float *s = src + (ptrdiff_t)r * ld;
        int64_t o = off + r * row_stride;
        switch (dtype) {
        case FLASHPORT_F16:
            for (int c = 0; c < d; c++)
                ((uint16_t *)x)[o + c * col_stride] = fp_f32_to_f16(scale * s[c]);
            break;
        case FLASHPORT_BF16:
            for (int c = 0; c < d; c++)
                ((uint16_t *)x)[o + c * col_stride] = fp_f32_to_bf16(scale * s[c]);
            break;
        default:
            for (int c = 0; c < d; c++)
                ((float *)x)[o + c * col_stride] = scale * s[c];
            break;
        }
    }
}

float *fp_scratch_alloc(int threads, size_t floats_per_thread, size_t *slice_floats)
{
    size_t slice = (floats_per_thread + 15) / 16 * 16;
    if (threads < 1 || slice == 0 || slice > SIZE_MAX / sizeof(float) / (size_t)threads)
        return NULL;
    size_t bytes = slice * sizeof(float) * (size_t)threads;
    float *buf = aligned_alloc(64, bytes);
    if (!buf)
        return NULL;
    memset(buf, 0, bytes);
    *slice_floats = slice;
    return buf;
}

void fp_scratch_free(float *scratch)
{
    free(scratch);
}
