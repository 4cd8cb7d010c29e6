/*
 * flashport._C: the extension module behind the Python package (python/flashport).
 *
 * It takes every tensor as DLPack (a "dltensor" / "dltensor_versioned" capsule, or any object
 * with __dlpack__), checks that they all live on one device, opens the backend that computes
 * there (once per backend and device, kept for the life of the process), passes the caller's
 * stream and calls the C API. Outputs are allocated with the caller's own framework (NumPy,
 * torch, CuPy, ...), so results are returned in the input's own type and GPU memory comes from
 * the framework's allocator.
 *
 * Frameworks that publish DLPack's C exchange API on their tensor type (torch 2.15 does), and
 * whose frontend in the package says so (use_exchange_api), are met through it alone: tensors
 * are described into a DLTensor on the stack (no capsule, no Python call), outputs the caller
 * leaves to us are allocated by the framework from here (all of a call's in one allocation), and
 * the stream is the framework's current one. That keeps a call from torch within a few
 * microseconds of the C call. Other frameworks' outputs are allocated on the Python side and
 * come in as DLPack like the inputs; with a stream given (CuPy), each tensor's __dlpack__ is
 * asked for that stream.
 *
 * A capsule is read, never consumed: it stays named "dltensor", so the producer's own destructor
 * releases it when the call drops its reference.
 *
 * Every failure raises the Error type that the package registers (flashport.Error) with
 * (status code, status name, message): the library's own status and message where the library
 * refused, the closest status for what is caught here (a tensor in memory no backend computes
 * on, a dtype without a flashport counterpart, a rank above 4).
 *
 * Host backends run with the GIL released. GPU backends keep it: a call only enqueues work, and
 * holding it makes set_stream + launch on a shared handle atomic across Python threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dlpack_abi.h"
#include <flashport.h>

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static PyObject *error_type; /* flashport.Error, set by _set_error_type */

static PyObject *raise_status(flashport_status st, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    PyObject *type = error_type ? error_type : PyExc_RuntimeError;
    PyObject *args = Py_BuildValue("(iss)", (int)st, flashport_status_string(st), msg);
    if (args) {
        PyErr_SetObject(type, args);
        Py_DECREF(args);
    }
    return NULL;
}

static PyObject *raise_library(flashport_status st)
{
    return raise_status(st, "%s", flashport_last_error());
}

/* ---------------------------------------------------------------------------------------------
 * DLPack import
 * ------------------------------------------------------------------------------------------- */

typedef struct imported {
    PyObject *capsule; /* owned; keeps the producer's memory alive for the call */
    const fp_dl_tensor *dl;
    int readonly;
    fp_dl_tensor local; /* dl points here when the tensor came through the exchange API, or
                         * is an output given by its address */
    int64_t shape[FLASHPORT_MAX_RANK]; /* local's shape, for an output given by its address */
} imported;

static PyObject *str_dlpack;     /* "__dlpack__" */
static PyObject *kw_max_version; /* ("max_version",) */
static PyObject *kw_stream;      /* ("stream",) */
static PyObject *kw_stream_max;  /* ("stream", "max_version") */
static PyObject *dlpack_version; /* (1, 0) */

/* Replaces the pending Python exception (a framework's own refusal) by a flashport.Error of
 * status st whose message is `what`, then the exception's text. */
static void raise_from_python(flashport_status st, const char *what)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
    PyErr_Clear();
    /* The first line: torch appends its C++ backtrace on the lines after. */
    raise_status(st, "%s: %.*s", what, msg ? (int)strcspn(msg, "\n") : 1, msg ? msg : "?");
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* The tensor types met through DLPack's C exchange API, and their tables. A type is added by the
 * package's frontend for its framework (use_exchange_api), not found by itself: the exchange API
 * carries no read-only flag, so it is used only for frameworks known to have no read-only
 * tensors (torch). The list holds a reference to each type. */
#define MAX_TYPES 8

static struct {
    PyTypeObject *type;
    const fp_dl_exchange_api *api;
} api_types[MAX_TYPES];
static int num_api_types;

/* The table of `type` or of the registered type it derives from (torch.nn.Parameter and other
 * torch.Tensor subclasses are torch tensors to the exchange API too). */
static const fp_dl_exchange_api *exchange_api(PyTypeObject *type)
{
    for (int i = 0; i < num_api_types; i++)
        if (api_types[i].type == type)
            return api_types[i].api;
    for (int i = 0; i < num_api_types; i++)
        if (PyType_IsSubtype(type, api_types[i].type))
            return api_types[i].api;
    return NULL;
}

/* Exports obj (or takes its capsule). stream: NULL, or the DLPack stream value that obj's
 * __dlpack__ is asked for (the caller's stream, which the producer orders its work before).
 * Returns 0, or -1 with an exception set. */
