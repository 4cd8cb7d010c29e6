/*
 * flashport: portable IO-aware exact attention (FlashAttention) behind one C API.
 *
 * The whole public API is this header. It is C11 and links nothing from CUDA or ROCm: GPU
 * backends are plugins that the library loads at run time.
 *
 * Semantics (every backend computes exactly this; docs/semantics.md is the contract):
 *   q [B, Nq, H, D], k and v [B, Nk, Hkv, D], o [B, Nq, H, D]; element strides are arbitrary.
 *   S = scale * Q K^T (scale defaults to 1/sqrt(D));
 *   optional softcap c > 0: S = c * tanh(S / c);
 *   optional ALiBi: S[i][j] -= slope[h] * |i + Nk - Nq - j|;
 *   window (left, right), -1 = unbounded, aligned bottom-right: query i sees key j iff
 *       i + Nk - Nq - left <= j <= i + Nk - Nq + right;  causal == (left = -1, right = 0);
 *   P = softmax(S) over visible keys; O = P V; LSE = log(sum exp S) (natural log, f32).
 *   A row with no visible key gives O = 0 and LSE = -inf, never NaN.
 *   NaN and infinities: keys a row cannot see (masked by the window, past a sequence's end, in
 *   tile padding) never affect that row, even when their K or V hold NaN or inf: its O, LSE and
 *   dQ are those of the same call with those keys clean, and likewise queries a key cannot see
 *   never affect its dK and dV. A NaN in a score or a value a row can see propagates to that
 *   row: a NaN score makes its O and LSE NaN, a NaN V element the matching O element (on the
 *   GPU backends the whole O row: their tensor-core products cannot keep it per element).
 *   GQA/MQA: H % Hkv == 0; query head h reads kv head h / (H / Hkv).
 *   Nk is the key count of the sequence: seqused_k[b] when params.seqused_k is set (a KV cache,
 *   dense or paged through params.block_table; see flashport_attention_params).
 *
 * Every function returns a flashport_status; on failure flashport_last_error() gives a message
 * for the calling thread. The library never prints (unless FLASHPORT_LOG is set), never exits and
 * never aborts. A call that fails validation writes nothing to its outputs.
 *
 * Environment variables:
 *   FLASHPORT_BACKEND      backend used by flashport_backend_open(NULL, ...): "cpu", "reference",
 *                          "cuda", "hip" or "auto" (the first available GPU backend, else "cpu").
 *   FLASHPORT_DEVICE       device index for GPU backends (default 0).
 *   FLASHPORT_LOG          "1" (or any value but "0"): log to stderr which backend and kernel
 *                          variant ran, and why.
 *   FLASHPORT_PLUGIN_PATH  colon-separated folders searched for backend plugins
 *                          (libflashport_<name>.so) before the folder of the library itself.
 *                          That folder is resolved to an absolute path when the library is
 *                          loaded; when it cannot be (core linked into a program started
 *                          through $PATH), only FLASHPORT_PLUGIN_PATH is searched: nothing is
 *                          loaded relative to the working directory.
 *   FLASHPORT_NUM_THREADS  threads used by the CPU backend (default: OpenMP's default); a value
 *                          that is not a positive integer makes opening "cpu" fail with
 *                          FLASHPORT_ERR_INVALID_VALUE.
 *
 * Thread safety:
 *   - Any function may be called from several threads at once on different handles.
 *   - On one shared handle, flashport_attention_forward / _backward / _supported /
 *     _workspace_size, the memory helpers and flashport_backend_name / _device may run
 *     concurrently (results are the same as run one after another), except when the handle has
 *     a caller-owned workspace (flashport_set_workspace): calls on it share that memory, so the
 *     caller serializes them (or gives each thread its own handle).
 *   - flashport_set_stream, flashport_set_workspace and flashport_backend_close change the
 *     handle: no other call may run on the handle at the same time.
 *   - Timers belong to one thread at a time.
 *   - flashport_last_error() is per thread; registry and plugin loading are internally locked.
 */
