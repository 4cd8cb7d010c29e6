/*
 * Helpers shared by every test binary: a deterministic RNG, dtype conversions and fills, error
 * metrics and the tolerance rule, a CHECK macro, strided tensor views, a file copy, and a naive
 * same-precision attention that sets the error budget of the backends.
 *
 * The tolerance rule (tu_tolerance): a backend's error against the double oracle may be at most
 * TU_TOL_FACTOR times the error of a naive computation in the same precision, plus a floor of a
 * couple of units of the storage dtype's roundoff. For f16/bf16 the naive computation mimics a
 * GPU kernel: f32 math on the stored values, P (and dS in the backward) rounded to the storage
 * dtype before the matrix products, outputs rounded to the dtype. For f32 it is plain float
 * arithmetic with sequential accumulation. fp8 inputs (forward only): the naive computation
 * rounds P to e4m3 against the row's final maximum, like the oracle; a kernel rounds it against
 * its running maximum, which moves each rounding by up to one e4m3 unit, so O gets the extra
 * allowance of tu_tolerance_fp8 (docs/semantics.md, "fp8").
 *
 * Nothing here calls into libflashport, so the helpers link with the shared library and with the
 * internal static one alike.
 */
#ifndef FLASHPORT_TESTS_TEST_UTIL_H
#define FLASHPORT_TESTS_TEST_UTIL_H

#include "flashport.h"

#include <stddef.h>
#include <stdint.h>

/* CTest's "skipped" exit code (SKIP_RETURN_CODE in tests/CMakeLists.txt). */
#define TU_SKIP 77

/* ---- failures ------------------------------------------------------------------------------ */

/* Number of failed checks so far in this process. */
extern int tu_failures;

