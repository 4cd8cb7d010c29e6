/*
 * Tile loads, stores and packs of the CPU flash kernels (contract in flash_tile.h), and their
 * per-thread scratch. Portable C: contiguous rows are copied (f32) or converted by the micro-kernel
 * table's vector converters (f16, bf16); strided rows and transposes take plain loops, written
 * so that the source is read row by row.
 * Target: any C11 compiler. Known differences from the reference: none (conversions are exact,
 * stores round to nearest even as core/dtype.h does).
 */
#include "backends/cpu/flash_tile.h"

#include "core/dtype.h"
#include "core/geometry.h"
#include "core/mask.h"

#include <stdlib.h>
#include <string.h>

static inline const uint16_t *u16_at(const fp_block *x, int64_t i)
{
    return (const uint16_t *)x->data + x->off + i;
}

static inline const float *f32_at(const fp_block *x, int64_t i)
{
    return (const float *)x->data + x->off + i;
}

void fp_tile_load(float *dst, int ld, const fp_block *x, int rows, int d, const fp_ukernels *uk)
{
    for (int r = 0; r < rows; r++) {
        float *out = dst + (ptrdiff_t)r * ld;
        const int64_t o = r * x->rs;
        if (x->cs == 1) {
            switch (x->dtype) {
            case FLASHPORT_F16:
                uk->cvt_f16(d, u16_at(x, o), out);
                break;
            case FLASHPORT_BF16:
                uk->cvt_bf16(d, u16_at(x, o), out);
                break;
            default:
                memcpy(out, f32_at(x, o), sizeof(float) * (size_t)d);
                break;
            }
            continue;
        }
        for (int c = 0; c < d; c++)
            out[c] = fp_load(x->data, x->off + o + c * x->cs, x->dtype);
    }
}

void fp_tile_load_t(float *dst, int ld, const fp_block *x, int rows, int d, const fp_ukernels *uk)
{
    if (x->dtype == FLASHPORT_F32 && x->cs == 1) {
        uk->transpose32(rows, d, f32_at(x, 0), (ptrdiff_t)x->rs * (ptrdiff_t)sizeof(float),
                        (uint32_t *)dst, ld);
    } else {
        /* Bands of 16 source rows: each source row is read in order and each destination row
         * gets 64 contiguous bytes per band. Walking one whole column at a time instead strides
         * through the source by the row pitch, which for power-of-two head counts maps every
         * access to one L1 set. */
        enum { BAND = 16 };
        for (int r0 = 0; r0 < rows; r0 += BAND) {
            const int nr = rows - r0 < BAND ? rows - r0 : BAND;
            for (int c = 0; c < d; c++) {
                float *restrict out = dst + (ptrdiff_t)c * ld + r0;
                const int64_t o = r0 * x->rs + c * x->cs;
                for (int r = 0; r < nr; r++)
                    out[r] = fp_load(x->data, x->off + o + r * x->rs, x->dtype);
            }
        }
    }
    for (int c = 0; c < d; c++)
        memset(dst + (ptrdiff_t)c * ld + rows, 0, sizeof(float) * (size_t)(ld - rows));
}

void fp_tile_store(const fp_block *x, const float *src, int ld, int rows, int d, float scale,
                   const fp_ukernels *uk)
{
    for (int r = 0; r < rows; r++) {
        const float *s = src + (ptrdiff_t)r * ld;
        const int64_t o = x->off + r * x->rs;
        if (x->cs == 1 && x->dtype != FLASHPORT_F32) {
            (x->dtype == FLASHPORT_F16 ? uk->store_f16 : uk->store_bf16)(d, s, scale,
                                                                         (uint16_t *)x->data + o);
            continue;
        }
        if (x->cs == 1) { /* f32 rows: a loop the compiler vectorizes, not fp_store's switch */
            float *restrict out = (float *)x->data + o;
            for (int c = 0; c < d; c++)
                out[c] = scale * s[c];
            continue;
        }
        for (int c = 0; c < d; c++)
            fp_store(x->data, o + c * x->cs, x->dtype, scale * s[c]);
    }
}