#ifndef FLASHPORT_H
#define FLASHPORT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FLASHPORT_API __declspec(dllexport)
#else
#define FLASHPORT_API __attribute__((visibility("default")))
#endif

#define FLASHPORT_VERSION_MAJOR 0
#define FLASHPORT_VERSION_MINOR 1
#define FLASHPORT_VERSION_PATCH 0
/* One integer that orders versions: major * 10000 + minor * 100 + patch. */
#define FLASHPORT_VERSION                                                                          \
    (FLASHPORT_VERSION_MAJOR * 10000 + FLASHPORT_VERSION_MINOR * 100 + FLASHPORT_VERSION_PATCH)

/* ---------------------------------------------------------------------------------------------
 * Status codes. FLASHPORT_OK is 0; every other value is a distinct failure.
 * ------------------------------------------------------------------------------------------- */
typedef enum flashport_status {
    FLASHPORT_OK = 0,
    FLASHPORT_ERR_NULL_POINTER = 1,         /* a required pointer argument was NULL            */
    FLASHPORT_ERR_INVALID_VALUE = 2,        /* a parameter is out of its range (scale, window,
                                               softcap, rank, unknown enum value)              */
    FLASHPORT_ERR_SHAPE_MISMATCH = 3,       /* tensors disagree on B, N, H, D                  */
    FLASHPORT_ERR_DTYPE_MISMATCH = 4,       /* q/k/v/o (and grads) do not share one dtype, or
                                               lse is not f32                                  */
    FLASHPORT_ERR_HEAD_RATIO = 5,           /* H % Hkv != 0                                    */
    FLASHPORT_ERR_BAD_SIZE = 6,             /* a size is negative, zero where not allowed, or
                                               an extent overflows 64-bit offsets              */
    FLASHPORT_ERR_BAD_STRIDE = 7,           /* a stride is negative or overflows               */
    FLASHPORT_ERR_ALIASING = 8,             /* an output overlaps an input or another output   */
    FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM = 9, /* the backend has no kernel for this D            */
    FLASHPORT_ERR_UNSUPPORTED_DTYPE = 10,   /* the backend has no kernel for this dtype        */
    FLASHPORT_ERR_UNSUPPORTED_LAYOUT = 11,  /* e.g. the backend needs a contiguous last dim    */
    FLASHPORT_ERR_UNSUPPORTED_FEATURE = 12, /* a feature this backend/direction lacks          */
    FLASHPORT_ERR_BAD_SEQLENS = 13,         /* cu_seqlens not monotone, not starting at 0,
                                               exceeding the buffer, or over max_seqlen        */
    FLASHPORT_ERR_BACKEND_UNKNOWN = 14,     /* no backend of this name exists                  */
    FLASHPORT_ERR_BACKEND_UNAVAILABLE = 15, /* the backend's plugin is missing or failed to
                                               load, or has the wrong API version             */
    FLASHPORT_ERR_NO_DEVICE = 16,           /* the backend's runtime finds no usable device    */
    FLASHPORT_ERR_OUT_OF_MEMORY = 17,       /* host or device allocation failed                */
    FLASHPORT_ERR_DEVICE = 18,              /* a device runtime call failed                    */
    FLASHPORT_ERR_INTERNAL = 19,            /* a bug in flashport; please report it            */
    FLASHPORT_ERR_UNINITIALIZED = 20,       /* a params struct not set up by
                                               flashport_attention_params_init                 */
    FLASHPORT_ERR_BUFFER_TOO_SMALL = 21     /* a caller-owned buffer (a string, a workspace) is
                                               smaller than needed; the call says how much     */
} flashport_status;

/* A short constant name for a status ("FLASHPORT_ERR_HEAD_RATIO"). Never NULL. */
FLASHPORT_API const char *flashport_status_string(flashport_status status);

/* The message of the last failure on the calling thread ("" if none). Thread-local; valid until
 * the next flashport call on this thread. */
