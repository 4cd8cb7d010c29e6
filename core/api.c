/*
 * The public C API (include/flashport.h): backend handles, memory helpers, and the attention
 * entry points, which validate (core/validate.c) and then hand an fp_problem to the backend.
 */
#include "core/internal.h"
#include "core/validate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR2(x) #x
#define STR(x)  STR2(x)

const char *flashport_version(void)
{
    return STR(FLASHPORT_VERSION_MAJOR) "." STR(FLASHPORT_VERSION_MINOR) "." STR(
        FLASHPORT_VERSION_PATCH);
}

size_t flashport_dtype_size(flashport_dtype dtype)
{
    switch (dtype) {
    case FLASHPORT_F32:
        return 4;
    case FLASHPORT_F16:
    case FLASHPORT_BF16:
        return 2;
    case FLASHPORT_FP8_E4M3:
    case FLASHPORT_FP8_E5M2:
        return 1;
    default:
        return 0;
    }
}

const char *flashport_dtype_name(flashport_dtype dtype)
{
    switch (dtype) {
    case FLASHPORT_F32:
        return "f32";
    case FLASHPORT_F16:
        return "f16";
    case FLASHPORT_BF16:
        return "bf16";
    case FLASHPORT_FP8_E4M3:
        return "fp8_e4m3";
    case FLASHPORT_FP8_E5M2:
        return "fp8_e5m2";
    default:
        return "?";
    }
}

flashport_tensor flashport_tensor_contiguous(void *data, flashport_dtype dtype, int32_t rank,
                                             const int64_t *shape)
{
    flashport_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.rank = rank;
    if (rank < 1 || rank > FLASHPORT_MAX_RANK || !shape)
        return t; /* rejected with a message when used */
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = stride;
        /* Saturates where the product would overflow: validation then refuses the extent. */
        if (__builtin_mul_overflow(stride, shape[d] > 0 ? shape[d] : 1, &stride))
            stride = INT64_MAX;
    }
    return t;
}

void flashport_attention_params_init_sized(flashport_attention_params *p, size_t size)
{
    if (!p || size < FP_PARAMS_MIN_SIZE)
        return;
    flashport_attention_params d;
    memset(&d, 0, sizeof d);
    d.struct_size = (uint32_t)(size < UINT32_MAX ? size : UINT32_MAX);
    d.magic = FLASHPORT_PARAMS_MAGIC;
    d.window_left = -1;
    d.window_right = -1;
    /* A caller's struct from a newer header: its fields beyond ours are zeroed; the call then
     * refuses the struct (fp_params_normalize), since this library cannot know their defaults. */
    memcpy(p, &d, size < sizeof d ? size : sizeof d);
    if (size > sizeof d)
        memset((char *)p + sizeof d, 0, size - sizeof d);
}

/* ------------------------------------------------------------------------------------------
 * Backends
 * ---------------------------------------------------------------------------------------- */

/* Appends the list of available backends to the current error message. */
static flashport_status with_available(flashport_status st)
{
    char msg[1024], avail[256];
    snprintf(msg, sizeof msg, "%s", flashport_last_error());
    fp_registry_available(avail, sizeof avail);
    return fp_set_error(st, "%s; available backends: %s", msg, avail);
}

static flashport_status open_named(const char *name, int device, flashport_backend **out)
{
    const fp_backend_ops *ops;
    flashport_status st = fp_registry_get(name, &ops);
    if (st != FLASHPORT_OK)
        return st;
    flashport_backend *be = (flashport_backend *)calloc(1, sizeof *be);
    if (!be)
        return fp_set_error(FLASHPORT_ERR_OUT_OF_MEMORY, "cannot allocate a backend handle");
    st = ops->open(device, &be->ctx);
    if (st != FLASHPORT_OK) {
        free(be);
        return with_available(st);
    }
    be->ops = ops;
    be->device = device;
    ops->caps(be->ctx, &be->caps);
    *out = be;
    return FLASHPORT_OK;
}

/* "auto": the first GPU backend that opens, else "cpu". */
static flashport_status open_auto(int device, flashport_backend **out)
{
    const char *gpu;
    for (size_t i = 0; (gpu = fp_registry_gpu_backend(i)) != NULL; i++) {
        if (open_named(gpu, device, out) == FLASHPORT_OK) {
            fp_log("auto: chose backend '%s' (device %d)", gpu, device);
            return FLASHPORT_OK;
        }
        fp_log("auto: skipped '%s': %s", gpu, flashport_last_error());
    }
    fp_log("auto: no GPU backend opened; chose 'cpu'");
    return open_named("cpu", 0, out);
}

flashport_status flashport_backend_open_device(const char *name, int device,
                                               flashport_backend **out)
{
    fp_clear_error();
    if (!out)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "out is NULL");
    *out = NULL;
    if (device < 0)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE, "device index %d is negative", device);
    if (!name) {
        name = getenv("FLASHPORT_BACKEND");
        if (!name || !*name)
            name = "auto";
    }
    flashport_status st =
        strcmp(name, "auto") == 0 ? open_auto(device, out) : open_named(name, device, out);
    if (st == FLASHPORT_OK) { /* "auto" may have failed on the way: no stale message */
        fp_clear_error();
        fp_log("opened backend '%s' on device %d", (*out)->ops->name, device);
    }
    return st;
}

