/*
 * The CPU micro-kernel contract: everything in the flash kernels that costs O(m * n * d) or runs
 * once per score goes through one fp_ukernels table, chosen at run time from what the CPU can
 * execute (isa.c). The tile loop itself (online softmax state, masking, block skipping, packing,
 * threading) is portable C in flash_fwd.c / flash_bwd.c and never depends on the ISA.
 *
 * Split after BLIS: one framework, small per-ISA kernels, a table of kernel pointers.
 *   ukernel_scalar.c      plain C (GCC/Clang generic 4-float vectors), any target
 *   ukernel_avx2.c        AVX2 + FMA + F16C (x86-64)
 *   ukernel_avx512.c      AVX-512 F/BW/VL f32 (x86-64)
 *   ukernel_avx512bf16.c  the AVX-512 table plus bf16 dot products (vdpbf16ps) for bf16 inputs
 *   ukernel_neon.c        AArch64 Advanced SIMD
 * Each ISA file is compiled with its own target flags (CMakeLists.txt) and only called after
 * isa.c has checked that the CPU runs it.
 *
 * Tile layout, the contract of every entry below:
 *   - A "tile" is row-major: element (r, c) of tile x with leading dimension ldx is x[r * ldx + c].
 *     Tiles are scratch memory of the kernels, 64-byte aligned, with ldx a multiple of
 *     FP_TILE_COLS, and every row padded to a multiple of FP_TILE_COLS columns. Kernels may read
 *     and write the padding columns of the tiles they are given (garbage in, garbage out: a
 *     padding column never feeds a real one); per-column vectors (mx, sub, sum, di) are padded
 *     the same way.
 *   - The A operand of a product is not a tile: it is read through (row, column) strides, exactly
 *     its m x k elements and nothing else, so it may be the caller's tensor itself (for instance
 *     K in place) or a transposed view (P^T read as P).
 *   - Outputs never alias inputs.
 *   - Every output element is summed in an order fixed by the call's extents alone (the product
 *     reduction runs p = 0, 1, ..., k - 1 into one accumulator), never by threads or timing: the
 *     backward's bitwise reproducibility rests on it. Different tables may round differently.
 *   - The exponential is 2^x (scores are kept in log2 units) with about 1 ulp of error on
 *     [-126, 127]; anything below -126, -inf included, gives exactly 0.
 */
#ifndef FLASHPORT_BACKENDS_CPU_UKERNEL_H
#define FLASHPORT_BACKENDS_CPU_UKERNEL_H

#include "flashport.h"

#include <stddef.h>
#include <stdint.h>

/* Tile rows are padded to this many floats (one 64-byte line, one AVX-512 register). */
#define FP_TILE_COLS 16

/* 2^f on [-0.5, 0.5] = 1 + f (C1 + f (C2 + ...)): minimax for relative error (4.6e-9, below f32
 * rounding), constant term pinned to 1 so that 2^0 == 1 exactly (the row maximum gets P = 1). */
#define FP_EXP2_C1 6.931471825e-01f
#define FP_EXP2_C2 2.402265072e-01f
#define FP_EXP2_C3 5.550336465e-02f
#define FP_EXP2_C4 9.617960081e-03f
#define FP_EXP2_C5 1.339753857e-03f
#define FP_EXP2_C6 1.549740118e-04f

/* The prefetch rows of a call (the decode steps' pf below, and flash_decode.c's own loops) walked
 * in address order, a few lines at each step of the products: sequential requests, spread over
 * the call's work, never a burst that waits for the core's free miss slots. */
typedef struct pf_cursor {
    const char *const *pf;
    int lines, rows; /* 64-byte lines a row, rows */
    int row, line;   /* the next line to ask for */
    int quota;       /* lines a step */
} pf_cursor;

static inline pf_cursor pf_start(const char *const *pf, int rows, size_t bytes, int steps)
{
    pf_cursor c = {pf, (int)((bytes + 63) / 64), pf ? rows : 0, 0, 0, 0};
    c.quota = steps > 0 ? (c.lines * c.rows + steps - 1) / steps : 0;
    return c;
}