FLASHPORT_API const char *flashport_last_error(void);

/* "major.minor.patch". */
FLASHPORT_API const char *flashport_version(void);

/* ---------------------------------------------------------------------------------------------
 * Element types and tensor descriptors.
 * ------------------------------------------------------------------------------------------- */
typedef enum flashport_dtype {
    FLASHPORT_F32 = 0,
    FLASHPORT_F16 = 1,      /* IEEE binary16 */
    FLASHPORT_BF16 = 2,     /* bfloat16      */
    FLASHPORT_FP8_E4M3 = 3, /* OCP E4M3FN; q, k, v of a forward only (see descale_q below) */
    FLASHPORT_FP8_E5M2 = 4, /* OCP E5M2; likewise */
    FLASHPORT_DTYPE_COUNT
} flashport_dtype;

/* Size in bytes of one element (0 for an unknown dtype). */
FLASHPORT_API size_t flashport_dtype_size(flashport_dtype dtype);
/* "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", or "?". */
FLASHPORT_API const char *flashport_dtype_name(flashport_dtype dtype);

#define FLASHPORT_MAX_RANK 4

/* A strided view of memory owned by the caller. `data` lives where the backend computes (host
 * memory for "cpu"/"reference", device memory for GPU backends). Shapes and strides are in
 * elements, outermost dimension first; strides may be any non-negative value (a backend may
 * require stride 1 on the last dimension and says so with FLASHPORT_ERR_UNSUPPORTED_LAYOUT).
 *
 *   dense q/k/v/o/dq/dk/dv:  rank 4, [B, N, heads, D]
 *   varlen q/k/v/o/...:      rank 3, [total_tokens, heads, D]   (with params.cu_seqlens_*)
 *   paged k/v:               rank 4, [num_pages, page_size, Hkv, D] (with params.block_table)
 *   lse (f32):               rank 3, [B, H, Nq]; varlen: rank 2, [H, total_q]              */
typedef struct flashport_tensor {
    void *data;
    flashport_dtype dtype;
    int32_t rank;
    int64_t shape[FLASHPORT_MAX_RANK];
    int64_t stride[FLASHPORT_MAX_RANK];
} flashport_tensor;

/* Fills a contiguous (row-major) descriptor of the given rank and shape. Returns it by value so
 * it can be used inline; never fails (validation happens when the tensor is used). */
FLASHPORT_API flashport_tensor flashport_tensor_contiguous(void *data, flashport_dtype dtype,
                                                           int32_t rank, const int64_t *shape);

/* ---------------------------------------------------------------------------------------------
 * Backends.
 * ------------------------------------------------------------------------------------------- */
typedef struct flashport_backend flashport_backend;

/* Opens a backend by name: "cpu" (tiled flash kernels, OpenMP), "reference" (the naive oracle,
 * double accumulation), "cuda", "hip", or "auto". name == NULL reads FLASHPORT_BACKEND (and
 * "auto" if that is unset). The device index comes from FLASHPORT_DEVICE (default 0).
 * An unknown or unavailable backend is an error whose message names the available ones; there
 * is never a silent fallback ("auto" is the only name that chooses). */
FLASHPORT_API flashport_status flashport_backend_open(const char *name, flashport_backend **out);

/* Same, with an explicit device index (ignored by host backends). */
FLASHPORT_API flashport_status flashport_backend_open_device(const char *name, int device,
                                                             flashport_backend **out);

/* Releases the handle. NULL is accepted. Does not free memory allocated through it. */
FLASHPORT_API void flashport_backend_close(flashport_backend *backend);

/* The backend's name ("cpu", "cuda", ...) and the device index it runs on. */
FLASHPORT_API const char *flashport_backend_name(const flashport_backend *backend);
FLASHPORT_API int flashport_backend_device(const flashport_backend *backend);

