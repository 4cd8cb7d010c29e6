/*
 * The API of a library people embed (issue 19): versioned params, the "would this be served"
 * and workspace queries, caller-owned workspace, device enumeration, the available-backends size,
 * FLASHPORT_NUM_THREADS checked at open, flashport_convert, and DLPack import. Every new status
 * is triggered here. The test plugin "testdev" (tests/plugins/test_plugin.c, found through
 * FLASHPORT_PLUGIN_PATH) stands in for a GPU backend: it needs scratch, refuses one head dim in
 * its workspace query, and has two devices.
 */
#include "flashport.h"
#ifdef FLASHPORT_TEST_DLPACK
#include "flashport_dlpack.h"
#endif
#include "tests/test_util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int contains(const char *s, const char *needle)
{
    return s && strstr(s, needle) != NULL;
}

#define CHECK_STATUS(call, want, text)                                                             \
    do {                                                                                           \
        flashport_status st_ = (call);                                                             \
        CHECK_MSG(st_ == (want) && contains(flashport_last_error(), text),                         \
                  "%s: got %s (\"%s\"), want %s with \"%s\"", #call, flashport_status_string(st_), \
                  flashport_last_error(), flashport_status_string(want), text);                    \
    } while (0)

/* One small forward: q, o [1, 8, 2, D]; k, v [1, 8, 2, D]; lse [1, 2, 8], in host memory. */
typedef struct call {
    int64_t d;
    flashport_dtype dtype;
    unsigned char q[8 * 2 * 64 * 4], k[8 * 2 * 64 * 4], v[8 * 2 * 64 * 4], o[8 * 2 * 64 * 4];
    float lse[16];
    flashport_tensor tq, tk, tv, to, tl;
} call;

static void call_init(call *c, flashport_dtype dtype, int64_t d)
{
    memset(c, 0, sizeof *c);
    c->d = d;
    c->dtype = dtype;
    const int64_t shape[4] = {1, 8, 2, d}, lshape[3] = {1, 2, 8};
    tu_rng r = tu_rng_seed(7);
    tu_fill_uniform(c->q, 16 * d, dtype, -1, 1, &r);
    tu_fill_uniform(c->k, 16 * d, dtype, -1, 1, &r);
    tu_fill_uniform(c->v, 16 * d, dtype, -1, 1, &r);
    memset(c->o, 0xee, sizeof c->o);
    c->tq = flashport_tensor_contiguous(c->q, dtype, 4, shape);
    c->tk = flashport_tensor_contiguous(c->k, dtype, 4, shape);
    c->tv = flashport_tensor_contiguous(c->v, dtype, 4, shape);
    c->to = flashport_tensor_contiguous(c->o, dtype, 4, shape);
    c->tl = flashport_tensor_contiguous(c->lse, FLASHPORT_F32, 3, lshape);
}

static flashport_status forward(flashport_backend *be, const flashport_attention_params *p, call *c)
{
    return flashport_attention_forward(be, p, &c->tq, &c->tk, &c->tv, &c->to, &c->tl);
}

static int o_untouched(const call *c)
{
    for (size_t i = 0; i < sizeof c->o; i++)
        if (c->o[i] != 0xee)
            return 0;
    return 1;
}

/* ---- params: size and magic ------------------------------------------------------------------ */

