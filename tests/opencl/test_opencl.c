/*
 * The OpenCL backend's tile planner (backends/opencl/ocl_plan.h, pure: runs without a device)
 * against the table in docs/opencl.md, then its host side on whatever OpenCL device the machine
 * has (PoCL in CI):
 *   - device choice: FLASHPORT_OPENCL_PLATFORM matching nothing and an index out of range are
 *     FLASHPORT_ERR_NO_DEVICE with the reason;
 *   - pointers: arithmetic inside an allocation works; a pointer that is not inside one of the
 *     handle's allocations (a host pointer, past the end, freed) is FLASHPORT_ERR_INVALID_VALUE
 *     and nothing is copied; one buffer past the device's limit is FLASHPORT_ERR_OUT_OF_MEMORY;
 *   - the caller's queue: a queue of the caller's own context is adopted while the handle holds
 *     no allocations, gives the same bits as the handle's own queue, and is refused while it
 *     holds some;
 *   - flashport_timer on OpenCL markers gives a positive time;
 *   - device enumeration: the count, device 0's properties (the device a handle opens), an index
 *     past the end, a platform filter matching nothing (count 0, OK);
 *   - the caller's workspace: the backward's size query, the same bits as without one (also at
 *     an offset inside a larger allocation), too small refused before anything is written, a
 *     pointer that is not the handle's refused;
 *   - FLASHPORT_OPENCL_BWD read at open: the backward's size query and the call agree (bf16 on
 *     the emulated FA2-shaped kernels, the environment changed between open, query and call);
 *   - the emulated FA2-shaped forward and backward give the same bits on every run, on as many
 *     threads as the device uses;
 *   - the emulated FA2-shaped backward's fast path (full blocks) with rows whose LSE is -inf or
 *     NaN: their dQ exactly 0, as on the exact path (FLASHPORT_OPENCL_BWD_FAST=0), whose dQ, dK
 *     and dV it matches within bf16's rounding.
 * Every failing check prints its file, line and the reason (flashport_last_error where there is
 * one) on stderr, and each group of checks says on stdout that it starts, so a log shows which
 * group a failure belongs to on any driver. Exit 77 (skipped) when the machine has no OpenCL
 * device and the planner checks passed. `test_opencl --no-device` runs where the ICD loader
 * finds no platform (ctest points OCL_ICD_VENDORS nowhere): opening is FLASHPORT_ERR_NO_DEVICE,
 * the device count 0 with FLASHPORT_OK.
 */
#define _POSIX_C_SOURCE          200809L /* setenv */
#define CL_TARGET_OPENCL_VERSION 120

#include "backends/opencl/ocl_plan.h"
#include "tests/test_util.h"

#include <CL/cl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { B = 1, N = 37, H = 2, D = 24, ELEMS = B * N * H * D };

/* A call's status against the one expected, naming both and the library's message. */
#define EXPECT(call, want, what)                                                                   \
    do {                                                                                           \
        const flashport_status got_ = (call);                                                      \
        CHECK_MSG(got_ == (want), "%s: got %s, want %s (last error: %s)", what,                    \
                  flashport_status_string(got_), flashport_status_string(want),                    \
                  flashport_last_error());                                                         \
    } while (0)

static double host_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void section(const char *name)
{
    printf("== %s\n", name);
}

/* The fixed problem of every device check (causal, f32, B N H D) in handle be's memory. */
enum { PQ, PK, PV, PO, PDO, PDQ, PDK, PDV, PLSE, NBUF };

typedef struct problem {
    flashport_backend *be;
    void *buf[NBUF];
    flashport_tensor t[NBUF];
    flashport_attention_params params;
} problem;

static void problem_free(problem *p)
{
    for (int i = 0; i < NBUF; i++)
        if (p->buf[i])
            flashport_free(p->be, p->buf[i]);
    memset(p, 0, sizeof *p);
}

/* Allocates every tensor (dtype: f32, or f16 / bf16 for the tensor-core variant's checks; the
 * LSE is f32) and fills q, k, v and dO with values of a fixed seed. */
static flashport_status problem_make_as(flashport_backend *be, problem *p, flashport_dtype dtype)
{
    static const int64_t shape[4] = {B, N, H, D}, lse_shape[3] = {B, H, N};
    static float x[ELEMS], xs[ELEMS];
    const size_t es = dtype == FLASHPORT_F32 ? sizeof(float) : 2;
    memset(p, 0, sizeof *p);
    p->be = be;
    flashport_attention_params_init(&p->params);
    p->params.causal = 1;
    tu_rng r = tu_rng_seed(7);
    flashport_status s = FLASHPORT_OK;
    for (int i = 0; i < NBUF && s == FLASHPORT_OK; i++) {
        const size_t bytes = i == PLSE ? (size_t)(B * H * N) * sizeof(float) : ELEMS * es;
        s = flashport_malloc(be, bytes, &p->buf[i]);
        p->t[i] = i == PLSE ? flashport_tensor_contiguous(p->buf[i], FLASHPORT_F32, 3, lse_shape)
                            : flashport_tensor_contiguous(p->buf[i], dtype, 4, shape);
        if (s == FLASHPORT_OK && (i <= PV || i == PDO)) {
            for (int e = 0; e < ELEMS; e++)
                x[e] = tu_rng_uniform(&r, -1.0f, 1.0f);
            s = flashport_convert(xs, dtype, x, FLASHPORT_F32, ELEMS);
            if (s == FLASHPORT_OK)
                s = flashport_memcpy_to_device(be, p->buf[i], xs, bytes);
        }
    }
    if (s != FLASHPORT_OK)
        problem_free(p);
    return s;
}

static flashport_status problem_make(flashport_backend *be, problem *p)
{
    return problem_make_as(be, p, FLASHPORT_F32);
}

static flashport_status problem_forward(problem *p)
{
    const flashport_tensor *t = p->t;
    return flashport_attention_forward(p->be, &p->params, &t[PQ], &t[PK], &t[PV], &t[PO], &t[PLSE]);
}

static flashport_status problem_backward(problem *p)
{
    const flashport_tensor *t = p->t;
    return flashport_attention_backward(p->be, &p->params, &t[PQ], &t[PK], &t[PV], &t[PO], &t[PLSE],
                                        &t[PDO], &t[PDQ], &t[PDK], &t[PDV]);
}

static flashport_status problem_bytes(problem *p, flashport_direction dir, size_t *bytes)
{
    const flashport_tensor *t = p->t;
    const int bwd = dir == FLASHPORT_BACKWARD;
    return flashport_attention_workspace_size(
        p->be, dir, &p->params, &t[PQ], &t[PK], &t[PV], &t[PO], &t[PLSE], bwd ? &t[PDO] : NULL,
        bwd ? &t[PDQ] : NULL, bwd ? &t[PDK] : NULL, bwd ? &t[PDV] : NULL, bytes);
}

