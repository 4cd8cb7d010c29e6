/*
 * flashport-bench: times flashport_attention_forward / _backward on any backend, through the
 * public API only (include/flashport.h), after checking the results against the "reference"
 * backend. Run `flashport-bench --help` for the options. Examples:
 *
 *   flashport-bench --backend cpu --heads 8 --seqlen 2048 --hdim 128 --direction both --check
 *   flashport-bench --backend cpu --sweep --check --csv cpu.csv
 *
 * Per shape: q, k, v and dO live in flashport_malloc memory, filled from a fixed seed with
 * uniform values in [-1, 1) rounded to the dtype on the host (tensors of more than 2^24
 * elements repeat their first 2^24: BENCH_FILL_PERIOD); every output is first filled with
 * NaN so that an element a backend forgets to write fails the check instead of passing on stale
 * memory. The forward runs once (and is checked), then --warmup untimed runs and --iters timed
 * runs, each bracketed by flashport_timer_start/stop (CUDA/HIP events on the backend's stream;
 * host backends: the host's monotonic clock after synchronizing); the median is reported. The
 * backward is timed alone (without the forward), from that forward's O and LSE.
 *
 * FLOPs, FlashAttention convention: forward = 4 * B * H * D * pairs, backward = 2.5 x forward,
 * where pairs counts the (query, key) dot products:
 *   no mask                          Nq * Nk
 *   causal (window -1,0)             Nq * Nk / 2 (the convention; exact would be N(N+1)/2)
 *   any other window (left, right)   exact: sum over i of the size of
 *                                    [max(0, i + Nk - Nq - left), min(Nk - 1, i + Nk - Nq + right)]
 * Softcap, ALiBi and the exponentials are not counted.
 *
 * Check (--check): the reference backend (naive, double accumulation) runs on f32 host copies
 * of the same dtype-rounded inputs, so the measured error is the tested backend's alone. When
 * the reference would do more than --check-gflop GFLOP, the check narrows to the last batch, then
 * to the last kv-head group (all its query heads, so dK/dV sums stay complete), then to the last
 * query rows (masks are aligned bottom-right, so the last R rows against all keys are an exact
 * sub-problem). O and LSE are always those of the timed run, and so are dQ, dK, dV when every
 * row is in the subset. When rows were dropped, dK/dV of the full problem cannot be rebuilt from
 * the subset, so the tested backend runs the backward again on the sub-problem (as strided views
 * of its own tensors) and that run's dQ, dK, dV are compared. The scope is printed and written
 * to the CSV. Pass: for each output tensor,
 * max_abs_err <= tol(dtype) * max(1, max |reference|), tol = 1e-4 (f32), 5e-3 (f16), 4e-2 (bf16):
 * a few output roundings for the 16-bit types, loose enough for any correct f32 summation order.
 *
 * fp8 (--dtype fp8_e4m3 / fp8_e5m2; forward only, o in bf16): the f32 inputs of the same seed
 * are quantized per tensor, scale amax / 448 (e4m3) or amax / 57344 (e5m2) passed as descale_q/k/v.
 * --check runs the reference on the dequantized inputs in f32 (the exact attention of what the
 * fp8 kernel is given, P unrounded) and passes when O is within 0.125 x max(1, max |ref|) (two
 * e4m3 roundings of P, docs/semantics.md) and the LSE within bf16's tolerance. It also reports
 * the relative L2 error of O beside that of the tested backend's bf16 forward on the same
 * dequantized inputs rounded to bf16, against the same reference (o_rel_l2, o_rel_l2_bf16 in the
 * CSV and JSON; the fp8 issue's accuracy target compares the two).
 *
 * Baseline (--baseline blas, f32 forward): the same inputs through sgemm + softmax + sgemm
 * (bench/baseline_blas.c), as a "blas" row after the backend's, with the backend's speedup over it;
 * its O must agree with the backend's (f32 tolerance) or the run fails.
 *
 * Peak (pct_peak): on host backends ("cpu", "reference"), the f32 FMA throughput measured on the
 * spot by peak.c with the CPU backend's thread count, also for f16/bf16 inputs (the CPU targets
 * compare those with f32). GPU backends take --peak-tflops; without it pct_peak is left empty.
 * --peak-gflops pins the host peak (a figure measured once on a quiet machine, so that runs on a
 * busy one compare against the same number).
 *
 * Memory (kv_gbs, mem_gbs, pct_mem; forward rows): the bytes of K and V the problem holds, read
 * once, per second of the median run, against the read bandwidth peak.c measures on host
 * backends when a shape has at most 16 query rows (decode, where the K/V read is the bound), or
 * the figure given with --mem-gbs. Empty otherwise.
 *
 * Clock (--clock cpu, host backends): each call timed by the process' CPU time divided by the
 * thread count, and the peak loop by each thread's CPU time, instead of wall time: on a machine
 * whose cores other processes share, the cycles our threads ran, not the time a user waits. Run
 * with OMP_WAIT_POLICY=passive, or idle OpenMP threads spinning at barriers count as work.
 */
#define _GNU_SOURCE /* getopt_long */

#include "flashport.h"

#include "baseline_blas.h"
#include "bench_dtype.h"
#include "peak.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_MAX_LIST     32
#define BENCH_PEAK_SECONDS 0.25
/* The sweep: ANCHORS.md's GPU grid (B * N = 16384 tokens, H * D = 2048) shrunk 4x on both
 * products and capped at N = 4096, so that the 24 shapes run in minutes on two cores. */
#define BENCH_SWEEP_TOKENS 4096
#define BENCH_SWEEP_HD     512

typedef struct bench_list {
    int64_t v[BENCH_MAX_LIST];
    int n;
} bench_list;

typedef struct bench_options {
    const char *backend; /* NULL: FLASHPORT_BACKEND, else auto */
    bench_list dtype, batch, heads, kv_heads, seqlen, seqlen_q, seqlen_k, hdim, causal;
    int window_left, window_right;
    float softcap;
    int fwd, bwd;
    int iters, warmup;
    int check;
    double check_gflop;
    const char *csv;
    const char *json; /* --json: every row as one JSON array (the file is rewritten) */
    int sweep;
    int baseline_blas;  /* --baseline blas */
    int clock_cpu;      /* --clock cpu */
    double peak_tflops; /* 0: measure on host backends, unknown on others */
    double mem_gbs;     /* 0: measure on host backends for decode shapes */
    uint64_t seed;
    int decode;        /* --decode */
    int64_t page_size; /* --paged PAGE_SIZE; 0: dense K/V */
} bench_options;

typedef struct bench_shape {
    flashport_dtype dtype;
    int64_t b, h, hkv, nq, nk, d;
    int causal;
} bench_shape;

typedef struct bench_ctx {
    const bench_options *opt;
    flashport_backend *be;
    flashport_backend *ref; /* NULL unless --check */
    const char *name;
    const char *variant;
    double peak_tflops; /* NaN when unknown */
    double mem_gbs;     /* NaN when unknown */
    double copy_gbs;    /* memcpy bandwidth (read + write bytes), NaN when unknown */
    FILE *csv;
    FILE *json;
    int json_rows;
    int failures;
} bench_ctx;

/* Device tensors of one shape (all contiguous) and the host copies of the inputs. */
typedef struct bench_tensors {
    void *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    void *hq, *hk, *hv, *hdout;
    flashport_tensor tq, tk, tv, to, tlse, tdout, tdq, tdk, tdv;
    float descale[3]; /* fp8: the per-tensor dequantization factors of q, k, v; else 1 */
    /* --paged: tk and tv are [pages, page_size, Hkv, D] caches in pk, pv; bt the [B, stride] block
     * table of shuffled pages; used = Nk per sequence (seqused_k). NULL otherwise. */
    void *pk, *pv, *bt, *used;
    int32_t bt_stride;
} bench_tensors;

static int bench_is_fp8(flashport_dtype dtype)
{
    return dtype == FLASHPORT_FP8_E4M3 || dtype == FLASHPORT_FP8_E5M2;
}

/* The dtype of o (and dO and the gradients): the input dtype, bf16 for fp8 inputs. */
static flashport_dtype bench_out_dtype(flashport_dtype dtype)
{
    return bench_is_fp8(dtype) ? FLASHPORT_BF16 : dtype;
}

/* The part of a shape the reference recomputes: the last nb batches, the last ng kv heads with
 * their ng * G query heads, the last rows query rows, all keys. */
typedef struct bench_subset {
    int64_t nb, ng, g, rows;
    char scope[96];
} bench_subset;

/* Reference results on the subset, kept from the forward check for the backward check.
 * q, o: (nb, rows, ng * G, D); k, v: (nb, Nk, ng, D); lse: (nb, ng * G, rows); all f32. */
typedef struct bench_refdata {
    bench_subset sub;
    float *q, *k, *v, *o, *lse;
} bench_refdata;

typedef struct bench_row {
    const char *direction;
    double ms_median, ms_min, tflops, pct_peak, max_abs_err;
    double rel_l2, rel_l2_bf16; /* fp8 forward with --check: O's errors (see top); else NaN */
    double kv_gbs;              /* K/V bytes per second (forward), NaN otherwise */
    const char *check;          /* "ok", "FAIL" or "off" */
    const char *scope;
} bench_row;

/* ---------------------------------------------------------------------------------------------
 * Failure handling: the bench is a program, so a failed library call ends it with the library's
 * own message.
 * ------------------------------------------------------------------------------------------- */
static void bench_ok(flashport_status status, const char *what)
{
    if (status == FLASHPORT_OK)
        return;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", flashport_last_error());
    fprintf(stderr, "flashport-bench: %s failed: %s: %s\n", what, flashport_status_string(status),
            msg);
    exit(1);
}

static void *bench_host_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "flashport-bench: out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* The library exposes no kernel-variant string yet; when it does, only this function changes. */
static const char *bench_variant(const flashport_backend *be)
{
    (void)be;
    return "default";
}

/* ---------------------------------------------------------------------------------------------
 * Command line.
 * ------------------------------------------------------------------------------------------- */
