/* The decode forward's kernels of head-dim class 64 (fp_dec_cfg<64, MT> for each row-tile
 * count MT, decode/fwd.cuh), f16 and bf16. */
#include "backends/cuda/decode/fwd.cuh"

template struct fp_decode_fwd_family<__half, 64>;
template struct fp_decode_fwd_family<__nv_bfloat16, 64>;
