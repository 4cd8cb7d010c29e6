#!/usr/bin/env bash
# Builds source trees of the library side by side for an A/B run on one GPU (tests/gpu/ab_libs.sh):
# each NAME=SRC (a source tree: this checkout ".", or a `git archive` copy carried to the device)
# is configured as run_h200.sh configures its build, for ARCHS (default 90a) only and without the
# OpenCL plugin, in build-ab/NAME, all at once (JOBS compile jobs each, default: the cores / the
# number of trees); a tree already built is only brought up to date. The library and its CUDA
# plugin land in build-ab/NAME/lib; test_backends and test_reliability are built in the trees
# that TESTS names (space-separated NAMEs, default none).
#
#   OUT=/tmp/out tests/gpu/ab_builds.sh old=build-main-src new=. ref=build-noguard-src
#
# Prints one line per tree (rc, seconds, kernels that spill: ptxas's reports in this run's log,
# so a tree brought up to date counts only the kernels it compiled again); logs in
# $OUT/ab_build_NAME.log.
set -uo pipefail
usage() {
  echo "usage: ab_builds.sh NAME=SRC [NAME=SRC ...]" >&2
  exit 2
}
[ $# -gt 0 ] || usage
for t in "$@"; do [[ $t == ?*=?* ]] || usage; done
export PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
jobs=${JOBS:-$(($(nproc) / $# > 1 ? $(nproc) / $# : 1))}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
pids=()
for t in "$@"; do
  name=${t%%=*} src=${t#*=}
  targets=(flashport flashport_cuda)
  [[ " ${TESTS:-} " == *" $name "* ]] && targets+=(test_backends test_reliability)
  (
    start=$(date +%s)
    cmake -S "$src" -B "build-ab/$name" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DFLASHPORT_CUDA=ON -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" \
      -DCMAKE_CUDA_FLAGS="--threads=0" -DFLASHPORT_HIP=OFF -DFLASHPORT_OPENCL=OFF \
      -DFLASHPORT_CUDA_ARCHITECTURES="${ARCHS:-90a}" -DFLASHPORT_CUDA_PTXAS_VERBOSE=ON &&
      cmake --build "build-ab/$name" -j "$jobs" --target "${targets[@]}"
    rc=$?
    log=$OUT/ab_build_$name.log
    echo "$name ($src): rc=$rc in $(($(date +%s) - start)) s; $(grep -E 'bytes spill stores' "$log" |
      grep -vc ' 0 bytes spill stores') kernels with spills"
    exit $rc
  ) >"$OUT/ab_build_$name.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for t in "$@"; do tail -1 "$OUT/ab_build_${t%%=*}.log"; done
exit $status