static void bench_usage(FILE *f)
{
    fprintf(
        f,
        "usage: flashport-bench [options]\n"
        "Times flashport attention forward/backward through the public API.\n"
        "LIST is one value or several separated by commas; every combination runs.\n"
        "Long options may be abbreviated (--dir both); values follow a space or '='.\n"
        "\n"
        "  -b, --backend NAME     cpu, reference, cuda, hip, opencl or auto\n"
        "                         (default: $FLASHPORT_BACKEND, else auto)\n"
        "  -t, --dtype LIST       f32, f16, bf16, fp8_e4m3, fp8_e5m2 (default f32); fp8: forward\n"
        "                         only, inputs quantized per tensor (amax / max finite), o in\n"
        "                         bf16\n"
        "  -B, --batch LIST       B (default 1; with --sweep: %d / seqlen)\n"
        "  -H, --heads LIST       H (default 8; with --sweep: %d / hdim)\n"
        "  -K, --kv-heads LIST    Hkv (default: H)\n"
        "  -s, --seqlen LIST      Nq = Nk (default 1024)\n"
        "      --seqlen-q LIST    Nq } given either, every (Nq, Nk) pair of the two lists runs;\n"
        "      --seqlen-k LIST    Nk } the one not given defaults to --seqlen\n"
        "  -d, --hdim LIST        D (default 128)\n"
        "  -c, --causal[=LIST]    causal mask; --causal=0,1 (or -c0,1) runs both\n"
        "  -w, --window L,R       sliding window, keys left/right of the diagonal (-1 = "
        "unbounded)\n"
        "      --softcap C        S = C * tanh(S / C) (default 0 = off)\n"
        "  -D, --direction DIR    fwd, bwd or both (default fwd)\n"
        "  -i, --iters N          timed runs per shape and direction; the median is reported\n"
        "                         (default 5)\n"
        "  -W, --warmup N         untimed runs before them (default 1)\n"
        "  -C, --check            compare with the reference backend before timing; exit 1 if an\n"
        "                         error exceeds the dtype's tolerance\n"
        "      --check-gflop X    reference work per check before it narrows to fewer batches,\n"
        "                         heads, rows (default 4)\n"
        "  -o, --csv FILE         append one row per shape and direction (header if new or\n"
        "                         empty)\n"
        "  -j, --json FILE        write every row as a JSON array of objects (the CSV's\n"
        "                         columns; the file is rewritten); bench/plot.py reads both\n"
        "  -S, --sweep            the ANCHORS.md grid scaled for a CPU: D 64,128,256 x N "
        "512,1024,\n"
        "                         2048,4096 x causal 0,1 with B*N = %d and H*D = %d, both\n"
        "                         directions; the options above narrow or override it\n"
        "  -p, --peak-tflops X    peak for pct_peak (default: the f32 FMA peak measured here on\n"
        "                         host backends; none on GPU backends)\n"
        "      --peak-gflops X    the same in GFLOP/s (pin the host peak across runs)\n"
        "      --clock C          wall (default) or cpu: host backends timed by CPU time /\n"
        "                         threads (shared machines; set OMP_WAIT_POLICY=passive)\n"
        "      --mem-gbs X        memory bandwidth for pct_mem, GB/s (default: measured on host\n"
        "                         backends when a shape has at most 16 query rows)\n"
        "      --decode           decode shapes: Nq = 1,2,4,8,16 unless --seqlen-q says, Nk 8192\n"
        "                         unless --seqlen-k / --seqlen says; host backends also print\n"
        "                         a memcpy bandwidth (K/V read %% of it)\n"
        "      --paged PAGE_SIZE  K and V in a paged cache of that page size (shuffled pages,\n"
        "                         seqused_k = Nk; forward only)\n"
        "      --baseline blas    also time sgemm + softmax + sgemm through the BLAS on the same\n"
        "                         inputs (f32 forward; bench/baseline_blas.c) and print the\n"
        "                         backend's speedup over it\n"
        "  -r, --seed N           input seed (default 1)\n"
        "  -h, --help             this text\n",
        BENCH_SWEEP_TOKENS, BENCH_SWEEP_HD, BENCH_SWEEP_TOKENS, BENCH_SWEEP_HD);
}

static void bench_bad_arg(const char *opt, const char *value, const char *why)
{
    fprintf(stderr, "flashport-bench: %s%s%s: %s (see --help)\n", opt, value ? " " : "",
            value ? value : "", why);
    exit(2);
}

static int64_t bench_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi)
{
    char *end = NULL;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE)
        bench_bad_arg(opt, s, "not an integer");
    if (x < lo || x > hi)
        bench_bad_arg(opt, s, "out of range");
    return (int64_t)x;
}

static double bench_parse_double(const char *opt, const char *s, double lo)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(x))
        bench_bad_arg(opt, s, "not a number");
    if (x < lo)
        bench_bad_arg(opt, s, "out of range");
    return x;
}

/* Splits s at commas into out; each item an integer in [lo, hi]. */
static void bench_parse_list(const char *opt, const char *s, bench_list *out, int64_t lo,
                             int64_t hi)
{
    char item[64];
    out->n = 0;
    const char *p = s;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof item)
            bench_bad_arg(opt, s, "bad list");
        if (out->n == BENCH_MAX_LIST)
            bench_bad_arg(opt, s, "too many values");
        memcpy(item, p, len);
        item[len] = '\0';
        out->v[out->n++] = bench_parse_int(opt, item, lo, hi);
        if (!comma)
            break;
        p = comma + 1;
    }
}

static int bench_dtype_from_name(const char *s)
{
    if (strcmp(s, "f32") == 0)
        return FLASHPORT_F32;
    if (strcmp(s, "f16") == 0)
        return FLASHPORT_F16;
    if (strcmp(s, "bf16") == 0)
        return FLASHPORT_BF16;
    if (strcmp(s, "fp8_e4m3") == 0)
        return FLASHPORT_FP8_E4M3;
    if (strcmp(s, "fp8_e5m2") == 0)
        return FLASHPORT_FP8_E5M2;
    return -1;
}

static void bench_parse_dtypes(const char *s, bench_list *out)
{
    char item[16];
    out->n = 0;
    const char *p = s;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof item || out->n == BENCH_MAX_LIST)
            bench_bad_arg("--dtype", s, "bad list");
        memcpy(item, p, len);
        item[len] = '\0';
        int dt = bench_dtype_from_name(item);
        if (dt < 0)
            bench_bad_arg("--dtype", item, "expected f32, f16, bf16, fp8_e4m3 or fp8_e5m2");
        out->v[out->n++] = dt;
        if (!comma)
            break;
        p = comma + 1;
    }
}

