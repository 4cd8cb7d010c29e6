/*
 * First part of the OpenCL program (backends/opencl/CMakeLists.txt puts it before core/'s
 * headers): the OpenCL C spellings of what those headers take from <stdint.h> and <math.h>, whose
 * #include lines the build step drops. With these, core/mask.h and core/online_softmax.h compile
 * unchanged as OpenCL C, so the kernels call the same masking and online-softmax functions as the
 * C, CUDA and HIP code.
 */
typedef long int64_t;
typedef int int32_t;
typedef uint uint32_t;

/* core/geometry.h's device arrays (cu_seqlens, seqused_k, the block table) are kernel arguments,
 * in the __global address space (an unqualified pointer is __private in OpenCL C 1.2). */
#define FP_GLOBAL __global

#define expf exp
#define exp2f exp2
#define logf log
#define tanhf tanh
