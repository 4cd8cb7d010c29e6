/*
 * Bad input through the public API: every status code that a machine without a GPU can produce
 * is triggered here, and each failing call must (a) return that status, (b) leave a message in
 * flashport_last_error() that names the problem, and (c) write nothing: all tensors live in one
 * arena that is compared byte for byte before and after the call. Valid calls that look risky
 * (interleaved slices of one packed qkv / dqkv buffer, shared or broadcast inputs, strided head
 * dims on a backend that takes them) must be accepted and must write every output element.
 *
 * Most cases are one row of a table: a base problem (backend, dtype, head dim, dense or varlen,
 * forward or backward), one mutation of it, and the expected status and message fragment. The
 * UNSUPPORTED_* statuses come from the test plugin "testdev" (tests/plugins/test_plugin.c), whose
 * caps refuse f32, head dims that are not multiples of 8 or above 64, strided last dims, and
 * backward; the same calls on "cpu" must succeed, so the refusal is the caps' and not the
 * fixture's. Backend-level statuses (unknown / unavailable backend, no device, bad
 * FLASHPORT_DEVICE, out of memory) and the validation helpers fp_tensor_injective and
 * fp_tensors_disjoint (against brute force) follow the table.
 *
 * Links flashport_internal (for the helpers); the plugins are found through
 * FLASHPORT_PLUGIN_PATH, which CTest sets (default: the build's test_plugins folder).
 *
 * Not triggerable here: FLASHPORT_ERR_INTERNAL (a bug by definition); FLASHPORT_ERR_DEVICE only
 * as a plugin's error passed through (testdev's set_stream).
 */
#include "core/validate.h"
#include "tests/test_util.h"

#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { T_Q, T_K, T_V, T_O, T_LSE, T_DOUT, T_DQ, T_DK, T_DV, NT };
static const char *const tensor_names[NT] = {"q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv"};

/* The base problem: GQA with Nq != Nk, so a check that confuses them fails. */
enum { B = 2, NQ = 5, NK = 7, H = 4, HKV = 2 };
enum { NMAX = NK, PACK_HEADS = 3 * H }; /* room for packed [B, N, H + 2 Hkv, D] with Hkv up to H */
/* varlen: sequences of 3 + 2 query and 4 + 3 key tokens */
enum { TOTAL_Q = 5, TOTAL_K = 7, MAX_Q = 3, MAX_K = 4 };

/* ---- the fixture --------------------------------------------------------------------------- */

typedef struct fixture {
    flashport_backend *be;
    flashport_attention_params params;
    const flashport_attention_params *params_arg;
    flashport_tensor t[NT];
    const flashport_tensor *arg[NT]; /* what the call receives */
    int32_t cu_q[3], cu_k[3];
    int varlen, backward;
    flashport_dtype dtype;
    int64_t d;
    /* One arena holds every region, so "nothing written" is one comparison. */
    unsigned char *arena, *snapshot;
    size_t arena_bytes;
    unsigned char *region[NT], *packed_in, *packed_out;
    size_t region_bytes[NT], packed_bytes;
} fixture;

static int is_output(const fixture *f, int i)
{
    return f->backward ? (i == T_DQ || i == T_DK || i == T_DV) : (i == T_O || i == T_LSE);
}

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Region of a q/k/v-shaped tensor: room for N = NMAX, f32 and a stride of 2 on every element. */
static size_t qkv_region_bytes(int64_t heads, int64_t d)
{
    return align64(B * NMAX * heads * d * 8);
}

static int fixture_init(fixture *f, flashport_backend *be, flashport_dtype dtype, int64_t d,
                        int varlen, int backward, tu_rng *rng)
{
    memset(f, 0, sizeof *f);
    f->be = be;
    f->dtype = dtype;
    f->d = d;
    f->varlen = varlen;
    f->backward = backward;
    flashport_attention_params_init(&f->params);
    f->params_arg = &f->params;
    const int64_t heads_of[NT] = {H, HKV, HKV, H, H, H, H, HKV, HKV};
    size_t total = 0;
    for (int i = 0; i < NT; i++) {
        f->region_bytes[i] =
            i == T_LSE ? align64(B * H * NMAX * 4 * 2) : qkv_region_bytes(heads_of[i], d);
        total += f->region_bytes[i];
    }
    f->packed_bytes = align64(B * NMAX * PACK_HEADS * d * 4);
    total += 2 * f->packed_bytes;
    f->arena_bytes = total;
    f->arena = (unsigned char *)aligned_alloc(64, total);
    f->snapshot = (unsigned char *)malloc(total);
    if (!f->arena || !f->snapshot)
        return -1;
    unsigned char *p = f->arena;
    for (int i = 0; i < NT; i++) {
        f->region[i] = p;
        p += f->region_bytes[i];
    }
    f->packed_in = p;
    f->packed_out = p + f->packed_bytes;

    /* Inputs get valid values, outputs a NaN poison (so unwritten elements are visible). */
    size_t es = flashport_dtype_size(dtype);
    for (int i = 0; i < NT; i++) {
        flashport_dtype dt = i == T_LSE ? FLASHPORT_F32 : dtype;
        int64_t n = (int64_t)(f->region_bytes[i] / (i == T_LSE ? 4 : es));
        if (is_output(f, i))
            tu_poison(f->region[i], n, dt);
        else
            tu_fill_uniform(f->region[i], n, dt, -1.0f, 1.0f, rng);
    }
    tu_fill_uniform(f->packed_in, (int64_t)(f->packed_bytes / es), dtype, -1.0f, 1.0f, rng);
    tu_poison(f->packed_out, (int64_t)(f->packed_bytes / es), dtype);

    for (int i = 0; i < NT; i++) {
        int64_t n = (i == T_K || i == T_V || i == T_DK || i == T_DV) ? NK : NQ;
        int64_t heads = heads_of[i];
        if (i == T_LSE) {
            int64_t dense[3] = {B, H, NQ}, packed[2] = {H, TOTAL_Q};
            f->t[i] = varlen ? flashport_tensor_contiguous(f->region[i], FLASHPORT_F32, 2, packed)
                             : flashport_tensor_contiguous(f->region[i], FLASHPORT_F32, 3, dense);
        } else if (varlen) {
            int64_t shape[3] = {n == NQ ? TOTAL_Q : TOTAL_K, heads, d};
            f->t[i] = flashport_tensor_contiguous(f->region[i], dtype, 3, shape);
        } else {
            int64_t shape[4] = {B, n, heads, d};
            f->t[i] = flashport_tensor_contiguous(f->region[i], dtype, 4, shape);
        }
        f->arg[i] = &f->t[i];
    }
    if (varlen) {
        const int32_t cq[3] = {0, 3, 5}, ck[3] = {0, 4, 7};
        memcpy(f->cu_q, cq, sizeof cq);
        memcpy(f->cu_k, ck, sizeof ck);
        f->params.cu_seqlens_q = f->cu_q;
        f->params.cu_seqlens_k = f->cu_k;
        f->params.batch = B;
        f->params.max_seqlen_q = MAX_Q;
        f->params.max_seqlen_k = MAX_K;
    }
    return 0;
}

static void fixture_free(fixture *f)
{
    free(f->arena);
    free(f->snapshot);
}

static flashport_status fixture_call(fixture *f)
{
    const flashport_tensor *const *a = f->arg;
    if (f->backward)
        return flashport_attention_backward(f->be, f->params_arg, a[T_Q], a[T_K], a[T_V], a[T_O],
                                            a[T_LSE], a[T_DOUT], a[T_DQ], a[T_DK], a[T_DV]);
    return flashport_attention_forward(f->be, f->params_arg, a[T_Q], a[T_K], a[T_V], a[T_O],
                                       a[T_LSE]);
}

/* Calls fn(t, off, ctx) with the element offset of every index of a descriptor (rank 1..4);
 * returns the sum of its answers. */
static int64_t visit_elements(const flashport_tensor *t,
                              int64_t (*fn)(const flashport_tensor *t, int64_t off, void *ctx),
                              void *ctx)
{
    int64_t idx[FLASHPORT_MAX_RANK] = {0}, sum = 0;
    for (int dd = 0; dd < t->rank; dd++)
        if (t->shape[dd] == 0)
            return 0;
    for (;;) {
        int64_t off = 0;
        for (int dd = 0; dd < t->rank; dd++)
            off += idx[dd] * t->stride[dd];
        sum += fn(t, off, ctx);
        int dd = t->rank - 1;
        while (dd >= 0 && ++idx[dd] == t->shape[dd])
            idx[dd--] = 0;
        if (dd < 0)
            return sum;
    }
}

