/*
 * hip_emu.h: a CPU emulation of the HIP names that backends/hip/ uses, force-included (-include)
 * when run_emu.sh builds the backend's sources with clang++ into libflashport_hipemu.so (backend
 * "hipemu"). It runs the backend's host code and both kernel paths on a CPU, so that the shared
 * test table can exercise them on a machine with no GPU:
 *   - a kernel launch runs the grid's blocks one after another, each with FP_HIP_THREADS host
 *     threads; __syncthreads is a barrier of those threads, __shared__ variables are statics
 *     (one block at a time uses them), __shfl_xor exchanges through a slot per thread;
 *   - the MFMA builtins of mma_cdna.h are computed per wave of 64 threads from the operand layout
 *     AMD documents for v_mfma_f32_16x16x16{f16,bf16_1k} (see hip_emu.cpp), with a barrier per
 *     wave, so the CDNA path's fragment indexing, block distribution and accumulator mapping run
 *     for real; device memory is host memory and streams are synchronous, so an event records
 *     the host clock.
 * What it cannot show: that the hardware agrees with the documented layout, memory-ordering or
 * timing effects, or speed. It defines the shim's include guard, so hip_to_cuda.h adds nothing.
 */
#ifndef FLASHPORT_BACKENDS_HIP_EMU_H
#define FLASHPORT_BACKENDS_HIP_EMU_H
#define FLASHPORT_BACKENDS_HIP_TO_CUDA_H

#include "core/dtype.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 gridDim;

struct uint4 {
    uint32_t x, y, z, w;
};
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
    uint4 r = {a, b, c, d};
    return r;
}

struct __half {
    uint16_t x;
};
static inline float __half2float(__half h)
{
    return fp_f16_to_f32(h.x);
}
static inline __half __float2half_rn(float f)
{
    __half h = {fp_f32_to_f16(f)};
    return h;
}
static inline __half __ushort_as_half(uint16_t b)
{
    __half h = {b};
    return h;
}
static inline uint16_t __half_as_ushort(__half h)
{
    return h.x;
}
static inline float __uint_as_float(uint32_t u)
{
    return fp_bits_f32(u);
}
static inline uint32_t __float_as_uint(float f)
{
    return fp_f32_bits(f);
}

void __syncthreads(void);
float emu_shfl_xor(float v, int lane_mask);
#define __shfl_xor(var, lane_mask, width) emu_shfl_xor((var), (lane_mask))

typedef float emu_f32x4 __attribute__((ext_vector_type(4)));
typedef short emu_i16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 emu_f16x4 __attribute__((ext_vector_type(4)));
emu_f32x4 emu_mfma_16x16x16(emu_i16x4 a, emu_i16x4 b, emu_f32x4 c, int bf16);
static inline emu_f32x4 emu_mfma_f16(emu_f16x4 a, emu_f16x4 b, emu_f32x4 c, int, int, int)
{
    return emu_mfma_16x16x16(__builtin_bit_cast(emu_i16x4, a), __builtin_bit_cast(emu_i16x4, b), c,
                             0);
}
static inline emu_f32x4 emu_mfma_bf16(emu_i16x4 a, emu_i16x4 b, emu_f32x4 c, int, int, int)
{
    return emu_mfma_16x16x16(a, b, c, 1);
}
#define __builtin_amdgcn_mfma_f32_16x16x16f16     emu_mfma_f16
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k emu_mfma_bf16

typedef int hipError_t;
typedef void *hipStream_t;
typedef struct emu_event *hipEvent_t; /* the host clock at the last record */
typedef struct hipDeviceProp_t {
    char name[64];
    size_t totalGlobalMem;
    int major, minor, multiProcessorCount;
} hipDeviceProp_t;
#define hipSuccess            0
#define hipErrorOutOfMemory   2
#define hipMemcpyHostToDevice 1
#define hipMemcpyDeviceToHost 2
#define hipEventDisableTiming 2

hipError_t hipGetDeviceCount(int *count);
hipError_t hipGetDevice(int *device);
hipError_t hipSetDevice(int device);
hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int device);
const char *hipGetErrorString(hipError_t err);
const char *hipGetErrorName(hipError_t err);
hipError_t hipGetLastError(void);
hipError_t hipMalloc(void **ptr, size_t bytes);
hipError_t hipFree(void *ptr);
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, hipStream_t stream);
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipDeviceSynchronize(void);
hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *kernel,
                                                        int threads, size_t shmem);
hipError_t hipEventCreate(hipEvent_t *event);
hipError_t hipEventCreateWithFlags(hipEvent_t *event, int flags);
hipError_t hipEventDestroy(hipEvent_t event);
hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream);
hipError_t hipEventSynchronize(hipEvent_t event);
hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop);
hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, int flags);

struct fp_hip_args;
void emu_launch(void (*kernel)(struct fp_hip_args), dim3 grid, struct fp_hip_args args);
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...)                                \
    emu_launch((kernel), (grid), __VA_ARGS__)

#endif /* FLASHPORT_BACKENDS_HIP_EMU_H */