/* Writes a comma-separated list of the backends that open on this machine right now into buf
 * (always NUL-terminated when size > 0). *needed (when needed is not NULL) receives the size the
 * whole list takes, its NUL included. A buffer shorter than that gets the names that fit, whole,
 * and FLASHPORT_ERR_BUFFER_TOO_SMALL; buf may be NULL when size is 0 (a size query). */
FLASHPORT_API flashport_status flashport_available_backends(char *buf, size_t size, size_t *needed);

/* What a device is. Host backends ("cpu", "reference") report one device: the host. */
typedef struct flashport_device_props {
    char name[256];          /* "NVIDIA H200", "AMD Instinct MI300X", the CPU's model name */
    char arch[32];           /* "sm_90", "gfx90a", or the host's ISA ("x86_64", "aarch64") */
    size_t total_memory;     /* bytes of device memory (host: physical memory)             */
    int32_t compute_major;   /* CUDA: compute capability major; HIP: the runtime's major */
    int32_t compute_minor;   /* ... and minor (gfx90a: 9, 0); host: 0, 0                  */
    int32_t multiprocessors; /* SMs / CUs; host: online logical CPUs                      */
} flashport_device_props;

/* Devices the backend `name` ("cpu", "reference", "cuda", "hip") sees. A GPU backend whose plugin
 * loads on a machine without a usable device reports 0 with FLASHPORT_OK; a missing plugin is
 * FLASHPORT_ERR_BACKEND_UNAVAILABLE. */
FLASHPORT_API flashport_status flashport_device_count(const char *name, int *count);

/* Properties of device `device` of backend `name`; FLASHPORT_ERR_NO_DEVICE when there is no
 * such device. */
FLASHPORT_API flashport_status flashport_device_properties(const char *name, int device,
                                                           flashport_device_props *props);

/* Memory helpers: where the backend's tensors live. For host backends these are plain host
 * allocations and copies. Copies are synchronous with respect to the host. */
FLASHPORT_API flashport_status flashport_malloc(flashport_backend *backend, size_t bytes,
                                                void **ptr);
FLASHPORT_API flashport_status flashport_free(flashport_backend *backend, void *ptr);
FLASHPORT_API flashport_status flashport_memcpy_to_device(flashport_backend *backend, void *dst,
                                                          const void *src_host, size_t bytes);
FLASHPORT_API flashport_status flashport_memcpy_to_host(flashport_backend *backend, void *dst_host,
                                                        const void *src, size_t bytes);
FLASHPORT_API flashport_status flashport_synchronize(flashport_backend *backend);

/* The stream the backend enqueues work on (a cudaStream_t / hipStream_t cast to void *; NULL is
 * the default stream). Host backends accept only NULL. Kernels launched through this handle are
 * ordered after prior work on that stream and run asynchronously to the host.
 * The "opencl" backend takes a cl_command_queue: one of another context than the handle's is
 * adopted with its context and device while the handle holds no allocations (docs/opencl.md). */
FLASHPORT_API flashport_status flashport_set_stream(flashport_backend *backend, void *stream);

/* Timing of the work enqueued through a backend: device events on the backend's stream for GPU
 * backends (no host synchronization between start and stop), the host clock for host backends.
 * start and stop mark points in the stream; elapsed waits for stop and gives the milliseconds
 * between the two marks. */
typedef struct flashport_timer flashport_timer;

FLASHPORT_API flashport_status flashport_timer_create(flashport_backend *backend,
                                                      flashport_timer **timer);
FLASHPORT_API flashport_status flashport_timer_start(flashport_timer *timer);
FLASHPORT_API flashport_status flashport_timer_stop(flashport_timer *timer);
FLASHPORT_API flashport_status flashport_timer_elapsed_ms(flashport_timer *timer, float *ms);
/* NULL is accepted. The timer must not outlive its backend handle. */
FLASHPORT_API void flashport_timer_destroy(flashport_timer *timer);

/* ---------------------------------------------------------------------------------------------
 * Attention.
 * ------------------------------------------------------------------------------------------- */
