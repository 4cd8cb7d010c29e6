/*
 * Validation of an attention call: every descriptor and parameter is checked before anything is
 * launched, and a valid call is normalized into an fp_problem (core/backend.h). Each bad input of
 * docs/semantics.md gets its own status and message (flashport_last_error()); nothing is written.
 */
#ifndef FLASHPORT_CORE_VALIDATE_H
#define FLASHPORT_CORE_VALIDATE_H

#include "core/internal.h"

#include <stddef.h>

/* The tensors of one call. Forward uses q, k, v, o and optional lse; backward uses all. */
typedef struct fp_call_tensors {
    const flashport_tensor *q, *k, *v, *o, *lse;
    const flashport_tensor *dout, *dq, *dk, *dv;
} fp_call_tensors;

/* Validates a forward (backward = 0) or backward (backward = 1) call on `backend` and fills
 * *problem. Reads cu_seqlens through the backend's copy_to_host (B + 1 ints) to check them. */
flashport_status fp_validate_call(flashport_backend *backend,
                                  const flashport_attention_params *params,
                                  const fp_call_tensors *t, int backward, fp_problem *problem);

/* Smallest params struct_size accepted: the struct as first versioned, through `deterministic`.
 * Fields after it (the fp8 descales, and any added later) take their defaults when a caller's
 * struct ends before them. */
#define FP_PARAMS_MIN_SIZE (offsetof(flashport_attention_params, descale_q))

/* Copies the caller's params into *full, with the defaults for fields its (older, smaller)
 * struct lacks. Rejects a struct flashport_attention_params_init did not set up
 * (FLASHPORT_ERR_UNINITIALIZED) and one from a newer header (FLASHPORT_ERR_INVALID_VALUE). */
flashport_status fp_params_normalize(const flashport_attention_params *p,
                                     flashport_attention_params *full);

/* Nonzero when no element of `a` shares a byte with an element of `b` (conservative: may say
 * "overlap" for exotic interleavings). Exposed for tests. */
int fp_tensors_disjoint(const flashport_tensor *a, const flashport_tensor *b);

/* Nonzero when no two index tuples of `t` address the same element (conservative). */
int fp_tensor_injective(const flashport_tensor *t);

#endif /* FLASHPORT_CORE_VALIDATE_H */
