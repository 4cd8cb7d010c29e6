/*
 * The shared case table (see cases.h) and the code that turns a case into inputs and layouts.
 *
 * Coverage, as issue 2 asks: sequence lengths 1, 7, 63, 65, 129 and 1000 with Nq != Nk both
 * ways; head dims 1, 16, 32, 40, 64, 72, 80, 96, 128, 160, 192, 256; GQA 8:1 and MQA; varlen
 * batches with empty sequences; causal, sliding and two-sided windows; softcap; ALiBi; rows that
 * see no key (Nq > Nk with causal, windows that miss every key, empty key sequences); f32, f16
 * and bf16; fp8 e4m3 / e5m2 forward with o in bf16 / f16 and descales (forward only: every
 * backend must refuse their backward); packed-qkv, permuted and padded, and head-dim-strided
 * layouts. The N = 1000 cases and the N = 1100 sliding window dominate the run time; keep big
 * cases rare.
 */
#include "tests/cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* fp8 inputs (FP8_E4M3 / FP8_E5M2) with o in odt (BF16 / F16): forward only */
#define FP8(dt, odt, B, H, HKV, NQ, NK, D)                                                         \
    DENSE(dt, B, H, HKV, NQ, NK, D), .odtype = FLASHPORT_##odt
#define FP8_VARLEN(dt, odt, B, H, HKV, D) VARLEN(dt, B, H, HKV, D), .odtype = FLASHPORT_##odt
#define DESCALE(Q, K, V)                  .descale = {Q, K, V}

