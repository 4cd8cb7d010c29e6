/*
 * The register-blocked product C[m x n] (+)= A[m x k] B[k x n] of the fp_ukernels contract
 * (ukernel.h), written once for every vector ISA: an ISA file defines its vector primitives and
 * the parameters below, then includes this file (once per product it needs; no include guard).
 *
 * Algorithm (BLIS micro-kernel): C is cut into blocks of UK_MR rows x UK_NV vectors of UK_LANES
 * columns. A block's UK_MR * UK_NV accumulators stay in registers across the whole reduction; each
 * step p loads UK_NV vectors of B's row p and broadcasts UK_MR elements of A's column p, so per
 * step UK_NV loads and UK_MR broadcasts feed UK_MR * UK_NV multiply-adds. Column blocks are the
 * outer loop so that one k x (UK_NV * UK_LANES) panel of B stays in L1 while A streams through.
 * Edge blocks (fewer rows, fewer vectors) are separate instantiations with constant extents, so
 * they keep their accumulators in registers too. Each accumulator sums its products in order
 * p = 0 .. k - 1 (the contract's fixed summation order).
 *
 * Parameters (all required but UK_GEMM_RS, all macros; the file #undefs them at its end):
 *   UK_GEMM          name of the function to define
 *   UK_GEMM_RS       optional: name of a second one, the table's gemm_rs (C = diag(f) C + A B:
 *                    each row's accumulators start from its C row times f[row], one rounding,
 *                    then sum as UK_GEMM does), defined when the macro is
 *   UK_GEMM_A        element type of A; UK_GEMM_B: element type of the B tile
 *   uk_gemm_avec     vector type of a broadcast A element; uk_gemm_bvec: of UK_LANES B elements
 *   uk_gemm_bcast(const UK_GEMM_A *p)          the A element at p, in every lane
 *   uk_gemm_loadb(const UK_GEMM_B *p)          UK_LANES B elements from p
 *   uk_gemm_madd(uk_vec acc, avec a, bvec b)   acc + a * b, lane by lane
 * and the ISA's uk_vec, UK_LANES, UK_MR (1..8), UK_NV (1..4), uk_zero, uk_load, uk_store.
 */

#define UK_CAT_(a, b) a##b
#define UK_CAT(a, b)  UK_CAT_(a, b)
#define UK_BLOCK      UK_CAT(UK_GEMM, _block)
#define UK_ROWS       UK_CAT(UK_GEMM, _rows)
#define UK_ANY        UK_CAT(UK_GEMM, _any)