/* Always inlined: GCC counts a function of prefetches alone as free of side effects and drops
 * its calls. */
static inline __attribute__((always_inline)) void pf_step(pf_cursor *c)
{
    for (int n = 0; n < c->quota && c->row < c->rows; n++) {
        __builtin_prefetch(c->pf[c->row] + (size_t)c->line * 64, 0, 3);
        if (++c->line == c->lines) {
            c->line = 0;
            c->row++;
        }
    }
}

/* The decode steps on 16-bit K or V rows converted to f32 as they are loaded (the _f16 and
 * _bf16_f32 entries below). */
typedef void fp_dec_scores_h16(int heads, int rows, int d, int keys, const float *q, ptrdiff_t qhs,
                               ptrdiff_t ldq, const uint16_t *const *k, ptrdiff_t khs, float *s,
                               ptrdiff_t shs, ptrdiff_t lds, const char *const *pf, int pf_rows,
                               size_t pf_bytes);
typedef void fp_dec_pv_h16(int heads, int rows, int d, int keys, const float *p, ptrdiff_t phs,
                           ptrdiff_t ldp, const uint16_t *const *v, ptrdiff_t vhs, float *o,
                           ptrdiff_t ohs, ptrdiff_t ldo, const char *const *pf, int pf_rows,
                           size_t pf_bytes);

