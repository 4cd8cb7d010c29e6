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

/* What a plan is for: the forward, a backward, or a backward that takes the one-kernel form if
 * the planned program has it (not deterministic, FLASHPORT_OPENCL_BWD not `two`): above
 * FP_OCL_FA2_BWD_D only that form is FA2-shaped (fp_ocl_fa2_tile). */
enum { FP_OCL_FORWARD, FP_OCL_BACKWARD, FP_OCL_BACKWARD_FUSED };

/* Kernel variants (micro-tile policies of kernels/flash.cl): plain f32 FMAs; NVIDIA's tensor cores
 * through inline PTX (kernels/mma_nv.cl); the same policy with the tensor-core instruction
 * emulated in local memory (the test of the former on any device); and the FlashAttention-2
 * shaped kernels of kernels/flash_fa2.cl (each warp owns 16 rows, its scores and accumulators in
 * registers), real or emulated. As a device's variant the last two plan every forward, the
 * backwards of head dims up to FP_OCL_FA2_BWD_D and the one-kernel backwards of larger ones on
 * themselves, the other backwards on their tile counterpart (fp_ocl_tile_variant). */
enum { FP_OCL_PLAIN, FP_OCL_MMA_NV, FP_OCL_MMA_EMULATED, FP_OCL_FA2_NV, FP_OCL_FA2_EMULATED };

static inline int fp_ocl_variant_fa2(int variant)
{
    return variant == FP_OCL_FA2_NV || variant == FP_OCL_FA2_EMULATED;
}

static inline int fp_ocl_variant_emulated(int variant)
{
    return variant == FP_OCL_MMA_EMULATED || variant == FP_OCL_FA2_EMULATED;
}

