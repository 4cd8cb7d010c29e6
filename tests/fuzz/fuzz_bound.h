/*
 * Error bounds of the fuzz harness's cpu-against-reference comparison: for every output element,
 * a bound on how far an attention computed the way a flash kernel computes it (f32 arithmetic on
 * the stored values, P and dS rounded to the storage dtype before their products, f32
 * accumulation) may lie from the exact result, which the reference (double) stands for.
 *
 * The bounds follow the magnitude of the terms each output sums, not the output itself: on a
 * row whose terms cancel, rounding each term to bf16 leaves an error of 2^-8 of the terms'
 * magnitude however small their sum. The derivation is in fuzz_bound.c and docs/reliability.md
 * ("How close cpu and reference must be").
 *
 * Layouts are those of tests/test_util.h's naive attention (tu_problem): q, o, dout, dq logical
 * [total_q, H, D]; k, v, dk, dv [total_k, Hkv, D]; lse [H, total_q].
 */
#ifndef FLASHPORT_TESTS_FUZZ_FUZZ_BOUND_H
#define FLASHPORT_TESTS_FUZZ_FUZZ_BOUND_H

#include "tests/test_util.h"

/* Bounds on |O - O_exact| per element and |LSE - LSE_exact| per row of the forward, before
 * either result is rounded to its storage dtype. Returns 0, or -1 when out of memory. */
int fb_forward_bound(const tu_problem *p, double *o_bound, double *lse_bound);

/* Bounds on the backward's dQ, dK, dV against the exact gradients of the same inputs: o, lse
 * (the forward's, as both backends receive them) and dout. Same rounding convention. */
int fb_backward_bound(const tu_problem *p, const float *o, const float *lse, const float *dout,
                      double *dq_bound, double *dk_bound, double *dv_bound);

/* What the storage dtype adds when a result is written: |x - y| of two results x, y of one
 * exact value may exceed the bound above by this much (both rounded to dtype; the reference's
 * through f32 first). */
double fb_store_slack(flashport_dtype dtype, double x, double y);

#endif /* FLASHPORT_TESTS_FUZZ_FUZZ_BOUND_H */
