/*
 * cuda_fp16.h of the CUDA emulator (docs/cuda_emu.md): __half, __half2 and the conversions the
 * kernels use, round-to-nearest-even through core/dtype.h. .x of a __half2 is its low 16 bits,
 * as in CUDA.
 */
#ifndef FLASHPORT_CUDA_EMU_FP16_H
#define FLASHPORT_CUDA_EMU_FP16_H

#include "core/dtype.h"

#include <stdint.h>

struct __half {
    uint16_t bits;
};
struct __half2 {
    __half x, y;
};

static inline float __half2float(__half h)
{
    return fp_f16_to_f32(h.bits);
}
static inline __half __float2half_rn(float f)
{
    __half h = {fp_f32_to_f16(f)};
    return h;
}
static inline __half2 __floats2half2_rn(float lo, float hi)
{
    __half2 r = {__float2half_rn(lo), __float2half_rn(hi)};
    return r;
}
static inline __half __ushort_as_half(uint16_t b)
{
    __half h = {b};
    return h;
}
static inline uint16_t __half_as_ushort(__half h)
{
    return h.bits;
}

#endif /* FLASHPORT_CUDA_EMU_FP16_H */