typedef struct flashport_attention_params {
    /* Set by flashport_attention_params_init, never by hand: the size of this struct as the
     * caller's header declared it, and FLASHPORT_PARAMS_MAGIC. A struct that lacks them (zeroed
     * with memset, say) is rejected with FLASHPORT_ERR_UNINITIALIZED; a smaller size (a caller
     * built against an older header) gets the defaults for the fields it does not have. */
    uint32_t struct_size;
    uint32_t magic;

    /* Multiplier of Q K^T. 0 means 1/sqrt(D). Must be finite and not negative. */
    float scale;

    /* Sliding window, in keys, aligned bottom-right (see top of file). -1 means unbounded on that
     * side. Values below -1 are invalid. */
    int32_t window_left;
    int32_t window_right;

    /* Nonzero: causal, i.e. window_right is forced to 0 (window_left still applies, which gives
     * causal sliding-window attention). */
    int32_t causal;

    /* Softcap c: S = c * tanh(S / c). 0 disables; negative is invalid. */
    float softcap;

    /* ALiBi: H slopes, f32, contiguous, in the backend's memory; NULL disables. Host backends
     * refuse a slope that is not finite (FLASHPORT_ERR_INVALID_VALUE); GPU backends do not read
     * them back to check, and a NaN slope makes its head's rows NaN. */
    const float *alibi_slopes;

    /* Variable-length batches. Both NULL: dense rank-4 tensors. Both set: rank-3 packed tensors
     * and B + 1 monotone int32 offsets (in the backend's memory) starting at 0, the last not
     * exceeding the packed tensor's token count. max_seqlen_q/k bound every sequence length. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int32_t batch;        /* B for varlen (number of sequences); ignored for dense tensors */
    int32_t max_seqlen_q; /* varlen only */
    int32_t max_seqlen_k; /* varlen only */

    /* Backward: nonzero asks for bitwise-identical gradients from run to run (no float atomics
     * whose order varies). */
    int32_t deterministic;

    /* fp8 inputs only (other dtypes ignore them): per-tensor dequantization factors of q, k, v;
     * 0 means 1; negative, infinite or NaN is FLASHPORT_ERR_INVALID_VALUE. With fp8 q, k, v
     * (e4m3 or e5m2, all three alike; o in bf16 or f16; forward only, a backward is
     * FLASHPORT_ERR_UNSUPPORTED_DTYPE):
     *   S = scale * descale_q * descale_k * Q K^T (then softcap, ALiBi, mask),
     *   p_ij = exp(S_ij - m_i) (m_i: the row maximum), l_i = sum_j p_ij (unrounded),
     *   O_i = descale_v * sum_j e4m3(p_ij) V_j / l_i, e4m3() rounding to nearest even e4m3,
     *   LSE_i = m_i + log(l_i).
     * docs/semantics.md ("fp8 forward") says how a kernel's running maximum moves the rounding
     * of P and what the tests allow for it. */
    float descale_q;
    float descale_k;
    float descale_v;

    /* KV cache (docs/semantics.md, "KV cache"): fields after the fp8 descales; a caller built
     * against an older header gets NULL / 0 here.
     *
     * seqused_k: int32 [B] in the backend's memory, or NULL (every key is used). Sequence b uses
     * keys 0 .. seqused_k[b] - 1 only (dense, varlen or paged k/v); keys past them are never
     * read, even to multiply by zero, and their NaN or inf never reach an output. Causal, window
     * and ALiBi alignment (bottom-right) take seqused_k[b] as that sequence's Nk. Forward and
     * backward; in backward the dK and dV rows of unused keys are written as zeros. Each value
     * must lie in [0, capacity of its sequence] (dense: Nk; varlen: its cu_seqlens_k length;
     * paged: block_table_stride * page_size). Host backends read the values and refuse one
     * outside that range with FLASHPORT_ERR_BAD_SEQLENS, writing nothing; GPU backends do not
     * read them back (that would synchronize the stream) and clamp each to [0, capacity].
     *
     * block_table: int32 [B, block_table_stride] in the backend's memory, or NULL (no paging).
     * When set, k and v are rank 4 [num_pages, page_size, Hkv, D] (both of one shape; page_size
     * is k's dimension 1, >= 1, and a multiple of 16 on cuda and hip), q, o and lse are dense
     * ([B, Nq, H, D], B from q; cu_seqlens must be NULL), seqused_k is required, and logical key
     * t of sequence b is row t % page_size of page block_table[b * block_table_stride +
     * t / page_size]. Only the first ceil(seqused_k[b] / page_size) entries of a row are read.
     * Forward only: a backward call with a block table gets FLASHPORT_ERR_UNSUPPORTED_FEATURE.
     * An entry outside [0, num_pages) must never make a kernel read outside the cache:
     *   - host backends ("cpu", "reference") read the table and refuse such an entry with
     *     FLASHPORT_ERR_INVALID_VALUE (the message names b and the entry), writing nothing;
     *   - GPU backends cannot return a status from a kernel without synchronizing the stream, so
     *     a kernel never dereferences an entry outside [0, num_pages): it treats the keys of
     *     that page as masked (they take part in no softmax), and the call still returns
     *     FLASHPORT_OK. A row whose used keys all lie in such pages gives O = 0, LSE = -inf.
     * block_table_stride: entries per sequence, >= 1 when block_table is set (ignored when it is
     * NULL); a sequence holds at most block_table_stride * page_size keys. */
    const int32_t *seqused_k;
    const int32_t *block_table;
    int32_t block_table_stride;
} flashport_attention_params;

