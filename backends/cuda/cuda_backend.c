/*
 * The CUDA backend plugin (libflashport_cuda.so): the plugin entry point, device selection, caps,
 * memory helpers, the caller's stream, and dispatch to the kernel files.
 *
 * Built as a module with the static CUDA runtime and no link to libcuda: the runtime opens the
 * driver itself when first used, so on a machine without a driver or GPU the plugin still loads
 * and open() answers FLASHPORT_ERR_NO_DEVICE with the runtime's reason. Only
 * flashport_plugin_entry is exported (exports.map), so the runtime's own symbols never clash
 * with another CUDA runtime in the process (PyTorch's, say).
 *
 * Every call makes the handle's device current for its duration and restores the caller's
 * device afterwards; every launch and copy goes to the handle's stream (flashport_set_stream).
 * Every CUDA error becomes FLASHPORT_ERR_DEVICE (or OUT_OF_MEMORY) with cudaGetErrorString in
 * the message. flashport_timer uses cudaEvents recorded on the handle's stream.
 *
 * Scratch: each call sizes its scratch (layout staging + the kernels' split-KV partials or
 * backward row statistics) with the same kernel choice that runs it, then takes it from the
 * caller's workspace (flashport_set_workspace: then nothing is allocated) or from one
 * cudaMallocAsync on the handle's stream, freed on the stream after the kernels.
 *
 * Kernels: sm80 path (sm80/fwd.cuh, sm80/bwd.cuh) on compute capability 8.0 and later, f16 and
 * bf16, head dims that are multiples of 8 up to 256; on compute capability 9.0 the forward
 * (sm90/fwd.cuh: TMA + wgmma) and the backward up to head dim 128, not deterministic
 * (sm90/bwd.cuh) run on the sm90 path where TMA can read the tensors.
 * FLASHPORT_CUDA_PATH (sm80, sm90, auto; read at each call, for tests and A/B runs) forces a
 * path. f32 is not served (the caps leave it out, so the core answers
 * FLASHPORT_ERR_UNSUPPORTED_DTYPE).
 */
#include "backends/cuda/cuda_internal.h"
#include "core/dtype.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const fp_host_api *host;

flashport_status fp_cuda_error(flashport_status status, cudaError_t err, const char *what)
{
    return host->set_error(status, "cuda: %s: %s (%s)", what, cudaGetErrorString(err),
                           cudaGetErrorName(err));
}

flashport_status fp_cuda_refuse(flashport_status status, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return host->set_error(status, "cuda: %s", buf);
}

void fp_cuda_log(const char *fmt, ...)
{
    if (!host->log_enabled())
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    host->log("cuda: %s", buf);
}

/* Makes ctx's device current for one call; restores the caller's device in device_leave. */
static flashport_status device_enter(const fp_cuda_ctx *ctx, int *prev)
{
    cudaError_t e = cudaGetDevice(prev);
    if (e == cudaSuccess && *prev != ctx->device)
        e = cudaSetDevice(ctx->device);
    return e == cudaSuccess ? FLASHPORT_OK : fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "set device");
}

static flashport_status device_leave(const fp_cuda_ctx *ctx, int prev, flashport_status st)
{
    if (prev != ctx->device) {
        cudaError_t e = cudaSetDevice(prev);
        if (e != cudaSuccess && st == FLASHPORT_OK)
            return fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "restore device");
    }
    return st;
}

/* device_leave after one runtime call (or a chain of them) whose result is e, a failure named
 * `what`. */
static flashport_status device_leave_cuda(const fp_cuda_ctx *ctx, int prev, cudaError_t e,
                                          const char *what)
{
    return device_leave(
        ctx, prev, e == cudaSuccess ? FLASHPORT_OK : fp_cuda_error(FLASHPORT_ERR_DEVICE, e, what));
}

