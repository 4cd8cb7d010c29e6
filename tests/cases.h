/*
 * The shared table of attention cases that every backend test runs (cpu and reference here; the
 * CUDA and HIP plugins through the same binary: test_backends cuda / hip), the inputs of a case
 * and the memory layouts it is run in.
 *
 * A case fixes the problem (dtype, shapes, masking, softcap, ALiBi, varlen lengths), whether the
 * backward must be deterministic, and the layout of the tensors handed to the backend under test.
 * Its inputs are generated from a seed derived from the case's position in the table, so a case
 * gives the same numbers whether it runs alone (--filter) or with the others.
 */
#ifndef FLASHPORT_TESTS_CASES_H
#define FLASHPORT_TESTS_CASES_H

#include "tests/test_util.h"

#define TC_MAX_BATCH 8

/* How the backend under test sees its tensors. */
typedef enum tc_layout {
    TC_CONTIGUOUS,  /* row-major [B, N, heads, D] / [tokens, heads, D], each its own buffer    */
    TC_PACKED_QKV,  /* q, k, v slices of one [.., H + 2 Hkv, D] buffer; dq, dk, dv likewise    */
    TC_HEAD_MAJOR,  /* [B, heads, N, D + 3] / [heads, tokens, D + 3]: permuted, padded rows    */
    TC_DIM_STRIDED, /* stride 2 on the head dim (GPU backends may refuse: unsupported layout) */
    TC_LAYOUT_COUNT
} tc_layout;

typedef struct tc_case {
    flashport_dtype dtype;  /* q, k, v */
    flashport_dtype odtype; /* fp8 cases: o's dtype, bf16 or f16 (others: o is in dtype) */
    float descale[3];       /* fp8 cases: descale_q, descale_k, descale_v (0 = 1) */
    int batch, heads, kv_heads;
    int seqlen_q, seqlen_k; /* dense only */
    int head_dim;
    int causal;
    int window; /* nonzero: window_left/right apply (-1 = unbounded); zero: no window */
    int window_left, window_right;
    float softcap; /* 0 = off */
    int alibi;     /* nonzero: slopes 2^(-8 (h + 1) / H) */
    float scale;   /* 0 = default 1/sqrt(D) */
    float range;   /* q and k uniform in [-range, range); 0 = 2 */
    int varlen;    /* nonzero: sequence lengths below, batch entries each */
    int seqlens_q[TC_MAX_BATCH], seqlens_k[TC_MAX_BATCH];
    int deterministic; /* backward runs twice and must be bitwise identical */
    /* KV cache: nonzero use_seqused passes seqused_k = seqused[b] (keys past it hold NaN in the
     * inputs: they must never be read); page_size > 0 hands the backend under test k and v as a
     * paged cache of that page size with shuffled physical pages (forward only: its backward
     * must be refused), the oracle the dense ones. Dense problems only for paged cases. */
    int use_seqused;
    int seqused[TC_MAX_BATCH];
    int page_size;
    /* Paged, GPU backends only (host backends refuse such a table): logical page 1 of every
     * sequence with two used pages or more gets a block-table entry out of range, the pages
     * after it move up one, and that sequence's seqused_k grows by page_size. GPU kernels mask
     * the keys of such a page, so without causal, window or ALiBi (whose alignment the extra
     * keys would shift) the result is the case's own. */
    int hole_page;
    tc_layout layout;
    int quick; /* part of the --quick subset (sanitizer runs) */
} tc_case;

/* Designated initializers of a case's shape, for the tables of cases.c and test_reference.c:
 * {DENSE(F16, B, H, HKV, NQ, NK, D), WINDOW(L, R), .causal = 1}. */
#define DENSE(dt, B, H, HKV, NQ, NK, D)                                                            \
    .dtype = FLASHPORT_##dt, .batch = B, .heads = H, .kv_heads = HKV, .seqlen_q = NQ,              \
    .seqlen_k = NK, .head_dim = D
#define VARLEN(dt, B, H, HKV, D)                                                                   \
    .dtype = FLASHPORT_##dt, .batch = B, .heads = H, .kv_heads = HKV, .head_dim = D, .varlen = 1