/* Copies n consecutive tensors from `first` (each ELEMS floats) to host. */
static flashport_status problem_read(problem *p, int first, int n, float *host)
{
    flashport_status s = FLASHPORT_OK;
    for (int i = 0; i < n && s == FLASHPORT_OK; i++)
        s = flashport_memcpy_to_host(p->be, host + (size_t)i * ELEMS, p->buf[first + i],
                                     ELEMS * sizeof(float));
    return s;
}

/* Forward of the fixed problem through handle be; O into o_host. */
static flashport_status forward(flashport_backend *be, float *o_host)
{
    problem p;
    flashport_status s = problem_make(be, &p);
    if (s == FLASHPORT_OK)
        s = problem_forward(&p);
    if (s == FLASHPORT_OK)
        s = problem_read(&p, PO, 1, o_host);
    problem_free(&p);
    return s;
}

/* docs/opencl.md's tile table: PoCL (1 MiB of local memory) and a 48 KiB device (NVIDIA), the
 * plain path, and on the 48 KiB device the tensor-core variant for bf16 / f16 (16-bit tiles). */
static void check_plan(void)
{
    static const struct {
        int64_t d, cls, pocl_fwd, pocl_bwd, kib48_fwd, kib48_bwd, mma_fwd, mma_bwd;
    } want[] = {
        {1, 16, 64, 64, 64, 32, 64, 64},   {16, 16, 64, 64, 64, 32, 64, 64},
        {24, 32, 64, 64, 64, 32, 64, 32},  {40, 64, 64, 64, 32, 32, 64, 32},
        {64, 64, 64, 64, 32, 32, 64, 32},  {72, 96, 32, 32, 32, 16, 32, 32},
        {96, 96, 32, 32, 32, 16, 32, 32},  {128, 128, 32, 32, 32, 16, 32, 32},
        {160, 192, 16, 16, 16, 8, 16, 16}, {192, 192, 16, 16, 16, 8, 16, 16},
        {200, 256, 16, 16, 16, 8, 16, 16}, {256, 256, 16, 16, 16, 8, 16, 16},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const int64_t c = fp_ocl_dim_class(want[i].d);
        int64_t got[8] = {fp_ocl_tile(FP_OCL_FORWARD, c, 1 << 20, FP_OCL_PLAIN),
                          fp_ocl_tile(FP_OCL_BACKWARD, c, 1 << 20, FP_OCL_PLAIN),
                          fp_ocl_tile(FP_OCL_FORWARD, c, 48 << 10, FP_OCL_PLAIN),
                          fp_ocl_tile(FP_OCL_BACKWARD, c, 48 << 10, FP_OCL_PLAIN)};
        const int v[4] = {
            fp_ocl_plan(FP_OCL_FORWARD, c, 48 << 10, FP_OCL_MMA_NV, 0, &got[4]),
            fp_ocl_plan(FP_OCL_BACKWARD, c, 48 << 10, FP_OCL_MMA_NV, 0, &got[5]),
            fp_ocl_plan(FP_OCL_FORWARD, c, 48 << 10, FP_OCL_MMA_NV, 1, &got[6]), /* f32 */
            fp_ocl_plan(FP_OCL_BACKWARD, c, 48 << 10, FP_OCL_PLAIN, 0, &got[7])};
        CHECK_MSG(c == want[i].cls && got[0] == want[i].pocl_fwd && got[1] == want[i].pocl_bwd &&
                      got[2] == want[i].kib48_fwd && got[3] == want[i].kib48_bwd &&
                      got[4] == want[i].mma_fwd && got[5] == want[i].mma_bwd &&
                      v[0] == FP_OCL_MMA_NV && v[1] == FP_OCL_MMA_NV && v[2] == FP_OCL_PLAIN &&
                      got[6] == got[2] && v[3] == FP_OCL_PLAIN && got[7] == got[3],
                  "D %lld: class %lld, tiles %lld %lld %lld %lld, tensor-core %lld %lld "
                  "(variants %d %d), f32 %lld (%d), no tensor cores %lld (%d)",
                  (long long)want[i].d, (long long)c, (long long)got[0], (long long)got[1],
                  (long long)got[2], (long long)got[3], (long long)got[4], (long long)got[5], v[0],
                  v[1], (long long)got[6], v[2], (long long)got[7], v[3]);
    }
    CHECK(fp_ocl_dim_class(257) == 0);
    CHECK(fp_ocl_tile(FP_OCL_BACKWARD, 256, 16 << 10, FP_OCL_PLAIN) == 0); /* unsupported */
    /* The emulation's scratch (its kernels' last __local argument) counts against local memory:
     * 6 KiB less room than the real one, whose own array is one float (16 bytes rounded). */
    CHECK(fp_ocl_tile_local_bytes(FP_OCL_FORWARD, 32, 128, FP_OCL_MMA_EMULATED) ==
          fp_ocl_tile_local_bytes(FP_OCL_FORWARD, 32, 128, FP_OCL_MMA_NV) + 6144 - 16);
    /* Where 16-bit tiles of 16 rows do not fit (34 KiB, D = 256: only 8 rows), the plain path
     * serves, with its own 8-row tiles. */
    int64_t t = -1;
    CHECK(fp_ocl_plan(FP_OCL_BACKWARD, 256, 34 << 10, FP_OCL_MMA_NV, 0, &t) == FP_OCL_PLAIN &&
          t == 8 && fp_ocl_tile(FP_OCL_BACKWARD, 256, 34 << 10, FP_OCL_MMA_NV) == 8);
}

/* Every program a 48 KiB device (NVIDIA's CL_DEVICE_LOCAL_MEM_SIZE) can be given, for every head
 * dim 1..256, storage type, direction and device variant, tensor-core builds refused or not:
 * each of its three kernels' local memory, counted argument by argument as the launches pass
 * them (each argument and the kernel's own array rounded up to 16 bytes), fits; the tile is the
 * largest that fits (twice it would not, or breaks the register rule); the tensor-core variant
 * is chosen for f16 / bf16 exactly where its tiles have 16 rows or more, and the plain path's
 * plan (a refused build's fallback) does not depend on the variant the device has. */