static flashport_status cuda_open(int device, void **out)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorInsufficientDriver) {
        cudaGetLastError();
        return host->set_error(FLASHPORT_ERR_NO_DEVICE,
                               "cuda: no usable CUDA driver (none installed, or older than CUDA "
                               "%d.%d that this plugin was built with): %s (%s)",
                               CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
                               cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (e == cudaErrorNoDevice || e == cudaErrorInitializationError ||
        e == cudaErrorSystemDriverMismatch || e == cudaErrorCompatNotSupportedOnDevice) {
        cudaGetLastError();
        return host->set_error(FLASHPORT_ERR_NO_DEVICE, "cuda: no usable CUDA device: %s (%s)",
                               cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (e != cudaSuccess)
        return host->set_error(FLASHPORT_ERR_NO_DEVICE, "cuda: cannot query devices: %s (%s)",
                               cudaGetErrorString(e), cudaGetErrorName(e));
    if (count == 0)
        return host->set_error(FLASHPORT_ERR_NO_DEVICE, "cuda: no CUDA device found");
    if (device < 0 || device >= count)
        return host->set_error(FLASHPORT_ERR_NO_DEVICE,
                               "cuda: device %d does not exist (%d device%s: 0..%d)", device, count,
                               count == 1 ? "" : "s", count - 1);

    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return fp_cuda_error(FLASHPORT_ERR_NO_DEVICE, e, "device properties");
    if (prop.major < 8)
        return host->set_error(FLASHPORT_ERR_NO_DEVICE,
                               "cuda: device %d (%s) has compute capability %d.%d; the CUDA "
                               "backend needs 8.0 or later",
                               device, prop.name, prop.major, prop.minor);

    fp_cuda_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return host->set_error(FLASHPORT_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    ctx->device = device;
    ctx->stream = NULL;
    ctx->sm_count = prop.multiProcessorCount;
    ctx->cc_major = prop.major;
    ctx->cc_minor = prop.minor;
    ctx->smem_optin = prop.sharedMemPerBlockOptin;
    fp_cuda_sm90_init(ctx);
    /* FLASHPORT_CUDA_SMEM_KIB lowers the shared memory the kernels may plan with, so that the
     * configurations of smaller GPUs (sm_80: 163 KiB, sm_86/89: 99 KiB) can be tested on a
     * larger one. */
    const char *cap = getenv("FLASHPORT_CUDA_SMEM_KIB");
    const long cap_kib = cap ? atol(cap) : 0;
    if (cap_kib > 0 && (size_t)cap_kib * 1024 < ctx->smem_optin)
        ctx->smem_optin = (size_t)cap_kib * 1024;
    fp_cuda_log("device %d: %s, compute capability %d.%d, %d SMs, %zu KiB shared memory per "
                "block",
                device, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                ctx->smem_optin / 1024);
    *out = ctx;
    return FLASHPORT_OK;
}

static void cuda_close(void *ctx)
{
    free(ctx);
}

static void cuda_caps(void *vctx, fp_backend_caps *caps)
{
    const fp_cuda_ctx *ctx = vctx;
    caps->dtypes_fwd = (1u << FLASHPORT_F16) | (1u << FLASHPORT_BF16);
    caps->dtypes_bwd = caps->dtypes_fwd;
    /* fp8 e4m3 forward: the sm90 path's kernels, on compute capability 9.0 with TMA */
    if (ctx && ctx->cc_major == 9 && ctx->cc_minor == 0 && ctx->encode_tiled)
        caps->dtypes_fwd |= 1u << FLASHPORT_FP8_E4M3;
    caps->max_head_dim = 256;
    caps->head_dim_multiple = 8;
    caps->needs_contiguous_dim = 1;
    caps->is_host = 0;
    /* Paged caches: the decode kernel (decode/fwd.cu), whose warps read 16 keys of one page. */
    caps->paged_kv_page_multiple = 16;
    caps->seqused_k_dirs = FP_SEQUSED_FWD | FP_SEQUSED_BWD;
}

static flashport_status cuda_malloc(void *vctx, size_t bytes, void **ptr)
{
    const fp_cuda_ctx *ctx = vctx;
    int prev;
    flashport_status st = device_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        st = host->set_error(FLASHPORT_ERR_OUT_OF_MEMORY, "cuda: cannot allocate %zu bytes: %s",
                             bytes, cudaGetErrorString(e));
    } else if (e != cudaSuccess) {
        st = fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "cudaMalloc");
    }
    return device_leave(ctx, prev, st);
}

static flashport_status cuda_free(void *vctx, void *ptr)
{
    const fp_cuda_ctx *ctx = vctx;
    int prev;
    flashport_status st = device_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    return device_leave_cuda(ctx, prev, cudaFree(ptr), "cudaFree");
}

/* Copies are ordered on the handle's stream and complete before returning. */
static flashport_status copy(const fp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes,
                             enum cudaMemcpyKind kind, const char *what)
{
    int prev;
    flashport_status st = device_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, ctx->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(ctx->stream);
    return device_leave_cuda(ctx, prev, e, what);
}

static flashport_status cuda_copy_to_device(void *ctx, void *dst, const void *src, size_t bytes)
{
    return copy(ctx, dst, src, bytes, cudaMemcpyHostToDevice, "copy to device");
}

static flashport_status cuda_copy_to_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    return copy(ctx, dst, src, bytes, cudaMemcpyDeviceToHost, "copy to host");
}

static flashport_status cuda_synchronize(void *vctx)
{
    const fp_cuda_ctx *ctx = vctx;
    int prev;
    flashport_status st = device_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    return device_leave_cuda(ctx, prev, cudaStreamSynchronize(ctx->stream), "synchronize");
}

static flashport_status cuda_set_stream(void *vctx, void *stream)
{
    fp_cuda_ctx *ctx = vctx;
    ctx->stream = (cudaStream_t)stream;
    return FLASHPORT_OK;
}

/* Events belong to the handle's device; they record on whatever stream the handle has at the time
 * of the record, so a timer spans the caller's stream when one is set. Timing only (no
 * cudaEventDisableTiming), default blocking behaviour: elapsed waits for `stop` by spinning on
 * cudaEventSynchronize, which is what a benchmark wants. */
static flashport_status cuda_event_create(void *vctx, void **event)
{
    const fp_cuda_ctx *ctx = vctx;
    int prev;
    flashport_status st = device_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreate(&ev);
    *event = e == cudaSuccess ? (void *)ev : NULL;
    return device_leave_cuda(ctx, prev, e, "cudaEventCreate");
}

static flashport_status cuda_event_record(void *vctx, void *event)
{
    const fp_cuda_ctx *ctx = vctx;
    int prev;
    flashport_status st = device_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    return device_leave_cuda(ctx, prev, cudaEventRecord((cudaEvent_t)event, ctx->stream),
                             "cudaEventRecord");
}

static flashport_status cuda_event_elapsed_ms(void *vctx, void *start, void *stop, float *ms)
{
    const fp_cuda_ctx *ctx = vctx;
    int prev;
    flashport_status st = device_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)stop);
    if (e == cudaSuccess)
        e = cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)stop);
    return device_leave_cuda(ctx, prev, e, "event elapsed time");
}

