#!/usr/bin/env python3
"""Side-by-side timing of flashport and PyTorch SDPA on one GPU (or the CPU), in one process.

Our kernels run through the flashport Python package (pip install .) on the very tensors that
SDPA reads: flashport takes torch tensors through DLPack and enqueues on torch's current stream,
so both sides are timed the same way, by triton.testing.do_bench on a GPU (CUDA events, median),
by the host clock on the CPU (median). Outputs are preallocated (the package's out= arguments),
so a timing is the call, not an allocation. SDPA runs with each backend forced: on a GPU flash
(FlashAttention-2), cuDNN and memory-efficient; on the CPU (--backend cpu) torch's CPU flash
kernel and math.

Grid (../shared/ANCHORS.md): B*N = 16384 tokens, H*D = 2048, D in {64, 128, 256}, N in {512,
2048, 8192, 16384}, causal and not, bf16 and fp16, forward and backward. --backend cpu defaults to
a laptop-sized grid (B*N = 4096, H*D = 512, D in {64, 128}, N in {512, 2048}, fp32 and bf16), and
--tokens / --hd change either grid. FLOPs by the FlashAttention convention: forward 4*B*H*N*N*D,
halved for causal; backward 2.5x forward.

GQA/MQA: --heads H:HKV,... runs the grid once per entry with H query heads and HKV kv heads
(B = tokens / N; --hd is then unused), SDPA with enable_gqa=True (an SDPA backend that refuses
GQA gets an empty time). Issue 16's GQA 8:1 and MQA 64:1 backward cases:

    python3 bench/compare_torch.py --dtypes bf16 --dims 128 --seqlens 2048,8192 \
        --heads 32:4,64:1 --impls fa2 --bwd-env FLASHPORT_CUDA_GROUP_SPLITS=auto,1

Before timing, every shape checks that our O, dQ, dK, dV agree with SDPA flash (relative L2 of the
difference; bf16 <= 2e-2, fp16 <= 5e-3, fp32 <= 1e-4 counts as agreement: both sides round P to
the dtype).

Writes into --out: compare_torch.md (table and ratios), compare_torch.csv (every timing),
compare_torch.png (TFLOP/s against N), and prints the markdown last.

--decode runs the KV-cache decode grid of issue 18 instead: B in {1, 16, 128}, Nk in {8192,
32768}, H:Hkv in {32:8, 64:8, 32:32, 32:1}, D in {128, 64}, Nq in {1, 4, 8} (no mask: SDPA's
is_causal is top-left aligned, ours bottom-right), our dense cache and paged caches (page 16 and
256, shuffled pages, seqused_k = Nk) against SDPA flash and cuDNN with enable_gqa (a backend that
refuses GQA gets K and V expanded to H heads, marked "expanded"), and a device-copy bandwidth
(a 4 GiB tensor copied, bytes read + written). Writes compare_torch_decode.{md,csv}: time, K/V
GB/s (the cache's bytes once), % of the copy. --decode-batches/-seqlens/-nq/-heads/-pages narrow
the grid.

    python3 bench/compare_torch.py --out out/                     # the installed package
    python3 bench/compare_torch.py --lib build/lib/libflashport.so --out out/
    python3 bench/compare_torch.py --backend cpu --out out/

--lib names a build tree's libflashport.so: the GPU plugin next to it is used instead of the
package's own (FLASHPORT_PLUGIN_PATH), so a rebuilt plugin is timed without reinstalling.

A/B runs of our backward: --bwd-env VAR=A,B,... times it once per value of the environment
variable VAR (read by the library at each call), checks each against SDPA flash, and adds a table
of the variants; the first value is the one in the main table. --fwd-env VAR=A,B,... does the
same for our forward (each variant's O is checked against SDPA flash). A value may repeat, as an
identical-code control column: its later columns are labelled VAR=value#n. --impls narrows the SDPA
backends that are timed (SDPA flash is always run once, for the agreement check).

Order per shape: SDPA flash and ours alternate --rounds times (default 2) and each keeps its
fastest round (the median of a timing within a round); then our deterministic backward and the
other SDPA backends, timed once.

fp8 (--dtypes fp8_e4m3 or fp8_e5m2, forward only): q, k, v drawn in float32 and quantized per
tensor (scale amax / 448, e5m2 amax / 57344; torch float8_e4m3fn / float8_e5m2 tensors, the
scales passed as descales); our fp8 forward (o in bf16) is timed beside our bf16 forward and the
SDPA backends on the dequantized inputs rounded to bf16, and each O's relative L2 error against
the float32 attention of the dequantized inputs (its last --ref-rows query rows against all keys,
an exact sub-problem under bottom-right masks) is reported: the fp8 issue's accuracy target
compares ours fp8 with ours bf16. A backend without an fp8 kernel gets an empty cell and a note.

    python3 bench/compare_torch.py --dtypes fp8_e4m3 --dims 128,256 --seqlens 4096,16384 --out out/
"""
import math
import argparse
import collections
import csv
import datetime
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashport


