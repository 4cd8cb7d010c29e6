#!/usr/bin/env bash
# The OpenCL backend on an NVIDIA GPU through NVIDIA's OpenCL driver (written for the H200 lease):
# build with the CUDA and OpenCL plugins, log the OpenCL device and its extensions, run the whole
# case table (on a caller's workspace) and the host-side test on the GPU's OpenCL device, then
# time forward and backward (bf16) on the ANCHORS grid (B * N = 16384, H * D = 2048) with
# flashport-bench: OpenCL, then our CUDA path, same shapes, same run; SDPA's math and
# memory-efficient backends on the same grid (bench/sdpa_grid.py: compare_torch.py cannot run the
# OpenCL backend, whose memory is not torch's); report writes the table of all four with the
# ratios. On NVIDIA the f16 / bf16 programs are the tensor-core variant (kernels/mma_nv.cl); the
# bench also times the plain path forced (FLASHPORT_OPENCL_MMA=0, rows labelled opencl-plain) for
# the A/B ratio, and the test stage logs which variant each build got (a failed tensor-core build
# falls back to the plain path with a log line, copied into summary.txt). Everything stays in $OUT, appended to, never overwritten by a later call or stage:
# summary.txt, build.log, device.log, test_backends.log, test_opencl.log (every failing check
# with its reason; the failures are copied into summary.txt too), bench.csv, bench.log,
# sdpa.csv, sdpa.log, report.md, variants.log (the builds' log lines of the whole-table run).
#
#   OUT=/tmp/out tests/gpu/run_opencl_h200.sh [stages]
#
# stages: any of build device test bench sdpa report (default: all, in that order); report
# prints the opencl / cuda, opencl / SDPA math and opencl / mem-eff ratios from the CSVs in $OUT
# (bench and sdpa append to them). Environment: BUILD (build folder, default build-ocl), PLATFORM
# (FLASHPORT_OPENCL_PLATFORM, default NVIDIA), DIMS and SEQLENS (bench grid, default "64 128 256"
# and "512 2048 8192 16384"), TOKENS and HIDDEN (B * N and H * D of the grid, default 16384 and
# 2048), BACKENDS (flashport-bench backends, default "opencl opencl-plain cuda"; opencl-plain is
# opencl with FLASHPORT_OPENCL_MMA=0), ITERS (timed runs per shape,
# default 5), JOBS (build parallelism, default: all cores).
set -uo pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-ocl}
JOBS=${JOBS:-$(nproc)}
STAGES=${*:-build device test bench sdpa report}
export FLASHPORT_OPENCL_PLATFORM=${PLATFORM:-NVIDIA}
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
# The part of an appended log that this call wrote: from its last "### " header on.
last_call() { awk '/^### /{n = 0} {line[n++] = $0} END{for (i = 0; i < n; i++) print line[i]}' "$1"; }

note "== $(date -u '+%Y-%m-%d %H:%M UTC') stages: $STAGES; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null); commit $(git rev-parse --short HEAD 2>/dev/null)"

