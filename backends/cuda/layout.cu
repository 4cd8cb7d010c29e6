/*
 * Layout staging for the CUDA kernels. The kernels move rows with 16-byte cp.async copies and
 * 16-byte stores, which needs every row of q/k/v/o (and the gradients) to start on 16 bytes:
 * base pointer and batch/sequence/head strides multiples of 16 bytes. A tensor that is not
 * (e.g. rows padded to D + 3) gets a contiguous twin (rows of D rounded up to 16 bytes) in the
 * call's scratch: inputs are copied in before the kernels, outputs copied out after. The common
 * layouts (contiguous, packed QKV, head-major with aligned rows) take no copy; the kernels
 * themselves never branch on the layout. Extra memory: one copy of each staged tensor, O(tokens x
 * heads x D).
 */
#include "backends/cuda/cuda_internal.h"

#include <stdint.h>

// dst, src: (nb, ns, nh, d), element strides [b, s, h], d contiguous, elements of type E.
template <typename E>
__global__ void fp_cuda_repack_kernel(E *dst, int64_t dsb, int64_t dss, int64_t dsh, const E *src,
                                      int64_t ssb, int64_t sss, int64_t ssh, int64_t nb, int64_t ns,
                                      int64_t nh, int d)
{
    const int64_t rows = nb * ns * nh;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t h = r % nh, s = (r / nh) % ns, b = r / (nh * ns);
        const E *from = src + b * ssb + s * sss + h * ssh;
        E *to = dst + b * dsb + s * dss + h * dsh;
        for (int c = threadIdx.x; c < d; c += blockDim.x)
            to[c] = from[c];
    }
}

/* Bytes per element of tensor i (0..7: q k v o dout dq dk dv): fp8 inputs have 1-byte q, k, v
 * (forward only) and an o of 2. */
static int elem_bytes(const fp_problem *p, int i)
{
    return (i < 3 && (p->dtype == FLASHPORT_FP8_E4M3 || p->dtype == FLASHPORT_FP8_E5M2)) ? 1 : 2;
}

/* Every row starts on 16 bytes: 16 / es elements. */
static int view_aligned(const fp_tensor_view *t, int es)
{
    const int64_t m = 16 / es;
    return t->data == NULL || ((uintptr_t)t->data % 16 == 0 && t->stride[FP_B] % m == 0 &&
                               t->stride[FP_S] % m == 0 && t->stride[FP_H] % m == 0);
}

/* Sequence length and head count of tensor i (0..7: q k v o dout dq dk dv). */
static void tensor_shape(const fp_problem *p, int i, int64_t *nb, int64_t *ns, int64_t *nh)
{
    const int is_q = i == 0 || i == 3 || i == 4 || i == 5;
    *nb = p->varlen ? 1 : p->batch;
    *ns = p->varlen ? (is_q ? p->total_q : p->total_k) : (is_q ? p->seqlen_q : p->seqlen_k);
    *nh = is_q ? p->heads : p->kv_heads;
    if (!is_q && p->block_table) { /* a paged cache: [num_pages, page_size, Hkv, D] */
        *nb = p->num_pages;
        *ns = p->page_size;
    }
}

static fp_tensor_view *tensor_at(fp_problem *p, int i)
{
    fp_tensor_view *t[8] = {&p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv};
    return t[i];
}

static cudaError_t repack(const fp_cuda_ctx *ctx, const fp_tensor_view *dst,
                          const fp_tensor_view *src, int64_t nb, int64_t ns, int64_t nh, int d,
                          int es)
{
    const int64_t rows = nb * ns * nh;
    if (rows == 0)
        return cudaSuccess;
    const unsigned grid = (unsigned)(rows < (1 << 20) ? rows : (1 << 20));
    const unsigned threads = d < 128 ? 64 : 128;
    if (es == 1)
        fp_cuda_repack_kernel<uint8_t><<<grid, threads, 0, ctx->stream>>>(
            (uint8_t *)dst->data, dst->stride[FP_B], dst->stride[FP_S], dst->stride[FP_H],
            (const uint8_t *)src->data, src->stride[FP_B], src->stride[FP_S], src->stride[FP_H], nb,
            ns, nh, d);
    else
        fp_cuda_repack_kernel<uint16_t><<<grid, threads, 0, ctx->stream>>>(
            (uint16_t *)dst->data, dst->stride[FP_B], dst->stride[FP_S], dst->stride[FP_H],
            (const uint16_t *)src->data, src->stride[FP_B], src->stride[FP_S], src->stride[FP_H],
            nb, ns, nh, d);
    return cudaGetLastError();
}