static void check_plan_48k(void)
{
    const size_t local = 48 << 10;
    int programs = 0;
    for (int64_t hd = 1; hd <= 256; hd++)
        for (int kind = FP_OCL_FORWARD; kind <= FP_OCL_BACKWARD; kind++)
            for (int f32 = 0; f32 <= 1; f32++)
                for (int device = FP_OCL_PLAIN; device <= FP_OCL_MMA_EMULATED; device++) {
                    const int64_t c = fp_ocl_dim_class(hd);
                    int64_t t = 0, tp = 0;
                    const int v = fp_ocl_plan(kind, c, local, device, f32, &t);
                    const int plain = fp_ocl_plan(kind, c, local, FP_OCL_PLAIN, f32, &tp);
                    size_t worst = 0;
                    for (int k = FP_OCL_KERNEL_FORWARD; k <= FP_OCL_KERNEL_DKDV; k++) {
                        if ((k == FP_OCL_KERNEL_FORWARD) != (kind == FP_OCL_FORWARD))
                            continue;
                        const size_t b = fp_ocl_kernel_local_bytes(k, t, c, v);
                        worst = b > worst ? b : worst;
                    }
                    const int64_t t2 = 2 * t;
                    const int larger_fits = t2 <= 64 && (t2 / 8) * ((c + 15) / 16) <= FP_OCL_ACC &&
                                            fp_ocl_tile_local_bytes(kind, t2, c, v) <= local;
                    const int want_mma =
                        device != FP_OCL_PLAIN && !f32 && fp_ocl_tile(kind, c, local, device) >= 16;
                    CHECK_MSG(t >= 8 && worst <= local &&
                                  worst == fp_ocl_tile_local_bytes(kind, t, c, v) && !larger_fits &&
                                  (v != FP_OCL_PLAIN) == want_mma &&
                                  (v == FP_OCL_PLAIN || v == device) && plain == FP_OCL_PLAIN &&
                                  (v != FP_OCL_PLAIN || t == tp) && (v == FP_OCL_PLAIN || t >= 16),
                              "48 KiB, D %lld (class %lld), %s, %s storage, device variant %d: "
                              "variant %d, T %lld (plain %lld), %zu bytes, a larger tile fits: %d",
                              (long long)hd, (long long)c, kind ? "backward" : "forward",
                              f32 ? "f32" : "16-bit", device, v, (long long)t, (long long)tp, worst,
                              larger_fits);
                    programs++;
                }
    CHECK(programs == 256 * 2 * 2 * 3);
}

/* The FA2 device variants (kernels/flash_fa2.cl) on a 48 KiB device: f16 / bf16 forwards at
 * every head-dim class, backwards at classes up to FP_OCL_FA2_BWD_D (128) and one-kernel
 * backwards (FP_OCL_BACKWARD_FUSED) at every class plan on them with T = 64 and three local
 * arguments per kernel that fit (the staging tile, then per-row values or v transposed, then the
 * flags; the fused kernel more, below); every other call plans exactly as on their tile-shaped
 * counterparts, so the two-kernel backwards of the larger head dims (deterministic calls) keep
 * their programs. */
static void check_plan_fa2(void)
{
    const size_t local = 48 << 10;
    for (int64_t hd = 1; hd <= 256; hd++)
        for (int kind = FP_OCL_FORWARD; kind <= FP_OCL_BACKWARD_FUSED; kind++)
            for (int f32 = 0; f32 <= 1; f32++)
                for (int device = FP_OCL_FA2_NV; device <= FP_OCL_FA2_EMULATED; device++) {
                    const int64_t c = fp_ocl_dim_class(hd);
                    int64_t t = 0, tt = 0;
                    const int v = fp_ocl_plan(kind, c, local, device, f32, &t);
                    const int vt =
                        fp_ocl_plan(kind, c, local, fp_ocl_tile_variant(device), f32, &tt);
                    size_t bytes[FP_OCL_MAX_LOCAL_ARGS];
                    const int fa2 = !f32 && (kind == FP_OCL_FORWARD ||
                                             kind == FP_OCL_BACKWARD_FUSED || c <= 128);
                    int ok =
                        fa2 ? v == device && t == 64 : v == vt && t == tt && !fp_ocl_variant_fa2(v);
                    for (int k = FP_OCL_KERNEL_FORWARD; fa2 && k <= FP_OCL_KERNEL_DKDV; k++)
                        if ((k == FP_OCL_KERNEL_FORWARD) == (kind == FP_OCL_FORWARD) &&
                            (kind == FP_OCL_FORWARD || c <= 128))
                            ok = ok &&
                                 fp_ocl_local_args(k, t, c, v, bytes) ==
                                     3 + fp_ocl_variant_emulated(v) &&
                                 fp_ocl_kernel_local_bytes(k, t, c, v) <= local;
                    CHECK_MSG(ok,
                              "48 KiB, D %lld (class %lld), %s, %s storage, FA2 device variant "
                              "%d: variant %d, T %lld (tile-shaped: variant %d, T %lld)",
                              (long long)hd, (long long)c,
                              kind == FP_OCL_FORWARD    ? "forward"
                              : kind == FP_OCL_BACKWARD ? "backward"
                                                        : "one-kernel backward",
                              f32 ? "f32" : "16-bit", device, v, (long long)t, vt, (long long)tt);
                }
    /* D = 128: q / k 64 x 136 and v^T 128 x 72 16-bit, 2 x 64 flags, + 16 bytes each, and the
     * real variant's one-float array */
    CHECK(fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_FORWARD, 64, 128, FP_OCL_FA2_NV) ==
          64 * 136 * 2 + 16 + 128 * 72 * 2 + 16 + 512 + 16 + 16);
    /* above class 128 the forward's key blocks have 32 keys and its passes (V transposed) 192
     * dims at D = 192, 128 at D = 256 (two passes) */
    CHECK(fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_FORWARD, 64, 192, FP_OCL_FA2_NV) ==
          32 * 200 * 2 + 16 + 192 * 40 * 2 + 16 + 256 + 16 + 16);
    CHECK(fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_FORWARD, 64, 256, FP_OCL_FA2_NV) ==
          32 * 264 * 2 + 16 + 128 * 40 * 2 + 16 + 256 + 16 + 16);
    /* the backward's: the staging tile, and small per-row arrays */
    CHECK(fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_DQ, 64, 128, FP_OCL_FA2_NV) ==
          64 * 136 * 2 + 16 + 256 + 16 + 2 * FP_OCL_FA2_BK * 4 + 16 + 16);
    CHECK(fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_DKDV, 64, 128, FP_OCL_FA2_NV) ==
          64 * 136 * 2 + 16 + 2 * (2 * 16 * 4 + 16) + 16);
    /* up to class 64 query blocks of 32 rows by default: the staging tile holds q and dO of one,
     * row-major and by row pairs, 4 x 32 rows (more than the 64 keys); 16 where asked for */
    CHECK(FP_OCL_FA2_BQ(64) == 32 && FP_OCL_FA2_BQ(16) == 32 && FP_OCL_FA2_BQ(96) == 16 &&
          FP_OCL_FA2_BQ(256) == 16);
    CHECK(fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_DKDV, 64, 64, FP_OCL_FA2_NV) ==
          128 * 72 * 2 + 16 + 2 * (2 * 32 * 4 + 16) + 16);
    CHECK(fp_ocl_kernel_local_bytes_bq(FP_OCL_KERNEL_DKDV, 64, 64, FP_OCL_FA2_NV, 16) ==
          64 * 72 * 2 + 16 + 2 * (2 * 16 * 4 + 16) + 16);
    CHECK(fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_FUSED, 64, 64, FP_OCL_FA2_NV) ==
          fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_DKDV, 64, 64, FP_OCL_FA2_NV) + 64 * 72 * 2 + 16 +
              32 * 72 * 2 + 16 + 256 + 16);
    /* the one-kernel backward's: the dK / dV kernel's, a K tile, dS [BQ, 72] 16-bit and 64 key
     * flags; it fits 48 KiB at every FA2 head-dim class, its preparation and dQ conversion take
     * no local argument, and the tile-shaped and plain variants have none of it */
    CHECK(fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_FUSED, 64, 128, FP_OCL_FA2_NV) ==
          fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_DKDV, 64, 128, FP_OCL_FA2_NV) + 64 * 136 * 2 +
              16 + 16 * 72 * 2 + 16 + 256 + 16);
    for (int64_t c = 16; c != 0; c = fp_ocl_dim_class(c + 1)) {
        size_t bytes[FP_OCL_MAX_LOCAL_ARGS];
        CHECK_MSG(fp_ocl_fused_fits(64, c, local, FP_OCL_FA2_NV) &&
                      fp_ocl_fused_fits(64, c, local, FP_OCL_FA2_EMULATED) &&
                      fp_ocl_local_args(FP_OCL_KERNEL_FUSED, 64, c, FP_OCL_FA2_NV, bytes) ==
                          (c <= 128 ? 6 : 7) &&
                      fp_ocl_local_args(FP_OCL_KERNEL_PREP, 64, c, FP_OCL_FA2_NV, bytes) == 0 &&
                      fp_ocl_local_args(FP_OCL_KERNEL_DQ_OUT, 64, c, FP_OCL_FA2_NV, bytes) == 0,
                  "the fused backward's local memory at head-dim class %lld", (long long)c);
    }
    /* above class 128: 32 keys a work-group, K's rows then q and dO of 16 rows by row pairs, the
     * same for K's copy for dS K (V's rows first), dS [BQ, 40], 32 key flags, and the two roles'
     * exchanged C fragments, 4 warps x 8 floats x 32 lanes */
    CHECK(fp_ocl_kernel_local_bytes(FP_OCL_KERNEL_FUSED, 64, 256, FP_OCL_FA2_NV) ==
          32 * 264 * 2 + 16 + 2 * (2 * 16 * 4 + 16) + 32 * 264 * 2 + 16 + 16 * 40 * 2 + 16 + 128 +
              16 + 4096 + 16 + 16);
    {
        int64_t t = 0;
        CHECK(fp_ocl_plan(FP_OCL_BACKWARD_FUSED, 256, local, FP_OCL_FA2_NV, 0, &t) ==
                  FP_OCL_FA2_NV &&
              t == 64);
        CHECK(fp_ocl_plan(FP_OCL_BACKWARD, 256, local, FP_OCL_FA2_NV, 0, &t) == FP_OCL_MMA_NV &&
              t == 16);
        CHECK(fp_ocl_plan(FP_OCL_BACKWARD_FUSED, 256, 36 << 10, FP_OCL_FA2_NV, 0, &t) ==
              FP_OCL_MMA_NV);
    }
    CHECK(!fp_ocl_fused_fits(64, 128, 32 << 10, FP_OCL_FA2_NV));
    CHECK(!fp_ocl_fused_fits(32, 128, local, FP_OCL_MMA_NV) &&
          !fp_ocl_fused_fits(32, 128, local, FP_OCL_PLAIN));
}

