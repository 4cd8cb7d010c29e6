#!/usr/bin/env bash
# The AArch64 path of the CPU backend in CI: cross-builds the library and test_backends for
# AArch64 (cmake/aarch64-linux-gnu.cmake, warnings as errors, without OpenMP) and, when
# qemu-aarch64 is installed, runs the micro-kernel contract test (tests/test_ukernels.c) and the
# quick case table on the NEON micro-kernels and on the portable ones under emulation, then checks
# that asking for an x86 ISA fails cleanly.
#
#   backends/cpu/cross_check.sh [BUILD_DIR]        (default: build-aarch64)
#
# Needs: apt-get install gcc-aarch64-linux-gnu (brings libc6-dev-arm64-cross); optional:
# qemu-user. The full table under qemu takes ~95 s on the development machine, the quick one ~2 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build-aarch64}

cmake -S . -B "$dir" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DFLASHPORT_WERROR=ON \
  -DFLASHPORT_CUDA=OFF -DFLASHPORT_HIP=OFF -DFLASHPORT_OPENMP=OFF -DFLASHPORT_BUILD_BENCH=OFF
cmake --build "$dir" -j2 --target flashport test_backends test_ukernels

if ! command -v qemu-aarch64 >/dev/null; then
  echo "cross_check: qemu-aarch64 not installed: AArch64 build checked, not run"
  exit 0
fi
run() { qemu-aarch64 -L /usr/aarch64-linux-gnu "$dir/bin/test_backends" cpu --quick; }
echo "== micro-kernel contract (qemu-aarch64)"
qemu-aarch64 -L /usr/aarch64-linux-gnu "$dir/bin/test_ukernels"
for isa in neon scalar; do
  echo "== FLASHPORT_CPU_ISA=$isa (qemu-aarch64)"
  FLASHPORT_CPU_ISA=$isa run
done
echo "== FLASHPORT_CPU_ISA=avx512 must be refused on AArch64"
out=$(FLASHPORT_CPU_ISA=avx512 run 2>&1 || true)
if ! grep -q "FLASHPORT_ERR_UNSUPPORTED_FEATURE: cpu: FLASHPORT_CPU_ISA=avx512" <<<"$out"; then
  echo "$out"
  echo "cross_check: an x86 ISA request on AArch64 did not fail cleanly"
  exit 1
fi
echo "cross_check: ok"
