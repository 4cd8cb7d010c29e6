/*
 * Self-test of the CUDA emulator (run_emu.sh runs it before the test table): one warp computes
 * 16x16x16 products through ptx/sm80.cuh's instruction wrappers (cp.async, ldmatrix x4 with
 * and without .trans, mma.sync m16n8k16) and the result is compared with a plain loop, for f16
 * and bf16. The lane addresses and fragment positions are written here from the PTX ISA, not
 * from the kernels' helpers, so a wrong lane mapping in the emulator fails:
 *   C = Cinit + A B, B read as [n][k] rows (ldmatrix) and as [k][n] rows (ldmatrix.trans);
 *   E = (A B) B2 with A B's C fragments repacked into the A fragment (what P V and dS K do);
 *   __shfl_xor_sync over every lane mask; ex2.approx.ftz at 0, 3, -130, -inf; atomicAdd on
 *   float and float2 from every lane.
 * Inputs are small integers, so every sum is exact and the comparison is bitwise.
 * Exit 0 when everything matches, 1 otherwise.
 */
#include "backends/cuda/sm80/common.cuh"

#include <stdio.h>
#include <stdlib.h>

struct st_args {
    const uint16_t *a, *bn, *bk, *b2n; /* 16x16 each: A [m][k], B as [n][k] and [k][n], B2 [n][k] */
    float *c_n, *c_k, *e;              /* 16x16 outputs */
    float *shfl;                       /* [5][32] */
    float *ex2;                        /* [4] */
    float *atom;                       /* [4]: float2 sum, float sum, unused; zeroed */
};

/* Cinit, distinct per element. */
static __host__ __device__ float c_init(int row, int col)
{
    return (float)(row * 16 + col);
}

/* Writes the C fragments of n tiles 0 and 1 (ISA layout) to a 16x16 row-major matrix. */
static __device__ void store_c(float *out, const float c[2][4], int lane)
{
    const int g = lane >> 2, t = lane & 3;
    for (int j = 0; j < 2; ++j)
        for (int i = 0; i < 4; ++i)
            out[(g + 8 * (i >> 1)) * 16 + 8 * j + 2 * t + (i & 1)] = c[j][i];
}

// 32 threads, 2048 bytes of dynamic shared memory: A, Bn, Bk, B2n as 16 rows of 32 bytes.
template <typename T> __global__ void st_kernel(const st_args p)
{
    extern __shared__ __align__(128) unsigned char fp_smem[];
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const uint32_t base = fp_smem_addr(fp_smem);
    const uint16_t *src[4] = {p.a, p.bn, p.bk, p.b2n};
    for (int m = 0; m < 4; ++m) /* 32 chunks of 16 bytes per matrix, one per lane */
        fp_cp_async16(base + 512 * m + 16 * lane, src[m] + 8 * lane, 16);
    fp_cp_async_commit();
    fp_cp_async_wait<0>();
    __syncthreads();

    /* ldmatrix x4: lane l gives row l % 8 of matrix l / 8. */
    const int i = lane >> 3, j = lane & 7;
    uint32_t a[4], bn[4], bk[4], b2[4];
    /* A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) */
    fp_ldsm_x4(a, base + ((i & 1) * 8 + j) * 32 + (i >> 1) * 16);
    /* B as [n][k]: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) */
    fp_ldsm_x4(bn, base + 512 + ((i >> 1) * 8 + j) * 32 + (i & 1) * 16);
    fp_ldsm_x4(b2, base + 1536 + ((i >> 1) * 8 + j) * 32 + (i & 1) * 16);
    /* B as [k][n], transposed: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, ..) */
    fp_ldsm_x4_t(bk, base + 1024 + ((i & 1) * 8 + j) * 32 + (i >> 1) * 16);

    float cn[2][4], ck[2][4], ab[2][4], e[2][4];
    for (int nt = 0; nt < 2; ++nt)
        for (int r = 0; r < 4; ++r) {
            cn[nt][r] = ck[nt][r] = c_init(g + 8 * (r >> 1), 8 * nt + 2 * t + (r & 1));
            ab[nt][r] = e[nt][r] = 0.0f;
        }
    for (int nt = 0; nt < 2; ++nt) {
        fp_mma<T>(cn[nt], a, bn[2 * nt], bn[2 * nt + 1]);
        fp_mma<T>(ck[nt], a, bk[2 * nt], bk[2 * nt + 1]);
        fp_mma<T>(ab[nt], a, bn[2 * nt], bn[2 * nt + 1]);
    }
    /* A fragment register r holds rows g + 8 (r & 1), k 2t + 8 (r >> 1): k < 8 comes from n
     * tile 0 of A B, k >= 8 from n tile 1; rows g from C regs 0, 1, rows g + 8 from 2, 3. */
    uint32_t pa[4];
    for (int r = 0; r < 4; ++r)
        pa[r] = fp_pack2<T>(ab[r >> 1][2 * (r & 1)], ab[r >> 1][2 * (r & 1) + 1]);
    for (int nt = 0; nt < 2; ++nt)
        fp_mma<T>(e[nt], pa, b2[2 * nt], b2[2 * nt + 1]);
    store_c(p.c_n, cn, lane);
    store_c(p.c_k, ck, lane);
    store_c(p.e, e, lane);

    for (int m = 0; m < 5; ++m)
        p.shfl[32 * m + lane] = __shfl_xor_sync(0xffffffffu, (float)lane, 1 << m);
    atomicAdd(reinterpret_cast<float2 *>(p.atom), make_float2((float)lane, (float)(2 * lane)));
    atomicAdd(p.atom + 2, 1.0f);
    if (lane == 0) {
        p.ex2[0] = fp_exp2(0.0f);
        p.ex2[1] = fp_exp2(3.0f);
        p.ex2[2] = fp_exp2(-130.0f);
        p.ex2[3] = fp_exp2(-INFINITY);
    }
}

