/*
 * The OpenCL backend's tile planner (backends/opencl/ocl_plan.h, pure: runs without a device)
 * against the table in docs/opencl.md, then its host side on whatever OpenCL device the machine
 * has (PoCL in CI):
 *   - device choice: FLASHPORT_OPENCL_PLATFORM matching nothing and an index out of range are
 *     FLASHPORT_ERR_NO_DEVICE with the reason;
 *   - pointers: arithmetic inside an allocation works; a pointer that is not inside one of the
 *     handle's allocations (a host pointer, past the end, freed) is FLASHPORT_ERR_INVALID_VALUE
 *     and nothing is copied;
 *   - the caller's queue: a queue of the caller's own context is adopted while the handle holds
 *     no allocations, gives the same bits as the handle's own queue, and is refused while it
 *     holds some;
 *   - flashport_timer on OpenCL markers gives a positive time.
 * Exit 77 (skipped) when the machine has no OpenCL device and the planner checks passed.
 */
#define _POSIX_C_SOURCE          200809L /* setenv */
#define CL_TARGET_OPENCL_VERSION 120

#include "backends/opencl/ocl_plan.h"
#include "tests/test_util.h"

#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 1, N = 37, H = 2, D = 24 };

/* Forward of a fixed small problem through handle be; O (f32, B N H D) into o_host. */
static flashport_status forward(flashport_backend *be, float *o_host)
{
    const int64_t shape[4] = {B, N, H, D}, elems = B * N * H * D;
    const size_t bytes = (size_t)elems * sizeof(float);
    float *x = malloc(bytes);
    void *q = NULL, *k = NULL, *v = NULL, *o = NULL;
    tu_rng r = tu_rng_seed(7);
    for (int64_t i = 0; i < elems; i++)
        x[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
    flashport_status s = flashport_malloc(be, bytes, &q);
    if (s == FLASHPORT_OK)
        s = flashport_malloc(be, bytes, &k);
    if (s == FLASHPORT_OK)
        s = flashport_malloc(be, bytes, &v);
    if (s == FLASHPORT_OK)
        s = flashport_malloc(be, bytes, &o);
    void *ins[3] = {q, k, v};
    for (int i = 0; i < 3 && s == FLASHPORT_OK; i++)
        s = flashport_memcpy_to_device(be, ins[i], x, bytes);
    flashport_attention_params params;
    flashport_attention_params_init(&params);
    params.causal = 1;
    flashport_tensor tq = flashport_tensor_contiguous(q, FLASHPORT_F32, 4, shape);
    flashport_tensor tk = flashport_tensor_contiguous(k, FLASHPORT_F32, 4, shape);
    flashport_tensor tv = flashport_tensor_contiguous(v, FLASHPORT_F32, 4, shape);
    flashport_tensor to = flashport_tensor_contiguous(o, FLASHPORT_F32, 4, shape);
    if (s == FLASHPORT_OK)
        s = flashport_attention_forward(be, &params, &tq, &tk, &tv, &to, NULL);
    if (s == FLASHPORT_OK)
        s = flashport_memcpy_to_host(be, o_host, o, bytes);
    void *all[4] = {q, k, v, o};
    for (int i = 0; i < 4; i++)
        if (all[i])
            flashport_free(be, all[i]);
    free(x);
    return s;
}

/* docs/opencl.md's tile table: PoCL (1 MiB of local memory) and a 48 KiB device (NVIDIA). */
static void check_plan(void)
{
    static const struct {
        int64_t d, cls, pocl_fwd, pocl_bwd, kib48_fwd, kib48_bwd;
    } want[] = {
        {1, 16, 64, 64, 64, 32},   {16, 16, 64, 64, 64, 32},   {24, 32, 64, 64, 64, 32},
        {40, 64, 64, 64, 32, 32},  {64, 64, 64, 64, 32, 32},   {72, 96, 32, 32, 32, 16},
        {96, 96, 32, 32, 32, 16},  {128, 128, 32, 32, 32, 16}, {160, 192, 16, 16, 16, 8},
        {192, 192, 16, 16, 16, 8}, {200, 256, 16, 16, 16, 8},  {256, 256, 16, 16, 16, 8},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const int64_t c = fp_ocl_dim_class(want[i].d);
        const int64_t got[4] = {
            fp_ocl_tile(FP_OCL_FORWARD, c, 1 << 20), fp_ocl_tile(FP_OCL_BACKWARD, c, 1 << 20),
            fp_ocl_tile(FP_OCL_FORWARD, c, 48 << 10), fp_ocl_tile(FP_OCL_BACKWARD, c, 48 << 10)};
        CHECK_MSG(c == want[i].cls && got[0] == want[i].pocl_fwd && got[1] == want[i].pocl_bwd &&
                      got[2] == want[i].kib48_fwd && got[3] == want[i].kib48_bwd,
                  "D %lld: class %lld, tiles %lld %lld %lld %lld", (long long)want[i].d,
                  (long long)c, (long long)got[0], (long long)got[1], (long long)got[2],
                  (long long)got[3]);
    }
    CHECK(fp_ocl_dim_class(257) == 0);
    CHECK(fp_ocl_tile(FP_OCL_BACKWARD, 256, 16 << 10) == 0); /* does not fit: unsupported */
}

static void check_device_choice(void)
{
    flashport_backend *be = NULL;
    setenv("FLASHPORT_OPENCL_PLATFORM", "no such platform", 1);
    flashport_status s = flashport_backend_open("opencl", &be);
    CHECK_MSG(s == FLASHPORT_ERR_NO_DEVICE && strstr(flashport_last_error(), "no such platform"),
              "platform filter: %s: %s", flashport_status_string(s), flashport_last_error());
    unsetenv("FLASHPORT_OPENCL_PLATFORM");
    s = flashport_backend_open_device("opencl", 4096, &be);
    CHECK_MSG(s == FLASHPORT_ERR_NO_DEVICE && strstr(flashport_last_error(), "no device 4096"),
              "index out of range: %s: %s", flashport_status_string(s), flashport_last_error());
}

static void check_pointers(flashport_backend *be)
{
    char *buf = NULL, host[64], back[64];
    for (int i = 0; i < 64; i++)
        host[i] = (char)i;
    if (!CHECK(flashport_malloc(be, 256, (void **)&buf) == FLASHPORT_OK))
        return;
    CHECK(flashport_memcpy_to_device(be, buf + 100, host, 64) == FLASHPORT_OK);
    memset(back, 0, sizeof back);
    CHECK(flashport_memcpy_to_host(be, back, buf + 100, 64) == FLASHPORT_OK);
    CHECK(memcmp(back, host, 64) == 0);
    CHECK(flashport_memcpy_to_device(be, buf + 200, host, 64) == FLASHPORT_ERR_INVALID_VALUE);
    CHECK(strstr(flashport_last_error(), "not inside one allocation") != NULL);
    CHECK(flashport_memcpy_to_device(be, host, back, 64) == FLASHPORT_ERR_INVALID_VALUE);
    CHECK(flashport_free(be, buf + 8) == FLASHPORT_ERR_INVALID_VALUE);
    CHECK(flashport_free(be, buf) == FLASHPORT_OK);
    CHECK(flashport_memcpy_to_host(be, back, buf, 16) == FLASHPORT_ERR_INVALID_VALUE);
}

static void check_timer(flashport_backend *be)
{
    flashport_timer *t = NULL;
    float o[B * N * H * D], ms = -1.0f;
    if (!CHECK(flashport_timer_create(be, &t) == FLASHPORT_OK))
        return;
    CHECK(flashport_timer_start(t) == FLASHPORT_OK);
    CHECK(forward(be, o) == FLASHPORT_OK);
    CHECK(flashport_timer_stop(t) == FLASHPORT_OK);
    CHECK_MSG(flashport_timer_elapsed_ms(t, &ms) == FLASHPORT_OK && ms > 0.0f, "timer: %g ms: %s",
              ms, flashport_last_error());
    flashport_timer_destroy(t);
}

/* The first device of the first platform, as the caller's program would pick one. */
static int caller_queue(cl_context *context, cl_command_queue *queue)
{
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    if (clGetPlatformIDs(1, &platform, NULL) != CL_SUCCESS ||
        clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL) != CL_SUCCESS)
        return -1;
    *context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (err != CL_SUCCESS)
        return -1;
    *queue = clCreateCommandQueue(*context, device, CL_QUEUE_PROFILING_ENABLE, &err);
    return err == CL_SUCCESS ? 0 : -1;
}

