/*
 * The generic tile-matmul policy of the HIP kernels (attention_tile.h): plain f32 FMAs on values
 * read from LDS, no matrix instructions, no cross-lane operations, so it is correct for any wave
 * size: CDNA (wave64), RDNA (wave32 or wave64) and, through hip_to_cuda.h, NVIDIA warps.
 *
 *   mm_abt   C[M][N] = A[M][:d] . B[N][:d]^T  (dtype tiles in, f32 tile out to LDS); each thread
 *            computes a TM x TN register block with rows and columns strided across the tile,
 *            reading 8 elements (16 bytes) of A and B per step.
 *   mm_acc   acc[ROWS][:d] += A[ROWS][K] . B[K][:d]  (A f32 in LDS with any strides, B a dtype
 *            tile); the accumulator lives in registers: thread t holds 8 consecutive columns
 *            (chunk t % (DMAX/8)) of rows t / (DMAX/8) + i * (threads / (DMAX/8)).
 *
 * Contract shared with mma_cdna.h: the loaders zero the tiles from d up to the next multiple of
 * 16, the accumulator type says which (row, col) each of its N elements holds, and every thread
 * of the block calls these functions (no __syncthreads inside).
 */
#ifndef FLASHPORT_BACKENDS_HIP_MMA_GENERIC_H
#define FLASHPORT_BACKENDS_HIP_MMA_GENERIC_H

#include "backends/hip/attention_tile.h"

struct fp_hip_mma_generic {
    template <int ROWS, int DMAX> struct acc {
        enum { CH = DMAX / 8, RG = FP_HIP_THREADS / CH, N = ROWS / RG * 8 };
        static_assert(RG * CH == FP_HIP_THREADS && ROWS % RG == 0, "accumulator mapping");
        float v[N];

        __device__ __forceinline__ void zero()
        {
#pragma unroll
            for (int i = 0; i < N; i++)
                v[i] = 0.0f;
        }
        __device__ __forceinline__ float get(int i) const
        {
            return v[i];
        }
        __device__ __forceinline__ void mul(int i, float f)
        {
            v[i] *= f;
        }
        static __device__ __forceinline__ int row(int i)
        {
            return threadIdx.x / CH + (i / 8) * RG;
        }
        static __device__ __forceinline__ int col(int i)
        {
            return (threadIdx.x % CH) * 8 + i % 8;
        }
    };

    template <class T, int M, int N, int LD, int LDC>
    static __device__ __forceinline__ void mm_abt(const uint16_t (*a)[LD], const uint16_t (*b)[LD],
                                                  int d, float (*c)[LDC])
    {
        enum {
            E = M * N / FP_HIP_THREADS,
            TN = E < 4 ? E : 4,
            TM = E / TN,
            NC = N / TN,
            MR = M / TM
        };
        static_assert(E >= 1 && TM * TN == E && MR * NC == FP_HIP_THREADS, "score tile mapping");
        const int tn = threadIdx.x % NC, tm = threadIdx.x / NC;
        float s[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++)
                s[i][j] = 0.0f;
        for (int k0 = 0; k0 < d; k0 += 8) {
            float x[TM][8], y[TN][8];
#pragma unroll
            for (int i = 0; i < TM; i++)
                fp_hip_unpack8<T>(*(const uint4 *)&a[tm + i * MR][k0], x[i]);
#pragma unroll
            for (int j = 0; j < TN; j++)
                fp_hip_unpack8<T>(*(const uint4 *)&b[tn + j * NC][k0], y[j]);
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++)
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        s[i][j] += x[i][e] * y[j][e];
        }
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++)
                c[tm + i * MR][tn + j * NC] = s[i][j];
    }

    template <class T, int K, int ROWS, int DMAX, int LD>
    static __device__ __forceinline__ void mm_acc(acc<ROWS, DMAX> &o, const float *a, int a_sm,
                                                  int a_sk, const uint16_t (*b)[LD], int d)
    {
        typedef acc<ROWS, DMAX> A;
        const int cc = threadIdx.x % A::CH, rg = threadIdx.x / A::CH;
        if (cc * 8 >= d)
            return; /* this thread's columns lie past the head dim */
        for (int k = 0; k < K; k++) {
            float y[8];
            fp_hip_unpack8<T>(*(const uint4 *)&b[k][cc * 8], y);
#pragma unroll
            for (int i = 0; i < A::N / 8; i++) {
                const float x = a[(rg + i * A::RG) * a_sm + k * a_sk];
#pragma unroll
                for (int e = 0; e < 8; e++)
                    o.v[i * 8 + e] += x * y[e];
            }
        }
    }
};

#endif /* FLASHPORT_BACKENDS_HIP_MMA_GENERIC_H */
