/*
 * The argument block of every OpenCL attention kernel, one definition for the host (C) and the
 * kernels (OpenCL C: the build step puts this file into the program source). Only 64-bit integers
 * and floats, in an order that leaves no padding between fields, so the host and any device lay
 * it out alike.
 *
 * Offsets and strides are in elements. A view's strides are fp_problem's: [batch, seq, head, dim]
 * for q/k/v/o and their gradients, [batch, head, seq] for the LSE. Each offset is where the view
 * starts inside the buffer object passed beside the block (flashport pointers are positions
 * inside buffer objects: ocl_memory.c).
 */
#ifndef FLASHPORT_BACKENDS_OPENCL_ARGS_H
#define FLASHPORT_BACKENDS_OPENCL_ARGS_H

#ifdef __OPENCL_VERSION__
#define FP_OCL_LONG long
#else
#include <stdint.h>
#define FP_OCL_LONG int64_t
#endif

/* Work-items of every attention work-group (an 8 x 16 grid), and the most output elements each
 * one accumulates in registers (kernels/flash.cl: (T / 8) * ceil(D / 16) of them). */
#define FP_OCL_WG  128
#define FP_OCL_ACC 32

/* The FA2-shaped kernels' inner blocks (kernels/flash_fa2.cl; their work-groups own 64 rows):
 * keys per block of the dQ kernel; query rows per block of the dK / dV kernel and of the
 * one-kernel backward by default: 32 up to head-dim class 64, where a warp's dK and dV
 * accumulators leave room for the wider S^T and dP^T (half the query blocks, so half the
 * barriers, copies and dQ passes per key), 16 above (32 would pass 255 registers at class 128 and
 * 48 KiB of local memory above it). A program takes its query block as FP_OCL_BQ
 * (FLASHPORT_OPENCL_BWD_BQ=16 asks for 16 at every class: ocl_attention.c). */
#define FP_OCL_FA2_BK     32
#define FP_OCL_FA2_BQ(d)  ((d) <= 64 ? 32 : 16)
#define FP_OCL_FA2_BQ_MIN 16
/* The FA2-shaped forward's blocks: keys per block, 64 up to head-dim class 128 and 32 above,
 * where K [32, D + 8] and V transposed [dims, 32 + 8] (16-bit) fit 48 KiB side by side and 64
 * keys would not; and the dims of O each pass over the keys computes, all of them up to class
 * 192 and half at 256, where a warp's whole 16 x 256 f32 O (128 registers a lane) beside its Q
 * fragments (64) and S passes 255 registers (ptxas spills), so each half of O takes a pass of
 * its own, S computed again. Its two-kernel backward serves head-dim classes up to
 * FP_OCL_FA2_BWD_D only (above, a warp's dQ or dK and dV accumulators and its operand fragments
 * pass 255 registers); its one-kernel backward serves every class, in work-groups of
 * FP_OCL_FA2_WK keys: 64 up to FP_OCL_FA2_BWD_D, and above 32, each 16 keys taken by two warps,
 * one accumulating dV, the other dK (kernels/flash_fa2.cl). */
#define FP_OCL_FA2_FK(d) ((d) <= 128 ? 64 : 32)
#define FP_OCL_FA2_OD(d) ((d) <= 192 ? (d) : (d) / 2)
#define FP_OCL_FA2_BWD_D 128
#define FP_OCL_FA2_WK(d) ((d) <= FP_OCL_FA2_BWD_D ? 64 : 32)

typedef struct fp_ocl_view {
    FP_OCL_LONG off;
    FP_OCL_LONG s[4];
} fp_ocl_view;

typedef struct fp_ocl_args {
    fp_ocl_view q, k, v, o, lse, dout, dq, dk, dv;
    FP_OCL_LONG alibi_off, cu_q_off, cu_k_off; /* elements into their buffers */
    FP_OCL_LONG delta_off; /* elements: the backward's delta in its buffer (a caller's workspace) */
    FP_OCL_LONG dq_acc_off; /* elements: the fused backward's dQ accumulator in the same buffer */
    FP_OCL_LONG batch, nq, nk; /* dense lengths, or varlen maxima */
    FP_OCL_LONG heads, kv_heads, head_dim;
    FP_OCL_LONG left, right; /* window, -1 = unbounded; causal folded in */
    FP_OCL_LONG total_q;     /* rows of the backward's delta per head */
    FP_OCL_LONG varlen, has_lse, has_alibi;
    /* KV cache (include/flashport.h): seqused_k and the block table, int32 in their buffers at
     * these element offsets, read only where has_used / paged. Paged: k and v are
     * [num_pages, page_size, Hkv, D], their views' s[0] the page stride and s[1] the row stride
     * within a page; nk is the capacity bt_stride * page_size. */
    FP_OCL_LONG used_off, bt_off, has_used, paged;
    FP_OCL_LONG bt_stride, page_size, num_pages;
    float scale, softcap;
} fp_ocl_args;

#endif /* FLASHPORT_BACKENDS_OPENCL_ARGS_H */