#define FLASHPORT_PARAMS_MAGIC 0x46505031u /* "FPP1" */

/* Defaults: scale 1/sqrt(D), no window, not causal, no softcap, no ALiBi, dense, not
 * deterministic, every key used, no block table. Always start from this so fields added later keep
 * their defaults. flashport_attention_params_init is a macro that passes sizeof the caller's
 * struct, so a program built against this header and run with a newer library (whose struct is
 * larger) has only its own `size` bytes written. NULL, or a size smaller than the first versioned
 * struct, writes nothing. */
FLASHPORT_API void flashport_attention_params_init_sized(flashport_attention_params *params,
                                                         size_t size);
#define flashport_attention_params_init(params)                                                    \
    flashport_attention_params_init_sized((params), sizeof *(params))

/* O = attention(Q, K, V). lse may be NULL; if given it receives the row log-sum-exp (f32) that
 * the backward pass needs. q, k, v must share one dtype, and o has it too, except that fp8 q, k,
 * v give o in bf16 or f16 (o's descriptor chooses; see descale_q above). */
FLASHPORT_API flashport_status flashport_attention_forward(
    flashport_backend *backend, const flashport_attention_params *params, const flashport_tensor *q,
    const flashport_tensor *k, const flashport_tensor *v, const flashport_tensor *o,
    const flashport_tensor *lse);

/* dQ, dK, dV from q, k, v, the forward's o and lse, and dO. dK/dV are summed over the query
 * heads that share a kv head. Gradients have the shapes (and dtype) of q, k, v. No Nq x Nk
 * matrix is ever stored: P is recomputed from lse. params must be those of the forward. */
FLASHPORT_API flashport_status flashport_attention_backward(
    flashport_backend *backend, const flashport_attention_params *params, const flashport_tensor *q,
    const flashport_tensor *k, const flashport_tensor *v, const flashport_tensor *o,
    const flashport_tensor *lse, const flashport_tensor *dout, const flashport_tensor *dq,
    const flashport_tensor *dk, const flashport_tensor *dv);

/* ---------------------------------------------------------------------------------------------
 * Asking before calling: is a call served, and how much scratch memory does it need.
 *
 * Both take the arguments of flashport_attention_forward (direction FLASHPORT_FORWARD: dout, dq,
 * dk, dv are ignored and may be NULL) or of flashport_attention_backward (FLASHPORT_BACKWARD),
 * validate them exactly as the call would, ask the backend (dtype, head dim, the kernel it would
 * pick and whether this device can run it), and run nothing, write nothing. They read
 * cu_seqlens (B + 1 ints) as the call does, and on host backends seqused_k and the used
 * block-table entries.
 * ------------------------------------------------------------------------------------------- */
