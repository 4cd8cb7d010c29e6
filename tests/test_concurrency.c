/*
 * Concurrent use of the library's process-wide state, for ThreadSanitizer (.ci/run builds it with
 * -fsanitize=thread and OpenMP off) and as a plain test. test_threads covers many threads on one
 * handle; here each thread, from a common start:
 *   - opens its own handle ("cpu" or "reference", alternating), runs a small forward into its own
 *     outputs and checks them against the result computed alone first (bitwise), then closes it;
 *   - opens names that fail (unknown, malformed, a missing GPU plugin) and checks that its own
 *     flashport_last_error() names what it asked for (the message is per thread);
 *   - lists the available backends, opens "auto", and opens the test plugin "testdev" (first
 *     load races on the plugin registry) when FLASHPORT_PLUGIN_PATH provides it.
 */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier */

#include "tests/test_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { THREADS = 6, ROUNDS = 4, N = 70, H = 2, D = 16 };

static float q[N * H * D], k[N * H * D], v[N * H * D];
static float want_o[2][N * H * D];
static pthread_barrier_t start;
static int have_testdev;

static flashport_status forward(const char *name, float *o)
{
    flashport_backend *be;
    flashport_status st = flashport_backend_open(name, &be);
    if (st != FLASHPORT_OK)
        return st;
    const int64_t s[4] = {1, N, H, D};
    flashport_tensor tq = flashport_tensor_contiguous(q, FLASHPORT_F32, 4, s);
    flashport_tensor tk = flashport_tensor_contiguous(k, FLASHPORT_F32, 4, s);
    flashport_tensor tv = flashport_tensor_contiguous(v, FLASHPORT_F32, 4, s);
    flashport_tensor to = flashport_tensor_contiguous(o, FLASHPORT_F32, 4, s);
    flashport_attention_params p;
    flashport_attention_params_init(&p);
    p.causal = 1;
    st = flashport_attention_forward(be, &p, &tq, &tk, &tv, &to, NULL);
    flashport_backend_close(be);
    return st;
}

static void *worker(void *arg)
{
    const int me = (int)(intptr_t)arg;
    int *bad = calloc(1, sizeof *bad);
    float *o = malloc(sizeof(float) * N * H * D);
    char name[64], avail[256];
    pthread_barrier_wait(&start);
    for (int round = 0; round < ROUNDS && bad && o; round++) {
        const int which = (me + round) % 2;
        if (forward(which ? "reference" : "cpu", o) != FLASHPORT_OK ||
            memcmp(o, want_o[which], sizeof(float) * N * H * D) != 0)
            (*bad)++;
        snprintf(name, sizeof name, "nosuch%d_%d", me, round);
        flashport_backend *be;
        if (flashport_backend_open(name, &be) != FLASHPORT_ERR_BACKEND_UNKNOWN ||
            !strstr(flashport_last_error(), name))
            (*bad)++;
        if (flashport_backend_open("Bad/Name", &be) != FLASHPORT_ERR_BACKEND_UNKNOWN ||
            !strstr(flashport_last_error(), "'Bad/Name' is not a backend name"))
            (*bad)++;
        if (flashport_backend_open(round % 2 ? "cuda" : "hip", &be) == FLASHPORT_OK)
            flashport_backend_close(be);
        if (flashport_available_backends(avail, sizeof avail, NULL) != FLASHPORT_OK ||
            !strstr(avail, "cpu"))
            (*bad)++;
        if (flashport_backend_open("auto", &be) == FLASHPORT_OK)
            flashport_backend_close(be);
        else
            (*bad)++;
        if (have_testdev) {
            if (flashport_backend_open("testdev", &be) == FLASHPORT_OK)
                flashport_backend_close(be);
            else
                (*bad)++;
        }
    }
    free(o);
    return bad;
}

int main(void)
{
    tu_rng r = tu_rng_seed(11);
    for (int i = 0; i < N * H * D; i++) {
        q[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
        k[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
        v[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
    }
    const char *path = getenv("FLASHPORT_PLUGIN_PATH");
    have_testdev = path && *path;
    if (!CHECK(forward("cpu", want_o[0]) == FLASHPORT_OK) ||
        !CHECK(forward("reference", want_o[1]) == FLASHPORT_OK))
        return 1;
    pthread_t t[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < THREADS; i++) {
        void *res = NULL;
        CHECK(pthread_join(t[i], &res) == 0);
        CHECK_MSG(res && *(int *)res == 0, "thread %d: %d failed checks", i,
                  res ? *(int *)res : -1);
        free(res);
    }
    pthread_barrier_destroy(&start);
    return tu_finish("test_concurrency", "%d threads x %d rounds passed", THREADS, ROUNDS);
}