static const tc_case table[] = {
    /* head dims, f32 */
    {DENSE(F32, 1, 2, 2, 7, 7, 1), .quick = 1},
    {DENSE(F32, 2, 2, 1, 63, 65, 16), .causal = 1},
    {DENSE(F32, 1, 2, 2, 65, 63, 40)},
    {DENSE(F32, 2, 2, 2, 63, 63, 64), .causal = 1, .quick = 1},
    {DENSE(F32, 1, 3, 3, 65, 129, 72)},
    {DENSE(F32, 1, 2, 2, 129, 65, 80), .causal = 1},
    {DENSE(F32, 1, 2, 1, 63, 65, 96), .deterministic = 1},
    {DENSE(F32, 1, 2, 2, 65, 65, 128), .causal = 1},
    {DENSE(F32, 1, 1, 1, 63, 63, 160)},
    {DENSE(F32, 1, 2, 2, 65, 63, 192), .causal = 1},
    {DENSE(F32, 1, 1, 1, 63, 65, 256)},
    /* head dims, f16 */
    {DENSE(F16, 1, 2, 2, 7, 65, 1)},
    {DENSE(F16, 2, 2, 2, 65, 63, 16), .causal = 1},
    {DENSE(F16, 1, 4, 2, 63, 65, 32)},
    {DENSE(F16, 1, 2, 2, 65, 65, 40), .causal = 1},
    {DENSE(F16, 2, 2, 2, 63, 63, 64), .quick = 1},
    {DENSE(F16, 1, 2, 2, 65, 129, 72), .causal = 1},
    {DENSE(F16, 1, 2, 2, 129, 63, 80)},
    {DENSE(F16, 1, 2, 2, 63, 65, 96), .causal = 1},
    {DENSE(F16, 2, 2, 1, 65, 63, 128), .deterministic = 1},
    {DENSE(F16, 1, 2, 2, 63, 63, 160), .causal = 1},
    {DENSE(F16, 1, 2, 2, 65, 65, 192), .deterministic = 1},
    {DENSE(F16, 1, 2, 2, 129, 129, 256), .causal = 1},
    /* head dims, bf16 */
    {DENSE(BF16, 1, 2, 2, 65, 63, 16)},
    {DENSE(BF16, 1, 2, 2, 63, 65, 32), .causal = 1},
    {DENSE(BF16, 2, 2, 2, 65, 65, 64), .quick = 1},
    {DENSE(BF16, 1, 2, 2, 63, 63, 80), .causal = 1},
    {DENSE(BF16, 1, 2, 2, 65, 129, 96)},
    {DENSE(BF16, 1, 4, 1, 129, 65, 128), .causal = 1, .deterministic = 1},
    {DENSE(BF16, 1, 2, 2, 63, 65, 192)},
    {DENSE(BF16, 1, 2, 2, 65, 63, 256), .causal = 1, .deterministic = 1},
    /* sequence lengths: single tokens, Nq != Nk both ways, long; Nq > Nk causal masks rows */
    {DENSE(F32, 3, 2, 2, 1, 1, 64)},
    {DENSE(F16, 2, 4, 4, 1, 129, 64), .causal = 1},
    {DENSE(F32, 2, 2, 2, 7, 129, 64), .causal = 1},
    {DENSE(BF16, 2, 2, 2, 129, 7, 64), .causal = 1},
    {DENSE(F32, 8, 2, 2, 7, 7, 32), .causal = 1, .quick = 1},
    {DENSE(F32, 1, 2, 1, 1000, 1000, 64), .deterministic = 1},
    {DENSE(F16, 1, 2, 2, 1000, 1000, 128), .causal = 1},
    {DENSE(BF16, 1, 2, 2, 63, 1000, 64), .causal = 1},
    {DENSE(F16, 1, 2, 1, 1000, 129, 64), WINDOW(256, 0)},
    /* the CPU forward's 256-query blocks (sequences of 2048 or more), a partial last block;
     * their 64-query sub-blocks under a two-sided window that cuts key blocks */
    {DENSE(F32, 1, 1, 1, 2100, 2100, 32), .causal = 1},
    {DENSE(F16, 1, 1, 1, 2100, 2100, 32), WINDOW(100, 70)},
    /* ... and on the AVX-512 tables, where bf16 keeps its vdpbf16ps products in them */
    {DENSE(BF16, 1, 1, 1, 2100, 2100, 32), .causal = 1},
    /* GQA 8:1 and MQA */
    {DENSE(F32, 1, 16, 2, 65, 63, 64)},
    {DENSE(F16, 2, 8, 1, 63, 65, 64), .causal = 1, .deterministic = 1},
    {DENSE(BF16, 1, 16, 2, 65, 65, 128), .causal = 1},
    {DENSE(F32, 2, 4, 1, 7, 63, 32), .deterministic = 1, .quick = 1},
    /* ... long groups over few key blocks: GPU backends cut the group into slices whose partial
     * dK/dV they add afterwards (fp_plan_backward_group_splits on a 132-SM device: 4 slices of
     * 4 heads, 2 of 4), in both dQ modes */
    {DENSE(F16, 1, 16, 1, 300, 300, 64), .quick = 1},
    {DENSE(BF16, 1, 8, 1, 260, 260, 128), .causal = 1, .deterministic = 1},
    {DENSE(F16, 1, 8, 2, 200, 129, 64), .deterministic = 1},
    /* varlen batches, with empty sequences (no queries, no keys, or neither) */
    {VARLEN(F32, 4, 4, 2, 32), .causal = 1, .seqlens_q = {5, 0, 17, 33}, .seqlens_k = {9, 3, 0, 33},
     .quick = 1},
    {VARLEN(F16, 5, 2, 1, 64), WINDOW(32, 0), .seqlens_q = {1, 64, 0, 129, 7},
     .seqlens_k = {1, 70, 0, 65, 7}, .deterministic = 1},
    {VARLEN(BF16, 3, 8, 1, 128), .softcap = 5.0f, .alibi = 1, .seqlens_q = {65, 0, 1},
     .seqlens_k = {63, 2, 1}},
    {VARLEN(F32, 4, 2, 2, 64), .layout = TC_PACKED_QKV, .deterministic = 1,
     .seqlens_q = {13, 0, 50, 1}, .seqlens_k = {13, 0, 50, 1}},
    {VARLEN(F16, 3, 4, 2, 80), .causal = 1, .layout = TC_HEAD_MAJOR, .seqlens_q = {40, 7, 0},
     .seqlens_k = {17, 7, 0}},
    {VARLEN(F32, 3, 2, 2, 72), .alibi = 1, WINDOW(8, 8), .seqlens_q = {9, 0, 30},
     .seqlens_k = {0, 5, 31}},
    /* varlen at the largest head dim, a GQA group, deterministic (the sm90 D = 256 backward) */
    {VARLEN(BF16, 3, 8, 2, 256), .causal = 1, .deterministic = 1, .seqlens_q = {130, 0, 70},
     .seqlens_k = {129, 5, 200}},
    /* windows: causal sliding, two-sided, diagonal only, some rows seeing nothing */
    {DENSE(F32, 1, 2, 2, 129, 129, 64), .causal = 1, WINDOW(16, 0)},
    {DENSE(F32, 2, 2, 2, 65, 63, 32), WINDOW(8, 8)},
    {DENSE(F16, 1, 2, 2, 63, 65, 64), WINDOW(0, 0)},
    {DENSE(F32, 1, 2, 2, 65, 63, 16), WINDOW(2, 1), .quick = 1},
    {DENSE(BF16, 1, 2, 2, 129, 65, 64), WINDOW(-1, 3)},
    {DENSE(F32, 1, 2, 1, 63, 129, 40), WINDOW(4, -1), .deterministic = 1},
    {DENSE(F16, 1, 2, 2, 129, 129, 128), WINDOW(64, 64), .deterministic = 1},
    /* a sliding window wide enough for key blocks that every row of a 128-query block sees whole
     * between its two edges: the sm90 forward's edge blocks on both sides of full ones in one
     * tile. 12 heads make 108 tiles: enough that the CUDA launcher splits no key range (a split
     * would cut the window apart) and fewer than the H200's 132 SMs, so the kernel of one block
     * per tile takes it (FLASHPORT_CUDA_SM90_FWD_GRID=2 passes force the persistent one). */
    {DENSE(BF16, 1, 12, 2, 1100, 1100, 128), WINDOW(600, 0)},
    /* softcap, alone and with everything else */
    {DENSE(F32, 1, 2, 2, 65, 65, 64), .softcap = 2.0f, .quick = 1},
    {DENSE(F16, 1, 2, 2, 129, 129, 64), .softcap = 30.0f, .causal = 1, .scale = 1.0f},
    {DENSE(BF16, 1, 4, 2, 65, 63, 96), .softcap = 5.0f, .alibi = 1, WINDOW(16, 4)},
    {DENSE(F16, 1, 4, 2, 65, 129, 192), .softcap = 5.0f, .alibi = 1, WINDOW(16, 4)},
    {DENSE(F32, 1, 2, 1, 63, 65, 128), .softcap = 1.0f, .causal = 1, .deterministic = 1},
    /* The fuzzer's finding (docs/reliability.md): bf16, D = 1, softcap 30 at scale 3, causal with
     * Nq > Nk; rows whose dQ terms cancel, where the avx512bf16 table's bf16 dS rounding shows */
    {DENSE(BF16, 3, 3, 1, 50, 20, 1), .softcap = 30.0f, .scale = 3.0f, .range = 8.0f, .causal = 1,
     .deterministic = 1},
    /* ALiBi */
    {DENSE(F32, 1, 4, 4, 129, 129, 64), .alibi = 1, .causal = 1},
    {DENSE(F16, 1, 8, 2, 63, 65, 64), .alibi = 1},
    {DENSE(F32, 2, 2, 2, 7, 65, 16), .alibi = 1, .quick = 1},
    /* large logits: the online softmax must rescale often and far */
    {DENSE(F32, 1, 2, 2, 129, 129, 64), .scale = 1.0f, .range = 3.0f},
    {DENSE(F16, 1, 2, 2, 129, 65, 64), .scale = 1.0f, .range = 3.0f, .causal = 1},
    {DENSE(BF16, 1, 2, 2, 65, 129, 64), .scale = 0.5f, .range = 3.0f},
    /* ... at the GPU kernels' head dims, over several key blocks: they rescale only when a row's
     * maximum grows far (a kernel that never rescales fails the f16 ones) */
    {DENSE(F16, 1, 2, 2, 129, 300, 64), .scale = 1.0f, .range = 3.0f},
    {DENSE(BF16, 1, 2, 2, 129, 300, 128), .scale = 1.0f, .range = 3.0f},
    {DENSE(F16, 1, 2, 1, 200, 257, 256), .scale = 0.5f, .range = 3.0f, .causal = 1},
    /* layouts */
    {DENSE(F32, 2, 4, 2, 65, 65, 64), .layout = TC_PACKED_QKV, .quick = 1},
    {DENSE(F16, 1, 2, 2, 129, 129, 128), .layout = TC_PACKED_QKV, .causal = 1, .deterministic = 1},
    {DENSE(BF16, 2, 8, 1, 63, 63, 64), .layout = TC_PACKED_QKV, WINDOW(16, 16)},
    {DENSE(F32, 2, 2, 2, 63, 65, 40), .layout = TC_HEAD_MAJOR, WINDOW(8, 0), .quick = 1},
    {DENSE(F16, 1, 4, 2, 65, 63, 64), .layout = TC_HEAD_MAJOR, .alibi = 1, .deterministic = 1},
    {DENSE(F32, 1, 2, 2, 63, 65, 16), .layout = TC_DIM_STRIDED, .causal = 1},
    {DENSE(BF16, 1, 2, 1, 65, 63, 64), .layout = TC_DIM_STRIDED},
    /* fp8 forward (docs/semantics.md, "fp8"): e4m3 and e5m2 inputs, o in bf16 and f16, descales
     * != 1, masks, softcap, ALiBi, GQA, varlen, several key blocks (the running maximum moves
     * P's rounding), a key block of one (the CPU rounds against the final maximum there) */
    {FP8(FP8_E4M3, BF16, 1, 2, 2, 65, 63, 64), .quick = 1},
    {FP8(FP8_E4M3, F16, 2, 4, 2, 129, 129, 128), DESCALE(0.5f, 4.0f, 0.25f), .causal = 1},
    {FP8(FP8_E5M2, BF16, 1, 2, 2, 63, 65, 64), DESCALE(2.0f, 0.125f, 8.0f), .quick = 1},
    {FP8(FP8_E5M2, F16, 1, 4, 1, 65, 129, 96), .causal = 1},
    {FP8(FP8_E4M3, BF16, 1, 8, 1, 129, 300, 128), DESCALE(0.25f, 0.5f, 3.0f), .scale = 1.0f,
     .range = 3.0f},
    {FP8(FP8_E4M3, F16, 1, 2, 2, 129, 129, 256), .causal = 1, WINDOW(32, 0)},
    {FP8(FP8_E4M3, BF16, 1, 4, 2, 65, 63, 40), .softcap = 5.0f, .alibi = 1, WINDOW(16, 4)},
    {FP8(FP8_E5M2, BF16, 1, 2, 2, 129, 7, 64), .causal = 1},
    {FP8(FP8_E4M3, BF16, 2, 4, 2, 65, 65, 64), .layout = TC_PACKED_QKV, DESCALE(0, 2.0f, 0)},
    {FP8(FP8_E5M2, F16, 1, 4, 2, 63, 65, 32), .layout = TC_HEAD_MAJOR, .alibi = 1},
    {FP8(FP8_E4M3, F16, 1, 2, 1, 63, 65, 16), .layout = TC_DIM_STRIDED, .causal = 1},
    {FP8_VARLEN(FP8_E4M3, BF16, 4, 4, 2, 64), .causal = 1, DESCALE(1.5f, 0.75f, 2.0f),
     .seqlens_q = {5, 0, 17, 130}, .seqlens_k = {9, 3, 0, 140}, .quick = 1},
    {FP8_VARLEN(FP8_E5M2, F16, 3, 8, 1, 128), .softcap = 5.0f, WINDOW(32, 0),
     .seqlens_q = {65, 0, 1}, .seqlens_k = {200, 2, 1}},
    /* KV cache, dense with seqused_k: forward and backward, keys past seqused_k are NaN */
    {DENSE(F32, 3, 4, 2, 5, 100, 64), .causal = 1, .use_seqused = 1, .seqused = {100, 37, 0},
     .deterministic = 1, .quick = 1},
    {DENSE(BF16, 2, 8, 2, 1, 200, 128), .use_seqused = 1, .seqused = {150, 200}},
    {DENSE(F16, 2, 4, 1, 37, 129, 64), WINDOW(32, 0), .alibi = 1, .use_seqused = 1,
     .seqused = {129, 64}},
    {VARLEN(F16, 3, 4, 2, 64), .causal = 1, .seqlens_q = {1, 4, 0}, .seqlens_k = {65, 30, 10},
     .use_seqused = 1, .seqused = {40, 30, 0}},
    /* KV cache, paged (shuffled pages, forward only): decode Nq = 1, 4, 8, a prefill chunk of 37,
     * GQA 4:1 (the 32:8 of serving models scaled down), page sizes 16, 64 and 1 (host only) */
    {DENSE(F16, 3, 8, 2, 1, 200, 64), .page_size = 16, .use_seqused = 1, .seqused = {200, 77, 0},
     .quick = 1},
    {DENSE(BF16, 2, 8, 2, 4, 300, 128), .page_size = 64, .causal = 1, .use_seqused = 1,
     .seqused = {300, 129}},
    {DENSE(F32, 2, 4, 1, 8, 40, 32), .page_size = 1, .causal = 1, .softcap = 5.0f, .alibi = 1,
     .use_seqused = 1, .seqused = {40, 5}},
    {DENSE(F16, 2, 4, 2, 37, 160, 64), .page_size = 16, .causal = 1, .use_seqused = 1,
     .seqused = {160, 50}},
    {DENSE(BF16, 1, 8, 1, 8, 256, 64), .page_size = 64, WINDOW(100, 0), .use_seqused = 1,
     .seqused = {250}},
    {DENSE(F16, 2, 4, 4, 1, 129, 128), .page_size = 16, .alibi = 1, .softcap = 30.0f,
     .use_seqused = 1, .seqused = {129, 1}},
    {DENSE(F32, 2, 4, 2, 8, 100, 16), .page_size = 7, .use_seqused = 1, .seqused = {99, 12}},
    /* the CPU decode path's split-KV plan (one (batch, kv head) task for several threads) and
     * its chunks of a group of more than 64 query rows (32 heads x 4 rows on one kv head) */
    {DENSE(BF16, 1, 8, 1, 4, 700, 64), .causal = 1, .use_seqused = 1, .seqused = {650}},
    {DENSE(F16, 1, 4, 1, 1, 1000, 128), .page_size = 16, .use_seqused = 1, .seqused = {999}},
    {DENSE(F32, 1, 32, 1, 4, 300, 32), .alibi = 1, .softcap = 5.0f},
    /* the bf16 streaming steps (units of at most 4 rows, several kv heads a task): a key block
     * over pages of 16, a window that cuts blocks, a tail of D past 64; D past 128 */
    {DENSE(BF16, 2, 8, 4, 2, 300, 72), .page_size = 16, WINDOW(50, 0), .softcap = 10.0f,
     .use_seqused = 1, .seqused = {300, 90}},
    {DENSE(BF16, 1, 4, 2, 1, 333, 160), .alibi = 1},
    /* fp8 against a KV cache: decode rows (the CPU's flash path, not its decode path), dense with
     * seqused_k and paged with pages that a key block spans */
    {FP8(FP8_E4M3, BF16, 2, 8, 2, 4, 200, 64), DESCALE(0.5f, 2.0f, 1.5f), .causal = 1,
     .use_seqused = 1, .seqused = {200, 77}, .quick = 1},
    {FP8(FP8_E5M2, F16, 2, 4, 1, 1, 150, 64), .page_size = 16, .use_seqused = 1,
     .seqused = {150, 33}},
    {FP8(FP8_E4M3, BF16, 1, 4, 2, 37, 160, 128), .page_size = 7, .causal = 1, .use_seqused = 1,
     .seqused = {121}},
    /* Decode kernels (backends/cuda/decode/fwd.cuh, the HIP kernels' GQA packing): a group of 32
     * (two 16-row tiles of one kv head) on 256-key pages, long enough to split on an emulated
     * H200; speculative decoding Nq = 4 with a group of 8 (32 packed rows, causal); D = 256 on
     * 32-key pages (its 32-key blocks: one page each); D = 72 on the D = 128 kernel, seqused 1
     * and 0; an out-of-range block-table entry inside the used pages (GPU backends: masked). */
    {DENSE(BF16, 2, 32, 1, 1, 1000, 128), .page_size = 256, .use_seqused = 1,
     .seqused = {1000, 700}},
    {DENSE(F16, 1, 16, 2, 4, 300, 64), .causal = 1, .quick = 1},
    {DENSE(F16, 1, 8, 8, 1, 513, 256), .page_size = 32, .softcap = 20.0f, .use_seqused = 1,
     .seqused = {513}},
    {DENSE(BF16, 3, 8, 1, 1, 400, 72), .alibi = 1, .use_seqused = 1, .seqused = {400, 1, 0}},
    {DENSE(F16, 2, 8, 2, 1, 300, 64), .page_size = 16, .use_seqused = 1, .seqused = {280, 33},
     .hole_page = 1, .quick = 1},
    /* Whole blocks (every pair visible) at D = 256 with a softcap alone and with ALiBi alone: the
     * OpenCL FA2-shaped backward's fast path (full blocks without either) must not take them. */
    {DENSE(F16, 1, 2, 2, 65, 97, 256), .softcap = 10.0f},
    {DENSE(BF16, 1, 4, 2, 97, 65, 256), .alibi = 1},
};

