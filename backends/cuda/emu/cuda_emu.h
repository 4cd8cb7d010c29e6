/*
 * cuda_emu.h: a CPU emulation of the CUDA device names that backends/cuda/ uses, force-included
 * (-include) when run_emu.sh compiles the .cu files as C++ for the CPU (with -DFP_CUDA_EMU and
 * include/ first on the path, for cuda_runtime_api.h, cuda_fp16.h, cuda_bf16.h). It lets the
 * shared test table run the sm80 kernels, the sm90 backward and the host code on a machine with
 * no GPU (docs/cuda_emu.md).
 *
 * Execution model (cuda_emu.cpp): a launch runs its blocks one after another (or on
 * FP_CUDA_EMU_THREADS host threads, one block per thread at a time); a block's threads are
 * fibers (user-level contexts) of one host thread, switched only at __syncthreads and at the
 * warp-collective instructions, which complete once every lane of the warp has arrived:
 * mma.sync m16n8k16, ldmatrix x4 (.trans), __shfl_xor_sync. Their lane mappings follow the PTX
 * ISA. cp.async copies are queued per thread and land at the cp.async.wait_group that covers
 * them (the latest moment the ISA allows). Dynamic shared memory (extern __shared__, which must
 * be named fp_smem) is one buffer per host thread, poisoned (0xff: NaN in f16/bf16/f32) at every
 * block start; "shared addresses" are byte offsets into it.
 *
 * The launch syntax kernel<<<grid, block, smem, stream>>>(args) is rewritten by run_emu.sh into
 * kernel << fp_emu_cfg(grid, block, smem, stream)(args), which the operator below launches.
 * __CUDA_ARCH__ is left undefined, as in nvcc's host pass (fp_red_add2 takes its pre-sm_90 path).
 */
#ifndef FLASHPORT_BACKENDS_CUDA_EMU_H
#define FLASHPORT_BACKENDS_CUDA_EMU_H

#include <cuda_runtime_api.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__   thread_local
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
/* The sm90 kernels name their dynamic shared memory fp_smem_raw: the same array. */
#define fp_smem_raw fp_smem

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

/* Set by the scheduler each time it switches to a thread (fiber). */
extern thread_local dim3 fp_emu_thread_idx, fp_emu_block_idx, fp_emu_block_dim, fp_emu_grid_dim;
#define threadIdx fp_emu_thread_idx
#define blockIdx  fp_emu_block_idx
#define blockDim  fp_emu_block_dim
#define gridDim   fp_emu_grid_dim

struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};
static inline float2 make_float2(float x, float y)
{
    float2 r = {x, y};
    return r;
}
static inline float4 make_float4(float x, float y, float z, float w)
{
    float4 r = {x, y, z, w};
    return r;
}
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w)
{
    uint4 r = {x, y, z, w};
    return r;
}

/* CUDA's integer min/max overloads (host and device). */
#define FP_EMU_MINMAX(T)                                                                           \
    static inline T min(T a, T b)                                                                  \
    {                                                                                              \
        return a < b ? a : b;                                                                      \
    }                                                                                              \
    static inline T max(T a, T b)                                                                  \
    {                                                                                              \
        return a > b ? a : b;                                                                      \
    }
FP_EMU_MINMAX(int)
FP_EMU_MINMAX(unsigned)
FP_EMU_MINMAX(long)
FP_EMU_MINMAX(unsigned long)
FP_EMU_MINMAX(long long)
FP_EMU_MINMAX(unsigned long long)
#undef FP_EMU_MINMAX

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* ---- device functions -------------------------------------------------------------------- */

void __syncthreads(void);
float atomicAdd(float *address, float value);
unsigned atomicAdd(unsigned *address, unsigned value); /* global or shared */
float2 atomicAdd(float2 *address, float2 value);       /* sm_90: atomic per element */

/* Shared-window offset of a generic pointer into this block's shared memory. */
size_t __cvta_generic_to_shared(const void *ptr);

/* Static __shared__ variables: run_emu.sh rewrites each declaration `__shared__ [__align__(A)] T
 * name[dims], ...;` (one line, not extern) into FP_EMU_STATIC_SHARED(T, name, [dims], A) per
 * declarator, a reference to the block's copy, which the emulator places in the shared window
 * after the launch's dynamic shared memory (the GPU counts the two together against the block's
 * limit) and poisons (0xff) like the rest. key: the declaration's own static byte, which names it
 * (one per template instantiation, as the GPU has one variable per instantiated kernel). */
void *fp_emu_static_shared(const void *key, size_t bytes, size_t align);
#define FP_EMU_STATIC_SHARED(T, name, dims, A)                                                     \
    static char fp_emu_key_##name;                                                                 \
    typedef T fp_emu_type_##name dims;                                                             \
    fp_emu_type_##name &name = *static_cast<fp_emu_type_##name *>(fp_emu_static_shared(            \
        &fp_emu_key_##name, sizeof(fp_emu_type_##name),                                            \
        (A) > alignof(fp_emu_type_##name) ? (A) : alignof(fp_emu_type_##name)))

/* Integer intrinsics (CUDA math API): __byte_perm's result byte n is byte (s >> 4 n) & 7 of the
 * 8 bytes {y, x} (x's low byte first); __vcmpeq4 is 0xff in each byte where a and b agree. */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++)
        r |= (unsigned)(v >> 8 * ((s >> 4 * n) & 7) & 0xff) << 8 * n;
    return r;
}
static inline unsigned __vcmpeq4(unsigned a, unsigned b)
{
    unsigned r = 0;
    for (int n = 0; n < 4; n++)
        r |= ((a >> 8 * n & 0xff) == (b >> 8 * n & 0xff) ? 0xffu : 0u) << 8 * n;
    return r;
}
int atomicAdd(int *address, int value);               /* global or shared */
unsigned atomicOr(unsigned *address, unsigned value); /* global or shared */

