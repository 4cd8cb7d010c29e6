/*
 * The BLAS-materialized attention baseline of flashport-bench (--baseline blas): attention as a
 * program without a fused kernel computes it, timed in the same run on the same inputs as the
 * backend. See baseline_blas.c.
 */
#ifndef FLASHPORT_BENCH_BASELINE_BLAS_H
#define FLASHPORT_BENCH_BASELINE_BLAS_H

#include <stdint.h>

/* f32, dense, contiguous: q, o (B, Nq, H, D); k, v (B, Nk, Hkv, D). Window (left, right) as in
 * flashport (-1 unbounded, aligned bottom-right); causal is (-1, 0). */
typedef struct bench_blas_problem {
    int64_t b, h, hkv, nq, nk, d;
    int64_t left, right;
    float scale;
    const float *q, *k, *v;
    float *o;
} bench_blas_problem;

/* NULL when the bench was built with a BLAS, else why not (for the error message). */
const char *bench_blas_missing(void);

/* Which BLAS, with its thread count, for the report. */
const char *bench_blas_name(void);

/* Runs the baseline on `threads` threads. s: scratch of threads * Nq * Nk floats (one (b, h)
 * score matrix per thread). */
void bench_blas_forward(const bench_blas_problem *p, float *s, int threads);

/* Median and minimum wall time of `iters` runs after `warmup` untimed ones, in ms. */
void bench_blas_time(const bench_blas_problem *p, float *s, int threads, int warmup, int iters,
                     double *median, double *min);

#endif /* FLASHPORT_BENCH_BASELINE_BLAS_H */
