/*
 * Concurrent calls: several threads run forward and deterministic backward on one backend handle
 * at the same time, on shared inputs, each into its own outputs. Every result must be bitwise
 * identical to the one computed alone first (the library keeps no shared mutable state per call,
 * and the CPU kernels' results do not depend on scheduling).
 *
 *   test_threads [backend]      (default "cpu")
 */
#include "tests/test_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { THREADS = 4, ROUNDS = 3 };

#define B   2
#define N   193
#define H   4
#define HKV 2
#define D   72

static flashport_backend *be;
static flashport_attention_params params;
static flashport_tensor tq, tk, tv, tdo;
static size_t q_bytes, kv_bytes, lse_bytes;

typedef struct result {
    void *o, *lse, *dq, *dk, *dv;
    flashport_status st;
} result;

static const int64_t q_shape[4] = {B, N, H, D}, kv_shape[4] = {B, N, HKV, D},
                     lse_shape[3] = {B, H, N};

static int alloc_result(result *r)
{
    memset(r, 0, sizeof *r);
    return flashport_malloc(be, q_bytes, &r->o) || flashport_malloc(be, lse_bytes, &r->lse) ||
           flashport_malloc(be, q_bytes, &r->dq) || flashport_malloc(be, kv_bytes, &r->dk) ||
           flashport_malloc(be, kv_bytes, &r->dv);
}

static void free_result(result *r)
{
    void *p[5] = {r->o, r->lse, r->dq, r->dk, r->dv};
    for (int i = 0; i < 5; i++)
        flashport_free(be, p[i]);
}

static flashport_status run(result *r)
{
    flashport_tensor to = flashport_tensor_contiguous(r->o, FLASHPORT_BF16, 4, q_shape);
    flashport_tensor tl = flashport_tensor_contiguous(r->lse, FLASHPORT_F32, 3, lse_shape);
    flashport_tensor tdq = flashport_tensor_contiguous(r->dq, FLASHPORT_BF16, 4, q_shape);
    flashport_tensor tdk = flashport_tensor_contiguous(r->dk, FLASHPORT_BF16, 4, kv_shape);
    flashport_tensor tdv = flashport_tensor_contiguous(r->dv, FLASHPORT_BF16, 4, kv_shape);
    flashport_status st = flashport_attention_forward(be, &params, &tq, &tk, &tv, &to, &tl);
    if (st == FLASHPORT_OK)
        st = flashport_attention_backward(be, &params, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk,
                                          &tdv);
    if (st == FLASHPORT_OK)
        st = flashport_synchronize(be);
    return st;
}

static result results[THREADS];

static void *worker(void *arg)
{
    result *r = (result *)arg;
    for (int i = 0; i < ROUNDS && r->st == FLASHPORT_OK; i++)
        r->st = run(r);
    return NULL;
}

/* Device buffers compared through host copies. */
static int same(const void *a, const void *b, size_t bytes)
{
    void *ha = malloc(bytes), *hb = malloc(bytes);
    int eq = ha && hb && flashport_memcpy_to_host(be, ha, a, bytes) == FLASHPORT_OK &&
             flashport_memcpy_to_host(be, hb, b, bytes) == FLASHPORT_OK &&
             memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return eq;
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "cpu";
    flashport_status st = flashport_backend_open(name, &be);
    if (st == FLASHPORT_ERR_NO_DEVICE || st == FLASHPORT_ERR_BACKEND_UNAVAILABLE) {
        printf("skip: backend '%s': %s\n", name, flashport_last_error());
        return TU_SKIP;
    }
    if (!CHECK_MSG(st == FLASHPORT_OK, "open %s: %s", name, flashport_last_error()))
        return 1;

    q_bytes = (size_t)B * N * H * D * 2;
    kv_bytes = (size_t)B * N * HKV * D * 2;
    lse_bytes = (size_t)B * H * N * 4;
    void *q, *k, *v, *dout;
    size_t sizes[4] = {q_bytes, kv_bytes, kv_bytes, q_bytes};
    void **bufs[4] = {&q, &k, &v, &dout};
    tu_rng rng = tu_rng_seed(7);
    for (int i = 0; i < 4; i++) {
        void *host = malloc(sizes[i]);
        if (!CHECK(host) || !CHECK(flashport_malloc(be, sizes[i], bufs[i]) == FLASHPORT_OK))
            return 1;
        tu_fill_uniform(host, (int64_t)sizes[i] / 2, FLASHPORT_BF16, -2.0f, 2.0f, &rng);
        CHECK(flashport_memcpy_to_device(be, *bufs[i], host, sizes[i]) == FLASHPORT_OK);
        free(host);
    }
    tq = flashport_tensor_contiguous(q, FLASHPORT_BF16, 4, q_shape);
    tk = flashport_tensor_contiguous(k, FLASHPORT_BF16, 4, kv_shape);
    tv = flashport_tensor_contiguous(v, FLASHPORT_BF16, 4, kv_shape);
    tdo = flashport_tensor_contiguous(dout, FLASHPORT_BF16, 4, q_shape);
    flashport_attention_params_init(&params);
    params.causal = 1;
    params.deterministic = 1;

    result alone;
    if (!CHECK(alloc_result(&alone) == 0))
        return 1;
    st = run(&alone);
    if (!CHECK_MSG(st == FLASHPORT_OK, "single run: %s", flashport_last_error()))
        return 1;

    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) {
        if (!CHECK(alloc_result(&results[t]) == 0))
            return 1;
        CHECK(pthread_create(&threads[t], NULL, worker, &results[t]) == 0);
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);

    for (int t = 0; t < THREADS; t++) {
        result *r = &results[t];
        CHECK_MSG(r->st == FLASHPORT_OK, "thread %d: %s", t, flashport_status_string(r->st));
        CHECK_MSG(same(r->o, alone.o, q_bytes), "thread %d: O differs", t);
        CHECK_MSG(same(r->lse, alone.lse, lse_bytes), "thread %d: LSE differs", t);
        CHECK_MSG(same(r->dq, alone.dq, q_bytes), "thread %d: dQ differs", t);
        CHECK_MSG(same(r->dk, alone.dk, kv_bytes), "thread %d: dK differs", t);
        CHECK_MSG(same(r->dv, alone.dv, kv_bytes), "thread %d: dV differs", t);
        free_result(r);
    }
    free_result(&alone);
    for (int i = 0; i < 4; i++)
        flashport_free(be, *bufs[i]);
    flashport_backend_close(be);
    printf("%d threads x %d rounds of forward + deterministic backward on '%s': %s\n", THREADS,
           ROUNDS, name, tu_failures ? "FAILED" : "bitwise identical");
    return tu_failures ? 1 : 0;
}
