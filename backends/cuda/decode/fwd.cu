/*
 * The decode forward's launcher: whether a forward goes to the decode kernel
 * (fp_cuda_decode_wanted), the paged-cache precondition, and the head dim's family
 * (fp_decode_fwd_family, sm80/common.cuh) launched.
 *
 * The kernel is in decode/fwd.cuh (algorithm, configurations, differences from the reference),
 * and each head dim's family, f16 and bf16, is instantiated by a small file of its own
 * (decode/inst/fwd_d64.cu, fwd_d128.cu, fwd_d256.cu). This file sees only the families'
 * declarations, so that it and each instantiation file compile alone too
 * (FLASHPORT_CUDA_UNITY=OFF, backends/cuda/CMakeLists.txt).
 */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/dispatch.cuh"
#include "backends/cuda/sm80/common.cuh"

#include "core/problem.h"

#include <stdlib.h>

/* Whether a forward goes to the decode kernel: a paged cache (only it reads one), or few query
 * rows per kv head (Nq * H / Hkv <= FP_DECODE_MAX_ROWS) or few tokens (Nq <= FP_DECODE_MAX_NQ),
 * where the other kernels' query tiles would be mostly empty and every query head would re-read
 * its kv head: the decode kernel reads K and V once per 32 packed rows, they once per query
 * head, so with few tokens it reads less at any group size (docs/performance.md#decode-h200 has
 * the timings behind the bound). FLASHPORT_CUDA_DECODE (read at each call, for tests and A/B
 * timings): 0 never for dense caches, 1 for every call. */
enum { FP_DECODE_MAX_ROWS = 64, FP_DECODE_MAX_NQ = 8 };

extern "C" int fp_cuda_decode_wanted(const fp_problem *p)
{
    if (p->block_table)
        return 1;
    const char *force = getenv("FLASHPORT_CUDA_DECODE");
    if (force && *force)
        return atoi(force) != 0;
    return p->seqlen_q * (p->heads / p->kv_heads) <= FP_DECODE_MAX_ROWS ||
           p->seqlen_q <= FP_DECODE_MAX_NQ;
}

extern "C" flashport_status fp_cuda_decode_forward(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                   void *ws, size_t *query)
{
    if (p->block_table && p->page_size % 16 != 0)
        return fp_cuda_refuse(FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                              "a paged KV cache needs a page size that is a multiple of 16 on "
                              "CUDA (got %lld)",
                              (long long)p->page_size);
    fp_sm80_args a;
    fp_sm80_fill_args(p, &a);
    return fp_cuda_dispatch<FP_DECODE_DK_CLASSES>(p->dtype, p->head_dim, [&](auto k) {
        using K = decltype(k);
        return fp_decode_fwd_family<typename K::T, K::DK>::run(ctx, p, a, ws, query);
    });
}
