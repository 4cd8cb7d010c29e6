/*
 * CUDA backend checks that the shared case table cannot make: long sequences, the memory bound,
 * the caller's stream, device selection, and determinism at a size where atomics do race.
 *
 *   test_cuda_large [--quick]
 *
 *   long     B=1 H=1 D=128 bf16, N = 16384 (causal and not) and N = 131072 (causal), forward with
 *            LSE, against a double-precision reference computed on the host for a sample of
 *            query rows (first, last and spread between: a chunk of the exact result, since a
 *            full reference at N = 131072 is 10^12 operations). Every output element must be
 *            written (the buffer is poisoned with NaN first). Also D = 64, H = 4, N = 16384
 *            (causal and not), as the shape picks it (the ping-pong kernel) and, without
 *            --quick, with FLASHPORT_CUDA_FWD_PINGPONG=0 (the 4-warp kernel).
 *   memory   N = 262144, D = 128 forward (causal) must use < 1 GiB of device memory beyond its
 *            inputs and outputs: measured as the high-water mark of the default memory pool
 *            (the backend's stream-ordered workspaces) plus the drop in free memory across the
 *            call; the backward is measured and reported too (dQ accumulator: 128 MiB).
 *   stream   a forward on a caller-created non-blocking stream, waited for with that stream
 *            alone, is bitwise equal to the same forward on the default stream.
 *   device   an out-of-range device index answers FLASHPORT_ERR_NO_DEVICE.
 *   determinism  N = 4096, H = 8, causal bf16 backward in deterministic mode ten times: bitwise
 *            identical; the atomic mode agrees with it within bf16 tolerance.
 * --quick drops N = 131072 and N = 262144 (compute-sanitizer runs).
 * Exit 77 (skip) when the CUDA backend has no device here.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */

#include "core/dtype.h"
#include "tests/test_util.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DMAX 128 /* largest head dim checked here */

typedef struct dev_problem {
    int64_t n, heads, d;
    uint16_t *hq, *hk, *hv; /* host bf16 */
    void *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
} dev_problem;

static flashport_backend *be;

static int ok(flashport_status s, const char *what)
{
    return CHECK_MSG(s == FLASHPORT_OK, "%s: %s: %s", what, flashport_status_string(s),
                     flashport_last_error());
}

static uint16_t *random_bf16(int64_t count, float range, tu_rng *r)
{
    uint16_t *x = malloc((size_t)count * 2);
    for (int64_t i = 0; x && i < count; i++)
        x[i] = fp_f32_to_bf16(tu_rng_uniform(r, -range, range));
    return x;
}

static void *upload(const void *host, size_t bytes)
{
    void *d = NULL;
    if (!ok(flashport_malloc(be, bytes, &d), "malloc"))
        return NULL;
    if (host && !ok(flashport_memcpy_to_device(be, d, host, bytes), "upload"))
        return NULL;
    return d;
}

static int setup(dev_problem *p, int64_t n, int64_t heads, int64_t d, int backward, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    p->n = n;
    p->heads = heads;
    p->d = d;
    tu_rng r = tu_rng_seed(seed);
    const int64_t count = n * heads * d;
    p->hq = random_bf16(count, 2.0f, &r);
    p->hk = random_bf16(count, 2.0f, &r);
    p->hv = random_bf16(count, 1.0f, &r);
    if (!CHECK(p->hq && p->hk && p->hv))
        return -1;
    const size_t bytes = (size_t)count * 2;
    p->q = upload(p->hq, bytes);
    p->k = upload(p->hk, bytes);
    p->v = upload(p->hv, bytes);
    p->o = upload(NULL, bytes);
    p->lse = upload(NULL, (size_t)(n * heads) * sizeof(float));
    if (!p->q || !p->k || !p->v || !p->o || !p->lse)
        return -1;
    if (backward) {
        uint16_t *hdo = random_bf16(count, 1.0f, &r);
        p->dout = upload(hdo, bytes);
        free(hdo);
        p->dq = upload(NULL, bytes);
        p->dk = upload(NULL, bytes);
        p->dv = upload(NULL, bytes);
        if (!p->dout || !p->dq || !p->dk || !p->dv)
            return -1;
    }
    return 0;
}

static void teardown(dev_problem *p)
{
    void *d[] = {p->q, p->k, p->v, p->o, p->lse, p->dout, p->dq, p->dk, p->dv};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        flashport_free(be, d[i]);
    free(p->hq);
    free(p->hk);
    free(p->hv);
    memset(p, 0, sizeof *p);
}

static flashport_tensor t4(void *data, const dev_problem *p)
{
    const int64_t shape[4] = {1, p->n, p->heads, p->d};
    return flashport_tensor_contiguous(data, FLASHPORT_BF16, 4, shape);
}