static void test_params(flashport_backend *cpu)
{
    call c;
    flashport_attention_params p;

    /* zeroed with memset: rejected, not read as window (0, 0) */
    call_init(&c, FLASHPORT_F32, 16);
    memset(&p, 0, sizeof p);
    CHECK_STATUS(forward(cpu, &p, &c), FLASHPORT_ERR_UNINITIALIZED, "not initialized");
    CHECK(o_untouched(&c));
    CHECK(contains(flashport_last_error(), "flashport_attention_params_init"));
    /* garbage */
    memset(&p, 0x3c, sizeof p);
    CHECK_STATUS(forward(cpu, &p, &c), FLASHPORT_ERR_UNINITIALIZED, "not initialized");
    /* the magic, but a size below the first versioned struct */
    flashport_attention_params_init(&p);
    p.struct_size = 8;
    CHECK_STATUS(forward(cpu, &p, &c), FLASHPORT_ERR_UNINITIALIZED, "struct_size 8");
    /* a struct from a newer header (larger than this library's) */
    flashport_attention_params_init(&p);
    p.struct_size = (uint32_t)sizeof p + 16;
    CHECK_STATUS(forward(cpu, &p, &c), FLASHPORT_ERR_INVALID_VALUE, "newer flashport header");
    CHECK(o_untouched(&c));
    /* the supported query says the same */
    CHECK_STATUS(flashport_attention_supported(cpu, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv,
                                               &c.to, &c.tl, NULL, NULL, NULL, NULL),
                 FLASHPORT_ERR_INVALID_VALUE, "newer flashport header");

    /* init writes exactly the size it is given */
    _Alignas(16) unsigned char raw[sizeof p + 32];
    memset(raw, 0xab, sizeof raw);
    flashport_attention_params_init_sized((flashport_attention_params *)raw, 24);
    int kept = 1;
    for (size_t i = 24; i < sizeof raw; i++)
        kept &= raw[i] == 0xab;
    CHECK_MSG(kept, "params_init_sized wrote past the caller's size");
    flashport_attention_params_init_sized(NULL, sizeof p); /* no crash */
    CHECK(p.magic == FLASHPORT_PARAMS_MAGIC);

    /* An older caller: a struct that ends before the fp8 descales, followed by garbage. The call
     * reads only its size and uses the defaults beyond: same result as a full struct. */
    const size_t old_size = offsetof(flashport_attention_params, descale_q);
    memset(raw, 0xff, sizeof raw); /* NaN descales if they were read */
    flashport_attention_params *old = (flashport_attention_params *)raw;
    flashport_attention_params_init_sized(old, old_size);
    CHECK(old->struct_size == old_size && old->magic == FLASHPORT_PARAMS_MAGIC);
    old->causal = 1;
    call_init(&c, FLASHPORT_F32, 16);
    CHECK_MSG(forward(cpu, old, &c) == FLASHPORT_OK, "older struct: %s", flashport_last_error());
    float o_old[8 * 2 * 16];
    memcpy(o_old, c.o, sizeof o_old);
    flashport_attention_params_init(&p);
    p.causal = 1;
    call_init(&c, FLASHPORT_F32, 16);
    CHECK(forward(cpu, &p, &c) == FLASHPORT_OK);
    CHECK_MSG(memcmp(o_old, c.o, sizeof o_old) == 0, "older struct gives another result");
}

/* ---- supported, workspace size, caller workspace --------------------------------------------- */