/* One block of mr rows x nv vectors; mr and nv are constants in every call site. */
static inline __attribute__((always_inline)) void UK_BLOCK(const int mr, const int nv, int k,
                                                           const UK_GEMM_A *a, ptrdiff_t rsa,
                                                           ptrdiff_t csa, const UK_GEMM_B *b,
                                                           ptrdiff_t ldb, float *c, ptrdiff_t ldc,
                                                           int accumulate, const float *fs)
{
    uk_vec acc[UK_MR][UK_NV];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            acc[r][v] = accumulate ? uk_load(c + r * ldc + v * UK_LANES) : uk_zero();
            if (fs) /* a constant NULL in UK_GEMM, so the multiply is compiled out there */
                acc[r][v] = uk_mul(acc[r][v], uk_set1(fs[r]));
        }
    for (int p = 0; p < k; p++) {
        uk_gemm_bvec bv[UK_NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = uk_gemm_loadb(b + p * ldb + v * UK_LANES);
        const UK_GEMM_A *ap = a + p * csa;
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const uk_gemm_avec ar = uk_gemm_bcast(ap + r * rsa);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                acc[r][v] = uk_gemm_madd(acc[r][v], ar, bv[v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            uk_store(c + r * ldc + v * UK_LANES, acc[r][v]);
}

/* The row edge: mr = 1 .. UK_MR, each its own instantiation. */
static inline __attribute__((always_inline)) void
UK_ROWS(int mr, const int nv, int k, const UK_GEMM_A *a, ptrdiff_t rsa, ptrdiff_t csa,
        const UK_GEMM_B *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate, const float *fs)
{
    switch (mr) {
#if UK_MR >= 8
    case 8:
        UK_BLOCK(8, nv, k, a, rsa, csa, b, ldb, c, ldc, accumulate, fs);
        break;
#endif
#if UK_MR >= 7
    case 7:
        UK_BLOCK(7, nv, k, a, rsa, csa, b, ldb, c, ldc, accumulate, fs);
        break;
#endif
#if UK_MR >= 6
    case 6:
        UK_BLOCK(6, nv, k, a, rsa, csa, b, ldb, c, ldc, accumulate, fs);
        break;
#endif
#if UK_MR >= 5
    case 5:
        UK_BLOCK(5, nv, k, a, rsa, csa, b, ldb, c, ldc, accumulate, fs);
        break;
#endif
#if UK_MR >= 4
    case 4:
        UK_BLOCK(4, nv, k, a, rsa, csa, b, ldb, c, ldc, accumulate, fs);
        break;
#endif
#if UK_MR >= 3
    case 3:
        UK_BLOCK(3, nv, k, a, rsa, csa, b, ldb, c, ldc, accumulate, fs);
        break;
#endif
#if UK_MR >= 2
    case 2:
        UK_BLOCK(2, nv, k, a, rsa, csa, b, ldb, c, ldc, accumulate, fs);
        break;
#endif
    default:
        UK_BLOCK(1, nv, k, a, rsa, csa, b, ldb, c, ldc, accumulate, fs);
        break;
    }
}

static inline __attribute__((always_inline)) void
UK_ANY(int m, int n, int k, const UK_GEMM_A *a, ptrdiff_t rsa, ptrdiff_t csa, const UK_GEMM_B *b,
       ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate, const float *f)
{
    const int nvec = (n + UK_LANES - 1) / UK_LANES;
    for (int j = 0; j < nvec; j += UK_NV) {
        const int nv = nvec - j < UK_NV ? nvec - j : UK_NV;
        const UK_GEMM_B *bj = b + (ptrdiff_t)j * UK_LANES;
        for (int i = 0; i < m; i += UK_MR) {
            const int mr = m - i < UK_MR ? m - i : UK_MR;
            const UK_GEMM_A *ai = a + i * rsa;
            float *cij = c + i * ldc + (ptrdiff_t)j * UK_LANES;
            const float *fs = f ? f + i : NULL;
            switch (nv) {
#if UK_NV >= 4
            case 4:
                UK_ROWS(mr, 4, k, ai, rsa, csa, bj, ldb, cij, ldc, accumulate, fs);
                break;
#endif
#if UK_NV >= 3
            case 3:
                UK_ROWS(mr, 3, k, ai, rsa, csa, bj, ldb, cij, ldc, accumulate, fs);
                break;
#endif
#if UK_NV >= 2
            case 2:
                UK_ROWS(mr, 2, k, ai, rsa, csa, bj, ldb, cij, ldc, accumulate, fs);
                break;
#endif
            default:
                UK_ROWS(mr, 1, k, ai, rsa, csa, bj, ldb, cij, ldc, accumulate, fs);
                break;
            }
        }
    }
}

static void UK_GEMM(int m, int n, int k, const UK_GEMM_A *a, ptrdiff_t rsa, ptrdiff_t csa,
                    const UK_GEMM_B *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, int accumulate)
{
    UK_ANY(m, n, k, a, rsa, csa, b, ldb, c, ldc, accumulate, NULL);
}

#ifdef UK_GEMM_RS
static void UK_GEMM_RS(int m, int n, int k, const UK_GEMM_A *a, ptrdiff_t rsa, ptrdiff_t csa,
                       const UK_GEMM_B *b, ptrdiff_t ldb, float *c, ptrdiff_t ldc, const float *f)
{
    UK_ANY(m, n, k, a, rsa, csa, b, ldb, c, ldc, 1, f);
}
#endif

#undef UK_ANY
#undef UK_ROWS
#undef UK_BLOCK
#undef UK_CAT
#undef UK_CAT_
#undef UK_GEMM
#undef UK_GEMM_RS
#undef UK_GEMM_A
#undef UK_GEMM_B
#undef uk_gemm_avec
#undef uk_gemm_bvec
#undef uk_gemm_bcast
#undef uk_gemm_loadb
#undef uk_gemm_madd
