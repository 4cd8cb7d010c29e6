/*
 * AVX-512 f32 micro-kernels (contract in ukernel.h): FMA on zmm registers, 6 x 64 register block
 * (primitives and the block's reasoning in ukernel_avx512.h), f16/bf16 storage converted to f32
 * with vcvtph2ps / shifts. FLASHPORT_CPU_ISA=avx512; the default on AVX-512 CPUs without BF16,
 * and the f32 and f16 half of the avx512bf16 table.
 * Forward query block: 256 (fwd_block_q; also in the avx512bf16 table), f32 K and V copied per
 * key block into the task's tiles (fwd_stage_f32 = 0; isa.c stages them on Intel cores): taller
 * tasks pass over a head's K and V a quarter as often, which matters once those lie beyond L2
 * (docs/performance-cpu.md).
 * Target: x86-64 with AVX-512 F, BW, VL (compiled with those flags alone; isa.c checks the CPU).
 * Known differences from the reference: f32 accumulation with FMA; the polynomial exp2.
 * Numbers (the product alone against bench/peak.c's FMA loop, and the whole forward):
 * docs/bench/cpu.md, docs/performance-cpu.md.
 */
#include "backends/cpu/ukernel_avx512.h"

#define UK_OWN_DEC_SCORES_F16
#include "backends/cpu/ukernel_ops.h"

#include "backends/cpu/ukernel_avx512_dec.h"

const fp_ukernels fp_ukernels_avx512 = {
    "avx512",
    "AVX-512 f32 FMA, 6x64 register block",
    uk_gemm,
    NULL,
    uk_col_max,
    uk_exp2_cols,
    NULL,
    NULL,
    NULL,
    uk_dsoftmax_cols,
    uk_scale_rows,
    avx512_transpose32,
    avx512_cvt_f16,
    avx512_cvt_bf16,
    avx512_store_f16,
    avx512_store_bf16,
    uk_dec_scores,
    uk_dec_pv,
    NULL,
    NULL,
    avx512_dec_scores_f16,
    uk_dec_pv_f16,
    NULL,
    NULL,
    NULL,
    NULL,
    256,
    0,
    0,
    uk_gemm_rs,
    uk_softmax_cols,
};
