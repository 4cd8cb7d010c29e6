/*
 * flashport-decode-ab: A/B timing of the CPU decode forward of two or more builds of the library
 * in one process, so that a shared machine's load and clock drift fall on every build alike.
 *
 *   OMP_WAIT_POLICY=passive flashport-decode-ab [options] OLD/libflashport.so NEW/libflashport.so
 *
 * Each library is opened with dlopen (RTLD_LOCAL: each build's calls stay inside it) and runs the
 * same inputs on its "cpu" backend. Per round: the read bandwidth (bench/peak.c, STREAM-like),
 * then each library in turn (one warm-up call, then --iters calls timed by the process' CPU time
 * divided by the threads, as flashport-bench --clock cpu; the median counts). The output is, per
 * shape and library, the median over the rounds of the K/V read rate and of its percentage of the
 * same round's bandwidth, each round's value, and per library after the first the median over the
 * rounds of its time ratio to the first (above 1: faster). Before timing, every library's O is
 * compared with the reference backend of the first (max abs error printed; a NaN or an error
 * above 0.05 fails the run).
 *
 * Options (lists are comma-separated; every combination runs):
 *   --dtype f32,f16,bf16   --hdim 128   --heads 32   --kv-heads 8   --nq 1   --nk 32768
 *   --batch 1   --paged 0  (0: dense; else the page size, pages shuffled, seqused_k = Nk)
 *   --rounds 5   --iters 10
 * FLASHPORT_CPU_ISA and FLASHPORT_NUM_THREADS apply to every library alike.
 */
#define _POSIX_C_SOURCE 200809L

#include "flashport.h"
#include "peak.h"

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_LIBS = 4, MAX_ROUNDS = 64, MAX_ITERS = 256, MAX_LIST = 8 };

typedef struct ab_lib {
    const char *path;
    flashport_status (*open)(const char *, flashport_backend **);
    void (*params_init)(flashport_attention_params *, size_t);
    flashport_status (*forward)(flashport_backend *, const flashport_attention_params *,
                                const flashport_tensor *, const flashport_tensor *,
                                const flashport_tensor *, const flashport_tensor *,
                                const flashport_tensor *);
    flashport_status (*convert)(void *, flashport_dtype, const void *, flashport_dtype, size_t);
    const char *(*last_error)(void);
    flashport_backend *cpu, *ref;
} ab_lib;

typedef struct ab_list {
    int n;
    long v[MAX_LIST];
} ab_list;

static void die(const char *what, const char *why)
{
    fprintf(stderr, "flashport-decode-ab: %s: %s\n", what, why ? why : "");
    exit(2);
}

static void *sym(void *h, const char *lib, const char *name)
{
    void *f = dlsym(h, name);
    if (!f)
        die(lib, dlerror());
    return f;
}

static void ab_open(ab_lib *l, const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        die(path, dlerror());
    l->path = path;
    *(void **)&l->open = sym(h, path, "flashport_backend_open");
    *(void **)&l->params_init = sym(h, path, "flashport_attention_params_init_sized");
    *(void **)&l->forward = sym(h, path, "flashport_attention_forward");
    *(void **)&l->convert = sym(h, path, "flashport_convert");
    *(void **)&l->last_error = sym(h, path, "flashport_last_error");
    if (l->open("cpu", &l->cpu) != FLASHPORT_OK || l->open("reference", &l->ref) != FLASHPORT_OK)
        die(path, l->last_error());
}

static void parse_list(const char *s, ab_list *out)
{
    out->n = 0;
    for (char *end; *s && out->n < MAX_LIST; s = *end == ',' ? end + 1 : end) {
        out->v[out->n++] = strtol(s, &end, 10);
        if (end == s)
            die("bad list", s);
    }
}

