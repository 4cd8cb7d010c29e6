/* The sm80 forward's kernels of head-dim class 128 (every configuration of fp_fwd_cfg<128, ALT>,
 * sm80/fwd.cuh), f16 and bf16. */
#include "backends/cuda/sm80/fwd.cuh"

template struct fp_sm80_fwd_family<__half, 128>;
template struct fp_sm80_fwd_family<__nv_bfloat16, 128>;