/* A copy of environment variable `name` as the test found it (NULL where unset; free it), and
 * the variable put back so after the checks that change it. */
static char *env_copy(const char *name)
{
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void restore_env(const char *name, const char *saved)
{
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
}

static void check_device_choice(const char *saved_platform)
{
    section("device choice");
    flashport_backend *be = NULL;
    setenv("FLASHPORT_OPENCL_PLATFORM", "no such platform", 1);
    flashport_status s = flashport_backend_open("opencl", &be);
    CHECK_MSG(s == FLASHPORT_ERR_NO_DEVICE && strstr(flashport_last_error(), "no such platform"),
              "platform filter: %s: %s", flashport_status_string(s), flashport_last_error());
    int n = -1;
    EXPECT(flashport_device_count("opencl", &n), FLASHPORT_OK, "device count, no platform");
    CHECK_MSG(n == 0, "platform filter matching nothing: %d devices, want 0", n);
    restore_env("FLASHPORT_OPENCL_PLATFORM", saved_platform);
    s = flashport_backend_open_device("opencl", 4096, &be);
    CHECK_MSG(s == FLASHPORT_ERR_NO_DEVICE && strstr(flashport_last_error(), "no device 4096"),
              "index out of range: %s: %s", flashport_status_string(s), flashport_last_error());
}

/* Device 0's properties into *p0 (the device every handle here opens). */
static void check_enumeration(flashport_device_props *p0)
{
    section("device enumeration");
    int n = -1;
    flashport_device_props p;
    EXPECT(flashport_device_count("opencl", &n), FLASHPORT_OK, "device count");
    CHECK_MSG(n >= 1, "device count %d with a device open", n);
    memset(p0, 0, sizeof *p0);
    EXPECT(flashport_device_properties("opencl", 0, p0), FLASHPORT_OK, "device 0 properties");
    printf("device 0 of %d: '%s', %s (%d.%d), %zu MiB, %d compute units\n", n, p0->name, p0->arch,
           p0->compute_major, p0->compute_minor, p0->total_memory >> 20, p0->multiprocessors);
    CHECK_MSG(p0->name[0] && p0->arch[0] && p0->total_memory > 0 && p0->multiprocessors > 0,
              "device 0 properties incomplete: name '%s' arch '%s' memory %zu units %d", p0->name,
              p0->arch, p0->total_memory, p0->multiprocessors);
    EXPECT(flashport_device_properties("opencl", n, &p), FLASHPORT_ERR_NO_DEVICE,
           "properties of the device past the last");
}

static void check_pointers(flashport_backend *be)
{
    section("pointers");
    char *buf = NULL, host[64], back[64];
    for (int i = 0; i < 64; i++)
        host[i] = (char)i;
    EXPECT(flashport_malloc(be, 256, (void **)&buf), FLASHPORT_OK, "malloc 256");
    if (!buf)
        return;
    EXPECT(flashport_memcpy_to_device(be, buf + 100, host, 64), FLASHPORT_OK, "copy into +100");
    memset(back, 0, sizeof back);
    EXPECT(flashport_memcpy_to_host(be, back, buf + 100, 64), FLASHPORT_OK, "copy from +100");
    CHECK_MSG(memcmp(back, host, 64) == 0, "bytes copied to +100 and back differ");
    EXPECT(flashport_memcpy_to_device(be, buf + 200, host, 64), FLASHPORT_ERR_INVALID_VALUE,
           "copy past the end");
    CHECK_MSG(strstr(flashport_last_error(), "not inside one allocation") != NULL,
              "past the end: message '%s'", flashport_last_error());
    EXPECT(flashport_memcpy_to_device(be, host, back, 64), FLASHPORT_ERR_INVALID_VALUE,
           "copy to a host pointer");
    EXPECT(flashport_free(be, buf + 8), FLASHPORT_ERR_INVALID_VALUE, "free inside");
    EXPECT(flashport_free(be, buf), FLASHPORT_OK, "free");
    EXPECT(flashport_memcpy_to_host(be, back, buf, 16), FLASHPORT_ERR_INVALID_VALUE,
           "copy from freed");
    void *huge = NULL;
    EXPECT(flashport_malloc(be, SIZE_MAX / 2, &huge), FLASHPORT_ERR_OUT_OF_MEMORY,
           "one buffer past the device's limit");
    CHECK_MSG(!huge && strstr(flashport_last_error(), "CL_DEVICE_MAX_MEM_ALLOC_SIZE"),
              "one buffer past the limit: pointer %p, message '%s'", huge, flashport_last_error());
}

static void check_timer(flashport_backend *be, const char *which)
{
    printf("== timer (%s)\n", which);
    flashport_timer *t = NULL;
    static float o[ELEMS];
    float ms = -1.0f;
    EXPECT(flashport_timer_create(be, &t), FLASHPORT_OK, "timer create");
    if (!t)
        return;
    const double t0 = host_ms();
    EXPECT(flashport_timer_start(t), FLASHPORT_OK, "timer start");
    EXPECT(forward(be, o), FLASHPORT_OK, "timed forward");
    EXPECT(flashport_timer_stop(t), FLASHPORT_OK, "timer stop");
    EXPECT(flashport_timer_elapsed_ms(t, &ms), FLASHPORT_OK, "timer elapsed");
    const double wall = host_ms() - t0;
    printf("timer (%s): %.3f ms of %.3f ms host time\n", which, ms, wall);
    /* The device's interval lies inside the host's (its clock may differ by a little). */
    CHECK_MSG(ms > 0.0f && ms <= 1.05 * wall + 0.1,
              "timer (%s): %g ms, want > 0 and <= the "
              "%.3f ms the host measured around it",
              which, ms, wall);
    flashport_timer_destroy(t);
}

/* The message of the last refused backward_grads call (the copies after it clear the last
 * error). */
static char refused[512];

/* Gradients of the fixed problem through p's handle (its workspace as set), into grads (dQ, dK,
 * dV); dQ's buffer is first filled with 0x7f bytes, so a refused call shows there. */
static flashport_status backward_grads(problem *p, float *grads)
{
    static unsigned char mark[ELEMS * sizeof(float)];
    memset(mark, 0x7f, sizeof mark);
    flashport_status s = flashport_memcpy_to_device(p->be, p->buf[PDQ], mark, sizeof mark);
    if (s != FLASHPORT_OK)
        return s;
    const flashport_status call = problem_backward(p);
    if (call != FLASHPORT_OK)
        snprintf(refused, sizeof refused, "%s", flashport_last_error());
    s = problem_read(p, PDQ, 3, grads);
    return call != FLASHPORT_OK ? call : s;
}

static int dq_untouched(const float *grads)
{
    const unsigned char *b = (const unsigned char *)grads;
    for (size_t i = 0; i < ELEMS * sizeof(float); i++)
        if (b[i] != 0x7f)
            return 0;
    return 1;
}

static void check_workspace(flashport_backend *be)
{
    section("caller's workspace");
    static float own[3 * ELEMS], got[3 * ELEMS];
    static _Alignas(256) unsigned char host_ws[4096];
    problem p;
    EXPECT(problem_make(be, &p), FLASHPORT_OK, "allocate the problem");
    if (!p.be)
        return;
    EXPECT(problem_forward(&p), FLASHPORT_OK, "forward with LSE");
    size_t fwd = 1, bwd = 0;
    const size_t want = (size_t)(B * H * N) * sizeof(float); /* the delta: B H N f32 */
    EXPECT(problem_bytes(&p, FLASHPORT_FORWARD, &fwd), FLASHPORT_OK, "forward workspace size");
    EXPECT(problem_bytes(&p, FLASHPORT_BACKWARD, &bwd), FLASHPORT_OK, "backward workspace size");
    CHECK_MSG(fwd == 0 && bwd == want,
              "workspace sizes: forward %zu (want 0), backward %zu "
              "(want %zu)",
              fwd, bwd, want);
    EXPECT(backward_grads(&p, own), FLASHPORT_OK, "backward, own scratch");

    void *ws = NULL;
    EXPECT(flashport_malloc(be, 256 + want, &ws), FLASHPORT_OK, "allocate the workspace");
    /* The workspace at the start of its buffer and 256 bytes in: the backward's delta goes
     * into [at, at + want), and bytes before it keep their marks. */
    static unsigned char marks[256 + 4096];
    for (int at = 0; ws && at <= 256; at += 256) {
        memset(marks, 0x7f, 256 + want);
        EXPECT(flashport_memcpy_to_device(be, ws, marks, 256 + want), FLASHPORT_OK, "mark");
        EXPECT(flashport_set_workspace(be, (char *)ws + at, want), FLASHPORT_OK, "set workspace");
        EXPECT(backward_grads(&p, got), FLASHPORT_OK, "backward on the workspace");
        CHECK_MSG(memcmp(own, got, sizeof own) == 0,
                  "backward on a workspace %d bytes into its buffer: other bits than on the "
                  "backend's own scratch",
                  at);
        EXPECT(flashport_memcpy_to_host(be, marks, ws, 256 + want), FLASHPORT_OK, "read back");
        int before = 0, used = 0;
        for (int i = 0; i < at; i++)
            before += marks[i] != 0x7f;
        for (size_t i = (size_t)at; i < (size_t)at + want; i++)
            used += marks[i] != 0x7f;
        CHECK_MSG(before == 0 && used > 0,
                  "workspace %d bytes in: %d bytes before it changed (want 0), %d of its %zu "
                  "bytes written (want some)",
                  at, before, used, want);
    }
    if (ws) {
        EXPECT(flashport_set_workspace(be, ws, want - 4), FLASHPORT_OK, "set a small workspace");
        const flashport_tensor *t = p.t;
        EXPECT(flashport_attention_supported(be, FLASHPORT_BACKWARD, &p.params, &t[PQ], &t[PK],
                                             &t[PV], &t[PO], &t[PLSE], &t[PDO], &t[PDQ], &t[PDK],
                                             &t[PDV]),
               FLASHPORT_ERR_BUFFER_TOO_SMALL, "supported, workspace 4 bytes short");
        EXPECT(backward_grads(&p, got), FLASHPORT_ERR_BUFFER_TOO_SMALL,
               "backward, workspace 4 bytes short");
        CHECK_MSG(strstr(refused, "workspace"), "message '%s'", refused);
        CHECK_MSG(dq_untouched(got), "a backward refused for its workspace wrote dQ");
    }
    EXPECT(flashport_set_workspace(be, host_ws, sizeof host_ws), FLASHPORT_OK,
           "set a host workspace");
    EXPECT(backward_grads(&p, got), FLASHPORT_ERR_INVALID_VALUE,
           "backward on a workspace that is not the handle's memory");
    CHECK_MSG(strstr(refused, "workspace") != NULL, "message '%s'", refused);
    CHECK_MSG(dq_untouched(got), "a backward refused for its workspace pointer wrote dQ");
    EXPECT(flashport_set_workspace(be, NULL, 0), FLASHPORT_OK, "drop the workspace");
    if (ws)
        flashport_free(be, ws);
    problem_free(&p);
}

/* One backward of a bf16 problem on the emulated FA2-shaped kernels (FLASHPORT_OPENCL_MMA=
 * emulate) through a handle opened with FLASHPORT_OPENCL_BWD=`at_open` (unset where NULL), on a
 * workspace of
 * exactly the size the handle reports, the environment switched to `after` between the open and
 * the size query and to its other value between the query and the call: the query and the call
 * must agree (the choice is the handle's, made at open), whatever the environment says later.
 * Sets *bytes to the size reported. */
static void bwd_form_call(const char *at_open, const char *after, size_t *bytes)
{
    flashport_backend *be = NULL;
    if (at_open)
        setenv("FLASHPORT_OPENCL_BWD", at_open, 1);
    else
        unsetenv("FLASHPORT_OPENCL_BWD");
    EXPECT(flashport_backend_open_device("opencl", 0, &be), FLASHPORT_OK, "open (emulated)");
    *bytes = 0;
    if (!be)
        return;
    setenv("FLASHPORT_OPENCL_BWD", after, 1);
    problem p;
    void *ws = NULL;
    EXPECT(problem_make_as(be, &p, FLASHPORT_BF16), FLASHPORT_OK, "allocate the bf16 problem");
    if (p.be) {
        EXPECT(problem_forward(&p), FLASHPORT_OK, "bf16 forward");
        EXPECT(problem_bytes(&p, FLASHPORT_BACKWARD, bytes), FLASHPORT_OK, "bf16 backward size");
        EXPECT(flashport_malloc(be, *bytes, &ws), FLASHPORT_OK, "allocate the workspace");
    }
    if (ws) {
        EXPECT(flashport_set_workspace(be, ws, *bytes), FLASHPORT_OK, "set the workspace");
        setenv("FLASHPORT_OPENCL_BWD", strcmp(after, "fused") ? "fused" : "two", 1);
        EXPECT(problem_backward(&p), FLASHPORT_OK, "bf16 backward on the queried workspace");
        CHECK_MSG(flashport_synchronize(be) == FLASHPORT_OK, "synchronize: %s",
                  flashport_last_error());
        flashport_free(be, ws);
    }
    problem_free(&p);
    flashport_backend_close(be);
}

/* FLASHPORT_OPENCL_BWD is read when a handle opens: a handle opened with `fused` or without the
 * variable (the default) reports the one-kernel form's larger workspace (delta + f32 dQ
 * accumulator) and one opened with `two` the delta alone, and each call fits the size its handle
 * reported though the environment changed after the open and again after the query (before, the
 * query and the call each read the environment, and a call that took the one-kernel form on a size
 * queried without it was FLASHPORT_ERR_BUFFER_TOO_SMALL). */
static void check_bwd_form_fixed_at_open(void)
{
    section("backward form fixed at open (FLASHPORT_OPENCL_BWD)");
    char *saved_mma = env_copy("FLASHPORT_OPENCL_MMA"),
         *saved_bwd = env_copy("FLASHPORT_OPENCL_BWD");
    setenv("FLASHPORT_OPENCL_MMA", "emulate", 1);
    size_t fused = 0, two = 0, unset = 0;
    bwd_form_call("fused", "two", &fused);
    bwd_form_call("two", "fused", &two);
    bwd_form_call(NULL, "two", &unset);
    const size_t delta = (size_t)(B * H * N) * sizeof(float);
    CHECK_MSG(two == delta && fused > delta && unset == fused,
              "backward workspace: %zu opened with fused (want more than the delta's %zu), "
              "%zu opened with two (want %zu), %zu opened without the variable (want %zu)",
              fused, delta, two, delta, unset, fused);
    restore_env("FLASHPORT_OPENCL_MMA", saved_mma);
    restore_env("FLASHPORT_OPENCL_BWD", saved_bwd);
    free(saved_mma);
    free(saved_bwd);
}

/* The emulated FA2-shaped kernels (FLASHPORT_OPENCL_MMA=emulate) run repeatedly on one input
 * give the same bits every time, on whatever number of threads the device runs work-groups on
 * (PoCL: one per core). PoCL 3.1 with two threads gave this forward wrong, run-to-run
 * different results for whole work-groups while the emulation's scratch was a kernel-scope
 * __local array (docs/opencl.md, "Tests"), hence several heads, two sequences and more than one
 * query block each. The backward asks to be deterministic (the
 * two-kernel form: the default one-kernel form adds dQ by atomic adds, in no fixed order). */
/* A bf16 problem of [b, n, h or hk, d] tensors (LSE [b, h, n] f32) in the memory of p->be, q, k,
 * v and dO uniform in [-2, 2) from `seed`; count[i]: tensor i's elements. */
static flashport_status problem_make_bf16(problem *p, int64_t b, int64_t n, int64_t h, int64_t hk,
                                          int64_t d, uint64_t seed, size_t count[NBUF])
{
    const int64_t q_shape[4] = {b, n, h, d}, kv_shape[4] = {b, n, hk, d}, lse_shape[3] = {b, h, n};
    flashport_attention_params_init(&p->params);
    tu_rng r = tu_rng_seed(seed);
    uint16_t *host = malloc((size_t)(b * n * h * d) * 2);
    flashport_status st = host ? FLASHPORT_OK : FLASHPORT_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < NBUF && st == FLASHPORT_OK; i++) {
        const int lse = i == PLSE, kv = i == PK || i == PV || i == PDK || i == PDV;
        count[i] = (size_t)(lse ? b * h * n : b * n * (kv ? hk : h) * d);
        st = flashport_malloc(p->be, count[i] * (lse ? 4 : 2), &p->buf[i]);
        p->t[i] = flashport_tensor_contiguous(p->buf[i], lse ? FLASHPORT_F32 : FLASHPORT_BF16,
                                              lse ? 3 : 4,
                                              lse  ? lse_shape
                                              : kv ? kv_shape
                                                   : q_shape);
        if (st == FLASHPORT_OK && (i <= PV || i == PDO)) {
            tu_fill_uniform(host, (int64_t)count[i], FLASHPORT_BF16, -2.0f, 2.0f, &r);
            st = flashport_memcpy_to_device(p->be, p->buf[i], host, count[i] * 2);
        }
    }
    free(host);
    return st;
}

