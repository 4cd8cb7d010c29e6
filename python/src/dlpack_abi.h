/*
 * The DLPack data structures the extension reads, as the DLPack specification lays them out
 * (ABI 0.x "dltensor" and 1.x "dltensor_versioned" capsules, and the 1.x C exchange API that a
 * framework publishes on its tensor type). Only what a consumer needs: the extension never
 * produces DLPack itself (outputs are allocated by the caller's framework).
 */
#ifndef FLASHPORT_PY_DLPACK_ABI_H
#define FLASHPORT_PY_DLPACK_ABI_H

#include <stdint.h>

/* Device types (DLDeviceType). */
enum {
    FP_DL_CPU = 1,
    FP_DL_CUDA = 2,
    FP_DL_CUDA_HOST = 3,
    FP_DL_ROCM = 10,
    FP_DL_ROCM_HOST = 11,
    FP_DL_CUDA_MANAGED = 13,
};

/* Type codes (DLDataTypeCode). */
enum {
    FP_DL_INT = 0,
    FP_DL_UINT = 1,
    FP_DL_FLOAT = 2,
    FP_DL_BFLOAT = 4,
    FP_DL_FLOAT8_E4M3FN = 10, /* DLPack >= 1.1 */
    FP_DL_FLOAT8_E5M2 = 12,
};

/* DLPack 1.x flags of DLManagedTensorVersioned. */
#define FP_DL_FLAG_READ_ONLY ((uint64_t)1 << 0)

typedef struct fp_dl_device {
    int32_t device_type; /* an enum in the specification: int-sized */
    int32_t device_id;
} fp_dl_device;

typedef struct fp_dl_dtype {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} fp_dl_dtype;

typedef struct fp_dl_tensor {
    void *data;
    fp_dl_device device;
    int32_t ndim;
    fp_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} fp_dl_tensor;

/* Capsule "dltensor". */
typedef struct fp_dl_managed {
    fp_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct fp_dl_managed *self);
} fp_dl_managed;

/* Capsule "dltensor_versioned". */
typedef struct fp_dl_managed_versioned {
    struct {
        uint32_t major;
        uint32_t minor;
    } version;
    void *manager_ctx;
    void (*deleter)(struct fp_dl_managed_versioned *self);
    uint64_t flags;
    fp_dl_tensor dl_tensor;
} fp_dl_managed_versioned;

/* The C exchange API (DLPack >= 1.2): a framework's function table, published as the capsule
 * "dlpack_exchange_api" in its tensor type's attribute __dlpack_c_exchange_api__. It describes a
 * tensor in a caller's DLTensor without a capsule or any allocation, allocates new tensors of the
 * framework and names its current stream: a call through it costs no Python-level work. A
 * consumer reads it only when the major version is 1. */
typedef struct fp_dl_exchange_header {
    struct {
        uint32_t major;
        uint32_t minor;
    } version;
    struct fp_dl_exchange_header *prev_api;
} fp_dl_exchange_header;

typedef struct fp_dl_exchange_api {
    fp_dl_exchange_header header;
    /* A new tensor of prototype's dtype, ndim, shape and device; 0, or -1 after set_error. */
    int (*managed_tensor_allocator)(fp_dl_tensor *prototype, fp_dl_managed_versioned **out,
                                    void *error_ctx,
                                    void (*set_error)(void *error_ctx, const char *kind,
                                                      const char *message));
    int (*managed_tensor_from_py_object_no_sync)(void *py_object, fp_dl_managed_versioned **out);
    /* The framework's Python tensor owning `tensor` (stolen); 0, or -1 with a Python error. */
    int (*managed_tensor_to_py_object_no_sync)(fp_dl_managed_versioned *tensor, void **out);
    /* Describes py_object in *out (valid while py_object is unchanged); may be NULL. 0, or -1
     * with a Python error set. */
    int (*dltensor_from_py_object_no_sync)(void *py_object, fp_dl_tensor *out);
    /* The framework's current stream on a device (NULL for host memory). */
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} fp_dl_exchange_api;

#endif /* FLASHPORT_PY_DLPACK_ABI_H */
