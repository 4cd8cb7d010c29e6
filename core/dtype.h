/*
 * Host-side storage conversions for f16, bf16 and the two fp8 formats, in plain C so they build
 * on any compiler and architecture. Round-to-nearest-even; NaN stays NaN; f16 and bf16 overflow
 * to infinity, fp8 saturates (rules in include/flashport.h, flashport_convert, which is built on
 * these). CPU kernels load through these (or a vectorized equivalent that must agree bit for bit).
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

static inline float fp_bf16_to_f32(uint16_t h)
{
    return fp_bits_f32((uint32_t)h << 16);
}

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

/* OCP fp8: e4m3 ("E4M3FN": bias 7, no infinities, 0x7f NaN, largest finite 448) and e5m2 (bias
 * 15, IEEE-like infinities and NaNs, largest finite 57344). e4m3 != 0 picks the first. */
static inline float fp_fp8_to_f32(uint8_t h, int e4m3)
{
    const int man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    const uint32_t sign = (uint32_t)(h & 0x80u) << 24;
    const uint32_t exp = (uint32_t)(h & 0x7fu) >> man_bits;
    const uint32_t man = h & ((1u << man_bits) - 1u);
    if (e4m3 ? (h & 0x7fu) == 0x7fu : exp == 0x1fu && man != 0)
        return fp_bits_f32(sign | 0x7fc00000u);
    if (!e4m3 && exp == 0x1fu)
        return fp_bits_f32(sign | 0x7f800000u);
    if (exp == 0) { /* subnormal: man * 2^(1 - bias - man_bits), exact in f32 */
        float f = (float)man * (e4m3 ? 0.001953125f : 1.52587890625e-05f);
        return sign ? -f : f;
    }
    return fp_bits_f32(sign | (exp - (uint32_t)bias + 127u) << 23 | man << (23 - man_bits));
}

static inline uint8_t fp_f32_to_fp8(float f, int e4m3)
{
    const int man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    const uint32_t max_finite = e4m3 ? 0x7eu : 0x7bu;
    const uint32_t u = fp_f32_bits(f);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint8_t)(sign | (e4m3 ? 0x7fu : 0x7eu));
    if (a == 0x7f800000u) /* infinity: saturates in e4m3, which has none */
        return (uint8_t)(sign | (e4m3 ? max_finite : 0x7cu));
    if ((int)(a >> 23) - 127 < 1 - bias) {
        /* below the smallest normal: count units of the smallest subnormal, round to even (the
         * scaling by a power of two is exact; a carry into 1 << man_bits is the smallest normal) */
        float v = fp_bits_f32(a) * (e4m3 ? 512.0f : 65536.0f);
        uint32_t n = (uint32_t)v;
        float rem = v - (float)n;
        if (rem > 0.5f || (rem == 0.5f && (n & 1u)))
            n++;
        return (uint8_t)(sign | n);
    }
    const int shift = 23 - man_bits;
    const uint32_t r = (a + (1u << (shift - 1)) - 1u + ((a >> shift) & 1u)) >> shift;
    const uint32_t e = (r >> man_bits) - 127u + (uint32_t)bias; /* >= 1 here */
    const uint32_t out = e << man_bits | (r & ((1u << man_bits) - 1u));
    return (uint8_t)(sign | (out > max_finite ? max_finite : out));
}

/* x rounded to the nearest e4m3 value (ties to even) and back to f32, as
 * fp_fp8_to_f32(fp_f32_to_fp8(x, 1), 1) gives it: the P rounding of the fp8 forward
 * (docs/semantics.md). NaN stays NaN; beyond 448 saturates to +-448. Written without branches so
 * that a loop over it vectorizes: below 2^-6 (the e4m3 subnormals, multiples of 2^-9) the
 * addition of 2^14 rounds to a multiple of 2^-9 in the current (nearest-even) rounding mode;
 * above, the f32 mantissa is rounded to 3 bits. */