/* Destroy cannot report; a failure is cleared so that the next launch check does not see it. */
static void cuda_event_destroy(void *vctx, void *event)
{
    const fp_cuda_ctx *ctx = vctx;
    int prev;
    if (device_enter(ctx, &prev) != FLASHPORT_OK)
        return;
    if (cudaEventDestroy((cudaEvent_t)event) != cudaSuccess)
        cudaGetLastError();
    device_leave(ctx, prev, FLASHPORT_OK);
}

typedef enum { FP_CUDA_PATH_AUTO, FP_CUDA_PATH_SM80, FP_CUDA_PATH_SM90 } fp_cuda_path;

/* FLASHPORT_CUDA_PATH: unset, empty or "auto", "sm80", "sm90"; anything else is an error. */
static flashport_status cuda_path(fp_cuda_path *path)
{
    const char *env = getenv("FLASHPORT_CUDA_PATH");
    if (!env || !*env || strcmp(env, "auto") == 0)
        *path = FP_CUDA_PATH_AUTO;
    else if (strcmp(env, "sm80") == 0)
        *path = FP_CUDA_PATH_SM80;
    else if (strcmp(env, "sm90") == 0)
        *path = FP_CUDA_PATH_SM90;
    else
        return host->set_error(FLASHPORT_ERR_INVALID_VALUE,
                               "cuda: FLASHPORT_CUDA_PATH=\"%s\" is not one of auto, sm80, sm90",
                               env);
    return FLASHPORT_OK;
}

