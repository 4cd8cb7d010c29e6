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

#define expf exp
#define exp2f exp2
#define logf log
#define tanhf tanh