static void check_fa2_repeatable(void)
{
    section("emulated FA2-shaped kernels: the same bits on every run");
    enum { RB = 2, RN = 200, RH = 4, RHK = 2, RD = 64, RUNS = 6 };
    static uint32_t first[NBUF][RB * RN * RH * RD / 2 + 1], now[RB * RN * RH * RD / 2 + 1];
    size_t count[NBUF];
    char *saved = env_copy("FLASHPORT_OPENCL_MMA");
    setenv("FLASHPORT_OPENCL_MMA", "emulate", 1);
    problem p;
    memset(&p, 0, sizeof p);
    EXPECT(flashport_backend_open_device("opencl", 0, &p.be), FLASHPORT_OK, "open (emulated)");
    flashport_status st =
        p.be ? problem_make_bf16(&p, RB, RN, RH, RHK, RD, 11, count) : FLASHPORT_ERR_NO_DEVICE;
    p.params.deterministic = 1;
    EXPECT(st, FLASHPORT_OK, "allocate and fill the problem");
    static const int outs[5] = {PO, PLSE, PDQ, PDK, PDV};
    static const char *const names[5] = {"O", "LSE", "dQ", "dK", "dV"};
    int differ = 0;
    for (int run = 0; run < RUNS && st == FLASHPORT_OK; run++) {
        st = problem_forward(&p);
        if (st == FLASHPORT_OK)
            st = problem_backward(&p);
        for (int o = 0; o < 5 && st == FLASHPORT_OK; o++) {
            const size_t bytes = count[outs[o]] * (outs[o] == PLSE ? 4 : 2);
            st = flashport_memcpy_to_host(p.be, run ? now : first[o], p.buf[outs[o]], bytes);
            if (st == FLASHPORT_OK && run && memcmp(now, first[o], bytes) != 0) {
                differ++;
                CHECK_MSG(0, "run %d: %s differs from run 0's", run, names[o]);
            }
        }
    }
    EXPECT(st, FLASHPORT_OK, "forward and backward, repeated");
    printf("%d runs, %d outputs differing from the first run's\n", RUNS, differ);
    if (p.be) {
        flashport_backend *be = p.be;
        problem_free(&p);
        flashport_backend_close(be);
    }
    restore_env("FLASHPORT_OPENCL_MMA", saved);
    free(saved);
}

