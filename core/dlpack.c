/*
 * DLPack import (include/flashport_dlpack.h): a flashport_tensor viewing a DLTensor's memory.
 * Built only when dlpack/dlpack.h is found at configure time.
 */
#include "flashport_dlpack.h"

#include "core/internal.h"

#include <string.h>

static flashport_status map_dtype(DLDataType t, flashport_dtype *out)
{
    if (t.lanes != 1)
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_DTYPE,
                            "dlpack: vector dtypes (lanes %u) are not read", (unsigned)t.lanes);
    if (t.code == kDLFloat && t.bits == 32)
        *out = FLASHPORT_F32;
    else if (t.code == kDLFloat && t.bits == 16)
        *out = FLASHPORT_F16;
    else if (t.code == kDLBfloat && t.bits == 16)
        *out = FLASHPORT_BF16;
#if defined(DLPACK_MAJOR_VERSION) && DLPACK_MAJOR_VERSION >= 1
    else if (t.code == kDLFloat8_e4m3fn && t.bits == 8)
        *out = FLASHPORT_FP8_E4M3;
    else if (t.code == kDLFloat8_e5m2 && t.bits == 8)
        *out = FLASHPORT_FP8_E5M2;
#endif
    else
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_DTYPE,
                            "dlpack: dtype (code %u, %u bits) is none of f32, f16, bf16%s",
                            (unsigned)t.code, (unsigned)t.bits,
#if defined(DLPACK_MAJOR_VERSION) && DLPACK_MAJOR_VERSION >= 1
                            ", fp8 e4m3fn, fp8 e5m2"
#else
                            ""
#endif
        );
    return FLASHPORT_OK;
}

static int host_readable(DLDeviceType d)
{
    return d == kDLCPU || d == kDLCUDAHost || d == kDLROCMHost || d == kDLCUDAManaged;
}

flashport_status flashport_tensor_from_dlpack(const DLTensor *t, flashport_tensor *out)
{
    fp_clear_error();
    if (!t || !out)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "dlpack: %s is NULL", t ? "out" : "tensor");
    const DLDeviceType dev = t->device.device_type;
    if (!host_readable(dev) && dev != kDLCUDA && dev != kDLROCM)
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_LAYOUT,
                            "dlpack: device type %d is not read by any flashport backend (host, "
                            "CUDA and ROCm memory are)",
                            (int)dev);
    if (t->ndim < 1 || t->ndim > FLASHPORT_MAX_RANK)
        return fp_set_error(FLASHPORT_ERR_INVALID_VALUE, "dlpack: ndim %d is not in 1..%d", t->ndim,
                            FLASHPORT_MAX_RANK);
    if (!t->shape)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "dlpack: shape is NULL");
    flashport_tensor r;
    memset(&r, 0, sizeof r);
    flashport_status st = map_dtype(t->dtype, &r.dtype);
    if (st != FLASHPORT_OK)
        return st;
    const size_t es = flashport_dtype_size(r.dtype);
    if (t->byte_offset % es != 0)
        return fp_set_error(FLASHPORT_ERR_BAD_STRIDE,
                            "dlpack: byte_offset %llu is not a whole number of %zu-byte elements",
                            (unsigned long long)t->byte_offset, es);
    r.rank = t->ndim;
    int64_t compact = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] < 0)
            return fp_set_error(FLASHPORT_ERR_BAD_SIZE, "dlpack: dimension %d has size %lld", d,
                                (long long)t->shape[d]);
        r.shape[d] = t->shape[d];
        r.stride[d] = t->strides ? t->strides[d] : compact;
        if (r.stride[d] < 0)
            return fp_set_error(FLASHPORT_ERR_BAD_STRIDE,
                                "dlpack: dimension %d has negative stride %lld", d,
                                (long long)r.stride[d]);
        if (t->shape[d] > 0 && __builtin_mul_overflow(compact, t->shape[d], &compact))
            return fp_set_error(FLASHPORT_ERR_BAD_SIZE, "dlpack: element count overflows");
    }
    r.data = t->data ? (char *)t->data + t->byte_offset : NULL;
    *out = r;
    return FLASHPORT_OK;
}

flashport_status flashport_tensor_from_dlpack_for(flashport_backend *be, const DLTensor *t,
                                                  flashport_tensor *out)
{
    fp_clear_error();
    if (!be)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "dlpack: backend is NULL");
    if (!t || !out)
        return fp_set_error(FLASHPORT_ERR_NULL_POINTER, "dlpack: %s is NULL", t ? "out" : "tensor");
    const DLDeviceType dev = t->device.device_type;
    const char *name = be->ops->name;
    int ok;
    if (be->caps.is_host)
        ok = host_readable(dev);
    else if (strcmp(name, "cuda") == 0)
        ok = (dev == kDLCUDA || dev == kDLCUDAManaged) && t->device.device_id == be->device;
    else if (strcmp(name, "hip") == 0)
        ok = dev == kDLROCM && t->device.device_id == be->device;
    else
        ok = 0;
    if (!ok)
        return fp_set_error(FLASHPORT_ERR_UNSUPPORTED_LAYOUT,
                            "dlpack: a tensor on device (type %d, id %d) is not in the memory of "
                            "backend '%s' device %d",
                            (int)dev, (int)t->device.device_id, name, be->device);
    return flashport_tensor_from_dlpack(t, out);
}