flashport_status flashport_backend_open(const char *name, flashport_backend **out)
{
    int device = 0;
    const char *env = getenv("FLASHPORT_DEVICE");
    if (env && *env) {
        char *end;
        errno = 0;
        long v = strtol(env, &end, 10);
        if (errno || *end || v < 0 || v > 1 << 20) {
            fp_clear_error();
            if (out)
                *out = NULL;
            return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                                "FLASHPORT_DEVICE='%s' is not a device index", env);
        }
        device = (int)v;
    }
    return flashport_backend_open_device(name, device, out);
}

void flashport_backend_close(flashport_backend *be)
{
    if (!be)
        return;
    be->ops->close(be->ctx);
    free(be);
}

const char *flashport_backend_name(const flashport_backend *be)
{
    return be ? be->ops->name : "";
}

int flashport_backend_device(const flashport_backend *be)
{
    return be ? be->device : -1;
}

flashport_status flashport_available_backends(char *buf, size_t size, size_t *needed)
{
    fp_clear_error();
    if (!buf && size > 0)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "buf is NULL (with size %zu)", size);
    const size_t n = fp_registry_available(buf, size);
    if (needed)
        *needed = n;
    if (n > size)
        return fp_set_error(FLASHPORT_ERR_BUFFER_TOO_SMALL,
                            "the list of available backends needs %zu bytes; the buffer has %zu", n,
                            size);
    return FLASHPORT_OK;
}

#define CHECK_BACKEND(be)                                                                          \
    do {                                                                                           \
        fp_clear_error();                                                                          \
        if (!(be))                                                                                 \
            return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "backend is NULL");                    \
    } while (0)

flashport_status flashport_malloc(flashport_backend *be, size_t bytes, void **ptr)
{
    CHECK_BACKEND(be);
    if (!ptr)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "ptr is NULL");
    *ptr = NULL;
    if (bytes == 0)
        return FLASHPORT_OK;
    return be->ops->malloc_fn(be->ctx, bytes, ptr);
}

flashport_status flashport_free(flashport_backend *be, void *ptr)
{
    CHECK_BACKEND(be);
    return ptr ? be->ops->free_fn(be->ctx, ptr) : FLASHPORT_OK;
}

/* The copies' common checks; to_device picks the backend's direction. */
static flashport_status copy_checked(flashport_backend *be, void *dst, const void *src,
                                     size_t bytes, int to_device)
{
    CHECK_BACKEND(be);
    if (bytes == 0)
        return FLASHPORT_OK;
    if (!dst || !src)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "memcpy: dst or src is NULL");
    return to_device ? be->ops->copy_to_device(be->ctx, dst, src, bytes)
                     : be->ops->copy_to_host(be->ctx, dst, src, bytes);
}

flashport_status flashport_memcpy_to_device(flashport_backend *be, void *dst, const void *src,
                                            size_t bytes)
{
    return copy_checked(be, dst, src, bytes, 1);
}

flashport_status flashport_memcpy_to_host(flashport_backend *be, void *dst, const void *src,
                                          size_t bytes)
{
    return copy_checked(be, dst, src, bytes, 0);
}

flashport_status flashport_synchronize(flashport_backend *be)
{
    CHECK_BACKEND(be);
    return be->ops->synchronize(be->ctx);
}

flashport_status flashport_set_stream(flashport_backend *be, void *stream)
{
    CHECK_BACKEND(be);
    if (!be->ops->set_stream) {
        if (stream)
            return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                                "backend '%s' runs on the host and takes no stream", be->ops->name);
        return FLASHPORT_OK;
    }
    return be->ops->set_stream(be->ctx, stream);
}

/* ------------------------------------------------------------------------------------------
 * Attention
 * ---------------------------------------------------------------------------------------- */

static void log_call(const char *what, const flashport_backend *be, const fp_problem *p)
{
    fp_log("%s on '%s': %s B=%lld Nq=%lld Nk=%lld H=%lld Hkv=%lld D=%lld window=(%lld,%lld) "
           "softcap=%g alibi=%s varlen=%s deterministic=%d",
           what, be->ops->name, flashport_dtype_name(p->dtype), (long long)p->batch,
           (long long)p->seqlen_q, (long long)p->seqlen_k, (long long)p->heads,
           (long long)p->kv_heads, (long long)p->head_dim, (long long)p->window_left,
           (long long)p->window_right, (double)p->softcap, p->alibi_slopes ? "yes" : "no",
           p->varlen ? "yes" : "no", p->deterministic);
}