typedef struct fp_ukernels {
    const char *name;     /* FLASHPORT_CPU_ISA spelling: "avx512bf16", "avx512", ... */
    const char *describe; /* one line for FLASHPORT_LOG: vector width, register block */

    /* C[m x n] (+)= A[m x k] B[k x n], f32. A(r, p) = a[r * rsa + p * csa]; B and C tiles.
     * accumulate = 0 overwrites C. */
    void (*gemm)(int m, int n, int k, const float *a, ptrdiff_t rsa, ptrdiff_t csa, const float *b,
                 ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate);

    /* The same with bf16 pairs, NULL where the ISA has no bf16 dot product:
     * C[m x n] (+)= sum over pairs p < kp of A2(r, p) . B2(p, col), where A2(r, p) is the two bf16
     * at a[r * rsa + p * csa] and a[r * rsa + p * csa + 1] (strides in bf16 elements) and B2 is a
     * tile of uint32 pairs (low half: element 2p, high half: element 2p + 1). Products of bf16 are
     * exact in f32; each pair is added to the f32 accumulator as vdpbf16ps does. */
    void (*gemm_bf16)(int m, int n, int kp, const uint16_t *a, ptrdiff_t rsa, ptrdiff_t csa,
                      const uint32_t *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate);

    /* Column-wise softmax pieces over a tile whose columns are query rows (keys down the rows):
     * mx[c] = max(mx[c], max over r < rows of s[r][c]). */
    void (*col_max)(int rows, int cols, const float *s, ptrdiff_t lds, float *mx);
    /* s[r][c] = 2^(s[r][c] * mul - sub[c]) in place; sum[c] += the column's new values (sum may
     * be NULL). sub[c] must be finite. The product is rounded before the subtraction (no fused
     * multiply-add): a score whose product is the maximum the caller took for sub[c] gives
     * exactly 1 at any scale (fused, the product's rounding error, about 2^-24 of it, is the
     * exponent, which at scores near 2^30 is hundreds). NaN in, NaN out. */
    void (*exp2_cols)(int rows, int cols, float *s, ptrdiff_t lds, float mul, const float *sub,
                      float *sum);
    /* exp2_cols writing bf16 pairs instead (NULL when gemm_bf16 is NULL): pairs[r2][c] holds the
     * values of rows 2 r2 and 2 r2 + 1 (a missing last odd row is 0), rounded to nearest even;
     * sum[c] adds the f32 values before rounding. s is left unchanged. */
    void (*exp2_cols_bf16)(int rows, int cols, const float *s, ptrdiff_t lds, float mul,
                           const float *sub, float *sum, uint32_t *pairs, ptrdiff_t ldpairs);
    /* dst[c] = even[c] | odd[c] << 16 for c < n (odd == NULL: zeros): two bf16 rows as pairs,
     * the B operand of P V in gemm_bf16. NULL when gemm_bf16 is NULL. */
    void (*interleave_bf16)(int n, const uint16_t *even, const uint16_t *odd, uint32_t *dst);
    /* A computed f32 tile (the backward's P^T and dS^T) rounded to bf16 operands of gemm_bf16,
     * in either or both of two layouts (NULL: not wanted); NULL when gemm_bf16 is NULL.
     *   dst    bf16 rows, the A operand with pairs along a row: dst[r * ldd + c] (uint16 elements,
     *          ldd a multiple of FP_TILE_COLS) for r < rows, c < fp_tile_ld(cols);
     *   pairs  pairs down the rows, a B tile: pairs[r2 * ldpairs + c] holds rows 2 r2 and
     *          2 r2 + 1 (a missing last odd row is 0) for r2 < ceil(rows / 2), c <
     * fp_tile_ld(cols). Columns cols and beyond are written as 0, so a reduction over ceil(cols /
     * 2) pairs sees exactly the cols values whatever the source's padding holds. Rounding to
     * nearest even as core/dtype.h does, except that an f32 denormal may become a zero of its sign
     * (vcvtneps2bf16); NaN stays NaN. Nothing else of dst or pairs is written. */
    void (*round_bf16)(int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst,
                       ptrdiff_t ldd, uint32_t *pairs, ptrdiff_t ldpairs);
    /* dp[r][c] = p[r][c] * (dp[r][c] - di[c]): the softmax gradient dS from P and dP. */
    void (*dsoftmax_cols)(int rows, int cols, const float *p, ptrdiff_t ldp, float *dp,
                          ptrdiff_t lddp, const float *di);
    /* x[r][c] *= f[r] for c < cols. */
    void (*scale_rows)(int rows, int cols, float *x, ptrdiff_t ldx, const float *f);

    /* dst[c * ldd + r] = element (r, c) of src, the 32-bit word at byte offset r * lds + 4 c, for
     * r < rows, c < cols: a transposed copy of f32 values or of bf16 pairs. src may be the
     * caller's tensor (any alignment; exactly those words are read), dst is a tile. */
    void (*transpose32)(int rows, int cols, const void *src, ptrdiff_t lds, uint32_t *dst,
                        ptrdiff_t ldd);

    /* n contiguous f16 / bf16 values to f32 (exact; NaN stays NaN). Any n, no padding needed. */
    void (*cvt_f16)(int n, const uint16_t *src, float *dst);
    void (*cvt_bf16)(int n, const uint16_t *src, float *dst);
    /* dst[i] = scale * src[i] rounded to f16 / bf16, bit for bit as core/dtype.h rounds (nearest
     * even, NaN to core/dtype.h's NaN, denormals kept). Any n, no padding needed. */
    void (*store_f16)(int n, const float *src, float scale, uint16_t *dst);
    void (*store_bf16)(int n, const float *src, float scale, uint16_t *dst);

    /* The decode kernel's streaming steps (flash_decode.c), for `heads` kv heads whose rows sit
     * side by side in the cache, so that K and V are read once and in the cache's order. q and o
     * are tiles, s and p a tile's columns, k and v[i] rows of exactly d elements (any alignment,
     * nothing past d read).
     *   dec_scores   one key: s[h * shs + r * lds] = sum over e < d of q[h * qhs + r * ldq + e] *
     *                k[h * khs + e], for h < heads, r < rows.
     *   dec_pv       o[h * ohs + r * ldo + e] += sum over i < keys of p[h * phs + r * ldp + i] *
     *                v[i][h * vhs + e] for e < d, added to o in the order i = 0, 1, ... (as gemm
     *                sums), for keys >= 1 (a key block; v[i] may lie in different pages); o's
     *                padding columns may be written.
     * The _bf16 forms take bf16 q, k, v and P, products by vdpbf16ps, and any number of keys,
     * with row pointers for K too; NULL when gemm_bf16 is NULL.
     *   dec_scores_bf16  s[h * shs + r * lds + i] = the dot product of q's row (h, r) with
     *                    k[i][h * khs ..], for i < keys; the sums in any order.
     *   dec_pv_bf16      dec_pv over keys >= 1 keys in pairs: with an odd count p[... + keys]
     *                    must be 0.
     * The _f16 forms take f16 k and v rows (row pointers, a key block) and f32 q and P, each row
     * converted to f32 as it is loaded; every table has them.
     *   dec_scores_f16   s[h * shs + r * lds + i] = dec_scores of key i, for i < keys; the
     *                    sums in any order.
     *   dec_pv_f16       dec_pv on the rows converted to f32, the same sums.
     * The _bf16_f32 forms are the _f16 forms on bf16 rows (widened by a shift, exact), for tables
     * without a bf16 dot product; NULL where a table has none (bf16 then converts rows key by key).
     * pf: NULL, or pf_rows addresses (pf[i], i < pf_rows) whose pf_bytes bytes each dec_pv and
     * the _bf16 and _f16 forms ask the caches for, in that order (a prefetch hint, never a read),
     * spread over their work: the rows the caller streams next, requested between the products
     * rather than in one burst that would stall on the core's outstanding misses. */
    void (*dec_scores)(int heads, int rows, int d, const float *q, ptrdiff_t qhs, ptrdiff_t ldq,
                       const float *k, ptrdiff_t khs, float *s, ptrdiff_t shs, ptrdiff_t lds);
    void (*dec_pv)(int heads, int rows, int d, int keys, const float *p, ptrdiff_t phs,
                   ptrdiff_t ldp, const float *const *v, ptrdiff_t vhs, float *o, ptrdiff_t ohs,
                   ptrdiff_t ldo, const char *const *pf, int pf_rows, size_t pf_bytes);
    void (*dec_scores_bf16)(int heads, int rows, int d, int keys, const uint16_t *q, ptrdiff_t qhs,
                            ptrdiff_t ldq, const uint16_t *const *k, ptrdiff_t khs, float *s,
                            ptrdiff_t shs, ptrdiff_t lds, const char *const *pf, int pf_rows,
                            size_t pf_bytes);
    void (*dec_pv_bf16)(int heads, int rows, int d, int keys, const uint16_t *p, ptrdiff_t phs,
                        ptrdiff_t ldp, const uint16_t *const *v, ptrdiff_t vhs, float *o,
                        ptrdiff_t ohs, ptrdiff_t ldo, const char *const *pf, int pf_rows,
                        size_t pf_bytes);
    fp_dec_scores_h16 *dec_scores_f16;
    fp_dec_pv_h16 *dec_pv_f16;
    fp_dec_scores_h16 *dec_scores_bf16_f32;
    fp_dec_pv_h16 *dec_pv_bf16_f32;

    /* The decode's per-row softmax pieces, over `rows` rows of n scores (lds apart, lds a multiple
     * of 8 and at least n rounded up to 8): NULL where a table has none (flash_decode.c then works
     * a row at a time through exp2_cols).
     *   dec_row_max    mx[r] = the maximum of row r's n scores, NaN when one of them is NaN.
     *   dec_exp2_rows  s[r][c] = exp2(s[r][c] * mul - sub[r]) (the multiply and the subtract
     *                  rounded apart, as exp2_cols does) for c < n, sum[r] = their sum in any
     *                  order; columns from n to the next multiple of 8 may be written. */
    void (*dec_row_max)(int rows, int n, const float *s, ptrdiff_t lds, float *mx);
    void (*dec_exp2_rows)(int rows, int n, float *s, ptrdiff_t lds, float mul, const float *sub,
                          float *sum);

    /* Block size, kept beside the kernels as BLIS keeps its own: the forward's query block
     * (queries a task holds against each key block, a multiple of FP_TILE_COLS), 0 for
     * flash_fwd.c's default. */
    int fwd_block_q;
    /* With fwd_block_q: 1 stages the forward's f32 K and V once per thread and kv head
     * (fp_kv_stage, rows fp_tile_ld_sets apart) for every task to read in place (AVX2, and isa.c
     * on Intel cores); 0 copies each key block into tiles at that stride once per task of
     * several sub-blocks, and reads f32 in place in 64-query tasks (the AVX-512 tables as
     * written, flash_fwd.c). */
    int fwd_stage_f32;
    /* 1: the forward and backward take bf16 inputs through the f32 products (converted as on
     * tables without gemm_bf16), where gemm_bf16 runs slower than that (isa.c sets it for Intel's
     * cores under "auto"); decode keeps its bf16 steps for units of few rows and widens the
     * product-bound ones (flash_decode.c). 0 in every table as written. */
    int bf16_as_f32;

    /* The forward's fused steps; every table as written has them.
     * gemm_rs       C[m x n] = diag(f) C + A[m x k] B[k x n], f32: gemm with accumulate = 1 whose
     *               C rows are first multiplied by f[row] (rounded once, as scale_rows would), so
     *               O's rescale rides on the load of the accumulators in O += P V. The same bits
     *               as scale_rows then gemm.
     * softmax_cols  one key block of the online softmax over a score tile (keys down the rows,
     *               cols columns, a multiple of FP_TILE_COLS): per column c, the block maximum as
     *               col_max takes it (from -inf), bm = mul * it; where bm > m[c]: alpha[c] =
     *               2^(m[c] - bm) by the table's exp2 and m[c] = bm, else alpha[c] = 1; then s as
     *               exp2_cols makes it with sub[c] = m[c] (0 while m[c] = -inf), and l[c] =
     *               l[c] * alpha[c] + the column's sum. core/online_softmax.h's update in exp2
     *               form, the rescale factor by the table's exp2 instead of libm's exp2f. Returns
     *               nonzero when some alpha[c] != 1. m, l and alpha are padded as the tile. */
    void (*gemm_rs)(int m, int n, int k, const float *a, ptrdiff_t rsa, ptrdiff_t csa,
                    const float *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, const float *f);
    int (*softmax_cols)(int rows, int cols, float *s, ptrdiff_t lds, float mul, float *m, float *l,
                        float *alpha);
} fp_ukernels;

