/*
 * The f32 FMA throughput and the memory read bandwidth of this CPU, measured on the spot: the
 * development machine is shared and its clock varies, so a data-sheet number would not describe
 * the run the bench reports.
 *
 * FMA method: every thread runs acc = acc * m + a over CHAINS independent accumulators of 16
 * floats. Enough independent chains hide the FMA latency (4 cycles x 2 ports needs at least 8
 * vector accumulators in flight), and 16 floats fill one AVX-512 register, two AVX2 or four NEON
 * ones. This file is compiled with -O3 -ffp-contract=fast (bench/CMakeLists.txt) so that the
 * compiler vectorizes the lanes and fuses the multiply-add, which strict C11 mode would not do.
 * With GCC or Clang on x86 the same loop is also compiled for AVX-512 and for AVX2+FMA; the loop
 * that runs is the vector unit of the micro-kernel table the CPU backend runs (FLASHPORT_CPU_ISA
 * as backends/cpu/isa.c reads it: avx2 gets the 256-bit loop even on an AVX-512 CPU, so the
 * percentages of an AVX2 run are of the AVX2 peak), else the best the CPU supports; elsewhere the
 * plain build runs (NEON FMA on AArch64, SSE2 mul + add on baseline x86). Each element update
 * counts 2 FLOPs. m < 1 keeps the values bounded (they converge to a / (1 - m)), so no denormal
 * or infinity slows the loop. A warm-up run of PEAK_WARM_SECONDS first brings the vector unit to
 * its steady clock, calibration sizes one run to the requested seconds, and the result is the
 * best of PEAK_REPS timed runs: on a shared machine a neighbour only ever makes a run slower.
 *
 * Bandwidth method (STREAM-like, read only, the access of a decode step over its K/V cache):
 * every thread sums its own slice of a buffer of BW_BYTES (several times any L3 of the machines
 * we use) with 16 independent lanes, so the loop is vectorized without reassociation; pages are
 * touched first, one untimed pass warms the same way, and the best of PEAK_REPS passes counts.
 *
 * Copy method (STREAM's "Copy", for comparison with GPU device copies): each thread memcpy's its
 * slice of a BW_BYTES buffer into another; the rate counts the bytes read plus the bytes
 * written, as STREAM does. Best of PEAK_REPS after one untimed pass.
 *
 * Threads: as many as the CPU backend uses (bench_host_threads), through OpenMP, released
 * together; each times its own loop and the rates are summed (see peak_run).
 *
 * Measured numbers live in docs/bench/cpu.md and docs/performance-cpu.md.
 */
#define _POSIX_C_SOURCE 200809L

#include "peak.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PEAK_LANES      16
#define PEAK_MAX_CHAINS 12
/* Per-thread accumulator block; a multiple of 64 bytes, so threads never share a cache line. */
#define PEAK_BLOCK        (PEAK_MAX_CHAINS * PEAK_LANES)
#define PEAK_M            0.9999999f
#define PEAK_A            1e-7f
#define PEAK_REPS         7
#define PEAK_WARM_SECONDS 0.2
#define BW_BYTES          ((size_t)256 << 20)

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define PEAK_X86_DISPATCH 1
#else
#define PEAK_X86_DISPATCH 0
#endif

#if defined(__GNUC__)
#define PEAK_INLINE static inline __attribute__((always_inline))
#else
#define PEAK_INLINE static inline
#endif

/* Defines name(acc, iters, m, a): `chains` x 16 accumulators updated `iters` times. acc carries
 * chains * 16 floats in and out so the compiler cannot drop the work. The unroll pragmas let
 * Clang keep the accumulators in registers (without them it keeps the array in memory); GCC
 * does so either way. */
