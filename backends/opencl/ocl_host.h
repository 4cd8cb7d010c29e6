/*
 * Host-side state of the OpenCL backend, shared by ocl_backend.c (plugin entry, device choice,
 * memory, queue, timing events), ocl_memory.c (flashport pointers <-> buffer objects) and
 * ocl_attention.c (program build, tile plan, launches).
 *
 * The plugin links no OpenCL library: ocl_loader.c opens the ICD loader (libOpenCL.so.1) with
 * dlopen on the first open, so the plugin loads on any machine and a machine without OpenCL gets
 * FLASHPORT_ERR_NO_DEVICE with the loader's reason. CL/cl.h gives the types only.
 */
#ifndef FLASHPORT_BACKENDS_OPENCL_HOST_H
#define FLASHPORT_BACKENDS_OPENCL_HOST_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <CL/cl_ext.h> /* CL_PLATFORM_NOT_FOUND_KHR */

#include "backends/opencl/ocl_plan.h"
#include "core/backend.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* The OpenCL entry points the backend calls, resolved from the ICD loader. */
#define FP_OCL_FUNCTIONS(X)                                                                        \
    X(clGetPlatformIDs)                                                                            \
    X(clGetPlatformInfo)                                                                           \
    X(clGetDeviceIDs)                                                                              \
    X(clGetDeviceInfo)                                                                             \
    X(clCreateContext)                                                                             \
    X(clRetainContext)                                                                             \
    X(clReleaseContext)                                                                            \
    X(clCreateCommandQueue)                                                                        \
    X(clRetainCommandQueue)                                                                        \
    X(clReleaseCommandQueue)                                                                       \
    X(clGetCommandQueueInfo)                                                                       \
    X(clCreateBuffer)                                                                              \
    X(clReleaseMemObject)                                                                          \
    X(clEnqueueWriteBuffer)                                                                        \
    X(clEnqueueReadBuffer)                                                                         \
    X(clEnqueueFillBuffer)                                                                         \
    X(clFinish)                                                                                    \
    X(clCreateProgramWithSource)                                                                   \
    X(clBuildProgram)                                                                              \
    X(clGetProgramBuildInfo)                                                                       \
    X(clGetProgramInfo)                                                                            \
    X(clReleaseProgram)                                                                            \
    X(clCreateKernel)                                                                              \
    X(clReleaseKernel)                                                                             \
    X(clSetKernelArg)                                                                              \
    X(clGetKernelWorkGroupInfo)                                                                    \
    X(clEnqueueNDRangeKernel)                                                                      \
    X(clEnqueueMarkerWithWaitList)                                                                 \
    X(clWaitForEvents)                                                                             \
    X(clGetEventProfilingInfo)                                                                     \
    X(clReleaseEvent)

typedef struct fp_ocl_api {
#define FP_OCL_FIELD(name) __typeof__(name) *name;
    FP_OCL_FUNCTIONS(FP_OCL_FIELD)
#undef FP_OCL_FIELD
} fp_ocl_api;

/* The loaded API, or NULL with the reason (dlopen's or the missing symbol) in why. Loaded once
 * per process and kept. */
const fp_ocl_api *fp_ocl_load(char *why, size_t why_size);

/* One flashport_malloc: a buffer object and the address range that names it (ocl_memory.c). */
typedef struct fp_ocl_alloc {
    uintptr_t base;
    size_t bytes, reserved;
    cl_mem mem;
} fp_ocl_alloc;

/* One program key (dtype, head-dim class, tile size, variant, the FA2-shaped backward's query
 * block and fast path; kernels/flash.cl takes them as compile-time constants) and what building it
 * gave: its kernels, or failed = 1 when the driver refused a tensor-core build (kept so that the
 * key is not built again and its calls go to the plain path; every other key, tensor-core ones
 * included, is built on its own). ran[k]: kernel k (FP_OCL_KERNEL_*) has completed one run, checked
 * (ocl_attention.c's launch). */
typedef struct fp_ocl_program {
    flashport_dtype dtype;
    int64_t head_dim, tile;
    int variant; /* FP_OCL_PLAIN, FP_OCL_MMA_NV, ... (ocl_plan.h's enum) */
    int64_t bq;  /* FP_OCL_BQ: query rows per block of the FA2-shaped dK / dV and fused kernels */
    int fast;    /* FP_OCL_BWD_FAST: their full blocks' P by exp2 without per-pair tests */
    int failed;
    int ran[FP_OCL_KERNELS];
    cl_program program;
    /* fp_ocl_forward, fp_ocl_backward_dq, fp_ocl_backward_dkdv; in FA2-shaped programs also
     * fp_ocl_backward_prep, fp_ocl_backward_fused, fp_ocl_backward_dq_out (else NULL) */
    cl_kernel kernels[FP_OCL_KERNELS];
} fp_ocl_program;

enum { FP_OCL_MAX_PROGRAMS = 64 };

enum { FP_OCL_BWD_AUTO, FP_OCL_BWD_TWO, FP_OCL_BWD_FUSED };