static void bench_parse_args(int argc, char **argv, bench_options *o)
{
    memset(o, 0, sizeof *o);
    o->window_left = -1;
    o->window_right = -1;
    o->iters = 5;
    o->warmup = 1;
    o->check_gflop = 4.0;
    o->seed = 1;
    int direction_set = 0;
    const int64_t big = INT32_MAX;

    /* Long options take abbreviations (getopt_long: --dir both); each has a short form. */
    enum {
        OPT_SEQLEN_Q = 256,
        OPT_SEQLEN_K,
        OPT_CHECK_GFLOP,
        OPT_SOFTCAP,
        OPT_BASELINE,
        OPT_PEAK_GFLOPS,
        OPT_MEM_GBS,
        OPT_CLOCK,
        OPT_DECODE,
        OPT_PAGED
    };
    static const struct option longopts[] = {
        {"backend", required_argument, NULL, 'b'},
        {"dtype", required_argument, NULL, 't'},
        {"batch", required_argument, NULL, 'B'},
        {"heads", required_argument, NULL, 'H'},
        {"kv-heads", required_argument, NULL, 'K'},
        {"seqlen", required_argument, NULL, 's'},
        {"seqlen-q", required_argument, NULL, OPT_SEQLEN_Q},
        {"seqlen-k", required_argument, NULL, OPT_SEQLEN_K},
        {"hdim", required_argument, NULL, 'd'},
        {"causal", optional_argument, NULL, 'c'},
        {"window", required_argument, NULL, 'w'},
        {"softcap", required_argument, NULL, OPT_SOFTCAP},
        {"direction", required_argument, NULL, 'D'},
        {"iters", required_argument, NULL, 'i'},
        {"warmup", required_argument, NULL, 'W'},
        {"check", no_argument, NULL, 'C'},
        {"check-gflop", required_argument, NULL, OPT_CHECK_GFLOP},
        {"csv", required_argument, NULL, 'o'},
        {"json", required_argument, NULL, 'j'},
        {"sweep", no_argument, NULL, 'S'},
        {"peak-tflops", required_argument, NULL, 'p'},
        {"peak-gflops", required_argument, NULL, OPT_PEAK_GFLOPS},
        {"mem-gbs", required_argument, NULL, OPT_MEM_GBS},
        {"clock", required_argument, NULL, OPT_CLOCK},
        {"decode", no_argument, NULL, OPT_DECODE},
        {"paged", required_argument, NULL, OPT_PAGED},
        {"baseline", required_argument, NULL, OPT_BASELINE},
        {"seed", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    opterr = 0; /* our own messages, which point at --help */
    int ch, index = -1;
    while ((ch = getopt_long(argc, argv, ":b:t:B:H:K:s:d:c::w:D:i:W:Co:j:Sp:r:h", longopts,
                             &index)) != -1) {
        char opt[64];
        if (index >= 0)
            snprintf(opt, sizeof opt, "--%s", longopts[index].name);
        else
            snprintf(opt, sizeof opt, "-%c", ch == '?' || ch == ':' ? optopt : ch);
        index = -1;
        const char *val = optarg;
        switch (ch) {
        case 'h':
            bench_usage(stdout);
            exit(0);
        case 'C':
            o->check = 1;
            break;
        case 'S':
            o->sweep = 1;
            break;
        case 'c':
            if (val)
                bench_parse_list(opt, val, &o->causal, 0, 1);
            else {
                o->causal.v[0] = 1;
                o->causal.n = 1;
            }
            break;
        case 'b':
            o->backend = val;
            break;
        case 't':
            bench_parse_dtypes(val, &o->dtype);
            break;
        case 'B':
            bench_parse_list(opt, val, &o->batch, 1, big);
            break;
        case 'H':
            bench_parse_list(opt, val, &o->heads, 1, big);
            break;
        case 'K':
            bench_parse_list(opt, val, &o->kv_heads, 1, big);
            break;
        case 's':
            bench_parse_list(opt, val, &o->seqlen, 1, big);
            break;
        case OPT_SEQLEN_Q:
            bench_parse_list(opt, val, &o->seqlen_q, 1, big);
            break;
        case OPT_SEQLEN_K:
            bench_parse_list(opt, val, &o->seqlen_k, 1, big);
            break;
        case 'd':
            bench_parse_list(opt, val, &o->hdim, 1, big);
            break;
        case 'w': {
            bench_list w;
            bench_parse_list(opt, val, &w, INT32_MIN, big);
            if (w.n != 2)
                bench_bad_arg(opt, val, "expected L,R");
            o->window_left = (int)w.v[0];
            o->window_right = (int)w.v[1];
            break;
        }
        case OPT_SOFTCAP:
            o->softcap = (float)bench_parse_double(opt, val, 0.0);
            break;
        case 'D':
            direction_set = 1;
            o->fwd = strcmp(val, "fwd") == 0 || strcmp(val, "both") == 0;
            o->bwd = strcmp(val, "bwd") == 0 || strcmp(val, "both") == 0;
            if (!o->fwd && !o->bwd)
                bench_bad_arg(opt, val, "expected fwd, bwd or both");
            break;
        case 'i':
            o->iters = (int)bench_parse_int(opt, val, 1, 100000);
            break;
        case 'W':
            o->warmup = (int)bench_parse_int(opt, val, 0, 100000);
            break;
        case OPT_CHECK_GFLOP:
            o->check_gflop = bench_parse_double(opt, val, 0.0);
            break;
        case 'o':
            o->csv = val;
            break;
        case 'j':
            o->json = val;
            break;
        case 'p':
            o->peak_tflops = bench_parse_double(opt, val, 0.0);
            break;
        case OPT_PEAK_GFLOPS:
            o->peak_tflops = 1e-3 * bench_parse_double(opt, val, 0.0);
            break;
        case OPT_MEM_GBS:
            o->mem_gbs = bench_parse_double(opt, val, 0.0);
            break;
        case OPT_DECODE:
            o->decode = 1;
            break;
        case OPT_PAGED:
            o->page_size = bench_parse_int(opt, val, 1, big);
            break;
        case OPT_CLOCK:
            if (strcmp(val, "cpu") != 0 && strcmp(val, "wall") != 0)
                bench_bad_arg(opt, val, "expected wall or cpu");
            o->clock_cpu = strcmp(val, "cpu") == 0;
            break;
        case OPT_BASELINE:
            if (strcmp(val, "blas") != 0)
                bench_bad_arg(opt, val, "expected blas");
            if (bench_blas_missing())
                bench_bad_arg(opt, val, bench_blas_missing());
            o->baseline_blas = 1;
            break;
        case 'r':
            o->seed = (uint64_t)bench_parse_int(opt, val, 0, INT64_MAX);
            break;
        case ':':
            bench_bad_arg(argv[optind - 1], NULL, "needs a value");
            break;
        default: /* '?': unknown, ambiguous, or a value given to a flag */
            bench_bad_arg(argv[optind - 1], NULL, "unknown or ambiguous option");
        }
    }
    if (optind < argc)
        bench_bad_arg(argv[optind], NULL, "unexpected argument");

    if (!direction_set) {
        o->fwd = 1;
        o->bwd = o->sweep;
    }
    if (o->dtype.n == 0) {
        o->dtype.v[o->dtype.n++] = FLASHPORT_F32;
    }
    if (o->causal.n == 0) {
        o->causal.v[o->causal.n++] = 0;
        if (o->sweep)
            o->causal.v[o->causal.n++] = 1;
    }
    if (o->hdim.n == 0) {
        if (o->sweep) {
            o->hdim.v[o->hdim.n++] = 64;
            o->hdim.v[o->hdim.n++] = 128;
            o->hdim.v[o->hdim.n++] = 256;
        } else {
            o->hdim.v[o->hdim.n++] = 128;
        }
    }
    if (o->decode && o->seqlen_q.n == 0)
        for (int64_t n = 1; n <= 16; n *= 2)
            o->seqlen_q.v[o->seqlen_q.n++] = n;
    if (o->decode && o->seqlen_k.n == 0 && o->seqlen.n == 0)
        o->seqlen_k.v[o->seqlen_k.n++] = 8192;
    if (o->page_size && o->bwd)
        bench_bad_arg("--paged", NULL, "a paged KV cache is forward only (--direction fwd)");
    if (o->seqlen.n == 0) {
        if (o->sweep) {
            for (int64_t n = 512; n <= 4096; n *= 2)
                o->seqlen.v[o->seqlen.n++] = n;
        } else {
            o->seqlen.v[o->seqlen.n++] = 1024;
        }
    }
}

/* Every combination of the option lists, in the order dtype, D, sequence lengths, causal,
 * B, H, Hkv. Returns a malloc'd array of *count shapes. */
static bench_shape *bench_expand(const bench_options *o, int *count)
{
    /* Sequence-length pairs: Nq = Nk from --seqlen unless --seqlen-q/-k ask for a product. */
    int64_t pairs[BENCH_MAX_LIST * BENCH_MAX_LIST][2];
    int npairs = 0;
    if (o->seqlen_q.n == 0 && o->seqlen_k.n == 0) {
        for (int i = 0; i < o->seqlen.n; i++) {
            pairs[npairs][0] = pairs[npairs][1] = o->seqlen.v[i];
            npairs++;
        }
    } else {
        const bench_list *lq = o->seqlen_q.n ? &o->seqlen_q : &o->seqlen;
        const bench_list *lk = o->seqlen_k.n ? &o->seqlen_k : &o->seqlen;
        for (int i = 0; i < lq->n; i++)
            for (int j = 0; j < lk->n; j++) {
                pairs[npairs][0] = lq->v[i];
                pairs[npairs][1] = lk->v[j];
                npairs++;
            }
    }
    int nb = o->batch.n ? o->batch.n : 1;
    int nh = o->heads.n ? o->heads.n : 1;
    int nkv = o->kv_heads.n ? o->kv_heads.n : 1;
    size_t total = (size_t)o->dtype.n * o->hdim.n * npairs * o->causal.n * nb * nh * nkv;
    bench_shape *shapes = bench_host_alloc(total * sizeof *shapes);
    int n = 0;
    for (int a = 0; a < o->dtype.n; a++)
        for (int di = 0; di < o->hdim.n; di++)
            for (int p = 0; p < npairs; p++)
                for (int c = 0; c < o->causal.n; c++)
                    for (int bi = 0; bi < nb; bi++)
                        for (int hi = 0; hi < nh; hi++)
                            for (int ki = 0; ki < nkv; ki++) {
                                bench_shape *s = &shapes[n++];
                                s->dtype = (flashport_dtype)o->dtype.v[a];
                                s->d = o->hdim.v[di];
                                s->nq = pairs[p][0];
                                s->nk = pairs[p][1];
                                s->causal = (int)o->causal.v[c];
                                if (o->batch.n)
                                    s->b = o->batch.v[bi];
                                else if (o->sweep)
                                    s->b =
                                        s->nq < BENCH_SWEEP_TOKENS ? BENCH_SWEEP_TOKENS / s->nq : 1;
                                else
                                    s->b = 1;
                                if (o->heads.n)
                                    s->h = o->heads.v[hi];
                                else if (o->sweep)
                                    s->h = s->d < BENCH_SWEEP_HD ? BENCH_SWEEP_HD / s->d : 1;
                                else
                                    s->h = 8;
                                s->hkv = o->kv_heads.n ? o->kv_heads.v[ki] : s->h;
                            }
    *count = n;
    return shapes;
}

/* ---------------------------------------------------------------------------------------------
 * FLOPs and tolerances.
 * ------------------------------------------------------------------------------------------- */

/* Visible (query, key) pairs of an nq x nk problem under the window (left, right), -1 being
 * unbounded, aligned bottom-right. */
static double bench_visible_pairs(int64_t nq, int64_t nk, int64_t left, int64_t right)
{
    double pairs = 0.0;
    for (int64_t i = 0; i < nq; i++) {
        int64_t diag = i + nk - nq;
        int64_t lo = left < 0 ? 0 : diag - left;
        int64_t hi = right < 0 ? nk - 1 : diag + right;
        if (lo < 0)
            lo = 0;
        if (hi > nk - 1)
            hi = nk - 1;
        if (hi >= lo)
            pairs += (double)(hi - lo + 1);
    }
    return pairs;
}

static int64_t bench_right(const bench_shape *s, const bench_options *o)
{
    return s->causal ? 0 : o->window_right;
}

/* Pairs by the FlashAttention convention (see the top of the file). */
static double bench_flop_pairs(const bench_shape *s, const bench_options *o)
{
    int64_t left = o->window_left, right = bench_right(s, o);
    if (left < 0 && right < 0)
        return (double)s->nq * (double)s->nk;
    if (left < 0 && right == 0)
        return (double)s->nq * (double)s->nk / 2.0;
    return bench_visible_pairs(s->nq, s->nk, left, right);
}

static double bench_forward_flops(const bench_shape *s, const bench_options *o)
{
    return 4.0 * (double)s->b * (double)s->h * (double)s->d * bench_flop_pairs(s, o);
}

static double bench_tolerance(flashport_dtype dtype)
{
    switch (dtype) {
    case FLASHPORT_F32:
        return 1e-4;
    case FLASHPORT_F16:
        return 5e-3;
    case FLASHPORT_FP8_E4M3:
    case FLASHPORT_FP8_E5M2:
        return 0.125; /* O: two e4m3 roundings of P (the LSE is judged with bf16's) */
    default:
        return 4e-2;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Tensors.
 * ------------------------------------------------------------------------------------------- */
static uint64_t bench_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1) with 24 random bits. */
static float bench_rng_uniform(uint64_t *state)
{
    return (float)(bench_rng_next(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

static void *bench_device_alloc(bench_ctx *c, size_t bytes)
{
    void *p = NULL;
    bench_ok(flashport_malloc(c->be, bytes, &p), "flashport_malloc");
    return p;
}

/* Inputs and outputs of more than BENCH_FILL_PERIOD elements are filled with their first
 * BENCH_FILL_PERIOD elements, repeated (by doubling copies): one element at a time, the host
 * fill of a large decode cache (B = 128, Nk = 32768, Hkv = 8, D = 128: 4.3 G elements for K) took
 * minutes. Smaller tensors, every shape of the usual grids, are drawn element by element as
 * before, so their data (and the checks' errors) do not change. */
#define BENCH_FILL_PERIOD ((size_t)1 << 24)

/* Element count n of es-byte elements at h, of which the first min(n, BENCH_FILL_PERIOD) are
 * written: the rest repeats them. */
static void bench_fill_repeat(void *h, size_t n, size_t es)
{
    unsigned char *b = h;
    for (size_t have = BENCH_FILL_PERIOD; have < n; have *= 2)
        memcpy(b + have * es, b, (n - have < have ? n - have : have) * es);
}

/* Fills n elements of device memory with NaN of the given dtype. */
static void bench_fill_nan(bench_ctx *c, void *dev, flashport_dtype dtype, size_t n)
{
    size_t es = flashport_dtype_size(dtype);
    void *h = bench_host_alloc(n * es);
    for (size_t i = 0; i < n && i < BENCH_FILL_PERIOD; i++)
        bench_store(h, dtype, i, NAN);
    bench_fill_repeat(h, n, es);
    bench_ok(flashport_memcpy_to_device(c->be, dev, h, n * es), "flashport_memcpy_to_device");
    free(h);
}

/* A host copy of n random elements, also copied to the device. */
static void *bench_random_input(bench_ctx *c, void *dev, flashport_dtype dtype, size_t n,
                                uint64_t *rng)
{
    size_t es = flashport_dtype_size(dtype);
    void *h = bench_host_alloc(n * es);
    for (size_t i = 0; i < n && i < BENCH_FILL_PERIOD; i++)
        bench_store(h, dtype, i, bench_rng_uniform(rng));
    bench_fill_repeat(h, n, es);
    bench_ok(flashport_memcpy_to_device(c->be, dev, h, n * es), "flashport_memcpy_to_device");
    return h;
}

/* fp8: n random f32 values (the draws the other dtypes make) quantized with one scale,
 * amax / the format's largest finite value; the host copy holds the codes, *descale the scale. */
static void *bench_quantized_input(bench_ctx *c, void *dev, flashport_dtype dtype, size_t n,
                                   uint64_t *rng, float *descale)
{
    float *x = bench_host_alloc(n * sizeof(float));
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = bench_rng_uniform(rng);
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    }
    const float fmax = dtype == FLASHPORT_FP8_E4M3 ? 448.0f : 57344.0f;
    *descale = amax > 0.0f ? amax / fmax : 1.0f;
    for (size_t i = 0; i < n; i++)
        x[i] /= *descale;
    void *h = bench_host_alloc(n);
    bench_ok(flashport_convert(h, dtype, x, FLASHPORT_F32, n), "flashport_convert");
    bench_ok(flashport_memcpy_to_device(c->be, dev, h, n), "flashport_memcpy_to_device");
    free(x);
    return h;
}

/* --paged: K and V copied into a cache of ceil(Nk / page_size) pages per sequence, the pages of
 * all sequences in a shuffled order; the dense device K and V are released. */
static void bench_make_paged(bench_ctx *c, const bench_shape *s, bench_tensors *t, uint64_t *rng)
{
    const int64_t ps = c->opt->page_size, stride = (s->nk + ps - 1) / ps;
    const int64_t pages = s->b * stride, row = s->hkv * s->d;
    const size_t es = flashport_dtype_size(s->dtype), bytes = (size_t)(pages * ps * row) * es;
    int32_t *bt = bench_host_alloc((size_t)(pages > 0 ? pages : 1) * sizeof(int32_t));
    int32_t *used = bench_host_alloc((size_t)s->b * sizeof(int32_t));
    for (int64_t i = 0; i < pages; i++)
        bt[i] = (int32_t)i;
    for (int64_t i = pages - 1; i > 0; i--) {
        const int64_t j = (int64_t)(bench_rng_next(rng) % (uint64_t)(i + 1));
        const int32_t x = bt[i];
        bt[i] = bt[j];
        bt[j] = x;
    }
    char *hk = bench_host_alloc(bytes > 0 ? bytes : 1),
         *hv = bench_host_alloc(bytes > 0 ? bytes : 1);
    memset(hk, 0, bytes);
    memset(hv, 0, bytes);
    for (int64_t b = 0; b < s->b; b++) {
        used[b] = (int32_t)s->nk;
        for (int64_t j = 0; j < s->nk; j++) {
            const size_t to = (size_t)((bt[b * stride + j / ps] * ps + j % ps) * row) * es;
            const size_t from = (size_t)((b * s->nk + j) * row) * es;
            memcpy(hk + to, (const char *)t->hk + from, (size_t)row * es);
            memcpy(hv + to, (const char *)t->hv + from, (size_t)row * es);
        }
    }
    t->pk = bench_device_alloc(c, bytes);
    t->pv = bench_device_alloc(c, bytes);
    t->bt = bench_device_alloc(c, (size_t)(pages > 0 ? pages : 1) * sizeof(int32_t));
    t->used = bench_device_alloc(c, (size_t)s->b * sizeof(int32_t));
    bench_ok(flashport_memcpy_to_device(c->be, t->pk, hk, bytes), "flashport_memcpy_to_device");
    bench_ok(flashport_memcpy_to_device(c->be, t->pv, hv, bytes), "flashport_memcpy_to_device");
    bench_ok(flashport_memcpy_to_device(c->be, t->bt, bt, (size_t)pages * sizeof(int32_t)),
             "flashport_memcpy_to_device");
    bench_ok(flashport_memcpy_to_device(c->be, t->used, used, (size_t)s->b * sizeof(int32_t)),
             "flashport_memcpy_to_device");
    const int64_t shape[4] = {pages, ps, s->hkv, s->d};
    t->tk = flashport_tensor_contiguous(t->pk, s->dtype, 4, shape);
    t->tv = flashport_tensor_contiguous(t->pv, s->dtype, 4, shape);
    t->bt_stride = (int32_t)stride;
    bench_ok(flashport_free(c->be, t->k), "flashport_free");
    bench_ok(flashport_free(c->be, t->v), "flashport_free");
    t->k = t->v = NULL;
    free(bt);
    free(used);
    free(hk);
    free(hv);
}

static void bench_tensors_create(bench_ctx *c, const bench_shape *s, bench_tensors *t)
{
    memset(t, 0, sizeof *t);
    size_t es = flashport_dtype_size(s->dtype);
    const flashport_dtype odt = bench_out_dtype(s->dtype);
    size_t eo = flashport_dtype_size(odt);
    size_t nq = (size_t)(s->b * s->nq * s->h * s->d);
    size_t nk = (size_t)(s->b * s->nk * s->hkv * s->d);
    size_t nl = (size_t)(s->b * s->h * s->nq);
    int64_t qshape[4] = {s->b, s->nq, s->h, s->d};
    int64_t kshape[4] = {s->b, s->nk, s->hkv, s->d};
    int64_t lshape[3] = {s->b, s->h, s->nq};
    uint64_t rng = c->opt->seed;

    t->q = bench_device_alloc(c, nq * es);
    t->k = bench_device_alloc(c, nk * es);
    t->v = bench_device_alloc(c, nk * es);
    t->o = bench_device_alloc(c, nq * eo);
    t->lse = bench_device_alloc(c, nl * sizeof(float));
    t->descale[0] = t->descale[1] = t->descale[2] = 1.0f;
    if (bench_is_fp8(s->dtype)) {
        t->hq = bench_quantized_input(c, t->q, s->dtype, nq, &rng, &t->descale[0]);
        t->hk = bench_quantized_input(c, t->k, s->dtype, nk, &rng, &t->descale[1]);
        t->hv = bench_quantized_input(c, t->v, s->dtype, nk, &rng, &t->descale[2]);
    } else {
        t->hq = bench_random_input(c, t->q, s->dtype, nq, &rng);
        t->hk = bench_random_input(c, t->k, s->dtype, nk, &rng);
        t->hv = bench_random_input(c, t->v, s->dtype, nk, &rng);
    }
    bench_fill_nan(c, t->o, odt, nq);
    bench_fill_nan(c, t->lse, FLASHPORT_F32, nl);
    t->tq = flashport_tensor_contiguous(t->q, s->dtype, 4, qshape);
    t->tk = flashport_tensor_contiguous(t->k, s->dtype, 4, kshape);
    t->tv = flashport_tensor_contiguous(t->v, s->dtype, 4, kshape);
    t->to = flashport_tensor_contiguous(t->o, odt, 4, qshape);
    t->tlse = flashport_tensor_contiguous(t->lse, FLASHPORT_F32, 3, lshape);
    if (c->opt->page_size)
        bench_make_paged(c, s, t, &rng);
    if (!c->opt->bwd || bench_is_fp8(s->dtype)) /* fp8: forward only */
        return;
    t->dout = bench_device_alloc(c, nq * es);
    t->dq = bench_device_alloc(c, nq * es);
    t->dk = bench_device_alloc(c, nk * es);
    t->dv = bench_device_alloc(c, nk * es);
    t->hdout = bench_random_input(c, t->dout, s->dtype, nq, &rng);
    bench_fill_nan(c, t->dq, s->dtype, nq);
    bench_fill_nan(c, t->dk, s->dtype, nk);
    bench_fill_nan(c, t->dv, s->dtype, nk);
    t->tdout = flashport_tensor_contiguous(t->dout, s->dtype, 4, qshape);
    t->tdq = flashport_tensor_contiguous(t->dq, s->dtype, 4, qshape);
    t->tdk = flashport_tensor_contiguous(t->dk, s->dtype, 4, kshape);
    t->tdv = flashport_tensor_contiguous(t->dv, s->dtype, 4, kshape);
}

static void bench_tensors_destroy(bench_ctx *c, bench_tensors *t)
{
    void *dev[] = {t->q,  t->k,  t->v,  t->o,  t->lse, t->dout, t->dq,
                   t->dk, t->dv, t->pk, t->pv, t->bt,  t->used};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            bench_ok(flashport_free(c->be, dev[i]), "flashport_free");
    free(t->hq);
    free(t->hk);
    free(t->hv);
    free(t->hdout);
}

/* Device contents of a tensor, copied to a new host buffer. */
static void *bench_to_host(bench_ctx *c, const void *dev, size_t bytes)
{
    void *h = bench_host_alloc(bytes);
    bench_ok(flashport_memcpy_to_host(c->be, h, dev, bytes), "flashport_memcpy_to_host");
    return h;
}

/* ---------------------------------------------------------------------------------------------
 * Check against the reference backend.
 * ------------------------------------------------------------------------------------------- */

/* A block of a contiguous 4-D tensor: full extents, first index and block extents. */
typedef struct bench_block {
    int64_t full[4], start[4], ext[4];
} bench_block;

static size_t bench_block_count(const bench_block *blk)
{
    return (size_t)(blk->ext[0] * blk->ext[1] * blk->ext[2] * blk->ext[3]);
}

static size_t bench_block_offset(const bench_block *blk, int64_t i0, int64_t i1, int64_t i2)
{
    return (size_t)((((blk->start[0] + i0) * blk->full[1] + blk->start[1] + i1) * blk->full[2] +
                     blk->start[2] + i2) *
                        blk->full[3] +
                    blk->start[3]);
}

/* The block of src (dtype, contiguous with extents blk->full) as a new contiguous f32 array. */
static float *bench_gather_f32(const void *src, flashport_dtype dtype, const bench_block *blk)
{
    float *dst = bench_host_alloc(bench_block_count(blk) * sizeof(float));
    size_t n = 0;
    for (int64_t i0 = 0; i0 < blk->ext[0]; i0++)
        for (int64_t i1 = 0; i1 < blk->ext[1]; i1++)
            for (int64_t i2 = 0; i2 < blk->ext[2]; i2++) {
                size_t off = bench_block_offset(blk, i0, i1, i2);
                for (int64_t i3 = 0; i3 < blk->ext[3]; i3++)
                    dst[n++] = bench_load(src, dtype, off + (size_t)i3);
            }
    return dst;
}

typedef struct bench_err {
    double max_abs; /* infinity when a NaN or a misplaced infinity shows up */
    double max_ref; /* largest finite |reference| */
    double rel_l2;  /* ||test - ref|| / ||ref|| over finite refs (infinity with a NaN) */
} bench_err;

/* Compares the block of `test` (dtype, contiguous with extents blk->full) with ref, the block
 * as a contiguous f32 array. Equal values (both -inf for a fully masked LSE row) count as 0. */
static bench_err bench_compare(const void *test, flashport_dtype dtype, const bench_block *blk,
                               const float *ref)
{
    bench_err e = {0.0, 0.0, 0.0};
    double diff2 = 0.0, ref2 = 0.0;
    size_t n = 0;
    for (int64_t i0 = 0; i0 < blk->ext[0]; i0++)
        for (int64_t i1 = 0; i1 < blk->ext[1]; i1++)
            for (int64_t i2 = 0; i2 < blk->ext[2]; i2++) {
                size_t off = bench_block_offset(blk, i0, i1, i2);
                for (int64_t i3 = 0; i3 < blk->ext[3]; i3++) {
                    double t = bench_load(test, dtype, off + (size_t)i3);
                    double r = ref[n++];
                    double d;
                    if (isnan(t) || isnan(r))
                        d = INFINITY;
                    else if (t == r)
                        d = 0.0;
                    else
                        d = fabs(t - r);
                    if (d > e.max_abs)
                        e.max_abs = d;
                    if (isfinite(r) && fabs(r) > e.max_ref)
                        e.max_ref = fabs(r);
                    if (isfinite(r)) {
                        diff2 += d * d;
                        ref2 += r * r;
                    }
                }
            }
    e.rel_l2 = ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    return e;
}

/* Reference FLOPs (forward 4, backward 10 per pair and element of D) of the subset. */
static double bench_subset_gflop(const bench_shape *s, const bench_options *o,
                                 const bench_subset *u, int backward)
{
    double pairs = bench_visible_pairs(u->rows, s->nk, o->window_left, bench_right(s, o));
    double per = backward ? 14.0 : 4.0;
    return per * (double)(u->nb * u->ng * u->g) * pairs * (double)s->d * 1e-9;
}

/* Narrows to the last batch, the last kv-head group, then the last rows, until the reference
 * fits in --check-gflop (one row at least). The budget counts the backward too when it runs. */
static bench_subset bench_plan_subset(const bench_shape *s, const bench_options *o)
{
    bench_subset u = {s->b, s->hkv, s->h / s->hkv, s->nq, ""};
    double budget = o->check_gflop;
    if (bench_subset_gflop(s, o, &u, o->bwd) > budget)
        u.nb = 1;
    if (bench_subset_gflop(s, o, &u, o->bwd) > budget)
        u.ng = 1;
    if (bench_subset_gflop(s, o, &u, o->bwd) > budget) {
        int64_t lo = 1, hi = s->nq;
        while (lo < hi) {
            u.rows = (lo + hi + 1) / 2;
            if (bench_subset_gflop(s, o, &u, o->bwd) <= budget)
                lo = u.rows;
            else
                hi = u.rows - 1;
        }
        u.rows = lo;
    }
    if (u.nb == s->b && u.ng == s->hkv && u.rows == s->nq)
        snprintf(u.scope, sizeof u.scope, "full");
    else
        snprintf(u.scope, sizeof u.scope, "b[%lld:%lld] h[%lld:%lld] q[%lld:%lld]",
                 (long long)(s->b - u.nb), (long long)s->b, (long long)(s->h - u.ng * u.g),
                 (long long)s->h, (long long)(s->nq - u.rows), (long long)s->nq);
    return u;
}

/* Blocks of the subset inside the full tensors: q-shaped (B, Nq, H, D), kv-shaped
 * (B, Nk, Hkv, D) and the lse (B, H, Nq) seen as (B, H, Nq, 1). */
static bench_block bench_qblock(const bench_shape *s, const bench_subset *u)
{
    bench_block b = {{s->b, s->nq, s->h, s->d},
                     {s->b - u->nb, s->nq - u->rows, s->h - u->ng * u->g, 0},
                     {u->nb, u->rows, u->ng * u->g, s->d}};
    return b;
}

static bench_block bench_kvblock(const bench_shape *s, const bench_subset *u)
{
    bench_block b = {{s->b, s->nk, s->hkv, s->d},
                     {s->b - u->nb, 0, s->hkv - u->ng, 0},
                     {u->nb, s->nk, u->ng, s->d}};
    return b;
}

static bench_block bench_lseblock(const bench_shape *s, const bench_subset *u)
{
    bench_block b = {{s->b, s->h, s->nq, 1},
                     {s->b - u->nb, s->h - u->ng * u->g, s->nq - u->rows, 0},
                     {u->nb, u->ng * u->g, u->rows, 1}};
    return b;
}

/* A tensor descriptor of a block of a contiguous tensor (data: the full tensor's memory), with
 * the full tensor's strides; rank 3 drops the block's trailing extent of 1 (the lse). */
static flashport_tensor bench_block_view(void *data, flashport_dtype dtype, const bench_block *blk,
                                         int32_t rank)
{
    flashport_tensor t;
    memset(&t, 0, sizeof t);
    int64_t stride[4];
    stride[3] = 1;
    for (int i = 2; i >= 0; i--)
        stride[i] = stride[i + 1] * blk->full[i + 1];
    size_t off = 0;
    for (int i = 0; i < 4; i++)
        off += (size_t)(blk->start[i] * stride[i]);
    t.data = (char *)data + off * flashport_dtype_size(dtype);
    t.dtype = dtype;
    t.rank = rank;
    for (int i = 0; i < rank; i++) {
        t.shape[i] = blk->ext[i];
        t.stride[i] = stride[i];
    }
    return t;
}

static flashport_tensor bench_f32_tensor(float *data, const bench_block *blk, int32_t rank)
{
    return flashport_tensor_contiguous(data, FLASHPORT_F32, rank, blk->ext);
}

static void bench_refdata_free(bench_refdata *r)
{
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->o);
    free(r->lse);
    memset(r, 0, sizeof *r);
}

/* Largest error of one tensor against the tolerance; prints it. Returns nonzero when over. */
static int bench_judge(const char *name, bench_err e, double tol, double *max_abs)
{
    double limit = tol * (e.max_ref > 1.0 ? e.max_ref : 1.0);
    int bad = !(e.max_abs <= limit);
    fprintf(stderr, " %s %.3g%s", name, e.max_abs, bad ? " (OVER)" : "");
    if (e.max_abs > *max_abs)
        *max_abs = e.max_abs;
    return bad;
}

static void bench_scale(float *x, size_t n, float factor)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= factor;
}

/* fp8 check: the tested backend's bf16 forward on the subset's dequantized inputs (r's f32
 * copies) rounded to bf16, as its own contiguous tensors; O's relative L2 error against r->o. */
static double bench_bf16_rel_l2(bench_ctx *c, const flashport_attention_params *params,
                                const bench_refdata *r, const bench_block *qb,
                                const bench_block *kb, const bench_block *lb)
{
    const float *src[3] = {r->q, r->k, r->v};
    const bench_block *blk[3] = {qb, kb, kb};
    flashport_tensor tin[3];
    void *dev[5];
    for (int i = 0; i < 3; i++) {
        const size_t n = bench_block_count(blk[i]);
        void *h = bench_host_alloc(n * 2);
        bench_ok(flashport_convert(h, FLASHPORT_BF16, src[i], FLASHPORT_F32, n),
                 "flashport_convert");
        dev[i] = bench_device_alloc(c, n * 2);
        bench_ok(flashport_memcpy_to_device(c->be, dev[i], h, n * 2), "flashport_memcpy_to_device");
        free(h);
        tin[i] = flashport_tensor_contiguous(dev[i], FLASHPORT_BF16, 4, blk[i]->ext);
    }
    const size_t no = bench_block_count(qb), nl = bench_block_count(lb);
    dev[3] = bench_device_alloc(c, no * 2);
    dev[4] = bench_device_alloc(c, nl * sizeof(float));
    flashport_tensor to = flashport_tensor_contiguous(dev[3], FLASHPORT_BF16, 4, qb->ext);
    flashport_tensor tl = flashport_tensor_contiguous(dev[4], FLASHPORT_F32, 3, lb->ext);
    bench_ok(flashport_attention_forward(c->be, params, &tin[0], &tin[1], &tin[2], &to, &tl),
             "flashport_attention_forward (bf16 on the dequantized fp8 inputs)");
    bench_ok(flashport_synchronize(c->be), "flashport_synchronize");
    void *o = bench_to_host(c, dev[3], no * 2);
    bench_block ob = *qb;
    for (int i = 0; i < 4; i++) {
        ob.full[i] = ob.ext[i];
        ob.start[i] = 0;
    }
    const double rel = bench_compare(o, FLASHPORT_BF16, &ob, r->o).rel_l2;
    free(o);
    for (int i = 0; i < 5; i++)
        bench_ok(flashport_free(c->be, dev[i]), "flashport_free");
    return rel;
}

/* Runs the reference forward on the subset (kept in r for the backward check) and compares the
 * tested forward's O and LSE with it. Returns nonzero on failure; *max_abs gets the error.
 * fp8 (rel_l2 not NULL): the reference takes the dequantized inputs, and rel_l2[0], rel_l2[1]
 * get O's relative L2 error and that of the bf16 forward on the same data (see the top). */
static int bench_check_forward(bench_ctx *c, const bench_shape *s,
                               const flashport_attention_params *params, const bench_tensors *t,
                               bench_refdata *r, double *max_abs, double *rel_l2)
{
    r->sub = bench_plan_subset(s, c->opt);
    bench_block qb = bench_qblock(s, &r->sub), kb = bench_kvblock(s, &r->sub);
    bench_block lb = bench_lseblock(s, &r->sub);
    r->q = bench_gather_f32(t->hq, s->dtype, &qb);
    r->k = bench_gather_f32(t->hk, s->dtype, &kb);
    r->v = bench_gather_f32(t->hv, s->dtype, &kb);
    const int fp8 = bench_is_fp8(s->dtype);
    if (fp8) { /* dequantized: the f32 problem the reference solves exactly */
        bench_scale(r->q, bench_block_count(&qb), t->descale[0]);
        bench_scale(r->k, bench_block_count(&kb), t->descale[1]);
        bench_scale(r->v, bench_block_count(&kb), t->descale[2]);
    }
    r->o = bench_host_alloc(bench_block_count(&qb) * sizeof(float));
    r->lse = bench_host_alloc(bench_block_count(&lb) * sizeof(float));
    flashport_tensor rq = bench_f32_tensor(r->q, &qb, 4), rk = bench_f32_tensor(r->k, &kb, 4);
    flashport_tensor rv = bench_f32_tensor(r->v, &kb, 4), ro = bench_f32_tensor(r->o, &qb, 4);
    flashport_tensor rl = bench_f32_tensor(r->lse, &lb, 3);
    flashport_attention_params dense = *params; /* the reference reads the dense host copies */
    dense.block_table = NULL;
    dense.block_table_stride = 0;
    dense.seqused_k = NULL;
    bench_ok(flashport_attention_forward(c->ref, &dense, &rq, &rk, &rv, &ro, &rl),
             "reference flashport_attention_forward");

    const flashport_dtype odt = bench_out_dtype(s->dtype);
    size_t eo = flashport_dtype_size(odt);
    void *o = bench_to_host(c, t->o, (size_t)(s->b * s->nq * s->h * s->d) * eo);
    void *lse = bench_to_host(c, t->lse, (size_t)(s->b * s->h * s->nq) * sizeof(float));
    double tol = bench_tolerance(s->dtype), tol_lse = bench_tolerance(odt);
    *max_abs = 0.0;
    fprintf(stderr, "check fwd (%s):", r->sub.scope);
    const bench_err eo_err = bench_compare(o, odt, &qb, r->o);
    int bad = bench_judge("o", eo_err, tol, max_abs);
    bad |= bench_judge("lse", bench_compare(lse, FLASHPORT_F32, &lb, r->lse), tol_lse, max_abs);
    if (fp8)
        fprintf(stderr, "; tol o %.1e, lse %.1e x max(1, max|ref|)%s\n", tol, tol_lse,
                bad ? ": FAILED" : "");
    else
        fprintf(stderr, "; tol %.1e x max(1, max|ref|)%s\n", tol, bad ? ": FAILED" : "");
    if (fp8 && rel_l2) {
        rel_l2[0] = eo_err.rel_l2;
        rel_l2[1] = bench_bf16_rel_l2(c, &dense, r, &qb, &kb, &lb);
        fprintf(stderr,
                "fp8 error (%s): O relative L2 vs f32 attention of the dequantized inputs: %s "
                "%.3e, bf16 forward on them %.3e (ratio %.2f)\n",
                r->sub.scope, flashport_dtype_name(s->dtype), rel_l2[0], rel_l2[1],
                rel_l2[0] / rel_l2[1]);
    }
    free(o);
    free(lse);
    return bad;
}

/* Reference backward on the subset from the reference forward's O and LSE, compared with the
 * tested backward's dQ, dK, dV (of the timed run when every row is in the subset, else of a
 * tested run on the sub-problem). */
static int bench_check_backward(bench_ctx *c, const bench_shape *s,
                                const flashport_attention_params *params, const bench_tensors *t,
                                const bench_refdata *r, double *max_abs)
{
    const bench_subset *u = &r->sub;
    bench_block qb = bench_qblock(s, u), kb = bench_kvblock(s, u), lb = bench_lseblock(s, u);
    size_t nqb = bench_block_count(&qb), nkb = bench_block_count(&kb);
    float *rdout = bench_gather_f32(t->hdout, s->dtype, &qb);
    float *rdq = bench_host_alloc(nqb * sizeof(float));
    float *rdk = bench_host_alloc(nkb * sizeof(float));
    float *rdv = bench_host_alloc(nkb * sizeof(float));
    flashport_tensor rq = bench_f32_tensor(r->q, &qb, 4), rk = bench_f32_tensor(r->k, &kb, 4);
    flashport_tensor rv = bench_f32_tensor(r->v, &kb, 4), ro = bench_f32_tensor(r->o, &qb, 4);
    flashport_tensor rl = bench_f32_tensor(r->lse, &lb, 3);
    flashport_tensor rdo = bench_f32_tensor(rdout, &qb, 4), rtdq = bench_f32_tensor(rdq, &qb, 4);
    flashport_tensor rtdk = bench_f32_tensor(rdk, &kb, 4), rtdv = bench_f32_tensor(rdv, &kb, 4);
    bench_ok(flashport_attention_backward(c->ref, params, &rq, &rk, &rv, &ro, &rl, &rdo, &rtdq,
                                          &rtdk, &rtdv),
             "reference flashport_attention_backward");

    size_t es = flashport_dtype_size(s->dtype);
    bench_block tqb = qb, tkb = kb; /* where the tested gradients sit in host memory */
    void *dq, *dk, *dv;
    const char *source = "";
    if (u->rows == s->nq) {
        dq = bench_to_host(c, t->dq, (size_t)(s->b * s->nq * s->h * s->d) * es);
        dk = bench_to_host(c, t->dk, (size_t)(s->b * s->nk * s->hkv * s->d) * es);
        dv = bench_to_host(c, t->dv, (size_t)(s->b * s->nk * s->hkv * s->d) * es);
    } else {
        /* The sub-problem on the tested backend, as views of its own tensors. */
        flashport_tensor vq = bench_block_view(t->q, s->dtype, &qb, 4);
        flashport_tensor vk = bench_block_view(t->k, s->dtype, &kb, 4);
        flashport_tensor vv = bench_block_view(t->v, s->dtype, &kb, 4);
        flashport_tensor vo = bench_block_view(t->o, s->dtype, &qb, 4);
        flashport_tensor vl = bench_block_view(t->lse, FLASHPORT_F32, &lb, 3);
        flashport_tensor vdo = bench_block_view(t->dout, s->dtype, &qb, 4);
        void *sdq = bench_device_alloc(c, nqb * es);
        void *sdk = bench_device_alloc(c, nkb * es);
        void *sdv = bench_device_alloc(c, nkb * es);
        bench_fill_nan(c, sdq, s->dtype, nqb);
        bench_fill_nan(c, sdk, s->dtype, nkb);
        bench_fill_nan(c, sdv, s->dtype, nkb);
        flashport_tensor vdq = flashport_tensor_contiguous(sdq, s->dtype, 4, qb.ext);
        flashport_tensor vdk = flashport_tensor_contiguous(sdk, s->dtype, 4, kb.ext);
        flashport_tensor vdv = flashport_tensor_contiguous(sdv, s->dtype, 4, kb.ext);
        bench_ok(flashport_attention_backward(c->be, params, &vq, &vk, &vv, &vo, &vl, &vdo, &vdq,
                                              &vdk, &vdv),
                 "flashport_attention_backward (check sub-problem)");
        bench_ok(flashport_synchronize(c->be), "flashport_synchronize");
        dq = bench_to_host(c, sdq, nqb * es);
        dk = bench_to_host(c, sdk, nkb * es);
        dv = bench_to_host(c, sdv, nkb * es);
        bench_ok(flashport_free(c->be, sdq), "flashport_free");
        bench_ok(flashport_free(c->be, sdk), "flashport_free");
        bench_ok(flashport_free(c->be, sdv), "flashport_free");
        for (int i = 0; i < 4; i++) {
            tqb.full[i] = tqb.ext[i];
            tkb.full[i] = tkb.ext[i];
            tqb.start[i] = tkb.start[i] = 0;
        }
        source = ", tested backward rerun on the sub-problem";
    }
    double tol = bench_tolerance(s->dtype);
    *max_abs = 0.0;
    fprintf(stderr, "check bwd (%s%s):", u->scope, source);
    int bad = bench_judge("dq", bench_compare(dq, s->dtype, &tqb, rdq), tol, max_abs);
    bad |= bench_judge("dk", bench_compare(dk, s->dtype, &tkb, rdk), tol, max_abs);
    bad |= bench_judge("dv", bench_compare(dv, s->dtype, &tkb, rdv), tol, max_abs);
    fprintf(stderr, "; tol %.1e x max(1, max|ref|)%s\n", tol, bad ? ": FAILED" : "");
    free(dq);
    free(dk);
    free(dv);
    free(rdout);
    free(rdq);
    free(rdk);
    free(rdv);
    return bad;
}

/* ---------------------------------------------------------------------------------------------
 * Timing and output.
 * ------------------------------------------------------------------------------------------- */
static void bench_run_once(bench_ctx *c, const flashport_attention_params *p,
                           const bench_tensors *t, int backward)
{
    if (backward)
        bench_ok(flashport_attention_backward(c->be, p, &t->tq, &t->tk, &t->tv, &t->to, &t->tlse,
                                              &t->tdout, &t->tdq, &t->tdk, &t->tdv),
                 "flashport_attention_backward");
    else
        bench_ok(flashport_attention_forward(c->be, p, &t->tq, &t->tk, &t->tv, &t->to, &t->tlse),
                 "flashport_attention_forward");
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median and minimum of --iters runs after --warmup untimed ones, in ms. Each run is bracketed
 * by a flashport_timer: device events on the backend's stream where the backend has them (CUDA,
 * HIP), the host clock around synchronizations otherwise. */
static void bench_time(bench_ctx *c, const flashport_attention_params *p, const bench_tensors *t,
                       int backward, double *median, double *min)
{
    int iters = c->opt->iters;
    for (int i = 0; i < c->opt->warmup; i++)
        bench_run_once(c, p, t, backward);
    flashport_timer *timer = NULL;
    bench_ok(flashport_timer_create(c->be, &timer), "flashport_timer_create");
    double *ms = bench_host_alloc((size_t)iters * sizeof(double));
    const int threads = bench_host_threads();
    for (int i = 0; i < iters; i++) {
        float elapsed = 0.0f;
        if (c->opt->clock_cpu) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
            bench_run_once(c, p, t, backward);
            bench_ok(flashport_synchronize(c->be), "flashport_synchronize");
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
            ms[i] =
                ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec)) /
                threads;
            continue;
        }
        bench_ok(flashport_timer_start(timer), "flashport_timer_start");
        bench_run_once(c, p, t, backward);
        bench_ok(flashport_timer_stop(timer), "flashport_timer_stop");
        bench_ok(flashport_timer_elapsed_ms(timer, &elapsed), "flashport_timer_elapsed_ms");
        ms[i] = elapsed;
    }
    flashport_timer_destroy(timer);
    qsort(ms, (size_t)iters, sizeof(double), bench_cmp_double);
    *median = iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
    *min = ms[0];
    free(ms);
}

