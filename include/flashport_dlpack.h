/*
 * flashport DLPack import: a flashport_tensor that views the memory of a DLTensor (dlpack.h, the
 * standard header; Debian: libdlpack-dev). Installed only when the library was built with
 * DLPack support; the library itself never takes ownership of the DLTensor's memory.
 */
#ifndef FLASHPORT_DLPACK_H
#define FLASHPORT_DLPACK_H

#include "flashport.h"

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *out with a view of `tensor`: data + byte_offset, its dtype, rank, shape and strides
 * (compact row-major when strides is NULL). Rejected, with *out untouched:
 *   NULL pointers                                   FLASHPORT_ERR_NULL_POINTER
 *   ndim outside 1..FLASHPORT_MAX_RANK              FLASHPORT_ERR_INVALID_VALUE
 *   a negative size                                 FLASHPORT_ERR_BAD_SIZE
 *   a negative stride, byte_offset not a whole
 *   number of elements                              FLASHPORT_ERR_BAD_STRIDE
 *   a dtype other than float32, float16, bfloat16
 *   (and the fp8 e4m3fn / e5m2 codes of DLPack >= 1.0),
 *   or lanes != 1                                   FLASHPORT_ERR_UNSUPPORTED_DTYPE
 *   a device no flashport backend reads (OpenCL,
 *   Vulkan, Metal, ...)                              FLASHPORT_ERR_UNSUPPORTED_LAYOUT */
FLASHPORT_API flashport_status flashport_tensor_from_dlpack(const DLTensor *tensor,
                                                            flashport_tensor *out);

/* The same, and the tensor's device must be one that `backend` computes on: host memory (kDLCPU,
 * pinned or managed) for "cpu" / "reference"; kDLCUDA or kDLCUDAManaged with the handle's device
 * index for "cuda"; kDLROCM with its device index for "hip". Otherwise
 * FLASHPORT_ERR_UNSUPPORTED_LAYOUT, naming both devices. */
FLASHPORT_API flashport_status flashport_tensor_from_dlpack_for(flashport_backend *backend,
                                                                const DLTensor *tensor,
                                                                flashport_tensor *out);

#ifdef __cplusplus
}
#endif

#endif /* FLASHPORT_DLPACK_H */
