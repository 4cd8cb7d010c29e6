/* The sm90 forward's kernels of head-dim class 192 (fp_sm90_fwd_cfg_of<192, false>,
 * sm90/fwd_config.cuh), f16 and bf16. */
#include "backends/cuda/sm90/fwd.cuh"

template struct fp_sm90_fwd_family<__half, __half, 192>;
template struct fp_sm90_fwd_family<__nv_bfloat16, __nv_bfloat16, 192>;
