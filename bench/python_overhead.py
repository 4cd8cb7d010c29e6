#!/usr/bin/env python3
"""Host overhead of the flashport Python package per call, against the C API alone.

The same tiny causal problem (q, k, v [1, N, 1, D]) is called back to back from C
(bench/call_time.c, compiled here against the package's own libflashport) and from Python in
each way the package offers; the difference of the per-call times is the package's overhead.
Each figure is the best of 7 trials of the mean over --reps calls, one synchronize per trial.

    python3 bench/python_overhead.py                      # CPU backend: NumPy and torch
    python3 bench/python_overhead.py --backend cuda       # torch CUDA (and CuPy if installed)

Needs a C compiler (cc) and the repository's include/ (run it from a checkout).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import flashport

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def c_times(backend, dtype, n, d, reps):
    lib = flashport.library_path()
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "call_time")
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-std=c11", "-D_POSIX_C_SOURCE=199309L",
                        "-I", os.path.join(ROOT, "include"),
                        os.path.join(ROOT, "bench", "call_time.c"), lib,
                        "-Wl,-rpath," + os.path.dirname(lib), "-o", exe], check=True)
        out = subprocess.run([exe, backend, dtype, str(n), str(d), str(reps)], check=True,
                             capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def py_time(fn, sync, reps):
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / reps * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--n", type=int, default=16,
                    help="sequence length (tiny: the call is the cost)")
    ap.add_argument("--d", type=int, default=64, help="head dim")
    ap.add_argument("--reps", type=int, default=2000)
    args = ap.parse_args()
    cuda = args.backend == "cuda"
    dname = "bf16" if cuda else "f32"
    c_fwd, c_bwd = c_times(args.backend, dname, args.n, args.d, args.reps)
    rows = [("C API (call_time.c)", "fwd", c_fwd, c_fwd), ("C API (call_time.c)", "bwd", c_bwd,
                                                             c_bwd)]
    shape = (1, args.n, 1, args.d)

    def measure(label, make, sync, modules):
        q, k, v, do = make()
        o, lse = flashport.attention(q, k, v, causal=True, return_lse=True)
        dq, dk, dv = flashport.attention_backward(do, q, k, v, o, lse, causal=True)
        cases = [
            ("attention(..., return_lse=True)", "fwd",
             lambda: flashport.attention(q, k, v, causal=True, return_lse=True)),
            ("attention(..., out=(o, lse))", "fwd",
             lambda: flashport.attention(q, k, v, causal=True, return_lse=True, out=(o, lse))),
            ("attention_backward(...)", "bwd",
             lambda: flashport.attention_backward(do, q, k, v, o, lse, causal=True)),
            ("attention_backward(..., out=)", "bwd",
             lambda: flashport.attention_backward(do, q, k, v, o, lse, causal=True,
                                                  out=(dq, dk, dv))),
        ]
        if "torch" in modules:
            import flashport.torch as ft

            cases.append(("flashport.torch.attention (custom op)", "fwd",
                          lambda: ft.attention(q, k, v, causal=True)))
        for name, direction, fn in cases:
            t = py_time(fn, sync, args.reps)
            rows.append((f"{label}: {name}", direction, t, c_fwd if direction == "fwd" else c_bwd))

    modules = set()
    try:
        import torch

        modules.add("torch")
        dev = "cuda" if cuda else "cpu"
        tdt = torch.bfloat16 if cuda else torch.float32
        measure("torch", lambda: [torch.zeros(shape, dtype=tdt, device=dev) for _ in range(4)],
                torch.cuda.synchronize if cuda else (lambda: None), modules)
    except ImportError:
        print("torch not installed: its rows are left out", file=sys.stderr)
    if not cuda:
        import numpy as np

        measure("NumPy", lambda: [np.zeros(shape, np.float32) for _ in range(4)], lambda: None,
                set())
    else:
        try:
            import cupy as cp

            measure("CuPy", lambda: [cp.zeros(shape, cp.float16) for _ in range(4)],
                    cp.cuda.get_current_stream().synchronize, set())
        except ImportError:
            pass

    print(f"flashport {flashport.version()}, backend {args.backend}, {dname}, causal, "
          f"q/k/v [1, {args.n}, 1, {args.d}], {args.reps} calls per trial, best of 7\n")
    print("| call | dir | us per call | overhead over the C call, us |")
    print("|---|---|---|---|")
    for name, direction, t, base in rows:
        print(f"| {name} | {direction} | {t:.2f} | {t - base:+.2f} |")


if __name__ == "__main__":
    main()
