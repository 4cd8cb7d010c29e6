#!/usr/bin/env bash
# The OpenCL FA2-shaped backward's settings timed against each other on one tree (this one), in
# one call of the device: built once with CUDA off (the OpenCL plugin, flashport-bench,
# test_backends, test_reliability), the whole shared case table and the masked-key scenarios
# run once (FLASHPORT_OPENCL_MMA=$MMA, default settings), SDPA's math backend on the same shapes
# (bench/sdpa_grid.py, the GPU otherwise idle), then flashport-bench in turns of the settings
# (docs/opencl.md, "The backward's fast path and query blocks"), each run its own process:
#   new    the default (fast path; query blocks of 32 up to head-dim class 64; dQ by vector
#          reductions on compute capability >= 9.0)
#   fast0  FLASHPORT_OPENCL_BWD_FAST=0 (the exact per-pair code everywhere)
#   bq16   FLASHPORT_OPENCL_BWD_BQ=16 (query blocks of 16; D <= 64 only, the same programs above)
#   red1   FLASHPORT_OPENCL_RED_VEC=0 (dQ by one reduction a float, not one a run of four)
# per shape the SETTINGS in turn, ROUNDS rounds; the backward every turn, the forward once (new's
# first round); --check in the first round only (the same programs run after it). Writes to
# $OUT (6 files): bwd.md (per shape each setting's median TFLOP/s over the rounds and its
# spread, SDPA math, new / math, new / each other setting; the table's totals first), bench.csv
# (every run's rows, a `setting` and a `round` column first), bench.log, table.log, sdpa.csv,
# sdpa.log. The build and the runs' own CSVs go to $WORK.
#
#   OUT=/tmp/bwd tests/gpu/bwd_opencl.sh
#
# Environment: SETTINGS (default "new fast0 bq16"), ROUNDS (default 2), MMA (default nv), DTYPE
# (default bf16), DIMS (default "64 128 256"), SEQLENS (default "2048 8192"), TOKENS and HIDDEN
# (B * N and H * D, default 16384 and 2048, the ANCHORS grid), ITERS (default 5), PLATFORM
# (default NVIDIA), TABLE (default 1), SDPA (default 1), WORK (default /tmp/bwd_opencl), STOP_S
# (default 450: no bench run starts after this many seconds of the script, each is stopped after
# 90, so that the whole stays within a device call of 540 s and bwd.md is written).
# Expected on the H200 (16 cores): build ~60 s, table and masked keys ~100 s, SDPA ~40 s, 28
# bench runs of ~10 s: ~480 s.
set -uo pipefail
start=$(date +%s)
OUT=${OUT:-$PWD/out-bwd}
WORK=${WORK:-/tmp/bwd_opencl}
ROUNDS=${ROUNDS:-2}
TOKENS=${TOKENS:-16384}
HIDDEN=${HIDDEN:-2048}
DIMS=${DIMS:-64 128 256}
SEQLENS=${SEQLENS:-2048 8192}
STOP_S=${STOP_S:-450}
export FLASHPORT_OPENCL_PLATFORM=${PLATFORM:-NVIDIA}
export FLASHPORT_OPENCL_MMA=${MMA:-nv}
export PATH=$PATH:/usr/local/cuda/bin
SETTINGS=${SETTINGS:-new fast0 bq16}
unset FLASHPORT_OPENCL_BWD_FAST FLASHPORT_OPENCL_BWD_BQ FLASHPORT_OPENCL_RED_VEC
mkdir -p "$OUT" "$WORK"
# shellcheck source=tests/gpu/opencl_lib.sh
. "$(dirname "$0")/opencl_lib.sh"
opencl_build . "$WORK/build" "$WORK/build.log" flashport-bench flashport_opencl test_backends \
    test_reliability || exit 1
BIN=$WORK/build/bin
echo "built in $(($(date +%s) - start)) s"

if [ "${TABLE:-1}" = 1 ]; then
    opencl_table "$BIN" "$OUT/table.log"
    {
        echo "### test_reliability opencl --masked-keys"
        timeout 120 "$BIN/test_reliability" opencl --masked-keys
        echo "rc=$? (reliability)"
    } >>"$OUT/table.log" 2>&1
    echo "table done at $(($(date +%s) - start)) s"
fi
if [ "${SDPA:-1}" = 1 ]; then
    timeout 300 python3 bench/sdpa_grid.py --impls math --dims "${DIMS// /,}" \
        --seqlens "${SEQLENS// /,}" --tokens "$TOKENS" --hidden "$HIDDEN" --csv "$OUT/sdpa.csv" \
        >"$OUT/sdpa.log" 2>&1 || echo "sdpa: rc=$?"
    echo "sdpa done at $(($(date +%s) - start)) s"
fi

