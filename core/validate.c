/*
 * Validation and normalization of attention calls (see core/validate.h).
 *
 * Order of checks: pointers, enum values and parameter ranges, ranks, sizes and strides
 * (overflow), shapes against each other, head ratio, varlen offsets, what the backend can run
 * (dtype, head dim, layout, KV-cache features), on host backends seqused_k and the block table,
 * and last aliasing of outputs. The first failure wins; its message
 * names the tensor and dimension.
 */
#include "core/validate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Element count and the largest element offset of a tensor, with overflow checks. */
static flashport_status tensor_extent(const char *name, const flashport_tensor *t,
                                      int64_t *max_offset, int64_t *count)
{
    int64_t off = 0, n = 1;
    for (int d = 0; d < t->rank; d++) {
        if (t->shape[d] < 0)
            return fp_set_error(FLASHPORT_ERR_BAD_SIZE, "%s: dimension %d has negative size %lld",
                                name, d, (long long)t->shape[d]);
        if (t->stride[d] < 0)
            return fp_set_error(FLASHPORT_ERR_BAD_STRIDE,
                                "%s: dimension %d has negative stride %lld", name, d,
                                (long long)t->stride[d]);
    }
    for (int d = 0; d < t->rank; d++) {
        int64_t term;
        if (__builtin_mul_overflow(t->shape[d], n, &n))
            return fp_set_error(FLASHPORT_ERR_BAD_SIZE, "%s: element count overflows", name);
        if (t->shape[d] > 0 && (__builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &term) ||
                                __builtin_add_overflow(off, term, &off)))
            return fp_set_error(FLASHPORT_ERR_BAD_STRIDE,
                                "%s: stride %lld of dimension %d overflows 64-bit offsets", name,
                                (long long)t->stride[d], d);
    }
    int64_t bytes;
    if (__builtin_add_overflow(off, 1, &bytes) ||
        __builtin_mul_overflow(bytes, (int64_t)flashport_dtype_size(t->dtype), &bytes))
        return fp_set_error(FLASHPORT_ERR_BAD_STRIDE, "%s: extent overflows 64-bit byte offsets",
                            name);
    if (n > 0 && (uintptr_t)t->data > UINTPTR_MAX - (uintptr_t)bytes)
        return fp_set_error(FLASHPORT_ERR_BAD_STRIDE, "%s: extent wraps the address space", name);
    *max_offset = off;
    *count = n;
    return FLASHPORT_OK;
}

static int64_t element_count(const flashport_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= t->shape[d];
    return n;
}

/* Dimensions of size > 1, sorted by stride ascending. Returns how many. */
static int sorted_dims(const flashport_tensor *t, int64_t *shape, int64_t *stride)
{
    int n = 0;
    for (int d = 0; d < t->rank; d++) {
        if (t->shape[d] <= 1)
            continue;
        int i = n++;
        while (i > 0 && stride[i - 1] > t->stride[d]) {
            stride[i] = stride[i - 1];
            shape[i] = shape[i - 1];
            i--;
        }
        stride[i] = t->stride[d];
        shape[i] = t->shape[d];
    }
    return n;
}

int fp_tensor_injective(const flashport_tensor *t)
{
    int64_t shape[FLASHPORT_MAX_RANK], stride[FLASHPORT_MAX_RANK];
    int n = sorted_dims(t, shape, stride);
    int64_t reach = 0; /* largest offset reachable with the inner dimensions */
    for (int i = 0; i < n; i++) {
        if (stride[i] <= reach)
            return 0;
        reach += (shape[i] - 1) * stride[i];
    }
    return 1;
}

/* Is delta = sum_i c_i * stride_i for some integers lo_i <= c_i <= hi_i? Dims 0..k are sorted by
 * stride, each stride larger than the span the dims inside it can reach, so at most two c_k fit. */
