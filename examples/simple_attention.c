/*
 * The smallest complete flashport program: open the backend named by FLASHPORT_BACKEND (or the
 * first argument), run causal attention forward and backward on random bf16 data, and print a
 * checksum. Works unchanged on every backend, because tensors are allocated and filled through
 * the backend's memory helpers.
 *
 *   ./flashport-example            # FLASHPORT_BACKEND or auto
 *   ./flashport-example cpu
 */
#include <flashport.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        flashport_status st_ = (call);                                                             \
        if (st_ != FLASHPORT_OK) {                                                                 \
            fprintf(stderr, "%s failed: %s: %s\n", #call, flashport_status_string(st_),            \
                    flashport_last_error());                                                       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    const int64_t B = 2, N = 512, H = 8, HKV = 2, D = 64; /* GQA 4:1 */
    const int64_t q_shape[4] = {B, N, H, D}, kv_shape[4] = {B, N, HKV, D};
    const int64_t lse_shape[3] = {B, H, N};
    const size_t q_elems = (size_t)(B * N * H * D), kv_elems = (size_t)(B * N * HKV * D);

    flashport_backend *be;
    CHECK(flashport_backend_open(argc > 1 ? argv[1] : NULL, &be));
    printf("flashport %s, backend '%s'\n", flashport_version(), flashport_backend_name(be));

    /* bf16 data is made and read in f32, converted with flashport_convert */
    uint16_t *host = malloc(q_elems * sizeof *host);
    float *host_f32 = malloc(q_elems * sizeof *host_f32);
    if (!host || !host_f32)
        return 1;
    void *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    CHECK(flashport_malloc(be, q_elems * 2, &q));
    CHECK(flashport_malloc(be, kv_elems * 2, &k));
    CHECK(flashport_malloc(be, kv_elems * 2, &v));
    CHECK(flashport_malloc(be, q_elems * 2, &o));
    CHECK(flashport_malloc(be, (size_t)(B * H * N) * 4, &lse));
    CHECK(flashport_malloc(be, q_elems * 2, &dout));
    CHECK(flashport_malloc(be, q_elems * 2, &dq));
    CHECK(flashport_malloc(be, kv_elems * 2, &dk));
    CHECK(flashport_malloc(be, kv_elems * 2, &dv));
    void *inputs[4] = {q, k, v, dout};
    size_t counts[4] = {q_elems, kv_elems, kv_elems, q_elems};
    srand(1);
    for (int t = 0; t < 4; t++) {
        for (size_t i = 0; i < counts[t]; i++)
            host_f32[i] = (float)((double)rand() / RAND_MAX) * 2.0f - 1.0f;
        CHECK(flashport_convert(host, FLASHPORT_BF16, host_f32, FLASHPORT_F32, counts[t]));
        CHECK(flashport_memcpy_to_device(be, inputs[t], host, counts[t] * 2));
    }

    flashport_tensor tq = flashport_tensor_contiguous(q, FLASHPORT_BF16, 4, q_shape);
    flashport_tensor tk = flashport_tensor_contiguous(k, FLASHPORT_BF16, 4, kv_shape);
    flashport_tensor tv = flashport_tensor_contiguous(v, FLASHPORT_BF16, 4, kv_shape);
    flashport_tensor to = flashport_tensor_contiguous(o, FLASHPORT_BF16, 4, q_shape);
    flashport_tensor tl = flashport_tensor_contiguous(lse, FLASHPORT_F32, 3, lse_shape);
    flashport_tensor tdo = flashport_tensor_contiguous(dout, FLASHPORT_BF16, 4, q_shape);
    flashport_tensor tdq = flashport_tensor_contiguous(dq, FLASHPORT_BF16, 4, q_shape);
    flashport_tensor tdk = flashport_tensor_contiguous(dk, FLASHPORT_BF16, 4, kv_shape);
    flashport_tensor tdv = flashport_tensor_contiguous(dv, FLASHPORT_BF16, 4, kv_shape);

    flashport_attention_params params;
    flashport_attention_params_init(&params);
    params.causal = 1;
    CHECK(flashport_attention_forward(be, &params, &tq, &tk, &tv, &to, &tl));
    CHECK(
        flashport_attention_backward(be, &params, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv));
    CHECK(flashport_synchronize(be));

    void *results[2] = {o, dq};
    const char *names[2] = {"O", "dQ"};
    for (int t = 0; t < 2; t++) {
        CHECK(flashport_memcpy_to_host(be, host, results[t], q_elems * 2));
        CHECK(flashport_convert(host_f32, FLASHPORT_F32, host, FLASHPORT_BF16, q_elems));
        double sum = 0.0;
        for (size_t i = 0; i < q_elems; i++)
            sum += fabs(host_f32[i]);
        printf("sum |%s| = %.6f over %zu elements\n", names[t], sum, q_elems);
    }

    void *all[9] = {q, k, v, o, lse, dout, dq, dk, dv};
    for (int i = 0; i < 9; i++)
        CHECK(flashport_free(be, all[i]));
    flashport_backend_close(be);
    free(host);
    free(host_f32);
    return 0;
}
