/*
 * The argument block every GPU attention kernel reads (the CUDA and HIP backends), filled once
 * from a validated fp_problem by fp_kernel_args_fill. Plain C, passed to kernels by value: each
 * backend's own block (fp_sm80_args in backends/cuda/sm80/common.cuh, fp_hip_args in
 * backends/hip/hip_common.h) starts with this one and adds the fields only its kernels read
 * (the CUDA backward's scratch, the HIP launch plan), so a kernel reads a.q, a.nq, ... the same
 * way on both. Sizes fit int where the kernels index with 32-bit positions: core/validate.c
 * refuses sequences, heads and batches beyond INT32_MAX.
 */
#ifndef FLASHPORT_CORE_KERNEL_ARGS_H
#define FLASHPORT_CORE_KERNEL_ARGS_H

#include "core/backend.h"
#include "core/online_softmax.h"

#include <stdint.h>
#include <string.h>

/* One q/k/v/o-shaped tensor: base pointer and element strides [batch, seq, head]. The head-dim
 * stride is 1 (the GPU backends' caps ask the core for it); varlen tensors have sb == 0. */
typedef struct fp_kernel_tensor {
    const void *ptr;
    int64_t sb, ss, sh;
} fp_kernel_tensor;

/* The order of the fields is the CUDA kernels' parameter layout: keep it. */
typedef struct fp_kernel_args {
    fp_kernel_tensor q, k, v, o;
    float *lse; /* [B, H, Nq] by the strides below; may be NULL in the forward */
    int64_t lse_sb, lse_sh, lse_ss;
    const int32_t *cu_q, *cu_k; /* varlen: B + 1 offsets in device memory; NULL when dense */
    int nq, nk;                 /* dense lengths, or varlen maxima */
    /* KV cache (fp_problem's fields): seqused_k ([B], device memory, NULL = none) is each
     * sequence's key count, the mask's Nk. block_table ([B, bt_stride] int32, NULL = dense):
     * k and v are [num_pages, page_size, Hkv, D], their batch stride the page stride, and nk
     * the capacity bt_stride * page_size; fp_paged_page (core/geometry.h) finds a key's page. */
    const int32_t *seqused_k;
    const int32_t *block_table;
    int64_t bt_stride;
    int page_size, num_pages;
    int heads, group;        /* query heads, query heads per kv head */
    int d;                   /* the problem's head dim (<= the kernel's) */
    int64_t left, right;     /* window, -1 = unbounded, causal folded in */
    float scale, scale_log2; /* scale and scale * log2(e) */
    float softcap;           /* 0 = off */
    const float *alibi;      /* [H] or NULL */
    int transform;           /* softcap or ALiBi: scores go through fp_score_transform */
    int reverse;             /* launch the last query blocks first (causal: the heaviest) */
    /* forward split-KV (core/plan.h) */
    int splits;
    int64_t keys_per_split; /* a multiple of the key block */
    float *o_part;          /* the splits' partial O, f32 (each backend's layout) */
    float *lse_part;        /* the splits' partial LSE, natural log */
    int batch;
    /* backward */
    fp_kernel_tensor dout, dq, dk, dv;
} fp_kernel_args;

static inline fp_kernel_tensor fp_kernel_tensor_of(const fp_tensor_view *t)
{
    fp_kernel_tensor v;
    v.ptr = t->data;
    v.sb = t->stride[FP_B];
    v.ss = t->stride[FP_S];
    v.sh = t->stride[FP_H];
    return v;
}

/* The block of a validated problem (forward and backward fields): one split, forward order;
 * the launch plan's fields stay 0 for the launcher to set. */
static inline void fp_kernel_args_fill(const fp_problem *p, fp_kernel_args *a)
{
    memset(a, 0, sizeof *a);
    a->q = fp_kernel_tensor_of(&p->q);
    a->k = fp_kernel_tensor_of(&p->k);
    a->v = fp_kernel_tensor_of(&p->v);
    a->o = fp_kernel_tensor_of(&p->o);
    a->lse = (float *)p->lse.data;
    a->lse_sb = p->lse.stride[0];
    a->lse_sh = p->lse.stride[1];
    a->lse_ss = p->lse.stride[2];
    a->cu_q = p->varlen ? p->cu_seqlens_q : NULL;
    a->cu_k = p->varlen ? p->cu_seqlens_k : NULL;
    a->seqused_k = p->seqused_k;
    a->block_table = p->block_table;
    a->bt_stride = p->block_table ? p->block_table_stride : 0;
    a->page_size = p->block_table ? (int)p->page_size : 0;
    a->num_pages = p->block_table ? (int)p->num_pages : 0;
    a->nq = (int)p->seqlen_q;
    a->nk = (int)p->seqlen_k;
    a->batch = (int)p->batch;
    a->heads = (int)p->heads;
    a->group = (int)(p->heads / p->kv_heads);
    a->d = (int)p->head_dim;
    a->left = p->window_left;
    a->right = p->window_right;
    a->scale = p->scale;
    a->scale_log2 = p->scale * FP_LOG2E;
    a->softcap = p->softcap;
    a->alibi = p->alibi_slopes;
    a->transform = p->softcap > 0.0f || p->alibi_slopes != NULL;
    a->dout = fp_kernel_tensor_of(&p->dout);
    a->dq = fp_kernel_tensor_of(&p->dq);
    a->dk = fp_kernel_tensor_of(&p->dk);
    a->dv = fp_kernel_tensor_of(&p->dv);
    a->splits = 1;
}

#endif /* FLASHPORT_CORE_KERNEL_ARGS_H */
