/*
 * The OpenCL backend plugin: libflashport_opencl.so. It exports one symbol,
 * flashport_plugin_entry (core/backend.h); the rest is the ops table: device choice, memory
 * helpers (ocl_memory.c), the caller's queue, timing events for flashport_timer, and every
 * OpenCL error turned into a status and message.
 *
 * Devices: FLASHPORT_DEVICE indexes all devices of all platforms (or of the platforms whose name
 * contains FLASHPORT_OPENCL_PLATFORM), GPUs first, then accelerators, then CPUs and any other
 * kind, each group in platform order. No ICD loader, no platform, no matching device or an index
 * out of range is FLASHPORT_ERR_NO_DEVICE with the reason. flashport_device_count and
 * flashport_device_properties enumerate the same list without opening a device (0 devices, OK,
 * without a loader or platform).
 *
 * Workspace: the backward's one scratch buffer (the delta, ocl_attention.c) comes from the
 * caller's workspace when the handle has one, else from a buffer of the call.
 *
 * Queue: flashport_set_stream takes a cl_command_queue. A queue of the handle's context is used
 * as it is; a queue of another context (the caller's program) makes the handle adopt that
 * context and device, which is only allowed while the handle holds no allocations (a buffer
 * belongs to one context). NULL goes back to the handle's own queue. Timing needs a queue created
 * with CL_QUEUE_PROFILING_ENABLE (the handle's own queue is); see ocl_event below.
 */
#define _POSIX_C_SOURCE 200809L

#include "backends/opencl/ocl_host.h"
#include "backends/opencl/ocl_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const fp_host_api *host_api;

const fp_host_api *fp_ocl_host(void)
{
    return host_api;
}

flashport_status fp_ocl_check(cl_int err, const char *what)
{
    if (err == CL_SUCCESS)
        return FLASHPORT_OK;
    const int oom = err == CL_OUT_OF_HOST_MEMORY || err == CL_OUT_OF_RESOURCES ||
                    err == CL_MEM_OBJECT_ALLOCATION_FAILURE;
    return host_api->set_error(oom ? FLASHPORT_ERR_OUT_OF_MEMORY : FLASHPORT_ERR_DEVICE,
                               "opencl: %s failed: OpenCL error %d", what, (int)err);
}

enum { MAX_PLATFORMS = 16, MAX_DEVICES = 64 };

/* Kind rank of a device in the FLASHPORT_DEVICE order. */
static int kind_rank(cl_device_type t)
{
    if (t & CL_DEVICE_TYPE_GPU)
        return 0;
    if (t & CL_DEVICE_TYPE_ACCELERATOR)
        return 1;
    return 2;
}

/* The devices FLASHPORT_DEVICE indexes, in its order, and the platform names seen (for the
 * messages). */
typedef struct device_list {
    cl_device_id dev[MAX_DEVICES];
    cl_platform_id plat[MAX_DEVICES];
    int n;
    const char *want; /* FLASHPORT_OPENCL_PLATFORM, or NULL */
    char seen[512];
} device_list;

/* Fills *list. Returns CL_SUCCESS, or why the loader gave no platform (no platform at all is
 * CL_PLATFORM_NOT_FOUND_KHR); sets no error, so enumeration can count 0 quietly. */
