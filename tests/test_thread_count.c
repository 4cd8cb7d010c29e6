/*
 * The CPU backend's results do not depend on its thread count: O, LSE and the deterministic
 * backward's dQ, dK, dV must have the same bits with 1, 2 and 3 threads. The count is read once
 * per process (FLASHPORT_NUM_THREADS), so the test runs itself as a child per count and compares
 * the children's hashes of every output.
 *
 * The problems cover both schedules of backends/cpu/flash_bwd.c, which must agree bit for bit:
 * B * Hkv = 1 (fused with 1 thread, two-pass with more), 4 (fused with 1 and 2, two-pass with 3)
 * and 3 (fused with 1 and 3, two-pass with 2); causal, windowed and unmasked; GQA; f32 and bf16.
 * The micro-kernels are those FLASHPORT_CPU_ISA selects (the children inherit it).
 *
 *   test_thread_count            run the children and compare
 *   test_thread_count --child    print one hash per problem (FLASHPORT_NUM_THREADS as given)
 */
#define _POSIX_C_SOURCE 200809L /* popen, setenv */

#include "tests/test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct problem {
    flashport_dtype dtype;
    int64_t b, h, hkv, nq, nk, d;
    int causal, left, right;
} problem;

static const problem problems[] = {
    {FLASHPORT_F32, 1, 2, 1, 200, 200, 72, 1, -1, -1},
    {FLASHPORT_F32, 2, 4, 2, 150, 170, 64, 0, 30, 5},
    {FLASHPORT_BF16, 1, 3, 3, 130, 130, 40, 0, -1, -1},
};
enum { PROBLEMS = sizeof problems / sizeof problems[0] };

static uint64_t fnv1a(uint64_t h, const void *data, size_t bytes)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Forward then backward of one problem on `be`; returns the hash of all outputs, 0 on error. */
static uint64_t run_problem(flashport_backend *be, const problem *pr, int index)
{
    const int64_t qs[4] = {pr->b, pr->nq, pr->h, pr->d}, ks[4] = {pr->b, pr->nk, pr->hkv, pr->d};
    const int64_t ls[3] = {pr->b, pr->h, pr->nq};
    const size_t es = tu_dtype_size(pr->dtype);
    const size_t qn = (size_t)(pr->b * pr->nq * pr->h * pr->d);
    const size_t kn = (size_t)(pr->b * pr->nk * pr->hkv * pr->d);
    const size_t ln = (size_t)(pr->b * pr->h * pr->nq);
    const size_t elems[9] = {qn, kn, kn, qn, ln, qn, qn, kn, kn};
    void *buf[9];
    tu_rng rng = tu_rng_seed(100 + (uint64_t)index);
    for (int i = 0; i < 9; i++) {
        buf[i] = malloc((i == 4 ? sizeof(float) : es) * elems[i]);
        if (!CHECK(buf[i]))
            return 0;
        tu_fill_uniform(buf[i], (int64_t)elems[i], i == 4 ? FLASHPORT_F32 : pr->dtype, -1.0f, 1.0f,
                        &rng);
    }
    flashport_tensor t[9];
    for (int i = 0; i < 9; i++) {
        const int kv = i == 1 || i == 2 || i == 7 || i == 8;
        t[i] = i == 4 ? flashport_tensor_contiguous(buf[i], FLASHPORT_F32, 3, ls)
                      : flashport_tensor_contiguous(buf[i], pr->dtype, 4, kv ? ks : qs);
    }
    flashport_attention_params params;
    flashport_attention_params_init(&params);
    params.causal = pr->causal;
    params.window_left = pr->left;
    params.window_right = pr->right;
    params.deterministic = 1;
    uint64_t h = 0xcbf29ce484222325ull;
    flashport_status st =
        flashport_attention_forward(be, &params, &t[0], &t[1], &t[2], &t[3], &t[4]);
    if (st == FLASHPORT_OK)
        st = flashport_attention_backward(be, &params, &t[0], &t[1], &t[2], &t[3], &t[4], &t[5],
                                          &t[6], &t[7], &t[8]);
    if (!CHECK_MSG(st == FLASHPORT_OK, "problem %d: %s", index, flashport_last_error()))
        h = 0;
    for (int i = 3; i < 9 && h; i++)
        if (i != 5) /* dO is an input */
            h = fnv1a(h, buf[i], (i == 4 ? sizeof(float) : es) * elems[i]);
    for (int i = 0; i < 9; i++)
        free(buf[i]);
    return h;
}

static int child(void)
{
    flashport_backend *be;
    if (flashport_backend_open("cpu", &be) != FLASHPORT_OK) {
        fprintf(stderr, "cannot open cpu: %s\n", flashport_last_error());
        return 1;
    }
    for (int i = 0; i < PROBLEMS; i++)
        printf("%016llx\n", (unsigned long long)run_problem(be, &problems[i], i));
    flashport_backend_close(be);
    return tu_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return child();
    const int counts[] = {1, 2, 3};
    unsigned long long hash[3][PROBLEMS];
    for (int c = 0; c < 3; c++) {
        char cmd[4096], n[16];
        snprintf(n, sizeof n, "%d", counts[c]);
        setenv("FLASHPORT_NUM_THREADS", n, 1);
        snprintf(cmd, sizeof cmd, "'%s' --child", argv[0]);
        FILE *f = popen(cmd, "r");
        if (!CHECK(f))
            return 1;
        for (int i = 0; i < PROBLEMS; i++)
            if (!CHECK_MSG(fscanf(f, "%llx", &hash[c][i]) == 1, "child with %d threads: no hash",
                           counts[c]))
                hash[c][i] = 0;
        CHECK_MSG(pclose(f) == 0, "child with %d threads failed", counts[c]);
    }
    for (int i = 0; i < PROBLEMS; i++) {
        printf("problem %d: %016llx %016llx %016llx (1, 2, 3 threads)\n", i, hash[0][i], hash[1][i],
               hash[2][i]);
        CHECK_MSG(hash[0][i] != 0 && hash[0][i] == hash[1][i] && hash[0][i] == hash[2][i],
                  "problem %d: outputs depend on the thread count", i);
    }
    return tu_failures ? 1 : 0;
}
