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

/* The [t, d] local tiles (q, k, v, dO) of a variant: f32 values with an odd row pitch on the plain
 * path, so work-items reading one column of different rows hit different banks; the 16-bit
 * storage bits with a pitch of d + 2 on the tensor-core paths, so a fragment's pair of
 * neighbours in a row is one aligned 32-bit load and successive rows start one bank apart. */
static inline int64_t fp_ocl_tile_elem_bytes(int variant)
{
    return variant == FP_OCL_PLAIN ? 4 : 2;
}

static inline int64_t fp_ocl_tile_ld(int64_t d, int variant)
{
    return variant == FP_OCL_PLAIN ? d | 1 : d + 2;
}

/* Row pitch of the [t, t] score tiles, odd for the same reason. */
static inline int64_t fp_ocl_score_ld(int64_t t)
{
    return t | 1;
}

/* Local memory of one work-group of a variant with t x t tiles of head-dim class d, per kernel
 * (the emulated variant's scratch included). */
static inline size_t fp_ocl_tile_local_bytes(int kind, int64_t t, int64_t d, int variant)
{
    const int64_t tile = t * fp_ocl_tile_ld(d, variant) * fp_ocl_tile_elem_bytes(variant);
    const int64_t ls = fp_ocl_score_ld(t);
    const size_t extra = fp_ocl_variant_local_bytes(variant);
    if (kind == FP_OCL_FORWARD) /* q, k and v (one buffer on the plain path), scores, row factors */
        return (size_t)((variant == FP_OCL_PLAIN ? 2 : 3) * tile + (t * ls + t) * 4) + extra;
    /* dK/dV, the larger of the two backward kernels: q, dO, k, v, P, dS, LSE and delta */
    return (size_t)(4 * tile + (2 * t * ls + 2 * t) * 4) + extra;
}

/* The tile size t (= query rows = keys per tile) of a variant for head-dim class d on a device
 * with `local` bytes of local memory per work-group: the largest of 64, 32, 16, 8 whose output
 * micro-tile fits a work-item's registers ((t / 8) * ceil(d / 16) <= FP_OCL_ACC, the same count
 * in both micro-tile policies of kernels/flash.cl) and whose tiles fit local memory; 0 when none
 * does. */
static inline int64_t fp_ocl_tile(int kind, int64_t d, size_t local, int variant)
{
    for (int64_t t = 64; t >= 8; t /= 2)
        if ((t / 8) * ((d + 15) / 16) <= FP_OCL_ACC &&
            fp_ocl_tile_local_bytes(kind, t, d, variant) <= local)
            return t;
    return 0;
}

/* The variant and tile of one call: the device's tensor-core variant (`device`, FP_OCL_PLAIN
 * where it has none) for f16 and bf16 storage when its tiles have at least 16 rows (one m16
 * strip), else the plain path (f32 storage; head dims whose 16-bit tiles do not fit). Sets *t
 * to 0 when no tile fits. */
static inline int fp_ocl_plan(int kind, int64_t d, size_t local, int device, int f32_storage,
                              int64_t *t)
{
    if (device != FP_OCL_PLAIN && !f32_storage) {
        *t = fp_ocl_tile(kind, d, local, device);
        if (*t >= 16)
            return device;
    }
    *t = fp_ocl_tile(kind, d, local, FP_OCL_PLAIN);
    return FP_OCL_PLAIN;
}

#endif /* FLASHPORT_BACKENDS_OPENCL_PLAN_H */
