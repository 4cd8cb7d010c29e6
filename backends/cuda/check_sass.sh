#!/usr/bin/env bash
# Checks that the CUDA plugin's sm90 kernels really are Hopper kernels: disassembles the sm_90a
# machine code embedded in libflashport_cuda.so and fails unless
#   - every sm90 forward kernel (fp_sm90_fwd_kernel: f16 and bf16, head-dim classes 64, 128,
#     192, 256, per tile and persistent: 16 kernels; fp8 e4m3 inputs with f16 and bf16 outputs,
#     128 and 256, per tile: 4) and
#     backward kernel (fp_sm90_bwd_kernel: f16 and bf16, 64 and 128: 4; fp_sm90_bwd256_kernel:
#     f16 and bf16: 2) is present,
#   - each holds HGMMA (wgmma; QGMMA, the fp8 wgmma, in the fp8 kernels) and UTMALDG (TMA tile
#     loads) instructions, and each backward kernel REDG (the dQ reductions) and UBLKCP (bulk
#     copies of the row statistics),
#   - and no sm80 kernel holds HGMMA (so the check can tell the paths apart).
#
#   backends/cuda/check_sass.sh build/lib/libflashport_cuda.so
#
# Needs cuobjdump and nvdisasm: the CUDA toolkit's when it has them, else CUOBJDUMP_DIR (a
# folder holding both; .ci/run installs them from PyPI's nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm).
set -euo pipefail

lib=${1:?usage: check_sass.sh path/to/libflashport_cuda.so}
expected_fwd=16
expected_fp8=4
expected_bwd=6
for dir in "${CUOBJDUMP_DIR:-}" /usr/local/cuda/bin; do
    if [ -n "$dir" ] && [ -x "$dir/cuobjdump" ] && [ -x "$dir/nvdisasm" ]; then
        export PATH=$dir:$PATH
        break
    fi
done
command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null || {
    echo "check_sass: cuobjdump and nvdisasm not found (set CUOBJDUMP_DIR)" >&2
    exit 2
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cuobjdump --dump-sass --gpu-architecture sm_90a "$lib" >"$tmp/sass.txt"

# One line per kernel: name, HGMMA, UTMALDG, REDG, UBLKCP and QGMMA counts.
awk '/Function : / { name = $3; hg[name] = 0; tma[name] = 0; red[name] = 0; blk[name] = 0; qg[name] = 0 }
     /HGMMA/ { hg[name]++ }
     /QGMMA/ { qg[name]++ }
     /UTMALDG/ { tma[name]++ }
     /REDG/ { red[name]++ }
     /UBLKCP/ { blk[name]++ }
     END { for (n in hg) print n, hg[n], tma[n], red[n], blk[n], qg[n] }' "$tmp/sass.txt" >"$tmp/counts.txt"

status=0
found=0
found_fp8=0
found_bwd=0
while read -r name hgmma utmaldg redg ublkcp qgmma; do
    case $name in
    *fp_sm90_fwd_kernelIh*) # uint8_t inputs: fp8 e4m3
        found_fp8=$((found_fp8 + 1))
        if [ "$qgmma" -eq 0 ] || [ "$utmaldg" -eq 0 ]; then
            echo "check_sass: $name: $qgmma QGMMA, $utmaldg UTMALDG (needs both)" >&2
            status=1
        fi
        ;;
    *fp_sm90_fwd_kernel*)
        found=$((found + 1))
        if [ "$hgmma" -eq 0 ] || [ "$utmaldg" -eq 0 ]; then
            echo "check_sass: $name: $hgmma HGMMA, $utmaldg UTMALDG (needs both)" >&2
            status=1
        fi
        ;;
    *fp_sm90_bwd_kernel* | *fp_sm90_bwd256_kernel*)
        found_bwd=$((found_bwd + 1))
        if [ "$hgmma" -eq 0 ] || [ "$utmaldg" -eq 0 ] || [ "$redg" -eq 0 ] || [ "$ublkcp" -eq 0 ]; then
            echo "check_sass: $name: $hgmma HGMMA, $utmaldg UTMALDG, $redg REDG, $ublkcp UBLKCP" \
                "(needs all four)" >&2
            status=1
        fi
        ;;
    *fp_sm80_*)
        if [ "$hgmma" -ne 0 ]; then
            echo "check_sass: sm80 kernel $name holds $hgmma HGMMA" >&2
            status=1
        fi
        ;;
    esac
done <"$tmp/counts.txt"

if [ "$found" -ne "$expected_fwd" ] || [ "$found_fp8" -ne "$expected_fp8" ] ||
    [ "$found_bwd" -ne "$expected_bwd" ]; then
    echo "check_sass: $found sm90 forward, $found_fp8 fp8 forward and $found_bwd backward kernels" \
        "in $lib, expected $expected_fwd, $expected_fp8 and $expected_bwd" >&2
    status=1
fi
[ $status -eq 0 ] && echo "check_sass: $found sm90 forward kernels with HGMMA and UTMALDG, $found_fp8" \
    "fp8 forward kernels with QGMMA and UTMALDG, $found_bwd backward kernels with HGMMA," \
    "UTMALDG, REDG and UBLKCP"
exit $status