class Flashport:
    """Our forward and backward on preallocated torch tensors, through the package."""

    def __init__(self, backend):
        self.backend = backend
        if backend not in flashport.available_backends():
            raise SystemExit(f"flashport backend '{backend}' does not open here (available: "
                             f"{', '.join(flashport.available_backends())}; library "
                             f"{flashport.library_path()})")

    @staticmethod
    def params(causal, deterministic=False):
        return dict(causal=bool(causal), deterministic=bool(deterministic))

    def forward(self, params, q, k, v, o, lse):
        flashport.attention(q, k, v, causal=params["causal"], return_lse=True, out=(o, lse),
                            backend=self.backend)

    def backward(self, params, q, k, v, o, lse, do, dq, dk, dv):
        flashport.attention_backward(do, q, k, v, o, lse, causal=params["causal"],
                                     deterministic=params["deterministic"], out=(dq, dk, dv),
                                     backend=self.backend)


# SDPA backends by device; the first is the agreement reference ("SDPA flash"), the first two get
# ratio columns. Labels are the markdown table's column names.
SDPA_BY_DEVICE = {
    "cuda": {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "eff": SDPBackend.EFFICIENT_ATTENTION},
    "cpu": {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH},
}
LABELS = {"fa2": "FA2", "cudnn": "cuDNN", "eff": "mem-eff", "flash": "SDPA flash",
          "math": "SDPA math"}
SDPA = SDPA_BY_DEVICE["cuda"]
DEV = "cuda"
REF = "fa2"


def synchronize():
    if DEV == "cuda":
        torch.cuda.synchronize()


def rel_l2(x, ref):
    x, ref = x.float(), ref.float()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def bench_ms(fn, grad_to_none=None, rep=60):
    if DEV == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=15, rep=rep, grad_to_none=grad_to_none,
                                       return_mode="median")
    # The CPU: calls run synchronously; the median over `rep` ms (at least 3 calls, 1 warm-up).
    times, spent = [], 0.0
    for i in range(1000):
        for x in grad_to_none or []:
            x.grad = None
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        if i > 0:
            times.append(dt * 1e3)
            spent += dt * 1e3
        if len(times) >= 3 and spent >= rep:
            break
    return statistics.median(times)


def variant_label(env, n):
    """The impl label of A/B column n > 0 of env = (VAR, values): 'ours:VAR=value', plus '#n'
    where the value already appeared in an earlier column (an identical-code control), so that
    every column keeps its own row in the CSV and the tables."""
    label = f"ours:{env[0]}={env[1][n]}"
    return label if env[1][n] not in env[1][:n] else f"{label}#{n}"