const tc_case *tc_table(int *count)
{
    *count = (int)(sizeof table / sizeof table[0]);
    return table;
}

void tc_case_name(const tc_case *c, char *buf, size_t size)
{
    static const char *layouts[TC_LAYOUT_COUNT] = {"", " packed", " headmajor", " dimstride"};
    static const char *dtypes[] = {"f32", "f16", "bf16", "e4m3", "e5m2"};
    char seq[96] = "", win[32] = "", cap[24] = "", scale[24] = "", dt[16], ds[48] = "";
    if (c->dtype == FLASHPORT_FP8_E4M3 || c->dtype == FLASHPORT_FP8_E5M2) {
        snprintf(dt, sizeof dt, "%s>%s", dtypes[c->dtype], dtypes[c->odtype]);
        if (c->descale[0] > 0.0f || c->descale[1] > 0.0f || c->descale[2] > 0.0f)
            snprintf(ds, sizeof ds, " ds(%g,%g,%g)", (double)c->descale[0], (double)c->descale[1],
                     (double)c->descale[2]);
    } else {
        snprintf(dt, sizeof dt, "%s", dtypes[c->dtype]);
    }
    if (c->varlen) {
        int n = snprintf(seq, sizeof seq, "varlen");
        for (int b = 0; b < c->batch && n < (int)sizeof seq; b++)
            n += snprintf(seq + n, sizeof seq - (size_t)n, "%s%dx%d", b ? "," : " ",
                          c->seqlens_q[b], c->seqlens_k[b]);
    } else {
        snprintf(seq, sizeof seq, "N%dx%d", c->seqlen_q, c->seqlen_k);
    }
    if (c->window)
        snprintf(win, sizeof win, " win(%d,%d)", c->window_left, c->window_right);
    if (c->softcap > 0.0f)
        snprintf(cap, sizeof cap, " cap%g", c->softcap);
    if (c->scale > 0.0f)
        snprintf(scale, sizeof scale, " scale%g", c->scale);
    char kv[96] = "";
    if (c->use_seqused) {
        int n = snprintf(kv, sizeof kv, " used");
        for (int b = 0; b < c->batch && n < (int)sizeof kv; b++)
            n += snprintf(kv + n, sizeof kv - (size_t)n, "%s%d", b ? "," : " ", c->seqused[b]);
        if (c->page_size > 0 && n < (int)sizeof kv)
            snprintf(kv + n, sizeof kv - (size_t)n, " paged%d%s", c->page_size,
                     c->hole_page ? " hole" : "");
    }
    snprintf(buf, size, "%s B%d H%d/%d %s D%d%s%s%s%s%s%s%s%s%s", dt, c->batch, c->heads,
             c->kv_heads, seq, c->head_dim, c->causal ? " causal" : "", win, cap,
             c->alibi ? " alibi" : "", scale, ds, c->deterministic ? " det" : "", kv,
             layouts[c->layout]);
}

