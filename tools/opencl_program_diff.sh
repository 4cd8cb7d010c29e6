#!/usr/bin/env bash
# Compares the OpenCL programs of two revisions, program by program: the source after
# preprocessing and the PTX, as tests/opencl/check_ptx.sh (this tree's) compiles them, for every
# program that either revision's planner (tests/opencl/plan_programs.c) gives an NVIDIA device.
# Shows whether a kernel change reaches the code of programs it should leave alone.
#
#   tools/opencl_program_diff.sh REV_A REV_B [CLANG [PTXAS]]
#
# REV: a git revision, or "." for the working tree. Prints one line a program, "NAME: same",
# "NAME: source differs, PTX same", "NAME: source and PTX differ" or "NAME: only in REV", then the
# count of each; KEEP_DIR=DIR leaves the programs' files in DIR/a and DIR/b. Needs what check_ptx.sh
# needs (clang, ptxas, libclc) and a C compiler (cc).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLANG=${3:-clang-14}
PTXAS=${4:-/usr/local/cuda/bin/ptxas}
WORK=${KEEP_DIR:-$(mktemp -d)}
[ -n "${KEEP_DIR:-}" ] || trap 'rm -rf "$WORK"' EXIT

# programs REV SIDE: REV's program source and plan_programs, then each program's files in
# $WORK/SIDE.
programs() {
    local tree="$WORK/tree-$2"
    rm -rf "$tree" "${WORK:?}/$2"
    mkdir -p "$tree" "$WORK/$2"
    if [ "$1" = . ]; then
        (cd "$ROOT" && tar -c backends/opencl core tests/opencl) | tar -x -C "$tree"
    else
        git -C "$ROOT" archive "$1" backends/opencl core tests/opencl | tar -x -C "$tree"
    fi
    # the program's inputs, in backends/opencl/CMakeLists.txt's order
    local inputs
    # shellcheck disable=SC2016 # the CMake variables are matched, not expanded
    inputs=$(sed -n '/^set(FP_OCL_PROGRAM_INPUTS/,/)/p' "$tree/backends/opencl/CMakeLists.txt" |
        grep -o '\${[A-Z_]*}/[^ )]*' |
        sed -e "s|\${CMAKE_CURRENT_SOURCE_DIR}|$tree/backends/opencl|" \
            -e "s|\${PROJECT_SOURCE_DIR}|$tree|" | paste -sd';')
    cmake "-DINPUTS=$inputs" "-DOUTPUT=$tree/program.c" "-DROOT=$tree" \
        -P "$tree/backends/opencl/embed_source.cmake"
    cc -std=c11 -I"$tree" -o "$tree/plan_programs" "$tree/tests/opencl/plan_programs.c"
    KEEP="$WORK/$2" "$ROOT/tests/opencl/check_ptx.sh" "$tree/program.c.cl" \
        "$tree/plan_programs" "$CLANG" "$PTXAS" >"$WORK/$2.log"
}

programs "$1" a
programs "$2" b
for f in $( (cd "$WORK/a" && ls) && (cd "$WORK/b" && ls)); do echo "${f%.*}"; done | sort -u |
    while read -r name; do
        if [ ! -f "$WORK/b/$name.ptx" ]; then
            echo "$name: only in $1"
        elif [ ! -f "$WORK/a/$name.ptx" ]; then
            echo "$name: only in $2"
        elif ! cmp -s "$WORK/a/$name.ptx" "$WORK/b/$name.ptx"; then
            echo "$name: source and PTX differ"
        elif ! cmp -s "$WORK/a/$name.i" "$WORK/b/$name.i"; then
            echo "$name: source differs, PTX same"
        else
            echo "$name: same"
        fi
    done | tee "$WORK/result"
awk -F': ' '{ n[$2]++ } END { for (k in n) printf "%d programs: %s\n", n[k], k }' "$WORK/result" | sort