static int64_t unwritten(const flashport_tensor *t, int64_t off, void *ctx)
{
    return tu_is_poison(t->data, off, t->dtype);
}

/* ---- mutations ----------------------------------------------------------------------------- */

typedef enum mutation {
    M_NONE,
    M_NULL_BACKEND,
    M_NULL_PARAMS,
    M_NULL,          /* the tensor pointer */
    M_NULL_DATA,     /* its data pointer */
    M_DTYPE_UNKNOWN, /* dtype 77 */
    M_RANK0,
    M_RANK5,
    M_RANK_WRONG,      /* one less than the call needs */
    M_NEG_SIZE,        /* shape[1] negative */
    M_NEG_STRIDE,      /* stride[last - 1] negative */
    M_STRIDE_OVERFLOW, /* (shape[1] - 1) * stride[1] overflows int64 */
    M_BYTES_OVERFLOW,  /* the element offset fits, the byte offset does not */
    M_ADDRESS_WRAP,    /* data + extent wraps the address space */
    M_COUNT_OVERFLOW,  /* element count overflows (strides 0) */
    M_SHAPE_D0,        /* shape[d] += 1 for d = 0..3 */
    M_SHAPE_D1,
    M_SHAPE_D2,
    M_SHAPE_D3,
    M_DTYPE_F32, /* the tensor becomes f32 (base is f16) */
    M_DTYPE_F16,
    M_HEAD_RATIO, /* Hkv = 3 with H = 4 */
    M_HEADS_ZERO,
    M_D_ZERO,
    M_SEQ_31BIT,     /* Nq = 2^31 (stride 0) */
    M_ALIAS_SAME_AS, /* the tensor's descriptor replaced by the one of `other` */
    M_ALIAS_INSIDE,  /* the tensor starts in the middle of `other` */
    M_SELF_ALIAS,    /* stride[1] = 0 on a dimension of size > 1 */
    M_PACKED_GQA,    /* q/k/v and dq/dk/dv: slices of packed [B, N, H + 2 Hkv, D] buffers */
    M_PACKED_MHA,    /* same with Hkv = H */
    M_INPUTS_SHARED, /* v is k, broadcast over the batch (stride 0) */
    M_LSE_NULL,
    M_LAST_STRIDE2, /* stride 2 on the head dim of the tensor */
    M_SCALE_NAN,
    M_SCALE_NEG,
    M_SCALE_INF,
    M_SOFTCAP_NEG,
    M_SOFTCAP_NAN,
    M_WINDOW_LEFT,
    M_WINDOW_RIGHT,
    M_DESCALE_NEG,
    M_DESCALE_NAN,
    M_CU_Q_START,      /* cu_seqlens_q[0] = 1 */
    M_CU_K_DECREASING, /* {0, 4, 3} */
    M_CU_K_EXCEEDS,    /* {0, 4, 8} with 7 key tokens */
    M_CU_Q_OVER_MAX,   /* max_seqlen_q = 2 with a sequence of 3 */
    M_CU_K_ONLY,       /* cu_seqlens_q NULL */
    M_CU_Q_ONLY,       /* cu_seqlens_k NULL */
    M_VARLEN_NEG_BATCH,
    M_WINDOW_CAUSAL,   /* valid masking parameters: causal with a left window, softcap, scale */
    M_FP8,             /* q, k, v in fp8 e4m3, o (and the rest) stay in the base dtype */
    M_FP8_E5M2,        /* the same in e5m2, with descales */
    M_FP8_K_E5M2,      /* M_FP8, then k in e5m2 */
    M_FP8_O,           /* M_FP8, then the tensor (o) in f32 */
    M_FP8_O_FP8,       /* M_FP8, then o in fp8 too */
    M_FP8_DESCALE_V,   /* M_FP8 with descale_v = -inf */
    M_DESCALE_NOT_FP8, /* descales != 1 on f16 inputs: ignored */
} mutation;

static void packed_slices(fixture *f, int64_t hkv)
{
    int64_t c = H + 2 * hkv, d = f->d;
    int64_t stride[4] = {NK * c * d, c * d, d, 1};
    int64_t heads[3] = {H, hkv, hkv}, first[3] = {0, H, H + hkv};
    size_t es = flashport_dtype_size(f->dtype);
    for (int s = 0; s < 3; s++) {
        int in = T_Q + s, out = T_DQ + s;
        flashport_tensor *t = &f->t[in];
        t->rank = 4;
        t->shape[0] = B;
        t->shape[1] = NK;
        t->shape[2] = heads[s];
        t->shape[3] = d;
        memcpy(t->stride, stride, sizeof stride);
        t->data = f->packed_in + first[s] * d * (int64_t)es;
        f->t[out] = *t;
        f->t[out].data = f->packed_out + first[s] * d * (int64_t)es;
    }
    /* o, dout, lse follow Nq = Nk in their own regions */
    int64_t qshape[4] = {B, NK, H, d}, lshape[3] = {B, H, NK};
    f->t[T_O] = flashport_tensor_contiguous(f->region[T_O], f->dtype, 4, qshape);
    f->t[T_DOUT] = flashport_tensor_contiguous(f->region[T_DOUT], f->dtype, 4, qshape);
    f->t[T_LSE] = flashport_tensor_contiguous(f->region[T_LSE], FLASHPORT_F32, 3, lshape);
}

static void apply(fixture *f, mutation m, int ti, int other)
{
    flashport_tensor *t = &f->t[ti];
    int last = t->rank - 1;
    switch (m) {
    case M_NONE:
        break;
    case M_NULL_BACKEND:
        f->be = NULL;
        break;
    case M_NULL_PARAMS:
        f->params_arg = NULL;
        break;
    case M_NULL:
        f->arg[ti] = NULL;
        break;
    case M_NULL_DATA:
        t->data = NULL;
        break;
    case M_DTYPE_UNKNOWN:
        t->dtype = (flashport_dtype)77;
        break;
    case M_RANK0:
        t->rank = 0;
        break;
    case M_RANK5:
        t->rank = 5;
        break;
    case M_RANK_WRONG:
        t->rank--;
        break;
    case M_NEG_SIZE:
        t->shape[1] = -t->shape[1];
        break;
    case M_NEG_STRIDE:
        t->stride[last - 1] = -t->stride[last - 1];
        break;
    case M_STRIDE_OVERFLOW:
        t->stride[1] = INT64_MAX / 3;
        break;
    case M_BYTES_OVERFLOW:
        t->stride[0] = INT64_MAX / 2 + 1;
        break;
    case M_ADDRESS_WRAP:
        t->data = (void *)(UINTPTR_MAX - 64);
        break;
    case M_COUNT_OVERFLOW:
        for (int dd = 0; dd < 3; dd++) {
            t->shape[dd] = (int64_t)1 << 21;
            t->stride[dd] = 0;
        }
        break;
    case M_SHAPE_D0:
    case M_SHAPE_D1:
    case M_SHAPE_D2:
    case M_SHAPE_D3:
        t->shape[m - M_SHAPE_D0] += 1;
        break;
    case M_DTYPE_F32:
        t->dtype = FLASHPORT_F32;
        break;
    case M_DTYPE_F16:
        t->dtype = FLASHPORT_F16;
        break;
    case M_HEAD_RATIO:
    case M_HEADS_ZERO: {
        /* kv tensors for the ratio, query-shaped ones for zero heads */
        static const int kv[] = {T_K, T_V, T_DK, T_DV}, qs[] = {T_Q, T_O, T_DOUT, T_DQ};
        for (int i = 0; i < 4; i++) {
            flashport_tensor *u = &f->t[m == M_HEAD_RATIO ? kv[i] : qs[i]];
            u->shape[u->rank - 2] = m == M_HEAD_RATIO ? 3 : 0;
        }
        if (m == M_HEADS_ZERO)
            f->t[T_LSE].shape[f->varlen ? 0 : 1] = 0;
        break;
    }
    case M_D_ZERO:
        for (int i = 0; i < NT; i++)
            if (i != T_LSE)
                f->t[i].shape[f->t[i].rank - 1] = 0;
        break;
    case M_SEQ_31BIT:
        t->shape[1] = (int64_t)1 << 31;
        t->stride[1] = 0;
        break;
    case M_ALIAS_SAME_AS:
        *t = f->t[other];
        break;
    case M_ALIAS_INSIDE:
        t->data = (char *)f->t[other].data + 8 * flashport_dtype_size(f->t[other].dtype);
        break;
    case M_SELF_ALIAS:
        t->stride[1] = 0;
        break;
    case M_PACKED_GQA:
        packed_slices(f, HKV);
        break;
    case M_PACKED_MHA:
        packed_slices(f, H);
        break;
    case M_INPUTS_SHARED:
        f->t[T_K].stride[0] = 0;
        f->t[T_V] = f->t[T_K];
        break;
    case M_LSE_NULL:
        f->arg[T_LSE] = NULL;
        break;
    case M_LAST_STRIDE2:
        for (int dd = 0; dd <= last; dd++)
            t->stride[dd] *= 2;
        break;
    case M_SCALE_NAN:
        f->params.scale = NAN;
        break;
    case M_SCALE_NEG:
        f->params.scale = -0.5f;
        break;
    case M_SCALE_INF:
        f->params.scale = INFINITY;
        break;
    case M_SOFTCAP_NEG:
        f->params.softcap = -1.0f;
        break;
    case M_SOFTCAP_NAN:
        f->params.softcap = NAN;
        break;
    case M_WINDOW_LEFT:
        f->params.window_left = -2;
        break;
    case M_WINDOW_RIGHT:
        f->params.window_right = -5;
        break;
    case M_DESCALE_NEG:
        f->params.descale_k = -1.0f;
        break;
    case M_DESCALE_NAN:
        f->params.descale_q = NAN;
        break;
    case M_CU_Q_START:
        f->cu_q[0] = 1;
        break;
    case M_CU_K_DECREASING:
        f->cu_k[2] = 3;
        break;
    case M_CU_K_EXCEEDS:
        f->cu_k[2] = 8;
        break;
    case M_CU_Q_OVER_MAX:
        f->params.max_seqlen_q = 2;
        break;
    case M_CU_K_ONLY:
        f->params.cu_seqlens_q = NULL;
        break;
    case M_CU_Q_ONLY:
        f->params.cu_seqlens_k = NULL;
        break;
    case M_VARLEN_NEG_BATCH:
        f->params.batch = -1;
        break;
    case M_FP8:
    case M_FP8_K_E5M2:
    case M_FP8_O:
    case M_FP8_O_FP8:
    case M_FP8_DESCALE_V:
        f->t[T_Q].dtype = f->t[T_K].dtype = f->t[T_V].dtype = FLASHPORT_FP8_E4M3;
        if (m == M_FP8_K_E5M2)
            f->t[T_K].dtype = FLASHPORT_FP8_E5M2;
        if (m == M_FP8_O)
            t->dtype = FLASHPORT_F32;
        if (m == M_FP8_O_FP8)
            t->dtype = FLASHPORT_FP8_E4M3;
        if (m == M_FP8_DESCALE_V)
            f->params.descale_v = -INFINITY;
        break;
    case M_FP8_E5M2:
        f->t[T_Q].dtype = f->t[T_K].dtype = f->t[T_V].dtype = FLASHPORT_FP8_E5M2;
        f->params.descale_q = 0.5f;
        f->params.descale_k = 0.0f; /* 0 means 1 */
        f->params.descale_v = 4.0f;
        break;
    case M_DESCALE_NOT_FP8:
        f->params.descale_q = 3.0f;
        f->params.descale_v = 0.5f;
        break;
    case M_WINDOW_CAUSAL:
        f->params.causal = 1;
        f->params.window_left = 2;
        f->params.softcap = 5.0f;
        f->params.scale = 0.25f;
        break;
    }
}

