/*
 * Host-side storage conversions for f16 and bf16, in plain C so they build on any compiler and
 * architecture. Round-to-nearest-even, NaN stays NaN, overflow goes to infinity. CPU kernels load
 * through these (or a vectorized equivalent that must agree bit for bit).
 */
#ifndef FLASHPORT_CORE_DTYPE_H
#define FLASHPORT_CORE_DTYPE_H

#include "flashport.h"

#include <stdint.h>
#include <string.h>

static inline uint32_t fp_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float fp_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float fp_bf16_to_f32(uint16_t h) { return fp_bits_f32((uint32_t)h << 16); }

static inline uint16_t fp_f32_to_bf16(float f)
{
    uint32_t u = fp_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float fp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1fu) /* inf / NaN */
        return fp_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return fp_bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return fp_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t fp_f32_to_f16(float f)
{
    uint32_t u = fp_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal or zero in f16 */
        /* scale to units of 2^-24 and round to nearest even */
        float v = fp_bits_f32(a) * 16777216.0f;
        uint32_t n = (uint32_t)v;
        float rem = v - (float)n;
        if (rem > 0.5f || (rem == 0.5f && (n & 1u)))
            n++;
        return (uint16_t)(sign | n);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round mantissa to 10 bits, nearest even */
    return (uint16_t)(sign | (((r >> 23) - 112u) << 10 | ((r >> 13) & 0x3ffu)));
}

/* Element i (in elements, not bytes) of a buffer of `dtype`, as f32. f32/f16/bf16 only. */
static inline float fp_load(const void *base, int64_t i, flashport_dtype dtype)
{
    switch (dtype) {
    case FLASHPORT_F16: return fp_f16_to_f32(((const uint16_t *)base)[i]);
    case FLASHPORT_BF16: return fp_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static inline void fp_store(void *base, int64_t i, flashport_dtype dtype, float x)
{
    switch (dtype) {
    case FLASHPORT_F16: ((uint16_t *)base)[i] = fp_f32_to_f16(x); break;
    case FLASHPORT_BF16: ((uint16_t *)base)[i] = fp_f32_to_bf16(x); break;
    default: ((float *)base)[i] = x; break;
    }
}

#endif /* FLASHPORT_CORE_DTYPE_H */