static uint16_t to_bits(float x, int bf16)
{
    return bf16 ? fp_f32_to_bf16(x) : fp_f32_to_f16(x);
}

/* Counts mismatches of a 16x16 result against want. */
static int compare(const char *what, const float *got, const double *want)
{
    int bad = 0;
    for (int e = 0; e < 256; ++e)
        if ((double)got[e] != want[e]) {
            if (bad++ < 4)
                printf("  %s[%d][%d] = %g, expected %g\n", what, e / 16, e % 16, got[e], want[e]);
        }
    return bad;
}

template <typename T> static int run(int bf16)
{
    float a[256], b[256], b2[256]; /* A [m][k], B [k][n], B2 [k][n] */
    uint16_t ha[256], hbn[256], hbk[256], hb2n[256];
    srand(bf16 ? 7 : 3);
    for (int e = 0; e < 256; ++e) {
        a[e] = (float)(rand() % 5 - 2);
        b[e] = (float)(rand() % 5 - 2);
        b2[e] = (float)(rand() % 5 - 2);
    }
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            ha[r * 16 + c] = to_bits(a[r * 16 + c], bf16);
            hbk[r * 16 + c] = to_bits(b[r * 16 + c], bf16); /* [k = r][n = c] */
            hbn[c * 16 + r] = to_bits(b[r * 16 + c], bf16); /* [n = c][k = r] */
            hb2n[c * 16 + r] = to_bits(b2[r * 16 + c], bf16);
        }
    double want_c[256], ab[256], want_e[256];
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            double s = 0.0;
            for (int k = 0; k < 16; ++k)
                s += (double)a[r * 16 + k] * b[k * 16 + c];
            ab[r * 16 + c] = s;
            want_c[r * 16 + c] = s + c_init(r, c);
        }
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            double s = 0.0;
            for (int k = 0; k < 16; ++k)
                s += ab[r * 16 + k] * b2[k * 16 + c];
            want_e[r * 16 + c] = s;
        }

    uint16_t *d_in;
    float *d_out;
    if (cudaMalloc((void **)&d_in, 4 * 256 * 2) != cudaSuccess ||
        cudaMalloc((void **)&d_out, (3 * 256 + 5 * 32 + 8) * 4) != cudaSuccess) {
        printf("  cudaMalloc failed\n");
        return 1;
    }
    cudaMemcpy(d_in, ha, 512, cudaMemcpyHostToDevice);
    cudaMemcpy(d_in + 256, hbn, 512, cudaMemcpyHostToDevice);
    cudaMemcpy(d_in + 512, hbk, 512, cudaMemcpyHostToDevice);
    cudaMemcpy(d_in + 768, hb2n, 512, cudaMemcpyHostToDevice);
    const float zeros[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    cudaMemcpy(d_out + 768 + 164, zeros, sizeof zeros, cudaMemcpyHostToDevice);
    st_args p = {d_in,        d_in + 256,  d_in + 512,  d_in + 768,        d_out,
                 d_out + 256, d_out + 512, d_out + 768, d_out + 768 + 160, d_out + 768 + 164};
    st_kernel<T><<<1, 32, 2048, 0>>>(p);
    int bad = cudaGetLastError() != cudaSuccess;
    float out[3 * 256 + 5 * 32 + 8];
    cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost);
    bad += compare("A B (ldmatrix)", out, want_c);
    bad += compare("A B (ldmatrix.trans)", out + 256, want_c);
    bad += compare("(A B) B2", out + 512, want_e);
    for (int m = 0; m < 5; ++m)
        for (int l = 0; l < 32; ++l)
            bad += out[768 + 32 * m + l] != (float)(l ^ (1 << m));
    const float *ex2 = out + 768 + 160;
    bad += ex2[0] != 1.0f || ex2[1] != 8.0f || ex2[2] != 0.0f || ex2[3] != 0.0f;
    bad += ex2[4] != 496.0f || ex2[5] != 992.0f || ex2[6] != 32.0f; /* atomics: sums over lanes */
    cudaFree(d_in);
    cudaFree(d_out);
    printf("%s: %s\n", bf16 ? "bf16" : "f16", bad ? "FAIL" : "ok");
    return bad != 0;
}

int main(void)
{
    const int bad = run<__half>(0) + run<__nv_bfloat16>(1);
    return bad ? 1 : 0;
}