def run_shape(fp, dtype, D, N, causal, args, bwd_env, fwd_env=None, heads=None):
    """heads: (H, HKV) of a GQA/MQA shape, else H = hd / D query and kv heads."""
    B = max(1, args.tokens // N)
    H, HKV = heads if heads else (max(1, args.hd // D),) * 2
    dev = DEV
    torch.manual_seed(N * 7 + D + causal)
    # Our layout is (B, N, H, D); SDPA reads the same memory as (B, H, N, D) views.
    q = torch.randn(B, N, H, D, device=dev, dtype=dtype)
    k = torch.randn(B, N, HKV, D, device=dev, dtype=dtype)
    v = torch.randn(B, N, HKV, D, device=dev, dtype=dtype)
    # enable_gqa only where the heads differ (older torch has no such argument)
    gqa = {"enable_gqa": True} if HKV != H else {}
    do = torch.randn(B, N, H, D, device=dev, dtype=dtype)
    o = torch.empty_like(q)
    lse = torch.empty(B, H, N, device=dev, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    prm = fp.params(causal)

    fwd_flops = 4.0 * B * H * N * N * D / (2.0 if causal else 1.0)
    bwd_flops = 2.5 * fwd_flops
    rows = []

    def record(impl, direction, ms, extra=""):
        flops = fwd_flops if direction == "fwd" else bwd_flops
        rows.append(dict(dtype=str(dtype).replace("torch.", ""), D=D, N=N, B=B, H=H, HKV=HKV,
                         causal=int(causal), impl=impl, direction=direction, ms=ms,
                         tflops=(flops / ms / 1e9) if ms == ms else float("nan"), note=extra,
                         o_rel_l2=float("nan")))

    def set_env(value):
        if bwd_env:
            os.environ[bwd_env[0]] = value

    # ours, forward and backward (checked against SDPA flash below), once per A/B column
    outs = []
    for value in (fwd_env[1] if fwd_env else [""]):
        if fwd_env:
            os.environ[fwd_env[0]] = value
        o.fill_(float("nan"))
        fp.forward(prm, q, k, v, o, lse)
        synchronize()
        outs.append(o.clone())
    if fwd_env:
        os.environ[fwd_env[0]] = fwd_env[1][0]
        fp.forward(prm, q, k, v, o, lse)
    grads = []
    for value in (bwd_env[1] if bwd_env else [""]):
        set_env(value)
        dq.fill_(float("nan"))
        dk.fill_(float("nan"))
        dv.fill_(float("nan"))
        fp.backward(prm, q, k, v, o, lse, do, dq, dk, dv)
        synchronize()
        grads.append((dq.clone(), dk.clone(), dv.clone()))

    agree, agree_alt = {}, {}
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))

    def sdpa(impl, backend):
        """SDPA with one backend forced: checks our results against it (flash), and returns its
        forward and backward times in ms if it is timed (else None)."""
        nonlocal agree
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), **gqa)
            out.backward(do.transpose(1, 2), retain_graph=True)
            synchronize()
            if impl == REF and not agree:
                ref_o = out.detach().transpose(1, 2)
                ref = [x.grad.transpose(1, 2) for x in (qt, kt, vt)]
                for n, g in enumerate(grads):
                    a = {"O": rel_l2(o, ref_o)} if n == 0 else {}
                    a.update({name: rel_l2(x, r) for name, x, r in zip(("dQ", "dK", "dV"), g,
                                                                       ref)})
                    if n == 0:
                        agree = a
                    else:
                        agree_alt[variant_label(bwd_env, n)] = a
                for n, x in enumerate(outs):
                    if n > 0:
                        agree_alt[variant_label(fwd_env, n)] = {"O": rel_l2(x, ref_o)}
                del ref
            times = None
            if impl in args.impls:
                times = (bench_ms(lambda: F.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=bool(causal), **gqa), rep=args.rep),
                    bench_ms(lambda: out.backward(do.transpose(1, 2), retain_graph=True),
                             grad_to_none=[qt, kt, vt], rep=args.rep))
            del out
        qt.grad = kt.grad = vt.grad = None
        return times

    def ours():
        """Our forward and backward times in ms, keyed (direction, A/B column): a value may
        repeat (an identical-code control column)."""
        t = {}
        for n, value in enumerate(fwd_env[1] if fwd_env else [""]):
            if fwd_env:
                os.environ[fwd_env[0]] = value
            t[("fwd", n)] = bench_ms(lambda: fp.forward(prm, q, k, v, o, lse),
                                            rep=args.rep)
        if fwd_env:
            os.environ[fwd_env[0]] = fwd_env[1][0]
        for n, value in enumerate(bwd_env[1] if bwd_env else [""]):
            set_env(value)
            t[("bwd", n)] = bench_ms(
                lambda: fp.backward(prm, q, k, v, o, lse, do, dq, dk, dv), rep=args.rep)
        set_env(bwd_env[1][0] if bwd_env else "")
        return t

    # SDPA flash and ours alternate, args.rounds times, and each keeps its fastest round; the
    # other SDPA backends come after them: a kernel timed right after cuDNN's runs a few per cent
    # slower than the same kernel timed again later (docs/bench/archive), so a single pass in a
    # fixed order would favour whichever side goes second.
    fa2_t, ours_t = [], []
    for r in range(args.rounds):
        if r == 0 or REF in args.impls:  # untimed, it runs once, for the agreement check
            fa2_t.append(sdpa(REF, SDPA[REF]))
        ours_t.append(ours())
    if fa2_t[0] is not None:
        record(REF, "fwd", min(t[0] for t in fa2_t))
        record(REF, "bwd", min(t[1] for t in fa2_t))
    for key in ours_t[0]:
        direction, n = key
        env = fwd_env if direction == "fwd" else bwd_env
        record("ours" if n == 0 else variant_label(env, n), direction,
               min(t[key] for t in ours_t))
    if args.det:
        prm_det = fp.params(causal, deterministic=True)
        record("ours-det", "bwd", bench_ms(
            lambda: fp.backward(prm_det, q, k, v, o, lse, do, dq, dk, dv), rep=args.rep))
    for impl, backend in SDPA.items():
        if impl == REF or impl not in args.impls:
            continue
        try:
            ms_f, ms_b = sdpa(impl, backend)
            record(impl, "fwd", ms_f)
            record(impl, "bwd", ms_b)
        except RuntimeError as e:  # a backend that refuses the shape
            record(impl, "fwd", float("nan"), str(e).splitlines()[0][:80])
            record(impl, "bwd", float("nan"), str(e).splitlines()[0][:80])
            qt.grad = kt.grad = vt.grad = None
    tol = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}[dtype]
    ok = bool(agree) and all(x <= tol for x in agree.values())
    for variant, a in agree_alt.items():
        if not all(x <= tol for x in a.values()):
            ok = False
            print(f"  {variant}: disagrees with SDPA flash: {a}", flush=True)
    return rows, agree, ok


# fp8 --dtypes: the torch dtype and the largest finite value of each format
FP8_FORMATS = {"fp8_e4m3": ("float8_e4m3fn", 448.0), "fp8_e5m2": ("float8_e5m2", 57344.0)}


def quantize(x, name):
    """x (float32) as float8 codes with one scale, amax / the format's largest finite value."""
    tname, fmax = FP8_FORMATS[name]
    scale = max(x.abs().max().item() / fmax, 1e-30)
    return (x / scale).to(getattr(torch, tname)), scale


def reference_rows(q, k, v, causal, rows):
    """float32 attention of the last `rows` query rows against every key, (B, rows, H, D): with
    Nq = Nk the bottom-right causal mask of those rows is exact without the other rows."""
    N, D = q.shape[1], q.shape[3]
    qs = q[:, N - rows:].float().transpose(1, 2)
    ks, vs = k.float().transpose(1, 2), v.float().transpose(1, 2)
    S = (qs @ ks.transpose(-1, -2)) / math.sqrt(D)
    if causal:
        i = torch.arange(N - rows, N, device=q.device)[:, None]
        j = torch.arange(N, device=q.device)[None, :]
        S = S.masked_fill(j > i, float("-inf"))
    return (torch.softmax(S, -1) @ vs).transpose(1, 2)


