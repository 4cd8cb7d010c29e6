/*
 * Unit test of core/kernel_args.h, the argument block the CUDA and HIP kernels share:
 *   - fp_kernel_args_fill copies a dense GQA problem (window, softcap, LSE) and a varlen, paged
 *     one into the block: tensors with their [batch, seq, head] strides, sizes narrowed to int,
 *     group = H / Hkv, scale_log2 = scale * log2(e), transform set by softcap or ALiBi, the
 *     varlen offsets only when varlen, the page fields only when paged, one split;
 *   - the block's layout: the CUDA kernels were built against this field order (their SASS
 *     addresses their parameters by these offsets), so a reorder fails here before it changes
 *     every kernel's code.
 */
#include "core/kernel_args.h"
#include "tests/test_util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>

static void view(fp_tensor_view *t, void *data, int64_t sb, int64_t ss, int64_t sh)
{
    t->data = data;
    t->stride[FP_B] = sb;
    t->stride[FP_S] = ss;
    t->stride[FP_H] = sh;
    t->stride[FP_D] = 1;
}

static int same_tensor(fp_kernel_tensor k, const fp_tensor_view *t)
{
    return k.ptr == t->data && k.sb == t->stride[FP_B] && k.ss == t->stride[FP_S] &&
           k.sh == t->stride[FP_H];
}

static void test_dense(void)
{
    static char buf[9][16];
    static const int32_t cu[3] = {0, 5, 9};
    fp_problem p = {0};
    p.batch = 2, p.seqlen_q = 5, p.seqlen_k = 700, p.heads = 8, p.kv_heads = 2, p.head_dim = 72;
    p.total_q = 10, p.scale = 0.125f, p.softcap = 30.0f, p.window_left = 64, p.window_right = 0;
    p.cu_seqlens_q = cu, p.cu_seqlens_k = cu; /* ignored: not varlen */
    view(&p.q, buf[0], 2880, 576, 72);
    view(&p.k, buf[1], 100800, 144, 72);
    view(&p.v, buf[2], 100800, 144, 72);
    view(&p.o, buf[3], 2880, 576, 72);
    view(&p.dout, buf[4], 2880, 576, 72);
    view(&p.dq, buf[5], 2880, 576, 72);
    view(&p.dk, buf[6], 100800, 144, 72);
    view(&p.dv, buf[7], 100800, 144, 72);
    p.lse.data = buf[8], p.lse.stride[0] = 40, p.lse.stride[1] = 5, p.lse.stride[2] = 1;

    fp_kernel_args a;
    memset(&a, 0x5a, sizeof a); /* the fill must set or zero every field */
    fp_kernel_args_fill(&p, &a);
    CHECK(same_tensor(a.q, &p.q) && same_tensor(a.k, &p.k) && same_tensor(a.v, &p.v));
    CHECK(same_tensor(a.o, &p.o) && same_tensor(a.dout, &p.dout) && same_tensor(a.dq, &p.dq));
    CHECK(same_tensor(a.dk, &p.dk) && same_tensor(a.dv, &p.dv));
    CHECK(a.lse == (float *)buf[8] && a.lse_sb == 40 && a.lse_sh == 5 && a.lse_ss == 1);
    CHECK(a.cu_q == NULL && a.cu_k == NULL);
    CHECK(a.nq == 5 && a.nk == 700 && a.batch == 2 && a.heads == 8 && a.group == 4 && a.d == 72);
    CHECK(a.left == 64 && a.right == 0);
    CHECK(a.scale == 0.125f && fabsf(a.scale_log2 - 0.125f * 1.4426950408889634f) == 0.0f);
    CHECK(a.softcap == 30.0f && a.alibi == NULL && a.transform == 1);
    CHECK(a.seqused_k == NULL && a.block_table == NULL && a.bt_stride == 0);
    CHECK(a.page_size == 0 && a.num_pages == 0);
    CHECK(a.splits == 1 && a.keys_per_split == 0 && a.o_part == NULL && a.lse_part == NULL);
    CHECK(a.reverse == 0);
}

static void test_varlen_paged(void)
{
    static const int32_t cu_q[3] = {0, 1, 2}, cu_k[3] = {0, 300, 310}, used[2] = {300, 10};
    static const int32_t table[2 * 3] = {4, 0, 2, 1, -1, -1};
    static const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    static char q[16], k[16], v[16], o[16];
    fp_problem p = {0};
    p.batch = 2, p.seqlen_q = 1, p.seqlen_k = 384, p.heads = 4, p.kv_heads = 4, p.head_dim = 128;
    p.total_q = 2, p.scale = 0.08838834764831845f, p.window_left = -1, p.window_right = -1;
    p.alibi_slopes = slopes, p.varlen = 1, p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k;
    p.seqused_k = used, p.block_table = table, p.block_table_stride = 3, p.page_size = 128;
    p.num_pages = 5;
    view(&p.q, q, 0, 512, 128);
    view(&p.k, k, 65536, 512, 128);
    view(&p.v, v, 65536, 512, 128);
    view(&p.o, o, 0, 512, 128);

    fp_kernel_args a;
    fp_kernel_args_fill(&p, &a);
    CHECK(a.cu_q == cu_q && a.cu_k == cu_k && a.seqused_k == used && a.block_table == table);
    CHECK(a.bt_stride == 3 && a.page_size == 128 && a.num_pages == 5);
    CHECK(a.nq == 1 && a.nk == 384 && a.group == 1 && a.left == -1 && a.right == -1);
    CHECK(a.alibi == slopes && a.softcap == 0.0f && a.transform == 1);
    CHECK(same_tensor(a.k, &p.k) && a.q.sb == 0 && a.dq.ptr == NULL && a.lse == NULL);

    p.alibi_slopes = NULL; /* neither softcap nor ALiBi: scores skip the transform */
    fp_kernel_args_fill(&p, &a);
    CHECK(a.transform == 0);
}

/* The CUDA kernels' parameter layout (LP64). */
static void test_layout(void)
{
    CHECK(sizeof(fp_kernel_tensor) == 32);
    CHECK(offsetof(fp_kernel_args, q) == 0 && offsetof(fp_kernel_args, o) == 96);
    CHECK(offsetof(fp_kernel_args, lse) == 128 && offsetof(fp_kernel_args, lse_ss) == 152);
    CHECK(offsetof(fp_kernel_args, cu_q) == 160 && offsetof(fp_kernel_args, nq) == 176);
    CHECK(offsetof(fp_kernel_args, seqused_k) == 184 && offsetof(fp_kernel_args, bt_stride) == 200);
    CHECK(offsetof(fp_kernel_args, page_size) == 208 && offsetof(fp_kernel_args, heads) == 216);
    CHECK(offsetof(fp_kernel_args, d) == 224 && offsetof(fp_kernel_args, left) == 232);
    CHECK(offsetof(fp_kernel_args, scale) == 248 && offsetof(fp_kernel_args, softcap) == 256);
    CHECK(offsetof(fp_kernel_args, alibi) == 264 && offsetof(fp_kernel_args, transform) == 272);
    CHECK(offsetof(fp_kernel_args, splits) == 280 && offsetof(fp_kernel_args, o_part) == 296);
    CHECK(offsetof(fp_kernel_args, batch) == 312 && offsetof(fp_kernel_args, dout) == 320);
    CHECK(offsetof(fp_kernel_args, dv) == 416 && sizeof(fp_kernel_args) == 448);
}

int main(void)
{
    test_dense();
    test_varlen_paged();
    if (sizeof(void *) == 8)
        test_layout();
    return tu_finish("test_kernel_args", "fill (dense GQA, varlen paged) and layout checked");
}
