#!/usr/bin/env bash
# The OpenCL backend on an NVIDIA GPU through NVIDIA's OpenCL driver (written for the H200 lease):
# build with the CUDA and OpenCL plugins, log the OpenCL device and its extensions, run the whole
# case table and the host-side test on the GPU's OpenCL device, then time forward and backward
# (bf16) on the ANCHORS grid (B * N = 16384, H * D = 2048) with flashport-bench: OpenCL, then our
# CUDA path, same shapes, same run. Logs go to $OUT (summary.txt, build.log, device.log,
# checks.log, bench.csv, bench.log); a short summary is printed last.
#
#   OUT=/tmp/out tests/gpu/run_opencl_h200.sh [stages]
#
# stages: any of build device test bench (default: all, in that order). Environment: BUILD (build
# folder, default build-ocl), PLATFORM (FLASHPORT_OPENCL_PLATFORM, default NVIDIA), DIMS and
# SEQLENS (bench grid, default "64 128 256" and "512 2048 8192 16384"), ITERS (timed runs per
# shape, default 5), JOBS (build parallelism, default: all cores).
#
# The comparison with SDPA (math and memory-efficient) is bench/compare_torch.py --backend opencl;
# see docs/opencl.md for the command.
set -uo pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-ocl}
JOBS=${JOBS:-$(nproc)}
STAGES=${*:-build device test bench}
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
    rm -f "$OUT/bench.csv"
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
    note "bench in $(($(date +%s) - start)) s (TFLOP/s; opencl / cuda):"
    python3 - "$OUT/bench.csv" <<'PY' | tee -a "$SUMMARY"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
t = {(r["backend"], r["hdim"], r["seqlen_q"], r["causal"], r["direction"]): float(r["tflops"])
     for r in rows}
for (be, d, n, c, dr), v in sorted(t.items(), key=lambda x: (int(x[0][1]), int(x[0][2]))):
    if be == "opencl":
        cu = t.get(("cuda", d, n, c, dr), float("nan"))
        print(f"D={d} N={n} causal={c} {dr}: opencl {v:.1f} cuda {cu:.1f} ratio {v / cu:.3f}")
PY
fi