static int reachable(int64_t delta, const int64_t *lo, const int64_t *hi, const int64_t *stride,
                     int k)
{
    if (k < 0)
        return delta == 0;
    int64_t in_lo = 0, in_hi = 0; /* range of sum_{i<k} c_i * stride_i */
    for (int i = 0; i < k; i++) {
        in_lo += lo[i] * stride[i];
        in_hi += hi[i] * stride[i];
    }
    /* candidates c with in_lo <= delta - c * s <= in_hi */
    int64_t s = stride[k];
    int64_t a = delta - in_hi, b = delta - in_lo;
    int64_t c_lo = a >= 0 ? (a + s - 1) / s : -((-a) / s);
    int64_t c_hi = b >= 0 ? b / s : -((-b + s - 1) / s);
    if (c_lo < lo[k])
        c_lo = lo[k];
    if (c_hi > hi[k])
        c_hi = hi[k];
    for (int64_t c = c_lo; c <= c_hi; c++)
        if (reachable(delta - c * s, lo, hi, stride, k - 1))
            return 1;
    return 0;
}

int fp_tensors_disjoint(const flashport_tensor *a, const flashport_tensor *b)
{
    int64_t ea = 0, eb = 0, na = 0, nb = 0;
    if (tensor_extent("a", a, &ea, &na) != FLASHPORT_OK ||
        tensor_extent("b", b, &eb, &nb) != FLASHPORT_OK)
        return 0;
    if (na == 0 || nb == 0)
        return 1;
    uintptr_t a_lo = (uintptr_t)a->data, b_lo = (uintptr_t)b->data;
    uintptr_t a_hi = a_lo + (uintptr_t)(ea + 1) * flashport_dtype_size(a->dtype);
    uintptr_t b_hi = b_lo + (uintptr_t)(eb + 1) * flashport_dtype_size(b->dtype);
    if (a_hi <= b_lo || b_hi <= a_lo)
        return 1;
    /* Interleaved slices of one buffer (e.g. q, k, v of a packed [.., H + 2 Hkv, D] tensor): same
     * dtype and strides, sizes that may differ (H vs Hkv heads). They meet iff the offset between
     * them is sum_d (i_d - j_d) * stride_d with i_d < shape_a[d], j_d < shape_b[d]. Solved exactly
     * when the layout with the larger of the two sizes per dim is non-self-overlapping; otherwise
     * "overlap". */
    if (a->dtype != b->dtype || a->rank != b->rank)
        return 0;
    flashport_tensor hull = *a;
    for (int d = 0; d < a->rank; d++) {
        if (a->stride[d] != b->stride[d])
            return 0;
        if (b->shape[d] > hull.shape[d])
            hull.shape[d] = b->shape[d];
    }
    if (!fp_tensor_injective(&hull))
        return 0;
    size_t es = flashport_dtype_size(a->dtype);
    intptr_t delta_bytes = (intptr_t)(b_lo - a_lo);
    if (delta_bytes % (intptr_t)es != 0)
        return 0;
    /* dims of size > 1 in either tensor, sorted by stride ascending */
    int64_t lo[FLASHPORT_MAX_RANK], hi[FLASHPORT_MAX_RANK], stride[FLASHPORT_MAX_RANK];
    int n = 0;
    for (int d = 0; d < a->rank; d++) {
        if (hull.shape[d] <= 1)
            continue;
        int i = n++;
        while (i > 0 && stride[i - 1] > a->stride[d]) {
            stride[i] = stride[i - 1];
            lo[i] = lo[i - 1];
            hi[i] = hi[i - 1];
            i--;
        }
        stride[i] = a->stride[d];
        lo[i] = -(b->shape[d] - 1);
        hi[i] = a->shape[d] - 1;
    }
    return !reachable((int64_t)(delta_bytes / (intptr_t)es), lo, hi, stride, n - 1);
}

/* ------------------------------------------------------------------------------------------ */

typedef struct dims {
    int64_t b, nq, nk, h, hkv, d, total_q, total_k;
} dims;