static void test_queries(flashport_backend *cpu, flashport_backend *dev)
{
    call c;
    flashport_attention_params p;
    flashport_attention_params_init(&p);
    size_t bytes = 1;

    call_init(&c, FLASHPORT_F32, 16);
    CHECK(flashport_attention_supported(cpu, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv, &c.to,
                                        &c.tl, NULL, NULL, NULL, NULL) == FLASHPORT_OK);
    CHECK(flashport_attention_workspace_size(cpu, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv, &c.to,
                                             &c.tl, NULL, NULL, NULL, NULL,
                                             &bytes) == FLASHPORT_OK &&
          bytes == 0);
    CHECK(o_untouched(&c));
    /* bad input: the call's own status and message, nothing written */
    c.tk.shape[2] = 3;
    c.tv.shape[2] = 3;
    CHECK_STATUS(flashport_attention_supported(cpu, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv,
                                               &c.to, &c.tl, NULL, NULL, NULL, NULL),
                 FLASHPORT_ERR_HEAD_RATIO, "");
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", flashport_last_error());
    CHECK_STATUS(forward(cpu, &p, &c), FLASHPORT_ERR_HEAD_RATIO, msg);
    CHECK(o_untouched(&c));
    bytes = 1;
    CHECK_STATUS(flashport_attention_workspace_size(cpu, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv,
                                                    &c.to, &c.tl, NULL, NULL, NULL, NULL, &bytes),
                 FLASHPORT_ERR_HEAD_RATIO, "");
    CHECK(bytes == 0);
    CHECK_STATUS(flashport_attention_supported(cpu, (flashport_direction)5, &p, &c.tq, &c.tk, &c.tv,
                                               &c.to, &c.tl, NULL, NULL, NULL, NULL),
                 FLASHPORT_ERR_INVALID_VALUE, "direction 5");
    CHECK_STATUS(flashport_attention_workspace_size(cpu, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv,
                                                    &c.to, &c.tl, NULL, NULL, NULL, NULL, NULL),
                 FLASHPORT_ERR_NULL_POINTER, "bytes is NULL");
    /* backward: dout etc. required */
    call_init(&c, FLASHPORT_F32, 16);
    CHECK_STATUS(flashport_attention_supported(cpu, FLASHPORT_BACKWARD, &p, &c.tq, &c.tk, &c.tv,
                                               &c.to, &c.tl, NULL, NULL, NULL, NULL),
                 FLASHPORT_ERR_NULL_POINTER, "dout");

    /* set_workspace argument checks */
    CHECK_STATUS(flashport_set_workspace(cpu, NULL, 64), FLASHPORT_ERR_NULL_POINTER,
                 "workspace is NULL");
    CHECK_STATUS(flashport_set_workspace(cpu, (void *)(uintptr_t)(4096 + 8), 64),
                 FLASHPORT_ERR_INVALID_VALUE, "not aligned");
    CHECK_STATUS(flashport_set_workspace(NULL, NULL, 0), FLASHPORT_ERR_NULL_POINTER, "backend");

    if (!dev) {
        printf("testdev plugin not found: its queries are skipped\n");
        return;
    }
    /* testdev: f16, scratch of 16 bytes per (b, row, head), refuses D = 48 in its query */
    call_init(&c, FLASHPORT_F16, 16);
    CHECK(flashport_attention_workspace_size(dev, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv, &c.to,
                                             &c.tl, NULL, NULL, NULL, NULL,
                                             &bytes) == FLASHPORT_OK);
    CHECK_MSG(bytes == 8 * 2 * 16, "testdev workspace %zu", bytes);
    CHECK_STATUS(flashport_attention_supported(dev, FLASHPORT_BACKWARD, &p, &c.tq, &c.tk, &c.tv,
                                               &c.to, &c.tl, &c.tq, &c.tq, &c.tk, &c.tv),
                 FLASHPORT_ERR_UNSUPPORTED_FEATURE, "no backward");
    call_init(&c, FLASHPORT_F16, 48);
    CHECK_STATUS(flashport_attention_supported(dev, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv,
                                               &c.to, &c.tl, NULL, NULL, NULL, NULL),
                 FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM, "head dim 48");
    CHECK_STATUS(forward(dev, &p, &c), FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM, "head dim 48");
    CHECK(o_untouched(&c));
    call_init(&c, FLASHPORT_F16, 72); /* beyond the caps: the core's refusal */
    CHECK_STATUS(flashport_attention_supported(dev, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv,
                                               &c.to, &c.tl, NULL, NULL, NULL, NULL),
                 FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM, "");

    /* caller-owned workspace: too small is refused before anything runs, enough is used */
    void *ws = NULL;
    CHECK(posix_memalign(&ws, 256, 1024) == 0);
    memset(ws, 0, 1024);
    call_init(&c, FLASHPORT_F16, 16);
    CHECK(flashport_set_workspace(dev, ws, 100) == FLASHPORT_OK);
    CHECK_STATUS(flashport_attention_supported(dev, FLASHPORT_FORWARD, &p, &c.tq, &c.tk, &c.tv,
                                               &c.to, &c.tl, NULL, NULL, NULL, NULL),
                 FLASHPORT_ERR_BUFFER_TOO_SMALL, "256 bytes");
    CHECK_STATUS(forward(dev, &p, &c), FLASHPORT_ERR_BUFFER_TOO_SMALL, "256");
    CHECK(o_untouched(&c));
    CHECK(flashport_set_workspace(dev, ws, 1024) == FLASHPORT_OK);
    CHECK_MSG(forward(dev, &p, &c) == FLASHPORT_OK, "%s", flashport_last_error());
    CHECK(((unsigned char *)ws)[0] == 0x5a && ((unsigned char *)ws)[255] == 0x5a &&
          ((unsigned char *)ws)[256] == 0);
    CHECK(flashport_set_workspace(dev, NULL, 0) == FLASHPORT_OK);
    memset(ws, 0, 1024);
    CHECK(forward(dev, &p, &c) == FLASHPORT_OK && ((unsigned char *)ws)[0] == 0);
    free(ws);
}

/* ---- devices --------------------------------------------------------------------------------- */