/* Rows whose LSE is -inf (a row that saw no key) or NaN inside blocks where every pair is
 * visible, the FA2-shaped backward's fast path (docs/opencl.md, "The backward's fast path and
 * query blocks"), emulated: their P is 0 there as on the exact path (FLASHPORT_OPENCL_BWD_FAST=0),
 * so their dQ rows are exactly 0, and dQ, dK and dV of the two paths agree within bf16's
 * rounding. Head dims 64 (one-kernel and deterministic two-kernel forms, query blocks of 32) and
 * 256 (the wide one-kernel form); N = 128, no mask: full blocks only. */
static void check_fast_path_rows(void)
{
    section("emulated FA2-shaped backward: LSE -inf / NaN rows in full blocks, fast and exact");
    enum { FN = 128, FH = 2, ROW_INF = 5, ROW_NAN = 70 };
    static const struct {
        int d, deterministic;
    } forms[3] = {{64, 0}, {64, 1}, {256, 0}};
    char *saved_mma = env_copy("FLASHPORT_OPENCL_MMA"),
         *saved_fast = env_copy("FLASHPORT_OPENCL_BWD_FAST");
    setenv("FLASHPORT_OPENCL_MMA", "emulate", 1);
    for (int f = 0; f < 3; f++) {
        const int d = forms[f].d;
        const size_t n = (size_t)(FN * FH * d);
        float *grads[2] = {malloc(3 * n * sizeof(float)), malloc(3 * n * sizeof(float))};
        uint16_t *bits = malloc(n * 2);
        flashport_status st =
            grads[0] && grads[1] && bits ? FLASHPORT_OK : FLASHPORT_ERR_OUT_OF_MEMORY;
        for (int fast = 1; fast >= 0 && st == FLASHPORT_OK; fast--) {
            setenv("FLASHPORT_OPENCL_BWD_FAST", fast ? "1" : "0", 1);
            problem p;
            size_t count[NBUF];
            float lse[FH * FN];
            memset(&p, 0, sizeof p);
            st = flashport_backend_open_device("opencl", 0, &p.be);
            if (st == FLASHPORT_OK)
                st = problem_make_bf16(&p, 1, FN, FH, FH, d, 23, count);
            p.params.deterministic = forms[f].deterministic;
            if (st == FLASHPORT_OK)
                st = problem_forward(&p);
            if (st == FLASHPORT_OK)
                st = flashport_memcpy_to_host(p.be, lse, p.buf[PLSE], sizeof lse);
            lse[ROW_INF] = -INFINITY; /* head 0 */
            lse[FN + ROW_NAN] = NAN;  /* head 1 */
            if (st == FLASHPORT_OK)
                st = flashport_memcpy_to_device(p.be, p.buf[PLSE], lse, sizeof lse);
            if (st == FLASHPORT_OK)
                st = problem_backward(&p);
            for (int g = 0; g < 3 && st == FLASHPORT_OK; g++) {
                st = flashport_memcpy_to_host(p.be, bits, p.buf[PDQ + g], n * 2);
                if (st == FLASHPORT_OK)
                    st = flashport_convert(grads[fast] + g * n, FLASHPORT_F32, bits, FLASHPORT_BF16,
                                           n);
            }
            EXPECT(st, FLASHPORT_OK, fast ? "backward, fast path" : "backward, exact path");
            int nonzero = 0;
            for (int e = 0; e < d && st == FLASHPORT_OK; e++) /* dQ [1, FN, FH, d] */
                nonzero += grads[fast][(size_t)(ROW_INF * FH) * d + e] != 0.0f ||
                           grads[fast][(size_t)(ROW_NAN * FH + 1) * d + e] != 0.0f;
            CHECK_MSG(nonzero == 0,
                      "D %d%s, %s path: %d dQ elements of the rows with LSE -inf / NaN "
                      "are not 0",
                      d, forms[f].deterministic ? " deterministic" : "", fast ? "fast" : "exact",
                      nonzero);
            if (p.be) {
                flashport_backend *be = p.be;
                problem_free(&p);
                flashport_backend_close(be);
            }
        }
        float worst = 0.0f, scale = 1.0f;
        for (size_t e = 0; e < 3 * n && st == FLASHPORT_OK; e++) {
            const float diff = fabsf(grads[1][e] - grads[0][e]);
            worst = diff > worst || diff != diff ? diff : worst;
            scale = fabsf(grads[0][e]) > scale ? fabsf(grads[0][e]) : scale;
        }
        CHECK_MSG(st != FLASHPORT_OK || worst <= 4e-2f * scale,
                  "D %d%s: fast and exact paths differ by %g (max |exact| %g)", d,
                  forms[f].deterministic ? " deterministic" : "", (double)worst, (double)scale);
        printf("D %d%s: fast - exact max %.3g of max |exact| %.3g\n", d,
               forms[f].deterministic ? " deterministic" : "", (double)worst, (double)scale);
        free(grads[0]);
        free(grads[1]);
        free(bits);
    }
    restore_env("FLASHPORT_OPENCL_MMA", saved_mma);
    restore_env("FLASHPORT_OPENCL_BWD_FAST", saved_fast);
    free(saved_mma);
    free(saved_fast);
}

