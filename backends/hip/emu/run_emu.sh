#!/usr/bin/env bash
# Builds the HIP backend's sources for a CPU (hip_emu.h, hip_emu.cpp) into
# <build>/hipemu/libflashport_hipemu.so and runs the shared test table on it twice: the CDNA path
# (MFMA emulated per AMD's documented layout) and the generic path (FLASHPORT_HIP_KERNEL=generic),
# each followed by `test_reliability hipemu --masked-keys --quick` (docs/reliability.md; the HIP
# kernels are one template for every head dim, so the problems' own head dims only).
# <build> is any configured flashport build folder; its test_backends is built if missing.
#
#   backends/hip/emu/run_emu.sh <build> [test_backends options, e.g. --quick or --filter D128]
#
# Needs clang++ 15 or newer (ext_vector_type, _Float16 on x86): CXX overrides the default
# /usr/lib/llvm-15/bin/clang++ (installed with Debian's hipcc). The emulation runs 256 threads per
# block with barriers: the whole table takes about 40 s (generic) and 4 to 5 minutes (CDNA) on
# 2 cores; --quick about 10 s for both, build included.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=$(cd "${1:?usage: run_emu.sh <build folder> [test_backends options]}" && pwd)
shift
cxx=${CXX:-/usr/lib/llvm-15/bin/clang++}
out=$build/hipemu
mkdir -p "$out/obj"

flags=(-std=c++17 -O1 -g -fPIC -Wall -DFP_HIP_SHIM -DFP_HIP_HAVE_CDNA -DFP_HIP_CDNA_TARGETS='"sm_00"'
    -DFP_HIP_BACKEND_NAME='"hipemu"' -include "$root/backends/hip/emu/hip_emu.h"
    -I"$root" -I"$root/include")
pids=()
for f in hip_backend hip_attention flash_generic flash_aux flash_cdna emu/hip_emu; do
    "$cxx" "${flags[@]}" -x c++ -c "$root/backends/hip/$f.cpp" -o "$out/obj/${f#emu/}.o" &
    pids+=($!)
done
"$cxx" -x c -std=c11 -O1 -fPIC -I"$root" -I"$root/include" -c "$root/core/plan.c" \
    -o "$out/obj/plan.o"
for p in "${pids[@]}"; do wait "$p"; done
"$cxx" -shared -o "$out/libflashport_hipemu.so" "$out"/obj/*.o -lpthread
cmake --build "$build" --target test_backends test_reliability >/dev/null

status=0
echo "== hipemu, CDNA path (MFMA emulated)"
FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_backends" hipemu "$@" || status=1
FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_reliability" hipemu --masked-keys --quick |
    grep -E 'CHECK failed|checks failed' || status=1
echo "== hipemu, generic path"
FLASHPORT_HIP_KERNEL=generic FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_backends" hipemu "$@" ||
    status=1
FLASHPORT_HIP_KERNEL=generic FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_reliability" hipemu \
    --masked-keys --quick | grep -E 'CHECK failed|checks failed' || status=1
exit "$status"