/* Whether a forward runs on the decode kernel: every paged call (no other kernel reads a paged
 * cache), and the decode shapes fp_cuda_decode_wanted picks unless FLASHPORT_CUDA_PATH=sm80. */
static int decode_path(const fp_problem *p, fp_cuda_path path)
{
    return !fp_is_fp8(p->dtype) &&
           (p->block_table || (path != FP_CUDA_PATH_SM80 && fp_cuda_decode_wanted(p)));
}

/* fp8 forwards run on the sm90 path's e4m3 kernels only, whatever the path setting asks; a call
 * they cannot serve is refused as a dtype this backend has no kernel for. */
static flashport_status fp8_forward(const fp_cuda_ctx *ctx, const fp_problem *p, fp_cuda_path path,
                                    void *ws, size_t *query)
{
    const char *why;
    if (path == FP_CUDA_PATH_SM80)
        why = "FLASHPORT_CUDA_PATH=sm80, and only the sm90 path has fp8 kernels";
    else if (p->block_table || p->seqused_k)
        why = "no fp8 kernel reads a KV cache (block_table, seqused_k)";
    else {
        const char *declined = NULL;
        flashport_status st = fp_cuda_sm90_forward(
            ctx, p, path == FP_CUDA_PATH_SM90 ? "FLASHPORT_CUDA_PATH=sm90" : "auto: fp8", &declined,
            ws, query);
        if (!declined)
            return st;
        why = declined;
    }
    return fp_cuda_refuse(FLASHPORT_ERR_UNSUPPORTED_DTYPE,
                          "no forward kernel for dtype %s for this call: %s",
                          p->dtype == FLASHPORT_FP8_E4M3 ? "fp8_e4m3" : "fp8_e5m2", why);
}

/* A call's path: a forward on the decode kernel for paged caches and decode shapes (every
 * device; decode_path), else sm90 where it runs (auto or forced), else sm80 (auto or forced);
 * forcing sm90 where it declines is an error that says why. The KV-cache calls are outside the
 * sm90 path's scope rather than refused by it: with sm90 forced, paged calls and decode shapes
 * still run on the decode kernel and seqused_k calls (forward and backward) on sm80, logged, so
 * that a run of the table with sm90 forced checks sm90 on everything it serves. query != NULL:
 * the scratch bytes of the chosen path (or its refusal), launching nothing. */
static flashport_status cuda_call_path(const fp_cuda_ctx *ctx, const fp_problem *p, int backward,
                                       void *ws, size_t *query)
{
    fp_cuda_path path = FP_CUDA_PATH_AUTO;
    flashport_status st = cuda_path(&path);
    if (st != FLASHPORT_OK)
        return st;
    const char *dir = backward ? "backward" : "forward";
    if (fp_is_fp8(p->dtype)) /* forward only (the core refuses fp8 backward calls) */
        return fp8_forward(ctx, p, path, ws, query);
    if (!backward && decode_path(p, path)) {
        if (path == FP_CUDA_PATH_SM90 && !query)
            fp_cuda_log("forward: decode kernel (FLASHPORT_CUDA_PATH=sm90, but %s: outside the "
                        "sm90 path)",
                        p->block_table ? "a paged KV cache" : "a decode shape");
        return fp_cuda_decode_forward(ctx, p, ws, query);
    }
    if (path != FP_CUDA_PATH_SM80 && p->seqused_k) {
        if (!query)
            fp_cuda_log("%s: sm80 path (%s, but seqused_k: outside the sm90 path)", dir,
                        path == FP_CUDA_PATH_SM90 ? "FLASHPORT_CUDA_PATH=sm90" : "auto");
        path = FP_CUDA_PATH_SM80;
    }
    if (path != FP_CUDA_PATH_SM80) {
        const char *declined = NULL;
        const char *why =
            path == FP_CUDA_PATH_SM90 ? "FLASHPORT_CUDA_PATH=sm90" : "auto: compute capability 9.0";
        st = backward ? fp_cuda_sm90_backward(ctx, p, why, &declined, ws, query)
                      : fp_cuda_sm90_forward(ctx, p, why, &declined, ws, query);
        if (!declined)
            return st;
        if (path == FP_CUDA_PATH_SM90)
            return fp_cuda_refuse(FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                                  "FLASHPORT_CUDA_PATH=sm90, but the sm90 path cannot run this "
                                  "%s: %s",
                                  dir, declined);
        if (!query)
            fp_cuda_log("%s: sm80 path (auto; the sm90 path declined: %s)", dir, declined);
    }
    return backward ? fp_cuda_sm80_backward(ctx, p, ws, query)
                    : fp_cuda_sm80_forward(ctx, p, ws, query);
}

