/*
 * opencl_mma_probe: bisects the fault of the OpenCL tensor-core variant (backends/opencl/kernels/
 * mma_nv.cl) on NVIDIA's OpenCL driver, one variant per process (a fault leaves NVIDIA's context
 * failing every later call, so nothing may share a process with it). Each run prints one line:
 *
 *   VARIANT: ok (max err E) | wrong (max err E at ...) | fault (OpenCL error N at clFinish)
 *          | refused (OpenCL error N at launch) | skip (build refused: ...) | error (...)
 *
 * and, with a dump folder, writes the driver's build log (VARIANT.log) and, where the driver's
 * program binary is PTX text (NVIDIA), the PTX it produced (VARIANT.ptx).
 *
 * Variants, from the bare instruction to the real forward kernel (FLAVOUR = bf16 or f16):
 *   raw-FLAVOUR-wg32 / -wg128   one mma.sync on register fragments, no library code (a)
 *   frag-FLAVOUR-S              the library's fp_ocl_mma16816 on register fragments, S = what
 *                               precedes it: none, diverge (half of each warp branches), barrier,
 *                               warpsync (bar.warp.sync -1), cvt (A packed by fp_ocl_pack2) (c)
 *   dots-FLAVOUR-copy16 / -copy1  S = X Y^T of [64, 64] tiles from __local kernel arguments
 *                               through fp_ocl_tile_dots (fp_ocl_load_a / _b), the tiles copied
 *                               by fp_ocl_load_tile16 (uint4 global loads) or element-wise; X
 *                               the first __local argument, as q in the real kernels (b)
 *   dots-FLAVOUR-pad            the same after a 16-byte __local argument: X not at address 0
 *   addr-bf16-d64               where the driver puts __local arguments of the forward's sizes
 *   mm-FLAVOUR-pv / -ptdo       O = P V (P f32 in local memory, packed by cvt; V through the
 *                               two 16-bit loads of a strided B fragment), or P^T dO (b)
 *   real-FLAVOUR-dD-S           fp_ocl_forward itself (B = H = 1, N = 200; "small": N = T,
 *                               one work-group and one key block) against a double-precision
 *                               reference, with S: asis; small; emulate (FP_OCL_MMA_EMULATE = 1
 *                               on this device); unaligned (q, k, v one element into their
 *                               buffers: the element-wise tile copy instead of uint4 loads);
 *                               warpsync (bar.warp.sync -1 before every mma.sync); noopt
 *                               (-cl-opt-disable); noinline (no always_inline or unroll);
 *                               scratch (each kernel's own __local array written once, so that
 *                               it is kept and, if the driver places it first, q is not at
 *                               __local address 0) (d, e)
 *   plain-bf16-d128[-nounroll]  the plain path's forward (T = 32) against the same reference,
 *                               as the plugin builds it for a GPU (FP_OCL_UNROLL_ALL = 1) and
 *                               without: the driver's PTX of each (ld.local / st.local traffic)
 *
 * --emulate builds the frag / dots / mm / real variants with FP_OCL_MMA_EMULATE = 1 (raw ones
 * skip): the probe's own check on a device without tensor cores (PoCL), where the same host-side
 * expectations must then hold.
 *
 *   opencl_mma_probe --list | --device
 *   opencl_mma_probe [--emulate] [--dump DIR] PROGRAM_CL PROBE_CL VARIANT
 *
 * PROGRAM_CL: the library's program text (build/backends/opencl/ocl_program_source.c.cl);
 * PROBE_CL: tests/gpu/opencl_mma_probe.cl. The device: the first GPU of the platforms whose name
 * contains FLASHPORT_OPENCL_PLATFORM (all platforms without it), else the first device.
 * tests/gpu/run_opencl_mma_probe.sh runs every variant and collects the results.
 */
#define _POSIX_C_SOURCE 200809L

#include "backends/opencl/ocl_host.h"
#include "backends/opencl/ocl_plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { RAW, FRAG, DOTS, MM, ADDR, REAL };
enum { R_ASIS, R_SMALL, R_EMULATE, R_UNALIGNED, R_WARPSYNC, R_NOOPT, R_NOINLINE, R_SCRATCH };

