/*
 * hip_to_cuda.h: the HIP names that backends/hip/ uses, mapped to CUDA, so the HIP host code and
 * the generic kernels build with nvcc into the test plugin libflashport_hipshim.so
 * (FLASHPORT_HIP_SHIM=ON). It exists to run the HIP backend's logic (host code, tiling, masking,
 * online softmax, split-KV combine, backward) on an NVIDIA GPU when no AMD GPU is at hand; it is
 * not a general HIP-on-CUDA layer: it maps exactly the names backends/hip/ uses and nothing else.
 * The MFMA tile matmuls (mma_cdna.h) have no CUDA equivalent and are not built through it.
 *
 * Differences from HIP that matter here:
 *   - __shfl_xor without a mask is HIP's; CUDA needs the _sync form. Every call site in
 *     backends/hip/ is reached by all lanes of the warp, so the full mask is right.
 *   - hipLaunchKernelGGL becomes a triple-chevron launch of a kernel pointer; call sites pass a
 *     variable holding the kernel, never a template-id, so no commas hide in the macro arguments.
 *   - There is no gcnArchName: hip_common.h names CUDA devices "sm_<major><minor>".
 */
#ifndef FLASHPORT_BACKENDS_HIP_TO_CUDA_H
#define FLASHPORT_BACKENDS_HIP_TO_CUDA_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>

/* Types and constants. */
typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
typedef cudaDeviceProp hipDeviceProp_t;
typedef cudaEvent_t hipEvent_t;
#define hipSuccess            cudaSuccess
#define hipErrorOutOfMemory   cudaErrorMemoryAllocation
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipEventDisableTiming cudaEventDisableTiming

/* Runtime calls. */
#define hipGetDeviceCount                            cudaGetDeviceCount
#define hipGetDevice                                 cudaGetDevice
#define hipSetDevice                                 cudaSetDevice
#define hipGetDeviceProperties                       cudaGetDeviceProperties
#define hipGetErrorString                            cudaGetErrorString
#define hipGetErrorName                              cudaGetErrorName
#define hipGetLastError                              cudaGetLastError
#define hipMalloc                                    cudaMalloc
#define hipFree                                      cudaFree
#define hipMemcpyAsync                               cudaMemcpyAsync
#define hipStreamSynchronize                         cudaStreamSynchronize
#define hipDeviceSynchronize                         cudaDeviceSynchronize
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#define hipEventCreate                               cudaEventCreate
#define hipEventCreateWithFlags                      cudaEventCreateWithFlags
#define hipEventDestroy                              cudaEventDestroy
#define hipEventRecord                               cudaEventRecord
#define hipEventSynchronize                          cudaEventSynchronize
#define hipEventElapsedTime                          cudaEventElapsedTime
#define hipStreamWaitEvent                           cudaStreamWaitEvent

/* Kernel launch. */
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...)                                \
    (kernel)<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)

/* Device side. */
#define __shfl_xor(var, lane_mask, width) __shfl_xor_sync(0xffffffffu, (var), (lane_mask), (width))

#endif /* FLASHPORT_BACKENDS_HIP_TO_CUDA_H */
