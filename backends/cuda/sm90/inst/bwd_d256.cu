/* The sm90 backward's kernel of head-dim class 256 (fp_sm90_bwd256_cfg, sm90/bwd256.cuh), f16
 * and bf16. */
#include "backends/cuda/sm90/bwd256.cuh"

template struct fp_sm90_bwd_family<__half, 256>;
template struct fp_sm90_bwd_family<__nv_bfloat16, 256>;
