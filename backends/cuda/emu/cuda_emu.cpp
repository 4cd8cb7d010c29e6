/*
 * The runtime side of the CUDA emulator (cuda_emu.h, docs/cuda_emu.md): a one-device "GPU" whose
 * memory is host memory and whose streams are synchronous, and the execution of kernels on a CPU.
 *
 * Threads: a block's threads are fibers on one host thread (x86-64 context switch below: six
 * callee-saved registers, the stack pointer, MXCSR and the x87 control word). A scheduler runs
 * every runnable fiber in turn until it blocks: at __syncthreads (released when every live thread
 * of the block has arrived) or at a warp-collective instruction (computed by the last lane of the
 * warp to arrive, from the operands every lane left in the warp's slots; the others wake up with
 * their results). A warp whose lanes arrive at different kinds of collectives, a collective with
 * exited lanes, and a block where no thread can run are kernel bugs: the emulator prints what it
 * saw and aborts, as a GPU would trap. Threads that exit no longer count for __syncthreads.
 *
 * Instructions (PTX ISA, per warp; lane = 4 g + t):
 *   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: A reg r = rows g + 8 (r & 1), k = 2t +
 *     8 (r >> 1) + {0, 1} (low half first); B reg r = k 2t + 8 r + {0, 1}, column g; C/D reg i =
 *     row g + 8 (i >> 1), column 2t + (i & 1). D = C + sum_k A B: the products are exact in f32
 *     (11- or 8-bit significands); they are summed in k order in f32 and added to C (the
 *     hardware's internal order and rounding are not documented).
 *   ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8i .. 8i+7 give the 16-byte rows of
 *     matrix i; lane l receives in register i the pair (row l / 4, elements 2 (l % 4), +1), or
 *     with .trans (elements 2 (l % 4), +1 of column l / 4). Rows must be 16-byte aligned.
 *   cp.async.cg.shared.global 16 with src-size: queued; at cp.async.wait_group N (or when the
 *     queue is drained) the thread's copies of every group but the N most recent land: src-size
 *     bytes copied, the rest of the 16 zero-filled. Uncommitted copies wait for their group.
 *   ex2.approx.ftz.f32: exp2f, subnormal results flushed to +0 (not the hardware's 2-ulp
 *     approximation).
 *   rcp.approx.ftz.f32, lg2.approx.ftz.f32: 1 / x and log2f, subnormals flushed to zero
 *     (correctly rounded, not the hardware's approximations).
 *   __shfl_xor_sync: full mask only.
 * Checks (abort with a message): shared addresses outside the launch's dynamic shared memory or
 * misaligned, cp.async sources and atomics outside every live cudaMalloc allocation.
 *
 * Launch checks as the hardware's: block size 1..1024, grid y and z <= 65535, no empty grid,
 * dynamic shared memory above 48 KiB only after cudaFuncSetAttribute raised the kernel's limit,
 * which fails above the device's opt-in (FP_CUDA_EMU_SMEM_KIB); the occupancy query answers 0
 * blocks above that limit.
 */
#include "backends/cuda/emu/cuda_emu.h"

#include "core/backend.h"

#include <dlfcn.h>
#include <float.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#if !defined(__x86_64__)
#error "the CUDA emulator's fiber switch is written for x86-64"
#endif

thread_local dim3 fp_emu_thread_idx, fp_emu_block_idx, fp_emu_block_dim, fp_emu_grid_dim;

/* Dynamic shared memory: the kernels' extern __shared__ fp_smem[], one per host thread. */
enum { SMEM_CAPACITY = 256 * 1024 };
extern thread_local __attribute__((aligned(128))) unsigned char fp_smem[];
thread_local __attribute__((aligned(128))) unsigned char fp_smem[SMEM_CAPACITY];

/* ---- fibers ------------------------------------------------------------------------------- */

extern "C" void fp_emu_switch(void **save_sp, void *next_sp);
extern "C" void fp_emu_fiber_start(void);
asm(R"(
    .text
    .globl fp_emu_switch
    .hidden fp_emu_switch
    .type fp_emu_switch, @function
fp_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size fp_emu_switch, .-fp_emu_switch

    .globl fp_emu_fiber_start
    .hidden fp_emu_fiber_start
    .type fp_emu_fiber_start, @function
fp_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size fp_emu_fiber_start, .-fp_emu_fiber_start
)");