/* The tile-shaped tensor-core variant of the same device (FA2 -> MMA, real or emulated). */
static inline int fp_ocl_tile_variant(int variant)
{
    return variant == FP_OCL_FA2_NV         ? FP_OCL_MMA_NV
           : variant == FP_OCL_FA2_EMULATED ? FP_OCL_MMA_EMULATED
                                            : variant;
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

/* The [t, d] local tiles (q, k, v, dO) of a variant: f32 values with a row pitch of d + 4 on the
 * plain path, rows 16-byte aligned for its float4 loads and 16 successive rows on distinct bank
 * quadruples (kernels/flash.cl); the 16-bit storage bits with a pitch of d + 2 on the tensor-core
 * paths, so a fragment's pair of neighbours in a row is one aligned 32-bit load and successive
 * rows start one bank apart. Every tile is then a multiple of 16 bytes (d and t multiples of 8). */
static inline int64_t fp_ocl_tile_elem_bytes(int variant)
{
    return variant == FP_OCL_PLAIN ? 4 : 2;
}

/* The FA2-shaped kernels' [t, d] staging tile has a pitch of d + 8: 16-byte aligned rows for
 * their 16-byte copies, and a word pitch of 4 mod 32 banks, so that a fragment load (lane
 * 4 g + t: row g, word t) touches 32 distinct banks (kernels/flash_fa2.cl). */
static inline int64_t fp_ocl_tile_ld(int64_t d, int variant)
{
    return variant == FP_OCL_PLAIN ? d + 4 : fp_ocl_variant_fa2(variant) ? d + 8 : d + 2;
}

/* The FA2-shaped forward's V tile, transposed: [d, keys] 16-bit for its key block of `keys`
 * (FP_OCL_FA2_FK), pitch keys + 8 for the same reason (a word pitch of 4 or 20 mod 32). */
static inline int64_t fp_ocl_vt_ld(int64_t keys)
{
    return keys + 8;
}

/* Row pitch of the [t, t] score tiles, odd for the same reason. */
static inline int64_t fp_ocl_score_ld(int64_t t)
{
    return t | 1;
}

/* The kernels of a program (kernels/flash.cl), for fp_ocl_local_args: the forward and the
 * two-kernel backward in every program; the one-kernel backward (a preparation, the fused
 * kernel, dQ's conversion; the default backward there) in the FA2-shaped programs only. */
enum {
    FP_OCL_KERNEL_FORWARD,
    FP_OCL_KERNEL_DQ,
    FP_OCL_KERNEL_DKDV,
    FP_OCL_KERNEL_PREP,
    FP_OCL_KERNEL_FUSED,
    FP_OCL_KERNEL_DQ_OUT,
    FP_OCL_KERNELS
};

#define FP_OCL_MAX_LOCAL_ARGS 8
/* Every __local argument gets this many bytes more than its tile, and is counted rounded up to
 * a multiple of it: the kernels round each argument's address up to 16 bytes (kernels/flash.cl's
 * FP_OCL_ALIGN16), since a driver may place them at any 4-byte offset (NVIDIA's does), and 16 is
 * the widest alignment the tiles' loads ask for (float4). */
#define FP_OCL_LOCAL_ALIGN 16

/* The emulated tensor-core variants' local scratch (kernels/flash.cl's FP_OCL_SCRATCH_ARG: the
 * last __local argument of every kernel that multiplies): the emulated instruction's A 16 x 16
 * and B 16 x 8 f32 for each of the 4 warps (the emulated shuffle of the FA2-shaped kernels uses
 * the same floats); none in the other variants. */
static inline size_t fp_ocl_scratch_bytes(int variant)
{
    return fp_ocl_variant_emulated(variant) ? (size_t)(FP_OCL_WG / 32) * (16 * 16 + 16 * 8) * 4 : 0;
}

/* The __local kernel arguments of `kernel` with t x t tiles of head-dim class d and, in the
 * FA2-shaped backward, query blocks of bq rows (the program's FP_OCL_BQ), in argument order, in
 * bytes, FP_OCL_LOCAL_ALIGN more than the tile each holds, then the emulated variants' scratch
 * (fp_ocl_scratch_bytes, as it is) (ocl_attention.c passes exactly these; the planner sums them
 * at the default query block, FP_OCL_FA2_BQ, the largest); returns their count. [t, d] tiles (q, k,
 * v, dO): fp_ocl_tile_ld and fp_ocl_tile_elem_bytes; [t, t] f32 score tiles (S / P, dS) with pitch
 * fp_ocl_score_ld; per-row f32 values (the forward's row factors, the backward's LSE and delta). */
static inline int fp_ocl_local_args_bq(int kernel, int64_t t, int64_t d, int variant, int64_t bq,
                                       size_t bytes[FP_OCL_MAX_LOCAL_ARGS])
{
    const size_t tile = (size_t)(t * fp_ocl_tile_ld(d, variant) * fp_ocl_tile_elem_bytes(variant));
    const size_t scores = (size_t)(t * fp_ocl_score_ld(t)) * 4, rows = (size_t)t * 4;
    int n = 0;
    if (fp_ocl_variant_fa2(variant)) {
        /* kernels/flash_fa2.cl: one 16-bit tile staging everything that goes through local
         * memory (forward: [FP_OCL_FA2_FK, d], q a key block's rows at a time, then k; backward:
         * [t, d], dQ: q, dO, then k and v of FP_OCL_FA2_BK rows each; dK / dV: k, v, then q and
         * dO of bq rows each, row-major and as row pairs, 4 bq rows' worth, more than t where bq
         * is 32; the fused kernel's: [FP_OCL_FA2_WK, d], above FP_OCL_FA2_BWD_D q and dO as row
         * pairs only, 2 bq rows' worth), then per-row f32 values and two blocks' row flags (the
         * guard) */
        const int64_t keys = kernel == FP_OCL_KERNEL_FORWARD ? FP_OCL_FA2_FK(d)
                             : kernel == FP_OCL_KERNEL_FUSED ? FP_OCL_FA2_WK(d)
                                                             : t;
        /* the staging tile's rows where q and dO of a query block go through it */
        int64_t qrows = 0;
        if (kernel == FP_OCL_KERNEL_DKDV || kernel == FP_OCL_KERNEL_FUSED)
            qrows = (d > FP_OCL_FA2_BWD_D ? 2 : 4) * bq;
        if (kernel == FP_OCL_KERNEL_PREP || kernel == FP_OCL_KERNEL_DQ_OUT)
            return 0; /* no local memory */
        bytes[n++] = (size_t)((keys > qrows ? keys : qrows) * fp_ocl_tile_ld(d, variant)) * 2;
        if (kernel == FP_OCL_KERNEL_FORWARD) {
            bytes[n++] = (size_t)(FP_OCL_FA2_OD(d) * fp_ocl_vt_ld(keys)) * 2; /* v^T, a pass's */
            bytes[n++] = (size_t)(2 * keys) * 4;                              /* key flags */
        } else if (kernel == FP_OCL_KERNEL_DQ) {
            bytes[n++] = rows;                  /* delta of the rows */
            bytes[n++] = 2 * FP_OCL_FA2_BK * 4; /* key flags */
        } else {
            bytes[n++] = (size_t)(2 * bq) * 4; /* LSE and delta of a query block */
            bytes[n++] = (size_t)(2 * bq) * 4; /* query-row flags */
            if (kernel == FP_OCL_KERNEL_FUSED) {
                /* k for dS K, as row pairs: [keys / 2, d + 8] words */
                bytes[n++] = (size_t)(keys * fp_ocl_tile_ld(d, variant)) * 2;
                bytes[n++] = (size_t)(bq * (keys + 8)) * 2; /* dS, [bq, keys + 8] */
                bytes[n++] = (size_t)keys * 4;              /* key flags */
                if (d > FP_OCL_FA2_BWD_D) /* S^T and dP^T exchanged: 4 warps' C fragments */
                    bytes[n++] = (size_t)(FP_OCL_WG * (bq / 2)) * 4;
            }
        }
    } else if (kernel == FP_OCL_KERNEL_FORWARD) {
        bytes[n++] = tile; /* q */
        /* k and v: one buffer on the plain path (K, then V of the same block), side by side on
         * the tensor-core paths (kernels/flash.cl's FP_OCL_KV_APART) */
        bytes[n++] = variant == FP_OCL_PLAIN ? tile : 2 * tile;
        bytes[n++] = scores;
        bytes[n++] = rows;
    } else {
        for (int i = 0; i < 4; i++) /* q, dO, k, v */
            bytes[n++] = tile;
        bytes[n++] = scores; /* dS (and P in the dK/dV kernel) */
        if (kernel == FP_OCL_KERNEL_DKDV)
            bytes[n++] = scores;
        bytes[n++] = 2 * rows; /* LSE and delta */
    }
    for (int i = 0; i < n; i++) /* room for the kernel's rounding up of the address */
        bytes[i] += FP_OCL_LOCAL_ALIGN;
    if (fp_ocl_scratch_bytes(variant)) /* floats, used where the driver puts them */
        bytes[n++] = fp_ocl_scratch_bytes(variant);
    return n;
}

/* fp_ocl_local_args_bq at the default query block of head-dim class d. */
static inline int fp_ocl_local_args(int kernel, int64_t t, int64_t d, int variant,
                                    size_t bytes[FP_OCL_MAX_LOCAL_ARGS])
{
    return fp_ocl_local_args_bq(kernel, t, d, variant, FP_OCL_FA2_BQ(d), bytes);
}

/* The kernels' own __local array (FP_OCL_SCRATCH floats in kernels/flash.cl and mma_nv.cl): one
 * float, unused, in the variants that do not emulate (the emulated ones take an argument
 * instead: fp_ocl_scratch_bytes). */
static inline size_t fp_ocl_static_local_bytes(int variant)
{
    return fp_ocl_variant_emulated(variant) ? 0 : 4;
}

static inline size_t fp_ocl_local_round(size_t bytes)
{
    return (bytes + FP_OCL_LOCAL_ALIGN - 1) / FP_OCL_LOCAL_ALIGN * FP_OCL_LOCAL_ALIGN;
}

/* Local memory one work-group of `kernel` takes with query blocks of bq rows: its arguments and
 * its own array, each rounded up to FP_OCL_LOCAL_ALIGN. */
static inline size_t fp_ocl_kernel_local_bytes_bq(int kernel, int64_t t, int64_t d, int variant,
                                                  int64_t bq)
{
    size_t bytes[FP_OCL_MAX_LOCAL_ARGS];
    const int n = fp_ocl_local_args_bq(kernel, t, d, variant, bq, bytes);
    size_t total = fp_ocl_local_round(fp_ocl_static_local_bytes(variant));
    for (int i = 0; i < n; i++)
        total += fp_ocl_local_round(bytes[i]);
    return total;
}

/* fp_ocl_kernel_local_bytes_bq at the default query block of head-dim class d (the planner's:
 * a smaller one takes less). */
static inline size_t fp_ocl_kernel_local_bytes(int kernel, int64_t t, int64_t d, int variant)
{
    return fp_ocl_kernel_local_bytes_bq(kernel, t, d, variant, FP_OCL_FA2_BQ(d));
}

/* Local memory of one work-group of a variant with t x t tiles of head-dim class d: the forward
 * kernel's, or the larger of the two backward kernels' (dK/dV's: one more score tile). */
static inline size_t fp_ocl_tile_local_bytes(int kind, int64_t t, int64_t d, int variant)
{
    if (kind == FP_OCL_FORWARD)
        return fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_FORWARD, t, d, variant);
    const size_t dq = fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_DQ, t, d, variant);
    const size_t dkdv = fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_DKDV, t, d, variant);
    return dq > dkdv ? dq : dkdv;
}

