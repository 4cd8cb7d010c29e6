/*
 * Element access for the bench, which sees only the public API: every conversion goes through
 * flashport_convert (the library's own f16 / bf16 rounding, include/flashport.h), so the bench
 * stores its inputs and reads every backend's outputs with the same rules as the library.
 */
#ifndef FLASHPORT_BENCH_DTYPE_H
#define FLASHPORT_BENCH_DTYPE_H

#include "flashport.h"

#include <stddef.h>

/* Element i of a buffer of the given dtype (f32, f16 or bf16), as f32. */
static inline float bench_load(const void *base, flashport_dtype dtype, size_t i)
{
    float x = 0.0f;
    flashport_convert(&x, FLASHPORT_F32, (const char *)base + i * flashport_dtype_size(dtype),
                      dtype, 1);
    return x;
}

static inline void bench_store(void *base, flashport_dtype dtype, size_t i, float x)
{
    flashport_convert((char *)base + i * flashport_dtype_size(dtype), dtype, &x, FLASHPORT_F32, 1);
}

#endif /* FLASHPORT_BENCH_DTYPE_H */