/* Validates a call of either direction into *p (with the handle's workspace). */
static flashport_status validate_call(flashport_backend *be, flashport_direction dir,
                                      const flashport_attention_params *params,
                                      const fp_call_tensors *t, fp_problem *p)
{
    if (dir != FLASHPORT_FORWARD && dir != FLASHPORT_BACKWARD)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                            "direction %d is neither forward (0) nor backward (1)", (int)dir);
    flashport_status st = fp_validate_call(be, params, t, dir == FLASHPORT_BACKWARD, p);
    if (st != FLASHPORT_OK)
        return st;
    p->workspace = be->workspace;
    p->workspace_bytes = be->workspace_bytes;
    return FLASHPORT_OK;
}

/* Validation, then the backend's own answer: the bytes it needs or why it would refuse. */
static flashport_status query_call(flashport_backend *be, flashport_direction dir,
                                   const flashport_attention_params *params,
                                   const fp_call_tensors *t, size_t *bytes)
{
    fp_problem p;
    *bytes = 0;
    flashport_status st = validate_call(be, dir, params, t, &p);
    if (st != FLASHPORT_OK || !be->ops->workspace_size)
        return st;
    size_t n = 0;
    st = be->ops->workspace_size(be->ctx, &p, dir == FLASHPORT_BACKWARD, &n);
    if (st == FLASHPORT_OK)
        *bytes = n;
    return st;
}

flashport_status flashport_attention_supported(
    flashport_backend *be, flashport_direction dir, const flashport_attention_params *params,
    const flashport_tensor *q, const flashport_tensor *k, const flashport_tensor *v,
    const flashport_tensor *o, const flashport_tensor *lse, const flashport_tensor *dout,
    const flashport_tensor *dq, const flashport_tensor *dk, const flashport_tensor *dv)
{
    CHECK_BACKEND(be);
    fp_call_tensors t = {q, k, v, o, lse, dout, dq, dk, dv};
    size_t bytes;
    flashport_status st = query_call(be, dir, params, &t, &bytes);
    /* A caller-owned workspace too small for the call is what the call would report. */
    if (st == FLASHPORT_OK && be->workspace && bytes > be->workspace_bytes)
        return fp_set_error(FLASHPORT_ERR_BUFFER_TOO_SMALL,
                            "this call needs %zu bytes of workspace; the handle's has %zu", bytes,
                            be->workspace_bytes);
    return st;
}

flashport_status flashport_attention_workspace_size(
    flashport_backend *be, flashport_direction dir, const flashport_attention_params *params,
    const flashport_tensor *q, const flashport_tensor *k, const flashport_tensor *v,
    const flashport_tensor *o, const flashport_tensor *lse, const flashport_tensor *dout,
    const flashport_tensor *dq, const flashport_tensor *dk, const flashport_tensor *dv,
    size_t *bytes)
{
    CHECK_BACKEND(be);
    if (!bytes)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "bytes is NULL");
    fp_call_tensors t = {q, k, v, o, lse, dout, dq, dk, dv};
    return query_call(be, dir, params, &t, bytes);
}

flashport_status flashport_set_workspace(flashport_backend *be, void *workspace, size_t bytes)
{
    CHECK_BACKEND(be);
    if (!workspace && bytes > 0)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "workspace is NULL but bytes is %zu",
                            bytes);
    if ((uintptr_t)workspace % 256 != 0)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE, "workspace %p is not aligned to 256 bytes",
                            workspace);
    be->workspace = workspace;
    be->workspace_bytes = workspace ? bytes : 0;
    return FLASHPORT_OK;
}

/* Validation, then the backend's forward or backward. */
static flashport_status run_call(flashport_backend *be, flashport_direction dir,
                                 const flashport_attention_params *params, const fp_call_tensors *t)
{
    fp_problem p;
    flashport_status st = validate_call(be, dir, params, t, &p);
    if (st != FLASHPORT_OK)
        return st;
    const int backward = dir == FLASHPORT_BACKWARD;
    if (fp_log_enabled())
        log_call(backward ? "backward" : "forward", be, &p);
    return backward ? be->ops->backward(be->ctx, &p) : be->ops->forward(be->ctx, &p);
}

flashport_status flashport_attention_forward(flashport_backend *be,
                                             const flashport_attention_params *params,
                                             const flashport_tensor *q, const flashport_tensor *k,
                                             const flashport_tensor *v, const flashport_tensor *o,
                                             const flashport_tensor *lse)
{
    CHECK_BACKEND(be);
    fp_call_tensors t = {q, k, v, o, lse, NULL, NULL, NULL, NULL};
    return run_call(be, FLASHPORT_FORWARD, params, &t);
}

flashport_status flashport_attention_backward(
    flashport_backend *be, const flashport_attention_params *params, const flashport_tensor *q,
    const flashport_tensor *k, const flashport_tensor *v, const flashport_tensor *o,
    const flashport_tensor *lse, const flashport_tensor *dout, const flashport_tensor *dq,
    const flashport_tensor *dk, const flashport_tensor *dv)
{
    CHECK_BACKEND(be);
    fp_call_tensors t = {q, k, v, o, lse, dout, dq, dk, dv};
    return run_call(be, FLASHPORT_BACKWARD, params, &t);
}
