/*
 * Memory bound of the CPU flash path: B = 1, H = 1, N = 65536, D = 64 (f32), causal, forward and
 * backward must stay within 64 MiB of memory beyond their inputs and outputs. An Nq x Nk score
 * matrix alone would be 16 GiB.
 *
 * Measured as the growth of the process's peak resident set (getrusage ru_maxrss) across the
 * calls, after every input and output buffer has been allocated and touched, so the baseline
 * peak is the I/O itself. Not meaningful under AddressSanitizer (shadow memory): the test is
 * labelled "memory" and left out of sanitizer runs.
 *
 *   test_memory [N]     (default 65536)
 */
#include "tests/test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define LIMIT_MIB 64.0

static double peak_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
#if defined(__APPLE__)
    return (double)ru.ru_maxrss / (1024.0 * 1024.0); /* bytes */
#else
    return (double)ru.ru_maxrss / 1024.0; /* KiB */
#endif
}

int main(int argc, char **argv)
{
    const int64_t n = argc > 1 ? atoll(argv[1]) : 65536, d = 64;
    const int64_t shape[4] = {1, n, 1, d}, lse_shape[3] = {1, 1, n};
    const size_t bytes = (size_t)(n * d) * sizeof(float);

    flashport_backend *be;
    if (!CHECK_MSG(flashport_backend_open("cpu", &be) == FLASHPORT_OK, "%s",
                   flashport_last_error()))
        return 1;
    float *buf[8];
    tu_rng rng = tu_rng_seed(3);
    for (int i = 0; i < 8; i++) {
        buf[i] = malloc(bytes);
        if (!CHECK(buf[i]))
            return 1;
        tu_fill_uniform(buf[i], n * d, FLASHPORT_F32, -1.0f, 1.0f, &rng); /* touches every page */
    }
    float *lse = malloc((size_t)n * sizeof(float));
    if (!CHECK(lse))
        return 1;
    memset(lse, 0, (size_t)n * sizeof(float));

    flashport_tensor t[8];
    for (int i = 0; i < 8; i++)
        t[i] = flashport_tensor_contiguous(buf[i], FLASHPORT_F32, 4, shape);
    flashport_tensor tl = flashport_tensor_contiguous(lse, FLASHPORT_F32, 3, lse_shape);
    flashport_attention_params params;
    flashport_attention_params_init(&params);
    params.causal = 1;

    const double base = peak_mib();
    flashport_status st = flashport_attention_forward(be, &params, &t[0], &t[1], &t[2], &t[3], &tl);
    CHECK_MSG(st == FLASHPORT_OK, "forward: %s", flashport_last_error());
    const double after_fwd = peak_mib();
    st = flashport_attention_backward(be, &params, &t[0], &t[1], &t[2], &t[3], &tl, &t[4], &t[5],
                                      &t[6], &t[7]);
    CHECK_MSG(st == FLASHPORT_OK, "backward: %s", flashport_last_error());
    const double after_bwd = peak_mib();

    /* The outputs must be real results, not untouched memory: O rows are convex combinations of
     * V rows, so every |O| <= max |V| <= 1, and the last row's LSE is finite. */
    int finite = 1;
    for (int64_t i = 0; i < n * d && finite; i += 997)
        finite = buf[3][i] == buf[3][i] && buf[3][i] <= 1.0f && buf[3][i] >= -1.0f;
    CHECK_MSG(finite && lse[n - 1] > 0.0f, "forward output looks unwritten");

    printf("N=%lld D=%lld f32 causal on 'cpu': I/O %.1f MiB; extra peak: forward %.1f MiB, "
           "backward %.1f MiB (limit %.0f MiB; an N x N f32 matrix would be %.0f MiB)\n",
           (long long)n, (long long)d, 8.0 * (double)bytes / 1048576.0, after_fwd - base,
           after_bwd - base, LIMIT_MIB, (double)n * (double)n * 4.0 / 1048576.0);
    CHECK_MSG(after_fwd - base <= LIMIT_MIB, "forward used %.1f MiB extra", after_fwd - base);
    CHECK_MSG(after_bwd - base <= LIMIT_MIB, "backward used %.1f MiB extra", after_bwd - base);
    for (int i = 0; i < 8; i++)
        free(buf[i]);
    free(lse);
    flashport_backend_close(be);
    return tu_failures ? 1 : 0;
}
