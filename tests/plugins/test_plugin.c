/*
 * A tiny backend plugin that the core tests load through the real plugin path (dlopen,
 * FP_PLUGIN_ENTRY_SYMBOL, API version check). One source, several modules, picked by the compile
 * definitions TP_NAME (the backend name, also the file name libflashport_<name>.so) and TP_KIND:
 *
 *   TP_KIND_DEV     "testdev": a working host-memory backend. Its forward does NOT compute
 *                   attention: it writes O[b, i, h, d] = q[b, i, h, d] + v[b, 0, h / (H / Hkv), d]
 *                   and LSE[b, h, i] = 1000 + i, so a test can tell its output from any real
 *                   backend's. Caps: f16 and bf16 forward only (no f32), D a multiple of 8 up to
 *                   64, stride 1 on the last dimension; no backward, no varlen. set_stream
 *                   rejects any non-NULL stream with FLASHPORT_ERR_DEVICE. It needs
 *                   TP_WS_PER_ROW bytes of scratch per (batch, query row, head) and refuses
 *                   D = 48 in workspace_size as a kernel-level refusal would; with a caller
 *                   workspace it fills the bytes it needs with TP_WS_FILL (so a test can see it
 *                   was used) or refuses a short one. Two devices, "test device 0" and "1".
 *   TP_KIND_NODEV   "testnodev": every open() fails with FLASHPORT_ERR_NO_DEVICE.
 *   TP_KIND_OLDAPI  "testoldapi": the entry refuses a core whose API version is not the one
 *                   after the current (a plugin from another release).
 *   TP_KIND_BADVER  "testbadver": the entry accepts but returns ops stamped with another
 *                   api_version, which the core must catch itself.
 * Hostile ones (tests/test_hostile_plugins.c):
 *   TP_KIND_NULLOPS   "testnullops": the entry returns OK and no ops table.
 *   TP_KIND_NOFWD     "testnofwd": ops without a forward entry.
 *   TP_KIND_WRONGNAME "testwrongname": ops that call themselves "someoneelse".
 *   TP_KIND_SILENT    "testsilent": the entry refuses without saying why.
 *   TP_KIND_PLANTED   "testplanted": a working plugin whose constructor creates the file named by
 *                     $FLASHPORT_TEST_MARKER: proof that it was loaded at all.
 *
 * It includes only headers of core/ and never links libflashport: like a real plugin, every
 * service (errors, logging) comes through the fp_host_api handed to the entry.
 */
#include "core/backend.h"
#include "core/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TP_KIND_DEV       1
#define TP_KIND_NODEV     2
#define TP_KIND_OLDAPI    3
#define TP_KIND_BADVER    4
#define TP_KIND_NULLOPS   5
#define TP_KIND_NOFWD     6
#define TP_KIND_WRONGNAME 7
#define TP_KIND_SILENT    8
#define TP_KIND_PLANTED   9

#if !defined(TP_NAME) || !defined(TP_KIND)
#error "build with -DTP_NAME=\"...\" -DTP_KIND=TP_KIND_..."
#endif

#if defined(__GNUC__)
#define TP_EXPORT __attribute__((visibility("default")))
#else
#define TP_EXPORT
#endif

static const fp_host_api *host;

#include <stdio.h>
#include <stdlib.h>

/* Every variant: a line with its name appended to the file FLASHPORT_TEST_LOADS names, each time
 * the module is loaded, so a test can count dlopens (a refused plugin is dlclosed, and a second
 * dlopen would run this again). */
__attribute__((constructor)) static void tp_count_load(void)
{
    const char *log = getenv("FLASHPORT_TEST_LOADS");
    FILE *f = log ? fopen(log, "a") : NULL;
    if (f) {
        fputs(TP_NAME "\n", f);
        fclose(f);
    }
}