static void test_devices(int have_dev)
{
    int n = -1;
    flashport_device_props props;
    CHECK(flashport_device_count("cpu", &n) == FLASHPORT_OK && n == 1);
    CHECK(flashport_device_properties("cpu", 0, &props) == FLASHPORT_OK);
    CHECK(props.name[0] != '\0' && props.multiprocessors >= 1 && props.total_memory > 0);
    printf("cpu device 0: %s (%s), %d CPUs, %.1f GiB\n", props.name, props.arch,
           props.multiprocessors, (double)props.total_memory / (1 << 30));
    CHECK_STATUS(flashport_device_properties("cpu", 1, &props), FLASHPORT_ERR_NO_DEVICE,
                 "one device");
    CHECK_STATUS(flashport_device_properties("cpu", -1, &props), FLASHPORT_ERR_NO_DEVICE,
                 "negative");
    CHECK_STATUS(flashport_device_count(NULL, &n), FLASHPORT_ERR_NULL_POINTER, "name");
    CHECK_STATUS(flashport_device_count("cpu", NULL), FLASHPORT_ERR_NULL_POINTER, "count");
    CHECK_STATUS(flashport_device_properties("cpu", 0, NULL), FLASHPORT_ERR_NULL_POINTER, "props");
    CHECK_STATUS(flashport_device_count("auto", &n), FLASHPORT_ERR_INVALID_VALUE, "auto");
    CHECK_STATUS(flashport_device_count("nonexistent", &n), FLASHPORT_ERR_BACKEND_UNKNOWN,
                 "nonexistent");
    /* GPU plugins where they load: every device they count must describe itself. */
    const char *gpus[] = {"cuda", "hip"};
    for (int g = 0; g < 2; g++) {
        if (flashport_device_count(gpus[g], &n) != FLASHPORT_OK)
            continue; /* plugin not built here */
        for (int i = 0; i < n; i++) {
            CHECK(flashport_device_properties(gpus[g], i, &props) == FLASHPORT_OK);
            CHECK(props.name[0] && props.arch[0] && props.total_memory > 0 &&
                  props.multiprocessors > 0);
            printf("%s device %d: %s (%s, %d.%d), %d SMs/CUs, %.1f GiB\n", gpus[g], i, props.name,
                   props.arch, props.compute_major, props.compute_minor, props.multiprocessors,
                   (double)props.total_memory / (1 << 30));
        }
        CHECK_STATUS(flashport_device_properties(gpus[g], n, &props), FLASHPORT_ERR_NO_DEVICE, "");
    }
    if (!have_dev)
        return;
    CHECK(flashport_device_count("testdev", &n) == FLASHPORT_OK && n == 2);
    CHECK(flashport_device_properties("testdev", 1, &props) == FLASHPORT_OK);
    CHECK(strcmp(props.name, "test device 1") == 0 && strcmp(props.arch, "tp_11") == 0 &&
          props.compute_major == 1 && props.compute_minor == 1 && props.multiprocessors == 4 &&
          props.total_memory == (size_t)1 << 30);
    CHECK_STATUS(flashport_device_properties("testdev", 2, &props), FLASHPORT_ERR_NO_DEVICE,
                 "no device 2");
}

/* ---- FLASHPORT_NUM_THREADS --------------------------------------------------------------------
 */

static void test_num_threads(void)
{
    const char *bad[] = {"abc", "-3", "0", "2x", "99999999999999999999", " "};
    flashport_backend *be = (flashport_backend *)1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("FLASHPORT_NUM_THREADS", bad[i], 1);
        CHECK_STATUS(flashport_backend_open("cpu", &be), FLASHPORT_ERR_INVALID_VALUE,
                     "FLASHPORT_NUM_THREADS");
        CHECK(be == NULL);
    }
    setenv("FLASHPORT_NUM_THREADS", "2", 1);
    CHECK(flashport_backend_open("cpu", &be) == FLASHPORT_OK);
    flashport_backend_close(be);
    unsetenv("FLASHPORT_NUM_THREADS");
}

/* ---- flashport_convert ------------------------------------------------------------------------
 */

/* The value of fp8 code c by its definition (double, independent of core/dtype.h). */
static double fp8_value(unsigned c, int e4m3)
{
    const int mb = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    const int e = (int)((c & 0x7fu) >> mb), m = (int)(c & ((1u << mb) - 1u));
    const double s = (c & 0x80u) ? -1.0 : 1.0;
    if (e4m3 && (c & 0x7fu) == 0x7fu)
        return NAN;
    if (!e4m3 && e == 0x1f)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * ldexp(m, 1 - bias - mb);
    return s * ldexp(1.0 + ldexp(m, -mb), e - bias);
}