/* The caller's program's device: the one a handle opens as device 0 (first device of the lowest
 * kind rank, GPUs first, on the platforms FLASHPORT_OPENCL_PLATFORM keeps). Taking simply the
 * first platform's first device would mix devices where a GPU driver and PoCL are both
 * installed, and the two would not give the same bits. */
static int caller_queue(const flashport_device_props *p0, cl_context *context,
                        cl_command_queue *queue)
{
    cl_platform_id plats[16];
    cl_uint np = 0;
    const char *want = getenv("FLASHPORT_OPENCL_PLATFORM");
    if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS)
        return -1;
    cl_device_id best = NULL;
    int best_rank = 3;
    char pname[128] = "";
    for (cl_uint p = 0; p < np && p < 16; p++) {
        char name[128] = "";
        cl_device_id devs[16];
        cl_uint nd = 0;
        clGetPlatformInfo(plats[p], CL_PLATFORM_NAME, sizeof name - 1, name, NULL);
        if ((want && *want && !strstr(name, want)) ||
            clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, devs, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint i = 0; i < nd && i < 16; i++) {
            cl_device_type t = 0;
            clGetDeviceInfo(devs[i], CL_DEVICE_TYPE, sizeof t, &t, NULL);
            const int rank = t & CL_DEVICE_TYPE_GPU ? 0 : t & CL_DEVICE_TYPE_ACCELERATOR ? 1 : 2;
            if (rank < best_rank) {
                best = devs[i];
                best_rank = rank;
                snprintf(pname, sizeof pname, "%s", name);
            }
        }
    }
    if (!best)
        return -1;
    char dname[256] = "";
    clGetDeviceInfo(best, CL_DEVICE_NAME, sizeof dname - 1, dname, NULL);
    printf("caller's queue on '%s' (platform '%s')\n", dname, pname);
    CHECK_MSG(strcmp(dname, p0->name) == 0,
              "the caller's device '%s' is not device 0 '%s' of the enumeration", dname, p0->name);
    cl_int err;
    *context = clCreateContext(NULL, 1, &best, NULL, NULL, &err);
    if (err != CL_SUCCESS)
        return -1;
    *queue = clCreateCommandQueue(*context, best, CL_QUEUE_PROFILING_ENABLE, &err);
    return err == CL_SUCCESS ? 0 : -1;
}