static int parse_dtypes(const char *s, ab_list *out)
{
    out->n = 0;
    for (; *s && out->n < MAX_LIST; s += strcspn(s, ","), s += *s == ',') {
        const size_t len = strcspn(s, ",");
        if (len == 3 && !strncmp(s, "f32", 3))
            out->v[out->n++] = FLASHPORT_F32;
        else if (len == 3 && !strncmp(s, "f16", 3))
            out->v[out->n++] = FLASHPORT_F16;
        else if (len == 4 && !strncmp(s, "bf16", 4))
            out->v[out->n++] = FLASHPORT_BF16;
        else
            die("--dtype", s);
    }
    return out->n;
}

/* This file links no build of the library: the descriptors and names are made here. */
static size_t dtype_size(flashport_dtype dt)
{
    return dt == FLASHPORT_F32 ? 4 : 2;
}

static const char *dtype_name(flashport_dtype dt)
{
    return dt == FLASHPORT_F32 ? "f32" : dt == FLASHPORT_F16 ? "f16" : "bf16";
}

static flashport_tensor tensor(void *data, flashport_dtype dt, int rank, const int64_t *shape)
{
    flashport_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.rank = rank;
    int64_t st = 1;
    for (int i = rank - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = st;
        st *= shape[i];
    }
    return t;
}

static double now_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n)
{
    double t[MAX_ROUNDS > MAX_ITERS ? MAX_ROUNDS : MAX_ITERS];
    memcpy(t, x, sizeof(double) * (size_t)n);
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p)
        die("out of memory", NULL);
    return p;
}

/* Random values in [-1, 1) as dtype (through the first library's flashport_convert). */
static void *random_tensor(const ab_lib *l, flashport_dtype dt, size_t n)
{
    float *f = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = rnd();
    void *x = xalloc(n * dtype_size(dt));
    if (l->convert(x, dt, f, FLASHPORT_F32, n) != FLASHPORT_OK)
        die("flashport_convert", l->last_error());
    free(f);
    return x;
}

typedef struct ab_shape {
    flashport_dtype dtype;
    int64_t d, nq, page, heads, kv_heads, nk, batch; /* page 0: dense */
} ab_shape;