def run_fp8_shape(fp, name, D, N, causal, args):
    """fp8 forward timing and errors (see the top): rows (impl 'ours-fp8', 'ours' and the SDPA
    backends, forward only, each with o_rel_l2), {impl: error}."""
    B, H = max(1, args.tokens // N), max(1, args.hd // D)
    dev = DEV
    torch.manual_seed(N * 7 + D + causal)
    x = [torch.randn(B, N, H, D, device=dev) for _ in range(3)]
    (q8, sq), (k8, sk), (v8, sv) = (quantize(t, name) for t in x)
    del x
    deq = [t.float() * s for t, s in ((q8, sq), (k8, sk), (v8, sv))]
    bf = [t.to(torch.bfloat16) for t in deq]
    R = min(N, args.ref_rows)
    ref = reference_rows(*deq, causal, R)
    del deq
    o8 = torch.empty(B, N, H, D, device=dev, dtype=torch.bfloat16)
    ob = torch.empty_like(o8)
    lse = torch.empty(B, H, N, device=dev, dtype=torch.float32)
    flops = 4.0 * B * H * N * N * D / (2.0 if causal else 1.0)
    rows, errs = [], {}

    def record(impl, ms, err, note=""):
        errs[impl] = err
        rows.append(dict(dtype=name, D=D, N=N, B=B, H=H, causal=int(causal), impl=impl,
                         direction="fwd", ms=ms,
                         tflops=(flops / ms / 1e9) if ms == ms else float("nan"), note=note,
                         o_rel_l2=err))

    def ours_fp8():
        flashport.attention(q8, k8, v8, causal=bool(causal), return_lse=True, out=(o8, lse),
                            descale=(sq, sk, sv), backend=fp.backend)

    def ours_bf16():
        flashport.attention(*bf, causal=bool(causal), return_lse=True, out=(ob, lse),
                            backend=fp.backend)

    try:
        ours_fp8()
        synchronize()
        record("ours-fp8", bench_ms(ours_fp8, rep=args.rep), rel_l2(o8[:, N - R:], ref))
    except flashport.Error as e:
        record("ours-fp8", float("nan"), float("nan"), str(e)[:100])
    ours_bf16()
    synchronize()
    record("ours", bench_ms(ours_bf16, rep=args.rep), rel_l2(ob[:, N - R:], ref))
    qt, kt, vt = (t.transpose(1, 2) for t in bf)
    for impl, backend in SDPA.items():
        if impl not in args.impls:
            continue
        try:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                synchronize()
                err = rel_l2(out.transpose(1, 2)[:, N - R:], ref)
                del out
                ms = bench_ms(lambda: F.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=bool(causal)), rep=args.rep)
            record(impl, ms, err)
        except RuntimeError as e:  # a backend that refuses the shape
            record(impl, float("nan"), float("nan"), str(e).splitlines()[0][:80])
    return rows, errs


def gemm_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench_ms(lambda: a @ b)
    return 2 * 8192 ** 3 / ms / 1e9



# ---------------------------------------------------------------------------------------------
# --decode: the KV-cache decode grid of issue 18.
# ---------------------------------------------------------------------------------------------
DECODE_HEADS = ((32, 8), (64, 8), (32, 32), (32, 1))