/* Records a failure (printing file:line and the condition) when cond is false; returns cond. */
int tu_check(int cond, const char *file, int line, const char *expr);
/* Same, with a printf-style explanation. */
int tu_checkf(int cond, const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* The end of a test binary's main: with failed checks, "<name>: N check(s) failed" on stderr and
 * 1; otherwise "<name>: " and the printf-style pass line on stdout, and 0. */
int tu_finish(const char *name, const char *pass_fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define CHECK(cond)          tu_check(!!(cond), __FILE__, __LINE__, #cond)
#define CHECK_MSG(cond, ...) tu_checkf(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* ---- RNG ----------------------------------------------------------------------------------- */

/* xorshift64*, seeded through splitmix64 so nearby seeds give unrelated streams. */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;

tu_rng tu_rng_seed(uint64_t seed);
uint32_t tu_rng_u32(tu_rng *r);
/* Uniform in [lo, hi). */
float tu_rng_uniform(tu_rng *r, float lo, float hi);

/* ---- dtypes -------------------------------------------------------------------------------- */

size_t tu_dtype_size(flashport_dtype dtype);
/* Unit roundoff of the storage dtype: 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16), 2^-4 (e4m3),
 * 2^-3 (e5m2). */
double tu_unit_roundoff(flashport_dtype dtype);

/* Whether s says the backend has no kernel for this call (head dim, dtype, layout or feature):
 * not a failure of the call's checks. */
int tu_is_unsupported(flashport_status s);
/* x rounded to the nearest value the dtype can store, as f32. */
float tu_round(float x, flashport_dtype dtype);

/* buf (n elements of dtype) <-> f32. */
void tu_to_f32(const void *buf, int64_t n, flashport_dtype dtype, float *out);
void tu_from_f32(const float *in, int64_t n, flashport_dtype dtype, void *buf);
/* Fills n elements with uniform values in [lo, hi), rounded to the dtype. */
void tu_fill_uniform(void *buf, int64_t n, flashport_dtype dtype, float lo, float hi, tu_rng *r);
/* Fills n elements with a quiet NaN pattern, so elements a backend forgets to write fail. */
void tu_poison(void *buf, int64_t n, flashport_dtype dtype);
/* Nonzero when element i still holds the poison pattern (bitwise). */
int tu_is_poison(const void *buf, int64_t i, flashport_dtype dtype);

/* ---- errors and tolerances ----------------------------------------------------------------- */

typedef struct tu_err {
    double max_abs; /* max |x - ref|; infinite when x is NaN or an infinity ref does not have */
    double rel_l2;  /* ||x - ref||_2 / ||ref||_2 over finite refs (absolute when ||ref|| == 0) */
    double ref_max; /* max |ref| over finite refs */
} tu_err;

/* x against ref, n elements. Equal infinities (LSE -inf of a masked row) count as exact. */
tu_err tu_error(const float *x, const float *ref, int64_t n);

#define TU_TOL_FACTOR 3.0

typedef struct tu_tol {
    double max_abs, rel_l2;
} tu_tol;

/* TU_TOL_FACTOR x the naive computation's error, plus a floor of 2 units of `roundoff` (absolute:
 * relative to the largest reference value). */
tu_tol tu_tolerance(tu_err naive, double roundoff);
int tu_within(tu_err e, tu_tol t);

/* The fp8 forward's O: tu_tolerance plus TU_FP8_P_ALLOWANCE on rel_l2 and TU_FP8_P_ALLOWANCE x
 * pv_bound on max_abs, pv_bound bounding descale_v * sum_j p_ij |V_jd| (descale_v max |V|).
 * The allowance is two e4m3 unit roundoffs (2 x 2^-4): the oracle and the kernel each round every
 * P to e4m3, against different maxima, and each rounding moves it by at most one unit roundoff
 * relative (normal range); both sums of P stay unrounded. */
#define TU_FP8_P_ALLOWANCE 0.125
/* The LSE of an fp8 case: its floor is 2 units of 2^-12 (not f32's 2^-24) relative to the
 * largest |LSE|: fp8 tensor-core products are reported to accumulate with about 14 bits on
 * Hopper (DeepSeek-V3's report, H800), and the scores, hence the LSE, carry that. */
#define TU_FP8_LSE_ROUNDOFF (1.0 / 4096.0)
tu_tol tu_tolerance_fp8(tu_err naive, double roundoff, double pv_bound);

/* ---- strided views ------------------------------------------------------------------------- */

/* Where the elements of one q/k/v/o-shaped tensor live inside a buffer. Dense tensors are
 * [nb, n, heads, dim]; varlen ones have nb = 1 and n = total tokens (rank 3). Logical token t of
 * batch b is b * n + t: the packed [tokens, heads, dim] order of the naive computation. */
typedef struct tu_view {
    int varlen;
    int64_t offset; /* elements from the buffer start */
    int64_t nb, n, heads, dim;
    int64_t stride[4]; /* elements: batch, token, head, dim */
} tu_view;

/* Elements a view needs in its buffer (one past its largest offset). */
int64_t tu_view_extent(const tu_view *v);
/* The API descriptor of the view inside a buffer at `base` (host or device memory). */
flashport_tensor tu_view_tensor(const tu_view *v, void *base, flashport_dtype dtype);
/* Logical f32 values [nb * n, heads, dim] -> buffer of dtype, and back. */
void tu_scatter(const tu_view *v, const float *logical, void *buf, flashport_dtype dtype);
void tu_gather(const tu_view *v, const void *buf, flashport_dtype dtype, float *logical);
/* Sets covered[offset] = 1 for every element of the view. */
void tu_view_mark(const tu_view *v, uint8_t *covered);

/* ---- files -------------------------------------------------------------------------------- */

/* Copies the file `from` to `to` (created or truncated). Returns 0, or -1 on any failure. */
int tu_copy_file(const char *from, const char *to);

/* ---- naive same-precision attention -------------------------------------------------------- */

/* A problem in logical layout: sequences b = 0..batch-1 of tokens [cu_q[b], cu_q[b+1]) (dense
 * batches are sequences of equal length). Values are f32 numbers representable in `dtype`. */
typedef struct tu_problem {
    flashport_dtype dtype;   /* q, k, v */
    flashport_dtype o_dtype; /* o when dtype is fp8 (bf16 or f16); otherwise o is in dtype */
    float descale_q, descale_k, descale_v; /* fp8 only; 0 means 1 */
    int64_t batch, heads, kv_heads, head_dim;
    const int32_t *cu_q, *cu_k;        /* batch + 1 offsets */
    float scale, softcap;              /* scale resolved (never 0); softcap 0 = off */
    int64_t window_left, window_right; /* -1 = unbounded; causal folded in */
    const float *alibi;                /* [heads] or NULL */
    const float *q, *k, *v;            /* [total_q, H, D], [total_k, Hkv, D], [total_k, Hkv, D] */
    const int32_t *used_k; /* [batch] keys each sequence uses (seqused_k), or NULL: all */
} tu_problem;

/* o: [total_q, H, D]; lse: [H, total_q]. Returns 0, or -1 when out of memory. */
int tu_naive_forward(const tu_problem *p, float *o, float *lse);
/* From o and lse of a forward and dout [total_q, H, D]: dq like q, dk and dv like k. */
int tu_naive_backward(const tu_problem *p, const float *o, const float *lse, const float *dout,
                      float *dq, float *dk, float *dv);

#endif /* FLASHPORT_TESTS_TEST_UTIL_H */