static cl_int list_devices(const fp_ocl_api *cl, device_list *list)
{
    cl_platform_id plats[MAX_PLATFORMS];
    cl_uint np = 0;
    memset(list, 0, sizeof *list);
    cl_int err = cl->clGetPlatformIDs(MAX_PLATFORMS, plats, &np);
    if (err == CL_SUCCESS && np == 0)
        err = CL_PLATFORM_NOT_FOUND_KHR;
    if (err != CL_SUCCESS)
        return err;
    if (np > MAX_PLATFORMS)
        np = MAX_PLATFORMS;
    const char *want = getenv("FLASHPORT_OPENCL_PLATFORM");
    list->want = want && *want ? want : NULL;
    cl_device_id devs[MAX_DEVICES];
    cl_platform_id dev_plat[MAX_DEVICES];
    int rank[MAX_DEVICES], nd = 0;
    for (cl_uint p = 0; p < np; p++) {
        char name[128] = "";
        (void)cl->clGetPlatformInfo(plats[p], CL_PLATFORM_NAME, sizeof name - 1, name, NULL);
        size_t used = strlen(list->seen);
        snprintf(list->seen + used, sizeof list->seen - used, "%s'%s'", used ? ", " : "", name);
        if (list->want && !strstr(name, list->want))
            continue;
        cl_uint n = 0;
        if (cl->clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, (cl_uint)(MAX_DEVICES - nd), devs + nd,
                               &n) != CL_SUCCESS)
            continue;
        for (cl_uint i = 0; i < n && nd < MAX_DEVICES; i++, nd++) {
            cl_device_type t = 0;
            (void)cl->clGetDeviceInfo(devs[nd], CL_DEVICE_TYPE, sizeof t, &t, NULL);
            rank[nd] = kind_rank(t);
            dev_plat[nd] = plats[p];
        }
    }
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < nd; i++)
            if (rank[i] == r) {
                list->dev[list->n] = devs[i];
                list->plat[list->n++] = dev_plat[i];
            }
    return CL_SUCCESS;
}

/* Device number `index` in FLASHPORT_DEVICE order, with its platform. */
static flashport_status pick_device(const fp_ocl_api *cl, int index, cl_platform_id *platform,
                                    cl_device_id *device)
{
    device_list list;
    const cl_int err = list_devices(cl, &list);
    if (err == CL_PLATFORM_NOT_FOUND_KHR)
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                                   "opencl: no device: the ICD loader finds no OpenCL platform "
                                   "(no ICD in /etc/OpenCL/vendors?)");
    if (err != CL_SUCCESS)
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                                   "opencl: no device: clGetPlatformIDs failed (OpenCL error %d)",
                                   (int)err);
    if (index >= 0 && index < list.n) {
        *platform = list.plat[index];
        *device = list.dev[index];
        return FLASHPORT_OK;
    }
    if (list.n == 0 && list.want)
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                                   "opencl: no device on a platform whose name contains '%s' "
                                   "(FLASHPORT_OPENCL_PLATFORM); platforms: %s",
                                   list.want, list.seen);
    if (list.n == 0)
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                                   "opencl: no device: platforms %s have none", list.seen);
    return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                               "opencl: no device %d (FLASHPORT_DEVICE): %d device%s on "
                               "platforms %s%s",
                               index, list.n, list.n == 1 ? "" : "s", list.seen,
                               list.want ? " (FLASHPORT_OPENCL_PLATFORM applied)" : "");
}

/* cl_nv_device_attribute_query; defined here since not every copy of cl_ext.h has it. */
#ifndef CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV
#define CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000
#endif
#ifndef CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV
#define CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV 0x4001
#endif

/* The compute capability's major number NVIDIA's driver gives for dev, 0 for other drivers */
static cl_uint nv_major(const fp_ocl_api *cl, cl_device_id dev)
{
    cl_uint major = 0;
    if (cl->clGetDeviceInfo(dev, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major,
                            NULL) != CL_SUCCESS)
        major = 0;
    return major;
}

/* The tensor-core variant of the device (ocl_plan.h): FP_OCL_FA2_NV (mma.sync m16n8k16 through
 * inline PTX; the kernels FA2-shaped, but for the backward above D = 128: tile-shaped) where
 * NVIDIA's driver reports compute capability >= 8.0 (major: nv_major's), else FP_OCL_PLAIN; where a
 * driver refuses a tensor-core program, that program falls back to the plain path.
 * FLASHPORT_OPENCL_MMA=0 forces the plain path (A/B runs), =nv the tensor-core variant on any
 * device (the test of the fallback), =nv-tile the same with the tile-shaped kernels everywhere (A/B
 * of the two shapes), =emulate and =emulate-tile the emulated ones on any device (the tests of the
 * tensor-core layouts). */
