/*
 * cuda_bf16.h of the CUDA emulator (docs/cuda_emu.md): __nv_bfloat16, __nv_bfloat162 and the
 * conversions the kernels use, round-to-nearest-even through core/dtype.h. .x of a
 * __nv_bfloat162 is its low 16 bits, as in CUDA.
 */
#ifndef FLASHPORT_CUDA_EMU_BF16_H
#define FLASHPORT_CUDA_EMU_BF16_H

#include "core/dtype.h"

#include <stdint.h>

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline float __bfloat162float(__nv_bfloat16 h)
{
    return fp_bf16_to_f32(h.bits);
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    __nv_bfloat16 h = {fp_f32_to_bf16(f)};
    return h;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
    __nv_bfloat162 r = {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
    return r;
}
static inline __nv_bfloat16 __ushort_as_bfloat16(uint16_t b)
{
    __nv_bfloat16 h = {b};
    return h;
}

#endif /* FLASHPORT_CUDA_EMU_BF16_H */
