/*
 * The built-in host backends: "cpu" (tiled flash kernels, flash_fwd.c / flash_bwd.c, on the
 * micro-kernels isa.c picks for this CPU) and "reference" (the naive double-accumulating oracle,
 * reference.c). Tensors live in host memory, so the memory helpers are plain allocations and
 * copies. Both take any D in 1..256 and f32, f16 and bf16, with any strides.
 */
#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/ukernel.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define CPU_MAX_HEAD_DIM 256

#define CPU_MAX_THREADS 4096

/* FLASHPORT_NUM_THREADS as a count; 0 when unset or empty, -1 when not an integer in
 * 1..CPU_MAX_THREADS - 1. */
static int env_threads(void)
{
    const char *env = getenv("FLASHPORT_NUM_THREADS");
    if (!env || !*env)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(env, &end, 10);
    return errno == 0 && *end == '\0' && v > 0 && v < CPU_MAX_THREADS ? (int)v : -1;
}

int fp_cpu_threads(void)
{
    static int threads; /* 0 until read; a benign race: every reader computes the same value */
    int t = __atomic_load_n(&threads, __ATOMIC_RELAXED);
    if (t > 0)
        return t;
    t = env_threads();
    if (t <= 0) { /* unset; a bad value is refused at open, before any kernel runs */
#ifdef _OPENMP
        t = omp_get_max_threads();
#else
        t = 1;
#endif
    }
    __atomic_store_n(&threads, t, __ATOMIC_RELAXED);
    return t;
}

static flashport_status host_open(int device, void **ctx)
{
    (void)device; /* one host */
    *ctx = NULL;
    return FLASHPORT_OK;
}

/* The cpu backend opens only if its micro-kernels can run: a FLASHPORT_CPU_ISA this CPU lacks
 * (or that is misspelled) is reported here, at open, with the ISAs that would run. */
static flashport_status cpu_open(int device, void **ctx)
{
    if (env_threads() < 0)
        return fp_host()->set_error(FLASHPORT_ERR_INVALID_VALUE,
                                    "cpu: FLASHPORT_NUM_THREADS='%s' is not a thread count (a "
                                    "positive integer below %d)",
                                    getenv("FLASHPORT_NUM_THREADS"), CPU_MAX_THREADS);
    const fp_ukernels *uk;
    const char *why;
    flashport_status s = fp_cpu_ukernels(&uk, &why);
    if (s != FLASHPORT_OK)
        return s;
    fp_host()->log("cpu: micro-kernels %s (%s): %s", uk->name, uk->describe, why);
    return host_open(device, ctx);
}

static void host_close(void *ctx)
{
    (void)ctx;
}

static void host_caps(void *ctx, fp_backend_caps *caps)
{
    (void)ctx;
    uint32_t all = (1u << FLASHPORT_F32) | (1u << FLASHPORT_F16) | (1u << FLASHPORT_BF16);
    caps->dtypes_fwd = all;
    caps->dtypes_bwd = all;
    caps->max_head_dim = CPU_MAX_HEAD_DIM;
    caps->head_dim_multiple = 1;
    caps->needs_contiguous_dim = 0;
    caps->is_host = 1;
    caps->paged_kv_page_multiple = 1; /* any page size, forward */
    caps->seqused_k_dirs = FP_SEQUSED_FWD | FP_SEQUSED_BWD;
}

static flashport_status host_malloc(void *ctx, size_t bytes, void **ptr)
{
    (void)ctx;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes || !(*ptr = aligned_alloc(64, rounded)))
        return fp_host()->set_error(FLASHPORT_ERR_OUT_OF_MEMORY,
                                    "cannot allocate %zu bytes of host memory", bytes);
    return FLASHPORT_OK;
}

static flashport_status host_free(void *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
    return FLASHPORT_OK;
}

static flashport_status host_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memmove(dst, src, bytes);
    return FLASHPORT_OK;
}

static flashport_status host_sync(void *ctx)
{
    (void)ctx;
    return FLASHPORT_OK;
}

static flashport_status cpu_forward(void *ctx, const fp_problem *p)
{
    (void)ctx;
    return fp_cpu_flash_forward(p); /* logs its kernel path itself */
}

static flashport_status cpu_backward(void *ctx, const fp_problem *p)
{
    (void)ctx;
    return fp_cpu_flash_backward(p);
}

static flashport_status reference_forward(void *ctx, const fp_problem *p)
{
    (void)ctx;
    fp_host()->log("reference: naive forward, double accumulation");
    return fp_reference_forward(p);
}

static flashport_status reference_backward(void *ctx, const fp_problem *p)
{
    (void)ctx;
    fp_host()->log("reference: naive backward, double accumulation");
    return fp_reference_backward(p);
}

static const fp_backend_ops cpu_ops = {
    FP_PLUGIN_API_VERSION,
    "cpu",
    cpu_open,
    host_close,
    host_caps,
    host_malloc,
    host_free,
    host_copy,
    host_copy,
    host_sync,
    NULL,
    cpu_forward,
    cpu_backward,
    NULL, /* no events: the core times with the host clock */
    NULL,
    NULL,
    NULL,
    NULL, /* no device scratch: workspace size 0 */
    NULL, /* one device, the host (core/device.c) */
    NULL,
};

static const fp_backend_ops reference_ops = {
    FP_PLUGIN_API_VERSION,
    "reference",
    host_open,
    host_close,
    host_caps,
    host_malloc,
    host_free,
    host_copy,
    host_copy,
    host_sync,
    NULL,
    reference_forward,
    reference_backward,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

const fp_backend_ops *fp_cpu_backend_ops(void)
{
    return &cpu_ops;
}
const fp_backend_ops *fp_reference_backend_ops(void)
{
    return &reference_ops;
}