static flashport_status check_present(const char *name, const flashport_tensor *t)
{
    if (!t)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "%s is NULL", name);
    if ((unsigned)t->dtype >= FLASHPORT_DTYPE_COUNT)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE, "%s: unknown dtype %d", name,
                            (int)t->dtype);
    if (t->rank < 1 || t->rank > FLASHPORT_MAX_RANK)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE, "%s: rank %d is not in 1..%d", name,
                            (int)t->rank, FLASHPORT_MAX_RANK);
    int64_t off, n;
    flashport_status st = tensor_extent(name, t, &off, &n);
    if (st != FLASHPORT_OK)
        return st;
    if (!t->data && n > 0)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "%s->data is NULL", name);
    return FLASHPORT_OK;
}

static flashport_status check_rank(const char *name, const flashport_tensor *t, int rank,
                                   int varlen)
{
    if (t->rank != rank)
        return fp_set_error(FLASHPORT_ERR_SHAPE_MISMATCH, "%s has rank %d; a %s call needs rank %d",
                            name, (int)t->rank, varlen ? "varlen" : "dense", rank);
    return FLASHPORT_OK;
}

/* Expects a q/k/v-shaped tensor: dense [B, N, heads, D] or varlen [total, heads, D]. */
static flashport_status check_shape(const char *name, const flashport_tensor *t, int varlen,
                                    int64_t b, int64_t n, int64_t heads, int64_t d)
{
    const int64_t *s = t->shape;
    if (varlen) {
        if (s[0] != n || s[1] != heads || s[2] != d)
            return fp_set_error(FLASHPORT_ERR_SHAPE_MISMATCH,
                                "%s has shape [%lld, %lld, %lld]; expected [%lld, %lld, %lld]",
                                name, (long long)s[0], (long long)s[1], (long long)s[2],
                                (long long)n, (long long)heads, (long long)d);
    } else if (s[0] != b || s[1] != n || s[2] != heads || s[3] != d) {
        return fp_set_error(FLASHPORT_ERR_SHAPE_MISMATCH,
                            "%s has shape [%lld, %lld, %lld, %lld]; expected [%lld, %lld, %lld, "
                            "%lld]",
                            name, (long long)s[0], (long long)s[1], (long long)s[2],
                            (long long)s[3], (long long)b, (long long)n, (long long)heads,
                            (long long)d);
    }
    return FLASHPORT_OK;
}

static flashport_status check_dtype(const char *name, const flashport_tensor *t,
                                    flashport_dtype want)
{
    if (t->dtype != want)
        return fp_set_error(FLASHPORT_ERR_DTYPE_MISMATCH, "%s has dtype %s; expected %s", name,
                            flashport_dtype_name(t->dtype), flashport_dtype_name(want));
    return FLASHPORT_OK;
}

static flashport_status check_params(const flashport_attention_params *p)
{
    if (!isfinite(p->scale) || p->scale < 0.0f)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                            "scale %g must be finite and >= 0 (0 = 1/sqrt(D))", (double)p->scale);
    if (!isfinite(p->softcap) || p->softcap < 0.0f)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                            "softcap %g must be finite and >= 0 (0 = off)", (double)p->softcap);
    if (p->window_left < -1 || p->window_right < -1)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                            "window (%d, %d): each side must be >= -1 (-1 = unbounded)",
                            (int)p->window_left, (int)p->window_right);
    if ((p->cu_seqlens_q == NULL) != (p->cu_seqlens_k == NULL))
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER,
                            "varlen needs both cu_seqlens_q and cu_seqlens_k (one is NULL)");
    if (p->cu_seqlens_q && (p->batch < 0 || p->max_seqlen_q < 0 || p->max_seqlen_k < 0))
        return fp_set_error(FLASHPORT_ERR_BAD_SIZE,
                            "varlen batch %d, max_seqlen_q %d, max_seqlen_k %d must be >= 0",
                            (int)p->batch, (int)p->max_seqlen_q, (int)p->max_seqlen_k);
    if (p->block_table && p->cu_seqlens_q)
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                            "a paged KV cache (block_table) takes dense q and o: cu_seqlens must "
                            "be NULL");
    if (p->block_table && !p->seqused_k)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER,
                            "a paged KV cache (block_table) needs seqused_k, the key count of "
                            "each sequence (it is NULL)");
    if (p->block_table && p->block_table_stride < 1)
        return fp_set_error(FLASHPORT_ERR_BAD_SIZE,
                            "block_table_stride %d must be >= 1 (entries per sequence)",
                            (int)p->block_table_stride);
    float ds[3] = {p->descale_q, p->descale_k, p->descale_v};
    for (int i = 0; i < 3; i++)
        if (!isfinite(ds[i]) || ds[i] < 0.0f)
            return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                                "fp8 descale factors must be finite and >= 0 (0 = 1)");
    return FLASHPORT_OK;
}