static int device_mma(cl_uint major)
{
    static const struct {
        const char *name;
        int variant;
    } forced[] = {{"0", FP_OCL_PLAIN},
                  {"nv", FP_OCL_FA2_NV},
                  {"nv-tile", FP_OCL_MMA_NV},
                  {"emulate", FP_OCL_FA2_EMULATED},
                  {"emulate-tile", FP_OCL_MMA_EMULATED}};
    const char *env = getenv("FLASHPORT_OPENCL_MMA");
    for (size_t i = 0; env && i < sizeof forced / sizeof forced[0]; i++)
        if (!strcmp(env, forced[i].name))
            return forced[i].variant;
    return major >= 8 ? FP_OCL_FA2_NV : FP_OCL_PLAIN;
}

/* Names and limits of ctx->device, read again when the handle adopts a caller's device. */
static flashport_status read_device(fp_ocl_ctx *ctx)
{
    const fp_ocl_api *cl = ctx->cl;
    cl_platform_id platform;
    cl_ulong local = 0;
    flashport_status st = fp_ocl_check(
        cl->clGetDeviceInfo(ctx->device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL),
        "clGetDeviceInfo(CL_DEVICE_PLATFORM)");
    if (st == FLASHPORT_OK)
        st = fp_ocl_check(
            cl->clGetDeviceInfo(ctx->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL),
            "clGetDeviceInfo(CL_DEVICE_LOCAL_MEM_SIZE)");
    cl_ulong max_alloc = 0;
    if (st == FLASHPORT_OK)
        st = fp_ocl_check(cl->clGetDeviceInfo(ctx->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE,
                                              sizeof max_alloc, &max_alloc, NULL),
                          "clGetDeviceInfo(CL_DEVICE_MAX_MEM_ALLOC_SIZE)");
    if (st != FLASHPORT_OK)
        return st;
    ctx->local_mem = (size_t)local;
    ctx->max_alloc = (size_t)max_alloc;
    const cl_uint major = nv_major(cl, ctx->device);
    ctx->mma = device_mma(major);
    const char *red = getenv("FLASHPORT_OPENCL_RED_VEC");
    ctx->red_vec = major >= 9 && !(red && !strcmp(red, "0"));
    cl_device_type type = 0;
    (void)cl->clGetDeviceInfo(ctx->device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    ctx->unroll_all = !(type & CL_DEVICE_TYPE_CPU);
    memset(ctx->platform_name, 0, sizeof ctx->platform_name);
    memset(ctx->device_name, 0, sizeof ctx->device_name);
    (void)cl->clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof ctx->platform_name - 1,
                                ctx->platform_name, NULL);
    (void)cl->clGetDeviceInfo(ctx->device, CL_DEVICE_NAME, sizeof ctx->device_name - 1,
                              ctx->device_name, NULL);
    if (host_api->log_enabled()) {
        char version[128] = "", ext[2048] = "";
        (void)cl->clGetDeviceInfo(ctx->device, CL_DEVICE_OPENCL_C_VERSION, sizeof version - 1,
                                  version, NULL);
        (void)cl->clGetDeviceInfo(ctx->device, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL);
        static const char *const mma[5] = {
            "none", "mma.sync through inline PTX, tile-shaped",
            "emulated, tile-shaped (FLASHPORT_OPENCL_MMA=emulate-tile)",
            "mma.sync through inline PTX, FA2-shaped (the backward up to D = 128)",
            "emulated, FA2-shaped (the backward up to D = 128; FLASHPORT_OPENCL_MMA=emulate)"};
        host_api->log("opencl: device %d: '%s' on platform '%s' (%s, %zu KiB local memory; "
                      "tensor-core variant for f16 / bf16: %s; the one-kernel backward's dQ by "
                      "%s reductions); extensions: %s",
                      ctx->index, ctx->device_name, ctx->platform_name, version,
                      ctx->local_mem / 1024, mma[ctx->mma], ctx->red_vec ? "vector" : "scalar",
                      ext);
    }
    return FLASHPORT_OK;
}