static int import_tensor(const char *what, PyObject *obj, imported *out, PyObject *stream)
{
    out->capsule = NULL;
    out->dl = NULL;
    out->readonly = 0;
    const fp_dl_exchange_api *api = exchange_api(Py_TYPE(obj));
    if (api) {
        if (api->dltensor_from_py_object_no_sync(obj, &out->local) != 0) {
            char ctx[160];
            snprintf(ctx, sizeof ctx, "%s: %.100s refused to export DLPack", what,
                     Py_TYPE(obj)->tp_name);
            raise_from_python(FLASHPORT_ERR_INVALID_VALUE, ctx);
            return -1;
        }
        out->dl = &out->local;
        return 0;
    }
    PyObject *cap;
    if (PyCapsule_CheckExact(obj)) {
        Py_INCREF(obj);
        cap = obj;
    } else {
        /* DLPack 1.x first (it can carry read-only arrays); producers that predate the keyword
         * answer TypeError and are asked again the 0.x way. */
        PyObject *args[3] = {obj, stream, dlpack_version};
        if (stream) {
            cap = PyObject_VectorcallMethod(str_dlpack, args, 1, kw_stream_max);
            if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                cap = PyObject_VectorcallMethod(str_dlpack, args, 1, kw_stream);
            }
        } else {
            args[1] = dlpack_version;
            cap = PyObject_VectorcallMethod(str_dlpack, args, 1, kw_max_version);
            if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                cap = PyObject_VectorcallMethod(str_dlpack, args, 1, NULL);
            }
        }
        if (!cap) {
            if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
                raise_status(FLASHPORT_ERR_INVALID_VALUE,
                             "%s: a %.100s is not a DLPack tensor (it has no __dlpack__)", what,
                             Py_TYPE(obj)->tp_name);
                return -1;
            }
            /* The producer's own refusal (e.g. torch's "requires grad"), with our context. */
            char ctx[160];
            snprintf(ctx, sizeof ctx, "%s: %.100s refused to export DLPack", what,
                     Py_TYPE(obj)->tp_name);
            raise_from_python(FLASHPORT_ERR_INVALID_VALUE, ctx);
            return -1;
        }
        if (!PyCapsule_CheckExact(cap)) {
            Py_DECREF(cap);
            raise_status(FLASHPORT_ERR_INVALID_VALUE,
                         "%s: __dlpack__ of %.100s returned no capsule", what,
                         Py_TYPE(obj)->tp_name);
            return -1;
        }
    }
    const char *name = PyCapsule_GetName(cap);
    if (name && strcmp(name, "dltensor") == 0) {
        fp_dl_managed *m = PyCapsule_GetPointer(cap, name);
        out->dl = m ? &m->dl_tensor : NULL;
    } else if (name && strcmp(name, "dltensor_versioned") == 0) {
        fp_dl_managed_versioned *m = PyCapsule_GetPointer(cap, name);
        if (m && m->version.major != 1) {
            Py_DECREF(cap);
            raise_status(FLASHPORT_ERR_INVALID_VALUE, "%s: DLPack major version %u, expected 1",
                         what, (unsigned)m->version.major);
            return -1;
        }
        out->dl = m ? &m->dl_tensor : NULL;
        out->readonly = m && (m->flags & FP_DL_FLAG_READ_ONLY) != 0;
    }
    if (!out->dl) {
        Py_DECREF(cap);
        PyErr_Clear();
        raise_status(FLASHPORT_ERR_INVALID_VALUE,
                     "%s: not an unconsumed DLPack capsule (name '%s')", what, name ? name : "");
        return -1;
    }
    out->capsule = cap;
    return 0;
}

static void release(imported *t)
{
    Py_CLEAR(t->capsule);
    t->dl = NULL;
}

static void allocation_error(void *what, const char *kind, const char *message)
{
    if (!message)
        message = "?";
    raise_status(FLASHPORT_ERR_OUT_OF_MEMORY, "%s: allocating it failed: %s: %.*s",
                 (const char *)what, kind ? kind : "?", (int)strcspn(message, "\n"), message);
}

/* A new tensor of api's framework, dense, of the given shape, dtype and device, imported into
 * *t: a new reference, or NULL with an exception set. */
static PyObject *allocate(const char *what, const fp_dl_exchange_api *api, const fp_dl_device *dev,
                          int32_t ndim, const int64_t *shape, fp_dl_dtype dtype, imported *t)
{
    int64_t dims[FLASHPORT_MAX_RANK];
    memcpy(dims, shape, (size_t)ndim * sizeof *dims);
    fp_dl_tensor proto;
    memset(&proto, 0, sizeof proto);
    proto.device = *dev;
    proto.ndim = ndim;
    proto.dtype = dtype;
    proto.shape = dims;
    fp_dl_managed_versioned *m = NULL;
    if (api->managed_tensor_allocator(&proto, &m, (void *)what, allocation_error) != 0)
        return NULL;
    /* The framework owns m once it has a tensor of it, and keeps m's shape and strides as long
     * as that tensor lives (through this call): the tensor is described from m, not read back. */
    t->capsule = NULL;
    t->readonly = 0;
    t->local = m->dl_tensor;
    void *obj = NULL;
    if (api->managed_tensor_to_py_object_no_sync(m, &obj) != 0) {
        raise_from_python(FLASHPORT_ERR_OUT_OF_MEMORY, what);
        return NULL;
    }
    t->dl = &t->local;
    return (PyObject *)obj;
}

static int dl_dtype(const fp_dl_dtype *t, flashport_dtype *out)
{
    if (t->lanes != 1)
        return -1;
    if (t->code == FP_DL_FLOAT && t->bits == 32)
        *out = FLASHPORT_F32;
    else if (t->code == FP_DL_FLOAT && t->bits == 16)
        *out = FLASHPORT_F16;
    else if (t->code == FP_DL_BFLOAT && t->bits == 16)
        *out = FLASHPORT_BF16;
    else if (t->code == FP_DL_FLOAT8_E4M3FN && t->bits == 8)
        *out = FLASHPORT_FP8_E4M3;
    else if (t->code == FP_DL_FLOAT8_E5M2 && t->bits == 8)
        *out = FLASHPORT_FP8_E5M2;
    else
        return -1;
    return 0;
}

static const char *dl_code_name(uint8_t code)
{
    switch (code) {
    case FP_DL_INT:
        return "int";
    case FP_DL_UINT:
        return "uint";
    case FP_DL_FLOAT:
        return "float";
    case FP_DL_BFLOAT:
        return "bfloat";
    default:
        return "type code ";
    }
}

/* The descriptor of an imported attention tensor (rank <= 4, f32/f16/bf16/fp8). uint8_as: an fp8
 * dtype that a uint8 tensor's codes are taken as (frameworks without fp8 dtypes, and fp8 torch
 * tensors exported as uint8 views), or FLASHPORT_DTYPE_COUNT for none. */