int tc_required(const tc_case *c, const char *backend_name, const char *arch)
{
    if (!strcmp(backend_name, "cpu") || !strcmp(backend_name, "reference"))
        return 1;
    const char *path = getenv("FLASHPORT_CUDA_PATH");
    if (tc_fp8(c))
        return !strcmp(backend_name, "cuda") && !strcmp(arch, "sm_90") &&
               !(path && !strcmp(path, "sm80")) && c->dtype == FLASHPORT_FP8_E4M3 &&
               !c->use_seqused && c->page_size == 0 && c->head_dim % 8 == 0 && c->head_dim <= 256 &&
               c->layout != TC_DIM_STRIDED;
    /* The KV-cache cases (seqused_k, paged) are required of the host backends and of opencl,
     * which serves both at any page size (fp8 aside, above); cuda and hip serve pages of a
     * multiple of 16 only and count the others as unsupported; a backend must pass whatever of
     * them it runs. */
    if (c->use_seqused)
        return !strcmp(backend_name, "opencl");
    /* FLASHPORT_CUDA_PATH=sm90 forces one path for tests and A/B runs: it serves what that path
     * serves (the sm90 backward: head dims up to 128), and refuses the rest */
    if (!strcmp(backend_name, "cuda") && path && !strcmp(path, "sm90"))
        return 0;
    return (c->dtype == FLASHPORT_F16 || c->dtype == FLASHPORT_BF16) && c->head_dim % 8 == 0 &&
           c->head_dim <= 256 && c->layout != TC_DIM_STRIDED;
}

