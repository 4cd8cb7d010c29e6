#!/usr/bin/env python3
"""flashport's CPU backend side by side with PyTorch's CPU scaled_dot_product_attention.

torch's SDPA is forced to its CPU flash kernel (SDPBackend.FLASH_ATTENTION, the kernel a user
would otherwise run) and timed in this process; flashport is timed by flashport-bench (which
checks its results against the reference backend on the first round) in a child process. The two
alternate, round by round, on the same thread count, so that a neighbour on a shared machine
slows both sides of a round alike; the ratio torch / flashport is taken per round and the table
gives its median (above 1: flashport is faster), with the per-round values.

  bench/compare_cpu_torch.py --build build                 the issue-21 grid, 1 and 2 threads
  bench/compare_cpu_torch.py --build build --isa avx2      both sides on AVX2 code: flashport's
                                                           avx2 table; torch's ATEN_CPU_CAPABILITY,
                                                           and the oneDNN and MKL kernels it calls
                                                           (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS:
                                                           without them its bf16 GEMMs run
                                                           AVX512-BF16 code on a CPU that has it)

Layout: q, k, v [B, N, H, D] as flashport takes them; torch gets the [B, H, N, D] views of the
same layout (transpose(1, 2), no copy), which its CPU flash kernel reads through strides.
Timing: torch with time.perf_counter around each call (forward; backward alone, after an untimed
forward that builds the graph), median of --iters after one warm-up; flashport: the bench's median
of --iters after one warm-up. FLOPs by the FlashAttention convention (forward 4 B H N^2 D, halved
for causal; backward 2.5x), as the bench counts them; the GFLOP/s column of each side is its median.
--clock cpu times both sides by the process' CPU time divided by the thread count (torch:
time.process_time; flashport-bench --clock cpu), the cycles their threads ran, for machines whose
cores other processes share; it sets OMP_WAIT_POLICY=passive for both (torch's and flashport's
OpenMP pools), so that idle threads do not spin on the clock.
The FMA peak is measured once by flashport-bench at the start (for the ISA in use) and passed to
every later bench run with --peak-gflops, so that % of peak has one denominator per run.

Needs: torch (`pip install torch`; only its CPU side is used) and a built flashport-bench.
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="flashport build dir (bin/flashport-bench)")
    ap.add_argument("--dtype", default="f32,bf16")
    ap.add_argument("--hdim", default="64,128")
    ap.add_argument("--seqlen", default="1024,2048,4096,8192")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--direction", default="both", choices=["fwd", "bwd", "both"])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per shape")
    ap.add_argument("--iters", type=int, default=3, help="timed calls per side and round")
    ap.add_argument("--isa", default="auto",
                    help="FLASHPORT_CPU_ISA for flashport; avx2 also caps torch at AVX2: "
                         "ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, "
                         "MKL_ENABLE_INSTRUCTIONS=AVX2 (both sides on 256-bit code)")
    ap.add_argument("--peak-gflops", type=float, default=0.0,
                    help="pin the FMA peak instead of measuring it once at the start")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="wall time, or CPU time / threads on both sides (shared machines)")
    ap.add_argument("--csv", help="write one row per (shape, threads, direction, round)")
    return ap.parse_args()


ARGS = parse_args()
if ARGS.isa not in ("auto", ""):
    os.environ["FLASHPORT_CPU_ISA"] = ARGS.isa
if ARGS.clock == "cpu":
    os.environ["OMP_WAIT_POLICY"] = "passive"  # read when the OpenMP runtimes load
if ARGS.isa == "avx2":
    # Read when torch loads. ATen's capability alone leaves the GEMM libraries under torch on the
    # CPU's best ISA: its bf16 flash backward then runs oneDNN's AVX512-BF16 brgemm, which an
    # AVX2 laptop does not have.
    os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
    os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    os.environ["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BENCH = os.path.join(ARGS.build, "bin", "flashport-bench")
TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def ints(s):
    return [int(x) for x in s.split(",") if x]


def flops(b, h, n, d, causal, backward):
    f = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return f * (2.5 if backward else 1.0)


def now(threads):
    """Seconds on the comparison's clock: wall, or process CPU time / threads."""
    if ARGS.clock == "cpu":
        return time.process_time() / threads
    return time.perf_counter()


