/* The sm80 backward's kernels of head-dim class 64 (every configuration of fp_bwd_cfg<64, ALT>,
 * the dK/dV kernel, and of fp_dq_cfg<64, ALT>, the deterministic dQ; sm80/bwd.cuh), f16, bf16. */
#include "backends/cuda/sm80/bwd.cuh"

template struct fp_sm80_bwd_family<__half, 64>;
template struct fp_sm80_bwd_family<__nv_bfloat16, 64>;