static int to_descriptor(const char *what, const imported *t, int is_output,
                         flashport_dtype uint8_as, flashport_tensor *d)
{
    const fp_dl_tensor *dl = t->dl;
    memset(d, 0, sizeof *d);
    if (dl->ndim < 1 || dl->ndim > FLASHPORT_MAX_RANK) {
        raise_status(FLASHPORT_ERR_SHAPE_MISMATCH,
                     "%s has rank %d; attention tensors have rank 4 [B, N, heads, D], 3 when "
                     "varlen [tokens, heads, D] (lse: 3 [B, H, Nq], 2 when varlen)",
                     what, (int)dl->ndim);
        return -1;
    }
    if (uint8_as != FLASHPORT_DTYPE_COUNT && dl->dtype.code == FP_DL_UINT && dl->dtype.bits == 8 &&
        dl->dtype.lanes == 1) {
        d->dtype = uint8_as;
    } else if (dl_dtype(&dl->dtype, &d->dtype) != 0) {
        raise_status(FLASHPORT_ERR_UNSUPPORTED_DTYPE,
                     "%s has dtype %s%u (lanes %u); flashport takes float32, float16, bfloat16 "
                     "and (q, k, v of a forward) float8 e4m3fn / e5m2",
                     what, dl_code_name(dl->dtype.code), (unsigned)dl->dtype.bits,
                     (unsigned)dl->dtype.lanes);
        return -1;
    }
    if (is_output && t->readonly) {
        raise_status(FLASHPORT_ERR_INVALID_VALUE, "%s is read-only", what);
        return -1;
    }
    d->data = (char *)dl->data + dl->byte_offset;
    d->rank = dl->ndim;
    int64_t compact = 1;
    for (int i = dl->ndim - 1; i >= 0; i--) {
        d->shape[i] = dl->shape[i];
        d->stride[i] = dl->strides ? dl->strides[i] : compact;
        compact *= dl->shape[i];
    }
    return 0;
}