static const char *bench_csv_header =
    "backend,variant,dtype,batch,heads,kv_heads,seqlen_q,seqlen_k,hdim,causal,window_left,"
    "window_right,softcap,direction,iters,ms_median,ms_min,tflops,peak_tflops,pct_peak,"
    "max_abs_err,check,check_scope,kv_gbs,mem_gbs,pct_mem,o_rel_l2,o_rel_l2_bf16\n";

/* A number for the CSV; NaN (unknown) is left empty. */
static void bench_csv_num(FILE *f, double x)
{
    if (!isnan(x))
        fprintf(f, "%.6g", x);
    fputc(',', f);
}

static void bench_print_header(void)
{
    printf("%-9s %-8s %-5s %4s %4s %4s %6s %6s %4s %6s %9s %4s %10s %9s %6s %11s %s\n", "backend",
           "variant", "dtype", "B", "H", "Hkv", "Nq", "Nk", "D", "causal", "window", "dir",
           "ms_median", "TFLOP/s", "%peak", "max_abs_err", "check");
}

static void bench_emit_json(bench_ctx *c, const bench_shape *s, const bench_row *r);

static void bench_emit(bench_ctx *c, const bench_shape *s, const bench_row *r)
{
    const bench_options *o = c->opt;
    char window[24], pct[16], err[16];
    snprintf(window, sizeof window, "%d,%d", o->window_left, o->window_right);
    if (isnan(r->pct_peak))
        snprintf(pct, sizeof pct, "-");
    else
        snprintf(pct, sizeof pct, "%.1f", r->pct_peak);
    if (isnan(r->max_abs_err))
        snprintf(err, sizeof err, "-");
    else
        snprintf(err, sizeof err, "%.3g", r->max_abs_err);
    printf("%-9s %-8s %-5s %4lld %4lld %4lld %6lld %6lld %4lld %6s %9s %4s %10.3f %9.4f %6s %11s "
           "%s\n",
           c->name, c->variant, flashport_dtype_name(s->dtype), (long long)s->b, (long long)s->h,
           (long long)s->hkv, (long long)s->nq, (long long)s->nk, (long long)s->d,
           s->causal ? "yes" : "no", window, r->direction, r->ms_median, r->tflops, pct, err,
           r->check);
    fflush(stdout);
    if (c->json)
        bench_emit_json(c, s, r);
    if (!c->csv)
        return;
    fprintf(c->csv, "%s,%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%d,%d,%g,%s,%d,", c->name,
            c->variant, flashport_dtype_name(s->dtype), (long long)s->b, (long long)s->h,
            (long long)s->hkv, (long long)s->nq, (long long)s->nk, (long long)s->d, s->causal,
            o->window_left, o->window_right, (double)o->softcap, r->direction, o->iters);
    bench_csv_num(c->csv, r->ms_median);
    bench_csv_num(c->csv, r->ms_min);
    bench_csv_num(c->csv, r->tflops);
    bench_csv_num(c->csv, c->peak_tflops);
    bench_csv_num(c->csv, r->pct_peak);
    bench_csv_num(c->csv, r->max_abs_err);
    fprintf(c->csv, "%s,%s,", r->check, r->scope);
    bench_csv_num(c->csv, r->kv_gbs);
    bench_csv_num(c->csv, c->mem_gbs);
    if (!isnan(r->kv_gbs) && !isnan(c->mem_gbs))
        fprintf(c->csv, "%.6g", 100.0 * r->kv_gbs / c->mem_gbs);
    fputc(',', c->csv);
    bench_csv_num(c->csv, r->rel_l2);
    if (!isnan(r->rel_l2_bf16))
        fprintf(c->csv, "%.6g", r->rel_l2_bf16);
    fputc('\n', c->csv);
    fflush(c->csv);
}