typedef enum flashport_direction {
    FLASHPORT_FORWARD = 0,
    FLASHPORT_BACKWARD = 1
} flashport_direction;

/* The status (and flashport_last_error() message) the call would return, without running it.
 * FLASHPORT_OK means the call would be served. */
FLASHPORT_API flashport_status flashport_attention_supported(
    flashport_backend *backend, flashport_direction direction,
    const flashport_attention_params *params, const flashport_tensor *q, const flashport_tensor *k,
    const flashport_tensor *v, const flashport_tensor *o, const flashport_tensor *lse,
    const flashport_tensor *dout, const flashport_tensor *dq, const flashport_tensor *dk,
    const flashport_tensor *dv);

/* *bytes: the device memory the call needs as scratch (split-KV partials, backward row
 * statistics and dQ accumulator, the backward's GQA group-split dK/dV partials, staging of
 * unaligned tensors), 0 when none. Host backends
 * report 0 (the CPU backend's per-thread tiles are host memory it manages itself). On failure
 * the status is what the call would return and *bytes is 0. */
FLASHPORT_API flashport_status flashport_attention_workspace_size(
    flashport_backend *backend, flashport_direction direction,
    const flashport_attention_params *params, const flashport_tensor *q, const flashport_tensor *k,
    const flashport_tensor *v, const flashport_tensor *o, const flashport_tensor *lse,
    const flashport_tensor *dout, const flashport_tensor *dq, const flashport_tensor *dk,
    const flashport_tensor *dv, size_t *bytes);

/* Hands the handle caller-owned device memory (from the caller's allocator: PyTorch's caching
 * allocator, an engine's arena) of `bytes` bytes, aligned to 256 bytes. From then on forward and
 * backward on this handle allocate nothing: they carve their scratch from it, ordered on the
 * handle's stream, and a call that needs more than `bytes` fails with
 * FLASHPORT_ERR_BUFFER_TOO_SMALL before anything runs (the message gives the size). The memory
 * must stay valid until the work enqueued with it has completed; calls on the handle then share
 * it, so they must not overlap (see Thread safety). workspace == NULL (bytes 0) goes back to the
 * backend's own stream-ordered allocations. Host backends accept it and use none of it. */
FLASHPORT_API flashport_status flashport_set_workspace(flashport_backend *backend, void *workspace,
                                                       size_t bytes);

/* ---------------------------------------------------------------------------------------------
 * Conversions between storage types, on the host.
 *
 * Converts `count` elements of `src` (src_dtype) to `dst` (dst_dtype); every pair of f32, f16,
 * bf16, fp8 e4m3 and fp8 e5m2 works, both ways. Rounding is to nearest, ties to even, from the
 * exact value. NaN stays NaN (sign kept). f16 and bf16: a value that rounds past the largest
 * finite one becomes infinity, and infinities stay infinite. fp8 (OCP FP8 formats) saturates:
 * e4m3 ("E4M3FN": no infinities, largest finite 448, NaN 0x7f / 0xff) maps finite overflow and
 * +-inf to +-448; e5m2 (largest finite 57344, infinities 0x7c / 0xfc) maps finite overflow to
 * +-57344 and keeps infinities. Buffers must not overlap (FLASHPORT_ERR_ALIASING); count 0 is a
 * no-op. The tests check every fp8 and f16 bit pattern against a double-precision model.
 * ------------------------------------------------------------------------------------------- */
FLASHPORT_API flashport_status flashport_convert(void *dst, flashport_dtype dst_dtype,
                                                 const void *src, flashport_dtype src_dtype,
                                                 size_t count);

#ifdef __cplusplus
}
#endif

#endif /* FLASHPORT_H */
