/*
 * The CDNA tile-matmul policy of the HIP kernels (attention_tile.h): the only ISA-specific code
 * of the backend. MFMA v_mfma_f32_16x16x16f16 / v_mfma_f32_16x16x16_bf16 (the "_1k" bf16 form of
 * gfx90a and later), wave64, f32 accumulate. Built only for gfx90a and gfx94x (the CMake build
 * compiles the files that include this header for the CDNA subset of FLASHPORT_HIP_ARCHITECTURES);
 * gfx908's MFMA lacks the 4-element bf16 form, so gfx908 runs the generic path.
 *
 * One instruction multiplies a 16x16 block of A by a 16x16 block of B into a 16x16 f32 block
 * spread over a wave's 64 lanes (AMD's matrix-instruction layout for 16x16x16):
 *   A: lane l holds row l % 16, k = 4 * (l / 16) .. + 3     (4 x 16-bit in 64 bits)
 *   B: lane l holds col l % 16, k = 4 * (l / 16) .. + 3
 *   C: lane l holds col l % 16, rows 4 * (l / 16) .. + 3    (4 x f32)
 * The block's 4 waves split the output blocks of a tile between them:
 *   mm_abt   C[M][N] = A[M][:d] . B[N][:d]^T, dtype tiles in, f32 out to LDS;
 *   mm_acc   acc[ROWS][:d] += A[ROWS][K] . B[K][:d] with A f32 in LDS (any strides; converted to
 *            the dtype when loaded, which is exact since the shared code already rounded it) and
 *            the accumulator in registers, output block n of wave w being w + 4 n.
 * Contract shared with mma_generic.h: tiles are zero from d up to the next multiple of 16; the
 * accumulator says which (row, col) each element holds; all threads call, no barrier inside.
 *
 * Not run on hardware: no AMD GPU was available. CI checks that the gfx90a/gfx940 code objects of
 * the attention kernels contain v_mfma instructions (backends/hip/check_mfma.sh); everything
 * around these two functions is shared with the generic path, which is tested.
 */
#ifndef FLASHPORT_BACKENDS_HIP_MMA_CDNA_H
#define FLASHPORT_BACKENDS_HIP_MMA_CDNA_H

#include "backends/hip/attention_tile.h"

#if defined(__HIP_DEVICE_COMPILE__) && !defined(__gfx90a__) && !defined(__gfx940__) &&             \
    !defined(__gfx941__) && !defined(__gfx942__)
#error "mma_cdna.h is built only for gfx90a and gfx94x (see backends/hip/CMakeLists.txt)"
#endif

typedef float fp_cdna_f32x4 __attribute__((ext_vector_type(4)));
typedef short fp_cdna_i16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 fp_cdna_f16x4 __attribute__((ext_vector_type(4)));

template <class T> struct fp_cdna_mfma;

template <> struct fp_cdna_mfma<fp_hip_f16> {
    static __device__ __forceinline__ fp_cdna_f32x4 run(fp_cdna_i16x4 a, fp_cdna_i16x4 b,
                                                        fp_cdna_f32x4 c)
    {
        return __builtin_amdgcn_mfma_f32_16x16x16f16(
            __builtin_bit_cast(fp_cdna_f16x4, a), __builtin_bit_cast(fp_cdna_f16x4, b), c, 0, 0, 0);
    }
};

template <> struct fp_cdna_mfma<fp_hip_bf16> {
    static __device__ __forceinline__ fp_cdna_f32x4 run(fp_cdna_i16x4 a, fp_cdna_i16x4 b,
                                                        fp_cdna_f32x4 c)
    {
        return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
    }
};

struct fp_hip_mma_cdna {
    enum { WAVES = FP_HIP_THREADS / 64 };
    static_assert(WAVES * 64 == FP_HIP_THREADS, "whole wave64s");

    template <int ROWS, int DMAX> struct acc {
        enum { CB = DMAX / 16, BLOCKS = ROWS / 16 * CB, NB = BLOCKS / WAVES, N = NB * 4 };
        static_assert(ROWS % 16 == 0 && NB * WAVES == BLOCKS, "accumulator mapping");
        fp_cdna_f32x4 v[NB];

        __device__ __forceinline__ void zero()
        {
#pragma unroll
            for (int n = 0; n < NB; n++)
                v[n] = fp_cdna_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
        }
        __device__ __forceinline__ float get(int i) const
        {
            return v[i / 4][i % 4];
        }
        __device__ __forceinline__ void mul(int i, float f)
        {
            v[i / 4][i % 4] *= f;
        }
        static __device__ __forceinline__ int block(int n)
        {
            return threadIdx.x / 64 + n * WAVES;
        }
        static __device__ __forceinline__ int row(int i)
        {
            return block(i / 4) / CB * 16 + (threadIdx.x % 64) / 16 * 4 + i % 4;
        }
        static __device__ __forceinline__ int col(int i)
        {
            return block(i / 4) % CB * 16 + threadIdx.x % 16;
        }
    };

    template <class T, int M, int N, int LD, int LDC>
    static __device__ __forceinline__ void mm_abt(const uint16_t (*a)[LD], const uint16_t (*b)[LD],
                                                  int d, float (*c)[LDC])
    {
        static_assert(M % 16 == 0 && N % 16 == 0, "16x16 blocks");
        const int lane = threadIdx.x % 64, dpad = (d + 15) & ~15;
        for (int blk = threadIdx.x / 64; blk < M / 16 * (N / 16); blk += WAVES) {
            const int m0 = blk / (N / 16) * 16, n0 = blk % (N / 16) * 16;
            fp_cdna_f32x4 s = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k0 = 0; k0 < dpad; k0 += 16) {
                const int k = k0 + lane / 16 * 4;
                s = fp_cdna_mfma<T>::run(*(const fp_cdna_i16x4 *)&a[m0 + lane % 16][k],
                                         *(const fp_cdna_i16x4 *)&b[n0 + lane % 16][k], s);
            }
#pragma unroll
            for (int r = 0; r < 4; r++)
                c[m0 + lane / 16 * 4 + r][n0 + lane % 16] = s[r];
        }
    }

    template <class T, int K, int ROWS, int DMAX, int LD>
    static __device__ __forceinline__ void mm_acc(acc<ROWS, DMAX> &o, const float *a, int a_sm,
                                                  int a_sk, const uint16_t (*b)[LD], int d)
    {
        typedef acc<ROWS, DMAX> A;
        static_assert(K % 16 == 0, "16-deep steps");
        const int lane = threadIdx.x % 64;
#pragma unroll
        for (int n = 0; n < A::NB; n++) {
            const int m0 = A::block(n) / A::CB * 16, n0 = A::block(n) % A::CB * 16;
            if (n0 >= d)
                continue; /* a column block past the head dim: the same for the whole wave */
            for (int k0 = 0; k0 < K; k0 += 16) {
                const int k = k0 + lane / 16 * 4;
                fp_cdna_i16x4 x, y;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    x[e] = (short)T::store(a[(m0 + lane % 16) * a_sm + (k + e) * a_sk]);
                    y[e] = (short)b[k + e][n0 + lane % 16];
                }
                o.v[n] = fp_cdna_mfma<T>::run(x, y, o.v[n]);
            }
        }
    }
};

#endif /* FLASHPORT_BACKENDS_HIP_MMA_CDNA_H */