void fp_tile_store_t(const fp_block *x, const float *src, int ld, int rows, int d, float scale,
                     const fp_ukernels *uk)
{
    if (x->cs == 1 &&
        (x->dtype == FLASHPORT_F32 || x->dtype == FLASHPORT_F16 || x->dtype == FLASHPORT_BF16)) {
        /* Squares of 16 x 16 transposed by the micro-kernel into t, then stored a row of 16 at a
         * time (the f16 / bf16 rows through store_f16 / store_bf16, which round as fp_store). */
        _Alignas(64) float t[FP_TILE_COLS * FP_TILE_COLS];
        const size_t es = flashport_dtype_size(x->dtype);
        for (int r0 = 0; r0 < rows; r0 += FP_TILE_COLS)
            for (int e0 = 0; e0 < d; e0 += FP_TILE_COLS) {
                const int nr = rows - r0 < FP_TILE_COLS ? rows - r0 : FP_TILE_COLS;
                const int ne = d - e0 < FP_TILE_COLS ? d - e0 : FP_TILE_COLS;
                uk->transpose32(ne, nr, src + (ptrdiff_t)e0 * ld + r0,
                                (ptrdiff_t)ld * (ptrdiff_t)sizeof(float), (uint32_t *)t,
                                FP_TILE_COLS);
                for (int r = 0; r < nr; r++) {
                    const float *restrict row = t + r * FP_TILE_COLS;
                    char *out = (char *)x->data + (size_t)(x->off + (r0 + r) * x->rs + e0) * es;
                    if (x->dtype == FLASHPORT_F16) {
                        uk->store_f16(ne, row, scale, (uint16_t *)(void *)out);
                    } else if (x->dtype == FLASHPORT_BF16) {
                        uk->store_bf16(ne, row, scale, (uint16_t *)(void *)out);
                    } else {
                        float *restrict o = (float *)(void *)out;
                        for (int e = 0; e < ne; e++)
                            o[e] = scale * row[e];
                    }
                }
            }
        return;
    }
    void *base = x->data;
    for (int r = 0; r < rows; r++) {
        const int64_t o = x->off + r * x->rs;
        for (int c = 0; c < d; c++)
            fp_store(base, o + c * x->cs, x->dtype, scale * src[(ptrdiff_t)c * ld + r]);
    }
}

void fp_tile_pairs_t(uint32_t *dst, int ld, const fp_block *x, int rows, int d,
                     const fp_ukernels *uk)
{
    const int pairs = (d + 1) / 2;
    if (x->cs == 1) {
        /* Whole pairs as 32-bit words; an odd last element alone, so no row is read past d. */
        uk->transpose32(rows, d / 2, u16_at(x, 0), (ptrdiff_t)x->rs * (ptrdiff_t)sizeof(uint16_t),
                        dst, ld);
        if (d % 2)
            for (int r = 0; r < rows; r++)
                dst[(ptrdiff_t)(pairs - 1) * ld + r] = *u16_at(x, r * x->rs + d - 1);
    } else {
        for (int r = 0; r < rows; r++) {
            const uint16_t *row = u16_at(x, r * x->rs);
            for (int p = 0; p < pairs; p++) {
                const uint32_t lo = row[2 * p * x->cs];
                const uint32_t hi = 2 * p + 1 < d ? row[(2 * p + 1) * x->cs] : 0u;
                dst[(ptrdiff_t)p * ld + r] = lo | hi << 16;
            }
        }
    }
    for (int p = 0; p < pairs; p++)
        memset(dst + (ptrdiff_t)p * ld + rows, 0, sizeof(uint32_t) * (size_t)(ld - rows));
}

void fp_tile_pairs_rows(uint32_t *dst, int ld, const fp_block *x, int rows, int d,
                        const fp_ukernels *uk)
{
    for (int p = 0; 2 * p < rows; p++) {
        uint32_t *restrict out = dst + (ptrdiff_t)p * ld;
        const uint16_t *even = u16_at(x, 2 * p * x->rs);
        const uint16_t *odd = 2 * p + 1 < rows ? u16_at(x, (2 * p + 1) * x->rs) : NULL;
        if (x->cs == 1) {
            uk->interleave_bf16(d, even, odd, out);
            continue;
        }
        for (int c = 0; c < d; c++)
            out[c] = (uint32_t)even[c * x->cs] | (odd ? (uint32_t)odd[c * x->cs] << 16 : 0u);
    }
}

void fp_tile_load_bf16(uint16_t *dst, int ld, const fp_block *x, int rows, int d)
{
    for (int r = 0; r < rows; r++) {
        uint16_t *out = dst + (ptrdiff_t)r * ld;
        const uint16_t *row = u16_at(x, r * x->rs);
        if (x->cs == 1)
            memcpy(out, row, sizeof(uint16_t) * (size_t)d);
        else
            for (int c = 0; c < d; c++)
                out[c] = row[c * x->cs];
        if (d % 2)
            out[d] = 0;
    }
}

