/*
 * Run-time choice of the CPU micro-kernel table (ukernel.h), after BLIS's context selection:
 * the library is built for the baseline architecture, each ISA file carries its own target flags,
 * and this file picks the best table the running CPU supports, once per process.
 *
 *   FLASHPORT_CPU_ISA unset or "auto": the first of avx512bf16, avx512, avx2 (x86-64) or neon
 *   (AArch64) that the CPU supports, else scalar.
 *   FLASHPORT_CPU_ISA=<name>: that table, or an error (never a fallback): an unknown name is
 *   FLASHPORT_ERR_INVALID_VALUE, a name this build or this CPU cannot run is
 *   FLASHPORT_ERR_UNSUPPORTED_FEATURE; the message lists what would run.
 *
 * Feature checks on x86-64: __builtin_cpu_supports for AVX2/FMA/AVX-512 F, BW, VL (it also checks
 * that the OS saves the vector state), CPUID for F16C (leaf 1 ECX bit 29) and AVX512_BF16 (leaf 7
 * sub-leaf 1 EAX bit 5), which not every compiler's __builtin_cpu_supports knows.
 *
 * "auto" on Intel cores (CPUID leaf 0's vendor string "GenuineIntel") runs the AVX-512 tables with
 * Intel's settings, as BLIS keeps one context per core family (docs/performance-cpu.md, the Intel
 * Xeon section, has the measurements):
 *   - the forward's f32 K and V staged once per thread and kv head (fwd_stage_f32) for its
 *     256-query tasks (fwd_block_q, which the AVX-512 tables set): there the products ran
 *     faster on the stage than on the caller's rows (H * d apart, crowding a few L1 sets);
 *   - bf16 forward and backward on the f32 products (bf16_as_f32): vdpbf16ps issues so much less
 *     often than vfmadd231ps there that its two multiply-adds a lane give fewer flops than the
 *     f32 products, and bf16 converted to f32 runs faster. Decode keeps its bf16 steps where
 *     few rows share a key (bandwidth-bound) and widens bf16 to f32 where many do.
 *   Only one Intel model (Emerald Rapids, docs/performance-cpu.md) was measured; other Intel cores
 *   with AVX512_BF16 are taken to be alike. Decided by the vendor, not by a measurement at run
 *   time, which would make the choice, and so the sums, vary from run to run.
 * AMD's AVX-512 cores (Zen 4, Zen 5) keep the tables as written, which were tuned there (f32 K and
 * V copied per key block into the 256-query tasks' tiles rather than staged per head on every
 * call, flash_fwd.c). A name in
 * FLASHPORT_CPU_ISA gives the table as written on every CPU (the tests run each one so, and the
 * two settings can be compared within one build).
 */
#include "backends/cpu/ukernel.h"

#include "core/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

typedef struct isa_entry {
    const char *name;
    const fp_ukernels *uk; /* NULL: not built for this architecture */
    int (*runs)(void);     /* the CPU supports it */
    const char *needs;     /* CPU features, for messages */
    int intel;             /* Intel's settings under "auto" on Intel cores */
} isa_entry;

static int always(void)
{
    return 1;
}

#if defined(__x86_64__) || defined(__i386__)
static int cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit)
{
    unsigned r[4] = {0, 0, 0, 0};
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3]))
        return 0;
    return (int)((r[reg] >> bit) & 1u);
}

static int has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           cpuid_bit(1, 0, 2, 29);
}

