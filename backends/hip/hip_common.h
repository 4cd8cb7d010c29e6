/*
 * What the HIP backend's host code and kernels share: the runtime header (HIP, or CUDA through
 * hip_to_cuda.h in the FLASHPORT_HIP_SHIM build), the kernel argument block, the tile shapes per
 * head-dim class, and the kernel tables each kernel file exports.
 *
 * Kernels come in two paths with the same tiles, the same loaders, the same masking and online
 * softmax (attention_tile.h) and differ only in the tile matmuls:
 *   generic  mma_generic.h: f32 FMAs from LDS, no cross-lane operation that depends on the wave
 *            size; every AMD target (CDNA and RDNA) and, through the shim, NVIDIA GPUs.
 *   cdna     mma_cdna.h: MFMA 16x16x16 (f16, bf16_1k), wave64; gfx90a and gfx94x only.
 * Every kernel runs FP_HIP_THREADS threads per block.
 */
#ifndef FLASHPORT_BACKENDS_HIP_COMMON_H
#define FLASHPORT_BACKENDS_HIP_COMMON_H

#ifdef FP_HIP_SHIM
#include "backends/hip/hip_to_cuda.h"
#else
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#endif

#include "core/backend.h"
#include "core/kernel_args.h"

#include <stdint.h>
#include <stdio.h>

#define FP_HIP_THREADS           256
#define FP_HIP_MAX_HEAD_DIM      256
#define FP_HIP_HEAD_DIM_MULTIPLE 8

/* Everything a kernel reads, passed by value: core/kernel_args.h's block (filled from the problem
 * by fp_kernel_args_fill; the fields the CUDA kernels read too) and this backend's launch plan.
 * Sequence lengths of varlen problems come from cu_q/cu_k on the device; nq and nk are then
 * the maxima that sized the grid. The split-KV partials (o_part, lse_part) are
 * [split, H, total_q, D] and [split, H, total_q]. */
typedef struct fp_hip_args : fp_kernel_args {
    int kv_heads;
    int64_t total_q; /* packed query tokens: B * Nq dense, cu_q[B] varlen (workspace rows) */
    int vec_ok;      /* every row starts 16-byte aligned: loaders use 16-byte loads */
    /* Launch plan (core/plan.h): grid z runs over query blocks, heaviest first (reverse) if
     * asked. */
    int64_t num_q_blocks;
    /* Workspace: the backward's rowsum(dO * O) as [H, total_q]. */
    float *delta;
    /* GQA packing (forward): the query rows of a block are (token, head) pairs of the
     * pack_group heads that share a kv head, token major, so each K / V tile is read once for
     * all of them; grid x then runs over B * H / pack_group. 1 = one head per block. */
    int pack_group;
} fp_hip_args;

/* Tile shapes per head-dim class DMAX (64, 128, 256) and direction. Each kernel's LDS stays
 * under 48 KiB: NVIDIA's limit for static shared memory, and it leaves an AMD CU's 64 KiB LDS
 * to one block plus the compiler's own use. BQ and BK are multiples of 16 (the MFMA tile). */
template <int DMAX, int BWD> struct fp_hip_tile;
template <> struct fp_hip_tile<64, 0> {
    static constexpr int BQ = 64, BK = 64;
};
template <> struct fp_hip_tile<128, 0> {
    static constexpr int BQ = 64, BK = 32;
};
template <> struct fp_hip_tile<256, 0> {
    static constexpr int BQ = 32, BK = 16;
};
template <> struct fp_hip_tile<64, 1> {
    static constexpr int BQ = 32, BK = 64;
};
template <> struct fp_hip_tile<128, 1> {
    static constexpr int BQ = 32, BK = 32;
};
template <> struct fp_hip_tile<256, 1> {
    static constexpr int BQ = 16, BK = 16;
};

/* The head-dim class that serves D (a multiple of 8 up to 256), or 0 for none. */
static inline int fp_hip_dmax(int64_t head_dim)
{
    if (head_dim < 1 || head_dim > FP_HIP_MAX_HEAD_DIM || head_dim % FP_HIP_HEAD_DIM_MULTIPLE)
        return 0;
    return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

/* Host view of fp_hip_tile. */
template <int DMAX> static inline void fp_hip_tiles_of(int backward, int *bq, int *bk)
{
    *bq = backward ? fp_hip_tile<DMAX, 1>::BQ : fp_hip_tile<DMAX, 0>::BQ;
    *bk = backward ? fp_hip_tile<DMAX, 1>::BK : fp_hip_tile<DMAX, 0>::BK;
}

static inline void fp_hip_tiles(int dmax, int backward, int *bq, int *bk)
{
    if (dmax == 64)
        fp_hip_tiles_of<64>(backward, bq, bk);
    else if (dmax == 128)
        fp_hip_tiles_of<128>(backward, bq, bk);
    else
        fp_hip_tiles_of<256>(backward, bq, bk);
}

/* The device's target name without feature suffixes ("gfx90a" from "gfx90a:sramecc+:xnack-");
 * CUDA devices of the shim build are named "sm_<major><minor>". */
static inline void fp_hip_arch_name(const hipDeviceProp_t *prop, char *buf, size_t size)
{
#ifdef FP_HIP_SHIM
    snprintf(buf, size, "sm_%d%d", prop->major, prop->minor);
#else
    size_t n = 0;
    while (n + 1 < size && prop->gcnArchName[n] && prop->gcnArchName[n] != ':') {
        buf[n] = prop->gcnArchName[n];
        n++;
    }
    buf[n] = '\0';
#endif
}

/* Kernel tables. Each kernel file exports the kernels of one path; the host launches them
 * through these pointers with hipLaunchKernelGGL. NULL means no kernel for that dtype/class. */
typedef void (*fp_hip_kernel_fn)(fp_hip_args);

typedef struct fp_hip_bwd_kernels {
    fp_hip_kernel_fn dkdv; /* grid (B * Hkv, 1, key blocks) */
    fp_hip_kernel_fn dq;   /* grid (B * H, 1, query blocks) */
} fp_hip_bwd_kernels;

/* grid (B * H, splits, query blocks) */
fp_hip_kernel_fn fp_hip_fwd_kernel_generic(flashport_dtype dtype, int dmax);
fp_hip_bwd_kernels fp_hip_bwd_kernels_generic(flashport_dtype dtype, int dmax);
#ifdef FP_HIP_HAVE_CDNA
fp_hip_kernel_fn fp_hip_fwd_kernel_cdna(flashport_dtype dtype, int dmax);
fp_hip_bwd_kernels fp_hip_bwd_kernels_cdna(flashport_dtype dtype, int dmax);
#endif
/* Split-KV combine, grid (B * H, rows); backward preprocessing, grid (B * H, row blocks of
 * FP_HIP_THREADS). */
fp_hip_kernel_fn fp_hip_combine_kernel(flashport_dtype dtype);
fp_hip_kernel_fn fp_hip_bwd_prep_kernel(flashport_dtype dtype);

#endif /* FLASHPORT_BACKENDS_HIP_COMMON_H */
