/*
 * Hopper (sm_90a) instructions behind named helpers, one name an instruction (PTX ISA 8.x):
 *
 *   mbarrier.*                 shared-memory barriers that count arrivals and TMA bytes
 *   cp.async.bulk.tensor.4d    TMA tile load global -> shared, completing on an mbarrier
 *   wgmma.fence / commit_group / wait_group, and the shared-memory matrix descriptor
 *   wgmma.mma_async            (wgmma_gen.cuh, generated: one function per shape)
 *   setmaxnreg                 moves registers between warpgroups
 *   bar.sync id, n             named barriers among some warps of a block
 *
 * Every helper compiles to nothing outside sm_90a (FP_SM90_DEVICE is 0), so the file that
 * includes this one also builds for sm_80; the host never launches those empty kernels there.
 * Under FP_CUDA_EMU (the CPU emulator, backends/cuda/emu/, docs/cuda_emu.md) FP_SM90_DEVICE is 1
 * and each helper calls the emulator's model of its instruction instead of the asm.
 */
#ifndef FLASHPORT_BACKENDS_CUDA_PTX_SM90_CUH
#define FLASHPORT_BACKENDS_CUDA_PTX_SM90_CUH

#include <stdint.h>

#ifndef FP_DEV
#define FP_DEV static __device__ __forceinline__
#endif

#if defined(FP_CUDA_EMU) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define FP_SM90_DEVICE 1
#else
#define FP_SM90_DEVICE 0
#endif

#if FP_SM90_DEVICE && !defined(FP_CUDA_EMU)
#define FP_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define FP_SM90_ASM(...) ((void)0)
#endif

/* ---- mbarrier ------------------------------------------------------------------------------ */

FP_DEV void fp_mbar_init(uint32_t bar, uint32_t count)
{
#ifdef FP_CUDA_EMU
    fp_emu_mbar_init(bar, count);
#else
    FP_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

/* Makes the initialized barriers visible to the async proxy (TMA) before first use. */
FP_DEV void fp_mbar_fence_init()
{
#ifndef FP_CUDA_EMU /* no-op in the emulator: its memory is coherent */
    FP_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/* One arrival that also announces `bytes` of TMA traffic the phase must wait for. */
FP_DEV void fp_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
#ifdef FP_CUDA_EMU
    fp_emu_mbar_arrive(bar, bytes);
#else
    FP_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                : "memory");
#endif
}

FP_DEV void fp_mbar_arrive(uint32_t bar)
{
#ifdef FP_CUDA_EMU
    fp_emu_mbar_arrive(bar, 0);
#else
    FP_SM90_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

/* Waits until the phase of parity `parity` has completed. A barrier starts in phase 0, so a
 * wait for parity 1 on a fresh barrier returns at once (a producer's first pass over empty
 * slots). */
FP_DEV void fp_mbar_wait(uint32_t bar, uint32_t parity)
{
#ifdef FP_CUDA_EMU
    fp_emu_mbar_wait(bar, parity);
#else
    FP_SM90_ASM("{\n.reg .pred done;\nwait_%=:\n"
                "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                "@!done bra wait_%=;\n}\n" ::"r"(bar),
                "r"(parity)
                : "memory");
#endif
}

/* ---- TMA ------------------------------------------------------------------------------------ */

FP_DEV void fp_tma_prefetch_desc(const void *tmap)
{
#ifdef FP_CUDA_EMU
    fp_emu_tma_check(tmap);
#else
    FP_SM90_ASM("prefetch.tensormap [%0];\n" ::"l"(tmap) : "memory");
#endif
}

/* Box at coordinates (c0, c1, c2, c3) of the 4-d tensor map -> shared memory at dst; the bytes
 * land on barrier `bar` (which must expect them). Elements outside the tensor read as zero. */
FP_DEV void fp_tma_load_4d(uint32_t dst, const void *tmap, uint32_t bar, int c0, int c1, int c2,
                           int c3)
{
#ifdef FP_CUDA_EMU
    const int c[4] = {c0, c1, c2, c3};
    fp_emu_tma_load(dst, tmap, bar, c, 4);
#else
    FP_SM90_ASM("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                : "memory");
#endif
}

/* `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory at src -> shared
 * memory at dst, landing on barrier `bar` (which must expect them): a TMA copy without a map. */
FP_DEV void fp_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
#ifdef FP_CUDA_EMU
    fp_emu_bulk_load(dst, src, bytes, bar);
#else
    FP_SM90_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                " [%0], [%1], %2, [%3];\n" ::"r"(dst),
                "l"(src), "r"(bytes), "r"(bar)
                : "memory");
#endif
}

/* dst[i] += src[i] for `bytes` / 4 floats: shared memory at src (16-byte aligned) reduced into
 * global memory at dst (16-byte aligned), `bytes` a multiple of 16; asynchronous, in this
 * thread's bulk group (fp_bulk_commit, fp_bulk_wait_read / fp_bulk_wait). */
FP_DEV void fp_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes)
{
#ifdef FP_CUDA_EMU
    fp_emu_bulk_reduce_add_f32(dst, src, bytes);
#else
    FP_SM90_ASM(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
        "r"(src), "r"(bytes)
        : "memory");
#endif
}

