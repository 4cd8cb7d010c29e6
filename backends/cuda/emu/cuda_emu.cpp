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
 *   The sm90 instructions (mbarrier, TMA and bulk copies, bulk reductions, named barriers,
 *   ld.acquire / red.release, setmaxnreg, wgmma): see their section below and docs/cuda_emu.md.
 *   Waits that spin on the GPU (mbarrier try_wait, ld.acquire) yield here; a round of the
 *   scheduler in which every live thread waits without anything changing is a hang.
 *
 * Launch checks as the hardware's: block size 1..1024, grid y and z <= 65535, no empty grid,
 * dynamic shared memory above 48 KiB only after cudaFuncSetAttribute raised the kernel's limit,
 * which fails above the device's opt-in (FP_CUDA_EMU_SMEM_KIB); the occupancy query answers 0
 * blocks above that limit.
 */
#include "backends/cuda/emu/cuda_emu.h"

#include "core/backend.h"

#include <cuda.h>

#include <dlfcn.h>
#include <sched.h>
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
extern thread_local __attribute__((aligned(1024))) unsigned char fp_smem[];
thread_local __attribute__((aligned(1024))) unsigned char fp_smem[SMEM_CAPACITY];

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

/* WAIT_POLL: a spinning wait (mbarrier try_wait, ld.acquire) that the scheduler resumes each
 * round to look again; WAIT_NBAR: a named barrier; WAIT_WG: a warpgroup's wgmma.wait_group. */
enum { READY, WAIT_WARP, WAIT_BLOCK, WAIT_POLL, WAIT_NBAR, WAIT_WG, DONE };
enum { OP_NONE, OP_MMA_F16, OP_MMA_BF16, OP_LDSM, OP_LDSM_T, OP_SHFL, OP_STSM };
static const char *const op_name[] = {"none",           "mma f16",  "mma bf16", "ldmatrix",
                                      "ldmatrix.trans", "shfl.xor", "stmatrix"};
enum { STACK_BYTES = 256 * 1024 };

struct copy {
    uint32_t dst;
    int bytes;
    const void *src;
    long group;
};

struct bulk_red {
    float *dst;
    uint32_t src, bytes;
    long group;
    uint64_t hash; /* of the source at the issue */
};

struct fiber {
    void *sp;
    char *stack;
    dim3 tid;
    int lin, state;
    struct copy *copies; /* cp.async queue */
    int ncopies, cap;
    long committed; /* groups committed so far */
    /* sm90: what the thread waits on (for the hang report), its bulk reductions (queued until
     * the wait_group that covers their group) and its wgmma issue and commit counts */
    uint32_t wait_bar, wait_parity;
    const int *wait_global;
    int wait_nbar;
    struct bulk_red *reds;
    int nreds, reds_cap;
    long bulk_committed, wg_issued, wg_committed;
};

struct warp {
    int size, live, arrived, op;
    uint32_t in[32][10];
    uint32_t out[32][4];
};

