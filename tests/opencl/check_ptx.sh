#!/usr/bin/env bash
# Every OpenCL program the backend can build on an NVIDIA GPU (compute capability >= 8.0, 48 KiB of
# local memory), checked without a GPU: the tensor-core programs (backends/opencl/kernels/
# mma_nv.cl) and the plain programs a refused tensor-core build falls back to, as listed by
# plan_programs (tests/opencl/plan_programs.c: ocl_plan.h's own plans). Each one's embedded
# source is compiled by clang as OpenCL C for nvptx64-nvidia-nvcl (sm_80, PTX 7.0; -fgnu-keywords
# for `asm`, which NVIDIA's compiler takes), with libclc's nvptx built-ins linked in so that
# get_local_id, barrier, exp, ... are the real instructions and not calls (FP_OCL_UNROLL_ALL = 1,
# as the plugin builds for a GPU); then assembled by
# ptxas for sm_90 as a whole program. A broken asm string, operand or constraint, or anything
# ptxas refuses, fails here; each program's registers, spills and stack frame per kernel are
# printed (NVIDIA's own compiler is another front end: this is a check of the PTX we ask for, not
# a copy of its build).
#
#   tests/opencl/check_ptx.sh PROGRAM.cl PLAN_PROGRAMS [CLANG [PTXAS [LIBCLC]]]
#
# PROGRAM.cl: the concatenated program, written by backends/opencl/embed_source.cmake beside the
# generated C file (build/backends/opencl/ocl_program_source.c.cl). PLAN_PROGRAMS: the built
# plan_programs. LIBCLC: nvptx64--nvidiacl.bc (Debian: libclc-14). JOBS (default 2) programs are
# checked at a time. KEEP=DIR keeps each program's PTX (NAME.ptx) and its source after
# preprocessing (NAME.i, clang -E -P with the same options) in DIR, for
# tools/opencl_program_diff.sh.
set -euo pipefail
SRC=$1
PLAN=$2
CLANG=${3:-clang-14}
PTXAS=${4:-ptxas}
LIBCLC=${5:-/usr/lib/clc/nvptx64--nvidiacl.bc}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# What clang takes and NVIDIA's OpenCL C 1.2 compiler refuses: variadic macros ("variadic
# macros not supported in OpenCL"; it failed every program on the H200 once).
if grep -nE '^[[:space:]]*#[[:space:]]*define[[:space:]]+[A-Za-z_0-9]+\([^)]*\.\.\.' "$SRC"; then
    echo "check_ptx: a variadic macro in $SRC (NVIDIA's OpenCL compiler rejects them)"
    exit 1
fi

# The FA2-shaped programs are checked as an sm_90 device builds them, with FP_OCL_RED_VEC = 1 (the
# one-kernel backward's vector reductions, PTX ISA 8.1 and sm_90): clang 14 writes PTX 7.0 for
# sm_80, so their PTX's .version and .target are raised to that before ptxas.
# check DTYPE D T MMA BQ FAST: one program (MMA: 0 plain, 1 tile-shaped tensor-core, 2
# FA2-shaped; BQ, FAST: the backward's FP_OCL_BQ and FP_OCL_BWD_FAST); prints its line, or its
# errors and exits 1. BQ and FAST default to 16 and 1 (a planner of a revision before them lists
# four columns: tools/opencl_program_diff.sh).
check() {
    local bq=${5:-16} fast=${6:-1}
    local name="dtype$1-D$2-T$3-mma$4-bq$bq-fast$fast"
    local cl=(-x cl -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -march=sm_80
        -Xclang -target-feature -Xclang +ptx70 -Xclang -mlink-builtin-bitcode -Xclang "$LIBCLC"
        -include opencl-c.h -fgnu-keywords -Wno-linker-warnings -O2 -DFP_OCL_DTYPE="$1"
        -DFP_OCL_D="$2" -DFP_OCL_T="$3" -DFP_OCL_MMA=$(($4 > 0)) -DFP_OCL_FA2=$(($4 == 2))
        -DFP_OCL_MMA_EMULATE=0 -DFP_OCL_BQ="$bq" -DFP_OCL_BWD_FAST="$fast"
        -DFP_OCL_RED_VEC=$(($4 == 2)) -DFP_OCL_UNROLL_ALL=1)
    if [ -n "${KEEP:-}" ] &&
        ! "$CLANG" "${cl[@]}" -E -P -o "$KEEP/$name.i" "$SRC" 2>"$TMP/$name.err"; then
        echo "$name: clang -E failed:"
        cat "$TMP/$name.err"
        return 1
    fi
    if ! "$CLANG" "${cl[@]}" -S -o "$TMP/$name.ptx" "$SRC" 2>"$TMP/$name.err"; then
        echo "$name: clang failed:"
        cat "$TMP/$name.err"
        return 1
    fi
    if [ "$4" != 0 ] && ! grep -q "mma.sync.aligned.m16n8k16" "$TMP/$name.ptx"; then
        echo "$name: no mma.sync in the PTX"
        return 1
    fi
    if grep -q "^\.extern" "$TMP/$name.ptx"; then
        echo "$name: the PTX declares functions it does not define (built-ins libclc lacks?):"
        grep -A1 "^\.extern" "$TMP/$name.ptx" | head -6
        return 1
    fi
    [ "$4" != 2 ] || sed -i -e 's/^\.version 7\.0$/.version 8.1/' \
        -e 's/^\.target sm_80/.target sm_90/' "$TMP/$name.ptx"
    [ -z "${KEEP:-}" ] || cp "$TMP/$name.ptx" "$KEEP/"
    if ! "$PTXAS" -arch=sm_90 -v -o "$TMP/$name.cubin" "$TMP/$name.ptx" >"$TMP/$name.v" 2>&1; then
        echo "$name: ptxas failed:"
        grep -v "^ptxas info" "$TMP/$name.v" | head -20
        return 1
    fi
    # "Compiling entry function 'K'", then "N bytes stack frame, S bytes spill stores, ...",
    # then "Used R registers".
    awk -v name="$name" '
        /Compiling entry function/ { k = $0; sub(/.*function .fp_ocl_/, "", k); sub(/. for.*/, "", k) }
        /bytes stack frame/ { stack = $1; spill = $5 }
        /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") r = $(i + 1)
                                  out = out sprintf(" %s %s regs, %s B stack, %s B spilled;", k, r, stack, spill) }
        END { print name ":" out }' "$TMP/$name.v"
}
export -f check
export CLANG PTXAS LIBCLC SRC TMP KEEP

"$PLAN" | sort -u >"$TMP/programs"
n=$(wc -l <"$TMP/programs")
[ "$n" -gt 0 ] || { echo "check_ptx: plan_programs listed no program"; exit 1; }
if ! xargs -P "${JOBS:-2}" -L 1 bash -c 'check "$@" || exit 255' _ <"$TMP/programs"; then
    echo "check_ptx: FAILED (above)"
    exit 1
fi
echo "check_ptx: all $n programs the NVIDIA path can build compiled to PTX and assembled for sm_90"