FP_DEV void fp_bulk_commit()
{
#ifdef FP_CUDA_EMU
    fp_emu_bulk_commit();
#else
    FP_SM90_ASM("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

/* Waits until this thread's bulk groups have read their shared-memory sources. */
FP_DEV void fp_bulk_wait_read()
{
#ifdef FP_CUDA_EMU
    fp_emu_bulk_wait(0, 1);
#else
    FP_SM90_ASM("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

/* Waits until this thread's bulk groups have completed (their global writes made). */
FP_DEV void fp_bulk_wait()
{
#ifdef FP_CUDA_EMU
    fp_emu_bulk_wait(0, 0);
#else
    FP_SM90_ASM("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

/* Orders this thread's generic-proxy global accesses with its async-proxy ones (bulk copies). */
FP_DEV void fp_fence_proxy_async_global()
{
#ifndef FP_CUDA_EMU /* no-op in the emulator: its memory is coherent */
    FP_SM90_ASM("fence.proxy.async.global;\n" ::: "memory");
#endif
}

/* A flag in global memory: load with acquire, add with release (GPU scope). */
FP_DEV int fp_ld_acquire_gpu(const int *p)
{
#ifdef FP_CUDA_EMU
    return fp_emu_ld_acquire(p);
#else
    int v = 0;
    FP_SM90_ASM("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}

FP_DEV void fp_red_release_gpu(int *p, int v)
{
#ifdef FP_CUDA_EMU
    fp_emu_red_release(p, v);
#else
    FP_SM90_ASM("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#endif
}

/* Makes this thread's ordinary shared-memory writes visible to the async proxy (wgmma operands
 * read from shared memory, TMA stores) that runs after the next barrier. */
FP_DEV void fp_fence_proxy_async_smem()
{
#ifndef FP_CUDA_EMU /* no-op in the emulator: its memory is coherent */
    FP_SM90_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* ---- wgmma ---------------------------------------------------------------------------------- */

/* Orders this thread's register writes (accumulators, A fragments) before the next wgmma. */
FP_DEV void fp_wgmma_fence()
{
#ifndef FP_CUDA_EMU /* no-op in the emulator: its memory is coherent */
    FP_SM90_ASM("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

FP_DEV void fp_wgmma_commit()
{
#ifdef FP_CUDA_EMU
    fp_emu_wgmma_commit();
#else
    FP_SM90_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

/* Waits until at most N committed wgmma groups of this warpgroup are still running. */
template <int N> FP_DEV void fp_wgmma_wait()
{
#ifdef FP_CUDA_EMU
    fp_emu_wgmma_wait(N);
#else
    FP_SM90_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

/* Keeps the compiler from moving accesses of r across the wgmma issue / wait points: the
 * registers are "changed" here as far as it knows. */
template <int N> FP_DEV void fp_wgmma_fence_regs(float (&r)[N])
{
#ifdef FP_CUDA_EMU
    /* the registers are memory the emulator writes at the wait (their address escaped at the
     * issue): a compiler barrier is all that is needed ("f" is an x87 register on x86) */
    (void)r;
    asm volatile("" ::: "memory");
#else
#pragma unroll
    for (int i = 0; i < N; ++i)
        asm volatile("" : "+f"(r[i])::"memory");
#endif
}

/* Shared-memory matrix descriptor of a tile stored in 128-byte-swizzled atoms (8 rows of 128
 * bytes, 1024 bytes, 1024-byte aligned; the layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B).
 *   K-major (rows along M/N, 64 2-byte elements of K per row): lbo unused, sbo = 1024 (the next
 *   8 rows); a k step of 16 elements adds 32 bytes to the start address.
 *   MN-major (rows along K, 64 elements of M/N per row): lbo = bytes to the next 64 M/N
 *   elements, sbo = 1024 (the next 8 rows of K). */
FP_DEV uint64_t fp_wgmma_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes)
{
    return (uint64_t)((smem_addr & 0x3ffffu) >> 4) |
           ((uint64_t)((lbo_bytes >> 4) & 0x3fffu) << 16) |
           ((uint64_t)((sbo_bytes >> 4) & 0x3fffu) << 32) | ((uint64_t)1 << 62);
}

/* Four e4m3 codes from f32 (round to nearest even, saturating), a in the lowest byte: the
 * byte order of a wgmma fp8 A fragment register. (cvt's packed form puts its first source in
 * the upper half.) */
FP_DEV uint32_t fp_pack4_e4m3(float a, float b, float c, float d)
{
#ifdef FP_CUDA_EMU
    return fp_emu_f32_to_e4m3(a) | fp_emu_f32_to_e4m3(b) << 8 | fp_emu_f32_to_e4m3(c) << 16 |
           fp_emu_f32_to_e4m3(d) << 24;
#else
    uint16_t lo = 0, hi = 0;
    FP_SM90_ASM("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(b), "f"(a));
    FP_SM90_ASM("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(d), "f"(c));
    return (uint32_t)lo | ((uint32_t)hi << 16);
#endif
}

/* ---- registers and barriers ------------------------------------------------------------------ */

template <int N> FP_DEV void fp_setmaxnreg_inc()
{
#ifdef FP_CUDA_EMU
    fp_emu_setmaxnreg(N);
#else
    FP_SM90_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

template <int N> FP_DEV void fp_setmaxnreg_dec()
{
#ifdef FP_CUDA_EMU
    fp_emu_setmaxnreg(N);
#else
    FP_SM90_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

/* Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads (a multiple of 32). */
FP_DEV void fp_named_bar_sync(int id, int threads)
{
#ifdef FP_CUDA_EMU
    fp_emu_named_bar(id, threads, 1);
#else
    FP_SM90_ASM("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

FP_DEV void fp_named_bar_arrive(int id, int threads)
{
#ifdef FP_CUDA_EMU
    fp_emu_named_bar(id, threads, 0);
#else
    FP_SM90_ASM("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

#if FP_SM90_DEVICE
#include "backends/cuda/ptx/wgmma_gen.cuh"
#endif

#endif /* FLASHPORT_BACKENDS_CUDA_PTX_SM90_CUH */