struct async_copy; /* a TMA or bulk copy in flight to shared memory (sm90, below) */
struct wg_state;   /* a warpgroup's wgmma instructions in flight (sm90, below) */
struct named_bar {
    int arrived, count;
};
struct static_var {
    const void *key;
    uint32_t offset;
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
    size_t smem;     /* the block's shared memory: the launch's dynamic bytes, then the static */
    size_t smem_dyn; /* the launch's dynamic bytes */
    struct static_var *statics; /* the block's static __shared__ variables so far */
    int nstatics, statics_cap;
    void (*body)(void *);
    void *closure;
    /* sm90 */
    int progress;  /* a fiber did something this round besides a wait that failed */
    int ext_polls; /* fibers of the round's failed waits that look at global memory */
    struct async_copy *acopies;
    int nacopies, acopies_cap;
    struct named_bar nbars[16];
    struct wg_state *wgs; /* 8: 1024 threads */
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
static void drain_reds(struct fiber *f, long upto);

static void fiber_main(struct fiber *f)
{
    W->body(W->closure);
    drain_copies(f, f->committed + 1); /* the hardware completes them; nothing can read them */
    drain_reds(f, f->bulk_committed + 1);
    struct warp *w = &W->warps[f->lin / 32];
    if (w->arrived > 0)
        fatal("exited while %d lane(s) of its warp wait in %s", w->arrived, op_name[w->op]);
    f->state = DONE;
    W->progress = 1;
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
    f->nreds = 0;
    f->bulk_committed = f->wg_issued = f->wg_committed = 0;
    f->wait_global = NULL;
}

/* Back to the scheduler until someone makes this fiber READY. */
static void block_here(int state)
{
    struct fiber *f = W->cur;
    f->state = state;
    if (state != WAIT_POLL)
        W->progress = 1;
    fp_emu_switch(&f->sp, W->sched_sp);
}

static void sm90_block_start(void);
static void sm90_block_end(void);
static void report_hang(void) __attribute__((noreturn));

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

static int count_state(int state)
{
    int n = 0;
    for (int i = 0; i < W->nthreads; i++)
        n += W->fibers[i].state == state;
    return n;
}

static void run_block(dim3 block_idx)
{
    fp_emu_block_idx = block_idx;
    W->smem = W->smem_dyn;
    W->nstatics = 0;
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
    sm90_block_start();
    double stalled_since = 0;
    while (W->live > 0) {
        int ran = 0;
        W->progress = 0;
        W->ext_polls = 0;
        for (int i = 0; i < W->nthreads; i++) {
            struct fiber *f = &W->fibers[i];
            if (f->state != READY && f->state != WAIT_POLL)
                continue;
            W->cur = f;
            fp_emu_thread_idx = f->tid;
            fp_emu_switch(&W->sched_sp, f->sp);
            ran = 1;
        }
        W->cur = NULL;
        if (ran && !W->progress && W->live > 0) {
            /* only failed waits: on shared memory nothing else can change them (a hang); on
             * global memory another block may (the deterministic mode's turns), for a while */
            if (!W->ext_polls)
                report_hang();
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            const double now = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
            if (stalled_since == 0)
                stalled_since = now;
            else if (now - stalled_since > 120)
                report_hang();
            sched_yield();
        } else {
            stalled_since = 0;
        }
        if (!ran && W->live > 0) {
            int at_bar = 0, at_warp = 0;
            for (int i = 0; i < W->nthreads; i++) {
                at_bar += W->fibers[i].state == WAIT_BLOCK;
                at_warp += W->fibers[i].state == WAIT_WARP;
            }
            fatal("deadlock: %d thread(s) in __syncthreads, %d in warp collectives, %d in named "
                  "barriers, %d in wgmma.wait_group, %d exited",
                  at_bar, at_warp, count_state(WAIT_NBAR), count_state(WAIT_WG),
                  W->nthreads - W->live);
        }
    }
    sm90_block_end();
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
static void compute_stsm(struct warp *w);

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
    else if (op == OP_STSM)
        compute_stsm(w);
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

static unsigned char *smem_at(uint32_t addr, const char *what)
{
    if (addr % 16 != 0 || (size_t)addr + 16 > W->smem)
        fatal("%s: shared address %u is %s (the block has %zu bytes of shared memory: %zu "
              "dynamic, then its static variables)",
              what, addr, addr % 16 ? "not 16-byte aligned" : "out of bounds", W->smem,
              W->smem_dyn);
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

/* stmatrix.x{num}(.trans): lanes 8i .. 8i+7 give the 16-byte rows of matrix i (i < num); lane l's
 * register i holds (row l / 4, elements 2 (l % 4), +1) of matrix i, or with .trans those
 * elements of column l / 4: the inverse of ldmatrix. in[l]: address, 4 registers, num, trans. */
static void compute_stsm(struct warp *w)
{
    const uint32_t num = w->in[0][5], trans = w->in[0][6];
    for (int l = 1; l < 32; l++)
        if (w->in[l][5] != num || w->in[l][6] != trans)
            fatal("lanes of warp %d disagree on stmatrix: lane 0 has .x%u%s, lane %d .x%u%s",
                  W->cur->lin / 32, num, trans ? ".trans" : "", l, w->in[l][5],
                  w->in[l][6] ? ".trans" : "");
    for (uint32_t i = 0; i < num; i++) {
        uint16_t m[8][8];
        for (int l = 0; l < 32; l++) {
            const int e = 2 * (l % 4);
            const uint32_t reg = w->in[l][1 + i];
            (trans ? m[e][l / 4] : m[l / 4][e]) = (uint16_t)reg;
            (trans ? m[e + 1][l / 4] : m[l / 4][e + 1]) = (uint16_t)(reg >> 16);
        }
        /* every row's address checked before any is written */
        unsigned char *rows[8];
        for (int row = 0; row < 8; row++)
            rows[row] = smem_at(w->in[8 * i + row][0], "stmatrix");
        for (int row = 0; row < 8; row++)
            memcpy(rows[row], m[row], 16);
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

void fp_emu_stmatrix(uint32_t addr, const uint32_t *r, int num, int trans)
{
    if (num != 1 && num != 2 && num != 4)
        fatal("stmatrix .x%d (x1, x2, x4)", num);
    const int lane = W->cur->lin % 32;
    uint32_t *in = W->warps[W->cur->lin / 32].in[lane];
    in[0] = addr;
    for (int i = 0; i < 4; i++)
        in[1 + i] = i < num ? r[i] : 0;
    in[5] = (uint32_t)num;
    in[6] = (uint32_t)(trans != 0);
    warp_op_arrive(OP_STSM);
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
    if (p < fp_smem || p >= fp_smem + W->smem)
        fatal("__cvta_generic_to_shared(%p): not in the block's shared memory", ptr);
    return (size_t)(p - fp_smem);
}

/* A static __shared__ variable (cuda_emu.h, FP_EMU_STATIC_SHARED): placed at its first
 * declaration the block executes, after the dynamic shared memory and the variables placed
 * before it, poisoned (0xff) like the rest; the block's total must fit the device's per-block
 * limit (FP_CUDA_EMU_SMEM_KIB), which counts static and dynamic shared memory together. */
static size_t optin_bytes(void);
void *fp_emu_static_shared(const void *key, size_t bytes, size_t align)
{
    for (int i = 0; i < W->nstatics; i++)
        if (W->statics[i].key == key)
            return fp_smem + W->statics[i].offset;
    const size_t off = (W->smem + align - 1) / align * align;
    if (off + bytes > optin_bytes() || off + bytes > SMEM_CAPACITY)
        fatal("a static __shared__ variable of %zu bytes does not fit: %zu bytes of dynamic shared "
              "memory and %zu of static variables before it, the block's limit is %zu",
              bytes, W->smem_dyn, W->smem - W->smem_dyn, optin_bytes());
    if (W->nstatics == W->statics_cap) {
        W->statics_cap = W->statics_cap ? 2 * W->statics_cap : 16;
        W->statics =
            (struct static_var *)realloc(W->statics, (size_t)W->statics_cap * sizeof *W->statics);
    }
    W->statics[W->nstatics++] = {key, (uint32_t)off};
    memset(fp_smem + W->smem, 0xff, off + bytes - W->smem);
    W->smem = off + bytes;
    return fp_smem + off;
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

static unsigned char *smem_range(uint32_t addr, size_t bytes, size_t align, const char *what);
/* The shared or global word an integer atomic works on (shared: the block runs on this host
 * thread, so a plain access is atomic) */
static int atomic_word_shared(const void *address, const char *what)
{
    const unsigned char *p = (const unsigned char *)address;
    if ((uintptr_t)address % 4 != 0)
        fatal("%s at misaligned %p", what, address);
    if (p >= fp_smem && p < fp_smem + SMEM_CAPACITY) {
        smem_range((uint32_t)(p - fp_smem), 4, 4, what);
        return 1;
    }
    check_global(address, 4, what);
    return 0;
}

int atomicAdd(int *address, int value)
{
    if (atomic_word_shared(address, "atomicAdd(int *)")) {
        const int old = *address;
        *address = (int)((unsigned)old + (unsigned)value);
        return old;
    }
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

unsigned atomicOr(unsigned *address, unsigned value)
{
    if (atomic_word_shared(address, "atomicOr(unsigned *)")) {
        const unsigned old = *address;
        *address = old | value;
        return old;
    }
    return __atomic_fetch_or(address, value, __ATOMIC_RELAXED);
}

unsigned atomicAdd(unsigned *address, unsigned value)
{
    const unsigned char *p = (const unsigned char *)address;
    if ((uintptr_t)address % 4 != 0)
        fatal("atomicAdd(unsigned *) at misaligned %p", (void *)address);
    if (p >= fp_smem && p < fp_smem + SMEM_CAPACITY) { /* shared: the block is on this thread */
        smem_at((uint32_t)(p - fp_smem) / 16 * 16, "atomicAdd(unsigned *) on shared memory");
        const unsigned old = *address;
        *address = old + value;
        return old;
    }
    check_global(address, 4, "atomicAdd");
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}

/* FNV-1a of shared bytes: an asynchronous read's source at its issue, compared at its completion
 * (a change between the two is a race the hardware may or may not see). */
static uint64_t bytes_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* ---- sm90: mbarrier ----------------------------------------------------------------------- *
 *
 * The barrier is its 8 bytes of shared memory, as on the GPU (so that a kernel writing over it
 * breaks it): bits 0-11 the pending arrivals of the current phase, 12-23 the expected count,
 * 24-47 the transaction count (signed), 48 the current phase's parity, 49-63 a tag that
 * mbarrier.init writes (a barrier used before its init, or written over, is reported).
 * mbarrier.arrive(.expect_tx) adds the bytes to the transaction count and removes one pending
 * arrival; a copy's complete_tx subtracts its bytes; a phase completes when both are 0 (the
 * pending count is reloaded, the parity flips). try_wait.parity p succeeds once the phase of
 * parity p has completed, i.e. the current parity is not p (a fresh barrier: p = 1 at once). */
enum : uint64_t { MBAR_TAG = 0x2b6d };
struct mbar {
    int pending, expected, tx, phase;
};

static unsigned char *smem_range(uint32_t addr, size_t bytes, size_t align, const char *what)
{
    if (addr % align != 0 || (size_t)addr + bytes > W->smem)
        fatal("%s: shared address %u (+%zu bytes) is %s (the block has %zu bytes of shared "
              "memory: %zu dynamic, then its static variables)",
              what, addr, bytes, addr % align ? "misaligned" : "out of bounds", W->smem,
              W->smem_dyn);
    return fp_smem + addr;
}

static struct mbar mbar_load(uint32_t bar, const char *what)
{
    uint64_t v;
    memcpy(&v, smem_range(bar, 8, 8, what), 8);
    if (v >> 49 != MBAR_TAG)
        fatal("%s: the mbarrier at shared address %u is not initialized (or was written over: "
              "%#llx)",
              what, bar, (unsigned long long)v);
    struct mbar m;
    m.pending = (int)(v & 0xfff);
    m.expected = (int)(v >> 12 & 0xfff);
    m.tx = (int)(v >> 24 & 0xffffff);
    if (m.tx & 0x800000)
        m.tx -= 0x1000000;
    m.phase = (int)(v >> 48 & 1);
    return m;
}

static void mbar_store(uint32_t bar, struct mbar m, const char *what)
{
    if (m.tx <= -(1 << 20) || m.tx >= (1 << 20))
        fatal("%s: the transaction count of the mbarrier at %u leaves the ISA's range: %d", what,
              bar, m.tx);
    if (m.pending == 0 && m.tx == 0) { /* the phase completes */
        m.phase ^= 1;
        m.pending = m.expected;
    }
    const uint64_t v = (uint64_t)m.pending | (uint64_t)m.expected << 12 |
                       (uint64_t)(m.tx & 0xffffff) << 24 | (uint64_t)m.phase << 48 | MBAR_TAG << 49;
    memcpy(fp_smem + bar, &v, 8);
    W->progress = 1;
}

/* TMA and bulk copies to shared memory, in flight until the moment they must have landed: a
 * wait on their barrier whose phase has all its arrivals and lacks only transaction bytes. */
struct emu_tmap { /* what the emulator's cuTensorMapEncodeTiled writes into a CUtensorMap */
    uint32_t tag, rank, esize, swizzle, oob_nan, pad0, pad1, pad2;
    const char *base;
    uint64_t dims[4], strides[3]; /* strides of dimensions 1 .. rank - 1, bytes */
    uint32_t box[4];
    uint32_t pad3[4];
};
static_assert(sizeof(struct emu_tmap) <= sizeof(CUtensorMap), "the emulator's map fits");
enum : uint32_t { TMAP_TAG = 0x7e450a90u };

struct async_copy {
    uint32_t bar, dst, bytes;
    uint64_t dst_hash;   /* the destination at the issue: nothing may write it in flight */
    const char *src;     /* a bulk copy; NULL: a tensor-map box */
    struct emu_tmap map; /* the box's map, as it was at the issue */
    int coords[4];
};

static void land_tma(const struct async_copy *c)
{
    const struct emu_tmap &m = c->map;
    const uint32_t es = m.esize, row = m.box[0] * es;
    long idx = 0;
    for (uint32_t i3 = 0; i3 < m.box[3]; i3++)
        for (uint32_t i2 = 0; i2 < m.box[2]; i2++)
            for (uint32_t i1 = 0; i1 < m.box[1]; i1++, idx++) {
                const int64_t x1 = (int64_t)c->coords[1] + i1, x2 = (int64_t)c->coords[2] + i2,
                              x3 = (int64_t)c->coords[3] + i3;
                const bool row_in = x1 >= 0 && (uint64_t)x1 < m.dims[1] && x2 >= 0 &&
                                    (uint64_t)x2 < m.dims[2] && x3 >= 0 && (uint64_t)x3 < m.dims[3];
                const char *src_row = m.base + x1 * (int64_t)m.strides[0] +
                                      x2 * (int64_t)m.strides[1] + x3 * (int64_t)m.strides[2];
                if (row_in) { /* the row's elements inside the tensor */
                    const int64_t lo = c->coords[0] < 0 ? -(int64_t)c->coords[0] : 0;
                    int64_t hi = (int64_t)m.dims[0] - c->coords[0];
                    if (hi > (int64_t)m.box[0])
                        hi = m.box[0];
                    if (hi > lo)
                        check_global(src_row + (c->coords[0] + lo) * (int64_t)es,
                                     (size_t)(hi - lo) * es, "TMA load source");
                }
                for (uint32_t i0 = 0; i0 < m.box[0]; i0++) {
                    const int64_t x0 = (int64_t)c->coords[0] + i0;
                    uint32_t L = c->dst + (uint32_t)idx * row + i0 * es;
                    if (m.swizzle == CU_TENSOR_MAP_SWIZZLE_128B)
                        L ^= ((L >> 7) & 7) << 4;
                    unsigned char *d = fp_smem + L;
                    if (row_in && x0 >= 0 && (uint64_t)x0 < m.dims[0])
                        memcpy(d, src_row + x0 * (int64_t)es, es);
                    else if (m.oob_nan)
                        memset(d, 0xff, es); /* a NaN of every float type */
                    else
                        memset(d, 0, es);
                }
            }
}

/* Lands the copies in flight on barrier bar, in issue order; returns how many. */
static int land_copies(uint32_t bar)
{
    int landed = 0, kept = 0;
    for (int i = 0; i < W->nacopies; i++) {
        struct async_copy *c = &W->acopies[i];
        if (c->bar != bar) {
            if (kept != i)
                W->acopies[kept] = *c;
            kept++;
            continue;
        }
        if (bytes_hash(fp_smem + c->dst, c->bytes) != c->dst_hash)
            fatal("a %s copy's shared destination at %u (%u bytes) was written while it was in "
                  "flight (between the issue and its barrier's wait)",
                  c->src ? "bulk" : "TMA", c->dst, c->bytes);
        if (c->src)
            memcpy(fp_smem + c->dst, c->src, c->bytes);
        else
            land_tma(c);
        struct mbar m = mbar_load(bar, "complete_tx");
        m.tx -= (int)c->bytes;
        mbar_store(bar, m, "complete_tx");
        landed++;
    }
    W->nacopies = kept;
    return landed;
}

static struct async_copy *new_copy(uint32_t bar, uint32_t dst, uint32_t bytes)
{
    mbar_load(bar, "the completion barrier of a TMA / bulk copy");
    if (W->nacopies == W->acopies_cap) {
        W->acopies_cap = W->acopies_cap ? 2 * W->acopies_cap : 64;
        W->acopies =
            (struct async_copy *)realloc(W->acopies, (size_t)W->acopies_cap * sizeof *W->acopies);
    }
    struct async_copy *c = &W->acopies[W->nacopies++];
    memset(c, 0, sizeof *c);
    c->bar = bar;
    c->dst = dst;
    c->bytes = bytes;
    c->dst_hash = bytes_hash(fp_smem + dst, bytes);
    W->progress = 1;
    return c;
}

void fp_emu_mbar_init(uint32_t bar, uint32_t count)
{
    smem_range(bar, 8, 8, "mbarrier.init");
    if (count < 1 || count > 4095)
        fatal("mbarrier.init with count %u (the emulator models 1 .. 4095)", count);
    for (int i = 0; i < W->nacopies; i++)
        if (W->acopies[i].bar == bar)
            fatal("mbarrier.init of the barrier at %u while copies are in flight on it", bar);
    struct mbar m = {(int)count, (int)count, 0, 0};
    mbar_store(bar, m, "mbarrier.init");
}

void fp_emu_mbar_arrive(uint32_t bar, uint32_t expect_tx_bytes)
{
    const char *what = expect_tx_bytes ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive";
    struct mbar m = mbar_load(bar, what);
    if (m.pending == 0)
        fatal("%s on the barrier at %u, whose phase has had all its %d arrivals (it waits for "
              "%d transaction bytes)",
              what, bar, m.expected, m.tx);
    m.tx += (int)expect_tx_bytes;
    m.pending--;
    mbar_store(bar, m, what);
}

void fp_emu_mbar_wait(uint32_t bar, uint32_t parity)
{
    struct fiber *f = W->cur;
    for (;;) {
        const struct mbar m = mbar_load(bar, "mbarrier.try_wait.parity");
        if (m.phase != (int)(parity & 1)) {
            W->progress = 1;
            return;
        }
        if (m.pending == 0 && land_copies(bar) > 0)
            continue;
        f->wait_bar = bar;
        f->wait_parity = parity;
        f->wait_global = NULL;
        block_here(WAIT_POLL);
    }
}

/* ---- sm90: TMA and bulk copies ------------------------------------------------------------ */

static const struct emu_tmap *tmap_of(const void *tmap, const char *what)
{
    const struct emu_tmap *m = (const struct emu_tmap *)tmap;
    if ((uintptr_t)tmap % 64 != 0 || m->tag != TMAP_TAG)
        fatal("%s: %p is not a tensor map the emulator's cuTensorMapEncodeTiled wrote", what, tmap);
    return m;
}

void fp_emu_tma_check(const void *tmap)
{
    tmap_of(tmap, "prefetch.tensormap");
}

void fp_emu_tma_load(uint32_t dst, const void *tmap, uint32_t bar, const int *coords, int rank)
{
    const struct emu_tmap *m = tmap_of(tmap, "cp.async.bulk.tensor");
    if ((uint32_t)rank != m->rank)
        fatal("cp.async.bulk.tensor.%dd with a map of rank %u", rank, m->rank);
    const uint32_t bytes = m->box[0] * m->box[1] * m->box[2] * m->box[3] * m->esize;
    smem_range(dst, bytes, m->swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 1024 : 128,
               "cp.async.bulk.tensor destination");
    struct async_copy *c = new_copy(bar, dst, bytes);
    c->map = *m;
    for (int i = 0; i < 4; i++)
        c->coords[i] = i < rank ? coords[i] : 0;
}

void fp_emu_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    if (bytes == 0 || bytes % 16 != 0 || (uintptr_t)src % 16 != 0)
        fatal("cp.async.bulk of %u bytes from %p (a multiple of 16, 16-byte aligned)", bytes, src);
    smem_range(dst, bytes, 16, "cp.async.bulk destination");
    check_global(src, bytes, "cp.async.bulk source");
    new_copy(bar, dst, bytes)->src = (const char *)src;
}

void fp_emu_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes)
{
    struct fiber *f = W->cur;
    if (bytes == 0 || bytes % 16 != 0 || (uintptr_t)dst % 16 != 0)
        fatal("cp.reduce.async.bulk of %u bytes to %p (a multiple of 16, 16-byte aligned)", bytes,
              (void *)dst);
    smem_range(src, bytes, 16, "cp.reduce.async.bulk source");
    check_global(dst, bytes, "cp.reduce.async.bulk destination");
    if (f->nreds == f->reds_cap) {
        f->reds_cap = f->reds_cap ? 2 * f->reds_cap : 16;
        f->reds = (struct bulk_red *)realloc(f->reds, (size_t)f->reds_cap * sizeof *f->reds);
    }
    f->reds[f->nreds++] = {dst, src, bytes, f->bulk_committed, bytes_hash(fp_smem + src, bytes)};
}

void fp_emu_bulk_commit(void)
{
    W->cur->bulk_committed++;
}

/* The thread's reductions of groups < upto read their shared source now and add to global
 * memory (per element, atomically: other blocks add to the same rows). */
static void drain_reds(struct fiber *f, long upto)
{
    int kept = 0;
    for (int i = 0; i < f->nreds; i++) {
        const struct bulk_red r = f->reds[i];
        if (r.group >= upto) {
            f->reds[kept++] = r;
            continue;
        }
        if (bytes_hash(fp_smem + r.src, r.bytes) != r.hash)
            fatal("cp.reduce.async.bulk: its shared source at %u (%u bytes) changed between the "
                  "issue and the wait_group that completes it",
                  r.src, r.bytes);
        for (uint32_t e = 0; e < r.bytes / 4; e++) {
            float v;
            memcpy(&v, fp_smem + r.src + 4 * e, 4);
            uint32_t *u = reinterpret_cast<uint32_t *>(r.dst + e);
            uint32_t old = __atomic_load_n(u, __ATOMIC_RELAXED);
            while (!__atomic_compare_exchange_n(u, &old, f32_bits(bits_f32(old) + v), true,
                                                __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                ;
        }
    }
    f->nreds = kept;
}

/* wait_group(.read) n: both complete the groups but the n most recent (the read and the write
 * happen together here). */
void fp_emu_bulk_wait(int n, int)
{
    drain_reds(W->cur, W->cur->bulk_committed - n);
}

int fp_emu_ld_acquire(const int *p)
{
    if ((uintptr_t)p % 4 != 0)
        fatal("ld.acquire at misaligned %p", (const void *)p);
    check_global(p, 4, "ld.acquire");
    /* a load that a spin loop repeats: the other threads of the block run first */
    struct fiber *f = W->cur;
    f->wait_global = p;
    W->ext_polls++;
    block_here(WAIT_POLL);
    f->wait_global = NULL;
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

void fp_emu_red_release(int *p, int v)
{
    if ((uintptr_t)p % 4 != 0)
        fatal("red.release at misaligned %p", (void *)p);
    check_global(p, 4, "red.release");
    __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
    W->progress = 1;
}

/* ---- sm90: registers and named barriers --------------------------------------------------- */

void fp_emu_setmaxnreg(int n)
{
    if (n < 24 || n > 256 || n % 8 != 0)
        fatal("setmaxnreg %d (24 .. 256, a multiple of 8)", n);
    if (fp_emu_block_dim.x * fp_emu_block_dim.y * fp_emu_block_dim.z % 128 != 0)
        fatal("setmaxnreg in a block of %u threads (whole warpgroups only)",
              fp_emu_block_dim.x * fp_emu_block_dim.y * fp_emu_block_dim.z);
}

/* bar.sync / bar.arrive id, threads: the barrier completes when `threads` have arrived; those
 * that sync wait for it. */
void fp_emu_named_bar(int id, int threads, int wait)
{
    if (id < 0 || id > 15 || threads <= 0 || threads % 32 != 0 ||
        threads > (W->nthreads + 31) / 32 * 32)
        fatal("bar.%s %d, %d (barrier 0 .. 15, a multiple of 32 threads up to the block's %d)",
              wait ? "sync" : "arrive", id, threads, W->nthreads);
    struct named_bar *nb = &W->nbars[id];
    if (nb->arrived == 0)
        nb->count = threads;
    else if (nb->count != threads)
        fatal("bar.%s %d, %d while %d thread(s) wait at it for %d", wait ? "sync" : "arrive", id,
              threads, nb->arrived, nb->count);
    W->progress = 1;
    if (++nb->arrived == threads) {
        nb->arrived = 0;
        for (int i = 0; i < W->nthreads; i++)
            if (W->fibers[i].state == WAIT_NBAR && W->fibers[i].wait_nbar == id)
                W->fibers[i].state = READY;
        return;
    }
    if (wait) {
        W->cur->wait_nbar = id;
        block_here(WAIT_NBAR);
    }
}

/* ---- sm90: wgmma -------------------------------------------------------------------------- *
 *
 * wgmma.mma_async is issued by each thread of the warpgroup (128 threads); the emulator records
 * its operands per thread (the accumulator's address, the A fragment's registers, checking that
 * the 128 agree on shape, descriptors and immediates) and computes at the wgmma.wait_group that
 * covers its group (the latest moment the ISA allows), once all 128 threads have arrived there.
 * Between the issue and that wait the accumulators read as NaN (the ISA leaves them undefined),
 * their values at the issue kept for the product. The shared-memory operands are read when the
 * first thread issues (a hash) and at the wait (the product): a difference (a write to them
 * after an issue, which nothing orders before the asynchronous read, or before the wait) stops
 * the run. */
struct wg_op {
    int n, dtype, ta, tb, scale_d, has_a, contributions;
    uint64_t adesc, bdesc, hash; /* hash: the shared operands when the first thread issued */
    long group;
    float *d[128];
    uint32_t a[128][4];
    unsigned char has_init[128];
    float *init; /* [128][128]: a lane's accumulators at the issue, where no earlier op pends */
};
struct wg_state {
    struct wg_op *ops;
    int nops, cap;
    long base; /* issue number of ops[0] */
    int arrived, wait_n;
    long wait_committed, wait_issued;
};
enum { MAX_WG = 8 };

static void wg_reset(void)
{
    if (!W->wgs)
        W->wgs = (struct wg_state *)calloc(MAX_WG, sizeof *W->wgs);
    for (int i = 0; i < MAX_WG; i++) {
        W->wgs[i].nops = 0;
        W->wgs[i].base = 0;
        W->wgs[i].arrived = 0;
    }
}

static float e4m3_value(uint8_t v)
{
    const int s = v >> 7, e = v >> 3 & 15, m = v & 7;
    float x;
    if (e == 15 && m == 7)
        x = NAN;
    else if (e == 0)
        x = ldexpf((float)m, -9);
    else
        x = ldexpf((float)(8 + m), e - 10);
    return s ? -x : x;
}

uint32_t fp_emu_f32_to_e4m3(float x)
{
    const uint32_t s = signbit(x) ? 0x80u : 0u;
    float a = fabsf(x);
    if (isnan(a))
        return s | 0x7fu;
    if (a >= 448.0f) /* satfinite */
        return s | 0x7eu;
    if (a < ldexpf(1.0f, -6)) /* subnormal: steps of 2^-9, ties to even */
        return s | (uint32_t)nearbyintf(a * 512.0f);
    int e;
    frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
    e -= 1;        /* a in [2^e, 2^(e+1)) */
    uint32_t q = (uint32_t)nearbyintf((ldexpf(a, -e) - 1.0f) * 8.0f);
    if (q == 8) {
        q = 0;
        e++;
    }
    const uint32_t code = (uint32_t)(e + 7) << 3 | q;
    return s | (code > 0x7eu ? 0x7eu : code);
}

static float elem_value(const unsigned char *p, int dtype)
{
    if (dtype == FP_EMU_E4M3)
        return e4m3_value(*p);
    uint16_t h;
    memcpy(&h, p, 2);
    return dtype == FP_EMU_BF16 ? fp_bf16_to_f32(h) : fp_f16_to_f32(h);
}

/* Element (mn, k) of an operand in shared memory by its matrix descriptor, 128-byte swizzle
 * (the only mode the kernels use): K-major, rows of 128 bytes along K at (mn / 8) SBO +
 * (mn % 8) 128 (the instruction's K = 32 bytes within a row; LBO unused); MN-major, rows of
 * 128 bytes along M / N at (mn / (128 / es)) LBO + (k / 8) SBO + (k % 8) 128. The swizzle
 * permutes the 16-byte chunks by the address: bits 4-6 ^= bits 7-9. */
static float desc_elem(uint64_t desc, int mn, int k, int mn_major, int dtype, const char *what)
{
    const uint32_t start = (uint32_t)(desc & 0x3fff) << 4,
                   lbo = (uint32_t)(desc >> 16 & 0x3fff) << 4,
                   sbo = (uint32_t)(desc >> 32 & 0x3fff) << 4;
    const int es = dtype == FP_EMU_E4M3 ? 1 : 2;
    if (desc >> 62 != 1 || (desc >> 49 & 7) != 0)
        fatal("wgmma %s descriptor %#llx: the emulator models the 128-byte swizzle with base "
              "offset 0 only",
              what, (unsigned long long)desc);
    uint32_t L;
    if (!mn_major) {
        if (start % 128 + 32 > 128)
            fatal("wgmma %s descriptor: a K-major start address %u whose 32 bytes cross a "
                  "128-byte row",
                  what, start);
        L = start + (uint32_t)(mn / 8) * sbo + (uint32_t)(mn % 8) * 128 + (uint32_t)(k * es);
    } else {
        const int per = 128 / es;
        L = start + (uint32_t)(mn / per) * lbo + (uint32_t)(k / 8) * sbo + (uint32_t)(k % 8) * 128 +
            (uint32_t)((mn % per) * es);
    }
    L ^= ((L >> 7) & 7) << 4;
    return elem_value(smem_range(L, (size_t)es, 1, what), dtype);
}

/* The shared operands' values, in the order the product reads them. */
static uint64_t wgmma_operand_hash(const struct wg_op *op)
{
    const int K = op->dtype == FP_EMU_E4M3 ? 32 : 16;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int m = 0; m < 64 && !op->has_a; m++)
        for (int k = 0; k < K; k++) {
            const float v = desc_elem(op->adesc, m, k, op->ta, op->dtype, "A");
            h = (h ^ f32_bits(v)) * 0x100000001b3ull;
        }
    for (int k = 0; k < K; k++)
        for (int n = 0; n < op->n; n++) {
            const float v = desc_elem(op->bdesc, n, k, op->tb, op->dtype, "B");
            h = (h ^ f32_bits(v)) * 0x100000001b3ull;
        }
    return h;
}

static void compute_wgmma(struct wg_op *op)
{
    const int N = op->n, K = op->dtype == FP_EMU_E4M3 ? 32 : 16;
    static thread_local float A[64][32], B[32][256];
    for (int l = 0; l < 128; l++) {
        const int warp = l / 32, g = (l % 32) >> 2, t = l & 3;
        if (!op->has_a)
            break;
        for (int r = 0; r < 4; r++) {
            const int row = 16 * warp + g + 8 * (r & 1);
            if (op->dtype == FP_EMU_E4M3) {
                for (int e = 0; e < 4; e++) {
                    A[row][4 * t + 16 * (r >> 1) + e] = e4m3_value((uint8_t)(op->a[l][r] >> 8 * e));
                }
            } else {
                for (int e = 0; e < 2; e++)
                    A[row][2 * t + 8 * (r >> 1) + e] =
                        half_value(op->a[l][r], e, op->dtype == FP_EMU_BF16);
            }
        }
    }
    if (!op->has_a)
        for (int m = 0; m < 64; m++)
            for (int k = 0; k < K; k++)
                A[m][k] = desc_elem(op->adesc, m, k, op->ta, op->dtype, "A");
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++)
            B[k][n] = desc_elem(op->bdesc, n, k, op->tb, op->dtype, "B");
    for (int l = 0; l < 128; l++) {
        const int warp = l / 32, g = (l % 32) >> 2, t = l & 3;
        float *d = op->d[l];
        const float *in = op->has_init[l] ? op->init + 128 * l : d;
        for (int i = 0; i < N / 2; i++) {
            const int row = 16 * warp + g + 8 * ((i >> 1) & 1),
                      col = 8 * (i >> 2) + 2 * t + (i & 1);
            float sum = 0.0f;
            for (int k = 0; k < K; k++)
                sum += A[row][k] * B[k][col];
            d[i] = op->scale_d ? in[i] + sum : sum;
        }
    }
}

void fp_emu_wgmma(float *d, int n, const uint32_t *a, uint64_t a_desc, uint64_t b_desc, int dtype,
                  int trans_a, int trans_b, int scale_d)
{
    struct fiber *f = W->cur;
    const int wgi = f->lin / 128, lane = f->lin % 128;
    if (W->nthreads < 128 * (wgi + 1))
        fatal("wgmma.mma_async in a block of %d threads (whole warpgroups only)", W->nthreads);
    if (n < 8 || n > 256 || n % 8 != 0 || (dtype == FP_EMU_E4M3 && (trans_a || trans_b)))
        fatal("wgmma.mma_async m64n%d (n 8 .. 256 by 8; e4m3 has no transpose)", n);
    struct wg_state *st = &W->wgs[wgi];
    const long idx = f->wg_issued++ - st->base;
    if (idx == st->nops) {
        if (st->nops == st->cap) {
            st->cap = st->cap ? 2 * st->cap : 16;
            st->ops = (struct wg_op *)realloc(st->ops, (size_t)st->cap * sizeof *st->ops);
            for (int i = st->nops; i < st->cap; i++)
                st->ops[i].init = (float *)malloc(128 * 128 * sizeof(float));
        }
        struct wg_op *op = &st->ops[st->nops++];
        op->n = n;
        op->dtype = dtype;
        op->ta = trans_a;
        op->tb = trans_b;
        op->scale_d = scale_d != 0;
        op->has_a = a != NULL;
        op->adesc = a ? 0 : a_desc;
        op->bdesc = b_desc;
        op->group = f->wg_committed;
        op->contributions = 0;
    } else if (idx < 0 || idx > st->nops) {
        fatal("wgmma.mma_async: this thread's issue #%ld does not match its warpgroup's (%ld "
              "pending from #%ld)",
              f->wg_issued - 1, (long)st->nops, st->base);
    }
    struct wg_op *op = &st->ops[idx];
    if (op->n != n || op->dtype != dtype || op->ta != trans_a || op->tb != trans_b ||
        op->scale_d != (scale_d != 0) || op->has_a != (a != NULL) ||
        op->adesc != (a ? 0 : a_desc) || op->bdesc != b_desc || op->group != f->wg_committed)
        fatal("the threads of warpgroup %d disagree on wgmma #%ld: this one has m64n%d, "
              "descriptors %#llx / %#llx, scale-d %d, group %ld; an earlier one m64n%d, "
              "%#llx / %#llx, %d, group %ld",
              wgi, f->wg_issued - 1, n, (unsigned long long)(a ? 0 : a_desc),
              (unsigned long long)b_desc, scale_d != 0, f->wg_committed, op->n,
              (unsigned long long)op->adesc, (unsigned long long)op->bdesc, op->scale_d, op->group);
    op->d[lane] = d;
    if (a)
        memcpy(op->a[lane], a, 16);
    /* the accumulators' value at the issue, unless an earlier pending op writes them */
    int earlier = 0;
    for (long i = 0; i < idx && !earlier; i++)
        earlier = st->ops[i].d[lane] == d;
    op->has_init[lane] = !earlier;
    if (!earlier) {
        memcpy(op->init + 128 * lane, d, (size_t)n / 2 * sizeof(float));
        for (int i = 0; i < n / 2; i++)
            d[i] = NAN;
    }
    if (op->contributions++ == 0)
        op->hash = wgmma_operand_hash(op);
    W->progress = 1;
}

void fp_emu_wgmma_commit(void)
{
    W->cur->wg_committed++;
}

void fp_emu_wgmma_wait(int n)
{
    struct fiber *f = W->cur;
    const int wgi = f->lin / 128;
    struct wg_state *st = &W->wgs[wgi];
    if (W->nthreads < 128 * (wgi + 1))
        fatal("wgmma.wait_group in a block of %d threads (whole warpgroups only)", W->nthreads);
    for (int i = 128 * wgi; i < 128 * wgi + 128; i++)
        if (W->fibers[i].state == DONE)
            fatal("wgmma.wait_group in warpgroup %d, whose thread %d has exited", wgi, i);
    if (st->arrived == 0) {
        st->wait_n = n;
        st->wait_committed = f->wg_committed;
        st->wait_issued = f->wg_issued;
    } else if (st->wait_n != n || st->wait_committed != f->wg_committed ||
               st->wait_issued != f->wg_issued) {
        fatal("the threads of warpgroup %d disagree at wgmma.wait_group: this one waits for %d "
              "with %ld wgmma in %ld groups, %d before it for %d with %ld in %ld",
              wgi, n, f->wg_issued, f->wg_committed, st->arrived, st->wait_n, st->wait_issued,
              st->wait_committed);
    }
    if (++st->arrived < 128) {
        block_here(WAIT_WG);
        return;
    }
    st->arrived = 0;
    int done = 0;
    while (done < st->nops && st->ops[done].group < f->wg_committed - n) {
        if (st->ops[done].contributions != 128)
            fatal("wgmma #%ld of warpgroup %d was issued by %d of its 128 threads", st->base + done,
                  wgi, st->ops[done].contributions);
        if (wgmma_operand_hash(&st->ops[done]) != st->ops[done].hash)
            fatal("wgmma #%ld of warpgroup %d: its shared-memory operands changed between its "
                  "issue and the wait_group that completes it",
                  st->base + done, wgi);
        compute_wgmma(&st->ops[done]);
        done++;
    }
    /* the computed ops' slots (with their buffers) go to the end */
    for (int i = 0; i < done; i++) {
        struct wg_op tmp = st->ops[0];
        memmove(st->ops, st->ops + 1, (size_t)(st->nops - 1) * sizeof *st->ops);
        st->ops[st->nops - 1] = tmp;
    }
    st->nops -= done;
    st->base += done;
    for (int i = 128 * wgi; i < 128 * wgi + 128; i++)
        if (W->fibers[i].state == WAIT_WG)
            W->fibers[i].state = READY;
    W->progress = 1;
}

/* ---- sm90: the block's life --------------------------------------------------------------- */

static void sm90_block_start(void)
{
    W->nacopies = 0;
    memset(W->nbars, 0, sizeof W->nbars);
    wg_reset();
}

static void sm90_block_end(void)
{
    W->nacopies = 0; /* copies nobody waited for: the block's shared memory is gone */
}

/* Every live thread waits in a spin that nothing in the block can end. */
static void report_hang(void)
{
    W->cur = NULL;
    for (int i = 0, shown = 0; i < W->nthreads && shown < 12; i++) {
        const struct fiber *f = &W->fibers[i];
        if (f->state != WAIT_POLL)
            continue;
        shown++;
        if (f->wait_global) {
            fprintf(stderr, "cudaemu:   thread %d spins on ld.acquire of %p (value %d)\n", i,
                    (const void *)f->wait_global, *f->wait_global);
            continue;
        }
        uint64_t v;
        memcpy(&v, fp_smem + f->wait_bar, 8);
        fprintf(stderr,
                "cudaemu:   thread %d waits for parity %u of the mbarrier at %u (pending %d of "
                "%d, tx %d, phase parity %d)\n",
                i, f->wait_parity, f->wait_bar, (int)(v & 0xfff), (int)(v >> 12 & 0xfff),
                (int)((v >> 24 & 0xffffff) ^ 0x800000) - 0x800000, (int)(v >> 48 & 1));
    }
    fatal("hang: %d thread(s) wait on mbarriers or global flags that no thread can complete, %d "
          "in named barriers, %d in __syncthreads, %d exited",
          count_state(WAIT_POLL), count_state(WAIT_NBAR), count_state(WAIT_BLOCK),
          W->nthreads - W->live);
}

/* cuTensorMapEncodeTiled, as the driver checks it (rank up to 4, no interleave, element strides
 * 1: what the emulator models), into the map's 128 bytes (struct emu_tmap). */
static CUresult emu_encode_tiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank,
                                 void *base, const cuuint64_t *dims, const cuuint64_t *strides,
                                 const cuuint32_t *box, const cuuint32_t *estr,
                                 CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill oob)
{
    static const uint32_t esize[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
    if (!map || (uintptr_t)map % 64 != 0 || (unsigned)type > CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ ||
        rank < 1 || rank > 4 || !base || (uintptr_t)base % 16 != 0 ||
        interleave != CU_TENSOR_MAP_INTERLEAVE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    struct emu_tmap m;
    memset(&m, 0, sizeof m);
    m.tag = TMAP_TAG;
    m.rank = rank;
    m.esize = esize[type];
    m.swizzle = swizzle;
    m.oob_nan = oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
    m.base = (const char *)base;
    for (uint32_t i = 0; i < 4; i++) {
        m.dims[i] = i < rank ? dims[i] : 1;
        m.box[i] = i < rank ? box[i] : 1;
        if (m.dims[i] == 0 || m.dims[i] > ((uint64_t)1 << 32) || m.box[i] == 0 || m.box[i] > 256 ||
            (i < rank && estr[i] != 1))
            return CUDA_ERROR_INVALID_VALUE;
        if (i + 1 < rank) {
            if (strides[i] % 16 != 0 || strides[i] >= ((uint64_t)1 << 40))
                return CUDA_ERROR_INVALID_VALUE;
            m.strides[i] = strides[i];
        }
    }
    const uint32_t inner = m.box[0] * m.esize;
    if (inner % 16 != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE) {
        const uint32_t span = swizzle == CU_TENSOR_MAP_SWIZZLE_128B  ? 128
                              : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                                                                     : 32;
        if (inner > span)
            return CUDA_ERROR_INVALID_VALUE;
        if (swizzle != CU_TENSOR_MAP_SWIZZLE_128B || inner != 128)
            return CUDA_ERROR_INVALID_VALUE; /* not modeled: the kernels' 128-byte rows only */
    }
    memset(map, 0, sizeof *map);
    memcpy(map, &m, sizeof m);
    return CUDA_SUCCESS;
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
    w.smem = w.smem_dyn = L->cfg->smem;
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
        free(w.fibers[i].reds);
    }
    free(w.fibers);
    free(w.acopies);
    free(w.statics);
    for (int i = 0; w.wgs && i < MAX_WG; i++) {
        for (int j = 0; j < w.wgs[i].cap; j++)
            free(w.wgs[i].ops[j].init);
        free(w.wgs[i].ops);
    }
    free(w.wgs);
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

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult *status)
{
    const bool known = strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
    *fn = known ? (void *)emu_encode_tiled : NULL;
    if (status)
        *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
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
