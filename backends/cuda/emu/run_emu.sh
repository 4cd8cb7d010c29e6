#!/usr/bin/env bash
# Builds the CUDA backend's sources for a CPU (cuda_emu.h, cuda_emu.cpp; docs/cuda_emu.md) into
# <build>/cudaemu/libflashport_cudaemu.so, runs the emulator's self-tests (selftest.cu: ldmatrix
# and mma fragments against a plain loop; selftest_sm90.cu: TMA, mbarrier, bulk copies, wgmma
# (f16, bf16, e4m3), stmatrix, static shared variables), then the shared test table on backend
# "cudaemu" once
# per emulated device: FP_CUDA_EMU_SMEM_KIB=227 (sm_90-like: the largest tile configurations)
# and 163 (sm_80-like), and once more at the first with the forward's ping-pong kernel forced
# (FLASHPORT_CUDA_FWD_PINGPONG=1; at 227 KiB with FLASHPORT_CUDA_PATH=sm80, as the sm90 forward
# takes the D <= 64 forwards there), once with the sm90 forward's persistent kernel forced
# (FLASHPORT_CUDA_SM90_FWD_GRID=2, at 227 KiB), once with the backward's GQA group splits forced
# (FLASHPORT_CUDA_GROUP_SPLITS=4) and once with every forward on the decode kernel, split three
# ways (FLASHPORT_CUDA_DECODE=1, FLASHPORT_CUDA_DECODE_SPLITS=3); the ping-pong and decode passes
# run the forward only (test_backends --forward-only: neither setting reaches the backward, which
# the first pass ran). Each size, the ping-pong and the persistent passes also run `test_reliability cudaemu --masked-keys` (NaN and inf in keys that rows cannot see:
# docs/reliability.md). <build> is any configured flashport build folder; its test_backends and
# test_reliability are built if missing.
#
#   backends/cuda/emu/run_emu.sh <build> [test_backends options, e.g. --quick or --filter D128]
#
# The library is rebuilt only when a source under backends/cuda, core or include is newer.
# Environment: CXX (default clang++), FP_CUDA_EMU_SMEM_LIST (default "227 163"; 99 is an
# sm_86-like device), FP_CUDA_EMU_THREADS (host threads running blocks, default 2),
# FP_CUDA_EMU_SM90 (default 1: the sm90 forward and backward are built, and run at 227 KiB; then
# one more pass there with FLASHPORT_CUDA_PATH=sm80; 0: the sm90 path declines every call).
# The .cu and .cuh files are compiled as C++ after a textual rewrite of kernel<<<...>>>(args) into
# kernel << fp_emu_cfg(...)(args) (one launch per line, which the sources keep): the rewritten
# copies of backends/cuda go to <build>/cudaemu/src, ahead of the sources on the include path.
# Each instantiation file (sm80/inst/, decode/inst/, sm90/inst/) is compiled alone, as with
# FLASHPORT_CUDA_UNITY=OFF.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=$(cd "${1:?usage: run_emu.sh <build folder> [test_backends options]}" && pwd)
shift
cxx=${CXX:-clang++}
emu=$root/backends/cuda/emu
out=$build/cudaemu
mkdir -p "$out/obj" "$out/src"

base=(-std=c++17 -O2 -g -fPIC -Wall -Wno-unknown-pragmas -Wno-pass-failed -DFP_CUDA_EMU
    -I"$emu/include" -I"$out/src" -I"$root" -I"$root/include")
