/*
 * Internal interface of the CUDA plugin (backends/cuda/): the per-handle context, error and log
 * helpers over the core's fp_host_api, and the entry points of the kernel files. C, so that
 * cuda_backend.c (C11) and the .cu files share it.
 *
 *   cuda_backend.c   plugin entry, device open, caps, memory helpers, stream, dispatch
 *   dispatch.cuh     dtype / head dim / configuration index to kernel template instances
 *   sm80/fwd.cu      forward launcher (+ split-KV combine); kernels: sm80/fwd.cuh, mma.sync /
 *                    ldmatrix / cp.async, instantiated per head dim by sm80/inst/fwd_d*.cu
 *   sm80/bwd.cu      backward launcher and side passes (preprocess, dQ convert); kernels
 *                    (dK/dV + atomic dQ, deterministic dQ): sm80/bwd.cuh, sm80/inst/bwd_d*.cu
 *   sm90/fwd.cu      forward launcher on sm_90a (what the path declines, the persistent grid);
 *                    kernel (TMA + wgmma + warp specialization): sm90/fwd.cuh, configurations
 *                    sm90/fwd_config.cuh, sm90/inst/fwd_d*.cu
 *   sm90/bwd.cu      backward launcher on sm_90a; kernel (the same way): sm90/bwd.cuh,
 *                    configurations sm90/bwd_config.cuh, sm90/inst/bwd_d*.cu
 *   decode/fwd.cu    decode forward launcher; kernel (GQA-packed rows, split-KV, paged caches,
 *                    every cc >= 8.0): decode/fwd.cuh, decode/inst/fwd_d*.cu
 *   layout.cu        staging of tensors whose rows are not 16-byte aligned
 */
#ifndef FLASHPORT_BACKENDS_CUDA_INTERNAL_H
#define FLASHPORT_BACKENDS_CUDA_INTERNAL_H

#include "core/backend.h"
#include "core/problem.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp_cuda_ctx {
    int device;
    cudaStream_t stream; /* every launch and copy goes here; NULL = the legacy default stream */
    int sm_count;
    int cc_major, cc_minor;
    size_t smem_optin;  /* largest dynamic shared memory one block may ask for */
    void *encode_tiled; /* the driver's cuTensorMapEncodeTiled (sm90 path), NULL without one */
} fp_cuda_ctx;

/* Sets the calling thread's error to `status` with "cuda: <what>: <cudaGetErrorString>" and
 * returns status. */
flashport_status fp_cuda_error(flashport_status status, cudaError_t err, const char *what);

/* Sets the calling thread's error to `status` with "cuda: " and the formatted message (a problem
 * this device cannot run) and returns status. */
flashport_status fp_cuda_refuse(flashport_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Logs through the core when FLASHPORT_LOG is on. */
void fp_cuda_log(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Scratch of one call: cuda_backend.c sizes it (layout staging + the kernels' own), takes it
 * from the caller's workspace or one stream-ordered allocation, and hands each part its
 * 256-byte-aligned slice, so nothing below allocates. */
#define FP_CUDA_WS_ALIGN 256
static inline size_t fp_cuda_ws_round(size_t bytes)
{
    return (bytes + FP_CUDA_WS_ALIGN - 1) / FP_CUDA_WS_ALIGN * FP_CUDA_WS_ALIGN;
}

/* Bytes of staging p needs: a contiguous twin of every tensor whose rows are not 16-byte
 * aligned (0 for the common layouts). backward: 0 forward, 1 backward. */
size_t fp_cuda_layout_bytes(const fp_problem *p, int backward);

/* The problem the kernels would see after staging (twins at a placeholder aligned address): for
 * choosing a path without a workspace. */
void fp_cuda_layout_shape(const fp_problem *p, int backward, fp_problem *work);
/* Gives every such tensor its twin in ws (fp_cuda_layout_bytes of it), copying inputs in; *work
 * is p with those tensors replaced. fp_cuda_layout_end copies the outputs back when st is OK
 * and returns st (or the error of the copy). */
flashport_status fp_cuda_layout_begin(const fp_cuda_ctx *ctx, const fp_problem *p, int backward,
                                      fp_problem *work, void *ws);
flashport_status fp_cuda_layout_end(const fp_cuda_ctx *ctx, const fp_problem *p,
                                    const fp_problem *work, int backward, flashport_status st);

/* Kernel entry points; the problem is validated, the device current, head dim <= 256.
 * query == NULL: run, with ws holding the scratch the query reported. query != NULL: pick the
 * kernel exactly as a run would, store its scratch bytes in *query (or refuse as a run would)
 * and launch nothing. */
flashport_status fp_cuda_sm80_forward(const fp_cuda_ctx *ctx, const fp_problem *p, void *ws,
                                      size_t *query);
flashport_status fp_cuda_sm80_backward(const fp_cuda_ctx *ctx, const fp_problem *p, void *ws,
                                       size_t *query);

/* The forward's plan (core/plan.h) on a GPU grid of `workers` resident blocks, tiles of
 * block_q x block_k, split-KV up to 64 splits where the tiles alone leave blocks idle: what every
 * CUDA forward launcher asks the planner. */
static inline fp_plan fp_cuda_grid_plan(const fp_problem *p, int64_t workers, int32_t block_q,
                                        int32_t block_k)
{
    const fp_plan_shape shape = fp_problem_plan_shape(p);
    const fp_plan_target target = {workers, block_q, block_k, 64, FP_PLAN_ORDER_GRID};
    return fp_plan_forward(&shape, &target);
}

/* Decode path (decode/fwd.cu): fp_cuda_decode_wanted says whether a forward goes there (a paged
 * cache, or few query rows per kv head); fp_cuda_decode_forward as fp_cuda_sm80_forward. */
int fp_cuda_decode_wanted(const fp_problem *p);
flashport_status fp_cuda_decode_forward(const fp_cuda_ctx *ctx, const fp_problem *p, void *ws,
                                        size_t *query);

/* sm90 path: fp_cuda_sm90_init looks up what it needs from the driver at open. The forward
 * either runs (its status returned, *declined NULL) or declines without touching the device
 * (FLASHPORT_OK, *declined = the reason: not a 9.0 device, a layout TMA cannot read, ...).
 * `why` is the path choice's reason, for the log. ws and query as for fp_cuda_sm80_forward;
 * a query reports the bytes of its configuration even where it then declines. */
void fp_cuda_sm90_init(fp_cuda_ctx *ctx);
flashport_status fp_cuda_sm90_forward(const fp_cuda_ctx *ctx, const fp_problem *p, const char *why,
                                      const char **declined, void *ws, size_t *query);
/* The sm90 backward, on the same terms (ws and query as for fp_cuda_sm80_backward). */
flashport_status fp_cuda_sm90_backward(const fp_cuda_ctx *ctx, const fp_problem *p, const char *why,
                                       const char **declined, void *ws, size_t *query);

#ifdef __cplusplus
}
#endif

#endif /* FLASHPORT_BACKENDS_CUDA_INTERNAL_H */