/* ---- the table ----------------------------------------------------------------------------- */

typedef struct vcase {
    const char *backend;
    flashport_dtype dtype;
    int d;
    int varlen, backward;
    mutation m;
    int tensor, other;
    flashport_status want;
    const char *needle; /* must occur in flashport_last_error() (failures only) */
} vcase;

#define F16 FLASHPORT_F16
/* Dense f16 D=8 on "cpu": forward (FWD) and backward (BWD); varlen (VFWD, VBWD). */
#define FWD(m, t, o, st, s)                                                                        \
    {                                                                                              \
        "cpu", F16, 8, 0, 0, m, t, o, FLASHPORT_##st, s                                            \
    }
#define BWD(m, t, o, st, s)                                                                        \
    {                                                                                              \
        "cpu", F16, 8, 0, 1, m, t, o, FLASHPORT_##st, s                                            \
    }
#define VFWD(m, t, o, st, s)                                                                       \
    {                                                                                              \
        "cpu", F16, 8, 1, 0, m, t, o, FLASHPORT_##st, s                                            \
    }
#define VBWD(m, t, o, st, s)                                                                       \
    {                                                                                              \
        "cpu", F16, 8, 1, 1, m, t, o, FLASHPORT_##st, s                                            \
    }

static const vcase cases[] = {
    /* valid calls */
    FWD(M_NONE, 0, 0, OK, NULL),
    BWD(M_NONE, 0, 0, OK, NULL),
    VFWD(M_NONE, 0, 0, OK, NULL),
    VBWD(M_NONE, 0, 0, OK, NULL),
    FWD(M_LSE_NULL, 0, 0, OK, NULL),
    FWD(M_WINDOW_CAUSAL, 0, 0, OK, NULL),
    FWD(M_PACKED_GQA, 0, 0, OK, NULL),
    BWD(M_PACKED_GQA, 0, 0, OK, NULL),
    FWD(M_PACKED_MHA, 0, 0, OK, NULL),
    BWD(M_PACKED_MHA, 0, 0, OK, NULL),
    FWD(M_INPUTS_SHARED, 0, 0, OK, NULL),
    BWD(M_INPUTS_SHARED, 0, 0, OK, NULL),
    /* null pointers */
    FWD(M_NULL_BACKEND, 0, 0, ERR_NULL_POINTER, "backend is NULL"),
    BWD(M_NULL_BACKEND, 0, 0, ERR_NULL_POINTER, "backend is NULL"),
    FWD(M_NULL_PARAMS, 0, 0, ERR_NULL_POINTER, "params is NULL"),
    FWD(M_NULL, T_Q, 0, ERR_NULL_POINTER, "q is NULL"),
    FWD(M_NULL, T_K, 0, ERR_NULL_POINTER, "k is NULL"),
    FWD(M_NULL, T_V, 0, ERR_NULL_POINTER, "v is NULL"),
    FWD(M_NULL, T_O, 0, ERR_NULL_POINTER, "o is NULL"),
    BWD(M_NULL, T_LSE, 0, ERR_NULL_POINTER, "lse is NULL"),
    BWD(M_NULL, T_DOUT, 0, ERR_NULL_POINTER, "dout is NULL"),
    BWD(M_NULL, T_DQ, 0, ERR_NULL_POINTER, "dq is NULL"),
    BWD(M_NULL, T_DK, 0, ERR_NULL_POINTER, "dk is NULL"),
    BWD(M_NULL, T_DV, 0, ERR_NULL_POINTER, "dv is NULL"),
    FWD(M_NULL_DATA, T_V, 0, ERR_NULL_POINTER, "v->data is NULL"),
    FWD(M_NULL_DATA, T_O, 0, ERR_NULL_POINTER, "o->data is NULL"),
    FWD(M_NULL_DATA, T_LSE, 0, ERR_NULL_POINTER, "lse->data is NULL"),
    BWD(M_NULL_DATA, T_DK, 0, ERR_NULL_POINTER, "dk->data is NULL"),
    /* enum values, ranks */
    FWD(M_DTYPE_UNKNOWN, T_Q, 0, ERR_INVALID_VALUE, "q: unknown dtype 77"),
    BWD(M_DTYPE_UNKNOWN, T_DV, 0, ERR_INVALID_VALUE, "dv: unknown dtype 77"),
    FWD(M_RANK0, T_K, 0, ERR_INVALID_VALUE, "k: rank 0 is not in 1..4"),
    FWD(M_RANK5, T_O, 0, ERR_INVALID_VALUE, "o: rank 5 is not in 1..4"),
    FWD(M_RANK_WRONG, T_Q, 0, ERR_SHAPE_MISMATCH, "q has rank 3; a dense call needs rank 4"),
    VFWD(M_RANK_WRONG, T_V, 0, ERR_SHAPE_MISMATCH, "v has rank 2; a varlen call needs rank 3"),
    FWD(M_RANK_WRONG, T_LSE, 0, ERR_SHAPE_MISMATCH, "lse must have shape [B, H, Nq]"),
    /* sizes and strides */
    FWD(M_NEG_SIZE, T_Q, 0, ERR_BAD_SIZE, "q: dimension 1 has negative size -5"),
    BWD(M_NEG_SIZE, T_DK, 0, ERR_BAD_SIZE, "dk: dimension 1 has negative size -7"),
    FWD(M_NEG_STRIDE, T_K, 0, ERR_BAD_STRIDE, "k: dimension 2 has negative stride -8"),
    BWD(M_NEG_STRIDE, T_DQ, 0, ERR_BAD_STRIDE, "dq: dimension 2 has negative stride"),
    FWD(M_STRIDE_OVERFLOW, T_Q, 0, ERR_BAD_STRIDE, "q: stride"),
    FWD(M_STRIDE_OVERFLOW, T_O, 0, ERR_BAD_STRIDE, "overflows 64-bit offsets"),
    FWD(M_BYTES_OVERFLOW, T_V, 0, ERR_BAD_STRIDE, "v: extent overflows 64-bit byte offsets"),
    FWD(M_ADDRESS_WRAP, T_Q, 0, ERR_BAD_STRIDE, "q: extent wraps the address space"),
    FWD(M_COUNT_OVERFLOW, T_K, 0, ERR_BAD_SIZE, "k: element count overflows"),
    FWD(M_HEADS_ZERO, 0, 0, ERR_BAD_SIZE, "heads (0)"),
    FWD(M_D_ZERO, 0, 0, ERR_BAD_SIZE, "head dim (0)"),
    BWD(M_D_ZERO, 0, 0, ERR_BAD_SIZE, "head dim (0)"),
    FWD(M_SEQ_31BIT, T_Q, 0, ERR_BAD_SIZE, "31 bits"),
    /* shapes that disagree: every tensor, several dimensions */
    FWD(M_SHAPE_D0, T_K, 0, ERR_SHAPE_MISMATCH, "k has shape [3, 7, 2, 8]"),
    FWD(M_SHAPE_D1, T_V, 0, ERR_SHAPE_MISMATCH, "v has shape [2, 8, 2, 8]"),
    FWD(M_SHAPE_D3, T_V, 0, ERR_SHAPE_MISMATCH, "v has shape [2, 7, 2, 9]"),
    /* k defines Hkv (and Nk), so a k that disagrees is reported on v */
    FWD(M_SHAPE_D2, T_K, 0, ERR_SHAPE_MISMATCH, "v has shape [2, 7, 2, 8]; expected [2, 7, 3, 8]"),
    FWD(M_SHAPE_D1, T_O, 0, ERR_SHAPE_MISMATCH, "o has shape [2, 6, 4, 8]"),
    FWD(M_SHAPE_D2, T_O, 0, ERR_SHAPE_MISMATCH, "o has shape [2, 5, 5, 8]"),
    FWD(M_SHAPE_D2, T_LSE, 0, ERR_SHAPE_MISMATCH, "lse must have shape [B, H, Nq]"),
    FWD(M_SHAPE_D1, T_LSE, 0, ERR_SHAPE_MISMATCH, "lse must have shape [B, H, Nq]"),
    BWD(M_SHAPE_D1, T_DOUT, 0, ERR_SHAPE_MISMATCH, "dout has shape [2, 6, 4, 8]"),
    BWD(M_SHAPE_D3, T_DQ, 0, ERR_SHAPE_MISMATCH, "dq has shape [2, 5, 4, 9]"),
    BWD(M_SHAPE_D1, T_DK, 0, ERR_SHAPE_MISMATCH, "dk has shape [2, 8, 2, 8]"),
    BWD(M_SHAPE_D2, T_DV, 0, ERR_SHAPE_MISMATCH, "dv has shape [2, 7, 3, 8]"),
    BWD(M_SHAPE_D0, T_LSE, 0, ERR_SHAPE_MISMATCH, "lse must have shape"),
    VFWD(M_SHAPE_D0, T_V, 0, ERR_SHAPE_MISMATCH, "v has shape [8, 2, 8]; expected [7, 2, 8]"),
    VFWD(M_SHAPE_D1, T_LSE, 0, ERR_SHAPE_MISMATCH, "lse must have shape [H, total_q]"),
    VBWD(M_SHAPE_D0, T_DQ, 0, ERR_SHAPE_MISMATCH, "dq has shape [6, 4, 8]"),
    /* dtypes */
    FWD(M_DTYPE_F32, T_V, 0, ERR_DTYPE_MISMATCH, "v has dtype f32; expected f16"),
    FWD(M_DTYPE_F32, T_O, 0, ERR_DTYPE_MISMATCH, "o has dtype f32; expected f16"),
    FWD(M_DTYPE_F16, T_LSE, 0, ERR_DTYPE_MISMATCH, "lse has dtype f16; expected f32"),
    BWD(M_DTYPE_F32, T_DK, 0, ERR_DTYPE_MISMATCH, "dk has dtype f32; expected f16"),
    BWD(M_DTYPE_F32, T_DOUT, 0, ERR_DTYPE_MISMATCH, "dout has dtype f32; expected f16"),
    /* head ratio */
    FWD(M_HEAD_RATIO, 0, 0, ERR_HEAD_RATIO, "query heads (4) must be a multiple of kv heads (3)"),
    BWD(M_HEAD_RATIO, 0, 0, ERR_HEAD_RATIO, "multiple of kv heads"),
    /* aliasing */
    FWD(M_ALIAS_SAME_AS, T_O, T_Q, ERR_ALIASING, "output o overlaps input q"),
    FWD(M_ALIAS_INSIDE, T_O, T_V, ERR_ALIASING, "output o overlaps input v"),
    FWD(M_ALIAS_INSIDE, T_LSE, T_O, ERR_ALIASING, "output lse overlaps output o"),
    BWD(M_ALIAS_INSIDE, T_DK, T_DQ, ERR_ALIASING, "output dk overlaps output dq"),
    BWD(M_ALIAS_SAME_AS, T_DV, T_K, ERR_ALIASING, "output dv overlaps input k"),
    BWD(M_ALIAS_INSIDE, T_DQ, T_LSE, ERR_ALIASING, "output dq overlaps input lse"),
    FWD(M_SELF_ALIAS, T_O, 0, ERR_ALIASING, "o: its strides make distinct elements share memory"),
    FWD(M_SELF_ALIAS, T_LSE, 0, ERR_ALIASING, "lse: its strides make distinct elements share"),
    BWD(M_SELF_ALIAS, T_DK, 0, ERR_ALIASING, "dk: its strides make distinct elements share"),
    /* parameters */
    FWD(M_SCALE_NAN, 0, 0, ERR_INVALID_VALUE, "scale nan must be finite"),
    FWD(M_SCALE_NEG, 0, 0, ERR_INVALID_VALUE, "scale -0.5 must be finite and >= 0"),
    BWD(M_SCALE_INF, 0, 0, ERR_INVALID_VALUE, "scale inf must be finite"),
    FWD(M_SOFTCAP_NEG, 0, 0, ERR_INVALID_VALUE, "softcap -1 must be finite and >= 0"),
    FWD(M_SOFTCAP_NAN, 0, 0, ERR_INVALID_VALUE, "softcap nan"),
    FWD(M_WINDOW_LEFT, 0, 0, ERR_INVALID_VALUE, "window (-2, -1)"),
    BWD(M_WINDOW_RIGHT, 0, 0, ERR_INVALID_VALUE, "window (-1, -5)"),
    FWD(M_DESCALE_NEG, 0, 0, ERR_INVALID_VALUE, "descale_k is -1: fp8 descale factors must be"),
    FWD(M_DESCALE_NAN, 0, 0, ERR_INVALID_VALUE, "descale_q is nan"),
    FWD(M_DESCALE_NOT_FP8, 0, 0, OK, NULL),
    /* fp8 (docs/semantics.md, "fp8"): inputs share one fp8 dtype, o is bf16 or f16, forward only */
    FWD(M_FP8, 0, 0, OK, NULL),
    FWD(M_FP8_E5M2, 0, 0, OK, NULL),
    {"cpu", FLASHPORT_BF16, 8, 0, 0, M_FP8, 0, 0, FLASHPORT_OK, NULL},
    VFWD(M_FP8, 0, 0, OK, NULL),
    FWD(M_FP8_K_E5M2, 0, 0, ERR_DTYPE_MISMATCH, "k has dtype fp8_e5m2; expected fp8_e4m3"),
    FWD(M_FP8_O, T_O, 0, ERR_DTYPE_MISMATCH,
        "o has dtype f32; with fp8_e4m3 inputs o must be bf16 or f16"),
    FWD(M_FP8_O_FP8, T_O, 0, ERR_DTYPE_MISMATCH, "o has dtype fp8_e4m3; with fp8_e4m3 inputs"),
    FWD(M_FP8_DESCALE_V, 0, 0, ERR_INVALID_VALUE, "descale_v is -inf"),
    BWD(M_FP8, 0, 0, ERR_UNSUPPORTED_DTYPE,
        "fp8 (fp8_e4m3) inputs are forward only: no backend has an fp8 backward"),
    VBWD(M_FP8_E5M2, 0, 0, ERR_UNSUPPORTED_DTYPE, "fp8 (fp8_e5m2) inputs are forward only"),
    {"testdev", F16, 8, 0, 0, M_FP8, 0, 0, FLASHPORT_ERR_UNSUPPORTED_DTYPE,
     "backend 'testdev' has no forward kernel for dtype fp8_e4m3"},
    /* varlen offsets */
    VFWD(M_CU_Q_START, 0, 0, ERR_BAD_SEQLENS, "cu_seqlens_q[0] is 1; it must be 0"),
    VFWD(M_CU_K_DECREASING, 0, 0, ERR_BAD_SEQLENS,
         "cu_seqlens_k is not monotone: entry 1 is 4, entry 2 is 3"),
    VBWD(M_CU_K_DECREASING, 0, 0, ERR_BAD_SEQLENS, "cu_seqlens_k is not monotone"),
    VFWD(M_CU_K_EXCEEDS, 0, 0, ERR_BAD_SEQLENS,
         "cu_seqlens_k[2] = 8 exceeds the 7 tokens of the packed buffer"),
    VFWD(M_CU_Q_OVER_MAX, 0, 0, ERR_BAD_SEQLENS,
         "cu_seqlens_q: sequence 0 has length 3 > max_seqlen 2"),
    VFWD(M_CU_K_ONLY, 0, 0, ERR_NULL_POINTER, "varlen needs both cu_seqlens_q and cu_seqlens_k"),
    VBWD(M_CU_Q_ONLY, 0, 0, ERR_NULL_POINTER, "varlen needs both cu_seqlens_q and cu_seqlens_k"),
    VFWD(M_VARLEN_NEG_BATCH, 0, 0, ERR_BAD_SIZE, "varlen batch -1"),
    VFWD(M_RANK_WRONG, T_LSE, 0, ERR_SHAPE_MISMATCH, "lse must have shape [H, total_q]"),
    /* what a backend can run: testdev refuses, cpu accepts the very same calls */
    {"testdev", F16, 8, 0, 0, M_NONE, 0, 0, FLASHPORT_OK, NULL},
    {"testdev", FLASHPORT_BF16, 16, 0, 0, M_NONE, 0, 0, FLASHPORT_OK, NULL},
    {"testdev", FLASHPORT_F32, 8, 0, 0, M_NONE, 0, 0, FLASHPORT_ERR_UNSUPPORTED_DTYPE,
     "backend 'testdev' has no forward kernel for dtype f32"},
    {"cpu", FLASHPORT_F32, 8, 0, 0, M_NONE, 0, 0, FLASHPORT_OK, NULL},
    {"testdev", F16, 12, 0, 0, M_NONE, 0, 0, FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM,
     "backend 'testdev' supports head dims up to 64 that are multiples of 8; got 12"},
    {"cpu", F16, 12, 0, 0, M_NONE, 0, 0, FLASHPORT_OK, NULL},
    {"testdev", F16, 72, 0, 0, M_NONE, 0, 0, FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM, "got 72"},
    {"cpu", F16, 72, 0, 0, M_NONE, 0, 0, FLASHPORT_OK, NULL},
    {"testdev", F16, 8, 0, 0, M_LAST_STRIDE2, T_Q, 0, FLASHPORT_ERR_UNSUPPORTED_LAYOUT,
     "backend 'testdev' needs q's last dimension contiguous (stride 1); got stride 2"},
    {"testdev", F16, 8, 0, 0, M_LAST_STRIDE2, T_O, 0, FLASHPORT_ERR_UNSUPPORTED_LAYOUT,
     "needs o's last dimension contiguous"},
    {"cpu", F16, 8, 0, 0, M_LAST_STRIDE2, T_Q, 0, FLASHPORT_OK, NULL},
    {"cpu", F16, 8, 0, 0, M_LAST_STRIDE2, T_O, 0, FLASHPORT_OK, NULL},
    {"testdev", F16, 8, 0, 1, M_NONE, 0, 0, FLASHPORT_ERR_UNSUPPORTED_FEATURE,
     "backend 'testdev' has no backward"},
};

