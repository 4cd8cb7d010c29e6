#!/usr/bin/env bash
# The OpenCL backend on an NVIDIA GPU through NVIDIA's OpenCL driver (written for the H200 lease):
# build with the CUDA and OpenCL plugins, log the OpenCL device and its extensions, probe every
# program the planner gives the GPU, run the whole case table (on a caller's workspace) with the
# tensor-core variant and with the plain path forced, and the host-side test, then time forward
# and backward (bf16) on the ANCHORS grid (B * N = 16384, H * D = 2048) with flashport-bench:
# OpenCL (tensor-core variant, and plain forced as opencl-plain), our CUDA path, same shapes,
# same run; SDPA's math and memory-efficient backends on the same grid (bench/sdpa_grid.py:
# compare_torch.py cannot run the OpenCL backend, whose memory is not torch's); report writes the
# table with the ratios and counts the target (OpenCL >= 1.0x SDPA math at N >= 2048).
#
# One run is meant to be enough to diagnose a failure. A kernel that faults on NVIDIA (OpenCL
# error -9999) leaves its context failing every later call, so nothing shares a process with
# what it should not hide: probe runs one process per (dtype, head-dim class) (a forward and a
# backward at N = 200 with --check: every program key of that class), and the table runs one
# process per dtype and variant. The library waits for the first run of every kernel, so the
# failing kernel is named; under FLASHPORT_LOG it logs every build, the local memory the driver
# counts for each kernel, and the driver's whole build log of any failed build, which this script
# collects into build-logs.txt.
#
# Everything stays in $OUT, appended to, never overwritten by a later call or stage:
# summary.txt, build.log, device.log, probe.log (one line per process) and probe/ (their logs),
# test_backends.log, opencl-log.txt (the library's log lines of every table process, per-call
# lines left out), build-logs.txt (the driver's log of every failed build, from probe and test),
# test_opencl.log, bench.csv, bench.log, sdpa.csv, sdpa.log, report.md.
#
#   OUT=/tmp/out tests/gpu/run_opencl_h200.sh [stages]
#
# stages: any of build device probe test bench sdpa report (default: all, in that order); report
# prints the opencl / plain, opencl / tile, opencl / fused, opencl / two, opencl / cuda, opencl /
# SDPA math and opencl / mem-eff ratios from the CSVs in $OUT (bench and sdpa append to them).
# Environment:
# BUILD (build folder, default build-ocl), PLATFORM (FLASHPORT_OPENCL_PLATFORM, default NVIDIA), MODES (the
# table's variants, default "0": the plain path; "0 nv" adds the tensor-core variant, "nv-tile"
# the same with the tile-shaped forward), DIMS and SEQLENS (bench grid, default "64 128 256" and
# "512 2048 8192 16384"), TOKENS and HIDDEN (B * N and
# H * D of the grid, default 16384 and 2048), BACKENDS (flashport-bench backends, default
# "opencl opencl-plain cuda"; opencl-plain is opencl with FLASHPORT_OPENCL_MMA=0, opencl-tile
# with FLASHPORT_OPENCL_MMA=nv-tile: the tile-shaped tensor-core forward, opencl-fused with
# FLASHPORT_OPENCL_BWD=fused: the one-kernel FA2-shaped backward, the default's, opencl-two with
# FLASHPORT_OPENCL_BWD=two: the two-kernel one), ITERS (timed
# runs per shape, default 5), JOBS (build parallelism, default: all cores), CUDA (OFF builds
# without the CUDA plugin: quicker, for runs whose BACKENDS leave out cuda).
set -uo pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-ocl}
JOBS=${JOBS:-$(nproc)}
CUDA=${CUDA:-ON}
STAGES=${*:-build device probe test bench sdpa report}
export FLASHPORT_OPENCL_PLATFORM=${PLATFORM:-NVIDIA}
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
# The part of an appended log that this call wrote: from its last "### " header on.
last_call() { awk '/^### /{n = 0} {line[n++] = $0} END{for (i = 0; i < n; i++) print line[i]}' "$1"; }
# Appends to build-logs.txt the driver's build logs a library log ($1) holds, under a header
# naming where they came from ($2).
keep_build_logs() {
    grep -q "the driver's build log of" "$1" || return 0
    {
        echo "### $(date -u '+%H:%M:%S') $2"
        awk "/the driver's build log of/{p = 1} p; /\(end of the build log\)/{p = 0}" "$1"
    } >>"$OUT/build-logs.txt"
}
# The library's lines worth keeping from a log ($1): builds, failures, local memory counts (the
# per-call "forward" / "backward" lines left out).
lib_lines() { grep "^\[flashport\]" "$1" | grep -v -E "^\[flashport\] opencl: (forward|backward) "; }