#define PEAK_DEFINE_LOOP(name, chains)                                                             \
    PEAK_INLINE void name(float *restrict acc, long iters, float m, float a)                       \
    {                                                                                              \
        float c[chains][PEAK_LANES];                                                               \
        for (int i = 0; i < (chains); i++)                                                         \
            for (int l = 0; l < PEAK_LANES; l++)                                                   \
                c[i][l] = acc[i * PEAK_LANES + l];                                                 \
        for (long it = 0; it < iters; it++) {                                                      \
            _Pragma("GCC unroll 16") for (int i = 0; i < (chains); i++)                            \
            {                                                                                      \
                _Pragma("GCC unroll 16") for (int l = 0; l < PEAK_LANES; l++)                      \
                {                                                                                  \
                    c[i][l] = c[i][l] * m + a;                                                     \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int i = 0; i < (chains); i++)                                                         \
            for (int l = 0; l < PEAK_LANES; l++)                                                   \
                acc[i * PEAK_LANES + l] = c[i][l];                                                 \
    }

/* Chains chosen so that the accumulators fit the register file next to the two constants. */
#if defined(__aarch64__)
#define PEAK_PLAIN_CHAINS 6 /* 24 of 32 NEON registers */
#else
#define PEAK_PLAIN_CHAINS 3 /* 12 of 16 SSE registers */
#endif

typedef void (*peak_loop_fn)(float *restrict acc, long iters, float m, float a);

typedef struct peak_kernel {
    peak_loop_fn fn;
    int chains;
    const char *isa;
} peak_kernel;

PEAK_DEFINE_LOOP(peak_loop_plain, PEAK_PLAIN_CHAINS)

static void peak_fma_plain(float *restrict acc, long iters, float m, float a)
{
    peak_loop_plain(acc, iters, m, a);
}

#if PEAK_X86_DISPATCH
PEAK_DEFINE_LOOP(peak_loop_12, 12) /* 12 of 32 zmm registers */
PEAK_DEFINE_LOOP(peak_loop_6, 6)   /* 12 of 16 ymm registers */

__attribute__((target("avx512f"))) static void peak_fma_avx512(float *restrict acc, long iters,
                                                               float m, float a)
{
    peak_loop_12(acc, iters, m, a);
}

__attribute__((target("avx2,fma"))) static void peak_fma_avx2(float *restrict acc, long iters,
                                                              float m, float a)
{
    peak_loop_6(acc, iters, m, a);
}
#endif

/* The loop for the vector unit the CPU backend's micro-kernels use: FLASHPORT_CPU_ISA's table
 * where it names an x86 one this CPU runs, else the best the CPU supports. */
static peak_kernel peak_pick_kernel(void)
{
#if PEAK_X86_DISPATCH
    const peak_kernel avx512 = {peak_fma_avx512, 12, "avx512f"};
    const peak_kernel avx2 = {peak_fma_avx2, 6, "avx2+fma"};
    const int has512 = __builtin_cpu_supports("avx512f");
    const int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char *isa = getenv("FLASHPORT_CPU_ISA");
    if (isa && strcmp(isa, "avx2") == 0 && has2)
        return avx2;
    if (isa && strcmp(isa, "scalar") == 0)
        return (peak_kernel){peak_fma_plain, PEAK_PLAIN_CHAINS, "generic"};
    if (has512)
        return avx512;
    if (has2)
        return avx2;
#endif
    return (peak_kernel){peak_fma_plain, PEAK_PLAIN_CHAINS, "generic"};
}

static int peak_cpu_clock;

void bench_peak_cpu_clock(int on)
{
    peak_cpu_clock = on;
}

/* Seconds on the clock each thread times itself with: monotonic wall time, or (after
 * bench_peak_cpu_clock(1)) the calling thread's CPU time. */
static double peak_now(void)
{
    struct timespec ts;
    clock_gettime(peak_cpu_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int bench_host_threads(void)
{
    const char *env = getenv("FLASHPORT_NUM_THREADS");
    if (env && *env) {
        char *end = NULL;
        long n = strtol(env, &end, 10);
        if (*end == '\0' && n > 0 && n < 4096)
            return (int)n;
    }
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Runs `iters` iterations on every thread, all released together. Each thread times itself,
 * so that one the OS starts late (the machine is shared) does not stretch the others' time.
 * Returns the sum over threads of their iterations per second; *slowest gets the longest
 * thread time, *ran the number of threads. accs: (threads, PEAK_BLOCK) */
static double peak_run(peak_kernel k, int threads, long iters, float *accs, int *ran,
                       double *slowest)
{
    double rate = 0.0, worst = 0.0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : rate) reduction(max : worst)
    {
        float *acc = accs + (size_t)omp_get_thread_num() * PEAK_BLOCK;
#pragma omp single
        *ran = omp_get_num_threads();
        double t0 = peak_now();
        k.fn(acc, iters, PEAK_M, PEAK_A);
        double t = peak_now() - t0;
        rate += (double)iters / t;
        worst = t > worst ? t : worst;
    }
#else
    (void)threads;
    *ran = 1;
    double t0 = peak_now();
    k.fn(accs, iters, PEAK_M, PEAK_A);
    worst = peak_now() - t0;
    rate = (double)iters / worst;
#endif
    *slowest = worst;
    return rate;
}

bench_peak bench_measure_f32_peak(int threads, double seconds)
{
    peak_kernel k = peak_pick_kernel();
    bench_peak result = {0.0, threads, k.isa};
    float *accs = malloc((size_t)threads * PEAK_BLOCK * sizeof(float));
    if (!accs)
        return result;
    for (size_t i = 0; i < (size_t)threads * PEAK_BLOCK; i++)
        accs[i] = 1.0f;

    int ran = 1;
    long iters = 1L << 12;
    double t = 0.0, warm = 0.0;
    /* Warm-up and calibration in one: doubling runs until one lasts seconds / 8, and at least
     * PEAK_WARM_SECONDS of them in all. */
    peak_run(k, threads, iters, accs, &ran, &t);
    warm += t;
    while ((t < seconds / 8 || warm < PEAK_WARM_SECONDS) && iters < (1L << 40)) {
        if (t < seconds / 8)
            iters *= 2;
        peak_run(k, threads, iters, accs, &ran, &t);
        warm += t;
    }
    iters = (long)((double)iters * seconds / t) + 1;

    double flops_per_iter = (double)k.chains * PEAK_LANES * 2.0;
    for (int rep = 0; rep < PEAK_REPS; rep++) {
        double gflops = peak_run(k, threads, iters, accs, &ran, &t) * flops_per_iter * 1e-9;
        if (gflops > result.gflops)
            result.gflops = gflops;
        result.threads = ran;
    }
    free(accs);
    return result;
}

/* Sum of n floats in PEAK_LANES independent lanes (vectorized without reassociation). */
static float bw_sum(const float *restrict x, size_t n)
{
    float lane[PEAK_LANES] = {0};
    for (size_t i = 0; i + PEAK_LANES <= n; i += PEAK_LANES)
        for (int l = 0; l < PEAK_LANES; l++)
            lane[l] += x[i + l];
    float s = 0.0f;
    for (int l = 0; l < PEAK_LANES; l++)
        s += lane[l];
    return s;
}

/* One pass: each thread reads its slice; returns bytes per second summed over threads. */
static double bw_run(const float *buf, size_t per_thread, int threads, int *ran, float *sink)
{
    double rate = 0.0;
    float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : rate, total)
    {
        const float *mine = buf + per_thread * (size_t)omp_get_thread_num();
#pragma omp single
        *ran = omp_get_num_threads();
        double t0 = peak_now();
        total += bw_sum(mine, per_thread);
        rate += (double)per_thread * sizeof(float) / (peak_now() - t0);
    }
#else
    (void)threads;
    *ran = 1;
    double t0 = peak_now();
    total = bw_sum(buf, per_thread);
    rate = (double)per_thread * sizeof(float) / (peak_now() - t0);
#endif
    *sink += total;
    return rate;
}

static double copy_run(const char *src, char *dst, size_t per_thread, int threads, int *ran)
{
    double rate = 0.0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : rate)
    {
        const size_t me = (size_t)omp_get_thread_num();
#pragma omp single
        *ran = omp_get_num_threads();
        double t0 = peak_now();
        memcpy(dst + per_thread * me, src + per_thread * me, per_thread);
        rate += 2.0 * (double)per_thread / (peak_now() - t0);
    }
#else
    (void)threads;
    *ran = 1;
    double t0 = peak_now();
    memcpy(dst, src, per_thread);
    rate = 2.0 * (double)per_thread / (peak_now() - t0);
#endif
    return rate;
}

bench_bandwidth bench_measure_copy_bandwidth(int threads)
{
    bench_bandwidth result = {0.0, threads};
    const size_t per_thread = BW_BYTES / (size_t)threads / 64 * 64;
    char *src = malloc(per_thread * (size_t)threads), *dst = malloc(per_thread * (size_t)threads);
    if (!src || !dst) {
        free(src);
        free(dst);
        return result;
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (long t = 0; t < threads; t++) { /* first touch by the thread that copies the slice */
        memset(src + (size_t)t * per_thread, 1, per_thread);
        memset(dst + (size_t)t * per_thread, 0, per_thread);
    }
    int ran = 1;
    copy_run(src, dst, per_thread, threads, &ran);
    for (int rep = 0; rep < PEAK_REPS; rep++) {
        const double gbs = copy_run(src, dst, per_thread, threads, &ran) * 1e-9;
        if (gbs > result.gbs)
            result.gbs = gbs;
        result.threads = ran;
    }
    free(src);
    free(dst);
    return result;
}

bench_bandwidth bench_measure_read_bandwidth(int threads)
{
    bench_bandwidth result = {0.0, threads};
    const size_t per_thread = BW_BYTES / sizeof(float) / (size_t)threads / PEAK_LANES * PEAK_LANES;
    float *buf = malloc(per_thread * (size_t)threads * sizeof(float));
    if (!buf)
        return result;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    /* Each slice is touched by the thread that will read it (first-touch placement on NUMA
     * machines). */
    for (long t = 0; t < threads; t++)
        for (size_t i = 0; i < per_thread; i++)
            buf[(size_t)t * per_thread + i] = 1e-3f * (float)(i & 1023);
    int ran = 1;
    float sink = 0.0f;
    bw_run(buf, per_thread, threads, &ran, &sink);
    for (int rep = 0; rep < PEAK_REPS; rep++) {
        const double gbs = bw_run(buf, per_thread, threads, &ran, &sink) * 1e-9;
        if (gbs > result.gbs)
            result.gbs = gbs;
        result.threads = ran;
    }
    /* The sums are finite by construction; testing them keeps the reads from being dropped. */
    if (sink != sink)
        result.gbs = 0.0;
    free(buf);
    return result;
}
