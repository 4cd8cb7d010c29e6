/*
 * A consumer of an installed (or embedded) flashport: one causal forward on the CPU backend,
 * checked against a naive double-precision computation. Built by tests/consumers/run.sh three
 * ways (find_package, pkg-config, add_subdirectory) outside the source tree.
 */
#include <flashport.h>

#include <math.h>
#include <stdio.h>

enum { N = 13, H = 2, D = 24 };

int main(void)
{
    /* q, k, v, o: (1, N, H, D) */
    static float q[N * H * D], k[N * H * D], v[N * H * D], o[N * H * D];
    for (int i = 0; i < N * H * D; i++) {
        q[i] = sinf(0.37f * (float)i);
        k[i] = cosf(0.11f * (float)i);
        v[i] = sinf(0.05f * (float)i + 1.0f);
    }
    const int64_t shape[4] = {1, N, H, D};
    flashport_tensor tq = flashport_tensor_contiguous(q, FLASHPORT_F32, 4, shape);
    flashport_tensor tk = flashport_tensor_contiguous(k, FLASHPORT_F32, 4, shape);
    flashport_tensor tv = flashport_tensor_contiguous(v, FLASHPORT_F32, 4, shape);
    flashport_tensor to = flashport_tensor_contiguous(o, FLASHPORT_F32, 4, shape);
    flashport_attention_params params;
    flashport_attention_params_init(&params);
    params.causal = 1;

    flashport_backend *be;
    if (flashport_backend_open("cpu", &be) != FLASHPORT_OK ||
        flashport_attention_forward(be, &params, &tq, &tk, &tv, &to, NULL) != FLASHPORT_OK) {
        fprintf(stderr, "consumer: %s\n", flashport_last_error());
        return 1;
    }
    flashport_backend_close(be);

    double max_err = 0;
    for (int i = 0; i < N; i++)
        for (int h = 0; h < H; h++) {
            double s[N], m = -INFINITY, sum = 0;
            for (int j = 0; j <= i; j++) {
                s[j] = 0;
                for (int d = 0; d < D; d++)
                    s[j] += (double)q[(i * H + h) * D + d] * k[(j * H + h) * D + d];
                s[j] /= sqrt((double)D);
                m = s[j] > m ? s[j] : m;
            }
            for (int j = 0; j <= i; j++)
                sum += exp(s[j] - m);
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int j = 0; j <= i; j++)
                    acc += exp(s[j] - m) / sum * v[(j * H + h) * D + d];
                double e = fabs(acc - o[(i * H + h) * D + d]);
                max_err = e > max_err ? e : max_err;
            }
        }
    printf("consumer: flashport %s, causal forward on cpu, max abs error %.2e\n",
           flashport_version(), max_err);
    return max_err < 1e-5 ? 0 : 1;
}
