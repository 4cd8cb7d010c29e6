/*
 * Self-test of the CUDA emulator's sm90 instructions (run_emu.sh runs it with selftest.cu when
 * the sm90 backward is built): ptx/sm90.cuh's and ptx/wgmma_gen.cuh's wrappers against plain
 * loops. Shared-memory layouts, descriptors and fragment positions are written here from the
 * PTX ISA (128-byte swizzle: the 16-byte chunk bits 4-6 of an address XORed with bits 7-9;
 * descriptor bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 62-63 swizzle mode 1), not
 * from the kernels' helpers:
 *   TMA: a 4-d tile load (128-byte swizzle) of a box that reaches past the tensor's end in
 *   dimensions 0 and 1 and one at negative coordinates (zero fill), a bulk copy on the same
 *   mbarrier (arrive.expect_tx with the sum of their bytes), data read as the ISA's layout;
 *   mbarrier: a fresh barrier's parity-1 wait returns at once, a 128-arrival phase, and a copy
 *   read before its barrier's wait reads as poison (the emulator lands copies at the wait);
 *   wgmma (one warpgroup, f16 and bf16, two k steps of 16): A and B K-major (m64n32, as the
 *   S^T products), both MN-major (m64n64, dS K), A K-major and B MN-major (m64n128, the
 *   D = 256 dV / dK over the other half), A from registers and B MN-major (m64n128), and ss
 *   K-major m64n128; accumulate = 0 ignores d; accumulators read before the wait are NaN;
 *   cp.reduce.async.bulk .add.f32 from two threads into one row; named barriers;
 *   in child processes, that the run stops with the emulator's report for a wait on an mbarrier
 *   phase that can never complete (an arrival short: a hang, not an endless spin) and for a
 *   write to a wgmma's shared operand between its issue and its wait_group (a race).
 * And what the sm90 forward adds (st90f_kernel): wgmma e4m3 m64nNk32 over two k steps, A and B
 * K-major in shared memory (m64n96, m64n128: the fp8 Q K^T) and A from registers (m64n128: P V
 * over V^T; fragment register r = row g + 8 (r & 1), bytes k = 4 t + 16 (r >> 1) + 0..3);
 * stmatrix x1, x2, x4 and x4.trans (the inverse of ldmatrix: lane l's register i is row l / 4,
 * elements 2 (l % 4), +1 of matrix i, or with .trans those of column l / 4), the rows of gapped
 * addresses around which the poison must stay; static __shared__ variables (poisoned at the
 * block's start, one copy per block, an mbarrier in one, cvta beyond the dynamic memory);
 * atomicOr and atomicAdd(int *) on shared and global words; __byte_perm and __vcmpeq4 against
 * the CUDA documentation's examples; and in a child process that static variables beyond the
 * block's shared-memory limit stop the run.
 * Inputs are small integers (e4m3: -2 .. 2 in halves): every sum is exact and the comparison is
 * bitwise. Exit 0 when everything matches, 1 otherwise.
 */
#include "backends/cuda/sm80/common.cuh"
#include "backends/cuda/sm90/common.cuh"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

enum { NCASE = 5, KD = 32, MAXN = 128 };
struct wcase {
    int n, ta, tb, regs;
};
static const wcase cases[NCASE] = {
    {32, 0, 0, 0}, {64, 1, 1, 0}, {128, 0, 1, 0}, {128, 0, 1, 1}, {128, 0, 0, 0}};

struct st90_args {
    CUtensorMap map;       /* over tin: (80, 70, 2, 1) elements */
    const uint16_t *a, *b; /* A [64][KD] row-major, B [KD][MAXN] row-major (16-bit codes) */
    const float *row;      /* 64 floats for the bulk copy and the reductions */
    float *out;            /* [NCASE][64][MAXN] */
    uint16_t *tma_out;     /* [2][64][64]: the two boxes as read from shared memory */
    float *red;            /* 64 floats, zeroed: two reductions of row */
    int *flags;            /* [8] */
};