typedef struct variant {
    char name[48];
    int kind, dtype; /* dtype: 1 f16, 2 bf16 */
    int d, t, opt;   /* opt: raw: work-group size; frag: PROBE_SYNC; dots: PROBE_COPY; mm:
                        PROBE_TRANSPOSED; real: R_* */
    int pad;         /* dots: PROBE_PAD */
    int plain;       /* real: the plain program (FP_OCL_MMA = 0) */
    int nounroll;    /* real: FP_OCL_UNROLL_ALL = 0 where the plugin would set it */
} variant;

static const char *const frag_names[] = {"none", "diverge", "barrier", "warpsync", "cvt"};
static const char *const real_names[] = {"asis",     "small", "emulate",  "unaligned",
                                         "warpsync", "noopt", "noinline", "scratch"};

/* Every variant, in the order the script runs them. */
static int list_variants(variant *v, int max)
{
    int n = 0;
#define ADD(x)                                                                                     \
    if (n < max)                                                                                   \
    v[n++] = (x)
    for (int dt = 2; dt >= 1; dt--) {
        const char *f = dt == 2 ? "bf16" : "f16";
        variant x;
        for (int wg = 32; wg <= 128; wg *= 4) {
            x = (variant){.kind = RAW, .dtype = dt, .d = 16, .t = 16, .opt = wg};
            snprintf(x.name, sizeof x.name, "raw-%s-wg%d", f, wg);
            ADD(x);
        }
        for (int s = 0; s < 5; s++) {
            x = (variant){.kind = FRAG, .dtype = dt, .d = 64, .t = 64, .opt = s};
            snprintf(x.name, sizeof x.name, "frag-%s-%s", f, frag_names[s]);
            ADD(x);
        }
        for (int c = 16; c >= 1; c -= 15) {
            x = (variant){.kind = DOTS, .dtype = dt, .d = 64, .t = 64, .opt = c};
            snprintf(x.name, sizeof x.name, "dots-%s-copy%d", f, c);
            ADD(x);
        }
        x = (variant){.kind = DOTS, .dtype = dt, .d = 64, .t = 64, .opt = 16, .pad = 1};
        snprintf(x.name, sizeof x.name, "dots-%s-pad", f);
        ADD(x);
        for (int tr = 0; tr < 2; tr++) {
            x = (variant){.kind = MM, .dtype = dt, .d = 64, .t = 64, .opt = tr};
            snprintf(x.name, sizeof x.name, "mm-%s-%s", f, tr ? "ptdo" : "pv");
            ADD(x);
        }
    }
    /* The real forward: bf16 D = 64 (T = 64, the 4 x 1 warp grid) with every suspect fixed in
     * turn; bf16 D = 128 (T = 32, 2 x 2) and f16 D = 64 as they are and with bar.warp.sync. */
    variant addr = {.kind = ADDR, .dtype = 2, .d = 64, .t = 64};
    snprintf(addr.name, sizeof addr.name, "addr-bf16-d64");
    ADD(addr);
    for (int r = R_ASIS; r <= R_SCRATCH; r++) {
        variant x = {.kind = REAL, .dtype = 2, .d = 64, .t = 64, .opt = r};
        snprintf(x.name, sizeof x.name, "real-bf16-d64-%s", real_names[r]);
        ADD(x);
    }
    const int more[4][4] = {{2, 128, 32, R_ASIS},
                            {2, 128, 32, R_WARPSYNC},
                            {1, 64, 64, R_ASIS},
                            {1, 64, 64, R_WARPSYNC}};
    for (int i = 0; i < 4; i++) {
        variant x = {
            .kind = REAL, .dtype = more[i][0], .d = more[i][1], .t = more[i][2], .opt = more[i][3]};
        snprintf(x.name, sizeof x.name, "real-%s-d%d-%s", x.dtype == 2 ? "bf16" : "f16", x.d,
                 real_names[x.opt]);
        ADD(x);
    }
    /* The plain path's forward (the default on every device), bf16 D = 128, T = 32 as on a 48 KiB
     * device: as the plugin builds it for a GPU, and without forced inlining and unrolling, for
     * the driver's PTX of both (local-memory traffic of the accumulators: ld.local / st.local). */
    for (int u = 0; u < 2; u++) {
        variant x = {
            .kind = REAL, .dtype = 2, .d = 128, .t = 32, .opt = R_ASIS, .plain = 1, .nounroll = u};
        snprintf(x.name, sizeof x.name, "plain-bf16-d128%s", u ? "-nounroll" : "");
        ADD(x);
    }
#undef ADD
    return n;
}