/* One shape: inputs, the check against the reference, the rounds, the summary lines. */
static void run_shape(const ab_lib *libs, int nlibs, const ab_shape *sh, int rounds, int iters,
                      int threads)
{
    const flashport_dtype dt = sh->dtype;
    const int64_t d = sh->d, nq = sh->nq, ps = sh->page, h = sh->heads, hk = sh->kv_heads,
                  nk = sh->nk, b = sh->batch;
    const size_t es = dtype_size(dt);
    const int64_t qshape[4] = {b, nq, h, d}, lshape[3] = {b, h, nq};
    const int64_t stride = ps ? (nk + ps - 1) / ps : 0, pages = b * stride;
    const int64_t kshape_dense[4] = {b, nk, hk, d}, kshape_paged[4] = {pages, ps, hk, d};
    const size_t kv_elems = ps ? (size_t)(pages * ps * hk * d) : (size_t)(b * nk * hk * d);
    void *q = random_tensor(&libs[0], dt, (size_t)(b * nq * h * d));
    void *k = random_tensor(&libs[0], dt, kv_elems), *v = random_tensor(&libs[0], dt, kv_elems);
    float *lse = xalloc(sizeof(float) * (size_t)(b * h * nq));
    void *o = xalloc(es * (size_t)(b * nq * h * d)), *oref = xalloc(es * (size_t)(b * nq * h * d));
    int32_t *bt = NULL, *used = NULL;
    if (ps) { /* the pages of all sequences in a shuffled order */
        bt = xalloc(sizeof(int32_t) * (size_t)pages);
        used = xalloc(sizeof(int32_t) * (size_t)b);
        for (int64_t i = 0; i < pages; i++)
            bt[i] = (int32_t)i;
        for (int64_t i = pages - 1; i > 0; i--) {
            rng_state ^= rng_state << 13;
            rng_state ^= rng_state >> 7;
            rng_state ^= rng_state << 17;
            const int64_t j = (int64_t)(rng_state % (uint64_t)(i + 1));
            const int32_t x = bt[i];
            bt[i] = bt[j];
            bt[j] = x;
        }
        for (int64_t i = 0; i < b; i++)
            used[i] = (int32_t)nk;
    }
    const flashport_tensor tq = tensor(q, dt, 4, qshape);
    const flashport_tensor to = tensor(o, dt, 4, qshape);
    const flashport_tensor tor = tensor(oref, dt, 4, qshape);
    const flashport_tensor tl = tensor(lse, FLASHPORT_F32, 3, lshape);
    const flashport_tensor tk = tensor(k, dt, 4, ps ? kshape_paged : kshape_dense);
    const flashport_tensor tv = tensor(v, dt, 4, ps ? kshape_paged : kshape_dense);

    flashport_attention_params prm[MAX_LIBS];
    for (int l = 0; l < nlibs; l++) {
        libs[l].params_init(&prm[l], sizeof prm[l]);
        prm[l].seqused_k = used;
        prm[l].block_table = bt;
        prm[l].block_table_stride = (int32_t)stride;
    }
    printf("\n# %s D=%lld B=%lld H=%lld Hkv=%lld Nq=%lld Nk=%lld %s (page size %lld)\n",
           dtype_name(dt), (long long)d, (long long)b, (long long)h, (long long)hk, (long long)nq,
           (long long)nk, ps ? "paged" : "dense", (long long)ps);
    if (libs[0].forward(libs[0].ref, &prm[0], &tq, &tk, &tv, &tor, &tl) != FLASHPORT_OK)
        die("reference forward", libs[0].last_error());
    const size_t on = (size_t)(b * nq * h * d);
    float *fo = xalloc(sizeof(float) * on), *fr = xalloc(sizeof(float) * on);
    libs[0].convert(fr, FLASHPORT_F32, oref, dt, on);
    for (int l = 0; l < nlibs; l++) {
        if (libs[l].forward(libs[l].cpu, &prm[l], &tq, &tk, &tv, &to, &tl) != FLASHPORT_OK)
            die("cpu forward", libs[l].last_error());
        libs[0].convert(fo, FLASHPORT_F32, o, dt, on);
        double err = 0.0;
        for (size_t i = 0; i < on; i++) {
            const double e = fabs((double)fo[i] - (double)fr[i]);
            err = e > err || e != e ? e : err;
        }
        printf("# lib %d: max abs error against the reference %.3g\n", l, err);
        if (!(err <= 0.05))
            die("check", "error above 0.05");
    }
    free(fo);
    free(fr);

    const double kv_bytes = 2.0 * (double)(b * nk * hk * d) * (double)es;
    double gbs[MAX_LIBS][MAX_ROUNDS], pct[MAX_LIBS][MAX_ROUNDS], ms[MAX_LIBS][MAX_ROUNDS],
        bw[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        bw[r] = bench_measure_read_bandwidth(threads).gbs;
        for (int l = 0; l < nlibs; l++) {
            double t[MAX_ITERS];
            libs[l].forward(libs[l].cpu, &prm[l], &tq, &tk, &tv, &to, &tl);
            for (int it = 0; it < iters; it++) {
                const double t0 = now_cpu();
                libs[l].forward(libs[l].cpu, &prm[l], &tq, &tk, &tv, &to, &tl);
                t[it] = (now_cpu() - t0) / threads;
            }
            ms[l][r] = 1e3 * median(t, iters);
            gbs[l][r] = kv_bytes / (ms[l][r] * 1e-3) * 1e-9;
            pct[l][r] = 100.0 * gbs[l][r] / bw[r];
        }
    }
    printf("# read bandwidth GB/s: median %.1f (", median(bw, rounds));
    for (int r = 0; r < rounds; r++)
        printf("%s%.1f", r ? " " : "", bw[r]);
    printf(")\n");
    for (int l = 0; l < nlibs; l++) {
        printf("lib %d  %5.1f GB/s  %3.0f%% of read  (", l, median(gbs[l], rounds),
               median(pct[l], rounds));
        for (int r = 0; r < rounds; r++)
            printf("%s%.0f", r ? " " : "", pct[l][r]);
        printf(")");
        if (l > 0) {
            double ratio[MAX_ROUNDS];
            for (int r = 0; r < rounds; r++)
                ratio[r] = ms[0][r] / ms[l][r];
            printf("  lib %d / lib 0 speed %.2fx (", l, median(ratio, rounds));
            for (int r = 0; r < rounds; r++)
                printf("%s%.2f", r ? " " : "", ratio[r]);
            printf(")");
        }
        printf("\n");
    }
    fflush(stdout);
    free(q);
    free(k);
    free(v);
    free(o);
    free(oref);
    free(lse);
    free(bt);
    free(used);
}

