#!/usr/bin/env bash
# A/B timing of the OpenCL backend's kernels: the tree at OLD (default 8fe7d31, checked out into a
# git worktree) against this tree, both built with CUDA off, timed by flashport-bench in turns
# (old new old new ..., ROUNDS rounds, each its own process) on the same shapes, --check on.
#
#   OUT=/tmp/ab tests/gpu/ab_opencl.sh
#
# Environment: OLD, ROUNDS (default 3), MMA (FLASHPORT_OPENCL_MMA for both, default 0: the plain
# path), DTYPE (default bf16), DIMS (default 128), SEQLENS (default "2048 8192"), TOKENS and
# HIDDEN (B * N and H * D, default 16384 and 2048, the ANCHORS grid), ITERS (timed runs per
# shape, default 5), PLATFORM (FLASHPORT_OPENCL_PLATFORM, default NVIDIA). Writes $OUT/old-N.csv
# and new-N.csv per round and $OUT/ab.md: per shape and direction the median TFLOP/s of each
# side over the rounds, new / old, and the rounds' spread of each side (the noise).
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
OLDTREE="$OUT/old-tree"
[ -d "$OLDTREE" ] || git worktree add --detach "$OLDTREE" "$OLD" >"$OUT/worktree.log" 2>&1 ||
    { cat "$OUT/worktree.log"; exit 1; }
CLINC=()
[ -e /usr/include/CL/cl.h ] || CLINC=(-DFLASHPORT_OPENCL_INCLUDE_DIR=/usr/local/cuda/include)
for side in old new; do
    src=.
    [ $side = old ] && src=$OLDTREE
    GEN=()
    command -v ninja >/dev/null && [ ! -e "$OUT/build-$side/CMakeCache.txt" ] && GEN=(-G Ninja)
    { cmake -S "$src" -B "$OUT/build-$side" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DFLASHPORT_CUDA=OFF -DFLASHPORT_HIP=OFF -DFLASHPORT_OPENCL=ON "${CLINC[@]}" &&
        cmake --build "$OUT/build-$side" -j "$(nproc)" --target flashport-bench flashport_opencl
    } >"$OUT/build-$side.log" 2>&1 || { tail -30 "$OUT/build-$side.log"; exit 1; }
done
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
done
python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/ab.md"
import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
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
print("| dtype | D | N | causal | dir | old TFLOP/s | new TFLOP/s | new / old | old spread | new spread |")
print("|---|---|---|---|---|---|---|---|---|---|")
for key in sorted(t):
    o, n = t[key].get("old", []), t[key].get("new", [])
    if not o or not n:
        continue
    mo, mn = statistics.median(o), statistics.median(n)
    print("| " + " | ".join(key) + f" | {mo:.3g} | {mn:.3g} | {mn / mo:.3f} | "
          f"{min(o):.3g} .. {max(o):.3g} | {min(n):.3g} .. {max(n):.3g} |")
PY
