/*
 * Host-side state of the HIP backend, shared by hip_backend.cpp (plugin entry, device, memory,
 * stream) and hip_attention.cpp (planning and launching the attention kernels).
 */
#ifndef FLASHPORT_BACKENDS_HIP_HOST_H
#define FLASHPORT_BACKENDS_HIP_HOST_H

#include "backends/hip/hip_common.h"

#include <pthread.h>

/* The ops name: "hip", or "hipshim" for the nvcc test build (set by CMake). */
#ifndef FP_HIP_BACKEND_NAME
#define FP_HIP_BACKEND_NAME "hip"
#endif

typedef struct fp_hip_ctx {
    int device;
    hipStream_t stream; /* the caller's (flashport_set_stream); NULL = default stream */
    int cus;            /* compute units (SMs in the shim build) */
    char arch[64];      /* "gfx90a", ...; "sm_90" in the shim build */
    int cdna;           /* launch the MFMA kernels (mma_cdna.h) rather than the generic ones */
    /* Workspace for split-KV partials and the backward's delta, grown on demand (unless the
     * call brings the caller's, fp_problem.workspace, which is used instead). ws_free is
     * recorded after the last launch that used it; the next user's stream waits on it, so two
     * streams never share it at once. lock makes a handle safe to use from several threads. */
    pthread_mutex_t lock;
    void *ws;
    size_t ws_bytes;
    hipEvent_t ws_free;
} fp_hip_ctx;

/* The core's services (set by the plugin entry). */
const fp_host_api *fp_hip_host(void);

/* FLASHPORT_OK for hipSuccess; otherwise sets and returns FLASHPORT_ERR_DEVICE (or
 * FLASHPORT_ERR_OUT_OF_MEMORY) with the runtime's name and string for the error and `what`. */
flashport_status fp_hip_check(hipError_t err, const char *what);

/* Makes the handle's device current, keeping the caller's in *prev; fp_hip_leave restores it and
 * returns st (or the restore's error when st is OK). */
flashport_status fp_hip_enter(const fp_hip_ctx *ctx, int *prev);
flashport_status fp_hip_leave(const fp_hip_ctx *ctx, int prev, flashport_status st);

/* Validated problems (core/validate.c); tensors in device memory. */
flashport_status fp_hip_forward(fp_hip_ctx *ctx, const fp_problem *p);
flashport_status fp_hip_backward(fp_hip_ctx *ctx, const fp_problem *p);

/* The workspace bytes forward (backward = 0) or backward needs for p, with the kernel choice
 * and the refusals of a run; launches nothing. */
flashport_status fp_hip_workspace_size(fp_hip_ctx *ctx, const fp_problem *p, int backward,
                                       size_t *bytes);

#endif /* FLASHPORT_BACKENDS_HIP_HOST_H */
