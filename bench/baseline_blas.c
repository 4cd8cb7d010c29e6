/*
 * BLAS-materialized attention (--baseline blas in flashport-bench): for each (batch, head)
 *   S = scale * Q K^T             cblas_sgemm, Nq x Nk, written to memory
 *   P = softmax(S) row by row     over the keys the window lets the row see (the rest 0)
 *   O = P V                       cblas_sgemm
 * i.e. what a framework's unfused "math" attention does, with S materialized for one head at a
 * time per thread (Nq * Nk floats: 256 MiB at N = 8192). Threads, as many as the flashport
 * backend uses: with at least one (batch, head) per thread, each thread runs whole heads on a
 * single-threaded BLAS (a batched matmul's usual split; it keeps the BLAS's own thread pool from
 * spinning beside the softmax's threads, which on two cores halved the softmax); with fewer
 * heads, heads run in turn on the threaded BLAS with an OpenMP softmax.
 *
 * The softmax is not left slow on purpose: this file is compiled with -O3 -ffast-math
 * (bench/CMakeLists.txt) so that expf is vectorized through glibc's libmvec, and the row loop is
 * cloned for AVX-512 and AVX2 (target_clones, GCC) and picked at run time, as a tuned framework's
 * vectorized exp would be. Masked keys are skipped by the loop bounds, never passed through
 * infinities (which -ffast-math would not honour).
 * Known differences from the reference: f32 throughout; a causal mask still pays for the full
 * Nq x Nk products (as the unfused computation does).
 * OpenBLAS is opened with dlopen on the first --baseline blas, not linked: a linked OpenBLAS
 * starts its thread pool when the program loads, and its idle workers' spinning would then
 * perturb every timing of the bench, baseline or not. CMake passes the library's path when
 * pkg-config finds it; otherwise (or when dlopen fails) bench_blas_missing says why and
 * flashport-bench refuses --baseline blas.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "baseline_blas.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(FLASHPORT_BENCH_OPENBLAS)
#include <cblas.h>
#include <dlfcn.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define BLAS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BLAS_CLONES
#endif

/* The OpenBLAS entry points the baseline uses, from dlsym. */
static struct {
    void (*sgemm)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint,
                  blasint, float, const float *, blasint, const float *, blasint, float, float *,
                  blasint);
    void (*set_num_threads)(int);
    char *(*get_config)(void);
} blas;
static char blas_error[512];

const char *bench_blas_missing(void)
{
    if (blas.sgemm)
        return NULL;
    void *lib = dlopen(FLASHPORT_BENCH_OPENBLAS, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(blas_error, sizeof blas_error, "cannot load %s: %s", FLASHPORT_BENCH_OPENBLAS,
                 dlerror());
        return blas_error;
    }
    /* POSIX: a function pointer travels through void * (dlsym's own convention). */
    *(void **)&blas.sgemm = dlsym(lib, "cblas_sgemm");
    *(void **)&blas.set_num_threads = dlsym(lib, "openblas_set_num_threads");
    *(void **)&blas.get_config = dlsym(lib, "openblas_get_config");
    if (!blas.sgemm || !blas.set_num_threads || !blas.get_config) {
        blas.sgemm = NULL;
        snprintf(blas_error, sizeof blas_error, "%s lacks cblas_sgemm or the openblas_* calls",
                 FLASHPORT_BENCH_OPENBLAS);
        return blas_error;
    }
    return NULL;
}

static int blas_threads = 1;
static const char *blas_mode = "";

const char *bench_blas_name(void)
{
    static char name[160];
    snprintf(name, sizeof name, "%s, %d thread%s, %s", blas.get_config(), blas_threads,
             blas_threads == 1 ? "" : "s", blas_mode);
    return name;
}

/* row[lo, hi) = exp(row - max) / sum; the rest of the row 0. */
BLAS_CLONES static void softmax_row(float *restrict row, int64_t nk, int64_t lo, int64_t hi)
{
    float mx = row[lo];
    for (int64_t j = lo + 1; j < hi; j++)
        mx = row[j] > mx ? row[j] : mx;
    float sum = 0.0f;
    for (int64_t j = lo; j < hi; j++) {
        row[j] = expf(row[j] - mx);
        sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = lo; j < hi; j++)
        row[j] *= inv;
    memset(row, 0, sizeof(float) * (size_t)lo);
    memset(row + hi, 0, sizeof(float) * (size_t)(nk - hi));
}