/* Reads cu_seqlens (B + 1 ints in backend memory) and checks them against the buffers. */
static flashport_status check_seqlens(flashport_backend *be, const char *name, const int32_t *cu,
                                      int64_t batch, int64_t total, int64_t max_seqlen)
{
    size_t bytes = (size_t)(batch + 1) * sizeof(int32_t);
    int32_t stack_buf[64];
    int32_t *host = (size_t)(batch + 1) <= 64 ? stack_buf : (int32_t *)malloc(bytes);
    if (!host)
        return fp_set_error(FLASHPORT_ERR_OUT_OF_MEMORY, "cannot read %s: out of memory", name);
    flashport_status st = be->caps.is_host ? (memcpy(host, cu, bytes), FLASHPORT_OK)
                                           : be->ops->copy_to_host(be->ctx, host, cu, bytes);
    if (st == FLASHPORT_OK && host[0] != 0)
        st = fp_set_error(FLASHPORT_ERR_BAD_SEQLENS, "%s[0] is %d; it must be 0", name,
                          (int)host[0]);
    for (int64_t b = 0; st == FLASHPORT_OK && b < batch; b++) {
        int64_t len = (int64_t)host[b + 1] - host[b];
        if (len < 0)
            st = fp_set_error(FLASHPORT_ERR_BAD_SEQLENS,
                              "%s is not monotone: entry %lld is %d, entry %lld is %d", name,
                              (long long)b, (int)host[b], (long long)b + 1, (int)host[b + 1]);
        else if (len > max_seqlen)
            st = fp_set_error(FLASHPORT_ERR_BAD_SEQLENS,
                              "%s: sequence %lld has length %lld > max_seqlen %lld", name,
                              (long long)b, (long long)len, (long long)max_seqlen);
    }
    if (st == FLASHPORT_OK && host[batch] > total)
        st = fp_set_error(FLASHPORT_ERR_BAD_SEQLENS,
                          "%s[%lld] = %d exceeds the %lld tokens of the packed buffer", name,
                          (long long)batch, (int)host[batch], (long long)total);
    if (host != stack_buf)
        free(host);
    return st;
}

/* Host backends: reads seqused_k (and cu_seqlens_k, for varlen capacities) and the used
 * block-table entries, which live in host memory; GPU backends never get here (their kernels
 * clamp and mask, include/flashport.h). */