/* A number for the JSON; NaN (unknown) is null. */
static void bench_json_num(FILE *f, const char *key, double x)
{
    if (isnan(x))
        fprintf(f, ", \"%s\": null", key);
    else
        fprintf(f, ", \"%s\": %.6g", key, x);
}

/* One object per row, the CSV's columns as keys; the array is closed in main. Names and the
 * check scope hold no quotes or backslashes (backend names are [a-z0-9_]). */
static void bench_emit_json(bench_ctx *c, const bench_shape *s, const bench_row *r)
{
    const bench_options *o = c->opt;
    FILE *f = c->json;
    fprintf(f,
            "%s\n  {\"backend\": \"%s\", \"variant\": \"%s\", \"dtype\": \"%s\", "
            "\"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"seqlen_q\": %lld, "
            "\"seqlen_k\": %lld, \"hdim\": %lld, \"causal\": %d, \"window_left\": %d, "
            "\"window_right\": %d, \"softcap\": %g, \"direction\": \"%s\", \"iters\": %d",
            c->json_rows++ ? "," : "", c->name, c->variant, flashport_dtype_name(s->dtype),
            (long long)s->b, (long long)s->h, (long long)s->hkv, (long long)s->nq, (long long)s->nk,
            (long long)s->d, s->causal, o->window_left, o->window_right, (double)o->softcap,
            r->direction, o->iters);
    bench_json_num(f, "ms_median", r->ms_median);
    bench_json_num(f, "ms_min", r->ms_min);
    bench_json_num(f, "tflops", r->tflops);
    bench_json_num(f, "peak_tflops", c->peak_tflops);
    bench_json_num(f, "pct_peak", r->pct_peak);
    bench_json_num(f, "max_abs_err", r->max_abs_err);
    bench_json_num(f, "o_rel_l2", r->rel_l2);
    bench_json_num(f, "o_rel_l2_bf16", r->rel_l2_bf16);
    fprintf(f, ", \"check\": \"%s\", \"check_scope\": \"%s\"}", r->check, r->scope);
    fflush(f);
}

