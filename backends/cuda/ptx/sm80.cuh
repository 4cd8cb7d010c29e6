/*
 * PTX instruction helpers of the sm80 path, one name an instruction (they also run on sm_90 and
 * later): each is an inline asm wrapper, or, under FP_CUDA_EMU, a call into the CPU emulator
 * (backends/cuda/emu/, docs/cuda_emu.md).
 *
 *   cp.async.cg 16 B      fp_cp_async16 / _commit / _wait: global -> shared, zero-filling
 *   ldmatrix(.trans) x4   fp_ldsm_x4 / fp_ldsm_x4_t: shared -> the register fragments of mma.sync
 *   mma.sync m16n8k16     fp_mma<T>: f16/bf16 inputs, f32 accumulate
 *   stmatrix x4           fp_stsm_x4: registers -> shared, the inverse of ldmatrix (sm_90 and
 * later) ex2 / rcp / lg2       fp_exp2, fp_rcp, fp_log2: the hardware approximations (ftz) shfl.xor
 * fp_quad_max, fp_quad_sum: reductions over the 4 lanes of an mma row
 *
 * mma.sync m16n8k16 fragments (PTX ISA), lane = 4 * g + t:
 *   A 16x16: a0 (row g, k 2t..2t+1), a1 (row g+8, same k), a2 (row g, k 2t+8..), a3 (row g+8, ..)
 *   B 16x8:  b0 (k 2t..2t+1, col g), b1 (k 2t+8..2t+9, col g)
 *   C 16x8:  c0,c1 (row g, cols 2t, 2t+1), c2,c3 (row g+8, same cols)
 * so the C fragments of two adjacent 8-column tiles, rounded to 16 bits, are the A fragment of a
 * 16-deep k step: P and dS feed the next product straight from registers.
 */
#ifndef FLASHPORT_BACKENDS_CUDA_PTX_SM80_CUH
#define FLASHPORT_BACKENDS_CUDA_PTX_SM80_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define FP_DEV static __device__ __forceinline__
/* A device function kept out of line (the emulator compiles as plain C++, where the CUDA
 * keyword is not defined). */
#ifdef FP_CUDA_EMU
#define FP_DEV_NOINLINE static __attribute__((noinline))
#else
#define FP_DEV_NOINLINE static __device__ __noinline__
#endif

/* ---- element types ------------------------------------------------------------------------- */

/* Per-dtype pieces: packing two f32 into a 32-bit pair, scalar conversions, and the mma. */
template <typename T> struct fp_dt;
template <> struct fp_dt<__half> {
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ __half from_f32(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ float2 unpack2(uint32_t w)
    {
        return make_float2(__half2float(__ushort_as_half((unsigned short)(w & 0xffffu))),
                           __half2float(__ushort_as_half((unsigned short)(w >> 16))));
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1)
    {
#ifdef FP_CUDA_EMU
        fp_emu_mma_m16n8k16(c, a, b0, b1, 0);
#else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
};
template <> struct fp_dt<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ __nv_bfloat16 from_f32(float x)
    {
        return __float2bfloat16_rn(x);
    }
    static __device__ __forceinline__ float2 unpack2(uint32_t w)
    {
        return make_float2(__bfloat162float(__ushort_as_bfloat16((unsigned short)(w & 0xffffu))),
                           __bfloat162float(__ushort_as_bfloat16((unsigned short)(w >> 16))));
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1)
    {
#ifdef FP_CUDA_EMU
        fp_emu_mma_m16n8k16(c, a, b0, b1, 1);
#else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
};

template <typename T> FP_DEV uint32_t fp_pack2(float lo, float hi)
{
    return fp_dt<T>::pack2(lo, hi);
}
/* The two values of a 32-bit pair (low half first), as f32. */
template <typename T> FP_DEV float2 fp_unpack2(uint32_t w)
{
    return fp_dt<T>::unpack2(w);
}
template <typename T> FP_DEV T fp_from_f32(float x)
{
    return fp_dt<T>::from_f32(x);
}
FP_DEV float fp_to_f32(__half x)
{
    return __half2float(x);
}
FP_DEV float fp_to_f32(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}

/* c += a * b (m16n8k16, f32 accumulate). */
template <typename T> FP_DEV void fp_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    fp_dt<T>::mma(c, a, b0, b1);
}

/* ---- instructions -------------------------------------------------------------------------- */

FP_DEV uint32_t fp_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared; bytes = 0 writes zeros and reads nothing. */
FP_DEV void fp_cp_async16(uint32_t dst, const void *src, int bytes)
{
#ifdef FP_CUDA_EMU
    fp_emu_cp_async16(dst, src, bytes);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes));
#endif
}
FP_DEV void fp_cp_async_commit()
{
#ifdef FP_CUDA_EMU
    fp_emu_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> FP_DEV void fp_cp_async_wait()
{
#ifdef FP_CUDA_EMU
    fp_emu_cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

FP_DEV void fp_ldsm_x4(uint32_t r[4], uint32_t addr)
{
#ifdef FP_CUDA_EMU
    fp_emu_ldmatrix_x4(r, addr, 0);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}
FP_DEV void fp_ldsm_x4_t(uint32_t r[4], uint32_t addr)
{
#ifdef FP_CUDA_EMU
    fp_emu_ldmatrix_x4(r, addr, 1);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

/* Four 8x8 b16 matrices from registers to shared memory, the inverse of ldmatrix x4: lanes
 * 8i..8i+7 give the row addresses of matrix i, register i holds row lane / 4, elements
 * 2 (lane % 4) and 2 (lane % 4) + 1 of matrix i (an mma C fragment's layout). sm_90 and later;
 * callers use it only where FP_HAVE_STSM, or in sm_90-only kernels (sm90/). The emulator runs
 * it, but leaves FP_HAVE_STSM 0: its sm80 kernels are compiled once for every emulated device. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FP_HAVE_STSM 1
#else
#define FP_HAVE_STSM 0
#endif
FP_DEV void fp_stsm_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
#ifdef FP_CUDA_EMU
    const uint32_t r[4] = {r0, r1, r2, r3};
    fp_emu_stmatrix(addr, r, 4, 0);
#elif FP_HAVE_STSM
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
#endif
}

/* 2^x with the hardware approximation (2 ulp); 2^-inf = 0. */
FP_DEV float fp_exp2(float x)
{
#ifdef FP_CUDA_EMU
    return fp_emu_ex2_approx_ftz(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

/* 1 / x and log2 x with the hardware approximations (rcp.approx: 1 ulp; lg2.approx: about 2^-22
 * absolute): IEEE division and logf are each a branchy sequence per row, which the forward's
 * finalize paid for in every query block (docs/bench/archive/h200-2026-11-30-s6.md). */
FP_DEV float fp_rcp(float x)
{
#ifdef FP_CUDA_EMU
    return fp_emu_rcp_approx_ftz(x);
#else
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

FP_DEV float fp_log2(float x)
{
#ifdef FP_CUDA_EMU
    return fp_emu_lg2_approx_ftz(x);
#else
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

FP_DEV float fp_quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
FP_DEV float fp_quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#endif /* FLASHPORT_BACKENDS_CUDA_PTX_SM80_CUH */
