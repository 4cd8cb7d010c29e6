#!/usr/bin/env python3
"""PyTorch SDPA's math and memory-efficient backends timed on the ANCHORS grid, as a CSV that
tests/gpu/run_opencl_h200.sh sets beside flashport-bench's rows of our OpenCL and CUDA backends.

Our OpenCL backend cannot run inside bench/compare_torch.py, whose flashport calls take torch's
CUDA tensors through DLPack (OpenCL memory is buffer objects of another runtime), so its numbers
come from flashport-bench in the same session and these are SDPA's, same shapes, same GPU.

Grid: B*N = 16384 tokens, H*D = 2048 (--tokens, --hidden), bf16, forward and backward, causal
and not. Timed with triton.testing.do_bench (CUDA events, median). A backend that refuses a
shape or runs out of memory (math at large N materializes B*H*N*N scores) gets an empty time
and its error.

    python3 bench/sdpa_grid.py --dims 128 --seqlens 512,2048,8192,16384 --csv sdpa.csv
"""
import argparse
import csv
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton.testing

IMPLS = {"math": SDPBackend.MATH, "eff": SDPBackend.EFFICIENT_ATTENTION}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,2048,8192,16384")
    ap.add_argument("--impls", default="math,eff")
    ap.add_argument("--tokens", type=int, default=16384, help="B * N of every shape")
    ap.add_argument("--hidden", type=int, default=2048, help="H * D of every shape")
    ap.add_argument("--rep", type=int, default=60, help="do_bench repetition time, ms")
    ap.add_argument("--csv", required=True, help="appended to; header if new")
    args = ap.parse_args()
    new = not os.path.exists(args.csv) or os.path.getsize(args.csv) == 0
    with open(args.csv, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["impl", "hdim", "seqlen", "batch", "heads", "causal", "direction", "ms",
                        "tflops", "note"])
        for D in [int(x) for x in args.dims.split(",")]:
            for N in [int(x) for x in args.seqlens.split(",")]:
                B, H = args.tokens // N, args.hidden // D
                q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
                               for _ in range(4))
                for causal in (0, 1):
                    flops = 4.0 * B * H * N * N * D / (2.0 if causal else 1.0)
                    for impl in args.impls.split(","):
                        qt, kt, vt = (x.clone().requires_grad_(True) for x in (q, k, v))
                        try:
                            with sdpa_kernel([IMPLS[impl]]):
                                fwd = triton.testing.do_bench(
                                    lambda: F.scaled_dot_product_attention(
                                        qt, kt, vt, is_causal=bool(causal)),
                                    rep=args.rep, return_mode="median")
                                out = F.scaled_dot_product_attention(qt, kt, vt,
                                                                     is_causal=bool(causal))
                                bwd = triton.testing.do_bench(
                                    lambda: out.backward(do, retain_graph=True),
                                    grad_to_none=[qt, kt, vt], rep=args.rep,
                                    return_mode="median")
                                del out
                            rows = [("fwd", fwd, flops), ("bwd", bwd, 2.5 * flops)]
                            note = ""
                        except RuntimeError as e:  # refused shape or out of memory
                            rows = [("fwd", None, flops), ("bwd", None, 2.5 * flops)]
                            note = str(e).splitlines()[0][:80]
                        for direction, ms, fl in rows:
                            w.writerow([impl, D, N, B, H, causal, direction,
                                        "" if ms is None else f"{ms:.4f}",
                                        "" if ms is None else f"{fl / ms / 1e9:.2f}", note])
                        f.flush()
                        print(f"{impl} D{D} N{N} causal={causal}: "
                              + " ".join(f"{d} {'-' if m is None else f'{fl / m / 1e9:.1f}'}"
                                         for d, m, fl in rows) + f" {note}", flush=True)
                        del qt, kt, vt
                        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