static flashport_status forward(dev_problem *p, int causal)
{
    flashport_attention_params params;
    flashport_attention_params_init(&params);
    params.causal = causal;
    const int64_t lshape[3] = {1, p->heads, p->n};
    flashport_tensor q = t4(p->q, p), k = t4(p->k, p), v = t4(p->v, p), o = t4(p->o, p);
    flashport_tensor lse = flashport_tensor_contiguous(p->lse, FLASHPORT_F32, 3, lshape);
    flashport_status s = flashport_attention_forward(be, &params, &q, &k, &v, &o, &lse);
    return s == FLASHPORT_OK ? flashport_synchronize(be) : s;
}

static flashport_status backward(dev_problem *p, int causal, int deterministic)
{
    flashport_attention_params params;
    flashport_attention_params_init(&params);
    params.causal = causal;
    params.deterministic = deterministic;
    const int64_t lshape[3] = {1, p->heads, p->n};
    flashport_tensor q = t4(p->q, p), k = t4(p->k, p), v = t4(p->v, p), o = t4(p->o, p),
                     dout = t4(p->dout, p), dq = t4(p->dq, p), dk = t4(p->dk, p), dv = t4(p->dv, p);
    flashport_tensor lse = flashport_tensor_contiguous(p->lse, FLASHPORT_F32, 3, lshape);
    flashport_status s =
        flashport_attention_backward(be, &params, &q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv);
    return s == FLASHPORT_OK ? flashport_synchronize(be) : s;
}

/* Exact row i (head 0) in double: o[p->d], returns the natural-log LSE. */
static double reference_row(const dev_problem *p, int64_t i, int causal, double *o)
{
    const int D = (int)p->d;
    const double scale = 1.0 / sqrt((double)D);
    const int64_t stride = p->heads * D, hi = causal ? i + 1 : p->n;
    double q[DMAX], m = -INFINITY, sum = 0.0;
    for (int d = 0; d < D; d++) {
        q[d] = fp_bf16_to_f32(p->hq[i * stride + d]);
        o[d] = 0.0;
    }
    double *s = malloc((size_t)hi * sizeof(double));
    for (int64_t j = 0; j < hi; j++) {
        double acc = 0.0;
        for (int d = 0; d < D; d++)
            acc += q[d] * fp_bf16_to_f32(p->hk[j * stride + d]);
        s[j] = acc * scale;
        m = s[j] > m ? s[j] : m;
    }
    for (int64_t j = 0; j < hi; j++) {
        double w = exp(s[j] - m);
        sum += w;
        for (int d = 0; d < D; d++)
            o[d] += w * fp_bf16_to_f32(p->hv[j * stride + d]);
    }
    for (int d = 0; d < D; d++)
        o[d] /= sum;
    free(s);
    return m + log(sum);
}

/* Forward at N, D and `heads` heads, checked on `rows` sampled rows of head 0; every element of O
 * must be written. `label` names the kernel the shape (and the environment) picks. */
static void check_long(int64_t n, int64_t D, int64_t heads, int causal, int rows, const char *label)
{
    dev_problem p;
    if (setup(&p, n, heads, D, 0, 1000 + (uint64_t)n + (uint64_t)causal + (uint64_t)D) != 0) {
        teardown(&p);
        return;
    }
    const int64_t row = heads * D; /* elements per token */
    const size_t bytes = (size_t)(n * row) * 2;
    uint16_t *ho = malloc(bytes);
    float *hl = malloc((size_t)(n * heads) * sizeof(float));
    if (!CHECK(ho && hl))
        return;
    tu_poison(ho, n * row, FLASHPORT_BF16);
    ok(flashport_memcpy_to_device(be, p.o, ho, bytes), "poison O");
    if (ok(forward(&p, causal), "forward") &&
        ok(flashport_memcpy_to_host(be, ho, p.o, bytes), "download O") &&
        ok(flashport_memcpy_to_host(be, hl, p.lse, (size_t)(n * heads) * sizeof(float)),
           "download LSE")) {
        int64_t bad = 0;
        for (int64_t e = 0; e < n * row; e++)
            bad += !isfinite(fp_bf16_to_f32(ho[e]));
        CHECK_MSG(bad == 0, "N=%lld: %lld elements of O not written or not finite", (long long)n,
                  (long long)bad);
        double err2 = 0.0, ref2 = 0.0, max_abs = 0.0, lse_err = 0.0;
        for (int r = 0; r < rows; r++) {
            int64_t i = r < 4 ? r : r >= rows - 4 ? n - (rows - r) : (n / rows) * r + r % 7;
            double o[DMAX];
            double lse = reference_row(&p, i, causal, o);
            for (int d = 0; d < D; d++) {
                double x = fp_bf16_to_f32(ho[i * row + d]), e = fabs(x - o[d]);
                err2 += e * e;
                ref2 += o[d] * o[d];
                max_abs = e > max_abs ? e : max_abs;
            }
            double le = fabs(hl[i] - lse); /* LSE [1, H, N]: head 0's row i */
            lse_err = le > lse_err ? le : lse_err;
        }
        double rel = sqrt(err2 / ref2);
        printf("long N=%lld D=%lld H=%lld %s%s: %d rows, O rel_l2 %.2e max_abs %.2e, LSE max_abs "
               "%.2e\n",
               (long long)n, (long long)D, (long long)heads, causal ? "causal" : "full", label,
               rows, rel, max_abs, lse_err);
        /* bf16 output rounding alone gives rel ~2e-3; P rounded to bf16 adds about as much. */
        CHECK_MSG(rel < 1e-2 && lse_err < 1e-3 * (1.0 + log((double)n)),
                  "N=%lld: rel_l2 %.3e, LSE error %.3e out of tolerance", (long long)n, rel,
                  lse_err);
    }
    free(ho);
    free(hl);
    teardown(&p);
}