int main(int argc, char **argv)
{
    ab_list dtypes, hdims, nqs, pageds, heads, kvh, nks, batch;
    parse_dtypes("f32,f16,bf16", &dtypes);
    parse_list("128", &hdims);
    parse_list("1", &nqs);
    parse_list("0", &pageds);
    parse_list("32", &heads);
    parse_list("8", &kvh);
    parse_list("32768", &nks);
    parse_list("1", &batch);
    int rounds = 5, iters = 10, nlibs = 0;
    ab_lib libs[MAX_LIBS];
    const char *paths[MAX_LIBS];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') {
            if (nlibs == MAX_LIBS)
                die("too many libraries", a);
            paths[nlibs++] = a;
            continue;
        }
        if (!v)
            die(a, "needs a value");
        i++;
        const struct {
            const char *name;
            ab_list *list;
        } lists[] = {{"--hdim", &hdims},  {"--nq", &nqs},       {"--paged", &pageds},
                     {"--heads", &heads}, {"--kv-heads", &kvh}, {"--nk", &nks},
                     {"--batch", &batch}};
        int found = 0;
        for (size_t j = 0; j < sizeof lists / sizeof lists[0] && !found; j++)
            if (!strcmp(a, lists[j].name)) {
                parse_list(v, lists[j].list);
                found = 1;
            }
        if (found)
            continue;
        if (!strcmp(a, "--dtype"))
            parse_dtypes(v, &dtypes);
        else if (!strcmp(a, "--rounds"))
            rounds = atoi(v);
        else if (!strcmp(a, "--iters"))
            iters = atoi(v);
        else
            die("unknown option", a);
    }
    if (nlibs < 1 || rounds < 1 || rounds > MAX_ROUNDS || iters < 1 || iters > MAX_ITERS)
        die("usage", "flashport-decode-ab [options] LIB.so [LIB.so ...] (see the file's header)");
    for (int l = 0; l < nlibs; l++)
        ab_open(&libs[l], paths[l]);
    const int threads = bench_host_threads();
    bench_peak_cpu_clock(1); /* the bandwidth on the clock the calls are timed by */
    printf("# flashport-decode-ab: %d threads, %d rounds of %d calls per library, CPU clock;"
           " FLASHPORT_CPU_ISA=%s\n",
           threads, rounds, iters, getenv("FLASHPORT_CPU_ISA") ? getenv("FLASHPORT_CPU_ISA") : "");
    for (int l = 0; l < nlibs; l++)
        printf("# lib %d: %s\n", l, paths[l]);

    for (int i0 = 0; i0 < dtypes.n; i0++)
        for (int i1 = 0; i1 < hdims.n; i1++)
            for (int i2 = 0; i2 < nqs.n; i2++)
                for (int i3 = 0; i3 < pageds.n; i3++)
                    for (int i4 = 0; i4 < heads.n; i4++)
                        for (int i5 = 0; i5 < kvh.n; i5++)
                            for (int i6 = 0; i6 < nks.n; i6++)
                                for (int i7 = 0; i7 < batch.n; i7++) {
                                    const ab_shape sh = {(flashport_dtype)dtypes.v[i0],
                                                         hdims.v[i1],
                                                         nqs.v[i2],
                                                         pageds.v[i3],
                                                         heads.v[i4],
                                                         kvh.v[i5],
                                                         nks.v[i6],
                                                         batch.v[i7]};
                                    run_shape(libs, nlibs, &sh, rounds, iters, threads);
                                }
    return 0;
}