static float *random_values(int64_t n, float range, flashport_dtype dtype, tu_rng *r)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; x && i < n; i++)
        x[i] = tu_round(tu_rng_uniform(r, -range, range), dtype);
    return x;
}

int tc_data_make(const tc_case *c, int index, tc_data *d)
{
    const int64_t B = c->batch, H = c->heads, Hkv = c->kv_heads, D = c->head_dim;
    memset(d, 0, sizeof *d);
    d->cu_q = malloc((size_t)(B + 1) * sizeof(int32_t));
    d->cu_k = malloc((size_t)(B + 1) * sizeof(int32_t));
    if (!d->cu_q || !d->cu_k) {
        tc_data_free(d);
        return -1;
    }
    d->cu_q[0] = d->cu_k[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        int nq = c->varlen ? c->seqlens_q[b] : c->seqlen_q;
        int nk = c->varlen ? c->seqlens_k[b] : c->seqlen_k;
        d->cu_q[b + 1] = d->cu_q[b] + nq;
        d->cu_k[b + 1] = d->cu_k[b] + nk;
        d->max_q = nq > d->max_q ? nq : d->max_q;
        d->max_k = nk > d->max_k ? nk : d->max_k;
    }
    d->total_q = d->cu_q[B];
    d->total_k = d->cu_k[B];

    tu_rng r = tu_rng_seed(0xf1a5000ull + (uint64_t)index);
    float range = c->range > 0.0f ? c->range : 2.0f;
    d->q = random_values(d->total_q * H * D, range, c->dtype, &r);
    d->k = random_values(d->total_k * Hkv * D, range, c->dtype, &r);
    d->v = random_values(d->total_k * Hkv * D, 1.0f, c->dtype, &r);
    d->dout = random_values(d->total_q * H * D, 1.0f, tc_out_dtype(c), &r);
    if (c->alibi) {
        d->alibi = malloc((size_t)H * sizeof(float));
        for (int64_t h = 0; d->alibi && h < H; h++)
            d->alibi[h] = exp2f(-8.0f * (float)(h + 1) / (float)H);
    }
    if (c->use_seqused) {
        d->used = malloc((size_t)B * sizeof(int32_t));
        for (int64_t b = 0; d->used && b < B; b++) {
            d->used[b] = c->seqused[b];
            /* Unused keys hold NaN: a backend that reads them fails the case. */
            for (int64_t j = d->cu_k[b] + c->seqused[b]; d->k && d->v && j < d->cu_k[b + 1]; j++)
                for (int64_t x = 0; x < Hkv * D; x++)
                    d->k[j * Hkv * D + x] = d->v[j * Hkv * D + x] = NAN;
        }
    }
    if (!d->q || !d->k || !d->v || !d->dout || (c->alibi && !d->alibi) ||
        (c->use_seqused && !d->used)) {
        tc_data_free(d);
        return -1;
    }

    flashport_attention_params_init(&d->params);
    d->params.scale = c->scale;
    d->params.causal = c->causal;
    if (c->window) {
        d->params.window_left = c->window_left;
        d->params.window_right = c->window_right;
    }
    d->params.softcap = c->softcap;
    d->params.alibi_slopes = d->alibi;
    d->params.deterministic = c->deterministic;
    d->params.descale_q = c->descale[0];
    d->params.descale_k = c->descale[1];
    d->params.descale_v = c->descale[2];
    d->params.seqused_k = d->used;
    if (c->varlen) {
        d->params.cu_seqlens_q = d->cu_q;
        d->params.cu_seqlens_k = d->cu_k;
        d->params.batch = c->batch;
        d->params.max_seqlen_q = (int32_t)d->max_q;
        d->params.max_seqlen_k = (int32_t)d->max_k;
    }

    tu_problem *p = &d->prob;
    p->dtype = c->dtype;
    p->o_dtype = tc_out_dtype(c);
    p->descale_q = c->descale[0];
    p->descale_k = c->descale[1];
    p->descale_v = c->descale[2];
    p->batch = B;
    p->heads = H;
    p->kv_heads = Hkv;
    p->head_dim = D;
    p->cu_q = d->cu_q;
    p->cu_k = d->cu_k;
    p->scale = c->scale > 0.0f ? c->scale : 1.0f / sqrtf((float)D);
    p->softcap = c->softcap;
    p->window_left = c->window ? c->window_left : -1;
    p->window_right = c->causal ? 0 : c->window ? c->window_right : -1;
    p->alibi = d->alibi;
    p->q = d->q;
    p->k = d->k;
    p->v = d->v;
    p->used_k = d->used;
    return 0;
}

