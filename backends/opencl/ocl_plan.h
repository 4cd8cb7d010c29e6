/*
 * Tile planning of the OpenCL kernels as pure functions (tested in tests/opencl/test_opencl.c):
 * which program (head-dim class, tile size) serves a head dim on a device with a given amount of
 * local memory per work-group. kernels/flash.cl takes both as compile-time constants.
 */
#ifndef FLASHPORT_BACKENDS_OPENCL_PLAN_H
#define FLASHPORT_BACKENDS_OPENCL_PLAN_H

#include "backends/opencl/ocl_args.h"

#include <stddef.h>
#include <stdint.h>

enum { FP_OCL_FORWARD, FP_OCL_BACKWARD };

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

/* Local memory of one work-group with t x t tiles of head-dim class d, per kernel. */
static inline size_t fp_ocl_tile_local_bytes(int kind, int64_t t, int64_t d)
{
    const int64_t ld = fp_ocl_tile_ld(d);
    if (kind == FP_OCL_FORWARD) /* q, k|v, scores, row factors */
        return (size_t)((2 * t * ld + t * t + t) * 4);
    /* dK/dV, the larger of the two backward kernels: q, dO, k, v, P, dS, LSE and delta */
    return (size_t)((4 * t * ld + 2 * t * t + 2 * t) * 4);
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