static inline float fp_round_e4m3(float x)
{
    const uint32_t u = fp_f32_bits(x), sign = u & 0x80000000u, a = u & 0x7fffffffu;
    const uint32_t sub = fp_f32_bits((fp_bits_f32(a) + 16384.0f) - 16384.0f); /* IEEE: kept */
    uint32_t nrm = (a + 0x7ffffu + ((a >> 20) & 1u)) & 0xfff00000u;
    /* all-ones masks instead of branches, so the compiler's if-conversion is not needed */
    const uint32_t big = 0u - (uint32_t)(nrm > 0x43e00000u);
    nrm = (nrm & ~big) | (0x43e00000u & big);
    const uint32_t small = 0u - (uint32_t)(a < 0x3c800000u);
    const uint32_t nan = 0u - (uint32_t)(a > 0x7f800000u);
    const uint32_t r = sign | (sub & small) | (nrm & ~small);
    return fp_bits_f32((u & nan) | (r & ~nan));
}

/* fp_fp8_to_f32 without branches or a table, for loops that should vectorize (the CPU kernel's
 * fp8 tiles); bit for bit the same value (any NaN for a NaN code). A normal code's magnitude bits
 * shifted to the top of an f32 mantissa, plus the bias difference in the exponent field, are its
 * f32; a subnormal one (exponent field 0) is its mantissa times the smallest subnormal, computed
 * in float so that no f32 subnormal is involved (a caller's flush-to-zero mode cannot bite). */
static inline float fp_fp8_to_f32_vec(uint8_t h, int e4m3)
{
    const int man_bits = e4m3 ? 3 : 2;
    const uint32_t mag = h & 0x7fu, sign = (uint32_t)(h & 0x80u) << 24;
    const uint32_t nrm = (mag << (23 - man_bits)) + ((e4m3 ? 120u : 112u) << 23);
    const float subf =
        (float)(int)(mag & ((1u << man_bits) - 1u)) * (e4m3 ? 0.001953125f : 1.52587890625e-05f);
    /* all-ones masks instead of branches, so the compiler's if-conversion is not needed */
    const uint32_t is_sub = 0u - (uint32_t)((mag >> man_bits) == 0);
    uint32_t bits = (nrm & ~is_sub) | (fp_f32_bits(subf) & is_sub);
    const uint32_t special = 0u - (uint32_t)(e4m3 ? mag == 0x7fu : mag >= 0x7cu);
    const uint32_t inf_nan = e4m3 ? 0x7fc00000u : (mag == 0x7cu ? 0x7f800000u : 0x7fc00000u);
    bits = (bits & ~special) | (inf_nan & special);
    return fp_bits_f32(sign | bits);
}

/* Whether a dtype is one of the two fp8 formats. */
static inline int fp_is_fp8(flashport_dtype dtype)
{
    return dtype == FLASHPORT_FP8_E4M3 || dtype == FLASHPORT_FP8_E5M2;
}

/* Element i (in elements, not bytes) of a buffer of `dtype`, as f32 (exact for every dtype). */
static inline float fp_load(const void *base, int64_t i, flashport_dtype dtype)
{
    switch (dtype) {
    case FLASHPORT_F16:
        return fp_f16_to_f32(((const uint16_t *)base)[i]);
    case FLASHPORT_BF16:
        return fp_bf16_to_f32(((const uint16_t *)base)[i]);
    case FLASHPORT_FP8_E4M3:
        return fp_fp8_to_f32(((const uint8_t *)base)[i], 1);
    case FLASHPORT_FP8_E5M2:
        return fp_fp8_to_f32(((const uint8_t *)base)[i], 0);
    default:
        return ((const float *)base)[i];
    }
}

static inline void fp_store(void *base, int64_t i, flashport_dtype dtype, float x)
{
    switch (dtype) {
    case FLASHPORT_F16:
        ((uint16_t *)base)[i] = fp_f32_to_f16(x);
        break;
    case FLASHPORT_BF16:
        ((uint16_t *)base)[i] = fp_f32_to_bf16(x);
        break;
    case FLASHPORT_FP8_E4M3:
        ((uint8_t *)base)[i] = fp_f32_to_fp8(x, 1);
        break;
    case FLASHPORT_FP8_E5M2:
        ((uint8_t *)base)[i] = fp_f32_to_fp8(x, 0);
        break;
    default:
        ((float *)base)[i] = x;
        break;
    }
}

#endif /* FLASHPORT_CORE_DTYPE_H */
