/*
 * The contract between the core and a backend (built in, or a plugin loaded at run time).
 *
 * Shape, after ggml-backend-impl.h: a backend is a table of function pointers plus a `void *ctx`
 * that the backend owns. The core validates every call (core/validate.c) and hands the backend a
 * normalized fp_problem: raw pointers, explicit 64-bit strides in one fixed order, the window
 * already resolved. A backend never sees a flashport_tensor and never has to re-check shapes;
 * it only refuses what it cannot run (dtype, head dim, layout) through its caps and returns.
 *
 * Plugins export one symbol, FP_PLUGIN_ENTRY_SYMBOL, of type fp_plugin_entry_fn. The core passes
 * its API version and its host services; the plugin returns its ops table or an error.
 */
#ifndef FLASHPORT_CORE_BACKEND_H
#define FLASHPORT_CORE_BACKEND_H

#include "flashport.h"

#include <stdarg.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever fp_problem, fp_backend_ops or fp_host_api change layout or meaning. */
#define FP_PLUGIN_API_VERSION  4
#define FP_PLUGIN_ENTRY_SYMBOL "flashport_plugin_entry"

/* Stride order of every fp_problem tensor: [batch, seq, head, dim]. For varlen problems the batch
 * stride is 0 and token t of sequence b sits at seq index cu_seqlens[b] + t.
 * LSE strides are [batch, head, seq] (varlen: batch stride 0, seq indexes the packed token). */
enum { FP_B = 0, FP_S = 1, FP_H = 2, FP_D = 3 };

typedef struct fp_tensor_view {
    void *data;
    int64_t stride[4]; /* elements, order FP_B, FP_S, FP_H, FP_D */
} fp_tensor_view;

typedef struct fp_problem {
    flashport_dtype dtype;   /* q, k, v (and every tensor of a backward) */
    flashport_dtype o_dtype; /* o: dtype, or bf16 / f16 when dtype is fp8 (forward only) */
    int64_t batch;
    int64_t seqlen_q; /* dense: Nq; varlen: max_seqlen_q */
    int64_t seqlen_k; /* dense: Nk; varlen: max_seqlen_k */
    int64_t heads;
    int64_t kv_heads;
    int64_t head_dim;
    int64_t total_q; /* varlen: tokens in the packed q buffer; dense: B * Nq */
    int64_t total_k;

    float scale;               /* resolved: never 0 */
    float softcap;             /* 0 = off */
    int64_t window_left;       /* -1 = unbounded */
    int64_t window_right;      /* -1 = unbounded; causal already folded in as 0 */
    const float *alibi_slopes; /* [H] or NULL */

    int varlen;
    const int32_t *cu_seqlens_q; /* backend memory, B + 1 entries (varlen only) */
    const int32_t *cu_seqlens_k;
    int deterministic;
    float descale_q, descale_k, descale_v; /* resolved (0 -> 1); 1 unless dtype is fp8 */

    /* KV cache (include/flashport.h, flashport_attention_params). seqused_k: [B] int32 in
     * backend memory or NULL; host backends get values core/validate.c checked, GPU kernels
     * clamp them (fp_seq_used_keys, core/geometry.h). Paged (block_table != NULL): k, v (and
     * their views below) are [num_pages, page_size, Hkv, D], their view's stride[FP_B] is the
     * page stride and stride[FP_S] the row stride within a page; seqlen_k is the per-sequence
     * capacity block_table_stride * page_size, total_k = num_pages * page_size; q/o/lse are
     * dense and seqused_k is set. Host backends get a table whose used entries are in
     * [0, num_pages); GPU kernels mask the keys of any other entry (fp_paged_page). Address a
     * key through fp_key_offset (core/problem.h) or fp_paged_page (core/geometry.h). */
    const int32_t *seqused_k;
    const int32_t *block_table; /* [B, block_table_stride] or NULL */
    int64_t block_table_stride; /* 0 when not paged */
    int64_t page_size;          /* k's dim 1 when paged, 0 otherwise */
    int64_t num_pages;          /* k's dim 0 when paged, 0 otherwise */

    fp_tensor_view q, k, v, o;
    fp_tensor_view lse; /* f32, strides [batch, head, seq] in stride[0..2]; data may be NULL fwd */
    /* backward only */
    fp_tensor_view dout, dq, dk, dv;

    /* Caller-owned device scratch (flashport_set_workspace), 256-byte aligned, or NULL. When set,
     * the backend allocates nothing: it carves its scratch from here and refuses a call that
     * needs more than workspace_bytes with FLASHPORT_ERR_BUFFER_TOO_SMALL before launching. */
    void *workspace;
    size_t workspace_bytes;
} fp_problem;

/* What a backend can run; the core checks these before calling forward/backward, so the
 * "unsupported" statuses are uniform across backends. */