note "== $(date -u '+%Y-%m-%d %H:%M UTC') stages: $STAGES; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null); commit $(git rev-parse --short HEAD 2>/dev/null)"

if has build; then
    GEN=()
    command -v ninja >/dev/null && GEN=(-G Ninja)
    CLINC=()
    # No /usr/include/CL: the CUDA toolkit's copy of the Khronos headers.
    [ -e /usr/include/CL/cl.h ] || CLINC=(-DFLASHPORT_OPENCL_INCLUDE_DIR=/usr/local/cuda/include)
    start=$(date +%s)
    {
        cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHPORT_CUDA="$CUDA" \
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

if has probe; then
    # One process per (dtype, head-dim class): every program key of the class, forward and
    # backward, checked against the reference; a fault takes down only its own process.
    mkdir -p "$OUT/probe"
    start=$(date +%s)
    echo "### $(date -u '+%H:%M:%S') probe" >>"$OUT/probe.log"
    for dt in bf16 f16 f32; do
        for D in 16 32 64 96 128 192 256; do
            log="$OUT/probe/$dt-D$D.log"
            FLASHPORT_LOG=1 timeout 180 "$BUILD/bin/flashport-bench" --backend opencl \
                --dtype $dt --batch 1 --heads 2 --seqlen 200 --hdim $D --direction both \
                --iters 1 --warmup 0 --check >"$log" 2>&1
            rc=$?
            keep_build_logs "$log" "probe $dt D=$D"
            # the variant and tiles each direction ran, and any failure the library named
            what=$(grep -Eo "opencl: (forward|backward) [a-z0-9]+ D=[0-9]+ [^:]*: [^,]*, head-dim class [0-9]+, tiles [0-9x]+" "$log" |
                sort -u | sed -E "s/ on '[^']*'//; s/opencl: //" | tr '\n' ';')
            fail=$(grep -Eo "opencl: (building|the first run) .*|FLASHPORT_ERR[A-Z_]*: .*" "$log" |
                grep -v "driver's build log" | cut -c1-400 | sort -u | tr '\n' ';')
            echo "$dt D=$D: rc=$rc; $what ${fail:+FAILURES: $fail}" >>"$OUT/probe.log"
        done
    done
    note "probe in $(($(date +%s) - start)) s (rc=0: built, ran and matched the reference):"
    last_call "$OUT/probe.log" | grep -v "^###" | cut -c1-700 | tee -a "$SUMMARY"
fi

if has test; then
    # Each log gets a header per call and is appended to, so no later call overwrites it. The
    # table runs one process per variant and dtype (fp8: forward only; the backend refuses it).
    start=$(date +%s)
    for mma in ${MODES:-0}; do
        for part in "^f32 " "^f16 " "^bf16 " "^e"; do # ^e: fp8 (e4m3, e5m2), refused by the backend
            tmp="$OUT/table.tmp"
            {
                echo "### $(date -u '+%H:%M:%S') FLASHPORT_OPENCL_MMA=$mma test_backends opencl --workspace --filter '$part'"
                FLASHPORT_OPENCL_MMA=$mma FLASHPORT_LOG=1 timeout 400 "$BUILD/bin/test_backends" \
                    opencl --workspace --filter "$part" 2>"$tmp"
                echo "rc=$? (FLASHPORT_OPENCL_MMA=$mma, '$part')"
                grep -v "^\[flashport\]" "$tmp"
            } >>"$OUT/test_backends.log" 2>&1
            {
                echo "### $(date -u '+%H:%M:%S') FLASHPORT_OPENCL_MMA=$mma '$part'"
                lib_lines "$tmp"
            } >>"$OUT/opencl-log.txt"
            keep_build_logs "$tmp" "test FLASHPORT_OPENCL_MMA=$mma '$part'"
            rm -f "$tmp"
        done
    done
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
    # This call's sections of test_backends.log (4 per variant): each process's result and
    # failures, then the sums per variant (the whole table, every dtype). A process that exits
    # non-zero with no failure counted is the fp8 one, where nothing passes (every case refused).
    sections=$((4 * $(echo ${MODES:-0} | wc -w)))
    awk -v want="$sections" '/^### /{n++} {l[NR] = $0; h[NR] = n}
        END{for (i = 1; i <= NR; i++) if (h[i] > n - want) print l[i]}' \
        "$OUT/test_backends.log" >"$OUT/table.tmp"
    grep -E "^opencl: [0-9]+ passed|^rc=|FAIL:" "$OUT/table.tmp" | cut -c1-300 | tee -a "$SUMMARY"
    awk '/^### /{m = $0; sub(/.*FLASHPORT_OPENCL_MMA=/, "", m); sub(/ .*/, "", m); seen[m] = 1
                 counted = 0}
         /^opencl: [0-9]+ passed/{p[m] += $2; f[m] += $4; u[m] += $6; counted = 1; failed = $4}
         /^rc=/{if ($1 != "rc=0" && (!counted || failed > 0)) bad[m]++}
         END{for (m in seen) printf "whole table, FLASHPORT_OPENCL_MMA=%s: %d passed, %d failed, %d unsupported; %d of 4 processes failed or died\n", m, p[m], f[m], u[m], bad[m]}' \
        "$OUT/table.tmp" | tee -a "$SUMMARY"
    rm -f "$OUT/table.tmp"
    grep -h -E "building the .* failed|the first run of .* failed|needs [0-9]+ bytes of local" \
        "$OUT/opencl-log.txt" | cut -c1-500 | sort | uniq -c | tee -a "$SUMMARY"
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
                # opencl: the backend's default (the tensor-core variant on NVIDIA devices of
                # compute capability >= 8.0, FA2-shaped but the backward above D = 128);
                # opencl-plain: the plain path forced; opencl-tile: the tensor-core variant with
                # the tile-shaped forward (FLASHPORT_OPENCL_MMA=nv-tile); opencl-two: the
                # default with the two-kernel backward (FLASHPORT_OPENCL_BWD=two), opencl-fused
                # with FLASHPORT_OPENCL_BWD=fused (the default's one-kernel backward; their
                # forwards are the default's). Their CSV rows are relabelled so report can set them side
                # by side.
                mma=auto bwd= csv="$OUT/bench.csv" relabel=0
                case $be in
                opencl-plain) mma=0 ;;
                opencl-tile) mma=nv-tile ;;
                opencl-fused) bwd=fused ;;
                opencl-two) bwd=two ;;
                esac
                [ "$be" != "${be%-*}" ] && relabel=1 && csv="$OUT/bench.variant.tmp" && rm -f "$csv"
                echo "### $be D=$D N=$N" >>"$OUT/bench.log"
                FLASHPORT_OPENCL_MMA=$mma FLASHPORT_OPENCL_BWD=$bwd timeout 300 "$BUILD/bin/flashport-bench" \
                    --backend "${be%-*}" --dtype bf16 --batch $((TOKENS / N)) \
                    --heads $((HIDDEN / D)) --seqlen "$N" --hdim "$D" --causal=0,1 \
                    --direction both --iters "${ITERS:-5}" --check \
                    --csv "$csv" >>"$OUT/bench.log" 2>&1 ||
                    note "bench $be D=$D N=$N failed: rc=$?"
                if [ $relabel = 1 ] && [ -f "$csv" ]; then
                    awk -F, -v OFS=, -v head=$([ -s "$OUT/bench.csv" ] && echo 0 || echo 1) \
                        -v be="$be" 'NR == 1 { if (head) print; next } { $1 = be; print }' \
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
print("| D | N | causal | dir | opencl | opencl-plain | opencl-tile | opencl-fused | opencl-two "
      "| cuda | SDPA math | SDPA mem-eff | opencl / plain | opencl / tile | opencl / fused "
      "| opencl / two | opencl / cuda | opencl / math | opencl / mem-eff |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
met = total = 0
for (be, d, n, c, dr), v in sorted(t.items(), key=lambda x: (x[0][1:4], x[0][4] != "fwd")):
    if be != "opencl":
        continue
    o = [t.get((x, d, n, c, dr), nan)
         for x in ("opencl-plain", "opencl-tile", "opencl-fused", "opencl-two", "cuda", "math",
                   "eff")]
    print(f"| {d} | {n} | {c} | {dr} | {cell(v)} | " + " | ".join(cell(x) for x in o) + " | "
          + " | ".join(ratio(v, x) for x in o) + " |")
    if n >= 2048 and o[5] == o[5]:
        total += 1
        met += v >= o[5]
print(f"\nopencl >= 1.0x SDPA math at N >= 2048: {met} of {total} rows with both timed")
PY
fi
