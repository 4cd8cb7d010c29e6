/*
 * call_time: the host time of one flashport_attention_forward / _backward call on a tiny problem,
 * through the C API alone: the baseline that bench/python_overhead.py subtracts from the same
 * call made from Python, to give the Python package's overhead per call.
 *
 *   call_time BACKEND DTYPE N D REPS [cpu]   (DTYPE f32, f16 or bf16; q, k, v [1, N, 1, D])
 *
 * Prints "forward_us BACKWARD_us": for each, the best of 7 trials of the mean over REPS calls
 * issued back to back, with one synchronize at the end of each trial (on a GPU, that is the
 * launch rate unless the kernels themselves are slower). With "cpu", times are the calling
 * thread's CPU time instead of wall time: on a loaded machine they leave out the time the thread
 * waits for a core, so they hold still where wall time does not (meaningful for the CPU backend
 * with FLASHPORT_NUM_THREADS=1, where all the work runs on this thread). bench/python_overhead.py
 * compiles it against the package's own libflashport, so both sides time the same library.
 */
#include <flashport.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int check(flashport_status st, const char *what)
{
    if (st == FLASHPORT_OK)
        return 0;
    fprintf(stderr, "call_time: %s: %s: %s\n", what, flashport_status_string(st),
            flashport_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 6 && !(argc == 7 && strcmp(argv[6], "cpu") == 0)) {
        fprintf(stderr, "usage: call_time BACKEND f32|f16|bf16 N D REPS [cpu]\n");
        return 2;
    }
    if (argc == 7)
        clock_id = CLOCK_THREAD_CPUTIME_ID;
    flashport_dtype dt = strcmp(argv[2], "f32") == 0   ? FLASHPORT_F32
                         : strcmp(argv[2], "f16") == 0 ? FLASHPORT_F16
                                                       : FLASHPORT_BF16;
    const int64_t n = atoll(argv[3]), d = atoll(argv[4]);
    const int reps = atoi(argv[5]);
    flashport_backend *be;
    if (check(flashport_backend_open(argv[1], &be), "open"))
        return 1;
    const int64_t shape[4] = {1, n, 1, d}, lshape[3] = {1, 1, n};
    const size_t bytes = (size_t)(n * d) * flashport_dtype_size(dt);
    void *buf[8], *lse;
    void *zeros = calloc(1, bytes);
    for (int i = 0; i < 8; i++)
        if (check(flashport_malloc(be, bytes, &buf[i]), "malloc") ||
            check(flashport_memcpy_to_device(be, buf[i], zeros, bytes), "copy"))
            return 1;
    if (check(flashport_malloc(be, (size_t)n * sizeof(float), &lse), "malloc"))
        return 1;
    flashport_tensor t[8];
    for (int i = 0; i < 8; i++)
        t[i] = flashport_tensor_contiguous(buf[i], dt, 4, shape);
    flashport_tensor tl = flashport_tensor_contiguous(lse, FLASHPORT_F32, 3, lshape);
    flashport_attention_params p;
    flashport_attention_params_init(&p);
    p.causal = 1;

    double best[2] = {1e30, 1e30};
    for (int trial = 0; trial < 7; trial++) {
        for (int dir = 0; dir < 2; dir++) {
            double t0 = now_us();
            for (int r = 0; r < reps; r++) {
                flashport_status st =
                    dir == 0 ? flashport_attention_forward(be, &p, &t[0], &t[1], &t[2], &t[3], &tl)
                             : flashport_attention_backward(be, &p, &t[0], &t[1], &t[2], &t[3], &tl,
                                                            &t[4], &t[5], &t[6], &t[7]);
                if (check(st, dir == 0 ? "forward" : "backward"))
                    return 1;
            }
            if (check(flashport_synchronize(be), "synchronize"))
                return 1;
            double us = (now_us() - t0) / reps;
            if (us < best[dir])
                best[dir] = us;
        }
    }
    printf("%.3f %.3f\n", best[0], best[1]);
    for (int i = 0; i < 8; i++)
        flashport_free(be, buf[i]);
    flashport_free(be, lse);
    free(zeros);
    flashport_backend_close(be);
    return 0;
}
