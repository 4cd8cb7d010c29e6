/*
 * flashport_convert: host conversions between the storage types (include/flashport.h states the
 * rounding, NaN and saturation rules). Every element goes through its exact f32 value: f16,
 * bf16 and both fp8 formats are all exactly representable in f32, so one rounding step (core/
 * dtype.h) gives the correctly rounded result for every pair.
 */
#include "core/dtype.h"
#include "core/internal.h"

#include <string.h>

flashport_status flashport_convert(void *dst, flashport_dtype dst_dtype, const void *src,
                                   flashport_dtype src_dtype, size_t count)
{
    fp_clear_error();
    const size_t ds = flashport_dtype_size(dst_dtype), ss = flashport_dtype_size(src_dtype);
    if (ds == 0 || ss == 0)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE, "convert: unknown dtype %d",
                            ds == 0 ? (int)dst_dtype : (int)src_dtype);
    if (count == 0)
        return FLASHPORT_OK;
    if (!dst || !src)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "convert: %s is NULL", dst ? "src" : "dst");
    if (count > SIZE_MAX / (ds > ss ? ds : ss))
        return fp_set_error(FLASHPORT_ERR_BAD_SIZE,
                            "convert: %zu elements overflow the address "
                            "space",
                            count);
    const uintptr_t d0 = (uintptr_t)dst, s0 = (uintptr_t)src;
    if (d0 < s0 + count * ss && s0 < d0 + count * ds)
        return fp_set_error(FLASHPORT_ERR_ALIASING, "convert: dst and src overlap");
    if (dst_dtype == src_dtype) {
        memcpy(dst, src, count * ds);
        return FLASHPORT_OK;
    }
    for (size_t i = 0; i < count; i++)
        fp_store(dst, (int64_t)i, dst_dtype, fp_load(src, (int64_t)i, src_dtype));
    return FLASHPORT_OK;
}