static flashport_status ocl_open(int device, void **out)
{
    char why[512];
    const fp_ocl_api *cl = fp_ocl_load(why, sizeof why);
    if (!cl)
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE, "opencl: no device: %s", why);
    cl_platform_id platform = NULL;
    cl_device_id dev = NULL;
    flashport_status st = pick_device(cl, device, &platform, &dev);
    if (st != FLASHPORT_OK)
        return st;
    fp_ocl_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return host_api->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                   "opencl: cannot allocate a context");
    ctx->cl = cl;
    ctx->index = device;
    const char *bwd = getenv("FLASHPORT_OPENCL_BWD");
    ctx->bwd = !bwd                    ? FP_OCL_BWD_AUTO
               : !strcmp(bwd, "two")   ? FP_OCL_BWD_TWO
               : !strcmp(bwd, "fused") ? FP_OCL_BWD_FUSED
                                       : FP_OCL_BWD_AUTO;
    const char *fast = getenv("FLASHPORT_OPENCL_BWD_FAST"), *bq = getenv("FLASHPORT_OPENCL_BWD_BQ");
    ctx->bwd_fast = !(fast && !strcmp(fast, "0"));
    ctx->bwd_bq16 = bq && !strcmp(bq, "16");
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};
    cl_int err;
    ctx->own_context = cl->clCreateContext(props, 1, &dev, NULL, NULL, &err);
    st = fp_ocl_check(err, "clCreateContext");
    if (st == FLASHPORT_OK) {
        ctx->own_queue =
            cl->clCreateCommandQueue(ctx->own_context, dev, CL_QUEUE_PROFILING_ENABLE, &err);
        st = fp_ocl_check(err, "clCreateCommandQueue");
    }
    if (st == FLASHPORT_OK) {
        ctx->own_device = ctx->device = dev;
        ctx->context = ctx->own_context;
        ctx->queue = ctx->own_queue;
        st = read_device(ctx);
    }
    if (st != FLASHPORT_OK) {
        if (ctx->own_queue)
            (void)cl->clReleaseCommandQueue(ctx->own_queue);
        if (ctx->own_context)
            (void)cl->clReleaseContext(ctx->own_context);
        free(ctx);
        return st;
    }
    pthread_mutex_init(&ctx->lock, NULL);
    *out = ctx;
    return FLASHPORT_OK;
}

/* Drops the caller's queue and context, if any (lock held). */
static void release_adopted(fp_ocl_ctx *ctx)
{
    if (ctx->queue != ctx->own_queue)
        (void)ctx->cl->clReleaseCommandQueue(ctx->queue);
    if (ctx->context != ctx->own_context)
        (void)ctx->cl->clReleaseContext(ctx->context);
    ctx->queue = ctx->own_queue;
    ctx->context = ctx->own_context;
    ctx->device = ctx->own_device;
}

/* A pointer is meaningful only through the handle that made it, so closing the handle releases
 * the buffers still allocated through it. */