static __host__ __device__ uint32_t swz(uint32_t addr)
{
    return addr ^ (((addr >> 7) & 7) << 4);
}
static __host__ __device__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)(addr >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 |
           (uint64_t)1 << 62;
}

/* shared memory: 0 barriers; 1024 the two TMA boxes (8 KiB each); 17408 the bulk copy (256 B);
 * 18432 A (8 KiB); 26624 B (16 KiB) */
enum { S_BAR = 0, S_BOX = 1024, S_ROW = 17408, S_A = 18432, S_B = 26624, S_END = 43008 };

template <typename T, int N> static __device__ void wg_case(const st90_args &p, int ci)
{
    const wcase c = cases[ci];
    const int tid = threadIdx.x, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    extern __shared__ __align__(1024) unsigned char fp_smem[];
    unsigned char *sm = fp_smem;
    /* A: K-major rows of 128 bytes (64 rows), or MN-major (KD rows of 64 m); B: K-major (N rows),
     * or MN-major (KD rows of 64 n per 4 KiB panel) */
    for (int e = tid; e < 64 * KD; e += 128) {
        const int m = e / KD, k = e % KD;
        const uint32_t off = c.ta ? k * 128 + m * 2 : m * 128 + k * 2;
        memcpy(sm + swz(S_A + off), &p.a[m * KD + k], 2);
    }
    for (int e = tid; e < KD * N; e += 128) {
        const int k = e / N, n = e % N;
        const uint32_t off = c.tb ? (n / 64) * 4096 + k * 128 + (n % 64) * 2 : n * 128 + k * 2;
        memcpy(sm + swz(S_B + off), &p.b[k * MAXN + n], 2);
    }
    __syncthreads();
    float d[N / 2];
    for (int i = 0; i < N / 2; ++i) /* C init for the register form (it accumulates), else junk */
        d[i] = c.regs ? (float)(i + tid) : 12345.0f;
    fp_wgmma_fence();
    for (int s = 0; s < KD / 16; ++s) {
        const uint64_t da =
            c.ta ? desc(S_A + s * 16 * 128, 8192, 1024) : desc(S_A + 32 * s, 16, 1024);
        const uint64_t db =
            c.tb ? desc(S_B + s * 16 * 128, 4096, 1024) : desc(S_B + 32 * s, 16, 1024);
        if (c.regs) {
            uint32_t a[4];
            for (int r = 0; r < 4; ++r) {
                const int m = 16 * warp + g + 8 * (r & 1), k = 16 * s + 2 * t + 8 * (r >> 1);
                a[r] = (uint32_t)p.a[m * KD + k] | (uint32_t)p.a[m * KD + k + 1] << 16;
            }
            if constexpr (N == 128)
                fp_wgmma<T, 128>::rs(d, a, db);
        } else if (c.ta && c.tb) {
            if constexpr (N == 64)
                fp_wgmma_ss_tt64<T>(d, da, db, s > 0);
        } else if (c.tb) {
            if constexpr (N == 128)
                fp_wgmma_ss_bt128<T>(d, da, db, s > 0);
        } else {
            fp_wgmma<T, N>::ss(d, da, db, s > 0);
        }
    }
    fp_wgmma_commit();
    if (tid == 0 && !isnan(d[0]))
        p.flags[2] = 1; /* the accumulators before the wait */
    fp_wgmma_wait<0>();
    for (int i = 0; i < N / 2; ++i) {
        const int row = 16 * warp + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t + (i & 1);
        p.out[(ci * 64 + row) * MAXN + col] = d[i];
    }
    __syncthreads();
}