static flashport_status check_kv_cache_host(const flashport_attention_params *p, int64_t batch,
                                            int64_t nk, int64_t page_size, int64_t num_pages)
{
    for (int64_t b = 0; b < batch; b++) {
        const int64_t cap =
            p->cu_seqlens_k ? (int64_t)p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : nk;
        const int64_t used = p->seqused_k[b];
        if (used < 0 || used > cap)
            return fp_set_error(FLASHPORT_ERR_BAD_SEQLENS,
                                "seqused_k[%lld] = %lld is outside [0, %lld], the keys sequence "
                                "%lld holds%s",
                                (long long)b, (long long)used, (long long)cap, (long long)b,
                                p->block_table ? " (block_table_stride * page_size)" : "");
        if (!p->block_table)
            continue;
        const int64_t pages = (used + page_size - 1) / page_size;
        for (int64_t i = 0; i < pages; i++) {
            const int64_t e = p->block_table[b * p->block_table_stride + i];
            if (e < 0 || e >= num_pages)
                return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                                    "block_table[%lld][%lld] = %lld is not a page of the cache "
                                    "(0 .. %lld)",
                                    (long long)b, (long long)i, (long long)e,
                                    (long long)num_pages - 1);
        }
    }
    return FLASHPORT_OK;
}

/* The KV-cache features against what the backend serves (fp_backend_caps). */
static flashport_status check_kv_cache_caps(const flashport_attention_params *p,
                                            const fp_backend_caps *caps, const char *backend,
                                            int backward, int64_t page_size)
{
    if (p->block_table && caps->paged_kv_page_multiple <= 0)
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                            "backend '%s' does not serve a paged KV cache (block_table)", backend);
    if (p->block_table && page_size % caps->paged_kv_page_multiple != 0)
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                            "backend '%s' needs page_size (k's dimension 1) a multiple of %d; got "
                            "%lld",
                            backend, (int)caps->paged_kv_page_multiple, (long long)page_size);
    const uint32_t dir = backward ? FP_SEQUSED_BWD : FP_SEQUSED_FWD;
    if (p->seqused_k && !(caps->seqused_k_dirs & dir))
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                            "backend '%s' does not serve seqused_k in %s", backend,
                            backward ? "backward" : "forward");
    return FLASHPORT_OK;
}

static flashport_status check_caps(const fp_backend_caps *caps, const char *backend,
                                   flashport_dtype dtype, int64_t d, int backward,
                                   const fp_call_tensors *t)
{
    uint32_t dtypes = backward ? caps->dtypes_bwd : caps->dtypes_fwd;
    if (!(dtypes & (1u << dtype)))
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_DTYPE,
                            "backend '%s' has no %s kernel for dtype %s", backend,
                            backward ? "backward" : "forward", flashport_dtype_name(dtype));
    if (d > caps->max_head_dim || d % caps->head_dim_multiple != 0)
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM,
                            "backend '%s' supports head dims up to %d that are multiples of %d; "
                            "got %lld",
                            backend, (int)caps->max_head_dim, (int)caps->head_dim_multiple,
                            (long long)d);
    if (caps->needs_contiguous_dim) {
        const flashport_tensor *all[] = {t->q, t->k, t->v, t->o, t->dout, t->dq, t->dk, t->dv};
        const char *names[] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
        for (int i = 0; i < 8; i++)
            if (all[i] && all[i]->stride[all[i]->rank - 1] != 1 &&
                all[i]->shape[all[i]->rank - 1] > 1)
                return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_LAYOUT,
                                    "backend '%s' needs %s's last dimension contiguous (stride "
                                    "1); got stride %lld",
                                    backend, names[i], (long long)all[i]->stride[all[i]->rank - 1]);
    }
    return FLASHPORT_OK;
}

static void view(fp_tensor_view *v, const flashport_tensor *t, int varlen)
{
    v->data = t->data;
    if (varlen) {
        v->stride[FP_B] = 0;
        v->stride[FP_S] = t->stride[0];
        v->stride[FP_H] = t->stride[1];
        v->stride[FP_D] = t->stride[2];
    } else {
        for (int i = 0; i < 4; i++)
            v->stride[i] = t->stride[i];
    }
}

