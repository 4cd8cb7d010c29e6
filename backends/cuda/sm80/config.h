/*
 * The sm80 path's configurations, by name, and the one pure function that chooses among them from
 * the head dim and the device's shared memory per block (after FlashAttention's
 * hopper/tile_size.h). Plain C, no CUDA: tests/test_sm80_config.c checks the choice on the CPU at
 * the H200's (227 KiB), the A100's (163) and the sm_86/89 GPUs' (99) shared-memory sizes.
 *
 * Each configuration is a kernel template instance (fp_fwd_cfg<DK, ALT>, fp_bwd_cfg<DK, ALT>,
 * fp_dq_cfg<DK, ALT> in sm80/fwd.cuh and sm80/bwd.cuh); the byte counts here are checked against
 * the kernels' own shared-memory formulas by static asserts there. In each list a head dim's
 * configurations come in order of preference: the first that fits runs.
 *
 *   forward                       tile BM x BN, warps, K/V stages      shared memory
 *   FP_FWD_D64                    128 x 128, 4, 2                       80 KiB
 *   FP_FWD_D64_PINGPONG           256 x 128, 8 (two groups), 2          96 KiB  long key loops
 *   FP_FWD_D128                   128 x 64, 4, 2                        96 KiB
 *   FP_FWD_D256_TWO_PER_SM        64 x 64, 4, 1 (two blocks per SM)     96 KiB  needs 2 x 96
 *   FP_FWD_D256_TWO_STAGE         64 x 64, 4, 2                        160 KiB
 *   FP_FWD_D256_BN32              64 x 32, 4, 2                         96 KiB
 *   backward dK/dV (BN keys x BM queries, warps; the deterministic dQ kernel must fit too)
 *   D = 64:  128 x 128 dQ one step late (194 KiB), 128 x 128 (162), 128 x 64 (97)
 *   D = 128: 128 x 64 (161), 64 x 32 with 4 warps (72.5)
 *   D = 256: 64 x 64 dQ one step late (217), 64 x 32 (136.5), 32 x 32, 4 warps, one Q/dO buffer
 * (72)
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM80_CONFIG_H
#define FLASHPORT_BACKENDS_CUDA_SM80_CONFIG_H

#include <stddef.h>
#include <stdint.h>

/* Shared memory per block of each configuration, bytes. */
enum {
    FP_FWD_SMEM_D64 = 81920,
    FP_FWD_SMEM_D64_PINGPONG = 98304,
    FP_FWD_SMEM_D128 = 98304,
    FP_FWD_SMEM_D256_TWO_PER_SM = 98304,
    FP_FWD_SMEM_D256_TWO_STAGE = 163840,
    FP_FWD_SMEM_D256_BN32 = 98304,
};

/* The D = 64 ping-pong configuration's tile (BM x BN), which its shape rule reads
 * (fp_fwd_pingpong, sm80/fwd.cu). */
enum {
    FP_FWD_D64_PINGPONG_BM = 256,
    FP_FWD_D64_PINGPONG_BN = 128,
};

/* The forward configuration of a head dim, as the ALT index of fp_fwd_cfg<DK, ALT>. */
enum {
    FP_FWD_D64 = 0,
    FP_FWD_D64_PINGPONG = 1,
    FP_FWD_D128 = 0,
    FP_FWD_D256_TWO_PER_SM = 0,
    FP_FWD_D256_TWO_STAGE = 1,
    FP_FWD_D256_BN32 = 2,
};

/* constexpr in C++ (the kernels' static asserts read the tables), const in C. */
#ifdef __cplusplus
#define constexpr_table constexpr
#else
#define constexpr_table const
#endif

/* Backward shared memory, [kernel head dim class 0/1/2 = 64/128/256][ALT]; 0 = no such ALT. */
static constexpr_table size_t fp_sm80_dkdv_smem_bytes[3][3] = {
    {198656, 165888, 99328}, /* D = 64 */
    {164864, 74240, 0},      /* D = 128 */
    {222208, 139776, 73984}, /* D = 256 */
};
static constexpr_table size_t fp_sm80_dq_smem_bytes[3][2] = {
    {49152, 0},      /* D = 64 */
    {98304, 0},      /* D = 128 */
    {131072, 98304}, /* D = 256 */
};

/* The kernels' head dims (DK), ascending: a problem runs on the first that holds its head dim
 * (c.dk below). The launchers instantiate each kernel at each of them
 * (fp_cuda_dispatch<FP_SM80_DK_CLASSES>, backends/cuda/dispatch.cuh). */
#define FP_SM80_DK_CLASSES 64, 128, 256

/* What runs a problem: the kernels' head dim (64, 128 or 256; 0 = none) and the ALT index of each
 * kernel, -1 where nothing fits this device. */
typedef struct fp_sm80_choice {
    int dk;
    int fwd;  /* fp_fwd_cfg<dk, fwd> */
    int dkdv; /* fp_bwd_cfg<dk, dkdv> */
    int dq;   /* fp_dq_cfg<dk, dq>, the deterministic dQ kernel */
} fp_sm80_choice;

/* The choice for head dim d (a multiple of 8 up to 256), a device allowing smem bytes of dynamic
 * shared memory per block, and whether the D <= 64 forward should take the ping-pong schedule
 * (a shape decision, fp_fwd_pingpong in sm80/fwd.cu; only where it fits). */
static inline fp_sm80_choice fp_sm80_pick(int64_t d, size_t smem, int pingpong)
{
    fp_sm80_choice c = {0, -1, -1, -1};
    if (d < 1 || d > 256)
        return c;
    c.dk = d <= 64 ? 64 : d <= 128 ? 128 : 256;
    const int k = c.dk == 64 ? 0 : c.dk == 128 ? 1 : 2;
    if (c.dk == 64)
        c.fwd = pingpong && smem >= FP_FWD_SMEM_D64_PINGPONG ? FP_FWD_D64_PINGPONG : FP_FWD_D64;
    else if (c.dk == 128)
        c.fwd = FP_FWD_D128;
    else if (smem >= 2 * (size_t)FP_FWD_SMEM_D256_TWO_PER_SM)
        c.fwd = FP_FWD_D256_TWO_PER_SM;
    else if (smem >= FP_FWD_SMEM_D256_TWO_STAGE)
        c.fwd = FP_FWD_D256_TWO_STAGE;
    else if (smem >= FP_FWD_SMEM_D256_BN32)
        c.fwd = FP_FWD_D256_BN32;
    for (int alt = 0; alt < 2 && c.dq < 0; alt++)
        if (fp_sm80_dq_smem_bytes[k][alt] && smem >= fp_sm80_dq_smem_bytes[k][alt])
            c.dq = alt;
    for (int alt = 0; alt < 3 && c.dq >= 0 && c.dkdv < 0; alt++)
        if (fp_sm80_dkdv_smem_bytes[k][alt] && smem >= fp_sm80_dkdv_smem_bytes[k][alt])
            c.dkdv = alt;
    return c;
}

#endif /* FLASHPORT_BACKENDS_CUDA_SM80_CONFIG_H */