typedef struct fp_ocl_ctx {
    const fp_ocl_api *cl;
    int index; /* FLASHPORT_DEVICE */
    /* What the handle opened, kept for flashport_set_stream(NULL). */
    cl_context own_context;
    cl_device_id own_device;
    cl_command_queue own_queue;
    /* What work goes to now: the own ones, or a caller's queue and its context and device. */
    cl_context context;
    cl_device_id device;
    cl_command_queue queue;
    char platform_name[128], device_name[128];
    size_t local_mem; /* bytes of local memory per work-group */
    size_t max_alloc; /* CL_DEVICE_MAX_MEM_ALLOC_SIZE: the largest one buffer may be */
    /* The tensor-core variant f16 / bf16 programs get (ocl_plan.h's fp_ocl_plan): FP_OCL_FA2_NV
     * on NVIDIA devices of compute capability >= 8.0, FP_OCL_PLAIN otherwise, unless
     * FLASHPORT_OPENCL_MMA says otherwise (ocl_backend.c's device_mma). */
    int mma;
    /* Whether the device is not a CPU: its programs are built with FP_OCL_UNROLL_ALL = 1
     * (kernels/shape.cl says why). */
    int unroll_all;
    /* The backward's form, from FLASHPORT_OPENCL_BWD when the handle was opened: FP_OCL_BWD_AUTO
     * (unset or any other value: one kernel wherever it serves), FP_OCL_BWD_TWO (`two`: the
     * two-kernel form always) or FP_OCL_BWD_FUSED (`fused`: as AUTO, and the log says why a call
     * did not take it); ocl_attention.c's use_fused. Read once, so that the workspace size query
     * and the call it sizes cannot see two values of the environment. */
    int bwd;
    /* The FA2-shaped backward's tuning, read at open like bwd: bwd_fast 0 where
     * FLASHPORT_OPENCL_BWD_FAST=0 (every pair by the exact per-pair code, exp), else 1 (full blocks
     * without softcap and ALiBi by exp2 of pre-scaled scores); bwd_bq16 1 where
     * FLASHPORT_OPENCL_BWD_BQ=16 (query blocks of 16 rows at every head-dim class, not
     * FP_OCL_FA2_BQ's 32 up to class 64). A program's key holds what it was built with. */
    int bwd_fast, bwd_bq16;
    /* Whether the tensor-core programs accumulate the one-kernel backward's dQ by vector
     * reductions (FP_OCL_RED_VEC, kernels/flash_fa2.cl): on NVIDIA devices of compute capability
     * >= 9.0 unless FLASHPORT_OPENCL_RED_VEC=0 (read with the device), and no longer once a
     * build with them failed. */
    int red_vec;
    /* Programs of the current context by key, built on first use and kept, failed tensor-core
     * builds included (ocl_attention.c); when the cache is full the oldest is released. */
    fp_ocl_program programs[FP_OCL_MAX_PROGRAMS];
    int num_programs;
    /* Live allocations, sorted by base. lock guards them, the queue and the programs. */
    pthread_mutex_t lock;
    fp_ocl_alloc *allocs;
    int num_allocs, cap_allocs;
} fp_ocl_ctx;

/* The core's services (set by the plugin entry). */
const fp_host_api *fp_ocl_host(void);

/* FLASHPORT_OK for CL_SUCCESS; otherwise sets and returns FLASHPORT_ERR_DEVICE (or
 * FLASHPORT_ERR_OUT_OF_MEMORY) naming `what` and the error code. */
flashport_status fp_ocl_check(cl_int err, const char *what);

/* ocl_memory.c; all take ctx->lock themselves. */
flashport_status fp_ocl_alloc_add(fp_ocl_ctx *ctx, cl_mem mem, size_t bytes, void **ptr);
flashport_status fp_ocl_alloc_remove(fp_ocl_ctx *ctx, void *ptr, cl_mem *mem);
/* The buffer holding [ptr, ptr + bytes) and ptr's byte offset in it; `what` names the pointer in
 * the error (FLASHPORT_ERR_INVALID_VALUE: not inside one allocation of this handle). Lock held. */
flashport_status fp_ocl_resolve(const fp_ocl_ctx *ctx, const void *ptr, size_t bytes,
                                const char *what, cl_mem *mem, size_t *offset);
void fp_ocl_alloc_release_all(fp_ocl_ctx *ctx);

/* ocl_attention.c. Validated problems; the lock is taken inside. */
flashport_status fp_ocl_forward(fp_ocl_ctx *ctx, const fp_problem *p);
flashport_status fp_ocl_backward(fp_ocl_ctx *ctx, const fp_problem *p);
/* The scratch bytes of a call (the backward's delta; the forward needs none), or the status the
 * call would refuse it with; launches nothing. */
flashport_status fp_ocl_workspace_size(fp_ocl_ctx *ctx, const fp_problem *p, int backward,
                                       size_t *bytes);
/* Releases the programs and kernels (the context is about to change or close). Lock held. */
void fp_ocl_release_programs(fp_ocl_ctx *ctx);

#endif /* FLASHPORT_BACKENDS_OPENCL_HOST_H */
