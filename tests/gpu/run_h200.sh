#!/usr/bin/env bash
# The CUDA backend's whole check on a GPU machine (written for the H200 lease; any sm_80+ GPU):
# configure for sm_80 and sm_90a, build, run the GPU tests (the shared case table,
# tests/gpu/test_cuda_large.c and test_reliability --masked-keys on each forward path),
# compute-sanitizer memcheck and racecheck on the quick cases, and
# the PyTorch SDPA comparison (bench/compare_torch.py), and an Nsight Compute profile of the main
# kernels. Logs go to $OUT (8 files at most: summary.txt, build.log, checks.log, profile.txt,
# bench.log, compare_torch.{md,csv,png}; the quick stages write events.log instead of
# profile.txt); a short summary is printed last.
#
#   OUT=/tmp/out tests/gpu/run_h200.sh [stages]
#
# stages: any of build test bench sanitize profile (default: all, in that order), python (the
# package's pytest suite on CUDA tensors, then bench/python_overhead.py --backend cuda into
# python_overhead.txt), decode (issue 18: flashport-bench --decode dense and paged, checked,
# then compare_torch.py --decode into decode.log and compare_torch_decode.{md, csv}; DECODE_ARGS
# narrows its grid), opencl (the OpenCL backend through NVIDIA's driver:
# tests/gpu/run_opencl_h200.sh on this build), and the
# shorter quicktest (test_backends cuda, the whole table, once per TEST_ENVS entry, and
# test_cuda_large --quick) and events (one flashport-bench --backend cuda run: CUDA-event timing).
# Environment: BUILD (build folder, default build-gpu), ARCHS (CUDA architectures, default
# "80;90a"), BENCH_ARGS (extra compare_torch.py arguments; "--dtypes fp8_e4m3 --dims 128,256
# --seqlens 4096,16384" times the fp8 forward, issue 17), EVENT_ARGS (flashport-bench arguments
# of the events stage), TEST_ENVS (space-separated VAR=VALUE[,VAR=VALUE] settings, each a
# quicktest run of the table; default: one run as is), TEST_TIMEOUT (seconds per quicktest run,
# default 600), JOBS (build parallelism, default: all cores), SAN_TIMEOUT (seconds per sanitizer
# run, default 240), SAN_SETTINGS (space-separated VAR=VALUE[,VAR=VALUE] settings, one sanitizer
# pass each; default: the sm90 path, and the sm80 path with its ping-pong forward), SAN_FILTER
# (the test_backends --filter of the sanitizer runs, default "f16", which matches bf16 too),
# PROFILE_SHAPES (profile_one.py argument sets separated by ';', default "--dim 128 --seqlen
# 8192").
set -uo pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
STAGES=${*:-build test bench sanitize profile}
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

note "== $(date -u '+%Y-%m-%d %H:%M UTC') $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
note "== nvcc $(nvcc --version | tail -1); cmake $(cmake --version | head -1 | cut -d' ' -f3)"
note "== torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null)"