static void ocl_close(void *p)
{
    fp_ocl_ctx *ctx = p;
    if (!ctx)
        return;
    (void)ctx->cl->clFinish(ctx->queue);
    fp_ocl_release_programs(ctx);
    fp_ocl_alloc_release_all(ctx);
    release_adopted(ctx);
    (void)ctx->cl->clReleaseCommandQueue(ctx->own_queue);
    (void)ctx->cl->clReleaseContext(ctx->own_context);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

static void ocl_caps(void *ctx, fp_backend_caps *caps)
{
    (void)ctx;
    caps->dtypes_fwd = (1u << FLASHPORT_F32) | (1u << FLASHPORT_F16) | (1u << FLASHPORT_BF16);
    caps->dtypes_bwd = caps->dtypes_fwd;
    caps->max_head_dim = 256;
    caps->head_dim_multiple = 1;
    caps->needs_contiguous_dim = 0;
    caps->is_host = 0;
    /* Any page size: the tile copies look up each key row's page (kernels/shape.cl's
     * fp_ocl_row_at), so a page need not hold whole key blocks. */
    caps->paged_kv_page_multiple = 1;
    caps->seqused_k_dirs = FP_SEQUSED_FWD | FP_SEQUSED_BWD;
}

static flashport_status ocl_malloc(void *p, size_t bytes, void **ptr)
{
    fp_ocl_ctx *ctx = p;
    cl_int err;
    pthread_mutex_lock(&ctx->lock);
    const size_t max_alloc = ctx->max_alloc;
    if (bytes > max_alloc) {
        /* A driver's limit on one buffer, often well below its memory (NVIDIA: a quarter). */
        pthread_mutex_unlock(&ctx->lock);
        return host_api->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                   "opencl: %zu bytes in one buffer: '%s' allows at most %zu "
                                   "(CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                                   bytes, ctx->device_name, max_alloc);
    }
    cl_mem mem =
        ctx->cl->clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &err);
    pthread_mutex_unlock(&ctx->lock);
    flashport_status st = fp_ocl_check(err, "clCreateBuffer");
    if (st != FLASHPORT_OK)
        return st;
    st = fp_ocl_alloc_add(ctx, mem, bytes, ptr);
    if (st != FLASHPORT_OK)
        (void)ctx->cl->clReleaseMemObject(mem);
    return st;
}

/* Kernels may still use the buffer: clReleaseMemObject defers the release until they are done. */
static flashport_status ocl_free(void *p, void *ptr)
{
    fp_ocl_ctx *ctx = p;
    cl_mem mem;
    flashport_status st = fp_ocl_alloc_remove(ctx, ptr, &mem);
    if (st != FLASHPORT_OK)
        return st;
    return fp_ocl_check(ctx->cl->clReleaseMemObject(mem), "clReleaseMemObject");
}

/* Blocking reads and writes on the handle's queue: ordered after its kernels, done on return. */
static flashport_status copy(fp_ocl_ctx *ctx, void *dev, void *host, size_t bytes, int to_device)
{
    if (bytes == 0)
        return FLASHPORT_OK;
    cl_mem mem;
    size_t off;
    pthread_mutex_lock(&ctx->lock);
    flashport_status st = fp_ocl_resolve(
        ctx, dev, bytes, to_device ? "the copy's destination" : "the copy's source", &mem, &off);
    cl_command_queue queue = ctx->queue;
    pthread_mutex_unlock(&ctx->lock);
    if (st != FLASHPORT_OK)
        return st;
    if (to_device)
        return fp_ocl_check(
            ctx->cl->clEnqueueWriteBuffer(queue, mem, CL_TRUE, off, bytes, host, 0, NULL, NULL),
            "clEnqueueWriteBuffer");
    return fp_ocl_check(
        ctx->cl->clEnqueueReadBuffer(queue, mem, CL_TRUE, off, bytes, host, 0, NULL, NULL),
        "clEnqueueReadBuffer");
}

static flashport_status ocl_copy_to_device(void *p, void *dst, const void *src, size_t bytes)
{
    return copy(p, dst, (void *)src, bytes, 1);
}

static flashport_status ocl_copy_to_host(void *p, void *dst, const void *src, size_t bytes)
{
    return copy(p, (void *)src, dst, bytes, 0);
}

static flashport_status ocl_synchronize(void *p)
{
    fp_ocl_ctx *ctx = p;
    pthread_mutex_lock(&ctx->lock);
    cl_command_queue queue = ctx->queue;
    pthread_mutex_unlock(&ctx->lock);
    return fp_ocl_check(ctx->cl->clFinish(queue), "clFinish");
}

