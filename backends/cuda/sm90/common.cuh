/*
 * What the sm90 kernels (sm90/fwd.cuh, sm90/bwd.cuh) share: the wgmma instructions by dtype and N,
 * a register fence, the backward's softcap, rings of mbarriers, and the TMA descriptors of
 * q/k/v-shaped tensors (host).
 */
#ifndef FLASHPORT_BACKENDS_CUDA_SM90_COMMON_CUH
#define FLASHPORT_BACKENDS_CUDA_SM90_COMMON_CUH

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/ptx/sm90.cuh"

#include <cuda.h> /* CUtensorMap and its enums only: the driver is reached through ctx->encode */
#include <string.h>

/* wgmma of one dtype and N: ss (A, B from shared memory, K-major) and rs (A from registers, B
 * MN-major). */
template <typename T, int N> struct fp_wgmma;
#define FP_SM90_WGMMA(T, TN, N)                                                                    \
    template <> struct fp_wgmma<T, N> {                                                            \
        static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t a, uint64_t b,       \
                                                  int acc)                                         \
        {                                                                                          \
            if (FP_SM90_DEVICE)                                                                    \
                fp_wgmma_ss_m64n##N##k16_##TN(d, a, b, acc);                                       \
        }                                                                                          \
        static __device__ __forceinline__ void rs(float (&d)[N / 2], const uint32_t (&a)[4],       \
                                                  uint64_t b)                                      \
        {                                                                                          \
            if (FP_SM90_DEVICE)                                                                    \
                fp_wgmma_rs_m64n##N##k16_##TN(d, a, b);                                            \
        }                                                                                          \
    }
#if FP_SM90_DEVICE
FP_SM90_WGMMA(__nv_bfloat16, bf16, 32);
FP_SM90_WGMMA(__nv_bfloat16, bf16, 80);
FP_SM90_WGMMA(__nv_bfloat16, bf16, 96);
FP_SM90_WGMMA(__nv_bfloat16, bf16, 128);
FP_SM90_WGMMA(__nv_bfloat16, bf16, 192);
FP_SM90_WGMMA(__nv_bfloat16, bf16, 64);
FP_SM90_WGMMA(__nv_bfloat16, bf16, 256);
FP_SM90_WGMMA(__half, f16, 32);
FP_SM90_WGMMA(__half, f16, 80);
FP_SM90_WGMMA(__half, f16, 96);
FP_SM90_WGMMA(__half, f16, 128);
FP_SM90_WGMMA(__half, f16, 192);
FP_SM90_WGMMA(__half, f16, 64);
FP_SM90_WGMMA(__half, f16, 256);
#endif

/* e4m3 x e4m3 wgmma (k32) of one N: ss (A, B from shared memory) and rs (A from registers),
 * both operands K-major: fp8 wgmma has no transpose, so the P V product reads V^T. */
template <int N> struct fp_wgmma_e4m3;
#define FP_SM90_WGMMA_E4M3(N)                                                                      \
    template <> struct fp_wgmma_e4m3<N> {                                                          \
        static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t a, uint64_t b,       \
                                                  int acc)                                         \
        {                                                                                          \
            if (FP_SM90_DEVICE)                                                                    \
                fp_wgmma_ss_m64n##N##k32_e4m3(d, a, b, acc);                                       \
        }                                                                                          \
        static __device__ __forceinline__ void rs(float (&d)[N / 2], const uint32_t (&a)[4],       \
                                                  uint64_t b)                                      \
        {                                                                                          \
            if (FP_SM90_DEVICE)                                                                    \
                fp_wgmma_rs_m64n##N##k32_e4m3(d, a, b, 1);                                         \
        }                                                                                          \
    }
#if FP_SM90_DEVICE
FP_SM90_WGMMA_E4M3(96);
FP_SM90_WGMMA_E4M3(128);
FP_SM90_WGMMA_E4M3(256);
#endif