template <typename T> __global__ void st90_kernel(const __grid_constant__ st90_args p)
{
    extern __shared__ __align__(1024) unsigned char fp_smem[];
    const int tid = threadIdx.x;
    if (tid == 0) {
        fp_mbar_init(S_BAR, 1);
        fp_mbar_init(S_BAR + 8, 128);
        fp_mbar_fence_init();
    }
    __syncthreads();
    fp_mbar_wait(S_BAR + 8, 1); /* a fresh barrier: the phase "before" phase 0 is complete */
    if (tid == 0) {
        fp_mbar_arrive_expect_tx(S_BAR, 2 * 8192 + 256);
        fp_tma_load_4d(S_BOX, &p.map, S_BAR, 64, 32, 1, 0);
        fp_tma_load_4d(S_BOX + 8192, &p.map, S_BAR, -8, -4, 1, 0);
        fp_bulk_load(S_ROW, p.row, 256, S_BAR);
        uint16_t early;
        memcpy(&early, fp_smem + S_BOX, 2);
        p.flags[0] = early != 0xffff; /* not landed before the wait */
    }
    fp_mbar_wait(S_BAR, 0);
    for (int e = tid; e < 2 * 64 * 64; e += 128) {
        const int box = e / 4096, r = e / 64 % 64, col = e % 64;
        memcpy(&p.tma_out[e], fp_smem + swz(S_BOX + box * 8192 + r * 128 + col * 2), 2);
    }
    /* a phase of 128 arrivals, then its wait */
    fp_mbar_arrive(S_BAR + 8);
    fp_mbar_wait(S_BAR + 8, 0);
    /* named barrier between warps 0-1 and 2-3 separately, then the reductions */
    fp_named_bar_sync(1 + tid / 64, 64);
    if (tid == 0 || tid == 32) {
        fp_bulk_reduce_add_f32(p.red, S_ROW, 256);
        fp_bulk_commit();
        fp_bulk_wait_read();
    }
    __syncthreads();
    wg_case<T, 32>(p, 0);
    wg_case<T, 64>(p, 1);
    wg_case<T, 128>(p, 2);
    wg_case<T, 128>(p, 3);
    wg_case<T, 128>(p, 4);
}

static uint16_t to_bits(float x, int bf16)
{
    return bf16 ? fp_f32_to_bf16(x) : fp_f32_to_f16(x);
}