void tc_data_free(tc_data *d)
{
    free(d->cu_q);
    free(d->cu_k);
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->dout);
    free(d->alibi);
    free(d->used);
    memset(d, 0, sizeof *d);
}

/* A view of `heads` heads over the case's q or k tokens, `row` elements apart per token and head
 * (row >= D pads), in token-major or head-major order, `dstride` apart along the head dim. */
static tu_view make_view(const tc_case *c, const tc_data *d, int is_q, int64_t heads,
                         int head_major, int64_t row, int64_t dstride)
{
    tu_view v;
    memset(&v, 0, sizeof v);
    v.varlen = c->varlen;
    v.nb = c->varlen ? 1 : c->batch;
    v.n = c->varlen ? (is_q ? d->total_q : d->total_k) : (is_q ? c->seqlen_q : c->seqlen_k);
    v.heads = heads;
    v.dim = c->head_dim;
    v.stride[3] = dstride;
    if (head_major) {
        v.stride[1] = row;
        v.stride[2] = v.n * row;
    } else {
        v.stride[1] = heads * row;
        v.stride[2] = row;
    }
    v.stride[0] = v.n * heads * row;
    return v;
}

int tc_plan_make(const tc_case *c, const tc_data *d, tc_layout layout, tc_plan *plan)
{
    const int64_t H = c->heads, Hkv = c->kv_heads, D = c->head_dim;
    static const int is_q[TC_TENSORS] = {1, 0, 0, 1, 1, 1, 0, 0};
    memset(plan, 0, sizeof *plan);
    for (int t = 0; t < TC_TENSORS; t++) {
        int64_t heads = is_q[t] ? H : Hkv;
        switch (layout) {
        case TC_HEAD_MAJOR:
            plan->view[t] = make_view(c, d, is_q[t], heads, 1, D + 3, 1);
            break;
        case TC_DIM_STRIDED:
            plan->view[t] = make_view(c, d, is_q[t], heads, 0, 2 * D, 2);
            break;
        default:
            plan->view[t] = make_view(c, d, is_q[t], heads, 0, D, 1);
            break;
        }
        plan->buffer[t] = t;
    }
    plan->buffers = TC_TENSORS;
    if (layout == TC_PACKED_QKV) {
        if (d->total_q != d->total_k || (!c->varlen && c->seqlen_q != c->seqlen_k))
            return -1;
        /* q | k | v heads side by side in one token row; the gradients the same way. */
        static const int group[TC_TENSORS] = {0, 0, 0, 1, 2, 3, 3, 3};
        static const int first_head[TC_TENSORS] = {0, 1, 2, 0, 0, 0, 1, 2};
        int64_t starts[3] = {0, H, H + Hkv};
        for (int t = 0; t < TC_TENSORS; t++) {
            if (t == TC_O || t == TC_DOUT) {
                plan->buffer[t] = group[t];
                continue;
            }
            tu_view *v = &plan->view[t];
            v->offset = starts[first_head[t]] * D;
            v->stride[1] = (H + 2 * Hkv) * D;
            v->stride[0] = v->n * v->stride[1];
            plan->buffer[t] = group[t];
        }
        plan->buffers = 4;
    }
    for (int t = 0; t < TC_TENSORS; t++) {
        int64_t ext = tu_view_extent(&plan->view[t]);
        int bi = plan->buffer[t];
        if (ext > plan->buffer_elems[bi])
            plan->buffer_elems[bi] = ext;
    }
    return 0;
}

