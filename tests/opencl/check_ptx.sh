#!/usr/bin/env bash
# The tensor-core OpenCL kernels (backends/opencl/kernels/mma_nv.cl) as NVIDIA's driver would take
# them, checked without a GPU: the embedded program source compiled by clang as OpenCL C for
# nvptx64-nvidia-nvcl (sm_80, PTX 7.0; -fgnu-keywords for `asm`, which NVIDIA's compiler takes)
# to PTX, then assembled by ptxas for sm_90, for bf16 and f16 storage and a few (head-dim class,
# tile) shapes. A broken asm string, operand or constraint fails here. The OpenCL built-ins (get_local_id, exp, ...) stay external functions in the PTX
# (no libclc); their declarations are marked .extern so ptxas -c accepts them.
#
#   tests/opencl/check_ptx.sh PROGRAM.cl [CLANG [PTXAS]]
#
# PROGRAM.cl: the concatenated program, written by backends/opencl/embed_source.cmake beside the
# generated C file (build/backends/opencl/ocl_program_source.c.cl).
set -euo pipefail
SRC=$1
CLANG=${2:-clang-14}
PTXAS=${3:-ptxas}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
n=0
# (dtype, head-dim class, tile): bf16 over the three warp grids (T = 32: 2 x 2 warps, T = 16:
# 1 x 4 with two idle column tiles, T = 64: 4 x 1), f16 (its own asm strings) once.
for cfg in "2 128 32" "2 128 16" "2 32 64" "1 128 32"; do
    set -- $cfg
    dtype=$1
    shift
    name="dtype$dtype-D$1-T$2"
    "$CLANG" -x cl -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -march=sm_80 \
        -Xclang -target-feature -Xclang +ptx70 -include opencl-c.h \
        -fgnu-keywords -O2 -S -DFP_OCL_DTYPE=$dtype -DFP_OCL_D=$1 -DFP_OCL_T=$2 \
        -DFP_OCL_MMA=1 -DFP_OCL_MMA_EMULATE=0 -o "$TMP/$name.ptx" "$SRC"
    grep -q "mma.sync.aligned.m16n8k16" "$TMP/$name.ptx" ||
        { echo "$name: no mma.sync in the PTX"; exit 1; }
    # Declarations of functions the PTX does not define (".func ... ;" before any "{")
    # become ".extern .func".
    awk 'function fname(line) { sub(/^\.func +(\([^)]*\) *)?/, "", line);
                                sub(/[ (].*$/, "", line); return line }
         NR == FNR { if (/^\.func /) { f = fname($0) }
                     if (f != "" && /^\{/) { defined[f] = 1; f = "" }
                     if (/^;/) f = ""; next }
         /^\.func /{d = 1; buf = $0; name = fname($0); next}
         d && /^;/{print (name in defined ? "" : ".extern ") buf; print; d = 0; next}
         d && /^\{/{print buf; print; d = 0; next}
         d{buf = buf "\n" $0; next} {print}' "$TMP/$name.ptx" "$TMP/$name.ptx" \
        >"$TMP/$name.ext.ptx"
    "$PTXAS" -arch=sm_90 -c -o "$TMP/$name.o" "$TMP/$name.ext.ptx"
    n=$((n + 1))
done
echo "check_ptx: $n tensor-core programs compiled to PTX and assembled for sm_90"
