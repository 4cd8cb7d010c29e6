#!/usr/bin/env bash
# Where the OpenCL tensor-core variant faults on NVIDIA's OpenCL driver (docs/opencl.md, "The
# 2026-12-02 probe"): builds tests/gpu/opencl_mma_probe (CMake target opencl_mma_probe, CUDA off)
# and runs each of its variants in a process of its own, from one bare mma.sync up to the real
# fp_ocl_forward with each suspect fixed in turn (opencl_mma_probe.c's header lists them); then
# the same kernels with the instruction emulated (--emulate) as the control: they must pass on
# any device, so a failure there is the probe's, not the tensor cores'.
#
#   OUT=/tmp/out tests/gpu/run_opencl_mma_probe.sh
#
# One line per variant in $OUT/mma-probe/results.txt (also printed): ok (max err) / wrong (max
# err, where) / fault (OpenCL error at clFinish) / refused (at launch) / skip (build refused:
# the driver's first error line) / hang (killed after LIMIT s) / died (no line, its exit code).
# mma-probe/dump/ (dump-old/: the OLD runs) holds every program's build log (with -cl-nv-verbose on NVIDIA: ptxas's
# registers and spills) and, on NVIDIA, the PTX the driver produced (VARIANT.ptx: read the
# .version / .target lines and the mma.sync lines); all of it is packed into $OUT/probe.tgz.
# Then, where git can show them, the kernels as they were at OLD (default 8fe7d31, before the
# fix) for the real forward and the dots kernels, prefixed "OLD:".
# Environment: BUILD (default build-ocl), PLATFORM (FLASHPORT_OPENCL_PLATFORM, default NVIDIA;
# "Portable" runs it on PoCL, where the real instruction's builds are refused and skip),
# LIMIT (seconds per variant, default 60), BUDGET (seconds for all variants, default 270: the
# rest are listed as not run), ONLY (a regular expression: the variants to run).
set -uo pipefail
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-build-ocl}
LIMIT=${LIMIT:-60}
BUDGET=${BUDGET:-270}
export FLASHPORT_OPENCL_PLATFORM=${PLATFORM:-NVIDIA}
export PATH=$PATH:/usr/local/cuda/bin
DIR="$OUT/mma-probe"
mkdir -p "$DIR/dump"
RES="$DIR/results.txt"
DUMP="$DIR/dump"
start=$(date +%s)

GEN=()
# Ninja for a new build folder; an existing one keeps its generator.
command -v ninja >/dev/null && [ ! -e "$BUILD/CMakeCache.txt" ] && GEN=(-G Ninja)
CLINC=()
# No /usr/include/CL: the CUDA toolkit's copy of the Khronos headers.
[ -e /usr/include/CL/cl.h ] || CLINC=(-DFLASHPORT_OPENCL_INCLUDE_DIR=/usr/local/cuda/include)
{
    cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHPORT_CUDA=OFF \
        -DFLASHPORT_HIP=OFF -DFLASHPORT_OPENCL=ON "${CLINC[@]}" &&
        cmake --build "$BUILD" -j "$(nproc)" --target opencl_mma_probe
} >"$DIR/build.log" 2>&1 || { tail -30 "$DIR/build.log"; exit 1; }
PROBE="$BUILD/bin/opencl_mma_probe"
PROGRAM="$BUILD/backends/opencl/ocl_program_source.c.cl"
KERNELS=tests/gpu/opencl_mma_probe.cl

{
    echo "### $(date -u '+%Y-%m-%d %H:%M UTC') commit $(git rev-parse --short HEAD 2>/dev/null);" \
        "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    "$PROBE" --device
} | tee -a "$RES"

# probe_one [--emulate] VARIANT: its line, or why there is none.
probe_one() {
    local v=${*: -1} line rc
    if [ $(($(date +%s) - start)) -gt "$BUDGET" ]; then
        echo "$v${2:+-emulated}: not run (BUDGET of $BUDGET s spent)"
        return
    fi
    line=$(timeout -k 5 "$LIMIT" "$PROBE" "${@:1:$#-1}" --dump "$DUMP" "$PROGRAM" "$KERNELS" \
        "$v" 2>>"$DIR/stderr.txt")
    rc=$?
    if [ -n "$line" ]; then
        echo "$line"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "$v${2:+-emulated}: hang (killed after $LIMIT s)"
    else
        echo "$v${2:+-emulated}: died (exit code $rc, no result)"
    fi
}

variants=$("$PROBE" --list | grep -E "${ONLY:-.}")
for v in $variants; do
    probe_one "$v" | tee -a "$RES"
done

# The kernels as they were at $OLD (default 8fe7d31, main before issue 23's fix), where git can
# show them: the real forward and the dots kernels (the library's helpers of then), prefixed
# "OLD:", beside the tip's above.
OLD=${OLD:-8fe7d31}
OLDSRC="$DIR/old-src"
inputs=(backends/opencl/kernels/prelude.cl core/fp_inline.h core/mask.h core/online_softmax.h
    backends/opencl/ocl_args.h backends/opencl/kernels/shape.cl backends/opencl/kernels/mma_nv.cl
    backends/opencl/kernels/flash.cl)
if git cat-file -e "$OLD^{commit}" 2>/dev/null; then
    list=""
    for f in "${inputs[@]}"; do
        mkdir -p "$OLDSRC/$(dirname "$f")"
        git show "$OLD:$f" >"$OLDSRC/$f" && list="$list${list:+;}$OLDSRC/$f"
    done
    cmake "-DINPUTS=$list" -DOUTPUT="$OLDSRC/program.c" -DROOT="$OLDSRC" \
        -P backends/opencl/embed_source.cmake
    TIP=$PROGRAM
    PROGRAM="$OLDSRC/program.c.cl"
    DUMP="$DIR/dump-old"
    mkdir -p "$DUMP"
    for v in $(echo "$variants" | grep -E "^(dots-bf16-(copy16|pad)|real-.*-asis|real-bf16-d64-scratch)$"); do
        echo "OLD: $(probe_one "$v")" | tee -a "$RES"
    done
    PROGRAM=$TIP
    DUMP="$DIR/dump"
else
    echo "OLD: not run (git cannot show $OLD here)" | tee -a "$RES"
fi

echo "# controls: the same kernels with the instruction emulated" | tee -a "$RES"
for v in $(echo "$variants" | grep -E "^(frag|dots|mm|addr)-"); do
    probe_one --emulate "$v" | tee -a "$RES"
done
echo "probe: $(($(date +%s) - start)) s" | tee -a "$RES"
tar czf "$OUT/probe.tgz" -C "$OUT" mma-probe