int64_t tc_lse_elems(const tc_data *d)
{
    return d->prob.heads * d->total_q;
}

flashport_tensor tc_lse_tensor(const tc_case *c, const tc_data *d, void *base)
{
    flashport_tensor t;
    memset(&t, 0, sizeof t);
    t.data = base;
    t.dtype = FLASHPORT_F32;
    if (c->varlen) {
        t.rank = 2;
        t.shape[0] = c->heads;
        t.shape[1] = d->total_q;
        t.stride[0] = d->total_q;
        t.stride[1] = 1;
    } else {
        t.rank = 3;
        t.shape[0] = c->batch;
        t.shape[1] = c->heads;
        t.shape[2] = c->seqlen_q;
        t.stride[0] = (int64_t)c->heads * c->seqlen_q;
        t.stride[1] = c->seqlen_q;
        t.stride[2] = 1;
    }
    return t;
}

void tc_lse_to_logical(const tc_case *c, const tc_data *d, const float *lse, float *logical)
{
    if (c->varlen) {
        memcpy(logical, lse, (size_t)tc_lse_elems(d) * sizeof(float));
        return;
    }
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t h = 0; h < c->heads; h++)
            for (int64_t i = 0; i < c->seqlen_q; i++)
                logical[h * d->total_q + b * c->seqlen_q + i] =
                    lse[(b * c->heads + h) * c->seqlen_q + i];
}
