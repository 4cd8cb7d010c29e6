#!/usr/bin/env bash
# A/B timing of two or more builds of the library on one GPU (e.g. a kernel change whose SASS
# differs, against the tree before it and a reference build).
#
#   OUT=/tmp/ab tests/gpu/ab_libs.sh OLD_LIBDIR NEW_LIBDIR [REF_LIBDIR ...] [compare_torch.py arguments]
#
# Each LIBDIR holds libflashport.so and its libflashport_cuda.so; the leading arguments that are
# folders are the builds, named old, new, ref, lib4, ... in that order. bench/compare_torch.py
# runs AB_ROUNDS times (default 2) over every build in turn (old new ref old new ref ...), each
# in its own process (a process loads one library), by default with --impls fa2 --rounds 1
# --rep 20 over the whole grid. Our speed is taken relative to SDPA flash (FA2) timed in the
# same process, which cancels clock and thermal drift between processes; the summary gives, per
# direction, each build's ratio over old's (mean over the rounds) and, as the noise, the
# identical-code controls (a build's last round over its first), then one line per shape. A
# change is "no slower" when new / old stays within the controls' spread.
set -euo pipefail
libs=()
while [ $# -gt 0 ] && [ -d "$1" ]; do
  libs+=("$1")
  shift
done
[ ${#libs[@]} -ge 2 ] || { echo "usage: ab_libs.sh OLD_LIBDIR NEW_LIBDIR [MORE_LIBDIRS] [args]" >&2; exit 2; }
names=(old new ref)
for ((i = 3; i < ${#libs[@]}; i++)); do names+=("lib$((i + 1))"); done
rounds=${AB_ROUNDS:-2}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "ab_libs.sh: AB_ROUNDS must be a positive count" >&2; exit 2; }
OUT=${OUT:-$PWD/out-ab}
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--impls fa2 --rounds 1 --rep 20)
mkdir -p "$OUT"
# compare_torch.py imports the flashport package: built once without GPU plugins (as
# run_h200.sh's bench stage does) when Python cannot import it; --lib picks each build.
if ! python3 -c 'import flashport' 2>/dev/null; then
  PY=${AB_PY:-$PWD/build-ab-py}
  [ -e "$PY/flashport" ] || python3 -m pip install -q --no-build-isolation --no-deps --target "$PY" \
    -C cmake.define.FLASHPORT_CUDA=OFF -C cmake.define.FLASHPORT_HIP=OFF . >"$OUT/pip.log" 2>&1 ||
    { tail -20 "$OUT/pip.log"; exit 1; }
  export PYTHONPATH=$PY${PYTHONPATH:+:$PYTHONPATH}
fi
for ((r = 1; r <= rounds; r++)); do
  for i in "${!libs[@]}"; do
    run=${names[$i]}$r
    PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --lib "${libs[$i]}/libflashport.so" \
      --out "$OUT/$run" "${args[@]}" >"$OUT/$run.log" 2>&1 || { tail -20 "$OUT/$run.log"; exit 1; }
  done
done
python3 - "$OUT" "$rounds" "${names[@]:0:${#libs[@]}}" <<'PY' | tee "$OUT/summary.txt"
import csv, statistics, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def ratios(run):
    t = {}
    for r in csv.DictReader(open(f"{out}/{run}/compare_torch.csv")):
        # heads in the key: --heads runs several head counts per (dtype, D, N)
        t[(r["dtype"], r["D"], r["N"], r["H"], r.get("HKV", r["H"]), r["causal"], r["direction"],
           r["impl"])] = float(r["tflops"])
    return {k[:7]: v / t[k[:7] + ("fa2",)] for k, v in t.items() if k[7] == "ours"}
r = {f"{n}{i}": ratios(f"{n}{i}") for n in names for i in range(1, rounds + 1)}
def mean(n, k):
    return statistics.mean(r[f"{n}{i}"][k] for i in range(1, rounds + 1))
def span(xs):
    return f"{min(xs):.3f} .. {max(xs):.3f} (median {statistics.median(xs):.3f})"
for d in ("fwd", "bwd"):
    keys = sorted(k for k in r[f"{names[0]}1"] if k[6] == d)
    for n in names[1:]:
        ab = [mean(n, k) / mean(names[0], k) for k in keys]
        print(f"{d}: {n}/{names[0]} {span(ab)}; {len(keys)} shapes")
        worst = min(zip(ab, keys))
        print(f"{d}: slowest {n}/{names[0]} {worst[0]:.3f} at {worst[1]}")
    if rounds > 1:
        print(f"{d}: controls " + "; ".join(
            f"{n}{rounds}/{n}1 {span([r[f'{n}{rounds}'][k] / r[f'{n}1'][k] for k in keys])}"
            for n in names))
print("per shape: ours / FA2 in the same process, each round, then the builds' means over "
      f"{names[0]}'s" + (f" and {names[1]} / {names[2]}" if len(names) > 2 else ""))
print("dir dtype D N H[/HKV] causal | " + " | ".join(names) + " | " +
      " ".join(f"{n}/{names[0]}" for n in names[1:]) +
      (f" {names[1]}/{names[2]}" if len(names) > 2 else ""))
for k in sorted(r[f"{names[0]}1"], key=lambda k: (k[6], int(k[1]), int(k[2]), k[5], k[0])):
    cols = " | ".join(" ".join(f"{r[f'{n}{i}'][k]:.3f}" for i in range(1, rounds + 1))
                      for n in names)
    rel = " ".join(f"{mean(n, k) / mean(names[0], k):.3f}" for n in names[1:])
    if len(names) > 2:
        rel += f" {mean(names[1], k) / mean(names[2], k):.3f}"
    heads = k[3] if k[4] == k[3] else f"{k[3]}/{k[4]}"
    print(f"{k[6]} {k[0]} {k[1]} {k[2]} {heads} {k[5]} | {cols} | {rel}")
PY