enum { READY, WAIT_WARP, WAIT_BLOCK, DONE };
enum { OP_NONE, OP_MMA_F16, OP_MMA_BF16, OP_LDSM, OP_LDSM_T, OP_SHFL };
static const char *const op_name[] = {"none",     "mma f16",        "mma bf16",
                                      "ldmatrix", "ldmatrix.trans", "shfl.xor"};
enum { STACK_BYTES = 256 * 1024 };

struct copy {
    uint32_t dst;
    int bytes;
    const void *src;
    long group;
};

struct fiber {
    void *sp;
    char *stack;
    dim3 tid;
    int lin, state;
    struct copy *copies; /* cp.async queue */
    int ncopies, cap;
    long committed; /* groups committed so far */
};

struct warp {
    int size, live, arrived, op;
    uint32_t in[32][10];
    uint32_t out[32][4];
};

/* One host thread's execution state (a worker of a launch). */
struct worker {
    struct fiber *fibers;
    int nfibers_alloc;
    struct fiber *cur;
    void *sched_sp;
    int nthreads, live, bar_arrived;
    struct warp warps[32];
    const void *kernel;
    size_t smem;
    void (*body)(void *);
    void *closure;
};
static thread_local struct worker *W;

static void fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fatal(const char *fmt, ...)
{
    Dl_info info;
    const char *name =
        W && W->kernel && dladdr(W->kernel, &info) && info.dli_sname ? info.dli_sname : "?";
    fprintf(stderr, "cudaemu: kernel %s, block (%u,%u,%u)", name, fp_emu_block_idx.x,
            fp_emu_block_idx.y, fp_emu_block_idx.z);
    if (W && W->cur)
        fprintf(stderr, ", thread %d", W->cur->lin);
    fprintf(stderr, ": ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

static void drain_copies(struct fiber *f, long upto);

static void fiber_main(struct fiber *f)
{
    W->body(W->closure);
    drain_copies(f, f->committed + 1); /* the hardware completes them; nothing can read them */
    struct warp *w = &W->warps[f->lin / 32];
    if (w->arrived > 0)
        fatal("exited while %d lane(s) of its warp wait in %s", w->arrived, op_name[w->op]);
    f->state = DONE;
    w->live--;
    W->live--;
    if (W->bar_arrived > 0 && W->bar_arrived == W->live) {
        W->bar_arrived = 0;
        for (int i = 0; i < W->nthreads; i++)
            if (W->fibers[i].state == WAIT_BLOCK)
                W->fibers[i].state = READY;
    }
    fp_emu_switch(&f->sp, W->sched_sp);
    __builtin_unreachable();
}

static void fiber_reset(struct fiber *f)
{
    uint64_t *sp = (uint64_t *)(f->stack + STACK_BYTES) - 8;
    sp[0] = 0x1f80u | ((uint64_t)0x037fu << 32); /* default MXCSR and x87 control word */
    sp[1] = sp[2] = sp[5] = sp[6] = 0;           /* r15 r14 rbx rbp */
    sp[3] = (uint64_t)(uintptr_t)fiber_main;     /* r13: function */
    sp[4] = (uint64_t)(uintptr_t)f;              /* r12: argument */
    sp[7] = (uint64_t)(uintptr_t)fp_emu_fiber_start;
    f->sp = sp;
    f->state = READY;
    f->ncopies = 0;
    f->committed = 0;
}

/* Back to the scheduler until someone makes this fiber READY. */
static void block_here(int state)
{
    struct fiber *f = W->cur;
    f->state = state;
    fp_emu_switch(&f->sp, W->sched_sp);
}

static void ensure_fibers(int n)
{
    if (n <= W->nfibers_alloc)
        return;
    W->fibers = (struct fiber *)realloc(W->fibers, (size_t)n * sizeof *W->fibers);
    for (int i = W->nfibers_alloc; i < n; i++) {
        struct fiber *f = &W->fibers[i];
        memset(f, 0, sizeof *f);
        void *m = mmap(NULL, STACK_BYTES + 4096, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            fatal("cannot map a fiber stack");
        mprotect(m, 4096, PROT_NONE); /* guard page: an overflow faults */
        f->stack = (char *)m + 4096;
    }
    W->nfibers_alloc = n;
}

static void run_block(dim3 block_idx)
{
    fp_emu_block_idx = block_idx;
    memset(fp_smem, 0xff, W->smem);
    const dim3 bd = fp_emu_block_dim;
    W->live = W->nthreads;
    W->bar_arrived = 0;
    for (int i = 0; i < W->nthreads; i++) {
        struct fiber *f = &W->fibers[i];
        fiber_reset(f);
        f->lin = i;
        f->tid = dim3(i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y));
    }
    for (int w = 0; w < (W->nthreads + 31) / 32; w++) {
        W->warps[w].size = W->nthreads - 32 * w < 32 ? W->nthreads - 32 * w : 32;
        W->warps[w].live = W->warps[w].size;
        W->warps[w].arrived = 0;
    }
    while (W->live > 0) {
        int ran = 0;
        for (int i = 0; i < W->nthreads; i++) {
            struct fiber *f = &W->fibers[i];
            if (f->state != READY)
                continue;
            W->cur = f;
            fp_emu_thread_idx = f->tid;
            fp_emu_switch(&W->sched_sp, f->sp);
            ran = 1;
        }
        W->cur = NULL;
        if (!ran && W->live > 0) {
            int at_bar = 0, at_warp = 0;
            for (int i = 0; i < W->nthreads; i++) {
                at_bar += W->fibers[i].state == WAIT_BLOCK;
                at_warp += W->fibers[i].state == WAIT_WARP;
            }
            fatal("deadlock: %d thread(s) in __syncthreads, %d in warp collectives, %d exited",
                  at_bar, at_warp, W->nthreads - W->live);
        }
    }
}

/* ---- block-wide and warp-wide synchronization -------------------------------------------- */

void __syncthreads(void)
{
    if (++W->bar_arrived == W->live) {
        W->bar_arrived = 0;
        for (int i = 0; i < W->nthreads; i++)
            if (W->fibers[i].state == WAIT_BLOCK)
                W->fibers[i].state = READY;
        return;
    }
    block_here(WAIT_BLOCK);
}

static void compute_mma(struct warp *w, int bf16);
static void compute_ldsm(struct warp *w, int trans);
static void compute_shfl(struct warp *w);

/* The calling lane has filled w->in[lane]; returns once the warp's op is done (w->out). */
static struct warp *warp_op_arrive(int op)
{
    struct fiber *f = W->cur;
    struct warp *w = &W->warps[f->lin / 32];
    if (w->live != w->size || w->size != 32)
        fatal("%s in a warp of %d live lane(s) out of 32 (the instruction needs all 32)",
              op_name[op], w->live);
    if (w->arrived == 0)
        w->op = op;
    else if (w->op != op)
        fatal("lanes of warp %d diverge: this lane is at %s, %d lane(s) wait in %s", f->lin / 32,
              op_name[op], w->arrived, op_name[w->op]);
    if (++w->arrived < w->size) {
        block_here(WAIT_WARP);
        return w;
    }
    if (op == OP_MMA_F16 || op == OP_MMA_BF16)
        compute_mma(w, op == OP_MMA_BF16);
    else if (op == OP_LDSM || op == OP_LDSM_T)
        compute_ldsm(w, op == OP_LDSM_T);
    else
        compute_shfl(w);
    w->arrived = 0;
    const int base = f->lin / 32 * 32;
    for (int l = 0; l < w->size; l++)
        if (W->fibers[base + l].state == WAIT_WARP)
            W->fibers[base + l].state = READY;
    return w;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float half_value(uint32_t reg, int hi, int bf16)
{
    const uint16_t h = (uint16_t)(hi ? reg >> 16 : reg);
    return bf16 ? fp_bf16_to_f32(h) : fp_f16_to_f32(h);
}

static void compute_mma(struct warp *w, int bf16)
{
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        for (int r = 0; r < 4; r++)
            for (int e = 0; e < 2; e++)
                A[g + 8 * (r & 1)][2 * t + 8 * (r >> 1) + e] = half_value(w->in[l][r], e, bf16);
        for (int r = 0; r < 2; r++)
            for (int e = 0; e < 2; e++)
                B[2 * t + 8 * r + e][g] = half_value(w->in[l][4 + r], e, bf16);
        for (int i = 0; i < 4; i++)
            C[g + 8 * (i >> 1)][2 * t + (i & 1)] = bits_f32(w->in[l][6 + i]);
    }
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) {
            const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
            float sum = 0.0f;
            for (int k = 0; k < 16; k++)
                sum += A[row][k] * B[k][col];
            w->out[l][i] = f32_bits(C[row][col] + sum);
        }
    }
}