report() {
    python3 - "$OUT" "$WORK" "$SETTINGS" <<'PY' >"$OUT/bwd.md"
import csv, glob, os, re, statistics, sys
out, work = sys.argv[1], sys.argv[2]
others = [x for x in sys.argv[3].split() if x != "new"]
if os.path.exists(f"{out}/table.log"):
    text = open(f"{out}/table.log").read()
    p = f = u = 0
    for m in re.finditer(r"opencl: (\d+) passed, (\d+) failed, (\d+) unsupported", text):
        p, f, u = p + int(m[1]), f + int(m[2]), u + int(m[3])
    rel = re.findall(r"^.*(?:scenario|checks? failed).*$", text, re.M)[-1:]
    print(f"whole table (FLASHPORT_OPENCL_MMA={os.environ.get('FLASHPORT_OPENCL_MMA')}, default "
          f"settings): {p} passed, {f} failed, {u} unsupported; process exits: "
          f"{' '.join(re.findall(r'^rc=.*$', text, re.M))}; reliability: {' '.join(rel) or '-'}\n")
math = {}
if os.path.exists(f"{out}/sdpa.csv"):
    for row in csv.DictReader(open(f"{out}/sdpa.csv")):
        if row["impl"] == "math" and row["tflops"]:
            key = (row["hdim"], row["seqlen"], row["causal"], row["direction"])
            math[key] = float(row["tflops"])
t, rows_out = {}, []
for path in sorted(glob.glob(f"{work}/runs/*-*.csv")):
    setting, rnd = os.path.basename(path)[:-4].rsplit("-", 1)
    for row in csv.DictReader(open(path)):
        rows_out.append({"setting": setting, "round": rnd, **row})
        key = tuple(row.get(c, "") for c in ("dtype", "hdim", "seqlen_q", "causal", "direction"))
        t.setdefault(key, {}).setdefault(setting, []).append(float(row["tflops"]))
if rows_out:
    with open(f"{out}/bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows_out[0].keys()), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows_out)
def cell(v):
    return f"{statistics.median(v):.3g} ({min(v):.3g} .. {max(v):.3g})" if v else "-"
def ratio(a, b):
    return f"{statistics.median(a) / statistics.median(b):.3f}" if a and b else "-"
print("TFLOP/s, medians over the rounds (min .. max):\n")
print("| dtype | D | N | causal | dir | new | " + "".join(f"{o} | " for o in others) +
      "SDPA math | new / math | " + "".join(f"new / {o} | " for o in others))
print("|---" * (8 + 2 * len(others)) + "|")
for key in sorted(t, key=lambda k: (k[4], int(k[1]), int(k[2]), k[3])):
    s = t[key]
    n = s.get("new", [])
    sm = math.get(key[1:])
    print("| " + " | ".join(key) + f" | {cell(n)} | " +
          "".join(f"{cell(s.get(o, []))} | " for o in others) + f"{f'{sm:.3g}' if sm else '-'} | "
          f"{f'{statistics.median(n) / sm:.3f}' if n and sm else '-'} | " +
          "".join(f"{ratio(n, s.get(o, []))} | " for o in others))
PY
}

rm -rf "$WORK/runs"
mkdir -p "$WORK/runs"
for r in $(seq 1 "$ROUNDS"); do
    for D in $DIMS; do
        for N in $SEQLENS; do
            for setting in $SETTINGS; do
                [ $setting = bq16 ] && [ "$D" -gt 64 ] && continue
                if [ $(($(date +%s) - start)) -ge "$STOP_S" ]; then
                    echo "stopped at $(($(date +%s) - start)) s before round $r D=$D N=$N $setting"
                    break 3
                fi
                env=()
                [ $setting = fast0 ] && env=(FLASHPORT_OPENCL_BWD_FAST=0)
                [ $setting = bq16 ] && env=(FLASHPORT_OPENCL_BWD_BQ=16)
                [ $setting = red1 ] && env=(FLASHPORT_OPENCL_RED_VEC=0)
                dir=bwd check=()
                [ $setting = new ] && [ "$r" = 1 ] && dir=both
                [ "$r" = 1 ] && check=(--check)
                echo "### round $r D=$D N=$N $setting ($dir)" >>"$OUT/bench.log"
                env "${env[@]}" timeout 90 "$BIN/flashport-bench" --backend opencl \
                    --dtype "${DTYPE:-bf16}" --batch $((TOKENS / N)) --heads $((HIDDEN / D)) \
                    --seqlen "$N" --hdim "$D" --causal=0,1 --direction $dir \
                    --iters "${ITERS:-5}" "${check[@]}" --csv "$WORK/runs/$setting-$r.csv" \
                    >>"$OUT/bench.log" 2>&1 || echo "round $r D=$D N=$N $setting: rc=$?"
            done
        done
    done
    report
done
report
echo "done at $(($(date +%s) - start)) s"
cat "$OUT/bwd.md"