static flashport_status ocl_set_stream(void *p, void *stream)
{
    fp_ocl_ctx *ctx = p;
    const fp_ocl_api *cl = ctx->cl;
    cl_command_queue queue = stream ? (cl_command_queue)stream : ctx->own_queue;
    cl_context context = ctx->own_context;
    cl_device_id device = ctx->own_device;
    flashport_status st = FLASHPORT_OK;
    if (stream) {
        st = fp_ocl_check(
            cl->clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof context, &context, NULL),
            "flashport_set_stream: clGetCommandQueueInfo(CL_QUEUE_CONTEXT)");
        if (st == FLASHPORT_OK)
            st = fp_ocl_check(
                cl->clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof device, &device, NULL),
                "flashport_set_stream: clGetCommandQueueInfo(CL_QUEUE_DEVICE)");
        if (st != FLASHPORT_OK)
            return st;
    }
    pthread_mutex_lock(&ctx->lock);
    if (context != ctx->context && ctx->num_allocs > 0) {
        int n = ctx->num_allocs;
        pthread_mutex_unlock(&ctx->lock);
        return host_api->set_error(FLASHPORT_ERR_INVALID_VALUE,
                                   "opencl: flashport_set_stream: the queue belongs to another "
                                   "OpenCL context than the handle's, which still holds %d "
                                   "allocation%s; a handle changes context only while it holds "
                                   "none",
                                   n, n == 1 ? "" : "s");
    }
    if (queue == ctx->queue) {
        pthread_mutex_unlock(&ctx->lock);
        return FLASHPORT_OK;
    }
    (void)cl->clFinish(ctx->queue); /* work already enqueued completes before the switch */
    const int new_context = context != ctx->context;
    if (new_context)
        fp_ocl_release_programs(ctx);
    release_adopted(ctx);
    if (stream && queue != ctx->own_queue) {
        (void)cl->clRetainCommandQueue(queue);
        if (context != ctx->own_context)
            (void)cl->clRetainContext(context);
        ctx->queue = queue;
        ctx->context = context;
        ctx->device = device;
    }
    if (new_context)
        st = read_device(ctx);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

/* flashport_timer's events. A timestamp is the end of a 4-byte fill of a small buffer, enqueued
 * behind a marker: the marker orders it after all earlier work even on an out-of-order queue,
 * and the fill, a real command, carries profiling counters where a marker may not (NVIDIA's
 * driver has been seen to stamp markers and barriers with zeros). The buffer belongs to the
 * queue's context, so it is made again when the handle has moved to another one. */
typedef struct ocl_event {
    cl_event ev;
    cl_mem pad;
    cl_context pad_context;
} ocl_event;

static flashport_status ocl_event_create(void *p, void **event)
{
    (void)p;
    ocl_event *e = calloc(1, sizeof *e);
    *event = e;
    return e ? FLASHPORT_OK
             : host_api->set_error(FLASHPORT_ERR_OUT_OF_MEMORY, "opencl: cannot allocate an event");
}

static flashport_status ocl_event_record(void *p, void *event)
{
    fp_ocl_ctx *ctx = p;
    const fp_ocl_api *cl = ctx->cl;
    ocl_event *e = event;
    if (e->ev) {
        (void)cl->clReleaseEvent(e->ev);
        e->ev = NULL;
    }
    pthread_mutex_lock(&ctx->lock);
    cl_command_queue queue = ctx->queue;
    cl_context context = ctx->context;
    pthread_mutex_unlock(&ctx->lock);
    if (e->pad && e->pad_context != context) {
        (void)cl->clReleaseMemObject(e->pad);
        e->pad = NULL;
    }
    cl_int err = CL_SUCCESS;
    if (!e->pad) {
        e->pad = cl->clCreateBuffer(context, CL_MEM_READ_WRITE, 4, NULL, &err);
        e->pad_context = context;
    }
    flashport_status st = fp_ocl_check(err, "clCreateBuffer (timer)");
    cl_event marker = NULL;
    if (st == FLASHPORT_OK)
        st = fp_ocl_check(cl->clEnqueueMarkerWithWaitList(queue, 0, NULL, &marker),
                          "clEnqueueMarkerWithWaitList");
    const cl_uint zero = 0;
    if (st == FLASHPORT_OK)
        st = fp_ocl_check(cl->clEnqueueFillBuffer(queue, e->pad, &zero, sizeof zero, 0, sizeof zero,
                                                  1, &marker, &e->ev),
                          "clEnqueueFillBuffer (timer)");
    if (marker)
        (void)cl->clReleaseEvent(marker);
    return st;
}

