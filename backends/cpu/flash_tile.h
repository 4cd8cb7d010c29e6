/*
 * The tile layer of the CPU flash kernels (flash_fwd.c, flash_bwd.c): moving blocks of the
 * caller's strided tensors (f32, f16, bf16) into the tiles the micro-kernels work on (layout
 * contract in ukernel.h), back out, and per-thread scratch. Portable C; conversions of contiguous
 * rows go through the micro-kernel table's vector converters.
 *
 * Tiles are row-major with a leading dimension from fp_tile_ld (a multiple of FP_TILE_COLS
 * floats), in 64-byte aligned scratch. Three shapes occur:
 *   row tile     dst[r * ld + c] = x(r, c)                    (rows x d)
 *   transposed   dst[c * ld + r] = x(r, c)                    (d x rows; query blocks as columns)
 *   bf16 pairs   one uint32 holds two bf16 neighbours along the reduction of a product
 *                (low half: the even one), for vdpbf16ps (ukernel.h, gemm_bf16).
 * x(r, c) is element off + r * row_stride + c * col_stride of the tensor.
 */
#ifndef FLASHPORT_BACKENDS_CPU_FLASH_TILE_H
#define FLASHPORT_BACKENDS_CPU_FLASH_TILE_H

#include "backends/cpu/ukernel.h"
#include "core/backend.h"

#include <stddef.h>
#include <stdint.h>

/* Leading dimension (and padded width) of a tile with `cols` columns. */
static inline int fp_tile_ld(int64_t cols)
{
    return (int)((cols + FP_TILE_COLS - 1) / FP_TILE_COLS * FP_TILE_COLS);
}

/* fp_tile_ld, one FP_TILE_COLS wider where the row stride would be a multiple of 512 bytes: for
 * tiles whose 16-column panels the products read down many rows (the B operand of a product, a
 * panel meant to stay in L1). At such a stride a panel's rows fall into 8 or fewer of the 64 sets
 * of a 32 KiB 8-way L1 and evict each other, and the panel comes from L2 at every row block. */
static inline int fp_tile_ld_sets(int64_t cols)
{
    const int ld = fp_tile_ld(cols);
    return ld % 128 == 0 ? ld + FP_TILE_COLS : ld;
}

/* A block of a strided tensor: element (r, c) is at data + off + r * rs + c * cs. */
typedef struct fp_block {
    void *data; /* written only by the store functions */
    flashport_dtype dtype;
    int64_t off, rs, cs;
} fp_block;

/* Row tile, f32: dst[r * ld + c] = x(r, c) for r < rows, c < d. */
void fp_tile_load(float *dst, int ld, const fp_block *x, int rows, int d, const fp_ukernels *uk);

/* Transposed tile, f32: dst[c * ld + r] = x(r, c) for c < d, r < rows; columns rows .. ld - 1
 * are set to 0 so the padding of a query block stays finite. Contiguous f32 rows go through
 * uk->transpose32. */
void fp_tile_load_t(float *dst, int ld, const fp_block *x, int rows, int d, const fp_ukernels *uk);

/* Stores rows x d elements of a row tile, times scale, into the tensor (f16/bf16 rounded to
 * nearest even, contiguous rows through uk->store_f16 / store_bf16). */
void fp_tile_store(const fp_block *x, const float *src, int ld, int rows, int d, float scale,
                   const fp_ukernels *uk);

/* Stores the transpose of a d x rows tile: x(r, c) = scale * src[c * ld + r] (rounded as
 * fp_tile_store; contiguous rows in squares of 16 x 16 through uk->transpose32). */
void fp_tile_store_t(const fp_block *x, const float *src, int ld, int rows, int d, float scale,
                     const fp_ukernels *uk);

/* bf16 pairs along the columns, transposed (the query side of S^T = K Q^T):
 * dst[p * ld + r] = x(r, 2p) | x(r, 2p + 1) << 16 for p < ceil(d / 2), r < rows; a missing odd
 * element and the columns rows .. ld - 1 are 0. x must be bf16; contiguous rows go through
 * uk->transpose32. */
void fp_tile_pairs_t(uint32_t *dst, int ld, const fp_block *x, int rows, int d,
                     const fp_ukernels *uk);

/* bf16 pairs down the rows (V for P V): dst[p * ld + c] = x(2p, c) | x(2p + 1, c) << 16 for
 * p < ceil(rows / 2), c < d; a missing odd row is 0. x must be bf16; contiguous rows go through
 * uk->interleave_bf16. */
void fp_tile_pairs_rows(uint32_t *dst, int ld, const fp_block *x, int rows, int d,
                        const fp_ukernels *uk);

/* bf16 row tile with an even row length: dst[r * ld + c] = x(r, c), and dst[r * ld + d] = 0 when
 * d is odd (K for gemm_bf16 when it cannot be read in place). ld counts uint16 elements. */
void fp_tile_load_bf16(uint16_t *dst, int ld, const fp_block *x, int rows, int d);