static flashport_backend *cpu_backend, *testdev_backend;

static void run_case(const vcase *c, int index)
{
    char name[160];
    snprintf(name, sizeof name, "case %d (%s %s %s D%d %s, mutation %d on %s)", index, c->backend,
             flashport_dtype_name(c->dtype), c->varlen ? "varlen" : "dense", c->d,
             c->backward ? "backward" : "forward", (int)c->m, tensor_names[c->tensor]);
    flashport_backend *be = strcmp(c->backend, "cpu") == 0 ? cpu_backend : testdev_backend;
    if (!CHECK_MSG(be != NULL, "%s: backend '%s' did not open", name, c->backend))
        return;
    tu_rng rng = tu_rng_seed(1000 + (uint64_t)index);
    fixture f;
    if (!CHECK_MSG(fixture_init(&f, be, c->dtype, c->d, c->varlen, c->backward, &rng) == 0,
                   "%s: out of memory", name)) {
        fixture_free(&f);
        return;
    }
    apply(&f, c->m, c->tensor, c->other);
    memcpy(f.snapshot, f.arena, f.arena_bytes);
    flashport_status st = fixture_call(&f);
    const char *msg = flashport_last_error();
    CHECK_MSG(st == c->want, "%s: got %s (\"%s\"), expected %s", name, flashport_status_string(st),
              msg, flashport_status_string(c->want));
    if (c->want != FLASHPORT_OK) {
        CHECK_MSG(msg[0] != '\0', "%s: empty error message", name);
        CHECK_MSG(strstr(msg, c->needle) != NULL, "%s: message \"%s\" lacks \"%s\"", name, msg,
                  c->needle);
        size_t first_diff = 0;
        while (first_diff < f.arena_bytes && f.arena[first_diff] == f.snapshot[first_diff])
            first_diff++;
        CHECK_MSG(first_diff == f.arena_bytes, "%s: a rejected call wrote byte %zu of the arena",
                  name, first_diff);
    } else if (st == FLASHPORT_OK) {
        CHECK_MSG(msg[0] == '\0', "%s: success left the message \"%s\"", name, msg);
        /* every output element written, and no input region touched */
        for (int i = 0; i < NT; i++) {
            if (is_output(&f, i) && f.arg[i])
                CHECK_MSG(visit_elements(f.arg[i], unwritten, NULL) == 0,
                          "%s: %s has elements the call did not write", name, tensor_names[i]);
            if (!is_output(&f, i))
                CHECK_MSG(memcmp(f.region[i], f.snapshot + (f.region[i] - f.arena),
                                 f.region_bytes[i]) == 0,
                          "%s: input %s was modified", name, tensor_names[i]);
        }
        CHECK_MSG(memcmp(f.packed_in, f.snapshot + (f.packed_in - f.arena), f.packed_bytes) == 0,
                  "%s: the packed input buffer was modified", name);
    }
    fixture_free(&f);
}

