/* The sm90 backward's kernel of head-dim class 64 (fp_sm90_bwd_cfg<64>, sm90/bwd.cuh), f16
 * and bf16. */
#include "backends/cuda/sm90/bwd.cuh"

template struct fp_sm90_bwd_family<__half, 64>;
template struct fp_sm90_bwd_family<__nv_bfloat16, 64>;
