/*
 * FP_INLINE: a function qualifier for the small math headers of core/ that the C host code, the
 * CUDA kernels and the HIP kernels all include, so masking and online softmax exist once.
 */
#ifndef FLASHPORT_CORE_FP_INLINE_H
#define FLASHPORT_CORE_FP_INLINE_H

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FP_INLINE static __host__ __device__ __forceinline__
#else
#define FP_INLINE static inline
#endif

#endif /* FLASHPORT_CORE_FP_INLINE_H */
