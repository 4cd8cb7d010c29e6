/*
 * The HIP backend plugin: libflashport_hip.so (HIP, AMD GPUs), or libflashport_hipshim.so when
 * the same file is built by nvcc through hip_to_cuda.h (FLASHPORT_HIP_SHIM, a test plugin that
 * runs this host code and the generic kernels on NVIDIA GPUs). It exports one symbol,
 * flashport_plugin_entry (core/backend.h); the rest is the ops table: device selection, memory
 * helpers and the caller's stream, timing events for flashport_timer, and every runtime error
 * turned into a status and message.
 *
 * "No device" is FLASHPORT_ERR_NO_DEVICE with the runtime's own reason: the runtime finds no GPU
 * or no driver, the index is out of range, or the device's target is not among the targets the
 * plugin was built for (FLASHPORT_HIP_ARCHITECTURES). A machine without the HIP runtime library
 * cannot load the plugin at all; the core reports that as "backend unavailable" with the loader's
 * message (libamdhip64 not found).
 */
#include "backends/hip/hip_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const fp_host_api *host_api;

const fp_host_api *fp_hip_host(void)
{
    return host_api;
}

/* "hipErrorNoDevice: no ROCm-capable device is detected", or the name alone where the runtime's
 * string is the name again (ROCm 5.2 does that for some errors). */
static void error_text(hipError_t err, char *buf, size_t size)
{
    const char *name = hipGetErrorName(err), *text = hipGetErrorString(err);
    if (strcmp(name, text) == 0)
        snprintf(buf, size, "%s", name);
    else
        snprintf(buf, size, "%s: %s", name, text);
}

flashport_status fp_hip_check(hipError_t err, const char *what)
{
    if (err == hipSuccess)
        return FLASHPORT_OK;
    char text[256];
    error_text(err, text, sizeof text);
    flashport_status st =
        err == hipErrorOutOfMemory ? FLASHPORT_ERR_OUT_OF_MEMORY : FLASHPORT_ERR_DEVICE;
    return host_api->set_error(st, "%s: %s failed: %s", FP_HIP_BACKEND_NAME, what, text);
}

#if defined(FP_HIP_HAVE_CDNA) || !defined(FP_HIP_SHIM)
/* Is `name` one of the comma-separated targets in `list`? */
static int in_list(const char *name, const char *list)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && strncmp(p, name, n) == 0)
            return 1;
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}
#endif

/* Which kernel path a device runs: the MFMA kernels where they were built for its target, unless
 * FLASHPORT_HIP_KERNEL=generic asks for the generic ones (to cross-check the two on hardware). */
static int use_cdna(const char *arch)
{
#ifdef FP_HIP_HAVE_CDNA
    const char *env = getenv("FLASHPORT_HIP_KERNEL");
    if (env && strcmp(env, "generic") == 0)
        return 0;
    return in_list(arch, FP_HIP_CDNA_TARGETS);
#else
    (void)arch;
    return 0;
#endif
}

static flashport_status hip_open(int device, void **out)
{
    int count = 0;
    hipError_t err = hipGetDeviceCount(&count);
    if (err != hipSuccess) {
        char text[256];
        error_text(err, text, sizeof text);
        (void)hipGetLastError(); /* a failed probe must not leak into the caller's next check */
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                                   "%s: no device: the runtime finds no usable GPU "
                                   "(hipGetDeviceCount: %s)",
                                   FP_HIP_BACKEND_NAME, text);
    }
    if (count == 0)
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                                   "%s: no device: the runtime sees no GPU", FP_HIP_BACKEND_NAME);
    if (device >= count)
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                                   "%s: no device %d (FLASHPORT_DEVICE): the runtime sees %d",
                                   FP_HIP_BACKEND_NAME, device, count);
    hipDeviceProp_t prop;
    flashport_status st =
        fp_hip_check(hipGetDeviceProperties(&prop, device), "hipGetDeviceProperties");
    if (st != FLASHPORT_OK)
        return st;
    char arch[64];
    fp_hip_arch_name(&prop, arch, sizeof arch);
#ifndef FP_HIP_SHIM
    if (!in_list(arch, FP_HIP_TARGETS))
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                                   "%s: device %d is %s (%s), which this plugin was not built for "
                                   "(targets %s); rebuild with it in FLASHPORT_HIP_ARCHITECTURES",
                                   FP_HIP_BACKEND_NAME, device, arch, prop.name, FP_HIP_TARGETS);
#endif

    fp_hip_ctx *ctx = (fp_hip_ctx *)calloc(1, sizeof *ctx);
    if (!ctx)
        return host_api->set_error(FLASHPORT_ERR_OUT_OF_MEMORY, "%s: cannot allocate a context",
                                   FP_HIP_BACKEND_NAME);
    ctx->device = device;
    int prev;
    st = fp_hip_enter(ctx, &prev);
    if (st == FLASHPORT_OK)
        st =
            fp_hip_leave(ctx, prev,
                         fp_hip_check(hipEventCreateWithFlags(&ctx->ws_free, hipEventDisableTiming),
                                      "hipEventCreateWithFlags"));
    if (st != FLASHPORT_OK) {
        free(ctx);
        return st;
    }
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->cus = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    memcpy(ctx->arch, arch, sizeof arch);
    ctx->cdna = use_cdna(arch);
    if (host_api->log_enabled())
        host_api->log("%s: device %d: %s (%s), %d compute units, %s kernels", FP_HIP_BACKEND_NAME,
                      device, prop.name, arch, ctx->cus, ctx->cdna ? "CDNA (MFMA)" : "generic");
    *out = ctx;
    return FLASHPORT_OK;
}

