#!/usr/bin/env python3
"""TFLOP/s against sequence length, one line per backend, from flashport-bench's CSV or JSON.

    python3 bench/plot.py RESULTS.csv|RESULTS.json [more files] [-o out.png] [--anchors]

One panel per (direction, head dim, causal); one line per (backend, variant, dtype), the x axis
the key length N (log 2). Rows that failed their check are drawn hollow. --anchors adds the
H200 reference lines of ANCHORS.md (FA2 and cuDNN, bf16, the B * N = 16384, H * D = 2048 grid)
where a panel's head dim and causal flag match, so a GPU run is read against them.
"""
import argparse
import csv
import json
import math
import os
import sys
from collections import defaultdict

# ANCHORS.md, GPU table: (D, causal) -> {N: (FA2 fwd, FA2 bwd, cuDNN fwd, cuDNN bwd)}.
ANCHORS = {
    (64, 0): {512: (264, 209, 380, 277), 2048: (300, 265, 459, 420), 8192: (309, 287, 484, 453),
              16384: (310, 291, 457, 460)},
    (64, 1): {512: (154, 138, 258, 166), 2048: (261, 221, 395, 327), 8192: (293, 262, 447, 415),
              16384: (301, 278, 471, 436)},
    (128, 0): {512: (302, 221, 519, 335), 2048: (348, 284, 642, 487), 8192: (357, 307, 635, 537),
               16384: (353, 309, 618, 550)},
    (128, 1): {512: (183, 155, 336, 211), 2048: (284, 245, 525, 400), 8192: (319, 292, 599, 496),
               16384: (325, 316, 638, 532)},
    (256, 0): {512: (283, 195, 521, 236), 2048: (321, 243, 688, 344), 8192: (325, 256, 716, 353),
               16384: (326, 261, 668, 361)},
    (256, 1): {512: (209, 140, 345, 178), 2048: (271, 209, 540, 320), 8192: (289, 249, 604, 392),
               16384: (294, 257, 627, 383)},
}


def load(path):
    """Rows of one bench output as dicts with the CSV's column names."""
    with open(path, newline="") as f:
        if path.endswith(".json"):
            rows = json.load(f)
        else:
            rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        tflops = r.get("tflops")
        if tflops in (None, ""):
            continue
        out.append({
            "backend": str(r["backend"]), "variant": str(r.get("variant", "")),
            "dtype": str(r["dtype"]), "direction": str(r["direction"]),
            "hdim": int(r["hdim"]), "causal": int(r["causal"]),
            "n": int(r["seqlen_k"]), "tflops": float(tflops),
            "ok": str(r.get("check", "off")) != "FAIL",
        })
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="flashport-bench --csv or --json files")
    ap.add_argument("-o", "--output", help="PNG to write (default: first input with .png)")
    ap.add_argument("--anchors", action="store_true", help="draw ANCHORS.md's H200 FA2 / cuDNN")
    args = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for path in args.inputs for r in load(path)]
    if not rows:
        sys.exit("plot.py: no rows with a TFLOP/s figure in " + ", ".join(args.inputs))
    panels = sorted({(r["direction"], r["hdim"], r["causal"]) for r in rows})
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
    for ax, (direction, hdim, causal) in zip(axes.flat, panels):
        lines = defaultdict(list)
        for r in rows:
            if (r["direction"], r["hdim"], r["causal"]) == (direction, hdim, causal):
                label = r["backend"] + ("/" + r["variant"] if r["variant"] not in ("", "default")
                                        else "") + " " + r["dtype"]
                lines[label].append(r)
        for label, pts in sorted(lines.items()):
            pts.sort(key=lambda r: r["n"])
            xs, ys = [r["n"] for r in pts], [r["tflops"] for r in pts]
            (line,) = ax.plot(xs, ys, marker="o", label=label)
            bad = [r for r in pts if not r["ok"]]
            if bad:
                ax.plot([r["n"] for r in bad], [r["tflops"] for r in bad], "o", mfc="white",
                        mec=line.get_color(), label=label + " (check FAILED)")
        anchor = ANCHORS.get((hdim, causal)) if args.anchors else None
        if anchor and direction in ("fwd", "bwd"):
            k = 0 if direction == "fwd" else 1
            ns = sorted(anchor)
            ax.plot(ns, [anchor[n][k] for n in ns], "k--", lw=1, label="H200 FA2 (ANCHORS.md)")
            ax.plot(ns, [anchor[n][k + 2] for n in ns], "k:", lw=1,
                    label="H200 cuDNN (ANCHORS.md)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{direction}, D = {hdim}{', causal' if causal else ''}")
        ax.set_xlabel("N (keys)")
        ax.set_ylabel("TFLOP/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    out = args.output or os.path.splitext(args.inputs[0])[0] + ".png"
    fig.savefig(out, dpi=110)
    print(f"plot.py: {len(rows)} rows, {len(panels)} panel(s) -> {out}")


if __name__ == "__main__":
    main()