/* A 1-D contiguous side array (ALiBi slopes, cu_seqlens) of the given dtype; its length. */
static int side_array(const char *what, const imported *t, uint8_t code, const char *type_name,
                      const void **ptr, int64_t *len)
{
    const fp_dl_tensor *dl = t->dl;
    if (dl->dtype.code != code || dl->dtype.bits != 32 || dl->dtype.lanes != 1) {
        raise_status(FLASHPORT_ERR_DTYPE_MISMATCH, "%s must be %s, not %s%u", what, type_name,
                     dl_code_name(dl->dtype.code), (unsigned)dl->dtype.bits);
        return -1;
    }
    if (dl->ndim != 1) {
        raise_status(FLASHPORT_ERR_SHAPE_MISMATCH, "%s must be 1-D, not rank %d", what,
                     (int)dl->ndim);
        return -1;
    }
    if (dl->strides && dl->shape[0] > 1 && dl->strides[0] != 1) {
        raise_status(FLASHPORT_ERR_UNSUPPORTED_LAYOUT, "%s must be contiguous (stride %lld)", what,
                     (long long)dl->strides[0]);
        return -1;
    }
    *ptr = (const char *)dl->data + dl->byte_offset;
    *len = dl->shape[0];
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Backends: one handle per (name, device), opened on first use.
 * ------------------------------------------------------------------------------------------- */

#define MAX_HANDLES 32

static struct {
    char name[32];
    int device;
    flashport_backend *be;
} handles[MAX_HANDLES];
static int num_handles;

static const char *device_type_name(int32_t type)
{
    switch (type) {
    case FP_DL_CPU:
        return "cpu";
    case FP_DL_CUDA:
        return "cuda";
    case FP_DL_CUDA_HOST:
        return "cuda_host";
    case FP_DL_ROCM:
        return "rocm";
    case FP_DL_ROCM_HOST:
        return "rocm_host";
    case FP_DL_CUDA_MANAGED:
        return "cuda_managed";
    default:
        return "device type ";
    }
}

static int host_memory(int32_t type)
{
    return type == FP_DL_CPU || type == FP_DL_CUDA_HOST || type == FP_DL_ROCM_HOST;
}

/* The backend for tensors on dev: `name` if given (checked against where the data lives for the
 * backends whose memory is known), else the one that computes there. */
static flashport_backend *backend_for(PyObject *name_obj, const fp_dl_device *dev, int *is_host)
{
    const char *name;
    if (name_obj == Py_None) {
        if (host_memory(dev->device_type))
            name = "cpu";
        else if (dev->device_type == FP_DL_CUDA || dev->device_type == FP_DL_CUDA_MANAGED)
            name = "cuda";
        else if (dev->device_type == FP_DL_ROCM)
            name = "hip";
        else {
            raise_status(FLASHPORT_ERR_INVALID_VALUE,
                         "the tensors live in %s%d memory, where no flashport backend computes",
                         device_type_name(dev->device_type), (int)dev->device_type);
            return NULL;
        }
    } else {
        name = PyUnicode_AsUTF8(name_obj);
        if (!name)
            return NULL;
        int host = strcmp(name, "cpu") == 0 || strcmp(name, "reference") == 0;
        int cuda = strcmp(name, "cuda") == 0, hip = strcmp(name, "hip") == 0;
        int ok = host   ? host_memory(dev->device_type) || dev->device_type == FP_DL_CUDA_MANAGED
                 : cuda ? dev->device_type == FP_DL_CUDA || dev->device_type == FP_DL_CUDA_MANAGED
                 : hip  ? dev->device_type == FP_DL_ROCM
                        : 1;
        if (!ok) {
            raise_status(FLASHPORT_ERR_INVALID_VALUE,
                         "backend '%s' cannot compute on tensors in %s memory (device %d)", name,
                         device_type_name(dev->device_type), (int)dev->device_id);
            return NULL;
        }
    }
    *is_host = strcmp(name, "cpu") == 0 || strcmp(name, "reference") == 0;
    int device = *is_host ? 0 : dev->device_id;
    for (int i = 0; i < num_handles; i++)
        if (handles[i].device == device && strcmp(handles[i].name, name) == 0)
            return handles[i].be;
    if (strlen(name) >= sizeof handles[0].name || num_handles == MAX_HANDLES) {
        raise_status(FLASHPORT_ERR_INVALID_VALUE,
                     "backend name '%.64s' too long, or more than %d "
                     "backend handles",
                     name, MAX_HANDLES);
        return NULL;
    }
    flashport_backend *be = NULL;
    flashport_status st = flashport_backend_open_device(name, device, &be);
    if (st != FLASHPORT_OK) {
        raise_library(st);
        return NULL;
    }
    strcpy(handles[num_handles].name, name);
    handles[num_handles].device = device;
    handles[num_handles].be = be;
    num_handles++;
    return be;
}

/* ---------------------------------------------------------------------------------------------
 * forward / backward
 * ------------------------------------------------------------------------------------------- */

enum { MAX_TENSORS = 9 };

typedef struct call {
    imported t[MAX_TENSORS];
    flashport_tensor d[MAX_TENSORS];
    PyObject *obj[MAX_TENSORS]; /* owned: the outputs, given or allocated here */
    int n;
    imported alibi, cu_q, cu_k, used_k, table;
    flashport_attention_params params;
    flashport_backend *be;
    int is_host;
    PyObject *dl_stream; /* owned: the stream __dlpack__ is asked for, or NULL */
} call;

static void call_release(call *c)
{
    for (int i = 0; i < c->n; i++) {
        release(&c->t[i]);
        Py_CLEAR(c->obj[i]);
    }
    release(&c->alibi);
    release(&c->cu_q);
    release(&c->cu_k);
    release(&c->used_k);
    release(&c->table);
    Py_CLEAR(c->dl_stream);
}

static int same_device(const char *what, const fp_dl_device *a, const fp_dl_device *q)
{
    if (a->device_type == q->device_type && a->device_id == q->device_id)
        return 0;
    raise_status(FLASHPORT_ERR_INVALID_VALUE, "%s is on %s:%d but q on %s:%d", what,
                 device_type_name(a->device_type), (int)a->device_id,
                 device_type_name(q->device_type), (int)q->device_id);
    return -1;
}

static int as_int(PyObject *o, const char *what, int32_t *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        raise_status(FLASHPORT_ERR_INVALID_VALUE, "%s = %ld is out of the int32 range", what, v);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int as_float(PyObject *o, float *out)
{
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    *out = (float)v;
    return 0;
}

/* The layout of output i (o or lse of the forward, dq, dk or dv of the backward) when this call
 * allocates it: dense, shaped and typed as the input it mirrors (o: q, bf16 for fp8 q; dq, dk,
 * dv: q, k, v), lse f32 [B, H, Nq] (varlen [H, total_q]). 0 for an lse whose shape q's rank does
 * not give: it is left out, and the library refuses q with its own message. */
static int output_layout(const call *c, int i, int ntensors, int varlen, int32_t *ndim,
                         int64_t *shape, fp_dl_dtype *dtype)
{
    static const fp_dl_dtype f32 = {FP_DL_FLOAT, 32, 1}, bf16 = {FP_DL_BFLOAT, 16, 1};
    const fp_dl_tensor *q = c->t[0].dl;
    if (ntensors == 5 && i == 4) {
        if (varlen ? q->ndim != 3 : q->ndim != 4)
            return 0;
        *ndim = q->ndim - 1;
        shape[0] = varlen ? q->shape[1] : q->shape[0];
        shape[1] = varlen ? q->shape[0] : q->shape[2];
        shape[2] = q->shape[1];
        *dtype = f32;
        return 1;
    }
    const fp_dl_tensor *like = ntensors == 9 ? c->t[i - 6].dl : q;
    *dtype = like->dtype;
    if (c->d[0].dtype == FLASHPORT_FP8_E4M3 || c->d[0].dtype == FLASHPORT_FP8_E5M2)
        *dtype = bf16;
    *ndim = like->ndim;
    memcpy(shape, like->shape, (size_t)like->ndim * sizeof *shape);
    return 1;
}

/* Outputs allocated together. One buffer of q's framework holds every output a call allocates
 * (o and lse; dq, dk and dv), each at its own 256-byte aligned offset, and each is handed to the
 * framework as a tensor of its own: a DLPack tensor over its part of the buffer, with a deleter
 * that drops one reference to the buffer. One allocation (and one free) instead of two or three:
 * on a GPU, the framework's allocator is most of the host time a call spends on its outputs. The
 * buffer goes back to the framework when the last of its tensors dies, which may happen on any
 * thread and without the GIL (atomics and the framework's own deleter only). */
enum { MAX_OUTPUTS = 3, OUTPUT_ALIGN = 256 };

typedef struct shared_buffer {
    atomic_int refs;
    fp_dl_managed_versioned *base;
    struct {
        fp_dl_managed_versioned m;
        int64_t shape[FLASHPORT_MAX_RANK];
        int64_t strides[FLASHPORT_MAX_RANK];
    } view[MAX_OUTPUTS];
} shared_buffer;

static void shared_release(shared_buffer *b, int refs)
{
    if (atomic_fetch_sub_explicit(&b->refs, refs, memory_order_acq_rel) == refs) {
        if (b->base->deleter)
            b->base->deleter(b->base);
        free(b);
    }
}

static void view_deleter(fp_dl_managed_versioned *self)
{
    shared_release(self->manager_ctx, 1);
}

/* Allocates, through q's framework, every output that the call's tensor arguments args[first ..
 * ntensors) leave to it (True, or None unless `optional` marks it) and imports them into c. */
static int allocate_outputs(call *c, PyObject *const *tensors, int first, int ntensors,
                            const char *const *names, int varlen, unsigned optional)
{
    struct {
        int i;
        int32_t ndim;
        int64_t shape[FLASHPORT_MAX_RANK];
        fp_dl_dtype dtype;
        uint64_t offset;
    } out[MAX_OUTPUTS];
    int n = 0;
    uint64_t total = 0;
    int overflow = 0;
    for (int i = first; i < ntensors; i++) {
        PyObject *o = tensors[i];
        if (!(o == Py_True || (o == Py_None && !(optional >> i & 1u))) ||
            !output_layout(c, i, ntensors, varlen, &out[n].ndim, out[n].shape, &out[n].dtype))
            continue;
        uint64_t bytes = (out[n].dtype.bits * out[n].dtype.lanes + 7u) / 8u;
        for (int d = 0; d < out[n].ndim; d++)
            overflow |= __builtin_mul_overflow(bytes, (uint64_t)out[n].shape[d], &bytes);
        out[n].offset = (total + OUTPUT_ALIGN - 1) / OUTPUT_ALIGN * OUTPUT_ALIGN;
        overflow |= out[n].offset < total || __builtin_add_overflow(out[n].offset, bytes, &total);
        out[n++].i = i;
    }
    if (n == 0)
        return 0;
    const fp_dl_exchange_api *api = exchange_api(Py_TYPE(c->obj[0]));
    if (!api) {
        raise_status(FLASHPORT_ERR_INVALID_VALUE,
                     "%s: flashport cannot allocate a %.100s (its type has no DLPack exchange "
                     "API); pass out=",
                     names[out[0].i], Py_TYPE(c->obj[0])->tp_name);
        return -1;
    }
    const fp_dl_device *dev = &c->t[0].dl->device;
    if (n == 1) {
        int i = out[0].i;
        c->obj[i] = allocate(names[i], api, dev, out[0].ndim, out[0].shape, out[0].dtype, &c->t[i]);
        return c->obj[i] ? 0 : -1;
    }
    if (overflow || total > INT64_MAX) {
        raise_status(FLASHPORT_ERR_OUT_OF_MEMORY,
                     "%s: allocating it failed: its size in bytes overflows", names[out[0].i]);
        return -1;
    }
    shared_buffer *b = calloc(1, sizeof *b);
    if (!b) {
        raise_status(FLASHPORT_ERR_OUT_OF_MEMORY, "%s: allocating it failed", names[out[0].i]);
        return -1;
    }
    static const fp_dl_dtype u8 = {FP_DL_UINT, 8, 1};
    int64_t bytes = (int64_t)total;
    fp_dl_tensor proto;
    memset(&proto, 0, sizeof proto);
    proto.device = *dev;
    proto.ndim = 1;
    proto.dtype = u8;
    proto.shape = &bytes;
    if (api->managed_tensor_allocator(&proto, &b->base, (void *)names[out[0].i],
                                      allocation_error) != 0) {
        free(b);
        return -1;
    }
    atomic_init(&b->refs, n);
    char *data = (char *)b->base->dl_tensor.data + b->base->dl_tensor.byte_offset;
    for (int j = 0; j < n; j++) {
        fp_dl_managed_versioned *m = &b->view[j].m;
        m->version.major = b->base->version.major;
        m->version.minor = b->base->version.minor;
        m->manager_ctx = b;
        m->deleter = view_deleter;
        m->dl_tensor.data = out[j].offset ? data + out[j].offset : data;
        m->dl_tensor.device = *dev;
        m->dl_tensor.ndim = out[j].ndim;
        m->dl_tensor.dtype = out[j].dtype;
        m->dl_tensor.shape = b->view[j].shape;
        m->dl_tensor.strides = b->view[j].strides;
        int64_t stride = 1;
        for (int d = out[j].ndim - 1; d >= 0; d--) {
            b->view[j].shape[d] = out[j].shape[d];
            b->view[j].strides[d] = stride;
            stride *= out[j].shape[d];
        }
    }
    for (int j = 0; j < n; j++) {
        int i = out[j].i;
        void *obj = NULL;
        if (api->managed_tensor_to_py_object_no_sync(&b->view[j].m, &obj) != 0) {
            /* Whether the framework released the view it refused is not specified: its
             * reference is left (the buffer leaks rather than being freed twice); the views
             * not handed over yet are released here. */
            if (n - j - 1 > 0)
                shared_release(b, n - j - 1);
            raise_from_python(FLASHPORT_ERR_OUT_OF_MEMORY, names[i]);
            return -1;
        }
        /* Described from the view itself (which lives as long as the tensor), not read back
         * from the new tensor through the framework. */
        c->obj[i] = obj;
        c->t[i].local = b->view[j].m.dl_tensor;
        c->t[i].dl = &c->t[i].local;
    }
    return 0;
}

/* Output i given as an int: the address on q's device where the caller has room for it, dense in
 * the layout this call would allocate it with (output_layout). The package passes these for
 * frameworks without the exchange API (CuPy): it allocates a call's outputs as one buffer of
 * the framework and views into it, and hands their addresses here rather than exporting each
 * view through __dlpack__ again. */
static int output_at(call *c, int i, int ntensors, int varlen, PyObject *addr, const char *what)
{
    imported *t = &c->t[i];
    memset(&t->local, 0, sizeof t->local);
    t->local.data = PyLong_AsVoidPtr(addr);
    if (!t->local.data && PyErr_Occurred())
        return -1;
    if (!output_layout(c, i, ntensors, varlen, &t->local.ndim, t->shape, &t->local.dtype)) {
        raise_status(FLASHPORT_ERR_SHAPE_MISMATCH, "%s: q of rank %d gives it no shape", what,
                     (int)c->t[0].dl->ndim);
        return -1;
    }
    t->local.device = c->t[0].dl->device;
    t->local.shape = t->shape;
    t->dl = &t->local;
    return 0;
}

/* args[0] backend, args[1] stream, args[2 .. 2+ntensors) tensors, then alibi, cu_seqlens_q,
 * cu_seqlens_k, scale, window_left, window_right, causal, softcap, max_seqlen_q, max_seqlen_k,
 * deterministic, seqused_k, block_table, and optionally (all four or none) descale_q,
 * descale_k, descale_v and fp8: 0, or the flashport dtype (3 e4m3, 4 e5m2) that uint8 q, k, v
 * hold. An output given as True is allocated here through q's framework, and so is one given as
 * None unless `optional` marks it (then it is left out); one given as an int is the address of
 * the caller's room for it (output_at). The stream: args[1], or where that is
 * None, the current stream of q's framework (through its exchange API), else the default. */
static int prepare(call *c, PyObject *const *args, Py_ssize_t nargs, int ntensors,
                   const char *const *names, unsigned optional)
{
    const int nparams = 13, nfp8 = 4;
    memset(c, 0, sizeof *c);
    if (nargs != 2 + ntensors + nparams && nargs != 2 + ntensors + nparams + nfp8) {
        PyErr_Format(PyExc_TypeError, "expected %d or %d arguments, got %zd",
                     2 + ntensors + nparams, 2 + ntensors + nparams + nfp8, nargs);
        return -1;
    }
    const int has_fp8 = nargs == 2 + ntensors + nparams + nfp8;
    PyObject *const *p8 = args + 2 + ntensors + nparams;
    flashport_dtype uint8_as = FLASHPORT_DTYPE_COUNT;
    float descale[3] = {0.0f, 0.0f, 0.0f};
    if (has_fp8) {
        int32_t code = 0;
        if (as_float(p8[0], &descale[0]) != 0 || as_float(p8[1], &descale[1]) != 0 ||
            as_float(p8[2], &descale[2]) != 0 || as_int(p8[3], "fp8", &code) != 0)
            return -1;
        if (code != 0 && code != FLASHPORT_FP8_E4M3 && code != FLASHPORT_FP8_E5M2) {
            raise_status(FLASHPORT_ERR_INVALID_VALUE,
                         "fp8 = %d: expected 0, %d (e4m3) or %d (e5m2)", (int)code,
                         (int)FLASHPORT_FP8_E4M3, (int)FLASHPORT_FP8_E5M2);
            return -1;
        }
        if (code != 0)
            uint8_as = (flashport_dtype)code;
    }
    /* A stream given with tensors that are not capsules (CuPy's frontend): each tensor's
     * __dlpack__ is asked for it, so the producer orders its pending work before that stream.
     * DLPack reserves 0 (ambiguous) and names the legacy default stream, whose handle is 0, 1. */
    if (args[1] != Py_None) {
        void *s = PyLong_AsVoidPtr(args[1]);
        if (!s && PyErr_Occurred())
            return -1;
        c->dl_stream = s ? args[1] : PyLong_FromLong(1);
        if (s)
            Py_INCREF(args[1]);
        if (!c->dl_stream)
            return -1;
    }
    const int varlen = args[2 + ntensors + 1] != Py_None;
    /* Outputs follow the inputs: the backward's dq, dk, dv, the forward's o and lse. */
    const int first_output = ntensors == 5 ? 3 : 6;
    c->n = ntensors; /* what call_release looks at: all zero until set */
    for (int i = 0; i < ntensors; i++) {
        PyObject *o = args[2 + i];
        int is_output = i >= first_output;
        if (i == 0) {
            Py_INCREF(o); /* q: kept for allocate_outputs, which asks for q's framework */
            c->obj[0] = o;
        }
        if (i == first_output &&
            allocate_outputs(c, args + 2, first_output, ntensors, names, varlen, optional) != 0)
            return -1;
        if (is_output && (o == Py_True || (o == Py_None && !(optional >> i & 1u)))) {
            if (!c->t[i].dl)
                continue;
        } else if (is_output && PyLong_CheckExact(o)) {
            Py_INCREF(o);
            c->obj[i] = o;
            if (output_at(c, i, ntensors, varlen, o, names[i]) != 0)
                return -1;
        } else {
            if (o == Py_None && (optional >> i & 1u))
                continue;
            if (is_output) {
                Py_INCREF(o);
                c->obj[i] = o;
            }
            if (import_tensor(names[i], o, &c->t[i], c->dl_stream) != 0)
                return -1;
            if (i > 0 && same_device(names[i], &c->t[i].dl->device, &c->t[0].dl->device) != 0)
                return -1;
        }
        if (to_descriptor(names[i], &c->t[i], is_output, i < 3 ? uint8_as : FLASHPORT_DTYPE_COUNT,
                          &c->d[i]) != 0)
            return -1;
    }
    const fp_dl_device *dev = &c->t[0].dl->device;
    PyObject *const *p = args + 2 + ntensors;
    flashport_attention_params_init(&c->params);
    flashport_attention_params *pr = &c->params;
    struct {
        const char *name;
        PyObject *obj;
        imported *t;
    } side[5] = {{"alibi_slopes", p[0], &c->alibi},
                 {"cu_seqlens_q", p[1], &c->cu_q},
                 {"cu_seqlens_k", p[2], &c->cu_k},
                 {"seqused_k", p[11], &c->used_k},
                 {"block_table", p[12], &c->table}};
    for (int i = 0; i < 5; i++) {
        if (side[i].obj == Py_None)
            continue;
        if (import_tensor(side[i].name, side[i].obj, side[i].t, c->dl_stream) != 0 ||
            same_device(side[i].name, &side[i].t->dl->device, dev) != 0)
            return -1;
    }
    int64_t len = 0;
    if (c->alibi.dl) {
        if (side_array("alibi_slopes", &c->alibi, FP_DL_FLOAT, "float32",
                       (const void **)&pr->alibi_slopes, &len) != 0)
            return -1;
        int64_t heads = c->d[0].rank >= 2 ? c->d[0].shape[c->d[0].rank - 2] : 0;
        if (len != heads) {
            raise_status(FLASHPORT_ERR_SHAPE_MISMATCH,
                         "alibi_slopes has %lld entries; q has %lld heads", (long long)len,
                         (long long)heads);
            return -1;
        }
    }
    if (c->cu_q.dl) {
        if (side_array("cu_seqlens_q", &c->cu_q, FP_DL_INT, "int32",
                       (const void **)&pr->cu_seqlens_q, &len) != 0)
            return -1;
        if (len < 1 || len - 1 > INT32_MAX) {
            raise_status(FLASHPORT_ERR_BAD_SEQLENS, "cu_seqlens_q has %lld entries (B + 1 >= 1)",
                         (long long)len);
            return -1;
        }
        pr->batch = (int32_t)(len - 1);
    }
    if (c->cu_k.dl) {
        int64_t len_k;
        if (side_array("cu_seqlens_k", &c->cu_k, FP_DL_INT, "int32",
                       (const void **)&pr->cu_seqlens_k, &len_k) != 0)
            return -1;
        if (c->cu_q.dl && len_k != len) {
            raise_status(FLASHPORT_ERR_BAD_SEQLENS,
                         "cu_seqlens_k has %lld entries, cu_seqlens_q %lld", (long long)len_k,
                         (long long)len);
            return -1;
        }
    }
    /* The library reads seqused_k[0 .. B) and block_table rows 0 .. B - 1: check the sizes here,
     * where they are known. */
    const int64_t batch = c->cu_q.dl ? len - 1 : (c->d[0].rank == 4 ? c->d[0].shape[0] : 0);
    if (c->used_k.dl) {
        int64_t n_used;
        if (side_array("seqused_k", &c->used_k, FP_DL_INT, "int32", (const void **)&pr->seqused_k,
                       &n_used) != 0)
            return -1;
        if (n_used != batch) {
            raise_status(FLASHPORT_ERR_SHAPE_MISMATCH, "seqused_k has %lld entries; B is %lld",
                         (long long)n_used, (long long)batch);
            return -1;
        }
    }
    if (c->table.dl) {
        const fp_dl_tensor *dl = c->table.dl;
        if (dl->dtype.code != FP_DL_INT || dl->dtype.bits != 32 || dl->dtype.lanes != 1) {
            raise_status(FLASHPORT_ERR_DTYPE_MISMATCH, "block_table must be int32");
            return -1;
        }
        if (dl->ndim != 2 || dl->shape[0] != batch || dl->shape[1] < 1 ||
            dl->shape[1] > INT32_MAX) {
            raise_status(FLASHPORT_ERR_SHAPE_MISMATCH,
                         "block_table must be [B = %lld, pages per sequence >= 1]",
                         (long long)batch);
            return -1;
        }
        if (dl->strides && ((dl->shape[1] > 1 && dl->strides[1] != 1) ||
                            (dl->shape[0] > 1 && dl->strides[0] != dl->shape[1]))) {
            raise_status(FLASHPORT_ERR_UNSUPPORTED_LAYOUT, "block_table must be contiguous");
            return -1;
        }
        pr->block_table = (const int32_t *)((const char *)dl->data + dl->byte_offset);
        pr->block_table_stride = (int32_t)dl->shape[1];
    }
    int32_t causal = 0, deterministic = 0;
    if (as_float(p[3], &pr->scale) != 0 || as_int(p[4], "window_left", &pr->window_left) != 0 ||
        as_int(p[5], "window_right", &pr->window_right) != 0 ||
        (causal = PyObject_IsTrue(p[6])) < 0 || as_float(p[7], &pr->softcap) != 0 ||
        as_int(p[8], "max_seqlen_q", &pr->max_seqlen_q) != 0 ||
        as_int(p[9], "max_seqlen_k", &pr->max_seqlen_k) != 0 ||
        (deterministic = PyObject_IsTrue(p[10])) < 0)
        return -1;
    pr->causal = causal;
    pr->deterministic = deterministic;
    pr->descale_q = descale[0];
    pr->descale_k = descale[1];
    pr->descale_v = descale[2];

    c->be = backend_for(args[0], dev, &c->is_host);
    if (!c->be)
        return -1;
    if (!c->is_host) {
        void *stream = NULL;
        const fp_dl_exchange_api *api = exchange_api(Py_TYPE(c->obj[0]));
        if (args[1] != Py_None) {
            stream = PyLong_AsVoidPtr(args[1]);
            if (!stream && PyErr_Occurred())
                return -1;
        } else if (api &&
                   api->current_work_stream(dev->device_type, dev->device_id, &stream) != 0) {
            raise_from_python(FLASHPORT_ERR_DEVICE, "the framework's current stream");
            return -1;
        }
        flashport_status st = flashport_set_stream(c->be, stream);
        if (st != FLASHPORT_OK) {
            raise_library(st);
            return -1;
        }
    }
    return 0;
}

static const flashport_tensor *opt(const call *c, int i)
{
    return c->t[i].dl ? &c->d[i] : NULL;
}

/* forward(backend, stream, q, k, v, o, lse, alibi, cu_q, cu_k, scale, wl, wr, causal, softcap,
 *         max_q, max_k, deterministic, seqused_k, block_table[, descale_q, descale_k, descale_v,
 *         fp8]) -> (o, lse). o None or True: allocated here; lse None: not computed (None
 *         returned), True: allocated here; an int: written there (output_at), and returned. */
static PyObject *py_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const names[] = {"q", "k", "v", "o", "lse"};
    call c;
    flashport_status st = FLASHPORT_OK;
    if (prepare(&c, args, nargs, 5, names, 1u << 4) != 0) {
        call_release(&c);
        return NULL;
    }
    if (c.is_host) {
        Py_BEGIN_ALLOW_THREADS;
        st = flashport_attention_forward(c.be, &c.params, &c.d[0], &c.d[1], &c.d[2], &c.d[3],
                                         opt(&c, 4));
        Py_END_ALLOW_THREADS;
    } else {
        st = flashport_attention_forward(c.be, &c.params, &c.d[0], &c.d[1], &c.d[2], &c.d[3],
                                         opt(&c, 4));
    }
    PyObject *res = st == FLASHPORT_OK ? PyTuple_Pack(2, c.obj[3], c.obj[4] ? c.obj[4] : Py_None)
                                       : raise_library(st);
    call_release(&c);
    return res;
}

/* backward(backend, stream, q, k, v, o, lse, dout, dq, dk, dv, alibi, cu_q, cu_k, scale, wl, wr,
 *          causal, softcap, max_q, max_k, deterministic, seqused_k, block_table[, descale_q,
 *          descale_k, descale_v, fp8]) -> (dq, dk, dv); each None or True: allocated here, an
 *          int: written there (output_at), and returned. */
static PyObject *py_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const names[] = {"q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv"};
    call c;
    flashport_status st = FLASHPORT_OK;
    if (prepare(&c, args, nargs, 9, names, 0u) != 0) {
        call_release(&c);
        return NULL;
    }
    const flashport_tensor *d = c.d;
    if (c.is_host) {
        Py_BEGIN_ALLOW_THREADS;
        st = flashport_attention_backward(c.be, &c.params, &d[0], &d[1], &d[2], &d[3], &d[4], &d[5],
                                          &d[6], &d[7], &d[8]);
        Py_END_ALLOW_THREADS;
    } else {
        st = flashport_attention_backward(c.be, &c.params, &d[0], &d[1], &d[2], &d[3], &d[4], &d[5],
                                          &d[6], &d[7], &d[8]);
    }
    PyObject *res =
        st == FLASHPORT_OK ? PyTuple_Pack(3, c.obj[6], c.obj[7], c.obj[8]) : raise_library(st);
    call_release(&c);
    return res;
}

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

