/*
 * Attention geometry shared by every backend (C, CUDA, HIP, OpenCL C): where a sequence of a batch
 * lies, which key blocks a block of query rows visits, which query rows a block of keys feeds. The
 * window rule itself (bottom-right aligned, docs/semantics.md) and the per-element and
 * whole-block visibility tests are core/mask.h; this header turns them into the block ranges
 * that kernels loop over, so that no backend re-derives them.
 *
 * Blocks are numbered on the fixed grid 0, bn, 2 bn, ... of the sequence (a block may run past
 * its end: kernels zero-fill or bound the last one). Ranges are half-open; an empty range has
 * begin == end == 0. Tested in tests/test_geometry.c against a brute-force scan of
 * fp_mask_visible, including empty sequences, Nq != Nk, windows wider than the sequence and
 * fully masked blocks.
 */
#ifndef FLASHPORT_CORE_GEOMETRY_H
#define FLASHPORT_CORE_GEOMETRY_H

#include "fp_inline.h"
#include "mask.h"

#include <stdint.h>

/* One sequence of a batch: its first packed token and length, for the queries and the keys. */
typedef struct fp_seq {
    int64_t q_start, nq;
    int64_t k_start, nk;
} fp_seq;

/* Sequence b of a dense (cu_q == NULL: lengths nq, nk, starts 0) or varlen batch (cu_q, cu_k:
 * B + 1 int32 offsets in the memory the caller runs in, host or device). b is an int: a varlen
 * batch indexes int32 offsets, and 32-bit indexing is what the GPU kernels compile best. */
FP_INLINE fp_seq fp_seq_lookup(const FP_GLOBAL int32_t *cu_q, const FP_GLOBAL int32_t *cu_k,
                               int64_t nq, int64_t nk, int b)
{
    fp_seq s;
    if (cu_q) {
        const int32_t q0 = cu_q[b], k0 = cu_k[b];
        s.q_start = q0;
        s.k_start = k0;
        s.nq = cu_q[b + 1] - q0;
        s.nk = cu_k[b + 1] - k0;
    } else {
        s.q_start = 0;
        s.k_start = 0;
        s.nq = nq;
        s.nk = nk;
    }
    return s;
}

/* The keys sequence b uses: seqused_k[b] clamped to [0, nk], nk being the sequence's key
 * capacity (dense: Nk; varlen: its cu_seqlens_k length; paged: block_table_stride * page_size);
 * nk itself when seqused_k is NULL. Host backends get values that core/validate.c has checked;
 * GPU kernels never read seqused_k back on the host, so the clamp is what keeps a bad value from
 * reading past the cache (include/flashport.h). */
FP_INLINE int64_t fp_seq_used_keys(const FP_GLOBAL int32_t *seqused_k, int b, int64_t nk)
{
    if (!seqused_k)
        return nk;
    const int64_t u = seqused_k[b];
    return u < 0 ? 0 : (u > nk ? nk : u);
}

/* fp_seq_lookup, then the sequence's key count cut to the keys it uses (fp_seq_used_keys). The
 * window, causal mask and ALiBi then align to the used keys (bottom-right). */
FP_INLINE fp_seq fp_seq_lookup_used(const FP_GLOBAL int32_t *cu_q, const FP_GLOBAL int32_t *cu_k,
                                    const FP_GLOBAL int32_t *seqused_k, int64_t nq, int64_t nk,
                                    int b)
{
    fp_seq s = fp_seq_lookup(cu_q, cu_k, nq, nk, b);
    s.nk = fp_seq_used_keys(seqused_k, b, s.nk);
    return s;
}

/* Paged KV cache: the physical page that holds logical key t of sequence b, or -1 when the
 * block-table entry lies outside [0, num_pages) (GPU kernels then treat that page's keys as
 * masked and never dereference it; host backends have refused such a table). The key is row
 * t % page_size of that page. */
FP_INLINE int64_t fp_paged_page(const FP_GLOBAL int32_t *block_table, int64_t bt_stride,
                                int64_t page_size, int64_t num_pages, int b, int64_t t)
{
    const int64_t e = block_table[(int64_t)b * bt_stride + t / page_size];
    return (e < 0 || e >= num_pages) ? -1 : e;
}

/* Key blocks [*nb0, *nb1) of bn keys that query rows [i0, i1) see: fp_mask_block_range rounded
 * out to whole blocks; empty (0, 0) when the rows see no key. Block indices are ints (a
 * sequence has fewer than 2^31 blocks): the GPU kernels keep them in 32-bit registers. */
FP_INLINE void fp_geom_key_blocks(int64_t i0, int64_t i1, int64_t nq, int64_t nk, int64_t left,
                                  int64_t right, int bn, int *nb0, int *nb1)
{
    int64_t lo, hi;
    fp_mask_block_range(i0, i1, nq, nk, left, right, &lo, &hi);
    *nb0 = 0;
    *nb1 = 0;
    if (hi > lo) {
        *nb0 = (int)(lo / bn);
        *nb1 = (int)((hi + bn - 1) / bn);
    }
}

/* Query rows [*i0, *i1) that see at least one key of [j0, j1): the window rule solved for the
 * row. Key j is visible from row i iff j - shift - right <= i <= j - shift + left, with
 * shift = nk - nq; the result is clipped to [0, nq) and may be empty (*i1 <= *i0). */
FP_INLINE void fp_geom_rows_for_keys(int64_t j0, int64_t j1, int64_t nq, int64_t nk, int64_t left,
                                     int64_t right, int64_t *i0, int64_t *i1)
{
    const int64_t shift = nk - nq;
    int64_t lo = right < 0 ? 0 : j0 - shift - right;
    int64_t hi = left < 0 ? nq : j1 - 1 - shift + left + 1;
    *i0 = lo < 0 ? 0 : lo;
    *i1 = hi > nq ? nq : hi;
}

/* Query blocks [*mb0, *mb1) of bm rows that feed keys [j0, j1) (the backward's dK / dV loop):
 * fp_geom_rows_for_keys rounded out to whole blocks; empty (0, 0) when no row sees the keys. */
FP_INLINE void fp_geom_query_blocks(int64_t j0, int64_t j1, int64_t nq, int64_t nk, int64_t left,
                                    int64_t right, int bm, int *mb0, int *mb1)
{
    int64_t i0, i1;
    fp_geom_rows_for_keys(j0, j1, nq, nk, left, right, &i0, &i1);
    *mb0 = 0;
    *mb1 = 0;
    if (i1 > i0) {
        *mb0 = (int)(i0 / bm);
        *mb1 = (int)((i1 + bm - 1) / bm);
    }
}

#endif /* FLASHPORT_CORE_GEOMETRY_H */
