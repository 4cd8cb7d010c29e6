# shellcheck shell=bash
# Sourced by tests/gpu/ab_opencl.sh and tests/gpu/bwd_opencl.sh (device scripts): the OpenCL-only
# build and the whole shared case table on the OpenCL backend, written once for both.

# opencl_build SRC BUILD LOG TARGET...: the tree SRC configured into BUILD (Release; CUDA and HIP
# off, OpenCL on; Ninja where found, for a BUILD not configured yet; NVIDIA's OpenCL headers from
# /usr/local/cuda/include where the system has no CL/cl.h) and the TARGETs built with a job per
# core, all output in LOG. On failure: LOG's last 30 lines printed, status 1.
opencl_build() {
    local src=$1 build=$2 log=$3 gen=() clinc=()
    shift 3
    command -v ninja >/dev/null && [ ! -e "$build/CMakeCache.txt" ] && gen=(-G Ninja)
    [ -e /usr/include/CL/cl.h ] || clinc=(-DFLASHPORT_OPENCL_INCLUDE_DIR=/usr/local/cuda/include)
    { cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHPORT_CUDA=OFF \
        -DFLASHPORT_HIP=OFF -DFLASHPORT_OPENCL=ON "${clinc[@]}" &&
        cmake --build "$build" -j "$(nproc)" --target "$@"
    } >"$log" 2>&1 || { tail -30 "$log"; return 1; }
}

# opencl_table BIN LOG: BIN/test_backends over the whole shared case table on the opencl backend
# (on the caller's workspace), one process of at most 300 s per dtype (f32, f16, bf16, then the
# fp8 cases, which the backend refuses); LOG gets each one's "### command" line, its output and
# "rc=STATUS ('FILTER')".
opencl_table() {
    local bin=$1 log=$2 part
    for part in "^f32 " "^f16 " "^bf16 " "^e"; do
        echo "### test_backends opencl --workspace --filter '$part'"
        timeout 300 "$bin/test_backends" opencl --workspace --filter "$part"
        echo "rc=$? ('$part')"
    done >"$log" 2>&1
}
