/* The decode forward's kernels of head-dim class 128 (fp_dec_cfg<128, MT> for each row-tile
 * count MT, decode/fwd.cuh), f16 and bf16. */
#include "backends/cuda/decode/fwd.cuh"

template struct fp_decode_fwd_family<__half, 128>;
template struct fp_decode_fwd_family<__nv_bfloat16, 128>;