/* Whether the FA2-shaped one-kernel backward (FP_OCL_KERNEL_FUSED) of a variant with t x t
 * tiles of head-dim class d fits `local` bytes (its kernel takes a K tile more than the dK / dV
 * kernel; the plan itself is the two-kernel backward's). */
static inline int fp_ocl_fused_fits(int64_t t, int64_t d, size_t local, int variant)
{
    return fp_ocl_variant_fa2(variant) &&
           fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_FUSED, t, d, variant) <= local;
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

/* The FA2-shaped kernels' tile (the rows a work-group owns: 4 warps of 16 query rows in the
 * forward and the dQ kernel, of 16 keys in the dK / dV kernel): 64 where their local memory
 * fits, for every head-dim class in the forward (its key blocks shrink above 128:
 * FP_OCL_FA2_FK), up to FP_OCL_FA2_BWD_D in the backward and above it in the one-kernel backward
 * (whose work-groups own FP_OCL_FA2_WK keys there), else 0 (a warp's dQ, or dK and dV,
 * accumulators and its operand fragments would pass the 255 registers of a thread). */
static inline int64_t fp_ocl_fa2_tile(int kind, int64_t d, size_t local, int variant)
{
    if (kind == FP_OCL_BACKWARD_FUSED && d > FP_OCL_FA2_BWD_D)
        return fp_ocl_fused_fits(64, d, local, variant) ? 64 : 0;
    return (kind == FP_OCL_FORWARD || d <= FP_OCL_FA2_BWD_D) &&
                   fp_ocl_tile_local_bytes(kind, 64, d, variant) <= local
               ? 64
               : 0;
}

/* The variant and tile of one call: the device's tensor-core variant (`device`, FP_OCL_PLAIN
 * where it has none) for f16 and bf16 storage when its tiles have at least 16 rows (one m16
 * strip), else the plain path (f32 storage; head dims whose 16-bit tiles do not fit). An FA2
 * device variant serves the call where fp_ocl_fa2_tile allows and otherwise plans as its tile
 * counterpart. Sets *t to 0 when no tile fits. */
static inline int fp_ocl_plan(int kind, int64_t d, size_t local, int device, int f32_storage,
                              int64_t *t)
{
    if (fp_ocl_variant_fa2(device) && !f32_storage) {
        *t = fp_ocl_fa2_tile(kind, d, local, device);
        if (*t)
            return device;
    }
    device = fp_ocl_tile_variant(device);
    if (device != FP_OCL_PLAIN && !f32_storage) {
        *t = fp_ocl_tile(kind, d, local, device);
        if (*t >= 16)
            return device;
    }
    *t = fp_ocl_tile(kind, d, local, FP_OCL_PLAIN);
    return FP_OCL_PLAIN;
}

#endif /* FLASHPORT_BACKENDS_OPENCL_PLAN_H */