/* The tables this build contains: which ones depends on the target architecture and the
 * compiler's flags (CMakeLists.txt defines FLASHPORT_UK_<ISA> for each file it builds). */
extern const fp_ukernels fp_ukernels_scalar;
#if defined(FLASHPORT_UK_AVX2)
extern const fp_ukernels fp_ukernels_avx2;
#endif
#if defined(FLASHPORT_UK_AVX512)
extern const fp_ukernels fp_ukernels_avx512;
#endif
#if defined(FLASHPORT_UK_AVX512BF16)
extern const fp_ukernels fp_ukernels_avx512bf16;
#endif
#if defined(FLASHPORT_UK_NEON)
extern const fp_ukernels fp_ukernels_neon;
#endif

/* The table this process runs, chosen once: FLASHPORT_CPU_ISA if set, else the best the CPU
 * supports. When FLASHPORT_CPU_ISA names an unknown ISA (FLASHPORT_ERR_INVALID_VALUE) or one that
 * this build or this CPU cannot run (FLASHPORT_ERR_UNSUPPORTED_FEATURE), returns that status with
 * the error set, on every call. *why says how the table was chosen (for FLASHPORT_LOG). */
flashport_status fp_cpu_ukernels(const fp_ukernels **uk, const char **why);

/* The table spelled `name` when this build has it and this CPU runs it, else NULL (for tests,
 * which check every runnable table in one process). */
const fp_ukernels *fp_cpu_ukernels_find(const char *name);

#endif /* FLASHPORT_BACKENDS_CPU_UKERNEL_H */
