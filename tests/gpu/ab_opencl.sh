#!/usr/bin/env bash
# A/B timing of the OpenCL backend's kernels: the tree at OLD (default 8fe7d31, checked out into a
# git worktree, or the source tree OLDTREE as it is) against this tree, both built with CUDA off,
# timed by flashport-bench in turns (old new old new ..., ROUNDS rounds, each its own process) on
# the same shapes, --check on. Optionally in the same call: this tree's whole shared case table
# (TABLE=1, run while the old tree builds) and SDPA's math backend on the same shapes (SDPA=1,
# bench/sdpa_grid.py, before the rounds, the GPU otherwise idle), set beside both sides.
#
#   OUT=/tmp/ab tests/gpu/ab_opencl.sh
#
# Environment: OLD, OLDTREE (a source tree of the old side, e.g. `git archive OLD | tar -x -C
# DIR` where the machine has no git history), ROUNDS (default 3), MMA (FLASHPORT_OPENCL_MMA for
# both, default 0: the plain path), DTYPE (default bf16), DIMS (default 128), SEQLENS (default
# "2048 8192"), TOKENS and HIDDEN (B * N and H * D, default 16384 and 2048, the ANCHORS grid),
# ITERS (timed runs per shape, default 5), PLATFORM (FLASHPORT_OPENCL_PLATFORM, default NVIDIA),
# TABLE, SDPA. Writes $OUT/old-N.csv and new-N.csv per round and $OUT/ab.md (rewritten after each
# round): per shape and direction the median TFLOP/s of each side over the rounds, new / old, and
# the rounds' spread of each side (the noise), with SDPA=1 SDPA math's TFLOP/s and new / math,
# old / math ($OUT/sdpa.csv, sdpa.log); with TABLE=1 the table's totals first (its output in
# $OUT/table.log: one process per dtype, FLASHPORT_OPENCL_MMA=$MMA, the caller's workspace).
set -uo pipefail
OUT=${OUT:-$PWD/out-ab}
OLD=${OLD:-8fe7d31}
ROUNDS=${ROUNDS:-3}
TOKENS=${TOKENS:-16384}
HIDDEN=${HIDDEN:-2048}
export FLASHPORT_OPENCL_PLATFORM=${PLATFORM:-NVIDIA}
export FLASHPORT_OPENCL_MMA=${MMA:-0}
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$OUT"
OLDTREE=${OLDTREE:-$OUT/old-tree}
[ -d "$OLDTREE" ] || git worktree add --detach "$OLDTREE" "$OLD" >"$OUT/worktree.log" 2>&1 ||
    { cat "$OUT/worktree.log"; exit 1; }
# shellcheck source=tests/gpu/opencl_lib.sh
. "$(dirname "$0")/opencl_lib.sh"
# build SIDE TARGETS...: the side's tree with CUDA off (opencl_build), the targets given
build() {
    local side=$1 src=.
    shift
    [ "$side" = old ] && src=$OLDTREE
    opencl_build "$src" "$OUT/build-$side" "$OUT/build-$side.log" "$@" || exit 1
}
targets=(flashport-bench flashport_opencl)
[ "${TABLE:-0}" = 1 ] && targets+=(test_backends)
build new "${targets[@]}"
if [ "${TABLE:-0}" = 1 ]; then # while the old side builds
    opencl_table "$OUT/build-new/bin" "$OUT/table.log" &
fi
build old flashport-bench flashport_opencl
wait
if [ "${SDPA:-0}" = 1 ]; then
    DL=${DIMS:-128} SL=${SEQLENS:-2048 8192}
    timeout 300 python3 bench/sdpa_grid.py --impls math --dims "${DL// /,}" --seqlens "${SL// /,}" \
        --tokens "$TOKENS" --hidden "$HIDDEN" --csv "$OUT/sdpa.csv" >"$OUT/sdpa.log" 2>&1 ||
        echo "sdpa: rc=$?"
fi
report() {
    python3 - "$OUT" "$ROUNDS" <<'PY' >"$OUT/ab.md"
import csv, os, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
if os.path.exists(f"{out}/table.log"):
    p = f = u = 0
    for line in open(f"{out}/table.log"):
        m = re.match(r"opencl: (\d+) passed, (\d+) failed, (\d+) unsupported", line)
        if m:
            p, f, u = p + int(m[1]), f + int(m[2]), u + int(m[3])
    rcs = re.findall(r"^rc=\S+", open(f"{out}/table.log").read(), re.M)
    print(f"whole table (new side, FLASHPORT_OPENCL_MMA={os.environ.get('FLASHPORT_OPENCL_MMA')}): "
          f"{p} passed, {f} failed, {u} unsupported; process exits: {' '.join(rcs)}\n")
math = {}
if os.path.exists(f"{out}/sdpa.csv"):
    for row in csv.DictReader(open(f"{out}/sdpa.csv")):
        if row["impl"] == "math" and row["tflops"]:
            math[(row["hdim"], row["seqlen"], row["causal"], row["direction"])] = float(row["tflops"])
t = {}
for side in ("old", "new"):
    for r in range(1, rounds + 1):
        try:
            rows = list(csv.DictReader(open(f"{out}/{side}-{r}.csv")))
        except OSError:
            continue
        for row in rows:
            key = tuple(row.get(c, "") for c in ("dtype", "hdim", "seqlen_q", "causal", "direction"))
            t.setdefault(key, {}).setdefault(side, []).append(float(row["tflops"]))
print("| dtype | D | N | causal | dir | old TFLOP/s | new TFLOP/s | new / old | old spread | new spread "
      "| SDPA math | new / math | old / math |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for key in sorted(t):
    o, n = t[key].get("old", []), t[key].get("new", [])
    if not o or not n:
        continue
    mo, mn = statistics.median(o), statistics.median(n)
    sm = math.get(key[1:])
    m = f"{sm:.3g} | {mn / sm:.3f} | {mo / sm:.3f}" if sm else "- | - | -"
    print("| " + " | ".join(key) + f" | {mo:.3g} | {mn:.3g} | {mn / mo:.3f} | "
          f"{min(o):.3g} .. {max(o):.3g} | {min(n):.3g} .. {max(n):.3g} | {m} |")
PY
}
for r in $(seq 1 "$ROUNDS"); do
    for side in old new; do
        for D in ${DIMS:-128}; do
            for N in ${SEQLENS:-2048 8192}; do
                timeout 300 "$OUT/build-$side/bin/flashport-bench" --backend opencl \
                    --dtype "${DTYPE:-bf16}" --batch $((TOKENS / N)) --heads $((HIDDEN / D)) \
                    --seqlen "$N" --hdim "$D" --causal=0,1 --direction both \
                    --iters "${ITERS:-5}" --check --csv "$OUT/$side-$r.csv" \
                    >>"$OUT/$side.log" 2>&1 || echo "$side round $r D=$D N=$N: rc=$?"
            done
        done
    done
    report
done
cat "$OUT/ab.md"