def run_bench(args, threads):
    env = dict(os.environ, FLASHPORT_NUM_THREADS=str(threads))
    out = subprocess.run([BENCH] + args, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"flashport-bench failed ({' '.join(args)}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def measure_peak(threads):
    text = run_bench(["--backend", "cpu", "--seqlen", "64", "--hdim", "64", "--heads", "1",
                      "--iters", "1", "--clock", ARGS.clock], threads)
    m = re.search(r"# peak: ([0-9.]+) GFLOP/s f32 FMA, measured here \((\d+) threads?, ([^)]+)\)",
                  text)
    if not m:
        sys.exit("no peak line in flashport-bench's output:\n" + text)
    return float(m.group(1)), m.group(3)


def flashport_ms(shape, threads, peak, check):
    dtype, d, n, causal = shape
    args = ["--backend", "cpu", "--dtype", dtype, "--batch", str(ARGS.batch), "--heads",
            str(ARGS.heads), "--seqlen", str(n), "--hdim", str(d), f"--causal={causal}",
            "--direction", ARGS.direction, "--iters", str(ARGS.iters), "--peak-gflops",
            str(peak), "--clock", ARGS.clock]
    if check:
        args.append("--check")
    text = run_bench(args, threads)
    ms = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 16 and f[0] == "cpu" and f[11] in ("fwd", "bwd"):
            if check and f[-1] != "ok":
                sys.exit("flashport-bench check failed:\n" + text)
            ms[f[11]] = float(f[12])
    return ms


def torch_ms(shape, threads):
    dtype, d, n, causal = shape
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    dt = TORCH_DTYPE[dtype]
    b, h = ARGS.batch, ARGS.heads
    mk = lambda: (torch.rand(b, n, h, d, generator=g) * 2 - 1).to(dt).transpose(1, 2)  # noqa
    q, k, v, do = mk(), mk(), mk(), mk()
    res = {}
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        if ARGS.direction in ("fwd", "both"):
            times = []
            with torch.no_grad():
                for it in range(ARGS.iters + 1):
                    t0 = now(threads)
                    F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                    if it:
                        times.append((now(threads) - t0) * 1e3)
            res["fwd"] = statistics.median(times)
        if ARGS.direction in ("bwd", "both"):
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            times = []
            for it in range(ARGS.iters + 1):
                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=bool(causal))
                t0 = now(threads)
                o.backward(do)
                if it:
                    times.append((now(threads) - t0) * 1e3)
                qg.grad = kg.grad = vg.grad = None
            res["bwd"] = statistics.median(times)
    return res


def main():
    if not os.access(BENCH, os.X_OK):
        sys.exit(f"{BENCH} not found: build flashport first (README)")
    threads_list = ints(ARGS.threads)
    peaks = {}
    for t in threads_list:
        peaks[t] = (ARGS.peak_gflops, "given") if ARGS.peak_gflops > 0 else measure_peak(t)
    load = os.getloadavg()
    print(f"# torch {torch.__version__}, ATen CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, ONEDNN_MAX_CPU_ISA="
          f"{os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}, MKL_ENABLE_INSTRUCTIONS="
          f"{os.environ.get('MKL_ENABLE_INSTRUCTIONS', 'unset')}; flashport FLASHPORT_CPU_ISA="
          f"{os.environ.get('FLASHPORT_CPU_ISA', 'auto')}; clock: {ARGS.clock}")
    print(f"# peak f32 FMA: " + ", ".join(f"{t} thread(s) {p:.1f} GFLOP/s ({isa})"
                                          for t, (p, isa) in peaks.items()))
    print(f"# load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    writer = None
    if ARGS.csv:
        fh = open(ARGS.csv, "w", newline="")
        writer = csv.writer(fh)
        writer.writerow(["dtype", "hdim", "heads", "seqlen", "causal", "threads", "direction",
                         "round", "torch_ms", "flashport_ms", "ratio", "flashport_pct_peak",
                         "peak_gflops", "load1"])
    dirs = ["fwd", "bwd"] if ARGS.direction == "both" else [ARGS.direction]
    print("| dtype | D | H | N | causal | threads | dir | torch ms | flashport ms "
          "| torch / flashport (per round) | torch GFLOP/s | flashport GFLOP/s | flashport % peak |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for dtype in ARGS.dtype.split(","):
        for d in ints(ARGS.hdim):
            for n in ints(ARGS.seqlen):
                for causal in ints(ARGS.causal):
                    shape = (dtype, d, n, causal)
                    for t in threads_list:
                        peak = peaks[t][0]
                        rows = {x: [] for x in dirs}
                        for r in range(ARGS.rounds):
                            # Alternate which side goes first, so that neither always runs
                            # right after the other's memory traffic.
                            if r % 2 == 0:
                                tm = torch_ms(shape, t)
                                fm = flashport_ms(shape, t, peak, check=(r == 0))
                            else:
                                fm = flashport_ms(shape, t, peak, check=False)
                                tm = torch_ms(shape, t)
                            for x in dirs:
                                rows[x].append((tm[x], fm[x]))
                                if writer:
                                    fl = flops(ARGS.batch, ARGS.heads, n, d, causal, x == "bwd")
                                    writer.writerow([dtype, d, ARGS.heads, n, causal, t, x, r,
                                                     f"{tm[x]:.3f}", f"{fm[x]:.3f}",
                                                     f"{tm[x] / fm[x]:.3f}",
                                                     f"{100 * fl / (fm[x] * 1e6) / peak:.1f}",
                                                     f"{peak:.1f}", f"{os.getloadavg()[0]:.2f}"])
                        for x in dirs:
                            tms = [a for a, _ in rows[x]]
                            fms = [b for _, b in rows[x]]
                            ratios = [a / b for a, b in rows[x]]
                            fl = flops(ARGS.batch, ARGS.heads, n, d, causal, x == "bwd")
                            tmed, fmed = statistics.median(tms), statistics.median(fms)
                            print(f"| {dtype} | {d} | {ARGS.heads} | {n} | "
                                  f"{'yes' if causal else 'no'} | {t} | {x} | {tmed:.1f} | "
                                  f"{fmed:.1f} | **{statistics.median(ratios):.2f}** ("
                                  + "/".join(f"{q:.2f}" for q in ratios) + ") | "
                                  f"{fl / tmed * 1e-6:.0f} | {fl / fmed * 1e-6:.0f} | "
                                  f"{100 * fl / fmed * 1e-6 / peak:.0f} |", flush=True)
    load = os.getloadavg()
    print(f"# load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
