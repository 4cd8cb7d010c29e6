/*
 * Host-side f32 <-> f16 / bf16 conversions for the bench, which sees only the public API and so
 * cannot use core/dtype.h. Round-to-nearest-even, NaN stays NaN, overflow goes to infinity; the
 * bench stores its inputs through these and reads every backend's outputs back through them.
 */
#ifndef FLASHPORT_BENCH_DTYPE_H
#define FLASHPORT_BENCH_DTYPE_H

#include "flashport.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t bench_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bench_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float bench_bf16_to_f32(uint16_t h)
{
    return bench_bits_f32((uint32_t)h << 16);
}

static inline uint16_t bench_f32_to_bf16(float f)
{
    uint32_t u = bench_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bench_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1fu)
        return bench_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float f = (float)man * 5.9604644775390625e-8f; /* man * 2^-24, exact */
        return sign ? -f : f;
    }
    return bench_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t bench_f32_to_f16(float f)
{
    uint32_t u = bench_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) /* 65520 and up round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* Below 2^-14 the f16 step is 2^-24, the f32 step of 0.5: the FPU's own
         * round-to-nearest-even in this addition does the rounding. */
        float y = bench_bits_f32(a) + 0.5f;
        return (uint16_t)(sign | (bench_f32_bits(y) - 0x3f000000u));
    }
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((a - (112u << 23)) >> 13));
}

/* Element i of a buffer of the given dtype (f32, f16 or bf16), as f32. */
static inline float bench_load(const void *base, flashport_dtype dtype, size_t i)
{
    if (dtype == FLASHPORT_F32)
        return ((const float *)base)[i];
    if (dtype == FLASHPORT_F16)
        return bench_f16_to_f32(((const uint16_t *)base)[i]);
    return bench_bf16_to_f32(((const uint16_t *)base)[i]);
}

static inline void bench_store(void *base, flashport_dtype dtype, size_t i, float x)
{
    if (dtype == FLASHPORT_F32)
        ((float *)base)[i] = x;
    else if (dtype == FLASHPORT_F16)
        ((uint16_t *)base)[i] = bench_f32_to_f16(x);
    else
        ((uint16_t *)base)[i] = bench_f32_to_bf16(x);
}

#endif /* FLASHPORT_BENCH_DTYPE_H */