static int has_avx512(void)
{
    __builtin_cpu_init();
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

static int has_avx512bf16(void)
{
    return has_avx512() && cpuid_bit(7, 1, 0, 5);
}

static int is_intel(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return 0;
    return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu; /* "Genu" "ineI" "ntel" */
}
#else
#define has_avx2       always
#define has_avx512     always
#define has_avx512bf16 always
static int is_intel(void)
{
    return 0;
}
#endif

#if defined(FLASHPORT_UK_AVX2)
#define AVX2_TABLE (&fp_ukernels_avx2)
#else
#define AVX2_TABLE NULL
#endif
#if defined(FLASHPORT_UK_AVX512)
#define AVX512_TABLE (&fp_ukernels_avx512)
#else
#define AVX512_TABLE NULL
#endif
#if defined(FLASHPORT_UK_AVX512BF16)
#define AVX512BF16_TABLE (&fp_ukernels_avx512bf16)
#else
#define AVX512BF16_TABLE NULL
#endif
#if defined(FLASHPORT_UK_NEON)
#define NEON_TABLE (&fp_ukernels_neon)
#else
#define NEON_TABLE NULL
#endif

/* Best first; "auto" takes the first entry that is built and runs. intel: the table takes Intel's
 * settings under "auto" on Intel cores. */
static const isa_entry isa_table[] = {
    {"avx512bf16", AVX512BF16_TABLE, has_avx512bf16,
     "x86-64 with AVX-512 F, BW, VL and AVX512_BF16", 1},
    {"avx512", AVX512_TABLE, has_avx512, "x86-64 with AVX-512 F, BW, VL", 1},
    {"avx2", AVX2_TABLE, has_avx2, "x86-64 with AVX2, FMA and F16C", 0},
    {"neon", NEON_TABLE, always, "AArch64", 0},
    {"scalar", &fp_ukernels_scalar, always, "any CPU", 0},
};
enum { ISA_COUNT = sizeof isa_table / sizeof isa_table[0] };

/* The table "auto" runs from entry e: e's table, or on Intel cores a copy with Intel's settings.
 * Called once per process (pthread_once in fp_cpu_ukernels). */
static const fp_ukernels *auto_table(const isa_entry *e)
{
    static fp_ukernels tuned;
    static char describe[192];
    if (!e->intel || !is_intel())
        return e->uk;
    tuned = *e->uk;
    tuned.fwd_stage_f32 = 1;
    tuned.bf16_as_f32 = e->uk->gemm_bf16 != NULL;
    snprintf(describe, sizeof describe, "%s; Intel: f32 K and V staged in the forward%s",
             e->uk->describe, tuned.bf16_as_f32 ? ", bf16 on the f32 products" : "");
    tuned.describe = describe;
    return &tuned;
}

typedef struct isa_choice {
    flashport_status status;
    const fp_ukernels *uk;
    char why[256];
} isa_choice;

/* "avx512, avx2, scalar": the tables this process could run. */
static void runnable_list(char *buf, size_t size)
{
    buf[0] = '\0';
    for (int i = 0; i < ISA_COUNT; i++)
        if (isa_table[i].uk && isa_table[i].runs()) {
            size_t len = strlen(buf);
            snprintf(buf + len, size - len, "%s%s", len ? ", " : "", isa_table[i].name);
        }
}

static void choose(isa_choice *c)
{
    const char *env = getenv("FLASHPORT_CPU_ISA");
    char runnable[128];
    runnable_list(runnable, sizeof runnable);
    c->status = FLASHPORT_OK;
    c->uk = NULL;
    if (!env || !*env || strcmp(env, "auto") == 0) {
        for (int i = 0; i < ISA_COUNT && !c->uk; i++)
            if (isa_table[i].uk && isa_table[i].runs()) {
                c->uk = auto_table(&isa_table[i]);
                snprintf(c->why, sizeof c->why,
                         "best this CPU runs (runnable: %s; FLASHPORT_CPU_ISA overrides)",
                         runnable);
            }
        return;
    }
    for (int i = 0; i < ISA_COUNT; i++) {
        const isa_entry *e = &isa_table[i];
        if (strcmp(env, e->name) != 0)
            continue;
        if (!e->uk || !e->runs()) {
            c->status = FLASHPORT_ERR_UNSUPPORTED_FEATURE;
            snprintf(c->why, sizeof c->why,
                     "cpu: FLASHPORT_CPU_ISA=%s needs %s, which %s; this machine runs: %s", env,
                     e->needs, e->uk ? "this CPU is not" : "this build does not target", runnable);
            return;
        }
        c->uk = e->uk;
        snprintf(c->why, sizeof c->why, "FLASHPORT_CPU_ISA=%s", env);
        return;
    }
    c->status = FLASHPORT_ERR_INVALID_VALUE;
    snprintf(c->why, sizeof c->why,
             "cpu: FLASHPORT_CPU_ISA=%.40s is not an ISA name (auto, avx512bf16, avx512, avx2, "
             "neon, scalar); this machine runs: %.100s",
             env, runnable);
}

const fp_ukernels *fp_cpu_ukernels_find(const char *name)
{
    for (int i = 0; i < ISA_COUNT; i++)
        if (strcmp(name, isa_table[i].name) == 0 && isa_table[i].uk && isa_table[i].runs())
            return isa_table[i].uk;
    return NULL;
}

static isa_choice choice;
static pthread_once_t choice_once = PTHREAD_ONCE_INIT;

static void choose_once(void)
{
    choose(&choice);
}

flashport_status fp_cpu_ukernels(const fp_ukernels **uk, const char **why)
{
    pthread_once(&choice_once, choose_once);
    if (why)
        *why = choice.why;
    *uk = choice.uk;
    if (choice.status != FLASHPORT_OK)
        return fp_host()->set_error(choice.status, "%s", choice.why);
    return FLASHPORT_OK;
}
