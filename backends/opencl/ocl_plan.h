/*
 * Tile planning of the OpenCL kernels as pure functions (tested in tests/opencl/test_opencl.c):
 * which program (head-dim class, tile size, variant) serves a head dim on a device with a given
 * amount of local memory per work-group. kernels/flash.cl takes them as compile-time constants.
 */
#ifndef FLASHPORT_BACKENDS_OPENCL_PLAN_H
#define FLASHPORT_BACKENDS_OPENCL_PLAN_H

#include "backends/opencl/ocl_args.h"

#include <stddef.h>
#include <stdint.h>

enum { FP_OCL_FORWARD, FP_OCL_BACKWARD };

/* Kernel variants (micro-tile policies of kernels/flash.cl): plain f32 FMAs; NVIDIA's tensor cores
 * through inline PTX (kernels/mma_nv.cl); the same policy with the tensor-core instruction
 * emulated in local memory (the test of the former on any device). */
enum { FP_OCL_PLAIN, FP_OCL_MMA_NV, FP_OCL_MMA_EMULATED };

/* Local memory the emulated instruction takes per work-group: A 16 x 16 and B 16 x 8 f32 for each
 * of the 4 warps (FP_OCL_SCRATCH in kernels/mma_nv.cl). */
static inline size_t fp_ocl_variant_local_bytes(int variant)
{
    return variant == FP_OCL_MMA_EMULATED ? (size_t)(FP_OCL_WG / 32) * (16 * 16 + 16 * 8) * 4 : 0;
}

/* The variant of one program: the device's tensor-core variant (`device`, FP_OCL_PLAIN where it
 * has none) for f16 and bf16 storage with tiles of at least 16 rows (one m16 strip), else the
 * plain path (f32 storage; the 8-row tiles of large head dims in the backward). */
static inline int fp_ocl_variant(int device, int f32_storage, int64_t t)
{
    return !f32_storage && t >= 16 ? device : FP_OCL_PLAIN;
}

/* The head-dim class a program is built for: the problem's head dim rounded up to one of a few
 * sizes, so a handful of programs serve every D in 1..256 (each build costs seconds on PoCL);
 * 0 above 256. */
static inline int64_t fp_ocl_dim_class(int64_t d)
{
    static const int64_t classes[] = {16, 32, 64, 96, 128, 192, 256};
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++)
        if (d <= classes[i])
            return classes[i];
    return 0;
}

/* Row pitch of the local tiles: odd, so work-items reading one column of different rows hit
 * different banks. */
static inline int64_t fp_ocl_tile_ld(int64_t d)
{
    return d | 1;
}

/* Row pitch of the [t, t] score tiles, odd for the same reason. */
static inline int64_t fp_ocl_score_ld(int64_t t)
{
    return t | 1;
}

/* Local memory of one work-group with t x t tiles of head-dim class d, per kernel. */
static inline size_t fp_ocl_tile_local_bytes(int kind, int64_t t, int64_t d)
{
    const int64_t ld = fp_ocl_tile_ld(d), ls = fp_ocl_score_ld(t);
    if (kind == FP_OCL_FORWARD) /* q, k|v, scores, row factors */
        return (size_t)((2 * t * ld + t * ls + t) * 4);
    /* dK/dV, the larger of the two backward kernels: q, dO, k, v, P, dS, LSE and delta */
    return (size_t)((4 * t * ld + 2 * t * ls + 2 * t) * 4);
}

/* The tile size t (= query rows = keys per tile) for head-dim class d on a device with `local`
 * bytes of local memory per work-group: the largest of 64, 32, 16, 8 whose output micro-tile fits
 * a work-item's registers ((t / 8) * ceil(d / 16) <= FP_OCL_ACC, kernels/flash.cl) and whose
 * tiles fit local memory; 0 when none does. */
static inline int64_t fp_ocl_tile(int kind, int64_t d, size_t local)
{
    for (int64_t t = 64; t >= 8; t /= 2)
        if ((t / 8) * ((d + 15) / 16) <= FP_OCL_ACC && fp_ocl_tile_local_bytes(kind, t, d) <= local)
            return t;
    return 0;
}

#endif /* FLASHPORT_BACKENDS_OPENCL_PLAN_H */