# backends/cuda's .cu and .cuh files into $out/src/backends/cuda: the launch syntax rewritten,
# and each static shared declaration `__shared__ [__align__(A)] T a[..], b[..];` (one line) into
# FP_EMU_STATIC_SHARED(T, a, [..], A) per declarator (cuda_emu.h); file names and line numbers
# kept. A declaration the rewrite cannot split stops the build.
rewrite_sources() {
    rm -rf "$out/src/backends"
    (cd "$root" && find backends/cuda -name '*.cu' -o -name '*.cuh') | while read -r f; do
        mkdir -p "$out/src/$(dirname "$f")"
        { printf '#line 1 "%s"\n' "$root/$f"; sed -E 's/<<<(.*)>>>/ << fp_emu_cfg(\1)/' "$root/$f" |
            perl -pe 'if (/^(\s*)__shared__\s+(?:__align__\((\d+)\)\s+)?([A-Za-z_][\w:]*)\s+([^;]+);(.*)$/) {
                my ($in, $al, $ty, $ds, $rest) = ($1, $2 || 1, $3, $4, $5);
                $_ = $in . join(" ", map { /^(\w+)((?:\[[^\]]+\])*)$/ or die "run_emu.sh: cannot rewrite the static __shared__ declarator \"$_\" ($ARGV line $.)\n";
                    "FP_EMU_STATIC_SHARED($ty, $1, $2, $al);" } split /\s*,\s*/, $ds) . "$rest\n" }'
        } >"$out/src/$f"
    done
}
# A rewritten .cu file (path under backends/cuda) as C++.
compile_cu() {
    "$cxx" "${base[@]}" "${@:3}" -include "$emu/cuda_emu.h" -x c++ -c \
        "$out/src/backends/cuda/$1" -o "$2"
}
# FP_CUDA_EMU_SM90=1 (the default): the sm90 forward and backward (sm90/fwd.cu, sm90/bwd.cu,
# sm90/inst/*.cu) on the emulator's TMA, mbarrier, wgmma and stmatrix; 0: emu/sm90_declines.cu
# declines the whole sm90 path.
sm90=${FP_CUDA_EMU_SM90:-1}
build_lib() {
    rewrite_sources
    pids=()
    rm -f "$out"/obj/*.o
    local sm90_srcs=(emu/sm90_declines.cu)
    if [ "$sm90" = 1 ]; then
        sm90_srcs=(sm90/fwd.cu sm90/bwd.cu $(cd "$root/backends/cuda" && ls sm90/inst/*.cu))
    fi
    # the largest files first: with 2 jobs at a time the build ends sooner
    for f in "${sm90_srcs[@]}" sm80/fwd.cu sm80/bwd.cu decode/fwd.cu \
        $(cd "$root/backends/cuda" && ls sm80/inst/*.cu decode/inst/*.cu) layout.cu; do
        compile_cu "$f" "$out/obj/${f//\//_}.o" &
        pids+=($!)
    done
    compile_cu emu/selftest.cu "$out/selftest.o" &
    pids+=($!)
    if [ "$sm90" = 1 ]; then
        compile_cu emu/selftest_sm90.cu "$out/selftest_sm90.o" &
        pids+=($!)
    fi
    "$cxx" "${base[@]}" -x c++ -c "$emu/cuda_emu.cpp" -o "$out/obj/cuda_emu.o" &
    pids+=($!)
    # cuda_backend.c as C11 against the emulator's runtime header; its entry point is wrapped by
    # cuda_emu.cpp, which renames the backend "cudaemu".
    "$cxx" -x c -std=c11 -O1 -fPIC -Wall -I"$emu/include" -I"$root" -I"$root/include" \
        -Dflashport_plugin_entry=fp_cuda_emu_inner_entry -c "$root/backends/cuda/cuda_backend.c" \
        -o "$out/obj/cuda_backend.o"
    "$cxx" -x c -std=c11 -O1 -fPIC -I"$root" -I"$root/include" -c "$root/core/plan.c" \
        -o "$out/obj/plan.o"
    for p in "${pids[@]}"; do wait "$p"; done
    "$cxx" -shared -o "$out/libflashport_cudaemu.so" "$out"/obj/*.o -lpthread -ldl
    "$cxx" -o "$out/selftest" "$out/selftest.o" "$out"/obj/*.o -lpthread -ldl
    rm -f "$out/selftest_sm90"
    if [ "$sm90" = 1 ]; then
        "$cxx" -o "$out/selftest_sm90" "$out/selftest_sm90.o" "$out"/obj/*.o -lpthread -ldl
    fi
}
# Rebuilt when missing or older than any source it is made of.
lib=$out/libflashport_cudaemu.so
if [ ! -e "$lib" ] || [ "$(cat "$out/sm90" 2>/dev/null)" != "$sm90" ] ||
    [ -n "$(find "$root/backends/cuda" "$root/core" "$root/include" -newer "$lib" -type f |
        head -1)" ]; then
    build_lib
    echo "$sm90" >"$out/sm90"
fi
cmake --build "$build" --target test_backends test_reliability >/dev/null

echo "== cudaemu self-test (ldmatrix, mma, shfl against plain loops)"
"$out/selftest"
if [ "$sm90" = 1 ]; then
    echo "== cudaemu sm90 self-test (TMA, mbarrier, bulk copies, wgmma against plain loops)"
    "$out/selftest_sm90"
fi
status=0
export FP_CUDA_EMU_THREADS=${FP_CUDA_EMU_THREADS:-2}
for kib in ${FP_CUDA_EMU_SMEM_LIST:-227 163}; do
    echo "== cudaemu, FP_CUDA_EMU_SMEM_KIB=$kib"
    t0=$(date +%s)
    FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_backends" cudaemu "$@" ||
        status=1
    FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_reliability" cudaemu \
        --masked-keys | grep -E 'CHECK failed|checks failed' || status=1
    echo "== cudaemu, FP_CUDA_EMU_SMEM_KIB=$kib: $(($(date +%s) - t0)) s"
done
# The D <= 64 forward's ping-pong kernel runs by shape only for long key loops, which the table
# has none of: once more with it forced, at the first size (on the sm80 path: at an sm_90-like
# size the sm90 forward takes those calls).
kib=${FP_CUDA_EMU_SMEM_LIST:-227 163}
kib=${kib%% *}
sm90_here=0
[ "$sm90" = 1 ] && [ "$kib" -ge 227 ] && sm90_here=1
pp_path=auto
[ "$sm90_here" = 1 ] && pp_path=sm80
echo "== cudaemu, FP_CUDA_EMU_SMEM_KIB=$kib, FLASHPORT_CUDA_FWD_PINGPONG=1, FLASHPORT_CUDA_PATH=$pp_path"
# Forward only (--forward-only): the backward does not read the setting, and the first pass ran it.
FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_CUDA_FWD_PINGPONG=1 FLASHPORT_CUDA_PATH=$pp_path \
    FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_backends" cudaemu "$@" --forward-only || status=1
FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_CUDA_FWD_PINGPONG=1 FLASHPORT_CUDA_PATH=$pp_path \
    FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_reliability" cudaemu --masked-keys |
    grep -E 'CHECK failed|checks failed' || status=1
# The sm90 forward's persistent kernel (fp_sm90_fwd_grid_of) runs by shape only where the tiles
# outnumber the SMs, which no case of the table does: once more with it forced on a grid of 2
# blocks (FLASHPORT_CUDA_SM90_FWD_GRID=2), so that each block walks several tiles (static walk,
# or tiles claimed from the counter by the two blocks running at once), its stage ring, Q tiles
# and turn handoff going on from tile to tile. Forward only; with the masked-key checks, but not
# their fp8 problems (--no-fp8): the launcher has no persistent fp8 kernel, so they would run the
# first pass's kernels again.
if [ "$sm90_here" = 1 ]; then
    echo "== cudaemu, FP_CUDA_EMU_SMEM_KIB=$kib, FLASHPORT_CUDA_SM90_FWD_GRID=2"
    FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_CUDA_SM90_FWD_GRID=2 FLASHPORT_PLUGIN_PATH=$out \
        "$build/bin/test_backends" cudaemu "$@" --forward-only || status=1
    FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_CUDA_SM90_FWD_GRID=2 FLASHPORT_PLUGIN_PATH=$out \
        "$build/bin/test_reliability" cudaemu --masked-keys --no-fp8 |
        grep -E 'CHECK failed|checks failed' || status=1
fi
# With the sm90 path built, the first pass at an sm_90-like size (227 KiB) ran every backward but
# the seqused_k ones and every forward but the decode-shaped and KV-cache ones on it: once more
# with the sm80 path forced (FLASHPORT_CUDA_PATH=sm80), the sm80 kernels' 227 KiB
# configurations, as an H200 runs them where the sm90 path declines.
if [ "$sm90_here" = 1 ]; then
    echo "== cudaemu, FP_CUDA_EMU_SMEM_KIB=$kib, FLASHPORT_CUDA_PATH=sm80"
    FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_CUDA_PATH=sm80 FLASHPORT_PLUGIN_PATH=$out \
        "$build/bin/test_backends" cudaemu "$@" || status=1
fi
# The backward's GQA group splits (fp_plan_backward_group_splits) run by shape for a few cases
# only: once more with 4 forced (each group cut into its largest divisor up to 4 slices), at the
# first size.
echo "== cudaemu, FP_CUDA_EMU_SMEM_KIB=$kib, FLASHPORT_CUDA_GROUP_SPLITS=4"
FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_CUDA_GROUP_SPLITS=4 FLASHPORT_PLUGIN_PATH=$out \
    "$build/bin/test_backends" cudaemu "$@" || status=1
# Every forward through the decode kernel (decode/fwd.cu), its keys in 3 splits where they have
# 3 key blocks: GQA packing, masks, varlen and the combine on every case of the table. Forward
# only, as for the ping-pong pass: the backward is the first pass's. Then the same with the
# split combine's block-per-row kernel forced (FLASHPORT_CUDA_COMBINE_ROWS=0: the table's calls
# have too few splits to reach it by the rule), with the masked-key checks (not their fp8 problems:
# fp8 never takes the decode kernel, so they would run the first pass's kernels again) on its
# 16-warp form (FLASHPORT_CUDA_COMBINE_WIDE=0; the table pass runs the 4-warp one).
echo "== cudaemu, FP_CUDA_EMU_SMEM_KIB=$kib, FLASHPORT_CUDA_DECODE=1, FLASHPORT_CUDA_DECODE_SPLITS=3"
FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_CUDA_DECODE=1 FLASHPORT_CUDA_DECODE_SPLITS=3 \
    FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_backends" cudaemu "$@" --forward-only || status=1
echo "== cudaemu, FP_CUDA_EMU_SMEM_KIB=$kib, the decode pass with FLASHPORT_CUDA_COMBINE_ROWS=0"
FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_CUDA_DECODE=1 FLASHPORT_CUDA_DECODE_SPLITS=3 \
    FLASHPORT_CUDA_COMBINE_ROWS=0 FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_backends" cudaemu \
    "$@" --forward-only || status=1
FP_CUDA_EMU_SMEM_KIB=$kib FLASHPORT_CUDA_DECODE=1 FLASHPORT_CUDA_DECODE_SPLITS=3 \
    FLASHPORT_CUDA_COMBINE_ROWS=0 FLASHPORT_CUDA_COMBINE_WIDE=0 FLASHPORT_PLUGIN_PATH=$out \
    "$build/bin/test_reliability" cudaemu --masked-keys --no-fp8 |
    grep -E 'CHECK failed|checks failed' || status=1
exit "$status"
