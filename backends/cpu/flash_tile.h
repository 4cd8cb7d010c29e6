/*
 * The tile layer of the CPU flash kernels (flash_fwd.c, flash_bwd.c): the f32 tile products the
 * kernels are built from, tile loads/stores with dtype conversion, and per-thread scratch. Block
 * sizes come from core/plan.h (fp_plan_cpu_tiles).
 *
 * Split after BLIS: the kernels are a portable framework that moves data between the caller's
 * strided tensors and small f32 tiles; every O(m * n * d) inner product goes through the
 * fp_tile_ops table, so an ISA-specific micro-kernel (AVX-512, NEON) can replace a product
 * without touching the framework. The portable products (flash_tile.c) are C with GCC/Clang
 * generic vectors (plain loops elsewhere), no ISA intrinsics.
 *
 * Tile layout (the contract every fp_tile_ops implementation follows):
 *   a tile is row-major f32: element (r, c) of a tile `x` with leading dimension `ldx` is
 *   x[r * ldx + c]. Leading dimensions are in elements, at least the tile's column count.
 *   Products read exactly the m/n/d extents they are given and write only the output extent; they
 *   never read or write padding, so callers may pass any m, n, d >= 1. Output tiles never alias
 *   input tiles. Every output element must be summed in an order fixed by (m, n, d) alone, never by
 *   threads or timing, so a product is deterministic for given inputs (the backward's
 *   bitwise-reproducibility rests on it).
 */
#ifndef FLASHPORT_BACKENDS_CPU_FLASH_TILE_H
#define FLASHPORT_BACKENDS_CPU_FLASH_TILE_H

#include "core/backend.h"
#include "core/mask.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* The f32 tile products. m: query rows, n: key rows, d: head dim (see layout above). */
typedef struct fp_tile_ops {
    /* s[m x n] = q[m x d] * kt[d x n]: scores from a query tile and a transposed key tile
     * (also dP = dO V^T with dO and a transposed value tile). Overwrites s. */
    void (*qk)(int m, int n, int d, const float *q, int ldq, const float *kt, int ldkt, float *s,
               int lds);
    /* o[m x d] += p[m x n] * v[n x d]: probabilities times values (also dQ += dS K). */
    void (*pv)(int m, int n, int d, const float *p, int ldp, const float *v, int ldv, float *o,
               int ldo);
    /* g[n x d] += p[m x n]^T * x[m x d]: per-key accumulation over query rows
     * (dV += P^T dO, dK += dS^T Q). */
    void (*ptx)(int m, int n, int d, const float *p, int ldp, const float *x, int ldx, float *g,
                int ldg);
} fp_tile_ops;

/* The products this build runs: the portable C ones (an ISA dispatch would choose here). */
const fp_tile_ops *fp_cpu_tile_ops(void);

/* Leading dimension used for tiles with `cols` columns: rounded up to 16 floats so every row starts
 * on a 64-byte boundary of a 64-byte aligned buffer. */
static inline int fp_tile_ld(int64_t cols)
{
    return (int)((cols + 15) / 16 * 16);
}

/* Sets the scores of keys outside query row i's window to -inf; s holds keys j0 .. j0 + n - 1. */
static inline void fp_row_mask(float *s, int n, int64_t i, int64_t j0, int64_t nq, int64_t nk,
                               int64_t left, int64_t right)
{
    int64_t lo = fp_mask_lo(i, nq, nk, left) - j0;
    int64_t hi = fp_mask_hi(i, nq, nk, right) - j0;
    for (int j = 0; j < n; j++)
        if (j < lo || j >= hi)
            s[j] = -INFINITY;
}

/* Loads rows x d elements of a strided tensor into a tile, times `scale`:
 *   dst[r * ld + c] = scale * x[off + r * row_stride + c * col_stride]. */
void fp_tile_load(float *dst, int ld, const void *x, flashport_dtype dtype, int64_t off,
                  int64_t row_stride, int64_t col_stride, int rows, int d, float scale);

/* The same elements, transposed into the tile: dst[c * ld + r] = x[off + r * rs + c * cs]. */
void fp_tile_load_t(float *dst, int ld, const void *x, flashport_dtype dtype, int64_t off,
                    int64_t row_stride, int64_t col_stride, int rows, int d);

/* Stores rows x d tile elements, times `scale`, into a strided tensor of `dtype` (rounded to
 * nearest even for f16/bf16). */
void fp_tile_store(void *x, flashport_dtype dtype, int64_t off, int64_t row_stride,
                   int64_t col_stride, const float *src, int ld, int rows, int d, float scale);

/* 64-byte aligned, zeroed per-thread scratch: `threads` slices of `floats_per_thread` floats each
 * (each slice rounded up to a multiple of 16 floats). NULL when the allocation fails. */
float *fp_scratch_alloc(int threads, size_t floats_per_thread, size_t *slice_floats);
void fp_scratch_free(float *scratch);

#endif /* FLASHPORT_BACKENDS_CPU_FLASH_TILE_H */