static PyObject *py_set_error_type(PyObject *self, PyObject *type)
{
    if (!PyType_Check(type) ||
        !PyType_IsSubtype((PyTypeObject *)type, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "expected an Exception subclass");
        return NULL;
    }
    Py_INCREF(type);
    Py_XSETREF(error_type, type);
    Py_RETURN_NONE;
}

static PyObject *py_version(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(flashport_version());
}

static PyObject *py_available_backends(PyObject *self, PyObject *unused)
{
    char buf[512];
    flashport_status st = flashport_available_backends(buf, sizeof buf, NULL);
    if (st != FLASHPORT_OK)
        return raise_library(st);
    return PyUnicode_FromString(buf);
}

/* The file libflashport was loaded from (its folder is where plugins are found). */
static PyObject *py_library_path(PyObject *self, PyObject *unused)
{
    Dl_info info;
    if (dladdr((void *)&flashport_version, &info) && info.dli_fname)
        return PyUnicode_FromString(info.dli_fname);
    Py_RETURN_NONE;
}

/* The status names by code, 0 up to the last the library knows. */
static PyObject *py_status_names(PyObject *self, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    for (int st = 0; list; st++) {
        const char *name = flashport_status_string((flashport_status)st);
        if (strcmp(name, "FLASHPORT_ERR_UNKNOWN_STATUS") == 0)
            break;
        PyObject *s = PyUnicode_FromString(name);
        if (!s || PyList_Append(list, s) != 0)
            Py_CLEAR(list);
        Py_XDECREF(s);
    }
    return list;
}