size_t fp_kv_stage_floats(int64_t capacity, int64_t d)
{
    const size_t blocks = (size_t)((capacity + FP_STAGE_ROWS - 1) / FP_STAGE_ROWS);
    return 2 * (size_t)capacity * (size_t)fp_tile_ld_sets(d) +
           (blocks + sizeof(float) - 1) / sizeof(float);
}

fp_kv_stage fp_kv_stage_init(float *mem, int64_t capacity, int64_t d)
{
    fp_kv_stage st;
    st.ld = fp_tile_ld_sets(d);
    st.capacity = capacity;
    st.k = mem;
    st.v = mem + (size_t)capacity * (size_t)st.ld;
    st.done = (unsigned char *)(st.v + (size_t)capacity * (size_t)st.ld);
    st.b = st.kvh = -1;
    return st;
}

int fp_kv_stage_ready(const fp_kv_stage *st, int64_t b, int64_t kvh, int64_t j0)
{
    return st->b == b && st->kvh == kvh && j0 < st->capacity && st->done[j0 / FP_STAGE_ROWS];
}

void fp_kv_stage_rows(fp_kv_stage *st, int64_t b, int64_t kvh, int64_t nk, int64_t j0, int n, int d,
                      const fp_ukernels *uk, fp_block *kb, fp_block *vb)
{
    if (st->b != b || st->kvh != kvh) {
        memset(st->done, 0, (size_t)((st->capacity + FP_STAGE_ROWS - 1) / FP_STAGE_ROWS));
        st->b = b;
        st->kvh = kvh;
    }
    /* Whole blocks of the fixed grid, so that a later range starting anywhere finds them. */
    for (int64_t g = j0 / FP_STAGE_ROWS; g * FP_STAGE_ROWS < j0 + n; g++) {
        if (st->done[g])
            continue;
        const int64_t r0 = g * FP_STAGE_ROWS;
        const int rows = (int)(nk - r0 < FP_STAGE_ROWS ? nk - r0 : FP_STAGE_ROWS);
        fp_block x = *kb;
        x.off += (r0 - j0) * x.rs;
        fp_tile_load(st->k + (size_t)r0 * (size_t)st->ld, st->ld, &x, rows, d, uk);
        x = *vb;
        x.off += (r0 - j0) * x.rs;
        fp_tile_load(st->v + (size_t)r0 * (size_t)st->ld, st->ld, &x, rows, d, uk);
        /* V's padding columns up to the next FP_TILE_COLS, which a product with V as its B tile
         * reads (ukernel.h), as zeros: the stage's memory is not cleared when allocated. */
        for (int r = 0; r < rows && fp_tile_ld(d) > d; r++)
            memset(st->v + (size_t)(r0 + r) * (size_t)st->ld + d, 0,
                   sizeof(float) * (size_t)(fp_tile_ld(d) - d));
        st->done[g] = 1;
    }
    const fp_block k = {st->k, FLASHPORT_F32, j0 * st->ld, st->ld, 1};
    const fp_block v = {st->v, FLASHPORT_F32, j0 * st->ld, st->ld, 1};
    *kb = k;
    *vb = v;
}

void fp_block_prefetch(const fp_block *x, int rows, int d)
{
    if (x->cs != 1)
        return;
    const size_t es = flashport_dtype_size(x->dtype);
    const char *base = (const char *)x->data + (size_t)x->off * es;
    for (int r = 0; r < rows; r++) {
        const char *row = base + (ptrdiff_t)(r * x->rs) * (ptrdiff_t)es;
        for (size_t b = 0; b < (size_t)d * es; b += 64)
            __builtin_prefetch(row + b, 0, 2);
    }
}

int fp_block_finite(const fp_block *x, int rows, int d)
{
    /* By the exponent bits: an all-ones exponent is an infinity or a NaN in every dtype here.
     * One loop per dtype, so that the compiler vectorizes the contiguous rows. */
    uint32_t bad = 0;
    const int wide = x->dtype == FLASHPORT_F32;
    const uint16_t e16 = x->dtype == FLASHPORT_F16 ? 0x7c00u : 0x7f80u;
    for (int r = 0; r < rows && !bad; r++) {
        const int64_t o = x->off + r * x->rs;
        if (wide && x->cs == 1) {
            const float *row = (const float *)x->data + o;
            for (int c = 0; c < d; c++) {
                uint32_t u;
                memcpy(&u, row + c, sizeof u);
                bad |= (u & 0x7f800000u) == 0x7f800000u;
            }
        } else if (!wide && x->cs == 1) {
            const uint16_t *row = (const uint16_t *)x->data + o;
            for (int c = 0; c < d; c++)
                bad |= (row[c] & e16) == e16;
        } else {
            for (int c = 0; c < d; c++) {
                const int64_t i = o + c * x->cs;
                if (wide) {
                    uint32_t u;
                    memcpy(&u, (const float *)x->data + i, sizeof u);
                    bad |= (u & 0x7f800000u) == 0x7f800000u;
                } else {
                    bad |= (((const uint16_t *)x->data)[i] & e16) == e16;
                }
            }
        }
    }
    return !bad;
}