/* ---- backend-level statuses ---------------------------------------------------------------- */

static int contains(const char *s, const char *needle)
{
    return strstr(s, needle) != NULL;
}

#define CHECK_STATUS(call, want, needle)                                                           \
    do {                                                                                           \
        flashport_status st_ = (call);                                                             \
        const char *m_ = flashport_last_error();                                                   \
        CHECK_MSG(st_ == (want), "%s: got %s (\"%s\"), expected %s", #call,                        \
                  flashport_status_string(st_), m_, flashport_status_string(want));                \
        CHECK_MSG(contains(m_, needle), "%s: message \"%s\" lacks \"%s\"", #call, m_, needle);     \
    } while (0)

/* Folder of the code that holds the registry: where it looks for plugins last. */
static void library_folder(char *buf, size_t size)
{
    Dl_info info;
    buf[0] = '\0';
    if (dladdr((void *)&flashport_backend_open, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash)
            snprintf(buf, size, "%.*s", (int)(slash - info.dli_fname + 1), info.dli_fname);
    }
}

/* "cuda" / "hip" with an empty FLASHPORT_PLUGIN_PATH. This binary links the static core, so the
 * registry's "library folder" is the folder of this executable (bin/), where no GPU plugin is
 * built: the answer must be BACKEND_UNAVAILABLE. Should a plugin ever sit there, NO_DEVICE (or
 * success on a GPU machine) is accepted and printed. */
static void test_gpu_names_unavailable(void)
{
    char empty_dir[] = "/tmp/flashport_test_empty_XXXXXX";
    if (!CHECK(mkdtemp(empty_dir) != NULL))
        return;
    const char *saved = getenv("FLASHPORT_PLUGIN_PATH");
    char *saved_copy = saved ? strdup(saved) : NULL;
    setenv("FLASHPORT_PLUGIN_PATH", empty_dir, 1);
    char lib[2048];
    library_folder(lib, sizeof lib);
    const char *gpu[] = {"cuda", "hip"};
    for (int i = 0; i < 2; i++) {
        char plugin[2300];
        snprintf(plugin, sizeof plugin, "%slibflashport_%s.so", lib, gpu[i]);
        flashport_backend *be = (flashport_backend *)&be; /* must be reset to NULL */
        flashport_status st = flashport_backend_open(gpu[i], &be);
        const char *msg = flashport_last_error();
        if (access(plugin, F_OK) != 0) {
            /* no plugin anywhere: a known name that is unavailable, not unknown */
            CHECK_MSG(st == FLASHPORT_ERR_BACKEND_UNAVAILABLE, "'%s' without plugin: %s (\"%s\")",
                      gpu[i], flashport_status_string(st), msg);
            CHECK_MSG(contains(msg, "libflashport_") && contains(msg, "not found") &&
                          contains(msg, "available backends: cpu, reference"),
                      "'%s' unavailable: message \"%s\"", gpu[i], msg);
            CHECK_MSG(be == NULL, "'%s': *out not reset on failure", gpu[i]);
            printf("'%s': BACKEND_UNAVAILABLE (%s)\n", gpu[i], msg);
        } else {
            /* a real plugin sits next to the library: without a device it must say so */
            CHECK_MSG(st == FLASHPORT_ERR_NO_DEVICE || st == FLASHPORT_ERR_BACKEND_UNAVAILABLE ||
                          st == FLASHPORT_OK,
                      "'%s' with plugin %s: %s (\"%s\")", gpu[i], plugin,
                      flashport_status_string(st), msg);
            printf("'%s': plugin %s present; open gave %s (%s)\n", gpu[i], plugin,
                   flashport_status_string(st), msg);
            flashport_backend_close(st == FLASHPORT_OK ? be : NULL);
        }
    }
    if (saved_copy) {
        setenv("FLASHPORT_PLUGIN_PATH", saved_copy, 1);
        free(saved_copy);
    } else {
        unsetenv("FLASHPORT_PLUGIN_PATH");
    }
    rmdir(empty_dir);
}

static void test_backend_statuses(void)
{
    flashport_backend *be = NULL;
    CHECK_STATUS(flashport_backend_open("nonexistent", &be), FLASHPORT_ERR_BACKEND_UNKNOWN,
                 "unknown backend 'nonexistent'");
    CHECK_MSG(contains(flashport_last_error(), "cpu") &&
                  contains(flashport_last_error(), "reference"),
              "unknown backend: \"%s\" does not name cpu and reference", flashport_last_error());
    CHECK_STATUS(flashport_backend_open("testnodev", &be), FLASHPORT_ERR_NO_DEVICE,
                 "no test device 0 present");
    CHECK_STATUS(flashport_backend_open_device("testnodev", 3, &be), FLASHPORT_ERR_NO_DEVICE,
                 "no test device 3 present");
    CHECK_STATUS(flashport_backend_open("cpu", NULL), FLASHPORT_ERR_NULL_POINTER, "out is NULL");
    CHECK_STATUS(flashport_backend_open_device("cpu", -1, &be), FLASHPORT_ERR_INVALID_VALUE,
                 "device index -1 is negative");
    const char *bad_devices[] = {"abc", "-1", "1x", "99999999999999999999"};
    for (int i = 0; i < 4; i++) {
        setenv("FLASHPORT_DEVICE", bad_devices[i], 1);
        be = (flashport_backend *)&be;
        CHECK_STATUS(flashport_backend_open("cpu", &be), FLASHPORT_ERR_INVALID_VALUE,
                     "is not a device index");
        CHECK_MSG(contains(flashport_last_error(), bad_devices[i]),
                  "FLASHPORT_DEVICE message \"%s\" does not quote '%s'", flashport_last_error(),
                  bad_devices[i]);
        CHECK_MSG(be == NULL, "FLASHPORT_DEVICE=%s: *out not reset", bad_devices[i]);
    }
    setenv("FLASHPORT_DEVICE", "2", 1);
    if (CHECK(flashport_backend_open("cpu", &be) == FLASHPORT_OK)) {
        CHECK(flashport_backend_device(be) == 2);
        flashport_backend_close(be);
    }
    unsetenv("FLASHPORT_DEVICE");
    test_gpu_names_unavailable();

    /* memory helpers */
    void *ptr = (void *)&ptr;
    CHECK_STATUS(flashport_malloc(cpu_backend, SIZE_MAX / 2, &ptr), FLASHPORT_ERR_OUT_OF_MEMORY,
                 "cannot allocate");
    CHECK_MSG(ptr == NULL, "failed malloc left a pointer");
    CHECK_STATUS(flashport_malloc(cpu_backend, SIZE_MAX, &ptr), FLASHPORT_ERR_OUT_OF_MEMORY,
                 "cannot allocate");
    CHECK_STATUS(flashport_malloc(NULL, 16, &ptr), FLASHPORT_ERR_NULL_POINTER, "backend is NULL");
    CHECK_STATUS(flashport_malloc(cpu_backend, 16, NULL), FLASHPORT_ERR_NULL_POINTER,
                 "ptr is NULL");
    char host[8] = {0};
    CHECK_STATUS(flashport_memcpy_to_device(cpu_backend, NULL, host, 8), FLASHPORT_ERR_NULL_POINTER,
                 "memcpy");
    CHECK_STATUS(flashport_memcpy_to_host(cpu_backend, host, NULL, 8), FLASHPORT_ERR_NULL_POINTER,
                 "memcpy");
    CHECK_STATUS(flashport_synchronize(NULL), FLASHPORT_ERR_NULL_POINTER, "backend is NULL");
    CHECK_STATUS(flashport_available_backends(NULL, 8, NULL), FLASHPORT_ERR_NULL_POINTER, "buf");
    CHECK_STATUS(flashport_set_stream(cpu_backend, (void *)host), FLASHPORT_ERR_UNSUPPORTED_FEATURE,
                 "takes no stream");
    if (testdev_backend)
        CHECK_STATUS(flashport_set_stream(testdev_backend, (void *)host), FLASHPORT_ERR_DEVICE,
                     "is not a stream of this device");
}

static void test_status_strings(void)
{
    const char *fallback = flashport_status_string((flashport_status)999);
    CHECK_MSG(fallback != NULL && fallback[0] != '\0', "status 999 has no string");
    const char *seen[FLASHPORT_ERR_INTERNAL + 1];
    for (int s = FLASHPORT_OK; s <= FLASHPORT_ERR_INTERNAL; s++) {
        const char *str = flashport_status_string((flashport_status)s);
        seen[s] = str;
        if (!CHECK_MSG(str != NULL, "status %d: NULL string", s))
            continue;
        CHECK_MSG(strncmp(str, "FLASHPORT_", 10) == 0 && strcmp(str, fallback) != 0,
                  "status %d: string \"%s\" (fallback \"%s\")", s, str, fallback);
        for (int r = 0; r < s; r++)
            CHECK_MSG(seen[r] && strcmp(seen[r], str) != 0,
                      "statuses %d and %d share the string \"%s\"", r, s, str);
    }
    CHECK(strcmp(flashport_status_string(FLASHPORT_ERR_HEAD_RATIO), "FLASHPORT_ERR_HEAD_RATIO") ==
          0);
}

/* ---- fp_tensor_injective / fp_tensors_disjoint --------------------------------------------- */

static flashport_tensor make(void *data, flashport_dtype dt, int rank, const int64_t *shape,
                             const int64_t *stride)
{
    flashport_tensor t = flashport_tensor_contiguous(data, dt, rank, shape);
    memcpy(t.stride, stride, (size_t)rank * sizeof *stride);
    return t;
}

typedef struct byte_marks {
    const unsigned char *base;
    uint8_t *mark; /* one flag a byte from base */
    size_t size;
} byte_marks;

/* Marks the bytes of t's element at off; 1 if one of them was marked already. */
static int64_t mark_element(const flashport_tensor *t, int64_t off, void *ctx)
{
    const byte_marks *bm = ctx;
    const size_t es = flashport_dtype_size(t->dtype);
    const size_t at = (size_t)((const unsigned char *)t->data - bm->base) + (size_t)off * es;
    int64_t seen = 0;
    for (size_t b = 0; b < es && at + b < bm->size; b++) {
        seen |= bm->mark[at + b];
        bm->mark[at + b] = 1;
    }
    return seen;
}

/* Byte offsets (relative to base) covered by t, marked in `mark` (size bytes); returns 1 if two
 * elements of t share a byte. */
static int mark_bytes(const flashport_tensor *t, const unsigned char *base, uint8_t *mark,
                      size_t size)
{
    byte_marks bm = {base, mark, size};
    return visit_elements(t, mark_element, &bm) != 0;
}

static void test_layout_helpers(void)
{
    static uint16_t buf[4096];
    const flashport_dtype h16 = FLASHPORT_F16;
    /* injective */
    {
        int64_t sh[3] = {2, 3, 4}, st[3] = {12, 4, 1};
        flashport_tensor t = make(buf, h16, 3, sh, st);
        CHECK(fp_tensor_injective(&t));
        int64_t st_t[3] = {1, 2, 6}; /* transposed */
        t = make(buf, h16, 3, sh, st_t);
        CHECK(fp_tensor_injective(&t));
        int64_t st0[3] = {12, 0, 1}; /* stride 0 on a dim of 3 */
        t = make(buf, h16, 3, sh, st0);
        CHECK(!fp_tensor_injective(&t));
        int64_t sh1[3] = {2, 1, 4}, st1[3] = {4, 0, 1}; /* stride 0 on a dim of 1: harmless */
        t = make(buf, h16, 3, sh1, st1);
        CHECK(fp_tensor_injective(&t));
        int64_t sh2[2] = {4, 4}, st2[2] = {2, 1}; /* rows overlap */
        t = make(buf, h16, 2, sh2, st2);
        CHECK(!fp_tensor_injective(&t));
        int64_t sh3[2] = {3, 2}, st3[2] = {1, 2}; /* 0 + 2 * 1 == 2 + 2 * 0 */
        t = make(buf, h16, 2, sh3, st3);
        CHECK(!fp_tensor_injective(&t));
        int64_t st4[2] = {1, 3};
        t = make(buf, h16, 2, sh3, st4);
        CHECK(fp_tensor_injective(&t));
    }
    /* disjoint: fixed layouts */
    {
        int64_t sh[2] = {4, 8}, st[2] = {8, 1};
        flashport_tensor a = make(buf, h16, 2, sh, st), b = make(buf + 32, h16, 2, sh, st);
        CHECK(fp_tensors_disjoint(&a, &b)); /* adjacent */
        b.data = buf + 31;
        CHECK(!fp_tensors_disjoint(&a, &b)); /* one element shared */
        CHECK(!fp_tensors_disjoint(&a, &a));
        b.data = (char *)(buf + 32) - 1;
        CHECK(!fp_tensors_disjoint(&a, &b)); /* one byte shared */
        int64_t z[2] = {0, 8};
        flashport_tensor empty = make(buf, h16, 2, z, st);
        CHECK(fp_tensors_disjoint(&a, &empty));
        /* even and odd elements */
        int64_t sh1[1] = {16}, st1[1] = {2};
        flashport_tensor ev = make(buf, h16, 1, sh1, st1), od = make(buf + 1, h16, 1, sh1, st1);
        CHECK(fp_tensors_disjoint(&ev, &od));
        od.data = buf + 2;
        CHECK(!fp_tensors_disjoint(&ev, &od));
        /* f32 over f16 elements: a different dtype that overlaps */
        flashport_tensor f32 = make(buf + 1, FLASHPORT_F32, 1, sh1, st1);
        CHECK(!fp_tensors_disjoint(&ev, &f32));
        /* packed qkv [B=2, N=3, H + 2 Hkv, D=4] with H = 4, Hkv = 2 (different head counts) */
        int64_t c = 8, qs[4] = {2, 3, 4, 4}, ks[4] = {2, 3, 2, 4};
        int64_t pst[4] = {3 * c * 4, c * 4, 4, 1};
        flashport_tensor q = make(buf, h16, 4, qs, pst);
        flashport_tensor k = make(buf + 4 * 4, h16, 4, ks, pst);
        flashport_tensor v = make(buf + 6 * 4, h16, 4, ks, pst);
        CHECK(fp_tensors_disjoint(&q, &k) && fp_tensors_disjoint(&k, &q));
        CHECK(fp_tensors_disjoint(&q, &v) && fp_tensors_disjoint(&k, &v));
        k.data = buf + 3 * 4; /* k starts at q's last head */
        CHECK(!fp_tensors_disjoint(&q, &k) && !fp_tensors_disjoint(&k, &q));
        k.data = buf + 4 * 4 + 2; /* off by half a head: clear of q, but runs into v */
        CHECK(fp_tensors_disjoint(&q, &k) && !fp_tensors_disjoint(&k, &v));
    }
    /* random layouts against brute force: never "disjoint" / "injective" when they are not, and
     * exact for equal-stride slices whose larger-extent hull is injective */
    tu_rng r = tu_rng_seed(7);
    enum { BYTES = 2048 };
    static uint8_t ma[BYTES], mb[BYTES];
    const unsigned char *base = (const unsigned char *)buf;
    int exact_checked = 0, disjoint_found = 0;
    for (int it = 0; it < 20000; it++) {
        int rank = 1 + (int)(tu_rng_u32(&r) % 3);
        int64_t sa[3], sb[3], st[3], stb[3];
        for (int dd = 0; dd < rank; dd++) {
            sa[dd] = 1 + tu_rng_u32(&r) % 4;
            sb[dd] = tu_rng_u32(&r) % 2 ? sa[dd] : 1 + tu_rng_u32(&r) % 4;
            st[dd] = tu_rng_u32(&r) % 13;
            stb[dd] = tu_rng_u32(&r) % 4 ? st[dd] : tu_rng_u32(&r) % 13;
        }
        flashport_dtype da = h16, db = tu_rng_u32(&r) % 6 ? h16 : FLASHPORT_F32;
        flashport_tensor a = make((char *)buf + 2 * (tu_rng_u32(&r) % 40), da, rank, sa, st);
        size_t boff = tu_rng_u32(&r) % 8 ? 2 * (tu_rng_u32(&r) % 80) : tu_rng_u32(&r) % 160;
        flashport_tensor b = make((char *)buf + boff, db, rank, sb, stb);
        memset(ma, 0, sizeof ma);
        memset(mb, 0, sizeof mb);
        int a_self = mark_bytes(&a, base, ma, BYTES);
        mark_bytes(&b, base, mb, BYTES);
        int truly_disjoint = 1;
        for (int i = 0; i < BYTES; i++)
            truly_disjoint &= !(ma[i] && mb[i]);
        int inj = fp_tensor_injective(&a), dis = fp_tensors_disjoint(&a, &b);
        disjoint_found += truly_disjoint;
        if (!CHECK_MSG(!(inj && a_self),
                       "iteration %d: injective claimed for a self-overlapping "
                       "layout",
                       it) ||
            !CHECK_MSG(!(dis && !truly_disjoint),
                       "iteration %d: disjoint claimed for overlapping tensors", it))
            break;
        int same = da == db && (boff % 2 == 0);
        flashport_tensor hull = a;
        for (int dd = 0; dd < rank; dd++) {
            same &= st[dd] == stb[dd];
            if (sb[dd] > hull.shape[dd])
                hull.shape[dd] = sb[dd];
        }
        if (same && fp_tensor_injective(&hull)) {
            exact_checked++;
            if (!CHECK_MSG(dis == truly_disjoint,
                           "iteration %d: equal-stride slices: disjoint says %d, brute force %d",
                           it, dis, truly_disjoint))
                break;
        }
    }
    CHECK_MSG(exact_checked > 1000 && disjoint_found > 1000,
              "random layouts too narrow: %d exact checks, %d disjoint pairs", exact_checked,
              disjoint_found);
}

/* The KV cache (seqused_k, block_table) on the host backends: every bad input its own status and
 * message, o untouched; the fields' defaults for a caller built before they existed; a backend
 * whose caps do not serve them (the test plugin) refuses them. */
static void test_kv_cache(void)
{
    enum { KB = 2, KNQ = 1, KH = 4, KHKV = 2, KD = 8, PS = 4, PAGES = 5, STRIDE = 3 };
    static float q[KB * KNQ * KH * KD], kp[PAGES * PS * KHKV * KD], vp[PAGES * PS * KHKV * KD];
    static float o[KB * KNQ * KH * KD];
    for (int i = 0; i < PAGES * PS * KHKV * KD; i++)
        kp[i] = vp[i] = (float)(i % 7) * 0.125f;
    for (int i = 0; i < KB * KNQ * KH * KD; i++)
        q[i] = (float)(i % 5) * 0.25f;
    const int64_t qs[4] = {KB, KNQ, KH, KD}, ks[4] = {PAGES, PS, KHKV, KD};
    flashport_tensor tq = flashport_tensor_contiguous(q, FLASHPORT_F32, 4, qs);
    flashport_tensor to = flashport_tensor_contiguous(o, FLASHPORT_F32, 4, qs);
    flashport_tensor tk = flashport_tensor_contiguous(kp, FLASHPORT_F32, 4, ks);
    flashport_tensor tv = flashport_tensor_contiguous(vp, FLASHPORT_F32, 4, ks);
    int32_t used[KB] = {10, 3};
    int32_t bt[KB * STRIDE] = {4, 0, 2, 1, -7, 99}; /* entries past the used pages are not read */
    flashport_attention_params p;
    flashport_attention_params_init(&p);
    p.seqused_k = used;
    p.block_table = bt;
    p.block_table_stride = STRIDE;

#define KV_FWD(params) flashport_attention_forward(cpu_backend, (params), &tq, &tk, &tv, &to, NULL)
#define EXPECT_UNWRITTEN(what)                                                                     \
    do {                                                                                           \
        int w_ = 0;                                                                                \
        for (int i = 0; i < KB * KNQ * KH * KD; i++)                                               \
            w_ |= o[i] != -1.0f;                                                                   \
        CHECK_MSG(!w_, "%s: o was written by a refused call", what);                               \
    } while (0)
    for (int i = 0; i < KB * KNQ * KH * KD; i++)
        o[i] = -1.0f;
    CHECK_STATUS(KV_FWD(&p), FLASHPORT_OK, "");
    int written = 1;
    for (int i = 0; i < KB * KNQ * KH * KD; i++)
        written &= o[i] != -1.0f && isfinite(o[i]);
    CHECK_MSG(written, "paged forward left o unwritten or not finite");

    flashport_attention_params bad = p;
    for (int i = 0; i < KB * KNQ * KH * KD; i++)
        o[i] = -1.0f;
    bt[1] = PAGES; /* a used entry past the cache */
    CHECK_STATUS(KV_FWD(&bad), FLASHPORT_ERR_INVALID_VALUE, "block_table[0][1] = 5");
    EXPECT_UNWRITTEN("block table entry 5");
    bt[1] = -1;
    CHECK_STATUS(KV_FWD(&bad), FLASHPORT_ERR_INVALID_VALUE, "is not a page of the cache");
    EXPECT_UNWRITTEN("block table entry -1");
    bt[1] = 0;
    used[1] = STRIDE * PS + 1; /* past the capacity of a row of the table */
    CHECK_STATUS(KV_FWD(&bad), FLASHPORT_ERR_BAD_SEQLENS, "seqused_k[1] = 13 is outside [0, 12]");
    used[1] = -1;
    CHECK_STATUS(KV_FWD(&bad), FLASHPORT_ERR_BAD_SEQLENS, "seqused_k[1] = -1");
    EXPECT_UNWRITTEN("bad seqused_k");
    used[1] = 3;
    bad.seqused_k = NULL;
    CHECK_STATUS(KV_FWD(&bad), FLASHPORT_ERR_NULL_POINTER, "needs seqused_k");
    bad = p;
    bad.block_table_stride = 0;
    CHECK_STATUS(KV_FWD(&bad), FLASHPORT_ERR_BAD_SIZE, "block_table_stride 0");
    bad = p;
    int32_t cu[KB + 1] = {0, 1, 2};
    bad.cu_seqlens_q = bad.cu_seqlens_k = cu;
    bad.batch = KB;
    bad.max_seqlen_q = bad.max_seqlen_k = 1;
    CHECK_STATUS(KV_FWD(&bad), FLASHPORT_ERR_UNSUPPORTED_FEATURE, "cu_seqlens must be NULL");
    /* k and v of different page shapes; a page size of 0 */
    const int64_t ks2[4] = {PAGES - 1, PS, KHKV, KD}, ks0[4] = {PAGES, 0, KHKV, KD};
    flashport_tensor tv2 = flashport_tensor_contiguous(vp, FLASHPORT_F32, 4, ks2);
    CHECK_STATUS(flashport_attention_forward(cpu_backend, &p, &tq, &tk, &tv2, &to, NULL),
                 FLASHPORT_ERR_SHAPE_MISMATCH, "v has shape [4, 4, 2, 8]");
    flashport_tensor tk0 = flashport_tensor_contiguous(kp, FLASHPORT_F32, 4, ks0);
    CHECK_STATUS(flashport_attention_forward(cpu_backend, &p, &tq, &tk0, &tk0, &to, NULL),
                 FLASHPORT_ERR_BAD_SIZE, "page_size (dimension 1) 0");
    EXPECT_UNWRITTEN("bad paged shapes");
    /* Paged backward is refused before its gradient shapes are looked at. */
    static float lse_buf[KB * KH * KNQ];
    const int64_t ls[3] = {KB, KH, KNQ};
    flashport_tensor lse = flashport_tensor_contiguous(lse_buf, FLASHPORT_F32, 3, ls);
    CHECK_STATUS(
        flashport_attention_backward(cpu_backend, &p, &tq, &tk, &tv, &to, &lse, &to, &to, &tk, &tv),
        FLASHPORT_ERR_UNSUPPORTED_FEATURE, "forward only");
    /* A backend whose caps leave the KV cache at 0 refuses it, paged or not. */
    if (testdev_backend) { /* it serves f16 (its memory is never read: not a host backend) */
        flashport_tensor hq = tq, hk = tk, hv = tv, ho = to;
        hq.dtype = hk.dtype = hv.dtype = ho.dtype = FLASHPORT_F16;
        CHECK_STATUS(flashport_attention_supported(testdev_backend, FLASHPORT_FORWARD, &p, &hq, &hk,
                                                   &hv, &ho, NULL, NULL, NULL, NULL, NULL),
                     FLASHPORT_ERR_UNSUPPORTED_FEATURE, "does not serve a paged KV cache");
        flashport_attention_params used_only;
        flashport_attention_params_init(&used_only);
        used_only.seqused_k = used;
        hk.shape[0] = hv.shape[0] = KB; /* a dense [B, Nk = PS, Hkv, D] cache */
        CHECK_STATUS(flashport_attention_supported(testdev_backend, FLASHPORT_FORWARD, &used_only,
                                                   &hq, &hk, &hv, &ho, NULL, NULL, NULL, NULL,
                                                   NULL),
                     FLASHPORT_ERR_UNSUPPORTED_FEATURE, "does not serve seqused_k in forward");
    }
    /* A struct from before these fields (struct_size ends at descale_v) gets NULL / 0: dense. */
    flashport_attention_params old;
    flashport_attention_params_init_sized(&old, offsetof(flashport_attention_params, seqused_k));
    old.seqused_k = used; /* past the caller's struct: must be ignored */
    old.block_table = bt;
    const int64_t dks[4] = {KB, 5, KHKV, KD};
    flashport_tensor dk = flashport_tensor_contiguous(kp, FLASHPORT_F32, 4, dks);
    flashport_tensor dv = flashport_tensor_contiguous(vp, FLASHPORT_F32, 4, dks);
    CHECK_STATUS(flashport_attention_forward(cpu_backend, &old, &tq, &dk, &dv, &to, NULL),
                 FLASHPORT_OK, "");
    /* seqused_k on a dense cache: capacity Nk = 5. */
    flashport_attention_params dense;
    flashport_attention_params_init(&dense);
    int32_t dused[KB] = {5, 6};
    dense.seqused_k = dused;
    CHECK_STATUS(flashport_attention_forward(cpu_backend, &dense, &tq, &dk, &dv, &to, NULL),
                 FLASHPORT_ERR_BAD_SEQLENS, "seqused_k[1] = 6 is outside [0, 5]");
#undef KV_FWD
#undef EXPECT_UNWRITTEN
}

int main(void)
{
    if (!getenv("FLASHPORT_PLUGIN_PATH"))
        setenv("FLASHPORT_PLUGIN_PATH", FLASHPORT_TEST_PLUGIN_DIR, 1);
    unsetenv("FLASHPORT_DEVICE");
    if (flashport_backend_open("cpu", &cpu_backend) != FLASHPORT_OK) {
        fprintf(stderr, "cannot open cpu: %s\n", flashport_last_error());
        return 1;
    }
    if (flashport_backend_open("testdev", &testdev_backend) != FLASHPORT_OK)
        CHECK_MSG(0, "cannot open the test plugin 'testdev' (FLASHPORT_PLUGIN_PATH=%s): %s",
                  getenv("FLASHPORT_PLUGIN_PATH"), flashport_last_error());

    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++)
        run_case(&cases[i], i);
    test_backend_statuses();
    test_status_strings();
    test_layout_helpers();
    test_kv_cache();

    flashport_backend_close(testdev_backend);
    flashport_backend_close(cpu_backend);
    return tu_finish("test_validation", "%d table cases and the status/helper checks passed", n);
}
