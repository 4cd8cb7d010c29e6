#!/usr/bin/env bash
# A/B timing of two builds of the library on one GPU (e.g. a kernel change whose SASS differs).
#
#   OUT=/tmp/ab tests/gpu/ab_libs.sh OLD_LIBDIR NEW_LIBDIR [compare_torch.py arguments]
#
# Each LIBDIR holds libflashport.so and its libflashport_cuda.so. bench/compare_torch.py runs four
# times, old new old new, each in its own process (a process loads one library), by default with
# --impls fa2 --rounds 1 --rep 20 over the whole grid. Our speed is taken relative to SDPA flash
# (FA2) timed in the same process, which cancels clock and thermal drift between processes; the
# summary gives, per direction, new / old of that ratio (mean of the two runs of each) and, as the
# noise, the identical-code controls old2 / old1 and new2 / new1. A change is "no slower" when
# new / old stays within the controls' spread.
set -euo pipefail
old=$1 new=$2
shift 2
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
for run in old1 new1 old2 new2; do
  dir=$old
  [[ $run == new* ]] && dir=$new
  PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --lib "$dir/libflashport.so" \
    --out "$OUT/$run" "${args[@]}" >"$OUT/$run.log" 2>&1 || { tail -20 "$OUT/$run.log"; exit 1; }
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import csv, statistics, sys
out = sys.argv[1]
def ratios(run):
    t = {}
    for r in csv.DictReader(open(f"{out}/{run}/compare_torch.csv")):
        # heads in the key: --heads runs several head counts per (dtype, D, N)
        t[(r["dtype"], r["D"], r["N"], r["H"], r.get("HKV", r["H"]), r["causal"], r["direction"],
           r["impl"])] = float(r["tflops"])
    return {k[:7]: v / t[k[:7] + ("fa2",)] for k, v in t.items() if k[7] == "ours"}
r = {run: ratios(run) for run in ("old1", "new1", "old2", "new2")}
for d in ("fwd", "bwd"):
    keys = sorted(k for k in r["old1"] if k[6] == d)
    def span(xs):
        return f"{min(xs):.3f} .. {max(xs):.3f} (median {statistics.median(xs):.3f})"
    ab = [(r["new1"][k] + r["new2"][k]) / (r["old1"][k] + r["old2"][k]) for k in keys]
    c_old = [r["old2"][k] / r["old1"][k] for k in keys]
    c_new = [r["new2"][k] / r["new1"][k] for k in keys]
    print(f"{d}: new/old {span(ab)}; controls old2/old1 {span(c_old)}, new2/new1 {span(c_new)}; "
          f"{len(keys)} shapes")
    worst = min(zip(ab, keys))
    print(f"{d}: slowest new/old {worst[0]:.3f} at {worst[1]}")
PY