/* The head stride of tensor i's twin: D rounded up to 16 bytes */
static int64_t twin_row(const fp_problem *p, int i)
{
    const int64_t m = 16 / elem_bytes(p, i);
    return (p->head_dim + m - 1) / m * m;
}

/* Tensors of a forward (q k v | o) or backward (q k v o dout | dq dk dv). */
static int tensor_count(int backward)
{
    return backward ? 8 : 4;
}
static int is_output(int backward, int i)
{
    return backward ? i >= 5 : i == 3;
}

/* Byte offset of tensor i's twin in the staging area (offset[i]); returns the total. */
static size_t layout_offsets(const fp_problem *p, int backward, size_t *offset)
{
    size_t bytes = 0;
    for (int i = 0; i < tensor_count(backward); i++) {
        offset[i] = bytes;
        if (view_aligned(tensor_at((fp_problem *)p, i), elem_bytes(p, i)))
            continue;
        int64_t nb, ns, nh;
        tensor_shape(p, i, &nb, &ns, &nh);
        bytes += fp_cuda_ws_round((size_t)(nb * ns * nh * twin_row(p, i)) * elem_bytes(p, i));
    }
    return bytes;
}

extern "C" size_t fp_cuda_layout_bytes(const fp_problem *p, int backward)
{
    size_t offset[8];
    return layout_offsets(p, backward, offset);
}

/* *work = p with every unaligned tensor replaced by its twin at ws + its offset; copies nothing.
 * Returns the staging bytes. */
static size_t layout_views(const fp_problem *p, int backward, fp_problem *work, void *ws)
{
    *work = *p;
    size_t offset[8];
    const size_t bytes = layout_offsets(p, backward, offset);
    for (int i = 0; bytes > 0 && i < tensor_count(backward); i++) {
        fp_tensor_view *t = tensor_at(work, i);
        if (view_aligned(t, elem_bytes(p, i)))
            continue;
        int64_t nb, ns, nh;
        tensor_shape(p, i, &nb, &ns, &nh);
        const int64_t row = twin_row(p, i);
        t->data = (char *)ws + offset[i];
        t->stride[FP_D] = 1;
        t->stride[FP_H] = row;
        t->stride[FP_S] = nh * row;
        t->stride[FP_B] = p->varlen ? 0 : ns * nh * row;
    }
    return bytes;
}

extern "C" void fp_cuda_layout_shape(const fp_problem *p, int backward, fp_problem *work)
{
    layout_views(p, backward, work, (void *)(uintptr_t)FP_CUDA_WS_ALIGN);
}

extern "C" flashport_status fp_cuda_layout_begin(const fp_cuda_ctx *ctx, const fp_problem *p,
                                                 int backward, fp_problem *work, void *ws)
{
    const size_t bytes = layout_views(p, backward, work, ws);
    if (bytes == 0)
        return FLASHPORT_OK;
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < tensor_count(backward) && e == cudaSuccess; i++) {
        const fp_tensor_view *src = tensor_at((fp_problem *)p, i);
        if (view_aligned(src, elem_bytes(p, i)) || is_output(backward, i))
            continue;
        int64_t nb, ns, nh;
        tensor_shape(p, i, &nb, &ns, &nh);
        e = repack(ctx, tensor_at(work, i), src, nb, ns, nh, (int)p->head_dim, elem_bytes(p, i));
    }
    fp_cuda_log("staged the unaligned tensors of this %s in %zu bytes of workspace",
                backward ? "backward" : "forward", bytes);
    return e == cudaSuccess ? FLASHPORT_OK
                            : fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "layout staging");
}

extern "C" flashport_status fp_cuda_layout_end(const fp_cuda_ctx *ctx, const fp_problem *p,
                                               const fp_problem *work, int backward,
                                               flashport_status st)
{
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < tensor_count(backward) && st == FLASHPORT_OK && e == cudaSuccess; i++) {
        const fp_tensor_view *t = tensor_at((fp_problem *)p, i);
        if (!is_output(backward, i) || view_aligned(t, elem_bytes(p, i)))
            continue;
        int64_t nb, ns, nh;
        tensor_shape(p, i, &nb, &ns, &nh);
        e = repack(ctx, t, tensor_at((fp_problem *)work, i), nb, ns, nh, (int)p->head_dim,
                   elem_bytes(p, i));
    }
    if (st == FLASHPORT_OK && e != cudaSuccess)
        st = fp_cuda_error(FLASHPORT_ERR_DEVICE, e, "layout unstaging");
    return st;
}
