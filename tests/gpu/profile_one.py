#!/usr/bin/env python3
"""One forward and one backward of one ANCHORS.md shape through flashport's CUDA backend, for a
profiler to wrap (Nsight Compute on the GPU machine, see tests/gpu/run_h200.sh):

    ncu --clock-control none -k regex:fp_sm80 python3 tests/gpu/profile_one.py \
        --lib build-gpu/lib/libflashport.so --dim 128 --seqlen 8192

--sdpa runs PyTorch SDPA's flash backend (FlashAttention-2) on the same shape instead, so that
one profile can hold both sides (its kernels match regex:flash_).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from compare_torch import Flashport  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--sdpa", action="store_true", help="SDPA flash instead of flashport")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    D, N = args.dim, args.seqlen
    B, H = max(1, 16384 // N), max(1, 2048 // D)
    if args.sdpa:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        # the layout bench/compare_torch.py gives both sides: (B, N, H, D) memory, seen as
        # (B, H, N, D)
        q, k, v, do = (torch.randn(B, N, H, D, device="cuda", dtype=dtype).transpose(1, 2)
                       for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
            o.backward(do)
        torch.cuda.synchronize()
        print(f"profiled SDPA flash {args.dtype} B{B} H{H} N{N} D{D} causal={int(args.causal)}")
        return
    fp = Flashport(args.lib)
    fp.use_torch_stream()
    q, k, v, do = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(4))
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
    prm = fp.params(args.causal, args.deterministic)
    fp.forward(prm, q, k, v, o, lse)
    fp.backward(prm, q, k, v, o, lse, do, dq, dk, dv)
    torch.cuda.synchronize()
    print(f"profiled {args.dtype} B{B} H{H} N{N} D{D} causal={int(args.causal)}: "
          f"|O| {o.float().norm().item():.3e} |dQ| {dq.float().norm().item():.3e}")


if __name__ == "__main__":
    main()
