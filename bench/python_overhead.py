#!/usr/bin/env python3
"""Host overhead of the flashport Python package per call, against the C API alone.

The same tiny causal problem (q, k, v [1, N, 1, D]) is called back to back from C
(bench/call_time.c, compiled here against the package's own libflashport) and from Python in
each way the package offers; the difference of the per-call times is the package's overhead.
Each figure is the best of 7 trials of the mean over --reps calls, one synchronize per trial.
C and Python alternate: each of --rounds rounds runs the C program, then every Python case, and
the table gives the median (and range) over the rounds of each case's time and of its
difference from the same round's C time, so a load that drifts during the run moves both.

    python3 bench/python_overhead.py                      # CPU backend: NumPy and torch
    python3 bench/python_overhead.py --backend cuda       # torch CUDA (and CuPy if installed)
    FLASHPORT_NUM_THREADS=1 python3 bench/python_overhead.py   # less noise from OpenMP wake-ups
    python3 bench/python_overhead.py --clock cpu          # thread CPU time, one library thread

--clock cpu times both sides by the calling thread's CPU time (time.thread_time, and
CLOCK_THREAD_CPUTIME_ID in call_time.c) with FLASHPORT_NUM_THREADS=1, so all the work is on
that thread: on a loaded machine that leaves out the time spent waiting for a core, which wall
time cannot. CPU backend only.

Rows marked "floor" (torch only) time torch's own parts with no attention inside: allocating o
and lse, a minimal autograd.Function (forward, forward + backward through the autograd engine,
forward saving the tensors a backward reads, and one of flashport's own apply signature), a
minimal torch.library custom op with an autograd formula, and ops of flashport's two schemas
that only allocate their outputs. They are what flashport.torch cannot go below on that path;
their figure is absolute, not over the C call.

Needs a C compiler (cc) and the repository's include/ (run it from a checkout).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Tuple

import flashport

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_call_time(tmp):
    lib = flashport.library_path()
    exe = os.path.join(tmp, "call_time")
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-std=c11", "-D_POSIX_C_SOURCE=199309L",
                    "-I", os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "bench", "call_time.c"), lib,
                    "-Wl,-rpath," + os.path.dirname(lib), "-o", exe], check=True)
    return exe


def c_times(exe, backend, dtype, n, d, reps, clock):
    out = subprocess.run([exe, backend, dtype, str(n), str(d), str(reps)] +
                         (["cpu"] if clock == "cpu" else []), check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]), float(out[1])


def py_time(fn, sync, reps, clock):
    now = time.thread_time if clock == "cpu" else time.perf_counter
    best = float("inf")
    for _ in range(7):
        t0 = now()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (now() - t0) / reps * 1e6)
    return best


def cases_for(label, make, sync, torch_ops):
    """(name, C baseline ("fwd", "bwd" or "fwd+bwd"), fn, sync) for one framework's tensors."""
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
    if torch_ops:
        import flashport.torch as ft

        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        op_args = (None, None, None, 0.0, -1, 0, True, 0.0, 0, 0, False)
        params = op_args[3:]

        def fwd_bwd():
            ft.attention(qg, kg, vg, causal=True).backward(do)

        cases += [
            ("flashport.torch.attention, no grad", "fwd",
             lambda: ft.attention(q, k, v, causal=True)),
            ("flashport.torch.attention, requires_grad", "fwd",
             lambda: ft.attention(qg, kg, vg, causal=True)),
            ("flash_attn_func, no grad", "fwd", lambda: ft.flash_attn_func(q, k, v, causal=True)),
            ("flash_attn_func, requires_grad", "fwd",
             lambda: ft.flash_attn_func(qg, kg, vg, causal=True)),
            ("flashport.torch's autograd.Function applied directly (no attention() around it)",
             "fwd", lambda: ft._Attention.apply(qg, kg, vg, None, (None, None, None, params))),
            ("flashport.torch.attention + .backward()", "fwd+bwd", fwd_bwd),
            ("torch.ops.flashport.attention_forward (the op)", "fwd",
             lambda: torch_ops.attention_forward(q, k, v, *op_args)),
            ("the op, q, k, v require grad", "fwd",
             lambda: torch_ops.attention_forward(qg, kg, vg, *op_args)),
            ("torch.ops.flashport.attention_backward (the op)", "bwd",
             lambda: torch_ops.attention_backward(do, q, k, v, o, lse, *op_args)),
        ]
        cases += [(f"floor: {name}", None, fn) for name, fn in torch_floors(q, qg, kg, vg, do)]
    return [(f"{label}: {name}", base, fn, sync) for name, base, fn in cases]