/* Times one direction and emits its row; returns the median in ms. */
static double bench_direction(bench_ctx *c, const bench_shape *s,
                              const flashport_attention_params *p, const bench_tensors *t,
                              int backward, double max_abs, int bad, const char *scope,
                              const double *rel_l2)
{
    bench_row r;
    r.direction = backward ? "bwd" : "fwd";
    r.rel_l2 = rel_l2 ? rel_l2[0] : NAN;
    r.rel_l2_bf16 = rel_l2 ? rel_l2[1] : NAN;
    r.max_abs_err = max_abs;
    r.check = !c->opt->check ? "off" : bad ? "FAIL" : "ok";
    r.scope = c->opt->check ? scope : "";
    bench_time(c, p, t, backward, &r.ms_median, &r.ms_min);
    double flops = bench_forward_flops(s, c->opt) * (backward ? 2.5 : 1.0);
    r.tflops = flops / (r.ms_median * 1e-3) * 1e-12;
    r.pct_peak = 100.0 * r.tflops / c->peak_tflops;
    const double kv_bytes =
        2.0 * (double)(s->b * s->nk * s->hkv * s->d) * (double)flashport_dtype_size(s->dtype);
    r.kv_gbs = backward ? NAN : kv_bytes / (r.ms_median * 1e-3) * 1e-9;
    bench_emit(c, s, &r);
    if (!backward && !isnan(c->mem_gbs) && s->nq <= 16) {
        printf("# decode: K/V read at %.1f GB/s, %.0f%% of the %.1f GB/s bandwidth", r.kv_gbs,
               100.0 * r.kv_gbs / c->mem_gbs, c->mem_gbs);
        if (!isnan(c->copy_gbs))
            printf(", %.0f%% of the %.1f GB/s memcpy", 100.0 * r.kv_gbs / c->copy_gbs, c->copy_gbs);
        printf("\n");
    }
    return r.ms_median;
}