static void hip_close(void *p)
{
    fp_hip_ctx *ctx = (fp_hip_ctx *)p;
    if (!ctx)
        return;
    int prev;
    if (fp_hip_enter(ctx, &prev) == FLASHPORT_OK) {
        if (ctx->ws) {
            (void)hipDeviceSynchronize(); /* kernels may still read it */
            (void)hipFree(ctx->ws);
        }
        (void)hipEventDestroy(ctx->ws_free);
        (void)fp_hip_leave(ctx, prev, FLASHPORT_OK);
    }
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

static void hip_caps(void *ctx, fp_backend_caps *caps)
{
    (void)ctx;
    caps->dtypes_fwd = (1u << FLASHPORT_F16) | (1u << FLASHPORT_BF16);
    caps->dtypes_bwd = caps->dtypes_fwd;
    caps->max_head_dim = FP_HIP_MAX_HEAD_DIM;
    caps->head_dim_multiple = FP_HIP_HEAD_DIM_MULTIPLE;
    caps->needs_contiguous_dim = 1;
    caps->is_host = 0;
    /* Paged caches (forward) and seqused_k: attention_tile.h. */
    caps->paged_kv_page_multiple = 16;
    caps->seqused_k_dirs = FP_SEQUSED_FWD | FP_SEQUSED_BWD;
}

/* Every entry point runs on the handle's device and gives the calling thread its current device
 * back, so the library can live inside a program that uses several GPUs. */
flashport_status fp_hip_enter(const fp_hip_ctx *ctx, int *prev)
{
    flashport_status st = fp_hip_check(hipGetDevice(prev), "hipGetDevice");
    if (st == FLASHPORT_OK && *prev != ctx->device)
        st = fp_hip_check(hipSetDevice(ctx->device), "hipSetDevice");
    return st;
}

flashport_status fp_hip_leave(const fp_hip_ctx *ctx, int prev, flashport_status st)
{
    if (prev != ctx->device) {
        flashport_status st2 = fp_hip_check(hipSetDevice(prev), "hipSetDevice");
        if (st == FLASHPORT_OK)
            st = st2;
    }
    return st;
}

static flashport_status hip_malloc(void *p, size_t bytes, void **ptr)
{
    fp_hip_ctx *ctx = (fp_hip_ctx *)p;
    int prev;
    flashport_status st = fp_hip_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    return fp_hip_leave(ctx, prev, fp_hip_check(hipMalloc(ptr, bytes), "hipMalloc"));
}

static flashport_status hip_free(void *p, void *ptr)
{
    fp_hip_ctx *ctx = (fp_hip_ctx *)p;
    int prev;
    flashport_status st = fp_hip_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    return fp_hip_leave(ctx, prev, fp_hip_check(hipFree(ptr), "hipFree"));
}

/* Copies go through the caller's stream, so they are ordered with its kernels, and return when
 * done (flashport.h: copies are synchronous with respect to the host). */
static flashport_status copy(fp_hip_ctx *ctx, void *dst, const void *src, size_t bytes,
                             int to_device)
{
    int prev;
    flashport_status st = fp_hip_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    st = fp_hip_check(
        hipMemcpyAsync(dst, src, bytes, to_device ? hipMemcpyHostToDevice : hipMemcpyDeviceToHost,
                       ctx->stream),
        to_device ? "hipMemcpyAsync (host to device)" : "hipMemcpyAsync (device to host)");
    if (st == FLASHPORT_OK)
        st = fp_hip_check(hipStreamSynchronize(ctx->stream), "hipStreamSynchronize");
    return fp_hip_leave(ctx, prev, st);
}

static flashport_status hip_copy_to_device(void *p, void *dst, const void *src, size_t bytes)
{
    return copy((fp_hip_ctx *)p, dst, src, bytes, 1);
}

static flashport_status hip_copy_to_host(void *p, void *dst, const void *src, size_t bytes)
{
    return copy((fp_hip_ctx *)p, dst, src, bytes, 0);
}

static flashport_status hip_synchronize(void *p)
{
    fp_hip_ctx *ctx = (fp_hip_ctx *)p;
    int prev;
    flashport_status st = fp_hip_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    return fp_hip_leave(ctx, prev,
                        fp_hip_check(hipStreamSynchronize(ctx->stream), "hipStreamSynchronize"));
}

static flashport_status hip_set_stream(void *p, void *stream)
{
    fp_hip_ctx *ctx = (fp_hip_ctx *)p;
    pthread_mutex_lock(&ctx->lock);
    ctx->stream = (hipStream_t)stream;
    pthread_mutex_unlock(&ctx->lock);
    return FLASHPORT_OK;
}

/* flashport_timer's events: timing events of the handle's device, recorded on the handle's stream
 * as it is at the time of the record (read under the lock, as flashport_set_stream writes it). */
static flashport_status hip_event_create(void *p, void **event)
{
    fp_hip_ctx *ctx = (fp_hip_ctx *)p;
    int prev;
    *event = NULL;
    flashport_status st = fp_hip_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    hipEvent_t ev;
    st = fp_hip_check(hipEventCreate(&ev), "hipEventCreate");
    if (st == FLASHPORT_OK)
        *event = (void *)ev;
    return fp_hip_leave(ctx, prev, st);
}

static flashport_status hip_event_record(void *p, void *event)
{
    fp_hip_ctx *ctx = (fp_hip_ctx *)p;
    int prev;
    flashport_status st = fp_hip_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    pthread_mutex_lock(&ctx->lock);
    hipStream_t stream = ctx->stream;
    pthread_mutex_unlock(&ctx->lock);
    return fp_hip_leave(ctx, prev,
                        fp_hip_check(hipEventRecord((hipEvent_t)event, stream), "hipEventRecord"));
}

static flashport_status hip_event_elapsed_ms(void *p, void *start, void *stop, float *ms)
{
    fp_hip_ctx *ctx = (fp_hip_ctx *)p;
    int prev;
    flashport_status st = fp_hip_enter(ctx, &prev);
    if (st != FLASHPORT_OK)
        return st;
    st = fp_hip_check(hipEventSynchronize((hipEvent_t)stop), "hipEventSynchronize");
    if (st == FLASHPORT_OK)
        st = fp_hip_check(hipEventElapsedTime(ms, (hipEvent_t)start, (hipEvent_t)stop),
                          "hipEventElapsedTime");
    return fp_hip_leave(ctx, prev, st);
}

/* Nothing to report to: a failed destroy is dropped, as in hip_close. */
static void hip_event_destroy(void *p, void *event)
{
    fp_hip_ctx *ctx = (fp_hip_ctx *)p;
    int prev;
    if (fp_hip_enter(ctx, &prev) != FLASHPORT_OK)
        return;
    (void)hipEventDestroy((hipEvent_t)event);
    (void)fp_hip_leave(ctx, prev, FLASHPORT_OK);
}

static flashport_status hip_forward(void *ctx, const fp_problem *p)
{
    return fp_hip_forward((fp_hip_ctx *)ctx, p);
}

static flashport_status hip_backward(void *ctx, const fp_problem *p)
{
    return fp_hip_backward((fp_hip_ctx *)ctx, p);
}

static flashport_status hip_workspace_size(void *ctx, const fp_problem *p, int backward,
                                           size_t *bytes)
{
    return fp_hip_workspace_size((fp_hip_ctx *)ctx, p, backward, bytes);
}

/* Enumeration without a handle: a runtime that finds no usable GPU counts 0. */
static flashport_status hip_device_count(int *count)
{
    int n = 0;
    if (hipGetDeviceCount(&n) != hipSuccess) {
        (void)hipGetLastError();
        n = 0;
    }
    *count = n;
    return FLASHPORT_OK;
}

static flashport_status hip_device_props(int device, flashport_device_props *props)
{
    int n = 0;
    hip_device_count(&n);
    if (device >= n)
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE, "%s: no device %d: the runtime sees %d",
                                   FP_HIP_BACKEND_NAME, device, n);
    hipDeviceProp_t prop;
    flashport_status st =
        fp_hip_check(hipGetDeviceProperties(&prop, device), "hipGetDeviceProperties");
    if (st != FLASHPORT_OK)
        return st;
    snprintf(props->name, sizeof props->name, "%s", prop.name);
    fp_hip_arch_name(&prop, props->arch, sizeof props->arch);
    props->total_memory = prop.totalGlobalMem;
    props->compute_major = prop.major;
    props->compute_minor = prop.minor;
    props->multiprocessors = prop.multiProcessorCount;
    return FLASHPORT_OK;
}

static const fp_backend_ops hip_ops = {
    FP_PLUGIN_API_VERSION,
    FP_HIP_BACKEND_NAME,
    hip_open,
    hip_close,
    hip_caps,
    hip_malloc,
    hip_free,
    hip_copy_to_device,
    hip_copy_to_host,
    hip_synchronize,
    hip_set_stream,
    hip_forward,
    hip_backward,
    hip_event_create,
    hip_event_record,
    hip_event_elapsed_ms,
    hip_event_destroy,
    hip_workspace_size,
    hip_device_count,
    hip_device_props,
};

extern "C" __attribute__((visibility("default"))) flashport_status
flashport_plugin_entry(uint32_t core_api_version, const fp_host_api *host,
                       const fp_backend_ops **ops)
{
    return fp_plugin_accept(core_api_version, host, ops, &host_api, &hip_ops);
}