def copy_gbs(rep):
    """Device copy bandwidth: a 4 GiB (CUDA; 256 MiB on the CPU) tensor copied into another,
    bytes read + written per second (STREAM's Copy convention), GB/s."""
    n = (4 << 30) if DEV == "cuda" else (256 << 20)
    x = torch.empty(n, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    x.fill_(1)
    ms = bench_ms(lambda: y.copy_(x), rep=rep)
    del x, y
    return 2.0 * n / (ms * 1e-3) * 1e-9


def paged_cache(k, v, page, gen):
    """k, v [B, Nk, Hkv, D] -> [pages, page, Hkv, D] caches in a shuffled page order, the block
    table [B, ceil(Nk / page)] and seqused_k = Nk."""
    B, Nk, Hkv, D = k.shape
    per = (Nk + page - 1) // page
    pad = per * page - Nk
    perm = torch.randperm(B * per, generator=gen).to(k.device)
    table = perm.view(B, per).to(torch.int32).contiguous()
    kp, vp = (torch.empty(B * per, page, Hkv, D, dtype=k.dtype, device=k.device) for _ in "kv")
    for src, dst in ((k, kp), (v, vp)):
        padded = F.pad(src, (0, 0, 0, 0, 0, pad)) if pad else src
        dst[perm] = padded.reshape(B * per, page, Hkv, D)
    used = torch.full((B,), Nk, dtype=torch.int32, device=k.device)
    return kp, vp, table, used


def run_decode(fp, args, copy):
    """Every shape of the decode grid: ours dense and paged, SDPA flash and cuDNN (enable_gqa;
    where a backend refuses GQA, K and V expanded to H heads, marked 'expanded'). Returns CSV rows:
    milliseconds, K/V GB/s (K and V bytes of the cache counted once) and % of the copy."""
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    impls = [i for i in args.impls if i in SDPA]
    gen = torch.Generator().manual_seed(18)
    # --fwd-env VAR=A,B: our dense forward timed again with VAR set to each value ("ours:VAR=A")
    fwd_env = []
    if args.fwd_env:
        var, values = args.fwd_env.split("=", 1)
        fwd_env = [(var, v) for v in values.split(",")]
    rows = []
    for dname in args.dtypes.split(","):
        dt = dtypes[dname]
        for D in (int(x) for x in args.dims.split(",")):
            for H, Hkv in args.decode_heads:
                for B in args.decode_batches:
                    for Nk in args.decode_seqlens:
                        for Nq in args.decode_nq:
                            shape = dict(dtype=dname, B=B, H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D)
                            kv_bytes = 2 * B * Nk * Hkv * D * torch.finfo(dt).bits // 8
                            try:
                                q = torch.randn(B, Nq, H, D, dtype=dt, device=DEV)
                                k = torch.randn(B, Nk, Hkv, D, dtype=dt, device=DEV)
                                v = torch.randn(B, Nk, Hkv, D, dtype=dt, device=DEV)
                            except RuntimeError as e:  # out of memory (torch.cuda's is one)
                                print(f"decode {shape}: {str(e).splitlines()[0]}, skipped",
                                      flush=True)
                                continue
                            o = torch.empty_like(q)
                            lse = torch.empty(B, H, Nq, dtype=torch.float32, device=DEV)

                            def row(impl, ms, note=""):
                                gbs = kv_bytes / (ms * 1e-3) * 1e-9
                                rows.append(dict(shape, impl=impl, ms=ms, kv_gbs=gbs,
                                                 pct_copy=100.0 * gbs / copy, note=note))
                                print(f"decode {dname} B{B} H{H}/{Hkv} Nq{Nq} Nk{Nk} D{D} "
                                      f"{impl:>10}: {ms:8.3f} ms {gbs:8.1f} GB/s "
                                      f"{100.0 * gbs / copy:5.1f}% of copy {note}", flush=True)

                            fwd = lambda kk=k, vv=v, **kw: flashport.attention(
                                q, kk, vv, return_lse=True, out=(o, lse), backend=fp.backend, **kw)
                            fwd()
                            ref = o.clone()
                            row("ours", bench_ms(fwd, rep=args.rep))
                            for var, value in fwd_env:
                                saved = os.environ.get(var)
                                os.environ[var] = value
                                fwd()
                                row(f"ours:{var}={value}", bench_ms(fwd, rep=args.rep),
                                    f"rel_l2 vs ours {rel_l2(o, ref):.1e}")
                                if saved is None:
                                    del os.environ[var]
                                else:
                                    os.environ[var] = saved
                            for page in args.decode_pages:
                                try:
                                    kp, vp, table, used = paged_cache(k, v, page, gen)
                                except RuntimeError as e:  # out of memory
                                    print(f"  paged {page}: {str(e).splitlines()[0]}", flush=True)
                                    continue
                                pfwd = lambda: fwd(kp, vp, seqused_k=used, block_table=table)
                                try:
                                    pfwd()
                                except flashport.Error as e:
                                    print(f"  paged {page}: {e}", flush=True)
                                    del kp, vp
                                    continue
                                err = rel_l2(o, ref)
                                row(f"ours:p{page}", bench_ms(pfwd, rep=args.rep),
                                    f"rel_l2 vs dense {err:.1e}")
                                del kp, vp
                            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                            for impl in impls:
                                note = ""
                                try:
                                    with sdpa_kernel(SDPA[impl]):
                                        call = lambda: F.scaled_dot_product_attention(
                                            qt, kt, vt, enable_gqa=True)
                                        out = call()
                                except RuntimeError:
                                    note = "expanded"
                                    try:
                                        ke = kt.repeat_interleave(H // Hkv, dim=1)
                                        ve = vt.repeat_interleave(H // Hkv, dim=1)
                                        with sdpa_kernel(SDPA[impl]):
                                            call = lambda: F.scaled_dot_product_attention(qt, ke, ve)
                                            out = call()
                                    except RuntimeError as e:  # out of memory too
                                        print(f"  {impl}: {str(e).splitlines()[0]}", flush=True)
                                        continue
                                err = rel_l2(ref, out.transpose(1, 2))
                                with sdpa_kernel(SDPA[impl]):
                                    ms = bench_ms(call, rep=args.rep)
                                row(impl, ms, f"{note} ours vs it rel_l2 {err:.1e}".strip())
                            del q, k, v, o, lse, ref
                            if DEV == "cuda":
                                torch.cuda.empty_cache()
    return rows


def write_decode(rows, copy, header, out):
    """compare_torch_decode.csv (every row) and compare_torch_decode.md (per shape: our dense and
    paged GB/s, % of copy, and SDPA's times against ours)."""
    keys = ["dtype", "B", "H", "Hkv", "Nq", "Nk", "D", "impl", "ms", "kv_gbs", "pct_copy", "note"]
    with open(os.path.join(out, "compare_torch_decode.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    by = collections.OrderedDict()
    for r in rows:
        by.setdefault(tuple(r[k] for k in keys[:7]), {})[r["impl"]] = r
    impls = sorted({r["impl"] for r in rows}, key=lambda i: (not i.startswith("ours"), i))
    lines = [f"# Decode: flashport vs SDPA\n", f"{header}; device copy {copy:.0f} GB/s "
             f"(read + written). GB/s: the cache's K and V bytes once per call.\n",
             "| dtype | B | H:Hkv | Nq | Nk | D | " + " | ".join(
                 f"{i} ms (GB/s, % copy)" for i in impls) + " | SDPA / ours |",
             "|" + "---|" * (7 + len(impls))]
    for key, got in by.items():
        dt, B, H, Hkv, Nq, Nk, D = key
        cells = []
        for i in impls:
            r = got.get(i)
            cells.append("-" if r is None else
                         f"{r['ms']:.3f} ({r['kv_gbs']:.0f}, {r['pct_copy']:.0f}%)")
        ours = got.get("ours")
        best = min((r["ms"] for i, r in got.items() if not i.startswith("ours")), default=None)
        ratio = "-" if ours is None or best is None else f"{best / ours['ms']:.2f}x"
        lines.append(f"| {dt} | {B} | {H}:{Hkv} | {Nq} | {Nk} | {D} | " + " | ".join(cells)
                     + f" | {ratio} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out, "compare_torch_decode.md"), "w") as f:
        f.write(md)
    print(md)


def main():
    global SDPA, DEV, REF
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"],
                    help="where both sides run: a CUDA GPU, or the CPU (torch's CPU SDPA)")
    ap.add_argument("--lib", default=None,
                    help="a build tree's libflashport.so: use the plugins in its folder instead "
                    "of the package's own")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="output folder")
    ap.add_argument("--dtypes", default=None, help="default: bf16,fp16 (cuda), fp32,bf16 (cpu)")
    ap.add_argument("--dims", default=None, help="default: 64,128,256 (cuda), 64,128 (cpu)")
    ap.add_argument("--seqlens", default=None,
                    help="default: 512,2048,8192,16384 (cuda), 512,2048 (cpu)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="B*N of every shape; default 16384 (cuda), 4096 (cpu)")
    ap.add_argument("--hd", type=int, default=None,
                    help="H*D of every shape; default 2048 (cuda), 512 (cpu)")
    ap.add_argument("--heads", default="",
                    help="H:HKV,...: GQA/MQA shapes, the grid once per entry with H query and "
                    "HKV kv heads (e.g. 32:4,64:1), instead of H = hd / D = HKV")
    ap.add_argument("--rep", type=int, default=60, help="timing repetition time per call, ms")
    ap.add_argument("--det", action="store_true", help="also time our deterministic backward")
    ap.add_argument("--rounds", type=int, default=2,
                    help="SDPA flash and ours alternate this many times; each keeps its best")
    ap.add_argument("--impls", default=None,
                    help="SDPA backends to time: fa2,cudnn,eff (cuda, the default) or "
                    "flash,math (cpu, the default)")
    ap.add_argument("--bwd-env", default="",
                    help="VAR=A,B,...: time our backward once per value of VAR (A/B runs)")
    ap.add_argument("--fwd-env", default="",
                    help="VAR=A,B,...: time our forward once per value of VAR (A/B runs)")
    ap.add_argument("--ref-rows", type=int, default=256,
                    help="fp8 dtypes: query rows of the float32 reference (the last ones)")
    ap.add_argument("--decode", action="store_true",
                    help="the decode grid instead (issue 18): B 1,16,128 x Nk 8192,32768 x H:Hkv "
                    "32:8,64:8,32:32,32:1 x Nq 1,4,8, dense and paged (16, 256) against SDPA, "
                    "with a device-copy bandwidth")
    ap.add_argument("--decode-batches", default="1,16,128")
    ap.add_argument("--decode-seqlens", default="8192,32768")
    ap.add_argument("--decode-nq", default="1,4,8")
    ap.add_argument("--decode-heads", default=",".join(f"{h}:{k}" for h, k in DECODE_HEADS))
    ap.add_argument("--decode-pages", default="16,256")
    args = ap.parse_args()
    cuda = args.backend == "cuda"
    FMT = ".0f" if cuda else ".3f"  # TFLOP/s: a CPU's are fractions
    DEV, SDPA = args.backend, SDPA_BY_DEVICE[args.backend]
    REF = next(iter(SDPA))
    args.dtypes = args.dtypes or ("bf16,fp16" if cuda else "fp32,bf16")
    args.dims = args.dims or ("64,128,256" if cuda else "64,128")
    args.seqlens = args.seqlens or ("512,2048,8192,16384" if cuda else "512,2048")
    args.tokens = args.tokens or (16384 if cuda else 4096)
    args.hd = args.hd or (2048 if cuda else 512)
    args.impls = (args.impls or ",".join(SDPA)).split(",")
    head_sets = [None]
    if args.heads:
        head_sets = [tuple(int(x) for x in e.split(":")) for e in args.heads.split(",")]
        for h, hkv in head_sets:
            if hkv < 1 or h % hkv:
                raise SystemExit(f"--heads {h}:{hkv}: H must be a multiple of HKV")
    bwd_env = None
    if args.bwd_env:
        var, values = args.bwd_env.split("=", 1)
        bwd_env = (var, values.split(","))
    fwd_env = None
    if args.fwd_env:
        var, values = args.fwd_env.split("=", 1)
        fwd_env = (var, values.split(","))
    os.makedirs(args.out, exist_ok=True)
    if args.lib:  # before the first call: the library searches plugins when a backend opens
        os.environ["FLASHPORT_PLUGIN_PATH"] = os.path.dirname(os.path.abspath(args.lib))

    fp = Flashport(args.backend)
    impls = list(SDPA)
    now = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    if cuda:
        dev = torch.cuda.get_device_name()
        gemm = gemm_tflops()
        header = (f"GPU {dev}; torch {torch.__version__} (cuDNN "
                  f"{torch.backends.cudnn.version()}); flashport {flashport.version()}; {now}; "
                  f"bf16 GEMM 8192^3 {gemm:.0f} TFLOP/s; do_bench median, rep {args.rep} ms; "
                  f"SDPA flash and ours: best of {args.rounds} alternating rounds")
    else:
        threads = os.environ.get("FLASHPORT_NUM_THREADS", "OpenMP's default")
        header = (f"CPU ({os.cpu_count()} logical cores); torch {torch.__version__} "
                  f"({torch.get_num_threads()} threads); flashport {flashport.version()} "
                  f"(FLASHPORT_NUM_THREADS: {threads}); {now}; host-clock median, rep "
                  f"{args.rep} ms; SDPA flash and ours: best of {args.rounds} alternating rounds")
    print(header, flush=True)
    if args.decode:
        ints = lambda x: [int(y) for y in x.split(",") if y]
        args.dims = args.dims if args.dims != "64,128,256" else "128,64"
        args.decode_batches, args.decode_seqlens = ints(args.decode_batches), ints(
            args.decode_seqlens)
        args.decode_nq, args.decode_pages = ints(args.decode_nq), ints(args.decode_pages)
        args.decode_heads = [tuple(int(y) for y in x.split(":"))
                             for x in args.decode_heads.split(",")]
        copy = copy_gbs(args.rep)
        print(f"device copy: {copy:.0f} GB/s (read + written)", flush=True)
        rows = run_decode(fp, args, copy)
        write_decode(rows, copy, header, args.out)
        return

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    all_rows, table, fp8_table = [], [], []
    for dname in args.dtypes.split(","):
        for D in [int(x) for x in args.dims.split(",")]:
            for N, heads, causal in [(int(n), hs, c) for hs in head_sets
                                     for n in args.seqlens.split(",") for c in (0, 1)]:
                if dname in FP8_FORMATS:
                    rows, errs = run_fp8_shape(fp, dname, D, N, causal, args)
                    all_rows += rows
                    t = collections.defaultdict(lambda: float("nan"))
                    t.update({r["impl"]: r["tflops"] for r in rows})
                    notes = "; ".join(f"{r['impl']}: {r['note']}" for r in rows if r["note"])
                    fp8_table.append((dname, D, N, rows[0]["B"], rows[0]["H"], causal, t, errs,
                                      notes))
                    print(f"{dname} D{D} N{N} causal={causal}: "
                          + "  ".join(f"{i} {t[i]:{FMT}} (err {errs[i]:.2e})" for i in t)
                          + (f"  [{notes}]" if notes else ""), flush=True)
                    continue
                rows, agree, ok = run_shape(fp, dtypes[dname], D, N, causal, args, bwd_env,
                                            fwd_env, heads)
                all_rows += rows
                t = collections.defaultdict(lambda: float("nan"))
                t.update({(r["impl"], r["direction"]): r["tflops"] for r in rows})
                H = rows[0]["H"] if rows[0]["H"] == rows[0]["HKV"] else \
                    f"{rows[0]['H']}/{rows[0]['HKV']}"
                table.append((dname, D, N, rows[0]["B"], H, causal, t, agree, ok))
                alt = "".join(f"  {i} {t[(i, d)]:{FMT}}" for i, d in sorted(
                    {(r["impl"], r["direction"]) for r in rows
                     if r["impl"].startswith("ours:")}))
                theirs = "".join(f"  {i} {t[(i, 'fwd')]:{FMT}}/{t[(i, 'bwd')]:{FMT}}"
                                 for i in impls[:2])
                print(f"{dname} D{D} N{N} H{H} causal={causal}: ours {t[('ours', 'fwd')]:{FMT}}/"
                      f"{t[('ours', 'bwd')]:{FMT}}{theirs}{alt}  agree {'yes' if ok else 'NO'} "
                      + " ".join(f"{k}={v:.1e}" for k, v in agree.items()), flush=True)

    if not all_rows:
        raise SystemExit("no shape ran")
    with open(os.path.join(args.out, "compare_torch.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(all_rows[0].keys()))
        w.writeheader()
        w.writerows(all_rows)

    def ratio(a, b):
        return a / b if b == b and b > 0 else float("nan")

    title = "CUDA backend" if cuda else "CPU backend"
    ratio_impls = impls[:2]
    lines = [f"# flashport {title} vs PyTorch SDPA", "", header, "",
             "TFLOP/s fwd / bwd; ratios are ours / theirs (>= 1.00: ours is faster). "
             "Agreement: relative L2 difference of our O, dQ, dK, dV from SDPA flash.", "",
             "| dtype | D | N | B x H | causal | ours | "
             + " | ".join(LABELS[i] for i in impls) + " | "
             + " | ".join(f"ours/{LABELS[i]}" for i in ratio_impls) + " | agree (max rel L2) |",
             "|---|---|---|---|---|---|" + "---|" * (len(impls) + len(ratio_impls) + 1)]
    for dname, D, N, B, H, causal, t, agree, ok in table:
        def pair(impl):
            return f"{t[(impl, 'fwd')]:{FMT}} / {t[(impl, 'bwd')]:{FMT}}"

        def rpair(other):
            return (f"{ratio(t[('ours', 'fwd')], t[(other, 'fwd')]):.2f} / "
                    f"{ratio(t[('ours', 'bwd')], t[(other, 'bwd')]):.2f}")
        worst = max(agree.values()) if agree else float("nan")
        lines.append(f"| {dname} | {D} | {N} | {B} x {H} | {'yes' if causal else 'no'} | "
                     f"{pair('ours')} | " + " | ".join(pair(i) for i in impls) + " | "
                     + " | ".join(rpair(i) for i in ratio_impls) + f" | {'yes' if ok else 'NO'} "
                     f"({worst:.1e}) |")
    for env, direction, name in ((bwd_env, "bwd", "backward"), (fwd_env, "fwd", "forward")):
        if not env:
            continue
        alts = [variant_label(env, n) for n in range(1, len(env[1]))]
        lines += ["", f"A/B of our {name} ({env[0]}; 'ours' is {env[0]}="
                  f"{env[1][0]}): TFLOP/s and ratio to {LABELS[REF]}", "",
                  f"| dtype | D | N | B x H | causal | {LABELS[REF]} | ours | " + " | ".join(alts)
                  + " |", "|---|---|---|---|---|---|---|" + "---|" * len(alts)]
        for dname, D, N, B, H, causal, t, agree, ok in table:
            fa2 = t[(REF, direction)]
            cells = [f"{t[(i, direction)]:{FMT}} ({ratio(t[(i, direction)], fa2):.2f})"
                     for i in ["ours"] + alts]
            lines.append(f"| {dname} | {D} | {N} | {B} x {H} | {'yes' if causal else 'no'} | "
                         f"{fa2:{FMT}} | " + " | ".join(cells) + " |")
    if fp8_table:
        fp8_impls = ["ours-fp8", "ours"] + [i for i in impls if i in args.impls]
        names = {"ours-fp8": "ours fp8", "ours": "ours bf16"}
        head = [names.get(i, LABELS.get(i, i)) for i in fp8_impls]
        lines += ["", "fp8 forward: TFLOP/s, and in parentheses O's relative L2 error against the "
                  "float32 attention of the dequantized inputs (last "
                  f"{args.ref_rows} query rows); 'ours bf16' and SDPA run on those inputs rounded "
                  "to bf16. fp8/x: ours fp8 over x (>= 1.00: fp8 is faster); err x: error ratio "
                  "ours fp8 / x.", "",
                  "| dtype | D | N | B x H | causal | " + " | ".join(head) + " | "
                  + " | ".join(f"fp8/{h}" for h in head[1:]) + " | err / ours bf16 |",
                  "|---|---|---|---|---|" + "---|" * (2 * len(head))]
        for dname, D, N, B, H, causal, t, errs, notes in fp8_table:
            cells = [f"{t[i]:{FMT}} ({errs.get(i, float('nan')):.1e})" for i in fp8_impls]
            ratios = [f"{ratio(t['ours-fp8'], t[i]):.2f}" for i in fp8_impls[1:]]
            err_ratio = ratio(errs.get("ours-fp8", float("nan")), errs.get("ours", float("nan")))
            lines.append(f"| {dname} | {D} | {N} | {B} x {H} | {'yes' if causal else 'no'} | "
                         + " | ".join(cells) + " | " + " | ".join(ratios)
                         + f" | {err_ratio:.2f} |")
        notes = sorted({n for *_, n in fp8_table if n})
        if notes:
            lines += [""] + [f"Note: {n}" for n in notes]
    if args.det:
        lines += ["", "Deterministic backward (no atomics), TFLOP/s: " + ", ".join(
            f"{r['dtype']} D{r['D']} N{r['N']}{' causal' if r['causal'] else ''} "
            f"{r['tflops']:{FMT}}" for r in all_rows if r["impl"] == "ours-det")]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "compare_torch.md"), "w") as f:
        f.write(md)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        dims = sorted({r["D"] for r in all_rows})
        fig, axes = plt.subplots(2, len(dims), figsize=(5 * len(dims), 8), squeeze=False)
        styles = dict(zip(["ours"] + impls, ["-o", "--s", ":^", "-.v"]))
        first = args.dtypes.split(",")[0]
        plot_dtype = first if first in FP8_FORMATS else str(dtypes[first]).replace("torch.", "")
        plot_heads = head_sets[0]  # with --heads, the first entry's shapes only
        for col, D in enumerate(dims):
            for row, direction in enumerate(("fwd", "bwd")):
                ax = axes[row][col]
                for impl, st in styles.items():
                    for causal in (0, 1):
                        pts = sorted((r["N"], r["tflops"]) for r in all_rows
                                     if r["D"] == D and r["impl"] == impl and r["dtype"] ==
                                     plot_dtype and r["direction"] == direction and
                                     r["causal"] == causal and
                                     (plot_heads is None or (r["H"], r.get("HKV", r["H"])) == plot_heads))
                        if pts:
                            ax.plot([p[0] for p in pts], [p[1] for p in pts], st,
                                    alpha=1.0 if causal == 0 else 0.5,
                                    label=f"{impl}{' causal' if causal else ''}")
                ax.set_xscale("log", base=2)
                ax.set_title(f"{plot_dtype} D={D} {direction}")
                ax.set_xlabel("N")
                ax.set_ylabel("TFLOP/s")
                ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(header, fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "compare_torch.png"), dpi=110)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)

    print(md)
    # fp8 rows fail only where our fp8 forward ran and gave no finite error
    fp8_ok = all(e.get("ours-fp8") == e.get("ours-fp8") or "ours-fp8:" in n
                 for *_, e, n in fp8_table)
    return 0 if all(row[8] for row in table) and fp8_ok else 1


if __name__ == "__main__":
    sys.exit(main())