/* --baseline blas: the BLAS-materialized forward on the same f32 inputs, as a "blas" row, and
 * the backend's speedup over it (backend_ms: the backend's forward median). */
static void bench_baseline_blas(bench_ctx *c, const bench_shape *s, const bench_tensors *t,
                                double backend_ms)
{
    const bench_options *o = c->opt;
    if (s->dtype != FLASHPORT_F32 || o->softcap > 0.0f) {
        printf("# blas baseline: f32 without softcap only, not run here\n");
        return;
    }
    const int threads = bench_host_threads();
    const size_t nq = (size_t)(s->b * s->nq * s->h * s->d);
    float *o_blas = bench_host_alloc(nq * sizeof(float));
    float *scores = bench_host_alloc((size_t)threads * (size_t)(s->nq * s->nk) * sizeof(float));
    const bench_blas_problem bp = {s->b,
                                   s->h,
                                   s->hkv,
                                   s->nq,
                                   s->nk,
                                   s->d,
                                   o->window_left,
                                   bench_right(s, o),
                                   1.0f / sqrtf((float)s->d),
                                   t->hq,
                                   t->hk,
                                   t->hv,
                                   o_blas};
    bench_row r;
    r.direction = "fwd";
    r.scope = "backend's O";
    r.kv_gbs = NAN;
    r.rel_l2 = r.rel_l2_bf16 = NAN;
    bench_blas_time(&bp, scores, threads, o->warmup, o->iters, &r.ms_median, &r.ms_min);
    r.tflops = bench_forward_flops(s, o) / (r.ms_median * 1e-3) * 1e-12;
    r.pct_peak = 100.0 * r.tflops / c->peak_tflops;
    float *o_backend = bench_to_host(c, t->o, nq * sizeof(float));
    r.max_abs_err = 0.0; /* here: against the backend's O */
    for (size_t i = 0; i < nq; i++) {
        const double e = fabs((double)o_blas[i] - (double)o_backend[i]);
        r.max_abs_err = e > r.max_abs_err || e != e ? e : r.max_abs_err;
    }
    /* Both compute the same O from the same inputs: a disagreement is a failure of one. */
    const int bad = !(r.max_abs_err <= bench_tolerance(FLASHPORT_F32));
    r.check = bad ? "FAIL" : "ok";
    c->failures += bad;
    bench_ctx as_blas = *c;
    as_blas.name = "blas";
    as_blas.variant = "sgemm";
    bench_emit(&as_blas, s, &r);
    c->json_rows = as_blas.json_rows;
    printf("# blas baseline (%s): %.3f ms; %s is %.2fx faster; max |O_blas - O_%s| = %.3g\n",
           bench_blas_name(), r.ms_median, c->name, r.ms_median / backend_ms, c->name,
           r.max_abs_err);
    free(o_blas);
    free(scores);
    free(o_backend);
}