static flashport_status ocl_event_elapsed_ms(void *p, void *start, void *stop, float *ms)
{
    fp_ocl_ctx *ctx = p;
    const ocl_event *a = start, *b = stop;
    if (!a->ev || !b->ev)
        return host_api->set_error(FLASHPORT_ERR_INVALID_VALUE,
                                   "opencl: the timer was not started and stopped");
    flashport_status st = fp_ocl_check(ctx->cl->clWaitForEvents(1, &b->ev), "clWaitForEvents");
    cl_ulong t0 = 0, t1 = 0;
    cl_int err = CL_SUCCESS;
    if (st == FLASHPORT_OK) {
        err =
            ctx->cl->clGetEventProfilingInfo(a->ev, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL);
        if (err == CL_SUCCESS)
            err = ctx->cl->clGetEventProfilingInfo(b->ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1,
                                                   NULL);
    }
    if (err == CL_PROFILING_INFO_NOT_AVAILABLE)
        return host_api->set_error(FLASHPORT_ERR_DEVICE,
                                   "opencl: no profiling counters on this queue (create it with "
                                   "CL_QUEUE_PROFILING_ENABLE to time through flashport_timer)");
    if (st == FLASHPORT_OK)
        st = fp_ocl_check(err, "clGetEventProfilingInfo");
    if (st == FLASHPORT_OK && (t0 == 0 || t1 < t0))
        return host_api->set_error(FLASHPORT_ERR_DEVICE,
                                   "opencl: the driver gave the timer's commands no usable "
                                   "profiling counters (start %llu ns, stop %llu ns)",
                                   (unsigned long long)t0, (unsigned long long)t1);
    if (st == FLASHPORT_OK)
        *ms = (float)((double)(t1 - t0) * 1e-6);
    return st;
}

static void ocl_event_destroy(void *p, void *event)
{
    fp_ocl_ctx *ctx = p;
    ocl_event *e = event;
    if (e && e->ev)
        (void)ctx->cl->clReleaseEvent(e->ev);
    if (e && e->pad)
        (void)ctx->cl->clReleaseMemObject(e->pad);
    free(e);
}

/* Enumeration without a handle, over the devices FLASHPORT_DEVICE indexes (the platform filter
 * applied): no ICD loader or no platform counts 0. */
static flashport_status ocl_device_count(int *count)
{
    char why[512];
    const fp_ocl_api *cl = fp_ocl_load(why, sizeof why);
    device_list list;
    *count = cl && list_devices(cl, &list) == CL_SUCCESS ? list.n : 0;
    return FLASHPORT_OK;
}

/* name: the device's; arch: "sm_XY" where NVIDIA's driver gives the compute capability (then
 * compute_major / minor are it), else the device's OpenCL version ("OpenCL 3.0", and its
 * major / minor); multiprocessors: compute units. */