if has build; then
    GEN=()
    command -v ninja >/dev/null && GEN=(-G Ninja)
    # The OpenCL plugin too (NVIDIA's OpenCL driver); no /usr/include/CL: the CUDA toolkit's
    # copy of the Khronos headers.
    CLINC=()
    [ -e /usr/include/CL/cl.h ] || CLINC=(-DFLASHPORT_OPENCL_INCLUDE_DIR=/usr/local/cuda/include)
    start=$(date +%s)
    {
        cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHPORT_CUDA=ON \
            -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" -DCMAKE_CUDA_FLAGS="--threads=0" \
            -DFLASHPORT_HIP=OFF -DFLASHPORT_CUDA_ARCHITECTURES="${ARCHS:-80;90a}" \
            -DFLASHPORT_CUDA_PTXAS_VERBOSE=ON "${CLINC[@]}" &&
            cmake --build "$BUILD" -j "$JOBS"
    } >"$OUT/build.log" 2>&1
    rc=$?
    note "build: rc=$rc in $(($(date +%s) - start)) s; $(grep -c 'bytes spill stores' "$OUT/build.log") kernels reported, $(grep -E 'bytes spill stores' "$OUT/build.log" | grep -vc ' 0 bytes spill stores') with spills"
    [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fi

if has test; then
    start=$(date +%s)
    ctest --test-dir "$BUILD" -L gpu -V --timeout 900 >"$OUT/checks.log" 2>&1
    rc=$?
    note "ctest -L gpu: rc=$rc in $(($(date +%s) - start)) s: $(grep -E 'tests passed|tests failed' "$OUT/checks.log")"
    grep -E 'FAIL|UNSUPPORTED| passed, |long N|memory N|stream:|determinism:|device:' "$OUT/checks.log" | grep -vE '(fwd|bwd) f32 .*UNSUPPORTED|FLASHPORT_ERR_UNSUPPORTED_DTYPE' | tail -40 | tee -a "$SUMMARY"
    # The masked-key guard (docs/reliability.md): NaN and inf in keys that rows cannot see, on
    # the auto path (the sm90 forward on Hopper), the sm90 path forced (its refusals, e.g. the
    # fp8 problems of shapes it declines, count as unsupported scenarios) with its forward's
    # per-tile and persistent kernels, the sm80 backward for D > 128 under auto, the sm80 path
    # and its ping-pong forward.
    for setting in FLASHPORT_NOTHING= FLASHPORT_CUDA_PATH=sm90 \
        FLASHPORT_CUDA_PATH=sm90,FLASHPORT_CUDA_SM90_FWD_GRID=2 \
        FLASHPORT_CUDA_SM90_BWD256=0 FLASHPORT_CUDA_PATH=sm80 \
        FLASHPORT_CUDA_PATH=sm80,FLASHPORT_CUDA_FWD_PINGPONG=1; do
        echo "### test_reliability cuda --masked-keys ($setting)"
        # shellcheck disable=SC2046
        env $(tr ',' ' ' <<<"$setting") timeout 600 "$BUILD/bin/test_reliability" cuda \
            --masked-keys 2>&1 | grep -E 'CHECK failed|checks failed'
        echo "rc=$?"
    done >>"$OUT/checks.log" 2>&1
    note "masked keys: $(grep -E 'masked-keys: ' "$OUT/checks.log" | tr '\n' ' ')"
fi

if has quicktest; then
    start=$(date +%s)
    for setting in ${TEST_ENVS:-FLASHPORT_NOTHING=}; do
        echo "### test_backends cuda with $setting"
        # shellcheck disable=SC2046
        env $(tr ',' ' ' <<<"$setting") timeout "${TEST_TIMEOUT:-600}" "$BUILD/bin/test_backends" \
            cuda
        echo "rc=$?"
    done >"$OUT/checks.log" 2>&1
    echo "### test_cuda_large --quick" >>"$OUT/checks.log"
    timeout "${TEST_TIMEOUT:-600}" "$BUILD/bin/test_cuda_large" --quick >>"$OUT/checks.log" 2>&1
    echo "rc=$?" >>"$OUT/checks.log"
    note "quicktest ($(($(date +%s) - start)) s): $(grep -E '^rc=|^### | passed, ' "$OUT/checks.log" | tr '\n' ' ')"
    grep -E 'FAIL' "$OUT/checks.log" | head -20 | tee -a "$SUMMARY"
fi

if has events; then
    start=$(date +%s)
    # shellcheck disable=SC2086
    "$BUILD/bin/flashport-bench" --backend cuda ${EVENT_ARGS:-} >"$OUT/events.log" 2>&1
    note "events: rc=$? in $(($(date +%s) - start)) s"
    tee -a "$SUMMARY" <"$OUT/events.log" | tail -8
fi

if has bench; then
    start=$(date +%s)
    # compare_torch.py imports the flashport package: built here without GPU plugins (fast),
    # while --lib points it at the build folder's CUDA plugin.
    {
        python3 -m pip install -q --no-build-isolation --no-deps --target "$BUILD/py" \
            -C cmake.define.FLASHPORT_CUDA=OFF -C cmake.define.FLASHPORT_HIP=OFF . &&
            # shellcheck disable=SC2086
            PYTHONPATH="$BUILD/py" PYTHONUNBUFFERED=1 python3 bench/compare_torch.py \
                --lib "$BUILD/lib/libflashport.so" --out "$OUT" ${BENCH_ARGS:-}
    } >"$OUT/bench.log" 2>&1
    rc=$?
    note "bench: rc=$rc in $(($(date +%s) - start)) s"
    grep -E '^\| (bf16|fp16|fp8_e4m3|fp8_e5m2) ' "$OUT/compare_torch.md" 2>/dev/null | tee -a "$SUMMARY" || tail -20 "$OUT/bench.log"
fi

if has decode; then
    # Issue 18's decode grid against SDPA (compare_torch.py --decode; DECODE_ARGS narrow it), after
    # a checked flashport-bench decode run on a dense and a paged cache (both on the CUDA
    # backend's decode kernel, backends/cuda/decode/fwd.cuh).
    start=$(date +%s)
    {
        for paged in "" "--paged 16" "--paged 256"; do
            # shellcheck disable=SC2086
            "$BUILD/bin/flashport-bench" --backend cuda --decode --dtype bf16 --batch 16 \
                --heads 32 --kv-heads 8 --seqlen-q 1,4,8 --seqlen-k 32768 --check $paged
        done
        [ -d "$BUILD/py/flashport" ] ||
            python3 -m pip install -q --no-build-isolation --no-deps --target "$BUILD/py" \
                -C cmake.define.FLASHPORT_CUDA=OFF -C cmake.define.FLASHPORT_HIP=OFF .
        # shellcheck disable=SC2086
        PYTHONPATH="$BUILD/py" PYTHONUNBUFFERED=1 python3 bench/compare_torch.py --decode \
            --lib "$BUILD/lib/libflashport.so" --out "$OUT" ${DECODE_ARGS:-}
    } >"$OUT/decode.log" 2>&1
    note "decode: rc=$? in $(($(date +%s) - start)) s"
    grep -E '^\| (bf16|fp16)' "$OUT/compare_torch_decode.md" 2>/dev/null | tee -a "$SUMMARY" ||
        tail -20 "$OUT/decode.log"
fi

if has python; then
    # The Python package's tests with CUDA tensors: the package built without GPU plugins (as in
    # the bench stage), the build folder's CUDA plugin through FLASHPORT_PLUGIN_PATH.
    start=$(date +%s)
    {
        [ -d "$BUILD/py/flashport" ] ||
            python3 -m pip install -q --no-build-isolation --no-deps --target "$BUILD/py" \
                -C cmake.define.FLASHPORT_CUDA=OFF -C cmake.define.FLASHPORT_HIP=OFF .
        FLASHPORT_PLUGIN_PATH="$PWD/$BUILD/lib" PYTHONPATH="$PWD/$BUILD/py" \
            python3 -m pytest -q -rs -p no:cacheprovider python/tests
    } >"$OUT/python.log" 2>&1
    note "python: rc=$? in $(($(date +%s) - start)) s: $(tail -1 "$OUT/python.log")"
    # Issue 20: the package's host overhead per call over the C call, CUDA tensors (torch, and
    # CuPy where installed), docs/python.md "Host overhead per call".
    start=$(date +%s)
    FLASHPORT_PLUGIN_PATH="$PWD/$BUILD/lib" PYTHONPATH="$PWD/$BUILD/py" \
        python3 bench/python_overhead.py --backend cuda --rounds 3 --reps 1000 \
        >"$OUT/python_overhead.txt" 2>&1
    note "python_overhead: rc=$? in $(($(date +%s) - start)) s"
    grep -E '^\| ' "$OUT/python_overhead.txt" | tee -a "$SUMMARY"
fi

if has opencl; then
    # The OpenCL backend on this GPU: tests/gpu/run_opencl_h200.sh's stages on this build, logs in
    # $OUT/opencl; OCL_DIMS / OCL_SEQLENS narrow its grid (default: D = 128, N = 2048 and 8192).
    start=$(date +%s)
    OUT="$OUT/opencl" BUILD="$BUILD" DIMS="${OCL_DIMS:-128}" SEQLENS="${OCL_SEQLENS:-2048 8192}" \
        bash tests/gpu/run_opencl_h200.sh device probe test bench sdpa report >/dev/null 2>&1
    note "opencl: rc=$? in $(($(date +%s) - start)) s"
    tee -a "$SUMMARY" <"$OUT/opencl/summary.txt" | tail -20
fi

if has sanitize; then
    start=$(date +%s)
    {
        # every f16/bf16 case of the table ("f16" matches "bf16" too) on the sm90 forward path
        # and on the sm80 path with its ping-pong forward forced (chosen by shape only for long
        # key loops), then the quick long checks
        T=${SAN_TIMEOUT:-240}
        for setting in ${SAN_SETTINGS:-FLASHPORT_CUDA_PATH=sm90 FLASHPORT_CUDA_PATH=sm80,FLASHPORT_CUDA_FWD_PINGPONG=1}; do
            for tool in memcheck racecheck synccheck; do
                echo "### $tool: test_backends cuda --filter ${SAN_FILTER:-f16} ($setting)"
                # shellcheck disable=SC2046
                env $(tr ',' ' ' <<<"$setting") timeout "$T" compute-sanitizer --tool $tool \
                    --error-exitcode 99 "$BUILD/bin/test_backends" cuda --filter "${SAN_FILTER:-f16}" |
                    grep -vE '^(fwd|bwd) .*PASS$'
                echo "rc=$?"
            done
        done
        echo "### memcheck: test_cuda_large --quick"
        timeout "$T" compute-sanitizer --tool memcheck --error-exitcode 99 \
            "$BUILD/bin/test_cuda_large" --quick
        echo "rc=$?"
    } >"$OUT/sanitizer.log" 2>&1
    note "sanitizer ($(($(date +%s) - start)) s): $(grep -E '^rc=|ERROR SUMMARY|RACECHECK SUMMARY|passed,' "$OUT/sanitizer.log" | tr '\n' ' ')"
    cat "$OUT/sanitizer.log" >>"$OUT/checks.log" && rm "$OUT/sanitizer.log"
fi

if has profile; then
    start=$(date +%s)
    IFS=';' read -r -a shapes <<<"${PROFILE_SHAPES:---dim 128 --seqlen 8192}"
    for shape in "${shapes[@]}"; do
        echo "### ncu: $shape"
        # shellcheck disable=SC2086
        timeout 300 ncu --clock-control none -k regex:'fp_sm(80|90)_(fwd_kernel|bwd_dkdv|bwd_dq)' \
            --section SpeedOfLight --section ComputeWorkloadAnalysis \
            --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
            --section WarpStateStats --section InstructionStats \
            --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
            python3 tests/gpu/profile_one.py --lib "$BUILD/lib/libflashport.so" $shape
        echo "rc=$?"
    done >"$OUT/profile.txt" 2>&1
    note "profile: $(($(date +%s) - start)) s; $(grep -cE '^  void fp_sm(80|90)' "$OUT/profile.txt") kernels"
fi