flashport_status fp_params_normalize(const flashport_attention_params *p,
                                     flashport_attention_params *full)
{
    if (p->magic != FLASHPORT_PARAMS_MAGIC)
        return fp_set_error(FLASHPORT_ERR_UNINITIALIZED,
                            "params were not initialized: call flashport_attention_params_init "
                            "before setting fields (magic is 0x%08x, expected 0x%08x)",
                            (unsigned)p->magic, (unsigned)FLASHPORT_PARAMS_MAGIC);
    if (p->struct_size < FP_PARAMS_MIN_SIZE)
        return fp_set_error(FLASHPORT_ERR_UNINITIALIZED,
                            "params were not initialized: struct_size %u is below the smallest "
                            "params struct (%zu bytes); call flashport_attention_params_init",
                            (unsigned)p->struct_size, (size_t)FP_PARAMS_MIN_SIZE);
    if (p->struct_size > sizeof *full)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                            "params come from a newer flashport header (%u bytes; this library "
                            "%s knows %zu): use the header of the library you run with",
                            (unsigned)p->struct_size, flashport_version(), sizeof *full);
    flashport_attention_params_init(full);
    memcpy(full, p, p->struct_size);
    return FLASHPORT_OK;
}

flashport_status fp_validate_call(flashport_backend *be, const flashport_attention_params *user,
                                  const fp_call_tensors *t, int backward, fp_problem *out)
{
    flashport_status st;
    if (!be)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "backend is NULL");
    if (!user)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "params is NULL");
    flashport_attention_params full;
    if ((st = fp_params_normalize(user, &full)) != FLASHPORT_OK)
        return st;
    const flashport_attention_params *p = &full;
    const char *names[] = {"q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv"};
    const flashport_tensor *all[] = {t->q, t->k, t->v, t->o, t->lse, t->dout, t->dq, t->dk, t->dv};
    int ntensors = backward ? 9 : 5;
    for (int i = 0; i < ntensors; i++) {
        if (i == 4 && !backward && !t->lse)
            continue; /* lse is optional in forward */
        if ((st = check_present(names[i], all[i])) != FLASHPORT_OK)
            return st;
    }
    if ((st = check_params(p)) != FLASHPORT_OK)
        return st;
    /* Before the shapes: a paged backward has no gradient layout to check against. */
    if (p->block_table && backward)
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                            "a paged KV cache (block_table) is forward only; backward needs dense "
                            "or varlen k and v");

    const int varlen = p->cu_seqlens_q != NULL;
    const int rank = varlen ? 3 : 4;
    const flashport_tensor *q = t->q, *k = t->k, *v = t->v, *o = t->o, *lse = t->lse;
    for (int i = 0; i < ntensors; i++)
        if (i != 4 && (st = check_rank(names[i], all[i], rank, varlen)) != FLASHPORT_OK)
            return st;

    dims dm;
    memset(&dm, 0, sizeof dm);
    const int paged = p->block_table != NULL;
    int64_t page_size = 0, num_pages = 0;
    if (paged) { /* k, v: [num_pages, page_size, Hkv, D]; q, o dense */
        dm.b = q->shape[0];
        dm.nq = q->shape[1];
        dm.h = q->shape[2];
        dm.hkv = k->shape[2];
        dm.d = q->shape[3];
        num_pages = k->shape[0];
        page_size = k->shape[1];
        if (page_size < 1)
            return fp_set_error(FLASHPORT_ERR_BAD_SIZE,
                                "paged k has page_size (dimension 1) %lld; it must be >= 1",
                                (long long)page_size);
        if (__builtin_mul_overflow(page_size, (int64_t)p->block_table_stride, &dm.nk) ||
            dm.nk > INT32_MAX)
            return fp_set_error(FLASHPORT_ERR_BAD_SIZE,
                                "block_table_stride %d * page_size %lld (keys per sequence) must "
                                "fit in 31 bits",
                                (int)p->block_table_stride, (long long)page_size);
    } else if (varlen) {
        dm.b = p->batch;
        dm.nq = p->max_seqlen_q;
        dm.nk = p->max_seqlen_k;
        dm.total_q = q->shape[0];
        dm.total_k = k->shape[0];
        dm.h = q->shape[1];
        dm.hkv = k->shape[1];
        dm.d = q->shape[2];
    } else {
        dm.b = q->shape[0];
        dm.nq = q->shape[1];
        dm.nk = k->shape[1];
        dm.h = q->shape[2];
        dm.hkv = k->shape[2];
        dm.d = q->shape[3];
    }
    if (dm.h < 1 || dm.hkv < 1 || dm.d < 1)
        return fp_set_error(FLASHPORT_ERR_BAD_SIZE,
                            "heads (%lld), kv heads (%lld) and head dim (%lld) must be >= 1",
                            (long long)dm.h, (long long)dm.hkv, (long long)dm.d);
    if (dm.nq > INT32_MAX || dm.nk > INT32_MAX || dm.h > INT32_MAX || dm.b > INT32_MAX)
        return fp_set_error(FLASHPORT_ERR_BAD_SIZE,
                            "batch, sequence lengths and heads must each fit in 31 bits");
    if (!varlen) { /* after the 31-bit check: the products cannot overflow */
        dm.total_q = dm.b * dm.nq;
        dm.total_k = paged ? num_pages * page_size : dm.b * dm.nk;
    }
    const int64_t qn = varlen ? dm.total_q : dm.nq, kn = varlen ? dm.total_k : dm.nk;
    const int64_t kb = paged ? num_pages : dm.b, kr = paged ? page_size : kn;
    if ((st = check_shape("k", k, varlen, kb, kr, dm.hkv, dm.d)) ||
        (st = check_shape("v", v, varlen, kb, kr, dm.hkv, dm.d)) ||
        (st = check_shape("o", o, varlen, dm.b, qn, dm.h, dm.d)))
        return st;
    if (backward && ((st = check_shape("dout", t->dout, varlen, dm.b, qn, dm.h, dm.d)) ||
                     (st = check_shape("dq", t->dq, varlen, dm.b, qn, dm.h, dm.d)) ||
                     (st = check_shape("dk", t->dk, varlen, dm.b, kn, dm.hkv, dm.d)) ||
                     (st = check_shape("dv", t->dv, varlen, dm.b, kn, dm.hkv, dm.d))))
        return st;
    if (lse) {
        int lrank = varlen ? 2 : 3;
        int ok =
            lse->rank == lrank &&
            (varlen ? (lse->shape[0] == dm.h && lse->shape[1] == dm.total_q)
                    : (lse->shape[0] == dm.b && lse->shape[1] == dm.h && lse->shape[2] == dm.nq));
        if (!ok)
            return fp_set_error(FLASHPORT_ERR_SHAPE_MISMATCH, "lse must have shape %s",
                                varlen ? "[H, total_q]" : "[B, H, Nq]");
    }
    for (int i = 1; i < ntensors; i++)
        if (i != 4 && (st = check_dtype(names[i], all[i], q->dtype)) != FLASHPORT_OK)
            return st;
    if (lse && (st = check_dtype("lse", lse, FLASHPORT_F32)) != FLASHPORT_OK)
        return st;
    if (dm.h % dm.hkv != 0)
        return fp_set_error(FLASHPORT_ERR_HEAD_RATIO,
                            "query heads (%lld) must be a multiple of kv heads (%lld)",
                            (long long)dm.h, (long long)dm.hkv);
    if (varlen &&
        ((st = check_seqlens(be, "cu_seqlens_q", p->cu_seqlens_q, dm.b, dm.total_q, dm.nq)) ||
         (st = check_seqlens(be, "cu_seqlens_k", p->cu_seqlens_k, dm.b, dm.total_k, dm.nk))))
        return st;
    /* Slopes in host memory are read here; a GPU backend's are not copied back for this, and a
     * NaN slope there makes its head's rows NaN (the NaN rule of include/flashport.h). */
    if (p->alibi_slopes && be->caps.is_host)
        for (int64_t h = 0; h < dm.h; h++)
            if (!isfinite(p->alibi_slopes[h]))
                return fp_set_error(FLASHPORT_ERR_INVALID_VALUE,
                                    "alibi_slopes[%lld] is %g; slopes must be finite", (long long)h,
                                    (double)p->alibi_slopes[h]);
    /* A backend without a backward also serves no dtype backward: say which is the cause. */
    if (backward && !be->ops->backward)
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_FEATURE, "backend '%s' has no backward",
                            be->ops->name);
    if ((st = check_caps(&be->caps, be->ops->name, q->dtype, dm.d, backward, t)) != FLASHPORT_OK)
        return st;
    if ((st = check_kv_cache_caps(p, &be->caps, be->ops->name, backward, page_size)) !=
        FLASHPORT_OK)
        return st;
    if (p->seqused_k && be->caps.is_host &&
        (st = check_kv_cache_host(p, dm.b, dm.nk, page_size, num_pages)) != FLASHPORT_OK)
        return st;

    /* Outputs: each must not overlap itself, another output, or an input. */
    int first_out = backward ? 6 : 3;
    for (int i = first_out; i < ntensors; i++) {
        if (!all[i] || element_count(all[i]) == 0)
            continue;
        if (!fp_tensor_injective(all[i]))
            return fp_set_error(FLASHPORT_ERR_ALIASING,
                                "%s: its strides make distinct elements share memory", names[i]);
        for (int j = 0; j < ntensors; j++) {
            if (j == i || !all[j] || (j > i && j >= first_out))
                continue; /* output pairs are checked once */
            if (!fp_tensors_disjoint(all[i], all[j]))
                return fp_set_error(FLASHPORT_ERR_ALIASING, "output %s overlaps %s %s", names[i],
                                    j >= first_out ? "output" : "input", names[j]);
        }
    }

    memset(out, 0, sizeof *out);
    out->dtype = q->dtype;
    out->batch = dm.b;
    out->seqlen_q = dm.nq;
    out->seqlen_k = dm.nk;
    out->heads = dm.h;
    out->kv_heads = dm.hkv;
    out->head_dim = dm.d;
    out->total_q = dm.total_q;
    out->total_k = dm.total_k;
    out->scale = p->scale > 0.0f ? p->scale : 1.0f / sqrtf((float)dm.d);
    out->softcap = p->softcap;
    out->window_left = p->window_left;
    out->window_right = p->causal ? 0 : p->window_right;
    out->alibi_slopes = p->alibi_slopes;
    out->varlen = varlen;
    out->cu_seqlens_q = p->cu_seqlens_q;
    out->cu_seqlens_k = p->cu_seqlens_k;
    out->deterministic = p->deterministic != 0;
    out->descale_q = p->descale_q > 0.0f ? p->descale_q : 1.0f;
    out->descale_k = p->descale_k > 0.0f ? p->descale_k : 1.0f;
    out->descale_v = p->descale_v > 0.0f ? p->descale_v : 1.0f;
    out->seqused_k = p->seqused_k;
    if (paged) {
        out->block_table = p->block_table;
        out->block_table_stride = p->block_table_stride;
        out->page_size = page_size;
        out->num_pages = num_pages;
    }
    view(&out->q, q, varlen);
    view(&out->k, k, varlen);
    view(&out->v, v, varlen);
    view(&out->o, o, varlen);
    if (lse) {
        out->lse.data = lse->data;
        if (varlen) { /* [H, total_q] */
            out->lse.stride[0] = 0;
            out->lse.stride[1] = lse->stride[0];
            out->lse.stride[2] = lse->stride[1];
        } else {
            out->lse.stride[0] = lse->stride[0];
            out->lse.stride[1] = lse->stride[1];
            out->lse.stride[2] = lse->stride[2];
        }
    }
    if (backward) {
        view(&out->dout, t->dout, varlen);
        view(&out->dq, t->dq, varlen);
        view(&out->dk, t->dk, varlen);
        view(&out->dv, t->dv, varlen);
    }
    return FLASHPORT_OK;
}