static void check_caller_queue(void)
{
    static float own[B * N * H * D], theirs[B * N * H * D];
    flashport_backend *a = NULL, *b = NULL;
    cl_context context = NULL;
    cl_command_queue queue = NULL;
    if (!CHECK(caller_queue(&context, &queue) == 0))
        return;
    if (!CHECK(flashport_backend_open_device("opencl", 0, &a) == FLASHPORT_OK &&
               flashport_backend_open_device("opencl", 0, &b) == FLASHPORT_OK))
        return;
    CHECK(forward(a, own) == FLASHPORT_OK);
    CHECK_MSG(flashport_set_stream(b, queue) == FLASHPORT_OK, "set_stream: %s",
              flashport_last_error());
    CHECK(forward(b, theirs) == FLASHPORT_OK);
    CHECK_MSG(memcmp(own, theirs, sizeof own) == 0,
              "the caller's queue gave other bits than the handle's own");
    check_timer(b);

    void *held = NULL;
    CHECK(flashport_malloc(b, 64, &held) == FLASHPORT_OK);
    CHECK(flashport_set_stream(b, NULL) == FLASHPORT_ERR_INVALID_VALUE);
    CHECK(strstr(flashport_last_error(), "another OpenCL context") != NULL);
    CHECK(flashport_set_stream(b, queue) == FLASHPORT_OK); /* the current one: no change */
    CHECK(flashport_free(b, held) == FLASHPORT_OK);
    CHECK(flashport_set_stream(b, NULL) == FLASHPORT_OK);
    CHECK(forward(b, theirs) == FLASHPORT_OK);
    CHECK(memcmp(own, theirs, sizeof own) == 0);
    flashport_backend_close(a);
    flashport_backend_close(b);
    clReleaseCommandQueue(queue);
    clReleaseContext(context);
}

int main(void)
{
    check_plan();
    flashport_backend *be = NULL;
    flashport_status s = flashport_backend_open_device("opencl", 0, &be);
    if (s == FLASHPORT_ERR_NO_DEVICE || s == FLASHPORT_ERR_BACKEND_UNAVAILABLE) {
        printf("SKIP: %s: %s\n", flashport_status_string(s), flashport_last_error());
        return tu_failures ? 1 : TU_SKIP;
    }
    if (!CHECK_MSG(s == FLASHPORT_OK, "open: %s", flashport_last_error()))
        return 1;
    check_device_choice();
    check_pointers(be);
    check_timer(be);
    flashport_backend_close(be);
    check_caller_queue();
    printf("%s: %d failure(s)\n", tu_failures ? "FAIL" : "PASS", tu_failures);
    return tu_failures ? 1 : 0;
}
