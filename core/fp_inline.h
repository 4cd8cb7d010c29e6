/*
 * FP_INLINE: a function qualifier for the small math headers of core/ that the C host code, the
 * CUDA kernels, the HIP kernels and the OpenCL kernels all include, so masking, online softmax
 * and geometry exist once. FP_GLOBAL: the address space of the device arrays those headers read
 * (cu_seqlens, seqused_k, the block table): nothing, except in the OpenCL program, whose prelude
 * (backends/opencl/kernels/prelude.cl) sets it to __global first.
 */
#ifndef FLASHPORT_CORE_FP_INLINE_H
#define FLASHPORT_CORE_FP_INLINE_H

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FP_INLINE static __host__ __device__ __forceinline__
#else
#define FP_INLINE static inline
#endif

#ifndef FP_GLOBAL
#define FP_GLOBAL
#endif

#endif /* FLASHPORT_CORE_FP_INLINE_H */