uint32_t fp_emu_shfl_xor(unsigned mask, uint32_t bits, int lane_mask, int width);
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32)
{
    static_assert(sizeof(T) == 4, "the emulator shuffles 32-bit values only");
    uint32_t bits;
    memcpy(&bits, &var, 4);
    bits = fp_emu_shfl_xor(mask, bits, lane_mask, width);
    memcpy(&var, &bits, 4);
    return var;
}

/* Warp vote, by a butterfly of shuffles (full mask only, as the shuffles). */
static inline int __any_sync(unsigned mask, int pred)
{
    uint32_t v = pred != 0;
    for (int off = 1; off < 32; off <<= 1)
        v |= fp_emu_shfl_xor(mask, v, off, 32);
    return (int)v;
}

/* Warp barrier: a rendezvous of the warp's lanes (a shuffle), which in the emulator also orders
 * their shared-memory accesses. */
static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    (void)fp_emu_shfl_xor(mask, 0u, 1, 32);
}

/* The instructions of ptx/sm80.cuh's wrappers (#ifdef FP_CUDA_EMU there). */
void fp_emu_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, int bf16);
void fp_emu_ldmatrix_x4(uint32_t r[4], uint32_t addr, int trans);
/* stmatrix.sync.aligned.m8n8.x{num}(.trans).shared.b16: r holds num registers */
void fp_emu_stmatrix(uint32_t addr, const uint32_t *r, int num, int trans);
void fp_emu_cp_async16(uint32_t dst, const void *src, int src_bytes);
void fp_emu_cp_async_commit(void);
void fp_emu_cp_async_wait(int n);
float fp_emu_ex2_approx_ftz(float x);
float fp_emu_rcp_approx_ftz(float x);
float fp_emu_lg2_approx_ftz(float x);

/* The instructions of ptx/sm90.cuh's and ptx/wgmma_gen.cuh's wrappers (#ifdef FP_CUDA_EMU
 * there; cuda_emu.cpp says what each models). Shared addresses and barriers are byte offsets into
 * the block's dynamic shared memory. */
void fp_emu_mbar_init(uint32_t bar, uint32_t count);
void fp_emu_mbar_arrive(uint32_t bar, uint32_t expect_tx_bytes); /* arrive(.expect_tx) */
void fp_emu_mbar_wait(uint32_t bar, uint32_t parity);
void fp_emu_tma_check(const void *tmap);
void fp_emu_tma_load(uint32_t dst, const void *tmap, uint32_t bar, const int *coords, int rank);
void fp_emu_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar);
void fp_emu_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes);
void fp_emu_bulk_commit(void);
void fp_emu_bulk_wait(int n, int read_only);
int fp_emu_ld_acquire(const int *p);
void fp_emu_red_release(int *p, int v);
void fp_emu_setmaxnreg(int n);
void fp_emu_named_bar(int id, int threads, int wait);
enum { FP_EMU_F16, FP_EMU_BF16, FP_EMU_E4M3 };
/* wgmma.mma_async m64nNk16 (k32 for e4m3): d the thread's N / 2 accumulators, a its A fragment
 * (NULL: A from a_desc), the transpose immediates, scale_d (0: d = A B). */
void fp_emu_wgmma(float *d, int n, const uint32_t *a, uint64_t a_desc, uint64_t b_desc, int dtype,
                  int trans_a, int trans_b, int scale_d);
void fp_emu_wgmma_commit(void);
void fp_emu_wgmma_wait(int n);
uint32_t fp_emu_f32_to_e4m3(float x); /* cvt.rn.satfinite.e4m3 */

/* ---- launches ---------------------------------------------------------------------------- */

struct fp_emu_launch_cfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};

/* Runs body(closure) once per thread of every block; errors go to cudaGetLastError. */
void fp_emu_launch(const void *kernel, const fp_emu_launch_cfg &cfg, void (*body)(void *),
                   void *closure);

template <class F> struct fp_emu_bound {
    fp_emu_launch_cfg cfg;
    F call;
};

/* fp_emu_cfg(grid, block, smem, stream)(args...): the launch configuration with the kernel's
 * arguments bound (by value, as a launch copies them). */
struct fp_emu_cfg {
    fp_emu_launch_cfg cfg;
    fp_emu_cfg(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0)
    {
        cfg.grid = grid;
        cfg.block = block;
        cfg.smem = smem;
        cfg.stream = stream;
    }
    template <class... A> auto operator()(A... args) const
    {
        auto call = [=](auto kernel) { kernel(args...); };
        return fp_emu_bound<decltype(call)>{cfg, call};
    }
};

template <class... P, class F> void operator<<(void (*kernel)(P...), const fp_emu_bound<F> &b)
{
    struct closure {
        void (*kernel)(P...);
        const F *call;
    } c = {kernel, &b.call};
    fp_emu_launch(
        reinterpret_cast<const void *>(kernel), b.cfg,
        [](void *p) {
            const closure *c = static_cast<const closure *>(p);
            (*c->call)(c->kernel);
        },
        &c);
}

#endif /* FLASHPORT_BACKENDS_CUDA_EMU_H */