void fp_tile_fill_masked(float *s, int ld, int n, int m, int64_t i0, int64_t j0, int64_t nq,
                         int64_t nk, int64_t left, int64_t right, float value)
{
    for (int r = 0; r < n; r++) {
        int64_t lo, hi;
        fp_geom_rows_for_keys(j0 + r, j0 + r + 1, nq, nk, left, right, &lo, &hi);
        lo = lo < i0 ? 0 : lo - i0 > m ? m : lo - i0;
        hi = hi < i0 ? 0 : hi - i0 > m ? m : hi - i0;
        hi = hi < lo ? lo : hi;
        float *row = s + (ptrdiff_t)r * ld;
        for (int64_t x = 0; x < lo; x++)
            row[x] = value;
        for (int64_t x = hi; x < m; x++)
            row[x] = value;
    }
}

int fp_key_bands(int64_t i0, int m, int64_t j0, int n, int64_t nq, int64_t nk, int64_t left,
                 int64_t right, fp_key_band *band)
{
    /* Each group's rows [rlo, rhi): core/mask.h's key range of its queries, clipped to the block.
     */
    const int groups = (m + FP_TILE_COLS - 1) / FP_TILE_COLS;
    int rlo[FP_BAND_GROUPS], rhi[FP_BAND_GROUPS], cut[2 * FP_BAND_GROUPS + 2], cuts = 0;
    cut[cuts++] = 0;
    cut[cuts++] = n;
    for (int g = 0; g < groups; g++) {
        const int end = (g + 1) * FP_TILE_COLS < m ? (g + 1) * FP_TILE_COLS : m;
        int64_t lo, hi;
        fp_mask_block_range(i0 + g * FP_TILE_COLS, i0 + end, nq, nk, left, right, &lo, &hi);
        lo = lo - j0 < 0 ? 0 : lo - j0 > n ? n : lo - j0;
        hi = hi - j0 < lo ? lo : hi - j0 > n ? n : hi - j0;
        rlo[g] = (int)lo;
        rhi[g] = (int)hi;
        cut[cuts++] = rlo[g];
        cut[cuts++] = rhi[g];
    }
    for (int i = 1; i < cuts; i++) /* insertion sort of at most 2 groups + 2 ends */
        for (int j = i; j > 0 && cut[j - 1] > cut[j]; j--) {
            const int t = cut[j];
            cut[j] = cut[j - 1];
            cut[j - 1] = t;
        }
    /* Between two neighbouring ends a group sees all rows or none. */
    int bands = 0;
    for (int i = 0; i + 1 < cuts; i++) {
        const int a = cut[i], rows = cut[i + 1] - a;
        int g0 = groups, g1 = -1;
        for (int g = 0; g < groups && rows > 0; g++)
            if (rlo[g] <= a && rhi[g] >= a + rows) {
                g0 = g < g0 ? g : g0;
                g1 = g;
            }
        if (g1 < 0)
            continue;
        const fp_key_band x = {a, rows, g0 * FP_TILE_COLS, (g1 + 1 - g0) * FP_TILE_COLS};
        band[bands++] = x;
    }
    return bands;
}

float *fp_scratch_alloc(int threads, size_t floats_per_thread, size_t zeroed, size_t *slice_floats)
{
    /* A zero-size request (no keys, say) still gets one line per thread: NULL means failure. */
    size_t slice = (floats_per_thread + 15) / 16 * 16;
    if (slice == 0)
        slice = 16;
    if (threads < 1 || slice > SIZE_MAX / sizeof(float) / (size_t)threads)
        return NULL;
    size_t bytes = slice * sizeof(float) * (size_t)threads;
    float *buf = aligned_alloc(64, bytes);
    if (!buf)
        return NULL;
    for (int t = 0; t < threads && zeroed > 0; t++)
        memset(buf + slice * (size_t)t, 0, sizeof(float) * (zeroed < slice ? zeroed : slice));
    *slice_floats = slice;
    return buf;
}

void fp_scratch_free(float *scratch)
{
    free(scratch);
}
