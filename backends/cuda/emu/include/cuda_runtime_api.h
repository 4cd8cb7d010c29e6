/*
 * cuda_runtime_api.h of the CUDA emulator (backends/cuda/emu/, see docs/cuda_emu.md): the part
 * of the CUDA runtime API that backends/cuda/ calls, declared for C (cuda_backend.c) and C++ (the
 * .cu files compiled for the CPU), implemented in cuda_emu.cpp. One device whose memory is host
 * memory, synchronous streams; the device properties come from FP_CUDA_EMU_SMEM_KIB (see
 * cudaGetDeviceProperties in cuda_emu.cpp). Error codes have CUDA 12's values.
 */
#ifndef FLASHPORT_CUDA_EMU_RUNTIME_API_H
#define FLASHPORT_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>

#define CUDART_VERSION 12040 /* what the emulator reports itself as (12.4) */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorSystemDriverMismatch = 803,
    cudaErrorCompatNotSupportedOnDevice = 804
} cudaError_t;

typedef struct fp_emu_stream *cudaStream_t;
typedef struct fp_emu_event *cudaEvent_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

/* cudaGetDriverEntryPointByVersion: the emulator knows one driver symbol, cuTensorMapEncodeTiled
 * (its own encoder, for the sm90 path's TMA maps). */
typedef enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2
} cudaDriverEntryPointQueryResult;
enum { cudaEnableDefault = 0 };

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;      /* without opt-in: 48 KiB */
    size_t sharedMemPerBlockOptin; /* FP_CUDA_EMU_SMEM_KIB */
    size_t sharedMemPerMultiprocessor;
    int regsPerBlock, warpSize, maxThreadsPerBlock, maxThreadsPerMultiProcessor;
    int major, minor, multiProcessorCount;
};

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
const char *cudaGetErrorString(cudaError_t err);
const char *cudaGetErrorName(cudaError_t err);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t stop);
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *func,
                                                          int block_size, size_t dynamic_smem);
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult *status);

#ifdef __cplusplus
}

/* The runtime's C++ overloads: a kernel is passed as itself, not as a const void *. */
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F *func, enum cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(func), attr, value);
}
template <class F>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, F *func,
                                                                        int block_size,
                                                                        size_t dynamic_smem)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        blocks, reinterpret_cast<const void *>(func), block_size, dynamic_smem);
}
#endif

#endif /* FLASHPORT_CUDA_EMU_RUNTIME_API_H */
