#!/usr/bin/env bash
# Runs the HIP backend on an NVIDIA GPU through our HIP-to-CUDA shim (backends/hip/hip_to_cuda.h):
# builds libflashport_hipshim.so with nvcc (sm_90 by default; the host code and the generic
# kernels of backends/hip/, not the MFMA path), then on the GPU
#   1. flashport-example with FLASHPORT_BACKEND=hipshim (and FLASHPORT_LOG=1),
#   2. the shared case table: test_backends hipshim, against the CPU reference,
#   3. compute-sanitizer memcheck on the whole table, racecheck (the tiles' shared-memory
#      barriers) on the head-dim classes 64 and 256 and the varlen cases,
#   4. flashport-bench --check on larger shapes (N = 4096 and 16384, decode-like split-KV) with
#      timings of the generic kernel, for the record.
# A skip (exit 77: no GPU) counts as a failure here: this script is for a GPU machine.
#
#   tests/gpu/run_hip_shim.sh [build dir]        (default build-hipshim-gpu)
#
# Environment: OUT (log folder, default ./out), CUDACXX (nvcc), FLASHPORT_HIPSHIM_ARCHITECTURES
# (default 90). Writes $OUT/hip_shim.log and $OUT/hip_shim_bench.csv; exits 0 only when every
# step passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
build=${1:-build-hipshim-gpu}
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
archs=${FLASHPORT_HIPSHIM_ARCHITECTURES:-90}
mkdir -p "$out"
log="$out/hip_shim.log"
: >"$log"
failed=()

# step NAME TIMEOUT COMMAND...: runs it with its output in the log, records a failure.
step() {
    local name=$1 limit=$2
    shift 2
    printf '\n==== %s: %s\n' "$name" "$*" | tee -a "$log"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    printf '==== %s: exit %d after %d s\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$log"
    [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
    return "$rc"
}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$nvcc" --version | tail -n 2
    git log -1 --format='commit %H' 2>/dev/null
} 2>&1 | tee -a "$log"

step configure 120 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLASHPORT_HIP_SHIM=ON -DFLASHPORT_CUDA=OFF -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DFLASHPORT_HIPSHIM_ARCHITECTURES="$archs" || exit 1
step build 300 cmake --build "$build" -j"$(nproc)" \
    --target flashport_hipshim test_backends flashport-example flashport-bench || exit 1

bin=$build/bin
step example 60 env FLASHPORT_BACKEND=hipshim FLASHPORT_LOG=1 "$bin/flashport-example"
step table 120 "$bin/test_backends" hipshim
if command -v compute-sanitizer >/dev/null; then
    step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$bin/test_backends" hipshim
    for f in "N63x63 D64" "D256" "varlen"; do
        step "racecheck [$f]" 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
            "$bin/test_backends" hipshim --filter "$f"
    done
else
    failed+=("compute-sanitizer not found")
fi
bench() {
    step "bench $*" 60 "$bin/flashport-bench" --backend hipshim --direction both --check \
        --check-gflop 1 --iters 5 --csv "$out/hip_shim_bench.csv" "$@"
}
bench --dtype bf16 --batch 2 --heads 16 --seqlen 4096 --hdim 64,128 --causal=0,1
bench --dtype f16 --batch 2 --heads 16 --seqlen 4096 --hdim 128 --causal
bench --dtype bf16 --batch 1 --heads 4 --seqlen 16384 --hdim 256 --causal
bench --dtype bf16 --batch 4 --heads 8 --seqlen-q 1,64 --seqlen-k 32768 --hdim 128

if [ ${#failed[@]} -eq 0 ]; then
    echo "run_hip_shim: ALL PASSED" | tee -a "$log"
    exit 0
fi
printf 'run_hip_shim: FAILED: %s\n' "${failed[@]}" | tee -a "$log"
exit 1