#define WINDOW(L, R) .window = 1, .window_left = L, .window_right = R

/* Whether a case has fp8 inputs, and the dtype of its o (and dout, and the gradients). */
static inline int tc_fp8(const tc_case *c)
{
    return c->dtype == FLASHPORT_FP8_E4M3 || c->dtype == FLASHPORT_FP8_E5M2;
}
static inline flashport_dtype tc_out_dtype(const tc_case *c)
{
    return tc_fp8(c) ? c->odtype : c->dtype;
}

/* The table. */
const tc_case *tc_table(int *count);

/* A one-line description ("f16 B2 H8/1 N65x63 D64 causal win(16,0) cap30 alibi varlen det
 * packed"; fp8 cases "e4m3>bf16 ... ds(0.5,4,0.25)"), also what --filter matches. */
void tc_case_name(const tc_case *c, char *buf, size_t size);

/* Whether a backend of this name must run the case (docs/semantics.md): host backends run
 * everything; GPU backends must run f16/bf16 with D a multiple of 8 up to 256 and a contiguous
 * head dim (not with FLASHPORT_CUDA_PATH=sm90, which forces a path that serves less), except the
 * KV-cache cases (seqused_k, paged), which they may refuse (counted as unsupported) but must pass
 * when they run them; opencl must run those (it serves both at any page size). fp8 cases are
 * forward only, required of the host backends, and of the cuda backend on compute capability 9.0
 * (arch "sm_90", flashport_device_props) for e4m3 without a KV cache (its sm90 kernels), unless
 * FLASHPORT_CUDA_PATH=sm80 asks for a path without them. A backend that answers
 * FLASHPORT_ERR_UNSUPPORTED_* for a required case fails it. arch: the device's, or "" when unknown.
 */
int tc_required(const tc_case *c, const char *backend_name, const char *arch);

/* The inputs of a case, on the host, in logical layout (see tu_problem). */
typedef struct tc_data {
    tu_problem prob; /* points into the arrays below; what the naive computation reads */
    int64_t total_q, total_k, max_q, max_k;
    int32_t *cu_q, *cu_k;    /* batch + 1 offsets (dense: b * N) */
    float *q, *k, *v, *dout; /* logical [tokens, heads, D], values representable in the dtype
                                (dout: in o's dtype) */
    float *alibi;            /* [heads] or NULL */
    int32_t *used;           /* [batch] seqused_k of the case, or NULL */
    /* The API parameters. alibi_slopes and cu_seqlens point at the host arrays above; a test of a
     * device backend replaces them with device copies. */
    flashport_attention_params params;
} tc_data;

/* Builds the inputs of case number `index` of the table. Returns 0, or -1 when out of memory. */
int tc_data_make(const tc_case *c, int index, tc_data *d);
void tc_data_free(tc_data *d);

/* The tensors a case hands to a backend, and the buffers they live in. */
enum { TC_Q, TC_K, TC_V, TC_O, TC_DOUT, TC_DQ, TC_DK, TC_DV, TC_TENSORS };

typedef struct tc_plan {
    tu_view view[TC_TENSORS];
    int buffer[TC_TENSORS]; /* which buffer each tensor lives in */
    int64_t buffer_elems[TC_TENSORS];
    int buffers;
} tc_plan;

/* Views of the case's tensors in `layout`. Returns 0, or -1 when the layout cannot hold the case
 * (TC_PACKED_QKV needs as many q tokens as k tokens). */
int tc_plan_make(const tc_case *c, const tc_data *d, tc_layout layout, tc_plan *plan);

/* The LSE is always contiguous f32: [B, H, Nq] dense, [H, total_q] varlen. Its descriptor at
 * `base`, its element count, and its conversion to the logical [H, total_q] order. */
int64_t tc_lse_elems(const tc_data *d);
flashport_tensor tc_lse_tensor(const tc_case *c, const tc_data *d, void *base);
void tc_lse_to_logical(const tc_case *c, const tc_data *d, const float *lse, float *logical);

#endif /* FLASHPORT_TESTS_CASES_H */