static void check_caller_queue(const flashport_device_props *p0)
{
    section("caller's queue");
    static float own[ELEMS], theirs[ELEMS];
    flashport_backend *a = NULL, *b = NULL;
    cl_context context = NULL;
    cl_command_queue queue = NULL;
    if (!CHECK_MSG(caller_queue(p0, &context, &queue) == 0,
                   "cannot make the caller's context and queue"))
        return;
    EXPECT(flashport_backend_open_device("opencl", 0, &a), FLASHPORT_OK, "open handle a");
    EXPECT(flashport_backend_open_device("opencl", 0, &b), FLASHPORT_OK, "open handle b");
    if (!a || !b)
        return;
    EXPECT(forward(a, own), FLASHPORT_OK, "forward on the handle's queue");
    EXPECT(flashport_set_stream(b, queue), FLASHPORT_OK, "set the caller's queue");
    EXPECT(forward(b, theirs), FLASHPORT_OK, "forward on the caller's queue");
    CHECK_MSG(memcmp(own, theirs, sizeof own) == 0,
              "the caller's queue gave other bits than the handle's own");
    check_timer(b, "the caller's queue");

    void *held = NULL;
    EXPECT(flashport_malloc(b, 64, &held), FLASHPORT_OK, "allocate on the caller's context");
    EXPECT(flashport_set_stream(b, NULL), FLASHPORT_ERR_INVALID_VALUE,
           "back to the own queue while holding an allocation");
    CHECK_MSG(strstr(flashport_last_error(), "another OpenCL context") != NULL, "message '%s'",
              flashport_last_error());
    EXPECT(flashport_set_stream(b, queue), FLASHPORT_OK, "the current queue again");
    EXPECT(flashport_free(b, held), FLASHPORT_OK, "free");
    EXPECT(flashport_set_stream(b, NULL), FLASHPORT_OK, "back to the own queue");
    EXPECT(forward(b, theirs), FLASHPORT_OK, "forward back on the own queue");
    CHECK_MSG(memcmp(own, theirs, sizeof own) == 0,
              "back on its own queue, handle b gave other bits than handle a");
    flashport_backend_close(a);
    flashport_backend_close(b);
    clReleaseCommandQueue(queue);
    clReleaseContext(context);
}

/* --no-device: where the ICD loader finds no platform. */
static int check_no_device(void)
{
    section("no OpenCL platform");
    flashport_backend *be = NULL;
    flashport_device_props p;
    int n = -1;
    EXPECT(flashport_backend_open("opencl", &be), FLASHPORT_ERR_NO_DEVICE, "open");
    EXPECT(flashport_device_count("opencl", &n), FLASHPORT_OK, "device count");
    CHECK_MSG(n == 0, "device count %d, want 0", n);
    EXPECT(flashport_device_properties("opencl", 0, &p), FLASHPORT_ERR_NO_DEVICE,
           "device 0 properties");
    printf("%s: %d failure(s)\n", tu_failures ? "FAIL" : "PASS", tu_failures);
    return tu_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* in order with the failures on stderr, in one log */
    section("tile planner");
    check_plan();
    check_plan_48k();
    check_plan_fa2();
    if (argc > 1 && strcmp(argv[1], "--no-device") == 0)
        return check_no_device();
    flashport_backend *be = NULL;
    flashport_status s = flashport_backend_open_device("opencl", 0, &be);
    if (s == FLASHPORT_ERR_NO_DEVICE || s == FLASHPORT_ERR_BACKEND_UNAVAILABLE) {
        printf("SKIP: %s: %s\n", flashport_status_string(s), flashport_last_error());
        return tu_failures ? 1 : TU_SKIP;
    }
    if (!CHECK_MSG(s == FLASHPORT_OK, "open: %s", flashport_last_error()))
        return 1;
    char *saved = env_copy("FLASHPORT_OPENCL_PLATFORM");
    flashport_device_props p0;
    check_device_choice(saved);
    check_enumeration(&p0);
    check_pointers(be);
    check_timer(be, "the handle's queue");
    check_workspace(be);
    flashport_backend_close(be);
    check_bwd_form_fixed_at_open();
    check_fa2_repeatable();
    check_fast_path_rows();
    check_caller_queue(&p0);
    free(saved);
    printf("%s: %d failure(s)\n", tu_failures ? "FAIL" : "PASS", tu_failures);
    return tu_failures ? 1 : 0;
}