#if TP_KIND == TP_KIND_PLANTED
__attribute__((constructor)) static void tp_planted(void)
{
    const char *marker = getenv("FLASHPORT_TEST_MARKER");
    FILE *f = marker ? fopen(marker, "w") : NULL;
    if (f)
        fclose(f);
}
#endif

/* A fake context pointer: lets a test see that close() gets what open() returned. */
static int tp_ctx_token;

static flashport_status tp_open(int device, void **ctx)
{
#if TP_KIND == TP_KIND_NODEV
    *ctx = NULL;
    return host->set_error(FLASHPORT_ERR_NO_DEVICE, "%s: no test device %d present", TP_NAME,
                           device);
#else
    host->log("%s: opened device %d", TP_NAME, device);
    *ctx = &tp_ctx_token;
    return FLASHPORT_OK;
#endif
}

static void tp_close(void *ctx)
{
    (void)ctx;
}

static void tp_caps(void *ctx, fp_backend_caps *caps)
{
    (void)ctx;
    caps->dtypes_fwd = (1u << FLASHPORT_F16) | (1u << FLASHPORT_BF16);
    caps->dtypes_bwd = 0;
    caps->max_head_dim = 64;
    caps->head_dim_multiple = 8;
    caps->needs_contiguous_dim = 1;
    caps->is_host = 1;
}

static flashport_status tp_malloc(void *ctx, size_t bytes, void **ptr)
{
    (void)ctx;
    *ptr = malloc(bytes);
    if (!*ptr)
        return host->set_error(FLASHPORT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes",
                               TP_NAME, bytes);
    return FLASHPORT_OK;
}

static flashport_status tp_free(void *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
    return FLASHPORT_OK;
}

static flashport_status tp_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memmove(dst, src, bytes);
    return FLASHPORT_OK;
}

static flashport_status tp_sync(void *ctx)
{
    (void)ctx;
    return FLASHPORT_OK;
}

static flashport_status tp_set_stream(void *ctx, void *stream)
{
    (void)ctx;
    if (stream)
        return host->set_error(FLASHPORT_ERR_DEVICE, "%s: %p is not a stream of this device",
                               TP_NAME, stream);
    return FLASHPORT_OK;
}

#define TP_WS_PER_ROW 16
#define TP_WS_FILL    0x5a

static flashport_status tp_workspace_size(void *ctx, const fp_problem *p, int backward,
                                          size_t *bytes)
{
    (void)ctx;
    (void)backward;
    if (p->head_dim == 48)
        return host->set_error(FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM,
                               "%s: no kernel for head dim 48 on this device", TP_NAME);
    *bytes = (size_t)(p->batch * p->seqlen_q * p->heads) * TP_WS_PER_ROW;
    return FLASHPORT_OK;
}

static flashport_status tp_device_count(int *count)
{
    *count = 2;
    return FLASHPORT_OK;
}

static flashport_status tp_device_props(int device, flashport_device_props *props)
{
    if (device >= 2)
        return host->set_error(FLASHPORT_ERR_NO_DEVICE, "%s: no device %d (2 devices)", TP_NAME,
                               device);
    snprintf(props->name, sizeof props->name, "test device %d", device);
    snprintf(props->arch, sizeof props->arch, "tp_%d", 10 + device);
    props->total_memory = (size_t)1 << 30;
    props->compute_major = 1;
    props->compute_minor = device;
    props->multiprocessors = 4;
    return FLASHPORT_OK;
}