static const unsigned char *smem_at(uint32_t addr, const char *what)
{
    if (addr % 16 != 0 || (size_t)addr + 16 > W->smem)
        fatal("%s: shared address %u is %s (the launch has %zu bytes of dynamic shared memory)",
              what, addr, addr % 16 ? "not 16-byte aligned" : "out of bounds", W->smem);
    return fp_smem + addr;
}

static void compute_ldsm(struct warp *w, int trans)
{
    for (int i = 0; i < 4; i++) {
        uint16_t m[8][8];
        for (int row = 0; row < 8; row++)
            memcpy(m[row], smem_at(w->in[8 * i + row][0], "ldmatrix"), 16);
        for (int l = 0; l < 32; l++) {
            const int e = 2 * (l % 4);
            const uint16_t lo = trans ? m[e][l / 4] : m[l / 4][e];
            const uint16_t hi = trans ? m[e + 1][l / 4] : m[l / 4][e + 1];
            w->out[l][i] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
}

static void compute_shfl(struct warp *w)
{
    for (int l = 0; l < 32; l++) {
        const int lane_mask = (int)w->in[l][1], width = (int)w->in[l][2];
        const int src = l ^ lane_mask;
        /* a source outside the lane's segment of `width` lanes: the lane keeps its own value */
        w->out[l][0] = src / width == l / width && src < 32 ? w->in[src][0] : w->in[l][0];
    }
}

void fp_emu_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, int bf16)
{
    const int lane = W->cur->lin % 32;
    uint32_t *in = W->warps[W->cur->lin / 32].in[lane];
    memcpy(in, a, 16);
    in[4] = b0;
    in[5] = b1;
    for (int i = 0; i < 4; i++)
        in[6 + i] = f32_bits(c[i]);
    struct warp *w = warp_op_arrive(bf16 ? OP_MMA_BF16 : OP_MMA_F16);
    for (int i = 0; i < 4; i++)
        c[i] = bits_f32(w->out[lane][i]);
}

void fp_emu_ldmatrix_x4(uint32_t r[4], uint32_t addr, int trans)
{
    const int lane = W->cur->lin % 32;
    W->warps[W->cur->lin / 32].in[lane][0] = addr;
    struct warp *w = warp_op_arrive(trans ? OP_LDSM_T : OP_LDSM);
    memcpy(r, w->out[lane], 16);
}

uint32_t fp_emu_shfl_xor(unsigned mask, uint32_t bits, int lane_mask, int width)
{
    if (mask != 0xffffffffu)
        fatal("__shfl_xor_sync with mask %#x: the emulator supports the full mask only", mask);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fatal("__shfl_xor_sync with width %d", width);
    const int lane = W->cur->lin % 32;
    uint32_t *in = W->warps[W->cur->lin / 32].in[lane];
    in[0] = bits;
    in[1] = (uint32_t)lane_mask;
    in[2] = (uint32_t)width;
    return warp_op_arrive(OP_SHFL)->out[lane][0];
}

float fp_emu_ex2_approx_ftz(float x)
{
    const float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;
}

float fp_emu_rcp_approx_ftz(float x)
{
    if (fabsf(x) < FLT_MIN)
        x = copysignf(0.0f, x);
    const float y = 1.0f / x;
    return fabsf(y) < FLT_MIN ? copysignf(0.0f, y) : y;
}

float fp_emu_lg2_approx_ftz(float x)
{
    return log2f(fabsf(x) < FLT_MIN ? 0.0f : x);
}

size_t __cvta_generic_to_shared(const void *ptr)
{
    const unsigned char *p = (const unsigned char *)ptr;
    if (p < fp_smem || p >= fp_smem + SMEM_CAPACITY)
        fatal("__cvta_generic_to_shared(%p): not in the block's dynamic shared memory (static "
              "__shared__ variables are not emulated)",
              ptr);
    return (size_t)(p - fp_smem);
}

/* ---- device memory ------------------------------------------------------------------------ */

/* Live allocations, for the checks of cp.async sources and atomics. */
struct alloc {
    const char *base;
    size_t bytes;
};
static struct alloc *allocs;
static int nallocs, allocs_cap;
static pthread_mutex_t allocs_lock = PTHREAD_MUTEX_INITIALIZER;

static void check_global(const void *p, size_t bytes, const char *what)
{
    const char *c = (const char *)p;
    pthread_mutex_lock(&allocs_lock);
    int ok = 0;
    for (int i = 0; i < nallocs && !ok; i++)
        ok = c >= allocs[i].base && c + bytes <= allocs[i].base + allocs[i].bytes;
    pthread_mutex_unlock(&allocs_lock);
    if (!ok)
        fatal("%s: %zu bytes at %p are outside every cudaMalloc allocation", what, bytes, p);
}

/* ---- cp.async ----------------------------------------------------------------------------- */

void fp_emu_cp_async16(uint32_t dst, const void *src, int src_bytes)
{
    struct fiber *f = W->cur;
    smem_at(dst, "cp.async destination");
    if (src_bytes < 0 || src_bytes > 16)
        fatal("cp.async with src-size %d (0..16)", src_bytes);
    if ((uintptr_t)src % 16 != 0)
        fatal("cp.async source %p is not 16-byte aligned", src);
    if (src_bytes > 0)
        check_global(src, (size_t)src_bytes, "cp.async source");
    if (f->ncopies == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 64;
        f->copies = (struct copy *)realloc(f->copies, (size_t)f->cap * sizeof *f->copies);
    }
    f->copies[f->ncopies++] = {dst, src_bytes, src, f->committed};
}

/* Lands the thread's copies of groups < upto, in issue order. */
static void drain_copies(struct fiber *f, long upto)
{
    int kept = 0;
    for (int i = 0; i < f->ncopies; i++) {
        const struct copy c = f->copies[i];
        if (c.group < upto) {
            unsigned char *d = fp_smem + c.dst;
            memcpy(d, c.src, (size_t)c.bytes);
            memset(d + c.bytes, 0, (size_t)(16 - c.bytes));
        } else {
            f->copies[kept++] = c;
        }
    }
    f->ncopies = kept;
}

void fp_emu_cp_async_commit(void)
{
    W->cur->committed++;
}

void fp_emu_cp_async_wait(int n)
{
    drain_copies(W->cur, W->cur->committed - n);
}

/* ---- atomics ------------------------------------------------------------------------------ */

float atomicAdd(float *address, float value)
{
    if ((uintptr_t)address % 4 != 0)
        fatal("atomicAdd(float *) at misaligned %p", (void *)address);
    check_global(address, 4, "atomicAdd");
    uint32_t *u = reinterpret_cast<uint32_t *>(address);
    uint32_t old = __atomic_load_n(u, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(u, &old, f32_bits(bits_f32(old) + value), true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    return bits_f32(old);
}

float2 atomicAdd(float2 *address, float2 value)
{
    if ((uintptr_t)address % 8 != 0)
        fatal("atomicAdd(float2 *) at misaligned %p", (void *)address);
    float *p = reinterpret_cast<float *>(address);
    const float x = atomicAdd(p, value.x), y = atomicAdd(p + 1, value.y);
    return make_float2(x, y);
}

/* ---- launches ----------------------------------------------------------------------------- */

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_local cudaError_t last_error = cudaSuccess; /* per host thread, as in CUDA */

static cudaError_t fail(cudaError_t e)
{
    pthread_mutex_lock(&state_lock);
    last_error = e;
    pthread_mutex_unlock(&state_lock);
    return e;
}

/* The per-kernel limit set by cudaFuncSetAttribute (default 48 KiB). */
struct kernel_attr {
    const void *kernel;
    int max_dynamic_smem;
};
static struct kernel_attr kattrs[256];
static int nkattrs;

static int kernel_smem_limit(const void *kernel)
{
    for (int i = 0; i < nkattrs; i++)
        if (kattrs[i].kernel == kernel)
            return kattrs[i].max_dynamic_smem;
    return 48 * 1024;
}

static size_t optin_bytes(void)
{
    const char *s = getenv("FP_CUDA_EMU_SMEM_KIB");
    long kib = s && *s ? strtol(s, NULL, 10) : 227;
    if (kib < 48 || kib > 227)
        kib = 227;
    return (size_t)kib * 1024;
}

struct launch {
    const fp_emu_launch_cfg *cfg;
    const void *kernel;
    void (*body)(void *);
    void *closure;
    long nblocks, next;
};

static void *launch_worker(void *arg)
{
    struct launch *L = (struct launch *)arg;
    struct worker w;
    memset(&w, 0, sizeof w);
    W = &w;
    const dim3 g = L->cfg->grid, b = L->cfg->block;
    w.kernel = L->kernel;
    w.smem = L->cfg->smem;
    w.body = L->body;
    w.closure = L->closure;
    w.nthreads = (int)(b.x * b.y * b.z);
    fp_emu_block_dim = b;
    fp_emu_grid_dim = g;
    ensure_fibers(w.nthreads);
    for (;;) {
        const long i = __atomic_fetch_add(&L->next, 1, __ATOMIC_RELAXED);
        if (i >= L->nblocks)
            break;
        run_block(dim3((unsigned)(i % g.x), (unsigned)(i / g.x % g.y),
                       (unsigned)(i / ((long)g.x * g.y))));
    }
    for (int i = 0; i < w.nfibers_alloc; i++) {
        munmap(w.fibers[i].stack - 4096, STACK_BYTES + 4096);
        free(w.fibers[i].copies);
    }
    free(w.fibers);
    W = NULL;
    return NULL;
}

void fp_emu_launch(const void *kernel, const fp_emu_launch_cfg &cfg, void (*body)(void *),
                   void *closure)
{
    const dim3 g = cfg.grid, b = cfg.block;
    const long threads = (long)b.x * b.y * b.z;
    if (threads < 1 || threads > 1024 || b.z > 64) {
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535 || g.x > 0x7fffffffu) {
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    if (cfg.smem > (size_t)kernel_smem_limit(kernel)) {
        fail(cudaErrorInvalidValue);
        return;
    }
    struct launch L = {&cfg, kernel, body, closure, (long)g.x * g.y * g.z, 0};
    const char *s = getenv("FP_CUDA_EMU_THREADS");
    long nworkers = s && *s ? strtol(s, NULL, 10) : 1;
    if (nworkers < 1)
        nworkers = 1;
    if (nworkers > L.nblocks)
        nworkers = L.nblocks;
    pthread_t tids[64];
    int started = 0;
    for (long i = 1; i < nworkers && i < 64; i++)
        started += pthread_create(&tids[started], NULL, launch_worker, &L) == 0;
    launch_worker(&L);
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
}

/* ---- runtime API -------------------------------------------------------------------------- */

extern "C" {

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

/* FP_CUDA_EMU_SMEM_KIB (48..227, default 227) picks the device: 227 an H100/H200 (9.0, 132 SMs,
 * 228 KiB per SM), 163 .. 226 an A100 (8.0, 108 SMs, 164 KiB), less an RTX 30/40 (8.6, 84 SMs,
 * 100 KiB). */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (device != 0)
        return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    const size_t optin = optin_bytes();
    const int big = optin >= 227 * 1024, mid = optin >= 163 * 1024;
    snprintf(prop->name, sizeof prop->name, "flashport CUDA emulator (%zu KiB shared, %s-like)",
             optin / 1024,
             big   ? "sm_90"
             : mid ? "sm_80"
                   : "sm_86");
    prop->totalGlobalMem = (size_t)16 << 30;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = optin;
    prop->sharedMemPerMultiprocessor = optin + 1024;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsPerMultiProcessor = big || mid ? 2048 : 1536;
    prop->major = big ? 9 : 8;
    prop->minor = big || mid ? 0 : 6;
    prop->multiProcessorCount = big ? 132 : mid ? 108 : 84;
    return cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t err)
{
    switch (err) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
        return "cudaErrorInvalidResourceHandle";
    default:
        return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t err)
{
    switch (err) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    default:
        return "unknown error";
    }
}

cudaError_t cudaGetLastError(void)
{
    pthread_mutex_lock(&state_lock);
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    pthread_mutex_unlock(&state_lock);
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    pthread_mutex_lock(&state_lock);
    const cudaError_t e = last_error;
    pthread_mutex_unlock(&state_lock);
    return e;
}

/* 256-byte aligned like cudaMalloc, and poisoned (0xff): device memory starts undefined. */
cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    *ptr = NULL;
    const size_t rounded = (bytes + 255) / 256 * 256;
    void *p = aligned_alloc(256, rounded ? rounded : 256);
    if (!p)
        return fail(cudaErrorMemoryAllocation);
    memset(p, 0xff, rounded);
    pthread_mutex_lock(&allocs_lock);
    if (nallocs == allocs_cap) {
        allocs_cap = allocs_cap ? 2 * allocs_cap : 64;
        allocs = (struct alloc *)realloc(allocs, (size_t)allocs_cap * sizeof *allocs);
    }
    allocs[nallocs++] = {(const char *)p, bytes};
    pthread_mutex_unlock(&allocs_lock);
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    if (!ptr)
        return cudaSuccess;
    pthread_mutex_lock(&allocs_lock);
    int found = -1;
    for (int i = 0; i < nallocs && found < 0; i++)
        if (allocs[i].base == ptr)
            found = i;
    if (found >= 0)
        allocs[found] = allocs[--nallocs];
    pthread_mutex_unlock(&allocs_lock);
    if (found < 0)
        return fail(cudaErrorInvalidValue);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t)
{
    return cudaMalloc(ptr, bytes);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t)
{
    return cudaFree(ptr);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind)
{
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t)
{
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t)
{
    memset(ptr, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    return cudaSuccess;
}

struct fp_emu_event {
    double ms; /* the host clock at the last record */
};

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    *event = (cudaEvent_t)calloc(1, sizeof(struct fp_emu_event));
    return *event ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned)
{
    return cudaEventCreate(event);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    free(event);
    return cudaSuccess;
}

/* Streams are synchronous: everything before the record has finished when it runs. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    event->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t)
{
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t stop)
{
    *ms = (float)(stop->ms - start->ms);
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > optin_bytes())
        return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&state_lock);
    int i = 0;
    while (i < nkattrs && kattrs[i].kernel != func)
        i++;
    if (i == nkattrs && nkattrs < (int)(sizeof kattrs / sizeof kattrs[0]))
        nkattrs++;
    kattrs[i] = {func, value};
    pthread_mutex_unlock(&state_lock);
    return cudaSuccess;
}

/* From threads and shared memory only (the emulator does not know the register count). */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *kernel,
                                                          int block_size, size_t dynamic_smem)
{
    /* as the CUDA runtime: no block fits above the kernel's dynamic shared memory limit */
    if (dynamic_smem > (size_t)kernel_smem_limit(kernel)) {
        *blocks = 0;
        return cudaSuccess;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const int warps = (block_size + 31) / 32;
    int n = prop.maxThreadsPerMultiProcessor / 32 / (warps ? warps : 1);
    const size_t per_block = dynamic_smem + 1024; /* 1 KiB reserved per block */
    const int by_smem = (int)(prop.sharedMemPerMultiprocessor / per_block);
    *blocks = n < by_smem ? n : by_smem;
    if (*blocks > 32)
        *blocks = 32;
    return cudaSuccess;
}

/* cuda_backend.c is compiled with its entry renamed to this; the plugin is "cudaemu". */
flashport_status fp_cuda_emu_inner_entry(uint32_t core_api_version, const fp_host_api *host_api,
                                         const fp_backend_ops **ops);

__attribute__((visibility("default"))) flashport_status
flashport_plugin_entry(uint32_t core_api_version, const fp_host_api *host_api,
                       const fp_backend_ops **ops)
{
    static fp_backend_ops emu_ops;
    const fp_backend_ops *inner = NULL;
    const flashport_status st = fp_cuda_emu_inner_entry(core_api_version, host_api, &inner);
    if (st != FLASHPORT_OK)
        return st;
    emu_ops = *inner;
    emu_ops.name = "cudaemu";
    *ops = &emu_ops;
    return FLASHPORT_OK;
}

} /* extern "C" */