/* One (b, h): S = scale Q K^T, the row softmax, O = P V; s holds Nq x Nk floats. */
static void one_head(const bench_blas_problem *p, int64_t b, int64_t h, float *s, int threads)
{
    const int64_t group = p->h / p->hkv;
    const int lq = (int)(p->h * p->d), lk = (int)(p->hkv * p->d);
    const float *q = p->q + (b * p->nq * p->h + h) * p->d;
    const float *k = p->k + (b * p->nk * p->hkv + h / group) * p->d;
    const float *v = p->v + (b * p->nk * p->hkv + h / group) * p->d;
    float *o = p->o + (b * p->nq * p->h + h) * p->d;
    blas.sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)p->nq, (int)p->nk, (int)p->d, p->scale,
               q, lq, k, lk, 0.0f, s, (int)p->nk);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#endif
    for (int64_t i = 0; i < p->nq; i++) {
        const int64_t diag = i + p->nk - p->nq;
        int64_t lo = p->left < 0 ? 0 : diag - p->left;
        int64_t hi = p->right < 0 ? p->nk : diag + p->right + 1;
        lo = lo < 0 ? 0 : lo;
        hi = hi > p->nk ? p->nk : hi;
        float *row = s + i * p->nk;
        if (hi <= lo)
            memset(row, 0, sizeof(float) * (size_t)p->nk); /* sees nothing: O = 0 */
        else
            softmax_row(row, p->nk, lo, hi);
    }
    blas.sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)p->nq, (int)p->d, (int)p->nk, 1.0f,
               s, (int)p->nk, v, lk, 0.0f, o, lq);
}

void bench_blas_forward(const bench_blas_problem *p, float *s, int threads)
{
    const int64_t heads = p->b * p->h;
    const size_t per_head = (size_t)(p->nq * p->nk);
    if (heads >= threads) {
        /* One (b, h) per thread, each on a single-threaded BLAS: no thread pool of the BLAS
         * spinning next to the softmax's threads (on two cores that halves the softmax). */
        blas_mode = "one (batch, head) per thread";
        blas.set_num_threads(1);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < heads; t++) {
            int me = 0;
#ifdef _OPENMP
            me = omp_get_thread_num();
#endif
            one_head(p, t / p->h, t % p->h, s + per_head * (size_t)me, 1);
        }
        return;
    }
    blas_mode = "heads in turn, threaded BLAS";
    blas.set_num_threads(threads);
    for (int64_t t = 0; t < heads; t++)
        one_head(p, t / p->h, t % p->h, s, threads);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_blas_time(const bench_blas_problem *p, float *s, int threads, int warmup, int iters,
                     double *median, double *min)
{
    blas_threads = threads;
    for (int i = 0; i < warmup; i++)
        bench_blas_forward(p, s, threads);
    double *ms = malloc(sizeof(double) * (size_t)(iters > 0 ? iters : 1));
    if (!ms) {
        *median = *min = NAN;
        return;
    }
    for (int i = 0; i < iters; i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        bench_blas_forward(p, s, threads);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ms[i] = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    }
    qsort(ms, (size_t)iters, sizeof(double), cmp_double);
    *median = iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
    *min = ms[0];
    free(ms);
}

#else

const char *bench_blas_missing(void)
{
    return "flashport-bench was built without a BLAS (CMake did not find OpenBLAS through "
           "pkg-config; apt-get install libopenblas-dev and reconfigure)";
}

const char *bench_blas_name(void)
{
    return "none";
}

void bench_blas_forward(const bench_blas_problem *p, float *s, int threads)
{
    (void)p;
    (void)s;
    (void)threads;
}

void bench_blas_time(const bench_blas_problem *p, float *s, int threads, int warmup, int iters,
                     double *median, double *min)
{
    (void)p;
    (void)s;
    (void)threads;
    (void)warmup;
    (void)iters;
    *median = *min = NAN;
}

#endif