/* q, o: (B, Nq, H, D); v: (B, Nk, Hkv, D); lse: (B, H, Nq). */
static flashport_status tp_forward(void *ctx, const fp_problem *p)
{
    if (ctx != &tp_ctx_token)
        return host->set_error(FLASHPORT_ERR_INTERNAL, "%s: forward got a foreign context",
                               TP_NAME);
    if (p->varlen)
        return host->set_error(FLASHPORT_ERR_UNSUPPORTED_FEATURE, "%s: no varlen", TP_NAME);
    size_t need = 0;
    flashport_status st = tp_workspace_size(ctx, p, 0, &need);
    if (st != FLASHPORT_OK)
        return st;
    if (p->workspace) {
        if (need > p->workspace_bytes)
            return host->set_error(FLASHPORT_ERR_BUFFER_TOO_SMALL,
                                   "%s: needs %zu bytes of workspace, has %zu", TP_NAME, need,
                                   p->workspace_bytes);
        memset(p->workspace, TP_WS_FILL, need);
    }
    host->log("%s: forward (O = q + v[key 0])", TP_NAME);
    int64_t group = p->heads / p->kv_heads;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->seqlen_q; i++)
            for (int64_t h = 0; h < p->heads; h++) {
                for (int64_t d = 0; d < p->head_dim; d++) {
                    int64_t qi = b * p->q.stride[FP_B] + i * p->q.stride[FP_S] +
                                 h * p->q.stride[FP_H] + d * p->q.stride[FP_D];
                    int64_t vi = b * p->v.stride[FP_B] + (h / group) * p->v.stride[FP_H] +
                                 d * p->v.stride[FP_D];
                    int64_t oi = b * p->o.stride[FP_B] + i * p->o.stride[FP_S] +
                                 h * p->o.stride[FP_H] + d * p->o.stride[FP_D];
                    float x = p->seqlen_k > 0 ? fp_load(p->v.data, vi, p->dtype) : 0.0f;
                    fp_store(p->o.data, oi, p->dtype, fp_load(p->q.data, qi, p->dtype) + x);
                }
                if (p->lse.data)
                    ((float *)p->lse.data)[b * p->lse.stride[0] + h * p->lse.stride[1] +
                                           i * p->lse.stride[2]] = 1000.0f + (float)i;
            }
    return FLASHPORT_OK;
}

static const fp_backend_ops tp_ops = {
#if TP_KIND == TP_KIND_BADVER
    FP_PLUGIN_API_VERSION + 7,
#else
    FP_PLUGIN_API_VERSION,
#endif
#if TP_KIND == TP_KIND_WRONGNAME
    "someoneelse",
#else
    TP_NAME,
#endif
    tp_open,
    tp_close,
    tp_caps,
    tp_malloc,
    tp_free,
    tp_copy,
    tp_copy,
    tp_sync,
    tp_set_stream,
#if TP_KIND == TP_KIND_NOFWD
    NULL,
#else
    tp_forward,
#endif
    NULL, /* no backward */
    NULL, /* no events: the core times with the host clock */
    NULL,
    NULL,
    NULL,
    tp_workspace_size,
    tp_device_count,
    tp_device_props,
};

TP_EXPORT flashport_status flashport_plugin_entry(uint32_t core_api_version,
                                                  const fp_host_api *host_api,
                                                  const fp_backend_ops **ops)
{
    host = host_api;
    *ops = NULL;
#if TP_KIND == TP_KIND_NOFWD
    (void)tp_forward; /* left out of the table on purpose */
#endif
#if TP_KIND == TP_KIND_OLDAPI
    if (core_api_version != FP_PLUGIN_API_VERSION + 1)
        return host->set_error(FLASHPORT_ERR_BACKEND_UNAVAILABLE,
                               "%s was built for plugin API %d but the core has %u", TP_NAME,
                               FP_PLUGIN_API_VERSION + 1, core_api_version);
#elif TP_KIND == TP_KIND_SILENT
    (void)core_api_version;
    return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
#else
    if (core_api_version != FP_PLUGIN_API_VERSION)
        return host->set_error(FLASHPORT_ERR_BACKEND_UNAVAILABLE,
                               "%s was built for plugin API %d but the core has %u", TP_NAME,
                               FP_PLUGIN_API_VERSION, core_api_version);
#endif
#if TP_KIND == TP_KIND_NULLOPS
    (void)&tp_ops; /* built, never handed out */
    return FLASHPORT_OK;
#else
    *ops = &tp_ops;
    return FLASHPORT_OK;
#endif
}
