/*
 * The sm90 forward's launcher: which problems the sm90 path declines (fp_cuda_sm90_forward sets
 * *declined and the caller takes the sm80 path), the grid (one block per tile, or the persistent
 * kernel: fp_sm90_fwd_grid_of) and the head dim's family (fp_sm90_fwd_family,
 * sm90/fwd_config.cuh) launched for the others; and the driver entry point the sm90 path needs.
 *
 * The kernel is in sm90/fwd.cuh (algorithm, configurations, differences from the reference),
 * and each head dim's family is instantiated by a small file of its own (sm90/inst/fwd_d64.cu
 * ... fwd_d256.cu, f16 and bf16; fwd_d128_e4m3.cu, fwd_d256_e4m3.cu, e4m3 inputs). This file
 * sees only the families' declarations, so that it and each instantiation file compile alone
 * too (FLASHPORT_CUDA_UNITY=OFF, backends/cuda/CMakeLists.txt).
 */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/dispatch.cuh"
#include "backends/cuda/sm90/fwd_config.cuh"

#include "core/problem.h"

#include <stdlib.h>

/* The grid for a problem of `tiles` tiles over `pairs` (head, batch x split) pairs, whose key
 * blocks number key_blocks (the most one tile visits), inputs of eb bytes. The
 * persistent kernel overlaps a block's next tile's loads with its current tile's last products
 * and its store, and no block is launched or retired between tiles; its loop over tiles costs
 * the consumers' main loop registers, so it pays only where tiles are short and outnumber the
 * SMs: at most 8 key blocks where every tile costs the same, at most FP_SM90_CLAIM_KEYS keys
 * (Nk) where costs differ (causal masks, windows, varlen). There the blocks claim tiles as they
 * free up, the costliest of a chunk first, so that they end together; a chunk holds the pairs whose
 * K and V fit in FP_SM90_CHUNK_BYTES of L2, so that the query blocks of a pair, which run at
 * different times, find them there. FLASHPORT_CUDA_SM90_FWD_GRID=N (read at each call, for tests
 * and A/B timings) forces the persistent kernel on a grid of at most N blocks for every problem, 0
 * the kernel of one block per tile; FLASHPORT_CUDA_SM90_FWD_CHUNK=C forces chunks of C pairs,
 * FLASHPORT_CUDA_SM90_FWD_HANDOFF=0 turns the consumers' turn handoff between tiles off; any
 * other value (e.g. "auto") leaves the choice to the rule. */
#define FP_SM90_CHUNK_BYTES (16u << 20)
#define FP_SM90_CLAIM_KEYS  2048
long long fp_sm90_env_count(const char *name)
{
    const char *v = getenv(name);
    char *end = NULL;
    const long long n = v ? strtoll(v, &end, 10) : -1;
    return v && end != v && *end == '\0' && n >= 0 ? n : -1;
}

fp_sm90_fwd_grid fp_sm90_fwd_grid_of(const fp_cuda_ctx *ctx, const fp_problem *p, int64_t tiles,
                                     int64_t pairs, int64_t key_blocks, int64_t eb)
{
    const bool uniform = p->window_left < 0 && p->window_right < 0 && !p->varlen && !p->seqused_k;
    fp_sm90_fwd_grid g;
    const long long force = fp_sm90_env_count("FLASHPORT_CUDA_SM90_FWD_GRID");
    if (force >= 0)
        g.blocks = force < tiles ? force : tiles;
    else
        g.blocks =
            tiles > ctx->sm_count && (uniform ? key_blocks <= 8 : p->seqlen_k <= FP_SM90_CLAIM_KEYS)
                ? ctx->sm_count
                : 0;
    g.dynamic = g.blocks > 0 && !uniform;
    const int64_t group = p->heads / p->kv_heads;
    const int64_t pair_bytes = 2 * p->seqlen_k * p->head_dim * eb / (group > 0 ? group : 1);
    const long long chunk = fp_sm90_env_count("FLASHPORT_CUDA_SM90_FWD_CHUNK");
    int64_t c = chunk > 0   ? chunk
                : g.dynamic ? (int64_t)FP_SM90_CHUNK_BYTES / (pair_bytes > 0 ? pair_bytes : 1)
                            : 1;
    g.chunk = (int)(c < 1 ? 1 : c > pairs ? pairs : c);
    return g;
}

/* The driver's cuTensorMapEncodeTiled, through the runtime (the plugin links no libcuda). */
extern "C" void fp_cuda_sm90_init(fp_cuda_ctx *ctx)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        fn = NULL;
    (void)cudaGetLastError();
    ctx->encode_tiled = fn;
}

extern "C" flashport_status fp_cuda_sm90_forward(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                 const char *why, const char **declined, void *ws,
                                                 size_t *query)
{
    *declined = NULL;
    if (query)
        *query = 0;
    const bool fp8 = p->dtype == FLASHPORT_FP8_E4M3;
    if (p->block_table || p->seqused_k || (!fp8 && fp_cuda_decode_wanted(p))) {
        *declined = p->block_table ? "a paged KV cache runs on the decode kernel"
                    : p->seqused_k ? "the sm90 path does not read seqused_k"
                                   : "decode shapes run on the decode kernel";
        return FLASHPORT_OK;
    }
    if (ctx->cc_major != 9 || ctx->cc_minor != 0) {
        *declined = "the sm90 path needs compute capability 9.0";
        return FLASHPORT_OK;
    }
    if (!ctx->encode_tiled) {
        *declined = "the driver has no cuTensorMapEncodeTiled";
        return FLASHPORT_OK;
    }
    if (ctx->smem_optin < fp_sm90_fwd_d256::SMEM) {
        *declined = "the sm90 kernels need more shared memory per block than this device allows";
        return FLASHPORT_OK;
    }
    if (p->dtype == FLASHPORT_FP8_E5M2) {
        *declined = "the sm90 path has fp8 kernels for e4m3 only";
        return FLASHPORT_OK;
    }
    if (fp8) /* e4m3 inputs; the class's element type is o's */
        return fp_cuda_dispatch<FP_SM90_FWD_E4M3_DK_CLASSES>(p->o_dtype, p->head_dim, [&](auto k) {
            typedef decltype(k) K;
            return fp_sm90_fwd_family<uint8_t, typename K::T, K::DK>::run(ctx, p, why, declined, ws,
                                                                          query);
        });
    return fp_cuda_dispatch<FP_SM90_FWD_DK_CLASSES>(p->dtype, p->head_dim, [&](auto k) {
        typedef decltype(k) K;
        return fp_sm90_fwd_family<typename K::T, typename K::T, K::DK>::run(ctx, p, why, declined,
                                                                            ws, query);
    });
}
