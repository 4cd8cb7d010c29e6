#!/usr/bin/env bash
# The CPU targets of ANCHORS.md on this machine, as recorded in docs/bench/cpu.md: f32 forward and
# backward against the FMA peak measured in the same run, f32 forward against the BLAS-materialized
# baseline (--baseline blas), bf16 forward against f32 forward. D = 64 (H = 8) and D = 128 (H = 4),
# N = 1024 .. 8192, causal and not, B = 1, 2 threads.
#
#   bench/cpu_targets.sh BUILD_DIR OUT_DIR [PASSES]      (default 3 passes; ~8 min on 2 cores)
#
# Every shape runs in its own process, so each gets its own peak measurement next to it (the
# development machine is shared and its speed drifts); the summary (OUT_DIR/summary.md) is the
# median over the passes, per-pass values in parentheses. Needs python3 for the summary.
set -euo pipefail
build=${1:?usage: cpu_targets.sh BUILD_DIR OUT_DIR [PASSES]}
out=${2:?usage: cpu_targets.sh BUILD_DIR OUT_DIR [PASSES]}
passes=${3:-3}
bench="$build/bin/flashport-bench"
mkdir -p "$out"
rm -f "$out/f32.csv" "$out/bf16.csv" "$out/log.txt"
export FLASHPORT_NUM_THREADS=${FLASHPORT_NUM_THREADS:-2}
for pass in $(seq "$passes"); do
  for dh in "64 8" "128 4"; do
    read -r d h <<<"$dh"
    for n in 1024 2048 4096 8192; do
      for c in 0 1; do
        "$bench" --backend cpu --dtype f32 --heads "$h" --seqlen "$n" --hdim "$d" --causal="$c" \
          --direction both --iters 3 --baseline blas --csv "$out/f32.csv" >>"$out/log.txt" 2>&1
        "$bench" --backend cpu --dtype bf16 --heads "$h" --seqlen "$n" --hdim "$d" --causal="$c" \
          --direction fwd --iters 3 --csv "$out/bf16.csv" >>"$out/log.txt" 2>&1
      done
    done
  done
done

python3 - "$out" >"$out/summary.md" <<'EOF'
import csv, statistics as st, sys
from collections import defaultdict
out = sys.argv[1]
key = lambda r: (int(r['hdim']), int(r['heads']), int(r['seqlen_q']), int(r['causal']))
passes, cur = defaultdict(list), defaultdict(dict)
for r in csv.DictReader(open(out + '/f32.csv')):
    k, tag = key(r), (r['backend'], r['direction'])
    if tag in cur[k]:
        passes[k].append(cur[k])
        cur[k] = {}
    cur[k][tag] = r
for k, v in cur.items():
    if v:
        passes[k].append(v)
bf = defaultdict(list)
for r in csv.DictReader(open(out + '/bf16.csv')):
    bf[key(r)].append(r)

def show(vals, fmt):
    return fmt % st.median(vals) + ' (' + '/'.join(fmt % v for v in vals) + ')'

print('| D | H | N | causal | fwd GFLOP/s | fwd % of peak | bwd GFLOP/s | bwd % of peak '
      '| BLAS GFLOP/s | fwd speedup over BLAS | bf16 fwd GFLOP/s | bf16 / f32 fwd | peak GFLOP/s |')
print('|' + '---|' * 13)
for k in sorted(passes):
    P, B = passes[k], bf[k]
    g = lambda tag, f: [float(p[tag][f]) for p in P]
    fwd, bwd, blas = ('cpu', 'fwd'), ('cpu', 'bwd'), ('blas', 'fwd')
    ratio = [float(p[blas]['ms_median']) / float(p[fwd]['ms_median']) for p in P]
    bratio = [float(P[i][fwd]['ms_median']) / float(B[i]['ms_median'])
              for i in range(min(len(P), len(B)))]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {'yes' if k[3] else 'no'} "
          f"| {st.median(g(fwd, 'tflops')) * 1e3:.0f} | {show(g(fwd, 'pct_peak'), '%.0f')} "
          f"| {st.median(g(bwd, 'tflops')) * 1e3:.0f} | {show(g(bwd, 'pct_peak'), '%.0f')} "
          f"| {st.median(g(blas, 'tflops')) * 1e3:.0f} | {show(ratio, '%.2f')} "
          f"| {st.median(float(r['tflops']) for r in B) * 1e3:.0f} | {show(bratio, '%.2f')} "
          f"| {st.median(g(fwd, 'peak_tflops')) * 1e3:.0f} |")
EOF
cat "$out/summary.md"
