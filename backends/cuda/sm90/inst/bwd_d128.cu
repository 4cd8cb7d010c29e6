/* The sm90 backward's kernel of head-dim class 128 (fp_sm90_bwd_cfg<128>, sm90/bwd.cuh), f16
 * and bf16. */
#include "backends/cuda/sm90/bwd.cuh"

template struct fp_sm90_bwd_family<__half, 128>;
template struct fp_sm90_bwd_family<__nv_bfloat16, 128>;