static double mib(size_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* Device memory a call takes beyond what was allocated before it, in bytes. */
static size_t measure_extra(dev_problem *p, int backward_pass)
{
    cudaMemPool_t pool;
    size_t free0, free1, total;
    if (!CHECK(cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess))
        return (size_t)-1;
    uint64_t zero = 0, high = 0;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
    cudaMemGetInfo(&free0, &total);
    flashport_status s = backward_pass ? backward(p, 1, 0) : forward(p, 1);
    cudaMemGetInfo(&free1, &total);
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high);
    if (!ok(s, backward_pass ? "backward" : "forward"))
        return (size_t)-1;
    size_t dropped = free0 > free1 ? free0 - free1 : 0;
    return (size_t)high + dropped;
}

static void check_memory(void)
{
    const int64_t n = 262144, D = DMAX;
    dev_problem p;
    if (setup(&p, n, 1, D, 1, 77) == 0) {
        size_t fwd = measure_extra(&p, 0);
        size_t bwd = measure_extra(&p, 1);
        printf("memory N=%lld D=%d causal bf16: forward %.1f MiB extra, backward %.1f MiB extra "
               "(inputs+outputs %.1f MiB)\n",
               (long long)n, (int)D, mib(fwd), mib(bwd), mib((size_t)(9 * n * D * 2 + n * 4)));
        CHECK_MSG(fwd < ((size_t)1 << 30), "forward used %.1f MiB beyond its I/O", mib(fwd));
        CHECK_MSG(bwd < ((size_t)1 << 30), "backward used %.1f MiB beyond its I/O", mib(bwd));
        /* and the result is right (last rows see the most keys) */
        uint16_t *ho = malloc((size_t)(n * D) * 2);
        if (CHECK(ho) && ok(flashport_memcpy_to_host(be, ho, p.o, (size_t)(n * D) * 2), "O")) {
            double o[DMAX], err = 0.0;
            reference_row(&p, n - 1, 1, o);
            for (int d = 0; d < D; d++) {
                double e = fabs(fp_bf16_to_f32(ho[(n - 1) * D + d]) - o[d]);
                err = e > err ? e : err;
            }
            CHECK_MSG(err < 1e-2, "N=%lld last row max_abs %.3e", (long long)n, err);
        }
        free(ho);
    }
    teardown(&p);
}

static void check_stream(void)
{
    const int64_t n = 4096, heads = 4, D = DMAX;
    dev_problem p;
    memset(&p, 0, sizeof p);
    const size_t bytes = (size_t)(n * heads * D) * 2;
    uint16_t *a = malloc(bytes), *b = malloc(bytes);
    cudaStream_t stream = NULL;
    if (!CHECK(a && b) || setup(&p, n, heads, D, 0, 5) != 0 ||
        !CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess))
        goto done;
    if (!ok(forward(&p, 1), "forward (default stream)") ||
        !ok(flashport_memcpy_to_host(be, a, p.o, bytes), "download"))
        goto done;
    tu_poison(b, n * heads * D, FLASHPORT_BF16);
    ok(flashport_memcpy_to_device(be, p.o, b, bytes), "poison");
    if (!ok(flashport_set_stream(be, stream), "set_stream"))
        goto done;
    {
        flashport_attention_params params;
        flashport_attention_params_init(&params);
        params.causal = 1;
        const int64_t lshape[3] = {1, heads, n};
        flashport_tensor q = t4(p.q, &p), k = t4(p.k, &p), v = t4(p.v, &p), o = t4(p.o, &p);
        flashport_tensor lse = flashport_tensor_contiguous(p.lse, FLASHPORT_F32, 3, lshape);
        ok(flashport_attention_forward(be, &params, &q, &k, &v, &o, &lse), "forward (stream)");
    }
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    ok(flashport_memcpy_to_host(be, b, p.o, bytes), "download (stream)");
    CHECK_MSG(memcmp(a, b, bytes) == 0, "forward on the caller's stream differs from the default");
    ok(flashport_set_stream(be, NULL), "set_stream NULL");
    printf("stream: forward on a caller's non-blocking stream matches the default stream\n");
