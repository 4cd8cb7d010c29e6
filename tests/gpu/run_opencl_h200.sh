#!/usr/bin/env bash
# The OpenCL backend on an NVIDIA GPU through NVIDIA's OpenCL driver (written for the H200 lease):
# build with the CUDA and OpenCL plugins, log the OpenCL device and its extensions, run the whole
# case table and the host-side test on the GPU's OpenCL device, then time forward and backward
# (bf16) on the ANCHORS grid (B * N = 16384, H * D = 2048) with flashport-bench: OpenCL, then our
# CUDA path, same shapes, same run; SDPA's math and memory-efficient backends on the same grid
# (bench/sdpa_grid.py: compare_torch.py cannot run the OpenCL backend, whose memory is not
# torch's). Logs go to $OUT (summary.txt, build.log, device.log, checks.log, bench.csv,
# bench.log, sdpa.csv, sdpa.log); the ratios are printed last.
#
#   OUT=/tmp/out tests/gpu/run_opencl_h200.sh [stages]
#
# stages: any of build device test bench sdpa report (default: all, in that order); report
# prints the opencl / cuda, opencl / SDPA math and opencl / mem-eff ratios from the CSVs in $OUT
# (bench and sdpa append to them). Environment: BUILD (build
# folder, default build-ocl), PLATFORM (FLASHPORT_OPENCL_PLATFORM, default NVIDIA), DIMS and
# SEQLENS (bench grid, default "64 128 256" and "512 2048 8192 16384"), ITERS (timed runs per
# shape, default 5), JOBS (build parallelism, default: all cores).
set -uo pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-ocl}
JOBS=${JOBS:-$(nproc)}
STAGES=${*:-build device test bench sdpa report}
export FLASHPORT_OPENCL_PLATFORM=${PLATFORM:-NVIDIA}
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

note "== $(date -u '+%Y-%m-%d %H:%M UTC') $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null); commit $(git rev-parse --short HEAD 2>/dev/null)"

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
    start=$(date +%s)
    {
        timeout 400 "$BUILD/bin/test_backends" opencl
        echo "test_backends opencl: rc=$?"
        if [ -x "$BUILD/bin/test_opencl" ]; then
            timeout 60 "$BUILD/bin/test_opencl"
            echo "test_opencl: rc=$?"
        else
            echo "test_opencl: not built (CMake found no OpenCL library to link it with)"
        fi
    } >"$OUT/checks.log" 2>&1
    note "tests in $(($(date +%s) - start)) s:"
    grep -E "FAIL|UNSUPPORTED| passed, |rc=" "$OUT/checks.log" | tail -20 | tee -a "$SUMMARY"
fi

if has bench; then
    start=$(date +%s)
    for D in ${DIMS:-64 128 256}; do
        for N in ${SEQLENS:-512 2048 8192 16384}; do
            for be in opencl cuda; do
                timeout 300 "$BUILD/bin/flashport-bench" --backend "$be" --dtype bf16 \
                    --batch $((16384 / N)) --heads $((2048 / D)) --seqlen "$N" --hdim "$D" \
                    --causal=0,1 --direction both --iters "${ITERS:-5}" --check \
                    --csv "$OUT/bench.csv" >>"$OUT/bench.log" 2>&1 ||
                    note "bench $be D=$D N=$N failed: rc=$?"
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
        --csv "$OUT/sdpa.csv" >"$OUT/sdpa.log" 2>&1
    note "sdpa: rc=$? in $(($(date +%s) - start)) s"
fi

if has report; then
    note "TFLOP/s (bf16): opencl, cuda, SDPA math, SDPA mem-eff; ratios opencl / each"
    python3 - "$OUT/bench.csv" "$OUT/sdpa.csv" <<'PY' | tee -a "$SUMMARY"
import csv, os, sys
t = {}
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        t[(r["backend"], int(r["hdim"]), int(r["seqlen_q"]), int(r["causal"]),
           r["direction"])] = float(r["tflops"])
if os.path.exists(sys.argv[2]):
    for r in csv.DictReader(open(sys.argv[2])):
        t[(r["impl"], int(r["hdim"]), int(r["seqlen"]), int(r["causal"]), r["direction"])] = (
            float(r["tflops"]) if r["tflops"] else float("nan"))
nan = float("nan")
for (be, d, n, c, dr), v in sorted(t.items(), key=lambda x: x[0][1:]):
    if be != "opencl":
        continue
    o = [t.get((x, d, n, c, dr), nan) for x in ("cuda", "math", "eff")]
    print(f"D={d} N={n} causal={c} {dr}: {v:.1f} | {o[0]:.1f} {o[1]:.1f} {o[2]:.1f} | "
          + " ".join(f"{v / x:.3f}" if x == x and x > 0 else "-" for x in o))
PY
fi