static flashport_status ocl_device_props(int device, flashport_device_props *props)
{
    char why[512];
    const fp_ocl_api *cl = fp_ocl_load(why, sizeof why);
    device_list list;
    const int n = cl && list_devices(cl, &list) == CL_SUCCESS ? list.n : 0;
    if (device >= n)
        return host_api->set_error(FLASHPORT_ERR_NO_DEVICE,
                                   "opencl: device %d does not exist (%d device%s)", device, n,
                                   n == 1 ? "" : "s");
    const cl_device_id dev = list.dev[device];
    cl_ulong mem = 0;
    cl_uint units = 0, cc[2] = {0, 0};
    char version[512] = "";
    flashport_status st = fp_ocl_check(
        cl->clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof props->name - 1, props->name, NULL),
        "clGetDeviceInfo(CL_DEVICE_NAME)");
    if (st == FLASHPORT_OK)
        st = fp_ocl_check(
            cl->clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL),
            "clGetDeviceInfo(CL_DEVICE_GLOBAL_MEM_SIZE)");
    if (st == FLASHPORT_OK)
        st = fp_ocl_check(
            cl->clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL),
            "clGetDeviceInfo(CL_DEVICE_MAX_COMPUTE_UNITS)");
    if (st == FLASHPORT_OK)
        st = fp_ocl_check(
            cl->clGetDeviceInfo(dev, CL_DEVICE_VERSION, sizeof version - 1, version, NULL),
            "clGetDeviceInfo(CL_DEVICE_VERSION)");
    if (st != FLASHPORT_OK)
        return st;
    props->total_memory = (size_t)mem;
    props->multiprocessors = (int32_t)units;
    if (cl->clGetDeviceInfo(dev, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof cc[0], &cc[0],
                            NULL) == CL_SUCCESS &&
        cl->clGetDeviceInfo(dev, CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV, sizeof cc[1], &cc[1],
                            NULL) == CL_SUCCESS &&
        cc[0] > 0) {
        snprintf(props->arch, sizeof props->arch, "sm_%u%u", cc[0], cc[1]);
        props->compute_major = (int32_t)cc[0];
        props->compute_minor = (int32_t)cc[1];
        return FLASHPORT_OK;
    }
    /* CL_DEVICE_VERSION is "OpenCL <major>.<minor> <vendor text>". */
    int major = 0, minor = 0;
    if (sscanf(version, "OpenCL %d.%d", &major, &minor) == 2)
        snprintf(props->arch, sizeof props->arch, "OpenCL %d.%d", major, minor);
    props->compute_major = major;
    props->compute_minor = minor;
    return FLASHPORT_OK;
}

static flashport_status ocl_forward(void *ctx, const fp_problem *p)
{
    return fp_ocl_forward(ctx, p);
}

static flashport_status ocl_backward(void *ctx, const fp_problem *p)
{
    return fp_ocl_backward(ctx, p);
}

static flashport_status ocl_workspace_size(void *ctx, const fp_problem *p, int backward,
                                           size_t *bytes)
{
    return fp_ocl_workspace_size(ctx, p, backward, bytes);
}

static const fp_backend_ops ocl_ops = {
    .api_version = FP_PLUGIN_API_VERSION,
    .name = "opencl",
    .open = ocl_open,
    .close = ocl_close,
    .caps = ocl_caps,
    .malloc_fn = ocl_malloc,
    .free_fn = ocl_free,
    .copy_to_device = ocl_copy_to_device,
    .copy_to_host = ocl_copy_to_host,
    .synchronize = ocl_synchronize,
    .set_stream = ocl_set_stream,
    .forward = ocl_forward,
    .backward = ocl_backward,
    .event_create = ocl_event_create,
    .event_record = ocl_event_record,
    .event_elapsed_ms = ocl_event_elapsed_ms,
    .event_destroy = ocl_event_destroy,
    .workspace_size = ocl_workspace_size,
    .device_count = ocl_device_count,
    .device_props = ocl_device_props,
};

__attribute__((visibility("default"))) flashport_status
flashport_plugin_entry(uint32_t core_api_version, const fp_host_api *host,
                       const fp_backend_ops **ops)
{
    return fp_plugin_accept(core_api_version, host, ops, &host_api, &ocl_ops);
}