/* Scratch bytes of a call: layout staging first, then the kernels' part (the device current),
 * sized on p itself: staging changes strides, never the sizes. A call gets room for either
 * path, since whether the sm90 path declines is decided on the staged layout. backward or
 * refuse: also return the refusal the call would give (flashport_attention_supported /
 * _workspace_size), decided on the staged layout as the run decides it. */
static flashport_status scratch_bytes(const fp_cuda_ctx *ctx, const fp_problem *p, int backward,
                                      int refuse, size_t *layout, size_t *kernels)
{
    *layout = fp_cuda_layout_bytes(p, backward);
    size_t k = 0;
    flashport_status st = FLASHPORT_OK;
    fp_cuda_path path = FP_CUDA_PATH_AUTO;
    if (cuda_path(&path) != FLASHPORT_OK)
        path = FP_CUDA_PATH_AUTO; /* the call itself reports the bad setting */
    if (!backward && decode_path(p, path)) {
        /* The decode kernel's choice does not depend on the staged layout. */
        st = fp_cuda_decode_forward(ctx, p, NULL, &k);
        *kernels = fp_cuda_ws_round(k);
        return st;
    }
    if (backward || refuse) {
        fp_problem staged;
        fp_cuda_layout_shape(p, backward, &staged);
        st = cuda_call_path(ctx, &staged, backward, NULL, &k);
    }
    if (st == FLASHPORT_OK) {
        size_t k90 = 0, k80 = 0;
        const char *declined;
        if ((backward
                 ? fp_cuda_sm90_backward(ctx, p, "query", &declined, NULL, &k90)
                 : fp_cuda_sm90_forward(ctx, p, "query", &declined, NULL, &k90)) == FLASHPORT_OK &&
            k90 > k)
            k = k90;
        if (!fp_is_fp8(p->dtype) &&
            (backward ? fp_cuda_sm80_backward(ctx, p, NULL, &k80)
                      : fp_cuda_sm80_forward(ctx, p, NULL, &k80)) == FLASHPORT_OK &&
            k80 > k)
            k = k80;
    }
    *kernels = fp_cuda_ws_round(k);
    return st;
}

static flashport_status cuda_workspace_size(void *vctx, const fp_problem *p, int backward,
                                            size_t *bytes)
{
    const fp_cuda_ctx *ctx = vctx;
    int prev;
    flashport_status st = device_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    size_t layout = 0, kernels = 0;
    st = scratch_bytes(ctx, p, backward, 1, &layout, &kernels);
    *bytes = st == FLASHPORT_OK ? layout + kernels : 0;
    return device_leave(ctx, prev, st);
}

/* Forward and backward alike: enter the device, size and take the scratch, stage tensors the
 * kernels cannot read in place (layout.cu), run the kernels (on the sm90 or sm80 path), copy
 * staged outputs back, release the scratch (when it is ours), leave the device. */