/* A thread's f32 copy of the K and V rows of one (batch, kv head), for f16 and bf16 inputs that
 * the products take as f32 (tables without bf16 dot products), and for f32 on the AVX2 table
 * (rows fp_tile_ld_sets apart instead of the caller's H * d): each block of FP_STAGE_ROWS keys
 * is converted the first time the thread needs it and read in place by every later query block,
 * instead of being converted again for each (query block, key block) pair. Lives for one call. */
enum { FP_STAGE_ROWS = 64 };
typedef struct fp_kv_stage {
    float *k, *v;        /* capacity x ld each */
    unsigned char *done; /* per block of FP_STAGE_ROWS keys: converted */
    int64_t b, kvh;      /* whose keys it holds (-1: nobody's yet) */
    int64_t capacity;
    int ld;
} fp_kv_stage;

/* Floats of scratch a stage of up to `capacity` keys of head dim d takes. */
size_t fp_kv_stage_floats(int64_t capacity, int64_t d);

/* A stage over mem (fp_kv_stage_floats floats), holding nobody's keys. */
fp_kv_stage fp_kv_stage_init(float *mem, int64_t capacity, int64_t d);

/* Whether keys [j0, j0 + FP_STAGE_ROWS) of (b, kvh) are already in the stage. */
int fp_kv_stage_ready(const fp_kv_stage *st, int64_t b, int64_t kvh, int64_t j0);

/* Rows [j0, j0 + n) of the K and V of (b, kvh), nk keys in all (nk <= capacity): kb and vb come
 * in as the caller's blocks of those rows (a row offset linear in the key: not paged) and go out
 * as the stage's f32 rows, converted first where the stage does not hold them yet. */
void fp_kv_stage_rows(fp_kv_stage *st, int64_t b, int64_t kvh, int64_t nk, int64_t j0, int n, int d,
                      const fp_ukernels *uk, fp_block *kb, fp_block *vb);

/* Asks the caches for rows x d elements of a block with contiguous rows (nothing otherwise),
 * into L2: the next key block's K and V, fetched while the current one is computed. Their rows
 * are short (D elements), too short for the hardware prefetchers to pick up on their own. */
void fp_block_prefetch(const fp_block *x, int rows, int d);

/* Whether all rows x d elements of a block are finite (no infinity, no NaN). The kernels ask only
 * for blocks that straddle the mask, where a masked key's 0 weight would otherwise meet it. */
int fp_block_finite(const fp_block *x, int rows, int d);

/* A score tile that the mask cuts (keys j0 .. j0 + n - 1 down the rows, queries i0 .. i0 + m - 1
 * across), cut into bands of key rows by the groups of FP_TILE_COLS query columns that may see
 * them: band b is rows [r0, r0 + rows), seen by no query outside columns [x0, x0 + cols) (x0 and
 * cols multiples of FP_TILE_COLS, x0 + cols <= fp_tile_ld(m)). Every (key, query) pair outside the
 * bands is masked, so products over the bands alone skip only pairs of P = dS = 0 (the kernels'
 * masked entries). Bands come in increasing key order, so a reduction over keys that runs band by
 * band keeps each sum in its order. A query's visible keys [lo, hi) have both ends nondecreasing
 * in the query (core/mask.h), so each band's groups are contiguous. Returns the number of bands,
 * at most FP_KEY_BANDS; m <= FP_TILE_COLS * FP_BAND_GROUPS. */
enum { FP_BAND_GROUPS = 8, FP_KEY_BANDS = 2 * FP_BAND_GROUPS + 1 };
typedef struct fp_key_band {
    int r0, rows, x0, cols;
} fp_key_band;
int fp_key_bands(int64_t i0, int m, int64_t j0, int n, int64_t nq, int64_t nk, int64_t left,
                 int64_t right, fp_key_band *band);

/* In a score tile stored transposed (keys j0 .. j0 + n - 1 down the rows, queries i0 .. i0 + m - 1
 * across, row stride ld), sets every entry whose query may not see its key to `value`: in each
 * key row the visible queries are one run of columns (core/geometry.h's fp_geom_rows_for_keys),
 * and the columns before and after it are set. nq, nk: the sequence's lengths. */
void fp_tile_fill_masked(float *s, int ld, int n, int m, int64_t i0, int64_t j0, int64_t nq,
                         int64_t nk, int64_t left, int64_t right, float value);

/* 64-byte aligned per-thread scratch: `threads` slices of `floats_per_thread` floats each (each
 * slice rounded up to a multiple of 16 floats, and at least 16), the first `zeroed` floats of each
 * slice set to 0 and the rest left as allocated: buffers that a kernel writes before it reads them
 * (a stage, accumulators it clears per task) are not written twice, and their pages are first
 * touched by the thread that uses them. NULL when the allocation fails. */
float *fp_scratch_alloc(int threads, size_t floats_per_thread, size_t zeroed, size_t *slice_floats);
void fp_scratch_free(float *scratch);

#endif /* FLASHPORT_BACKENDS_CPU_FLASH_TILE_H */
