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
# The library is rebuilt only when a source under backends/hip, core or include is newer.
# FP_HIP_EMU_PATHS (default "cdna generic") picks which of the two paths run.
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
build_lib() {
    local pids=() f p
    for f in hip_backend hip_attention flash_generic flash_aux flash_cdna emu/hip_emu; do
        "$cxx" "${flags[@]}" -x c++ -c "$root/backends/hip/$f.cpp" -o "$out/obj/${f#emu/}.o" &
        pids+=($!)
    done
    "$cxx" -x c -std=c11 -O1 -fPIC -I"$root" -I"$root/include" -c "$root/core/plan.c" \
        -o "$out/obj/plan.o"
    for p in "${pids[@]}"; do wait "$p"; done
    "$cxx" -shared -o "$out/libflashport_hipemu.so" "$out"/obj/*.o -lpthread
}
# Rebuilt when missing or older than any source it is made of (a second run, e.g. with
# --workspace, reuses it).
lib=$out/libflashport_hipemu.so
if [ ! -e "$lib" ] || [ -n "$(find "$root/backends/hip" "$root/core" "$root/include" -newer "$lib" \
    -type f | head -1)" ]; then
    build_lib
fi
cmake --build "$build" --target test_backends test_reliability >/dev/null

status=0
for path in ${FP_HIP_EMU_PATHS:-cdna generic}; do
    case $path in
    cdna)
        echo "== hipemu, CDNA path (MFMA emulated)"
        kernel= ;;
    generic)
        echo "== hipemu, generic path"
        kernel=generic ;;
    *)
        echo "run_emu.sh: FP_HIP_EMU_PATHS: unknown path '$path' (cdna, generic)" >&2
        exit 2 ;;
    esac
    FLASHPORT_HIP_KERNEL=$kernel FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_backends" hipemu "$@" ||
        status=1
    FLASHPORT_HIP_KERNEL=$kernel FLASHPORT_PLUGIN_PATH=$out "$build/bin/test_reliability" hipemu \
        --masked-keys --quick | grep -E 'CHECK failed|checks failed' || status=1
done
exit "$status"