template <typename T> static int run(int bf16)
{
    int bad = 0;
    /* the tensor of the TMA test: (80, 70, 2, 1) 16-bit elements, value code e + 1 */
    const int D0 = 80, D1 = 70, D2 = 2;
    static uint16_t tin[80 * 70 * 2];
    for (int e = 0; e < D0 * D1 * D2; ++e)
        tin[e] = (uint16_t)(e + 1);
    static float a[64 * KD], b[KD * MAXN];
    static uint16_t ha[64 * KD], hb[KD * MAXN];
    srand(bf16 ? 11 : 5);
    for (int e = 0; e < 64 * KD; ++e) {
        a[e] = (float)(rand() % 5 - 2);
        ha[e] = to_bits(a[e], bf16);
    }
    for (int e = 0; e < KD * MAXN; ++e) {
        b[e] = (float)(rand() % 5 - 2);
        hb[e] = to_bits(b[e], bf16);
    }
    float row[64];
    for (int i = 0; i < 64; ++i)
        row[i] = (float)(i - 20);

    void *d_tin, *d_a, *d_b, *d_row, *d_out, *d_tma, *d_red, *d_flags;
    const size_t out_bytes = NCASE * 64 * MAXN * 4;
    if (cudaMalloc(&d_tin, sizeof tin) || cudaMalloc(&d_a, sizeof ha) ||
        cudaMalloc(&d_b, sizeof hb) || cudaMalloc(&d_row, sizeof row) ||
        cudaMalloc(&d_out, out_bytes) || cudaMalloc(&d_tma, 2 * 64 * 64 * 2) ||
        cudaMalloc(&d_red, 256) || cudaMalloc(&d_flags, 32)) {
        printf("  cudaMalloc failed\n");
        return 1;
    }
    cudaMemcpy(d_tin, tin, sizeof tin, cudaMemcpyHostToDevice);
    cudaMemcpy(d_a, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(d_b, hb, sizeof hb, cudaMemcpyHostToDevice);
    cudaMemcpy(d_row, row, sizeof row, cudaMemcpyHostToDevice);
    cudaMemsetAsync(d_red, 0, 256, 0);
    cudaMemsetAsync(d_flags, 0, 32, 0);

    st90_args p;
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        printf("  no cuTensorMapEncodeTiled\n");
        return 1;
    }
    const cuuint64_t dims[4] = {(cuuint64_t)D0, (cuuint64_t)D1, (cuuint64_t)D2, 1};
    const cuuint64_t strides[3] = {D0 * 2, D0 * D1 * 2, D0 * D1 * D2 * 2};
    const cuuint32_t box[4] = {64, 64, 1, 1}, estr[4] = {1, 1, 1, 1};
    if (((fp_encode_tiled_fn)fn)(&p.map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, d_tin, dims, strides,
                                 box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        printf("  cuTensorMapEncodeTiled refused the map\n");
        return 1;
    }
    p.a = (const uint16_t *)d_a;
    p.b = (const uint16_t *)d_b;
    p.row = (const float *)d_row;
    p.out = (float *)d_out;
    p.tma_out = (uint16_t *)d_tma;
    p.red = (float *)d_red;
    p.flags = (int *)d_flags;
    cudaFuncSetAttribute(st90_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, S_END);
    st90_kernel<T><<<1, 128, S_END, 0>>>(p);
    bad += cudaGetLastError() != cudaSuccess;

    static float out[NCASE * 64 * MAXN];
    static uint16_t tma[2 * 64 * 64];
    float red[64];
    int flags[8];
    cudaMemcpy(out, d_out, out_bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(tma, d_tma, sizeof tma, cudaMemcpyDeviceToHost);
    cudaMemcpy(red, d_red, sizeof red, cudaMemcpyDeviceToHost);
    cudaMemcpy(flags, d_flags, sizeof flags, cudaMemcpyDeviceToHost);

    /* the boxes at (64, 32, 1, 0) and (-8, -4, 1, 0): zero outside the tensor */
    int bad_tma = 0;
    const int c0[2] = {64, -8}, c1[2] = {32, -4};
    for (int bx = 0; bx < 2; ++bx)
        for (int r = 0; r < 64; ++r)
            for (int col = 0; col < 64; ++col) {
                const int x0 = c0[bx] + col, x1 = c1[bx] + r;
                const bool in = x0 >= 0 && x0 < D0 && x1 >= 0 && x1 < D1;
                const uint16_t want = in ? tin[(1 * D1 + x1) * D0 + x0] : 0;
                bad_tma += tma[(bx * 64 + r) * 64 + col] != want;
            }
    int bad_red = 0;
    for (int i = 0; i < 64; ++i)
        bad_red += red[i] != 2.0f * row[i];
    int bad_w[NCASE] = {0};
    for (int ci = 0; ci < NCASE; ++ci) {
        const wcase c = cases[ci];
        for (int m = 0; m < 64; ++m)
            for (int n = 0; n < c.n; ++n) {
                double s = 0.0;
                for (int k = 0; k < KD; ++k)
                    s += (double)a[m * KD + k] * b[k * MAXN + n];
                if (c.regs) { /* C init: element i of thread tid is i + tid */
                    const int warp = m / 16, g = m % 8, t = n % 8 / 2;
                    const int i = 4 * (n / 8) + 2 * ((m % 16) / 8) + (n & 1);
                    s += (double)(i + 32 * warp + 4 * g + t);
                }
                bad_w[ci] += out[(ci * 64 + m) * MAXN + n] != (float)s;
            }
    }
    bad += bad_tma + bad_red + flags[0] + flags[2];
    printf("%s: TMA 4-d (128-byte swizzle, out-of-bounds zero fill) %s; bulk copy + reduction %s; "
           "copy read before its wait is poison %s; accumulators NaN before the wait %s\n",
           bf16 ? "bf16" : "f16", bad_tma ? "FAIL" : "ok", bad_red ? "FAIL" : "ok",
           flags[0] ? "FAIL" : "ok", flags[2] ? "FAIL" : "ok");
    static const char *const names[NCASE] = {"ss K-major m64n32", "ss MN-major both m64n64",
                                             "ss A K-major, B MN-major m64n128",
                                             "rs B MN-major m64n128", "ss K-major m64n128"};
    for (int ci = 0; ci < NCASE; ++ci) {
        bad += bad_w[ci];
        printf("%s: wgmma %s: %s\n", bf16 ? "bf16" : "f16", names[ci], bad_w[ci] ? "FAIL" : "ok");
    }
    cudaFree(d_tin);
    cudaFree(d_a);
    cudaFree(d_b);
    cudaFree(d_row);
    cudaFree(d_out);
    cudaFree(d_tma);
    cudaFree(d_red);
    cudaFree(d_flags);
    return bad != 0;
}

/* ---- the forward's instructions ---- */

enum { F_KD = 64, F_NCASE = 3 };
struct fcase {
    int n, regs;
};
static const fcase fcases[F_NCASE] = {{96, 0}, {128, 0}, {128, 1}};
struct st90f_args {
    const uint8_t *a, *b; /* e4m3 codes: A [64][F_KD], B [F_KD][128] row-major */
    float *out;           /* [F_NCASE][64][128] */
    uint8_t *st;          /* the stmatrix region, copied out: [4][2048] */
    unsigned *gword;      /* [2]: global atomics */
    int *flags;           /* [8] */
};
/* shared memory: A 8 KiB (64 rows of 128 bytes, K-major), B 16 KiB (128 rows), then the stmatrix
 * region (4 x 2 KiB: one per form) */
enum { F_A = 0, F_B = 8192, F_ST = 24576, F_END = 32768 };

template <int N> static __device__ void f8_case(const st90f_args &p, int ci)
{
    const fcase c = fcases[ci];
    const int tid = threadIdx.x, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    extern __shared__ __align__(1024) unsigned char fp_smem[];
    for (int e = tid; e < 64 * F_KD; e += 128) /* A (m, k): row m, byte k */
        fp_smem[swz(F_A + (e / F_KD) * 128 + e % F_KD)] = p.a[e];
    for (int e = tid; e < F_KD * N; e += 128) { /* B (k, n): row n, byte k */
        const int k = e / N, n = e % N;
        fp_smem[swz(F_B + n * 128 + k)] = p.b[k * 128 + n];
    }
    __syncthreads();
    float d[N / 2];
    for (int i = 0; i < N / 2; ++i)
        d[i] = 12345.0f; /* ignored: the first step does not accumulate */
    fp_wgmma_fence();
    for (int s = 0; s < F_KD / 32; ++s) {
        const uint64_t db = desc(F_B + 32 * s, 16, 1024);
        if (c.regs) {
            uint32_t a[4];
            for (int r = 0; r < 4; ++r) {
                const int m = 16 * warp + g + 8 * (r & 1), k = 32 * s + 4 * t + 16 * (r >> 1);
                a[r] = 0;
                for (int e = 0; e < 4; ++e)
                    a[r] |= (uint32_t)p.a[m * F_KD + k + e] << 8 * e;
            }
            if constexpr (N == 128)
                fp_wgmma_rs_m64n128k32_e4m3(d, a, db, s > 0);
        } else {
            fp_wgmma_e4m3<N>::ss(d, desc(F_A + 32 * s, 16, 1024), db, s > 0);
        }
    }
    fp_wgmma_commit();
    fp_wgmma_wait<0>();
    for (int i = 0; i < N / 2; ++i) {
        const int row = 16 * warp + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t + (i & 1);
        p.out[(ci * 64 + row) * 128 + col] = d[i];
    }
    __syncthreads();
}

/* stmatrix form f (0: x4 through fp_stsm_x4, 1: x4.trans, 2: x2, 3: x1): matrix i's row r at
 * F_ST + 2048 f + 256 i + 32 r (16-byte gaps between rows); lane l's register i holds the
 * halves 64 i + 2 l and 64 i + 2 l + 1. */
static __device__ void stsm_case(int f)
{
    const int lane = threadIdx.x % 32, i = lane / 8, r = lane % 8;
    const uint32_t addr = F_ST + 2048 * f + 256 * i + 32 * r;
    uint32_t v[4];
    for (int m = 0; m < 4; ++m)
        v[m] = (uint32_t)(64 * m + 2 * lane) | (uint32_t)(64 * m + 2 * lane + 1) << 16;
    if (f == 0)
        fp_stsm_x4(addr, v[0], v[1], v[2], v[3]);
    else
        fp_emu_stmatrix(addr, v, f == 1 ? 4 : f == 2 ? 2 : 1, f == 1);
}

__global__ void st90f_kernel(const __grid_constant__ st90f_args p)
{
    extern __shared__ __align__(1024) unsigned char fp_smem[];
    const int tid = threadIdx.x;
    __shared__ uint32_t words[4];
    __shared__ uint64_t sbar;
    if (tid == 0) {
        p.flags[0] = words[0] != 0xffffffffu || words[3] != 0xffffffffu; /* poisoned at start */
        p.flags[1] = fp_smem_addr(words) < F_END || fp_smem_addr(&sbar) < F_END;
        words[0] = 0;
        words[1] = 5;
        fp_mbar_init(fp_smem_addr(&sbar), 128);
        fp_mbar_fence_init();
    }
    __syncthreads();
    atomicOr(&words[0], 1u << (tid % 32));
    atomicAdd(reinterpret_cast<int *>(&words[1]), -1);
    atomicOr(&p.gword[0], 1u << (tid / 4));
    atomicAdd(reinterpret_cast<int *>(&p.gword[1]), 3);
    fp_mbar_arrive(fp_smem_addr(&sbar));
    fp_mbar_wait(fp_smem_addr(&sbar), 0);
    if (tid == 0)
        p.flags[2] = words[0] != 0xffffffffu || (int)words[1] != 5 - 128;
    f8_case<96>(p, 0);
    f8_case<128>(p, 1);
    f8_case<128>(p, 2);
    if (tid < 32)
        for (int f = 0; f < 4; ++f)
            stsm_case(f);
    __syncthreads();
    for (int e = tid; e < 4 * 2048; e += 128)
        p.st[e] = fp_smem[F_ST + e];
}

/* e4m3 codes of -2 .. 2 in steps of 0.5 (sign, 4 exponent bits of bias 7, 3 mantissa bits) */
static const uint8_t e4m3_code[9] = {0xc0, 0xbc, 0xb8, 0xb0, 0x00, 0x30, 0x38, 0x3c, 0x40};

static int run_fwd(void)
{
    int bad = 0;
    static uint8_t ha[64 * F_KD], hb[F_KD * 128];
    static float a[64 * F_KD], b[F_KD * 128];
    srand(7);
    for (int e = 0; e < 64 * F_KD; ++e) {
        const int v = rand() % 9;
        ha[e] = e4m3_code[v];
        a[e] = 0.5f * (float)(v - 4);
    }
    for (int e = 0; e < F_KD * 128; ++e) {
        const int v = rand() % 9;
        hb[e] = e4m3_code[v];
        b[e] = 0.5f * (float)(v - 4);
    }
    void *d_a, *d_b, *d_out, *d_st, *d_g, *d_flags;
    const size_t out_bytes = F_NCASE * 64 * 128 * 4;
    if (cudaMalloc(&d_a, sizeof ha) || cudaMalloc(&d_b, sizeof hb) ||
        cudaMalloc(&d_out, out_bytes) || cudaMalloc(&d_st, 4 * 2048) || cudaMalloc(&d_g, 8) ||
        cudaMalloc(&d_flags, 32)) {
        printf("  cudaMalloc failed\n");
        return 1;
    }
    cudaMemcpy(d_a, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(d_b, hb, sizeof hb, cudaMemcpyHostToDevice);
    cudaMemsetAsync(d_g, 0, 8, 0);
    cudaMemsetAsync(d_flags, 0, 32, 0);
    st90f_args p;
    p.a = (const uint8_t *)d_a;
    p.b = (const uint8_t *)d_b;
    p.out = (float *)d_out;
    p.st = (uint8_t *)d_st;
    p.gword = (unsigned *)d_g;
    p.flags = (int *)d_flags;
    cudaFuncSetAttribute(st90f_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, F_END);
    st90f_kernel<<<1, 128, F_END, 0>>>(p);
    bad += cudaGetLastError() != cudaSuccess;
    static float out[F_NCASE * 64 * 128];
    static uint8_t st[4 * 2048];
    unsigned gw[2];
    int flags[8];
    cudaMemcpy(out, d_out, out_bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(st, d_st, sizeof st, cudaMemcpyDeviceToHost);
    cudaMemcpy(gw, d_g, sizeof gw, cudaMemcpyDeviceToHost);
    cudaMemcpy(flags, d_flags, sizeof flags, cudaMemcpyDeviceToHost);

    static const char *const names[F_NCASE] = {"ss K-major m64n96k32", "ss K-major m64n128k32",
                                               "rs m64n128k32"};
    for (int ci = 0; ci < F_NCASE; ++ci) {
        int bw = 0;
        for (int m = 0; m < 64; ++m)
            for (int n = 0; n < fcases[ci].n; ++n) {
                double s = 0.0;
                for (int k = 0; k < F_KD; ++k)
                    s += (double)a[m * F_KD + k] * b[k * 128 + n];
                bw += out[(ci * 64 + m) * 128 + n] != (float)s;
            }
        bad += bw;
        printf("e4m3: wgmma %s: %s\n", names[ci], bw ? "FAIL" : "ok");
    }
    /* stmatrix: each written row as the ISA gives it, every other byte still poison */
    static const char *const snames[4] = {"x4", "x4.trans", "x2", "x1"};
    for (int f = 0; f < 4; ++f) {
        const int nmat = f < 2 ? 4 : f == 2 ? 2 : 1;
        int bs = 0;
        for (int off = 0; off < 2048; off += 2) {
            const int i = off / 256, r = off % 256 / 32, c = off % 32 / 2;
            uint16_t got;
            memcpy(&got, st + 2048 * f + off, 2);
            uint16_t want = 0xffff;
            if (i < nmat && c < 8) {
                const int lane = f == 1 ? 4 * c + r / 2 : 4 * r + c / 2;
                const int half = f == 1 ? r % 2 : c % 2;
                want = (uint16_t)(64 * i + 2 * lane + half);
            }
            bs += got != want;
        }
        bad += bs;
        printf("stmatrix %s: %s\n", snames[f], bs ? "FAIL" : "ok");
    }
    const int bst = flags[0] + flags[1] + flags[2];
    const int bat = gw[0] != 0xffffffffu || gw[1] != 3u * 128;
    bad += bst + bat;
    printf("static __shared__ (poisoned, after the dynamic memory, an mbarrier in one), shared "
           "atomicOr / atomicAdd(int *): %s; global: %s\n",
           bst ? "FAIL" : "ok", bat ? "FAIL" : "ok");
    /* __byte_perm (the CUDA documentation's byte numbering and the CUB PRMT example), __vcmpeq4 */
    const int bi = __byte_perm(0x03020100u, 0x07060504u, 0x7531) != 0x07050301u ||
                   __byte_perm(0x03020100u, 0x07060504u, 0x6420) != 0x06040200u ||
                   __byte_perm(0x44332211u, 0x88776655u, 0x0123) != 0x11223344u ||
                   __byte_perm(0x44332211u, 0x88776655u, 0x4747) != 0x55885588u ||
                   __vcmpeq4(0x12345678u, 0x12005600u) != 0xff00ff00u ||
                   __vcmpeq4(0x7f7f7f7fu, 0x7f7f7f7fu) != 0xffffffffu ||
                   __vcmpeq4(0u, 0x01010101u) != 0u;
    bad += bi;
    printf("__byte_perm, __vcmpeq4: %s\n", bi ? "FAIL" : "ok");
    cudaFree(d_a);
    cudaFree(d_b);
    cudaFree(d_out);
    cudaFree(d_st);
    cudaFree(d_g);
    cudaFree(d_flags);
    return bad != 0;
}

/* Static shared memory beyond the block's limit (227 KiB with the dynamic memory). */
__global__ void st90_static_overflow_kernel(int)
{
    __shared__ uint32_t big[1024];
    big[threadIdx.x] = 0;
}

/* 64 threads wait for a phase of 65 arrivals. */
__global__ void st90_hang_kernel(int)
{
    if (threadIdx.x == 0)
        fp_mbar_init(0, 65);
    __syncthreads();
    fp_mbar_arrive(0);
    fp_mbar_wait(0, 0);
}

/* One warpgroup: m64n32k16 from zeroed operands, one of B's bytes written after the issue. */
__global__ void st90_race_kernel(int)
{
    extern __shared__ __align__(1024) unsigned char fp_smem[];
    for (int i = threadIdx.x; i < 8192 / 4; i += 128)
        reinterpret_cast<uint32_t *>(fp_smem)[i] = 0;
    __syncthreads();
    float d[16];
    fp_wgmma_fence();
    fp_wgmma<__half, 32>::ss(d, desc(0, 16, 1024), desc(4096, 16, 1024), 0);
    fp_wgmma_commit();
    if (threadIdx.x == 0)
        fp_smem[4096 + 2] = 0x3c; /* B (n 0, k 1) */
    fp_wgmma_wait<0>();
}

static void launch_hang(void)
{
    st90_hang_kernel<<<1, 64, 64, 0>>>(0);
}
static void launch_race(void)
{
    st90_race_kernel<<<1, 128, 8192, 0>>>(0);
}
static void launch_static_overflow(void)
{
    cudaFuncSetAttribute(st90_static_overflow_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         227 * 1024 - 1024);
    st90_static_overflow_kernel<<<1, 32, 227 * 1024 - 1024, 0>>>(0);
}

/* A kernel the emulator must stop, in a child process: it must die by abort with `expect` in
 * its report on stderr. */
static int run_death(void (*launch)(void), const char *expect, const char *what)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 1;
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        launch();
        _exit(0);
    }
    close(fds[1]);
    char msg[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof msg - 1 && (r = read(fds[0], msg + n, sizeof msg - 1 - n)) > 0)
        n += (size_t)r;
    msg[n] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    const bool ok = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strstr(msg, expect);
    printf("%s: %s\n", what, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}

int main(void)
{
    const int bad =
        run<__half>(0) + run<__nv_bfloat16>(1) +
        run_death(launch_hang,
                  "hang:", "an mbarrier wait that can never complete is reported as a hang") +
        run_death(launch_race, "operands changed",
                  "a wgmma operand written between the issue and the wait is reported") +
        run_fwd() +
        run_death(launch_static_overflow, "does not fit",
                  "static __shared__ variables beyond the block's limit are reported");
    return bad ? 1 : 0;
}