/* acc = A B^T over KT k steps of 16 columns, wgmma ss: A (the warpgroup's 64 rows) and B (N rows)
 * K-major in shared memory, in panels of 64 columns of 128-byte swizzled rows, A's panel p at
 * a + p * a_panel bytes, B's at b + p * b_panel (a tile of R rows: panels of R * 128 bytes).
 * Issued only: the caller fences, commits and waits. */
template <typename T, int N, int KT>
FP_DEV void fp_wgmma_ss_abt(float (&acc)[N / 2], uint32_t a, uint32_t a_panel, uint32_t b,
                            uint32_t b_panel)
{
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        /* panel kk / 4; 16 columns = 32 bytes into it (one sum per operand: added to the base
         * in two steps, the same addresses gave other machine code) */
        const uint32_t off_a = (kk / 4) * a_panel + (kk % 4) * 32;
        const uint32_t off_b = (kk / 4) * b_panel + (kk % 4) * 32;
        fp_wgmma<T, N>::ss(acc, fp_wgmma_desc(a + off_a, 16, 1024),
                           fp_wgmma_desc(b + off_b, 16, 1024), kk > 0);
    }
}

/* wgmma m64n64k16 with A and B from shared memory, both MN-major (the backward's dQ = dS K). */
template <typename T> FP_DEV void fp_wgmma_ss_tt64(float (&d)[32], uint64_t a, uint64_t b, int acc)
{
#if FP_SM90_DEVICE
    if constexpr (__is_same(T, __half))
        fp_wgmma_ss_tt_m64n64k16_f16(d, a, b, acc);
    else
        fp_wgmma_ss_tt_m64n64k16_bf16(d, a, b, acc);
#else
    (void)d, (void)a, (void)b, (void)acc;
#endif
}

/* wgmma m64n128k16 with A from shared memory K-major and B from shared memory MN-major (the
 * D = 256 backward's dV += P^T dO and dK += dS^T Q over the other warpgroup's queries). */
template <typename T> FP_DEV void fp_wgmma_ss_bt128(float (&d)[64], uint64_t a, uint64_t b, int acc)
{
#if FP_SM90_DEVICE
    if constexpr (__is_same(T, __half))
        fp_wgmma_ss_bt_m64n128k16_f16(d, a, b, acc);
    else
        fp_wgmma_ss_bt_m64n128k16_bf16(d, a, b, acc);
#else
    (void)d, (void)a, (void)b, (void)acc;
#endif
}

template <int N> FP_DEV void fp_fence_u32(uint32_t (&r)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            asm volatile("" : "+r"(r[i][e])::"memory");
}

/* tanh(x / (2 log2 e)), for softcap: 1 - 2 / (2^x + 1), the exponential on the MUFU pipe and
 * the reciprocal by two cubic Newton steps on the FMA pipe from a bit-pattern first guess (within
 * 12 %, then 0.2 %, then about 1e-8), for kernels whose MUFU pipe the exponentials already keep
 * busy (the backward; the forward where its configuration says TANH_FMA). tanh.approx would be
 * one MUFU operation, but its 2^-11 relative error shows in the LSE beyond the tests' tolerance.
 * Absolute error about 1e-7; x = +inf gives 1 (2^x clamped to 2^64, where the result rounds to
 * 1), -inf -1, NaN NaN. */
FP_DEV float fp_sm90_tanh2(float x)
{
    const float e = fp_exp2(x > 64.0f ? 64.0f : x) + 1.0f; /* in [1, 2^64 + 1], or NaN */
    uint32_t bits;
    memcpy(&bits, &e, sizeof bits);
    bits = 0x7ef311c3u - bits;
    float r;
    memcpy(&r, &bits, sizeof r);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float d = fmaf(-e, r, 1.0f);
        r = fmaf(r, fmaf(d, d, d), r);
    }
    return fmaf(-2.0f, r, 1.0f);
}

