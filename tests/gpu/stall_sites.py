#!/usr/bin/env python3
"""The SASS instructions where a kernel's warps stall most, from an Nsight Compute source-page CSV
(warp-state sampling), for reading a profile without the Nsight Compute GUI:

    ncu --clock-control none -k regex:fp_sm80_bwd_dkdv -c 1 --section SourceCounters \\
        --page source --print-source sass --csv python3 tests/gpu/profile_one.py \\
        --lib build-gpu/lib/libflashport.so --dim 128 --seqlen 8192 > src.csv
    python3 tests/gpu/stall_sites.py src.csv [--top 40]

Prints the columns found, then the top instructions by sampled stalls with their neighbours'
opcodes, the samples summed per opcode, and the executed instructions per opcode (the
instruction mix).
"""
import argparse
import collections
import csv
import io


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    text = open(args.csv, errors="replace").read()
    start = text.find('"Address"')
    if start < 0:
        start = text.find('"#"')
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    if not rows:
        print("no source rows found")
        return
    cols = list(rows[0].keys())
    print("columns:", cols)
    samp = next((c for c in cols if c.startswith("Warp Stall Sampling (All")), None)
    if samp is None:
        print("no warp stall sampling column")
        return

    def num(x):
        try:
            return float(str(x).replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(num(r[samp]) for r in rows) or 1.0
    src = "Source"
    order = sorted(range(len(rows)), key=lambda i: -num(rows[i][samp]))
    print(f"total samples {total:.0f}")
    for i in order[: args.top]:
        r = rows[i]
        prev = rows[i - 1][src].split()[0] if i > 0 else ""
        print(f"{100 * num(r[samp]) / total:5.1f}%  {r.get('Address', '')}  {r[src][:70]:70s}"
              f"  (after {prev})")
    def per_opcode(column):
        """column summed per opcode (without its modifiers and predicate)"""
        sums = collections.Counter()
        for r in rows:
            op = r[src].split()
            if op:
                name = op[1] if op[0].startswith("@") and len(op) > 1 else op[0]
                sums[name.split(".")[0]] += num(r[column])
        return sums

    per_op = per_opcode(samp)
    print("per opcode:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in per_op.most_common(15)))
    # executed warp instructions per opcode (the instruction mix, to set against another kernel's)
    ex = next((c for c in cols if c.startswith("Instructions Executed")), None)
    if ex is not None:
        mix = per_opcode(ex)
        n = sum(mix.values()) or 1.0
        print(f"executed warp instructions {n:.4g}:",
              ", ".join(f"{k} {v:.4g} ({100 * v / n:.1f}%)" for k, v in mix.most_common(24)))

if __name__ == "__main__":
    main()