/* Round-to-nearest-even by search over every code, with the saturation rules of the header. */
static unsigned fp8_nearest(double x, int e4m3)
{
    if (isnan(x))
        return 0;
    const double maxf = e4m3 ? 448.0 : 57344.0;
    if (isinf(x) && !e4m3)
        return x > 0 ? 0x7c : 0xfc;
    if (fabs(x) > maxf)
        return x > 0 ? (e4m3 ? 0x7e : 0x7b) : (e4m3 ? 0xfe : 0xfb);
    unsigned best = 0;
    double bd = INFINITY;
    for (unsigned c = 0; c < 256; c++) {
        const double v = fp8_value(c, e4m3);
        if (!isfinite(v) || (signbit(v) != signbit(x) && v != 0))
            continue;
        if ((v == 0) && signbit(v) != signbit(x))
            continue;
        const double d = fabs(v - x);
        if (d < bd || (d == bd && (c & 1u) == 0)) {
            bd = d;
            best = c;
        }
    }
    return best;
}

static void test_convert(void)
{
    for (int e4m3 = 0; e4m3 <= 1; e4m3++) {
        const flashport_dtype t = e4m3 ? FLASHPORT_FP8_E4M3 : FLASHPORT_FP8_E5M2;
        uint8_t codes[256], back[256];
        float f[256];
        for (int i = 0; i < 256; i++)
            codes[i] = (uint8_t)i;
        CHECK(flashport_convert(f, FLASHPORT_F32, codes, t, 256) == FLASHPORT_OK);
        int bad = 0;
        for (int i = 0; i < 256; i++) {
            const double want = fp8_value((unsigned)i, e4m3);
            bad += isnan(want) ? !isnan(f[i]) : (double)f[i] != want;
        }
        CHECK_MSG(bad == 0, "%s decode: %d codes wrong", flashport_dtype_name(t), bad);
        CHECK(flashport_convert(back, t, f, FLASHPORT_F32, 256) == FLASHPORT_OK);
        bad = 0;
        for (int i = 0; i < 256; i++)
            bad += isnan(f[i]) ? !isnan(fp8_value(back[i], e4m3)) : back[i] != codes[i];
        CHECK_MSG(bad == 0, "%s round trip: %d codes wrong", flashport_dtype_name(t), bad);
        /* encode: random values over the whole range, halfway points, overflow, inf, NaN */
        tu_rng r = tu_rng_seed(11 + (uint64_t)e4m3);
        enum { N = 4096 };
        float x[N];
        uint8_t got[N];
        for (int i = 0; i < N; i++) {
            const float mag =
                ldexpf(tu_rng_uniform(&r, 1.0f, 2.0f), (int)(tu_rng_u32(&r) % 40) - 22);
            x[i] = (tu_rng_u32(&r) & 1) ? -mag : mag;
        }
        for (int i = 0; i < 255; i++) { /* midpoints between neighbouring positive codes */
            const double a = fp8_value((unsigned)i, e4m3), b = fp8_value((unsigned)i + 1, e4m3);
            if (isfinite(a) && isfinite(b) && i < N / 4)
                x[i] = (float)((a + b) / 2);
        }
        x[N - 1] = INFINITY;
        x[N - 2] = -INFINITY;
        x[N - 3] = 1e30f;
        x[N - 4] = -1e30f;
        x[N - 5] = 0.0f;
        x[N - 6] = -0.0f;
        x[N - 7] = 1e-30f;
        CHECK(flashport_convert(got, t, x, FLASHPORT_F32, N) == FLASHPORT_OK);
        bad = 0;
        for (int i = 0; i < N; i++) {
            const unsigned want = fp8_nearest(x[i], e4m3);
            if (got[i] != want && bad++ < 5)
                printf("%s encode %.9g: got 0x%02x want 0x%02x\n", flashport_dtype_name(t),
                       (double)x[i], got[i], want);
        }
        CHECK_MSG(bad == 0, "%s encode: %d values wrong", flashport_dtype_name(t), bad);
        const float nan = NAN;
        uint8_t code;
        CHECK(flashport_convert(&code, t, &nan, FLASHPORT_F32, 1) == FLASHPORT_OK &&
              isnan(fp8_value(code, e4m3)));
    }
    /* f16 and bf16: every bit pattern to f32 and back is exact; f16 <-> bf16 via the value */
    static uint16_t h[65536], h2[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    const flashport_dtype half[2] = {FLASHPORT_F16, FLASHPORT_BF16};
    for (int k = 0; k < 2; k++) {
        CHECK(flashport_convert(f, FLASHPORT_F32, h, half[k], 65536) == FLASHPORT_OK);
        CHECK(flashport_convert(h2, half[k], f, FLASHPORT_F32, 65536) == FLASHPORT_OK);
        int bad = 0;
        for (int i = 0; i < 65536; i++)
            bad += isnan(f[i]) ? !isnan(f[i]) : h2[i] != h[i];
        CHECK_MSG(bad == 0, "%s round trip: %d patterns wrong", flashport_dtype_name(half[k]), bad);
    }
    const float big = 70000.0f, one_third = 1.0f / 3.0f;
    uint16_t o16;
    CHECK(flashport_convert(&o16, FLASHPORT_F16, &big, FLASHPORT_F32, 1) == FLASHPORT_OK &&
          o16 == 0x7c00);
    CHECK(flashport_convert(&o16, FLASHPORT_BF16, &one_third, FLASHPORT_F32, 1) == FLASHPORT_OK &&
          o16 == 0x3eab);
    uint16_t hb = 0x3c00; /* f16 1.0 -> bf16 1.0 */
    CHECK(flashport_convert(&o16, FLASHPORT_BF16, &hb, FLASHPORT_F16, 1) == FLASHPORT_OK &&
          o16 == 0x3f80);

    /* statuses */
    float buf[8] = {0};
    CHECK(flashport_convert(NULL, FLASHPORT_F32, NULL, FLASHPORT_F16, 0) == FLASHPORT_OK);
    CHECK_STATUS(flashport_convert(buf, (flashport_dtype)42, buf + 4, FLASHPORT_F32, 1),
                 FLASHPORT_ERR_INVALID_VALUE, "unknown dtype 42");
    CHECK_STATUS(flashport_convert(NULL, FLASHPORT_F32, buf, FLASHPORT_F16, 1),
                 FLASHPORT_ERR_NULL_POINTER, "dst");
    CHECK_STATUS(flashport_convert(buf, FLASHPORT_F32, buf + 1, FLASHPORT_F16, 4),
                 FLASHPORT_ERR_ALIASING, "overlap");
    CHECK_STATUS(flashport_convert(buf, FLASHPORT_F32, buf + 4, FLASHPORT_F16, SIZE_MAX / 2),
                 FLASHPORT_ERR_BAD_SIZE, "overflow");
}

/* ---- DLPack -----------------------------------------------------------------------------------
 */

#ifdef FLASHPORT_TEST_DLPACK
static void test_dlpack(flashport_backend *cpu)
{
    float data[2 * 3 * 4 * 5 + 1];
    int64_t shape[4] = {2, 3, 4, 5}, strides[4] = {60, 20, 5, 1};
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCPU;
    t.ndim = 4;
    t.dtype.code = kDLFloat;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    t.shape = shape;
    flashport_tensor out;
    CHECK(flashport_tensor_from_dlpack(&t, &out) == FLASHPORT_OK);
    CHECK(out.data == data && out.dtype == FLASHPORT_F32 && out.rank == 4 && out.stride[0] == 60 &&
          out.stride[3] == 1 && out.shape[2] == 4);
    t.strides = strides;
    strides[1] = 7;
    t.byte_offset = 4;
    CHECK(flashport_tensor_from_dlpack_for(cpu, &t, &out) == FLASHPORT_OK);
    CHECK(out.data == (void *)(data + 1) && out.stride[1] == 7);
    t.dtype.code = kDLBfloat;
    t.dtype.bits = 16;
    t.byte_offset = 2;
    CHECK(flashport_tensor_from_dlpack(&t, &out) == FLASHPORT_OK && out.dtype == FLASHPORT_BF16);
    t.dtype.code = kDLFloat;
    CHECK(flashport_tensor_from_dlpack(&t, &out) == FLASHPORT_OK && out.dtype == FLASHPORT_F16);

    flashport_tensor keep = out;
    DLTensor b = t;
    b.dtype.code = kDLInt;
    CHECK_STATUS(flashport_tensor_from_dlpack(&b, &out), FLASHPORT_ERR_UNSUPPORTED_DTYPE, "dtype");
    b = t;
    b.dtype.lanes = 4;
    CHECK_STATUS(flashport_tensor_from_dlpack(&b, &out), FLASHPORT_ERR_UNSUPPORTED_DTYPE, "lanes");
    b = t;
    b.device.device_type = kDLVulkan;
    CHECK_STATUS(flashport_tensor_from_dlpack(&b, &out), FLASHPORT_ERR_UNSUPPORTED_LAYOUT,
                 "device type");
    b = t;
    b.device.device_type = kDLCUDA;
    CHECK(flashport_tensor_from_dlpack(&b, &out) == FLASHPORT_OK);
    out = keep;
    CHECK_STATUS(flashport_tensor_from_dlpack_for(cpu, &b, &out), FLASHPORT_ERR_UNSUPPORTED_LAYOUT,
                 "not in the memory of backend 'cpu'");
    b = t;
    b.ndim = 5;
    CHECK_STATUS(flashport_tensor_from_dlpack(&b, &out), FLASHPORT_ERR_INVALID_VALUE, "ndim 5");
    b = t;
    b.byte_offset = 3;
    CHECK_STATUS(flashport_tensor_from_dlpack(&b, &out), FLASHPORT_ERR_BAD_STRIDE, "byte_offset");
    int64_t neg[4] = {60, -20, 5, 1}, negshape[4] = {2, -3, 4, 5};
    b = t;
    b.strides = neg;
    CHECK_STATUS(flashport_tensor_from_dlpack(&b, &out), FLASHPORT_ERR_BAD_STRIDE, "negative");
    b = t;
    b.shape = negshape;
    CHECK_STATUS(flashport_tensor_from_dlpack(&b, &out), FLASHPORT_ERR_BAD_SIZE, "size");
    CHECK_STATUS(flashport_tensor_from_dlpack(NULL, &out), FLASHPORT_ERR_NULL_POINTER, "tensor");
    CHECK_STATUS(flashport_tensor_from_dlpack_for(NULL, &t, &out), FLASHPORT_ERR_NULL_POINTER,
                 "backend");
    CHECK(memcmp(&out, &keep, sizeof out) == 0); /* failures leave *out alone */

    /* an imported tensor runs: q = k = v from one DLPack f32 [1, 4, 1, 5] view */
    float qkv[20], o[20];
    for (int i = 0; i < 20; i++)
        qkv[i] = (float)i / 20.0f;
    int64_t s4[4] = {1, 4, 1, 5};
    DLTensor dq = t, dout = t;
    dq.data = qkv;
    dq.shape = s4;
    dq.strides = NULL;
    dq.byte_offset = 0;
    dq.dtype.bits = 32;
    dout = dq;
    dout.data = o;
    flashport_tensor tq, to;
    CHECK(flashport_tensor_from_dlpack_for(cpu, &dq, &tq) == FLASHPORT_OK);
    CHECK(flashport_tensor_from_dlpack_for(cpu, &dout, &to) == FLASHPORT_OK);
    flashport_attention_params p;
    flashport_attention_params_init(&p);
    CHECK_MSG(flashport_attention_forward(cpu, &p, &tq, &tq, &tq, &to, NULL) == FLASHPORT_OK, "%s",
              flashport_last_error());
}
#endif

int main(void)
{
    flashport_backend *cpu = NULL, *dev = NULL;
    test_num_threads();
    if (flashport_backend_open("cpu", &cpu) != FLASHPORT_OK) {
        fprintf(stderr, "cannot open cpu: %s\n", flashport_last_error());
        return 1;
    }
    if (flashport_backend_open("testdev", &dev) != FLASHPORT_OK)
        dev = NULL;
    test_params(cpu);
    test_queries(cpu, dev);
    test_devices(dev != NULL);
    test_convert();
#ifdef FLASHPORT_TEST_DLPACK
    test_dlpack(cpu);
#else
    printf("built without dlpack.h: DLPack import not tested\n");
#endif
    flashport_backend_close(dev);
    flashport_backend_close(cpu);
    return tu_finish("test_api", "all checks passed");
}