/* The backward's softcap on a scaled score y (core/mask.h: c tanh(y / c) and its derivative
 * 1 - tanh^2 into *grad) with the forward's tanh (fp_sm90_tanh2), so that P recomputed here is
 * the P whose log-sum-exp the forward stored; in2 = 2 log2(e) / c; c = 0: no softcap (y, and 1). */
FP_DEV float fp_sm90_softcap(float y, float c, float in2, float *grad)
{
    if (c > 0.0f) {
        const float th = fp_sm90_tanh2(y * in2);
        *grad = 1.0f - th * th;
        return c * th;
    }
    *grad = 1.0f;
    return y;
}

/* N stages' "full" and "empty" mbarriers, 8 bytes each from shared address base: full(0 .. N - 1),
 * then empty(0 .. N - 1); end() is the address after them, where the next set can start. init
 * (one thread): a full barrier completes on full_count arrivals (and its transaction bytes), an
 * empty one on empty_count. */
template <int N> struct fp_mbar_ring {
    uint32_t base;
    __device__ __forceinline__ uint32_t full(int s) const { return base + 8u * s; }
    __device__ __forceinline__ uint32_t empty(int s) const { return base + 8u * (N + s); }
    __device__ __forceinline__ uint32_t end() const { return base + 16u * N; }
    __device__ __forceinline__ void init(uint32_t full_count, uint32_t empty_count) const
    {
        for (int s = 0; s < N; ++s) {
            fp_mbar_init(full(s), full_count);
            fp_mbar_init(empty(s), empty_count);
        }
    }
};

/* ---- host ---------------------------------------------------------------------------------- */

typedef CUresult (*fp_encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                       const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                       const cuuint32_t *, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion,
                                       CUtensorMapFloatOOBfill);

/* A TMA map of a q/k/v-shaped view: (D, tokens, heads, batch), boxes of 128 bytes (64 f16 /
 * bf16 or 128 fp8 elements) x box_rows. TMA needs a 16-byte-aligned base and strides that are
 * positive multiples of 16 bytes below 2^40; a dimension of extent 1 never moves, so its stride
 * is replaced by a valid one. */
static inline bool fp_sm90_tmap(const fp_cuda_ctx *ctx, CUtensorMap *map, const fp_tensor_view &v,
                                flashport_dtype dt, int64_t d, int64_t tokens, int64_t heads,
                                int64_t batch, int box_rows, const char **why)
{
    const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)tokens, (cuuint64_t)heads,
                                (cuuint64_t)batch};
    const int64_t st[3] = {v.stride[FP_S], v.stride[FP_H], v.stride[FP_B]};
    const bool fp8 = dt == FLASHPORT_FP8_E4M3 || dt == FLASHPORT_FP8_E5M2;
    const int esize = fp8 ? 1 : 2;
    cuuint64_t strides[3];
    for (int i = 0; i < 3; ++i) {
        int64_t bytes = st[i] * esize;
        if (dims[i + 1] <= 1)
            bytes = 16;
        if (bytes <= 0 || bytes % 16 != 0 || bytes >= ((int64_t)1 << 40)) {
            *why = "a stride of q, k, v or dO is not a positive multiple of 16 bytes";
            return false;
        }
        strides[i] = (cuuint64_t)bytes;
    }
    if (((uintptr_t)v.data & 15) != 0) {
        *why = "q, k, v or dO is not 16-byte aligned";
        return false;
    }
    const cuuint32_t box[4] = {(cuuint32_t)(128 / esize), (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t estr[4] = {1, 1, 1, 1};
    const fp_encode_tiled_fn encode = (fp_encode_tiled_fn)ctx->encode_tiled;
    const CUtensorMapDataType type = fp8                   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                     : dt == FLASHPORT_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUresult r =
        encode(map, type, 4, v.data, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        *why = "the driver refused a TMA descriptor (cuTensorMapEncodeTiled)";
        return false;
    }
    return true;
}

#endif /* FLASHPORT_BACKENDS_CUDA_SM90_COMMON_CUH */