static void bench_shape_run(bench_ctx *c, const bench_shape *s)
{
    const bench_options *o = c->opt;
    flashport_attention_params params;
    flashport_attention_params_init(&params);
    params.causal = s->causal;
    params.window_left = o->window_left;
    params.window_right = o->window_right;
    params.softcap = o->softcap;

    bench_tensors t;
    bench_tensors_create(c, s, &t);
    params.descale_q = t.descale[0]; /* fp8 only; ignored for other dtypes */
    params.descale_k = t.descale[1];
    params.descale_v = t.descale[2];
    if (t.bt) {
        params.block_table = t.bt;
        params.block_table_stride = t.bt_stride;
        params.seqused_k = t.used;
    }
    bench_refdata ref;
    memset(&ref, 0, sizeof ref);
    double err_fwd = NAN, err_bwd = NAN, rel_l2[2] = {NAN, NAN};
    const int fp8 = bench_is_fp8(s->dtype);
    int bad_fwd = 0, bad_bwd = 0;

    bench_run_once(c, &params, &t, 0);
    bench_ok(flashport_synchronize(c->be), "flashport_synchronize");
    if (o->check)
        bad_fwd = bench_check_forward(c, s, &params, &t, &ref, &err_fwd, fp8 ? rel_l2 : NULL);
    if (o->fwd) {
        const double ms = bench_direction(c, s, &params, &t, 0, err_fwd, bad_fwd, ref.sub.scope,
                                          fp8 && o->check ? rel_l2 : NULL);
        if (o->baseline_blas)
            bench_baseline_blas(c, s, &t, ms);
    }
    if (o->bwd && fp8)
        printf("# %s: forward only, no backward row\n", flashport_dtype_name(s->dtype));
    if (o->bwd && !fp8) {
        bench_run_once(c, &params, &t, 1);
        bench_ok(flashport_synchronize(c->be), "flashport_synchronize");
        if (o->check)
            bad_bwd = bench_check_backward(c, s, &params, &t, &ref, &err_bwd);
        bench_direction(c, s, &params, &t, 1, err_bwd, bad_bwd | bad_fwd, ref.sub.scope, NULL);
    }
    c->failures += bad_fwd + bad_bwd;
    bench_refdata_free(&ref);
    bench_tensors_destroy(c, &t);
}

static int bench_is_host_backend(const char *name)
{
    return strcmp(name, "cpu") == 0 || strcmp(name, "reference") == 0;
}

static void bench_set_peak(bench_ctx *c)
{
    if (c->opt->peak_tflops > 0.0) {
        c->peak_tflops = c->opt->peak_tflops;
        printf("# peak: %.4g TFLOP/s (given with --peak-tflops / --peak-gflops)\n", c->peak_tflops);
        return;
    }
    if (!bench_is_host_backend(c->name)) {
        c->peak_tflops = NAN;
        printf("# peak: unknown for backend %s (no portable way to measure it; pass "
               "--peak-tflops X): pct_peak left empty\n",
               c->name);
        return;
    }
    bench_peak_cpu_clock(c->opt->clock_cpu);
    bench_peak pk = bench_measure_f32_peak(bench_host_threads(), BENCH_PEAK_SECONDS);
    c->peak_tflops = pk.gflops > 0.0 ? pk.gflops * 1e-3 : NAN;
    printf("# peak: %.1f GFLOP/s f32 FMA, measured here (%d thread%s, %s); pct_peak is against "
           "it for every dtype\n",
           pk.gflops, pk.threads, pk.threads == 1 ? "" : "s", pk.isa);
}

/* Memory bandwidth for pct_mem: --mem-gbs, else measured on host backends when a shape is a
 * decode (at most 16 query rows), else unknown. */
static void bench_set_bandwidth(bench_ctx *c, const bench_shape *shapes, int nshapes)
{
    c->mem_gbs = NAN;
    c->copy_gbs = NAN;
    if (c->opt->decode && bench_is_host_backend(c->name)) {
        bench_bandwidth cp = bench_measure_copy_bandwidth(bench_host_threads());
        c->copy_gbs = cp.gbs > 0.0 ? cp.gbs : NAN;
        printf("# copy: %.1f GB/s memcpy, measured here (%d thread%s; bytes read + written, as "
               "STREAM's Copy counts them)\n",
               cp.gbs, cp.threads, cp.threads == 1 ? "" : "s");
    } else if (c->opt->decode) {
        printf("# copy: not measured for backend %s (bench/compare_torch.py --decode times a "
               "device copy)\n",
               c->name);
    }
    if (c->opt->mem_gbs > 0.0) {
        c->mem_gbs = c->opt->mem_gbs;
        printf("# memory: %.4g GB/s (given with --mem-gbs)\n", c->mem_gbs);
        return;
    }
    int decode = 0;
    for (int i = 0; i < nshapes; i++)
        decode |= shapes[i].nq <= 16;
    if (!decode || !bench_is_host_backend(c->name))
        return;
    bench_bandwidth bw = bench_measure_read_bandwidth(bench_host_threads());
    c->mem_gbs = bw.gbs > 0.0 ? bw.gbs : NAN;
    printf("# memory: %.1f GB/s read, measured here (%d thread%s, STREAM-like sum); pct_mem is "
           "the K/V read rate against it\n",
           bw.gbs, bw.threads, bw.threads == 1 ? "" : "s");
}

static FILE *bench_open_csv(const char *path)
{
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "flashport-bench: cannot open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    if (ftell(f) == 0)
        fputs(bench_csv_header, f);
    return f;
}

int main(int argc, char **argv)
{
    bench_options opt;
    bench_parse_args(argc, argv, &opt);
    int nshapes = 0;
    bench_shape *shapes = bench_expand(&opt, &nshapes);

    bench_ctx c;
    memset(&c, 0, sizeof c);
    c.opt = &opt;
    bench_ok(flashport_backend_open(opt.backend, &c.be), "flashport_backend_open");
    if (opt.check)
        bench_ok(flashport_backend_open("reference", &c.ref), "flashport_backend_open(reference)");
    c.name = flashport_backend_name(c.be);
    c.variant = bench_variant(c.be);
    if (opt.clock_cpu && !bench_is_host_backend(c.name))
        bench_bad_arg("--clock", "cpu", "host backends only (cpu, reference)");
    if (opt.csv)
        c.csv = bench_open_csv(opt.csv);
    if (opt.json) {
        c.json = fopen(opt.json, "w");
        if (!c.json) {
            fprintf(stderr, "flashport-bench: cannot open %s: %s\n", opt.json, strerror(errno));
            return 1;
        }
        fputc('[', c.json);
    }

    printf("# flashport %s, backend %s (device %d), iters %d after %d warm-up, seed %llu, "
           "softcap %g\n",
           flashport_version(), c.name, flashport_backend_device(c.be), opt.iters, opt.warmup,
           (unsigned long long)opt.seed, (double)opt.softcap);
    bench_set_peak(&c);
    bench_set_bandwidth(&c, shapes, nshapes);
    if (opt.page_size)
        printf("# paged: K and V in pages of %lld keys, shuffled, seqused_k = Nk\n",
               (long long)opt.page_size);
    if (opt.clock_cpu)
        printf("# clock: CPU time of the process / %d threads (--clock cpu)\n",
               bench_host_threads());
    bench_print_header();
    fflush(stdout);

    for (int i = 0; i < nshapes; i++) {
        const bench_shape *s = &shapes[i];
        if (nshapes > 1)
            fprintf(stderr, "[%d/%d] %s B=%lld H=%lld Hkv=%lld Nq=%lld Nk=%lld D=%lld%s\n", i + 1,
                    nshapes, flashport_dtype_name(s->dtype), (long long)s->b, (long long)s->h,
                    (long long)s->hkv, (long long)s->nq, (long long)s->nk, (long long)s->d,
                    s->causal ? " causal" : "");
        bench_shape_run(&c, s);
    }

    if (c.csv)
        fclose(c.csv);
    if (c.json) {
        fputs("\n]\n", c.json);
        fclose(c.json);
    }
    flashport_backend_close(c.ref);
    flashport_backend_close(c.be);
    free(shapes);
    if (c.failures) {
        fprintf(stderr, "flashport-bench: %d check%s FAILED\n", c.failures,
                c.failures == 1 ? "" : "s");
        return 1;
    }
    return 0;
}