_floor_ops = []


def torch_floors(q, qg, kg, vg, do):
    """torch's own cost of what flashport.torch is built from, with no attention inside: the
    allocation of outputs like o and lse, an autograd.Function that allocates them (forward, the
    same saving what a backward reads, and forward + backward through the autograd engine), and
    a torch.library custom op with an autograd formula, dispatched. (name, fn) each; absolute
    times, nothing to subtract."""
    import torch

    lse_shape = (q.shape[0], q.shape[2], q.shape[1])

    def outputs(x):
        return torch.empty_like(x), x.new_empty(lse_shape, dtype=torch.float32)

    class Minimal(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = outputs(q)
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        def backward(ctx, do, dlse):
            return torch.empty_like(do), torch.empty_like(do), torch.empty_like(do)

    class Saving(Minimal):
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = outputs(q)
            ctx.save_for_backward(q, k, v, o, lse)  # what the attention's backward reads
            ctx.mark_non_differentiable(lse)
            return o, lse

    class SameShape(torch.autograd.Function):
        """flashport.torch's Function as torch sees it: apply(q, k, v, alibi, one tuple), o and
        lse out, q, k, v, o, lse saved, the rest on ctx."""

        @staticmethod
        def forward(ctx, q, k, v, alibi, rest):
            o, lse = outputs(q)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.rest = rest
            ctx.mark_non_differentiable(lse)
            ctx.set_materialize_grads(False)
            return o, lse

        @staticmethod
        def backward(ctx, do, dlse):
            return torch.empty_like(do), torch.empty_like(do), torch.empty_like(do), None, None

    if not _floor_ops:
        def minimal(q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
            return outputs(q)

        op = torch.library.custom_op("flashport_bench::minimal", minimal, mutates_args=())
        op.register_fake(outputs)
        op.register_autograd(lambda ctx, do, dlse: do, setup_context=lambda ctx, i, o: None)
        _floor_ops.append(torch.ops.flashport_bench.minimal)
        # flashport's two schemas, defined through torch.library.Library as flashport's are,
        # with implementations that only allocate the outputs (no autograd kernel: torch's
        # fallback): what torch charges to dispatch a Python op of those arguments.
        import flashport.torch as ft

        lib = torch.library.Library("flashport_floor", "DEF")
        lib.define(f"forward(Tensor q, Tensor k, Tensor v, {ft._OPTIONAL_INPUTS}, {ft._PARAMS}) "
                   "-> (Tensor, Tensor)")
        lib.define(f"backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, "
                   f"{ft._OPTIONAL_INPUTS}, {ft._PARAMS}) -> (Tensor, Tensor, Tensor)")
        lib.impl("forward", lambda q, *args: outputs(q), "CompositeExplicitAutograd")
        lib.impl("backward", lambda do, q, k, v, *args: (torch.empty_like(q), torch.empty_like(k),
                                                         torch.empty_like(v)),
                 "CompositeExplicitAutograd")
        _floor_ops.extend([torch.ops.flashport_floor.forward, torch.ops.flashport_floor.backward,
                           lib])
    minimal_op, fwd_op, bwd_op = _floor_ops[:3]
    params = (None, None, None, 0.0, -1, 0, True, 0.0, 0, 0, False)
    rest = (None, None, None, (0.0, -1, 0, True, 0.0, 0, 0, False))
    return [
        ("torch.empty_like(q) + new_empty(lse) (o and lse from torch's allocator)",
         lambda: outputs(q)),
        ("autograd.Function.apply allocating o, lse (q, k, v require grad)",
         lambda: Minimal.apply(qg, kg, vg)),
        ("the same + .backward() (torch's autograd engine)",
         lambda: Minimal.apply(qg, kg, vg)[0].backward(do)),
        ("autograd.Function.apply allocating o, lse and saving q, k, v, o, lse for the backward",
         lambda: Saving.apply(qg, kg, vg)),
        ("torch.library custom op allocating o, lse, with an autograd formula, dispatched",
         lambda: minimal_op(q)),
        ("autograd.Function of flashport's shape (apply(q, k, v, alibi, a tuple)) allocating o, "
         "lse, saving q, k, v, o, lse", lambda: SameShape.apply(qg, kg, vg, None, rest)),
        ("torch.library op of attention_forward's schema (14 arguments) allocating o, lse, "
         "dispatched", lambda: fwd_op(q, q, q, *params)),
        ("torch.library op of attention_backward's schema (17 arguments) allocating dq, dk, dv, "
         "dispatched", lambda: bwd_op(do, q, q, q, q, q, *params)),
    ]


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--n", type=int, default=16,
                    help="sequence length (tiny: the call is the cost)")
    ap.add_argument("--d", type=int, default=64, help="head dim")
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5, help="C / Python alternations")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="wall time, or the calling thread's CPU time (CPU backend, one thread)")
    args = ap.parse_args()
    cuda = args.backend == "cuda"
    if args.clock == "cpu":
        if cuda:
            ap.error("--clock cpu times the CPU backend only")
        os.environ["FLASHPORT_NUM_THREADS"] = "1"  # read when the backend opens, in both
    dname = "bf16" if cuda else "f32"
    shape = (1, args.n, 1, args.d)

    cases = []
    try:
        import torch

        import flashport.torch  # noqa: F401  (registers torch.ops.flashport)

        dev = "cuda" if cuda else "cpu"
        tdt = torch.bfloat16 if cuda else torch.float32
        cases += cases_for("torch", lambda: [torch.zeros(shape, dtype=tdt, device=dev)
                                             for _ in range(4)],
                           torch.cuda.synchronize if cuda else (lambda: None),
                           torch.ops.flashport)
    except ImportError:
        print("torch not installed: its rows are left out", file=sys.stderr)
    if not cuda:
        import numpy as np

        cases += cases_for("NumPy", lambda: [np.zeros(shape, np.float32) for _ in range(4)],
                           lambda: None, None)
    else:
        try:
            import cupy as cp

            cases += cases_for("CuPy", lambda: [cp.zeros(shape, cp.float16) for _ in range(4)],
                               cp.cuda.get_current_stream().synchronize, None)
        except ImportError:
            pass

    c_rows = {"fwd": [], "bwd": []}
    times = {name: [] for name, *_ in cases}
    over = {name: [] for name, *_ in cases}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_call_time(tmp)
        for _ in range(args.rounds):
            c_fwd, c_bwd = c_times(exe, args.backend, dname, args.n, args.d, args.reps,
                                   args.clock)
            c_rows["fwd"].append(c_fwd)
            c_rows["bwd"].append(c_bwd)
            base = {"fwd": c_fwd, "bwd": c_bwd, "fwd+bwd": c_fwd + c_bwd, None: 0.0}
            for name, b, fn, sync in cases:
                t = py_time(fn, sync, args.reps, args.clock)
                times[name].append(t)
                over[name].append(t - base[b])

    print(f"flashport {flashport.version()}, backend {args.backend}, {dname}, causal, "
          f"q/k/v [1, {args.n}, 1, {args.d}], {args.reps} calls per trial, best of 7 trials, "
          f"median (range) over {args.rounds} rounds of C and Python alternating, "
          f"{args.clock} clock, FLASHPORT_NUM_THREADS="
          f"{os.environ.get('FLASHPORT_NUM_THREADS', '(unset)')}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("| call | C baseline | us per call | over the C call, us |")
    print("|---|---|---|---|")
    for d in ("fwd", "bwd"):
        print(f"| C API (call_time.c) | {d} | {median(c_rows[d]):.2f} "
              f"({min(c_rows[d]):.2f} .. {max(c_rows[d]):.2f}) | |")
    for name, b, _, _ in cases:
        o = over[name]
        if b is None:  # a floor of torch's own: its time is the figure
            print(f"| {name} | none | {median(times[name]):.2f} "
                  f"({min(times[name]):.2f} .. {max(times[name]):.2f}) | |")
            continue
        print(f"| {name} | {b} | {median(times[name]):.2f} | {median(o):+.2f} "
              f"({min(o):+.2f} .. {max(o):+.2f}) |")


if __name__ == "__main__":
    main()