/* Opens (or finds) the handle of a backend by name and device: its name, or Error. */
static PyObject *py_open_backend(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "open_backend(name, device)");
        return NULL;
    }
    int32_t device;
    if (as_int(args[1], "device", &device) != 0)
        return NULL;
    const char *name = PyUnicode_AsUTF8(args[0]);
    if (!name)
        return NULL;
    int is_host = strcmp(name, "cpu") == 0 || strcmp(name, "reference") == 0;
    fp_dl_device dev = {is_host                    ? FP_DL_CPU
                        : strcmp(name, "hip") == 0 ? FP_DL_ROCM
                                                   : FP_DL_CUDA,
                        device};
    flashport_backend *be = backend_for(args[0], &dev, &is_host);
    if (!be)
        return NULL;
    return PyUnicode_FromString(flashport_backend_name(be));
}

/* use_exchange_api(type) -> bool: from now on, meets tensors of this type (and its subclasses)
 * through the C exchange API that the type publishes (__dlpack_c_exchange_api__): reads them
 * without __dlpack__, allocates the outputs left to forward / backward, takes the framework's
 * current stream. False (and nothing changes) where the type publishes no table of major version 1
 * with all of that. */
static PyObject *py_use_exchange_api(PyObject *self, PyObject *type)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "use_exchange_api(type)");
        return NULL;
    }
    if (exchange_api((PyTypeObject *)type))
        Py_RETURN_TRUE;
    PyObject *cap = PyObject_GetAttrString(type, "__dlpack_c_exchange_api__");
    const fp_dl_exchange_api *api = NULL;
    if (cap && PyCapsule_IsValid(cap, "dlpack_exchange_api"))
        api = PyCapsule_GetPointer(cap, "dlpack_exchange_api");
    Py_XDECREF(cap); /* the table itself lives as long as the process (the DLPack contract) */
    PyErr_Clear();
    if (!api || api->header.version.major != 1 || !api->dltensor_from_py_object_no_sync ||
        !api->managed_tensor_allocator || !api->managed_tensor_to_py_object_no_sync ||
        !api->current_work_stream || num_api_types == MAX_TYPES)
        Py_RETURN_FALSE;
    Py_INCREF(type);
    api_types[num_api_types].type = (PyTypeObject *)type;
    api_types[num_api_types].api = api;
    num_api_types++;
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"forward", (PyCFunction)(void (*)(void))py_forward, METH_FASTCALL,
     "forward(backend, stream, q, k, v, o, lse, alibi, cu_q, cu_k, scale, window_left, "
     "window_right, causal, softcap, max_seqlen_q, max_seqlen_k, deterministic, seqused_k, "
     "block_table[, descale_q, descale_k, descale_v, fp8]) -> (o, lse)"},
    {"backward", (PyCFunction)(void (*)(void))py_backward, METH_FASTCALL,
     "backward(backend, stream, q, k, v, o, lse, dout, dq, dk, dv, alibi, cu_q, cu_k, scale, "
     "window_left, window_right, causal, softcap, max_seqlen_q, max_seqlen_k, deterministic, "
     "seqused_k, block_table[, descale_q, descale_k, descale_v, fp8]) -> (dq, dk, dv)"},
    {"use_exchange_api", py_use_exchange_api, METH_O,
     "use_exchange_api(type): meet tensors of this type through its DLPack C exchange API"},
    {"open_backend", (PyCFunction)(void (*)(void))py_open_backend, METH_FASTCALL,
     "open_backend(name, device) -> name"},
    {"_set_error_type", py_set_error_type, METH_O, "the exception type raised on failure"},
    {"status_names", py_status_names, METH_NOARGS, "status names, indexed by status code"},
    {"version", py_version, METH_NOARGS, "the library's version"},
    {"available_backends", py_available_backends, METH_NOARGS,
     "comma-separated backends that open on this machine"},
    {"library_path", py_library_path, METH_NOARGS, "the file libflashport was loaded from"},
    {NULL, NULL, 0, NULL},
};

/* Every field spelled out: -Wextra's missing-field-initializers would flag the slots. */
static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_C",
    "flashport's C API for DLPack tensors",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__C(void)
{
    str_dlpack = PyUnicode_InternFromString("__dlpack__");
    kw_max_version = Py_BuildValue("(s)", "max_version");
    kw_stream = Py_BuildValue("(s)", "stream");
    kw_stream_max = Py_BuildValue("(ss)", "stream", "max_version");
    dlpack_version = Py_BuildValue("(ii)", 1, 0);
    if (!str_dlpack || !kw_max_version || !kw_stream || !kw_stream_max || !dlpack_version)
        return NULL;
    return PyModule_Create(&module);
}