typedef struct fp_backend_caps {
    uint32_t dtypes_fwd; /* bit (1u << flashport_dtype) per dtype served */
    uint32_t dtypes_bwd;
    int32_t max_head_dim;         /* D in 1..max_head_dim ... */
    int32_t head_dim_multiple;    /* ... and a multiple of this (1 = any) */
    int32_t needs_contiguous_dim; /* stride 1 on the last dimension required */
    int32_t is_host;              /* tensors live in host memory */
    /* KV cache features; 0 (the value a backend that does not set them leaves) means refused
     * by the core with FLASHPORT_ERR_UNSUPPORTED_FEATURE before the backend is called. */
    int32_t paged_kv_page_multiple; /* paged forward served when page_size % this == 0; 0: no */
    uint32_t seqused_k_dirs;        /* seqused_k served: bit 0 forward, bit 1 backward */
} fp_backend_caps;

#define FP_SEQUSED_FWD 1u
#define FP_SEQUSED_BWD 2u

/* Services the core offers a backend. Errors set through set_error land in the calling thread's
 * flashport_last_error(); log writes only when FLASHPORT_LOG is on. */
typedef struct fp_host_api {
    uint32_t api_version;
    flashport_status (*set_error)(flashport_status status, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 2, 3)))
#endif
        ;
    void (*log)(const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 1, 2)))
#endif
        ;
    int (*log_enabled)(void);
} fp_host_api;

typedef struct fp_backend_ops {
    uint32_t api_version; /* FP_PLUGIN_API_VERSION the backend was built against */
    const char *name;

    /* Opens device `device`; returns a context or a status (FLASHPORT_ERR_NO_DEVICE when the
     * runtime has no usable device) with the message set through the host api. */
    flashport_status (*open)(int device, void **ctx);
    void (*close)(void *ctx);
    void (*caps)(void *ctx, fp_backend_caps *caps);

    flashport_status (*malloc_fn)(void *ctx, size_t bytes, void **ptr);
    flashport_status (*free_fn)(void *ctx, void *ptr);
    flashport_status (*copy_to_device)(void *ctx, void *dst, const void *src_host, size_t bytes);
    flashport_status (*copy_to_host)(void *ctx, void *dst_host, const void *src, size_t bytes);
    flashport_status (*synchronize)(void *ctx);
    flashport_status (*set_stream)(void *ctx, void *stream); /* may be NULL: host backends */

    /* The problem is validated. lse.data may be NULL in forward. */
    flashport_status (*forward)(void *ctx, const fp_problem *p);
    flashport_status (*backward)(void *ctx, const fp_problem *p); /* may be NULL */

    /* Optional timing on the backend's stream (device events). All NULL: the core times with the
     * host clock after synchronizing. elapsed waits for `stop` to complete. */
    flashport_status (*event_create)(void *ctx, void **event);
    flashport_status (*event_record)(void *ctx, void *event);
    flashport_status (*event_elapsed_ms)(void *ctx, void *start, void *stop, float *ms);
    void (*event_destroy)(void *ctx, void *event);

    /* Optional. The scratch bytes forward (backward = 0) or backward would need for p, or the
     * status the call would refuse it with (the kernel choice and its device limits), launching
     * nothing. NULL: no scratch, nothing refused beyond the caps. */
    flashport_status (*workspace_size)(void *ctx, const fp_problem *p, int backward, size_t *bytes);

    /* Optional device enumeration, callable without opening a device. device_count reports 0
     * (and OK) when the runtime finds no usable device. NULL: one device, the host. */
    flashport_status (*device_count)(int *count);
    flashport_status (*device_props)(int device, flashport_device_props *props);
} fp_backend_ops;

typedef flashport_status (*fp_plugin_entry_fn)(uint32_t core_api_version, const fp_host_api *host,
                                               const fp_backend_ops **ops);

/* The body of a GPU plugin's flashport_plugin_entry: refuses NULL arguments and a core of another
 * API version; otherwise keeps the core's host api in *keep and hands out the plugin's table.
 * With another version the host table may have another layout: only its leading api_version
 * field is safe to read, so that refusal sets no message (the core reports the mismatch). */
static inline flashport_status fp_plugin_accept(uint32_t core_api_version, const fp_host_api *host,
                                                const fp_backend_ops **ops,
                                                const fp_host_api **keep,
                                                const fp_backend_ops *table)
{
    if (!host || !ops)
        return FLASHPORT_ERR_NULL_POINTER;
    if (core_api_version != FP_PLUGIN_API_VERSION || host->api_version != FP_PLUGIN_API_VERSION)
        return FLASHPORT_ERR_BACKEND_UNAVAILABLE;
    *keep = host;
    *ops = table;
    return FLASHPORT_OK;
}

/* The host api of this process (core/errors.c). Built-in backends use it directly. */
const fp_host_api *fp_host(void);

/* Built-in backends (backends/cpu/). */
const fp_backend_ops *fp_cpu_backend_ops(void);
const fp_backend_ops *fp_reference_backend_ops(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHPORT_CORE_BACKEND_H */