if has build; then
    GEN=()
    command -v ninja >/dev/null && GEN=(-G Ninja)
    CLINC=()
    # No /usr/include/CL: the CUDA toolkit's copy of the Khronos headers.
    [ -e /usr/include/CL/cl.h ] || CLINC=(-DFLASHPORT_OPENCL_INCLUDE_DIR=/usr/local/cuda/include)
    start=$(date +%s)
    {
        cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHPORT_CUDA=ON \
            -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" -DCMAKE_CUDA_FLAGS="--threads=0" \
            -DFLASHPORT_CUDA_ARCHITECTURES=90a -DFLASHPORT_HIP=OFF -DFLASHPORT_OPENCL=ON \
            "${CLINC[@]}" &&
            cmake --build "$BUILD" -j "$JOBS"
    } >"$OUT/build.log" 2>&1
    rc=$?
    note "build: rc=$rc in $(($(date +%s) - start)) s"
    [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fi

if has device; then
    FLASHPORT_LOG=1 FLASHPORT_BACKEND=opencl "$BUILD/bin/flashport-example" >"$OUT/device.log" 2>&1
    note "device: rc=$?"
    grep -E "opencl: (device|built)|backend 'opencl'|ERR" "$OUT/device.log" | cut -c1-400 | tee -a "$SUMMARY"
fi

if has test; then
    # Each log gets a header per call and is appended to, so no later call overwrites it.
    start=$(date +%s)
    {
        echo "### $(date -u '+%H:%M:%S') test_backends opencl --workspace (the whole table)"
        echo "### $(date -u '+%H:%M:%S')" >>"$OUT/variants.log"
        FLASHPORT_LOG=1 timeout 400 "$BUILD/bin/test_backends" opencl --workspace \
            2>"$OUT/variants.tmp"
        echo "test_backends opencl --workspace: rc=$?"
        # A failed tensor-core build logs the driver's build log after its line: kept too.
        grep -E -A20 "opencl: (device|built|building)" "$OUT/variants.tmp" |
            grep -v -E "^\[flashport\] opencl: (forward|backward) " >>"$OUT/variants.log"
        grep -v "^\[flashport\]" "$OUT/variants.tmp"
        rm -f "$OUT/variants.tmp"
        echo "--- $(date -u '+%H:%M:%S') FLASHPORT_OPENCL_MMA=0 test_backends opencl --quick"
        FLASHPORT_OPENCL_MMA=0 timeout 200 "$BUILD/bin/test_backends" opencl --quick
        echo "test_backends opencl --quick (plain path forced): rc=$?"
    } >>"$OUT/test_backends.log" 2>&1
    {
        echo "### $(date -u '+%H:%M:%S') test_opencl"
        if [ -x "$BUILD/bin/test_opencl" ]; then
            timeout 120 "$BUILD/bin/test_opencl"
            echo "test_opencl: rc=$?"
        else
            echo "test_opencl: not built (CMake found no OpenCL library to link it with)"
        fi
    } >>"$OUT/test_opencl.log" 2>&1
    note "tests in $(($(date +%s) - start)) s:"
    last_call "$OUT/test_backends.log" | grep -E "FAIL| passed, |rc=" | tail -14 |
        tee -a "$SUMMARY"
    last_call "$OUT/variants.log" | grep -Eo "tensor-core variant for f16 / bf16: [^)]*|built the [a-z-]+ [a-z-]* *kernels( \(mma.sync\))?|building the .* failed" |
        sort | uniq -c | cut -c1-400 | tee -a "$SUMMARY"
    last_call "$OUT/variants.log" | grep -A10 "opencl: building" | cut -c1-300 | tee -a "$SUMMARY"
    last_call "$OUT/test_opencl.log" |
        grep -E "CHECK failed|^device 0|^caller|^timer|PASS|FAIL|SKIP|rc=" | cut -c1-400 |
        tee -a "$SUMMARY"
fi

TOKENS=${TOKENS:-16384}
HIDDEN=${HIDDEN:-2048}
if has bench; then
    start=$(date +%s)
    for D in ${DIMS:-64 128 256}; do
        for N in ${SEQLENS:-512 2048 8192 16384}; do
            for be in ${BACKENDS:-opencl opencl-plain cuda}; do
                # opencl-plain: the OpenCL backend with the tensor-core variant off, its CSV
                # rows relabelled so report can set the two side by side.
                mma=auto csv="$OUT/bench.csv"
                [ "$be" = opencl-plain ] && mma=0 csv="$OUT/bench.plain.tmp" && rm -f "$csv"
                echo "### $be D=$D N=$N" >>"$OUT/bench.log"
                FLASHPORT_OPENCL_MMA=$mma timeout 300 "$BUILD/bin/flashport-bench" \
                    --backend "${be%-plain}" --dtype bf16 --batch $((TOKENS / N)) \
                    --heads $((HIDDEN / D)) --seqlen "$N" --hdim "$D" --causal=0,1 \
                    --direction both --iters "${ITERS:-5}" --check \
                    --csv "$csv" >>"$OUT/bench.log" 2>&1 ||
                    note "bench $be D=$D N=$N failed: rc=$?"
                if [ "$be" = opencl-plain ] && [ -f "$csv" ]; then
                    awk -F, -v OFS=, -v head=$([ -s "$OUT/bench.csv" ] && echo 0 || echo 1) \
                        'NR == 1 { if (head) print; next } { $1 = "opencl-plain"; print }' \
                        "$csv" >>"$OUT/bench.csv"
                    rm -f "$csv"
                fi
            done
        done
    done
    note "bench in $(($(date +%s) - start)) s"
fi

if has sdpa; then
    start=$(date +%s)
    DL=${DIMS:-64 128 256}
    SL=${SEQLENS:-512 2048 8192 16384}
    timeout 580 python3 bench/sdpa_grid.py --dims "${DL// /,}" --seqlens "${SL// /,}" \
        --tokens "$TOKENS" --hidden "$HIDDEN" --csv "$OUT/sdpa.csv" >>"$OUT/sdpa.log" 2>&1
    note "sdpa: rc=$? in $(($(date +%s) - start)) s"
fi

if has report; then
    python3 - "$OUT/bench.csv" "$OUT/sdpa.csv" <<'PY' | tee "$OUT/report.md" | tee -a "$SUMMARY"
# The issue's table: TFLOP/s of our OpenCL backend (its default variant, and the plain path
# forced), our CUDA backend (flashport-bench) and SDPA's math and memory-efficient backends
# (sdpa_grid.py) per shape and direction, bf16, and OpenCL's ratio to each; then the target,
# OpenCL >= 1.0x SDPA math at N >= 2048, counted over those rows.
import csv, os, sys
t = {}
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        if r["dtype"] == "bf16" and r["tflops"]:
            t[(r["backend"], int(r["hdim"]), int(r["seqlen_q"]), int(r["causal"]),
               r["direction"])] = float(r["tflops"])
if os.path.exists(sys.argv[2]):
    for r in csv.DictReader(open(sys.argv[2])):
        t[(r["impl"], int(r["hdim"]), int(r["seqlen"]), int(r["causal"]), r["direction"])] = (
            float(r["tflops"]) if r["tflops"] else float("nan"))
nan = float("nan")
cell = lambda x: f"{x:.3g}" if x == x else "-"
ratio = lambda a, b: f"{a / b:.3f}" if a == a and b == b and b > 0 else "-"
print("| D | N | causal | dir | opencl | opencl-plain | cuda | SDPA math | SDPA mem-eff "
      "| opencl / plain | opencl / cuda | opencl / math | opencl / mem-eff |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
met = total = 0
for (be, d, n, c, dr), v in sorted(t.items(), key=lambda x: (x[0][1:4], x[0][4] != "fwd")):
    if be != "opencl":
        continue
    o = [t.get((x, d, n, c, dr), nan) for x in ("opencl-plain", "cuda", "math", "eff")]
    print(f"| {d} | {n} | {c} | {dr} | {cell(v)} | " + " | ".join(cell(x) for x in o) + " | "
          + " | ".join(ratio(v, x) for x in o) + " |")
    if n >= 2048 and o[2] == o[2]:
        total += 1
        met += v >= o[2]
print(f"\nopencl >= 1.0x SDPA math at N >= 2048: {met} of {total} rows with both timed")
PY
fi