static flashport_status cuda_run(void *vctx, const fp_problem *p, int backward)
{
    const fp_cuda_ctx *ctx = vctx;
    int prev;
    flashport_status st = device_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    size_t layout = 0, kernels = 0;
    st = scratch_bytes(ctx, p, backward, 0, &layout, &kernels);
    void *ws = p->workspace, *owned = NULL;
    if (st == FLASHPORT_OK && ws && layout + kernels > p->workspace_bytes)
        st = host->set_error(FLASHPORT_ERR_BUFFER_TOO_SMALL,
                             "cuda: this %s needs %zu bytes of workspace; the handle's has %zu",
                             backward ? "backward" : "forward", layout + kernels,
                             p->workspace_bytes);
    if (st == FLASHPORT_OK && !ws && layout + kernels > 0) {
        cudaError_t e = cudaMallocAsync(&owned, layout + kernels, ctx->stream);
        if (e != cudaSuccess)
            st = fp_cuda_error(e == cudaErrorMemoryAllocation ? FLASHPORT_ERR_OUT_OF_MEMORY
                                                              : FLASHPORT_ERR_DEVICE,
                               e, "workspace");
        ws = owned;
    }
    fp_problem work;
    if (st == FLASHPORT_OK)
        st = fp_cuda_layout_begin(ctx, p, backward, &work, ws);
    if (st == FLASHPORT_OK) {
        void *kernel_ws = kernels ? (char *)ws + layout : NULL;
        flashport_status run = cuda_call_path(ctx, &work, backward, kernel_ws, NULL);
        st = fp_cuda_layout_end(ctx, p, &work, backward, run);
    }
    if (owned) {
        cudaError_t e = cudaFreeAsync(owned, ctx->stream);
        if (e != cudaSuccess && st == FLASHPORT_OK)
            st = fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "workspace release");
    }
    return device_leave(ctx, prev, st);
}

/* Enumeration without a handle: a runtime that finds no driver or device counts 0. */
static flashport_status cuda_device_count(int *count)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        n = 0;
    }
    *count = n;
    return FLASHPORT_OK;
}

static flashport_status cuda_device_props(int device, flashport_device_props *props)
{
    int n = 0;
    cuda_device_count(&n);
    if (device >= n)
        return host->set_error(FLASHPORT_ERR_NO_DEVICE,
                               "cuda: device %d does not exist (%d device%s)", device, n,
                               n == 1 ? "" : "s");
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "device properties");
    snprintf(props->name, sizeof props->name, "%s", prop.name);
    snprintf(props->arch, sizeof props->arch, "sm_%d%d", prop.major, prop.minor);
    props->total_memory = prop.totalGlobalMem;
    props->compute_major = prop.major;
    props->compute_minor = prop.minor;
    props->multiprocessors = prop.multiProcessorCount;
    return FLASHPORT_OK;
}

static flashport_status cuda_forward(void *vctx, const fp_problem *p)
{
    return cuda_run(vctx, p, 0);
}

static flashport_status cuda_backward(void *vctx, const fp_problem *p)
{
    return cuda_run(vctx, p, 1);
}

static const fp_backend_ops cuda_ops = {
    .api_version = FP_PLUGIN_API_VERSION,
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .caps = cuda_caps,
    .malloc_fn = cuda_malloc,
    .free_fn = cuda_free,
    .copy_to_device = cuda_copy_to_device,
    .copy_to_host = cuda_copy_to_host,
    .synchronize = cuda_synchronize,
    .set_stream = cuda_set_stream,
    .forward = cuda_forward,
    .backward = cuda_backward,
    .event_create = cuda_event_create,
    .event_record = cuda_event_record,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .event_destroy = cuda_event_destroy,
    .workspace_size = cuda_workspace_size,
    .device_count = cuda_device_count,
    .device_props = cuda_device_props,
};

__attribute__((visibility("default"))) flashport_status
flashport_plugin_entry(uint32_t core_api_version, const fp_host_api *host_api,
                       const fp_backend_ops **ops)
{
    return fp_plugin_accept(core_api_version, host_api, ops, &host, &cuda_ops);
}
