/*
 * The compile-time shape of one OpenCL program (ocl_attention.c builds one per dtype, head-dim
 * class, tile and variant): the storage type and the tile geometry, shared by the micro-tile
 * policies (flash.cl's plain one, mma_nv.cl's tensor-core one) and the kernels of flash.cl; and
 * where the rows of a tile's source lie (dense, or a paged KV cache), which both policies' tile
 * copies follow.
 *
 * Storage: FP_OCL_DTYPE 0 f32, 1 f16 (vload_half / vstore_half_rte, so cl_khr_fp16 is not
 * needed), 2 bf16 (ushort bits); arithmetic is f32 in every case.
 */

#if FP_OCL_DTYPE == 0
typedef float fp_elem;
#define FP_LOAD(p, i)     ((p)[i])
#define FP_STORE(p, i, x) ((p)[i] = (x))
#elif FP_OCL_DTYPE == 1
typedef half fp_elem;
#define FP_LOAD(p, i)     vload_half((size_t)(i), (p))
#define FP_STORE(p, i, x) vstore_half_rte((x), (size_t)(i), (p))
#else
typedef ushort fp_elem;
#define FP_LOAD(p, i)     as_float((uint)(p)[i] << 16)
#define FP_STORE(p, i, x) ((p)[i] = fp_ocl_to_bf16(x))

/* core/dtype.h's fp_f32_to_bf16: round to nearest even, NaN stays NaN. */
static inline ushort fp_ocl_to_bf16(float f)
{
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}
#endif

/* D the head-dim class (16, 32, 64, 96, 128, 192 or 256; the problem's head dim a.head_dim <= D,
 * the tiles zero-filled beyond it, so dot products over D are exact), T query rows = keys per
 * tile, LS the row pitch of the [T, T] f32 score tiles (odd, so work-items reading one column of
 * different rows hit different banks; ocl_plan.h sizes them the same way). The [T, D] tiles'
 * element type fp_tile and pitch LD belong to the micro-tile policy (flash.cl, mma_nv.cl). */
#define D  FP_OCL_D
#define T  FP_OCL_T
#define LS (T | 1)

/* The guard for masked keys (docs/reliability.md, "GPU kernels: the guard for masked keys"): a
 * masked pair's P or dS of 0 meets its operand in the products (P V, dS K, P^T dO, dS^T Q), and
 * 0 x NaN is NaN. In an edge block (fp_mask_block_full false for its rows and keys: the only
 * blocks that hold a masked pair) the operand tile that meets those zeros is scrubbed as it is
 * copied: a non-finite element becomes 0 and its row is flagged (FP_OCL_BAD), and a visible pair
 * whose row was flagged gets its NaN back by a select (the forward's whole O row, the backward's
 * P and dS). The flags live in column T of a [T, LS] score tile, which LS = T + 1 leaves unused:
 * flag of row r at FP_OCL_BAD(tile, r). A flag is zeroed in a phase before the one that scrubs,
 * since several work-items may flag one row (each storing the same 1). */
#define FP_OCL_BAD(st, r) ((st)[(r)*LS + T])

/* On GPUs (FP_OCL_UNROLL_ALL, set by the host for every device that is not a CPU) and in the
 * tensor-core programs for NVIDIA every helper is inlined and the loops over a work-item's
 * accumulator elements are unrolled, so that accumulators, fragments and tile positions live in
 * registers (passed by pointer to a called function, or indexed by a loop variable, an array goes
 * to private memory: clang's PTX of the plain forward without it stores all 32 output
 * accumulators to the stack on every key of P V). On CPUs (PoCL) the compiler decides: PoCL's
 * compile time grows with forced unrolling (most with the emulation's barriers) while the CI runs
 * the whole table through it, and its work-item loops keep private arrays in memory anyway. */
#if (FP_OCL_MMA || FP_OCL_UNROLL_ALL) && !FP_OCL_MMA_EMULATE
#define FP_OCL_INLINE static inline __attribute__((always_inline))
#define FP_OCL_UNROLL _Pragma("unroll")
#else
#define FP_OCL_INLINE static inline
#define FP_OCL_UNROLL
#endif

/* Where the rows of a [seq, dim] slice lie: row t at row0 + t srow; or, on a paged KV cache
 * (paged), row t % page_size of the page that core/geometry.h's fp_paged_page gives for
 * sequence b's logical key t, row0 then being the element of page 0, row 0 (the kv head folded
 * in) and spage the page stride. Head-dim elements are sdim apart. */
typedef struct fp_ocl_rows {
    long row0, srow, sdim, spage, paged, b;
    __global const int *bt; /* paged: the block table (its offset applied) */
} fp_ocl_rows;

FP_OCL_INLINE fp_ocl_rows fp_ocl_dense_rows(long row0, long srow, long sdim)
{
    fp_ocl_rows x = {row0, srow, sdim, 0, 0, 0, 0};
    return x;
}

/* The element of row t, dim 0, or -1 where t lies in a page whose block-table entry is outside
 * [0, num_pages): such a page is never dereferenced, its keys are masked (include/flashport.h). */
FP_OCL_INLINE long fp_ocl_row_at(const fp_ocl_args *a, const fp_ocl_rows *x, long t)
{
    if (!x->paged)
        return x->row0 + t * x->srow;
    const long pg = fp_paged_page(x->bt, a->bt_stride, a->page_size, a->num_pages, (int)x->b, t);
    return pg < 0 ? -1 : x->row0 + pg * x->spage + (t % a->page_size) * x->srow;
}

/* Whether the slice's 16-bit rows can be copied 8 elements (16 bytes) at a time: dims contiguous,
 * hd a multiple of 8 and every row and page 16-byte aligned (the usual [B, N, H, D] layout, dense
 * or paged). */
FP_OCL_INLINE int fp_ocl_rows_by16(const fp_ocl_rows *x, int hd)
{
    return x->sdim == 1 && hd % 8 == 0 && x->row0 % 8 == 0 && x->srow % 8 == 0 &&
           x->spage % 8 == 0;
}
