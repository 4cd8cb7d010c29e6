/*
 * The sm90 forward's configurations (fp_sm90_cfg, one per kernel head dim and input type), its
 * grid (fp_sm90_fwd_grid, chosen in sm90/fwd.cu) and the declaration of its kernel families,
 * which is all the launcher (sm90/fwd.cu) sees of the kernel: sm90/fwd.cuh defines them, and one
 * small file per head dim instantiates them (sm90/inst/fwd_d64.cu ... fwd_d256.cu: f16 and bf16;
 * fwd_d128_e4m3.cu, fwd_d256_e4m3.cu: e4m3 inputs, f16 and bf16 outputs;
 * backends/cuda/CMakeLists.txt compiles them with their launcher).
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM90_FWD_CONFIG_CUH
#define FLASHPORT_BACKENDS_CUDA_SM90_FWD_CONFIG_CUH

#include <stddef.h>
#include <stdint.h>

#include "backends/cuda/cuda_internal.h"
#include "core/problem.h"

enum {
    FP_SM90_BM = 128,
    FP_SM90_THREADS = 384,
    FP_SM90_CONSUMER_THREADS = 256,
    FP_SM90_PREPARERS = 96 /* the producer warpgroup's warps 1 .. 3 */
};

/* One kernel configuration: head dim DK (the kernel's; a multiple of 64), key block BN, ST
 * K / V stages, LAZY rescale (see FP_RESCALE_SLACK, sm80/common.cuh). TANH_FMA: softcap's
 * reciprocal on the FMA pipe (fp_sm90_tanh2) at DK = 64, where the exponentials bound the
 * kernel; at larger DK the FMA pipe's extra instructions cost more than the MUFU reciprocal
 * (timed on the H200: docs/performance.md, softcap). */
template <int DK_, int BN_, int ST_, bool LAZY_> struct fp_sm90_cfg {
    static constexpr int DK = DK_, BN = BN_, ST = ST_;
    static constexpr bool LAZY = LAZY_, TANH_FMA = DK_ == 64;
    static_assert(DK % 64 == 0 && BN % 16 == 0 && BN <= 256, "tile shape");
    static constexpr int VT_PANELS = (BN + 127) / 128; /* fp8: 128-key panels of V^T */
    /* Q tiles for inputs of eb bytes: one, or in the persistent kernel two where they fit beside
     * the stages (the producer loads a block's next tile's Q while the consumers work on its
     * current one) */
    __host__ __device__ static constexpr int q_tiles(int eb, bool persist)
    {
        return persist && DK * eb <= 256 ? 2 : 1;
    }
    /* Shared memory for inputs of eb bytes: the Q tiles, ST K stages, ST V stages (fp8: and ST
     * V^T stages of DK rows x 128 bytes), the mbarriers (fp_sm90f_bars), and 1024 bytes of
     * slack to align the tiles to the swizzle atom */
    static constexpr size_t smem(int eb, bool persist)
    {
        return (size_t)(q_tiles(eb, persist) * FP_SM90_BM + 2 * ST * BN) * DK * eb +
               (eb == 1 ? (size_t)ST * VT_PANELS * DK * 128 + (4 + 6 * ST) * 8 : (4 + 5 * ST) * 8) +
               1024;
    }
    static constexpr size_t SMEM = smem(2, false);
};

/* The configurations, by the kernel's head dim. The rest of each choice was timed against
 * alternatives on the H200 (docs/bench/archive/README.md): at DK = 256 the Q K^T wgmma with N = 64
 * reads shared memory as fast as it multiplies, N = 80 does not; LAZY pays at DK >= 128, where a
 * rescale touches more of O, and costs at DK = 64. */
typedef fp_sm90_cfg<64, 128, 2, false> fp_sm90_fwd_d64;
typedef fp_sm90_cfg<128, 128, 2, true> fp_sm90_fwd_d128;
typedef fp_sm90_cfg<192, 96, 2, true> fp_sm90_fwd_d192;
typedef fp_sm90_cfg<256, 80, 2, true> fp_sm90_fwd_d256;
/* fp8 (e4m3) inputs: the P V product reads V^T (DK rows of BN keys, in panels of 128 keys),
 * so BN is a multiple of 32 (wgmma's fp8 K); head dims up to 128 run on DK = 128. */
typedef fp_sm90_cfg<128, 128, 2, true> fp_sm90_fwd8_d128;
typedef fp_sm90_cfg<256, 96, 2, true> fp_sm90_fwd8_d256;

/* The configuration of a head-dim class (backends/cuda/dispatch.cuh): f16 / bf16 inputs, and
 * fp8 e4m3 inputs (FP8) */
template <int DK, bool FP8> struct fp_sm90_fwd_cfg_of;
template <> struct fp_sm90_fwd_cfg_of<64, false> {
    typedef fp_sm90_fwd_d64 type;
};
template <> struct fp_sm90_fwd_cfg_of<128, false> {
    typedef fp_sm90_fwd_d128 type;
};
template <> struct fp_sm90_fwd_cfg_of<192, false> {
    typedef fp_sm90_fwd_d192 type;
};
template <> struct fp_sm90_fwd_cfg_of<256, false> {
    typedef fp_sm90_fwd_d256 type;
};
template <> struct fp_sm90_fwd_cfg_of<128, true> {
    typedef fp_sm90_fwd8_d128 type;
};
template <> struct fp_sm90_fwd_cfg_of<256, true> {
    typedef fp_sm90_fwd8_d256 type;
};

/* The head dims of the kernel classes: f16 / bf16 inputs, and fp8 e4m3 inputs (whose class's
 * element type is o's); problems of smaller head dims run on the next larger. */
#define FP_SM90_FWD_DK_CLASSES      64, 128, 192, 256
#define FP_SM90_FWD_E4M3_DK_CLASSES 128, 256

/* The forward's grid: blocks = 0, the kernel of one block per tile; else the persistent
 * kernel on `blocks` blocks (one per SM), walking its tiles statically (every tile costs the
 * same: no causal mask or window, no varlen or seqused_k) or claiming them (dynamic), in
 * chunks of `chunk` (head, batch x split) pairs. */
typedef struct fp_sm90_fwd_grid {
    int64_t blocks;
    bool dynamic;
    int chunk;
} fp_sm90_fwd_grid;

/* The grid for a problem (sm90/fwd.cu, with its rule) */
fp_sm90_fwd_grid fp_sm90_fwd_grid_of(const fp_cuda_ctx *ctx, const fp_problem *p, int64_t tiles,
                                     int64_t pairs, int64_t key_blocks, int64_t eb);
/* An environment variable's count (a decimal >= 0), or -1 when it is unset or not one
 * (sm90/fwd.cu) */
long long fp_sm90_env_count(const char *name);

/* The sm90 forward's families: one per head-dim class and input type TI (__half, __nv_bfloat16;
 * uint8_t: fp8 e4m3) and output type TO (TI, or for e4m3 inputs __half or __nv_bfloat16). run
 * launches the kernel (and the split-KV combine), or with query != NULL sets *query to the
 * workspace bytes; it sets *declined where a tensor map cannot describe an operand (the caller
 * then takes the sm80 path). */
template <typename TI, typename TO, int DK> struct fp_sm90_fwd_family {
    static flashport_status run(const fp_cuda_ctx *ctx, const fp_problem *p, const char *why,
                                const char **declined, void *ws, size_t *query);
};

#endif /* FLASHPORT_BACKENDS_CUDA_SM90_FWD_CONFIG_CUH */