done:
    if (stream)
        cudaStreamDestroy(stream);
    free(a);
    free(b);
    teardown(&p);
}

static void check_determinism(void)
{
    const int64_t n = 4096, heads = 8, D = DMAX;
    const size_t bytes = (size_t)(n * heads * D) * 2;
    dev_problem p;
    uint16_t *first[3], *again[3];
    for (int i = 0; i < 3; i++) {
        first[i] = malloc(bytes);
        again[i] = malloc(bytes);
    }
    if (setup(&p, n, heads, D, 1, 9) == 0 && ok(forward(&p, 1), "forward")) {
        void *grads[3] = {p.dq, p.dk, p.dv};
        const char *names[3] = {"dQ", "dK", "dV"};
        enum { DET_RUNS = 10 };
        for (int run = 0; run <= DET_RUNS; run++) {
            /* runs 0 .. DET_RUNS - 1 deterministic, the last atomic */
            if (!ok(backward(&p, 1, run < DET_RUNS), "backward"))
                break;
            for (int i = 0; i < 3; i++)
                ok(flashport_memcpy_to_host(be, run == 0 ? first[i] : again[i], grads[i], bytes),
                   "download");
            for (int i = 0; i < 3 && run > 0 && run < DET_RUNS; i++)
                CHECK_MSG(memcmp(first[i], again[i], bytes) == 0,
                          "deterministic %s of run %d differs from run 0's", names[i], run);
            for (int i = 0; i < 3 && run == DET_RUNS; i++) {
                double e2 = 0.0, r2 = 0.0;
                for (int64_t e = 0; e < n * heads * D; e++) {
                    double x = fp_bf16_to_f32(again[i][e]), y = fp_bf16_to_f32(first[i][e]);
                    e2 += (x - y) * (x - y);
                    r2 += y * y;
                }
                printf("determinism: atomic vs deterministic %s rel_l2 %.2e\n", names[i],
                       sqrt(e2 / r2));
                CHECK_MSG(sqrt(e2 / r2) < 1e-2, "atomic %s differs from deterministic by %.3e",
                          names[i], sqrt(e2 / r2));
            }
        }
    }
    for (int i = 0; i < 3; i++) {
        free(first[i]);
        free(again[i]);
    }
    teardown(&p);
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    flashport_status s = flashport_backend_open("cuda", &be);
    if (s == FLASHPORT_ERR_NO_DEVICE || s == FLASHPORT_ERR_BACKEND_UNAVAILABLE) {
        printf("SKIP: %s\n", flashport_last_error());
        return TU_SKIP;
    }
    if (!ok(s, "open cuda"))
        return 1;

    flashport_backend *bad = NULL;
    s = flashport_backend_open_device("cuda", 4096, &bad);
    CHECK_MSG(s == FLASHPORT_ERR_NO_DEVICE, "device 4096: %s (%s)", flashport_status_string(s),
              flashport_last_error());
    printf("device: index 4096 -> %s: %s\n", flashport_status_string(s), flashport_last_error());
    flashport_backend_close(bad);

    check_stream();
    check_determinism();
    check_long(16384, 128, 1, 0, quick ? 8 : 64, "");
    check_long(16384, 128, 1, 1, quick ? 8 : 64, "");
    /* D = 64 with 4 heads: 256 blocks of 256 rows, so the shape takes the ping-pong kernel;
     * without --quick also the 4-warp kernel (the table covers it at short lengths) */
    for (int causal = 0; causal <= 1; causal++) {
        check_long(16384, 64, 4, causal, quick ? 8 : 32, " (by shape: ping-pong)");
        if (quick)
            continue;
        setenv("FLASHPORT_CUDA_FWD_PINGPONG", "0", 1);
        check_long(16384, 64, 4, causal, 32, " (FLASHPORT_CUDA_FWD_PINGPONG=0)");
        unsetenv("FLASHPORT_CUDA_FWD_PINGPONG");
    }
    if (!quick) {
        check_long(131072, 128, 1, 1, 24, "");
        check_memory();
    }
    flashport_backend_close(be);
    printf("%s: %d failure(s)\n", tu_failures ? "FAIL" : "PASS", tu_failures);
    return tu_failures ? 1 : 0;
}
