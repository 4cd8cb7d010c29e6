#!/usr/bin/env bash
# Checks that the HIP plugin's CDNA attention kernels really use the matrix cores: disassembles the
# gfx90a and gfx940 code objects embedded in libflashport_hip.so and fails unless
#   - every CDNA attention kernel (forward, backward dK/dV, backward dQ; f16 and bf16; head-dim
#     classes 64, 128, 256: 18 kernels) is present for each of the two targets,
#   - each contains v_mfma instructions of its dtype (v_mfma_f32_16x16x16f16 for f16; for bf16
#     v_mfma_f32_16x16x16bf16_1k, which gfx940 spells v_mfma_f32_16x16x16_bf16),
#   - and no generic kernel contains any v_mfma (so the check can tell the two paths apart).
#
#   backends/hip/check_mfma.sh build-hip/lib/libflashport_hip.so
#
# Needs LLVM 15's llvm-objcopy, clang-offload-bundler and llvm-objdump (Debian: llvm-15 and
# clang-15, pulled in by hipcc); LLVM_BIN overrides their folder (default /usr/lib/llvm-15/bin).
set -euo pipefail

lib=${1:?usage: check_mfma.sh path/to/libflashport_hip.so}
bin=${LLVM_BIN:-/usr/lib/llvm-15/bin}
targets="gfx90a gfx940"
expected_kernels=18
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin/llvm-objcopy" --dump-section=.hip_fatbin="$tmp/fatbin" "$lib" "$tmp/lib.copy"

# The section holds one offload bundle per HIP source file, back to back: split it at each
# bundle's magic string.
mapfile -t offsets < <(grep -obUa "__CLANG_OFFLOAD_BUNDLE__" "$tmp/fatbin" | cut -d: -f1)
size=$(stat -c %s "$tmp/fatbin")
offsets+=("$size")
for ((i = 0; i + 1 < ${#offsets[@]}; i++)); do
    start=${offsets[i]}
    len=$((offsets[i + 1] - start))
    dd if="$tmp/fatbin" of="$tmp/bundle$i" bs=1M iflag=skip_bytes,count_bytes skip="$start" \
        count="$len" status=none
done
echo "check_mfma: $lib: $((${#offsets[@]} - 1)) offload bundles"

status=0
for target in $targets; do
    : >"$tmp/$target.s"
    for bundle in "$tmp"/bundle*; do
        entries=$("$bin/clang-offload-bundler" --list --type=o --input="$bundle")
        if grep -qx "hipv4-amdgcn-amd-amdhsa--$target" <<<"$entries"; then
            "$bin/clang-offload-bundler" --unbundle --type=o --input="$bundle" \
                --targets="hipv4-amdgcn-amd-amdhsa--$target" --output="$bundle.$target.co"
            "$bin/llvm-objdump" -d --mcpu="$target" "$bundle.$target.co" >>"$tmp/$target.s"
        fi
    done
    # One line per kernel: name, count of f16 MFMAs, count of bf16 MFMAs, count of all MFMAs.
    awk '
        /^[0-9a-f]+ <.*>:$/ { fn = $2; gsub(/[<>:]/, "", fn); seen[fn] = 1; next }
        /v_mfma/ { all[fn]++ }
        /v_mfma_f32_16x16x16f16/ { f16[fn]++ }
        /v_mfma_f32_16x16x16(_bf16|bf16_1k)/ { bf16[fn]++ }
        END { for (fn in seen) printf "%s %d %d %d\n", fn, f16[fn], bf16[fn], all[fn] }
    ' "$tmp/$target.s" | grep -E "fp_hip_(fwd|bwd_dkdv|bwd_dq)_kernel" >"$tmp/$target.k" || true

    cdna=$(grep -c "fp_hip_mma_cdna" "$tmp/$target.k" || true)
    generic=$(grep -c "fp_hip_mma_generic" "$tmp/$target.k" || true)
    echo "check_mfma: $target: $cdna CDNA attention kernels, $generic generic ones"
    if [ "$cdna" -ne "$expected_kernels" ]; then
        echo "check_mfma: FAIL: $target: expected $expected_kernels CDNA attention kernels" >&2
        status=1
    fi
    while read -r name f16 bf16 all; do
        case "$name" in
        *fp_hip_mma_generic*)
            if [ "$all" -ne 0 ]; then
                echo "check_mfma: FAIL: $target: generic kernel $name has $all v_mfma" >&2
                status=1
            fi
            ;;
        *fp_hip_bf16*)
            echo "  $target $name: $bf16 bf16 v_mfma"
            if [ "$bf16" -eq 0 ]; then
                echo "check_mfma: FAIL: $target: $name has no bf16 v_mfma" >&2
                status=1
            fi
            ;;
        *)
            echo "  $target $name: $f16 f16 v_mfma"
            if [ "$f16" -eq 0 ]; then
                echo "check_mfma: FAIL: $target: $name has no f16 v_mfma" >&2
                status=1
            fi
            ;;
        esac
    done <"$tmp/$target.k"
done
if [ "$status" -eq 0 ]; then
    echo "check_mfma: OK: every CDNA attention kernel of $targets uses MFMA of its dtype"
fi
exit "$status"
