/* The sm80 backward's kernels of head-dim class 128 (every configuration of fp_bwd_cfg<128, ALT>,
 * the dK/dV kernel, and of fp_dq_cfg<128, ALT>, the deterministic dQ; sm80/bwd.cuh), f16, bf16. */
#include "backends/cuda/sm80/bwd.cuh"

template struct fp_sm80_bwd_family<__half, 128>;
template struct fp_sm80_bwd_family<__nv_bfloat16, 128>;
