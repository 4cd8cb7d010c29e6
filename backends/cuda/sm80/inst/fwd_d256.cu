/* The sm80 forward's kernels of head-dim class 256 (every configuration of fp_fwd_cfg<256, ALT>,
 * sm80/fwd.cuh), f16 and bf16. */
#include "backends/cuda/sm80/fwd.cuh"

template struct fp_sm80_fwd_family<__half, 256>;
template struct fp_sm80_fwd_family<__nv_bfloat16, 256>;
