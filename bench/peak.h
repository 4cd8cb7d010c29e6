/*
 * Measured f32 FMA peak and memory read bandwidth of the host CPU, for the bench's pct_peak and
 * pct_mem columns on host backends. See peak.c for the method.
 */
#ifndef FLASHPORT_BENCH_PEAK_H
#define FLASHPORT_BENCH_PEAK_H

typedef struct bench_peak {
    double gflops;   /* best of a few timed runs, all threads together */
    int threads;     /* threads that ran the loop */
    const char *isa; /* vector unit the loop ran on: "avx512f", "avx2+fma", "generic" */
} bench_peak;

typedef struct bench_bandwidth {
    double gbs;  /* best of a few passes, all threads together, GB/s (1e9 bytes) read */
    int threads; /* threads that read */
} bench_bandwidth;

/* Threads the CPU backend uses: FLASHPORT_NUM_THREADS if set to a positive number, else
 * OpenMP's default (OMP_NUM_THREADS or the CPUs this process may run on); 1 without OpenMP. */
int bench_host_threads(void);

/* on != 0: the FMA loop times each thread by its own CPU time, not wall time (--clock cpu). */
void bench_peak_cpu_clock(int on);

/* Runs the FMA loop on `threads` threads for about `seconds` per timed run. */
bench_peak bench_measure_f32_peak(int threads, double seconds);

/* Reads a buffer much larger than the caches on `threads` threads, STREAM-like. */
bench_bandwidth bench_measure_read_bandwidth(int threads);

/* Copies a buffer much larger than the caches with memcpy on `threads` threads (each its own
 * slice), STREAM's "Copy": gbs counts the bytes read plus the bytes written. */
bench_bandwidth bench_measure_copy_bandwidth(int threads);

#endif /* FLASHPORT_BENCH_PEAK_H */
