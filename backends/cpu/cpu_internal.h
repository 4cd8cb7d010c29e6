/*
 * The CPU backend's internal entry points. All take a validated fp_problem whose tensors live in
 * host memory (core/backend.h); none allocates more than O(B * H * (Nq + Nk)) plus per-thread
 * tiles.
 *
 *   reference.c   naive, obviously right, accumulates in double: the oracle of every test
 *   flash_fwd.c   tiled forward with online softmax (core/online_softmax.h), OpenMP
 *   flash_decode.c  forward of decode shapes: GQA-packed, split-KV
 *   flash_bwd.c   tiled backward recomputing P from LSE, OpenMP, deterministic
 * The two flash kernels run their products and per-score steps on the micro-kernels of ukernel.h,
 * chosen for the CPU at run time by isa.c.
 */
#ifndef FLASHPORT_BACKENDS_CPU_INTERNAL_H
#define FLASHPORT_BACKENDS_CPU_INTERNAL_H

#include "core/backend.h"

flashport_status fp_reference_forward(const fp_problem *p);
flashport_status fp_reference_backward(const fp_problem *p);

flashport_status fp_cpu_flash_forward(const fp_problem *p);

/* flash_decode.c: the forward of decode shapes (Nq <= FP_CPU_DECODE_MAX_NQ rows per sequence),
 * GQA-packed and split over the keys; fp_cpu_flash_forward hands them over. */
#define FP_CPU_DECODE_MAX_NQ 16
struct fp_ukernels;
int fp_cpu_decode_eligible(const fp_problem *p);
flashport_status fp_cpu_decode_forward(const fp_problem *p, const struct fp_ukernels *uk);
flashport_status fp_cpu_flash_backward(const fp_problem *p);

/* Threads the CPU kernels use: FLASHPORT_NUM_THREADS if set, else OpenMP's default (1 without
 * OpenMP). Kernels pass it to their parallel regions as num_threads(...). */
int fp_cpu_threads(void);

#endif /* FLASHPORT_BACKENDS_CPU_INTERNAL_H */
