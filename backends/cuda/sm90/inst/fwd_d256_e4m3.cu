/* The sm90 forward's kernels of head-dim class 256 for fp8 e4m3 inputs
 * (fp_sm90_fwd_cfg_of<256, true>, sm90/fwd_config.cuh), f16 and bf16 outputs. */
#include "backends/cuda/sm90/fwd.cuh"

template struct fp_sm90_fwd_family<uint8_t, __half, 256>;
template struct fp_sm90_fwd_family<uint8_t, __nv_bfloat16, 256>;