static const fp_ocl_api *cl;
static cl_context ctx;
static cl_command_queue queue;
static cl_device_id dev;
static int nvidia, gpu;

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

/* s with every occurrence of `from` replaced by `to` (a new string), or NULL when there is none:
 * a patch that no longer applies must say so, not run the unpatched kernel. */
static char *replace_all(const char *s, const char *from, const char *to)
{
    size_t count = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + strlen(from), from))
        count++;
    if (count == 0)
        return NULL;
    char *out = malloc(strlen(s) + count * strlen(to) + 1), *o = out;
    for (const char *p = s, *q; (q = strstr(p, from)); p = q + strlen(from)) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, to, strlen(to));
        o += strlen(to);
        s = q + strlen(from);
    }
    strcpy(o, s);
    return out;
}

static int open_device(char *why, size_t n)
{
    cl = fp_ocl_load(why, n);
    if (!cl)
        return 0;
    cl_platform_id plats[16];
    cl_uint np = 0;
    if (cl->clGetPlatformIDs(16, plats, &np) != CL_SUCCESS || np == 0) {
        snprintf(why, n, "no OpenCL platform");
        return 0;
    }
    const char *want = getenv("FLASHPORT_OPENCL_PLATFORM");
    cl_device_id first = NULL;
    for (cl_uint p = 0; p < np && p < 16 && !dev; p++) {
        char name[256] = "";
        cl->clGetPlatformInfo(plats[p], CL_PLATFORM_NAME, sizeof name - 1, name, NULL);
        if (want && *want && !strstr(name, want))
            continue;
        cl_device_id ds[8];
        cl_uint nd = 0;
        if (cl->clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 8, ds, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint i = 0; i < nd && i < 8 && !dev; i++) {
            cl_device_type t = 0;
            cl->clGetDeviceInfo(ds[i], CL_DEVICE_TYPE, sizeof t, &t, NULL);
            if (!first)
                first = ds[i];
            if (t & CL_DEVICE_TYPE_GPU)
                dev = ds[i];
        }
        if (dev || first)
            nvidia = strstr(name, "NVIDIA") != NULL;
    }
    if (!dev)
        dev = first;
    cl_device_type type = 0;
    if (dev)
        cl->clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    gpu = !(type & CL_DEVICE_TYPE_CPU); /* the plugin's FP_OCL_UNROLL_ALL */
    if (!dev) {
        snprintf(why, n, "no OpenCL device");
        return 0;
    }
    cl_int err;
    ctx = cl->clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    if (err == CL_SUCCESS)
        queue = cl->clCreateCommandQueue(ctx, dev, 0, &err);
    if (err != CL_SUCCESS)
        snprintf(why, n, "context or queue: OpenCL error %d", (int)err);
    return err == CL_SUCCESS;
}

static void write_file(const char *dir, const char *name, const char *ext, const char *text,
                       size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(text, 1, n, f);
        fclose(f);
    }
}

/* Builds src with options; on failure *line gets the build log's first error line. Writes the
 * build log and (NVIDIA) the PTX to dump. Returns the program or NULL. */
static cl_program build(const char *src, const char *options, const char *dump, const char *name,
                        char *line, size_t line_n, double *ms)
{
    cl_int err;
    cl_program pr = cl->clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (err != CL_SUCCESS) {
        snprintf(line, line_n, "clCreateProgramWithSource: %d", (int)err);
        return NULL;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    err = cl->clBuildProgram(pr, 1, &dev, options, NULL, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
    size_t n = 0;
    cl->clGetProgramBuildInfo(pr, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    char *log = calloc(n + 1, 1);
    cl->clGetProgramBuildInfo(pr, dev, CL_PROGRAM_BUILD_LOG, n, log, NULL);
    if (dump) {
        char *head = malloc(strlen(options) + n + 64);
        sprintf(head, "options: %s\nclBuildProgram: %d\n%s", options, (int)err, log);
        write_file(dump, name, "log", head, strlen(head));
        free(head);
    }
    if (err != CL_SUCCESS) {
        const char *e = strstr(log, "error");
        const char *s = e ? e : log;
        snprintf(line, line_n, "OpenCL error %d: %.*s", (int)err, (int)strcspn(s, "\n"), s);
        free(log);
        cl->clReleaseProgram(pr);
        return NULL;
    }
    free(log);
    size_t bin_n = 0;
    if (dump &&
        cl->clGetProgramInfo(pr, CL_PROGRAM_BINARY_SIZES, sizeof bin_n, &bin_n, NULL) ==
            CL_SUCCESS &&
        bin_n > 0) {
        unsigned char *bin = malloc(bin_n);
        if (cl->clGetProgramInfo(pr, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS &&
            memchr(bin, 0, bin_n - 1) == NULL) /* text: NVIDIA's PTX */
            write_file(dump, name, "ptx", (const char *)bin, strnlen((char *)bin, bin_n));
        free(bin);
    }
    return pr;
}

static cl_mem buffer(size_t bytes, const void *init)
{
    cl_int err;
    cl_mem m = cl->clCreateBuffer(ctx, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes,
                                  (void *)init, &err);
    return err == CL_SUCCESS ? m : NULL;
}

/* Runs kernel k over groups x 1 x 1 work-groups of wg; the outcome as text in res. */
static int run(cl_kernel k, size_t groups, size_t wg, char *res, size_t res_n)
{
    const size_t global[3] = {groups * wg, 1, 1}, local[3] = {wg, 1, 1};
    cl_int err = cl->clEnqueueNDRangeKernel(queue, k, 3, NULL, global, local, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        snprintf(res, res_n, "refused (OpenCL error %d at launch)", (int)err);
        return 0;
    }
    err = cl->clFinish(queue);
    if (err != CL_SUCCESS) {
        snprintf(res, res_n, "fault (OpenCL error %d at clFinish)", (int)err);
        return 0;
    }
    return 1;
}

static int read_back(cl_mem m, void *dst, size_t bytes, char *res, size_t res_n)
{
    cl_int err = cl->clEnqueueReadBuffer(queue, m, CL_TRUE, 0, bytes, dst, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        snprintf(res, res_n, "fault (OpenCL error %d reading the result)", (int)err);
    return err == CL_SUCCESS;
}

/* The host side of probe_a / probe_b (tests/gpu/opencl_mma_probe.cl). */
static float probe_a(int w, int m, int k)
{
    return (float)((3 * m + 5 * k + 7 * w) % 9 - 4) * 0.5f;
}

static float probe_b(int w, int k, int n)
{
    return (float)((7 * k + 3 * n + 5 * w) % 7 - 3) * 0.25f;
}

/* Storage bits of x and back (bf16: round to nearest even; f16: exact for the probe's values,
 * which are all representable). */
static uint16_t to_bits(float x, int dtype)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if (dtype == 2)
        return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const float a = fabsf(x);
    if (a < 6.103515625e-05f) /* subnormal f16: units of 2^-24 */
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    int e;
    const float f = frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
    uint32_t mant = (uint32_t)lrintf((f * 2.0f - 1.0f) * 1024.0f), ex = (uint32_t)(e - 1 + 15);
    if (mant == 1024) {
        mant = 0;
        ex++;
    }
    return (uint16_t)(sign | ex << 10 | mant);
}

static float from_bits(uint16_t h, int dtype)
{
    if (dtype == 2) {
        const uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    const int ex = (h >> 10) & 31, mant = h & 1023;
    const float v = ex ? ldexpf(1.0f + mant / 1024.0f, ex - 15) : ldexpf((float)mant, -24);
    return h & 0x8000 ? -v : v;
}

/* Random storage values in [-1, 1): as bits and as floats. */
static void random_tile(uint16_t *bits, float *vals, size_t n, int dtype, unsigned *seed)
{
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        bits[i] = to_bits((float)(*seed >> 8) / 8388608.0f - 1.0f, dtype);
        vals[i] = from_bits(bits[i], dtype);
    }
}

/* max |got - want| over n, the index of the worst; NaN counts as infinite. */
static double max_err(const float *got, const double *want, size_t n, size_t *at)
{
    double m = 0.0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = isnan(got[i]) ? INFINITY : fabs(got[i] - want[i]);
        if (e > m) {
            m = e;
            *at = i;
        }
    }
    return m;
}

static void verdict(char *res, size_t n, const float *got, const double *want, size_t count,
                    double tol, int cols)
{
    size_t at;
    const double e = max_err(got, want, count, &at);
    if (e <= tol)
        snprintf(res, n, "ok (max err %.3g)", e);
    else
        snprintf(res, n, "wrong (max err %.3g at [%zu][%zu]: got %.6g, want %.6g)", e, at / cols,
                 at % cols, got[at], want[at]);
}

/* The frag and raw kernels: work-item l's c[i] must be C[row][col] of warp l / 32. */
static void check_frag(const float *out, int wg, char *res, size_t n)
{
    double want[128 * 4];
    for (int l = 0; l < wg; l++) {
        const int w = l / 32, lane = l % 32, g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; i++) {
            const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
            double s = (double)((l * 4 + i) % 5) * 0.125;
            for (int k = 0; k < 16; k++)
                s += (double)probe_a(w, row, k) * probe_b(w, k, col);
            want[l * 4 + i] = s;
        }
    }
    verdict(res, n, out, want, (size_t)wg * 4, 0.0, 4);
}

static cl_kernel kernel_of(cl_program pr, const char *name, char *res, size_t n)
{
    cl_int err;
    cl_kernel k = cl->clCreateKernel(pr, name, &err);
    if (err != CL_SUCCESS)
        snprintf(res, n, "error (clCreateKernel %s: %d)", name, (int)err);
    return err == CL_SUCCESS ? k : NULL;
}

static void run_raw_or_frag(const variant *v, cl_program pr, char *res, size_t n)
{
    const int wg = v->kind == RAW ? v->opt : FP_OCL_WG;
    cl_kernel k = kernel_of(pr, v->kind == RAW ? "probe_raw" : "probe_frag", res, n);
    float out[128 * 4];
    for (int i = 0; i < 128 * 4; i++)
        out[i] = NAN;
    cl_mem m = buffer(sizeof out, out);
    if (!k || !m) {
        if (k && !m)
            snprintf(res, n, "error (clCreateBuffer)");
        return;
    }
    cl->clSetKernelArg(k, 0, sizeof m, &m);
    if (v->kind == FRAG)
        cl->clSetKernelArg(k, 1, FP_OCL_WG * sizeof(float), NULL);
    if (run(k, 1, (size_t)wg, res, n) && read_back(m, out, sizeof out, res, n))
        check_frag(out, wg, res, n);
}

/* dots: S = X Y^T; mm: O = p(r, n) V. Tiles [T, D] of storage values, P multiples of 1/64. */
static void run_tiles(const variant *v, cl_program pr, char *res, size_t n)
{
    const int T = v->t, D = v->d, dt = v->dtype, LD = D + 2, LS = T | 1;
    unsigned seed = 12345;
    uint16_t *xb = malloc(sizeof *xb * T * D), *yb = malloc(sizeof *yb * T * D);
    float *xv = malloc(sizeof *xv * T * D), *yv = malloc(sizeof *yv * T * D);
    float *p = malloc(sizeof *p * T * T), *out = malloc(sizeof *out * T * (T > D ? T : D));
    double *want = malloc(sizeof *want * T * (T > D ? T : D));
    random_tile(xb, xv, (size_t)T * D, dt, &seed);
    random_tile(yb, yv, (size_t)T * D, dt, &seed);
    for (int i = 0; i < T * T; i++)
        p[i] = (float)((i * 37 + 11) % 64) / 64.0f;
    const int cols = v->kind == DOTS ? T : D;
    for (int i = 0; i < T * cols; i++)
        out[i] = NAN;
    double tol = 0.0;
    for (int r = 0; r < T; r++)
        for (int c = 0; c < cols; c++) {
            double s = 0.0, mag = 0.0;
            if (v->kind == DOTS)
                for (int d = 0; d < D; d++) {
                    s += (double)xv[r * D + d] * yv[c * D + d];
                    mag += fabs((double)xv[r * D + d] * yv[c * D + d]);
                }
            else
                for (int j = 0; j < T; j++) {
                    const double pj = v->opt ? p[j * T + r] : p[r * T + j];
                    s += pj * yv[j * D + c];
                    mag += fabs(pj * yv[j * D + c]);
                }
            want[r * cols + c] = s;
            tol = fmax(tol, 1e-6 * mag); /* f32 accumulation of exact products */
        }
    cl_kernel k = kernel_of(pr, v->kind == DOTS ? "probe_dots" : "probe_mm", res, n);
    cl_mem a = v->kind == DOTS ? buffer(sizeof *xb * T * D, xb) : buffer(sizeof *p * T * T, p);
    cl_mem b = buffer(sizeof *yb * T * D, yb), o = buffer(sizeof *out * T * cols, out);
    if (k && a && b && o) {
        cl->clSetKernelArg(k, 0, sizeof a, &a);
        cl->clSetKernelArg(k, 1, sizeof b, &b);
        cl->clSetKernelArg(k, 2, sizeof o, &o);
        const size_t tile = (size_t)T * LD * 2;
        if (v->kind == DOTS) { /* l0, l1, l2: sx, sy first or after a 16-byte pad */
            cl->clSetKernelArg(k, 3, v->pad ? 16 : tile, NULL);
            cl->clSetKernelArg(k, 4, tile, NULL);
            cl->clSetKernelArg(k, 5, v->pad ? tile : 16, NULL);
        } else {
            cl->clSetKernelArg(k, 3, (size_t)T * LS * 4, NULL);
            cl->clSetKernelArg(k, 4, tile, NULL);
        }
        if (run(k, 1, FP_OCL_WG, res, n) && read_back(o, out, sizeof *out * T * cols, res, n))
            verdict(res, n, out, want, (size_t)T * cols, tol, cols);
    } else if (k) {
        snprintf(res, n, "error (clCreateBuffer)");
    }
    free(xb), free(yb), free(xv), free(yv), free(p), free(out), free(want);
}

/* Where the driver puts the forward kernel's __local arguments (probe_addr). */
static void run_addr(const variant *v, cl_program pr, char *res, size_t n)
{
    cl_kernel k = kernel_of(pr, "probe_addr", res, n);
    cl_uint out[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    cl_mem m = buffer(sizeof out, out);
    if (!k || !m)
        return;
    size_t local[FP_OCL_MAX_LOCAL_ARGS];
    const int nl = fp_ocl_local_args(FP_OCL_KERNEL_FORWARD, v->t, v->d, FP_OCL_MMA_NV, local);
    cl->clSetKernelArg(k, 0, sizeof m, &m);
    for (int i = 0; i < nl && i < 4; i++)
        cl->clSetKernelArg(k, (cl_uint)i + 1, local[i], NULL);
    if (run(k, 1, FP_OCL_WG, res, n) && read_back(m, out, sizeof out, res, n))
        snprintf(res, n,
                 "info (__local arguments of %zu, %zu, %zu, %zu bytes at %#x, %#x, %#x, "
                 "%#x%s)",
                 local[0], local[1], local[2], local[3], out[0], out[1], out[2], out[3],
                 out[0] == 0 ? "; the first is at address 0, which a null test takes for no pointer"
                             : "");
}

/* fp_ocl_forward on B = H = 1, N tokens, against softmax(Q K^T / sqrt(D)) V in double. */
static void run_real(const variant *v, cl_program pr, int emulated, char *res, size_t n)
{
    const int D = v->d, T = v->t, dt = v->dtype, N = v->opt == R_SMALL ? T : 200;
    const int off = v->opt == R_UNALIGNED; /* rows then start 2 bytes past 16-byte alignment */
    const size_t elems = (size_t)N * D + off;
    unsigned seed = 777;
    uint16_t *qb = calloc(elems, 2), *kb = calloc(elems, 2), *vb = calloc(elems, 2);
    uint16_t *ob = calloc(elems, 2);
    float *qv = calloc(elems, 4), *kv = calloc(elems, 4), *vv = calloc(elems, 4);
    float *got = malloc(sizeof *got * N * D);
    double *want = malloc(sizeof *want * N * D), *sc = malloc(sizeof *sc * N);
    random_tile(qb + off, qv + off, (size_t)N * D, dt, &seed);
    random_tile(kb + off, kv + off, (size_t)N * D, dt, &seed);
    random_tile(vb + off, vv + off, (size_t)N * D, dt, &seed);
    const double scale = 1.0 / sqrt((double)D);
    for (int i = 0; i < N; i++) {
        double mx = -INFINITY, l = 0.0;
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int d = 0; d < D; d++)
                s += (double)qv[off + i * D + d] * kv[off + j * D + d];
            sc[j] = s * scale;
            mx = fmax(mx, sc[j]);
        }
        for (int j = 0; j < N; j++)
            l += sc[j] = exp(sc[j] - mx);
        for (int d = 0; d < D; d++) {
            double o = 0.0;
            for (int j = 0; j < N; j++)
                o += sc[j] * vv[off + j * D + d];
            want[i * D + d] = o / l;
        }
    }
    fp_ocl_args a;
    memset(&a, 0, sizeof a);
    fp_ocl_view *views[4] = {&a.q, &a.k, &a.v, &a.o};
    for (int i = 0; i < 4; i++) {
        views[i]->off = off;
        views[i]->s[0] = (long)N * D;
        views[i]->s[1] = D;
        views[i]->s[2] = D;
        views[i]->s[3] = 1;
    }
    a.lse.s[0] = N;
    a.lse.s[1] = N;
    a.lse.s[2] = 1;
    a.batch = 1, a.nq = a.nk = N, a.heads = a.kv_heads = 1, a.head_dim = D;
    a.left = a.right = -1, a.total_q = N, a.has_lse = 1;
    a.scale = (float)scale;
    cl_kernel k = kernel_of(pr, "fp_ocl_forward", res, n);
    /* q, k, v, o, lse, then cu_seqlens_q / _k, ALiBi, seqused_k and the block table (unread) */
    cl_mem bufs[10] = {buffer(elems * 2, qb),
                       buffer(elems * 2, kb),
                       buffer(elems * 2, vb),
                       buffer(elems * 2, ob),
                       buffer((size_t)N * 4, NULL),
                       buffer(64, NULL),
                       buffer(64, NULL),
                       buffer(64, NULL),
                       buffer(64, NULL),
                       buffer(64, NULL)};
    int ok = k != NULL;
    for (int i = 0; i < 10; i++)
        ok = ok && bufs[i];
    if (ok) {
        size_t local[FP_OCL_MAX_LOCAL_ARGS];
        const int nl = fp_ocl_local_args(FP_OCL_KERNEL_FORWARD, T, D,
                                         v->plain   ? FP_OCL_PLAIN
                                         : emulated ? FP_OCL_MMA_EMULATED
                                                    : FP_OCL_MMA_NV,
                                         local);
        cl_uint arg = 0;
        cl->clSetKernelArg(k, arg++, sizeof a, &a);
        for (int i = 0; i < 10; i++)
            cl->clSetKernelArg(k, arg++, sizeof(cl_mem), &bufs[i]);
        for (int i = 0; i < nl; i++)
            cl->clSetKernelArg(k, arg++, local[i], NULL);
        cl_ulong lm = 0;
        cl->clGetKernelWorkGroupInfo(k, dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof lm, &lm, NULL);
        if (run(k, (size_t)(N + T - 1) / (size_t)T, FP_OCL_WG, res, n) &&
            read_back(bufs[3], ob, elems * 2, res, n)) {
            for (int i = 0; i < N * D; i++)
                got[i] = from_bits(ob[off + i], dt);
            verdict(res, n, got, want, (size_t)N * D, dt == 2 ? 0.03 : 0.005, D);
        }
        const size_t len = strlen(res);
        snprintf(res + len, n - len, "; local memory %llu B", (unsigned long long)lm);
    } else if (k) {
        snprintf(res, n, "error (clCreateBuffer)");
    }
    free(qb), free(kb), free(vb), free(ob), free(qv), free(kv), free(vv), free(got), free(want),
        free(sc);
}

int main(int argc, char **argv)
{
    variant all[64];
    const int nv = list_variants(all, 64);
    if (argc == 2 && !strcmp(argv[1], "--list")) {
        for (int i = 0; i < nv; i++)
            printf("%s\n", all[i].name);
        return 0;
    }
    char why[512], res[512] = "", name[64];
    if (argc == 2 && !strcmp(argv[1], "--device")) {
        if (!open_device(why, sizeof why)) {
            printf("no device (%s)\n", why);
            return 0;
        }
        char dn[256] = "", ver[256] = "", cver[256] = "", drv[256] = "";
        cl->clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dn - 1, dn, NULL);
        cl->clGetDeviceInfo(dev, CL_DEVICE_VERSION, sizeof ver - 1, ver, NULL);
        cl->clGetDeviceInfo(dev, CL_DEVICE_OPENCL_C_VERSION, sizeof cver - 1, cver, NULL);
        cl->clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof drv - 1, drv, NULL);
        printf("device '%s', %s, %s, driver %s\n", dn, ver, cver, drv);
        return 0;
    }
    int emulate = 0, i = 1;
    const char *dump = NULL;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--emulate"))
            emulate = 1;
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc)
            dump = argv[++i];
    }
    if (argc - i != 3) {
        fprintf(stderr, "usage: %s --list | [--emulate] [--dump DIR] PROGRAM_CL PROBE_CL VARIANT\n",
                argv[0]);
        return 2;
    }
    const variant *v = NULL;
    for (int j = 0; j < nv; j++)
        if (!strcmp(all[j].name, argv[i + 2]))
            v = &all[j];
    if (!v) {
        fprintf(stderr, "unknown variant %s (--list)\n", argv[i + 2]);
        return 2;
    }
    snprintf(name, sizeof name, "%s%s", v->name, emulate ? "-emulated" : "");
    if (v->kind == RAW && emulate) {
        printf("%s: skip (the raw instruction has no emulation)\n", name);
        return 0;
    }
    char *program = read_text(argv[i]), *probe = read_text(argv[i + 1]);
    if (!program || !probe) {
        printf("%s: error (cannot read %s)\n", name, program ? argv[i + 1] : argv[i]);
        return 1;
    }
    if (!open_device(why, sizeof why)) {
        printf("%s: no device (%s)\n", name, why);
        return 0;
    }
    /* The program text: the probe's kernels alone (raw), after the library's helpers (its text
     * up to kernels/flash.cl), or the library's whole program, patched for the real variants. */
    const int emulated = emulate || (v->kind == REAL && v->opt == R_EMULATE);
    char *src = NULL;
    if (v->kind == RAW) {
        src = probe;
        probe = NULL;
    } else if (v->kind != REAL) {
        char *cut = strstr(program, "/* ---- backends/opencl/kernels/flash.cl ---- */");
        if (cut)
            *cut = 0;
        src = malloc(strlen(program) + strlen(probe) + 1);
        strcat(strcpy(src, program), probe);
    } else if (v->opt == R_WARPSYNC) {
        src = replace_all(program, "\"mma.sync.aligned.", "\"bar.warp.sync -1; mma.sync.aligned.");
    } else if (v->opt == R_SCRATCH) {
        src = replace_all(program, "__local float scratch[FP_OCL_SCRATCH];",
                          "__local float scratch[FP_OCL_SCRATCH];\n"
                          "    if (get_local_id(0) == 0)\n"
                          "        ((volatile __local float *)scratch)[0] = 0.0f;");
    } else if (v->opt == R_NOINLINE) {
        src = replace_all(program,
                          "#if (FP_OCL_MMA || FP_OCL_UNROLL_ALL) && !FP_OCL_MMA_EMULATE\n"
                          "#define FP_OCL_INLINE",
                          "#if 0\n#define FP_OCL_INLINE");
    } else {
        src = program;
        program = NULL;
    }
    if (!src) {
        printf("%s: error (the patch no longer applies to the program text)\n", name);
        return 1;
    }
    char options[512];
    snprintf(options, sizeof options,
             "-cl-std=CL1.2 -DFP_OCL_DTYPE=%d -DFP_OCL_D=%d -DFP_OCL_T=%d -DFP_OCL_MMA=%d "
             "-DFP_OCL_MMA_EMULATE=%d -DFP_OCL_UNROLL_ALL=%d -DPROBE_RAW=%d -DPROBE_WG=%d "
             "-DPROBE_SYNC=%d "
             "-DPROBE_COPY=%d -DPROBE_TRANSPOSED=%d -DPROBE_PAD=%d%s%s",
             v->dtype, v->d, v->t, !v->plain, emulated, gpu && !v->nounroll, v->kind == RAW,
             v->kind == RAW ? v->opt : 0, v->kind == FRAG ? v->opt : 0,
             v->kind == DOTS ? v->opt : 16, v->kind == MM ? v->opt : 0, v->pad,
             v->kind == REAL && v->opt == R_NOOPT ? " -cl-opt-disable" : "",
             nvidia ? " -cl-nv-verbose" : "");
    double ms = 0.0;
    char line[400];
    cl_program pr = build(src, options, dump, name, line, sizeof line, &ms);
    if (!pr) {
        printf("%s: skip (build refused, %s)\n", name, line);
        return 0;
    }
    if (v->kind == RAW || v->kind == FRAG)
        run_raw_or_frag(v, pr, res, sizeof res);
    else if (v->kind == REAL)
        run_real(v, pr, emulated, res, sizeof res);
    else if (v->kind == ADDR)
        run_addr(v, pr, res, sizeof res);
    else
        run_tiles(v, pr, res, sizeof res);
    printf("%s: %s; build %.0f ms\n", name, res, ms);
    return 0;
}
